"""Embeddings: ``GatherV2`` on the variable's value (Keras ``Embedding``) and ``ResourceGather``.

Row ``v`` of example ``j``'s gradient sums the output gradients of every position where the
example looks ``v`` up: ``g_j[v] = sum_{t: ids[j,t] = v} delta_{j,t}``. Repeated ids within an
example are summed *before* the power. The rule segment-sums ``delta`` over the unique
``(example, id)`` pairs, raises those sums to the power, and segment-sums them by id: memory
``O(tokens * dim)``, never ``O(n * vocab * dim)``.

The examples' axis of the ids is proven by `tb_gradmom.core.axes`. Ids with no examples (a position
table looked up with ``arange(T)`` or ``position_ids [1, T]``) make the looked-up rows a
*derived parameter*: the core chains their per-example gradients back to the table.
"""

from __future__ import annotations

import tensorflow as tf

from tb_gradmom.core.rules.base import (
    Contribution,
    Count,
    Rule,
    RuleError,
    Site,
    example_count,
    example_slice,
    examples_first,
    power,
    reshape,
    times,
)

__all__ = ["GATHER_RULE", "gather_rule"]


def gather_rule(site: Site) -> Contribution:
    """The rule for a variable whose rows are looked up by ``GatherV2`` or ``ResourceGather``."""
    op = site.op
    if op.type == "GatherV2":
        if site.index != 0:
            raise RuleError("the variable is the indices of the gather, not its params")
        axis = tf.get_static_value(op.inputs[2])
        if axis is None or int(axis) != 0:
            raise RuleError(f"only a gather along axis 0 is supported, got axis {axis}")
        shape = site.view.shape
    else:  # ResourceGather reads the rows straight from the resource handle.
        shape = site.var_shape
    if op.get_attr("batch_dims") != 0:
        raise RuleError("a gather with batch_dims is not supported")
    if shape is None or not shape.is_fully_defined() or shape.rank < 1:
        raise RuleError("the embedding table's shape is not static")
    vocab = int(shape[0])
    row = [int(s) for s in shape[1:]]
    row_size = 1
    for s in row:
        row_size *= s
    indices = op.inputs[1]
    if indices.shape.rank == 0:
        raise RuleError("a single looked-up id has no examples' axis")
    ax = site.example_axis(indices, f"the ids of {op.type} op '{op.name}'")

    def pairs(delta, n, start, size):
        """Per (example, id) pair of examples [start, start + size): ids, local example, sums."""
        ids = examples_first(tf.cast(indices, tf.int64), ax, n)
        ids = example_slice(reshape(ids, [n, -1]), start, size)
        d = example_slice(reshape(examples_first(delta, ax, n), [n, -1, row_size]), start, size)
        per = tf.shape(ids, out_type=tf.int64)[1]
        example = tf.repeat(tf.range(tf.cast(size, tf.int64)), per)
        key = example * vocab + reshape(ids, [-1])
        unique, slot = tf.unique(key)
        sums = tf.math.unsorted_segment_sum(reshape(d, [-1, row_size]), slot, tf.size(unique))
        return unique // vocab, unique % vocab, sums

    def power_sums(
        delta: tf.Tensor, n: Count, orders: tuple[int, ...], chunk: int | None = None
    ) -> dict[int, tf.Tensor]:
        _, ids, g = pairs(delta, n, 0, n)
        g_pow = {1: g}
        return {
            p: reshape(tf.math.unsorted_segment_sum(power(g_pow, p), ids, vocab), [vocab, *row])
            for p in orders
        }

    def sq_norms(
        delta: tf.Tensor, n: Count, shift: tf.Tensor | None, chunk: int | None = None
    ) -> tf.Tensor:
        # g_j's rows are the (example, id) pairs' sums: ||g_j||^2 sums their squared norms;
        # <g_j, C> sums their dot products with C's rows at those ids
        example, ids, g = pairs(delta, n, 0, n)
        per_pair = tf.reduce_sum(tf.square(g), axis=1)
        if shift is not None:
            c = reshape(shift, [vocab, row_size])
            per_pair = per_pair + times(tf.reduce_sum(g * tf.gather(c, ids), axis=1), 2.0)
        out = tf.math.unsorted_segment_sum(per_pair, example, n)
        if shift is not None:
            out = out + tf.reduce_sum(tf.square(c))
        return out

    def per_example(delta: tf.Tensor, n: Count, start: Count, size: Count) -> tf.Tensor:
        example, ids, g = pairs(delta, n, start, size)
        dense = tf.math.unsorted_segment_sum(g, example * vocab + ids, size * vocab)
        return reshape(dense, [-1, vocab, *row])

    return Contribution(
        examples=example_count(indices, ax.axis, ax.partners),
        evidence=f"the examples' {ax} of the ids of {op.type} op '{op.name}'",
        per_example=per_example,
        per_example_elements=vocab * row_size,
        power_sums=power_sums,
        sq_norms=sq_norms,
    )


GATHER_RULE = Rule("gather", ops=("GatherV2", "ResourceGather"), contribution=gather_rule)
