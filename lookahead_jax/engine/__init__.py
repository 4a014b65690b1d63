"""Requests through decoding: `Engine` (continuous batching, offline or online,
continuous.py) over its parts — requests and their one check (requests.py), the host's
scheduler (scheduler.py), the device's slots and verbs (device_slots.py, slot_state.py),
what the rows accepted (row_counts.py) — `generate` (a batch of prompts as one engine
run, generate.py), what they share (prompt encoding inputs.py, `Stats` stats.py, Ctrl-C
interrupts.py, streaming detokenization streaming.py), and the exactness harness for a
model behind the seam (testing.py, public as lj.testing).
"""
