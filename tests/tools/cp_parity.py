#!/usr/bin/python3
"""Helpers of run_cp_parity.sh (uattn-run-cp against uattn-run). Debian's /usr/bin/python3 with numpy.

    cp_parity.py fp8 --step DIR/step.json --format e4m3|e5m2 --seed S
        turns a step made by seed_unified_attn.py make-step into one over an fp8 cache: random codes of
        moderate magnitude (no NaN or infinity) in its key and value cache files, cache_dtype fp8_<format>,
        k_scale 0.5 and v_scale 3 (a kv_latent step: k_scale alone, its values being its keys)
    cp_parity.py tiled --step DIR/step.json
        turns an NHD step (block_size a multiple of 16, head_dim even) into one over TILED caches holding
        the same values: each cache file rearranged as uattn.h defines the layout, kv_layout TILED
    cp_parity.py compare --step DIR/step.json REF CP
        REF: uattn-run's output directory, CP: uattn-run-cp's. Exit 1 on any difference beyond the rules:
          caches     key_cache.npy and value_cache.npy bit for bit (a kv_latent step: neither writes a value
                     cache), plan.json equal
          out, lse   where uattn-run gives -inf (a row with no key) so must uattn-run-cp; elsewhere
                     max |cp - ref| <= tol * max |ref| (out) and <= tol * max(1, max |ref|) (lse), tol below

The tolerance. Each rank's partial is its keys' attention with fp32 accumulation, given in fp32 whatever
the step's dtype (uattn_tensors.out_f32), and the merge (uattn_merge_states) rescales the partials by
exp(lse_i - lse): the merged fp32 result differs from the single rank's fp32 result only in the order of the
fp32 sums (each rank has its own running max and sum) and the rescaling's roundings, a few fp32 ulps. For f32
steps the tolerance is 1e-5 of max |ref|, seed_unified_attn.py's f32 tolerance against its fp64 oracle
(measured: at most 5e-7); lse is fp32 in every step, 1e-5 too (measured: at most 1.1e-7). For bf16 and f16
steps uattn-run-cp rounds the merged result once to the step's dtype, as uattn-run's forward rounds its own
fp32 result once: two roundings to nearest of fp32 values within 1e-5 of max |ref| of each other differ by at
most that plus one ulp of the dtype at the element's magnitude, checked element by element:
|cp - ref| <= 1e-5 * max |ref| + ulp(max(|cp|, |ref|)). Except where P is rounded to bf16 (the avx512bf16
level, bf16 steps on bf16 or fp8 caches, probs_fp32 false, as uattn-run runs them): each weight is rounded relative
to a running max the ranks' groupings of keys change, moving each result by up to 2^-8 max |v| from its
P-in-fp32 value (bf16's 8 significant bits), so there the bound has 2 * 2^-8 max |v| more (v: the step's values
and cache).
"""

import argparse

import json
import os
import sys

import numpy as np

TOL_OUT = 1e-5  # of max |ref|, every dtype, plus one ulp of a bf16 or f16 output
BITS = {"bf16": 8, "f16": 11}  # significant bits
LOWEST = {"bf16": -133, "f16": -24}  # the exponent of the smallest subnormal


def ulp(dtype, x):
    """The spacing of the dtype's values at |x| (one ulp): 2^(e - bits) for |x| in [2^(e-1), 2^e)."""
    _, e = np.frexp(np.abs(x))
    return np.ldexp(1.0, np.maximum(e - BITS[dtype], LOWEST[dtype]))


def fp8_values(codes, fmt):
    """fp8 codes (uint8) as float64: e4m3 (the "fn" variant) or e5m2; NaN and infinity codes as NaN."""
    mant_bits, bias = (3, 7) if fmt == "fp8_e4m3" else (2, 15)
    c = codes.astype(np.int64)
    e, m = (c & 0x7F) >> mant_bits, c & ((1 << mant_bits) - 1)
    mag = np.where(e == 0, np.ldexp(m / 2.0**mant_bits, 1 - bias), np.ldexp(1 + m / 2.0**mant_bits, e - bias))
    special = (c & 0x7F) == 0x7F if fmt == "fp8_e4m3" else e == 31
    return np.where(special, np.nan, np.where(c & 0x80, -mag, mag))


def max_abs_v(step_path, step):
    """max |v| over the step's values and value cache (bf16 files as uint16 bits, fp8 ones as codes times
    v_scale), for the P-in-bf16 term. A kv_latent step's values are its keys' (all their dims: a bound)."""
    d = os.path.dirname(os.path.abspath(step_path))
    m = 0.0
    latent = step.get("kv_latent", False)
    for key in ("k", "key_cache") if latent else ("v", "value_cache"):
        a = np.load(os.path.join(d, step["tensors"][key]))
        if a.dtype == np.uint16 and step["dtype" if key in ("k", "v") else "cache_dtype"] == "bf16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        if a.dtype == np.uint8 and key.endswith("_cache") and step["cache_dtype"].startswith("fp8_"):
            scale = step.get("k_scale" if latent else "v_scale", 1.0)
            a = np.nan_to_num(fp8_values(a, step["cache_dtype"]), nan=0.0) * scale
        if a.size:
            m = max(m, float(np.abs(a.astype(np.float64)).max()))
    return m


TOL_LSE = 1e-5


def cmd_fp8(args):
    with open(args.step) as f:
        step = json.load(f)
    rng = np.random.default_rng(args.seed)
    d = os.path.dirname(os.path.abspath(args.step))
    # sign, a moderate exponent (values 2^-3 .. 2^2 before the scale), any mantissa: no NaN or infinity codes
    if args.format == "e4m3":
        exp_lo, exp_hi, mant_bits = 4, 9, 3
    else:
        exp_lo, exp_hi, mant_bits = 12, 17, 2
    for key in ("key_cache", "value_cache"):
        if key not in step["tensors"]:  # kv_latent
            continue
        path = os.path.join(d, step["tensors"][key])
        shape = np.load(path).shape
        sign = rng.integers(0, 2, shape, dtype=np.uint8) << 7
        exp = rng.integers(exp_lo, exp_hi, shape, dtype=np.uint8) << mant_bits
        mant = rng.integers(0, 1 << mant_bits, shape, dtype=np.uint8)
        np.save(path, (sign | exp | mant).astype(np.uint8))
    step["cache_dtype"] = "fp8_" + args.format
    step["k_scale"] = 0.5
    if not step.get("kv_latent"):  # a latent's values are read through k_scale
        step["v_scale"] = 3.0
    with open(args.step, "w") as f:
        json.dump(step, f)


def cmd_tiled(args):
    with open(args.step) as f:
        step = json.load(f)
    bs, hkv, d = step["block_size"], step["num_kv_heads"], step["head_dim"]
    if step["kv_layout"] != "NHD" or bs % 16 or d % 2:
        sys.exit("tiled: wants an NHD step with a block_size multiple of 16 and an even head_dim")
    here = os.path.dirname(os.path.abspath(args.step))
    for key in ("key_cache", "value_cache"):
        path = os.path.join(here, step["tensors"][key])
        a = np.load(path)  # [num_blocks * bs, Hkv, D]: slot b * bs + 16 t + i
        nb = a.shape[0] // bs
        if key == "key_cache":  # [b, t, i, h, p, e] -> [b, t, h, p, i, e], dim d = 2 p + e
            x = a.reshape(nb, bs // 16, 16, hkv, d // 2, 2).transpose(0, 1, 3, 4, 2, 5)
        else:  # [b, t, i / 2, i % 2, h, d] -> [b, t, h, i / 2, d, i % 2]
            x = a.reshape(nb, bs // 16, 8, 2, hkv, d).transpose(0, 1, 4, 2, 5, 3)
        np.save(path, np.ascontiguousarray(x))
    step["kv_layout"] = "TILED"
    with open(args.step, "w") as f:
        json.dump(step, f)


def cmd_compare(args):
    with open(args.step) as f:
        step = json.load(f)
    dtype = step["dtype"]
    # P in bf16 where the avx512bf16 level may serve the step (bf16 on bf16 or fp8 caches, P not kept in fp32)
    cache = step.get("cache_dtype", dtype)
    p_bf16 = dtype == "bf16" and (cache == "bf16" or cache.startswith("fp8_")) and not step.get("probs_fp32", False)
    p_abs = 2 * 2.0**-8 * max_abs_v(args.step, step) if p_bf16 else 0.0
    ok = True

    def bad(what):
        nonlocal ok
        ok = False
        print("FAIL " + what)

    for name in ("key_cache.npy", "value_cache.npy"):
        there = [os.path.exists(os.path.join(x, name)) for x in (args.ref, args.cp)]
        if not all(there):
            if any(there) or not step.get("kv_latent"):
                bad("%s: written by %s only" % (name, "uattn-run" if there[0] else "uattn-run-cp" if there[1]
                                                else "neither"))
            continue
        a, b = np.load(os.path.join(args.ref, name)), np.load(os.path.join(args.cp, name))
        if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a.view(np.uint8), b.view(np.uint8)):
            bad("%s differs: %d of %d elements" % (name, int(np.sum(a != b)) if a.shape == b.shape else -1, a.size))
    with open(os.path.join(args.ref, "plan.json")) as f, open(os.path.join(args.cp, "plan.json")) as g:
        if json.load(f) != json.load(g):
            bad("plan.json differs")
    errors = []
    for name, tol in (("out.npy", TOL_OUT), ("lse.npy", TOL_LSE)):
        a = np.load(os.path.join(args.ref, name)).astype(np.float64)
        b = np.load(os.path.join(args.cp, name)).astype(np.float64)
        if a.shape != b.shape:
            bad("%s: shape %s, uattn-run's %s" % (name, b.shape, a.shape))
            continue
        if not np.array_equal(np.isneginf(a), np.isneginf(b)) or not np.isfinite(b[~np.isneginf(b)]).all():
            bad("%s: -inf or non-finite values where uattn-run has none, or the reverse" % name)
            continue
        fa, fb = np.where(np.isneginf(a), 0, a), np.where(np.isneginf(b), 0, b)
        if not fa.size:
            errors.append("%s 0" % name[:-4])
            continue
        scale = np.abs(fa).max() if name == "out.npy" else max(1.0, np.abs(fa).max())
        diff = np.abs(fa - fb)
        err = diff.max() / scale
        if name == "out.npy" and dtype in BITS:
            # per element: the fp32 tolerance, one ulp of the dtype, and the P-in-bf16 term
            bound = tol * scale + ulp(dtype, np.maximum(np.abs(fa), np.abs(fb))) + p_abs
            worst = int(np.argmax(diff - bound))
            errors.append("%s %.2g (%d elements differ, largest %.2g of its bound)" % (
                name[:-4], err, int(np.count_nonzero(diff)), float(np.max(diff / bound))))
            if diff.flat[worst] > bound.flat[worst]:
                bad("%s: |cp - ref| = %.3g at element %d (%.9g, uattn-run's %.9g), bound %.3g = %.1g max |ref| + 1 "
                    "ulp of %s%s" % (name, diff.flat[worst], worst, fb.flat[worst], fa.flat[worst],
                                     bound.flat[worst], tol, dtype, " + 2^-8 max |v| (P in bf16)" if p_abs else ""))
            continue
        errors.append("%s %.2g" % (name[:-4], err))
        if err > tol:
            bad("%s: max |cp - ref| = %.3g of max |ref|, tolerance %.3g (%s)" % (name, err, tol, dtype))
    print(("ok" if ok else "FAIL") + " caches bit for bit, plan.json equal; " + ", ".join(errors) + " of max |ref|")
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fp8")
    f.add_argument("--step", required=True)
    f.add_argument("--format", choices=["e4m3", "e5m2"], required=True)
    f.add_argument("--seed", type=int, required=True)
    t = sub.add_parser("tiled")
    t.add_argument("--step", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--step", required=True)
    c.add_argument("ref")
    c.add_argument("cp")
    args = p.parse_args()
    if args.cmd == "fp8":
        cmd_fp8(args)
        return 0
    if args.cmd == "tiled":
        cmd_tiled(args)
        return 0
    return cmd_compare(args)


if __name__ == "__main__":
    sys.exit(main())
