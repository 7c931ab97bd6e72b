"""uattn.forward against the float64 dense reference (refsim.dense_attention), over steps an engine makes:
prefills, chunked prefills, decodes, mixed batches, speculative verification, shared prefixes; every dtype,
every cache layout (NHD, HND, TILED), and each scoring feature."""
import numpy as np
import pytest

import uattn
from refsim import PagedSim, cache_get, cache_put, cache_shapes, dense_attention

DTYPES = [("f32", "f32"), ("bf16", "bf16"), ("f16", "f16"), ("f32", "bf16"), ("bf16", "f32"), ("f16", "bf16")]


def run_mixed(sim, drafts=False):
    """A short serving history: two prompts (one chunked), then decodes beside a new prompt and a chunk,
    then decodes (with drafts when asked)."""
    sim.add(0, 40)
    sim.add(1, 70)
    sim.step({0: 40, 1: 32})             # a prefill and a first chunk
    sim.add(2, 9)
    sim.step({0: 1, 1: 32, 2: 9})        # decode + chunk + prefill
    sim.step({1: 6, 0: 1, 2: 1})         # last chunk + decodes
    for _ in range(3):
        if drafts:
            sim.step({0: 1, 1: 1, 2: 1}, drafts={0: [5, 6, 7], 2: [3]})
        else:
            sim.step({0: 1, 1: 1, 2: 1})


@pytest.mark.parametrize("dtype,cache_dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND", "TILED"])
def test_mixed_every_dtype_and_layout(dtype, cache_dtype, layout):
    run_mixed(PagedSim(dtype=dtype, cache_dtype=cache_dtype, layout=layout, seed=1))


@pytest.mark.parametrize("layout", ["NHD", "HND", "TILED"])
def test_decode_only(layout):
    sim = PagedSim(layout=layout, hq=8, hkv=2, d=128, dtype="bf16", seed=2)
    for r in range(5):
        sim.add(r, 20 + 13 * r)
        sim.step({r: 20 + 13 * r})
    for _ in range(4):
        _, _, info, _ = sim.step({r: 1 for r in range(5)})
        assert not info.contains_prompts


def test_prefill_only_gqa_and_mqa():
    for hq, hkv in [(8, 8), (8, 2), (8, 1)]:
        sim = PagedSim(hq=hq, hkv=hkv, d=64, seed=hq + hkv)
        for r in range(3):
            sim.add(r, 17 * (r + 1))
        sim.step({0: 17, 1: 34, 2: 51})


@pytest.mark.parametrize("bs,dtype,cache_dtype", [(16, "bf16", "bf16"), (64, "bf16", "bf16"), (32, "f32", "f16")])
def test_tiled_mixed_batch(bs, dtype, cache_dtype):
    """A TILED cache through mixed batches (prompts, a chunk, decodes and verifications in one step) on two
    workers, against the reference; Llama-like heads (the default build's bf16 bucket at block 16), blocks of
    one, two and four tiles. Then every key and value each request has is read back from the cache where
    uattn.h's TILED definition puts it (refsim.cache_get)."""
    sim = PagedSim(bs=bs, hq=8, hkv=2, d=128, dtype=dtype, cache_dtype=cache_dtype, layout="TILED", seed=14)
    assert sim.layer.kv_layout == "TILED"
    rt = uattn.Runtime(num_threads=2)
    sim.add(0, 40)
    sim.add(1, 70)
    sim.step({0: 40, 1: 32}, runtime=rt)
    sim.add(2, 9)
    sim.step({0: 1, 1: 32, 2: 9}, runtime=rt)  # decode + chunk + prefill
    sim.step({1: 6, 0: 1, 2: 1}, runtime=rt)
    sim.step({0: 1, 1: 1, 2: 1}, drafts={0: [5, 6, 7], 2: [3]}, runtime=rt)
    for r in sim.reqs.values():
        p = np.arange(r["computed"])
        slots = np.asarray(r["blocks"])[p // bs] * bs + p % bs
        keys, values = sim.cache_rows(slots)
        assert np.array_equal(keys, r["keys"]) and np.array_equal(values, r["values"])


def test_chunked_prompt_then_decode():
    sim = PagedSim(bs=16, seed=3)
    sim.add(0, 100)
    for n in (33, 33, 34):
        _, _, info, _ = sim.step({0: n})
        assert info.contains_prompts
    _, _, info, _ = sim.step({0: 1})
    assert info.seq_lens[0] == 101


def test_spec_decode_verification():
    for layout in ("NHD", "HND", "TILED"):
        sim = PagedSim(layout=layout, seed=4)
        run_mixed(sim, drafts=True)


def test_spec_decode_with_placeholders():
    sim = PagedSim(seed=5)
    sim.add(0, 30)
    sim.step({0: 30})
    # -1 entries are placeholders (the seed's rule): 2 real drafts -> 3 rows
    _, _, info, _ = sim.step({0: 3}, drafts={0: [11, 12]})
    assert info.num_scheduled[0] == 3


@pytest.mark.parametrize("chunk_size,layout", [(0, "NHD"), (2, "NHD"), (0, "TILED"), (2, "TILED")])
def test_prefix_sharing(chunk_size, layout):
    """A system prompt of 3 blocks computed once; later requests start on those blocks (prefix cache) and
    decode together, so the step has shared blocks read by several rows."""
    sim = PagedSim(bs=16, seed=6, chunk_size=chunk_size, layout=layout)
    sim.add(0, 48 + 5)
    sim.step({0: 53})
    for r in (1, 2, 3):
        sim.add(r, 48 + 4 * r, share_from=0, shared_blocks=3)
    sim.step({1: 4, 2: 8, 3: 12, 0: 1})
    _, _, info, _ = sim.step({0: 1, 1: 1, 2: 1, 3: 1})
    assert info.num_shared_blocks >= 3
    assert len(info.shared_spans) > 0
    assert set(info.shared_spans["req"]) == {0, 1, 2, 3}
    _, _, info, _ = sim.step({0: 1, 1: 1, 2: 1, 3: 1}, drafts={1: [1, 2]})


@pytest.mark.parametrize("feature", [
    dict(soft_cap=5.0),
    dict(sliding_window=20),
    dict(sinks=np.linspace(-1.0, 2.0, 4)),
    dict(alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625])),
    dict(soft_cap=8.0, sliding_window=33, sinks=np.full(4, 0.5), alibi_slopes=np.linspace(0.01, 0.3, 4)),
    dict(scale=0.05),
])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_scoring_features(feature, dtype):
    run_mixed(PagedSim(dtype=dtype, seed=7, **feature))
    run_mixed(PagedSim(dtype=dtype, seed=8, layout="HND", **feature), drafts=True)
    run_mixed(PagedSim(dtype=dtype, seed=9, layout="TILED", **feature), drafts=True)


def test_window_on_prefix_sharing():
    sim = PagedSim(bs=16, seed=9, sliding_window=24)
    sim.add(0, 64)
    sim.step({0: 64})
    for r in (1, 2):
        sim.add(r, 70, share_from=0, shared_blocks=4)
    sim.step({1: 6, 2: 6})
    sim.step({0: 1, 1: 1, 2: 1})


def test_runtime_threads_give_the_same_bits():
    """The same steps on the calling thread and on a 2-worker runtime: bitwise equal (uattn.h)."""
    outs = []
    for rt in (None, uattn.Runtime(num_threads=2)):
        sim = PagedSim(bs=16, seed=10, hq=8, hkv=2, d=128, dtype="bf16")
        got = []
        for r in range(4):
            sim.add(r, 30 + 20 * r)
        got.append(sim.step({0: 30, 1: 50, 2: 70, 3: 90}, runtime=rt)[0])
        got.append(sim.step({0: 1, 1: 1, 2: 1, 3: 1}, runtime=rt)[0])
        outs.append(got)
    for a, b in zip(*outs):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("layout", ["NHD", "TILED"])
def test_large_head_dim_and_block_size(layout):
    sim = PagedSim(bs=128, num_blocks=8, hq=4, hkv=1, d=128, dtype="bf16", seed=11, layout=layout)
    sim.add(0, 200)
    sim.step({0: 150})
    sim.step({0: 50})
    sim.step({0: 1})


def test_encoder_only_is_bidirectional():
    for layout in ("NHD", "HND", "TILED"):
        sim = PagedSim(layout=layout, seed=12, attn_type="encoder_only")
        for r in range(3):
            sim.add(r, 10 + 15 * r)
        sim.step({0: 10, 1: 25, 2: 40})


def test_cross_attention_reads_the_encoder_sequence():
    """Encoder-decoder: the decoder's rows see every key of their request's encoder sequence, paged through
    cross_block_table; this step's k and v are not written."""
    rng = np.random.default_rng(13)
    bs, hq, hkv, d = 16, 4, 2, 64
    plan = uattn.Plan(bs, 32, 4, 64, 256)
    layer = uattn.Layer(hq, hkv, d, dtype="f32", attn_type="encoder_decoder")
    kc = np.zeros((32 * bs, hkv, d), np.float32)
    vc = np.zeros_like(kc)
    enc_lens = np.array([20, 7], np.int32)
    cross_table = np.array([[3, 4], [9, 0]], np.int32)
    enc = []
    for r, n in enumerate(enc_lens):
        keys, values = rng.standard_normal((2, n, hkv, d)).astype(np.float32)
        pos = np.arange(n)
        slots = cross_table[r, pos // bs] * bs + pos % bs
        kc[slots], vc[slots] = keys, values
        enc.append((keys.astype(np.float64), values.astype(np.float64)))
    kc0, vc0 = kc.copy(), vc.copy()
    info = plan.step([0, 5], [3, 1], [3, 5], np.array([[20], [21]], np.int32))
    q = rng.standard_normal((4, hq, d)).astype(np.float32)
    k = rng.standard_normal((4, hkv, d)).astype(np.float32)
    out = uattn.forward(plan, layer, q, k, k, kc, vc, encoder_lens=enc_lens, cross_block_table=cross_table)
    assert np.array_equal(kc, kc0) and np.array_equal(vc, vc0)
    qsl = info.query_start_loc
    for r in range(2):
        ref, _ = dense_attention(q[qsl[r]:qsl[r + 1]].astype(np.float64), *enc[r],
                                 info.token_positions[qsl[r]:qsl[r + 1]], layer.scale, causal=False)
        assert np.abs(out[qsl[r]:qsl[r + 1]] - ref).max() < 2e-5
    with pytest.raises(ValueError, match="give both"):
        uattn.forward(plan, layer, q, k, k, kc, vc, encoder_lens=enc_lens)


@pytest.mark.parametrize("probs_fp32", [False, True])
def test_bf16_probability_precision(probs_fp32):
    """Where the CPU has bf16 dot products, bf16 layers round P to bf16 unless probs_fp32: both against the
    reference (elsewhere both run the fp32 arithmetic)."""
    sim = PagedSim(hq=8, hkv=2, d=128, dtype="bf16", seed=6, probs_fp32=probs_fp32)
    assert sim.layer.probs_fp32 is probs_fp32
    run_mixed(sim)


def fp8_table(fmt):
    """The 256 codes of an fp8 format as float64, decoded from the bit fields here (not by uattn)."""
    c = np.arange(256)
    sign = np.where(c >> 7, -1.0, 1.0)
    if fmt == "fp8_e4m3":  # the fn variant: bias 7, no infinities, NaN = S.1111.111
        e, m = (c >> 3) & 15, c & 7
        val = np.where(e == 0, m * 2.0 ** -9, (8 + m) * 2.0 ** (e - 10))
        val[(c & 0x7F) == 0x7F] = np.nan
    else:  # bias 15, IEEE-like: S.11111.00 inf, S.11111.xx NaN
        e, m = (c >> 2) & 31, c & 3
        val = np.where(e == 0, m * 2.0 ** -16, (4 + m) * 2.0 ** (e - 17))
        val[e == 31] = np.where(m[e == 31] == 0, np.inf, np.nan)
    return sign * val


@pytest.mark.parametrize("fmt,layout", [("fp8_e4m3", "NHD"), ("fp8_e5m2", "HND"), ("fp8_e4m3", "TILED"),
                                        ("fp8_e5m2", "TILED")])
def test_fp8_caches_with_scales(fmt, layout):
    """fp8 caches as uint8 arrays of codes, k_scale 0.5 and v_scale 3 on the Layer: a decode (its own new key
    read back from the cache) and a prompt. The step's k/v are exactly code * scale, so the cache after the
    step is known bit for bit and the dense float64 attention on the dequantized cache is exact: what is left
    is fp32 accumulation."""
    rng = np.random.default_rng(29)
    bs, hq, hkv, d, nb, ks, vs = 16, 4, 2, 32, 8, 0.5, 3.0
    table = fp8_table(fmt)
    safe = np.flatnonzero(np.isfinite(table) & (np.abs(table) >= 2.0 ** -6) & (np.abs(table) <= 2.0))
    plan = uattn.Plan(bs, nb, 4, 64, 128)
    layer = uattn.Layer(hq, hkv, d, dtype="f32", cache_dtype=fmt, kv_layout=layout, k_scale=ks, v_scale=vs)
    assert (layer.cache_dtype, layer.k_scale, layer.v_scale) == (fmt, ks, vs)
    kshape, vshape = cache_shapes(layout, nb, bs, hkv, d)
    kc = rng.choice(safe, size=kshape).astype(np.uint8)
    vc = rng.choice(safe, size=vshape).astype(np.uint8)
    blocks = np.array([[2, 5], [1, 0]], np.int32)
    info = plan.step([20, 0], [1, 5], [5, 5], blocks)  # a decode at position 20, a 5-token prompt
    T = info.num_tokens
    kcodes = rng.choice(safe, size=(T, hkv, d)).astype(np.uint8)
    vcodes = rng.choice(safe, size=(T, hkv, d)).astype(np.uint8)
    k = (table[kcodes] * ks).astype(np.float32)
    v = (table[vcodes] * vs).astype(np.float32)
    q = rng.uniform(-1, 1, (T, hq, d)).astype(np.float32)
    want_k, want_v = kc.copy(), vc.copy()
    out = uattn.forward(plan, layer, q, k, v, kc, vc)

    qsl, pos = info.query_start_loc, info.token_positions
    slots = np.array([blocks[r, p // bs] * bs + p % bs for r in range(2) for p in pos[qsl[r]:qsl[r + 1]]])
    cache_put(want_k, layout, bs, slots, False, kcodes)
    cache_put(want_v, layout, bs, slots, True, vcodes)
    assert np.array_equal(kc, want_k) and np.array_equal(vc, want_v)  # fp8(k / k_scale), bit for bit
    for r, n in enumerate([21, 5]):
        p = np.arange(n)
        s = blocks[r, p // bs] * bs + p % bs
        keys = table[cache_get(kc, layout, bs, s, False)] * ks
        values = table[cache_get(vc, layout, bs, s, True)] * vs
        ref, _ = dense_attention(q[qsl[r]:qsl[r + 1]].astype(np.float64), keys, values, pos[qsl[r]:qsl[r + 1]],
                                 layer.scale)
        assert np.abs(out[qsl[r]:qsl[r + 1]] - ref).max() < 2e-5 * max(1.0, np.abs(ref).max())
    with pytest.raises(ValueError, match="cache dtype only"):
        uattn.Layer(hq, hkv, d, dtype=fmt)
    with pytest.raises(ValueError, match="k_scale"):
        uattn.Layer(hq, hkv, d, dtype="f32", cache_dtype=fmt, k_scale=0.0)
