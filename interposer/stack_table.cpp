#include "stack_table.h"

#include <sys/mman.h>

#include "owned_use.h"

namespace memledger::interposer {
namespace {

void* map_reserve(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

}  // namespace

bool StackTable::init() {
  words_ = static_cast<uintptr_t*>(map_reserve(sizeof(uintptr_t) * kMaxNodes));
  links_ = static_cast<Links*>(map_reserve(sizeof(Links) * kMaxNodes));
  return words_ != nullptr && links_ != nullptr;
}

// The child of `parent` for `word`, added when missing. Children are a
// list pushed at its head: a thread that loses the race to push looks
// through what was pushed meanwhile, so one word never gets two nodes.
uint32_t StackTable::child(uint32_t parent, uintptr_t word) {
  Links& up = links_[parent];
  uint32_t head = up.first_child.load(std::memory_order_acquire);
  uint32_t seen_until = 0;  // the part of the list already looked through starts here
  uint32_t mine = 0;
  for (;;) {
    for (uint32_t id = head; id != seen_until; id = links_[id].next_sibling.load(std::memory_order_relaxed)) {
      if (words_[id] == word) {
        // Lost a race: `mine` stays unlinked, an id no stack uses.
        if (mine != 0) publishing_.fetch_sub(1, std::memory_order_acq_rel);
        return id;
      }
    }
    if (mine == 0) {
      publishing_.fetch_add(1, std::memory_order_acq_rel);
      mine = next_id_.fetch_add(1, std::memory_order_relaxed);
      if (mine >= kMaxNodes) {
        next_id_.store(kMaxNodes, std::memory_order_relaxed);  // stays full
        publishing_.fetch_sub(1, std::memory_order_acq_rel);
        return 0;
      }
      words_[mine] = word;
      links_[mine].parent = parent;
      links_[mine].first_child.store(0, std::memory_order_relaxed);
    }
    links_[mine].next_sibling.store(head, std::memory_order_relaxed);
    seen_until = head;
    if (up.first_child.compare_exchange_strong(head, mine, std::memory_order_acq_rel, std::memory_order_acquire)) {
      publishing_.fetch_sub(1, std::memory_order_acq_rel);
      return mine;
    }
    // `head` is now the new head: look through the nodes pushed since.
  }
}

uint32_t StackTable::intern(const uintptr_t* frames, uint32_t depth, uint32_t python, PathCache* cache) {
  if (words_ == nullptr || depth == 0) return 0;
  OwnedUse use(cache);
  if (depth > kMaxDepth) depth = kMaxDepth;
  if (python > depth) python = depth;
  // The path: Python frames outermost first, then native frames outermost
  // first (read from `frames` in place: most of it is only compared).
  auto path = [&](uint32_t i) { return i < python ? frames[python - 1 - i] : frames[depth - 1 - (i - python)]; };

  uint32_t shared = 0;
  uint32_t node = 0;
  if (cache != nullptr) {
    // Compared in two plain loops (one per part of the path): this runs
    // over the whole stack at every allocation.
    const uint32_t limit = cache->depth < depth ? cache->depth : depth;
    const uintptr_t* cached = cache->words;
    const uint32_t in_python = limit < python ? limit : python;
    while (shared < in_python && cached[shared] == frames[python - 1 - shared]) ++shared;
    if (shared == python) {
      const uintptr_t* native = frames + depth - 1 + python;  // native[-i] is path(i)
      while (shared < limit && cached[shared] == native[-static_cast<ptrdiff_t>(shared)]) ++shared;
    }
    if (shared > 0) node = cache->nodes[shared - 1];
  }
  for (uint32_t i = shared; i < depth; ++i) {
    const uintptr_t word = path(i);
    node = child(node, word);
    if (node == 0) {
      if (cache != nullptr) cache->depth = i;  // what is cached is still right
      return 0;
    }
    if (cache != nullptr) {
      cache->words[i] = word;
      cache->nodes[i] = node;
    }
  }
  if (cache != nullptr) cache->depth = depth;
  return node;
}

uint32_t StackTable::get(uint32_t id, uintptr_t* out) const {
  if (words_ == nullptr || id == 0 || id >= next_id_.load(std::memory_order_acquire) || id >= kMaxNodes) return 0;
  // From the node to the root: native frames innermost first, then Python
  // frames innermost first. The stack lists its Python frames first.
  uintptr_t walked[kMaxDepth];
  uint32_t n = 0;
  for (uint32_t at = id; at != 0 && n < kMaxDepth; at = links_[at].parent) walked[n++] = words_[at];
  uint32_t native = 0;
  while (native < n && (walked[native] >> 63) == 0) ++native;
  uint32_t depth = 0;
  for (uint32_t i = native; i < n; ++i) out[depth++] = walked[i];
  for (uint32_t i = 0; i < native; ++i) out[depth++] = walked[i];
  return depth;
}

}  // namespace memledger::interposer
