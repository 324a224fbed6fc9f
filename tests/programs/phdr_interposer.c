/* phdr_interposer: a preload library that interposes dl_iterate_phdr and
 * forwards to the next definition found with dlsym(RTLD_NEXT, ...), the
 * usual way an interposer (a profiler, a sandbox) reaches the real function.
 * It counts calls and changes nothing else; memledger must work beside it. */

#include <dlfcn.h>
#include <link.h>
#include <stddef.h>

typedef int (*phdr_callback)(struct dl_phdr_info*, size_t, void*);

static unsigned long g_calls;

__attribute__((visibility("default"))) int dl_iterate_phdr(phdr_callback callback, void* data) {
  static int (*real)(phdr_callback, void*);
  if (real == NULL) real = (int (*)(phdr_callback, void*))dlsym(RTLD_NEXT, "dl_iterate_phdr");
  ++g_calls;
  return real(callback, data);
}
