#include "signals.h"

#include <atomic>
#include <csignal>
#include <cstring>
#include <dlfcn.h>
#include <ctime>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "libc_symbols.h"
#include "python_frames.h"
#include "recorder.h"
#include "spin_lock.h"
#include "trace_writer.h"

namespace memledger::interposer {
namespace {

using SigactionFn = int (*)(int, const struct sigaction*, struct sigaction*);

constexpr int kWatched[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL};

std::atomic<bool> g_installed{false};
// The process whose handlers g_app_action holds: set at installation and in
// each fork child. A vfork child (CPython's subprocess resets every handler
// to the default there before exec) shares the parent's memory but has
// handlers of its own: its sigaction() calls go to the kernel, never into
// the parent's g_app_action.
std::atomic<pid_t> g_owner{0};
SpinLock g_actions_lock;
// Held across fork(): a thread in the middle of sigaction() would leave the
// child a lock it never releases.
[[maybe_unused]] const bool g_actions_lock_fork = fork_held_locks().add(&g_actions_lock);
struct sigaction g_app_action[NSIG];  // what the program believes is installed
SigactionFn g_real_sigaction = nullptr;

// The SIGTERM deadline (memledger_defer_sigterm): while it is set, a SIGTERM
// handed to the program's handler also starts a one-shot kernel timer that
// sends SIGTERM again, tagged, after this many milliseconds; the tagged
// signal takes the default action at once. Any later change of SIGTERM's
// action clears it.
std::atomic<int> g_term_deadline_ms{0};
std::atomic<bool> g_term_timer_started{false};
constexpr int kDeadlineTag = 0x6d6c6467;  // "mldg"

bool is_deadline(int signo, const siginfo_t* info) {
  return signo == SIGTERM && info != nullptr && info->si_code == SI_TIMER && info->si_value.sival_int == kDeadlineTag;
}

// Async-signal-safe: two system calls (the kernel's timer, not glibc's
// timer_create, whose thread notification is not safe here; a forked child
// starts its own, as kernel timers are not inherited).
void start_term_deadline(int ms) {
  if (g_term_timer_started.exchange(true)) return;
  struct sigevent event;
  memset(&event, 0, sizeof event);
  event.sigev_notify = SIGEV_SIGNAL;
  event.sigev_signo = SIGTERM;
  event.sigev_value.sival_int = kDeadlineTag;
  int timer = 0;
  if (syscall(SYS_timer_create, CLOCK_MONOTONIC, &event, &timer) != 0) return;
  struct itimerspec when;
  memset(&when, 0, sizeof when);
  when.it_value.tv_sec = ms / 1000;
  when.it_value.tv_nsec = static_cast<long>(ms % 1000) * 1000000L;
  syscall(SYS_timer_settime, timer, 0, &when, nullptr);
}

bool watched(int signo) {
  for (int s : kWatched) {
    if (s == signo) return true;
  }
  return false;
}

bool is_crash(int signo) {
  return signo == SIGSEGV || signo == SIGBUS || signo == SIGABRT || signo == SIGFPE || signo == SIGILL;
}

SigactionFn real_sigaction() {
  if (g_real_sigaction == nullptr) {
    g_real_sigaction = reinterpret_cast<SigactionFn>(dlsym(RTLD_NEXT, "sigaction"));
  }
  return g_real_sigaction;
}

void handler(int signo, siginfo_t* info, void* context) {
  // A fault of the Python frame walk is not the program's: it resumes there.
  // Only a fault (si_code > 0): a SIGSEGV sent with kill() is the program's.
  if ((signo == SIGSEGV || signo == SIGBUS) && info != nullptr && info->si_code > 0 && python_frames_recover(context)) {
    return;
  }
  const int saved_errno = errno;
  Recorder& rec = recorder();
  if (rec.active()) {
    ThreadState& t = thread_state();
    const uint8_t was_in_hook = t.in_hook;
    t.in_hook = 1;
    SignalNote& note = trace_writer().signal_note();
    int expected = 0;
    // Only the first signal is kept with its stack: later ones are what the
    // program does while dying.
    if (note.pending.compare_exchange_strong(expected, 3)) {
      note.signo = signo;
      note.code = info ? info->si_code : 0;
      note.fault_addr = (info && is_crash(signo)) ? reinterpret_cast<uint64_t>(info->si_addr) : 0;
      note.tid = static_cast<pid_t>(syscall(SYS_gettid));
      note.ts = monotonic_ns();
      // No Python frames for a crash: the interpreter's memory may be what failed.
      note.stack = rec.capture_stack(0, !is_crash(signo));
      note.pending.store(1, std::memory_order_release);
      rec.flush_and_wait(is_crash(signo) ? 1000 : 500);
    }
    t.in_hook = was_in_hook;
  }

  struct sigaction app;
  {
    // No lock here: a handler may interrupt sigaction() itself. A torn read
    // of a struct being replaced is no worse than the race the program has.
    memcpy(&app, &g_app_action[signo], sizeof app);
  }
  if (is_deadline(signo, info)) {
    // The handler that was to end the process did not in time: the default action.
    memset(&app, 0, sizeof app);
    app.sa_handler = SIG_DFL;
  } else if (signo == SIGTERM) {
    const int deadline_ms = g_term_deadline_ms.load(std::memory_order_acquire);
    if (deadline_ms > 0) start_term_deadline(deadline_ms);
  }
  errno = saved_errno;
  if (app.sa_flags & SA_SIGINFO) {
    if (app.sa_sigaction != nullptr) {
      if (app.sa_flags & SA_RESETHAND) g_app_action[signo].sa_handler = SIG_DFL;
      app.sa_sigaction(signo, info, context);
      return;
    }
  } else if (app.sa_handler == SIG_IGN) {
    return;
  } else if (app.sa_handler != SIG_DFL && app.sa_handler != nullptr) {
    if (app.sa_flags & SA_RESETHAND) g_app_action[signo].sa_handler = SIG_DFL;
    app.sa_handler(signo);
    return;
  }
  // Default action: restore it and re-raise, so the process ends exactly as
  // it would have without memledger (same signal, same core dump).
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  real_sigaction()(signo, &dfl, nullptr);
  sigset_t unblock;
  sigemptyset(&unblock);
  sigaddset(&unblock, signo);
  pthread_sigmask(SIG_UNBLOCK, &unblock, nullptr);
  if (info != nullptr && info->si_code > 0 && is_crash(signo) && signo != SIGABRT) {
    return;  // a hardware fault: returning re-executes the instruction under SIG_DFL
  }
  raise(signo);
}

// Our handler in front of the program's action: interrupted system calls
// restart, and other signals are blocked while it runs, as the program's
// action asked (Python's handlers do not restart: a blocked read returns
// EINTR so that the interpreter runs them).
void install_ours(SigactionFn real, int signo, const struct sigaction& app) {
  struct sigaction ours;
  memset(&ours, 0, sizeof ours);
  ours.sa_sigaction = handler;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | (app.sa_flags & SA_RESTART);
  ours.sa_mask = app.sa_mask;
  real(signo, &ours, nullptr);
}

}  // namespace

void install_signal_handlers() {
  SigactionFn real = real_sigaction();
  if (real == nullptr) return;
  // An alternate stack lets the handler run after a stack overflow.
  static char alt_stack[64 * 1024];
  stack_t ss;
  memset(&ss, 0, sizeof ss);
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  stack_t old_ss;
  if (sigaltstack(nullptr, &old_ss) == 0 && (old_ss.ss_flags & SS_DISABLE)) sigaltstack(&ss, nullptr);
  SpinGuard guard(g_actions_lock);
  for (int signo : kWatched) {
    struct sigaction old;
    if (real(signo, nullptr, &old) != 0) continue;
    if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN) {
      // Ignored (nohup, a parent's choice): leave it ignored.
      continue;
    }
    g_app_action[signo] = old;
    install_ours(real, signo, old);
  }
  g_owner.store(static_cast<pid_t>(syscall(SYS_getpid)), std::memory_order_relaxed);
  static bool registered = false;
  if (!registered) {
    registered = true;
    pthread_atfork(nullptr, nullptr, [] { g_owner.store(static_cast<pid_t>(syscall(SYS_getpid)), std::memory_order_relaxed); });
  }
  g_installed.store(true, std::memory_order_release);
}

}  // namespace memledger::interposer

using memledger::interposer::g_actions_lock;
using memledger::interposer::g_app_action;
using memledger::interposer::g_installed;
using memledger::interposer::g_owner;

namespace {

using MaskFn = int (*)(int, const sigset_t*, sigset_t*);
std::atomic<MaskFn> g_next_pthread_sigmask{nullptr};
std::atomic<MaskFn> g_next_sigprocmask{nullptr};

// libc's function, looked up at the first call (no lock: async-signal-safe
// callers; threads that race look up the same address).
MaskFn next_mask_function(std::atomic<MaskFn>& slot, const char* name) {
  MaskFn fn = slot.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = reinterpret_cast<MaskFn>(memledger::interposer::libc_dlsym(RTLD_NEXT, name));
    slot.store(fn, std::memory_order_release);
  }
  return fn;
}

bool owned_by_us(int signo) {
  if (!g_installed.load(std::memory_order_acquire) || signo <= 0 || signo >= NSIG) return false;
  if (!memledger::interposer::watched(signo)) return false;
  if (static_cast<pid_t>(syscall(SYS_getpid)) != g_owner.load(std::memory_order_relaxed)) return false;  // a vfork child
  // Only while our handler is the one installed (not for signals left ignored).
  struct sigaction current;
  if (memledger::interposer::real_sigaction()(signo, nullptr, &current) != 0) return false;
  return (current.sa_flags & SA_SIGINFO) && current.sa_sigaction == memledger::interposer::handler;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int sigaction(int signo, const struct sigaction* act,
                                                     struct sigaction* oldact) {
  auto real = memledger::interposer::real_sigaction();
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  if (!owned_by_us(signo)) return real(signo, act, oldact);
  memledger::interposer::SpinGuard guard(g_actions_lock);
  if (oldact != nullptr) *oldact = g_app_action[signo];
  if (act != nullptr) {
    g_app_action[signo] = *act;
    memledger::interposer::install_ours(real, signo, *act);
    // The program (or the Python module itself) chose SIGTERM's action anew.
    if (signo == SIGTERM) memledger::interposer::g_term_deadline_ms.store(0, std::memory_order_release);
  }
  return 0;
}

__attribute__((visibility("default"))) sighandler_t signal(int signo, sighandler_t handler) {
  struct sigaction act, old;
  memset(&act, 0, sizeof act);
  act.sa_handler = handler;
  sigemptyset(&act.sa_mask);
  act.sa_flags = SA_RESTART;
  if (sigaction(signo, &act, &old) != 0) return SIG_ERR;
  if (old.sa_flags & SA_SIGINFO) return reinterpret_cast<sighandler_t>(reinterpret_cast<void*>(old.sa_sigaction));
  return old.sa_handler;
}

// The thread's signal mask: changed by the program as asked; the Python
// frame walk learns that it must ask again whether the fault signals are
// blocked (python_frames.cpp).
__attribute__((visibility("default"))) int pthread_sigmask(int how, const sigset_t* set, sigset_t* old) {
  const MaskFn real = next_mask_function(g_next_pthread_sigmask, "pthread_sigmask");
  if (real == nullptr) return ENOSYS;
  const int rc = real(how, set, old);
  if (set != nullptr) memledger::interposer::python_frames_mask_changed();
  return rc;
}

__attribute__((visibility("default"))) int sigprocmask(int how, const sigset_t* set, sigset_t* old) {
  const MaskFn real = next_mask_function(g_next_sigprocmask, "sigprocmask");
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  const int rc = real(how, set, old);
  if (set != nullptr) memledger::interposer::python_frames_mask_changed();
  return rc;
}

__attribute__((visibility("default"))) int memledger_defer_sigterm(int deadline_ms) {
  if (deadline_ms < 0 || !owned_by_us(SIGTERM)) return -1;
  memledger::interposer::g_term_deadline_ms.store(deadline_ms, std::memory_order_release);
  return 0;
}

}  // extern "C"
