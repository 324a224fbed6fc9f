// The CUDA stack of the process, recorded as kInfo facts (trace_format.h):
// the driver's version and GPUs, and each loaded CUDA-family library with
// the version its own call reports.
#pragma once

namespace memledger::interposer {

// Called from the program's own thread right after one of its CUDA calls
// returned (`call`, result `error`), and at step ends (call nullptr).
// Only libraries already loaded are asked, through RTLD_NOLOAD handles, and
// only for calls that initialise nothing (cuDriverGetVersion,
// cudaRuntimeGetVersion, cudnnGetVersion, ...); the GPUs are listed once the
// driver answers cuDeviceGetCount, i.e. after the program initialised it.
// Each fact is recorded once; `error` of a driver-version kind (35, 222,
// 803, 804) is recorded as cuda.init_error.
void note_cuda_stack(const char* call, int error);

}  // namespace memledger::interposer
