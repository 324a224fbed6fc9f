// `memledger window TRACE --from-seq A [--to-seq B]`: what one stretch of a
// process did to its memory (report/window.h), as JSON; the pytest plugin
// names a failing test's growing line with it.
#pragma once

#define MEMLEDGER_WINDOW_USAGE \
    "window options (memledger window TRACE [options]; JSON on standard output):\n" \
    "      --from-seq N          the window starts at sequence number N (memledger_live's seq)\n" \
    "      --to-seq N            and ends before N (default: the end of the trace)\n" \
    "      --top N               sites kept per memory kind (default 5)\n" \
    "      --debug-dir DIR       look for binaries and debug info in DIR (repeatable)\n"

namespace memledger::tools {

int cmd_window(int argc, char** argv);

}  // namespace memledger::tools
