#include <catch2/catch.hpp>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "stack_table.h"

using memledger::interposer::StackTable;

TEST_CASE("equal stacks get one id, different stacks different ids", "[stacks]") {
  static StackTable table;  // large: keep it off the test's stack
  REQUIRE(table.init());
  const uintptr_t a[] = {0x1000, 0x2000, 0x3000};
  const uintptr_t b[] = {0x1000, 0x2000, 0x3001};
  const uintptr_t prefix[] = {0x1000, 0x2000};
  uint32_t ia = table.intern(a, 3);
  CHECK(ia != 0);
  CHECK(table.intern(a, 3) == ia);
  uint32_t ib = table.intern(b, 3);
  CHECK(ib != ia);
  uint32_t ip = table.intern(prefix, 2);
  CHECK(ip != ia);
  CHECK(table.count() == 3);

  const uintptr_t* frames;
  uint32_t depth;
  REQUIRE(table.get(ib, &frames, &depth));
  CHECK(depth == 3);
  CHECK(frames[2] == 0x3001);
  CHECK_FALSE(table.get(0, &frames, &depth));
  CHECK_FALSE(table.get(12345, &frames, &depth));
}

TEST_CASE("interning from many threads agrees on ids", "[stacks]") {
  static StackTable table;
  REQUIRE(table.init());
  constexpr int kThreads = 8;
  constexpr int kStacks = 2000;
  std::vector<std::vector<uint32_t>> ids(kThreads, std::vector<uint32_t>(kStacks));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &ids] {
      for (int i = 0; i < kStacks; ++i) {
        // Every thread interns the same stacks, in a different order.
        int s = (i * 7 + t * 131) % kStacks;
        uintptr_t frames[4] = {0x400000u + static_cast<uintptr_t>(s), 0x500000, 0x600000,
                               static_cast<uintptr_t>(s % 13)};
        ids[t][s] = table.intern(frames, 4);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint32_t> distinct;
  for (int s = 0; s < kStacks; ++s) {
    for (int t = 1; t < kThreads; ++t) REQUIRE(ids[t][s] == ids[0][s]);
    REQUIRE(ids[0][s] != 0);
    distinct.insert(ids[0][s]);
  }
  CHECK(distinct.size() == kStacks);
  CHECK(table.count() == kStacks);
}
