#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "stack_spill.h"

using memledger::interposer::StackSpill;

namespace {

// A stack of `depth` words, `python` of them first, told apart by `n`.
std::vector<uintptr_t> stack_of(uint32_t n, uint32_t depth) {
  std::vector<uintptr_t> words(depth);
  for (uint32_t i = 0; i < depth; ++i) words[i] = (uintptr_t{n} << 20) + i + 1;
  return words;
}

// The writer's part: the stack `marker` names, handed back with `id`.
uint32_t take(StackSpill& spill, uint32_t marker, uintptr_t* out, uint32_t* python, uint32_t id = 0) {
  uint64_t at = 0;
  const uint32_t depth = spill.take(marker, out, python, &at);
  if (depth != 0) spill.release(at, depth, id);
  return depth;
}

}  // namespace

TEST_CASE("stacks come back as they were put, across the buffer's end", "[spill]") {
  auto spill = std::make_unique<StackSpill>();
  std::mt19937 rng(7);
  std::deque<std::pair<uint32_t, std::vector<uintptr_t>>> pending;  // marker, words
  uint32_t made = 0, taken = 0;
  uintptr_t out[StackSpill::kMaxDepth];
  // Far more words than the buffer holds, so that positions wrap many times;
  // the consumer lags the producer by up to 40 stacks.
  while (taken < 20000) {
    const uint32_t depth = 1 + rng() % 300;
    auto words = stack_of(made, depth);
    const uint32_t python = rng() % (depth + 1);
    const uint32_t marker = spill->put(words.data(), depth, python);
    if (marker != 0) {
      REQUIRE(StackSpill::is_marker(marker));
      pending.emplace_back(marker, std::move(words));
      ++made;
    }
    if (marker == 0 || pending.size() > 40 || rng() % 3 == 0) {
      REQUIRE_FALSE(pending.empty());
      auto [m, expected] = std::move(pending.front());
      pending.pop_front();
      uint32_t got_python = 99999;
      const uint32_t got = take(*spill, m, out, &got_python);
      REQUIRE(got == expected.size());
      REQUIRE(std::vector<uintptr_t>(out, out + got) == expected);
      REQUIRE(got_python <= got);
      ++taken;
    }
  }
  CHECK(spill->head.load() > 10 * StackSpill::kWords);
}

TEST_CASE("a full buffer refuses a stack, and takes it again once read", "[spill]") {
  auto spill = std::make_unique<StackSpill>();
  const auto words = stack_of(1, 255);
  std::vector<uint32_t> markers;
  for (uint32_t m; (m = spill->put(words.data(), 255, 3)) != 0;) markers.push_back(m);
  CHECK(markers.size() == StackSpill::kWords / 256);
  CHECK(spill->used() <= StackSpill::kWords);
  uintptr_t out[StackSpill::kMaxDepth];
  uint32_t python = 0;
  REQUIRE(take(*spill, markers[0], out, &python) == 255);
  CHECK(python == 3);
  CHECK(spill->put(words.data(), 255, 3) != 0);
}

TEST_CASE("a stack whose event never came is passed over", "[spill]") {
  auto spill = std::make_unique<StackSpill>();
  const auto first = stack_of(1, 10), orphan = stack_of(2, 20), third = stack_of(3, 30);
  const uint32_t a = spill->put(first.data(), 10, 1);
  spill->put(orphan.data(), 20, 2);  // its event was dropped: nobody takes it
  const uint32_t c = spill->put(third.data(), 30, 3);
  uintptr_t out[StackSpill::kMaxDepth];
  uint32_t python = 0;
  REQUIRE(take(*spill, a, out, &python) == 10);
  REQUIRE(take(*spill, c, out, &python) == 30);
  CHECK(std::vector<uintptr_t>(out, out + 30) == third);
  CHECK(python == 3);
  CHECK(spill->used() == 0);
}

TEST_CASE("a marker that names no stack gives none", "[spill]") {
  auto spill = std::make_unique<StackSpill>();
  const auto words = stack_of(1, 10);
  uintptr_t out[StackSpill::kMaxDepth];
  uint32_t python = 0;
  // Nothing put yet.
  CHECK(take(*spill, StackSpill::kMarker, out, &python) == 0);
  const uint32_t m = spill->put(words.data(), 10, 0);
  // Inside a stack, not at its start; past what was put.
  CHECK(take(*spill, m + 3, out, &python) == 0);
  CHECK(take(*spill, m + 11, out, &python) == 0);
  REQUIRE(take(*spill, m, out, &python) == 10);
  // Read already.
  CHECK(take(*spill, m, out, &python) == 0);
  // Stacks it does not take: empty, too deep, more Python frames than frames.
  CHECK(spill->put(words.data(), 0, 0) == 0);
  CHECK(spill->put(words.data(), 10, 11) == 0);
  std::vector<uintptr_t> deep(StackSpill::kMaxDepth + 1, 1);
  CHECK(spill->put(deep.data(), StackSpill::kMaxDepth + 1, 0) == 0);
  // A fork child drops what its thread had put: a marker from before names nothing.
  const uint32_t before = spill->put(words.data(), 10, 0);
  spill->drop_pending();
  CHECK(spill->used() == 0);
  CHECK(take(*spill, before, out, &python) == 0);
  const uint32_t after = spill->put(words.data(), 10, 0);
  CHECK(take(*spill, after, out, &python) == 10);
  // Once its thread is gone, a new one starts at the first word.
  spill->put(words.data(), 10, 0);
  spill->reset_to_start();
  CHECK(spill->put(words.data(), 10, 0) == StackSpill::kMarker);
}

TEST_CASE("a buffer read to its end starts again at its first word", "[spill]") {
  auto spill = std::make_unique<StackSpill>();
  const auto words = stack_of(1, 99);
  uintptr_t out[StackSpill::kMaxDepth];
  uint32_t python = 0;
  // Read as they come: the writer keeps up.
  uint64_t furthest = 0;
  for (int i = 0; i < 5000; ++i) {
    const uint32_t m = spill->put(words.data(), 99, 0);
    REQUIRE(m != 0);
    furthest = std::max<uint64_t>(furthest, m & StackSpill::kMask);
    REQUIRE(take(*spill, m, out, &python) == 99);
  }
  CHECK(furthest <= StackSpill::kWords / 8 + 100);
  CHECK(spill->head.load() > 3 * StackSpill::kWords);
  // Not while a stack waits to be read.
  while ((spill->head.load() & StackSpill::kMask) <= StackSpill::kWords / 8) {
    REQUIRE(take(*spill, spill->put(words.data(), 99, 0), out, &python) == 99);
  }
  const uint32_t waiting = spill->put(words.data(), 99, 0);
  const uint32_t next = spill->put(words.data(), 99, 0);
  CHECK((next & StackSpill::kMask) == (waiting & StackSpill::kMask) + 100);
  CHECK(take(*spill, waiting, out, &python) == 99);
  CHECK(take(*spill, next, out, &python) == 99);
}

TEST_CASE("the id the writer gave a stack is read back while its words are there", "[spill]") {
  auto spill = std::make_unique<StackSpill>();
  const auto words = stack_of(1, 40), other = stack_of(2, 40), filler = stack_of(3, 500);
  uintptr_t out[StackSpill::kMaxDepth];
  uint32_t python = 0;
  uint64_t at = 0;
  const uint32_t m = spill->put(words.data(), 40, 5, &at);
  REQUIRE(m != 0);
  bool waiting = false;
  CHECK(spill->known(at, words.data(), 40, 5, &waiting) == 0);  // not interned yet
  CHECK(waiting);
  REQUIRE(take(*spill, m, out, &python, 12345) == 40);
  CHECK(spill->known(at, words.data(), 40, 5, &waiting) == 12345);
  CHECK_FALSE(waiting);
  // Another stack, or the same words split otherwise, is not it.
  CHECK(spill->known(at, other.data(), 40, 5, &waiting) == 0);
  CHECK_FALSE(waiting);
  CHECK(spill->known(at, words.data(), 40, 4, &waiting) == 0);
  CHECK(spill->known(at, words.data(), 39, 5, &waiting) == 0);
  // Not at a stack's start.
  CHECK(spill->known(at + 1, words.data(), 40, 5, &waiting) == 0);
  // Read with no id (the table was full): not waited for.
  const uint32_t m2 = spill->put(other.data(), 40, 5);
  uint64_t at2 = at + 41;
  REQUIRE(take(*spill, m2, out, &python, 0) == 40);
  CHECK(spill->known(at2, other.data(), 40, 5, &waiting) == 0);
  CHECK_FALSE(waiting);
  // Until the producer writes over it, a lap later.
  while (spill->head.load() + 501 <= at + StackSpill::kWords) {
    uint64_t next = 0;
    const uint32_t f = spill->put(filler.data(), 500, 0, &next);
    REQUIRE(f != 0);
    REQUIRE(take(*spill, f, out, &python, 7) == 500);
    if (spill->head.load() <= at + StackSpill::kWords - 41) CHECK(spill->known(at, words.data(), 40, 5, &waiting) == 12345);
  }
  CHECK(spill->known(at, words.data(), 40, 5, &waiting) == 0);
}
