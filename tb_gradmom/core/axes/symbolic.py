"""Sizes with the batch size kept symbolic, and the values of small shape computations.

A batch size unknown at trace time is ``n``; a size that is a multiple of it is `Sym` ``(c)``
(``c * n``). Reshapes are resolved by these sizes (`tb_gradmom.core.axes.handlers`), so that a
batch size that happens to equal a sequence length, a width or 1 changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

__all__ = ["Sym", "mul", "div", "add", "prod", "static", "sym_value"]

# Shape computations deeper than this are not followed (their value is None: unknown).
MAX_VALUE_DEPTH = 32


@dataclass(frozen=True)
class Sym:
    """``c * n``: a size that is a multiple of the (unknown at trace time) batch size."""

    c: int

    def __str__(self) -> str:
        return f"{self.c}*n" if self.c != 1 else "n"


def mul(a, b):
    """``a * b``, or None (unknown, or ``n * n``)."""
    if a is None or b is None:
        return None
    if isinstance(a, Sym) and isinstance(b, Sym):
        return None
    if isinstance(a, Sym):
        return Sym(a.c * b)
    if isinstance(b, Sym):
        return Sym(b.c * a)
    return a * b


def div(a, b):
    """Exact division, or None."""
    if a is None or b is None:
        return None
    if isinstance(b, Sym):
        if isinstance(a, Sym) and b.c and a.c % b.c == 0:
            return a.c // b.c
        return None
    if b == 0:
        return None
    if isinstance(a, Sym):
        return Sym(a.c // b) if a.c % b == 0 else None
    return a // b if a % b == 0 else None


def add(a, b, sign=1):
    """``a + sign * b``, or None."""
    if a is None or b is None:
        return None
    if isinstance(a, Sym) and isinstance(b, Sym):
        c = a.c + sign * b.c
        return Sym(c) if c else 0
    if isinstance(a, Sym) or isinstance(b, Sym):
        return a if b == 0 else (b if a == 0 and sign == 1 else None)
    return a + sign * b


def prod(values):
    """The product of ``values``, or None."""
    out = 1
    for v in values:
        out = mul(out, v)
        if out is None:
            return None
    return out


def static(t: tf.Tensor):
    """``t``'s value as a numpy array when it is known at trace time, else None."""
    v = tf.get_static_value(t)
    return None if v is None else np.asarray(v)


def sym_value(ex, t: tf.Tensor, depth: int = 0):
    """The value of a small integer tensor (a shape computation) with the batch size kept
    symbolic: an int, `Sym`, a list of those (None entries where unknown), or None.

    ``ex``: the analysis (`tb_gradmom.core.axes.Examples`), for the shapes of the tensors whose
    ``Shape`` is taken."""
    if depth > MAX_VALUE_DEPTH:
        return None
    v = static(t)
    if v is not None and v.dtype.kind in "iu":
        return int(v) if v.ndim == 0 else [int(x) for x in v.reshape(-1)]
    op = t.op
    ty = op.type
    if ty in ("Identity", "Cast"):
        return sym_value(ex, op.inputs[0], depth + 1)
    if ty == "Shape":
        return ex.sym_shape(op.inputs[0])
    if ty == "ShapeN":
        return ex.sym_shape(op.inputs[t.value_index])
    if ty == "Size":
        dims = ex.sym_shape(op.inputs[0])
        return None if dims is None else prod(dims)
    if ty == "Pack":
        vals = [sym_value(ex, x, depth + 1) for x in op.inputs]
        if any(isinstance(x, list) for x in vals):
            return None
        return vals
    if ty == "ConcatV2":
        parts = [sym_value(ex, x, depth + 1) for x in op.inputs[:-1]]
        if any(not isinstance(p, list) for p in parts):
            return None
        return [x for p in parts for x in p]
    if ty == "StridedSlice":
        return _sym_slice(ex, op, depth)
    if ty == "GatherV2":
        vals = sym_value(ex, op.inputs[0], depth + 1)
        idx = static(op.inputs[1])
        axis = static(op.inputs[2])
        if not isinstance(vals, list) or idx is None or axis is None or int(axis) != 0:
            return None
        try:
            if idx.ndim == 0:
                return vals[int(idx)]
            return [vals[int(i)] for i in idx.reshape(-1)]
        except IndexError:
            return None
    if ty == "Prod":
        vals = sym_value(ex, op.inputs[0], depth + 1)
        if isinstance(vals, list):
            return prod(vals)
        return vals if vals is not None and not isinstance(vals, list) else None
    if ty in ("Mul", "FloorDiv", "RealDiv", "AddV2", "Add", "Sub", "Maximum"):
        a = sym_value(ex, op.inputs[0], depth + 1)
        b = sym_value(ex, op.inputs[1], depth + 1)
        if isinstance(a, list) or isinstance(b, list):
            if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
                return [_binary(ty, x, y) for x, y in zip(a, b)]
            return None
        return _binary(ty, a, b)
    return None


def _binary(ty, a, b):
    if ty == "Mul":
        return mul(a, b)
    if ty in ("FloorDiv", "RealDiv"):
        return div(a, b)
    if ty in ("AddV2", "Add"):
        return add(a, b)
    if ty == "Sub":
        return add(a, b, -1)
    if ty == "Maximum" and isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return None


def _sym_slice(ex, op, depth):
    vals = sym_value(ex, op.inputs[0], depth + 1)
    begin, end, strides = (static(x) for x in op.inputs[1:4])
    if not isinstance(vals, list) or begin is None or end is None or strides is None:
        return None
    if begin.size != 1 or op.get_attr("ellipsis_mask") or op.get_attr("new_axis_mask"):
        return None
    b, e, s = int(begin[0]), int(end[0]), int(strides[0])
    if op.get_attr("shrink_axis_mask") & 1:
        try:
            return vals[b]
        except IndexError:
            return None
    b = None if op.get_attr("begin_mask") & 1 else b
    e = None if op.get_attr("end_mask") & 1 else e
    return vals[slice(b, e, s)]
