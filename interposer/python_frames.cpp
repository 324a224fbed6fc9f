#include "python_frames.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <link.h>
#include <csetjmp>
#include <csignal>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include "libc_symbols.h"
#include "recorder.h"
#include "trace_format.h"

namespace memledger::interposer {

// Where the fields the walk reads live, for one CPython minor version
// (x86-64, default build). Offsets of the older versions come from their
// headers (offsetof on PyThreadState, _PyCFrame, _PyInterpreterFrame or
// PyFrameObject, PyCodeObject, PyASCIIObject); 3.13's are read from the
// interpreter's own _Py_DebugOffsets when it carries them.
struct PythonFrames::Layout {
  enum class Chain : uint8_t {
    kFrameObjects,   // 3.9, 3.10: tstate->frame, PyFrameObject.f_back, int f_lasti
    kCFrame,         // 3.11, 3.12: tstate->cframe->current_frame, _PyInterpreterFrame
    kCurrentFrame,   // 3.13: tstate->current_frame, _PyInterpreterFrame
  };
  unsigned minor;
  Chain chain;
  uint32_t tstate_frame;    // tstate->frame / ->cframe / ->current_frame
  uint32_t cframe_current;  // _PyCFrame.current_frame (kCFrame)
  uint32_t frame_previous;  // f_back / previous
  uint32_t frame_code;      // f_code / f_executable
  uint32_t frame_instr;     // f_lasti (int) / prev_instr / instr_ptr (pointer)
  uint32_t frame_owner;     // owner (uint8), 0 = none
  bool lasti_in_units;      // 3.10: f_lasti counts 2-byte code units
  uint32_t code_filename;
  uint32_t code_name;       // co_qualname where it exists, else co_name
  uint32_t code_table;      // co_linetable / co_lnotab
  uint32_t code_first_line;
  uint32_t code_instructions;  // co_code_adaptive (pointer chains)
  uint32_t ascii_size;         // sizeof(PyASCIIObject)
  uint32_t compact_size;       // sizeof(PyCompactUnicodeObject)
  format::LineTableFormat table_format;

  // Resolved at detection.
  void* (*this_thread_state)();
  int (*is_finalizing)();
  // The main interpreter's thread states (public lock-free reads), for
  // threads that never ran Python; null where not exported.
  void* (*main_interpreter)();
  void* (*thread_head)(void*);
  const void* code_type;
  const void* unicode_type;
  const void* bytes_type;
};

namespace {

using Layout = PythonFrames::Layout;
using Chain = Layout::Chain;

constexpr uint8_t kFrameOwnedByCStack = 3;  // 3.12+: a C shim frame, not Python code

// x86-64 layouts from each version's headers (see Layout).
constexpr Layout kLayouts[] = {
    {9, Chain::kFrameObjects, 24, 0, 24, 32, 104, 0, false, 104, 112, 120, 40, 0, 48, 72,
     format::LineTableFormat::kLnotab, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr},
    {10, Chain::kFrameObjects, 24, 0, 24, 32, 96, 0, true, 104, 112, 120, 40, 0, 48, 72,
     format::LineTableFormat::kLinetable, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr},
    {11, Chain::kCFrame, 56, 8, 48, 32, 56, 69, false, 112, 128, 136, 72, 184, 48, 72,
     format::LineTableFormat::kLocations, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr},
    {12, Chain::kCFrame, 56, 0, 8, 0, 56, 70, false, 112, 128, 136, 68, 192, 40, 56,
     format::LineTableFormat::kLocations, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr},
    {13, Chain::kCurrentFrame, 72, 0, 8, 0, 56, 70, false, 112, 128, 136, 68, 200, 40, 56,
     format::LineTableFormat::kLocations, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr},
};

// 3.13's _Py_DebugOffsets (Include/internal/pycore_runtime.h), at offset 0
// of _PyRuntime: where the fields this walk needs are described.
namespace debug13 {
constexpr char kCookie[8] = {'x', 'd', 'e', 'b', 'u', 'g', 'p', 'y'};
constexpr size_t kVersion = 8;
constexpr size_t kFreeThreaded = 16;
constexpr size_t kThreadCurrentFrame = 184;
constexpr size_t kFramePrevious = 232;
constexpr size_t kFrameExecutable = 240;
constexpr size_t kFrameInstrPtr = 248;
constexpr size_t kFrameOwner = 264;
constexpr size_t kCodeFilename = 280;
constexpr size_t kCodeQualname = 296;
constexpr size_t kCodeLinetable = 304;
constexpr size_t kCodeFirstLineno = 312;
constexpr size_t kCodeAdaptive = 344;
constexpr size_t kUnicodeState = 544;
constexpr size_t kUnicodeAsciiSize = 560;
}  // namespace debug13

Layout g_layout;  // the one in use, filled once by detect()

// Set while this thread walks Python frames: where a fault in the walk lands.
__thread sigjmp_buf* tls_walk_fault __attribute__((tls_model("initial-exec")));
// Whether this thread blocks SIGSEGV or SIGBUS: -1 not known yet (asked at
// its next walk), else 0 or 1. A thread that blocks them (libzmq's I/O
// threads block every signal) would not reach the fault guard: the kernel
// ends the process at the fault. Forgotten at each change of the thread's
// signal mask (python_frames_mask_changed).
__thread int8_t tls_faults_blocked __attribute__((tls_model("initial-exec"))) = -1;

template <typename T>
inline T load(const uint8_t* base, size_t offset) {
  T value;
  memcpy(&value, base + offset, sizeof value);
  return value;
}
inline const uint8_t* load_ptr(const uint8_t* base, size_t offset) {
  return load<const uint8_t*>(base, offset);
}

// The calling thread's signal mask, by the system call itself.
void set_thread_mask(int how, const sigset_t* set, sigset_t* old) {
  syscall(SYS_rt_sigprocmask, how, set, old, _NSIG / 8);
}

// Copies `n` bytes of interpreter memory in memledger's own code: a fault
// in it is one python_frames_recover() takes back, where one inside libc's
// memcpy would end the process (the volatile source keeps the compiler from
// turning the loop into a memcpy call).
void copy_foreign(uint8_t* out, const uint8_t* from, size_t n) {
  const volatile uint8_t* src = from;
  for (size_t i = 0; i < n; ++i) out[i] = src[i];
}

// Pointers read from interpreter memory are checked for the shape of a heap
// or mapping address before they are followed.
inline bool plausible(const uint8_t* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  return v >= 4096 && v < (uintptr_t{1} << 47) && (v & 7) == 0;
}

using DlsymFn = void* (*)(void*, const char*);

void* find_symbol(void* handle, const char* name) {
  static DlsymFn real = reinterpret_cast<DlsymFn>(libc_dlsym_address());
  if (real == nullptr) return nullptr;
  return real(handle, name);
}

struct ObjectScan {
  char python[512] = {};  // a loaded libpython, if any
  char pypy[512] = {};    // a loaded PyPy library, if any
};

int scan_objects(dl_phdr_info* info, size_t, void* data) {
  auto* scan = static_cast<ObjectScan*>(data);
  const char* path = info->dlpi_name;
  if (path == nullptr || *path == '\0') return 0;
  const char* base = strrchr(path, '/');
  base = base ? base + 1 : path;
  if (scan->python[0] == '\0' && strncmp(base, "libpython", 9) == 0) {
    snprintf(scan->python, sizeof scan->python, "%s", path);
  }
  if (scan->pypy[0] == '\0' && strncmp(base, "libpypy", 7) == 0) {
    snprintf(scan->pypy, sizeof scan->pypy, "%s", path);
  }
  return 0;
}

// Copies a compact str object as UTF-8 (or, with `out` null, measures it).
// Returns the bytes written.
size_t copy_unicode(const Layout& layout, const uint8_t* str, char* out, size_t capacity) {
  if (!plausible(str) || load_ptr(str, 8) != layout.unicode_type) return 0;
  const uint32_t state = load<uint32_t>(str, 32);
  const unsigned kind = (state >> 2) & 7;
  const bool compact = state & 0x20;
  const bool ascii = state & 0x40;
  const int64_t length = load<int64_t>(str, 16);
  if (!compact || length < 0) return 0;
  const uint8_t* data = str + (ascii ? layout.ascii_size : layout.compact_size);
  size_t n = 0;
  for (int64_t i = 0; i < length; ++i) {
    uint32_t c = kind == 1 ? data[i] : kind == 2 ? load<uint16_t>(data, 2 * i) : load<uint32_t>(data, 4 * i);
    char buf[4];
    size_t len;
    if (c < 0x80) {
      buf[0] = static_cast<char>(c);
      len = 1;
    } else if (c < 0x800) {
      buf[0] = static_cast<char>(0xc0 | (c >> 6));
      buf[1] = static_cast<char>(0x80 | (c & 0x3f));
      len = 2;
    } else if (c < 0x10000) {
      buf[0] = static_cast<char>(0xe0 | (c >> 12));
      buf[1] = static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      buf[2] = static_cast<char>(0x80 | (c & 0x3f));
      len = 3;
    } else {
      buf[0] = static_cast<char>(0xf0 | (c >> 18));
      buf[1] = static_cast<char>(0x80 | ((c >> 12) & 0x3f));
      buf[2] = static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      buf[3] = static_cast<char>(0x80 | (c & 0x3f));
      len = 4;
    }
    if (n + len > capacity) break;
    if (out != nullptr) memcpy(out + n, buf, len);
    n += len;
  }
  return n;
}

constexpr uint32_t kMaxName = 4096;
constexpr uint32_t kMaxTable = 1u << 20;

struct EntryHeader {
  uint32_t first_line;
  uint32_t filename_len;
  uint32_t qualname_len;
  uint32_t table_len;
};

}  // namespace

bool PythonFrames::init() {
  if (slots_ != nullptr) return true;
  auto reserve = [](size_t bytes) -> void* {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  };
  slots_ = static_cast<Slot*>(reserve(sizeof(Slot) * kSlots));
  names_ = static_cast<CodeNames*>(reserve(sizeof(CodeNames) * (kMaxCodes + 1)));
  offsets_ = static_cast<std::atomic<uint64_t>*>(reserve(sizeof(std::atomic<uint64_t>) * (kMaxCodes + 1)));
  arena_ = static_cast<uint8_t*>(reserve(kArenaBytes));
  return slots_ != nullptr && names_ != nullptr && offsets_ != nullptr && arena_ != nullptr;
}

void PythonFrames::set_unsupported(const char* version, const char* module, const char* why) {
  snprintf(version_, sizeof version_, "%s", version);
  snprintf(module_, sizeof module_, "%s", module);
  snprintf(note_, sizeof note_, "%s", why);
  status_.store(Status::kUnsupported, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
}

bool PythonFrames::detect() {
  if (off_ || status() != Status::kNone || slots_ == nullptr) return false;
  ObjectScan scan;
  dl_iterate_phdr(scan_objects, &scan);
  char exe[512] = {};
  ssize_t m = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (m < 0) m = 0;
  exe[m] = '\0';

  if (scan.pypy[0] != '\0' || find_symbol(RTLD_DEFAULT, "rpython_startup_code") != nullptr) {
    set_unsupported("", scan.pypy[0] ? scan.pypy : exe,
                    "Python frames are not recorded: PyPy is not supported (CPython 3.9 to 3.13 is); "
                    "stacks are native only");
    return true;
  }

  // The interpreter is in the executable or in a libpython it loaded, maybe
  // with RTLD_LOCAL (an embedding program): look there too.
  void* handle = RTLD_DEFAULT;
  void* get_state = find_symbol(handle, "PyGILState_GetThisThreadState");
  if (get_state == nullptr && scan.python[0] != '\0') {
    handle = dlopen(scan.python, RTLD_LAZY | RTLD_NOLOAD);
    if (handle != nullptr) get_state = find_symbol(handle, "PyGILState_GetThisThreadState");
  }
  void* get_version = find_symbol(handle, "Py_GetVersion");
  if (get_state == nullptr || get_version == nullptr) return false;  // no Python here (yet)

  // The object that holds the interpreter, named as the module map names it.
  const char* module = exe;
  Dl_info info;
  char resolved[PATH_MAX];
  if (dladdr(get_state, &info) != 0 && info.dli_fname != nullptr && info.dli_fname[0] != '\0' &&
      realpath(info.dli_fname, resolved) != nullptr && strcmp(resolved, exe) != 0) {
    module = resolved;
  }
  // Py_GetVersion() formats a static buffer: "3.11.2 (main, ...)".
  char version[64] = {};
  const char* text = reinterpret_cast<const char* (*)()>(get_version)();
  if (text != nullptr) {
    size_t n = strcspn(text, " ");
    if (n >= sizeof version) n = sizeof version - 1;
    memcpy(version, text, n);
  }
  unsigned major = 0, minor = 0;
  sscanf(version, "%u.%u", &major, &minor);
  char why[256];
  if (text != nullptr && strstr(text, "free-threading") != nullptr) {
    snprintf(why, sizeof why,
             "Python frames are not recorded: free-threaded CPython %s is not supported; stacks are native only",
             version);
    set_unsupported(version, module, why);
    return true;
  }
  const Layout* known = nullptr;
  if (major == 3) {
    for (const Layout& l : kLayouts) {
      if (l.minor == minor) known = &l;
    }
  }
  if (known == nullptr) {
    snprintf(why, sizeof why,
             "Python frames are not recorded: CPython %s is not supported (3.9 to 3.13 are); stacks are native only",
             version[0] ? version : "of an unknown version");
    set_unsupported(version, module, why);
    return true;
  }
  Layout layout = *known;
  layout.this_thread_state = reinterpret_cast<void* (*)()>(get_state);
  void* finalizing = find_symbol(handle, minor >= 13 ? "Py_IsFinalizing" : "_Py_IsFinalizing");
  layout.is_finalizing = reinterpret_cast<int (*)()>(finalizing);
  layout.main_interpreter = reinterpret_cast<void* (*)()>(find_symbol(handle, "PyInterpreterState_Main"));
  layout.thread_head = reinterpret_cast<void* (*)(void*)>(find_symbol(handle, "PyInterpreterState_ThreadHead"));
  layout.code_type = find_symbol(handle, "PyCode_Type");
  layout.unicode_type = find_symbol(handle, "PyUnicode_Type");
  layout.bytes_type = find_symbol(handle, "PyBytes_Type");
  if (layout.code_type == nullptr || layout.unicode_type == nullptr || layout.bytes_type == nullptr) {
    snprintf(why, sizeof why,
             "Python frames are not recorded: CPython %s does not export its type objects; stacks are native only",
             version);
    set_unsupported(version, module, why);
    return true;
  }
  if (minor == 13) {
    // The interpreter describes itself: prefer its offsets to the table.
    const auto* runtime = static_cast<const uint8_t*>(find_symbol(handle, "_PyRuntime"));
    if (runtime != nullptr && memcmp(runtime, debug13::kCookie, sizeof debug13::kCookie) == 0) {
      if (load<uint64_t>(runtime, debug13::kFreeThreaded) != 0) {
        snprintf(why, sizeof why,
                 "Python frames are not recorded: free-threaded CPython %s is not supported; stacks are native only",
                 version);
        set_unsupported(version, module, why);
        return true;
      }
      if ((load<uint64_t>(runtime, debug13::kVersion) >> 16) == 0x030d) {
        layout.tstate_frame = static_cast<uint32_t>(load<uint64_t>(runtime, debug13::kThreadCurrentFrame));
        layout.frame_previous = static_cast<uint32_t>(load<uint64_t>(runtime, debug13::kFramePrevious));
        layout.frame_code = static_cast<uint32_t>(load<uint64_t>(runtime, debug13::kFrameExecutable));
        layout.frame_instr = static_cast<uint32_t>(load<uint64_t>(runtime, debug13::kFrameInstrPtr));
        layout.frame_owner = static_cast<uint32_t>(load<uint64_t>(runtime, debug13::kFrameOwner));
        layout.code_filename = static_cast<uint32_t>(load<uint64_t>(runtime, debug13::kCodeFilename));
        layout.code_name = static_cast<uint32_t>(load<uint64_t>(runtime, debug13::kCodeQualname));
        layout.code_table = static_cast<uint32_t>(load<uint64_t>(runtime, debug13::kCodeLinetable));
        layout.code_first_line = static_cast<uint32_t>(load<uint64_t>(runtime, debug13::kCodeFirstLineno));
        layout.code_instructions = static_cast<uint32_t>(load<uint64_t>(runtime, debug13::kCodeAdaptive));
        layout.ascii_size = static_cast<uint32_t>(load<uint64_t>(runtime, debug13::kUnicodeAsciiSize));
        (void)debug13::kUnicodeState;
      }
    }
  }
  g_layout = layout;
  snprintf(version_, sizeof version_, "%s", version);
  snprintf(module_, sizeof module_, "%s", module);
  note_[0] = '\0';
  table_format_ = static_cast<uint8_t>(layout.table_format);
  layout_.store(&g_layout, std::memory_order_release);
  status_.store(Status::kActive, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  return true;
}

uint32_t PythonFrames::capture_with(const Layout& layout, uintptr_t* out, uint32_t max, CodeCache* cache) {
  if (tls_walk_fault != nullptr) return 0;
  CodeCache* const own = cache != nullptr && cache->busy == 0 ? cache : nullptr;
  // The frames are read under a fault guard: python_frames_recover() brings
  // a read of memory freed under the walk back here, with no frames. The
  // signal mask is restored by the handler, so sigsetjmp saves none (no
  // system call on this path). A thread that blocks the fault signals has
  // them unblocked for the walk (two system calls, in those threads only;
  // made directly, as memledger's own pthread_sigmask would forget what
  // this thread blocks).
  if (tls_faults_blocked < 0) {
    sigset_t current;
    set_thread_mask(SIG_BLOCK, nullptr, &current);
    tls_faults_blocked = (sigismember(&current, SIGSEGV) == 1 || sigismember(&current, SIGBUS) == 1) ? 1 : 0;
  }
  const bool unblock = tls_faults_blocked == 1;
  sigset_t saved;
  if (unblock) {
    sigset_t faults;
    sigemptyset(&faults);
    sigaddset(&faults, SIGSEGV);
    sigaddset(&faults, SIGBUS);
    set_thread_mask(SIG_UNBLOCK, &faults, &saved);
  }
  sigjmp_buf guard;
  if (own != nullptr) own->busy = 1;
  if (sigsetjmp(guard, 0) != 0) {
    tls_walk_fault = nullptr;
    if (own != nullptr) own->busy = 0;
    if (unblock) set_thread_mask(SIG_SETMASK, &saved, nullptr);
    return 0;
  }
  tls_walk_fault = &guard;
  const uint32_t n = walk(layout, out, max, own);
  tls_walk_fault = nullptr;
  if (own != nullptr) own->busy = 0;
  if (unblock) set_thread_mask(SIG_SETMASK, &saved, nullptr);
  return n;
}

namespace {

// The thread state of the interpreter's main thread: the oldest in the main
// interpreter's list (states are added at its head; after fork() the forking
// thread's is the only one left). Null if the functions are not exported.
const uint8_t* main_thread_state(const Layout& l) {
  if (l.main_interpreter == nullptr || l.thread_head == nullptr) return nullptr;
  void* interp = l.main_interpreter();
  if (!plausible(static_cast<const uint8_t*>(interp))) return nullptr;
  // The list changes under the walk (threads start and end without this
  // thread knowing): each `next` (PyThreadState's second field, 3.9 to
  // 3.13) is read here, under the fault guard, not by PyThreadState_Next.
  const uint8_t* last = nullptr;
  const auto* t = static_cast<const uint8_t*>(l.thread_head(interp));
  for (int n = 0; n < 4096 && plausible(t); ++n) {
    last = t;
    t = load_ptr(t, sizeof(void*));
  }
  return last;
}

}  // namespace

// A slot's fields are written only after every read of interpreter memory
// (a fault in one leaves the slot as it was), by the thread that owns the
// cache, while no other walk on that thread uses it (CodeCache::busy).
inline uint32_t PythonFrames::intern_cached(const uint8_t* code, CodeCache& cache) {
  const CodeNames names = names_of(code);
  const auto key = reinterpret_cast<uint64_t>(code);
  CodeCache::Slot& slot = cache.slots[((key >> 4) ^ (key >> 12)) & (CodeCache::kSlots - 1)];
  if (slot.code == key && slot.names == names) return slot.id;
  const uint32_t id = intern(code, names);
  if (id != 0) slot = {key, names, id};
  return id;
}

void PythonFrames::CodeCache::clear() {
  memset(slots, 0, sizeof slots);
  busy = 0;
}

uint32_t PythonFrames::walk(const Layout& l, uintptr_t* out, uint32_t max, CodeCache* cache) {
  // During finalization other threads' states are being freed.
  if (l.is_finalizing != nullptr && l.is_finalizing()) return 0;
  // This thread's state, attached or not: NULL for threads that never ran
  // Python (autograd, XLA and TensorFlow workers, data loader internals,
  // the program before start-up). Those get the frames of the main thread,
  // marked as attributed: the work they do was most likely asked for by the
  // Python call the main thread is in. The main thread may be running while
  // it is read: a torn read costs this stack wrong or missing frames (shown
  // as attributed, never as the thread's own), and a read of freed memory
  // is caught by the fault guard.
  const auto* tstate = static_cast<const uint8_t*>(l.this_thread_state());
  uint64_t attributed = 0;
  if (tstate == nullptr && attribute_) {
    tstate = main_thread_state(l);
    attributed = format::kPythonAttributedBit;
  }
  if (!plausible(tstate)) return 0;
  const uint8_t* frame = load_ptr(tstate, l.tstate_frame);
  if (l.chain == Chain::kCFrame) {
    if (!plausible(frame)) return 0;
    frame = load_ptr(frame, l.cframe_current);
  }
  uint32_t n = 0;
  for (uint32_t walked = 0; n < max && walked < 4096 && plausible(frame);
       ++walked, frame = load_ptr(frame, l.frame_previous)) {
    if (l.frame_owner != 0 && load<uint8_t>(frame, l.frame_owner) == kFrameOwnedByCStack) continue;
    const uint8_t* code = load_ptr(frame, l.frame_code);
    if (!plausible(code) || load_ptr(code, 8) != l.code_type) continue;
    int64_t offset;
    if (l.chain == Chain::kFrameObjects) {
      const int lasti = load<int>(frame, l.frame_instr);
      offset = l.lasti_in_units ? int64_t{lasti} * 2 : lasti;
    } else {
      offset = load_ptr(frame, l.frame_instr) - (code + l.code_instructions);
    }
    const uint32_t id = cache != nullptr ? intern_cached(code, *cache) : intern(code, names_of(code));
    if (id == 0) continue;
    const uint32_t off = offset >= 0 && offset < INT32_MAX ? static_cast<uint32_t>(offset) : format::kPythonOffsetUnknown;
    out[n++] = static_cast<uintptr_t>(format::python_frame_word(id, off) | attributed);
  }
  return n;
}

PythonFrames::CodeNames PythonFrames::names_of(const uint8_t* code) {
  const Layout& l = g_layout;
  return {reinterpret_cast<uint64_t>(load_ptr(code, l.code_filename)),
          reinterpret_cast<uint64_t>(load_ptr(code, l.code_name)),
          reinterpret_cast<uint64_t>(load_ptr(code, l.code_table)), load<uint32_t>(code, l.code_first_line)};
}

// A code object is known by its address and by the objects it names: an
// address reused by another code object gets an entry of its own.
uint32_t PythonFrames::intern(const uint8_t* code, const CodeNames& names) {
  const uint64_t key = reinterpret_cast<uint64_t>(code);
  uint32_t index = slot_of(key);
  for (uint32_t probe = 0; probe < kSlots; ++probe, index = (index + 1) & (kSlots - 1)) {
    Slot& slot = slots_[index];
    uint64_t seen = slot.code.load(std::memory_order_acquire);
    if (seen == 0) {
      if (slot.code.compare_exchange_strong(seen, key, std::memory_order_acq_rel)) {
        const uint32_t id = publish(names);
        if (id != 0) names_[id] = names;
        slot.id.store(id == 0 ? UINT32_MAX : id, std::memory_order_release);
        return id;
      }
    }
    if (seen != key) continue;
    uint32_t id = slot.id.load(std::memory_order_acquire);
    for (int spin = 0; id == 0 && spin < 1000; ++spin) {
      sched_yield();
      id = slot.id.load(std::memory_order_acquire);
    }
    if (id == 0) {
      // Its owner never finished: a thread lost in fork(). Skip it from now on.
      uint32_t expected = 0;
      slot.id.compare_exchange_strong(expected, UINT32_MAX, std::memory_order_acq_rel);
      continue;
    }
    if (id == UINT32_MAX) continue;
    if (names_[id] == names) return id;
  }
  return 0;
}

uint32_t PythonFrames::publish(const CodeNames& names) {
  const Layout& l = g_layout;
  const uint32_t id = next_id_.fetch_add(1, std::memory_order_acq_rel);
  if (id > kMaxCodes) return 0;
  uint32_t table_len = 0;
  const auto* bytes = reinterpret_cast<const uint8_t*>(names.table);
  if (plausible(bytes) && load_ptr(bytes, 8) == l.bytes_type) {
    const int64_t size = load<int64_t>(bytes, 16);
    if (size > 0 && size <= kMaxTable) table_len = static_cast<uint32_t>(size);
  }
  const auto* filename_str = reinterpret_cast<const uint8_t*>(names.filename);
  const auto* name_str = reinterpret_cast<const uint8_t*>(names.name);
  const size_t filename_len = copy_unicode(l, filename_str, nullptr, kMaxName);
  const size_t name_len = copy_unicode(l, name_str, nullptr, kMaxName);
  const size_t bytes_needed = sizeof(EntryHeader) + filename_len + name_len + table_len;
  const size_t off = arena_used_.fetch_add((bytes_needed + 7) & ~size_t{7}, std::memory_order_relaxed);
  if (off + bytes_needed > kArenaBytes) return 0;
  uint8_t* p = arena_ + off;
  EntryHeader h{};
  h.first_line = names.first_line;
  char* text = reinterpret_cast<char*>(p + sizeof h);
  h.filename_len = static_cast<uint32_t>(copy_unicode(l, filename_str, text, filename_len));
  h.qualname_len = static_cast<uint32_t>(copy_unicode(l, name_str, text + h.filename_len, name_len));
  h.table_len = table_len;
  if (table_len != 0) copy_foreign(reinterpret_cast<uint8_t*>(text + h.filename_len + h.qualname_len), bytes + 32, table_len);
  memcpy(p, &h, sizeof h);
  offsets_[id].store(off + 1, std::memory_order_release);
  return id;
}

bool PythonFrames::code(uint32_t id, PythonCodeView* view) const {
  if (id == 0 || id > kMaxCodes || offsets_ == nullptr) return false;
  const uint64_t off = offsets_[id].load(std::memory_order_acquire);
  if (off == 0) return false;
  const uint8_t* p = arena_ + (off - 1);
  EntryHeader h;
  memcpy(&h, p, sizeof h);
  const char* text = reinterpret_cast<const char*>(p + sizeof h);
  view->first_line = h.first_line;
  view->filename = text;
  view->filename_len = h.filename_len;
  view->qualname = text + h.filename_len;
  view->qualname_len = h.qualname_len;
  view->line_table = reinterpret_cast<const uint8_t*>(text + h.filename_len + h.qualname_len);
  view->line_table_len = h.table_len;
  return true;
}

// Trivially destructible: hooks run until the very end of the process.
constinit PythonFrames g_python_frames;

void python_frames_mask_changed() { tls_faults_blocked = -1; }

bool python_frames_recover(void* ucontext) {
  sigjmp_buf* guard = tls_walk_fault;
  if (guard == nullptr || ucontext == nullptr) return false;
  // Only a fault of memledger's own code: not, say, one in a handler of the
  // program's that interrupted the walk.
  const auto* uc = static_cast<ucontext_t*>(ucontext);
  const auto pc = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
  if (pc < recorder().self_begin() || pc >= recorder().self_end()) return false;
  tls_walk_fault = nullptr;
  // Back to the mask of the interrupted code (the kernel blocked the signal
  // for the handler), then out of the handler into capture(). By the
  // system call: the mask is memledger's to put back, not a change of the
  // program's that memledger's own sigprocmask would take it for.
  set_thread_mask(SIG_SETMASK, &uc->uc_sigmask, nullptr);
  siglongjmp(*guard, 1);
}

}  // namespace memledger::interposer
