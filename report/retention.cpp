#include "retention.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include <absl/container/flat_hash_map.h>
#include <nlohmann/json.hpp>

#include "trace_format.h"

namespace memledger::report {
namespace {

namespace fmt = memledger::format;
using nlohmann::json;

std::string text_of(const json& hop, const char* key) {
  auto it = hop.find(key);
  return it != hop.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// "list (60 items)" named `history` is "list `history` (60 items)";
// "Trainer object" named `trainer` is "Trainer object `trainer`".
std::string named(const std::string& what, const std::string& name) {
  if (name.empty() || name == "?") return what;
  const size_t paren = what.find(" (");
  return paren == std::string::npos ? what + " `" + name + "`"
                                    : what.substr(0, paren) + " `" + name + "`" + what.substr(paren);
}

// One hop as a line: a root names where the object lives; an attribute or
// a dict key names what holds it in the object above; a list index says
// nothing worth a line.
std::string hop_text(const json& hop) {
  const std::string what = text_of(hop, "what"), name = text_of(hop, "name"), root = text_of(hop, "root");
  if (!root.empty()) return named(what, name) + ", " + root;
  if (hop.value("attribute", false) && !name.empty()) return "attribute `" + name + "`: " + what;
  if (!name.empty() && name.front() != '[' && name != "?") return "key `" + name + "`: " + what;
  return what;
}

}  // namespace

RetentionFile read_retention(const std::string& dir, int pid) {
  RetentionFile out;
  const std::filesystem::path path = std::filesystem::path(dir) / ("retention." + std::to_string(pid) + ".json");
  std::ifstream in(path);
  if (!in) return out;
  try {
    const json j = json::parse(in);
    out.when = j.value("when", std::string("exit"));
    out.elapsed_seconds = j.value("elapsed_s", 0.0);
    if (j.contains("seq") && j["seq"].is_number_unsigned() && j["seq"].get<uint64_t>() > 0) {
      out.seq = j["seq"].get<uint64_t>();
    }
    for (const json& s : j.value("skipped", json::array())) {
      if (s.is_string()) out.skipped.push_back(s.get<std::string>());
    }
    for (const json& p : j.at("paths")) {
      std::vector<std::string> hops;
      for (const json& hop : p) hops.push_back(hop_text(hop));
      std::reverse(hops.begin(), hops.end());  // outermost first
      out.paths.push_back(std::move(hops));
    }
    const size_t shared_paths = out.paths.size();
    std::map<std::vector<std::string>, size_t> index;
    for (const json& o : j.at("owners")) {
      RetentionOwner owner;
      owner.address = o.at("address").get<uint64_t>();
      owner.bytes = o.at("bytes").get<uint64_t>();
      owner.device = o.value("kind", std::string("host")) == "device";
      const size_t shared = o.at("path").get<size_t>();
      if (shared >= shared_paths) throw std::out_of_range("a path index past the table");
      // The owner's own line goes last, after the path it shares with others.
      // Its own name (an index, a key) only when it is the root itself:
      // owners in one container share their path.
      json self = {{"what", o.value("what", std::string("?"))}};
      if (o.contains("root") && o["root"].is_string()) {
        self["root"] = o["root"];
        if (o.contains("name") && o["name"].is_string()) self["name"] = o["name"];
      }
      std::vector<std::string> hops = out.paths[shared];
      hops.push_back(hop_text(self));
      auto [at, added] = index.try_emplace(hops, out.paths.size());
      owner.path = at->second;
      if (added) out.paths.push_back(std::move(hops));
      out.owners.push_back(owner);
    }
  } catch (const std::exception& e) {
    RetentionFile bad;
    bad.error = path.string() + ": " + e.what();
    return bad;
  }
  return out;
}

void attach_retention(const RetentionFile& file, const std::vector<InheritedBlock>& live, const ReplayOutput& replay,
                      std::vector<LeakSuspect>& suspects, size_t max_paths) {
  if (file.owners.empty() || suspects.empty()) return;
  constexpr uint8_t kDevice = static_cast<uint8_t>(fmt::Kind::kDevice);
  absl::flat_hash_map<uint64_t, const InheritedBlock*> at;
  at.reserve(live.size());
  // Device blocks by address range: a framework's caching allocator hands
  // tensors out of larger blocks it got from the driver (PyTorch's
  // segments), so a device tensor's pointer lies inside its block.
  std::vector<std::pair<uint64_t, const InheritedBlock*>> device;
  for (const InheritedBlock& b : live) {
    at.emplace(b.key, &b);
    if (b.kind == kDevice) device.emplace_back(b.key ^ live_key(kDevice, 0, 0), &b);
  }
  std::sort(device.begin(), device.end());
  auto device_block_holding = [&](uint64_t address) -> const InheritedBlock* {
    auto it = std::upper_bound(device.begin(), device.end(), address,
                               [](uint64_t a, const auto& block) { return a < block.first; });
    if (it == device.begin()) return nullptr;
    --it;
    return address - it->first < it->second->weight ? it->second : nullptr;
  };
  // The site (stack and kind) of each owner's live block.
  std::map<std::pair<uint32_t, uint8_t>, std::map<size_t, KeptBy>> by_site;
  for (const RetentionOwner& o : file.owners) {
    const uint8_t kind = o.device ? kDevice : static_cast<uint8_t>(fmt::Kind::kHost);
    const InheritedBlock* block = nullptr;
    if (auto exact = at.find(live_key(kind, 0, o.address)); exact != at.end() && exact->second->kind == kind) {
      block = exact->second;
    } else if (o.device) {
      block = device_block_holding(o.address);
    }
    if (block == nullptr || block->site >= replay.sites.size()) continue;
    const SiteAcc& site = replay.sites[block->site];
    KeptBy& k = by_site[{site.stack, site.kind}][o.path];
    if (k.hops.empty()) k.hops = file.paths[o.path];
    ++k.objects;
    k.bytes += o.bytes;
  }
  for (LeakSuspect& s : suspects) {
    std::map<size_t, KeptBy> paths;
    auto take = [&](const Site& site) {
      auto it = by_site.find({site.stack, site.kind});
      if (it == by_site.end()) return;
      for (const auto& [index, k] : it->second) {
        KeptBy& into = paths[index];
        if (into.hops.empty()) into.hops = k.hops;
        into.objects += k.objects;
        into.bytes += k.bytes;
      }
    };
    take(s.site);
    for (const LeakSuspect& v : s.variants) take(v.site);
    for (auto& [index, k] : paths) s.kept_by.push_back(std::move(k));
    std::stable_sort(s.kept_by.begin(), s.kept_by.end(),
                     [](const KeptBy& a, const KeptBy& b) { return a.bytes > b.bytes; });
    if (s.kept_by.size() > max_paths) s.kept_by.resize(max_paths);
  }
}

}  // namespace memledger::report
