#include "folded.h"

#include <filesystem>
#include <sstream>

#include "trace_format.h"

namespace memledger::report {
namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// The interpreter's own native frames: where the Python frames stand in.
bool is_interpreter_frame(const Frame& f) {
  const std::string base = std::filesystem::path(f.module).filename().string();
  if (base.rfind("libpython", 0) == 0 || base.rfind("python3", 0) == 0) return true;
  const std::string& fn = f.function;
  return fn.rfind("_PyEval_", 0) == 0 || fn.rfind("PyEval_", 0) == 0 || fn.rfind("_PyObject_", 0) == 0 ||
         fn.rfind("_PyFunction_", 0) == 0 || fn.rfind("PyObject_Call", 0) == 0;
}

// Flame graph tools split frames on ';' and the count on the last space.
std::string folded_name(std::string name) {
  for (char& c : name) {
    if (c == ';') c = ',';
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return name;
}

}  // namespace

const std::vector<SiteTotal>& snapshot_sites(const ProcessReport& p, Snapshot at) {
  switch (at) {
    case Snapshot::kPeak: return p.live_at_peak;
    case Snapshot::kEnd: return p.live_at_end;
    case Snapshot::kGrowth: return p.growth_view.sites;
  }
  return p.live_at_end;
}

bool is_python_frame(const Frame& f) {
  return f.python || ends_with(f.file, ".py") || ends_with(f.file, ".pyx");
}

std::vector<const Frame*> flame_path(const std::vector<Frame>& frames) {
  std::vector<const Frame*> python, native;
  for (const Frame& f : frames) (is_python_frame(f) ? python : native).push_back(&f);
  std::vector<const Frame*> path;
  if (python.empty()) {
    for (auto it = native.rbegin(); it != native.rend(); ++it) path.push_back(*it);
    return path;
  }
  // Frames are recorded innermost first.
  for (auto it = python.rbegin(); it != python.rend(); ++it) path.push_back(*it);
  size_t below = 0;
  while (below < native.size() && !is_interpreter_frame(*native[below])) ++below;
  for (size_t i = below; i-- > 0;) path.push_back(native[i]);
  return path;
}

std::string frame_label(const Frame& f) {
  if (f.function.empty()) {
    if (f.module.empty()) return "??";
    return "?? (" + std::filesystem::path(f.module).filename().string() + ")";
  }
  if (is_python_frame(f)) {
    std::string out = f.function + " (" + std::filesystem::path(f.file).filename().string();
    if (f.line > 0) out += ":" + std::to_string(f.line);
    return out + (f.attributed ? ", attributed)" : ")");
  }
  return f.function;
}

std::string kind_label(uint8_t kind) {
  return std::string("[") + format::kind_name(static_cast<format::Kind>(format::kind_index(kind))) + "]";
}

std::string render_folded(const RunReport& run, Snapshot at) {
  std::ostringstream out;
  const bool several = run.processes.size() > 1;
  for (const ProcessReport& p : run.processes) {
    std::string prefix;
    if (several) {
      prefix = "[" + (p.rank.empty() ? std::string() : "rank " + p.rank + " ") + "pid " + std::to_string(p.pid) + "]";
    }
    for (const SiteTotal& t : snapshot_sites(p, at)) {
      if (t.bytes <= 0) continue;
      if (several) out << folded_name(prefix) << ';';
      out << kind_label(t.site.kind);
      for (const Frame* f : flame_path(t.site.frames)) out << ';' << folded_name(frame_label(*f));
      out << ' ' << t.bytes << '\n';
    }
  }
  return out.str();
}

}  // namespace memledger::report
