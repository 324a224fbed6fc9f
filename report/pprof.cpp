#include "pprof.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <map>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "folded.h"
#include "profile.pb.h"
#include "trace_format.h"

namespace memledger::report {
namespace {

namespace pb = perftools::profiles;

// Interns strings, functions, mappings and locations as profile.proto wants
// them: every string once in string_table (index 0 is ""), ids from 1.
class ProfileBuilder {
 public:
  explicit ProfileBuilder(pb::Profile& profile) : profile_(profile) { str(""); }

  int64_t str(const std::string& s) {
    auto [it, inserted] = strings_.try_emplace(s, static_cast<int64_t>(strings_.size()));
    if (inserted) profile_.add_string_table(s);
    return it->second;
  }

  uint64_t function(const Frame& f) {
    const std::string name = frame_name(f);
    auto key = std::make_pair(name, f.file);
    auto [it, inserted] = functions_.try_emplace(key, functions_.size() + 1);
    if (inserted) {
      pb::Function* fn = profile_.add_function();
      fn->set_id(it->second);
      fn->set_name(str(name));
      fn->set_system_name(str(name));
      fn->set_filename(str(f.file));
    }
    return it->second;
  }

  uint64_t mapping(const std::string& module, uint64_t address) {
    if (module.empty()) return 0;
    auto [it, inserted] = mappings_.try_emplace(module, mappings_.size() + 1);
    if (inserted) {
      pb::Mapping* m = profile_.add_mapping();
      m->set_id(it->second);
      m->set_filename(str(module));
      m->set_memory_start(address);
      m->set_memory_limit(address + 1);
      m->set_has_functions(true);
      m->set_has_filenames(true);
      m->set_has_line_numbers(true);
      m->set_has_inline_frames(true);
    }
    // The range the recorded addresses span (the module map itself stays in the trace).
    pb::Mapping* m = profile_.mutable_mapping(static_cast<int>(it->second - 1));
    m->set_memory_start(std::min<uint64_t>(m->memory_start(), address));
    m->set_memory_limit(std::max<uint64_t>(m->memory_limit(), address + 1));
    return it->second;
  }

  // One location: a recorded address with its inline chain, innermost first.
  uint64_t location(const std::vector<const Frame*>& chain) {
    std::string key = chain.back()->module + '\0' + std::to_string(chain.back()->address);
    for (const Frame* f : chain) key += '\0' + f->function + '\0' + f->file + '\0' + std::to_string(f->line);
    auto [it, inserted] = locations_.try_emplace(key, locations_.size() + 1);
    if (inserted) {
      pb::Location* loc = profile_.add_location();
      loc->set_id(it->second);
      loc->set_address(chain.back()->address);
      // A Python frame has no address in its module (the interpreter).
      if (!is_python_frame(*chain.back())) loc->set_mapping_id(mapping(chain.back()->module, chain.back()->address));
      for (const Frame* f : chain) {
        pb::Line* line = loc->add_line();
        line->set_function_id(function(*f));
        line->set_line(f->line);
      }
    }
    return it->second;
  }

 private:
  static std::string frame_name(const Frame& f) {
    if (!f.function.empty()) return f.attributed ? f.function + " (attributed)" : f.function;
    return f.module.empty() ? "??" : "?? (" + f.module + ")";
  }

  pb::Profile& profile_;
  std::unordered_map<std::string, int64_t> strings_;
  std::map<std::pair<std::string, std::string>, uint64_t> functions_;
  std::unordered_map<std::string, uint64_t> mappings_;
  std::unordered_map<std::string, uint64_t> locations_;
};

}  // namespace

std::string build_pprof(const RunReport& run) {
  pb::Profile profile;
  ProfileBuilder b(profile);
  for (const char* type : {"peak_objects", "peak_space", "exit_objects", "exit_space"}) {
    pb::ValueType* vt = profile.add_sample_type();
    vt->set_type(b.str(type));
    vt->set_unit(b.str(std::string(type).find("objects") != std::string::npos ? "count" : "bytes"));
  }
  profile.set_default_sample_type(b.str("peak_space"));
  pb::ValueType* period = profile.mutable_period_type();
  period->set_type(b.str("space"));
  period->set_unit(b.str("bytes"));

  const ProcessReport& root = run.processes[run.root];
  profile.set_duration_nanos(static_cast<int64_t>(root.duration_ns));
  std::string cmd;
  for (const std::string& a : run.command) cmd += (cmd.empty() ? "" : " ") + a;
  if (cmd.empty()) cmd = root.command;
  profile.add_comment(b.str("memledger: live memory by allocation site of " + cmd));
  profile.add_comment(b.str("peak_*: at the peak of process " + std::to_string(root.pid) + " (" +
                            human_bytes(double(root.peak.bytes)) + " " + peak_phase(root.peak, root.steps) +
                            "); exit_*: at the end"));
  if (root.host_mode == "sampled") {
    profile.add_comment(b.str("host allocations sampled: per-site values are unbiased estimates"));
  }

  for (const ProcessReport& p : run.processes) {
    // (kind, stack) -> values; the two live sets name the same sites.
    std::map<std::pair<uint8_t, uint32_t>, std::pair<const SiteTotal*, std::array<int64_t, 4>>> sites;
    for (const SiteTotal& t : p.live_at_peak) {
      auto& entry = sites[{t.site.kind, t.site.stack}];
      entry.first = &t;
      entry.second[0] = static_cast<int64_t>(t.count);
      entry.second[1] = t.bytes;
    }
    for (const SiteTotal& t : p.live_at_end) {
      auto& entry = sites[{t.site.kind, t.site.stack}];
      if (entry.first == nullptr) entry.first = &t;
      entry.second[2] = static_cast<int64_t>(t.count);
      entry.second[3] = t.bytes;
    }
    for (const auto& [key, entry] : sites) {
      pb::Sample* sample = profile.add_sample();
      // Leaf first; an inline chain (inlined frames, then the frame holding
      // them) becomes one location.
      std::vector<const Frame*> path = flame_path(entry.first->site.frames);
      std::reverse(path.begin(), path.end());
      std::vector<const Frame*> chain;
      for (const Frame* f : path) {
        chain.push_back(f);
        if (f->inlined && f != path.back()) continue;
        sample->add_location_id(b.location(chain));
        chain.clear();
      }
      if (path.empty()) {
        Frame unknown;
        unknown.function = "[no stack recorded]";
        sample->add_location_id(b.location({&unknown}));
      }
      for (int64_t v : entry.second) sample->add_value(v);
      pb::Label* kind = sample->add_label();
      kind->set_key(b.str("kind"));
      kind->set_str(b.str(format::kind_name(static_cast<format::Kind>(format::kind_index(key.first)))));
      pb::Label* pid = sample->add_label();
      pid->set_key(b.str("pid"));
      pid->set_num(p.pid);
      if (!p.rank.empty()) {
        pb::Label* rank = sample->add_label();
        rank->set_key(b.str("rank"));
        rank->set_str(b.str(p.rank));
      }
    }
  }
  std::string out;
  if (!profile.SerializeToString(&out)) throw std::runtime_error("pprof: the profile could not be serialized");
  return out;
}

std::string gzip_compress(const std::string& data) {
  z_stream z{};
  // 15 window bits + 16: a gzip header and trailer rather than zlib's.
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    throw std::runtime_error("gzip: deflateInit2 failed");
  }
  std::string out(deflateBound(&z, static_cast<uLong>(data.size())) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  const size_t size = z.total_out;
  deflateEnd(&z);
  if (rc != Z_STREAM_END) throw std::runtime_error("gzip: deflate failed");
  out.resize(size);
  return out;
}

std::string render_pprof(const RunReport& run) { return gzip_compress(build_pprof(run)); }

}  // namespace memledger::report
