/* map_steps: memory mapped outside the heap, step by step.
 *
 *   map_steps [STEPS]     (default 12)
 *
 * Each step leaks one anonymous 64 KiB mapping (the planted leak, at
 * LEAK_LINE), and makes and takes back others the ways real programs do:
 * a munmap of the middle of a mapping and then of its two ends, a mapping
 * grown and shrunk again by mremap (moving it), one moved to a fixed
 * address, a MAP_FIXED mapping over part of another, and file mappings,
 * PROT_NONE reservations and a mapping made by a raw system call, which are
 * not the program's allocations as memledger counts them. At the end a
 * mapping loses its middle and keeps its ends. What should still be mapped
 * at exit, as memledger counts it, is printed as EXPECT_LIVE.
 *
 * Output: LEAK_LINE, EXPECT_LIVE (bytes), then DONE. Exit status 0. */

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define KIB 1024u
#define LEAK_BYTES (64 * KIB)
#define ANON (MAP_PRIVATE | MAP_ANONYMOUS)

typedef void (*step_fn)(const char*);

static void* g_leaked[4096];
static int g_leaks;
static int g_leak_line;

static void* map_or_die(size_t bytes) {
  void* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, ANON, -1, 0);
  if (p == MAP_FAILED) abort();
  memset(p, 1, bytes);
  return p;
}

__attribute__((noinline)) static void leak_mapping(void) {
  g_leak_line = __LINE__ + 1;
  void* p = mmap(NULL, LEAK_BYTES, PROT_READ | PROT_WRITE, ANON, -1, 0); if (p == MAP_FAILED) abort();
  memset(p, 2, LEAK_BYTES);
  g_leaked[g_leaks++] = p;
}

/* A mapping unmapped in pieces: its middle first, then both ends at once
 * (one munmap over a hole and two pieces). */
__attribute__((noinline)) static void unmap_in_pieces(void) {
  char* p = map_or_die(256 * KIB);
  if (munmap(p + 64 * KIB, 64 * KIB) != 0) abort();
  if (munmap(p, 256 * KIB) != 0) abort();
}

/* A mapping grown (it may move) and shrunk, then moved to an address the
 * program reserved, then unmapped. */
__attribute__((noinline)) static void remap_and_move(void) {
  char* p = map_or_die(128 * KIB);
  char* q = mremap(p, 128 * KIB, 1024 * KIB, MREMAP_MAYMOVE);
  if (q == MAP_FAILED) abort();
  memset(q, 3, 1024 * KIB);
  char* r = mremap(q, 1024 * KIB, 96 * KIB, 0);
  if (r != q) abort();
  char* target = mmap(NULL, 96 * KIB, PROT_NONE, ANON, -1, 0);
  if (target == MAP_FAILED) abort();
  char* moved = mremap(r, 96 * KIB, 96 * KIB, MREMAP_MAYMOVE | MREMAP_FIXED, target);
  if (moved != target || moved[0] != 3) abort();
  if (munmap(moved, 96 * KIB) != 0) abort();
}

/* A MAP_FIXED anonymous mapping over the middle of another, then the whole
 * range unmapped; a file mapped over part of one replaces that part. */
__attribute__((noinline)) static void map_over(void) {
  char* p = map_or_die(192 * KIB);
  if (mmap(p + 64 * KIB, 64 * KIB, PROT_READ | PROT_WRITE, ANON | MAP_FIXED, -1, 0) != p + 64 * KIB) abort();
  int fd = open("/proc/self/exe", O_RDONLY);
  if (fd < 0) abort();
  if (mmap(p, 4096, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) != p) abort();
  close(fd);
  if (munmap(p, 192 * KIB) != 0) abort();
}

/* Not memory the program allocates as memledger counts it: a file mapping
 * and a PROT_NONE reservation (both kept: they would grow per step), and
 * memory from a raw system call that no hook sees, unmapped through libc. */
__attribute__((noinline)) static void not_counted(void) {
  int fd = open("/proc/self/exe", O_RDONLY);
  if (fd < 0) abort();
  if (mmap(NULL, 8192, PROT_READ, MAP_PRIVATE, fd, 0) == MAP_FAILED) abort();
  close(fd);
  if (mmap(NULL, 1024 * KIB, PROT_NONE, ANON, -1, 0) == MAP_FAILED) abort();
  void* raw = (void*)syscall(SYS_mmap, NULL, 128 * KIB, PROT_READ | PROT_WRITE, ANON, -1, 0);
  if (raw == MAP_FAILED) abort();
  if (munmap(raw, 128 * KIB) != 0) abort();
}

int main(int argc, char** argv) {
  const int steps = argc > 1 ? atoi(argv[1]) : 12;
  if (steps < 1 || steps > 4000) return 2;
  step_fn step = (step_fn)dlsym(RTLD_DEFAULT, "memledger_step");
  /* A mapping that failed is not recorded, and errno is the kernel's. */
  errno = 0;
  if (mmap(NULL, (size_t)1 << 62, PROT_READ | PROT_WRITE, ANON, -1, 0) != MAP_FAILED || errno != ENOMEM) return 3;
  for (int s = 1; s <= steps; ++s) {
    leak_mapping();
    unmap_in_pieces();
    remap_and_move();
    map_over();
    not_counted();
    if (step) step("map");
  }
  /* The last one keeps both its ends. */
  char* last = map_or_die(256 * KIB);
  if (munmap(last + 64 * KIB, 128 * KIB) != 0) abort();
  printf("LEAK_LINE=%d\nEXPECT_LIVE=%lu\nDONE\n", g_leak_line, (unsigned long)(steps * LEAK_BYTES + 128 * KIB));
  return 0;
}
