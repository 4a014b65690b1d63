"""Requests through decoding: `Engine` (the host loop: continuous batching, offline or
online, continuous.py), `generate` (a batch of prompts as one engine run, generate.py),
what both share (prompt encoding inputs.py, `Stats` stats.py, Ctrl-C interrupts.py,
streaming detokenization streaming.py), and the exactness harness for a model behind
the seam (testing.py, public as lj.testing).
"""
