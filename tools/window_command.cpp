#include "window_command.h"

#include <getopt.h>

#include <cstdio>
#include <string>

#include "check_command.h"
#include "policy.h"
#include "trace_reader.h"
#include "window.h"

namespace memledger::tools {
namespace {

// One line: the whole help would bury the message that matters.
int usage(const std::string& message) {
  std::fprintf(stderr, "memledger: window: %s (memledger window --help)\n", message.c_str());
  return 2;
}

}  // namespace

int cmd_window(int argc, char** argv) {
  static const option kOptions[] = {
      {"from-seq", required_argument, nullptr, 'f'},
      {"to-seq", required_argument, nullptr, 't'},
      {"top", required_argument, nullptr, 'n'},
      {"debug-dir", required_argument, nullptr, 'd'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  uint64_t from = 0, to = 0, top = 5;
  report::SymbolizerOptions symbolizer;
  optind = 1;
  int c;
  try {
    while ((c = getopt_long(argc, argv, ":h", kOptions, nullptr)) != -1) {
      switch (c) {
        case 'f': from = report::parse_count(optarg, "--from-seq"); break;
        case 't': to = report::parse_count(optarg, "--to-seq"); break;
        case 'n': top = report::parse_count(optarg, "--top"); break;
        case 'd': symbolizer.debug_dirs.emplace_back(optarg); break;
        case 'h': std::fputs(MEMLEDGER_WINDOW_USAGE, stdout); return 0;
        case ':': return usage(std::string("option ") + argv[optind - 1] + " needs a value");
        default: return usage(unknown_option(argv[optind - 1], kOptions));
      }
    }
  } catch (const report::PolicyError& e) {
    return usage(e.what());
  }
  if (optind != argc - 1) return usage("give exactly one TRACE file");
  if (to != 0 && to <= from) return usage("--to-seq must be after --from-seq");
  try {
    const report::Trace trace = report::read_trace(argv[optind]);
    const report::WindowReport window = report::analyze_window(trace, from, to, top, symbolizer);
    constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
    std::printf("%s\n", report::render_window_json(window).dump(2, ' ', false, kReplace).c_str());
    for (const std::string& p : trace.problems) std::fprintf(stderr, "memledger: warning: %s\n", p.c_str());
    return 0;
  } catch (const report::TraceError& e) {
    std::fprintf(stderr, "memledger: %s\n", e.what());
    return 1;
  }
}

}  // namespace memledger::tools
