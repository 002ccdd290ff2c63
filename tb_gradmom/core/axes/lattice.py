"""The states of the analysis, and their join.

A tensor's state says where its examples are:

* `Axis` ``(k, outer, inner)``: slice ``j`` of axis ``k`` (for a folded axis, the ``inner``
  consecutive entries at ``j`` within each of the ``outer`` blocks) depends on example ``j``
  alone;
* `Elements` ``(of)``: a ``TensorList`` whose elements are in state ``of`` (an `Axis`, or
  `FREE` for a list that holds no example yet);
* `State.FREE`: depends on no example; `State.REDUCED`: on the examples only through
  reductions over them (batch statistics); `State.UNKNOWN`: not proven.

They form a lattice ordered by how much is known to mix: ``FREE`` is the bottom, ``UNKNOWN`` the
top, and `join` is the least upper bound (the state of a loop variable that is ``a`` on entry and
``b`` after an iteration). Its longest strictly increasing chain,
``FREE < Elements(FREE) < Elements(Axis) < UNKNOWN``, has `HEIGHT` steps: a fixed point that
joins each loop variable's state with its state after one more iteration settles after at most
``HEIGHT * variables + 1`` passes (`tb_gradmom.core.axes.control`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "State",
    "FREE",
    "REDUCED",
    "UNKNOWN",
    "Axis",
    "Elements",
    "Padded",
    "join",
    "describe",
    "HEIGHT",
]


class State(enum.Enum):
    """A state that is not an axis: the examples are nowhere, reduced, or not proven."""

    FREE = "free"
    REDUCED = "reduced"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


FREE = State.FREE
REDUCED = State.REDUCED
UNKNOWN = State.UNKNOWN

# Strict increases along the longest chain of the lattice (see the module docstring).
HEIGHT = 3


@dataclass(frozen=True)
class Axis:
    """Examples on axis ``axis``; the axis is laid out ``[outer, n, inner]`` (row-major).

    ``batch``: which batch of examples: 0 the step's inputs (and what is drawn for them), or a
    union made in the step (`tb_gradmom.core.axes.Examples.union`: ``concat([real, fake])``,
    whose rows are its examples, ``n = n1 + n2``). Two batches never meet in one op: their
    states differ, so such an op is not proven."""

    axis: int
    outer: int = 1
    inner: int = 1
    batch: int = 0

    @property
    def pure(self) -> bool:
        return self.outer == 1 and self.inner == 1

    @property
    def partners(self) -> int:
        """Entries of the axis per example (folded windows, positions, dilation blocks)."""
        return self.outer * self.inner

    def moved(self, axis: int) -> Axis:
        return Axis(axis, self.outer, self.inner, self.batch)

    def __str__(self) -> str:
        of = f" of batch #{self.batch}" if self.batch else ""
        if self.pure:
            return f"axis {self.axis}{of}"
        return f"axis {self.axis}{of} (folded: {self.outer} x examples x {self.inner})"


@dataclass(frozen=True)
class Elements:
    """A ``TensorList`` (a ``tf.TensorArray`` in a loop) whose elements hold the examples on
    ``of`` (an `Axis`), or hold none yet (``of == FREE``)."""

    of: object


@dataclass(frozen=True)
class Padded:
    """Examples on axis ``axis`` of batch ``batch`` (one per entry, a pure axis) with ``before``
    entries before them and ``after`` entries after them that hold no example: rows of a
    parameter or constant padding appended to a batch whose size is unknown at trace time
    (``concat([x, pad])`` along the examples' axis, ConcatV2 op ``op``). Such rows are not
    examples; the state lasts until a slice takes the examples' rows back
    (``h[:tf.shape(x)[0]]``), and a loss that still holds the extra rows is refused
    (`tb_gradmom.core.loss`): with the batch size unknown, whether they are examples of their
    own (a union, as with a static batch) or not (padding) cannot be told."""

    axis: int
    before: int
    after: int
    op: str
    batch: int = 0

    def moved(self, axis: int) -> Padded:
        return Padded(axis, self.before, self.after, self.op, self.batch)

    def __str__(self) -> str:
        return (
            f"axis {self.axis} with {self.before + self.after} rows that hold no example "
            f"(appended by ConcatV2 op '{self.op}')"
        )


def join(a, b):
    """The least upper bound of ``a`` and ``b``: the state of a loop variable that is ``a`` on
    entry and ``b`` after an iteration."""
    if a == b:
        return a
    if UNKNOWN in (a, b):
        return UNKNOWN
    if a == FREE:
        return b
    if b == FREE:
        return a
    if isinstance(a, Elements) and isinstance(b, Elements):
        inner = join(a.of, b.of)
        return UNKNOWN if inner == UNKNOWN else Elements(inner)
    return UNKNOWN


def describe(st) -> str:
    """``st`` in words, for messages."""
    if isinstance(st, Axis | Padded):
        return str(st)
    return {FREE: "no examples", REDUCED: "batch statistics", UNKNOWN: "unknown"}.get(st, str(st))
