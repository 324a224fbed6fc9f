#include "stack_store.h"

#include <algorithm>

namespace memledger::report {

namespace fmt = memledger::format;

std::vector<uint32_t> StackStore::ids() const {
  std::vector<uint32_t> out;
  out.reserve(stacks_.size());
  for (const auto& [id, stack] : stacks_) out.push_back(id);
  std::sort(out.begin(), out.end());
  return out;
}

void StackStore::put(uint32_t id, std::span<const uint64_t> words) {
  size_t python = 0;
  while (python < words.size() && fmt::is_python_frame(words[python])) ++python;
  // Outermost first: each node below the one outside it.
  auto path = [&](size_t begin, size_t end) {
    uint32_t leaf = 0;
    for (size_t i = end; i > begin; --i) leaf = node(leaf, words[i - 1]);
    return leaf;
  };
  set(id, path(0, python), path(python, words.size()));
}

void StackStore::absorb(StackStore& from) {
  // from's node k becomes node base + k, once its nodes are appended, which
  // they are when one of its stacks is new here (and while node ids fit).
  if (words_.size() - 1 + from.words_.size() - 1 > UINT32_MAX - 1) {
    from.clear();
    return;
  }
  const uint32_t base = static_cast<uint32_t>(words_.size() - 1);
  auto moved = [&](uint32_t node) { return node == 0 ? 0 : node + base; };
  bool any_new = false;
  for (const auto& [id, stack] : from.stacks_) {
    any_new |= stacks_.try_emplace(id, Stack{moved(stack.python), moved(stack.native)}).second;
  }
  if (any_new) {
    words_.insert(words_.end(), from.words_.begin() + 1, from.words_.end());
    const size_t at = parents_.size();
    parents_.insert(parents_.end(), from.parents_.begin() + 1, from.parents_.end());  // grows as words_ does
    for (size_t k = at; k < parents_.size(); ++k) parents_[k] = moved(parents_[k]);
  }
  from.clear();
}

void StackStore::clear() {
  stacks_.clear();
  words_.resize(1);
  parents_.resize(1);
}

}  // namespace memledger::report
