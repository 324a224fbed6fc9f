#include "unwinder.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define UNW_LOCAL_ONLY
#include <libunwind.h>

#include "object_index.h"
#include "owned_use.h"
#include "pages.h"
#include "spin_lock.h"

namespace memledger::interposer {
namespace {

// DWARF register numbers on x86-64 (System V psABI, figure 3.36).
constexpr int kRegRbp = 6;
constexpr int kRegRsp = 7;
constexpr int kRegReturn = 16;

// One address's rule, packed in one word so that a reader sees it whole
// (0: not known yet):
//   bit 0       a rule is stored
//   bits 1..2   Kind
//   bit 3       the CFA is rbp + cfa_offset (else rsp + cfa_offset)
//   bit 4       the caller's rbp was saved at CFA + rbp_offset (else it is rbp now)
//   bits 8..15  generation: rules of an older one are learnt again
//   bits 16..31 rbp_offset (signed)
//   bits 32..63 cfa_offset (signed)
// The return address is always at CFA - 8 (a rule saying otherwise is kUnsupported).
enum class Kind : uint64_t { kStandard = 0, kOutermost = 1, kUnsupported = 2 };

struct Rule {
  Kind kind = Kind::kUnsupported;
  bool cfa_rbp = false;
  bool rbp_saved = false;
  int16_t rbp_offset = 0;
  int32_t cfa_offset = 0;
};

std::atomic<uint32_t> g_generation{0};

uint64_t pack(const Rule& r, uint32_t generation) {
  return 1 | static_cast<uint64_t>(r.kind) << 1 | static_cast<uint64_t>(r.cfa_rbp) << 3 |
         static_cast<uint64_t>(r.rbp_saved) << 4 | static_cast<uint64_t>(generation & 0xff) << 8 |
         static_cast<uint64_t>(static_cast<uint16_t>(r.rbp_offset)) << 16 |
         static_cast<uint64_t>(static_cast<uint32_t>(r.cfa_offset)) << 32;
}

// The rules, shared by every thread, one word a slot: open addressing on a
// hash of the address, a slot claimed by a compare-and-swap from 0 and never
// emptied again (a look-up ends at the first empty slot). A new rule whose
// neighbourhood is full takes the place of one of its rules, chosen in turn:
// the table is a cache, and the rules of addresses walked again (a training
// loop's) are learnt again and stay, where those met once (most of an
// import's) give way. A rule too wide for a slot is not kept (it is worked
// out at each walk): correct, only slower.
//
// The hash is a bijection of the address's 47 bits (a multiplication by an
// odd number modulo 2^47), whose top kSlotBits bits are the address's home
// slot: a slot keeps the hash's other bits and how far past the home slot it
// lies, which with the slot's place give the address back. A slot:
//   bits 0..29   the rule, narrowed (narrow_rule; its bit 0 is set)
//   bits 30..34  its distance from the home slot (below kProbes)
//   bits 35..63  the hash's low kTagBits bits
// An `import torch` (PyTorch 2.15) asks for the rules of 196,000 return
// addresses; with a slot of 16 bytes for each (its address and its rule),
// 2^17 of them in the same 2 MiB, a fifth of them found their neighbourhood full and were worked out
// again at each walk that reached them, 970,000 times in all (BENCHMARKS.md).
constexpr uint32_t kAddressBits = 47;  // user-space addresses on x86-64; others are not cached
constexpr uint32_t kSlotBits = 18;
constexpr uint32_t kTagBits = kAddressBits - kSlotBits;
constexpr size_t kSlots = size_t{1} << kSlotBits;  // 2 MiB, touched as used
constexpr uint32_t kProbes = 32;
constexpr uint32_t kRuleBits = 30;
constexpr uint32_t kDistanceBits = 5;
static_assert(kProbes <= (1u << kDistanceBits) && kRuleBits + kDistanceBits + kTagBits == 64);
constexpr uint64_t kRuleMask = (uint64_t{1} << kRuleBits) - 1;
// A slot's key (tag, distance) and the rule's bit 0, set in every used slot.
constexpr uint64_t kSlotKeyMask = ~kRuleMask | 1;
// A slot's key from the address's hash and the slot's distance from home,
// with the rule's bit 0 (a slot is its key | the narrowed rule).
inline uint64_t slot_key(uint64_t hash, uint32_t distance) {
  return hash << (64 - kTagBits) | uint64_t{distance} << kRuleBits | 1;
}
std::atomic<uint64_t> g_slots[kSlots];
// Rules that took another's place (learn_rule): which of a full
// neighbourhood's slots the next one takes.
std::atomic<uint32_t> g_replaced{0};

// pack()'s rule in the 30 bits of a slot: bits 0..4 as they are (bit 0 set), the
// generation (bits 5..12), the saved rbp's offset in 8-byte words (bits
// 13..17, signed) and the CFA's offset in 8-byte words (bits 18..29). Where
// a call is made the stack is 16-byte aligned, so a compiler's CFA offsets
// at return addresses are multiples of 16 and its rbp is saved in a word.
// widen_rule(narrow_rule(r)) == r where the rule fits; widen_rule reads
// bits 0..29 alone, so it takes a slot as it is.
inline uint64_t narrow_rule(uint64_t r) {
  const auto rbp_words = static_cast<uint64_t>(static_cast<int16_t>(r >> 16) >> 3) & 0x1f;
  const auto cfa_words = static_cast<uint64_t>(static_cast<uint32_t>(r >> 32) >> 3) & 0xfff;
  return (r & 0x1f) | ((r >> 8) & 0xff) << 5 | rbp_words << 13 | cfa_words << 18;
}
inline uint64_t widen_rule(uint64_t n) {
  const auto rbp_offset = static_cast<int16_t>(static_cast<int16_t>(static_cast<int16_t>((n >> 13) & 0x1f) << 11) >> 8);
  const auto cfa_offset = static_cast<uint32_t>((n >> 18) & 0xfff) << 3;
  return (n & 0x1f) | ((n >> 5) & 0xff) << 8 | static_cast<uint64_t>(static_cast<uint16_t>(rbp_offset)) << 16 |
         static_cast<uint64_t>(cfa_offset) << 32;
}

// --- Reading .eh_frame (DWARF 5 section 6.4, LSB "Exception Frames") -----

struct Reader {
  const uint8_t* p;
  uint8_t u8() { return *p++; }
  template <typename T>
  T fixed() {
    T v;
    memcpy(&v, p, sizeof v);
    p += sizeof v;
    return v;
  }
  uint64_t uleb() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = *p++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) break;
    }
    return v;
  }
  int64_t sleb() {
    int64_t v = 0;
    int shift = 0;
    uint8_t b;
    do {
      b = *p++;
      if (shift < 64) v |= static_cast<int64_t>(b & 0x7f) << shift;
      shift += 7;
    } while (b & 0x80);
    if (shift < 64 && (b & 0x40)) v |= -(int64_t{1} << shift);
    return v;
  }
};

// A DW_EH_PE-encoded pointer; `data_base` for datarel (.eh_frame_hdr).
bool read_encoded(Reader& r, uint8_t encoding, uint64_t data_base, uint64_t* out) {
  if (encoding == 0xff) return false;  // DW_EH_PE_omit
  const uint64_t at = reinterpret_cast<uint64_t>(r.p);
  uint64_t v;
  switch (encoding & 0x0f) {
    case 0x00: v = r.fixed<uint64_t>(); break;                                     // absptr
    case 0x01: v = r.uleb(); break;                                                // uleb128
    case 0x02: v = r.fixed<uint16_t>(); break;                                     // udata2
    case 0x03: v = r.fixed<uint32_t>(); break;                                     // udata4
    case 0x04: v = r.fixed<uint64_t>(); break;                                     // udata8
    case 0x09: v = static_cast<uint64_t>(r.sleb()); break;                         // sleb128
    case 0x0a: v = static_cast<uint64_t>(static_cast<int64_t>(r.fixed<int16_t>())); break;  // sdata2
    case 0x0b: v = static_cast<uint64_t>(static_cast<int64_t>(r.fixed<int32_t>())); break;  // sdata4
    case 0x0c: v = r.fixed<uint64_t>(); break;                                     // sdata8
    default: return false;
  }
  switch (encoding & 0x70) {
    case 0x00: break;                 // absolute
    case 0x10: v += at; break;        // pcrel
    case 0x30: v += data_base; break;  // datarel
    default: return false;            // textrel, funcrel, aligned: not used on x86-64 Linux
  }
  if (encoding & 0x80) v = *reinterpret_cast<const uint64_t*>(v);  // indirect
  *out = v;
  return true;
}

// Where a register's caller value is, as far as the rules need to know.
enum class Where : uint8_t { kSame, kCfaOffset, kUndefined, kOther };
struct RegRule {
  Where where = Where::kSame;
  int64_t offset = 0;
};
struct CfaState {
  uint64_t cfa_reg = kRegRsp;
  int64_t cfa_offset = 8;
  bool cfa_expression = false;
  RegRule rbp, rsp, ret;
};

struct Cie {
  uint64_t code_align = 1;
  int64_t data_align = -8;
  uint64_t return_reg = kRegReturn;
  uint8_t fde_encoding = 0;  // absptr
  bool augmented = false;    // 'z': FDEs carry an augmentation length
  bool signal_frame = false;
  const uint8_t* instructions = nullptr;
  const uint8_t* end = nullptr;
};

RegRule* rule_for(CfaState& s, uint64_t reg) {
  if (reg == kRegRbp) return &s.rbp;
  if (reg == kRegRsp) return &s.rsp;
  if (reg == kRegReturn) return &s.ret;
  return nullptr;  // a register the walk does not read
}

// DW_CFA_restore: the rule the CIE's initial instructions gave.
void restore_rule(CfaState& s, const CfaState& initial, uint64_t reg) {
  if (reg == kRegRbp) s.rbp = initial.rbp;
  if (reg == kRegRsp) s.rsp = initial.rsp;
  if (reg == kRegReturn) s.ret = initial.ret;
}

// Runs call-frame instructions over `s` while the location is at most
// `target` (libunwind's run_cfi_program). False on what the rules cannot
// follow: a malformed program, an unknown instruction.
bool run_cfi(const Cie& cie, const uint8_t* p, const uint8_t* end, uint64_t loc, uint64_t target,
             const CfaState& initial, CfaState& s) {
  constexpr int kStackDepth = 8;
  CfaState saved[kStackDepth];
  int depth = 0;
  Reader r{p};
  while (r.p < end && loc <= target) {
    uint8_t op = r.u8();
    const uint8_t operand = op & 0x3f;
    if (op & 0xc0) op &= 0xc0;
    switch (op) {
      case 0x40: loc += operand * cie.code_align; break;  // advance_loc
      case 0x80: {                                       // offset
        const int64_t off = static_cast<int64_t>(r.uleb()) * cie.data_align;
        if (RegRule* rr = rule_for(s, operand)) *rr = {Where::kCfaOffset, off};
        break;
      }
      case 0xc0: restore_rule(s, initial, operand); break;  // restore
      case 0x00: break;  // nop
      case 0x01: {       // set_loc
        uint64_t v;
        if (!read_encoded(r, cie.fde_encoding, 0, &v)) return false;
        loc = v;
        break;
      }
      case 0x02: loc += r.u8() * cie.code_align; break;
      case 0x03: loc += r.fixed<uint16_t>() * cie.code_align; break;
      case 0x04: loc += r.fixed<uint32_t>() * cie.code_align; break;
      case 0x05: {  // offset_extended
        const uint64_t reg = r.uleb();
        const int64_t off = static_cast<int64_t>(r.uleb()) * cie.data_align;
        if (RegRule* rr = rule_for(s, reg)) *rr = {Where::kCfaOffset, off};
        break;
      }
      case 0x06: restore_rule(s, initial, r.uleb()); break;  // restore_extended
      case 0x07: {  // undefined
        if (RegRule* rr = rule_for(s, r.uleb())) *rr = {Where::kUndefined, 0};
        break;
      }
      case 0x08: {  // same_value
        if (RegRule* rr = rule_for(s, r.uleb())) *rr = {Where::kSame, 0};
        break;
      }
      case 0x09: {  // register
        const uint64_t reg = r.uleb();
        r.uleb();
        if (RegRule* rr = rule_for(s, reg)) *rr = {Where::kOther, 0};
        break;
      }
      case 0x0a:  // remember_state
        if (depth == kStackDepth) return false;
        saved[depth++] = s;
        break;
      case 0x0b:  // restore_state (the CFA rule with the registers', as libunwind does)
        if (depth == 0) return false;
        s = saved[--depth];
        break;
      case 0x0c:  // def_cfa
        s.cfa_reg = r.uleb();
        s.cfa_offset = static_cast<int64_t>(r.uleb());
        s.cfa_expression = false;
        break;
      case 0x0d: s.cfa_reg = r.uleb(); s.cfa_expression = false; break;  // def_cfa_register
      case 0x0e: s.cfa_offset = static_cast<int64_t>(r.uleb()); break;   // def_cfa_offset
      case 0x0f: {  // def_cfa_expression
        const uint64_t len = r.uleb();
        r.p += len;
        s.cfa_expression = true;
        break;
      }
      case 0x10:    // expression
      case 0x16: {  // val_expression
        const uint64_t reg = r.uleb();
        const uint64_t len = r.uleb();
        r.p += len;
        if (RegRule* rr = rule_for(s, reg)) *rr = {Where::kOther, 0};
        break;
      }
      case 0x11: {  // offset_extended_sf
        const uint64_t reg = r.uleb();
        const int64_t off = r.sleb() * cie.data_align;
        if (RegRule* rr = rule_for(s, reg)) *rr = {Where::kCfaOffset, off};
        break;
      }
      case 0x12:  // def_cfa_sf
        s.cfa_reg = r.uleb();
        s.cfa_offset = r.sleb() * cie.data_align;
        s.cfa_expression = false;
        break;
      case 0x13: s.cfa_offset = r.sleb() * cie.data_align; break;  // def_cfa_offset_sf
      case 0x14:                                                 // val_offset
      case 0x15: {                                               // val_offset_sf
        const uint64_t reg = r.uleb();
        if (op == 0x14) {
          r.uleb();
        } else {
          r.sleb();
        }
        if (RegRule* rr = rule_for(s, reg)) *rr = {Where::kOther, 0};
        break;
      }
      case 0x2e: r.uleb(); break;  // GNU_args_size
      case 0x2f: {                 // GNU_negative_offset_extended
        const uint64_t reg = r.uleb();
        const int64_t off = -static_cast<int64_t>(r.uleb()) * cie.data_align;
        if (RegRule* rr = rule_for(s, reg)) *rr = {Where::kCfaOffset, off};
        break;
      }
      default: return false;
    }
  }
  return true;
}

bool parse_cie(const uint8_t* at, Cie& cie) {
  Reader r{at};
  uint64_t length = r.fixed<uint32_t>();
  if (length == 0xffffffffu) length = r.fixed<uint64_t>();
  if (length == 0) return false;
  cie.end = r.p + length;
  if (r.fixed<uint32_t>() != 0) return false;  // an .eh_frame CIE has id 0
  const uint8_t version = r.u8();
  if (version != 1 && version != 3) return false;
  const char* augmentation = reinterpret_cast<const char*>(r.p);
  r.p += strlen(augmentation) + 1;
  cie.code_align = r.uleb();
  cie.data_align = r.sleb();
  cie.return_reg = version == 1 ? r.u8() : r.uleb();
  if (augmentation[0] != '\0' && augmentation[0] != 'z') return false;  // "eh" and other old forms
  const uint8_t* data_end = nullptr;
  if (augmentation[0] == 'z') {
    cie.augmented = true;
    const uint64_t len = r.uleb();
    data_end = r.p + len;
    for (const char* c = augmentation + 1; *c != '\0'; ++c) {
      if (*c == 'R') {
        cie.fde_encoding = r.u8();
      } else if (*c == 'L') {
        r.u8();
      } else if (*c == 'P') {
        const uint8_t enc = r.u8();
        uint64_t ignored;
        if (!read_encoded(r, enc & 0x7f, 0, &ignored)) return false;  // not followed (indirect)
      } else if (*c == 'S') {
        cie.signal_frame = true;
      } else {
        return false;
      }
    }
    r.p = data_end;
  }
  cie.instructions = r.p;
  return cie.instructions <= cie.end;
}

constexpr uint64_t kPagePresent = uint64_t{1} << 63, kPageSwapped = uint64_t{1} << 62,
                   kPageOfFile = uint64_t{1} << 61;

// `pagemap`'s word for the page holding `at`, 0 when it cannot be read.
uint64_t page_word(int pagemap, uintptr_t at) {
  const uintptr_t page = static_cast<uintptr_t>(getpagesize());
  uint64_t word = 0;
  if (syscall(SYS_pread64, pagemap, &word, sizeof word, at / page * sizeof word) != sizeof word) return 0;
  return word;
}

// Whether `pagemap` tells a page the program wrote to from a page of a file,
// as Linux's does: a page of this thread's stack (written, private) and one
// of this function's code (the file's) must read so. An emulated /proc that
// answers zeros would otherwise make every page look clean.
__attribute__((noinline)) bool pagemap_tells_written_pages(int pagemap) {
  volatile uint64_t on_stack = 1;
  const uint64_t stack = page_word(pagemap, reinterpret_cast<uintptr_t>(&on_stack));
  const uint64_t code = page_word(pagemap, reinterpret_cast<uintptr_t>(&pagemap_tells_written_pages));
  constexpr uint64_t kKind = kPagePresent | kPageOfFile;
  return (stack & kKind) == kPagePresent && (code & kKind) == kKind;
}

// Hands back the pages of [low, high) (a private file mapping, read-only
// now) that are still the file's, by `pagemap` (/proc/self/pagemap: a
// word a page, bit 63 present, 62 swapped, 61 a page of the file): a run
// of pages neither written to (present and not the file's) nor swapped
// goes in one madvise. Returns the bytes of those runs.
size_t hand_back_clean(int pagemap, uintptr_t low, uintptr_t high) {
  constexpr size_t kBatch = 128;
  const uintptr_t page = static_cast<uintptr_t>(getpagesize());
  size_t bytes = 0;
  uintptr_t run = 0;  // the start of the run of clean pages, 0: none
  const auto end_run = [&](uintptr_t at) {
    if (run != 0 && madvise(reinterpret_cast<void*>(run), at - run, MADV_DONTNEED) == 0) bytes += at - run;
    run = 0;
  };
  uintptr_t at = low;
  while (at < high) {
    uint64_t entries[kBatch];
    const size_t want = std::min<size_t>(kBatch, (high - at) / page);
    const long got = syscall(SYS_pread64, pagemap, entries, want * sizeof(uint64_t), at / page * sizeof(uint64_t));
    if (got <= 0 || got % sizeof(uint64_t) != 0) break;
    for (size_t i = 0; i < static_cast<size_t>(got) / sizeof(uint64_t); ++i, at += page) {
      const uint64_t e = entries[i];
      const bool clean = (e & kPagePresent) ? (e & kPageOfFile) != 0 : (e & kPageSwapped) == 0;
      if (!clean) {
        end_run(at);
      } else if (run == 0) {
        run = at;
      }
    }
  }
  end_run(at);  // the range's end, or the first page pagemap did not answer for
  return bytes;
}

// The pages of the unwind tables a rule was worked out from are handed back
// to the kernel (madvise MADV_DONTNEED) every kEvery rules. They are clean
// pages of a file mapping, so what reads them next (a rule worked out, the
// program's own exception unwinding) faults them in again from the page
// cache: the tracer's resident memory does not grow by the tables it has
// read, tens of megabytes in libraries such as libtorch. Each pending range
// lies in one area, between the lowest and highest page read: a read-only
// segment, whose pages are all clean, or a RELRO part (ObjectLookup), whose
// pages are handed back only where /proc/self/pagemap says they are still
// the file's (hand_back_clean()): dropping one the loader wrote to would
// undo its relocations.
class ReadPages {
 public:
  // What is pending now; the bytes of the ranges handed back.
  size_t hand_back() {
    Range flushed[kRanges];
    int count;
    {
      SpinGuard guard(lock_);
      count = take(flushed);
    }
    return release(flushed, count);
  }

  // A rule was read from the bytes [low, high] of each of `parts` (the
  // search table's entry; the CIE and the FDE).
  void note(const ObjectLookup& object, const uintptr_t (&parts)[2][2]) {
    const uintptr_t page = static_cast<uintptr_t>(getpagesize());
    Range flushed[kRanges];
    int count = 0;
    {
      SpinGuard guard(lock_);
      bool room = true;
      for (const auto& part : parts) {
        uintptr_t area = 0;
        bool checked = false;
        if (object.segment_begin != 0 && part[0] >= object.segment_begin && part[1] < object.segment_end) {
          area = object.segment_begin;
        } else if (object.relro_begin != 0 && part[0] >= object.relro_begin && part[1] < object.relro_end) {
          area = object.relro_begin;
          checked = true;
        } else {
          continue;
        }
        const uintptr_t low = part[0] & ~(page - 1);
        const uintptr_t high = (part[1] & ~(page - 1)) + page;
        Range* range = nullptr;
        for (int i = 0; i < count_; ++i) {
          if (ranges_[i].area == area) range = &ranges_[i];
        }
        if (range == nullptr && count_ < kRanges) {
          range = &ranges_[count_++];
          *range = {area, low, high, checked};
        }
        if (range == nullptr) {
          room = false;
          continue;
        }
        range->low = low < range->low ? low : range->low;
        range->high = high > range->high ? high : range->high;
      }
      if (!room || ++rules_ >= kEvery) count = take(flushed);
    }
    release(flushed, count);
  }

 private:
  static constexpr int kRanges = 8;
  static constexpr int kEvery = 256;
  struct Range {
    uintptr_t area, low, high;
    bool checked;  // a RELRO part's: clean pages only
  };
  // Moves the pending ranges to `out` (lock_ held); their count.
  int take(Range* out) {
    const int count = count_;
    memcpy(out, ranges_, sizeof(Range) * static_cast<size_t>(count));
    count_ = 0;
    rules_ = 0;
    return count;
  }
  // Hands the ranges back (no lock held: madvise may take a while).
  static size_t release(const Range* ranges, int count) {
    if (count == 0) return 0;
    const int saved_errno = errno;
    size_t bytes = 0;
    int pagemap = -2;  // not opened yet
    for (int i = 0; i < count; ++i) {
      const Range& r = ranges[i];
      if (!r.checked) {
        if (madvise(reinterpret_cast<void*>(r.low), r.high - r.low, MADV_DONTNEED) == 0) bytes += r.high - r.low;
        continue;
      }
      // Opened for this hand-back only: a program that closes every
      // descriptor it did not open would otherwise close it, and a file
      // opened after would take its number. By the system calls: open,
      // pread and close are where a thread may be cancelled, and this runs
      // inside an allocation.
      if (pagemap == -2) {
        pagemap = static_cast<int>(syscall(SYS_openat, AT_FDCWD, "/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
        if (pagemap >= 0 && !pagemap_tells_written_pages(pagemap)) {
          syscall(SYS_close, pagemap);
          pagemap = -1;
        }
      }
      if (pagemap >= 0) bytes += hand_back_clean(pagemap, r.low, r.high);
    }
    if (pagemap >= 0) syscall(SYS_close, pagemap);
    errno = saved_errno;
    return bytes;
  }
  SpinLock lock_;
  Range ranges_[kRanges];
  int count_ = 0;
  int rules_ = 0;

 public:
  // For ForkHeldLocks: the list is held still across fork(), so that the
  // child gets it whole and its lock free.
  SpinLock* fork_lock() { return &lock_; }
};
ReadPages g_read_pages;
[[maybe_unused]] const bool g_read_pages_fork = fork_held_locks().add(g_read_pages.fork_lock());
ObjectIndex g_objects;

// The rule for a return address `pc` (the call is at pc - 1).
Rule compute_rule(uint64_t pc) {
  Rule rule;  // kUnsupported
  const uint64_t target = pc - 1;
  ObjectLookup lookup{target};
  g_objects.find(&lookup);
  if (lookup.hdr == nullptr || lookup.hdr[0] != 1) return rule;
  const uint8_t* hdr = lookup.hdr;
  // The binary search table: (initial location, FDE address) pairs, each
  // datarel sdata4 from the header (the only form GNU ld and lld write).
  if (hdr[3] != 0x3b) return rule;
  Reader r{hdr + 4};
  uint64_t eh_frame, count;
  const uint64_t base = reinterpret_cast<uint64_t>(hdr);
  if (!read_encoded(r, hdr[1], base, &eh_frame) || !read_encoded(r, hdr[2], base, &count) || count == 0) {
    return rule;
  }
  const int32_t* table = reinterpret_cast<const int32_t*>(r.p);
  size_t lo = 0, hi = count;  // the last entry whose location is <= target
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    if (base + static_cast<int64_t>(table[2 * mid]) <= target) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  if (base + static_cast<int64_t>(table[2 * lo]) > target) return rule;
  const uint8_t* fde = hdr + table[2 * lo + 1];

  Reader f{fde};
  uint64_t length = f.fixed<uint32_t>();
  if (length == 0 || length == 0xffffffffu) return rule;
  const uint8_t* fde_end = f.p + length;
  const uint8_t* id_at = f.p;
  const uint32_t cie_offset = f.fixed<uint32_t>();
  if (cie_offset == 0) return rule;
  Cie cie;
  if (!parse_cie(id_at - cie_offset, cie) || cie.signal_frame || cie.return_reg != kRegReturn) return rule;
  uint64_t start, range;
  if (!read_encoded(f, cie.fde_encoding, 0, &start) || !read_encoded(f, cie.fde_encoding & 0x0f, 0, &range)) {
    return rule;
  }
  if (target < start || target >= start + range) return rule;  // in no function's FDE
  if (cie.augmented) f.p += f.uleb();

  CfaState initial;
  if (!run_cfi(cie, cie.instructions, cie.end, 0, UINT64_MAX, initial, initial)) return rule;
  CfaState s = initial;
  if (!run_cfi(cie, f.p, fde_end, start, target, initial, s)) return rule;
  {
    // Everything this rule was read from: the search table's entry, the CIE, the FDE.
    const auto* entry = reinterpret_cast<const uint8_t*>(table + 2 * lo);
    const uint8_t* cie_at = id_at - cie_offset;
    const uint8_t* high = fde_end > cie.end ? fde_end : cie.end;
    const uintptr_t parts[2][2] = {
        {reinterpret_cast<uintptr_t>(entry), reinterpret_cast<uintptr_t>(entry + 8) - 1},
        {reinterpret_cast<uintptr_t>(cie_at < fde ? cie_at : fde), reinterpret_cast<uintptr_t>(high) - 1}};
    g_read_pages.note(lookup, parts);
  }

  if (s.ret.where == Where::kUndefined || s.rbp.where == Where::kUndefined) {
    // The psABI's end of the call chain (_start, a thread's clone).
    rule.kind = Kind::kOutermost;
    return rule;
  }
  if (s.cfa_expression || (s.cfa_reg != kRegRsp && s.cfa_reg != kRegRbp)) return rule;
  if (s.cfa_offset < INT32_MIN || s.cfa_offset > INT32_MAX) return rule;
  if (s.ret.where != Where::kCfaOffset || s.ret.offset != -8) return rule;
  if (s.rsp.where != Where::kSame) return rule;
  if (s.rbp.where == Where::kCfaOffset) {
    if (s.rbp.offset < INT16_MIN || s.rbp.offset > INT16_MAX) return rule;
    rule.rbp_saved = true;
    rule.rbp_offset = static_cast<int16_t>(s.rbp.offset);
  } else if (s.rbp.where != Where::kSame) {
    return rule;
  }
  rule.kind = Kind::kStandard;
  rule.cfa_rbp = s.cfa_reg == kRegRbp;
  rule.cfa_offset = static_cast<int32_t>(s.cfa_offset);
  return rule;
}

// A walk's loader section, entered at its first need and left at its end.
class LoaderUse {
 public:
  explicit LoaderUse(const LoaderAccess* access) : access_(access) {}
  LoaderUse(const LoaderUse&) = delete;
  LoaderUse& operator=(const LoaderUse&) = delete;
  ~LoaderUse() {
    if (state_ == kEntered && access_ != nullptr) access_->leave();
  }
  bool enter() {
    if (state_ == kNone) state_ = access_ == nullptr || access_->enter() ? kEntered : kRefused;
    return state_ == kEntered;
  }

 private:
  enum State : uint8_t { kNone, kEntered, kRefused };
  const LoaderAccess* access_;
  State state_ = kNone;
};

// rule_of()'s slow part: works the rule for `pc` out and keeps it in its
// slot (`hash`: the address's, as rule_of made it).
__attribute__((noinline)) uint64_t learn_rule(uint64_t pc, LoaderUse& loader, uint32_t generation, uint64_t hash) {
  if (!loader.enter()) return 0;
  const uint64_t fresh = pack(compute_rule(pc), generation);
  const uint64_t narrow = narrow_rule(fresh);
  if (pc >> kAddressBits != 0 || widen_rule(narrow) != fresh) return fresh;  // not for the table
  const size_t home = static_cast<size_t>(hash >> kTagBits);
  for (uint32_t distance = 0; distance < kProbes; ++distance) {
    std::atomic<uint64_t>& slot = g_slots[(home + distance) & (kSlots - 1)];
    const uint64_t key = slot_key(hash, distance);
    uint64_t seen = slot.load(std::memory_order_acquire);
    if (seen == 0 && slot.compare_exchange_strong(seen, key | narrow, std::memory_order_acq_rel)) {
      return fresh;
    }
    // Taken: by this address (an older generation's rule, or another
    // thread's of this one), or by another address (look on).
    if ((seen & kSlotKeyMask) == key) {
      slot.store(key | narrow, std::memory_order_release);
      return fresh;
    }
  }
  // A full neighbourhood: the rule takes the place of one of its rules.
  // (Two threads that learn one address at once may each keep it: either
  // copy holds its rule.)
  const uint32_t distance = g_replaced.fetch_add(1, std::memory_order_relaxed) % kProbes;
  g_slots[(home + distance) & (kSlots - 1)].store(slot_key(hash, distance) | narrow, std::memory_order_release);
  return fresh;
}

// The rule for return address `pc`, from the table or worked out now; 0
// when it must be worked out and the loader section is refused.
inline uint64_t rule_of(uint64_t pc, LoaderUse& loader) {
  const uint32_t generation = g_generation.load(std::memory_order_relaxed) & 0xff;
  const uint64_t hash = (pc * 0x9e3779b97f4a7c15ull) & ((uint64_t{1} << kAddressBits) - 1);
  if (__builtin_expect(pc >> kAddressBits == 0, 1)) {
    const size_t home = static_cast<size_t>(hash >> kTagBits);
    uint64_t key = slot_key(hash, 0);
    for (uint32_t distance = 0; distance < kProbes; ++distance, key += uint64_t{1} << kRuleBits) {
      const uint64_t seen = g_slots[(home + distance) & (kSlots - 1)].load(std::memory_order_acquire);
      // The key holds the rule's bit 0: an empty slot is never a match.
      if (((seen ^ key) & kSlotKeyMask) == 0) {
        if (((seen >> 5) & 0xff) == generation) return widen_rule(seen);
        break;
      }
      if (seen == 0) break;
    }
  }
  return learn_rule(pc, loader, generation, hash);
}

enum class Mode : uint8_t { kFast, kLibunwind, kCheck };
Mode g_mode = Mode::kFast;
std::atomic<uint64_t> g_checked{0}, g_handed_over{0}, g_differed{0};
constexpr int kMaxFrames = 256;  // more than a capture asks for (StackTable::kMaxNativeDepth + 16)
// A walk records one state per frame it returns.
static_assert(kMaxFrames <= UnwindMemo::kStates);

}  // namespace

void unwinder_release_kept(UnwindMemo& memo) {
  memo.walks_made = 0;
  if (memo.kept_end == 0) return;  // nothing kept since the last release
  const auto begin = reinterpret_cast<uintptr_t>(&memo.known[0]);
  const auto end = reinterpret_cast<uintptr_t>(memo.kept + UnwindMemo::kKept);
  // The parts of pages at the edges (shared with the rest of the memo),
  // and all of it where nothing was handed back, are cleared by hand.
  const PageSpan gone = hand_back_whole_pages(begin, end);
  memset(reinterpret_cast<void*>(begin), 0, gone.first - begin);
  memset(reinterpret_cast<void*>(gone.last), 0, end - gone.last);
  memo.kept_end = 0;
}

void unwinder_modules_unloaded() { g_generation.fetch_add(1, std::memory_order_release); }

size_t unwinder_hand_back_read_pages() { return g_read_pages.hand_back(); }

bool unwinder_configure(const char* choice) {
  if (choice == nullptr || *choice == '\0' || strcmp(choice, "fast") == 0) {
    g_mode = Mode::kFast;
  } else if (strcmp(choice, "libunwind") == 0) {
    g_mode = Mode::kLibunwind;
  } else if (strcmp(choice, "check") == 0) {
    g_mode = Mode::kCheck;
  } else {
    return false;
  }
  return true;
}

bool unwinder_checking() { return g_mode == Mode::kCheck; }

namespace {

// Walks from a frame whose return address, stack pointer (its callee's CFA)
// and frame pointer are given, recording the return address first, as
// libunwind's tdep_trace does. -1: a frame the rules do not cover; -2: a
// rule to work out, and no loader section for it.
//
// With a memo (UnwindMemo): the last walk's frames and this one's are both
// in stack order (each frame's stack pointer above the one before), so one
// cursor finds where this walk reaches a frame of the last one. From such
// a frame on, the last walk is followed while the stack agrees with it.
// Its states are internally consistent (each one the rule of the one
// before applied to the values it read), so when a state agrees in every
// register its rule reads and the values read from the same addresses are
// the same, the next state is the same: by induction the walk is.
constexpr uint64_t kRbpMatters = 1u << 5;  // in a memo state's rule word: the rest of that walk reads rbp
// In a memo state's rule word: that walk went on from this state by its
// rule (a standard one) to the next state, which has a rule of its own.
constexpr uint64_t kFollowable = 1u << 6;

// The canonical frame address by a standard rule, from the registers it reads.
inline uint64_t cfa_of(uint64_t rule, uint64_t rsp, uint64_t rbp) {
  return ((rule & 8) ? rbp : rsp) + static_cast<int64_t>(static_cast<int32_t>(rule >> 32));
}

// Whether a walk at these registers is at memo state `s`: the same return
// address and stack pointer, and the same frame pointer where the rest of
// that walk reads it.
inline bool at_state(const UnwindMemo::State& s, uint64_t rip, uint64_t rsp, uint64_t rbp) {
  return s.rsp == rsp && s.rip == rip && s.rule != 0 && (!(s.rule & kRbpMatters) || s.rbp == rbp);
}

// The last walk again, whole: from the same first frame (return address,
// stack pointer and, where read, frame pointer) every next one where the
// stack holds what that walk read, ending the same way (the outermost
// frame, or the frame limit at the same frame). Its frame count, with the
// frames in `frames` (whose first is the caller's); 0 where this walk parts
// from the last one, which the general walk then makes. The memo is left
// as it is: it describes this walk too (the frame pointers it keeps where
// no rule reads them are never compared).
inline int walk_again(const UnwindMemo::State* last, uint32_t last_count, uint64_t rbp, void** frames, int max) {
  const UnwindMemo::State* at = last;
  void** frame = frames + 1;
  void** const frames_end = frames + max;
  uint64_t rule = at->rule;
  while (rule & kFollowable) {
    const UnwindMemo::State* then = at + 1;
    const uint64_t then_rsp = then->rsp;
    const uint64_t then_rule = then->rule;
    if (rule & 16) rbp = *reinterpret_cast<const uint64_t*>(then_rsp + static_cast<int16_t>(rule >> 16));
    const uint64_t ret = *reinterpret_cast<const uint64_t*>(then_rsp - 8);
    if (ret != then->rip || ((then_rule & kRbpMatters) && rbp != then->rbp) || frame == frames_end) return 0;
    *frame++ = reinterpret_cast<void*>(ret);
    rule = then_rule;
    at = then;
  }
  const uint32_t k = static_cast<uint32_t>(at - last);
  int depth = static_cast<int>(frame - frames);
  const Kind kind = static_cast<Kind>((rule >> 1) & 3);
  if (kind == Kind::kOutermost && k + 1 == last_count) return depth;
  // The last walk stopped at the frame limit on the next frame.
  if (kind == Kind::kStandard && k + 2 == last_count && last[k + 1].rule == 0 && depth + 1 == max) {
    const uint64_t cfa = cfa_of(rule, at->rsp, rbp);
    const uint64_t ret = *reinterpret_cast<const uint64_t*>(cfa - 8);
    if (cfa != last[k + 1].rsp || ret != last[k + 1].rip) return 0;
    frames[depth++] = reinterpret_cast<void*>(ret);
    return depth;
  }
  return 0;
}

// A state as a walk records it.
inline void set_state(UnwindMemo::State& s, uint64_t rip, uint64_t rsp, uint64_t rbp, uint64_t rule) {
  s.rip = rip;
  s.rsp = rsp;
  s.rbp = rbp;
  s.rule = rule;
}

// A prepared walk again from its stack words alone (UnwindMemo::whole),
// from one of its states on, which the caller found the stack at: the
// compares of the states after it (UnwindMemo::checks), each frame's return
// address where the walk read it, and its rbp where a rule after reads it.
// What walk_again compares, less what cannot differ when this matches (a
// rule's CFA from a rbp already compared). In stack order, each one read
// only once those before it held: every word read is one the walk itself
// would read. True where the stack holds them all; the caller copies the
// frames (UnwindMemo::returns).
inline bool follow_whole(const UnwindMemo::Check* check, const UnwindMemo::Check* end) {
#pragma GCC unroll 2
  for (; check < end; ++check) {
    if (*reinterpret_cast<const uint64_t*>(check->at) != check->want) return false;
  }
  return true;
}

// Whether a prepared walk's states from `from` on, reached by a walk that
// compared the first of them (at_state), are the same walk as long as
// follow_whole's compares hold. The walk was prepared from its own first
// state, where the compares made sure of more rbp values: up to the first
// rule that restores rbp from the stack, each rbp a rule reads is the one
// at `from`, which at_state compared only where it is read.
inline bool followable_from(const UnwindMemo::State* states, uint32_t from) {
  if (states[from].rule & kRbpMatters) return true;
  for (uint32_t k = from; states[k].rule & kFollowable; ++k) {
    if (states[k].rule & 16) return true;
    if (states[k + 1].rule & kRbpMatters) return false;
  }
  return true;
}

// Prepares the walk in slot `slot` (`count` states, marks set) to be made
// again by follow_whole: writes its compares and returns its frame count,
// or 0 where walk_again would not follow it to its end, or where a rule
// reads a rbp that no compare made sure of. `cut`: it stopped at the frame
// limit. `prepared_from`, when less than `count`: the states from there on
// are those of slot `copied_slot`'s prepared walk from its state
// `copied_from` on (copied with their marks), which ended at its outermost
// frame, and this walk reached them through followable_from. They are
// prepared once this walk's own states are: followable_from held there,
// so either that state reads rbp (and the loop below returned 0 unless a
// compare made sure of it) or no rule after it reads rbp before one
// restores it from the stack (and from then on every compare is that
// walk's, copied).
inline uint32_t prepare_whole(UnwindMemo& memo, uint32_t slot, uint32_t count, bool* cut,
                              uint32_t prepared_from = UINT32_MAX, uint32_t copied_slot = 0,
                              uint32_t copied_from = 0) {
  *cut = false;
  const UnwindMemo::State* states = memo.slots[slot].states();
  if (count == 0 || states[0].rule == 0) return 0;
  UnwindMemo::Check* checks = memo.slots[slot].checks(count);
  // Until the end is known, to_end holds where each state's compares begin.
  uint16_t* to_end = memo.slots[slot].to_end(count);
  uint32_t n = 0;
  const auto finish = [&](uint32_t own, uint32_t end) {
    for (uint32_t i = 1; i <= own; ++i) to_end[i] = static_cast<uint16_t>(end - to_end[i]);
    memo.check_end[slot] = static_cast<uint16_t>(end);
  };
  // Whether the rbp of the state reached is the one the memo holds, once
  // the compares so far matched (at_state compares the first's where it matters).
  bool known = (states[0].rule & kRbpMatters) != 0;
  uint32_t k = 0;
  while (states[k].rule & kFollowable) {
    if (k >= prepared_from) {
      // The rest is the other walk's, from its state copied_from + 1 on.
      const UnwindMemo::Slot& copied = memo.slots[copied_slot];
      const uint32_t copied_count = memo.count[copied_slot];
      const uint16_t* theirs = copied.to_end(copied_count) + copied_from + 1;
      const uint32_t tail = theirs[0];
      memcpy(checks + n, copied.checks(copied_count) + memo.check_end[copied_slot] - tail,
             tail * sizeof(UnwindMemo::Check));
      memcpy(to_end + k + 1, theirs, (count - k) * sizeof(uint16_t));
      finish(k, n + tail);
      return count;
    }
    const uint64_t rule = states[k].rule;
    const UnwindMemo::State& then = states[k + 1];
    to_end[k + 1] = static_cast<uint16_t>(n);
    checks[n++] = {then.rsp - 8, then.rip};
    if (rule & 16) {
      known = (then.rule & kRbpMatters) != 0;
      if (known) checks[n++] = {then.rsp + static_cast<int16_t>(rule >> 16), then.rbp};
    } else if ((then.rule & kRbpMatters) && !known) {
      return 0;
    }
    ++k;
  }
  const Kind kind = static_cast<Kind>((states[k].rule >> 1) & 3);
  if (kind == Kind::kOutermost && k + 1 == count) {
    to_end[k + 1] = 0;
    finish(k, n);
    return k + 1;
  }
  if (kind == Kind::kStandard && k + 2 == count && states[k + 1].rule == 0 && (!(states[k].rule & 8) || known)) {
    to_end[k + 1] = static_cast<uint16_t>(n);
    checks[n++] = {states[k + 1].rsp - 8, states[k + 1].rip};
    finish(k + 1, n);
    to_end[k + 2] = 0;
    *cut = true;
    return k + 2;
  }
  return 0;
}

// The first entry of the set of UnwindMemo::known where walks that start
// at this return address and stack pointer are kept.
inline uint32_t known_set(uint64_t rip, uint64_t rsp) {
  return static_cast<uint32_t>(((rsp ^ rip * 0x9e3779b97f4a7c15ull) * 0xff51afd7ed558ccdull) >>
                               (64 - UnwindMemo::kKnownSetBits)) *
         UnwindMemo::kKnownWays;
}

// Keeps the walk just made in slot `slot` (prepared: `whole` set) in
// UnwindMemo::known, in the place of the one of its set kept first (whose
// compares and frames are the next to be written over).
inline void keep_walk(UnwindMemo& memo, uint32_t slot) {
  const uint32_t whole = memo.whole[slot];
  const uint32_t checks = memo.check_end[slot];
  const uint64_t units = checks + (whole + 1) / 2;
  uint64_t at = memo.kept_end;
  // Each walk's units in one piece: the end of the round left unused.
  if (at % UnwindMemo::kKept + units > UnwindMemo::kKept) at += UnwindMemo::kKept - at % UnwindMemo::kKept;
  memo.kept_end = at + units;
  UnwindMemo::Check* to = memo.kept + at % UnwindMemo::kKept;
  const UnwindMemo::Slot& held = memo.slots[slot];
  memcpy(to, held.checks(memo.count[slot]), checks * sizeof(UnwindMemo::Check));
  memcpy(to + checks, held.returns(memo.count[slot]), whole * sizeof(uint64_t));
  const UnwindMemo::State& first = held.states()[0];
  UnwindMemo::Known* const set = memo.known + known_set(first.rip, first.rsp);
  UnwindMemo::Known* oldest = set;
  for (uint32_t way = 1; way < UnwindMemo::kKnownWays; ++way) {
    if (set[way].rsp == 0 || set[way].kept_at < oldest->kept_at) oldest = set + way;
    if (oldest->rsp == 0) break;
  }
  UnwindMemo::Known& known = *oldest;
  known.rip = first.rip;
  known.rsp = first.rsp;
  known.rbp = first.rbp;
  known.kept_at = at;
  known.generation = memo.generation[slot];
  known.serial = memo.serials[slot];
  known.whole = static_cast<uint16_t>(whole);
  known.checks = static_cast<uint16_t>(checks);
  known.rbp_read = (first.rule & kRbpMatters) != 0;
  known.cut = memo.whole_cut[slot];
}

// A new walk number (0 is never one).
inline uint32_t next_serial(UnwindMemo& memo) {
  if (++memo.serial == 0) memo.serial = 1;
  return memo.serial;
}

// A walk found again, numbered `serial`: held long, it gets a new number,
// so that every number handed out stays within 2^27 walks of the newest
// (WalkReuse keeps the low 28 bits of one).
inline uint32_t recent_serial(UnwindMemo& memo, uint32_t& serial) {
  if (memo.serial - serial >= (1u << 27)) serial = next_serial(memo);
  return serial;
}

// Whether the caller's word for memo walk `made` says it made something of
// this walk's frames before (WalkReuse): then `reuse->reused` holds it, and
// the frames need not be written.
inline bool reused(WalkReuse* reuse, uint32_t made, uint32_t serial, uint32_t count) {
  if (reuse == nullptr) return false;
  const uint64_t word = reuse->words[made];
  if ((word & kWalkKeyMask) != walk_key(serial, count, reuse->bits)) return false;
  reuse->reused = word;
  return true;
}

// `walk_serial`: set to the serial of the memo walk whose frames these are.
// Inlined into its callers: the entry points' checks and the walk are one
// function on the hooks' path.
__attribute__((always_inline)) inline int walk(uint64_t rip, uint64_t rsp, uint64_t rbp, void** frames, int max,
                                               UnwindMemo* memo, LoaderUse& loader, uint32_t* walk_serial = nullptr,
                                               WalkReuse* reuse = nullptr) {
  int depth = 0;
  if (max <= 0) return 0;
  frames[depth++] = reinterpret_cast<void*>(rip);
  const UnwindMemo::State* last = nullptr;
  uint32_t last_slot = 0, last_count = 0, last_whole = 0;
  UnwindMemo::State* out = nullptr;
  uint32_t generation = 0, next = 0;
  if (memo != nullptr) {
    generation = g_generation.load(std::memory_order_relaxed);
    const uint32_t current = memo->current % UnwindMemo::kWalks;
    // The common case in a loop: the same call, the same stack, as the last
    // walk or one made shortly before.
    for (uint32_t j = 0; j < UnwindMemo::kWalks; ++j) {
      const uint32_t k = (current + j) % UnwindMemo::kWalks;
      const UnwindMemo::State* held = memo->slots[k].states();
      // An empty slot's first stack pointer is 0, never a walk's.
      if (memo->first_rsp[k] != rsp || memo->generation[k] != generation || !at_state(held[0], rip, rsp, rbp)) continue;
      int again;
      const uint32_t whole = memo->whole[k];
      if (whole != 0) {
        // As walk_again: the frame limit the walk stopped at, or room for its frames.
        if (memo->whole_cut[k] ? whole != static_cast<uint32_t>(max) : whole > static_cast<uint32_t>(max)) continue;
        const UnwindMemo::Check* checks = memo->slots[k].checks(memo->count[k]);
        again = follow_whole(checks, checks + memo->check_end[k]) ? static_cast<int>(whole) : 0;
      } else {
        again = walk_again(held, memo->count[k], rbp, frames, max);
      }
      if (again > 0) {
        memo->current = k;
        memo->made = k;
        memo->used[k] = ++memo->tick;
        const uint32_t serial = recent_serial(*memo, memo->serials[k]);
        if (walk_serial != nullptr) *walk_serial = serial;
        // walk_again wrote the frames as it went; a walk made from stack
        // words alone copies them unless the caller has their stack.
        if (!reused(reuse, k, serial, static_cast<uint32_t>(again)) && whole != 0) {
          memcpy(frames + 1, memo->slots[k].returns(memo->count[k]) + 1, (whole - 1) * sizeof(void*));
        }
        return again;
      }
    }
    // A walk made before, kept beyond the eight: one of those that start
    // here (callers that call the same function from the same depth at
    // different call sites, a loop unrolled).
    UnwindMemo::Known* const set = memo->known + known_set(rip, rsp);
    for (uint32_t way = 0; way < (memo->kept_end != 0 ? UnwindMemo::kKnownWays : 0); ++way) {
      UnwindMemo::Known& known = set[way];
      if (known.rsp != rsp || known.rip != rip || known.generation != generation ||
          (known.rbp_read && known.rbp != rbp) || memo->kept_end - known.kept_at > UnwindMemo::kKept ||
          (known.cut ? known.whole != static_cast<uint32_t>(max) : known.whole > static_cast<uint32_t>(max))) {
        continue;
      }
      const UnwindMemo::Check* checks = memo->kept + known.kept_at % UnwindMemo::kKept;
      if (follow_whole(checks, checks + known.checks)) {
        memo->made = UnwindMemo::kWalks + static_cast<uint32_t>(&known - memo->known);
        const uint32_t serial = recent_serial(*memo, known.serial);
        if (walk_serial != nullptr) *walk_serial = serial;
        if (!reused(reuse, memo->made, serial, known.whole)) {
          memcpy(frames + 1, reinterpret_cast<const uint64_t*>(checks + known.checks) + 1,
                 (known.whole - 1) * sizeof(void*));
        }
        return static_cast<int>(known.whole);
      }
    }
    if (memo->generation[current] == generation) {
      last_slot = current;
      last = memo->slots[current].states();
      last_count = memo->count[current];
      // Prepared to its outermost frame: a walk that reaches one of its
      // frames may compare the rest (follow_whole).
      if (memo->whole[current] == last_count && !memo->whole_cut[current]) last_whole = last_count;
    }
    // The slot of the walk least recently used, never the last walk's.
    next = (current + 1) % UnwindMemo::kWalks;
    for (uint32_t j = 2; j < UnwindMemo::kWalks; ++j) {
      const uint32_t k = (current + j) % UnwindMemo::kWalks;
      if (memo->tick - memo->used[k] > memo->tick - memo->used[next]) next = k;
    }
    out = memo->slots[next].states();
    // Empty until this walk is whole: one given up half way leaves no
    // states of two walks in one slot.
    memo->count[next] = 0;
    memo->first_rsp[next] = 0;
    memo->whole[next] = 0;
  }
  // States recorded from `same_from` on are the last walk's, to its end:
  // their kRbpMatters bits still hold (they depend only on what follows).
  constexpr uint32_t kNone = UINT32_MAX;
  uint32_t seen = 0, written = 0, same_from = kNone;
  // The state from which on this walk's states are the prepared last walk's
  // from its state `compared_seen` on, compared by follow_whole.
  uint32_t compared_from = kNone, compared_seen = 0;
  bool stopped = true;  // by the frame limit
  uint64_t looked_up_rip = 0, looked_up_rule = 0;
  while (depth < max) {
    uint64_t rule;
    while (seen < last_count && last[seen].rsp < rsp) ++seen;
    if (seen < last_count && at_state(last[seen], rip, rsp, rbp)) {
      if (same_from == kNone) same_from = written;
      // The rest of the last walk, where the stack holds what it read: its
      // stack words compared, its states copied (frames[depth - 1] is this
      // state's return address).
      const uint32_t rest = last_whole - seen;
      if (seen < last_whole && static_cast<uint32_t>(depth) - 1 + rest <= static_cast<uint32_t>(max) &&
          followable_from(last, seen) &&
          follow_whole(memo->slots[last_slot].checks(last_count) + memo->check_end[last_slot] -
                           memo->slots[last_slot].to_end(last_count)[seen + 1],
                       memo->slots[last_slot].checks(last_count) + memo->check_end[last_slot])) {
        memcpy(frames + depth, memo->slots[last_slot].returns(last_count) + seen + 1, (rest - 1) * sizeof(void*));
        memcpy(out + written, last + seen, rest * sizeof(UnwindMemo::State));
        out[written].rbp = rbp;
        compared_from = written;
        compared_seen = seen;
        written += rest;
        depth += static_cast<int>(rest) - 1;
        stopped = false;
        break;
      }
      // Else follow the last walk while the stack holds what it read.
      const UnwindMemo::State* __restrict at = last + seen;
      UnwindMemo::State* __restrict put = out + written;
      void** __restrict frame = frames + depth;
      void** const frames_end = frames + max;
      for (;;) {
        rule = at->rule;
        set_state(*put++, rip, rsp, rbp, rule);
        if (!(rule & kFollowable)) break;
        const UnwindMemo::State* then = at + 1;
        const uint64_t ret = *reinterpret_cast<const uint64_t*>(then->rsp - 8);
        const uint64_t saved =
            (rule & 16) ? *reinterpret_cast<const uint64_t*>(then->rsp + static_cast<int16_t>(rule >> 16)) : rbp;
        if (ret != then->rip || ((then->rule & kRbpMatters) && saved != then->rbp)) break;
        rip = ret;
        rsp = then->rsp;
        rbp = saved;
        at = then;
        *frame++ = reinterpret_cast<void*>(rip);
        if (frame == frames_end) break;
      }
      seen = static_cast<uint32_t>(at - last);
      written = static_cast<uint32_t>(put - out);
      depth = static_cast<int>(frame - frames);
      if (depth >= max) break;
    } else {
      // A recursion returns to the same address frame after frame: its
      // rule is the one just looked up.
      if (rip != looked_up_rip) {
        looked_up_rule = rule_of(rip, loader);
        if (looked_up_rule == 0) return -2;
        looked_up_rip = rip;
      }
      rule = looked_up_rule;
      same_from = kNone;
      if (out != nullptr) set_state(out[written++], rip, rsp, rbp, rule);
    }
    const Kind kind = static_cast<Kind>((rule >> 1) & 3);
    if (kind == Kind::kOutermost) {
      stopped = false;
      break;
    }
    if (kind != Kind::kStandard) return -1;
    const uint64_t cfa = cfa_of(rule, rsp, rbp);
    // A caller's frame lies above its callee's: anything else is unwind
    // information that does not describe this stack (libunwind decides).
    if (cfa <= rsp) return -1;
    rip = *reinterpret_cast<const uint64_t*>(cfa - 8);
    if (rule & 16) rbp = *reinterpret_cast<const uint64_t*>(cfa + static_cast<int16_t>(rule >> 16));
    rsp = cfa;
    if (rip < 0x4000) {  // libunwind's end of a bogus chain
      stopped = false;
      break;
    }
    same_from = kNone;  // a state the last walk did not reach this way
    frames[depth++] = reinterpret_cast<void*>(rip);
  }
  if (out != nullptr) {
    if (stopped) set_state(out[written++], rip, rsp, rbp, 0);
    // States copied from the last walk keep its marks, but the last one
    // copied may have no next state here, or a stop instead.
    if (written > 0) out[written - 1].rule &= ~kFollowable;
    if (stopped && written > 1) out[written - 2].rule &= ~kFollowable;
    // Which states' rbp the rest of this walk reads: the last state's if
    // its rule took the CFA from it (the walk ended on what that read); an
    // earlier state's if its rule does, or passes rbp on unchanged to a
    // state whose rbp is read. A walk cut short by the frame limit keeps
    // what the last walk said of the states it shares with it: more than
    // this walk reads, which only makes a match stricter.
    uint32_t i = written;
    bool read_after = false;
    if (same_from != kNone && same_from < written) {
      i = same_from;
      read_after = (out[i].rule & kRbpMatters) != 0;
    }
    while (i-- > 0) {
      uint64_t& rule = out[i].rule;
      if (rule == 0) continue;
      bool read = false;
      bool followable = false;
      if (static_cast<Kind>((rule >> 1) & 3) == Kind::kStandard) {
        read = (rule & 8) != 0 || (i + 1 < written && !(rule & 16) && read_after);
        followable = i + 1 < written && out[i + 1].rule != 0;
      }
      rule = (rule & ~(kRbpMatters | kFollowable)) | (read ? kRbpMatters : 0) | (followable ? kFollowable : 0);
      read_after = read;
    }
    bool cut = false;
    // Each state's return address is a frame: the walk made again copies them.
    memo->whole[next] = static_cast<uint32_t>(depth) == written
                            ? prepare_whole(*memo, next, written, &cut, compared_from, last_slot, compared_seen)
                            : 0;
    if (memo->whole[next] != 0) memcpy(memo->slots[next].returns(written), frames, written * sizeof(void*));
    memo->whole_cut[next] = cut;
    memo->count[next] = written;
    memo->first_rsp[next] = written > 0 ? out[0].rsp : 0;
    memo->generation[next] = generation;
    memo->current = next;
    memo->made = next;
    memo->used[next] = ++memo->tick;
    memo->serials[next] = next_serial(*memo);
    if (walk_serial != nullptr) *walk_serial = memo->serials[next];
    if (memo->whole[next] != 0) {
      if (memo->walks_made >= UnwindMemo::kKeepAfter) {
        keep_walk(*memo, next);
      } else {
        ++memo->walks_made;
      }
    }
  }
  return depth;
}

}  // namespace

// Both entry points keep a frame pointer (the library is built with
// -fno-omit-frame-pointer; the attribute says it where it matters): their
// caller's registers are read from it. The frame pointer holds the saved
// rbp, the return address sits above it, and the CFA above that.
__attribute__((noinline, optimize("no-omit-frame-pointer"))) int fast_backtrace_no_fallback(void** frames,
                                                                                            int max,
                                                                                            UnwindMemo* memo) {
  if (max > kMaxFrames) max = kMaxFrames;
  const uint64_t* fp = static_cast<const uint64_t*>(__builtin_frame_address(0));
  OwnedUse use(memo);
  LoaderUse loader(nullptr);
  return walk(fp[1], reinterpret_cast<uint64_t>(fp + 2), fp[0], frames, max, memo, loader);
}

namespace {

// libunwind's stack, from the caller of fast_backtrace() on (its first two
// frames are the returns into this function and into fast_backtrace()),
// without the leading frames in [skip_begin, skip_end).
__attribute__((noinline)) int libunwind_backtrace(void** frames, int max, uintptr_t skip_begin,
                                                  uintptr_t skip_end) {
  void* all[kMaxFrames + 2];
  const int n = unw_backtrace(all, kMaxFrames + 2);
  int first = 2;
  while (first < n && reinterpret_cast<uintptr_t>(all[first]) >= skip_begin &&
         reinterpret_cast<uintptr_t>(all[first]) < skip_end) {
    ++first;
  }
  int depth = n > first ? n - first : 0;
  if (depth > max) depth = max;
  memcpy(frames, all + first, static_cast<size_t>(depth) * sizeof(void*));
  return depth;
}

// The caller's registers, past its leading frames in [skip_begin,
// skip_end): code built with frame pointers (the hooks), left by the
// frame-pointer chain. False when that chain is not plausible.
inline bool skip_own_frames(const uint64_t* fp, uintptr_t skip_begin, uintptr_t skip_end, uint64_t* rip,
                            uint64_t* rsp, uint64_t* rbp) {
  *rbp = fp[0];
  *rip = fp[1];
  *rsp = reinterpret_cast<uint64_t>(fp + 2);
  for (int n = 0; *rip >= skip_begin && *rip < skip_end; ++n) {
    // The function at rip keeps its frame base in rbp: the saved rbp and
    // the return address sit there, its CFA above them.
    if (*rbp < *rsp || (*rbp & 7) != 0 || n == 64) return false;
    const uint64_t* frame = reinterpret_cast<const uint64_t*>(*rbp);
    *rip = frame[1];
    *rsp = *rbp + 16;
    *rbp = frame[0];
  }
  return true;
}

}  // namespace

__attribute__((noinline, optimize("no-omit-frame-pointer"))) int fast_backtrace(void** frames, int max,
                                                                              uintptr_t skip_begin,
                                                                              uintptr_t skip_end,
                                                                              UnwindMemo* memo,
                                                                              const LoaderAccess* access,
                                                                              uint32_t* walk_serial,
                                                                              const void* from_frame,
                                                                              WalkReuse* reuse) {
  if (walk_serial != nullptr) *walk_serial = 0;
  if (reuse != nullptr) reuse->reused = 0;
  if (max > kMaxFrames) max = kMaxFrames;
  LoaderUse loader(access);
  if (g_mode == Mode::kLibunwind) return loader.enter() ? libunwind_backtrace(frames, max, skip_begin, skip_end) : 0;
  const uint64_t* fp = static_cast<const uint64_t*>(from_frame != nullptr ? from_frame : __builtin_frame_address(0));
  uint64_t rip, rsp, rbp;
  OwnedUse use(memo);
  if (g_mode == Mode::kFast) {
    if (skip_own_frames(fp, skip_begin, skip_end, &rip, &rsp, &rbp)) {
      const int walked = walk(rip, rsp, rbp, frames, max, memo, loader, walk_serial, reuse);
      if (walked >= 0) return walked;
    }
    return loader.enter() ? libunwind_backtrace(frames, max, skip_begin, skip_end) : 0;
  }
  // kCheck
  if (!loader.enter()) return 0;
  void* mine[kMaxFrames];
  int walked = -1;
  if (skip_own_frames(fp, skip_begin, skip_end, &rip, &rsp, &rbp)) {
    walked = walk(rip, rsp, rbp, mine, max, memo, loader);
  }
  const int depth = libunwind_backtrace(frames, max, skip_begin, skip_end);
  g_checked.fetch_add(1, std::memory_order_relaxed);
  if (walked < 0) {
    g_handed_over.fetch_add(1, std::memory_order_relaxed);
  } else if (walked != depth || memcmp(mine, frames, static_cast<size_t>(depth) * sizeof(void*)) != 0) {
    g_differed.fetch_add(1, std::memory_order_relaxed);
  }
  return depth;
}

void unwinder_check_counts(uint64_t* checked, uint64_t* handed_over, uint64_t* differed) {
  *checked = g_checked.load(std::memory_order_relaxed);
  *handed_over = g_handed_over.load(std::memory_order_relaxed);
  *differed = g_differed.load(std::memory_order_relaxed);
}

}  // namespace memledger::interposer
