// The process life cycle: library constructor and destructor, exec (the old
// image's trace is flushed before it is replaced) and _exit (which skips
// atexit handlers, so the final flush happens here).

#include <cstdarg>
#include <dlfcn.h>
#include <unistd.h>

#include "recorder.h"

using memledger::interposer::recorder;

namespace {

template <typename Fn>
Fn next_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

__attribute__((constructor(101))) void memledger_init() { recorder().start(); }

__attribute__((destructor(101))) void memledger_fini() { recorder().finish(); }

}  // namespace

#define MEMLEDGER_EXPORT extern "C" __attribute__((visibility("default")))

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
