#include "role_report.h"

#include <algorithm>
#include <cinttypes>

#include "roles.h"
#include "run_report.h"
#include "trace_format.h"

namespace memledger::report {

std::vector<std::pair<std::string, double>> growing_roles(const ProcessReport& p) { return p.roles.growing; }

std::string roles_in_words(const std::vector<int64_t>& by_role) {
  std::vector<size_t> order;
  int64_t sum = 0;
  for (size_t r = 0; r < by_role.size() && r < kRoleCount; ++r) {
    if (by_role[r] <= 0) continue;
    order.push_back(r);
    sum += by_role[r];
  }
  if (order.empty() || (order.size() == 1 && static_cast<Role>(order[0]) == Role::kOther)) return {};
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return by_role[a] > by_role[b]; });
  std::string out;
  for (size_t r : order) {
    char share[16];
    std::snprintf(share, sizeof share, "%.0f%%", 100.0 * double(by_role[r]) / double(sum));
    out += (out.empty() ? "" : ", ") + std::string(role_name(static_cast<Role>(r))) + " " +
           human_bytes(double(by_role[r])) + " (" + share + ")";
  }
  return out;
}

nlohmann::json roles_object(const std::vector<int64_t>& by_role) {
  if (by_role.empty()) return nullptr;
  nlohmann::json out = nlohmann::json::object();
  for (size_t r = 0; r < by_role.size() && r < kRoleCount; ++r) out[role_name(static_cast<Role>(r))] = by_role[r];
  return out;
}

void text_roles(const ProcessReport& p, std::ostringstream& out) {
  const RoleLive& roles = p.roles;
  if (roles.per_step.empty() || p.window_seconds > 0) return;
  std::vector<size_t> shown;
  for (size_t r = 0; r < roles.names.size(); ++r) {
    const bool any = std::any_of(roles.per_step.begin(), roles.per_step.end(),
                                 [r](const std::vector<int64_t>& step) { return step[r] != 0; });
    if (any) shown.push_back(r);
  }
  // Every byte `other` (a program no rule knows): the table would say nothing.
  if (shown.empty() || (shown.size() == 1 && roles.names[shown[0]] == "other")) return;
  out << "\nlive by role at step ends" << (roles.estimated ? " (host bytes split by the sampled allocations' shares)" : "")
      << ":\n  step";
  char cell[64];
  for (size_t r : shown) {
    std::snprintf(cell, sizeof cell, "  %15s", roles.names[r].c_str());
    out << cell;
  }
  out << "\n";
  const size_t n = roles.per_step.size();
  for (size_t k = 0; k < n; ++k) {
    if (n > 24 && k >= 10 && k + 10 < n) {
      if (k == 10) out << "  ...\n";
      continue;
    }
    std::snprintf(cell, sizeof cell, "  %4zu", k + 1);
    out << cell;
    for (size_t r : shown) {
      std::snprintf(cell, sizeof cell, "  %15s", human_bytes(double(roles.per_step[k][r])).c_str());
      out << cell;
    }
    out << "\n";
  }
  if (const std::string peak = roles_in_words(roles.at_peak); !peak.empty()) {
    out << "at the peak (" << human_bytes(double(p.peak.bytes)) << ", " << phase_of(p.peak.step, p.peak.ts_ns, p.steps)
        << "): " << peak << (roles.estimated ? " (host bytes split by the sampled allocations' shares)" : "") << "\n";
  }
  const auto growing = growing_roles(p);
  if (growing.empty()) {
    if (p.total_growth.judged) out << "roles growing after the warm-up: none\n";
    return;
  }
  out << "roles growing after the warm-up:";
  for (size_t i = 0; i < growing.size(); ++i) {
    out << (i ? "," : "") << " " << growing[i].first << " " << human_bytes(growing[i].second) << "/step";
  }
  out << "\n";
}

void text_suspect_role(const LeakSuspect& s, std::ostringstream& out) {
  if (s.site.role.empty()) return;
  out << "     role: " << s.site.role << " (" << s.site.role_rule << ")\n";
  if (!s.role_explanation.empty()) out << "     why: " << s.role_explanation << "\n";
}

nlohmann::json step_roles_json(const ProcessReport& p, size_t step) {
  nlohmann::json out = nlohmann::json::object();
  if (step >= p.roles.per_step.size()) return out;
  for (size_t r = 0; r < p.roles.names.size(); ++r) out[p.roles.names[r]] = p.roles.per_step[step][r];
  return out;
}

nlohmann::json roles_json(const ProcessReport& p) {
  const RoleLive& roles = p.roles;
  nlohmann::json at_end = nlohmann::json::object();
  nlohmann::json growth = nlohmann::json::object();
  for (size_t r = 0; r < roles.names.size(); ++r) {
    if (r < roles.at_end.size()) at_end[roles.names[r]] = roles.at_end[r];
    if (r < roles.growth_per_step.size()) growth[roles.names[r]] = roles.growth_per_step[r];
  }
  nlohmann::json growing = nlohmann::json::array();
  for (const auto& [name, rate] : growing_roles(p)) growing.push_back({{"role", name}, {"bytes_per_step", rate}});
  // The largest sites of each role at the last step end, with their stacks.
  nlohmann::json top = nlohmann::json::object();
  for (size_t r = 0; r < roles.top_sites.size() && r < roles.names.size(); ++r) {
    nlohmann::json sites = nlohmann::json::array();
    for (size_t i = 0; i < roles.top_sites[r].size(); ++i) {
      const SiteTotal& t = roles.top_sites[r][i];
      nlohmann::json stack = nlohmann::json::array();
      for (const Frame& f : t.site.frames) {
        stack.push_back({{"function", f.function},
                         {"file", f.file},
                         {"line", f.line},
                         {"module", f.module},
                         {"attributed", f.attributed},
                         {"language", f.python ? "python" : "native"}});
      }
      sites.push_back({{"site", site_name(t.site)},
                       {"kind", format::kind_name(static_cast<format::Kind>(t.site.kind))},
                       {"bytes", t.bytes},
                       {"estimated", t.estimated},
                       {"phase", i < roles.top_phases[r].size() ? roles.top_phases[r][i] : ""},
                       {"role_rule", t.site.role_rule},
                       {"stack", stack}});
    }
    if (!sites.empty()) top[roles.names[r]] = std::move(sites);
  }
  return {{"top_sites", top},
          {"names", roles.names},     {"at_end", at_end},         {"growth_per_step", growth},
          {"growing", growing},       {"estimated", roles.estimated}, {"sites", roles.sites},
          {"at_peak", roles_object(roles.at_peak)},
          {"user_rules", roles.user_rules}};
}

}  // namespace memledger::report
