// The roles in the text and JSON reports (roles.h computes them): live
// bytes by role at each step end, and what grows.
#pragma once

#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "analysis.h"

namespace memledger::report {

// "live by role at step ends" table (the roles that ever hold bytes), and a
// line naming the roles that grow after the warm-up.
void text_roles(const ProcessReport& p, std::ostringstream& out);

// A suspect's role and its explanation, indented under its site line.
void text_suspect_role(const LeakSuspect& s, std::ostringstream& out);

// A live set by role in words, largest first: "activation 12.0 MiB (61%),
// parameter 4.0 MiB (20%)"; empty when no role holds bytes or only `other`
// does (a program no rule knows).
std::string roles_in_words(const std::vector<int64_t>& by_role);

// {"parameter": bytes, ...} for a live set by role (every role; null when empty).
nlohmann::json roles_object(const std::vector<int64_t>& by_role);

// {"parameter": bytes, ...} for one step row (every role).
nlohmann::json step_roles_json(const ProcessReport& p, size_t step);

// The process's `roles` object: names, at_end, growth_per_step, estimated,
// sites, user_rules, growing (the roles that grow, fastest first).
nlohmann::json roles_json(const ProcessReport& p);

// The roles that grow, fastest first: (name, bytes per step).
std::vector<std::pair<std::string, double>> growing_roles(const ProcessReport& p);

}  // namespace memledger::report
