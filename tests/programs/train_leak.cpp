// A small native training loop with a planted leak. Each step builds
// activations and gradients (freed at the end of the step), keeps a bounded
// cache of recent batches, and, by mistake, appends a copy of the step's loss
// history to a list that is never trimmed: 64 KiB per step, allocated in
// `record_history`. --no-markers leaves steps to the report's inference.
//
//   train_leak [STEPS] [--no-markers]

#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

namespace {

using StepFn = void (*)(const char*);

struct Tensor {
  explicit Tensor(size_t n) : data(new float[n]), size(n) { std::memset(data.get(), 0, n * sizeof(float)); }
  std::unique_ptr<float[]> data;
  size_t size;
};

constexpr size_t kLeakBytesPerStep = 64 * 1024;

std::vector<std::unique_ptr<char[]>> g_history;  // the leak: never trimmed

__attribute__((noinline)) void record_history(float loss) {
  auto copy = std::make_unique<char[]>(kLeakBytesPerStep);
  std::memcpy(copy.get(), &loss, sizeof loss);
  g_history.push_back(std::move(copy));
}

__attribute__((noinline)) float forward_backward(int step) {
  std::vector<Tensor> activations;
  for (int layer = 0; layer < 8; ++layer) activations.emplace_back(4096 + 512 * layer);
  std::vector<Tensor> gradients;
  for (int layer = 0; layer < 8; ++layer) gradients.emplace_back(4096 + 512 * layer);
  float loss = 0;
  for (const Tensor& t : activations) loss += t.data[0] + 1.0f / static_cast<float>(step + 1);
  return loss;
}

__attribute__((noinline)) void cache_batch(std::deque<std::vector<char>>& cache, int step) {
  cache.emplace_back(16 * 1024, static_cast<char>(step));
  if (cache.size() > 4) cache.pop_front();  // bounded: not a leak
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 30;
  const bool markers = !(argc > 2 && std::strcmp(argv[2], "--no-markers") == 0);
  auto step_marker = markers ? reinterpret_cast<StepFn>(dlsym(RTLD_DEFAULT, "memledger_step")) : nullptr;
  std::deque<std::vector<char>> cache;
  double total = 0;
  for (int step = 0; step < steps; ++step) {
    float loss = forward_backward(step);
    cache_batch(cache, step);
    record_history(loss);
    total += loss;
    if (step_marker) step_marker("train");
  }
  std::printf("trained %d steps, mean loss %.4f\n", steps, total / steps);
  return 0;
}
