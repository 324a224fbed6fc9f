#!/usr/bin/env bash
# The quick start's first command: builds memledger and traces the bundled
# example, a training loop with a planted leak, then prints its report.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
cd "$root"
run_dir=$(mktemp -d /tmp/memledger-example.XXXXXX)
build/tools/memledger run -o "$run_dir" --host full -- build/examples/train_leak 40
echo
cat "$run_dir/report.txt"
