// CUPTI's view of device memory beside the hooks' view (cupti_tracer/).
//
// The hooks see the calls the program makes; CUPTI's MEMORY2 records see
// what the driver did. The report pairs the allocations of both by address
// (in order, an address being reused) while CUPTI was collecting, and lists
// what one side saw and the other missed: an allocation path the hooks do
// not cover, or one CUPTI does not report. When CUPTI was not used, it says why.
//
// A VMM mapping (cuMemMap of a cuMemCreate handle) is memory at an address
// from the map on: the hooks' kMap records pair with CUPTI's records at the
// mapped address. The physical allocation (cuMemCreate, counted by handle)
// is not compared. A module's static variables (CUPTI's DEVICE_STATIC and
// MANAGED_STATIC records) are placed by the driver when it loads the module,
// with no allocation call a hook could see: they are counted and listed as
// what they are, not as CUPTI's disagreements with the hooks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "symbolizer.h"
#include "trace_reader.h"

namespace memledger::report {

struct CuptiMismatch {
  uint64_t ts_ns = 0;
  uint64_t addr = 0;
  uint64_t bytes = 0;
  uint8_t kind = 0;      // format::Kind
  uint32_t device = 0;
  uint64_t pc = 0;       // CUPTI side: program counter of the call
  uint32_t stack = 0;    // hooks side: interned stack
  std::vector<Frame> frames;  // hooks side: the stack, once symbolized
  bool mapping = false;  // hooks side: a VMM mapping (cuMemMap), not an allocation call
  uint8_t cupti_kind = 0;     // CUPTI side: format::CuptiMemoryKind (0 = unknown, an old trace)
  bool async = false;         // CUPTI side: stream-ordered
  uint32_t correlation = 0;   // CUPTI side: correlation id of the API call
  uint32_t name_id = 0;       // CUPTI side: string id of a module static's variable name
  std::string name;           // ... and the name
  uint64_t cupti_bytes = 0;   // a size difference: what CUPTI recorded (`bytes`: what the hooks saw asked for)
};

struct CuptiView {
  // "active", "off", "unavailable", "held", "failed", "stopped", or "none"
  // (no CUDA initialised in this process, so no CUPTI status at all).
  std::string status = "none";
  std::string message;      // the tracer's sentence: why CUPTI is not used, or what it collects
  std::string end_message;  // how the collection ended (exit flush, handover)
  std::string holder;       // the tool holding the CUPTI subscriber slot
  uint32_t version = 0;     // CUPTI API version found
  bool compared = false;    // CUPTI collected records: the comparison below holds
  uint64_t cupti_allocations = 0;
  uint64_t cupti_releases = 0;
  uint64_t cupti_pool_records = 0;
  uint64_t cupti_dropped = 0;
  uint64_t matched = 0;
  uint64_t matched_bytes = 0;
  uint64_t size_differences = 0;  // matched by address, different byte counts
  std::vector<CuptiMismatch> size_differences_list;  // the first kMaxListed, the hooks' side with CUPTI's bytes
  uint64_t matched_mappings = 0;  // of `matched`: VMM mappings paired at their mapped address
  // CUPTI's records of module statics: no allocation call, so no hook, makes
  // them. Counted apart from cupti_only; CUPTI's allocations are matched +
  // cupti_only + module_statics (and those over kMaxCuptiRecords).
  uint64_t module_statics = 0;
  uint64_t module_statics_bytes = 0;
  std::vector<CuptiMismatch> module_statics_list;  // largest first, at most kMaxListed
  uint64_t hooks_only = 0;
  uint64_t hooks_only_bytes = 0;
  uint64_t cupti_only = 0;
  uint64_t cupti_only_bytes = 0;
  std::vector<CuptiMismatch> hooks_only_list;  // largest first, at most kMaxListed
  std::vector<CuptiMismatch> cupti_only_list;
  static constexpr size_t kMaxListed = 20;
};

// Pairs the hooks' device allocations with CUPTI's as the events stream by.
class CuptiMatcher {
 public:
  explicit CuptiMatcher(const Trace& trace) : trace_(trace) {}
  // Every event, in sequence order (only device-side allocations are used).
  void observe(const TraceEvent& event);
  // After the last event: the side records are complete.
  CuptiView finish();

 private:
  struct Pending {
    uint64_t ts = 0;
    uint64_t seq = 0;  // hooks side
    uint64_t bytes = 0;
    uint64_t pc = 0;
    uint32_t stack = 0;
    uint32_t device = 0;
    uint8_t kind = 0;
    bool mapping = false;     // hooks side: a cuMemMap
    uint8_t cupti_kind = 0;   // CUPTI side, as in CuptiMismatch
    bool async = false;
    uint32_t correlation = 0;
  };
  void take_cupti_records();
  void take_mappings();
  void add(bool from_cupti, uint64_t addr, const Pending& p);
  static CuptiMismatch mismatch(uint64_t addr, const Pending& p);
  bool in_window(uint64_t seq) const;

  const Trace& trace_;
  size_t cupti_consumed_ = 0;
  size_t vmm_consumed_ = 0;
  size_t statuses_seen_ = 0;
  bool collecting_ = false;  // CUPTI was active: hooks' allocations are kept for pairing
  uint64_t events_seen_ = 0;
  std::map<uint64_t, std::vector<Pending>> hooks_pending_;
  std::map<uint64_t, std::vector<Pending>> cupti_pending_;
  CuptiView view_;
};

}  // namespace memledger::report
