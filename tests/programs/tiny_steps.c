/* tiny_steps: a small C program with steps, short-lived allocations and a
 * leak, and nothing else live: no stdio buffer, no C++ runtime. Its trace
 * names only this program's own code, so a report on it (or on a damaged
 * copy of it) does not need libc's separate debug info: that keeps the fuzz
 * loop in test_damaged_traces.py fast.
 *
 *   tiny_steps [STEPS [SLEEP_MS]]     (default 12 steps, 5 ms apart)
 *
 * Each step makes 200 short-lived allocations and leaks 4096 bytes. */

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*step_fn)(const char*);

static void* volatile g_sink;
static void* g_leaked;

__attribute__((noinline)) static void leak(size_t bytes) {
  void** block = malloc(bytes);
  if (block == NULL) abort();
  memset(block, 1, bytes);
  block[0] = g_leaked;
  g_leaked = block;
}

__attribute__((noinline)) static void churn(int step) {
  for (int i = 0; i < 200; ++i) {
    char* p = malloc((size_t)(32 + (i * 7 + step) % 500));
    if (p == NULL) abort();
    p[0] = (char)i;
    g_sink = p;
    free(p);
  }
}

int main(int argc, char** argv) {
  const int steps = argc > 1 ? atoi(argv[1]) : 12;
  const long sleep_ms = argc > 2 ? atol(argv[2]) : 5;
  step_fn step = (step_fn)dlsym(RTLD_DEFAULT, "memledger_step");
  for (int s = 1; s <= steps; ++s) {
    churn(s);
    leak(4096);
    if (step) step("tiny");
    struct timespec pause = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000};
    while (nanosleep(&pause, &pause) != 0) {
    }
  }
  return 0;
}
