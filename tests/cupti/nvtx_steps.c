/* Training-loop shape marked with NVTX ranges only: each step is a range
 * "train_step N" holding a nested "data_load" range, and keeps a 64 KiB
 * block by mistake. Needs no GPU: NVTX hands its calls to the injection
 * library named by NVTX_INJECTION64_PATH, or to nobody.
 * Usage: nvtx_steps STEPS [start-end] (start-end: nvtxRangeStartA/End). */
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Volatile: the compiler may not drop allocations it can see unused. */
void* volatile kept[4096];
void* volatile batch_sink;

__attribute__((noinline)) static void keep_history(int step) {
  void* block = malloc(64 * 1024);
  memset(block, step, 64 * 1024);
  kept[step % 4096] = block;
}

int main(int argc, char** argv) {
  const int steps = argc > 1 ? atoi(argv[1]) : 10;
  const int start_end = argc > 2 && strcmp(argv[2], "start-end") == 0;
  for (int i = 0; i < steps; ++i) {
    char name[64];
    snprintf(name, sizeof name, "train_step %d", i + 1);
    nvtxRangeId_t id = 0;
    if (start_end) {
      id = nvtxRangeStartA(name);
    } else {
      nvtxRangePushA(name);
    }
    nvtxRangePushA("data_load");
    batch_sink = malloc(4096);
    memset(batch_sink, 1, 4096);
    free(batch_sink);
    nvtxRangePop();
    keep_history(i);
    if (start_end) {
      nvtxRangeEnd(id);
    } else {
      nvtxRangePop();
    }
  }
  printf("DONE steps=%d\n", steps);
  return 0;
}
