"""Concatenation with the examples (``ConcatV2``): a parameter joined to example tensors.

A ViT class token is tiled to the batch, ``[n, 1, d]``, and concatenated with the patches along
the sequence; the token's copy in row ``j`` meets example ``j`` only. Example ``j``'s gradient of
the concatenated parameter is its slice of ``delta``, masked to ``j``'s entries
(`tb_gradmom.core.rules.base.per_example_masked`); a parameter with no examples' axis (a size-1 axis
broadcast nowhere is not possible in a concatenation) gets its slice of ``delta_j`` itself. The
core chains the result back through the tiling to the variable.
"""

from __future__ import annotations

import tensorflow as tf

from tb_gradmom.core.rules.base import (
    Contribution,
    Rule,
    RuleError,
    Site,
    example_count,
    per_example_masked,
)
from tb_gradmom.core.rules.derived import _elements

__all__ = ["CONCAT_RULE", "concat_rule"]


def concat_rule(site: Site) -> Contribution:
    """``ConcatV2(values..., axis)`` with the variable (or a parameter derived from it) among
    the values, along an axis that is not the examples'."""
    op = site.op
    out = op.outputs[0]
    ax = site.example_axis(out, f"the output of {op.type} op '{op.name}'")
    axis = tf.get_static_value(op.inputs[-1])
    rank = out.shape.rank
    if axis is None or rank is None:
        raise RuleError("the concatenation axis or rank is not static")
    axis = int(axis) % rank
    if axis == ax.axis:
        raise RuleError("the concatenation is along the examples' axis")
    vshape = site.view.shape
    if vshape.rank != rank:
        raise RuleError("the parameter's rank differs from the concatenation's")
    sizes = [x.shape[axis] for x in op.inputs[:-1]]
    if any(s is None for s in sizes[: site.index + 1]):
        raise RuleError("the sizes along the concatenation axis are not static")
    offset = sum(sizes[: site.index])
    length = sizes[site.index]
    full_rows = vshape[ax.axis] != 1  # unknown (the batch) or the batch size

    def part(delta):
        begin = [0] * rank
        begin[axis] = offset
        size = [-1] * rank
        size[axis] = length
        return tf.slice(delta, begin, size)

    def per_example(delta, n, start, count):
        d = part(delta)
        if full_rows:  # the parameter spans the batch: each example gets its own rows
            return per_example_masked(d, ax, n, start, count)
        raise RuleError("unreachable")  # pragma: no cover

    if not full_rows:
        raise RuleError("a parameter with one row concatenated to a batch is not possible")
    return Contribution(
        examples=example_count(out, ax.axis, ax.partners),
        evidence=f"the examples' {ax} of the output of {op.type} op '{op.name}'",
        per_example=per_example,
        per_example_elements=_elements(vshape),
    )


CONCAT_RULE = Rule("concat", ops=("ConcatV2",), contribution=concat_rule)
