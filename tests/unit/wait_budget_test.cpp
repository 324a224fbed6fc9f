// WaitBudget: the time a wait may take counts what the waiting thread saw,
// never a pause of the whole process in full, nor the time the thread waited
// for is ready to run; the wall clock ends it anyway. thread_ready: read
// from /proc.
#include "../../interposer/wait_budget.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

using memledger::interposer::WaitBudget;

namespace {
constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kStart = 1'000 * kMs;

// Looks every `every` ns from kStart until the budget says stop; the time of that look.
uint64_t ends_at(WaitBudget& budget, uint64_t every) {
  uint64_t now = kStart;
  while (budget.go_on(now += every)) {
  }
  return now;
}
}  // namespace

TEST_CASE("a wait that looks often ends when its budget is spent", "[wait_budget]") {
  WaitBudget budget(500 * kMs, kStart);
  CHECK(ends_at(budget, 5 * kMs) == kStart + 500 * kMs);
  CHECK(budget.spent_ns() == 500 * kMs);
}

TEST_CASE("a pause of the whole process counts as one look at most", "[wait_budget]") {
  WaitBudget budget(500 * kMs, kStart);
  REQUIRE(budget.go_on(kStart + 5 * kMs));
  // The machine stops for 450 ms between two looks: the writer stopped too.
  REQUIRE(budget.go_on(kStart + 455 * kMs));
  CHECK(budget.spent_ns() == 5 * kMs + WaitBudget::kMostPerLook);
  // The rest of the budget is still there after the pause.
  uint64_t now = kStart + 455 * kMs;
  while (budget.go_on(now += 5 * kMs)) {
  }
  CHECK(now - (kStart + 455 * kMs) == 500 * kMs - 5 * kMs - WaitBudget::kMostPerLook);
}

TEST_CASE("the wall clock ends a wait whose looks keep being late", "[wait_budget]") {
  // Every look comes a second late: each counts kMostPerLook, so the budget
  // alone would last 25 looks; the wall clock ends it at four times the budget.
  WaitBudget budget(500 * kMs, kStart);
  const uint64_t end = ends_at(budget, 1'000 * kMs);
  CHECK(end == kStart + 2'000 * kMs);
  CHECK(budget.spent_ns() == 2 * WaitBudget::kMostPerLook);
}

TEST_CASE("a budget of nothing ends at the first look", "[wait_budget]") {
  WaitBudget budget(0, kStart);
  CHECK_FALSE(budget.go_on(kStart));
}

TEST_CASE("a clock read earlier than the last look counts nothing", "[wait_budget]") {
  WaitBudget budget(10 * kMs, kStart);
  REQUIRE(budget.go_on(kStart + 4 * kMs));
  REQUIRE(budget.go_on(kStart + 3 * kMs));
  CHECK(budget.spent_ns() == 4 * kMs);
}

TEST_CASE("time the thread waited for is ready to run counts nothing", "[wait_budget]") {
  // The writer has work and no processor (a busy machine): the wait goes on
  // past the budget, up to the wall clock's end.
  WaitBudget budget(500 * kMs, kStart);
  uint64_t now = kStart;
  while (budget.go_on(now += 5 * kMs, /*ready=*/true)) {
  }
  CHECK(now == kStart + 2'000 * kMs);
  CHECK(budget.spent_ns() == 0);
  // Waiting for something else counts again.
  WaitBudget mixed(500 * kMs, kStart);
  REQUIRE(mixed.go_on(kStart + 300 * kMs, true));
  REQUIRE(mixed.go_on(kStart + 305 * kMs, false));
  CHECK(mixed.spent_ns() == 5 * kMs);
}

TEST_CASE("thread_ready tells a thread with work from one that waits", "[wait_budget]") {
  using memledger::interposer::thread_ready;
  std::atomic<pid_t> spinner_tid{0}, sleeper_tid{0};
  std::atomic<bool> stop{false};
  std::mutex m;
  std::condition_variable cv;
  std::thread spinner([&] {
    spinner_tid = static_cast<pid_t>(syscall(SYS_gettid));
    while (!stop.load()) {
    }
  });
  std::thread sleeper([&] {
    sleeper_tid = static_cast<pid_t>(syscall(SYS_gettid));
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return stop.load(); });
  });
  while (spinner_tid == 0 || sleeper_tid == 0) std::this_thread::yield();
  // A look may catch the sleeper on its way into the wait: a few looks.
  bool sleeper_seen_waiting = false;
  for (int i = 0; i < 200 && !sleeper_seen_waiting; ++i) {
    sleeper_seen_waiting = !thread_ready(sleeper_tid);
    if (!sleeper_seen_waiting) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(sleeper_seen_waiting);
  CHECK(thread_ready(spinner_tid));
  CHECK(thread_ready(static_cast<pid_t>(syscall(SYS_gettid))));  // the thread that looks runs
  CHECK_FALSE(thread_ready(0));
  CHECK_FALSE(thread_ready(-1));
  {
    std::lock_guard<std::mutex> lock(m);
    stop = true;
  }
  cv.notify_all();
  spinner.join();
  sleeper.join();
  // A thread that ended is no longer there to be ready (join returns while
  // the kernel may still be taking the thread down: a few looks).
  bool gone = false;
  for (int i = 0; i < 1000 && !gone; ++i) {
    gone = !thread_ready(spinner_tid);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(gone);
}
