#include "pressure_sampler.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include "trace_format.h"

namespace memledger::interposer {

namespace {

void open_file(OwnedFile& file, const char* path) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) file.adopt(fd, path, O_RDONLY);
}

bool readable(const char* dir, const char* name) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return access(path, R_OK) == 0;
}

// A v1 line's controller list ("cpu,memory") between `from` and `to`.
bool lists_memory(const char* from, const char* to) {
  for (const char* c = from; c < to;) {
    const char* comma = static_cast<const char*>(memchr(c, ',', static_cast<size_t>(to - c)));
    const char* end = comma != nullptr ? comma : to;
    if (end - c == 6 && strncmp(c, "memory", 6) == 0) return true;
    c = end + 1;
  }
  return false;
}

}  // namespace

void PressureSampler::open() {
  close();
  open_file(meminfo_, "/proc/meminfo");
  open_file(vmstat_, "/proc/vmstat");
  open_file(psi_, "/proc/pressure/memory");

  // The memory cgroup: v2 ("0::REL"), else v1's memory controller
  // ("N:...memory...:REL"). In a cgroup namespace REL is "/" and
  // /sys/fs/cgroup is the container's own cgroup.
  cgroup_dir_[0] = '\0';
  bool v2 = false;
  int fd = ::open("/proc/self/cgroup", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n;
    do {
      n = ::read(fd, buf_, sizeof buf_ - 1);
    } while (n < 0 && errno == EINTR);
    ::close(fd);
    buf_[n > 0 ? n : 0] = '\0';
    char v1_dir[sizeof cgroup_dir_] = {};
    for (char* line = buf_; line != nullptr && *line != '\0';) {
      char* next = strchr(line, '\n');
      if (next != nullptr) *next++ = '\0';
      const char* colon = strchr(line, ':');
      const char* colon2 = colon != nullptr ? strchr(colon + 1, ':') : nullptr;
      if (colon2 != nullptr) {
        const char* rel = colon2 + 1;
        if (strcmp(rel, "/") == 0) rel = "";
        const bool is_v2 = colon2 == colon + 1 && strncmp(line, "0:", 2) == 0;
        char dir[sizeof cgroup_dir_];
        if (is_v2) {
          snprintf(dir, sizeof dir, "/sys/fs/cgroup%s", rel);
          if (!readable(dir, "memory.max")) snprintf(dir, sizeof dir, "/sys/fs/cgroup");
          if (readable(dir, "memory.max")) {
            snprintf(cgroup_dir_, sizeof cgroup_dir_, "%s", dir);
            v2 = true;
          }
        } else if (lists_memory(colon + 1, colon2)) {
          snprintf(dir, sizeof dir, "/sys/fs/cgroup/memory%s", rel);
          if (readable(dir, "memory.limit_in_bytes")) snprintf(v1_dir, sizeof v1_dir, "%s", dir);
        }
      }
      line = next;
    }
    if (!v2 && v1_dir[0] != '\0') snprintf(cgroup_dir_, sizeof cgroup_dir_, "%s", v1_dir);
  }
  if (cgroup_dir_[0] != '\0') {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", cgroup_dir_, v2 ? "memory.max" : "memory.limit_in_bytes");
    open_file(limit_, path);
    snprintf(path, sizeof path, "%s/%s", cgroup_dir_, v2 ? "memory.current" : "memory.usage_in_bytes");
    open_file(usage_, path);
    snprintf(path, sizeof path, "%s/%s", cgroup_dir_, v2 ? "memory.events" : "memory.oom_control");
    open_file(events_, path);
  }
}

void PressureSampler::close() {
  for (OwnedFile* f : {&meminfo_, &vmstat_, &psi_, &limit_, &usage_, &events_}) f->close();
}

bool PressureSampler::read_file(OwnedFile& file) {
  const int fd = file.verified();
  if (fd < 0) return false;
  // A kernel file comes whole in one read when the buffer holds it; a read
  // at a later offset would make the kernel format it all again.
  size_t total = 0;
  while (total + 1 < sizeof buf_) {
    const ssize_t n = pread(fd, buf_ + total, sizeof buf_ - 1 - total, static_cast<off_t>(total));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    total += static_cast<size_t>(n);
    if (total < sizeof buf_ / 2) break;
  }
  buf_[total] = '\0';
  return total > 0;
}

void PressureSampler::read(PressureReading* out, bool with_vmstat) {
  *out = PressureReading{};
  if (read_file(meminfo_) && parse_meminfo(buf_, &out->mem)) out->present |= format::kPressureMeminfo;
  if (with_vmstat && read_file(vmstat_) && parse_vmstat(buf_, &out->swap_in, &out->swap_out)) {
    out->present |= format::kPressureVmstat;
  }
  if (read_file(psi_) && parse_psi(buf_, &out->psi)) out->present |= format::kPressurePsi;
  if (read_file(events_) && parse_oom_kills(buf_, &out->cgroup_oom_kills)) {
    out->present |= format::kPressureCgroupEvents;
  }
}

void PressureSampler::read_cgroup(uint64_t* limit, uint64_t* usage) {
  *limit = read_file(limit_) ? parse_cgroup_bytes(buf_) : 0;
  *usage = read_file(usage_) ? parse_cgroup_bytes(buf_) : 0;
}

}  // namespace memledger::interposer
