// Cost of the CUDA hooks per device allocation/free pair, against the
// simulated driver (tests/sim_cuda), and the step time of a small training
// loop. Run untraced and under memledger by bench/run_benchmarks.py, which
// prints the ratios.
//
//   device_bench pairs N      N cuMemAllocAsync/cuMemFreeAsync pairs made
//                             20 frames deep; prints ns per pair
//   device_bench train STEPS  a training-like loop: per step 64 device
//                             allocations and frees and ~2 ms of host work
#include <cuda.h>
#include <dlfcn.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "device_bench: %s failed: %d\n", what, static_cast<int>(r));
    std::exit(1);
  }
}

CUstream g_stream;

__attribute__((noinline)) void alloc_free_pairs(long n) {
  for (long i = 0; i < n; ++i) {
    CUdeviceptr p;
    check(cuMemAllocAsync(&p, 4096 + static_cast<size_t>(i % 64) * 512, g_stream), "cuMemAllocAsync");
    check(cuMemFreeAsync(p, g_stream), "cuMemFreeAsync");
  }
}

// Calls `alloc_free_pairs` `depth` frames down, so each allocation carries a
// native stack of about 20 frames, as in a framework.
__attribute__((noinline)) void at_depth(int depth, long n) {
  if (depth == 0) {
    alloc_free_pairs(n);
    return;
  }
  at_depth(depth - 1, n);
  __asm__ volatile("" ::: "memory");  // keep the recursion a real call chain
}

volatile double g_sink;

__attribute__((noinline)) void host_work() {
  double acc = 0;
  for (int i = 0; i < 400000; ++i) acc += static_cast<double>(i % 7) * 0.5;
  g_sink = acc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "pairs") != 0 && std::strcmp(argv[1], "train") != 0)) {
    std::fprintf(stderr, "usage: device_bench pairs N | device_bench train STEPS\n");
    return 2;
  }
  const long n = std::atol(argv[2]);
  check(cuInit(0), "cuInit");
  CUcontext ctx;
  check(cuDevicePrimaryCtxRetain(&ctx, 0), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  check(cuStreamCreate(&g_stream, 0), "cuStreamCreate");
  auto step = reinterpret_cast<void (*)(const char*)>(dlsym(RTLD_DEFAULT, "memledger_step"));
  if (std::strcmp(argv[1], "pairs") == 0) {
    at_depth(16, 1000);  // warm up the pool and the stack table
    const double t0 = now_s();
    at_depth(16, n);
    const double dt = now_s() - t0;
    std::printf("ns_per_pair=%.1f\n", dt / static_cast<double>(n) * 1e9);
    return 0;
  }
  std::vector<CUdeviceptr> live;
  const double t0 = now_s();
  for (long s = 0; s < n; ++s) {
    for (int i = 0; i < 64; ++i) {
      CUdeviceptr p;
      check(cuMemAllocAsync(&p, (1u << 20) + static_cast<size_t>(i) * 4096, g_stream), "cuMemAllocAsync");
      live.push_back(p);
    }
    host_work();
    for (CUdeviceptr p : live) check(cuMemFreeAsync(p, g_stream), "cuMemFreeAsync");
    live.clear();
    if (step) step("train");
  }
  const double dt = now_s() - t0;
  std::printf("ms_per_step=%.3f\n", dt / static_cast<double>(n) * 1e3);
  return 0;
}
