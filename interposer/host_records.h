// The writer's hot records: the host allocations and frees that are almost
// every event of a full-mode trace (kHostAlloc, kHostAllocNext,
// kSampledHostAlloc, kHostFree, kHostFreeNext in trace_format.h), encoded
// many at a time.
//
// Bytes written through a pointer may alias anything, so a record encoder
// that keeps its output position and the frame's deltas in an object has
// them loaded and stored again around every byte it writes. Here they live
// in locals for a whole batch of records, and the events are told apart by
// two compares, not a jump through a table on the event type that the
// alternating allocations and frees keep mispredicting.
#pragma once

#include <cstddef>
#include <cstdint>

#include "event_ring.h"
#include "trace_encoding.h"
#include "trace_format.h"

namespace memledger::interposer {

// The delta-coded fields of the frame being written (trace_format.h,
// "Deltas"): the last record's seq and ts_ns, the last address.
struct FrameDeltas {
  uint64_t seq = 0;
  uint64_t ts = 0;
  uint64_t addr = 0;
};

// The most bytes one of these records takes: a tag and six varints.
inline constexpr size_t kMaxHostRecord = 1 + 6 * 10;

inline uint8_t* put_varint_at(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v) | 0x80;
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}
inline uint8_t* put_signed_at(uint8_t* p, int64_t v) { return put_varint_at(p, format::zigzag(v)); }

// A host allocation the short records describe: kind host, device 0, and
// either sampled or with its size as its weight and no flags.
inline bool plain_host_alloc(const Event& e) {
  return e.kind == static_cast<uint8_t>(format::Kind::kHost) && e.aux == 0 &&
         (e.flags == format::kAllocSampled || (e.flags == 0 && e.weight == e.size));
}
inline bool plain_host_free(const Event& e) {
  return e.kind == static_cast<uint8_t>(format::Kind::kHost) && e.flags == 0;
}

// Encodes the events from `e` on, up to `end`, at `out` (room for
// kMaxHostRecord bytes each), while they are plain host frees or plain host
// allocations whose stack `written(stack)` says the frame's reader knows
// already (stack 0 is asked too). Moves `out` past what it wrote and `d` on,
// and returns the first event it left for the caller.
// `start_ns`: the trace's start; events' times are written from it.
template <typename Written>
inline const Event* encode_host_records(const Event* e, const Event* end, uint64_t start_ns, FrameDeltas& d,
                                        uint8_t*& out, Written&& written) {
  uint8_t* p = out;
  uint64_t seq = d.seq, ts = d.ts, addr = d.addr;
  for (; e != end; ++e) {
    const uint64_t ets = e->ts >= start_ns ? e->ts - start_ns : 0;
    const bool in_turn = e->seq == seq + 1 && ets == ts;
    if (e->type == EventType::kFree) {
      if (!plain_host_free(*e)) break;
      if (in_turn) {
        *p++ = static_cast<uint8_t>(format::Tag::kHostFreeNext);
      } else {
        *p++ = static_cast<uint8_t>(format::Tag::kHostFree);
        p = put_signed_at(p, static_cast<int64_t>(e->seq - seq));
        p = put_signed_at(p, static_cast<int64_t>(ets - ts));
        ts = ets;
      }
      seq = e->seq;
      p = put_signed_at(p, static_cast<int64_t>(e->addr - addr));
      addr = e->addr;
    } else if (e->type == EventType::kAlloc) {
      if (!plain_host_alloc(*e) || !written(e->stack)) break;
      // A sampled allocation always carries its seq and time.
      const bool sampled = e->flags == format::kAllocSampled;
      if (!sampled && in_turn) {
        *p++ = static_cast<uint8_t>(format::Tag::kHostAllocNext);
      } else {
        *p++ = static_cast<uint8_t>(sampled ? format::Tag::kSampledHostAlloc : format::Tag::kHostAlloc);
        p = put_signed_at(p, static_cast<int64_t>(e->seq - seq));
        p = put_signed_at(p, static_cast<int64_t>(ets - ts));
        ts = ets;
      }
      seq = e->seq;
      p = put_signed_at(p, static_cast<int64_t>(e->addr - addr));
      addr = e->addr;
      p = put_varint_at(p, e->size);
      p = put_varint_at(p, e->stack);
      if (sampled) p = put_varint_at(p, e->weight);
    } else {
      break;
    }
  }
  d.seq = seq;
  d.ts = ts;
  d.addr = addr;
  out = p;
  return e;
}

}  // namespace memledger::interposer
