#include "trace_reader.h"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <libdeflate.h>
#include <zstd.h>

#include "trace_encoding.h"
#include "trace_format.h"

namespace memledger::report {

// The reader's own flag bit is none of the trace's.
static_assert((kAllocByChance & (format::kAllocGraph | format::kAllocAsync)) == 0);

namespace {

namespace fmt = memledger::format;

// A read-only view of a whole file (mmap'ed when possible).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    // O_NONBLOCK: a FIFO named like a trace must not make the reader wait
    // for a writer for ever; only regular files are read.
    int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) throw TraceError(path + ": " + std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      throw TraceError(path + ": " + std::strerror(err));
    }
    if (S_ISDIR(st.st_mode)) {
      ::close(fd);
      throw TraceError(path + ": is a folder, not a trace file");
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw TraceError(path + ": not a regular file (" +
                       (S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket" : "a device") + "); skipped");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        int err = errno;
        ::close(fd);
        throw TraceError(path + ": " + std::strerror(err));
      }
      data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
  }
  ~MappedFile() {
    if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

struct Header {
  uint32_t version = 0;
  size_t frames_offset = 0;
  std::map<std::string, std::string> values;
};

Header parse_header(const std::string& path, const MappedFile& file) {
  Header h;
  if (file.size() < sizeof(fmt::FileHeader)) {
    if (file.size() == 0) throw TraceError(path + ": empty file, not a memledger trace");
    throw TraceError(path + ": too short to be a memledger trace (" + std::to_string(file.size()) + " bytes)");
  }
  fmt::FileHeader fh;
  std::memcpy(&fh, file.data(), sizeof fh);
  if (std::memcmp(fh.magic, fmt::kFileMagic, sizeof fh.magic) != 0) {
    throw TraceError(path + ": not a memledger trace (bad magic)");
  }
  if (fh.version > fmt::kVersion) {
    throw TraceError(path + ": trace format version " + std::to_string(fh.version) +
                     " is newer than this memledger reads (version " + std::to_string(fmt::kVersion) +
                     "); use a newer memledger");
  }
  if (fh.version == 0) throw TraceError(path + ": invalid trace format version 0");
  h.version = fh.version;
  size_t header_end = sizeof fh + fh.header_len;
  if (fh.header_len > (1u << 20) || header_end > file.size()) {
    throw TraceError(path + ": truncated trace header");
  }
  std::string text(reinterpret_cast<const char*>(file.data() + sizeof fh), fh.header_len);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(pos, nl - pos);
    size_t eq = line.find('=');
    if (eq != std::string::npos) h.values[line.substr(0, eq)] = line.substr(eq + 1);
    pos = nl + 1;
  }
  h.frames_offset = header_end;
  return h;
}

class RecordDecoder {
 public:
  RecordDecoder(Trace& trace, uint32_t version) : t_(trace), version_(version) {}

  // Decodes one frame payload. Returns false if the payload is malformed
  // (records decoded before the damage are kept).
  bool decode(const uint8_t* data, size_t size) {
    fmt::Cursor c(data, size);
    Deltas d;  // trace_format.h: per frame
    while (!c.at_end()) {
      const auto tag = static_cast<fmt::Tag>(c.byte());
      bool ok;
      switch (tag) {
        case fmt::Tag::kAlloc:
        case fmt::Tag::kFree:
        case fmt::Tag::kHostAlloc:
        case fmt::Tag::kHostFree:
        case fmt::Tag::kHostAllocNext:
        case fmt::Tag::kHostFreeNext:
        case fmt::Tag::kSampledHostAlloc:
        case fmt::Tag::kStep:
          ok = event(tag, c, d);
          break;
        case fmt::Tag::kReserve:
        case fmt::Tag::kMap:
        case fmt::Tag::kUnreserve:
        case fmt::Tag::kUnmap:
        case fmt::Tag::kDeviceSample:
        case fmt::Tag::kPoolSample:
        case fmt::Tag::kHostTotals:
        case fmt::Tag::kHostTotalsDelta:
          ok = device_record(tag, c, d);
          break;
        case fmt::Tag::kCuptiStatus:
        case fmt::Tag::kCuptiMemory:
        case fmt::Tag::kCuptiPool:
        case fmt::Tag::kCuptiDropped:
          ok = cupti_record(tag, c);
          break;
        case fmt::Tag::kStack:
        case fmt::Tag::kStackShared:
          ok = stack_record(tag, c, d);
          break;
        case fmt::Tag::kModule:
        case fmt::Tag::kPythonCode:
        case fmt::Tag::kPython:
        case fmt::Tag::kString:
          ok = symbol_record(tag, c);
          break;
        default:
          ok = process_record(tag, c);
          break;
      }
      if (!ok) return false;
    }
    return c.ok();
  }

 private:
  // The delta-coded fields of a frame's records: seq and ts of events and
  // device records, addresses of events.
  struct Deltas {
    uint64_t seq = 0, ts = 0, addr = 0;
    // The last kHostTotals or kHostTotalsDelta record's counters.
    bool have_totals = false;
    TraceHostTotals totals;
    // The nodes of the frame's last kStack or kStackShared record
    // (StackStore), outermost first: its Python path and its native path.
    std::vector<uint32_t> last_python, last_native;
    std::vector<uint64_t> frames;  // the record's frames, whole
    void seq_ts(fmt::Cursor& c, TraceEvent& e) {
      e.seq = seq += static_cast<uint64_t>(c.svarint());
      e.ts = ts += static_cast<uint64_t>(c.svarint());
    }
    uint64_t addr_of(fmt::Cursor& c) { return addr += static_cast<uint64_t>(c.svarint()); }
  };

  // Allocations, frees and step markers: the records of the hot path.
  bool event(fmt::Tag tag, fmt::Cursor& c, Deltas& d) {
    TraceEvent e;
    if (tag == fmt::Tag::kHostAllocNext || tag == fmt::Tag::kHostFreeNext) {
      e.seq = ++d.seq;
      e.ts = d.ts;
    } else {
      d.seq_ts(c, e);
    }
    switch (tag) {
      case fmt::Tag::kAlloc: {
        e.type = EvType::kAlloc;
        c.varint();  // tid
        e.kind = static_cast<uint8_t>(c.varint());
        e.device = static_cast<uint8_t>(c.varint());
        e.addr = d.addr_of(c);
        const uint64_t size = c.varint();
        e.stack = static_cast<uint32_t>(c.varint());
        e.flags = static_cast<uint8_t>(c.varint());
        const uint64_t weight = c.varint();
        e.size = (e.flags & fmt::kAllocSampled) ? weight : size;
        if ((e.flags & fmt::kAllocSampled) && weight != size) e.flags |= kAllocByChance;
        if (e.flags & fmt::kAllocFailed) e.addr = weight;  // the error code
        break;
      }
      case fmt::Tag::kHostAlloc:
      case fmt::Tag::kHostAllocNext:
      case fmt::Tag::kSampledHostAlloc:
        e.type = EvType::kAlloc;
        e.kind = static_cast<uint8_t>(fmt::Kind::kHost);
        e.addr = d.addr_of(c);
        e.size = c.varint();
        e.stack = static_cast<uint32_t>(c.varint());
        if (tag == fmt::Tag::kSampledHostAlloc) {
          const uint64_t size = e.size;
          e.size = c.varint();  // the weight: the bytes this sample stands for
          e.flags = fmt::kAllocSampled;
          if (e.size != size) e.flags |= kAllocByChance;
        }
        break;
      case fmt::Tag::kFree:
        e.type = EvType::kFree;
        c.varint();  // tid
        e.kind = static_cast<uint8_t>(c.varint());
        e.addr = d.addr_of(c);
        e.flags = static_cast<uint8_t>(c.varint());
        break;
      case fmt::Tag::kHostFree:
      case fmt::Tag::kHostFreeNext:
        e.type = EvType::kFree;
        e.kind = static_cast<uint8_t>(fmt::Kind::kHost);
        e.addr = d.addr_of(c);
        break;
      case fmt::Tag::kStep:
        e.type = EvType::kStep;
        c.varint();  // tid
        e.addr = c.varint();
        e.flags = static_cast<uint8_t>(c.varint());
        e.size = c.varint();
        if (version_ >= 3) host_totals(c, e.seq);
        break;
      default:
        return false;
    }
    if (!c.ok()) return false;
    note_ts(e.ts);
    t_.events.push_back(e);
    return true;
  }

  // The exact host counters that end a kStep (version 3) or make a
  // kHostTotals record; kept when they decode whole.
  bool host_totals(fmt::Cursor& c, uint64_t seq) {
    TraceHostTotals totals;
    totals.seq = seq;
    totals.host_live = c.svarint();
    totals.host_allocs = static_cast<uint32_t>(c.varint());
    totals.host_frees = static_cast<uint32_t>(c.varint());
    if (!c.ok()) return false;
    t_.host_totals.push_back(totals);
    return true;
  }
  // A kHostTotals record (`delta`: kHostTotalsDelta, from the frame's last one).
  bool host_totals_record(fmt::Cursor& c, uint64_t seq, bool delta, Deltas& d) {
    if (!delta) {
      if (!host_totals(c, seq)) return false;
      d.totals = t_.host_totals.back();
      d.have_totals = true;
      return true;
    }
    if (!d.have_totals) return false;
    TraceHostTotals totals;
    totals.seq = seq;
    totals.host_live = static_cast<int64_t>(static_cast<uint64_t>(d.totals.host_live) +
                                            static_cast<uint64_t>(c.svarint()));
    totals.host_allocs = d.totals.host_allocs + static_cast<uint32_t>(c.varint());
    totals.host_frees = d.totals.host_frees + static_cast<uint32_t>(c.varint());
    if (!c.ok()) return false;
    t_.host_totals.push_back(totals);
    d.totals = totals;
    return true;
  }

  // VMM mappings, device and pool samples and host totals, ordered among the
  // events by their seq.
  bool device_record(fmt::Tag tag, fmt::Cursor& c, Deltas& d) {
    switch (tag) {
      case fmt::Tag::kReserve:
      case fmt::Tag::kMap:
      case fmt::Tag::kUnreserve:
      case fmt::Tag::kUnmap: {
        TraceEvent tmp;
        d.seq_ts(c, tmp);
        TraceVmmEvent v;
        v.seq = tmp.seq;
        v.ts = tmp.ts;
        c.varint();  // tid
        if (tag == fmt::Tag::kReserve || tag == fmt::Tag::kMap) v.device = static_cast<uint8_t>(c.varint());
        v.addr = c.varint();
        v.size = c.varint();
        if (tag == fmt::Tag::kReserve) v.stack = static_cast<uint32_t>(c.varint());
        if (tag == fmt::Tag::kMap) v.handle = c.varint();
        v.type = tag == fmt::Tag::kReserve   ? TraceVmmEvent::Type::kReserve
                 : tag == fmt::Tag::kMap     ? TraceVmmEvent::Type::kMap
                 : tag == fmt::Tag::kUnmap   ? TraceVmmEvent::Type::kUnmap
                                             : TraceVmmEvent::Type::kUnreserve;
        if (!c.ok()) return false;
        note_ts(v.ts);
        t_.vmm.push_back(v);
        break;
      }
      case fmt::Tag::kDeviceSample: {
        TraceEvent tmp;
        d.seq_ts(c, tmp);
        TraceDeviceSample d;
        d.seq = tmp.seq;
        d.ts = tmp.ts;
        d.device = static_cast<uint32_t>(c.varint());
        d.free = c.varint();
        d.total = c.varint();
        if (!c.ok()) return false;
        t_.device_samples.push_back(d);
        break;
      }
      case fmt::Tag::kHostTotals:
      case fmt::Tag::kHostTotalsDelta: {
        TraceEvent tmp;
        d.seq_ts(c, tmp);
        if (!host_totals_record(c, tmp.seq, tag == fmt::Tag::kHostTotalsDelta, d)) return false;
        break;
      }
      case fmt::Tag::kPoolSample: {
        TraceEvent tmp;
        d.seq_ts(c, tmp);
        TracePoolSample p;
        p.seq = tmp.seq;
        p.ts = tmp.ts;
        p.device = static_cast<uint32_t>(c.varint());
        p.pool = c.varint();
        p.reserved = c.varint();
        p.used = c.varint();
        if (!c.ok()) return false;
        t_.pool_samples.push_back(p);
        break;
      }
      default:
        return false;
    }
    return true;
  }

  // The CUPTI module's records (cupti_tracer/).
  bool cupti_record(fmt::Tag tag, fmt::Cursor& c) {
    switch (tag) {
      case fmt::Tag::kCuptiStatus: {
        TraceCuptiStatus s;
        s.seq = c.varint();
        s.ts = c.varint();
        s.status = static_cast<uint8_t>(c.varint());
        s.version = static_cast<uint32_t>(c.varint());
        s.text = static_cast<uint32_t>(c.varint());
        s.holder = static_cast<uint32_t>(c.varint());
        if (!c.ok()) return false;
        t_.cupti_status.push_back(s);
        break;
      }
      case fmt::Tag::kCuptiMemory: {
        TraceCuptiMemory m;
        m.ts = c.varint();
        const uint64_t release = c.varint();
        m.kind = static_cast<uint8_t>(c.varint());
        m.device = static_cast<uint32_t>(c.varint());
        m.stream = static_cast<uint32_t>(c.varint());
        m.addr = c.varint();
        m.bytes = c.varint();
        m.pc = c.varint();
        m.correlation = static_cast<uint32_t>(c.varint());
        m.flags = static_cast<uint8_t>(c.varint());
        if (version_ >= 10) {
          m.cupti_kind = static_cast<uint8_t>(c.varint());
          m.name = static_cast<uint32_t>(c.varint());
        }
        if (!c.ok()) return false;
        if (release != 0) {
          ++t_.cupti_releases;
        } else if (t_.cupti_memory.size() < kMaxCuptiRecords) {
          t_.cupti_memory.push_back(m);
        } else {
          ++t_.cupti_records_over_cap;
        }
        break;
      }
      case fmt::Tag::kCuptiPool: {
        for (int i = 0; i < 8; ++i) c.varint();
        if (!c.ok()) return false;
        ++t_.cupti_pool_records;
        break;
      }
      case fmt::Tag::kCuptiDropped: {
        t_.cupti_dropped += c.varint();
        if (!c.ok()) return false;
        break;
      }
      default:
        return false;
    }
    return true;
  }

  // kStack and kStackShared (its tag read from `c`).
  bool stack_record(fmt::Tag tag, fmt::Cursor& c, Deltas& d) {
    const size_t record_end_from = c.remaining() + 1;  // the tag's byte included
    const uint32_t id = static_cast<uint32_t>(c.varint());
    const uint64_t depth = c.varint();
    uint64_t python = 0, python_shared = 0, native_shared = 0;
    if (tag == fmt::Tag::kStackShared) {
      python = c.varint();
      python_shared = c.varint();
      native_shared = c.varint();
    }
    const std::vector<uint32_t>& last_python = d.last_python;
    const std::vector<uint32_t>& last_native = d.last_native;
    // Each frame of its own takes at least one byte: a depth beyond what is
    // left is a damaged record, not a reason to reserve memory.
    if (!c.ok() || python > depth || python_shared > python || native_shared > depth - python ||
        python_shared > last_python.size() || native_shared > last_native.size() ||
        depth - python_shared - native_shared > c.remaining()) {
      return false;
    }
    // The stack whole, innermost first: its own Python frames, those it
    // shares (the outer ones of the last record's Python path), its own
    // native frames, those it shares.
    std::vector<uint64_t>& frames = d.frames;
    frames.clear();
    uint64_t prev = 0;
    auto own = [&](uint64_t n) {
      for (uint64_t i = 0; i < n; ++i) {
        prev += static_cast<uint64_t>(c.svarint());
        frames.push_back(prev);
      }
    };
    auto shared = [&](const std::vector<uint32_t>& path, uint64_t n) {
      for (uint64_t i = n; i > 0; --i) frames.push_back(t_.stacks.word(path[i - 1]));
    };
    own(python - python_shared);
    shared(last_python, python_shared);
    own(depth - python - native_shared);
    shared(last_native, native_shared);
    if (!c.ok()) return false;
    if (python_shared + native_shared > fmt::kStackShareRatio * (record_end_from - c.remaining())) return false;
    if (depth > kMaxStackFrames) ++t_.stacks_cut;
    // Its Python path is its leading Python frames. Where that is the
    // record's Python part (always, from the writer), the shared frames are
    // the last paths' nodes; else every frame gets a node of its own.
    size_t leading = 0;
    while (leading < frames.size() && fmt::is_python_frame(frames[leading])) ++leading;
    const bool split = tag == fmt::Tag::kStack || leading == python;
    auto path = [&](std::vector<uint32_t>& out, const std::vector<uint32_t>& last, uint64_t keep, size_t begin,
                    size_t end) {
      std::vector<uint32_t> made(last.begin(), last.begin() + static_cast<ptrdiff_t>(keep));
      uint32_t leaf = made.empty() ? 0 : made.back();
      for (size_t i = end - keep; i > begin; --i) made.push_back(leaf = t_.stacks.node(leaf, frames[i - 1]));
      out = std::move(made);
      return leaf;
    };
    std::vector<uint32_t> python_path, native_path;
    const uint32_t python_leaf = path(python_path, last_python, split ? python_shared : 0, 0, leading);
    const uint32_t native_leaf = path(native_path, last_native, split ? native_shared : 0, leading, frames.size());
    t_.stacks.set(id, python_leaf, native_leaf);
    d.last_python = std::move(python_path);
    d.last_native = std::move(native_path);
    return true;
  }

  // What names the frames of stacks: modules, Python code, strings.
  bool symbol_record(fmt::Tag tag, fmt::Cursor& c) {
    switch (tag) {
      case fmt::Tag::kModule: {
        ModuleInfo m;
        m.base = c.varint();
        m.path = text(c.string());
        m.build_id = text(c.string());
        uint64_t nseg = c.varint();
        if (!c.ok() || nseg > 256) return false;
        for (uint64_t i = 0; i < nseg; ++i) {
          uint64_t vaddr = c.varint();
          uint64_t memsz = c.varint();
          m.segments.emplace_back(vaddr, memsz);
        }
        if (!c.ok()) return false;
        t_.modules.push_back(std::move(m));
        break;
      }
      case fmt::Tag::kPythonCode: {
        const uint32_t id = static_cast<uint32_t>(c.varint());
        PythonCode code;
        code.filename = text(c.string());
        code.qualname = text(c.string());
        code.first_line = static_cast<int>(c.varint());
        code.table_format = static_cast<uint8_t>(c.varint());
        code.line_table = text(c.string(), kMaxLineTable);
        if (!c.ok()) return false;
        t_.python_codes[id] = std::move(code);
        break;
      }
      case fmt::Tag::kPython: {
        const uint8_t status = static_cast<uint8_t>(c.varint());
        std::string_view version = c.string();
        std::string_view module = c.string();
        std::string_view note = c.string();
        if (!c.ok()) return false;
        t_.python_status = status;
        t_.python_version = text(version);
        t_.python_module = text(module);
        t_.python_note = text(note);
        break;
      }
      case fmt::Tag::kString: {
        uint32_t id = static_cast<uint32_t>(c.varint());
        std::string_view s = c.string();
        if (!c.ok()) return false;
        t_.strings[id] = text(s);
        break;
      }
      default:
        return false;
    }
    return true;
  }

  // The life of the process: samples, threads, signals, forks, execs, drops
  // and how it ended.
  bool process_record(fmt::Tag tag, fmt::Cursor& c) {
    switch (tag) {
      case fmt::Tag::kSample: {
        TraceSample s;
        s.ts = c.varint();
        s.rss = c.varint();
        s.heap_held = c.varint();
        s.heap_in_use = c.varint();
        s.cgroup_limit = c.varint();
        s.cgroup_usage = c.varint();
        s.host_live = c.svarint();
        s.host_allocs = c.varint();
        s.host_frees = c.varint();
        if (!c.ok()) return false;
        note_ts(s.ts);
        t_.samples.push_back(s);
        break;
      }
      case fmt::Tag::kPressure: {
        TracePressure p;
        p.ts = c.varint();
        p.present = static_cast<uint32_t>(c.varint());
        p.mem_total = c.varint();
        p.mem_available = c.varint();
        p.swap_total = c.varint();
        p.swap_free = c.varint();
        p.swap_in = c.varint();
        p.swap_out = c.varint();
        p.psi_some_avg10 = static_cast<uint32_t>(std::min<uint64_t>(c.varint(), 10000));
        p.psi_full_avg10 = static_cast<uint32_t>(std::min<uint64_t>(c.varint(), 10000));
        p.psi_some_total = c.varint();
        p.psi_full_total = c.varint();
        p.cgroup_oom_kills = c.varint();
        if (!c.ok()) return false;
        note_ts(p.ts);
        t_.pressure.push_back(p);
        break;
      }
      case fmt::Tag::kThread: {
        c.varint();
        c.string();
        if (!c.ok()) return false;
        break;
      }
      case fmt::Tag::kSignal: {
        TraceSignal s;
        s.ts = c.varint();
        s.tid = static_cast<uint32_t>(c.varint());
        s.signo = static_cast<int>(c.varint());
        s.code = static_cast<int>(c.svarint());
        s.fault_addr = c.varint();
        s.stack = static_cast<uint32_t>(c.varint());
        if (!c.ok()) return false;
        note_ts(s.ts);
        t_.signals.push_back(s);
        break;
      }
      case fmt::Tag::kExit: {
        uint64_t ts = c.varint();
        int64_t status = c.svarint();
        if (!c.ok()) return false;
        note_ts(ts);
        t_.has_exit = true;
        t_.exit_status = static_cast<int>(status);
        break;
      }
      case fmt::Tag::kDropped: {
        uint64_t n = c.varint();
        if (!c.ok()) return false;
        t_.dropped += n;
        break;
      }
      case fmt::Tag::kExec: {
        uint64_t ts = c.varint();
        std::string_view path = c.string();
        if (!c.ok()) return false;
        note_ts(ts);
        t_.execs.push_back(text(path));
        break;
      }
      case fmt::Tag::kFork: {
        c.varint();
        c.varint();
        if (!c.ok()) return false;
        break;
      }
      case fmt::Tag::kShare: {
        TraceShare share;
        share.ts = c.varint();
        share.rss = c.varint();
        share.pss = c.varint();
        share.shared = c.varint();
        share.priv = c.varint();
        if (!c.ok()) return false;
        note_ts(share.ts);
        t_.shares.push_back(share);
        break;
      }
      case fmt::Tag::kInfo: {
        TraceInfo info;
        info.ts = c.varint();
        info.key = static_cast<uint32_t>(c.varint());
        info.value = static_cast<uint32_t>(c.varint());
        if (!c.ok()) return false;
        if (t_.info.size() < kMaxInfoRecords) t_.info.push_back(info);
        break;
      }
      case fmt::Tag::kEnd: {
        uint64_t ts = c.varint();
        if (!c.ok()) return false;
        note_ts(ts);
        t_.has_end = true;
        break;
      }
      case fmt::Tag::kTracerError: {
        c.varint();
        std::string_view msg = c.string();
        if (!c.ok()) return false;
        t_.tracer_error = text(msg);
        break;
      }
      default:
        return false;
    }
    return true;
  }

  void note_ts(uint64_t ts) { t_.last_ts = std::max(t_.last_ts, ts); }
  // A string from the trace, at most `cap` bytes: the report copies names
  // into every frame that shows them, so one long string must not be able
  // to cost memory many times its size.
  std::string text(std::string_view s, size_t cap = kMaxTraceString) {
    if (s.size() <= cap) return std::string(s);
    ++t_.strings_cut;
    return std::string(s.substr(0, cap)) + "...";
  }
  Trace& t_;
  uint32_t version_;  // the file's format version
};

// Finds the next plausible frame header at or after `pos`.
size_t resync(const uint8_t* data, size_t size, size_t pos) {
  const uint32_t magic = fmt::kFrameMagic;
  for (size_t i = pos; i + sizeof(fmt::FrameHeader) <= size; ++i) {
    if (std::memcmp(data + i, &magic, sizeof magic) == 0) return i;
  }
  return size;
}

template <typename Fn>
void for_each_frame(const std::string& path, const MappedFile& file, size_t offset, Trace& trace, Fn&& on_payload) {
  const uint8_t* data = file.data();
  const size_t size = file.size();
  std::vector<uint8_t> raw;
  size_t pos = offset;
  bool in_damage = false;
  uint64_t over_budget = 0, over_budget_bytes = 0;
  uint32_t first_over_budget = 0;
  while (pos < size) {
    if (size - pos < sizeof(fmt::FrameHeader)) {
      trace.truncated = true;
      trace.bytes_skipped += size - pos;
      trace.problems.push_back(path + ": the file ends inside a frame header (the process stopped mid-write); the last " +
                               std::to_string(size - pos) + " bytes are ignored");
      break;
    }
    fmt::FrameHeader fh;
    std::memcpy(&fh, data + pos, sizeof fh);
    bool valid = fh.magic == fmt::kFrameMagic && fh.stored_len <= fmt::kMaxFramePayload &&
                 fh.raw_len <= fmt::kMaxFramePayload;
    if (valid && fh.stored_len > size - pos - sizeof fh) {
      // A torn last frame, or a damaged length field.
      size_t next = resync(data, size, pos + 1);
      if (next == size) {
        trace.truncated = true;
        trace.bytes_skipped += size - pos;
        trace.problems.push_back(path + ": the file ends inside frame " + std::to_string(fh.index) +
                                 " (the process stopped mid-write); " + std::to_string(size - pos) +
                                 " bytes are ignored");
        break;
      }
      valid = false;
    }
    const uint8_t* payload = data + pos + sizeof fh;
    if (valid) {
      uint32_t crc = libdeflate_crc32(0, payload, fh.stored_len);
      valid = crc == fh.crc32;
    }
    if (!valid) {
      size_t next = resync(data, size, pos + 1);
      if (!in_damage) {
        ++trace.frames_damaged;
        trace.problems.push_back(path + ": damaged data at byte " + std::to_string(pos) +
                                 " (checksum or header mismatch); skipped to byte " + std::to_string(next));
      }
      in_damage = true;
      trace.bytes_skipped += next - pos;
      pos = next;
      continue;
    }
    in_damage = false;
    const uint8_t* body = payload;
    size_t body_len = fh.stored_len;
    if (fh.flags & fmt::kFrameCompressed) {
      const uint64_t budget = kInflateFloor + kInflateRatio * size;
      if (trace.bytes_inflated + fh.raw_len > budget) {
        // A frame that would take the decompressed total past the budget is
        // skipped (a later, smaller one may still fit).
        ++trace.frames_damaged;
        if (over_budget++ == 0) first_over_budget = fh.index;
        over_budget_bytes += sizeof fh + fh.stored_len;
        trace.bytes_skipped += sizeof fh + fh.stored_len;
        pos += sizeof fh + fh.stored_len;
        continue;
      }
      trace.bytes_inflated += fh.raw_len;
      raw.resize(fh.raw_len);
      size_t n = ZSTD_decompress(raw.data(), raw.size(), payload, fh.stored_len);
      if (ZSTD_isError(n) || n != fh.raw_len) {
        ++trace.frames_damaged;
        trace.problems.push_back(path + ": frame " + std::to_string(fh.index) + " does not decompress; skipped");
        pos += sizeof fh + fh.stored_len;
        continue;
      }
      body = raw.data();
      body_len = n;
    }
    ++trace.frames_read;
    if (!on_payload(body, body_len, fh.index)) {
      ++trace.frames_damaged;
      trace.problems.push_back(path + ": frame " + std::to_string(fh.index) +
                               " holds malformed records; the rest of that frame is skipped");
    }
    pos += sizeof fh + fh.stored_len;
  }
  if (over_budget > 0) {
    trace.problems.push_back(path + ": " + std::to_string(over_budget) + " frames (" + std::to_string(over_budget_bytes) +
                             " bytes; the first, frame " + std::to_string(first_over_budget) +
                             ") skipped: they would decompress to more than " +
                             std::to_string(kInflateFloor + kInflateRatio * size) + " bytes in all, over " +
                             std::to_string(kInflateRatio) +
                             " times the file's size, which no trace memledger writes does (damaged or made up); "
                             "the report is partial");
  }
}

// Samples and signals are looked up by time, side records by sequence:
// frames that reached the file out of order must not leave them out of
// order. (stream_trace's caller consumes the side records as they come, so
// there only samples and signals are sorted.)
void sort_by_time(Trace& trace, bool side_records = true) {
  auto by_ts = [](const auto& a, const auto& b) { return a.ts < b.ts; };
  auto by_seq = [](const auto& a, const auto& b) { return a.seq < b.seq; };
  auto sort_if_needed = [](auto& v, auto less) {
    if (!std::is_sorted(v.begin(), v.end(), less)) std::stable_sort(v.begin(), v.end(), less);
  };
  sort_if_needed(trace.samples, by_ts);
  sort_if_needed(trace.pressure, by_ts);
  sort_if_needed(trace.signals, by_ts);
  sort_if_needed(trace.host_totals, [](const auto& a, const auto& b) { return a.seq < b.seq; });
  if (!side_records) return;
  sort_if_needed(trace.vmm, by_seq);
  sort_if_needed(trace.device_samples, by_seq);
  sort_if_needed(trace.pool_samples, by_seq);
}

// Says which of the reader's bounds a trace reached.
void note_limits(Trace& trace) {
  if (trace.strings_cut > 0) {
    trace.problems.push_back(trace.path + ": " + std::to_string(trace.strings_cut) + " strings longer than " +
                             std::to_string(kMaxTraceString) + " bytes were cut (shown up to there, then '...')");
  }
  if (trace.stacks_cut > 0) {
    trace.problems.push_back(trace.path + ": " + std::to_string(trace.stacks_cut) + " stacks deeper than " +
                             std::to_string(kMaxStackFrames) + " frames were cut to their innermost " +
                             std::to_string(kMaxStackFrames));
  }
}

}  // namespace

int Trace::pid() const {
  auto it = header.find("pid");
  return it == header.end() ? 0 : std::atoi(it->second.c_str());
}

std::string Trace::header_value(const std::string& key, const std::string& fallback) const {
  auto it = header.find(key);
  return it == header.end() ? fallback : it->second;
}

std::vector<std::pair<std::string_view, std::string_view>> Trace::info_strings() const {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  out.reserve(info.size());
  for (const TraceInfo& i : info) {
    auto key = strings.find(i.key);
    auto value = strings.find(i.value);
    if (key != strings.end() && value != strings.end()) out.emplace_back(key->second, value->second);
  }
  return out;
}

std::string Trace::command_line() const {
  std::string cmd = header_value("command");
  std::replace(cmd.begin(), cmd.end(), '\x1f', ' ');
  return cmd;
}

Trace read_trace(const std::string& path, bool load_events) {
  MappedFile file(path);
  Header h = parse_header(path, file);
  Trace trace;
  trace.path = path;
  trace.file_bytes = file.size();
  trace.version = h.version;
  trace.header = std::move(h.values);
  if (!load_events) return trace;
  // A full-mode trace holds about one event per 5 stored bytes: reserve
  // address space up front rather than copying a growing vector.
  trace.events.reserve(file.size() / 4);
  RecordDecoder decoder(trace, trace.version);
  for_each_frame(path, file, h.frames_offset, trace,
                 [&](const uint8_t* body, size_t len, uint32_t) { return decoder.decode(body, len); });
  sort_by_time(trace);
  // Events of different threads reach the file nearly, not exactly, in order.
  if (!std::is_sorted(trace.events.begin(), trace.events.end(),
                      [](const TraceEvent& a, const TraceEvent& b) { return a.seq < b.seq; })) {
    std::stable_sort(trace.events.begin(), trace.events.end(),
                     [](const TraceEvent& a, const TraceEvent& b) { return a.seq < b.seq; });
  }
  if (trace.frames_read == 0 && (trace.frames_damaged > 0 || trace.truncated)) {
    trace.problems.push_back(path + ": no complete frame could be read");
  }
  note_limits(trace);
  return trace;
}

namespace {

// Moves every record but the events from one decoded frame into the trace.
void absorb_side_records(Trace& into, Trace& from) {
  auto append = [](auto& to, auto& src) {
    to.insert(to.end(), std::make_move_iterator(src.begin()), std::make_move_iterator(src.end()));
    src.clear();
  };
  append(into.modules, from.modules);
  append(into.samples, from.samples);
  append(into.pressure, from.pressure);
  append(into.shares, from.shares);
  append(into.host_totals, from.host_totals);
  append(into.vmm, from.vmm);
  append(into.device_samples, from.device_samples);
  append(into.pool_samples, from.pool_samples);
  append(into.signals, from.signals);
  append(into.execs, from.execs);
  append(into.cupti_status, from.cupti_status);
  if (into.info.size() < kMaxInfoRecords) append(into.info, from.info);
  from.info.clear();
  {
    const size_t room = kMaxCuptiRecords - std::min(kMaxCuptiRecords, into.cupti_memory.size());
    const size_t kept = std::min(room, from.cupti_memory.size());
    into.cupti_records_over_cap += from.cupti_records_over_cap + (from.cupti_memory.size() - kept);
    into.cupti_memory.insert(into.cupti_memory.end(), from.cupti_memory.begin(), from.cupti_memory.begin() + kept);
    from.cupti_memory.clear();
  }
  into.cupti_releases += from.cupti_releases;
  into.cupti_pool_records += from.cupti_pool_records;
  into.cupti_dropped += from.cupti_dropped;
  from.cupti_records_over_cap = from.cupti_releases = from.cupti_pool_records = from.cupti_dropped = 0;
  into.stacks.absorb(from.stacks);
  for (auto& [id, text] : from.strings) into.strings[id] = std::move(text);
  from.strings.clear();
  for (auto& [id, code] : from.python_codes) into.python_codes[id] = std::move(code);
  from.python_codes.clear();
  if (from.python_status != 0) {
    into.python_status = from.python_status;
    into.python_version = std::move(from.python_version);
    into.python_module = std::move(from.python_module);
    into.python_note = std::move(from.python_note);
    from.python_status = 0;
  }
  if (from.has_exit) {
    into.has_exit = true;
    into.exit_status = from.exit_status;
  }
  into.has_end = into.has_end || from.has_end;
  if (!from.tracer_error.empty()) into.tracer_error = std::move(from.tracer_error);
  into.dropped += from.dropped;
  into.last_ts = std::max(into.last_ts, from.last_ts);
  into.strings_cut += from.strings_cut;
  into.stacks_cut += from.stacks_cut;
  from.has_exit = from.has_end = false;
  from.tracer_error.clear();
  from.dropped = from.last_ts = from.strings_cut = from.stacks_cut = 0;
}

// Decoded frames travel from the reading thread to the caller through a
// small bounded queue; their buffers are recycled so that a long trace costs
// a few frames of memory.
class FrameQueue {
 public:
  static constexpr size_t kDepth = 4;

  std::unique_ptr<Trace> take_empty() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !spare_.empty() || in_flight_ < kDepth || cancelled_; });
    if (cancelled_) return nullptr;
    ++in_flight_;
    if (spare_.empty()) return std::make_unique<Trace>();
    std::unique_ptr<Trace> t = std::move(spare_.back());
    spare_.pop_back();
    return t;
  }
  void push_full(std::unique_ptr<Trace> t) {
    std::lock_guard lock(mu_);
    full_.push_back(std::move(t));
    cv_.notify_all();
  }
  void finish(std::exception_ptr error) {
    std::lock_guard lock(mu_);
    done_ = true;
    error_ = error;
    cv_.notify_all();
  }
  // Null at the end of the stream.
  std::unique_ptr<Trace> take_full() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !full_.empty() || done_; });
    if (full_.empty()) return nullptr;
    std::unique_ptr<Trace> t = std::move(full_.front());
    full_.pop_front();
    return t;
  }
  void give_back(std::unique_ptr<Trace> t) {
    std::lock_guard lock(mu_);
    t->events.clear();
    spare_.push_back(std::move(t));
    --in_flight_;
    cv_.notify_all();
  }
  void cancel() {
    std::lock_guard lock(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }
  std::exception_ptr error() {
    std::lock_guard lock(mu_);
    return error_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Trace>> full_;
  std::vector<std::unique_ptr<Trace>> spare_;
  size_t in_flight_ = 0;
  bool done_ = false;
  bool cancelled_ = false;
  std::exception_ptr error_;
};

}  // namespace

void stream_trace(Trace& trace, const EventBatchFn& on_events) {
  MappedFile file(trace.path);
  const Header h = parse_header(trace.path, file);
  madvise(const_cast<uint8_t*>(file.data()), file.size(), MADV_SEQUENTIAL);

  FrameQueue queue;
  Trace integrity;  // frame counts and problems, written by the reading thread only
  std::thread reader([&] {
    std::exception_ptr error;
    try {
      for_each_frame(trace.path, file, h.frames_offset, integrity, [&](const uint8_t* body, size_t len, uint32_t) {
        std::unique_ptr<Trace> chunk = queue.take_empty();
        if (!chunk) throw TraceError("cancelled");
        RecordDecoder decoder(*chunk, trace.version);
        const bool ok = decoder.decode(body, len);
        auto by_seq = [](const TraceEvent& a, const TraceEvent& b) { return a.seq < b.seq; };
        if (!std::is_sorted(chunk->events.begin(), chunk->events.end(), by_seq)) {
          std::stable_sort(chunk->events.begin(), chunk->events.end(), by_seq);
        }
        queue.push_full(std::move(chunk));
        return ok;
      });
    } catch (...) {
      error = std::current_exception();
    }
    queue.finish(error);
  });

  // Events wait in `pending` (sorted by seq) until every one of the last
  // kReorderFrames frames started after them.
  std::vector<TraceEvent> pending;
  size_t pending_begin = 0;
  std::deque<uint64_t> first_seqs;
  uint64_t delivered_seq = 0;
  bool delivered_any = false;
  auto deliver_below = [&](uint64_t limit) {
    auto begin = pending.begin() + static_cast<long>(pending_begin);
    auto end = std::lower_bound(begin, pending.end(), limit,
                                [](const TraceEvent& e, uint64_t seq) { return e.seq < seq; });
    const size_t n = static_cast<size_t>(end - begin);
    if (n == 0) return;
    on_events(&*begin, n);
    delivered_seq = (end - 1)->seq;
    delivered_any = true;
    pending_begin += n;
    if (pending_begin == pending.size()) {
      pending.clear();
      pending_begin = 0;
    } else if (pending_begin > pending.size() / 2) {
      pending.erase(pending.begin(), pending.begin() + static_cast<long>(pending_begin));
      pending_begin = 0;
    }
  };
  try {
    while (std::unique_ptr<Trace> chunk = queue.take_full()) {
      absorb_side_records(trace, *chunk);
      std::vector<TraceEvent>& events = chunk->events;
      if (!events.empty()) {
        size_t late = 0;
        if (delivered_any) {
          while (late < events.size() && events[late].seq <= delivered_seq) ++late;
        }
        if (late > 0) {
          // Later than the reorder window: hand them over now, out of order.
          trace.late_events += late;
          on_events(events.data(), late);
        }
        if (late < events.size()) {
          const size_t old = pending.size();
          const bool in_order = old == pending_begin || pending.back().seq < events[late].seq;
          pending.insert(pending.end(), events.begin() + static_cast<long>(late), events.end());
          if (!in_order) {
            std::inplace_merge(pending.begin() + static_cast<long>(pending_begin), pending.begin() + static_cast<long>(old),
                               pending.end(), [](const TraceEvent& a, const TraceEvent& b) { return a.seq < b.seq; });
          }
          first_seqs.push_back(events[late].seq);
          if (first_seqs.size() > kReorderFrames) first_seqs.pop_front();
          if (first_seqs.size() == kReorderFrames) {
            deliver_below(*std::min_element(first_seqs.begin(), first_seqs.end()));
          }
        }
      }
      queue.give_back(std::move(chunk));
    }
    // The end of the trace: everything still held back, in order.
    if (pending_begin < pending.size()) on_events(pending.data() + pending_begin, pending.size() - pending_begin);
  } catch (...) {
    queue.cancel();
    reader.join();
    throw;
  }
  reader.join();
  if (std::exception_ptr error = queue.error()) std::rethrow_exception(error);

  trace.frames_read += integrity.frames_read;
  trace.frames_damaged += integrity.frames_damaged;
  trace.bytes_skipped += integrity.bytes_skipped;
  trace.truncated = trace.truncated || integrity.truncated;
  trace.bytes_inflated += integrity.bytes_inflated;
  trace.problems.insert(trace.problems.end(), integrity.problems.begin(), integrity.problems.end());
  note_limits(trace);
  if (trace.frames_read == 0 && (trace.frames_damaged > 0 || trace.truncated)) {
    trace.problems.push_back(trace.path + ": no complete frame could be read");
  }
  sort_by_time(trace, false);
  if (trace.late_events > 0) {
    trace.problems.push_back(trace.path + ": " + std::to_string(trace.late_events) +
                             " events reached the file more than " + std::to_string(kReorderFrames) +
                             " frames late and were replayed out of order");
  }
}

void dump_trace(const std::string& path, std::FILE* out) {
  MappedFile file(path);
  Header h = parse_header(path, file);
  std::fprintf(out, "# %s: memledger trace, format version %u\n", path.c_str(), h.version);
  for (const auto& [key, value] : h.values) {
    std::string v = value;
    std::replace(v.begin(), v.end(), '\x1f', ' ');
    std::fprintf(out, "# %s=%s\n", key.c_str(), v.c_str());
  }
  Trace scratch;
  for_each_frame(path, file, h.frames_offset, scratch, [&](const uint8_t* body, size_t len, uint32_t index) {
    std::fprintf(out, "frame %u: %zu bytes\n", index, len);
    Trace one;
    RecordDecoder decoder(one, h.version);
    bool ok = decoder.decode(body, len);
    for (const ModuleInfo& m : one.modules) {
      std::fprintf(out, "module base=0x%" PRIx64 " path=%s build_id=%s segments=%zu\n", m.base, m.path.c_str(),
                   m.build_id.empty() ? "-" : m.build_id.c_str(), m.segments.size());
    }
    for (const auto& [id, s] : one.strings) std::fprintf(out, "string id=%u text=%s\n", id, s.c_str());
    if (one.python_status != 0) {
      std::fprintf(out, "python status=%s version=%s module=%s%s%s\n",
                   one.python_status == static_cast<uint8_t>(fmt::PythonStatus::kActive) ? "active" : "unsupported",
                   one.python_version.empty() ? "-" : one.python_version.c_str(),
                   one.python_module.empty() ? "-" : one.python_module.c_str(),
                   one.python_note.empty() ? "" : " note=", one.python_note.c_str());
    }
    for (const auto& [id, code] : one.python_codes) {
      std::fprintf(out, "python_code id=%u file=%s function=%s first_line=%d line_table=%zu bytes (format %u)\n", id,
                   code.filename.c_str(), code.qualname.c_str(), code.first_line, code.line_table.size(),
                   static_cast<unsigned>(code.table_format));
    }
    std::vector<uint64_t> frames;
    for (uint32_t id : one.stacks.ids()) {
      one.stacks.get(id, frames);
      std::fprintf(out, "stack id=%u depth=%zu", id, frames.size());
      for (uint64_t ip : frames) {
        if (fmt::is_python_frame(ip)) {
          std::fprintf(out, fmt::is_attributed_python_frame(ip) ? " py-attributed:%u+%u" : " py:%u+%u",
                       fmt::python_code_id(ip), fmt::python_offset(ip));
        } else {
          std::fprintf(out, " 0x%" PRIx64, ip);
        }
      }
      std::fprintf(out, "\n");
    }
    for (const TraceEvent& e : one.events) {
      switch (e.type) {
        case EvType::kAlloc:
          std::fprintf(out,
                       "alloc seq=%" PRIu64 " ts=%" PRIu64 " kind=%s device=%u addr=0x%" PRIx64
                       " bytes=%" PRIu64 " stack=%u flags=%u\n",
                       e.seq, e.ts, fmt::kind_name(static_cast<fmt::Kind>(e.kind)), e.device, e.addr, e.size,
                       e.stack, e.flags & ~kAllocByChance);
          break;
        case EvType::kFree:
          std::fprintf(out, "free seq=%" PRIu64 " ts=%" PRIu64 " kind=%s addr=0x%" PRIx64 "\n", e.seq, e.ts,
                       fmt::kind_name(static_cast<fmt::Kind>(e.kind)), e.addr);
          break;
        case EvType::kStep:
          std::fprintf(out, "step seq=%" PRIu64 " ts=%" PRIu64 " index=%" PRIu64 " source=%s label=%" PRIu64 "\n",
                       e.seq, e.ts, e.addr, fmt::step_source_name(static_cast<fmt::StepSource>(e.flags)),
                       e.size);
          break;
      }
    }
    for (const TraceHostTotals& t : one.host_totals) {
      std::fprintf(out, "host_totals seq=%" PRIu64 " host_live=%" PRId64 " host_allocs=%u host_frees=%u (mod 2^32)\n",
                   t.seq, t.host_live, t.host_allocs, t.host_frees);
    }
    for (const TraceVmmEvent& v : one.vmm) {
      static const char* const kNames[] = {"reserve", "unreserve", "map", "unmap"};
      std::fprintf(out, "%s seq=%" PRIu64 " ts=%" PRIu64 " device=%u addr=0x%" PRIx64 " size=%" PRIu64 " handle=0x%" PRIx64
                   " stack=%u\n", kNames[static_cast<int>(v.type)], v.seq, v.ts, v.device, v.addr, v.size, v.handle, v.stack);
    }
    for (const TraceDeviceSample& d : one.device_samples) {
      std::fprintf(out, "device_sample seq=%" PRIu64 " ts=%" PRIu64 " device=%u free=%" PRIu64 " total=%" PRIu64 "\n",
                   d.seq, d.ts, d.device, d.free, d.total);
    }
    for (const TracePoolSample& p : one.pool_samples) {
      std::fprintf(out, "pool_sample seq=%" PRIu64 " ts=%" PRIu64 " device=%u pool=0x%" PRIx64 " reserved=%" PRIu64
                   " used=%" PRIu64 "\n", p.seq, p.ts, p.device, p.pool, p.reserved, p.used);
    }
    for (const TraceSample& s : one.samples) {
      std::fprintf(out,
                   "sample ts=%" PRIu64 " rss=%" PRIu64 " heap_held=%" PRIu64 " heap_in_use=%" PRIu64
                   " cgroup_limit=%" PRIu64 " cgroup_usage=%" PRIu64 " host_live=%" PRId64 " host_allocs=%" PRIu64
                   " host_frees=%" PRIu64 "\n",
                   s.ts, s.rss, s.heap_held, s.heap_in_use, s.cgroup_limit, s.cgroup_usage, s.host_live,
                   s.host_allocs, s.host_frees);
    }
    for (const TracePressure& p : one.pressure) {
      std::fprintf(out,
                   "pressure ts=%" PRIu64 " present=0x%x mem_total=%" PRIu64 " mem_available=%" PRIu64
                   " swap_total=%" PRIu64 " swap_free=%" PRIu64 " swap_in=%" PRIu64 " swap_out=%" PRIu64
                   " psi_some_avg10=%u.%02u psi_full_avg10=%u.%02u psi_some_total=%" PRIu64 " psi_full_total=%" PRIu64
                   " cgroup_oom_kills=%" PRIu64 "\n",
                   p.ts, p.present, p.mem_total, p.mem_available, p.swap_total, p.swap_free, p.swap_in, p.swap_out,
                   p.psi_some_avg10 / 100, p.psi_some_avg10 % 100, p.psi_full_avg10 / 100, p.psi_full_avg10 % 100,
                   p.psi_some_total, p.psi_full_total, p.cgroup_oom_kills);
    }
    for (const TraceSignal& s : one.signals) {
      std::fprintf(out, "signal ts=%" PRIu64 " tid=%u signo=%d code=%d fault_addr=0x%" PRIx64 " stack=%u\n", s.ts,
                   s.tid, s.signo, s.code, s.fault_addr, s.stack);
    }
    for (const TraceCuptiStatus& s : one.cupti_status) {
      std::fprintf(out, "cupti_status seq=%" PRIu64 " ts=%" PRIu64 " status=%u version=%u text=%u holder=%u\n", s.seq,
                   s.ts, s.status, s.version, s.text, s.holder);
    }
    for (const TraceCuptiMemory& m : one.cupti_memory) {
      std::fprintf(out, "cupti_alloc ts=%" PRIu64 " kind=%s cupti_kind=%s device=%u stream=%u addr=0x%" PRIx64
                   " bytes=%" PRIu64 " pc=0x%" PRIx64 " correlation=%u flags=%u name=%u\n", m.ts,
                   fmt::kind_name(static_cast<fmt::Kind>(m.kind)), fmt::cupti_kind_name(m.cupti_kind), m.device,
                   m.stream, m.addr, m.bytes, m.pc, m.correlation, m.flags, m.name);
    }
    if (one.cupti_releases) std::fprintf(out, "cupti_releases count=%" PRIu64 "\n", one.cupti_releases);
    if (one.cupti_pool_records) std::fprintf(out, "cupti_pool_records count=%" PRIu64 "\n", one.cupti_pool_records);
    if (one.cupti_dropped) std::fprintf(out, "cupti_dropped count=%" PRIu64 "\n", one.cupti_dropped);
    for (const TraceInfo& i : one.info) {
      std::fprintf(out, "info ts=%" PRIu64 " key=%u value=%u\n", i.ts, i.key, i.value);
    }
    for (const std::string& e : one.execs) std::fprintf(out, "exec path=%s\n", e.c_str());
    if (one.dropped) std::fprintf(out, "dropped count=%" PRIu64 "\n", one.dropped);
    if (one.has_exit) std::fprintf(out, "exit status=%d\n", one.exit_status);
    if (!one.tracer_error.empty()) std::fprintf(out, "tracer_error message=%s\n", one.tracer_error.c_str());
    if (one.has_end) std::fprintf(out, "end\n");
    if (!ok) std::fprintf(out, "# frame %u: malformed record; rest of frame skipped\n", index);
    return true;
  });
  for (const std::string& p : scratch.problems) std::fprintf(out, "# %s\n", p.c_str());
}

}  // namespace memledger::report
