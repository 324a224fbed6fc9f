#include "replay.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "sampling.h"
#include "step_inference.h"
#include "trace_format.h"

namespace memledger::report {
namespace {

namespace fmt = memledger::format;

bool is_oom(int error) { return error == 2; }  // CUDA_ERROR_OUT_OF_MEMORY == cudaErrorMemoryAllocation

constexpr size_t kMaxOoms = 16;
constexpr size_t kOomSitesShown = 10;

}  // namespace

uint64_t live_key(uint8_t kind, uint8_t flags, uint64_t addr) {
  // Host heap blocks, mapped ranges, device addresses and VMM handles are
  // separate spaces (pinned host memory shares the device's: CUDA maps it).
  uint64_t space = kind == static_cast<uint8_t>(fmt::Kind::kHost)     ? 0
                   : kind == static_cast<uint8_t>(fmt::Kind::kMapped) ? 3
                   : (flags & fmt::kAllocPhysical)                    ? 2
                                                                      : 1;
  return addr ^ (space << 60);
}

Replay::Replay(const Trace& trace, bool sampled)
    : trace_(trace),
      sampled_(sampled),
      sample_interval_(std::strtoull(trace.header_value("sample_interval", "0").c_str(), nullptr, 10)),
      device_(trace) {
  out_.live.reserve(1 << 16);
}

void Replay::keep_live_set(const KeepLiveSet& keep) {
  keep_.push_back(keep);
  std::sort(keep_.begin(), keep_.end(), [](const KeepLiveSet& a, const KeepLiveSet& b) { return a.seq > b.seq; });
}

void Replay::copy_live_set(const KeepLiveSet& keep) const {
  std::vector<InheritedBlock>& out = *keep.out;
  out.clear();
  for (const auto& [key, a] : out_.live) {
    if (keep.every_kind || a.kind == static_cast<uint8_t>(fmt::Kind::kHost)) {
      out.push_back(InheritedBlock{key, a.weight, a.kind, a.site});
    }
  }
  if (keep.every_kind) return;
  // What this process had itself inherited and still holds goes on too.
  for (const auto& [key, b] : inherited_) out.push_back(b);
}

std::optional<uint64_t> Replay::drop_inherited(uint64_t key) {
  auto it = inherited_.find(key);
  if (it == inherited_.end()) return std::nullopt;
  const uint64_t weight = it->second.weight;
  total_[fmt::kind_index(it->second.kind)] -= static_cast<int64_t>(weight);
  running_total_ -= static_cast<int64_t>(weight);
  inherited_.erase(it);
  return weight;
}

void Replay::inherit(const std::vector<InheritedBlock>& blocks) {
  inherited_.reserve(blocks.size());
  for (const InheritedBlock& b : blocks) {
    if (!inherited_.try_emplace(b.key, b).second) continue;
    // Live in the child as in its parent: they count in its totals and its
    // peak, as in its step ends.
    total_[fmt::kind_index(b.kind)] += static_cast<int64_t>(b.weight);
    running_total_ += static_cast<int64_t>(b.weight);
    ++out_.inherited_blocks;
    out_.inherited_bytes += b.weight;
  }
}

void Replay::note_info() {
  for (; info_seen_ < trace_.info.size(); ++info_seen_) {
    const TraceInfo& info = trace_.info[info_seen_];
    auto key = trace_.strings.find(info.key);
    auto value = trace_.strings.find(info.value);
    if (key == trace_.strings.end() || value == trace_.strings.end()) continue;
    if (key->second == kProgramEndKey) {
      program_end_seq_ = std::min<uint64_t>(program_end_seq_, std::strtoull(value->second.c_str(), nullptr, 10));
      program_end_ts_ = std::min<uint64_t>(program_end_ts_, info.ts);
      continue;
    }
    if (key->second != kOwnWorkKey) continue;
    const std::string& v = value->second;
    const bool begin = v.rfind("begin ", 0) == 0;
    if (!begin && v.rfind("end ", 0) != 0) continue;
    const uint64_t seq = std::strtoull(v.c_str() + (begin ? 6 : 4), nullptr, 10);
    if (begin) {
      // One at a time (a begin while one is open belongs to it): the works
      // are disjoint and in order, and own_work_at keeps a cursor.
      if (!own_work_.empty() && own_work_.back().end_seq == UINT64_MAX) continue;
      OwnWork w;
      w.begin_seq = seq;
      w.begin_ts = info.ts;
      own_work_.push_back(w);
    } else if (!own_work_.empty() && own_work_.back().end_seq == UINT64_MAX && seq >= own_work_.back().begin_seq) {
      own_work_.back().end_seq = seq;
      own_work_.back().end_ts = info.ts;
    }
  }
}

OwnWork* Replay::own_work_at(uint64_t seq) {
  // Events come in sequence order: the works that ended before are behind.
  while (own_cursor_ < own_work_.size() && own_work_[own_cursor_].end_seq <= seq) ++own_cursor_;
  if (own_cursor_ == own_work_.size()) return nullptr;
  OwnWork& w = own_work_[own_cursor_];
  return seq >= w.begin_seq ? &w : nullptr;
}

void Replay::observe(const TraceEvent* events, size_t count) {
  note_info();
  for (size_t i = 0; i < count; ++i) {
    const TraceEvent& e = events[i];
    while (!keep_.empty() && e.seq >= keep_.back().seq) {
      copy_live_set(keep_.back());
      keep_.pop_back();
    }
    device_.catch_up(e.seq);
    if (sampled_) {
      note_samples(e.ts);
      note_host_totals(e.seq);
      last_event_ts_ = std::max(last_event_ts_, e.ts);
    }
    switch (e.type) {
      case EvType::kAlloc:
        if (e.flags & fmt::kAllocFailed) {
          on_failed_alloc(e);
        } else {
          on_alloc(e);
        }
        break;
      case EvType::kFree:
        on_free(e);
        break;
      case EvType::kStep:
        if (e.flags == static_cast<uint8_t>(fmt::StepSource::kInterval) && e.seq > program_end_seq_) break;  // teardown
        on_step(e);
        break;
    }
  }
  out_.events += count;
}

uint32_t Replay::site_of(uint32_t stack, uint8_t kind) {
  auto add = [&] {
    SiteAcc acc;
    acc.stack = stack;
    acc.kind = kind;
    acc.peak_epoch = out_.peak_epoch;
    out_.sites.push_back(std::move(acc));
    return static_cast<uint32_t>(out_.sites.size() - 1);
  };
  if (kind == static_cast<uint8_t>(fmt::Kind::kHost) && stack < kDirectStacks) {
    if (stack >= host_sites_.size()) {
      host_sites_.resize(std::min<size_t>(kDirectStacks, std::max<size_t>(stack + 1, 2 * host_sites_.size())), 0);
    }
    uint32_t& slot = host_sites_[stack];
    if (slot == 0) slot = add() + 1;
    return slot - 1;
  }
  const uint64_t key = (static_cast<uint64_t>(kind) << 32) | stack;
  auto [it, inserted] = site_index_.try_emplace(key, 0);
  if (inserted) it->second = add();
  return it->second;
}

void Replay::touch(uint32_t site) {
  SiteAcc& acc = out_.sites[site];
  if (acc.peak_epoch != out_.peak_epoch) {
    acc.peak_epoch = out_.peak_epoch;
    acc.peak_live = acc.live;
    acc.peak_count = acc.count;
  }
  if (!acc.dirty) {
    acc.dirty = true;
    dirty_.push_back(site);
  }
}

void Replay::retire(const LiveAlloc& a) {
  touch(a.site);
  SiteAcc& acc = out_.sites[a.site];
  acc.live -= static_cast<int64_t>(a.weight);
  --acc.count;
  total_[fmt::kind_index(a.kind)] -= static_cast<int64_t>(a.weight);
  if (a.kind == static_cast<uint8_t>(fmt::Kind::kDevice)) device_live_[a.device] -= static_cast<int64_t>(a.weight);
  running_total_ -= static_cast<int64_t>(a.weight);
  device_.released(a.kind, a.flags, a.weight, a.device);
}

void Replay::on_alloc(const TraceEvent& e) {
  const uint64_t weight = e.size;
  const uint32_t s = site_of(e.stack, e.kind);
  if (e.stack == 0) ++out_.stackless;
  if (e.flags & fmt::kAllocPool) out_.pool_allocs = true;
  if ((e.flags & fmt::kAllocGraph) && (out_.graph_stacks.empty() || out_.graph_stacks.back() != e.stack)) {
    out_.graph_stacks.push_back(e.stack);
  }
  device_.allocated(e.kind, e.flags, e.size, e.device);
  const uint64_t key = live_key(e.kind, e.flags, e.addr);
  // An inherited block freed without a record left its address to this one.
  if (!inherited_.empty()) drop_inherited(key);
  const LiveAlloc made{weight, s, current_step_, e.kind, e.flags, e.device};
  auto [it, inserted] = out_.live.try_emplace(key, made);
  if (!inserted) {
    // The previous owner of this address was freed without a record
    // (dropped event): retire it.
    ++out_.double_allocations;
    retire(it->second);
    it->second = made;
  }
  touch(s);
  SiteAcc& acc = out_.sites[s];
  acc.live += static_cast<int64_t>(weight);
  ++acc.count;
  if (acc.allocs++ == 0) acc.first_alloc_ns = e.ts;
  acc.last_alloc_ns = e.ts;
  const SampleEstimate est = (e.flags & kAllocByChance) ? sampled_weight(e.size, sample_interval_)
                                                        : sampled_allocation(double(e.size), 0);
  acc.allocated.bytes += est.bytes;
  acc.allocated.bytes_variance += est.bytes_variance;
  acc.allocated.count += est.count;
  acc.allocated.count_variance += est.count_variance;
  total_[fmt::kind_index(e.kind)] += static_cast<int64_t>(weight);
  if (e.kind == static_cast<uint8_t>(fmt::Kind::kDevice)) {
    if (e.device >= device_live_.size()) device_live_.resize(e.device + 1u, 0);
    device_live_[e.device] += static_cast<int64_t>(weight);
  }
  running_total_ += static_cast<int64_t>(weight);
  ++step_allocs_;
  if (!own_work_.empty()) {
    if (OwnWork* own = own_work_at(e.seq)) {
      if (own->base == INT64_MIN) own->base = running_total_ - static_cast<int64_t>(weight);
      out_.own_work_bytes = std::max(out_.own_work_bytes, running_total_ - own->base);
      return;  // memledger's own memory never makes the peak
    }
  }
  // After a Python program's end come memledger's walk, what the walk's
  // module keeps and the interpreter's teardown: not the program's peak.
  if (e.seq > program_end_seq_) return;
  if (sampled_ && e.kind != static_cast<uint8_t>(fmt::Kind::kHost)) {
    const int64_t live = running_total_ + (totals_offset_ != kNoOffset ? totals_offset_ : 0);
    if (live > unsampled_peak_.bytes) {
      unsampled_peak_ = Peak{live, current_step_, e.ts, e.kind};
      unsampled_peak_other_ = running_total_ - total_[0];
    }
  }
  if (running_total_ > out_.peak.bytes) {
    ++out_.peak_epoch;
    out_.peak.bytes = running_total_;
    out_.peak.step = current_step_;
    out_.peak.ts_ns = e.ts;
    out_.peak.kind = e.kind;
  }
}

void Replay::on_failed_alloc(const TraceEvent& e) {
  ++out_.failed_allocations;
  const int error = static_cast<int>(e.addr);
  if (!is_oom(error) || out_.ooms.size() >= kMaxOoms) return;
  OomEvent oom;
  oom.requested = e.size;
  oom.error = error;
  oom.device = e.device;
  oom.kind = e.kind;
  oom.step = current_step_;
  oom.ts_ns = e.ts;
  oom.device_live = total_[static_cast<int>(fmt::Kind::kDevice)] + total_[static_cast<int>(fmt::Kind::kManaged)];
  device_.fill_oom(oom);
  oom.live_by_site = device_live_by_site();
  // Every site for the live set by role; the largest ones are shown.
  for (const SiteTotal& t : oom.live_by_site) oom.live_sites.push_back({t.site.kind, t.site.stack, t.bytes});
  if (oom.live_by_site.size() > kOomSitesShown) oom.live_by_site.resize(kOomSitesShown);
  out_.ooms.push_back(std::move(oom));
  Site site;
  site.stack = e.stack;
  site.kind = e.kind;
  out_.oom_sites.push_back(std::move(site));
}

// The device live set by site, right now, largest first.
std::vector<SiteTotal> Replay::device_live_by_site() const {
  absl::flat_hash_map<uint32_t, std::pair<int64_t, uint64_t>> by_site;
  for (const auto& [key, a] : out_.live) {
    if (a.kind != static_cast<uint8_t>(fmt::Kind::kDevice) && a.kind != static_cast<uint8_t>(fmt::Kind::kManaged)) continue;
    auto& b = by_site[a.site];
    b.first += static_cast<int64_t>(a.weight);
    b.second += 1;
  }
  std::vector<SiteTotal> out;
  for (const auto& [site, v] : by_site) {
    SiteTotal t;
    t.site.stack = out_.sites[site].stack;
    t.site.kind = out_.sites[site].kind;
    t.bytes = v.first;
    t.count = v.second;
    out.push_back(std::move(t));
  }
  std::sort(out.begin(), out.end(), [](const SiteTotal& a, const SiteTotal& b) { return a.bytes > b.bytes; });
  return out;
}

void Replay::on_free(const TraceEvent& e) {
  const uint64_t key = live_key(e.kind, e.flags, e.addr);
  auto it = out_.live.find(key);
  if (it == out_.live.end()) {
    if (const std::optional<uint64_t> freed = drop_inherited(key)) {
      ++out_.inherited_freed_blocks;
      out_.inherited_freed_bytes += *freed;
      ++step_frees_;
      return;
    }
    // Sampled mode records only the frees of sampled allocations, so a
    // miss there is unusual too.
    ++out_.unknown_frees;
    return;
  }
  retire(it->second);
  out_.live.erase(it);
  ++step_frees_;
}

void Replay::on_step(const TraceEvent& e) {
  StepStats st;
  st.index = out_.steps.size() + 1;
  st.source = e.flags == kInferredStepSource     ? "auto"
              : e.flags == kTimeWindowStepSource ? "time"
                                                 : fmt::step_source_name(static_cast<fmt::StepSource>(e.flags));
  if (source_.empty()) {
    source_ = st.source;
  } else if (source_ != st.source && source_.find(st.source) == std::string::npos) {
    source_ += "+" + st.source;
  }
  auto label = trace_.strings.find(static_cast<uint32_t>(e.size));
  if (e.size != 0 && label != trace_.strings.end()) st.label = label->second;
  st.end_ns = e.ts;
  for (int k = 0; k < fmt::kKindCount; ++k) st.live[k] = total_[k];
  step_estimate_.push_back(total_[0]);
  step_seq_.push_back(e.seq);
  step_offset_.push_back(totals_offset_);
  totals_offset_ = kNoOffset;
  st.live_by_device = device_live_;
  // Device samples are taken just before the step marker (caught up above).
  device_.fill_step(st);
  st.allocations = step_allocs_;
  st.frees = step_frees_;
  step_allocs_ = step_frees_ = 0;
  for (uint32_t s : dirty_) {
    SiteAcc& acc = out_.sites[s];
    acc.dirty = false;
    acc.changes.push_back(SeriesPoint{static_cast<uint32_t>(st.index), acc.live, acc.allocs, acc.allocated.count});
  }
  dirty_.clear();
  out_.steps.push_back(std::move(st));
  ++current_step_;
}

ReplayOutput Replay::finish() {
  for (; !keep_.empty(); keep_.pop_back()) copy_live_set(keep_.back());
  // The side records are complete once the events are (stream_trace).
  device_.catch_up(UINT64_MAX);
  if (sampled_) {
    note_samples(UINT64_MAX);
    if (!sample_at_.empty() && sample_at_.back().ts >= last_event_ts_) out_.host_live_at_end = sample_at_.back().exact;
  }
  out_.step_source = source_.empty() ? "none" : source_;
  std::sort(out_.graph_stacks.begin(), out_.graph_stacks.end());
  out_.graph_stacks.erase(std::unique(out_.graph_stacks.begin(), out_.graph_stacks.end()), out_.graph_stacks.end());
  apply_samples();
  if (out_.steps.empty()) out_.peak.step = 0;
  return std::move(out_);
}

// Held bytes and RSS at each step end from the samples; in sampled mode
// also the exact host totals and the peak (every 100 ms and at each step end).
void Replay::apply_samples() {
  const std::vector<TraceSample>& samples = trace_.samples;
  size_t si = 0;
  for (StepStats& st : out_.steps) {
    while (si < samples.size() && samples[si].ts < st.end_ns) ++si;
    const TraceSample* s = nullptr;
    if (si < samples.size()) {
      s = &samples[si];
    } else if (!samples.empty()) {
      s = &samples.back();
    }
    if (s != nullptr) {
      st.held_host = s->heap_held;
      st.rss = s->rss;
    }
  }
  if (!sampled_) return;
  note_info();
  host_live_from_samples();
  // The peak: the samples' (below), a step end above it (exact_step_totals),
  // or a moment of an allocation that is never sampled above both.
  Peak& peak = out_.peak;
  peak = Peak{};
  uint64_t step_at = 1;
  size_t k = 0;
  int64_t before_own_work = 0;  // the last sample's exact live bytes outside memledger's own work
  for (size_t i = 0; i < samples.size(); ++i) {
    const TraceSample& s = samples[i];
    while (k < out_.steps.size() && out_.steps[k].end_ns < s.ts) {
      ++k;
      step_at = k + 1;
    }
    // The peak counts every kind, as in full mode: the host's exact bytes
    // and the rest (device, managed, pinned, mapped), which is never sampled.
    const int64_t live = s.host_live + (i < sample_at_.size() ? sample_at_[i].other : 0);
    const bool own = std::any_of(own_work_.begin(), own_work_.end(),
                                 [&](const OwnWork& w) { return s.ts >= w.begin_ts && s.ts <= w.end_ts; });
    if (own) {
      out_.own_work_bytes = std::max(out_.own_work_bytes, live - before_own_work);
      continue;
    }
    before_own_work = live;
    // After a Python program's end (memledger.program_end: its own atexit
    // handlers have run) come memledger's walk, what the walk's module
    // keeps, and the interpreter's teardown: none of it the program's peak
    // (the events' replay stops there too).
    if (s.ts > program_end_ts_) continue;
    if (live > peak.bytes) {
      peak.bytes = live;
      out_.peak_unsampled = live - s.host_live;
      peak.ts_ns = s.ts;
      peak.step = out_.steps.empty() ? 0 : std::min<uint64_t>(step_at, out_.steps.size() + 1);
      peak.kind = 0;
    }
  }
  exact_step_totals();
  if (unsampled_peak_.bytes > peak.bytes) {
    peak = unsampled_peak_;
    out_.peak_unsampled = unsampled_peak_other_;
    peak.step = out_.steps.empty() ? 0 : std::min<uint64_t>(peak.step, out_.steps.size() + 1);
  }
}

// The samples whose moment has come, with the replay's estimate of host
// live bytes just before the event at `ts` (the trace's samples arrive as it
// streams, ahead of the events they follow).
void Replay::note_samples(uint64_t ts) {
  const std::vector<TraceSample>& samples = trace_.samples;
  while (sample_at_.size() < samples.size() && samples[sample_at_.size()].ts <= ts) {
    const TraceSample& s = samples[sample_at_.size()];
    sample_at_.push_back(SampleAt{s.ts, s.host_live, total_[0], running_total_ - total_[0]});
  }
}

// Sampled mode (version 3): the host totals read just after recorded
// allocations, each compared with the estimate once every event before it
// has been replayed.
void Replay::note_host_totals(uint64_t seq) {
  const std::vector<TraceHostTotals>& totals = trace_.host_totals;
  while (totals_at_ < totals.size() && totals[totals_at_].seq < seq) {
    totals_offset_ = totals[totals_at_].host_live - total_[0];
    ++totals_at_;
  }
}

// Sampled mode: host live bytes at each step end. The estimate moves with
// the sampled allocations only; the samples' exact totals say by how much
// it was off at their moments, and that offset, interpolated in time
// between the samples around the step end, corrects it. A step end then
// shows what was allocated in its step even when no allocation of it was
// sampled, and agrees with every sample. A step during which an allocation
// was recorded takes the offset of the exact totals read just after the
// last one (version 3) instead: far closer to its end than 100 ms.
void Replay::host_live_from_samples() {
  auto offset = [](const SampleAt& s) { return static_cast<double>(s.exact - s.estimate); };
  size_t after = 0;  // the first sample past the step end
  for (size_t k = 0; k < out_.steps.size(); ++k) {
    StepStats& st = out_.steps[k];
    while (after < sample_at_.size() && sample_at_[after].ts <= st.end_ns) ++after;
    double off;
    if (step_offset_[k] != kNoOffset) {
      off = static_cast<double>(step_offset_[k]);
    } else if (sample_at_.empty()) {
      continue;
    } else if (after == 0) {
      off = offset(sample_at_.front());
    } else if (after == sample_at_.size()) {
      off = offset(sample_at_.back());
    } else {
      const SampleAt& b = sample_at_[after - 1];
      const SampleAt& a = sample_at_[after];
      const double w = static_cast<double>(st.end_ns - b.ts) / static_cast<double>(a.ts - b.ts);
      off = (1 - w) * offset(b) + w * offset(a);
    }
    st.live[0] = std::max<int64_t>(0, step_estimate_[k] + std::llround(off));
  }
}

// Sampled mode: a step marked in the program carries the exact host
// counters read at its marker (format version 3). Its live bytes replace the
// interpolated estimate, its allocation and free counts are the program's
// rather than the sampled records', and a step end above the samples' peak
// is the peak. Counts are differences of 32-bit counters, modulo 2^32.
void Replay::exact_step_totals() {
  const std::vector<TraceHostTotals>& totals = trace_.host_totals;
  if (totals.empty()) return;
  const TraceHostTotals start{};  // the counters start at zero with the process
  const TraceHostTotals* before = &start;
  Peak& peak = out_.peak;
  for (size_t k = 0; k < out_.steps.size(); ++k) {
    auto it = std::lower_bound(totals.begin(), totals.end(), step_seq_[k],
                               [](const TraceHostTotals& t, uint64_t seq) { return t.seq < seq; });
    if (it == totals.end() || it->seq != step_seq_[k]) {
      before = nullptr;  // an inferred step: no counters to count from
      continue;
    }
    StepStats& st = out_.steps[k];
    st.live[0] = std::max<int64_t>(0, it->host_live);
    if (before != nullptr) {
      st.allocations = static_cast<uint32_t>(it->host_allocs - before->host_allocs);
      st.frees = static_cast<uint32_t>(it->host_frees - before->host_frees);
    }
    before = &*it;
    const int64_t live = total_live(st);
    // The peak is the first moment it was reached: the writer's sample at a
    // step's end (taken just after its marker) holds the same total.
    if (live > peak.bytes || (live == peak.bytes && st.end_ns < peak.ts_ns)) {
      peak.bytes = live;
      out_.peak_unsampled = live - st.live[0];
      peak.ts_ns = st.end_ns;
      peak.step = st.index;
      peak.kind = 0;
    }
  }
}

}  // namespace memledger::report
