// The hooks of CUDA libraries' handle-creating calls (library_hooks.cpp).
#pragma once

namespace memledger::interposer {

// dlsym/dlvsym's result `p` for `name`: memledger's hook when `name` is one
// of the hooked calls and `p` lies in its library (the real function is
// kept), else `p` unchanged.
void* wrap_library_lookup(const char* name, void* p);

}  // namespace memledger::interposer
