#!/usr/bin/env bash
# Runs each fuzz target for SECONDS on a scratch copy of its committed corpus (tests/fuzz/corpus/<target>;
# the copy grows, the committed corpus does not), one after another, on one core each. Prints each
# target's figures (executions, exec/s, libFuzzer's final cov/ft/corpus line) and fails if any target
# found a crash, a leak, a timeout or an out-of-memory; the input is kept under BUILD/fuzz-artifacts/.
# usage: tests/fuzz/run.sh BUILD SECONDS [TARGET...]   (no TARGET: all five)
set -uo pipefail
build=${1:?usage: run.sh BUILD SECONDS [TARGET...]}
seconds=${2:?usage: run.sh BUILD SECONDS [TARGET...]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(fuzz_plan fuzz_step_runner fuzz_tuning fuzz_batch_utils fuzz_forward)
scratch=$(mktemp -d /tmp/uattn-fuzz-corpus-XXXXXX)
trap 'rm -rf "$scratch"' EXIT
failed=()
printf '%-18s %8s %12s %9s  %s\n' target seconds executions exec/s "final line"
for t in "${targets[@]}"; do
  bin="$build/tests/fuzz/$t"
  [ -x "$bin" ] || { echo "run.sh: $bin is missing (make build-fuzz)" >&2; exit 2; }
  mkdir -p "$scratch/$t" "$build/fuzz-artifacts/$t"
  cp "$here/corpus/$t/"* "$scratch/$t/" 2>/dev/null || true
  log="$build/fuzz-artifacts/$t.log"
  # fuzz_forward's inputs need about 100 bytes to reach the tensors, and at its few hundred exec/s
  # libFuzzer's gradual growth of the input length would spend most of a run below that
  extra=()
  [ "$t" = fuzz_forward ] && extra=(-len_control=0 -max_len=512)
  # stdin from /dev/null: a step file may name any path, /dev/stdin included
  "$bin" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/fuzz-artifacts/$t/" "${extra[@]}" "$scratch/$t" </dev/null >"$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  final=$(grep -E '^#[0-9]+' "$log" | tail -1 | sed -E 's/^#[0-9]+[[:space:]]+[A-Z]+[[:space:]]+//')
  printf '%-18s %8s %12s %9s  %s\n' "$t" "$seconds" "${runs:-?}" "${rate:-?}" "$final"
  if [ $rc -ne 0 ]; then
    failed+=("$t")
    echo "--- $t failed (exit $rc); its log is $log:" >&2
    grep -E 'ERROR|SUMMARY|runtime error|^fuzz_|Test unit written' "$log" | head -20 >&2
    echo "--- reproduce: $bin <the input written above>" >&2
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "run.sh: findings in: ${failed[*]}" >&2
  exit 1
fi
