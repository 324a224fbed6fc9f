// Stage "replay": the events, in sequence order, replayed into the live set.
//
// In:  the events (observe, a batch at a time; step events included, the
//      trace's own or inferred ones), the trace's side records as they
//      arrive (labels, VMM and pool records through DeviceLedger), and at
//      the end its samples (RSS, heap held; sampled mode: exact totals).
// Out: ReplayOutput: the live set at the end, one accumulator per site
//      (live bytes and count, allocations, the site's live bytes at each
//      step end where it changed, its share of the peak), totals per kind
//      and device at each step end (StepStats), the peak, the failed
//      allocations that ran out of memory with the picture at that moment,
//      and counts of what did not add up (unknown frees, reused addresses).
//
// Everything after this stage reads ReplayOutput only: a new judgement
// over the run (growth, roles, windows) is a function of it, never a
// branch in the event loop. Sites stay unnamed (stack id and kind); the
// report names only what it shows.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "analysis.h"
#include "device_memory.h"
#include "trace_reader.h"

namespace memledger::report {

// One allocation still live.
struct LiveAlloc {
  uint64_t weight;
  uint32_t site;       // index into ReplayOutput::sites
  uint32_t step_born;  // 1-based step the allocation was made in
  uint8_t kind;
  uint8_t flags;
  uint8_t device;
};

// A site's live bytes at a step end where they changed.
struct SeriesPoint {
  uint32_t step;
  int64_t live;
  uint64_t allocs;    // cumulative allocations (records) of the site
  double est_allocs;  // cumulative allocations they stand for (sampled mode: estimated)
};

// What a site's records stand for, summed over all its allocations
// (sampled.h): bytes and allocations, and their Poisson variances. Without
// sampling, the bytes and counts themselves, with no variance.
struct SiteEstimate {
  double bytes = 0;
  double bytes_variance = 0;
  double count = 0;
  double count_variance = 0;
};

// One allocation site (stack and kind) as the replay left it.
struct SiteAcc {
  uint32_t stack = 0;
  uint8_t kind = 0;
  bool dirty = false;
  int64_t live = 0;
  uint64_t allocs = 0;
  std::vector<SeriesPoint> changes;  // at step ends where the site changed
  SiteEstimate allocated;            // everything the site allocated
  uint64_t count = 0;  // live allocations
  // When it first and last allocated (ns since the trace's start): the
  // phase of the run it allocates in, for its role (roles.h).
  uint64_t first_alloc_ns = 0;
  uint64_t last_alloc_ns = 0;
  // The site's live bytes and count when the running peak was last reached,
  // valid while peak_epoch is the replay's: saved on the first change after a
  // new peak, so the peak's live set costs O(1) per event, not a copy per peak.
  int64_t peak_live = 0;
  uint64_t peak_count = 0;
  uint64_t peak_epoch = 0;
};

// A process's sites, by index. A deque: a million sites (an `import torch`)
// grow without a copy of them all, which a vector makes each time it doubles.
using SiteAccs = std::deque<SiteAcc>;

struct ReplayOutput {
  absl::flat_hash_map<uint64_t, LiveAlloc> live;  // at the end, by address (live_key)
  SiteAccs sites;
  uint64_t peak_epoch = 0;  // SiteAcc::peak_epoch of the sites that hold their share of the peak
  std::vector<StepStats> steps;
  std::string step_source;  // marker, interval, auto, joined by '+'; "none" without steps
  Peak peak;
  std::vector<OomEvent> ooms;   // the first out-of-memory failures, stacks unnamed
  std::vector<Site> oom_sites;  // the stack and kind of each of them
  uint64_t events = 0;
  uint64_t failed_allocations = 0;
  uint64_t unknown_frees = 0;
  // A forked child's inherited blocks (inherit), and those it freed.
  uint64_t inherited_blocks = 0, inherited_bytes = 0;
  uint64_t inherited_freed_blocks = 0, inherited_freed_bytes = 0;
  uint64_t double_allocations = 0;  // an address allocated again without a free between
  uint64_t stackless = 0;           // allocations recorded without a stack
  bool pool_allocs = false;         // the program allocates from memory pools itself
  std::vector<uint32_t> graph_stacks;  // stacks of CUDA graph allocations (kAllocGraph), sorted
  // The most the live total rose, in memledger's own work inside the
  // program (OwnWork), above where it stood when that work began: left out
  // of the peak.
  int64_t own_work_bytes = 0;
  // Sampled host mode: the live bytes of the kinds that are never sampled
  // (device, managed, pinned, mapped) at the peak's moment, exact; the rest
  // of the peak is the host's exact total.
  int64_t peak_unsampled = 0;
  // Sampled host mode: the host's exact live bytes at the end (the trace's
  // last sample, when it came after the last event), -1 when unknown.
  int64_t host_live_at_end = -1;
};

// memledger's own work inside the traced program: its Python helpers' walk
// of the heap for retention paths (at exit, at SIGTERM, at
// memledger.snapshot()) makes lists of every object and their addresses,
// tens of megabytes in a large program. The helper brackets it with two
// info records, key kOwnWorkKey, values "begin SEQ" and "end SEQ" (the
// trace's sequence numbers then), and the events between them count in the
// live totals but never make the peak.
inline constexpr const char* kOwnWorkKey = "memledger.own_work";
// The moment a Python program's work ended: its helper's atexit callback,
// called before the interpreter's teardown frees the modules' objects,
// records the trace's sequence number then (value "SEQ"). The steps that
// --step-interval ends after it are teardown, not steps: a list a module
// kept growing step after step is freed there, in what would be the last
// step, and its growth was judged to have ended.
inline constexpr const char* kProgramEndKey = "memledger.program_end";
struct OwnWork {
  uint64_t begin_seq = 0, end_seq = UINT64_MAX;  // events in [begin_seq, end_seq)
  uint64_t begin_ts = 0, end_ts = UINT64_MAX;    // the records' moments (samples)
  int64_t base = INT64_MIN;                      // the live total when its first allocation came
};

// The key of an address in the live set: the host heap, device-visible
// addresses (device, managed, pinned) and VMM physical handles are
// separate address spaces.
uint64_t live_key(uint8_t kind, uint8_t flags, uint64_t addr);

class Replay {
 public:
  // `sampled`: the trace's host allocations are sampled (host_mode
  // "sampled"); its samples then give the exact host totals and the peak.
  Replay(const Trace& trace, bool sampled);
  void observe(const TraceEvent* events, size_t count);
  // After the last event, once the side records are complete.
  ReplayOutput finish();
  // Before any event: the live set to copy out on the way (KeepLiveSet;
  // a child forked at `seq` inherited the host heap's).
  void keep_live_set(const KeepLiveSet& keep);
  // Before any event: a forked child starts with these blocks live. They
  // count in its totals at every step end, belong to no site, and their
  // frees are not unknown frees.
  void inherit(const std::vector<InheritedBlock>& blocks);

 private:
  void on_alloc(const TraceEvent& e);
  void on_failed_alloc(const TraceEvent& e);
  void on_free(const TraceEvent& e);
  void on_step(const TraceEvent& e);
  void retire(const LiveAlloc& a);  // a live allocation leaves the live set
  uint32_t site_of(uint32_t stack, uint8_t kind);
  void touch(uint32_t site);  // the site is about to change
  std::vector<SiteTotal> device_live_by_site() const;
  void apply_samples();
  void note_samples(uint64_t ts);
  void note_host_totals(uint64_t seq);
  void host_live_from_samples();
  void exact_step_totals();
  void copy_live_set(const KeepLiveSet& keep) const;
  // Reads the info records that arrived since the last call: OwnWork's,
  // and the program's end (kProgramEndKey).
  void note_info();
  // The own work an event of `seq` falls in, or nullptr.
  OwnWork* own_work_at(uint64_t seq);
  // Takes an inherited block out of the live totals: its bytes, or nothing
  // when `key` is not one.
  std::optional<uint64_t> drop_inherited(uint64_t key);

  std::vector<KeepLiveSet> keep_;  // by sequence number, descending
  absl::flat_hash_map<uint64_t, InheritedBlock> inherited_;             // by live_key

  const Trace& trace_;
  const bool sampled_;
  const uint64_t sample_interval_;
  ReplayOutput out_;
  DeviceLedger device_;
  // Host sites by stack id (site index + 1, 0: none yet), for the ids a
  // tracer hands out (its stack table's nodes, below 2^24): a look-up is one
  // read, where a hash map's (a million sites on `import torch`) took a
  // tenth of the report's time. Other sites by (kind << 32 | stack).
  static constexpr uint32_t kDirectStacks = 1u << 24;
  std::vector<uint32_t> host_sites_;
  absl::flat_hash_map<uint64_t, uint32_t> site_index_;
  std::vector<uint32_t> dirty_;                         // sites changed since the last step end
  int64_t total_[format::kKindCount] = {};                             // live bytes per format::Kind
  std::vector<int64_t> device_live_;                    // device kind, by device ordinal
  int64_t running_total_ = 0;
  uint64_t last_event_ts_ = 0;
  uint32_t current_step_ = 1;  // allocations before the first marker belong to step 1
  uint64_t step_allocs_ = 0, step_frees_ = 0;
  std::string source_;
  // Sampled mode: each sample's exact host live bytes beside the replay's
  // estimate at its moment, and the estimate at each step end: samples come
  // every 100 ms, inferred steps may come far more often, and the last step
  // ends before the teardown does (host_live_from_samples).
  struct SampleAt {
    uint64_t ts;
    int64_t exact;
    int64_t estimate;
    int64_t other;  // the other kinds' live bytes then (exact: only host allocations are sampled)
  };
  std::vector<SampleAt> sample_at_;
  std::vector<int64_t> step_estimate_;
  std::vector<uint64_t> step_seq_;  // each step event's seq (its exact totals' key)
  // Sampled mode, version 3: the host totals read after each recorded
  // allocation. The last one's offset from the estimate, and at each step
  // end that offset when a reading came during the step (kNoOffset: none).
  static constexpr int64_t kNoOffset = INT64_MIN;
  size_t totals_at_ = 0;
  int64_t totals_offset_ = kNoOffset;
  std::vector<int64_t> step_offset_;
  // Sampled mode: the peak at the allocations that are never sampled
  // (device, managed, pinned, mapped), their kinds' exact live bytes with
  // the host's estimate as the last exact reading corrects it.
  Peak unsampled_peak_;
  int64_t unsampled_peak_other_ = 0;  // its unsampled kinds' part
  std::vector<OwnWork> own_work_;
  size_t info_seen_ = 0;  // trace_.info read by note_info
  uint64_t program_end_seq_ = UINT64_MAX;  // kProgramEndKey's
  uint64_t program_end_ts_ = UINT64_MAX;   // the time of its record
  size_t own_cursor_ = 0;  // the first of own_work_ not yet over (own_work_at)
};

}  // namespace memledger::report
