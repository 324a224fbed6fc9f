/* A program with its own CUPTI client, as PyTorch's profiler is: linked
 * against libcupti (here the stand-in, tests/cupti/fake_cupti.cpp), it
 * subscribes to CUPTI half-way through its steps. Device memory comes from
 * the driver (dlopen + dlsym, no CUDA headers needed): each step leaks
 * LEAK bytes with cuMemAlloc_v2.
 * Usage: cupti_handover STEPS LEAK. Prints SUBSCRIBE=<CUptiResult>. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*Init)(unsigned);
typedef int (*DeviceGet)(int*, int);
typedef int (*RetainCtx)(void**, int);
typedef int (*SetCtx)(void*);
typedef int (*MemAlloc)(unsigned long long*, size_t);

int cuptiSubscribe(void** subscriber, void* callback, void* userdata);
int cuptiUnsubscribe(void* subscriber);

int main(int argc, char** argv) {
  const int steps = argc > 1 ? atoi(argv[1]) : 10;
  const size_t leak = argc > 2 ? strtoull(argv[2], NULL, 10) : (1u << 20);
  void (*step)(const char*) = (void (*)(const char*))dlsym(RTLD_DEFAULT, "memledger_step");
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW);
  if (cuda == NULL) return 2;
  Init init = (Init)dlsym(cuda, "cuInit");
  DeviceGet device_get = (DeviceGet)dlsym(cuda, "cuDeviceGet");
  RetainCtx retain = (RetainCtx)dlsym(cuda, "cuDevicePrimaryCtxRetain");
  SetCtx set_current = (SetCtx)dlsym(cuda, "cuCtxSetCurrent");
  MemAlloc mem_alloc = (MemAlloc)dlsym(cuda, "cuMemAlloc_v2");
  int device = 0;
  void* ctx = NULL;
  if (init(0) != 0 || device_get(&device, 0) != 0 || retain(&ctx, device) != 0 || set_current(ctx) != 0) return 3;
  void* subscriber = NULL;
  for (int i = 0; i < steps; ++i) {
    if (i == steps / 2) {
      printf("SUBSCRIBE=%d\n", cuptiSubscribe(&subscriber, NULL, NULL));
    }
    unsigned long long p = 0;
    if (mem_alloc(&p, leak) != 0) return 4;
    if (step) step("train");
  }
  cuptiUnsubscribe(subscriber);
  printf("DONE steps=%d\n", steps);
  return 0;
}
