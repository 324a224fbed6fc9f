// The C ABI a program may call (resolve with dlsym(RTLD_DEFAULT, ...) so that
// programs need not link against memledger). See memledger.h.

#include "memledger.h"

#include <cstddef>
#include <cstring>

#include "recorder.h"
#include "trace_writer.h"

using memledger::interposer::recorder;
using memledger::interposer::trace_writer;

#define MEMLEDGER_EXPORT extern "C" __attribute__((visibility("default")))

MEMLEDGER_EXPORT void memledger_step(const char* label) {
  recorder().on_step(label, memledger::format::StepSource::kMarker);
}

MEMLEDGER_EXPORT void memledger_loader_step(const char* label) {
  recorder().on_step(label, memledger::format::StepSource::kLoader);
}

MEMLEDGER_EXPORT void memledger_note(const char* key, const char* value) { recorder().on_info(key, value); }

MEMLEDGER_EXPORT int memledger_active(void) { return recorder().active() ? 1 : 0; }

MEMLEDGER_EXPORT int memledger_own_threads(void) { return trace_writer().own_threads(); }

MEMLEDGER_EXPORT void memledger_flush(void) { recorder().flush_and_wait(2000); }

MEMLEDGER_EXPORT const char* memledger_run_dir(void) {
  return recorder().active() ? recorder().config().dir : nullptr;
}

MEMLEDGER_EXPORT int memledger_live(struct memledger_live* out) {
  if (out == nullptr || out->size < offsetof(struct memledger_live, gpus)) return -1;
  // Filled in a copy: a caller built against an older, shorter struct gets
  // its own fields only.
  struct memledger_live now;
  std::memset(&now, 0, sizeof now);
  recorder().read_live(now);
  const uint32_t size = out->size < sizeof now ? out->size : static_cast<uint32_t>(sizeof now);
  now.size = size;
  std::memcpy(out, &now, size);
  return (now.flags & MEMLEDGER_LIVE_TRACING) ? 0 : 1;
}
