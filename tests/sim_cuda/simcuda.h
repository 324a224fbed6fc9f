/* Debug interface of the simulated CUDA driver (tests/sim_cuda), exported by
 * its libcuda.so.1 next to the driver API. Not part of CUDA: look these up
 * with dlsym so that the same code also runs against a real driver. */
#ifndef MEMLEDGER_SIMCUDA_H
#define MEMLEDGER_SIMCUDA_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct simcuda_stats_st {
  unsigned long long proc_address_lookups;   /* cuGetProcAddress answers with a function */
  unsigned long long calls_via_proc_address; /* calls through such a function */
  unsigned long long calls_direct;           /* calls through the exported symbols */
} simcuda_stats_t;

typedef struct simcuda_symbol_st {
  const char* base;   /* the name cuGetProcAddress is asked for: "cuMemAlloc" */
  const char* symbol; /* the exported name: "cuMemAlloc_v2" */
  int version;        /* first cudaVersion that cuGetProcAddress maps to it */
  int per_thread;     /* 1 for the per-thread default stream (_ptsz) variant */
} simcuda_symbol_t;

simcuda_stats_t simcuda_stats(void);

/* Calls of one exported function by name: 0 and both counts, or -1. */
int simcuda_symbol_calls(const char* symbol, unsigned long long* direct, unsigned long long* via_proc_address);

/* The exported driver functions: fills up to `capacity` entries, returns how
 * many there are. */
int simcuda_symbols(simcuda_symbol_t* out, int capacity);

/* Bytes counted against a device (what cuMemGetInfo subtracts from the
 * total), or -1 before cuInit or for a bad ordinal. */
long long simcuda_device_held(int device);

#ifdef __cplusplus
}
#endif

#endif
