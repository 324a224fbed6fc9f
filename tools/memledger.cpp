// The memledger command line: run, report, check, diff, dump.

#include <fcntl.h>
#include <getopt.h>
#include <regex.h>
#include <signal.h>
#include <elf.h>
#include <sys/stat.h>
#include <poll.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "check_command.h"
#include "chrome_trace.h"
#include "file_io.h"
#include "folded.h"
#include "growth_view.h"
#include "html_report.h"
#include "leak_mode.h"
#include "policy.h"
#include "pprof.h"
#include "run_report.h"
#include "status_line.h"
#include "trace_format.h"
#include "trace_reader.h"
#include "window_command.h"

namespace fs = std::filesystem;
using memledger::report::AnalysisOptions;
using memledger::report::TraceError;

namespace {

constexpr const char* kVersion = "0.1.0";

constexpr int kExitUsage = 2;
constexpr int kExitInput = 1;

// The usage of one command, for `memledger COMMAND --help`.
#define MEMLEDGER_RUN_USAGE \
    "run options:\n" \
    "  -o, --output DIR          run folder (default: ./memledger-<program>-<date>-<time>)\n" \
    "      --host MODE           host heap tracking: sampled (default), full, off\n" \
    "      --sample-interval N   mean bytes between host samples in sampled mode (default 131072)\n" \
    "      --step-interval SEC   also end a step every SEC seconds (time-based steps)\n" \
    "      --stack-depth N       native frames kept per stack (default 64, at most 128; 0: no stacks)\n" \
    "      --leak-mode           make every tensor allocation visible to the driver: sets\n" \
    "                            PYTORCH_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync,\n" \
    "                            TF_GPU_ALLOCATOR=cuda_malloc_async, XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async\n" \
    "                            (platform for a JAX that does not accept it)\n" \
    "      --cupti MODE          CUPTI cross-check of device memory: auto (default: when CUPTI\n" \
    "                            and a GPU are there), on (say why when it cannot be used), off\n" \
    "      --cupti-path PATH     libcupti to use (a file or a folder), instead of searching\n" \
    "      --steps nvtx:REGEX    also end a step when an NVTX range whose name matches closes\n" \
    "      --steps kernel:REGEX  also end a step when a matching kernel is launched (CUPTI)\n" \
    "      --no-report           do not build the report at the end\n" \
    "      --policy FILE         the report's roles: the [roles] rules of a policy file (TOML, YAML)\n" \
    "      --no-retention        Python: do not look for what keeps the large buffers alive at exit\n" \
    "      --overwrite           replace the run already in the -o folder (its traces and reports)\n" \
    "  -q, --quiet               no live status line and no summary\n"

#define MEMLEDGER_REPORT_USAGE \
    "report options:\n" \
    "      --format FORMAT       text (default), json, html (one self-contained page),\n" \
    "                            pprof (gzip'd profile.proto: go tool pprof, speedscope),\n" \
    "                            folded (flame graph tools; also 'collapsed'),\n" \
    "                            chrome (trace event JSON for Perfetto's UI)\n" \
    "      --at peak|end|growth  folded: the live set at the peak (default) or at the end, or what grew\n" \
    "                            between two step ends (the growth view)\n" \
    "      --growth-window A:B   the growth view's steps: what grew between the end of step A and the\n" \
    "                            end of step B (default: the warm-up's end to the last step)\n" \
    "  -o, --output FILE         write the report to FILE instead of standard output\n" \
    "      --warmup-steps N      steps ignored before judging growth (default: a tenth, 1 to 10)\n" \
    "      --debug-dir DIR       also look for binaries and debug info in DIR (repeatable)\n" \
    "      --full-stacks         text: every frame (by default runs of library frames are folded)\n" \
    "      --policy FILE         roles: also the [roles] rules of a policy file (TOML, YAML)\n"


const char* const kUsage =
    "usage: memledger <command> [options]\n"
    "\n"
    "commands:\n"
    "  run [options] [--] CMD [ARGS...]   trace CMD and its children, then report\n"
    "  report RUN_DIR|TRACE [options]     the report of a run (text, JSON, HTML) or an export\n"
    "                                     (pprof, folded stacks, Chrome trace)\n"
    "  check RUN [limits] [options]       CI gate: exit 1 when memory grows, peaks or leaks past a limit\n"
    "                                     or against a baseline run\n"
    "  diff A B [options]                 two runs side by side: series, figures, sites that changed\n"
    "  dump TRACE                         every record of a trace file, as text\n"
    "  window TRACE --from-seq N          what one stretch of a process did to its memory (JSON)\n"
    "\n" MEMLEDGER_RUN_USAGE "\n" MEMLEDGER_REPORT_USAGE "\n" MEMLEDGER_CHECK_USAGE "\n" MEMLEDGER_WINDOW_USAGE
    "\n"
    "  memledger --help | --version\n";


const char* const kRunHelp = "usage: memledger run [options] [--] CMD [ARGS...]\n\n" MEMLEDGER_RUN_USAGE;
const char* const kReportHelp = "usage: memledger report RUN_DIR|TRACE [options]\n\n" MEMLEDGER_REPORT_USAGE;
const char* const kDumpHelp = "usage: memledger dump TRACE\n\nevery record of a trace file, as text\n";

// One line: the whole help would bury the message that matters.
int usage_error(const std::string& message, const char* command = nullptr) {
  if (command) {
    std::fprintf(stderr, "memledger: %s (memledger %s --help)\n", message.c_str(), command);
  } else {
    std::fprintf(stderr, "memledger: %s (memledger --help)\n", message.c_str());
  }
  return kExitUsage;
}

std::string self_dir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  return fs::path(buf).parent_path().string();
}

// The preload library, found relative to this executable (build tree or
// installed), or named by MEMLEDGER_LIBRARY.
std::optional<std::string> find_library() {
  if (const char* env = std::getenv("MEMLEDGER_LIBRARY")) {
    if (fs::exists(env)) return fs::absolute(env).string();
  }
  const fs::path dir = self_dir();
  const fs::path candidates[] = {
      dir / ".." / "interposer" / "libmemledger.so",
      dir / ".." / "lib" / "libmemledger.so",
      dir / ".." / "lib" / "x86_64-linux-gnu" / "libmemledger.so",
      dir / ".." / "lib64" / "libmemledger.so",
      dir / "libmemledger.so",
  };
  for (const fs::path& p : candidates) {
    std::error_code ec;
    if (fs::exists(p, ec)) return fs::canonical(p, ec).string();
  }
  return std::nullopt;
}

// The folder holding the `memledger` Python package (tools/python), found
// relative to this executable: next to it in the build tree, under
// share/memledger/python when installed.
std::optional<std::string> find_python_dir() {
  const fs::path dir = self_dir();
  const fs::path candidates[] = {
      dir / "python",
      dir / ".." / "share" / "memledger" / "python",
  };
  for (const fs::path& p : candidates) {
    std::error_code ec;
    if (fs::exists(p / "memledger" / "__init__.py", ec)) return fs::canonical(p, ec).string();
  }
  return std::nullopt;
}

// The folder of the start-up hook (sitecustomize.py) that loads the Python
// helpers in every traced Python process: inside the package found above,
// or, in the wheel, the package this executable sits in (memledger/_native).
std::optional<std::string> find_python_boot_dir(const std::optional<std::string>& python_dir) {
  std::vector<fs::path> candidates;
  if (python_dir) candidates.push_back(fs::path(*python_dir) / "memledger" / "_boot");
  candidates.push_back(fs::path(self_dir()) / ".." / "_boot");
  for (const fs::path& p : candidates) {
    std::error_code ec;
    if (fs::exists(p / "sitecustomize.py", ec)) return fs::canonical(p, ec).string();
  }
  return std::nullopt;
}

std::optional<uint64_t> parse_count(const char* text) {
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || text[0] == '-') return std::nullopt;
  return v;
}

std::string human(double bytes) { return memledger::report::human_bytes(bytes); }

// ---------------------------------------------------------------------------
// memledger run

struct RunOptions {
  std::string output;
  std::string host = "sampled";
  std::string sample_interval;
  std::string step_interval;
  std::string stack_depth;
  bool report = true;
  bool retention = true;
  bool quiet = false;
  bool leak_mode = false;
  bool overwrite = false;
  std::string cupti = "auto";
  std::string cupti_path;
  std::string nvtx_steps;
  std::string kernel_steps;
  std::vector<std::string> command;
  std::vector<memledger::report::RoleRule> role_rules;  // --policy FILE's [roles]
};

// A policy file's role rules (README, "Roles"), or a one-line error.
bool read_role_rules(const char* path, std::vector<memledger::report::RoleRule>& rules, const char* command) {
  try {
    rules = memledger::report::load_policy_file(path).role_rules;
    return true;
  } catch (const std::exception& e) {
    usage_error(e.what(), command);
    return false;
  }
}

// libmemledger_cupti.so beside the preload library (installed), or in the
// build tree's cupti_tracer/ folder: where the preload library looks too.
std::optional<std::string> find_cupti_module(const std::string& library) {
  const fs::path dir = fs::path(library).parent_path();
  for (const fs::path& p : {dir / "libmemledger_cupti.so", dir / ".." / "cupti_tracer" / "libmemledger_cupti.so"}) {
    std::error_code ec;
    if (fs::exists(p, ec)) return fs::canonical(p, ec).string();
  }
  return std::nullopt;
}

// The CUPTI settings of `memledger run`, for the traced process. The module
// becomes the CUDA injection library (started inside cuInit) and, for NVTX
// steps, the NVTX one, each only when no other tool has claimed the slot.
void set_cupti_environment(const RunOptions& opts, const std::string& library) {
  setenv("MEMLEDGER_CUPTI", opts.cupti.c_str(), 1);
  if (!opts.cupti_path.empty()) setenv("MEMLEDGER_CUPTI_PATH", opts.cupti_path.c_str(), 1);
  if (!opts.nvtx_steps.empty()) setenv("MEMLEDGER_STEPS_NVTX", opts.nvtx_steps.c_str(), 1);
  if (!opts.kernel_steps.empty()) setenv("MEMLEDGER_STEPS_KERNEL", opts.kernel_steps.c_str(), 1);
  const std::optional<std::string> module = find_cupti_module(library);
  if (!module) {
    if (!opts.nvtx_steps.empty() || !opts.kernel_steps.empty() || opts.cupti == "on") {
      std::fprintf(stderr, "memledger: the CUPTI module (libmemledger_cupti.so) is not installed next to %s: no "
                   "CUPTI%s in this run\n", library.c_str(),
                   opts.nvtx_steps.empty() && opts.kernel_steps.empty() ? "" : " and no NVTX or kernel steps");
    }
    return;
  }
  const char* cuda_injection = std::getenv("CUDA_INJECTION64_PATH");
  if (opts.cupti != "off" && (cuda_injection == nullptr || *cuda_injection == '\0')) {
    setenv("CUDA_INJECTION64_PATH", module->c_str(), 1);
  }
  if (!opts.nvtx_steps.empty()) {
    const char* nvtx = std::getenv("NVTX_INJECTION64_PATH");
    if (nvtx != nullptr && *nvtx != '\0' && fs::path(nvtx) != fs::path(*module)) {
      // Nsight Systems (or another tool) receives the NVTX ranges: never take that from it.
      std::fprintf(stderr, "memledger: NVTX_INJECTION64_PATH is already set (%s): another tool receives the NVTX "
                   "ranges, so --steps nvtx is not used in this run\n", nvtx);
    } else {
      setenv("NVTX_INJECTION64_PATH", module->c_str(), 1);
    }
  }
}

// A run folder's own files: what --overwrite replaces (and nothing else).
bool is_run_file(const std::string& name) {
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  return (starts("trace.") && name.size() > 4 && name.compare(name.size() - 4, 4, ".mlt") == 0) ||
         starts("status.") || name == "run.json" || starts("report.");
}

std::vector<fs::path> run_files_in(const fs::path& dir) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec) && is_run_file(entry.path().filename().string())) found.push_back(entry.path());
  }
  return found;
}

// Makes the run folder when it does not exist: only a folder memledger made
// is its to give a mode (0700, whatever the umask). A folder that was there
// (`-o .`, a shared 1777 /tmp folder, a symlink to a folder) keeps its mode;
// the files memledger puts in it are 0600.
bool prepare_run_dir(fs::path dir, bool& created, std::string& error) {
  created = false;
  if (!dir.has_filename()) dir = dir.parent_path();  // "out/" is "out"
  std::error_code ec;
  if (dir.has_parent_path()) fs::create_directories(dir.parent_path(), ec);  // a failure shows at mkdir
  if (mkdir(dir.c_str(), 0700) == 0) {
    created = true;
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      fchmod(fd, 0700);  // the umask may have cleared owner bits
      close(fd);
    }
  } else if (errno != EEXIST) {
    error = std::strerror(errno);
    return false;
  } else if (!fs::is_directory(dir, ec)) {
    error = "not a folder";
    return false;
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    error = std::strerror(errno);
    return false;
  }
  return true;
}

// The file `execvp` would run for NAME.
std::string resolve_command(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= dirs.size()) {
    size_t colon = dirs.find(':', pos);
    if (colon == std::string::npos) colon = dirs.size();
    const std::string d = colon > pos ? dirs.substr(pos, colon - pos) : ".";
    const std::string candidate = d + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    pos = colon + 1;
  }
  return name;
}

// Why the loader would not have loaded the preload library into FILE, or ""
// when nothing in the file says so. Static executables have no loader
// (no PT_INTERP); in secure-execution mode (setuid or setgid to another
// user or group, or file capabilities: AT_SECURE) the loader ignores
// LD_PRELOAD outside the trusted folders. Follows one "#!" interpreter.
std::string why_not_preloaded(const std::string& file, int depth = 0) {
  const int fd = open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st;
  unsigned char head[4096];
  const ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? pread(fd, head, sizeof head, 0) : -1;
  close(fd);
  if (n < 4) return "";
  struct statvfs vfs;
  const bool nosuid = statvfs(file.c_str(), &vfs) == 0 && (vfs.f_flag & ST_NOSUID);
  char caps[64];
  const bool has_caps = getxattr(file.c_str(), "security.capability", caps, sizeof caps) > 0;
  if (!nosuid && ((st.st_mode & S_ISUID && st.st_uid != getuid()) || (st.st_mode & S_ISGID && st.st_gid != getgid()) ||
                  has_caps)) {
    return file + " runs in secure-execution mode (" +
           (has_caps ? std::string("it has file capabilities") : std::string("set-user-ID or set-group-ID")) +
           "): the loader ignores LD_PRELOAD there, so memledger cannot trace it";
  }
  if (head[0] == '#' && head[1] == '!' && depth == 0) {
    std::string line(reinterpret_cast<const char*>(head) + 2, static_cast<size_t>(n) - 2);
    line = line.substr(0, line.find('\n'));
    const size_t b = line.find_first_not_of(" \t");
    if (b == std::string::npos) return "";
    const std::string interpreter = line.substr(b, line.find_first_of(" \t", b) - b);
    return why_not_preloaded(interpreter, 1);
  }
  if (std::memcmp(head, "\x7f" "ELF", 4) != 0 || head[4] != 2 /* ELFCLASS64 */) return "";
  Elf64_Ehdr eh;
  if (static_cast<size_t>(n) < sizeof eh) return "";
  std::memcpy(&eh, head, sizeof eh);
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phoff + uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr) > uint64_t(n)) return "";
  for (int i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    std::memcpy(&ph, head + eh.e_phoff + size_t(i) * sizeof ph, sizeof ph);
    if (ph.p_type == PT_INTERP) return "";
  }
  return file + " is statically linked: no dynamic loader runs in it to load the preload library, so memledger "
         "cannot trace it";
}

volatile sig_atomic_t g_forward_signal = 0;
pid_t g_child = 0;

void forward_signal(int signo) {
  memledger::tools::StatusLine::release_from_signal();
  if (g_child > 0) kill(g_child, signo);
  g_forward_signal = signo;
}

std::string default_run_dir(const std::string& program) {
  time_t now = time(nullptr);
  struct tm tm;
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  std::string base = "memledger-" + fs::path(program).filename().string() + "-" + stamp;
  std::string dir = base;
  for (int i = 1; fs::exists(dir); ++i) dir = base + "-" + std::to_string(i);
  return dir;
}

struct StatusTotals {
  long long step = -1;
  long long live = 0;
  long long rss = 0;
  long long growth = 0;
  int processes = 0;
};

StatusTotals read_status(const fs::path& dir) {
  StatusTotals t;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().filename().string().rfind("status.", 0) != 0) continue;
    std::string line, error;
    if (!memledger::report::read_regular_file(entry.path().string(), line, error, 4096)) continue;
    long long step = -1, live = 0, rss = 0, growth = 0;
    int final_flag = 0;
    if (std::sscanf(line.c_str(), "step=%lld live=%lld rss=%lld growth=%lld final=%d", &step, &live, &rss, &growth,
                    &final_flag) < 4) {
      continue;
    }
    if (final_flag) continue;
    ++t.processes;
    t.step = std::max(t.step, step);
    t.live += live;
    t.rss += rss;
    t.growth += growth;
  }
  return t;
}

// run.json: what only `memledger run` knows (the root pid, its exit status
// from waitpid), and why nothing was traced when that happened. It is first
// written when the command has started (without "exit"), so that its space
// is held: on a full disk the final version replaces it in place when a new
// file cannot be made. Says why on stderr when the final version cannot be
// written (`status` given).
bool write_run_file(const fs::path& dir, const RunOptions& opts, pid_t pid, const int* status, double seconds,
                    const std::string& untraced = "", const memledger::report::KernelLog* kernel = nullptr) {
  nlohmann::json j;
  j["schema"] = "memledger-run";
  j["schema_version"] = 1;
  j["command"] = opts.command;
  j["root_pid"] = pid;
  j["host_mode"] = opts.host;
  j["leak_mode"] = opts.leak_mode;
  j["wall_seconds"] = seconds;
  if (status != nullptr && WIFSIGNALED(*status)) {
    j["exit"] = {{"signal", WTERMSIG(*status)}, {"core_dumped", WCOREDUMP(*status) != 0}};
  } else if (status != nullptr && WIFEXITED(*status)) {
    j["exit"] = {{"code", WEXITSTATUS(*status)}};
  }
  if (!untraced.empty()) j["untraced"] = untraced;
  if (kernel != nullptr) j["kernel"] = memledger::report::kernel_log_json(*kernel);
  const std::string text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const std::string path = (dir / "run.json").string();
  std::string error, ignored;
  if (memledger::report::write_private_file(path, text, error) ||
      memledger::report::overwrite_private_file(path, text, ignored)) {
    return true;
  }
  if (status != nullptr) std::fprintf(stderr, "memledger: %s\n", error.c_str());
  return false;
}

// What the kernel said once the command had ended: the OOM killer's lines
// in the kernel log since the run started (1 s earlier, for the log's own
// clock) that name a traced process, and the OOM kill count of each memory
// cgroup a trace names.
memledger::report::KernelLog kernel_after_run(const fs::path& dir, uint64_t start_us) {
  memledger::report::KernelLog log =
      memledger::report::read_kernel_log("/dev/kmsg", start_us > 1000000 ? start_us - 1000000 : 0);
  std::vector<int> pids;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("trace.", 0) != 0 || entry.path().extension() != ".mlt") continue;
    try {
      const memledger::report::Trace trace = memledger::report::read_trace(entry.path().string(), false);
      pids.push_back(trace.pid());
      const std::string cgroup = trace.header_value("cgroup");
      uint64_t count = 0;
      if (!cgroup.empty() && !log.cgroup_oom_kills.count(cgroup) &&
          memledger::report::read_cgroup_oom_kills(cgroup, &count)) {
        log.cgroup_oom_kills[cgroup] = count;
      }
    } catch (const TraceError&) {
      // The report says what is wrong with that trace.
    }
  }
  // Other processes of the machine are none of this run's business.
  std::erase_if(log.oom_kills, [&](const memledger::report::OomKillLine& l) {
    return std::find(pids.begin(), pids.end(), l.pid) == pids.end();
  });
  return log;
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

enum class ReportOutcome { kWritten, kNotMade, kNotWritten };

// Writes report.txt, report.json and report.html, each whole (a temporary
// file renamed) or not at all. When one cannot be written (a full disk), none
// is kept, so that no partial set is taken for the report, and it is said.
ReportOutcome build_report(const fs::path& dir, bool quiet, const memledger::report::RunOutcome& outcome,
                           const std::vector<memledger::report::RoleRule>& role_rules) {
  memledger::report::RunReport run;
  try {
    AnalysisOptions options;
    options.role_rules = role_rules;
    run = memledger::report::load_run(dir.string(), options, &outcome);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memledger: no report: %s\n", memledger::report::escape_terminal(e.what()).c_str());
    return ReportOutcome::kNotMade;
  }
  const char* const names[] = {"report.txt", "report.json", "report.html"};
  std::string error;
  bool written = true;
  for (const char* name : names) {
    try {
      std::string text = name == names[0]   ? memledger::report::render_text(run)
                         : name == names[1] ? memledger::report::render_json(run).dump(
                                                  2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"
                                            : memledger::report::render_html(run);
      written = memledger::report::write_private_file((dir / name).string(), text, error);
    } catch (const std::exception& e) {
      error = std::string("cannot make ") + (dir / name).string() + ": " + e.what();
      written = false;
    }
    if (!written) break;
  }
  if (!quiet) std::fprintf(stderr, "memledger: %s\n", memledger::report::render_summary_line(run).c_str());
  if (!written) {
    std::error_code ec;
    for (const char* name : names) fs::remove(dir / name, ec);
    std::fprintf(stderr, "memledger: no report written: %s; the traces are kept (memledger report %s)\n",
                 error.c_str(), dir.c_str());
    return ReportOutcome::kNotWritten;
  }
  if (!quiet) {
    std::fprintf(stderr, "memledger: report: %s, %s (memledger report %s)\n", (dir / "report.txt").c_str(),
                 (dir / "report.html").c_str(), dir.c_str());
  }
  return ReportOutcome::kWritten;
}

int cmd_run(int argc, char** argv) {
  RunOptions opts;
  static const option long_options[] = {
      {"output", required_argument, nullptr, 'o'},
      {"host", required_argument, nullptr, 'H'},
      {"sample-interval", required_argument, nullptr, 'S'},
      {"step-interval", required_argument, nullptr, 'I'},
      {"stack-depth", required_argument, nullptr, 'D'},
      {"no-report", no_argument, nullptr, 'N'},
      {"policy", required_argument, nullptr, 'Y'},
      {"no-retention", no_argument, nullptr, 'R'},
      {"leak-mode", no_argument, nullptr, 'L'},
      {"overwrite", no_argument, nullptr, 'W'},
      {"cupti", required_argument, nullptr, 'C'},
      {"cupti-path", required_argument, nullptr, 'P'},
      {"steps", required_argument, nullptr, 'T'},
      {"quiet", no_argument, nullptr, 'q'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  optind = 1;
  opterr = 0;
  int c;
  // '+': stop at the first non-option, which starts the command.
  while ((c = getopt_long(argc, argv, "+:o:qh", long_options, nullptr)) != -1) {
    switch (c) {
      case 'o': opts.output = optarg; break;
      case 'H':
        opts.host = optarg;
        if (opts.host != "full" && opts.host != "sampled" && opts.host != "off") {
          return usage_error("--host must be full, sampled or off, not '" + opts.host + "'", "run");
        }
        break;
      case 'S':
        if (!parse_count(optarg) || *parse_count(optarg) == 0) {
          return usage_error(std::string("--sample-interval needs a positive number of bytes, not '") + optarg + "'", "run");
        }
        opts.sample_interval = optarg;
        break;
      case 'I': {
        char* end = nullptr;
        double v = std::strtod(optarg, &end);
        if (*optarg == '\0' || *end != '\0' || !(v > 0)) {
          return usage_error(std::string("--step-interval needs a positive number of seconds, not '") + optarg + "'", "run");
        }
        opts.step_interval = optarg;
        break;
      }
      case 'D':
        if (!parse_count(optarg) || *parse_count(optarg) > 128) {
          return usage_error(std::string("--stack-depth needs a number from 0 to 128, not '") + optarg + "'", "run");
        }
        opts.stack_depth = optarg;
        break;
      case 'N': opts.report = false; break;
      case 'Y':
        if (!read_role_rules(optarg, opts.role_rules, "run")) return kExitUsage;
        break;
      case 'R': opts.retention = false; break;
      case 'L': opts.leak_mode = true; break;
      case 'W': opts.overwrite = true; break;
      case 'C':
        opts.cupti = optarg;
        if (opts.cupti != "auto" && opts.cupti != "on" && opts.cupti != "off") {
          return usage_error("--cupti must be auto, on or off, not '" + opts.cupti + "'", "run");
        }
        break;
      case 'P':
        if (*optarg == '\0') return usage_error("--cupti-path needs a path", "run");
        opts.cupti_path = optarg;
        break;
      case 'T': {
        const std::string value = optarg;
        const size_t colon = value.find(':');
        const std::string source = value.substr(0, colon);
        const std::string pattern = colon == std::string::npos ? "" : value.substr(colon + 1);
        if ((source != "nvtx" && source != "kernel") || pattern.empty()) {
          return usage_error("--steps takes nvtx:REGEX or kernel:REGEX, not '" + value +
                             "' (markers need no option; time-based steps: --step-interval)");
        }
        regex_t re;
        if (const int rc = regcomp(&re, pattern.c_str(), REG_EXTENDED | REG_NOSUB); rc != 0) {
          char why[256];
          regerror(rc, &re, why, sizeof why);
          return usage_error("--steps " + value + ": not a valid regular expression (" + why + ")", "run");
        }
        regfree(&re);
        std::string& slot = source == "nvtx" ? opts.nvtx_steps : opts.kernel_steps;
        if (!slot.empty() && slot != pattern) return usage_error("--steps " + source + ": given twice", "run");
        slot = pattern;
        break;
      }
      case 'q': opts.quiet = true; break;
      case 'h': std::fputs(kRunHelp, stdout); return 0;
      case ':': return usage_error(std::string("option ") + argv[optind - 1] + " needs a value", "run");
      default: return usage_error(memledger::tools::unknown_option(argv[optind - 1], long_options), "run");
    }
  }
  for (int i = optind; i < argc; ++i) opts.command.emplace_back(argv[i]);
  if (opts.command.empty()) return usage_error("run: no command given (memledger run [options] -- CMD ARGS...)", "run");
  if (opts.cupti == "off" && !opts.kernel_steps.empty()) {
    return usage_error("--steps kernel: needs CUPTI, which --cupti off turns off", "run");
  }
  if (opts.cupti == "off" && !opts.cupti_path.empty()) return usage_error("--cupti-path with --cupti off", "run");

  std::optional<std::string> library = find_library();
  const std::optional<std::string> python_dir = find_python_dir();
  bool traced = library.has_value();
  if (!traced) {
    std::fprintf(stderr, "memledger: libmemledger.so not found next to %s; running the command without tracing\n",
                 self_dir().c_str());
  }
  fs::path dir = opts.output.empty() ? fs::path(default_run_dir(opts.command[0])) : fs::path(opts.output);
  if (traced && !opts.output.empty()) {
    // Two runs in one folder would be reported as one job.
    const std::vector<fs::path> previous = run_files_in(dir);
    if (!previous.empty() && !opts.overwrite) {
      std::fprintf(stderr,
                   "memledger: the run folder %s already holds a run (%s); choose another folder, or pass "
                   "--overwrite to replace that run\n",
                   dir.c_str(), previous.front().filename().c_str());
      return 2;
    }
    for (const fs::path& f : previous) {
      std::error_code ec;
      fs::remove(f, ec);
    }
  }
  bool dir_created = false;
  if (traced) {
    std::string why;
    if (!prepare_run_dir(dir, dir_created, why)) {
      std::fprintf(stderr, "memledger: cannot write the run folder %s: %s; running the command without tracing\n",
                   dir.c_str(), why.c_str());
      traced = false;
    } else {
      dir = fs::absolute(dir);
      if (!opts.quiet) std::fprintf(stderr, "memledger: run folder: %s\n", dir.c_str());
    }
  }

  // Report exec failures through a close-on-exec pipe, like a shell would.
  int err_pipe[2];
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    std::perror("memledger: pipe");
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  timespec start_mono{};
  clock_gettime(CLOCK_MONOTONIC, &start_mono);
  const uint64_t start_us = static_cast<uint64_t>(start_mono.tv_sec) * 1000000 + static_cast<uint64_t>(start_mono.tv_nsec) / 1000;
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("memledger: fork");
    return 1;
  }
  if (pid == 0) {
    close(err_pipe[0]);
    if (traced) {
      std::string preload = *library;
      if (const char* old = std::getenv("LD_PRELOAD"); old && *old) preload += std::string(":") + old;
      setenv("LD_PRELOAD", preload.c_str(), 1);
      setenv("MEMLEDGER_DIR", dir.c_str(), 1);
      setenv("MEMLEDGER_HOST", opts.host.c_str(), 1);
      if (!opts.retention) setenv("MEMLEDGER_RETENTION", "0", 1);
      if (!opts.sample_interval.empty()) setenv("MEMLEDGER_SAMPLE_INTERVAL", opts.sample_interval.c_str(), 1);
      if (!opts.step_interval.empty()) setenv("MEMLEDGER_STEP_INTERVAL", opts.step_interval.c_str(), 1);
      if (!opts.stack_depth.empty()) setenv("MEMLEDGER_STACK_DEPTH", opts.stack_depth.c_str(), 1);
      set_cupti_environment(opts, *library);
    }
    if (opts.leak_mode) memledger::tools::set_leak_mode_environment(opts.command);
    // `import memledger` works in the traced program without installing it,
    // and the start-up hook loads its helpers in every Python process.
    std::string path;
    if (traced) {
      if (const std::optional<std::string> boot = find_python_boot_dir(python_dir)) {
        path = *boot;
        unsetenv("MEMLEDGER_PYTHON_BOOT");
      } else {
        // Said in the trace's header (python_boot), and by the report of a
        // Python process.
        setenv("MEMLEDGER_PYTHON_BOOT", "none", 1);
      }
    }
    if (python_dir) path += (path.empty() ? "" : ":") + *python_dir;
    if (!path.empty()) {
      if (const char* old = std::getenv("PYTHONPATH"); old && *old) path += std::string(":") + old;
      setenv("PYTHONPATH", path.c_str(), 1);
    }
    std::vector<char*> args;
    for (std::string& a : opts.command) args.push_back(a.data());
    args.push_back(nullptr);
    execvp(args[0], args.data());
    int err = errno;
    ssize_t ignored = write(err_pipe[1], &err, sizeof err);
    (void)ignored;
    _exit(err == ENOENT ? 127 : 126);
  }
  close(err_pipe[1]);
  int exec_errno = 0;
  ssize_t got = read(err_pipe[0], &exec_errno, sizeof exec_errno);
  close(err_pipe[0]);
  g_child = pid;
  if (got == static_cast<ssize_t>(sizeof exec_errno)) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (exec_errno == ENOENT) {
      std::fprintf(stderr, "memledger: %s: command not found\n", opts.command[0].c_str());
    } else {
      std::fprintf(stderr, "memledger: %s: %s\n", opts.command[0].c_str(), std::strerror(exec_errno));
    }
    if (traced && dir_created) {
      std::error_code ec;
      if (fs::is_empty(dir, ec)) fs::remove(dir, ec);
    }
    return exec_errno == ENOENT ? 127 : 126;
  }
  if (traced) write_run_file(dir, opts, pid, nullptr, 0);

  // Like a shell: the terminal's ^C and ^\ go to the child; we only wait.
  struct sigaction ignore {}, forward {}, old_int {}, old_quit {}, old_term {}, old_hup {};
  ignore.sa_handler = SIG_IGN;
  forward.sa_handler = forward_signal;
  sigaction(SIGINT, &ignore, &old_int);
  sigaction(SIGQUIT, &ignore, &old_quit);
  sigaction(SIGTERM, &forward, &old_term);
  sigaction(SIGHUP, &forward, &old_hup);

  // The last row of the terminal, out of the program's way (status_line.h).
  std::optional<memledger::tools::StatusLine> status_line;
  if (traced && !opts.quiet) status_line.emplace(STDERR_FILENO);
  const bool show_status = status_line && status_line->usable();
  int status = 0;
  auto last_status = std::chrono::steady_clock::now();
  std::string status_text;
  // The command's end wakes the wait below at once: its pid's descriptor
  // (Linux 5.3 on) becomes readable. Without one, the wait ends at the next
  // 50 ms tick, 25 ms late on average.
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG | (show_status ? WUNTRACED | WCONTINUED : 0));
    if (r == pid && WIFSTOPPED(status)) {
      status_line->stopped();
    } else if (r == pid && WIFCONTINUED(status)) {
      status_line->resumed();
    } else if (r == pid) {
      break;
    }
    if (r < 0 && errno != EINTR) break;
    if (pidfd >= 0) {
      pollfd ended{pidfd, POLLIN, 0};
      poll(&ended, 1, 50);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // Every 500 ms, and at once after a resize or a stop.
    const bool tick = std::chrono::steady_clock::now() - last_status > std::chrono::milliseconds(500);
    if (show_status && tick) {
      last_status = std::chrono::steady_clock::now();
      StatusTotals t = read_status(dir);
      if (t.processes > 0) {
        status_text = "[memledger] ";
        status_text += t.step >= 0 ? "step " + std::to_string(t.step) : std::string("no steps yet");
        status_text += " | live " + human(double(t.live));
        if (t.step >= 1) status_text += " | " + std::string(t.growth >= 0 ? "+" : "") + human(double(t.growth)) + "/step";
        status_text += " | RSS " + human(double(t.rss));
        if (t.processes > 1) status_text += " | " + std::to_string(t.processes) + " processes";
      }
    }
    if (show_status && !status_text.empty() && (tick || status_line->wants_redraw())) status_line->show(status_text);
  }
  if (pidfd >= 0) close(pidfd);
  // The row is given back before anything else is printed.
  status_line.reset();
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGQUIT, &old_quit, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  int code = exit_code_of(status);
  if (traced) {
    std::string untraced;
    bool any_trace = false;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      any_trace = any_trace || (name.rfind("trace.", 0) == 0 && entry.path().extension() == ".mlt");
    }
    if (!any_trace) {
      untraced = why_not_preloaded(resolve_command(opts.command[0]));
      if (!untraced.empty()) std::fprintf(stderr, "memledger: nothing traced: %s\n", untraced.c_str());
    }
    // Files the run folder should hold but does not are an error of memledger
    // run (exit 1) unless the command's own failure is there to report.
    const memledger::report::KernelLog kernel = kernel_after_run(dir, start_us);
    bool complete = write_run_file(dir, opts, pid, &status, seconds, untraced, &kernel);
    if (opts.report && (any_trace || untraced.empty())) {
      // The exit status from waitpid, also when run.json could not be written.
      memledger::report::RunOutcome outcome;
      outcome.root_pid = pid;
      outcome.exit.known = WIFEXITED(status) || WIFSIGNALED(status);
      outcome.exit.signaled = WIFSIGNALED(status);
      outcome.exit.signo = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      outcome.exit.code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
      outcome.kernel = kernel;
      complete = build_report(dir, opts.quiet, outcome, opts.role_rules) != ReportOutcome::kNotWritten && complete;
    }
    if (!opts.quiet) std::fprintf(stderr, "memledger: run folder: %s\n", dir.c_str());
    if (!complete && code == 0) code = 1;
  }
  return code;
}

// ---------------------------------------------------------------------------
// memledger report / dump

int cmd_report(int argc, char** argv) {
  std::string format = "text";
  std::string output;
  memledger::report::Snapshot at = memledger::report::Snapshot::kPeak;
  bool full_stacks = false;
  AnalysisOptions options;
  static const option long_options[] = {
      {"format", required_argument, nullptr, 'f'},
      {"at", required_argument, nullptr, 'a'},
      {"growth-window", required_argument, nullptr, 'g'},
      {"output", required_argument, nullptr, 'o'},
      {"warmup-steps", required_argument, nullptr, 'w'},
      {"debug-dir", required_argument, nullptr, 'd'},
      {"full-stacks", no_argument, nullptr, 'F'},
      {"policy", required_argument, nullptr, 'Y'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":o:h", long_options, nullptr)) != -1) {
    switch (c) {
      case 'f':
        format = optarg;
        if (format == "collapsed") format = "folded";
        if (format != "text" && format != "json" && format != "html" && format != "pprof" && format != "folded" &&
            format != "chrome") {
          return usage_error("--format must be text, json, html, pprof, folded or chrome, not '" + format + "'", "report");
        }
        break;
      case 'a':
        if (std::strcmp(optarg, "peak") == 0) {
          at = memledger::report::Snapshot::kPeak;
        } else if (std::strcmp(optarg, "end") == 0) {
          at = memledger::report::Snapshot::kEnd;
        } else if (std::strcmp(optarg, "growth") == 0) {
          at = memledger::report::Snapshot::kGrowth;
        } else {
          return usage_error(std::string("--at must be peak, end or growth, not '") + optarg + "'", "report");
        }
        break;
      case 'g': {
        std::string error;
        if (!memledger::report::parse_growth_window(optarg, options.growth_window, error)) {
          return usage_error(error, "report");
        }
        break;
      }
      case 'o': output = optarg; break;
      case 'w': {
        auto n = parse_count(optarg);
        if (!n || *n > 100000) return usage_error(std::string("--warmup-steps needs a number, not '") + optarg + "'", "report");
        options.warmup_steps = static_cast<int>(*n);
        break;
      }
      case 'd': options.symbolizer.debug_dirs.emplace_back(optarg); break;
      case 'F': full_stacks = true; break;
      case 'Y':
        if (!read_role_rules(optarg, options.role_rules, "report")) return kExitUsage;
        break;
      case 'h': std::fputs(kReportHelp, stdout); return 0;
      case ':': return usage_error(std::string("option ") + argv[optind - 1] + " needs a value", "report");
      default: return usage_error(memledger::tools::unknown_option(argv[optind - 1], long_options), "report");
    }
  }
  if (optind != argc - 1) return usage_error("report: give exactly one RUN_DIR or TRACE", "report");
  const std::string path = argv[optind];
  try {
    memledger::report::RunReport run = memledger::report::load_run(path, options);
    constexpr auto kReplace = nlohmann::json::error_handler_t::replace;  // trace strings need not be UTF-8
    std::string text;
    if (format == "json") {
      text = memledger::report::render_json(run).dump(2, ' ', false, kReplace) + "\n";
    } else if (format == "html") {
      text = memledger::report::render_html(run);
    } else if (format == "pprof") {
      if ((output.empty() || output == "-") && isatty(STDOUT_FILENO)) {
        return usage_error("--format pprof writes a binary file: give -o FILE (e.g. -o heap.pb.gz)", "report");
      }
      text = memledger::report::render_pprof(run);
    } else if (format == "folded") {
      text = memledger::report::render_folded(run, at);
    } else if (format == "chrome") {
      text = memledger::report::render_chrome_trace(run).dump(-1, ' ', false, kReplace) + "\n";
    } else {
      text = memledger::report::render_text(run, full_stacks);
    }
    for (const std::string& p : run.problems) {
      std::fprintf(stderr, "memledger: warning: %s\n", memledger::report::escape_terminal(p).c_str());
    }
    std::string error;
    if (output.empty() || output == "-") {
      if (!memledger::report::write_stream(stdout, text, error)) {
        std::fprintf(stderr, "memledger: cannot write the report to standard output: %s\n", error.c_str());
        return kExitInput;
      }
    } else if (!memledger::report::write_user_file(output, text, error)) {
      std::fprintf(stderr, "memledger: %s\n", error.c_str());
      return kExitInput;
    }
    return 0;
  } catch (const TraceError& e) {
    std::fprintf(stderr, "memledger: %s\n", memledger::report::escape_terminal(e.what()).c_str());
    return kExitInput;
  }
}

int cmd_dump(int argc, char** argv) {
  if (argc != 2 || argv[1][0] == '-') {
    if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
      std::fputs(kDumpHelp, stdout);
      return 0;
    }
    return usage_error("dump: give exactly one TRACE file", "dump");
  }
  try {
    memledger::report::dump_trace(argv[1], stdout);
    return 0;
  } catch (const TraceError& e) {
    std::fprintf(stderr, "memledger: %s\n", e.what());
    return kExitInput;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage_error("no command given");
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (command == "--version") {
    std::printf("memledger %s (trace format %u)\n", kVersion, memledger::format::kVersion);
    return 0;
  }
  int rc = -1;
  try {
    if (command == "run") rc = cmd_run(argc - 1, argv + 1);
    if (command == "report") rc = cmd_report(argc - 1, argv + 1);
    if (command == "check") rc = memledger::tools::cmd_check(argc - 1, argv + 1);
    if (command == "diff") rc = memledger::tools::cmd_diff(argc - 1, argv + 1);
    if (command == "dump") rc = cmd_dump(argc - 1, argv + 1);
    if (command == "window") rc = memledger::tools::cmd_window(argc - 1, argv + 1);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "memledger: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memledger: internal error: %s\n", e.what());
    return 1;
  }
  if (rc < 0) {
    std::string message = "unknown command '" + command + "'";
    const std::string near =
        memledger::tools::nearest(command, {"run", "report", "check", "diff", "dump", "window"});
    if (!near.empty()) message += "; did you mean " + near + "?";
    return usage_error(message);
  }
  // What reached standard output must be all of it: a full disk behind a
  // redirection shows only when the buffer is flushed and the stream closed.
  if (std::fflush(stdout) != 0 || std::ferror(stdout) || std::fclose(stdout) != 0) {
    std::fprintf(stderr, "memledger: cannot write to standard output: %s\n", std::strerror(errno ? errno : EIO));
    if (rc == 0) rc = command == "check" || command == "diff" ? kExitUsage : kExitInput;
  }
  return rc;
}
