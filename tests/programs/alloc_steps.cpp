// alloc_steps: a training-like loop that leaks through operator new, for the
// replacement allocator tests. Each step allocates and frees through malloc/
// free, new/delete and new[]/delete[], then leaks one LEAK_BYTES object made
// by `new`, then marks the step end with memledger_step("train").
//
//   alloc_steps [STEPS [LEAK_BYTES]]
//
// At the end it asks the allocators in the process which of them made a
// fresh malloc block (jemalloc: thread.allocated grows; tcmalloc:
// MallocExtension_GetOwnership; mimalloc: mi_is_in_heap_region).
//
// Then it makes six host allocations that fail and prints what each
// returned and errno after it (FAILED=...), which tracing must not change.
//
// Output: LEAK_FILE, LEAK_LINE, TRACED=0|1, SERVED_BY=jemalloc|tcmalloc|
// mimalloc|none, FAILED=..., DONE steps=N leaked=B; exit status 5 (a clean
// status that is not 0, so that a changed one shows).

#include <dlfcn.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

namespace {

using StepFn = void (*)(const char*);

struct Piece {
  Piece* next;
};
Piece* g_kept = nullptr;
void* volatile g_sink = nullptr;

constexpr int kLeakLine = __LINE__ + 3;

__attribute__((noinline, noipa)) void plant_leak(size_t bytes) {
  void* block = ::operator new(bytes);  // PLANTED LEAK
  std::memset(block, 0x5a, bytes);
  static_cast<Piece*>(block)->next = g_kept;
  g_kept = static_cast<Piece*>(block);
}

__attribute__((noinline)) void churn(int step) {
  for (int i = 0; i < 200; ++i) {
    char* a = static_cast<char*>(std::malloc(static_cast<size_t>(32 + (i * 7 + step) % 500)));
    auto* b = new std::string(static_cast<size_t>(40 + i % 64), 'x');
    auto* c = new double[static_cast<size_t>(8 + i % 100)];
    g_sink = a;
    g_sink = b;
    g_sink = c;
    delete[] c;
    delete b;
    std::free(a);
  }
  // A block made by new and given back with free: legal only when the
  // allocator's operator new is malloc (glibc), so the test never does it;
  // calloc/realloc go through the malloc family.
  char* r = static_cast<char*>(std::calloc(4, 64));
  r = static_cast<char*>(std::realloc(r, 4096));
  std::free(r);
}

template <typename Fn>
Fn find(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

// Which allocator made a fresh malloc block.
const char* served_by() {
  using Mallctl = int (*)(const char*, void*, size_t*, void*, size_t);
  using Ownership = int (*)(const void*);
  using InHeap = bool (*)(const void*);
  void* probe = nullptr;
  const char* who = "none";
  if (auto mallctl = find<Mallctl>("mallctl")) {
    uint64_t before = 0, after = 0;
    size_t len = sizeof before;
    mallctl("thread.allocated", &before, &len, nullptr, 0);
    probe = std::malloc(100000);
    len = sizeof after;
    mallctl("thread.allocated", &after, &len, nullptr, 0);
    if (after >= before + 100000) who = "jemalloc";
  } else if (auto owned = find<Ownership>("MallocExtension_GetOwnership")) {
    probe = std::malloc(100000);
    if (owned(probe) == 1) who = "tcmalloc";  // MallocExtension::kOwned
  } else if (auto in_heap = find<InHeap>("mi_is_in_heap_region")) {
    probe = std::malloc(100000);
    if (in_heap(probe)) who = "mimalloc";
  }
  std::free(probe);
  return who;
}

// Six calls that fail: "result/errno" of each.
void fail_six() {
  static volatile size_t eight = 8;  // hides the overflow from the compiler
  const size_t huge = SIZE_MAX / 4;
  char line[256];
  int n = 0;
  auto note = [&](bool ok, int err) { n += std::snprintf(line + n, sizeof line - n, "%d/%d ", ok, err); };
  errno = 0;
  void* p = std::malloc(huge);
  note(p != nullptr, errno);
  errno = 0;
  p = std::calloc(huge, eight);
  note(p != nullptr, errno);
  void* keep = std::malloc(64);
  errno = 0;
  p = std::realloc(keep, huge);
  note(p != nullptr, errno);
  std::free(p != nullptr ? p : keep);
  errno = 0;
  void* out = nullptr;
  const int rc = posix_memalign(&out, 64, huge);
  note(out != nullptr, rc);
  errno = 0;
  p = aligned_alloc(64, huge & ~size_t{63});
  note(p != nullptr, errno);
  errno = 0;
  p = ::operator new(huge, std::nothrow);
  note(p != nullptr, errno);
  std::printf("FAILED=%s\n", line);
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 12;
  const size_t leak = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 8192;
  auto step = find<StepFn>("memledger_step");
  std::printf("LEAK_FILE=alloc_steps.cpp\nLEAK_LINE=%d\nTRACED=%d\n", kLeakLine, step != nullptr);
  for (int i = 0; i < steps; ++i) {
    churn(i);
    plant_leak(leak);
    if (step != nullptr) step("train");
  }
  std::printf("SERVED_BY=%s\n", served_by());
  fail_six();
  std::printf("DONE steps=%d leaked=%zu\n", steps, static_cast<size_t>(steps) * leak);
  std::fflush(stdout);
  return 5;
}
