// The writer thread: drains the per-thread rings, orders events, encodes
// records (trace_format.h), compresses and checksums frames, and writes them.
// It also takes the periodic samples (RSS, heap held, cgroup limit), emits
// time-based steps, keeps the module map current and updates the status file
// that `memledger run` shows. All I/O of the tracer happens here.
#pragma once

#include <atomic>
#include <cstdint>
#include <sys/types.h>

namespace memledger::interposer {

struct Config;

// A crash or termination signal, handed from the signal handler to the writer.
struct SignalNote {
  std::atomic<int> pending{0};
  int signo = 0;
  int code = 0;
  uint64_t fault_addr = 0;
  pid_t tid = 0;
  uint32_t stack = 0;
  uint64_t ts = 0;
};

class TraceWriter {
 public:
  // Creates the trace file in config.dir. On failure prints nothing and
  // returns false with `error` describing why.
  bool open(const Config& config, pid_t parent_trace_pid, char* error, size_t error_size);
  bool start_thread();
  // Writes everything pending, the END record, and closes the file.
  void stop();

  // Wakes the writer and waits until everything recorded before the call is
  // in the file (or timeout). Async-signal-safe.
  void flush_and_wait(int timeout_ms);
  void wake();

  void note_exit(int status);
  void note_exec(const char* path);
  SignalNote& signal_note() { return signal_; }

  // In a forked child: forget the parent's file and thread without touching
  // them, then open the child's own trace.
  void reset_after_fork();

 private:
  static void* thread_main(void* self);
  void run();
  void cycle(bool final);

  SignalNote signal_;
  std::atomic<int> exit_pending_{0};
  int exit_status_ = 0;
  std::atomic<int> exec_pending_{0};
  char exec_path_[512] = {};

  std::atomic<uint32_t> wake_word_{0};
  std::atomic<uint32_t> flush_requested_{0};
  std::atomic<uint32_t> flush_done_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> running_{false};
  std::atomic<bool> thread_busy_{false};
  pthread_t thread_{};
  int fd_ = -1;
  int status_fd_ = -1;
  struct State;
  State* state_ = nullptr;
};

TraceWriter& trace_writer();

}  // namespace memledger::interposer
