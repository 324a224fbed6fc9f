#include "step_inference.h"

#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <map>

#include "trace_format.h"

namespace memledger::report {
namespace {

namespace fmt = memledger::format;

// Anchors found for one repetition count: `head` is the earliest of them,
// and every member's i-th occurrence lies in the head's i-th window.
struct AnchorGroup {
  size_t count = 0;
  uint32_t head = 0;
  std::vector<uint32_t> members;  // head first
  size_t period = 0;              // median allocations between heads
  size_t explained() const { return count * members.size(); }
  // The allocations the anchors explain, times the share of each iteration
  // they make up: a training loop repeats nearly all it allocates, while
  // procedures run a few times (compilations, module set-up) share a few
  // anchors among many allocations that differ from run to run.
  double score() const {
    return static_cast<double>(explained()) * static_cast<double>(members.size()) /
           static_cast<double>(std::max<size_t>(period, members.size()));
  }
};

size_t median(std::vector<size_t> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// True when x's i-th occurrence falls in [h_i, h_{i+1}) for every i.
bool interleaves(const std::vector<uint32_t>& h, const std::vector<uint32_t>& x) {
  for (size_t i = 0; i < h.size(); ++i) {
    if (x[i] <= h[i]) return false;
    if (i + 1 < h.size() && x[i] >= h[i + 1]) return false;
  }
  return true;
}

// The groups of interleaving symbols among those that occur `count` times,
// `symbols` sorted by first occurrence: each group's head is the earliest
// symbol not in an earlier group, its members the later ones whose first
// occurrence lies in the head's first window and that interleave with it.
std::vector<AnchorGroup> find_groups(size_t count, const std::vector<uint32_t>& symbols,
                                     const std::vector<std::vector<uint32_t>>& occurrences, size_t min_anchors) {
  std::vector<AnchorGroup> groups;
  std::vector<bool> taken(symbols.size(), false);
  for (size_t j = 0; j < symbols.size(); ++j) {
    if (taken[j]) continue;
    const std::vector<uint32_t>& h = occurrences[symbols[j]];
    AnchorGroup g;
    g.count = count;
    g.head = symbols[j];
    g.members.push_back(symbols[j]);
    for (size_t m = j + 1; m < symbols.size() && occurrences[symbols[m]].front() < h[1]; ++m) {
      if (!taken[m] && interleaves(h, occurrences[symbols[m]])) {
        g.members.push_back(symbols[m]);
        taken[m] = true;
      }
    }
    if (g.members.size() < min_anchors) continue;
    std::vector<size_t> periods;
    for (size_t i = 0; i + 1 < h.size(); ++i) periods.push_back(h[i + 1] - h[i]);
    g.period = median(std::move(periods));
    groups.push_back(std::move(g));
  }
  return groups;
}

// True when each window of `coarse`'s head holds exactly `per_window`
// occurrences of `fine`'s head (the fine loop nests in the coarse one).
bool nests(const std::vector<uint32_t>& coarse, const std::vector<uint32_t>& fine, size_t per_window) {
  size_t f = 0;
  if (!fine.empty() && fine.front() < coarse.front()) return false;
  for (size_t i = 0; i < coarse.size(); ++i) {
    const uint32_t end = i + 1 < coarse.size() ? coarse[i + 1] : UINT32_MAX;
    size_t in_window = 0;
    while (f < fine.size() && fine[f] < end) {
      ++in_window;
      ++f;
    }
    if (in_window != per_window) return false;
  }
  return f == fine.size();
}

// True when `part`'s members recur in a run of consecutive windows of
// `whole`'s head, once per window: the same loop, with iterations at its
// start or end that allocate differently (warm-up and compilation on the
// first ones, a last partial batch).
bool runs_within(const AnchorGroup& part, const AnchorGroup& whole, const std::vector<std::vector<uint32_t>>& occurrences) {
  const std::vector<uint32_t>& h = occurrences[whole.head];
  auto window = [&](uint32_t position) -> long {
    return static_cast<long>(std::upper_bound(h.begin(), h.end(), position) - h.begin()) - 1;
  };
  const long first = window(occurrences[part.head].front());
  if (first < 0 || static_cast<size_t>(first) + part.count > whole.count) return false;
  for (uint32_t m : part.members) {
    const std::vector<uint32_t>& x = occurrences[m];
    for (size_t i = 0; i < x.size(); ++i) {
      if (window(x[i]) != first + static_cast<long>(i)) return false;
    }
  }
  return true;
}

// True when some anchor of `g` is freed again before the iteration after
// next begins, in at least three in four iterations (see infer_steps).
bool frees_what_it_allocates(const AnchorGroup& g, const std::vector<std::vector<uint32_t>>& occurrences,
                             const std::vector<uint32_t>& freed_at) {
  if (freed_at.empty() || g.count < 3) return true;
  const std::vector<uint32_t>& h = occurrences[g.head];
  const size_t judged = g.count - 2;
  for (uint32_t m : g.members) {
    size_t freed = 0;
    for (size_t i = 0; i < judged; ++i) freed += freed_at[occurrences[m][i]] <= h[i + 2];
    if (freed * 4 >= judged * 3) return true;
  }
  return false;
}

// Keeps the groups `wanted` holds for, when there are any.
template <typename Predicate>
void prefer(std::vector<AnchorGroup>& groups, Predicate wanted) {
  if (std::any_of(groups.begin(), groups.end(), wanted)) {
    groups.erase(std::remove_if(groups.begin(), groups.end(), [&](const AnchorGroup& g) { return !wanted(g); }),
                 groups.end());
  }
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace

InferredSteps infer_steps(const std::vector<uint64_t>& symbols, const std::vector<uint32_t>& freed_at,
                          const StepInferenceOptions& options, const std::vector<uint32_t>& places) {
  InferredSteps out;
  const size_t n = symbols.size();
  absl::flat_hash_map<uint64_t, uint32_t> ids;
  std::vector<std::vector<uint32_t>> occurrences;
  for (size_t i = 0; i < n && i < UINT32_MAX; ++i) {
    auto [it, inserted] = ids.try_emplace(symbols[i], static_cast<uint32_t>(occurrences.size()));
    if (inserted) occurrences.emplace_back();
    occurrences[it->second].push_back(static_cast<uint32_t>(i));
  }
  std::map<size_t, std::vector<uint32_t>> by_count;
  for (uint32_t id = 0; id < occurrences.size(); ++id) {
    if (occurrences[id].size() >= options.min_steps && !(symbols[occurrences[id].front()] & kNeverAnchor)) {
      by_count[occurrences[id].size()].push_back(id);
    }
  }
  std::vector<AnchorGroup> groups;
  for (auto& [count, ids_with_count] : by_count) {
    const size_t min_anchors = count >= options.long_loop ? options.min_anchors_long : options.min_anchors;
    if (ids_with_count.size() < min_anchors) continue;
    std::sort(ids_with_count.begin(), ids_with_count.end(),
              [&](uint32_t a, uint32_t b) { return occurrences[a].front() < occurrences[b].front(); });
    for (AnchorGroup& g : find_groups(count, ids_with_count, occurrences, min_anchors)) {
      if (frees_what_it_allocates(g, occurrences, freed_at)) groups.push_back(std::move(g));
    }
  }
  // In a Python program, the loops with an anchor allocated under Python,
  // and among those, the loops with an anchor allocated outside imports.
  auto has_anchor = [&](const AnchorGroup& g, uint64_t bit, bool set) {
    return std::any_of(g.members.begin(), g.members.end(),
                       [&](uint32_t m) { return ((symbols[occurrences[m].front()] & bit) != 0) == set; });
  };
  prefer(groups, [&](const AnchorGroup& g) { return has_anchor(g, kUnderPython, true); });
  prefer(groups, [&](const AnchorGroup& g) { return has_anchor(g, kUnderImport, false); });
  if (places.size() == n) {
    prefer(groups, [&](const AnchorGroup& g) {
      uint32_t first = 0;
      for (uint32_t m : g.members) {
        const uint32_t place = places[occurrences[m].front()];
        if (place == 0) continue;
        if (first != 0 && place != first) return true;
        first = place;
      }
      return false;
    });
  }
  if (groups.empty()) {
    out.description = "no repeating allocation pattern found in " + std::to_string(n) + " allocations";
    return out;
  }
  // The loop that repeats the most of what it allocates...
  const AnchorGroup* chosen = &*std::max_element(groups.begin(), groups.end(), [](const AnchorGroup& a, const AnchorGroup& b) {
    return a.score() != b.score() ? a.score() < b.score() : a.count > b.count;
  });
  // ...counted in full: when its anchors recur in consecutive iterations of
  // a loop that runs more often, they are that loop's anchors, missing from
  // its first or last iterations.
  for (bool grown = true; grown;) {
    grown = false;
    for (const AnchorGroup& g : groups) {
      if (g.count > chosen->count && runs_within(*chosen, g, occurrences)) {
        chosen = &g;
        grown = true;
        break;
      }
    }
  }
  // It is the step unless it nests in a coarser loop with a fair share of
  // anchors of its own: then the fine loop is a part of each step (layers
  // run twice, micro-batches) and the coarse one is the step. An epoch loop has few
  // anchors of its own and does not qualify.
  const AnchorGroup* coarse = nullptr;
  for (const AnchorGroup& g : groups) {
    if (g.count >= chosen->count || chosen->count % g.count != 0) continue;
    if (g.members.size() * 4 < chosen->members.size() || g.members.size() < options.min_anchors) continue;
    if (!nests(occurrences[g.head], occurrences[chosen->head], chosen->count / g.count)) continue;
    if (coarse == nullptr || g.score() > coarse->score()) coarse = &g;
  }
  if (coarse != nullptr) chosen = coarse;

  const std::vector<uint32_t>& head = occurrences[chosen->head];
  const size_t steps = chosen->count;
  std::vector<uint32_t> last(steps, 0);  // last anchor of each iteration
  for (uint32_t m : chosen->members) {
    for (size_t i = 0; i < steps; ++i) last[i] = std::max(last[i], occurrences[m][i]);
  }
  std::vector<size_t> periods, tails;
  for (size_t i = 0; i + 1 < steps; ++i) {
    periods.push_back(head[i + 1] - head[i]);
    tails.push_back(head[i + 1] - (last[i] + 1));
  }
  for (size_t i = 0; i + 1 < steps; ++i) out.ends.push_back(head[i + 1]);
  out.last_anchors.assign(last.begin(), last.end());
  // The last step ends as the others did: its last anchor plus the usual tail.
  out.ends.push_back(std::min(n, static_cast<size_t>(last[steps - 1]) + 1 + median(tails)));
  out.period = median(periods);
  out.anchors = chosen->members.size();
  out.description = "inferred period " + std::to_string(out.period) + " allocations per step, from " +
                    std::to_string(out.anchors) + " allocation sites that recur once in each of " +
                    std::to_string(steps) + " steps";
  return out;
}

namespace {

bool counts_as_allocation(const TraceEvent& e) { return e.type == EvType::kAlloc && !(e.flags & fmt::kAllocFailed); }

}  // namespace

bool AllocationSequence::mixed_loader_steps() const {
  const uint32_t loader = 1u << static_cast<uint32_t>(fmt::StepSource::kLoader);
  return (step_sources_ & loader) != 0 && (step_sources_ & ~loader) != 0;
}

void AllocationSequence::observe(const TraceEvent* events, size_t count) {
  if (saw_steps_) {  // markers decide; nothing to infer, but note where they came from
    for (size_t i = 0; i < count; ++i) {
      if (events[i].type == EvType::kStep && events[i].flags < 32) step_sources_ |= 1u << events[i].flags;
    }
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    const TraceEvent& e = events[i];
    if (first_ts_ == 0) first_ts_ = e.ts;
    last_ts_ = std::max(last_ts_, e.ts);
    if (e.type == EvType::kStep) {
      if (e.flags < 32) step_sources_ |= 1u << e.flags;
      for (size_t j = i + 1; j < count; ++j) {
        if (events[j].type == EvType::kStep && events[j].flags < 32) step_sources_ |= 1u << events[j].flags;
      }
      // The trace has step events of its own: the sequence will not be
      // used, so stop collecting and give its memory back.
      saw_steps_ = true;
      std::vector<uint64_t>().swap(symbols_);
      std::vector<uint32_t>().swap(places_);
      std::vector<uint64_t>().swap(event_index_);
      std::vector<Free>().swap(frees_);
      std::vector<uint32_t>().swap(freed_at_);
      absl::flat_hash_map<uint32_t, StackInfo>().swap(stack_info_);
      absl::flat_hash_map<uint64_t, uint32_t>().swap(live_);
      return;
    }
    // Mapped memory follows its allocator's arenas (pymalloc maps and unmaps
    // them as the heap's objects come and go), not the program's loop.
    if (e.kind == static_cast<uint8_t>(fmt::Kind::kMapped)) continue;
    const uint64_t address = e.addr ^ (static_cast<uint64_t>(e.kind) << 58);
    if (e.type == EvType::kFree) {
      auto it = live_.find(address);
      if (it != live_.end()) {
        frees_.push_back(Free{events_ + i, mix(symbols_[it->second])});
        freed_at_[it->second] = static_cast<uint32_t>(symbols_.size());
        live_.erase(it);
      }
      continue;
    }
    if (!counts_as_allocation(e)) continue;
    ++allocations_;
    if (symbols_.size() >= std::min<size_t>(limit_, kNeverFreed)) {
      truncated_ = true;
      continue;
    }
    const StackInfo& stack = stack_info(e.stack);
    // memledger's own Python helpers (the retention walk at exit) are not
    // the program's loop.
    if (stack.memledger) continue;
    uint64_t symbol = mix((stack.identity << 8 | e.kind) ^ mix(e.size)) & ~(kNeverAnchor | kUnderPython | kUnderImport);
    if (e.flags & kAllocByChance) symbol |= kNeverAnchor;
    symbol |= stack.traits;
    symbols_.push_back(symbol);
    places_.push_back(stack.place);
    event_index_.push_back(events_ + i);
    freed_at_.push_back(kNeverFreed);
    live_[address] = static_cast<uint32_t>(symbols_.size() - 1);
  }
  events_ += count;
}

// A thread that never ran Python carries the main thread's Python frames,
// attributed, at whatever line the main thread was on: the same allocation
// of an XLA or autograd thread has another stack in each step. Its identity
// in the sequence is its native frames alone, and attributed frames do not
// make it an allocation under Python.
const AllocationSequence::StackInfo& AllocationSequence::stack_info(uint32_t stack) {
  auto [it, inserted] = stack_info_.try_emplace(stack, StackInfo{0, stack, 0, false});
  if (!inserted || stack == 0) return it->second;
  bool attributed = false;
  uint64_t native = 0x9e3779b97f4a7c15ull;
  trace_.stacks.visit(stack, [&](uint64_t word) {
    // A stack's Python frames lead (StackStore): past them, only an
    // attributed stack has something left to read, its native identity.
    if (!attributed && !fmt::is_python_frame(word)) return false;
    if (it->second.place == 0 && fmt::is_python_frame(word)) {
      it->second.place = static_cast<uint32_t>(mix(word)) | 1;
    }
    if (fmt::is_attributed_python_frame(word)) {
      attributed = true;
      return true;
    }
    native = mix(native ^ word);
    if (!fmt::is_python_frame(word) || (it->second.traits & kUnderImport)) return true;
    it->second.traits |= kUnderPython;
    auto code = trace_.python_codes.find(fmt::python_code_id(word));
    if (code != trace_.python_codes.end() && code->second.filename.starts_with("<frozen importlib._bootstrap")) {
      it->second.traits |= kUnderImport;
    }
    if (code != trace_.python_codes.end() && code->second.filename.ends_with("/memledger/_retention.py")) {
      it->second.memledger = true;
    }
    return true;
  });
  // Stack ids are 32 bits: a native identity lies above them.
  if (attributed) it->second.identity = (native | (uint64_t{1} << 32)) & ((uint64_t{1} << 56) - 1);
  return it->second;
}

std::vector<uint64_t> AllocationSequence::step_end_events(const InferredSteps& steps) const {
  std::vector<uint64_t> ends;
  if (steps.ends.empty()) return ends;
  const size_t n = steps.ends.size();
  std::vector<size_t> tails;
  for (size_t i = 0; i + 1 < n; ++i) {
    ends.push_back(event_index_[steps.ends[i]]);
    tails.push_back(event_index_[steps.ends[i]] - event_index_[steps.last_anchors[i]]);
  }
  const uint64_t last_anchor = event_index_[steps.last_anchors[n - 1]];
  uint64_t end = std::min<uint64_t>(events_, last_anchor + std::max<size_t>(1, median(tails)));
  if (n >= 2) {
    // The previous step's ending, as a template: its symbol events between
    // its last anchor and the last step's first allocation.
    const uint64_t from = event_index_[steps.last_anchors[n - 2]] + 1;
    const uint64_t to = event_index_[steps.ends[n - 2]];
    const std::vector<Free> pattern = symbol_events(from, to);
    if (!pattern.empty()) {
      const uint64_t reach = last_anchor + 2 * (to - from) + 16;  // a match further on is teardown
      const std::vector<Free> after = symbol_events(last_anchor + 1, std::min(events_, reach));
      const uint64_t usual = end;
      end = last_anchor + 1;
      size_t a = 0;
      for (const Free& want : pattern) {
        for (size_t k = a; k < after.size(); ++k) {
          if (after[k].symbol == want.symbol) {
            end = after[k].event + 1;
            a = k + 1;
            break;
          }
        }
      }
      // Never past the usual length: the teardown that follows frees what
      // the steps kept, and must not be part of the last one.
      end = std::min(end, usual);
    }
  }
  ends.push_back(end);
  return ends;
}

std::vector<AllocationSequence::Free> AllocationSequence::symbol_events(uint64_t from, uint64_t to) const {
  std::vector<Free> out;
  auto a = std::lower_bound(event_index_.begin(), event_index_.end(), from);
  auto f = std::lower_bound(frees_.begin(), frees_.end(), from, [](const Free& x, uint64_t v) { return x.event < v; });
  while (true) {
    const bool more_a = a != event_index_.end() && *a < to;
    const bool more_f = f != frees_.end() && f->event < to;
    if (!more_a && !more_f) break;
    if (more_a && (!more_f || *a < f->event)) {
      out.push_back(Free{*a, symbols_[static_cast<size_t>(a - event_index_.begin())]});
      ++a;
    } else {
      out.push_back(*f++);
    }
  }
  return out;
}

TraceEvent StepInserter::step_event(uint64_t seq, uint64_t ts) {
  TraceEvent s;
  s.type = EvType::kStep;
  s.seq = seq;
  s.ts = ts;
  s.addr = ++next_end_;  // the step's index
  s.flags = by_time_ ? kTimeWindowStepSource : kInferredStepSource;
  return s;
}

void StepInserter::operator()(const TraceEvent* events, size_t count) {
  buffer_.clear();
  for (size_t i = 0; i < count; ++i) {
    const TraceEvent& e = events[i];
    while (next_end_ < ends_.size() && (by_time_ ? e.ts >= ends_[next_end_] : ends_[next_end_] == events_)) {
      buffer_.push_back(step_event(e.seq, by_time_ ? ends_[next_end_] : e.ts));
    }
    ++events_;
    buffer_.push_back(e);
    last_seq_ = e.seq;
    last_ts_ = e.ts;
  }
  if (!buffer_.empty()) next_(buffer_.data(), buffer_.size());
}

void StepInserter::finish() {
  buffer_.clear();
  while (next_end_ < ends_.size()) buffer_.push_back(step_event(last_seq_ + 1, last_ts_));
  if (!buffer_.empty()) next_(buffer_.data(), buffer_.size());
}

}  // namespace memledger::report
