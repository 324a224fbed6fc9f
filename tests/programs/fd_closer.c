/* fd_closer: a program that closes every inherited descriptor, as daemons,
 * data loaders and subprocess(close_fds=True) children do, then takes
 * descriptor numbers of its own, low and high, for its files.
 *
 *   fd_closer DIR STEPS [--move-trace]
 *
 * Steps 1..STEPS/2 run first; then descriptors 3..4095 are closed; then
 * FILES files are opened in DIR (taking the lowest numbers) and each is also
 * dup2'ed onto high numbers (1200..1400 and near the descriptor limit), where
 * a tracer may have parked its own; then the remaining steps run, each
 * appending one line to every file. Each step leaks 4096 bytes.
 * --move-trace: after closing, also renames this process's trace file
 * ($MEMLEDGER_DIR/trace.PID.mlt to trace.PID.moved.mlt), so that a tracer
 * which lost its descriptor cannot open the file again.
 * Output: STEPS=n, FILES=n, then DONE at the end. */

#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

typedef void (*step_fn)(const char*);

enum { kFiles = 8, kHighCopies = 200 };
static void* volatile g_sink;

static void step_work(int s, step_fn step) {
  for (int i = 0; i < 100; ++i) {
    g_sink = malloc((size_t)(32 + (i * 7 + s) % 300));
    free(g_sink);
  }
  g_sink = malloc(4096); /* the leak */
  if (step) step("fd");
  struct timespec pause = {0, 20 * 1000000};
  nanosleep(&pause, NULL);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: fd_closer DIR STEPS\n");
    return 2;
  }
  const int steps = atoi(argv[2]);
  step_fn step = (step_fn)dlsym(RTLD_DEFAULT, "memledger_step");
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("STEPS=%d\n", steps); /* stdout's buffer is allocated before the first step */
  int s = 1;
  for (; s <= steps / 2; ++s) step_work(s, step);

  for (int fd = 3; fd < 4096; ++fd) close(fd);
  const char* run_dir = getenv("MEMLEDGER_DIR");
  if (argc > 3 && strcmp(argv[3], "--move-trace") == 0 && run_dir != NULL) {
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%s/trace.%d.mlt", run_dir, (int)getpid());
    snprintf(to, sizeof to, "%s/trace.%d.moved.mlt", run_dir, (int)getpid());
    if (rename(from, to) != 0) perror(from);
  }
  int fds[kFiles];
  for (int i = 0; i < kFiles; ++i) {
    char path[4096];
    snprintf(path, sizeof path, "%s/file%d.txt", argv[1], i);
    fds[i] = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fds[i] < 0) {
      perror(path);
      return 1;
    }
  }
  /* The program's own high descriptors: copies of its files. */
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  int high[2 * kHighCopies];
  int nhigh = 0;
  for (int k = 0; k < kHighCopies; ++k) {
    int target = 1200 + k;
    if (rl.rlim_cur != RLIM_INFINITY && (rlim_t)target >= rl.rlim_cur) break;
    high[nhigh++] = dup2(fds[k % kFiles], target);
  }
  for (int k = 1; k <= 70 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur > 100; ++k) {
    high[nhigh++] = dup2(fds[k % kFiles], (int)rl.rlim_cur - k);
  }
  printf("FILES=%d\n", kFiles);
  for (; s <= steps; ++s) {
    step_work(s, step);
    for (int i = 0; i < kFiles; ++i) {
      char line[64];
      int n = snprintf(line, sizeof line, "step %d file %d\n", s, i);
      if (write(fds[i], line, (size_t)n) != n) return 3;
    }
  }
  for (int k = 0; k < nhigh; ++k) close(high[k]);
  printf("DONE\n");
  return 0;
}
