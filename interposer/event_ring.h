// Per-thread event buffers: the only thing a hook touches on the hot path.
//
// Each thread owns one ThreadRing (single producer); the writer thread is the
// single consumer. A ring is never freed: when its thread exits it is marked
// retired, drained, and handed to the next new thread. Rings live in mmap'ed
// memory, never in the hooked heap.
#pragma once

#include <atomic>
#include <cstdint>
#include <sys/types.h>
#include <type_traits>

#include "python_frames.h"
#include "stack_spill.h"
#include "stack_table.h"
#include "unwinder.h"

namespace memledger::interposer {

enum class EventType : uint8_t {
  kAlloc = 1,
  kFree = 2,
  kStep = 3,
  kReserve = 4,       // device address space reserved (not memory)
  kUnreserve = 5,
  kMap = 6,           // a physical handle mapped at an address (weight = handle)
  kUnmap = 7,
  kDeviceSample = 8,  // aux = device, addr = free bytes, size = total bytes
  kPoolSample = 9,    // aux = device, addr = pool, size = reserved, weight = used
  kHostTotals = 10,   // the exact host counters (as a kStep's addr and weight), sampled mode
  // Records of the CUPTI module (cupti_host.h), as the writer encodes them:
  kCuptiStatus = 11,  // kind = status, size = API version, aux = text string id, stack = holder string id
  kCuptiMemory = 12,  // addr, size = bytes, weight = pc, aux = device, tid = stream, stack = correlation,
                      // kind, flags = release | async << 1 | pool type << 2, source = CUPTI's memory
                      // kind; a module static's tid is its name's string id (format::is_module_static)
  kCuptiPool = 13,    // addr, size, weight = utilized, aux = device, kind = operation, flags = pool type,
                      // stack / tid = low / high half of the release threshold
  kCuptiDropped = 14, // size = records lost
  kInfo = 15,         // aux = key string id, stack = value string id (format::Tag::kInfo)
};

// One hook call, as plain data. The writer turns it into a trace record.
struct Event {
  uint64_t seq;     // global order (see Recorder::next_seq)
  uint64_t ts;      // CLOCK_MONOTONIC ns
  uint64_t addr;    // kStep: exact live host bytes at the marker (int64_t)
  uint64_t size;    // kStep: step index
  uint64_t weight;  // kAlloc: estimated bytes this sampled allocation stands for,
                    // or the error code of a failed allocation; kStep: host
                    // allocations (high 32 bits) and frees (low), mod 2^32
  uint32_t stack;   // interned stack id, 0 = none
  uint32_t aux;     // kAlloc and device events: device; kStep: label string id
  EventType type;
  uint8_t kind;     // format::Kind
  uint8_t flags;    // format::kAlloc* flags
  uint8_t source;   // kStep: format::StepSource; kCuptiMemory: CUPTI's memory kind
  uint32_t tid;
};
static_assert(std::is_trivially_copyable_v<Event>);
static_assert(sizeof(Event) == 56);

enum class RingState : int {
  kFree = 0,      // reusable by a new thread
  kOwned = 1,     // a live thread writes into it
  kRetired = 2,   // its thread exited; drain it, then it becomes free
  kShared = 3,    // the shared ring for threads without their own (locked push)
};

struct ThreadRing {
  static constexpr uint32_t kCapacity = 1u << 15;
  // The slots a ring uses where its thread's events are few: sampled mode
  // records about one allocation in a few hundred. Slots are touched in
  // turn, so a ring of kCapacity comes to hold 1.8 MB of each thread's
  // memory however rarely it is written; 4 Ki slots take 224 KiB.
  static constexpr uint32_t kSampledCapacity = 1u << 12;

  alignas(64) std::atomic<uint64_t> head{0};  // next slot the producer fills
  // The slots in use less one, a power of two less one (kCapacity or
  // kSampledCapacity): set before the ring is published, then read only.
  uint64_t mask = kCapacity - 1;
  alignas(64) std::atomic<uint64_t> tail{0};  // next slot the consumer reads
  alignas(64) std::atomic<int> state{0};
  std::atomic<pid_t> tid{0};
  ThreadRing* next = nullptr;  // global list, immutable once published
  std::atomic<uint64_t> dropped{0};
  // Exact host totals of the allocations and frees made on this thread,
  // in malloc_usable_size bytes. The writer sums them over all rings.
  std::atomic<int64_t> host_live{0};
  std::atomic<uint64_t> host_allocs{0};
  std::atomic<uint64_t> host_frees{0};
  // The owning thread's last stack path (StackTable::intern).
  StackTable::PathCache path_cache;
  // The owning thread's last native walk (fast_backtrace).
  UnwindMemo unwind_memo;
  // The code objects of the owning thread's Python frames (PythonFrames::capture).
  PythonFrames::CodeCache code_cache;
  // By memo walk (UnwindMemo::made after the walk): the stack its thread
  // made last from that walk's frames, when it was of native frames alone (0
  // otherwise), in one word (a signal handler on the same thread replaces it
  // whole, never in part): the serial of the walk that gave the frames (bits
  // 0..27), their count (28..36), the frames skipped (37..39) and the
  // stack's id (40..63): WalkReuse. Recorder::capture_stack.
  volatile uint64_t walk_stacks[UnwindMemo::kWalks + UnwindMemo::kKnown];
  // Until when (monotonic ns) the writer counts this ring's thread as
  // allocating without pause (Recorder::allocating_threads): the writer's
  // own, set where it drains kBusyRingEvents or more at once.
  uint64_t busy_until_ns;
  uint64_t capacity() const { return mask + 1; }
  Event& slot(uint64_t pos) { return events[pos & mask]; }
  const Event& slot(uint64_t pos) const { return events[pos & mask]; }

  Event events[kCapacity];
  // Stacks with Python frames that the thread left to the writer to intern.
  StackSpill spill;
};

}  // namespace memledger::interposer
