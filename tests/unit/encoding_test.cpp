#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <vector>

#include "trace_encoding.h"

namespace fmt = memledger::format;

TEST_CASE("varints round-trip at every width", "[encoding]") {
  std::vector<uint64_t> values = {0, 1, 127, 128, 255, 300, 16383, 16384, (1ull << 32) - 1, 1ull << 32,
                                  std::numeric_limits<uint64_t>::max()};
  std::vector<uint8_t> buf(values.size() * 10);
  size_t n = 0;
  for (uint64_t v : values) n += fmt::put_varint(buf.data() + n, v);
  fmt::Cursor c(buf.data(), n);
  for (uint64_t v : values) CHECK(c.varint() == v);
  CHECK(c.ok());
  CHECK(c.at_end());
}

TEST_CASE("zigzag keeps small negative deltas small", "[encoding]") {
  for (int64_t v : std::vector<int64_t>{0, -1, 1, -64, 63, std::numeric_limits<int64_t>::min(),
                    std::numeric_limits<int64_t>::max()}) {
    CHECK(fmt::unzigzag(fmt::zigzag(v)) == v);
  }
  uint8_t buf[10];
  CHECK(fmt::put_varint(buf, fmt::zigzag(-1)) == 1);
}

TEST_CASE("a cursor never reads past the end of malformed input", "[encoding]") {
  const uint8_t unterminated[] = {0x80, 0x80, 0x80};
  fmt::Cursor a(unterminated, sizeof unterminated);
  CHECK(a.varint() == 0);
  CHECK_FALSE(a.ok());

  const uint8_t too_long[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  fmt::Cursor b(too_long, sizeof too_long);
  b.varint();
  CHECK_FALSE(b.ok());

  const uint8_t string_past_end[] = {0x05, 'a', 'b'};
  fmt::Cursor c(string_past_end, sizeof string_past_end);
  CHECK(c.string().empty());
  CHECK_FALSE(c.ok());
  CHECK(c.byte() == 0);  // stays failed, stays in bounds
}
