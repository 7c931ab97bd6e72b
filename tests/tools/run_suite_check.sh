#!/bin/bash
# run_suite.sh against a suite that dies after a passing test (crash_after_pass): it must pass where the
# death happens once, and fail where it happens again alone, or where another test fails beside it.
# Usage: run_suite_check.sh RUN_SUITE_SH CRASH_AFTER_PASS_EXE
set -u
run=$1 exe=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
bad=0
expect() { # expect RC NAME ENV...: run_suite on the suite with ENV must exit RC (0 or nonzero)
  local want=$1 name=$2
  shift 2
  env "$@" bash "$run" "$exe" --jobs 2 >"$dir/$name.log" 2>&1
  local rc=$?
  if (((want == 0) != (rc == 0))); then
    echo "FAIL $name: exit $rc"
    cat "$dir/$name.log"
    bad=1
  else
    echo "ok   $name: exit $rc"
  fi
}
expect 0 clean
expect 0 dies_once CRASH_ONCE="$dir/once"
expect 1 dies_again CRASH_ALWAYS=1
expect 1 dies_once_and_other_fails CRASH_ONCE="$dir/once2" FAIL_OTHER=1
exit $bad
