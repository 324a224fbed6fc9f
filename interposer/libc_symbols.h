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

// Calls of them (nullptr where libc cannot be read). Made from libmemledger,
// so RTLD_NEXT means the definitions after memledger's.
void* libc_dlsym(void* handle, const char* name);
void* libc_dlvsym(void* handle, const char* name, const char* version);
// libc_dlsym for memledger's own look-ups, whose failure is no error of the
// program's: a failed look-up leaves its message in the thread's dlerror
// state, a block the C library frees later for the program (a free of a
// block the trace never saw allocated); it is taken back at once.
void* libc_dlsym_quiet(void* handle, const char* name);

// `name` (at `version`, when given) in the object holding the address
// `caller` and its dependencies: what that object binds where the global
// scope, which a look-up made from libmemledger searches, does not hold it
// (a library loaded RTLD_LOCAL with its own dependencies). nullptr when
// `caller` is in no object or the object does not reach `name`.
void* find_in_caller_scope(const char* name, const void* caller, const char* version = nullptr);

// The first definition of the function `name` in the loaded objects, in load
// order, skipping the object loaded at `skip_base` (memledger itself; 1:
// none), undefined references (a PLT entry) never counting: finds
// what a library dlopen'ed with RTLD_LOCAL defines, which dlsym(RTLD_NEXT)
// does not see. Reads the objects' tables: no lock but the loader's, no heap.
void* find_in_loaded_objects(const char* name, uintptr_t skip_base);

// Whether the file `path` is the library `library` itself: its file name is
// `library` then ".so" or "-", a hex hash and ".so" (libcudnn.so.9, pip's
// libcudnn-1a2b.so), not one of its sub-libraries (libcudnn_graph.so.9,
// libnvrtc-builtins.so.13.2) nor a longer name (libcudart for libcuda).
bool is_library_file(const char* path, const char* library);

// `name` in the first loaded object that is `library` itself
// (is_library_file) and defines it, in load order, through dlopen(RTLD_NOLOAD)
// of that object and libc_dlsym_quiet: where no such object is loaded,
// nothing fails (a dlopen of a library that is not there would leave an
// error state behind). nullptr when none defines it.
void* find_in_loaded_library(const char* name, const char* library);

}  // namespace memledger::interposer
