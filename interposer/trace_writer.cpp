#include "trace_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <linux/futex.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <string>
#include <string_view>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <vector>
#include <libdeflate.h>
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_createCCtx_advanced: zstd allocates through __libc_malloc
#include <zstd.h>

#include "held_reading.h"
#include "host_records.h"
#include "internal_alloc.h"
#include "next_allocator.h"
#include "pressure_sampler.h"
#include "python_frames.h"
#include "small_file.h"
#include "ring_merge.h"
#include "spin_lock.h"
#include "recorder.h"
#include "trace_encoding.h"
#include "trace_format.h"
#include "unwinder.h"
#include "wait_budget.h"

namespace memledger::interposer {
namespace {

using Bytes = std::vector<uint8_t, InternalAllocator<uint8_t>>;
using String = std::basic_string<char, std::char_traits<char>, InternalAllocator<char>>;
template <typename T>
using Vector = std::vector<T, InternalAllocator<T>>;

constexpr uint64_t kFlushEveryNs = 50'000'000;    // well inside the promised 100 ms
constexpr uint64_t kSampleEveryNs = 100'000'000;
// Pressure at step ends: at most one per kPressureMinGapNs (tight loops end
// steps far more often), /proc/vmstat at most once per kSampleEveryNs.
constexpr uint64_t kPressureMinGapNs = 50'000'000;
constexpr uint64_t kStatusEveryNs = 250'000'000;
// Raw bytes in a frame: compressing one takes the writer well under a
// millisecond, in which one thread allocating without pause fills less than
// its hold-back mark (Recorder::push).
constexpr size_t kFrameTarget = 256u << 10;

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

bool write_all(int fd, const void* data, size_t size, int* err) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return false;
    }
    if (n == 0) {
      *err = ENOSPC;
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

uint64_t parse_u64(const char* s) {
  uint64_t v = 0;
  while (*s >= '0' && *s <= '9') v = v * 10 + static_cast<uint64_t>(*s++ - '0');
  return v;
}

struct ModuleRecord {
  uint64_t base;
  String path;
  String build_id;
  Vector<std::pair<uint64_t, uint64_t>> segments;
};

String build_id_of(const dl_phdr_info* info) {
  static const char kHex[] = "0123456789abcdef";
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const uint8_t* p = reinterpret_cast<const uint8_t*>(info->dlpi_addr + ph.p_vaddr);
    const uint8_t* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const ElfW(Nhdr)* note = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const uint8_t* name = p + sizeof(ElfW(Nhdr));
      const uint8_t* desc = name + ((note->n_namesz + 3) & ~3u);
      const uint8_t* next = desc + ((note->n_descsz + 3) & ~3u);
      if (next > end) break;
      if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 && memcmp(name, "GNU", 4) == 0) {
        String hex;
        for (uint32_t k = 0; k < note->n_descsz; ++k) {
          hex.push_back(kHex[desc[k] >> 4]);
          hex.push_back(kHex[desc[k] & 15]);
        }
        return hex;
      }
      p = next;
    }
  }
  return {};
}

// A growable byte buffer over the real allocator, written through raw
// pointers (the encoder is the writer's hot loop).
class ByteBuffer {
 public:
  ~ByteBuffer() { __libc_free(data_); }
  uint8_t* data() { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void clear() { size_ = 0; }
  uint8_t* reserve(size_t n) {
    if (size_ + n > capacity_) {
      size_t capacity = capacity_ ? capacity_ * 2 : 64 * 1024;
      while (capacity < size_ + n) capacity *= 2;
      void* p = __libc_realloc(data_, capacity);
      if (p == nullptr) throw std::bad_alloc();
      data_ = static_cast<uint8_t*>(p);
      capacity_ = capacity;
    }
    return data_ + size_;
  }
  void commit(size_t n) { size_ += n; }
  void shrink(size_t limit) {
    if (capacity_ > limit) {
      __libc_free(data_);
      data_ = nullptr;
      size_ = capacity_ = 0;
    }
  }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

// Encodes records into a frame's payload. Sequence numbers, timestamps and
// addresses of events are written as deltas from the previous event in the
// same frame (trace_format.h), so each frame decodes on its own.
class Encoder {
 public:
  explicit Encoder(ByteBuffer& out) : out_(out) {}
  void tag(format::Tag t) {
    *out_.reserve(1) = static_cast<uint8_t>(t);
    out_.commit(1);
  }
  void u(uint64_t v) { out_.commit(format::put_varint(out_.reserve(10), v)); }
  void s(int64_t v) { u(format::zigzag(v)); }
  // The exact host counters of a kStep or kHostTotals event (Recorder::read_host_totals).
  void host_totals(const Event& e) {
    s(static_cast<int64_t>(e.addr));
    u(e.weight >> 32);
    u(e.weight & 0xffffffffu);
  }
  // A kHostTotals event: as kHostTotalsDelta after another one in the frame.
  void host_totals_record(const Event& e, uint64_t ts) {
    const uint32_t allocs = static_cast<uint32_t>(e.weight >> 32);
    const uint32_t frees = static_cast<uint32_t>(e.weight);
    if (have_totals_) {
      tag(format::Tag::kHostTotalsDelta);
      seq_ts(e.seq, ts);
      s(static_cast<int64_t>(e.addr - prev_live_));
      u(static_cast<uint32_t>(allocs - prev_allocs_));
      u(static_cast<uint32_t>(frees - prev_frees_));
    } else {
      tag(format::Tag::kHostTotals);
      seq_ts(e.seq, ts);
      host_totals(e);
    }
    have_totals_ = true;
    prev_live_ = e.addr;
    prev_allocs_ = allocs;
    prev_frees_ = frees;
  }
  void str(const char* data, size_t size) {
    u(size);
    memcpy(out_.reserve(size), data, size);
    out_.commit(size);
  }
  void str(const char* text) { str(text, strlen(text)); }
  void seq_ts(uint64_t seq, uint64_t ts) {
    s(static_cast<int64_t>(seq - d_.seq));
    s(static_cast<int64_t>(ts - d_.ts));
    d_.seq = seq;
    d_.ts = ts;
  }
  void addr(uint64_t a) {
    s(static_cast<int64_t>(a - d_.addr));
    d_.addr = a;
  }
  // The frame's deltas, for encode_host_records().
  FrameDeltas& deltas() { return d_; }
  void new_frame() {
    d_ = FrameDeltas{};
    have_totals_ = false;
    last_depth_ = last_python_ = 0;
  }
  // Where the caller puts the frames of the next stack_record() (room for
  // StackTable::kMaxDepth): the two stacks take turns in two buffers.
  uintptr_t* next_stack() { return stacks_[1 - last_]; }
  // A record of the stack of `depth` frames put at next_stack():
  // kStackShared where the outermost frames of its Python part or of its
  // native part are those of the frame's last stack record's (as many as
  // kStackShareRatio frames for each byte of the record allows), else kStack.
  void stack_record(uint32_t id, uint32_t depth) {
    const uintptr_t* frames = stacks_[1 - last_];
    const uintptr_t* last_frames = stacks_[last_];
    uint32_t python = 0;
    while (python < depth && format::is_python_frame(frames[python])) ++python;
    const uint32_t python_most = python < last_python_ ? python : last_python_;
    const uint32_t native_most = depth - python < last_depth_ - last_python_ ? depth - python : last_depth_ - last_python_;
    uint32_t python_shared =
        python_most == 0 ? 0 : shared_outer_frames(frames + python - 1, last_frames + last_python_ - 1, python_most);
    uint32_t native_shared =
        native_most == 0 ? 0 : shared_outer_frames(frames + depth - 1, last_frames + last_depth_ - 1, native_most);
    uint8_t* const start = begin(1 + 5 * 10 + depth * 10);
    uint8_t* p = shared_stack(start, id, frames, depth, python, python_shared, native_shared);
    // Too few bytes of its own for what it shares: share as many as those
    // allow, native frames first (fewer shared frames make the record
    // longer, never shorter).
    const uint64_t allowed = format::kStackShareRatio * static_cast<uint64_t>(p - start);
    if (python_shared + native_shared > allowed) {
      if (native_shared > allowed) native_shared = static_cast<uint32_t>(allowed);
      if (python_shared > allowed - native_shared) python_shared = static_cast<uint32_t>(allowed - native_shared);
      p = shared_stack(start, id, frames, depth, python, python_shared, native_shared);
    }
    end(p);
    last_ = 1 - last_;
    last_depth_ = depth;
    last_python_ = python;
  }

  // The hot records (kAlloc, kFree), written through one pointer into room
  // reserved once per record: the writer spent more time in per-field
  // bounds checks than in the varints themselves.
  static constexpr size_t kMaxEventRecord = 1 + 10 * 10;
  uint8_t* begin(size_t max) { return out_.reserve(max); }
  void end(uint8_t* p) { out_.commit(static_cast<size_t>(p - out_.data() - out_.size())); }
  static uint8_t* put(uint8_t* p, uint64_t v) { return put_varint_at(p, v); }
  static uint8_t* put_signed(uint8_t* p, int64_t v) { return put_signed_at(p, v); }
  // A stack record at `p`: kStackShared sharing those frames of each part,
  // kStack where it shares none.
  static uint8_t* shared_stack(uint8_t* p, uint32_t id, const uintptr_t* frames, uint32_t depth, uint32_t python,
                               uint32_t python_shared, uint32_t native_shared) {
    const bool shares = python_shared + native_shared > 0;
    *p++ = static_cast<uint8_t>(shares ? format::Tag::kStackShared : format::Tag::kStack);
    p = put(p, id);
    p = put(p, depth);
    if (shares) {
      p = put(p, python);
      p = put(p, python_shared);
      p = put(p, native_shared);
    }
    uint64_t prev = 0;
    auto own = [&](uint32_t from, uint32_t to) {
      for (uint32_t i = from; i < to; ++i) {
        p = put_signed(p, static_cast<int64_t>(frames[i] - prev));
        prev = frames[i];
      }
    };
    own(0, python - python_shared);
    own(python, depth - native_shared);
    return p;
  }
  uint8_t* put_seq_ts(uint8_t* p, uint64_t seq, uint64_t ts) {
    p = put_signed(p, static_cast<int64_t>(seq - d_.seq));
    p = put_signed(p, static_cast<int64_t>(ts - d_.ts));
    d_.seq = seq;
    d_.ts = ts;
    return p;
  }
  uint8_t* put_addr(uint8_t* p, uint64_t a) {
    p = put_signed(p, static_cast<int64_t>(a - d_.addr));
    d_.addr = a;
    return p;
  }

 private:
  ByteBuffer& out_;
  FrameDeltas d_;
  // The last kHostTotals or kHostTotalsDelta record of the frame.
  bool have_totals_ = false;
  uint64_t prev_live_ = 0;
  uint32_t prev_allocs_ = 0;
  uint32_t prev_frees_ = 0;
  // The frames of the frame's last stack record (stacks_[last_], innermost
  // first, last_depth_ of them, the first last_python_ its Python part; none
  // at a frame's start) and of the next.
  uintptr_t stacks_[2][StackTable::kMaxDepth];
  uint32_t last_ = 0;
  uint32_t last_depth_ = 0;
  uint32_t last_python_ = 0;
};

// The lowest descriptor the tracer's files may take: above the 3..1023 that
// programs close, where the descriptor limit leaves room (a soft limit of
// 1024 gives 960: the check before each write covers what is closed there).
int high_fd_floor() {
  constexpr rlim_t kPreferred = 1280;
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 3;
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= kPreferred + 64) return static_cast<int>(kPreferred);
  return rl.rlim_cur > 67 ? static_cast<int>(rl.rlim_cur - 64) : 3;
}

}  // namespace

int move_fd_high(int fd) {
  static const int floor = high_fd_floor();
  if (fd >= floor) return fd;
  int high = fcntl(fd, F_DUPFD_CLOEXEC, floor);
  if (high < 0) return fd;  // no room up there: keep the low one, still checked before each write
  ::close(fd);
  return high;
}

bool OwnedFile::adopt(int fd, const char* path, int reopen_flags) {
  fd_ = -1;
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    if (fd >= 0) ::close(fd);
    return false;
  }
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  reopen_flags_ = reopen_flags;
  snprintf(path_, sizeof path_, "%s", path);
  fd_ = move_fd_high(fd);
  return true;
}

int OwnedFile::verified(off_t* size) {
  if (fd_ < 0) return -1;
  struct stat st;
  if (fstat(fd_, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) {
    if (size) *size = st.st_size;
    return fd_;
  }
  // Closed, or the number now holds a file of the program's: leave it be.
  fd_ = -1;
  int fd = ::open(path_, reopen_flags_ | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -1;
  if (fstat(fd, &st) != 0 || st.st_dev != dev_ || st.st_ino != ino_) {
    ::close(fd);  // the path names another file now: ours is gone
    return -1;
  }
  ++reopened_;
  if (size) *size = st.st_size;
  fd_ = move_fd_high(fd);
  return fd_;
}

void OwnedFile::close() {
  struct stat st;
  if (fd_ >= 0 && fstat(fd_, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) ::close(fd_);
  fd_ = -1;
}

// Everything only the writer thread touches.
namespace {

constexpr uint64_t kShareEveryNs = 1000000000ull;

// The most events merge_runs() hands over at once, and the host records
// one call of encode_host_records() encodes, whose room is reserved at once
// (15 KiB).
constexpr size_t kHostBatch = 256;

struct ShareSample {
  uint64_t rss = 0, pss = 0, shared = 0, priv = 0;
};

// /proc/self/smaps_rollup's totals (kB) in bytes; false when unreadable.
bool read_share(ShareSample& out) {
  char buf[4096];
  const ssize_t n = read_small_file("/proc/self/smaps_rollup", buf, sizeof buf);
  if (n <= 0) return false;
  auto field = [&](const char* name) -> uint64_t {
    const char* p = strstr(buf, name);
    if (p == nullptr) return 0;
    for (p += strlen(name); *p == ' ' || *p == '\t';) ++p;
    return parse_u64(p) * 1024;
  };
  out.rss = field("\nRss:");
  out.pss = field("\nPss:");
  out.shared = field("\nShared_Clean:") + field("\nShared_Dirty:");
  out.priv = field("\nPrivate_Clean:") + field("\nPrivate_Dirty:");
  return out.rss != 0;
}

}  // namespace

struct TraceWriter::State {
  ByteBuffer buffer;
  Bytes compressed;
  Vector<RingRun> runs;  // what a cycle drains, one run per ring (ring_merge.h)
  Vector<MergeHead> heads;  // merge_runs' heap
  Vector<uint64_t> stack_written = Vector<uint64_t>(1, kStacksAtStart);  // one bit per stack id
  Vector<uint8_t> code_written;   // Python code objects, by id
  uint32_t code_low = 1;
  uint32_t python_generation = 0;
  uint32_t strings_written = 0;
  uint32_t frame_index = 0;
  uint64_t last_flush_ns = 0;
  uint64_t last_sample_ns = 0;
  uint64_t last_share_ns = 0;
  uint64_t last_status_ns = 0;
  uint64_t next_interval_step_ns = 0;
  uint64_t interval_ns = 0;
  bool step_seen = false;
  uint64_t last_step = 0;
  bool have_step = false;
  int64_t step_live_history[16] = {};
  uint64_t step_history_count = 0;
  HeldReading held;
  PressureSampler pressure;
  uint64_t last_pressure_ns = 0;
  uint64_t last_vmstat_ns = 0;
  bool pressure_taken = false;
  ZSTD_CCtx* zstd = nullptr;
  // The paths of the stack written last: the next one reads only its own nodes.
  StackTable::ReadCache stack_paths{};
  // The path cache of the stacks the writer interns for the program's
  // threads (stack_spill.h), mapped when the first comes; nullptr before.
  StackTable::PathCache* spill_paths = nullptr;
  Encoder enc{buffer};
  uint64_t start_mono_ns = 0;
  uint64_t next_modules_ns = 0;  // when to ask the module thread for a read again
};

// The list of loaded objects is read on a thread of its own: reading it
// (dl_iterate_phdr) takes the loader's lock, and a signal may stop a thread
// that holds that lock (inside dlopen(), as a Python import is, or inside
// dl_iterate_phdr, as a C++ throw is) until the signal's handler returns.
// The handler waits for the writer to write the signal's note: the writer
// must never wait for that lock itself.
struct TraceWriter::Modules {
  // Held by whoever reads the list: the module thread, or the thread that
  // opens or closes the trace. Its holder owns `seen` and the counts.
  std::atomic<bool> scanning{false};
  Vector<std::pair<uint64_t, String>> seen;  // base and path of each object found
  unsigned long long dl_adds = ~0ull, dl_subs = ~0ull;
  // Records found and not written yet: the writer takes them.
  SpinLock lock;
  Vector<ModuleRecord> found;
  std::atomic<uint32_t> requested{0};
  std::atomic<uint32_t> done{0};
  std::atomic<bool> stopping{false};
};

namespace {

// Step labels, interned for the C ABI (rare calls: a lock is fine).
struct StringTable {
  SpinLock lock;
  Vector<String> strings;  // id = index + 1
};
StringTable& strings() {
  // Never destroyed: hooks may still run after static destructors.
  alignas(StringTable) static unsigned char storage[sizeof(StringTable)];
  static StringTable* table = new (storage) StringTable();
  return *table;
}
// Held across fork(): a thread of the program interning a label at that
// moment would leave the child a table half grown.
[[maybe_unused]] const bool g_strings_fork = fork_held_locks().add(&strings().lock);

}  // namespace

uint32_t Recorder::intern_string(const char* text) {
  if (text == nullptr || *text == '\0') return 0;
  StringTable& table = strings();
  SpinGuard guard(table.lock);
  for (size_t i = 0; i < table.strings.size(); ++i) {
    if (table.strings[i] == text) return static_cast<uint32_t>(i + 1);
  }
  table.strings.emplace_back(text);
  return static_cast<uint32_t>(table.strings.size());
}

namespace {

// Makes `*p` in the C library's heap the first time; false when out of memory.
template <typename T>
bool make_once(T** p) {
  if (*p != nullptr) return true;
  void* mem = __libc_malloc(sizeof(T));
  if (mem == nullptr) return false;
  *p = new (mem) T();
  return true;
}

}  // namespace

bool TraceWriter::open(const Config& config, const ForkOrigin& origin, char* error, size_t error_size) {
  if (!make_once(&state_) || !make_once(&modules_)) {
    snprintf(error, error_size, "out of memory");
    return false;
  }
  State& st = *state_;
  if (mkdir(config.dir, 0700) != 0 && errno != EEXIST) {
    snprintf(error, error_size, "cannot create %s: %s", config.dir, strerror(errno));
    return false;
  }
  const pid_t pid = getpid();
  char path[4200];
  int fd = -1;
  for (int attempt = 0; attempt < 1000 && fd < 0; ++attempt) {
    if (attempt == 0) {
      snprintf(path, sizeof path, "%s/trace.%d.mlt", config.dir, pid);
    } else {
      snprintf(path, sizeof path, "%s/trace.%d.%d.mlt", config.dir, pid, attempt);
    }
    fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) {
      snprintf(error, error_size, "cannot create %s: %s", path, strerror(errno));
      return false;
    }
  }
  if (fd < 0) {
    snprintf(error, error_size, "cannot create a trace file in %s", config.dir);
    return false;
  }

  // Header text.
  Bytes header;
  auto add = [&](const char* key, const char* value, size_t len) {
    header.insert(header.end(), key, key + strlen(key));
    header.push_back('=');
    for (size_t i = 0; i < len; ++i) {
      char c = value[i];
      header.push_back(c == '\n' ? ' ' : c);
    }
    header.push_back('\n');
  };
  auto add_num = [&](const char* key, long long value) {
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%lld", value);
    add(key, buf, static_cast<size_t>(n));
  };
  add_num("pid", pid);
  add_num("ppid", getppid());
  {
    char cmd[8192];
    ssize_t n = read_small_file("/proc/self/cmdline", cmd, sizeof cmd);
    if (n > 0) {
      if (cmd[n - 1] == '\0') --n;
      for (ssize_t i = 0; i < n; ++i) {
        if (cmd[i] == '\0') cmd[i] = '\x1f';
      }
      add("command", cmd, static_cast<size_t>(n));
    }
    char exe[4096];
    ssize_t m = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (m > 0) add("exe", exe, static_cast<size_t>(m));
  }
  struct utsname uts;
  if (uname(&uts) == 0) add("host", uts.nodename, strlen(uts.nodename));
  timespec wall, mono;
  clock_gettime(CLOCK_REALTIME, &wall);
  clock_gettime(CLOCK_MONOTONIC, &mono);
  st.start_mono_ns = static_cast<uint64_t>(mono.tv_sec) * 1000000000ull + static_cast<uint64_t>(mono.tv_nsec);
  st.last_status_ns = st.start_mono_ns;
  add_num("start_wall_ns", static_cast<long long>(wall.tv_sec) * 1000000000ll + wall.tv_nsec);
  add_num("start_mono_ns", static_cast<long long>(st.start_mono_ns));
  const char* mode = config.host_mode == HostMode::kFull ? "full"
                     : config.host_mode == HostMode::kSampled ? "sampled"
                                                               : "off";
  add("host_mode", mode, strlen(mode));
  add_num("sample_interval", static_cast<long long>(config.sample_interval));
  add_num("stack_depth", config.stack_depth);
  add_num("page_size", sysconf(_SC_PAGESIZE));
  add_num("step_interval_ms", static_cast<long long>(config.step_interval_s * 1000));
  static const char* const kRankVars[][2] = {
      {"rank", "RANK"}, {"rank", "OMPI_COMM_WORLD_RANK"}, {"rank", "PMI_RANK"}, {"rank", "SLURM_PROCID"},
      {"local_rank", "LOCAL_RANK"}, {"local_rank", "OMPI_COMM_WORLD_LOCAL_RANK"}, {"local_rank", "SLURM_LOCALID"},
      {"world_size", "WORLD_SIZE"}, {"world_size", "OMPI_COMM_WORLD_SIZE"}, {"world_size", "SLURM_NTASKS"},
  };
  const char* done_key = "";
  for (const auto& kv : kRankVars) {
    if (strcmp(done_key, kv[0]) == 0) continue;
    if (const char* v = getenv(kv[1])) {
      add(kv[0], v, strlen(v));
      done_key = kv[0];
    }
  }
  if (origin.parent > 0) {
    note_fork();
    add_num("parent_trace", origin.parent);
    add_num("fork_seq", static_cast<long long>(origin.seq));
    add_num("inherited_host_live", origin.host_live);
  }
  // The allocator switches in force: they decide what the driver can see.
  static const char* const kAllocatorVars[] = {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING",
                                               "TF_GPU_ALLOCATOR", "XLA_PYTHON_CLIENT_ALLOCATOR",
                                               "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION"};
  for (const char* var : kAllocatorVars) {
    if (const char* v = getenv(var)) {
      char key[64];
      snprintf(key, sizeof key, "env.%s", var);
      add(key, v, strlen(v));
    }
  }

  {
    // Whether a Python interpreter started here can load memledger's Python
    // helpers: `memledger run` puts the folder of their start-up hook
    // (.../memledger/_boot, its sitecustomize) first on PYTHONPATH. The
    // report says when a Python process went without them.
    const char* hooks = getenv("MEMLEDGER_PYTHON_HOOKS");
    const char* installed = getenv("MEMLEDGER_PYTHON_BOOT");  // "none": memledger run found no helpers
    const char* boot = "missing";
    if (hooks != nullptr && strcmp(hooks, "0") == 0) {
      boot = "off";
    } else if (installed != nullptr && strcmp(installed, "none") == 0) {
      boot = "not_installed";
    } else if (const char* path = getenv("PYTHONPATH")) {
      constexpr std::string_view kBoot = "/memledger/_boot";
      std::string_view rest = path;
      while (!rest.empty()) {
        const size_t colon = rest.find(':');
        std::string_view entry = rest.substr(0, colon);
        while (entry.size() > 1 && entry.back() == '/') entry.remove_suffix(1);
        if (entry.ends_with(kBoot)) boot = "on_path";
        rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
      }
    }
    add("python_boot", boot, strlen(boot));
  }
  // The program's allocator and where its held bytes come from.
  const AllocatorInfo& allocator = allocator_info();
  add("allocator", allocator.name, strlen(allocator.name));
  add("allocator_path", allocator.path, strlen(allocator.path));
  add("allocator_reached", allocator.reached, strlen(allocator.reached));
  const char* held = allocator.held_source[0] ? allocator.held_source : "none";
  add("allocator_held", held, strlen(held));
  if (allocator.untraced) add_num("host_untraced", 1);
  st.pressure.open();
  if (st.pressure.cgroup_dir()[0] != '\0') add("cgroup", st.pressure.cgroup_dir(), strlen(st.pressure.cgroup_dir()));

  format::FileHeader fh;
  memcpy(fh.magic, format::kFileMagic, sizeof fh.magic);
  fh.version = format::kVersion;
  fh.header_len = static_cast<uint32_t>(header.size());
  int err = 0;
  if (!write_all(fd, &fh, sizeof fh, &err) || !write_all(fd, header.data(), header.size(), &err)) {
    snprintf(error, error_size, "cannot write %s: %s", path, strerror(err));
    ::close(fd);
    return false;
  }
  if (!trace_.adopt(fd, path, O_WRONLY | O_APPEND)) {
    snprintf(error, error_size, "cannot write %s: %s", path, strerror(errno));
    return false;
  }

  // The status file is made at the first status update: a process that
  // ends within kStatusEveryNs (a shell's /bin/true) never needs one.
  snprintf(status_path_, sizeof status_path_, "%s/status.%d", config.dir, pid);

  st.interval_ns = static_cast<uint64_t>(config.step_interval_s * 1e9);
  st.next_interval_step_ns = st.interval_ns ? st.start_mono_ns + st.interval_ns : 0;
  if (st.zstd == nullptr) {
    ZSTD_customMem mem = {[](void*, size_t size) { return __libc_malloc(size); },
                          [](void*, void* p) { __libc_free(p); }, nullptr};
    st.zstd = ZSTD_createCCtx_advanced(mem);
    if (st.zstd != nullptr) {
      // Level 1 with a 256-entry match table: the events' varints repeat
      // little beyond the next few records, and what zstd gains on them is
      // mostly its entropy coding of the bytes. A table that stays in the
      // first-level cache compresses a frame in about two thirds of the
      // time of level 1's own, for a trace 2 to 3% larger (BENCHMARKS.md).
      ZSTD_CCtx_setParameter(st.zstd, ZSTD_c_compressionLevel, 1);
      ZSTD_CCtx_setParameter(st.zstd, ZSTD_c_hashLog, 8);
    }
  }
  return true;
}

bool TraceWriter::start_thread() {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  sigset_t all, old;
  sigfillset(&all);
  // The writer must never take the program's signals.
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&thread_, &attr, &TraceWriter::thread_main, this);
  // Without the module thread, the writer reads the list of loaded objects itself.
  pthread_t modules_thread;
  if (rc == 0 && modules_ != nullptr &&
      pthread_create(&modules_thread, &attr, &TraceWriter::modules_main, this) == 0) {
    pthread_detach(modules_thread);
    modules_running_.store(true, std::memory_order_release);
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  pthread_attr_destroy(&attr);
  if (rc != 0) return false;
  running_.store(true, std::memory_order_release);
  return true;
}

namespace {

// The start of each of memledger's own threads.
void become_tracer_thread(const char* name) {
  ThreadState& t = thread_state();
  t.in_hook = 1;  // nothing this thread allocates is the program's memory
  t.status = 2;
#ifdef __linux__
  pthread_setname_np(pthread_self(), name);
#endif
}

}  // namespace

void* TraceWriter::thread_main(void* self) {
  become_tracer_thread("memledger");
  TraceWriter& writer = *static_cast<TraceWriter*>(self);
  writer.thread_tid_.store(static_cast<pid_t>(syscall(SYS_gettid)), std::memory_order_release);
  writer.run();
  return nullptr;
}

void TraceWriter::wake() {
  wake_word_.fetch_add(1, std::memory_order_release);
  futex(&wake_word_, FUTEX_WAKE_PRIVATE, 1, nullptr);
}

void TraceWriter::flush_and_wait(int timeout_ms) {
  if (!running_.load(std::memory_order_acquire) || !trace_.is_open()) return;
  if (pthread_equal(pthread_self(), thread_)) return;
  uint32_t ticket = flush_requested_.fetch_add(1, std::memory_order_acq_rel) + 1;
  wake();
  WaitBudget budget(static_cast<uint64_t>(timeout_ms) * 1'000'000, monotonic_ns());
  for (;;) {
    uint32_t done = flush_done_.load(std::memory_order_acquire);
    if (static_cast<int32_t>(done - ticket) >= 0) return;
    if (!running_.load(std::memory_order_acquire) || !trace_.is_open()) return;
    if (!budget.go_on(monotonic_ns(), thread_ready(thread_tid_.load(std::memory_order_acquire)))) return;
    timespec wait = {0, 5'000'000};
    futex(&flush_done_, FUTEX_WAIT_PRIVATE, done, &wait);
  }
}

void TraceWriter::note_exit(int status) {
  exit_status_ = status;
  exit_pending_.store(1, std::memory_order_release);
}

void TraceWriter::note_exec(const char* path) {
  size_t n = strnlen(path, sizeof exec_path_ - 1);
  memcpy(exec_path_, path, n);
  exec_path_[n] = '\0';
  exec_pending_.store(1, std::memory_order_release);
}

namespace {
// Events per second from which the writer takes short waits (250 us).
// Below it (sampled mode, most programs) the writer wakes 100 times a
// second, and a ring that reaches Recorder::push's wake mark (2 Ki events)
// sooner wakes it: at this rate all in one ring, 500 system calls a second,
// which cost the program less than the writer's 4,000 short cycles a second
// cost it where the program's threads keep every core busy.
constexpr uint64_t kStreamingPerSecond = 1'000'000;
}  // namespace

void TraceWriter::run() {
  // Ends when the trace is lost: there is nothing left to write. `seen` is
  // taken before each cycle: a wake during a cycle (a step marker) starts
  // the next one at once instead of being lost in a 10 ms wait.
  uint32_t seen = wake_word_.load(std::memory_order_acquire);
  // When the last cycle began, and how long after the one before: the
  // events it drained came in over that time.
  uint64_t last_cycle_ns = monotonic_ns();
  uint64_t interval_ns = 1;
  size_t drained = 0;  // events the last cycle took from the rings
  while (!stopping_.load(std::memory_order_acquire) && trace_.is_open()) {
    if (flush_requested_.load(std::memory_order_acquire) == flush_done_.load(std::memory_order_acquire)) {
      // While the program allocates without pause, the next cycle comes
      // after a short wait on the writer's own timer: a wake from the
      // program costs the program a system call each time, more than the
      // writer's short waits cost the writer. Otherwise a long wait, that
      // a filling ring cuts short (Recorder::push).
      const bool streaming = drained * 1'000'000'000ull >= kStreamingPerSecond * interval_ns;
      timespec wait = {0, streaming ? 250'000 : 10'000'000};
      if (!streaming) waiting_.store(true, std::memory_order_seq_cst);
      futex(&wake_word_, FUTEX_WAIT_PRIVATE, seen, &wait);
      waiting_.store(false, std::memory_order_relaxed);
    }
    seen = wake_word_.load(std::memory_order_acquire);
    const uint64_t now = monotonic_ns();
    interval_ns = now > last_cycle_ns ? now - last_cycle_ns : 1;
    last_cycle_ns = now;
    drained = cycle(false);
  }
}

void TraceWriter::stop() {
  if (running_.load(std::memory_order_acquire)) {
    stopping_.store(true, std::memory_order_release);
    wake();
    pthread_join(thread_, nullptr);
    running_.store(false, std::memory_order_release);
  }
  if (trace_.is_open()) {
    cycle(true);
    trace_.close();
  }
  status_.close();
  // The module thread is not joined: it may be waiting for the loader's lock.
  if (modules_running_.exchange(false, std::memory_order_acq_rel)) {
    modules_->stopping.store(true, std::memory_order_release);
    request_modules_scan();
  }
}

void TraceWriter::reset_after_fork() {
  // The parent's writer thread does not exist here; its file belongs to the
  // parent. Close our copies without writing anything.
  running_.store(false, std::memory_order_relaxed);
  stopping_.store(false, std::memory_order_relaxed);
  thread_tid_.store(0, std::memory_order_relaxed);
  flush_requested_.store(0, std::memory_order_relaxed);
  flush_done_.store(0, std::memory_order_relaxed);
  exit_pending_.store(0, std::memory_order_relaxed);
  exec_pending_.store(0, std::memory_order_relaxed);
  signal_.pending.store(0, std::memory_order_relaxed);
  trace_.close();
  status_.close();
  if (state_ != nullptr) {
    state_->pressure.close();
    ZSTD_CCtx* zstd = state_->zstd;
    StackTable::PathCache* spill_paths = state_->spill_paths;
    state_->~State();
    state_ = new (state_) State();
    state_->zstd = zstd;
    // The parent's writer may have been interning with it.
    if (spill_paths != nullptr) spill_paths->clear();
    state_->spill_paths = spill_paths;
  }
  // The parent's module thread does not exist here either; the child's
  // trace records every object again.
  modules_running_.store(false, std::memory_order_relaxed);
  if (modules_ != nullptr) {
    modules_->~Modules();
    modules_ = new (modules_) Modules();
  }
}

namespace {

// A kPressure record (trace_format.h).
void encode_pressure(Encoder& enc, PressureSampler& sampler, uint64_t ts, bool with_vmstat) {
  PressureReading r;
  sampler.read(&r, with_vmstat);
  enc.tag(format::Tag::kPressure);
  enc.u(ts);
  enc.u(r.present);
  enc.u(r.mem.total);
  enc.u(r.mem.available);
  enc.u(r.mem.swap_total);
  enc.u(r.mem.swap_free);
  enc.u(r.swap_in);
  enc.u(r.swap_out);
  enc.u(r.psi.some_avg10);
  enc.u(r.psi.full_avg10);
  enc.u(r.psi.some_total);
  enc.u(r.psi.full_total);
  enc.u(r.cgroup_oom_kills);
}

}  // namespace

namespace {

constexpr uint64_t kModulesEveryNs = 10'000'000;

// Reads the list of loaded objects when it changed since the last read, and
// queues a record of each object not found before. Returns true when the
// list changed.
bool read_loaded_objects(TraceWriter::Modules& m) {
  struct Scan {
    TraceWriter::Modules* m;
    Vector<ModuleRecord> fresh;
    bool first = true;
    bool changed = false;
  } scan{&m, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* data) -> int {
        Scan& s = *static_cast<Scan*>(data);
        TraceWriter::Modules& m = *s.m;
        if (s.first) {
          s.first = false;
          if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
            if (info->dlpi_adds == m.dl_adds && info->dlpi_subs == m.dl_subs) return 1;
            // An object went away: what is loaded at its addresses next is unwound afresh.
            if (info->dlpi_subs != m.dl_subs && m.dl_subs != ~0ull) unwinder_modules_unloaded();
            m.dl_adds = info->dlpi_adds;
            m.dl_subs = info->dlpi_subs;
          }
          s.changed = true;
        }
        String path = info->dlpi_name ? info->dlpi_name : "";
        if (path.empty()) {
          char exe[4096];
          ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
          if (n > 0) path.assign(exe, static_cast<size_t>(n));
        }
        for (const auto& known : m.seen) {
          if (known.first == info->dlpi_addr && known.second == path) return 0;
        }
        ModuleRecord rec;
        rec.base = info->dlpi_addr;
        rec.path = path;
        rec.build_id = build_id_of(info);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type == PT_LOAD) {
            rec.segments.emplace_back(info->dlpi_phdr[i].p_vaddr, info->dlpi_phdr[i].p_memsz);
          }
        }
        m.seen.emplace_back(info->dlpi_addr, std::move(path));
        s.fresh.push_back(std::move(rec));
        return 0;
      },
      &scan);
  if (!scan.fresh.empty()) {
    SpinGuard guard(m.lock);
    for (ModuleRecord& rec : scan.fresh) m.found.push_back(std::move(rec));
  }
  return scan.changed;
}

}  // namespace

bool TraceWriter::scan_modules_here(bool detect_python, int wait_ms) {
  if (modules_ == nullptr) return false;
  Modules& m = *modules_;
  WaitBudget budget(static_cast<uint64_t>(wait_ms) * 1'000'000, monotonic_ns());
  while (m.scanning.exchange(true, std::memory_order_acquire)) {
    if (!budget.go_on(monotonic_ns())) return false;
    timespec pause = {0, 1'000'000};
    nanosleep(&pause, nullptr);
  }
  Recorder& rec = recorder();
  bool scanned = false;
  if (rec.enter_loader_section()) {  // not while a fork is under way
    const bool changed = read_loaded_objects(m);
    PythonFrames& python = python_frames();
    // The interpreter may come in an object loaded since (an embedding program).
    if (detect_python && changed && python.status() == PythonFrames::Status::kNone &&
        rec.config().stack_depth != 0) {
      python.detect();
    }
    rec.leave_loader_section();
    scanned = true;
  }
  m.scanning.store(false, std::memory_order_release);
  return scanned;
}

uint32_t TraceWriter::request_modules_scan() {
  Modules& m = *modules_;
  const uint32_t ticket = m.requested.fetch_add(1, std::memory_order_acq_rel) + 1;
  futex(&m.requested, FUTEX_WAKE_PRIVATE, 1, nullptr);
  return ticket;
}

bool TraceWriter::wait_modules_scan(uint32_t ticket, int timeout_ms) {
  Modules& m = *modules_;
  WaitBudget budget(static_cast<uint64_t>(timeout_ms) * 1'000'000, monotonic_ns());
  for (;;) {
    const uint32_t done = m.done.load(std::memory_order_acquire);
    if (static_cast<int32_t>(done - ticket) >= 0) return true;
    if (!budget.go_on(monotonic_ns())) return false;
    timespec wait = {0, 1'000'000};
    futex(&m.done, FUTEX_WAIT_PRIVATE, done, &wait);
  }
}

void* TraceWriter::modules_main(void* self) {
  become_tracer_thread("memledger-mods");
  static_cast<TraceWriter*>(self)->run_modules();
  return nullptr;
}

void TraceWriter::run_modules() {
  Modules& m = *modules_;
  uint32_t seen = 0;
  while (!m.stopping.load(std::memory_order_acquire)) {
    futex(&m.requested, FUTEX_WAIT_PRIVATE, seen, nullptr);
    const uint32_t ticket = m.requested.load(std::memory_order_acquire);
    if (ticket == seen || m.stopping.load(std::memory_order_acquire)) continue;
    seen = ticket;
    // Busy elsewhere (the trace is being closed): that scan stands for this one.
    scan_modules_here(true, 0);
    m.done.store(ticket, std::memory_order_release);
    futex(&m.done, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr);
  }
}

void TraceWriter::write_found_modules(State& st) {
  if (modules_ == nullptr) return;
  Modules& m = *modules_;
  Vector<ModuleRecord> found;
  {
    SpinGuard guard(m.lock);
    found.swap(m.found);
  }
  for (const ModuleRecord& rec : found) {
    st.enc.tag(format::Tag::kModule);
    st.enc.u(rec.base);
    st.enc.str(rec.path.data(), rec.path.size());
    st.enc.str(rec.build_id.data(), rec.build_id.size());
    st.enc.u(rec.segments.size());
    for (auto& seg : rec.segments) {
      st.enc.u(seg.first);
      st.enc.u(seg.second);
    }
  }
}

void TraceWriter::scan_modules_at_start() {
  if (state_ == nullptr || !trace_.is_open() || running_.load(std::memory_order_acquire)) return;
  if (scan_modules_here(false, 0)) write_found_modules(*state_);
}

uint32_t TraceWriter::intern_spilled(State& st, const uintptr_t* words, uint32_t depth, uint32_t python) {
  if (st.spill_paths == nullptr) {
    void* mem = mmap(nullptr, sizeof(StackTable::PathCache), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem != MAP_FAILED) st.spill_paths = static_cast<StackTable::PathCache*>(mem);  // zero pages: empty
  }
  return recorder().stacks().intern(words, depth, python, st.spill_paths);
}

size_t TraceWriter::cycle(bool final) {
  if (!trace_.is_open() || state_ == nullptr) return 0;
  State& st = *state_;
  Recorder& rec = recorder();
  const uint32_t ticket = flush_requested_.load(std::memory_order_acquire);
  Encoder& enc = st.enc;

  // 1. Drain every ring: what each holds now is this cycle's run of it.
  st.runs.clear();
  uint64_t dropped = 0;
  uint32_t allocating = 0;
  const uint64_t drained_at = monotonic_ns();
  for (ThreadRing* ring = rec.rings(); ring != nullptr; ring = ring->next) {
    uint64_t tail = ring->tail.load(std::memory_order_relaxed);
    uint64_t head = ring->head.load(std::memory_order_acquire);
    // A thread is counted for a while after it allocated fast: among many
    // threads on few cores, not every one has run since the last cycle.
    if (head - tail >= Recorder::kBusyRingEvents) ring->busy_until_ns = drained_at + Recorder::kBusyForNs;
    if (ring->busy_until_ns > drained_at && ring != rec.shared_ring()) ++allocating;
    dropped += ring->dropped.exchange(0, std::memory_order_relaxed);
    const bool retire = ring->state.load(std::memory_order_acquire) == static_cast<int>(RingState::kRetired) &&
                        ring->head.load(std::memory_order_acquire) == head;
    if (head != tail || retire) st.runs.push_back({ring, tail, head, retire});
  }
  rec.set_allocating_threads(allocating);
  const uint64_t now = monotonic_ns();

  // 2. Time-based steps.
  if (st.interval_ns != 0) {
    while (now >= st.next_interval_step_ns) {
      rec.on_step(nullptr, format::StepSource::kInterval);
      st.next_interval_step_ns += st.interval_ns;
    }
    // on_step pushed into the shared ring (this thread has no ring of its
    // own): its run goes on to what is there now.
    ThreadRing* shared = rec.shared_ring();
    const uint64_t head = shared->head.load(std::memory_order_acquire);
    RingRun* run = nullptr;
    for (RingRun& r : st.runs) {
      if (r.ring == shared) run = &r;
    }
    if (run != nullptr) {
      run->end = head;
    } else {
      const uint64_t tail = shared->tail.load(std::memory_order_relaxed);
      if (head != tail) st.runs.push_back({shared, tail, head, false});
    }
  }

  // 3. Modules: the module thread reads their list, at most every 10 ms,
  // and this cycle writes what it found. While a signal's note waits, the
  // cycle waits a little for a fresh read (the crashing frame may be in an
  // object loaded since the last one), never for long: that thread may wait
  // for the loader's lock, held by the thread the signal stopped. Without
  // the module thread, or at the end, the list is read here, unless a
  // signal's note waits.
  const int signal_state = signal_.pending.load(std::memory_order_acquire);
  const bool signal_waits = signal_state == 1 || signal_state == 3;
  if (final || !modules_running_.load(std::memory_order_acquire)) {
    if (!signal_waits) scan_modules_here(true, final ? 250 : 0);
  } else if (signal_state == 1) {
    wait_modules_scan(request_modules_scan(), 100);
  } else if (now >= st.next_modules_ns) {
    st.next_modules_ns = now + kModulesEveryNs;
    request_modules_scan();
  }
  write_found_modules(st);

  // 4. The Python interpreter's status, then the Python code objects and
  // stacks published since the last cycle.
  PythonFrames& python = python_frames();
  if (python.generation() != st.python_generation) {
    st.python_generation = python.generation();
    enc.tag(format::Tag::kPython);
    enc.u(static_cast<uint64_t>(python.status() == PythonFrames::Status::kActive ? format::PythonStatus::kActive
                                                                               : format::PythonStatus::kUnsupported));
    enc.str(python.version());
    enc.str(python.module());
    enc.str(python.note());
  }
  const uint32_t code_count = python.code_count() < PythonFrames::kMaxCodes ? python.code_count()
                                                                            : PythonFrames::kMaxCodes;
  if (st.code_written.size() < code_count + 1) st.code_written.resize(code_count + 1, 0);
  for (uint32_t id = st.code_low; id <= code_count; ++id) {
    PythonCodeView code;
    if (st.code_written[id] || !python.code(id, &code)) continue;
    enc.tag(format::Tag::kPythonCode);
    enc.u(id);
    enc.str(code.filename, code.filename_len);
    enc.str(code.qualname, code.qualname_len);
    enc.u(code.first_line);
    enc.u(code.line_table_len != 0 ? python.line_table_format() : 0);
    enc.str(reinterpret_cast<const char*>(code.line_table), code.line_table_len);
    st.code_written[id] = 1;
  }
  while (st.code_low <= code_count && st.code_written[st.code_low]) ++st.code_low;

  // Stacks are written as events first refer to them (step 6): read from
  // the table, or from `words` where the caller has them in hand (the
  // table gives back the same words, up to its depth).
  StackTable& stacks = rec.stacks();
  auto write_stack = [&](uint32_t id, const uintptr_t* words = nullptr, uint32_t depth = 0) {
    if (stack_in_trace(st.stack_written.data(), st.stack_written.size(), id)) return;
    if (id / 64 >= st.stack_written.size()) {
      const uint32_t count = stacks.count();
      st.stack_written.resize((id > count ? id : count) / 64 + 1, 0);
    }
    uintptr_t* const frames = enc.next_stack();
    if (words != nullptr) {
      depth = depth < StackTable::kMaxDepth ? depth : StackTable::kMaxDepth;
      memcpy(frames, words, depth * sizeof(uintptr_t));
    } else {
      depth = stacks.get(id, frames, &st.stack_paths);
    }
    if (depth == 0) return;
    enc.stack_record(id, depth);
    st.stack_written[id / 64] |= uint64_t{1} << (id % 64);
  };
  // The stack that `e`'s thread left to be interned here (stack_spill.h):
  // interned, its id put in the event, and written from the words in hand.
  auto write_spilled = [&](ThreadRing& ring, Event& e) {
    uintptr_t words[StackSpill::kMaxDepth];
    uint32_t python = 0;
    uint64_t at = 0;
    const uint32_t depth = ring.spill.take(e.stack, words, &python, &at);
    e.stack = depth != 0 ? intern_spilled(st, words, depth, python) : 0;
    // The id goes back to the thread with the words (StackSpill::known).
    if (depth != 0) ring.spill.release(at, depth, e.stack);
    write_stack(e.stack, words, depth);
  };

  // 5. Strings (step labels).
  {
    StringTable& table = strings();
    SpinGuard guard(table.lock);
    for (; st.strings_written < table.strings.size(); ++st.strings_written) {
      enc.tag(format::Tag::kString);
      enc.u(st.strings_written + 1);
      const String& s = table.strings[st.strings_written];
      enc.str(s.data(), s.size());
    }
  }

  // 6. Events, in sequence order.
  st.heads.resize(st.runs.size());
  const bool deposit = fast_bit_deposit();
  const size_t drained = merge_runs(st.runs.data(), st.runs.size(), st.heads.data(),
                                    [&](ThreadRing* ring, Event* events, size_t n) {
    Event* const last = events + n;
    for (Event* next = events; next != last;) {
      // Host allocations and frees, a batch at a time, while their stacks
      // are written already.
      const size_t batch = std::min<size_t>(static_cast<size_t>(last - next), kHostBatch);
      const uint64_t* const written = st.stack_written.data();
      const size_t written_words = st.stack_written.size();
      uint8_t* out = enc.begin(batch * kMaxHostRecord);
      const auto in_trace = [written, written_words](uint32_t id) {
        return stack_in_trace(written, written_words, id);
      };
      const Event* const stop =
          deposit ? encode_host_records<true>(next, next + batch, st.start_mono_ns, enc.deltas(), out, in_trace)
                  : encode_host_records<false>(next, next + batch, st.start_mono_ns, enc.deltas(), out, in_trace);
      enc.end(out);
      if (stop != next) {
        next = events + (stop - events);
        continue;
      }
      Event& e = *next++;
      const uint64_t ts = e.ts >= st.start_mono_ns ? e.ts - st.start_mono_ns : 0;
      switch (e.type) {
        case EventType::kAlloc: {
          if (StackSpill::is_marker(e.stack)) {
            write_spilled(*ring, e);
          } else {
            write_stack(e.stack);
          }
          if (plain_host_alloc(e)) {
            uint8_t* p = enc.begin(kMaxHostRecord);
            encode_host_records(&e, &e + 1, st.start_mono_ns, enc.deltas(), p, [](uint32_t) { return true; });
            enc.end(p);
            break;
          }
          uint8_t* p = enc.begin(Encoder::kMaxEventRecord);
          *p++ = static_cast<uint8_t>(format::Tag::kAlloc);
          p = enc.put_seq_ts(p, e.seq, ts);
          p = Encoder::put(p, e.tid);
          p = Encoder::put(p, e.kind);
          p = Encoder::put(p, e.aux);
          p = enc.put_addr(p, e.addr);
          p = Encoder::put(p, e.size);
          p = Encoder::put(p, e.stack);
          p = Encoder::put(p, e.flags);
          p = Encoder::put(p, e.weight);
          enc.end(p);
          break;
        }
        case EventType::kFree: {
          // Not a plain host free: encode_host_records() took those.
          uint8_t* p = enc.begin(Encoder::kMaxEventRecord);
          *p++ = static_cast<uint8_t>(format::Tag::kFree);
          p = enc.put_seq_ts(p, e.seq, ts);
          p = Encoder::put(p, e.tid);
          p = Encoder::put(p, e.kind);
          p = enc.put_addr(p, e.addr);
          p = Encoder::put(p, e.flags);
          enc.end(p);
          break;
        }
        case EventType::kReserve:
          write_stack(e.stack);
          enc.tag(format::Tag::kReserve);
          enc.seq_ts(e.seq, ts);
          enc.u(e.tid);
          enc.u(e.aux);
          enc.u(e.addr);
          enc.u(e.size);
          enc.u(e.stack);
          break;
        case EventType::kUnreserve:
        case EventType::kUnmap:
          enc.tag(e.type == EventType::kUnmap ? format::Tag::kUnmap : format::Tag::kUnreserve);
          enc.seq_ts(e.seq, ts);
          enc.u(e.tid);
          enc.u(e.addr);
          enc.u(e.size);
          break;
        case EventType::kMap:
          enc.tag(format::Tag::kMap);
          enc.seq_ts(e.seq, ts);
          enc.u(e.tid);
          enc.u(e.aux);
          enc.u(e.addr);
          enc.u(e.size);
          enc.u(e.weight);
          break;
        case EventType::kHostTotals:
          enc.host_totals_record(e, ts);
          break;
        case EventType::kDeviceSample:
          enc.tag(format::Tag::kDeviceSample);
          enc.seq_ts(e.seq, ts);
          enc.u(e.aux);
          enc.u(e.addr);
          enc.u(e.size);
          break;
        case EventType::kPoolSample:
          enc.tag(format::Tag::kPoolSample);
          enc.seq_ts(e.seq, ts);
          enc.u(e.aux);
          enc.u(e.addr);
          enc.u(e.size);
          enc.u(e.weight);
          break;
        case EventType::kCuptiStatus:
          enc.tag(format::Tag::kCuptiStatus);
          enc.u(e.seq);
          enc.u(ts);
          enc.u(e.kind);
          enc.u(e.size);
          enc.u(e.aux);
          enc.u(e.stack);
          break;
        case EventType::kCuptiMemory: {
          const bool is_static = format::is_module_static(e.source);
          enc.tag(format::Tag::kCuptiMemory);
          enc.u(ts);
          enc.u(e.flags & 1u);
          enc.u(e.kind);
          enc.u(e.aux);
          enc.u(is_static ? UINT32_MAX : e.tid);
          enc.u(e.addr);
          enc.u(e.size);
          enc.u(e.weight);
          enc.u(e.stack);
          enc.u(static_cast<uint64_t>(e.flags >> 1));
          enc.u(e.source);
          enc.u(is_static ? e.tid : 0);
          break;
        }
        case EventType::kCuptiPool:
          enc.tag(format::Tag::kCuptiPool);
          enc.u(ts);
          enc.u(e.kind);
          enc.u(e.flags);
          enc.u(e.aux);
          enc.u(e.addr);
          enc.u(e.size);
          enc.u(e.weight);
          enc.u(static_cast<uint64_t>(e.tid) << 32 | e.stack);
          break;
        case EventType::kCuptiDropped:
          enc.tag(format::Tag::kCuptiDropped);
          enc.u(e.size);
          break;
        case EventType::kInfo:
          enc.tag(format::Tag::kInfo);
          enc.u(ts);
          enc.u(e.aux);
          enc.u(e.stack);
          break;
        case EventType::kStep: {
          enc.tag(format::Tag::kStep);
          enc.seq_ts(e.seq, ts);
          enc.u(e.tid);
          enc.u(e.size);
          enc.u(e.source);
          enc.u(e.aux);
          enc.host_totals(e);
          st.step_seen = true;
          st.have_step = true;
          st.last_step = e.size;
          // Live bytes at this step end, for the live status line.
          st.step_live_history[st.step_history_count % 16] = static_cast<int64_t>(e.addr);
          ++st.step_history_count;
          break;
        }
      }
    }
  }, 4096, kHostBatch);
  if (dropped != 0) {
    enc.tag(format::Tag::kDropped);
    enc.u(dropped);
  }

  // 7. Signal, exec and exit notes.
  if (signal_.pending.load(std::memory_order_acquire) == 1) {
    enc.tag(format::Tag::kSignal);
    uint64_t ts = signal_.ts >= st.start_mono_ns ? signal_.ts - st.start_mono_ns : 0;
    enc.u(ts);
    enc.u(static_cast<uint64_t>(signal_.tid));
    enc.u(static_cast<uint64_t>(signal_.signo));
    enc.s(signal_.code);
    enc.u(signal_.fault_addr);
    enc.u(signal_.stack);
    write_stack(signal_.stack);
    signal_.pending.store(2, std::memory_order_release);
  }
  if (exec_pending_.load(std::memory_order_acquire) == 1) {
    enc.tag(format::Tag::kExec);
    enc.u(now - st.start_mono_ns);
    enc.str(exec_path_);
    exec_pending_.store(2, std::memory_order_release);
  }
  if (exit_pending_.load(std::memory_order_acquire) == 1) {
    enc.tag(format::Tag::kExit);
    enc.u(now - st.start_mono_ns);
    enc.s(exit_status_);
    exit_pending_.store(2, std::memory_order_release);
  }

  // 8. Periodic sample (and one at every step end and at the end).
  int64_t live_total = 0;
  uint64_t allocs = 0, frees = 0;
  for (ThreadRing* ring = rec.rings(); ring != nullptr; ring = ring->next) {
    live_total += ring->host_live.load(std::memory_order_relaxed);
    allocs += ring->host_allocs.load(std::memory_order_relaxed);
    frees += ring->host_frees.load(std::memory_order_relaxed);
  }
  uint64_t rss = 0;
  const bool periodic = now - st.last_sample_ns >= kSampleEveryNs;
  if (final || st.step_seen || periodic) {
    char buf[128];
    if (read_small_file("/proc/self/statm", buf, sizeof buf) > 0) {
      const char* p = strchr(buf, ' ');
      if (p) rss = parse_u64(p + 1) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    }
    // A step end may go without a new reading of the allocator's statistics
    // (HeldReading); a periodic sample (kSampleEveryNs) always reads them.
    st.held.read(final || periodic, now, live_total, allocator_heap_stats, monotonic_ns);
    enc.tag(format::Tag::kSample);
    enc.u(now - st.start_mono_ns);
    enc.u(rss);
    enc.u(st.held.held);
    enc.u(st.held.in_use);
    uint64_t cgroup_limit = 0, cgroup_usage = 0;
    st.pressure.read_cgroup(&cgroup_limit, &cgroup_usage);
    enc.u(cgroup_limit);
    enc.u(cgroup_usage);
    enc.s(live_total);
    enc.u(allocs);
    enc.u(frees);
    st.last_sample_ns = now;
    if (final || !st.pressure_taken || now - st.last_pressure_ns >= kPressureMinGapNs) {
      const bool vmstat = final || !st.pressure_taken || now - st.last_vmstat_ns >= kSampleEveryNs;
      encode_pressure(enc, st.pressure, now - st.start_mono_ns, vmstat);
      st.last_pressure_ns = now;
      if (vmstat) st.last_vmstat_ns = now;
      st.pressure_taken = true;
    }
  }

  // Shared and private memory, once a second, in a process that forked or
  // was forked: reading smaps_rollup walks the page tables, too dear for
  // every sample.
  if (shares_pages_.load(std::memory_order_relaxed) && (final || now - st.last_share_ns >= kShareEveryNs)) {
    ShareSample share;
    if (read_share(share)) {
      enc.tag(format::Tag::kShare);
      enc.u(now - st.start_mono_ns);
      enc.u(share.rss);
      enc.u(share.pss);
      enc.u(share.shared);
      enc.u(share.priv);
    }
    st.last_share_ns = now;
  }

  if (final) {
    enc.tag(format::Tag::kEnd);
    enc.u(now - st.start_mono_ns);
  }

  // 9. Write a frame when due.
  const bool flush_asked = ticket != flush_done_.load(std::memory_order_acquire);
  if (!st.buffer.empty() &&
      (final || flush_asked || st.step_seen || st.buffer.size() >= kFrameTarget ||
       now - st.last_flush_ns >= kFlushEveryNs)) {
    int err = 0;
    if (!write_frame(st.buffer.data(), st.buffer.size(), &err)) {
      lose_trace(err ? "cannot write the trace file" : "the trace file was closed and cannot be opened again", err,
                 now);
    }
    st.buffer.clear();
    st.buffer.shrink(8 * kFrameTarget);
    enc.new_frame();
    st.last_flush_ns = now;
    st.step_seen = false;
  }
  flush_done_.store(ticket, std::memory_order_release);
  futex(&flush_done_, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr);

  // 10. Status for `memledger run`'s live line.
  if (!status_.is_open() && status_path_[0] != '\0' && !final && now - st.last_status_ns >= kStatusEveryNs) {
    // Made afresh, never opened through what is already there: a symlink
    // or a hard link planted under this name would have the status written
    // into another file. What was there is removed (the name is ours: our
    // pid, in our run folder; a status file left by an earlier process with
    // this pid is one such).
    ::unlink(status_path_);
    status_.adopt(::open(status_path_, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600), status_path_,
                  O_WRONLY);
    status_path_[0] = '\0';  // made once: a status file the program closed is opened again by OwnedFile
  }
  if (status_.is_open() && (final || now - st.last_status_ns >= kStatusEveryNs)) {
    if (rss == 0) {
      char buf[128];
      if (read_small_file("/proc/self/statm", buf, sizeof buf) > 0) {
        const char* p = strchr(buf, ' ');
        if (p) rss = parse_u64(p + 1) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
      }
    }
    long long growth = 0;
    uint64_t n = st.step_history_count;
    if (n >= 2) {
      uint64_t span = n - 1 < 15 ? n - 1 : 15;
      growth = (st.step_live_history[(n - 1) % 16] - st.step_live_history[(n - 1 - span) % 16]) /
               static_cast<long long>(span);
    }
    char line[256];
    int len = snprintf(line, sizeof line, "step=%lld live=%lld rss=%llu growth=%lld final=%d\n",
                       st.have_step ? static_cast<long long>(st.last_step) : -1,
                       static_cast<long long>(live_total), static_cast<unsigned long long>(rss), growth,
                       final ? 1 : 0);
    char padded[256];
    memset(padded, ' ', sizeof padded);
    memcpy(padded, line, static_cast<size_t>(len));
    padded[sizeof padded - 1] = '\n';
    const int fd = status_.verified();
    if (fd >= 0 && pwrite(fd, padded, sizeof padded, 0) < 0) status_.close();
    st.last_status_ns = now;
  }
  return drained;
}

bool TraceWriter::write_frame(const uint8_t* raw, size_t raw_len, int* err) {
  State& st = *state_;
  format::FrameHeader fh{};
  fh.magic = format::kFrameMagic;
  fh.raw_len = static_cast<uint32_t>(raw_len);
  fh.index = st.frame_index++;
  const uint8_t* payload = raw;
  size_t payload_len = raw_len;
  if (st.zstd != nullptr && raw_len > 64) {
    st.compressed.resize(ZSTD_compressBound(raw_len));
    size_t n = ZSTD_compress2(st.zstd, st.compressed.data(), st.compressed.size(), raw, raw_len);
    if (!ZSTD_isError(n) && n < raw_len) {
      payload = st.compressed.data();
      payload_len = n;
      fh.flags |= format::kFrameCompressed;
    }
  }
  fh.stored_len = static_cast<uint32_t>(payload_len);
  // libdeflate's CRC-32 is zlib's (same polynomial, same value), with
  // carry-less multiplication where the CPU has it: about four times
  // zlib's speed here, a tenth of the writer's instructions (BENCHMARKS.md).
  fh.crc32 = libdeflate_crc32(0, payload, payload_len);
  off_t size = 0;
  const int fd = trace_.verified(&size);
  *err = 0;
  if (fd < 0) return false;
  if (write_all(fd, &fh, sizeof fh, err) && write_all(fd, payload, payload_len, err)) return true;
  // A torn frame would cost the reader a resynchronisation: cut it off.
  if (ftruncate(fd, size) != 0) {
    // Nothing more to do: the reader skips a torn tail.
  }
  return false;
}

void TraceWriter::lose_trace(const char* why, int err, uint64_t now) {
  State& st = *state_;
  const double at_s = static_cast<double>(now - st.start_mono_ns) / 1e9;
  char msg[4700];
  int n = snprintf(msg, sizeof msg, "%s %s", why, trace_.path());
  if (err) n += snprintf(msg + n, sizeof msg - static_cast<size_t>(n), ": %s", strerror(err));
  // The reason, in the trace itself when a small frame still fits (a torn
  // frame was just cut off, or the descriptor was the only problem).
  if (trace_.is_open()) {
    ByteBuffer record;
    Encoder enc(record);
    enc.tag(format::Tag::kTracerError);
    enc.u(now - st.start_mono_ns);
    enc.str(msg);
    int ignored = 0;
    write_frame(record.data(), record.size(), &ignored);
  }
  trace_.close();
  snprintf(msg + n, sizeof msg - static_cast<size_t>(n),
           "; tracing stopped for pid %d after %.2f s (the trace up to then is kept), the program goes on",
           static_cast<int>(getpid()), at_s);
  recorder().disable(msg);
}

TraceWriter& trace_writer() {
  alignas(TraceWriter) static unsigned char storage[sizeof(TraceWriter)];
  static TraceWriter* writer = new (storage) TraceWriter();
  return *writer;
}

}  // namespace memledger::interposer
