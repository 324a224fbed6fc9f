// storm: eight threads hammer every host allocation function at once, with a
// deterministic PRNG, and leave a deterministic set of blocks live. The test
// compares the live host bytes between the two step markers with the exact
// total printed here (--host full records requested bytes).
//
//   storm [OPS_PER_THREAD]     (default 20000)
//
// Step 1 is marked before the threads start working and step 2 after they
// have finished. Thread creation and exit allocate too (glibc's DTV, which it
// keeps with the cached stack), so the threads are created before step 1 and
// joined after step 2; between the two markers only the storm itself runs.
//
// Output: EXPECTED_LIVE=N (requested bytes left live by the storm),
// ALLOCS=N and FREES=N (calls between the markers; a realloc of a live block
// counts as one of each, as the tracer records it), OPS=N, CHECKSUM=N.

#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

using StepFn = void (*)(const char*);

constexpr int kThreads = 8;
constexpr int kSlots = 256;

struct Block {
  void* ptr;
  size_t size;  // requested bytes
};

struct Worker {
  pthread_t thread;
  int index;
  long ops;
  uint64_t live_bytes;  // requested bytes this worker leaves live
  uint64_t allocs;      // allocation calls (realloc counts as a free and an allocation)
  uint64_t frees;       // free calls
  uint64_t checksum;
};

pthread_barrier_t g_start;  // main has marked step 1
pthread_barrier_t g_done;   // every worker has finished its storm
pthread_barrier_t g_exit;   // main has marked step 2

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// One allocation with the function `method` picks.
__attribute__((noinline)) void* allocate(unsigned method, size_t size) {
  void* p = nullptr;
  switch (method % 8) {
    case 0: p = std::malloc(size); break;
    case 1: p = std::calloc(1 + size % 7, size / (1 + size % 7) ? size / (1 + size % 7) : 1); break;
    case 2: p = std::realloc(nullptr, size); break;
    case 3:
      if (posix_memalign(&p, 64, size) != 0) p = nullptr;
      break;
    case 4: p = aligned_alloc(32, (size + 31) & ~size_t{31}); break;
    case 5: p = memalign(128, size); break;
    case 6: p = valloc(size); break;
    case 7: p = reallocarray(nullptr, size, 1); break;
  }
  if (p == nullptr) {
    std::fprintf(stderr, "storm: allocation failed\n");
    std::abort();
  }
  return p;
}

// The bytes `allocate(method, size)` requests (calloc and aligned_alloc round).
size_t requested(unsigned method, size_t size) {
  switch (method % 8) {
    case 1: {
      const size_t count = 1 + size % 7;
      const size_t each = size / count ? size / count : 1;
      return count * each;
    }
    case 4: return (size + 31) & ~size_t{31};
    default: return size;
  }
}

void* storm(void* arg) {
  Worker& w = *static_cast<Worker*>(arg);
  Block blocks[kSlots] = {};
  uint64_t rng = 0x1234567ull + static_cast<uint64_t>(w.index) * 7919;
  pthread_barrier_wait(&g_start);
  for (long op = 0; op < w.ops; ++op) {
    const uint64_t r = splitmix64(rng);
    Block& b = blocks[r % kSlots];
    const unsigned method = static_cast<unsigned>((r >> 8) & 0xff);
    const size_t size = 1 + static_cast<size_t>((r >> 16) % 3000);
    if (b.ptr == nullptr) {
      b.ptr = allocate(method, size);
      b.size = requested(method, size);
      ++w.allocs;
      static_cast<unsigned char*>(b.ptr)[0] = static_cast<unsigned char>(r);
    } else if (method % 3 == 0) {
      void* p = std::realloc(b.ptr, size);
      if (p == nullptr) std::abort();
      b.ptr = p;
      b.size = size;
      ++w.allocs;
      ++w.frees;
    } else {
      w.checksum += static_cast<unsigned char*>(b.ptr)[0];
      std::free(b.ptr);
      b.ptr = nullptr;
      ++w.frees;
    }
  }
  // Keep every fifth slot, free the rest.
  for (int i = 0; i < kSlots; ++i) {
    if (blocks[i].ptr == nullptr) continue;
    if (i % 5 == 0) {
      w.live_bytes += blocks[i].size;
    } else {
      std::free(blocks[i].ptr);
      ++w.frees;
    }
  }
  pthread_barrier_wait(&g_done);
  pthread_barrier_wait(&g_exit);
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const long ops = argc > 1 ? std::atol(argv[1]) : 20000;
  auto step_marker = reinterpret_cast<StepFn>(dlsym(RTLD_DEFAULT, "memledger_step"));
  pthread_barrier_init(&g_start, nullptr, kThreads + 1);
  pthread_barrier_init(&g_done, nullptr, kThreads + 1);
  pthread_barrier_init(&g_exit, nullptr, kThreads + 1);
  static Worker workers[kThreads];
  for (int i = 0; i < kThreads; ++i) {
    workers[i].index = i;
    workers[i].ops = ops;
    if (pthread_create(&workers[i].thread, nullptr, storm, &workers[i]) != 0) {
      std::fprintf(stderr, "storm: pthread_create failed\n");
      return 1;
    }
  }
  if (step_marker) step_marker("before");
  pthread_barrier_wait(&g_start);
  pthread_barrier_wait(&g_done);
  if (step_marker) step_marker("after");
  pthread_barrier_wait(&g_exit);
  uint64_t expected = 0, checksum = 0, allocs = 0, frees = 0;
  for (Worker& w : workers) {
    pthread_join(w.thread, nullptr);
    expected += w.live_bytes;
    checksum += w.checksum;
    allocs += w.allocs;
    frees += w.frees;
  }
  std::printf("EXPECTED_LIVE=%llu\nALLOCS=%llu\nFREES=%llu\nOPS=%ld\nCHECKSUM=%llu\n",
              static_cast<unsigned long long>(expected), static_cast<unsigned long long>(allocs),
              static_cast<unsigned long long>(frees), ops * kThreads, static_cast<unsigned long long>(checksum));
  return 0;
}
