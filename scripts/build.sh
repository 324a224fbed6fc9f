#!/usr/bin/env bash
# Installs what is missing, then configures (once) and builds into build/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
cd "$root"
if [[ ! -f build/build.ninja ]]; then
  meson setup build >/dev/null
fi
meson compile -C build >/dev/null
