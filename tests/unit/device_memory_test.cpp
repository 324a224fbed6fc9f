#include <catch2/catch.hpp>

#include "device_memory.h"
#include "event_builder.h"
#include "replay.h"

using namespace memledger::report;
using memledger::report::testing::EventBuilder;
namespace fmt = memledger::format;

namespace {

constexpr uint8_t kHost = static_cast<uint8_t>(fmt::Kind::kHost);
constexpr uint8_t kDevice = static_cast<uint8_t>(fmt::Kind::kDevice);
constexpr uint8_t kPinned = static_cast<uint8_t>(fmt::Kind::kPinnedHost);
constexpr uint64_t kMiB = 1 << 20;

TracePoolSample pool_sample(uint64_t seq, uint64_t pool, uint64_t reserved, uint64_t used) {
  TracePoolSample p;
  p.seq = seq;
  p.pool = pool;
  p.reserved = reserved;
  p.used = used;
  return p;
}

TraceVmmEvent vmm(uint64_t seq, TraceVmmEvent::Type type, uint64_t addr, uint64_t size) {
  TraceVmmEvent v;
  v.seq = seq;
  v.type = type;
  v.addr = addr;
  v.size = size;
  return v;
}

}  // namespace

TEST_CASE("device: what each kind of allocation holds from the device", "[device]") {
  CHECK(held_for(kHost, 0, 100) == 0);
  CHECK(held_for(kPinned, 0, 100) == 0);
  CHECK(held_for(kDevice, 0, 1) == 2 * kMiB);
  CHECK(held_for(kDevice, 0, 2 * kMiB + 1) == 4 * kMiB);
  CHECK(held_for(kDevice, fmt::kAllocPool, 1) == 0);  // its pool holds it
  CHECK(held_for(kDevice, fmt::kAllocPhysical, 6 * kMiB) == 6 * kMiB);
}

TEST_CASE("device: holders at a step end are the plain allocations and each pool", "[device]") {
  Trace trace;
  trace.pool_samples = {pool_sample(1, 0xbbb, 64 * kMiB, 16 * kMiB), pool_sample(2, 0xaaa, 32 * kMiB, 32 * kMiB)};
  TraceDeviceSample dev;
  dev.seq = 3;
  dev.free = 100 * kMiB;
  dev.total = 1000 * kMiB;
  trace.device_samples = {dev};
  trace.vmm = {vmm(1, TraceVmmEvent::Type::kReserve, 0x7000, 512 * kMiB),
               vmm(2, TraceVmmEvent::Type::kReserve, 0x9000, 256 * kMiB),
               vmm(3, TraceVmmEvent::Type::kUnreserve, 0x9000, 0)};
  DeviceLedger ledger(trace);
  ledger.allocated(kDevice, 0, 3 * kMiB);  // holds 4 MiB
  ledger.allocated(kDevice, 0, kMiB);      // holds 2 MiB
  ledger.allocated(kDevice, fmt::kAllocPool, 5 * kMiB);
  ledger.released(kDevice, 0, kMiB);
  ledger.catch_up(4);
  StepStats st;
  ledger.fill_step(st);
  CHECK(st.held_device == static_cast<int64_t>((4 + 64 + 32) * kMiB));
  REQUIRE(st.device_holders.size() == 3);
  CHECK(st.device_holders[0].name.find("cudaMalloc/cuMemAlloc") == 0);
  CHECK(st.device_holders[0].held == 4 * kMiB);
  CHECK(st.device_holders[0].unused == kMiB);
  CHECK(st.device_holders[1].name == "memory pool 0xaaa on device 0");  // by handle
  CHECK(st.device_holders[1].unused == 0);
  CHECK(st.device_holders[2].name == "memory pool 0xbbb on device 0");
  CHECK(st.device_holders[2].unused == 48 * kMiB);
  CHECK(st.device_free == 100 * kMiB);
  CHECK(st.device_total == 1000 * kMiB);
  CHECK(st.reserved_address_space == 512 * kMiB);  // reservations are address space, not memory
}

TEST_CASE("device: side records count only once the replay reaches them", "[device]") {
  Trace trace;
  trace.pool_samples = {pool_sample(10, 0xaaa, 8 * kMiB, 0)};
  DeviceLedger ledger(trace);
  ledger.catch_up(10);  // the sample was taken after event 9, not before
  StepStats before;
  ledger.fill_step(before);
  CHECK(before.device_holders.empty());
  ledger.catch_up(11);
  StepStats after;
  ledger.fill_step(after);
  CHECK(after.held_device == static_cast<int64_t>(8 * kMiB));
}

TEST_CASE("device: the replay gives each step its holders", "[device]") {
  Trace trace;
  EventBuilder b;
  b.alloc(0xd000, kMiB, 1, kDevice);
  b.step();
  b.free(0xd000, kDevice);
  b.step();
  Replay replay(trace, false);
  replay.observe(b.events.data(), b.events.size());
  ReplayOutput out = replay.finish();
  REQUIRE(out.steps.size() == 2);
  CHECK(out.steps[0].held_device == static_cast<int64_t>(2 * kMiB));
  CHECK(out.steps[0].device_holders.at(0).unused == kMiB);
  CHECK(out.steps[1].held_device == 0);
  CHECK(out.steps[1].device_holders.empty());
}

TEST_CASE("device: a framework's caching allocator is named with the switch that shows tensors", "[device]") {
  std::vector<ModuleInfo> modules(1);
  modules[0].path = "/usr/lib/python3/dist-packages/torch/lib/libtorch_cuda.so";
  std::vector<StepStats> steps(1);
  steps[0].live[1] = 1 << 30;
  HiddenAllocator torch = find_hidden_allocator(modules, steps, false, false);
  CHECK(torch.hidden);
  CHECK(torch.note.find("PyTorch's caching allocator") == 0);
  CHECK(torch.note.find("PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync") != std::string::npos);
  // Pool allocations: every tensor is seen.
  CHECK_FALSE(find_hidden_allocator(modules, steps, true, false).hidden);
  // No device memory at all: nothing hidden.
  CHECK_FALSE(find_hidden_allocator(modules, std::vector<StepStats>(1), false, false).hidden);
  CHECK(find_hidden_allocator(modules, std::vector<StepStats>(1), false, true).hidden);  // VMM only
  modules[0].path = "/opt/jax/jaxlib/xla_extension.so";
  CHECK(find_hidden_allocator(modules, steps, false, false).note.find("XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async") !=
        std::string::npos);
}

TEST_CASE("device: memory no hook allocated, per sampled device, and graph memory named", "[device]") {
  Trace trace;
  TracePoolSample pool = pool_sample(1, 0xaaa, 32 * kMiB, 8 * kMiB);
  pool.device = 1;
  TracePoolSample graph = pool_sample(2, fmt::kGraphMemoryPool, 8 * kMiB, 8 * kMiB);
  graph.device = 1;
  trace.pool_samples = {pool, graph};
  TraceDeviceSample d0, d1;
  d0.seq = 3;
  d0.free = 990 * kMiB;
  d0.total = 1000 * kMiB;
  d1.seq = 4;
  d1.device = 1;
  d1.free = 900 * kMiB;
  d1.total = 1000 * kMiB;
  trace.device_samples = {d0, d1};
  DeviceLedger ledger(trace);
  ledger.allocated(kDevice, 0, 3 * kMiB, 0);  // holds 4 MiB of device 0
  ledger.allocated(kDevice, 0, kMiB, 1);      // holds 2 MiB of device 1
  ledger.catch_up(5);
  StepStats st;
  ledger.fill_step(st);
  REQUIRE(st.not_hooked_by_device.size() == 2);
  CHECK(st.not_hooked_by_device[0] == std::pair<uint32_t, int64_t>(0, 6 * kMiB));
  // 100 MiB used on device 1: 2 MiB plain, 32 MiB pool, 8 MiB graph memory.
  CHECK(st.not_hooked_by_device[1] == std::pair<uint32_t, int64_t>(1, 58 * kMiB));
  REQUIRE(st.device_holders.size() == 3);  // plain allocations, then pools by handle
  CHECK(st.device_holders[1].name == "CUDA graph memory on device 1");
}

TEST_CASE("device: the not-hooked series is judged like a site's", "[device]") {
  std::vector<StepStats> steps(12);
  for (size_t i = 0; i < steps.size(); ++i) {
    steps[i].index = i + 1;
    steps[i].not_hooked_by_device = {{0, static_cast<int64_t>(300 * kMiB)},
                                     {1, static_cast<int64_t>((300 + 4 * i) * kMiB)}};
  }
  std::vector<LeakSuspect> suspects = find_not_hooked_growth(steps, -1, 20);
  REQUIRE(suspects.size() == 1);
  CHECK(suspects[0].bytes_per_step == Approx(4.0 * kMiB));
  REQUIRE(suspects[0].site.frames.size() == 1);
  CHECK(suspects[0].site.frames[0].function == not_hooked_name(1));
  CHECK(suspects[0].site.kind == kDevice);
}
