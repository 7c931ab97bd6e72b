#!/usr/bin/env bash
# Context parallelism end to end: uattn-run-cp on 1-4 MPI ranks against uattn-run, on random steps.
#
#   tests/tools/run_cp_parity.sh BUILD_DIR     (BUILD_DIR/perf/uattn-run and uattn-run-cp must exist)
#
# For each case below: tests/ref/seed_unified_attn.py make-step writes a random valid step (cp_parity.py fp8
# turns it into one over an fp8 cache, cp_parity.py tiled one over TILED caches), uattn-run runs it, and `mpirun -np N uattn-run-cp --interleave I`
# too; cp_parity.py compare holds the caches and plan.json bit for bit and the output and lse to its
# tolerance (see its docstring). Cases marked "again" run uattn-run-cp a second time, with 2 threads a rank,
# which must give the same bits. Then bad input: every rank must print the same one line (the same as
# uattn-run's, for a bad step) and mpirun exit 2, within a timeout (no rank may hang). Exits 1 on any failure
# and keeps the failing case's directory; about 30-60 s on 2 cores.
# PYTHON overrides the interpreter (default /usr/bin/python3: Debian's, with numpy); MPIEXEC mpirun.
set -u

if [ $# -ne 1 ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
RUNNER="$1/perf/uattn-run"
CP="$1/perf/uattn-run-cp"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
MAKE_STEP="$HERE/ref/seed_unified_attn.py"
HELPER="$HERE/tools/cp_parity.py"
PY="${PYTHON:-/usr/bin/python3}"
for x in "$RUNNER" "$CP"; do
  if [ ! -x "$x" ]; then
    echo "run_cp_parity: $x not found (build the uattn-run and uattn-run-cp targets)" >&2
    exit 2
  fi
done
# Open MPI refuses to run as root without this opt-in (a CI container runs as root); --oversubscribe: more
# ranks than the machine's 2 cores; no binding, so that several ranks may share a core.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Shared memory without cross-process reads (process_vm_readv), which a container's seccomp profile may
# refuse: the test's messages are small, the copy-in/copy-out path costs nothing here.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIRUN=("${MPIEXEC:-mpirun}" --oversubscribe --bind-to none)
TIMEOUT=120 # seconds for one mpirun: a hung rank fails the case instead of the whole suite's time limit

# shellcheck source=tests/tools/parity_common.sh
. "$HERE/tools/parity_common.sh"
parity_begin cp-parity

# seed kind dtype layout ranks interleave again|once [cache:fp8_e4m3|fp8_e5m2] [extra make-step options...]
# (layout TILED: made as NHD, then rearranged; a block size that is a multiple of 16, an even head dim)
CASES=(
  "1  decode         f32  NHD 2 1  once"
  "2  prefill        f32  HND 3 2  once  --causal-width 5"
  "3  prefix-prefill f32  NHD 4 1  once  --chunk-size 1"
  "4  chunked        f32  HND 2 3  once  --chunk-size 2 --block-size 5 --head-dim 24"
  "5  mixed          f32  NHD 3 1  again --chunk-size 3 --causal-width 7"
  "6  spec-decode    f32  HND 4 2  once  --chunk-size 1"
  "7  shared-prefix  f32  NHD 2 1  once  --chunk-size 4 --num-q-heads 12 --num-kv-heads 2"
  "8  shared-prefix  bf16 HND 4 4  once  --block-size 8"
  "9  mixed          bf16 NHD 2 16 again"
  "10 mixed          bf16 HND 3 1  once  --cache-dtype bf16 --long --causal-width 0 --chunk-size 0"
  "11 chunked        f16  NHD 4 1  once"
  "12 mixed          f32  NHD 2 1  once  cache:fp8_e4m3"
  "13 spec-decode    bf16 HND 3 2  once  cache:fp8_e5m2"
  "14 mixed          f32  HND 4 3  again --sinks --alibi --soft-cap 20 --sliding-window 13"
  "15 mixed          f32  NHD 1 1  once"
  "16 decode         f16  HND 3 1  once  --block-size 1 --head-dim 4"
  "17 prefill        f32  NHD 2 2  once  --attn-type encoder"
  "18 decode         f32  NHD 3 4096 once --sinks"
  "19 mixed          bf16 TILED 3 2 once  --cache-dtype bf16 --block-size 16 --head-dim 64"
  "20 shared-prefix  f32  TILED 2 1 again --block-size 32 --head-dim 16 --num-q-heads 8 --num-kv-heads 2"
  "21 spec-decode    f32  TILED 4 3 once  cache:fp8_e4m3 --block-size 16 --head-dim 32"
  # multi-head latent attention: the expanded form, then the absorbed one (no value cache on any rank)
  "22 mixed          f32  NHD 3 1  once  --head-dim 48 --head-dim-v 32"
  "23 shared-prefix  bf16 HND 2 2  again --head-dim 48 --head-dim-v 32"
  "24 mixed          f32  HND 3 1  again --head-dim 72 --head-dim-v 64 --kv-latent --num-q-heads 8 --num-kv-heads 1"
  "25 spec-decode    bf16 NHD 4 2  once  cache:fp8_e4m3 --head-dim 72 --head-dim-v 64 --kv-latent --num-q-heads 4 --num-kv-heads 1"
)

# mpirun -np N uattn-run-cp STEP --out DIR --interleave I --threads T, under the timeout; output to LOG
run_cp() {
  local n=$1 step=$2 out=$3 inter=$4 threads=$5 log=$6
  timeout "$TIMEOUT" "${MPIRUN[@]}" -np "$n" "$CP" "$step" --out "$out" --interleave "$inter" --threads "$threads" \
    >>"$log" 2>&1
}

run_case() {
  local seed=$1 kind=$2 dtype=$3 layout=$4 n=$5 inter=$6 again=$7
  shift 7
  local fp8=""
  if [ "${1:-}" = "cache:fp8_e4m3" ] || [ "${1:-}" = "cache:fp8_e5m2" ]; then
    fp8=${1#cache:fp8_}
    shift
  fi
  local name="$seed-$kind-$dtype-$layout-np$n-i$inter${fp8:+-fp8_$fp8}"
  local dir="$WORK/$name" log="$WORK/$name.log"
  local what="seed $seed $kind $dtype $layout${fp8:+ fp8_$fp8}${*:+ $*} on $n ranks, interleave $inter"
  cases=$((cases + 1))
  local made=$layout
  [ "$layout" = "TILED" ] && made=NHD # make-step knows the engines' layouts; cp_parity.py tiled rearranges
  if ! "$PY" "$MAKE_STEP" make-step --out "$dir" --seed "$seed" --kind "$kind" --dtype "$dtype" --layout "$made" \
      "$@" >"$log" 2>&1 ||
     { [ -n "$fp8" ] && ! "$PY" "$HELPER" fp8 --step "$dir/step.json" --format "$fp8" --seed "$seed" >>"$log" 2>&1; } ||
     { [ "$layout" = "TILED" ] && ! "$PY" "$HELPER" tiled --step "$dir/step.json" >>"$log" 2>&1; }; then
    echo "FAIL make-step: $what"
    sed 's/^/    /' "$log"
    failures=$((failures + 1))
    return
  fi
  if ! "$RUNNER" "$dir/step.json" --out "$dir/ref" >>"$log" 2>&1; then
    echo "FAIL uattn-run: $what (kept $dir)"
    tail -n 5 "$log" | sed 's/^/    /'
    failures=$((failures + 1))
    return
  fi
  if ! run_cp "$n" "$dir/step.json" "$dir/cp" "$inter" 1 "$log"; then
    echo "FAIL uattn-run-cp: $what (kept $dir)"
    tail -n 5 "$log" | sed 's/^/    /'
    failures=$((failures + 1))
    return
  fi
  if ! "$PY" "$HELPER" compare --step "$dir/step.json" "$dir/ref" "$dir/cp" >>"$log" 2>&1; then
    echo "FAIL compare: $what (kept $dir)"
    grep -E '^(FAIL|ok)' "$log" | sed 's/^/    /'
    failures=$((failures + 1))
    return
  fi
  # requests over a common cached prefix: every rank must still see shared blocks (its planner finds the
  # prefix only if the requests' local block tables share blocks too)
  local blocks
  blocks="$(grep -o -m 1 'shared/unique blocks by rank:[^;]*' "$log")"
  if [[ "$kind" == *prefix* ]] && grep -qE ' 0/' <<<"$blocks"; then
    echo "FAIL shared prefix: $what: a rank's plan has no shared block ($blocks) (kept $dir)"
    failures=$((failures + 1))
    return
  fi
  local summary
  summary="$(grep -E '^ok caches' "$log" | sed 's/^ok caches bit for bit, plan.json equal; //')"
  if [ "$again" = "again" ]; then
    local same=1
    if ! run_cp "$n" "$dir/step.json" "$dir/cp2" "$inter" 2 "$log"; then
      same=0
    else
      for f in out.npy lse.npy key_cache.npy value_cache.npy plan.json; do
        [ -e "$dir/cp/$f" ] || [ -e "$dir/cp2/$f" ] || continue # a kv_latent step has no value cache
        cmp -s "$dir/cp/$f" "$dir/cp2/$f" || { echo "    $f differs between the two runs" >>"$log"; same=0; }
      done
    fi
    if [ "$same" -ne 1 ]; then
      echo "FAIL again: $what: a second run (2 threads a rank) gave other bits (kept $dir)"
      tail -n 5 "$log" | sed 's/^/    /'
      failures=$((failures + 1))
      return
    fi
    summary="$summary; again: same bits"
  fi
  echo "ok   $what: caches bit for bit; $summary; $blocks"
  rm -rf "$dir" "$log"
}

for c in "${CASES[@]}"; do
  # shellcheck disable=SC2086  # the case line is split on purpose
  run_case $c
done

# ---- bad input: every rank says the same one line, mpirun exits 2, nobody hangs ----------------------------

# bad NAME N EXPECTED_LINE_SUBSTRING ARGS...: runs uattn-run-cp on N ranks, tagging each line with its rank
bad() {
  local name=$1 n=$2 want=$3
  shift 3
  local log="$WORK/bad-$name.log" rc=0
  cases=$((cases + 1))
  timeout "$TIMEOUT" "${MPIRUN[@]}" --tag-output -np "$n" "$CP" "$@" >"$log" 2>&1 || rc=$?
  # the ranks' own lines, without Open MPI's tags ("[1,0]<stderr>:") and its closing notice
  local lines
  lines="$(grep -E '^\[1,[0-9]+\]<stderr>:uattn-run-cp: ' "$log" | sed -E 's/^\[1,[0-9]+\]<stderr>://')"
  local ranks distinct
  ranks="$(grep -cE '^\[1,[0-9]+\]<stderr>:uattn-run-cp: ' "$log")"
  distinct="$(printf '%s\n' "$lines" | sort -u | grep -c .)"
  if [ "$rc" -eq 124 ]; then
    echo "FAIL bad input $name: mpirun still running after ${TIMEOUT} s (a rank hangs)"
    failures=$((failures + 1))
  elif [ "$rc" -ne 2 ] || [ "$ranks" -ne "$n" ] || [ "$distinct" -ne 1 ] || ! grep -qF -- "$want" <<<"$lines"; then
    echo "FAIL bad input $name: exit $rc (want 2), $ranks rank lines (want $n), $distinct distinct (want 1), want '$want'"
    sed 's/^/    /' "$log"
    failures=$((failures + 1))
  else
    echo "ok   bad input $name on $n ranks: exit 2, every rank: $(head -n 1 <<<"$lines")"
    rm -f "$log"
  fi
}

bad_dir="$WORK/bad"
if "$PY" "$MAKE_STEP" make-step --out "$bad_dir" --seed 5 --kind mixed >"$WORK/bad-make.log" 2>&1; then
  step="$bad_dir/step.json"
  bad missing-step 3 "nope.json" "$bad_dir/nope.json" --out "$WORK/o"
  bad interleave-0 2 "--interleave: '0' is not a count" "$step" --out "$WORK/o" --interleave 0
  bad interleave-word 4 "--interleave: 'two' is not a count" "$step" --out "$WORK/o" --interleave two
  bad no-out 2 "missing --out DIR" "$step"
  # a step the JSON reader refuses, and one only the planner refuses (a block at two positions): the line
  # must be uattn-run's, word for word
  "$PY" - "$step" "$bad_dir/no-heads.json" "$bad_dir/two-positions.json" <<'EOF'
import json, sys
step = json.load(open(sys.argv[1]))
del step["num_q_heads"]
json.dump(step, open(sys.argv[2], "w"))
step = json.load(open(sys.argv[1]))
rows = [r["block_table"] for r in step["requests"]]
rows[1][0] = rows[0][0] if rows[1][0] != rows[0][0] else rows[0][1]
json.dump(step, open(sys.argv[3], "w"))
EOF
  for s in no-heads two-positions; do
    want="$("$RUNNER" "$bad_dir/$s.json" --out "$WORK/o" 2>&1 | sed -n 's/^uattn-run: //p' | tail -n 1)"
    if [ -z "$want" ]; then
      echo "FAIL bad input $s: uattn-run did not refuse it"
      failures=$((failures + 1))
    else
      bad "$s" 3 "$want" "$bad_dir/$s.json" --out "$WORK/o"
    fi
  done
  # an error only rank 0 meets (it alone writes): the others must not wait for it in a collective
  touch "$WORK/a-file"
  bad out-under-a-file 4 "cannot create" "$step" --out "$WORK/a-file/out"
else
  echo "FAIL make-step for the bad input cases"
  sed 's/^/    /' "$WORK/bad-make.log"
  failures=$((failures + 1))
fi

parity_end "cp parity" "$cases cases" "$cases cases"
