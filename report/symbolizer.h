// Offline symbolization of recorded instruction pointers (elfutils libdwfl).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace memledger::report {

// One loaded ELF object as recorded at run time.
struct ModuleInfo {
  uint64_t base = 0;     // load bias (dl_phdr_info::dlpi_addr)
  std::string path;      // path at run time; "[vdso]"/"linux-vdso.so.1" name no file
  std::string build_id;  // lowercase hex of NT_GNU_BUILD_ID, may be empty
  std::vector<std::pair<uint64_t, uint64_t>> segments;  // PT_LOAD (p_vaddr, p_memsz), unrelocated
};

struct Frame {
  uint64_t address = 0;  // the instruction pointer as recorded
  std::string function;  // demangled; "" if unknown
  std::string file;      // source file, "" if unknown
  int line = 0;          // 0 if unknown
  std::string module;    // module path ("" if the address is in no known module)
  bool inlined = false;  // true for a frame that was inlined into the next one
  bool python = false;   // a Python frame: function is the qualified name, file:line the source line
  bool attributed = false;  // a Python frame of the main thread, lent to a thread that never ran Python
};

// A Python code object as recorded at run time (trace_format.h, kPythonCode).
struct PythonCode {
  std::string filename;
  std::string qualname;
  int first_line = 0;
  uint8_t table_format = 0;  // format::LineTableFormat
  std::string line_table;    // the code object's own table, as stored
};

// The source line of the instruction at byte offset `offset` of a code object
// (format::kPythonOffsetUnknown: before its first instruction), computed from
// its line table as CPython's PyCode_Addr2Line does. 0 when the instruction
// has no line.
int python_line(const PythonCode& code, uint32_t offset);

struct SymbolizerOptions {
  // Extra folders searched for separate debug info, in addition to /usr/lib/debug:
  // DIR/.build-id/xx/yyyy.debug, DIR/<path of the module>(.debug), DIR/<basename>.
  // The last two also serve binaries copied off the machine that ran the trace.
  std::vector<std::string> debug_dirs;
};

// Resolves the instruction pointers of a trace to function, file:line and inline chain,
// offline, from the module map (load bias, path, build id) recorded at run time. A
// module is opened on the first address that falls in it; a file whose build id differs
// from the recorded one is never trusted (its frames keep only the module path).
// Separate debug info is looked up locally only: never through debuginfod.
// Not thread-safe; one instance per trace (per process).
class Symbolizer {
 public:
  explicit Symbolizer(std::vector<ModuleInfo> modules, SymbolizerOptions options = {});
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  // ip: a recorded instruction pointer. return_address: true for every frame but the
  // innermost (the lookup then uses ip-1 so that the call instruction's line is found).
  // Returns the inline chain innermost first (inlined=true), ending with the containing
  // function. Never empty: an unknown address gives one Frame with module/function "".
  // The reference stays valid as long as the Symbolizer.
  const std::vector<Frame>& resolve(uint64_t ip, bool return_address);

  // The trace's Python code objects, for the Python frames of its stacks
  // (format::is_python_frame words, which resolve() then turns into one
  // Frame each; without this call every word is an address); `module` is
  // the object that ran the interpreter. `codes` must outlive the Symbolizer.
  void set_python(const std::map<uint32_t, PythonCode>* codes, std::string module);

  // Human-readable notes (missing files, build id mismatches, ...), each once.
  const std::vector<std::string>& warnings() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memledger::report
