"""Planning, per variable: where each use of a variable meets the examples, and the rule for it.

`plan_variable` walks from a variable's read to every op on the loss's path that uses it (past
views: identities, reshapes, casts), and for each use finds a rule (`tb_gradmom.core.rules`)
whose example axis is proven by `tb_gradmom.core.axes`. A use through ops whose outputs hold no
examples (a BatchNorm scale ``gamma * rsqrt(var)``, a position table looked up with constant
ids, a LoRA product ``A @ B``) is a *derived parameter*: it is followed to where it meets the
examples and chained back to the variable exactly (`tb_gradmom.core.rules.derived`). A use no
rule covers raises `UnsupportedOpError`, which sends the variable to the exact fallback (or to
the user, with ``fallback="error"``).
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from tb_gradmom.core import axes as _axes
from tb_gradmom.core import graph as _graph
from tb_gradmom.core.errors import UnsupportedOpError
from tb_gradmom.core.rules import REGISTRY, RuleError, supported_ops
from tb_gradmom.core.rules.base import Site
from tb_gradmom.core.rules.derived import (
    DERIVED_OPS,
    derived_contribution,
    local_factor,
    region_contribution,
)
from tb_gradmom.core.rules.masked import masked_vjp_rule

__all__ = ["VariablePlan", "plan_variable", "moment_dtype"]


def moment_dtype(dtype: tf.DType) -> tf.DType:
    return tf.float64 if dtype.base_dtype == tf.float64 else tf.float32


@dataclass
class VariablePlan:
    """How the moments of one variable are computed."""

    variable: tf.Variable
    name: str
    # the dtype of the moments: float64 for float64 variables, else float32
    dtype: tf.DType
    # [(Site, Contribution)]: each use of the variable that meets the examples, and its rule
    sites: list
    # why the variable is on the exact fallback path (no rule for one of its uses, or the
    # examples coupled after a use), or None
    fallback: str | None = None
    # the op that couples the examples between a use of the variable and the loss
    # (`tb_gradmom.core.couplings`), or None
    coupling: str | None = None

    @property
    def path(self) -> str:
        """``"fallback: <why>"``, ``"rule: <op types>"`` (with the coupler, for a coupled
        variable the fallback cannot take), or ``"unused"`` (no use on the loss's path)."""
        if self.fallback is not None:
            return f"fallback: {self.fallback}"
        if not self.sites:
            return "unused"
        rule = "rule: " + ", ".join(dict.fromkeys(site.op.type for site, _ in self.sites))
        if self.coupling is not None:  # the fallback cannot run for it (`plan.route_coupled`)
            rule += f" (the examples are coupled after its use, by {self.coupling})"
        return rule

    def describe(self) -> list[str]:
        """One line per site: the op, the variable's input index, the example axis the rule
        relies on, and where the batch size is read (its evidence)."""
        lines = []
        for site, c in self.sites:
            out = site.output[0] if isinstance(site.output, tuple) else site.output
            axis = _axes.describe(site.axes.of(out)) if site.axes is not None else "?"
            lines.append(
                f"{site.op.type} '{site.op.name}' input {site.index}: examples on {axis} of "
                f"'{out.name}'; evidence: {c.evidence}"
            )
        return lines


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


def plan_variable(variable, name: str, graph, on_path, ex, fallback: str) -> VariablePlan:
    """The plan of one variable: its uses on the loss's path (``on_path``), each with its rule.

    A use that no rule covers raises `UnsupportedOpError` with ``fallback="error"``, else gives
    a plan on the exact fallback (its ``fallback`` says why)."""
    dtype = moment_dtype(variable.dtype)
    handle = _graph.internal_handle(graph, variable)
    sites = []
    if handle is not None:
        for raw in _graph.find_sites(handle, on_path):
            try:
                found = _site_contributions(raw, name, dtype, variable.shape, on_path, ex, depth=0)
            except UnsupportedOpError as e:
                if fallback == "error":
                    raise UnsupportedOpError(
                        f"{e} Or pass fallback='exact' to compute this variable's per-example "
                        "gradients by vectorised autodiff (slower, exact)."
                    ) from None
                return VariablePlan(variable, name, dtype, [], fallback=e.reason)
            sites.extend(found)
    return VariablePlan(variable, name, dtype, sites)


# A chain of element-wise derived parameters longer than this is not followed (BatchNorm needs
# 3); other derived parameters are followed as one region (`_derived_region`).

_MAX_DERIVED_DEPTH = 12
# A derived region with more ops than this is refused (a model whose weights are computed by a
# large graph of their own; the fallback handles it).
_MAX_REGION_OPS = 4096


def _broadcasts(op_type: str) -> bool:
    """Whether ``op_type``'s rule covers a parameter that the op broadcasts itself
    (`Rule.broadcasts`: an add or a multiply)."""
    rule = REGISTRY.get(op_type)
    return rule is not None and rule.broadcasts


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
    if not consumers or any(not _broadcasts(c.op.type) for c in consumers):
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

    Returns ``(frontier, stop)``: the consumers past the region (``RawSite``s whose op sees the
    examples, or an add/multiply that a region tensor is broadcast into), and every input of
    the region's ops that the region does not compute (held fixed in its vector-Jacobian
    product: a batch statistic there is held fixed as in the variable's own gradient)."""
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
    stop = []
    for op in ops:
        for x in op.inputs:
            if x.ref() not in region and x.dtype != tf.resource:
                stop.append(x)
    return frontier, stop


def _region_contributions(raw, outs, others, name, dtype, on_path, ex, depth):
    """Contributions to ``raw.view`` through ``raw.op`` (whose outputs ``outs`` hold no
    examples) and the whole derived region after it: each site where the region meets the
    examples is pulled back to the variable by one vector-Jacobian product."""
    op = raw.op
    try:
        frontier, stop = _derived_region(outs, on_path, ex, raw.read)
    except UnsupportedOpError as e:
        raise UnsupportedOpError(
            _unsupported_message(name, op, str(e)), reason=f"{op.type} op '{op.name}': {e.reason}"
        ) from None
    found = []
    for f in frontier:
        inner = _site_contributions(f, name, dtype, f.view.shape, on_path, ex, depth + 1)
        for site, contribution in inner:
            try:
                chained = region_contribution(
                    raw.view, outs, others, f.view, stop, dtype, contribution
                )
            except RuleError as e:
                raise _refused(name, op, e) from None
            found.append((site, chained))
    return found


def _site_contributions(raw, name, dtype, var_shape, on_path, ex, depth):
    """``[(Site, Contribution)]`` for one consumer of a variable (or of a parameter derived
    from it)."""
    op = raw.op
    derived_outs = None
    if raw.view.dtype != tf.resource:
        derived_outs = _derived_outputs(op, ex, on_path)
    if derived_outs is not None and op.type in ("BroadcastTo", "Tile") and raw.index == 0:
        passed = _broadcast_through(raw, op, on_path)
        if passed is not None:  # numpy broadcasting at the consumers does the same
            found = []
            for inner_raw in passed:
                found.extend(
                    _site_contributions(inner_raw, name, dtype, var_shape, on_path, ex, depth + 1)
                )
            return found
    if derived_outs is not None:
        if depth >= _MAX_DERIVED_DEPTH:
            raise UnsupportedOpError(
                _unsupported_message(name, op, "the chain of derived parameters is too long"),
                reason=f"{op.type} op '{op.name}': derived-parameter chain longer than "
                f"{_MAX_DERIVED_DEPTH}",
            )
        if any(x is raw.view for x in op.inputs[: raw.index]):
            return []  # the same tensor at an earlier input: that site covers both
        others = [x for i, x in enumerate(op.inputs) if x is not raw.view]
        elementwise = op.type in DERIVED_OPS and raw.view.dtype != tf.resource
        elementwise = elementwise and sum(1 for x in op.inputs if x is raw.view) == 1
        found = []
        if not elementwise:
            return _region_contributions(raw, derived_outs, others, name, dtype, on_path, ex, depth)
        for derived in derived_outs:
            factor = local_factor(op, raw.index, dtype)
            for inner_raw in _graph.consumers_past_views(derived, on_path, raw.read):
                inner = _site_contributions(
                    inner_raw, name, dtype, derived.shape, on_path, ex, depth + 1
                )
                for site, contribution in inner:
                    try:
                        chained = derived_contribution(raw.view, derived, factor, contribution)
                    except RuleError as e:
                        raise _refused(name, op, e) from None
                    found.append((site, chained))
        return found
    rule = REGISTRY.get(op.type)
    if rule is None:
        try:  # a parameter (no examples in it) into any op: the masked VJP
            site = _make_site(raw, op, dtype, var_shape, ex)
            return [(site, masked_vjp_rule(site))]
        except RuleError:
            pass
        raise UnsupportedOpError(
            _unsupported_message(name, op, None), reason=f"{op.type} op '{op.name}' has no rule"
        )
    if rule.precheck is not None:
        why = rule.precheck(op, raw.index, ex)
        if why is not None:
            raise UnsupportedOpError(
                _unsupported_message(name, op, why), reason=f"{op.type} op '{op.name}': {why}"
            )
    site = _make_site(raw, op, dtype, var_shape, ex, on_path)
    try:
        return [(site, rule(site))]
    except RuleError as e:
        try:  # the specific rule does not cover this use; a parameter operand still can be
            return [(site, masked_vjp_rule(site))]
        except RuleError:
            pass
        raise _refused(name, op, e) from None


def _refused(name, op, e: RuleError) -> UnsupportedOpError:
    """The error for variable ``name`` whose use by ``op`` no rule covers (``e`` says why)."""
    return UnsupportedOpError(
        _unsupported_message(name, op, str(e)), reason=f"{op.type} op '{op.name}': {e}"
    )


def _make_site(raw, op, dtype, var_shape, ex, on_path=None) -> Site:
    # A site whose rule needs several outputs (a loop's: those the loss depends on) has a
    # tuple of them (`Rule.outputs`).
    rule = REGISTRY.get(op.type)
    output = op.outputs[0]
    if rule is not None and rule.outputs is not None and on_path is not None:
        output = rule.outputs(op, on_path)
    return Site(
        op=op,
        index=raw.index,
        view=raw.view,
        output=output,
        dtype=dtype,
        var_shape=var_shape,
        axes=ex,
        rule=rule,
    )
