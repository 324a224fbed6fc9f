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

When the process is traced, importing this module also records the builds
of the frameworks already imported (PyTorch's torch.version.cuda and cuDNN,
TensorFlow's tf.sysconfig.get_build_info(), JAX's and jaxlib's versions and
its CUDA plugin) at every step() and at exit, for the report's environment
block, and the exception that ends the program (sys.excepthook): a
torch.OutOfMemoryError, ResourceExhaustedError or RESOURCE_EXHAUSTED is
named in the report's out-of-memory verdict. Nothing is imported for it.

`memledger.live()` gives this process's live and held bytes by kind now,
as the tracer counts them (cheap enough for every step):

    now = memledger.live()
    if now.tracing:
        print(now.live["device"], now.device_live, now.held["host"])
"""

import atexit
import contextlib
import ctypes
import sys
import threading

__all__ = ["active", "step", "phase", "current_phase", "flush", "run_dir", "live", "Live", "KINDS", "snapshot"]

# The memory kinds, in the order of the C ABI's arrays (memledger.h).
KINDS = ("host", "device", "managed", "pinned")
_MAX_GPUS = 16
_LIVE_TRACING, _LIVE_HOST, _LIVE_HOST_SAMPLED = 1, 2, 4


class _LiveStruct(ctypes.Structure):
    """struct memledger_live (interposer/memledger.h)."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("seq", ctypes.c_uint64),
        ("steps", ctypes.c_uint64),
        ("live", ctypes.c_int64 * 4),
        ("held", ctypes.c_uint64 * 4),
        ("gpus", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("device_live", ctypes.c_int64 * _MAX_GPUS),
        ("device_held", ctypes.c_uint64 * _MAX_GPUS),
    ]


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


def _c_function(name, argtypes, restype):
    """A function of the C ABI by name, or None when the preload library is
    absent."""
    try:
        fn = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


_abi = _resolve()
_live_fn = _c_function("memledger_live", [ctypes.POINTER(_LiveStruct)], ctypes.c_int)
_note_fn = _c_function("memledger_note", [ctypes.c_char_p, ctypes.c_char_p], None)
_phases = threading.local()
_noted = {}  # (framework, field) -> value recorded


def _note(key, value):
    if _note_fn is not None:
        _note_fn(key.encode("utf-8", "replace"), str(value).encode("utf-8", "replace"))


def _torch_build(torch):
    fields = {"version": getattr(torch, "__version__", None)}
    version = getattr(torch, "version", None)
    fields["cuda"] = getattr(version, "cuda", None)
    # cuDNN's version as the program's torch found it, once it asked
    # (torch.backends.cudnn keeps it); before that, the version the build was
    # made with. torch.backends.cudnn.version() itself would load cuDNN 9's
    # libraries into the program (50 MiB of them with PyTorch 2.15's wheel).
    cudnn = sys.modules.get("torch.backends.cudnn")
    asked = getattr(cudnn, "__cudnn_version", None) if cudnn is not None else None
    built = getattr(getattr(torch, "_C", None), "_cudnn", None)
    if asked is not None:
        fields["cudnn"] = asked
    elif built is not None:
        fields["cudnn"] = "%d.%d.%d at build (not loaded by the program)" % tuple(built.getCompileVersion())
    else:
        fields["cudnn"] = None  # a build without cuDNN
    return fields


def _tensorflow_build(tf):
    fields = {"version": getattr(tf, "__version__", None)}
    info = tf.sysconfig.get_build_info()
    fields["cuda"] = info.get("cuda_version", "None" if not info.get("is_cuda_build") else None)
    fields["cudnn"] = info.get("cudnn_version", "None" if not info.get("is_cuda_build") else None)
    return fields


def _jax_build(jax):
    fields = {"version": getattr(jax, "__version__", None)}
    jaxlib = sys.modules.get("jaxlib")
    fields["jaxlib"] = getattr(jaxlib, "__version__", None) or getattr(sys.modules.get("jaxlib.version"),
                                                                      "__version__", None)
    # The CUDA plugin (jax_cuda12_plugin, jax_plugins.xla_cuda12), when loaded.
    plugins = sorted(name for name in list(sys.modules)
                     if name.startswith(("jax_cuda", "jax_plugins.xla_cuda")) and "." not in name[12:])
    fields["cuda"] = plugins[0].rsplit("cuda", 1)[1].split("_")[0] if plugins else "None"
    bridge = sys.modules.get("jax._src.xla_bridge")
    backends = getattr(bridge, "_backends", None)  # read, never initialised here
    if backends:
        fields["backends"] = ",".join(sorted(backends))
    return fields


_FRAMEWORKS = (("torch", _torch_build), ("tensorflow", _tensorflow_build), ("jax", _jax_build))


def _note_frameworks():
    """Records the builds of the frameworks the program imported (never
    importing one), each field once."""
    if _note_fn is None:
        return
    for name, build in _FRAMEWORKS:
        module = sys.modules.get(name)
        if module is None or (name, "version") in _noted:
            continue
        try:
            fields = build(module)
        except Exception:  # a framework half imported, or one that changed its API
            continue
        for field, value in fields.items():
            if value is None and field not in ("cuda", "cudnn"):
                continue
            _noted[(name, field)] = value
            _note("framework.%s.%s" % (name, field), value)


def _excepthook(kind, value, tb, _previous=sys.excepthook):
    try:
        if _note_fn is not None:
            _note_frameworks()
            name = getattr(kind, "__module__", "") + "." + getattr(kind, "__qualname__", str(kind))
            text = str(value).strip().splitlines()
            _note("python.exception", name.lstrip(".") + ": " + " ".join(text[:3])[:400])
            flush()
    except Exception:
        pass
    _previous(kind, value, tb)


if _note_fn is not None and _abi is not None and _abi[1]() != 0:
    sys.excepthook = _excepthook
    atexit.register(_note_frameworks)


class Live:
    """This process's memory at one moment, as memledger counts it.

    tracing: False outside `memledger run` (every figure is then 0).
    live, held: bytes by kind ("host", "device", "managed", "pinned");
      live = allocated and not freed, held = what the allocators hold from
      the system (host: glibc's arenas; device: allocations rounded to the
      2 MiB granularity, VMM memory, pools' reserve at their last sample).
    device_live, device_held: the device kind per GPU ordinal.
    host_tracked: False under `--host off` (host figures are then 0).
    host_exact: host live bytes are exact (usable sizes) in every host mode;
      host_sampled says that the trace's per-site host figures are estimates.
    seq, steps: the trace's sequence number now and the steps ended so far.
    """

    __slots__ = ("tracing", "host_tracked", "host_sampled", "seq", "steps", "live", "held",
                 "device_live", "device_held")

    def __init__(self, raw=None):
        flags = raw.flags if raw is not None else 0
        self.tracing = bool(flags & _LIVE_TRACING)
        self.host_tracked = bool(flags & _LIVE_HOST)
        self.host_sampled = bool(flags & _LIVE_HOST_SAMPLED)
        self.seq = raw.seq if self.tracing else 0
        self.steps = raw.steps if self.tracing else 0
        self.live = {k: (raw.live[i] if self.tracing else 0) for i, k in enumerate(KINDS)}
        self.held = {k: (raw.held[i] if self.tracing else 0) for i, k in enumerate(KINDS)}
        gpus = min(raw.gpus, _MAX_GPUS) if self.tracing else 0
        self.device_live = [raw.device_live[i] for i in range(gpus)]
        self.device_held = [raw.device_held[i] for i in range(gpus)]

    @property
    def host_exact(self):
        return self.host_tracked

    def __repr__(self):
        if not self.tracing:
            return "memledger.Live(tracing=False)"
        return "memledger.Live(live=%r, held=%r, device_live=%r, host_sampled=%r, steps=%d)" % (
            self.live, self.held, self.device_live, self.host_sampled, self.steps)


def live():
    """This process's live and held bytes now (a Live). Outside `memledger
    run`, Live.tracing is False and every figure 0."""
    if _live_fn is None:
        return Live()
    raw = _LiveStruct()
    raw.size = ctypes.sizeof(_LiveStruct)
    _live_fn(ctypes.byref(raw))
    return Live(raw)


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
    _note_frameworks()
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


def snapshot(when="snapshot", budget_s=None):
    """Finds what keeps this process's large buffers alive now (tensors,
    arrays, bytes: the chain of referrers from each to a global, a local or
    an attribute) and writes it to the run folder, where the report matches
    it with the growth suspects. Bounded to about a second; returns the
    file's path, or None when the process is not traced. At exit it runs by
    itself (memledger._autoload), unless the program took a snapshot: the
    last snapshot is the one the report reads."""
    global _snapshot_taken
    directory = run_dir()
    if directory is None:
        return None
    from memledger import _retention

    if when == "snapshot":
        _snapshot_taken = True  # the program chose its moment: no walk at exit replaces it
    return _retention.write(directory, when, budget_s)


_snapshot_taken = False
