"""Models: the seam every decoder calls (seam.py), the Llama forward behind it
(llama.py: its params llama_params.py, config.py, rope.py, kv_cache.py, the int8 weight
formats in quantize.py), the
Flax NNX adapter (nnx_model.py) and `Model`, the seam with its params (bundle.py).

Imports only distributed/ (where params live) and the base modules (errors, cache_dir);
knows nothing of guesses, decoding or checkpoints (pyproject.toml: importlinter).
"""
