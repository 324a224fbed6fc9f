// own_new: a program that defines the global operator new(size_t) and
// operator delete(void*) itself (counting its calls, on malloc and free), as
// some programs do. The other forms (new[], delete[], sized delete) it leaves
// to libstdc++, which serves them through these two. Its definitions come
// before memledger's in the lookup order: every C++ allocation, whichever
// form, must still reach them, and their malloc and free calls are what
// memledger records. Each step churns through std::string, new[] and sized
// delete, then leaks LEAK_BYTES through new.
//
//   own_new [STEPS [LEAK_BYTES]]
//
// Output: LEAK_LINE, NEWS=..., DELETES=..., DONE; exit status 4.

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

// Leaving the sized delete to libstdc++ is the point here.
#pragma GCC diagnostic ignored "-Wsized-deallocation"

namespace {
unsigned long g_news = 0;
unsigned long g_deletes = 0;
}  // namespace

void* operator new(std::size_t size) {
  ++g_news;
  if (void* p = std::malloc(size != 0 ? size : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  if (p != nullptr) ++g_deletes;
  std::free(p);
}

namespace {

struct Piece {
  Piece* next;
};
Piece* g_kept = nullptr;
void* volatile g_sink = nullptr;

constexpr int kLeakLine = __LINE__ + 3;

__attribute__((noinline)) void plant_leak(size_t bytes) {
  auto* block = static_cast<Piece*>(::operator new(bytes));  // PLANTED LEAK
  std::memset(block, 0x5a, bytes);
  block->next = g_kept;
  g_kept = block;
}

__attribute__((noinline)) void churn(int step) {
  for (int i = 0; i < 200; ++i) {
    auto* s = new std::string(static_cast<size_t>(40 + (i + step) % 64), 'x');
    auto* d = new double[static_cast<size_t>(8 + i % 100)];
    g_sink = s;
    g_sink = d;
    delete[] d;
    delete s;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  const size_t leak = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 4096;
  auto step_end = reinterpret_cast<void (*)(const char*)>(dlsym(RTLD_DEFAULT, "memledger_step"));
  std::printf("LEAK_LINE=%d\n", kLeakLine);
  for (int step = 0; step < steps; ++step) {
    churn(step);
    plant_leak(leak);
    if (step_end != nullptr) step_end("train");
  }
  std::printf("NEWS=%lu\nDELETES=%lu\nDONE\n", g_news, g_deletes);
  return 4;
}
