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
// Deltas: in kAlloc, kFree, kHostAlloc, kHostFree and kStep records, `seq`
// and `ts_ns` are zz-deltas from the previous such record in the same frame
// (kHostAllocNext and kHostFreeNext leave them out: the previous seq plus
// one, the previous ts_ns), and `addr` (kAlloc, kFree, kHostAlloc,
// kHostFree and the two Next records) is a zz-delta from the
// previous such address in the same frame; the first record of a frame is a
// delta from 0. Frames thus decode on their own.
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
// Version 2 added Python frames inside stacks and the kPythonCode and
// kPython records, the CUPTI records (kCuptiStatus .. kCuptiDropped) and
// the nvtx and kernel step sources. Version 3 added the exact host totals
// to kStep. Version 4 added attributed Python frames (kPythonAttributedBit).
// Version 5 added kInfo (the CUDA stack and the frameworks' builds).
// Version 6 added the memory kind kMapped (anonymous mmap outside the heap).
// Version 7 added kPressure (host memory pressure) and the header key cgroup.
// Version 8 added kShare (shared and private memory of forked processes),
// and the header keys fork_seq and inherited_host_live.
// Version 9 added kHostAlloc and kHostFree (ordinary host records without
// the fields they do not need).
// Version 10 added CUPTI's own memory kind and a module static's variable
// name to kCuptiMemory.
// Version 11 added kHostAllocNext and kHostFreeNext (kHostAlloc and kHostFree
// numbered one after the previous record, at its time), kSampledHostAlloc and
// kHostTotalsDelta (sampled mode's records without the fields it repeats).
// Readers accept every version up to their own.
inline constexpr uint32_t kVersion = 12;
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
//   allocator switches (PYTORCH_CUDA_ALLOC_CONF, TF_GPU_ALLOCATOR, ...),
//   allocator (glibc|jemalloc|tcmalloc|mimalloc|other: the program's malloc),
//   allocator_path (the object that defines it), allocator_reached (how the
//   program reaches it, one phrase), allocator_held (the statistic kSample's
//   heap_held and heap_in_use come from; "none": the allocator offers none,
//   and both fields are 0 meaning unknown), host_untraced=1 (the program's
//   malloc bypasses memledger: the host heap is not traced), python_boot
//   (on_path: PYTHONPATH holds the start-up folder of memledger's Python
//   helpers; missing: it does not; not_installed: memledger run found no
//   helpers next to it; off: MEMLEDGER_PYTHON_HOOKS=0), cgroup (version
//   7: the memory cgroup directory whose limit, usage and OOM kills the
//   samples read, e.g. /sys/fs/cgroup/job or /sys/fs/cgroup/memory/job;
//   absent when none is readable).

// Memory kinds; the numbering is stable.
enum class Kind : uint8_t {
  kHost = 0,
  kDevice = 1,
  kManaged = 2,
  kPinnedHost = 3,
  // Anonymous memory the program or its libraries map themselves (mmap,
  // mremap) outside the allocator under malloc (version 6): pymalloc's
  // arenas, a statically linked allocator's, a library's own pool. Sizes
  // are whole pages; a partial munmap is recorded as the free of the
  // mapping and allocations of what remains, with the original stack.
  kMapped = 4,
};
inline constexpr int kKindCount = 5;

// A kind read from a trace as an index into per-kind arrays: an unknown
// value (a damaged or hostile file) counts as host.
inline constexpr int kind_index(uint64_t kind) { return kind < kKindCount ? static_cast<int>(kind) : 0; }

inline const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kHost: return "host";
    case Kind::kDevice: return "device";
    case Kind::kManaged: return "managed";
    case Kind::kPinnedHost: return "pinned_host";
    case Kind::kMapped: return "mapped";
  }
  return "unknown";
}

// Where a step boundary came from.
enum class StepSource : uint8_t {
  kMarker = 0,    // memledger_step() C ABI or a helper built on it
  kInterval = 1,  // --step-interval
  kNvtx = 2,      // an NVTX range matching --steps nvtx:PATTERN closed
  kKernel = 3,    // a kernel matching --steps kernel:PATTERN was launched (CUPTI)
  kLoader = 4,    // the next batch was taken from a data loader (the Python module's
                  // hook on torch.utils.data): recorded only while no other source is
};

inline const char* step_source_name(StepSource source) {
  switch (source) {
    case StepSource::kMarker: return "marker";
    case StepSource::kInterval: return "interval";
    case StepSource::kNvtx: return "nvtx";
    case StepSource::kKernel: return "kernel";
    case StepSource::kLoader: return "loader";
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
// A CUDA graph allocation, made by a graph launch (graph memory nodes): the
// stack is the capture site of its allocation node; held by the device's
// graph memory (kPoolSample of kGraphMemoryPool), not by a stream pool.
// Also on the frees the launch's free nodes make. The record layout is
// unchanged: readers that do not know the flag read the allocation as an
// ordinary one, so the format version stays.
inline constexpr uint32_t kAllocGraph = 1u << 6;

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
  // seq (zz-delta), ts_ns (zz-delta), tid, index, source (StepSource), label string id (0 = none),
  // then (version 3) host_live (zz), host_allocs mod 2^32, host_frees mod 2^32: the exact
  // counters of kSample, read by the marking thread at the marker (a sampled-mode step
  // then ends with its exact totals, however late the writer runs). The counts are
  // kept to 32 bits: a step's count is the difference of two, modulo 2^32.
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
  // A memory pool's reserved and used bytes (cuMemPoolGetAttribute); pool
  // kGraphMemoryPool: the device's CUDA graph memory
  // (cuDeviceGetGraphMemAttribute RESERVED_MEM_CURRENT, USED_MEM_CURRENT).
  // seq (zz-delta), ts_ns (zz-delta), device, pool, reserved, used
  kPoolSample = 21,
  // A Python code object, referred to by the Python frames of stacks (below).
  // id, filename, qualname, first_line, line_table_format (LineTableFormat),
  // line_table (string: the code object's own line table, bytes as stored)
  kPythonCode = 22,
  // The Python interpreter found in the process.
  // status (PythonStatus), version (string, "3.11.2"; may be empty),
  // module (string: the object holding the interpreter), note (string: why
  // Python frames are not recorded, empty when they are)
  kPython = 23,
  // What became of CUPTI in the process (cupti_tracer/).
  // seq (the global sequence number, as kAlloc's but not a delta: allocations
  // before and after a status change are told apart by it), ts_ns,
  // status (CuptiStatus), api_version (0 = none found), text string id,
  // holder string id (0 = none: the tool holding the CUPTI subscriber slot)
  kCuptiStatus = 24,
  // A CUPTI memory activity record (CUPTI_ACTIVITY_KIND_MEMORY2).
  // ts_ns, release (0 allocated, 1 released), kind, device, stream
  // (0xffffffff = not stream-ordered), addr, bytes, pc, correlation,
  // flags (bit 0: async; bits 1..2: CUPTI memory pool type), then (version
  // 10) cupti_kind (CuptiMemoryKind: CUPTI's kind, of which `kind` is the
  // trace's reading), name (string id of a module static's variable, 0 = none)
  kCuptiMemory = 25,
  // A CUPTI memory pool record (CUPTI_ACTIVITY_KIND_MEMORY_POOL).
  // ts_ns, operation (1 created, 2 destroyed, 3 trimmed), pool_type, device,
  // addr, size, utilized, release_threshold
  kCuptiPool = 26,
  // count (activity records CUPTI reported lost)
  kCuptiDropped = 27,
  // Sampled host mode (version 3): the exact host counters, as kStep's,
  // read just after each recorded host allocation. They say how far the
  // estimate from the sampled allocations is off, several times a step.
  // seq (zz-delta), ts_ns (zz-delta), host_live (zz), host_allocs mod 2^32, host_frees mod 2^32
  kHostTotals = 28,
  // A fact about the process's software stack (version 5), as key and value
  // (see kInfoKeys); a key may come again, the last value counts.
  // ts_ns, key string id, value string id
  kInfo = 29,
  // Host memory pressure (version 7), taken with kSample: every 100 ms, and
  // at step ends at most one per 50 ms (/proc/vmstat, the costly file, at
  // most once per 100 ms: records without it lack kPressureVmstat).
  // ts_ns, present (kPressure* bits: which sources could be read; the fields
  // of an absent source are 0), mem_total, mem_available, swap_total,
  // swap_free (bytes, /proc/meminfo), swap_in, swap_out (pages swapped in
  // and out since boot, /proc/vmstat pswpin, pswpout), psi_some_avg10,
  // psi_full_avg10 (hundredths of a percent), psi_some_total,
  // psi_full_total (microseconds stalled since boot; /proc/pressure/memory),
  // cgroup_oom_kills (processes of the memory cgroup killed by the OOM
  // killer: oom_kill of memory.events, v2, or memory.oom_control, v1).
  kPressure = 30,
  // How much of the process's memory it shares with others (version 8), in a
  // process that forked or was forked (copy-on-write), once a second:
  // ts_ns, rss, pss, shared (Shared_Clean + Shared_Dirty), private
  // (Private_Clean + Private_Dirty), in bytes, from /proc/self/smaps_rollup.
  kShare = 31,
  // The records of almost every host allocation and free in full mode
  // (version 9): kAlloc and kFree less the fields that are the same on all
  // of them (kind host, device 0, no flags, weight = size; no thread id,
  // which readers do not use). Deltas as kAlloc's and kFree's, shared with
  // them. About a third fewer bytes to encode, compress and write.
  // seq (zz-delta), ts_ns (zz-delta), addr (zz-delta), size, stack
  kHostAlloc = 32,
  // seq (zz-delta), ts_ns (zz-delta), addr (zz-delta)
  kHostFree = 33,
  // kHostAlloc and kHostFree whose seq is the previous record's plus one and
  // whose ts_ns is the previous record's (version 11): almost all of them in
  // full mode, where a thread's events are numbered in turn and the clock
  // they read ticks every few milliseconds. The two fields, a byte each, were
  // more than a third of what the writer encoded and compressed.
  // addr (zz-delta), size, stack
  kHostAllocNext = 34,
  // addr (zz-delta)
  kHostFreeNext = 35,
  // A sampled host allocation (version 11): kAlloc of kind host, device 0 and
  // flags kAllocSampled, less those fields and the thread id.
  // seq (zz-delta), ts_ns (zz-delta), addr (zz-delta), size, stack, weight
  kSampledHostAlloc = 36,
  // kHostTotals as differences from the previous kHostTotals or
  // kHostTotalsDelta record of the same frame (version 11; never a frame's
  // first): what sampled mode writes after each sampled allocation, where the
  // counters themselves took most of the record.
  // seq (zz-delta), ts_ns (zz-delta), host_live (zz-delta),
  // host_allocs and host_frees (the differences, mod 2^32)
  kHostTotalsDelta = 37,
  // A stack that shares the outermost frames of its Python part and of its
  // native part with the frame's previous stack record (kStack or
  // kStackShared; version 12): what a Python program's stacks mostly are
  // (`import torch` writes 702,000 stacks of 66 frames on average). A
  // stack's Python part is its leading frames that are Python frames
  // (is_python_frame), its native part the rest.
  // id, depth, python (its Python part's frames), python_shared, native_shared
  // (how many of each part's outermost frames are the previous record's
  // part's outermost, in order), then the frames of its own, innermost first:
  // the Python part's, then the native part's, each zz-delta from the one
  // before (the first from 0), as kStack's. A record shares at most
  // kStackShareRatio frames for each of its bytes (its tag included): what a
  // reader makes of it stays in proportion to what it read.
  kStackShared = 38,
};

inline constexpr uint64_t kStackShareRatio = 8;

// kPressure's `present` bits.
inline constexpr uint32_t kPressureMeminfo = 1u << 0;
inline constexpr uint32_t kPressureVmstat = 1u << 1;
inline constexpr uint32_t kPressurePsi = 1u << 2;
inline constexpr uint32_t kPressureCgroupEvents = 1u << 3;

// kInfo keys. The preload library writes the first four, the Python module
// (tools/python) the framework ones through memledger_note():
//   cuda.driver         cuDriverGetVersion's value ("12020")
//   cuda.driver_release the NVIDIA kernel module's release ("580.65.06")
//   cuda.driver_library_release  the release in libcuda's file name
//   cuda.device.N       "TOTAL_BYTES NAME" of GPU ordinal N
//   cuda.library        "PATH\tVERSION": a loaded CUDA-family library and what
//                       its own version call returned ("" when it has none)
//   cuda.init_error     "CALL ERROR": the first CUDA call of the process
//                       failed with a driver-version error
//   cuda.create_error   "CALL STATUS NAME\tPATH": cudnnCreate or cublasCreate_v2
//                       failed (library_hooks.cpp)
//   framework.NAME.FIELD  e.g. framework.torch.cuda = "12.1" or "None"
//   python.exception    "TYPE: MESSAGE" of the exception that ended Python

// kCuptiStatus values (cupti_host.h has the same numbers).
enum class CuptiStatus : uint8_t {
  kActive = 1,       // activity records are collected
  kOff = 2,          // turned off by the user
  kUnavailable = 3,  // no libcupti, wrong version, no driver or device
  kHeld = 4,         // another tool holds the CUPTI subscriber slot
  kFailed = 5,       // a CUPTI call failed; CUPTI was turned off
  kStopped = 6,      // collection ended (exit flush, or handed to another tool)
};

// CUPTI's memory kinds (CUpti_ActivityMemoryKind, cupti_activity.h), as
// kCuptiMemory's cupti_kind holds them (version 10; 0 in older traces).
enum class CuptiMemoryKind : uint8_t {
  kUnknown = 0,
  kPageable = 1,
  kPinned = 2,
  kDevice = 3,
  kArray = 4,
  kManaged = 5,
  // A module's __device__ / __constant__ variables (and __managed__ ones):
  // the driver places them when it loads the module (at cuModuleLoad*, or
  // at the first launch from it under lazy loading) and frees them when it
  // unloads it. No allocation call makes them, so no hook can see them.
  kDeviceStatic = 6,
  kManagedStatic = 7,
};
inline constexpr bool is_module_static(uint8_t cupti_kind) {
  return cupti_kind == static_cast<uint8_t>(CuptiMemoryKind::kDeviceStatic) ||
         cupti_kind == static_cast<uint8_t>(CuptiMemoryKind::kManagedStatic);
}
inline const char* cupti_kind_name(uint8_t cupti_kind) {
  switch (static_cast<CuptiMemoryKind>(cupti_kind)) {
    case CuptiMemoryKind::kUnknown: return "unknown";
    case CuptiMemoryKind::kPageable: return "pageable";
    case CuptiMemoryKind::kPinned: return "pinned";
    case CuptiMemoryKind::kDevice: return "device";
    case CuptiMemoryKind::kArray: return "array";
    case CuptiMemoryKind::kManaged: return "managed";
    case CuptiMemoryKind::kDeviceStatic: return "device_static";
    case CuptiMemoryKind::kManagedStatic: return "managed_static";
  }
  return "unknown";
}

// Python frames (version 2). A stack word with bit 63 set is not an
// instruction pointer but a Python frame: bits 32..62 hold the id of a
// kPythonCode record, bits 0..31 the byte offset of the instruction being
// run in the code object's bytecode (kPythonOffsetUnknown before the first
// instruction). A stack lists its Python frames first, innermost first, then
// its native frames, innermost first.
inline constexpr uint64_t kPythonFrameBit = uint64_t{1} << 63;
// Version 4: a Python frame word with bit 62 set as well is attributed, not
// the allocating thread's own. That thread had never run Python (a
// framework's worker: XLA, TensorFlow's executors, PyTorch's autograd
// engine), and its stack starts with the frames of the interpreter's main
// thread at that moment, the thread that dispatched the work.
inline constexpr uint64_t kPythonAttributedBit = uint64_t{1} << 62;
inline constexpr uint32_t kPythonOffsetUnknown = UINT32_MAX;
inline constexpr uint64_t python_frame_word(uint32_t code_id, uint32_t offset) {
  return kPythonFrameBit | (static_cast<uint64_t>(code_id & 0x3fffffffu) << 32) | offset;
}
inline constexpr bool is_python_frame(uint64_t word) { return (word & kPythonFrameBit) != 0; }
inline constexpr bool is_attributed_python_frame(uint64_t word) {
  return (word & (kPythonFrameBit | kPythonAttributedBit)) == (kPythonFrameBit | kPythonAttributedBit);
}
inline constexpr uint32_t python_code_id(uint64_t word) { return static_cast<uint32_t>(word >> 32) & 0x3fffffffu; }
inline constexpr uint32_t python_offset(uint64_t word) { return static_cast<uint32_t>(word); }

// How a kPythonCode record's line table maps byte offsets to lines; each is
// the format of the CPython versions named (Objects/lnotab_notes.txt).
enum class LineTableFormat : uint8_t {
  kNone = 0,       // no table: every instruction is on first_line
  kLnotab = 1,     // 3.9 co_lnotab: (byte delta, signed line delta) pairs
  kLinetable = 2,  // 3.10 co_linetable: (byte delta, signed line delta; -128 = none) pairs
  kLocations = 3,  // 3.11+ co_linetable: location entries of code units
};

enum class PythonStatus : uint8_t {
  kActive = 1,       // Python frames are recorded
  kUnsupported = 2,  // an interpreter memledger does not read: stacks are native only
};

// kPoolSample's pool for a device's CUDA graph memory (no pool handle is 1).
inline constexpr uint64_t kGraphMemoryPool = 1;

// Sentinel stack id: no stack captured.
inline constexpr uint32_t kNoStack = 0;

}  // namespace memledger::format
