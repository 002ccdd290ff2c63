"""The exact fallback: per-example gradients of the per-example loss vector, vectorised.

For a variable whose consumer has no rule (an op with several outputs such as a fused batch
norm, a custom op, a loop body the loop rule refuses, an unproven examples' axis), row ``j`` of the jacobian of the per-example losses ``l`` with respect to the
variable is ``g_j = d l_j / d theta``, by definition. It is computed with TensorFlow's ``pfor``
(what ``tf.vectorized_map`` and ``GradientTape.jacobian`` use): the backward pass from the seed
``e_j`` is vectorised over the examples of a chunk. That costs about one backward pass of the
whole batch per example (the rules cost one extra pass in all), hence "slow path".

Gating. `summary.moments` computes moments only on the steps it records, inside a ``tf.cond``.
A gradient cannot be taken inside a ``cond`` branch of tensors computed outside it, so the
fallback's ops live in the step's graph and are gated the way a lowered ``cond`` gates its
branches: the seed's size passes through a ``Switch`` on the predicate, every op of the
vectorised backward depends on it, and on a step that records nothing they all receive a dead
tensor and do not run; a ``Merge`` returns zeros instead. Loops and function calls created by
the vectorisation get every input gated the same way (a loop runs as long as any input is live).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tb_gradmom._compat import tf_private
from tb_gradmom.core import graph as _graph
from tb_gradmom.core.errors import UnsupportedOpError
from tb_gradmom.core.rules import vectorisation_hazard
from tb_gradmom.core.rules.base import power_sum

__all__ = ["refuse_broken", "power_sums", "sq_norms", "DEFAULT_CHUNK"]

# Examples per vectorised chunk: each holds about `chunk` backward passes of the whole batch.
DEFAULT_CHUNK = 32

# Ops that run functions (loops, conds, calls): those the vectorisation creates get every input
# gated (`_gate_function_ops`).
_FUNCTION_OPS = frozenset(
    {"While", "StatelessWhile", "If", "StatelessIf", "PartitionedCall", "StatefulPartitionedCall"}
)


def refuse_broken(
    variables: Sequence[tf.Variable],
    names: Sequence[str],
    graph: tf.Graph,
    on_path: set[tf.Operation],
) -> None:
    """Raise `UnsupportedOpError` when the fallback's backward pass for these variables would
    cross an op that TensorFlow's vectorisation gets wrong (wrong numbers, no error), as the
    op's rule says (`tb_gradmom.core.rules.Rule.vectorisation_hazard`): a grouped convolution
    (Keras wraps them in an XLA-compiled function)."""
    for v, name in zip(variables, names):
        handle = _graph.internal_handle(graph, v)
        if handle is None:
            continue
        seen: set[tf.Operation] = set()
        stack = [c for c in handle.consumers() if c in on_path]
        while stack:
            op = stack.pop()
            if op in seen:
                continue
            seen.add(op)
            why = vectorisation_hazard(op)
            if why is not None:
                raise UnsupportedOpError(
                    f"variable '{name}' has no exact rule and needs the exact fallback, but its "
                    f"per-example gradients would pass through {op.type} op '{op.name}' ({why}): "
                    "the fallback would return wrong numbers, so gradmom refuses. Leave "
                    f"'{name}' out of the logged variables (summary.moments(log_only=...)) or "
                    "open an issue with the layer that builds this op.",
                    reason=f"{op.type} op '{op.name}': {why}",
                )
            for out in op.outputs:
                stack.extend(c for c in out.consumers() if c in on_path)


def power_sums(
    loss_vector: tf.Tensor,
    variables: Sequence[tf.Variable],
    dtypes: Sequence[tf.DType],
    orders: Sequence[int],
    n: int | tf.Tensor,
    chunk: int,
    gate: tf.Tensor | None = None,
    inv_scale: tf.Tensor | None = None,
) -> list[dict[int, tf.Tensor]]:
    """``[{p: sum_j g_j ** p}]`` for each variable, from the jacobian of ``loss_vector``.

    ``chunk``: examples vectorised at once (one copy of the vectorised backward pass in the
    graph per chunk when the batch size is static; the whole batch at once otherwise).
    ``gate``: a scalar bool tensor; where it is False nothing of this runs and zeros come out.
    ``inv_scale``: ``1 / loss_scale`` when ``loss_vector`` is scaled (mixed precision).

    In float16/bfloat16 the seed is ``e_j / n``, so a row has the size of the (loss-scaled)
    mean gradient, which loss scaling keeps in range, rather than ``n`` times it; rows are
    then cast to the moment dtype (float32) and multiplied back, before any power.
    """
    # PrivateAPIError before building anything
    tf_private.require("pfor", *(("update_input",) if gate is not None else ()))
    graph = loss_vector.graph
    seed_size = tf.size(loss_vector)
    if gate is not None:
        seed_size = tf.raw_ops.Switch(data=seed_size, pred=gate)[1]
    n_static = tf.get_static_value(n)
    starts: list[tuple[int, int | None]]
    if n_static is not None:
        n_static = int(n_static)
        starts = [(s, min(chunk, n_static - s)) for s in range(0, n_static, chunk)]
    else:
        starts = [(0, None)]
    totals: list[dict[int, tf.Tensor]] = []
    for chunk_index, (start, size) in enumerate(starts):
        before = set(graph.get_operations())
        rows = _rows(
            loss_vector, variables, dtypes, seed_size, start, n if size is None else size, inv_scale
        )
        if gate is not None:
            _gate_function_ops(graph, before, gate)
        sums = [{p: power_sum(g_pow, p) for p in orders} for g_pow in ({1: g} for g in rows)]
        if chunk_index == 0:
            totals = sums
        else:
            totals = [{p: t[p] + s[p] for p in orders} for t, s in zip(totals, sums)]
    if not starts:  # a statically empty batch: no chunk, and sums of zero examples
        totals = [{p: tf.zeros(v.shape, d) for p in orders} for v, d in zip(variables, dtypes)]
    if gate is not None:
        totals = [{p: _merge_zeros(s, gate) for p, s in t.items()} for t in totals]
    return totals


def sq_norms(
    loss_vector: tf.Tensor,
    variables: Sequence[tf.Variable],
    dtypes: Sequence[tf.DType],
    shifts: Sequence[tf.Tensor | None],
    n: int | tf.Tensor,
    chunk: int,
    inv_scale: tf.Tensor | None = None,
    gate: tf.Tensor | None = None,
) -> list[tf.Tensor]:
    """``[n]`` per variable: ``||g_j + shift||^2`` with ``g_j`` row ``j`` of the jacobian of
    ``loss_vector`` (chunks of ``chunk`` examples vectorised at once when the batch size is
    static, the whole batch otherwise; see `power_sums`). ``gate``: as for `power_sums`
    (zeros where it is False, nothing of this run)."""
    from tb_gradmom.core.rules.base import sq_norms_of

    tf_private.require("pfor", *(("update_input",) if gate is not None else ()))
    graph = loss_vector.graph
    seed_size = tf.size(loss_vector)
    if gate is not None:
        seed_size = tf.raw_ops.Switch(data=seed_size, pred=gate)[1]
    n_static = tf.get_static_value(n)
    starts: list[tuple[int, int | None]] = [(0, None)]
    if n_static is not None:
        starts = [(s, min(chunk, int(n_static) - s)) for s in range(0, int(n_static), chunk)]
    parts: list[list[tf.Tensor]] = [[] for _ in variables]
    for start, size in starts:
        before = set(graph.get_operations())
        rows = _rows(
            loss_vector, variables, dtypes, seed_size, start, n if size is None else size, inv_scale
        )
        if gate is not None:
            _gate_function_ops(graph, before, gate)
        for k, (g, shift) in enumerate(zip(rows, shifts)):
            parts[k].append(sq_norms_of(g if shift is None else g + shift))
    if not starts:  # a statically empty batch
        return [tf.zeros([0], d) for d in dtypes]
    out = [p[0] if len(p) == 1 else tf.concat(p, 0) for p in parts]
    if gate is not None:
        # zeros of the batch's size, built from the (live) loss vector
        out = [
            tf.raw_ops.Merge(
                inputs=[
                    tf.raw_ops.Switch(data=tf.zeros(tf.shape(loss_vector)[:1], t.dtype), pred=gate)[
                        0
                    ],
                    t,
                ]
            )[0]
            for t in out
        ]
    return out


def _rows(
    loss_vector: tf.Tensor,
    variables: Sequence[tf.Variable],
    dtypes: Sequence[tf.DType],
    seed_size: tf.Tensor,
    start: int,
    size: int | tf.Tensor,
    inv_scale: tf.Tensor | None,
) -> list[tf.Tensor]:
    low = loss_vector.dtype in (tf.float16, tf.bfloat16)

    def loop_fn(i: tf.Tensor) -> list[tf.Tensor]:
        seed = tf.one_hot(i + start, seed_size, dtype=loss_vector.dtype)
        if low:
            seed = seed / tf.cast(seed_size, seed.dtype)
        grads = tf.gradients(loss_vector, variables, grad_ys=seed, unconnected_gradients="zero")
        rows = []
        for g, d in zip(grads, dtypes):
            g = tf.cast(tf.convert_to_tensor(g), d)
            if low:
                g = g * tf.cast(seed_size, d)
            if inv_scale is not None:
                g = g * tf.cast(inv_scale, d)
            rows.append(g)
        return rows

    return tf_private.pfor(loop_fn, size, fallback_to_while_loop=True)


def _gate_function_ops(graph: tf.Graph, before: set[tf.Operation], gate: tf.Tensor) -> None:
    for op in graph.get_operations():
        if op in before or op.type not in _FUNCTION_OPS:
            continue
        for i, t in enumerate(list(op.inputs)):
            if t.dtype == tf.resource or t.op.type == "Switch":
                continue
            tf_private.update_input(op, i, tf.raw_ops.Switch(data=t, pred=gate)[1])


def _merge_zeros(t: tf.Tensor, gate: tf.Tensor) -> tf.Tensor:
    # Built from the (static) shape, not from `t`, which is dead when the gate is closed.
    zeros = tf.raw_ops.Switch(data=tf.zeros(t.shape, t.dtype), pred=gate)[0]
    return tf.raw_ops.Merge(inputs=[zeros, t])[0]
