#include "kernel_log.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include "file_io.h"

namespace memledger::report {

namespace {

// The number after `key` in `line` (0: none).
int number_after(const std::string& line, const std::string& key) {
  const size_t at = line.find(key);
  if (at == std::string::npos) return 0;
  const char* p = line.c_str() + at + key.size();
  if (*p < '0' || *p > '9') return 0;
  return static_cast<int>(std::strtol(p, nullptr, 10));
}

// One record of the kernel log ("PRI,SEQ,TS_USEC,FLAGS;MESSAGE"): keeps an
// OOM killer's line of the run's time.
void take_record(const std::string& record, uint64_t since_us, KernelLog& log) {
  const size_t semi = record.find(';');
  if (semi == std::string::npos) return;
  const std::string prefix = record.substr(0, semi);
  const size_t c1 = prefix.find(',');
  const size_t c2 = c1 == std::string::npos ? c1 : prefix.find(',', c1 + 1);
  if (c2 == std::string::npos) return;
  const uint64_t ts = std::strtoull(prefix.c_str() + c2 + 1, nullptr, 10);
  if (ts < since_us) return;
  const std::string text = record.substr(semi + 1);
  const int pid = oom_killed_pid(text);
  if (pid == 0) return;
  for (OomKillLine& l : log.oom_kills) {
    if (l.pid != pid) continue;
    // "Killed process N (...) total-vm:..., anon-rss:..." says more than
    // the "oom-kill:constraint=..." summary before it.
    if (text.find("Killed process") != std::string::npos) l.text = text;
    return;
  }
  log.oom_kills.push_back({pid, text});
}

}  // namespace

const OomKillLine* KernelLog::line_for(int pid) const {
  for (const OomKillLine& l : oom_kills) {
    if (l.pid == pid) return &l;
  }
  return nullptr;
}

int oom_killed_pid(const std::string& line) {
  if (const int pid = number_after(line, "Killed process "); pid > 0) return pid;
  if (line.rfind("oom-kill:", 0) == 0) return number_after(line, ",pid=");
  return 0;
}

KernelLog read_kernel_log(const std::string& path, uint64_t since_us) {
  KernelLog log;
  log.checked = true;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    log.why_not = path + ": " + std::strerror(errno);
    return log;
  }
  // /dev/kmsg gives one record per read (EPIPE: records were overwritten
  // while reading, go on; EAGAIN: the end); a file of the same text gives
  // lines. Continuation lines (" KEY=VALUE") start with a space.
  std::string pending;
  char buf[8192];
  size_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EPIPE)) continue;
    if (n < 0 && errno != EAGAIN) {
      if (total == 0) log.why_not = path + ": " + std::strerror(errno);
      break;
    }
    if (n <= 0) break;
    total += static_cast<size_t>(n);
    pending.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      if (pending[start] != ' ') take_record(pending.substr(start, nl - start), since_us, log);
    }
    pending.erase(0, start);
    if (total > (size_t{64} << 20)) break;  // a log that never ends is not the kernel's
  }
  if (!pending.empty() && pending[0] != ' ') take_record(pending, since_us, log);
  ::close(fd);
  log.readable = log.why_not.empty();
  return log;
}

bool read_cgroup_oom_kills(const std::string& dir, uint64_t* count) {
  for (const char* name : {"memory.events", "memory.oom_control"}) {
    std::string text, error;
    if (!read_regular_file_start(dir + "/" + name, text, error, 4096)) continue;
    for (size_t at = 0; at < text.size();) {
      const size_t nl = std::min(text.find('\n', at), text.size());
      const std::string line = text.substr(at, nl - at);
      if (line.rfind("oom_kill ", 0) == 0) {
        *count = std::strtoull(line.c_str() + 9, nullptr, 10);
        return true;
      }
      at = nl + 1;
    }
  }
  return false;
}

nlohmann::json kernel_log_json(const KernelLog& log) {
  nlohmann::json lines = nlohmann::json::array();
  for (const OomKillLine& l : log.oom_kills) lines.push_back({{"pid", l.pid}, {"line", l.text}});
  nlohmann::json cgroups = nlohmann::json::object();
  for (const auto& [dir, count] : log.cgroup_oom_kills) cgroups[dir] = count;
  return {{"log_read", log.readable}, {"log_unreadable", log.why_not}, {"oom_kills", lines},
          {"cgroup_oom_kills", cgroups}};
}

KernelLog kernel_log_from_json(const nlohmann::json& j) {
  KernelLog log;
  if (!j.is_object()) return log;
  log.checked = true;
  log.readable = j.value("log_read", false);
  log.why_not = j.value("log_unreadable", "");
  if (j.contains("oom_kills") && j["oom_kills"].is_array()) {
    for (const nlohmann::json& l : j["oom_kills"]) {
      if (l.is_object()) log.oom_kills.push_back({l.value("pid", 0), l.value("line", "")});
    }
  }
  if (j.contains("cgroup_oom_kills") && j["cgroup_oom_kills"].is_object()) {
    for (const auto& [dir, count] : j["cgroup_oom_kills"].items()) {
      if (count.is_number_unsigned()) log.cgroup_oom_kills[dir] = count.get<uint64_t>();
    }
  }
  return log;
}

}  // namespace memledger::report
