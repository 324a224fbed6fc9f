"""Who keeps the program's large buffers alive: retention paths.

At exit (and on memledger.snapshot(), and at SIGTERM when SIGTERM has its
default action: memledger._autoload), the traced program's large memory
owners are found among the objects the garbage collector tracks and what
they refer to: torch tensors and storages (their storage's data pointer),
NumPy arrays that own their data and views that keep such a buffer (or a
tensor's) alive, JAX arrays, TensorFlow's eager tensors
and resource variables (the buffer's address through DLPack, which shares
it on every device), bytes and bytearrays; also inside the dicts and tuples
the collector does not track (those that hold only untracked objects, such
as arrays). From each, the chain of referrers is followed up to a named
root: a module global, a local variable of a running function, or an
attribute of a named object. The result goes to retention.PID.json in the run folder, where the
report matches each owner's address with the live blocks of its growth
suspects and prints the chain under the suspect:

    kept by: list `history` (60 items), global in __main__ (train.py)
        ← Tensor (float32[16, 4096], requires_grad, grad_fn AddmmBackward0)

The walk reads what the interpreter holds while this thread holds the GIL,
and never runs a finalizer or a property. It stops after a budget of about
a second, and the file says what it skipped.
"""

import abc
import array
import bisect
import ctypes
import gc
import heapq
import json
import os
import sys
import time
import types

try:
    import _abc  # the registries of abstract base classes (_with_registered)
except ImportError:
    _abc = None

MIN_BYTES = 64 * 1024  # smaller owners are not followed
MAX_OWNERS = 4096      # the largest ones, when there are more
MAX_DEPTH = 10         # hops from an owner to its root
BUDGET_S = 1.0
# The trace's info key that brackets memledger's own work in the program
# (report/replay.cpp, OwnWork).
OWN_WORK_KEY = "memledger.own_work"
_FORMAT = 1


def _short_file(path):
    return os.path.basename(path) if path else "?"


class _Owners:
    """Recognises the objects that own a large buffer: (address, bytes,
    kind, description), or None. Frameworks are looked up in sys.modules,
    never imported."""

    def __init__(self):
        self.torch = sys.modules.get("torch")
        self.numpy = sys.modules.get("numpy")
        jax = sys.modules.get("jax")
        self.jax_array = getattr(jax, "Array", None) if jax is not None else None
        self.tensor = getattr(self.torch, "Tensor", None) if self.torch is not None else None
        self.ndarray = getattr(self.numpy, "ndarray", None) if self.numpy is not None else None
        # TensorFlow: its eager tensors and resource variables (Keras 3's
        # variables hold one), when the program imported TensorFlow.
        ops = sys.modules.get("tensorflow.python.framework.ops")
        variables = sys.modules.get("tensorflow.python.ops.resource_variable_ops")
        dlpack = sys.modules.get("tensorflow.python.dlpack.dlpack")
        context = sys.modules.get("tensorflow.python.eager.context")
        self.tf_tensor = getattr(ops, "EagerTensor", None)
        self.tf_variable = getattr(variables, "BaseResourceVariable", None)
        self.tf_to_dlpack = getattr(dlpack, "to_dlpack", None)
        self.tf_eager = getattr(context, "executing_eagerly", None)
        if self.tf_to_dlpack is None:
            self.tf_tensor = self.tf_variable = None

    def types(self):
        """The types whose objects may own a large buffer."""
        return tuple(t for t in (bytes, bytearray, self.tensor, self.ndarray, self.jax_array, self.tf_tensor,
                                 self.tf_variable) if t is not None)

    def of(self, obj):
        t = type(obj)
        if t is bytes:
            n = len(obj)
            return (id(obj), n, "host", "bytes (%d)" % n) if n >= MIN_BYTES else None
        if t is bytearray:
            n = len(obj)
            if n < MIN_BYTES:
                return None
            view = (ctypes.c_char * 1).from_buffer(obj)
            address = ctypes.addressof(view)
            del view
            return (address, n, "host", "bytearray (%d)" % n)
        if self.tensor is not None and isinstance(obj, self.tensor):
            return self._tensor(obj)
        if self.ndarray is not None and isinstance(obj, self.ndarray):
            if obj.base is not None:
                return self._view(obj)
            if not obj.flags.owndata or obj.nbytes < MIN_BYTES:
                return None
            return (obj.__array_interface__["data"][0], obj.nbytes, "host",
                    "ndarray (%s%s)" % (obj.dtype, list(obj.shape)))
        if self.jax_array is not None and isinstance(obj, self.jax_array):
            try:
                if obj.nbytes < MIN_BYTES:
                    return None
                address = obj.unsafe_buffer_pointer()
                platform = next(iter(obj.devices())).platform
            except Exception:  # a sharded or deleted array
                return None
            return (address, obj.nbytes, "host" if platform == "cpu" else "device",
                    "jax.Array (%s%s)" % (obj.dtype, list(obj.shape)))
        if self.tf_tensor is not None and isinstance(obj, self.tf_tensor):
            return self._tf(obj, obj, "tf.Tensor")
        if self.tf_variable is not None and isinstance(obj, self.tf_variable):
            # Reading a resource variable in eager mode gives a tensor that
            # shares the variable's buffer (no copy); never while a function
            # is being traced, where it would add an op to its graph.
            if self.tf_eager is None or not self.tf_eager():
                return None
            return self._tf(obj, obj.read_value_no_copy(), "tf.Variable `%s`" % obj.name)
        return None

    def _view(self, view):
        """A NumPy view keeps the buffer of its base alive, however small
        the view: `history.append(batch[:1])` keeps every batch. The base
        (an array that owns its data, bytes, a tensor whose numpy() this
        is) is held by the view alone, which no pass over the collector's
        objects reaches (NumPy's arrays are not tracked): the view is the
        owner, with the base's buffer."""
        base = view.base
        for _ in range(8):  # NumPy makes a view of a view refer to the first base
            if not isinstance(base, self.ndarray) or base.base is None:
                break
            base = base.base
        if isinstance(base, self.ndarray) and base.base is not None:
            return None  # a chain longer than NumPy makes
        owned = self.of(base)
        if owned is None:
            return None
        return owned[:3] + ("ndarray view (%s%s) of %s" % (view.dtype, list(view.shape), owned[3]),)

    def _tf(self, obj, tensor, what):
        """A TensorFlow buffer's address: DLPack hands it out without a copy
        on every device (NumPy conversion would copy a device tensor)."""
        dtype = tensor.dtype
        nbytes = tensor.shape.num_elements() * dtype.size if tensor.shape.is_fully_defined() else 0
        if nbytes < MIN_BYTES:
            return None
        capsule = self.tf_to_dlpack(tensor)  # fails for dtypes DLPack lacks (strings, resources)
        managed = _capsule_pointer(capsule, b"dltensor")
        if not managed:
            return None
        dl = _DLTensor.from_address(managed)
        address, device = dl.data + dl.byte_offset, dl.device_type
        del dl, capsule  # the capsule's destructor gives the tensor back
        if not address:
            return None
        # DLPack devices: 1 CPU, 3 CUDA host (pinned), 2 CUDA, 10 ROCm...
        kind = "host" if device in (1, 3) else "device"
        return (address, nbytes, kind, "%s (%s%s)" % (what, dtype.name, tensor.shape.as_list()))

    def _tensor(self, obj):
        try:
            storage = obj.untyped_storage() if hasattr(obj, "untyped_storage") else obj.storage()
            nbytes = storage.nbytes()
            if nbytes < MIN_BYTES:
                return None
            # Fake and meta tensors (torch.compile leaves them alive) own no
            # memory, and a fake one's data_ptr() warns on the program's stderr.
            if storage.device.type == "meta":
                return None
            address = storage.data_ptr()
            device = obj.device.type
        except Exception:  # sparse, meta or quantized tensors
            return None
        if address == 0:
            return None
        parts = ["%s%s" % (str(obj.dtype).replace("torch.", ""), list(obj.shape))]
        if obj.requires_grad:
            parts.append("requires_grad")
        grad_fn = getattr(obj, "grad_fn", None)
        if grad_fn is not None:
            parts.append("grad_fn %s" % type(grad_fn).__name__)
        kind = "host" if device == "cpu" else "device"
        return (address, nbytes, kind, "Tensor (%s)" % ", ".join(parts))


class _DLTensor(ctypes.Structure):
    """The head of DLPack's DLManagedTensor (dlpack.h): its DLTensor."""

    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("dtype", ctypes.c_uint32), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


def _capsule_pointer(capsule, name):
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return get(capsule, name)


def _describe(obj):
    """What a container is, in a few words."""
    t = type(obj)
    if t in (list, tuple, set, frozenset, dict):
        return "%s (%d items)" % (t.__name__, len(obj))
    if t is types.CellType:
        return "closure cell"
    if isinstance(obj, types.FunctionType):
        return "function %s" % obj.__qualname__
    if isinstance(obj, types.MethodType):
        return "bound method %s" % getattr(obj.__func__, "__qualname__", "?")
    return "%s object" % t.__qualname__


def _name_in(container, child):
    """The key, attribute or index under which `container` holds `child`."""
    t = type(container)
    try:
        if t is dict:
            for n, (k, v) in enumerate(container.items()):
                if v is child:
                    return repr(k) if not isinstance(k, str) else k
                if n > 100000:
                    break
        elif t in (list, tuple):
            for n, v in enumerate(container):
                if v is child:
                    return "[%d]" % n
                if n > 100000:
                    break
    except Exception:
        pass
    return None


def _plain_cpython():
    """Whether objects here are laid out as a 64-bit CPython's with the GIL:
    a reference count, then the type (a free-threaded or a trace-refs build
    puts more before it)."""
    if sys.implementation.name != "cpython" or hasattr(sys, "getobjects") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return False
    try:
        import sysconfig
        return not sysconfig.get_config_var("Py_GIL_DISABLED")
    except Exception:
        return False


def _list_items(objects):
    """The item array of the list `objects` as ctypes words (a CPython
    list's object pointers, which are the items' ids), or None where the
    interpreter's list is laid out otherwise or a check fails. Reads the
    list in place: nothing else holds it while the walk runs."""
    if not _plain_cpython():
        return None
    try:
        # PyListObject: reference count, type, size, then the item array.
        if ctypes.c_void_p.from_address(id(objects) + 8).value != id(list):
            return None
        n = len(objects)
        if ctypes.c_ssize_t.from_address(id(objects) + 16).value != n:
            return None
        if n == 0:
            return (ctypes.c_uint64 * 0)()
        items = (ctypes.c_uint64 * n).from_address(ctypes.c_void_p.from_address(id(objects) + 24).value)
        for i in range(0, n, max(1, n // 64)):
            if items[i] != id(objects[i]):
                return None
        if items[n - 1] != id(objects[n - 1]):
            return None
        return items
    except Exception:
        return None


def _sorted_addresses(objects, chunk=1 << 16):
    """The objects' addresses in order, 8 bytes each: sorted a chunk at a time
    and merged, so that the addresses are never all Python ints at once (a
    list of them took 40 bytes an object more: 49 MiB for a million, now
    17 MiB, in about the same time). With NumPy loaded by the program, NumPy
    sorts them, in a third of the time, and copies them from the list's own
    item array where the interpreter's list has the layout it checks: 3 ms
    for 330,000 objects, where making each one's id took 39 ms."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            items = _list_items(objects)
            if items is not None:
                addresses = numpy.frombuffer(items, dtype=numpy.uint64).copy()
                del items
            else:
                addresses = numpy.fromiter(map(id, objects), dtype=numpy.uint64, count=len(objects))
            addresses.sort()
            out = array.array("Q")
            out.frombytes(memoryview(addresses).cast("B"))
            return out
        except Exception:  # an odd NumPy: the way below
            pass
    runs = [array.array("Q", sorted(map(id, objects[i:i + chunk]))) for i in range(0, len(objects), chunk)]
    if len(runs) == 1:
        return runs[0]
    return array.array("Q", heapq.merge(*runs))


def _typed_referents(container, candidates, inside=0):
    """(holder, referent) for each referent of container that is an
    instance of `candidates`, and for those of the untracked dicts and
    tuples among its referents (CPython stops tracking a dict or a tuple
    that holds only untracked objects: NumPy arrays, bytes, numbers, strings),
    whose holder is that dict or tuple."""
    for child in gc.get_referents(container):
        t = type(child)
        if t is dict or t is tuple:
            if inside < _MAX_INSIDE and not gc.is_tracked(child):
                yield from _typed_referents(child, candidates, inside + 1)
        elif isinstance(child, candidates):
            yield container, child


_MAX_INSIDE = 4  # untracked dicts and tuples inside one another, looked into

# Offsets in objects and type objects (CPython's object.h), each checked by
# _type_layout against this interpreter before use: an object's type and
# size, a tuple's items, the collector's link before an object (0 while it
# is not tracked); a type's tp_basicsize, tp_flags, tp_traverse,
# tp_weaklistoffset, tp_base, tp_dictoffset and tp_mro.
_OB_TYPE, _OB_SIZE, _TUPLE_ITEMS, _GC_NEXT = 8, 16, 24, -16
_TP_BASICSIZE, _TP_FLAGS, _TP_TRAVERSE, _TP_WEAKLISTOFFSET = 32, 168, 184, 208
_TP_BASE, _TP_DICTOFFSET, _TP_MRO = 256, 288, 344


_checked = {}  # the layouts found for this interpreter, and the C functions, once each


def _library_function(name, argtypes):
    """The preload library's function `name`, called with the GIL held
    (ctypes.PyDLL, where memledger's _c_function takes ctypes.CDLL, which
    lets the GIL go: the searches read the interpreter's objects), returning
    an int64; None where the library is not loaded. Looked up once a
    process."""
    key = "function " + name
    if key not in _checked:
        try:
            fn = getattr(ctypes.PyDLL(None), name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int64
        except (OSError, AttributeError):
            fn = None
        _checked[key] = fn
    return _checked[key]


def _type_layout():
    """The layout memledger_py_referents reads (its Layout: ob_type,
    ob_size, a tuple's items, tp_traverse, tp_mro, dict and tuple, the
    collector's link), when this interpreter's objects and types match it,
    checked field by field around tp_traverse on a few types; else None."""
    if "type" not in _checked:
        _checked["type"] = _check_type_layout()
    return _checked["type"]


def _check_type_layout():
    if not _plain_cpython():
        return None

    def word(address):
        return ctypes.c_uint64.from_address(address).value

    def signed(address):
        return ctypes.c_int64.from_address(address).value

    class Probe:
        pass

    try:
        for t in (list, dict, tuple, type, bytes, bytearray, int, Probe):
            a = id(t)
            base = t.__base__
            if (word(a + _OB_TYPE) != id(type(t)) or word(a + _TP_BASICSIZE) != t.__basicsize__
                    or word(a + _TP_FLAGS) != t.__flags__ or signed(a + _TP_WEAKLISTOFFSET) != t.__weakrefoffset__
                    or word(a + _TP_BASE) != (id(base) if base is not None else 0)
                    or signed(a + _TP_DICTOFFSET) != t.__dictoffset__ or word(a + _TP_MRO) != id(t.__mro__)):
                return None
            # Only the types the collector tracks traverse their referents.
            if (word(a + _TP_TRAVERSE) != 0) != bool(t.__flags__ & (1 << 14)):  # Py_TPFLAGS_HAVE_GC
                return None
        pair = (1.5, Probe)
        data = b"0123456789"
        if (word(id(pair) + _OB_SIZE) != 2 or word(id(pair) + _TUPLE_ITEMS + 8) != id(Probe)
                or word(id(data) + _OB_SIZE) != 10 or word(id(bytearray(12)) + _OB_SIZE) != 12):
            return None
        # Tracked and untracked dicts and tuples, as the collector says.
        untracked = ({}, {"a": 1.5})
        tracked = ({"a": []}, tuple([[]]), [])
        if any(gc.is_tracked(o) for o in untracked) or not all(gc.is_tracked(o) for o in tracked):
            return None
        if any(word(id(o) + _GC_NEXT) != 0 for o in untracked) or any(word(id(o) + _GC_NEXT) == 0 for o in tracked):
            return None
    except Exception:
        return None
    return (ctypes.c_uint64 * 8)(_OB_TYPE, _OB_SIZE, _TUPLE_ITEMS, _TP_TRAVERSE, _TP_MRO, id(dict), id(tuple),
                                 _GC_NEXT & 0xFFFFFFFFFFFFFFFF)


def _with_registered(candidates):
    """The candidate types and, for an abstract base class among them, the
    classes registered with it (and theirs, and their subclasses), which its
    method resolution order does not name: the C search compares that
    order, where isinstance() asks the class. None where the registry cannot
    be read."""
    out = list(candidates)
    pending = [t for t in candidates if isinstance(t, abc.ABCMeta)]
    seen = set(pending)
    while pending:
        cls = pending.pop()
        try:
            registered = [ref() for ref in _abc._get_dump(cls)[0]] if isinstance(cls, abc.ABCMeta) else []
            subclasses = type.__subclasses__(cls)
        except Exception:
            return None
        for sub in registered + subclasses:
            if isinstance(sub, type) and sub not in seen:
                seen.add(sub)
                pending.append(sub)
                if not any(base in out for base in sub.__mro__):
                    out.append(sub)
    return tuple(out)


class _ReferentScan:
    """The objects' referents of the types that may own a large buffer,
    found by memledger_py_referents (interposer/python_referents.cpp) in
    C, where the preload library is loaded and the interpreter's layout is
    the one it reads: 20 ms for the 1.6 million referents of a small
    PyTorch program, where looking at each one in Python took 90 ms."""

    CAPACITY = 1 << 14  # pairs a call may return

    def __init__(self, fn, layout, items, candidates):
        self.fn = fn
        self.layout = layout
        self.items = items
        n = len(candidates)
        self.types = (ctypes.c_uint64 * n)(*map(id, candidates))
        # bytes and bytearray own MIN_BYTES or more (their ob_size) to count.
        self.min_sizes = (ctypes.c_int64 * n)(*[MIN_BYTES if t in (bytes, bytearray) else -1 for t in candidates])
        self.out = (ctypes.c_uint64 * (2 * self.CAPACITY))()
        self.next = ctypes.c_int64()

    @classmethod
    def make(cls, objects, candidates):
        fn = _library_function("memledger_py_referents", [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
            ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)])
        layout = _type_layout() if fn is not None else None
        items = _list_items(objects) if layout is not None else None
        if items is None:
            return None
        candidates = _with_registered(candidates)
        if candidates is None:
            return None
        return cls(fn, layout, items, candidates)

    def run(self, begin, end):
        """(holder, referent) pairs of objects[begin, end) (as
        _typed_referents, except that bytes and bytearrays come only from 64
        KiB on), and the first object not scanned: `end`, or one whose pairs
        did not fit, which is `begin` only when that object alone has more
        than CAPACITY."""
        count = self.fn(self.layout, self.items, begin, end, self.types, self.min_sizes, len(self.types),
                        self.out, self.CAPACITY, ctypes.byref(self.next))
        out = self.out
        to_object = ctypes.py_object
        pairs = [(ctypes.cast(out[2 * k], to_object).value, ctypes.cast(out[2 * k + 1], to_object).value)
                 for k in range(count)]
        return pairs, self.next.value


_TPFLAGS_MANAGED_DICT = 1 << 4  # 3.11 on: the dict, once made, three words before the object
_MANAGED_DICT_OFFSET = -24


def _dict_layout():
    """memledger_py_dict_holders and the layout it reads (its DictLayout),
    when the dicts it finds by it are those of instances of a plain class,
    of an exception's subclass and of a module; else None. CPython 3.9 to
    3.13: where a later one keeps an instance's dict is not assumed."""
    if "dict" not in _checked:
        _checked["dict"] = _check_dict_layout()
    return _checked["dict"]


def _check_dict_layout():
    if _type_layout() is None or sys.version_info >= (3, 14):
        return None
    managed = sys.version_info >= (3, 11)
    layout = (ctypes.c_uint64 * 6)(_OB_TYPE, _TP_FLAGS, _TP_DICTOFFSET, _TPFLAGS_MANAGED_DICT if managed else 0,
                                   _MANAGED_DICT_OFFSET & 0xFFFFFFFFFFFFFFFF, 1 if sys.version_info[:2] == (3, 12) else 0)

    class Probe:
        pass

    class Failure(Exception):
        pass

    fn = _library_function("memledger_py_dict_holders", [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
        ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)])
    if fn is None:
        return None
    try:
        probe, failure, module = Probe(), Failure(), types.ModuleType("probe")
        probe.a = failure.a = module.a = 1
        holders = [probe, Probe(), failure, module]  # the second keeps its dict unmade
        dicts = sorted(id(h.__dict__) for h in (probe, failure, module))
        found = _HolderScan(fn, layout, holders).run(0, len(holders), dicts)[0]
        if sorted(found) != [(0, id(probe.__dict__)), (2, id(failure.__dict__)), (3, id(module.__dict__))]:
            return None
    except Exception:
        return None
    return fn, layout


class _HolderScan:
    """Finds the objects whose attribute dict is one of a few dicts by
    reading where each object keeps it (memledger_py_dict_holders), a
    fraction of a pass of gc.get_referrers."""

    CAPACITY = 1 << 10

    def __init__(self, fn, layout, objects, items=None):
        self.fn = fn
        self.layout = layout
        self.objects = objects
        # The probe's list is read through its own items too.
        self.items = items if items is not None else _list_items(objects)
        self.out = (ctypes.c_uint64 * (2 * self.CAPACITY))()
        self.next = ctypes.c_int64()

    @classmethod
    def make(cls, objects):
        checked = _dict_layout()
        items = _list_items(objects) if checked is not None else None
        return cls(checked[0], checked[1], objects, items) if items is not None else None

    def run(self, begin, end, dicts):
        """(index, id(dict)) of objects[begin, end) whose dict is among the
        sorted ids `dicts`, and the first object not scanned."""
        wanted = (ctypes.c_uint64 * len(dicts))(*dicts)
        count = self.fn(self.layout, self.items, begin, end, wanted, len(dicts), self.out, self.CAPACITY,
                        ctypes.byref(self.next))
        out = self.out
        return [(out[2 * k], out[2 * k + 1]) for k in range(count)], self.next.value

    def holders(self, dicts):
        """id(dict) -> the objects that hold it as their attribute dict, in
        the list's order."""
        wanted = sorted(set(map(id, dicts)))
        found = {}
        start = 0
        while start < len(self.objects):
            pairs, start = self.run(start, len(self.objects), wanted)
            for index, key in pairs:
                found.setdefault(key, []).append(self.objects[index])
        return found


class _Walk:
    def __init__(self, deadline):
        self.deadline = deadline
        self.skipped = []
        self.objects = gc.get_objects()
        # What the program had before the walk began: the walk's own lists,
        # dicts and frames, made later, are never part of a path.
        # (A sorted array of addresses: 8 bytes an object, where a set would
        # take five times that, on top of the program's own peak.)
        self.known = _sorted_addresses(self.objects)
        self.dicts = _HolderScan.make(self.objects)  # None: holders are looked up by a pass of the collector
        self.made = set()  # dicts the walk made the program's own (namespace_of)
        self.own = {id(self.objects), id(self.skipped), id(self.__dict__), id(self.known), id(self.made)}
        # Roots: module namespaces (the main script's as __main__), and the
        # locals of the running frames.
        self.modules = {}
        for name, module in list(sys.modules.items()):
            namespace = getattr(module, "__dict__", None)
            if isinstance(namespace, dict) and (id(namespace) not in self.modules or name == "__main__"):
                file = getattr(module, "__file__", None)
                if file is None and name == "__main__" and sys.argv and sys.argv[0] not in ("", "-c", "-m"):
                    file = sys.argv[0]  # CPython takes __main__.__file__ away once the script has run
                self.modules[id(namespace)] = (name, file)
        self.locals = {}
        self.local_values = []  # the objects the locals name (a frame is no tracked referrer)
        self.own.update((id(self.locals), id(self.local_values)))
        frames = []
        for frame in sys._current_frames().values():
            while frame is not None:
                if frame.f_code.co_filename != __file__:
                    frames.append(frame)
                frame = frame.f_back
        for frame in frames:
            try:
                namespace = frame.f_locals
            except Exception:
                continue
            if id(namespace) in self.modules:
                continue  # a module's code: its names are globals
            self.own.add(id(namespace))
            code = frame.f_code
            where = "local in %s (%s:%d)" % (getattr(code, "co_qualname", code.co_name),
                                             _short_file(code.co_filename), frame.f_lineno)
            for name, value in list(namespace.items()):
                if id(value) not in self.locals:
                    self.locals[id(value)] = (name, where)
                    self.local_values.append(value)
        del frames

    def namespace_of(self, obj):
        """obj.__dict__, or None. Reading it makes the dict of an instance
        that kept its attributes inline (CPython 3.11+): that dict then
        holds the attributes, and is accepted as their referrer."""
        try:
            namespace = obj.__dict__
        except Exception:
            return None
        if not isinstance(namespace, dict):
            return None
        self.made.add(id(namespace))
        return namespace

    def is_known(self, obj):
        """obj existed when the walk began (or is an instance dict it made)."""
        key = id(obj)
        i = bisect.bisect_left(self.known, key)
        return (i < len(self.known) and self.known[i] == key) or key in self.made

    def over_budget(self):
        return time.monotonic() > self.deadline

    def owners(self):
        """The large owners referred to by tracked objects, with each one's
        direct referrers (one pass over every tracked object)."""
        recognise = _Owners()
        kinds = {}    # type -> whether its objects may own a large buffer
        found = {}    # id -> (obj, address, bytes, kind, description)
        parents = {}  # id(child) -> [container, ...]
        self.own.update((id(found), id(parents), id(kinds)))
        candidates = recognise.types()

        def record(obj):
            """Keeps obj when it owns a large buffer; whether it does."""
            try:
                owned = recognise.of(obj)
            except Exception:
                owned = None
            if owned is None:
                return False
            entry = (obj,) + owned
            found[id(obj)] = entry
            self.own.add(id(entry))
            return True

        own = self.own
        objects = self.objects

        def take(container, child):
            """Keeps container as a referrer of child, when child owns a
            large buffer."""
            key = id(child)
            if key in found or record(child):
                if key not in parents:
                    parents[key] = []
                    own.add(id(parents[key]))
                parents[key].append(container)

        scan = _ReferentScan.make(objects, candidates)
        start = 0
        while start < len(objects):
            if self.over_budget():
                self.skipped.append("the search for large objects stopped after %d of %d objects"
                                    % (start, len(objects)))
                break
            if scan is not None:
                pairs, after = scan.run(start, min(len(objects), start + 65536))
                for holder, child in pairs:
                    # A holder is the object scanned, or an untracked dict
                    # or tuple it holds (never the walk's own).
                    if id(holder) not in own:
                        take(holder, child)
                del pairs
                if after == start:  # more pairs than a call returns, in one object
                    if id(objects[start]) not in own:
                        for holder, child in _typed_referents(objects[start], candidates):
                            take(holder, child)
                    after = start + 1
                start = after
                continue
            # Without it, the referents of 1024 objects at a time, in one
            # call; a batch in which an owner turns up is gone through again
            # object by object for its referrers (owners are few among
            # millions of referents).
            batch = [c for c in objects[start:start + 1024] if id(c) not in own]
            hit = False
            for child in gc.get_referents(*batch):
                t = type(child)
                maybe = kinds.get(t)
                if maybe is None:
                    maybe = kinds[t] = 2 if t is dict or t is tuple else int(issubclass(t, candidates))
                if maybe == 1:
                    if id(child) in found or record(child):
                        hit = True
                elif maybe == 2 and not hit and not gc.is_tracked(child):
                    for _, inner in _typed_referents(child, candidates, 1):
                        if id(inner) in found or record(inner):
                            hit = True
                            break
            if hit:
                for container in batch:
                    for holder, child in _typed_referents(container, candidates):
                        take(holder, child)
            del batch
            start += 1024
        # What only a running function's local holds.
        for value in self.local_values:
            if id(value) not in found:
                record(value)
        return found, parents

    def referrers(self, heads):
        """id(head) -> the tracked objects that refer to it, for a few heads
        at a time (the collector's own search, in C)."""
        out = {}
        heads = list(heads)
        for i in range(0, len(heads), 64):
            if self.over_budget():
                return out, False
            chunk = heads[i:i + 64]
            wanted = {id(h): h for h in chunk}
            found = gc.get_referrers(*chunk)
            for referrer in found:
                if id(referrer) in self.own or type(referrer) is types.FrameType or not self.is_known(referrer):
                    continue
                for child in gc.get_referents(referrer):
                    if id(child) in wanted:
                        out.setdefault(id(child), []).append(referrer)
            del found
        return out, True


# Helpers instead of generator expressions in find(): a closure there would
# keep the objects it names in a cell of find's frame, which the walk would
# then meet as their referrer.
def _extend(paths, heads, open_keys, keys, hop, step):
    """The hop found for the owners `keys`; their path goes on from `step`,
    or ends (None)."""
    for key in keys:
        paths[key][-1].update(hop)
        if step is None:
            open_keys.discard(key)
        else:
            paths[key].append({"what": _describe(step)})
            heads[key] = step


def _first_in(objects, ids):
    for o in objects:
        if id(o) in ids:
            return o
    return None


def _instance_of(walk, namespace, referrers):
    for o in referrers:
        if type(o) not in (dict, list, tuple, set, types.CellType) and walk.namespace_of(o) is namespace:
            return o
    return None


def _key_of(mapping, value):
    for k, v in mapping.items():
        if v is value:
            return k
    return None


def find(budget_s=BUDGET_S):
    """The retention paths of this process's large owners, as a dict (the
    JSON the report reads)."""
    start = time.monotonic()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # no collection (and no finalizer) while walking
    walk = None
    try:
        walk = _Walk(start + budget_s)
        found, parents = walk.owners()
        # The largest owners first; those past MAX_OWNERS are not followed.
        # Views share their base's storage: one owner per buffer, the base
        # itself where the walk found it too (a NumPy view after it).
        order = sorted(found, key=lambda k: (-found[k][2], found[k][4].startswith("ndarray view ")))
        addresses = set()
        walk.own.add(id(addresses))
        unique = []
        for key in order:
            if (found[key][1], found[key][3]) not in addresses:
                addresses.add((found[key][1], found[key][3]))
                unique.append(key)
        order = unique
        if len(order) > MAX_OWNERS:
            walk.skipped.append("%d smaller owners were not followed" % (len(order) - MAX_OWNERS))
            order = order[:MAX_OWNERS]
        # The paths go up from each owner one hop per level, for all owners at
        # once: owners held by the same container share the rest of the path.
        paths = {}  # owner id -> list of hops, owner first
        heads = {}  # owner id -> the object at the top of its path so far
        for key in order:
            paths[key] = [{"what": found[key][4]}]
            heads[key] = found[key][0]
        open_keys = set(order)
        referrers = dict(parents)  # id -> tracked objects that refer to it, as far as looked up
        holders = {}               # id(instance __dict__) -> the instance, or None
        walk.own.update((id(paths), id(heads), id(referrers), id(holders), id(order)))
        for depth in range(MAX_DEPTH):
            groups = {}
            for key in open_keys:
                groups.setdefault(id(heads[key]), []).append(key)
            missing = [heads[keys[0]] for h, keys in groups.items() if h not in referrers]
            if missing:
                found_up, complete = walk.referrers(missing)
                for head in missing:
                    referrers[id(head)] = found_up.get(id(head), [])
                if not complete:
                    walk.skipped.append("paths were cut at %d hops: the budget of %.1f s ran out" % (depth, budget_s))
                    break
            # Each group's hop; a dict found as the parent (an instance's
            # attributes) waits for the instance that holds it, looked up
            # for all of this depth's dicts at once: each look-up is a pass
            # over every tracked object.
            pending = []  # (keys, head, parent dict)
            for h, keys in groups.items():
                head = heads[keys[0]]
                hop = {}
                step = None
                local = walk.locals.get(h)
                candidates = [c for c in referrers.get(h, [])
                              if c is not walk.objects and type(c) is not types.FrameType]
                root = _first_in(candidates, walk.modules)
                if root is not None:
                    module, file = walk.modules[id(root)]
                    hop = {"name": _name_in(root, head) or "?", "root": "global in %s (%s)" % (module, _short_file(file))}
                elif local is not None:
                    hop = {"name": local[0], "root": local[1]}
                elif not candidates:
                    hop = {"root": "no referrer the collector tracks"}
                else:
                    parent = candidates[0]
                    if type(parent) is dict:
                        pending.append((keys, head, parent))
                        continue
                    name = _name_in(parent, head)
                    if name is None and walk.namespace_of(parent) is not None:
                        name = _key_of(walk.namespace_of(parent), head)
                        if name is not None:
                            hop["attribute"] = True
                    if name is not None:
                        hop["name"] = name
                    step = parent
                _extend(paths, heads, open_keys, keys, hop, step)
            unknown = [parent for _, _, parent in pending if id(parent) not in holders]
            if unknown and walk.dicts is not None:
                # Where each object keeps its dict, read in C: no pass.
                held = walk.dicts.holders(unknown)
                for parent in unknown:
                    holders[id(parent)] = _instance_of(walk, parent, [o for o in held.get(id(parent), [])
                                                                      if id(o) not in walk.own])
                del held
            elif unknown:
                up, complete = walk.referrers(unknown)
                for parent in unknown:
                    holders[id(parent)] = _instance_of(walk, parent, up.get(id(parent), []))
                    if complete:
                        # A dict that no instance holds is the next head:
                        # its referrers are known now, not searched again.
                        referrers[id(parent)] = up.get(id(parent), [])
                del up
            for keys, head, parent in pending:
                # An instance's attributes: name the instance, not its dict.
                hop = {}
                name = _name_in(parent, head)
                if holders.get(id(parent)) is not None:
                    parent = holders[id(parent)]
                    hop["attribute"] = True
                if name is not None:
                    hop["name"] = name
                _extend(paths, heads, open_keys, keys, hop, parent)
            del pending, unknown
            if not open_keys:
                break
            if walk.over_budget():
                walk.skipped.append("%d paths were cut at %d hops: the budget of %.1f s ran out"
                                    % (len(open_keys), depth + 1, budget_s))
                break
        # Paths shared by many owners are written once.
        table, index = [], {}
        owners = []
        for key in order:
            _, address, nbytes, kind, _ = found[key]
            path = paths[key]
            signature = json.dumps(path[1:], sort_keys=True)
            if signature not in index:
                index[signature] = len(table)
                table.append(path[1:])
            owners.append({"address": address, "bytes": nbytes, "kind": kind, "what": path[0]["what"],
                           "name": path[0].get("name"), "root": path[0].get("root"),
                           "path": index[signature]})
        return {"format": _FORMAT, "pid": os.getpid(), "elapsed_s": round(time.monotonic() - start, 3),
                "budget_s": budget_s, "skipped": walk.skipped, "owners": owners, "paths": table,
                "objects": len(walk.objects)}
    finally:
        if walk is not None:
            # The walk's lists (every tracked object, their sorted addresses:
            # megabytes) go now: a reference cycle through the walk would
            # keep them until the program's next collection, counted as the
            # program's.
            walk.__dict__.clear()
        if gc_was_enabled:
            gc.enable()


def configured_budget():
    """BUDGET_S seconds, or MEMLEDGER_RETENTION_BUDGET's."""
    try:
        return float(os.environ.get("MEMLEDGER_RETENTION_BUDGET", BUDGET_S))
    except ValueError:
        return BUDGET_S


def write(run_dir, when, budget_s=None):
    """Finds the paths and writes retention.PID.json in the run folder,
    within budget_s seconds (configured_budget() when None)."""
    budget = budget_s if budget_s is not None else configured_budget()
    import memledger

    seq = memledger.live().seq  # the trace's moment: the report matches the live set of then
    # The walk's own memory (the list of every tracked object, their sorted
    # addresses: tens of megabytes in a large program) is memledger's, not
    # the program's: the report leaves the events between these two marks
    # out of the peak (OWN_WORK_KEY).
    memledger._note(OWN_WORK_KEY, "begin %d" % seq)
    try:
        result = find(budget)
        result["when"] = when
        result["seq"] = seq
        path = os.path.join(run_dir, "retention.%d.json" % os.getpid())
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, path)
        del result
    finally:
        memledger._note(OWN_WORK_KEY, "end %d" % memledger.live().seq)
    return path
