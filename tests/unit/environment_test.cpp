#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "environment.h"

using namespace memledger::report;

namespace {

// A trace holding the kInfo facts `facts` (key, value), as the preload
// library and the Python module write them.
Trace with_facts(const std::vector<std::pair<std::string, std::string>>& facts) {
  Trace t;
  uint32_t id = 1;
  for (const auto& [key, value] : facts) {
    TraceInfo info;
    info.key = id;
    t.strings[id++] = key;
    info.value = id;
    t.strings[id++] = value;
    t.info.push_back(info);
  }
  return t;
}

Verdict exited(int code) {
  Verdict v;
  v.kind = "exit";
  v.exit_code = code;
  v.summary = code == 0 ? "clean exit (code 0)" : "exited with code " + std::to_string(code);
  return v;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("environment: a framework built for another CUDA major than the runtime", "[environment]") {
  Trace t = with_facts({{"cuda.driver", "12.4"},
                        {"cuda.library", "/usr/lib/libcudart.so.12\t12.4"},
                        {"framework.torch.version", "2.9.0"},
                        {"framework.torch.cuda", "13.0"}});
  Environment env = read_environment(t);
  REQUIRE(env.libraries.size() == 1);
  CHECK(env.libraries[0].name == "libcudart");
  CHECK(env.libraries[0].major == 12);
  std::vector<std::string> notes;
  Verdict v = exited(0);
  judge_environment(env, v, notes);
  // Built for 13.0: neither the 12.4 runtime nor the 12.4 driver fits.
  REQUIRE(env.findings.size() == 2);
  CHECK(contains(env.findings[0], "PyTorch was built for CUDA 13.0 but the process runs the CUDA runtime 12.4"));
  CHECK(contains(env.findings[1], "the driver supports CUDA 12.4 only"));
  CHECK(v.kind == "exit");  // a clean exit: notes only
  CHECK(notes == env.findings);
}

TEST_CASE("environment: a likely finding is the verdict of a CUDA error, not of an unrelated exception",
          "[environment]") {
  const std::vector<std::pair<std::string, std::string>> facts = {
      {"cuda.library", "/a/libcublas.so.12\t12.8.4"}, {"cuda.library", "/b/libcublas.so.13\t13.0.0"}};
  {
    Trace t = with_facts(facts);
    Environment env = read_environment(t);
    std::vector<std::string> notes;
    Verdict v = exited(1);
    judge_environment(env, v, notes);
    CHECK(v.kind == "cuda_mismatch");
    CHECK(contains(v.summary, "two major versions of libcublas are loaded in one process: 12.8.4 (/a/libcublas.so.12) "
                              "and 13.0.0 (/b/libcublas.so.13)"));
    CHECK(contains(v.summary, "(exited with code 1)"));
    CHECK(notes.empty());
  }
  auto with_exception = facts;
  with_exception.push_back({"python.exception", "builtins.FileNotFoundError: data.csv"});
  Trace t = with_facts(with_exception);
  Environment env = read_environment(t);
  std::vector<std::string> notes;
  Verdict v = exited(1);
  judge_environment(env, v, notes);
  CHECK(v.summary == "exited with code 1");
  CHECK(notes.size() == 1);
}

TEST_CASE("environment: a newer runtime major than the driver's, without a failed call", "[environment]") {
  Trace t = with_facts({{"cuda.driver", "12.2"}, {"cuda.library", "/x/libcudart.so.13\t13.0"}});
  Environment env = read_environment(t);
  std::vector<std::string> notes;
  Verdict v = exited(0);
  judge_environment(env, v, notes);
  REQUIRE(notes.size() == 1);
  CHECK(contains(notes[0], "the CUDA runtime 13.0 (libcudart.so.13) is newer than the driver supports (CUDA 12.2)"));
  // The same major with a newer minor runs on minor-version compatibility.
  Trace same = with_facts({{"cuda.driver", "12.2"}, {"cuda.library", "/x/libcudart.so.12\t12.8"}});
  Environment env2 = read_environment(same);
  judge_environment(env2, v, notes);
  CHECK(env2.findings.empty());
}

TEST_CASE("environment: a framework's out-of-memory exception names the verdict", "[environment]") {
  Trace t = with_facts({{"cuda.library", "/x/libcuda.so.1\t13.0"},
                        {"python.exception", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}});
  Environment env = read_environment(t);
  std::vector<std::string> notes;
  Verdict v = exited(1);
  judge_environment(env, v, notes);
  CHECK(v.kind == "cuda_oom");
  CHECK(contains(v.summary, "GPU out of memory in PyTorch (2.00 GiB could not be allocated): the program raised "
                            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"));
  // A CUDA OOM the hooks saw gets the exception appended.
  Verdict oom;
  oom.kind = "cuda_oom";
  oom.summary = "CUDA out of memory: 2.0 GiB requested on device 0";
  judge_environment(env, oom, notes);
  CHECK(oom.summary == "CUDA out of memory: 2.0 GiB requested on device 0; the program raised "
                       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB");
}

TEST_CASE("environment: TensorFlow's and JAX's out-of-memory errors name the framework and the request",
          "[environment]") {
  const std::pair<const char*, const char*> cases[] = {
      {"tensorflow.python.framework.errors_impl.ResourceExhaustedError: {{function_node __wrapped__Mul}} OOM when "
       "allocating tensor with shape[1024,1024,4096] and type float on /job:localhost/replica:0/task:0/device:GPU:0 "
       "by allocator GPU_0_bfc [Op:Mul]",
       "GPU out of memory in TensorFlow (a tensor of shape [1024,1024,4096] (float) could not be allocated): the "
       "program raised tensorflow.python.framework.errors_impl.ResourceExhaustedError: "},
      {"jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
       "17179869184 bytes.",
       "GPU out of memory in JAX (16.0 GiB could not be allocated): the program raised "
       "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED"},
      {"jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory allocating 281474976710656 bytes",
       "GPU out of memory in JAX (256.0 TiB could not be allocated): "},
      {"builtins.MemoryError: out of memory", "GPU out of memory in the framework: the program raised builtins."},
  };
  for (const auto& [exception, expected] : cases) {
    Trace t = with_facts({{"cuda.library", "/x/libcuda.so.1\t13.0"}, {"python.exception", exception}});
    Environment env = read_environment(t);
    std::vector<std::string> notes;
    Verdict v = exited(1);
    judge_environment(env, v, notes);
    CHECK(v.kind == "cuda_oom");
    CHECK(contains(v.summary, expected));
    CHECK(contains(v.summary, "(exited with code 1)"));
  }
}
