"""The loop rule: the entry point `REGISTRY` uses for a variable a ``While`` loop consumes.

`recurrent_rule` takes the plan's analysis of the loop (`tb_gradmom.core.rules.loops.loop.Loops`),
the variable's uses inside the body (`tb_gradmom.core.rules.loops.body.uses`), registers them with
the loop (one copy for all its variables) and returns the `Contribution` whose per-example
gradients and power sums come from the copy's stacks (`tb_gradmom.core.rules.loops.graphdef`), on
chunks of examples where it can (`tb_gradmom.core.rules.loops.chunks`). A parameter as the
initial value of a carried loop variable is `init_rule`'s.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tb_gradmom.core import axes as _axes
from tb_gradmom.core.rules.base import (
    Contribution,
    Rule,
    RuleError,
    Site,
    example_count,
    per_example_masked,
    power_sums_of,
    sum_over_chunks,
)
from tb_gradmom.core.rules.loops import body as _body
from tb_gradmom.core.rules.loops import chunks as _chunks
from tb_gradmom.core.rules.loops import loop as _loop
from tb_gradmom.core.rules.loops.gradients import variable_gradients
from tb_gradmom.core.rules.loops.loop import Loop

__all__ = [
    "LOOP_OPS",
    "RECURRENT_RULE",
    "LoopGrads",
    "init_rule",
    "loop_outputs",
    "num_original_outputs",
    "recurrent_rule",
]

LOOP_OPS = frozenset({"While", "StatelessWhile"})


class LoopGrads(NamedTuple):
    """What the core passes as ``delta`` for a loop site.

    Attributes:
      grads: the gradients of the scalar loss with respect to the loop's outputs that reach the
        loss (``Site.output``, a tuple; None where a gradient is structurally zero), as
        ``tf.gradients`` gives them (a ``TensorList``'s gradient is a ``TensorList``).
      factor: the number (a Python float or a scalar tensor in the moment dtype) by which the
        core scales an unscaled output gradient (the batch size for a mean loss, the loss
        scale's inverse): the per-example gradients are linear in the seeds, so it multiplies
        them.
    """

    grads: tuple
    factor: object


def num_original_outputs(op: tf.Operation) -> int:
    """The loop's outputs as ``while_v2`` counts them (``_num_original_outputs``): before a
    gradient of the loop, those it was built with; after one, TensorFlow counts the
    accumulators it appended too (`tb_gradmom.core.rules.loops.body` tells them apart)."""
    try:
        return int(op.get_attr("_num_original_outputs"))
    except (ValueError, TypeError):
        return len(op.outputs)


def loop_outputs(op: tf.Operation, on_path) -> tuple:
    """The outputs of loop ``op`` through which the loss depends on it (floating point tensors
    and ``TensorList``s consumed on ``on_path``): the site's ``output``."""
    return tuple(
        t
        for t in op.outputs[: num_original_outputs(op)]
        if (t.dtype.is_floating or t.dtype == tf.variant)
        and any(c in on_path for c in t.consumers())
    )


def _in_xla(graph: tf.Graph) -> bool:
    """Whether ``graph`` is (inside) an XLA-compiled function; False where TensorFlow lacks the
    private function that tells."""
    from tb_gradmom._compat import PrivateAPIError, tf_private

    try:
        return tf_private.in_xla_context(graph)
    except PrivateAPIError:  # pragma: no cover
        return False


def recurrent_rule(site: Site) -> Contribution:
    """The rule for a variable (its handle, or its value) that a ``While`` loop consumes."""
    op = site.op
    what = f"{op.type} op '{op.name}'"
    if site.dtype not in (tf.float32, tf.float64):
        raise RuleError(f"moments in {site.dtype.name}")
    outputs = site.output if isinstance(site.output, tuple) else (site.output,)
    loop = _loop.active().of(site)
    if loop.steps_static is None and _in_xla(op.graph):
        raise RuleError(
            "inside an XLA-compiled function the copy of the loop needs its number of steps "
            "at trace time (a static sequence length), which no input of the loop shows"
        )
    if site.index not in loop.invariant:
        return init_rule(site, loop, outputs)
    uses = _body.uses(site, loop)
    for u in uses:
        if u.positions is not None and np.unique(u.positions).size != u.positions.size:
            raise RuleError("a view repeats entries of the variable")  # pragma: no cover
    if site.view.dtype == tf.resource:
        var_shape = tuple(int(d) for d in tf.TensorShape(site.var_shape))
    else:
        var_shape = tuple(int(d) for d in site.view.shape)
    var_key = (site.view.ref(), site.index)
    loop.register(uses, var_key, var_shape, int(np.prod(var_shape)), site.dtype)

    ev_t, ev_axis = _evidence(loop)
    if site.view.dtype == tf.resource:
        shape = tuple(int(d) for d in tf.TensorShape(site.var_shape))
    else:
        shape = tuple(int(d) for d in site.view.shape)
    size = int(np.prod(shape))
    dtype = site.dtype

    def gradients(stacks, start, count, factor):
        g = variable_gradients(uses, stacks, start, count, shape, size, dtype)
        if not (isinstance(factor, float) and factor == 1.0):
            g = g * tf.cast(factor, dtype)
        return g

    def per_example(delta, n, start, count):
        stacks = loop.stacks(delta.grads, outputs, n)
        return gradients(stacks, start, count, delta.factor)

    def power_sums(delta, n, orders, chunk=None):
        # The copy on chunks of at most `chunks.COPY_ELEMENTS` elements of stacks (and at most
        # `chunk` examples): unless the batch is statically one such chunk.
        copy_chunk = loop.copy_chunk(chunk)
        n_static = tf.get_static_value(n)
        if n_static is None or int(n_static) > copy_chunk:
            found = loop.chunk_sums(delta.grads, outputs, n, tuple(orders), copy_chunk)
            if found is not None:
                sums = found[var_key]
                factor = delta.factor
                if isinstance(factor, float) and factor == 1.0:
                    return dict(sums)
                return {p: v * tf.cast(factor, dtype) ** p for p, v in sums.items()}
        stacks = loop.stacks(delta.grads, outputs, n)
        # at most `part_elements` per-example elements at once (and at most `chunk` examples)
        budget = loop.part_elements(None if n_static is None else int(n_static))
        own = max(1, budget // max(size, 1))
        chunk = own if chunk is None else min(int(chunk), own)

        def chunk_sums(start, count):
            return power_sums_of(gradients(stacks, start, count, delta.factor), orders)

        return sum_over_chunks(
            n, chunk, orders, shape, dtype, chunk_sums, name="loop_chunks", unroll=_chunks.UNROLL
        )

    return Contribution(
        examples=example_count(ev_t, ev_axis),
        evidence=f"the examples' axis {ev_axis} of '{ev_t.name}', an output of {what}",
        per_example=per_example,
        per_example_elements=size,
        power_sums=power_sums,
        power_sums_elements=size,
        gradient_from_sums=True,
    )


def _evidence(loop: Loop) -> tuple[tf.Tensor, int]:
    """A carried floating-point output of the loop and its proven examples' axis."""
    for i in loop.carried:
        t = loop.op.outputs[i]
        st = loop.sub.of(loop.body.inputs[i])
        if t.dtype.is_floating and isinstance(st, _axes.Axis) and st.pure:
            return t, st.axis
    raise RuleError("no output of the loop holds the examples on a proven axis")


def init_rule(site: Site, loop: Loop, outputs: tuple) -> Contribution:
    """A parameter (the variable's value, or a value derived from it that holds no examples:
    a learned state tiled or broadcast to the batch) as the initial value ``s_0`` of a carried
    loop variable whose examples' axis ``a`` inside the body is proven.

    The proof holds with ``s_0``'s slices along ``a`` as the examples' (the fixed point joins
    the free entry state with the state after an iteration): example ``j``'s loss depends on
    ``s_0`` only through slice ``j``, so ``g_j(s_0)`` is slice ``j`` of ``dL/ds_0`` (times the
    loss's scale, as the taps' deltas), every other slice zero. ``dL/ds_0`` is the copy's
    gradient with respect to its initial value, from the same backward pass as the taps'
    deltas. Whatever computed ``s_0`` from the variable (a ``Tile``) is a derived region that
    the core pulls back through (`tb_gradmom.core.rules.derived.region_contribution`)."""
    op, i = site.op, site.index
    where = f"the initial value of loop variable {i} of {op.type} op '{op.name}'"
    if op.inputs[i].dtype == tf.resource:
        raise RuleError(f"the variable's handle is {where}, which the loop replaces")
    if not site.view.dtype.is_floating or site.view.dtype != site.dtype:
        raise RuleError(f"the variable's value is {where}, not in {site.dtype.name}")
    if site.axes.of(site.view) != _axes.FREE:  # pragma: no cover - a site's view holds none
        raise RuleError(f"{where} holds examples")
    body_input = loop.body.inputs[i]
    st = loop.sub.of(body_input)
    if not isinstance(st, _axes.Axis) or not st.pure or st.batch:
        why = f" (stopped at {loop.sub.why(body_input)})" if st == _axes.UNKNOWN else ""
        raise RuleError(
            f"the variable's value is {where}, which the loop updates at every step; that loop "
            f"variable's examples' axis inside the loop is not proven: {_axes.describe(st)}{why}"
        )
    if site.view.shape.rank is None or site.view.shape.rank <= st.axis:
        raise RuleError(f"the rank of {where} is not static")
    ev_t, ev_axis = _evidence(loop)
    loop.inits[i] = st.axis
    ax = _axes.Axis(st.axis)
    dtype = site.dtype

    def per_example(delta, n, start, count):
        g = loop.stacks(delta.grads, outputs, n)[f"init:{i}"]  # dL/ds_0, unscaled
        factor = delta.factor
        if not (isinstance(factor, float) and factor == 1.0):
            g = g * tf.cast(factor, g.dtype)
        return tf.cast(per_example_masked(g, ax, n, start, count), dtype)

    elements = 1
    for d in site.view.shape:
        elements *= d if d is not None else 1024
    return Contribution(
        examples=example_count(ev_t, ev_axis),
        evidence=f"the examples' axis {ev_axis} of '{ev_t.name}', an output of {op.type} op "
        f"'{op.name}', and {st} of loop variable {i} inside it",
        per_example=per_example,
        per_example_elements=int(elements) + loop.copy_elements(),
    )


# Keras recurrent layers: a variable read inside a tf.while_loop. A site needs the gradients of
# every loop output the loss depends on, handed to the rule as one `LoopGrads`.
RECURRENT_RULE = Rule(
    "recurrent",
    ops=tuple(sorted(LOOP_OPS)),
    contribution=recurrent_rule,
    outputs=loop_outputs,
    seed=LoopGrads,
)
