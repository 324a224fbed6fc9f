// Finds glibc's own dlsym and dlvsym by reading libc's dynamic symbol table.
//
// memledger exports dlsym and dlvsym itself, and an unversioned definition
// in a preloaded library satisfies even a versioned reference such as
// dlsym@GLIBC_2.34, so no symbol look-up can name libc's functions from here.
// glibc 2.34 also hid the private _dl_sym / __libc_dlsym older interposers
// used. Reading libc's ELF tables (GNU hash, versym) needs neither.
#pragma once

#include <cstdint>

namespace memledger::interposer {

// libc's dlsym / dlvsym (default version), or nullptr if libc cannot be read.
void* libc_dlsym_address();
void* libc_dlvsym_address();

// The first definition of the function `name` in the loaded objects, in load
// order, skipping the object loaded at `skip_base` (memledger itself; 1:
// none), undefined references (a PLT entry) never counting: finds
// what a library dlopen'ed with RTLD_LOCAL defines, which dlsym(RTLD_NEXT)
// does not see. Reads the objects' tables: no lock but the loader's, no heap.
void* find_in_loaded_objects(const char* name, uintptr_t skip_base);

}  // namespace memledger::interposer
