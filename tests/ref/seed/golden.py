"""The golden fixtures of seed_unified_batch.py: the configs and batch kinds, the random batch maker (Gen,
random_case), the docs' worked examples, the parity rule between the two modes (choice 10), the fixture
validity check and the `golden` command (generate, cmd_golden).
"""

import json
import os
import random
import sys
import time

from .planner import apply_spec_rule, bucket_range, generate_unified_buckets, plan, to_json_outputs

# ------------------------------------------------------------------------------------------------------
# Random batches
# ------------------------------------------------------------------------------------------------------

# (block_size, max_num_seqs, max_num_batched_tokens, max_model_len, num_blocks, chunk_size, bucketing)
CONFIGS = [
    (1, 8, 256, 256, 2048, 0, "none"),
    (1, 4, 128, 192, 1024, 0, "seed"),
    (1, 1, 64, 64, 256, 0, "seed"),
    (2, 8, 256, 512, 2048, 0, "none"),
    (3, 8, 256, 384, 1024, 0, "seed"),
    (4, 16, 512, 512, 1024, 0, "none"),
    (4, 4, 64, 256, 512, 0, "seed"),
    (5, 8, 256, 640, 1024, 0, "none"),
    (7, 8, 256, 448, 600, 3, "seed"),
    (8, 16, 512, 1024, 1024, 4, "seed"),
    (8, 32, 512, 1024, 2048, 0, "none"),
    (16, 32, 1024, 2048, 1024, 0, "none"),
    (16, 16, 512, 2048, 512, 8, "seed"),
    (32, 8, 512, 2048, 512, 0, "seed"),
    (32, 16, 512, 4096, 1024, 0, "none"),
    (64, 8, 512, 4096, 256, 0, "none"),
    (64, 16, 1024, 4096, 512, 2, "seed"),
    (128, 8, 1024, 4096, 256, 0, "seed"),
    (128, 8, 512, 8192, 256, 0, "none"),
    (256, 8, 1024, 8192, 128, 2, "seed"),
    (256, 4, 512, 4096, 64, 0, "none"),
]

KINDS = ["decode_only", "prefill_only", "prefix_prefill", "chunked", "spec_decode", "prefix_sharing", "mixed",
         "mixed", "async_last", "async_mid", "async_spec", "empty_context"]


def _cfg_dict(t):
    bs, S, mnbt, mml, nb, chunk, bucketing = t
    return dict(block_size=bs, num_blocks=nb, max_num_seqs=S, max_num_batched_tokens=mnbt, max_model_len=mml,
                chunk_size=chunk, bucketing=bucketing)


class Gen:
    """Draws requests that respect one config's limits and builds a valid step around them."""

    def __init__(self, g, cfg):
        self.g, self.cfg = g, cfg
        bs, mml = cfg["block_size"], cfg["max_model_len"]
        # keep contexts to a few dozen blocks so fixtures stay small
        self.ctx_cap = min(mml - 9, max(bs * self.g.choice([4, 8, 24, 48]), 16))
        self.q_cap = min(cfg["max_num_batched_tokens"], self.g.choice([8, 16, 32, 64, 128]))

    def rnd_ctx(self, lo=0):
        return self.g.randint(lo, max(lo, self.ctx_cap))

    def decode(self, prefix_k=0):
        bs = self.cfg["block_size"]
        nc = self.rnd_ctx(max(1, prefix_k * bs))
        return dict(nc=nc, ns=1, np=self.g.randint(1, nc), drafts=[], k=prefix_k)

    def spec(self, prefix_k=0):
        bs = self.cfg["block_size"]
        nc = self.rnd_ctx(max(1, prefix_k * bs))
        n = self.g.randint(1, 7)
        drafts = [(-1 if self.g.random() < 0.25 else self.g.randint(0, 31999)) for _ in range(n)]
        return dict(nc=nc, ns=1 + n, np=self.g.randint(1, nc), drafts=drafts, k=prefix_k)

    def prefill(self):
        n = self.g.randint(1, self.q_cap)
        return dict(nc=0, ns=n, np=n, drafts=[], k=0)

    def prefix_prefill(self, prefix_k=None):
        bs = self.cfg["block_size"]
        if prefix_k is None:
            prefix_k = self.g.randint(1, max(1, self.ctx_cap // bs))
        n = self.g.randint(1, self.q_cap)
        return dict(nc=prefix_k * bs, ns=n, np=prefix_k * bs + n, drafts=[], k=prefix_k)

    def chunk(self, last):
        nc = self.rnd_ctx(1)
        n = self.g.randint(1, self.q_cap)
        extra = 0 if last else self.g.randint(1, 64)
        return dict(nc=nc, ns=n, np=nc + n + extra, drafts=[], k=0)

    def partial(self):
        return self.chunk(last=False)

    def any(self):
        f = self.g.choice([self.decode, self.decode, self.spec, self.prefill, self.prefix_prefill,
                           lambda: self.chunk(True), self.partial])
        return f()

    def requests(self, kind):
        g, S = self.g, self.cfg["max_num_seqs"]
        n = g.randint(1, S)
        if kind == "decode_only":
            return [self.decode() for _ in range(g.randint(1, S))]
        if kind == "prefill_only" or kind == "empty_context":
            return [self.prefill() for _ in range(g.randint(1, min(S, 4)))]
        if kind == "prefix_prefill":
            return [self.prefix_prefill() if g.random() < 0.7 else self.prefill() for _ in range(min(n, 4))]
        if kind == "chunked":
            return [self.chunk(g.random() < 0.5) for _ in range(min(n, 4))]
        if kind == "spec_decode":
            return [self.spec() if g.random() < 0.7 else self.decode() for _ in range(n)]
        if kind == "prefix_sharing":
            return None  # built by the caller, it needs the shared prefix
        if kind == "mixed":
            return [self.any() for _ in range(n)]
        if kind == "async_spec":
            # spec decodes and one or two partial prompts: the seed's rule (num_reqs - num_logits == 1)
            # and uattn's (exactly one request samples nothing) disagree here
            return [self.spec() for _ in range(max(1, n - 2))] + [self.partial() for _ in range(g.randint(1, 2))]
        if kind == "async_last":
            return [self.any() for _ in range(n - 1)] + [self.partial()]
        if kind == "async_mid":
            others = [self.decode() if g.random() < 0.6 else self.chunk(True) for _ in range(max(1, n - 1))]
            i = g.randint(0, len(others) - 1)
            return others[:i] + [self.partial()] + others[i:]
        raise ValueError(kind)


def _eff_ns(r):
    return 1 + sum(1 for d in r["drafts"] if d != -1) if r["drafts"] else r["ns"]


def _fits(cfg, reqs):
    mml = cfg["max_model_len"]
    if not reqs or len(reqs) > cfg["max_num_seqs"]:
        return False
    if sum(_eff_ns(r) for r in reqs) > cfg["max_num_batched_tokens"]:
        return False
    return all(r["nc"] + _eff_ns(r) <= mml and r["np"] >= 1 for r in reqs)


def _trim(cfg, reqs):
    """Drops requests that are too long, then requests from the front until the batch fits its limits
    (the front, so that the last request of an async case stays last)."""
    mml = cfg["max_model_len"]
    reqs = [r for r in reqs if r["nc"] + _eff_ns(r) <= mml]
    while reqs and not _fits(cfg, reqs):
        reqs.pop(0 if len(reqs) > 1 else -1)
    return reqs


def build_step(g, cfg, reqs, prefix, async_scheduling, with_tokens, padded_cols):
    """Block table, token ids and drafts for the requests: shared prefix blocks first (full, cached, never
    written), then private fresh ids; block 0 is never used and pads the rows."""
    bs = cfg["block_size"]
    need = 0
    for r in reqs:
        seq = r["nc"] + _eff_ns(r)
        need += -(-seq // bs) - r["k"]
    need += len(prefix)
    if need + 1 > cfg["num_blocks"]:
        return None
    hi = cfg["num_blocks"] - 1 if g.random() < 0.15 else min(cfg["num_blocks"] - 1, need * g.choice([1, 2, 3]) + 4)
    ids = g.sample(range(1, hi + 1), need)
    pre_ids, ids = ids[:len(prefix)], ids[len(prefix):]
    rows, pos = [], 0
    for r in reqs:
        seq = r["nc"] + _eff_ns(r)
        nb = -(-seq // bs)
        assert r["k"] * bs <= r["nc"]
        row = pre_ids[:r["k"]] + ids[pos:pos + nb - r["k"]]
        pos += nb - r["k"]
        rows.append(row)
    stride = max(len(row) for row in rows) + padded_cols
    table = [row + [0] * (stride - len(row)) for row in rows]
    tokens = None
    if with_tokens:
        tstride = max(r["nc"] + _eff_ns(r) for r in reqs) + g.randint(0, 3)
        common = [g.randint(0, 31999) for _ in range(len(prefix) * bs)]
        tokens = []
        for r in reqs:
            row = [g.randint(0, 31999) for _ in range(tstride)]
            row[:r["k"] * bs] = common[:r["k"] * bs]
            real = [d for d in r["drafts"] if d != -1]
            row[r["nc"] + 1:r["nc"] + 1 + len(real)] = real
            tokens.append(row)
    has_drafts = any(r["drafts"] for r in reqs)
    return dict(num_computed=[r["nc"] for r in reqs], num_scheduled=[r["ns"] for r in reqs],
                num_prompt=[r["np"] for r in reqs], block_table=table, token_ids=tokens,
                draft_tokens=[list(r["drafts"]) for r in reqs] if has_drafts or g.random() < 0.2 else None,
                async_scheduling=bool(async_scheduling))


def random_case(g, cfg, kind):
    gen = Gen(g, cfg)
    bs = cfg["block_size"]
    prefix = []
    for _attempt in range(50):
        if kind == "prefix_sharing":
            P = g.randint(1, max(1, gen.ctx_cap // bs))
            prefix = list(range(P))
            reqs = []
            for _ in range(g.randint(2, cfg["max_num_seqs"]) if cfg["max_num_seqs"] > 1 else 1):
                k = g.randint(1, P)
                f = g.choice([gen.decode, gen.decode, gen.spec, gen.prefix_prefill])
                reqs.append(f(k))
        else:
            reqs = gen.requests(kind)
            prefix = []
        if kind not in ("async_last", "async_mid", "async_spec"):
            g.shuffle(reqs)
        reqs = _trim(cfg, reqs)
        if not reqs:
            continue
        if kind == "prefix_sharing" or g.random() < 0.5:
            # requests drawn with k cached prefix blocks share the first k blocks of one common prefix
            prefix = list(range(max([r["k"] for r in reqs] + [0])))
        else:
            prefix = []
            for r in reqs:
                r["k"] = 0
        step = build_step(g, cfg, reqs, prefix, async_scheduling=kind.startswith("async") or g.random() < 0.1,
                          with_tokens=g.random() < 0.8, padded_cols=g.choice([0, 0, 1, 3]))
        if step is not None:
            return step
    raise RuntimeError("could not draw a %s batch for %r" % (kind, cfg))


def docs_example():
    """The docs' worked example: block size 4, query lengths [8, 4, 1, 1], contexts [0, 4, 6, 4]: two
    prompts (the second a prefix prefill whose first block it shares with the fourth request) and two
    decodes."""
    cfg = dict(block_size=4, num_blocks=16, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
               chunk_size=0, bucketing="none")
    tok = [[100 + i for i in range(12)], [200 + i for i in range(12)], [300 + i for i in range(12)],
           [200 + i for i in range(4)] + [400 + i for i in range(8)]]
    step = dict(num_computed=[0, 4, 6, 4], num_scheduled=[8, 4, 1, 1], num_prompt=[8, 8, 5, 4],
                block_table=[[1, 2, 0], [3, 4, 0], [5, 6, 0], [3, 7, 0]], token_ids=tok, draft_tokens=None,
                async_scheduling=False)
    return cfg, step


def async_seed_rule_example():
    """Async scheduling where the two rules part: a spec decode sampling 2 positions and two partial prompts.
    num_reqs - num_logits == 1, so the seed appends a row (the last) and reports request 2; uattn sees two
    requests that sample nothing and appends none."""
    cfg, _ = docs_example()
    step = dict(num_computed=[9, 3, 5], num_scheduled=[3, 4, 2], num_prompt=[6, 20, 30],
                block_table=[[1, 2, 3], [4, 5, 0], [6, 7, 0]], token_ids=None,
                draft_tokens=[[17, -1], [], []], async_scheduling=True)
    return cfg, step


PARITY_KEYS = ["num_scheduled", "query_start_loc", "seq_lens", "is_prompt", "num_output_tokens", "token_groups",
               "token_offsets", "token_positions", "token_ids", "slot_mapping", "token_context_lens",
               "logits_indices", "logits_groups", "new_token_positions", "invalid_req_indices", "shared_blocks",
               "shared_usage", "causal_mask", "unique_blocks", "unique_block_mapping", "unique_usage",
               "exact_bucket", "padded_bucket", "bucket_fallback", "buckets"]


def parity_keys(ju, js, b):
    """The keys the seed agrees with uattn on (seed_unified_batch.py's docstring, choice 10)."""
    out = set(PARITY_KEYS)
    if "buckets" not in ju:
        out.discard("buckets")
    prompt = b["is_prompt"]
    if prompt.any() and (~prompt).any():
        out.discard("causal_mask")
    if ((~prompt) & (b["num_scheduled"] > 1)).any():
        out -= {"shared_blocks", "shared_usage", "unique_blocks", "unique_block_mapping", "unique_usage",
                "token_context_lens", "exact_bucket", "padded_bucket", "bucket_fallback"}
    su, ss = ju["invalid_req_indices"], js["invalid_req_indices"]
    if su or ss:
        out -= {"logits_groups", "new_token_positions", "exact_bucket", "padded_bucket"}
        if not (su == ss == [b["num_reqs"] - 1]):
            out -= {"logits_indices", "invalid_req_indices"}
    return [k for k in PARITY_KEYS if k in out]


def validate_step(cfg, step):
    """Asserts that a fixture's batch is one the C planner must accept: within the config's limits, every
    block id used in range, each block at one position only, blocks written this step private."""
    bs, R = cfg["block_size"], len(step["num_computed"])
    ns = apply_spec_rule(step["num_scheduled"], step.get("draft_tokens"))
    assert 1 <= R <= cfg["max_num_seqs"] and int(ns.sum()) <= cfg["max_num_batched_tokens"]
    assert len(set(len(row) for row in step["block_table"])) == 1
    where = {}
    for r in range(R):
        nc, n, npr = step["num_computed"][r], int(ns[r]), step["num_prompt"][r]
        seq = nc + n
        assert nc >= 0 and n >= 1 and npr >= 1 and seq <= cfg["max_model_len"]
        row = step["block_table"][r]
        assert len(row) * bs >= seq
        if step.get("token_ids") is not None:
            assert len(step["token_ids"][r]) >= seq
        for o in range(-(-seq // bs)):
            blk, writes = row[o], o * bs + bs > nc
            assert 1 <= blk < cfg["num_blocks"]
            if blk in where:
                o2, w2 = where[blk]
                assert o2 == o and not writes and not w2, "block %d reused badly" % blk
            where[blk] = (o, writes)


def make_case(name, cfg, step, buckets, first_of_config):
    validate_step(cfg, step)
    ou, b = plan(cfg, step, "uattn", buckets)
    os_, _ = plan(cfg, step, "seed", buckets)
    ju = to_json_outputs(ou, buckets if first_of_config and buckets is not None else None)
    js = to_json_outputs(os_, buckets if first_of_config and buckets is not None else None)
    if first_of_config and buckets is None:
        ju["buckets"] = []
        js["buckets"] = []
    par = parity_keys(ju, js, b)
    for k in par:
        assert ju[k] == js[k], "case %s: parity key %s differs" % (name, k)
    js["parity"] = par
    return {"name": name, "config": cfg, "step": step, "uattn": ju, "seed": js}


def generate(count, seed):
    g = random.Random(seed)
    cases = []
    seen = set()
    cfg, step = docs_example()
    cases.append(make_case("docs_example", cfg, step, None, True))
    seen.add(json.dumps(cfg, sort_keys=True))
    cfg, step = async_seed_rule_example()
    cases.append(make_case("async_seed_rule", cfg, step, None, False))
    configs = [_cfg_dict(t) for t in CONFIGS]
    bucket_lists = {}
    i = 0
    while len(cases) < count:
        cfg = configs[i % len(configs)]
        kind = KINDS[(i // len(configs) + i) % len(KINDS)]
        key = json.dumps(cfg, sort_keys=True)
        if key not in bucket_lists:
            bucket_lists[key] = generate_unified_buckets(cfg) if cfg["bucketing"] == "seed" else None
        step = random_case(g, cfg, kind)
        first = key not in seen
        seen.add(key)
        cases.append(make_case("%03d_%s_bs%d" % (len(cases), kind, cfg["block_size"]), cfg, step,
                               bucket_lists[key], first))
        i += 1
    ranges = []
    for cfg in configs:
        S, bs = cfg["max_num_seqs"], cfg["block_size"]
        for mn, mx in ((1, cfg["max_num_batched_tokens"]), (0, min(cfg["max_model_len"] // bs, cfg["num_blocks"])),
                       (0, cfg["num_blocks"])):
            ranges.append({"min": mn, "max": mx, "round_up": S, "values": bucket_range(mn, mx, S)})
    for mn, mx, ru in ((1, 1, 1), (0, 1, 1), (1, 8192, 128), (0, 10000, 256), (1, 7, 3), (0, 65536, 1),
                       (3, 1000, 5), (0, 2, 64)):
        ranges.append({"min": mn, "max": mx, "round_up": ru, "values": bucket_range(mn, mx, ru)})
    return {"cases": cases, "bucket_ranges": ranges}


def cmd_golden(args):
    t0 = time.perf_counter()
    data = generate(args.count, args.seed)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    dt = time.perf_counter() - t0
    sys.stderr.write("wrote %d cases to %s in %.1f s\n" % (len(data["cases"]), args.out, dt))
