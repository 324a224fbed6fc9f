// The text report's stacks: the user's frames, with each run of library
// frames (an installed package, the Python standard library, the
// interpreter, libc and the other system libraries) folded into one line,
// "… 6 frames in tensorflow …". JSON and HTML keep every frame.
#pragma once

#include <string>
#include <vector>

#include "symbolizer.h"

namespace memledger::report {

// The library a frame belongs to ("tensorflow", "the Python standard
// library", "python3.11", "libc"), "?" for a frame with neither name nor
// module, or empty when it is the user's own code.
std::string frame_library(const Frame& f);

// The stack as lines of text, innermost first: a run of at least two
// library frames is one "… N frames in A, B …" line.
std::vector<std::string> folded_stack(const std::vector<Frame>& frames);

}  // namespace memledger::report
