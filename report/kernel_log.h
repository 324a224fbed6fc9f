// What the kernel said about a run's processes after they died: the OOM
// killer's own lines from the kernel log (/dev/kmsg), and how many OOM
// kills the memory cgroups the traces name had counted by then. Read by
// `memledger run` once the command has ended (nothing else knows the
// moment), kept in run.json ("kernel") and used by the stop verdict.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace memledger::report {

struct OomKillLine {
  int pid = 0;
  std::string text;  // the kernel's line, as printed
};

struct KernelLog {
  bool checked = false;   // memledger run looked (false: a report made from traces alone)
  bool readable = false;  // the kernel log could be read
  std::string why_not;    // when not: "/dev/kmsg: Operation not permitted"
  std::vector<OomKillLine> oom_kills;  // lines of the run's time naming a killed process
  // Memory cgroup directory (a trace header's "cgroup") -> its OOM kill
  // count once the command had ended.
  std::map<std::string, uint64_t> cgroup_oom_kills;

  // The OOM killer's line for `pid`, or null.
  const OomKillLine* line_for(int pid) const;
};

// The pid an OOM-killer line names ("Killed process 1234 (python3)",
// "oom-kill:...,task=python3,pid=1234,uid=0"), 0 when it names none.
int oom_killed_pid(const std::string& line);

// Reads the kernel log without blocking for the OOM killer's lines logged
// at or after `since_us` (microseconds since boot, the log's clock).
// `path`: /dev/kmsg, or a file of the same format.
KernelLog read_kernel_log(const std::string& path, uint64_t since_us);

// The oom_kill count of a memory cgroup directory (v2 memory.events, v1
// memory.oom_control); false when neither can be read.
bool read_cgroup_oom_kills(const std::string& dir, uint64_t* count);

nlohmann::json kernel_log_json(const KernelLog& log);
KernelLog kernel_log_from_json(const nlohmann::json& j);

}  // namespace memledger::report
