#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "analysis.h"
#include "trace_format.h"
#include "step_inference.h"

using namespace memledger::report;

namespace {

// Symbols of a synthetic run, with the allocation index at which each
// planted iteration of the loop begins.
struct Sequence {
  std::vector<uint64_t> symbols;
  std::vector<size_t> iteration_starts;

  void add(uint64_t symbol) { symbols.push_back(symbol); }
  void begin_iteration() { iteration_starts.push_back(symbols.size()); }
  // The step ends a perfect marker would give: before each next iteration.
  std::vector<size_t> expected_ends() const {
    return std::vector<size_t>(iteration_starts.begin() + 1, iteration_starts.end());
  }
};

std::vector<size_t> all_but_last(const std::vector<size_t>& v) {
  return std::vector<size_t>(v.begin(), v.end() - 1);
}

constexpr uint64_t kSetup = 1000, kBody = 2000, kNoise = 3000, kOnce = 4000, kTeardown = 5000, kInner = 6000,
                   kEpoch = 7000;

}  // namespace

TEST_CASE("a clean loop gives one step per iteration, ending before the next", "[step_inference]") {
  Sequence s;
  for (uint64_t i = 0; i < 40; ++i) s.add(kSetup + i);
  for (int step = 0; step < 25; ++step) {
    s.begin_iteration();
    for (uint64_t i = 0; i < 12; ++i) s.add(kBody + i);
  }
  for (uint64_t i = 0; i < 30; ++i) s.add(kTeardown + i);
  InferredSteps steps = infer_steps(s.symbols);
  REQUIRE(steps.ends.size() == 25);
  CHECK(all_but_last(steps.ends) == s.expected_ends());
  CHECK(steps.ends.back() == s.symbols.size() - 30);  // the usual tail (none), not the teardown
  CHECK(steps.period == 12);
  CHECK(steps.anchors == 12);
  CHECK(steps.description.find("inferred period 12 allocations per step") == 0);
}

TEST_CASE("noise, warm-up and a symbol seen twice per step leave the step count exact", "[step_inference]") {
  std::mt19937_64 rng(42);
  Sequence s;
  for (uint64_t i = 0; i < 200; ++i) s.add(kSetup + rng() % 50);  // start-up, repeating symbols too
  for (int step = 0; step < 30; ++step) {
    s.begin_iteration();
    s.add(kBody + 0);
    if (step == 0) {
      for (uint64_t i = 0; i < 60; ++i) s.add(kOnce + i);  // compilation, lazy initialisation
    }
    for (uint64_t i = 1; i < 8; ++i) {
      s.add(kBody + i);
      // Another thread, a cache, sampled allocations: a varying number of
      // symbols from a small pool at random places.
      for (uint64_t k = rng() % 4; k > 0; --k) s.add(kNoise + rng() % 20);
    }
    s.add(kBody + 100);  // the same layer run twice per step
    s.add(kBody + 100);
    if (step % 7 == 3) s.add(kBody + 200);  // growth of a container now and then
  }
  InferredSteps steps = infer_steps(s.symbols);
  REQUIRE(steps.ends.size() == 30);
  CHECK(all_but_last(steps.ends) == s.expected_ends());
  CHECK(steps.anchors >= 8);
}

TEST_CASE("a sequence without repetition gives no steps and says so", "[step_inference]") {
  std::mt19937_64 rng(7);
  Sequence s;
  for (int i = 0; i < 5000; ++i) s.add(rng());
  InferredSteps steps = infer_steps(s.symbols);
  CHECK(steps.ends.empty());
  CHECK(steps.description == "no repeating allocation pattern found in 5000 allocations");

  Sequence two;  // two iterations are not a loop
  for (int step = 0; step < 2; ++step) {
    for (uint64_t i = 0; i < 20; ++i) two.add(kBody + i);
  }
  CHECK(infer_steps(two.symbols).ends.empty());
}

TEST_CASE("random noise alone does not make a loop", "[step_inference]") {
  std::mt19937_64 rng(3);
  Sequence s;
  for (int i = 0; i < 20000; ++i) s.add(kNoise + rng() % 500);  // every symbol about 40 times, no order
  CHECK(infer_steps(s.symbols).ends.empty());
}

TEST_CASE("micro-batches inside a step: the step is the outer loop", "[step_inference]") {
  Sequence s;
  for (int step = 0; step < 12; ++step) {
    s.begin_iteration();
    for (uint64_t i = 0; i < 3; ++i) s.add(kBody + i);  // data, zero_grad
    for (int micro = 0; micro < 4; ++micro) {
      for (uint64_t i = 0; i < 10; ++i) s.add(kInner + i);  // forward and backward of one micro-batch
    }
    for (uint64_t i = 3; i < 6; ++i) s.add(kBody + i);  // optimizer step
  }
  InferredSteps steps = infer_steps(s.symbols);
  REQUIRE(steps.ends.size() == 12);
  CHECK(all_but_last(steps.ends) == s.expected_ends());
  CHECK(steps.period == 46);
}

TEST_CASE("epochs around the steps: the step is the inner loop", "[step_inference]") {
  Sequence s;
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (uint64_t i = 0; i < 3; ++i) s.add(kEpoch + i);  // a new data iterator, epoch-end logs
    for (int step = 0; step < 10; ++step) {
      s.begin_iteration();
      for (uint64_t i = 0; i < 20; ++i) s.add(kBody + i);
    }
  }
  InferredSteps steps = infer_steps(s.symbols);
  REQUIRE(steps.ends.size() == 30);
  // Epoch symbols fall into the step before them, as they would between markers.
  CHECK(all_but_last(steps.ends) == s.expected_ends());
}

TEST_CASE("procedures repeated a few times (compilations) are not the loop", "[step_inference]") {
  std::mt19937_64 rng(11);
  Sequence s;
  uint64_t fresh = 1u << 20;
  for (int compile = 0; compile < 3; ++compile) {
    for (uint64_t i = 0; i < 24; ++i) {
      s.add(kOnce + i);  // the compiler's fixed work, the same every time
      for (int k = 0; k < 80; ++k) s.add(fresh++);  // and what differs per compiled function
    }
  }
  for (int step = 0; step < 20; ++step) {  // a fast loop with few anchors, as in sampled mode
    s.begin_iteration();
    for (uint64_t i = 0; i < 3; ++i) {
      s.add(kBody + i);
      for (uint64_t k = rng() % 5; k > 0; --k) s.add(kNoise + rng() % 40);
    }
  }
  InferredSteps steps = infer_steps(s.symbols);
  REQUIRE(steps.ends.size() == 20);
  CHECK(all_but_last(steps.ends) == s.expected_ends());
  CHECK(steps.anchors == 3);
}

namespace {

// A full-mode trace of one process, its events pushed one at a time, a
// microsecond apart.
struct SyntheticTrace {
  Trace trace;
  uint64_t seq = 0;
  SyntheticTrace() {
    trace.path = "synthetic";
    trace.header["pid"] = "100";
    trace.header["host_mode"] = "full";
  }
  void push(EvType type, uint64_t addr, uint64_t size, uint32_t stack) {
    TraceEvent e;
    e.type = type;
    e.seq = ++seq;
    e.ts = seq * 1000;
    e.addr = addr;
    e.size = size;
    e.stack = stack;
    trace.events.push_back(e);
  }
};

// A trace without step markers: each step allocates temporaries and frees
// them, leaks `leak` bytes, and the teardown frees everything.
Trace unmarked_training_run(int steps, uint64_t leak) {
  SyntheticTrace synthetic;
  Trace& trace = synthetic.trace;
  uint64_t& seq = synthetic.seq;
  auto push = [&](EvType type, uint64_t addr, uint64_t size, uint32_t stack) { synthetic.push(type, addr, size, stack); };
  for (uint64_t i = 0; i < 50; ++i) push(EvType::kAlloc, 0x100000 + i * 0x100, 64 + i, 1);  // start-up
  std::vector<uint64_t> leaked;
  for (int step = 0; step < steps; ++step) {
    for (uint64_t i = 0; i < 8; ++i) push(EvType::kAlloc, 0x200000 + i * 0x1000, 4096, static_cast<uint32_t>(10 + i));
    if (leak) {
      leaked.push_back(0x10000000 + static_cast<uint64_t>(step) * 0x100000);
      push(EvType::kAlloc, leaked.back(), leak, 20);
    }
    for (uint64_t i = 0; i < 8; ++i) push(EvType::kFree, 0x200000 + i * 0x1000, 0, 0);
  }
  for (uint64_t addr : leaked) push(EvType::kFree, addr, 0, 0);  // teardown
  for (uint64_t i = 0; i < 50; ++i) push(EvType::kFree, 0x100000 + i * 0x100, 0, 0);
  trace.last_ts = seq * 1000;
  return trace;
}

}  // namespace

TEST_CASE("a loop inside one native call gives way to one that steps through Python", "[step_inference]") {
  // A framework registers its devices: 395 times the same allocations, all
  // under one Python instruction. Then the training loop: 20 steps whose
  // anchors are allocated at several lines.
  Sequence s;
  std::vector<uint32_t> places;
  auto add = [&](uint64_t symbol, uint32_t place) {
    s.add(symbol);
    places.push_back(place);
  };
  for (int device = 0; device < 395; ++device) {
    for (uint64_t i = 0; i < 5; ++i) add(kSetup + i, 77);
  }
  for (int step = 0; step < 20; ++step) {
    s.begin_iteration();
    for (uint64_t i = 0; i < 6; ++i) add(kBody + i, static_cast<uint32_t>(100 + i));
  }
  CHECK(infer_steps(s.symbols).ends.size() == 395);  // without places: the longer loop
  InferredSteps steps = infer_steps(s.symbols, {}, {}, places);
  REQUIRE(steps.ends.size() == 20);
  CHECK(all_but_last(steps.ends) == s.expected_ends());
}

TEST_CASE("a trace without markers gets auto steps and its leak is found", "[step_inference]") {
  const Trace trace = unmarked_training_run(20, 65536);
  ProcessReport r = analyze(trace, ExitInfo{}, AnalysisOptions{});
  CHECK(r.step_source == "auto");
  CHECK(r.step_inference.find("inferred period 9 allocations per step") == 0);
  REQUIRE(r.steps.size() == 20);
  for (const StepStats& st : r.steps) CHECK(st.source == "auto");
  REQUIRE(!r.leak_suspects.empty());
  const LeakSuspect& s = r.leak_suspects.front();
  CHECK(s.site.stack == 20);
  CHECK(s.bytes_per_step == Approx(65536));
  CHECK(s.series.back() == 20 * 65536);  // the teardown is not part of the last step
  CHECK(r.steps.back().allocations == 9);
  CHECK(r.steps.back().frees == 8);
}

TEST_CASE("a clean trace without markers gets auto steps and no suspect", "[step_inference]") {
  ProcessReport r = analyze(unmarked_training_run(20, 0), ExitInfo{}, AnalysisOptions{});
  CHECK(r.step_source == "auto");
  CHECK(r.steps.size() == 20);
  CHECK(r.leak_suspects.empty());
}

TEST_CASE("a worker thread's allocations with attributed Python frames still make the loop", "[step_inference]") {
  // An XLA or autograd thread allocates the step's buffers; its stacks carry
  // the main thread's Python frames at that moment, a different line in each
  // step, so each step's allocations have stacks of their own. They are the
  // same allocations: their native frames decide.
  namespace fmt = memledger::format;
  SyntheticTrace synthetic;
  Trace& trace = synthetic.trace;
  const uint64_t& seq = synthetic.seq;
  uint32_t next_stack = 100;
  auto push = [&](EvType type, uint64_t addr, uint64_t size, uint32_t stack) { synthetic.push(type, addr, size, stack); };
  constexpr int kSteps = 20;
  for (int step = 0; step < kSteps; ++step) {
    for (uint64_t i = 0; i < 6; ++i) {
      const uint32_t stack = next_stack++;
      const uint64_t attributed = fmt::python_frame_word(1, static_cast<uint32_t>(2 * step)) | fmt::kPythonAttributedBit;
      const uint64_t words[] = {attributed, 0x401000 + i * 0x10, 0x402000};
      trace.stacks.put(stack, words);
      push(EvType::kAlloc, 0x200000 + i * 0x1000, 4096, stack);
    }
    for (uint64_t i = 0; i < 6; ++i) push(EvType::kFree, 0x200000 + i * 0x1000, 0, 0);
  }
  trace.last_ts = seq * 1000;
  ProcessReport r = analyze(trace, ExitInfo{}, AnalysisOptions{});
  CHECK(r.step_source == "auto");
  CHECK(r.steps.size() == static_cast<size_t>(kSteps));
  CHECK(r.step_inference.find("inferred period 6 allocations per step") == 0);
}

TEST_CASE("markers win over inference", "[step_inference]") {
  Trace trace = unmarked_training_run(20, 65536);
  TraceEvent step;
  step.type = EvType::kStep;
  step.seq = trace.events.back().seq + 1;
  step.ts = step.seq * 1000;
  step.addr = 1;
  trace.events.push_back(step);
  ProcessReport r = analyze(trace, ExitInfo{}, AnalysisOptions{});
  CHECK(r.step_source == "marker");
  CHECK(r.steps.size() == 1);
  CHECK(r.step_inference.empty());
}

TEST_CASE("two anchors make a loop only when it is long", "[step_inference]") {
  auto loop = [](int steps) {
    Sequence s;
    for (uint64_t i = 0; i < 30; ++i) s.add(kSetup + i);
    for (int step = 0; step < steps; ++step) {
      s.begin_iteration();
      s.add(kBody);
      s.add(kNoise + static_cast<uint64_t>(step));  // differs every step
      s.add(kBody + 1);
    }
    return s;
  };
  Sequence long_loop = loop(12);
  InferredSteps steps = infer_steps(long_loop.symbols);
  REQUIRE(steps.ends.size() == 12);
  CHECK(all_but_last(steps.ends) == long_loop.expected_ends());
  CHECK(infer_steps(loop(5).symbols).ends.empty());
}

TEST_CASE("anchors missing from the first iterations (compilation) still count the whole loop", "[step_inference]") {
  // A JIT-compiled step: two sites recur in every iteration; three richer
  // ones only once the compiled fast path runs, from the third iteration
  // on, among allocations that sampling recorded by chance.
  std::mt19937_64 rng(7);
  Sequence s;
  for (uint64_t i = 0; i < 50; ++i) s.add(kSetup + i);
  for (int step = 0; step < 20; ++step) {
    s.begin_iteration();
    s.add(kBody);
    if (step < 2) {
      for (uint64_t i = 0; i < 30; ++i) s.add(kOnce + static_cast<uint64_t>(step) * 100 + i);  // compiling
    } else {
      for (uint64_t i = 0; i < 3; ++i) s.add(kInner + i);
    }
    for (int i = 0; i < 4; ++i) s.add((kNoise + rng() % 6) | kNeverAnchor);
    s.add(kBody + 1);
  }
  InferredSteps steps = infer_steps(s.symbols);
  REQUIRE(steps.ends.size() == 20);
  CHECK(all_but_last(steps.ends) == s.expected_ends());
}

TEST_CASE("a last partial batch does not take a step away", "[step_inference]") {
  Sequence s;
  for (int step = 0; step < 16; ++step) {
    s.begin_iteration();
    s.add(kBody);  // the same in every step (parameters, optimizer state)
    const uint64_t batch_sized = step < 15 ? kInner : kEpoch;  // the last batch is smaller
    for (uint64_t i = 0; i < 8; ++i) s.add(batch_sized + i);
    s.add(kBody + 1);
  }
  InferredSteps steps = infer_steps(s.symbols);
  REQUIRE(steps.ends.size() == 16);
  CHECK(all_but_last(steps.ends) == s.expected_ends());
}

TEST_CASE("allocations recorded by chance are never anchors", "[step_inference]") {
  Sequence s;
  for (int step = 0; step < 20; ++step) {
    for (uint64_t i = 0; i < 5; ++i) s.add((kBody + i) | kNeverAnchor);
  }
  InferredSteps steps = infer_steps(s.symbols);
  CHECK(steps.ends.empty());
  for (uint64_t& symbol : s.symbols) symbol &= ~kNeverAnchor;
  CHECK(infer_steps(s.symbols).ends.size() == 20);
}

TEST_CASE("a loop is found behind many earlier symbols that recur as often", "[step_inference]") {
  // Start-up runs 600 procedures that each allocate one site 20 times in a
  // row (as often as the loop runs, but not interleaving with anything).
  Sequence s;
  for (uint64_t site = 0; site < 600; ++site) {
    for (int i = 0; i < 20; ++i) s.add(kSetup + site);
  }
  for (int step = 0; step < 20; ++step) {
    s.begin_iteration();
    for (uint64_t i = 0; i < 5; ++i) s.add(kBody + i);
  }
  InferredSteps steps = infer_steps(s.symbols);
  REQUIRE(steps.ends.size() == 20);
  CHECK(all_but_last(steps.ends) == s.expected_ends());
}
