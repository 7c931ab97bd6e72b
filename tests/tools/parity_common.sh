# What run_step_parity.sh and run_cp_parity.sh share (sourced, not run): the work directory and counters
# (parity_begin), and the summary line and exit status (parity_end).
# shellcheck shell=bash disable=SC2034  # WORK, failures, cases and start are the sourcing script's

# parity_begin NAME: a fresh WORK directory (uattn-NAME.XXXXXX), no failures or cases yet, the start time.
parity_begin() {
  WORK="$(mktemp -d "${TMPDIR:-/tmp}/uattn-$1.XXXXXX")"
  failures=0
  cases=0
  start=$(date +%s)
}

# parity_end LABEL FAILED_IN PASSED: the one summary line, then exit 1 keeping WORK's logs on any failure, or
# remove WORK. FAILED_IN and PASSED say what ran, in the failure line and in the all-passed line.
parity_end() {
  local elapsed=$(($(date +%s) - start))
  if [ "$failures" -ne 0 ]; then
    echo "$1: $failures failure(s) in $2 (${elapsed} s); logs in $WORK"
    exit 1
  fi
  rm -rf "$WORK"
  echo "$1: all $3 passed (${elapsed} s)"
}
