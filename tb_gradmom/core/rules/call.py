"""Function calls that wrap one convolution: Keras 3's grouped convolutions on TensorFlow.

Keras' TensorFlow backend runs ``Conv1D/2D/3D(groups=G)`` (``G > 1``: the input has ``G`` times
the filter's in-channels) inside a nested ``tf.function(jit_compile=True)``, because TensorFlow
has no grouped convolution gradient on CPU. In the traced step the variable's consumer is then a
``StatefulPartitionedCall`` (attribute ``_XlaMustCompile``) whose inputs are the layer's input
and the kernel's resource handle, and whose function body is::

    ReadVariableOp(handle) -> [ExpandDims] -> Conv2D/Conv3D <- [ExpandDims] <- [SpaceToBatchND] <- x
    Conv2D/Conv3D -> [Squeeze] -> [BatchToSpaceND] -> Identity -> the call's output

(``ExpandDims``/``Squeeze`` for Conv1D, ``SpaceToBatchND``/``BatchToSpaceND`` for a dilated one).
This rule reads the body, accepts it only when it is provably that convolution (plus ``Const``,
``NoOp`` and views of the filter), and applies the conv rule (`conv.conv_contribution`) to the
call's own input and output, whose gradient the core has. A ``SpaceToBatchND`` (block ``b``,
paddings ``P``) -> VALID conv -> ``BatchToSpaceND`` (crops ``C``) is the dilated convolution
with dilation ``b``, stride 1 and ``P_before - C_before`` padding before each axis, which keeps
the fast per-offset path.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from tb_gradmom._compat import PrivateAPIError, tf_private
from tb_gradmom.core import axes as _axes
from tb_gradmom.core.rules.base import (
    Contribution,
    Rule,
    RuleError,
    Site,
    example_count,
    example_slice,
)
from tb_gradmom.core.rules.conv import ConvSpec, attr_str, conv_contribution

if TYPE_CHECKING:
    from tb_gradmom.core.axes import Examples

__all__ = [
    "CALL_RULE",
    "call_rule",
    "function_body",
    "call_batch_check",
    "past_call",
    "call_hazard",
]

_FILTER_VIEWS = frozenset({"Identity", "Cast", "ExpandDims", "Reshape", "Squeeze"})
_CONV_OPS = ("Conv2D", "Conv3D")  # what a call may wrap


def function_body(op: tf.Operation):
    """The body of the function that call op ``op`` (``PartitionedCall``,
    ``StatefulPartitionedCall``) runs: a graph whose ``inputs``/``outputs`` are the call's, in
    order. None if it cannot be found. It uses TensorFlow's private API
    (`tb_gradmom._compat.tf_private`): the graph's function library (``graph_function``,
    searched up the enclosing graphs) and ``function_def_to_graph``, which rebuilds a graph from
    the ``FunctionDef`` that runs.

    Raises:
      PrivateAPIError: this TensorFlow lacks one of them.
    """
    tf_private.require("graph_function", "function_def_to_graph")
    try:
        name = op.get_attr("f").name
    except (ValueError, AttributeError):
        return None
    fdef, graph = None, op.graph
    while graph is not None and fdef is None:
        fn = tf_private.graph_function(graph, name)
        if fn is not None:
            fdef = getattr(fn, "definition", None)
        graph = getattr(graph, "outer_graph", None)
    if fdef is None:
        try:
            fdef = tf_private.eager_function_def(name)
        except PrivateAPIError:
            raise
        except Exception:  # noqa: BLE001 - not registered with the eager context either
            return None
    try:
        return tf_private.function_def_to_graph(fdef)
    except Exception:  # noqa: BLE001 - a body TensorFlow cannot rebuild: no rule
        return None


def _skip_identity(t: tf.Tensor, chain: set) -> tf.Tensor:
    while t.op.type == "Identity":
        chain.add(t.op)
        t = t.op.inputs[0]
    return t


def _static(t: tf.Tensor, what: str):
    value = tf.get_static_value(t)
    if value is None:
        raise RuleError(f"the {what} inside the function is not static")
    return value


def _filter_shape(views: list, shape: tf.TensorShape) -> list[int]:
    """``shape`` (the variable's) through the filter's views, from the variable to the conv."""
    if not shape.is_fully_defined():
        raise RuleError("the filter shape is not static")
    dims = [int(d) for d in shape]
    for v in views:
        if v.type in ("Identity", "Cast"):
            continue
        if v.type == "ExpandDims":
            axis = int(_static(v.inputs[1], "ExpandDims axis of the filter"))
            dims.insert(axis if axis >= 0 else axis + len(dims) + 1, 1)
        elif v.type == "Squeeze":
            axes = [a if a >= 0 else a + len(dims) for a in v.get_attr("squeeze_dims")]
            if not axes:
                axes = [i for i, d in enumerate(dims) if d == 1]
            dims = [d for i, d in enumerate(dims) if i not in axes]
        else:  # Reshape
            target = [int(d) for d in _static(v.inputs[1], "Reshape shape of the filter")]
            if -1 in target:
                known = 1
                for d in target:
                    known *= d if d != -1 else 1
                target[target.index(-1)] = int(np.prod(dims)) // known
            dims = target
    return dims


def call_rule(site: Site) -> Contribution:
    """The rule for a ``PartitionedCall``/``StatefulPartitionedCall`` whose function is one
    channels-last ``Conv2D``/``Conv3D`` of the variable (Keras' grouped convolutions)."""
    op = site.op
    what = f"{op.type} op '{op.name}'"
    if len(op.outputs) != 1:
        raise RuleError("the function call has several outputs (only a wrapped convolution is)")
    try:
        body = function_body(op)
    except PrivateAPIError as e:
        raise RuleError(str(e)) from None
    if body is None:
        raise RuleError("the called function's body cannot be read")
    if len(body.inputs) != len(op.inputs) or len(body.outputs) != 1:
        raise RuleError("the called function's inputs or outputs do not match the call")
    placeholders = {t.op: i for i, t in enumerate(body.inputs)}
    chain: set = set()

    # The output side: Identity <- [BatchToSpaceND] <- [Squeeze] <- the convolution.
    t = _skip_identity(body.outputs[0], chain)
    bts = squeeze = None
    if t.op.type == "BatchToSpaceND":
        bts = t.op
        chain.add(bts)
        t = _skip_identity(bts.inputs[0], chain)
    if t.op.type == "Squeeze":
        squeeze = t.op
        chain.add(squeeze)
        t = _skip_identity(squeeze.inputs[0], chain)
    conv = t.op
    if conv.type not in _CONV_OPS:
        raise RuleError(
            f"the called function computes its output with {conv.type}, not a Conv2D/Conv3D"
        )
    chain.add(conv)
    inner = f"{conv.type} inside {what}"

    # The input side: the convolution <- [ExpandDims] <- [SpaceToBatchND] <- the call's input.
    x = _skip_identity(conv.inputs[0], chain)
    expand = stb = None
    if x.op.type == "ExpandDims":
        expand = x.op
        chain.add(expand)
        x = _skip_identity(expand.inputs[0], chain)
    if x.op.type == "SpaceToBatchND":
        stb = x.op
        chain.add(stb)
        x = _skip_identity(stb.inputs[0], chain)
    if x.op not in placeholders:
        raise RuleError(
            f"the input of the {inner} is computed by {x.op.type} inside the function (only "
            "ExpandDims/SpaceToBatchND of the call's input are understood)"
        )
    ix = placeholders[x.op]

    # The filter: views of a ReadVariableOp of a resource input, or of a tensor input.
    f = conv.inputs[1]
    views = []
    while f.op.type in _FILTER_VIEWS:
        views.append(f.op)
        f = f.op.inputs[0]
    read = None
    if f.op.type == "ReadVariableOp":
        read = f.op
        f = read.inputs[0]
    if f.op not in placeholders:
        raise RuleError(f"the filter of the {inner} is computed by {f.op.type} inside the function")
    if placeholders[f.op] != site.index:
        raise RuleError(f"the variable is not the filter of the {inner}")
    if placeholders[x.op] == site.index:
        raise RuleError(f"the variable is the input of the {inner}, not its filter")
    allowed = chain | set(views) | set(placeholders) | ({read} if read is not None else set())
    for o in body.get_operations():
        if o not in allowed and o.type not in ("Const", "NoOp"):
            raise RuleError(
                f"the called function holds {o.type} op '{o.name}' besides the {conv.type} "
                "(only the convolution, views of its filter, ExpandDims/Squeeze and "
                "SpaceToBatchND/BatchToSpaceND are understood)"
            )

    # Shapes and attributes.
    if (read is not None) != (site.view.dtype == tf.resource):
        raise RuleError("the variable reaches the function neither as a handle nor as a value")
    outer_filter = site.var_shape if read is not None else site.view.shape
    if outer_filter is None:
        raise RuleError("the filter shape is not static")
    kshape = _filter_shape(list(reversed(views)), tf.TensorShape(outer_filter))
    rank = len(kshape)
    nd = rank - 2
    if rank != (4 if conv.type == "Conv2D" else 5):
        raise RuleError(f"the filter of the {inner} has shape {kshape}")
    fmt = attr_str(conv, "data_format")
    if fmt not in ("NHWC", "NDHWC"):
        raise RuleError(
            f"grouped convolution with data_format {fmt} ({inner}) is not supported (only "
            "channels-last)"
        )
    x_outer = op.inputs[ix]
    out_outer = op.outputs[0]
    if x_outer.shape.rank is None or out_outer.shape.rank is None:
        raise RuleError(f"the rank of the input or output of {what} is not static")
    channels = x_outer.shape[-1]
    f_in, f_last = kshape[nd], kshape[nd + 1]
    if channels is None:
        raise RuleError(f"the input channels of {what} are not static")
    if channels % f_in or f_last % (channels // f_in):
        raise RuleError(f"input channels {channels} and filter {kshape} do not form groups")
    groups = channels // f_in

    axis = None  # the spatial axis ExpandDims inserts (Conv1D), in the convolution's layout
    if expand is not None:
        axis = int(_static(expand.inputs[1], "ExpandDims axis of the input"))
        axis = axis if axis >= 0 else axis + rank
        if squeeze is None:
            raise RuleError(f"the {inner} is not a Conv1D (ExpandDims and Squeeze do not match)")
        dims = [a if a >= 0 else a + rank for a in (squeeze.get_attr("squeeze_dims") or [])]
        if dims != [axis] or not 1 <= axis <= rank - 2:
            raise RuleError(f"the {inner} is not a Conv1D (ExpandDims and Squeeze do not match)")
        if x_outer.shape.rank != rank - 1 or out_outer.shape.rank != rank - 1:
            raise RuleError(f"the ranks of {what}'s input and output do not match the {inner}")
    elif squeeze is not None or x_outer.shape.rank != rank or out_outer.shape.rank != rank:
        raise RuleError(f"the ranks of {what}'s input and output do not match the {inner}")

    strides = list(conv.get_attr("strides"))
    dilations = list(conv.get_attr("dilations"))
    if strides[0] != 1 or strides[-1] != 1 or dilations[0] != 1 or dilations[-1] != 1:
        raise RuleError("strides or dilations over the batch or channel axis are not supported")
    strides, dilations = strides[1:-1], dilations[1:-1]
    padding = attr_str(conv, "padding")
    explicit: tuple[tuple[int, int], ...] = ()
    if padding == "EXPLICIT":
        flat = list(conv.get_attr("explicit_paddings"))
        explicit = tuple((flat[2 * i], flat[2 * i + 1]) for i in range(len(flat) // 2))[1 : 1 + nd]
    if (stb is None) != (bts is None):
        raise RuleError(f"a SpaceToBatchND without its BatchToSpaceND around the {inner}")
    if stb is not None and bts is not None:  # both or neither (checked above)
        # SpaceToBatchND(b, P) -> VALID conv -> BatchToSpaceND(b, C): output t meets the
        # padded input at t + C_before + b k, i.e. the input at t - (P_before - C_before) + b k.
        block = [int(b) for b in _static(stb.inputs[1], "SpaceToBatchND block shape")]
        pads = _static(stb.inputs[2], "SpaceToBatchND paddings").reshape(-1, 2)
        crops = _static(bts.inputs[2], "BatchToSpaceND crops").reshape(-1, 2)
        if [int(b) for b in _static(bts.inputs[1], "BatchToSpaceND block shape")] != block:
            raise RuleError(f"SpaceToBatchND and BatchToSpaceND blocks differ around the {inner}")
        if padding != "VALID" or any(s != 1 for s in strides) or any(d != 1 for d in dilations):
            raise RuleError(f"the {inner} between SpaceToBatchND and BatchToSpaceND is not VALID")
        before = [int(p) - int(c) for p, c in zip(pads[:, 0], crops[:, 0])]
        if any(b < 0 for b in before) or len(block) != (nd - 1 if axis is not None else nd):
            raise RuleError(f"the SpaceToBatchND around the {inner} is not a dilation")
        if axis is not None:  # the Conv1D's height axis: no dilation, no padding
            block.insert(axis - 1, 1)
            before.insert(axis - 1, 0)
        dilations, padding = block, "BEFORE"
        explicit = tuple((b, 0) for b in before)

    spec = ConvSpec(
        kernel_sizes=tuple(kshape[:nd]),
        filter_shape=tuple(int(d) for d in outer_filter),
        groups=groups,
        group_in=f_in,
        group_out=f_last // groups,
        strides=tuple(int(s) for s in strides),
        dilations=tuple(int(d) for d in dilations),
        padding=padding,
        explicit=explicit,
        what=inner,
    )

    def operands(delta, n, start, size):
        x = tf.cast(example_slice(x_outer, start, size), site.dtype)  # slice, then cast
        d = example_slice(delta, start, size)
        if axis is not None:
            x, d = tf.expand_dims(x, axis), tf.expand_dims(d, axis)
        return x, d

    positions = 1
    for s in out_outer.shape[1:-1]:
        positions *= s if s is not None else 1024
    contribution = conv_contribution(
        spec,
        operands,
        site.dtype,
        examples=example_count(x_outer, 0),
        evidence=f"the batch axis of the input of {what} (a {conv.type} in a function)",
        positions=positions,
    )
    # under XLA the call's own gradient does not compile (`past_call`): from the order-1 sums
    return replace(contribution, xla_gradient_from_sums=True)


_CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")


def call_batch_check(op: tf.Operation, index: int, ex: Examples) -> str | None:
    """A call wrapping a convolution: its data inputs and output hold the examples on axis 0
    (but the filter, input ``index``: a kernel computed from the variable holds none), or why
    not (`Rule.precheck`)."""
    for i, t in enumerate([*op.inputs, *op.outputs]):
        if t.dtype == tf.resource or i == index:
            continue
        st = ex.of(t)
        if not (isinstance(st, _axes.Axis) and st.axis == 0 and st.pure):
            why = f" (stopped at {ex.why(t)})" if st == _axes.UNKNOWN else ""
            return (
                f"'{t.name}' of {op.type} op '{op.name}' is not proven to hold the examples "
                f"on its batch axis alone: {_axes.describe(st)}{why}"
            )
    return None


def past_call(out: tf.Tensor) -> tf.Tensor:
    """``out`` itself, or for the output of a function call (Keras' grouped convolution) an
    identity of it that its consumers read instead (rewired in place, the same values): the
    call's `Rule.xla_target`.

    ``tf.gradients`` with respect to a call's output builds the call's ``SymbolicGradient``
    even though nothing uses it (TensorFlow's gradients_util differentiates every function call
    it reaches, its ``stop_ops`` notwithstanding). Outside XLA the unused op is pruned; XLA
    compiles the function whole and has no ``SymbolicGradient`` of a call that reads a
    variable, so the step would not compile. Past the identity, the call is not reached."""
    if out.op.type not in _CALL_OPS:
        return out
    consumers = [(c, i) for c in out.consumers() for i, x in enumerate(c.inputs) if x is out]
    with tf.control_dependencies(None):
        past = tf.identity(out, name="gradmom_past_call")
    for c, i in consumers:
        tf_private.update_input(c, i, past)
    return past


# Calls nested deeper than this are not looked into for a vectorisation hazard.
_MAX_HAZARD_DEPTH = 8


def call_hazard(op: tf.Operation, depth: int) -> str | None:
    """Why ``pfor`` must not vectorise through the function call ``op``: an op in its body
    with a hazard of its own (`tb_gradmom.core.rules.vectorisation_hazard`: a grouped
    convolution), or an XLA-compiled body that cannot be read; None otherwise."""
    from tb_gradmom.core.rules import vectorisation_hazard

    if depth >= _MAX_HAZARD_DEPTH:
        return None
    try:
        xla = op.get_attr("_XlaMustCompile")
    except (ValueError, TypeError):
        xla = False
    body = _axes.function_graph(op)
    if body is not None:
        for inner in body.get_operations():
            why = vectorisation_hazard(inner, depth + 1)
            if why is not None:
                return why
    elif xla:
        return "an XLA-compiled function that gradmom cannot look into"
    return None


CALL_RULE = Rule(
    "call",
    ops=_CALL_OPS,
    contribution=call_rule,
    precheck=call_batch_check,
    xla_target=past_call,
    vectorisation_hazard=call_hazard,
)
