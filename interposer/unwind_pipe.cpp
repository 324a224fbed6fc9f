// libunwind checks an address it is not sure of by writing one byte from it
// into a pipe that it keeps open for the life of the process, and makes a
// new pipe when a read from the old one fails (src/x86_64/Ginit.c,
// write_validate). That pipe takes the lowest free descriptors, the ones
// programs close (daemons, data loaders, close_fds=True children) and then
// reuse: libunwind would read a byte from the program's socket and write
// bytes into the program's file. The preload library is linked with --wrap
// for pipe2, read, close and syscall, so libunwind's calls (and only the
// library's own) come here: the pipe is parked high and checked (fstat)
// before each use; a pipe found closed or reused fails the check (libunwind
// then makes a new one), and a number that is no longer the pipe's is never
// closed.

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "trace_writer.h"

extern "C" {
int __real_pipe2(int fds[2], int flags);
ssize_t __real_read(int fd, void* buf, size_t count);
int __real_close(int fd);
long __real_syscall(long number, ...);
}

namespace memledger::interposer {
namespace {

struct PipeEnd {
  std::atomic<int> fd{-1};
  dev_t dev = 0;
  ino_t ino = 0;
};
PipeEnd g_ends[2];

PipeEnd* end_of(int fd) {
  if (fd < 0) return nullptr;
  for (PipeEnd& end : g_ends) {
    if (end.fd.load(std::memory_order_relaxed) == fd) return &end;
  }
  return nullptr;
}

// True when `fd` is one of the pipe's numbers but no longer the pipe.
bool taken_over(int fd) {
  PipeEnd* end = end_of(fd);
  if (end == nullptr) return false;
  struct stat st;
  return fstat(fd, &st) != 0 || st.st_dev != end->dev || st.st_ino != end->ino;
}

}  // namespace
}  // namespace memledger::interposer

using memledger::interposer::end_of;
using memledger::interposer::g_ends;
using memledger::interposer::taken_over;

extern "C" {

__attribute__((visibility("hidden"))) int __wrap_pipe2(int fds[2], int flags) {
  const int rc = __real_pipe2(fds, flags);
  if (rc != 0) return rc;
  for (int i = 0; i < 2; ++i) {
    fds[i] = memledger::interposer::move_fd_high(fds[i]);
    struct stat st;
    if (fstat(fds[i], &st) == 0) {
      g_ends[i].dev = st.st_dev;
      g_ends[i].ino = st.st_ino;
      g_ends[i].fd.store(fds[i], std::memory_order_relaxed);
    }
  }
  return 0;
}

__attribute__((visibility("hidden"))) ssize_t __wrap_read(int fd, void* buf, size_t count) {
  if (taken_over(fd)) {
    errno = EBADF;
    return -1;
  }
  return __real_read(fd, buf, count);
}

__attribute__((visibility("hidden"))) int __wrap_close(int fd) {
  if (auto* end = end_of(fd)) {
    const bool foreign = taken_over(fd);
    end->fd.store(-1, std::memory_order_relaxed);
    if (foreign) return 0;  // the program's now: leave it open
  }
  return __real_close(fd);
}

__attribute__((visibility("hidden"))) long __wrap_syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (long& v : a) v = va_arg(ap, long);
  va_end(ap);
  if (number == SYS_write && taken_over(static_cast<int>(a[0]))) {
    errno = EBADF;
    return -1;
  }
  return __real_syscall(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

}  // extern "C"
