#include "cupti_view.h"

#include <algorithm>

#include "trace_format.h"

namespace memledger::report {

namespace fmt = memledger::format;

namespace {

const char* status_name(uint8_t status) {
  switch (static_cast<fmt::CuptiStatus>(status)) {
    case fmt::CuptiStatus::kActive: return "active";
    case fmt::CuptiStatus::kOff: return "off";
    case fmt::CuptiStatus::kUnavailable: return "unavailable";
    case fmt::CuptiStatus::kHeld: return "held";
    case fmt::CuptiStatus::kFailed: return "failed";
    case fmt::CuptiStatus::kStopped: return "stopped";
  }
  return "unknown";
}

// Device-side allocations both sides can see. VMM physical allocations
// (counted by handle, not address) and registered host memory (no new
// memory) are not compared.
bool comparable(const TraceEvent& e) {
  if (e.type != EvType::kAlloc || e.kind == static_cast<uint8_t>(fmt::Kind::kHost) ||
      e.kind == static_cast<uint8_t>(fmt::Kind::kMapped)) {
    return false;
  }
  return (e.flags & (fmt::kAllocFailed | fmt::kAllocPhysical | fmt::kAllocRegistered | fmt::kAllocSampled)) == 0;
}

void keep_largest(std::vector<CuptiMismatch>& list, const CuptiMismatch& m) {
  list.push_back(m);
  if (list.size() > CuptiView::kMaxListed * 4) {
    std::sort(list.begin(), list.end(), [](const CuptiMismatch& a, const CuptiMismatch& b) { return a.bytes > b.bytes; });
    list.resize(CuptiView::kMaxListed);
  }
}

}  // namespace

bool CuptiMatcher::in_window(uint64_t seq) const {
  // CUPTI starts at cuInit, before any device allocation can be made, so a
  // window opens at the start; it closes when collection stopped (handover,
  // exit). Sequence numbers, not the hooks' coarse timestamps, tell what
  // came before the change.
  bool open = false;
  for (const TraceCuptiStatus& s : trace_.cupti_status) {
    if (s.status == static_cast<uint8_t>(fmt::CuptiStatus::kActive)) {
      open = true;
    } else if (open && seq < s.seq) {
      return true;
    } else {
      open = false;
    }
  }
  return open;
}

CuptiMismatch CuptiMatcher::mismatch(uint64_t addr, const Pending& p) {
  CuptiMismatch m;
  m.ts_ns = p.ts;
  m.addr = addr;
  m.bytes = p.bytes;
  m.kind = p.kind;
  m.device = p.device;
  m.pc = p.pc;
  m.stack = p.stack;
  m.mapping = p.mapping;
  m.cupti_kind = p.cupti_kind;
  m.async = p.async;
  m.correlation = p.correlation;
  return m;
}

void CuptiMatcher::add(bool from_cupti, uint64_t addr, const Pending& p) {
  auto& other = from_cupti ? hooks_pending_ : cupti_pending_;
  auto it = other.find(addr);
  if (it != other.end() && !it->second.empty()) {
    // In order of reuse, but the one of the same size first: CUPTI hands its
    // records over in buffers, not always in the order the allocations were
    // made, and a pool gives an address out again at once, to another size.
    auto same = std::find_if(it->second.begin(), it->second.end(),
                             [&](const Pending& q) { return q.bytes == p.bytes; });
    if (same == it->second.end()) same = it->second.begin();
    const Pending first = *same;
    ++view_.matched;
    view_.matched_bytes += from_cupti ? first.bytes : p.bytes;  // what the program asked for
    if (first.bytes != p.bytes) {
      ++view_.size_differences;
      if (view_.size_differences_list.size() < CuptiView::kMaxListed) {
        const Pending& hooks = from_cupti ? first : p;
        const Pending& cupti = from_cupti ? p : first;
        CuptiMismatch d = mismatch(addr, hooks);
        d.cupti_kind = cupti.cupti_kind;
        d.async = cupti.async;
        d.correlation = cupti.correlation;
        d.cupti_bytes = cupti.bytes;
        view_.size_differences_list.push_back(std::move(d));
      }
    }
    if (first.mapping || p.mapping) ++view_.matched_mappings;
    it->second.erase(same);
    if (it->second.empty()) other.erase(it);
    return;
  }
  (from_cupti ? cupti_pending_ : hooks_pending_)[addr].push_back(p);
}

void CuptiMatcher::take_cupti_records() {
  const auto& records = trace_.cupti_memory;
  for (; cupti_consumed_ < records.size(); ++cupti_consumed_) {
    const TraceCuptiMemory& m = records[cupti_consumed_];
    Pending p;
    p.ts = m.ts;
    p.bytes = m.bytes;
    p.pc = m.pc;
    p.device = m.device;
    p.kind = m.kind;
    p.cupti_kind = m.cupti_kind;
    p.async = (m.flags & 1) != 0;
    p.correlation = m.correlation;
    if (fmt::is_module_static(m.cupti_kind)) {
      ++view_.module_statics;
      view_.module_statics_bytes += m.bytes;
      CuptiMismatch s = mismatch(m.addr, p);
      s.name_id = m.name;
      keep_largest(view_.module_statics_list, s);
      continue;
    }
    add(true, m.addr, p);
  }
}

// The hooks' VMM mappings: CUPTI reports the memory of a cuMemMap at the
// mapped address (the cuMemCreate before it has none).
void CuptiMatcher::take_mappings() {
  const auto& vmm = trace_.vmm;
  for (; vmm_consumed_ < vmm.size(); ++vmm_consumed_) {
    const TraceVmmEvent& v = vmm[vmm_consumed_];
    if (v.type != TraceVmmEvent::Type::kMap || !collecting_) continue;
    Pending p;
    p.ts = v.ts;
    p.seq = v.seq;
    p.bytes = v.size;
    p.device = v.device;
    p.kind = static_cast<uint8_t>(fmt::Kind::kDevice);
    p.mapping = true;
    add(false, v.addr, p);
  }
}

void CuptiMatcher::observe(const TraceEvent& event) {
  // CUPTI's records stream in beside the events (stream_trace): pair them
  // as they come, so that what both sides saw does not pile up.
  if ((++events_seen_ & 1023) == 0) take_cupti_records();
  if (trace_.cupti_status.size() != statuses_seen_) {
    statuses_seen_ = trace_.cupti_status.size();
    for (const TraceCuptiStatus& s : trace_.cupti_status) {
      if (s.status == static_cast<uint8_t>(fmt::CuptiStatus::kActive)) collecting_ = true;
    }
  }
  take_mappings();
  if (!collecting_ || !comparable(event)) return;
  Pending p;
  p.ts = event.ts;
  p.seq = event.seq;
  p.bytes = event.size;
  p.stack = event.stack;
  p.device = event.device;
  p.kind = event.kind;
  add(false, event.addr, p);
}

CuptiView CuptiMatcher::finish() {
  take_cupti_records();
  take_mappings();
  CuptiView& v = view_;
  v.cupti_allocations = trace_.cupti_memory.size() + trace_.cupti_records_over_cap;
  v.cupti_releases = trace_.cupti_releases;
  v.cupti_pool_records = trace_.cupti_pool_records;
  v.cupti_dropped = trace_.cupti_dropped;
  // The status that explains the run: while CUPTI never collected, the
  // last reason it was not used; once it collected, that, and how it ended.
  auto text = [&](uint32_t id) {
    auto it = trace_.strings.find(id);
    return it != trace_.strings.end() ? it->second : std::string();
  };
  bool was_active = false;
  for (const TraceCuptiStatus& s : trace_.cupti_status) {
    const bool active = s.status == static_cast<uint8_t>(fmt::CuptiStatus::kActive);
    const bool stopped = s.status == static_cast<uint8_t>(fmt::CuptiStatus::kStopped);
    if (was_active && stopped) {
      v.end_message = text(s.text);
      continue;
    }
    if (was_active && !active) continue;
    was_active = was_active || active;
    v.status = status_name(s.status);
    v.message = text(s.text);
    v.holder = s.holder != 0 ? text(s.holder) : std::string();
    v.version = s.version;
  }
  v.compared = was_active;
  if (!was_active) {
    hooks_pending_.clear();
    cupti_pending_.clear();
    v.module_statics_list.clear();
    return v;
  }
  for (const auto& [addr, list] : hooks_pending_) {
    for (const Pending& p : list) {
      if (!in_window(p.seq)) continue;
      ++v.hooks_only;
      v.hooks_only_bytes += p.bytes;
      keep_largest(v.hooks_only_list, mismatch(addr, p));
    }
  }
  for (const auto& [addr, list] : cupti_pending_) {
    for (const Pending& p : list) {
      ++v.cupti_only;
      v.cupti_only_bytes += p.bytes;
      keep_largest(v.cupti_only_list, mismatch(addr, p));
    }
  }
  for (CuptiMismatch& m : v.module_statics_list) m.name = m.name_id != 0 ? text(m.name_id) : std::string();
  for (auto* list : {&v.hooks_only_list, &v.cupti_only_list, &v.module_statics_list}) {
    std::sort(list->begin(), list->end(), [](const CuptiMismatch& a, const CuptiMismatch& b) {
      return a.bytes != b.bytes ? a.bytes > b.bytes : a.ts_ns < b.ts_ns;
    });
    if (list->size() > CuptiView::kMaxListed) list->resize(CuptiView::kMaxListed);
  }
  hooks_pending_.clear();
  cupti_pending_.clear();
  return v;
}

}  // namespace memledger::report
