"""Any differentiable op whose parameter operand holds no examples: the masked vector-Jacobian
product.

When an op ``z = f(p, x)`` has a parameter operand ``p`` (the variable, or a parameter derived
from it, with no examples in it) and an output whose examples' axis is proven, example ``j``'s
loss sees ``z`` only through ``j``'s own entries. So its gradient of ``p`` is the op's
vector-Jacobian product applied to ``delta`` with every entry zeroed but ``j``'s
(`tb_gradmom.core.rules.base.per_example_masked`)::

    g_j(p) = J_f(p)^T mask_j(delta)

with the other operands held fixed (their own dependence on the variable is another site). This
is exact for every op with a gradient; it costs one backward pass of the op per example
(vectorised over a chunk by ``pfor``), so the core uses it only where no specific rule applies:
DeBERTa's relative position projections tiled to the batch and multiplied by the queries, a
parameter as the left operand of a batched matmul, or an op family with no rule of its own.
"""

from __future__ import annotations

import tensorflow as tf

from tb_gradmom._compat import tf_private
from tb_gradmom.core.rules.base import (
    Contribution,
    Count,
    RuleError,
    Site,
    example_count,
    per_example_masked,
    reshape,
)
from tb_gradmom.core.rules.derived import _elements

__all__ = ["masked_vjp_rule"]


def masked_vjp_rule(site: Site) -> Contribution:
    """The generic rule for ``site`` (see the module docstring); `RuleError` if it does not
    apply (the parameter holds examples, the op has several outputs on the path, or the
    output's examples' axis is not proven)."""
    from tb_gradmom.core.axes import FREE

    op = site.op
    what = f"{op.type} op '{op.name}'"
    if site.view.dtype == tf.resource or not site.view.dtype.is_floating:
        raise RuleError("the consumed value is not a floating-point tensor")
    if site.axes.of(site.view) != FREE:
        raise RuleError("the consumed parameter itself holds examples")
    if len(op.outputs) != 1:
        raise RuleError(f"{what} has {len(op.outputs)} outputs")
    for name in ("pfor", "gradient_function"):
        if (why := tf_private.unavailable(name)) is not None:  # pragma: no cover
            raise RuleError(why)
    out = op.outputs[0]
    if not out.dtype.is_floating or out.shape.rank is None or site.view.shape.rank is None:
        raise RuleError("the output is not a floating-point tensor of static rank")
    ax = site.example_axis(out, f"the output of {what}")
    view = site.view
    grad_fn = tf_private.gradient_function(op)
    if grad_fn is None:
        raise RuleError(f"{what} has no registered gradient")

    def per_example(delta: tf.Tensor, n: Count, start: Count, size: Count) -> tf.Tensor:
        masked = tf.cast(per_example_masked(delta, ax, n, start, size), out.dtype)

        def loop_fn(i):
            # The op's own gradient function, for this input only (the same tensor at another
            # input of the op is another site).
            g = grad_fn(op, tf.gather(masked, i))
            g = g[site.index] if isinstance(g, (list, tuple)) else g
            if g is None:
                return tf.zeros(tf.shape(view), site.dtype)
            if isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)
            return tf.cast(g, site.dtype)

        rows = tf_private.pfor(loop_fn, tf.shape(masked)[0], fallback_to_while_loop=True)
        return reshape(rows, tf.concat([[-1], tf.shape(view)], 0))

    return Contribution(
        examples=example_count(out, ax.axis, ax.partners),
        evidence=f"the examples' {ax} of the output of {what}",
        per_example=per_example,
        per_example_elements=2 * _elements(out.shape) + _elements(view.shape),
    )
