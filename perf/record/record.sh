#!/usr/bin/env bash
# perf/record/record.sh: runs a uattn-bench scenario under `perf record -g` and prints where the time went, with
# every kernel named by its bucket (see usage below, and perf/record/record_report.py for how samples are grouped).
#
# Call graphs come from frame pointers, in a build of its own (build-perf: Release, -O3 as usual, plus
# -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer -g). Why frame pointers and not DWARF unwinding:
#  * perf --call-graph dwarf copies 8 KiB of stack per sample and unwinds it afterwards: perf.data grows about
#    100x and `perf script` takes minutes on this 2-core VM, for stacks that are only as deep as
#    uattn_forward -> runtime -> job -> kernel;
#  * uattn's kernels are leaf functions full of AVX2 intrinsics; with the frame pointer kept in leaves too
#    every sample in a kernel names its caller, and the cost is one register out of 16 (within noise on the
#    kernel benchmark);
#  * -g does not change the code; it lets record_report.py expand frames into their inlined functions
#    (addr2line), which is how the forward's causal/shared/unique parts are seen at all: the compiler inlines
#    them into one job function.
# What frame pointers miss: a caller of a libc function that itself keeps no frame pointer (memcpy, munmap)
# is skipped. --dwarf records with DWARF unwinding instead when that matters.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PERF_CFLAGS="-fno-omit-frame-pointer -mno-omit-leaf-frame-pointer -g"
PYTHON=${PYTHON:-/usr/bin/python3}
[[ -x $PYTHON ]] || PYTHON=python3

usage() {
  cat <<'EOF'
usage: perf/record/record.sh [options] SCENARIO [-- UATTN-BENCH-ARGS...]
       perf/record/record.sh [options] --exec PROGRAM [ARGS...]
       perf/record/record.sh --list | --check | --help

Builds uattn-bench with frame pointers (build-perf/), runs `uattn-bench --scenario SCENARIO` (or, with a
uattn-bench that has no --scenario, `--case SCENARIO`) under `perf record -g`, and prints:
  * self time by group: each generated kernel bucket (uattn_<dtype>_<part>_b<block>_d<headdim>_c<chunk>__<isa>),
    the generic kernel sets (avx2_*, portable_*), the forward's orchestration, the thread pool's spin and wait,
    the planner, the benchmark harness, libc, the Linux kernel (by whose calls), JIT code;
  * self time inside uattn_forward by part of the attention (causal, shared, unique, merges, ...);
  * self time by kernel bucket, split by part;
  * the top N symbols, and what the hottest kernels spend their time on (inlined functions).
Arguments after `--` go to uattn-bench unchanged (e.g. -- --threads 1 --runs 3 --preset NAME).

options:
  --top N            rows in the per-symbol table (default 25)
  --folded FILE      also write folded stacks (one line per stack: `frame;frame;frame count`, root first,
                     inlined frames marked _[i], Linux kernel _[k], JIT _[j]) for flamegraph.pl, inferno or
                     speedscope
  --svg FILE         also draw FILE from them, with flamegraph.pl or inferno-flamegraph if one is on PATH
                     (Debian 12's archive has neither)
  --freq HZ          sampling frequency (default: perf's, 4000)
  --dwarf            unwind with DWARF instead of frame pointers (much larger perf.data, slower)
  --out DIR          where perf.data, the perf script text and report.txt are kept
                     (default build-perf/record/SCENARIO)
  --build-dir DIR    the frame-pointer build (default build-perf in the source tree)
  --no-build         use the build as it is
  --bench FILE       profile this uattn-bench instead of building one (its own flags decide the call graphs)
  --exec PROG ARGS   profile any program (uattn-demo, uattn-run STEP.json ...); everything after it is the
                     command
  --list             the scenarios (uattn-bench --list)
  --check            exit 0 if perf can record here, 3 (with the reason) if it cannot
  -h, --help         this text

Exit status: 0; 1 the build or the run failed; 2 bad usage or no such scenario; 3 perf is missing or not
permitted here (the message says what fixes it).
JIT code: the profiled program runs with UATTN_PERF_MAP=1 (unless the environment sets it), so uattn lists
every libxsmm kernel it JITs in /tmp/perf-<pid>.map, and the report names it (libxsmm_smm_m<M>_n<N>_k<K>_beta<B>,
in the libxsmm body of its bucket). The maps stay in /tmp for `perf report`. Code no map names shows as bare
[JIT] addresses; the report warns when they take more than 1% of the samples.
EOF
}

die() { # die STATUS MESSAGE...
  local status=$1
  shift
  printf 'record.sh: %s\n' "$@" >&2
  exit "$status"
}

top=25 folded='' svg='' freq='' dwarf=0 out='' build='' no_build=0 bench='' list=0 check=0 scenario=''
exec_cmd=() bench_args=()
while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --top) [[ ${2:-} =~ ^[0-9]+$ ]] || die 2 "--top needs a number"; top=$2; shift ;;
    --folded) [[ -n ${2:-} ]] || die 2 "--folded needs a file"; folded=$2; shift ;;
    --svg) [[ -n ${2:-} ]] || die 2 "--svg needs a file"; svg=$2; shift ;;
    --freq) [[ ${2:-} =~ ^[0-9]+$ ]] || die 2 "--freq needs a number (Hz)"; freq=$2; shift ;;
    --dwarf) dwarf=1 ;;
    --out) [[ -n ${2:-} ]] || die 2 "--out needs a directory"; out=$2; shift ;;
    --build-dir) [[ -n ${2:-} ]] || die 2 "--build-dir needs a directory"; build=$2; shift ;;
    --no-build) no_build=1 ;;
    --bench) [[ -n ${2:-} ]] || die 2 "--bench needs a file"; bench=$2; shift ;;
    --list) list=1 ;;
    --check) check=1 ;;
    --exec)
      shift
      (($#)) || die 2 "--exec needs a program"
      exec_cmd=("$@")
      break ;;
    --) shift; bench_args=("$@"); break ;;
    -*) die 2 "unknown option '$1' (see --help)" ;;
    *)
      [[ -z $scenario ]] || die 2 "one scenario at a time ('$scenario', then '$1'); uattn-bench's own options go after --"
      scenario=$1 ;;
  esac
  shift
done
build=${build:-$ROOT/build-perf}

# ---- perf itself ---------------------------------------------------------------------------------------

ensure_perf() {
  if ! command -v perf >/dev/null 2>&1; then
    echo "record.sh: perf is not installed; installing Debian's linux-perf with apt-get" >&2
    local sudo=()
    if ((EUID != 0)); then
      command -v sudo >/dev/null 2>&1 || die 3 "perf is missing and this is not root: run 'apt-get install linux-perf' as root"
      sudo=(sudo)
    fi
    command -v apt-get >/dev/null 2>&1 || die 3 "perf is missing and there is no apt-get: install your distribution's perf package"
    "${sudo[@]}" apt-get install -y linux-perf >&2 ||
      { "${sudo[@]}" apt-get update >&2 && "${sudo[@]}" apt-get install -y linux-perf >&2; } ||
      die 3 "could not install linux-perf with apt-get"
  fi
  # Debian's /usr/bin/perf is a wrapper that fails when no perf matches the running kernel
  local version
  version=$(perf --version 2>&1) || die 3 "perf does not run here: ${version%%$'\n'*}" \
    "install the linux-perf package that matches the kernel ($(uname -r))"
  local probe
  probe=$(mktemp -d)
  if ! perf record -q -g -o "$probe/probe.data" -- true >"$probe/err" 2>&1; then
    local why paranoid
    why=$(grep -m1 -iE 'permission|not permitted|paranoid|denied|perf_event_open|No such|not supported' "$probe/err" ||
      head -n1 "$probe/err")
    paranoid=$(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null || echo unknown)
    rm -rf "$probe"
    die 3 "perf cannot record here: ${why:-perf record failed}" \
      "kernel.perf_event_paranoid is $paranoid; let users profile their own processes with:" \
      "    sudo sysctl -w kernel.perf_event_paranoid=1" \
      "(or run as root, or give perf CAP_PERFMON). In a container the host must allow it too, and the" \
      "container the perf_event_open system call (e.g. docker run --cap-add PERFMON, or a seccomp profile" \
      "that permits it)."
  fi
  rm -rf "$probe"
}

ensure_perf
((check)) && { echo "record.sh: perf can record here ($(perf --version))"; exit 0; }

# ---- the build -----------------------------------------------------------------------------------------

if [[ -z $bench ]]; then
  if ((no_build == 0)); then
    mkdir -p "$build"
    log=$build/record-build.log
    echo "record.sh: building uattn with frame pointers in $build ..." >&2
    # configured every time: cheap, and it puts the flags back if someone reconfigured the directory
    # the Python package is not profiled from here (and needs python3-dev): left out of this build
    if ! { cmake -S "$ROOT" -B "$build" -DCMAKE_BUILD_TYPE=Release -DUATTN_BUILD_TESTS=OFF \
      -DUATTN_BUILD_PERF=ON -DUATTN_BUILD_PYTHON=OFF -DCMAKE_C_FLAGS="$PERF_CFLAGS" &&
      if ((${#exec_cmd[@]})); then cmake --build "$build" -j "$(nproc)"; else
        cmake --build "$build" --target uattn-bench -j "$(nproc)"; fi; } >"$log" 2>&1; then
      tail -n 25 "$log" >&2
      die 1 "the build failed (full log: $log). Missing packages: run 'make deps'. A half-done edit in the" \
        "tree: wait and retry."
    fi
  fi
  bench=$build/perf/uattn-bench
fi
if ((${#exec_cmd[@]} == 0)); then
  [[ -x $bench ]] || die 1 "no uattn-bench at $bench (build it, or drop --no-build)"
  bench=$(realpath "$bench")
  bench_help=$("$bench" --help 2>&1 || true)
fi

has_opt() { grep -q -- "$1" <<<"$bench_help"; }

# The scenario names: uattn-bench --list where it has one; the case names of an older uattn-bench otherwise.
scenario_list() {
  if has_opt --list; then
    "$bench" --list
  else
    sed -n 's/^ *{"\([^"]*\)", "\(memory\|compute\)".*/\1/p' "$ROOT/perf/bench/bench.c"
  fi
}

if ((list)); then
  ((${#exec_cmd[@]} == 0)) || die 2 "--list lists uattn-bench's scenarios; it does not go with --exec"
  has_opt --list || echo "record.sh: this uattn-bench has no --list; its cases (any part of a name selects):" >&2
  scenario_list
  exit 0
fi

# ---- the command ---------------------------------------------------------------------------------------

own=()
if ((${#exec_cmd[@]})); then
  [[ -z $scenario && ${#bench_args[@]} -eq 0 ]] || die 2 "--exec takes the whole command; no scenario with it"
  prog=$(command -v "${exec_cmd[0]}" 2>/dev/null) || die 2 "no program '${exec_cmd[0]}'"
  prog=$(realpath "$prog")
  cmd=("$prog" "${exec_cmd[@]:1}")
  # frames of programs built from this tree are expanded and grouped by source file
  [[ $prog == "$ROOT"/* || $prog == "$(realpath -m "$build")"/* ]] && own+=("$prog")
  name=$(basename "$prog")
  what="${exec_cmd[*]}"
else
  [[ -n $scenario ]] || { usage >&2; die 2 "which scenario? (record.sh --list names them)"; }
  names=$(scenario_list)
  if has_opt --scenario; then
    # --scenario takes a part of a case's name: look for it in the list's scenario section (the list
    # carries descriptions too, so this can let a bad name through; uattn-bench then refuses it itself)
    awk '/^presets/ { exit } { print }' <<<"$names" | grep -qF -- "$scenario" ||
      die 2 "no scenario '$scenario'; uattn-bench --list has:" "$names"
    cmd=("$bench" --scenario "$scenario" "${bench_args[@]}")
  else
    grep -qF -- "$scenario" <<<"$names" ||
      die 2 "no scenario '$scenario'; this uattn-bench's cases (any part of a name selects) are:" "$names"
    cmd=("$bench" --case "$scenario" "${bench_args[@]}")
  fi
  own+=("$bench")
  name=$scenario
  what="${cmd[*]#"$ROOT"/}"
fi
# a shared libuattn next to the program is uattn's too
bdir=$(dirname "$(dirname "${cmd[0]}")")
for so in "$bdir"/libuattn.so*; do [[ -f $so && ! -L $so ]] && own+=("$(realpath "$so")"); done
lib=
[[ -f $bdir/libuattn.a ]] && lib=$bdir/libuattn.a

out=${out:-$build/record/${name//[^A-Za-z0-9._-]/_}}
mkdir -p "$out"
data=$out/perf.data
record=(perf record -o "$data")
if ((dwarf)); then record+=(--call-graph dwarf); else record+=(-g); fi
[[ -n $freq ]] && record+=(-F "$freq")

# JIT code (libxsmm's GEMMs) has no symbols: uattn lists each kernel it JITs in /tmp/perf-<pid>.map, perf's
# map of JIT code, when UATTN_PERF_MAP=1, which perf script then reads. Without it those samples are bare
# [JIT] addresses (about half of a prefill's samples where its tiles run the libxsmm body). UATTN_PERF_MAP=0 in
# the environment turns it off.
export UATTN_PERF_MAP=${UATTN_PERF_MAP:-1}
start_mark=$out/.record-start
: >"$start_mark"

echo "record.sh: perf record: $what" >&2
status=0
"${record[@]}" -- "${cmd[@]}" >"$out/program.out" 2>"$out/program.err" || status=$?
if ((status != 0)); then
  grep -v '^\[ perf record' "$out/program.err" | tail -n 15 >&2 || true
  # uattn-bench's status 2: it refused its arguments (the message above says which)
  ((${#exec_cmd[@]} == 0 && status == 2)) && die 2 "uattn-bench refused: $what"
  die 1 "the profiled command failed (exit status $status): $what" "its output: $out/program.out, $out/program.err"
fi
grep -E 'lost|LOST' "$out/program.err" >&2 || true
cat "$out/program.out"
echo
# the perf maps the run wrote (one per process that JITted code): perf script reads them below
mapfile -t jit_maps < <(find /tmp -maxdepth 1 -name 'perf-*.map' -newer "$start_mark" 2>/dev/null | sort)
rm -f "$start_mark"

perf script -i "$data" -F comm,tid,time,period,ip,sym,dso >"$out/perf-script.txt" 2>"$out/perf-script.err" ||
  { tail -n 5 "$out/perf-script.err" >&2; die 1 "perf script failed on $data"; }

event=$(perf evlist -i "$data" 2>/dev/null | head -n1 || true)
report_args=(--top "$top" --srcroot "$ROOT" --builddir "$bdir" --exe "${cmd[0]}"
  --title "record.sh: $what  [event ${event:-?}, $( ((dwarf)) && echo DWARF || echo frame-pointer) call graphs]")
for o in "${own[@]}"; do report_args+=(--own "$o"); done
[[ -n $lib ]] && report_args+=(--lib "$lib")
[[ -n $svg && -z $folded ]] && folded=$out/stacks.folded
[[ -n $folded ]] && report_args+=(--folded "$folded")
"$PYTHON" "$ROOT/perf/record/record_report.py" "${report_args[@]}" "$out/perf-script.txt" | tee "$out/report.txt"

echo
echo "perf.data, the perf script text and this report: $out/ (perf report -i $data --no-children)"
for m in "${jit_maps[@]}"; do echo "JIT code named by: $m ($(wc -l <"$m") kernels)"; done
if [[ -n $folded ]]; then
  echo "folded stacks: $folded ($(wc -l <"$folded") stacks)"
fi
if [[ -n $svg ]]; then
  if command -v flamegraph.pl >/dev/null 2>&1; then
    flamegraph.pl --title "uattn: $name" "$folded" >"$svg"
  elif command -v inferno-flamegraph >/dev/null 2>&1; then
    inferno-flamegraph --title "uattn: $name" "$folded" >"$svg"
  else
    die 1 "--svg: neither flamegraph.pl nor inferno-flamegraph is on PATH (Debian 12's archive has neither);" \
      "the folded stacks are in $folded"
  fi
  echo "flame graph: $svg"
fi
