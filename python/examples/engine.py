#!/usr/bin/python3
"""A small Llama-style decoder served by a continuous-batching loop, its attention through uattn.

The model: random weights from a fixed seed; token embedding, then per layer RMSNorm, RoPE, grouped-query
attention, SwiGLU MLP; a final RMSNorm and an LM head. The engine:
  - requests arrive over time, each a shared system prompt followed by its own text;
  - the KV cache is paged (one allocation holding every layer's key and value caches, handed to uattn as
    views); full prompt blocks are kept in a prefix cache, so the system prompt is computed once and later
    requests start on its blocks;
  - each step fills a token budget: decodes first (with speculative drafts from an n-gram proposer when
    --spec is given, verified in the same step), then prompt chunks;
  - uattn's planner gives the slots, positions and logits rows; finished requests give their blocks back.
Run in f32, its greedy tokens equal those of `reference_generate`, the same model with plain NumPy dense
attention over unpaged K/V, one request at a time (tests/test_engine.py asserts it). In bf16 the attention
runs on bf16 activations and caches, and the run reports how many tokens still agree.

--mla runs one multi-head latent attention layer (DeepSeek's MLA, random weights) instead: a prompt's prefill
in the expanded form (keys wider than values) and a decode step in the absorbed form (a cache of latents, no
value cache), each against dense attention over the expanded keys and values (mla_demo).

    PYTHONPATH=build/python /usr/bin/python3 python/examples/engine.py --requests 16 --spec 3
    PYTHONPATH=build/python /usr/bin/python3 python/examples/engine.py --mla
"""
import argparse
import collections
import time

import numpy as np

import uattn


# ---- the model ----------------------------------------------------------------------------------------

class Model:
    def __init__(self, seed=0, vocab=2048, hidden=256, layers=3, num_q_heads=4, num_kv_heads=2, head_dim=64,
                 intermediate=512, rope_theta=10000.0):
        rng = np.random.default_rng(seed)
        self.vocab, self.hidden, self.num_layers = vocab, hidden, layers
        self.hq, self.hkv, self.hd = num_q_heads, num_kv_heads, head_dim

        def w(fan_in, *shape):
            return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

        self.embed = rng.standard_normal((vocab, hidden)).astype(np.float32)
        self.layers = []
        for _ in range(layers):
            self.layers.append(dict(
                attn_norm=(1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32),
                wq=w(hidden, hidden, num_q_heads * head_dim), wk=w(hidden, hidden, num_kv_heads * head_dim),
                wv=w(hidden, hidden, num_kv_heads * head_dim), wo=w(num_q_heads * head_dim, num_q_heads * head_dim,
                                                                    hidden),
                mlp_norm=(1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32),
                w_gate=w(hidden, hidden, intermediate), w_up=w(hidden, hidden, intermediate),
                w_down=w(intermediate, intermediate, hidden)))
        self.final_norm = np.ones(hidden, np.float32)
        self.lm_head = w(hidden, hidden, vocab) * 4  # sharper logits: greedy choices far from ties
        inv = 1.0 / rope_theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
        self.rope_inv_freq = inv

    @staticmethod
    def rms_norm(x, g, eps=1e-6):
        return (x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g).astype(np.float32)

    def rope(self, x, positions):
        """Rotary embedding, rotate-half form (Llama's), on [T, H, D]."""
        ang = positions[:, None].astype(np.float64) * self.rope_inv_freq[None, :]
        cos = np.cos(ang).astype(np.float32)[:, None, :]
        sin = np.sin(ang).astype(np.float32)[:, None, :]
        half = self.hd // 2
        x1, x2 = x[..., :half], x[..., half:]
        return np.ascontiguousarray(np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1))

    def run(self, ids, positions, attend):
        """Hidden states of the rows (token ids at positions); attend(layer, q, k, v) -> [T, Hq, D]."""
        x = self.embed[ids]
        T = len(ids)
        for i, L in enumerate(self.layers):
            h = self.rms_norm(x, L["attn_norm"])
            q = self.rope((h @ L["wq"]).reshape(T, self.hq, self.hd), positions)
            k = self.rope((h @ L["wk"]).reshape(T, self.hkv, self.hd), positions)
            v = np.ascontiguousarray((h @ L["wv"]).reshape(T, self.hkv, self.hd))
            a = attend(i, q, k, v)
            x = x + a.reshape(T, -1) @ L["wo"]
            h = self.rms_norm(x, L["mlp_norm"])
            g = h @ L["w_gate"]
            x = x + ((g / (1 + np.exp(-g))) * (h @ L["w_up"])) @ L["w_down"]
        return self.rms_norm(x, self.final_norm)

    def greedy(self, hidden_rows):
        return np.argmax(hidden_rows @ self.lm_head, axis=-1)


# ---- the reference: dense attention, one request at a time ------------------------------------------------

def dense_causal(q, keys, values, q_pos, scale):
    """q [n, Hq, D] at positions q_pos over keys/values [S, Hkv, D] at positions 0..S-1, causal."""
    group = q.shape[1] // keys.shape[1]
    k = np.repeat(keys, group, axis=1)
    v = np.repeat(values, group, axis=1)
    s = scale * np.einsum("nhd,shd->hns", q, k)
    s = np.where(np.arange(len(keys))[None, None, :] <= q_pos[None, :, None], s, -np.inf)
    p = np.exp(s - s.max(axis=2, keepdims=True))
    p /= p.sum(axis=2, keepdims=True)
    return np.einsum("hns,shd->nhd", p, v).astype(np.float32)


def reference_generate(model, prompt, max_new_tokens):
    """Greedy tokens of one request: the prompt at once, then a token at a time, K/V in plain lists."""
    kv = [[np.zeros((0, model.hkv, model.hd), np.float32)] * 2 for _ in range(model.num_layers)]
    scale = 1.0 / np.sqrt(model.hd)

    def attend(i, q, k, v):
        kv[i][0] = np.concatenate([kv[i][0], k])
        kv[i][1] = np.concatenate([kv[i][1], v])
        pos = np.arange(len(kv[i][0]) - len(q), len(kv[i][0]))
        return dense_causal(q, kv[i][0], kv[i][1], pos, scale)

    tokens = list(prompt)
    h = model.run(np.array(tokens), np.arange(len(tokens)), attend)
    out = [int(model.greedy(h[-1:])[0])]
    while len(out) < max_new_tokens:
        p = len(tokens) + len(out) - 1
        h = model.run(np.array([out[-1]]), np.array([p]), attend)
        out.append(int(model.greedy(h)[0]))
    return out


# ---- multi-head latent attention (DeepSeek-V2/V3's MLA) in both of uattn's forms ---------------------------

def rope(x, positions, inv_freq):
    """Rotary embedding, rotate-half form, on [T, H, D] (D = 2 * len(inv_freq))."""
    ang = positions[:, None].astype(np.float64) * inv_freq[None, :]
    cos, sin = (f(ang).astype(np.float32)[:, None, :] for f in (np.cos, np.sin))
    x1, x2 = x[..., :len(inv_freq)], x[..., len(inv_freq):]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class MlaLayer:
    """One MLA layer's attention, random weights. Per token a latent c (kv_rank dims) and a rotary key part k_pe
    (rope_dim, shared by the heads); head h's key is [c W_uk[h], k_pe] and its value c W_uv[h]."""

    def __init__(self, seed=0, hidden=256, heads=4, kv_rank=64, nope_dim=32, rope_dim=16, v_dim=32):
        rng = np.random.default_rng(seed)

        def w(fan_in, *shape):
            return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

        self.heads, self.kv_rank, self.nope, self.rope_dim, self.v_dim = heads, kv_rank, nope_dim, rope_dim, v_dim
        self.w_q = w(hidden, hidden, heads * (nope_dim + rope_dim))
        self.w_dkv, self.w_kr = w(hidden, hidden, kv_rank), w(hidden, hidden, rope_dim)
        self.w_uk, self.w_uv = w(kv_rank, heads, kv_rank, nope_dim), w(kv_rank, heads, kv_rank, v_dim)
        self.scale = 1.0 / np.sqrt(nope_dim + rope_dim)  # the model's, whichever form computes the scores
        self.inv_freq = 1.0 / 10000.0 ** (np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)

    def project(self, h, positions):
        """The query's two parts [T, H, nope] and [T, H, rope], the latents [T, kv_rank], k_pe [T, 1, rope]."""
        q = (h @ self.w_q).reshape(len(h), self.heads, -1)
        q_pe = rope(q[..., self.nope:], positions, self.inv_freq)
        k_pe = rope((h @ self.w_kr)[:, None, :], positions, self.inv_freq)
        return q[..., :self.nope], q_pe, h @ self.w_dkv, k_pe

    def expanded(self, q_nope, q_pe, c, k_pe):
        """The expanded form's q, k [T, H, nope + rope] and v [T, H, v_dim] (head_dim_v = v_dim)."""
        k_nope = np.einsum("tr,hrn->thn", c, self.w_uk)
        k = np.concatenate([k_nope, np.broadcast_to(k_pe, k_nope.shape[:2] + (self.rope_dim,))], axis=-1)
        v = np.einsum("tr,hrv->thv", c, self.w_uv)
        return (np.ascontiguousarray(x, dtype=np.float32) for x in (np.concatenate([q_nope, q_pe], -1), k, v))

    def absorbed(self, q_nope, q_pe, c, k_pe):
        """The absorbed form: W_uk folded into the query, q [T, H, kv_rank + rope], and one KV head of latents
        [T, 1, kv_rank + rope] whose first kv_rank dims are the value (kv_latent, head_dim_v = kv_rank)."""
        q = np.concatenate([np.einsum("thn,hrn->thr", q_nope, self.w_uk), q_pe], axis=-1)
        latent = np.concatenate([c[:, None, :], k_pe], axis=-1)
        return np.ascontiguousarray(q, dtype=np.float32), np.ascontiguousarray(latent, dtype=np.float32)

    def unabsorb(self, out):
        """The absorbed form's output [T, H, kv_rank] through W_uv: the heads' values [T, H, v_dim]."""
        return np.einsum("thr,hrv->thv", out, self.w_uv)


def mla_demo(seed=0, prompt_len=40, verbose=True):
    """One MLA layer over one request: its prompt's prefill in the expanded form, then a decode step in the
    absorbed form over the latent cache an MLA engine keeps; each against dense attention over the expanded
    keys and values of every token. Returns the two largest errors, relative to the largest output."""
    m, bs, nb, P = MlaLayer(seed), 16, 8, prompt_len
    h = np.random.default_rng(seed + 1).standard_normal((P + 1, 256)).astype(np.float32)
    positions = np.arange(P + 1)
    parts = m.project(h, positions)
    q, k, v = m.expanded(*parts)
    ref = dense_causal(q, k, v, positions, m.scale)
    plan = uattn.Plan(bs, nb, 1, P, 256)
    table = np.array([[3, 0, 5, 1]], np.int32)

    # prefill: keys nope + rope wide, values v_dim (the expanded layer's caches are scratch here)
    expanded = uattn.Layer(m.heads, m.heads, m.nope + m.rope_dim, dtype="f32", scale=m.scale, head_dim_v=m.v_dim)
    kc = np.zeros((nb * bs, m.heads, m.nope + m.rope_dim), np.float32)
    vc = np.zeros((nb * bs, m.heads, m.v_dim), np.float32)
    info = plan.step(np.array([0], np.int32), np.array([P], np.int32), np.array([P], np.int32), table)
    out_prefill = uattn.forward(plan, expanded, q[:P], k[:P], v[:P], kc, vc)

    # the latent cache: the prompt's latents at the planned slots, then the decode's written by forward
    qa, latent = m.absorbed(*parts)
    latent_cache = np.zeros((nb * bs, 1, m.kv_rank + m.rope_dim), np.float32)
    latent_cache[info.slot_mapping] = latent[:P]
    absorbed = uattn.Layer(m.heads, 1, m.kv_rank + m.rope_dim, dtype="f32", scale=m.scale, head_dim_v=m.kv_rank,
                           kv_latent=True)
    plan.step(np.array([P], np.int32), np.array([1], np.int32), np.array([P], np.int32), table)
    out_decode = m.unabsorb(uattn.forward(plan, absorbed, qa[P:], latent[P:], None, latent_cache, None))

    top = float(np.abs(ref).max())
    errs = (float(np.abs(out_prefill - ref[:P]).max()) / top, float(np.abs(out_decode - ref[P:]).max()) / top)
    if verbose:
        print(f"MLA, {m.heads} heads: prefill of {P} tokens, expanded form (keys {m.nope + m.rope_dim}, values "
              f"{m.v_dim}): max error {errs[0]:.2g}; decode, absorbed form (latents {m.kv_rank + m.rope_dim}, "
              f"values their first {m.kv_rank}): max error {errs[1]:.2g} (relative to max |out|)")
    return errs


# ---- the engine -----------------------------------------------------------------------------------------

def bf16_bits(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_float(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


class Request:
    def __init__(self, rid, prompt, max_new_tokens, arrival):
        self.rid, self.prompt, self.max_new, self.arrival = rid, list(prompt), max_new_tokens, arrival
        self.tokens = list(prompt)  # prompt, then what was generated
        self.computed = 0           # tokens whose K/V are in the cache
        self.blocks = []
        self.registered = 0         # blocks already in the prefix cache
        self.drafts_proposed = self.drafts_accepted = 0

    @property
    def generated(self):
        return self.tokens[len(self.prompt):]

    @property
    def prefilling(self):
        return self.computed < len(self.prompt)

    @property
    def done(self):
        return len(self.generated) >= self.max_new


class BlockManager:
    """Free blocks, reference counts, and the prefix cache: a full block of prompt tokens is found again by
    the tokens it ends (all of them from position 0, so equal keys mean equal K/V)."""

    def __init__(self, num_blocks, block_size):
        self.bs = block_size
        self.free = collections.deque(range(num_blocks))
        self.ref = np.zeros(num_blocks, np.int64)
        self.cached = {}                             # prefix tokens -> block
        self.key_of = {}                             # block -> prefix tokens
        self.evictable = collections.OrderedDict()   # cached blocks nobody uses, oldest first

    def allocate(self):
        if self.free:
            b = self.free.popleft()
        elif self.evictable:
            b, _ = self.evictable.popitem(last=False)
            del self.cached[self.key_of.pop(b)]
        else:
            raise MemoryError("KV cache full (this engine does not preempt): give it more blocks")
        self.ref[b] = 1
        return b

    def match_prefix(self, prompt):
        """Cached blocks at the start of the prompt; at least one prompt token is left to compute (its
        logits give the first new token)."""
        blocks = []
        for i in range((len(prompt) - 1) // self.bs):
            b = self.cached.get(tuple(prompt[:(i + 1) * self.bs]))
            if b is None:
                break
            if self.ref[b] == 0:
                self.evictable.pop(b, None)
            self.ref[b] += 1
            blocks.append(b)
        return blocks

    def register(self, r):
        """The request's full prompt blocks whose K/V are now written become findable."""
        full = min(r.computed, len(r.prompt)) // self.bs
        for i in range(r.registered, full):
            key = tuple(r.prompt[:(i + 1) * self.bs])
            if key not in self.cached:
                self.cached[key] = r.blocks[i]
                self.key_of[r.blocks[i]] = key
        r.registered = max(r.registered, full)

    def release(self, r):
        for b in r.blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if b in self.key_of:
                    self.evictable[b] = True
                else:
                    self.free.append(b)
        r.blocks = []


def propose_drafts(tokens, k, max_ngram=3):
    """Prompt-lookup drafts: the tokens that followed the last earlier occurrence of the final n-gram,
    the longest n-gram (up to max_ngram) that occurred before."""
    for n in range(max_ngram, 0, -1):
        if k <= 0 or len(tokens) <= n:
            continue
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                return tokens[start + n:start + n + k]
    return []


class Engine:
    def __init__(self, model, dtype="f32", block_size=16, num_blocks=512, max_num_seqs=16, token_budget=96,
                 max_model_len=1024, spec_tokens=0, num_threads=0, proposer=None):
        self.model, self.dtype, self.bs = model, dtype, block_size
        # proposer(request, k) -> up to k draft tokens; the default looks them up in the request's text
        self.proposer = proposer or (lambda r, k: propose_drafts(r.tokens, k))
        self.budget, self.max_seqs, self.spec = token_budget, max_num_seqs, spec_tokens
        self.plan = uattn.Plan(block_size, num_blocks, max_num_seqs, token_budget, max_model_len)
        self.layer = uattn.Layer(model.hq, model.hkv, model.hd, dtype=dtype, kv_layout="NHD")
        self.runtime = uattn.Runtime(num_threads=num_threads)
        # one allocation for every layer's caches; uattn writes the views in place
        store = np.uint16 if dtype == "bf16" else np.float32
        self.kv = np.zeros((model.num_layers, 2, num_blocks * block_size, model.hkv, model.hd), store)
        self.blocks = BlockManager(num_blocks, block_size)
        self.max_model_len = max_model_len
        self.stats = collections.defaultdict(float)

    def _attend(self, i, q, k, v):
        if self.dtype == "bf16":
            q, k, v = bf16_bits(q), bf16_bits(k), bf16_bits(v)
        t0 = time.perf_counter()
        out = uattn.forward(self.plan, self.layer, q, k, v, self.kv[i, 0], self.kv[i, 1], runtime=self.runtime)
        self.stats["attention_s"] += time.perf_counter() - t0
        return bf16_float(out) if self.dtype == "bf16" else out

    def _schedule(self, running):
        budget, batch = self.budget, []
        for r in running:                       # decodes first: their latency is the user's
            if r.prefilling or len(batch) == self.max_seqs or budget == 0:
                continue
            k = min(self.spec, budget - 1, r.max_new - len(r.generated) - 1)
            drafts = list(self.proposer(r, k))[:k] if k > 0 else []
            batch.append((r, 1 + len(drafts), drafts))
            budget -= 1 + len(drafts)
        for r in running:                       # then prompt chunks, oldest request first
            if not r.prefilling or len(batch) == self.max_seqs or budget == 0:
                continue
            n = min(len(r.prompt) - r.computed, budget)
            batch.append((r, n, None))
            budget -= n
        return batch

    def _step(self, batch):
        bs = self.bs
        rows_ids, width = [], 0
        for r, n, _ in batch:
            while len(r.blocks) * bs < r.computed + n:
                r.blocks.append(self.blocks.allocate())
            width = max(width, len(r.blocks))
        table = np.zeros((len(batch), width), np.int32)
        for j, (r, n, drafts) in enumerate(batch):
            table[j, :len(r.blocks)] = r.blocks
            rows_ids += r.tokens[r.computed:r.computed + (n if drafts is None else 1)] + list(drafts or [])
        num_computed = np.array([r.computed for r, _, _ in batch], np.int32)
        num_sched = np.array([n for _, n, _ in batch], np.int32)
        num_prompt = np.array([len(r.prompt) for r, _, _ in batch], np.int32)
        info = self.plan.step(num_computed, num_sched, num_prompt, table,
                              draft_tokens=[d if d else None for _, _, d in batch] if self.spec else None)
        ids = np.array(rows_ids, np.int64)
        hidden = self.model.run(ids, info.token_positions, self._attend)
        # the planner's logits rows, grouped by request in row order
        picks = self.model.greedy(hidden[info.logits_indices]) if info.num_logits else []
        by_req = collections.defaultdict(list)
        for g, tok in zip(info.logits_groups, picks):
            by_req[int(g)].append(int(tok))
        for j, (r, n, drafts) in enumerate(batch):
            if drafts is None:                  # a prompt chunk: the last one samples the first token
                r.computed += n
                if not r.prefilling:
                    r.tokens.append(by_req[j][-1])
            else:                               # a decode, with its drafts verified
                g = by_req[j]
                accepted = 0
                while accepted < len(drafts) and drafts[accepted] == g[accepted]:
                    accepted += 1
                r.drafts_proposed += len(drafts)
                r.drafts_accepted += accepted
                new = (drafts[:accepted] + [g[accepted]])[:r.max_new - len(r.generated)]
                r.computed += 1 + accepted      # the rejected drafts' K/V are overwritten later
                r.tokens += new
            self.blocks.register(r)
        return info

    def serve(self, requests, verbose=True):
        """Runs every request to completion; returns {rid: generated tokens}."""
        pending = sorted(requests, key=lambda r: r.arrival)
        running, finished, step = [], {}, 0
        t_start = time.perf_counter()
        while pending or running:
            while pending and pending[0].arrival <= step and len(running) < self.max_seqs:
                r = pending.pop(0)
                r.blocks = self.blocks.match_prefix(r.prompt)
                r.computed = r.registered = len(r.blocks) * self.bs
                self.stats["prefix_hit_tokens"] += r.computed
                running.append(r)
            batch = self._schedule(running)
            if batch:
                prompt_rows = sum(n for _, n, d in batch if d is None)
                before = sum(len(r.generated) for r, _, _ in batch)
                t0 = time.perf_counter()
                self._step(batch)
                dt = time.perf_counter() - t0
                produced = sum(len(r.generated) for r, _, _ in batch) - before
                phase = "mixed" if prompt_rows and len(batch) > sum(d is None for _, _, d in batch) else \
                    "prefill" if prompt_rows else "decode"
                self.stats[phase + "_s"] += dt
                self.stats[phase + "_steps"] += 1
                self.stats[phase + "_prompt_tokens"] += prompt_rows
                self.stats[phase + "_new_tokens"] += produced
            for r in [r for r in running if r.done]:
                running.remove(r)
                self.blocks.release(r)
                finished[r.rid] = r.generated[:r.max_new]
                self.stats["drafts_proposed"] += r.drafts_proposed
                self.stats["drafts_accepted"] += r.drafts_accepted
            step += 1
        self.stats["wall_s"] = time.perf_counter() - t_start
        self.stats["steps"] = step
        if verbose:
            self.report()
        return finished

    def report(self):
        s = self.stats
        print(f"uattn {uattn.__version__}, {self.dtype}, {self.runtime.num_workers} workers, "
              f"{int(s['steps'])} steps in {s['wall_s']:.2f} s; attention {s['attention_s']:.2f} s")
        for phase in ("prefill", "mixed", "decode"):
            if s[phase + "_steps"]:
                t = s[phase + "_s"]
                print(f"  {phase:8s} {int(s[phase + '_steps']):4d} steps  "
                      f"{s[phase + '_prompt_tokens'] / t:9.1f} prompt tok/s  "
                      f"{s[phase + '_new_tokens'] / t:8.1f} new tok/s")
        print(f"  prefix cache: {int(s['prefix_hit_tokens'])} prompt tokens not recomputed")
        if s["drafts_proposed"]:
            print(f"  speculative: {int(s['drafts_accepted'])} of {int(s['drafts_proposed'])} drafts accepted")
        print(f"  blocks free after the run: {len(self.blocks.free) + len(self.blocks.evictable)} of "
              f"{len(self.blocks.ref)}")


def make_requests(seed, n, vocab, system_len=40, arrival_every=2):
    """A shared system prompt, then each request's own text (with repeats in it, so that the n-gram
    proposer finds drafts), arriving a few steps apart."""
    rng = np.random.default_rng(1000 + seed)
    system = list(rng.integers(0, vocab, system_len))
    reqs = []
    for i in range(n):
        own = list(rng.integers(0, vocab, int(rng.integers(3, 70))))
        if i % 3 == 0:
            own = own + own[: len(own) // 2]
        reqs.append(Request(i, [int(t) for t in system + own], int(rng.integers(6, 24)),
                            arrival=int(i * arrival_every + rng.integers(0, 2))))
    return reqs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--spec", type=int, default=0, help="drafts per decode (0: no speculative decoding)")
    ap.add_argument("--budget", type=int, default=96, help="query tokens per step")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="compare with the dense NumPy reference")
    ap.add_argument("--mla", action="store_true", help="run one multi-head latent attention layer instead")
    args = ap.parse_args()
    if args.mla:
        mla_demo(args.seed)
        return
    model = Model(seed=args.seed)
    reqs = make_requests(args.seed, args.requests, model.vocab)
    prompts = {r.rid: (r.prompt, r.max_new) for r in reqs}
    engine = Engine(model, dtype=args.dtype, token_budget=args.budget, spec_tokens=args.spec,
                    num_threads=args.threads)
    got = engine.serve(reqs)
    if args.check:
        same = total = exact = 0
        for rid, (prompt, n) in prompts.items():
            ref = reference_generate(model, prompt, n)
            agree = next((i for i, (a, b) in enumerate(zip(ref, got[rid])) if a != b), n)
            same += agree
            total += n
            exact += got[rid] == ref
        print(f"reference: {exact} of {len(prompts)} requests identical; {same} of {total} tokens agree "
              f"before the first difference")


if __name__ == "__main__":
    main()
