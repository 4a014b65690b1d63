"""Requests through decoding: `generate` (static batches, generate.py), `Engine`
(continuous batching over a dataset, continuous.py), what both share (prompt encoding
inputs.py; streaming detokenization streaming.py), and the exactness harness for a model
behind the seam (testing.py, public as lj.testing).
"""
