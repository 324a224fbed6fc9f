#!/usr/bin/env bash
# Installs what is missing (scripts/install-deps.sh), configures build/ once
# and builds. The mode is install-deps.sh's:
#   example  only the `tool` target: the command, the preload library, the
#            CUPTI module where it is built, and the Python helper package;
#   all      (default) everything: the tests and the benchmarks too.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-all}
"$root/scripts/install-deps.sh" "$mode"
cd "$root"
. scripts/setup-steps.sh
# build/ configured for the example has not seen what `all` installs since
# (Catch2, clang): meson looks again.
stamp=build/memledger-setup-mode
if [[ ! -f build/build.ninja ]]; then
  setup_step "configuring build/" meson setup build
  echo "$mode" >"$stamp"
elif [[ $mode == all && $(cat "$stamp" 2>/dev/null) == example ]]; then
  setup_step "configuring build/ again for the tests" meson setup --reconfigure build
  echo "$mode" >"$stamp"
fi
if [[ $mode == example ]]; then
  setup_step "building memledger (build/tools/memledger, build/interposer/libmemledger.so)" \
    meson compile -C build tool
else
  setup_step "building memledger, its tests and benchmarks in build/" meson compile -C build
fi
