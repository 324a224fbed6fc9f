#include <catch2/catch.hpp>

#include <cstdint>

#include "held_reading.h"

using memledger::interposer::HeldReading;

namespace {

constexpr uint64_t kMs = 1'000'000;
constexpr int64_t kMiB = 1 << 20;

// An allocator whose statistics the test sets, counting the readings, each
// taking `took` of the clock.
struct FakeAllocator {
  uint64_t held = 0;
  uint64_t in_use = 0;
  uint64_t took = 30'000;  // 30 µs
  uint64_t now = 0;
  int readings = 0;

  // The allocator's figures, and the first reading of them (always taken).
  FakeAllocator(HeldReading& r, uint64_t held_bytes, uint64_t in_use_bytes, int64_t live)
      : held(held_bytes), in_use(in_use_bytes) {
    REQUIRE(read(r, false, live));
    REQUIRE(r.held == held_bytes);
    REQUIRE(r.in_use == in_use_bytes);
  }

  bool read(HeldReading& r, bool force, int64_t live) {
    return r.read(
        force, now, live,
        [this](uint64_t* h, uint64_t* u) {
          ++readings;
          *h = held;
          *u = in_use;
          return true;
        },
        [this] { return now + took; });
  }
};

}  // namespace

TEST_CASE("held bytes: a fast loop's step ends reuse a young reading", "[held]") {
  HeldReading r;
  FakeAllocator a(r, 64 * kMiB, 40 * kMiB, 40 * kMiB);

  // Steps of 2 ms with live bytes moving by less than 1/64 of held (1 MiB).
  for (int k = 1; k < 10; ++k) {
    a.now = static_cast<uint64_t>(k) * 2 * kMs;
    a.held += 4096;  // would be seen only by a reading
    CHECK_FALSE(a.read(r, false, 40 * kMiB + (k % 2 ? 512 << 10 : -(512 << 10))));
  }
  CHECK(a.readings == 1);
  // Live bytes grew by 512 KiB since the reading: the figures are raised by that much.
  CHECK(r.held == 64 * kMiB + (512 << 10));
  CHECK(r.in_use == 40 * kMiB + (512 << 10));

  // 20 ms after the reading: read again.
  a.now = 20 * kMs;
  CHECK(a.read(r, false, 40 * kMiB));
  CHECK(r.held == a.held);
  CHECK(a.readings == 2);
}

TEST_CASE("held bytes: live bytes that move read again at once", "[held]") {
  HeldReading r;
  FakeAllocator a(r, 8 * kMiB, 6 * kMiB, 6 * kMiB);
  // A leak of 1 MiB a step, 1 ms apart: above the 256 KiB floor at every step.
  for (int k = 1; k <= 5; ++k) {
    a.now = static_cast<uint64_t>(k) * kMs;
    a.held += kMiB;
    a.in_use += kMiB;
    CHECK(a.read(r, false, (6 + k) * kMiB));
    CHECK(r.held == a.held);
  }
  // Freeing moves them too: a fall of held bytes is read, not held up.
  a.now = 6 * kMs;
  a.held = 8 * kMiB;
  CHECK(a.read(r, false, 6 * kMiB));
  CHECK(r.held == 8 * kMiB);
  // Just under the floor: not read again.
  a.now = 7 * kMs;
  CHECK_FALSE(a.read(r, false, 6 * kMiB + (256 << 10) - 1));
  CHECK(a.readings == 7);
}

TEST_CASE("held bytes: forced and slow readings", "[held]") {
  HeldReading r;
  FakeAllocator a(r, 4 * kMiB, 3 * kMiB, 3 * kMiB);
  a.now = kMs;
  CHECK(a.read(r, true, 3 * kMiB));  // the final sample, a periodic one
  CHECK(a.readings == 2);

  // A reading that took 5 ms is not taken again for 32 times that.
  a.took = 5 * kMs;
  a.now = 2 * kMs;
  REQUIRE(a.read(r, true, 3 * kMiB));
  a.now = 2 * kMs + 100 * kMs;
  CHECK_FALSE(a.read(r, false, 3 * kMiB));
  a.now = 2 * kMs + 160 * kMs;
  CHECK(a.read(r, false, 3 * kMiB));
}

TEST_CASE("held bytes: an allocator without statistics stays unknown", "[held]") {
  HeldReading r;
  FakeAllocator a(r, 0, 0, kMiB);  // an allocator without statistics
  a.now = kMs;
  CHECK_FALSE(a.read(r, false, kMiB + 4096));
  CHECK(r.held == 0);
  CHECK(r.in_use == 0);
}

TEST_CASE("held bytes: an allocator with held bytes only keeps in use unknown", "[held]") {
  HeldReading r;
  FakeAllocator a(r, 16 * kMiB, 0, kMiB);  // mimalloc: committed bytes, no in-use figure
  a.now = kMs;
  CHECK_FALSE(a.read(r, false, kMiB + 4096));
  CHECK(r.held == 16 * kMiB + 4096);
  CHECK(r.in_use == 0);
}
