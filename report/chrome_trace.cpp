#include "chrome_trace.h"

#include <algorithm>

#include "trace_format.h"

namespace memledger::report {
namespace {

using nlohmann::json;

constexpr int kStepThread = 1;

double micros(uint64_t ns) { return static_cast<double>(ns) / 1000.0; }

std::string process_name(const ProcessReport& p) {
  std::string name = p.rank.empty() ? "" : "rank " + p.rank + " \u00b7 ";
  name += "pid " + std::to_string(p.pid);
  if (!p.command.empty()) name += " \u00b7 " + p.command.substr(0, 120);
  return name;
}

}  // namespace

json render_chrome_trace(const RunReport& run) {
  json events = json::array();
  // Processes on one host share CLOCK_MONOTONIC: put them on one time line.
  const std::string& host = run.processes[run.root].host;
  uint64_t origin = UINT64_MAX;
  for (const ProcessReport& p : run.processes) {
    if (p.host == host && p.start_mono_ns != 0) origin = std::min(origin, p.start_mono_ns);
  }
  for (size_t i = 0; i < run.processes.size(); ++i) {
    const ProcessReport& p = run.processes[i];
    const uint64_t offset = (p.host == host && p.start_mono_ns != 0 && origin != UINT64_MAX) ? p.start_mono_ns - origin : 0;
    const int pid = p.pid;
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", process_name(p)}}}});
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"tid", 0},
                      {"args", {{"sort_index", i == run.root ? -1 : static_cast<int>(i)}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", kStepThread},
                      {"args", {{"name", "steps (" + p.step_source + ")"}}}});
    uint64_t previous_end = 0;
    for (const StepStats& s : p.steps) {
      json live = json::object();
      for (int k = 0; k < format::kKindCount; ++k) {
        if (k == 0 || s.live[k] != 0) live[format::kind_name(static_cast<format::Kind>(k))] = s.live[k];
      }
      std::string name = "step " + std::to_string(s.index);
      if (!s.label.empty()) name += " " + s.label;
      events.push_back({{"ph", "X"},
                        {"name", name},
                        {"cat", "step"},
                        {"pid", pid},
                        {"tid", kStepThread},
                        {"ts", micros(offset + previous_end)},
                        {"dur", micros(s.end_ns > previous_end ? s.end_ns - previous_end : 0)},
                        {"args", {{"live", live}, {"allocations", s.allocations}, {"frees", s.frees}, {"rss", s.rss}}}});
      const double ts = micros(offset + s.end_ns);
      events.push_back({{"ph", "C"}, {"name", "live bytes"}, {"pid", pid}, {"ts", ts}, {"args", live}});
      // Host counters memledger could not measure are left out, not drawn as 0.
      json held = json::object(), frag = json::object();
      if (p.allocator.held_known) held["host"] = s.held_host;
      if (p.allocator.held_known && p.allocator.traced) {
        frag["host"] = std::max<int64_t>(0, static_cast<int64_t>(s.held_host) - s.live[0]);
      }
      if (s.held_device != 0) held["device"] = s.held_device;
      if (s.held_device != 0) frag["device"] = std::max<int64_t>(0, s.held_device - s.live[1] - s.live[2]);
      if (!held.empty()) events.push_back({{"ph", "C"}, {"name", "held bytes"}, {"pid", pid}, {"ts", ts}, {"args", held}});
      if (!frag.empty()) {
        events.push_back({{"ph", "C"}, {"name", "fragmentation bytes"}, {"pid", pid}, {"ts", ts}, {"args", frag}});
      }
      json rss = {{"rss", s.rss}};
      if (p.verdict.cgroup_limit) rss["cgroup_limit"] = p.verdict.cgroup_limit;
      events.push_back({{"ph", "C"}, {"name", "host RSS"}, {"pid", pid}, {"ts", ts}, {"args", rss}});
      if (s.device_total) {
        events.push_back({{"ph", "C"}, {"name", "device memory"}, {"pid", pid}, {"ts", ts},
                          {"args", {{"free", s.device_free}, {"total", s.device_total}}}});
      }
      previous_end = s.end_ns;
    }
    for (const OomEvent& o : p.ooms) {
      events.push_back({{"ph", "i"},
                        {"s", "p"},
                        {"name", "CUDA out of memory"},
                        {"cat", "oom"},
                        {"pid", pid},
                        {"tid", kStepThread},
                        {"ts", micros(offset + o.ts_ns)},
                        {"args",
                         {{"requested", o.requested}, {"device", o.device}, {"step", o.step}, {"device_live", o.device_live},
                          {"device_free", o.device_free}, {"held_unused", o.held_unused}}}});
    }
    events.push_back({{"ph", "i"},
                      {"s", "p"},
                      {"name", "stop: " + p.verdict.kind},
                      {"cat", "verdict"},
                      {"pid", pid},
                      {"tid", kStepThread},
                      {"ts", micros(offset + p.duration_ns)},
                      {"args", {{"summary", p.verdict.summary}}}});
  }
  std::string cmd;
  for (const std::string& a : run.command) cmd += (cmd.empty() ? "" : " ") + a;
  return {{"traceEvents", events},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"generator", "memledger"}, {"run_dir", run.run_dir}, {"command", cmd}}}};
}

}  // namespace memledger::report
