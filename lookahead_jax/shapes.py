"""Shape contracts: the legend's letters (docs/architecture.md, "Shape letters") written as
jaxtyping annotations on the state's dataclasses, and checked where arrays cross a boundary.

A dataclass field annotated with a jaxtyping type, e.g.

    tokens: Int[Array, "B S"]
    k: tuple[Shaped[Array, "B K S Dh"], ...]

is a contract: `check(*objects)` verifies every such field of the objects (and of the
dataclasses nested in them) with **one binding per letter**, so the B of a DecodeState's
tokens, of its K/V cache and of its draft state must agree, as must every layer's S. The
checks run on abstract values, so inside `jax.jit` they cost nothing at run time: a step
is checked once, when it is traced. `checked` wraps a function so that its dataclass
arguments and its result are checked together.

Why not jaxtyping's own `@jaxtyped(typechecker=...)` on the dataclasses: it checks in
`__init__`, and JAX rebuilds a registered dataclass through `__init__` with whatever
leaves a transformation carries (PartitionSpecs for shardings, None for vmap axes),
which are not arrays. The contracts hold for the values a step reads and returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import sys
import types
import typing

import jaxtyping
from jaxtyping import AbstractArray


class ShapeError(TypeError):
    """An array whose dtype or shape breaks its field's annotation."""


@functools.cache
def _hints(cls) -> dict[str, object]:
    """{field: resolved annotation} for a dataclass type; fields whose annotation cannot be
    resolved at run time (names imported for type checkers only) are left out."""
    scope = vars(sys.modules[cls.__module__])
    out = {}
    for field in dataclasses.fields(cls):
        hint = field.type
        if isinstance(hint, str):
            try:
                hint = eval(hint, scope)  # noqa: S307 (the class's own annotation)
            except NameError:
                continue
        out[field.name] = hint
    return out


def _array_type(hint):
    """The jaxtyping array type of a hint (`X`, `X | None`), or None."""
    if isinstance(hint, type) and issubclass(hint, AbstractArray):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            if (found := _array_type(arg)) is not None:
                return found
    return None


def _contracts(obj, path: str, out: list) -> None:
    """(path, value, jaxtyping type) for every annotated array in obj, depth first."""
    if isinstance(obj, tuple | list):
        for i, item in enumerate(obj):
            _contracts(item, f"{path}[{i}]", out)
        return
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return
    hints = _hints(type(obj))
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        where = f"{path}.{field.name}"
        hint = hints.get(field.name)
        array = _array_type(hint)
        if array is not None and value is not None:
            out.append((where, value, array))
        elif typing.get_origin(hint) is tuple and value is not None:
            item = _array_type(typing.get_args(hint)[0])
            if item is None:
                _contracts(value, where, out)
            else:
                out.extend((f"{where}[{i}]", v, item) for i, v in enumerate(value))
        else:
            _contracts(value, where, out)


def _bindings() -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        jaxtyping.print_bindings()
    lines = buf.getvalue().splitlines()[1:]  # after "The current values ... are as follows."
    return ", ".join(lines) or "none"


@jaxtyping.jaxtyped(typechecker=None)  # one memo: every letter bound once for all checks
def _check_all(contracts: list) -> None:
    for where, value, array in contracts:
        if not isinstance(value, array):
            dtype = getattr(value, "dtype", type(value).__name__)
            kind = array.__name__.split("[", 1)[0]  # Int, Float, Shaped...
            raise ShapeError(
                f"{where} is {dtype}{list(getattr(value, 'shape', []))}, which breaks "
                f"{kind}['{array.dim_str}'] (letters bound so far: {_bindings()})"
            )


def check(*objects, names: tuple[str, ...] | None = None) -> None:
    """Check every annotated array field in `objects` (dataclasses, or tuples of them),
    with one binding per letter across all of them. Raises ShapeError naming the field."""
    contracts: list = []
    for i, obj in enumerate(objects):
        name = names[i] if names else type(obj).__name__
        _contracts(obj, name, contracts)
    _check_all(contracts)


def checked(fn):
    """`fn`, checking its positional dataclass arguments and its result together (one
    binding per letter): for functions from a state to a state, such as a decode step.
    Keyword arguments are static configuration (the DecodeSpec), not arrays, and are not
    walked."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        inputs = [a for a in args if dataclasses.is_dataclass(a)]
        names = tuple(f"{fn.__name__}: {type(a).__name__} in" for a in inputs)
        check(*inputs, out, names=(*names, f"{fn.__name__}: {type(out).__name__} out"))
        return out

    return wrapper
