"""The graph core: gradients and per-example gradient moments from one backward pass."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import tensorflow as tf

from tb_gradmom import _axes, _fallback, _graph, _loss, _validate
from tb_gradmom._errors import BatchSizeError, PerExampleLossError, UnsupportedOpError
from tb_gradmom.rules import REGISTRY, RuleError, supported_ops
from tb_gradmom.rules.base import Site, power_sum, sum_over_chunks
from tb_gradmom.rules.derived import (
    DERIVED_OPS,
    derived_contribution,
    local_factor,
    region_contribution,
)
from tb_gradmom.rules.masked import masked_vjp_rule
from tb_gradmom.rules.recurrent import LOOP_OPS, LoopGrads, loop_outputs

__all__ = [
    "gradients_and_moments",
    "variance",
    "variable_name",
    "prepare",
    "Prepared",
    "DEFAULT_CHUNK_ELEMENTS",
]

# Per rule, examples are processed in chunks so that the per-example tensors of one chunk hold
# at most this many elements (32 MiB in float32), unless `chunk_size` is given.
DEFAULT_CHUNK_ELEMENTS = 1 << 23

_MAX_ORDER = 4


def variable_name(variable) -> str:
    """A readable, stable name: the Keras ``variable.path``, else the name without ``:0``."""
    path = getattr(variable, "path", None)
    if isinstance(path, str) and path:
        return path
    name = getattr(variable, "name", None) or "variable"
    return name[:-2] if name.endswith(":0") else name


def _tf_variable(variable, position: int):
    """The `tf.Variable` behind a Keras 3 variable or a `tf.Variable`."""
    inner = getattr(variable, "value", None)
    if isinstance(variable, tf.Variable):
        v = variable
    elif isinstance(inner, tf.Variable):  # Keras 3 variable with the TensorFlow backend
        v = inner
    else:
        raise TypeError(
            f"var_list[{position}] is a {type(variable).__name__}, not a variable; pass "
            "tf.Variable or Keras variables (e.g. model.trainable_variables)"
        )
    if not hasattr(v, "handle"):
        raise TypeError(
            f"var_list[{position}] ('{variable_name(variable)}') is not a resource variable; "
            "TF1 reference variables are not supported (use tf.compat.v1.enable_resource_variables())"
        )
    return v


def _in_xla_context() -> bool:
    """Whether the graph being built is (or is inside) an XLA-compiled function."""
    from tb_gradmom._compat import PrivateAPIError, tf_private

    try:  # private TensorFlow API; without it the check is skipped
        return tf_private.in_xla_context(tf.compat.v1.get_default_graph())
    except PrivateAPIError:  # pragma: no cover
        return False


def _check_orders(orders) -> tuple[int, ...]:
    if _validate._is_int(orders):
        orders = (orders,)
    try:
        items = list(orders)
    except TypeError:
        raise ValueError(f"orders must be integers from 1 to 4, got {orders!r}") from None
    if any(not _validate._is_int(p) for p in items):
        raise ValueError(
            f"orders must be integers from 1 to {_MAX_ORDER}, got {orders!r} (not rounded: "
            "pass e.g. orders=(1, 2))"
        )
    out = tuple(sorted({int(p) for p in items}))
    if not out or any(p < 1 or p > _MAX_ORDER for p in out):
        raise ValueError(f"orders must be integers from 1 to {_MAX_ORDER}, got {orders!r}")
    return out


def _moment_dtype(dtype: tf.DType) -> tf.DType:
    return tf.float64 if dtype.base_dtype == tf.float64 else tf.float32


@dataclass
class _Plan:
    variable: tf.Variable
    name: str
    dtype: tf.DType
    sites: list  # [(Site, Contribution)]
    # a batch statistic (BatchNorm in training mode) lies between the variable and the batch
    coupled: bool = False
    # why the variable is on the exact fallback path (no rule for one of its consumers), or None
    fallback: str | None = None


def _unsupported_message(name: str, op: tf.Operation, why: str | None) -> str:
    if why:
        return (
            f"variable '{name}' is consumed by {op.type} (op '{op.name}') in a way the exact rule "
            f"does not cover: {why}. Supported ops: {', '.join(supported_ops())}."
        )
    return (
        f"variable '{name}' is consumed by {op.type} (op '{op.name}'), which has no moment rule. "
        f"Supported ops: {', '.join(supported_ops())}. Open an issue with the layer that "
        "produces this op."
    )


def _plan(variable, name: str, graph, on_path, ex, fallback: str) -> _Plan:
    dtype = _moment_dtype(variable.dtype)
    handle = _graph.internal_handle(graph, variable)
    sites = []
    coupled = False
    if handle is not None:
        for raw in _graph.find_sites(handle, on_path):
            try:
                found, c = _site_contributions(
                    raw, name, dtype, variable.shape, on_path, ex, depth=0
                )
            except UnsupportedOpError as e:
                if fallback == "error":
                    raise UnsupportedOpError(
                        f"{e} Or pass fallback='exact' to compute this variable's per-example "
                        "gradients by vectorised autodiff (slower, exact)."
                    ) from None
                return _Plan(variable, name, dtype, [], fallback=e.reason)
            sites.extend(found)
            coupled = coupled or c
    return _Plan(variable, name, dtype, sites, coupled=coupled)


# A chain of element-wise derived parameters longer than this is not followed (BatchNorm needs
# 3); other derived parameters are followed as one region (`_derived_region`).
_MAX_DERIVED_DEPTH = 12
# A derived region with more ops than this is refused (a model whose weights are computed by a
# large graph of their own; the fallback handles it).
_MAX_REGION_OPS = 4096

# Convolutions whose batch axis the conv rule takes as the examples (after SpaceToBatchND, the
# blocks of a dilated convolution).
_CONV_OPS = frozenset(
    {"Conv2D", "Conv3D", "DepthwiseConv2dNative", "Conv2DBackpropInput", "Conv3DBackpropInputV2"}
)


def _check_conv_batch(op, ex) -> str | None:
    """Why the conv rule must not fire at ``op`` (its batch axis not proven to be the
    examples, alone or as SpaceToBatchND's blocks x examples), or None."""
    data = op.inputs[2] if op.type in ("Conv2DBackpropInput", "Conv3DBackpropInputV2") else None
    if data is None:
        data = op.inputs[0]
    src = data
    while src.op.type in ("ExpandDims", "Identity"):
        src = src.op.inputs[0]
    if src.op.type == "SpaceToBatchND":
        src = src.op.inputs[0]
    st = ex.of(src)
    if st == _axes.Axis(0):
        return None
    why = f" (stopped at {ex.why(src)})" if st == _axes.UNKNOWN else ""
    return (
        f"the batch axis of '{src.name}', the input of {op.type} op '{op.name}', is not proven "
        f"to hold the examples alone: {_axes.describe(st)}{why}"
    )


_CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


def _check_call_batch(op, ex, index: int) -> str | None:
    """A call wrapping a convolution: its data inputs and output hold the examples on axis 0
    (but the filter, input ``index``: a kernel computed from the variable holds none)."""
    for i, t in enumerate([*op.inputs, *op.outputs]):
        if t.dtype == tf.resource or i == index:
            continue
        st = ex.of(t)
        if st != _axes.Axis(0):
            why = f" (stopped at {ex.why(t)})" if st == _axes.UNKNOWN else ""
            return (
                f"'{t.name}' of {op.type} op '{op.name}' is not proven to hold the examples "
                f"on its batch axis alone: {_axes.describe(st)}{why}"
            )
    return None


# Element-wise ops whose rule (`bias_rule`) broadcasts the parameter itself.
_BROADCASTING = frozenset({"AddV2", "Add", "Sub", "Mul", "BiasAdd"})


def _broadcast_through(raw, op, on_path):
    """The consumers of ``BroadcastTo(p, shape)`` (or a ``Tile`` of a size-1 axis) seen as
    consumers of ``p`` itself, when each one broadcasts its operands anyway (an add or a
    multiply): keras_hub's ``PositionEmbedding`` broadcasts its table to ``[n, T, d]`` before
    the add. None when some consumer is not such an op."""
    p = raw.view
    out = op.outputs[0]
    if p.shape.rank is None or out.shape.rank is None or p.shape.rank > out.shape.rank:
        return None
    if op.type == "Tile":
        mult = tf.get_static_value(op.inputs[1])
        if mult is None or any(int(m) != 1 and p.shape[i] != 1 for i, m in enumerate(mult)):
            return None
    consumers = _graph.consumers_past_views(out, on_path, raw.read)
    if not consumers or any(c.op.type not in _BROADCASTING for c in consumers):
        return None
    if any(c.view is not out for c in consumers):
        return None  # reshaped on the way: broadcasting would not line up
    return [_graph.RawSite(c.op, c.index, p, c.read) for c in consumers]


def _derived_outputs(op, ex, on_path):
    """The outputs of ``op`` (on the loss's path) if none of them holds examples: then the op
    computes a *derived parameter* from the variable, else None."""
    outs = [t for t in op.outputs if any(c in on_path for c in t.consumers())]
    if not outs:
        return None
    states = [ex.of(t) for t in outs]
    if all(st in (_axes.FREE, _axes.REDUCED) for st in states):
        return outs
    return None


def _derived_region(outs, on_path, ex, read):
    """The forward closure of ``outs`` through ops whose outputs hold no examples.

    Returns ``(frontier, stop, coupled)``: the consumers past the region (``RawSite``s whose op
    sees the examples, or an add/multiply that a region tensor is broadcast into), every input
    of the region's ops that the region does not compute (held fixed in its vector-Jacobian
    product), and whether a batch statistic enters the region."""
    region = {t.ref() for t in outs}
    ops: set = set()
    frontier = []
    seen = set()
    stack = list(outs)
    while stack:
        t = stack.pop()
        for site in _graph.consumers_past_views(t, on_path, read):
            key = (site.op.name, site.index)
            if key in seen:
                continue
            seen.add(key)
            region.add(site.view.ref())
            d = None if site.view.dtype == tf.resource else _derived_outputs(site.op, ex, on_path)
            if d is not None and site.op.type in ("BroadcastTo", "Tile") and site.index == 0:
                passed = _broadcast_through(site, site.op, on_path)
                if passed is not None:
                    frontier.extend(passed)
                    continue
            if d is None:
                frontier.append(site)
                continue
            if site.op in ops:
                continue
            ops.add(site.op)
            if len(ops) > _MAX_REGION_OPS:
                raise UnsupportedOpError(
                    f"the parameters derived from the variable are computed by more than "
                    f"{_MAX_REGION_OPS} ops",
                    reason=f"derived region larger than {_MAX_REGION_OPS} ops",
                )
            for o in d:
                region.add(o.ref())
                stack.append(o)
    stop, coupled = [], False
    for op in ops:
        for x in op.inputs:
            if x.ref() not in region and x.dtype != tf.resource:
                stop.append(x)
                coupled = coupled or ex.of(x) == _axes.REDUCED
    return frontier, stop, coupled


def _region_contributions(raw, outs, others, name, dtype, on_path, ex, depth, coupled):
    """Contributions to ``raw.view`` through ``raw.op`` (whose outputs ``outs`` hold no
    examples) and the whole derived region after it: each site where the region meets the
    examples is pulled back to the variable by one vector-Jacobian product."""
    op = raw.op
    try:
        frontier, stop, c = _derived_region(outs, on_path, ex, raw.read)
    except UnsupportedOpError as e:
        raise UnsupportedOpError(
            _unsupported_message(name, op, str(e)), reason=f"{op.type} op '{op.name}': {e.reason}"
        ) from None
    coupled = coupled or c
    found = []
    for f in frontier:
        inner, c = _site_contributions(f, name, dtype, f.view.shape, on_path, ex, depth + 1)
        coupled = coupled or c
        for site, contribution in inner:
            try:
                chained = region_contribution(
                    raw.view, outs, others, f.view, stop, dtype, contribution
                )
            except RuleError as e:
                raise _refused(name, op, e) from None
            found.append((site, chained))
    return found, coupled


def _site_contributions(raw, name, dtype, var_shape, on_path, ex, depth):
    """``([(Site, Contribution)], coupled)`` for one consumer of a variable (or of a parameter
    derived from it). ``coupled``: a batch statistic enters on the way (BatchNorm)."""
    op = raw.op
    derived_outs = None
    if raw.view.dtype != tf.resource:
        derived_outs = _derived_outputs(op, ex, on_path)
    if derived_outs is not None and op.type in ("BroadcastTo", "Tile") and raw.index == 0:
        passed = _broadcast_through(raw, op, on_path)
        if passed is not None:  # numpy broadcasting at the consumers does the same
            found, coupled = [], False
            for inner_raw in passed:
                inner, c = _site_contributions(
                    inner_raw, name, dtype, var_shape, on_path, ex, depth + 1
                )
                found.extend(inner)
                coupled = coupled or c
            return found, coupled
    if derived_outs is not None:
        if depth >= _MAX_DERIVED_DEPTH:
            raise UnsupportedOpError(
                _unsupported_message(name, op, "the chain of derived parameters is too long"),
                reason=f"{op.type} op '{op.name}': derived-parameter chain longer than "
                f"{_MAX_DERIVED_DEPTH}",
            )
        if any(x is raw.view for x in op.inputs[: raw.index]):
            return [], False  # the same tensor at an earlier input: that site covers both
        others = [x for i, x in enumerate(op.inputs) if x is not raw.view]
        coupled = any(ex.of(x) == _axes.REDUCED for x in others)
        elementwise = op.type in DERIVED_OPS and raw.view.dtype != tf.resource
        elementwise = elementwise and sum(1 for x in op.inputs if x is raw.view) == 1
        found = []
        if not elementwise:
            return _region_contributions(
                raw, derived_outs, others, name, dtype, on_path, ex, depth, coupled
            )
        for derived in derived_outs:
            factor = local_factor(op, raw.index, dtype)
            for inner_raw in _graph.consumers_past_views(derived, on_path, raw.read):
                inner, c = _site_contributions(
                    inner_raw, name, dtype, derived.shape, on_path, ex, depth + 1
                )
                coupled = coupled or c
                for site, contribution in inner:
                    try:
                        chained = derived_contribution(raw.view, derived, factor, contribution)
                    except RuleError as e:
                        raise _refused(name, op, e) from None
                    found.append((site, chained))
        return found, coupled
    rule = REGISTRY.get(op.type)
    if rule is None:
        try:  # a parameter (no examples in it) into any op: the masked VJP
            site = _make_site(raw, op, dtype, var_shape, ex)
            return [(site, masked_vjp_rule(site))], False
        except RuleError:
            pass
        raise UnsupportedOpError(
            _unsupported_message(name, op, None), reason=f"{op.type} op '{op.name}' has no rule"
        )
    if op.type in _CONV_OPS or op.type in _CALL_OPS:
        why = (
            _check_conv_batch(op, ex)
            if op.type in _CONV_OPS
            else _check_call_batch(op, ex, raw.index)
        )
        if why is not None:
            raise UnsupportedOpError(
                _unsupported_message(name, op, why), reason=f"{op.type} op '{op.name}': {why}"
            )
    site = _make_site(raw, op, dtype, var_shape, ex, on_path)
    try:
        return [(site, rule(site))], False
    except RuleError as e:
        try:  # the specific rule does not cover this use; a parameter operand still can be
            return [(site, masked_vjp_rule(site))], False
        except RuleError:
            pass
        raise _refused(name, op, e) from None


def _refused(name, op, e: RuleError) -> UnsupportedOpError:
    """The error for variable ``name`` whose use by ``op`` no rule covers (``e`` says why)."""
    return UnsupportedOpError(
        _unsupported_message(name, op, str(e)), reason=f"{op.type} op '{op.name}': {e}"
    )


def _make_site(raw, op, dtype, var_shape, ex, on_path=None) -> Site:
    # A loop's site has a tuple of outputs: those the loss depends on (`rules.recurrent`).
    loop = op.type in LOOP_OPS and on_path is not None
    return Site(
        op=op,
        index=raw.index,
        view=raw.view,
        output=loop_outputs(op, on_path) if loop else op.outputs[0],
        dtype=dtype,
        var_shape=var_shape,
        axes=ex,
    )


_WARNED: set = set()


def _replica_context():
    """The replica context when several replicas run in sync (inside ``strategy.run``)."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return None
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync <= 1:
        return None
    return ctx


def _warn_fallback(plans, ids) -> None:
    key = ("fallback",) + tuple(plans[i].name for i in ids)
    if key in _WARNED:
        return
    _WARNED.add(key)
    lines = "; ".join(f"'{plans[i].name}' ({plans[i].fallback})" for i in ids)
    warnings.warn(
        f"tb_gradmom: no exact rule for {lines}. Their moments come from the exact fallback: "
        "per-example gradients of the per-example losses, vectorised over the examples "
        "(slow path, about one backward pass of the batch per example, on the steps that "
        "compute moments). Pass fallback='error' to raise instead.",
        stacklevel=4,
    )


def _warn_coupled(plans) -> None:
    names = tuple(p.name for p in plans if p.coupled)
    if not names or names in _WARNED:
        return
    _WARNED.add(names)
    warnings.warn(
        "tb_gradmom: "
        + ", ".join(f"'{n}'" for n in names)
        + " scale or shift a batch normalised with its own statistics (BatchNormalization "
        "in training mode). Their moments are exact, but the examples are coupled through "
        "the batch mean and variance: the per-example gradients of the layers before the "
        "normalisation include that coupling (they are n * dL/dz_j, not dl_j/dz_j). See the "
        "README's table of supported layers.",
        stacklevel=4,
    )


def _batch_size(batch_size, loss_values, plans, ex) -> tuple[tf.Tensor | None, list]:
    """The batch size, and ``(tensor, message)`` pairs of evidence to check against it at run
    time (the asserts are built with the moments, so a step that logs nothing runs none).

    ``loss_values``: ``(tensor, Axis)`` of the per-example losses, or None. The batch size is a
    constant whenever the step's inputs have a static batch axis (``ex.n_static``)."""
    evidence = []  # (scalar int tensor, description)
    if loss_values is not None:
        values, ax = loss_values
        evidence.append(
            (
                tf.shape(values)[ax.axis] // ax.partners,
                f"the examples' {ax} of the per-example losses '{values.name}'",
            )
        )
    for plan in plans:
        for _, c in plan.sites:
            evidence.append((c.examples, c.evidence + f" (variable '{plan.name}')"))
    if ex.n_static is not None:
        evidence.insert(
            0, (tf.constant(ex.n_static, tf.int32), "the static batch axis of the step's inputs")
        )
    if batch_size is not None:
        evidence.insert(0, (tf.convert_to_tensor(batch_size, tf.int32), "batch_size="))
    if not evidence:
        return None, []
    n, n_desc = evidence[0]
    n = tf.cast(n, tf.int32)
    n_static = tf.get_static_value(n)
    checks = []
    for t, desc in evidence[1:]:
        t_static = t if isinstance(t, int) else tf.get_static_value(t)
        if n_static is not None and t_static is not None:
            if int(t_static) != int(n_static):
                raise BatchSizeError(
                    f"the graph disagrees about the batch size: {n_desc} says {int(n_static)}, "
                    f"{desc} says {int(t_static)}. Pass the per-example loss vector or "
                    "batch_size=, and make sure every requested variable's op sees the batch."
                )
            continue
        checks.append((t, f"{desc} and {n_desc}"))
    return n, checks


def _batch_asserts(checks, n) -> list:
    """One run-time assert that every batch evidence of ``checks`` (``(count, description)``)
    equals ``n`` (one op for the whole model, not one per site). Its message lists each
    evidence with its value."""
    if not checks:
        return []
    values = tf.stack([tf.cast(t, tf.int32) for t, _ in checks])
    descs = "; ".join(f"[{i}] {d}" for i, (_, d) in enumerate(checks))
    return [
        tf.debugging.Assert(
            tf.reduce_all(tf.equal(values, n)),
            [
                "tb_gradmom: batch size mismatch: these counts should all equal the batch size",
                n,
                "(the first evidence), got",
                values,
                "for:",
                descs,
            ],
            summarize=len(checks),
            name="batch_size_check",
        )
    ]


def _chunk(plan: _Plan, chunk_size: int | None, fast: bool = False) -> int:
    if chunk_size is not None:
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
        return int(chunk_size)
    if fast:  # the single site's power_sums path
        per_example = plan.sites[0][1].power_sums_elements or 1
        return max(1, DEFAULT_CHUNK_ELEMENTS // per_example)
    per_example = sum(c.per_example_elements for _, c in plan.sites)
    per_example = max(per_example, int(plan.variable.shape.num_elements() or 1))
    return max(1, DEFAULT_CHUNK_ELEMENTS // max(per_example, 1))


def _power_sums_chunked(plan, deltas, n, orders, chunk) -> dict:
    """sum_j g_j**p with per-example gradients summed over sites, chunk by chunk."""
    var_shape = plan.variable.shape

    def chunk_sums(start, size):
        g = None
        for (_site, c), delta in zip(plan.sites, deltas):
            part = tf.reshape(c.per_example(delta, n, start, size), [-1, *var_shape])
            g = part if g is None else g + part
        g_pow = {1: g}
        return {p: power_sum(g_pow, p) for p in orders}

    return sum_over_chunks(n, chunk, orders, var_shape, plan.dtype, chunk_sums)


@tf.autograph.experimental.do_not_convert
def gradients_and_moments(
    loss,
    var_list: Sequence,
    orders: Sequence[int] = (1, 2),
    reduction: str | None = None,
    *,
    batch_size: int | tf.Tensor | None = None,
    chunk_size: int | None = None,
    name: str | None = None,
    fallback: str = "exact",
    loss_scale=None,
):
    """Gradients and the moments of the per-example gradients, from one backward pass.

    The p-th moment of variable ``theta`` is ``M_p = (1/n) * sum_j g_j ** p``, element-wise, where
    ``g_j = d l_j / d theta`` is the *unscaled* gradient of example ``j``'s own loss ``l_j``
    (whatever the reduction) and ``n`` the number of examples. ``M_1`` is the mini-batch gradient
    of the mean loss; the (unbiased) variance is ``variance(moments_i, n)``.

    Call it inside a ``tf.function`` (or a ``tf.compat.v1`` graph), after the forward pass:

        @tf.function
        def train_step(x, y):
            logits = model(x, training=True)
            loss = loss_fn(y, logits)  # mean over the batch
            grads, moments = gradmom.gradients_and_moments(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return moments

    Args:
      loss: a scalar, a mean or a sum of the per-example losses of the batch (checked in the
        graph: `PerExampleLossError` otherwise); or a ``[n]`` vector of per-example losses
        (then ``grads`` are those of its mean, and ``reduction`` is ignored).
      var_list: ``tf.Variable``s or Keras variables (``model.trainable_variables``).
      orders: the moment orders to compute, integers from 1 to 4.
      reduction: None (default: read from the graph: a division by a count that holds the batch
        size is a mean, none is a sum), or ``"mean"``/``"sum"`` where a constant divisor is
        ambiguous; one that contradicts the graph's structure raises ``ValueError``.
      batch_size: the number of examples ``n``. Inferred from the graph by default (the
        per-example loss vector or the batch axis of the layers' inputs); when given it is
        checked against the graph like every other piece of evidence.
      chunk_size: examples per chunk where per-example gradients are materialised (convolutions,
        Dense on sequences, variables used by several ops). Default: chosen per layer so one
        chunk holds at most 8M elements.
      name: a name scope for the added ops.
      fallback: for a variable consumed by an op without an exact rule (a custom op,
        ``tf.sin(W)``, a ``tf.while_loop`` that `tb_gradmom.rules.recurrent` does not cover;
        Keras LSTM/GRU/SimpleRNN have a rule): ``"exact"`` (default) computes its
        per-example gradients from the per-example losses by vectorised autodiff (exact, about
        one backward pass per example; a warning names the variables once); ``"error"`` raises
        `UnsupportedOpError` instead. The fallback needs the per-example losses: a ``[n]``
        ``loss``, or a scalar that is a mean/sum over them (found in the graph).
      loss_scale: the factor ``loss`` was multiplied by, if any (mixed precision with
        ``keras.optimizers.LossScaleOptimizer``: pass ``optimizer.scale_loss(loss)`` and
        ``loss_scale=optimizer.dynamic_scale``). ``grads`` are then those of the scaled loss,
        for the optimizer to unscale; the moments are those of the unscaled gradients. Under
        mixed precision (float16/bfloat16 compute, float32 variables) moments are computed
        and returned in float32: output gradients are cast up, and unscaled, before any power.

    Returns:
      ``(grads, moments)``: ``grads[i]`` is what ``tf.gradients(loss, var_list)[i]`` gives (for a
      vector loss, of its mean; ``None`` for a variable the loss does not depend on). A
      convolution kernel's gradient is the order-1 sum of the same per-example work, so it equals
      TensorFlow's up to float rounding, and TensorFlow's own filter gradient is not computed.
      ``moments[i]`` is a dict from each order ``p`` to a tensor shaped like ``var_list[i]``,
      float32 (float64 for float64 variables).

    Raises:
      RuntimeError: when called eagerly.
      UnsupportedOpError: with ``fallback="error"``, a requested variable is consumed by an op
        without an exact rule.
      PerExampleLossError: ``loss`` is not a mean or a sum of per-example losses (a maximum, a
        norm, a product, values that mix the examples).
      BatchSizeError: the batch size cannot be inferred or the graph disagrees about it.
    """
    orders = _check_orders(orders)
    prepared = prepare(
        loss,
        var_list,
        reduction,
        batch_size=batch_size,
        name=name or "gradients_and_moments",
        fused_orders=orders,
        chunk_size=chunk_size,
        fallback=fallback,
        orders=orders,
        loss_scale=loss_scale,
    )
    moments = prepared.moments(orders, chunk_size)
    return list(prepared.grads), moments


@dataclass
class Prepared:
    """The shared backward pass of one call: gradients, layer output gradients, the batch size.

    `prepare` builds it outside any conditional; `moments` adds the moment ops and can be
    called inside a ``tf.cond`` branch so that a step that logs nothing never runs them.
    """

    plans: list
    names: list
    grads: list
    out_grads: list
    index: dict
    n: tf.Tensor | None
    checks: list
    mode: str
    scope: str
    loss: tf.Tensor
    # variable index -> {p: M_p} already computed by `prepare` (see `fused_orders`)
    fused: dict = field(default_factory=dict)
    # variable index -> {p: sum_j g_j**p} (p > 1) for the variables on the exact fallback
    fallback_sums: dict = field(default_factory=dict)
    # 1 / loss_scale (float32) when the loss is scaled (mixed precision), else None
    inv_scale: tf.Tensor | None = None
    # tf.distribute: the replica context when several replicas run in sync, else None
    replica: object = None
    # the loss was given as a [n] vector of per-example losses
    vector: bool = False
    # the number of examples the moments average over (the global batch under tf.distribute);
    # set by `moments`
    n_total: tf.Tensor | None = None

    def moments(
        self, orders: Sequence[int], chunk_size: int | None = None, indices=None, gate=None
    ) -> list[dict]:
        """``moments[i][p]`` for the variables at ``indices`` (default all), in order.

        Under ``tf.distribute`` (several replicas in sync) the moments are over the global
        batch, on every replica. `gate`: a scalar bool tensor (only used then): where it is
        False nothing runs, the all-reduce included, and zeros come out.
        """
        orders = _check_orders(orders)
        indices = range(len(self.plans)) if indices is None else indices
        if self.replica is not None:
            return self._distributed_moments(orders, chunk_size, list(indices), gate)
        self.n_total = self.n
        out = []
        with tf.name_scope(self.scope + "_moments"):
            asserts = _batch_asserts(self.checks, self.n)
        with tf.name_scope(self.scope + "_moments"), tf.control_dependencies(asserts):
            for i in indices:
                plan, grad = self.plans[i], self.grads[i]
                if all(p in self.fused.get(i, {}) for p in orders):
                    out.append({p: self.fused[i][p] for p in orders})
                    continue
                if i in self.fallback_sums:
                    out.append(self._fallback_moments(i, orders))
                    continue
                out.append(
                    _moments_of(
                        plan,
                        grad,
                        self.out_grads,
                        self.index,
                        self.n,
                        self.mode,
                        orders,
                        chunk_size,
                        inv_scale=self.inv_scale,
                    )
                )
        return out

    def _distributed_moments(self, orders, chunk_size, indices, gate) -> list[dict]:
        """Per replica, sums over its own examples; then ONE all-reduce (SUM) of every sum and
        of the replica's example count; then the moments over the global batch.

        The per-example gradient is ``N * dL_r/dtheta_j`` for a scalar mean loss whose replica
        share is ``L_r = sum_{j in r} l_j / N`` (``tf.nn.compute_average_loss``, Keras): so each
        replica sums ``(dL_r/dtheta_j) ** p`` and the result is scaled by ``N ** (p - 1)``
        after the reduction, with ``N`` from the same reduction.

        With `gate`, the replica's sums are computed in a ``tf.cond`` (zeros where it is
        False); the all-reduce, a synchronisation point that no ``cond`` branch may hold under
        MirroredStrategy, runs on every step.
        """
        layout = [(i, p) for i in indices for p in orders]

        def local():
            with tf.name_scope(self.scope + "_moments"):
                asserts = _batch_asserts(self.checks, self.n)
            with tf.name_scope(self.scope + "_moments"), tf.control_dependencies(asserts):
                flat = [self._local_sums(i, orders, chunk_size)[p] for i, p in layout]
                return flat + [tf.cast(self.n, tf.float64)]

        if gate is None:
            flat = local()
        else:

            def zeros():
                flat = [
                    tf.zeros(self.plans[i].variable.shape, self.plans[i].dtype) for i, _ in layout
                ]
                return flat + [tf.zeros([], tf.float64)]

            flat = tf.cond(gate, local, zeros, name="gradmom_local_sums")
        reduced = _all_reduce_sum(self.replica, list(flat))
        total = reduced[-1]
        self.n_total = tf.cast(total, tf.int32)
        scalar_mean = self.mode == "mean" and not self.vector
        result = {i: {} for i in indices}
        for (i, p), t in zip(layout, reduced[:-1]):
            nt = tf.maximum(tf.cast(total, t.dtype), 1.0)
            result[i][p] = t * nt ** (p - 1) if scalar_mean else t / nt
        return [result[i] for i in indices]

    def _local_sums(self, i, orders, chunk_size) -> dict:
        """``{p: sum over this replica's examples}``: of ``(dL_r/dtheta_j) ** p`` for a scalar
        loss, of ``g_j ** p`` for a vector (order 1: the replica's summed gradient)."""
        plan = self.plans[i]
        dtype = plan.dtype
        shape = plan.variable.shape
        grad = self.grads[i]
        if grad is None:
            return {p: tf.zeros(shape, dtype) for p in orders}
        k = tf.cast(self.n, dtype) if self.vector else 1.0  # L_r: the mean of the vector
        g = tf.cast(tf.convert_to_tensor(grad), dtype)
        if self.inv_scale is not None:
            g = g * tf.cast(self.inv_scale, dtype)
        sums = {1: g * k}
        higher = tuple(p for p in orders if p > 1)
        if not higher:
            return sums
        if i in self.fallback_sums:
            sums.update({p: self.fallback_sums[i][p] for p in higher})
        elif plan.sites:
            sums.update(
                _raw_sums(
                    plan, self.out_grads, self.index, self.n, higher, chunk_size, self.inv_scale, k
                )
            )
        else:
            sums.update({p: tf.zeros(shape, dtype) for p in higher})
        return sums

    def _fallback_moments(self, i: int, orders) -> dict:
        plan, sums = self.plans[i], self.fallback_sums[i]
        missing = [p for p in orders if p > 1 and p not in sums]
        if missing:
            raise ValueError(
                f"orders {missing} were not prepared for '{plan.name}' (exact fallback): pass "
                "them in prepare(orders=...)"
            )
        nf = tf.cast(self.n, plan.dtype)
        out = {}
        for p in orders:
            if p == 1:
                if self.grads[i] is None:
                    out[1] = tf.zeros(plan.variable.shape, plan.dtype)
                    continue
                g = tf.cast(tf.convert_to_tensor(self.grads[i]), plan.dtype)
                if self.inv_scale is not None:
                    g = g * tf.cast(self.inv_scale, plan.dtype)
                out[1] = g / nf if self.mode == "sum" else tf.identity(g)
            else:
                out[p] = sums[p] / nf
        return out

    def op_type(self, i: int) -> str:
        """The type of the first op consuming variable ``i`` (empty if none)."""
        sites = self.plans[i].sites
        if self.plans[i].fallback is not None:
            return "fallback"
        return sites[0][0].op.type if sites else ""


def _check_loss_vector(loss: tf.Tensor, ex) -> _axes.Axis:
    """The examples' axis of a ``[n]`` loss given by the user: proven, or trusted with a warning
    when the analysis cannot see through an op; never values that mix the examples."""
    st = ex.of(loss)
    if st == _axes.Axis(0):
        return st
    if st in (_axes.FREE, _axes.REDUCED):
        raise PerExampleLossError(
            f"the loss vector '{loss.name}' does not hold one loss per example: it "
            f"{'depends on no example' if st == _axes.FREE else 'mixes the examples (a statistic over the batch)'}. "
            "Pass the [n] vector of per-example losses, before any reduction over the batch."
        )
    if st == _axes.UNKNOWN:
        _warn_unproven(f"the loss vector '{loss.name}' (stopped at {ex.why(loss)})")
        return _axes.Axis(0)
    raise PerExampleLossError(
        f"the loss vector '{loss.name}' holds the examples on its {st}, not as one entry per "
        "example. Pass the [n] vector of per-example losses."
    )


def _reduction(form, reduction: str | None, loss) -> str:
    """The reduction found in the graph, checked against the one the caller named."""
    if reduction is None or reduction == form.mode:
        return form.mode
    if not form.structural:  # only a constant's value said: the caller knows better
        return reduction
    found = "a mean" if form.mode == "mean" else "a sum"
    raise ValueError(
        f"reduction={reduction!r} was passed, but the loss '{loss.name}' is {found} of "
        f"per-example losses (read from the graph). Pass reduction={form.mode!r}, or leave "
        "reduction out to use what the graph says."
    )


def _warn_disconnected(variables, names, grads, fused_ids) -> None:
    """Once per set: variables whose gradient is structurally zero (the loss does not depend on
    them) or that are not floating point; their moments are zeros."""
    lines = []
    for i, (v, nm, g) in enumerate(zip(variables, names, grads)):
        if not v.dtype.is_floating:
            lines.append(f"'{nm}' ({v.dtype.name}, not floating point)")
        elif g is None and i not in fused_ids:
            lines.append(f"'{nm}' (the loss does not depend on it)")
    key = ("disconnected", *lines)
    if not lines or key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(
        "tb_gradmom: " + "; ".join(lines) + " get zero moments and a None gradient. Leave them "
        "out of var_list (e.g. model.trainable_variables holds only what the loss uses).",
        stacklevel=4,
    )


def _warn_unproven(what: str) -> None:
    key = ("unproven", what)
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(
        f"tb_gradmom: cannot prove where the examples are in {what}; they are taken to be "
        "on its first axis. The moments are exact if each entry of that axis depends on one "
        "example only. Layers past that op use the exact fallback.",
        stacklevel=4,
    )


def prepare(
    loss,
    var_list: Sequence,
    reduction: str | None = None,
    *,
    batch_size=None,
    name: str = "gradmom",
    fused_orders: Sequence[int] | None = None,
    chunk_size: int | None = None,
    fallback: str = "exact",
    orders: Sequence[int] | None = None,
    gate: tf.Tensor | None = None,
    loss_scale=None,
) -> Prepared:
    """Validates the arguments, finds each variable's consumers and runs the one backward pass.

    See `gradients_and_moments` for the arguments. Raises the same errors.

    `fused_orders`: moments that will be computed on every step. Then a variable whose only
    site can give ``sum_j g_j`` with its per-example work (``gradient_from_sums``: convolutions)
    takes its gradient from there, and TF's own filter gradient is never built; its moments are
    computed here too. Leave it None when the moments are gated (``tf.cond``).

    `orders`: every order `Prepared.moments` may be asked for (default: ``fused_orders``, else
    1 and 2). The exact fallback's per-example gradients are taken here, in the step's graph (a
    gradient cannot be taken inside a ``tf.cond`` branch); `gate`, a scalar bool tensor, makes
    them run only on the steps where it is True (see `_fallback`).
    """
    if tf.executing_eagerly():
        raise RuntimeError(
            "gradmom needs a graph: call it inside a tf.function (for example in your "
            "train_step decorated with @tf.function) or in a tf.compat.v1 graph. Eager tensors "
            "carry no graph to read the layers' inputs from."
        )
    if _in_xla_context():
        raise RuntimeError(
            "gradmom cannot run inside an XLA-compiled function (tf.function(jit_compile=True) "
            "or a Keras model compiled with jit_compile=True): XLA miscomputes the dynamically "
            "sized slices of its chunk loops and the moments come out wrong, with no error. "
            "Compile the training step without jit_compile (the Keras callback does this "
            "itself)."
        )
    if reduction not in (None, "mean", "sum"):
        raise ValueError(
            f"reduction must be None (read from the graph), 'mean' or 'sum', got {reduction!r}"
        )
    if fallback not in ("exact", "error"):
        raise ValueError(f"fallback must be 'exact' or 'error', got {fallback!r}")
    batch_size = _validate.int_tensor_or_int("batch_size", batch_size, positive=True)
    chunk_size = _validate.optional_positive_int("chunk_size", chunk_size)
    loss_scale = _validate.float_scalar("loss_scale", loss_scale)
    orders = _check_orders(orders if orders is not None else (fused_orders or (1, 2)))
    var_list = list(var_list)
    if not var_list:
        raise ValueError("var_list is empty: pass the variables to compute moments for")
    variables = [_tf_variable(v, i) for i, v in enumerate(var_list)]
    names = [variable_name(v) for v in var_list]
    replica = _replica_context()

    with tf.name_scope(name) as scope:
        loss = tf.convert_to_tensor(loss)
        if loss.shape.rank not in (0, 1):
            raise ValueError(
                f"loss must be a scalar or a [n] vector of per-example losses, got shape "
                f"{loss.shape}; reduce the other axes per example first"
            )
        ex = _axes.Examples(loss.graph)
        if loss.shape.rank == 1:
            loss_vector, scalar, mode = loss, tf.reduce_mean(loss), "mean"
            loss_values = (loss, _check_loss_vector(loss, ex))
            form = None
        else:
            loss_vector, scalar = None, loss
            form = _loss.analyse(loss, ex, replica.num_replicas_in_sync if replica else 1)
            mode = _reduction(form, reduction, loss)
            if not form.proven:
                _warn_unproven(f"the per-example losses {form.note}")
            loss_values = (form.values, form.terms[0].axis)
        graph = scalar.graph
        on_path = _graph.ancestors(scalar)
        plans = [_plan(v, nm, graph, on_path, ex, fallback) for v, nm in zip(variables, names)]
        _warn_coupled(plans)
        fallback_ids = [i for i, plan in enumerate(plans) if plan.fallback is not None]
        if fallback_ids:
            _fallback.refuse_broken(
                [plans[i].variable for i in fallback_ids],
                [plans[i].name for i in fallback_ids],
                graph,
                on_path,
            )

        outputs, index = [], {}
        for plan in plans:
            for site, _ in plan.sites:
                for out in _site_outputs(site):
                    key = out.ref()
                    if key not in index:
                        index[key] = len(outputs)
                        outputs.append(out)
        fused_ids = set()
        if fused_orders and any(p > 1 for p in fused_orders) and replica is None:
            fused_ids = {
                i
                for i, plan in enumerate(plans)
                if len(plan.sites) == 1 and plan.sites[0][1].gradient_from_sums
            }
        asked = [v for i, v in enumerate(variables) if i not in fused_ids]
        all_grads = tf.gradients(scalar, asked + outputs)
        rest = iter(all_grads[: len(asked)])
        grads = [None if i in fused_ids else next(rest) for i in range(len(variables))]
        out_grads = all_grads[len(asked) :]
        _warn_disconnected(variables, names, grads, fused_ids)

        n, checks = _batch_size(batch_size, loss_values, plans, ex)
        needs_n = mode == "sum" or any(plan.sites or plan.fallback for plan in plans)
        if n is None and needs_n:
            raise BatchSizeError(
                "cannot infer the batch size: no requested variable is used by an op with a "
                "batch axis; pass batch_size= or the per-example loss vector"
            )
        inv_scale = None
        if loss_scale is not None:
            inv_scale = 1.0 / tf.cast(loss_scale, tf.float32)
        fused = {}
        if fused_ids:
            with tf.name_scope("fused"):
                for i in sorted(fused_ids):
                    plan = plans[i]
                    orders = tuple(sorted({1, *fused_orders}))
                    fused[i] = _moments_of(
                        plan,
                        None,
                        out_grads,
                        index,
                        n,
                        mode,
                        orders,
                        chunk_size,
                        sums_only=True,
                        inv_scale=inv_scale,
                    )
                    grad = fused[i][1] * tf.cast(n, plan.dtype) if mode == "sum" else fused[i][1]
                    if loss_scale is not None:  # as tf.gradients gives it: of the scaled loss
                        grad = grad * tf.cast(loss_scale, plan.dtype)
                    grads[i] = tf.cast(grad, plan.variable.dtype)
        fallback_sums = {}
        if fallback_ids:
            with tf.name_scope("fallback"):
                _warn_fallback(plans, fallback_ids)
                if form is None:
                    vector = loss_vector
                elif replica is not None:  # sums of (dL_r/dtheta_j)**p, see _distributed_moments
                    vector = _loss.per_example_losses(form, n, "sum")
                else:
                    vector = _loss.per_example_losses(form, n, mode)
                higher = tuple(p for p in orders if p > 1)
                if higher:
                    chunk = _fallback.DEFAULT_CHUNK if chunk_size is None else int(chunk_size)
                    sums = _fallback.power_sums(
                        vector,
                        [plans[i].variable for i in fallback_ids],
                        [plans[i].dtype for i in fallback_ids],
                        higher,
                        n,
                        chunk,
                        gate,
                        inv_scale,
                    )
                    fallback_sums = dict(zip(fallback_ids, sums))
                else:
                    fallback_sums = {i: {} for i in fallback_ids}
    return Prepared(
        replica=replica,
        vector=loss_vector is not None,
        inv_scale=inv_scale,
        fallback_sums=fallback_sums,
        fused=fused,
        plans=plans,
        names=names,
        grads=list(grads),
        out_grads=out_grads,
        index=index,
        n=n,
        checks=checks,
        mode=mode,
        scope=scope.rstrip("/"),
        loss=scalar,
    )


def _moments_of(
    plan,
    grad,
    out_grads,
    index,
    n,
    mode,
    orders,
    chunk_size,
    sums_only=False,
    inv_scale=None,
) -> dict:
    """{p: M_p}. `sums_only`: every order (1 included) from the rule's power sums, not `grad`."""
    shape = plan.variable.shape
    higher = tuple(orders) if sums_only else tuple(p for p in orders if p > 1)
    result = {}
    if (grad is None and not sums_only) or not plan.sites:
        return {p: tf.zeros(shape, plan.dtype) for p in orders}
    nf = tf.cast(n, plan.dtype)
    if inv_scale is not None:
        inv_scale = tf.cast(inv_scale, plan.dtype)
    if 1 in orders and not sums_only:
        g = tf.cast(tf.convert_to_tensor(grad), plan.dtype)
        if inv_scale is not None:
            g = g * inv_scale
        result[1] = g / nf if mode == "sum" else tf.identity(g)
    if not higher:
        return result
    # For a mean loss delta = n * G. Up to order 2, scale the (small) sums by n**p instead of
    # the (large) output gradients: one full-size multiply and its buffer less per layer. For
    # orders 3-4 in float32, (G)**p could underflow where (n G)**p does not: scale delta then.
    scale_sums = mode == "mean" and max(higher) <= 2
    factor = nf if mode == "mean" and not scale_sums else 1.0
    sums = _raw_sums(plan, out_grads, index, n, higher, chunk_size, inv_scale, factor)
    for p in higher:
        result[p] = sums[p] * nf ** (p - 1) if scale_sums else sums[p] / nf
    return result


def _all_reduce_sum(replica, tensors: list) -> list:
    """One batched all-reduce (SUM) per dtype among ``tensors`` (one in the usual case)."""
    groups: dict = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    out = [None] * len(tensors)
    for ids in groups.values():
        reduced = replica.all_reduce(tf.distribute.ReduceOp.SUM, [tensors[i] for i in ids])
        for i, t in zip(ids, reduced):
            out[i] = t
    return out


def _site_outputs(site) -> tuple:
    """The outputs whose gradients a site's rule needs (several for a loop)."""
    return site.output if isinstance(site.output, tuple) else (site.output,)


def _raw_sums(plan, out_grads, index, n, orders, chunk_size, inv_scale, factor) -> dict:
    """``{p: sum_j g_j ** p}`` with ``g_j`` from the output gradients times ``factor`` (and
    ``inv_scale``, the loss scale's inverse, folded into the same multiply)."""
    if inv_scale is not None:
        factor = tf.cast(inv_scale, plan.dtype) * factor
    deltas = []
    for site, _ in plan.sites:
        if isinstance(site.output, tuple):  # a loop: its rule seeds a copy with these
            grads = tuple(out_grads[index[t.ref()]] for t in site.output)
            deltas.append(LoopGrads(grads, factor))
            continue
        g_out = out_grads[index[site.output.ref()]]
        if g_out is None:
            g_out = tf.zeros_like(site.output)
        g_out = tf.cast(tf.convert_to_tensor(g_out), plan.dtype)
        if not (isinstance(factor, float) and factor == 1.0):
            g_out = g_out * factor
        deltas.append(g_out)
    if len(plan.sites) == 1 and plan.sites[0][1].power_sums is not None:
        chunk = _chunk(plan, chunk_size, fast=True)
        sums = plan.sites[0][1].power_sums(deltas[0], n, tuple(orders), chunk)
        return {p: tf.reshape(sums[p], plan.variable.shape) for p in orders}
    return _power_sums_chunked(plan, deltas, n, tuple(orders), _chunk(plan, chunk_size))


def variance(moments_i: dict, n, unbiased: bool = True):
    """Element-wise variance of the per-example gradients from their first two raw moments.

    Args:
      moments_i: one entry of the ``moments`` list, a dict with orders 1 and 2.
      n: the number of examples the moments average over.
      unbiased: ``True`` for ``s2 = n/(n-1) * (M_2 - M_1**2)`` (the sample variance of the
        per-example gradients); ``False`` for the biased ``M_2 - M_1**2``. The variance of the
        mini-batch gradient itself is ``s2 / n``.

    Returns:
      A tensor (or numpy array) shaped like the variable.
    """
    if 1 not in moments_i or 2 not in moments_i:
        raise ValueError("variance needs moments of orders 1 and 2; pass orders=(1, 2)")
    m1, m2 = moments_i[1], moments_i[2]
    biased = m2 - m1 * m1
    if not unbiased:
        return biased
    if isinstance(n, int | float):
        if n < 2:
            raise ValueError(f"the unbiased variance needs at least 2 examples, got n={n}")
        return biased * (n / (n - 1.0))
    nf = tf.cast(n, biased.dtype)
    return biased * nf / (nf - 1.0)
