// A tiny lock for rare, short critical sections (never on the per-event path).
// Unlike a pthread mutex it can be re-initialised in a forked child by plain
// assignment and holds no kernel state.
#pragma once

#include <atomic>
#include <sched.h>
#include <time.h>

namespace memledger::interposer {

// Asks `done()` until it holds, at most `pauses` times more after the
// first: the first 100 pauses give the processor up, the others sleep
// `sleep_ns`. Whether it held. For the short waits of rare moments (a
// fork, a full ring), never the per-event path.
template <typename Done>
bool wait_until(Done done, int pauses, long sleep_ns) {
  for (int i = 0; i < pauses; ++i) {
    if (done()) return true;
    if (i < 100) {
      sched_yield();
    } else {
      timespec pause = {0, sleep_ns};
      nanosleep(&pause, nullptr);
    }
  }
  return done();
}

class SpinLock {
 public:
  void lock() {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      while (flag_.load(std::memory_order_relaxed)) sched_yield();
    }
  }
  bool try_lock() { return !flag_.exchange(true, std::memory_order_acquire); }
  void unlock() { flag_.store(false, std::memory_order_release); }
  void reset() { flag_.store(false, std::memory_order_relaxed); }
  // Before fork(): takes the lock once the thread that holds it lets go,
  // waiting at most about 200 ms (a thread that never lets go, such as one
  // a signal handler stopped half way, must not stop the fork).
  void hold_for_fork() {
    held_for_fork_ = wait_until([this] { return try_lock(); }, 20000, 10000);
  }
  // After it: the parent unlocks it if hold_for_fork() took it; the child,
  // where no other thread came along, resets it either way.
  void release_after_fork(bool child) {
    if (child) {
      reset();
    } else if (held_for_fork_) {
      unlock();
    }
    held_for_fork_ = false;
  }

 private:
  std::atomic<bool> flag_{false};
  bool held_for_fork_ = false;  // by the forking thread, between the two
};

// memledger's locks that another thread of the program may hold at a
// fork(), where the child would inherit them held by a thread it does not
// have (the program's signal actions, the unwind-table pages to hand back,
// the CUDA virtual memory ledger, the CUDA pool table, the runtime
// functions found per caller, the next allocator's look-up, the CUPTI host
// table, the step labels): each registers itself once (add()), and
// Recorder::before_fork takes them all, each once its holder lets go
// (SpinLock::hold_for_fork), before the shared ring's lock, releasing them
// in both processes after.
class ForkHeldLocks {
 public:
  static constexpr int kMax = 16;
  // From a static initializer: the registry is constant-initialized, so
  // it is ready whatever the order of initialization.
  bool add(SpinLock* lock) {
    const int i = count_.fetch_add(1, std::memory_order_acq_rel);
    if (i >= kMax) return false;
    locks_[i].store(lock, std::memory_order_release);
    return true;
  }
  void hold_all() {
    for (int i = 0; i < registered(); ++i) {
      if (SpinLock* lock = locks_[i].load(std::memory_order_acquire)) lock->hold_for_fork();
    }
  }
  void release_all(bool child) {
    for (int i = registered(); i-- > 0;) {
      if (SpinLock* lock = locks_[i].load(std::memory_order_acquire)) lock->release_after_fork(child);
    }
  }

 private:
  int registered() const {
    const int n = count_.load(std::memory_order_acquire);
    return n < kMax ? n : kMax;
  }
  std::atomic<SpinLock*> locks_[kMax] = {};
  std::atomic<int> count_{0};
};

inline ForkHeldLocks& fork_held_locks() {
  static constinit ForkHeldLocks locks;
  return locks;
}

class SpinGuard {
 public:
  explicit SpinGuard(SpinLock& lock) : lock_(lock) { lock_.lock(); }
  ~SpinGuard() { lock_.unlock(); }
  SpinGuard(const SpinGuard&) = delete;
  SpinGuard& operator=(const SpinGuard&) = delete;

 private:
  SpinLock& lock_;
};

}  // namespace memledger::interposer
