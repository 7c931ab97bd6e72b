#!/usr/bin/env bash
# ctest record_script: perf/record/record.sh and perf/record/record_report.py end to end.
#   tests/tools/test_record.sh SCRATCH_DIR [UATTN_BENCH]
# First the report on a made-up `perf script` text (bucket names, parts, the JIT warning, folded stacks),
# which needs no perf; then, where perf can record, a real scenario through record.sh (UATTN_BENCH: profile
# that binary instead of building build-perf, which takes minutes), its error paths, JIT code with and
# without a /tmp/perf-<pid>.map, and a libxsmm path (prefill 2048), which fails when more than 1% of its
# samples are JIT code no perf map names. Exit 77 (ctest SKIP) where perf is missing or not permitted.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
REC=$ROOT/perf/record/record.sh
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
# the perf maps record.sh says a run wrote (its report is $1), removed at the end
clean_maps_of() {
  local p
  while read -r p; do jit_pids+=("$p"); done < <(sed -n 's|^JIT code named by: /tmp/perf-\([0-9]*\)\.map .*|\1|p' "$1")
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
"$PY" "$ROOT/perf/record/record_report.py" "$tmp/script.txt" --own /x/uattn-bench --folded "$tmp/fake.folded" \
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
"$PY" "$ROOT/perf/record/record_report.py" "$tmp/script.txt" --own /x/uattn-bench --jit-threshold 25 >"$tmp/fake2.txt"
! grep -q WARNING "$tmp/fake2.txt" || fail "JIT warning below its threshold"
echo "ok: the report on a made-up perf script"

# libxsmm's JIT GEMMs named by uattn's perf map (kernels/avx2/xsmm.c): 4 samples of 1000 ns. 2 in a GEMM under the
# causal part, whose bucket's kernel tail-called the body (not on the stack), while a load kernel of that
# bucket ran in the same part; 1 in a GEMM with a generated shared kernel on its stack; 1 in that load kernel.
xs=$'\t            5000 uattn_xsmm_qk (/x/uattn-bench)\n\t            5100 uattn_xsmm_attend (/x/uattn-bench)'
part=$'\t            5200 uattn_causal_part (/x/uattn-bench)\n\t            4000 main (/x/uattn-bench)'
{
  for i in 1 2; do
    printf 'uattn-bench 100 11.%02d:       1000 \n\t    7f0000002000 libxsmm_smm_m128_n32_k32_beta0 (/tmp/perf-100.map)\n%s\n%s\n\n' \
      "$i" "$xs" "$part"
  done
  printf 'uattn-bench 100 11.03:       1000 \n\t    7f0000003000 libxsmm_smm_m128_n32_k128_beta1 (/tmp/perf-100.map)\n%s\n\t            5300 uattn_f16_shared_b16_d64_c0__avx2 (/x/uattn-bench)\n\t            5400 uattn_shared_part (/x/uattn-bench)\n\t            4000 main (/x/uattn-bench)\n\n' "$xs"
  printf 'uattn-bench 100 11.04:       1000 \n\t            1100 uattn_bf16_load_b128_d128_c0__avx2 (/x/uattn-bench)\n%s\n\n' "$part"
} >"$tmp/xsmm.txt"
"$PY" "$ROOT/perf/record/record_report.py" "$tmp/xsmm.txt" --own /x/uattn-bench >"$tmp/xsmm-report.txt" ||
  fail "record_report.py failed on the made-up libxsmm script"
r=$tmp/xsmm-report.txt
expect "$r" 'uattn kernels: generated bf16 b128 d128 c0 avx2, libxsmm body +50\.0% +2$' \
  "a JIT GEMM in the body of the bucket its part ran"
expect "$r" 'uattn kernels: generated f16 b16 d64 c0 avx2, libxsmm body +25\.0% +1$' \
  "a JIT GEMM in the body of the bucket on its stack"
expect "$r" '^  bf16 b128 d128 c0 avx2 +75\.0%' "the body counted in its bucket's row"
expect "$r" 'libxsmm_smm_m128_n32_k32_beta0 +uattn kernels: generated bf16' "the GEMM's own name in the symbol table"
! grep -qE '^WARNING: .*JIT|JIT code: unresolved' "$r" || fail "named JIT GEMMs reported as unresolved"
echo "ok: libxsmm's JIT GEMMs grouped with their bucket"

# ---- 2. usage, without perf ----------------------------------------------------------------------------
"$REC" --help >"$tmp/help.txt" || fail "--help failed"
expect "$tmp/help.txt" '^usage: perf/record/record.sh' "--help"
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
# the kernels that ran are named: generated buckets, or a generic kernel set's (UATTN_ISA forces those)
expect "$r" '^ +[0-9.]+% +[0-9]+ +(uattn_[a-z0-9]+_[a-z]+_b[0-9]+_d[0-9]+_c[0-9]+__[a-z0-9]+|(uattn_)?(avx2|avx512|avx512bf16|portable)_[a-z_]*(attend|decode|decode_tiled)) +uattn kernels' \
  "a uattn kernel in the symbol table"
expect "$r" '^  uattn kernels: ' "a uattn kernel group"
expect "$r" 'harness: uattn-bench' "the harness's own time in its own row"
clean_maps_of "$r"
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

# ---- 5. a libxsmm path: its JIT GEMMs named ------------------------------------------------------------
# prefill 2048's causal slices are jobs large enough for the libxsmm body (kernels/avx2/xsmm.c), whose GEMMs are
# JIT code: record.sh has the program list them in its perf map (UATTN_PERF_MAP=1). Unnamed, they were about
# half of this profile on Zen 4; more than 1% fails. UATTN_ISA=avx2: the level whose large jobs go to the
# body, also where the CPU has a better one (AVX512-BF16 runs prefills in kernels of its own). One thread (as
# the "all" runs too) keeps it short.
UATTN_ISA=avx2 "$REC" "${from[@]}" --out "$tmp/xsmm-run" "prefill 2048" -- --runs 1 --threads 1 \
  >"$tmp/xsmm-run.txt" 2>"$tmp/xsmm-run.err" || { cat "$tmp/xsmm-run.err" "$tmp/xsmm-run.txt"; fail "record.sh prefill 2048"; }
r=$tmp/xsmm-run.txt
clean_maps_of "$r"
unnamed=$(sed -n 's/^  JIT code: unresolved \[JIT\] addresses *\([0-9.]*\)%.*/\1/p' "$r")
if [[ -z $unnamed ]] && ! grep -q 'libxsmm body' "$r"; then
  echo "ok (nothing to check): no JIT code ran in prefill 2048 (a build without libxsmm)"
else
  awk -v u="${unnamed:-0}" 'BEGIN { exit !(u <= 1.0) }' ||
    { cat "$r"; fail "prefill 2048: ${unnamed}% of the samples are JIT code no perf map names (over 1%)"; }
  # in the body of the bucket that ran, or of the generic avx2 set (which UATTN_ISA forces on some builds)
  expect "$r" '^ +[0-9.]+% +[0-9]+ +libxsmm_[a-z]*mm_m[0-9]+_n[0-9]+_k[0-9]+_beta[01] +uattn kernels: (generated [a-z0-9]+ b[0-9]+ d[0-9]+ c[0-9]+ [a-z0-9]+, libxsmm body|libxsmm body \(generic\))$' \
    "a JIT GEMM named, in the libxsmm body of its bucket or set"
  echo "ok: record.sh prefill 2048: ${unnamed:-0}% of the samples in unnamed JIT code"
fi
echo "PASS"
