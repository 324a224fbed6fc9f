#include <catch2/catch.hpp>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "stack_table.h"

using memledger::interposer::StackTable;

namespace {

std::vector<uintptr_t> frames_of(const StackTable& table, uint32_t id) {
  uintptr_t out[StackTable::kMaxDepth];
  const uint32_t depth = table.get(id, out);
  return std::vector<uintptr_t>(out, out + depth);
}

constexpr uintptr_t kPy = uintptr_t{1} << 63;  // a Python frame word (trace_format.h)

}  // namespace

TEST_CASE("equal stacks get one id, different stacks different ids", "[stacks]") {
  static StackTable table;
  REQUIRE(table.init());
  const uintptr_t a[] = {0x1000, 0x2000, 0x3000};
  const uintptr_t b[] = {0x1000, 0x2000, 0x3001};
  const uintptr_t prefix[] = {0x2000, 0x3000};  // a's outer frames: a node on a's path
  uint32_t ia = table.intern(a, 3);
  CHECK(ia != 0);
  CHECK(table.intern(a, 3) == ia);
  uint32_t ib = table.intern(b, 3);
  CHECK(ib != ia);
  uint32_t ip = table.intern(prefix, 2);
  CHECK(ip != 0);
  CHECK(ip != ia);

  CHECK(frames_of(table, ia) == std::vector<uintptr_t>{0x1000, 0x2000, 0x3000});
  CHECK(frames_of(table, ib) == std::vector<uintptr_t>{0x1000, 0x2000, 0x3001});
  CHECK(frames_of(table, ip) == std::vector<uintptr_t>{0x2000, 0x3000});
  uintptr_t out[StackTable::kMaxDepth];
  CHECK(table.get(0, out) == 0);
  CHECK(table.get(12345, out) == 0);
}

TEST_CASE("stacks that share their outer frames share their nodes", "[stacks]") {
  static StackTable table;
  REQUIRE(table.init());
  // 1000 stacks 60 frames deep that differ only in their innermost frame.
  std::vector<uintptr_t> stack(60);
  for (size_t i = 0; i < stack.size(); ++i) stack[i] = 0x400000 + 16 * i;
  std::set<uint32_t> ids;
  for (uintptr_t leaf = 0; leaf < 1000; ++leaf) {
    stack[0] = 0x900000 + leaf;
    ids.insert(table.intern(stack.data(), static_cast<uint32_t>(stack.size())));
  }
  CHECK(ids.size() == 1000);
  CHECK(table.count() == 59 + 1000);  // the shared outer frames once, then one node per stack
  stack[0] = 0x900000 + 7;
  CHECK(frames_of(table, table.intern(stack.data(), 60)) == stack);
}

TEST_CASE("Python frames come back before native frames, each innermost first", "[stacks]") {
  static StackTable table;
  REQUIRE(table.init());
  const uintptr_t python_and_native[] = {kPy | 0x10, kPy | 0x20, kPy | 0x30, 0x1000, 0x2000};
  const uintptr_t python_only[] = {kPy | 0x10, kPy | 0x20};
  const uintptr_t native_only[] = {0x1000, 0x2000};
  const uint32_t a = table.intern(python_and_native, 5, 3);
  const uint32_t b = table.intern(python_only, 2, 2);
  const uint32_t c = table.intern(native_only, 2, 0);
  CHECK(frames_of(table, a) == std::vector<uintptr_t>(python_and_native, python_and_native + 5));
  CHECK(frames_of(table, b) == std::vector<uintptr_t>(python_only, python_only + 2));
  CHECK(frames_of(table, c) == std::vector<uintptr_t>(native_only, native_only + 2));
  CHECK(a != b);
  CHECK(a != c);
  CHECK(b != c);
}

TEST_CASE("a thread's path cache gives the same ids as looking every frame up", "[stacks]") {
  static StackTable table;
  REQUIRE(table.init());
  static StackTable::PathCache cache;
  std::vector<std::vector<uintptr_t>> stacks;
  for (int i = 0; i < 200; ++i) {
    std::vector<uintptr_t> s;
    const int depth = 3 + i % 17;
    for (int k = 0; k < depth; ++k) s.push_back(0x1000 + 0x10 * static_cast<uintptr_t>((k * 7 + i * (k < 2)) % 23));
    stacks.push_back(s);
  }
  std::vector<uint32_t> cached, uncached;
  for (const auto& s : stacks) cached.push_back(table.intern(s.data(), static_cast<uint32_t>(s.size()), 0, &cache));
  for (const auto& s : stacks) uncached.push_back(table.intern(s.data(), static_cast<uint32_t>(s.size())));
  CHECK(cached == uncached);
  for (size_t i = 0; i < stacks.size(); ++i) CHECK(frames_of(table, cached[i]) == stacks[i]);
  // A cache left busy (an intern() interrupted by a signal handler) is not used.
  cache.busy = 1;
  const uint32_t depth_before = cache.depth;
  CHECK(table.intern(stacks[5].data(), static_cast<uint32_t>(stacks[5].size()), 0, &cache) == cached[5]);
  CHECK(cache.depth == depth_before);
  cache.busy = 0;
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
      static thread_local StackTable::PathCache cache;
      for (int i = 0; i < kStacks; ++i) {
        // Every thread interns the same stacks, in a different order; half
        // the threads through a path cache.
        int s = (i * 7 + t * 131) % kStacks;
        uintptr_t frames[4] = {0x400000u + static_cast<uintptr_t>(s), 0x500000, 0x600000,
                               static_cast<uintptr_t>(0x700000 + s % 13)};
        ids[t][s] = table.intern(frames, 4, 0, t % 2 ? &cache : nullptr);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint32_t> distinct;
  for (int s = 0; s < kStacks; ++s) {
    for (int t = 1; t < kThreads; ++t) REQUIRE(ids[t][s] == ids[0][s]);
    REQUIRE(ids[0][s] != 0);
    distinct.insert(ids[0][s]);
    const std::vector<uintptr_t> expected = {0x400000u + static_cast<uintptr_t>(s), 0x500000, 0x600000,
                                             static_cast<uintptr_t>(0x700000 + s % 13)};
    REQUIRE(frames_of(table, ids[0][s]) == expected);
  }
  CHECK(distinct.size() == kStacks);
}
