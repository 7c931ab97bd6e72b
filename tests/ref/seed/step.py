"""Storage dtypes and the step model of seed_unified_attn.py: f32 / bf16 / f16 conversions with round to nearest
even and the tolerances, Step (STEP.json with its tensors and the per-row bookkeeping), the cache layouts
(NHD, HND, TILED) to and from NHD, the expected cache update, batch_view (a step in seed_unified_batch.py's
form) and write_step.
"""

import json
import os

import numpy as np

DTYPES = ["f32", "bf16", "f16"]
TOLERANCE = {"f32": 1e-5, "bf16": 4e-3, "f16": 1e-3}


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
        # multi-head latent attention (uattn.h): values dv wide; kv_latent: a key's first dv dims are its value
        self.dv = int(j.get("head_dim_v", 0)) or self.d
        self.kv_latent = bool(j.get("kv_latent", False))
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
        if self.kv_latent:
            self.v = self.k[..., :self.dv]  # the values a latent holds, in the step's dtype

    def latent_values(self, key_cache):
        """A kv_latent step's value cache as NHD [num_blocks * bs, Hkv, dv]: its key cache's first dv dims."""
        return cache_as_nhd(key_cache, self.layout, "key")[..., :self.dv]

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
    cache dtype with round to nearest even. Returns copies of the input caches after the update (a kv_latent
    step: the key cache and None, it has no value cache)."""
    out = []
    for which, cache, new in (("key", st.key_cache, st.k), ("value", st.value_cache, st.v)):
        if cache is None:
            out.append(None)
            continue
        c = cache_as_nhd(cache, st.layout, which).copy()
        vals = from_f32(to_f32(new, st.dtype), st.cache_dtype)  # [T, Hkv, D]
        for t in range(st.T):
            s = int(st.slots[t])
            if s >= 0:
                c[s] = vals[t]
        out.append(cache_from_nhd(c, st.layout, which, st.bs))
    return out


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
