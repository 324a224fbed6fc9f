// `memledger check` (limits and baselines for CI) and `memledger diff` (two
// runs side by side): the command-line side of report/check.h.
#pragma once

#include <getopt.h>
#include <string>
#include <vector>

// The "check options" and "diff options" part of `memledger --help` (a
// macro so that tools/memledger.cpp can join it to its own usage text).
#define MEMLEDGER_CHECK_USAGE \
    "check options (memledger check RUN [options]; RUN is a run folder, a trace or a report JSON):\n" \
    "      --max-growth-per-step [KIND=]SIZE  growth per step after warm-up (fit over the steps)\n" \
    "      --max-peak [KIND=]SIZE             peak live bytes\n" \
    "      --max-held [KIND=]SIZE             peak held bytes (KIND: host, device)\n" \
    "      --max-fragmentation-share [KIND=]S (held - live) / held, median after warm-up (30% or 0.3)\n" \
    "      --max-exit-leak [KIND=]SIZE        bytes live at exit (start-up allocations excluded)\n" \
    "      --max-suspects [KIND=]N            growth leak suspects\n" \
    "      --max-ooms N                       out-of-memory events\n" \
    "      --min-steps N                      steps the run must have recorded\n" \
    "      --warmup-steps N                   steps ignored before judging growth\n" \
    "      --policy FILE                      limits from a TOML or YAML file (flags override it)\n" \
    "      --baseline RUN_OR_JSON             also compare with a previous run\n" \
    "      --tolerance T                      allowed worsening against the baseline (default 5%)\n" \
    "      --allow-different-command          compare with a baseline that ran another command\n" \
    "      --junit FILE | --json FILE | --markdown FILE   verdict for CI systems\n" \
    "      --debug-dir DIR                    look for binaries and debug info in DIR (repeatable)\n" \
    "  -q, --quiet                            print broken limits only\n" \
    "  KIND: total (default), host, device, managed, pinned_host, mapped. SIZE: 4096, 512KiB, 1.5GiB, 10MB.\n" \
    "  Exit 0: all limits hold; 1: a limit is broken; 2: usage or input error.\n" \
    "\n" \
    "diff options (memledger diff A B [options]):\n" \
    "      --format FORMAT       text (default) or json\n" \
    "  -o, --output FILE         write to FILE instead of standard output\n" \
    "      --warmup-steps N      steps ignored before judging growth\n" \
    "      --max-sites N         sites listed per table (default 10)\n" \
    "      --all-steps           every step in the text tables (default: at most 40 rows)\n" \
    "      --debug-dir DIR       look for binaries and debug info in DIR (repeatable)\n"

namespace memledger::tools {

// Exit 0 when every limit holds, 1 when one is broken, 2 on usage or input errors.
int cmd_check(int argc, char** argv);
// Exit 0 with the comparison, 2 on usage or input errors.
int cmd_diff(int argc, char** argv);

extern const char* const kCheckUsage;  // MEMLEDGER_CHECK_USAGE

// The candidate closest to a misspelled word (edit distance at most a third
// of its length, at least 1), or "" when none is close enough to suggest.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

// "unknown option --outptu; did you mean --output?" (getopt's table).
std::string unknown_option(const char* given, const struct option* options);

}  // namespace memledger::tools
