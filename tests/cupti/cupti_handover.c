/* A program with its own CUPTI client, as PyTorch's profiler is: it
 * subscribes to CUPTI (here the stand-in, tests/cupti/fake_cupti.cpp)
 * half-way through its steps. Device memory comes from the driver (dlopen +
 * dlsym, no CUDA headers needed): each step leaks LEAK bytes with
 * cuMemAlloc_v2.
 * cupti_handover is linked against libcupti. Built with CUPTI_CLIENT_LOCAL
 * (cupti_handover_local) it is not: it loads the client library CLIENT
 * (cupti_client.c) RTLD_LOCAL before cuInit, as `import torch` loads
 * libtorch_cuda.so and its libcupti, and subscribes through it.
 * Usage: cupti_handover STEPS LEAK; cupti_handover_local STEPS LEAK CLIENT.
 * Prints SUBSCRIBE=<CUptiResult>. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*Init)(unsigned);
typedef int (*DeviceGet)(int*, int);
typedef int (*RetainCtx)(void**, int);
typedef int (*SetCtx)(void*);
typedef int (*MemAlloc)(unsigned long long*, size_t);

typedef int (*Subscribe)(void**);
typedef int (*Unsubscribe)(void*);

#ifndef CUPTI_CLIENT_LOCAL
int cuptiSubscribe(void** subscriber, void* callback, void* userdata);
int cuptiUnsubscribe(void* subscriber);
static int linked_subscribe(void** subscriber) { return cuptiSubscribe(subscriber, NULL, NULL); }
#endif

int main(int argc, char** argv) {
  const int steps = argc > 1 ? atoi(argv[1]) : 10;
  const size_t leak = argc > 2 ? strtoull(argv[2], NULL, 10) : (1u << 20);
  void (*step)(const char*) = (void (*)(const char*))dlsym(RTLD_DEFAULT, "memledger_step");
#ifdef CUPTI_CLIENT_LOCAL
  void* client = argc > 3 ? dlopen(argv[3], RTLD_NOW | RTLD_LOCAL) : NULL;
  if (client == NULL) return 5;
  Subscribe subscribe = (Subscribe)dlsym(client, "cupti_client_subscribe");
  Unsubscribe unsubscribe = (Unsubscribe)dlsym(client, "cupti_client_unsubscribe");
  if (subscribe == NULL || unsubscribe == NULL) return 5;
#else
  Subscribe subscribe = linked_subscribe;
  Unsubscribe unsubscribe = cuptiUnsubscribe;
#endif
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
      printf("SUBSCRIBE=%d\n", subscribe(&subscriber));
    }
    unsigned long long p = 0;
    if (mem_alloc(&p, leak) != 0) return 4;
    if (step) step("train");
  }
  unsubscribe(subscriber);
  printf("DONE steps=%d\n", steps);
  return 0;
}
