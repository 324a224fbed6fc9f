// heap_plugin: loaded by dlopen_allocator after a replacement allocator was
// dlopen'ed. It calls jemalloc's (built with HEAP_PLUGIN_JEMALLOC) or
// tcmalloc's own API by name; those names are left undefined here and bound
// at load time in the global scope: to the allocator, or to memledger's
// hooks when it is preloaded, which must then forward to the allocator that
// arrived after memledger started.
//
// Each step leaks one LEAK_BYTES block (the planted leak, at LEAK_LINE) and
// makes and frees a few more. Blocks also cross between the hooked entry
// points and the allocator's own (looked up in its handle, which bypasses
// every hook): a block is good only for the heap that made it, so a hook
// that served or freed it from another heap aborts the program here.
//
// Output: FAMILY=jemalloc|tcmalloc, LEAK_FILE, LEAK_LINE, SERVED_BY (which
// heap made a block through the hooked entry point: jemalloc's
// thread.allocated grows, tcmalloc's MallocExtension_GetOwnership says it
// owns it; other otherwise), CROSS=ok.

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

// The allocator's API, bound by name: only the family built in is
// referenced, since the loader binds every name at dlopen.
#ifdef HEAP_PLUGIN_JEMALLOC
#define FAMILY "jemalloc"
void* mallocx(size_t size, int flags);
void* rallocx(void* ptr, size_t size, int flags);
void sdallocx(void* ptr, size_t size, int flags);
void dallocx(void* ptr, int flags);
int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen);
#define MALLOCX_ZERO 0x40
#define HEAP_ALLOC(n) mallocx(n, 0)
#define HEAP_ALLOC_ZEROED(n) mallocx(n, MALLOCX_ZERO)
#define HEAP_REALLOC(p, n) rallocx(p, n, 0)
#define HEAP_FREE_SIZED(p, n) sdallocx(p, n, 0)
#define HEAP_FREE(p) dallocx(p, 0)
#define REAL_ALLOC "mallocx"
#define REAL_FREE "dallocx"
typedef void* (*RealAlloc)(size_t, int);
typedef void (*RealFree)(void*, int);
#define CALL_REAL_ALLOC(f, n) (f)(n, 0)
#define CALL_REAL_FREE(f, p) (f)(p, 0)
#else
#define FAMILY "tcmalloc"
void* tc_malloc(size_t size);
void* tc_calloc(size_t count, size_t size);
void* tc_realloc(void* ptr, size_t size);
void tc_free(void* ptr);
void tc_free_sized(void* ptr, size_t size);
int MallocExtension_GetOwnership(const void* ptr);
#define HEAP_ALLOC(n) tc_malloc(n)
#define HEAP_ALLOC_ZEROED(n) tc_calloc(1, n)
#define HEAP_REALLOC(p, n) tc_realloc(p, n)
#define HEAP_FREE_SIZED(p, n) tc_free_sized(p, n)
#define HEAP_FREE(p) tc_free(p)
#define REAL_ALLOC "tc_malloc"
#define REAL_FREE "tc_free"
typedef void* (*RealAlloc)(size_t);
typedef void (*RealFree)(void*);
#define CALL_REAL_ALLOC(f, n) (f)(n)
#define CALL_REAL_FREE(f, p) (f)(p)
#endif

static void* g_kept[4096];
static int g_kept_count;

static const int kLeakLine = __LINE__ + 2;
__attribute__((noinline)) static void plant_leak(size_t bytes) {
  void* block = HEAP_ALLOC(bytes);  // PLANTED LEAK
  memset(block, 0x5a, bytes);
  if (g_kept_count < 4096) g_kept[g_kept_count++] = block;
}

__attribute__((noinline)) static void churn(void) {
  for (int i = 0; i < 50; ++i) {
    const size_t n = (size_t)(64 + i * 40);
    char* p = HEAP_ALLOC_ZEROED(n);
    p = HEAP_REALLOC(p, n * 2);
    HEAP_FREE_SIZED(p, n * 2);
    HEAP_FREE(HEAP_ALLOC(32));
  }
}

// Whether the allocator made a block handed out through the hooked name.
static const char* served_by(void) {
  const size_t n = 1 << 20;
#ifdef HEAP_PLUGIN_JEMALLOC
  uint64_t before = 0, after = 0;
  size_t len = sizeof before;
  mallctl("thread.allocated", &before, &len, NULL, 0);
  void* p = HEAP_ALLOC(n);
  len = sizeof after;
  mallctl("thread.allocated", &after, &len, NULL, 0);
  const int ours = after - before >= n;
#else
  void* p = HEAP_ALLOC(n);
  const int ours = MallocExtension_GetOwnership(p) == 1;  // kOwned
#endif
  HEAP_FREE(p);
  return ours ? FAMILY : "other";
}

// Blocks handed between the hooked entry points and the allocator's own
// (from its handle: no hook on that path).
static const char* cross(void* allocator) {
  RealAlloc real_alloc = (RealAlloc)dlsym(allocator, REAL_ALLOC);
  RealFree real_free = (RealFree)dlsym(allocator, REAL_FREE);
  if (real_alloc == NULL || real_free == NULL) return "no-symbols";
  HEAP_FREE(CALL_REAL_ALLOC(real_alloc, 4000));
  CALL_REAL_FREE(real_free, HEAP_ALLOC(4000));
  return "ok";
}

__attribute__((visibility("default"))) int heap_plugin_run(void* allocator, int steps, size_t leak) {
  void (*step)(const char*) = (void (*)(const char*))dlsym(RTLD_DEFAULT, "memledger_step");
  printf("FAMILY=%s\nLEAK_FILE=%s\nLEAK_LINE=%d\n", FAMILY, __FILE__, kLeakLine);
  for (int s = 0; s < steps; ++s) {
    churn();
    plant_leak(leak);
    if (step != NULL) step("train");
  }
  printf("SERVED_BY=%s\nCROSS=%s\n", served_by(), cross(allocator));
  fflush(stdout);
  return g_kept_count;
}
