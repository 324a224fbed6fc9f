#include <catch2/catch.hpp>

#include "analysis.h"
#include "notes.h"

using namespace memledger::report;

namespace {

bool has(const std::vector<std::string>& notes, const std::string& start) {
  for (const std::string& n : notes) {
    if (n.rfind(start, 0) == 0) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("notes: a clean trace has none", "[notes]") {
  Trace trace;
  CuptiView cupti;
  CHECK(collect_notes(NotesInput{.trace = trace, .cupti = cupti}).empty());
}

TEST_CASE("notes: every caveat, in the order the report prints them", "[notes]") {
  Trace trace;
  trace.problems = {"trace.bin: 1 damaged frame skipped"};
  trace.dropped = 12;
  trace.tracer_error = "disk full";
  trace.python_note = "Python frames: off";
  CuptiView cupti;
  cupti.status = "unavailable";
  cupti.message = "CUPTI was not found";
  NotesInput in{.trace = trace,
                .sampled = true,
                .sample_interval = 512 << 10,
                .events = 100,
                .stackless = 3,
                .unknown_frees = 5,
                .failed_allocations = 2,
                .ooms = 1,
                .growth = "only 2 steps after 1 warm-up steps: too few",
                .hidden_allocator = "PyTorch's caching allocator hides tensors",
                .cupti = cupti,
                .symbolizer_warnings = {"no debug info for libfoo.so"},
                .steps = "automatic steps: no loop"};
  const std::vector<std::string> notes = collect_notes(in);
  REQUIRE(notes.size() == 12);
  CHECK(notes[0] == "trace.bin: 1 damaged frame skipped");
  CHECK(notes[1].rfind("sampled host mode: per-site figures are estimates from allocations sampled every 512.0 KiB", 0) == 0);
  CHECK(notes[2] == in.growth);
  CHECK(notes[3] == "2 allocations failed (host and device), 1 of them out of memory");
  CHECK(notes[4] == in.hidden_allocator);
  CHECK(notes[5].rfind("12 events were dropped", 0) == 0);
  CHECK(notes[6].rfind("3 of 100 events are allocations recorded without a call stack", 0) == 0);
  CHECK(notes[7] == "the tracer stopped itself: disk full");  // unknown frees: expected when sampled
  CHECK(notes[8] == "Python frames: off");
  CHECK(notes[9] == "CUPTI was not found");
  CHECK(notes[10] == "no debug info for libfoo.so");
  CHECK(notes[11] == "automatic steps: no loop");
}

TEST_CASE("notes: unknown frees in full mode; stackless allocations only when stacks were asked for", "[notes]") {
  Trace trace;
  trace.header["stack_depth"] = "0";
  CuptiView cupti;
  const std::vector<std::string> notes =
      collect_notes(NotesInput{.trace = trace, .stackless = 4, .unknown_frees = 5, .cupti = cupti});
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].rfind("5 frees of addresses the trace never saw allocated", 0) == 0);
}

TEST_CASE("notes: CUPTI's disagreement with the hooks and its losses", "[notes]") {
  Trace trace;
  CuptiView cupti;
  cupti.status = "active";
  cupti.compared = true;
  cupti.hooks_only = 2;
  cupti.hooks_only_bytes = 2048;
  cupti.cupti_dropped = 7;
  cupti.end_message = "CUPTI handed over to another subscriber";
  const std::vector<std::string> notes = collect_notes(NotesInput{.trace = trace, .cupti = cupti});
  REQUIRE(notes.size() == 3);
  CHECK(notes[0] ==
        "CUPTI and the CUDA hooks disagree: 2 allocations seen only by the hooks (2.0 KiB), 0 seen only by CUPTI "
        "(0 B); see the CUPTI section");
  CHECK(has(notes, "CUPTI lost 7 activity records"));
  CHECK(notes[2] == cupti.end_message);
  cupti.status = "held";
  cupti.compared = false;
  cupti.message.clear();
  CHECK(collect_notes(NotesInput{.trace = trace, .cupti = cupti}) ==
        std::vector<std::string>{"CUPTI was not used (held)"});
}

TEST_CASE("notes: the host allocator, when host figures are incomplete or held bytes unknown", "[notes]") {
  Trace trace;
  trace.problems = {"trace.bin: 1 damaged frame skipped"};
  CuptiView cupti;
  HostAllocator ahead{.name = "jemalloc", .path = "/lib/libjemalloc.so.2", .reached = "comes before memledger",
                      .held_source = "mallctl stats.resident", .traced = false};
  std::vector<std::string> notes = collect_notes(NotesInput{.trace = trace, .cupti = cupti, .allocator = &ahead});
  REQUIRE(notes.size() == 2);
  // First: every host figure after it depends on it.
  CHECK(notes[0].rfind("host figures are incomplete, the host heap is not traced: the program's malloc is jemalloc "
                       "(/lib/libjemalloc.so.2), which comes before memledger;",
                       0) == 0);
  HostAllocator mute{.name = "other", .path = "/lib/libmine.so", .reached = "linked into the program", .held_known = false};
  notes = collect_notes(NotesInput{.trace = trace, .cupti = cupti, .allocator = &mute});
  REQUIRE(notes.size() == 2);
  CHECK(notes[1].rfind("held host bytes are unknown: other (/lib/libmine.so) offers none", 0) == 0);
  HostAllocator glibc{.name = "glibc", .reached = "the C library's own", .held_source = "mallinfo2"};
  CHECK(collect_notes(NotesInput{.trace = trace, .cupti = cupti, .allocator = &glibc}).size() == 1);
}

TEST_CASE("notes: RSS growing with no allocation to explain it is said, with the numbers", "[notes]") {
  auto steps = [](int64_t rss_per_step, int64_t live_per_step) {
    std::vector<StepStats> out;
    for (int64_t k = 1; k <= 20; ++k) {
      StepStats s;
      s.index = static_cast<uint64_t>(k);
      s.rss = static_cast<uint64_t>((100 << 20) + k * rss_per_step);
      s.live[0] = (10 << 20) + k * live_per_step;
      s.held_host = static_cast<uint64_t>(s.live[0] + (1 << 20));
      out.push_back(s);
    }
    return out;
  };
  // 8 MiB a step of resident memory, 64 KiB a step of heap.
  const std::string note = rss_without_live_note(steps(8 << 20, 64 << 10), 2, 0, true);
  CHECK(note.rfind("RSS grew 8.0 MiB/step over steps 3-20 while live and held bytes grew 64.0 KiB/step: ", 0) == 0);
  CHECK(note.find("CPython's small-object arenas are counted as mapped memory") != std::string::npos);
  CHECK(rss_without_live_note(steps(8 << 20, 64 << 10), 2, 0, false).find("Python") == std::string::npos);
  // Over time windows, per second.
  CHECK(rss_without_live_note(steps(8 << 20, 0), 2, 0.5, false).rfind("RSS grew 16.0 MiB/s over time windows 3-20", 0) == 0);
  // RSS that follows the heap, or grows by less than 32 MiB, is not.
  CHECK(rss_without_live_note(steps(8 << 20, 8 << 20), 2, 0, true).empty());
  CHECK(rss_without_live_note(steps(1 << 20, 0), 2, 0, true).empty());
  // Level RSS: nothing to say.
  CHECK(rss_without_live_note(steps(0, 0), 2, 0, true).empty());
}
