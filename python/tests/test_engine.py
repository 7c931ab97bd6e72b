"""The example engine (python/examples/engine.py) in f32: its greedy tokens, served with continuous batching,
a prefix-cached system prompt, chunked prompts and (optionally) speculative verification over uattn's paged
attention, equal those of the same model with plain NumPy dense attention, request by request; and its MLA
layer in both forms against dense attention over the expanded keys and values."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import engine  # noqa: E402


def oracle_proposer(refs, seed):
    """Drafts that are mostly the right continuation (a draft model that usually agrees), each wrong with
    probability 0.3, so verification both accepts and rejects."""
    rng = np.random.default_rng(seed)

    def propose(r, k):
        ref = refs[r.rid]
        done = len(r.generated)
        drafts = list(ref[done:done + k])
        return [t if rng.random() > 0.3 else (t + 1) % 2048 for t in drafts]
    return propose


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("spec", ["none", "ngram", "oracle"])
def test_engine_matches_dense_reference(seed, spec):
    model = engine.Model(seed=seed, layers=2)
    reqs = engine.make_requests(seed, 10, model.vocab)
    refs = {r.rid: engine.reference_generate(model, r.prompt, r.max_new) for r in reqs}
    proposer = oracle_proposer(refs, seed) if spec == "oracle" else None
    eng = engine.Engine(model, dtype="f32", num_blocks=256, token_budget=64, max_num_seqs=8,
                        spec_tokens=0 if spec == "none" else 3, proposer=proposer)
    got = eng.serve(reqs, verbose=False)
    assert got == refs
    s = eng.stats
    assert s["prefix_hit_tokens"] >= 32 * (len(reqs) - 2)  # the system prompt's 2 full blocks, reused
    assert s["mixed_steps"] > 0 and s["decode_steps"] > 0    # decodes ran beside prompt chunks
    if spec == "oracle":
        assert 0 < s["drafts_accepted"] < s["drafts_proposed"]
    if spec == "ngram":
        assert s["drafts_proposed"] > 0
    # every block came back: free, or cached and evictable
    assert len(eng.blocks.free) + len(eng.blocks.evictable) == 256 and not eng.blocks.ref.any()


def test_engine_chunks_prompts_to_the_budget():
    model = engine.Model(seed=5, layers=1)
    reqs = [engine.Request(0, list(range(150)), 4, 0)]
    eng = engine.Engine(model, token_budget=32, num_blocks=64)
    ref = engine.reference_generate(model, reqs[0].prompt, 4)
    assert eng.serve(reqs, verbose=False) == {0: ref}
    assert eng.stats["prefill_steps"] == 5  # 150 prompt tokens in chunks of 32


def test_engine_bf16_reports_agreement():
    model = engine.Model(seed=3, layers=2)
    reqs = engine.make_requests(3, 6, model.vocab)
    refs = {r.rid: engine.reference_generate(model, r.prompt, r.max_new) for r in reqs}
    got = engine.Engine(model, dtype="bf16", num_blocks=256).serve(reqs, verbose=False)
    agree = sum(next((i for i, (a, b) in enumerate(zip(refs[k], got[k])) if a != b), len(refs[k])) for k in refs)
    total = sum(len(v) for v in refs.values())
    assert agree >= total // 2, (agree, total)  # bf16 attention: close, not bit-equal


@pytest.mark.parametrize("seed", [0, 1])
def test_mla_demo_both_forms_match_dense_attention(seed):
    prefill_err, decode_err = engine.mla_demo(seed, verbose=False)
    assert prefill_err < 1e-5 and decode_err < 1e-5, (prefill_err, decode_err)
