// The stacks of a trace, by id: each one a Python path and a native path,
// kept as nodes of a tree of frames whose roots are the outermost frames.
//
// A stack record names the outer frames it shares with the record before it
// in its frame (trace_format.h, kStackShared); those are the nodes of that
// record's paths, so a stack keeps a node only for each frame of its own.
// On `import torch` (PyTorch 2.15) a million stacks of 60 to 90 frames each
// took about 590 MB as one vector of frames a stack; their nodes and the
// index of the stacks take about 205 MB.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "trace_format.h"

namespace memledger::report {

// Frames of a stack kept (the innermost ones) when it is deeper.
inline constexpr uint64_t kMaxStackFrames = 256;

class StackStore {
 public:
  // Whether stack `id` is known; how many stacks are.
  size_t count(uint32_t id) const { return stacks_.contains(id) ? 1 : 0; }
  size_t size() const { return stacks_.size(); }
  bool empty() const { return stacks_.empty(); }
  // Nodes kept, for all stacks together.
  size_t nodes() const { return words_.size() - 1; }

  // Calls f(word) for each frame of stack `id`, innermost first (its Python
  // frames, then its native frames), at most kMaxStackFrames of them, until
  // f returns false. False when the stack is unknown.
  template <class F>
  bool visit(uint32_t id, F&& f) const {
    auto it = stacks_.find(id);
    if (it == stacks_.end()) return false;
    uint64_t left = kMaxStackFrames;
    for (uint32_t leaf : {it->second.python, it->second.native}) {
      for (uint32_t node = leaf; node != 0 && left != 0; node = parents_[node], --left) {
        if (!f(words_[node])) return true;
      }
    }
    return true;
  }
  // Stack `id`'s frames into `out` (cleared first); false when unknown.
  bool get(uint32_t id, std::vector<uint64_t>& out) const {
    out.clear();
    return visit(id, [&](uint64_t word) {
      out.push_back(word);
      return true;
    });
  }
  // Stack `id`'s frames; throws std::out_of_range when unknown.
  std::vector<uint64_t> at(uint32_t id) const {
    std::vector<uint64_t> out;
    if (!get(id, out)) throw std::out_of_range("no stack " + std::to_string(id));
    return out;
  }
  // The ids of the known stacks, in order.
  std::vector<uint32_t> ids() const;

  // Stack `id` is `words` (innermost first; its leading Python frames are
  // its Python path), all of its frames new nodes. Replaces a stack of
  // that id.
  void put(uint32_t id, std::span<const uint64_t> words);

  // The decoder's side. A node for `word` below `parent` (0: a root);
  // node ids start at 1. Past 2^32 - 1 nodes (48 GB of them) a frame gets
  // none: its stack goes on from its parent.
  uint32_t node(uint32_t parent, uint64_t word) {
    if (words_.size() > UINT32_MAX - 1) return parent;
    words_.push_back(word);
    parents_.push_back(parent);
    return static_cast<uint32_t>(words_.size() - 1);
  }
  uint64_t word(uint32_t node) const { return words_[node]; }
  // Stack `id` ends in these nodes (0: no frames of that kind).
  void set(uint32_t id, uint32_t python_leaf, uint32_t native_leaf) { stacks_[id] = {python_leaf, native_leaf}; }

  // Takes the stacks of `from` (a frame's, read apart) that this store
  // lacks, and empties `from`. A trace read again brings no new stack and
  // costs no memory.
  void absorb(StackStore& from);
  void clear();

 private:
  struct Stack {
    uint32_t python;
    uint32_t native;
  };
  absl::flat_hash_map<uint32_t, Stack> stacks_;
  // By node id; node 0 stands for "none".
  std::vector<uint64_t> words_{0};
  std::vector<uint32_t> parents_{0};
};

}  // namespace memledger::report
