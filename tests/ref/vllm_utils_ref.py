#!/usr/bin/python3
"""Golden outputs for tests/vllm/test_batch_utils/golden.c: vLLM's batch helpers re-stated in numpy.

Each function below follows its seed (vllm/v1/attention/backends/utils.py, vllm/attention/backends/utils.py)
operation by operation, in the seed's vectorized numpy form, so that its quirks (numpy's modulo of a negative
divisor, negative indexing, clip(max=) only) come out as the seed's do. It shares no code with the C.

Usage: vllm_utils_ref.py [--seed N] [--cases N] [--only SECTION]   (JSON on stdout)
"""
import argparse
import functools
import json
import sys

import numpy as np

PAD_SLOT_ID = -1


def cdiv(a, b):
    return -(a // -b)


# ---- v1: split_decodes_and_prefills ---------------------------------------------------------------
def split_decodes_and_prefills(qsl, num_tokens, decode_threshold, require_uniform):
    qsl = np.asarray(qsl, dtype=np.int64)
    num_reqs = len(qsl) - 1
    query_lens = qsl[1:] - qsl[:-1]
    max_query_len = int(query_lens.max()) if num_reqs else 0
    if max_query_len <= decode_threshold and (not require_uniform or decode_threshold <= 1):
        return num_reqs, 0, num_tokens, 0
    if num_reqs == 0:  # the seed would index query_lens[0]; uattn defines this case as all-decode
        return 0, 0, num_tokens, 0
    if query_lens[0] > decode_threshold:
        return 0, num_reqs, 0, num_tokens
    if require_uniform:
        if np.all((query_lens == query_lens[0]) | (query_lens == 0)):
            if num_reqs * query_lens[0] != num_tokens:
                return "error"
            return num_reqs, 0, num_tokens, 0
        is_prefill = query_lens != query_lens[0]
    else:
        is_prefill = query_lens > decode_threshold
    if not np.any(is_prefill):
        return num_reqs, 0, num_tokens, 0
    first_prefill = int(is_prefill.astype(np.int32).argmax())
    assert np.all(query_lens[:first_prefill] <= decode_threshold)
    num_decode_tokens = int(qsl[first_prefill])
    return first_prefill, num_reqs - first_prefill, num_decode_tokens, num_tokens - num_decode_tokens


# ---- v1: split_decodes_prefills_and_extends --------------------------------------------------------
def split_decodes_prefills_and_extends(qsl, seq_lens, num_tokens, decode_threshold):
    qsl = np.asarray(qsl, dtype=np.int64)
    seq_lens = np.asarray(seq_lens, dtype=np.int64)
    num_reqs = len(qsl) - 1
    query_lens = qsl[1:] - qsl[:-1]
    max_query_len = int(query_lens.max()) if num_reqs else 0
    if max_query_len <= decode_threshold:
        return num_reqs, 0, 0, num_tokens, 0, 0
    is_prefill_or_extend = query_lens > decode_threshold
    is_prefill = (seq_lens == query_lens) & is_prefill_or_extend
    first_extend = int(is_prefill_or_extend.astype(np.int32).argmax())
    first_prefill = int(is_prefill.astype(np.int32).argmax())
    num_decodes = first_extend
    num_decode_tokens = int(qsl[first_extend])
    if not np.any(is_prefill_or_extend):
        return num_decodes, 0, 0, num_decode_tokens, 0, 0
    num_pe = num_reqs - num_decodes
    num_pe_tokens = num_tokens - num_decode_tokens
    if not np.any(is_prefill):
        return num_decodes, num_pe, 0, num_decode_tokens, num_pe_tokens, 0
    num_extends = first_prefill - num_decodes
    num_prefills = num_reqs - first_prefill
    num_prefill_tokens = num_tokens - int(qsl[first_prefill])
    return (num_decodes, num_extends, num_prefills, num_decode_tokens, num_pe_tokens - num_prefill_tokens,
            num_prefill_tokens)


# ---- v1: reorder_batch_to_split_decodes_and_prefills (the seed's own swap sequence) -----------------
def reorder_seed(num_scheduled, num_computed, decode_threshold):
    """Returns (the seed's swaps, the batch after them as original indices)."""
    num_scheduled = np.asarray(num_scheduled)
    num_computed = np.asarray(num_computed)
    num_reqs = len(num_scheduled)
    is_prefill = num_computed == 0
    is_decode = (num_scheduled <= decode_threshold) & (~is_prefill)
    is_extend = (num_scheduled > decode_threshold) & (~is_prefill)
    req_regions = np.zeros(num_reqs, dtype=np.int32)
    req_regions[is_extend] = 1
    req_regions[is_prefill] = 2
    num_decodes = int(is_decode.sum())
    num_extends = int(is_extend.sum())
    target = np.zeros(num_reqs, dtype=np.int32)
    target[num_decodes:num_decodes + num_extends] = 1
    target[num_decodes + num_extends:] = 2
    return follow_swaps(req_regions, target)


def follow_swaps(req_regions, target):
    """The seed's and today's shared tail: move the misplaced requests, taken in stable region order, onto
    the misplaced positions, following each cycle of that assignment."""
    needs_swap = req_regions != target
    batch = list(range(len(req_regions)))
    swaps = []
    if not needs_swap.any():
        return swaps, batch
    orig = np.where(needs_swap)[0]
    src_indices = orig[np.argsort(req_regions[needs_swap], kind="stable")]
    src_dest = {int(s): int(d) for s, d in zip(src_indices, orig)}
    for src in src_dest:
        dst = src_dest[src]
        while src != dst:
            swaps.append((src, dst))
            batch[src], batch[dst] = batch[dst], batch[src]
            nxt = src_dest.get(dst, dst)
            src_dest[dst] = dst
            dst = nxt
    return swaps, batch


# ---- v1: today's reorder_batch_to_split_decodes_and_prefills (four regions, prompt lengths) ----------
def regions_vllm(num_scheduled, num_computed, num_prompt, decode_threshold):
    """Today's vLLM's region of each request: 0 decode, 1 short extend, 2 long extend, 3 prefill."""
    num_scheduled = np.asarray(num_scheduled)
    num_computed = np.asarray(num_computed)
    num_prompt = np.asarray(num_prompt)
    has_context = num_computed > 0
    is_below_threshold = num_scheduled <= decode_threshold
    done_prefilling = num_computed >= num_prompt
    req_regions = np.zeros(len(num_scheduled), dtype=np.int32)
    req_regions[has_context & is_below_threshold & ~done_prefilling] = 1
    req_regions[has_context & ~is_below_threshold] = 2
    req_regions[~has_context] = 3
    return req_regions


def reorder_vllm(num_scheduled, num_computed, num_prompt, decode_threshold):
    """Returns (today's vLLM's swaps, the batch after them as original indices)."""
    req_regions = regions_vllm(num_scheduled, num_computed, num_prompt, decode_threshold)
    counts = [int((req_regions == r).sum()) for r in range(4)]
    return follow_swaps(req_regions, np.repeat([0, 1, 2, 3], counts).astype(np.int32))


def fewest_swaps(regions):
    """The fewest swaps that sort a list of region numbers, counted without the library's argument: a swap
    sequence's permutation needs (its moved requests) - (its cycles) swaps, and its cycles can at best be
    a split of the misplaced requests (edges zone sat in -> zone to reach) into simple zone cycles; the
    most cycles any split has is found here by trying every cycle through one edge at each step."""
    regions = list(regions)
    k = max(regions) + 1 if regions else 0
    target = sorted(regions)
    edges = {}
    for sat, want in zip(target, regions):
        if sat != want:
            edges[(sat, want)] = edges.get((sat, want), 0) + 1
    keys = sorted(edges)

    def cycles_through(u, v):  # every simple zone cycle u -> v -> ... -> u, as its list of zones
        out = []

        def walk(path):
            for w in range(k):
                if w == u:
                    out.append(path + [u])
                elif w not in path:
                    walk(path + [w])
        walk([u, v])
        return out

    @functools.lru_cache(maxsize=None)
    def most(state):
        left = dict(zip(keys, state))
        first = next((e for e in keys if left[e]), None)
        if first is None:
            return 0
        best = None
        for cyc in cycles_through(*first):
            used = list(zip(cyc[:-1], cyc[1:]))
            if all(left.get(e, 0) >= used.count(e) for e in used):
                nxt = dict(left)
                for e in used:
                    nxt[e] -= 1
                got = 1 + most(tuple(nxt[e] for e in keys))
                best = got if best is None else max(best, got)
        assert best is not None, "an Eulerian edge set always closes a cycle"
        return best

    return sum(edges.values()) - most(tuple(edges[e] for e in keys))


# ---- v1: make_local_attention_virtual_batches -------------------------------------------------------
def make_local_attention_virtual_batches(attn_chunk_size, qsl, seq_lens, block_table, block_size):
    query_start_loc_np = np.asarray(qsl, dtype=np.int32)
    seq_lens_np = np.asarray(seq_lens, dtype=np.int32)
    block_table = np.asarray(block_table, dtype=np.int32)
    q_seqlens = query_start_loc_np[1:] - query_start_loc_np[:-1]
    actual_batch_size = seq_lens_np.shape[0]
    q_tokens_in_first_block = np.minimum(
        attn_chunk_size - ((seq_lens_np - q_seqlens) % attn_chunk_size), q_seqlens).astype(np.int32)
    tokens_in_last_block = attn_chunk_size + (seq_lens_np % -attn_chunk_size)
    local_blocks = 1 + cdiv(q_seqlens - q_tokens_in_first_block, attn_chunk_size)
    cu_num_blocks = np.cumsum(local_blocks)
    virtual_batches = cu_num_blocks[-1]
    block_offsets = np.repeat(cu_num_blocks - local_blocks, local_blocks)
    arange = np.arange(virtual_batches, dtype=np.int32) - block_offsets
    rarange = np.repeat(local_blocks, local_blocks) - arange - 1
    seqlens_q_local = np.repeat(q_seqlens - q_tokens_in_first_block, local_blocks)
    seqlens_q_local[arange == 0] = q_tokens_in_first_block
    seqlens_q_local[arange > 0] = np.minimum(
        seqlens_q_local - attn_chunk_size * (arange - 1), attn_chunk_size)[arange > 0]
    cu_seqlens_q_local = np.empty(virtual_batches + 1, dtype=np.int32)
    np.cumsum(seqlens_q_local, out=cu_seqlens_q_local[1:])
    cu_seqlens_q_local[0] = 0
    seqlens_k_local = np.full(cu_num_blocks[-1], attn_chunk_size, dtype=np.int32)
    seqlens_k_local[cu_num_blocks - 1] = tokens_in_last_block
    num_computed_tokens_local = seqlens_k_local - seqlens_q_local
    k_seqstarts_absolute = np.repeat(seq_lens_np, local_blocks) - (
        rarange * attn_chunk_size + np.repeat(tokens_in_last_block, local_blocks))
    block_starts = k_seqstarts_absolute // block_size
    assert attn_chunk_size % block_size == 0
    pages_per_local_batch = attn_chunk_size // block_size
    block_indices = block_starts[:, None] + np.arange(pages_per_local_batch, dtype=np.int32)
    block_indices = block_indices.reshape(-1).clip(max=block_table.shape[1] - 1)
    batch_indices = np.repeat(np.arange(actual_batch_size, dtype=np.int32),
                              local_blocks * pages_per_local_batch)
    block_table_local = block_table[batch_indices, block_indices].reshape(virtual_batches, -1)
    return {
        "query_start_loc": cu_seqlens_q_local.tolist(),
        "seq_lens": seqlens_k_local.tolist(),
        "num_computed": num_computed_tokens_local.tolist(),
        "block_table": block_table_local.reshape(-1).tolist(),
        "req_indices": np.repeat(np.arange(actual_batch_size), local_blocks).tolist(),
        "max_query_len": int(seqlens_q_local.max()),
        "max_seq_len": int(seqlens_k_local.max()),
    }


# ---- v0: compute_slot_mapping_start_idx, compute_slot_mapping ----------------------------------------
def compute_slot_mapping_start_idx(is_prompt, query_len, context_len, sliding_window):
    start_idx = 0
    if is_prompt and sliding_window is not None:
        start_idx = max(0, query_len - sliding_window)
    return start_idx


def compute_slot_mapping(is_profile_run, seq_len, context_len, start_idx, block_size, block_table):
    slot_mapping = []
    if is_profile_run:
        slot_mapping.extend([PAD_SLOT_ID] * seq_len)
        return slot_mapping
    padding_mask_len = max(0, start_idx - context_len)
    slot_mapping.extend([PAD_SLOT_ID] * padding_mask_len)
    range_start = max(start_idx, context_len)
    idx = np.arange(range_start, seq_len)
    block_offset = idx % block_size
    idx //= block_size
    arr = np.array(block_table, dtype=np.int64)[idx]
    arr *= block_size
    arr += block_offset
    slot_mapping.extend(int(x) for x in arr)
    return slot_mapping


# ---- v1: split_prefill_chunks --------------------------------------------------------------------------
def split_prefill_chunks(seq_lens, workspace_size, request_offset):
    chunk_bounds = []
    i, n = 0, len(seq_lens)
    assert all(s <= workspace_size for s in seq_lens)
    while i < n:
        start, chunk_total = i, 0
        while i < n and (chunk_total + (s := seq_lens[i])) <= workspace_size:
            chunk_total += s
            i += 1
        chunk_bounds.append((start + request_offset, i + request_offset))
    return chunk_bounds


# ---- v1: get_dcp_local_seq_lens -------------------------------------------------------------------------
def get_dcp_local_seq_lens(seq_lens, dcp_size, dcp_rank, interleave):
    seq_lens = np.asarray(seq_lens, dtype=np.int32)
    num_requests = seq_lens.shape[0]
    if dcp_rank is None:
        rank_offsets = np.tile(np.arange(dcp_size, dtype=np.int32)[None, :], (num_requests, 1))
    else:
        rank_offsets = np.array([[dcp_rank]], dtype=np.int32)
    seq_lens_tiled = np.tile(seq_lens[:, None], (1, rank_offsets.shape[1]))
    base = seq_lens_tiled // interleave // dcp_size * interleave
    remainder = seq_lens_tiled - base * dcp_size
    remainder = np.clip(remainder - rank_offsets * interleave, 0, interleave)
    return (base + remainder).reshape(-1).tolist()


# ---- v1: make_kv_sharing_fast_prefill_common_attn_metadata ---------------------------------------------
def fast_prefill(qsl, logits_indices):
    qsl = np.asarray(qsl, dtype=np.int64)
    num_reqs = len(qsl) - 1
    max_query_len = int((qsl[1:] - qsl[:-1]).max()) if num_reqs else 0
    if max_query_len == 1:
        return {"unchanged": True, "query_start_loc": qsl.tolist(), "num_actual_tokens": int(qsl[-1]),
                "max_query_len": 1}
    logits_indices = np.asarray(logits_indices, dtype=np.int64)
    request_ids = np.searchsorted(qsl[1:], logits_indices, side="right")  # torch.bucketize(right=True)
    num_decode_tokens = np.bincount(request_ids, minlength=num_reqs)
    out = np.empty(num_reqs + 1, dtype=np.int64)
    out[0] = 0
    out[1:] = np.cumsum(num_decode_tokens)
    return {"unchanged": False, "query_start_loc": out.tolist(),
            "num_actual_tokens": int(num_decode_tokens.sum()),
            "max_query_len": int(num_decode_tokens.max()) if num_reqs else 0}


# ---- v1: compute_causal_conv1d_metadata ----------------------------------------------------------------
def causal_conv1d(qsl):
    seqlens = np.diff(np.asarray(qsl, dtype=np.int64))
    BLOCK_M = 8
    nums = -(-seqlens // BLOCK_M)
    mlist = np.repeat(np.arange(len(nums)), nums)
    mlist_len = len(mlist)
    MAX_NUM_PROGRAMS = max(1024, mlist_len) * 2
    offsetlist = []
    for num in nums:
        offsetlist.extend(range(num))
    batch_ptr = np.full((MAX_NUM_PROGRAMS,), PAD_SLOT_ID, dtype=np.int32)
    token_chunk_offset_ptr = np.full((MAX_NUM_PROGRAMS,), PAD_SLOT_ID, dtype=np.int32)
    batch_ptr[0:mlist_len] = mlist
    token_chunk_offset_ptr[0:mlist_len] = offsetlist
    return {"nums": nums.tolist(), "tot": int(nums.sum()), "batch_ptr": batch_ptr.tolist(),
            "token_chunk_offset_ptr": token_chunk_offset_ptr.tolist()}


# ---- random cases: one generator per section, each with its own seeded stream ---------------------------
def qsl_of(lens):
    return [0] + np.cumsum(lens).astype(int).tolist() if len(lens) else [0]


class Rand:
    def __init__(self, seed, section):
        self.g = np.random.default_rng([seed, SECTIONS.index(section)])

    def int(self, lo, hi):
        return int(self.g.integers(lo, hi + 1))

    def unit(self):
        return float(self.g.random())


def gen_split2(rd):
    n, thr = rd.int(0, 10), rd.int(0, 4)
    # Batches in decode-first order most of the time, as the seed assumes; in any order otherwise.
    lens = [rd.int(0, 3) if rd.unit() < 0.5 else rd.int(0, 12) for _ in range(n)]
    if rd.unit() < 0.7:
        lens.sort()
    if rd.unit() < 0.25 and n:  # near-uniform batches, some padded with empty requests
        q = rd.int(1, 4)
        lens = [q if rd.unit() < 0.8 else (0 if rd.unit() < 0.7 else rd.int(1, 5)) for _ in range(n)]
    qsl = qsl_of(lens)
    uniform = rd.unit() < 0.5
    num_tokens = qsl[-1] + (rd.int(0, 3) if rd.unit() < 0.3 else 0)
    if uniform and n and rd.unit() < 0.5:
        num_tokens = max(qsl[-1], n * lens[0])
    r = split_decodes_and_prefills(qsl, num_tokens, thr, uniform)
    return {"qsl": qsl, "num_tokens": num_tokens, "thr": thr, "uniform": uniform,
            "expect": r if r == "error" else list(map(int, r))}


def gen_split3(rd):
    n, thr = rd.int(0, 10), rd.int(0, 4)
    lens = [rd.int(0, 3) if rd.unit() < 0.5 else rd.int(0, 12) for _ in range(n)]
    ctx = [0 if rd.unit() < 0.4 else rd.int(1, 20) for _ in range(n)]
    if rd.unit() < 0.7:  # decode -> extend -> prefill order
        rows = sorted(zip(lens, ctx), key=lambda t: 0 if t[0] <= thr else (2 if t[1] == 0 else 1))
        lens, ctx = [a for a, _ in rows], [b for _, b in rows]
    qsl = qsl_of(lens)
    seq = [a + b for a, b in zip(lens, ctx)]
    num_tokens = qsl[-1] + (rd.int(0, 3) if rd.unit() < 0.3 else 0)
    r = split_decodes_prefills_and_extends(qsl, seq, num_tokens, thr)
    return {"qsl": qsl, "seq_lens": seq, "num_tokens": num_tokens, "thr": thr, "expect": list(map(int, r))}


def gen_reorder(rd):
    n, thr = rd.int(0, 16), rd.int(0, 4)
    sched = [rd.int(0, 6) for _ in range(n)]
    comp = [0 if rd.unit() < 0.35 else rd.int(1, 9) for _ in range(n)]
    swaps, batch = reorder_seed(sched, comp, thr)
    return {"num_scheduled": sched, "num_computed": comp, "thr": thr, "seed_swaps": len(swaps),
            "seed_batch": batch}


def gen_reorder4(rd):
    n, thr = rd.int(0, 16), rd.int(0, 4)
    sched = [rd.int(0, 7) for _ in range(n)]
    comp = [0 if rd.unit() < 0.3 else rd.int(1, 12) for _ in range(n)]
    prompt = [rd.int(1, 12) for _ in range(n)]
    swaps, batch = reorder_vllm(sched, comp, prompt, thr)
    return {"num_scheduled": sched, "num_computed": comp, "num_prompt": prompt, "thr": thr,
            "vllm_swaps": len(swaps), "vllm_batch": batch,
            "fewest": fewest_swaps(regions_vllm(sched, comp, prompt, thr).tolist())}


def gen_local(rd):
    # chunk a multiple of the block size; rows sometimes shorter than needed (the seed's clip)
    bs = [1, 2, 4][rd.int(0, 2)]
    chunk = bs * rd.int(1, 4)
    n = rd.int(1, 6)
    q = [rd.int(0, 3 * chunk) for _ in range(n)]
    c = [rd.int(0, 3 * chunk) for _ in range(n)]
    if rd.unit() < 0.15:  # an empty padding request
        j = rd.int(0, n - 1)
        q[j], c[j] = 0, 0
    seq = [a + b for a, b in zip(q, c)]
    need = max(cdiv(s, bs) for s in seq)
    cols = max(need + rd.int(-2, 2), chunk // bs, 1)  # the seed raises on an empty request when cols < pages
    bt = [[rd.int(0, 999) for _ in range(cols)] for _ in range(n)]
    return {"chunk": chunk, "block_size": bs, "qsl": qsl_of(q), "seq_lens": seq, "block_table": bt,
            "cols": cols, "expect": make_local_attention_virtual_batches(chunk, qsl_of(q), seq, bt, bs)}


def gen_slots(rd):
    bs = rd.int(1, 8)
    seq_len = rd.int(0, 40)
    context_len = rd.int(0, seq_len)
    is_prompt = rd.unit() < 0.6
    window = rd.int(0, 20)
    start = compute_slot_mapping_start_idx(is_prompt, seq_len - context_len, context_len,
                                           window if window else None)
    table = [rd.int(0, 499) for _ in range(cdiv(seq_len, bs) + rd.int(0, 2))]
    profile = rd.unit() < 0.1
    return {"is_prompt": is_prompt, "seq_len": seq_len, "context_len": context_len, "window": window,
            "block_size": bs, "block_table": table, "profile": profile, "start_idx": start,
            "expect": compute_slot_mapping(profile, seq_len, context_len, start, bs, table)}


def gen_chunks(rd):
    ws = rd.int(0, 30)
    seq = [rd.int(0, ws) for _ in range(rd.int(0, 12))]
    off = rd.int(0, 5)
    return {"seq_lens": seq, "ws": ws, "offset": off,
            "expect": [list(t) for t in split_prefill_chunks(seq, ws, off)]}


def gen_dcp(rd):
    d = rd.int(1, 5)
    rank = None if rd.unit() < 0.5 else rd.int(0, d - 1)
    il = rd.int(1, 4)
    seq = [rd.int(0, 60) for _ in range(rd.int(0, 8))]
    return {"seq_lens": seq, "dcp_size": d, "rank": -1 if rank is None else rank, "interleave": il,
            "expect": get_dcp_local_seq_lens(seq, d, rank, il)}


def gen_fast_prefill(rd):
    lens = [rd.int(0, 6) for _ in range(rd.int(0, 8))]
    if rd.unit() < 0.2:
        lens = [rd.int(0, 1) for _ in lens]
    qsl = qsl_of(lens)
    nt = qsl[-1]
    logits = [rd.int(0, nt - 1) for _ in range(rd.int(0, 2 * nt))] if nt else []
    if rd.unit() < 0.5:
        logits.sort()
    return {"qsl": qsl, "logits": logits, "expect": fast_prefill(qsl, logits)}


def gen_conv1d(rd):
    lens = [rd.int(0, 40) for _ in range(rd.int(0, 8))]
    if rd.unit() < 0.05:
        lens = [rd.int(2000, 3000)]  # more programs than the seed's 1024 minimum
    shift = rd.int(0, 5)
    r = causal_conv1d(qsl_of(lens))
    # The tail of the buffers is all padding: keep the length and a few entries past the programs.
    keep = r["tot"] + 8
    r["buffer_len"] = len(r["batch_ptr"])
    r["batch_ptr"] = r["batch_ptr"][:keep]
    r["token_chunk_offset_ptr"] = r["token_chunk_offset_ptr"][:keep]
    return {"qsl": [v + shift for v in qsl_of(lens)], "expect": r}


SECTIONS = ["split2", "split3", "reorder", "local", "slots", "chunks", "dcp", "fast_prefill", "conv1d", "reorder4"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--cases", type=int, default=400)
    ap.add_argument("--only", choices=SECTIONS, help="one section (default: all)")
    args = ap.parse_args()
    out = {}
    for name in [args.only] if args.only else SECTIONS:
        rd = Rand(args.seed, name)
        out[name] = [globals()["gen_" + name](rd) for _ in range(args.cases)]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
