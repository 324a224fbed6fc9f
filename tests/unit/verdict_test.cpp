#include <catch2/catch.hpp>

#include <csignal>

#include "verdict.h"

using namespace memledger::report;

namespace {

ExitInfo waited(int code, int signo = 0) {
  ExitInfo info;
  info.known = true;
  info.signaled = signo != 0;
  info.code = code;
  info.signo = signo;
  return info;
}

TraceSample last_sample(uint64_t rss, uint64_t limit) {
  TraceSample s;
  s.rss = rss;
  s.cgroup_limit = limit;
  return s;
}

OomEvent oom(uint64_t requested) {
  OomEvent o;
  o.requested = requested;
  o.step = 7;
  o.device_live = 3 << 20;
  o.device_free = 1 << 20;
  o.device_total = 8 << 20;
  o.held_unused = 2 << 20;
  return o;
}

}  // namespace

TEST_CASE("verdict: waitpid's status comes first, then the trace's", "[verdict]") {
  Trace trace;
  trace.has_exit = true;
  trace.exit_status = 3;
  CHECK(judge_stop(trace, waited(0), {}).verdict.summary == "clean exit (code 0)");
  StopVerdict from_trace = judge_stop(trace, ExitInfo{}, {});
  CHECK(from_trace.verdict.kind == "exit");
  CHECK(from_trace.verdict.exit_code == 3);
  CHECK(from_trace.verdict.summary == "exited with code 3");
  StopVerdict signaled = judge_stop(trace, waited(0, SIGTERM), {});
  CHECK(signaled.verdict.kind == "signal");
  CHECK(signaled.verdict.summary == "terminated by SIGTERM");
}

TEST_CASE("verdict: a crash names its signal, address and stack", "[verdict]") {
  Trace trace;
  TraceSignal sig;
  sig.signo = SIGSEGV;
  sig.fault_addr = 0xdead;
  sig.stack = 42;
  trace.signals.push_back(sig);
  StopVerdict v = judge_stop(trace, ExitInfo{}, {});
  CHECK(v.verdict.kind == "crash");
  CHECK(v.verdict.signal_name == "SIGSEGV");
  CHECK(v.verdict.summary == "crashed with SIGSEGV at address 0xdead");
  CHECK(v.verdict.fault_addr == 0xdead);
  CHECK(v.has_crash_stack);
  CHECK(v.crash_stack == 42);
  // waitpid saw another signal than the trace recorded: no stack to show.
  StopVerdict other = judge_stop(trace, waited(0, SIGBUS), {});
  CHECK(other.verdict.kind == "crash");
  CHECK_FALSE(other.has_crash_stack);
}

TEST_CASE("verdict: SIGKILL near the cgroup limit is the OOM killer", "[verdict]") {
  Trace trace;
  trace.samples = {last_sample(950 << 20, 1000 << 20)};
  StopVerdict near = judge_stop(trace, waited(0, SIGKILL), {});
  CHECK(near.verdict.kind == "host_oom_kill");
  CHECK(near.verdict.last_rss == 950u << 20);
  CHECK(near.verdict.cgroup_limit == 1000u << 20);
  trace.samples = {last_sample(100 << 20, 1000 << 20)};
  StopVerdict far = judge_stop(trace, waited(0, SIGKILL), {});
  CHECK(far.verdict.kind == "killed");
  CHECK(far.verdict.summary.find("not near the limit") != std::string::npos);
  // No end record at all: stopped without warning.
  StopVerdict silent = judge_stop(trace, ExitInfo{}, {});
  CHECK(silent.verdict.kind == "killed");
  CHECK(silent.verdict.summary.find("stopped without warning") == 0);
}

TEST_CASE("verdict: an out-of-memory failure explains a bad end", "[verdict]") {
  Trace trace;
  StopVerdict v = judge_stop(trace, waited(1), {oom(1 << 30)});
  CHECK(v.verdict.kind == "cuda_oom");
  CHECK(v.verdict.exit_code == 1);
  CHECK(v.verdict.summary ==
        "CUDA out of memory: 1.0 GiB requested on device 0 in step 7; 3.0 MiB live, 1.0 MiB free of 8.0 MiB at "
        "the last step end, 2.0 MiB held by pools but unused");
  StopVerdict aborted = judge_stop(trace, waited(0, SIGABRT), {oom(1 << 30)});
  CHECK(aborted.verdict.kind == "cuda_oom");
  CHECK(aborted.verdict.signal_name == "SIGABRT");
  // The program recovered and exited cleanly: the failure is not why it stopped.
  CHECK(judge_stop(trace, waited(0), {oom(1 << 30)}).verdict.kind == "exit");
}

TEST_CASE("verdict: exec and an end without status", "[verdict]") {
  Trace trace;
  trace.execs = {"/bin/true"};
  CHECK(judge_stop(trace, ExitInfo{}, {}).verdict.summary == "replaced itself with exec(/bin/true)");
  Trace ended;
  ended.has_end = true;
  CHECK(judge_stop(ended, ExitInfo{}, {}).verdict.summary == "exited (status not recorded)");
}
