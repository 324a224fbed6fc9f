// The live status line of `memledger run`: the terminal's last row, kept out
// of the traced program's way.
#pragma once

#include <string>

namespace memledger::tools {

// The terminal's last row, reserved for memledger's status while the traced
// program writes to the same terminal, as apt draws its progress bar. The
// program's output goes to the terminal untouched (no pty or pipe of ours in
// between): a scroll region (DECSTBM) keeps its scrolling in the rows above,
// and each redraw is one write() that saves the cursor, draws on the last
// row and restores the cursor. A write to a terminal is not interleaved with
// another process's write, so a redraw lands between two of the program's
// writes and never inside a line.
//
// One instance at a time: the handlers of SIGWINCH and SIGTSTP it installs,
// and release_from_signal(), share its state.
class StatusLine {
 public:
  // `fd` is the terminal (stderr). Nothing is ever drawn when it is not a
  // terminal, TERM is unset or "dumb", or the terminal has fewer than
  // kMinRows rows.
  explicit StatusLine(int fd);
  ~StatusLine();
  StatusLine(const StatusLine&) = delete;
  StatusLine& operator=(const StatusLine&) = delete;

  // Whether a status can be drawn at all (a usable terminal).
  bool usable() const { return usable_; }

  // Draws `text` on the last row (cut to the width). The first call, and the
  // first after a resize or a stop, reserves the row first. Draws nothing
  // while the program is stopped, while memledger is not in the terminal's
  // foreground, after a forwarded signal, or while the terminal is too small.
  void show(const std::string& text);

  // A resize or a continued stop wants the row drawn again now.
  bool wants_redraw() const;

  // The program stopped: the row is given back until resumed().
  void stopped();
  void resumed();

  // Gives the row back for good: resets the scroll region and clears the
  // row, leaving the cursor where the program's output ended.
  void finish();

  // The same from a signal handler (async-signal-safe), for a signal
  // memledger forwards to the program: the row is given back and never
  // drawn again.
  static void release_from_signal();

  static constexpr int kMinRows = 4;

 private:
  bool usable_ = false;
  bool paused_ = false;
};

}  // namespace memledger::tools
