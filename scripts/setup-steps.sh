# Sourced by the set-up scripts: one line per step on stderr, the step's own
# output in build/setup.log (SETUP_LOG), and the log's end when a step fails.
setup_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SETUP_LOG=${SETUP_LOG:-$setup_root/build/setup.log}
mkdir -p "$(dirname "$SETUP_LOG")"

setup_note() {
  echo "memledger setup: $1" >&2
}

# setup_step DESCRIPTION COMMAND...: runs COMMAND with its output in the log;
# on failure prints the log's end and exits with COMMAND's status.
setup_step() {
  local what=$1 status=0
  shift
  setup_note "$what"
  printf '\n=== %s: %s\n' "$(date -u +%FT%TZ)" "$what" >>"$SETUP_LOG"
  "$@" >>"$SETUP_LOG" 2>&1 </dev/null || status=$?
  if ((status != 0)); then
    echo "memledger setup: failed (exit $status): $what; the end of $SETUP_LOG:" >&2
    tail -n 40 "$SETUP_LOG" >&2
    exit "$status"
  fi
}

# setup_step_optional DESCRIPTION CONSEQUENCE COMMAND...: the same for what
# only some tests need: a failure is one line, and the set-up goes on.
setup_step_optional() {
  local what=$1 consequence=$2 status=0
  shift 2
  setup_note "$what"
  printf '\n=== %s: %s\n' "$(date -u +%FT%TZ)" "$what" >>"$SETUP_LOG"
  "$@" >>"$SETUP_LOG" 2>&1 </dev/null || status=$?
  if ((status != 0)); then
    echo "memledger setup: that failed (exit $status; see $SETUP_LOG): $consequence" >&2
  fi
  return 0
}
