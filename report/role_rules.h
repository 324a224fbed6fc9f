// The roles an allocation can have (DESIGN.md, "Role") and the rules that
// give them: plain data, shared by the analysis options (rules a user adds
// from a policy file), the policy reader and the roles stage (roles.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memledger::report {

enum class Role : uint8_t {
  kParameter,
  kGradient,
  kOptimizerState,
  kActivation,
  kData,
  kWorkspace,
  kCommunication,
  kOther,
};
inline constexpr int kRoleCount = 8;

const char* role_name(Role role);  // "parameter", "optimizer_state", ...
std::optional<Role> role_from_name(std::string_view name);
// "parameter, gradient, ..., other"
std::string role_names();

// One rule: when every condition holds, the allocation has `role`. Rules are
// tried in order; the first that holds decides. A condition left empty
// holds always.
//
// frames: the stack matches when one of its frames matches one of these
//   patterns (glob: `*` any run of characters, `?` one):
//     py:QUALNAME      a Python frame's qualified name   (py:Module._call_impl)
//     file:PATH        a Python frame's file             (file:*/torch/optim/*)
//     native:FUNCTION  a native frame's function         (native:gloo::*)
//     lib:FILE         a native frame's object file name (lib:libnccl.so*)
// phase: startup, steps, teardown, or the phase of a step's label
//   (memledger.phase("eval") labels its steps "eval", "eval/x").
// lifetime: kept (live at a step end, or at exit), freed (freed within the
//   step that made it).
// kind: host, device, managed, pinned_host, mapped; "gpu" for device and
//   managed together.
struct RoleRule {
  Role role = Role::kOther;
  std::vector<std::string> frames;
  std::string phase;
  std::string lifetime;
  std::string kind;
  std::string why;     // what the rule recognises, for the reader
  std::string origin;  // "built-in", or the policy file's "file:line"
  // The rule does not hold where a frame matching one of these patterns lies
  // inside (is called by) the frame that matched `frames`: an optimizer's
  // step that calls the program's closure (LBFGS, PyTorch Lightning's
  // training step) runs the closure's forward and backward, whose tensors are
  // activations and gradients, not optimizer state. Built-in rules only.
  std::vector<std::string> unless_inside;
};

// The built-in table, in order.
const std::vector<RoleRule>& builtin_role_rules();

// Checks a rule written by a user (pattern prefixes, phase, lifetime and
// kind words); returns why it is wrong, or "" when it is fine.
std::string role_rule_error(const RoleRule& rule);

}  // namespace memledger::report
