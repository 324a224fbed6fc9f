#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "ring_merge.h"

using memledger::interposer::Event;
using memledger::interposer::MergeHead;
using memledger::interposer::merge_runs;
using memledger::interposer::RingRun;
using memledger::interposer::RingState;
using memledger::interposer::ThreadRing;

namespace {

// Rings as the producers leave them: events numbered `seqs` written from
// slot `first` on (past the end of the ring's `capacity` slots, they wrap),
// the tail at `first`.
std::unique_ptr<ThreadRing> ring_with(uint64_t first, const std::vector<uint64_t>& seqs,
                                      uint32_t capacity = ThreadRing::kCapacity) {
  // Default-initialised, as the recorder maps them: the slots and the
  // stack buffer stay untouched until written.
  std::unique_ptr<ThreadRing> ring(new ThreadRing);
  ring->mask = capacity - 1;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Event& e = ring->slot(first + i);
    e = Event{};
    e.seq = seqs[i];
    e.addr = seqs[i] * 16;
  }
  ring->tail.store(first);
  ring->head.store(first + seqs.size());
  return ring;
}

// The numbers 1..n dealt out to `rings` producers in runs of random length,
// as threads allocating at once number their events.
std::vector<std::vector<uint64_t>> deal(uint64_t n, size_t rings, size_t longest, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<uint64_t>> out(rings);
  for (uint64_t seq = 1; seq <= n;) {
    const size_t to = rng() % rings;
    const uint64_t len = 1 + rng() % longest;
    for (uint64_t k = 0; k < len && seq <= n; ++k) out[to].push_back(seq++);
  }
  return out;
}

}  // namespace

TEST_CASE("the rings' runs come out in the order of their numbers", "[merge]") {
  const std::pair<size_t, size_t> shapes[] = {{5, 1}, {5, 5}, {5, 300}, {40, 1}, {40, 7}, {1, 10}};
  for (const auto& [ring_count, longest] : shapes) {
    const auto dealt = deal(20000, ring_count, longest, static_cast<uint32_t>(ring_count * 1000 + longest));
    std::vector<std::unique_ptr<ThreadRing>> rings;
    std::vector<RingRun> runs;
    for (size_t i = 0; i < dealt.size(); ++i) {
      // Some runs wrap past the end of their ring, some of them in rings
      // of sampled mode's size.
      const uint32_t capacity = i % 4 == 2 && dealt[i].size() < ThreadRing::kSampledCapacity
                                    ? ThreadRing::kSampledCapacity
                                    : ThreadRing::kCapacity;
      const uint64_t first = i % 2 == 0 ? capacity * 3 - 700 * (i + 1) % capacity : 100 * i;
      rings.push_back(ring_with(first, dealt[i], capacity));
      runs.push_back({rings.back().get(), first, first + dealt[i].size(), false});
    }
    std::vector<uint64_t> order;
    std::vector<MergeHead> heads(runs.size());
    size_t stretches = 0;
    const size_t n = merge_runs(runs.data(), runs.size(), heads.data(), [&](ThreadRing*, const Event* events, size_t count) {
      REQUIRE(count > 0);
      REQUIRE(count <= 256);
      ++stretches;
      for (size_t k = 0; k < count; ++k) {
        REQUIRE(events[k].addr == events[k].seq * 16);
        order.push_back(events[k].seq);
      }
    });
    REQUIRE(n == 20000);
    REQUIRE(order.size() == 20000);
    for (size_t i = 0; i < order.size(); ++i) REQUIRE(order[i] == i + 1);
    // A run's events that come first together are handed over together,
    // broken only where their ring wraps and every 256 events.
    size_t switches = 0;
    for (size_t i = 0; i < dealt.size(); ++i) {
      for (size_t k = 1; k < dealt[i].size(); ++k) switches += dealt[i][k] != dealt[i][k - 1] + 1;
      switches += !dealt[i].empty();
    }
    CHECK(stretches >= switches);
    CHECK(stretches <= switches + dealt.size() + 20000 / 256);
    for (size_t i = 0; i < runs.size(); ++i) {
      CHECK(runs[i].pos == runs[i].end);
      CHECK(rings[i]->tail.load() == runs[i].end);
    }
  }
}

TEST_CASE("a ring gets back what was written while the merge goes on, never more", "[merge]") {
  const auto dealt = deal(5000, 3, 40, 7);
  std::vector<std::unique_ptr<ThreadRing>> rings;
  std::vector<RingRun> runs;
  for (const auto& seqs : dealt) {
    rings.push_back(ring_with(ThreadRing::kCapacity - 1000, seqs));
    runs.push_back({rings.back().get(), ThreadRing::kCapacity - 1000, ThreadRing::kCapacity - 1000 + seqs.size(), false});
  }
  size_t released_early = 0;
  std::vector<MergeHead> heads(runs.size());
  merge_runs(
      runs.data(), runs.size(), heads.data(),
      [&](ThreadRing*, const Event*, size_t) {
        // An event is handed back only once written: the ones being written
        // are at their run's position, and no tail has passed that.
        for (size_t i = 0; i < rings.size(); ++i) {
          const uint64_t tail = rings[i]->tail.load();
          REQUIRE(tail <= runs[i].pos);
          if (tail > ThreadRing::kCapacity - 1000) ++released_early;
        }
      },
      64);
  CHECK(released_early > 0);
  for (size_t i = 0; i < rings.size(); ++i) CHECK(rings[i]->tail.load() == runs[i].end);
}

TEST_CASE("a retired ring is free once its last run is written", "[merge]") {
  auto busy = ring_with(10, {1, 3, 5});
  auto retired = ring_with(20, {2, 4});
  auto retired_empty = ring_with(30, {});
  busy->state.store(static_cast<int>(RingState::kOwned));
  retired->state.store(static_cast<int>(RingState::kRetired));
  retired_empty->state.store(static_cast<int>(RingState::kRetired));
  std::vector<RingRun> runs = {{busy.get(), 10, 13, false}, {retired.get(), 20, 22, true},
                               {retired_empty.get(), 30, 30, true}};
  std::vector<uint64_t> order;
  bool retired_free_early = false;
  bool taken = false;
  MergeHead heads[3];
  merge_runs(runs.data(), runs.size(), heads, [&](ThreadRing*, const Event* events, size_t count) {
    for (size_t k = 0; k < count; ++k) order.push_back(events[k].seq);
    if (retired->state.load() == static_cast<int>(RingState::kFree) && order.size() < 4) retired_free_early = true;
    // A new thread takes the freed ring while the merge goes on, and starts
    // at its first slot: the later releases hand it back that slot, never
    // the last thread's position.
    if (!taken && retired->state.load() == static_cast<int>(RingState::kFree)) {
      taken = true;
      retired->state.store(static_cast<int>(RingState::kOwned));
      CHECK(retired->head.load() == 0);
      CHECK(retired->tail.load() == 0);
      retired->events[0].seq = 6;
      retired->events[1].seq = 7;
      retired->head.store(2);
    }
  }, 1);
  CHECK(order == std::vector<uint64_t>{1, 2, 3, 4, 5});
  CHECK_FALSE(retired_free_early);
  CHECK(taken);
  CHECK(busy->state.load() == static_cast<int>(RingState::kOwned));
  CHECK(retired->head.load() == 2);
  CHECK(retired->tail.load() == 0);
  CHECK(retired_empty->state.load() == static_cast<int>(RingState::kFree));
  CHECK(retired_empty->head.load() == 0);
  CHECK(retired_empty->tail.load() == 0);
}

TEST_CASE("no runs, or only empty ones, write nothing", "[merge]") {
  CHECK(merge_runs(static_cast<RingRun*>(nullptr), 0, static_cast<MergeHead*>(nullptr),
                   [](ThreadRing*, const Event*, size_t) { FAIL("an event"); }) == 0);
  auto ring = ring_with(5, {});
  RingRun run{ring.get(), 5, 5, false};
  MergeHead head;
  CHECK(merge_runs(&run, 1, &head, [](ThreadRing*, const Event*, size_t) { FAIL("an event"); }) == 0);
  CHECK(ring->tail.load() == 5);
}
