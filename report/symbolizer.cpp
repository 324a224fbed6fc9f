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
#include <optional>
#include <string_view>

#include <absl/container/flat_hash_map.h>

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

bool IsRegularFile(const std::string& path, int* error) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    *error = errno;
    return false;
  }
  if (!S_ISREG(st.st_mode)) {
    *error = EISDIR;
    return false;
  }
  return true;
}

bool IsFunctionScope(Dwarf_Die* die) {
  int tag = dwarf_tag(die);
  return tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine ||
         tag == DW_TAG_entry_point;
}

// DIEs that can hold, or lead to, code addresses (as heaptrack's dwarfdiecache.cpp has it).
bool MayHoldCode(int tag) {
  switch (tag) {
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

// The blocks and inlined instances of one function with their pc ranges, in DIE-tree
// order, so that a pc is placed by comparing integers instead of decoding DIEs (a
// function can hold thousands of inlined instances).
struct FunctionIndex {
  struct Scope {
    Dwarf_Die die;
    uint32_t depth;  // 1 = direct child of the function
    uint32_t first_range;
    uint32_t range_count;
  };
  std::vector<Scope> scopes;
  std::vector<std::pair<Dwarf_Addr, Dwarf_Addr>> ranges;  // [low, high)

  void Add(Dwarf_Die* parent, uint32_t depth) {
    if (depth > 256) return;  // hostile input
    Dwarf_Die child;
    if (dwarf_child(parent, &child) != 0) return;
    for (;;) {
      if (IsInnerScope(dwarf_tag(&child))) {
        Scope scope{child, depth, static_cast<uint32_t>(ranges.size()), 0};
        Dwarf_Addr base = 0, low = 0, high = 0;
        ptrdiff_t offset = 0;
        while ((offset = dwarf_ranges(&child, offset, &base, &low, &high)) > 0) {
          if (high <= low) continue;
          ranges.emplace_back(low, high);
          ++scope.range_count;
        }
        // A scope without code holds none below it either (same as dwarf_getscopes).
        if (scope.range_count > 0) {
          scopes.push_back(scope);
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
      const auto& [low, high] = ranges[scope.first_range + i];
      if (pc >= low && pc < high) return true;
    }
    return false;
  }

  // Appends the scopes holding pc, outermost first: at each level the first child that
  // holds pc, then its children.
  void Path(Dwarf_Addr pc, std::vector<Dwarf_Die>& out) const {
    uint32_t want = 1;
    for (const Scope& scope : scopes) {
      if (scope.depth < want) break;  // left the subtree of the last scope taken
      if (scope.depth == want && Contains(scope, pc)) {
        out.push_back(scope.die);
        ++want;
      }
    }
  }
};

// The function symbols of one module by address. dwfl_module_addrinfo scans the whole
// symbol table on each call, far too slow for modules without DWARF (libc, vendor
// libraries), where every frame is named from here.
struct SymbolIndex {
  struct Symbol {
    GElf_Addr start;
    GElf_Addr end;  // == start for a symbol without size
    int rank;       // among equal starts the highest wins: global > weak > local
    const char* name;
  };
  std::vector<Symbol> symbols;  // sorted by (start, rank)
  std::vector<GElf_Addr> max_end;

  void Build(Dwfl_Module* mod) {
    int n = dwfl_module_getsymtab(mod);
    for (int i = 1; i < n; ++i) {
      GElf_Sym sym;
      GElf_Addr addr = 0;
      GElf_Word shndx = 0;
      const char* name = dwfl_module_getsym_info(mod, i, &sym, &addr, &shndx, nullptr, nullptr);
      if (name == nullptr || name[0] == '\0' || sym.st_shndx == SHN_UNDEF ||
          shndx == static_cast<GElf_Word>(-1))
        continue;
      int type = GELF_ST_TYPE(sym.st_info);
      if (type != STT_FUNC && type != STT_GNU_IFUNC) continue;
      int bind = GELF_ST_BIND(sym.st_info);
      int rank = bind == STB_GLOBAL ? 2 : bind == STB_WEAK ? 1 : 0;
      symbols.push_back({addr, addr + sym.st_size, rank, name});
    }
    std::sort(symbols.begin(), symbols.end(), [](const Symbol& a, const Symbol& b) {
      return a.start != b.start ? a.start < b.start : a.rank < b.rank;
    });
    max_end.resize(symbols.size());
    GElf_Addr m = 0;
    for (size_t i = 0; i < symbols.size(); ++i) max_end[i] = m = std::max(m, symbols[i].end);
  }

  // The latest starting symbol that covers addr; else a sizeless symbol right before it.
  const char* Find(GElf_Addr addr) const {
    auto it = std::upper_bound(symbols.begin(), symbols.end(), addr,
                               [](GElf_Addr a, const Symbol& s) { return a < s.start; });
    if (it == symbols.begin()) return nullptr;
    auto last = it - symbols.begin() - 1;
    for (auto i = last; i >= 0 && max_end[i] > addr; --i)
      if (addr < symbols[i].end) return symbols[i].name;
    return symbols[last].start == symbols[last].end ? symbols[last].name : nullptr;
  }
};

struct Range {
  uint64_t start;
  uint64_t end;  // exclusive
  uint32_t module;
};

// The concrete functions of one compilation unit by address. dwarf_getscopes walks the
// whole unit on every call (every declaration of namespace std included: milliseconds
// per address in a C++ unit); this index is built once per unit and searched.
struct CuIndex {
  struct Entry {
    Dwarf_Addr low;
    Dwarf_Addr high;  // exclusive
    Dwarf_Die die;
  };
  std::vector<Entry> entries;  // sorted by low
  std::vector<Dwarf_Addr> max_high;

  void Add(Dwarf_Die* die, int depth) {
    if (depth > 64) return;  // hostile input
    Dwarf_Die child;
    if (dwarf_child(die, &child) != 0) return;
    for (;;) {
      int tag = dwarf_tag(&child);
      if (tag == DW_TAG_subprogram) {
        Dwarf_Addr base = 0, low = 0, high = 0;
        ptrdiff_t offset = 0;
        while ((offset = dwarf_ranges(&child, offset, &base, &low, &high)) > 0)
          if (high > low) entries.push_back({low, high, child});
      } else if (MayHoldCode(tag)) {
        Add(&child, depth + 1);
      }
      Dwarf_Die next;
      if (dwarf_siblingof(&child, &next) != 0) break;
      child = next;
    }
  }

  void Build(Dwarf_Die* cudie) {
    Dwarf_Die root = *cudie;
    uint8_t unit_type = 0;
    Dwarf_Die subdie;
    // Split DWARF: the functions are in the split unit, not the skeleton.
    if (dwarf_cu_info(cudie->cu, nullptr, &unit_type, nullptr, &subdie, nullptr, nullptr,
                      nullptr) == 0 &&
        unit_type == DW_UT_skeleton && dwarf_tag(&subdie) != DW_TAG_invalid)
      root = subdie;
    Add(&root, 0);
    std::sort(entries.begin(), entries.end(),
              [](const Entry& a, const Entry& b) { return a.low < b.low; });
    max_high.resize(entries.size());
    Dwarf_Addr m = 0;
    for (size_t i = 0; i < entries.size(); ++i) max_high[i] = m = std::max(m, entries[i].high);
  }

  // The innermost (latest starting) function containing pc.
  const Dwarf_Die* Find(Dwarf_Addr pc) const {
    auto it = std::upper_bound(entries.begin(), entries.end(), pc,
                               [](Dwarf_Addr a, const Entry& e) { return a < e.low; });
    for (auto i = it - entries.begin() - 1; i >= 0 && max_high[i] > pc; --i)
      if (pc < entries[i].high) return &entries[i].die;
    return nullptr;
  }
};

}  // namespace

struct Symbolizer::Impl {
  enum class State : uint8_t { kUnopened, kReady, kFailed };

  struct Module {
    ModuleInfo info;
    State state = State::kUnopened;
    Dwfl* dwfl = nullptr;
    Dwfl_Module* mod = nullptr;
    std::unique_ptr<SymbolIndex> symbols;  // built on the first frame DWARF cannot name
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
  std::vector<std::string> debug_dirs;  // absolute, user folders first, then kSystemDebugDir
  size_t user_debug_dirs = 0;
  std::string debuginfo_path;
  char* debuginfo_path_ptr = nullptr;
  Dwfl_Callbacks callbacks{};

  std::vector<Range> ranges;         // sorted by start
  std::vector<uint64_t> max_end;     // max_end[i] = max(ranges[0..i].end)
  absl::flat_hash_map<Key, uint32_t> index;
  std::deque<std::vector<Frame>> results;  // deque: references stay valid on growth
  absl::flat_hash_map<const void*, CuIndex> cu_index;  // key: the unit DIE's data
  absl::flat_hash_map<const void*, FunctionIndex> function_index;  // key: the DIE's data
  absl::flat_hash_map<const void*, std::string> die_names;         // key: the DIE's data
  absl::flat_hash_map<const char*, std::string> names;  // libdw strings -> demangled
  absl::flat_hash_map<const char*, std::string> files;  // libdw strings -> normalized
  std::vector<std::string> warnings;

  Impl(std::vector<ModuleInfo> infos, SymbolizerOptions options);
  ~Impl();

  void Warn(std::string message);
  void AddRanges(uint32_t i);
  int FindModule(uint64_t addr) const;
  bool Open(Module& m);
  bool TryOpen(Module& m, const std::string& file, std::string* problem);
  std::vector<std::string> Candidates(const ModuleInfo& info) const;
  std::vector<Frame> Compute(uint64_t ip, bool return_address);
  void Symbolize(Module& m, uint64_t addr, const Frame& base, std::vector<Frame>& out);
  void FunctionScopes(Dwarf_Die* cudie, Dwarf_Addr pc, std::vector<Dwarf_Die>& funcs);
  const std::string& Name(const char* raw);
  const std::string& File(const char* raw);
  const std::string& DieName(Dwarf_Die* die);
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

  // "" = the file's own folder, ".debug" = its .debug subfolder, absolute folders get both
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
    // Without recorded segments the extent is only known from the file.
    if (modules[i].info.segments.empty()) Open(modules[i]);
    AddRanges(i);
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.start != b.start ? a.start < b.start : a.module < b.module;
  });
  max_end.resize(ranges.size());
  uint64_t m = 0;
  for (size_t i = 0; i < ranges.size(); ++i) max_end[i] = m = std::max(m, ranges[i].end);
}

Symbolizer::Impl::~Impl() {
  for (Module& m : modules)
    if (m.dwfl != nullptr) dwfl_end(m.dwfl);
}

void Symbolizer::Impl::Warn(std::string message) {
  if (std::find(warnings.begin(), warnings.end(), message) == warnings.end())
    warnings.push_back(std::move(message));
}

void Symbolizer::Impl::AddRanges(uint32_t i) {
  const Module& m = modules[i];
  for (const auto& [vaddr, memsz] : m.info.segments) {
    uint64_t start = m.info.base + vaddr;
    uint64_t end = start + memsz;
    if (memsz == 0 || end < start) continue;  // empty or wrapping: bogus input
    ranges.push_back({start, end, i});
  }
  if (m.info.segments.empty() && m.state == State::kReady) {
    Dwarf_Addr low = 0, high = 0;
    dwfl_module_info(m.mod, nullptr, &low, &high, nullptr, nullptr, nullptr, nullptr);
    if (high > low) ranges.push_back({low, high, i});
  }
}

// Ranges may overlap when the recorded map is odd (a library unloaded and another
// loaded at its address); the module recorded last wins.
int Symbolizer::Impl::FindModule(uint64_t addr) const {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), addr,
                             [](uint64_t a, const Range& r) { return a < r.start; });
  int best = -1;
  for (auto i = it - ranges.begin() - 1; i >= 0 && max_end[i] > addr; --i) {
    const Range& r = ranges[i];
    if (addr < r.end && static_cast<int>(r.module) > best) best = static_cast<int>(r.module);
  }
  return best;
}

std::vector<std::string> Symbolizer::Impl::Candidates(const ModuleInfo& info) const {
  std::vector<std::string> out;
  if (!info.path.empty()) out.push_back(info.path);
  const std::string& id = info.build_id;
  std::string base_name = std::filesystem::path(info.path).filename().string();
  for (size_t d = 0; d < debug_dirs.size(); ++d) {
    const std::string& dir = debug_dirs[d];
    // Files found by name alone are taken on trust only from folders the user named.
    if (id.empty() && d >= user_debug_dirs) continue;
    if (id.size() > 2) {
      std::string by_id = dir + "/.build-id/" + id.substr(0, 2) + "/" + id.substr(2);
      out.push_back(by_id + ".debug");
      out.push_back(by_id);
    }
    if (!info.path.empty() && info.path.front() == '/') {
      out.push_back(dir + info.path);
      if (!id.empty()) out.push_back(dir + info.path + ".debug");
    }
    if (!base_name.empty() && d < user_debug_dirs) out.push_back(dir + "/" + base_name);
  }
  return out;
}

bool Symbolizer::Impl::TryOpen(Module& m, const std::string& file, std::string* problem) {
  int error = 0;
  if (!IsRegularFile(file, &error)) {
    if (problem->empty())
      *problem = "cannot open " + file + ": " + std::strerror(error);
    return false;
  }
  Dwfl* dwfl = dwfl_begin(&callbacks);
  if (dwfl == nullptr) {
    if (problem->empty()) *problem = std::string("libdwfl: ") + dwfl_errmsg(-1);
    return false;
  }
  dwfl_report_begin(dwfl);
  const char* name = m.info.path.empty() ? "[unnamed]" : m.info.path.c_str();
  // add_p_vaddr = true: the module's bias is exactly `base`, as dlpi_addr is (libdwfl
  // otherwise places the first PT_LOAD at `base`).
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
    char buf[32];
    std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(m.info.base));
    problem = std::string("module loaded at 0x") + buf + " has no path" +
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

const std::string& Symbolizer::Impl::DieName(Dwarf_Die* die) {
  auto [it, inserted] = die_names.try_emplace(die->addr);
  if (!inserted) return it->second;
  Dwarf_Attribute attr;
  // dwarf_attr_integrate follows DW_AT_abstract_origin and DW_AT_specification, which is
  // where inlined instances and member function definitions keep their names.
  const char* name = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_linkage_name, &attr));
  if (name == nullptr)
    name = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr));
  if (name == nullptr) name = dwarf_formstring(dwarf_attr_integrate(die, DW_AT_name, &attr));
  if (name != nullptr) it->second = Name(name);
  return it->second;
}

std::string Symbolizer::Impl::SymbolName(Module& m, uint64_t addr) {
  if (m.symbols == nullptr) {
    m.symbols = std::make_unique<SymbolIndex>();
    m.symbols->Build(m.mod);
  }
  const char* name = m.symbols->Find(addr);
  return name != nullptr ? Name(name) : std::string();
}

// Fills funcs with the function scopes containing pc, innermost first, ending with the
// containing DW_TAG_subprogram.
void Symbolizer::Impl::FunctionScopes(Dwarf_Die* cudie, Dwarf_Addr pc,
                                      std::vector<Dwarf_Die>& funcs) {
  auto [it, inserted] = cu_index.try_emplace(cudie->addr);
  if (inserted) it->second.Build(cudie);
  if (const Dwarf_Die* subprogram = it->second.Find(pc)) {
    auto [fn, fn_inserted] = function_index.try_emplace(subprogram->addr);
    if (fn_inserted) {
      Dwarf_Die die = *subprogram;
      fn->second.Add(&die, 1);
    }
    std::vector<Dwarf_Die> path{*subprogram};
    fn->second.Path(pc, path);
    for (auto d = path.rbegin(); d != path.rend(); ++d)
      if (IsFunctionScope(&*d)) funcs.push_back(*d);
    return;
  }

  // Not in the index (code outside any DW_TAG_subprogram we know): ask libdw.
  Dwarf_Die* scopes = nullptr;
  int n = dwarf_getscopes(cudie, pc, &scopes);
  if (n > 0) {
    bool inlined = false;
    for (int i = 0; i < n && !inlined; ++i)
      inlined = dwarf_tag(&scopes[i]) == DW_TAG_inlined_subroutine;
    if (inlined) {
      // dwarf_getscopes continues past the innermost inlined instance with the scopes of
      // its abstract definition; the concrete chain of callers (what eu-addr2line -i
      // prints) comes from the DIE tree above that instance.
      Dwarf_Die innermost = scopes[0];
      std::free(scopes);
      scopes = nullptr;
      n = dwarf_getscopes_die(&innermost, &scopes);
    }
    for (int i = 0; i < n; ++i) {
      if (!IsFunctionScope(&scopes[i])) continue;
      funcs.push_back(scopes[i]);
      if (dwarf_tag(&scopes[i]) == DW_TAG_subprogram) break;
    }
  }
  std::free(scopes);
}

void Symbolizer::Impl::Symbolize(Module& m, uint64_t addr, const Frame& base,
                                 std::vector<Frame>& out) {
  Dwarf_Addr bias = 0;
  Dwarf_Die* cudie = dwfl_module_addrdie(m.mod, addr, &bias);
  std::vector<Dwarf_Die> funcs;  // innermost first, up to the containing subprogram
  const char* file = nullptr;
  int line = 0;
  if (cudie != nullptr) {
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
    f.function = DieName(&funcs[i]);
    if (f.function.empty() && i + 1 == funcs.size()) f.function = SymbolName(m, addr);
    f.inlined = i + 1 < funcs.size();
    out.push_back(std::move(f));
  }
}

std::vector<Frame> Symbolizer::Impl::Compute(uint64_t ip, bool return_address) {
  uint64_t addr = (return_address && ip > 0) ? ip - 1 : ip;
  Frame base;
  base.address = ip;
  int i = FindModule(addr);
  if (i < 0) return {base};
  Module& m = modules[static_cast<size_t>(i)];
  base.module = m.info.path;
  if (!Open(m)) return {base};
  std::vector<Frame> frames;
  Symbolize(m, addr, base, frames);
  if (frames.empty()) frames.push_back(base);
  return frames;
}

Symbolizer::Symbolizer(std::vector<ModuleInfo> modules, SymbolizerOptions options)
    : impl_(std::make_unique<Impl>(std::move(modules), std::move(options))) {}

Symbolizer::~Symbolizer() = default;

const std::vector<Frame>& Symbolizer::resolve(uint64_t ip, bool return_address) {
  Impl::Key key{ip, return_address};
  if (auto it = impl_->index.find(key); it != impl_->index.end())
    return impl_->results[it->second];
  impl_->results.push_back(impl_->Compute(ip, return_address));
  impl_->index.emplace(key, static_cast<uint32_t>(impl_->results.size() - 1));
  return impl_->results.back();
}

const std::vector<std::string>& Symbolizer::warnings() const { return impl_->warnings; }

}  // namespace memledger::report
