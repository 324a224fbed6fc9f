#include "environment.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

namespace memledger::report {

namespace {

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// libcudart.so.12 -> libcudart; libcudart-1b201d85.so.11.0 -> libcudart.
std::string family_of(const std::string& path) {
  const std::string base = base_name(path);
  const size_t end = base.find_first_of(".-");
  return end == std::string::npos ? base : base.substr(0, end);
}

// The leading number of "12.8" (-1: none).
int leading_number(const std::string& text) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return -1;
  return std::atoi(text.c_str());
}

// (major, minor) of "12.8", for comparisons; (-1, -1) when unknown.
std::pair<int, int> major_minor(const std::string& text) {
  const int major = leading_number(text);
  const size_t dot = text.find('.');
  const int minor = dot == std::string::npos ? 0 : std::max(leading_number(text.substr(dot + 1)), 0);
  return {major, major < 0 ? -1 : minor};
}

// The major of a library file name's version suffix: libcudart.so.12 -> 12.
int soname_major(const std::string& path) {
  const std::string base = base_name(path);
  const size_t so = base.find(".so.");
  return so == std::string::npos ? -1 : leading_number(base.substr(so + 4));
}

CudaLibrary library_of(const Trace& trace, const std::string& value) {
  CudaLibrary lib;
  const size_t tab = value.find('\t');
  lib.path = value.substr(0, tab);
  if (tab != std::string::npos) lib.version = value.substr(tab + 1);
  lib.name = family_of(lib.path);
  // cuDriverGetVersion gives the CUDA version the driver supports, not the
  // library's own: the file name's major is the driver's release.
  lib.major = lib.name == "libcuda" || lib.version.rfind("API ", 0) == 0 ? -1 : leading_number(lib.version);
  if (lib.major < 0 && lib.name != "libcuda") lib.major = soname_major(lib.path);
  for (const ModuleInfo& m : trace.modules) {
    if (m.path == lib.path) lib.build_id = m.build_id;
  }
  return lib;
}

void add_framework_field(Environment& env, const std::string& key, const std::string& value) {
  // framework.NAME.FIELD
  const std::string rest = key.substr(10);
  const size_t dot = rest.find('.');
  if (dot == std::string::npos) return;
  const std::string name = rest.substr(0, dot), field = rest.substr(dot + 1);
  auto it = std::find_if(env.frameworks.begin(), env.frameworks.end(), [&](const auto& f) { return f.first == name; });
  if (it == env.frameworks.end()) {
    env.frameworks.push_back({name, {}});
    it = env.frameworks.end() - 1;
  }
  for (auto& [f, v] : it->second) {
    if (f == field) {
      v = value;
      return;
    }
  }
  it->second.push_back({field, value});
}

std::string framework_field(const Environment& env, const std::string& name, const std::string& field) {
  for (const auto& [n, fields] : env.frameworks) {
    if (n != name) continue;
    for (const auto& [f, v] : fields) {
      if (f == field) return v;
    }
  }
  return "";
}

std::string error_name(const std::string& call, int code) {
  const bool runtime = call.rfind("cuda", 0) == 0 || call.find("runtime") != std::string::npos;
  switch (code) {
    case 35: return runtime ? "cudaErrorInsufficientDriver" : "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case 222: return runtime ? "cudaErrorUnsupportedPtxVersion" : "CUDA_ERROR_UNSUPPORTED_PTX_VERSION";
    case 803: return runtime ? "cudaErrorSystemDriverMismatch" : "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case 804: return runtime ? "cudaErrorCompatNotSupportedOnDevice" : "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
  }
  return "error " + std::to_string(code);
}

const CudaLibrary* newest_runtime(const Environment& env) {
  const CudaLibrary* best = nullptr;
  for (const CudaLibrary& l : env.libraries) {
    if (l.name == "libcudart" && !l.version.empty() &&
        (best == nullptr || major_minor(l.version) > major_minor(best->version))) {
      best = &l;
    }
  }
  return best;
}

bool driver_loaded(const Environment& env) {
  for (const CudaLibrary& l : env.libraries) {
    if (l.name == "libcuda") return true;
  }
  return false;
}

// A runtime the driver does not support: refused at initialisation, or a
// newer major than the driver's. The runtime's refusal is the same where
// no driver loads at all (a CUDA build of a framework on a machine without
// a GPU): then there is no driver to be too old.
std::string driver_finding(const Environment& env) {
  const CudaLibrary* rt = newest_runtime(env);
  const std::string runtime = rt ? "the CUDA runtime " + rt->version + " (" + base_name(rt->path) + ")" : "the CUDA runtime";
  const std::string driver = env.driver.empty() ? "an older CUDA" : "CUDA " + env.driver;
  const std::string fix = "; install an NVIDIA driver that supports CUDA " + (rt ? rt->version : std::string("that version")) +
                          " or newer, or use a runtime and framework built for " + driver;
  if (!env.init_error.empty()) {
    const size_t space = env.init_error.rfind(' ');
    const std::string call = env.init_error.substr(0, space);
    const int code = std::atoi(env.init_error.substr(space + 1).c_str());
    if (code == 35 && env.driver.empty() && !driver_loaded(env)) {
      return "no NVIDIA driver: " + call + " failed with " + error_name(call, code) + " (35) and no libcuda.so.1 " +
             "was loaded, so " + runtime + " had no GPU to use; to run on a GPU, install an NVIDIA driver that " +
             "supports CUDA " + (rt ? rt->version : std::string("that version")) +
             " or newer (or put its libcuda.so.1 on the library path)";
    }
    return runtime + " needs a newer driver: " + call + " failed with " + error_name(call, code) + " (" +
           std::to_string(code) + ") and the driver supports " + driver + " only" + fix;
  }
  if (rt != nullptr && !env.driver.empty() && major_minor(rt->version).first > major_minor(env.driver).first) {
    return runtime + " is newer than the driver supports (" + driver + ")" + fix;
  }
  return "";
}

// Two majors of one library in one process.
std::vector<std::string> two_majors(const Environment& env) {
  std::vector<std::string> out;
  std::map<std::string, std::map<int, const CudaLibrary*>> by_name;
  for (const CudaLibrary& l : env.libraries) {
    if (l.major >= 0) by_name[l.name].emplace(l.major, &l);
  }
  for (const auto& [name, majors] : by_name) {
    if (majors.size() < 2) continue;
    std::string list;
    for (const auto& [major, l] : majors) {
      list += (list.empty() ? "" : " and ") + (l->version.empty() ? std::to_string(major) : l->version) + " (" +
              l->path + ")";
    }
    out.push_back("two major versions of " + name + " are loaded in one process: " + list +
                  "; each part of the program calls the one it was built for, so memory, streams and handles do not "
                  "pass between them: install one CUDA major (remove the other's packages, e.g. pip's nvidia-*-cu" +
                  std::to_string(majors.begin()->first) + " wheels, or fix LD_LIBRARY_PATH)");
  }
  return out;
}

// A framework built for one CUDA major running on another's runtime, or on
// a driver older than its build.
std::vector<std::string> framework_findings(const Environment& env) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"torch", "PyTorch"}, {"tensorflow", "TensorFlow"}, {"jax", "JAX"}};
  std::vector<std::string> out;
  const CudaLibrary* rt = newest_runtime(env);
  for (const auto& [name, shown] : kNames) {
    const std::string built = framework_field(env, name, "cuda");
    const auto [major, minor] = major_minor(built);
    if (major < 0) continue;
    const std::string label = std::string(shown) + " was built for CUDA " + built;
    if (rt != nullptr && major_minor(rt->version).first != major) {
      out.push_back(label + " but the process runs the CUDA runtime " + rt->version + " (" + rt->path +
                    "); install the " + shown + " build for CUDA " + std::to_string(major_minor(rt->version).first) +
                    " or put the CUDA " + std::to_string(major) + " runtime first on the library path");
    }
    if (!env.driver.empty() && major_minor(env.driver).first < major) {
      out.push_back(label + " but the driver supports CUDA " + env.driver + " only; install a newer NVIDIA driver or the " +
                    shown + " build for CUDA " + env.driver);
    }
  }
  return out;
}

// A library's handle-creating call that failed ("cudnnCreate 1002
// CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH\tPATH"), with its version and
// what to do.
std::string create_error_finding(const Environment& env, const std::string& error) {
  const size_t tab = error.find('\t');
  const std::string what = error.substr(0, tab), path = tab == std::string::npos ? "" : error.substr(tab + 1);
  const size_t s1 = what.find(' ');
  const size_t s2 = s1 == std::string::npos ? s1 : what.find(' ', s1 + 1);
  const std::string call = what.substr(0, s1);
  const std::string code = s1 == std::string::npos ? "" : what.substr(s1 + 1, s2 == std::string::npos ? s2 : s2 - s1 - 1);
  const std::string name = s2 == std::string::npos ? "" : what.substr(s2 + 1);
  const bool cudnn = call.rfind("cudnn", 0) == 0;
  std::string library = cudnn ? "cuDNN" : "cuBLAS";
  for (const CudaLibrary& l : env.libraries) {
    if (l.path == path && !l.version.empty()) library += " " + l.version;
  }
  if (!path.empty()) library += " (" + base_name(path) + ")";
  std::string versions;
  if (const CudaLibrary* rt = newest_runtime(env)) versions += "runtime " + rt->version;
  if (!env.driver.empty()) versions += std::string(versions.empty() ? "" : ", ") + "driver for CUDA " + env.driver;
  const std::string stack = versions.empty() ? "" : " (" + versions + ")";
  std::string why;
  if (name.find("VERSION_MISMATCH") != std::string::npos || name.find("INCOMPATIBLE") != std::string::npos) {
    why = library + " does not fit the rest of the CUDA stack" + stack + ": its parts, or the runtime and driver it " +
          "was built for, are of other versions than the ones loaded; install one " + (cudnn ? "cuDNN" : "cuBLAS") +
          ", built for the CUDA major of the runtime and the framework (and remove other copies from the library path)";
  } else if (name.find("ARCH_MISMATCH") != std::string::npos) {
    why = library + " does not support this GPU" + stack + ": install a build of it for this GPU's architecture";
  } else if (name.find("NOT_INITIALIZED") != std::string::npos) {
    why = library + " could not start" + stack + ": the CUDA runtime or driver it needs failed to initialise, or is " +
          "older than it was built for, or the GPU had no memory left for it; see the driver and runtime above";
  } else {
    why = library + " could not make a handle" + stack + "; see the versions above";
  }
  return call + " failed with " + (name.empty() ? "status" : name) + " (" + code + "): " + why;
}

// The driver's release: the kernel module's, else libcuda's file name's.
std::string driver_release_of(const Environment& env) {
  return env.driver_release.empty() ? env.driver_library_release : env.driver_release;
}

// The kernel module and libcuda of different releases: the driver refuses
// to start ("Driver/library version mismatch", CUDA error 803).
std::string release_finding(const Environment& env) {
  if (env.driver_release.empty() || env.driver_library_release.empty() ||
      env.driver_release == env.driver_library_release) {
    return "";
  }
  return "the NVIDIA kernel module is release " + env.driver_release + " but libcuda is release " +
         env.driver_library_release +
         ": the driver refuses to start when they differ (\"Driver/library version mismatch\"); reboot after a "
         "driver upgrade, or reinstall the driver so that both are the same release";
}

// The first frame of the crash stack in a known library: a CUDA one?
std::string crash_finding(const Environment& env, const Verdict& v) {
  if (v.kind != "crash") return "";
  for (const Frame& f : v.crash_stack) {
    // The signal's own frames (the handler, libc's restorer) and a libc
    // function a library called (memcpy) are not where the crash lies.
    const std::string name = family_of(f.module);
    const std::string base = base_name(f.module);
    if (f.module.empty() || name == "libmemledger" || name == "libc" || base.rfind("linux-vdso", 0) == 0 ||
        base == "[vdso]") {
      continue;
    }
    const char* what = name == "libcuda"       ? "the CUDA driver"
                       : name == "libcudnn"    ? "cuDNN"
                       : name == "libcublas" || name == "libcublasLt" ? "cuBLAS"
                                                  : nullptr;
    if (what == nullptr) return "";
    std::string release = name == "libcuda" ? driver_release_of(env) : "";
    std::string text = std::string("crashed inside ") + what + (release.empty() ? "" : " " + release) + " (" +
                       base_name(f.module);
    for (const CudaLibrary& l : env.libraries) {
      if (l.path == f.module && !l.version.empty() && name != "libcuda") text += " " + l.version;
    }
    text += ")";
    if (!env.driver.empty()) text += "; driver for CUDA " + env.driver;
    if (const CudaLibrary* rt = newest_runtime(env)) text += "; runtime " + rt->version;
    return text + "; see the versions in the environment block: a driver, runtime and library that do not fit "
                  "together crash there, so make them agree (or report it to NVIDIA with these versions)";
  }
  return "";
}

bool is_oom_exception(const std::string& e) {
  std::string lower = e;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return e.find("OutOfMemoryError") != std::string::npos || e.find("ResourceExhausted") != std::string::npos ||
         e.find("RESOURCE_EXHAUSTED") != std::string::npos || lower.find("out of memory") != std::string::npos;
}

// Died of its own accord: an exit code, or a crash signal (SIGABRT
// included); a SIGTERM or SIGKILL came from outside.
bool ended_badly(const Verdict& v) { return (v.kind == "exit" && v.exit_code != 0) || v.kind == "crash"; }

bool mentions_cuda(const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* word : {"cuda", "cudnn", "cublas", "nccl", "driver"}) {
    if (lower.find(word) != std::string::npos) return true;
  }
  return false;
}

// The framework that raised an exception, by its type's module.
std::string framework_of_exception(const std::string& e) {
  if (e.rfind("torch.", 0) == 0) return "PyTorch";
  if (e.rfind("tensorflow.", 0) == 0 || e.rfind("keras.", 0) == 0) return "TensorFlow";
  if (e.rfind("jax", 0) == 0 || e.find("XlaRuntimeError") != std::string::npos) return "JAX";
  return "";
}

// The allocation the framework could not make, as its message says:
// PyTorch "Tried to allocate 2.00 GiB", XLA (JAX; TensorFlow with XLA) "Out
// of memory allocating N bytes" or "... while trying to allocate N bytes",
// TensorFlow "OOM when allocating tensor with shape[...] and type T".
std::string failed_request(const std::string& e) {
  if (const size_t at = e.find("Tried to allocate "); at != std::string::npos) {
    const size_t end = e.find_first_of(".;(", e.find(' ', at + 18) + 1);
    std::string size = e.substr(at + 18, end == std::string::npos ? std::string::npos : end - at - 18);
    while (!size.empty() && size.back() == ' ') size.pop_back();
    return size;
  }
  for (const char* key : {"Out of memory allocating ", "Out of memory while trying to allocate "}) {
    const size_t at = e.find(key);
    if (at == std::string::npos) continue;
    const char* p = e.c_str() + at + std::strlen(key);
    char* end = nullptr;
    const double bytes = std::strtod(p, &end);
    if (end != p && std::strncmp(end, " bytes", 6) == 0) return human_bytes(bytes);
  }
  if (const size_t at = e.find("OOM when allocating tensor with shape"); at != std::string::npos) {
    const size_t open = e.find('[', at), close = e.find(']', at);
    if (open != std::string::npos && close != std::string::npos && close > open) {
      std::string text = "a tensor of shape " + e.substr(open, close - open + 1);
      const size_t type = e.find(" and type ", close);
      if (type == close + 1) text += " (" + e.substr(type + 10, e.find(' ', type + 10) - type - 10) + ")";
      return text;
    }
  }
  return "";
}

// The framework's own out-of-memory error, in the verdict.
void name_framework_oom(const Environment& env, Verdict& v) {
  if (env.python_exception.empty() || !is_oom_exception(env.python_exception)) return;
  std::string shown = env.python_exception.substr(0, 300);
  if (v.kind == "cuda_oom") {
    v.summary += "; the program raised " + shown;
  } else if (ended_badly(v)) {
    const bool device = std::any_of(env.libraries.begin(), env.libraries.end(),
                                    [](const CudaLibrary& l) { return l.name == "libcuda"; });
    const std::string framework = framework_of_exception(env.python_exception);
    const std::string request = failed_request(env.python_exception);
    v.kind = device ? "cuda_oom" : "framework_oom";
    v.summary = std::string(device ? "GPU out of memory" : "out of memory") + " in " +
                (framework.empty() ? std::string("the framework") : framework) +
                (request.empty() ? "" : " (" + request + " could not be allocated)") + ": the program raised " + shown +
                "; no allocation that reached the CUDA API failed (the framework's allocator refused it) (" +
                v.summary + ")";
  }
}

}  // namespace

Environment read_environment(const Trace& trace) {
  Environment env;
  std::set<std::string> paths;
  for (const auto& [key_text, value_text] : trace.info_strings()) {
    const std::string key(key_text), value(value_text);
    if (key == "cuda.driver") {
      env.driver = value;
    } else if (key == "cuda.driver_release") {
      env.driver_release = value;
    } else if (key == "cuda.driver_library_release") {
      env.driver_library_release = value;
    } else if (key.rfind("cuda.device.", 0) == 0) {
      const size_t space = value.find(' ');
      const double total = std::atof(value.substr(0, space).c_str());
      const std::string name = space == std::string::npos ? "" : value.substr(space + 1);
      env.devices.push_back(key.substr(12) + ": " + (name.empty() ? "GPU" : name) + ", " + human_bytes(total));
    } else if (key == "cuda.library") {
      CudaLibrary lib = library_of(trace, value);
      if (paths.insert(lib.path).second) {
        env.libraries.push_back(std::move(lib));
      } else if (!lib.version.empty()) {
        // Listed first without its version, asked later (once the program
        // had started what asking would have started).
        for (CudaLibrary& known : env.libraries) {
          if (known.path == lib.path && known.version.empty()) known = std::move(lib);
        }
      }
    } else if (key == "cuda.init_error") {
      env.init_error = value;
    } else if (key == "cuda.create_error") {
      if (std::find(env.create_errors.begin(), env.create_errors.end(), value) == env.create_errors.end()) {
        env.create_errors.push_back(value);
      }
    } else if (key.rfind("framework.", 0) == 0) {
      add_framework_field(env, key, value);
    } else if (key == "python.exception") {
      env.python_exception = value;
    }
  }
  return env;
}

void judge_environment(Environment& env, Verdict& verdict, std::vector<std::string>& notes) {
  env.findings.clear();
  // In order of how surely each explains a death: a crash inside a CUDA
  // library and a refused runtime do; two majors or a framework built for
  // another CUDA may, when the program stopped on a CUDA error (or said
  // nothing about why).
  const std::string crash = crash_finding(env, verdict);
  if (!crash.empty()) env.findings.push_back(crash);
  for (const std::string& e : env.create_errors) env.findings.push_back(create_error_finding(env, e));
  const std::string release = release_finding(env);
  if (!release.empty() && !env.init_error.empty()) env.findings.push_back(release);
  const std::string driver = driver_finding(env);
  if (!driver.empty()) env.findings.push_back(driver);
  const size_t sure = env.findings.size();
  if (!release.empty() && env.init_error.empty()) env.findings.push_back(release);
  for (std::string& f : two_majors(env)) env.findings.push_back(std::move(f));
  for (std::string& f : framework_findings(env)) env.findings.push_back(std::move(f));
  name_framework_oom(env, verdict);
  const bool likely = env.findings.size() > sure && verdict.kind == "exit" &&
                      (env.python_exception.empty() || mentions_cuda(env.python_exception));
  bool in_verdict = false;
  if (!crash.empty()) {
    verdict.summary += ": " + crash;
    in_verdict = true;
  } else if (ended_badly(verdict) && verdict.kind == "exit" && (sure > 0 || likely)) {
    verdict.kind = "cuda_mismatch";
    verdict.summary = env.findings.front() + " (" + verdict.summary + ")";
    in_verdict = true;
  }
  for (size_t i = in_verdict ? 1 : 0; i < env.findings.size(); ++i) notes.push_back(env.findings[i]);
}

std::vector<std::string> environment_lines(const Environment& env) {
  std::vector<std::string> out;
  if (!env.driver.empty() || !env.devices.empty() || !driver_release_of(env).empty()) {
    std::string line = "CUDA driver: ";
    if (!env.driver_release.empty()) line += env.driver_release + ", ";
    if (!env.driver_library_release.empty() && env.driver_library_release != env.driver_release) {
      line += "libcuda " + env.driver_library_release + ", ";
    }
    line += env.driver.empty() ? std::string("version unknown") : "supports CUDA " + env.driver;
    if (!env.devices.empty()) {
      line += "; GPUs:";
      for (size_t i = 0; i < env.devices.size(); ++i) line += (i ? "; " : " ") + env.devices[i];
    }
    out.push_back(line);
  }
  for (const CudaLibrary& l : env.libraries) {
    std::string line = base_name(l.path) + " ";
    if (!l.version.empty()) {
      line += l.name == "libcuda" ? "(driver for CUDA " + l.version + ")" : l.version;
    } else {
      // CUPTI and cuDNN 9 wait to be asked until the program has started
      // what asking them would start (the driver; cuDNN's sub-library).
      if (l.name == "libcupti") {
        line += "(version not asked without a working CUDA driver; build id ";
      } else if (l.name == "libcudnn" && l.major >= 9) {
        line += "(version not asked before the program's first cuDNN call; build id ";
      } else {
        line += "(no version call; build id ";
      }
      line += (l.build_id.empty() ? std::string("unknown") : l.build_id) + ")";
    }
    out.push_back(line + "  " + l.path);
  }
  for (const auto& [name, fields] : env.frameworks) {
    std::string line = name;
    for (const auto& [f, v] : fields) {
      line += (f == "version" ? " " : ", " + f + " ") + v;
      if (f == "cuda" && v == "None") line += " (a CPU-only build)";
    }
    out.push_back(line);
  }
  if (!env.init_error.empty()) out.push_back("first CUDA call refused: " + env.init_error);
  for (const std::string& e : env.create_errors) {
    const std::string what = e.substr(0, e.find('\t'));
    const size_t s1 = what.find(' '), s2 = s1 == std::string::npos ? s1 : what.find(' ', s1 + 1);
    out.push_back(what.substr(0, s1) + " failed: " +
                  (s2 == std::string::npos ? what.substr(s1 == std::string::npos ? what.size() : s1 + 1)
                                           : what.substr(s2 + 1) + " (" + what.substr(s1 + 1, s2 - s1 - 1) + ")"));
  }
  if (!env.python_exception.empty()) out.push_back("Python ended with: " + env.python_exception.substr(0, 300));
  return out;
}

}  // namespace memledger::report
