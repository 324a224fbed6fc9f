// One link of the unwinder test's chains (chain.h); CHAIN_NAME names the
// build: chain_fp, chain_nofp or chain_vla.
#include "chain.h"

#include <cstring>

namespace {
int next_link(const char* pattern, ChainLeaf leaf, void* arg) {
  switch (*pattern) {
    case 'f': return chain_fp(pattern + 1, leaf, arg);
    case 'n': return chain_nofp(pattern + 1, leaf, arg);
    case 'v': return chain_vla(pattern + 1, leaf, arg);
    default: return leaf(arg);
  }
}
}  // namespace

extern "C" __attribute__((noinline)) int CHAIN_NAME(const char* pattern, ChainLeaf leaf, void* arg) {
  volatile int local[4] = {1, 2, 3, static_cast<int>(strlen(pattern))};
#ifdef CHAIN_VLA
  // A variable-length array: the function keeps rbp as its frame base
  // even without -fno-omit-frame-pointer, and its CFA rule says rbp.
  volatile char scratch[local[3] + 16];
  scratch[0] = 1;
  const int result = next_link(pattern, leaf, arg) + scratch[0];
#else
  const int result = next_link(pattern, leaf, arg);
#endif
  return result + local[0];
}
