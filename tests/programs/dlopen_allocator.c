// dlopen_allocator: a program that loads a replacement allocator with
// dlopen after start-up (as a Python extension or a plugin host does), then
// a plugin that allocates through the allocator's own API, bound by name in
// the global scope (where memledger's hooks come first when it is loaded).
//
//   dlopen_allocator ALLOCATOR_PATH PLUGIN_PATH [STEPS [LEAK_BYTES]]
//
// ALLOCATOR_PATH is libjemalloc.so.2 or libtcmalloc_minimal.so.4 (loaded
// RTLD_GLOBAL); PLUGIN_PATH is the libheap_plugin_FAMILY.so built for it.
// jemalloc's static TLS needs GLIBC_TUNABLES=glibc.rtld.optional_static_tls=
// 65536 to be dlopened.
//
// Output: the plugin's lines (see heap_plugin.c), then DONE; exit status 5,
// or 2 when a library cannot be loaded.

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: dlopen_allocator ALLOCATOR_PATH PLUGIN_PATH [STEPS [LEAK_BYTES]]\n");
    return 2;
  }
  const int steps = argc > 3 ? atoi(argv[3]) : 8;
  const size_t leak = argc > 4 ? (size_t)strtoull(argv[4], NULL, 10) : 64 * 1024;
  // Some allocations before the allocator exists, as in any real program.
  void* early = malloc(1000);
  void* allocator = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
  if (allocator == NULL) {
    fprintf(stderr, "dlopen_allocator: %s\n", dlerror());
    return 2;
  }
  void* plugin = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (plugin == NULL) {
    fprintf(stderr, "dlopen_allocator: %s\n", dlerror());
    return 2;
  }
  typedef int (*RunFn)(void* allocator, int steps, size_t leak);
  RunFn run = (RunFn)dlsym(plugin, "heap_plugin_run");
  if (run == NULL) {
    fprintf(stderr, "dlopen_allocator: %s\n", dlerror());
    return 2;
  }
  const int rc = run(allocator, steps, leak);
  free(early);
  printf("DONE steps=%d rc=%d\n", steps, rc);
  fflush(stdout);
  return 5;
}
