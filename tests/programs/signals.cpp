// signals: ends (or survives) in one of several signal-related ways, so the
// tests can check that memledger leaves the outcome unchanged and names it.
//
//   signals MODE   MODE: segv | segv-deep | abort | term-self | term-in-loader | handler | python-style |
//                        vfork-reset
//
//   segv          null-pointer write in `crash_here`, the first
//                 instruction of the function                   -> SIGSEGV
//   segv-deep     null-pointer write in `crash_inside`, after
//                 other work in the same function               -> SIGSEGV
//   abort         abort()                                       -> SIGABRT
//   term-self     raise(SIGTERM) with the default action        -> SIGTERM
//   term-in-loader
//                 as term-self, from inside dl_iterate_phdr, 50 ms
//                 after it began: the thread holds the loader's
//                 lock, as a thread in dlopen() does (a Python
//                 import), and the tracer's threads come to wait
//                 for it                                        -> SIGTERM
//   handler       installs a SIGTERM handler after start-up, raises SIGTERM;
//                 the handler prints HANDLER_RAN and _exit(42)  -> exit 42
//   python-style  a SIGINT handler that sets a flag (as CPython does);
//                 raise(SIGINT), check the flag, go on          -> exit 0
//   vfork-reset   as handler, but first a vfork child resets SIGTERM to the
//                 default before it ends (as CPython's subprocess does
//                 before exec): the parent's handler still runs -> exit 42
//
// Every mode first runs three steps with a little allocation, printing
// STEP_DONE i. The segv modes print CRASH_LINE=N (the faulting line) first.

#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

using StepFn = void (*)(const char*);

int* volatile g_null = nullptr;
volatile int g_counter = 0;
volatile sig_atomic_t g_flag = 0;
void* volatile g_keep = nullptr;

constexpr int kCrashHereLine = __LINE__ + 2;
__attribute__((noinline, noipa)) void crash_here(int* target) {
  *target = 42;  // SIGSEGV at the function's first instruction
  __asm__ volatile("" ::: "memory");
}

constexpr int kCrashInsideLine = __LINE__ + 4;
__attribute__((noinline, noipa)) void crash_inside(int* target, int value) {
  g_counter = g_counter + value;  // a volatile load and store first
  g_counter = g_counter * 3;
  *target = g_counter;  // SIGSEGV
  __asm__ volatile("" ::: "memory");
}

void term_handler(int) {
  static const char text[] = "HANDLER_RAN\n";
  ssize_t ignored = write(STDOUT_FILENO, text, sizeof text - 1);
  (void)ignored;
  _exit(42);
}

void int_handler(int) { g_flag = 1; }

void install(int signo, void (*fn)(int)) {
  struct sigaction act;
  std::memset(&act, 0, sizeof act);
  act.sa_handler = fn;
  sigemptyset(&act.sa_mask);
  if (sigaction(signo, &act, nullptr) != 0) {
    std::perror("sigaction");
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s segv|segv-deep|abort|term-self|term-in-loader|handler|python-style|vfork-reset\n",
                 argv[0]);
    return 2;
  }
  const char* mode = argv[1];
  auto step = reinterpret_cast<StepFn>(dlsym(RTLD_DEFAULT, "memledger_step"));
  for (int i = 1; i <= 3; ++i) {
    void* p = std::malloc(4096);
    std::memset(p, i, 4096);
    g_keep = p;
    if (step) step("work");
    std::printf("STEP_DONE %d\n", i);
    std::fflush(stdout);
  }

  if (std::strcmp(mode, "segv") == 0) {
    std::printf("CRASH_LINE=%d\n", kCrashHereLine);
    std::fflush(stdout);
    crash_here(g_null);
    std::puts("NOT_REACHED");
    return 0;
  }
  if (std::strcmp(mode, "segv-deep") == 0) {
    std::printf("CRASH_LINE=%d\n", kCrashInsideLine);
    std::fflush(stdout);
    crash_inside(g_null, 5);
    std::puts("NOT_REACHED");
    return 0;
  }
  if (std::strcmp(mode, "abort") == 0) {
    std::abort();
  }
  if (std::strcmp(mode, "term-self") == 0) {
    raise(SIGTERM);
    std::puts("NOT_REACHED");
    return 0;
  }
  if (std::strcmp(mode, "term-in-loader") == 0) {
    dl_iterate_phdr(
        [](dl_phdr_info*, size_t, void*) -> int {
          usleep(50'000);
          raise(SIGTERM);
          return 1;
        },
        nullptr);
    std::puts("NOT_REACHED");
    return 0;
  }
  if (std::strcmp(mode, "handler") == 0) {
    install(SIGTERM, term_handler);
    raise(SIGTERM);
    std::puts("NOT_REACHED");
    return 0;
  }
  if (std::strcmp(mode, "vfork-reset") == 0) {
    install(SIGTERM, term_handler);
    const pid_t child = vfork();
    if (child == 0) {
      struct sigaction dfl;
      std::memset(&dfl, 0, sizeof dfl);
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      sigaction(SIGTERM, &dfl, nullptr);
      _exit(0);
    }
    int status = 0;
    if (child < 0 || waitpid(child, &status, 0) != child) {
      std::perror("vfork");
      return 1;
    }
    raise(SIGTERM);
    std::puts("NOT_REACHED");
    return 0;
  }
  if (std::strcmp(mode, "python-style") == 0) {
    install(SIGINT, int_handler);
    raise(SIGINT);
    if (!g_flag) {
      std::puts("FLAG_NOT_SET");
      return 1;
    }
    std::puts("FLAG_SET");
    void* p = std::malloc(100);
    std::free(p);
    std::puts("CONTINUED");
    return 0;
  }
  std::fprintf(stderr, "signals: unknown mode '%s'\n", mode);
  return 2;
}
