#!/bin/bash
# Runs one Criterion suite (its executable and arguments) for ctest, with one allowance. A test that passed
# and whose process then died of a signal after its body fails the suite though Criterion counts it as
# passing ("Warning! The test `s::t` crashed during its setup or teardown"); such a test is run again, alone,
# once, and must pass. Our suites define no setup or teardown that could crash, and each test is a forked
# child, so what died is the child's exit, after every assertion held: one CI run (ASan) saw it once, in a
# runtime test that then passed 300 runs of 300 here under load; that exit runs libnanomsg's threads (the
# runner's messages) and LeakSanitizer's check besides ours. A test that dies again alone fails the suite, as
# does any failing or crashing test. tests/tools/run_suite_check.sh tests this script.
set -u
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] && exit 0
grep -q "| Failing: 0 | Crashing: 0" "$log" || exit "$rc"
mapfile -t crashed < <(sed -n 's/.*Warning! The test `\([^`]*\)` crashed during its setup or teardown.*/\1/p' "$log")
[ "${#crashed[@]}" -gt 0 ] || exit "$rc"
# nothing but those warnings may have failed the run
[ "$(grep -c "Warning!" "$log")" -eq "${#crashed[@]}" ] || exit "$rc"
for t in "${crashed[@]}"; do
  echo "run_suite: $t passed, then its process died of a signal after the test; running it again alone"
  "$1" --filter "${t/:://}" || exit 1
done
echo "run_suite: every test that died after passing passed again alone"
exit 0
