#include "verdict.h"

#include <csignal>
#include <cstdio>
#include <cstring>

#include "pressure.h"

namespace memledger::report {

std::string signal_name(int signo) {
  const char* abbrev = sigabbrev_np(signo);
  if (abbrev == nullptr) return "signal " + std::to_string(signo);
  return std::string("SIG") + abbrev;
}

namespace {

bool is_crash_signal(int signo) {
  return signo == SIGSEGV || signo == SIGBUS || signo == SIGABRT || signo == SIGFPE || signo == SIGILL;
}

// Killed from outside: the kernel's OOM killer when the kernel log names
// the process, or when the last samples were near the cgroup's limit, near
// the end of the system's memory, or the cgroup counted an OOM kill after
// them (pressure.h); else someone else.
void killed(Verdict& v, const std::string& how, const Trace& trace, const ExitInfo& exit_info) {
  const OomKillEvidence e = oom_kill_evidence(trace, exit_info.kernel);
  std::string why;
  for (const std::string& r : e.reasons) why += (why.empty() ? "" : ", ") + r;
  if (e.likely) {
    v.kind = "host_oom_kill";
    v.summary = how + ": killed by the kernel's OOM killer" + (e.confirmed ? "" : " (likely)") + ": " + e.figures +
                (why.empty() ? "" : "; " + why) + "; " + e.kernel;
  } else {
    v.kind = "killed";
    v.summary = how + "; " + e.figures + (v.cgroup_limit ? ", not near the limit" : "") +
                (exit_info.kernel != nullptr ? "; " + e.kernel : "");
  }
}

void cuda_oom(Verdict& v, const OomEvent& oom, const std::vector<StepStats>& steps) {
  v.kind = "cuda_oom";
  v.summary = "CUDA out of memory: " + human_bytes(double(oom.requested)) + " requested on device " +
              std::to_string(oom.device) + (steps.empty() ? " in step " + std::to_string(oom.step) : " " + phase_of(oom.step, oom.ts_ns, steps)) + "; " +
              human_bytes(double(oom.device_live)) + " live";
  if (oom.device_total) {
    v.summary += ", " + human_bytes(double(oom.device_free)) + " free of " + human_bytes(double(oom.device_total)) +
                 " at the last step end";
  }
  if (oom.held_unused) v.summary += ", " + human_bytes(double(oom.held_unused)) + " held by pools but unused";
}

// Ended by signal `signo` (not a CUDA OOM); `sig`: the trace's first
// signal record, if any.
void by_signal(StopVerdict& out, int signo, const TraceSignal* sig, const Trace& trace, const ExitInfo& exit_info) {
  Verdict& v = out.verdict;
  v.signo = signo;
  v.signal_name = signal_name(signo);
  if (is_crash_signal(signo)) {
    v.kind = "crash";
    v.summary = "crashed with " + v.signal_name;
    if (sig != nullptr && sig->signo == signo) {
      v.fault_addr = sig->fault_addr;
      if (signo == SIGSEGV || signo == SIGBUS) {
        char buf[64];
        std::snprintf(buf, sizeof buf, " at address 0x%llx", static_cast<unsigned long long>(sig->fault_addr));
        v.summary += buf;
      }
      out.has_crash_stack = true;
      out.crash_stack = sig->stack;
    }
  } else if (signo == SIGKILL) {
    killed(v, "killed by SIGKILL", trace, exit_info);
  } else {
    v.kind = "signal";
    v.summary = "terminated by " + v.signal_name;
  }
}

// No signal and no CUDA OOM: the exit status, an exec, or no word at all.
void without_signal(Verdict& v, const Trace& trace, const ExitInfo& exit_info) {
  if (exit_info.known) {
    v.kind = "exit";
    v.exit_code = exit_info.code;
    v.summary = exit_info.code == 0 ? "clean exit (code 0)" : "exited with code " + std::to_string(exit_info.code);
  } else if (trace.has_exit) {
    v.kind = "exit";
    v.exit_code = trace.exit_status;
    v.summary = trace.exit_status == 0 ? "clean exit (code 0)" : "exited with code " + std::to_string(trace.exit_status);
  } else if (!trace.execs.empty()) {
    v.kind = "exec";
    v.summary = "replaced itself with exec(" + trace.execs.back() + ")";
  } else if (trace.has_end) {
    v.kind = "exit";
    v.summary = "exited (status not recorded)";
  } else {
    killed(v,
           "stopped without warning (SIGKILL, a signal the tracer could not record, or a crash of its writer); "
           "the trace covers up to " +
               std::to_string(trace.last_ts / 1000000) + " ms",
           trace, exit_info);
  }
}

}  // namespace

StopVerdict judge_stop(const Trace& trace, const ExitInfo& exit_info, const std::vector<OomEvent>& ooms,
                       const std::vector<StepStats>& steps) {
  StopVerdict out;
  Verdict& v = out.verdict;
  if (!trace.samples.empty()) {
    const TraceSample& last = trace.samples.back();
    v.last_rss = last.rss;
    v.cgroup_limit = last.cgroup_limit;
    v.cgroup_usage = last.cgroup_usage;
  }
  const TraceSignal* sig = trace.signals.empty() ? nullptr : &trace.signals.front();
  int signo = 0;
  if (exit_info.known && exit_info.signaled) {
    signo = exit_info.signo;
  } else if (!exit_info.known && sig != nullptr && !trace.has_exit) {
    signo = sig->signo;
  }
  const bool ended_badly = (exit_info.known && (exit_info.signaled || exit_info.code != 0)) ||
                           (!exit_info.known && ((trace.has_exit && trace.exit_status != 0) || sig != nullptr));
  if (!ooms.empty() && ended_badly && (signo == 0 || signo == SIGABRT || signo == SIGKILL)) {
    cuda_oom(v, ooms.back(), steps);
    v.exit_code = exit_info.known ? exit_info.code : trace.exit_status;
    v.signo = signo;
    if (signo) v.signal_name = signal_name(signo);
  } else if (signo != 0) {
    by_signal(out, signo, sig, trace, exit_info);
  } else {
    without_signal(v, trace, exit_info);
  }
  return out;
}

}  // namespace memledger::report
