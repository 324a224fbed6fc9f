#!/usr/bin/env bash
# The quick start's second command: installs the rest of what the tests use
# (scripts/install-deps.sh all), builds everything and runs the whole test
# suite (unit and integration). Extra arguments go to `meson test`.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh" all || exit 1
cd "$root"
# build.sh has just built everything.
meson test -C build --no-rebuild --print-errorlogs "$@"
status=$?
# One closing line that any CI reads, from meson's own log.
python3 - "$root/build/meson-logs/testlog.json" <<'PY'
import json, sys
counts = {"OK": 0, "FAIL": 0, "SKIP": 0, "EXPECTEDFAIL": 0, "TIMEOUT": 0, "ERROR": 0, "UNEXPECTEDPASS": 0}
try:
    with open(sys.argv[1]) as f:
        for line in f:
            line = line.strip()
            if line:
                r = json.loads(line).get("result", "")
                counts[r] = counts.get(r, 0) + 1
except OSError:
    pass
failed = counts["FAIL"] + counts["TIMEOUT"] + counts["ERROR"] + counts["UNEXPECTEDPASS"]
print(f"tests: {counts['OK'] + counts['EXPECTEDFAIL']} passed, {failed} failed, {counts['SKIP']} skipped")
PY
exit $status
