// Stage "roles": what each allocation is to the training program
// (DESIGN.md, "Role"): a parameter, a gradient, optimizer state, an
// activation, input data, workspace, communication buffers, or other.
//
// In:  each site's stack (Python frames first, then native frames, as the
//      symbolizer names them), its memory kind, when it allocated (before
//      the first step, in the steps, after the last; the step's label phase)
//      and whether its allocations outlive their step; the rules (the
//      built-in table below, after the user's from a policy file).
// Out: a role per site, live bytes by role at each step end (their sum is
//      the live bytes of all kinds), and the role of each suspect and exit
//      leak with, for a growing role whose cause is plain, an explanation.
//
// Roles are computed here, offline, from the stacks the trace holds: the
// traced process pays nothing for them.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "analysis.h"
#include "role_rules.h"

namespace memledger::report {

struct ReplayOutput;

// When a site allocated, for a rule's `phase`.
enum class Phase : uint8_t {
  kStartup,   // every allocation before the first step began (building the model, imports)
  kSteps,     // at least one in a step
  kTeardown,  // every allocation after the last step ended
  kUnknown,   // the process has no steps
};

// What the rules look at, for one site.
struct RoleSubject {
  uint8_t kind = 0;
  Phase phase = Phase::kUnknown;
  std::string label_phase;  // the phase part of the label of the step it allocated in ("eval")
  bool kept = false;
};

// Frames of a stack, given one at a time to `visit` (innermost first);
// visit returns false to stop early. Each frame stays where it is at least
// until the walk returns (RoleTable::classify knows frames by address).
using FrameWalk = std::function<void(const std::function<bool(const Frame&)>& visit)>;

// Which of a table's patterns each frame matches, worked out the first time
// the frame is seen: the stacks of a process share most of their frames (an
// `import torch` makes a million stacks of 60 to 90 frames from 200,000
// distinct frames). Frames are known by their address, so a memo is only for
// frames that stay where they are while it lives (the Symbolizer's), and
// for one table.
class FrameMatches {
 private:
  friend class RoleTable;
  absl::flat_hash_map<const Frame*, uint32_t> at_;  // a frame's first word in bits_
  std::vector<uint64_t> bits_;
};

// The rules in force: the user's first, then the built-in ones.
class RoleTable {
 public:
  explicit RoleTable(const std::vector<RoleRule>& user_rules = {});
  // The role of a subject whose frames `walk` gives, and the index of the
  // rule that decided (rules().size() when none did: other). `memo`: for
  // frames that stay where they are (FrameMatches) beyond this call, or
  // nullptr (one for this call alone).
  Role classify(const RoleSubject& subject, const FrameWalk& walk, size_t* rule = nullptr,
                FrameMatches* memo = nullptr) const;
  Role classify(const RoleSubject& subject, const std::vector<Frame>& frames, size_t* rule = nullptr) const;
  const std::vector<RoleRule>& rules() const { return rules_; }

 private:
  // Bit 2i: the frame matches one of rule i's frame patterns; bit 2i+1: one
  // of the patterns that rule it out (RoleRule::unless_inside).
  const uint64_t* matches(const Frame& f, FrameMatches& memo) const;

  std::vector<RoleRule> rules_;
};

// Live bytes by role at each step end, and what each site is.
struct RoleAccount {
  std::vector<std::array<int64_t, kRoleCount>> live;  // per step end
  std::array<int64_t, kRoleCount> at_end{};           // live at exit
  // Sampled host mode: host bytes by role are the sampled sites' estimates,
  // scaled so that they add up to the exact host live bytes at each step end.
  bool estimated = false;
  // Sampled host mode: the host part of `live` (the scaled estimates), so
  // that what is exact (device, managed, pinned) can be judged apart.
  std::vector<std::array<int64_t, kRoleCount>> host_live;
  size_t sites_classified = 0;
  // The largest sites of each role at the last step end.
  struct TopSite {
    uint64_t key;  // kind << 32 | stack
    int64_t bytes;
    Phase phase;
    uint32_t rule;
  };
  std::array<std::vector<TopSite>, kRoleCount> top;
  // The role of each site classified, by (kind << 32 | stack).
  std::vector<std::pair<uint64_t, std::pair<Role, uint32_t>>> by_site;  // sorted by key; second: role, rule
  std::optional<std::pair<Role, uint32_t>> find(uint8_t kind, uint32_t stack) const;
};

// Classifies every site that is live at a step end or at exit, and sums
// their live bytes by role at each step end. `frames_of(stack)` walks a
// stack's symbolized frames, which stay where they are until the call
// returns (FrameMatches).
RoleAccount account_roles(const ReplayOutput& replay, const std::vector<StepStats>& steps, const RoleTable& table,
                          const std::function<FrameWalk(uint32_t stack)>& frames_of, bool sampled);

// The explanation shown under a growing suspect of `role` whose stack is
// `frames` (the framework decides the advice), or "" when the role says
// nothing plain about the cause.
std::string role_explanation(Role role, const std::vector<Frame>& frames);

// The stage over one process: fills `r.roles` (live by role per step, at
// exit, growth after the warm-up) and the role of each suspect, exit-leak
// and start-up row and their stacks, with the suspects' explanations.
// Runs once the rows are named and grouped.
// `frames_of` as for account_roles; `name_site` names the largest sites of
// each role (RoleLive::top_sites).
void assign_roles(ProcessReport& r, const ReplayOutput& replay, const RoleTable& table,
                  const std::function<FrameWalk(uint32_t stack)>& frames_of,
                  const std::function<Site(uint32_t stack, uint8_t kind)>& name_site, bool sampled);

// Sites kept per role in RoleLive::top_sites.
inline constexpr size_t kRoleTopSites = 3;

// A role grows when its growth per step after the warm-up reaches this.
inline constexpr double kRoleGrowthFloor = 1024;

// Growth per step of each role after the warm-up (Theil-Sen, as `memledger
// check` judges it).
std::array<double, kRoleCount> role_growth(const RoleAccount& account, int warmup_steps);

// Which roles grow after the warm-up, from their `growth` (role_growth's).
// With exact counts, those whose growth reaches kRoleGrowthFloor. In sampled host mode one sampled allocation
// weighs a whole sample interval, and a role sums many sites: samples of
// several of them caught live at a few step ends make a slope without any
// site growing. There a role grows when its exact part (device, managed,
// pinned) grows, or when its growth reaches `sampled_floor` (four samples
// over the window, the suspects' floor) and one of the growth suspects,
// judged site by site, is a host site of that role
// (`host_suspect_roles`).
std::array<bool, kRoleCount> roles_growing(const RoleAccount& account, const std::array<double, kRoleCount>& growth,
                                           int warmup_steps, double sampled_floor,
                                           const std::array<bool, kRoleCount>& host_suspect_roles);

}  // namespace memledger::report
