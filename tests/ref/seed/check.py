"""The `check` command of seed_unified_attn.py: uattn-run's outputs for a step against the expected cache update
(cache-update), the dense oracle (oracle-out, oracle-lse), an independent derivation of the seed-format tensors
(seed-tensors) and the seed's unified_attn on them (seed-parity); Report and compare.
"""

import copy
import json
import os
import sys
import time

import numpy as np

from . import planner as sub
from .attn import SharedChunked, run_seed, seed_metadata, shared_chunk_bias
from .oracle import dense_oracle, exactly_once, key_counts
from .step import TOLERANCE, Step, batch_view, cache_from_nhd, coarser, expected_caches

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
    if o["key_cache"] is None or (o["value_cache"] is None) != st.kv_latent:
        rep.line("FAIL", "cache-update", "key_cache.npy missing" if o["key_cache"] is None else
                 "value_cache.npy written for a kv_latent step" if st.kv_latent else "value_cache.npy missing")
        return kc, vc
    msgs = []
    for name, want, got in (("key", kc, o["key_cache"]), ("value", vc, o["value_cache"])):
        if want is None:  # kv_latent: no value cache, and none written (above)
            continue
        if got.dtype != want.dtype or got.shape != want.shape:
            msgs.append("%s cache %s %s, expected %s %s" % (name, got.dtype, got.shape, want.dtype, want.shape))
        elif not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
            diff = np.flatnonzero((got != want).reshape(got.shape[0], -1).any(-1))
            msgs.append("%s cache differs in %d rows of dim 0 (first %s)" % (name, diff.size, diff[:5].tolist()))
    plan = o["plan"]
    if plan is not None and plan.get("slot_mapping") != st.slots.tolist():
        msgs.append("plan.json slot_mapping %s != ours %s" % (plan.get("slot_mapping")[:16], st.slots[:16].tolist()))
    rep.check(not msgs, "cache-update", "; ".join(msgs) or
              "%s bit-identical to ours (%d slots written, %s -> %s, %s)"
              % ("the key cache (kv_latent: no value cache)" if st.kv_latent else "both caches", st.T, st.dtype,
                 st.cache_dtype, st.layout))
    return kc, vc


def check_oracle(st, o, kc, vc, rep):
    ref_out, ref_lse = dense_oracle(st, kc, vc)
    tname = coarser(st.dtype, st.cache_dtype)
    tol = TOLERANCE[tname]
    out, lse = o["out"], o["lse"]
    if out is None or out.shape != ref_out.shape:
        rep.line("FAIL", "oracle-out", "out.npy %s, expected [T, Hq, Dv] = %s"
                 % (None if out is None else out.shape, ref_out.shape))
    else:
        ok, mx, bound, w = compare(out, ref_out, tol)
        # A bf16 layer on a bf16 cache may take P V with P rounded to bf16 (uattn.h, probs_fp32: up to 2^-8
        # relative each, bf16 having 8 significant bits), on top of the output's own rounding: up to 2^-8 of the weighted |v|, sum_j p_j |v_j|, which is
        # the oracle's attention over |v| (bf16 bits: the sign bit cleared).
        p_round = 0.0
        if st.dtype == "bf16" and st.cache_dtype == "bf16":
            st_abs = copy.copy(st)
            if st.kv_latent:  # the values are the keys' bytes: |v| through a value cache of |latent|
                st_abs.kv_latent = False
                vc = cache_from_nhd(np.ascontiguousarray(st.latent_values(kc)), st.layout, "value", st.bs)
            st_abs.v = st.v & np.uint16(0x7FFF)
            weighted, _ = dense_oracle(st_abs, kc, vc & np.uint16(0x7FFF))
            p_round = 2.0 ** -8 * float(np.abs(weighted).max())
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
    if st.kv_latent:  # the seed's value cache: each latent's first head_dim_v dims (choice 8)
        vc = st.latent_values(kc)
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
