/* memledger's C ABI. Programs need not link against memledger: resolve these
 * with dlsym(RTLD_DEFAULT, "memledger_step") and call them when non-NULL.
 * Every function is a no-op when the process is not traced. */
#ifndef MEMLEDGER_H
#define MEMLEDGER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the end of one training step (label may be NULL). */
void memledger_step(const char *label);
/* Marks the end of one step because the program took its next batch from a
 * data loader (the Python module calls it from torch.utils.data). Ignored
 * once any other step source is in use: markers, --step-interval, NVTX or
 * kernel steps. */
void memledger_loader_step(const char *label);
/* Records one fact about the software stack, e.g. ("framework.torch.cuda",
 * "12.1"): shown in the report's environment block. The Python module
 * writes the frameworks' builds with it; keys are listed in trace_format.h. */
void memledger_note(const char *key, const char *value);
/* For a SIGTERM handler that ends the process itself (the Python module's,
 * which finds retention paths first): from now until SIGTERM's action is set
 * again, a SIGTERM handed to the program's handler also starts a deadline of
 * deadline_ms; if the process is still alive then (its handler could not
 * run: the main thread blocked in native code), SIGTERM takes its default
 * action. 0 clears it. Returns 0, or -1 when memledger does not handle
 * SIGTERM in this process (not traced, or SIGTERM ignored). */
int memledger_defer_sigterm(int deadline_ms);
/* 1 when this process is being traced, else 0. */
int memledger_active(void);
/* The threads memledger runs in this process now (its writer and the thread
 * that reads the list of loaded objects): the Python module leaves them out
 * where CPython counts the program's threads at os.fork(). */
int memledger_own_threads(void);
/* Writes everything recorded so far to the trace (waits up to 2 s). */
void memledger_flush(void);
/* The run folder the traces go to, or NULL when not traced. */
const char *memledger_run_dir(void);

/* This process's memory as the tracer knows it now, for a program that
 * checks itself (a test's growth, a step's budget): a few relaxed loads and
 * one read of the allocator's statistics, cheap enough for every step. Kinds
 * are indexed host, device (all GPUs), managed, pinned host. Live: bytes
 * allocated and not yet freed; held: bytes the allocators hold from the
 * system (host: from the program's allocator, glibc mallinfo2, jemalloc
 * stats.resident, tcmalloc heap size less its free and unmapped pages,
 * mimalloc's committed bytes; 0 when it offers none; device: allocations rounded
 * to the 2 MiB granularity, VMM physical memory, memory pools' reserve at
 * their last sample). Host live bytes are exact (usable sizes) in sampled
 * mode too: only the trace's per-site figures are estimates there. */
#define MEMLEDGER_LIVE_MAX_GPUS 16
#define MEMLEDGER_LIVE_TRACING 1u      /* traced: the figures below are meaningful */
#define MEMLEDGER_LIVE_HOST 2u         /* the host heap is tracked (not --host off) */
#define MEMLEDGER_LIVE_HOST_SAMPLED 4u /* sampled host mode (the trace's host sites are estimates) */
struct memledger_live {
  uint32_t size;  /* in: sizeof(struct memledger_live); at most that much is written */
  uint32_t flags; /* MEMLEDGER_LIVE_*; 0 when not traced */
  uint64_t seq;   /* the trace's sequence number now: later events have larger ones */
  uint64_t steps; /* steps ended so far */
  int64_t live[4];
  uint64_t held[4];
  uint32_t gpus;  /* entries of device_live/device_held in use */
  uint32_t reserved;
  int64_t device_live[MEMLEDGER_LIVE_MAX_GPUS];
  uint64_t device_held[MEMLEDGER_LIVE_MAX_GPUS];
};
/* Fills *out: 0 when traced, 1 when not (flags 0, figures 0), -1 when out is
 * NULL or out->size is too small for the fields up to `held`. */
int memledger_live(struct memledger_live *out);

#ifdef __cplusplus
}
#endif

#endif
