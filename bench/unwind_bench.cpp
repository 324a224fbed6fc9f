// The unwinder alone: how long fast_backtrace() takes to walk a stack of
// frames without frame pointers, taking every frame's rule from the shared
// table, and following the thread's last walk (UnwindMemo).
//
//   build/bench/unwind_bench [--depth D] [--spread S] [--walks N]
//
// Each walk is made from a recursion D + r frames deep, r drawn between 0
// and S - 1 at each call (S = 1: the same depth every time). The figures
// are the best of 15 rounds of N walks, with and without the memo, and the
// recursion alone (the same calls without a walk), in ns per call.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "unwinder.h"

namespace {

using memledger::interposer::fast_backtrace;
using memledger::interposer::UnwindMemo;

UnwindMemo g_memo;
bool g_use_memo = false;
bool g_walk = true;
long g_frames = 0;

__attribute__((noinline)) int leaf() {
  if (!g_walk) return 1;
  void* frames[128];
  const int n = fast_backtrace(frames, 64, 0, 0, g_use_memo ? &g_memo : nullptr);
  g_frames += n;
  return n;
}

__attribute__((noinline)) int nest(int depth) {
  if (depth == 0) return leaf();
  const int r = nest(depth - 1);
  asm volatile("" ::: "memory");  // not a tail call: each level keeps its frame
  return r + 1;
}

long parse(const char* name, const char* value) {
  char* end = nullptr;
  const long v = value != nullptr ? strtol(value, &end, 10) : 0;
  if (value == nullptr || *end != '\0' || v <= 0) {
    fprintf(stderr, "unwind_bench: %s needs a positive number\n", name);
    exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  long depth = 20, spread = 21, walks = 200000;
  for (int i = 1; i < argc; ++i) {
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (strcmp(argv[i], "--depth") == 0) {
      depth = parse(argv[i], value), ++i;
    } else if (strcmp(argv[i], "--spread") == 0) {
      spread = parse(argv[i], value), ++i;
    } else if (strcmp(argv[i], "--walks") == 0) {
      walks = parse(argv[i], value), ++i;
    } else {
      fprintf(stderr, "usage: unwind_bench [--depth D] [--spread S] [--walks N]\n");
      return 2;
    }
  }
  double best[3] = {1e18, 1e18, 1e18};  // table, memo, recursion alone
  long frames = 0;
  for (int round = 0; round < 15; ++round) {
    for (int mode = 0; mode < 3; ++mode) {
      g_use_memo = mode == 1;
      g_walk = mode != 2;
      g_frames = 0;
      unsigned r = 1;
      const auto start = std::chrono::steady_clock::now();
      for (long i = 0; i < walks; ++i) {
        r = r * 1103515245u + 12345u;
        nest(static_cast<int>(depth + (r >> 16) % spread));
      }
      const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
                        static_cast<double>(walks);
      if (ns < best[mode]) best[mode] = ns;
      if (mode == 0) frames = g_frames;
    }
  }
  printf("unwind_bench: depth=%ld spread=%ld frames_per_walk=%.1f table_ns=%.1f memo_ns=%.1f recursion_ns=%.1f\n",
         depth, spread, static_cast<double>(frames) / static_cast<double>(walks), best[0], best[1], best[2]);
  return 0;
}
