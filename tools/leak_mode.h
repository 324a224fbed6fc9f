// `memledger run --leak-mode`: the frameworks' switches that hand every
// tensor allocation to an allocator whose calls the CUDA hooks see.
#pragma once

#include <string>
#include <vector>

namespace memledger::tools {

// The XLA_PYTHON_CLIENT_ALLOCATOR value for the JAX that `python` has
// installed: "cuda_async" where its jaxlib accepts it (every buffer is a
// stream-ordered pool allocation; "platform" there falls back to BFC), else
// "platform", the pass-through of the versions before it (also when no JAX
// is found: every version accepts it).
std::string jax_leak_allocator(const std::string& python);

// The Python interpreter a command runs: the command itself when it is one,
// the interpreter on a script's "#!" line, else "python3" from PATH.
std::string command_python(const std::vector<std::string>& command);

// Sets the switches in this process's environment (the child about to exec
// `command`). PyTorch's other options are kept, except those that pick
// another backend (expandable segments cannot be combined with
// cudaMallocAsync). PyTorch reads PYTORCH_ALLOC_CONF and, before it,
// PYTORCH_CUDA_ALLOC_CONF; the newer name wins where both are set: the
// options come from the one PyTorch would use, and both are set.
void set_leak_mode_environment(const std::vector<std::string>& command);

}  // namespace memledger::tools
