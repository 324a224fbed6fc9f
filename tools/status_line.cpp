#include "status_line.h"

#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace memledger::tools {
namespace {

// The escape sequences (VT100, which every terminal emulator follows).
constexpr const char* kSaveCursor = "\0337";     // DECSC: position, attributes, pending wrap
constexpr const char* kRestoreCursor = "\0338";  // DECRC
constexpr const char* kIndex = "\033D";          // IND: down one row, scrolling at the bottom
constexpr const char* kUp = "\033[A";
constexpr const char* kResetRegion = "\033[r";   // DECSTBM without rows: the whole screen (when the size is unknown)
constexpr const char* kClearRow = "\033[0m\033[2K";

// Shared with the signal handlers, hence plain globals: written by the main
// thread with the handlers' signals blocked (see Blocked), read and written
// by the handlers.
int g_fd = -1;
volatile sig_atomic_t g_reserved = 0;      // the scroll region is set and the last row is ours
volatile sig_atomic_t g_done = 0;          // given back for good
volatile sig_atomic_t g_reserve_again = 0; // resized, or continued after a stop
int g_rows = 0;                            // the size the row was reserved for
int g_cols = 0;
bool g_reserved_before = false;            // reserved once already (main thread only)
bool g_tstp_installed = false;
struct sigaction g_old_winch {}, g_old_tstp {};

void write_once(const char* data, size_t len) {
  // One write(): a terminal writes it whole before another process's output.
  ssize_t ignored = ::write(g_fd, data, len);
  (void)ignored;
}

// Writes a decimal number (async-signal-safe, unlike the library's).
size_t put_number(char* out, int n) {
  char digits[12];
  size_t len = 0;
  do {
    digits[len++] = static_cast<char>('0' + n % 10);
    n /= 10;
  } while (n > 0 && len < sizeof digits);
  for (size_t i = 0; i < len; ++i) out[i] = digits[len - 1 - i];
  return len;
}

size_t put(char* out, const char* text) {
  const size_t len = std::strlen(text);
  std::memcpy(out, text, len);
  return len;
}

// Gives the row back: the whole screen scrolls again, and the row is
// cleared when the terminal still has the size it was drawn for (after a
// resize not yet handled, the last row may be the program's). The cursor
// stays where the program left it. Async-signal-safe: it runs in handlers.
void release_now() {
  if (!g_reserved || g_fd < 0) return;
  struct winsize ws {};
  const int rows = ioctl(g_fd, TIOCGWINSZ, &ws) == 0 ? ws.ws_row : 0;
  char out[96];
  size_t len = put(out, kSaveCursor);
  if (rows > 0) {
    len += put(out + len, "\033[1;");
    len += put_number(out + len, rows);
    len += put(out + len, "r");
  } else {
    len += put(out + len, kResetRegion);
  }
  if (rows == g_rows) {
    len += put(out + len, "\033[");
    len += put_number(out + len, rows);
    len += put(out + len, ";1H");
    len += put(out + len, kClearRow);
  }
  len += put(out + len, kRestoreCursor);
  write_once(out, len);
  g_reserved = 0;
}

void on_winch(int) { g_reserve_again = 1; }

// ^Z stops the whole foreground job, memledger with the program: give the
// row back first, so the shell gets its whole screen, then stop as the
// default action would; continued, take the row again at the next redraw.
void on_tstp(int) {
  const int saved_errno = errno;
  release_now();
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGTSTP, &dfl, nullptr);
  sigset_t tstp;
  sigemptyset(&tstp);
  sigaddset(&tstp, SIGTSTP);
  pthread_sigmask(SIG_UNBLOCK, &tstp, nullptr);
  raise(SIGTSTP);  // stops here until SIGCONT
  pthread_sigmask(SIG_BLOCK, &tstp, nullptr);
  struct sigaction again {};
  again.sa_handler = on_tstp;
  sigemptyset(&again.sa_mask);
  again.sa_flags = SA_RESTART;
  sigaction(SIGTSTP, &again, nullptr);
  g_reserve_again = 1;
  errno = saved_errno;
}

// Blocks the signals whose handlers write to the terminal or change the
// shared state, for one redraw.
class Blocked {
 public:
  Blocked() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : {SIGWINCH, SIGTSTP, SIGTERM, SIGHUP}) sigaddset(&set, sig);
    pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~Blocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  Blocked(const Blocked&) = delete;
  Blocked& operator=(const Blocked&) = delete;

 private:
  sigset_t old_;
};

struct winsize terminal_size() {
  struct winsize ws {};
  if (ioctl(g_fd, TIOCGWINSZ, &ws) != 0) ws = {};
  return ws;
}

// A job in the background must not write escape sequences over the shell's
// screen. A terminal that is not our controlling terminal has no foreground.
bool in_foreground() {
  const pid_t fg = tcgetpgrp(g_fd);
  return fg < 0 || fg == getpgrp();
}

void append_number(std::string& out, int n) { out += std::to_string(n); }

}  // namespace

StatusLine::StatusLine(int fd) {
  const char* term = std::getenv("TERM");
  if (g_fd >= 0 || !isatty(fd) || term == nullptr || *term == '\0' || std::strcmp(term, "dumb") == 0) return;
  usable_ = true;
  g_fd = fd;
  struct sigaction sa {};
  sa.sa_handler = on_winch;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGWINCH, &sa, &g_old_winch);
  // A SIGTSTP that our parent ignores (no job control) stays ignored.
  sigaction(SIGTSTP, nullptr, &g_old_tstp);
  if (g_old_tstp.sa_handler != SIG_IGN) {
    sa.sa_handler = on_tstp;
    sigaction(SIGTSTP, &sa, nullptr);
    g_tstp_installed = true;
  }
}

StatusLine::~StatusLine() { finish(); }

void StatusLine::show(const std::string& text) {
  if (!usable_ || paused_) return;
  Blocked blocked;
  if (g_done || !in_foreground()) return;
  std::string out;
  if (!g_reserved || g_reserve_again) {
    const bool again = g_reserved || g_reserved_before;
    g_reserve_again = 0;
    const struct winsize size = terminal_size();
    if (size.ws_row < StatusLine::kMinRows) {
      // Too small now: give the region back and draw nothing.
      release_now();
      return;
    }
    g_rows = size.ws_row;
    g_cols = size.ws_col > 0 ? size.ws_col : 80;
    // Make room when the cursor is on the last row: down one row (the
    // screen scrolls when the cursor is at the bottom) and back up, the
    // cursor in the same column of the same line of output, with a row
    // below it. Taken again (a resize, a stop), the rows below the
    // program's line are cleared: a terminal that grew shows the old status
    // row there. DECSTBM homes the cursor, hence the save and restore, done
    // inside the new region (some terminals keep a restored cursor in it).
    out += kIndex;
    out += kUp;
    out += kSaveCursor;
    if (again) out += "\033[B\r\033[J";
    out += "\033[1;";
    append_number(out, g_rows - 1);
    out += "r";
    out += kRestoreCursor;
  }
  out += kSaveCursor;
  out += "\033[";
  append_number(out, g_rows);
  out += ";1H";
  out += kClearRow;
  // Short of the last column, where a terminal would wrap at the next character.
  out.append(text, 0, static_cast<size_t>(g_cols - 1));
  out += kRestoreCursor;
  write_once(out.data(), out.size());
  g_reserved = 1;
  g_reserved_before = true;
}

bool StatusLine::wants_redraw() const { return usable_ && !paused_ && g_reserve_again; }

void StatusLine::stopped() {
  if (!usable_) return;
  paused_ = true;
  Blocked blocked;
  release_now();
}

void StatusLine::resumed() {
  if (!usable_) return;
  paused_ = false;
  g_reserve_again = 1;
}

void StatusLine::finish() {
  if (!usable_) return;
  {
    Blocked blocked;
    release_now();
    g_done = 1;
    sigaction(SIGWINCH, &g_old_winch, nullptr);
    if (g_tstp_installed) sigaction(SIGTSTP, &g_old_tstp, nullptr);
    g_tstp_installed = false;
    g_fd = -1;
  }
  usable_ = false;
}

void StatusLine::release_from_signal() {
  release_now();
  g_done = 1;
}

}  // namespace memledger::tools
