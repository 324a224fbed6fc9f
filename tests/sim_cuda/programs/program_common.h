// What the simulated-CUDA test programs share: arguments, the step marker,
// and the machine-readable lines the integration tests read.
//
//   PROGRAM STEPS LEAK_BYTES [MODE]
//
// Output on stdout, flushed line by line:
//   PROGRAM=name MODE=mode            what runs
//   LEAK_FILE=file LEAK_LINE=NN       the planted leaking allocation call
//   LEAK_PER_STEP=N                   bytes leaked per step (LEAK_BYTES, or
//                                     rounded up to whole VMM chunks)
//   TRACED=0|1                        memledger_step was found
//   SIM_DRIVER=0|1                    the simulated libcuda.so.1 is loaded
//   FREE_START=N TOTAL=N              device 0 after set-up (cuMemGetInfo)
//   STEP_DONE i t_ns                  after step i's marker (CLOCK_MONOTONIC)
//   FREE_END=N                        device 0 after the last step
//   OOM_REQUESTED=N OOM_ERROR=code OOM_ERROR_NAME=name   mode oom only
//   DONE steps=N
// Exit status: 0; 3 after the expected out-of-memory in mode oom (like a
// framework that raises on it); 1 on any unexpected CUDA error; 2 on usage.
#pragma once

#include <dlfcn.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace simcuda_programs {

inline constexpr int kOomExitCode = 3;
inline constexpr size_t kMiB = size_t{1} << 20;

struct Args {
  long steps = 10;
  size_t leak_bytes = 1 << 20;
  const char* mode = "normal";
};

inline Args parse_args(int argc, char** argv, const char* const* modes) {
  Args args;
  bool ok = argc >= 3 && argc <= 4;
  if (ok) {
    args.steps = std::atol(argv[1]);
    args.leak_bytes = static_cast<size_t>(std::atoll(argv[2]));
    if (argc == 4) args.mode = argv[3];
    bool known = false;
    for (const char* const* m = modes; *m != nullptr; ++m) known = known || std::strcmp(*m, args.mode) == 0;
    ok = known && args.steps >= 0;
  }
  if (!ok) {
    std::fprintf(stderr, "usage: %s STEPS LEAK_BYTES [MODE], MODE one of:", argv[0]);
    for (const char* const* m = modes; *m != nullptr; ++m) std::fprintf(stderr, " %s", *m);
    std::fprintf(stderr, "\n");
    std::exit(2);
  }
  return args;
}

inline bool mode_is(const Args& args, const char* mode) { return std::strcmp(args.mode, mode) == 0; }

inline const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

inline unsigned long long monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<unsigned long long>(ts.tv_sec) * 1000000000ull + static_cast<unsigned long long>(ts.tv_nsec);
}

// memledger's step marker when the program runs under it, else nullptr.
using StepFn = void (*)(const char*);
inline StepFn find_step_marker() { return reinterpret_cast<StepFn>(dlsym(RTLD_DEFAULT, "memledger_step")); }

// True when the libcuda.so.1 in this process is the simulator.
inline bool simulated_driver_loaded() {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  const bool simulated = driver != nullptr && dlsym(driver, "simcuda_stats") != nullptr;
  if (driver != nullptr) dlclose(driver);
  return simulated;
}

inline void print_header(const char* program, const Args& args, const char* file, int leak_line,
                         size_t leak_per_step, bool traced) {
  std::printf("PROGRAM=%s\nMODE=%s\nLEAK_FILE=%s\nLEAK_LINE=%d\nLEAK_PER_STEP=%zu\nTRACED=%d\nSIM_DRIVER=%d\n",
              program, args.mode, base_name(file), leak_line, leak_per_step, traced ? 1 : 0,
              simulated_driver_loaded() ? 1 : 0);
  std::fflush(stdout);
}

inline void end_step(StepFn marker, long step) {
  if (marker) marker("train");
  std::printf("STEP_DONE %ld %llu\n", step, monotonic_ns());
  std::fflush(stdout);
}

inline void print_value(const char* key, unsigned long long value) {
  std::printf("%s=%llu\n", key, value);
  std::fflush(stdout);
}

// Touches host-accessible memory, as a program filling a buffer would.
inline void touch(void* p, size_t bytes) {
  if (p != nullptr) std::memset(p, 0x5a, bytes < 4096 ? bytes : 4096);
}

}  // namespace simcuda_programs
