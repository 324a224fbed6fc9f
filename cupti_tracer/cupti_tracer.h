// The CUPTI tracer: memory activity records (MEMORY2, MEMORY_POOL) for the
// report's cross-check of the hooks, and kernel launches for step markers.
//
// CUPTI admits one subscriber per process. The tracer subscribes once, at
// the first cuInit; when another tool holds the slot (PyTorch's profiler,
// Nsight, compute-sanitizer) it names that tool, touches nothing else of
// CUPTI (activity buffers are process-wide too) and the trace goes on with
// the hooks only. Every failure ends in one status record and at most one
// line on stderr; the program never sees it.
#pragma once

#include <regex.h>

#include <atomic>
#include <cstdint>

#include "buffer_pool.h"
#include "cupti_host.h"
#include "cupti_library.h"

namespace memledger::cupti {

// Stop reasons for memledger_cupti_stop().
enum StopReason : int {
  kStopExit = 0,      // the process ends: forced flush
  kStopHandover = 1,  // another tool asks for the subscriber slot
  kStopForkChild = 2, // a forked child: CUPTI's state belongs to the parent
};

class CuptiTracer {
 public:
  int start(const MemledgerCuptiHost* host);
  void stop(int reason);

  // CUPTI callbacks (static trampolines in the .cpp).
  void buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records);
  void buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t size, size_t valid);
  void on_launch(const char* kernel);

 private:
  int fail(int status, bool loud, const char* text, const char* holder = nullptr);
  bool kernel_matches(const char* name);

  enum State : int { kIdle = 0, kStarting = 1, kActive = 2, kDone = 3 };

  const MemledgerCuptiHost* host_ = nullptr;
  std::atomic<int> state_{kIdle};
  int status_ = 0;
  CuptiLibrary lib_;
  BufferPool pool_;
  CUpti_SubscriberHandle subscriber_ = nullptr;
  bool kernel_steps_ = false;
  regex_t kernel_regex_{};
  std::atomic<uint64_t> records_{0};
  std::atomic<uint64_t> dropped_reported_{0};
  std::atomic<bool> in_matching_run_{false};
};

CuptiTracer& tracer();

}  // namespace memledger::cupti
