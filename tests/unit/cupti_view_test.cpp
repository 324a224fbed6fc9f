#include <catch2/catch.hpp>

#include "cupti_view.h"
#include "trace_format.h"

using namespace memledger::report;
namespace fmt = memledger::format;

namespace {

struct CuptiTraceBuilder {
  Trace trace;
  uint64_t seq = 0;

  void status(fmt::CuptiStatus s, uint64_t ts, const std::string& text, const std::string& holder = "") {
    const uint32_t text_id = static_cast<uint32_t>(trace.strings.size() + 1);
    trace.strings[text_id] = text;
    uint32_t holder_id = 0;
    if (!holder.empty()) {
      holder_id = text_id + 1;
      trace.strings[holder_id] = holder;
    }
    trace.cupti_status.push_back({++seq, ts, static_cast<uint8_t>(s), 130001, text_id, holder_id});
  }
  TraceEvent hook(uint64_t addr, uint64_t size, uint64_t ts, uint8_t flags = 0) {
    TraceEvent e;
    e.type = EvType::kAlloc;
    e.seq = ++seq;
    e.ts = ts;
    e.addr = addr;
    e.size = size;
    e.kind = static_cast<uint8_t>(fmt::Kind::kDevice);
    e.flags = flags;
    e.stack = 7;
    return e;
  }
  void cupti(uint64_t addr, uint64_t bytes, uint64_t ts, uint64_t pc = 0x42,
             fmt::CuptiMemoryKind cupti_kind = fmt::CuptiMemoryKind::kDevice, const std::string& name = "") {
    TraceCuptiMemory m;
    m.ts = ts;
    m.addr = addr;
    m.bytes = bytes;
    m.pc = pc;
    m.kind = static_cast<uint8_t>(fmt::Kind::kDevice);
    m.cupti_kind = static_cast<uint8_t>(cupti_kind);
    if (!name.empty()) {
      m.name = static_cast<uint32_t>(trace.strings.size() + 100);
      trace.strings[m.name] = name;
    }
    trace.cupti_memory.push_back(m);
  }
  // A cuMemMap the hooks saw (the cuMemCreate before it is a kAllocPhysical event).
  void map(uint64_t addr, uint64_t size, uint64_t ts, uint64_t handle) {
    TraceVmmEvent v;
    v.type = TraceVmmEvent::Type::kMap;
    v.seq = ++seq;
    v.ts = ts;
    v.addr = addr;
    v.size = size;
    v.handle = handle;
    trace.vmm.push_back(v);
  }
};

}  // namespace

TEST_CASE("CUPTI and hook allocations pair by address, in order of reuse") {
  CuptiTraceBuilder b;
  b.status(fmt::CuptiStatus::kActive, 5, "CUPTI 130001 from /x/libcupti.so.13: memory activity records");
  CuptiMatcher matcher(b.trace);
  // The same address allocated three times; CUPTI's records arrive late.
  matcher.observe(b.hook(0x1000, 4096, 10));
  matcher.observe(b.hook(0x1000, 4096, 20));
  matcher.observe(b.hook(0x2000, 8192, 30));
  matcher.observe(b.hook(0x3000, 1 << 20, 40));                      // seen by the hooks only
  matcher.observe(b.hook(0x4000, 512, 50, fmt::kAllocPhysical));    // VMM handle: not compared
  matcher.observe(b.hook(0x5000, 512, 55, fmt::kAllocFailed));      // failed: not compared
  TraceEvent host = b.hook(0x6000, 64, 56);
  host.kind = static_cast<uint8_t>(fmt::Kind::kHost);
  matcher.observe(host);                                             // host heap: not compared
  b.cupti(0x1000, 4096, 11);
  b.cupti(0x2000, 8200, 31);         // same allocation, CUPTI counts other bytes
  b.cupti(0x1000, 4096, 21);
  b.cupti(0x9000, 3 << 20, 60, 0x77);  // seen by CUPTI only (a path the hooks miss)
  b.cupti(0xa000, 2 << 20, 61);
  b.trace.cupti_releases = 2;
  b.trace.cupti_dropped = 4;
  b.status(fmt::CuptiStatus::kStopped, 100, "CUPTI collection ended at exit");
  const CuptiView v = matcher.finish();
  CHECK(v.status == "active");
  CHECK(v.compared);
  CHECK(v.end_message == "CUPTI collection ended at exit");
  CHECK(v.matched == 3);
  CHECK(v.matched_bytes == 4096 + 4096 + 8192);
  CHECK(v.size_differences == 1);
  // The hooks' side of the difference, with CUPTI's count beside it.
  REQUIRE(v.size_differences_list.size() == 1);
  CHECK(v.size_differences_list[0].addr == 0x2000);
  CHECK(v.size_differences_list[0].bytes == 8192);
  CHECK(v.size_differences_list[0].cupti_bytes == 8200);
  CHECK(v.size_differences_list[0].stack == 7);
  CHECK(v.hooks_only == 1);
  CHECK(v.hooks_only_bytes == 1 << 20);
  REQUIRE(v.hooks_only_list.size() == 1);
  CHECK(v.hooks_only_list[0].addr == 0x3000);
  CHECK(v.hooks_only_list[0].stack == 7);
  CHECK(v.cupti_only == 2);
  CHECK(v.cupti_only_bytes == (5u << 20));
  REQUIRE(v.cupti_only_list.size() == 2);
  CHECK(v.cupti_only_list[0].addr == 0x9000);  // largest first
  CHECK(v.cupti_only_list[0].pc == 0x77);
  CHECK(v.cupti_allocations == 5);
  CHECK(v.cupti_releases == 2);
  CHECK(v.cupti_dropped == 4);
}

TEST_CASE("CUPTI's records of one address pair with the hooks' of the same size, whatever their order") {
  CuptiTraceBuilder b;
  b.status(fmt::CuptiStatus::kActive, 5, "CUPTI 130001 from /x/libcupti.so.13: memory activity records");
  CuptiMatcher matcher(b.trace);
  // A pool gives 0x1000 out three times, to three sizes; CUPTI's buffers
  // hand the records over in another order.
  matcher.observe(b.hook(0x1000, 512, 10));
  matcher.observe(b.hook(0x1000, 4, 20));
  matcher.observe(b.hook(0x1000, 2048, 30));
  b.cupti(0x1000, 4, 21);
  b.cupti(0x1000, 512, 11);
  b.cupti(0x1000, 2560, 31);  // the driver counted this one otherwise
  b.status(fmt::CuptiStatus::kStopped, 100, "CUPTI collection ended at exit");
  const CuptiView v = matcher.finish();
  CHECK(v.matched == 3);
  CHECK(v.matched_bytes == 512 + 4 + 2048);
  CHECK(v.size_differences == 1);
  REQUIRE(v.size_differences_list.size() == 1);
  CHECK(v.size_differences_list[0].bytes == 2048);
  CHECK(v.size_differences_list[0].cupti_bytes == 2560);
  CHECK(v.hooks_only == 0);
  CHECK(v.cupti_only == 0);
}

TEST_CASE("after CUPTI is handed to another tool, the hooks' allocations are not missing from CUPTI") {
  CuptiTraceBuilder b;
  b.status(fmt::CuptiStatus::kActive, 5, "CUPTI active");
  CuptiMatcher matcher(b.trace);
  matcher.observe(b.hook(0x1000, 4096, 10));
  matcher.observe(b.hook(0x2000, 4096, 20));
  b.cupti(0x1000, 4096, 10);
  b.status(fmt::CuptiStatus::kStopped, 15,
           "CUPTI was handed over to another tool that asked for it; from here on device memory is seen by the "
           "CUDA hooks only");
  matcher.observe(b.hook(0x3000, 4096, 30));
  const CuptiView v = matcher.finish();
  CHECK(v.compared);
  CHECK(v.matched == 1);
  // 0x2000 came before the handover and CUPTI never reported it; 0x3000
  // came after, when CUPTI was no longer memledger's to ask.
  CHECK(v.hooks_only == 1);
  REQUIRE(v.hooks_only_list.size() == 1);
  CHECK(v.hooks_only_list[0].addr == 0x2000);
  CHECK(v.end_message.find("handed over") != std::string::npos);
}

TEST_CASE("without CUPTI the view says why and compares nothing") {
  SECTION("held by another tool") {
    CuptiTraceBuilder b;
    b.status(fmt::CuptiStatus::kHeld, 5, "CUPTI is held by CUPTI for Nsight Systems: ...", "CUPTI for Nsight Systems");
    CuptiMatcher matcher(b.trace);
    matcher.observe(b.hook(0x1000, 4096, 10));
    const CuptiView v = matcher.finish();
    CHECK(v.status == "held");
    CHECK(v.holder == "CUPTI for Nsight Systems");
    CHECK(v.message == "CUPTI is held by CUPTI for Nsight Systems: ...");
    CHECK_FALSE(v.compared);
    CHECK(v.hooks_only == 0);
  }
  SECTION("no CUDA in the process") {
    CuptiTraceBuilder b;
    CuptiMatcher matcher(b.trace);
    matcher.observe(b.hook(0x1000, 4096, 10));
    const CuptiView v = matcher.finish();
    CHECK(v.status == "none");
    CHECK_FALSE(v.compared);
  }
}

TEST_CASE("CUPTI's records of VMM mappings pair with the hooks' cuMemMap at the mapped address") {
  // PyTorch's expandable segments: one reserved range, 20 MiB handles
  // created and mapped one after another; CUPTI reports each mapping.
  constexpr uint64_t kBase = 0x302000000;
  constexpr uint64_t kChunk = 20 << 20;
  CuptiTraceBuilder b;
  b.status(fmt::CuptiStatus::kActive, 5, "CUPTI active");
  CuptiMatcher matcher(b.trace);
  for (uint64_t i = 0; i < 3; ++i) {
    matcher.observe(b.hook(0x7000 + i, kChunk, 10 + i, fmt::kAllocPhysical));  // cuMemCreate: a handle
    b.map(kBase + i * kChunk, kChunk, 10 + i, 0x7000 + i);
  }
  b.map(kBase + 3 * kChunk, kChunk, 20, 0x7003);  // CUPTI never reported this one
  for (uint64_t i = 0; i < 3; ++i) b.cupti(kBase + i * kChunk, kChunk, 10 + i);
  b.cupti(0x2a56000000, 2 << 20, 30);  // a mapping the hooks did not see
  const CuptiView v = matcher.finish();
  CHECK(v.matched == 3);
  CHECK(v.matched_mappings == 3);
  CHECK(v.matched_bytes == 3 * kChunk);
  CHECK(v.size_differences == 0);
  CHECK(v.hooks_only == 1);
  REQUIRE(v.hooks_only_list.size() == 1);
  CHECK(v.hooks_only_list[0].addr == kBase + 3 * kChunk);
  CHECK(v.hooks_only_list[0].mapping);
  CHECK(v.cupti_only == 1);
  REQUIRE(v.cupti_only_list.size() == 1);
  CHECK(v.cupti_only_list[0].addr == 0x2a56000000);
}

TEST_CASE("CUPTI's module statics are counted apart, not as allocations the hooks missed") {
  CuptiTraceBuilder b;
  b.status(fmt::CuptiStatus::kActive, 5, "CUPTI active");
  CuptiMatcher matcher(b.trace);
  matcher.observe(b.hook(0x1000, 4096, 10));
  b.cupti(0x1000, 4096, 10);
  // A module's __device__ and __managed__ variables, placed at module load
  // (pc 0: no API call); and one ordinary record the hooks did miss.
  b.cupti(0x7fb8da600000, 102400, 8, 0, fmt::CuptiMemoryKind::kDeviceStatic, "kernel_table");
  b.cupti(0x7fb8da619000, 2304, 8, 0, fmt::CuptiMemoryKind::kDeviceStatic);
  b.cupti(0x7fb8da620000, 2016, 8, 0, fmt::CuptiMemoryKind::kManagedStatic, "counters");
  b.cupti(0x9000, 144, 40, 0x77);
  const CuptiView v = matcher.finish();
  CHECK(v.matched == 1);
  CHECK(v.hooks_only == 0);
  CHECK(v.module_statics == 3);
  CHECK(v.module_statics_bytes == 102400 + 2304 + 2016);
  REQUIRE(v.module_statics_list.size() == 3);
  CHECK(v.module_statics_list[0].name == "kernel_table");
  CHECK(v.module_statics_list[0].cupti_kind == static_cast<uint8_t>(fmt::CuptiMemoryKind::kDeviceStatic));
  CHECK(v.module_statics_list[1].name.empty());
  CHECK(v.module_statics_list[2].name == "counters");
  // A genuine disagreement stays one.
  CHECK(v.cupti_only == 1);
  CHECK(v.cupti_only_bytes == 144);
  REQUIRE(v.cupti_only_list.size() == 1);
  CHECK(v.cupti_only_list[0].cupti_kind == static_cast<uint8_t>(fmt::CuptiMemoryKind::kDevice));
  CHECK(v.cupti_allocations == v.matched + v.cupti_only + v.module_statics);
}

TEST_CASE("an old trace's CUPTI records, without CUPTI's kind, are compared as before") {
  CuptiTraceBuilder b;
  b.status(fmt::CuptiStatus::kActive, 5, "CUPTI active");
  CuptiMatcher matcher(b.trace);
  b.cupti(0x7fb8da600000, 102400, 8, 0, fmt::CuptiMemoryKind::kUnknown);
  const CuptiView v = matcher.finish();
  CHECK(v.module_statics == 0);
  CHECK(v.cupti_only == 1);
}
