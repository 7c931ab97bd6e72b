"""The seed's attention re-stated in numpy, float32: vllm_gaudi/extension/unified.py's CacheUtils, block2batch,
reduce_max, partial_attn_causal, partial_attn_shared, partial_attn_unique, merge and unified_attn, PR 784's
chunked shared part with dense biases (shared_chunk_bias, SharedChunked, online merge), and run_seed /
seed_metadata to run it on a step. Names follow vllm_gaudi's.
"""

import math
import types

import numpy as np

from .step import cache_as_nhd, from_f32, to_f32

FMIN = np.float32(np.finfo(np.float32).min)
FEPS = np.float32(np.finfo(np.float32).tiny)


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
    value = value.transpose(1, 0, 2).reshape(kv_heads, 1, T, value.shape[-1])
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
    caches as NHD float32; returns [T, Hq, Dv]. A kv_latent step's value_cache is given as NHD already (its
    key cache's first head_dim_v dims, choice 8)."""
    tq = meta.causal_bias.shape[0] if meta.causal_bias is not None else st.T

    def pad(x):
        y = np.zeros((tq,) + x.shape[1:], dtype=np.float32)
        y[:st.T] = x
        return y

    q = pad(to_f32(st.q, st.dtype))
    # this step's keys as the cache holds them (choice 5)
    k, v = (pad(to_f32(from_f32(to_f32(x, st.dtype), st.cache_dtype), st.cache_dtype)) for x in (st.k, st.v))
    kc = to_f32(cache_as_nhd(key_cache, st.layout, "key"), st.cache_dtype)
    vc = to_f32(value_cache if st.kv_latent else cache_as_nhd(value_cache, st.layout, "value"), st.cache_dtype)
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
