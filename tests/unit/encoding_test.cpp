#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <unistd.h>
#include <vector>

#include "trace_encoding.h"
#include "trace_file.h"
#include "trace_format.h"
#include "trace_reader.h"

namespace fmt = memledger::format;

namespace {

// `payload` as a trace file's only frame, read back.
memledger::report::Trace read_back(const memledger::testing::Payload& payload) {
  const std::string path = memledger::testing::write_trace(payload);
  memledger::report::Trace trace = memledger::report::read_trace(path);
  unlink(path.c_str());
  return trace;
}

}  // namespace

TEST_CASE("varints round-trip at every width", "[encoding]") {
  std::vector<uint64_t> values = {0, 1, 127, 128, 255, 300, 16383, 16384, (1ull << 32) - 1, 1ull << 32,
                                  std::numeric_limits<uint64_t>::max()};
  std::vector<uint8_t> buf(values.size() * 10);
  size_t n = 0;
  for (uint64_t v : values) n += fmt::put_varint(buf.data() + n, v);
  fmt::Cursor c(buf.data(), n);
  for (uint64_t v : values) CHECK(c.varint() == v);
  CHECK(c.ok());
  CHECK(c.at_end());
}

TEST_CASE("zigzag keeps small negative deltas small", "[encoding]") {
  for (int64_t v : std::vector<int64_t>{0, -1, 1, -64, 63, std::numeric_limits<int64_t>::min(),
                    std::numeric_limits<int64_t>::max()}) {
    CHECK(fmt::unzigzag(fmt::zigzag(v)) == v);
  }
  uint8_t buf[10];
  CHECK(fmt::put_varint(buf, fmt::zigzag(-1)) == 1);
}

TEST_CASE("a cursor never reads past the end of malformed input", "[encoding]") {
  const uint8_t unterminated[] = {0x80, 0x80, 0x80};
  fmt::Cursor a(unterminated, sizeof unterminated);
  CHECK(a.varint() == 0);
  CHECK_FALSE(a.ok());

  const uint8_t too_long[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  fmt::Cursor b(too_long, sizeof too_long);
  b.varint();
  CHECK_FALSE(b.ok());

  const uint8_t string_past_end[] = {0x05, 'a', 'b'};
  fmt::Cursor c(string_past_end, sizeof string_past_end);
  CHECK(c.string().empty());
  CHECK_FALSE(c.ok());
  CHECK(c.byte() == 0);  // stays failed, stays in bounds
}

TEST_CASE("host records numbered in turn leave out their number and time", "[encoding]") {
  // As the writer lays out a thread's run of events: the Next records take
  // the previous record's number plus one and its time; the others carry
  // both, as deltas from the previous record, whichever kind it was.
  memledger::testing::Payload p;
  p.tag(fmt::Tag::kHostAlloc);  // seq 10, ts 4000000, addr 0x1000, 64 B, stack 3
  p.s(10);
  p.s(4000000);
  p.s(0x1000);
  p.u(64);
  p.u(3);
  p.tag(fmt::Tag::kHostAllocNext);  // seq 11, addr 0x1100
  p.s(0x100);
  p.u(32);
  p.u(4);
  p.tag(fmt::Tag::kHostFreeNext);  // seq 12, addr 0x1000
  p.s(-0x100);
  p.tag(fmt::Tag::kHostFree);  // seq 20 (another thread's in between), 4 ms later
  p.s(8);
  p.s(4000000);
  p.s(0x100);
  p.tag(fmt::Tag::kHostAllocNext);  // seq 21 at that time
  p.s(0x40);
  p.u(16);
  p.u(3);
  const memledger::report::Trace trace = read_back(p);

  using memledger::report::EvType;
  struct Expected {
    EvType type;
    uint64_t seq, ts, addr, size;
    uint32_t stack;
  };
  const std::vector<Expected> expected = {
      {EvType::kAlloc, 10, 4000000, 0x1000, 64, 3}, {EvType::kAlloc, 11, 4000000, 0x1100, 32, 4},
      {EvType::kFree, 12, 4000000, 0x1000, 0, 0},   {EvType::kFree, 20, 8000000, 0x1100, 0, 0},
      {EvType::kAlloc, 21, 8000000, 0x1140, 16, 3},
  };
  REQUIRE(trace.events.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& e = trace.events[i];
    INFO("record " << i);
    CHECK(e.type == expected[i].type);
    CHECK(e.kind == static_cast<uint8_t>(fmt::Kind::kHost));
    CHECK(e.seq == expected[i].seq);
    CHECK(e.ts == expected[i].ts);
    CHECK(e.addr == expected[i].addr);
    if (e.type == EvType::kAlloc) {
      CHECK(e.size == expected[i].size);
      CHECK(e.stack == expected[i].stack);
    }
  }
}

namespace {

// A stack record of `frames` (innermost first) as the writer lays it out:
// kStack when it shares nothing, else kStackShared.
void stack_record(memledger::testing::Payload& p, uint32_t id, const std::vector<uint64_t>& frames, uint64_t python,
                  uint64_t python_shared, uint64_t native_shared) {
  const bool shares = python_shared + native_shared > 0;
  p.tag(shares ? fmt::Tag::kStackShared : fmt::Tag::kStack);
  p.u(id);
  p.u(frames.size());
  if (shares) {
    p.u(python);
    p.u(python_shared);
    p.u(native_shared);
  }
  uint64_t prev = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    if (shares && ((i >= python - python_shared && i < python) || i >= frames.size() - native_shared)) continue;
    p.s(static_cast<int64_t>(frames[i] - prev));
    prev = frames[i];
  }
}

}  // namespace

TEST_CASE("stack records share the outer frames of each part with the record before", "[encoding]") {
  const uint64_t a = fmt::python_frame_word(7, 10), b = fmt::python_frame_word(8, 20);
  const uint64_t c = fmt::python_frame_word(9, 30), e = fmt::python_frame_word(10, 40);
  const std::vector<uint64_t> first = {a, b, 0x1000, 0x2000, 0x3000};
  const std::vector<uint64_t> second = {c, b, 0x1500, 0x2000, 0x3000};  // shares b, and 0x2000 0x3000
  const std::vector<uint64_t> third = {0x1700, 0x2000, 0x3000};         // native alone, shares two
  const std::vector<uint64_t> fourth = {e, 0x1700, 0x2000, 0x3000};     // shares the whole native part
  memledger::testing::Payload p;
  stack_record(p, 5, first, 2, 0, 0);
  stack_record(p, 6, second, 2, 1, 2);
  stack_record(p, 7, third, 0, 0, 2);
  stack_record(p, 8, fourth, 1, 0, 3);
  const memledger::report::Trace trace = read_back(p);
  CHECK(trace.problems.empty());
  REQUIRE(trace.stacks.size() == 4);
  CHECK(trace.stacks.at(5) == first);
  CHECK(trace.stacks.at(6) == second);
  CHECK(trace.stacks.at(7) == third);
  CHECK(trace.stacks.at(8) == fourth);
}

TEST_CASE("a record whose Python part is not its leading Python frames is kept whole", "[encoding]") {
  // The writer never makes one; a reader takes the leading Python frames as
  // the Python path that the next record shares.
  const uint64_t a = fmt::python_frame_word(7, 10), b = fmt::python_frame_word(8, 20);
  const uint64_t c = fmt::python_frame_word(9, 30);
  const std::vector<uint64_t> first = {a, b, 0x1000};      // says one Python frame: b is "native"
  const std::vector<uint64_t> second = {c, b, a, 0x1000};  // says two, sharing b: a is "native"
  memledger::testing::Payload p;
  stack_record(p, 1, first, 1, 0, 0);
  stack_record(p, 2, second, 2, 1, 1);
  const memledger::report::Trace trace = read_back(p);
  CHECK(trace.problems.empty());
  CHECK(trace.stacks.at(1) == first);
  CHECK(trace.stacks.at(2) == second);
}

TEST_CASE("a stack record that shares more than it may is damage", "[encoding]") {
  // 200 native frames, then records of one frame of their own (a delta of
  // one byte) sharing the rest: 9 bytes, which may share 72 frames; sharing
  // 56, 7 bytes, which may share 56.
  std::vector<uint64_t> deep;
  for (uint64_t i = 0; i < 200; ++i) deep.push_back(0x400000 + 16 * i);
  for (const char* what : {"more than its bytes allow", "more than the last record has", "none before it"}) {
    INFO(what);
    const std::string how = what;
    memledger::testing::Payload p;
    if (how != "none before it") stack_record(p, 1, deep, 0, 0, 0);
    std::vector<uint64_t> leaf = {0x10};
    const uint64_t shared = how == "more than its bytes allow" ? 199 : 201;
    leaf.insert(leaf.end(), deep.end() - static_cast<ptrdiff_t>(std::min<uint64_t>(shared, 200)), deep.end());
    if (shared > 200) leaf.push_back(0x500000);
    const size_t before = p.bytes.size();
    stack_record(p, 2, leaf, 0, 0, shared);
    if (how == "more than its bytes allow") REQUIRE(shared > fmt::kStackShareRatio * (p.bytes.size() - before));
    const memledger::report::Trace trace = read_back(p);
    CHECK(trace.stacks.count(2) == 0);
    CHECK(trace.stacks.count(1) == (how != "none before it" ? 1u : 0u));
    CHECK_FALSE(trace.problems.empty());
  }
  // At the bound: as many shared frames as the record's bytes allow.
  memledger::testing::Payload p;
  stack_record(p, 1, deep, 0, 0, 0);
  const size_t before = p.bytes.size();
  std::vector<uint64_t> leaf = {0x10};
  leaf.insert(leaf.end(), deep.end() - 56, deep.end());
  stack_record(p, 2, leaf, 0, 0, 56);
  REQUIRE(56 == fmt::kStackShareRatio * (p.bytes.size() - before));
  const memledger::report::Trace trace = read_back(p);
  CHECK(trace.problems.empty());
  REQUIRE(trace.stacks.count(2) == 1);
  CHECK(trace.stacks.at(2) == leaf);
}

TEST_CASE("sampled records leave out what sampled mode repeats", "[encoding]") {
  memledger::testing::Payload p;
  auto sampled_alloc = [&p](int64_t addr_delta, uint64_t size, uint64_t weight) {
    p.tag(fmt::Tag::kSampledHostAlloc);  // the next seq, at time 0, stack 2
    p.s(1);
    p.s(0);
    p.s(addr_delta);
    p.u(size);
    p.u(2);
    p.u(weight);
  };
  sampled_alloc(0x5000, 100, 131072);  // seq 1: 100 B standing for 131072 B
  p.tag(fmt::Tag::kHostTotals);  // seq 2: 1,000,000 B live, 50 allocations, 10 frees
  p.s(1);
  p.s(0);
  p.s(1000000);
  p.u(50);
  p.u(10);
  sampled_alloc(0x1000, 200000, 200000);  // seq 3: 200000 B, its own weight
  p.tag(fmt::Tag::kHostTotalsDelta);  // seq 4: 300,000 B fewer, 4 allocations and 2^32 - 1 frees later
  p.s(1);
  p.s(0);
  p.s(-300000);
  p.u(4);
  p.u(0xffffffffu);
  const memledger::report::Trace trace = read_back(p);

  REQUIRE(trace.events.size() == 2);
  CHECK(trace.events[0].seq == 1);
  CHECK(trace.events[0].addr == 0x5000);
  CHECK(trace.events[0].size == 131072);
  CHECK(trace.events[0].stack == 2);
  CHECK(trace.events[0].flags == (fmt::kAllocSampled | memledger::report::kAllocByChance));
  CHECK(trace.events[1].seq == 3);
  CHECK(trace.events[1].addr == 0x6000);
  CHECK(trace.events[1].size == 200000);
  CHECK(trace.events[1].flags == fmt::kAllocSampled);
  REQUIRE(trace.host_totals.size() == 2);
  CHECK(trace.host_totals[0].seq == 2);
  CHECK(trace.host_totals[0].host_live == 1000000);
  CHECK(trace.host_totals[0].host_allocs == 50);
  CHECK(trace.host_totals[0].host_frees == 10);
  CHECK(trace.host_totals[1].seq == 4);
  CHECK(trace.host_totals[1].host_live == 700000);
  CHECK(trace.host_totals[1].host_allocs == 54);
  CHECK(trace.host_totals[1].host_frees == 9);  // 10 + 2^32 - 1, mod 2^32
  CHECK(trace.frames_damaged == 0);
}

TEST_CASE("totals given as differences with nothing before them in the frame are damage", "[encoding]") {
  memledger::testing::Payload p;
  p.tag(fmt::Tag::kHostTotalsDelta);
  p.s(1);
  p.s(0);
  p.s(5);
  p.u(1);
  p.u(1);
  const memledger::report::Trace trace = read_back(p);
  CHECK(trace.host_totals.empty());
  CHECK(trace.frames_damaged == 1);
}
