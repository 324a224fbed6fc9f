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
  void cupti(uint64_t addr, uint64_t bytes, uint64_t ts, uint64_t pc = 0x42) {
    TraceCuptiMemory m;
    m.ts = ts;
    m.addr = addr;
    m.bytes = bytes;
    m.pc = pc;
    m.kind = static_cast<uint8_t>(fmt::Kind::kDevice);
    trace.cupti_memory.push_back(m);
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
