#!/usr/bin/python3
"""Step-level parity for uattn-run: random steps, a dense oracle, and a numpy re-statement of the seed's attention.

Re-states `unified_attn` and its helpers from vllm_gaudi/extension/unified.py (partial_attn_causal,
partial_attn_shared, partial_attn_unique, merge, CacheUtils, block2batch, reduce_max) and PR 784's chunked
shared attention with dense biases and an online-softmax merge (vllm-gaudi). Run with Debian's /usr/bin/python3
(numpy 1.24); imports numpy, the standard library and the package seed/ beside it only. The code is in seed/
(step, oracle, attn, make_step, check, defects, attn_selftest; seed/__init__.py lists what each holds), with the
planner's re-statement of seed_unified_batch.py (seed/planner.py); this script is their command line.

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
 8. Multi-head latent attention (uattn.h's head_dim_v and kv_latent): values, the value cache's rows and out are
    head_dim_v wide; a kv_latent step has no v and no value cache (and must write no value_cache.npy), and the
    oracle and the seed read each key's first head_dim_v dims, as the key cache holds them, as its value. The
    seed has no such form; its arithmetic is width-agnostic, so seed parity runs on these steps too.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seed.attn_selftest import cmd_selftest  # noqa: E402
from seed.check import cmd_check  # noqa: E402
from seed.defects import cmd_defects  # noqa: E402
from seed.make_step import KINDS, cmd_make_step  # noqa: E402
from seed.step import DTYPES  # noqa: E402


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
    p.add_argument("--head-dim-v", type=int, default=None, help="values' width (default: the head dim)")
    p.add_argument("--kv-latent", action="store_true", help="absorbed MLA: no v or value cache (needs --head-dim-v)")
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
