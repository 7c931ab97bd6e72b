#!/usr/bin/env bash
# ctest record_script: perf/record.sh and perf/record_report.py end to end.
#   tests/test_record.sh SCRATCH_DIR [UATTN_BENCH]
# First the report on a made-up `perf script` text (bucket names, parts, the JIT warning, folded stacks),
# which needs no perf; then, where perf can record, a real scenario through record.sh (UATTN_BENCH: profile
# that binary instead of building build-perf, which takes minutes), its error paths, and JIT code with and
# without a /tmp/perf-<pid>.map. Exit 77 (ctest SKIP) where perf is missing or not permitted.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REC=$ROOT/perf/record.sh
PY=${PYTHON:-/usr/bin/python3}
[[ -x $PY ]] || PY=python3
scratch=${1:-$(mktemp -d)}
bench=${2:-}
mkdir -p "$scratch"
tmp=$(mktemp -d "$scratch/record.XXXXXX")
jit_pids=()
cleanup() {
  rm -rf "$tmp"
  for p in "${jit_pids[@]}"; do rm -f "/tmp/perf-$p.map"; done
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
expect() { # expect FILE REGEX WHAT
  grep -qE -- "$2" "$1" || { cat "$1" >&2; fail "$3: no line matching '$2' in $1"; }
}

# ---- 1. the report on a made-up perf script text ---------------------------------------------------------
# 10 samples of 1000 ns: 4 in a generated unique kernel (under uattn_forward), 1 in its load kernel called
# from the same place, 1 in a causal kernel, 2 in unresolved JIT code, 1 in libc, 1 in the Linux kernel.
fwd=$'\t            2000 attention_job (/x/uattn-bench)\n\t            3000 uattn_forward (/x/uattn-bench)\n\t            4000 main (/x/uattn-bench)\n\t           27000 __libc_start_call_main (/usr/lib/x86_64-linux-gnu/libc.so.6)'
{
  for i in 1 2 3 4; do
    printf 'uattn-bench 100 10.%02d:       1000 \n\t            1%03d uattn_bf16_unique_b128_d128_c0__avx2 (/x/uattn-bench)\n%s\n\n' "$i" "$i" "$fwd"
  done
  printf 'uattn-bench 101 10.05:       1000 \n\t            1100 uattn_bf16_load_b128_d128_c0__avx2 (/x/uattn-bench)\n\t            1200 uattn_bf16_unique_b128_d128_c0__avx2 (/x/uattn-bench)\n%s\n\n' "$fwd"
  printf 'uattn-bench 101 10.06:       1000 \n\t            1300 uattn_f16_causal_b16_d64_c512__avx2.constprop.0 (/x/uattn-bench)\n%s\n\n' "$fwd"
  for i in 7 8; do
    printf 'uattn-bench 100 10.%02d:       1000 \n\t    7f00000010%02d [unknown] (/tmp/perf-100.map)\n\t            4000 main (/x/uattn-bench)\n\n' "$i" "$i"
  done
  printf 'uattn-bench 100 10.09:       1000 \n\t           9a000 __memcpy_avx_unaligned_erms (/usr/lib/x86_64-linux-gnu/libc.so.6)\n\t            4000 main (/x/uattn-bench)\n\n'
  printf 'uattn-bench 100 10.10:       1000 \n\tffffffff81000000 clear_page_erms ([kernel.kallsyms])\n\t            4000 main (/x/uattn-bench)\n\n'
} >"$tmp/script.txt"
"$PY" "$ROOT/perf/record_report.py" "$tmp/script.txt" --own /x/uattn-bench --folded "$tmp/fake.folded" \
  >"$tmp/fake.txt" || fail "record_report.py failed on the made-up script"
r=$tmp/fake.txt
expect "$r" '^10 samples' "sample count"
expect "$r" 'uattn kernels: generated bf16 b128 d128 c0 avx2 +50\.0% +5$' "bucket group (unique + load)"
expect "$r" 'uattn kernels: generated f16 b16 d64 c512 avx2 +10\.0%' "bucket group of a .constprop clone"
expect "$r" 'JIT code: unresolved \[JIT\] addresses +20\.0%' "unresolved JIT group"
expect "$r" '^WARNING: 20\.0% of the samples are in JIT code perf cannot name' "JIT warning"
expect "$r" '^  unique +50\.0% +83\.3%' "the load kernel counted in the part that called it"
expect "$r" '^  causal +10\.0%' "causal part"
expect "$r" '^  bf16 b128 d128 c0 avx2 +50\.0%' "bucket table row"
expect "$r" 'libc, libm, ld.so' "libc group"
expect "$r" 'Linux kernel, for harness: uattn-bench +10\.0%' "Linux kernel attributed to its caller"
expect "$tmp/fake.folded" '^uattn-bench;__libc_start_call_main;main;uattn_forward;attention_job;uattn_bf16_unique_b128_d128_c0__avx2 4$' \
  "folded stack"
expect "$tmp/fake.folded" ';main;clear_page_erms_\[k\] 1$' "kernel frames marked _[k]"
[[ $(awk '{n += $NF} END {print n}' "$tmp/fake.folded") == 10 ]] || fail "folded counts do not add up to 10"
# under the threshold: no warning
"$PY" "$ROOT/perf/record_report.py" "$tmp/script.txt" --own /x/uattn-bench --jit-threshold 25 >"$tmp/fake2.txt"
! grep -q WARNING "$tmp/fake2.txt" || fail "JIT warning below its threshold"
echo "ok: the report on a made-up perf script"

# ---- 2. usage, without perf ----------------------------------------------------------------------------
"$REC" --help >"$tmp/help.txt" || fail "--help failed"
expect "$tmp/help.txt" '^usage: perf/record.sh' "--help"
st=0
"$REC" --no-such-option 2>"$tmp/err.txt" || st=$?
[[ $st == 2 ]] || fail "an unknown option: exit status $st, not 2"

# ---- 3. with perf ------------------------------------------------------------------------------------
command -v perf >/dev/null 2>&1 || { echo "SKIP: perf is not installed"; exit 77; }
st=0
"$REC" --check >"$tmp/check.txt" 2>&1 || st=$?
if [[ $st == 3 ]]; then
  cat "$tmp/check.txt"
  echo "SKIP: perf cannot record here"
  exit 77
fi
[[ $st == 0 ]] || { cat "$tmp/check.txt"; fail "--check: exit status $st"; }

from=(--build-dir "$scratch/record-build")
if [[ -n $bench ]]; then from=(--bench "$bench"); fi
"$REC" "${from[@]}" --list >"$tmp/list.txt" 2>&1 || { cat "$tmp/list.txt"; fail "--list"; }

st=0
"$REC" "${from[@]}" --out "$tmp/none" no-such-scenario >"$tmp/missing.txt" 2>&1 || st=$?
[[ $st == 2 ]] || { cat "$tmp/missing.txt"; fail "a missing scenario: exit status $st, not 2"; }
expect "$tmp/missing.txt" "no scenario 'no-such-scenario'" "missing scenario message"

# one small scenario: 32 decodes over 4k keys, one run (uattn-bench measures the machine's limits first);
# an older uattn-bench (no --scenario) names it differently
scenario=32x4k
grep -q -- --scenario "$tmp/list.txt" || ! grep -q 'has no --list' "$tmp/list.txt" || scenario="decode 32 x 4k"
"$REC" "${from[@]}" --out "$tmp/run" --top 10 --folded "$tmp/run.folded" "$scenario" -- --runs 1 \
  >"$tmp/run.txt" 2>"$tmp/run.err" || { cat "$tmp/run.err" "$tmp/run.txt"; fail "record.sh $scenario"; }
r=$tmp/run.txt
expect "$r" '^Where the time goes' "group table"
expect "$r" '^By part of the attention' "part table"
expect "$r" '^Top 10 symbols' "symbol table"
# the kernels that ran are named: generated buckets, or a generic kernel set
expect "$r" '^ +[0-9.]+% +[0-9]+ +(uattn_[a-z0-9]+_[a-z]+_b[0-9]+_d[0-9]+_c[0-9]+__[a-z0-9]+|avx2_attend|portable_attend) +uattn kernels' \
  "a uattn kernel in the symbol table"
expect "$r" '^  uattn kernels: ' "a uattn kernel group"
expect "$r" 'harness: uattn-bench' "the harness's own time in its own row"
[[ -s $tmp/run/perf.data ]] || fail "no perf.data kept"
n=$(sed -n 's/^\([0-9]*\) samples over.*/\1/p' "$r")
[[ $(awk '{n += $NF} END {print n}' "$tmp/run.folded") == "$n" ]] || fail "folded counts != $n samples"
! grep -vqE '^[^ ]+ [0-9]+$' "$tmp/run.folded" || fail "a folded line is not 'frame;frame;... count'"
echo "ok: record.sh $scenario ($n samples)"

# ---- 4. JIT code: a loop in anonymous executable memory, with and without a perf map -------------------
if [[ $(uname -m) == x86_64 ]]; then
  cat >"$tmp/jit.py" <<'EOF'
import ctypes, mmap, os, sys
code = bytes.fromhex("4889f848ffc875fbc3")  # mov rax, rdi; 1: dec rax; jnz 1b; ret
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(code)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
with open(sys.argv[1], "w") as f:
    f.write("%d\n" % os.getpid())
if sys.argv[2] == "map":  # what a JIT that names its code writes; perf reads it when it makes the report
    with open("/tmp/perf-%d.map" % os.getpid(), "w") as f:
        f.write("%x %x uattn_f32_unique_b16_d64_c0__jit\n" % (addr, len(code)))
ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long)(addr)(300000000)
EOF
  for mode in bare map; do
    "$REC" --no-build --out "$tmp/jit-$mode" --exec "$PY" "$tmp/jit.py" "$tmp/pid-$mode" "$mode" \
      >"$tmp/jit-$mode.txt" 2>"$tmp/jit-$mode.err" || { cat "$tmp/jit-$mode.err"; fail "record.sh --exec ($mode)"; }
    jit_pids+=("$(cat "$tmp/pid-$mode")")
  done
  expect "$tmp/jit-bare.txt" '^WARNING: [0-9.]+% of the samples are in JIT code perf cannot name' "JIT warning"
  ! grep -q '^WARNING: .*JIT' "$tmp/jit-map.txt" || fail "JIT warning although a perf map names the code"
  expect "$tmp/jit-map.txt" 'uattn_f32_unique_b16_d64_c0__jit +uattn kernels: generated f32 b16 d64 c0 jit' \
    "a JIT kernel named in a perf map, in its bucket"
  echo "ok: JIT code with and without a perf map"
fi
echo "PASS"
