#include "roles.h"

#include <algorithm>
#include <filesystem>
#include <span>

#include <absl/container/flat_hash_map.h>

#include "replay.h"
#include "trace_format.h"

namespace memledger::report {
namespace {

namespace fmt = memledger::format;

const char* const kRoleNames[kRoleCount] = {"parameter", "gradient",  "optimizer_state", "activation",
                                            "data",      "workspace", "communication",   "other"};

// The frames of each framework that mark a piece of a training program.
// Patterns are globs; see RoleRule.
#define TORCH_OPTIM "file:*/torch/optim/*"
#define KERAS_OPTIM "file:*/keras/src/optimizers/*", "file:*/tf_keras/src/optimizers/*", \
                    "file:*/keras/optimizers/*", "file:*/keras/optimizer_v2/*"
#define OPTAX "file:*/optax/*"
// The buffers of XLA's arrays (PjRt's CPU and GPU clients).
#define XLA_BUFFERS "native:*PjitFunction*", "native:xla::*Buffer*", "native:xla::CpuDeviceMemory::*", \
                    "native:stream_executor::*Allocat*", "native:tsl::BFCAllocator::*"
// Code an optimizer's step does not run itself but may call back: the
// program's closure (optimizer.step(closure), as LBFGS needs and PyTorch
// Lightning does for every optimizer), with its forward and backward.
#define CLOSURE "py:closure", "py:*.closure", "file:*/lightning/*", "file:*/pytorch_lightning/*", "file:*/lightning_fabric/*", \
                "py:Module._call_impl", "py:Module.__call__", "file:*/torch/nn/functional.py", "py:Tensor.backward", \
                "py:backward in */torch/autograd/*", "py:grad in */torch/autograd/*", "py:_engine_run_backward"
#define BACKWARD "py:Tensor.backward", "file:*/torch/autograd/*", "native:torch::autograd::Engine::*", \
                 "native:torch::autograd::AccumulateGrad*", "file:*/tensorflow/python/eager/backprop.py", \
                 "py:GradientTape.gradient"

// The built-in rules: tried in order, the first that holds decides.
//
//   role, frames (any of), phase, lifetime, kind, what the rule recognises
struct BuiltinRule {
  Role role;
  std::vector<std::string> frames;
  const char* phase;
  const char* lifetime;
  const char* kind;
  const char* why;
  std::vector<std::string> unless_inside = {};
};
const std::vector<BuiltinRule> kBuiltinRules = {
    {Role::kOther, {"file:<frozen importlib._bootstrap*"}, "", "", "", "made while a module was being imported"},
    {Role::kCommunication,
     {"lib:libnccl*", "native:nccl*", "native:gloo::*", "native:c10d::*", "lib:libgloo*",
      "file:*/torch/distributed/*", "file:*/horovod/*"},
     "", "", "", "collective communication: NCCL, gloo, c10d and torch.distributed"},
    {Role::kData,
     {"file:*/torch/utils/data/*", "file:*/tensorflow/python/data/*", "native:tensorflow::data::*",
      "file:*/keras/src/trainers/data_adapters/*", "file:*/keras/src/trainers/epoch_iterator.py",
      "file:*/torchvision/datasets/*", "file:*-packages/datasets/*", "file:*/tensorflow_datasets/*", "file:*/grain/*"},
     "", "", "", "the input pipeline: DataLoader and its workers, tf.data, dataset libraries"},
    {Role::kWorkspace,
     {"lib:libcublas*", "lib:libcudnn*", "lib:libcufft*", "lib:libcusparse*", "lib:libnvrtc*", "lib:libnvJitLink*",
      "native:cublas*", "native:cudnn*", "native:*Workspace*", "native:*workspace*", "native:Xbyak::*",
      "native:dnnl::impl::*jit*", "native:xla::*Compile*",
      "native:xla::*compile*", "native:llvm::*", "native:mlir::*", "native:tensorflow::grappler::*",
      "file:*/torch/_dynamo/*", "file:*/torch/_inductor/*", "file:*/jax/_src/interpreters/mlir.py",
      "file:*/jax/_src/interpreters/partial_eval.py", "file:*/jax/_src/compiler.py",
      "file:*/tensorflow/python/framework/func_graph.py"},
     "", "", "",
     "scratch space and caches of math libraries and compilers: cuBLAS, cuDNN, XLA, LLVM, TorchDynamo and "
     "Inductor, tracing a jitted function or a tf.function"},
    {Role::kOptimizerState, {TORCH_OPTIM, KERAS_OPTIM, OPTAX, "py:*apply_gradients*"}, "", "kept", "",
     "made inside the optimizer (torch.optim, Keras optimizers, optax) and kept past its step", {CLOSURE}},
    {Role::kWorkspace, {TORCH_OPTIM, KERAS_OPTIM, OPTAX, "py:*apply_gradients*"}, "", "freed", "",
     "temporaries of the optimizer's update", {CLOSURE}},
    {Role::kActivation, {"file:*/torch/utils/checkpoint.py"}, "", "", "",
     "activations recomputed by activation checkpointing"},
    {Role::kGradient, {BACKWARD}, "", "kept", "",
     "made during backward (torch.autograd, its engine's threads, GradientTape.gradient) and kept past it"},
    {Role::kWorkspace, {BACKWARD}, "", "freed", "", "temporaries of backward (gradients of activations)"},
    {Role::kParameter,
     {"py:*.__init__ in */torch/nn/*", "py:*.reset_parameters", "file:*/torch/nn/parameter.py", "py:Module._apply",
      "py:Module.to", "py:*.build in */keras/*", "py:*.add_weight", "py:*Variable.__init__ in */keras/*",
      "py:*.add_variable in */keras/*", "file:*/keras/src/backend/*/core.py", "py:*.init in */flax/*",
      "file:*/haiku/*/base.py"},
     "", "", "", "made while building the model: Module.__init__, reset_parameters, Keras Layer.build and add_weight"},
    {Role::kParameter, {XLA_BUFFERS}, "startup", "", "", "arrays made by JAX/XLA before the first step: initialising parameters"},
    {Role::kData, {"py:device_put in */jax/*", "native:*BufferFromHostBuffer*"}, "", "", "",
     "arrays put on the device from the host (jax.device_put): input batches"},
    {Role::kActivation,
     {"py:Module._call_impl", "py:Module.__call__", "file:*/torch/nn/functional.py", "py:Layer.__call__",
      "py:*Layer.__call__", "py:Operation.__call__ in */keras/*", "py:*train_function* in */keras/*", "py:*Trainer._make_function.<locals>.* in */keras/*",
      "py:*one_step_on* in */keras/*",
      "py:*multi_step_on* in */keras/*", "py:*.train_step in */keras/*", "py:*.test_step in */keras/*",
      "py:*.predict_step in */keras/*",
      "py:*.call in */keras/*", "py:*.apply in */flax/*"},
     "", "", "",
     "made in forward: Module.__call__, Keras Layer.__call__ and the compiled training step, freed by backward or at "
     "step end"},
    {Role::kActivation, {XLA_BUFFERS}, "steps", "", "", "made by a jitted step: its outputs and intermediates"},
};

#undef TORCH_OPTIM
#undef KERAS_OPTIM
#undef OPTAX
#undef XLA_BUFFERS
#undef BACKWARD
#undef CLOSURE

// `*` matches any run of characters, `?` one character.
bool glob(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::string_view basename(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

bool frame_matches(std::string_view pattern, const Frame& f) {
  if (pattern.starts_with("py:")) {
    if (!f.python) return false;
    std::string_view name = pattern.substr(3);
    std::string_view file;
    const size_t in = name.find(" in ");
    if (in != std::string_view::npos) {
      file = name.substr(in + 4);
      name = name.substr(0, in);
    }
    return glob(name, f.function) && (file.empty() || glob(file, f.file));
  }
  if (pattern.starts_with("file:")) return f.python && glob(pattern.substr(5), f.file);
  if (pattern.starts_with("native:")) return !f.python && glob(pattern.substr(7), f.function);
  if (pattern.starts_with("lib:")) return !f.python && !f.module.empty() && glob(pattern.substr(4), basename(f.module));
  return false;
}

bool kind_matches(const std::string& kind, uint8_t k) {
  if (kind.empty()) return true;
  if (kind == "gpu") return k == static_cast<uint8_t>(fmt::Kind::kDevice) || k == static_cast<uint8_t>(fmt::Kind::kManaged);
  return kind == fmt::kind_name(static_cast<fmt::Kind>(k));
}

bool phase_matches(const std::string& phase, const RoleSubject& s) {
  if (phase.empty()) return true;
  if (phase == "startup") return s.phase == Phase::kStartup;
  if (phase == "steps") return s.phase == Phase::kSteps;
  if (phase == "teardown") return s.phase == Phase::kTeardown;
  return s.phase == Phase::kSteps && s.label_phase == phase;
}

bool lifetime_matches(const std::string& lifetime, bool kept) {
  return lifetime.empty() || (lifetime == "kept") == kept;
}

}  // namespace

const char* role_name(Role role) { return kRoleNames[static_cast<int>(role)]; }

std::optional<Role> role_from_name(std::string_view name) {
  for (int r = 0; r < kRoleCount; ++r) {
    if (name == kRoleNames[r]) return static_cast<Role>(r);
  }
  return std::nullopt;
}

std::string role_names() {
  std::string out;
  for (int r = 0; r < kRoleCount; ++r) out += std::string(r ? ", " : "") + kRoleNames[r];
  return out;
}

const std::vector<RoleRule>& builtin_role_rules() {
  static const std::vector<RoleRule> rules = [] {
    std::vector<RoleRule> out;
    for (const BuiltinRule& b : kBuiltinRules) out.push_back({b.role, b.frames, b.phase, b.lifetime, b.kind, b.why, "built-in", b.unless_inside});
    return out;
  }();
  return rules;
}

std::string role_rule_error(const RoleRule& rule) {
  for (const std::string& p : rule.frames) {
    if (!p.starts_with("py:") && !p.starts_with("file:") && !p.starts_with("native:") && !p.starts_with("lib:")) {
      return "frame pattern '" + p + "' must start with py:, file:, native: or lib:";
    }
  }
  if (!rule.lifetime.empty() && rule.lifetime != "kept" && rule.lifetime != "freed") {
    return "lifetime '" + rule.lifetime + "' is neither kept nor freed";
  }
  if (!rule.kind.empty() && rule.kind != "gpu") {
    bool known = false;
    for (int k = 0; k < fmt::kKindCount; ++k) known = known || rule.kind == fmt::kind_name(static_cast<fmt::Kind>(k));
    if (!known) return "kind '" + rule.kind + "' is not host, device, managed, pinned_host, mapped or gpu";
  }
  if (rule.phase.find_first_of(" \t/") != std::string::npos) {
    return "phase '" + rule.phase + "' is not startup, steps, teardown or the name of a phase";
  }
  return {};
}

RoleTable::RoleTable(const std::vector<RoleRule>& user_rules) : rules_(user_rules) {
  const std::vector<RoleRule>& builtin = builtin_role_rules();
  rules_.insert(rules_.end(), builtin.begin(), builtin.end());
}

namespace {

bool bit(const uint64_t* bits, size_t n) { return (bits[n / 64] >> (n % 64) & 1) != 0; }

}  // namespace

const uint64_t* RoleTable::matches(const Frame& f, FrameMatches& memo) const {
  const size_t words = (2 * rules_.size() + 63) / 64;
  auto [it, added] = memo.at_.try_emplace(&f, static_cast<uint32_t>(memo.bits_.size()));
  if (added) {
    memo.bits_.resize(memo.bits_.size() + words, 0);
    uint64_t* bits = memo.bits_.data() + it->second;
    auto set = [bits](size_t n) { bits[n / 64] |= uint64_t{1} << (n % 64); };
    for (size_t i = 0; i < rules_.size(); ++i) {
      const RoleRule& r = rules_[i];
      const auto match = [&](const std::string& p) { return frame_matches(p, f); };
      if (std::any_of(r.frames.begin(), r.frames.end(), match)) set(2 * i);
      if (std::any_of(r.unless_inside.begin(), r.unless_inside.end(), match)) set(2 * i + 1);
    }
  }
  return memo.bits_.data() + it->second;
}

Role RoleTable::classify(const RoleSubject& subject, const FrameWalk& walk, size_t* rule, FrameMatches* memo) const {
  // Rules whose other conditions hold, in order; the frames are walked once
  // and the earliest rule that one of them matches wins.
  std::vector<size_t> open;
  for (size_t i = 0; i < rules_.size(); ++i) {
    const RoleRule& r = rules_[i];
    if (kind_matches(r.kind, subject.kind) && phase_matches(r.phase, subject) &&
        lifetime_matches(r.lifetime, subject.kept)) {
      open.push_back(i);
    }
  }
  size_t best = rules_.size();
  if (open.empty()) {
    if (rule != nullptr) *rule = best;
    return Role::kOther;
  }
  // A rule with no frame pattern holds for every stack.
  for (size_t i : open) {
    if (rules_[i].frames.empty()) {
      best = i;
      break;
    }
  }
  // Rules that a frame inside their match rules out (RoleRule::unless_inside),
  // by their place in `open`; frames come innermost first.
  std::vector<bool> ruled_out(open.size(), false);
  FrameMatches own;  // frames that stay put for this call only
  FrameMatches& known = memo != nullptr ? *memo : own;
  walk([&](const Frame& f) {
    const uint64_t* bits = matches(f, known);
    for (size_t k = 0; k < open.size(); ++k) {
      const size_t i = open[k];
      if (i >= best) break;
      if (ruled_out[k]) continue;
      if (bit(bits, 2 * i + 1)) {
        ruled_out[k] = true;
        continue;
      }
      if (bit(bits, 2 * i)) best = i;
    }
    return best != open.front();  // nothing earlier can win
  });
  if (rule != nullptr) *rule = best;
  return best < rules_.size() ? rules_[best].role : Role::kOther;
}

Role RoleTable::classify(const RoleSubject& subject, const std::vector<Frame>& frames, size_t* rule) const {
  return classify(
      subject,
      [&](const std::function<bool(const Frame&)>& visit) {
        for (const Frame& f : frames) {
          if (!visit(f)) return;
        }
      },
      rule);
}

std::optional<std::pair<Role, uint32_t>> RoleAccount::find(uint8_t kind, uint32_t stack) const {
  const uint64_t key = (static_cast<uint64_t>(kind) << 32) | stack;
  auto it = std::lower_bound(by_site.begin(), by_site.end(), key,
                             [](const auto& entry, uint64_t k) { return entry.first < k; });
  if (it == by_site.end() || it->first != key) return std::nullopt;
  return it->second;
}

namespace {

// Scales host estimates by role to the exact host total, keeping their
// shares; the rounding goes to the largest, and all of it to `other` when
// nothing was sampled.
void scale_to(std::span<int64_t> by_role, int64_t exact) {
  int64_t estimate = 0;
  for (int64_t bytes : by_role) estimate += bytes;
  size_t largest = static_cast<size_t>(Role::kOther);
  if (estimate > 0) {
    for (size_t r = 0; r < by_role.size(); ++r) {
      if (by_role[r] > by_role[largest]) largest = r;
    }
  }
  int64_t given = 0;
  for (int64_t& bytes : by_role) {
    bytes = estimate > 0 ? static_cast<int64_t>(static_cast<double>(bytes) * static_cast<double>(exact) /
                                                static_cast<double>(estimate))
                         : 0;
    given += bytes;
  }
  by_role[largest] += exact - given;
}

// When a site allocated, from its first and last allocation.
RoleSubject subject_of(const SiteAcc& acc, const std::vector<StepStats>& steps, uint64_t steps_begin) {
  RoleSubject s;
  s.kind = acc.kind;
  s.kept = acc.live > 0 || std::any_of(acc.changes.begin(), acc.changes.end(),
                                       [](const SeriesPoint& p) { return p.live > 0; });
  if (steps.empty()) return s;
  if (acc.last_alloc_ns < steps_begin) {
    s.phase = Phase::kStartup;
    return s;
  }
  if (acc.first_alloc_ns > steps.back().end_ns) {
    s.phase = Phase::kTeardown;
    return s;
  }
  s.phase = Phase::kSteps;
  // The step it first allocated in (during the steps).
  const uint64_t at = std::max(acc.first_alloc_ns, steps_begin);
  auto step = std::lower_bound(steps.begin(), steps.end(), at,
                               [](const StepStats& st, uint64_t ts) { return st.end_ns < ts; });
  if (step == steps.end()) --step;
  const std::string& label = step->label;
  s.label_phase = label.substr(0, label.find('/'));
  return s;
}

}  // namespace

RoleAccount account_roles(const ReplayOutput& replay, const std::vector<StepStats>& steps, const RoleTable& table,
                          const std::function<FrameWalk(uint32_t stack)>& frames_of, bool sampled) {
  RoleAccount out;
  const size_t n = steps.size();
  out.live.assign(n, {});
  // Changes of live bytes by role at each step end (a site's series holds
  // its value at the step ends where it changed), summed afterwards.
  std::vector<std::array<int64_t, kRoleCount>> delta(n + 1, std::array<int64_t, kRoleCount>{});
  std::vector<std::array<int64_t, kRoleCount>> host_delta(n + 1, std::array<int64_t, kRoleCount>{});
  const uint64_t steps_begin = n >= 2 ? first_step_start_ns(steps) : 0;
  constexpr uint8_t kHost = static_cast<uint8_t>(fmt::Kind::kHost);
  FrameMatches memo;
  for (const SiteAcc& acc : replay.sites) {
    const RoleSubject subject = subject_of(acc, steps, steps_begin);
    if (!subject.kept) continue;  // never live at a step end or at exit
    size_t rule = 0;
    const Role role = table.classify(subject, frames_of(acc.stack), &rule, &memo);
    ++out.sites_classified;
    const int r = static_cast<int>(role);
    out.by_site.push_back({(static_cast<uint64_t>(acc.kind) << 32) | acc.stack, {role, static_cast<uint32_t>(rule)}});
    out.at_end[r] += acc.live;
    if (n > 0 && !acc.changes.empty() && acc.changes.back().live > 0) {
      auto& top = out.top[r];
      top.push_back({(static_cast<uint64_t>(acc.kind) << 32) | acc.stack, acc.changes.back().live, subject.phase,
                     static_cast<uint32_t>(rule)});
      std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
      if (top.size() > kRoleTopSites) top.pop_back();
    }
    int64_t before = 0;
    for (const SeriesPoint& p : acc.changes) {
      if (p.step == 0 || p.step > n) continue;
      delta[p.step - 1][r] += p.live - before;
      if (acc.kind == kHost) host_delta[p.step - 1][r] += p.live - before;
      before = p.live;
    }
  }
  std::sort(out.by_site.begin(), out.by_site.end());
  std::array<int64_t, kRoleCount> running{}, host_running{};
  if (sampled) out.host_live.assign(n, {});
  for (size_t k = 0; k < n; ++k) {
    for (int r = 0; r < kRoleCount; ++r) {
      running[r] += delta[k][r];
      host_running[r] += host_delta[k][r];
    }
    out.live[k] = running;
    if (!sampled) continue;
    // The host sites' bytes are estimates from the sampled allocations; the
    // step's host live bytes are exact. Their shares by role are kept.
    std::array<int64_t, kRoleCount> scaled = host_running;
    scale_to(scaled, steps[k].live[0]);
    for (int r = 0; r < kRoleCount; ++r) out.live[k][r] += scaled[r] - host_running[r];
    out.host_live[k] = scaled;
  }
  out.estimated = sampled;
  return out;
}

std::string role_explanation(Role role, const std::vector<Frame>& frames) {
  auto uses = [&](const char* pattern) {
    return std::any_of(frames.begin(), frames.end(), [&](const Frame& f) { return frame_matches(pattern, f); });
  };
  const bool torch = uses("file:*/torch/*");
  const bool keras = uses("file:*/keras/*") || uses("file:*/tensorflow/*") || uses("lib:libtensorflow*") ||
                     uses("lib:_pywrap_tensorflow*");
  const bool jax = uses("file:*/jax/*") || uses("lib:xla_extension*") || uses("lib:libjax*") || uses("file:*/jaxlib/*");
  switch (role) {
    case Role::kActivation:
      if (torch) {
        return "activations from forward stay alive after their step: a tensor that keeps its autograd graph is "
               "being kept; keep loss.item() or .detach() instead";
      }
      if (keras) {
        return "outputs of the model stay alive after their step: model outputs (logits, predictions) are being "
               "kept, in a callback or a list; keep a number or a small summary (float(...), .numpy() of what you "
               "need) and drop the tensors";
      }
      if (jax) {
        return "outputs of the jitted step stay alive after their step: every step's output is being kept (a list "
               "or dict of arrays); keep a Python number (float(x)) or only the latest";
      }
      return "activations from forward stay alive after their step: model outputs are being kept across steps";
    case Role::kOptimizerState:
      return "optimizer state grows: a new parameter group or optimizer each step?";
    case Role::kGradient:
      return "gradients stay alive across steps: gradients kept in a list, or backward(retain_graph=True) or "
             "create_graph=True keeping the graph?";
    case Role::kParameter:
      return "parameters grow during training: a layer, module or variable created inside the loop?";
    case Role::kData:
      return "the input pipeline keeps data: a cache in the dataset or loader, or batches kept in a list?";
    case Role::kWorkspace:
      return "framework scratch space or caches grow: new input shapes compiling or autotuning again each step "
             "(pad or bucket the shapes)?";
    case Role::kCommunication:
      return "communication buffers grow: a new process group or communicator each step?";
    case Role::kOther:
      return {};
  }
  return {};
}

namespace {

// A site's role: from the account when it was classified there (live at a
// step end or at exit), else from its own frames.
void give_role(Site& site, const RoleAccount& account, const RoleTable& table) {
  std::optional<std::pair<Role, uint32_t>> found = account.find(site.kind, site.stack);
  Role role;
  size_t rule;
  if (found) {
    role = found->first;
    rule = found->second;
  } else {
    RoleSubject subject;
    subject.kind = site.kind;
    subject.kept = true;
    role = table.classify(subject, site.frames, &rule);
  }
  site.role = role_name(role);
  site.role_rule = rule < table.rules().size() ? table.rules()[rule].why : "no rule matched";
}

}  // namespace

namespace {

// A live set's bytes by role: a site live at a step end or at exit has its
// role already; one that never is (an activation freed within its step,
// which is what makes most peaks) is classified here, from when it allocated.
class LiveSetRoles {
 public:
  LiveSetRoles(const ReplayOutput& replay, const RoleAccount& account, const RoleTable& table,
               const std::function<FrameWalk(uint32_t stack)>& frames_of, const std::vector<StepStats>& steps)
      : replay_(replay), account_(account), table_(table), frames_of_(frames_of), steps_(steps) {}

  std::vector<int64_t> of(const std::vector<OomEvent::LiveSite>& live) {
    std::vector<int64_t> out(kRoleCount, 0);
    for (const OomEvent::LiveSite& t : live) out[static_cast<int>(role(t.kind, t.stack))] += t.bytes;
    return out;
  }

  // Every site's live bytes at the peak (the replay's live set then, of
  // which live_at_peak lists the largest sites only). Sampled host mode:
  // the peak's host part (the exact host total then) and its other kinds'
  // part (exact, never sampled) are each split among the roles by the
  // shares of their sites at the replay's peak.
  std::vector<int64_t> at_peak(bool sampled) {
    std::vector<int64_t> host(kRoleCount, 0), other(kRoleCount, 0);
    constexpr uint8_t kHost = static_cast<uint8_t>(fmt::Kind::kHost);
    for (const SiteAcc& acc : replay_.sites) {
      const int64_t bytes = acc.peak_epoch == replay_.peak_epoch ? acc.peak_live : acc.live;
      if (bytes > 0) (acc.kind == kHost ? host : other)[static_cast<int>(role(acc.kind, acc.stack, &acc))] += bytes;
    }
    if (sampled) {
      scale_to(host, replay_.peak.bytes - replay_.peak_unsampled);
      scale_to(other, replay_.peak_unsampled);
    }
    for (int r = 0; r < kRoleCount; ++r) host[r] += other[r];
    return host;
  }

 private:
  Role role(uint8_t kind, uint32_t stack, const SiteAcc* acc = nullptr) {
    if (const auto found = account_.find(kind, stack)) return found->first;
    const uint64_t key = (static_cast<uint64_t>(kind) << 32) | stack;
    if (const auto it = classified_.find(key); it != classified_.end()) return it->second;
    if (acc == nullptr) {
      if (sites_.empty()) {
        for (const SiteAcc& a : replay_.sites) sites_.emplace((static_cast<uint64_t>(a.kind) << 32) | a.stack, &a);
      }
      if (const auto it = sites_.find(key); it != sites_.end()) acc = it->second;
    }
    RoleSubject subject;
    subject.kind = kind;
    if (acc != nullptr) subject = subject_of(*acc, steps_, steps_.size() >= 2 ? first_step_start_ns(steps_) : 0);
    const Role role = table_.classify(subject, frames_of_(stack), nullptr, &memo_);
    classified_.emplace(key, role);
    return role;
  }

  const ReplayOutput& replay_;
  const RoleAccount& account_;
  const RoleTable& table_;
  const std::function<FrameWalk(uint32_t stack)>& frames_of_;
  const std::vector<StepStats>& steps_;
  absl::flat_hash_map<uint64_t, const SiteAcc*> sites_;
  absl::flat_hash_map<uint64_t, Role> classified_;
  FrameMatches memo_;
};

}  // namespace

void assign_roles(ProcessReport& r, const ReplayOutput& replay, const RoleTable& table,
                  const std::function<FrameWalk(uint32_t stack)>& frames_of,
                  const std::function<Site(uint32_t stack, uint8_t kind)>& name_site, bool sampled) {
  const RoleAccount account = account_roles(replay, r.steps, table, frames_of, sampled);
  LiveSetRoles live_set_roles(replay, account, table, frames_of, r.steps);
  r.roles.at_peak = r.live_at_peak.empty() ? std::vector<int64_t>{} : live_set_roles.at_peak(sampled);
  for (OomEvent& oom : r.ooms) {
    if (!oom.live_sites.empty()) oom.live_by_role = live_set_roles.of(oom.live_sites);
    oom.live_sites = {};
  }
  RoleLive& out = r.roles;
  out.names.clear();
  for (int k = 0; k < kRoleCount; ++k) out.names.push_back(kRoleNames[k]);
  out.per_step.clear();
  for (const auto& step : account.live) out.per_step.emplace_back(step.begin(), step.end());
  out.at_end.assign(account.at_end.begin(), account.at_end.end());
  const std::array<double, kRoleCount> growth = role_growth(account, r.warmup_steps);
  out.growth_per_step.assign(growth.begin(), growth.end());
  out.estimated = account.estimated;
  out.sites = account.sites_classified;
  out.top_sites.assign(kRoleCount, {});
  out.top_phases.assign(kRoleCount, {});
  static const char* const kPhaseNames[] = {"startup", "steps", "teardown", "none"};
  for (int k = 0; k < kRoleCount; ++k) {
    for (const RoleAccount::TopSite& top : account.top[k]) {
      SiteTotal t;
      t.site = name_site(static_cast<uint32_t>(top.key), static_cast<uint8_t>(top.key >> 32));
      t.site.role = kRoleNames[k];
      t.site.role_rule = top.rule < table.rules().size() ? table.rules()[top.rule].why : "no rule matched";
      t.bytes = top.bytes;
      t.estimated = sampled && t.site.kind == static_cast<uint8_t>(fmt::Kind::kHost);
      out.top_sites[k].push_back(std::move(t));
      out.top_phases[k].push_back(kPhaseNames[static_cast<int>(top.phase)]);
    }
  }
  out.user_rules = table.rules().size() - builtin_role_rules().size();
  for (LeakSuspect& s : r.leak_suspects) {
    give_role(s.site, account, table);
    for (LeakSuspect& v : s.variants) give_role(v.site, account, table);
    if (const std::optional<Role> role = role_from_name(s.site.role)) {
      s.role_explanation = role_explanation(*role, s.site.frames);
    }
  }
  for (std::vector<SiteTotal>* rows : {&r.exit_leaks, &r.startup}) {
    for (SiteTotal& t : *rows) {
      give_role(t.site, account, table);
      for (SiteTotal& v : t.variants) give_role(v.site, account, table);
    }
  }
  std::array<bool, kRoleCount> host_suspect_roles{};
  auto note_host_suspect = [&](const Site& site) {
    if (site.kind != static_cast<uint8_t>(fmt::Kind::kHost)) return;
    if (const std::optional<Role> role = role_from_name(site.role)) host_suspect_roles[static_cast<int>(*role)] = true;
  };
  for (const LeakSuspect& s : r.leak_suspects) {
    note_host_suspect(s.site);
    for (const LeakSuspect& v : s.variants) note_host_suspect(v.site);
  }
  const size_t window = r.steps.size() > size_t(r.warmup_steps) ? r.steps.size() - size_t(r.warmup_steps) : 1;
  const double sampled_floor = 4.0 * double(r.sample_interval) / double(window);
  const std::array<bool, kRoleCount> grows =
      roles_growing(account, growth, r.warmup_steps, sampled_floor, host_suspect_roles);
  out.growing.clear();
  for (int k = 0; k < kRoleCount; ++k) {
    if (grows[k]) out.growing.emplace_back(kRoleNames[k], growth[k]);
  }
  std::sort(out.growing.begin(), out.growing.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
}

namespace {

// Role r's growth per step after the warm-up in `live`, less `minus` (its
// host part) where given.
double role_slope(const std::vector<std::array<int64_t, kRoleCount>>& live, int r, int warmup_steps,
                  const std::vector<std::array<int64_t, kRoleCount>>* minus = nullptr) {
  const size_t first = static_cast<size_t>(std::max(0, warmup_steps));
  if (live.size() < first + 3) return 0;
  std::vector<double> series;
  for (size_t k = first; k < live.size(); ++k) {
    const int64_t less = minus != nullptr && k < minus->size() ? (*minus)[k][r] : 0;
    series.push_back(static_cast<double>(live[k][r] - less));
  }
  return theil_sen_slope(series);
}

}  // namespace

std::array<double, kRoleCount> role_growth(const RoleAccount& account, int warmup_steps) {
  std::array<double, kRoleCount> out{};
  for (int r = 0; r < kRoleCount; ++r) out[r] = role_slope(account.live, r, warmup_steps);
  return out;
}

std::array<bool, kRoleCount> roles_growing(const RoleAccount& account, const std::array<double, kRoleCount>& growth,
                                           int warmup_steps, double sampled_floor,
                                           const std::array<bool, kRoleCount>& host_suspect_roles) {
  std::array<bool, kRoleCount> out{};
  for (int r = 0; r < kRoleCount; ++r) {
    if (growth[r] < kRoleGrowthFloor) continue;
    // Sampled host mode: a suspect's evidence, or else the exact part's own growth.
    out[r] = !account.estimated || (growth[r] >= sampled_floor && host_suspect_roles[r]) ||
             role_slope(account.live, r, warmup_steps, &account.host_live) >= kRoleGrowthFloor;
  }
  return out;
}

}  // namespace memledger::report
