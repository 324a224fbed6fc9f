#include "window.h"

#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <memory>

#include "replay.h"
#include "run_report.h"

namespace memledger::report {
namespace {

namespace fmt = memledger::format;

// One slot per kind, and the last for all kinds together.
constexpr int kTotal = fmt::kKindCount;
constexpr int kSlots = fmt::kKindCount + 1;

struct Block {
  uint32_t stack;
  uint8_t kind;
  bool in_window;
  int64_t bytes;
};

// The address spaces of the replay (replay.h, live_key).
uint64_t block_key(uint8_t kind, uint8_t flags, uint64_t addr) { return live_key(kind, flags, addr); }

uint64_t site_key(uint32_t stack, uint8_t kind) { return (static_cast<uint64_t>(stack) << 8) | kind; }

struct SiteAcc {
  int64_t growth = 0;
  uint64_t allocations = 0;
};

using SiteBytes = absl::flat_hash_map<uint64_t, int64_t>;

struct Pass {
  WindowKind slots[kSlots];
  uint64_t peak_seq[kSlots] = {};
  absl::flat_hash_map<uint64_t, SiteAcc> sites;
};

// Replays the events before `to` (0: all). Inside the window, counts
// growth, peaks and sites into `pass`; with `stop_at`, stops after that
// sequence number and returns the window's blocks then live, by site.
SiteBytes replay(const Trace& trace, uint64_t from, uint64_t to, uint64_t stop_at, Pass* pass) {
  absl::flat_hash_map<uint64_t, Block> live;
  int64_t running[kSlots] = {};
  auto count = [&](uint8_t kind, int64_t bytes, uint64_t seq) {
    for (int slot : {static_cast<int>(kind), kTotal}) {
      running[slot] += bytes;
      if (pass != nullptr && running[slot] > pass->slots[slot].peak) {
        pass->slots[slot].peak = running[slot];
        pass->peak_seq[slot] = seq;
      }
    }
  };
  for (const TraceEvent& e : trace.events) {
    if ((to != 0 && e.seq >= to) || (stop_at != 0 && e.seq > stop_at)) break;
    const bool inside = e.seq >= from;
    if (e.type == EvType::kAlloc) {
      if ((e.flags & fmt::kAllocFailed) || e.kind >= fmt::kKindCount) continue;
      const int64_t bytes = static_cast<int64_t>(e.size);
      live[block_key(e.kind, e.flags, e.addr)] = Block{e.stack, e.kind, inside, bytes};
      if (!inside) continue;
      count(e.kind, bytes, e.seq);
      if (pass != nullptr) {
        ++pass->slots[e.kind].allocations;
        ++pass->slots[kTotal].allocations;
        SiteAcc& s = pass->sites[site_key(e.stack, e.kind)];
        s.growth += bytes;
        ++s.allocations;
      }
    } else if (e.type == EvType::kFree) {
      auto it = live.find(block_key(e.kind, e.flags, e.addr));
      if (it == live.end()) continue;
      const Block b = it->second;
      live.erase(it);
      if (!inside) continue;
      count(b.kind, -b.bytes, e.seq);
      if (pass != nullptr) {
        ++pass->slots[b.kind].frees;
        ++pass->slots[kTotal].frees;
        pass->sites[site_key(b.stack, b.kind)].growth -= b.bytes;
      }
    }
  }
  if (pass != nullptr) {
    for (int slot = 0; slot < kSlots; ++slot) pass->slots[slot].growth = running[slot];
  }
  SiteBytes at_stop;
  if (stop_at != 0) {
    for (const auto& [key, b] : live) {
      if (b.in_window) at_stop[site_key(b.stack, b.kind)] += b.bytes;
    }
  }
  return at_stop;
}

// The slot's sites that grew or were live at its peak, largest first.
std::vector<WindowSite> rank_sites(const Pass& pass, int slot, const SiteBytes& at_peak, size_t top) {
  std::vector<WindowSite> out;
  for (const auto& [key, acc] : pass.sites) {
    const uint8_t kind = static_cast<uint8_t>(key & 0xff);
    if (slot != kTotal && kind != slot) continue;
    auto it = at_peak.find(key);
    const int64_t peak_bytes = it == at_peak.end() ? 0 : it->second;
    if (acc.growth <= 0 && peak_bytes <= 0) continue;
    WindowSite site;
    site.site.stack = static_cast<uint32_t>(key >> 8);
    site.site.kind = kind;
    site.growth = acc.growth;
    site.allocations = acc.allocations;
    site.at_peak = peak_bytes;
    out.push_back(std::move(site));
  }
  std::sort(out.begin(), out.end(), [](const WindowSite& a, const WindowSite& b) {
    if (a.growth != b.growth) return a.growth > b.growth;
    if (a.at_peak != b.at_peak) return a.at_peak > b.at_peak;
    return a.site.stack != b.site.stack ? a.site.stack < b.site.stack : a.site.kind < b.site.kind;
  });
  if (out.size() > top) out.resize(top);
  return out;
}

}  // namespace

WindowReport analyze_window(const Trace& trace, uint64_t from_seq, uint64_t to_seq, size_t top,
                            const SymbolizerOptions& symbolizer_options) {
  WindowReport w;
  w.from_seq = from_seq;
  w.to_seq = to_seq;
  w.host_sampled = trace.header_value("host_mode") == "sampled";
  Pass pass;
  replay(trace, from_seq, to_seq, 0, &pass);

  std::unique_ptr<Symbolizer> symbolizer;
  std::vector<uint64_t> words;
  for (int slot = 0; slot < kSlots; ++slot) {
    WindowKind& out = slot == kTotal ? w.total : w.kinds[slot];
    out = pass.slots[slot];
    // What each site held at the slot's peak: one more pass up to it.
    const SiteBytes at_peak =
        pass.peak_seq[slot] != 0 ? replay(trace, from_seq, to_seq, pass.peak_seq[slot], nullptr) : SiteBytes{};
    out.sites = rank_sites(pass, slot, at_peak, top);
    for (WindowSite& site : out.sites) {
      if (!trace.stacks.get(site.site.stack, words)) continue;
      if (!symbolizer) {
        symbolizer = std::make_unique<Symbolizer>(trace.modules, symbolizer_options);
        symbolizer->set_python(&trace.python_codes, trace.python_module);
      }
      for (size_t i = 0; i < words.size(); ++i) {
        const auto& chain = symbolizer->resolve(words[i], i > 0);
        site.site.frames.insert(site.site.frames.end(), chain.begin(), chain.end());
      }
    }
  }
  return w;
}

namespace {

nlohmann::json kind_json(const WindowKind& wk) {
  nlohmann::json sites = nlohmann::json::array();
  for (const WindowSite& s : wk.sites) {
    nlohmann::json stack = nlohmann::json::array();
    for (const Frame& f : s.site.frames) stack.push_back(frame_text(f));
    sites.push_back({{"site", site_name(s.site)},
                     {"kind", fmt::kind_name(static_cast<fmt::Kind>(s.site.kind))},
                     {"growth", s.growth},
                     {"allocations", s.allocations},
                     {"at_peak", s.at_peak},
                     {"stack", stack}});
  }
  return {{"growth", wk.growth},
          {"peak", wk.peak},
          {"allocations", wk.allocations},
          {"frees", wk.frees},
          {"sites", sites}};
}

}  // namespace

nlohmann::json render_window_json(const WindowReport& w) {
  nlohmann::json kinds = nlohmann::json::object();
  for (int k = 0; k < fmt::kKindCount; ++k) kinds[fmt::kind_name(static_cast<fmt::Kind>(k))] = kind_json(w.kinds[k]);
  kinds["total"] = kind_json(w.total);
  return {{"schema", "memledger-window"},
          {"version", 1},
          {"from_seq", w.from_seq},
          {"to_seq", w.to_seq},
          {"host_estimated", w.host_sampled},
          {"kinds", kinds}};
}

}  // namespace memledger::report
