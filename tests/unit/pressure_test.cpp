#include <catch2/catch.hpp>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>

#include "kernel_log.h"
#include "pressure.h"
#include "pressure_parse.h"
#include "trace_format.h"
#include "verdict.h"

using namespace memledger::report;
namespace fmt = memledger::format;
using memledger::interposer::Meminfo;
using memledger::interposer::Psi;

namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

// A pressure record every 100 ms from `from_s` for `seconds`: MemAvailable
// `available`, `swap_in_pages` pages swapped in per record, PSI full
// stalled `full_share` of each interval.
void records(Trace& trace, double from_s, double seconds, uint64_t available, uint64_t swap_in_pages,
             double full_share) {
  uint64_t swap_in = trace.pressure.empty() ? 1000 : trace.pressure.back().swap_in;
  uint64_t full = trace.pressure.empty() ? 5000 : trace.pressure.back().psi_full_total;
  const int n = static_cast<int>(seconds * 10 + 0.5);
  for (int i = 0; i < n; ++i) {
    TracePressure p;
    p.ts = static_cast<uint64_t>((from_s + i * 0.1) * 1e9);
    p.present = fmt::kPressureMeminfo | fmt::kPressureVmstat | fmt::kPressurePsi | fmt::kPressureCgroupEvents;
    p.mem_total = 16 * kGiB;
    p.mem_available = available;
    p.swap_total = 8 * kGiB;
    p.swap_free = 2 * kGiB;
    swap_in += swap_in_pages;
    full += static_cast<uint64_t>(full_share * 100000);  // of 100 ms, in microseconds
    p.swap_in = swap_in;
    p.psi_full_total = full;
    p.psi_full_avg10 = static_cast<uint32_t>(full_share * 10000);
    trace.pressure.push_back(p);
  }
}

Trace killed_trace(uint64_t rss, uint64_t limit, uint64_t usage) {
  Trace trace;
  trace.header["pid"] = "4242";
  trace.header["cgroup"] = "/sys/fs/cgroup/job";
  TraceSample s;
  s.rss = rss;
  s.cgroup_limit = limit;
  s.cgroup_usage = usage;
  trace.samples.push_back(s);
  return trace;
}

ExitInfo sigkill(const KernelLog* kernel = nullptr) {
  ExitInfo info;
  info.known = info.signaled = true;
  info.signo = SIGKILL;
  info.kernel = kernel;
  return info;
}

KernelLog log_read() {
  KernelLog log;
  log.checked = log.readable = true;
  return log;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("pressure: the kernel files are parsed as the kernel prints them", "[pressure]") {
  Meminfo m;
  REQUIRE(memledger::interposer::parse_meminfo("MemTotal:       24576000 kB\nMemFree:  100 kB\n"
                                               "MemAvailable:    1024 kB\nBuffers: 1 kB\nSwapTotal:  2048 kB\n"
                                               "SwapFree:        1024 kB\n",
                                               &m));
  CHECK(m.total == 24576000ull * 1024);
  CHECK(m.available == 1024 * 1024);
  CHECK(m.swap_total == 2048 * 1024);
  CHECK(m.swap_free == 1024 * 1024);
  CHECK_FALSE(memledger::interposer::parse_meminfo("MemTotal: 10 kB\nMemFree: 5 kB\n", &m));  // before Linux 3.14

  uint64_t in = 0, out = 0;
  REQUIRE(memledger::interposer::parse_vmstat("nr_free_pages 5\npswpin 17\npswpout 23\npswpin_zero 4\n", &in, &out));
  CHECK(in == 17);
  CHECK(out == 23);

  Psi psi;
  REQUIRE(memledger::interposer::parse_psi("some avg10=12.34 avg60=1.00 avg300=0.50 total=987654\n"
                                           "full avg10=0.07 avg60=0.00 avg300=0.00 total=321\n",
                                           &psi));
  CHECK(psi.some_avg10 == 1234);
  CHECK(psi.full_avg10 == 7);
  CHECK(psi.some_total == 987654);
  CHECK(psi.full_total == 321);
  CHECK_FALSE(memledger::interposer::parse_psi("some avg10=1.00 avg60=0 avg300=0 total=1\n", &psi));

  uint64_t kills = 0;
  CHECK(memledger::interposer::parse_oom_kills("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n", &kills));
  CHECK(kills == 2);
  CHECK(memledger::interposer::parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n", &kills));  // v1
  CHECK(kills == 5);
  CHECK(memledger::interposer::parse_cgroup_bytes("max\n") == 0);
  CHECK(memledger::interposer::parse_cgroup_bytes("9223372036854771712\n") == 0);  // v1's "unlimited"
  CHECK(memledger::interposer::parse_cgroup_bytes("536870912\n") == 512 * kMiB);
}

TEST_CASE("pressure: the last 40 s of hard swapping are the freeze", "[pressure]") {
  Trace trace;
  records(trace, 0, 20, 8 * kGiB, 0, 0);                 // calm
  records(trace, 20, 40, 100 * kMiB, 2560, 0.6);         // 10 MiB per 100 ms swapped in, stalled 60%
  HostPressure h = summarize_pressure(trace);
  REQUIRE(h.sampled);
  CHECK(h.freeze_seconds == Approx(40).margin(0.2));
  CHECK(h.max_swap_in == Approx(100.0 * kMiB).epsilon(0.01));
  CHECK(h.min_available == 100 * kMiB);
  CHECK(h.max_swap_used == 6 * kGiB);
  CHECK(h.freeze.rfind("the system was swapping hard for the last 40 s of the run (pages swapped in at 100.0 MiB/s, "
                       "every task stalled on memory 60% of the time, MemAvailable 100.0 MiB of 16.0 GiB, swap 6.0 GiB "
                       "used of 8.0 GiB at the end): that is the freeze",
                       0) == 0);
  // Killed from outside (by the user, or the OOM killer): the verdict says it.
  Verdict v;
  v.kind = "signal";
  v.summary = "terminated by SIGINT";
  std::vector<std::string> notes;
  judge_pressure(h, v, notes);
  CHECK(v.summary.rfind("terminated by SIGINT; the system was swapping hard for the last 40 s", 0) == 0);
  CHECK(notes.empty());
  // It ended of its own accord: a note.
  Verdict exited;
  exited.kind = "exit";
  exited.summary = "clean exit (code 0)";
  judge_pressure(h, exited, notes);
  CHECK(exited.summary == "clean exit (code 0)");
  REQUIRE(notes.size() == 1);
  CHECK(contains(notes[0], "that is the freeze"));
  CHECK(contains(pressure_line(h), "swap used up to 6.0 GiB of 8.0 GiB; swap-in up to 100.0 MiB/s"));
}

TEST_CASE("pressure: stalls without swap, pauses inside a stretch, and what is no freeze", "[pressure]") {
  SECTION("full pressure with no swap at all") {
    Trace trace;
    records(trace, 0, 10, 8 * kGiB, 0, 0);
    records(trace, 10, 12, 50 * kMiB, 0, 0.3);
    HostPressure h = summarize_pressure(trace);
    CHECK(h.freeze.rfind("the system was stalled on memory for the last 12 s of the run (pages swapped in at 0 B/s, "
                         "every task stalled on memory 30% of the time",
                         0) == 0);
  }
  SECTION("a pause of half a second does not end the stretch; one of two seconds does") {
    Trace trace;
    records(trace, 0, 10, 8 * kGiB, 2000, 0.5);
    records(trace, 10, 0.5, 8 * kGiB, 0, 0);
    records(trace, 10.5, 10, 8 * kGiB, 2000, 0.5);
    CHECK(summarize_pressure(trace).freeze_seconds == Approx(20.4).margin(0.2));
    records(trace, 20.5, 2, 8 * kGiB, 0, 0);
    records(trace, 22.5, 3, 8 * kGiB, 2000, 0.5);
    HostPressure h = summarize_pressure(trace);
    CHECK(h.freeze_seconds == Approx(3).margin(0.2));
    CHECK(h.freeze.empty());  // shorter than kFreezeSeconds
  }
  SECTION("swapping that stopped before the end is history, not the freeze") {
    Trace trace;
    records(trace, 0, 30, 1 * kGiB, 3000, 0.5);
    records(trace, 30, 5, 8 * kGiB, 0, 0);
    CHECK(summarize_pressure(trace).freeze.empty());
  }
  SECTION("step-end records without /proc/vmstat between the 100 ms ones do not break a stretch") {
    Trace trace;
    records(trace, 0, 10, 8 * kGiB, 3000, 0);
    std::vector<TracePressure> mixed;
    for (const TracePressure& p : trace.pressure) {
      mixed.push_back(p);
      TracePressure step_end = p;
      step_end.ts += 50'000'000;
      step_end.present &= ~fmt::kPressureVmstat;
      step_end.swap_in = 0;
      mixed.push_back(step_end);
    }
    trace.pressure = mixed;
    HostPressure h = summarize_pressure(trace);
    CHECK(h.freeze_seconds == Approx(9.9).margin(0.01));
    CHECK(h.max_swap_in == Approx(3000.0 * 4096 * 10).epsilon(0.01));
  }
  SECTION("a trace without pressure records (format 6) says nothing") {
    Trace trace;
    HostPressure h = summarize_pressure(trace);
    CHECK_FALSE(h.sampled);
    CHECK(pressure_line(h).empty());
  }
}

TEST_CASE("pressure: SIGKILL near the cgroup limit is the OOM killer, with the figures", "[pressure][verdict]") {
  Trace trace = killed_trace(1900 * kMiB, 2 * kGiB, 2 * kGiB);
  records(trace, 0, 1, 12 * kGiB, 0, 0);
  StopVerdict v = judge_stop(trace, sigkill(), {});
  CHECK(v.verdict.kind == "host_oom_kill");
  CHECK(v.verdict.summary ==
        "killed by SIGKILL: killed by the kernel's OOM killer (likely): last RSS 1.9 GiB, cgroup limit 2.0 GiB "
        "(usage 2.0 GiB), MemAvailable 12.0 GiB of 16.0 GiB; the cgroup was at 100% of its limit; the kernel log was "
        "not read (memledger run reads it when the command ends)");
}

TEST_CASE("pressure: SIGKILL with the system's memory nearly exhausted is the OOM killer", "[pressure][verdict]") {
  Trace trace = killed_trace(15 * kGiB, 0, 0);
  records(trace, 0, 1, 90 * kMiB, 0, 0);
  KernelLog log = log_read();
  StopVerdict v = judge_stop(trace, sigkill(&log), {});
  CHECK(v.verdict.kind == "host_oom_kill");
  CHECK(v.verdict.summary ==
        "killed by SIGKILL: killed by the kernel's OOM killer (likely): last RSS 15.0 GiB, no cgroup memory limit, "
        "MemAvailable 90.0 MiB of 16.0 GiB; the system's memory was nearly exhausted; the kernel log has no "
        "OOM-killer line for pid 4242");
  // The same SIGKILL with memory to spare was someone else's.
  Trace calm = killed_trace(1 * kGiB, 0, 0);
  records(calm, 0, 1, 12 * kGiB, 0, 0);
  StopVerdict other = judge_stop(calm, sigkill(&log), {});
  CHECK(other.verdict.kind == "killed");
  CHECK(other.verdict.summary ==
        "killed by SIGKILL; last RSS 1.0 GiB, no cgroup memory limit, MemAvailable 12.0 GiB of 16.0 GiB; the kernel "
        "log has no OOM-killer line for pid 4242");
}

TEST_CASE("pressure: the cgroup's OOM kill count and the kernel's own line", "[pressure][verdict]") {
  // The last sample, 100 ms before the kill, was still far from the limit.
  Trace trace = killed_trace(600 * kMiB, 2 * kGiB, 700 * kMiB);
  records(trace, 0, 1, 12 * kGiB, 0, 0);
  KernelLog log = log_read();
  log.cgroup_oom_kills["/sys/fs/cgroup/job"] = 1;
  StopVerdict counted = judge_stop(trace, sigkill(&log), {});
  CHECK(counted.verdict.kind == "host_oom_kill");
  CHECK(contains(counted.verdict.summary, "(likely)"));
  CHECK(contains(counted.verdict.summary, "the cgroup's OOM kill count rose from 0 to 1 after the process's last sample"));
  // The kernel log names the pid: no longer "likely".
  log.oom_kills.push_back({4242, "Memory cgroup out of memory: Killed process 4242 (python3) total-vm:2300000kB"});
  StopVerdict named = judge_stop(trace, sigkill(&log), {});
  CHECK(named.verdict.kind == "host_oom_kill");
  CHECK(named.verdict.summary.rfind("killed by SIGKILL: killed by the kernel's OOM killer: last RSS 600.0 MiB", 0) == 0);
  CHECK(contains(named.verdict.summary,
                 "; the kernel log says: Memory cgroup out of memory: Killed process 4242 (python3) total-vm:2300000kB"));
  // A child with no word at all (no waitpid status) is judged the same way.
  StopVerdict silent = judge_stop(trace, ExitInfo{.kernel = &log}, {});
  CHECK(silent.verdict.kind == "host_oom_kill");
  CHECK(silent.verdict.summary.rfind("stopped without warning", 0) == 0);
  // The kernel log could not be read: said, with why.
  KernelLog closed;
  closed.checked = true;
  closed.why_not = "/dev/kmsg: Operation not permitted";
  closed.cgroup_oom_kills["/sys/fs/cgroup/job"] = 1;
  StopVerdict unread = judge_stop(trace, sigkill(&closed), {});
  CHECK(contains(unread.verdict.summary, "(likely)"));
  CHECK(contains(unread.verdict.summary, "the kernel log could not be read (/dev/kmsg: Operation not permitted)"));
}

TEST_CASE("pressure: the OOM killer's lines are read from the kernel log", "[pressure]") {
  char path[] = "/tmp/memledger-kmsg-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  {
    std::ofstream f(path);
    f << "6,100,5000000,-;Out of memory: Killed process 77 (old) total-vm:1kB\n"  // before the run
      << "4,101,9000000,-;python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0\n"
      << " SUBSYSTEM=memory\n"
      << "6,102,9000100,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
         "oom_memcg=/job,task_memcg=/job,task=python3,pid=4242,uid=0\n"
      << "3,103,9000200,-;Memory cgroup out of memory: Killed process 4242 (python3) total-vm:2300000kB, "
         "anon-rss:2090000kB, file-rss:0kB\n"
      << "6,104,9000300,-;oom_reaper: reaped process 4242 (python3), now anon-rss:0kB\n";
  }
  KernelLog log = read_kernel_log(path, 8000000);
  unlink(path);
  CHECK(log.checked);
  CHECK(log.readable);
  REQUIRE(log.oom_kills.size() == 1);
  CHECK(log.oom_kills[0].pid == 4242);
  CHECK(log.oom_kills[0].text.rfind("Memory cgroup out of memory: Killed process 4242 (python3)", 0) == 0);
  CHECK(log.line_for(77) == nullptr);
  CHECK(oom_killed_pid("Out of memory: Killed process 123 (x)") == 123);
  CHECK(oom_killed_pid("oom_reaper: reaped process 123 (x)") == 0);

  KernelLog missing = read_kernel_log("/nonexistent/kmsg", 0);
  CHECK_FALSE(missing.readable);
  CHECK(missing.why_not == "/nonexistent/kmsg: No such file or directory");
  // Kept in run.json and read back.
  log.cgroup_oom_kills["/sys/fs/cgroup/job"] = 3;
  KernelLog back = kernel_log_from_json(kernel_log_json(log));
  CHECK(back.readable);
  CHECK(back.oom_kills.size() == 1);
  CHECK(back.line_for(4242) != nullptr);
  CHECK(back.cgroup_oom_kills.at("/sys/fs/cgroup/job") == 3);
}
