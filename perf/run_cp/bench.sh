#!/usr/bin/env bash
# uattn-run-cp's scaling figures: one decode step over 1 x 128k and 8 x 32k keys with Llama-3-8B's
# attention (32 q heads, 8 KV heads, head dim 128, bf16 everywhere, block 128, NHD cache) on N = 1 and 2 MPI
# ranks of one thread each (not bound: on a machine others share, the OS moves a rank off a busy core).
#
#   perf/run_cp/bench.sh BUILD_DIR [STEPS [ROUNDS]]
#
# Writes the two steps (random bf16 values; 0.5 and 1 GiB of cache) under $TMPDIR, then for ROUNDS rounds
# (default 3) runs each scenario on 1 and then 2 ranks with --repeat STEPS (default 20): a round's figure is
# the median of its STEPS timed steps (from a barrier to rank 0's merged result), the table gives the median
# over the rounds, so a noisy neighbour on the machine moves one round, not the figure; the CPU time of the
# slowest rank's plan + forward is what its work cost, without the waits for a core a busy machine adds
# ("by CPU": the speedup an idle machine would give if the ranks do not slow each other). Bytes: what each rank
# sends per step (its partial output in fp32, though the step is bf16, and its lse, gathered to rank 0:
# T x Hq x (4 D + 4) bytes, 16.5 KB a query row here) against the KV cache bytes the busiest rank holds for
# the step's requests (what its decode reads).
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 3 ]; then
  echo "usage: $0 BUILD_DIR [STEPS [ROUNDS]]" >&2
  exit 2
fi
CP="$1/perf/uattn-run-cp"
STEPS="${2:-20}"
ROUNDS="${3:-3}"
PY="${PYTHON:-/usr/bin/python3}"
[ -x "$CP" ] || { echo "bench: $CP not found (build the uattn-run-cp target)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 # Open MPI's opt-in for root (containers)
WORK="$(mktemp -d "${TMPDIR:-/tmp}/uattn-cp-bench.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# NAME REQUESTS KEYS: REQUESTS decodes of KEYS keys each (KEYS - 1 cached, 1 scheduled), blocks in order
"$PY" - "$WORK" <<'EOF'
import json, os, sys
import numpy as np

work = sys.argv[1]
hq, hkv, d, bs = 32, 8, 128, 128
rng = np.random.default_rng(1)

def bf16(shape):
    # random bf16 bits of moderate magnitude, 2^-7 .. 2: no infinity or NaN, scores stay far from overflow
    sign = rng.integers(0, 2, shape, dtype=np.uint16) << 15
    exp = rng.integers(120, 128, shape, dtype=np.uint16) << 7
    return sign | exp | rng.integers(0, 128, shape, dtype=np.uint16)

for name, reqs, keys in (("1x128k", 1, 131072), ("8x32k", 8, 32768)):
    out = os.path.join(work, name)
    os.makedirs(out)
    per = keys // bs
    step = {"block_size": bs, "num_blocks": reqs * per, "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d,
            "dtype": "bf16", "cache_dtype": "bf16", "kv_layout": "NHD", "scale": d ** -0.5, "soft_cap": 0.0,
            "sliding_window": 0, "attn_type": "decoder",
            "requests": [{"num_computed": keys - 1, "num_scheduled": 1, "num_prompt": 1000,
                          "block_table": list(range(r * per, (r + 1) * per))} for r in range(reqs)],
            "tensors": {"q": "q.npy", "k": "k.npy", "v": "v.npy", "key_cache": "kc.npy", "value_cache": "vc.npy"}}
    for f, shape in (("q", (reqs, hq, d)), ("k", (reqs, hkv, d)), ("v", (reqs, hkv, d)),
                     ("kc", (reqs * keys, hkv, d)), ("vc", (reqs * keys, hkv, d))):
        np.save(os.path.join(out, f + ".npy"), bf16(shape))
    json.dump(step, open(os.path.join(out, "step.json"), "w"))
EOF

for round in $(seq 1 "$ROUNDS"); do
  for name in 1x128k 8x32k; do
    for n in 1 2; do
      dir="$WORK/out-$name-$n-$round"
      mpirun -np "$n" --bind-to none "$CP" "$WORK/$name/step.json" --out "$dir" --threads 1 \
        --repeat "$STEPS" >"$dir.log" 2>&1 || { cat "$dir.log" >&2; exit 1; }
      rm -f "$dir"/*.npy # the figures are in timing.json; the caches are 0.5-1 GiB
    done
  done
done

"$PY" - "$WORK" "$ROUNDS" <<'EOF'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
print("decode, Llama-3-8B attention (32/8 heads, d 128, bf16, block 128), 1 thread a rank; median of %d rounds"
      % rounds)
print("step ms: barrier to rank 0's merged result; compute: the slowest rank's plan + forward, wall and CPU ms")
print("%-7s %5s %8s %8s %8s %8s %8s %12s %11s %8s" % ("step", "ranks", "step ms", "compute", "CPU ms", "speedup",
                                                    "by CPU", "sent B/rank", "KV B/rank", "sent/KV"))
for name in ("1x128k", "8x32k"):
    base = None
    for n in (1, 2):
        t = [json.load(open("%s/out-%s-%d-%d/timing.json" % (work, name, n, r))) for r in range(1, rounds + 1)]
        step = statistics.median(x["step_ms"] for x in t)
        compute = statistics.median(x["compute_ms"] for x in t)
        cpu = statistics.median(x["compute_cpu_ms"] for x in t)
        base = base or (step, cpu)
        sent, kv = t[0]["gathered_bytes_per_rank"], t[0]["kv_bytes_per_rank"]
        print("%-7s %5d %8.2f %8.2f %8.2f %7.2fx %7.2fx %12.0f %11.0f %8.1e" % (
            name, n, step, compute, cpu, base[0] / step, base[1] / cpu, sent, kv, sent / kv))
EOF
