// Signal handling: memledger records termination and crash signals with a
// final flush, then hands the signal to whatever handler the program
// installed (Python, frameworks and crash reporters install their own), or
// re-raises it with the default action so the exit status is unchanged.
//
// To stay in front of handlers the program installs later, sigaction() and
// signal() are interposed for the watched signals: the program's handler is
// stored and chained, and sigaction() reports it back as if it were installed.
#pragma once

namespace memledger::interposer {

void install_signal_handlers();

}  // namespace memledger::interposer
