// libFuzzer target for the trace reader: any bytes given as a trace file are
// read in both ways the report reads them (whole, and streamed) and printed
// as `memledger dump` prints them. A crash, a sanitizer report, a hang or
// memory past -rss_limit_mb is a bug; a TraceError is a clear refusal.

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "trace_reader.h"

namespace {

// The reader takes a path (it maps the file): the input goes into a memfd.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("trace", MFD_CLOEXEC);
    size_t done = 0;
    while (fd_ >= 0 && done < size) {
      const ssize_t n = write(fd_, data + done, size - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() {
    if (fd_ >= 0) close(fd_);
  }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using memledger::report::TraceError;
  MemFile file(data, size);
  try {
    memledger::report::Trace whole = memledger::report::read_trace(file.path(), true);
    uint64_t seq = 0;
    for (const auto& e : whole.events) seq ^= e.seq;
    (void)seq;
  } catch (const TraceError&) {
  }
  try {
    memledger::report::Trace streamed = memledger::report::read_trace(file.path(), false);
    size_t events = 0;
    memledger::report::stream_trace(streamed, [&](const memledger::report::TraceEvent*, size_t n) { events += n; });
  } catch (const TraceError&) {
  }
  static std::FILE* sink = std::fopen("/dev/null", "w");
  try {
    memledger::report::dump_trace(file.path(), sink);
  } catch (const TraceError&) {
  }
  return 0;
}
