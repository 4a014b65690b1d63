"""`python -m lookahead_jax.generate`: the generate command under the name the design card
gives it; the same command as `lookahead-jax generate` (code in cli/generate.py).

Imported (an indexer, autodoc, `importlib.import_module` over the package's modules), it
must not hide the library function: Python binds an imported submodule to its package's
attribute, so after `import lookahead_jax.generate`, `lj.generate` is this module. So
the module, once imported, calls the library function (engine/generate.py) with whatever
it is given: `lj.generate(model, prompts, ...)` works the same either way, and
`inspect.signature` reads the function's (`__wrapped__`).
"""

import sys
import types

if __name__ == "__main__":
    from lookahead_jax.cli.generate import main

    sys.exit(main())

from lookahead_jax.engine.generate import generate as __wrapped__  # noqa: E402


class _CallsTheLibraryFunction(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return __wrapped__(*args, **kwargs)


sys.modules[__name__].__class__ = _CallsTheLibraryFunction
__doc__ = __wrapped__.__doc__  # help(lj.generate): the function's
