/* busy_steps: a training loop under load, for the SIGKILL test. THREADS
 * worker threads allocate and free without pause (short-lived blocks from a
 * few call sites); the main thread ends a step every STEP_MS milliseconds,
 * leaking 4096 bytes per step, until it is killed.
 *
 *   busy_steps THREADS STEP_MS
 *
 * Output (flushed line by line): STEP_DONE i t_ns after step i's marker
 * returned (CLOCK_MONOTONIC). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*step_fn)(const char*);

static void* volatile g_sink;

__attribute__((noinline)) static void churn_small(unsigned* seed) {
  for (int i = 0; i < 64; ++i) {
    char* p = malloc(16 + (rand_r(seed) & 255));
    p[0] = (char)i;
    g_sink = p;
    free(p);
  }
}

__attribute__((noinline)) static void churn_large(unsigned* seed) {
  void* blocks[16];
  for (int i = 0; i < 16; ++i) blocks[i] = malloc(1024 + (rand_r(seed) & 4095));
  for (int i = 0; i < 16; ++i) free(blocks[i]);
}

static void* worker(void* arg) {
  unsigned seed = (unsigned)(size_t)arg;
  for (;;) {
    churn_small(&seed);
    churn_large(&seed);
  }
  return NULL;
}

static unsigned long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 4;
  const long step_ms = argc > 2 ? atol(argv[2]) : 20;
  step_fn step = (step_fn)dlsym(RTLD_DEFAULT, "memledger_step");
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("THREADS=%d\n", threads);
  for (int i = 0; i < threads; ++i) {
    pthread_t t;
    pthread_create(&t, NULL, worker, (void*)(size_t)(i + 1));
  }
  for (long s = 1;; ++s) {
    struct timespec pause = {step_ms / 1000, (step_ms % 1000) * 1000000};
    nanosleep(&pause, NULL);
    g_sink = malloc(4096);
    if (step) step("busy");
    printf("STEP_DONE %ld %llu\n", s, now_ns());
  }
}
