#!/usr/bin/python3
"""An independent numpy re-statement of the seed's unified-batch planner, and golden fixtures for uattn.

Re-states `create_unified_batch` and its helpers from vllm_gaudi/extension/unified_batch.py,
vllm-gaudi PR 784's dense shared usage table and the seed's unified bucketing (docs/design.md,
"Bucketing"). Run with Debian's /usr/bin/python3 (numpy 1.24); imports numpy, the standard library and the
package seed/ beside it only. The code is in seed/ (planner, golden, timing, planner_selftest; seed/__init__.py
lists what each holds); this script is their command line.

    seed_unified_batch.py golden --out FILE [--count N] [--seed S]   fixtures for the C planner's tests
    seed_unified_batch.py time --batch FILE [--repeat N]             times the seed-mode planner
    seed_unified_batch.py selftest                                   checks this script itself

Two modes of the planner:
  "seed"   create_unified_batch read literally, with hpu_bias_acceleration=False (biases built on CPU), and
           with its two defects: (a) in a batch holding a prompt, the causal bias covers every row, decode rows
           included, while a decode's context (cached = num_computed + num_scheduled) already holds its own
           new key, so a decode row sees that key twice; (b) a context block's usage is per request
           (clip(cached - offset*bs, 1, bs)), so every row of a multi-token decode sees the later drafts.
  "uattn"  the semantics the C library implements: the causal part only among rows of prompt requests
           (same request, key position <= query position); token_context_lens[t] = min(pos + 1, cached[r])
           with cached = num_computed for a prompt and num_computed + num_scheduled otherwise; usage of the
           context block starting at `start` is clamp(ctx_len[t] - start, 0, bs) per row; a block read
           (usage > 0) by more than one row over the whole batch is shared, by exactly one row unique.

Choices this script makes where the seed or the brief leaves room (the C planner must agree with them):
 1. Spec decode: a request with >= 1 draft entry gets num_scheduled = count(entries != -1) + 1; a request
    with no entry is not a spec-decode request (the seed keys a dict by request id; "absent" = no entries).
 2. Seed mode, batch without prompts: the seed builds no causal bias (None); the mask is reported all zero.
 3. Async scheduling. uattn mode: when exactly one request has 0 output tokens, its last row
    (query_start_loc[r+1] - 1) is appended to logits_indices, r to logits_groups, that row's position + 1 to
    new_token_positions, and r is reported; the bucket's logits count includes the appended row.
    Seed mode (literal): when num_reqs - num_logits == 1, query_len - 1 is appended to logits_indices only,
    num_reqs - 1 is reported, and the bucket's logits count is taken before the append (the seed buckets
    first and appends after padding).
 4. bucket_range(min, max, round_up): the seed's warmup_unified_range: 0 is added and min becomes 1 when
    min is 0; v_i = min * float_power(max / min, (1./9.) * i) in double precision; the point is max for
    i = 9, else ceil(v_i / round_up) * round_up; deduplicated and sorted. round_up = max_num_seqs. No
    special case for max == 0 (the seed has none).
 5. Bucket list: ranges query (1, max_num_batched_tokens, S), shared (0, min(max_model_len // bs,
    num_blocks), S), unique (0, num_blocks, S), S = max_num_seqs; with chunk_size > 0 every shared value is
    rounded up to a multiple of chunk_size, then deduplicated, before the product. Filters (integer
    division, as the seed): causal: shared*bs // min(S, query) <= max_model_len; non-causal: query <= S,
    shared > 0 or unique > 0, shared == 0 or shared*bs // (query // 2) <= max_model_len, and shared > 0 or
    query <= unique. A divisor query // 2 == 0 with shared > 0 (the seed would raise) rejects the bucket.
    Sorted as tuples (query, shared, unique, causal) with causal False < True.
 6. Lookup: the first bucket in that order whose causal flag == contains_prompts and that is >= the batch
    in query, shared (number of shared blocks) and unique (largest unique block id + 1, 0 if none). The
    seed's find_equal_or_closest_greater_config ignores the flag when comparing ("TODO: handle
    is_causal"); uattn matches it. None fits: the exact sizes, bucket_fallback = True. Logits (bucketing
    "seed", fallback or not): max_num_seqs if num_logits <= max_num_seqs, else num_logits. Bucketing
    "none": padded = exact. No data-parallel padding.
 7. Seed-format unique tensors: dimension = largest unique block id + 1; unique_block_mapping[id] = the
    reading row (the seed writes the request's first row: the same row, since a seed-unique block belongs
    to a one-token request) or -1; unique_usage[id] = usage or 0.
 8. token_context_lens in seed mode: cached[r] for every row of r (the seed has no per-row context).
 9. Fixtures' block tables: rows padded with 0 past ceil(seq_len / bs); block 0 is never allocated (vLLM's
    null block). A block id appears at one offset only; blocks written this step are private.
10. "parity" (seed vs uattn) leaves out, beyond the brief's rules (causal_mask when the batch has a prompt
    and a decode; shared_*/unique_* with a multi-token decode): token_context_lens, exact_bucket,
    padded_bucket, bucket_fallback with a multi-token decode (they follow from the split); logits_groups,
    new_token_positions, exact_bucket, padded_bucket when either mode appended an async row; and
    logits_indices, invalid_req_indices unless both appended for the last request. Generation asserts that
    every key listed in parity is equal in both modes.
11. `time` times the seed's CPU work in seed mode: common prep, context split, the path's CPU biases,
    bucketing and padding to the bucket (a fresh filled array per padded tensor; no placeholder cache).
    "no_bias" is the hpu_bias_acceleration=True path: no causal and no shared bias (except the seed's CPU
    fallback when padded shared tokens < actual ones), but the unique bias, which the seed builds on CPU on
    both paths, is built.

Fixture file (golden): {"cases": [...], "bucket_ranges": [{"min", "max", "round_up", "values"}, ...]}; a case
is {"name", "config", "step", "uattn", "seed"} as described in tests/ref/README.md. "buckets" appears on the
first case of each config only, [] when its bucketing is "none".
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seed.golden import cmd_golden  # noqa: E402
from seed.planner_selftest import cmd_selftest  # noqa: E402
from seed.timing import cmd_time  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("golden", help="write golden fixtures")
    p.add_argument("--out", required=True)
    p.add_argument("--count", type=int, default=300)
    p.add_argument("--seed", type=int, default=20240611)
    p.set_defaults(fn=cmd_golden)
    p = sub.add_parser("time", help="time the seed-mode planner on one batch")
    p.add_argument("--batch", required=True)
    p.add_argument("--repeat", type=int, default=20)
    p.set_defaults(fn=cmd_time)
    p = sub.add_parser("selftest", help="check this script")
    p.set_defaults(fn=cmd_selftest)
    args = ap.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
