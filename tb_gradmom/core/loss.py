"""The loss, checked rather than trusted: is the scalar a mean or a sum of per-example losses?

Every moment rests on ``L = (1/n) sum_j l_j`` (a mean) or ``L = sum_j l_j`` (a sum) with ``l_j``
depending on example ``j`` alone. `analyse` proves that from the graph: it follows the scalar
down through constant factors (``0.5 *``, Keras' ``sum / size``, a loss scale, ``1/replicas``;
a factor holds no example) and sums of terms (several outputs with loss weights; Keras' total
``ops.sum([loss, *model.losses])``, a ``Sum``/``Mean`` of stacked scalars; ``tf.add_n``) to
``Sum``/``Mean`` reductions of tensors whose examples' axis `tb_gradmom.core.axes` proves. A
``Max``, a norm, a product, or a reduction of values that mix the examples is refused with an
error that names the op and says which vector to pass.

A term that holds no example (a weight penalty ``lam * ||W||^2``, an ``add_loss`` of the
parameters) is a `FreeTerm`: their sum ``R`` is part of every example's loss, ``l_j + R`` for a
mean (``mean_j (l_j + R) == L``) and ``l_j + R / n`` for a sum (``sum_j (l_j + R / n) == L``).
Its gradient is the same for every example: `tb_gradmom.core.moments` adds it to the
per-example gradients of the rest (`example_path` is where those are taken) by the binomial
expansion, so that ``M_1`` is the gradient and the variance does not move.

The reduction is read off the same walk: a ``Mean`` over the examples or a division by a count
that holds the batch size makes a mean; no such division makes a sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

import numpy as np
import tensorflow as tf

from tb_gradmom.core import axes as _axes
from tb_gradmom.core import graph as _graph
from tb_gradmom.core.errors import PerExampleLossError
from tb_gradmom.core.rules.base import examples_first

__all__ = [
    "LossForm",
    "FreeTerm",
    "analyse",
    "per_example_losses",
    "example_path",
    "holds_no_example",
]

_VIEWS = frozenset({"Identity", "Cast", "Reshape", "Squeeze", "ExpandDims", "EnsureShape"})
_LINEAR_REDUCTIONS = frozenset({"Sum", "Mean"})
_NOT_SUMS = {
    "Max": "a maximum",
    "Min": "a minimum",
    "Prod": "a product",
    "EuclideanNorm": "a Euclidean norm",
    "Sqrt": "a square root",
    "Square": "a square",
    "Pow": "a power",
    "Log": "a logarithm",
    "Exp": "an exponential",
    "LogSumExp": "a log-sum-exp",
}


@dataclass
class Term:
    """``factor * sum(values)``: ``values`` holds examples on ``axis`` (assumed 0 if unproven)."""

    values: tf.Tensor
    factors: list[Factor]  # scalar tensors (or floats) multiplied together
    axis: _axes.Axis
    # the exponent of the batch size in the factors: -1 after a division by a count that
    # holds it (a mean), 0 without
    n_power: int
    divisors: list[int] = field(default_factory=list)  # static int divisors (constant-folded)
    proven: bool = True  # False: the examples' axis is not proven, and assumed 0


@dataclass(frozen=True)
class FreeTerm:
    """``factor * value``, a term of the loss that holds no example; ``into`` is the op that
    adds it to the rest of the loss (``value`` is its input there)."""

    value: tf.Tensor
    factors: list[Factor]
    into: tf.Operation


@dataclass
class LossForm:
    """``scalar == sum_k factor_k * sum(values_k) + R``, ``R`` the sum of the `free` terms."""

    terms: list[Term]
    mode: str  # "mean" or "sum"
    structural: bool  # the mode follows from the graph's structure (not from a constant's value)
    proven: bool  # every term's examples' axis is proven
    note: str = ""  # why not proven
    free: list[FreeTerm] = field(default_factory=list)  # the terms that hold no example

    @property
    def values(self) -> tf.Tensor:
        return self.terms[0].values


def _fail(
    scalar: tf.Tensor, op: tf.Operation, what: str, term: tf.Tensor | None = None
) -> PerExampleLossError:
    """The error for a loss whose walk stopped at ``op`` (``what`` it is); ``term``: the
    addend of the loss being followed, when the loss is a sum of several terms."""
    if term is None or term is scalar:
        return PerExampleLossError(
            f"the scalar loss '{scalar.name}' is not a mean or a sum of per-example losses: it "
            f"goes through {what} (op '{op.name}', {op.type}), so its gradient has no "
            "per-example split. Pass the [n] vector of per-example losses as `loss` instead "
            "(for example keras.losses.*(reduction=None)(y, y_pred), or "
            "tf.nn.softmax_cross_entropy_with_logits(...) before any reduction over the batch)."
        )
    return PerExampleLossError(
        f"the scalar loss '{scalar.name}' is not a mean or a sum of per-example losses: its "
        f"term '{term.name}', added to the loss, goes through {what} (op '{op.name}', "
        f"{op.type}), so that term's gradient has no per-example split. A term like this is "
        "usually an auxiliary loss computed over the whole batch (a mixture-of-experts "
        "load-balancing loss added with add_loss, a penalty on batch statistics). Compute the "
        "moments of a loss without that term (the compiled loss alone, without "
        "model.losses), or pass the [n] vector of per-example losses as `loss`."
    )


def _scalar_factor(t: tf.Tensor, ex: _axes.Examples) -> bool:
    """Whether ``t`` can be a constant factor of the per-example losses: a scalar that holds no
    example, or a batch statistic that no gradient flows through (a count of valid entries
    computed from the labels). A statistic of the batch that depends on the variables (the mean
    of an activation, a load-balancing loss) is not: its gradient mixes the examples."""
    if t.shape.rank != 0:
        return False
    st = ex.of(t)
    return st == _axes.FREE or (st == _axes.REDUCED and not _reads_variables(t))


def _reads_variables(t: tf.Tensor, limit: int = 100_000) -> bool:
    """Whether a gradient can flow from ``t`` back to a variable: a path of floating-point
    tensors (no gradient passes an integer or boolean tensor, or a ``StopGradient``) from an
    op that reads a resource (a variable's ``ReadVariableOp``, a call that captures one) to
    ``t``. Conservative: past ``limit`` ops it says yes."""
    seen: set[tf.Operation] = set()
    stack = [t]
    while stack:
        x = stack.pop()
        op = x.op
        if op in seen or op.type == "StopGradient":
            continue
        seen.add(op)
        if len(seen) > limit:
            return True
        for inp in op.inputs:
            if inp.dtype == tf.resource:
                return True
            if inp.dtype.is_floating or inp.dtype.is_complex:
                stack.append(inp)
    return False


def analyse(scalar: tf.Tensor, ex: _axes.Examples, replicas: int = 1) -> LossForm:
    """The form of a scalar loss; raises `PerExampleLossError` when it is not a mean or a sum
    of per-example losses."""
    terms: list[Term] = []
    free: list[FreeTerm] = []
    stack: list[_Item] = [(scalar, [], 0, [], None, None)]
    steps = 0
    while stack:
        t, factors, n_power, divisors, term, into = stack.pop()
        steps += 1
        if steps > 10_000:
            raise _fail(scalar, t.op, "a graph too deep to follow")
        op = t.op
        ty = op.type
        if into is not None and ex.of(t) == _axes.FREE:
            free.append(FreeTerm(t, factors, into))  # R: the same for every example
            continue
        scalar_sum = ty in _LINEAR_REDUCTIONS and op.inputs[0].shape.rank == 0
        if (ty in _VIEWS and t.shape.rank == 0) or ty in ("Identity", "Cast") or scalar_sum:
            # the same value (Keras' sum of an add_loss value over no axes): an addend is
            # named by what it passes on
            x = op.inputs[0]
            stack.append((x, factors, n_power, divisors, x if term is t else term, op))
            continue
        if ty == "Neg":
            stack.append((op.inputs[0], factors + [-1.0], n_power, divisors, term, op))
            continue
        if ty in ("Mul", "MulNoNan"):
            a, b = op.inputs
            for f, rest in ((b, a), (a, b)):
                if _scalar_factor(f, ex) and t.shape.rank == 0:
                    divs = divisors + _replicas(f, replicas)
                    stack.append((rest, factors + [f], n_power, divs, term, op))
                    break
            else:
                raise _fail(
                    scalar,
                    op,
                    "a product of two values that depend on the examples (a factor must hold "
                    "no example: a batch statistic that depends on the variables mixes them)",
                    term,
                )
            continue
        if ty in ("RealDiv", "DivNoNan", "Div"):
            a, b = op.inputs
            if not _scalar_factor(b, ex):
                raise _fail(
                    scalar,
                    op,
                    "a division by a value that depends on the examples (a divisor must hold "
                    "no example, or be a count no gradient flows through)",
                    term,
                )
            holds, divs = _count_in(b, ex)
            stack.append(
                (a, factors + [_Reciprocal(b)], n_power + holds, divisors + divs, term, op)
            )
            continue
        if ty in ("AddV2", "Add", "AddN", "Sub"):
            for i, x in enumerate(op.inputs):
                sign = [-1.0] if ty == "Sub" and i == 1 else []
                stack.append((x, factors + sign, n_power, divisors, x, op))
            continue
        if ty in _LINEAR_REDUCTIONS:
            values = op.inputs[0]
            if t.shape.rank != 0 and t.shape.num_elements() != 1:
                raise _fail(scalar, op, "a reduction that keeps axes", term)
            leaves = _packed_scalars(values, ex)
            if leaves is not None:
                # Keras' total ops.sum([loss, *model.losses]): a sum of terms (a mean of k of
                # them is 1/k times their sum), each an addend of the loss
                extra = [1.0 / len(leaves)] if ty == "Mean" else []
                for x, into in leaves:
                    stack.append((x, factors + extra, n_power, divisors, x, into))
                continue
            factors = list(factors)
            if ty == "Mean":
                factors.append(_Reciprocal(tf.size(values)))
            found = _term(scalar, values, op, factors, n_power, divisors, ex, term)
            if found is not None:
                terms.append(found)
            continue
        what = _NOT_SUMS.get(ty, f"an op gradmom cannot see through ({ty})")
        raise _fail(scalar, op, what, term)
    if not terms:
        raise _no_examples(
            PerExampleLossError(
                f"the scalar loss '{scalar.name}' does not depend on the examples: gradmom found "
                "no mean or sum over a batch in it. Pass the [n] vector of per-example losses. "
                "gradmom finds the examples in the arguments of the tf.function (and the "
                "elements of a tf.data iterator), and in random numbers drawn in the step whose "
                "shape starts with the batch size read from them (tf.random.normal("
                "[tf.shape(x)[0], d]): a GAN's latents; [batch_size, d] too when nothing else in "
                "the loss holds the examples); a batch captured from outside the function (a "
                "closure or a global) is not seen, so pass the batch as an argument of the step."
            )
        )
    form = _form(scalar, terms, ex, replicas)
    form.free = free
    return form


def _no_examples(e: PerExampleLossError) -> PerExampleLossError:
    """``e``, marked as the error of a loss that holds no example (`holds_no_example`)."""
    e.holds_no_example = True  # type: ignore[attr-defined]
    return e


def holds_no_example(e: Exception) -> bool:
    """Whether ``e`` (from `analyse`) says the loss holds no example at all: then random draws
    shaped by a constant equal to the batch size may be its examples
    (`tb_gradmom.core.axes.Examples` ``static_draws``)."""
    return bool(getattr(e, "holds_no_example", False))


def _packed_scalars(
    values: tf.Tensor, ex: _axes.Examples, limit: int = 1024
) -> list[tuple[tf.Tensor, tf.Operation]] | None:
    """The scalars whose sum is the sum of ``values``, each with the op it enters there, when
    ``values`` stacks scalars (``tf.stack``/``Pack``, nested, through reshapes) into a batch
    statistic; else None (a tensor that holds the examples is a term of its own)."""
    if ex.of(values) != _axes.REDUCED:
        return None
    leaves: list[tuple[tf.Tensor, tf.Operation]] = []
    stack = [values]
    while stack:
        t = stack.pop()
        op = t.op
        if op.type == "Pack" or (op.type in _VIEWS and op.inputs):
            inputs = list(op.inputs) if op.type == "Pack" else [op.inputs[0]]
            for x in reversed(inputs):
                if x.shape.rank == 0:
                    leaves.append((x, op))
                else:
                    stack.append(x)
            if len(leaves) > limit:
                return None
            continue
        return None  # a tensor of several entries that is not a stack of scalars
    return leaves or None


@dataclass(frozen=True)
class _Reciprocal:
    """``1 / t`` as a factor."""

    t: tf.Tensor


# A factor of a term: a scalar tensor, a sign, or a reciprocal.
Factor: TypeAlias = "tf.Tensor | float | _Reciprocal"
# An entry of `analyse`'s walk: (tensor, factors, divisions by counts that hold the batch size,
# static divisors, the addend of the loss it belongs to or None, the op it was reached from)
_Item: TypeAlias = (
    "tuple[tf.Tensor, list[Factor], int, list[int], tf.Tensor | None, tf.Operation | None]"
)


def _count_in(b: tf.Tensor, ex: _axes.Examples) -> tuple[int, list[int]]:
    """Whether divisor ``b`` holds the batch size symbolically (1) or not (0), and its value
    when it is a static positive integer (for the value-based check of `_form`)."""
    val = ex.sym_value(_strip_cast(b))
    if isinstance(val, _axes.Sym):
        return 1, []
    if isinstance(val, int):
        return 0, [val] if val > 0 else []
    static = tf.get_static_value(b)
    if static is not None:
        v = float(np.asarray(static))
        if v.is_integer() and v > 0:
            return 0, [int(v)]
    return 0, []


def _replicas(f: tf.Tensor, replicas: int) -> list[int]:
    """``[replicas]`` when factor ``f`` is ``1 / replicas`` (Keras scales each replica's loss
    so: a division of the global mean), else ``[]``."""
    if replicas <= 1:
        return []
    v = tf.get_static_value(f)
    if v is not None and abs(float(np.asarray(v)) * replicas - 1.0) < 1e-9:
        return [replicas]
    return []


def _strip_cast(t: tf.Tensor) -> tf.Tensor:
    while t.op.type in ("Cast", "Identity"):
        t = t.op.inputs[0]
    return t


def _term(
    scalar: tf.Tensor,
    values: tf.Tensor,
    op: tf.Operation,
    factors: list[Factor],
    count: int,
    divisors: list[int],
    ex: _axes.Examples,
    addend: tf.Tensor | None = None,
) -> Term | None:
    """The term ``factors * sum(values)``, after following linear reductions over the examples
    (``reduce_sum(x, axis=0)`` before the total) back to values that hold them. ``op``: the
    reduction to a scalar; ``count``: divisions so far by counts that hold the batch size."""
    mean = op.type == "Mean"
    for _ in range(16):
        st = ex.of(values)
        if isinstance(st, _axes.Axis):
            return Term(values, factors, st, _exponent(count + (1 if mean else 0)), divisors)
        if st == _axes.FREE:
            return None
        if isinstance(st, _axes.Padded):
            raise _padded_rows(scalar, values, st)
        if st == _axes.UNKNOWN:
            n_power = _exponent(count + (1 if mean else 0))
            return Term(values, factors, _axes.Axis(0), n_power, divisors, proven=False)
        inner = values.op
        if inner.type in _LINEAR_REDUCTIONS and isinstance(ex.of(inner.inputs[0]), _axes.Axis):
            # values = reduce(x) over some axes, the examples' among them: a sum over x (a
            # mean divides by the reduced count, which holds the batch size)
            mean = False
            if inner.type == "Mean":
                factors = factors + [_Reciprocal(_ratio(inner.inputs[0], values))]
                count += 1 if _holds_n(inner, ex) else 0
            values = inner.inputs[0]
            continue
        raise _fail(
            scalar,
            inner,
            f"values that mix the examples ('{values.name}' is {_axes.describe(st)}: a "
            "maximum, norm or statistic over the batch)",
            addend,
        )
    raise _fail(scalar, op, "reductions too deep to follow", addend)


def _padded_rows(scalar: tf.Tensor, values: tf.Tensor, st: _axes.Padded) -> PerExampleLossError:
    """The error for a loss over examples and rows that hold none (`tb_gradmom.core.axes.Padded`)."""
    rows = st.before + st.after
    return PerExampleLossError(
        f"the scalar loss '{scalar.name}' sums values ('{values.name}') over the examples and "
        f"{rows} more rows that ConcatV2 op '{st.op}' joins to them along their axis, while the "
        "batch size is unknown at trace time: those rows hold no example, and whether each is "
        "an example of its own (learned or generated samples) or no example (padding) cannot be "
        f"told, so the loss has no one per-example split. Take the examples' rows back before "
        "the loss (h[:tf.shape(x)[0]]) and add the other rows' terms, if any, as a separate "
        "term (held by every example, as a penalty is), or give the batch a static size (the "
        "rows are then examples of their own: a union of the batches)."
    )


def _ratio(big: tf.Tensor, small: tf.Tensor) -> tf.Tensor:
    return tf.cast(tf.size(big), tf.float64) / tf.cast(tf.size(small), tf.float64)


def _holds_n(op: tf.Operation, ex: _axes.Examples) -> bool:
    st = ex.of(op.inputs[0])
    rank = op.inputs[0].shape.rank
    axes = tf.get_static_value(op.inputs[1])
    if not isinstance(st, _axes.Axis) or axes is None or rank is None:
        return False
    return st.axis in {int(a) % rank for a in np.asarray(axes).reshape(-1)}


def _exponent(count: int) -> int:
    """The exponent of the batch size in the factors: minus the divisions by counts holding it."""
    return -count


def _form(scalar: tf.Tensor, terms: list[Term], ex: _axes.Examples, replicas: int) -> LossForm:
    batches = {t.axis.batch for t in terms if t.proven}
    if len(batches) > 1:
        raise PerExampleLossError(
            f"the scalar loss '{scalar.name}' adds losses over different batches of examples "
            "(the step's inputs, and rows concatenated in the step: "
            + ", ".join(
                f"'{op.name}'" for op in (ex.union_op(b) for b in sorted(batches)) if op is not None
            )
            + "): there is no one set of examples to split it into. Compute the moments of "
            "each term on its own, or pass the [n] vector of per-example losses as `loss`."
        )
    modes = set()
    structural = True
    for term in terms:
        if term.n_power < 0:
            modes.add("mean")
            continue
        n_static = ex.static_size(term.axis.batch)
        if term.divisors and n_static is not None:
            total = int(np.prod(term.divisors))
            big_n = n_static * replicas
            if total % big_n == 0:
                modes.add("mean")
                structural = False
                continue
        if term.divisors:
            structural = False
        modes.add("sum")
    if len(modes) > 1:
        raise PerExampleLossError(
            f"the scalar loss '{scalar.name}' adds a mean over the examples and a sum over "
            "them: there is no one per-example loss to split it into. Pass the [n] vector of "
            "per-example losses as `loss`."
        )
    unproven = [t for t in terms if not t.proven]
    note = ""
    if unproven:
        note = "; ".join(f"'{t.values.name}' (stopped at {ex.why(t.values)})" for t in unproven)
    return LossForm(terms, modes.pop(), structural, not unproven, note)


def _factor_value(f: Factor, dtype: tf.DType) -> tf.Tensor:
    if isinstance(f, _Reciprocal):
        return 1.0 / tf.cast(f.t, dtype)
    if isinstance(f, float | int):
        return tf.constant(f, dtype)
    return tf.cast(f, dtype)


def example_path(scalar: tf.Tensor, form: LossForm) -> set[tf.Operation]:
    """The ops the loss depends on other than through its example-free terms: where the
    per-example gradients of the rest are taken. A variable read only by a weight penalty has
    no use there; one read by a layer too has that use alone (its penalty's gradient, the same
    for every example, is added by `tb_gradmom.core.moments`)."""
    return _graph.ancestors(scalar, cut={(f.into, f.value.ref()) for f in form.free})


def per_example_losses(form: LossForm, n: int | tf.Tensor, mode: str | None = None) -> tf.Tensor:
    """The ``[n]`` vector ``l`` of the per-example part of the loss: ``mean(l)`` (``mode="mean"``)
    or ``sum(l)`` is the scalar loss without its example-free terms (`LossForm.free`)."""
    mode = mode or form.mode
    total: tf.Tensor | None = None
    for term in form.terms:
        v = examples_first(term.values, term.axis, n)
        rank = v.shape.rank
        s = tf.reduce_sum(v, axis=list(range(1, rank))) if rank and rank > 1 else v
        for f in term.factors:
            s = s * _factor_value(f, s.dtype)
        total = s if total is None else total + tf.cast(s, total.dtype)
    if total is None:
        raise ValueError("a LossForm made by `analyse` always has a term")
    if mode == "mean":
        total = total * tf.cast(n, total.dtype)
    return total
