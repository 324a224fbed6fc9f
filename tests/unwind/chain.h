// Call chains for the unwinder test: the same code built three ways
// (chain.cpp compiled with frame pointers, without them, and without them
// but with a variable-length array, whose functions address their frame
// through rbp), so that one stack mixes frames of every kind.
#pragma once

extern "C" {
// Called at the bottom of a chain.
typedef int (*ChainLeaf)(void* arg);

// Calls the next link of `pattern` ('f' chain_fp, 'n' chain_nofp, 'v'
// chain_vla) until the pattern ends, then `leaf`. Never a tail call: each
// link adds to the result after its callee returns.
int chain_fp(const char* pattern, ChainLeaf leaf, void* arg);
int chain_nofp(const char* pattern, ChainLeaf leaf, void* arg);
int chain_vla(const char* pattern, ChainLeaf leaf, void* arg);
}
