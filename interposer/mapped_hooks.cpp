// Hooks for anonymous memory mapped outside the heap: mmap, mmap64, munmap
// and mremap called by the program or its libraries (pymalloc's arenas, a
// statically linked allocator, a library's own pool) are recorded as the
// kind `mapped`, with stacks, in every host mode but off and never sampled:
// mappings are rare and large.
//
// Not recorded: calls made while a memledger hook is forwarding to the
// allocator (jemalloc or tcmalloc mapping its arenas under malloc: those
// bytes are the heap's, recorded by the host hooks) or a hooked CUDA call,
// calls made by memledger itself, file mappings, and PROT_NONE reservations
// (address space, not memory). glibc's malloc maps through its internal
// entry points and never reaches these hooks. mapped_ledger.h keeps the
// ranges, so that a partial munmap or an mremap keeps live bytes exact.

// The build asks for 64-bit file offsets, which renames mmap to mmap64 in
// <sys/mman.h>: both names are defined here, each for itself.
#undef _FILE_OFFSET_BITS

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "mapped_ledger.h"
#include "next_allocator.h"
#include "recorder.h"
#include "spin_lock.h"

namespace ip = memledger::interposer;

namespace {

using MmapFn = void* (*)(void*, size_t, int, int, int, off_t);
using MunmapFn = int (*)(void*, size_t);
using MremapFn = void* (*)(void*, size_t, size_t, int, ...);

MmapFn g_next_mmap = nullptr;
MmapFn g_next_mmap64 = nullptr;
MunmapFn g_next_munmap = nullptr;
MremapFn g_next_mremap = nullptr;
__thread bool tls_looking_up __attribute__((tls_model("initial-exec")));

// The next definition of `name`, looked up at the first call. Null while
// this thread is looking it up (the look-up may map memory) or when there
// is none: the caller then makes the system call itself.
template <typename Fn>
Fn next_of(Fn& slot, const char* name) {
  Fn fn = __atomic_load_n(&slot, __ATOMIC_ACQUIRE);
  if (fn != nullptr || tls_looking_up) return fn;
  tls_looking_up = true;
  fn = reinterpret_cast<Fn>(ip::next_symbol(name));
  tls_looking_up = false;
  if (fn != nullptr) __atomic_store_n(&slot, fn, __ATOMIC_RELEASE);
  return fn;
}

uint64_t page_end(const void* addr, size_t len) {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t begin = reinterpret_cast<uint64_t>(addr);
  return begin + ((static_cast<uint64_t>(len) + page - 1) & ~(page - 1));
}

// Whether a call from `caller` on this thread is the program's own.
bool recorded_call(const void* caller) {
  const ip::ThreadState& t = ip::thread_state();
  if (t.in_hook != 0 || t.cuda_depth != 0 || !ip::recorder().host_enabled()) return false;
  const uintptr_t ip_ = reinterpret_cast<uintptr_t>(caller);
  return ip_ < ip::recorder().self_begin() || ip_ >= ip::recorder().self_end();
}

// Records what a ledger change did, from the calling thread.
class Recording final : public ip::MappedLedger::Sink {
 public:
  explicit Recording(ip::ThreadState& t) : t_(t) {}
  void freed(uint64_t begin) override { ip::recorder().on_mapped_free(t_, begin); }
  void allocated(uint64_t begin, uint64_t size, uint32_t stack) override {
    ip::recorder().on_mapped_alloc(t_, begin, size, stack);
  }

 private:
  ip::ThreadState& t_;
};

void* map(MmapFn& slot, const char* name, const void* caller, void* addr, size_t len, int prot, int flags, int fd,
          off_t offset) {
  const MmapFn next = next_of(slot, name);
  auto call = [&] {
    return next != nullptr ? next(addr, len, prot, flags, fd, offset)
                           : reinterpret_cast<void*>(syscall(SYS_mmap, addr, len, prot, flags, fd, offset));
  };
  // A MAP_FIXED mapping replaces whatever was mapped there, recorded or not.
  const bool memory = (flags & MAP_ANONYMOUS) != 0 && prot != PROT_NONE;
  const bool fixed = (flags & MAP_FIXED) != 0;
  if ((!memory && !fixed) || !recorded_call(caller)) return call();
  ip::HookGuard guard;
  const uint32_t stack = memory ? ip::recorder().capture_stack() : 0;
  ip::MappedLedger& ledger = ip::mapped_ledger();
  Recording sink(guard.thread());
  // The ledger's lock is held across the call: another thread's munmap of
  // these addresses cannot be recorded after this mapping's record.
  ip::SpinGuard lock(ledger.lock());
  void* p = call();
  const int saved = errno;
  if (p != MAP_FAILED) {
    if (memory) {
      ledger.add(reinterpret_cast<uint64_t>(p), page_end(p, len), stack, sink);
    } else {
      ledger.remove(reinterpret_cast<uint64_t>(p), page_end(p, len), sink);
    }
  }
  errno = saved;
  return p;
}

}  // namespace

#define MEMLEDGER_EXPORT extern "C" __attribute__((visibility("default")))

MEMLEDGER_EXPORT void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t offset) {
  return map(g_next_mmap, "mmap", __builtin_return_address(0), addr, len, prot, flags, fd, offset);
}

MEMLEDGER_EXPORT void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off_t offset) {
  return map(g_next_mmap64, "mmap64", __builtin_return_address(0), addr, len, prot, flags, fd, offset);
}

MEMLEDGER_EXPORT int munmap(void* addr, size_t len) {
  const MunmapFn next = next_of(g_next_munmap, "munmap");
  auto call = [&] { return next != nullptr ? next(addr, len) : static_cast<int>(syscall(SYS_munmap, addr, len)); };
  if (!recorded_call(__builtin_return_address(0))) return call();
  ip::HookGuard guard;
  ip::MappedLedger& ledger = ip::mapped_ledger();
  Recording sink(guard.thread());
  // Held across the call: the addresses may be mapped again by another
  // thread as soon as it returns, and that record must come after this one.
  ip::SpinGuard lock(ledger.lock());
  const int rc = call();
  const int saved = errno;
  if (rc == 0) ledger.remove(reinterpret_cast<uint64_t>(addr), page_end(addr, len), sink);
  errno = saved;
  return rc;
}

// A move, growth or shrink of a recorded mapping is the free of the old
// range and the allocation of the new one, with the stack that first mapped
// it. A mapping memledger did not record stays unrecorded.
MEMLEDGER_EXPORT void* mremap(void* old_addr, size_t old_len, size_t new_len, int flags, ...) {
  void* new_addr = nullptr;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    new_addr = va_arg(ap, void*);
    va_end(ap);
  }
  const MremapFn next = next_of(g_next_mremap, "mremap");
  auto call = [&] {
    return next != nullptr ? next(old_addr, old_len, new_len, flags, new_addr)
                           : reinterpret_cast<void*>(syscall(SYS_mremap, old_addr, old_len, new_len, flags, new_addr));
  };
  if (!recorded_call(__builtin_return_address(0))) return call();
  ip::HookGuard guard;
  ip::MappedLedger& ledger = ip::mapped_ledger();
  Recording sink(guard.thread());
  ip::SpinGuard lock(ledger.lock());
  void* p = call();
  const int saved = errno;
  if (p != MAP_FAILED) {
    uint32_t stack = 0;
    // old_len 0 duplicates a shared mapping: the old one stays.
    const bool recorded = old_len != 0 && ledger.find(reinterpret_cast<uint64_t>(old_addr), &stack);
    if (old_len != 0 && (flags & MREMAP_DONTUNMAP) == 0) {
      ledger.remove(reinterpret_cast<uint64_t>(old_addr), page_end(old_addr, old_len), sink);
    }
    if (recorded) {
      ledger.add(reinterpret_cast<uint64_t>(p), page_end(p, new_len), stack, sink);
    } else {
      // Whatever was recorded where the mapping landed is gone.
      ledger.remove(reinterpret_cast<uint64_t>(p), page_end(p, new_len), sink);
    }
  }
  errno = saved;
  return p;
}
