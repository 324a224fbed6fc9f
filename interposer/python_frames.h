// Python frames in every stack: when the process runs CPython (3.9 to 3.13),
// each captured stack starts with the calling thread's Python frames,
// innermost first, followed by the native frames.
//
// The hot path reads the thread's frame chain directly from memory, as
// py-spy and austin do from outside the process, with field offsets chosen
// at run time for the interpreter found (3.13 publishes them itself in
// _Py_DebugOffsets; older versions use tables taken from their headers). It
// never calls into the interpreter except PyGILState_GetThisThreadState()
// and _Py_IsFinalizing(), two lock-free reads; it works whether or not the
// thread holds the GIL (PyTorch releases it around every operator), because
// a thread's frame chain only changes on that thread. The walk runs under a
// fault guard (python_frames_recover): memory freed under it, as a
// finalizing interpreter frees daemon threads' states, costs that stack its
// Python frames, never the program.
//
// A code object seen for the first time is copied (file name, qualified
// name, first line, line table) into an interned table by the thread that
// runs it, while the object is certainly alive; the writer emits the copy
// as a kPythonCode record. Line numbers are computed offline by the report
// from the line table and the recorded instruction offset.
#pragma once

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>

namespace memledger::interposer {

// One interned code object, as the writer reads it.
struct PythonCodeView {
  const char* filename;
  uint32_t filename_len;
  const char* qualname;
  uint32_t qualname_len;
  const uint8_t* line_table;
  uint32_t line_table_len;
  uint32_t first_line;
};

class PythonFrames {
 public:
  static constexpr uint32_t kMaxCodes = 1u << 18;
  static constexpr uint32_t kMaxFrames = 128;

  enum class Status : uint8_t {
    kNone = 0,         // no Python interpreter in the process (yet)
    kActive = 1,       // a supported CPython: Python frames are recorded
    kUnsupported = 2,  // an interpreter this version does not read: native stacks only
  };

  // Maps the code table. False if the kernel refused the memory.
  bool init();
  // Looks for a Python interpreter in the process (start-up, and when the
  // set of loaded objects changes). Not for the hot path. Returns true when
  // the status changed.
  bool detect();
  // MEMLEDGER_PYTHON_FRAMES=0: never look for an interpreter.
  void turn_off() { off_ = true; }
  // MEMLEDGER_PYTHON_ATTRIBUTE=0: threads that never ran Python get no
  // attributed frames (see capture()).
  void no_attribution() { attribute_ = false; }

  // What tells code objects at one address apart: the objects a code
  // object names (file name, qualified name, line table) and its first line.
  struct CodeNames {
    uint64_t filename;
    uint64_t name;
    uint64_t table;
    uint32_t first_line;
    bool operator==(const CodeNames&) const = default;
  };
  struct CodeCache;

  // Hot path: writes the calling thread's Python frames, innermost first,
  // as tagged stack words (format::python_frame_word) into `out`; returns
  // how many. A thread that never ran Python gets the main thread's frames,
  // marked with format::kPythonAttributedBit. No allocation, no lock, no call into the interpreter beyond
  // the two reads named above.
  // `cache`: the calling thread's (CodeCache), or nullptr.
  uint32_t capture(uintptr_t* out, uint32_t max, CodeCache* cache = nullptr) {
    const Layout* layout = layout_.load(std::memory_order_acquire);
    return layout == nullptr ? 0 : capture_with(*layout, out, max, cache);
  }

  // A thread's code objects seen lately, each with what intern() compares
  // (the objects it names, its first line) and its id, in a slot by its
  // address: a frame whose code object is there, the same by those
  // compares, costs no look-up in the table all threads share (2^19
  // slots, touched at random). An `import torch` makes a million stacks of some
  // 18 Python frames each, mostly of the same few hundred code objects.
  // Owned by one thread at a time; mapped memory (ThreadRing).
  struct CodeCache {
    static constexpr uint32_t kSlots = 256;
    struct Slot {
      uint64_t code;  // 0: empty
      CodeNames names;
      uint32_t id;
    };
    // Set while a walk uses it: a signal handler that walks on the same
    // thread in the middle of that goes without.
    volatile uint32_t busy;
    Slot slots[kSlots];
    // Forgets everything (a fork child's ring whose thread did not come
    // along may hold a half-written slot).
    void clear();
  };

  // Writer side: ids are 1..code_count(); false while `id` is being written.
  uint32_t code_count() const { return next_id_.load(std::memory_order_acquire) - 1; }
  bool code(uint32_t id, PythonCodeView* view) const;

  Status status() const { return status_.load(std::memory_order_acquire); }
  // Bumped at every status change, for the writer to record it.
  uint32_t generation() const { return generation_.load(std::memory_order_acquire); }
  const char* version() const { return version_; }      // "3.11.2"
  const char* module() const { return module_; }        // the object that holds the interpreter
  const char* note() const { return note_; }            // why frames are not recorded
  uint8_t line_table_format() const { return table_format_; }
  // The interned table's slots (Slot, below), and the first one a code
  // object at `code` looks at: a 64 KiB stretch of the heap gets a page of
  // slots (256), hashed, and a code object the slot of its 256 bytes in it;
  // one that finds its slot taken (a neighbour, or a stretch whose hash is
  // the same) takes the next.
  static constexpr uint32_t kSlots = kMaxCodes * 2;
  static uint32_t slot_of(uint64_t code) {
    uint64_t h = (code >> 16) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    return static_cast<uint32_t>(h << 8 | (code >> 8 & 0xff)) & (kSlots - 1);
  }

  struct Layout;

 private:
  uint32_t walk(const Layout& layout, uintptr_t* out, uint32_t max, CodeCache* cache);
  static CodeNames names_of(const uint8_t* code);
  uint32_t intern(const uint8_t* code, const CodeNames& names);
  // intern() through the thread's cache.
  uint32_t intern_cached(const uint8_t* code, CodeCache& cache);
  uint32_t publish(const CodeNames& names);
  void set_unsupported(const char* version, const char* module, const char* why);

  // The interned table: a code object's address and its id, 16 bytes, in
  // a slot near those of the code objects near it (slot_of), so that the
  // pages of the table a program touches are about as many as the 64 KiB
  // stretches of its heap that hold code objects it ran, not one a code
  // object: hashed over the whole table, with the names in the slot (48
  // bytes), the 2,700 code objects of a PyTorch training script touched
  // 9.5 MiB of it. What an id names is in names_ (by id).
  struct Slot {
    std::atomic<uint64_t> code;  // 0 = empty
    std::atomic<uint32_t> id;    // 0 until published, UINT32_MAX = abandoned
    uint32_t unused;
  };
  static_assert(sizeof(Slot) == 16);
  // capture() once an interpreter's layout is known.
  uint32_t capture_with(const Layout& layout, uintptr_t* out, uint32_t max, CodeCache* cache);

  static constexpr size_t kArenaBytes = size_t{256} << 20;

  bool off_ = false;
  bool attribute_ = true;
  std::atomic<const Layout*> layout_{nullptr};
  std::atomic<Status> status_{Status::kNone};
  std::atomic<uint32_t> generation_{0};
  uint8_t table_format_ = 0;
  char version_[64] = {};
  char module_[PATH_MAX] = {};
  char note_[256] = {};

  Slot* slots_ = nullptr;
  CodeNames* names_ = nullptr;  // by id
  std::atomic<uint64_t>* offsets_ = nullptr;  // by id: arena offset + 1
  uint8_t* arena_ = nullptr;
  std::atomic<size_t> arena_used_{0};
  std::atomic<uint32_t> next_id_{1};
};

extern PythonFrames g_python_frames;
inline PythonFrames& python_frames() { return g_python_frames; }

// Called first by memledger's SIGSEGV/SIGBUS handler: when the fault is a
// read of the Python frame walk (memory freed under it, e.g. by a
// finalizing interpreter), abandons the walk and does not return; else
// returns false and the signal is handled as a crash.
bool python_frames_recover(void* ucontext);

// The calling thread's signal mask changed: the walk asks anew whether it
// blocks the fault signals.
void python_frames_mask_changed();

}  // namespace memledger::interposer
