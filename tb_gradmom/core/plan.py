"""Planning a moments computation: what is known at trace time, before any gradient is taken.

`make_plan` validates the arguments (`Options`), checks the loss (a mean or a sum of per-example
losses, or the ``[n]`` vector itself: `tb_gradmom.core.loss`), proves where the examples are in
the traced graph (`tb_gradmom.core.axes`), plans every variable (`tb_gradmom.core.sites`: its
uses, the rule for each, or the exact fallback), sends the variables used before an op that
couples the examples to the fallback (`tb_gradmom.core.couplings`) and gathers the evidence of
the batch size. The result, a `Plan`, prints as a table and is executed by
`tb_gradmom.core.moments`. Warnings are given once per traced graph (`WARNED`).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from tb_gradmom.core import axes as _axes
from tb_gradmom.core import couplings as _couplings
from tb_gradmom.core import fallback as _fallback
from tb_gradmom.core import graph as _graph
from tb_gradmom.core import loss as _loss
from tb_gradmom.core import validate as _validate
from tb_gradmom.core.errors import BatchSizeError, PerExampleLossError, UnsupportedOpError
from tb_gradmom.core.rules.loops import Loops
from tb_gradmom.core.sites import VariablePlan, plan_variable

__all__ = [
    "plan_moments",
    "Options",
    "Plan",
    "make_plan",
    "check_orders",
    "variable_name",
    "tf_variable",
    "replica_context",
    "WARNED",
    "listing",
    "route_coupled",
]

MAX_ORDER = 4


class _Warned:
    """The keys of the warnings given (a set of variables, a loss), per traced graph: a
    warning is given once per trace of a step (each trace is another model, or the same model
    with other shapes: it is told again), however many times the step calls gradmom.

    ``key in WARNED`` and ``WARNED.add(key)`` refer to the graph being built (the default
    graph: a ``tf.function``'s while it is traced). Graphs are held weakly."""

    def __init__(self) -> None:
        self._keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _current(self) -> set:
        graph = tf.compat.v1.get_default_graph()
        keys = self._keys.get(graph)
        if keys is None:
            keys = self._keys[graph] = set()
        return keys

    def __contains__(self, key) -> bool:
        return key in self._current()

    def add(self, key) -> None:
        self._current().add(key)

    def clear(self) -> None:
        self._keys.clear()


WARNED = _Warned()


def variable_name(variable: Any) -> str:
    """A readable, stable name: the Keras ``variable.path``, else the name without ``:0``."""
    path = getattr(variable, "path", None)
    if isinstance(path, str) and path:
        return path
    name = getattr(variable, "name", None) or "variable"
    return name[:-2] if name.endswith(":0") else name


def tf_variable(variable: Any, position: int) -> tf.Variable:
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


def in_xla_context() -> bool:
    """Whether the graph being built is (or is inside) an XLA-compiled function."""
    from tb_gradmom._compat import PrivateAPIError, tf_private

    try:  # private TensorFlow API; without it the check is skipped
        return tf_private.in_xla_context(tf.compat.v1.get_default_graph())
    except PrivateAPIError:  # pragma: no cover
        return False


def check_orders(orders) -> tuple[int, ...]:
    if _validate._is_int(orders):
        orders = (orders,)
    try:
        items = list(orders)
    except TypeError:
        raise ValueError(f"orders must be integers from 1 to 4, got {orders!r}") from None
    if any(not _validate._is_int(p) for p in items):
        raise ValueError(
            f"orders must be integers from 1 to {MAX_ORDER}, got {orders!r} (not rounded: "
            "pass e.g. orders=(1, 2))"
        )
    out = tuple(sorted({int(p) for p in items}))
    if not out or any(p < 1 or p > MAX_ORDER for p in out):
        raise ValueError(f"orders must be integers from 1 to {MAX_ORDER}, got {orders!r}")
    return out


def replica_context():
    """The replica context when several replicas run in sync (inside ``strategy.run``)."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return None
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync <= 1:
        return None
    return ctx


# Warnings name at most this many variables (or layers); the rest are counted.
LISTED = 8


def listing(items: Sequence[str], sep: str = ", ", limit: int = LISTED) -> str:
    """``items`` joined by ``sep``, or past ``limit`` the first ``limit`` of them and how many
    more: a warning about a ResNet's 106 normalisation variables stays a few lines long."""
    items = list(items)
    if len(items) <= limit:
        return sep.join(items)
    return sep.join(items[:limit]) + f" and {len(items) - limit} more"


def warn_coupled(kept) -> None:
    """``kept``: ``(VariablePlan, Coupling, why)`` of coupled variables left on their rules
    because the exact fallback cannot run for them (``why``)."""
    if not kept:
        return
    key = ("coupled",) + tuple(plan.name for plan, _, _ in kept)
    if key in WARNED:
        return
    WARNED.add(key)
    lines = listing([f"'{plan.name}' (by {c}; {why})" for plan, c, why in kept], sep="; ")
    warnings.warn(
        "tb_gradmom: the examples are coupled between the uses of "
        + lines
        + (
            " and the loss, and coupled='rules' keeps them on their rules."
            if all(why == "coupled='rules'" for _, _, why in kept)
            else " and the loss, and the exact fallback cannot run for them."
        )
        + " Their moments come "
        "from the rules, whose example j takes row j of n * dL/dz at the layer (the other "
        "examples' losses through the coupling included), not d l_j / d theta: M_1 is the "
        "gradient, the higher moments are those of that split.",
        stacklevel=4,
    )


def route_coupled(plans, couplings, fallback: str, graph, on_path, coupled: str = "exact") -> list:
    """Send every variable used before a coupler (`tb_gradmom.core.couplings`) to the exact
    fallback, which computes its ``d l_j / d theta`` through the batch's forward pass: rows of
    the jacobian of the per-example losses. With ``fallback="error"`` raise
    `UnsupportedOpError` naming the coupler instead. Returns ``(plan, coupling, why)`` for the
    variables left on their rules because the fallback cannot run for them, or all of them with
    ``coupled="rules"`` (`warn_coupled`)."""
    kept = []
    for plan in plans:
        if plan.fallback is not None or not plan.sites:
            continue
        coupling = couplings.of_sites(plan.sites)
        if coupling is None:
            continue
        plan.coupling = str(coupling)
        if coupled == "rules":
            kept.append((plan, coupling, "coupled='rules'"))
            continue
        if fallback == "error":
            raise UnsupportedOpError(
                f"variable '{plan.name}' is used before {coupling.detail()}, which couples the "
                "examples: example j's loss depends on other examples' rows there, so the "
                "rules, which take example j's gradient from its own rows, do not give "
                "d l_j / d theta. Pass fallback='exact' to compute it per example (rows of "
                "the jacobian of the per-example losses; slower, exact), or leave "
                f"'{plan.name}' out of var_list."
            )
        try:
            _fallback.refuse_broken([plan.variable], [plan.name], graph, on_path)
        except UnsupportedOpError as e:
            kept.append((plan, coupling, f"the fallback cannot run: {e.reason}"))
            continue
        plan.fallback = f"the examples are coupled after its use, by {coupling}"
        plan.sites = []
    return kept


def _site_batches(site) -> set:
    outs = site.output if isinstance(site.output, tuple) else (site.output,)
    states = [site.axes.of(o) for o in outs] if site.axes is not None else []
    return {st.batch for st in states if isinstance(st, _axes.Axis)}


def route_other_batches(plans, batch: int, ex, fallback: str) -> None:
    """Variables used on the rows of another batch than the loss's (a generator's, used
    before its images join the real ones in ``concat([real, fake])``, whose rows are the
    loss's examples: `tb_gradmom.core.axes.Examples.union`): each of their rows is a part of
    the loss's examples that the rules cannot place, so they take the exact fallback (rows of
    the jacobian of the per-example losses), or `UnsupportedOpError` with
    ``fallback="error"``."""
    for plan in plans:
        if plan.fallback is not None or not plan.sites:
            continue
        others = set().union(*(_site_batches(site) for site, _ in plan.sites)) - {batch}
        if not others:
            continue
        union = ex.union_op(batch) or ex.union_op(max(others))
        where = f"{union.type} op '{union.name}'" if union is not None else "a concatenation"
        why = (
            f"it is used on examples that {where} concatenates into the loss's batch of "
            "examples (each row an example): the rules cannot place its rows among them"
        )
        if fallback == "error":
            raise UnsupportedOpError(
                f"variable '{plan.name}': {why}. Pass fallback='exact' to compute it per "
                "example (rows of the jacobian of the per-example losses; exact), or leave "
                f"'{plan.name}' out of var_list.",
                reason=why,
            )
        plan.fallback = why
        plan.sites = []


def warn_unproven(what: str) -> None:
    key = ("unproven", what)
    if key in WARNED:
        return
    WARNED.add(key)
    warnings.warn(
        f"tb_gradmom: cannot prove where the examples are in {what}; they are taken to be "
        "on its first axis. Every variable whose use reaches them takes the exact fallback "
        "(rows of the jacobian of these per-example losses): exact if each entry of that "
        "axis is one example's loss.",
        stacklevel=4,
    )


def batch_evidence(batch_size, loss_values, plans, ex) -> tuple[tf.Tensor | None, list]:
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
    batch = loss_values[1].batch if loss_values is not None else 0
    n_static = ex.static_size(batch)
    if n_static is not None:
        what = (
            f"the static rows of '{ex.union_op(batch).name}', the examples' batch"
            if batch
            else "the static batch axis of the step's inputs"
        )
        evidence.insert(0, (tf.constant(n_static, tf.int32), what))
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


def refuse_fallback_in_xla(plans: Sequence[VariablePlan]) -> None:
    """`UnsupportedOpError` for variables on the exact fallback inside an XLA-compiled function:
    XLA computes its vectorised per-example gradients wrong, with no error (a raw
    ``fused_batch_norm``'s scale: M_2 off by 23 in float32; a Keras RNN whose cell uses
    ``sin(w)``: zeros)."""
    listed = listing([f"'{p.name}' ({p.fallback})" for p in plans], sep="; ")
    raise UnsupportedOpError(
        f"no exact rule for {listed}, and inside an XLA-compiled function (jit_compile=True) "
        "the exact fallback is not exact: XLA computes its vectorised per-example gradients "
        "wrong, with no error. Compile this step without jit_compile, or leave these "
        "variables out of var_list (summary.moments(log_only=...)).",
        reason="the exact fallback inside an XLA-compiled function",
    )


def check_loss_vector(loss: tf.Tensor, ex) -> _axes.Axis:
    """The examples' axis of a ``[n]`` loss given by the user: proven, or trusted with a warning
    when the analysis cannot see through an op; never values that mix the examples."""
    st = ex.of(loss)
    if isinstance(st, _axes.Axis) and st.axis == 0 and st.pure:  # (of any batch: `union`)
        return st
    if st in (_axes.FREE, _axes.REDUCED):
        raise PerExampleLossError(
            f"the loss vector '{loss.name}' does not hold one loss per example: it "
            f"{'depends on no example' if st == _axes.FREE else 'mixes the examples (a statistic over the batch)'}. "
            "Pass the [n] vector of per-example losses, before any reduction over the batch."
        )
    if st == _axes.UNKNOWN:
        _couplings.refuse_mixing(loss, ex, f"the loss vector '{loss.name}'")
        warn_unproven(f"the loss vector '{loss.name}' (stopped at {ex.why(loss)})")
        return _axes.Axis(0)
    raise PerExampleLossError(
        f"the loss vector '{loss.name}' holds the examples on its {st}, not as one entry per "
        "example. Pass the [n] vector of per-example losses."
    )


def reduction_of(form, reduction: str | None, loss) -> str:
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


@dataclass(frozen=True)
class Options:
    """The validated arguments of a moments computation (see `gradients_and_moments`).

    ``orders``: every order the moments may be asked for (the exact fallback takes its
    per-example gradients for these at trace time)."""

    orders: tuple[int, ...] = (1, 2)
    reduction: str | None = None
    batch_size: int | tf.Tensor | None = None
    chunk_size: int | None = None
    fallback: str = "exact"
    loss_scale: float | tf.Tensor | None = None
    coupled: str = "exact"

    @classmethod
    def check(
        cls,
        orders: Sequence[int] | int = (1, 2),
        reduction: str | None = None,
        batch_size: int | tf.Tensor | None = None,
        chunk_size: int | None = None,
        fallback: str = "exact",
        loss_scale: float | tf.Tensor | None = None,
        *,
        coupled: str = "exact",
    ) -> Options:
        """The options, each argument checked (``ValueError``/``TypeError`` naming it)."""
        if coupled not in ("exact", "rules"):
            raise ValueError(
                f"coupled must be 'exact' (variables used before a batch statistic take the "
                f"exact fallback) or 'rules' (they keep their rules, with a warning), got "
                f"{coupled!r}"
            )
        if reduction not in (None, "mean", "sum"):
            raise ValueError(
                f"reduction must be None (read from the graph), 'mean' or 'sum', got {reduction!r}"
            )
        if fallback not in ("exact", "error"):
            raise ValueError(f"fallback must be 'exact' or 'error', got {fallback!r}")
        return cls(
            orders=check_orders(orders),
            reduction=reduction,
            batch_size=_validate.int_tensor_or_int("batch_size", batch_size, positive=True),
            chunk_size=_validate.optional_positive_int("chunk_size", chunk_size),
            fallback=fallback,
            loss_scale=_validate.float_scalar("loss_scale", loss_scale),
            coupled=coupled,
        )


@dataclass
class Plan:
    """What `make_plan` found: the loss's form, every variable's plan, the batch evidence.

    ``print(plan)`` shows, per variable, the path its moments take (a rule and its ops, or the
    exact fallback and why), each site with its proven example axis, and the batch evidence.
    """

    options: Options
    # the scalar loss (the mean of the vector when a [n] vector was given)
    loss: tf.Tensor
    # the [n] vector of per-example losses when the caller gave it, else None
    loss_vector: tf.Tensor | None
    # the scalar loss's analysis (`tb_gradmom.core.loss.analyse`), None for a vector
    form: Any
    # "mean" or "sum": how the loss reduces its per-example losses
    mode: str
    variables: list[VariablePlan]
    # the batch size (a scalar int32 tensor, constant when the inputs' batch axis is static)
    n: tf.Tensor | None
    # (count, description) pairs that must equal `n` at run time
    checks: list
    # tf.distribute: the replica context when several replicas run in sync, else None
    replica: Any
    # the name scope of the call (with its trailing "/")
    scope: str
    # the indices of the variables that the loss's example-free terms (a weight penalty) read:
    # their gradient is added to every example's (`tb_gradmom.core.loss.FreeTerm`)
    free_ids: list[int] = field(default_factory=list)
    # made inside an XLA-compiled function: every chunk of examples has a static size
    # (`tb_gradmom.core.rules.base.static_chunks`)
    xla: bool = False
    # the while loops whose variables the loop rule covers, analysed once for this plan, with
    # the copies built from them (`tb_gradmom.core.rules.loops.Loops`): this plan's alone
    loops: Loops = field(default_factory=Loops)

    @property
    def names(self) -> list[str]:
        return [v.name for v in self.variables]

    @property
    def fallback_ids(self) -> list[int]:
        """The indices of the variables on the exact fallback."""
        return [i for i, v in enumerate(self.variables) if v.fallback is not None]

    def op_type(self, i: int) -> str:
        """The type of the first op using variable ``i``; ``"fallback"`` on the fallback, empty
        if unused."""
        plan = self.variables[i]
        if plan.fallback is not None:
            return "fallback"
        return plan.sites[0][0].op.type if plan.sites else ""

    def __str__(self) -> str:
        n = tf.get_static_value(self.n) if self.n is not None else None
        loss = (
            "the [n] vector of per-example losses"
            if self.loss_vector is not None
            else (f"a {self.mode} of per-example losses")
        )
        head = [
            f"moments plan: {len(self.variables)} variables, orders {self.options.orders}, "
            f"loss '{self.loss.name}' is {loss}",
            f"batch size: {'unknown until run time' if n is None else int(n)}"
            + (f" ({len(self.checks)} checked at run time)" if self.checks else ""),
        ]
        body = []
        for i, plan in enumerate(self.variables):
            body.append(f"{plan.name} {list(plan.variable.shape)}: {plan.path}")
            body.extend("    " + line for line in plan.describe())
            if i in self.free_ids:
                body.append(
                    "    + the gradient of the loss's example-free terms (a weight penalty), "
                    "the same for every example"
                )
        return "\n".join(head + body)


@tf.autograph.experimental.do_not_convert
def plan_moments(
    loss: tf.Tensor,
    var_list: Sequence[tf.Variable],
    orders: Sequence[int] = (1, 2),
    reduction: str | None = None,
    *,
    batch_size: int | tf.Tensor | None = None,
    fallback: str = "exact",
    coupled: str = "exact",
) -> Plan:
    """The plan `gradients_and_moments` follows for these arguments, computing nothing.

    Call it where you would call `gradients_and_moments` (inside a ``tf.function``, after the
    forward pass) and print it: per variable, the path its moments take (the rule's ops, or
    the exact fallback and why), each use with the example axis that was proven for it, and
    where the batch size is read. The ops it adds are unused and pruned from the step.

    Raises what `gradients_and_moments` raises at trace time (with ``fallback="error"``, the
    `UnsupportedOpError` of the first variable without a rule).
    """
    options = Options.check(orders, reduction, batch_size, None, fallback, None, coupled=coupled)
    return make_plan(loss, var_list, options, name="plan_moments")


@tf.autograph.experimental.do_not_convert
def make_plan(
    loss: tf.Tensor, var_list: Sequence[tf.Variable], options: Options, *, name: str = "gradmom"
) -> Plan:
    """Checks the loss and plans the moments of every variable of ``var_list`` (trace time).

    Raises what `gradients_and_moments` raises, except errors of the run itself.
    """
    if tf.executing_eagerly():
        raise RuntimeError(
            "gradmom needs a graph: call it inside a tf.function (for example in your "
            "train_step decorated with @tf.function) or in a tf.compat.v1 graph. Eager tensors "
            "carry no graph to read the layers' inputs from."
        )
    xla = in_xla_context()  # decided once: every rule of the plan follows it
    var_list = list(var_list)
    if not var_list:
        raise ValueError("var_list is empty: pass the variables to compute moments for")
    variables = [tf_variable(v, i) for i, v in enumerate(var_list)]
    names = [variable_name(v) for v in var_list]
    replica = replica_context()

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
            if ex.of(loss) == _axes.FREE and ex.n_static is not None:
                ex = _draws_as_examples(ex, loss)
            loss_values = (loss, check_loss_vector(loss, ex))
            form = None
        else:
            loss_vector, scalar = None, loss
            replicas = replica.num_replicas_in_sync if replica else 1
            try:
                form = _loss.analyse(loss, ex, replicas)
            except PerExampleLossError as e:
                if not _loss.holds_no_example(e) or ex.n_static is None:
                    raise
                ex = _draws_as_examples(ex, loss)
                try:
                    form = _loss.analyse(loss, ex, replicas)
                except PerExampleLossError:
                    raise e from None
            mode = reduction_of(form, options.reduction, loss)
            if not form.proven:
                for term in form.terms:
                    _couplings.refuse_mixing(
                        term.values, ex, f"the per-example losses '{term.values.name}'"
                    )
                warn_unproven(f"the per-example losses {form.note}")
            loss_values = (form.values, form.terms[0].axis)
        graph = scalar.graph
        free_ids: list[int] = []
        if form is not None and form.free:
            # the rules and the fallback see the per-example part of the loss; a weight
            # penalty's gradient is the same for every example and added to theirs
            on_path = _loss.example_path(scalar, form)
            free_ids = _reads(variables, graph, [f.value for f in form.free])
        else:
            on_path = _graph.ancestors(scalar)
        loops = Loops()  # the loop rule's analyses and copies, this plan's own
        with loops.planning():
            plans = [
                plan_variable(v, nm, graph, on_path, ex, options.fallback)
                for v, nm in zip(variables, names)
            ]
        route_other_batches(plans, loss_values[1].batch, ex, options.fallback)
        ends = [loss_vector] if form is None else [term.values for term in form.terms]
        kept = route_coupled(
            plans,
            _couplings.Couplings(ends, ex),
            options.fallback,
            graph,
            on_path,
            options.coupled,
        )
        warn_coupled(kept)
        fallback_ids = [i for i, plan in enumerate(plans) if plan.fallback is not None]
        if fallback_ids and xla:
            refuse_fallback_in_xla([plans[i] for i in fallback_ids])
        if fallback_ids:
            _fallback.refuse_broken(
                [plans[i].variable for i in fallback_ids],
                [plans[i].name for i in fallback_ids],
                graph,
                on_path,
            )
        n, checks = batch_evidence(options.batch_size, loss_values, plans, ex)
        needs_n = mode == "sum" or any(plan.sites or plan.fallback for plan in plans)
        if n is None and needs_n:
            raise BatchSizeError(
                "cannot infer the batch size: no requested variable is used by an op with a "
                "batch axis; pass batch_size= or the per-example loss vector"
            )
    return Plan(
        options=options,
        loss=scalar,
        loss_vector=loss_vector,
        form=form,
        mode=mode,
        variables=plans,
        n=n,
        checks=checks,
        replica=replica,
        scope=scope,
        free_ids=free_ids,
        xla=xla,
        loops=loops,
    )


def _draws_as_examples(ex, loss: tf.Tensor):
    """The analysis of ``loss``'s graph again, random draws shaped by a constant equal to the
    static batch size taken as rows of examples (``tf.random.normal([batch_size, d])``, or
    ``tf.shape(x)[0]`` folded into a constant by a static shape): for a loss that holds no
    example otherwise (a GAN generator's loss of latents drawn in the step)."""
    return _axes.Examples(loss.graph, static_draws=True)


def _reads(variables: Sequence[tf.Variable], graph, tensors: Sequence[tf.Tensor]) -> list[int]:
    """The indices of ``variables`` that ``tensors`` depend on."""
    ops: set[tf.Operation] = set()
    for t in tensors:
        ops |= _graph.ancestors(t)
    out = []
    for i, v in enumerate(variables):
        handle = _graph.internal_handle(graph, v)
        if handle is not None and any(c in ops for c in handle.consumers()):
            out.append(i)
    return out
