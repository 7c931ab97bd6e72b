"""The dense float64 oracle of docs/design.md (dense_oracle: every query row against every visible key of its
request, soft cap, ALiBi, sinks, window, GQA), and key counts through seed-format tensors (key_counts,
exactly_once: each key j <= p of a row's request seen exactly once).
"""

import numpy as np

from .step import cache_as_nhd, to_f32

# ------------------------------------------------------------------------------------------------------
# The dense oracle (float64, docs/design.md)
# ------------------------------------------------------------------------------------------------------


def dense_oracle(st, key_cache, value_cache):
    """Every query row against every visible key of its request, in float64, each key as the (updated) cache
    holds it, this step's own too; decoder: j <= p and, with a window w, j > p - w; encoder:
    every key of the request. Soft cap, ALiBi, sinks (denominator only), GQA. Returns out [T, Hq, D] and
    lse [T, Hq] (-inf and zeros for a row with nothing visible). Values are head_dim_v wide; a kv_latent step's
    value of a key is the key's first head_dim_v dims as the key cache holds them (value_cache unused)."""
    G = st.hq // st.hkv
    kc = to_f32(cache_as_nhd(key_cache, st.layout, "key"), st.cache_dtype).astype(np.float64)
    vc = kc[..., :st.dv] if st.kv_latent else \
        to_f32(cache_as_nhd(value_cache, st.layout, "value"), st.cache_dtype).astype(np.float64)
    q = to_f32(st.q, st.dtype).astype(np.float64)
    out = np.zeros((st.T, st.hq, st.dv))
    lse = np.full((st.T, st.hq), -np.inf)
    sinks = None if st.sinks is None else st.sinks.astype(np.float64)
    slopes = None if st.alibi is None else st.alibi.astype(np.float64)
    for r in range(len(st.reqs)):
        nc, n, qs = int(st.nc[r]), int(st.ns[r]), int(st.qsl[r])
        seq = nc + n
        slots = np.array([st.slot(r, j) for j in range(seq)], dtype=np.int64)
        K, V = kc[slots], vc[slots]  # [seq, Hkv, D]
        K = np.repeat(K, G, axis=1)  # query head h reads KV head h // G
        V = np.repeat(V, G, axis=1)
        pos = nc + np.arange(n)
        j = np.arange(seq)
        if st.attn_type == "decoder":
            vis = j[None, :] <= pos[:, None]
            if st.window > 0:
                vis &= j[None, :] > pos[:, None] - st.window
        else:
            vis = np.ones((n, seq), dtype=bool)
        s = st.scale * np.einsum("thd,jhd->htj", q[qs:qs + n], K)  # [Hq, n, seq]
        if st.soft_cap > 0:
            s = st.soft_cap * np.tanh(s / st.soft_cap)
        if slopes is not None:
            s = s + slopes[:, None, None] * (j[None, None, :] - pos[None, :, None])
        s = np.where(vis[None], s, -np.inf)
        m = s.max(-1)  # [Hq, n]
        if sinks is not None:
            m = np.maximum(m, sinks[:, None])
        finite = np.isfinite(m)
        m_safe = np.where(finite, m, 0.0)
        p = np.exp(s - m_safe[..., None])
        den = p.sum(-1)
        if sinks is not None:
            den = den + np.exp(sinks[:, None] - m_safe)
        o = np.einsum("htj,jhd->thd", p, V)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[qs:qs + n] = np.where(finite.T[..., None], o / np.where(den > 0, den, 1.0).T[..., None], 0.0)
            lse[qs:qs + n] = np.where(finite & (den > 0), m_safe + np.log(den), -np.inf).T
    return out, lse


# ------------------------------------------------------------------------------------------------------
# Key counts through seed-format tensors
# ------------------------------------------------------------------------------------------------------


def key_counts(st, causal_bias, shared_blocks, shared_visible, unique_bias, unique_block_mapping):
    """For each row, how often each key position of its request is visible through seed-format tensors
    (0.0 = visible): the causal bias over this step's rows, shared_visible [T, S, bs] over the shared blocks,
    the unique bias over the blocks mapped to the row. Returns a list of int arrays (one per row), or raises
    AssertionError when a tensor reaches outside the row's request."""
    bs = st.bs
    counts = []
    where = []  # block id -> position offset, per request
    for r in range(len(st.reqs)):
        nb = -(-int(st.seq[r]) // bs)
        where.append({int(b): o for o, b in enumerate(st.tables[r][:nb])})
    ub = {}
    if unique_bias is not None:
        for blk in np.flatnonzero(np.asarray(unique_block_mapping) >= 0):
            ub.setdefault(int(unique_block_mapping[blk]), []).append(int(blk))
    for t in range(st.T):
        r = int(st.row_req[t])
        c = np.zeros(int(st.seq[r]), dtype=np.int64)
        if causal_bias is not None:
            cols = np.flatnonzero(causal_bias[t, :st.T] == 0)
            assert (causal_bias[t, st.T:] != 0).all(), "row %d: causal bias sees a padding row" % t
            assert (st.row_req[cols] == r).all(), "row %d: causal bias crosses requests" % t
            np.add.at(c, st.row_pos[cols], 1)
        if shared_visible is not None:
            for s, k in zip(*np.nonzero(shared_visible[t])):
                off = where[r].get(int(shared_blocks[s]))
                assert off is not None, "row %d: shared block %d is not its request's" % (t, shared_blocks[s])
                c[off * bs + k] += 1
        for blk in ub.get(t, []):
            off = where[r].get(blk)
            assert off is not None, "row %d: unique block %d is not its request's" % (t, blk)
            for k in np.flatnonzero(unique_bias[blk] == 0):
                c[off * bs + k] += 1
        counts.append(c)
    return counts


def exactly_once(st, counts):
    """Rows (with a description) whose keys j <= p are not each visible exactly once, or past p visible."""
    bad = []
    for t, c in enumerate(counts):
        p = int(st.row_pos[t])
        if not ((c[:p + 1] == 1).all() and (c[p + 1:] == 0).all()):
            bad.append("row %d (request %d, position %d): counts %s" % (t, st.row_req[t], p, c.tolist()))
    return bad
