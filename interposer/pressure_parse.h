// Parsers for the kernel files the pressure sampler reads (/proc/meminfo,
// /proc/vmstat, /proc/pressure/memory, a memory cgroup's memory.events or
// memory.oom_control). Pure functions over a NUL-terminated buffer: no heap,
// no stdio, so the writer thread can call them, and tests can feed them text.
#pragma once

#include <cstdint>
#include <cstring>

namespace memledger::interposer {

// The unsigned number after `key` at the start of a line ("MemAvailable:",
// "pswpin ", "oom_kill "); false when no line starts with it.
inline bool field_after(const char* text, const char* key, uint64_t* out) {
  const size_t n = strlen(key);
  for (const char* line = text; line != nullptr && *line != '\0';) {
    if (strncmp(line, key, n) == 0) {
      const char* p = line + n;
      while (*p == ' ' || *p == '\t') ++p;
      if (*p < '0' || *p > '9') return false;
      uint64_t v = 0;
      while (*p >= '0' && *p <= '9') v = v * 10 + static_cast<uint64_t>(*p++ - '0');
      *out = v;
      return true;
    }
    line = strchr(line, '\n');
    if (line != nullptr) ++line;
  }
  return false;
}

struct Meminfo {
  uint64_t total = 0, available = 0, swap_total = 0, swap_free = 0;  // bytes
};

// /proc/meminfo (kB values). MemAvailable exists since Linux 3.14.
inline bool parse_meminfo(const char* text, Meminfo* out) {
  uint64_t total, available, swap_total = 0, swap_free = 0;
  if (!field_after(text, "MemTotal:", &total) || !field_after(text, "MemAvailable:", &available)) return false;
  field_after(text, "SwapTotal:", &swap_total);
  field_after(text, "SwapFree:", &swap_free);
  out->total = total * 1024;
  out->available = available * 1024;
  out->swap_total = swap_total * 1024;
  out->swap_free = swap_free * 1024;
  return true;
}

// /proc/vmstat: pages swapped in and out since boot.
inline bool parse_vmstat(const char* text, uint64_t* swap_in, uint64_t* swap_out) {
  return field_after(text, "pswpin ", swap_in) && field_after(text, "pswpout ", swap_out);
}

struct Psi {
  uint64_t some_avg10 = 0, full_avg10 = 0;  // hundredths of a percent
  uint64_t some_total = 0, full_total = 0;  // microseconds
};

// "avg10=12.34" -> 1234 (hundredths), from the line starting with `kind`.
inline bool psi_line(const char* text, const char* kind, uint64_t* avg10, uint64_t* total) {
  const size_t n = strlen(kind);
  for (const char* line = text; line != nullptr && *line != '\0';) {
    if (strncmp(line, kind, n) == 0 && line[n] == ' ') {
      const char* a = strstr(line, "avg10=");
      const char* t = strstr(line, "total=");
      const char* end = strchr(line, '\n');
      if (a == nullptr || t == nullptr || (end != nullptr && (a > end || t > end))) return false;
      a += 6;
      uint64_t whole = 0, frac = 0;
      int digits = 0;
      while (*a >= '0' && *a <= '9') whole = whole * 10 + static_cast<uint64_t>(*a++ - '0');
      if (*a == '.') {
        ++a;
        while (*a >= '0' && *a <= '9' && digits < 2) {
          frac = frac * 10 + static_cast<uint64_t>(*a++ - '0');
          ++digits;
        }
      }
      while (digits++ < 2) frac *= 10;
      *avg10 = whole * 100 + frac;
      t += 6;
      uint64_t v = 0;
      while (*t >= '0' && *t <= '9') v = v * 10 + static_cast<uint64_t>(*t++ - '0');
      *total = v;
      return true;
    }
    line = strchr(line, '\n');
    if (line != nullptr) ++line;
  }
  return false;
}

// /proc/pressure/memory (Linux 4.20+, CONFIG_PSI). Kernels before 5.13 print
// no "full" line for the CPU, but memory always has both.
inline bool parse_psi(const char* text, Psi* out) {
  return psi_line(text, "some", &out->some_avg10, &out->some_total) &&
         psi_line(text, "full", &out->full_avg10, &out->full_total);
}

// memory.events (v2) and memory.oom_control (v1) both have "oom_kill N"
// (v1 since Linux 4.13).
inline bool parse_oom_kills(const char* text, uint64_t* out) { return field_after(text, "oom_kill ", out); }

// memory.max / memory.limit_in_bytes / memory.current: bytes; "max" or v1's
// huge page-aligned "unlimited" are 0 (no limit).
inline uint64_t parse_cgroup_bytes(const char* text) {
  if (strncmp(text, "max", 3) == 0) return 0;
  uint64_t v = 0;
  while (*text >= '0' && *text <= '9') v = v * 10 + static_cast<uint64_t>(*text++ - '0');
  return v >= (uint64_t{1} << 62) ? 0 : v;
}

}  // namespace memledger::interposer
