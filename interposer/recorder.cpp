#include "recorder.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dlfcn.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define UNW_LOCAL_ONLY
#include <libunwind.h>

#include "graph_ledger.h"
#include "internal_alloc.h"
#include "live_ledger.h"
#include "mapped_ledger.h"
#include "memledger.h"
#include "next_allocator.h"
#include "python_frames.h"
#include "sampled_set.h"
#include "signals.h"
#include "spin_lock.h"
#include "trace_writer.h"
#include "unwinder.h"

namespace memledger::interposer {
__thread ThreadState tls_state __attribute__((tls_model("initial-exec")));
constinit Recorder g_recorder;

namespace {

SpinLock g_shared_lock;
pthread_key_t g_ring_key;

// Loader sections in flight, counted in shards (by thread) so that threads
// do not contend on one cache line; g_forking turns new sections away.
struct alignas(64) LoaderShard {
  std::atomic<int64_t> inside{0};
};
constexpr int kLoaderShards = 32;
LoaderShard g_loader[kLoaderShards];
std::atomic<bool> g_forking{false};
__thread uint8_t tls_loader_shard __attribute__((tls_model("initial-exec")));

// Sampled host mode: which live addresses were sampled, so that their frees
// are recorded. A counting filter answers "certainly not sampled" for almost
// every free without touching the locked set.
constexpr size_t kFilterSlots = 1u << 16;  // small enough to stay in cache
// Behind each slot of the filter, its word (sampled_set.h: slot_word).
std::atomic<uint64_t>* g_slot_words = nullptr;
constexpr int kSampledShards = 16;
struct alignas(64) SampledShard {
  SpinLock lock;
  AddressSet set;
};
SampledShard g_sampled[kSampledShards];

size_t shard_of(uintptr_t addr) { return ((addr >> 4) * 0xff51afd7ed558ccdull) >> 60; }

uint64_t next_random(ThreadState& t) {
  if (t.rng == 0) t.rng = 0x853c49e6748fea9bull ^ (static_cast<uint64_t>(syscall(SYS_gettid)) << 17) ^ monotonic_ns();
  t.rng ^= t.rng << 13;
  t.rng ^= t.rng >> 7;
  t.rng ^= t.rng << 17;
  return t.rng;
}

// Bytes until the next sample: exponential with the configured mean, as a
// Poisson process over allocated bytes (tcmalloc, heapprofd).
int64_t next_sample_distance(ThreadState& t, uint64_t mean) {
  double u = (static_cast<double>(next_random(t) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  double d = -std::log(u) * static_cast<double>(mean);
  if (d < 1) d = 1;
  return static_cast<int64_t>(d);
}

void ring_key_destructor(void* value) {
  // The thread is exiting. Its ring is drained by the writer and reused;
  // anything this thread still allocates goes to the shared ring.
  auto* ring = static_cast<ThreadRing*>(value);
  ThreadState& t = tls_state;
  t.status = 2;
  t.ring = nullptr;
  if (ring != nullptr) ring->state.store(static_cast<int>(RingState::kRetired), std::memory_order_release);
}

// `capacity`: the slots it uses (ThreadRing::mask).
ThreadRing* map_ring(uint32_t capacity) {
  void* mem = mmap(nullptr, sizeof(ThreadRing), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return nullptr;
  // Default-initialised, not value-initialised: the events stay untouched
  // (mmap gives zero pages) instead of zeroing 1.8 MB page by page in every
  // process and thread, which made up most of a short process's start-up.
  auto* ring = new (mem) ThreadRing;
  ring->mask = capacity - 1;
  return ring;
}

uintptr_t g_self_anchor;

int find_self(dl_phdr_info* info, size_t, void* data) {
  auto* range = static_cast<std::pair<uintptr_t, uintptr_t>*>(data);
  const uintptr_t anchor = reinterpret_cast<uintptr_t>(&g_self_anchor);
  const uintptr_t code = reinterpret_cast<uintptr_t>(&find_self);
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  bool mine = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    uintptr_t begin = info->dlpi_addr + ph.p_vaddr;
    uintptr_t end = begin + ph.p_memsz;
    if ((code >= begin && code < end) || (anchor >= begin && anchor < end)) mine = true;
    if (begin < lo) lo = begin;
    if (end > hi) hi = end;
  }
  if (!mine) return 0;
  range->first = lo;
  range->second = hi;
  return 1;
}

HostMode parse_host_mode(const char* text) {
  if (text == nullptr) return HostMode::kSampled;
  if (strcmp(text, "full") == 0) return HostMode::kFull;
  if (strcmp(text, "off") == 0) return HostMode::kOff;
  return HostMode::kSampled;
}

uint64_t parse_u64_env(const char* name, uint64_t fallback) {
  const char* text = getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  unsigned long long v = strtoull(text, &end, 10);
  return (end && *end == '\0') ? v : fallback;
}

void message(const char* text) {
  char line[1024];
  int n = snprintf(line, sizeof line, "memledger: %s\n", text);
  if (n > 0) {
    ssize_t ignored = ::write(STDERR_FILENO, line, static_cast<size_t>(n) < sizeof line ? n : sizeof line - 1);
    (void)ignored;
  }
}

}  // namespace

uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t coarse_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}


void Recorder::start() {
  HookGuard guard;
  pid_ = getpid();
  config_.host_mode = parse_host_mode(getenv("MEMLEDGER_HOST"));
  config_.sample_interval = parse_u64_env("MEMLEDGER_SAMPLE_INTERVAL", config_.sample_interval);
  if (config_.sample_interval == 0) config_.sample_interval = 1;
  config_.stack_depth = static_cast<uint32_t>(parse_u64_env("MEMLEDGER_STACK_DEPTH", config_.stack_depth));
  if (config_.stack_depth > StackTable::kMaxNativeDepth) config_.stack_depth = StackTable::kMaxNativeDepth;
  if (const char* interval = getenv("MEMLEDGER_STEP_INTERVAL")) config_.step_interval_s = atof(interval);
  // Steps chosen on the command line rule out loader steps from the start.
  config_.steps_chosen =
      config_.step_interval_s > 0 || getenv("MEMLEDGER_STEPS_NVTX") || getenv("MEMLEDGER_STEPS_KERNEL");
  other_steps_.store(config_.steps_chosen, std::memory_order_relaxed);
  if (config_.step_interval_s < 0.001) config_.step_interval_s = 0;

  const char* dir = getenv("MEMLEDGER_DIR");
  if (dir != nullptr && *dir != '\0') {
    snprintf(config_.dir, sizeof config_.dir, "%s", dir);
  } else {
    // Raw LD_PRELOAD without `memledger run`: a run folder in the working
    // directory, shared with the children through the environment.
    time_t now = time(nullptr);
    struct tm tm;
    localtime_r(&now, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(config_.dir, sizeof config_.dir, "memledger-%s-%d", stamp, pid_);
    setenv("MEMLEDGER_DIR", config_.dir, 0);
  }

  // The allocator the hooks forward to (looked up by the first allocation
  // if one came before this constructor), named for the trace header.
  next_resolved();
  AllocatorInfo allocator;
  identify_allocator(allocator);

  std::pair<uintptr_t, uintptr_t> self{0, 0};
  dl_iterate_phdr(find_self, &self);
  self_begin_ = self.first;
  self_end_ = self.second;

  pthread_key_create(&g_ring_key, ring_key_destructor);
  // The shared ring takes the events of every thread without a ring of its own.
  shared_ring_ = map_ring(ThreadRing::kCapacity);
  if (shared_ring_ == nullptr || !stacks_.init() || !python_frames().init()) {
    disable("cannot map memory for the recorder; tracing is off");
    return;
  }
  shared_ring_->state.store(static_cast<int>(RingState::kShared), std::memory_order_relaxed);
  rings_.store(shared_ring_, std::memory_order_release);
  if (config_.host_mode == HostMode::kSampled) {
    // The filter, then its slots' words (pages of it are backed only where
    // a sample was taken).
    const size_t bytes = kFilterSlots + kFilterSlots * sizeof(uint64_t);
    void* filter = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (filter != MAP_FAILED) {
      sampled_filter_ = static_cast<std::atomic<uint8_t>*>(filter);
      g_slot_words = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<uint8_t*>(filter) + kFilterSlots);
    }
    sample_below_ = config_.sample_interval;
  }

  const char* writer_stacks = getenv("MEMLEDGER_WRITER_STACKS");
  writer_stacks_ = writer_stacks == nullptr || strcmp(writer_stacks, "0") != 0;
  unw_set_caching_policy(unw_local_addr_space, UNW_CACHE_PER_THREAD);
  if (!unwinder_configure(getenv("MEMLEDGER_UNWINDER"))) {
    message("MEMLEDGER_UNWINDER is not one of fast, libunwind, check: using fast");
    unwinder_configure("fast");
  }
  // A Python executable (or its libpython) is loaded by now; an embedded
  // interpreter loaded later is found by the writer when modules change.
  const char* python = getenv("MEMLEDGER_PYTHON_FRAMES");
  if (python != nullptr && strcmp(python, "0") == 0) {
    python_frames().turn_off();
  } else if (config_.stack_depth != 0) {
    const char* attribute = getenv("MEMLEDGER_PYTHON_ATTRIBUTE");
    if (attribute != nullptr && strcmp(attribute, "0") == 0) python_frames().no_attribution();
    python_frames().detect();
  }

  char error[4400];
  if (!trace_writer().open(config_, TraceWriter::ForkOrigin{}, error, sizeof error)) {
    // Said once for a whole process tree: the images this one starts find
    // their folder in MEMLEDGER_DIR_FAILED and stay quiet about it.
    const char* told = getenv("MEMLEDGER_DIR_FAILED");
    if (told != nullptr && strcmp(told, config_.dir) == 0) {
      disable_reported_.store(true);
    } else {
      setenv("MEMLEDGER_DIR_FAILED", config_.dir, 1);
    }
    char text[4600];
    snprintf(text, sizeof text, "%s; tracing is off for pid %d, the program goes on", error, pid_);
    disable(text);
    return;
  }
  trace_writer().scan_modules_at_start();
  install_signal_handlers();
  pthread_atfork([] { recorder().before_fork(); }, [] { recorder().after_fork_parent(); },
                 [] { recorder().after_fork_child(); });
  if (!trace_writer().start_thread()) {
    disable("cannot start the writer thread; tracing is off, the program goes on");
    return;
  }
  lifecycle_.store(Lifecycle::kActive, std::memory_order_release);
  update_host_fast();
}

void Recorder::finish() {
  Lifecycle state = lifecycle_.load(std::memory_order_acquire);
  if (state != Lifecycle::kActive) return;
  HookGuard guard;
  // Keep recording what the remaining destructors free until the writer's
  // last cycle; then hooks pass through.
  trace_writer().stop();
  lifecycle_.store(Lifecycle::kFinished, std::memory_order_release);
  update_host_fast();
  if (unwinder_checking()) {
    uint64_t checked, handed_over, differed;
    unwinder_check_counts(&checked, &handed_over, &differed);
    char text[200];
    snprintf(text, sizeof text, "unwinder check (pid %d): %llu stacks, %llu handed to libunwind, %llu differed",
             static_cast<int>(pid_), static_cast<unsigned long long>(checked),
             static_cast<unsigned long long>(handed_over), static_cast<unsigned long long>(differed));
    message(text);
  }
}

void Recorder::disable(const char* why) {
  lifecycle_.store(Lifecycle::kDisabled, std::memory_order_release);
  update_host_fast();
  if (!disable_reported_.exchange(true)) message(why);
}

ThreadRing* Recorder::acquire_ring(ThreadState& t) {
  if (t.status == 2) return nullptr;
  bool retired = false;
  for (ThreadRing* ring = rings(); ring != nullptr; ring = ring->next) {
    int expected = static_cast<int>(RingState::kFree);
    const int state = ring->state.load(std::memory_order_relaxed);
    retired |= state == static_cast<int>(RingState::kRetired);
    if (state == expected &&
        ring->state.compare_exchange_strong(expected, static_cast<int>(RingState::kOwned))) {
      // The last thread's walks kept beyond the eight: gone, their pages
      // handed back (a ring starts again at its first slot, and so do they).
      unwinder_release_kept(ring->unwind_memo);
      t.ring = ring;
      break;
    }
  }
  if (t.ring == nullptr) {
    // Threads that start and end faster than the writer's long wait (10
    // ms) would each map a ring while the rings of those that ended wait
    // to be drained: the writer is woken to free them for the next ones.
    if (retired) trace_writer().nudge();
    // Sampled mode at its usual intervals records few events; one that
    // samples every few KiB records nearly as many as full mode.
    const bool few_events = config_.host_mode != HostMode::kFull && config_.sample_interval >= (64u << 10);
    ThreadRing* ring = map_ring(few_events ? ThreadRing::kSampledCapacity : ThreadRing::kCapacity);
    if (ring == nullptr) return nullptr;
    ring->state.store(static_cast<int>(RingState::kOwned), std::memory_order_relaxed);
    ThreadRing* head = rings_.load(std::memory_order_acquire);
    do {
      ring->next = head;
    } while (!rings_.compare_exchange_weak(head, ring, std::memory_order_acq_rel));
    t.ring = ring;
  }
  t.ring->tid.store(static_cast<pid_t>(syscall(SYS_gettid)), std::memory_order_relaxed);
  t.status = 1;
  pthread_setspecific(g_ring_key, t.ring);
  return t.ring;
}

void Recorder::lock_shared() { g_shared_lock.lock(); }
void Recorder::unlock_shared() { g_shared_lock.unlock(); }

namespace {

// How far a thread's events may run ahead of the writer before the thread
// is held back: a SIGKILL loses what is not written, and DESIGN.md promises
// at most 100 ms of it. A few threads allocating without pause in full mode
// fill a ring (32 Ki events) in a few milliseconds; the writer then took
// 100 ms and more (on a busy machine) to write the 128 Ki events of four
// full rings, and a step marker waited behind them. Held back at 8 Ki
// events or 20 ms, the program runs at the writer's pace with a backlog of
// milliseconds. (At 4 Ki, one thread allocating without pause was held
// back at every compressed frame the writer made, a millisecond each.)
// One or two threads allocating share 24 Ki events between them, which
// three threads had: one thread held back at 8 Ki spent a fifth of its
// time waiting (bench/storm, full mode), at 24 Ki a twentieth.
// A ring of sampled mode (ThreadRing::kSampledCapacity) holds its thread
// back at three quarters of its slots instead.
constexpr uint64_t kSoftCapacity = 8192;
constexpr uint64_t kSharedBacklog = 3 * kSoftCapacity;
// A full-size ring holds every soft capacity (behind()).
static_assert(kSharedBacklog <= ThreadRing::kCapacity - ThreadRing::kCapacity / 4);
// A quarter of that wakes a writer in a long wait: it drains while the
// program goes on, where it otherwise often began only once the program
// was held back, and the two took turns.
constexpr uint64_t kWakeAt = kSoftCapacity / 4;

// The backlog a ring may hold when `allocating` threads allocate without
// pause (Recorder::allocating_threads).
inline uint64_t soft_capacity(uint32_t allocating) {
  return std::max<uint64_t>(kSoftCapacity, kSharedBacklog / std::max<uint32_t>(allocating, 1));
}
constexpr uint64_t kMaxLagNs = 20'000'000;
constexpr uint64_t kMaxHoldNs = 50'000'000;  // per check: a stalled writer costs little

bool behind(const ThreadRing* ring, uint64_t head, uint64_t tail, uint64_t now) {
  // Three quarters of a ring of kCapacity is the largest soft capacity
  // (kSharedBacklog): only a smaller ring (sampled mode's) is held back
  // sooner for its size.
  const uint64_t room = ring->capacity() - ring->capacity() / 4;
  if (head - tail >= std::min(soft_capacity(recorder().allocating_threads()), room)) return true;
  const Event& oldest = ring->slot(tail);
  // CUPTI records carry the time CUPTI gave them: only the tracer's own clock counts.
  return oldest.type < EventType::kCuptiStatus && oldest.ts <= now && now - oldest.ts >= kMaxLagNs;
}

void hold_back_if_behind(ThreadRing* ring, uint64_t head) {
  const uint64_t first_tail = ring->tail.load(std::memory_order_acquire);
  const uint64_t start = coarse_ns();
  if (first_tail == head || !behind(ring, head, first_tail, start) || !trace_writer().draining()) return;
  trace_writer().wake();
  for (;;) {
    timespec pause = {0, 50'000};
    nanosleep(&pause, nullptr);
    // The writer drains a ring whole: any progress means it has caught up.
    if (ring->tail.load(std::memory_order_acquire) != first_tail || coarse_ns() - start >= kMaxHoldNs) return;
  }
}

}  // namespace

// Fills the next slot of the thread's ring in place and publishes it:
// `fill` writes every field but seq, ts and tid. `seq` is the event's
// number when it has one already, else 0: it is numbered here, before the
// slot is written (a locked instruction waits for the stores before it, and
// the ring's lines are seldom in cache). Built in the slot, the event is not
// copied there from the stack: that copy's wide loads of fields just stored
// one by one wait for the stores to drain (no store forwarding).
// Returns the event's number, 0 when it was dropped.
template <typename Fill>
uint64_t Recorder::push_in_place(ThreadState& t, uint64_t seq, Fill&& fill) {
  ThreadRing* ring = t.ring;
  if (ring == nullptr) ring = acquire_ring(t);
  const bool shared = ring == nullptr;
  if (shared) {
    ring = shared_ring_;
    g_shared_lock.lock();
  }
  uint64_t head = ring->head.load(std::memory_order_relaxed);
  const uint64_t tail = ring->tail.load(std::memory_order_acquire);
  if (head - tail >= ring->capacity()) {
    // Full: give the writer up to ~10 ms to catch up, then count a drop.
    trace_writer().wake();
    if (!wait_until([&] { return head - ring->tail.load(std::memory_order_acquire) < ring->capacity(); },
                    2000, 5000)) {
      ring->dropped.fetch_add(1, std::memory_order_relaxed);
      if (shared) g_shared_lock.unlock();
      return 0;
    }
  } else if (!shared && (head & 63) == 0) {
    if (head - tail >= kWakeAt) trace_writer().nudge();
    hold_back_if_behind(ring, head);
  }
  // A free recorded after its real call took its number before that call
  // (see on_device_free); everything else is numbered here.
  if (seq == 0) seq = next_seq();
  Event& slot = ring->slot(head);
  fill(slot);
  slot.seq = seq;
  // Allocation times need no more than millisecond precision (the order is
  // the sequence number); the coarse clock costs a few nanoseconds.
  // CUPTI's records bring their own time and fields (event_ring.h).
  if (slot.type < EventType::kCuptiStatus) {
    slot.ts = slot.type == EventType::kStep ? monotonic_ns() : coarse_ns();
    slot.tid = shared ? static_cast<uint32_t>(syscall(SYS_gettid))
                      : static_cast<uint32_t>(ring->tid.load(std::memory_order_relaxed));
  }
  ring->head.store(head + 1, std::memory_order_release);
  if (shared) g_shared_lock.unlock();
  return seq;
}

bool Recorder::push(ThreadState& t, Event& event) {
  const uint64_t seq = push_in_place(t, event.seq, [&event](Event& slot) { slot = event; });
  if (seq == 0) return false;
  event.seq = seq;
  return true;
}

bool Recorder::enter_loader_section() {
  if (tls_loader_shard == 0) {
    tls_loader_shard = static_cast<uint8_t>(1 + static_cast<unsigned>(syscall(SYS_gettid)) % kLoaderShards);
  }
  std::atomic<int64_t>& inside = g_loader[tls_loader_shard - 1].inside;
  // seq_cst on both sides: either this thread sees the fork coming, or the
  // forking thread sees this section.
  inside.fetch_add(1, std::memory_order_seq_cst);
  if (g_forking.load(std::memory_order_seq_cst)) {
    inside.fetch_sub(1, std::memory_order_seq_cst);
    return false;
  }
  return true;
}

void Recorder::leave_loader_section() {
  g_loader[tls_loader_shard - 1].inside.fetch_sub(1, std::memory_order_release);
}

uint32_t Recorder::capture_stack(size_t skip_extra, bool with_python, const void* hook_frame, bool may_spill) {
  if (config_.stack_depth == 0) return 0;  // stacks off (benchmarks, or by choice)
  // Python frames first (innermost first), then the native frames.
  uintptr_t words[PythonFrames::kMaxFrames + StackTable::kMaxNativeDepth + 16];
  // The thread's own ring holds its caches and unwind memo (threads without one go without).
  ThreadState& t = tls_state;
  ThreadRing* own = t.status == 1 ? t.ring : nullptr;
  const uint32_t python =
      with_python ? python_frames().capture(words, PythonFrames::kMaxFrames, own != nullptr ? &own->code_cache : nullptr)
                  : 0;
  void** frames = reinterpret_cast<void**>(words + python);
  const int want = static_cast<int>(config_.stack_depth + skip_extra);
  int n = 0;
  // memledger's own frames (the hook, this function) are left out.
  static constexpr LoaderAccess kLoader = {[] { return recorder().enter_loader_section(); },
                                           [] { recorder().leave_loader_section(); }};
  uint32_t serial = 0;
  // Native frames alone: the walk may find the stack this thread made of
  // it last (walk_stacks, below) and leave the frames unwritten.
  WalkReuse reuse{own != nullptr ? own->walk_stacks : nullptr, static_cast<uint64_t>(skip_extra) << 37, 0};
  const bool may_reuse = own != nullptr && python == 0 && skip_extra < 8;
  n = fast_backtrace(frames, want, self_begin_, self_end_, own != nullptr ? &own->unwind_memo : nullptr, &kLoader,
                     &serial, hook_frame, may_reuse ? &reuse : nullptr);
  if (reuse.reused != 0) return static_cast<uint32_t>(reuse.reused >> 40);
  const int first = static_cast<int>(skip_extra);
  uint32_t depth = first < n ? static_cast<uint32_t>(n - first) : 0;
  if (depth > config_.stack_depth) depth = config_.stack_depth;
  if (python + depth == 0) return 0;
  // Native frames alone, from a memo walk: the stack is kept under the
  // walk's key, for the walk to find next time (WalkReuse).
  uint64_t key = 0;
  volatile uint64_t* made = nullptr;
  if (own != nullptr) made = &own->walk_stacks[own->unwind_memo.made % (UnwindMemo::kWalks + UnwindMemo::kKnown)];
  if (made != nullptr && may_reuse && serial != 0 && n < 512) {
    key = walk_key(serial, static_cast<uint32_t>(n), static_cast<uint64_t>(skip_extra) << 37);
  }
  if (first > 0) memmove(words + python, words + python + first, depth * sizeof(uintptr_t));
  // A stack with Python frames, in full mode: left to the writer to intern.
  if (python > 0 && may_spill && own != nullptr) {
    if (const uint32_t marker = spill(*own, words, python + depth, python)) {
      if (made != nullptr) *made = 0;
      return marker;
    }
  }
  const uint32_t id = stacks_.intern(words, python + depth, python, own != nullptr ? &own->path_cache : nullptr);
  // Always replaced, also by a stack it cannot describe. A slot's word is
  // written at every stack made from its walk, so it holds the serial of
  // the slot's walk or of one shortly before (a signal handler's walk on
  // this thread may move `current` between the walk and the line above):
  // every serial the memo hands out is within 2^27 walks of its newest, so
  // their low 28 bits tell the walks apart.
  if (made != nullptr) *made = key != 0 && id != 0 && id < (1u << 24) ? key | static_cast<uint64_t>(id) << 40 : 0;
  return id;
}

__attribute__((noinline)) uint32_t Recorder::spill(ThreadRing& own, const uintptr_t* words, uint32_t depth,
                                                    uint32_t python) {
  // Only a thread's own Python frames: a thread that never ran Python
  // (attributed frames: a thread pool's worker) keeps its buffer's pages
  // untouched.
  StackSpill& spill = own.spill;
  if (!writer_stacks_ || (words[0] & format::kPythonAttributedBit) != 0 || spill.busy != 0) return 0;
  // One of the thread's recent stacks (as intern() would find it first).
  const uint64_t hash = StackTable::words_hash(words, depth, python);
  if (const uint32_t id = stacks_.recent(words, depth, python, hash, &own.path_cache)) return id;
  // Busy until the caller pushed the event (a signal handler that
  // allocates meanwhile interns its own stack): stacks lie in the buffer
  // in the order of their events.
  spill.busy = 1;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  // A stack spilled lately that the writer has interned since: its id is
  // read back, and the stack joins the thread's recent ones. A loop meets
  // its stacks again and again; only the first time costs the writer.
  StackSpill::Seen& seen = spill.seen[hash >> 56 & (StackSpill::kSeen - 1)];
  bool waiting = false;
  if (seen.hash == hash) {
    if (const uint32_t id = spill.known(seen.at, words, depth, python, &waiting)) {
      std::atomic_signal_fence(std::memory_order_seq_cst);
      spill.busy = 0;
      stacks_.remember(words, depth, python, hash, id, &own.path_cache);
      return id;
    }
  }
  uint64_t at = 0;
  uint32_t marker = spill.put(words, depth, python, &at);
  if (marker == 0) marker = spill_when_room(spill, words, depth, python, &at);
  if (marker == 0) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
    spill.busy = 0;
    return 0;
  }
  // A stack met again before the writer came to its first copy: it is
  // spilled again, and the first copy, which the writer reaches sooner,
  // stays the one to read its id from.
  if (!waiting) seen = {hash, at};
  // Half full: the writer, if in its long wait, comes now.
  if (spill.used() > StackSpill::kWords / 2) trace_writer().nudge();
  return marker;
}

// The thread's buffer of stacks is full: the writer is behind, interning
// the stacks before. The thread waits for room, as long as the writer
// makes some, rather than intern the stack itself beside the writer: the
// two then race to add the same new frames to the same parents and tables
// (on `import torch`, 7 MiB more of the stack table's indexes, most of it
// made twice). A writer that makes no room for a millisecond is not waited
// for again until the buffer is found with room.
uint32_t Recorder::spill_when_room(StackSpill& spill, const uintptr_t* words, uint32_t depth, uint32_t python,
                                   uint64_t* at) {
  if (spill.stalled || !trace_writer().draining()) return 0;
  trace_writer().wake();
  uint64_t tail = spill.tail.load(std::memory_order_acquire);
  uint64_t progress_at = coarse_ns();
  for (;;) {
    timespec pause = {0, 20'000};
    nanosleep(&pause, nullptr);
    if (const uint32_t marker = spill.put(words, depth, python, at)) return marker;
    const uint64_t now_tail = spill.tail.load(std::memory_order_acquire);
    const uint64_t now = coarse_ns();
    if (now_tail != tail) {
      tail = now_tail;
      progress_at = now;
    } else if (now - progress_at >= 1'000'000) {
      spill.stalled = 1;
      return 0;
    }
  }
}

// The filter's counter goes up before the slot's word and the set, and
// down after them: it never says "not sampled" of a sampled live address,
// nor does the word (slot_word::rules_out).
void Recorder::remember_sampled(uintptr_t addr) {
  if (sampled_filter_ == nullptr) return;
  const size_t slot = filter_slot(addr);
  std::atomic<uint8_t>& counter = sampled_filter_[slot];
  uint8_t v = counter.load(std::memory_order_relaxed);
  while (v != 255 && !counter.compare_exchange_weak(v, static_cast<uint8_t>(v + 1))) {
  }
  std::atomic<uint64_t>& word = g_slot_words[slot];
  uint64_t w = word.load(std::memory_order_relaxed);
  while (!word.compare_exchange_weak(w, slot_word::after_insert(w, addr), std::memory_order_release,
                                     std::memory_order_relaxed)) {
  }
  SampledShard& shard = g_sampled[shard_of(addr)];
  SpinGuard guard(shard.lock);
  shard.set.insert(addr);
}

bool Recorder::forget_sampled(uintptr_t addr) {
  if (sampled_filter_ == nullptr) return false;
  const size_t slot = filter_slot(addr);
  std::atomic<uint8_t>& counter = sampled_filter_[slot];
  if (counter.load(std::memory_order_relaxed) == 0) return false;
  std::atomic<uint64_t>& word = g_slot_words[slot];
  if (slot_word::rules_out(word.load(std::memory_order_acquire), addr)) return false;
  bool erased;
  {
    SampledShard& shard = g_sampled[shard_of(addr)];
    SpinGuard guard(shard.lock);
    erased = shard.set.erase(addr);
  }
  if (erased) {
    uint64_t w = word.load(std::memory_order_relaxed);
    while (!word.compare_exchange_weak(w, slot_word::after_erase(w), std::memory_order_release,
                                       std::memory_order_relaxed)) {
    }
    uint8_t v = counter.load(std::memory_order_relaxed);
    while (v != 0 && v != 255 && !counter.compare_exchange_weak(v, static_cast<uint8_t>(v - 1))) {
    }
  }
  return erased;
}

void Recorder::read_host_totals(Event& e) const {
  int64_t live = 0;
  uint64_t allocs = 0, frees = 0;
  for (ThreadRing* ring = rings(); ring != nullptr; ring = ring->next) {
    live += ring->host_live.load(std::memory_order_relaxed);
    allocs += ring->host_allocs.load(std::memory_order_relaxed);
    frees += ring->host_frees.load(std::memory_order_relaxed);
  }
  e.addr = static_cast<uint64_t>(live);
  e.weight = (allocs << 32) | (frees & 0xffffffffu);
}

void Recorder::add_totals_without_ring(ThreadState& t, size_t usable, bool alloc) {
  if (ThreadRing* ring = acquire_ring(t)) {
    alloc ? count_own_alloc(ring, usable) : count_own_free(ring, usable);
    return;
  }
  // The shared ring has many writers.
  const int64_t bytes = static_cast<int64_t>(usable);
  shared_ring_->host_live.fetch_add(alloc ? bytes : -bytes, std::memory_order_relaxed);
  (alloc ? shared_ring_->host_allocs : shared_ring_->host_frees).fetch_add(1, std::memory_order_relaxed);
}

namespace {

// Every field of a host event but seq, ts and tid (Recorder::push_in_place).
inline void fill_host_event(Event& e, EventType type, uint8_t flags, uint64_t addr, uint64_t size,
                            uint64_t weight, uint32_t stack) {
  e.addr = addr;
  e.size = size;
  e.weight = weight;
  e.stack = stack;
  e.aux = 0;
  e.type = type;
  e.kind = static_cast<uint8_t>(format::Kind::kHost);
  e.flags = flags;
  e.source = 0;
}

}  // namespace

// The countdown of sampled mode reached zero: the allocation is sampled,
// unless this is the thread's first, which draws its first distance.
void Recorder::countdown_reached(ThreadState& t, uintptr_t addr, size_t size, const void* hook_frame) {
  if (!t.counting) {
    t.counting = 1;
    t.sample_countdown += next_sample_distance(t, config_.sample_interval);
    if (t.sample_countdown > 0) return;
  }
  t.sample_countdown = next_sample_distance(t, config_.sample_interval);
  record_host_alloc(t, addr, size, true, hook_frame);
}

__attribute__((noinline)) void Recorder::record_host_alloc(ThreadState& t, uintptr_t addr, size_t size,
                                                           bool by_chance, const void* hook_frame) {
  const bool sampled = config_.host_mode == HostMode::kSampled;
  uint64_t weight = size;
  if (by_chance) {
    // Unbiased: an allocation of `size` bytes is sampled with probability
    // 1 - exp(-size / interval).
    const double p = -std::expm1(-static_cast<double>(size) / static_cast<double>(config_.sample_interval));
    weight = static_cast<uint64_t>(std::llround(static_cast<double>(size) / p));
  }
  if (sampled) remember_sampled(addr);
  // Full mode: a stack with Python frames may be left to the writer to
  // intern (stack_spill.h).
  const uint32_t stack = capture_stack(0, true, hook_frame, !sampled);
  push_in_place(t, 0, [&](Event& e) {
    fill_host_event(e, EventType::kAlloc, sampled ? format::kAllocSampled : 0, addr, size, weight, stack);
  });
  if (StackSpill::is_marker(stack)) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
    t.ring->spill.busy = 0;
  }
  if (sampled) {
    // The exact totals beside each recorded allocation: the report corrects
    // its estimate at step ends that no marker carries (automatic steps).
    Event totals{};
    totals.type = EventType::kHostTotals;
    read_host_totals(totals);
    push(t, totals);
  }
}

void Recorder::free_if_sampled(ThreadState& t, uintptr_t addr) {
  if (forget_sampled(addr)) record_host_free(t, addr);
}

__attribute__((noinline)) void Recorder::record_host_free(ThreadState& t, uintptr_t addr) {
  push_in_place(t, 0, [addr](Event& e) { fill_host_event(e, EventType::kFree, 0, addr, 0, 0, 0); });
}

void Recorder::on_host_failed(ThreadState& t, size_t size, int error) {
  // Rare: recorded in every host mode, with its stack.
  Event e{};
  e.type = EventType::kAlloc;
  e.kind = static_cast<uint8_t>(format::Kind::kHost);
  e.size = size;
  e.weight = static_cast<uint64_t>(error);
  e.flags = format::kAllocFailed;
  e.stack = capture_stack();
  push(t, e);
}

void Recorder::on_device_alloc(ThreadState& t, format::Kind kind, int device, uint64_t addr, uint64_t size,
                               uint32_t flags, int error, uint32_t stack) {
  Event e{};
  e.type = EventType::kAlloc;
  e.kind = static_cast<uint8_t>(kind);
  e.aux = static_cast<uint32_t>(device < 0 ? 0 : device);
  e.addr = error ? 0 : addr;
  e.size = size;
  e.weight = error ? static_cast<uint64_t>(error) : size;
  e.flags = static_cast<uint8_t>(flags | (error ? format::kAllocFailed : 0));
  e.stack = stack != 0 ? stack : capture_stack();
  push(t, e);
  // An out-of-memory is the likely end of the run: make it durable now.
  if (error) {
    trace_writer().wake();
  } else {
    live_ledger().on_alloc(kind, flags, device, addr, size, e.seq);
  }
}

void Recorder::on_device_free(ThreadState& t, format::Kind kind, uint64_t addr, uint32_t flags, uint64_t seq) {
  live_ledger().on_free(kind, flags, addr, seq);
  Event e{};
  e.seq = seq;
  e.type = EventType::kFree;
  e.kind = static_cast<uint8_t>(kind);
  e.addr = addr;
  e.flags = static_cast<uint8_t>(flags);
  push(t, e);
}

void Recorder::on_mapped_alloc(ThreadState& t, uint64_t addr, uint64_t size, uint32_t stack) {
  Event e{};
  e.type = EventType::kAlloc;
  e.kind = static_cast<uint8_t>(format::Kind::kMapped);
  e.addr = addr;
  e.size = size;
  e.weight = size;
  e.stack = stack;
  push(t, e);
}

void Recorder::on_mapped_free(ThreadState& t, uint64_t addr) {
  Event e{};
  e.type = EventType::kFree;
  e.kind = static_cast<uint8_t>(format::Kind::kMapped);
  e.addr = addr;
  push(t, e);
}

void Recorder::on_device_event(ThreadState& t, EventType type, int device, uint64_t addr, uint64_t size,
                               uint64_t extra, uint64_t seq) {
  Event e{};
  e.seq = seq;
  e.type = type;
  e.kind = static_cast<uint8_t>(format::Kind::kDevice);
  e.aux = static_cast<uint32_t>(device < 0 ? 0 : device);
  e.addr = addr;
  e.size = size;
  e.weight = extra;
  if (type == EventType::kReserve) e.stack = capture_stack();
  if (type == EventType::kPoolSample) live_ledger().on_pool_sample(device, addr, size);
  push(t, e);
}

void Recorder::read_live(struct memledger_live& out) const {
  if (!active()) return;
  out.flags = MEMLEDGER_LIVE_TRACING;
  if (config_.host_mode != HostMode::kOff) out.flags |= MEMLEDGER_LIVE_HOST;
  if (config_.host_mode == HostMode::kSampled) out.flags |= MEMLEDGER_LIVE_HOST_SAMPLED;
  out.seq = seq_.load(std::memory_order_relaxed);
  out.steps = step_index_.load(std::memory_order_relaxed);
  LiveLedger::Totals totals;
  live_ledger().read(totals);
  // The ABI's four kinds (memledger.h); mapped memory is not among them.
  for (size_t k = 0; k < sizeof out.live / sizeof out.live[0]; ++k) {
    out.live[k] = totals.live[k];
    out.held[k] = totals.held[k];
  }
  int64_t host_live = 0;
  for (ThreadRing* ring = rings(); ring != nullptr; ring = ring->next) {
    host_live += ring->host_live.load(std::memory_order_relaxed);
  }
  out.live[static_cast<int>(format::Kind::kHost)] = host_live;
  // As the trace's samples read it (trace_writer.cpp); the allocator's own
  // statistics may allocate, which is not the program's memory.
  uint64_t held = 0, in_use = 0;
  {
    HookGuard guard;
    allocator_heap_stats(&held, &in_use);
  }
  out.held[static_cast<int>(format::Kind::kHost)] = held;
  out.gpus = totals.gpus;
  for (int d = 0; d < LiveLedger::kMaxGpus; ++d) {
    out.device_live[d] = totals.device_live[d];
    out.device_held[d] = totals.device_held[d];
  }
}

void Recorder::on_step(const char* label, format::StepSource source) {
  if (!active()) return;
  // Loader steps stand in for markers; they are not mixed with another
  // source, which the program or the command line chose.
  if (source == format::StepSource::kLoader) {
    if (other_steps_.load(std::memory_order_relaxed)) return;
  } else if (!other_steps_.load(std::memory_order_relaxed)) {
    other_steps_.store(true, std::memory_order_relaxed);
  }
  // Device samples from the program's own thread: markers and NVTX ranges
  // (a kernel step is seen inside a CUPTI callback, the writer thread times
  // interval steps).
  if (step_hook_ != nullptr && (source == format::StepSource::kMarker || source == format::StepSource::kNvtx)) {
    step_hook_();
  }
  HookGuard guard;
  Event e{};
  e.type = EventType::kStep;
  e.size = step_index_.fetch_add(1, std::memory_order_relaxed) + 1;
  e.source = static_cast<uint8_t>(source);
  e.aux = intern_string(label);
  // The exact host totals at this moment: in sampled mode the step's end
  // values, which the writer's next sample would give only as late as it runs.
  read_host_totals(e);
  push(guard.thread(), e);
  if (source != format::StepSource::kInterval) trace_writer().wake();
}

void Recorder::on_info(const char* key, const char* value) {
  if (!active() || key == nullptr || *key == '\0') return;
  HookGuard guard;
  Event e{};
  e.type = EventType::kInfo;
  e.ts = monotonic_ns();
  e.aux = intern_string(key);
  e.stack = intern_string(value);
  push(guard.thread(), e);
}

void Recorder::flush_and_wait(int timeout_ms) {
  if (!active()) return;
  trace_writer().flush_and_wait(timeout_ms);
}

void Recorder::on_exit_status(int status) {
  if (!active() || getpid() != pid_) return;  // a vfork child shares our memory: stay out
  trace_writer().note_exit(status);
  trace_writer().flush_and_wait(2000);
}

void Recorder::on_exec(const char* path) {
  if (!active() || getpid() != pid_) return;  // a vfork child shares our memory: stay out
  trace_writer().note_exec(path);
  trace_writer().flush_and_wait(2000);
}

void Recorder::before_fork() {
  // No thread may hold the loader lock at the fork: turn new loader
  // sections away and wait (at most ~200 ms) for those in flight.
  g_forking.store(true, std::memory_order_seq_cst);
  wait_until(
      [] {
        int64_t inside = 0;
        for (LoaderShard& shard : g_loader) inside += shard.inside.load(std::memory_order_seq_cst);
        return inside <= 0;
      },
      20000, 10000);
  // Locks a thread other than this one may hold at the fork: the child
  // would inherit them held, by a thread it does not have.
  fork_held_locks().hold_all();
  // Keep the sampled-address shards consistent across the fork.
  for (SampledShard& shard : g_sampled) shard.lock.lock();
  g_shared_lock.lock();
}

void Recorder::after_fork_parent() {
  trace_writer().note_fork();
  g_forking.store(false, std::memory_order_seq_cst);
  g_shared_lock.unlock();
  for (SampledShard& shard : g_sampled) shard.lock.unlock();
  fork_held_locks().release_all(false);
}

void Recorder::after_fork_child() {
  // Only this thread came along: no loader section is in flight here.
  for (LoaderShard& shard : g_loader) shard.inside.store(0, std::memory_order_relaxed);
  g_forking.store(false, std::memory_order_seq_cst);
  g_shared_lock.reset();
  for (SampledShard& shard : g_sampled) shard.lock.reset();
  fork_held_locks().release_all(true);
  live_ledger().reset_after_fork();
  graph_ledger().reset_after_fork();
  mapped_ledger().reset_after_fork();
  const pid_t parent = pid_;
  pid_ = getpid();
  if (lifecycle_.load(std::memory_order_acquire) != Lifecycle::kActive) return;
  HookGuard guard;
  ThreadState& t = guard.thread();
  // The child inherits the parent's heap: its exact host live bytes start
  // from the parent's at the fork, kept in this thread's ring (or the shared
  // one), and its frees of inherited blocks count against them.
  TraceWriter::ForkOrigin origin{parent, seq_.load(std::memory_order_relaxed), 0};
  for (ThreadRing* ring = rings(); ring != nullptr; ring = ring->next) {
    origin.host_live += ring->host_live.load(std::memory_order_relaxed);
  }
  ThreadRing* const keeper = t.ring != nullptr ? t.ring : shared_ring_;
  // The parent's pending events belong to the parent's trace.
  for (ThreadRing* ring = rings(); ring != nullptr; ring = ring->next) {
    ring->tail.store(ring->head.load(std::memory_order_relaxed), std::memory_order_relaxed);
    if (ring == t.ring) ring->spill.drop_pending();
    ring->dropped.store(0, std::memory_order_relaxed);
    ring->host_live.store(ring == keeper ? origin.host_live : 0, std::memory_order_relaxed);
    ring->host_allocs.store(0, std::memory_order_relaxed);
    ring->host_frees.store(0, std::memory_order_relaxed);
    if (ring != t.ring && ring != shared_ring_) {
      // Its thread did not come along, maybe in the middle of a walk or an
      // intern: the next thread to take the ring starts with an empty path
      // cache (a half-written one would give wrong ids) and a free memo (a
      // walk replaces one of the eight it holds only whole, and those kept
      // beyond them go when the ring is taken: acquire_ring).
      ring->path_cache.clear();
      ring->code_cache.clear();
      ring->spill.reset_to_start();
      for (volatile uint64_t& made : ring->walk_stacks) made = 0;
      ring->unwind_memo.busy = 0;
      ring->state.store(static_cast<int>(RingState::kFree), std::memory_order_relaxed);
    }
  }
  // The sampled addresses stay: the child records its frees of the sampled
  // blocks it inherited, which the report finds in the parent's live set at
  // the fork (fork_seq).
  step_index_.store(0, std::memory_order_relaxed);
  other_steps_.store(config_.steps_chosen, std::memory_order_relaxed);
  TraceWriter& writer = trace_writer();
  writer.reset_after_fork();
  char error[4400];
  if (!writer.open(config_, origin, error, sizeof error) || !writer.start_thread()) {
    char text[4600];
    snprintf(text, sizeof text, "%s; tracing is off for pid %d, the program goes on", error, pid_);
    disable(text);
  }
}

}  // namespace memledger::interposer
