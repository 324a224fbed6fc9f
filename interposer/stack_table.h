// Interns call stacks: each distinct stack gets a small id, shared by every
// thread, without a lock. Stacks are kept as trees of frames (calling
// context trees, as heaptrack keeps its traces): a path from the root is a
// node, and stacks that share their outer frames share those nodes, 12
// bytes each, where storing whole stacks cost their whole depth.
//
// A stack's Python frames and its native frames are two paths of their
// own, each from the root, outermost frame first; a stack with both ends
// in a node of its innermost native frame that also names its Python
// path's node (a pair's node), below the node of its other native frames.
// The two parts vary apart: in a Python program most native
// paths (the interpreter's frames under Python code, then the library's)
// are reached from a few Python paths, and a Python line reaches many
// native paths. Kept as one path, every Python path had its own copy of
// each native path below it: `import torch` (PyTorch 2.15) makes 1.09
// million distinct stacks of 67 frames on average, 7.1 million nodes as
// one path each, 2.3 million (27 MiB) as pairs.
//
// A node's children are a list pushed at its head; a node with many also
// gets a hash index of them (see FanEntry).
//
// The writer writes each stack the first time an event refers to it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "trace_format.h"

namespace memledger::interposer {

// How many frames two stacks share from their outermost one on, at most
// `limit`: each stack is given by its outermost word, its next frames below
// it in memory (a stack's innermost-first array, read from its end). Four
// words are compared at a time, then one at a time: the stacks of an
// `import torch` share some 50 outer frames with the one before.
inline uint32_t shared_outer_frames(const uintptr_t* a, const uintptr_t* b, uint32_t limit) {
  uint32_t shared = 0;
  while (shared + 4 <= limit) {
    const ptrdiff_t at = -static_cast<ptrdiff_t>(shared);
    if (((a[at] ^ b[at]) | (a[at - 1] ^ b[at - 1]) | (a[at - 2] ^ b[at - 2]) | (a[at - 3] ^ b[at - 3])) != 0) break;
    shared += 4;
  }
  while (shared < limit && a[-static_cast<ptrdiff_t>(shared)] == b[-static_cast<ptrdiff_t>(shared)]) ++shared;
  return shared;
}

class StackTable {
 public:
  // Native frames (--stack-depth at most 128) plus as many Python frames.
  static constexpr uint32_t kMaxNativeDepth = 128;
  static constexpr uint32_t kMaxDepth = 256;
  static constexpr uint32_t kMaxNodes = 1u << 24;  // 256 MiB reserved, touched as used

  // A path from the root: its nodes, outermost first, and its words in a
  // stack's order (innermost first) ending at the end of `words`, so that
  // a stack whose frames are the path's outer ones is one memcmp.
  struct CachedPath {
    uint32_t depth;
    uint32_t nodes[kMaxDepth];
    uintptr_t words[kMaxDepth];
    // The path's frame i (outermost first).
    uintptr_t& word(uint32_t i) { return words[kMaxDepth - 1 - i]; }
  };
  // A thread's previous Python and native paths, and the stacks it made of
  // pairs of paths lately: a new stack that shares the start of either
  // path is found without looking those nodes up again, and a pair seen
  // lately without looking through the children of its outer native
  // frames' node (which can be many: every Python line that reaches one
  // native path). Owned by one thread at a time.
  // Stacks of at most this many words are remembered whole (PathCache::recent).
  static constexpr uint32_t kRecentDepth = 62;
  struct PathCache {
    // Set while intern() uses it: a signal handler that interns on the
    // same thread in the middle of that goes without.
    volatile uint32_t busy;
    CachedPath python;
    CachedPath native;
    struct Pair {
      uint32_t native;  // the node of the native frames but the innermost
      uint32_t python;
      uintptr_t word;   // the innermost native frame
      uint32_t id;      // 0: empty
    };
    static constexpr uint32_t kPairs = 256;
    Pair pairs[kPairs];
    // Whole stacks made lately, each in a slot found by hashing all of its
    // words: a stack seen lately is one compare of its words, where a look
    // through the tree follows a node's children at each frame that is not
    // the cached path's (a loop calling a few sites in turn).
    struct Recent {
      uint32_t id;      // 0: empty
      uint16_t depth;   // words
      uint16_t python;  // of them, Python frames
      uintptr_t words[kRecentDepth];
      // This slot's id when it holds the stack `frames`, else 0.
      uint32_t id_of(const uintptr_t* frames, uint32_t n, uint32_t py) const {
        return id != 0 && depth == n && python == py && memcmp(words, frames, n * sizeof(uintptr_t)) == 0 ? id : 0;
      }
      void set(const uintptr_t* frames, uint32_t n, uint32_t py, uint32_t stack) {
        id = stack;
        depth = static_cast<uint16_t>(n);
        python = static_cast<uint16_t>(py);
        memcpy(words, frames, n * sizeof(uintptr_t));
      }
    };
    // 256 slots: a loop over many call sites at many depths (bench/storm
    // --depth) keeps finding its stacks here. About 126 KiB a thread, in
    // the ring's mapping, touched as the slots are used.
    static constexpr uint32_t kRecentBits = 8;
    static constexpr uint32_t kRecentSlots = 1u << kRecentBits;
    Recent recent[kRecentSlots];
    // Forgets everything (a fork child's ring whose thread did not come
    // along may hold a half-written entry).
    void clear();
  };

  // Maps the memory. Returns false if the kernel refused it.
  bool init();
  // Returns the id of the stack `frames` (`python` Python frame words,
  // innermost first, then native frames, innermost first), adding it if
  // new; 0 when the table is full or not initialised. `cache`: the calling
  // thread's, or nullptr.
  uint32_t intern(const uintptr_t* frames, uint32_t depth, uint32_t python = 0, PathCache* cache = nullptr);
  // A hash of a stack's words (intern()'s arguments): it picks the
  // stack's PathCache::recent slot.
  static uint64_t words_hash(const uintptr_t* frames, uint32_t depth, uint32_t python);
  // The id of stack `frames` (of `hash`, words_hash()) when it is among the
  // thread's recent stacks (PathCache::recent), else 0; remember() puts one
  // there, by an id known otherwise (a stack the writer interned for the
  // thread: stack_spill.h).
  uint32_t recent(const uintptr_t* frames, uint32_t depth, uint32_t python, uint64_t hash, PathCache* cache) const;
  void remember(const uintptr_t* frames, uint32_t depth, uint32_t python, uint64_t hash, uint32_t id,
                PathCache* cache) const;
  // Number of ids handed out so far: ids are below count() + 1. Not every
  // id below is a stack (a node may only lie on other stacks' paths).
  uint32_t count() const { return next_id_.load(std::memory_order_acquire) - 1; }
  // Slots handed out to frame words: each distinct word takes one (rarely
  // two, when two threads add it at once), however many nodes have it.
  uint32_t word_count() const { return next_word_.load(std::memory_order_relaxed); }
  // Words taken by the indexes of parents with many children, those left
  // behind by an index made again included.
  size_t index_words() const { return fan_used_.load(std::memory_order_relaxed); }
  // The reader's last Python and native paths (one reader at a time, the
  // writer thread): a stack read after one that shares its outer frames
  // reads only the nodes of its own, where a whole read follows every
  // node's parent up to the root, in memory threads wrote to long before.
  struct ReadCache {
    CachedPath python;
    CachedPath native;
  };
  // Copies the frames of stack `id` into `out` (room for kMaxDepth), in
  // intern()'s order; returns the depth, 0 for an unknown id. `cache`: the
  // caller's, or nullptr.
  uint32_t get(uint32_t id, uintptr_t* out, ReadCache* cache = nullptr) const;
  // A fork() needs no wait here: a node is written whole before the one
  // compare-and-swap that links it into its parent's list, so a child
  // forked while another thread was adding one has it either linked and
  // whole or not linked at all (an id no stack uses, as when a thread
  // loses the race to link). A word, or an index, that the other thread
  // had not finished publishing is added again by the child when it
  // needs it: a word may have two slots, and nodes are told apart by
  // their words.

 private:
  // One frame of the tree, 12 bytes: the frame's key (its word's slot in
  // words_, 24 bits) and the links, together so that a look through a
  // parent's children reads one place per child. Node ids are below 2^24,
  // so the parent, the first child and the next sibling take 24 bits each
  // and the key's three bytes ride in their top bytes. All but the first
  // child's id are set before the node is linked into its parent's child
  // list and never change after.
  //
  // A pair's node (a stack with Python frames: its innermost native frame,
  // below the node of its other native frames) has kPairFlag in its key,
  // and in place of a first child (a pair has none) its Python path's
  // node. A native path used only under Python frames so has no node of
  // its own for its innermost frame: `import torch` has some 900,000
  // native paths, almost each reached from one Python path.
  struct Node {
    uint32_t parent_key;                // the parent; key bits 0..7 in bits 24..31
    std::atomic<uint32_t> first_child;  // 0 = none; key bits 8..15 in bits 24..31
    std::atomic<uint32_t> sibling_key;  // the next sibling; key bits 16..23 in bits 24..31
    uint32_t parent() const { return parent_key & kIdMask; }
    uint32_t next_sibling() const { return sibling_key.load(std::memory_order_acquire) & kIdMask; }
    uint32_t head() const { return first_child.load(std::memory_order_acquire) & kIdMask; }
    uint32_t key() const {
      return parent_key >> 24 | (first_child.load(std::memory_order_relaxed) >> 24) << 8 |
             (sibling_key.load(std::memory_order_relaxed) >> 24) << 16;
    }
  };
  static_assert(sizeof(Node) == 12);
  static constexpr uint32_t kIdMask = (1u << 24) - 1;
  static_assert(kMaxNodes - 1 <= kIdMask);
  static constexpr uint32_t kPairFlag = 1u << 23;

  // Frame words, each kept once: a node's key is its word's slot. A tree of
  // `import torch`'s stacks has some 2.3 million nodes and 200,000 distinct
  // words; a node that kept its word itself took 16 bytes.
  //
  // Slots are handed out in turn and never change. Words are found by a
  // hash index of their slots, made again twice as large when three
  // quarters full (the pages of the one left behind go back to the
  // kernel). No lock: a signal handler that interns on a thread in the
  // middle of this does not wait for it. Two threads that add one word at
  // once may give it two slots; nodes are told apart by their words, never
  // by their keys, so a word still gets one node below a parent.
  static constexpr uint32_t kMaxWords = kPairFlag;
  static constexpr size_t kWordIndexWords = size_t{1} << 25;  // 128 MiB reserved, touched as used
  static constexpr uint32_t kNoWord = ~0u;
  uint64_t* words_ = nullptr;
  std::atomic<uint32_t> next_word_{0};
  // The index: its capacity (a power of two), the slots it holds, then its
  // entries (a word's slot + 1; 0: empty). `word_index_at_`: the current
  // one's offset in word_index_.
  uint32_t* word_index_ = nullptr;
  std::atomic<size_t> word_index_used_{0};
  std::atomic<size_t> word_index_at_{0};
  // `word`'s slot, added when missing; kNoWord when the slots are used up.
  uint32_t word_slot(uintptr_t word);
  // A new index of `capacity` entries holding the slots below `upto`;
  // its offset, or 0 when the region is full.
  size_t make_word_index(uint32_t capacity, uint32_t upto);
  // Puts `slot` (holding `word`) into the index at `at`; returns the slot
  // the word has there (another thread's, when it came first), or kNoWord
  // when the index has no empty entry left.
  uint32_t index_word(size_t at, uintptr_t word, uint32_t slot);
  // The frame word of node `id`.
  uintptr_t word_of(uint32_t id) const {
    return std::atomic_ref<const uint64_t>(words_[nodes_[id].key() & ~kPairFlag]).load(std::memory_order_relaxed);
  }
  // The Python path's node of pair node `id`; 0 for any other node.
  uint32_t python_of(uint32_t id) const {
    const Node& node = nodes_[id];
    return node.key() & kPairFlag ? node.first_child.load(std::memory_order_relaxed) & kIdMask : 0;
  }
  // Whether node `id` is the frame `word` (and a pair's node for Python
  // node `python`, when that is not 0).
  bool is(uint32_t id, uintptr_t word, uint32_t python) const {
    const Node& node = nodes_[id];
    const uint32_t key = node.key();
    if ((key & kPairFlag) != (python != 0 ? kPairFlag : 0)) return false;
    if (python != 0 && (node.first_child.load(std::memory_order_relaxed) & kIdMask) != python) return false;
    return std::atomic_ref<const uint64_t>(words_[key & ~kPairFlag]).load(std::memory_order_relaxed) == word;
  }
  // What a parent's index hashes a child by.
  static uint64_t child_key(uintptr_t word, uint32_t python) {
    return word ^ uint64_t{python} * 0xff51afd7ed558ccdull;
  }

  // The child of `parent` for `word` (a pair's node for Python node
  // `python`, when that is not 0), added when missing; 0 when the table is
  // full.
  uint32_t child(uint32_t parent, uintptr_t word, uint32_t python = 0);
  uint32_t add_child(uint32_t parent, uint32_t head, uint32_t id, uintptr_t word, uint32_t python);
  // The child of `parent` for `word` in its list as it was at `head`, from
  // `id` on (the first children were looked through), or 0 when it is not
  // there; then `head` is the head looked through, and `index` the
  // parent's index, if it has one that takes new children.
  uint32_t find_far_child(uint32_t parent, uint32_t& head, uint32_t id, uintptr_t word, uint32_t python,
                          uint32_t*& index);
  // get()'s part from `node` up to the root, innermost first, at most
  // `room` words into `out`, by way of `cache` (the same kind of path read
  // last); returns the count.
  uint32_t read_path(uint32_t node, CachedPath& cache, uintptr_t* out, uint32_t room) const;
  // The same, following every node from `node` up to the root.
  uint32_t read_path_whole(uint32_t node, uintptr_t* out, uint32_t room) const;
  // The sibling for `word` from `from` up to (not including) `until` or the
  // list's end, or 0; `steps`, when given, counts the siblings passed.
  uint32_t look_through(uint32_t from, uint32_t until, uintptr_t word, uint32_t python, uint32_t* steps) const;

  // Parents with many children (the root; a native path reached from
  // hundreds of Python lines) get an index of their children: a hash table
  // of the list as it was when the index was made (a child, once linked,
  // never goes, so it stays right), to which each child added after goes
  // too until it is three quarters full, then made again twice as large. Indexes are
  // kept in a region of their own and never freed: a thread may still read
  // one that was made again.
  struct FanEntry {
    std::atomic<uint32_t> key;     // the parent + 1; 0: free
    std::atomic<uint32_t> index;   // offset of its index in fan_region_, 0: none yet
  };
  static constexpr uint32_t kFanParents = 1u << 13;
  static constexpr size_t kFanRegionWords = size_t{1} << 24;  // 64 MiB reserved, touched as used
  FanEntry* fan_entry(uint32_t parent);
  uint32_t* make_index(FanEntry& entry, uint32_t head);
  void index_child(uint32_t* index, uint32_t id, uint64_t key, uint32_t below);
  // An index's words: its capacity (a power of two); `covered`, the child
  // from which down every child is in it; the children it holds (may count
  // past three quarters of the capacity, where it takes no more); then the
  // slots.
  static constexpr size_t kIndexHead = 3;
  // The node of the path `frames` (innermost first, `n` of them) read
  // outermost first; 0 when the table is full.
  uint32_t intern_path(const uintptr_t* frames, uint32_t n, CachedPath* cache);
  // intern() past its recent stacks: the stack's Python and native paths.
  uint32_t intern_parts(const uintptr_t* frames, uint32_t python, uint32_t native, PathCache* cache);

  Node* nodes_ = nullptr;  // by id; id 0 is the root (no frame)
  FanEntry* fan_ = nullptr;
  // Each index: its capacity (a power of two), the head it was made at,
  // the children it holds, then the slots (child ids, 0: empty).
  uint32_t* fan_region_ = nullptr;
  std::atomic<size_t> fan_used_{1};
  std::atomic<uint32_t> next_id_{1};
};

}  // namespace memledger::interposer
