// The preload library's side of the CUPTI module: see cupti_bridge.cpp.
#pragma once

namespace memledger::interposer {

// Called after the program's first successful cuInit: loads the CUPTI module
// (once per process) unless --cupti off. Never fails the caller.
void cupti_on_cuda_init();

}  // namespace memledger::interposer
