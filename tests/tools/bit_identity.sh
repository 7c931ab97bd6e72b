#!/usr/bin/env bash
# Bit identity of uattn-run across a change that must not change behaviour (a refactoring, a new layout).
#
#   tests/tools/bit_identity.sh record RUNNER DIR     makes the steps below in DIR, runs RUNNER on each and keeps
#                                               its outputs as the reference (DIR/<case>/ref)
#   tests/tools/bit_identity.sh check  RUNNER DIR     runs RUNNER again on DIR's recorded steps and compares every
#                                               file it writes (out.npy, lse.npy, key_cache.npy,
#                                               value_cache.npy, plan.json, the seed-format tensors) byte
#                                               for byte with the reference; exits 1 on any difference
#
# The usual use: record with the build of the commit before the change, check with the build after it.
# The steps are random (tests/ref/seed_unified_attn.py make-step, fixed seeds) and cover every batch kind,
# dtype, layout and feature, the generic kernels (odd shapes) and the generated buckets of the default build
# (bf16 block 128 head dim 128 through avx512bf16 where the CPU has it, f16 and f32 at 16 and 128), one
# thread and two. Run it on one machine: bits belong to a kernel set, and the set depends on the CPU.
# PYTHON overrides the interpreter (default /usr/bin/python3: Debian's, with numpy).
set -u

usage() {
  echo "usage: $0 record|check RUNNER DIR" >&2
  exit 2
}
[ $# -eq 3 ] || usage
MODE="$1" RUNNER="$2" DIR="$3"
case "$MODE" in record | check) ;; *) usage ;; esac
[ -x "$RUNNER" ] || { echo "bit_identity: $RUNNER is not an executable uattn-run" >&2; exit 2; }
HERE="$(cd "$(dirname "$0")/.." && pwd)"
SCRIPT="$HERE/ref/seed_unified_attn.py"
PY="${PYTHON:-/usr/bin/python3}"

# name seed kind dtype layout [make-step options...]
CASES=(
  "decode-f32       1  decode         f32  NHD"
  "prefill-f32      2  prefill        f32  HND  --causal-width 5"
  "prefix-f32       3  prefix-prefill f32  NHD  --chunk-size 1"
  "chunked-odd      4  chunked        f32  HND  --chunk-size 2 --block-size 5 --head-dim 24"
  "mixed-f32        5  mixed          f32  NHD  --chunk-size 3 --causal-width 7"
  "spec-f32         6  spec-decode    f32  HND  --chunk-size 1"
  "shared-f32       7  shared-prefix  f32  NHD  --chunk-size 4 --num-q-heads 12 --num-kv-heads 2 --qk-scale 3"
  "mixed-long       8  mixed          f32  HND  --long --causal-width 0 --chunk-size 0 --threads 2"
  "mixed-bf16       9  mixed          bf16 NHD"
  "spec-bf16        10 spec-decode    bf16 HND  --chunk-size 2"
  "shared-f16       11 shared-prefix  f16  HND  --chunk-size 1"
  "chunked-f16      12 chunked        f16  NHD"
  "mixed-cache-bf16 13 mixed          f32  NHD  --cache-dtype bf16 --chunk-size 2"
  "mixed-cache-f16  14 mixed          bf16 HND  --cache-dtype f16"
  "softcap          15 mixed          f32  NHD  --soft-cap 5 --qk-scale 2"
  "alibi-sinks      16 mixed          f16  HND  --alibi --sinks"
  "window           17 chunked        bf16 NHD  --sliding-window 9"
  "all-features     18 mixed          f32  HND  --sinks --alibi --soft-cap 20 --sliding-window 13"
  "encoder          19 prefill        f32  NHD  --attn-type encoder"
  "tiny             20 decode         f16  HND  --block-size 1 --head-dim 4"
  "bucket-bf16-b128 21 mixed          bf16 NHD  --block-size 128 --head-dim 128 --num-q-heads 8 --num-kv-heads 2 --long --threads 2"
  "bucket-bf16-b16  22 spec-decode    bf16 HND  --block-size 16 --head-dim 128 --num-q-heads 8 --num-kv-heads 2 --long"
  "bucket-bf16-dec  23 decode         bf16 NHD  --block-size 128 --head-dim 128 --num-q-heads 8 --num-kv-heads 2 --long --threads 2"
  "bucket-f16-b16   24 shared-prefix  f16  NHD  --block-size 16 --head-dim 64 --num-q-heads 4 --num-kv-heads 1 --long"
  "bucket-f32-b128  25 chunked        f32  HND  --block-size 128 --head-dim 128 --num-q-heads 4 --num-kv-heads 4 --long --threads 2"
  "bucket-chunk16   26 shared-prefix  bf16 NHD  --block-size 128 --head-dim 128 --num-q-heads 4 --num-kv-heads 1 --chunk-size 16 --long"
  "tiled-f32        27 mixed          f32  TILED --chunk-size 2 --head-dim 34"
  "tiled-bf16-b128  28 mixed          bf16 TILED --block-size 128 --head-dim 128 --num-q-heads 8 --num-kv-heads 2 --long --threads 2"
)

failures=0
for c in "${CASES[@]}"; do
  # shellcheck disable=SC2086  # the case line is split on purpose
  set -- $c
  name=$1 seed=$2 kind=$3 dtype=$4 layout=$5
  shift 5
  dir="$DIR/$name"
  if [ "$MODE" = record ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    if ! "$PY" "$SCRIPT" make-step --out "$dir/step" --seed "$seed" --kind "$kind" --dtype "$dtype" \
        --layout "$layout" "$@" >"$dir/make.log" 2>&1; then
      echo "FAIL make-step $name"; sed 's/^/    /' "$dir/make.log"; failures=$((failures + 1)); continue
    fi
    out="$dir/ref"
  else
    [ -d "$dir/ref" ] || { echo "FAIL $name: no reference in $dir (record first)"; failures=$((failures + 1)); continue; }
    out="$dir/new"
    rm -rf "$out"
  fi
  if ! "$RUNNER" "$dir/step/step.json" --out "$out" --dump-biases >"$dir/run.log" 2>&1; then
    echo "FAIL uattn-run $name"; tail -n 3 "$dir/run.log" | sed 's/^/    /'; failures=$((failures + 1)); continue
  fi
  if [ "$MODE" = record ]; then
    echo "recorded $name ($(ls "$out" | wc -l) files)"
    continue
  fi
  if diff -r -q "$dir/ref" "$out" >"$dir/diff.log" 2>&1; then
    echo "same     $name ($(ls "$out" | wc -l) files)"
  else
    echo "DIFFERS  $name"; sed 's/^/    /' "$dir/diff.log"; failures=$((failures + 1))
  fi
done
if [ "$failures" -ne 0 ]; then
  echo "bit identity: $failures case(s) failed"
  exit 1
fi
echo "bit identity: all ${#CASES[@]} cases ${MODE}ed"
