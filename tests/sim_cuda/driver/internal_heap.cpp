#include "internal_heap.h"

#include <sys/mman.h>

#include <cstdlib>
#include <mutex>

namespace memledger::simcuda {
namespace {

// Size classes 16, 32, ... 64 KiB, each a free list carved from 1 MiB slabs;
// anything larger is its own mapping. Slabs are never returned: the driver's
// bookkeeping is small and its peak is what matters.
constexpr size_t kMinClass = 16;
constexpr int kClasses = 13;  // 16 << 12 == 64 KiB
constexpr size_t kMaxClass = kMinClass << (kClasses - 1);
constexpr size_t kSlabBytes = 1 << 20;

struct FreeBlock {
  FreeBlock* next;
};

struct Heap {
  std::mutex mu;
  FreeBlock* free_lists[kClasses] = {};
  char* slab_cursor = nullptr;
  char* slab_end = nullptr;
};

Heap& heap() {
  static Heap instance;  // trivially destructible members apart from the mutex
  return instance;
}

int size_class(size_t bytes) {
  int index = 0;
  size_t size = kMinClass;
  while (size < bytes) {
    size <<= 1;
    ++index;
  }
  return index;
}

void* map_pages(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();  // like operator new without exceptions
  return p;
}

}  // namespace

void* internal_alloc(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes > kMaxClass) return map_pages(bytes);
  const int index = size_class(bytes);
  const size_t size = kMinClass << index;
  Heap& h = heap();
  std::lock_guard lock(h.mu);
  if (FreeBlock* block = h.free_lists[index]) {
    h.free_lists[index] = block->next;
    return block;
  }
  if (h.slab_cursor == nullptr || static_cast<size_t>(h.slab_end - h.slab_cursor) < size) {
    h.slab_cursor = static_cast<char*>(map_pages(kSlabBytes));
    h.slab_end = h.slab_cursor + kSlabBytes;
  }
  void* block = h.slab_cursor;
  h.slab_cursor += size;
  return block;
}

void internal_free(void* block, size_t bytes) {
  if (block == nullptr) return;
  if (bytes == 0) bytes = 1;
  if (bytes > kMaxClass) {
    munmap(block, bytes);
    return;
  }
  const int index = size_class(bytes);
  Heap& h = heap();
  std::lock_guard lock(h.mu);
  auto* free_block = static_cast<FreeBlock*>(block);
  free_block->next = h.free_lists[index];
  h.free_lists[index] = free_block;
}

}  // namespace memledger::simcuda
