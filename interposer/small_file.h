// A small file read whole with raw system calls: no stdio, no heap, safe in
// a signal handler (open, read and close only).
#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

namespace memledger::interposer {

// Reads at most `size` - 1 bytes of `path` into `buf` and ends them with a
// NUL. Returns how many it read, -1 when the file cannot be opened.
inline ssize_t read_small_file(const char* path, char* buf, size_t size) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t total = 0;
  while (static_cast<size_t>(total) + 1 < size) {
    const ssize_t n = ::read(fd, buf + total, size - 1 - static_cast<size_t>(total));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    total += n;
  }
  ::close(fd);
  buf[total] = '\0';
  return total;
}

}  // namespace memledger::interposer
