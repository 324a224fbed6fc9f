// The recorder: what every hook calls. It owns the per-thread rings, the
// stack table, the sampling state and the process-level life cycle (start,
// fork, exec, exit); the TraceWriter does all encoding and I/O.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <sys/types.h>

#include "event_ring.h"
#include "stack_table.h"
#include "trace_format.h"

struct memledger_live;

namespace memledger::interposer {

enum class HostMode : uint8_t { kOff = 0, kSampled = 1, kFull = 2 };

struct Config {
  HostMode host_mode = HostMode::kSampled;
  uint64_t sample_interval = 128 * 1024;  // mean bytes between samples
  uint32_t stack_depth = 64;
  double step_interval_s = 0;  // 0: no time-based steps
  bool steps_chosen = false;   // --step-interval or --steps: no loader steps
  char dir[4096] = {};
};

// Per-thread state: initial-exec TLS, trivially destructible, so touching it
// never allocates and stays valid while TLS destructors run.
struct ThreadState {
  ThreadRing* ring;
  int64_t sample_countdown;
  uint64_t rng;
  uint8_t in_hook;     // recursion guard: set while inside memledger code
  uint8_t status;      // 0 new, 1 has ring, 2 exited (use the shared ring)
  uint8_t cuda_depth;  // inside a hooked CUDA runtime call: its driver calls are not recorded again
  uint8_t counting;    // sample_countdown has been drawn (sampled mode)
};

enum class Lifecycle : int {
  kUninitialised = 0,
  kActive = 1,
  kDisabled = 2,  // tracing stopped (error, or host mode off): hooks pass through
  kFinished = 3,  // the trace was closed at exit
};

class Recorder {
 public:
  // Called once from the library constructor.
  void start();
  // Called from the library destructor: final flush and close.
  void finish();

  bool host_enabled() const {
    return lifecycle_.load(std::memory_order_relaxed) == Lifecycle::kActive &&
           config_.host_mode != HostMode::kOff;
  }
  bool active() const { return lifecycle_.load(std::memory_order_relaxed) == Lifecycle::kActive; }
  const Config& config() const { return config_; }

  // Hot path, inline in every hook. `t` is the caller's ThreadState with
  // in_hook already set; `usable` is the block's usable size from the
  // allocator that made it. The thread's exact totals are counted here; in
  // sampled mode almost every call ends at the countdown (an allocation) or
  // at the counting filter (a free), before any call is made.
  void on_host_alloc(ThreadState& t, void* ptr, size_t size, size_t usable) {
    if (__builtin_expect(t.ring != nullptr, 1)) {
      count_own_alloc(t.ring, usable);
    } else {
      add_totals_without_ring(t, usable, true);
    }
    if (size < sample_below_) {
      t.sample_countdown -= static_cast<int64_t>(size);
      if (__builtin_expect(t.sample_countdown > 0, 1)) return;
      return countdown_reached(t, reinterpret_cast<uintptr_t>(ptr), size, __builtin_frame_address(0));
    }
    record_host_alloc(t, reinterpret_cast<uintptr_t>(ptr), size, false, __builtin_frame_address(0));
  }
  __attribute__((always_inline)) void on_host_free(ThreadState& t, void* ptr, size_t usable) {
    if (__builtin_expect(t.ring != nullptr, 1)) {
      count_own_free(t.ring, usable);
    } else {
      add_totals_without_ring(t, usable, false);
    }
    const uintptr_t addr = reinterpret_cast<uintptr_t>(ptr);
    if (sampled_filter_ != nullptr) {
      if (__builtin_expect(sampled_filter_[filter_slot(addr)].load(std::memory_order_relaxed) == 0, 1)) return;
      return free_if_sampled(t, addr);
    }
    if (config_.host_mode == HostMode::kSampled) return;  // no filter could be mapped: nothing was sampled
    record_host_free(t, addr);
  }
  // The hooks' short path (host_hooks.cpp, kHostFastC): an allocation or
  // free that goes no further than the thread's totals (the thread has a
  // ring; no sample is due; the block was never sampled) is counted, and
  // true returned. False: nothing was done, on_host_alloc or on_host_free
  // does it all. No call is made, and the recursion flag is not needed.
  bool count_alloc_only(ThreadState& t, size_t size, size_t usable) {
    ThreadRing* ring = t.ring;
    if (__builtin_expect(ring == nullptr || size >= sample_below_, 0)) return false;
    const int64_t left = t.sample_countdown - static_cast<int64_t>(size);
    if (__builtin_expect(left <= 0, 0)) return false;
    t.sample_countdown = left;
    count_own_alloc(ring, usable);
    return true;
  }
  bool count_free_only(ThreadState& t, uintptr_t addr, size_t usable) {
    ThreadRing* ring = t.ring;
    if (__builtin_expect(ring == nullptr || sampled_filter_ == nullptr, 0)) return false;
    if (__builtin_expect(sampled_filter_[filter_slot(addr)].load(std::memory_order_relaxed) != 0, 0)) return false;
    count_own_free(ring, usable);
    return true;
  }
  // A host allocation of `size` bytes failed with `error` (an errno value).
  void on_host_failed(ThreadState& t, size_t size, int error);

  // Device-side events (CUDA hooks). Every one is recorded with its stack:
  // they are rare and large. `error` != 0 records a failed allocation.
  // `stack`: an interned stack taken earlier (a graph allocation's capture
  // site); 0: the caller's, captured now.
  void on_device_alloc(ThreadState& t, format::Kind kind, int device, uint64_t addr, uint64_t size,
                       uint32_t flags, int error, uint32_t stack = 0);
  // A free is recorded only once the real call succeeded, with the sequence
  // number `seq` taken (next_seq) *before* that call: the address may be
  // handed out again by another thread's allocation in between, which then
  // comes after the free in sequence order. 0: numbered now.
  void on_device_free(ThreadState& t, format::Kind kind, uint64_t addr, uint32_t flags, uint64_t seq = 0);
  // Anonymous memory mapped outside the heap (mapped_hooks.cpp): recorded
  // in every host mode but off, never sampled; `stack` captured by the hook.
  void on_mapped_alloc(ThreadState& t, uint64_t addr, uint64_t size, uint32_t stack);
  void on_mapped_free(ThreadState& t, uint64_t addr);
  // Reserve/unreserve/map/unmap and device/pool samples (no stack except reserve).
  // `seq`: as for on_device_free (unmap, unreserve).
  void on_device_event(ThreadState& t, EventType type, int device, uint64_t addr, uint64_t size, uint64_t extra,
                       uint64_t seq = 0);

  void on_step(const char* label, format::StepSource source);
  // A fact about the software stack (format::Tag::kInfo): key and value.
  void on_info(const char* key, const char* value);
  // This process's live and held bytes now (memledger.h, memledger_live).
  void read_live(struct memledger_live& out) const;
  // Records an event built by the CUPTI module's bridge (cupti_bridge.cpp).
  void on_external_event(ThreadState& t, Event& event) { push(t, event); }
  // Called at every step end, before the step is recorded: lets the CUDA
  // hooks sample device memory from the program's own thread.
  void set_step_hook(void (*hook)()) { step_hook_ = hook; }
  // Asks the writer to write everything recorded so far and waits for it
  // (at most `timeout_ms`). Safe in signal handlers.
  void flush_and_wait(int timeout_ms);
  // The process is about to end by exit()/_exit() with this status.
  void on_exit_status(int status);
  void on_exec(const char* path);

  // Stops tracing for good, with one message on stderr. The program goes on.
  void disable(const char* why);

  uint64_t next_seq() { return seq_.fetch_add(1, std::memory_order_relaxed); }
  // `n` consecutive numbers, the first returned.
  uint64_t next_seqs(uint64_t n) { return seq_.fetch_add(n, std::memory_order_relaxed); }
  StackTable& stacks() { return stacks_; }
  ThreadRing* rings() const { return rings_.load(std::memory_order_acquire); }
  ThreadRing* shared_ring() { return shared_ring_; }
  // How many threads' rings held kBusyRingEvents or more at one of the
  // writer's drains in the last kBusyForNs: threads allocating without
  // pause (the backlog each may hold depends on it).
  static constexpr uint64_t kBusyRingEvents = 1024;
  static constexpr uint64_t kBusyForNs = 200'000'000;
  uint32_t allocating_threads() const { return allocating_threads_.load(std::memory_order_relaxed); }
  void set_allocating_threads(uint32_t n) { allocating_threads_.store(n, std::memory_order_relaxed); }
  uintptr_t self_begin() const { return self_begin_; }
  uintptr_t self_end() const { return self_end_; }
  pid_t pid() const { return pid_; }
  // Captures the caller's stack and interns it: the thread's Python frames
  // (python_frames.h) when `with_python`, then the native frames outside
  // memledger.
  // `hook_frame`: the frame of the hook that calls (its frame pointer), where
  // the walk starts instead of at this function's own frame.
  // `may_spill`: a stack with the thread's own Python frames may be left to
  // the writer (stack_spill.h); then the returned id is a
  // StackSpill::kMarker, the thread's ring's spill is busy, and the caller
  // pushes the event next, then clears StackSpill::busy.
  uint32_t capture_stack(size_t skip_extra = 0, bool with_python = true, const void* hook_frame = nullptr,
                         bool may_spill = false);
  uint32_t intern_string(const char* text);
  // The exact host counters of all threads into `e` (kStep, kHostTotals):
  // addr = live bytes, weight = allocations << 32 | frees (mod 2^32 each).
  void read_host_totals(Event& e) const;

  // A thread about to take glibc's loader lock (dl_iterate_phdr: libunwind's
  // unwinding, the writer's module scan) enters a loader section; false when
  // a fork is under way: skip the work. fork() waits for the sections in
  // flight, so that no thread holds that lock at the fork (the child would
  // inherit it locked and deadlock on its first unwind).
  bool enter_loader_section();
  void leave_loader_section();

  // fork() handlers.
  void before_fork();
  void after_fork_parent();
  void after_fork_child();

  // The shared ring's producer lock (threads without their own ring).
  void lock_shared();
  void unlock_shared();

 private:
  ThreadRing* acquire_ring(ThreadState& t);
  bool push(ThreadState& t, Event& event);
  template <typename Fill>
  uint64_t push_in_place(ThreadState& t, uint64_t seq, Fill&& fill);
  // A thread's own ring's totals: only its thread writes them, so plain
  // loads and stores suffice (no locked instruction on the hot path).
  static void count_own_alloc(ThreadRing* ring, size_t usable) {
    ring->host_live.store(ring->host_live.load(std::memory_order_relaxed) + static_cast<int64_t>(usable),
                          std::memory_order_relaxed);
    ring->host_allocs.store(ring->host_allocs.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  static void count_own_free(ThreadRing* ring, size_t usable) {
    ring->host_live.store(ring->host_live.load(std::memory_order_relaxed) - static_cast<int64_t>(usable),
                          std::memory_order_relaxed);
    ring->host_frees.store(ring->host_frees.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  // The counting filter's slot of an address (sampled mode): its 4 KiB page
  // within a 256 MiB region, the region's bits folded in. Nearby blocks
  // share a cache line of the filter (a heap of a few MiB reads a few dozen
  // lines), where a hash of every address sent each free to a line of its
  // own; the price is a free that shares its page with a sampled block
  // taking the slow path (few: samples are one in hundreds of KiB).
  static size_t filter_slot(uintptr_t addr) { return ((addr >> 12) ^ (addr >> 28)) & 0xffff; }
  // The parts of on_host_alloc and on_host_free kept out of line: a thread
  // without a ring of its own yet (it takes one) or any more (the shared
  // ring's totals), a countdown that reached zero, a free whose filter slot
  // is taken.
  void add_totals_without_ring(ThreadState& t, size_t usable, bool alloc);
  void countdown_reached(ThreadState& t, uintptr_t addr, size_t size, const void* hook_frame);
  void free_if_sampled(ThreadState& t, uintptr_t addr);
  // The recording itself. `by_chance`: sampled by the countdown (its weight
  // is the estimate).
  void record_host_alloc(ThreadState& t, uintptr_t addr, size_t size, bool by_chance, const void* hook_frame);
  void record_host_free(ThreadState& t, uintptr_t addr);
  // Leaves a stack of `words` to the writer to intern (capture_stack's
  // `may_spill`); returns its marker, its id when the thread knows it
  // already, or 0 when the thread interns it.
  uint32_t spill(ThreadRing& own, const uintptr_t* words, uint32_t depth, uint32_t python);
  // Puts a stack into the thread's full buffer once the writer makes room;
  // 0 when it makes none.
  static uint32_t spill_when_room(StackSpill& spill, const uintptr_t* words, uint32_t depth, uint32_t python,
                                  uint64_t* at);
  void remember_sampled(uintptr_t addr);
  bool forget_sampled(uintptr_t addr);

  Config config_;
  // Sampled mode: allocations below this size go through the countdown
  // (the sample interval; 0 in the other modes).
  uint64_t sample_below_ = 0;
  // Full mode: stacks with Python frames may be left to the writer to
  // intern (stack_spill.h); MEMLEDGER_WRITER_STACKS=0 keeps them here.
  bool writer_stacks_ = true;
  // Sampled mode: counts of the sampled live addresses by filter slot, so
  // that a free of an address never sampled is told apart at once.
  std::atomic<uint8_t>* sampled_filter_ = nullptr;
  std::atomic<Lifecycle> lifecycle_{Lifecycle::kUninitialised};
  // Written by every thread at each recorded event: on a cache line of its
  // own, away from what every hook reads.
  alignas(64) std::atomic<uint64_t> seq_{1};
  std::atomic<uint64_t> step_index_{0};
  // A step from any source but a data loader was recorded: loader steps stop.
  std::atomic<bool> other_steps_{false};
  std::atomic<ThreadRing*> rings_{nullptr};
  std::atomic<uint32_t> allocating_threads_{0};
  ThreadRing* shared_ring_ = nullptr;
  StackTable stacks_;
  uintptr_t self_begin_ = 0;
  uintptr_t self_end_ = 0;
  pid_t pid_ = 0;
  std::atomic<bool> disable_reported_{false};
  void (*step_hook_)() = nullptr;
};

extern Recorder g_recorder;
extern __thread ThreadState tls_state __attribute__((tls_model("initial-exec")));

inline Recorder& recorder() { return g_recorder; }
inline ThreadState& thread_state() { return tls_state; }

// Guards a hook: sets the recursion flag for the caller's thread.
class HookGuard {
 public:
  HookGuard() : t_(thread_state()), entered_(t_.in_hook == 0) { t_.in_hook = 1; }
  ~HookGuard() {
    if (entered_) t_.in_hook = 0;
  }
  bool entered() const { return entered_; }
  ThreadState& thread() { return t_; }

 private:
  ThreadState& t_;
  bool entered_;
};

uint64_t monotonic_ns();
uint64_t coarse_ns();

}  // namespace memledger::interposer
