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

#include <cpuid.h>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

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

// Whether this processor's BMI2 bit deposit (pdep) takes a cycle or a few:
// Intel's since Haswell and AMD's since Zen 3. AMD's earlier ones (and
// Hygon's) have it microcoded, at hundreds of cycles.
inline bool fast_bit_deposit() {
  static const bool fast = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0 || (ebx & bit_BMI2) == 0) return false;
    unsigned vendor[3] = {};
    __get_cpuid(0, &eax, &vendor[0], &vendor[2], &vendor[1]);
    char name[13] = {};
    memcpy(name, vendor, 12);
    if (strcmp(name, "AuthenticAMD") != 0 && strcmp(name, "HygonGenuine") != 0) return true;
    __get_cpuid(1, &eax, &ebx, &ecx, &edx);
    unsigned family = (eax >> 8) & 0xf;
    if (family == 0xf) family += (eax >> 20) & 0xff;
    return family >= 0x19;
  }();
  return fast;
}

// A varint's bytes by its count of leading zero bits (of 64): 1 for 0 too.
inline constexpr auto kVarintLength = [] {
  std::array<uint8_t, 65> length{};
  for (int zeros = 0; zeros <= 64; ++zeros) {
    const int bits = zeros == 64 ? 1 : 64 - zeros;
    length[static_cast<size_t>(zeros)] = static_cast<uint8_t>((bits + 6) / 7);
  }
  return length;
}();

// format::put_varint()'s bytes, written through the pointer it returns:
// encode_host_records() built on format::put_varint() took 13% more
// instructions (callgrind, bench/storm). A value below 2^28 (the records'
// deltas and sizes, nearly always) is written without a branch on its
// length: its four 7-bit groups spread to four bytes (one pdep where
// `kDeposit`, the caller having asked fast_bit_deposit()), each but the
// last with its continuation bit, stored at once. A loop that stops at the
// last byte mispredicts its end wherever lengths change from one value to
// the next, as an address's delta does. Writes up to 4 bytes past the
// varint's end where it is shorter: within the 10 bytes any caller leaves
// room for.
template <bool kDeposit = false>
inline uint8_t* put_varint_at(uint8_t* p, uint64_t v) {
  static_assert(std::endian::native == std::endian::little);
  if (v < (uint64_t{1} << 28)) {
    uint32_t spread;
    if constexpr (kDeposit) {
      // As an instruction of its own: a function built for every x86-64
      // may not call the intrinsic.
      asm("pdepl %2, %1, %0" : "=r"(spread) : "r"(static_cast<uint32_t>(v)), "r"(0x7f7f7f7fu));
    } else {
      spread = static_cast<uint32_t>((v & 0x7f) | (v << 1 & 0x7f00) | (v << 2 & 0x7f0000) | (v << 3 & 0x7f000000));
    }
    const uint32_t length = kVarintLength[static_cast<size_t>(__builtin_clzll(v | 1))];
    const uint32_t word = spread | 0x808080u >> (8 * (4 - length));
    memcpy(p, &word, sizeof word);
    return p + length;
  }
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v) | 0x80;
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}
template <bool kDeposit = false>
inline uint8_t* put_signed_at(uint8_t* p, int64_t v) {
  return put_varint_at<kDeposit>(p, format::zigzag(v));
}

// A host allocation the short records describe: kind host, device 0, and
// either sampled or with its size as its weight and no flags.
inline bool plain_host_alloc(const Event& e) {
  return e.kind == static_cast<uint8_t>(format::Kind::kHost) && e.aux == 0 &&
         (e.flags == format::kAllocSampled || (e.flags == 0 && e.weight == e.size));
}
inline bool plain_host_free(const Event& e) {
  return e.kind == static_cast<uint8_t>(format::Kind::kHost) && e.flags == 0;
}

// Whether the stack numbered `id` is in the trace already, by the writer's
// bits of the stacks written (`words` of them, bit id % 64 of word id / 64).
// Stack 0, no stack, is never written: the writer's bits hold it from the
// start (kStacksAtStart), so that allocations without a stack take the
// batches too.
inline bool stack_in_trace(const uint64_t* bits, size_t words, uint32_t id) {
  return id / 64 < words && (bits[id / 64] >> (id % 64) & 1) != 0;
}
// The first word of the writer's bits: stack 0.
inline constexpr uint64_t kStacksAtStart = 1;

// What every one of these records starts with: the tag `in_turn_tag` where
// `may_be_in_turn` and the event is numbered one after the last record at
// its time, else `tag` and the two deltas; then the address's delta.
// Moves the frame's deltas on.
template <bool kDeposit>
inline uint8_t* put_record_head(uint8_t* p, const Event& e, uint64_t ets, bool may_be_in_turn,
                                format::Tag in_turn_tag, format::Tag tag, uint64_t& seq, uint64_t& ts,
                                uint64_t& addr) {
  if (may_be_in_turn && e.seq == seq + 1 && ets == ts) {
    *p++ = static_cast<uint8_t>(in_turn_tag);
  } else {
    *p++ = static_cast<uint8_t>(tag);
    p = put_signed_at<kDeposit>(p, static_cast<int64_t>(e.seq - seq));
    p = put_signed_at<kDeposit>(p, static_cast<int64_t>(ets - ts));
    ts = ets;
  }
  seq = e.seq;
  p = put_signed_at<kDeposit>(p, static_cast<int64_t>(e.addr - addr));
  addr = e.addr;
  return p;
}

// Encodes the events from `e` on, up to `end`, at `out` (room for
// kMaxHostRecord bytes each), while they are plain host frees or plain host
// allocations whose stack `written(stack)` says the frame's reader knows
// already (stack 0 is asked too). Moves `out` past what it wrote and `d` on,
// and returns the first event it left for the caller.
// `start_ns`: the trace's start; events' times are written from it.
// `kDeposit`: varints by pdep (fast_bit_deposit()).
template <bool kDeposit = false, typename Written>
inline const Event* encode_host_records(const Event* e, const Event* end, uint64_t start_ns, FrameDeltas& d,
                                        uint8_t*& out, Written&& written) {
  uint8_t* p = out;
  uint64_t seq = d.seq, ts = d.ts, addr = d.addr;
  for (; e != end; ++e) {
    const uint64_t ets = e->ts >= start_ns ? e->ts - start_ns : 0;
    if (e->type == EventType::kFree) {
      if (!plain_host_free(*e)) break;
      p = put_record_head<kDeposit>(p, *e, ets, true, format::Tag::kHostFreeNext, format::Tag::kHostFree, seq, ts, addr);
    } else if (e->type == EventType::kAlloc) {
      if (!plain_host_alloc(*e) || !written(e->stack)) break;
      // A sampled allocation always carries its seq and time.
      if (e->flags == format::kAllocSampled) {
        p = put_record_head<kDeposit>(p, *e, ets, false, format::Tag::kHostAllocNext, format::Tag::kSampledHostAlloc, seq, ts,
                            addr);
        p = put_varint_at<kDeposit>(p, e->size);
        p = put_varint_at<kDeposit>(p, e->stack);
        p = put_varint_at<kDeposit>(p, e->weight);
      } else {
        p = put_record_head<kDeposit>(p, *e, ets, true, format::Tag::kHostAllocNext, format::Tag::kHostAlloc, seq, ts, addr);
        p = put_varint_at<kDeposit>(p, e->size);
        p = put_varint_at<kDeposit>(p, e->stack);
      }
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
