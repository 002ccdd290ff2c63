"""One analysed loop and the loops of one plan.

A `Loop` is a loop's analysis (`tb_gradmom.core.rules.loops.body.LoopBody`) plus what the rules
of its variables registered (their uses' taps and records, their shapes) and the copies built
from it (one per graph and set of seeds): one analysis, one set of taps and one copy for all of
the loop's variables.

`Loops` holds the loops one plan analysed, by op name. The plan owns it
(`tb_gradmom.core.plan.Plan.loops`): `tb_gradmom.core.plan.make_plan` makes the plan's `Loops`
the `active` one while it plans its variables, and nothing of it outlives the plan. A rule
called outside a plan gets loops of its own.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from tb_gradmom.core.rules.base import RuleError, Site
from tb_gradmom.core.rules.loops import chunks as _chunks
from tb_gradmom.core.rules.loops import graphdef as _graphdef
from tb_gradmom.core.rules.loops.body import LoopBody, analyse

__all__ = ["Loop", "Loops", "active"]


@dataclass
class Loop(LoopBody):
    """One while loop: what the copy needs, the uses registered by the rules of its variables,
    and the copies built (one per graph and set of seeds)."""

    taps: dict = field(default_factory=dict)
    records: dict = field(default_factory=dict)
    built: dict = field(default_factory=dict)
    # the registered variables: key -> (uses, shape, size, dtype)
    variables: dict = field(default_factory=dict)
    # carried loop variables whose initial value is a parameter (`init_rule`): input index ->
    # the examples' axis of the loop variable inside the body
    inits: dict = field(default_factory=dict)

    @classmethod
    def from_body(cls, found: LoopBody) -> Loop:
        return cls(**{k: getattr(found, k) for k in LoopBody.__dataclass_fields__})

    def register(self, uses, key=None, shape=(), size=0, dtype=tf.float32) -> None:
        for u in uses:
            self.taps.setdefault(u.tap.name, u.tap)
            if u.record is not None:
                self.records.setdefault(u.record.name, u.record)
        if key is not None:
            self.variables.setdefault(key, (tuple(uses), tuple(shape), int(size), dtype))

    def copy_elements(self) -> int:
        """Elements one example holds in the copy's stacks of deltas and records (twice: a
        list of the steps and its stack), which `chunk_sums` bounds."""
        width = 0
        for t in list(self.taps.values()) + list(self.records.values()):
            width += int(np.prod([d for d in t.dims if d is not None]))
        return 2 * width * (self.steps_static or 128)

    def copy_chunk(self, chunk=None) -> int:
        """The most examples one copy runs on: its stacks hold at most
        `~tb_gradmom.core.rules.loops.chunks.COPY_ELEMENTS` elements (and at most ``chunk``
        examples, when given)."""
        copy_chunk = max(1, _chunks.COPY_ELEMENTS // max(self.copy_elements(), 1))
        return copy_chunk if chunk is None else min(copy_chunk, int(chunk))

    def part_elements(self, examples) -> int:
        """Per-example gradient elements summed at once, for a copy run on ``examples``
        examples (a Python int, or None when unknown): `~chunks.CHUNK_ELEMENTS`, or a quarter of
        the copy's stacks when that is less. A small recurrence's step holds a few MB (the
        LSTM(64) of ``bench_core.py``: 2.2 MB), which a full 1 MiB part (and its square)
        outgrows."""
        if examples is None:
            return _chunks.CHUNK_ELEMENTS
        stacks = self.copy_elements() // 2 * int(examples)
        return max(1, min(_chunks.CHUNK_ELEMENTS, stacks // 4))

    def stacks(self, grads: tuple, outputs: tuple, n) -> dict:
        """``{tensor name in the body: [T, *element] stack over the steps}``: ``delta`` at every
        tap and every recorded operand, time-major (the examples on the tap's or record's
        ``axis`` of the element), from a copy of the loop built in the current graph (once per
        graph and seeds). Chunks of examples are sliced from them (`~gradients.chunk_of`)."""
        graph = tf.compat.v1.get_default_graph()
        key: tuple = (id(graph), tuple(None if g is None else id(g) for g in grads))
        key += (tuple(sorted(self.taps)), tuple(sorted(self.records)), tuple(sorted(self.inits)))
        hit = self.built.get(key)
        if hit is not None and hit[0] is graph:
            return hit[1]
        out = self.build(grads, outputs, n, inits=tuple(sorted(self.inits)))
        self.built[key] = (graph, out)
        return out

    def chunk_sums(self, grads: tuple, outputs: tuple, n, orders: tuple, chunk: int):
        """``{variable key: {p: sum_j g_j ** p}}`` (unscaled) for every registered variable,
        from copies on chunks of at most ``chunk`` examples (`chunks.chunk_sums`); None when
        the seeds cannot be sliced."""
        return _chunks.chunk_sums(self, grads, outputs, n, orders, chunk)

    def build(self, grads, outputs, n, inputs=None, inits=()) -> dict:
        """A copy's stacks (`graphdef.build_copy`)."""
        return _graphdef.build_copy(self, grads, outputs, n, inputs, inits)


class Loops:
    """The loops one plan analysed (or refused), by the analysis of the examples and op name."""

    def __init__(self) -> None:
        self._found: dict[tuple, Loop | RuleError] = {}

    def __len__(self) -> int:
        return len(self._found)

    def of(self, site: Site) -> Loop:
        """The loop ``site`` consumes a variable in, analysed once; its `RuleError` again if
        the analysis refused it."""
        key = (site.axes, site.op.name)
        found = self._found.get(key)
        if found is None:
            try:
                found = Loop.from_body(analyse(site))
            except RuleError as e:
                found = e
            self._found[key] = found
        if isinstance(found, RuleError):
            raise found
        return found

    @contextlib.contextmanager
    def planning(self) -> Iterator[Loops]:
        """These loops are the `active` ones inside the ``with`` block (while a plan is made)."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)


# The loops of the plan being made (`Loops.planning`), None outside `make_plan`.
_ACTIVE: contextvars.ContextVar[Loops | None] = contextvars.ContextVar(
    "gradmom_loops", default=None
)


def active() -> Loops:
    """The loops of the plan being made; outside one, new loops (nothing kept)."""
    found = _ACTIVE.get()
    return Loops() if found is None else found
