#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "retention.h"
#include "trace_format.h"

using namespace memledger::report;
namespace fmt = memledger::format;

namespace {

constexpr uint8_t kHost = static_cast<uint8_t>(fmt::Kind::kHost);
constexpr uint8_t kDevice = static_cast<uint8_t>(fmt::Kind::kDevice);

// A replay with one site per (stack, kind) given, and a suspect for each.
struct Fixture {
  ReplayOutput replay;
  std::vector<InheritedBlock> live;
  std::vector<LeakSuspect> suspects;
  RetentionFile file;

  uint32_t site(uint32_t stack, uint8_t kind) {
    SiteAcc acc;
    acc.stack = stack;
    acc.kind = kind;
    replay.sites.push_back(acc);
    LeakSuspect s;
    s.site.stack = stack;
    s.site.kind = kind;
    suspects.push_back(s);
    return static_cast<uint32_t>(replay.sites.size() - 1);
  }
  void block(uint8_t kind, uint64_t address, uint64_t bytes, uint32_t site) {
    live.push_back(InheritedBlock{live_key(kind, 0, address), bytes, kind, site});
  }
  // Owners in one container share its path, as the Python module writes them.
  void owner(uint64_t address, uint64_t bytes, bool device, const std::string& root) {
    size_t path = 0;
    while (path < file.paths.size() && file.paths[path][0] != root) ++path;
    if (path == file.paths.size()) file.paths.push_back({root, "Tensor"});
    file.owners.push_back(RetentionOwner{address, bytes, device, path});
  }
};

}  // namespace

TEST_CASE("retention: owners meet the live blocks by address", "[retention]") {
  Fixture f;
  const uint32_t host = f.site(7, kHost);
  const uint32_t segment = f.site(9, kDevice);
  f.file.when = "exit";
  f.block(kHost, 0x1000, 4096, host);
  // A 2 MiB device block from the driver that a caching allocator carves.
  f.block(kDevice, 0x7f0000000000, 2 << 20, segment);

  SECTION("a host owner at its block's address") {
    f.owner(0x1000, 4096, false, "list `history`");
    f.owner(0x1010, 16, false, "list `inside`");  // inside a host block: not its owner
    attach_retention(f.file, f.live, f.replay, f.suspects);
    REQUIRE(f.suspects[0].kept_by.size() == 1);
    CHECK(f.suspects[0].kept_by[0].hops[0] == "list `history`");
    CHECK(f.suspects[1].kept_by.empty());
  }
  SECTION("device tensors inside the block their allocator carved them from") {
    f.owner(0x7f0000000000 + (512 << 10), 256 << 10, true, "dict `cache`");
    f.owner(0x7f0000000000 + (1 << 20), 256 << 10, true, "dict `cache`");
    f.owner(0x7f0000000000 + (2 << 20), 256 << 10, true, "list `past_the_end`");
    f.owner(0x6f0000000000, 256 << 10, true, "list `below`");
    attach_retention(f.file, f.live, f.replay, f.suspects);
    CHECK(f.suspects[0].kept_by.empty());
    REQUIRE(f.suspects[1].kept_by.size() == 1);
    CHECK(f.suspects[1].kept_by[0].hops[0] == "dict `cache`");
    CHECK(f.suspects[1].kept_by[0].objects == 2);
    CHECK(f.suspects[1].kept_by[0].bytes == (512 << 10));
  }
  SECTION("a device owner never matches a host block, nor a host owner a device one") {
    f.owner(0x1000, 4096, true, "list `a`");
    f.owner(0x7f0000000000, 2 << 20, false, "list `b`");
    attach_retention(f.file, f.live, f.replay, f.suspects);
    CHECK(f.suspects[0].kept_by.empty());
    CHECK(f.suspects[1].kept_by.empty());
  }
}
