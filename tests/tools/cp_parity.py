#!/usr/bin/python3
"""Helpers of run_cp_parity.sh (uattn-run-cp against uattn-run). Debian's /usr/bin/python3 with numpy.

    cp_parity.py fp8 --step DIR/step.json --format e4m3|e5m2 --seed S
        turns a step made by seed_unified_attn.py make-step into one over an fp8 cache: random codes of
        moderate magnitude (no NaN or infinity) in its key and value cache files, cache_dtype fp8_<format>,
        k_scale 0.5 and v_scale 3
    cp_parity.py compare --step DIR/step.json REF CP
        REF: uattn-run's output directory, CP: uattn-run-cp's. Exit 1 on any difference beyond the rules:
          caches     key_cache.npy and value_cache.npy bit for bit, plan.json equal
          out, lse   where uattn-run gives -inf (a row with no key) so must uattn-run-cp; elsewhere
                     max |cp - ref| <= tol * max |ref| (out) and <= tol * max(1, max |ref|) (lse), tol below

The tolerance. Each rank's partial is its keys' attention with fp32 accumulation, and the merge
(uattn_merge_states) rescales the partials by exp(lse_i - lse): the result differs from the single-rank one
only in the order of the fp32 sums (each rank has its own running max and sum) and the rescaling's
roundings, a few fp32 ulps. For f32 steps the tolerance is 1e-5 of max |ref|, seed_unified_attn.py's f32
tolerance against its fp64 oracle (measured: at most 5e-7); lse is fp32 in every step, 1e-5 too (measured:
at most 1.1e-7). For bf16 and f16 steps uattn_forward gives each rank's partial in the step's dtype (the
API's out is in layer.dtype), so each partial is rounded to it before the merge and the merged result once
more: the tolerance is 4 half-ulps of that dtype relative to max |ref| (bf16 4 * 2^-8 = 0.016, f16 4 * 2^-11
= 0.002; measured: at most 0.005 and 0.0005). fp32 partials from the library would bring them to 1e-5 too.
"""

import argparse
import json
import os
import sys

import numpy as np

TOL_OUT = {"f32": 1e-5, "bf16": 4 * 2.0**-8, "f16": 4 * 2.0**-11}
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
        path = os.path.join(d, step["tensors"][key])
        shape = np.load(path).shape
        sign = rng.integers(0, 2, shape, dtype=np.uint8) << 7
        exp = rng.integers(exp_lo, exp_hi, shape, dtype=np.uint8) << mant_bits
        mant = rng.integers(0, 1 << mant_bits, shape, dtype=np.uint8)
        np.save(path, (sign | exp | mant).astype(np.uint8))
    step["cache_dtype"] = "fp8_" + args.format
    step["k_scale"], step["v_scale"] = 0.5, 3.0
    with open(args.step, "w") as f:
        json.dump(step, f)


def cmd_compare(args):
    with open(args.step) as f:
        dtype = json.load(f)["dtype"]
    ok = True

    def bad(what):
        nonlocal ok
        ok = False
        print("FAIL " + what)

    for name in ("key_cache.npy", "value_cache.npy"):
        a, b = np.load(os.path.join(args.ref, name)), np.load(os.path.join(args.cp, name))
        if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a.view(np.uint8), b.view(np.uint8)):
            bad("%s differs: %d of %d elements" % (name, int(np.sum(a != b)) if a.shape == b.shape else -1, a.size))
    with open(os.path.join(args.ref, "plan.json")) as f, open(os.path.join(args.cp, "plan.json")) as g:
        if json.load(f) != json.load(g):
            bad("plan.json differs")
    errors = []
    for name, tol in (("out.npy", TOL_OUT[dtype]), ("lse.npy", TOL_LSE)):
        a = np.load(os.path.join(args.ref, name)).astype(np.float64)
        b = np.load(os.path.join(args.cp, name)).astype(np.float64)
        if a.shape != b.shape:
            bad("%s: shape %s, uattn-run's %s" % (name, b.shape, a.shape))
            continue
        if not np.array_equal(np.isneginf(a), np.isneginf(b)) or not np.isfinite(b[~np.isneginf(b)]).all():
            bad("%s: -inf or non-finite values where uattn-run has none, or the reverse" % name)
            continue
        fa, fb = np.where(np.isneginf(a), 0, a), np.where(np.isneginf(b), 0, b)
        scale = np.abs(fa).max() if name == "out.npy" else max(1.0, np.abs(fa).max())
        err = np.abs(fa - fb).max() / scale if fa.size else 0.0
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
    c = sub.add_parser("compare")
    c.add_argument("--step", required=True)
    c.add_argument("ref")
    c.add_argument("cp")
    args = p.parse_args()
    if args.cmd == "fp8":
        cmd_fp8(args)
        return 0
    return cmd_compare(args)


if __name__ == "__main__":
    sys.exit(main())
