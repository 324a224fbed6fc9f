/* child_endings: forks children that end in the ways a job's processes do,
 * for the tests of per-process verdicts. Each child's pid and the status the
 * parent's waitpid saw are printed, so the test can hold every trace's
 * verdict against the truth.
 *
 *   child_endings EXIT_CODE_PROGRAM
 *
 * Children, in order (NAME_PID=pid NAME_STATUS=waitpid status):
 *   EXIT_FOUR   exit(4) after a few allocations
 *   UNDERSCORE_EXIT  _exit(5)
 *   EXECL   execl("/bin/true") at once after fork (no allocation in between)
 *   FALSE   execlp("false"): the new image exits with 1
 *   RETURN_THREE execv(EXIT_CODE_PROGRAM 3): the new image returns 3 from main
 *   KILLED  raises SIGKILL on itself (the one death no trace can record)
 * The parent itself exits with 17.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void* volatile g_sink;

static void report(const char* name, pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  printf("%s_PID=%d\n%s_STATUS=%d\n", name, (int)pid, name, status);
  fflush(stdout);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: child_endings EXIT_CODE_PROGRAM\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (int i = 0; i < 100; ++i) g_sink = malloc(64 + i);

  pid_t pid = fork();
  if (pid == 0) {
    for (int i = 0; i < 100; ++i) g_sink = malloc(32);
    exit(4);
  }
  report("EXIT_FOUR", pid);

  pid = fork();
  if (pid == 0) _exit(5);
  report("UNDERSCORE_EXIT", pid);

  pid = fork();
  if (pid == 0) {
    execl("/bin/true", "true", (char*)NULL);
    _exit(127);
  }
  report("EXECL", pid);

  pid = fork();
  if (pid == 0) {
    execlp("false", "false", (char*)NULL);
    _exit(127);
  }
  report("FALSE", pid);

  pid = fork();
  if (pid == 0) {
    char* args[] = {argv[1], (char*)"3", NULL};
    execv(argv[1], args);
    _exit(127);
  }
  report("RETURN_THREE", pid);

  pid = fork();
  if (pid == 0) {
    g_sink = malloc(100);
    raise(SIGKILL);
    _exit(126);
  }
  report("KILLED", pid);
  return 17;
}
