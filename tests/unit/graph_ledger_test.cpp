#include <catch2/catch.hpp>

#include <vector>

#include "graph_ledger.h"

using memledger::format::Kind;
using memledger::interposer::GraphLedger;

namespace {

struct Seen {
  std::vector<GraphLedger::Node> nodes;
  bool auto_free = false;
};

void collect(void* context, const GraphLedger::Node& n, bool auto_free) {
  auto* seen = static_cast<Seen*>(context);
  seen->nodes.push_back(n);
  seen->auto_free = auto_free;
}

Seen launch(GraphLedger& ledger, uint64_t exec) {
  Seen seen;
  ledger.launch(exec, collect, &seen);
  return seen;
}

}  // namespace

TEST_CASE("a launch replays its graph's captured nodes in capture order", "[graphs]") {
  static GraphLedger ledger;
  REQUIRE(ledger.captured_alloc(0x100, Kind::kDevice, 1, 0xa000, 3 << 20, 7));
  REQUIRE(ledger.captured_alloc(0x200, Kind::kDevice, 0, 0xf000, 64, 9));  // another graph
  REQUIRE(ledger.captured_alloc(0x100, Kind::kManaged, 1, 0xb000, 1 << 20, 8));
  REQUIRE(ledger.captured_free(0x100, 0xa000));
  CHECK(launch(ledger, 0x1).nodes.empty());  // no executable yet
  ledger.instantiated(0x1, 0x100, true);
  const Seen seen = launch(ledger, 0x1);
  REQUIRE(seen.nodes.size() == 3);
  CHECK(seen.auto_free);
  CHECK((seen.nodes[0].is_alloc && seen.nodes[0].addr == 0xa000 && seen.nodes[0].stack == 7 &&
         seen.nodes[0].device == 1 && seen.nodes[0].freed_in_graph));
  CHECK((seen.nodes[1].is_alloc && seen.nodes[1].addr == 0xb000 && !seen.nodes[1].freed_in_graph &&
         seen.nodes[1].kind == static_cast<uint8_t>(Kind::kManaged)));
  CHECK((!seen.nodes[2].is_alloc && seen.nodes[2].addr == 0xa000));

  // The graph destroyed first: its nodes stay for the executable's launches,
  // then go with it; the other graph's nodes are kept.
  ledger.graph_destroyed(0x100);
  CHECK(launch(ledger, 0x1).nodes.size() == 3);
  ledger.exec_destroyed(0x1);
  ledger.instantiated(0x2, 0x100, false);
  CHECK(launch(ledger, 0x2).nodes.empty());
  ledger.instantiated(0x3, 0x200, false);
  const Seen other = launch(ledger, 0x3);
  REQUIRE(other.nodes.size() == 1);
  CHECK(other.nodes[0].addr == 0xf000);
  CHECK_FALSE(other.auto_free);
  // A free of another graph's allocation takes that allocation's kind.
  REQUIRE(ledger.captured_free(0x300, 0xf000));
  ledger.instantiated(0x4, 0x300, false);
  const Seen freeing = launch(ledger, 0x4);
  REQUIRE(freeing.nodes.size() == 1);
  CHECK(freeing.nodes[0].kind == static_cast<uint8_t>(Kind::kDevice));
  CHECK_FALSE(freeing.nodes[0].is_alloc);
}
