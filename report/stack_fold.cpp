#include "stack_fold.h"

#include <algorithm>

#include "analysis.h"
#include "run_report.h"

namespace memledger::report {
namespace {

// The package of a path inside site-packages or dist-packages: the folder
// (or module file) right below it, without an extension.
std::string installed_package(const std::string& path) {
  for (const char* root : {"/site-packages/", "/dist-packages/"}) {
    const size_t at = path.find(root);
    if (at == std::string::npos) continue;
    const size_t begin = at + std::char_traits<char>::length(root);
    std::string name = path.substr(begin, path.find('/', begin) - begin);
    return name.substr(0, name.find('.'));
  }
  return {};
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Shared objects and programs of the system: the interpreter, libc,
// libstdc++, the CUDA libraries.
bool system_module(const std::string& path) {
  for (const char* root : {"/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/", "/usr/local/lib/", "/usr/local/cuda", "/opt/"}) {
    if (starts_with(path, root)) return true;
  }
  const std::string base = path.substr(path.rfind('/') + 1);
  return starts_with(base, "python") || starts_with(base, "libpython");
}

}  // namespace

std::string frame_library(const Frame& f) {
  if (f.python) {
    if (!is_library_python_file(f.file)) return {};
    if (is_memledger_python_file(f.file)) return "memledger";
    const std::string package = installed_package(f.file);
    return package.empty() ? "the Python standard library" : package;
  }
  if (f.module.empty()) return f.function.empty() ? "?" : std::string();
  // Extension modules of a package or of the standard library (lib-dynload).
  if (is_library_python_file(f.module)) {
    const std::string package = installed_package(f.module);
    return package.empty() ? "the Python standard library" : package;
  }
  if (!system_module(f.module)) return {};
  std::string base = f.module.substr(f.module.rfind('/') + 1);
  if (starts_with(base, "libpython")) base.erase(0, 3);  // the interpreter, linked or not
  return base.substr(0, base.find(".so"));
}

std::vector<std::string> folded_stack(const std::vector<Frame>& frames) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < frames.size()) {
    std::vector<std::string> names;
    size_t end = i;
    for (; end < frames.size(); ++end) {
      const std::string library = frame_library(frames[end]);
      if (library.empty()) break;
      if (library != "?" && std::find(names.begin(), names.end(), library) == names.end()) names.push_back(library);
    }
    if (end - i >= 2) {
      std::string line = "\u2026 " + std::to_string(end - i) + " frames in ";
      for (size_t k = 0; k < names.size(); ++k) line += (k ? ", " : "") + names[k];
      if (names.empty()) line += "unknown code";
      out.push_back(line + " \u2026");
      i = end;
      continue;
    }
    out.push_back(frame_text(frames[i]));
    ++i;
  }
  return out;
}

}  // namespace memledger::report
