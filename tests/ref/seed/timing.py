"""The `time` command of seed_unified_batch.py: the seed's CPU work per step in seed mode (common prep, context
split, the path's CPU biases, bucketing and padding to the bucket; choice 11), timed with and without the CPU
biases.
"""

import json
import statistics
import time

import numpy as np

from .planner import NEG_INF, common_prep, generate_bias, generate_unified_buckets, seed_context, select_bucket

# ------------------------------------------------------------------------------------------------------
# Timing (the seed's CPU work, seed mode)
# ------------------------------------------------------------------------------------------------------


def _pad(arr, shape, value):
    """The seed's hpu_tensor CPU side: no copy when the shape already matches, else a filled placeholder."""
    if arr is None:
        return None
    if tuple(arr.shape) == tuple(shape):
        return arr
    out = np.full(shape, value, dtype=arr.dtype)
    out[tuple(slice(0, n) for n in arr.shape)] = arr
    return out


def seed_step_cpu(cfg, step, buckets, hpu_bias_acceleration):
    """create_unified_batch's CPU work in seed mode: common prep, context split, the CPU biases of the chosen
    path, bucketing and padding to the bucket. hpu_bias_acceleration=True builds no causal and no shared bias
    (the seed then builds them on the device) except the seed's CPU fallback when the padded shared tokens
    are fewer than the actual ones; the unique bias is built on CPU on both paths, as in the seed."""
    b = common_prep(cfg, step)
    c = seed_context(b, cfg, build_bias=True, hpu_bias_acceleration=hpu_bias_acceleration, want_dense=False)
    exact = [b["query_len"], int(c["shared_blocks"].shape[0]), c["unique_dim"], b["logits_indices"].shape[0]]
    (tq, ts, tu, tl), _ = select_bucket(cfg, buckets, b["contains_prompts"], exact)
    bs = cfg["block_size"]
    _pad(b["slot_mapping"], (tq,), -1)
    _pad(b["token_positions"], (tq,), -1)
    if b["token_ids"] is not None:
        _pad(b["token_ids"], (tq,), -1)
    _pad(b["logits_indices"], (tl,), -1)
    _pad(c["shared_blocks"], (ts,), -1)
    if "unique_bias" in c:
        _pad(c["unique_block_mapping"], (tu,), -1)
        _pad(c["unique_bias"], (tu, bs), NEG_INF)
    if not hpu_bias_acceleration:
        _pad(c["causal_bias"], (tq, tq), NEG_INF)
        _pad(c["shared_bias"], (tq, ts, bs), NEG_INF)
    elif c["shared_parts"] is not None and ts * bs < c["shared_parts"][0].shape[0]:
        tok, blk, use = c["shared_parts"]
        shared_bias = np.full((b["query_len"], c["shared_blocks"].shape[0], bs), NEG_INF, dtype=np.float32)
        shared_bias[tok, blk] = generate_bias(use, bs)
        _pad(shared_bias, (tq, ts, bs), NEG_INF)


def cmd_time(args):
    with open(args.batch) as f:
        batch = json.load(f)
    cfg, step = batch["config"], batch["step"]
    buckets = generate_unified_buckets(cfg) if cfg.get("bucketing") == "seed" else None
    res = {}
    for name, hpu in (("median_ms_no_bias", True), ("median_ms_with_bias", False)):
        seed_step_cpu(cfg, step, buckets, hpu)  # warm-up
        ts = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            seed_step_cpu(cfg, step, buckets, hpu)
            ts.append((time.perf_counter() - t0) * 1e3)
        res[name] = statistics.median(ts)
    res["repeat"] = args.repeat
    print(json.dumps(res))
