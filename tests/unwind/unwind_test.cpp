// The unwinder (interposer/unwinder.h) against libunwind's unw_backtrace()
// on stacks that mix frames with and without frame pointers, frames whose
// CFA is rbp-based, frames in the C library (qsort's callback), a thread's
// outermost frame and a signal handler's frame; the memo; when a walk
// takes a loader section; and the unwind tables' pages handed back.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <dlfcn.h>
#include <memory>
#include <thread>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <pthread.h>
#include <string>
#include <vector>

#define UNW_LOCAL_ONLY
#include <libunwind.h>

#include "chain.h"
#include "object_index.h"
#include "unwinder.h"

using memledger::interposer::fast_backtrace;
using memledger::interposer::fast_backtrace_no_fallback;

namespace {

struct Capture {
  std::vector<void*> libunwind, fast, walk;
  int walk_result = 0;
};

constexpr int kMax = 256;

// Both unwinders from one function: their first frames are returns into it
// from different calls, so the stacks are compared from the second frame on.
__attribute__((noinline)) int capture_here(Capture& c) {
  void* a[kMax];
  void* b[kMax];
  void* w[kMax];
  const int na = unw_backtrace(a, kMax);
  const int nb = fast_backtrace(b, kMax);
  const int nw = fast_backtrace_no_fallback(w, kMax);
  c.libunwind.assign(a + (na > 0 ? 1 : 0), a + na);
  c.fast.assign(b + (nb > 0 ? 1 : 0), b + nb);
  c.walk_result = nw;
  if (nw > 0) c.walk.assign(w + 1, w + nw);
  return na + nb;
}

int leaf_capture(void* arg) { return capture_here(*static_cast<Capture*>(arg)); }

std::string describe(const std::vector<void*>& frames) {
  std::string s;
  char buf[32];
  for (void* f : frames) {
    snprintf(buf, sizeof buf, " %p", f);
    s += buf;
  }
  return s;
}

void check_same(const Capture& c) {
  INFO("libunwind:" << describe(c.libunwind));
  INFO("fast:     " << describe(c.fast));
  REQUIRE(c.libunwind.size() > 3);
  CHECK(c.fast == c.libunwind);
}

// A pattern's chain, run from a fresh frame.
Capture run_chain(const char* pattern) {
  Capture c;
  chain_nofp(pattern, leaf_capture, &c);
  return c;
}

}  // namespace

TEST_CASE("the unwinder gives libunwind's stack through frames with and without frame pointers", "[unwind]") {
  for (const char* pattern : {"", "f", "n", "v", "fnv", "nnnn", "fffff", "nfnfnvnfvvn",
                              "vnfvnfvnfvnfvnfvnfvnfvnfvnfvnfvnfvnf"}) {
    INFO("pattern '" << pattern << "'");
    const Capture c = run_chain(pattern);
    check_same(c);
    // Every frame of these is covered by the rules: no hand-over to libunwind.
    CHECK(c.walk_result > 0);
    CHECK(c.walk == c.libunwind);
    // The chain's own frames are all there: one per link, plus the leaf's.
    CHECK(c.libunwind.size() >= strlen(pattern) + 3);
  }
}

TEST_CASE("the unwinder is the same on a warm rule table", "[unwind]") {
  std::vector<void*> first;
  for (int i = 0; i < 4; ++i) {
    const Capture again = run_chain("fnvfnv");
    check_same(again);
    if (i == 0) first = again.fast;
    CHECK(again.fast == first);
  }
}

namespace {
Capture* g_sort_capture;
int compare_and_capture(const void* a, const void* b) {
  if (g_sort_capture != nullptr) {
    chain_vla("nf", leaf_capture, g_sort_capture);
    g_sort_capture = nullptr;
  }
  return *static_cast<const int*>(a) - *static_cast<const int*>(b);
}
int sort_leaf(void* arg) {
  int values[] = {5, 3, 9, 1, 7, 2, 8};
  g_sort_capture = static_cast<Capture*>(arg);
  qsort(values, sizeof values / sizeof values[0], sizeof values[0], compare_and_capture);
  return values[0];
}
}  // namespace

TEST_CASE("the unwinder walks through the C library (qsort's callback)", "[unwind]") {
  Capture c;
  chain_fp("nv", sort_leaf, &c);
  check_same(c);
  CHECK(c.walk == c.libunwind);
}

namespace {
void* thread_main(void* arg) {
  chain_nofp("vfn", leaf_capture, arg);
  return nullptr;
}
}  // namespace

TEST_CASE("the unwinder ends a thread's stack where libunwind does", "[unwind]") {
  Capture c;
  pthread_t thread;
  REQUIRE(pthread_create(&thread, nullptr, thread_main, &c) == 0);
  pthread_join(thread, nullptr);
  check_same(c);
  CHECK(c.walk == c.libunwind);
}

namespace {
Capture g_signal_capture;
void on_signal(int) { chain_nofp("fv", leaf_capture, &g_signal_capture); }
int raise_leaf(void*) { return raise(SIGUSR1); }
}  // namespace

TEST_CASE("a signal frame is handed to libunwind", "[unwind]") {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  REQUIRE(sigaction(SIGUSR1, &sa, nullptr) == 0);
  chain_vla("nf", raise_leaf, nullptr);
  signal(SIGUSR1, SIG_DFL);
  const Capture& c = g_signal_capture;
  check_same(c);
  // The walk alone stops at the signal trampoline; the fallback goes on
  // past it into the interrupted chain.
  CHECK(c.walk_result == -1);
  CHECK(c.libunwind.size() > 8);
}

TEST_CASE("a short buffer gets the innermost frames", "[unwind]") {
  Capture full = run_chain("fnvfnv");
  void* frames[4];
  struct Short {
    void** frames;
    int n;
  } s{frames, 0};
  chain_nofp(
      "fnvfnv",
      [](void* arg) {
        auto* sh = static_cast<Short*>(arg);
        sh->n = fast_backtrace(sh->frames, 4);
        return sh->n;
      },
      &s);
  REQUIRE(s.n == 4);
  // frames[0] is the return into the lambda; the three after it are the
  // chain's innermost links, as in the full capture (from its second frame).
  CHECK(frames[1] == full.fast[1]);
  CHECK(frames[2] == full.fast[2]);
  CHECK(frames[3] == full.fast[3]);
}

// --- The memo (UnwindMemo): each walk follows the one before where it can.

namespace {

using memledger::interposer::UnwindMemo;

struct MemoCapture {
  UnwindMemo* memo;
  int max;
  std::vector<void*> libunwind, memoised;
  // The walk alone (fast_backtrace_no_fallback): no frames where it would
  // hand over to libunwind.
  bool walk_alone = false;
};

// libunwind's frames and the memo walk's, from one function (compared from
// the second frame on, as capture_here's).
__attribute__((noinline)) int memo_leaf(void* arg) {
  auto& c = *static_cast<MemoCapture*>(arg);
  void* a[kMax];
  void* b[kMax];
  const int na = unw_backtrace(a, kMax);
  const int nb = c.walk_alone ? fast_backtrace_no_fallback(b, c.max, c.memo) : fast_backtrace(b, c.max, 0, 0, c.memo);
  c.libunwind.assign(a + (na > 0 ? 1 : 0), a + na);
  c.memoised.assign(b + (nb > 0 ? 1 : 0), b + (nb > 0 ? nb : 0));
  return na + nb;
}

void check_memo(const MemoCapture& c) {
  INFO("libunwind:" << describe(c.libunwind));
  INFO("memo:     " << describe(c.memoised));
  REQUIRE(c.libunwind.size() > 3);
  // A cut walk is the start of the whole one.
  const size_t n = c.max - 1 < static_cast<int>(c.libunwind.size()) ? static_cast<size_t>(c.max - 1) : c.libunwind.size();
  REQUIRE(c.memoised.size() == n);
  CHECK(std::equal(c.memoised.begin(), c.memoised.end(), c.libunwind.begin()));
}

// A fixed-seed xorshift: the same random walks in every run.
struct XorShift {
  uint64_t r;
  uint64_t operator()() {
    r ^= r << 13;
    r ^= r >> 7;
    r ^= r << 17;
    return r;
  }
};

// One caller, two call sites at the same stack depth: the frames below are
// at the same places with the same return addresses, and only the return
// address into this function tells the two stacks apart.
__attribute__((noinline)) int two_sites(int which, const char* pattern, void* arg) {
  volatile int keep = which;
  if (keep) return chain_nofp(pattern, memo_leaf, arg) + 1;
  return chain_nofp(pattern, memo_leaf, arg) + 2;
}

// Walks kept beyond the eight held (UnwindMemo::known) forgotten: the next
// walk is one of the eight again, or made.
void forget_known(UnwindMemo& memo) { memledger::interposer::unwinder_release_kept(memo); }

// A memo past its first walks, which are not kept (UnwindMemo::kKeepAfter).
void keep_from_now(UnwindMemo& memo) { memo.walks_made = UnwindMemo::kKeepAfter; }

}  // namespace

TEST_CASE("walks that follow the last one give libunwind's stacks", "[unwind]") {
  static UnwindMemo memo;
  MemoCapture c{&memo, kMax, {}, {}};
  XorShift next{88172645463325252ull};
  int shared_outer = 0;
  std::vector<void*> before;
  for (int i = 0; i < 400; ++i) {
    // Random chains of frames with and without frame pointers and
    // rbp-based ones, 0 to 11 links: consecutive walks share outer frames,
    // inner frames, both or neither.
    std::string pattern;
    const int links = static_cast<int>(next() % 12);
    for (int k = 0; k < links; ++k) pattern += "fnv"[next() % 3];
    c.max = next() % 5 == 0 ? 3 + static_cast<int>(next() % 8) : kMax;
    INFO("walk " << i << " pattern '" << pattern << "' max " << c.max);
    switch (next() % 3) {
      case 0: chain_nofp(pattern.c_str(), memo_leaf, &c); break;
      case 1: chain_vla(pattern.c_str(), memo_leaf, &c); break;
      default: two_sites(static_cast<int>(next() % 2), pattern.c_str(), &c); break;
    }
    check_memo(c);
    if (!before.empty() && c.memoised.size() > 4 && before.size() > 4 &&
        c.memoised[c.memoised.size() - 3] == before[before.size() - 3]) {
      ++shared_outer;
    }
    before = c.memoised;
  }
  // Consecutive walks shared their outer frames often: the walks that
  // follow the last one are among those compared (that they do follow it is
  // the next test's).
  CHECK(shared_outer > 100);
}

TEST_CASE("walks made again from their stack words alone give libunwind's stacks", "[unwind]") {
  // A few chains, each walked many times in a random order from two call
  // sites at the same depth, some cut by the frame limit: after its second
  // time a walk is made again by comparing stack words alone (UnwindMemo::
  // whole), through frames with and without frame pointers and rbp-based
  // ones.
  static UnwindMemo memo;
  const char* patterns[] = {"nvfnvf", "fvn", "vvnf", "nnnfff", "vfvfvfv", "f"};
  const int cuts[] = {kMax, kMax, kMax, 4, 7};
  XorShift next{0x2545f4914f6cdd1dull};
  for (int i = 0; i < 600; ++i) {
    const char* pattern = patterns[next() % std::size(patterns)];
    MemoCapture c{&memo, cuts[next() % std::size(cuts)], {}, {}, true};
    INFO("walk " << i << " pattern '" << pattern << "' max " << c.max);
    if (next() % 2) {
      chain_vla(pattern, memo_leaf, &c);
    } else {
      two_sites(static_cast<int>(next() % 2), pattern, &c);
    }
    check_memo(c);
  }
  uint32_t prepared = 0;
  for (uint32_t k = 0; k < UnwindMemo::kWalks; ++k) prepared += memo.whole[k] != 0;
  CHECK(prepared > 0);
}

TEST_CASE("a frame found in the last walk takes its rule from there", "[unwind]") {
  // The same chain walked twice from the same place; between the two, the
  // memo's rule for the fifth frame is made "outermost" (in unwinder.cpp's
  // packing: 1, a rule is stored, | 1 << 1, the kind), and the walk is no
  // longer one made again from its stack words alone (those compares never
  // read a rule). A walk that follows the memo stops there; one that looked
  // its rules up would not.
  static UnwindMemo memo;
  MemoCapture c[2] = {{&memo, kMax, {}, {}}, {&memo, kMax, {}, {}}};
  for (int i = 0; i < 2; ++i) {
    if (i == 1) {
      const uint32_t current = memo.current;
      REQUIRE(current < UnwindMemo::kWalks);
      REQUIRE(memo.count[current] > 6);
      memo.slots[current].states()[4].rule = 1 | 1u << 1;
      memo.whole[current] = 0;
      forget_known(memo);
    }
    chain_nofp("nvfn", memo_leaf, &c[i]);
  }
  check_memo(c[0]);
  INFO("first: " << describe(c[0].memoised));
  INFO("second:" << describe(c[1].memoised));
  // Frames 1 to 4 (memoised leaves out frame 0, the return into memo_leaf).
  REQUIRE(c[1].memoised.size() == 4);
  CHECK(std::equal(c[1].memoised.begin(), c[1].memoised.end(), c[0].memoised.begin()));
}

TEST_CASE("a walk that reaches the last walk's frames compares the rest; where the stack differs it goes by the rules",
          "[unwind]") {
  static UnwindMemo memo;
  MemoCapture a{&memo, kMax, {}, {}, true};
  MemoCapture b{&memo, kMax, {}, {}, true};
  MemoCapture c{&memo, kMax, {}, {}, true};
  // Two call sites at the same depth: the second walk reaches the first's
  // frames at the chain and is prepared to be made again at once.
  two_sites(1, "nvfnv", &a);
  check_memo(a);
  two_sites(0, "nvfnv", &b);
  check_memo(b);
  const uint32_t current = memo.current;
  REQUIRE(current < UnwindMemo::kWalks);
  CHECK(memo.whole[current] == memo.count[current]);
  // The memo now says another return address for a frame further out than
  // where the next walk reaches it (a stack that changed there): the
  // compares fail, and the walk goes on from where it parts by the rules.
  REQUIRE(memo.count[current] > 8);
  memo.slots[current].states()[7].rip ^= 1;
  forget_known(memo);
  two_sites(1, "nvfnv", &c);
  check_memo(c);
  // The chain and the return into two_sites are the first walk's (the
  // returns into this function differ: three calls).
  REQUIRE(c.memoised.size() == a.memoised.size());
  CHECK(std::equal(c.memoised.begin(), c.memoised.begin() + 7, a.memoised.begin()));
}

TEST_CASE("a walk made again compares the saved frame pointers a later rule reads", "[unwind]") {
  // A walk through frames whose CFA is rbp-based, made again: each such
  // frame's rbp is compared with the stack word its callee saved it to
  // (UnwindMemo::checks: a second compare after the return address's).
  // Here the memo's value for one of them no longer matches the stack: the
  // walk is not the held one again (a new number), and still libunwind's.
  // The same for the walk kept beyond the eight held (UnwindMemo::known).
  static UnwindMemo memo;
  const bool kept = GENERATE(false, true);
  INFO((kept ? "the walk kept beyond the eight" : "the walk held"));
  memset(&memo, 0, sizeof memo);
  keep_from_now(memo);
  MemoCapture first{&memo, kMax, {}, {}, true};
  MemoCapture again{&memo, kMax, {}, {}, true};
  MemoCapture changed{&memo, kMax, {}, {}, true};
  for (MemoCapture* c : {&first, &again, &changed}) {
    if (c == &changed) {
      const uint32_t current = memo.current;
      REQUIRE(current < UnwindMemo::kWalks);
      REQUIRE(memo.whole[current] == memo.count[current]);
      const uint32_t count = memo.count[current];
      const UnwindMemo::State* states = memo.slots[current].states();
      UnwindMemo::Check* checks = memo.slots[current].checks(count);
      const uint16_t* to_end = memo.slots[current].to_end(count);
      // A state's second compare is its saved frame pointer's.
      uint32_t checked = 0;
      for (uint32_t i = 1; i < count && checked == 0; ++i) {
        if (to_end[i] - to_end[i + 1] == 2) {
          checked = memo.check_end[current] - to_end[i] + 1;
          CHECK(checks[checked].at != states[i].rsp - 8);
          CHECK(checks[checked].want == states[i].rbp);
        }
      }
      REQUIRE(checked > 0);
      if (!kept) {
        checks[checked].want ^= 0x10;
        forget_known(memo);
      } else {
        // The kept copy of the walk: the same compares.
        uint32_t changed_kept = 0;
        for (UnwindMemo::Known& known : memo.known) {
          if (known.rsp != states[0].rsp || known.rip != states[0].rip) continue;
          REQUIRE(known.checks == memo.check_end[current]);
          UnwindMemo::Check& check = memo.kept[known.kept_at % UnwindMemo::kKept + checked];
          CHECK(check.want == checks[checked].want);
          check.want ^= 0x10;
          ++changed_kept;
        }
        REQUIRE(changed_kept == 1);
        // None of the eight held starts there now.
        for (uint64_t& rsp : memo.first_rsp) rsp = 0;
      }
    }
    const uint32_t serial = memo.serial;
    chain_fp("vfvf", memo_leaf, c);
    check_memo(*c);
    CHECK((memo.serial == serial) == (c == &again));
  }
}

TEST_CASE("a walk that follows the last one stops where the two call sites part", "[unwind]") {
  static UnwindMemo memo;
  for (int round = 0; round < 4; ++round) {
    MemoCapture both[2] = {{&memo, kMax, {}, {}}, {&memo, kMax, {}, {}}};
    for (int which = 0; which < 2; ++which) two_sites(1 - which, "nvfn", &both[which]);
    const MemoCapture& a = both[0];
    const MemoCapture& b = both[1];
    check_memo(a);
    check_memo(b);
    // The same frames up to the caller, then different return addresses
    // into it (the loop here may have been unrolled too: the frames above
    // are libunwind's, checked above).
    INFO("a:" << describe(a.memoised));
    INFO("b:" << describe(b.memoised));
    REQUIRE(a.memoised.size() == b.memoised.size());
    REQUIRE(a.memoised.size() > 6);
    // memoised[0..4]: the returns into the five chain functions (the one
    // two_sites calls, then one per letter of "nvfn"); [5]: into two_sites.
    for (size_t k = 0; k < 5; ++k) CHECK(a.memoised[k] == b.memoised[k]);
    CHECK(a.memoised[5] != b.memoised[5]);
  }
}

TEST_CASE("a walk cut short by the frame limit is followed to its end by the next, whole walk", "[unwind]") {
  // The cut walk's memo ends in a stop: the next walk, with room for every
  // frame, follows it up to there and goes on by the rules, where it would
  // otherwise take the stop for a frame and hand over to libunwind.
  static UnwindMemo memo;
  for (int limit = 3; limit < 12; ++limit) {
    INFO("limit " << limit);
    MemoCapture cut{&memo, limit, {}, {}, true};
    MemoCapture whole{&memo, kMax, {}, {}, true};
    MemoCapture again{&memo, kMax, {}, {}, true};
    chain_nofp("nvfnvf", memo_leaf, &cut);
    check_memo(cut);
    chain_nofp("nvfnvf", memo_leaf, &whole);
    check_memo(whole);
    // And a whole walk after a whole one, which follows it to the end.
    chain_nofp("nvfnvf", memo_leaf, &again);
    check_memo(again);
  }
}

TEST_CASE("a walk the memo holds, made again, leaves the memo as it is; any other walk makes a new one",
          "[unwind]") {
  static UnwindMemo memo;
  // (pattern, frame limit, the memo holds this walk: the same frames to the
  // same end, from the same place)
  struct Walk {
    const char* pattern;
    int max;
    bool held;
  };
  std::vector<Walk> walks = {
      {"nvfnvf", kMax, false}, {"nvfnvf", kMax, true}, {"nvfnvf", kMax, true},
      // Cut short: a walk of its own, held beside the whole one.
      {"nvfnvf", 6, false}, {"nvfnvf", 6, true}, {"nvfnvf", 5, false}, {"nvfnvf", 9, false}, {"nvfnvf", 9, true},
      // The whole walk is still held.
      {"nvfnvf", kMax, true}};
  // More walks cut elsewhere, until every slot is taken.
  const int more_cuts[] = {7, 8, 10, 4, 3, 11};
  static_assert(UnwindMemo::kWalks >= 4 && UnwindMemo::kWalks - 4 <= std::size(more_cuts));
  for (uint32_t i = 0; i + 4 < UnwindMemo::kWalks; ++i) walks.push_back({"nvfnvf", more_cuts[i], false});
  walks.push_back({"nvfnvf", kMax, true});
  // One walk more takes the place of the one least recently used (the one
  // cut at 6), which then takes the place of the next one (cut at 5); the
  // others stay.
  const Walk last[] = {{"nvfnv", kMax, false}, {"nvfnv", kMax, true}, {"nvfnvf", 6, false},
                       {"nvfnvf", 9, true},    {"nvfnvf", 5, false},  {"nvfnvf", kMax, true},
                       {"nvfnv", kMax, true}};
  walks.insert(walks.end(), std::begin(last), std::end(last));
  for (size_t i = 0; i < walks.size(); ++i) {
    INFO("walk " << i << " '" << walks[i].pattern << "' max " << walks[i].max);
    const uint32_t serial = memo.serial;
    MemoCapture c{&memo, walks[i].max, {}, {}, true};
    chain_nofp(walks[i].pattern, memo_leaf, &c);
    check_memo(c);
    CHECK((memo.serial == serial) == walks[i].held);
    CHECK(memo.current < UnwindMemo::kWalks);
  }
}

TEST_CASE("a walk held while many others were made is handed out under a new number", "[unwind]") {
  // Recorder::capture_stack tells walks apart by the low 28 bits of their
  // numbers: none handed out may be 2^28 behind the newest.
  static UnwindMemo memo;
  uint32_t numbers[3];
  for (int i = 0; i < 3; ++i) {
    if (i == 2) memo.serial += 1u << 27;  // as after 2^27 other walks
    MemoCapture c{&memo, kMax, {}, {}, true};
    chain_nofp("nvf", memo_leaf, &c);
    check_memo(c);
    numbers[i] = memo.serials[memo.current];
  }
  CHECK(numbers[1] == numbers[0]);  // the same walk again, the same number
  CHECK(numbers[2] == numbers[0] + (1u << 27) + 1);
  CHECK(memo.serial == numbers[2]);
}

namespace {
void* memo_thread(void* arg) {
  for (const char* pattern : {"vfn", "nnv", "vfn"}) {
    chain_vla(pattern, memo_leaf, arg);
    check_memo(*static_cast<MemoCapture*>(arg));
  }
  return nullptr;
}
}  // namespace

TEST_CASE("a memo handed from one thread to another gives the new thread's stacks", "[unwind]") {
  static UnwindMemo memo;
  MemoCapture c{&memo, kMax, {}, {}};
  chain_nofp("fnvfnv", memo_leaf, &c);
  check_memo(c);
  for (int i = 0; i < 3; ++i) {
    pthread_t thread;
    REQUIRE(pthread_create(&thread, nullptr, memo_thread, &c) == 0);
    pthread_join(thread, nullptr);
  }
  chain_nofp("fnvfnv", memo_leaf, &c);
  check_memo(c);
}

// --- The loader section (LoaderAccess): taken only to work a rule out.

namespace {

using memledger::interposer::LoaderAccess;

struct LoaderCapture {
  const LoaderAccess* access;
  std::vector<void*> frames;
};
int g_entered = 0, g_left = 0;
bool g_refuse = false;
const LoaderAccess kCountingLoader = {[] {
                                        ++g_entered;
                                        return !g_refuse;
                                      },
                                      [] { ++g_left; }};

__attribute__((noinline)) int loader_leaf(void* arg) {
  auto& c = *static_cast<LoaderCapture*>(arg);
  void* b[kMax];
  const int n = fast_backtrace(b, kMax, 0, 0, nullptr, c.access);
  c.frames.assign(b, b + n);
  return n;
}

std::vector<void*> walk_with(const LoaderAccess* access) {
  LoaderCapture c{access, {}};
  chain_nofp("fnvfnv", loader_leaf, &c);
  return c.frames;
}

}  // namespace

TEST_CASE("a walk takes a loader section only to work a rule out", "[unwind]") {
  // Every walk from one call site, so that each is the same stack.
  std::vector<void*> warm;
  for (int round = 0; round < 4; ++round) {
    if (round == 1) {
      g_entered = g_left = 0;
      g_refuse = true;  // as while a fork is under way
    }
    // Rules of an older generation are worked out again: that needs a section.
    if (round == 2) memledger::interposer::unwinder_modules_unloaded();
    if (round == 3) g_refuse = false;
    const std::vector<void*> frames = walk_with(round == 0 ? nullptr : &kCountingLoader);
    INFO("round " << round);
    if (round == 0) {
      warm = frames;  // every rule of this stack known from here on
      REQUIRE(warm.size() > 8);
    } else if (round == 1) {
      CHECK(frames == warm);
      CHECK(g_entered == 0);
    } else if (round == 2) {
      CHECK(frames.empty());
      CHECK(g_entered == 1);
      CHECK(g_left == 0);
    } else {
      CHECK(frames == warm);
      CHECK(g_entered == 2);
      CHECK(g_left == 1);
    }
  }
}

extern "C" {
int many_call_sites(int site, int (*f)(void*), void* arg);  // many_sites.S
int large_frame(int (*f)(void*), void* arg);
extern const int many_call_site_count;
}

TEST_CASE("the rule table keeps the rules of 160,000 return addresses", "[unwind]") {
  // A walk from each of 163,840 call sites of many_call_sites works out the
  // rule of its return address; walked again, every rule is in the table and
  // no walk takes a loader section. (Two slots of 16 bytes an address, in
  // the same 2 MiB, held 131,072 at most.)
  const int sites = 163840;
  REQUIRE(many_call_site_count >= sites);
  g_refuse = false;
  LoaderCapture c{&kCountingLoader, {}};
  for (int round = 0; round < 2; ++round) {
    g_entered = g_left = 0;
    int walked = 0;
    for (int site = 0; site < sites; ++site) {
      many_call_sites(site, loader_leaf, &c);
      if (c.frames.size() > 3) ++walked;
    }
    INFO("round " << round);
    CHECK(walked == sites);
    CHECK(g_entered == g_left);
    if (round == 0) {
      CHECK(g_entered >= sites);
    } else {
      // Those whose neighbourhood of the table was full, if any.
      CHECK(g_entered <= sites / 200);
    }
  }
  // The stacks are libunwind's, from the first site, the last and some between.
  for (int site : {0, 1, sites / 3, sites / 2 + 7, sites - 1}) {
    Capture check;
    many_call_sites(site, leaf_capture, &check);
    INFO("site " << site);
    check_same(check);
  }
}

TEST_CASE("with more return addresses than the rule table holds, those walked again are learnt again and stay",
          "[unwind]") {
  // Every call site of many_call_sites once (1.25 times as many addresses as
  // the table has slots), then the last 2,000 of them, twice: the second
  // time their rules are in the table. (A table that kept the first rules to
  // come, and left the rest out, worked most of these out at every walk.)
  const int sites = many_call_site_count;
  REQUIRE(sites > 300000);
  g_refuse = false;
  LoaderCapture c{&kCountingLoader, {}};
  for (int site = 0; site < sites; ++site) many_call_sites(site, loader_leaf, &c);
  const int hot = 2000;
  for (int round = 0; round < 2; ++round) {
    g_entered = g_left = 0;
    int walked = 0;
    for (int site = sites - hot; site < sites; ++site) {
      many_call_sites(site, loader_leaf, &c);
      if (c.frames.size() > 3) ++walked;
    }
    INFO("round " << round);
    CHECK(walked == hot);
    if (round == 1) CHECK(g_entered <= hot / 100);
  }
  for (int site : {0, sites / 2, sites - 1}) {
    Capture check;
    many_call_sites(site, leaf_capture, &check);
    INFO("site " << site);
    check_same(check);
  }
}

TEST_CASE("a rule too wide for the rule table is worked out at each walk, and gives libunwind's stack", "[unwind]") {
  // large_frame's CFA is 40,016 bytes above its stack pointer.
  for (int walk = 0; walk < 3; ++walk) {
    Capture check;
    large_frame(leaf_capture, &check);
    INFO("walk " << walk);
    check_same(check);
    g_entered = g_left = 0;
    LoaderCapture c{&kCountingLoader, {}};
    large_frame(loader_leaf, &c);
    CHECK(c.frames.size() > 3);
    CHECK(g_entered == 1);
  }
}

namespace {

// The read-only segment of this program that holds its .eh_frame_hdr, page-aligned.
struct Segment {
  uintptr_t begin = 0, end = 0;
};
int find_tables(dl_phdr_info* info, size_t, void* data) {
  const ElfW(Phdr)* eh = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type == PT_GNU_EH_FRAME) eh = &info->dlpi_phdr[i];
  }
  if (eh == nullptr) return 1;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && eh->p_vaddr >= ph.p_vaddr && eh->p_vaddr < ph.p_vaddr + ph.p_filesz) {
      const uintptr_t page = static_cast<uintptr_t>(getpagesize());
      auto* segment = static_cast<Segment*>(data);
      segment->begin = (info->dlpi_addr + ph.p_vaddr) & ~(page - 1);
      segment->end = (info->dlpi_addr + ph.p_vaddr + ph.p_filesz + page - 1) & ~(page - 1);
      if ((ph.p_flags & PF_W) != 0) segment->begin = segment->end = 0;
    }
  }
  return 1;  // the program is the first object
}

// /proc/self/pagemap's word for each page of [begin, end), or nothing when
// it cannot be read.
std::vector<uint64_t> page_words(uintptr_t begin, uintptr_t end) {
  const int fd = open("/proc/self/pagemap", O_RDONLY);
  if (fd < 0) return {};
  const uintptr_t page = static_cast<uintptr_t>(getpagesize());
  std::vector<uint64_t> words;
  for (uintptr_t p = begin; p < end; p += page) {
    uint64_t word = 0;
    if (pread(fd, &word, sizeof word, static_cast<off_t>(p / page * sizeof word)) != sizeof word) {
      words.clear();
      break;
    }
    words.push_back(word);
  }
  close(fd);
  return words;
}

// Pages of [begin, end) mapped in this process now (bit 63), or -1 when
// pagemap cannot be read.
long present_pages(uintptr_t begin, uintptr_t end) {
  const std::vector<uint64_t> words = page_words(begin, end);
  if (words.empty()) return -1;
  return std::count_if(words.begin(), words.end(), [](uint64_t word) { return (word >> 63) != 0; });
}

}  // namespace

TEST_CASE("the pages of the unwind tables a walk read are handed back to the kernel", "[unwind]") {
  Segment tables;
  dl_iterate_phdr(find_tables, &tables);
  REQUIRE(tables.end > tables.begin);
  memledger::interposer::unwinder_hand_back_read_pages();  // what earlier cases left pending
  const uintptr_t page = static_cast<uintptr_t>(getpagesize());
  for (uintptr_t p = tables.begin; p < tables.end; p += page) (void)*reinterpret_cast<const volatile char*>(p);
  const long all = static_cast<long>((tables.end - tables.begin) / page);
  const long before = present_pages(tables.begin, tables.end);
  if (before < 0) {
    WARN("/proc/self/pagemap cannot be read here: not checked");
    return;
  }
  REQUIRE(before == all);
  // Rules of an older generation are worked out again, from this program's tables.
  memledger::interposer::unwinder_modules_unloaded();
  const Capture first = run_chain("fnvfnv");
  check_same(first);
  CHECK(memledger::interposer::unwinder_hand_back_read_pages() > 0);
  CHECK(present_pages(tables.begin, tables.end) < all);
  // What reads them next finds them again: libunwind's stack, as before.
  memledger::interposer::unwinder_modules_unloaded();
  check_same(run_chain("fnvfnv"));
}

namespace {

using memledger::interposer::ObjectIndex;
using memledger::interposer::ObjectLookup;

// Addresses around every loaded segment (its first and last byte, its
// middle, the bytes just outside), and some that no object holds.
int collect_probes(dl_phdr_info* info, size_t, void* data) {
  auto* probes = static_cast<std::vector<uint64_t>*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD && ph.p_type != PT_GNU_EH_FRAME) continue;
    const uint64_t begin = info->dlpi_addr + ph.p_vaddr;
    const uint64_t end = begin + ph.p_memsz;
    for (uint64_t pc : {begin - 1, begin, begin + ph.p_memsz / 2, end - 1, end, end + 4096}) probes->push_back(pc);
  }
  return 0;
}

bool same_lookup(const ObjectLookup& a, const ObjectLookup& b) {
  return a.hdr == b.hdr && a.segment_begin == b.segment_begin && a.segment_end == b.segment_end;
}

ObjectLookup by_index(ObjectIndex& index, uint64_t pc) {
  ObjectLookup lookup{pc};
  index.find(&lookup);
  return lookup;
}

ObjectLookup by_scan(uint64_t pc) {
  ObjectLookup lookup{pc};
  memledger::interposer::find_object_by_scan(&lookup);
  return lookup;
}

}  // namespace

TEST_CASE("the object index finds what a scan of the loaded objects finds, and follows dlopen and dlclose",
          "[unwind][objects]") {
  auto index = std::make_unique<ObjectIndex>();
  std::vector<uint64_t> probes = {0, 1, 4096, reinterpret_cast<uint64_t>(&probes), ~uint64_t{0} - 1};
  dl_iterate_phdr(collect_probes, &probes);
  REQUIRE(probes.size() > 20);
  size_t held = 0;
  for (uint64_t pc : probes) {
    const ObjectLookup want = by_scan(pc);
    const ObjectLookup got = by_index(*index, pc);
    INFO("pc " << reinterpret_cast<void*>(pc));
    CHECK(same_lookup(got, want));
    held += want.hdr != nullptr;
  }
  CHECK(held > probes.size() / 3);
  ObjectIndex::Counts counts = index->counts();
  CHECK(counts.built == 1);
  CHECK(counts.from_index == probes.size() - 1);  // the first look-up built it
  CHECK(counts.scanned == 1);

  // A library loaded after the index was built: found, as the scan finds it.
  void* handle = dlopen(UNWIND_LOADABLE, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(handle != nullptr);
  const auto loaded = reinterpret_cast<uint64_t>(dlsym(handle, "unwind_loadable_value"));
  REQUIRE(loaded != 0);
  const ObjectLookup in_library = by_index(*index, loaded + 1);
  CHECK(in_library.hdr != nullptr);
  CHECK(same_lookup(in_library, by_scan(loaded + 1)));
  CHECK(index->counts().built == 2);
  // Unloaded: the index no longer names it.
  REQUIRE(dlclose(handle) == 0);
  const ObjectLookup after = by_index(*index, loaded + 1);
  CHECK(same_lookup(after, by_scan(loaded + 1)));
  CHECK(index->counts().built == 3);
  for (uint64_t pc : probes) CHECK(same_lookup(by_index(*index, pc), by_scan(pc)));
  CHECK(index->counts().built == 3);
}

TEST_CASE("the object index under look-ups from several threads while another loads and unloads a library",
          "[unwind][objects]") {
  auto index = std::make_unique<ObjectIndex>();
  // Addresses in objects that stay loaded: this program and the C library.
  const std::vector<uint64_t> stable = {reinterpret_cast<uint64_t>(&collect_probes) + 1,
                                        reinterpret_cast<uint64_t>(&memcpy) + 1,
                                        reinterpret_cast<uint64_t>(&dl_iterate_phdr) + 1};
  std::vector<ObjectLookup> want;
  for (uint64_t pc : stable) want.push_back(by_scan(pc));
  for (const ObjectLookup& w : want) REQUIRE(w.hdr != nullptr);
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0};
  std::atomic<long> done{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      for (long i = 0; !stop.load() || i < 2000; ++i) {
        const size_t k = static_cast<size_t>(i + t) % stable.size();
        if (!same_lookup(by_index(*index, stable[k]), want[k])) wrong.fetch_add(1);
        done.fetch_add(1);
      }
    });
  }
  // At least 100 loads, and on until the readers have made 4,000 look-ups
  // while the library comes and goes and have built the index again after a
  // load (threads start late on a busy machine, and a loading thread that
  // loses its processor may see them make thousands at one count of the
  // loaded objects), for at most 20 s.
  const long before = done.load();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int round = 0;
       round < 100 || ((done.load() - before < 4000 || index->counts().built < 2) &&
                       std::chrono::steady_clock::now() < give_up);
       ++round) {
    void* handle = dlopen(UNWIND_LOADABLE, RTLD_NOW | RTLD_LOCAL);
    REQUIRE(handle != nullptr);
    dlclose(handle);
  }
  const long during = done.load() - before;
  stop.store(true);
  for (std::thread& t : readers) t.join();
  CHECK(wrong.load() == 0);
  CHECK(during >= 4000);
  CHECK(done.load() >= 8000);
  CHECK(index->counts().built >= 2);
  CHECK(index->counts().from_index > 0);
}

namespace {

// Whether the page at `at` is present and not the file's (one the loader
// wrote to), by pagemap; false when that cannot be read.
bool written_page(uintptr_t at) {
  const std::vector<uint64_t> words = page_words(at, at + 1);
  return !words.empty() && (words[0] >> 63 & 1) != 0 && (words[0] >> 61 & 1) == 0;
}

}  // namespace

TEST_CASE("unwind tables in a RELRO part: pages the loader did not write to are handed back, the others stay",
          "[unwind]") {
  using Function = int (*)(int (*)(void*), void*);
  void* handle = dlopen(UNWIND_RELRO, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(handle != nullptr);
  const auto* functions = static_cast<const void* const*>(dlsym(handle, "relro_functions"));
  const auto* count = static_cast<const int*>(dlsym(handle, "relro_function_count"));
  REQUIRE(functions != nullptr);
  REQUIRE(count != nullptr);
  REQUIRE(*count == 2048);
  // What the loader relocated: each entry is its function's address.
  const auto relocated = [&] {
    for (int i = 0; i < *count; ++i) {
      char name[32];
      snprintf(name, sizeof name, "relro_function_%o", 01000 + i);
      if (functions[i] != dlsym(handle, name)) return false;
    }
    return true;
  };
  REQUIRE(relocated());

  ObjectLookup lookup{reinterpret_cast<uint64_t>(functions[0])};
  memledger::interposer::find_object_by_scan(&lookup);
  REQUIRE(lookup.hdr != nullptr);
  REQUIRE(lookup.relro_end > lookup.relro_begin);
  const uintptr_t table = reinterpret_cast<uintptr_t>(functions);
  CHECK((table >= lookup.relro_begin && table < lookup.relro_end));

  memledger::interposer::unwinder_hand_back_read_pages();  // what earlier cases left pending
  const uintptr_t page = static_cast<uintptr_t>(getpagesize());
  for (uintptr_t p = lookup.relro_begin; p < lookup.relro_end; p += page) {
    (void)*reinterpret_cast<const volatile char*>(p);
  }
  const long all = static_cast<long>((lookup.relro_end - lookup.relro_begin) / page);
  const long before = present_pages(lookup.relro_begin, lookup.relro_end);
  if (before < 0) {
    WARN("/proc/self/pagemap cannot be read here: not checked");
    dlclose(handle);
    return;
  }
  REQUIRE(before == all);
  REQUIRE(written_page(table));

  // Rules worked out again, from FDEs spread over the whole .eh_frame: the
  // stacks are libunwind's, and the pages read are handed back.
  memledger::interposer::unwinder_modules_unloaded();
  for (int i = 0; i < *count; i += 16) {
    Capture c;
    reinterpret_cast<Function>(const_cast<void*>(functions[i]))(leaf_capture, &c);
    INFO("function " << i);
    check_same(c);
  }
  CHECK(memledger::interposer::unwinder_hand_back_read_pages() > 0);
  CHECK(present_pages(lookup.relro_begin, lookup.relro_end) < all);
  // The pages the loader wrote to were kept: its relocations are still there.
  CHECK(written_page(table));
  CHECK(relocated());

  // What reads the tables next finds them again.
  memledger::interposer::unwinder_modules_unloaded();
  Capture again;
  reinterpret_cast<Function>(const_cast<void*>(functions[*count - 1]))(leaf_capture, &again);
  check_same(again);
  dlclose(handle);
}

TEST_CASE("walks beyond the eight held are made again from their stack words alone", "[unwind]") {
  // Twelve stacks of different depths, walked in turn: the eight walks
  // held are always the wrong ones (the least recently used goes first),
  // and from the second round on each walk is the one kept for its first
  // frame (UnwindMemo::known): no new walk (the memo's serial stays), and
  // libunwind's stack. Two of them may share an entry of the 256 (their
  // stack addresses differ from run to run): each such pair makes its two
  // walks anew in every round.
  static UnwindMemo memo;
  constexpr int kStacks = 12;
  std::string patterns[kStacks];
  for (int k = 0; k < kStacks; ++k) patterns[k] = std::string(static_cast<size_t>(k + 1), "nvf"[k % 3]);
  // Round 4: the walks kept are released (a new thread takes the memo), and
  // each is made anew; none is kept before the memo has made kKeepAfter.
  keep_from_now(memo);
  for (int round = 0; round < 5; ++round) {
    if (round == 4) {
      memledger::interposer::unwinder_release_kept(memo);
      CHECK(memo.kept_end == 0);
      CHECK(memo.walks_made == 0);
      CHECK(std::all_of(std::begin(memo.known), std::end(memo.known),
                        [](const UnwindMemo::Known& known) { return known.rsp == 0; }));
    }
    int made = 0;
    for (int k = 0; k < kStacks; ++k) {
      MemoCapture c{&memo, kMax, {}, {}, true};
      INFO("round " << round << " pattern '" << patterns[k] << "'");
      const uint32_t serial = memo.serial;
      chain_nofp(patterns[k].c_str(), memo_leaf, &c);
      check_memo(c);
      made += memo.serial != serial;
    }
    INFO("round " << round << ": " << made << " walks made");
    if (round == 0 || round == 4) {
      CHECK(made == kStacks);
    } else {
      CHECK(made <= 6);
    }
  }
  // After the release: the twelve walks counted, none kept.
  CHECK(memo.walks_made == static_cast<uint32_t>(kStacks));
  CHECK(memo.kept_end == 0);
}

namespace {

// A walk with a caller's words (WalkReuse), as Recorder::capture_stack
// makes it: the frames start filled with a mark, to see which are written.
struct ReuseCapture {
  UnwindMemo* memo;
  uint64_t* words;
  uint64_t bits;
  std::vector<void*> libunwind, frames;
  int count = 0;
  uint32_t serial = 0;
  uint64_t reused = 0;
};

__attribute__((noinline)) int reuse_leaf(void* arg) {
  auto& c = *static_cast<ReuseCapture*>(arg);
  void* a[kMax];
  void* b[kMax];
  const int na = unw_backtrace(a, kMax);
  for (void*& frame : b) frame = reinterpret_cast<void*>(0x5a5a);
  memledger::interposer::WalkReuse reuse{c.words, c.bits, 0};
  c.count = fast_backtrace(b, kMax, 0, 0, c.memo, nullptr, &c.serial, nullptr, &reuse);
  c.reused = reuse.reused;
  c.libunwind.assign(a + (na > 0 ? 1 : 0), a + na);
  c.frames.assign(b + 1, b + kMax);
  return na + c.count;
}

}  // namespace

TEST_CASE("a walk made again leaves its frames unwritten where the caller's word says what it made of them",
          "[unwind]") {
  using memledger::interposer::walk_key;
  static UnwindMemo memo;
  static uint64_t words[UnwindMemo::kWalks + UnwindMemo::kKnown];
  keep_from_now(memo);
  constexpr uint64_t kBits = uint64_t{2} << 37;
  constexpr uint64_t kMade = uint64_t{12345} << 40;
  // Rounds 4 and 5: none of the eight walks held starts there, the walk
  // is the one kept beyond them (UnwindMemo::known), with a word of its own.
  for (int round = 0; round < 6; ++round) {
    INFO("round " << round);
    ReuseCapture c{&memo, words, kBits, {}, {}};
    if (round >= 4) {
      for (uint64_t& rsp : memo.first_rsp) rsp = 0;
    }
    chain_nofp("nvfnv", reuse_leaf, &c);
    REQUIRE(c.count > 4);
    REQUIRE(c.serial != 0);
    const uint32_t made = memo.made;
    REQUIRE(made < UnwindMemo::kWalks + UnwindMemo::kKnown);
    CHECK((made >= UnwindMemo::kWalks) == (round >= 4));
    const auto n = static_cast<size_t>(c.count - 1);
    if (round == 0 || round == 4) {
      // Made: its frames, libunwind's; nothing to reuse yet.
      CHECK(c.reused == 0);
      REQUIRE(c.libunwind.size() == n);
      CHECK(std::equal(c.libunwind.begin(), c.libunwind.end(), c.frames.begin()));
      words[made] = walk_key(c.serial, static_cast<uint32_t>(c.count), kBits) | kMade;
    } else if (round != 2) {
      // The same walk, made again: the word is returned, no frame written.
      CHECK(c.reused == words[made]);
      CHECK(c.reused >> 40 == kMade >> 40);
      CHECK(std::all_of(c.frames.begin(), c.frames.end(), [](void* f) { return f == reinterpret_cast<void*>(0x5a5a); }));
      // Next round: the word of another caller's bits, not this one's.
      if (round == 1) words[made] ^= uint64_t{1} << 37;
    } else {
      // The word no longer says so: the frames are written, libunwind's.
      CHECK(c.reused == 0);
      REQUIRE(c.libunwind.size() == n);
      CHECK(std::equal(c.libunwind.begin(), c.libunwind.end(), c.frames.begin()));
      words[made] = walk_key(c.serial, static_cast<uint32_t>(c.count), kBits) | kMade;
    }
  }
  // A walk held that is followed again by its rules (one not prepared to be
  // made from stack words alone) writes its frames as it goes, and returns
  // the word too. From one call site: the stack the same both times.
  memledger::interposer::unwinder_release_kept(memo);
  uint32_t slot = UnwindMemo::kWalks;
  for (int round = 0; round < 2; ++round) {
    INFO("followed by its rules, round " << round);
    ReuseCapture c{&memo, words, kBits, {}, {}};
    chain_nofp("nvfnv", reuse_leaf, &c);
    if (round == 0) {
      slot = memo.made;
      REQUIRE(slot < UnwindMemo::kWalks);
      words[slot] = walk_key(c.serial, static_cast<uint32_t>(c.count), kBits) | kMade;
      memo.whole[slot] = 0;
      continue;
    }
    CHECK(memo.made == slot);
    CHECK(c.reused == words[slot]);
    REQUIRE(c.libunwind.size() == static_cast<size_t>(c.count - 1));
    CHECK(std::equal(c.libunwind.begin(), c.libunwind.end(), c.frames.begin()));
  }
}
