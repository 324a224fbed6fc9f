#include "file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace memledger::report {
namespace {

bool write_all(int fd, std::string_view content, int& err) {
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      return false;
    }
    if (n == 0) {
      err = EIO;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}


// Opens PATH for reading if it is a regular file: O_NONBLOCK, because opening
// a FIFO for reading would otherwise wait for a writer. Returns the
// descriptor, or -1 with `error` set ("PATH: why").
int open_regular_file(const std::string& path, struct stat& st, std::string& error) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    error = path + ": " + std::strerror(errno);
    return -1;
  }
  if (fstat(fd, &st) != 0) {
    error = path + ": " + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    error = path + ": not a regular file (" +
            (S_ISDIR(st.st_mode)    ? "a folder"
             : S_ISFIFO(st.st_mode) ? "a FIFO"
             : S_ISSOCK(st.st_mode) ? "a socket"
                                    : "a device") +
            "); not read";
    ::close(fd);
    return -1;
  }
  return fd;
}

// Appends up to `limit` bytes read from `fd` to `out`; false with `err` set on
// a read error. Stops at the end of the file.
bool read_up_to(int fd, std::string& out, size_t limit, int& err) {
  char buf[65536];
  while (out.size() < limit) {
    const ssize_t n = ::read(fd, buf, std::min(sizeof buf, limit - out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      err = errno;
      return false;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return true;
}

std::string size_refusal(const std::string& path, size_t max_bytes) {
  return path + ": larger than " + std::to_string(max_bytes) + " bytes; not read";
}

}  // namespace

bool read_regular_file(const std::string& path, std::string& out, std::string& error, size_t max_bytes) {
  struct stat st;
  const int fd = open_regular_file(path, st, error);
  if (fd < 0) return false;
  out.clear();
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    error = size_refusal(path, max_bytes);
    ::close(fd);
    return false;
  }
  // One byte past the bound tells a file that grew while it was read.
  int err = 0;
  const bool ok = read_up_to(fd, out, max_bytes + 1, err);
  ::close(fd);
  if (!ok) {
    error = path + ": " + std::strerror(err);
    return false;
  }
  if (out.size() > max_bytes) {
    out.clear();
    error = size_refusal(path, max_bytes);
    return false;
  }
  return true;
}

bool read_regular_file_start(const std::string& path, std::string& out, std::string& error, size_t max_bytes) {
  struct stat st;
  const int fd = open_regular_file(path, st, error);
  if (fd < 0) return false;
  out.clear();
  int err = 0;
  const bool ok = read_up_to(fd, out, max_bytes, err);
  ::close(fd);
  if (!ok) error = path + ": " + std::strerror(err);
  return ok;
}

// Writes all of `content`, syncs and closes `fd`; false with `err` set on the
// first failure. A full disk can show only at the sync (delayed allocation) or
// the close (network filesystems).
static bool write_sync_close(int fd, std::string_view content, int& err) {
  bool ok = write_all(fd, content, err);
  if (ok && fsync(fd) != 0 && errno != EINVAL) {
    err = errno;
    ok = false;
  }
  if (::close(fd) != 0 && ok) {
    err = errno;
    ok = false;
  }
  return ok;
}

bool write_private_file(const std::string& path, std::string_view content, std::string& error) {
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());  // left by a run that was killed while writing
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    error = "cannot write " + path + ": " + std::strerror(errno);
    return false;
  }
  int err = 0;
  bool ok = write_sync_close(fd, content, err);
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ok = false;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    error = "cannot write " + path + ": " + std::strerror(err);
  }
  return ok;
}

bool overwrite_private_file(const std::string& path, std::string_view content, std::string& error) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    error = "cannot write " + path + ": " + std::strerror(errno);
    return false;
  }
  int err = 0;
  const bool ok = write_sync_close(fd, content, err);
  if (!ok) error = "cannot write " + path + ": " + std::strerror(err);
  return ok;
}

bool write_user_file(const std::string& path, std::string_view content, std::string& error) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    error = "cannot write " + path + ": " + std::strerror(errno);
    return false;
  }
  int err = 0;
  bool ok = write_all(fd, content, err);
  struct stat st;
  const bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (::close(fd) != 0 && ok) {
    err = errno;
    ok = false;
  }
  if (!ok) {
    // A cut report must not pass for a whole one.
    if (regular) ::unlink(path.c_str());
    error = "cannot write " + path + ": " + std::strerror(err);
  }
  return ok;
}

bool write_stream(std::FILE* stream, std::string_view content, std::string& error) {
  errno = 0;
  const size_t n = std::fwrite(content.data(), 1, content.size(), stream);
  if (n != content.size() || std::fflush(stream) != 0 || std::ferror(stream)) {
    error = std::strerror(errno != 0 ? errno : EIO);
    return false;
  }
  return true;
}

}  // namespace memledger::report
