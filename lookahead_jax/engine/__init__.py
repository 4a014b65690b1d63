"""Requests through decoding: `Engine` (continuous batching, offline or online,
continuous.py) over its parts — requests and their one check (requests.py), the host's
scheduler (scheduler.py), the device's slots and verbs (device_slots.py, slot_state.py),
what the rows accepted (row_counts.py) — `generate` (a batch of prompts as one engine
run, generate.py), what they share (prompt encoding inputs.py, `Stats` stats.py, Ctrl-C
interrupts.py, streaming detokenization streaming.py), and the exactness harness for a
model behind the seam (testing.py, public as lj.testing).

The engine's parts, JetStream's engine interface split as it splits it:

    requests.py      Request / Update / Result, and the one check of a request (`encode`)
    device_slots.py  the device side: the B-row DecodeState and its verbs, prefill,
                     insert, generate (and read, grow, retire), each a compiled program
    scheduler.py     the host side: the queue, which request sits in which slot, a round
                     (admit, generate, read back), listeners, stop strings, cancellation
    row_counts.py    what the rows accepted, and auto's hand-over to plain decoding
    continuous.py    `Engine`: the offline driver (`run`, `run_batch`), the online entry
                     points (`submit`, `cancel`, `round`, `serve`), `warm_up`
    config.py        `EngineConfig`: the settings, checked once
    describe.py      what the engine says of itself: how it decodes, a slow round
    logprob_window.py  logprobs read back after a round

What lives on the device: the B-row DecodeState — K/V cache (L buffers [B, K, S, Dh]),
token buffer [B, S], per-row lengths, max_new_tokens, step counters, flags, PRNG keys
and sampling settings (rows with different settings share the batch and its programs),
and the guess sources' state. The host holds the queue, which request sits in which
slot, and the results; it sees the device only between rounds.
"""
