"""The seed's unified-batch planner re-stated in numpy: the seed's helpers (indices_and_offsets, fetch_2d,
group_sum, mask_to_bias, generate_bias, create_causal_bias, Context), its unified bucketing (bucket_range,
generate_unified_buckets, select_bucket) and the planner itself in its two modes, "seed" (create_unified_batch
read literally) and "uattn" (the C planner's semantics): common_prep, seed_context, uattn_context, plan, and
to_json_outputs (the fixture's form). The choices behind every rule are numbered in
tests/ref/seed_unified_batch.py's docstring.
"""

import math

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
# Bucketing (the seed's unified bucketing; seed_unified_batch.py's docstring, choices 4-6)
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
    """The uattn semantics (seed_unified_batch.py's docstring): per-row context lengths and usages, a block shared when
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
