#include "leak_mode.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "file_io.h"

extern char** environ;

namespace memledger::tools {
namespace {

// Reads the allow-list jaxlib checks the variable against
// (jaxlib/xla_client.py, generate_pjrt_gpu_plugin_options) without
// importing JAX, which takes seconds.
constexpr const char* kProbe =
    "import importlib.util, os\n"
    "s = importlib.util.find_spec('jaxlib')\n"
    "for d in (s.submodule_search_locations or []) if s else []:\n"
    "    p = os.path.join(d, 'xla_client.py')\n"
    "    if os.path.exists(p):\n"
    "        print('cuda_async' if \"'cuda_async'\" in open(p).read() else 'platform')\n"
    "        break\n";

// The probe runs untraced: without the preload library and memledger's own variables.
std::vector<char*> untraced_environment(std::vector<std::string>& storage) {
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "LD_PRELOAD=", 11) == 0 || std::strncmp(*e, "MEMLEDGER_", 10) == 0) continue;
    storage.emplace_back(*e);
  }
  std::vector<char*> env;
  for (std::string& s : storage) env.push_back(s.data());
  env.push_back(nullptr);
  return env;
}

// `python -c kProbe`'s first output line; empty when it fails or takes
// more than 10 s.
std::string run_probe(const std::string& python) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return {};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> storage;
  std::vector<char*> env = untraced_environment(storage);
  std::string arg0 = python, flag = "-c", code = kProbe;
  char* argv[] = {arg0.data(), flag.data(), code.data(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, python.c_str(), &actions, nullptr, argv, env.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  std::string text;
  if (spawned == 0) {
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int status = 0;
    bool done = false;
    while (!done) {
      char buf[256];
      ssize_t n;
      while ((n = read(out[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
      done = waitpid(pid, &status, WNOHANG) == pid;
      if (!done && std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        text.clear();
        break;
      }
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ssize_t n;
    char buf[256];
    while (done && (n = read(out[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  return text.substr(0, text.find('\n'));
}

// PyTorch's options without those that pick another backend.
std::string torch_leak_conf(const char* old) {
  std::string conf = "backend:cudaMallocAsync";
  if (old == nullptr) return conf;
  std::string rest = old;
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t comma = rest.find(',', pos);
    if (comma == std::string::npos) comma = rest.size();
    std::string item = rest.substr(pos, comma - pos);
    if (!item.empty() && item.rfind("backend:", 0) != 0 && item.rfind("expandable_segments:", 0) != 0) {
      conf += "," + item;
    }
    pos = comma + 1;
  }
  return conf;
}

}  // namespace

std::string jax_leak_allocator(const std::string& python) {
  return run_probe(python) == "cuda_async" ? "cuda_async" : "platform";
}

std::string command_python(const std::vector<std::string>& command) {
  if (command.empty()) return "python3";
  const std::string& program = command[0];
  const std::string base = program.substr(program.rfind('/') + 1);
  if (base.rfind("python", 0) == 0) return program;
  // A console script (torchrun, accelerate) names its interpreter.
  std::string path = program;
  if (path.find('/') == std::string::npos) {
    const char* dirs = std::getenv("PATH");
    std::string all = dirs ? dirs : "";
    for (size_t pos = 0; pos <= all.size();) {
      size_t colon = all.find(':', pos);
      if (colon == std::string::npos) colon = all.size();
      std::string candidate = all.substr(pos, colon - pos) + "/" + program;
      if (access(candidate.c_str(), X_OK) == 0) {
        path = candidate;
        break;
      }
      pos = colon + 1;
    }
  }
  // Only the "#!" line of a regular file is read: a FIFO on the PATH does
  // not hold memledger up.
  std::string line, error;
  if (report::read_regular_file_start(path, line, error, 256) && line.rfind("#!", 0) == 0) {
    line = line.substr(2, line.find('\n') == std::string::npos ? std::string::npos : line.find('\n') - 2);
    const size_t start = line.find_first_not_of(' ');
    if (start != std::string::npos) line = line.substr(start);
    const std::string interpreter = line.substr(0, line.find(' '));
    const std::string ibase = interpreter.substr(interpreter.rfind('/') + 1);
    if (ibase.rfind("python", 0) == 0) return interpreter;
    // "#!/usr/bin/env python3"
    if (ibase == "env" && line.find(' ') != std::string::npos) {
      std::string next = line.substr(line.find(' ') + 1);
      next = next.substr(0, next.find(' '));
      if (next.rfind("python", 0) == 0) return next;
    }
  }
  return "python3";
}

void set_leak_mode_environment(const std::vector<std::string>& command) {
  const char* newer = std::getenv("PYTORCH_ALLOC_CONF");
  const std::string conf = torch_leak_conf(newer != nullptr ? newer : std::getenv("PYTORCH_CUDA_ALLOC_CONF"));
  setenv("PYTORCH_ALLOC_CONF", conf.c_str(), 1);
  setenv("PYTORCH_CUDA_ALLOC_CONF", conf.c_str(), 1);
  setenv("TF_GPU_ALLOCATOR", "cuda_malloc_async", 1);
  setenv("XLA_PYTHON_CLIENT_ALLOCATOR", jax_leak_allocator(command_python(command)).c_str(), 1);
  setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false", 1);
}

}  // namespace memledger::tools
