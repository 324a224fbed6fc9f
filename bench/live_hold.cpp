// Tracer memory against the number of live allocations: allocates N blocks
// of 32 bytes, keeps them all live, and prints its own peak RSS (VmHWM).
//
//   live_hold N
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: live_hold N\n");
    return 2;
  }
  const long n = std::atol(argv[1]);
  std::vector<void*> blocks;
  blocks.reserve(static_cast<size_t>(n));
  for (long i = 0; i < n; ++i) {
    void* p = std::malloc(32);
    std::memset(p, 1, 32);
    blocks.push_back(p);
  }
  long hwm_kib = -1;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f)) {
      if (std::strncmp(line, "VmHWM:", 6) == 0) hwm_kib = std::atol(line + 6);
    }
    std::fclose(f);
  }
  std::printf("live_hold: live=%ld maxrss_kib=%ld\n", n, hwm_kib);
  for (void* p : blocks) std::free(p);
  return 0;
}
