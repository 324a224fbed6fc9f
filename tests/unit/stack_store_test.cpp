#include <catch2/catch.hpp>

#include <vector>

#include "../../interposer/trace_format.h"
#include "../../report/stack_store.h"

namespace fmt = memledger::format;
using memledger::report::kMaxStackFrames;
using memledger::report::StackStore;

namespace {

// Stack `id` of `store` as the decoder makes it: the outer `python_shared`
// and `native_shared` frames of each part are the nodes of `last`'s paths.
struct Paths {
  std::vector<uint32_t> python, native;  // outermost first
};

Paths add(StackStore& store, uint32_t id, const std::vector<uint64_t>& words, size_t python, const Paths& last,
          size_t python_shared, size_t native_shared) {
  Paths made;
  auto path = [&](std::vector<uint32_t>& out, const std::vector<uint32_t>& from, size_t keep, size_t begin,
                  size_t end) {
    out.assign(from.begin(), from.begin() + static_cast<ptrdiff_t>(keep));
    uint32_t leaf = out.empty() ? 0 : out.back();
    for (size_t i = end - keep; i > begin; --i) out.push_back(leaf = store.node(leaf, words[i - 1]));
    return leaf;
  };
  const uint32_t p = path(made.python, last.python, python_shared, 0, python);
  const uint32_t n = path(made.native, last.native, native_shared, python, words.size());
  store.set(id, p, n);
  return made;
}

}  // namespace

TEST_CASE("stack store: a stack is its Python path, then its native path, innermost first", "[stack_store]") {
  StackStore store;
  const uint64_t a = fmt::python_frame_word(1, 10), b = fmt::python_frame_word(2, 20);
  const std::vector<uint64_t> first = {a, b, 0x1000, 0x2000};
  store.put(3, first);
  CHECK(store.at(3) == first);
  CHECK(store.nodes() == 4);
  CHECK(store.count(3) == 1);
  CHECK(store.count(4) == 0);
  std::vector<uint64_t> out = {99};
  CHECK_FALSE(store.get(4, out));
  CHECK(out.empty());
  CHECK_THROWS_AS(store.at(4), std::out_of_range);
  // A visit stops when asked to.
  std::vector<uint64_t> seen;
  store.visit(3, [&](uint64_t w) {
    seen.push_back(w);
    return seen.size() < 3;
  });
  CHECK(seen == std::vector<uint64_t>{a, b, 0x1000});
  // A stack of native frames alone, and one of Python frames alone.
  store.put(5, std::vector<uint64_t>{0x3000});
  store.put(6, std::vector<uint64_t>{b});
  CHECK(store.at(5) == std::vector<uint64_t>{0x3000});
  CHECK(store.at(6) == std::vector<uint64_t>{b});
  CHECK(store.ids() == std::vector<uint32_t>{3, 5, 6});
}

TEST_CASE("stack store: stacks share the nodes of their outer frames", "[stack_store]") {
  StackStore store;
  const uint64_t a = fmt::python_frame_word(1, 10), b = fmt::python_frame_word(2, 20), c = fmt::python_frame_word(3, 30);
  const std::vector<uint64_t> first = {a, b, 0x1000, 0x2000, 0x3000};
  const std::vector<uint64_t> second = {c, b, 0x1500, 0x2000, 0x3000};
  const Paths one = add(store, 1, first, 2, {}, 0, 0);
  add(store, 2, second, 2, one, 1, 2);
  CHECK(store.at(1) == first);
  CHECK(store.at(2) == second);
  CHECK(store.nodes() == 5 + 2);  // the second stack's own frames: c and 0x1500
}

TEST_CASE("stack store: a deep stack gives its innermost frames only", "[stack_store]") {
  StackStore store;
  std::vector<uint64_t> deep;
  for (uint64_t i = 0; i < kMaxStackFrames + 44; ++i) deep.push_back(0x400000 + 16 * i);
  store.put(1, deep);
  const std::vector<uint64_t> got = store.at(1);
  REQUIRE(got.size() == kMaxStackFrames);
  CHECK(std::equal(got.begin(), got.end(), deep.begin()));
}

TEST_CASE("stack store: another store's stacks are taken once, with their nodes", "[stack_store]") {
  StackStore into, chunk;
  const std::vector<uint64_t> kept = {0x1000, 0x2000};
  into.put(1, kept);
  const std::vector<uint64_t> first = {0x1100, 0x2000, 0x3000};
  const std::vector<uint64_t> second = {0x1200, 0x2000, 0x3000};
  const Paths made = add(chunk, 2, first, 0, {}, 0, 0);
  add(chunk, 3, second, 0, made, 0, 2);
  chunk.put(1, std::vector<uint64_t>{0x9999});  // an id `into` has: it keeps its own
  into.absorb(chunk);
  CHECK(chunk.empty());
  CHECK(chunk.nodes() == 0);
  CHECK(into.at(1) == kept);
  CHECK(into.at(2) == first);
  CHECK(into.at(3) == second);
  const size_t nodes = into.nodes();
  CHECK(nodes == 2 + 4 + 1);
  // The same stacks again (a trace read a second time): nothing is added.
  const Paths again = add(chunk, 2, first, 0, {}, 0, 0);
  add(chunk, 3, second, 0, again, 0, 2);
  into.absorb(chunk);
  CHECK(into.nodes() == nodes);
  CHECK(into.at(3) == second);
}
