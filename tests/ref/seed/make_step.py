"""The `make-step` command of seed_unified_attn.py: random valid steps of every kind (choices 6 and 7): the
request makers, random_requests, block allocation under the sharing rule (allocate_blocks, validate_tables)
and cmd_make_step, which writes step.json and its tensors.
"""

import json
import math
import os

import numpy as np

from .step import TILE, cache_from_nhd, from_f32, storage_dtype

KINDS = ["decode", "prefill", "prefix-prefill", "chunked", "mixed", "spec-decode", "shared-prefix"]


# ------------------------------------------------------------------------------------------------------
# make-step
# ------------------------------------------------------------------------------------------------------


# Lengths of prompts and contexts are multiplied by this (make-step --long sets 8: steps past 512 rows).
LENGTH_SCALE = 1


def _n(rng, lo, hi):
    """A random length in [lo * LENGTH_SCALE, hi * LENGTH_SCALE)."""
    return int(rng.integers(lo * LENGTH_SCALE, hi * LENGTH_SCALE))


def _req(nc, ns, npr, drafts=None):
    return {"nc": int(nc), "ns": int(ns), "npr": int(npr), "drafts": drafts}


def _decode(rng):
    npr = _n(rng, 1, 60)
    return _req(npr + _n(rng, 0, 40), 1, npr)


def _prefill(rng, hi=60):
    npr = _n(rng, 1, hi)
    return _req(0, npr, npr)


def _prefix_prefill(rng, bs, prefix_blocks=None):
    pb = prefix_blocks if prefix_blocks is not None else int(rng.integers(1, 5))
    nc = pb * bs
    npr = nc + _n(rng, 1, 40)
    return _req(nc, npr - nc, npr)


def _chunked(rng):
    npr = _n(rng, 20, 120)
    nc = int(rng.integers(1, npr))
    return _req(nc, int(rng.integers(1, npr - nc + 1)), npr)


def _spec(rng):
    npr = _n(rng, 1, 40)
    n = int(rng.integers(1, 5))
    drafts = [int(x) if rng.random() > 0.25 else -1 for x in rng.integers(1, 32000, n)]
    ns = sum(1 for x in drafts if x != -1) + 1
    return _req(npr + int(rng.integers(0, 30)), ns, npr, drafts)


def _multi_token_decode(rng):
    """A request past its prompt scheduling several tokens without drafts (uattn treats it as a decode)."""
    npr = int(rng.integers(1, 30))
    return _req(npr + int(rng.integers(0, 20)), int(rng.integers(2, 5)), npr)


def random_requests(rng, kind, bs):
    """A kind's requests and prefix groups: (list of _req, list of (member indices, prefix blocks))."""
    groups = []
    if kind == "decode":
        reqs = [_decode(rng) for _ in range(int(rng.integers(1, 7)))]
    elif kind == "prefill":
        reqs = [_prefill(rng) for _ in range(int(rng.integers(1, 4)))]
    elif kind == "prefix-prefill":
        pb = int(rng.integers(1, 4))
        reqs = [_prefix_prefill(rng, bs, pb) for _ in range(int(rng.integers(2, 4)))]
        groups.append((list(range(len(reqs))), pb))
        reqs.append(_prefix_prefill(rng, bs))
    elif kind == "chunked":
        reqs = [_chunked(rng) for _ in range(int(rng.integers(1, 4)))]
    elif kind == "mixed":
        makers = [lambda: _decode(rng), lambda: _prefill(rng, 40), lambda: _prefix_prefill(rng, bs),
                  lambda: _chunked(rng), lambda: _spec(rng), lambda: _multi_token_decode(rng)]
        reqs = [_prefill(rng, 40), _decode(rng)]
        reqs += [makers[int(rng.integers(0, len(makers)))]() for _ in range(int(rng.integers(1, 5)))]
        # two decodes over a common cached prefix (parallel sampling)
        pb = int(rng.integers(1, 3))
        npr = pb * bs + int(rng.integers(0, bs))
        a, b = len(reqs), len(reqs) + 1
        reqs += [_req(npr + int(rng.integers(0, 10)), 1, npr), _req(npr + int(rng.integers(0, 10)), 1, npr)]
        groups.append(([a, b], pb))
    elif kind == "spec-decode":
        reqs = [_spec(rng) for _ in range(int(rng.integers(1, 5)))]
        reqs += [_decode(rng) for _ in range(int(rng.integers(0, 3)))]
    elif kind == "shared-prefix":
        pb = int(rng.integers(2, 7))
        reqs = []
        for _ in range(int(rng.integers(6, 17))):
            nc = pb * bs + int(rng.integers(0, 2 * bs))
            x = rng.random()
            if x < 0.6:
                reqs.append(_req(nc, 1, pb * bs))
            elif x < 0.8:
                drafts = [int(v) for v in rng.integers(1, 32000, int(rng.integers(1, 4)))]
                reqs.append(_req(nc, len(drafts) + 1, pb * bs, drafts))
            else:
                ns = int(rng.integers(1, 12))
                reqs.append(_req(nc, ns, nc + ns))
        groups.append((list(range(len(reqs))), pb))
    else:
        raise SystemExit("make-step: unknown kind %r (one of %s)" % (kind, ", ".join(KINDS)))
    return reqs, groups


def allocate_blocks(rng, reqs, groups, bs, spare):
    """Block tables: each prefix group's first blocks are common (fully cached in every member), every other
    block private; ids shuffled over num_blocks = needed + spare. Rows may carry -1 padding."""
    in_group = {}  # request -> (group index, common prefix blocks)
    group_blocks = []
    for gi, (members, pb) in enumerate(groups):
        pb = min([pb] + [reqs[m]["nc"] // bs for m in members])  # fully cached in every member
        group_blocks.append(pb)
        for m in members:
            in_group[m] = (gi, pb)
    needed = [-(-(r["nc"] + r["ns"]) // bs) for r in reqs]
    prefix_ids = {}
    num_blocks = sum(needed) - sum(pb for _, pb in in_group.values()) + sum(group_blocks) + spare
    ids = [int(x) for x in rng.permutation(num_blocks)]
    tables = []
    for i, r in enumerate(reqs):
        row = []
        gid, pb = in_group.get(i, (None, 0))
        if gid is not None and gid not in prefix_ids:
            prefix_ids[gid] = [ids.pop() for _ in range(pb)]
        row += prefix_ids[gid] if gid is not None else []
        row += [ids.pop() for _ in range(needed[i] - len(row))]
        row += [-1] * int(rng.integers(0, 3))
        tables.append(row)
    return tables, num_blocks


def validate_tables(reqs, tables, bs):
    """Asserts the brief's rule: a block id at one position only across requests unless it is a fully cached
    prefix block at the same position in every request holding it; blocks written this step private."""
    where = {}
    for i, (r, row) in enumerate(zip(reqs, tables)):
        for o in range(-(-(r["nc"] + r["ns"]) // bs)):
            blk, cached = row[o], (o + 1) * bs <= r["nc"]
            assert blk >= 0
            if blk in where:
                o2, cached2, i2 = where[blk]
                assert i2 != i and o2 == o and cached and cached2, "block %d reused badly" % blk
            where[blk] = (o, cached, i)


def cmd_make_step(args):
    global LENGTH_SCALE
    LENGTH_SCALE = 8 if args.long else 1
    rng = np.random.default_rng(args.seed)
    kind = args.kind
    bs = args.block_size or int(rng.choice([16, 32] if args.layout == "TILED" else [4, 8, 16, 16]))
    heads = [(8, 2), (4, 4), (4, 1), (6, 3), (2, 1), (8, 8)]
    hq, hkv = heads[int(rng.integers(0, len(heads)))]
    hq, hkv = args.num_q_heads or hq, args.num_kv_heads or hkv
    if hq % hkv:
        hkv = hq
    d = args.head_dim or int(rng.choice([16, 32, 64]))
    dv = args.head_dim_v or d
    if args.kv_latent and (not args.head_dim_v or dv > d or args.layout == "TILED"):
        raise SystemExit("make-step: --kv-latent needs --head-dim-v in [1, head dim] and an NHD or HND layout "
                         "(got %s, %d, %s)" % (args.head_dim_v, d, args.layout))
    if args.layout == "TILED" and (bs % TILE or d % 2):
        raise SystemExit("make-step: TILED needs a block size that is a multiple of %d and an even head dim "
                         "(got %d, %d)" % (TILE, bs, d))
    cache_dtype = args.cache_dtype or args.dtype
    reqs, groups = random_requests(rng, kind, bs)
    if args.attn_type == "encoder":  # an encoder-only model: whole prompts, no cached context
        reqs = [_req(0, r["ns"] + r["nc"], r["ns"] + r["nc"]) for r in reqs]
        groups = []
    tables, num_blocks = allocate_blocks(rng, reqs, groups, bs, int(rng.integers(0, 6)))
    validate_tables(reqs, tables, bs)
    T = sum(r["ns"] for r in reqs)

    step = {"block_size": bs, "num_blocks": num_blocks, "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d,
            "dtype": args.dtype, "cache_dtype": cache_dtype, "kv_layout": args.layout,
            "scale": float(args.scale if args.scale is not None else 1.0 / math.sqrt(d)),
            "soft_cap": float(args.soft_cap), "sliding_window": int(args.sliding_window),
            "attn_type": args.attn_type}
    if args.head_dim_v:
        step["head_dim_v"] = dv
    if args.kv_latent:
        step["kv_latent"] = True
    cw = args.causal_width if args.causal_width is not None else int(rng.choice([-1, 4, 7, 16, 512]))
    if cw >= 0:
        step["causal_width"] = cw
    cs = args.chunk_size if args.chunk_size is not None else int(rng.choice([-1, 0, 1, 2, 3]))
    if cs >= 0:
        step["chunk_size"] = cs
    if args.threads is not None or rng.random() < 0.5:
        step["threads"] = args.threads if args.threads is not None else int(rng.integers(1, 3))
    step["requests"] = []
    for r, row in zip(reqs, tables):
        e = {"num_computed": r["nc"], "num_scheduled": r["ns"], "num_prompt": r["npr"], "block_table": row}
        if r["drafts"]:
            e["num_scheduled"] = 1 + len(r["drafts"])
            e["draft_tokens"] = r["drafts"]
        step["requests"].append(e)

    os.makedirs(args.out, exist_ok=True)
    sd = storage_dtype(args.dtype)
    tensors = {}

    def save(name, key, arr):
        np.save(os.path.join(args.out, name), np.ascontiguousarray(arr))
        tensors[key] = name

    qk_scale = args.qk_scale
    save("q.npy", "q", from_f32(rng.standard_normal((T, hq, d)) * qk_scale, args.dtype).astype(sd))
    save("k.npy", "k", from_f32(rng.standard_normal((T, hkv, d)) * qk_scale, args.dtype).astype(sd))
    if not args.kv_latent:  # a latent step's values are its keys' first dv dims
        save("v.npy", "v", from_f32(rng.standard_normal((T, hkv, dv)), args.dtype).astype(sd))
    cd = storage_dtype(cache_dtype)
    caches = (("kc.npy", "key_cache", qk_scale, d),) + (() if args.kv_latent else (("vc.npy", "value_cache", 1.0, dv),))
    for name, key, std, width in caches:
        nhd = from_f32(rng.standard_normal((num_blocks * bs, hkv, width)) * std, cache_dtype).astype(cd)
        save(name, key, cache_from_nhd(nhd, args.layout, key[:-len("_cache")], bs))
    if args.sinks:
        save("sinks.npy", "sinks", (rng.standard_normal(hq) * 2).astype(np.float32))
    if args.alibi:
        slopes = 2.0 ** (-8.0 * (np.arange(hq) + 1) / hq)
        save("alibi.npy", "alibi_slopes", slopes.astype(np.float32))
    step["tensors"] = tensors
    path = os.path.join(args.out, "step.json")
    with open(path, "w") as f:
        json.dump(step, f, indent=1)
    print("make-step: %s: kind %s, %d requests, %d query rows, bs %d, %s/%s %s, Hq %d Hkv %d D %d Dv %d%s -> %s"
          % (args.seed, kind, len(reqs), T, bs, args.dtype, cache_dtype, args.layout, hq, hkv, d, dv,
             " kv_latent" if args.kv_latent else "", path))
