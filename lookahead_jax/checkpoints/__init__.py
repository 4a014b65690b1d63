"""Checkpoints on disk: the orbax format (checkpoint.py), conversion from HF and GGUF
(convert/), the tokenizer (tokenizer.py), the bundled SmolLM2-135M (default_model.py)
and `load` / `inspect` (loading.py).

Inside, each layer imports only those below it: loading -> default_model -> convert ->
checkpoint (the format knows nothing of conversion). Independent of decoding/.
"""
