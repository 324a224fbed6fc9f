#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "policy.h"
#include "replay.h"
#include "roles.h"
#include "trace_format.h"

using namespace memledger::report;

namespace {

Frame py(const std::string& qualname, const std::string& file, bool attributed = false) {
  Frame f;
  f.python = true;
  f.function = qualname;
  f.file = file;
  f.attributed = attributed;
  return f;
}

Frame native(const std::string& function, const std::string& module) {
  Frame f;
  f.function = function;
  f.module = module;
  return f;
}

RoleSubject subject(Phase phase, bool kept, uint8_t kind = 0) {
  RoleSubject s;
  s.phase = phase;
  s.kept = kept;
  s.kind = kind;
  return s;
}

const char* const kTorch = "/usr/lib/python3/dist-packages/torch/";

// One stack of tests/data/roles/*.json: taken from a real trace of a
// framework client (tests/data/roles/extract.py says how), with the role
// it must have.
struct GoldenStack {
  std::string where;  // file and index, for messages
  std::string expect;
  RoleSubject subject;
  std::vector<Frame> frames;
};

std::vector<GoldenStack> golden(const std::string& name) {
  std::ifstream in(std::string(MEMLEDGER_SOURCE_DIR) + "/tests/data/roles/" + name);
  REQUIRE(in.good());
  const nlohmann::json stacks = nlohmann::json::parse(in);
  std::vector<GoldenStack> out;
  for (size_t i = 0; i < stacks.size(); ++i) {
    const nlohmann::json& s = stacks[i];
    GoldenStack g;
    g.where = name + "[" + std::to_string(i) + "] " + s.value("site", "");
    g.expect = s.at("role").get<std::string>();
    const std::string phase = s.at("phase").get<std::string>();
    g.subject.phase = phase == "startup" ? Phase::kStartup : phase == "teardown" ? Phase::kTeardown : Phase::kSteps;
    g.subject.kept = s.at("kept").get<bool>();
    g.subject.kind = s.at("kind").get<std::string>() == "host" ? 0 : 1;
    for (const nlohmann::json& f : s.at("frames")) {
      Frame frame;
      frame.python = f.value("python", false);
      frame.attributed = f.value("attributed", false);
      frame.function = f.value("function", "");
      frame.file = f.value("file", "");
      frame.module = f.value("module", "");
      g.frames.push_back(std::move(frame));
    }
    out.push_back(std::move(g));
  }
  return out;
}

void check_golden(const std::string& name, size_t at_least, const std::string& must_hold = "") {
  const std::vector<GoldenStack> stacks = golden(name);
  CHECK(stacks.size() >= at_least);
  if (!must_hold.empty()) {
    INFO(name << " holds no stack of role " << must_hold);
    CHECK(std::any_of(stacks.begin(), stacks.end(), [&](const GoldenStack& g) { return g.expect == must_hold; }));
  }
  const RoleTable table;
  for (const GoldenStack& g : stacks) {
    size_t rule = 0;
    const Role role = table.classify(g.subject, g.frames, &rule);
    INFO(g.where << ": rule " << (rule < table.rules().size() ? table.rules()[rule].why : "none"));
    CHECK(std::string(role_name(role)) == g.expect);
  }
}

}  // namespace

TEST_CASE("roles: the table on stacks from real PyTorch traces", "[roles]") { check_golden("torch.json", 6); }
TEST_CASE("roles: the table on stacks from real Keras traces", "[roles]") { check_golden("keras.json", 4); }
TEST_CASE("roles: the table on stacks from real JAX traces", "[roles]") { check_golden("jax.json", 4); }
// Two gloo ranks of tests/clients/ranks_client.py, as torchrun starts them.
TEST_CASE("roles: the table on stacks from real torch.distributed traces", "[roles]") {
  check_golden("torch_distributed.json", 6, "communication");
}

TEST_CASE("roles: rules are tried in order and their conditions all hold", "[roles]") {
  const RoleTable table;
  const std::vector<Frame> adam = {native("at::empty", "/usr/lib/libtorch_cpu.so"),
                                   py("Adam.step", std::string(kTorch) + "optim/adam.py"),
                                   py("main", "/tmp/train.py")};
  CHECK(table.classify(subject(Phase::kSteps, true), adam) == Role::kOptimizerState);
  // The optimizer's temporaries are scratch space.
  CHECK(table.classify(subject(Phase::kSteps, false), adam) == Role::kWorkspace);
  const std::vector<Frame> forward = {py("Linear.forward", std::string(kTorch) + "nn/modules/linear.py"),
                                      py("Module._call_impl", std::string(kTorch) + "nn/modules/module.py"),
                                      py("main", "/tmp/train.py")};
  CHECK(table.classify(subject(Phase::kSteps, true), forward) == Role::kActivation);
  // A cuBLAS workspace made in forward is workspace: that rule comes first.
  std::vector<Frame> cublas = forward;
  cublas.insert(cublas.begin(), native("cublasLtMatmul", "/usr/lib/libcublasLt.so.12"));
  CHECK(table.classify(subject(Phase::kSteps, true, 1), cublas) == Role::kWorkspace);
  // Nothing known: other.
  CHECK(table.classify(subject(Phase::kSteps, true), {py("main", "/tmp/train.py")}) == Role::kOther);
}

// optimizer.step(closure): LBFGS needs it, and PyTorch Lightning calls every
// optimizer so, with the training step inside the closure. The stacks are
// cut down from a Lightning 2.6 trace (torch 2.15) and an LBFGS loop.
TEST_CASE("roles: what the program's closure makes inside an optimizer's step is not optimizer state", "[roles]") {
  const RoleTable table;
  const std::string lightning = "/venv/lib/python3.12/site-packages/lightning/pytorch/";
  const std::vector<Frame> outer = {py("SGD.step", std::string(kTorch) + "optim/sgd.py"),
                                    py("Optimizer.profile_hook_step.<locals>.wrapper", std::string(kTorch) + "optim/optimizer.py"),
                                    py("Strategy.optimizer_step", lightning + "strategies/strategy.py"),
                                    py("Trainer.fit", lightning + "trainer/trainer.py"), py("<module>", "/tmp/lit.py")};
  auto inside = [&](std::vector<Frame> inner) {
    inner.insert(inner.end(), outer.begin(), outer.end());
    return inner;
  };
  // Lightning: the loss of a training step, kept in a list, made in forward.
  const std::vector<Frame> lit_forward =
      inside({py("Linear.forward", std::string(kTorch) + "nn/modules/linear.py"),
              py("Module._call_impl", std::string(kTorch) + "nn/modules/module.py"), py("Model.training_step", "/tmp/lit.py"),
              py("Strategy.training_step", lightning + "strategies/strategy.py"),
              py("Closure.closure", lightning + "loops/optimization/automatic.py")});
  CHECK(table.classify(subject(Phase::kSteps, true), lit_forward) == Role::kActivation);
  // Made by the program's own line in the training step: not the optimizer's.
  const std::vector<Frame> lit_own = inside({py("Model.training_step", "/tmp/lit.py"),
                                             py("Strategy.training_step", lightning + "strategies/strategy.py"),
                                             py("Closure.closure", lightning + "loops/optimization/automatic.py")});
  CHECK(table.classify(subject(Phase::kSteps, true), lit_own) != Role::kOptimizerState);
  CHECK(table.classify(subject(Phase::kSteps, false), lit_own) != Role::kWorkspace);
  // LBFGS: backward inside the closure makes gradients.
  const std::vector<Frame> lbfgs_backward = {
      py("backward", std::string(kTorch) + "autograd/__init__.py"), py("Tensor.backward", std::string(kTorch) + "_tensor.py"),
      py("main.<locals>.closure", "/tmp/train.py"), py("LBFGS.step", std::string(kTorch) + "optim/lbfgs.py"),
      py("main", "/tmp/train.py")};
  CHECK(table.classify(subject(Phase::kSteps, true), lbfgs_backward) == Role::kGradient);
  const std::vector<Frame> lbfgs_loss = {py("main.<locals>.closure", "/tmp/train.py"),
                                         py("LBFGS.step", std::string(kTorch) + "optim/lbfgs.py"), py("main", "/tmp/train.py")};
  CHECK(table.classify(subject(Phase::kSteps, true), lbfgs_loss) != Role::kOptimizerState);
  // What the optimizer makes itself stays its state, in torch.optim's code or
  // in the program's own optimizer class, and whatever calls the step.
  const std::vector<Frame> lbfgs_state = {native("at::empty", "/usr/lib/libtorch_cpu.so"),
                                          py("LBFGS.step", std::string(kTorch) + "optim/lbfgs.py"), py("main", "/tmp/train.py")};
  CHECK(table.classify(subject(Phase::kSteps, true), lbfgs_state) == Role::kOptimizerState);
  const std::vector<Frame> own_optimizer = {
      py("MyOptimizer.step", "/tmp/train.py"),
      py("Optimizer.profile_hook_step.<locals>.wrapper", std::string(kTorch) + "optim/optimizer.py"), py("main", "/tmp/train.py")};
  CHECK(table.classify(subject(Phase::kSteps, true), own_optimizer) == Role::kOptimizerState);
  CHECK(table.classify(subject(Phase::kSteps, true), inside({py("SGD._init_group", std::string(kTorch) + "optim/sgd.py")})) ==
        Role::kOptimizerState);
}

TEST_CASE("roles: a user's rules come first, with phase, lifetime and kind", "[roles]") {
  RoleRule cache;
  cache.role = Role::kData;
  cache.frames = {"py:FeatureCache.*"};
  cache.lifetime = "kept";
  RoleRule eval;
  eval.role = Role::kWorkspace;
  eval.phase = "eval";
  eval.kind = "host";
  const RoleTable table({cache, eval});
  REQUIRE(table.rules().size() == builtin_role_rules().size() + 2);
  const std::vector<Frame> frames = {py("FeatureCache.get", "/tmp/features.py"),
                                     py("Module._call_impl", std::string(kTorch) + "nn/modules/module.py")};
  CHECK(table.classify(subject(Phase::kSteps, true), frames) == Role::kData);
  CHECK(table.classify(subject(Phase::kSteps, false), frames) == Role::kActivation);  // lifetime
  RoleSubject in_eval = subject(Phase::kSteps, true);
  in_eval.label_phase = "eval";
  CHECK(table.classify(in_eval, {py("main", "/tmp/train.py")}) == Role::kWorkspace);
  in_eval.kind = static_cast<uint8_t>(memledger::format::Kind::kDevice);
  CHECK(table.classify(in_eval, {py("main", "/tmp/train.py")}) == Role::kOther);  // kind
}

TEST_CASE("roles: frame patterns and the words of a rule are checked", "[roles]") {
  RoleRule r;
  r.frames = {"torch/optim"};
  CHECK(role_rule_error(r).find("must start with py:, file:, native: or lib:") != std::string::npos);
  r.frames = {"lib:libnccl*"};
  CHECK(role_rule_error(r).empty());
  r.lifetime = "forever";
  CHECK(!role_rule_error(r).empty());
  r.lifetime = "kept";
  r.kind = "gpu";
  CHECK(role_rule_error(r).empty());
  r.kind = "vram";
  CHECK(!role_rule_error(r).empty());
  CHECK(role_from_name("optimizer_state") == Role::kOptimizerState);
  CHECK(!role_from_name("optimizer"));
}

TEST_CASE("roles: live bytes by role at each step end add up to live bytes", "[roles]") {
  // Three sites over three steps: a parameter made before the first step,
  // activations that grow, a temporary never live at a step end.
  ReplayOutput replay;
  auto site = [&](uint32_t stack, std::vector<SeriesPoint> changes, uint64_t first, uint64_t last) {
    SiteAcc acc;
    acc.stack = stack;
    acc.changes = std::move(changes);
    acc.live = acc.changes.empty() ? 0 : acc.changes.back().live;
    acc.first_alloc_ns = first;
    acc.last_alloc_ns = last;
    acc.allocs = 1;
    replay.sites.push_back(acc);
  };
  site(1, {{1, 1000, 1, 1}}, 10, 10);
  site(2, {{1, 100, 1, 1}, {2, 200, 2, 2}, {3, 300, 3, 3}}, 150, 350);
  site(3, {}, 160, 360);
  std::vector<StepStats> steps(3);
  for (size_t k = 0; k < 3; ++k) {
    steps[k].index = k + 1;
    steps[k].end_ns = 200 + 100 * k;
  }
  steps[0].live[0] = 1100;
  steps[1].live[0] = 1200;
  steps[2].live[0] = 1300;
  const std::map<uint32_t, std::vector<Frame>> stacks = {
      {1, {py("Linear.__init__", std::string(kTorch) + "nn/modules/linear.py")}},
      {2, {py("Module._call_impl", std::string(kTorch) + "nn/modules/module.py")}},
      {3, {py("Module._call_impl", std::string(kTorch) + "nn/modules/module.py")}},
  };
  auto frames_of = [&](uint32_t stack) -> FrameWalk {
    return [&, stack](const std::function<bool(const Frame&)>& visit) {
      for (const Frame& f : stacks.at(stack)) {
        if (!visit(f)) return;
      }
    };
  };
  const RoleAccount account = account_roles(replay, steps, RoleTable(), frames_of, false);
  REQUIRE(account.live.size() == 3);
  CHECK(account.sites_classified == 2);  // the temporary is never live at a step end
  for (size_t k = 0; k < 3; ++k) {
    int64_t sum = 0;
    for (int64_t bytes : account.live[k]) sum += bytes;
    CHECK(sum == steps[k].live[0]);
    CHECK(account.live[k][static_cast<int>(Role::kParameter)] == 1000);
    CHECK(account.live[k][static_cast<int>(Role::kActivation)] == int64_t(100 * (k + 1)));
  }
  CHECK(role_growth(account, 0)[static_cast<int>(Role::kActivation)] == Approx(100));
  // Sampled host mode: the exact host total is split by the sites' shares.
  steps[2].live[0] = 2600;
  const RoleAccount sampled = account_roles(replay, steps, RoleTable(), frames_of, true);
  CHECK(sampled.estimated);
  CHECK(sampled.live[2][static_cast<int>(Role::kParameter)] + sampled.live[2][static_cast<int>(Role::kActivation)] == 2600);
  CHECK(sampled.live[2][static_cast<int>(Role::kParameter)] == 2000);
}

TEST_CASE("roles: in sampled host mode a role grows on a suspect's evidence or on exact bytes", "[roles]") {
  constexpr int kAct = static_cast<int>(Role::kActivation);
  constexpr int kGrad = static_cast<int>(Role::kGradient);
  constexpr double kInterval = 131072;
  // Host activation bytes gain a sample now and then (a staircase of four
  // samples over 18 steps: about 29 KiB/step); gradients are device bytes,
  // exact, growing by 2 KiB a step.
  RoleAccount account;
  for (int k = 0; k < 18; ++k) {
    std::array<int64_t, kRoleCount> host{}, live{};
    host[kAct] = 550000 + int64_t(kInterval) * (k / 4);
    live = host;
    live[kGrad] = 1000000 + 2048 * k;
    account.live.push_back(live);
    account.host_live.push_back(host);
  }
  const double sampled_floor = 4 * kInterval / 18;
  const std::array<double, kRoleCount> growth = role_growth(account, 0);
  REQUIRE(growth[kAct] >= sampled_floor);
  REQUIRE(growth[kGrad] == Approx(2048));
  std::array<bool, kRoleCount> no_suspect{}, activation_suspect{};
  activation_suspect[kAct] = true;
  SECTION("exact counts: the floor alone") {
    account.host_live.clear();
    const auto grows = roles_growing(account, growth, 0, sampled_floor, no_suspect);
    CHECK(grows[kAct]);
    CHECK(grows[kGrad]);
  }
  SECTION("sampled: host growth without a suspect of its role is sampling noise") {
    account.estimated = true;
    const auto grows = roles_growing(account, growth, 0, sampled_floor, no_suspect);
    CHECK_FALSE(grows[kAct]);
    CHECK(grows[kGrad]);  // exact bytes need no suspect
  }
  SECTION("sampled: a host suspect of the role and four samples over the window") {
    account.estimated = true;
    CHECK(roles_growing(account, growth, 0, sampled_floor, activation_suspect)[kAct]);
    CHECK_FALSE(roles_growing(account, growth, 0, 2 * sampled_floor, activation_suspect)[kAct]);
  }
}

TEST_CASE("roles: a growing role's explanation follows the framework", "[roles]") {
  const std::vector<Frame> torch = {py("Module._call_impl", std::string(kTorch) + "nn/modules/module.py")};
  CHECK(role_explanation(Role::kActivation, torch).find("loss.item() or .detach()") != std::string::npos);
  CHECK(role_explanation(Role::kOptimizerState, torch) ==
        "optimizer state grows: a new parameter group or optimizer each step?");
  const std::vector<Frame> jax = {py("main", "/tmp/train.py", true), native("xla::cpu::Foo", "/x/xla_extension.so")};
  CHECK(role_explanation(Role::kActivation, jax).find("jitted step") != std::string::npos);
  CHECK(role_explanation(Role::kOther, torch).empty());
}

TEST_CASE("roles: a policy file's rules and limits by role", "[roles]") {
  const Policy toml = parse_policy_toml(R"(
max_growth_per_step = "1MiB"
[activation]
max_growth_per_step = 0

[[roles.rules]]
role = "data"
frames = ["py:FeatureCache.*", "file:*/loaders/*"]
lifetime = "kept"
why = "our feature cache"

[[roles.rules]]
role = "workspace"
frames = "lib:libmylib.so*"
phase = "any"
)",
                                        "p.toml", "");
  REQUIRE(toml.role_rules.size() == 2);
  CHECK(toml.role_rules[0].role == Role::kData);
  CHECK(toml.role_rules[0].frames == std::vector<std::string>{"py:FeatureCache.*", "file:*/loaders/*"});
  CHECK(toml.role_rules[0].lifetime == "kept");
  CHECK(toml.role_rules[0].why == "our feature cache");
  CHECK(toml.role_rules[1].frames == std::vector<std::string>{"lib:libmylib.so*"});
  CHECK(toml.role_rules[1].phase.empty());
  CHECK(toml.role_rules[1].why.rfind("rule at p.toml:", 0) == 0);
  REQUIRE(toml.find(Metric::kGrowthPerStep, Scope::kActivation) != nullptr);
  CHECK(toml.find(Metric::kGrowthPerStep, Scope::kActivation)->value == 0);

  const Policy yaml = parse_policy_yaml("roles:\n  rules:\n    - role: gradient\n      frames: [\"py:accumulate\"]\n",
                                        "p.yaml", "");
  REQUIRE(yaml.role_rules.size() == 1);
  CHECK(yaml.role_rules[0].role == Role::kGradient);

  auto error = [](const char* text) {
    try {
      parse_policy_toml(text, "p.toml", "");
    } catch (const PolicyError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error("[[roles.rules]]\nrole = \"activations\"\n").find("p.toml:1: roles.rules[0].role: unknown role "
                                                                 "'activations'") != std::string::npos);
  CHECK(error("[[roles.rules]]\nframes = [\"py:x\"]\n").find("needs a role") != std::string::npos);
  CHECK(error("[[roles.rules]]\nrole = \"data\"\nframes = [\"x\"]\n").find("must start with py:") != std::string::npos);
  CHECK(error("[[roles.rules]]\nrole = \"data\"\ncolour = \"red\"\n").find("unknown key 'colour'") != std::string::npos);
  CHECK(error("[roles]\nrule = 1\n").find("unknown key 'rule' in roles") != std::string::npos);

  CHECK(parse_limit_flag(Metric::kGrowthPerStep, "activation=0").scope == Scope::kActivation);
  CHECK(parse_limit_flag(Metric::kSuspects, "optimizer_state=0").scope == Scope::kOptimizerState);
  CHECK_THROWS_AS(parse_limit_flag(Metric::kHeld, "activation=1MiB"), PolicyError);
  CHECK_THROWS_AS(parse_limit_flag(Metric::kGrowthPerStep, "activations=0"), PolicyError);
}
