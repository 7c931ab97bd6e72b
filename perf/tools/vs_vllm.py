#!/usr/bin/python3
"""uattn beside vLLM's CPU attention on the same cases, in one run: the ratio column of docs/performance.md.

    perf/tools/vs_vllm.py --vllm PATH [--bench build/perf/uattn-bench] [--runs 5] [--threads 2]
                          [--isa vec|vec16|amx] [--case NAME ...] [--json]

PATH is vLLM's kernel driven standalone (a `vllm_cpu_attn_bench` built from vLLM's own sources: see the
peers' README where this project's machines keep them). Each case is Llama-3-8B (32 query heads, 8 KV
heads, head dim 128), bf16, block 128, the requests of one uattn-bench scenario; vLLM gets the same
requests as "context:new tokens" (it has no prefix sharing, so a shared prefix is read per request). The two
programs alternate run by run, so both see the same machine; each figure is the median of --runs runs, at
one thread and at --threads threads. The ratio is vLLM's time over uattn's: above 1, uattn is faster.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# uattn-bench case name -> vLLM's requests, (context, new tokens) each, as uattn-bench's scenarios define them
CASES = {
    "prefill 2048": [(0, 2048)],
    "chunked-prefill 512/8k": [(8192, 512)],
    "shared-prefix 64x4k": [(4096 + 64, 1)] * 64,
    "spec-decode 32x2": [(2048, 2)] * 32,
    "spec-decode 16x4": [(2048, 4)] * 16,
    "spec-decode 8x16": [(2048, 16)] * 8,
    "decode-long 1x32k": [(32768, 1)],
    "decode-long 32x4k": [(4096, 1)] * 32,
}
HEADS_Q, HEADS_KV, HEAD_DIM, BLOCK = 32, 8, 128, 128


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"vs_vllm: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr.strip()}")
    return r.stdout


def uattn_ms(bench, case, threads):
    """(ms on 1 thread, ms on `threads`) of one uattn-bench run of the case."""
    out = json.loads(run([bench, "--scenario", case, "--runs", "1", "--threads", str(threads), "--json",
                          "--block-size", str(BLOCK)]))
    rows = [c for c in out["cases"] if c["preset"] == "llama3-8b" and c["name"] == case]
    if len(rows) != 1:
        sys.exit(f"vs_vllm: uattn-bench ran no single case named {case!r}")
    return rows[0]["ms_1"], rows[0]["ms_all"], out["kernel_set"]


def vllm_ms(vllm, reqs, threads, isa):
    spec = ",".join(f"{c}:{q}" for c, q in reqs)
    out = run([vllm, str(threads), "3", str(HEAD_DIM), str(HEADS_Q), str(HEADS_KV), str(BLOCK), spec, "--isa", isa])
    m = re.match(r"vllm_cpu_attn ([0-9.eE+-]+) ms", out)
    if not m:
        sys.exit(f"vs_vllm: {vllm} printed no 'vllm_cpu_attn <ms> ms' first line:\n{out[:200]}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm", required=True, help="vLLM's standalone CPU attention benchmark")
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "perf", "uattn-bench"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--isa", default="vec", help="vLLM's kernel: vec (AVX-512), vec16, amx (AMX build only)")
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="a case (default: all)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    a = ap.parse_args()
    if a.runs < 1 or a.threads < 1:
        ap.error("--runs and --threads must be at least 1")
    for path in (a.vllm, a.bench):
        if not os.access(path, os.X_OK):
            ap.error(f"{path} is not an executable")

    cases = a.case or list(CASES)
    times = {c: {"u1": [], "un": [], "v1": [], "vn": []} for c in cases}
    kernel_set = None
    for _ in range(a.runs):
        for c in cases:
            u1, un, kernel_set = uattn_ms(a.bench, c, a.threads)
            t = times[c]
            t["u1"].append(u1), t["un"].append(un)
            t["v1"].append(vllm_ms(a.vllm, CASES[c], 1, a.isa))
            t["vn"].append(vllm_ms(a.vllm, CASES[c], a.threads, a.isa))

    rows = []
    for c in cases:
        med = {k: statistics.median(v) for k, v in times[c].items()}
        rows.append({"case": c, "uattn_ms_1": med["u1"], "uattn_ms_all": med["un"], "vllm_ms_1": med["v1"],
                     "vllm_ms_all": med["vn"], "ratio_1": med["v1"] / med["u1"], "ratio_all": med["vn"] / med["un"]})
    if a.json:
        print(json.dumps({"threads": a.threads, "runs": a.runs, "uattn_kernel_set": kernel_set, "vllm_isa": a.isa,
                          "cases": rows}, indent=1))
        return
    print(f"uattn ({kernel_set}) and vLLM ({a.isa}), medians of {a.runs} alternated runs, 1 / {a.threads} threads;"
          " ratio = vLLM's time / uattn's\n")
    print("| case | uattn ms | vLLM ms | ratio |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['uattn_ms_1']:.2f} / {r['uattn_ms_all']:.2f} | {r['vllm_ms_1']:.2f} / "
              f"{r['vllm_ms_all']:.2f} | {r['ratio_1']:.2f}x / {r['ratio_all']:.2f}x |")


if __name__ == "__main__":
    main()
