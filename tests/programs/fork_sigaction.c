/* fork_sigaction: forks while another thread of the program sets a signal's
 * action over and over, so that most forks land while that thread is inside
 * sigaction(). Each child sets the action too, allocates a little and exits.
 * A child that has not exited after five seconds is counted as hung and
 * killed.
 *
 *   fork_sigaction [FORKS]        (default 50)
 *
 * Output: FORKS=N HUNG=N. Exit status 0 when no child hung, 1 otherwise.
 *
 * memledger interposes sigaction() for the signals it watches (SIGTERM among
 * them) and keeps the program's actions under a lock: a child that inherits
 * that lock held, by a thread it does not have, would wait on it forever at
 * its first sigaction() (see test_fork_deadlock.py). */

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void* volatile g_sink;
static atomic_int g_stop;
static atomic_long g_calls;

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

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

__attribute__((noinline)) static void child_work(void) {
  set_action();
  for (int i = 0; i < 10; ++i) g_sink = malloc((size_t)(100 + i));
}

int main(int argc, char** argv) {
  const int forks = argc > 1 ? atoi(argv[1]) : 50;
  pthread_t thread;
  if (pthread_create(&thread, NULL, setter, NULL) != 0) return 2;
  while (atomic_load(&g_calls) < 1000) sleep_us(100);
  int hung = 0;
  for (int i = 0; i < forks; ++i) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 2;
    }
    if (pid == 0) {
      child_work();
      _exit(0);
    }
    int status = 0, done = 0;
    for (int t = 0; t < 500 && !done; ++t) {
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
  atomic_store(&g_stop, 1);
  pthread_join(thread, NULL);
  printf("FORKS=%d\nHUNG=%d\n", forks, hung);
  return hung != 0;
}
