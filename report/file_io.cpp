#include "file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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

}  // namespace

bool read_regular_file(const std::string& path, std::string& out, std::string& error, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    error = path + ": " + std::strerror(errno);
    return false;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    error = path + ": not a regular file; not read";
    ::close(fd);
    return false;
  }
  out.clear();
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = path + ": " + std::strerror(errno);
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > max_bytes) {
      error = path + ": larger than " + std::to_string(max_bytes) + " bytes; not read";
      ::close(fd);
      return false;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return true;
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
