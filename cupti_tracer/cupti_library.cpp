#include "cupti_library.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

#include <cstdio>
#include <initializer_list>
#include <cstdlib>
#include <cstring>

namespace memledger::cupti {

namespace {

// The file names a CUDA 13 CUPTI goes by.
constexpr const char* kSonames[] = {"libcupti.so.13", "libcupti.so"};

bool is_directory(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 && !S_ISDIR(st.st_mode);
}

void append(char* buffer, size_t size, const char* text) {
  const size_t used = strlen(buffer);
  if (used + 1 >= size) return;
  snprintf(buffer + used, size - used, "%s%s", used ? ", " : "", text);
}

// A libcupti already mapped into the process (the program's profiler loaded
// it, or a framework links it): use that very copy, never a second one.
struct LoadedSearch {
  char path[1024];
  char site_packages[8][512];
  int site_count;
};

int find_loaded(dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<LoadedSearch*>(data);
  const char* name = info->dlpi_name;
  if (name == nullptr || name[0] == '\0') return 0;
  const char* base = strrchr(name, '/');
  base = base ? base + 1 : name;
  if (search->path[0] == '\0' && strncmp(base, "libcupti.so", 11) == 0) {
    snprintf(search->path, sizeof search->path, "%s", name);
  }
  // Python package folders: where pip puts nvidia-cuda-cupti beside the
  // framework that depends on it.
  for (const char* marker : {"/site-packages/", "/dist-packages/"}) {
    const char* at = strstr(name, marker);
    if (at == nullptr || search->site_count >= 8) continue;
    const size_t len = static_cast<size_t>(at - name) + strlen(marker);
    if (len >= sizeof search->site_packages[0]) continue;
    bool known = false;
    for (int i = 0; i < search->site_count; ++i) {
      if (strncmp(search->site_packages[i], name, len) == 0 && search->site_packages[i][len] == '\0') known = true;
    }
    if (!known) {
      memcpy(search->site_packages[search->site_count], name, len);
      search->site_packages[search->site_count][len] = '\0';
      ++search->site_count;
    }
  }
  return 0;
}

}  // namespace

uint32_t cupti_major(uint32_t api_version) {
  if (api_version >= 10000) return api_version / 10000;
  if (api_version >= 19) return 12;
  if (api_version >= 13) return 11;
  return 10;
}

const char* CuptiLibrary::result_name(CUptiResult result) const {
  const char* text = nullptr;
  if (cuptiGetResultString != nullptr && cuptiGetResultString(result, &text) == CUPTI_SUCCESS && text != nullptr) {
    return text;
  }
  return "an unknown CUPTI error";
}

bool CuptiLibrary::try_open(const char* candidate, char* error, size_t error_size) {
  append(tried_, sizeof tried_, candidate);
  void* handle = dlopen(candidate, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    if (strchr(candidate, '/') != nullptr && is_file(candidate)) {
      // The file exists but does not load: say why rather than searching on.
      const char* why = dlerror();
      snprintf(error, error_size, "cannot load %s: %s", candidate, why ? why : "dlopen failed");
      return false;
    }
    dlerror();
    return false;
  }
  handle_ = handle;
  // The path the loader actually used.
  Dl_info info;
  void* sym = dlsym(handle, "cuptiGetVersion");
  if (sym != nullptr && dladdr(sym, &info) != 0 && info.dli_fname != nullptr) {
    snprintf(path_, sizeof path_, "%s", info.dli_fname);
  } else {
    snprintf(path_, sizeof path_, "%s", candidate);
  }
  if (resolve(error, error_size)) return true;
  // Not used: nothing of it was initialised, so it can go again.
  dlclose(handle_);
  handle_ = nullptr;
  return false;
}

bool CuptiLibrary::resolve(char* error, size_t error_size) {
#define MEMLEDGER_CUPTI_RESOLVE(fn, required)                                                              \
  fn = reinterpret_cast<decltype(fn)>(dlsym(handle_, #fn));                                                 \
  if (fn == nullptr && (required)) {                                                                        \
    snprintf(error, error_size, "%s has no %s: not a usable CUPTI", path_, #fn);                           \
    return false;                                                                                           \
  }
  MEMLEDGER_CUPTI_FUNCTIONS(MEMLEDGER_CUPTI_RESOLVE)
#undef MEMLEDGER_CUPTI_RESOLVE
  CUptiResult r = cuptiGetVersion(&version_);
  if (r != CUPTI_SUCCESS) {
    snprintf(error, error_size, "cuptiGetVersion failed in %s (%s)", path_, result_name(r));
    return false;
  }
  const uint32_t major = cupti_major(version_);
  if (major != kBuiltMajor) {
    snprintf(error, error_size,
             "%s is CUPTI API version %u (CUDA %u); memledger's CUPTI module was built for CUDA %u (API version %u)",
             path_, version_, major, kBuiltMajor, kBuiltVersion);
    return false;
  }
  return true;
}

bool CuptiLibrary::load(const char* path, char* error, size_t error_size) {
  error[0] = '\0';
  tried_[0] = '\0';
  if (path != nullptr && path[0] != '\0') {
    // An explicit path is the only place looked at.
    char candidate[1024];
    if (is_directory(path)) {
      for (const char* soname : kSonames) {
        snprintf(candidate, sizeof candidate, "%s/%s", path, soname);
        if (!is_file(candidate)) continue;
        if (try_open(candidate, error, error_size)) return true;
        if (error[0] != '\0') return false;
      }
      snprintf(error, error_size, "no libcupti in %s (--cupti-path)", path);
      return false;
    }
    if (!is_file(path)) {
      snprintf(error, error_size, "%s does not exist (--cupti-path)", path);
      return false;
    }
    if (try_open(path, error, error_size)) return true;
    if (error[0] == '\0') snprintf(error, error_size, "cannot load %s (--cupti-path)", path);
    return false;
  }

  LoadedSearch search{};
  dl_iterate_phdr(find_loaded, &search);
  if (search.path[0] != '\0') {
    if (try_open(search.path, error, error_size)) return true;
    if (error[0] != '\0') return false;
  }
  char candidate[1024];
  for (int i = 0; i < search.site_count; ++i) {
    for (const char* folder : {"nvidia/cu13/lib", "nvidia/cuda_cupti/lib"}) {
      snprintf(candidate, sizeof candidate, "%s%s/libcupti.so.13", search.site_packages[i], folder);
      if (!is_file(candidate)) continue;
      if (try_open(candidate, error, error_size)) return true;
      if (error[0] != '\0') return false;
    }
  }
  const char* roots[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
  for (const char* root : roots) {
    if (root == nullptr || root[0] == '\0') continue;
    for (const char* folder : {"lib64", "extras/CUPTI/lib64", "targets/x86_64-linux/lib"}) {
      snprintf(candidate, sizeof candidate, "%s/%s/libcupti.so.13", root, folder);
      if (!is_file(candidate)) continue;
      if (try_open(candidate, error, error_size)) return true;
      if (error[0] != '\0') return false;
    }
  }
  for (const char* soname : kSonames) {
    if (try_open(soname, error, error_size)) return true;
    if (error[0] != '\0') return false;
  }
  snprintf(error, error_size, "no libcupti found (tried %s)", tried_);
  return false;
}

}  // namespace memledger::cupti
