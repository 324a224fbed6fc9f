#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "symbolizer.h"

namespace fs = std::filesystem;
using memledger::report::Frame;
using memledger::report::ModuleInfo;
using memledger::report::Symbolizer;
using memledger::report::SymbolizerOptions;

namespace {

// ---- test targets: their lines are checked, keep each call on the line of its __LINE__ ----

[[gnu::noinline]] void* CaptureReturnAddress() {
  void* ra = __builtin_return_address(0);
  asm volatile("" ::: "memory");
  return ra;
}

constexpr int kTargetLine = __LINE__ + 1;
[[gnu::noinline]] void* SymbolizerTestTarget(int* call_line) {
  *call_line = __LINE__; void* volatile ra = CaptureReturnAddress();
  return ra;
}

[[gnu::always_inline]] inline void* InlinedHelper(int* inner_line) {
  *inner_line = __LINE__; void* volatile ra = CaptureReturnAddress();
  return ra;
}

[[gnu::noinline]] void* InlineOuter(int* inner_line, int* outer_line) {
  *outer_line = __LINE__; void* volatile ra = InlinedHelper(inner_line);
  return ra;
}

// ---- the module map, recorded the way the interposer does it ----

std::string BuildIdOf(const dl_phdr_info* info) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const auto* p = reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph.p_vaddr);
    const unsigned char* end = p + ph.p_memsz;
    size_t align = ph.p_align > 4 ? ph.p_align : 4;
    auto up = [align](size_t n) { return (n + align - 1) & ~(align - 1); };
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const unsigned char* name = p + sizeof(ElfW(Nhdr));
      const unsigned char* desc = name + up(note->n_namesz);
      if (desc + note->n_descsz > end) break;
      if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 &&
          std::memcmp(name, "GNU", 4) == 0) {
        std::string hex;
        for (size_t j = 0; j < note->n_descsz; ++j) {
          char b[3];
          std::snprintf(b, sizeof b, "%02x", desc[j]);
          hex += b;
        }
        return hex;
      }
      p = desc + up(note->n_descsz);
    }
  }
  return {};
}

struct Search {
  uintptr_t address;
  ModuleInfo found;
  bool ok = false;
};

int FindModule(dl_phdr_info* info, size_t, void* data) {
  auto* s = static_cast<Search*>(data);
  bool contains = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    uintptr_t begin = info->dlpi_addr + ph.p_vaddr;
    if (s->address >= begin && s->address < begin + ph.p_memsz) contains = true;
  }
  if (!contains) return 0;
  ModuleInfo& m = s->found;
  m.base = info->dlpi_addr;
  m.path = info->dlpi_name != nullptr ? info->dlpi_name : "";
  if (m.path.empty()) m.path = fs::read_symlink("/proc/self/exe").string();
  m.build_id = BuildIdOf(info);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD) m.segments.emplace_back(ph.p_vaddr, ph.p_memsz);
  }
  s->ok = true;
  return 1;
}

ModuleInfo ModuleContaining(const void* address) {
  Search s{reinterpret_cast<uintptr_t>(address), {}};
  dl_iterate_phdr(FindModule, &s);
  REQUIRE(s.ok);
  return s.found;
}

const void* Address(void* (*f)(int*)) { return reinterpret_cast<const void*>(f); }
uint64_t Ip(const void* p) { return reinterpret_cast<uint64_t>(p); }

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool AnyWarningContains(const Symbolizer& s, const std::string& text) {
  for (const std::string& w : s.warnings())
    if (w.find(text) != std::string::npos) return true;
  return false;
}

// A fresh folder under the temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "memledger-symbolizer-XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("Symbolizer resolves a function of the running program") {
  int call_line = 0;
  const void* ra = SymbolizerTestTarget(&call_line);
  ModuleInfo self = ModuleContaining(Address(SymbolizerTestTarget));
  REQUIRE_FALSE(self.build_id.empty());
  Symbolizer symbolizer({self});

  SECTION("the entry address gives the definition line") {
    const std::vector<Frame>& frames = symbolizer.resolve(Ip(Address(SymbolizerTestTarget)), false);
    REQUIRE(frames.size() == 1);
    CHECK_THAT(frames[0].function, Catch::Contains("SymbolizerTestTarget"));
    CHECK(EndsWith(frames[0].file, "symbolizer_test.cpp"));
    CHECK(frames[0].line >= kTargetLine);
    CHECK(frames[0].line <= kTargetLine + 1);
    CHECK(frames[0].module == self.path);
    CHECK_FALSE(frames[0].inlined);
  }
  SECTION("a return address gives the line of the call") {
    const std::vector<Frame>& frames = symbolizer.resolve(Ip(ra), true);
    REQUIRE(frames.size() == 1);
    CHECK(frames[0].address == Ip(ra));
    CHECK_THAT(frames[0].function, Catch::Contains("SymbolizerTestTarget"));
    CHECK(EndsWith(frames[0].file, "symbolizer_test.cpp"));
    CHECK(frames[0].line == call_line);
    CHECK(frames[0].file.find("/../") == std::string::npos);
  }
  SECTION("results are cached and stay valid") {
    const std::vector<Frame>* first = &symbolizer.resolve(Ip(ra), true);
    for (uint64_t i = 0; i < 1000; ++i) symbolizer.resolve(Ip(ra) + i, false);
    CHECK(first == &symbolizer.resolve(Ip(ra), true));
    CHECK((*first)[0].line == call_line);
  }
  CHECK(symbolizer.warnings().empty());
}

TEST_CASE("Symbolizer returns the inline chain innermost first") {
  int inner_line = 0;
  int outer_line = 0;
  const void* ra = InlineOuter(&inner_line, &outer_line);
  Symbolizer symbolizer({ModuleContaining(ra)});
  const std::vector<Frame>& frames = symbolizer.resolve(Ip(ra), true);
  REQUIRE(frames.size() == 2);
  CHECK_THAT(frames[0].function, Catch::Contains("InlinedHelper"));
  CHECK(frames[0].inlined);
  CHECK(frames[0].line == inner_line);
  CHECK(EndsWith(frames[0].file, "symbolizer_test.cpp"));
  CHECK_THAT(frames[1].function, Catch::Contains("InlineOuter"));
  CHECK_FALSE(frames[1].inlined);
  CHECK(frames[1].line == outer_line);
  CHECK(EndsWith(frames[1].file, "symbolizer_test.cpp"));
  CHECK(frames[0].address == Ip(ra));
  CHECK(frames[1].address == Ip(ra));
}

TEST_CASE("Symbolizer names functions of a shared library from its symbol table") {
  // From libc itself: &getpid in a non-PIE program is the program's PLT entry.
  void* libc_handle = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(libc_handle != nullptr);
  const void* f = dlsym(libc_handle, "getpid");
  dlclose(libc_handle);
  REQUIRE(f != nullptr);
  ModuleInfo libc = ModuleContaining(f);
  Symbolizer symbolizer({libc});
  const std::vector<Frame>& frames = symbolizer.resolve(Ip(f), false);
  REQUIRE_FALSE(frames.empty());
  CHECK_THAT(frames.back().function, Catch::Contains("getpid"));
  CHECK(frames.back().module == libc.path);
}

TEST_CASE("Symbolizer leaves an address outside all modules unknown") {
  Symbolizer symbolizer({ModuleContaining(Address(SymbolizerTestTarget))});
  for (uint64_t ip : {uint64_t{0}, uint64_t{1}, uint64_t{0x10}, ~uint64_t{0}}) {
    const std::vector<Frame>& frames = symbolizer.resolve(ip, true);
    REQUIRE(frames.size() == 1);
    CHECK(frames[0].address == ip);
    CHECK(frames[0].module.empty());
    CHECK(frames[0].function.empty());
    CHECK(frames[0].line == 0);
  }
  Symbolizer empty({});
  CHECK(empty.resolve(Ip(Address(SymbolizerTestTarget)), false).size() == 1);
}

TEST_CASE("Symbolizer keeps the module of a missing file and warns once") {
  ModuleInfo missing{0x100000, "/nonexistent/libmissing.so", "", {{0, 0x2000}}};
  Symbolizer symbolizer({missing});
  for (int i = 0; i < 3; ++i) {
    const std::vector<Frame>& frames = symbolizer.resolve(0x100010 + i, true);
    REQUIRE(frames.size() == 1);
    CHECK(frames[0].module == missing.path);
    CHECK(frames[0].function.empty());
  }
  REQUIRE(symbolizer.warnings().size() == 1);
  CHECK_THAT(symbolizer.warnings()[0], Catch::Contains("/nonexistent/libmissing.so"));
}

TEST_CASE("Symbolizer refuses a file whose build id differs from the recorded one") {
  int call_line = 0;
  const void* ra = SymbolizerTestTarget(&call_line);
  ModuleInfo self = ModuleContaining(ra);
  std::string real_id = self.build_id;
  self.build_id = "00112233445566778899aabbccddeeff00112233";
  Symbolizer symbolizer({self});
  const std::vector<Frame>& frames = symbolizer.resolve(Ip(ra), true);
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].module == self.path);
  CHECK(frames[0].function.empty());
  CHECK(frames[0].line == 0);
  REQUIRE(symbolizer.warnings().size() == 1);
  CHECK_THAT(symbolizer.warnings()[0], Catch::Contains("build id mismatch"));
  CHECK_THAT(symbolizer.warnings()[0], Catch::Contains(self.build_id));
  CHECK_THAT(symbolizer.warnings()[0], Catch::Contains(real_id));
}

TEST_CASE("Symbolizer finds a moved binary in the debug folders") {
  int call_line = 0;
  const void* ra = SymbolizerTestTarget(&call_line);
  ModuleInfo self = ModuleContaining(ra);
  TempDir dir;
  std::string original = self.path;
  self.path = "/nonexistent/" + fs::path(original).filename().string();

  SECTION("by build id") {
    fs::path by_id = dir.path / ".build-id" / self.build_id.substr(0, 2) /
                     (self.build_id.substr(2) + ".debug");
    fs::create_directories(by_id.parent_path());
    fs::copy_file(original, by_id);
  }
  SECTION("by name") { fs::copy_file(original, dir.path / fs::path(original).filename()); }

  SymbolizerOptions options;
  options.debug_dirs = {dir.path.string()};
  Symbolizer symbolizer({self}, options);
  const std::vector<Frame>& frames = symbolizer.resolve(Ip(ra), true);
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].module == self.path);
  CHECK_THAT(frames[0].function, Catch::Contains("SymbolizerTestTarget"));
  CHECK(frames[0].line == call_line);
  CHECK(symbolizer.warnings().empty());
}

TEST_CASE("Symbolizer survives non-ELF and truncated files") {
  int call_line = 0;
  const void* ra = SymbolizerTestTarget(&call_line);
  ModuleInfo self = ModuleContaining(ra);
  TempDir dir;
  std::string image = ReadFile(self.path);
  REQUIRE(image.size() > 4096);

  std::vector<ModuleInfo> modules;
  auto add = [&](const std::string& name, const std::string& bytes, const std::string& id) {
    fs::path p = dir.path / name;
    WriteFile(p, bytes);
    ModuleInfo m = self;
    m.path = p.string();
    m.build_id = id;
    // Each file gets its own address range, laid out like the real module.
    m.base = self.base + (modules.size() + 1) * (uint64_t{1} << 32);
    modules.push_back(m);
  };
  add("not-elf.so", "this is not an ELF file\n", "");
  add("empty.so", "", "");
  add("header-only.so", image.substr(0, 64), "");
  add("page.so", image.substr(0, 4096), self.build_id);
  add("half.so", image.substr(0, image.size() / 2), "");
  add("almost.so", image.substr(0, image.size() - 100), "");
  add("directory", "", "");
  fs::remove(dir.path / "directory");
  fs::create_directory(dir.path / "directory");

  Symbolizer symbolizer(modules);
  uint64_t offset = Ip(ra) - self.base;
  for (const ModuleInfo& m : modules) {
    const std::vector<Frame>* frames = nullptr;
    REQUIRE_NOTHROW(frames = &symbolizer.resolve(m.base + offset, true));
    REQUIRE_FALSE(frames->empty());
    CHECK(frames->back().module == m.path);
  }
  CHECK(AnyWarningContains(symbolizer, "not-elf.so"));
  CHECK(AnyWarningContains(symbolizer, "empty.so"));
  CHECK(AnyWarningContains(symbolizer, "directory"));
}
