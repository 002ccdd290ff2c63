"""Control flow: function calls, ``while`` loops and the ``TensorList``s they carry.

A call's body is analysed with the call's input states. A loop's body is analysed to a fixed
point: each loop variable's state is joined (`tb_gradmom.core.axes.lattice.join`) with its
state after one more pass over the body, until nothing changes. Every pass that does not stop
raises at least one variable's state up the lattice, whose longest chain has
`~tb_gradmom.core.axes.lattice.HEIGHT` (3) steps, so a loop of ``k`` variables settles within
``3 * k + 1`` passes; the analysis stops earlier, after `MAX_LOOP_PASSES` passes: the loop's
outputs are then `UNKNOWN` (the variables that meet the examples in or after it take the exact
fallback, with the loop named as the reason). Keras' recurrent layers settle in 2 or 3 passes.
Bodies nested deeper than `MAX_NESTING` (a loop in a call in a loop ...) are not looked into.
"""

from __future__ import annotations

import tensorflow as tf

from tb_gradmom._compat import tf_private
from tb_gradmom.core.axes.lattice import FREE, REDUCED, UNKNOWN, Axis, Elements, join

__all__ = ["MAX_LOOP_PASSES", "MAX_NESTING", "function_graph", "loop_body", "call_body"]

# Passes over a loop's body before its fixed point is given up (see the module docstring).
MAX_LOOP_PASSES = 8
# Nested bodies looked into (a loop inside a call inside a loop ...).
MAX_NESTING = 8


def function_graph(op: tf.Operation, attr: str = "f"):
    """The `FuncGraph` a call op (or a loop's ``body``) runs, or None."""
    try:
        name = op.get_attr(attr).name
        fn = tf_private.graph_function(op.graph, name)
        return getattr(fn, "graph", None) if fn is not None else None
    except Exception:  # noqa: BLE001 - any layout change: no body to look into
        return None


def _body_refused(ex, op, body) -> str | None:
    """Why the body of call or loop ``op`` is not looked into, or None."""
    if body is None:
        return f"{op.type} op '{op.name}': its body cannot be read"
    if ex.depth >= MAX_NESTING:
        return f"{op.type} op '{op.name}': nested more than {MAX_NESTING} bodies deep"
    if len(body.inputs) != len(op.inputs):
        return f"{op.type} op '{op.name}': its body's inputs do not match the op's"
    return None


def fixed_point(ex, op, states):
    """``(body, sub, states)``: the body graph of while op ``op``, its analysis (an `Examples`
    of the body) and the loop variables' states at their fixed point; or a string saying why
    there is none."""
    body = function_graph(op, "body")
    why = _body_refused(ex, op, body)
    if why is not None:
        return why
    cur = list(states)
    for _ in range(MAX_LOOP_PASSES):
        sub = ex.nested(body, cur)
        outs = [sub.of(t) for t in body.outputs]
        if len(outs) != len(cur):
            return f"{op.type} op '{op.name}': its body's outputs do not match its inputs"
        new = [join(a, b) for a, b in zip(cur, outs)]
        if new == cur:
            return body, sub, cur
        cur = new
    return (
        f"{op.type} op '{op.name}': its loop variables' examples' axes did not settle in "
        f"{MAX_LOOP_PASSES} passes over the body (tb_gradmom.core.axes.control.MAX_LOOP_PASSES)"
    )


def loop_body(ex, op: tf.Operation):
    """``(body, sub)`` for while op ``op`` of the graph ``ex`` analyses: its body graph and an
    `Examples` of the body whose inputs (the loop variables) hold their states at the fixed
    point (each the join of its state on entry and after any number of iterations), so that
    what ``sub`` proves inside the body holds at every iteration. None when the loop's states
    do not settle or its body cannot be read."""
    found = fixed_point(ex, op, [ex.of(t) for t in op.inputs])
    return None if isinstance(found, str) else found[:2]


def _call_analysis(ex, op, states):
    fg = function_graph(op)
    why = _body_refused(ex, op, fg)
    if why is not None:
        return why
    return fg, ex.nested(fg, states)


def call_body(ex, op: tf.Operation):
    """``(body, sub)`` for call op ``op`` (``PartitionedCall``) of the graph ``ex`` analyses: the
    function's graph and an `Examples` of it whose inputs hold the call's input states. None
    when the body cannot be read."""
    found = _call_analysis(ex, op, [ex.of(t) for t in op.inputs])
    return None if isinstance(found, str) else found


# --- handlers -------------------------------------------------------------------------------


def h_while(ex, op, states):
    """A ``while`` loop (Keras RNNs): the body is analysed until its loop variables' states stop
    changing (a variable that starts free, such as a zero state, takes the examples' axis)."""
    found = fixed_point(ex, op, states)
    if isinstance(found, str):
        return ex.refuse(op, found)
    body, sub, cur = found
    out = cur[: len(op.outputs)]
    for i, st in enumerate(out):  # name the op inside the body that stopped the proof
        if st == UNKNOWN and i < len(body.outputs):
            ex.explain(op.outputs[i], f"{sub.why(body.outputs[i])}, inside {op.type} '{op.name}'")
    return out


def h_call(ex, op, states):
    """A function call (Keras' XLA-compiled grouped convolution, nested ``tf.function``s): the
    body is analysed with the call's input states."""
    found = _call_analysis(ex, op, states)
    if isinstance(found, str):
        return ex.refuse(op, found)
    fg, sub = found
    out = [sub.of(t) for t in fg.outputs]
    if len(out) != len(op.outputs):
        return ex.refuse(op, f"{op.type} op '{op.name}': its body's outputs do not match")
    for t, inner, st in zip(op.outputs, fg.outputs, out):
        if st == UNKNOWN:
            ex.explain(t, f"{sub.why(inner)}, inside {op.type} '{op.name}'")
    return out


def h_list_from_tensor(ex, op, states):
    st = states[0]
    if not isinstance(st, Axis) or st.axis == 0:
        return UNKNOWN
    return Elements(st.moved(st.axis - 1))


def _elements(st):
    if st == FREE:
        return FREE
    return st.of if isinstance(st, Elements) else UNKNOWN


def h_list_get(ex, op, states):
    if any(isinstance(s, Axis) for s in states[1:]):
        return UNKNOWN
    return _elements(states[0])


def h_list_set(ex, op, states):
    if isinstance(states[1], Axis) or isinstance(states[2], Elements):
        return UNKNOWN  # an index chosen per example; a list of lists (not followed)
    inner = join(_elements(states[0]), states[2])
    return UNKNOWN if inner in (UNKNOWN, REDUCED) else Elements(inner)


def h_list_push(ex, op, states):
    """``TensorListPushBack``: the accumulators that ``while_v2``'s gradient adds to a loop it
    differentiates (a list per value the backward loop needs, pushed at every step)."""
    if isinstance(states[1], Elements):
        return UNKNOWN  # a list of lists (not followed)
    inner = join(_elements(states[0]), states[1])
    return UNKNOWN if inner in (UNKNOWN, REDUCED) else Elements(inner)


def h_list_stack(ex, op, states):
    inner = _elements(states[0])
    if isinstance(inner, Axis):
        return inner.moved(inner.axis + 1)
    return UNKNOWN if inner != FREE else FREE
