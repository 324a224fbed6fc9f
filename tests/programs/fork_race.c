/* fork_race: forks while another thread of the program holds a lock the
 * child would inherit held, with no thread to release it. The child itself
 * only allocates a little and exits, which is fine untraced. A child that
 * has not exited in time is counted as hung and killed.
 *
 *   fork_race [FORKS] [loader|sigaction]     (default 5, loader)
 *
 * loader: the other thread is inside dl_iterate_phdr, i.e. holds glibc's
 * loader lock, for 100 ms around each fork, which makes the window certain.
 * memledger's own writer thread is such a thread: it calls dl_iterate_phdr
 * in each of its cycles, so any fork() may land in that window. A child
 * that has not exited after one second is counted as hung.
 *
 * sigaction: the other thread sets SIGTERM's action without pause, so that
 * most forks land while it is inside sigaction(); each child sets it too.
 * memledger interposes sigaction() for the signals it watches and keeps the
 * program's actions under a lock. A child that has not exited after five
 * seconds is counted as hung.
 *
 * Output: FORKS=N HUNG=N. Exit status 0 when no child hung, 1 otherwise.
 * See test_fork_deadlock.py. */

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef void (*step_fn)(const char*);

static void* volatile g_sink;
static atomic_int g_inside;   /* the holder is inside dl_iterate_phdr */
static atomic_int g_release;  /* the main thread has forked */
static atomic_int g_stop;
static atomic_long g_calls;   /* sigaction() calls made by the setter */

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

static void on_term(int signo) { (void)signo; }

static void set_action(void) {
  struct sigaction act;
  memset(&act, 0, sizeof act);
  act.sa_handler = on_term;
  sigemptyset(&act.sa_mask);
  sigaction(SIGTERM, &act, NULL);
}

static void* setter(void* arg) {
  (void)arg;
  while (!atomic_load(&g_stop)) {
    set_action();
    atomic_fetch_add(&g_calls, 1);
  }
  return NULL;
}

__attribute__((noinline)) static void child_work(int sigaction_mode) {
  if (sigaction_mode) set_action();
  for (int i = 0; i < 10; ++i) g_sink = malloc((size_t)(100 + i));
}

/* Waits up to `tenths` x 10 ms for the child; kills it then. Whether it hung. */
static int hung_child(pid_t pid, int tenths) {
  int status = 0;
  for (int t = 0; t < tenths; ++t) {
    if (waitpid(pid, &status, WNOHANG) == pid) return 0;
    sleep_us(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return 1;
}

int main(int argc, char** argv) {
  const int forks = argc > 1 ? atoi(argv[1]) : 5;
  const int sigaction_mode = argc > 2 && strcmp(argv[2], "sigaction") == 0;
  step_fn step = (step_fn)dlsym(RTLD_DEFAULT, "memledger_step");
  pthread_t thread;
  if (sigaction_mode) {
    if (pthread_create(&thread, NULL, setter, NULL) != 0) return 2;
    while (atomic_load(&g_calls) < 1000) sleep_us(100);
  }
  int hung = 0;
  for (int i = 0; i < forks; ++i) {
    if (step) step("fork");
    if (!sigaction_mode) {
      atomic_store(&g_inside, 0);
      atomic_store(&g_release, 0);
      atomic_store(&g_stop, 0);
      if (pthread_create(&thread, NULL, holder, NULL) != 0) return 2;
      while (!atomic_load(&g_inside)) sleep_us(100);
    }
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 2;
    }
    if (pid == 0) {
      child_work(sigaction_mode);
      _exit(0);
    }
    if (!sigaction_mode) {
      atomic_store(&g_release, 1);
      atomic_store(&g_stop, 1);
      pthread_join(thread, NULL);
    }
    hung += hung_child(pid, sigaction_mode ? 500 : 100);
  }
  if (sigaction_mode) {
    atomic_store(&g_stop, 1);
    pthread_join(thread, NULL);
  }
  printf("FORKS=%d\nHUNG=%d\n", forks, hung);
  return hung != 0;
}
