#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <unistd.h>
#include <vector>

#include "host_records.h"
#include "trace_file.h"
#include "trace_reader.h"

namespace fmt = memledger::format;
using memledger::interposer::encode_host_records;
using memledger::interposer::Event;
using memledger::interposer::EventType;
using memledger::interposer::FrameDeltas;
using memledger::interposer::kMaxHostRecord;

namespace {

constexpr uint64_t kStart = 5'000'000;

// Host allocations and frees as full and sampled mode record them: mostly
// numbered in turn at the same millisecond, sometimes after another
// thread's events or at a new time, with sizes and address deltas of every
// varint length, and now and then an event the short records do not
// describe (a device allocation, a flagged free, a step).
std::vector<Event> storm(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Event> out;
  uint64_t seq = 1, ts = kStart + 1'000'000;
  for (size_t i = 0; i < n; ++i) {
    Event e{};
    const uint64_t r = rng();
    seq += (r % 5 == 0) ? 1 + rng() % 1000 : 1;
    if (r % 7 == 0) ts += 1'000'000;
    e.seq = seq;
    e.ts = (r % 97 == 0) ? kStart - 1 : ts;  // before the trace's start: written as 0
    const int shift = static_cast<int>(rng() % 64);
    e.addr = (r % 3 == 0) ? rng() >> shift : 0x7f0000000000ull + (rng() % 4096) * 16;
    const uint64_t pick = rng() % 100;
    if (pick < 45) {
      e.type = EventType::kFree;
      e.kind = static_cast<uint8_t>(fmt::Kind::kHost);
    } else if (pick < 92) {
      e.type = EventType::kAlloc;
      e.kind = static_cast<uint8_t>(fmt::Kind::kHost);
      e.size = rng() >> static_cast<int>(rng() % 64);
      e.stack = static_cast<uint32_t>(rng() % 300);
      if (pick < 52) {
        e.flags = fmt::kAllocSampled;
        e.weight = (rng() % 2) ? e.size : e.size + rng() % 100000;
      } else {
        e.weight = e.size;
      }
    } else if (pick < 95) {
      e.type = EventType::kAlloc;
      e.kind = static_cast<uint8_t>(fmt::Kind::kDevice);
      e.size = e.weight = 1 << 20;
      e.stack = 1;
    } else if (pick < 97) {
      e.type = EventType::kFree;
      e.kind = static_cast<uint8_t>(fmt::Kind::kHost);
      e.flags = fmt::kAllocPool;
    } else {
      e.type = EventType::kStep;
    }
    out.push_back(e);
  }
  return out;
}

// What the short records describe (trace_format.h): host events, device 0,
// allocations sampled or with their size as their weight, no flags else.
bool plain(const Event& e) {
  if (e.kind != static_cast<uint8_t>(fmt::Kind::kHost)) return false;
  if (e.type == EventType::kFree) return e.flags == 0;
  return e.type == EventType::kAlloc && e.aux == 0 &&
         (e.flags == fmt::kAllocSampled || (e.flags == 0 && e.weight == e.size));
}

}  // namespace

TEST_CASE("host records: encoded in batches, read back as they were", "[host_records]") {
  const std::vector<Event> events = storm(20000, 7);
  // Varints by shifts, and by pdep where this processor's is fast.
  const bool by_deposit = GENERATE(false, true);
  if (by_deposit && !memledger::interposer::fast_bit_deposit()) return;
  INFO((by_deposit ? "by pdep" : "by shifts"));
  // Stacks 0..199 are in the trace; 200..299 are not yet: an allocation
  // from one stops the batch, as one the short records do not describe.
  auto written = [](uint32_t id) { return id < 200; };
  memledger::testing::Payload payload;
  FrameDeltas d;
  std::vector<const Event*> kept;
  size_t stops = 0, wrote_at_stop = 0;
  for (const Event* next = events.data(), *end = events.data() + events.size(); next != end;) {
    const size_t batch = std::min<size_t>(static_cast<size_t>(end - next), 64);
    std::vector<uint8_t> room(batch * kMaxHostRecord + 8, 0xee);
    uint8_t* out = room.data();
    const Event* stop = by_deposit ? encode_host_records<true>(next, next + batch, kStart, d, out, written)
                                   : encode_host_records<false>(next, next + batch, kStart, d, out, written);
    REQUIRE(out <= room.data() + batch * kMaxHostRecord);
    payload.bytes.insert(payload.bytes.end(), room.data(), out);
    for (const Event* e = next; e != stop; ++e) {
      REQUIRE(plain(*e));
      kept.push_back(e);
    }
    if (stop == next + batch) {
      next = stop;
      continue;
    }
    ++stops;
    // The batch stops exactly where the short records cannot go on.
    const bool unwritten = stop->type == EventType::kAlloc && plain(*stop) && !written(stop->stack);
    REQUIRE((unwritten || !plain(*stop)));
    if (unwritten) {
      // The caller writes the stack, then the allocation alone.
      uint8_t one[kMaxHostRecord];
      uint8_t* p = one;
      CHECK(encode_host_records(stop, stop + 1, kStart, d, p, [](uint32_t) { return true; }) == stop + 1);
      payload.bytes.insert(payload.bytes.end(), one, p);
      kept.push_back(stop);
      ++wrote_at_stop;
    }
    next = stop + 1;
  }
  CHECK(stops > 100);
  CHECK(wrote_at_stop > 50);

  const std::string path = memledger::testing::write_trace(payload);
  const memledger::report::Trace trace = memledger::report::read_trace(path);
  unlink(path.c_str());
  CHECK(trace.problems.empty());
  REQUIRE(trace.events.size() == kept.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    const Event& want = *kept[i];
    const auto& got = trace.events[i];
    INFO("record " << i);
    CHECK(got.seq == want.seq);
    CHECK(got.ts == (want.ts >= kStart ? want.ts - kStart : 0));
    CHECK(got.addr == want.addr);
    CHECK(got.kind == static_cast<uint8_t>(fmt::Kind::kHost));
    if (want.type == EventType::kAlloc) {
      REQUIRE(got.type == memledger::report::EvType::kAlloc);
      CHECK(got.stack == want.stack);
      CHECK(got.size == want.weight);
      const bool sampled = want.flags == fmt::kAllocSampled;
      CHECK(((got.flags & fmt::kAllocSampled) != 0) == sampled);
      CHECK(((got.flags & memledger::report::kAllocByChance) != 0) == (sampled && want.weight != want.size));
    } else {
      CHECK(got.type == memledger::report::EvType::kFree);
    }
  }
}

TEST_CASE("host records: numbered in turn at the same time, a byte of tag and the address", "[host_records]") {
  std::vector<Event> events(3);
  for (size_t i = 0; i < events.size(); ++i) {
    events[i].seq = 41 + i;
    events[i].ts = kStart + 3'000'000;
    events[i].kind = static_cast<uint8_t>(fmt::Kind::kHost);
  }
  events[0].type = events[1].type = EventType::kAlloc;
  events[0].addr = 0x1000;
  events[0].size = events[0].weight = 48;
  events[0].stack = 5;
  events[1].addr = 0x1040;
  events[1].size = events[1].weight = 200;
  events[1].stack = 6;
  events[2].type = EventType::kFree;
  events[2].addr = 0x1000;
  FrameDeltas d;
  d.seq = 40;
  d.ts = 3'000'000;
  d.addr = 0x1000;
  uint8_t room[3 * kMaxHostRecord];
  uint8_t* out = room;
  CHECK(encode_host_records(events.data(), events.data() + 3, kStart, d, out, [](uint32_t) { return true; }) ==
        events.data() + 3);
  const std::vector<uint8_t> got(room, out);
  const std::vector<uint8_t> want = {
      static_cast<uint8_t>(fmt::Tag::kHostAllocNext), 0x00, 48, 5,
      static_cast<uint8_t>(fmt::Tag::kHostAllocNext), 0x80, 0x01, 200, 1, 6,
      static_cast<uint8_t>(fmt::Tag::kHostFreeNext), 0x7f,
  };
  CHECK(got == want);
  CHECK(d.seq == 43);
  CHECK(d.ts == 3'000'000);
  CHECK(d.addr == 0x1000);
}

TEST_CASE("host records: stack 0 and the stacks whose bit is set are in the trace", "[host_records]") {
  using memledger::interposer::stack_in_trace;
  // The writer's bits as it starts: no stack written, and stack 0 held.
  const uint64_t at_start[1] = {memledger::interposer::kStacksAtStart};
  CHECK(stack_in_trace(at_start, 1, 0));
  CHECK_FALSE(stack_in_trace(at_start, 1, 1));
  CHECK_FALSE(stack_in_trace(at_start, 1, 63));
  CHECK_FALSE(stack_in_trace(at_start, 1, 64));  // past the words
  const uint64_t bits[2] = {memledger::interposer::kStacksAtStart | uint64_t{1} << 5, uint64_t{1} << 63};
  CHECK(stack_in_trace(bits, 2, 0));
  CHECK(stack_in_trace(bits, 2, 5));
  CHECK(stack_in_trace(bits, 2, 127));
  CHECK_FALSE(stack_in_trace(bits, 2, 6));
  CHECK_FALSE(stack_in_trace(bits, 2, 64));
  CHECK_FALSE(stack_in_trace(bits, 2, 128));  // past the words
  CHECK_FALSE(stack_in_trace(bits, 1, 127));
}

TEST_CASE("host records: a varint's bytes are format::put_varint()'s at every length", "[host_records]") {
  using memledger::format::put_varint;
  using memledger::interposer::put_varint_at;
  std::vector<uint64_t> values = {0, 1, UINT64_MAX, UINT64_MAX - 1};
  for (int bits = 1; bits < 64; ++bits) {
    const uint64_t edge = uint64_t{1} << bits;
    for (uint64_t v : {edge - 2, edge - 1, edge, edge + 1, edge | (edge >> 1)}) values.push_back(v);
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 10000; ++i) values.push_back(rng() >> (rng() % 64));
  const bool deposit = memledger::interposer::fast_bit_deposit();
  if (!deposit) WARN("this processor's pdep is slow or missing: the varints by pdep are not tried");
  for (uint64_t v : values) {
    INFO("value " << v);
    uint8_t want[16];
    const size_t n = put_varint(want, v);
    for (int by_deposit = 0; by_deposit <= (deposit ? 1 : 0); ++by_deposit) {
      INFO((by_deposit ? "by pdep" : "by shifts"));
      uint8_t got[16];
      // Room for 10 bytes, and a guard past them that must stay as it was.
      memset(got, 0xee, sizeof got);
      const uint8_t* end = by_deposit ? put_varint_at<true>(got, v) : put_varint_at<false>(got, v);
      REQUIRE(static_cast<size_t>(end - got) == n);
      CHECK(memcmp(got, want, n) == 0);
      for (size_t k = 10; k < sizeof got; ++k) CHECK(got[k] == 0xee);
    }
  }
}
