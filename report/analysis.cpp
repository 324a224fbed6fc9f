// The report's analysis of one process, stage by stage (DESIGN.md,
// "Architecture"): automatic steps, replay, growth, leaks at exit, device,
// verdict, notes. Each stage is a function over plain structs in a file of
// its own; this file runs them in order and assembles the ProcessReport.
#include "analysis.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string_view>

#include "auto_steps.h"
#include "device_memory.h"
#include "exit_leaks.h"
#include "growth.h"
#include "environment.h"
#include "pressure.h"
#include "notes.h"
#include "replay.h"
#include "roles.h"
#include "retention.h"
#include "attributed.h"
#include "site_groups.h"
#include "growth_view.h"
#include "step_inference.h"
#include "symbolizer.h"
#include "verdict.h"

namespace memledger::report {

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = std::fabs(bytes);
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%s%.0f %s", bytes < 0 ? "-" : "", v, units[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%s%.1f %s", bytes < 0 ? "-" : "", v, units[u]);
  }
  return buf;
}

uint64_t first_step_start_ns(const std::vector<StepStats>& steps) {
  if (steps.size() < 2) return 0;
  std::vector<uint64_t> durations;
  for (size_t k = 1; k < steps.size(); ++k) {
    durations.push_back(steps[k].end_ns > steps[k - 1].end_ns ? steps[k].end_ns - steps[k - 1].end_ns : 0);
  }
  std::nth_element(durations.begin(), durations.begin() + static_cast<long>(durations.size() / 2), durations.end());
  const uint64_t typical = durations[durations.size() / 2];
  return steps.front().end_ns > typical ? steps.front().end_ns - typical : 0;
}

std::string phase_of(uint64_t step, uint64_t ts_ns, const std::vector<StepStats>& steps) {
  if (steps.empty() || step == 0) return {};
  if (step > steps.size()) return "after the last step";
  if (step == 1 && ts_ns < first_step_start_ns(steps)) return "before the first step";
  return "in step " + std::to_string(step);
}

std::string peak_phase(const Peak& peak, const std::vector<StepStats>& steps) {
  return phase_of(peak.step, peak.ts_ns, steps);
}

namespace {

// Allocator plumbing that is never the user's line: skipped when naming a site.
bool is_allocator_frame(const Frame& f) {
  static const char* const kPrefixes[] = {"operator new", "operator delete", "malloc", "calloc", "realloc",
                                          "__libc_", "std::", "__gnu_cxx::", "void std::", "__cxa_",
                                          "aligned_alloc", "posix_memalign", "memalign", "strdup", "strndup",
                                          // CUDA runtime and driver entry points (a statically linked
                                          // runtime puts them inside the program itself).
                                          "cudaMalloc", "cudaHostAlloc", "cudaHostRegister", "cuMemAlloc",
                                          "cuMemCreate", "cuMemHostAlloc", "cuMemHostRegister"};
  for (const char* p : kPrefixes) {
    if (f.function.rfind(p, 0) == 0) return true;
  }
  if (f.file.rfind("/usr/include/", 0) == 0) return true;
  if (f.module.find("libcudart") != std::string::npos || f.module.find("libcuda.so") != std::string::npos) return true;
  return false;
}

}  // namespace

namespace {

// Stacks judged per row shown: rows are lines of user code, each made of the
// stacks below it (site_groups.h), so the stages before it keep this many
// times as many stacks as the report shows rows.
constexpr size_t kStacksPerRow = 10;

// memledger's own work in the program (OwnWork) worth a note: what one
// more step of a small program might allocate.
constexpr int64_t kOwnWorkNoteMin = 1 << 20;

// What the events gave: the replay, CUPTI's view beside it, and the steps
// added in front of it.
struct EventPass {
  ReplayOutput replay;
  CuptiView cupti;
  StepPlan steps;
};

// One pass over the events: the replay and the CUPTI comparison, and the
// allocation sequence when one is being collected.
EventPass replay_pass(const Trace& trace, const EventFeed& feed, bool sampled, AllocationSequence* sequence,
                      const AnalysisOptions& options) {
  Replay replay(trace, sampled);
  for (const KeepLiveSet& keep : options.keep_live_sets) replay.keep_live_set(keep);
  if (options.inherited != nullptr) replay.inherit(*options.inherited);
  CuptiMatcher cupti(trace);
  feed([&](const TraceEvent* events, size_t count) {
    if (sequence != nullptr) sequence->observe(events, count);
    replay.observe(events, count);
    for (size_t i = 0; i < count; ++i) cupti.observe(events[i]);
  });
  ReplayOutput replayed = replay.finish();
  return EventPass{std::move(replayed), cupti.finish(), StepPlan{}};
}

namespace fmt = memledger::format;

// Whether a stack has a Python frame of its own (not attributed) whose file
// satisfies `file_matches`.
template <typename Match>
bool has_python_file(const Trace& trace, uint32_t stack, Match file_matches) {
  bool found = false;
  trace.stacks.visit(stack, [&](uint64_t word) {
    if (!fmt::is_python_frame(word) || fmt::is_attributed_python_frame(word)) return true;
    auto code = trace.python_codes.find(fmt::python_code_id(word));
    found = code != trace.python_codes.end() && file_matches(code->second.filename);
    return !found;
  });
  return found;
}

// Over time windows, a module being imported grows until the import ends:
// that is start-up, not a leak, when no step tells start-up from the rest.
bool under_import(const Trace& trace, uint32_t stack) {
  return has_python_file(trace, stack,
                         [](const std::string& file) { return file.starts_with("<frozen importlib._bootstrap"); });
}

// An allocation of memledger's own Python helpers (the retention walk at
// exit).
bool under_memledger(const Trace& trace, uint32_t stack) {
  return has_python_file(trace, stack,
                         [](const std::string& file) { return file.ends_with("/memledger/_retention.py"); });
}

// The line of the program's own Python code a stack was made under: its
// kind, the code object and line of the innermost frame in the program's
// own files, then the Python words of its callers. Empty for a stack
// without such a frame, and for a stack lent the main thread's frames
// (attributed: the line is the main thread's at that moment, not the
// allocation's; merge_attributed_variants joins those).
std::string program_line_key(const Trace& trace, const SiteAcc& site) {
  // Its leading Python frames are all it needs.
  std::vector<uint64_t> words;
  trace.stacks.visit(site.stack, [&](uint64_t word) {
    if (!fmt::is_python_frame(word)) return false;
    words.push_back(word);
    return true;
  });
  for (size_t user = 0; user < words.size() && fmt::is_python_frame(words[user]) &&
                        !fmt::is_attributed_python_frame(words[user]);
       ++user) {
    auto code = trace.python_codes.find(fmt::python_code_id(words[user]));
    if (code == trace.python_codes.end() || is_library_python_file(code->second.filename)) continue;
    std::string key(1, static_cast<char>(site.kind));
    auto append = [&key](uint64_t w) { key.append(reinterpret_cast<const char*>(&w), sizeof w); };
    append(code->first);
    append(static_cast<uint64_t>(python_line(code->second, fmt::python_offset(words[user]))));
    for (size_t i = user + 1; i < words.size() && fmt::is_python_frame(words[i]); ++i) append(words[i]);
    return key;
  }
  return {};
}

// The worker functions of the frameworks' process pools, by the code the
// process ran (its stacks' Python frames).
struct RoleCode {
  const char* qualname;
  const char* file_suffix;
  const char* role;
};
constexpr RoleCode kRoleCodes[] = {
    {"_worker_loop", "torch/utils/data/_utils/worker.py", "DataLoader worker"},
    {"worker", "multiprocessing/pool.py", "Pool worker"},
    {"_process_worker", "concurrent/futures/process.py", "ProcessPool worker"},
};

// Jupyter, by the command line: a kernel is started with its connection
// file, `python -m ipykernel_launcher -f .../kernel-<id>.json` (the
// server names the file after the kernel's id, whatever the kernel's
// language); the server runs as jupyter-lab, jupyter-server or
// jupyter-notebook, or `python -m jupyterlab` and the like.
void find_jupyter_role(const Trace& trace, ProcessReport& r) {
  std::vector<std::string> argv;
  std::string arg;
  for (char c : trace.header_value("command")) {
    if (c == '\x1f') {
      argv.push_back(std::move(arg));
      arg.clear();
    } else {
      arg += c;
    }
  }
  argv.push_back(std::move(arg));
  auto base = [](const std::string& path) { return path.substr(path.find_last_of('/') + 1); };
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string file = argv[i];
    if (file.starts_with("--f=") || file.starts_with("-f=")) file = file.substr(file.find('=') + 1);
    const std::string name = base(file);
    if (name.starts_with("kernel-") && name.ends_with(".json") && name.size() > 12) {
      r.python_role = "Jupyter kernel";
      r.kernel_id = name.substr(7, name.size() - 12);
      return;
    }
  }
  for (size_t i = 0; i < argv.size() && i < 3; ++i) {
    const std::string name = base(argv[i]);
    const bool module = i > 0 && argv[i - 1] == "-m";
    if (name == "jupyter-lab" || name == "jupyter-server" || name == "jupyter-notebook" ||
        (module && (name == "jupyterlab" || name == "jupyter_server" || name == "notebook"))) {
      r.python_role = "Jupyter server";
      return;
    }
  }
}

void find_python_role(const Trace& trace, ProcessReport& r) {
  find_jupyter_role(trace, r);
  for (const auto& [id, code] : trace.python_codes) {
    for (const RoleCode& rc : kRoleCodes) {
      if (code.qualname == rc.qualname && code.filename.ends_with(rc.file_suffix)) r.python_role = rc.role;
    }
  }
  // A role the Python module recorded itself (a tf.data service worker).
  for (const auto& [key, value] : trace.info_strings()) {
    if (key == "python.role") r.python_role = value;
  }
  if (r.python_role != "Jupyter kernel") r.kernel_id.clear();  // a worker forked by a kernel
  // multiprocessing starts a spawned or forkserver child as
  // `python -c 'from multiprocessing.spawn import spawn_main; ...' --multiprocessing-fork`.
  const std::string command = trace.command_line();
  if (command.find("multiprocessing.forkserver") != std::string::npos) {
    r.start_method = "forkserver";
  } else if (command.find("--multiprocessing-fork") != std::string::npos) {
    r.start_method = "spawn";
  }
}

void drop_imports(const Trace& trace, std::vector<LeakSuspect>& suspects) {
  std::erase_if(suspects, [&](const LeakSuspect& s) { return under_import(trace, s.site.stack); });
}

// Automatic steps, then replay. The first replay runs while the allocation
// sequence is collected; when the events hold no step and inference finds
// the loop, the replay (only it) runs again with the inferred steps.
// `rewind` puts the trace back as it was before the first pass.
EventPass replay_with_steps(const Trace& trace, const EventFeed& feed, const std::function<void()>& rewind,
                            bool sampled, const AnalysisOptions& options) {
  StepPlan plan;
  {
    AllocationSequence sequence(trace);
    EventPass pass = replay_pass(trace, feed, sampled, &sequence, options);
    if (sequence.mixed_loader_steps()) {
      // The program marked steps of its own after the loader's first ones:
      // its markers alone are the steps.
      rewind();
      EventPass own = replay_pass(trace, without_step_source(feed, static_cast<uint8_t>(fmt::StepSource::kLoader)),
                                  sampled, nullptr, options);
      own.steps = StepPlan{};
      return own;
    }
    plan = plan_time_windows(sequence, trace.samples, plan_steps(sequence));
    if (plan.ends.empty()) {
      pass.steps = std::move(plan);
      return pass;
    }
  }
  rewind();
  EventPass pass = replay_pass(trace, with_steps(feed, plan.ends, plan.by_time), sampled, nullptr, options);
  pass.steps = std::move(plan);
  return pass;
}

// Symbolizes the sites the report shows, and only those (a trace holds far
// more stacks than it shows): the symbolizer starts on the first.
//
// Every shown frame is a copy of its names, so a few bytes of trace (a
// stack of one frame repeated, a long file name) could ask for gigabytes:
// the frames kept for all sites together take at most kFrameBudgetFloor
// plus kFrameBudgetRatio times the trace file's size; past that a site
// keeps the frames it has, and warnings() says how many were cut. A real
// trace comes near: a Python process killed in full mode has every block
// its interpreter made still live, thousands of sites of 60 frames and more
// named in several lists, from stacks the trace keeps as a tree of shared
// frames: 52 MB of frames from a trace of 117 KB (450 times), 2,000 sites
// 30 Python calls deep from 135 KB (test_sigkill).
class SiteNamer {
 public:
  static constexpr uint64_t kFrameBudgetFloor = uint64_t{32} << 20;
  static constexpr uint64_t kFrameBudgetRatio = 1024;

  SiteNamer(const Trace& trace, const SymbolizerOptions& options)
      : trace_(trace), options_(options), budget_(kFrameBudgetFloor + kFrameBudgetRatio * trace.file_bytes) {}
  // Stacks of CUDA graph allocations (ReplayOutput::graph_stacks): their
  // sites are marked graph-owned.
  void set_graph_stacks(const std::vector<uint32_t>* stacks) { graph_stacks_ = stacks; }
  Site name(uint32_t stack, uint8_t kind) {
    Site site;
    site.stack = stack;
    site.kind = kind;
    site.graph = graph_stacks_ != nullptr && std::binary_search(graph_stacks_->begin(), graph_stacks_->end(), stack);
    // Each frame word's chain (its inlined frames, then its function); then
    // room for them all at once: a vector grown by doubling would leave a
    // site up to half its frames' room unused (10,000 sites of 60 to 90
    // frames in the live sets of an `import torch`).
    chains_.clear();
    size_t frames = 0;
    trace_.stacks.visit(stack, [&](uint64_t word) {
      chains_.push_back(&symbolizer().resolve(word, !chains_.empty()));
      frames += chains_.back()->size();
      return true;
    });
    site.frames.reserve(frames);
    for (const std::vector<Frame>* chain : chains_) {
      for (const Frame& f : *chain) {
        const uint64_t cost = sizeof(Frame) + f.function.size() + f.file.size() + f.module.size();
        if (spent_ + cost > budget_) {
          ++sites_cut_;
          return site;
        }
        spent_ += cost;
        site.frames.push_back(f);
      }
    }
    return site;
  }
  // Gives a stack's frames one at a time without keeping them: the frame
  // budget is for the frames the report shows, and the roles stage reads
  // the stacks of every site that is live at a step end.
  FrameWalk walk(uint32_t stack) {
    return [this, stack](const std::function<bool(const Frame&)>& visit) {
      bool inner = true;
      trace_.stacks.visit(stack, [&](uint64_t word) {
        for (const Frame& f : symbolizer().resolve(word, !inner)) {
          if (!visit(f)) return false;
        }
        inner = false;
        return true;
      });
    };
  }
  void name(std::vector<SiteTotal>& totals) {
    for (SiteTotal& t : totals) t.site = name(t.site.stack, t.site.kind);
  }
  std::vector<std::string> warnings() const {
    std::vector<std::string> out = symbolizer_ ? symbolizer_->warnings() : std::vector<std::string>{};
    if (sites_cut_ > 0) {
      out.push_back(std::to_string(sites_cut_) + " sites are shown with only some of their frames, or none: the "
                    "frames of the sites shown would take more than " + std::to_string(budget_ >> 20) +
                    " MiB, the most the report takes for a trace of this size (one damaged or made up, or "
                    "unusually many deep stacks); the report is partial");
    }
    return out;
  }

 private:
  // Made on the first frame named.
  Symbolizer& symbolizer() {
    if (!symbolizer_) {
      symbolizer_ = std::make_unique<Symbolizer>(trace_.modules, options_);
      symbolizer_->set_python(&trace_.python_codes, trace_.python_module);
    }
    return *symbolizer_;
  }

  const Trace& trace_;
  const SymbolizerOptions& options_;
  const uint64_t budget_;
  uint64_t spent_ = 0;
  uint64_t sites_cut_ = 0;
  std::unique_ptr<Symbolizer> symbolizer_;
  const std::vector<uint32_t>* graph_stacks_ = nullptr;
  std::vector<const std::vector<Frame>*> chains_;  // of the stack being named
};

// The header's account of the process.
ProcessReport describe_process(const Trace& trace) {
  ProcessReport r;
  r.trace_path = trace.path;
  r.pid = trace.pid();
  r.ppid = std::atoi(trace.header_value("ppid", "0").c_str());
  r.command = trace.command_line();
  r.host_mode = trace.header_value("host_mode", "unknown");
  r.sample_interval = std::strtoull(trace.header_value("sample_interval", "0").c_str(), nullptr, 10);
  r.rank = trace.header_value("rank");
  r.local_rank = trace.header_value("local_rank");
  r.world_size = trace.header_value("world_size");
  r.host = trace.header_value("host");
  r.start_mono_ns = std::strtoull(trace.header_value("start_mono_ns", "0").c_str(), nullptr, 10);
  r.allocator.name = trace.header_value("allocator");
  r.allocator.path = trace.header_value("allocator_path");
  r.allocator.reached = trace.header_value("allocator_reached");
  // Traces from before the allocator was named took held bytes from mallinfo2.
  r.allocator.held_source = trace.header_value("allocator_held", r.allocator.name.empty() ? "mallinfo2" : "none");
  r.allocator.held_known = r.allocator.held_source != "none";
  r.allocator.traced = trace.header_value("host_untraced", "0") != "1";
  return r;
}

// What reading the trace found (complete once its events have streamed by).
void take_integrity(ProcessReport& r, const Trace& trace) {
  r.dropped = trace.dropped;
  r.frames_read = trace.frames_read;
  r.frames_damaged = trace.frames_damaged;
  r.truncated = trace.truncated;
  r.duration_ns = trace.last_ts;
}

void take_replay(ProcessReport& r, EventPass& pass) {
  ReplayOutput& replay = pass.replay;
  r.step_source = replay.step_source;
  r.step_inference = pass.steps.description;
  r.steps = std::move(replay.steps);
  r.peak = replay.peak;
  r.events = replay.events;
  r.unknown_frees = replay.unknown_frees;
  r.double_allocations = replay.double_allocations;
  r.failed_allocations = replay.failed_allocations;
  r.ooms = std::move(replay.ooms);
  r.cupti = std::move(pass.cupti);
}

void take_growth(ProcessReport& r, Growth& growth) {
  r.warmup_steps = growth.warmup_steps;
  r.total_growth = total_growth(r.steps, growth.warmup_steps);
  r.leak_suspects = std::move(growth.suspects);
}

void take_leaks(ProcessReport& r, ExitLeaks& leaks, LiveSets& live) {
  r.exit_leaks = std::move(leaks.leaks);
  r.exit_leak_bytes = leaks.leak_bytes;
  r.exit_leak_count = leaks.leak_count;
  r.exit_leak_bytes_error = leaks.leak_bytes_error;
  r.startup = std::move(leaks.startup);
  r.startup_bytes = leaks.startup_bytes;
  r.startup_count = leaks.startup_count;
  r.startup_bytes_error = leaks.startup_bytes_error;
  r.leak_counts_estimated = leaks.counts_estimated;
  r.live_at_peak = std::move(live.at_peak);
  r.live_at_end = std::move(live.at_end);
  r.profile_sites_dropped = live.sites_dropped;
}

// Names every site the report shows, in the order it shows them.
void name_sites(ProcessReport& r, const std::vector<Site>& oom_sites, const StopVerdict& stop, SiteNamer& namer) {
  for (LeakSuspect& s : r.leak_suspects) s.site = namer.name(s.site.stack, s.site.kind);
  namer.name(r.exit_leaks);
  namer.name(r.startup);
  namer.name(r.live_at_peak);
  namer.name(r.live_at_end);
  for (size_t i = 0; i < r.ooms.size(); ++i) {
    r.ooms[i].stack = namer.name(oom_sites[i].stack, oom_sites[i].kind).frames;
    namer.name(r.ooms[i].live_by_site);
  }
  if (stop.has_crash_stack) r.verdict.crash_stack = namer.name(stop.crash_stack, 0).frames;
  if (r.cupti.compared) {
    for (CuptiMismatch& m : r.cupti.hooks_only_list) m.frames = namer.name(m.stack, m.kind).frames;
    for (CuptiMismatch& m : r.cupti.size_differences_list) m.frames = namer.name(m.stack, m.kind).frames;
  }
}

ProcessReport analyze_events(const Trace& trace, const EventFeed& feed, const std::function<void()>& rewind,
                             const ExitInfo& exit_info, const AnalysisOptions& options) {
  ProcessReport r = describe_process(trace);
  const bool sampled = r.host_mode == "sampled";
  // A Python process's retention paths name its live blocks at one moment:
  // the replay keeps the live set of that moment for them.
  const RetentionFile kept =
      trace.path.empty() ? RetentionFile{}
                         : read_retention(std::filesystem::path(trace.path).parent_path().string(), r.pid);
  std::vector<InheritedBlock> kept_live;
  AnalysisOptions pass_options = options;
  if (!kept.owners.empty()) pass_options.keep_live_sets.push_back({kept.seq, &kept_live, true});
  EventPass pass = replay_with_steps(trace, feed, rewind, sampled, pass_options);
  merge_attributed_variants(trace, pass.replay);
  find_python_role(trace, r);  // the code records are all read once the events are
  const ReplayOutput& replay = pass.replay;
  // More stacks than rows are kept until the rows are made of them (one row
  // per user line, site_groups.h).
  GrowthOptions growth_options{options.warmup_steps, options.max_suspects * kStacksPerRow, sampled, r.sample_interval};
  if (replay.step_source == "auto" || replay.step_source == "time") growth_options.min_growth = kMinAutoStepGrowth;
  growth_options.line_of = [&](const SiteAcc& site) { return program_line_key(trace, site); };
  Growth growth = find_growth(replay.sites, replay.steps.size(), growth_options);
  if (pass.steps.by_time) drop_imports(trace, growth.suspects);
  ExitLeaks leaks = find_exit_leaks(replay, options.max_exit_sites * kStacksPerRow, sampled ? r.sample_interval : 0,
                                    pass.steps.by_time, [&](uint32_t stack) { return under_import(trace, stack); },
                                    [&](uint32_t stack) { return under_memledger(trace, stack); });
  LiveSets live = live_sets(replay, options.max_profile_sites);
  GrowthView grown = growth_view(replay, growth.warmup_steps, options.growth_window, options.max_profile_sites);
  grown.estimated = sampled;
  const HiddenAllocator hidden = find_hidden_allocator(trace.modules, replay.steps, replay.pool_allocs, !trace.vmm.empty());
  const StopVerdict stop = judge_stop(trace, exit_info, replay.ooms, replay.steps);
  const uint64_t stackless = replay.stackless;

  take_integrity(r, trace);
  take_replay(r, pass);
  const int parent_pid = trace.header_value("fork_seq").empty()
                             ? 0
                             : std::atoi(trace.header_value("parent_trace", "0").c_str());
  if (options.inherited != nullptr) {
    r.inheritance.parent = options.inherited_from;
    r.inheritance.blocks = replay.inherited_blocks;
    r.inheritance.bytes = replay.inherited_bytes;
    r.inheritance.freed_blocks = replay.inherited_freed_blocks;
    r.inheritance.freed_bytes = replay.inherited_freed_bytes;
  }
  if (parent_pid > 0) {
    r.inheritance.host_live_at_fork = std::strtoll(trace.header_value("inherited_host_live", "-1").c_str(), nullptr, 10);
  }
  take_growth(r, growth);
  {
    r.retention_when = kept.when;
    r.retention_seconds = kept.elapsed_seconds;
    r.retention_skipped = kept.skipped;
    r.retention_error = kept.error;
    attach_retention(kept, kept_live, replay, r.leak_suspects);
    if (!kept.error.empty()) r.notes.push_back("retention paths unreadable: " + kept.error);
    if (!kept.skipped.empty()) {
      char took[32];
      std::snprintf(took, sizeof took, "%.2f s", kept.elapsed_seconds);
      std::string note = std::string("retention paths: the walk of the Python objects (") + took + ") was cut short: ";
      for (size_t i = 0; i < kept.skipped.size(); ++i) note += (i ? "; " : "") + kept.skipped[i];
      r.notes.push_back(note + " (MEMLEDGER_RETENTION_BUDGET=SECONDS gives it longer)");
    }
  }
  // Time windows hold start-up (imports, building a model) that steps would
  // have set apart: the total is not a figure to gate on, the sites are.
  if (pass.steps.by_time) r.total_growth.judged = false;
  take_leaks(r, leaks, live);
  r.caching_allocator_hidden = hidden.hidden;
  r.caching_allocator_note = hidden.note;
  r.verdict = stop.verdict;
  SiteNamer namer(trace, options.symbolizer);
  namer.set_graph_stacks(&pass.replay.graph_stacks);
  name_sites(r, pass.replay.oom_sites, stop, namer);
  r.leak_suspects = group_suspects(std::move(r.leak_suspects), r.warmup_steps, options.max_suspects);
  r.window_seconds = pass.steps.window_seconds;
  for (LeakSuspect& s : r.leak_suspects) {
    s.window_seconds = r.window_seconds;
    for (LeakSuspect& v : s.variants) v.window_seconds = r.window_seconds;
  }
  r.exit_leaks = group_site_totals(std::move(r.exit_leaks), options.max_exit_sites);
  r.startup = group_site_totals(std::move(r.startup), options.max_exit_sites);
  namer.name(grown.sites);
  grown.sites = group_site_totals(std::move(grown.sites), options.max_exit_sites * 5);
  r.growth_view = std::move(grown);
  assign_roles(
      r, replay, RoleTable(options.role_rules), [&](uint32_t stack) { return namer.walk(stack); },
      [&](uint32_t stack, uint8_t kind) { return namer.name(stack, kind); }, sampled);
  // Device memory no hook saw, judged like a site (named already).
  for (LeakSuspect& s : find_not_hooked_growth(r.steps, options.warmup_steps, options.max_suspects)) {
    r.leak_suspects.push_back(std::move(s));
  }
  r.notes = collect_notes(NotesInput{trace, sampled, r.sample_interval, r.events, stackless, r.unknown_frees,
                                     r.failed_allocations, r.ooms.size(), growth.note, hidden.note, r.cupti,
                                     namer.warnings(), pass.steps.note, &r.allocator});
  if (replay.own_work_bytes >= kOwnWorkNoteMin) {
    r.notes.push_back("memledger's own walk of the Python heap (what keeps the large buffers alive, at exit or at "
                      "memledger.snapshot()) held up to " + human_bytes(double(replay.own_work_bytes)) +
                      " more while it ran" + (sampled ? " (at the writer's samples, every 100 ms)" : "") +
                      "; the peak leaves it out (memledger run --no-retention turns the walk off)");
  }
  if (leaks.scaled_from > 0) {
    r.notes.push_back("live at exit: the sampled allocations' estimate (" + human_bytes(double(leaks.scaled_from)) +
                      ") was more than the " + human_bytes(double(leaks.scaled_to)) +
                      " that the exact host total leaves them; the exit-leak figures are scaled down to it (run "
                      "with --host full for exact figures)");
  }
  const std::string rss = rss_without_live_note(r.steps, r.warmup_steps, r.window_seconds, !trace.python_codes.empty());
  if (!rss.empty()) r.notes.push_back(rss);
  if (std::string inherited = inheritance_note(r.inheritance, parent_pid, sampled); !inherited.empty()) {
    r.notes.push_back(std::move(inherited));
  }
  if (parent_pid > 0) {
    std::string copied = copy_on_write_note(trace.shares, r.steps, r.inheritance.host_live_at_fork,
                                            !trace.python_codes.empty(), &r.copied_on_write);
    if (!copied.empty()) r.notes.push_back(std::move(copied));
  }
  r.environment = read_environment(trace);
  judge_environment(r.environment, r.verdict, r.notes);
  r.host_pressure = summarize_pressure(trace);
  judge_pressure(r.host_pressure, r.verdict, r.notes);
  return r;
}

}  // namespace

ProcessReport analyze(const Trace& trace, const ExitInfo& exit_info, const AnalysisOptions& options) {
  return analyze_events(
      trace, [&](const EventBatchFn& on_events) { on_events(trace.events.data(), trace.events.size()); }, [] {},
      exit_info, options);
}

ProcessReport analyze_stream(Trace& trace, const ExitInfo& exit_info, const AnalysisOptions& options) {
  const Trace before = trace;  // header only: the events are streamed
  return analyze_events(
      trace, [&](const EventBatchFn& on_events) { stream_trace(trace, on_events); }, [&] { trace = before; },
      exit_info, options);
}

// A CUDA runtime or driver API entry point (cudaMallocAsync, cuMemAlloc_v2):
// what lies inside it is the library's business, even when a statically
// linked runtime puts it inside the program with symbols.
bool is_cuda_api(const std::string& function) {
  if (function.size() > 4 && function.compare(0, 4, "cuda") == 0 && std::isupper(static_cast<unsigned char>(function[4]))) {
    return true;
  }
  return function.size() > 2 && function.compare(0, 2, "cu") == 0 && std::isupper(static_cast<unsigned char>(function[2]));
}

// Index of the first frame that is the user's code rather than allocator
// plumbing: past the outermost CUDA API frame, then past allocator frames.
// Python source that belongs to the interpreter or an installed package
// (the standard library, site-packages, dist-packages, frozen modules), not
// to the program being traced.
bool is_memledger_python_file(const std::string& file) {
  // Called for every frame the report names: one search, no copies.
  constexpr std::string_view kPackage = "/memledger/";
  const size_t at = file.rfind(kPackage);
  if (at == std::string::npos) return false;
  const std::string_view module = std::string_view(file).substr(at + kPackage.size());
  for (std::string_view own : {"__init__.py", "__main__.py", "_autoload.py", "_command.py", "_retention.py", "keras.py",
                               "lightning.py", "pytest_plugin.py", "_boot/sitecustomize.py"}) {
    if (module == own) return true;
  }
  return false;
}

bool is_library_python_file(const std::string& file) {
  if (file.empty() || file.front() == '<') return true;
  if (is_memledger_python_file(file)) return true;
  if (file.find("/site-packages/") != std::string::npos || file.find("/dist-packages/") != std::string::npos) {
    return true;
  }
  // The standard library: .../lib/python3.11/...
  const size_t lib = file.find("/lib/python");
  return lib != std::string::npos && lib + 11 < file.size() && std::isdigit(static_cast<unsigned char>(file[lib + 11]));
}

size_t user_frame_index(const std::vector<Frame>& frames) {
  // Python frames come first: the innermost one in the program's own files
  // (not in a framework or the standard library) is the program's line;
  // else the innermost Python frame.
  size_t first_python = frames.size();
  for (size_t i = 0; i < frames.size() && frames[i].python; ++i) {
    if (frames[i].function.empty()) continue;
    if (first_python == frames.size()) first_python = i;
    if (!is_library_python_file(frames[i].file)) return i;
  }
  if (first_python != frames.size()) return first_python;
  size_t start = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    if (is_cuda_api(frames[i].function)) start = i + 1;
  }
  for (size_t i = start; i < frames.size(); ++i) {
    if (!is_allocator_frame(frames[i]) && !frames[i].function.empty()) return i;
  }
  return start < frames.size() ? start : 0;
}

}  // namespace memledger::report
