"""The tests' ground truth and a small paged-cache engine to drive uattn with.

`dense_attention` is attention as docs/design.md defines it, in float64 over each request's whole key
history, unpaged, written from the definition (nothing here is taken from uattn). `PagedSim` keeps that
history next to a paged cache it hands to uattn, allocates blocks, plans steps and checks every row of every
forward against the dense result.
"""
import math

import numpy as np

import uattn

STORAGE = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}
# output tolerance: the output is rounded to its dtype, on top of fp32 accumulation
TOL = {"f32": 2e-5, "f16": 2e-3, "bf16": 1.2e-2}


def bf16_bits(x):
    """float -> bf16 bits, round to nearest even (the usual conversion)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def to_storage(x, dtype):
    """float64 values -> the array uattn reads for dtype (bf16 as its uint16 bits)."""
    if dtype == "bf16":
        return bf16_bits(x)
    return np.asarray(x, dtype=STORAGE[dtype])


def from_storage(a, dtype):
    return (bf16_value(a) if dtype == "bf16" else np.asarray(a, dtype=np.float32)).astype(np.float64)


def representable(x, dtypes):
    """Rounds x so that every dtype in dtypes holds it exactly: then a test's inputs, k/v written to the
    cache and the reference all see the same numbers, whatever the conversions on the way."""
    x = np.asarray(x, dtype=np.float64)
    if "f16" in dtypes:
        x = x.astype(np.float16).astype(np.float64)
    if "bf16" in dtypes:
        x = bf16_value(bf16_bits(x)).astype(np.float64)
    return x.astype(np.float32).astype(np.float64)


def dense_attention(q, keys, values, q_pos, scale, soft_cap=0.0, window=0, sinks=None, alibi=None,
                    causal=True):
    """One request. q [n, Hq, D] at positions q_pos [n]; keys/values [S, Hkv, D], key j at position j.
    Returns out [n, Hq, D] and lse [n, Hq] (natural log, the sink included) in float64."""
    n, hq, d = q.shape
    s, hkv, _ = keys.shape
    group = hq // hkv
    k = np.repeat(keys, group, axis=1)  # [S, Hq, D]: query head h reads KV head h // group
    v = np.repeat(values, group, axis=1)
    score = scale * np.einsum("nhd,shd->hns", q, k)
    if soft_cap > 0:
        score = soft_cap * np.tanh(score / soft_cap)
    j = np.arange(s)[None, None, :]
    p = np.asarray(q_pos)[None, :, None]
    if alibi is not None:
        score = score + np.asarray(alibi, dtype=np.float64)[:, None, None] * (j - p)
    visible = np.ones_like(score, dtype=bool)
    if causal:
        visible &= j <= p
    if window > 0:
        visible &= j > p - window
    score = np.where(visible, score, -np.inf)
    m = score.max(axis=2, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, np.asarray(sinks, dtype=np.float64)[:, None, None])
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(score - m)
    denom = e.sum(axis=2, keepdims=True)
    if sinks is not None:
        denom = denom + np.exp(np.asarray(sinks, dtype=np.float64)[:, None, None] - m)
    out = np.einsum("hns,shd->nhd", np.where(denom > 0, e / np.where(denom > 0, denom, 1), 0), v)
    with np.errstate(divide="ignore"):
        lse = (np.log(denom) + m)[:, :, 0].T
    return out, lse


def cache_shapes(layout, num_blocks, bs, hkv, d):
    """The (key, value) cache shapes of a layout, from uattn.h: NHD and HND shape both caches alike; TILED
    puts each block's keys in tiles of 16, keys as dim pairs of 16 keys, values as key pairs of D dims."""
    if layout == "NHD":
        return ((num_blocks * bs, hkv, d),) * 2
    if layout == "HND":
        return ((num_blocks, hkv, bs, d),) * 2
    return (num_blocks, bs // 16, hkv, d // 2, 16, 2), (num_blocks, bs // 16, hkv, 8, d, 2)


def _cache_index(layout, bs, slots, value):
    """The index of the [n, Hkv, D] entries at slots (TILED keys: [n, Hkv, D / 2, 2], dim d = 2 p + e) of a
    key (value False) or value cache of the layout. TILED, uattn.h: key i = o % 16 of tile o // 16 of block
    b (o = slot % bs) at [b, tile, h, d // 2, i, d % 2], its value at [b, tile, h, i // 2, d, i % 2]."""
    slots = np.asarray(slots)
    b, o = slots // bs, slots % bs
    if layout == "NHD":
        return (slots,)
    if layout == "HND":
        return (b, slice(None), o)
    t, i = o // 16, o % 16
    if value:
        return (b, t, slice(None), i // 2, slice(None), i % 2)
    return (b, t, slice(None), slice(None), i, slice(None))


def cache_get(cache, layout, bs, slots, value):
    """The entries at slots of a key (value False) or value cache of the layout, as [n, Hkv, D]."""
    x = cache[_cache_index(layout, bs, slots, value)]
    return x.reshape(x.shape[0], x.shape[1], -1)


def cache_put(cache, layout, bs, slots, value, x):
    """Writes x [n, Hkv, D] at slots of a key (value False) or value cache of the layout."""
    x = np.asarray(x)
    if layout == "TILED" and not value:
        x = x.reshape(x.shape[0], x.shape[1], -1, 2)
    cache[_cache_index(layout, bs, slots, value)] = x


class PagedSim:
    """A paged KV cache with its requests: block allocation, block tables, the plan's step, the forward,
    and the dense check of every row."""

    def __init__(self, hq=4, hkv=2, d=64, bs=16, num_blocks=64, dtype="f32", cache_dtype=None, layout="NHD",
                 max_seqs=16, max_tokens=512, max_model_len=1024, seed=0, plan_kw=None, **layer_kw):
        self.hq, self.hkv, self.d, self.bs, self.nb = hq, hkv, d, bs, num_blocks
        self.dtype, self.cache_dtype = dtype, cache_dtype or dtype
        self.layout = layout
        self.layer_kw = layer_kw
        self.layer = uattn.Layer(hq, hkv, d, dtype=dtype, cache_dtype=self.cache_dtype, kv_layout=layout,
                                 **layer_kw)
        self.plan = uattn.Plan(bs, num_blocks, max_seqs, max_tokens, max_model_len, **(plan_kw or {}))
        kshape, vshape = cache_shapes(layout, num_blocks, bs, hkv, d)
        self.key_cache = np.zeros(kshape, dtype=STORAGE[self.cache_dtype])
        self.value_cache = np.zeros(vshape, dtype=STORAGE[self.cache_dtype])
        self.rng = np.random.default_rng(seed)
        self.free = list(self.rng.permutation(num_blocks))  # blocks handed out in a scattered order
        self.reqs = {}  # id -> dict(keys, values, blocks, computed, prompt)
        self.dts = {self.dtype, self.cache_dtype}

    # -- requests -----------------------------------------------------------------------------------
    def add(self, rid, prompt_len, share_from=None, shared_blocks=0):
        """A request; with share_from, its first shared_blocks blocks are another request's (a cached
        prefix): they are computed already and their keys are that request's."""
        r = dict(keys=np.zeros((0, self.hkv, self.d)), values=np.zeros((0, self.hkv, self.d)), blocks=[],
                 computed=0, prompt=prompt_len)
        if share_from is not None:
            src = self.reqs[share_from]
            n = shared_blocks * self.bs
            assert src["computed"] >= n
            r["blocks"] = list(src["blocks"][:shared_blocks])
            r["keys"], r["values"] = src["keys"][:n].copy(), src["values"][:n].copy()
            r["computed"] = n
        self.reqs[rid] = r

    def finish(self, rid, shared_blocks=0):
        r = self.reqs.pop(rid)
        self.free.extend(r["blocks"][shared_blocks:])

    def _ensure_blocks(self, r, upto):
        while len(r["blocks"]) * self.bs < upto:
            r["blocks"].append(self.free.pop(0))

    # -- a step --------------------------------------------------------------------------------------
    def step(self, schedule, drafts=None, runtime=None, check=True, out=None, return_lse=True):
        """schedule: {rid: num_scheduled}; drafts: {rid: [draft ids]} (num_scheduled = drafts + 1).
        Runs plan.step and forward; returns (out, lse, info, refs)."""
        ids = list(schedule)
        nsched = [schedule[i] for i in ids]
        if drafts:
            nsched = [len(drafts.get(i, [])) + 1 if drafts.get(i) else n for i, n in zip(ids, nsched)]
        for rid, n in zip(ids, nsched):
            self._ensure_blocks(self.reqs[rid], self.reqs[rid]["computed"] + n)
        width = max(len(self.reqs[i]["blocks"]) for i in ids)
        table = np.zeros((len(ids), width), dtype=np.int32)
        for row, rid in enumerate(ids):
            b = self.reqs[rid]["blocks"]
            table[row, :len(b)] = b
        comp = np.array([self.reqs[i]["computed"] for i in ids], dtype=np.int32)
        prompt = np.array([self.reqs[i]["prompt"] for i in ids], dtype=np.int32)
        draft_list = [drafts.get(i) if drafts else None for i in ids] if drafts else None
        info = self.plan.step(comp, np.array(nsched, dtype=np.int32), prompt, table, draft_tokens=draft_list)
        T = int(info.num_tokens)
        assert T == sum(nsched)
        dts = self.dts
        q = representable(self.rng.standard_normal((T, self.hq, self.d)), dts)
        k = representable(self.rng.standard_normal((T, self.hkv, self.d)), dts)
        v = representable(self.rng.standard_normal((T, self.hkv, self.d)), dts)
        args = [to_storage(x, self.dtype) for x in (q, k, v)]
        res = uattn.forward(self.plan, self.layer, *args, self.key_cache, self.value_cache, runtime=runtime,
                            out=out, return_lse=return_lse)
        o, lse = res if return_lse else (res, None)
        refs = []
        qsl = info.query_start_loc
        for row, rid in enumerate(ids):
            r = self.reqs[rid]
            a, b = qsl[row], qsl[row + 1]
            r["keys"] = np.concatenate([r["keys"], k[a:b]])
            r["values"] = np.concatenate([r["values"], v[a:b]])
            pos = info.token_positions[a:b]
            ref_o, ref_l = dense_attention(q[a:b], r["keys"], r["values"], pos, self.layer.scale,
                                           soft_cap=self.layer_kw.get("soft_cap", 0.0),
                                           window=self.layer_kw.get("sliding_window", 0),
                                           sinks=self.layer_kw.get("sinks"),
                                           alibi=self.layer_kw.get("alibi_slopes"),
                                           causal=self.layer_kw.get("attn_type", "decoder") == "decoder")
            refs.append((a, b, ref_o, ref_l))
            r["computed"] += b - a
        if check:
            self.check(o, lse, refs)
        return o, lse, info, refs

    def check(self, o, lse, refs):
        got = from_storage(o, self.dtype)
        tol = max(TOL[self.dtype], TOL[self.cache_dtype])
        for a, b, ref_o, ref_l in refs:
            scale = max(1.0, float(np.abs(ref_o).max(initial=0)))
            err = np.abs(got[a:b] - ref_o).max(initial=0) / scale
            assert err <= tol, f"rows {a}:{b}: max error {err:.3g} > {tol}"
            if lse is not None:
                lg = np.asarray(lse, dtype=np.float64)[a:b]
                fin = np.isfinite(ref_l)
                assert np.array_equal(np.isfinite(lg), fin), "lse: -inf where the reference has none"
                assert np.allclose(lg[fin], ref_l[fin], rtol=1e-4, atol=1e-4 * math.log(2) * 10), "lse"

    def cache_rows(self, slots):
        """The cache entries at the given slots, as [n, Hkv, D] float64."""
        x = (cache_get(self.key_cache, self.layout, self.bs, slots, False),
             cache_get(self.value_cache, self.layout, self.bs, slots, True))
        return tuple(from_storage(c, self.cache_dtype) for c in x)
