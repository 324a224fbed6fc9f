#include "symbolizer.h"

#include <cxxabi.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string_view>

#include <absl/container/flat_hash_map.h>

#include "trace_format.h"

namespace memledger::report {
namespace {

constexpr const char* kSystemDebugDir = "/usr/lib/debug";

// dwfl_standard_find_debuginfo ends, when nothing local matched, with a debuginfod
// query (libdwfl/debuginfod-client.c dlopens libdebuginfod). The client reads
// DEBUGINFOD_URLS on each query and does no network I/O when it is unset, so the
// variable is hidden for the duration of the call: the report stays offline.
class ScopedUnsetEnv {
 public:
  explicit ScopedUnsetEnv(const char* name) : name_(name) {
    if (const char* value = std::getenv(name)) {
      saved_ = value;
      unsetenv(name);
    }
  }
  ~ScopedUnsetEnv() {
    if (saved_) setenv(name_, saved_->c_str(), 1);
  }
  ScopedUnsetEnv(const ScopedUnsetEnv&) = delete;
  ScopedUnsetEnv& operator=(const ScopedUnsetEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

int FindDebuginfo(Dwfl_Module* mod, void** userdata, const char* modname, Dwarf_Addr base,
                  const char* file_name, const char* debuglink_file, GElf_Word debuglink_crc,
                  char** debuginfo_file_name) {
  ScopedUnsetEnv offline("DEBUGINFOD_URLS");
  return dwfl_standard_find_debuginfo(mod, userdata, modname, base, file_name, debuglink_file,
                                      debuglink_crc, debuginfo_file_name);
}

// Every module is reported with its file (dwfl_report_elf), so libdwfl never needs to
// find one; the standard callback would also ask debuginfod.
int FindNoElf(Dwfl_Module*, void**, const char*, Dwarf_Addr, char**, Elf**) { return -1; }

std::string Hex(const unsigned char* bits, int len) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(static_cast<size_t>(len) * 2);
  for (int i = 0; i < len; ++i) {
    out += kDigits[bits[i] >> 4];
    out += kDigits[bits[i] & 0xf];
  }
  return out;
}

std::string ModuleBuildId(Dwfl_Module* mod) {
  const unsigned char* bits = nullptr;
  GElf_Addr vaddr = 0;
  int len = dwfl_module_build_id(mod, &bits, &vaddr);
  return len > 0 ? Hex(bits, len) : std::string();
}

// Pseudo-objects from dl_iterate_phdr or /proc/PID/maps that have no file to read.
bool IsPseudoModule(std::string_view path) {
  return (!path.empty() && path.front() == '[') || path.starts_with("linux-vdso") ||
         path.starts_with("linux-gate");
}

// "" when path names a regular file, else why not.
std::string NotARegularFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::strerror(errno);
  return S_ISREG(st.st_mode) ? std::string() : std::string("not a regular file");
}

bool IsFunctionScope(Dwarf_Die* die) {
  int tag = dwarf_tag(die);
  return tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine ||
         tag == DW_TAG_entry_point;
}

// DIEs that can hold, or lead to, function definitions.
bool MayHoldFunctions(int tag) {
  switch (tag) {
    case DW_TAG_subprogram:
    case DW_TAG_lexical_block:
    case DW_TAG_inlined_subroutine:
    case DW_TAG_compile_unit:
    case DW_TAG_partial_unit:
    case DW_TAG_skeleton_unit:
    case DW_TAG_module:
    case DW_TAG_namespace:
    case DW_TAG_class_type:
    case DW_TAG_structure_type:
    case DW_TAG_union_type:
      return true;
    default:
      return false;
  }
}

// Scopes inside a function that can contain the pc.
bool IsInnerScope(int tag) {
  switch (tag) {
    case DW_TAG_lexical_block:
    case DW_TAG_inlined_subroutine:
    case DW_TAG_try_block:
    case DW_TAG_catch_block:
    case DW_TAG_with_stmt:
    case DW_TAG_entry_point:
      return true;
    default:
      return false;
  }
}

// Calls f(low, high) for each address range of die.
template <typename F>
void ForEachRange(Dwarf_Die* die, F&& f) {
  Dwarf_Addr base = 0, low = 0, high = 0;
  ptrdiff_t offset = 0;
  while ((offset = dwarf_ranges(die, offset, &base, &low, &high)) > 0)
    if (high > low) f(low, high);
}

// Values by address interval [low, high). Intervals may overlap (nested functions, a
// library unloaded and another loaded at its place): the one starting last holds an
// address, and on equal starts the one added last.
template <typename T>
class IntervalMap {
 public:
  void Add(uint64_t low, uint64_t high, T value) {
    if (high > low) entries_.push_back({low, high, std::move(value)});
  }

  // Call once after the last Add, before the first Find.
  void Finish() {
    std::stable_sort(entries_.begin(), entries_.end(),
                     [](const Entry& a, const Entry& b) { return a.low < b.low; });
    max_high_.resize(entries_.size());
    uint64_t m = 0;
    for (size_t i = 0; i < entries_.size(); ++i) max_high_[i] = m = std::max(m, entries_[i].high);
  }

  const T* Find(uint64_t addr) const {
    auto it = std::upper_bound(entries_.begin(), entries_.end(), addr,
                               [](uint64_t a, const Entry& e) { return a < e.low; });
    for (auto i = it - entries_.begin() - 1; i >= 0 && max_high_[i] > addr; --i)
      if (addr < entries_[i].high) return &entries_[i].value;
    return nullptr;
  }

 private:
  struct Entry {
    uint64_t low;
    uint64_t high;
    T value;
  };
  std::vector<Entry> entries_;      // sorted by low after Finish
  std::vector<uint64_t> max_high_;  // max_high_[i] = max(entries_[0..i].high)
};

// The concrete functions of one compilation unit by address. dwarf_getscopes walks the
// whole unit on every call (each declaration in namespace std included: milliseconds
// per address in a C++ unit); this index is built once per unit.
class UnitIndex {
 public:
  explicit UnitIndex(Dwarf_Die* cudie) {
    Dwarf_Die root = *cudie;
    uint8_t unit_type = 0;
    Dwarf_Die subdie;
    // Split DWARF: the functions are in the split unit, not in the skeleton.
    if (dwarf_cu_info(cudie->cu, nullptr, &unit_type, nullptr, &subdie, nullptr, nullptr,
                      nullptr) == 0 &&
        unit_type == DW_UT_skeleton && dwarf_tag(&subdie) != DW_TAG_invalid)
      root = subdie;
    Add(&root, 0);
    functions_.Finish();
  }

  const Dwarf_Die* Find(Dwarf_Addr pc) const { return functions_.Find(pc); }

  // The namespace, class, function or block that holds a function or one of those, as
  // libdw has no parent links; nullptr at the top of the unit.
  const Dwarf_Die* Parent(const Dwarf_Die& die) const {
    auto it = parents_.find(die.addr);
    return it != parents_.end() ? &it->second : nullptr;
  }

 private:
  void Add(Dwarf_Die* parent, int depth) {
    if (depth > 64) return;  // hostile input
    Dwarf_Die child;
    if (dwarf_child(parent, &child) != 0) return;
    for (;;) {
      int tag = dwarf_tag(&child);
      if (tag == DW_TAG_subprogram)
        ForEachRange(&child, [&](Dwarf_Addr low, Dwarf_Addr high) {
          functions_.Add(low, high, child);
        });
      bool descend = MayHoldFunctions(tag);
      if (depth > 0 && (tag == DW_TAG_subprogram || descend) &&
          tag != DW_TAG_inlined_subroutine)
        parents_.emplace(child.addr, *parent);
      // Into functions too: gcc nests the definition of a lambda's operator() in the
      // function that holds the lambda.
      if (descend) Add(&child, depth + 1);
      Dwarf_Die next;
      if (dwarf_siblingof(&child, &next) != 0) break;
      child = next;
    }
  }

  IntervalMap<Dwarf_Die> functions_;
  absl::flat_hash_map<const void*, Dwarf_Die> parents_;  // key: the DIE's data
};

// The blocks and inlined instances of one function with their ranges, in DIE-tree
// order, so that a pc is placed by comparing integers instead of decoding DIEs again
// (one function can hold thousands of inlined instances).
class FunctionIndex {
 public:
  explicit FunctionIndex(Dwarf_Die subprogram) { Add(&subprogram, 1); }

  // Appends the scopes holding pc, outermost first: at each level the first child that
  // holds it, then that child's children.
  void Path(Dwarf_Addr pc, std::vector<Dwarf_Die>& out) const {
    uint32_t want = 1;
    for (const Scope& scope : scopes_) {
      if (scope.depth < want) break;  // left the subtree of the last scope taken
      if (scope.depth == want && Contains(scope, pc)) {
        out.push_back(scope.die);
        ++want;
      }
    }
  }

 private:
  struct Scope {
    Dwarf_Die die;
    uint32_t depth;  // 1: a child of the function
    uint32_t first_range;
    uint32_t range_count;
  };

  void Add(Dwarf_Die* parent, uint32_t depth) {
    if (depth > 256) return;  // hostile input
    Dwarf_Die child;
    if (dwarf_child(parent, &child) != 0) return;
    for (;;) {
      if (IsInnerScope(dwarf_tag(&child))) {
        Scope scope{child, depth, static_cast<uint32_t>(ranges_.size()), 0};
        ForEachRange(&child, [&](Dwarf_Addr low, Dwarf_Addr high) {
          ranges_.emplace_back(low, high);
          ++scope.range_count;
        });
        // A scope without code holds none below it either (as in dwarf_getscopes).
        if (scope.range_count > 0) {
          scopes_.push_back(scope);
          Add(&child, depth + 1);
        }
      }
      Dwarf_Die next;
      if (dwarf_siblingof(&child, &next) != 0) break;
      child = next;
    }
  }

  bool Contains(const Scope& scope, Dwarf_Addr pc) const {
    for (uint32_t i = 0; i < scope.range_count; ++i) {
      const auto& [low, high] = ranges_[scope.first_range + i];
      if (pc >= low && pc < high) return true;
    }
    return false;
  }

  std::vector<Scope> scopes_;
  std::vector<std::pair<Dwarf_Addr, Dwarf_Addr>> ranges_;
};

// The function symbols of one module by address. dwfl_module_addrinfo scans the whole
// symbol table on each call, far too slow for modules without DWARF (libc, vendor
// libraries) where every frame is named from here. Same choice as libdwfl: a sized
// symbol holding the address, global before weak before local; else a sizeless symbol in
// the same section if it is the closest symbol below the address.
class SymbolIndex {
 public:
  explicit SymbolIndex(Dwfl_Module* mod) : mod_(mod) {
    struct Symbol {
      GElf_Addr addr;
      GElf_Xword size;
      int rank;
      GElf_Word section;
      const char* name;
    };
    std::vector<Symbol> symbols;
    int n = dwfl_module_getsymtab(mod);
    for (int i = 1; i < n; ++i) {
      GElf_Sym sym;
      GElf_Addr addr = 0;
      GElf_Word section = 0;
      const char* name = dwfl_module_getsym_info(mod, i, &sym, &addr, &section, nullptr, nullptr);
      int type = GELF_ST_TYPE(sym.st_info);
      if (name == nullptr || name[0] == '\0' || sym.st_shndx == SHN_UNDEF ||
          section == static_cast<GElf_Word>(-1) || (type != STT_FUNC && type != STT_GNU_IFUNC))
        continue;
      int bind = GELF_ST_BIND(sym.st_info);
      symbols.push_back({addr, sym.st_size, bind == STB_GLOBAL ? 2 : bind == STB_WEAK ? 1 : 0,
                         section, name});
    }
    // Added lowest rank first: on equal starts the map returns the one added last.
    std::stable_sort(symbols.begin(), symbols.end(),
                     [](const Symbol& a, const Symbol& b) { return a.rank < b.rank; });
    for (const Symbol& s : symbols) {
      if (s.size > 0) {
        sized_.Add(s.addr, s.addr + s.size, s.name);
        sized_starts_.push_back(s.addr);
      } else {
        sizeless_.push_back({s.addr, s.section, s.name});
      }
    }
    sized_.Finish();
    std::sort(sized_starts_.begin(), sized_starts_.end());
    std::stable_sort(sizeless_.begin(), sizeless_.end(),
                     [](const Sizeless& a, const Sizeless& b) { return a.addr < b.addr; });
  }

  const char* Find(GElf_Addr addr) const {
    if (const char* const* name = sized_.Find(addr)) return *name;
    auto it = std::upper_bound(sizeless_.begin(), sizeless_.end(), addr,
                               [](GElf_Addr a, const Sizeless& s) { return a < s.addr; });
    if (it == sizeless_.begin()) return nullptr;
    --it;
    auto sized = std::upper_bound(sized_starts_.begin(), sized_starts_.end(), addr);
    if (sized != sized_starts_.begin() && *(sized - 1) > it->addr) return nullptr;
    Dwarf_Addr relative = addr;
    Dwarf_Addr bias = 0;
    Elf_Scn* scn = dwfl_module_address_section(mod_, &relative, &bias);
    if (scn == nullptr || elf_ndxscn(scn) != it->section) return nullptr;
    return it->name;
  }

 private:
  struct Sizeless {
    GElf_Addr addr;
    GElf_Word section;
    const char* name;
  };
  Dwfl_Module* mod_;
  IntervalMap<const char*> sized_;
  std::vector<GElf_Addr> sized_starts_;  // sorted
  std::vector<Sizeless> sizeless_;       // sorted by addr
};

}  // namespace

// Frames already resolved, by module (build id, path and debug folders) and
// address within it, shared by every Symbolizer of the process. A report
// holds one Symbolizer per trace, and a job of many short processes (a
// shell running a command in a loop, a launcher's helpers) has the same
// modules in every trace: opening libc's separate debug info (compressed
// sections) once per trace cost about 80 ms of each trace's report.
class SharedFrames {
 public:
  using Table = absl::flat_hash_map<uint64_t, std::vector<Frame>>;  // (offset << 1 | return_address)
  static SharedFrames& instance() {
    static SharedFrames shared;
    return shared;
  }
  // The table of one module; stable for the life of the process.
  Table* table(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<Table>& t = tables_[key];
    if (!t) t = std::make_unique<Table>();
    return t.get();
  }
  bool find(Table* table, uint64_t key, uint64_t ip, std::vector<Frame>* out) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = table->find(key);
    if (it == table->end()) return false;
    *out = it->second;
    for (Frame& f : *out) f.address = ip;
    return true;
  }
  void add(Table* table, uint64_t key, const std::vector<Frame>& frames) {
    std::lock_guard<std::mutex> lock(mutex_);
    table->try_emplace(key, frames);
  }

 private:
  std::mutex mutex_;
  absl::flat_hash_map<std::string, std::unique_ptr<Table>> tables_;
};

struct Symbolizer::Impl {
  enum class State : uint8_t { kUnopened, kReady, kFailed };

  struct Module {
    ModuleInfo info;
    State state = State::kUnopened;
    Dwfl* dwfl = nullptr;  // one per module: recorded modules may overlap
    Dwfl_Module* mod = nullptr;
    std::unique_ptr<SymbolIndex> symbols;  // on the first frame DWARF does not name
    // Compilation units by their DW_AT_ranges/low_pc, built on the first DWARF lookup.
    // dwfl_module_addrdie goes by .debug_aranges, which clang does not emit by default,
    // and gives an address past a unit's last arange to that unit: in a program mixing
    // gcc and clang objects it names the wrong unit.
    std::unique_ptr<IntervalMap<Dwarf_Die*>> units;
    Dwarf_Addr dwarf_bias = 0;
    SharedFrames::Table* shared = nullptr;  // only for modules with a build id
  };

  struct Key {
    uint64_t ip;
    bool return_address;
    bool operator==(const Key&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.ip, k.return_address);
    }
  };

  std::vector<Module> modules;
  IntervalMap<uint32_t> module_ranges;  // run-time addresses -> index in modules
  std::vector<std::string> debug_dirs;  // absolute; the user's first, then kSystemDebugDir
  size_t user_debug_dirs = 0;
  std::string debuginfo_path;
  char* debuginfo_path_ptr = nullptr;
  Dwfl_Callbacks callbacks{};

  absl::flat_hash_map<Key, uint32_t> index;  // -> results
  std::deque<std::vector<Frame>> results;    // a deque: references stay valid on growth
  // Keyed by addresses inside libdw's mapped data, stable while the Dwfl lives.
  // unique_ptr: a UnitIndex stays in place while others are added.
  absl::flat_hash_map<const void*, std::unique_ptr<UnitIndex>> unit_index;  // unit DIE data
  absl::flat_hash_map<const void*, FunctionIndex> function_index;  // function DIE data
  struct DieNameEntry {
    std::string name;
    bool from_linkage_name;  // else built from DW_AT_name and the parents
  };
  absl::flat_hash_map<const void*, DieNameEntry> die_names;        // DIE data
  absl::flat_hash_map<const char*, std::string> names;  // raw name -> demangled
  absl::flat_hash_map<const char*, std::string> files;  // raw file name -> normalized
  std::vector<std::string> warnings;
  const std::map<uint32_t, PythonCode>* python_codes = nullptr;
  std::string python_module;

  Impl(std::vector<ModuleInfo> infos, SymbolizerOptions options);
  ~Impl();

  void Warn(std::string message);
  std::vector<std::string> Candidates(const ModuleInfo& info) const;
  bool TryOpen(Module& m, const std::string& file, std::string* problem);
  bool Open(Module& m);
  std::vector<Frame> Compute(uint64_t ip, bool return_address);
  Frame ComputePython(uint64_t word);
  void Symbolize(Module& m, uint64_t addr, const Frame& base, std::vector<Frame>& out);
  Dwarf_Die* UnitDie(Module& m, uint64_t addr, Dwarf_Addr* bias);
  void FunctionScopes(Dwarf_Die* cudie, Dwarf_Addr pc, std::vector<Dwarf_Die>& funcs);
  const std::string& Name(const char* raw);
  const std::string& File(const char* raw);
  UnitIndex& Unit(Dwarf_Die* cudie);
  const DieNameEntry& DieName(Dwarf_Die* die, int depth = 0);
  std::string QualifiedName(Dwarf_Die* decl, const char* name, int depth);
  std::string SymbolName(Module& m, uint64_t addr);
};

Symbolizer::Impl::Impl(std::vector<ModuleInfo> infos, SymbolizerOptions options) {
  std::error_code ec;
  for (const std::string& dir : options.debug_dirs) {
    if (dir.empty()) continue;
    std::filesystem::path abs = std::filesystem::absolute(dir, ec);
    if (ec) continue;
    std::string s = abs.lexically_normal().string();
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    // libdwfl's debuginfo_path is ':'-separated, with no escape.
    if (s.find(':') != std::string::npos) {
      Warn("debug folder " + s + " contains ':' and is ignored");
      continue;
    }
    if (std::find(debug_dirs.begin(), debug_dirs.end(), s) == debug_dirs.end())
      debug_dirs.push_back(s);
  }
  user_debug_dirs = debug_dirs.size();
  if (std::find(debug_dirs.begin(), debug_dirs.end(), kSystemDebugDir) == debug_dirs.end())
    debug_dirs.emplace_back(kSystemDebugDir);

  // "" = the file's own folder, ".debug" = its .debug subfolder; absolute folders get both
  // the .build-id/xx/yyyy.debug lookup and the mirrored-path lookup (libdwfl semantics).
  debuginfo_path = ":.debug";
  for (const std::string& dir : debug_dirs) debuginfo_path += ":" + dir;
  debuginfo_path_ptr = debuginfo_path.data();
  callbacks.find_elf = FindNoElf;
  callbacks.find_debuginfo = FindDebuginfo;
  callbacks.section_address = dwfl_offline_section_address;
  callbacks.debuginfo_path = &debuginfo_path_ptr;

  modules.reserve(infos.size());
  for (ModuleInfo& info : infos) {
    modules.emplace_back();
    modules.back().info = std::move(info);
  }
  for (uint32_t i = 0; i < modules.size(); ++i) {
    Module& m = modules[i];
    if (!m.info.build_id.empty()) {
      m.shared = SharedFrames::instance().table(m.info.build_id + '\0' + m.info.path + '\0' + debuginfo_path);
    }
    for (const auto& [vaddr, memsz] : m.info.segments) {
      uint64_t start = m.info.base + vaddr;
      if (start + memsz > start) module_ranges.Add(start, start + memsz, i);  // not wrapping
    }
    // Without recorded segments the extent is only known from the file.
    if (m.info.segments.empty() && Open(m)) {
      Dwarf_Addr low = 0, high = 0;
      dwfl_module_info(m.mod, nullptr, &low, &high, nullptr, nullptr, nullptr, nullptr);
      module_ranges.Add(low, high, i);
    }
  }
  module_ranges.Finish();
}

Symbolizer::Impl::~Impl() {
  for (Module& m : modules)
    if (m.dwfl != nullptr) dwfl_end(m.dwfl);
}

void Symbolizer::Impl::Warn(std::string message) {
  if (std::find(warnings.begin(), warnings.end(), message) == warnings.end())
    warnings.push_back(std::move(message));
}

// Files that may hold the module, best first. Any of them must carry the recorded build
// id, when there is one.
std::vector<std::string> Symbolizer::Impl::Candidates(const ModuleInfo& info) const {
  std::vector<std::string> out;
  if (!info.path.empty()) out.push_back(info.path);
  const std::string& id = info.build_id;
  std::string base_name = std::filesystem::path(info.path).filename().string();
  for (size_t d = 0; d < debug_dirs.size(); ++d) {
    const std::string& dir = debug_dirs[d];
    bool user_dir = d < user_debug_dirs;
    // Without a build id to check, files found by name are taken only from folders the
    // user named.
    if (id.empty() && !user_dir) continue;
    if (id.size() > 2) {
      std::string by_id = dir + "/.build-id/" + id.substr(0, 2) + "/" + id.substr(2);
      out.push_back(by_id + ".debug");
      out.push_back(by_id);
    }
    if (!info.path.empty() && info.path.front() == '/') {
      out.push_back(dir + info.path);
      if (!id.empty()) out.push_back(dir + info.path + ".debug");
    }
    if (!base_name.empty() && user_dir) out.push_back(dir + "/" + base_name);
  }
  return out;
}

bool Symbolizer::Impl::TryOpen(Module& m, const std::string& file, std::string* problem) {
  if (std::string why = NotARegularFile(file); !why.empty()) {
    if (problem->empty()) *problem = "cannot open " + file + ": " + why;
    return false;
  }
  Dwfl* dwfl = dwfl_begin(&callbacks);
  if (dwfl == nullptr) {
    if (problem->empty()) *problem = std::string("libdwfl: ") + dwfl_errmsg(-1);
    return false;
  }
  dwfl_report_begin(dwfl);
  const char* name = m.info.path.empty() ? "[unnamed]" : m.info.path.c_str();
  // add_p_vaddr = true makes the module's bias exactly `base`, as dlpi_addr is; with
  // false libdwfl would place the first PT_LOAD's aligned p_vaddr at `base` instead.
  Dwfl_Module* mod = dwfl_report_elf(dwfl, name, file.c_str(), -1, m.info.base, true);
  dwfl_report_end(dwfl, nullptr, nullptr);
  if (mod == nullptr) {
    if (problem->empty()) *problem = "cannot read " + file + ": " + dwfl_errmsg(-1);
    dwfl_end(dwfl);
    return false;
  }
  if (!m.info.build_id.empty()) {
    std::string found = ModuleBuildId(mod);
    if (found != m.info.build_id) {
      if (problem->empty())
        *problem = "build id mismatch for " + file + ": recorded " + m.info.build_id +
                   ", found " + (found.empty() ? std::string("none") : found);
      dwfl_end(dwfl);
      return false;
    }
  }
  m.dwfl = dwfl;
  m.mod = mod;
  return true;
}

bool Symbolizer::Impl::Open(Module& m) {
  if (m.state != State::kUnopened) return m.state == State::kReady;
  m.state = State::kFailed;
  if (IsPseudoModule(m.info.path)) return false;
  std::string problem;
  for (const std::string& file : Candidates(m.info)) {
    if (TryOpen(m, file, &problem)) {
      m.state = State::kReady;
      return true;
    }
  }
  if (m.info.path.empty()) {
    char base[32];
    std::snprintf(base, sizeof base, "%llx", static_cast<unsigned long long>(m.info.base));
    problem = std::string("module loaded at 0x") + base + " has no path" +
              (m.info.build_id.empty() ? "" : " and no file with build id " + m.info.build_id);
  }
  Warn(problem + "; frames unsymbolized");
  return false;
}

const std::string& Symbolizer::Impl::Name(const char* raw) {
  auto [it, inserted] = names.try_emplace(raw);
  if (inserted) {
    int status = -1;
    char* demangled = nullptr;
    if (raw[0] == '_' && raw[1] == 'Z')
      demangled = abi::__cxa_demangle(raw, nullptr, nullptr, &status);
    it->second = (status == 0 && demangled != nullptr) ? demangled : raw;
    std::free(demangled);
  }
  return it->second;
}

const std::string& Symbolizer::Impl::File(const char* raw) {
  auto [it, inserted] = files.try_emplace(raw);
  if (inserted) {
    std::string_view s(raw);
    // Build systems record "BUILD/../src/x.cpp"; shown as "src/x.cpp" under the root.
    if (s.find("/../") != s.npos || s.find("/./") != s.npos || s.find("//") != s.npos)
      it->second = std::filesystem::path(s).lexically_normal().string();
    else
      it->second = s;
  }
  return it->second;
}

UnitIndex& Symbolizer::Impl::Unit(Dwarf_Die* cudie) {
  std::unique_ptr<UnitIndex>& unit = unit_index[cudie->addr];
  if (unit == nullptr) unit = std::make_unique<UnitIndex>(cudie);
  return *unit;
}

// The demangled linkage name; else (gcc gives none to functions of internal linkage or
// only ever inlined) DW_AT_name qualified with the namespaces, classes and functions
// that hold the declaration.
const Symbolizer::Impl::DieNameEntry& Symbolizer::Impl::DieName(Dwarf_Die* die, int depth) {
  if (auto it = die_names.find(die->addr); it != die_names.end()) return it->second;
  DieNameEntry entry{{}, true};
  Dwarf_Attribute attr;
  // dwarf_attr_integrate follows DW_AT_abstract_origin and DW_AT_specification, which is
  // where inlined instances and member function definitions keep their names.
  const char* name = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_linkage_name, &attr));
  if (name == nullptr)
    name = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr));
  if (name != nullptr) {
    entry.name = Name(name);
  } else {
    entry.from_linkage_name = false;
    Dwarf_Die decl = *die;
    for (int i = 0; i < 8; ++i) {
      Dwarf_Die target;
      if ((dwarf_attr(&decl, DW_AT_abstract_origin, &attr) == nullptr &&
           dwarf_attr(&decl, DW_AT_specification, &attr) == nullptr) ||
          dwarf_formref_die(&attr, &target) == nullptr)
        break;
      decl = target;
    }
    if (const char* short_name = dwarf_diename(&decl))
      entry.name = QualifiedName(&decl, short_name, depth);
  }
  // Not try_emplace up front: QualifiedName may have added entries (for enclosing
  // functions) and moved the table.
  return die_names.insert_or_assign(die->addr, std::move(entry)).first->second;
}

std::string Symbolizer::Impl::QualifiedName(Dwarf_Die* decl, const char* name, int depth) {
  Dwarf_Die cu;
  if (depth > 8 || dwarf_diecu(decl, &cu, nullptr, nullptr) == nullptr) return name;
  const UnitIndex& unit = Unit(&cu);
  std::vector<std::string> scopes;  // innermost first
  const Dwarf_Die* parent = unit.Parent(*decl);
  for (int i = 0; parent != nullptr && i < 32; ++i, parent = unit.Parent(*parent)) {
    Dwarf_Die p = *parent;
    int tag = dwarf_tag(&p);
    if (tag == DW_TAG_lexical_block) continue;
    if (tag == DW_TAG_subprogram) {  // a local class or lambda: the function's own name
      scopes.push_back(DieName(&p, depth + 1).name);
      break;
    }
    if (const char* n = dwarf_diename(&p)) {
      scopes.emplace_back(n);
    } else if (tag == DW_TAG_namespace) {
      scopes.emplace_back("(anonymous namespace)");
    } else {
      // An unnamed class with member functions inside a function is a lambda's closure.
      Dwarf_Die outer;
      int outer_tag = 0;
      if (const Dwarf_Die* o = unit.Parent(p)) outer = *o, outer_tag = dwarf_tag(&outer);
      bool in_function = outer_tag == DW_TAG_subprogram || outer_tag == DW_TAG_lexical_block;
      scopes.emplace_back(in_function ? "{lambda}" : "{unnamed type}");
    }
  }
  std::string out;
  for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) out += *it + "::";
  return out + name;
}

std::string Symbolizer::Impl::SymbolName(Module& m, uint64_t addr) {
  if (m.symbols == nullptr) m.symbols = std::make_unique<SymbolIndex>(m.mod);
  const char* name = m.symbols->Find(addr);
  return name != nullptr ? Name(name) : std::string();
}

Dwarf_Die* Symbolizer::Impl::UnitDie(Module& m, uint64_t addr, Dwarf_Addr* bias) {
  if (m.units == nullptr) {
    m.units = std::make_unique<IntervalMap<Dwarf_Die*>>();
    if (dwfl_module_getdwarf(m.mod, &m.dwarf_bias) != nullptr) {
      Dwarf_Addr unit_bias = 0;
      for (Dwarf_Die* cu = nullptr; (cu = dwfl_module_nextcu(m.mod, cu, &unit_bias));)
        ForEachRange(cu, [&](Dwarf_Addr low, Dwarf_Addr high) { m.units->Add(low, high, cu); });
    }
    m.units->Finish();
  }
  *bias = m.dwarf_bias;
  if (Dwarf_Die* const* cudie = m.units->Find(addr - m.dwarf_bias)) return *cudie;
  // A unit without address attributes is only known from .debug_aranges.
  Dwarf_Die* cudie = dwfl_module_addrdie(m.mod, addr, bias);
  if (cudie != nullptr && !dwarf_hasattr(cudie, DW_AT_low_pc) && !dwarf_hasattr(cudie, DW_AT_ranges))
    return cudie;
  return nullptr;
}

// Fills funcs with the function scopes holding pc, innermost first, ending with the
// containing DW_TAG_subprogram.
void Symbolizer::Impl::FunctionScopes(Dwarf_Die* cudie, Dwarf_Addr pc,
                                      std::vector<Dwarf_Die>& funcs) {
  // No function of the unit holds pc (padding, hand-written assembly): the caller names it
  // from the symbol table. No dwarf_getscopes fallback, as it walks the whole unit.
  const Dwarf_Die* subprogram = Unit(cudie).Find(pc);
  if (subprogram == nullptr) return;
  auto fn = function_index.find(subprogram->addr);
  if (fn == function_index.end())
    fn = function_index.try_emplace(subprogram->addr, *subprogram).first;
  std::vector<Dwarf_Die> path{*subprogram};
  fn->second.Path(pc, path);
  for (auto d = path.rbegin(); d != path.rend(); ++d)
    if (IsFunctionScope(&*d)) funcs.push_back(*d);
}

void Symbolizer::Impl::Symbolize(Module& m, uint64_t addr, const Frame& base,
                                 std::vector<Frame>& out) {
  Dwarf_Addr bias = 0;
  std::vector<Dwarf_Die> funcs;  // innermost first, up to the containing subprogram
  const char* file = nullptr;
  int line = 0;
  if (Dwarf_Die* cudie = UnitDie(m, addr, &bias)) {
    Dwarf_Addr pc = addr - bias;
    FunctionScopes(cudie, pc, funcs);
    if (Dwarf_Line* l = dwarf_getsrc_die(cudie, pc)) {
      file = dwarf_linesrc(l, nullptr, nullptr);
      if (dwarf_lineno(l, &line) != 0) line = 0;
    }
  }

  Frame f = base;
  if (file != nullptr) f.file = File(file);
  f.line = line;
  if (funcs.empty()) {
    f.function = SymbolName(m, addr);
    out.push_back(std::move(f));
    return;
  }
  for (size_t i = 0; i < funcs.size(); ++i) {
    if (i > 0) {
      // The caller's position is the call site recorded on the inlined instance.
      f = base;
      Dwarf_Die* callee = &funcs[i - 1];
      Dwarf_Attribute attr;
      Dwarf_Word value = 0;
      Dwarf_Die cu;
      Dwarf_Files* table = nullptr;
      size_t count = 0;
      if (dwarf_formudata(dwarf_attr(callee, DW_AT_call_file, &attr), &value) == 0 &&
          dwarf_diecu(callee, &cu, nullptr, nullptr) != nullptr &&
          dwarf_getsrcfiles(&cu, &table, &count) == 0 && value < count) {
        if (const char* name = dwarf_filesrc(table, value, nullptr, nullptr))
          f.file = File(name);
      }
      if (dwarf_formudata(dwarf_attr(callee, DW_AT_call_line, &attr), &value) == 0)
        f.line = static_cast<int>(value);
    }
    const DieNameEntry& name = DieName(&funcs[i]);
    f.function = name.name;
    // The containing function's symbol has the parameters that DW_AT_name lacks.
    if (i + 1 == funcs.size() && !name.from_linkage_name)
      if (std::string symbol = SymbolName(m, addr); !symbol.empty()) f.function = symbol;
    f.inlined = i + 1 < funcs.size();
    out.push_back(std::move(f));
  }
}

std::vector<Frame> Symbolizer::Impl::Compute(uint64_t ip, bool return_address) {
  uint64_t addr = (return_address && ip > 0) ? ip - 1 : ip;
  Frame base;
  base.address = ip;
  const uint32_t* i = module_ranges.Find(addr);
  if (i == nullptr) return {base};
  Module& m = modules[*i];
  base.module = m.info.path;
  std::vector<Frame> frames;
  const uint64_t shared_key = (ip - m.info.base) << 1 | (return_address ? 1 : 0);
  if (m.shared != nullptr && SharedFrames::instance().find(m.shared, shared_key, ip, &frames)) return frames;
  if (!Open(m)) return {base};
  Symbolize(m, addr, base, frames);
  if (frames.empty()) frames.push_back(base);
  if (m.shared != nullptr) SharedFrames::instance().add(m.shared, shared_key, frames);
  return frames;
}

namespace {

// 3.11+ location table (Objects/locations.md): 6-bit varint chunks.
uint32_t location_varint(const uint8_t*& p, const uint8_t* end) {
  uint32_t value = 0;
  unsigned shift = 0;
  while (p < end) {
    const uint8_t b = *p++;
    if (shift < 32) value |= static_cast<uint32_t>(b & 63) << shift;
    shift += 6;
    if ((b & 64) == 0) break;
  }
  return value;
}

int location_svarint(const uint8_t*& p, const uint8_t* end) {
  const uint32_t v = location_varint(p, end);
  return (v & 1) ? -static_cast<int>(v >> 1) : static_cast<int>(v >> 1);
}

}  // namespace

int python_line(const PythonCode& code, uint32_t offset) {
  if (offset == format::kPythonOffsetUnknown) return code.first_line;
  const auto* p = reinterpret_cast<const uint8_t*>(code.line_table.data());
  const uint8_t* end = p + code.line_table.size();
  const uint64_t addr = offset;
  switch (static_cast<format::LineTableFormat>(code.table_format)) {
    case format::LineTableFormat::kLnotab: {
      // 3.9: (byte delta, signed line delta) pairs; the line of the last
      // pair that starts at or before the address.
      int line = code.first_line;
      uint64_t start = 0;
      for (; p + 1 < end; p += 2) {
        start += p[0];
        if (start > addr) break;
        line += static_cast<int8_t>(p[1]);
      }
      return line;
    }
    case format::LineTableFormat::kLinetable: {
      // 3.10: (byte length, signed line delta) ranges; -128: no line.
      int line = code.first_line;
      uint64_t start = 0;
      for (; p + 1 < end; p += 2) {
        const uint64_t stop = start + p[0];
        const int8_t delta = static_cast<int8_t>(p[1]);
        if (delta != -128) line += delta;
        if (addr >= start && addr < stop) return delta == -128 ? 0 : line;
        start = stop;
      }
      return 0;
    }
    case format::LineTableFormat::kLocations: {
      // 3.11+: entries of 1..8 code units, each led by a byte with bit 7 set:
      // code (bits 3..6) says how the line changes, bits 0..2 the length - 1.
      int line = code.first_line;
      uint64_t start = 0;
      while (p < end) {
        const uint8_t first = *p++;
        if ((first & 0x80) == 0) continue;  // damaged: resynchronise on the next entry
        const unsigned kind = (first >> 3) & 15;
        const uint64_t stop = start + 2 * ((first & 7) + 1);
        int delta = 0;
        if (kind == 13 || kind == 14) {  // no columns, long form
          delta = location_svarint(p, end);
        } else if (kind >= 10 && kind <= 12) {  // one-line forms
          delta = static_cast<int>(kind) - 10;
        }
        line += delta;
        if (addr >= start && addr < stop) return kind == 15 ? 0 : line;
        while (p < end && (*p & 0x80) == 0) ++p;  // the rest of this entry
        start = stop;
      }
      return 0;
    }
    case format::LineTableFormat::kNone:
      break;
  }
  return code.first_line;
}

Symbolizer::Symbolizer(std::vector<ModuleInfo> modules, SymbolizerOptions options)
    : impl_(std::make_unique<Impl>(std::move(modules), std::move(options))) {}

Symbolizer::~Symbolizer() = default;

Frame Symbolizer::Impl::ComputePython(uint64_t word) {
  Frame frame;
  frame.python = true;
  frame.attributed = format::is_attributed_python_frame(word);
  frame.module = python_module;
  const uint32_t id = format::python_code_id(word);
  const PythonCode* code = nullptr;
  if (python_codes != nullptr) {
    auto it = python_codes->find(id);
    if (it != python_codes->end()) code = &it->second;
  }
  if (code == nullptr) {
    Warn("some Python frames name code objects missing from the trace (damaged data): shown as ??");
    return frame;
  }
  frame.function = code->qualname;
  frame.file = code->filename;
  frame.line = python_line(*code, format::python_offset(word));
  return frame;
}

void Symbolizer::set_python(const std::map<uint32_t, PythonCode>* codes, std::string module) {
  impl_->python_codes = codes;
  impl_->python_module = std::move(module);
}

const std::vector<Frame>& Symbolizer::resolve(uint64_t ip, bool return_address) {
  Impl::Key key{ip, return_address};
  if (auto it = impl_->index.find(key); it != impl_->index.end())
    return impl_->results[it->second];
  if (impl_->python_codes != nullptr && format::is_python_frame(ip)) {
    impl_->results.push_back({impl_->ComputePython(ip)});
  } else {
    impl_->results.push_back(impl_->Compute(ip, return_address));
  }
  impl_->index.emplace(key, static_cast<uint32_t>(impl_->results.size() - 1));
  return impl_->results.back();
}

const std::vector<std::string>& Symbolizer::warnings() const { return impl_->warnings; }

}  // namespace memledger::report
