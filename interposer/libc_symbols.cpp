#include "libc_symbols.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstring>

namespace memledger::interposer {
namespace {

struct Lookup {
  const char* name;
  void* result = nullptr;
  uintptr_t skip_base = 0;  // 0: libc only; else every object but the one loaded here
};

// Number of symbols covered by a GNU hash table: past the highest bucket's
// chain end.
uint32_t gnu_hash_symbol_count(const uint32_t* table) {
  const uint32_t nbuckets = table[0];
  const uint32_t symoffset = table[1];
  const uint32_t bloom_size = table[2];
  const uint32_t* buckets = table + 4 + bloom_size * (sizeof(ElfW(Addr)) / 4);
  const uint32_t* chain = buckets + nbuckets;
  uint32_t last = 0;
  for (uint32_t i = 0; i < nbuckets; ++i) last = buckets[i] > last ? buckets[i] : last;
  if (last < symoffset) return symoffset;
  while ((chain[last - symoffset] & 1) == 0) ++last;
  return last + 1;
}

int scan(dl_phdr_info* info, size_t, void* data) {
  auto* lookup = static_cast<Lookup*>(data);
  const char* name = info->dlpi_name;
  if (lookup->skip_base == 0) {
    if (name == nullptr || strstr(name, "/libc.so") == nullptr) return 0;
  } else if (info->dlpi_addr == lookup->skip_base || info->dlpi_phnum == 0 ||
             (name != nullptr && strstr(name, "linux-vdso") != nullptr)) {
    // The vDSO's dynamic section is not relocated, and it defines no allocator.
    return 0;
  }
  const ElfW(Dyn)* dyn = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) {
      dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    }
  }
  if (dyn == nullptr) return 0;
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const ElfW(Versym)* versym = nullptr;
  const uint32_t* gnu_hash = nullptr;
  const uint32_t* sysv_hash = nullptr;
  // The loader has relocated these d_ptr values to addresses already.
  for (; dyn->d_tag != DT_NULL; ++dyn) {
    switch (dyn->d_tag) {
      case DT_SYMTAB: symtab = reinterpret_cast<const ElfW(Sym)*>(dyn->d_un.d_ptr); break;
      case DT_STRTAB: strtab = reinterpret_cast<const char*>(dyn->d_un.d_ptr); break;
      case DT_VERSYM: versym = reinterpret_cast<const ElfW(Versym)*>(dyn->d_un.d_ptr); break;
      case DT_GNU_HASH: gnu_hash = reinterpret_cast<const uint32_t*>(dyn->d_un.d_ptr); break;
      case DT_HASH: sysv_hash = reinterpret_cast<const uint32_t*>(dyn->d_un.d_ptr); break;
    }
  }
  if (symtab == nullptr || strtab == nullptr) return 0;
  // An object whose tables the loader left unrelocated (below its load address).
  if (info->dlpi_addr != 0 && reinterpret_cast<uintptr_t>(symtab) < info->dlpi_addr) return 0;
  auto defines = [&](uint32_t i) {
    const ElfW(Sym)& sym = symtab[i];
    if (sym.st_shndx == SHN_UNDEF || ELF64_ST_TYPE(sym.st_info) != STT_FUNC) return false;
    if (versym != nullptr && (versym[i] & 0x8000) != 0) return false;  // a hidden (non-default) version
    if (strcmp(strtab + sym.st_name, lookup->name) != 0) return false;
    lookup->result = reinterpret_cast<void*>(info->dlpi_addr + sym.st_value);
    return true;
  };
  const int not_here = lookup->skip_base == 0 ? 1 : 0;
  if (gnu_hash != nullptr) {
    // The GNU hash table: big objects (libtorch) define 10^5 symbols.
    const uint32_t nbuckets = gnu_hash[0], symoffset = gnu_hash[1], bloom_size = gnu_hash[2],
                   bloom_shift = gnu_hash[3];
    const auto* bloom = reinterpret_cast<const ElfW(Addr)*>(gnu_hash + 4);
    const uint32_t* buckets = reinterpret_cast<const uint32_t*>(bloom + bloom_size);
    const uint32_t* chain = buckets + nbuckets;
    uint32_t h = 5381;
    for (const char* c = lookup->name; *c; ++c) h = h * 33 + static_cast<uint8_t>(*c);
    constexpr uint32_t kBits = sizeof(ElfW(Addr)) * 8;
    const ElfW(Addr) word = bloom[(h / kBits) % bloom_size];
    const ElfW(Addr) mask = (ElfW(Addr){1} << (h % kBits)) | (ElfW(Addr){1} << ((h >> bloom_shift) % kBits));
    if (nbuckets == 0 || (word & mask) != mask) return not_here;
    uint32_t i = buckets[h % nbuckets];
    if (i < symoffset) return not_here;
    for (;; ++i) {
      const uint32_t h2 = chain[i - symoffset];
      if ((h | 1) == (h2 | 1) && defines(i)) return 1;
      if (h2 & 1) break;
    }
    return not_here;
  }
  uint32_t count = 0;
  if (sysv_hash != nullptr) {
    count = sysv_hash[1];
  } else if (gnu_hash != nullptr) {
    count = gnu_hash_symbol_count(gnu_hash);
  }
  for (uint32_t i = 0; i < count; ++i) {
    if (defines(i)) return 1;
  }
  return not_here;
}

void* find(const char* name, uintptr_t skip_base = 0) {
  Lookup lookup{name, nullptr, skip_base};
  dl_iterate_phdr(scan, &lookup);
  return lookup.result;
}

std::atomic<void*> g_dlsym{nullptr};
std::atomic<void*> g_dlvsym{nullptr};

}  // namespace

void* libc_dlsym_address() {
  void* p = g_dlsym.load(std::memory_order_acquire);
  if (p == nullptr) {
    p = find("dlsym");
    g_dlsym.store(p, std::memory_order_release);
  }
  return p;
}

void* libc_dlvsym_address() {
  void* p = g_dlvsym.load(std::memory_order_acquire);
  if (p == nullptr) {
    p = find("dlvsym");
    g_dlvsym.store(p, std::memory_order_release);
  }
  return p;
}

void* libc_dlsym(void* handle, const char* name) {
  using Fn = void* (*)(void*, const char*);
  auto fn = reinterpret_cast<Fn>(libc_dlsym_address());
  return fn != nullptr ? fn(handle, name) : nullptr;
}

void* libc_dlsym_quiet(void* handle, const char* name) {
  void* found = libc_dlsym(handle, name);
  if (found == nullptr) (void)dlerror();
  return found;
}

void* libc_dlvsym(void* handle, const char* name, const char* version) {
  using Fn = void* (*)(void*, const char*, const char*);
  auto fn = reinterpret_cast<Fn>(libc_dlvsym_address());
  return fn != nullptr ? fn(handle, name, version) : nullptr;
}

void* find_in_caller_scope(const char* name, const void* caller, const char* version) {
  Dl_info info;
  if (caller == nullptr || dladdr(caller, &info) == 0 || info.dli_fname == nullptr || info.dli_fname[0] == '\0') {
    return nullptr;
  }
  void* handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  void* p = version == nullptr ? libc_dlsym(handle, name) : libc_dlvsym(handle, name, version);
  dlclose(handle);
  return p;
}

void* find_in_loaded_objects(const char* name, uintptr_t skip_base) { return find(name, skip_base); }

bool is_library_file(const char* path, const char* library) {
  const char* slash = strrchr(path, '/');
  const char* base = slash != nullptr ? slash + 1 : path;
  const size_t n = strlen(library);
  if (strncmp(base, library, n) != 0) return false;
  const char* rest = base + n;
  if (strncmp(rest, ".so", 3) == 0) return true;
  // "-" and a hex hash, then ".so" (pip wheels' libcudart-1b201d85.so.11.0),
  // not a library of its own (libnvrtc-builtins.so.13.2).
  if (rest[0] != '-') return false;
  const char* p = rest + 1;
  while (isxdigit(static_cast<unsigned char>(*p))) ++p;
  return p > rest + 1 && strncmp(p, ".so", 3) == 0;
}

void* find_in_loaded_library(const char* name, const char* library) {
  struct Search {
    const char* name;
    const char* library;
    void* result;
  } search{name, library, nullptr};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        const char* path = info->dlpi_name;
        if (path == nullptr || path[0] == '\0' || !is_library_file(path, s->library)) return 0;
        void* handle = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
        if (handle == nullptr) return 0;
        s->result = libc_dlsym_quiet(handle, s->name);
        dlclose(handle);
        return s->result != nullptr ? 1 : 0;
      },
      &search);
  return search.result;
}

}  // namespace memledger::interposer
