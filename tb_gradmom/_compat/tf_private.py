"""Every private TensorFlow API that tb_gradmom uses, in one place.

Each symbol is looked up when first used (importing this module imports only the public
``tensorflow``); a missing one raises `tb_gradmom._compat.PrivateAPIError`, which names the
symbol, the installed TensorFlow and the feature that is unavailable. ``tests/test_compat.py``
checks each one against the installed TensorFlow. The symbols (`SYMBOLS`):

``pfor`` - ``tensorflow.python.ops.parallel_for.control_flow_ops.pfor``
    The vectoriser behind ``tf.vectorized_map`` and ``GradientTape.jacobian``. Needed because
    the public ``tf.vectorized_map`` takes the iterations from a tensor's leading axis, while
    gradmom vectorises a backward pass over a *count* of examples (a static chunk, or a dynamic
    batch size) with no tensor to map over. Without it: the exact fallback (``fallback="exact"``
    for LSTM/GRU, custom ops) and the masked and derived-parameter rules are unavailable.
``in_xla_context`` - ``tensorflow.python.ops.control_flow_util.GraphOrParentsInXlaContext``
    Whether the graph being built is, or is inside, an XLA-compiled function. Needed under
    ``jit_compile=True``, where every chunk of examples must have a static size (XLA computed
    the dynamically sized chunks wrong) and the exact fallback is refused. Without it the check
    cannot be made (`tb_gradmom.core.plan` then plans as outside XLA).
``function_def_to_graph`` - ``tensorflow.python.framework.function_def_to_graph``
    Rebuilds a graph from the ``FunctionDef`` a call op runs. Needed to read the body of Keras'
    grouped convolutions (a nested XLA-compiled ``tf.function``). Without it the rule for those
    calls (`tb_gradmom.core.rules.call`) does not apply.
``eager_function_def`` - ``tensorflow.python.eager.context.context().get_function_def``
    The ``FunctionDef`` of a function registered with the eager context, for a call whose graph
    library does not hold it. Without it: as ``function_def_to_graph``.
``graph_function`` - ``tensorflow.python.framework.ops.Graph._get_function``
    The function a call op names, from a graph's function library. Without it: as
    ``function_def_to_graph``.
``component_specs`` - ``tensorflow.python.framework.type_spec.TypeSpec._component_specs``
    The specs of the tensors a composite argument is made of (a distribution's
    ``PerReplicaSpec``). Needed to prove that a ``tf.function`` argument of such a type carries
    dense tensors whose first axis holds the examples. Without it such arguments have no
    proven example axis (`tb_gradmom.core.axes`), and what depends on them takes the exact
    fallback.
``gradient_function`` - ``tensorflow.python.framework.ops.get_gradient_function``
    The registered gradient function of an op. Needed to apply one op's own gradient to one
    example's masked output gradient. Without it the masked vector-Jacobian rule
    (`tb_gradmom.core.rules.masked`) is unavailable.
``func_graph`` - ``tensorflow.python.framework.func_graph.FuncGraph``
    A function graph nested in the graph being built: tensors of the outer graph used in it
    are captured as placeholders, and nothing built in it joins the step. Needed to trace a
    custom gradient's backward pass on its own and prove that it keeps the examples apart
    (`tb_gradmom.core.couplings`). Without it, a custom gradient after a layer sends the
    layers before it to the exact fallback.
``update_input`` - ``tensorflow.python.framework.ops.Operation._update_input``
    Rewires an input of an op already in the graph. Needed to gate the loops and function calls
    that ``pfor`` creates, so that the exact fallback runs only on the steps that are recorded.
    Without it the exact fallback is unavailable.
``control_flow_context`` - ``tensorflow.python.framework.ops.Graph._get_control_flow_context``
    The TF1 control-flow context (a ``tf.compat.v1`` ``while_loop``/``cond`` body, an XLA
    context) ops are being added to, or None. Needed to share the rules' small constants across
    a graph only where no such context could be crossed. Without it every rule makes its own
    constants, as TensorFlow does (more ops to trace; the same numbers).
``summary_state`` - ``tensorflow.python.ops.summary_ops_v2._summary_state``
    ``tf.summary``'s thread-local state: the default writer (``writer.as_default()``) and the
    recording condition (``tf.summary.record_if``). TensorFlow has no public getter for the
    default writer, and ``tf.summary.should_record_summaries()`` adds "replica 0 only" under
    ``tf.distribute``, where every replica must compute the moments. Without it: the default
    tag groups of `tb_gradmom.writers.summary.moments` (pass ``name=`` instead) and its use under a
    ``tf.distribute`` strategy are unavailable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tb_gradmom._compat import PrivateAPIError, resolve

__all__ = [
    "SYMBOLS",
    "require",
    "unavailable",
    "pfor",
    "in_xla_context",
    "function_def_to_graph",
    "eager_function_def",
    "graph_function",
    "component_specs",
    "gradient_function",
    "probe_graph",
    "update_input",
    "control_flow_context",
    "default_summary_writer",
    "summary_recording_condition",
]

_FALLBACK = "the exact fallback (per-example gradients vectorised with pfor)"
_CALL_RULE = "the rule for function calls (Keras' grouped convolutions)"

# name -> (module, attribute, the feature that needs it)
SYMBOLS: dict[str, tuple[str, str, str]] = {
    "pfor": (
        "tensorflow.python.ops.parallel_for.control_flow_ops",
        "pfor",
        f"{_FALLBACK}, and the masked and derived-parameter rules",
    ),
    "in_xla_context": (
        "tensorflow.python.ops.control_flow_util",
        "GraphOrParentsInXlaContext",
        "static chunk sizes inside an XLA-compiled function",
    ),
    "function_def_to_graph": (
        "tensorflow.python.framework.function_def_to_graph",
        "function_def_to_graph",
        _CALL_RULE,
    ),
    "eager_function_def": ("tensorflow.python.eager.context", "context", _CALL_RULE),
    "graph_function": ("tensorflow.python.framework.ops", "Graph._get_function", _CALL_RULE),
    "component_specs": (
        "tensorflow.python.framework.type_spec",
        "TypeSpec._component_specs",
        "the example axis of composite tf.function arguments (a distribution's PerReplica)",
    ),
    "gradient_function": (
        "tensorflow.python.framework.ops",
        "get_gradient_function",
        "the masked vector-Jacobian rule",
    ),
    "func_graph": (
        "tensorflow.python.framework.func_graph",
        "FuncGraph",
        "the proof that a custom gradient's backward pass keeps the examples apart",
    ),
    "update_input": (
        "tensorflow.python.framework.ops",
        "Operation._update_input",
        f"{_FALLBACK} gated to the recorded steps",
    ),
    "control_flow_context": (
        "tensorflow.python.framework.ops",
        "Graph._get_control_flow_context",
        "constants shared by the rules across a graph (fewer ops to trace)",
    ),
    "summary_state": (
        "tensorflow.python.ops.summary_ops_v2",
        "_summary_state",
        "summary.moments' default tag groups per writer (pass name=) and its use under "
        "tf.distribute",
    ),
}


def _get(name: str) -> Any:
    module, attribute, feature = SYMBOLS[name]
    return resolve("tensorflow", module, attribute, feature)


def _error(name: str, detail: str, cause: BaseException) -> PrivateAPIError:
    module, attribute, feature = SYMBOLS[name]
    return PrivateAPIError(f"{module}.{attribute}{detail}", "tensorflow", feature, cause)


def require(*names: str) -> None:
    """Checks that the symbols ``names`` (keys of `SYMBOLS`) are there, before any work.

    Raises:
      PrivateAPIError: for the first one missing.
    """
    for name in names:
        _get(name)


def unavailable(name: str) -> str | None:
    """None if symbol ``name`` (a key of `SYMBOLS`) is there, else the `PrivateAPIError`
    message saying what is missing (for a rule that then does not apply)."""
    try:
        _get(name)
    except PrivateAPIError as e:
        return str(e)
    return None


def pfor(
    loop_fn: Callable[[tf.Tensor], Any],
    iters: int | tf.Tensor,
    *,
    fallback_to_while_loop: bool = True,
) -> Any:
    """``loop_fn(i)`` for ``i`` in ``range(iters)``, vectorised: its outputs stacked on a new
    leading axis (TensorFlow's ``pfor``). ``fallback_to_while_loop``: ops pfor cannot vectorise
    run in a ``tf.while_loop`` instead of failing."""
    return _get("pfor")(loop_fn, iters, fallback_to_while_loop=fallback_to_while_loop)


def in_xla_context(graph: tf.Graph) -> bool:
    """Whether ``graph`` is, or is nested in, an XLA-compiled function's graph."""
    return bool(_get("in_xla_context")(graph))


def function_def_to_graph(fdef: Any) -> tf.Graph:
    """The graph (a ``FuncGraph``, ``inputs``/``outputs`` in order) rebuilt from the
    ``FunctionDef`` proto ``fdef``."""
    return _get("function_def_to_graph")(fdef)


def eager_function_def(name: str) -> Any:
    """The ``FunctionDef`` registered under ``name`` with the eager context.

    Raises:
      Whatever TensorFlow raises for a name it does not know.
    """
    context = _get("eager_function_def")
    try:
        get = context().get_function_def
    except AttributeError as e:
        raise _error("eager_function_def", "().get_function_def", e) from e
    return get(name)


def graph_function(graph: tf.Graph, name: str) -> Any:
    """The function registered as ``name`` in ``graph``'s own function library (not its outer
    graphs'), or None. It has ``definition`` (the ``FunctionDef``) and, for a traced
    ``tf.function``, ``graph``."""
    _get("graph_function")  # the method exists on tf.Graph (FuncGraph inherits it)
    return graph._get_function(name)


def component_specs(spec: Any) -> Any:
    """The nested specs of the components of the composite ``spec``, or None for a spec that
    has none."""
    _get("component_specs")  # the property exists on tf.TypeSpec
    return getattr(spec, "_component_specs", None)


def gradient_function(op: tf.Operation) -> Callable | None:
    """The gradient function registered for ``op`` (``grad_fn(op, *output_grads)``), or None
    if the op has no inputs or no registered gradient."""
    get = _get("gradient_function")
    try:
        return get(op)
    except LookupError:
        return None


def probe_graph(name: str) -> tf.Graph:
    """A new function graph nested in the default graph (its ``outer_graph``): the outer
    graph's tensors used while it is the default are captured (``captures``: pairs of the
    outer tensor and its placeholder in ``inputs``), and nothing built in it runs with the
    outer graph."""
    return _get("func_graph")(name)


def update_input(op: tf.Operation, index: int, tensor: tf.Tensor) -> None:
    """Makes ``tensor`` input ``index`` of ``op``, in place (same graph)."""
    _get("update_input")  # the method exists on tf.Operation
    op._update_input(index, tensor)


def control_flow_context(graph: tf.Graph) -> Any:
    """The TF1 control-flow context ops are being added to in ``graph``, or None."""
    _get("control_flow_context")  # the method exists on tf.Graph (FuncGraph inherits it)
    return graph._get_control_flow_context()


def _summary_state() -> Any:
    return _get("summary_state")


def _state_attribute(name: str) -> Any:
    state = _summary_state()
    try:
        return getattr(state, name)
    except AttributeError as e:
        raise _error("summary_state", f".{name}", e) from e


def default_summary_writer() -> Any:
    """The summary writer that ``writer.as_default()`` made the default in this thread (also
    while tracing a ``tf.function``), or None."""
    return _state_attribute("writer")


def summary_writer_closed(writer: Any) -> bool:
    """Whether a ``tf.summary`` file writer was closed (``writer.close()``); False for a
    writer that does not say."""
    closed = getattr(writer, "_closed", False)
    if not isinstance(closed, bool):
        raise PrivateAPIError(
            f"{type(writer).__module__}.{type(writer).__name__}._closed",
            "tensorflow",
            "telling a closed summary writer from an open one (directory claims)",
        )
    return closed


def summary_recording_condition() -> bool | tf.Tensor | None:
    """``tf.summary``'s recording condition set by ``tf.summary.record_if`` (a bool or a
    boolean tensor; a callable condition is called), or None when none was set. Unlike
    ``tf.summary.should_record_summaries()`` it has no "replica 0 only" part and does not
    look at the default writer."""
    cond = _state_attribute("is_recording")
    return cond() if callable(cond) else cond
