// Replays a trace and computes what the report shows, in DESIGN.md's words:
// live and held bytes per step, growth leak suspects, exit leaks (apart from
// one-off start-up allocations), the peak, and the stop verdict.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cupti_view.h"
#include "role_rules.h"
#include "symbolizer.h"
#include "trace_format.h"
#include "trace_reader.h"

namespace memledger::report {

// Two step ends, 1-based (from < to); from 0: the default window.
struct GrowthWindow {
  uint64_t from = 0;
  uint64_t to = 0;
};

// A block of a process's host heap live set at a fork,
// which the forked child inherits: its live_key, bytes (sampled mode: the
// estimate it stands for) and kind.
struct InheritedBlock {
  uint64_t key = 0;
  uint64_t weight = 0;
  uint8_t kind = 0;
  uint32_t site = 0;  // the block's site in the replay that kept it
};

// A live set to keep: the one just before the first event whose sequence
// number is `seq` or more (at the end when none is), copied into `out`;
// the host heap's blocks only, or `every_kind`.
struct KeepLiveSet {
  uint64_t seq = 0;
  std::vector<InheritedBlock>* out = nullptr;
  bool every_kind = false;
};

// What a forked child inherited, as its report tells it.
struct Inheritance {
  int parent = 0;              // pid of the parent whose trace gave the live set; 0: none known
  uint64_t blocks = 0, bytes = 0;              // at the fork
  uint64_t freed_blocks = 0, freed_bytes = 0;  // of those, freed by the child
  int64_t host_live_at_fork = -1;              // exact, from the child's tracer; -1: not recorded
};

struct AnalysisOptions {
  int warmup_steps = -1;  // -1: automatic (a tenth of the steps, at least 1, at most 10)
  size_t max_suspects = 20;
  size_t max_exit_sites = 20;
  size_t max_profile_sites = 5000;  // sites kept in the live sets at the peak and at the end
  SymbolizerOptions symbolizer;
  GrowthWindow growth_window;  // of the growth view; default: the warm-up's end to the last step
  std::vector<RoleRule> role_rules;  // tried before the built-in ones (a policy file's [roles])
  // Live sets the replay keeps: a parent's host live set just before each
  // forked child's fork_seq, the whole live set at a retention snapshot's
  // moment (retention.h). A forked child starts from the live set it
  // inherited (`inherited`, from `inherited_from`).
  std::vector<KeepLiveSet> keep_live_sets;
  const std::vector<InheritedBlock>* inherited = nullptr;
  int inherited_from = 0;
};

struct KernelLog;  // kernel_log.h

// How the process ended, as told by `memledger run` (waitpid) when known.
struct ExitInfo {
  bool known = false;
  bool signaled = false;
  int code = 0;
  int signo = 0;
  // What the kernel said after the run (OOM killer lines, cgroup OOM kill
  // counts), for every process of it; null without `memledger run`.
  const KernelLog* kernel = nullptr;
};

// A holder of device memory the program does not use right now: a pool's
// reserve, the rounding of cudaMalloc to the allocation granularity.
struct Holder {
  std::string name;
  uint64_t held = 0;
  uint64_t unused = 0;
};

struct StepStats {
  uint64_t index = 0;
  std::string source;  // "marker", "interval", "none"
  std::string label;
  uint64_t end_ns = 0;
  int64_t live[format::kKindCount] = {};  // per format::Kind, at the step end
  std::vector<int64_t> live_by_device;  // live[kDevice] by device ordinal (empty: no device memory)
  uint64_t held_host = 0;
  int64_t held_device = 0;  // pools' reserve + granularity-rounded allocations + VMM physical memory
  std::vector<Holder> device_holders;
  uint64_t device_free = 0;   // cuMemGetInfo of the sampled device at the step end (0 = not sampled)
  uint64_t device_total = 0;
  uint64_t reserved_address_space = 0;  // VMM reservations (not memory)
  // Per sampled device: (total - free) - held on that device, the device
  // memory that no hooked call allocated (contexts, kernel images, libraries'
  // own allocations, other processes, IPC-opened memory). Empty without samples.
  std::vector<std::pair<uint32_t, int64_t>> not_hooked_by_device;
  uint64_t rss = 0;
  uint64_t allocations = 0;
  uint64_t frees = 0;
};

// Live bytes of every kind together at a step end.
inline int64_t total_live(const StepStats& s) {
  int64_t sum = 0;
  for (int64_t v : s.live) sum += v;
  return sum;
}

struct Site {
  uint32_t stack = 0;
  uint8_t kind = 0;
  std::vector<Frame> frames;  // symbolized, innermost first
  // Its allocations include CUDA graph allocations (format::kAllocGraph):
  // memory a graph launch allocated, the stack being the capture site.
  bool graph = false;
  // What its allocations are (roles.h): "activation", ...; empty when not
  // classified. role_rule: what the rule that decided recognises.
  std::string role = {};
  std::string role_rule = {};
};

// What keeps a suspect's live blocks alive, from the Python module's
// retention paths (report/retention.h): the chain of referrers of the
// objects that own them, outermost (the named root) first, the owners'
// description last; how many of the site's live blocks it holds, and bytes.
struct KeptBy {
  std::vector<std::string> hops;
  uint64_t objects = 0;
  uint64_t bytes = 0;
};

struct LeakSuspect {
  Site site;
  double bytes_per_step = 0;
  double allocations_per_step = 0;
  // Sampled host mode: the figures above are estimates (sampling.h), each
  // with one standard deviation of the Poisson sampling model.
  bool estimated = false;
  double bytes_per_step_error = 0;
  double allocations_per_step_error = 0;
  uint64_t first_step = 0;
  double monotonicity = 0;  // share of step-to-step changes that are not decreases
  double r_squared = 0;
  int64_t live_at_end = 0;
  std::vector<int64_t> series;  // live bytes of the site at each step end
  // One row per line of user code (site_groups.h): how many stacks that
  // differ only around the same user line were merged into this row, and,
  // when more than one, each of them with its own figures, fastest first.
  // The figures above are their sums; `site` is the fastest one's stack.
  size_t stacks_merged = 1;
  std::vector<LeakSuspect> variants;
  // Steps that are time windows (source "time"): each window's length; the
  // rate is then also bytes_per_step / window_seconds per second.
  double window_seconds = 0;
  // When the role makes the cause plain (roles.h, role_explanation).
  std::string role_explanation;
  // Python programs: the paths that keep its live blocks, most bytes first
  // (at most three).
  std::vector<KeptBy> kept_by;
};

struct SiteTotal {
  Site site;
  int64_t bytes = 0;
  uint64_t count = 0;
  // Sampled host mode (exit leaks, start-up allocations): the bytes are an
  // estimate, with one standard deviation of the Poisson sampling model.
  bool estimated = false;
  double bytes_error = 0;
  // As LeakSuspect's: the stacks merged into this row by its user line, and
  // each of them (largest first) when more than one; `site` is the largest.
  size_t stacks_merged = 1;
  std::vector<SiteTotal> variants;
};

// A failed device allocation, with the picture at that moment.
struct OomEvent {
  uint64_t requested = 0;
  int error = 0;
  int device = 0;
  uint8_t kind = 0;
  uint64_t step = 0;
  uint64_t ts_ns = 0;
  std::vector<Frame> stack;
  int64_t device_live = 0;     // live device bytes of the process at that moment
  uint64_t device_free = 0;    // last cuMemGetInfo sample before it (0 = none)
  uint64_t device_total = 0;
  uint64_t held_unused = 0;    // pools' reserved-but-unused bytes at the last sample
  std::vector<Holder> holders;
  std::vector<SiteTotal> live_by_site;  // device live set at the moment of the failure (its largest sites)
  struct LiveSite {
    uint8_t kind;
    uint32_t stack;
    int64_t bytes;
  };
  std::vector<LiveSite> live_sites;     // every site of that live set
  std::vector<int64_t> live_by_role;    // the live set by role (roles.h; empty when not classified)
};

struct Verdict {
  std::string kind;  // exit, signal, crash, host_oom_kill, cuda_oom, killed, exec
  std::string summary;
  int exit_code = 0;
  int signo = 0;
  std::string signal_name;
  uint64_t fault_addr = 0;
  std::vector<Frame> crash_stack;
  uint64_t last_rss = 0;
  uint64_t cgroup_limit = 0;
  uint64_t cgroup_usage = 0;
};

// The CUDA stack and frameworks of the process (environment.h).
struct CudaLibrary {
  std::string name;     // the family: libcudart, libcudnn, ...
  std::string path;     // as loaded
  std::string version;  // from the library's own call ("12.8", "9.1.0"); "" when it has none
  std::string build_id;  // from the module map, when the version is unknown
  int major = -1;       // from the version, else from the file name (libcudart.so.12); -1 unknown
};

struct Environment {
  std::string driver;                // the CUDA version the driver supports ("12.2"; "" unknown)
  std::string driver_release;        // the NVIDIA kernel module's release ("580.65.06"; "" unknown)
  std::string driver_library_release;  // the release libcuda's file name carries (libcuda.so.580.65.06)
  std::vector<std::string> devices;  // "0: NAME, 80.0 GiB"
  std::vector<CudaLibrary> libraries;
  // Framework name -> (field, value) pairs as the Python module found them.
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> frameworks;
  std::string init_error;        // "cudaGetDeviceCount 35": a CUDA call refused for the driver's version
  // "cudnnCreate 1002 CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH\tPATH": a
  // library's handle-creating call that failed, with the library's file.
  std::vector<std::string> create_errors;
  std::string python_exception;  // "torch.OutOfMemoryError: CUDA out of memory. ..."
  std::vector<std::string> findings;

  bool empty() const {
    return driver.empty() && driver_release.empty() && driver_library_release.empty() && devices.empty() && libraries.empty() && frameworks.empty() && init_error.empty() &&
           create_errors.empty() && python_exception.empty();
  }
};

// The host's memory over the run (pressure.h), from the kPressure records.
struct HostPressure {
  bool sampled = false;  // the trace has pressure records
  bool psi = false;      // /proc/pressure/memory was readable
  bool swap_counters = false;  // /proc/vmstat was readable
  uint64_t mem_total = 0;
  uint64_t min_available = 0;     // lowest MemAvailable
  uint64_t min_available_ts = 0;  // when (ns since the trace's start)
  uint64_t last_available = 0;
  uint64_t swap_total = 0;
  uint64_t max_swap_used = 0;
  double max_swap_in = 0;   // bytes/s between two records
  double max_psi_some = 0;  // avg10, percent
  double max_psi_full = 0;
  std::string cgroup;            // the memory cgroup's directory (trace header)
  uint64_t cgroup_oom_kills = 0;  // OOM kills the cgroup counted while the process ran
  double freeze_seconds = 0;     // the trailing stretch of thrashing (0: none)
  std::string freeze;            // the finding, when there is one
};

struct Peak {
  int64_t bytes = 0;
  uint64_t step = 0;   // the step in which the peak happened (1-based; 0 = no steps)
  uint64_t ts_ns = 0;
  uint8_t kind = 0;
};

// The growth of all live bytes per step after the warm-up: the figure
// `memledger check --max-growth-per-step` gates on (check.h, fit_growth).
struct TotalGrowth {
  bool judged = false;  // at least 3 steps after the warm-up
  double per_step = 0;
  double r_squared = 0;
  uint64_t first_step = 0;  // the window fitted (1-based)
  uint64_t last_step = 0;
  bool plateau = false;  // the last half of the window grew less, and its slope is the one given
};

// The program's host allocator, as the trace header names it
// (interposer/next_allocator.h).
struct HostAllocator {
  std::string name = {};         // glibc, jemalloc, tcmalloc, mimalloc, other; empty: not recorded (older trace)
  std::string path = {};         // the object that defines its malloc
  std::string reached = {};      // how the program reaches it
  std::string held_source = {};  // the statistic held host bytes come from
  bool traced = true;            // false: the program's malloc bypasses memledger
  bool held_known = true;        // false: the allocator offers no statistics (held host bytes unknown, not 0)
};

// What grew between two step ends, by site (growth_view.h).
struct GrowthView {
  uint64_t from_step = 0, to_step = 0;
  std::vector<SiteTotal> sites;  // gained bytes, largest first
  int64_t bytes = 0;             // of every site, listed or not
  bool estimated = false;        // sampled host mode
  std::string note;              // why there is none
};

// Live bytes by role at each step end (roles.h). Every role is listed,
// in the order of `names`; their sum is the live bytes of all kinds.
struct RoleLive {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> per_step;  // [step][role]
  std::vector<int64_t> at_end;                 // live at exit, by role
  std::vector<double> growth_per_step;         // after the warm-up (Theil-Sen), by role
  // The roles that grow (roles.h, kRoleGrowthFloor), fastest first: name, bytes per step.
  std::vector<std::pair<std::string, double>> growing;
  bool estimated = false;                      // sampled host mode: host bytes split by the samples' shares
  // The largest sites of each role at the last step end (at most
  // kRoleTopSites each; `bytes` their live bytes there), by role.
  std::vector<std::vector<SiteTotal>> top_sites;
  std::vector<std::vector<std::string>> top_phases;  // when each allocated: startup, steps, teardown
  // Live bytes by role at the peak (the sites of live_at_peak; sampled host
  // mode: their estimates), and the peak's bytes no classified site holds
  // (sites left out of live_at_peak). Empty without a peak.
  std::vector<int64_t> at_peak;
  size_t sites = 0;                            // sites classified
  size_t user_rules = 0;                       // rules from a policy file
};

struct ProcessReport {
  std::string trace_path;
  RoleLive roles;
  // Source "time": the length of each window (0 otherwise).
  double window_seconds = 0;
  // What the process is to a Python framework, from the code it ran:
  // "DataLoader worker" (PyTorch), "Pool worker" (multiprocessing.Pool),
  // "ProcessPool worker" (concurrent.futures); empty when none.
  // start_method: "spawn" or "forkserver" when multiprocessing started the
  // interpreter that way, else empty.
  // A Jupyter kernel ("Jupyter kernel") and a Jupyter server ("Jupyter
  // server") are named from their command line; kernel_id: the kernel's id,
  // from its connection file (kernel-<id>.json), else empty.
  std::string python_role;
  std::string start_method;
  std::string kernel_id;
  GrowthView growth_view;
  int pid = 0;
  int ppid = 0;
  std::string command;
  std::string host_mode;
  uint64_t sample_interval = 0;
  HostAllocator allocator;
  std::string rank;
  std::string local_rank;
  std::string world_size;
  std::string host;
  uint64_t start_mono_ns = 0;  // CLOCK_MONOTONIC at the trace's start: aligns the processes of one machine
  std::string step_source;  // marker, interval, auto, none
  std::string step_inference;  // step_source auto: what inference found ("inferred period N allocations ...")
  int warmup_steps = 0;
  std::vector<StepStats> steps;
  std::vector<LeakSuspect> leak_suspects;
  TotalGrowth total_growth;
  std::vector<SiteTotal> exit_leaks;
  int64_t exit_leak_bytes = 0;
  uint64_t exit_leak_count = 0;
  double exit_leak_bytes_error = 0;  // sampled mode: one standard deviation
  std::vector<SiteTotal> startup;
  int64_t startup_bytes = 0;
  uint64_t startup_count = 0;
  double startup_bytes_error = 0;
  bool leak_counts_estimated = false;  // sampled mode: the counts and bytes above are estimates
  Peak peak;
  Verdict verdict;
  uint64_t duration_ns = 0;
  uint64_t events = 0;
  uint64_t dropped = 0;
  uint64_t unknown_frees = 0;
  Inheritance inheritance;  // a forked child: the parent's live set it started with
  // A forked child: its private memory's growth that no allocation explains,
  // from copy-on-write (copy_on_write_note); 0 when under the note's bounds.
  uint64_t copied_on_write = 0;
  // The retention paths the Python module wrote for this process: when,
  // how long the walk took, what it skipped; empty `retention_when` when
  // there were none (not Python, --no-retention, or the file is unreadable:
  // retention_error says why).
  std::string retention_when;
  double retention_seconds = 0;
  std::vector<std::string> retention_skipped;
  std::string retention_error;
  uint64_t double_allocations = 0;
  uint64_t failed_allocations = 0;
  std::vector<OomEvent> ooms;  // out-of-memory failures (first ones kept)
  bool caching_allocator_hidden = false;  // a framework caching allocator sits between the program and the driver
  std::string caching_allocator_note;
  uint64_t frames_read = 0;
  uint64_t frames_damaged = 0;
  bool truncated = false;
  std::vector<std::string> notes;  // integrity problems and caveats, for the reader
  // Live bytes and allocations by site at the peak (the moment the running
  // total was highest) and at the end, largest first: what flame graphs and
  // the pprof export show. Sampled host mode: per-site estimates.
  std::vector<SiteTotal> live_at_peak;
  std::vector<SiteTotal> live_at_end;
  uint64_t profile_sites_dropped = 0;  // smallest sites left out past max_profile_sites
  CuptiView cupti;  // CUPTI's view of device memory beside the hooks' (or why there is none)
  Environment environment;
  HostPressure host_pressure;
};

// Analyses a trace whose events are in memory (read_trace(path)).
ProcessReport analyze(const Trace& trace, const ExitInfo& exit_info, const AnalysisOptions& options);
// Analyses a trace opened with read_trace(path, false), streaming its events
// from the file (stream_trace): memory stays flat however long the trace.
ProcessReport analyze_stream(Trace& trace, const ExitInfo& exit_info, const AnalysisOptions& options);

// Least-squares slope and fit quality of y over x = 0, 1, 2, ...
struct LinearFit {
  double slope = 0;
  double intercept = 0;
  double r_squared = 0;
};
LinearFit fit_line(const std::vector<double>& y);

// The Theil-Sen slope of y over x = 0, 1, 2, ...: the median of the slopes
// between every pair of points (a series of more than 2000 points is thinned
// evenly first). Up to 29% of the points can be arbitrarily far off without
// moving it much, where one such point can swing a least-squares fit.
double theil_sen_slope(const std::vector<double>& y);

// The share of y's step-to-step changes that are not decreases.
double monotone_share(const std::vector<double>& y);

std::string signal_name(int signo);

// Index of the first frame that is the user's code rather than allocator
// plumbing (operator new, std:: containers, libc): the frame a site is named by.
size_t user_frame_index(const std::vector<Frame>& frames);

// Python source of the interpreter or an installed package (the standard
// library, site-packages, dist-packages, frozen modules, memledger's own
// package wherever it lies), not the program's.
bool is_library_python_file(const std::string& file);

// A file of memledger's own Python package (tools/python/memledger), as the
// run put it on the program's path or as pip installed it: its step hooks
// wrap the frameworks' calls (a DataLoader's __next__, Keras callbacks), so
// its frames lie between the program's line and what the framework made.
bool is_memledger_python_file(const std::string& file);

std::string human_bytes(double bytes);

// When the first step began: its end less the median duration of the
// steps after it (what the first step did beyond a typical step, such as
// compiling or autotuning, counts as before it). 0 when it cannot be told
// (fewer than 2 steps).
uint64_t first_step_start_ns(const std::vector<StepStats>& steps);

// The phase of a moment in step `step` (1-based; past the last step: after
// it) at `ts_ns`, for the reader: "before the first step" (start-up:
// imports, building the model), "in step N", "after the last step", or
// empty without steps.
std::string phase_of(uint64_t step, uint64_t ts_ns, const std::vector<StepStats>& steps);

// When the peak happened (phase_of).
std::string peak_phase(const Peak& peak, const std::vector<StepStats>& steps);

}  // namespace memledger::report
