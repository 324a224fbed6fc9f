#include "cuda_stack.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>

#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include "libc_symbols.h"
#include "recorder.h"
#include "small_file.h"
#include "spin_lock.h"

namespace memledger::interposer {

namespace {

// A CUDA-family library, matched by the start of its file name, and how to
// ask it its version.
enum class Family { kDriver, kRuntime, kCublas, kCublasLt, kCudnn, kNccl, kCufft, kCusparse, kNvrtc, kCupti };

struct FamilyName {
  const char* prefix;  // followed by ".so" or "-" (pip wheels' hashed names: libcudart-1b201d85.so.11.0)
  Family family;
};

constexpr FamilyName kFamilies[] = {
    {"libcuda", Family::kDriver},   {"libcudart", Family::kRuntime}, {"libcublasLt", Family::kCublasLt},
    {"libcublas", Family::kCublas}, {"libcudnn", Family::kCudnn},    {"libnccl", Family::kNccl},
    {"libcufft", Family::kCufft},   {"libcusparse", Family::kCusparse}, {"libnvrtc", Family::kNvrtc},
    {"libcupti", Family::kCupti},
};

constexpr int kMaxLibraries = 48;
constexpr size_t kPathMax = 512;

struct Found {
  char path[kPathMax];
  Family family;
};

struct Scan {
  Found found[kMaxLibraries];
  int count = 0;
  bool cudnn_graph = false;  // libcudnn_graph (cuDNN 9's sub-library) is loaded
};

// What was recorded already (hashes of library paths), and the GPUs.
struct State {
  SpinLock lock;
  uint64_t libraries[kMaxLibraries];  // noted with the version their call gave
  int library_count = 0;
  // Noted without a version that a later look may ask (Ask::kLater).
  uint64_t waiting[kMaxLibraries];
  int waiting_count = 0;
  bool driver_noted = false;
  bool devices_noted = false;
  bool init_error_noted = false;
  bool release_noted = false;
};
State g_state;

uint64_t hash(const char* s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 1099511628211ull;
  return h;
}

bool family_of(const char* path, Family* out) {
  for (const FamilyName& f : kFamilies) {
    if (is_library_file(path, f.prefix)) {
      *out = f.family;
      return true;
    }
  }
  return false;
}

int collect(dl_phdr_info* info, size_t, void* data) {
  auto* scan = static_cast<Scan*>(data);
  Family family;
  if (info->dlpi_name == nullptr || info->dlpi_name[0] == '\0') return 0;
  if (is_library_file(info->dlpi_name, "libcudnn_graph")) scan->cudnn_graph = true;
  if (!family_of(info->dlpi_name, &family)) return 0;
  if (scan->count >= kMaxLibraries || std::strlen(info->dlpi_name) >= kPathMax) return 0;
  Found& f = scan->found[scan->count++];
  std::strcpy(f.path, info->dlpi_name);
  f.family = family;
  return 0;
}

void* symbol(void* handle, const char* name) { return libc_dlsym_quiet(handle, name); }

// "M.m" from the CUDA encoding 1000 * major + 10 * minor (12080: 12.8).
void cuda_text(int v, char* out, size_t size) { std::snprintf(out, size, "%d.%d", v / 1000, v % 1000 / 10); }

// `major_step`: the encoding's weight of the major (10000 or 1000), minor 100.
void dotted(long v, long major_step, char* out, size_t size) {
  std::snprintf(out, size, "%ld.%ld.%ld", v / major_step, v % major_step / 100, v % 100);
}

// Three libraryPropertyType queries (MAJOR_VERSION 0, MINOR 1, PATCH 2).
void by_property(void* fn, char* out, size_t size) {
  auto get = reinterpret_cast<int (*)(int, int*)>(fn);
  int v[3] = {};
  for (int i = 0; i < 3; ++i) {
    if (get(i, &v[i]) != 0) return;
  }
  std::snprintf(out, size, "%d.%d.%d", v[0], v[1], v[2]);
}

// The major in a file name's ".so.N" (libcudnn.so.9: 9), or -1.
int so_major(const char* path) {
  const char* so = std::strstr(path, ".so.");
  return so != nullptr && so[4] >= '0' && so[4] <= '9' ? std::atoi(so + 4) : -1;
}

// Whether a library may be asked its version now: a version call that
// would start something the program has not started yet (load a library,
// initialise CUPTI) waits for the program to start it.
enum class Ask { kNow, kLater };

Ask when_to_ask(const Found& f, const Scan& scan, bool driver_answered) {
  switch (f.family) {
    case Family::kCudnn: {
      // cuDNN 9's libcudnn.so.9 is a front: cudnnGetVersion loads
      // libcudnn_graph.so.9 to answer, which the program loads at its first
      // cuDNN call (cudnnCreate); a framework that only links cuDNN never
      // loads it. An older cuDNN, known by its file name, answers from itself.
      const int major = so_major(f.path);
      return (major >= 0 && major < 9) || scan.cudnn_graph ? Ask::kNow : Ask::kLater;
    }
    case Family::kCupti:
      // cuptiGetVersion starts CUPTI, which loads the driver, and CUPTI 13.2
      // (pip's nvidia-cuda-cupti, which PyTorch's CUDA wheels bring)
      // overflows the stack where there is none: a CUDA build of PyTorch on
      // a machine without a GPU. Asked once the program has initialised the
      // driver, it starts nothing new.
      return driver_answered ? Ask::kNow : Ask::kLater;
    default:
      return Ask::kNow;
  }
}

// The library's own version call; `out` stays empty where it has none.
void library_version(void* h, Family family, char* out, size_t size) {
  out[0] = '\0';
  switch (family) {
    case Family::kDriver:
    case Family::kRuntime: {
      auto fn = reinterpret_cast<int (*)(int*)>(
          symbol(h, family == Family::kDriver ? "cuDriverGetVersion" : "cudaRuntimeGetVersion"));
      int v = 0;
      if (fn != nullptr && fn(&v) == 0 && v > 0) cuda_text(v, out, size);
      break;
    }
    case Family::kCublas:
      if (void* fn = symbol(h, "cublasGetProperty")) by_property(fn, out, size);
      break;
    case Family::kCusparse:
      if (void* fn = symbol(h, "cusparseGetProperty")) by_property(fn, out, size);
      break;
    case Family::kCublasLt:
      if (auto fn = reinterpret_cast<size_t (*)()>(symbol(h, "cublasLtGetVersion"))) {
        dotted(static_cast<long>(fn()), 10000, out, size);
      }
      break;
    case Family::kCudnn:
      // cuDNN 9 encodes 10000 * major, cuDNN 8 and older 1000 * major.
      if (auto fn = reinterpret_cast<size_t (*)()>(symbol(h, "cudnnGetVersion"))) {
        const long v = static_cast<long>(fn());
        dotted(v, v >= 90000 ? 10000 : 1000, out, size);
      }
      break;
    case Family::kNccl: {
      // NCCL 2.9 and later encode 10000 * major, earlier 1000 * major.
      auto fn = reinterpret_cast<int (*)(int*)>(symbol(h, "ncclGetVersion"));
      int v = 0;
      if (fn != nullptr && fn(&v) == 0 && v > 0) dotted(v, v >= 10000 ? 10000 : 1000, out, size);
      break;
    }
    case Family::kCufft: {
      auto fn = reinterpret_cast<int (*)(int*)>(symbol(h, "cufftGetVersion"));
      int v = 0;
      if (fn != nullptr && fn(&v) == 0 && v > 0) dotted(v, 1000, out, size);
      break;
    }
    case Family::kNvrtc: {
      auto fn = reinterpret_cast<int (*)(int*, int*)>(symbol(h, "nvrtcVersion"));
      int major = 0, minor = 0;
      if (fn != nullptr && fn(&major, &minor) == 0) std::snprintf(out, size, "%d.%d", major, minor);
      break;
    }
    case Family::kCupti: {
      auto fn = reinterpret_cast<int (*)(uint32_t*)>(symbol(h, "cuptiGetVersion"));
      uint32_t v = 0;
      if (fn != nullptr && fn(&v) == 0) std::snprintf(out, size, "API %u", v);
      break;
    }
  }
}

// The GPUs, once the driver answers (the program initialised it: an
// uninitialised driver returns CUDA_ERROR_NOT_INITIALIZED, and nothing
// here calls cuInit).
void note_devices(void* driver) {
  auto count_fn = reinterpret_cast<int (*)(int*)>(symbol(driver, "cuDeviceGetCount"));
  auto name_fn = reinterpret_cast<int (*)(char*, int, int)>(symbol(driver, "cuDeviceGetName"));
  auto mem_fn = reinterpret_cast<int (*)(size_t*, int)>(symbol(driver, "cuDeviceTotalMem_v2"));
  int count = 0;
  if (count_fn == nullptr || count_fn(&count) != 0) return;
  g_state.devices_noted = true;
  for (int d = 0; d < count && d < 64; ++d) {
    char name[128] = "";
    size_t total = 0;
    if (name_fn != nullptr && name_fn(name, sizeof name, d) != 0) name[0] = '\0';
    if (mem_fn != nullptr && mem_fn(&total, d) != 0) total = 0;
    char key[32], value[192];
    std::snprintf(key, sizeof key, "cuda.device.%d", d);
    std::snprintf(value, sizeof value, "%zu %s", total, name);
    recorder().on_info(key, value);
  }
}

// The first "N.N" or "N.N.N" token at or after `p` (a driver release such
// as 580.65.06); false when there is none.
bool release_token(const char* p, char* out, size_t size) {
  while (*p != '\0' && *p != '\n') {
    while (*p == ' ' || *p == '\t') ++p;
    const char* start = p;
    int dots = 0;
    bool digit = false;
    while ((*p >= '0' && *p <= '9') || *p == '.') {
      dots += *p == '.';
      digit = digit || *p != '.';
      ++p;
    }
    if (digit && dots >= 1 && dots <= 2 && start[0] != '.' && p[-1] != '.' && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\0')) {
      std::snprintf(out, size, "%.*s", static_cast<int>(p - start), start);
      return true;
    }
    while (*p != '\0' && *p != '\n' && *p != ' ' && *p != '\t') ++p;
  }
  return false;
}

// The NVIDIA kernel module's release from /proc/driver/nvidia/version
// ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  ...", or
// "... Open Kernel Module for x86_64  580.65.06 ..."). The environment
// variable MEMLEDGER_TEST_NVIDIA_VERSION_FILE names another file in its
// place: for tests only, on machines without the driver.
bool kernel_module_release(char* out, size_t size) {
  const char* path = getenv("MEMLEDGER_TEST_NVIDIA_VERSION_FILE");
  if (path == nullptr || *path == '\0') path = "/proc/driver/nvidia/version";
  char text[1024];
  if (read_small_file(path, text, sizeof text) <= 0) return false;
  const char* module = std::strstr(text, "Kernel Module");
  if (module == nullptr) return false;
  const char* for_arch = std::strstr(module, " for ");  // the open module names its architecture first
  const char* eol = std::strchr(module, '\n');
  const char* from = module + 13;
  if (for_arch != nullptr && (eol == nullptr || for_arch < eol)) {
    from = for_arch + 5;
    while (*from != '\0' && *from != ' ' && *from != '\n') ++from;
  }
  return release_token(from, out, size);
}

// The release in the file name libcuda.so.1 resolves to (libcuda.so.580.65.06).
bool library_release(const char* path, char* out, size_t size) {
  char real[PATH_MAX];
  if (realpath(path, real) == nullptr) return false;
  const char* slash = std::strrchr(real, '/');
  const char* base = slash ? slash + 1 : real;
  if (std::strncmp(base, "libcuda.so.", 11) != 0) return false;
  return release_token(base + 11, out, size) && std::strchr(out, '.') != nullptr;
}

// The driver's release, once: the kernel module's and libcuda's (they
// differ after an upgrade without a reboot: "Driver/library version
// mismatch").
void note_release(const char* libcuda) {
  g_state.release_noted = true;
  char release[64];
  if (kernel_module_release(release, sizeof release)) recorder().on_info("cuda.driver_release", release);
  if (library_release(libcuda, release, sizeof release)) recorder().on_info("cuda.driver_library_release", release);
}

bool among(const uint64_t* hashes, int count, uint64_t h) {
  for (int i = 0; i < count; ++i) {
    if (hashes[i] == h) return true;
  }
  return false;
}

bool already_noted(uint64_t h) { return among(g_state.libraries, g_state.library_count, h); }

void note_library(const Found& f, const Scan& scan) {
  const uint64_t h = hash(f.path);
  const bool seen = already_noted(h);
  if (seen && !(f.family == Family::kDriver && !g_state.devices_noted)) return;
  void* handle = dlopen(f.path, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return;
  if (!seen && g_state.library_count < kMaxLibraries) {
    char version[64] = "";
    if (when_to_ask(f, scan, g_state.devices_noted) == Ask::kLater) {
      // Listed now without its version (once), asked at a later look.
      if (!among(g_state.waiting, g_state.waiting_count, h) && g_state.waiting_count < kMaxLibraries) {
        g_state.waiting[g_state.waiting_count++] = h;
        char value[kPathMax + 80];
        std::snprintf(value, sizeof value, "%s\t", f.path);
        recorder().on_info("cuda.library", value);
      }
      dlclose(handle);
      return;
    }
    library_version(handle, f.family, version, sizeof version);
    char value[kPathMax + 80];
    std::snprintf(value, sizeof value, "%s\t%s", f.path, version);
    recorder().on_info("cuda.library", value);
    if (f.family == Family::kDriver && version[0] != '\0' && !g_state.driver_noted) {
      g_state.driver_noted = true;
      recorder().on_info("cuda.driver", version);
    }
    if (f.family == Family::kDriver && !g_state.release_noted) note_release(f.path);
    g_state.libraries[g_state.library_count++] = h;
  }
  if (f.family == Family::kDriver && !g_state.devices_noted) note_devices(handle);
  dlclose(handle);
}

// cudaErrorInsufficientDriver / CUDA_ERROR_INSUFFICIENT_DRIVER (35), an
// unsupported PTX version (222), a driver mismatch (803) or forward
// compatibility refused on this device (804): the same numbers in the
// driver and the runtime API.
bool is_version_error(int error) { return error == 35 || error == 222 || error == 803 || error == 804; }

// A forked child writes a trace of its own: its facts are noted again (at
// its next step end or failed call), and a lock held at the fork is free.
__attribute__((constructor)) void forget_in_children() {
  pthread_atfork(nullptr, nullptr, [] {
    g_state.lock.reset();
    g_state.library_count = 0;
    g_state.waiting_count = 0;
    g_state.driver_noted = g_state.devices_noted = g_state.init_error_noted = g_state.release_noted = false;
  });
}

}  // namespace

void note_cuda_stack(const char* call, int error) {
  if (!recorder().active()) return;
  // Never block the program: another thread noting the stack does it for us.
  if (!g_state.lock.try_lock()) return;
  HookGuard guard;
  if (call != nullptr && is_version_error(error) && !g_state.init_error_noted) {
    g_state.init_error_noted = true;
    char value[96];
    std::snprintf(value, sizeof value, "%s %d", call, error);
    recorder().on_info("cuda.init_error", value);
  }
  static Scan scan;  // under the lock; too large for a program thread's stack
  scan.count = 0;
  scan.cudnn_graph = false;
  if (recorder().enter_loader_section()) {
    dl_iterate_phdr(collect, &scan);
    recorder().leave_loader_section();
  }
  // The driver first: whether it answers decides what the others are asked.
  for (int i = 0; i < scan.count; ++i) {
    if (scan.found[i].family == Family::kDriver) note_library(scan.found[i], scan);
  }
  for (int i = 0; i < scan.count; ++i) {
    if (scan.found[i].family != Family::kDriver) note_library(scan.found[i], scan);
  }
  g_state.lock.unlock();
}

}  // namespace memledger::interposer
