#!/usr/bin/python3
"""Step-level parity for uattn-run: random steps, a dense oracle, and a numpy re-statement of the seed's attention.

Re-states `unified_attn` and its helpers from vllm_gaudi/extension/unified.py (partial_attn_causal,
partial_attn_shared, partial_attn_unique, merge, CacheUtils, block2batch, reduce_max) and PR 784's chunked
shared attention with dense biases and an online-softmax merge (vllm-gaudi). Run with Debian's /usr/bin/python3
(numpy 1.24); imports numpy, the standard library and the package seed/ beside it (seed/planner.py) only.

    seed_unified_attn.py make-step --out DIR --seed S [--kind KIND] [--dtype f32|bf16|f16] [--layout NHD|HND|TILED] ...
    seed_unified_attn.py check --step DIR/step.json --out OUTDIR      OUTDIR: uattn-run ... --dump-biases
    seed_unified_attn.py defects [--runner PATH/uattn-run]              the seed's two defects, shown on numbers
    seed_unified_attn.py selftest                                       checks this script itself

`check` prints one line per check (PASS / FAIL / SKIP) and exits 1 when any fails:
  cache-update   our own slot mapping writes this step's k/v, converted to the cache dtype with round to nearest
                 even, into copies of the input caches; the runner's key_cache.npy / value_cache.npy must be
                 bit-identical (and plan.json's slot_mapping equal to ours).
  oracle-out     a dense float64 oracle of docs/design.md against out.npy: max |out - ref| <= tol * max |ref|
  oracle-lse     the same oracle's log-sum-exp (sinks included) against lse.npy: max |lse - ref| <= tol *
                 max(1, max |ref|). tol: f32 1e-5, bf16 4e-3, f16 1e-3, of the coarser of dtype and cache_dtype.
  seed-tensors   the runner's seed-format tensors against an independent derivation (seed_unified_batch.py's
                 "uattn" mode): causal bias, shared blocks and usages, shared bias == PR 784's bias from the
                 usages, unique bias and block mapping; and every row sees each key j <= p of its request exactly
                 once through them (decoder steps).
  seed-parity    this script's re-statement of the seed's unified_attn, in float32, on the runner's seed-format
                 tensors and the runner's updated caches, against out.npy with the f32 tolerance (1e-5 x max
                 |ref|). The shared part runs whole (shared_bias.npy) and, when the step's chunk_size > 0, also
                 chunked (PR 784, from shared_usage.npy); both must match. Only for f32 decoder steps without soft
                 cap, ALiBi, sinks or sliding window: the seed has none of those.

Choices this script makes where the seed or the brief leaves room:
 1. Tensors the seed pads with -1: a shared block id of -1 (bucket padding) is fetched as block 0 (its bias is
    -inf); a unique block id whose mapping is -1 (no row reads it uniquely) is dropped before the math. The
    seed relies on one_hot(-1) being a zero row and on index_select tolerating -1; torch on CPU would raise.
 2. PR 784's chunk bias: key k of shared block s is visible to row t iff k < usage[t, s] (usage 0 = masked), the
    dense generator's `arange(1, bs + 1) > usage` comparison; the online merge starts from the first chunk and
    folds each next chunk in with m' = max(m, m_c), o = o e^(m - m') + o_c e^(m_c - m'), l likewise.
 3. The seed's CacheUtils reads NHD caches; an HND or TILED cache is rearranged into NHD for it (TILED: uattn's
    own layout, uattn.h, keys and values shaped apart).
 4. The seed's part is run on the runner's padded shape (tq query rows): q, k, v are padded with zeros to tq and
    the result trimmed to the step's T rows. The causal part is always present (uattn-run always dumps a causal
    bias, all -inf in a batch without prompts, which adds nothing); a shared or unique part with 0 blocks is None.
 5. The dense oracle reads every key from the updated cache, this step's own too, as uattn does
    (docs/design.md: every key as the cache holds it); its tolerance is the coarser dtype's, which that
    bounds. The seed reads a prompt's keys from k/v in its causal part: for seed parity on an f32 step over a
    bf16 or f16 cache it is given k and v rounded to the cache dtype (the values the cache holds), so both
    sides read the same values widened to f32.
 6. make-step kinds: decode, prefill, prefix-prefill (prompts over a common cached prefix), chunked (prompt
    chunks at unaligned offsets), mixed (all of them, multi-token non-prompt requests, two decodes over a shared
    prefix), spec-decode, shared-prefix (6-16 requests over one cached prefix); --long makes lengths 8x.
    causal_width, chunk_size and threads are random (sometimes absent) unless given. Block tables follow the
    rule: a block id at one position only, except fully cached prefix blocks common to a prefix group; blocks
    written this step private.
 7. make-step: block 0 may be used; rows of the block table may be longer than needed, padded with -1; draft
    lists hold random ids with some -1 placeholders; a request with drafts reports num_scheduled = 1 + len(drafts)
    and schedules (non -1 drafts) + 1 tokens.
"""

import argparse
import copy
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seed import planner as sub  # noqa: E402  (the seed's planner, re-stated)

KINDS = ["decode", "prefill", "prefix-prefill", "chunked", "mixed", "spec-decode", "shared-prefix"]
DTYPES = ["f32", "bf16", "f16"]
TOLERANCE = {"f32": 1e-5, "bf16": 4e-3, "f16": 1e-3}
FMIN = np.float32(np.finfo(np.float32).min)
FEPS = np.float32(np.finfo(np.float32).tiny)

# ------------------------------------------------------------------------------------------------------
# Storage dtypes: f32 as <f4, bf16 as <u2 (the upper 16 bits of an fp32), f16 as <f2
# ------------------------------------------------------------------------------------------------------


def f32_to_bf16_bits(x):
    """fp32 -> bf16 bits, rounding to nearest even (no NaNs here)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return ((u >> 16) & 0xFFFF).astype(np.uint16)


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_f32(a, dtype):
    """Stored values of `dtype` as float32 (exact)."""
    if dtype == "bf16":
        return bf16_bits_to_f32(a)
    return np.asarray(a).astype(np.float32)


def from_f32(x, dtype):
    """float32 -> stored values of `dtype`, rounding to nearest even."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "bf16":
        return f32_to_bf16_bits(x)
    if dtype == "f16":
        return x.astype(np.float16)
    return x.copy()


def storage_dtype(dtype):
    return {"f32": np.dtype("<f4"), "bf16": np.dtype("<u2"), "f16": np.dtype("<f2")}[dtype]


def coarser(a, b):
    """The dtype with the larger tolerance of the two."""
    return a if TOLERANCE[a] >= TOLERANCE[b] else b


# ------------------------------------------------------------------------------------------------------
# A step: reading STEP.json and the per-row bookkeeping (docs/design.md)
# ------------------------------------------------------------------------------------------------------


def effective_scheduled(req):
    """A request with >= 1 draft entry schedules (entries != -1) + 1 tokens; otherwise num_scheduled."""
    d = req.get("draft_tokens")
    if d:
        return sum(1 for x in d if x != -1) + 1
    return int(req["num_scheduled"])


class Step:
    """STEP.json with its tensors loaded, plus query_start_loc, per-row requests/positions and slots."""

    def __init__(self, path):
        self.path = path
        with open(path) as f:
            self.j = json.load(f)
        j = self.j
        self.bs = int(j["block_size"])
        self.num_blocks = int(j["num_blocks"])
        self.hq, self.hkv, self.d = int(j["num_q_heads"]), int(j["num_kv_heads"]), int(j["head_dim"])
        self.dtype, self.cache_dtype, self.layout = j["dtype"], j["cache_dtype"], j["kv_layout"]
        self.scale, self.soft_cap = float(j["scale"]), float(j["soft_cap"])
        self.window, self.attn_type = int(j["sliding_window"]), j["attn_type"]
        self.causal_width = int(j.get("causal_width", 0)) or 512
        self.chunk_size = int(j.get("chunk_size", 0))
        self.reqs = j["requests"]
        self.nc = np.array([r["num_computed"] for r in self.reqs], dtype=np.int64)
        self.ns = np.array([effective_scheduled(r) for r in self.reqs], dtype=np.int64)
        self.npr = np.array([r["num_prompt"] for r in self.reqs], dtype=np.int64)
        self.seq = self.nc + self.ns
        self.qsl = np.concatenate([[0], np.cumsum(self.ns)]).astype(np.int64)
        self.T = int(self.qsl[-1])
        self.tables = [list(r["block_table"]) for r in self.reqs]
        self.row_req = np.repeat(np.arange(len(self.reqs)), self.ns)
        self.row_pos = np.concatenate([self.nc[r] + np.arange(self.ns[r]) for r in range(len(self.reqs))])
        self.slots = np.array([self.slot(int(r), int(p)) for r, p in zip(self.row_req, self.row_pos)],
                              dtype=np.int64)
        base = os.path.dirname(os.path.abspath(path))
        t = j["tensors"]
        load = lambda k: np.load(os.path.join(base, t[k])) if k in t else None  # noqa: E731
        self.q, self.k, self.v = load("q"), load("k"), load("v")
        self.key_cache, self.value_cache = load("key_cache"), load("value_cache")
        self.sinks, self.alibi = load("sinks"), load("alibi_slopes")

    def slot(self, r, p):
        """The slot mapping: block_table[r][p // bs] * bs + p % bs."""
        return self.tables[r][p // self.bs] * self.bs + p % self.bs

    def plain_f32_decoder(self):
        """Why the seed cannot be compared on this step, or None when it can."""
        why = []
        if self.dtype != "f32":
            why.append("dtype %s" % self.dtype)
        if self.attn_type != "decoder":
            why.append("attn_type %s" % self.attn_type)
        if self.soft_cap > 0:
            why.append("soft cap")
        if self.alibi is not None:
            why.append("ALiBi")
        if self.sinks is not None:
            why.append("sinks")
        if self.window > 0:
            why.append("sliding window")
        return ", ".join(why) or None


TILE = 16  # keys of a tile of the TILED layout


def cache_as_nhd(cache, layout, which):
    """[num_blocks * bs, Hkv, D] of a cache (which: "key" or "value") in any layout. HND [nb, Hkv, bs, D] is
    transposed; TILED (uattn.h) is tiles of 16 keys, each tile every KV head in turn, keys
    [nb, bs/16, Hkv, D/2, 16, 2] (key t*16 + i, dim 2p + e at [b, t, h, p, i, e]) and values
    [nb, bs/16, Hkv, 8, D, 2] (key t*16 + 2r + e, dim d at [b, t, h, r, d, e])."""
    if layout == "NHD":
        return cache
    if layout == "HND":
        nb, h, bs, d = cache.shape
        return cache.transpose(0, 2, 1, 3).reshape(nb * bs, h, d)
    nb, tiles, h = cache.shape[:3]
    if which == "key":  # [b, t, h, p, i, e] -> [b, t, i, h, p, e]
        return cache.transpose(0, 1, 4, 2, 3, 5).reshape(nb * tiles * TILE, h, 2 * cache.shape[3])
    return cache.transpose(0, 1, 3, 5, 2, 4).reshape(nb * tiles * TILE, h, cache.shape[4])  # -> [b, t, r, e, h, d]


def cache_from_nhd(nhd, layout, which, bs):
    """cache_as_nhd's inverse: an NHD cache [num_blocks * bs, Hkv, D] in the layout's own shape."""
    if layout == "NHD":
        return nhd
    n, h, d = nhd.shape
    nb = n // bs
    if layout == "HND":
        return np.ascontiguousarray(nhd.reshape(nb, bs, h, d).transpose(0, 2, 1, 3))
    if which == "key":  # [b, t, i, h, p, e] -> [b, t, h, p, i, e]
        return np.ascontiguousarray(nhd.reshape(nb, bs // TILE, TILE, h, d // 2, 2).transpose(0, 1, 3, 4, 2, 5))
    return np.ascontiguousarray(nhd.reshape(nb, bs // TILE, TILE // 2, 2, h, d).transpose(0, 1, 4, 2, 5, 3))


def expected_caches(st):
    """The cache update of docs/design.md: this step's k/v of row t written at slot(t), converted to the
    cache dtype with round to nearest even. Returns copies of the input caches after the update."""
    out = []
    for which, cache, new in (("key", st.key_cache, st.k), ("value", st.value_cache, st.v)):
        c = cache_as_nhd(cache, st.layout, which).copy()
        vals = from_f32(to_f32(new, st.dtype), st.cache_dtype)  # [T, Hkv, D]
        for t in range(st.T):
            s = int(st.slots[t])
            if s >= 0:
                c[s] = vals[t]
        out.append(cache_from_nhd(c, st.layout, which, st.bs))
    return out


# ------------------------------------------------------------------------------------------------------
# The dense oracle (float64, docs/design.md)
# ------------------------------------------------------------------------------------------------------


def dense_oracle(st, key_cache, value_cache):
    """Every query row against every visible key of its request, in float64, each key as the (updated) cache
    holds it, this step's own too; decoder: j <= p and, with a window w, j > p - w; encoder:
    every key of the request. Soft cap, ALiBi, sinks (denominator only), GQA. Returns out [T, Hq, D] and
    lse [T, Hq] (-inf and zeros for a row with nothing visible)."""
    G = st.hq // st.hkv
    kc = to_f32(cache_as_nhd(key_cache, st.layout, "key"), st.cache_dtype).astype(np.float64)
    vc = to_f32(cache_as_nhd(value_cache, st.layout, "value"), st.cache_dtype).astype(np.float64)
    q = to_f32(st.q, st.dtype).astype(np.float64)
    out = np.zeros((st.T, st.hq, st.d))
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
# The seed's attention (vllm-gaudi's unified.py) and PR 784's chunked shared part, in float32
# ------------------------------------------------------------------------------------------------------


class CacheUtils:
    """Re-states the seed's CacheUtils: fetch_shared / fetch_unique over NHD caches [num_blocks * bs, Hkv, D]."""

    def __init__(self, key_cache, value_cache, block_size):
        self.key_cache = key_cache
        self.value_cache = value_cache
        self.block_size = block_size
        self.kv_heads = key_cache.shape[1]

    def fetch_shared(self, blocks):
        """CacheUtils.fetch_shared: keys and values of the selected blocks, [Hkv, 1, S * bs, D] each."""
        return self._fetch_single_shared(self.key_cache, blocks), self._fetch_single_shared(self.value_cache, blocks)

    def fetch_unique(self, blocks):
        """CacheUtils.fetch_unique: the first `blocks` blocks (an int) or the selected ones, [n, Hkv, 1, bs, D]."""
        return self._fetch_single_unique(self.key_cache, blocks), self._fetch_single_unique(self.value_cache, blocks)

    def _fetch_single_shared(self, cache, blocks):
        """CacheUtils._fetch_single_shared: unflatten(0, (-1, bs)).index_select(0, blocks).flatten(0, 1)
        .transpose(0, 1).unflatten(0, (kv_heads, -1)). A padding id -1 reads block 0 (choice 1)."""
        bs, h, d = self.block_size, self.kv_heads, cache.shape[-1]
        blocks = np.where(np.asarray(blocks) < 0, 0, blocks)
        x = cache.reshape(-1, bs, h, d)[blocks].reshape(-1, h, d).transpose(1, 0, 2)
        return x.reshape(h, 1, -1, d)

    def _fetch_single_unique(self, cache, blocks):
        """CacheUtils._fetch_single_unique: unflatten(0, (-1, bs)).transpose(1, 2), then cache[:blocks] (int) or
        index_select, then unflatten(1, (kv_heads, -1))."""
        bs, h, d = self.block_size, self.kv_heads, cache.shape[-1]
        x = cache.reshape(-1, bs, h, d).transpose(0, 2, 1, 3)
        x = x[:blocks] if isinstance(blocks, int) else x[np.asarray(blocks)]
        return x.reshape(x.shape[0], h, 1, bs, d)


def block2batch(tensor, block_mapping):
    """Re-states the seed's block2batch: matmul(block_mapping.t(), tensor.flatten(1, -1)).unflatten(-1, ...)."""
    flat = tensor.reshape(tensor.shape[0], -1)
    return (block_mapping.T @ flat).reshape((block_mapping.shape[1],) + tensor.shape[1:])


def reduce_max(local_max, batch_size, mapping):
    """Re-states the seed's reduce_max: per-group amax of block maxima (index_reduce_ 'amax' into -inf)."""
    shape_suffix = local_max.shape[1:]
    flat = local_max.reshape(local_max.shape[0], -1)
    group_max = np.full((batch_size, flat.shape[1]), -np.inf, dtype=local_max.dtype)
    np.maximum.at(group_max, mapping, flat)
    return group_max.reshape((batch_size,) + shape_suffix)


def partial_attn_causal(query, key, value, bias, slice_size, fmin):
    """Re-states the seed's partial_attn_causal: this step's queries against this step's keys with bias [T, T],
    in query slices of slice_size rows, each slice against keys [0, slice end). Returns (attn [T, Hq, D],
    max [T, Hq], sum [T, Hq]) or Nones without a bias."""
    if bias is None:
        return (None, None, None)
    T, hq, d = query.shape
    num_slices = math.ceil(T / slice_size)
    kv_heads = key.shape[1]
    query = query.transpose(1, 0, 2).reshape(kv_heads, hq // kv_heads, T, d)
    key = key.transpose(1, 0, 2).reshape(kv_heads, 1, T, d)
    value = value.transpose(1, 0, 2).reshape(kv_heads, 1, T, d)
    attn_slices, max_slices, sum_slices = [], [], []
    for i in range(num_slices):
        q_min = i * slice_size
        q_max = q_min + slice_size
        q = query[:, :, q_min:q_max, :]
        k = key[:, :, 0:q_max, :]
        v = value[:, :, 0:q_max, :]
        b = bias[q_min:q_max, 0:q_max]
        s_attn = np.matmul(q, k.swapaxes(-1, -2)) + b[None, None]
        s_max = np.maximum(s_attn.max(-1), fmin)
        s_attn = np.exp(s_attn - s_max[..., None])
        s_sum = np.sum(s_attn, -1)
        s_attn = np.matmul(s_attn, v)
        attn_slices.append(s_attn)
        max_slices.append(s_max)
        sum_slices.append(s_sum)

    def combine(slices):
        """combine: cat(dim=2).flatten(0, 1).transpose(0, 1)"""
        x = np.concatenate(slices, axis=2)
        x = x.reshape((hq,) + x.shape[2:])
        return np.swapaxes(x, 0, 1)

    return combine(attn_slices), combine(max_slices), combine(sum_slices)


def _partial_attn_shared_core(query, key, value, bias, fmin):
    """Re-states PR 784's _partial_attn_shared_core (the seed's partial_attn_shared body): query [Hkv, G, T, D]
    against key/value [Hkv, 1, S * bs, D] with bias [1, T, S * bs]."""
    kv_heads = key.shape[0]
    attn = np.matmul(query, key.swapaxes(-1, -2))
    attn = attn.reshape((-1,) + attn.shape[2:])  # flatten(0, 1): [Hq, T, S * bs]
    attn = attn + bias
    local_max = np.maximum(attn.max(-1), fmin)
    attn = np.exp(attn - local_max[..., None])
    local_sum = attn.sum(-1)
    attn = np.matmul(attn.reshape((kv_heads, -1) + attn.shape[1:]), value)
    attn = attn.reshape((-1,) + attn.shape[2:])
    return attn.swapaxes(0, 1), local_max.swapaxes(0, 1), local_sum.swapaxes(0, 1)


def shared_chunk_bias(block_usages, block_size):
    """Re-states PR 784's HPUSharedBiasGeneratorDense: bias [T, S, bs] from the dense usage table [T, S]:
    key k of a block is visible (0.0) iff k < usage (usage 0 = masked), else -inf (choice 2)."""
    block_len_range = np.arange(1, block_size + 1)
    mask = block_len_range[None, None, :] > np.asarray(block_usages)[:, :, None]
    return np.where(mask, np.float32(-np.inf), np.float32(0.0)).astype(np.float32)


def _partial_attn_shared_chunked(query, blocks, block_usages, chunk_size, fmin, cache_utils):
    """Re-states PR 784's _partial_attn_shared_chunked: chunk_size shared blocks at a time, each chunk's bias
    from block_usages[:, chunk], merged online (max_new = max(max, max_chunk) and the rescale, choice 2)."""
    bs = cache_utils.block_size
    acc = None
    for c0 in range(0, len(blocks), chunk_size):
        key, value = cache_utils.fetch_shared(blocks[c0:c0 + chunk_size])
        bias = shared_chunk_bias(block_usages[:, c0:c0 + chunk_size], bs)
        o, m, l_ = _partial_attn_shared_core(query, key, value, bias.reshape(1, bias.shape[0], -1), fmin)
        if acc is None:
            acc = (o, m, l_)
            continue
        o0, m0, l0 = acc
        m_new = np.maximum(m0, m)
        a, b = np.exp(m0 - m_new), np.exp(m - m_new)
        acc = (o0 * a[..., None] + o * b[..., None], m_new, l0 * a + l_ * b)
    return acc


class SharedChunked:
    """PR 784's SharedBlockChunkedBiasData: the dense usage table [T, S] and the chunk size."""

    def __init__(self, block_usages, chunk_size):
        self.block_usages = block_usages
        self.chunk_size = chunk_size


def partial_attn_shared(query, blocks, bias, fmin, cache_utils):
    """Re-states the seed's partial_attn_shared (whole: bias [T, S, bs]) and PR 784's dispatch to the chunked
    form (bias a SharedChunked). All T queries against all shared blocks."""
    if bias is None:
        return (None, None, None)
    kv_heads = cache_utils.kv_heads
    T, hq, d = query.shape
    query = query.transpose(1, 0, 2).reshape(kv_heads, hq // kv_heads, T, d)
    if isinstance(bias, SharedChunked):
        return _partial_attn_shared_chunked(query, blocks, bias.block_usages, bias.chunk_size, fmin, cache_utils)
    key, value = cache_utils.fetch_shared(blocks)
    return _partial_attn_shared_core(query, key, value, bias.reshape(1, T, -1), fmin)


def partial_attn_unique(query, blocks, block_mapping, bias, fmin, cache_utils):
    """Re-states the seed's partial_attn_unique: each block read by one query row, attention per block, then per
    row the group max (reduce_max), the rescale and the sums (block2batch). blocks is the seed's int (the first
    `blocks` block ids); ids whose mapping is -1 are dropped first (choice 1)."""
    if bias is None:
        return (None, None, None)
    batch_size = query.shape[0]
    kv_heads = cache_utils.kv_heads
    keep = np.flatnonzero(np.asarray(block_mapping)[:blocks] >= 0)
    block_mapping = np.asarray(block_mapping)[keep]
    bias = bias[keep]
    query = query[block_mapping]
    query = query.reshape(query.shape[0], kv_heads, -1, query.shape[-1])[:, :, :, None, :]
    key, value = cache_utils.fetch_unique(blocks)
    key, value = key[keep], value[keep]
    block_mapping_2d = np.zeros((block_mapping.shape[0], batch_size), dtype=query.dtype)  # one_hot
    block_mapping_2d[np.arange(block_mapping.shape[0]), block_mapping] = 1

    attn = np.matmul(query, key.swapaxes(-1, -2))
    attn = attn + bias[:, None, None, None, :]
    block_max = np.maximum(attn.max(-1), fmin)
    attn = np.exp(attn - block_max[..., None])
    block_sum = attn.sum(-1)
    attn = np.matmul(attn, value)

    group_max = reduce_max(block_max, batch_size, block_mapping)
    block_adjustment = np.exp(block_max - group_max[block_mapping])
    block_sum = block_sum * block_adjustment
    group_sum = block2batch(block_sum, block_mapping_2d)
    attn = attn * block_adjustment[..., None]
    attn = block2batch(attn, block_mapping_2d)

    def flatten_1_3(x):
        """flatten(1, 3): [T, Hkv, G, 1, ...] -> [T, Hq, ...]"""
        return x.reshape((x.shape[0], -1) + x.shape[4:])

    return flatten_1_3(attn), flatten_1_3(group_max), flatten_1_3(group_sum)


def merge(*attn_results, feps):
    """Re-states the seed's merge (with `optional`: None parts are skipped): M = max M_i, a_i = exp(M_i - M),
    out = sum O_i * (a_i / max(sum L_i a_i, feps))."""
    parts = [p for p in attn_results if p[0] is not None]
    if not parts:
        return None
    all_attn, all_max, all_sum = zip(*parts)
    global_max = all_max[0]
    for m in all_max[1:]:
        global_max = np.maximum(global_max, m)
    all_adj = [np.exp(m - global_max) for m in all_max]
    global_sum = all_sum[0] * all_adj[0]
    for s, a in zip(all_sum[1:], all_adj[1:]):
        global_sum = global_sum + s * a
    global_sum = np.maximum(global_sum, feps)
    attn = None
    for o, a in zip(all_attn, all_adj):
        x = o * (a / global_sum)[..., None]
        attn = x if attn is None else attn + x
    return attn


def unified_attn(query, key, value, key_cache, value_cache, scale, metadata):
    """Re-states the seed's unified_attn: scaled query; causal, shared and unique partials; merge. metadata has
    the seed's fields (block_size, causal_bias, causal_width, shared_blocks, shared_bias, unique_blocks,
    unique_block_mapping, unique_bias, fmin, feps); shared_bias may be a SharedChunked (PR 784)."""
    scaled_query = query * np.float32(scale)
    cache_utils = CacheUtils(key_cache, value_cache, metadata.block_size)
    causal = partial_attn_causal(scaled_query, key, value, metadata.causal_bias, metadata.causal_width,
                                 metadata.fmin)
    shared = partial_attn_shared(scaled_query, metadata.shared_blocks, metadata.shared_bias, metadata.fmin,
                                 cache_utils)
    unique = partial_attn_unique(scaled_query, metadata.unique_blocks, metadata.unique_block_mapping,
                                 metadata.unique_bias, metadata.fmin, cache_utils)
    attn = merge(causal, shared, unique, feps=metadata.feps)
    if attn is None:
        return query
    return attn


def run_seed(st, key_cache, value_cache, meta):
    """unified_attn on the step in float32: q, k, v padded with zeros to the metadata's tq rows (choice 4), the
    caches as NHD float32; returns [T, Hq, D]."""
    tq = meta.causal_bias.shape[0] if meta.causal_bias is not None else st.T

    def pad(x):
        y = np.zeros((tq,) + x.shape[1:], dtype=np.float32)
        y[:st.T] = x
        return y

    q = pad(to_f32(st.q, st.dtype))
    # this step's keys as the cache holds them (choice 5)
    k, v = (pad(to_f32(from_f32(to_f32(x, st.dtype), st.cache_dtype), st.cache_dtype)) for x in (st.k, st.v))
    kc = to_f32(cache_as_nhd(key_cache, st.layout, "key"), st.cache_dtype)
    vc = to_f32(cache_as_nhd(value_cache, st.layout, "value"), st.cache_dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        out = unified_attn(q, k, v, kc, vc, st.scale, meta)
    return out[:st.T]


def seed_metadata(bs, causal_bias, causal_width, shared_blocks, shared_bias, unique_bias, unique_block_mapping):
    """HPUUnifiedAttentionMetadata's attention fields; a part with no blocks is None (choice 4)."""
    ts = 0 if shared_blocks is None else int(np.asarray(shared_blocks).shape[0])
    tu = 0 if unique_bias is None else int(unique_bias.shape[0])
    return types.SimpleNamespace(
        block_size=bs, causal_bias=causal_bias, causal_width=causal_width,
        shared_blocks=np.asarray(shared_blocks) if ts else None, shared_bias=shared_bias if ts else None,
        unique_blocks=tu, unique_block_mapping=unique_block_mapping if tu else None,
        unique_bias=unique_bias if tu else None, fmin=FMIN, feps=FEPS)


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


# ------------------------------------------------------------------------------------------------------
# make-step
# ------------------------------------------------------------------------------------------------------


# Lengths of prompts and contexts are multiplied by this (make-step --long sets 8: steps past 512 rows).
LENGTH_SCALE = 1


def _n(rng, lo, hi):
    """A random length in [lo * LENGTH_SCALE, hi * LENGTH_SCALE)."""
    return int(rng.integers(lo * LENGTH_SCALE, hi * LENGTH_SCALE))


def _req(nc, ns, npr, drafts=None):
    return {"nc": int(nc), "ns": int(ns), "npr": int(npr), "drafts": drafts}


def _decode(rng):
    npr = _n(rng, 1, 60)
    return _req(npr + _n(rng, 0, 40), 1, npr)


def _prefill(rng, hi=60):
    npr = _n(rng, 1, hi)
    return _req(0, npr, npr)


def _prefix_prefill(rng, bs, prefix_blocks=None):
    pb = prefix_blocks if prefix_blocks is not None else int(rng.integers(1, 5))
    nc = pb * bs
    npr = nc + _n(rng, 1, 40)
    return _req(nc, npr - nc, npr)


def _chunked(rng):
    npr = _n(rng, 20, 120)
    nc = int(rng.integers(1, npr))
    return _req(nc, int(rng.integers(1, npr - nc + 1)), npr)


def _spec(rng):
    npr = _n(rng, 1, 40)
    n = int(rng.integers(1, 5))
    drafts = [int(x) if rng.random() > 0.25 else -1 for x in rng.integers(1, 32000, n)]
    ns = sum(1 for x in drafts if x != -1) + 1
    return _req(npr + int(rng.integers(0, 30)), ns, npr, drafts)


def _multi_token_decode(rng):
    """A request past its prompt scheduling several tokens without drafts (uattn treats it as a decode)."""
    npr = int(rng.integers(1, 30))
    return _req(npr + int(rng.integers(0, 20)), int(rng.integers(2, 5)), npr)


def random_requests(rng, kind, bs):
    """A kind's requests and prefix groups: (list of _req, list of (member indices, prefix blocks))."""
    groups = []
    if kind == "decode":
        reqs = [_decode(rng) for _ in range(int(rng.integers(1, 7)))]
    elif kind == "prefill":
        reqs = [_prefill(rng) for _ in range(int(rng.integers(1, 4)))]
    elif kind == "prefix-prefill":
        pb = int(rng.integers(1, 4))
        reqs = [_prefix_prefill(rng, bs, pb) for _ in range(int(rng.integers(2, 4)))]
        groups.append((list(range(len(reqs))), pb))
        reqs.append(_prefix_prefill(rng, bs))
    elif kind == "chunked":
        reqs = [_chunked(rng) for _ in range(int(rng.integers(1, 4)))]
    elif kind == "mixed":
        makers = [lambda: _decode(rng), lambda: _prefill(rng, 40), lambda: _prefix_prefill(rng, bs),
                  lambda: _chunked(rng), lambda: _spec(rng), lambda: _multi_token_decode(rng)]
        reqs = [_prefill(rng, 40), _decode(rng)]
        reqs += [makers[int(rng.integers(0, len(makers)))]() for _ in range(int(rng.integers(1, 5)))]
        # two decodes over a common cached prefix (parallel sampling)
        pb = int(rng.integers(1, 3))
        npr = pb * bs + int(rng.integers(0, bs))
        a, b = len(reqs), len(reqs) + 1
        reqs += [_req(npr + int(rng.integers(0, 10)), 1, npr), _req(npr + int(rng.integers(0, 10)), 1, npr)]
        groups.append(([a, b], pb))
    elif kind == "spec-decode":
        reqs = [_spec(rng) for _ in range(int(rng.integers(1, 5)))]
        reqs += [_decode(rng) for _ in range(int(rng.integers(0, 3)))]
    elif kind == "shared-prefix":
        pb = int(rng.integers(2, 7))
        reqs = []
        for _ in range(int(rng.integers(6, 17))):
            nc = pb * bs + int(rng.integers(0, 2 * bs))
            x = rng.random()
            if x < 0.6:
                reqs.append(_req(nc, 1, pb * bs))
            elif x < 0.8:
                drafts = [int(v) for v in rng.integers(1, 32000, int(rng.integers(1, 4)))]
                reqs.append(_req(nc, len(drafts) + 1, pb * bs, drafts))
            else:
                ns = int(rng.integers(1, 12))
                reqs.append(_req(nc, ns, nc + ns))
        groups.append((list(range(len(reqs))), pb))
    else:
        raise SystemExit("make-step: unknown kind %r (one of %s)" % (kind, ", ".join(KINDS)))
    return reqs, groups


def allocate_blocks(rng, reqs, groups, bs, spare):
    """Block tables: each prefix group's first blocks are common (fully cached in every member), every other
    block private; ids shuffled over num_blocks = needed + spare. Rows may carry -1 padding."""
    in_group = {}  # request -> (group index, common prefix blocks)
    group_blocks = []
    for gi, (members, pb) in enumerate(groups):
        pb = min([pb] + [reqs[m]["nc"] // bs for m in members])  # fully cached in every member
        group_blocks.append(pb)
        for m in members:
            in_group[m] = (gi, pb)
    needed = [-(-(r["nc"] + r["ns"]) // bs) for r in reqs]
    prefix_ids = {}
    num_blocks = sum(needed) - sum(pb for _, pb in in_group.values()) + sum(group_blocks) + spare
    ids = [int(x) for x in rng.permutation(num_blocks)]
    tables = []
    for i, r in enumerate(reqs):
        row = []
        gid, pb = in_group.get(i, (None, 0))
        if gid is not None and gid not in prefix_ids:
            prefix_ids[gid] = [ids.pop() for _ in range(pb)]
        row += prefix_ids[gid] if gid is not None else []
        row += [ids.pop() for _ in range(needed[i] - len(row))]
        row += [-1] * int(rng.integers(0, 3))
        tables.append(row)
    return tables, num_blocks


def validate_tables(reqs, tables, bs):
    """Asserts the brief's rule: a block id at one position only across requests unless it is a fully cached
    prefix block at the same position in every request holding it; blocks written this step private."""
    where = {}
    for i, (r, row) in enumerate(zip(reqs, tables)):
        for o in range(-(-(r["nc"] + r["ns"]) // bs)):
            blk, cached = row[o], (o + 1) * bs <= r["nc"]
            assert blk >= 0
            if blk in where:
                o2, cached2, i2 = where[blk]
                assert i2 != i and o2 == o and cached and cached2, "block %d reused badly" % blk
            where[blk] = (o, cached, i)


def cmd_make_step(args):
    global LENGTH_SCALE
    LENGTH_SCALE = 8 if args.long else 1
    rng = np.random.default_rng(args.seed)
    kind = args.kind
    bs = args.block_size or int(rng.choice([16, 32] if args.layout == "TILED" else [4, 8, 16, 16]))
    heads = [(8, 2), (4, 4), (4, 1), (6, 3), (2, 1), (8, 8)]
    hq, hkv = heads[int(rng.integers(0, len(heads)))]
    hq, hkv = args.num_q_heads or hq, args.num_kv_heads or hkv
    if hq % hkv:
        hkv = hq
    d = args.head_dim or int(rng.choice([16, 32, 64]))
    if args.layout == "TILED" and (bs % TILE or d % 2):
        raise SystemExit("make-step: TILED needs a block size that is a multiple of %d and an even head dim "
                         "(got %d, %d)" % (TILE, bs, d))
    cache_dtype = args.cache_dtype or args.dtype
    reqs, groups = random_requests(rng, kind, bs)
    if args.attn_type == "encoder":  # an encoder-only model: whole prompts, no cached context
        reqs = [_req(0, r["ns"] + r["nc"], r["ns"] + r["nc"]) for r in reqs]
        groups = []
    tables, num_blocks = allocate_blocks(rng, reqs, groups, bs, int(rng.integers(0, 6)))
    validate_tables(reqs, tables, bs)
    T = sum(r["ns"] for r in reqs)

    step = {"block_size": bs, "num_blocks": num_blocks, "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d,
            "dtype": args.dtype, "cache_dtype": cache_dtype, "kv_layout": args.layout,
            "scale": float(args.scale if args.scale is not None else 1.0 / math.sqrt(d)),
            "soft_cap": float(args.soft_cap), "sliding_window": int(args.sliding_window),
            "attn_type": args.attn_type}
    cw = args.causal_width if args.causal_width is not None else int(rng.choice([-1, 4, 7, 16, 512]))
    if cw >= 0:
        step["causal_width"] = cw
    cs = args.chunk_size if args.chunk_size is not None else int(rng.choice([-1, 0, 1, 2, 3]))
    if cs >= 0:
        step["chunk_size"] = cs
    if args.threads is not None or rng.random() < 0.5:
        step["threads"] = args.threads if args.threads is not None else int(rng.integers(1, 3))
    step["requests"] = []
    for r, row in zip(reqs, tables):
        e = {"num_computed": r["nc"], "num_scheduled": r["ns"], "num_prompt": r["npr"], "block_table": row}
        if r["drafts"]:
            e["num_scheduled"] = 1 + len(r["drafts"])
            e["draft_tokens"] = r["drafts"]
        step["requests"].append(e)

    os.makedirs(args.out, exist_ok=True)
    sd = storage_dtype(args.dtype)
    tensors = {}

    def save(name, key, arr):
        np.save(os.path.join(args.out, name), np.ascontiguousarray(arr))
        tensors[key] = name

    qk_scale = args.qk_scale
    save("q.npy", "q", from_f32(rng.standard_normal((T, hq, d)) * qk_scale, args.dtype).astype(sd))
    save("k.npy", "k", from_f32(rng.standard_normal((T, hkv, d)) * qk_scale, args.dtype).astype(sd))
    save("v.npy", "v", from_f32(rng.standard_normal((T, hkv, d)), args.dtype).astype(sd))
    cd = storage_dtype(cache_dtype)
    for name, key, std in (("kc.npy", "key_cache", qk_scale), ("vc.npy", "value_cache", 1.0)):
        nhd = from_f32(rng.standard_normal((num_blocks * bs, hkv, d)) * std, cache_dtype).astype(cd)
        save(name, key, cache_from_nhd(nhd, args.layout, key[:-len("_cache")], bs))
    if args.sinks:
        save("sinks.npy", "sinks", (rng.standard_normal(hq) * 2).astype(np.float32))
    if args.alibi:
        slopes = 2.0 ** (-8.0 * (np.arange(hq) + 1) / hq)
        save("alibi.npy", "alibi_slopes", slopes.astype(np.float32))
    step["tensors"] = tensors
    path = os.path.join(args.out, "step.json")
    with open(path, "w") as f:
        json.dump(step, f, indent=1)
    print("make-step: %s: kind %s, %d requests, %d query rows, bs %d, %s/%s %s, Hq %d Hkv %d D %d -> %s"
          % (args.seed, kind, len(reqs), T, bs, args.dtype, cache_dtype, args.layout, hq, hkv, d, path))


# ------------------------------------------------------------------------------------------------------
# check
# ------------------------------------------------------------------------------------------------------


class Report:
    """One line per check; remembers failures."""

    def __init__(self):
        self.failed = []

    def line(self, status, name, text):
        print("%-4s %-13s %s" % (status, name, text))
        sys.stdout.flush()
        if status == "FAIL":
            self.failed.append(name)

    def check(self, ok, name, text):
        self.line("PASS" if ok else "FAIL", name, text)


def compare(a, ref, tol, floor=0.0):
    """(ok, max abs error, bound, worst index) for max |a - ref| <= tol * max(floor, max |ref|)."""
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    both_inf = np.isneginf(a) & np.isneginf(ref)
    err = np.where(both_inf, 0.0, np.abs(a - ref))
    err = np.where(np.isnan(err), np.inf, err)
    scale = max(floor, float(np.max(np.abs(np.where(np.isfinite(ref), ref, 0.0)))) if ref.size else 0.0)
    bound = tol * scale
    worst = np.unravel_index(int(np.argmax(err)), err.shape) if err.size else ()
    mx = float(err.max()) if err.size else 0.0
    return mx <= bound, mx, bound, tuple(int(i) for i in worst)


def batch_view(st):
    """The step in seed_unified_batch.py's form (rectangular block table padded with -1)."""
    width = max(len(t) for t in st.tables)
    cfg = dict(block_size=st.bs, num_blocks=st.num_blocks, max_num_seqs=len(st.reqs), max_num_batched_tokens=st.T,
               max_model_len=int(st.seq.max()), chunk_size=0, bucketing="none")
    step = dict(num_computed=st.nc.tolist(), num_scheduled=[int(r["num_scheduled"]) for r in st.reqs],
                num_prompt=st.npr.tolist(), block_table=[t + [-1] * (width - len(t)) for t in st.tables],
                token_ids=None, draft_tokens=[r.get("draft_tokens") or [] for r in st.reqs],
                async_scheduling=False)
    return cfg, step


def load_outputs(outdir):
    o = {}
    for name in ("out", "lse", "key_cache", "value_cache", "causal_bias", "shared_bias", "shared_usage",
                 "unique_bias", "unique_block_mapping", "shared_blocks"):
        p = os.path.join(outdir, name + ".npy")
        o[name] = np.load(p) if os.path.exists(p) else None
    p = os.path.join(outdir, "plan.json")
    o["plan"] = json.load(open(p)) if os.path.exists(p) else None
    return o


def check_cache(st, o, rep):
    kc, vc = expected_caches(st)
    if o["key_cache"] is None or o["value_cache"] is None:
        rep.line("FAIL", "cache-update", "key_cache.npy / value_cache.npy missing")
        return kc, vc
    msgs = []
    for name, want, got in (("key", kc, o["key_cache"]), ("value", vc, o["value_cache"])):
        if got.dtype != want.dtype or got.shape != want.shape:
            msgs.append("%s cache %s %s, expected %s %s" % (name, got.dtype, got.shape, want.dtype, want.shape))
        elif not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
            diff = np.flatnonzero((got != want).reshape(got.shape[0], -1).any(-1))
            msgs.append("%s cache differs in %d rows of dim 0 (first %s)" % (name, diff.size, diff[:5].tolist()))
    plan = o["plan"]
    if plan is not None and plan.get("slot_mapping") != st.slots.tolist():
        msgs.append("plan.json slot_mapping %s != ours %s" % (plan.get("slot_mapping")[:16], st.slots[:16].tolist()))
    rep.check(not msgs, "cache-update", "; ".join(msgs) or
              "both caches bit-identical to ours (%d slots written, %s -> %s, %s)"
              % (st.T, st.dtype, st.cache_dtype, st.layout))
    return kc, vc


def check_oracle(st, o, kc, vc, rep):
    ref_out, ref_lse = dense_oracle(st, kc, vc)
    tname = coarser(st.dtype, st.cache_dtype)
    tol = TOLERANCE[tname]
    out, lse = o["out"], o["lse"]
    if out is None or out.shape != ref_out.shape:
        rep.line("FAIL", "oracle-out", "out.npy %s, expected [T, Hq, D] = %s"
                 % (None if out is None else out.shape, ref_out.shape))
    else:
        ok, mx, bound, w = compare(out, ref_out, tol)
        # A bf16 layer on a bf16 cache may take P V with P rounded to bf16 (uattn.h, probs_fp32: 2^-9 relative
        # each), on top of the output's own rounding: up to 2^-9 of the weighted |v|, sum_j p_j |v_j|, which is
        # the oracle's attention over |v| (bf16 bits: the sign bit cleared).
        p_round = 0.0
        if st.dtype == "bf16" and st.cache_dtype == "bf16":
            st_abs = copy.copy(st)
            st_abs.v = st.v & np.uint16(0x7FFF)
            weighted, _ = dense_oracle(st_abs, kc, vc & np.uint16(0x7FFF))
            p_round = 2.0 ** -9 * float(np.abs(weighted).max())
            ok, bound = mx <= bound + p_round, bound + p_round
        ok = ok and bool(np.isfinite(out).all())
        rep.check(ok, "oracle-out", "max abs err %.3g <= %.3g (%s tol %g x max|ref| %.3g%s)%s"
                  % (mx, bound, tname, tol, (bound - p_round) / tol if tol else 0,
                     " + 2^-9 max sum p|v| %.3g for P in bf16" % p_round if p_round else "",
                     "" if ok else "; worst at [t, h, d] = %s (request %d, position %d)"
                     % (w, st.row_req[w[0]], st.row_pos[w[0]])))
    if lse is None or lse.shape != ref_lse.shape:
        rep.line("FAIL", "oracle-lse", "lse.npy %s, expected [T, Hq] = %s"
                 % (None if lse is None else lse.shape, ref_lse.shape))
    else:
        ok, mx, bound, w = compare(lse, ref_lse, tol, floor=1.0)
        rep.check(ok, "oracle-lse", "max abs err %.3g <= %.3g (%s tol %g x max(1, max|ref|))%s"
                  % (mx, bound, tname, tol, "" if ok else "; worst at [t, h] = %s" % (w,)))
    return ref_out


def check_seed_tensors(st, o, rep):
    """The runner's seed tensors against seed_unified_batch.py's uattn mode, and exactly-once key counts."""
    need = ("causal_bias", "shared_usage", "unique_bias", "unique_block_mapping", "shared_blocks")
    missing = [n for n in need if o[n] is None]
    if missing:
        rep.line("FAIL", "seed-tensors", "missing %s.npy (run uattn-run with --dump-biases)" % ", ".join(missing))
        return False
    if o["causal_bias"].ndim != 2 or o["shared_usage"].ndim != 2 or o["unique_bias"].ndim != 2:
        rep.line("FAIL", "seed-tensors", "causal_bias, shared_usage and unique_bias must be 2-D")
        return False
    cfg, step = batch_view(st)
    ref, _ = sub.plan(cfg, step, "uattn")
    msgs = []
    T, bs = st.T, st.bs
    cb, su, ub, um, sb = (o[n] for n in need)
    tq = cb.shape[0]
    if cb.shape != (tq, tq) or tq < T:
        msgs.append("causal_bias shape %s" % (cb.shape,))
    else:
        mask = np.zeros((tq, tq), dtype=bool)
        mask[:T, :T] = ref["causal_mask"] == 1
        if st.attn_type == "decoder" and not np.array_equal(cb == 0, mask):
            msgs.append("causal_bias differs from the uattn-mode causal mask")
        if not np.all((cb == 0) | np.isneginf(cb)):
            msgs.append("causal_bias holds values other than 0 and -inf")
    S = int(ref["shared_blocks"].shape[0])
    if sb.shape[0] < S or sb[:S].tolist() != ref["shared_blocks"].tolist() or (sb[S:] != -1).any():
        msgs.append("shared_blocks %s != %s" % (sb.tolist()[:12], ref["shared_blocks"].tolist()[:12]))
    elif su.shape != (tq, sb.shape[0]) or not np.array_equal(su[:T, :S], ref["shared_usage"]) or su[T:].any() \
            or su[:, S:].any():
        msgs.append("shared_usage differs from the uattn-mode usages")
    if o["shared_bias"] is not None and su.ndim == 2:
        if not np.array_equal(o["shared_bias"], shared_chunk_bias(su, bs)):
            msgs.append("shared_bias is not PR 784's bias of shared_usage")
    tu = int(ref["unique_usage"].shape[0])
    if ub.shape[0] < tu or um.shape[0] != ub.shape[0]:
        msgs.append("unique tensors shapes %s %s, expected >= %d ids" % (ub.shape, um.shape, tu))
    else:
        want_map = np.full(ub.shape[0], -1, dtype=np.int64)
        want_map[:tu] = ref["unique_block_mapping"]
        want_use = np.zeros(ub.shape[0], dtype=np.int64)
        want_use[:tu] = ref["unique_usage"]
        if not np.array_equal(um, want_map):
            msgs.append("unique_block_mapping differs")
        if not np.array_equal(ub, sub.generate_bias(want_use, bs) if ub.shape[0] else ub):
            msgs.append("unique_bias differs from the uattn-mode usages")
    if not msgs and st.attn_type == "decoder":
        try:
            vis = (shared_chunk_bias(su[:T], bs) == 0) if S else None
            bad = exactly_once(st, key_counts(st, cb, sb, vis, ub, um))
        except AssertionError as e:
            bad = [str(e)]
        if bad:
            msgs.append("keys not seen exactly once: %s%s" % (bad[0], " (+%d rows)" % (len(bad) - 1)
                                                                 if len(bad) > 1 else ""))
    rep.check(not msgs, "seed-tensors", "; ".join(msgs) or
              "causal [%d, %d], %d shared blocks (usage [%d, %d]%s), %d unique ids: equal to the uattn-mode plan%s"
              % (tq, tq, S, su.shape[0], su.shape[1], ", bias from usage" if o["shared_bias"] is not None
                 else ", no shared_bias.npy", tu,
                 "; every key j <= p seen exactly once" if st.attn_type == "decoder" else ""))
    return True  # present and well-formed: parity can run on them, right or wrong


def check_parity(st, o, ref_out, rep, tensors_ok):
    why = st.plain_f32_decoder()
    if why:
        rep.line("SKIP", "seed-parity", "%s: the seed has no such feature (parity runs on f32 decoder steps "
                 "without soft cap, ALiBi, sinks or window)" % why)
        return
    if not tensors_ok or o["out"] is None:
        rep.line("FAIL", "seed-parity", "needs well-formed seed-format tensors and out.npy")
        return
    tol = TOLERANCE["f32"]
    kc, vc = o["key_cache"], o["value_cache"]
    variants = []
    if o["shared_bias"] is not None:
        variants.append(("whole", o["shared_bias"]))
    else:
        variants.append(("whole*", shared_chunk_bias(o["shared_usage"], st.bs)))
    if st.chunk_size > 0:
        variants.append(("chunk %d" % st.chunk_size, SharedChunked(o["shared_usage"], st.chunk_size)))
    msgs, ok_all = [], True
    for label, shared in variants:
        meta = seed_metadata(st.bs, o["causal_bias"], st.causal_width, o["shared_blocks"], shared,
                             o["unique_bias"], o["unique_block_mapping"])
        seed_out = run_seed(st, kc, vc, meta)
        ok, mx, bound, w = compare(o["out"], seed_out, tol)
        _, mx_or, _, _ = compare(seed_out, ref_out, tol)
        ok = ok and bool(np.isfinite(seed_out).all())
        ok_all &= ok
        msgs.append("%s: max abs err vs out %.3g <= %.3g%s (vs oracle %.3g)"
                    % (label, mx, bound, "" if ok else " FAILS at %s" % (w,), mx_or))
    rep.check(ok_all, "seed-parity", "; ".join(msgs) + " (f32 tol %g x max|ref|, causal_width %d%s)"
              % (tol, st.causal_width, "; whole* = bias rebuilt from usage, shared_bias.npy absent"
                 if o["shared_bias"] is None else ""))


def cmd_check(args):
    t0 = time.perf_counter()
    st = Step(args.step)
    o = load_outputs(args.out)
    rep = Report()
    kc, vc = check_cache(st, o, rep)
    ref_out = check_oracle(st, o, kc, vc, rep)
    tensors_ok = check_seed_tensors(st, o, rep)
    check_parity(st, o, ref_out, rep, tensors_ok)
    dt = time.perf_counter() - t0
    print("%s %s: %d requests, %d rows, %s%s (%.2f s)" % ("FAILED" if rep.failed else "ok", args.step,
                                                          len(st.reqs), st.T, st.dtype,
                                                          " [%s]" % ", ".join(rep.failed) if rep.failed else "", dt))
    return 1 if rep.failed else 0


# ------------------------------------------------------------------------------------------------------
# defects: the seed's own literal metadata against the oracle
# ------------------------------------------------------------------------------------------------------


def write_step(dirpath, step, arrays):
    """Writes step.json and its tensors (arrays: name -> (file, array))."""
    os.makedirs(dirpath, exist_ok=True)
    step = dict(step, tensors={})
    for key, (fname, arr) in arrays.items():
        np.save(os.path.join(dirpath, fname), np.ascontiguousarray(arr))
        step["tensors"][key] = fname
    path = os.path.join(dirpath, "step.json")
    with open(path, "w") as f:
        json.dump(step, f, indent=1)
    return path


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


# ------------------------------------------------------------------------------------------------------
# selftest
# ------------------------------------------------------------------------------------------------------


def cmd_selftest(args):
    tmp = tempfile.mkdtemp(prefix="uattn-selftest-")
    try:
        # bf16 rounding: to nearest, ties to even
        x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -8 + 2 ** -20, -2.5], dtype=np.float32)
        assert bf16_bits_to_f32(f32_to_bf16_bits(x)).tolist() == [1.0, 1.0, 1.0 + 2 ** -6, 1.0 + 2 ** -7, -2.5]

        # the layouts: every element where uattn.h's index puts it, written out element by element here, and
        # back (3 blocks of 32 keys, 3 KV heads, head dim 6)
        nb, bs, h, d = 3, 32, 3, 6
        nhd = np.arange(nb * bs * h * d, dtype=np.float32).reshape(nb * bs, h, d)
        for layout in ("HND", "TILED"):
            for which in ("key", "value"):
                c = cache_from_nhd(nhd, layout, which, bs).ravel()
                for b, j, g, e in ((0, 0, 0, 0), (1, 17, 2, 5), (2, 31, 1, 3), (1, 14, 0, 4), (2, 3, 2, 1)):
                    t, i = divmod(j, TILE)
                    if layout == "HND":
                        at = ((b * h + g) * bs + j) * d + e
                    elif which == "key":
                        at = ((((b * (bs // TILE) + t) * h + g) * (d // 2) + e // 2) * TILE + i) * 2 + e % 2
                    else:
                        at = ((((b * (bs // TILE) + t) * h + g) * (TILE // 2) + i // 2) * d + e) * 2 + i % 2
                    assert c[at] == nhd[b * bs + j, g, e], (layout, which, b, j, g, e)
                back = cache_as_nhd(cache_from_nhd(nhd, layout, which, bs), layout, which)
                assert np.array_equal(back, nhd), (layout, which)

        # dense oracle on a hand-made 2-key example: one request, prompt of 2 tokens, D = 1, one head
        step = {"block_size": 2, "num_blocks": 1, "num_q_heads": 1, "num_kv_heads": 1, "head_dim": 1,
                "dtype": "f32", "cache_dtype": "f32", "kv_layout": "NHD", "scale": 1.0, "soft_cap": 0.0,
                "sliding_window": 0, "attn_type": "decoder",
                "requests": [{"num_computed": 0, "num_scheduled": 2, "num_prompt": 2, "block_table": [0]}]}
        f = lambda a: a.astype(np.float32)  # noqa: E731
        arr = {"q": ("q.npy", f(np.array([[[1.0]], [[2.0]]]))), "k": ("k.npy", f(np.array([[[0.5]], [[1.5]]]))),
               "v": ("v.npy", f(np.array([[[3.0]], [[-1.0]]]))), "key_cache": ("kc.npy", f(np.zeros((2, 1, 1)))),
               "value_cache": ("vc.npy", f(np.zeros((2, 1, 1))))}
        st = Step(write_step(os.path.join(tmp, "two"), step, arr))
        kc, vc = expected_caches(st)
        assert kc[:, 0, 0].tolist() == [0.5, 1.5] and vc[:, 0, 0].tolist() == [3.0, -1.0]
        out, lse = dense_oracle(st, kc, vc)
        s = np.array([2 * 0.5, 2 * 1.5])  # row 1 sees both keys
        w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        assert abs(out[0, 0, 0] - 3.0) < 1e-12 and abs(lse[0, 0] - 0.5) < 1e-12  # row 0 sees key 0 only
        assert abs(out[1, 0, 0] - (w[0] * 3.0 - w[1])) < 1e-12
        assert abs(lse[1, 0] - np.log(np.exp(s).sum())) < 1e-12
        # ... with a sink: the denominator grows, the numerator does not
        st.sinks = np.array([0.25], dtype=np.float32)
        out_s, lse_s = dense_oracle(st, kc, vc)
        assert abs(out_s[0, 0, 0] - 3.0 * np.exp(0.5) / (np.exp(0.5) + np.exp(0.25))) < 1e-12
        assert abs(lse_s[0, 0] - np.log(np.exp(0.5) + np.exp(0.25))) < 1e-12
        # ... with a window of 1: each row sees itself only
        st.sinks, st.window = None, 1
        out_w, _ = dense_oracle(st, kc, vc)
        assert abs(out_w[1, 0, 0] + 1.0) < 1e-12
        st.window = 0
        # the seed on the same example, with the causal bias only
        cb = np.array([[0, -np.inf], [0, 0]], dtype=np.float32)
        seed = run_seed(st, kc, vc, seed_metadata(2, cb, 1, None, None, None, None))
        assert np.abs(seed - out).max() < 1e-6

        # the seed's merge on an all-empty row gives zeros (fmin / feps guards), not NaN
        D = 3
        empty = (np.zeros((1, 2, D), np.float32), np.full((1, 2), FMIN, np.float32), np.zeros((1, 2), np.float32))
        m = merge(empty, empty, (None, None, None), feps=FEPS)
        assert np.isfinite(m).all() and not m.any()
        causal_all_masked = partial_attn_causal(np.ones((2, 2, D), np.float32), np.ones((2, 1, D), np.float32),
                                                np.ones((2, 1, D), np.float32),
                                                np.full((2, 2), -np.inf, np.float32), 512, FMIN)
        m = merge(causal_all_masked, feps=FEPS)
        assert np.isfinite(m).all() and not m.any()

        # whole vs chunked shared attention agree (chunk sizes 1..S+1), and with the dense oracle on random steps
        rng = np.random.default_rng(3)
        bs, hkv, G, d, T, S = 4, 2, 3, 8, 7, 5
        kcache = rng.standard_normal((12 * bs, hkv, d)).astype(np.float32)
        vcache = rng.standard_normal((12 * bs, hkv, d)).astype(np.float32)
        cu = CacheUtils(kcache, vcache, bs)
        q = rng.standard_normal((T, hkv * G, d)).astype(np.float32)
        blocks = np.array([3, 9, 0, 5, -1])
        usage = rng.integers(0, bs + 1, (T, S))
        usage[:, 4] = 0  # a padding block
        usage[2] = 0  # a row with no shared key at all
        whole = partial_attn_shared(q, blocks, shared_chunk_bias(usage, bs), FMIN, cu)
        ref = merge(whole, feps=FEPS)
        for cs in range(1, S + 2):
            ch = merge(partial_attn_shared(q, blocks, SharedChunked(usage, cs), FMIN, cu), feps=FEPS)
            assert np.abs(ch - ref).max() <= 1e-6 * np.abs(ref).max(), cs
        assert not ref[2].any()

        # the whole pipeline on random plain steps of every kind: uattn-mode metadata == oracle
        n = 0
        for i, kind in enumerate(KINDS):
            a = argparse.Namespace(out=os.path.join(tmp, "k%d" % i), seed=100 + i, kind=kind, dtype="f32",
                                   cache_dtype=None, layout=["NHD", "HND", "TILED"][i % 3], block_size=None, num_q_heads=None,
                                   num_kv_heads=None, head_dim=None, scale=None, soft_cap=0.0, sliding_window=0,
                                   attn_type="decoder", causal_width=None, chunk_size=None, threads=None, sinks=False,
                                   alibi=False, qk_scale=1.0, long=False)
            with open(os.devnull, "w") as devnull:
                saved, sys.stdout = sys.stdout, devnull
                try:
                    cmd_make_step(a)
                finally:
                    sys.stdout = saved
            st = Step(os.path.join(a.out, "step.json"))
            kc, vc = expected_caches(st)
            ref_out, _ = dense_oracle(st, kc, vc)
            cfg, step = batch_view(st)
            u, _ = sub.plan(cfg, step, "uattn")
            cb = np.where(u["causal_mask"] == 1, np.float32(0), np.float32(-np.inf)).astype(np.float32)
            ubias = sub.generate_bias(u["unique_usage"], st.bs) if u["unique_usage"].size else None
            vis = (shared_chunk_bias(u["shared_usage"], st.bs) == 0) if u["shared_blocks"].size else None
            bad = exactly_once(st, key_counts(st, cb, u["shared_blocks"], vis, ubias, u["unique_block_mapping"]))
            assert not bad, (kind, bad[:2])
            for shared in (shared_chunk_bias(u["shared_usage"], st.bs), SharedChunked(u["shared_usage"], 2)):
                meta = seed_metadata(st.bs, cb, st.causal_width, u["shared_blocks"], shared, ubias,
                                     u["unique_block_mapping"])
                ok, mx, bound, _ = compare(run_seed(st, kc, vc, meta), ref_out, TOLERANCE["f32"])
                assert ok, (kind, mx, bound)
            n += st.T
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rc = cmd_defects(argparse.Namespace(runner=None, keep=False))
    if rc:
        return rc
    print(json.dumps({"selftest": "ok", "kinds": len(KINDS), "rows_checked": n}))
    return 0


# ------------------------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sp = ap.add_subparsers(dest="cmd", required=True)
    p = sp.add_parser("make-step", help="write a random valid step")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--kind", choices=KINDS, default="mixed")
    p.add_argument("--dtype", choices=DTYPES, default="f32")
    p.add_argument("--cache-dtype", choices=DTYPES, default=None, help="default: --dtype")
    p.add_argument("--layout", choices=["NHD", "HND", "TILED"], default="NHD")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--num-q-heads", type=int, default=None)
    p.add_argument("--num-kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=None)
    p.add_argument("--scale", type=float, default=None, help="default 1/sqrt(head_dim)")
    p.add_argument("--qk-scale", type=float, default=1.0, help="std of q, k and the key cache (softmax sharpness)")
    p.add_argument("--soft-cap", type=float, default=0.0)
    p.add_argument("--sliding-window", type=int, default=0)
    p.add_argument("--attn-type", choices=["decoder", "encoder"], default="decoder")
    p.add_argument("--causal-width", type=int, default=None, help="default: random, sometimes absent")
    p.add_argument("--chunk-size", type=int, default=None, help="default: random, sometimes absent")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--sinks", action="store_true")
    p.add_argument("--alibi", action="store_true")
    p.add_argument("--long", action="store_true", help="prompts and contexts 8x longer (steps past 512 rows)")
    p.set_defaults(fn=cmd_make_step)
    p = sp.add_parser("check", help="check uattn-run's outputs for a step")
    p.add_argument("--step", required=True)
    p.add_argument("--out", required=True, help="the directory uattn-run --dump-biases wrote")
    p.set_defaults(fn=cmd_check)
    p = sp.add_parser("defects", help="the seed's literal metadata against the oracle")
    p.add_argument("--runner", default=None, help="also run this uattn-run on the step")
    p.add_argument("--keep", action="store_true", help="keep the temporary step")
    p.set_defaults(fn=cmd_defects)
    p = sp.add_parser("selftest", help="check this script")
    p.set_defaults(fn=cmd_selftest)
    args = ap.parse_args(argv)
    return args.fn(args) or 0


if __name__ == "__main__":
    sys.exit(main())
