"""seed_unified_attn.py's selftest: bf16 rounding, the cache layouts element by element, the dense oracle on a
hand-made step (sinks, window), the seed's merge on empty rows, whole against chunked shared attention, the
whole pipeline on random steps of every kind (uattn-mode metadata through the seed's attention against the
oracle), then the defects demonstration.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from . import planner as sub
from .attn import (FEPS, FMIN, CacheUtils, SharedChunked, merge, partial_attn_causal, partial_attn_shared,
                   run_seed, seed_metadata, shared_chunk_bias)
from .check import compare
from .defects import cmd_defects
from .make_step import KINDS, cmd_make_step
from .oracle import dense_oracle, exactly_once, key_counts
from .step import (TILE, TOLERANCE, Step, batch_view, bf16_bits_to_f32, cache_as_nhd, cache_from_nhd,
                   expected_caches, f32_to_bf16_bits, write_step)

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

        # the whole pipeline on random plain steps of every kind, then on MLA steps of both forms (expanded:
        # values 24 wide under keys of 40; absorbed: one KV head of latents): uattn-mode metadata == oracle
        n = 0
        mla = [("mixed", "NHD", 40, 24, False, 4), ("spec-decode", "HND", 40, 32, True, 1),
               ("shared-prefix", "NHD", 40, 40, True, 1)]
        runs = [(kind, ["NHD", "HND", "TILED"][i % 3], None, None, False, None) for i, kind in enumerate(KINDS)]
        for i, (kind, layout, d, dv, latent, hkv) in enumerate(runs + mla):
            a = argparse.Namespace(out=os.path.join(tmp, "k%d" % i), seed=100 + i, kind=kind, dtype="f32",
                                   cache_dtype=None, layout=layout, block_size=None, num_q_heads=None,
                                   num_kv_heads=hkv, head_dim=d, head_dim_v=dv, kv_latent=latent, scale=None,
                                   soft_cap=0.0, sliding_window=0, attn_type="decoder", causal_width=None,
                                   chunk_size=None, threads=None, sinks=False, alibi=False, qk_scale=1.0, long=False)
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
                seed_vc = st.latent_values(kc) if st.kv_latent else vc
                ok, mx, bound, _ = compare(run_seed(st, kc, seed_vc, meta), ref_out, TOLERANCE["f32"])
                assert ok, (kind, mx, bound)
            if st.kv_latent:  # the oracle of a latent step is that of the step with its values written out
                st.kv_latent, st.v = False, np.ascontiguousarray(st.k[..., :st.dv])
                expanded_out, _ = dense_oracle(st, kc, cache_from_nhd(np.ascontiguousarray(
                    cache_as_nhd(kc, st.layout, "key")[..., :st.dv]), st.layout, "value", st.bs))
                assert np.array_equal(expanded_out, ref_out), kind
            assert ref_out.shape == (st.T, st.hq, st.dv)
            n += st.T
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rc = cmd_defects(argparse.Namespace(runner=None, keep=False))
    if rc:
        return rc
    print(json.dumps({"selftest": "ok", "kinds": len(KINDS), "rows_checked": n}))
    return 0
