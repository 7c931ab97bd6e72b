#!/usr/bin/env bash
# Step parity: uattn-run against the dense oracle and the seed's unified_attn, on random steps.
#
#   tests/tools/run_step_parity.sh BUILD_DIR        (BUILD_DIR/perf/uattn-run must exist)
#
# For each case below: tests/ref/seed_unified_attn.py make-step writes a random valid step, uattn-run runs it
# with --dump-biases, and seed_unified_attn.py check compares the caches, the output and lse and the seed-format
# tensors (see the script's docstring). Also runs the script's selftest and its `defects` demonstration with
# the runner. Exits 1 on any failure and keeps the failing case's directory; about 15-30 s.
# PYTHON overrides the interpreter (default /usr/bin/python3: Debian's, with numpy).
set -u

if [ $# -ne 1 ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
RUNNER="$1/perf/uattn-run"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
SCRIPT="$HERE/ref/seed_unified_attn.py"
PY="${PYTHON:-/usr/bin/python3}"
if [ ! -x "$RUNNER" ]; then
  echo "run_step_parity: $RUNNER not found (build the uattn-run target)" >&2
  exit 2
fi

# shellcheck source=tests/tools/parity_common.sh
. "$HERE/tools/parity_common.sh"
parity_begin parity

# seed kind dtype layout [extra make-step options...]
CASES=(
  "1  decode         f32  NHD"
  "2  prefill        f32  HND  --causal-width 5"
  "3  prefix-prefill f32  NHD  --chunk-size 1"
  "4  chunked        f32  HND  --chunk-size 2 --block-size 5 --head-dim 24"
  "5  mixed          f32  NHD  --chunk-size 3 --causal-width 7"
  "6  spec-decode    f32  HND  --chunk-size 1"
  "7  shared-prefix  f32  NHD  --chunk-size 4 --num-q-heads 12 --num-kv-heads 2 --qk-scale 3"
  "8  mixed          f32  HND  --long --causal-width 0 --chunk-size 0"
  "9  mixed          bf16 NHD"
  "10 spec-decode    bf16 HND  --chunk-size 2"
  "11 shared-prefix  f16  HND  --chunk-size 1"
  "12 chunked        f16  NHD"
  "13 mixed          f32  NHD  --cache-dtype bf16 --chunk-size 2"
  "14 mixed          bf16 HND  --cache-dtype f16"
  "15 mixed          f32  NHD  --soft-cap 5 --qk-scale 2"
  "16 mixed          f16  HND  --alibi --sinks"
  "17 chunked        bf16 NHD  --sliding-window 9"
  "18 mixed          f32  HND  --sinks --alibi --soft-cap 20 --sliding-window 13"
  "19 prefill        f32  NHD  --attn-type encoder"
  "20 decode         f16  HND  --block-size 1 --head-dim 4"
  "21 mixed          f32  TILED --chunk-size 2 --head-dim 34"
  "22 shared-prefix  bf16 TILED --chunk-size 1 --num-q-heads 8 --num-kv-heads 2"
  "23 spec-decode    bf16 TILED --head-dim 128 --block-size 32 --num-q-heads 8 --num-kv-heads 2"
  "24 chunked        f16  TILED --cache-dtype bf16 --alibi --sliding-window 11"
  # multi-head latent attention: the expanded form (values narrower than keys), then the absorbed one
  "25 mixed          f32  NHD  --head-dim 48 --head-dim-v 32"
  "26 spec-decode    bf16 HND  --head-dim 48 --head-dim-v 32 --chunk-size 1"
  "27 mixed          f32  TILED --head-dim 48 --head-dim-v 32 --block-size 16"
  "28 mixed          f32  NHD  --head-dim 72 --head-dim-v 64 --kv-latent --num-q-heads 8 --num-kv-heads 1"
  "29 shared-prefix  bf16 HND  --head-dim 72 --head-dim-v 64 --kv-latent --num-q-heads 4 --num-kv-heads 1"
  "30 chunked        f16  NHD  --cache-dtype bf16 --head-dim 72 --head-dim-v 64 --kv-latent --num-q-heads 16 --num-kv-heads 1 --chunk-size 2"
)

run_case() {
  local seed=$1 kind=$2 dtype=$3 layout=$4
  shift 4
  local dir="$WORK/$seed-$kind-$dtype-$layout"
  local log="$dir.log"
  cases=$((cases + 1))
  if ! "$PY" "$SCRIPT" make-step --out "$dir" --seed "$seed" --kind "$kind" --dtype "$dtype" --layout "$layout" \
      "$@" >"$log" 2>&1; then
    echo "FAIL make-step: seed $seed $kind $dtype $layout $*"
    sed 's/^/    /' "$log"
    failures=$((failures + 1))
    return
  fi
  if ! "$RUNNER" "$dir/step.json" --out "$dir/out" --dump-biases >>"$log" 2>&1; then
    echo "FAIL uattn-run: seed $seed $kind $dtype $layout $*"
    tail -n 5 "$log" | sed 's/^/    /'
    failures=$((failures + 1))
    return
  fi
  if "$PY" "$SCRIPT" check --step "$dir/step.json" --out "$dir/out" >>"$log" 2>&1; then
    echo "ok   seed $seed $kind $dtype $layout $* ($(grep -c '^PASS' "$log") checks passed, $(grep -c '^SKIP' "$log") skipped)"
    rm -rf "$dir" "$log"
  else
    echo "FAIL check: seed $seed $kind $dtype $layout $* (kept $dir)"
    grep -E '^(FAIL|PASS|SKIP)' "$log" | sed 's/^/    /'
    failures=$((failures + 1))
  fi
}

if ! "$PY" "$SCRIPT" selftest >"$WORK/selftest.log" 2>&1; then
  echo "FAIL selftest of seed_unified_attn.py"
  sed 's/^/    /' "$WORK/selftest.log"
  failures=$((failures + 1))
else
  echo "ok   selftest of seed_unified_attn.py"
fi
if ! "$PY" "$SCRIPT" defects --runner "$RUNNER" >"$WORK/defects.log" 2>&1; then
  echo "FAIL defects (the seed's literal metadata vs the oracle, with uattn-run)"
  sed 's/^/    /' "$WORK/defects.log"
  failures=$((failures + 1))
else
  echo "ok   defects: $(grep -c 'counted twice' "$WORK/defects.log") rows wrong under the seed's literal metadata, uattn-run matches the oracle"
fi

for c in "${CASES[@]}"; do
  # shellcheck disable=SC2086  # the case line is split on purpose
  run_case $c
done

parity_end "step parity" "$cases cases + selftest + defects" "$cases cases, selftest and defects"
