// leak_steps: a training-like loop with one planted leak, for the integration
// tests. Each step makes about a thousand short-lived allocations (freed
// before the step ends) from two functions, then leaks exactly LEAK_BYTES in
// `plant_leak`, then marks the step end with memledger_step("train").
//
//   leak_steps [STEPS [LEAK_BYTES]] [--sleep-ms N] [--many-small] [--no-work] [--exit-code N]
//
// STEPS defaults to 40, LEAK_BYTES to 4096. --many-small makes the leak out
// of 1 KiB pieces (the last one smaller when LEAK_BYTES is not a multiple).
// --sleep-ms sleeps N ms at the end of every step. --exit-code N: main returns N. --no-work
// skips the short-lived allocations: steps then follow each other within microseconds.
//
// Machine-readable output on stdout (flushed line by line):
//   LEAK_FILE=leak_steps.cpp   LEAK_LINE=NN   the planted allocation's line
//   TRACED=0|1                 memledger_step was found
//   STEP_DONE i t_ns           after step i's marker (CLOCK_MONOTONIC)
//   DONE steps=N leaked=B      at the end

#include <dlfcn.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using StepFn = void (*)(const char*);

// The leaked blocks are chained through their first word, so keeping them
// costs no other allocation (a growing std::vector would be a second
// growing site).
struct Piece {
  Piece* next;
};
Piece* g_leaked = nullptr;
void* volatile g_sink = nullptr;  // keeps the compiler from dropping tiny blocks

// The planted leak's malloc is on the line kLeakLine names (checked by the
// tests against this file: that line carries the "PLANTED LEAK" comment).
constexpr int kLeakLine = __LINE__ + 6;

__attribute__((noinline, noipa)) size_t plant_leak(size_t bytes, size_t piece_size) {
  size_t leaked = 0;
  while (leaked < bytes) {
    const size_t n = bytes - leaked < piece_size ? bytes - leaked : piece_size;
    char* block = static_cast<char*>(std::malloc(n));  // PLANTED LEAK
    if (block == nullptr) std::abort();
    std::memset(block, 0x5a, n);
    if (n >= sizeof(Piece)) {
      reinterpret_cast<Piece*>(block)->next = g_leaked;
      g_leaked = reinterpret_cast<Piece*>(block);
    }
    g_sink = block;
    leaked += n;
  }
  return leaked;
}

// Short-lived: activations built and dropped within the step.
__attribute__((noinline)) float forward_pass(int step) {
  std::vector<std::vector<float>> activations;
  activations.reserve(500);
  float sum = 0;
  for (int i = 0; i < 500; ++i) {
    activations.emplace_back(static_cast<size_t>(16 + (i * 37 + step) % 1000), 1.0f);
    sum += activations.back()[0];
  }
  return sum;
}

// Short-lived: strings of a "tokenizer".
__attribute__((noinline)) size_t tokenize(int step) {
  size_t total = 0;
  for (int i = 0; i < 500; ++i) {
    char* token = static_cast<char*>(std::malloc(static_cast<size_t>(24 + (i * 13 + step) % 200)));
    if (token == nullptr) std::abort();
    std::snprintf(token, 24, "tok%d_%d", step, i);
    total += std::strlen(token);
    std::free(token);
  }
  return total;
}

uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

int main(int argc, char** argv) {
  long steps = 40;
  long leak_bytes = 4096;
  long sleep_ms = 0;
  bool many_small = false;
  bool work = true;
  int exit_code = 0;
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--sleep-ms") == 0 && i + 1 < argc) {
      sleep_ms = std::atol(argv[++i]);
    } else if (std::strcmp(argv[i], "--many-small") == 0) {
      many_small = true;
    } else if (std::strcmp(argv[i], "--no-work") == 0) {
      work = false;
    } else if (std::strcmp(argv[i], "--exit-code") == 0 && i + 1 < argc) {
      exit_code = std::atoi(argv[++i]);
    } else if (positional == 0) {
      steps = std::atol(argv[i]);
      ++positional;
    } else if (positional == 1) {
      leak_bytes = std::atol(argv[i]);
      ++positional;
    } else {
      std::fprintf(stderr, "usage: %s [STEPS [LEAK_BYTES]] [--sleep-ms N] [--many-small] [--no-work] [--exit-code N]\n",
                   argv[0]);
      return 2;
    }
  }
  auto step_marker = reinterpret_cast<StepFn>(dlsym(RTLD_DEFAULT, "memledger_step"));
  std::printf("LEAK_FILE=%s\nLEAK_LINE=%d\nTRACED=%d\n", base_name(__FILE__), kLeakLine, step_marker ? 1 : 0);
  std::fflush(stdout);

  const size_t piece = many_small ? 1024 : static_cast<size_t>(leak_bytes > 0 ? leak_bytes : 1);
  double checksum = 0;
  size_t leaked = 0;
  for (long step = 1; step <= steps; ++step) {
    if (work) {
      checksum += forward_pass(static_cast<int>(step));
      checksum += static_cast<double>(tokenize(static_cast<int>(step)));
    }
    if (leak_bytes > 0) leaked += plant_leak(static_cast<size_t>(leak_bytes), piece);
    if (step_marker) step_marker("train");
    std::printf("STEP_DONE %ld %llu\n", step, static_cast<unsigned long long>(monotonic_ns()));
    std::fflush(stdout);
    if (sleep_ms > 0) {
      timespec pause = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000};
      while (nanosleep(&pause, &pause) != 0) {
      }
    }
  }
  std::printf("DONE steps=%ld leaked=%zu checksum=%.0f\n", steps, leaked, checksum);
  return exit_code;
}
