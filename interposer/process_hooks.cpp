// The process life cycle: library constructor and destructor, the start of
// main, exec (the old image's trace is flushed, with a record naming the new
// image, before it is replaced) and _exit (which skips atexit handlers, so
// the final flush happens here).
//
// Exit status: __libc_start_main registers the loader's _dl_fini (which runs
// memledger's destructor, closing the trace) after the preload library's
// constructor has run, and exit handlers run last-registered first. A
// handler registered in the constructor would thus run after the trace was
// closed; the one registered at the start of main runs before _dl_fini, for
// exit() and for a return from main alike.

#include <alloca.h>
#include <cstdarg>
#include <cstdlib>
#include <dlfcn.h>
#include <unistd.h>

#include "recorder.h"

using memledger::interposer::recorder;

namespace {

template <typename Fn>
Fn next_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

void record_exit(int status, void*) { recorder().on_exit_status(status); }

__attribute__((constructor(101))) void memledger_init() {
  recorder().start();
  // For programs that never reach __libc_start_main's main (no C runtime
  // start-up): better late than never.
  on_exit(record_exit, nullptr);
}

__attribute__((destructor(101))) void memledger_fini() { recorder().finish(); }

using MainFn = int (*)(int, char**, char**);
MainFn g_real_main = nullptr;

int main_with_exit_record(int argc, char** argv, char** envp) {
  on_exit(record_exit, nullptr);
  return g_real_main(argc, argv, envp);
}

// The arguments of execl-style calls, up to the terminating NULL, as an
// argv array on the caller's stack (exec must not allocate: the caller may
// be a vfork child).
#define MEMLEDGER_COLLECT_ARGS(first, argv_out, after)                   \
  do {                                                                   \
    va_list count_ap;                                                    \
    va_start(count_ap, first);                                           \
    size_t n = 1;                                                        \
    while (va_arg(count_ap, char*) != nullptr) ++n;                      \
    va_end(count_ap);                                                    \
    argv_out = static_cast<char**>(alloca((n + 1) * sizeof(char*)));     \
    va_list ap;                                                          \
    va_start(ap, first);                                                 \
    argv_out[0] = const_cast<char*>(first);                              \
    for (size_t i = 1; i <= n; ++i) argv_out[i] = va_arg(ap, char*);     \
    after;                                                               \
    va_end(ap);                                                          \
  } while (0)

}  // namespace

#define MEMLEDGER_EXPORT extern "C" __attribute__((visibility("default")))

MEMLEDGER_EXPORT int __libc_start_main(MainFn main, int argc, char** argv, void (*init)(), void (*fini)(),
                                       void (*rtld_fini)(), void* stack_end) {
  static auto real = next_symbol<int (*)(MainFn, int, char**, void (*)(), void (*)(), void (*)(), void*)>(
      "__libc_start_main");
  g_real_main = main;
  return real(main_with_exit_record, argc, argv, init, fini, rtld_fini, stack_end);
}

MEMLEDGER_EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
  static auto real = next_symbol<int (*)(const char*, char* const[], char* const[])>("execve");
  recorder().on_exec(path);
  return real(path, argv, envp);
}

MEMLEDGER_EXPORT int execv(const char* path, char* const argv[]) {
  static auto real = next_symbol<int (*)(const char*, char* const[])>("execv");
  recorder().on_exec(path);
  return real(path, argv);
}

MEMLEDGER_EXPORT int execvp(const char* file, char* const argv[]) {
  static auto real = next_symbol<int (*)(const char*, char* const[])>("execvp");
  recorder().on_exec(file);
  return real(file, argv);
}

MEMLEDGER_EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
  static auto real = next_symbol<int (*)(const char*, char* const[], char* const[])>("execvpe");
  recorder().on_exec(file);
  return real(file, argv, envp);
}

// glibc's execl family calls its internal execve, never the exported one.
MEMLEDGER_EXPORT int execl(const char* path, const char* arg, ...) {
  char** argv;
  MEMLEDGER_COLLECT_ARGS(arg, argv, (void)0);
  return execv(path, argv);
}

MEMLEDGER_EXPORT int execlp(const char* file, const char* arg, ...) {
  char** argv;
  MEMLEDGER_COLLECT_ARGS(arg, argv, (void)0);
  return execvp(file, argv);
}

MEMLEDGER_EXPORT int execle(const char* path, const char* arg, ...) {
  char** argv;
  char** envp;
  MEMLEDGER_COLLECT_ARGS(arg, argv, envp = va_arg(ap, char**));
  return execve(path, argv, envp);
}

MEMLEDGER_EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) {
  static auto real = next_symbol<int (*)(int, char* const[], char* const[])>("fexecve");
  recorder().on_exec("(fexecve)");
  return real(fd, argv, envp);
}

MEMLEDGER_EXPORT void _exit(int status) {
  static auto real = next_symbol<void (*)(int)>("_exit");
  recorder().on_exit_status(status);
  real(status);
  __builtin_unreachable();
}

MEMLEDGER_EXPORT void _Exit(int status) { _exit(status); }
