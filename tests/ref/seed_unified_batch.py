#!/usr/bin/python3
"""An independent numpy re-statement of the seed's unified-batch planner, and golden fixtures for uattn.

Re-states `create_unified_batch` and its helpers from vllm_gaudi/extension/unified_batch.py,
vllm-gaudi PR 784's dense shared usage table and the seed's unified bucketing (docs/design.md,
"Bucketing"). Run with Debian's /usr/bin/python3 (numpy 1.24); imports numpy and the standard library only.

    seed_unified_batch.py golden --out FILE [--count N] [--seed S]   fixtures for the C planner's tests
    seed_unified_batch.py time --batch FILE [--repeat N]             times the seed-mode planner
    seed_unified_batch.py selftest                                   checks this script itself

Two modes of the planner:
  "seed"   create_unified_batch read literally, with hpu_bias_acceleration=False (biases built on CPU), and
           with its two defects: (a) in a batch holding a prompt, the causal bias covers every row, decode rows
           included, while a decode's context (cached = num_computed + num_scheduled) already holds its own
           new key, so a decode row sees that key twice; (b) a context block's usage is per request
           (clip(cached - offset*bs, 1, bs)), so every row of a multi-token decode sees the later drafts.
  "uattn"  the semantics the C library implements: the causal part only among rows of prompt requests
           (same request, key position <= query position); token_context_lens[t] = min(pos + 1, cached[r])
           with cached = num_computed for a prompt and num_computed + num_scheduled otherwise; usage of the
           context block starting at `start` is clamp(ctx_len[t] - start, 0, bs) per row; a block read
           (usage > 0) by more than one row over the whole batch is shared, by exactly one row unique.

Choices this script makes where the seed or the brief leaves room (the C planner must agree with them):
 1. Spec decode: a request with >= 1 draft entry gets num_scheduled = count(entries != -1) + 1; a request
    with no entry is not a spec-decode request (the seed keys a dict by request id; "absent" = no entries).
 2. Seed mode, batch without prompts: the seed builds no causal bias (None); the mask is reported all zero.
 3. Async scheduling. uattn mode: when exactly one request has 0 output tokens, its last row
    (query_start_loc[r+1] - 1) is appended to logits_indices, r to logits_groups, that row's position + 1 to
    new_token_positions, and r is reported; the bucket's logits count includes the appended row.
    Seed mode (literal): when num_reqs - num_logits == 1, query_len - 1 is appended to logits_indices only,
    num_reqs - 1 is reported, and the bucket's logits count is taken before the append (the seed buckets
    first and appends after padding).
 4. bucket_range(min, max, round_up): the seed's warmup_unified_range: 0 is added and min becomes 1 when
    min is 0; v_i = min * float_power(max / min, (1./9.) * i) in double precision; the point is max for
    i = 9, else ceil(v_i / round_up) * round_up; deduplicated and sorted. round_up = max_num_seqs. No
    special case for max == 0 (the seed has none).
 5. Bucket list: ranges query (1, max_num_batched_tokens, S), shared (0, min(max_model_len // bs,
    num_blocks), S), unique (0, num_blocks, S), S = max_num_seqs; with chunk_size > 0 every shared value is
    rounded up to a multiple of chunk_size, then deduplicated, before the product. Filters (integer
    division, as the seed): causal: shared*bs // min(S, query) <= max_model_len; non-causal: query <= S,
    shared > 0 or unique > 0, shared == 0 or shared*bs // (query // 2) <= max_model_len, and shared > 0 or
    query <= unique. A divisor query // 2 == 0 with shared > 0 (the seed would raise) rejects the bucket.
    Sorted as tuples (query, shared, unique, causal) with causal False < True.
 6. Lookup: the first bucket in that order whose causal flag == contains_prompts and that is >= the batch
    in query, shared (number of shared blocks) and unique (largest unique block id + 1, 0 if none). The
    seed's find_equal_or_closest_greater_config ignores the flag when comparing ("TODO: handle
    is_causal"); uattn matches it. None fits: the exact sizes, bucket_fallback = True. Logits (bucketing
    "seed", fallback or not): max_num_seqs if num_logits <= max_num_seqs, else num_logits. Bucketing
    "none": padded = exact. No data-parallel padding.
 7. Seed-format unique tensors: dimension = largest unique block id + 1; unique_block_mapping[id] = the
    reading row (the seed writes the request's first row: the same row, since a seed-unique block belongs
    to a one-token request) or -1; unique_usage[id] = usage or 0.
 8. token_context_lens in seed mode: cached[r] for every row of r (the seed has no per-row context).
 9. Fixtures' block tables: rows padded with 0 past ceil(seq_len / bs); block 0 is never allocated (vLLM's
    null block). A block id appears at one offset only; blocks written this step are private.
10. "parity" (seed vs uattn) leaves out, beyond the brief's rules (causal_mask when the batch has a prompt
    and a decode; shared_*/unique_* with a multi-token decode): token_context_lens, exact_bucket,
    padded_bucket, bucket_fallback with a multi-token decode (they follow from the split); logits_groups,
    new_token_positions, exact_bucket, padded_bucket when either mode appended an async row; and
    logits_indices, invalid_req_indices unless both appended for the last request. Generation asserts that
    every key listed in parity is equal in both modes.
11. `time` times the seed's CPU work in seed mode: common prep, context split, the path's CPU biases,
    bucketing and padding to the bucket (a fresh filled array per padded tensor; no placeholder cache).
    "no_bias" is the hpu_bias_acceleration=True path: no causal and no shared bias (except the seed's CPU
    fallback when padded shared tokens < actual ones), but the unique bias, which the seed builds on CPU on
    both paths, is built.

Fixture file (golden): {"cases": [...], "bucket_ranges": [{"min", "max", "round_up", "values"}, ...]}; a case
is {"name", "config", "step", "uattn", "seed"} as described in tests/ref/README.md. "buckets" appears on the
first case of each config only, [] when its bucketing is "none".
"""

import argparse
import json
import math
import os
import random
import statistics
import sys
import time

import numpy as np

NEG_INF = -math.inf

# ------------------------------------------------------------------------------------------------------
# The seed's helpers
# ------------------------------------------------------------------------------------------------------


def indices_and_offsets(counts):
    """Re-states the seed's indices_and_offsets: split groups of sizes `counts` into group indices and
    offsets, e.g. [1, 2, 3] -> [0, 1, 1, 2, 2, 2], [0, 0, 1, 0, 1, 2]."""
    counts = np.asarray(counts, dtype=np.int64)
    cum_end = np.cumsum(counts)
    cum_start = cum_end - counts
    total = cum_end[-1] + 1
    indices = np.zeros(total, dtype=np.int64)
    np.add.at(indices, cum_end[:-1], 1)
    indices = np.cumsum(indices)
    offsets = np.arange(total, dtype=np.int64) - cum_start[indices]
    return indices[:-1], offsets[:-1]


def fetch_2d(table, indices, offsets):
    """Re-states the seed's fetch_2d: table[indices, offsets] through a flat index."""
    assert table.ndim == 2, 'Only 2D tables are supported!'
    flat_indices = indices * table.shape[-1] + offsets
    return table.reshape(-1)[flat_indices]


def group_sum(groups, values):
    """Re-states the seed's group_sum: for each element, the sum of values over elements of its group."""
    tmp = np.zeros((int(groups.max()) + 1,), dtype=values.dtype)
    np.add.at(tmp, groups, values)
    return tmp[groups]


def mask_to_bias(mask, dtype=np.float32):
    """Re-states the seed's mask_to_bias (without the placeholder): 0 where visible, -inf where masked."""
    bias = np.zeros(mask.shape, dtype=dtype)
    bias[mask] = NEG_INF
    return bias


def generate_bias(block_usages, block_size, dtype=np.float32):
    """Re-states the seed's generate_bias: one row of block_size per usage, key k visible iff k < usage."""
    block_len_range = np.arange(1, block_size + 1, dtype=np.int64)
    return mask_to_bias(block_len_range[np.newaxis, :] > block_usages[:, np.newaxis], dtype)


def create_causal_bias(groups, positions, dtype=np.float32):
    """Re-states the seed's create_causal_bias: same group and key position <= query position."""
    group_mask = groups[:, np.newaxis] != groups[np.newaxis, :]
    position_mask = positions[:, np.newaxis] < positions[np.newaxis, :]
    return mask_to_bias(group_mask | position_mask, dtype)


class Context:
    """Re-states the seed's Context: one entry per (request, context block) with the block's usage."""

    def __init__(self, group_ids, group_offsets, block_ids, block_usages):
        self.group_ids = group_ids
        self.group_offsets = group_offsets
        self.block_ids = block_ids
        self.block_usages = block_usages

    @staticmethod
    def create(total_tokens, block_table, block_size):
        """Context.create: ceil(total/bs) blocks per request, usage clip(total - off*bs, 1, bs)."""
        num_ctx_blocks = (total_tokens + block_size - 1) // block_size
        if num_ctx_blocks.sum() <= 0:
            return None
        group_ids, group_offsets = indices_and_offsets(num_ctx_blocks)
        block_ids = fetch_2d(block_table, group_ids, group_offsets)
        block_usages = np.clip(total_tokens[group_ids] - group_offsets * block_size, 1, block_size)
        return Context(group_ids, group_offsets, block_ids, block_usages)

    def index_select(self, indices):
        """Context.index_select: None when empty."""
        if indices.size <= 0:
            return None
        return Context(self.group_ids[indices], self.group_offsets[indices], self.block_ids[indices],
                       self.block_usages[indices])

    def split(self, num_scheduled_tokens):
        """Context.split: a block is shared when the requests holding it schedule > 1 token in total."""
        num_tokens = num_scheduled_tokens[self.group_ids]
        block_tokens = group_sum(self.block_ids, num_tokens)
        shared_idx = np.argwhere(block_tokens > 1).flatten()
        unique_idx = np.argwhere(block_tokens == 1).flatten()
        assert shared_idx.size + unique_idx.size == self.group_ids.size
        return self.index_select(shared_idx), self.index_select(unique_idx)


# ------------------------------------------------------------------------------------------------------
# Bucketing (the seed's unified bucketing; see the module docstring, choices 4-6)
# ------------------------------------------------------------------------------------------------------


def bucket_range(bmin, bmax, round_up):
    """Re-states the seed's warmup_unified_range(cfg=(bmin, bmax, turning_point)) with round_up given."""
    points = set()
    if bmin == 0:
        points.add(0)
        bmin = 1
    limit = 10
    for i in range(limit):
        power_unpadded = bmin * np.float_power(bmax / bmin, (1. / float(limit - 1)) * i)
        if i == limit - 1:
            point = bmax
        else:
            point = math.ceil(power_unpadded / round_up) * round_up
        points.add(int(point))
    return sorted(points)


def config_ranges(cfg):
    """The seed's get_unified_cfgs + get_range, round_up = max_num_seqs, shared rounded to chunk_size."""
    S, bs = cfg["max_num_seqs"], cfg["block_size"]
    q = bucket_range(1, cfg["max_num_batched_tokens"], S)
    s = bucket_range(0, min(cfg["max_model_len"] // bs, cfg["num_blocks"]), S)
    if cfg.get("chunk_size", 0) > 0:
        c = cfg["chunk_size"]
        s = sorted(set(-(-v // c) * c for v in s))
    u = bucket_range(0, cfg["num_blocks"], S)
    return q, s, u


def generate_unified_buckets(cfg):
    """Re-states the seed's generate_unified_buckets: the filtered product, sorted (q, s, u, causal)."""
    S, bs, mml = cfg["max_num_seqs"], cfg["block_size"], cfg["max_model_len"]
    q_range, s_range, u_range = config_ranges(cfg)
    buckets = set()
    for query in q_range:
        for shared in s_range:
            for unique in u_range:
                for causal in (0, 1):
                    if causal:
                        if shared * bs // min(S, query) <= mml:
                            buckets.add((query, shared, unique, causal))
                    elif query <= S and (shared > 0 or unique > 0):
                        if shared > 0 and query // 2 == 0:
                            continue  # the seed would divide by zero here
                        if shared == 0 or shared * bs // (query // 2) <= mml:
                            if shared > 0 or query <= unique:
                                buckets.add((query, shared, unique, causal))
    return sorted(buckets)


def select_bucket(cfg, buckets, contains_prompts, exact):
    """The seed's bucketing_fn (find_unified_bucket + logits padding) with the causal flag matched.
    Returns (padded [q, s, u, l], fallback)."""
    q, s, u, l = exact
    if cfg["bucketing"] == "none":
        return list(exact), False
    S = cfg["max_num_seqs"]
    logits = S if l <= S else l
    want = 1 if contains_prompts else 0
    for b in buckets:
        if b[3] == want and b[0] >= q and b[1] >= s and b[2] >= u:
            return [b[0], b[1], b[2], logits], False
    return [q, s, u, logits], True


# ------------------------------------------------------------------------------------------------------
# The planner
# ------------------------------------------------------------------------------------------------------


def apply_spec_rule(num_scheduled, draft_tokens):
    """Re-states the seed's spec-decode loop (create_unified_batch, 'torch2numpy'): a request with drafts
    schedules its non-placeholder drafts + 1 tokens (choice 1)."""
    ns = [int(v) for v in num_scheduled]
    if draft_tokens is not None:
        for idx, spec_tokens in enumerate(draft_tokens):
            if not spec_tokens:
                continue
            ns[idx] = len([i for i in spec_tokens if i != -1]) + 1
    return np.asarray(ns, dtype=np.int64)


def common_prep(cfg, step):
    """Re-states create_unified_batch's 'common_prep' block: per-request and per-row arrays, slot mapping
    and sampling indices. Identical in both modes."""
    bs = cfg["block_size"]
    nc = np.asarray(step["num_computed"], dtype=np.int64)
    R = nc.shape[0]
    npr = np.asarray(step["num_prompt"], dtype=np.int64)
    bt = np.asarray(step["block_table"], dtype=np.int64).reshape(R, -1)
    tok = step.get("token_ids")
    tok = None if tok is None else np.asarray(tok, dtype=np.int64).reshape(R, -1)
    ns = apply_spec_rule(step["num_scheduled"], step.get("draft_tokens"))

    total_tokens = nc + ns
    query_len = int(ns.sum())
    is_prompt = total_tokens <= npr
    cached_tokens = nc + np.where(is_prompt, 0, ns)
    num_output_tokens = np.clip(total_tokens - npr + 1, 0, ns)
    group_starts = np.cumsum(ns) - ns

    token_groups, token_offsets = indices_and_offsets(ns)
    token_positions = token_offsets + nc[token_groups]
    token_ids = fetch_2d(tok, token_groups, token_positions) if tok is not None else None
    token_blocks = fetch_2d(bt, token_groups, token_positions // bs)
    slot_mapping = token_blocks * bs + token_positions % bs

    logits_groups, logits_offsets = indices_and_offsets(num_output_tokens)
    start_logits_indices = np.cumsum(ns) - num_output_tokens
    logits_indices = logits_offsets + start_logits_indices[logits_groups]
    negative_logits_offsets = num_output_tokens[logits_groups] - logits_offsets - 1
    new_token_positions = total_tokens[logits_groups] - negative_logits_offsets

    query_start_loc = np.zeros(R + 1, dtype=np.int64)
    query_start_loc[1:] = np.cumsum(ns)
    return dict(block_size=bs, num_reqs=R, num_computed=nc, num_prompt=npr, block_table=bt, num_scheduled=ns,
                seq_lens=total_tokens, query_len=query_len, is_prompt=is_prompt, cached=cached_tokens,
                contains_prompts=bool(np.any(is_prompt)), num_output_tokens=num_output_tokens,
                group_starts=group_starts, query_start_loc=query_start_loc, token_groups=token_groups,
                token_offsets=token_offsets, token_positions=token_positions, token_ids=token_ids,
                slot_mapping=slot_mapping, logits_indices=logits_indices, logits_groups=logits_groups,
                new_token_positions=new_token_positions)


def _empty_i64():
    return np.zeros(0, dtype=np.int64)


def seed_context(b, cfg, build_bias=True, hpu_bias_acceleration=False, want_dense=True):
    """Re-states create_unified_batch from 'causal_cpu_prep' to 'unique_cpu_prep' literally, plus PR 784's
    dense usage table (block_usages[shared_token_idx, shared_block_idx] = shared_block_usage)."""
    bs, T = b["block_size"], b["query_len"]
    ns = b["num_scheduled"]
    out = {}
    out["causal_bias"] = None
    if b["contains_prompts"] and not hpu_bias_acceleration and build_bias:
        out["causal_bias"] = create_causal_bias(b["token_groups"], b["token_positions"])

    shared_blocks = _empty_i64()
    shared_parts = None
    out["shared_bias"] = None
    unique = None
    unique_dim = 0
    ctx = Context.create(b["cached"], b["block_table"], bs)
    if ctx:
        shared_ctx, unique_ctx = ctx.split(ns)
        if shared_ctx:
            shared_blocks, orig_shared_blocks = np.unique(shared_ctx.block_ids, return_inverse=True)
            shared_group_starts = b["group_starts"][shared_ctx.group_ids]
            shared_tokens = ns[shared_ctx.group_ids]
            shared_token_indices, shared_token_offsets = indices_and_offsets(shared_tokens)
            shared_token_idx = shared_group_starts[shared_token_indices] + shared_token_offsets
            shared_block_idx = orig_shared_blocks[shared_token_indices]
            shared_block_usage = shared_ctx.block_usages[shared_token_indices]
            shared_parts = (shared_token_idx, shared_block_idx, shared_block_usage)
            if not hpu_bias_acceleration and build_bias:
                shared_block_bias = generate_bias(shared_block_usage, bs)
                shared_bias = np.full((T, shared_blocks.shape[0], bs), NEG_INF, dtype=np.float32)
                shared_bias[shared_token_idx, shared_block_idx] = shared_block_bias
                out["shared_bias"] = shared_bias
        if unique_ctx:
            # the seed builds the unique bias on CPU on either path
            unique_dim = int(unique_ctx.block_ids.max()) + 1
            unique_bias = np.full((unique_dim, bs), NEG_INF, dtype=np.float32)
            unique_bias[unique_ctx.block_ids] = generate_bias(unique_ctx.block_usages, bs)
            unique_block_mapping = np.full((unique_dim,), -1, dtype=np.int64)
            unique_block_mapping[unique_ctx.block_ids] = b["group_starts"][unique_ctx.group_ids]
            unique = unique_ctx
            out["unique_bias"] = unique_bias
            out["unique_block_mapping"] = unique_block_mapping
    out["shared_blocks"] = shared_blocks
    out["shared_parts"] = shared_parts
    out["unique_dim"] = unique_dim
    if not want_dense:
        return out

    # Outputs in the fixture's form.
    S = shared_blocks.shape[0]
    usage = np.zeros((T, S), dtype=np.int64)
    if shared_parts is not None:
        usage[shared_parts[0], shared_parts[1]] = shared_parts[2]
    out["shared_usage"] = usage
    if unique is not None:
        tokens = b["group_starts"][unique.group_ids]
        starts = unique.group_offsets * bs
        order = np.lexsort((starts, tokens))
        out["unique_list"] = np.stack([unique.block_ids, tokens, starts, unique.block_usages], axis=1)[order]
        uu = np.zeros(unique_dim, dtype=np.int64)
        uu[unique.block_ids] = unique.block_usages
        out["unique_usage"] = uu
    else:
        out["unique_list"] = np.zeros((0, 4), dtype=np.int64)
        out["unique_usage"] = _empty_i64()
        out["unique_block_mapping"] = _empty_i64()
    g, p = b["token_groups"], b["token_positions"]
    if b["contains_prompts"]:
        causal = (g[:, None] == g[None, :]) & (p[None, :] <= p[:, None])
    else:
        causal = np.zeros((T, T), dtype=bool)  # no causal bias at all (choice 2)
    out["causal_mask"] = causal
    out["token_context_lens"] = b["cached"][g]
    return out


def uattn_context(b, cfg):
    """The uattn semantics (module docstring): per-row context lengths and usages, a block shared when
    more than one row reads it; causal part only among rows of prompt requests."""
    bs, T = b["block_size"], b["query_len"]
    ns, g, p = b["num_scheduled"], b["token_groups"], b["token_positions"]
    ctx_len = np.minimum(p + 1, b["cached"][g])
    out = {"token_context_lens": ctx_len}
    pr = b["is_prompt"][g]
    out["causal_mask"] = pr[:, None] & (g[:, None] == g[None, :]) & (p[None, :] <= p[:, None])

    num_ctx_blocks = (b["cached"] + bs - 1) // bs
    shared_blocks = _empty_i64()
    usage = np.zeros((T, 0), dtype=np.int64)
    ulist = np.zeros((0, 4), dtype=np.int64)
    unique_dim = 0
    if num_ctx_blocks.sum() > 0:
        e_group, e_off = indices_and_offsets(num_ctx_blocks)  # one entry per (request, context block)
        e_block = fetch_2d(b["block_table"], e_group, e_off)
        e_start = e_off * bs
        p_entry, p_k = indices_and_offsets(ns[e_group])  # one pair per (entry, row of its request)
        p_token = b["query_start_loc"][e_group[p_entry]] + p_k
        p_usage = np.clip(ctx_len[p_token] - e_start[p_entry], 0, bs)
        keep = p_usage > 0
        p_entry, p_token, p_usage = p_entry[keep], p_token[keep], p_usage[keep]
        p_block = e_block[p_entry]
        readers = np.bincount(p_block, minlength=1)
        is_shared = readers[p_block] > 1
        shared_blocks = np.unique(p_block[is_shared])
        usage = np.zeros((T, shared_blocks.shape[0]), dtype=np.int64)
        usage[p_token[is_shared], np.searchsorted(shared_blocks, p_block[is_shared])] = p_usage[is_shared]
        u = ~is_shared
        ulist = np.stack([p_block[u], p_token[u], e_start[p_entry[u]], p_usage[u]], axis=1)
        ulist = ulist[np.lexsort((ulist[:, 2], ulist[:, 1]))]
        unique_dim = int(ulist[:, 0].max()) + 1 if ulist.shape[0] else 0
    mapping = np.full(unique_dim, -1, dtype=np.int64)
    uu = np.zeros(unique_dim, dtype=np.int64)
    if ulist.shape[0]:
        mapping[ulist[:, 0]] = ulist[:, 1]
        uu[ulist[:, 0]] = ulist[:, 3]
    out.update(shared_blocks=shared_blocks, shared_usage=usage, unique_list=ulist, unique_dim=unique_dim,
               unique_block_mapping=mapping, unique_usage=uu)
    return out


def plan(cfg, step, mode, buckets=None, build_bias=False):
    """One step in `mode` ("seed" or "uattn"). Returns (outputs dict of numpy values, common arrays)."""
    assert mode in ("seed", "uattn")
    b = common_prep(cfg, step)
    R = b["num_reqs"]
    c = seed_context(b, cfg, build_bias=build_bias) if mode == "seed" else uattn_context(b, cfg)

    logits_indices = b["logits_indices"]
    logits_groups = b["logits_groups"]
    new_token_positions = b["new_token_positions"]
    num_logits_for_bucket = logits_indices.shape[0]
    invalid = []
    if step.get("async_scheduling"):
        if mode == "seed":
            if R - logits_indices.shape[0] == 1:
                logits_indices = np.append(logits_indices, b["query_len"] - 1)
                invalid = [R - 1]
        else:
            zero = np.flatnonzero(b["num_output_tokens"] == 0)
            if zero.shape[0] == 1:
                r = int(zero[0])
                row = int(b["query_start_loc"][r + 1]) - 1
                logits_indices = np.append(logits_indices, row)
                logits_groups = np.append(logits_groups, r)
                new_token_positions = np.append(new_token_positions, int(b["token_positions"][row]) + 1)
                invalid = [r]
                num_logits_for_bucket = logits_indices.shape[0]

    exact = [b["query_len"], int(c["shared_blocks"].shape[0]), int(c["unique_dim"]), num_logits_for_bucket]
    if buckets is None and cfg["bucketing"] == "seed":
        buckets = generate_unified_buckets(cfg)
    padded, fallback = select_bucket(cfg, buckets, b["contains_prompts"], exact)

    o = dict(num_scheduled=b["num_scheduled"], query_start_loc=b["query_start_loc"], seq_lens=b["seq_lens"],
             is_prompt=b["is_prompt"].astype(np.int64), num_output_tokens=b["num_output_tokens"],
             token_groups=b["token_groups"], token_offsets=b["token_offsets"],
             token_positions=b["token_positions"], token_ids=b["token_ids"], slot_mapping=b["slot_mapping"],
             token_context_lens=c["token_context_lens"], logits_indices=logits_indices,
             logits_groups=logits_groups, new_token_positions=new_token_positions,
             invalid_req_indices=np.asarray(invalid, dtype=np.int64), shared_blocks=c["shared_blocks"],
             shared_usage=c["shared_usage"], causal_mask=c["causal_mask"].astype(np.int64),
             unique_blocks=c["unique_list"], unique_block_mapping=c["unique_block_mapping"],
             unique_usage=c["unique_usage"], exact_bucket=exact, padded_bucket=padded,
             bucket_fallback=bool(fallback))
    if build_bias and mode == "seed":
        o["_biases"] = (c.get("causal_bias"), c.get("shared_bias"), c.get("unique_bias"))
    return o, b


def to_json_outputs(o, with_buckets=None):
    """The fixture's form: lists of ints; causal_mask only when T <= 64."""
    def lst(v):
        return None if v is None else np.asarray(v).tolist()
    j = {}
    for k in ("num_scheduled", "query_start_loc", "seq_lens", "is_prompt", "num_output_tokens", "token_groups",
              "token_offsets", "token_positions", "token_ids", "slot_mapping", "token_context_lens",
              "logits_indices", "logits_groups", "new_token_positions", "invalid_req_indices", "shared_blocks"):
        j[k] = lst(o[k])
    j["shared_usage"] = lst(o["shared_usage"])
    T = o["token_groups"].shape[0]
    j["causal_mask"] = lst(o["causal_mask"]) if T <= 64 else None
    j["unique_blocks"] = lst(o["unique_blocks"])
    j["unique_block_mapping"] = lst(o["unique_block_mapping"])
    j["unique_usage"] = lst(o["unique_usage"])
    j["exact_bucket"] = [int(v) for v in o["exact_bucket"]]
    j["padded_bucket"] = [int(v) for v in o["padded_bucket"]]
    j["bucket_fallback"] = bool(o["bucket_fallback"])
    if with_buckets is not None:
        j["buckets"] = [list(t) for t in with_buckets]
    return j


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


# ------------------------------------------------------------------------------------------------------
# Random batches
# ------------------------------------------------------------------------------------------------------

# (block_size, max_num_seqs, max_num_batched_tokens, max_model_len, num_blocks, chunk_size, bucketing)
CONFIGS = [
    (1, 8, 256, 256, 2048, 0, "none"),
    (1, 4, 128, 192, 1024, 0, "seed"),
    (1, 1, 64, 64, 256, 0, "seed"),
    (2, 8, 256, 512, 2048, 0, "none"),
    (3, 8, 256, 384, 1024, 0, "seed"),
    (4, 16, 512, 512, 1024, 0, "none"),
    (4, 4, 64, 256, 512, 0, "seed"),
    (5, 8, 256, 640, 1024, 0, "none"),
    (7, 8, 256, 448, 600, 3, "seed"),
    (8, 16, 512, 1024, 1024, 4, "seed"),
    (8, 32, 512, 1024, 2048, 0, "none"),
    (16, 32, 1024, 2048, 1024, 0, "none"),
    (16, 16, 512, 2048, 512, 8, "seed"),
    (32, 8, 512, 2048, 512, 0, "seed"),
    (32, 16, 512, 4096, 1024, 0, "none"),
    (64, 8, 512, 4096, 256, 0, "none"),
    (64, 16, 1024, 4096, 512, 2, "seed"),
    (128, 8, 1024, 4096, 256, 0, "seed"),
    (128, 8, 512, 8192, 256, 0, "none"),
    (256, 8, 1024, 8192, 128, 2, "seed"),
    (256, 4, 512, 4096, 64, 0, "none"),
]

KINDS = ["decode_only", "prefill_only", "prefix_prefill", "chunked", "spec_decode", "prefix_sharing", "mixed",
         "mixed", "async_last", "async_mid", "async_spec", "empty_context"]


def _cfg_dict(t):
    bs, S, mnbt, mml, nb, chunk, bucketing = t
    return dict(block_size=bs, num_blocks=nb, max_num_seqs=S, max_num_batched_tokens=mnbt, max_model_len=mml,
                chunk_size=chunk, bucketing=bucketing)


class Gen:
    """Draws requests that respect one config's limits and builds a valid step around them."""

    def __init__(self, g, cfg):
        self.g, self.cfg = g, cfg
        bs, mml = cfg["block_size"], cfg["max_model_len"]
        # keep contexts to a few dozen blocks so fixtures stay small
        self.ctx_cap = min(mml - 9, max(bs * self.g.choice([4, 8, 24, 48]), 16))
        self.q_cap = min(cfg["max_num_batched_tokens"], self.g.choice([8, 16, 32, 64, 128]))

    def rnd_ctx(self, lo=0):
        return self.g.randint(lo, max(lo, self.ctx_cap))

    def decode(self, prefix_k=0):
        bs = self.cfg["block_size"]
        nc = self.rnd_ctx(max(1, prefix_k * bs))
        return dict(nc=nc, ns=1, np=self.g.randint(1, nc), drafts=[], k=prefix_k)

    def spec(self, prefix_k=0):
        bs = self.cfg["block_size"]
        nc = self.rnd_ctx(max(1, prefix_k * bs))
        n = self.g.randint(1, 7)
        drafts = [(-1 if self.g.random() < 0.25 else self.g.randint(0, 31999)) for _ in range(n)]
        return dict(nc=nc, ns=1 + n, np=self.g.randint(1, nc), drafts=drafts, k=prefix_k)

    def prefill(self):
        n = self.g.randint(1, self.q_cap)
        return dict(nc=0, ns=n, np=n, drafts=[], k=0)

    def prefix_prefill(self, prefix_k=None):
        bs = self.cfg["block_size"]
        if prefix_k is None:
            prefix_k = self.g.randint(1, max(1, self.ctx_cap // bs))
        n = self.g.randint(1, self.q_cap)
        return dict(nc=prefix_k * bs, ns=n, np=prefix_k * bs + n, drafts=[], k=prefix_k)

    def chunk(self, last):
        nc = self.rnd_ctx(1)
        n = self.g.randint(1, self.q_cap)
        extra = 0 if last else self.g.randint(1, 64)
        return dict(nc=nc, ns=n, np=nc + n + extra, drafts=[], k=0)

    def partial(self):
        return self.chunk(last=False)

    def any(self):
        f = self.g.choice([self.decode, self.decode, self.spec, self.prefill, self.prefix_prefill,
                           lambda: self.chunk(True), self.partial])
        return f()

    def requests(self, kind):
        g, S = self.g, self.cfg["max_num_seqs"]
        n = g.randint(1, S)
        if kind == "decode_only":
            return [self.decode() for _ in range(g.randint(1, S))]
        if kind == "prefill_only" or kind == "empty_context":
            return [self.prefill() for _ in range(g.randint(1, min(S, 4)))]
        if kind == "prefix_prefill":
            return [self.prefix_prefill() if g.random() < 0.7 else self.prefill() for _ in range(min(n, 4))]
        if kind == "chunked":
            return [self.chunk(g.random() < 0.5) for _ in range(min(n, 4))]
        if kind == "spec_decode":
            return [self.spec() if g.random() < 0.7 else self.decode() for _ in range(n)]
        if kind == "prefix_sharing":
            return None  # built by the caller, it needs the shared prefix
        if kind == "mixed":
            return [self.any() for _ in range(n)]
        if kind == "async_spec":
            # spec decodes and one or two partial prompts: the seed's rule (num_reqs - num_logits == 1)
            # and uattn's (exactly one request samples nothing) disagree here
            return [self.spec() for _ in range(max(1, n - 2))] + [self.partial() for _ in range(g.randint(1, 2))]
        if kind == "async_last":
            return [self.any() for _ in range(n - 1)] + [self.partial()]
        if kind == "async_mid":
            others = [self.decode() if g.random() < 0.6 else self.chunk(True) for _ in range(max(1, n - 1))]
            i = g.randint(0, len(others) - 1)
            return others[:i] + [self.partial()] + others[i:]
        raise ValueError(kind)


def _eff_ns(r):
    return 1 + sum(1 for d in r["drafts"] if d != -1) if r["drafts"] else r["ns"]


def _fits(cfg, reqs):
    mml = cfg["max_model_len"]
    if not reqs or len(reqs) > cfg["max_num_seqs"]:
        return False
    if sum(_eff_ns(r) for r in reqs) > cfg["max_num_batched_tokens"]:
        return False
    return all(r["nc"] + _eff_ns(r) <= mml and r["np"] >= 1 for r in reqs)


def _trim(cfg, reqs):
    """Drops requests that are too long, then requests from the front until the batch fits its limits
    (the front, so that the last request of an async case stays last)."""
    mml = cfg["max_model_len"]
    reqs = [r for r in reqs if r["nc"] + _eff_ns(r) <= mml]
    while reqs and not _fits(cfg, reqs):
        reqs.pop(0 if len(reqs) > 1 else -1)
    return reqs


def build_step(g, cfg, reqs, prefix, async_scheduling, with_tokens, padded_cols):
    """Block table, token ids and drafts for the requests: shared prefix blocks first (full, cached, never
    written), then private fresh ids; block 0 is never used and pads the rows."""
    bs = cfg["block_size"]
    need = 0
    for r in reqs:
        seq = r["nc"] + _eff_ns(r)
        need += -(-seq // bs) - r["k"]
    need += len(prefix)
    if need + 1 > cfg["num_blocks"]:
        return None
    hi = cfg["num_blocks"] - 1 if g.random() < 0.15 else min(cfg["num_blocks"] - 1, need * g.choice([1, 2, 3]) + 4)
    ids = g.sample(range(1, hi + 1), need)
    pre_ids, ids = ids[:len(prefix)], ids[len(prefix):]
    rows, pos = [], 0
    for r in reqs:
        seq = r["nc"] + _eff_ns(r)
        nb = -(-seq // bs)
        assert r["k"] * bs <= r["nc"]
        row = pre_ids[:r["k"]] + ids[pos:pos + nb - r["k"]]
        pos += nb - r["k"]
        rows.append(row)
    stride = max(len(row) for row in rows) + padded_cols
    table = [row + [0] * (stride - len(row)) for row in rows]
    tokens = None
    if with_tokens:
        tstride = max(r["nc"] + _eff_ns(r) for r in reqs) + g.randint(0, 3)
        common = [g.randint(0, 31999) for _ in range(len(prefix) * bs)]
        tokens = []
        for r in reqs:
            row = [g.randint(0, 31999) for _ in range(tstride)]
            row[:r["k"] * bs] = common[:r["k"] * bs]
            real = [d for d in r["drafts"] if d != -1]
            row[r["nc"] + 1:r["nc"] + 1 + len(real)] = real
            tokens.append(row)
    has_drafts = any(r["drafts"] for r in reqs)
    return dict(num_computed=[r["nc"] for r in reqs], num_scheduled=[r["ns"] for r in reqs],
                num_prompt=[r["np"] for r in reqs], block_table=table, token_ids=tokens,
                draft_tokens=[list(r["drafts"]) for r in reqs] if has_drafts or g.random() < 0.2 else None,
                async_scheduling=bool(async_scheduling))


def random_case(g, cfg, kind):
    gen = Gen(g, cfg)
    bs = cfg["block_size"]
    prefix = []
    for _attempt in range(50):
        if kind == "prefix_sharing":
            P = g.randint(1, max(1, gen.ctx_cap // bs))
            prefix = list(range(P))
            reqs = []
            for _ in range(g.randint(2, cfg["max_num_seqs"]) if cfg["max_num_seqs"] > 1 else 1):
                k = g.randint(1, P)
                f = g.choice([gen.decode, gen.decode, gen.spec, gen.prefix_prefill])
                reqs.append(f(k))
        else:
            reqs = gen.requests(kind)
            prefix = []
        if kind not in ("async_last", "async_mid", "async_spec"):
            g.shuffle(reqs)
        reqs = _trim(cfg, reqs)
        if not reqs:
            continue
        if kind == "prefix_sharing" or g.random() < 0.5:
            # requests drawn with k cached prefix blocks share the first k blocks of one common prefix
            prefix = list(range(max([r["k"] for r in reqs] + [0])))
        else:
            prefix = []
            for r in reqs:
                r["k"] = 0
        step = build_step(g, cfg, reqs, prefix, async_scheduling=kind.startswith("async") or g.random() < 0.1,
                          with_tokens=g.random() < 0.8, padded_cols=g.choice([0, 0, 1, 3]))
        if step is not None:
            return step
    raise RuntimeError("could not draw a %s batch for %r" % (kind, cfg))


def docs_example():
    """The docs' worked example: block size 4, query lengths [8, 4, 1, 1], contexts [0, 4, 6, 4]: two
    prompts (the second a prefix prefill whose first block it shares with the fourth request) and two
    decodes."""
    cfg = dict(block_size=4, num_blocks=16, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
               chunk_size=0, bucketing="none")
    tok = [[100 + i for i in range(12)], [200 + i for i in range(12)], [300 + i for i in range(12)],
           [200 + i for i in range(4)] + [400 + i for i in range(8)]]
    step = dict(num_computed=[0, 4, 6, 4], num_scheduled=[8, 4, 1, 1], num_prompt=[8, 8, 5, 4],
                block_table=[[1, 2, 0], [3, 4, 0], [5, 6, 0], [3, 7, 0]], token_ids=tok, draft_tokens=None,
                async_scheduling=False)
    return cfg, step


def async_seed_rule_example():
    """Async scheduling where the two rules part: a spec decode sampling 2 positions and two partial prompts.
    num_reqs - num_logits == 1, so the seed appends a row (the last) and reports request 2; uattn sees two
    requests that sample nothing and appends none."""
    cfg, _ = docs_example()
    step = dict(num_computed=[9, 3, 5], num_scheduled=[3, 4, 2], num_prompt=[6, 20, 30],
                block_table=[[1, 2, 3], [4, 5, 0], [6, 7, 0]], token_ids=None,
                draft_tokens=[[17, -1], [], []], async_scheduling=True)
    return cfg, step


PARITY_KEYS = ["num_scheduled", "query_start_loc", "seq_lens", "is_prompt", "num_output_tokens", "token_groups",
               "token_offsets", "token_positions", "token_ids", "slot_mapping", "token_context_lens",
               "logits_indices", "logits_groups", "new_token_positions", "invalid_req_indices", "shared_blocks",
               "shared_usage", "causal_mask", "unique_blocks", "unique_block_mapping", "unique_usage",
               "exact_bucket", "padded_bucket", "bucket_fallback", "buckets"]


def parity_keys(ju, js, b):
    """The keys the seed agrees with uattn on (module docstring, choice 10)."""
    out = set(PARITY_KEYS)
    if "buckets" not in ju:
        out.discard("buckets")
    prompt = b["is_prompt"]
    if prompt.any() and (~prompt).any():
        out.discard("causal_mask")
    if ((~prompt) & (b["num_scheduled"] > 1)).any():
        out -= {"shared_blocks", "shared_usage", "unique_blocks", "unique_block_mapping", "unique_usage",
                "token_context_lens", "exact_bucket", "padded_bucket", "bucket_fallback"}
    su, ss = ju["invalid_req_indices"], js["invalid_req_indices"]
    if su or ss:
        out -= {"logits_groups", "new_token_positions", "exact_bucket", "padded_bucket"}
        if not (su == ss == [b["num_reqs"] - 1]):
            out -= {"logits_indices", "invalid_req_indices"}
    return [k for k in PARITY_KEYS if k in out]


def validate_step(cfg, step):
    """Asserts that a fixture's batch is one the C planner must accept: within the config's limits, every
    block id used in range, each block at one position only, blocks written this step private."""
    bs, R = cfg["block_size"], len(step["num_computed"])
    ns = apply_spec_rule(step["num_scheduled"], step.get("draft_tokens"))
    assert 1 <= R <= cfg["max_num_seqs"] and int(ns.sum()) <= cfg["max_num_batched_tokens"]
    assert len(set(len(row) for row in step["block_table"])) == 1
    where = {}
    for r in range(R):
        nc, n, npr = step["num_computed"][r], int(ns[r]), step["num_prompt"][r]
        seq = nc + n
        assert nc >= 0 and n >= 1 and npr >= 1 and seq <= cfg["max_model_len"]
        row = step["block_table"][r]
        assert len(row) * bs >= seq
        if step.get("token_ids") is not None:
            assert len(step["token_ids"][r]) >= seq
        for o in range(-(-seq // bs)):
            blk, writes = row[o], o * bs + bs > nc
            assert 1 <= blk < cfg["num_blocks"]
            if blk in where:
                o2, w2 = where[blk]
                assert o2 == o and not writes and not w2, "block %d reused badly" % blk
            where[blk] = (o, writes)


def make_case(name, cfg, step, buckets, first_of_config):
    validate_step(cfg, step)
    ou, b = plan(cfg, step, "uattn", buckets)
    os_, _ = plan(cfg, step, "seed", buckets)
    ju = to_json_outputs(ou, buckets if first_of_config and buckets is not None else None)
    js = to_json_outputs(os_, buckets if first_of_config and buckets is not None else None)
    if first_of_config and buckets is None:
        ju["buckets"] = []
        js["buckets"] = []
    par = parity_keys(ju, js, b)
    for k in par:
        assert ju[k] == js[k], "case %s: parity key %s differs" % (name, k)
    js["parity"] = par
    return {"name": name, "config": cfg, "step": step, "uattn": ju, "seed": js}


def generate(count, seed):
    g = random.Random(seed)
    cases = []
    seen = set()
    cfg, step = docs_example()
    cases.append(make_case("docs_example", cfg, step, None, True))
    seen.add(json.dumps(cfg, sort_keys=True))
    cfg, step = async_seed_rule_example()
    cases.append(make_case("async_seed_rule", cfg, step, None, False))
    configs = [_cfg_dict(t) for t in CONFIGS]
    bucket_lists = {}
    i = 0
    while len(cases) < count:
        cfg = configs[i % len(configs)]
        kind = KINDS[(i // len(configs) + i) % len(KINDS)]
        key = json.dumps(cfg, sort_keys=True)
        if key not in bucket_lists:
            bucket_lists[key] = generate_unified_buckets(cfg) if cfg["bucketing"] == "seed" else None
        step = random_case(g, cfg, kind)
        first = key not in seen
        seen.add(key)
        cases.append(make_case("%03d_%s_bs%d" % (len(cases), kind, cfg["block_size"]), cfg, step,
                               bucket_lists[key], first))
        i += 1
    ranges = []
    for cfg in configs:
        S, bs = cfg["max_num_seqs"], cfg["block_size"]
        for mn, mx in ((1, cfg["max_num_batched_tokens"]), (0, min(cfg["max_model_len"] // bs, cfg["num_blocks"])),
                       (0, cfg["num_blocks"])):
            ranges.append({"min": mn, "max": mx, "round_up": S, "values": bucket_range(mn, mx, S)})
    for mn, mx, ru in ((1, 1, 1), (0, 1, 1), (1, 8192, 128), (0, 10000, 256), (1, 7, 3), (0, 65536, 1),
                       (3, 1000, 5), (0, 2, 64)):
        ranges.append({"min": mn, "max": mx, "round_up": ru, "values": bucket_range(mn, mx, ru)})
    return {"cases": cases, "bucket_ranges": ranges}


def cmd_golden(args):
    t0 = time.perf_counter()
    data = generate(args.count, args.seed)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    dt = time.perf_counter() - t0
    sys.stderr.write("wrote %d cases to %s in %.1f s\n" % (len(data["cases"]), args.out, dt))


# ------------------------------------------------------------------------------------------------------
# Self-checks
# ------------------------------------------------------------------------------------------------------


def key_counts(o, step, bs):
    """For every query row, how many times each key position of its request is visible, derived only from
    the planner's outputs: the causal mask, the shared blocks with their dense usages, the unique list."""
    R = len(step["num_computed"])
    table = np.asarray(step["block_table"], dtype=np.int64).reshape(R, -1)
    groups, pos, seq = o["token_groups"], o["token_positions"], o["seq_lens"]
    T = groups.shape[0]
    shared, usage, causal = o["shared_blocks"], o["shared_usage"], o["causal_mask"]
    by_token = {}
    for blk, t, start, u in o["unique_blocks"].tolist():
        by_token.setdefault(t, []).append((blk, start, u))
    counts = []
    for t in range(T):
        r = int(groups[t])
        c = np.zeros(int(seq[r]), dtype=np.int64)
        ks = np.flatnonzero(causal[t])
        assert (groups[ks] == r).all(), "causal part crosses requests"
        np.add.at(c, pos[ks], 1)
        used = table[r, :-(-int(seq[r]) // bs)]
        for s in np.flatnonzero(usage[t]):
            off = np.flatnonzero(used == shared[s])
            assert off.shape[0] == 1
            c[off[0] * bs:off[0] * bs + usage[t, s]] += 1
        for blk, start, u in by_token.get(t, []):
            assert used[start // bs] == blk and start % bs == 0
            c[start:start + u] += 1
        counts.append(c)
    return counts


def check_exactly_once(o, step, bs, label):
    for t, c in enumerate(key_counts(o, step, bs)):
        p = int(o["token_positions"][t])
        assert (c[:p + 1] == 1).all() and (c[p + 1:] == 0).all(), \
            "%s: row %d (position %d) sees keys %s" % (label, t, p, c.tolist())


def check_seed_tensors(o, bs):
    """The seed's built biases agree with the dense usages and masks reported for it."""
    causal_bias, shared_bias, unique_bias = o["_biases"]
    if causal_bias is not None:
        assert ((causal_bias == 0) == (o["causal_mask"] == 1)).all()
    else:
        assert not o["causal_mask"].any()
    if shared_bias is not None:
        vis = np.arange(bs)[None, None, :] < o["shared_usage"][:, :, None]
        assert ((shared_bias == 0) == vis).all()
    if unique_bias is not None:
        vis = np.arange(bs)[None, :] < o["unique_usage"][:, None]
        assert ((unique_bias == 0) == vis).all()


def cmd_selftest(_args):
    io = indices_and_offsets(np.array([1, 2, 3]))
    assert io[0].tolist() == [0, 1, 1, 2, 2, 2] and io[1].tolist() == [0, 0, 1, 0, 1, 2]
    io = indices_and_offsets(np.array([0, 2, 0, 1, 0]))
    assert io[0].tolist() == [1, 1, 3] and io[1].tolist() == [0, 1, 0]

    # uattn: every row sees every key j <= pos of its request exactly once, on the docs example and on
    # every generated batch; the seed's built biases match the tensors reported for it.
    cfg, step = docs_example()
    o, _ = plan(cfg, step, "uattn")
    check_exactly_once(o, step, 4, "docs_example")
    data = generate(200, 7)
    n_rows = 0
    for case in data["cases"]:
        cfg, step = case["config"], case["step"]
        o, _ = plan(cfg, step, "uattn")
        check_exactly_once(o, step, cfg["block_size"], case["name"])
        n_rows += o["token_groups"].shape[0]
        if o["token_groups"].shape[0] * max(1, o["shared_blocks"].shape[0]) * cfg["block_size"] < 4 << 20:
            check_seed_tensors(plan(cfg, step, "seed", build_bias=True)[0], cfg["block_size"])

    # seed defect (a): in the docs example (prompts + decodes) the decode rows see their own key twice,
    # the prompt rows are right.
    cfg, step = docs_example()
    o, b = plan(cfg, step, "seed")
    counts = key_counts(o, step, 4)
    for t, c in enumerate(counts):
        p = int(o["token_positions"][t])
        if b["is_prompt"][o["token_groups"][t]]:
            assert (c[:p + 1] == 1).all() and (c[p + 1:] == 0).all()
        else:
            assert c[p] == 2 and (c[:p] == 1).all(), "seed defect (a) not reproduced: %s" % c.tolist()
    # ... and without a prompt in the batch it does not happen
    step2 = dict(step, num_computed=[6, 4], num_scheduled=[1, 1], num_prompt=[5, 4],
                 block_table=[[5, 6, 0], [3, 7, 0]], token_ids=None)
    check_exactly_once(plan(cfg, step2, "seed")[0], step2, 4, "seed decode-only")

    # seed defect (b): a spec-decode row sees the later drafts (keys past its own position).
    step3 = dict(num_computed=[5], num_scheduled=[4], num_prompt=[3], block_table=[[1, 2, 3]], token_ids=None,
                 draft_tokens=[[11, -1, 12, 13]], async_scheduling=False)
    o3, _ = plan(cfg, step3, "seed")
    assert o3["num_scheduled"].tolist() == [4]
    c3 = key_counts(o3, step3, 4)
    assert c3[0][6:].sum() == 3 and (c3[-1] == 1).all(), "seed defect (b) not reproduced"
    check_exactly_once(plan(cfg, step3, "uattn")[0], step3, 4, "spec uattn")

    # bucketing: sorted unique ranges ending at max; bucket lists sorted; lookups cover the batch
    assert bucket_range(0, 100, 8) == sorted(set(bucket_range(0, 100, 8))) and bucket_range(0, 100, 8)[-1] == 100
    # 512 ** (5/9) is 32.00000000000001 in double precision, so the seed's ceil gives 40, not 32
    assert bucket_range(1, 512, 8) == [8, 16, 40, 64, 128, 256, 512]
    tiny = dict(block_size=16, num_blocks=64, max_num_seqs=1, max_num_batched_tokens=8, max_model_len=64,
                chunk_size=0, bucketing="seed")
    assert all(b[3] == 1 or b[1] == 0 for b in generate_unified_buckets(tiny))  # query // 2 == 0 rejected
    for case in data["cases"]:
        u = case["uattn"]
        assert all(p >= e for p, e in zip(u["padded_bucket"], u["exact_bucket"]))
        if "buckets" in u:
            bl = [tuple(x) for x in u["buckets"]]
            assert bl == sorted(set(bl))
    print(json.dumps({"selftest": "ok", "cases": len(data["cases"]), "rows_checked": n_rows}))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("golden", help="write golden fixtures")
    p.add_argument("--out", required=True)
    p.add_argument("--count", type=int, default=300)
    p.add_argument("--seed", type=int, default=20240611)
    p.set_defaults(fn=cmd_golden)
    p = sub.add_parser("time", help="time the seed-mode planner on one batch")
    p.add_argument("--batch", required=True)
    p.add_argument("--repeat", type=int, default=20)
    p.set_defaults(fn=cmd_time)
    p = sub.add_parser("selftest", help="check this script")
    p.set_defaults(fn=cmd_selftest)
    args = ap.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
