/* memledger's C ABI. Programs need not link against memledger: resolve these
 * with dlsym(RTLD_DEFAULT, "memledger_step") and call them when non-NULL.
 * Every function is a no-op when the process is not traced. */
#ifndef MEMLEDGER_H
#define MEMLEDGER_H

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the end of one training step (label may be NULL). */
void memledger_step(const char *label);
/* 1 when this process is being traced, else 0. */
int memledger_active(void);
/* Writes everything recorded so far to the trace (waits up to 2 s). */
void memledger_flush(void);
/* The run folder the traces go to, or NULL when not traced. */
const char *memledger_run_dir(void);

#ifdef __cplusplus
}
#endif

#endif
