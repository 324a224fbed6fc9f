#include "stack_table.h"

#include <atomic>
#include <cstring>

#include <sys/mman.h>

#include "owned_use.h"
#include "pages.h"

namespace memledger::interposer {
namespace {

void* map_reserve(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

}  // namespace

bool StackTable::init() {
  nodes_ = static_cast<Node*>(map_reserve(sizeof(Node) * kMaxNodes));
  fan_ = static_cast<FanEntry*>(map_reserve(sizeof(FanEntry) * kFanParents));
  fan_region_ = static_cast<uint32_t*>(map_reserve(sizeof(uint32_t) * kFanRegionWords));
  words_ = static_cast<uint64_t*>(map_reserve(sizeof(uint64_t) * kMaxWords));
  word_index_ = static_cast<uint32_t*>(map_reserve(sizeof(uint32_t) * kWordIndexWords));
  if (nodes_ == nullptr || fan_ == nullptr || fan_region_ == nullptr || words_ == nullptr || word_index_ == nullptr) {
    return false;
  }
  word_index_used_.store(1, std::memory_order_relaxed);  // offset 0: none
  const size_t first = make_word_index(1u << 12, 0);
  word_index_at_.store(first, std::memory_order_release);
  return first != 0;
}

namespace {

inline size_t slot_of_word(uint64_t word, uint32_t capacity) {
  return static_cast<size_t>((word * 0x9e3779b97f4a7c15ull) >> 32) & (capacity - 1);
}

}  // namespace

size_t StackTable::make_word_index(uint32_t capacity, uint32_t upto) {
  const size_t at = word_index_used_.fetch_add(2 + size_t{capacity}, std::memory_order_relaxed);
  if (at + 2 + capacity > kWordIndexWords) {
    word_index_used_.store(kWordIndexWords, std::memory_order_relaxed);  // stays full
    return 0;
  }
  uint32_t* index = word_index_ + at;
  index[0] = capacity;
  // Not yet shared: filled without compare-and-swap, one entry a word (a
  // word with two slots keeps its first). A slot still being written
  // (zero) is left out.
  uint32_t held = 0;
  uint32_t* entries = index + 2;
  for (uint32_t slot = 0; slot < upto; ++slot) {
    const uint64_t word = std::atomic_ref<uint64_t>(words_[slot]).load(std::memory_order_acquire);
    if (word == 0) continue;
    size_t i = slot_of_word(word, capacity);
    while (entries[i] != 0 && words_[entries[i] - 1] != word) i = (i + 1) & (capacity - 1);
    if (entries[i] == 0) {
      entries[i] = slot + 1;
      ++held;
    }
  }
  std::atomic_ref<uint32_t>(index[1]).store(held, std::memory_order_relaxed);
  return at;
}

uint32_t StackTable::index_word(size_t at, uintptr_t word, uint32_t slot) {
  uint32_t* index = word_index_ + at;
  const uint32_t capacity = index[0];
  uint32_t* entries = index + 2;
  size_t i = slot_of_word(word, capacity);
  for (uint32_t probe = 0; probe < capacity; ++probe, i = (i + 1) & (capacity - 1)) {
    uint32_t seen = 0;
    if (std::atomic_ref<uint32_t>(entries[i]).compare_exchange_strong(seen, slot + 1, std::memory_order_release,
                                                                      std::memory_order_acquire)) {
      std::atomic_ref<uint32_t>(index[1]).fetch_add(1, std::memory_order_relaxed);
      return slot;
    }
    if (std::atomic_ref<uint64_t>(words_[seen - 1]).load(std::memory_order_relaxed) == word) return seen - 1;
  }
  return kNoWord;
}

uint32_t StackTable::word_slot(uintptr_t word) {
  size_t at = word_index_at_.load(std::memory_order_acquire);
  {
    const uint32_t* index = word_index_ + at;
    const uint32_t capacity = index[0];
    const uint32_t* entries = index + 2;
    size_t i = slot_of_word(word, capacity);
    for (uint32_t probe = 0; probe < capacity; ++probe, i = (i + 1) & (capacity - 1)) {
      const uint32_t entry = std::atomic_ref<const uint32_t>(entries[i]).load(std::memory_order_acquire);
      if (entry == 0) break;
      if (std::atomic_ref<const uint64_t>(words_[entry - 1]).load(std::memory_order_relaxed) == word) return entry - 1;
    }
  }
  const uint32_t mine = next_word_.fetch_add(1, std::memory_order_relaxed);
  if (mine >= kMaxWords) {
    next_word_.store(kMaxWords, std::memory_order_relaxed);  // stays full
    return kNoWord;
  }
  std::atomic_ref<uint64_t>(words_[mine]).store(word, std::memory_order_release);
  const uint32_t slot = index_word(at, word, mine);
  // Three quarters full: made again twice as large, with the slots handed
  // out so far, then those handed out meanwhile.
  const uint32_t capacity = word_index_[at];
  if (std::atomic_ref<uint32_t>(word_index_[at + 1]).load(std::memory_order_relaxed) > capacity / 4 * 3 &&
      word_index_at_.load(std::memory_order_acquire) == at) {
    const uint32_t upto = next_word_.load(std::memory_order_acquire);
    const size_t grown = make_word_index(capacity * 2, upto < kMaxWords ? upto : kMaxWords);
    size_t expected = at;
    if (grown != 0 && word_index_at_.compare_exchange_strong(expected, grown, std::memory_order_acq_rel)) {
      const uint32_t now = next_word_.load(std::memory_order_acquire);
      for (uint32_t later = upto; later < now && later < kMaxWords; ++later) {
        const uint64_t w = std::atomic_ref<uint64_t>(words_[later]).load(std::memory_order_acquire);
        if (w != 0) index_word(grown, w, later);
      }
      // The old index's whole pages go back to the kernel (its header, and
      // the next index where it shares a page, stay). A thread still
      // reading it finds empty entries there and hands the word a second
      // slot; one still adding to it faults a zero page back in.
      hand_back_whole_pages(reinterpret_cast<uintptr_t>(word_index_ + at + 2),
                            reinterpret_cast<uintptr_t>(word_index_ + at + 2 + capacity));
    }
  }
  return slot == kNoWord ? mine : slot;
}

namespace {

// Children looked through one by one before a parent's index is asked.
constexpr uint32_t kShortWalk = 8;
// A list walked further than this without an index gets one.
constexpr uint32_t kLongWalk = 32;
// Children not in the index (added once it was three quarters full, or while
// another thread's child was not in it yet), looked through one by one,
// before it is made again (find_far_child).
constexpr uint32_t kStale = 64;

// The children an index of `capacity` slots takes: three quarters of them,
// so that a probe always ends at an empty slot.
inline uint32_t index_room(uint32_t capacity) { return capacity / 4 * 3; }

// The PathCache::recent slot of a stack, by its words_hash().
inline uint32_t recent_slot(uint64_t hash) {
  return static_cast<uint32_t>(hash >> (64 - StackTable::PathCache::kRecentBits));
}

}  // namespace

// All of a stack's words, four at a time, in four independent chains: a
// chain through every word in turn waited on each step (a stack's words
// are some 70 on `import torch`, and most of its stacks are new ones,
// looked up once).
uint64_t StackTable::words_hash(const uintptr_t* frames, uint32_t depth, uint32_t python) {
  const auto mix = [](uint64_t h, uint64_t word) { return (h << 7 | h >> 57) ^ word; };
  uint64_t h0 = uint64_t{depth} << 8 | python, h1 = 0, h2 = 0, h3 = 0;
  uint32_t i = 0;
  for (; i + 4 <= depth; i += 4) {
    h0 = mix(h0, frames[i]);
    h1 = mix(h1, frames[i + 1]);
    h2 = mix(h2, frames[i + 2]);
    h3 = mix(h3, frames[i + 3]);
  }
  for (; i < depth; ++i) h0 = mix(h0, frames[i]);
  const uint64_t h = h0 ^ (h1 << 17 | h1 >> 47) ^ (h2 << 31 | h2 >> 33) ^ (h3 << 47 | h3 >> 17);
  return h * 0x9e3779b97f4a7c15ull;
}

uint32_t StackTable::recent(const uintptr_t* frames, uint32_t depth, uint32_t python, uint64_t hash,
                            PathCache* cache) const {
  if (cache == nullptr || depth == 0 || depth > kRecentDepth || python > depth) return 0;
  OwnedUse use(cache);
  return cache != nullptr ? cache->recent[recent_slot(hash)].id_of(frames, depth, python) : 0;
}

void StackTable::remember(const uintptr_t* frames, uint32_t depth, uint32_t python, uint64_t hash, uint32_t id,
                          PathCache* cache) const {
  if (cache == nullptr || id == 0 || depth == 0 || depth > kRecentDepth || python > depth) return;
  OwnedUse use(cache);
  if (cache != nullptr) cache->recent[recent_slot(hash)].set(frames, depth, python, id);
}

// The parent's entry, claimed when it has none; nullptr when the entries
// near its place are all taken (it goes without an index).
StackTable::FanEntry* StackTable::fan_entry(uint32_t parent) {
  const uint32_t key = parent + 1;
  size_t i = static_cast<size_t>((uint64_t{key} * 0x9e3779b97f4a7c15ull) >> 51) & (kFanParents - 1);
  for (int probe = 0; probe < 16; ++probe, i = (i + 1) & (kFanParents - 1)) {
    uint32_t seen = fan_[i].key.load(std::memory_order_acquire);
    if (seen == key) return &fan_[i];
    if (seen == 0 && (fan_[i].key.compare_exchange_strong(seen, key, std::memory_order_acq_rel) || seen == key)) {
      return &fan_[i];
    }
  }
  return nullptr;
}

// Indexes the list from `head` down, publishes the index and returns it
// (the region full: none, nullptr). Its room is at least one and a half
// times the children it holds: the children added after go into it as well
// (add_child), until it is three quarters full.
uint32_t* StackTable::make_index(FanEntry& entry, uint32_t head) {
  uint32_t count = 0;
  for (uint32_t id = head; id != 0; id = nodes_[id].next_sibling()) ++count;
  uint32_t capacity = 64;
  while (capacity < count + count / 2) capacity *= 2;
  const size_t at = fan_used_.fetch_add(kIndexHead + size_t{capacity}, std::memory_order_relaxed);
  if (at + kIndexHead + capacity > kFanRegionWords) {
    fan_used_.store(kFanRegionWords, std::memory_order_relaxed);  // stays full
    return nullptr;
  }
  uint32_t* index = fan_region_ + at;
  index[0] = capacity;
  uint32_t* slots = index + kIndexHead;  // mapped zero: empty
  for (uint32_t id = head; id != 0; id = nodes_[id].next_sibling()) {
    size_t i = slot_of_word(child_key(word_of(id), python_of(id)), capacity);
    while (slots[i] != 0) i = (i + 1) & (capacity - 1);
    slots[i] = id;
  }
  std::atomic_ref<uint32_t>(index[1]).store(head, std::memory_order_relaxed);
  std::atomic_ref<uint32_t>(index[2]).store(count, std::memory_order_relaxed);
  entry.index.store(static_cast<uint32_t>(at), std::memory_order_release);
  return index;
}

// Adds `id`, just linked in front of `below`, to `index`, and moves the
// index's `covered` on to it when `below` was covered: then every child
// from `id` down is in the index. Nothing when the index is three quarters
// full (a reader's probe always ends at an empty slot); the children after
// that are looked through one by one until the index is made again.
void StackTable::index_child(uint32_t* index, uint32_t id, uint64_t key, uint32_t below) {
  const uint32_t capacity = index[0];
  if (std::atomic_ref<uint32_t>(index[2]).fetch_add(1, std::memory_order_relaxed) + 1 > index_room(capacity)) return;
  uint32_t* slots = index + kIndexHead;
  for (size_t i = slot_of_word(key, capacity);; i = (i + 1) & (capacity - 1)) {
    uint32_t empty = 0;
    if (std::atomic_ref<uint32_t>(slots[i]).compare_exchange_strong(empty, id, std::memory_order_release,
                                                                     std::memory_order_relaxed)) {
      break;
    }
  }
  std::atomic_ref<uint32_t>(index[1]).compare_exchange_strong(below, id, std::memory_order_release,
                                                              std::memory_order_relaxed);
}

uint32_t StackTable::look_through(uint32_t from, uint32_t until, uintptr_t word, uint32_t python,
                                  uint32_t* steps) const {
  for (uint32_t id = from; id != until && id != 0; id = nodes_[id].next_sibling()) {
    if (is(id, word, python)) return id;
    if (steps != nullptr) ++*steps;
  }
  return 0;
}

// The rest of the list from `id`, the short walk's end: by the parent's
// index, and the children not in it yet; without an index, one by one (and
// an index for next time when the list is long). On a miss, `head` is the
// list's head as it was looked through and `index` the index that the new
// child goes into.
uint32_t StackTable::find_far_child(uint32_t parent, uint32_t& head, uint32_t id, uintptr_t word, uint32_t python,
                                    uint32_t*& index) {
  FanEntry* entry = fan_entry(parent);
  const uint32_t at = entry != nullptr ? entry->index.load(std::memory_order_acquire) : 0;
  if (at == 0) {
    uint32_t more = 0;
    const uint32_t found = look_through(id, 0, word, python, &more);
    if (found == 0 && entry != nullptr && kShortWalk + more > kLongWalk) index = make_index(*entry, head);
    return found;
  }
  uint32_t* const here = fan_region_ + at;
  const uint32_t capacity = here[0];
  // The children from `covered` down are in the index; the head read after
  // it lies above it, so the walk from the head meets it.
  const uint32_t covered = std::atomic_ref<uint32_t>(here[1]).load(std::memory_order_acquire);
  head = nodes_[parent].head();
  uint32_t newer = 0;
  if (const uint32_t found = look_through(head, covered, word, python, &newer)) return found;
  const uint32_t* slots = here + kIndexHead;
  for (size_t i = slot_of_word(child_key(word, python), capacity);; i = (i + 1) & (capacity - 1)) {
    const uint32_t slot = std::atomic_ref<const uint32_t>(slots[i]).load(std::memory_order_acquire);
    if (slot == 0) break;
    if (is(slot, word, python)) return slot;
  }
  // Made again: twice as large when it is three quarters full; when another thread's
  // child kept `covered` back (two threads adding children to one parent
  // at once), only once an eighth more children came, as the memory of the
  // indexes left behind stays within a few times the last one's.
  const uint32_t held = std::atomic_ref<uint32_t>(here[2]).load(std::memory_order_relaxed);
  index = newer > kStale && (held >= index_room(capacity) || newer > held / 8) ? make_index(*entry, head) : here;
  return 0;
}

// The child of `parent` for `word`, added when missing. Children are a
// list pushed at its head: a thread that loses the race to push looks
// through what was pushed meanwhile, so one word never gets two nodes.
// Most look-ups end among the first few children: that walk is here, the
// rest out of line.
uint32_t StackTable::child(uint32_t parent, uintptr_t word, uint32_t python) {
  const uint32_t head = nodes_[parent].head();
  uint32_t id = head;
  for (uint32_t walked = 0; id != 0 && walked < kShortWalk; ++walked, id = nodes_[id].next_sibling()) {
    if (is(id, word, python)) return id;
  }
  return add_child(parent, head, id, word, python);
}

// child() past its short walk, which stopped at `id` (0: the list's end).
__attribute__((noinline)) uint32_t StackTable::add_child(uint32_t parent, uint32_t head, uint32_t id, uintptr_t word,
                                                          uint32_t python) {
  uint32_t* index = nullptr;
  if (id != 0) {
    if (const uint32_t found = find_far_child(parent, head, id, word, python, index)) return found;
  }
  Node& up = nodes_[parent];
  const uint32_t slot = word_slot(word);
  const uint32_t mine = slot != kNoWord ? next_id_.fetch_add(1, std::memory_order_relaxed) : kMaxNodes;
  if (mine >= kMaxNodes) {
    if (slot != kNoWord) next_id_.store(kMaxNodes, std::memory_order_relaxed);  // stays full
    return 0;
  }
  const uint32_t key = slot | (python != 0 ? kPairFlag : 0);
  Node& node = nodes_[mine];
  node.parent_key = parent | (key & 0xff) << 24;
  // A pair has no children: its Python path's node takes their place.
  node.first_child.store(python | (key >> 8 & 0xff) << 24, std::memory_order_relaxed);
  const uint32_t sibling_key_bits = (key >> 16 & 0xff) << 24;
  // The parent's first-child word keeps its key bits: swapped whole.
  const uint32_t up_bits = up.first_child.load(std::memory_order_relaxed) & ~kIdMask;
  uint32_t seen_until = head;  // the list from here down was looked through
  for (;;) {
    node.sibling_key.store(head | sibling_key_bits, std::memory_order_relaxed);
    uint32_t expected = head | up_bits;
    if (up.first_child.compare_exchange_strong(expected, mine | up_bits, std::memory_order_acq_rel,
                                               std::memory_order_acquire)) {
      if (index != nullptr) index_child(index, mine, child_key(word, python), head);
      return mine;
    }
    // `head` is now the new head: look through the nodes pushed since.
    head = expected & kIdMask;
    if (const uint32_t found = look_through(head, seen_until, word, python, nullptr)) {
      // Lost a race: `mine` stays unlinked, an id no stack uses.
      return found;
    }
    seen_until = head;
  }
}

void StackTable::PathCache::clear() {
  python.depth = 0;
  native.depth = 0;
  for (Pair& pair : pairs) pair = Pair{0, 0, 0, 0};
  for (Recent& r : recent) r.id = 0;
  busy = 0;
}

uint32_t StackTable::intern_path(const uintptr_t* frames, uint32_t n, CachedPath* cache) {
  const uintptr_t* outermost = frames + n - 1;  // outermost[-i] is the path's frame i
  uint32_t shared = 0;
  uint32_t node = 0;
  if (cache != nullptr) {
    // This runs over the whole stack at every allocation. Most often the
    // stack is the cached path (or its outer part: the cached path goes on
    // below, still right).
    if (cache->depth >= n && memcmp(frames, cache->words + kMaxDepth - n, n * sizeof(uintptr_t)) == 0) {
      return cache->nodes[n - 1];
    }
    const uint32_t limit = cache->depth < n ? cache->depth : n;
    shared = shared_outer_frames(&cache->word(0), outermost, limit);
    if (shared > 0) node = cache->nodes[shared - 1];
  }
  for (uint32_t i = shared; i < n; ++i) {
    const uintptr_t word = outermost[-static_cast<ptrdiff_t>(i)];
    node = child(node, word);
    if (node == 0) {
      if (cache != nullptr) cache->depth = i;  // what is cached is still right
      return 0;
    }
    if (cache != nullptr) {
      cache->word(i) = word;
      cache->nodes[i] = node;
    }
  }
  if (cache != nullptr) cache->depth = n;
  return node;
}

uint32_t StackTable::intern(const uintptr_t* frames, uint32_t depth, uint32_t python, PathCache* cache) {
  if (nodes_ == nullptr || depth == 0) return 0;
  OwnedUse use(cache);
  if (depth > kMaxDepth) depth = kMaxDepth;
  if (python > depth) python = depth;
  const uint32_t native = depth - python;
  PathCache::Recent* recent = nullptr;
  if (cache != nullptr && depth <= kRecentDepth) {
    recent = &cache->recent[recent_slot(words_hash(frames, depth, python))];
    if (const uint32_t id = recent->id_of(frames, depth, python)) return id;
  }
  const uint32_t id = intern_parts(frames, python, native, cache);
  if (recent != nullptr && id != 0) recent->set(frames, depth, python, id);
  return id;
}

uint32_t StackTable::intern_parts(const uintptr_t* frames, uint32_t python, uint32_t native, PathCache* cache) {
  uint32_t python_node = 0;
  if (python > 0) {
    python_node = intern_path(frames, python, cache != nullptr ? &cache->python : nullptr);
    if (python_node == 0 || native == 0) return python_node;
  }
  if (python == 0) return intern_path(frames, native, cache != nullptr ? &cache->native : nullptr);
  // Both parts: the pair's node, its innermost native frame, below the
  // node of the native frames outside it (the root for one frame).
  const uintptr_t innermost = frames[python];
  uint32_t outer = 0;
  if (native > 1) {
    outer = intern_path(frames + python + 1, native - 1, cache != nullptr ? &cache->native : nullptr);
    if (outer == 0) return 0;
  }
  PathCache::Pair* recent = nullptr;
  if (cache != nullptr) {
    const uint64_t key = ((uint64_t{outer} << 32 | python_node) ^ innermost) * 0x9e3779b97f4a7c15ull;
    recent = &cache->pairs[key >> 56 & (PathCache::kPairs - 1)];
    if (recent->id != 0 && recent->native == outer && recent->python == python_node && recent->word == innermost) {
      return recent->id;
    }
  }
  const uint32_t id = child(outer, innermost, python_node);
  if (recent != nullptr && id != 0) *recent = PathCache::Pair{outer, python_node, innermost, id};
  return id;
}

uint32_t StackTable::read_path(uint32_t node, CachedPath& cache, uintptr_t* out, uint32_t room) const {
  // A child's id is above its parent's (a node is made after the one it
  // hangs from): the cached path's ids rise from the root, and this path's
  // fall on the way up, so one pass down the cached path finds the first
  // node the two share. Were an id ever out of that order, the node would
  // be missed and its part read from the nodes: slower, never wrong (a node
  // found in the cached path has that path's frames above it).
  uint32_t walked[kMaxDepth];
  uint32_t n = 0;
  int64_t at_cache = static_cast<int64_t>(cache.depth) - 1;
  uint32_t at = node;
  while (at != 0 && n < kMaxDepth) {
    while (at_cache >= 0 && cache.nodes[at_cache] > at) --at_cache;
    if (at_cache >= 0 && cache.nodes[at_cache] == at) break;
    walked[n++] = at;
    at = nodes_[at].parent();
  }
  const bool found = at != 0 && at_cache >= 0 && cache.nodes[at_cache] == at;
  const uint32_t shared = found ? static_cast<uint32_t>(at_cache) + 1 : 0;
  if ((at != 0 && !found) || shared + n > kMaxDepth) {
    // Deeper than a path can be: read it whole, and keep no path.
    cache.depth = 0;
    return read_path_whole(node, out, room);
  }
  uint32_t depth = shared;
  for (uint32_t i = n; i-- > 0; ++depth) {
    cache.nodes[depth] = walked[i];
    cache.word(depth) = word_of(walked[i]);
  }
  cache.depth = depth;
  const uint32_t count = depth < room ? depth : room;
  memcpy(out, &cache.words[kMaxDepth - depth], count * sizeof(uintptr_t));
  return count;
}

uint32_t StackTable::read_path_whole(uint32_t node, uintptr_t* out, uint32_t room) const {
  uint32_t count = 0;
  for (uint32_t at = node; at != 0 && count < room; at = nodes_[at].parent()) out[count++] = word_of(at);
  return count;
}

uint32_t StackTable::get(uint32_t id, uintptr_t* out, ReadCache* cache) const {
  if (nodes_ == nullptr || id == 0 || id >= next_id_.load(std::memory_order_acquire) || id >= kMaxNodes) return 0;
  // Python frames innermost first, then native frames innermost first:
  // each part from its node up to the root.
  const auto read = [&](uint32_t node, CachedPath* path, uintptr_t* to, uint32_t room) {
    return path != nullptr ? read_path(node, *path, to, room) : read_path_whole(node, to, room);
  };
  if (const uint32_t python = python_of(id)) {
    uint32_t depth = read(python, cache != nullptr ? &cache->python : nullptr, out, kMaxDepth);
    if (depth < kMaxDepth) out[depth++] = word_of(id);
    if (const uint32_t outer = nodes_[id].parent()) {
      depth += read(outer, cache != nullptr ? &cache->native : nullptr, out + depth, kMaxDepth - depth);
    }
    return depth;
  }
  const bool python = format::is_python_frame(word_of(id));
  return read(id, cache == nullptr ? nullptr : python ? &cache->python : &cache->native, out, kMaxDepth);
}

}  // namespace memledger::interposer
