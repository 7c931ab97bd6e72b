"""The numpy re-statements of the Gaudi plugin's ("the seed's") Python behind tests/ref/seed_unified_batch.py
and tests/ref/seed_unified_attn.py, and the tools around them.

Planner side (seed_unified_batch.py): planner (create_unified_batch and its helpers, the seed's bucketing, the
uattn-mode planner), golden (random batches and the golden fixtures), timing (the `time` command),
planner_selftest. Attention side (seed_unified_attn.py): step (storage dtypes, the Step model, cache layouts),
oracle (the dense float64 oracle and key counts), attn (the seed's unified_attn and PR 784's chunked shared
part), make_step, check, defects, attn_selftest. "Choice N" in these modules is the numbered choice in the
docstring of the entry script of their side. Run with Debian's /usr/bin/python3 (numpy 1.24); numpy and the
standard library only.
"""
