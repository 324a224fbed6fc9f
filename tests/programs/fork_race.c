/* fork_race: forks while another thread of the program is inside
 * dl_iterate_phdr, i.e. while that thread holds glibc's loader lock. The
 * child inherits the lock locked, with no thread to release it; the child
 * itself only allocates a little and exits, which is fine untraced. A child
 * that has not exited after one second is counted as hung and killed.
 *
 *   fork_race [FORKS]        (default 5)
 *
 * Output: FORKS=N HUNG=N. Exit status 0 when no child hung, 1 otherwise.
 *
 * memledger's own writer thread is such a thread: it calls dl_iterate_phdr
 * in each of its cycles, so any fork() may land in that window. Here a
 * thread of the program holds the lock for 100 ms around each fork, which
 * makes the window certain (see test_fork_deadlock.py). */

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef void (*step_fn)(const char*);

static void* volatile g_sink;
static atomic_int g_inside;   /* the holder is inside dl_iterate_phdr */
static atomic_int g_release;  /* the main thread has forked */
static atomic_int g_stop;

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* Runs under glibc's dl_iterate_phdr lock: wait there until main has forked. */
static int hold_lock(struct dl_phdr_info* info, size_t size, void* data) {
  (void)info;
  (void)size;
  (void)data;
  atomic_store(&g_inside, 1);
  for (int i = 0; i < 100 && !atomic_load(&g_release); ++i) sleep_us(1000);
  return 1;
}

static void* holder(void* arg) {
  (void)arg;
  while (!atomic_load(&g_stop)) {
    if (!atomic_load(&g_release)) dl_iterate_phdr(hold_lock, NULL);
    sleep_us(1000);
  }
  return NULL;
}

__attribute__((noinline)) static void child_work(void) {
  for (int i = 0; i < 10; ++i) g_sink = malloc((size_t)(100 + i));
}

int main(int argc, char** argv) {
  const int forks = argc > 1 ? atoi(argv[1]) : 5;
  step_fn step = (step_fn)dlsym(RTLD_DEFAULT, "memledger_step");
  int hung = 0;
  for (int i = 0; i < forks; ++i) {
    if (step) step("fork");
    atomic_store(&g_inside, 0);
    atomic_store(&g_release, 0);
    pthread_t thread;
    atomic_store(&g_stop, 0);
    if (pthread_create(&thread, NULL, holder, NULL) != 0) return 2;
    while (!atomic_load(&g_inside)) sleep_us(100);
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 2;
    }
    if (pid == 0) {
      child_work();
      _exit(0);
    }
    atomic_store(&g_release, 1);
    atomic_store(&g_stop, 1);
    pthread_join(thread, NULL);
    int status = 0, done = 0;
    for (int t = 0; t < 100 && !done; ++t) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        done = 1;
      } else {
        sleep_us(10000);
      }
    }
    if (!done) {
      ++hung;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
  }
  printf("FORKS=%d\nHUNG=%d\n", forks, hung);
  return hung != 0;
}
