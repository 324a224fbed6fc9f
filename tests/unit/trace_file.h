// Trace files written by hand, as the writer lays them out, for tests of the
// reader: one frame, stored uncompressed.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>
#include <zlib.h>

#include "trace_encoding.h"
#include "trace_format.h"

namespace memledger::testing {

namespace fmt = memledger::format;

// A frame payload built as the writer encodes it.
class Payload {
 public:
  void tag(fmt::Tag t) { bytes.push_back(static_cast<uint8_t>(t)); }
  void u(uint64_t v) {
    uint8_t buf[10];
    bytes.insert(bytes.end(), buf, buf + fmt::put_varint(buf, v));
  }
  void s(int64_t v) { u(fmt::zigzag(v)); }
  void str(const std::string& text) {
    u(text.size());
    bytes.insert(bytes.end(), text.begin(), text.end());
  }
  std::vector<uint8_t> bytes;
};

// A trace file of this version holding `payload` as its only frame; returns
// its path (under /tmp, for the caller to remove).
inline std::string write_trace(const Payload& payload) {
  char path[] = "/tmp/memledger-trace-test-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  const std::string header = "pid=42\nhost_mode=full\n";
  fmt::FileHeader fh{};
  std::memcpy(fh.magic, fmt::kFileMagic, sizeof fh.magic);
  fh.version = fmt::kVersion;
  fh.header_len = static_cast<uint32_t>(header.size());
  fmt::FrameHeader frame{};
  frame.magic = fmt::kFrameMagic;
  frame.stored_len = frame.raw_len = static_cast<uint32_t>(payload.bytes.size());
  frame.crc32 = static_cast<uint32_t>(crc32(0L, payload.bytes.data(), static_cast<uInt>(payload.bytes.size())));
  REQUIRE(write(fd, &fh, sizeof fh) == sizeof fh);
  REQUIRE(write(fd, header.data(), header.size()) == static_cast<ssize_t>(header.size()));
  REQUIRE(write(fd, &frame, sizeof frame) == sizeof frame);
  REQUIRE(write(fd, payload.bytes.data(), payload.bytes.size()) == static_cast<ssize_t>(payload.bytes.size()));
  close(fd);
  return path;
}

}  // namespace memledger::testing
