"""`python -m lookahead_jax.generate`: the command line, kept at this name (its code is
cli/generate.py).

Python binds a submodule to its package's attribute on import, so `import
lookahead_jax.generate` would replace `lj.generate` (the function) with this module. The
module is therefore callable and passes calls to the function: `lj.generate(...)` keeps
working whichever was imported first.
"""

import sys
import types

from lookahead_jax.cli.generate import build_parser, main
from lookahead_jax.engine import generate as _api

__all__ = ["build_parser", "main"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return _api.generate(*args, **kwargs)


if __name__ != "__main__" and __name__ in sys.modules:  # imported, not run by `-m`
    sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
