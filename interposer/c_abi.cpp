// The C ABI a program may call (resolve with dlsym(RTLD_DEFAULT, ...) so that
// programs need not link against memledger). See memledger.h.

#include "memledger.h"

#include "recorder.h"

using memledger::interposer::recorder;

#define MEMLEDGER_EXPORT extern "C" __attribute__((visibility("default")))

MEMLEDGER_EXPORT void memledger_step(const char* label) {
  recorder().on_step(label, memledger::format::StepSource::kMarker);
}

MEMLEDGER_EXPORT int memledger_active(void) { return recorder().active() ? 1 : 0; }

MEMLEDGER_EXPORT void memledger_flush(void) { recorder().flush_and_wait(2000); }

MEMLEDGER_EXPORT const char* memledger_run_dir(void) {
  return recorder().active() ? recorder().config().dir : nullptr;
}
