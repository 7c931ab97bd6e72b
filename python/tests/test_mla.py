"""Multi-head latent attention through the module (uattn.h's head_dim_v and kv_latent): the Layer's new
arguments and their refusals, forward's shapes with Dv (v, the value cache's rows and out; no v and no value
cache for kv_latent), and one step of each form against a float64 attention written here from the header's
definitions, independent of refsim and of the library."""
import numpy as np
import pytest

import uattn

BS, NB = 16, 12


def fp64_attention(q, keys, values, pos, scale):
    """Causal softmax attention in float64: q [n, Hq, D] at positions pos against keys [S, Hkv, D] and values
    [S, Hkv, Dv] at positions 0..S-1; query head h reads KV head h // (Hq / Hkv). Returns [n, Hq, Dv]."""
    n, hq, _ = q.shape
    group = hq // keys.shape[1]
    out = np.zeros((n, hq, values.shape[2]))
    for i in range(n):
        for h in range(hq):
            k, v = keys[:pos[i] + 1, h // group], values[:pos[i] + 1, h // group]
            s = scale * (k @ q[i, h])
            w = np.exp(s - s.max())
            out[i, h] = w @ v / w.sum()
    return out


def to_layout(nhd, layout):
    """An NHD cache [num_blocks * BS, Hkv, W] in the layout's shape (HND: [num_blocks, Hkv, BS, W])."""
    if layout == "NHD":
        return nhd
    return np.ascontiguousarray(nhd.reshape(NB, BS, nhd.shape[1], nhd.shape[2]).transpose(0, 2, 1, 3))


def from_layout(cache, layout):
    if layout == "NHD":
        return cache
    return cache.transpose(0, 2, 1, 3).reshape(NB * BS, cache.shape[1], cache.shape[3])


def mla_step(hq, hkv, d, dv, latent, layout, seed):
    """One mixed step: request 0 decodes after 37 cached tokens, request 1 is a 21-token prompt. Runs forward
    and returns what it gave beside the float64 reference and the expected caches."""
    rng = np.random.default_rng(seed)
    layer = uattn.Layer(hq, hkv, d, dtype="f32", kv_layout=layout, scale=0.125, head_dim_v=dv, kv_latent=latent)
    plan = uattn.Plan(BS, NB, 4, 64, 256)
    tables = np.array([[7, 2, 9], [4, 11, -1]], dtype=np.int32)
    computed, scheduled = np.array([37, 0], np.int32), np.array([1, 21], np.int32)
    info = plan.step(computed, scheduled, np.array([30, 21], np.int32), tables)
    T = int(info.num_tokens)
    assert T == 22
    kc = rng.standard_normal((NB * BS, hkv, d)).astype(np.float32)
    vc = rng.standard_normal((NB * BS, hkv, dv)).astype(np.float32)
    q = rng.standard_normal((T, hq, d)).astype(np.float32)
    k = rng.standard_normal((T, hkv, d)).astype(np.float32)
    v = rng.standard_normal((T, hkv, dv)).astype(np.float32)
    key_cache = to_layout(kc.copy(), layout)
    value_cache = None if latent else to_layout(vc.copy(), layout)
    out = uattn.forward(plan, layer, q, k, None if latent else v, key_cache, value_cache)

    want = np.zeros((T, hq, dv))
    want_kc, want_vc = kc.copy(), vc.copy()
    qsl, slots = info.query_start_loc, info.slot_mapping
    want_kc[slots], want_vc[slots] = k, v
    for r in range(2):
        a, b = qsl[r], qsl[r + 1]
        seq = int(computed[r] + scheduled[r])
        p = np.arange(seq)
        seq_slots = tables[r][p // BS] * BS + p % BS
        keys = want_kc[seq_slots].astype(np.float64)
        # the absorbed form: each key's value is its first head_dim_v dims
        values = keys[..., :dv] if latent else want_vc[seq_slots].astype(np.float64)
        want[a:b] = fp64_attention(q[a:b].astype(np.float64), keys, values, info.token_positions[a:b], 0.125)
    return out, want, key_cache, value_cache, want_kc, want_vc


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_expanded_form_values_narrower_than_keys(layout):
    """Keys 48 wide, values 32: out [T, Hq, 32], the value cache's rows 32 long, both caches written."""
    out, want, key_cache, value_cache, want_kc, want_vc = mla_step(4, 2, 48, 32, False, layout, seed=1)
    assert out.shape == want.shape
    assert np.abs(out - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    assert np.array_equal(from_layout(key_cache, layout), want_kc)
    assert np.array_equal(from_layout(value_cache, layout), want_vc)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_absorbed_form_latents_are_keys_and_values(layout):
    """One KV head of 72-dim latents whose first 64 dims are the values: no v, no value cache; out is
    [T, Hq, 64] and the key cache holds this step's latents."""
    out, want, key_cache, _, want_kc, _ = mla_step(8, 1, 72, 64, True, layout, seed=2)
    assert out.shape == want.shape
    assert np.abs(out - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    assert np.array_equal(from_layout(key_cache, layout), want_kc)


# ---- the Layer's arguments ---------------------------------------------------------------------------

def test_layer_reports_head_dim_v_and_kv_latent():
    plain = uattn.Layer(4, 2, 64, dtype="f32")
    assert plain.head_dim_v == 64 and plain.kv_latent is False
    assert "head_dim_v" not in repr(plain)
    expanded = uattn.Layer(4, 2, 48, dtype="f32", head_dim_v=32)
    assert expanded.head_dim_v == 32 and expanded.kv_latent is False
    assert "head_dim_v=32" in repr(expanded)
    latent = uattn.Layer(8, 1, 72, dtype="bf16", head_dim_v=64, kv_latent=True)
    assert latent.head_dim_v == 64 and latent.kv_latent is True
    assert "kv_latent=True" in repr(latent)
    # on an fp8 cache a latent's values are read through k_scale: v_scale left out follows it
    fp8 = uattn.Layer(8, 1, 72, dtype="bf16", cache_dtype="fp8_e4m3", k_scale=0.5, head_dim_v=64, kv_latent=True)
    assert fp8.v_scale == 0.5


@pytest.mark.parametrize("kw,match", [
    (dict(head_dim_v=-1), "head_dim_v: expected >= 0"),
    (dict(kv_latent=True), "head_dim_v: a kv_latent layer needs 0 < head_dim_v <= head_dim"),
    (dict(kv_latent=True, head_dim_v=73), r"got 73 with head_dim 72"),
    (dict(kv_latent=True, head_dim_v=64, kv_layout="TILED"), "kv_latent: needs kv_layout \"NHD\" or \"HND\""),
    (dict(kv_latent=True, head_dim_v=64, cache_dtype="fp8_e4m3", k_scale=0.5, v_scale=2.0),
     r"v_scale: a kv_latent layer on an fp8 cache reads its values through k_scale"),
])
def test_layer_refuses_bad_latent_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        uattn.Layer(8, 1, 72, dtype="bf16", **kw)


# ---- forward's shapes --------------------------------------------------------------------------------

def planned(hq, hkv, d, dv, latent):
    layer = uattn.Layer(hq, hkv, d, dtype="f32", head_dim_v=dv, kv_latent=latent)
    plan = uattn.Plan(BS, NB, 4, 64, 256)
    plan.step(np.array([0], np.int32), np.array([5], np.int32), np.array([5], np.int32), np.array([[3]], np.int32))
    z = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
    return layer, plan, z


def test_expanded_forward_refuses_values_as_wide_as_keys():
    layer, plan, z = planned(4, 2, 48, 32, False)
    q, k, kc = z(5, 4, 48), z(5, 2, 48), z(NB * BS, 2, 48)
    with pytest.raises(ValueError, match=r"v: expected shape \(5, 2, 32\), got \(5, 2, 48\)"):
        uattn.forward(plan, layer, q, k, z(5, 2, 48), kc, z(NB * BS, 2, 32))
    with pytest.raises(ValueError, match=r"value_cache: expected shape \(192, 2, 32\), got \(192, 2, 48\)"):
        uattn.forward(plan, layer, q, k, z(5, 2, 32), kc, z(NB * BS, 2, 48))
    with pytest.raises(ValueError, match=r"out: expected shape \(5, 4, 32\), got \(5, 4, 48\)"):
        uattn.forward(plan, layer, q, k, z(5, 2, 32), kc, z(NB * BS, 2, 32), out=z(5, 4, 48))
    with pytest.raises(ValueError, match=r"v: None is only for a kv_latent layer"):
        uattn.forward(plan, layer, q, k, None, kc, z(NB * BS, 2, 32))
    with pytest.raises(ValueError, match=r"value_cache: None is only for a kv_latent layer"):
        uattn.forward(plan, layer, q, k, z(5, 2, 32), kc, None)


def test_absorbed_forward_refuses_values_and_a_value_cache():
    layer, plan, z = planned(8, 1, 72, 64, True)
    q, k, kc = z(5, 8, 72), z(5, 1, 72), z(NB * BS, 1, 72)
    with pytest.raises(ValueError, match=r"v: a kv_latent layer has no values .*pass None"):
        uattn.forward(plan, layer, q, k, z(5, 1, 64), kc, None)
    with pytest.raises(ValueError, match=r"value_cache: a kv_latent layer has no value cache .*pass None"):
        uattn.forward(plan, layer, q, k, None, kc, z(NB * BS, 1, 64))
    with pytest.raises(ValueError, match=r"key_cache: expected shape \(\*, 1, 72\), got \(192, 1, 64\)"):
        uattn.forward(plan, layer, q, k, None, z(NB * BS, 1, 64), None)
    with pytest.raises(ValueError, match=r"out: expected shape \(5, 8, 64\), got \(5, 8, 72\)"):
        uattn.forward(plan, layer, q, k, None, kc, None, out=z(5, 8, 72))
