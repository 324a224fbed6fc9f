// The writer thread: drains the per-thread rings, orders events, encodes
// records (trace_format.h), compresses and checksums frames, and writes them.
// It also takes the periodic samples (RSS, heap held, cgroup limit), emits
// time-based steps, keeps the module map current and updates the status file
// that `memledger run` shows. All I/O of the tracer happens here.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <sys/types.h>
#include <pthread.h>

namespace memledger::interposer {

struct Config;

// A crash or termination signal, handed from the signal handler to the writer.
struct SignalNote {
  std::atomic<int> pending{0};  // 0: none; 3: the handler is taking it; 1: it waits for the writer; 2: written
  int signo = 0;
  int code = 0;
  uint64_t fault_addr = 0;
  pid_t tid = 0;
  uint32_t stack = 0;
  uint64_t ts = 0;
};

// A file the tracer writes, kept out of the program's way. Its descriptor
// sits above a high floor (programs close 3..1023: daemons, data loaders,
// subprocess(close_fds=True) children), and before each write it is checked
// (fstat: same device and inode): a descriptor found closed, or reused by
// the program for a file of its own, is never written to or closed; the file
// is opened again by its path. (A close and reopen by another thread between
// the check and the write remains possible, in a window of microseconds.)
// Moves a descriptor of the tracer's above that floor (the old number is
// closed); returns the descriptor to use.
int move_fd_high(int fd);

class OwnedFile {
 public:
  // Takes over a descriptor just opened on `path`; `reopen_flags` open it
  // again. False (descriptor closed) if it cannot be examined.
  bool adopt(int fd, const char* path, int reopen_flags);
  // The descriptor, checked and opened again when needed; -1 when the file
  // is lost (or was never open). `size`, when given, gets the file's size.
  int verified(off_t* size = nullptr);
  // Closes the descriptor if it still is this file's.
  void close();
  // Forgets the descriptor without touching it (a forked child's copy).
  void forget() { fd_ = -1; }
  // Other threads ask too (flush requests): the writer thread changes fd_.
  bool is_open() const { return __atomic_load_n(&fd_, __ATOMIC_RELAXED) >= 0; }
  const char* path() const { return path_; }
  uint32_t reopened() const { return reopened_; }

 private:
  int fd_ = -1;
  int reopen_flags_ = 0;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  uint32_t reopened_ = 0;
  char path_[4200] = {};
};

class TraceWriter {
 public:
  // Creates the trace file in config.dir. On failure prints nothing and
  // returns false with `error` describing why.
  // A forked child names its parent's trace, the parent's sequence number at
  // the fork (the parent's records before it made the live set the child
  // inherited) and the exact host live bytes it inherited.
  struct ForkOrigin {
    pid_t parent = 0;
    uint64_t seq = 0;
    int64_t host_live = 0;
  };
  bool open(const Config& config, const ForkOrigin& origin, char* error, size_t error_size);
  // Records the loaded objects now, from the thread that opened the trace,
  // before start_thread(): a signal's note written before the writer's
  // first cycle read them still has them.
  void scan_modules_at_start();
  // Starts the writer thread, and the thread that reads the list of loaded
  // objects for it (without that one, the writer reads the list itself).
  bool start_thread();
  // Writes everything pending, the END record, and closes the file.
  void stop();

  // Wakes the writer and waits until everything recorded before the call is
  // in the file (or timeout). Async-signal-safe.
  void flush_and_wait(int timeout_ms);
  void wake();
  // wake(), if the writer is in a long wait for work and nobody woke it
  // since it began to (one load otherwise, no system call).
  void nudge() {
    if (waiting_.load(std::memory_order_relaxed) && waiting_.exchange(false, std::memory_order_acq_rel)) wake();
  }
  // The writer thread is there to drain the rings (not before it starts,
  // nor once stop() has begun).
  bool draining() const {
    return running_.load(std::memory_order_acquire) && !stopping_.load(std::memory_order_acquire) &&
           trace_.is_open();
  }

  // memledger's own threads in this process now: the writer and the module
  // thread, each while it runs.
  int own_threads() const {
    return (running_.load(std::memory_order_acquire) ? 1 : 0) +
           (modules_running_.load(std::memory_order_acquire) ? 1 : 0);
  }

  struct State;    // everything only the writer thread touches
  struct Modules;  // the loaded objects found, and the thread that reads them

  void note_exit(int status);
  void note_exec(const char* path);
  // The process forked: from now on its pages may be shared copy-on-write,
  // so the writer samples its shared and private memory (kShare).
  void note_fork() { shares_pages_.store(true, std::memory_order_relaxed); }
  SignalNote& signal_note() { return signal_; }

  // In a forked child: forget the parent's file and thread without touching
  // them, then open the child's own trace.
  void reset_after_fork();

 private:
  static void* thread_main(void* self);
  void run();
  // Returns the number of events it took from the rings.
  size_t cycle(bool final);
  static void* modules_main(void* self);
  void run_modules();
  // Reads the list of loaded objects on the calling thread, when no other
  // thread is reading it (waiting up to `wait_ms` for one that is).
  bool scan_modules_here(bool detect_python, int wait_ms);
  // Asks the module thread to read the list; returns its ticket.
  uint32_t request_modules_scan();
  // Waits up to `timeout_ms` for the scan with that ticket to end.
  bool wait_modules_scan(uint32_t ticket, int timeout_ms);
  // Writes a record of each loaded object found and not written yet.
  void write_found_modules(State& st);
  // Interns a stack that a thread left to the writer (stack_spill.h), by
  // way of the writer's own path cache; returns its id, 0 when the table is full.
  static uint32_t intern_spilled(State& st, const uintptr_t* words, uint32_t depth, uint32_t python);
  // Writes one frame of `raw_len` payload bytes (compressed when that is
  // smaller). On a failed write, cuts the file back to its last whole frame.
  bool write_frame(const uint8_t* raw, size_t raw_len, int* err);
  // The trace cannot be written any more: keep what is on disk readable,
  // record why when there is still room, and stop tracing with one message.
  void lose_trace(const char* why, int err, uint64_t now);

  SignalNote signal_;
  std::atomic<int> exit_pending_{0};
  int exit_status_ = 0;
  std::atomic<int> exec_pending_{0};
  std::atomic<bool> shares_pages_{false};
  char exec_path_[512] = {};

  std::atomic<uint32_t> wake_word_{0};
  std::atomic<uint32_t> flush_requested_{0};
  std::atomic<uint32_t> flush_done_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> running_{false};
  std::atomic<bool> waiting_{false};
  pthread_t thread_{};
  std::atomic<pid_t> thread_tid_{0};
  std::atomic<bool> modules_running_{false};
  OwnedFile trace_;
  OwnedFile status_;
  char status_path_[4200] = {};  // until the status file is made
  State* state_ = nullptr;
  Modules* modules_ = nullptr;
};

TraceWriter& trace_writer();

}  // namespace memledger::interposer
