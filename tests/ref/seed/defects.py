"""The `defects` command of seed_unified_attn.py: the seed's two defects shown on numbers. A hand-made step
(DEFECT_REQUESTS) runs through the seed's attention with the seed's literal metadata (seed_unified_batch.py's
seed mode) and with uattn's, against the dense oracle, and optionally through uattn-run.
"""

import os
import shutil
import subprocess
import tempfile

import numpy as np

from . import planner as sub
from .attn import SharedChunked, run_seed, seed_metadata, shared_chunk_bias
from .check import compare
from .oracle import dense_oracle, key_counts
from .step import TOLERANCE, Step, batch_view, effective_scheduled, expected_caches, write_step

# ------------------------------------------------------------------------------------------------------
# defects: the seed's own literal metadata against the oracle
# ------------------------------------------------------------------------------------------------------


DEFECT_REQUESTS = [
    {"num_computed": 0, "num_scheduled": 6, "num_prompt": 6, "block_table": [1, 2]},
    {"num_computed": 8, "num_scheduled": 3, "num_prompt": 11, "block_table": [3, 4, 5]},
    {"num_computed": 6, "num_scheduled": 1, "num_prompt": 5, "block_table": [6, 7]},
    {"num_computed": 9, "num_scheduled": 1, "num_prompt": 9, "block_table": [3, 4, 8]},
    {"num_computed": 7, "num_scheduled": 3, "num_prompt": 4, "block_table": [9, 10, 11], "draft_tokens": [17, 18]},
]


def defects_step(dirpath, requests, seed=5):
    """An f32 step over DEFECT_REQUESTS[requests] (bs 4, Hq 4, Hkv 2, D 16, causal_width 4, chunk_size 1): two
    prompts (one over a prefix it shares with a decode), two decodes and a spec decode with two drafts."""
    rng = np.random.default_rng(seed)
    bs, hq, hkv, d, nb = 4, 4, 2, 16, 24
    reqs = [DEFECT_REQUESTS[i] for i in requests]
    step = {"block_size": bs, "num_blocks": nb, "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d,
            "dtype": "f32", "cache_dtype": "f32", "kv_layout": "NHD", "scale": 0.25, "soft_cap": 0.0,
            "sliding_window": 0, "attn_type": "decoder", "causal_width": 4, "chunk_size": 1, "requests": reqs}
    T = sum(effective_scheduled(r) for r in reqs)
    arr = {"q": ("q.npy", rng.standard_normal((T, hq, d)).astype(np.float32)),
           "k": ("k.npy", rng.standard_normal((T, hkv, d)).astype(np.float32)),
           "v": ("v.npy", rng.standard_normal((T, hkv, d)).astype(np.float32)),
           "key_cache": ("kc.npy", rng.standard_normal((nb * bs, hkv, d)).astype(np.float32)),
           "value_cache": ("vc.npy", rng.standard_normal((nb * bs, hkv, d)).astype(np.float32))}
    return write_step(dirpath, step, arr)


def seed_literal_metadata(st):
    """The seed's own metadata for the step (seed_unified_batch.py's seed mode: create_unified_batch read
    literally, biases on CPU): causal_bias (None without a prompt), shared_blocks/bias, unique bias/mapping."""
    cfg, step = batch_view(st)
    b = sub.common_prep(cfg, step)
    return sub.seed_context(b, cfg, build_bias=True)


def uattn_metadata(st):
    """The same tensors with uattn's semantics, from seed_unified_batch.py's uattn mode (independent of the
    C planner): (causal_bias, shared_blocks, shared_usage, unique_bias, unique_block_mapping)."""
    cfg, step = batch_view(st)
    u, _ = sub.plan(cfg, step, "uattn")
    cb = np.where(u["causal_mask"] == 1, np.float32(0), np.float32(-np.inf)).astype(np.float32)
    ubias = sub.generate_bias(u["unique_usage"], st.bs) if u["unique_usage"].size else None
    return cb, u["shared_blocks"], u["shared_usage"], ubias, u["unique_block_mapping"]


def show_defects(st, runner, tmp, failures):
    """One step: the seed's literal metadata row by row against the oracle (key counts, error), then the seed's
    decomposition with uattn's metadata, and uattn-run when given."""
    kc, vc = expected_caches(st)
    ref_out, _ = dense_oracle(st, kc, vc)
    scale = float(np.abs(ref_out).max())
    tol = TOLERANCE["f32"]
    is_prompt = st.seq <= st.npr
    c = seed_literal_metadata(st)
    ub, um = c.get("unique_bias"), c.get("unique_block_mapping")
    vis = None if c["shared_bias"] is None else (c["shared_bias"] == 0)
    counts = key_counts(st, c["causal_bias"], c["shared_blocks"], vis, ub, um)
    print("defects: %d requests (%s), %d rows; the seed's literal metadata: causal bias %s, %d shared blocks, "
          "%d unique ids" % (len(st.reqs), ", ".join("prompt" if p else "decode" for p in is_prompt), st.T,
                             "none" if c["causal_bias"] is None else "[%d, %d]" % c["causal_bias"].shape,
                             c["shared_blocks"].shape[0], c["unique_dim"]))
    seed_out = run_seed(st, kc, vc, seed_metadata(st.bs, c["causal_bias"], st.causal_width, c["shared_blocks"],
                                                   c["shared_bias"], ub, um))
    for t in range(st.T):
        r, p = int(st.row_req[t]), int(st.row_pos[t])
        err = float(np.abs(seed_out[t] - ref_out[t]).max()) / scale
        kind = "prompt" if is_prompt[r] else ("spec" if st.reqs[r].get("draft_tokens") else "decode")
        twice = np.flatnonzero(counts[t][:p + 1] == 2).tolist()
        later = int((counts[t][p + 1:] > 0).sum())
        notes = []
        if twice:
            notes.append("key(s) %s counted twice (defect a)" % twice)
        if later:
            notes.append("sees %d later key(s) (defect b)" % later)
        print("  row %2d request %d %-6s position %2d: err vs oracle %.2e x max|ref|  %s"
              % (t, r, kind, p, err, "; ".join(notes) or "right"))
        wrong = bool(twice or later)
        if wrong and err <= 1e-3:
            failures.append("row %d: the seed's metadata is wrong but its answer is not" % t)
        if not wrong and err > tol:
            failures.append("row %d: the seed's metadata is right but its answer is not" % t)
        if kind == "decode" and is_prompt.any() and p not in twice:
            failures.append("row %d: defect (a) not reproduced" % t)
        if kind == "spec" and t + 1 < st.T and st.row_req[t + 1] == r and not later:
            failures.append("row %d: defect (b) not reproduced" % t)
    cb, sblocks, susage, ubias, umap = uattn_metadata(st)
    for label, shared in (("whole", shared_chunk_bias(susage, st.bs)), ("chunk 1", SharedChunked(susage, 1))):
        meta = seed_metadata(st.bs, cb, st.causal_width, sblocks, shared, ubias, umap)
        ok, mx, bound, _ = compare(run_seed(st, kc, vc, meta), ref_out, tol)
        print("  the seed's decomposition with uattn's metadata (%s shared): max abs err vs oracle %.2e <= %.2e: %s"
              % (label, mx, bound, "ok" if ok else "FAIL"))
        if not ok:
            failures.append("the seed's decomposition with uattn's metadata (%s) differs from the oracle" % label)
    if runner:
        out = os.path.join(tmp, "out-%d" % len(st.reqs))
        r = subprocess.run([runner, st.path, "--out", out, "--dump-biases"], capture_output=True, text=True)
        if r.returncode:
            failures.append("uattn-run failed: %s" % r.stderr.strip())
            return
        got = np.load(os.path.join(out, "out.npy"))
        ok, mx, bound, _ = compare(got, ref_out, tol)
        _, mx_seed, _, _ = compare(got, seed_out, tol)
        print("  uattn-run: max abs err vs oracle %.2e <= %.2e: %s; vs the seed-literal answer %.2e"
              % (mx, bound, "ok" if ok else "FAIL", mx_seed))
        if not ok:
            failures.append("uattn-run differs from the oracle on the defects step")


def cmd_defects(args):
    tmp = tempfile.mkdtemp(prefix="uattn-defects-")
    failures = []
    try:
        # a mixed batch: (a) on the decode and spec rows, (b) on the spec rows
        show_defects(Step(defects_step(os.path.join(tmp, "mixed"), [0, 1, 2, 3, 4])), args.runner, tmp, failures)
        # no prompt in the batch: no causal bias, so (a) is gone, and (b) shows alone on the spec rows
        show_defects(Step(defects_step(os.path.join(tmp, "decodes"), [2, 3, 4])), args.runner, tmp, failures)
    finally:
        if args.keep:
            print("  kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    for f in failures:
        print("FAIL defects: %s" % f)
    print("defects: %s" % ("FAILED" if failures else "ok: the seed's literal metadata double-counts keys of decode "
                           "rows in a batch with a prompt and shows drafts later keys; uattn's metadata and "
                           "uattn-run give the oracle's answer"))
    return 1 if failures else 0
