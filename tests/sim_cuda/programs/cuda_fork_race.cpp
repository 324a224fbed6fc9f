// cuda_fork_race: forks while another thread allocates from a CUDA memory
// pool without pause (cuMemAllocFromPoolAsync, cuMemFreeAsync), as a
// program with an allocator thread and forked data loader workers does. The
// hooks of memledger look the pool up in a table under a lock on every such
// allocation; a fork that lands while the other thread holds it gives the
// child the lock held, with no thread to release it. Each child allocates
// from the pool once and exits. A child that has not exited after five
// seconds is counted as hung and killed.
//
//   cuda_fork_race [FORKS]     (default 200)
//
// Output: FORKS=N, HUNG=N, ALLOCS=N (the other thread's allocations), a line each. Exit
// status 0 when no child hung, 1 otherwise, 2 on a CUDA error.

#include <cuda.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace {

void check(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  std::fprintf(stderr, "FATAL %s: %d\n", what, static_cast<int>(result));
  std::exit(2);
}

// Whether `pid` exited (and was reaped) within `seconds`.
bool exited_within(pid_t pid, int seconds) {
  for (int i = 0; i < seconds * 1000; ++i) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return true;
    timespec pause = {0, 1000000};
    nanosleep(&pause, nullptr);
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const int forks = argc > 1 ? std::atoi(argv[1]) : 200;
  check(cuInit(0), "cuInit");
  CUdevice device;
  check(cuDeviceGet(&device, 0), "cuDeviceGet");
  CUcontext context;
  check(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(context), "cuCtxSetCurrent");
  CUmemPoolProps props = {};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool pool;
  check(cuMemPoolCreate(&pool, &props), "cuMemPoolCreate");
  CUstream stream;
  check(cuStreamCreate(&stream, CU_STREAM_DEFAULT), "cuStreamCreate");

  std::atomic<bool> stop{false};
  std::atomic<long> allocs{0};
  std::thread allocator([&] {
    check(cuCtxSetCurrent(context), "cuCtxSetCurrent");
    while (!stop.load(std::memory_order_relaxed)) {
      CUdeviceptr p = 0;
      check(cuMemAllocFromPoolAsync(&p, 4096, pool, stream), "cuMemAllocFromPoolAsync");
      check(cuMemFreeAsync(p, stream), "cuMemFreeAsync");
      allocs.fetch_add(1, std::memory_order_relaxed);
    }
  });
  while (allocs.load() == 0) std::this_thread::yield();

  int hung = 0;
  for (int i = 0; i < forks; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      CUdeviceptr p = 0;
      cuMemAllocFromPoolAsync(&p, 4096, pool, stream);
      _exit(0);
    }
    if (pid < 0) {
      std::perror("fork");
      break;
    }
    if (!exited_within(pid, 5)) {
      ++hung;
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  stop.store(true);
  allocator.join();
  std::printf("FORKS=%d\nHUNG=%d\nALLOCS=%ld\n", forks, hung, allocs.load());
  return hung == 0 ? 0 : 1;
}
