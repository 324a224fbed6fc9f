// Finds glibc's own dlsym and dlvsym by reading libc's dynamic symbol table.
//
// memledger exports dlsym and dlvsym itself, and an unversioned definition
// in a preloaded library satisfies even a versioned reference such as
// dlsym@GLIBC_2.34, so no symbol look-up can name libc's functions from here.
// glibc 2.34 also hid the private _dl_sym / __libc_dlsym older interposers
// used. Reading libc's ELF tables (GNU hash, versym) needs neither.
#pragma once

namespace memledger::interposer {

// libc's dlsym / dlvsym (default version), or nullptr if libc cannot be read.
void* libc_dlsym_address();
void* libc_dlvsym_address();

}  // namespace memledger::interposer
