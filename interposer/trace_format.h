// The memledger trace file format: the one place that defines it.
//
// A trace file is written by one process (one pid, one program image: an exec
// starts a new file) and read by report/. Layout:
//
//   FileHeader   magic "MLEDGER\n", u32 version, u32 header_len
//   header text  header_len bytes of UTF-8 "key=value\n" lines (see kHeaderKeys)
//   Frame*       FrameHeader followed by stored_len payload bytes
//
// Every frame carries its length and a CRC-32 of its stored payload, so a
// process killed in the middle of a write leaves every earlier frame readable
// and a reader can skip a damaged frame and resynchronise on the next magic.
// Payloads are zstd-compressed (flag bit 0) or raw.
//
// A payload is a sequence of records: one tag byte, then the fields listed
// next to the tag, in order. Integers are unsigned LEB128 varints unless
// marked "zz" (zigzag-encoded signed varint); strings are a varint length
// followed by the bytes. All integers in FileHeader and FrameHeader are
// little-endian.
//
// Deltas: in kAlloc, kFree and kStep records, `seq` and `ts_ns` are zz-deltas
// from the previous such record in the same frame, and `addr` (kAlloc, kFree)
// is a zz-delta from the previous kAlloc/kFree address in the same frame; the
// first record of a frame is a delta from 0. Frames thus decode on their own.
//
// Ordering: allocation, free and step records carry a global sequence number
// taken when the event happened. Records of different threads may reach the
// file slightly out of sequence order; readers sort by sequence number.
// Stacks, strings and modules are written before the first frame that could
// refer to them is complete, but a reader must tolerate forward references.
#pragma once

#include <cstdint>

namespace memledger::format {

inline constexpr char kFileMagic[8] = {'M', 'L', 'E', 'D', 'G', 'E', 'R', '\n'};
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kFrameMagic = 0x4d4c4652;  // "RFLM" on disk
inline constexpr uint32_t kFrameCompressed = 1u << 0;
inline constexpr uint32_t kMaxFramePayload = 64u << 20;  // sanity bound for readers

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_len;
};
static_assert(sizeof(FileHeader) == 16);

struct FrameHeader {
  uint32_t magic;       // kFrameMagic
  uint32_t flags;       // kFrameCompressed
  uint32_t stored_len;  // payload bytes that follow this header
  uint32_t raw_len;     // payload bytes after decompression
  uint32_t crc32;       // CRC-32 (zlib polynomial) of the stored payload
  uint32_t index;       // 0, 1, 2, ... within the file
};
static_assert(sizeof(FrameHeader) == 24);

// Header keys written by the preload library (all optional for readers):
//   pid, ppid, command (NUL-free, arguments separated by 0x1f), exe, host,
//   start_wall_ns (CLOCK_REALTIME), start_mono_ns (CLOCK_MONOTONIC),
//   host_mode (full|sampled|off), sample_interval (bytes, sampled mode),
//   stack_depth, page_size, step_interval_ms, rank, local_rank, world_size,
//   parent_trace (set in forked children), env.<VAR> for the frameworks'
//   allocator switches (PYTORCH_CUDA_ALLOC_CONF, TF_GPU_ALLOCATOR, ...).

// Memory kinds. Host heap only for now; the numbering is stable.
enum class Kind : uint8_t {
  kHost = 0,
  kDevice = 1,
  kManaged = 2,
  kPinnedHost = 3,
};
inline constexpr int kKindCount = 4;

inline const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kHost: return "host";
    case Kind::kDevice: return "device";
    case Kind::kManaged: return "managed";
    case Kind::kPinnedHost: return "pinned_host";
  }
  return "unknown";
}

// Where a step boundary came from.
enum class StepSource : uint8_t {
  kMarker = 0,    // memledger_step() C ABI or a helper built on it
  kInterval = 1,  // --step-interval
};

inline const char* step_source_name(StepSource source) {
  switch (source) {
    case StepSource::kMarker: return "marker";
    case StepSource::kInterval: return "interval";
  }
  return "unknown";
}

// Allocation and free record flags.
inline constexpr uint32_t kAllocSampled = 1u << 0;     // sampled host mode: `weight` is the estimate
inline constexpr uint32_t kAllocFailed = 1u << 1;      // the allocator returned an error (in `weight`); addr is 0
inline constexpr uint32_t kAllocPool = 1u << 2;        // from a stream-ordered memory pool
inline constexpr uint32_t kAllocPhysical = 1u << 3;    // a VMM physical allocation; addr is the handle
inline constexpr uint32_t kAllocRegistered = 1u << 4;  // existing host memory page-locked (cuMemHostRegister)
inline constexpr uint32_t kAllocAsync = 1u << 5;       // stream-ordered (cu/cudaMallocAsync, cu/cudaFreeAsync)

enum class Tag : uint8_t {
  // seq (zz-delta), ts_ns (zz-delta), tid, kind, device, addr (zz-delta), size, stack, flags, weight
  //   weight: estimated bytes this record stands for (== size when not sampled)
  kAlloc = 1,
  // seq (zz-delta), ts_ns (zz-delta), tid, kind, addr (zz-delta), flags
  kFree = 2,
  // id, depth, then depth instruction pointers, each zz-delta from the previous
  // (the first from 0). Frame 0 is the innermost caller of the allocator.
  kStack = 3,
  // base, path, build_id (hex string, may be empty), nseg, nseg x (vaddr, memsz)
  kModule = 4,
  // id, text
  kString = 5,
  // seq (zz-delta), ts_ns (zz-delta), tid, index, source (StepSource), label string id (0 = none)
  kStep = 6,
  // ts_ns, rss, heap_held, heap_in_use, cgroup_limit (0 = none), cgroup_usage,
  // host_live (exact live host bytes, malloc_usable_size), host_allocs, host_frees
  kSample = 7,
  // tid, name
  kThread = 8,
  // ts_ns, tid, signo, code, fault_addr, stack
  kSignal = 9,
  // ts_ns, status (the value passed to exit())
  kExit = 10,
  // count (events lost because a thread's buffer was full)
  kDropped = 11,
  // ts_ns, path (the image the process is about to exec)
  kExec = 12,
  // ts_ns, child_pid
  kFork = 13,
  // ts_ns: the trace was closed by the library's destructor
  kEnd = 14,
  // ts_ns, message (the tracer stopped itself, e.g. disk full)
  kTracerError = 15,
  // Device address space (the virtual memory API). Not memory: shown apart.
  // seq (zz-delta), ts_ns (zz-delta), tid, device, addr, size, stack
  kReserve = 16,
  // seq (zz-delta), ts_ns (zz-delta), tid, addr, size
  kUnreserve = 17,
  // A physical allocation mapped into reserved space.
  // seq (zz-delta), ts_ns (zz-delta), tid, device, addr, size, handle
  kMap = 18,
  // seq (zz-delta), ts_ns (zz-delta), tid, addr, size
  kUnmap = 19,
  // Device-wide memory (cuMemGetInfo), sampled at each step end.
  // seq (zz-delta), ts_ns (zz-delta), device, free, total
  kDeviceSample = 20,
  // A memory pool's reserved and used bytes (cuMemPoolGetAttribute).
  // seq (zz-delta), ts_ns (zz-delta), device, pool, reserved, used
  kPoolSample = 21,
};

// Sentinel stack id: no stack captured.
inline constexpr uint32_t kNoStack = 0;

}  // namespace memledger::format
