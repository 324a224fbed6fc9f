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

TEST_CASE("a frame word is kept once, however many nodes have it", "[stacks]") {
  // 20,000 stacks of three frames: one of 20 outer frames, one middle
  // frame below each, one innermost frame of their own. The middle word
  // is on 20 nodes and kept once; the innermost words grow the index of
  // words past its first size several times.
  static StackTable table;
  REQUIRE(table.init());
  constexpr uintptr_t kStacks = 20000;
  std::vector<uint32_t> ids(kStacks);
  for (uintptr_t i = 0; i < kStacks; ++i) {
    const uintptr_t frames[3] = {0x500000 + 16 * i, 0x7000, 0x8000 + i % 20};
    ids[i] = table.intern(frames, 3);
    REQUIRE(ids[i] != 0);
  }
  CHECK(table.count() == 20 + 20 + kStacks);
  CHECK(table.word_count() == 20 + 1 + kStacks);
  for (uintptr_t i = 0; i < kStacks; i += 3) {
    const uintptr_t frames[3] = {0x500000 + 16 * i, 0x7000, 0x8000 + i % 20};
    REQUIRE(table.intern(frames, 3) == ids[i]);
    REQUIRE(frames_of(table, ids[i]) == std::vector<uintptr_t>(frames, frames + 3));
  }
  CHECK(table.word_count() == 20 + 1 + kStacks);
}

TEST_CASE("every kind of frame word comes back as it was interned", "[stacks]") {
  static StackTable table;
  REQUIRE(table.init());
  constexpr uintptr_t kAttributed = uintptr_t{1} << 62;
  constexpr uintptr_t kCode = uintptr_t{1} << 32;  // Python code id 1
  // Words a node keeps in 48 bits, and words kept whole beside the tree:
  // an address from 2^47 on, a Python code id from 2^20 on, an offset from
  // 2^24 - 1 on; the unknown offset; words that differ only in the bits a
  // packed form could drop.
  const std::vector<uintptr_t> python = {
      kPy | kCode | 0x10,
      kPy | kAttributed | kCode | 0x10,
      kPy | kCode | 0xffffffffu,
      kPy | kCode | 0xfffffe,
      kPy | kCode | 0xffffff,
      kPy | kCode | 0x1000000,
      kPy | (uintptr_t{(1u << 20) - 1} << 32) | 7,
      kPy | (uintptr_t{1u << 20} << 32) | 7,
      kPy | (uintptr_t{0x3fffffff} << 32) | 7,
      kPy | kAttributed | (uintptr_t{0x3fffffff} << 32) | 0xfffffffeu,
  };
  const std::vector<uintptr_t> native = {0x1, 0x7ffffffff000, 0x7fffffffffff, 0x800000000000, 0xff00000000001234,
                                         0x4000000000000001, 0x4000000000ffffff};
  std::vector<uintptr_t> both = python;
  both.insert(both.end(), native.begin(), native.end());
  const uint32_t a = table.intern(both.data(), static_cast<uint32_t>(both.size()), static_cast<uint32_t>(python.size()));
  const uint32_t b = table.intern(native.data(), static_cast<uint32_t>(native.size()));
  const uint32_t c = table.intern(python.data(), static_cast<uint32_t>(python.size()), static_cast<uint32_t>(python.size()));
  REQUIRE(a != 0);
  REQUIRE(b != 0);
  REQUIRE(c != 0);
  CHECK(frames_of(table, a) == both);
  CHECK(frames_of(table, b) == native);
  CHECK(frames_of(table, c) == python);
  // Each word is its own frame: one word changed, another stack.
  for (size_t i = 0; i < both.size(); ++i) {
    std::vector<uintptr_t> other = both;
    other[i] ^= 1;
    const uint32_t id = table.intern(other.data(), static_cast<uint32_t>(other.size()), static_cast<uint32_t>(python.size()));
    CHECK(id != a);
    CHECK(frames_of(table, id) == other);
  }
  CHECK(table.intern(both.data(), static_cast<uint32_t>(both.size()), static_cast<uint32_t>(python.size())) == a);
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

TEST_CASE("a stack's Python and native paths are kept apart, and paired", "[stacks]") {
  static StackTable table;
  REQUIRE(table.init());
  // 30 Python paths (10 frames deep, differing in their innermost frame)
  // reach each of 40 native paths (50 frames deep, differing in their
  // innermost frame): 1,200 stacks.
  std::vector<uintptr_t> stack(60);
  for (int k = 0; k < 10; ++k) stack[k] = kPy | (0x100 + static_cast<uintptr_t>(k));
  for (int k = 10; k < 60; ++k) stack[k] = 0x400000 + 16 * static_cast<uintptr_t>(k);
  std::set<uint32_t> ids;
  for (uintptr_t py = 0; py < 30; ++py) {
    for (uintptr_t native = 0; native < 40; ++native) {
      stack[0] = kPy | (0x900000 + py);
      stack[10] = 0x900000 + native;
      const uint32_t id = table.intern(stack.data(), 60, 10);
      REQUIRE(id != 0);
      ids.insert(id);
      REQUIRE(frames_of(table, id) == stack);
    }
  }
  CHECK(ids.size() == 1200);
  // Each Python path once (9 shared frames, then 30 innermost), the
  // native frames but the innermost once (49), then one node per stack:
  // its innermost native frame, paired with its Python path. As one path
  // per stack, every Python path had its own copy of the 49 + 40.
  CHECK(table.count() == (9 + 30) + 49 + 1200);
  // A Python path alone and a native path alone are stacks of their own.
  const uint32_t python_only = table.intern(stack.data(), 10, 10);
  const uint32_t native_only = table.intern(stack.data() + 10, 50, 0);
  CHECK(frames_of(table, python_only) == std::vector<uintptr_t>(stack.begin(), stack.begin() + 10));
  CHECK(frames_of(table, native_only) == std::vector<uintptr_t>(stack.begin() + 10, stack.end()));
  CHECK(ids.count(python_only) == 0);
  CHECK(ids.count(native_only) == 0);
}

TEST_CASE("a path cache gives the same ids as looking every frame up, Python frames or not", "[stacks]") {
  static StackTable table;
  REQUIRE(table.init());
  static StackTable::PathCache cache;
  // Stacks that change their Python part, their native part, both or
  // neither from one to the next, and pairs that meet again later (more
  // than the cache's recent pairs, so that some are looked up again).
  std::vector<std::pair<std::vector<uintptr_t>, uint32_t>> stacks;
  uint64_t x = 12345;
  auto next = [&x] { return (x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  for (int i = 0; i < 5000; ++i) {
    const uint32_t python = static_cast<uint32_t>(next() % 6);
    const uint32_t native = static_cast<uint32_t>(next() % 8) + (python == 0);
    std::vector<uintptr_t> s;
    const uint64_t py_variant = next() % 40;
    const uint64_t native_variant = next() % 60;
    for (uint32_t k = 0; k < python; ++k) s.push_back(kPy | ((k < 2 ? py_variant * 8 + k : k) << 4));
    for (uint32_t k = 0; k < native; ++k) s.push_back(0x1000 + 0x10 * (k < 2 ? native_variant * 8 + k : k));
    stacks.emplace_back(s, python);
  }
  std::vector<uint32_t> cached, uncached;
  for (const auto& [s, python] : stacks) {
    cached.push_back(table.intern(s.data(), static_cast<uint32_t>(s.size()), python, &cache));
  }
  for (const auto& [s, python] : stacks) {
    uncached.push_back(table.intern(s.data(), static_cast<uint32_t>(s.size()), python));
  }
  CHECK(cached == uncached);
  for (size_t i = 0; i < stacks.size(); ++i) REQUIRE(frames_of(table, cached[i]) == stacks[i].first);
  // A cleared cache (a fork child's, for a thread that did not come along) starts over.
  cache.clear();
  CHECK(cache.python.depth == 0);
  CHECK(cache.native.depth == 0);
  for (size_t i = 0; i < 100; ++i) {
    const auto& [s, python] = stacks[i];
    REQUIRE(table.intern(s.data(), static_cast<uint32_t>(s.size()), python, &cache) == cached[i]);
  }
}

TEST_CASE("a read cache gives every stack's frames as a whole read does", "[stacks]") {
  // Stacks read in an order of their own (as the writer reads them: at
  // their first use), Python paths, native paths and pairs, sharing outer
  // frames with the stack read before, with none, or being a prefix of it;
  // among them a path interned whole after one of its outer paths (its ids
  // then rise along it) and paths that reach the deepest a stack can be.
  static StackTable table;
  REQUIRE(table.init());
  static StackTable::ReadCache cache{};
  std::vector<uint32_t> ids;
  std::vector<std::vector<uintptr_t>> frames;
  uint64_t x = 777;
  auto next = [&x] { return (x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  for (int i = 0; i < 4000; ++i) {
    const uint32_t python = static_cast<uint32_t>(next() % 7);
    uint32_t native = static_cast<uint32_t>(next() % 12) + (python == 0);
    if (i % 500 == 0) native = StackTable::kMaxNativeDepth;
    std::vector<uintptr_t> s;
    const uint64_t py_variant = next() % 30;
    const uint64_t native_variant = next() % 50;
    const uint32_t py_cut = static_cast<uint32_t>(next() % 3);
    const uint32_t native_cut = static_cast<uint32_t>(next() % 4);
    for (uint32_t k = 0; k < python; ++k) s.push_back(kPy | ((k < py_cut ? py_variant * 8 + k : k) << 4));
    for (uint32_t k = 0; k < native; ++k) s.push_back(0x1000 + 0x10 * (k < native_cut ? native_variant * 8 + k : k));
    const uint32_t id = table.intern(s.data(), static_cast<uint32_t>(s.size()), python);
    REQUIRE(id != 0);
    ids.push_back(id);
    frames.push_back(s);
  }
  std::vector<size_t> order(ids.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (size_t i = order.size(); i-- > 1;) std::swap(order[i], order[next() % (i + 1)]);
  // In the order interned, then shuffled, then the same stack twice in a row.
  for (int pass = 0; pass < 3; ++pass) {
    for (size_t k = 0; k < ids.size(); ++k) {
      const size_t i = pass == 1 ? order[k] : k;
      for (int twice = 0; twice < (pass == 2 ? 2 : 1); ++twice) {
        uintptr_t out[StackTable::kMaxDepth];
        const uint32_t depth = table.get(ids[i], out, &cache);
        INFO("pass " << pass << " stack " << i);
        REQUIRE(std::vector<uintptr_t>(out, out + depth) == frames[i]);
      }
    }
  }
  uintptr_t out[StackTable::kMaxDepth];
  CHECK(table.get(0, out, &cache) == 0);
  CHECK(table.get(12345678, out, &cache) == 0);
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
  const uint32_t depth_before = cache.native.depth;
  CHECK(table.intern(stacks[5].data(), static_cast<uint32_t>(stacks[5].size()), 0, &cache) == cached[5]);
  CHECK(cache.native.depth == depth_before);
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
        // Stacks s and s + 1000 differ in their Python frame only.
        uintptr_t frames[5] = {kPy | static_cast<uintptr_t>(s / 1000), 0x400000u + static_cast<uintptr_t>(s % 1000),
                               0x500000, 0x600000, static_cast<uintptr_t>(0x700000 + s % 13)};
        ids[t][s] = table.intern(frames, 5, 1, t % 2 ? &cache : nullptr);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint32_t> distinct;
  for (int s = 0; s < kStacks; ++s) {
    for (int t = 1; t < kThreads; ++t) REQUIRE(ids[t][s] == ids[0][s]);
    REQUIRE(ids[0][s] != 0);
    distinct.insert(ids[0][s]);
    const std::vector<uintptr_t> expected = {kPy | static_cast<uintptr_t>(s / 1000),
                                             0x400000u + static_cast<uintptr_t>(s % 1000), 0x500000, 0x600000,
                                             static_cast<uintptr_t>(0x700000 + s % 13)};
    REQUIRE(frames_of(table, ids[0][s]) == expected);
  }
  CHECK(distinct.size() == kStacks);
}

TEST_CASE("a parent with thousands of children: every thread finds each one, by its list and by its index",
          "[stacks]") {
  // One outer frame, then one of 6000 inner ones: 6000 children of one
  // node. Each round adds children after the parent's index was made (so
  // it is made again) and looks the earlier ones up again (through it).
  static StackTable table;
  REQUIRE(table.init());
  constexpr int kThreads = 4;
  constexpr int kChildren = 6000;
  std::vector<std::vector<uint32_t>> ids(kThreads, std::vector<uint32_t>(kChildren));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &ids] {
      for (int upto : {2000, 4000, kChildren}) {
        for (int i = 0; i < upto; ++i) {
          const int c = (i * 7 + t * 1013) % upto;
          const uintptr_t frames[2] = {0x1000 + 0x10 * static_cast<uintptr_t>(c), 0x900000};
          const uint32_t id = table.intern(frames, 2);
          REQUIRE((ids[t][c] == 0 || ids[t][c] == id));
          ids[t][c] = id;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint32_t> distinct;
  for (int c = 0; c < kChildren; ++c) {
    for (int t = 1; t < kThreads; ++t) REQUIRE(ids[t][c] == ids[0][c]);
    REQUIRE(ids[0][c] != 0);
    distinct.insert(ids[0][c]);
    REQUIRE(frames_of(table, ids[0][c]) == std::vector<uintptr_t>{0x1000 + 0x10 * static_cast<uintptr_t>(c), 0x900000});
  }
  CHECK(distinct.size() == kChildren);
}

TEST_CASE("children added after a parent's index was made go into it, so it is made again only as it fills",
          "[stacks]") {
  // 50,000 children of one node, one thread. Each new child goes into the
  // index too, and the index is made again (twice as large) once it is
  // three quarters full: the indexes, those left behind included, take a
  // few words a child. Made again whenever an eighth more children had
  // come, they took about 14 a child.
  static StackTable table;
  REQUIRE(table.init());
  constexpr uint32_t kChildren = 50000;
  std::vector<uint32_t> ids(kChildren);
  for (uint32_t c = 0; c < kChildren; ++c) {
    const uintptr_t frames[2] = {0x1000 + 0x10 * uintptr_t{c}, 0x900000};
    ids[c] = table.intern(frames, 2);
    REQUIRE(ids[c] != 0);
  }
  CHECK(table.index_words() < 6 * kChildren);
  for (uint32_t c = 0; c < kChildren; c += 7) {
    const uintptr_t frames[2] = {0x1000 + 0x10 * uintptr_t{c}, 0x900000};
    REQUIRE(table.intern(frames, 2) == ids[c]);
  }
}

TEST_CASE("a stack made lately comes back whole with its id, told apart by where its Python frames end", "[stacks]") {
  static StackTable table;
  REQUIRE(table.init());
  static StackTable::PathCache cache;
  // The same words as three stacks: native alone, one Python frame, two
  // (intern() takes the split from its caller: the words do not say it),
  // made one after the other, for enough lists of words that some of the
  // three share a slot of the recent stacks.
  for (uintptr_t list = 0; list < 400; ++list) {
    const std::vector<uintptr_t> words = {0x4010 + 0x10 * list, 0x4020, 0x4030, 0x4040};
    const uint32_t n = static_cast<uint32_t>(words.size());
    uint32_t ids[3];
    for (uint32_t python = 0; python < 3; ++python) {
      ids[python] = table.intern(words.data(), n, python, &cache);
      REQUIRE(ids[python] == table.intern(words.data(), n, python));
      REQUIRE(table.intern(words.data(), n, python, &cache) == ids[python]);
    }
    REQUIRE(std::set<uint32_t>{ids[0], ids[1], ids[2]}.size() == 3);
  }
  // Stacks that differ in one word only, at each place, and more of them
  // than the recent stacks hold, in turn: each keeps its own id.
  std::vector<std::vector<uintptr_t>> stacks;
  for (uintptr_t at = 0; at < StackTable::kRecentDepth; ++at) {
    for (uintptr_t v = 0; v < 5; ++v) {
      std::vector<uintptr_t> s(StackTable::kRecentDepth, 0x5000);
      for (size_t k = 0; k < s.size(); ++k) s[k] += 0x10 * k;
      s[at] = 0x9000 + 0x10 * v;
      stacks.push_back(s);
    }
  }
  std::vector<uint32_t> first;
  for (const auto& s : stacks) first.push_back(table.intern(s.data(), static_cast<uint32_t>(s.size()), 0, &cache));
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < stacks.size(); ++i) {
      REQUIRE(table.intern(stacks[i].data(), static_cast<uint32_t>(stacks[i].size()), 0, &cache) == first[i]);
      REQUIRE(table.intern(stacks[i].data(), static_cast<uint32_t>(stacks[i].size())) == first[i]);
    }
  }
  for (size_t i = 0; i < stacks.size(); ++i) REQUIRE(frames_of(table, first[i]) == stacks[i]);
}

TEST_CASE("shared_outer_frames counts the frames two stacks share from their outermost on", "[stacks]") {
  using memledger::interposer::shared_outer_frames;
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  for (int round = 0; round < 2000; ++round) {
    const uint32_t n = static_cast<uint32_t>(next() % 40);
    const uint32_t m = static_cast<uint32_t>(next() % 40);
    std::vector<uintptr_t> a(n + 1), b(m + 1);
    for (auto& w : a) w = next() % 4;  // few values: long runs match by chance too
    for (auto& w : b) w = next() % 4;
    // Both innermost first: the outermost frame is the last.
    const uint32_t limit = n < m ? n : m;
    uint32_t want = 0;
    while (want < limit && a[n - 1 - want] == b[m - 1 - want]) ++want;
    const uint32_t got = limit == 0 ? 0 : shared_outer_frames(a.data() + n - 1, b.data() + m - 1, limit);
    INFO("n " << n << " m " << m);
    REQUIRE(got == want);
  }
}
