"""What memledger does by itself in a traced Python program, loaded at
start-up by the sitecustomize that `memledger run` puts first on PYTHONPATH
(MEMLEDGER_PYTHON_HOOKS=0 turns it off):

- imports `memledger`, which records the frameworks' builds at exit and the
  exception that ends the program (see its docstring);
- names a process that starts a tf.data service worker (python.role);
- records how each child started with subprocess.Popen ended, as the
  program's own wait saw it (child.status: "PID STATUS"), so the report
  tells a child killed by SIGKILL (a Jupyter kernel) from one that stopped
  without a word;
- when the program imports torch.utils.data, marks a step each time a
  DataLoader iterator hands out its next batch (step source "loader"), so a
  PyTorch loop has steps without markers. The step taken under
  torch.no_grad() is labelled "eval". The preload library ignores these
  steps once the program marks its own, or when the command line chose a
  step source.

- at exit, finds what keeps the program's large buffers alive (retention
  paths, memledger._retention) and writes them to the run folder for the
  report; MEMLEDGER_RETENTION=0 (`memledger run --no-retention`) turns it
  off.
- at SIGTERM, when SIGTERM has its default action: the same, then the
  process ends by SIGTERM as it would have (see _install_sigterm).
- on CPython 3.12 and later, leaves memledger's own threads out of the
  count behind os.fork()'s warning about threads (see _hook_fork).

Nothing is imported for it: the hooks wait for the program's own imports."""

import atexit
import os
import sys

import memledger

_loader_step = None
# The info key the report looks for in a Python process's trace
# (report/notes.cpp, kPythonHelpersKey).
HELPERS_KEY = "python.helpers"


def _mark(iterator):
    torch = sys.modules.get("torch")
    label = None
    try:
        if torch is not None and not torch.is_grad_enabled():
            label = b"eval"
    except Exception:
        pass
    _loader_step(label)


def _hook_dataloader(module):
    """Wraps _BaseDataLoaderIter: the first batch of an epoch begins the first
    step; each later request for a batch ends the step before it, the one
    that finds the epoch over (StopIteration) included. An iterator reused
    across epochs (persistent_workers) begins again at _reset."""
    base = getattr(module, "_BaseDataLoaderIter", None)
    if base is None or "__next__" not in vars(base) or getattr(base, "_memledger_hooked", False):
        return
    next_batch = base.__next__
    reset = vars(base).get("_reset")

    def __next__(self):
        state = self.__dict__
        if state.get("_memledger_begun"):
            _mark(self)
        else:
            state["_memledger_begun"] = True
        try:
            return next_batch(self)
        except StopIteration:
            state.pop("_memledger_begun", None)  # the call above ended the last step
            raise

    __next__.__wrapped__ = next_batch
    base.__next__ = __next__
    if reset is not None:

        def _reset(self, *args, **kwargs):
            self.__dict__.pop("_memledger_begun", None)
            return reset(self, *args, **kwargs)

        _reset.__wrapped__ = reset
        base._reset = _reset
    base._memledger_hooked = True


def _hook_tfdata_service(module):
    """A process that starts a tf.data service worker is named one in the
    job table (the role is otherwise read from the code the process ran,
    and a worker's own threads run no Python)."""
    worker = getattr(module, "WorkerServer", None)
    if worker is None or getattr(worker, "_memledger_hooked", False):
        return
    init = worker.__init__

    def __init__(self, *args, **kwargs):
        memledger._note("python.role", "tf.data service worker")
        return init(self, *args, **kwargs)

    __init__.__wrapped__ = init
    worker.__init__ = __init__
    worker._memledger_hooked = True


def _hook_subprocess(module):
    """Wraps Popen._handle_exitstatus, through which every wait of a Popen
    (wait, poll, communicate, the reaping of an abandoned Popen) learns the
    child's status."""
    popen = getattr(module, "Popen", None)
    handle = getattr(popen, "_handle_exitstatus", None)
    if handle is None or getattr(popen, "_memledger_hooked", False):
        return

    def _handle_exitstatus(self, sts, *args, **kwargs):
        try:
            if self.returncode is None and isinstance(sts, int) and not os.WIFSTOPPED(sts):
                memledger._note("child.status", "%d %d" % (self.pid, sts))
        except Exception:
            pass
        return handle(self, sts, *args, **kwargs)

    _handle_exitstatus.__wrapped__ = handle
    popen._handle_exitstatus = _handle_exitstatus
    popen._memledger_hooked = True


class _PostImportHooks:
    """A meta path finder that runs a function on a module right after the
    program's own import of it has executed, without importing anything."""

    def __init__(self, hooks):
        self._hooks = hooks

    def find_spec(self, name, path=None, target=None):
        hook = self._hooks.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        execute = getattr(loader, "exec_module", None)
        if execute is None:
            return spec
        del self._hooks[name]

        def exec_module(module):
            execute(module)
            try:
                hook(module)
            except Exception:
                pass

        # The loader is this module's own (a new one for each import).
        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):
            pass
        return spec


PROGRAM_END_KEY = "memledger.program_end"


def _note_program_end():
    """At exit, before the interpreter's teardown frees what the modules
    hold: the steps --step-interval ends after this are teardown."""
    try:
        seq = memledger.live().seq
        if seq:
            memledger._note(PROGRAM_END_KEY, "%d" % seq)
    except Exception:
        pass


def _retention_at_exit():
    if os.environ.get("MEMLEDGER_RETENTION", "1") == "0" or not memledger.active() or memledger._snapshot_taken:
        return
    try:
        memledger.snapshot(when="exit")
    except Exception:  # never let the walk change how the program ends
        pass


SIGTERM_DEADLINE_MS = 2000  # a SIGTERM ends the process within this, walk or not
SIGTERM_BUDGET_S = 1.0      # the walk's budget at SIGTERM, at most
_sigterm_started = False


def _on_sigterm(signum, frame):
    """SIGTERM with its default action: the walk, then the default action."""
    global _sigterm_started
    del frame  # not a root of the walk
    if _sigterm_started:
        return  # a second SIGTERM during the walk: the first one ends the process
    _sigterm_started = True
    import signal

    try:
        if not memledger._snapshot_taken:
            budget = min(_retention_budget(), SIGTERM_BUDGET_S)
            memledger.snapshot(when="sigterm", budget_s=budget)
        memledger.flush()
    except Exception:  # never let the walk change how the program ends
        pass
    _real_signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _retention_budget():
    from memledger import _retention

    return _retention.configured_budget()


_real_signal = None


def _install_sigterm(defer):
    """Only while SIGTERM has its default action: its handler runs the walk
    (within SIGTERM_BUDGET_S), then restores the default action and sends
    SIGTERM again, so the process ends as it would have (killed by SIGTERM).
    A Python handler runs only when the main thread runs Python: the preload
    library ends the process by the default action if it is still alive
    SIGTERM_DEADLINE_MS after the signal (memledger_defer_sigterm). The
    program sees SIGTERM's default action: signal.getsignal() says SIG_DFL,
    signal.signal() returns SIG_DFL as the previous handler, and setting
    SIG_DFL puts this handler back. Setting its own handler (from Python or
    native code) replaces it."""
    global _real_signal
    import functools
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return
    real_signal, real_getsignal = signal.signal, signal.getsignal
    _real_signal = real_signal
    real_signal(signal.SIGTERM, _on_sigterm)
    if defer(SIGTERM_DEADLINE_MS) != 0:  # memledger does not handle SIGTERM here (ignored)
        real_signal(signal.SIGTERM, signal.SIG_DFL)
        return

    @functools.wraps(real_signal)
    def signal_(signalnum, handler):
        if signalnum != signal.SIGTERM:
            return real_signal(signalnum, handler)
        if handler == signal.SIG_DFL and not _sigterm_started:
            previous = real_signal(signalnum, _on_sigterm)
            defer(SIGTERM_DEADLINE_MS)
        else:
            previous = real_signal(signalnum, handler)
        return signal.SIG_DFL if previous is _on_sigterm else previous

    @functools.wraps(real_getsignal)
    def getsignal(signalnum):
        handler = real_getsignal(signalnum)
        return signal.SIG_DFL if handler is _on_sigterm else handler

    signal.signal = signal_
    signal.getsignal = getsignal


# CPython's warning at os.fork() and os.forkpty() in a process of more than
# one thread (3.12 on; Modules/posixmodule.c, warn_about_fork_with_threads).
_FORK_WARNING = "This process (pid=%d) is multi-threaded, use of %s() may lead to deadlocks in the child."


def _program_threads(own_threads):
    """The process's threads as CPython counts them at a fork (the 20th
    field of /proc/self/stat, else the threads the threading module knows),
    less memledger's own."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[17]) - own_threads()
    except (OSError, IndexError, ValueError):
        threading = sys.modules.get("threading")
        return len(threading._active) + len(threading._limbo) if threading is not None else 1


def _hook_fork(own_threads):
    """CPython 3.12 and later warn at os.fork() in a process of more than one
    thread (a DeprecationWarning, shown from __main__ by default), counting
    the process's threads, memledger's writer and module thread among them:
    every fork of a traced program would warn. CPython's warning names the
    frame below, this module's, and a filter of this module's, kept first
    among the filters, drops it; where the program's own threads are more
    than one, it is given again from the program's frame, as CPython gives
    it untraced. The filter is put back first only where the program put
    another before it: each change of the filters makes warnings already
    shown once show again."""
    import functools
    import re
    import warnings

    message = re.escape(_FORK_WARNING.split("(pid=")[0])
    module = re.escape(__name__) + r"\Z"
    first = []

    def drop_ours():
        if not first or not warnings.filters or warnings.filters[0] is not first[0]:
            warnings.filterwarnings("ignore", message=message, category=DeprecationWarning, module=module)
            first[:] = warnings.filters[:1]

    drop_ours()

    def wrap(real, name):
        @functools.wraps(real)
        def fork(*args, **kwargs):
            drop_ours()
            out = real(*args, **kwargs)
            pid = out[0] if isinstance(out, tuple) else out
            if pid != 0 and _program_threads(own_threads) > 1:
                try:
                    warnings.warn(_FORK_WARNING % (os.getpid(), name), DeprecationWarning, stacklevel=2)
                except Warning:  # made an error: CPython drops it too, the fork has happened
                    pass
            return out
        return fork

    for name in ("fork", "forkpty"):
        real = getattr(os, name, None)
        if real is not None:
            setattr(os, name, wrap(real, name))


def _install():
    global _loader_step
    import ctypes

    _loader_step = memledger._c_function("memledger_loader_step", [ctypes.c_char_p], None)
    if _loader_step is None or not memledger.active():
        return
    # The report says when a Python process went without these helpers
    # (a replaced PYTHONPATH, python -I, -E or -S).
    memledger._note(HELPERS_KEY, "started")
    own_threads = memledger._c_function("memledger_own_threads", [], ctypes.c_int)
    if own_threads is not None and sys.version_info >= (3, 12):
        _hook_fork(own_threads)
    atexit.register(_retention_at_exit)
    atexit.register(_note_program_end)  # atexit runs the last registered first
    if os.environ.get("MEMLEDGER_RETENTION", "1") != "0":
        defer = memledger._c_function("memledger_defer_sigterm", [ctypes.c_int], ctypes.c_int)
        if defer is not None:
            try:
                _install_sigterm(defer)
            except Exception:
                pass
    hooks = {
        "torch.utils.data.dataloader": _hook_dataloader,
        "tensorflow.python.data.experimental.service.server_lib": _hook_tfdata_service,
        "subprocess": _hook_subprocess,
    }
    for name in list(hooks):
        if name in sys.modules:
            hooks.pop(name)(sys.modules[name])
    if hooks:
        sys.meta_path.insert(0, _PostImportHooks(hooks))


_install()
