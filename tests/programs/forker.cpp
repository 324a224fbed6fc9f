// forker: a parent with its own planted leak that forks a child (which leaks
// something else and marks its own steps), forks and execs another program,
// and starts one with posix_spawn. Each process must get its own trace, and
// no process's allocations may show up in another's.
//
//   forker PROGRAM [ARGS...]
//
// PROGRAM ARGS... is run twice: once by fork + execv, once by posix_spawn.
//
// The parent marks 8 steps and leaks kParentLeak bytes in `parent_leak`
// before each; the forked child marks kChildSteps steps and leaks
// kChildLeak bytes in `child_leak` before each, then exits 0.
//
// Output (stdout, flushed): PARENT_PID=, PARENT_LEAK=, PARENT_LEAK_LINE=,
// PARENT_STEPS=, CHILD_LEAK=, CHILD_LEAK_LINE=, CHILD_STEPS=, CHILD_PID=,
// EXEC_PID=, SPAWN_PID=, and
// CHILD_STATUS= / EXEC_STATUS= / SPAWN_STATUS= (exit codes).

#include <dlfcn.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace {

using StepFn = void (*)(const char*);

constexpr size_t kParentLeak = 8192;
constexpr int kParentSteps = 8;
constexpr size_t kChildLeak = 20000;
constexpr int kChildSteps = 10;

// volatile: GCC drops a malloc whose block is never read.
void* volatile g_parent_blocks[kParentSteps + 1];
void* volatile g_child_blocks[kChildSteps + 1];
void* volatile g_sink = nullptr;

// Each leak's malloc is on the line its constant names (printed at start-up).
constexpr int kParentLeakLine = __LINE__ + 2;
__attribute__((noinline, noipa)) void parent_leak(int step) {
  void* block = std::malloc(kParentLeak);  // PARENT LEAK
  std::memset(block, 1, kParentLeak);
  g_parent_blocks[step] = block;
}

constexpr int kChildLeakLine = __LINE__ + 2;
__attribute__((noinline, noipa)) void child_leak(int step) {
  void* block = std::malloc(kChildLeak);  // CHILD LEAK
  std::memset(block, 2, kChildLeak);
  g_child_blocks[step] = block;
}

// Short-lived churn, so that every step has some traffic.
__attribute__((noinline)) size_t churn(int n) {
  size_t total = 0;
  for (int i = 0; i < n; ++i) {
    char* p = static_cast<char*>(std::malloc(static_cast<size_t>(64 + i % 512)));
    p[0] = static_cast<char>(i);
    g_sink = p;
    total += static_cast<unsigned char>(p[0]);
    std::free(p);
  }
  return total;
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PROGRAM [ARGS...]\n", argv[0]);
    return 2;
  }
  auto step = reinterpret_cast<StepFn>(dlsym(RTLD_DEFAULT, "memledger_step"));
  std::printf(
      "PARENT_PID=%d\nPARENT_LEAK=%zu\nPARENT_LEAK_LINE=%d\nPARENT_STEPS=%d\n"
      "CHILD_LEAK=%zu\nCHILD_LEAK_LINE=%d\nCHILD_STEPS=%d\n",
      static_cast<int>(getpid()), kParentLeak, kParentLeakLine, kParentSteps, kChildLeak, kChildLeakLine, kChildSteps);
  std::fflush(stdout);

  // One loop, so that every parent step allocates from the same call stack
  // (a site is a whole stack: eight inlined call sites would be eight sites).
  pid_t child = 0, exec_child = 0, spawned = 0;
  for (int s = 1; s <= kParentSteps; ++s) {
    churn(200);
    parent_leak(s);
    if (step) step("parent");
    if (s == 2) {
      // 1. A forked child that leaks something else and marks its own steps.
      child = fork();
      if (child < 0) {
        std::perror("fork");
        return 1;
      }
      if (child == 0) {
        for (int c = 1; c <= kChildSteps; ++c) {
          churn(100);
          child_leak(c);
          if (step) step("child");
        }
        std::exit(0);
      }
      std::printf("CHILD_PID=%d\n", static_cast<int>(child));
    } else if (s == 4) {
      // 2. fork + exec of another program.
      exec_child = fork();
      if (exec_child < 0) {
        std::perror("fork");
        return 1;
      }
      if (exec_child == 0) {
        execv(argv[1], argv + 1);
        std::perror("execv");
        _exit(127);
      }
      std::printf("EXEC_PID=%d\n", static_cast<int>(exec_child));
    } else if (s == 6) {
      // 3. posix_spawn of the same program.
      int rc = posix_spawn(&spawned, argv[1], nullptr, nullptr, argv + 1, environ);
      if (rc != 0) {
        std::fprintf(stderr, "posix_spawn: %s\n", std::strerror(rc));
        return 1;
      }
      std::printf("SPAWN_PID=%d\n", static_cast<int>(spawned));
    }
    std::fflush(stdout);
  }

  int status = 0;
  waitpid(child, &status, 0);
  std::printf("CHILD_STATUS=%d\n", exit_code(status));
  waitpid(exec_child, &status, 0);
  std::printf("EXEC_STATUS=%d\n", exit_code(status));
  waitpid(spawned, &status, 0);
  std::printf("SPAWN_STATUS=%d\n", exit_code(status));
  return 0;
}
