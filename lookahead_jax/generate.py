"""`python -m lookahead_jax.generate`: the generate command under the name the design card
gives it; the same command as `lookahead-jax generate` (code in cli/generate.py).

Run, never imported. Python binds an imported submodule to its package's attribute, so
`import lookahead_jax.generate` would hide the library function `lj.generate`
(engine/generate.py) behind this module; `python -m` runs the file without importing it
under this name, and an import is refused with a pointer to the right module.
"""

import sys

if __name__ != "__main__":
    raise ImportError(
        "lookahead_jax.generate is the command line (python -m lookahead_jax.generate); "
        "its main() is in lookahead_jax.cli.generate, and the library function is "
        "lj.generate after `import lookahead_jax as lj`"
    )

from lookahead_jax.cli.generate import main  # noqa: E402  (after the guard)

sys.exit(main())
