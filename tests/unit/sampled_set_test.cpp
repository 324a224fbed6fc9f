#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "sampled_set.h"

using memledger::interposer::AddressSet;
namespace slot_word = memledger::interposer::slot_word;

namespace {

// Addresses whose home slot in a table of `capacity` is `home`, the k-th of them.
uintptr_t at_home(size_t home, size_t k, size_t capacity) { return (home + k * capacity) << 4; }

void check_same(const AddressSet& set, const std::set<uintptr_t>& want, const std::vector<uintptr_t>& universe) {
  REQUIRE(set.size() == want.size());
  for (uintptr_t a : universe) REQUIRE(set.contains(a) == (want.count(a) == 1));
}

}  // namespace

TEST_CASE("sampled set: runs that wrap past the table's end close up when an entry leaves", "[sampled]") {
  AddressSet set;
  const size_t cap = AddressSet::kMinCapacity;
  // Five addresses at home cap-2 and three at home 1: one run from cap-2 that wraps to slot 5.
  std::vector<uintptr_t> universe;
  for (size_t k = 0; k < 5; ++k) universe.push_back(at_home(cap - 2, k + 1, cap));
  for (size_t k = 0; k < 3; ++k) universe.push_back(at_home(1, k + 1, cap));
  std::set<uintptr_t> want;
  for (uintptr_t a : universe) {
    REQUIRE(set.insert(a));
    want.insert(a);
  }
  REQUIRE(set.capacity() == cap);
  check_same(set, want, universe);
  // Erase from the middle of the wrapped run, then its head, then one at home 1.
  for (size_t i : {2u, 0u, 5u, 4u}) {
    REQUIRE(set.erase(universe[i]));
    want.erase(universe[i]);
    REQUIRE_FALSE(set.erase(universe[i]));
    check_same(set, want, universe);
  }
}

TEST_CASE("sampled set: agrees with std::set through growth and shrinking", "[sampled]") {
  std::mt19937_64 rng(7);
  AddressSet set;
  std::set<uintptr_t> want;
  std::vector<uintptr_t> universe;
  // Clustered addresses (blocks of one heap), so that runs form.
  for (size_t i = 0; i < 3000; ++i) universe.push_back(0x7f0000000000ull + (rng() % 20000) * 16);
  size_t peak = 0;
  for (int round = 0; round < 40000; ++round) {
    const uintptr_t a = universe[rng() % universe.size()];
    // Grow to about a thousand live entries, then drain.
    const bool add = round < 20000 ? rng() % 3 != 0 : rng() % 3 == 0;
    if (add) {
      REQUIRE(set.insert(a));
      want.insert(a);
    } else {
      REQUIRE(set.erase(a) == (want.erase(a) == 1));
    }
    REQUIRE(set.size() == want.size());
    peak = std::max(peak, set.capacity());
  }
  check_same(set, want, universe);
  CHECK(peak >= 2048);
  // Sized by the live entries: it shrank with them.
  CHECK(set.capacity() <= std::max<size_t>(AddressSet::kMinCapacity, want.size() * 8));
}

TEST_CASE("sampled set: a slot's word rules out a block only where it cannot be sampled", "[sampled]") {
  const uintptr_t a = 0x7f0000001010, b = 0x7f0000001200, c = 0x7f00000013f0;
  uint64_t w = 0;
  CHECK(slot_word::rules_out(w, a));  // nothing sampled in the slot
  w = slot_word::after_insert(w, a);
  CHECK_FALSE(slot_word::rules_out(w, a));
  CHECK(slot_word::rules_out(w, b));  // one sampled block, and it is a
  w = slot_word::after_insert(w, b);
  CHECK_FALSE(slot_word::rules_out(w, a));
  CHECK_FALSE(slot_word::rules_out(w, b));
  CHECK_FALSE(slot_word::rules_out(w, c));  // two: the set must say
  w = slot_word::after_erase(w);            // one of the two left, which is not known
  CHECK(slot_word::count(w) == 1);
  CHECK_FALSE(slot_word::rules_out(w, a));
  CHECK_FALSE(slot_word::rules_out(w, b));
  CHECK_FALSE(slot_word::rules_out(w, c));
  w = slot_word::after_erase(w);
  CHECK(w == 0);
  CHECK(slot_word::rules_out(w, c));
  // A count that reached its top stays there.
  uint64_t full = slot_word::kSaturated << slot_word::kCountShift | slot_word::kMany;
  CHECK(slot_word::after_insert(full, a) == full);
  CHECK(slot_word::after_erase(full) == full);
  CHECK_FALSE(slot_word::rules_out(full, a));
}
