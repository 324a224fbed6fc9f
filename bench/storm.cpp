// storm: a host-heap allocation storm shaped like a training loop.
//
// Each step, every thread makes about K/T short-lived allocations of 16 B to
// 8 KiB (log-uniform sizes from a fixed-seed PRNG) from four call sites at
// different stack depths: forward (activations, malloc), backward (gradients,
// operator new[]), tokenizer (std::string / std::vector) and optimizer
// (realloc growth). Blocks go through a ring of live blocks, so the heap keeps
// a working set instead of seeing pure alloc/free pairs. Once per step
// leak_per_step() leaks --leak-bytes, and memledger_step() marks the step end
// when the program runs under memledger (resolved at run time: no link
// dependency, a no-op otherwise).
//
// The last line on stdout is machine-readable, for bench/run_benchmarks.py:
//   storm: steps=30 allocs_per_step=100000 threads=1 ... elapsed_s=1.234567

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Options {
  long steps = 30;
  long allocs_per_step = 100000;
  long threads = 1;
  long leak_bytes = 4096;
  long depth = 0;  // extra frames above each call site: DEPTH to 2 DEPTH
};

// Deterministic, cheap, and never allocates: splitmix64.
class Prng {
 public:
  explicit Prng(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  // Log-uniform-ish in [16, 8191]: a power of two 16..4096, then uniform
  // inside that octave.
  std::size_t size() {
    std::uint64_t r = next();
    std::size_t octave = std::size_t{16} << (r % 9);
    return octave + static_cast<std::size_t>((r >> 8) % octave);
  }

 private:
  std::uint64_t state_;
};

// Write a few bytes: the first word, one byte per page, the last byte. Enough
// that the block is really used (and the allocation cannot be optimised
// away) without turning the benchmark into a memset benchmark.
inline void touch(void* p, std::size_t n, std::uint64_t v) {
  auto* b = static_cast<unsigned char*>(p);
  std::memcpy(b, &v, n < sizeof v ? n : sizeof v);
  for (std::size_t i = 4096; i < n; i += 4096) b[i] = static_cast<unsigned char>(v);
  b[n - 1] = static_cast<unsigned char>(v >> 8);
}

enum class Kind : std::uint8_t { kMalloc, kNewArray };

struct Block {
  void* p = nullptr;
  Kind kind = Kind::kMalloc;
};

// The bounded working set: each new block takes the slot of the oldest one,
// which is freed. Blocks live for kRingSize allocations.
class Ring {
 public:
  static constexpr std::size_t kRingSize = 1000;

  Ring() : slots_(kRingSize) {}
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring() {
    for (Block& b : slots_) release(b);
  }

  void put(void* p, Kind kind) {
    Block& b = slots_[next_];
    release(b);
    b = {p, kind};
    next_ = (next_ + 1) % kRingSize;
  }

 private:
  static void release(Block& b) {
    if (b.p == nullptr) return;
    if (b.kind == Kind::kMalloc) {
      std::free(b.p);
    } else {
      delete[] static_cast<float*>(b.p);
    }
    b.p = nullptr;
  }

  std::vector<Block> slots_;
  std::size_t next_ = 0;
};

// Per-thread state of the "model".
struct Worker {
  explicit Worker(std::uint64_t seed) : rng(seed) {}
  Prng rng;
  Ring ring;
  // Optimizer state: buffers that grow by realloc up to 8 KiB, then restart.
  static constexpr int kParams = 64;
  void* opt_state[kParams] = {};
  std::size_t opt_size[kParams] = {};
  // The tokenizer keeps its last few batches alive.
  static constexpr int kBatches = 8;
  std::vector<std::string> batches[kBatches];
  int batch_next = 0;
  std::uint64_t checksum = 0;
  std::uint64_t grads = 0;
  std::uint64_t batches_done = 0;

  ~Worker() {
    for (void* p : opt_state) std::free(p);
  }
};

// --- forward: activations (malloc), depth 3 below step -----------------------

__attribute__((noinline)) void* alloc_activation(std::size_t n) {
  void* p = std::malloc(n);
  if (p == nullptr) std::abort();
  return p;
}

__attribute__((noinline)) void forward_layer(Worker& w, int layer) {
  std::size_t n = w.rng.size();
  void* act = alloc_activation(n);
  touch(act, n, static_cast<std::uint64_t>(layer) ^ n);
  w.ring.put(act, Kind::kMalloc);
}

__attribute__((noinline)) long forward(Worker& w, int layers) {
  for (int l = 0; l < layers; ++l) forward_layer(w, l);
  return layers;
}

// --- backward: gradients (operator new[]), depth 4 below step -----------------

__attribute__((noinline)) float* grad_buffer(std::size_t n) {
  float* g = new float[(n + sizeof(float) - 1) / sizeof(float)];
  g[0] = 0.0f;  // not a tail call: this frame stays on the stack
  return g;
}

__attribute__((noinline)) void accumulate_grad(Worker& w) {
  std::size_t n = w.rng.size();
  float* g = grad_buffer(n);
  touch(g, n, n);
  w.ring.put(g, Kind::kNewArray);
}

__attribute__((noinline)) void backward_layer(Worker& w) {
  accumulate_grad(w);
  ++w.grads;  // not a tail call: this frame stays on the stack
}

__attribute__((noinline)) long backward(Worker& w, int layers) {
  for (int l = 0; l < layers; ++l) backward_layer(w);
  return layers;
}

// --- tokenizer: small std::string / std::vector allocations -------------------

__attribute__((noinline)) std::string make_token(Worker& w) {
  // Mostly small strings (16..64 chars: past the 15-char SSO buffer, so each
  // one allocates), sometimes a longer one.
  std::uint64_t r = w.rng.next();
  std::size_t len = (r % 8 == 0) ? w.rng.size() : 16 + (r >> 8) % 49;
  std::string s(len, static_cast<char>('a' + r % 26));
  s.back() = '!';
  return s;
}

__attribute__((noinline)) long tokenize_line(Worker& w, int tokens) {
  std::vector<std::string> line;  // grows by doubling: a few reallocations
  long allocs = 0;
  std::size_t cap = 0;
  for (int t = 0; t < tokens; ++t) {
    line.push_back(make_token(w));
    ++allocs;
    if (line.capacity() != cap) {
      cap = line.capacity();
      ++allocs;
    }
  }
  for (const std::string& s : line) w.checksum += static_cast<unsigned char>(s[0]);
  // Keep the batch alive for a while: the one it replaces is freed now.
  w.batches[w.batch_next] = std::move(line);
  w.batch_next = (w.batch_next + 1) % Worker::kBatches;
  return allocs;
}

__attribute__((noinline)) long tokenize_batch(Worker& w) {
  long allocs = tokenize_line(w, 4 + static_cast<int>(w.rng.next() % 8));
  ++w.batches_done;  // not a tail call: this frame stays on the stack
  return allocs;
}

// --- optimizer: realloc growth ------------------------------------------------

__attribute__((noinline)) void grow_state(Worker& w, int i) {
  std::size_t n = w.opt_size[i] == 0 ? 16 : w.opt_size[i] * 3 / 2;
  if (n > 8192) {  // fully grown: start over
    std::free(w.opt_state[i]);
    w.opt_state[i] = nullptr;
    n = 16;
  }
  void* p = std::realloc(w.opt_state[i], n);
  if (p == nullptr) std::abort();
  touch(p, n, n);
  w.opt_state[i] = p;
  w.opt_size[i] = n;
}

__attribute__((noinline)) long optimizer_step(Worker& w, int params) {
  for (int k = 0; k < params; ++k) {
    grow_state(w, static_cast<int>(w.rng.next() % Worker::kParams));
  }
  return params;
}

// --- one step, the leak, the step marker --------------------------------------

// One call site of the mix: forward 40%, backward 30%, tokenizer 20%,
// optimizer 10% (by allocation count).
__attribute__((noinline)) long call_site(Worker& w, std::uint64_t pick) {
  if (pick < 4) return forward(w, 4);
  if (pick < 7) return backward(w, 4);
  if (pick < 9) return tokenize_batch(w);
  return optimizer_step(w, 4);
}

// `levels` frames of a deep framework stack (interpreter, dispatcher,
// autograd) above a call site. Not a tail call: the count is used after.
__attribute__((noinline)) long nest(Worker& w, std::uint64_t pick, long levels) {
  const long done = levels == 0 ? call_site(w, pick) : nest(w, pick, levels - 1);
  w.checksum += static_cast<std::uint64_t>(levels);
  return done;
}

__attribute__((noinline)) void run_step(Worker& w, long allocs, long depth) {
  long done = 0;
  while (done < allocs) {
    const std::uint64_t r = w.rng.next();
    const std::uint64_t pick = r % 10;
    done += depth == 0 ? call_site(w, pick) : nest(w, pick, depth + static_cast<long>((r >> 32) % (depth + 1)));
  }
}

void* volatile g_leak_sink = nullptr;

// The one site that grows: --leak-bytes per step, never freed.
__attribute__((noinline)) void* leak_per_step(std::size_t n) {
  if (n == 0) return nullptr;
  void* p = std::malloc(n);
  if (p == nullptr) std::abort();
  std::memset(p, 0x5a, n);
  g_leak_sink = p;  // observable, so the compiler keeps the leak
  return p;
}

using StepFn = void (*)(const char*);

// Peak RSS of this process image alone: VmHWM, which exec resets (unlike
// getrusage's ru_maxrss, which keeps the high-water mark of whatever process
// forked us, e.g. a Python driver). An in-process tracer's memory counts; a
// helper process such as heaptrack_interpret does not. Read without malloc.
long peak_rss_kib() {
  char buf[4096];
  int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  const char* p = std::strstr(buf, "VmHWM:");
  return p != nullptr ? std::strtol(p + 6, nullptr, 10) : -1;
}

long parse_long(const char* flag, const char* value) {
  char* end = nullptr;
  long v = value ? std::strtol(value, &end, 10) : -1;
  if (value == nullptr || *end != '\0' || v < 0) {
    std::fprintf(stderr, "storm: %s needs a non-negative integer\n", flag);
    std::exit(2);
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (std::strcmp(a, "--steps") == 0) {
      o.steps = parse_long(a, v), ++i;
    } else if (std::strcmp(a, "--allocs-per-step") == 0) {
      o.allocs_per_step = parse_long(a, v), ++i;
    } else if (std::strcmp(a, "--threads") == 0) {
      o.threads = parse_long(a, v), ++i;
    } else if (std::strcmp(a, "--leak-bytes") == 0) {
      o.leak_bytes = parse_long(a, v), ++i;
    } else if (std::strcmp(a, "--depth") == 0) {
      o.depth = parse_long(a, v), ++i;
    } else if (std::strcmp(a, "-h") == 0 || std::strcmp(a, "--help") == 0) {
      std::printf(
          "usage: storm [--steps N] [--allocs-per-step K] [--threads T] "
          "[--leak-bytes B] [--depth D]\n"
          "  defaults: --steps 30 --allocs-per-step 100000 --threads 1 "
          "--leak-bytes 4096 --depth 0\n"
          "  --depth D: D to 2D more frames above each call site\n");
      std::exit(0);
    } else {
      std::fprintf(stderr, "storm: unknown argument '%s' (try --help)\n", a);
      std::exit(2);
    }
  }
  if (o.threads < 1) o.threads = 1;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  auto step_marker = reinterpret_cast<StepFn>(dlsym(RTLD_DEFAULT, "memledger_step"));

  const long per_thread = opt.allocs_per_step / opt.threads;
  std::vector<std::uint64_t> checksums(static_cast<std::size_t>(opt.threads));
  long step = 0;
  auto end_of_step = [&]() noexcept {
    leak_per_step(static_cast<std::size_t>(opt.leak_bytes));
    if (step_marker != nullptr) {
      char label[32];
      std::snprintf(label, sizeof label, "step %ld", step);
      step_marker(label);
    }
    ++step;
  };
  std::barrier sync(opt.threads, end_of_step);

  auto body = [&](long tid) {
    Worker w(0x5eed0000ULL + static_cast<std::uint64_t>(tid));
    for (long s = 0; s < opt.steps; ++s) {
      run_step(w, per_thread, opt.depth);
      sync.arrive_and_wait();
    }
    checksums[static_cast<std::size_t>(tid)] = w.checksum;
  };

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (long t = 1; t < opt.threads; ++t) pool.emplace_back(body, t);
  body(0);
  for (std::thread& t : pool) t.join();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::uint64_t sum = 0;
  for (std::uint64_t c : checksums) sum += c;
  const long peak_kib = peak_rss_kib();
  std::printf(
      "storm: steps=%ld allocs_per_step=%ld threads=%ld leak_bytes=%ld depth=%ld "
      "marker=%s checksum=%llu maxrss_kib=%ld elapsed_s=%.6f\n",
      opt.steps, opt.allocs_per_step, opt.threads, opt.leak_bytes, opt.depth,
      step_marker != nullptr ? "yes" : "no", static_cast<unsigned long long>(sum),
      peak_kib, elapsed);
  return 0;
}
