// How long one of memledger's waits may last: a signal handler waiting for
// the writer's last frame, the writer waiting for a fresh read of the
// loaded objects.
//
// The budget counts only the time the waiting thread was there to see go
// by: each look at the clock adds at most kMostPerLook. A pause of the
// whole process or machine (a virtual machine whose processors the host
// took away, SIGSTOP, a cgroup's CPU quota spent) stops the thread waited
// for as well; counted in full, it would use up that thread's time before
// it ran again. A look may also say that the thread waited for is ready to
// run and only has no processor (a busy machine, the host's turn on its
// processor): that time is not counted either. The wall clock still ends
// every wait, at kWallTimes times the budget, so a dying program never
// hangs on the tracer.
#pragma once

#include <sys/types.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "small_file.h"

namespace memledger::interposer {

class WaitBudget {
 public:
  static constexpr uint64_t kMostPerLook = 20'000'000;  // ns
  static constexpr uint64_t kWallTimes = 4;

  WaitBudget(uint64_t budget_ns, uint64_t start_ns)
      : budget_ns_(budget_ns), last_ns_(start_ns), wall_end_ns_(start_ns + kWallTimes * budget_ns) {}

  // Counts the time since the last look, unless the thread waited for is
  // `ready` to run; false once the wait must end.
  bool go_on(uint64_t now_ns, bool ready = false) {
    const uint64_t step = now_ns > last_ns_ ? now_ns - last_ns_ : 0;
    last_ns_ = now_ns;
    if (!ready) spent_ns_ += step < kMostPerLook ? step : kMostPerLook;
    return spent_ns_ < budget_ns_ && now_ns < wall_end_ns_;
  }

  uint64_t spent_ns() const { return spent_ns_; }

 private:
  uint64_t budget_ns_;
  uint64_t last_ns_;
  uint64_t wall_end_ns_;
  uint64_t spent_ns_ = 0;
};

// Whether thread `tid` of this process is ready to run (running, or
// waiting for a processor) rather than waiting for something. Safe in a
// signal handler (read_small_file); errno is kept.
inline bool thread_ready(pid_t tid) {
  if (tid <= 0) return false;
  char path[48] = "/proc/self/task/";
  size_t n = sizeof "/proc/self/task/" - 1;
  char digits[12];
  int count = 0;
  for (pid_t rest = tid; rest != 0; rest /= 10) digits[count++] = static_cast<char>('0' + rest % 10);
  while (count > 0) path[n++] = digits[--count];
  memcpy(path + n, "/stat", sizeof "/stat");
  const int saved_errno = errno;
  char buf[512];
  const ssize_t got = read_small_file(path, buf, sizeof buf);
  errno = saved_errno;
  if (got <= 0) return false;
  // "tid (name) S ...": the name may hold spaces and parentheses.
  const char* state = strrchr(buf, ')');
  return state != nullptr && state[1] == ' ' && state[2] == 'R';
}

}  // namespace memledger::interposer
