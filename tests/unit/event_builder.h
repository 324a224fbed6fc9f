// Hand-made event sequences for the report's stage tests: events in
// sequence order, as the trace reader delivers them, with no trace file.
#pragma once

#include <cstdint>
#include <vector>

#include "trace_format.h"
#include "trace_reader.h"

namespace memledger::report::testing {

class EventBuilder {
 public:
  // A successful allocation (kind: format::Kind).
  TraceEvent& alloc(uint64_t addr, uint64_t size, uint32_t stack, uint8_t kind = 0, uint8_t flags = 0,
                    uint8_t device = 0) {
    TraceEvent& e = push(EvType::kAlloc);
    e.addr = addr;
    e.size = size;
    e.stack = stack;
    e.kind = kind;
    e.flags = flags;
    e.device = device;
    return e;
  }
  TraceEvent& free(uint64_t addr, uint8_t kind = 0, uint8_t flags = 0) {
    TraceEvent& e = push(EvType::kFree);
    e.addr = addr;
    e.kind = kind;
    e.flags = flags;
    return e;
  }
  // A failed device allocation (error 2: out of memory).
  TraceEvent& failed(uint64_t size, int error, uint32_t stack, uint8_t device = 0) {
    TraceEvent& e = push(EvType::kAlloc);
    e.addr = static_cast<uint64_t>(error);
    e.size = size;
    e.stack = stack;
    e.kind = static_cast<uint8_t>(format::Kind::kDevice);
    e.flags = static_cast<uint8_t>(format::kAllocFailed);
    e.device = device;
    return e;
  }
  TraceEvent& step(uint8_t source = static_cast<uint8_t>(format::StepSource::kMarker), uint32_t label = 0) {
    TraceEvent& e = push(EvType::kStep);
    e.addr = ++steps_;
    e.flags = source;
    e.size = label;
    return e;
  }
  uint64_t next_seq() const { return seq_ + 1; }

  std::vector<TraceEvent> events;

 private:
  TraceEvent& push(EvType type) {
    TraceEvent e;
    e.type = type;
    e.seq = ++seq_;
    e.ts = seq_ * 1000;
    events.push_back(e);
    return events.back();
  }
  uint64_t seq_ = 0;
  uint64_t steps_ = 0;
};

}  // namespace memledger::report::testing
