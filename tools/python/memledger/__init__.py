"""memledger's Python helpers: mark training steps and name phases.

`memledger run` puts this package on PYTHONPATH. Every function reaches the
preload library's C ABI (interposer/memledger.h) through the process's global
symbol scope, so nothing is linked or installed; when the process is not
traced, every call does nothing and costs one attribute look-up.

    import memledger

    for batch in loader:
        train_step(batch)
        memledger.step()             # the end of one training step

    with memledger.phase("eval"):    # steps ended inside are labelled "eval"
        for batch in val_loader:
            eval_step(batch)
            memledger.step()

A phase is recorded in the step label: a step ended inside
`phase("eval")` has the label "eval"; `step("x")` inside it gives "eval/x".
The report lists each step's label (`steps[i].label` in its JSON).

Keras: `memledger.keras.StepCallback()`; PyTorch Lightning:
`memledger.lightning.StepCallback()`.
"""

import contextlib
import ctypes
import threading

__all__ = ["active", "step", "phase", "current_phase", "flush", "run_dir"]


def _resolve():
    """The C ABI's functions, or None when the preload library is absent."""
    try:
        scope = ctypes.CDLL(None)
        step_fn = scope.memledger_step
        active_fn = scope.memledger_active
        flush_fn = scope.memledger_flush
        run_dir_fn = scope.memledger_run_dir
    except (OSError, AttributeError):
        return None
    step_fn.argtypes = [ctypes.c_char_p]
    step_fn.restype = None
    active_fn.argtypes = []
    active_fn.restype = ctypes.c_int
    flush_fn.argtypes = []
    flush_fn.restype = None
    run_dir_fn.argtypes = []
    run_dir_fn.restype = ctypes.c_char_p
    return step_fn, active_fn, flush_fn, run_dir_fn


_abi = _resolve()
_phases = threading.local()


def active():
    """True when this process is being traced by memledger."""
    return _abi is not None and _abi[1]() != 0


def current_phase():
    """The innermost phase entered on this thread, or None."""
    stack = getattr(_phases, "stack", None)
    return stack[-1] if stack else None


def step(label=None):
    """Marks the end of one training step. The step's label is `label`,
    prefixed by the current phase when there is one ("eval/x"), or the
    phase's name alone when no label is given."""
    if _abi is None:
        return
    name = current_phase()
    if label is not None:
        label = str(label)
        name = label if name is None else name + "/" + label
    _abi[0](None if name is None else name.encode("utf-8", "replace"))


@contextlib.contextmanager
def phase(name):
    """Names the phase (train, eval, ...) of the steps ended inside the block.
    Phases nest; each thread has its own."""
    stack = getattr(_phases, "stack", None)
    if stack is None:
        stack = _phases.stack = []
    stack.append(str(name))
    try:
        yield
    finally:
        stack.pop()


def flush():
    """Writes everything recorded so far to the trace (waits up to 2 s)."""
    if _abi is not None:
        _abi[2]()


def run_dir():
    """The run folder the traces go to, or None when not traced."""
    if _abi is None:
        return None
    value = _abi[3]()
    return None if value is None else value.decode("utf-8", "replace")
