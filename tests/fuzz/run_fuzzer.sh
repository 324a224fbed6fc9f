#!/usr/bin/env bash
# Runs the trace reader's fuzz target for a bounded time (MLTEST_FUZZ_SECONDS,
# default 60) over a copy of the seed corpus, so that inputs it finds do not
# land in the source tree. Crashing inputs are kept in LOG_DIR/fuzz-artifacts.
# The mutations follow a fixed seed (MLTEST_FUZZ_SEED, default 1), so that a
# failure is the same on every run; set another seed to explore further.
#
#   run_fuzzer.sh CORPUS_DIR LOG_DIR [FUZZER]
set -euo pipefail
corpus=$1 logs=$2 fuzzer=${3:-}
if [[ -z $fuzzer ]]; then
  echo "SKIP: no clang++ with libFuzzer here (Debian: clang, libclang-rt-dev); the trace reader is not fuzzed"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$logs/fuzz-artifacts"
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=0
"$fuzzer" -seed="${MLTEST_FUZZ_SEED:-1}" -max_total_time="${MLTEST_FUZZ_SECONDS:-60}" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$logs/fuzz-artifacts/" "$work" "$corpus"
