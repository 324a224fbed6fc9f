#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "mapped_ledger.h"

using memledger::interposer::MappedLedger;

namespace {

// What the ledger asked to record, as text: "-B" a free, "+B:S@K" an allocation.
struct Log final : MappedLedger::Sink {
  std::vector<std::string> lines;
  void freed(uint64_t begin) override { lines.push_back("-" + std::to_string(begin)); }
  void allocated(uint64_t begin, uint64_t size, uint32_t stack) override {
    lines.push_back("+" + std::to_string(begin) + ":" + std::to_string(size) + "@" + std::to_string(stack));
  }
};

}  // namespace

TEST_CASE("mapped ledger: a partial unmap frees the range and records what remains", "[mapped]") {
  static MappedLedger ledger;
  Log log;
  REQUIRE(ledger.add(1000, 2000, 7, log));
  ledger.remove(1200, 1300, log);
  CHECK(log.lines == std::vector<std::string>{"+1000:1000@7", "-1000", "+1000:200@7", "+1300:700@7"});
  CHECK(ledger.bytes() == 900);
  uint32_t stack = 0;
  CHECK(ledger.find(1350, &stack));
  CHECK(stack == 7);
  CHECK_FALSE(ledger.find(1250, &stack));
  // One unmap over both pieces, a gap and memory never recorded.
  log.lines.clear();
  ledger.remove(500, 5000, log);
  CHECK(log.lines == std::vector<std::string>{"-1000", "-1300"});
  CHECK(ledger.bytes() == 0);
}

TEST_CASE("mapped ledger: a mapping over others replaces the parts it covers", "[mapped]") {
  static MappedLedger ledger;
  Log log;
  REQUIRE(ledger.add(1000, 2000, 1, log));
  REQUIRE(ledger.add(3000, 4000, 2, log));
  log.lines.clear();
  REQUIRE(ledger.add(1500, 3500, 3, log));
  CHECK(log.lines == std::vector<std::string>{"-1000", "+1000:500@1", "-3000", "+3500:500@2", "+1500:2000@3"});
  CHECK(ledger.bytes() == 3000);
  // Ends that only touch are not overlaps.
  log.lines.clear();
  ledger.remove(0, 1000, log);
  ledger.remove(4000, 5000, log);
  CHECK(log.lines.empty());
  CHECK(ledger.bytes() == 3000);
}
