// Marks a structure that one thread owns (its `busy` field) in use for one
// operation. A signal handler that runs the same operation on the same
// thread in the middle of it finds the structure in use and goes without
// it: the pointer it passed is set to null.
#pragma once

#include <atomic>

namespace memledger::interposer {

template <typename T>
class OwnedUse {
 public:
  explicit OwnedUse(T*& owned) : owned_(owned) {
    if (owned_ == nullptr) return;
    if (owned_->busy) {
      owned = owned_ = nullptr;  // an interrupted operation on this thread: leave it alone
      return;
    }
    owned_->busy = 1;
    std::atomic_signal_fence(std::memory_order_seq_cst);
  }
  ~OwnedUse() {
    if (owned_ == nullptr) return;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    owned_->busy = 0;
  }
  OwnedUse(const OwnedUse&) = delete;
  OwnedUse& operator=(const OwnedUse&) = delete;

 private:
  T* owned_;
};

}  // namespace memledger::interposer
