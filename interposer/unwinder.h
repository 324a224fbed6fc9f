// The native stack of the calling thread, as libunwind's unw_backtrace()
// gives it, at a fraction of its cost.
//
// Each return address is unwound by its DWARF call-frame information (the
// .eh_frame the compiler emits whether or not a function keeps a frame
// pointer), reduced to one rule per address: where the canonical frame
// address is (stack or frame pointer plus an offset), where the caller's
// frame pointer was saved, whether this is the outermost frame. Rules are
// computed once per address from the module's .eh_frame_hdr search table and
// kept in a table shared by all threads, so a warm walk costs one hashed
// look-up and one or two loads per frame. This is libunwind's own fast trace
// (src/x86_64/Gtrace.c) without its per-call cursor set-up and per-thread
// caches.
//
// Anything the rules do not express exactly (a signal frame, a stack
// realigned by an expression, a register rule, code without unwind
// information such as a JIT's) sends the whole walk to unw_backtrace(), so
// the result is always libunwind's (tests/unwind/unwind_test.cpp compares
// them on frames with and without frame pointers mixed in one stack).
#pragma once

#include <cstddef>
#include <cstdint>

namespace memledger::interposer {

// A thread's last walks, each frame's registers and rule, innermost first.
// A walk that starts where one of them started (same return address, stack
// pointer and, where the rest of the walk depends on it, frame pointer) is
// that walk again as long as the stack holds what that walk read from it:
// a loop that calls a few sites in turn makes a few walks over and over.
// Any other walk, once it reaches a frame of the last one, is the last
// walk from there on under the same condition: it compares the stack words
// the last walk read and copies its states, without working out a rule.
// The result is the walk's own, frame for frame. Owned by one thread at a
// time; mapped memory (ThreadRing).
struct UnwindMemo {
  static constexpr int kStates = 256;
  static constexpr uint32_t kWalks = 8;
  struct State {
    uint64_t rip;
    uint64_t rsp;
    uint64_t rbp;
    uint64_t rule;  // 0: the walk stopped here (enough frames)
  };
  // A stack word a walk made again from stack words alone compares, and
  // the value it must hold.
  struct Check {
    uint64_t at;
    uint64_t want;
  };
  // Set while a walk uses it: a signal handler that walks on the same
  // thread in the middle of that goes without.
  volatile uint32_t busy;
  uint32_t current;  // which slot holds the last walk made or followed again
  uint32_t count[kWalks];
  // Each slot's walk made again from the stack words alone: its frame count
  // (0: it cannot be, walk_again follows its rules) and whether it stopped
  // at the frame limit (then it is made again for that limit only). Set
  // as the walk is made.
  uint32_t whole[kWalks];
  bool whole_cut[kWalks];
  // Each slot's first stack pointer (0: empty), compared before the rest.
  uint64_t first_rsp[kWalks];
  uint32_t generation[kWalks];
  // Numbers the walks that wrote the slots (fast_backtrace's `walk_serial`):
  // `serial` the last one handed out, `serials` each slot's.
  uint32_t serial;
  uint32_t serials[kWalks];
  // When each slot's walk was last made or followed again (a count of walks):
  // a new walk takes the place of the one least recently used.
  uint32_t tick;
  uint32_t used[kWalks];
  // Where each slot's compares end (Slot::checks).
  uint16_t check_end[kWalks];
  // Each slot's walk: its states (every frame's registers and rule) and,
  // for a walk made again from stack words alone (`whole`), what it
  // compares, in stack order (`checks`). Each state after the first
  // (at_state compares that one) has its return address's word (rsp - 8,
  // which must hold `rip`), then, where its callee's rule restored rbp from
  // the stack and a rule after reads it, the word it was restored from.
  // `to_end`: how many compares there are from each state's first to the
  // end (0 at `whole`), which a walk that copies another's last states
  // copies with them. `returns`: the walk's frames, each state's return
  // address. One after the other, placed by the walk's state count (`count`
  // of the slot, or the count being written): a walk of a few dozen frames
  // touches a page or two of its slot, as many as its states alone would.
  struct Slot {
    // Bytes per state of each part before the next: a state, at most two
    // compares, a frame; then the counts to the end (one more than states).
    static constexpr size_t kChecksAt = sizeof(State);
    static constexpr size_t kReturnsAt = kChecksAt + 2 * sizeof(Check);
    static constexpr size_t kToEndAt = kReturnsAt + sizeof(uint64_t);
    static constexpr size_t kBytes = kStates * (kToEndAt + sizeof(uint16_t)) + 64;
    alignas(64) unsigned char bytes[kBytes];
    State* states() { return reinterpret_cast<State*>(bytes); }
    const State* states() const { return reinterpret_cast<const State*>(bytes); }
    Check* checks(uint32_t count) { return reinterpret_cast<Check*>(bytes + kChecksAt * count); }
    const Check* checks(uint32_t count) const { return reinterpret_cast<const Check*>(bytes + kChecksAt * count); }
    uint64_t* returns(uint32_t count) { return reinterpret_cast<uint64_t*>(bytes + kReturnsAt * count); }
    const uint64_t* returns(uint32_t count) const {
      return reinterpret_cast<const uint64_t*>(bytes + kReturnsAt * count);
    }
    uint16_t* to_end(uint32_t count) { return reinterpret_cast<uint16_t*>(bytes + kToEndAt * count); }
    const uint16_t* to_end(uint32_t count) const {
      return reinterpret_cast<const uint16_t*>(bytes + kToEndAt * count);
    }
  };
  Slot slots[kWalks];

  // Walks made before, beyond the eight held: each walk made again from
  // stack words alone is also kept here, by its first frame's return
  // address and stack pointer, its compares and frames in `kept` (written
  // in turn, round and round). A walk that none of the eight held starts
  // is looked up here before it is made: a loop that calls more sites, or
  // reaches them at more depths, than eight walks hold makes each of its
  // stacks again from compares alone. A walk is known by its first state
  // (as at_state), its compares and frames are where `kept_at` says (a
  // count of 16-byte units written so far: gone once `kept_end` is more
  // than kKept units past it).
  static constexpr uint32_t kKnownSetBits = 9;
  static constexpr uint32_t kKnownWays = 4;
  static constexpr uint32_t kKnown = kKnownWays << kKnownSetBits;
  static constexpr uint32_t kKept = 32768;  // 512 KiB
  struct Known {
    uint64_t rip;
    uint64_t rsp;  // 0: empty
    uint64_t rbp;
    uint64_t kept_at;
    uint32_t generation;
    uint32_t serial;  // as `serials`
    uint16_t whole;   // its frames
    uint16_t checks;  // its compares, then (whole + 1) / 2 units of frames
    bool rbp_read;    // its first state's rbp is read (kRbpMatters)
    bool cut;         // as `whole_cut`
  };
  Known known[kKnown];
  uint64_t kept_end;  // 0: none kept yet
  // Walks made since the memo was taken (unwinder_release_kept): walks are
  // kept from the kKeepAfter-th on, so that a thread that makes few (one of
  // a pool's) touches none of this memory.
  static constexpr uint32_t kKeepAfter = 256;
  uint32_t walks_made;
  Check kept[kKept];
  // Which walk gave the last frames: a slot of the eight held (below
  // kWalks), else kWalks plus its entry in `known`.
  uint32_t made;
};

// How a walk enters and leaves a loader section (Recorder::
// enter_loader_section) around what reads the loaded objects' list under
// glibc's loader lock: a first sight of an address, and libunwind. A walk
// whose every address has its rule already takes no section. enter()
// false: not now (a fork is under way), and the walk gives up (0 frames).
struct LoaderAccess {
  bool (*enter)();
  void (*leave)();
};

// What a caller made of a memo walk's frames before (Recorder::
// capture_stack: the stack's id), in one word per walk that it keeps,
// indexed by UnwindMemo::made: the walk's serial (bits 0..27), its frame
// count (28..36), the caller's own `bits` (37..39) and what it made
// (40..63). Where a walk is found again and its word says so,
// fast_backtrace() sets `reused` to the word (else 0), and the frames are
// not to be read: one made from stack words alone leaves them unwritten.
struct WalkReuse {
  const volatile uint64_t* words;
  uint64_t bits;  // in bits 37..39
  uint64_t reused;
};
inline constexpr uint64_t kWalkKeyMask = 0xffffffffffull;
inline uint64_t walk_key(uint32_t serial, uint32_t count, uint64_t bits) {
  return (serial & 0xfffffffu) | static_cast<uint64_t>(count) << 28 | bits;
}

// Fills `frames` with up to `max` return addresses, innermost first,
// starting with the one into the caller of this function: the array
// unw_backtrace() would give if called in its place, less its leading
// frames in [skip_begin, skip_end) (memledger's own: code that keeps frame
// pointers, left by their chain). Returns the count.
// `memo`: the calling thread's, or nullptr. `loader`: nullptr reads the
// loaded objects' list without a section (tests, benchmarks).
// `walk_serial`, when given: the serial of the memo walk whose frames these
// are (the walk just written, or the last one followed again frame for
// frame), else 0. Two walks with the same serial gave the same frames: a
// caller may reuse what it made of the first.
// `reuse`, when given: see WalkReuse.
// `from_frame`, when given: the frame pointer of a function of memledger's
// further up this thread's stack (a hook), where the walk starts instead
// of at this function's frame: the frames in between are memledger's.
int fast_backtrace(void** frames, int max, uintptr_t skip_begin = 0, uintptr_t skip_end = 0,
                   UnwindMemo* memo = nullptr, const LoaderAccess* loader = nullptr,
                   uint32_t* walk_serial = nullptr, const void* from_frame = nullptr,
                   WalkReuse* reuse = nullptr);

// The walk alone, for tests: -1 where fast_backtrace() hands over to
// libunwind.
int fast_backtrace_no_fallback(void** frames, int max, UnwindMemo* memo = nullptr);

// Forgets the walks `memo` keeps beyond the eight it holds and hands their
// memory back to the kernel (its pages read as zeros again, an empty store):
// for a memo that a new thread takes over, whose last thread may have
// stopped half way through keeping a walk (one a fork() left behind), and
// which would otherwise go on writing where that thread stopped, so that a
// program that starts thousands of threads in turn would touch all of it
// in each ring.
void unwinder_release_kept(UnwindMemo& memo);

// Loaded objects went away (dlclose): rules learnt for their addresses
// must not be applied to what is loaded there next.
void unwinder_modules_unloaded();

// The pages of the unwind tables a walk reads to work out new rules are
// handed back to the kernel every few hundred rules (they are clean pages of
// read-only file mappings: read again, they come back from the page cache).
// This hands back what is pending now and returns how many bytes that
// covered. For tests.
size_t unwinder_hand_back_read_pages();

// MEMLEDGER_UNWINDER (README, "Stacks"): "fast" (the default), "libunwind"
// (unw_backtrace() for every stack: the reference, for comparisons) or
// "check" (both for every stack, libunwind's kept, the differences
// counted and printed at exit). False for anything else.
bool unwinder_configure(const char* choice);
bool unwinder_checking();
// "check": stacks taken, stacks the rules handed over to libunwind, and
// stacks whose frames differed from libunwind's.
void unwinder_check_counts(uint64_t* checked, uint64_t* handed_over, uint64_t* differed);

}  // namespace memledger::interposer
