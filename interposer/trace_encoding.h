// Varint and string encoding shared by the trace writer and the trace reader,
// so both sides agree byte for byte (see trace_format.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace memledger::format {

inline size_t put_varint(uint8_t* out, uint64_t value) {
  size_t n = 0;
  while (value >= 0x80) {
    out[n++] = static_cast<uint8_t>(value) | 0x80;
    value >>= 7;
  }
  out[n++] = static_cast<uint8_t>(value);
  return n;
}

inline uint64_t zigzag(int64_t value) {
  return (static_cast<uint64_t>(value) << 1) ^ static_cast<uint64_t>(value >> 63);
}
inline int64_t unzigzag(uint64_t value) {
  return static_cast<int64_t>(value >> 1) ^ -static_cast<int64_t>(value & 1);
}

// Reads records from a payload. Every accessor is bounds-checked: on malformed
// input `ok()` turns false and the accessors return zeros, never reading past
// the end.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool ok() const { return ok_; }
  bool at_end() const { return p_ >= end_; }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  uint8_t byte() {
    if (p_ >= end_) return fail();
    return *p_++;
  }
  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) return fail();
      uint8_t b = *p_++;
      value |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return value;
    }
    return fail();
  }
  int64_t svarint() { return unzigzag(varint()); }
  std::string_view string() {
    uint64_t len = varint();
    if (!ok_ || len > remaining()) {
      fail();
      return {};
    }
    std::string_view s(reinterpret_cast<const char*>(p_), len);
    p_ += len;
    return s;
  }

 private:
  uint8_t fail() {
    ok_ = false;
    p_ = end_;
    return 0;
  }
  const uint8_t* p_;
  const uint8_t* end_;
  bool ok_ = true;
};

}  // namespace memledger::format
