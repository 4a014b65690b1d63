"""What a compiled decode loop copies: the materialized copies, transposes and slices of
its weights and state inside the loop, read from the program's HLO text.

A decode step reads the weights and the live K/V once and writes only the new tokens' K/V
(docs/architecture.md). Where XLA cannot read an operand in place it materializes a new
buffer inside the loop, every step: a layer's weights sliced out of a stacked array, the
cache transposed into the layout a dot wants, a buffer copied before an in-place update
because another reader still needs the old one. Such a copy makes a step's cost grow with
B x S and doubles the weight traffic, and nothing but the HLO shows it. This module finds
them, so that a test can assert there are none (tests/test_loop_copies.py):

    exe, _ = programs.compiled(model, spec, new_positions, start_args, "run_loop")
    found = loop_copies(exe.as_text(), protected_shapes(model.params, state))
    assert not found, found

An instruction is a copy of a protected array when

1. it runs in a while loop (a body or condition, or a computation they call);
2. it only moves data: copy, transpose, slice, dynamic-slice, concatenate, pad, or a
   fusion of nothing but such ops (and bitcasts, reshapes, broadcasts, selects, compares,
   iotas, conversions: a `where` that rewrites a whole buffer counts). An in-place update
   (dynamic-update-slice, scatter) and any arithmetic do not;
3. its output has a protected array's shape: the same dimensions in any order (size-1
   dimensions aside), or the same size in fewer dimensions (XLA merges dimensions with
   bitcasts: a [D, H, Dh] weight is copied as [D, H * Dh]); a copy, a transpose, and one
   row's or one layer's slice of a stacked array (`protected_shapes` adds those) all match;
4. it reads an operand at least that large which holds stored data rather than a result
   computed in the step: a loop-carried value, or what an in-place update or another
   copy made of one (a fill or an iota copies nothing, and a transpose of the step's own
   activations is not a copy of the state).

Blocks the attention reads of the cache ([B, K, block, Dh], models/llama.py) are smaller
than any layer's buffer and do not match: they are the bounded staging of blocked
attention, not a copy of the state.
"""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import numpy as np

# ops that only move data (in a fusion, with these alone, the fusion is a copy)
MOVES = frozenset(
    {
        "bitcast",
        "broadcast",
        "compare",
        "concatenate",
        "constant",
        "convert",
        "copy",
        "dynamic-slice",
        "get-tuple-element",
        "iota",
        "pad",
        "parameter",
        "reshape",
        "reverse",
        "select",
        "slice",
        "transpose",
        "tuple",
    }
)
COPY_OPS = frozenset({"copy", "transpose", "slice", "dynamic-slice", "concatenate", "pad"})
# what produces stored data in a loop body: the loop's own values and updates of them
STORED = MOVES | {"dynamic-update-slice", "scatter", "while"}

_HEADER = re.compile(r"^(?:ENTRY )?%(\S+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.+?) ([a-z][\w-]*)\((.*)$")
_ARRAY = re.compile(r"^[a-z]\w*\[([\d,]*)\]")


@dataclasses.dataclass(frozen=True)
class Copy:
    computation: str  # the HLO computation it runs in
    name: str  # the instruction
    op: str  # its opcode; a fusion's: "fusion(op+op...)", what the fusion does
    shape: tuple[int, ...]
    source: str  # the JAX operation it came from (HLO metadata op_name), if recorded

    def __str__(self) -> str:
        return f"{self.op} {list(self.shape)} ({self.name} in {self.computation}: {self.source})"


@dataclasses.dataclass
class _Instruction:
    name: str
    type: str
    op: str
    rest: str

    def shape(self) -> tuple[int, ...] | None:
        m = _ARRAY.match(self.type)
        if m is None:  # a tuple or a token
            return None
        return tuple(int(d) for d in m.group(1).split(",") if d)

    def size(self) -> int:
        shape = self.shape()
        return 0 if shape is None else math.prod(shape)

    def operands(self) -> list[str]:
        """The names of the instruction's operands."""
        args, depth = [], 1
        for i, c in enumerate(self.rest):
            depth += {"(": 1, ")": -1}.get(c, 0)
            if depth == 0:
                args = re.findall(r"%([\w.\-]+)", self.rest[:i])
                break
        return args

    def calls(self, *attributes: str) -> list[str]:
        found = []
        for a in attributes:
            found += re.findall(rf"\b{a}=%([\w.\-]+)", self.rest)
        for group in re.findall(r"branch_computations=\{([^}]*)\}", self.rest):
            found += [c.strip().lstrip("%") for c in group.split(",")]
        return found


def _dims(shape) -> tuple[int, ...]:
    """A shape's dimensions in any order, size-1 dimensions aside."""
    return tuple(sorted(d for d in shape if d != 1))


def protected_shapes(*trees, min_elements: int = 4096) -> set[tuple[int, ...]]:
    """The shapes no loop may copy (as `_dims`): every array of `trees` (params, a decode
    state, or their ShapeDtypeStructs) with at least `min_elements` elements, and every
    array's slice along its first axis (one layer of a stacked weight, one row of a
    buffer) with at least that many; for a sharded array, also one device's shard."""
    found = set()
    for tree in trees:
        for x in jax.tree.leaves(tree):
            shape = tuple(np.shape(x))
            shapes = [shape, shape[1:]]
            where = getattr(x, "sharding", None)
            if where is not None and hasattr(where, "shard_shape"):
                shard = tuple(where.shard_shape(shape))
                shapes += [shard, shard[1:]]
            found |= {_dims(s) for s in shapes if s and math.prod(s) >= min_elements}
    return found


def _protects(protected: set[tuple[int, ...]], shape: tuple[int, ...]) -> bool:
    dims = _dims(shape)
    if dims in protected:
        return True
    n = math.prod(dims)
    return any(len(p) > len(dims) and math.prod(p) == n for p in protected)


def _parse(text: str) -> tuple[dict[str, list[_Instruction]], str | None]:
    computations: dict[str, list[_Instruction]] = {}
    current, entry = None, None
    for line in text.splitlines():
        if not line.startswith(" ") and (m := _HEADER.match(line)):
            current = m.group(1)
            computations[current] = []
            entry = current if line.startswith("ENTRY") else entry
        elif line.startswith("}"):
            current = None
        elif current is not None and (m := _INSTRUCTION.match(line)):
            computations[current].append(_Instruction(*m.groups()))
    return computations, entry


def _in_loops(computations, entry) -> set[str]:
    """The computations that run inside a while loop."""
    inside, seen, todo = set(), set(), [(entry, False)]
    while todo:
        name, in_loop = todo.pop()
        if (name, in_loop) in seen or name not in computations:
            continue
        seen.add((name, in_loop))
        if in_loop:
            inside.add(name)
        for ins in computations[name]:
            if ins.op == "while":
                todo += [(c, True) for c in ins.calls("body", "condition")]
            elif ins.op in ("call", "conditional"):
                called = ins.calls("to_apply", "true_computation", "false_computation")
                todo += [(c, in_loop) for c in called]
    return inside


def loop_copies(hlo_text: str, protected: set[tuple[int, ...]]) -> list[Copy]:
    """Every instruction in a while loop of the compiled HLO `hlo_text` (an executable's
    `as_text()`) that materializes a copy of an array of a shape in `protected`
    (`protected_shapes`)."""
    computations, entry = _parse(hlo_text)

    def only_moves(ins, allowed) -> str | None:
        """The op (a fusion's: 'fusion(op+op...)') if `ins` only does `allowed` ops."""
        if ins.op != "fusion":
            return ins.op if ins.op in allowed else None
        ops = {i.op for c in ins.calls("calls") for i in computations.get(c, [])}
        if not ops or not ops <= allowed:
            return None
        return "fusion(" + "+".join(sorted(ops - {"parameter", "bitcast"})) + ")"

    found = []
    for name in sorted(_in_loops(computations, entry)):
        by_name = {i.name: i for i in computations[name]}
        for ins in computations[name]:
            n, shape = ins.size(), ins.shape()
            if shape is None or (ins.op != "fusion" and ins.op not in COPY_OPS):
                continue
            if not _protects(protected, shape):
                continue
            op = only_moves(ins, MOVES)
            sources = [by_name.get(a) for a in ins.operands()]
            stored = [a for a in sources if a and a.size() >= n and only_moves(a, STORED)]
            if op is None or not stored:
                continue
            source = re.search(r'op_name="([^"]*)"', ins.rest)
            found.append(Copy(name, ins.name, op, ins.shape(), source.group(1) if source else ""))
    return found
