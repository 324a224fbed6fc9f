#!/usr/bin/env bash
# The quick start's first command: installs what the example needs when it is
# missing (scripts/install-deps.sh example), builds what `memledger run` needs
# (the `tool` target, not the tests) and traces the bundled example
# (examples/train_leak.py, a PyTorch training loop with a planted leak; on
# the GPU when PyTorch sees one, with --leak-mode), then prints its report.
# PYTHON picks the interpreter (default: Debian's /usr/bin/python3 with
# python3-torch).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh" example
cd "$root"
python=${PYTHON:-/usr/bin/python3}
options=()
if "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  options+=(--leak-mode)
fi
run_dir=$(mktemp -d /tmp/memledger-example.XXXXXX)
build/tools/memledger run -o "$run_dir" "${options[@]}" -- "$python" examples/train_leak.py --steps 40
echo
cat "$run_dir/report.txt"
