#!/usr/bin/env bash
# ctest bench_presets: uattn-bench's presets run to the end, and the MLA presets count what MLA must cost.
#   tests/tools/test_bench_presets.sh UATTN_BENCH
# One short case per run on one thread: every preset's lone decode (the table, a fraction in each row), then the
# two DeepSeek-V3 forms' byte and flop counts (--count --json: planned, not run, since their forwards take
# minutes under the sanitizers without AMX) against figures worked out by hand, then the refusals that need no
# run. What the cases measure is not judged here: these are the counts the fractions rest on.
set -euo pipefail

bench=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
expect() { # expect FILE FIXED-STRING WHAT
  grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "$3: no '$2' in $1"; }
}
run() { "$bench" --runs 1 --threads 1 "$@"; }

# every preset that runs decode-short (all but the expanded MLA form, which runs prompt chunks only): a row each
run --preset all --scenario decode-short >"$tmp/all.txt"
rows=$(grep -cE '^  decode-short 1x4k +1 +(memory|compute) .*%' "$tmp/all.txt" || true)
[[ $rows == 6 ]] || { cat "$tmp/all.txt" >&2; fail "--preset all: $rows decode-short rows, not 6"; }

# absorbed: 64 decodes over one 4096-key prefix and 65 keys each read 4096 + 64 x 65 = 8256 latents of 576 bf16
# once; 64 x 4161 visible pairs, 2 x 128 heads x (576 + 512) flops each; q and out 128 x (576 + 512), k 576 in and
# 576 into the cache, per token, and no v
run --preset deepseek-v3 --scenario shared-prefix --count --json >"$tmp/absorbed.json"
expect "$tmp/absorbed.json" '"cache_bytes": 9510912, "io_bytes": 17973248, "flops": 74173120512}' \
  "deepseek-v3's shared prefix, read once"
# expanded: a 128-token chunk after 1024 keys reads 1024 keys x 128 KV heads x (192 + 128) bf16; 139328 visible
# pairs x 2 x 128 heads x (192 + 128) flops
run --preset deepseek-v3-prefill --scenario '+1 alone' --count --json >"$tmp/expanded.json"
expect "$tmp/expanded.json" '"cache_bytes": 83886080, "io_bytes": 31457280, "flops": 11413749760}' \
  "deepseek-v3-prefill's chunk"

# refused before the machine is measured: a case the preset does not run, and a latent cache tiled
for args in "--preset deepseek-v3 --scenario prefill" "--preset deepseek-v3 --layout tiled"; do
  status=0
  # shellcheck disable=SC2086 # the words of args are the options
  "$bench" $args >/dev/null 2>&1 || status=$?
  [[ $status == 2 ]] || fail "uattn-bench $args: exit $status, not 2"
done
echo "bench_presets: ok"
