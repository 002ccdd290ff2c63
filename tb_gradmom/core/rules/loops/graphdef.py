"""The copy of a loop, built by editing its body's GraphDef.

The ``a_t`` and ``delta_t`` of a use (`tb_gradmom.core.rules.loops.body.Use`) live inside the
loop. They are read from a *copy* of the loop, built where the moments are computed (inside the
``tf.cond`` of a step that records them, so a step that records nothing runs none of it): the
body's ``GraphDef`` imported into a new ``tf.while_loop`` whose body is the original body with

* a *tap* at each use: the use's output ``z_t`` (or the top of the chain of additions it feeds,
  which has the same gradient) becomes ``z_t + P[t]``, ``P`` a zero tensor fed through a
  ``TensorList``;
* each use's other operand ``a_t`` written to a ``TensorList`` every step.

The copy computes the same numbers as the loop (adding zeros), from the same inputs, for the
same number of steps (the loop's own final iteration counter), so the gradient of its outputs
with respect to ``P``, seeded with the loss's gradients of the original loop's outputs (from the
step's one backward pass), is ``delta_t`` for every step at once. That costs one more forward
and backward pass of the recurrence (the variables are read once before the copy and captured,
like the time-major input: the tape builds no gradient for either), plus one batched matmul per
use.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tb_gradmom.core import axes as _axes
from tb_gradmom.core.rules.base import static_chunks_only

__all__ = ["build_copy"]


def _open_items(loop, gdef, nodes, size=-1) -> None:
    """For a copy on a chunk of the examples: the items read from a sliced list get an
    element shape with the examples' axis open (the body's says the whole batch's size,
    which would pin the shapes of the copy's accumulators to it)."""
    assert loop.slicing is not None
    lists = {}
    for i, how in enumerate(loop.slicing):
        if how is not None and how[0] != "dense":
            lists[loop.body.inputs[i].op.name] = how[1]
    for o in loop.body.get_operations():
        if o.type != "TensorListGetItem":
            continue
        src = o.inputs[0].op
        while src.type == "Identity":
            src = src.inputs[0].op
        if src.name not in lists or o.name not in nodes:
            continue
        shape = tf.get_static_value(o.inputs[2])
        if shape is None or np.ndim(shape) != 1:
            continue
        shape = np.array(shape)
        shape[lists[src.name]] = size
        const = gdef.node.add()
        const.name = o.name + "/gradmom_open_shape"
        const.op = "Const"
        const.attr["dtype"].type = o.inputs[2].dtype.as_datatype_enum
        const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(shape, o.inputs[2].dtype))
        nodes[o.name].input[2] = const.name


def _invariant(loop, i: int, size=None) -> tf.TensorShape:
    """Loop variable ``i``'s shape across steps: the body's, with the examples' axis set to
    ``size`` when it is a static number of examples above one, else left open (the copy's
    shape inference may not pin a batch of one down). Static shapes matter: with the axis
    open, the copy's gradient accumulates the operands' shapes of every broadcasting op at
    every step (GRU(128) on chunks of 32 examples: 29 accumulators instead of 13)."""
    shape = loop.body.inputs[i].shape
    st = loop.sub.of(loop.body.inputs[i])
    if shape.rank is None or not isinstance(st, _axes.Axis):
        return shape
    dims = shape.as_list()
    dims[st.axis] = size if isinstance(size, int) and size > 1 else None
    return tf.TensorShape(dims)


def build_copy(loop, grads, outputs, n, inputs=None, inits=()) -> dict:
    """The copy's stacks; ``inputs``: the loop's inputs to run it on (default: the loop's
    own; `chunk_sums` passes a chunk of the examples of each). ``inits``: carried loop
    variables whose initial value's gradient is wanted too (``init:<index>``: the gradient
    of the loss with respect to that input of the loop, shaped like it)."""
    if inputs is None:
        inputs = loop.inputs
    gdef = tf.compat.v1.GraphDef.FromString(loop.body_def)
    taps = [loop.taps[k] for k in sorted(loop.taps)]
    records = [loop.records[k] for k in sorted(loop.records)]
    nodes = {nd.name: nd for nd in gdef.node}
    if inputs is not loop.inputs:
        _open_items(loop, gdef, nodes, n if isinstance(n, int) and n > 1 else -1)
    for i, tap in enumerate(taps):
        node_name = tap.name.rsplit(":", 1)[0]
        nodes[node_name].name = node_name + "/gradmom_untapped"
        ph = gdef.node.add()
        ph.name = f"gradmom_tap_{i}"
        ph.op = "Placeholder"
        ph.attr["dtype"].type = tap.dtype.as_datatype_enum
        add = gdef.node.add()
        add.name = node_name
        add.op = "AddV2"
        add.input.extend([node_name + "/gradmom_untapped", ph.name])
        add.attr["T"].type = tap.dtype.as_datatype_enum

    # the loop as built: the loop variables before any accumulators of a gradient
    body_in = [t.name for t in loop.body.inputs[: len(loop.inputs)]]
    body_out = [t.name for t in loop.outputs]
    position = {name: i for i, name in enumerate(body_in)}
    # The placeholders that `input_map` replaces (the body's inputs, the taps) are left out
    # of the import: unused, they would still be ops of the copy's body, which XLA compiles
    # whole (and has no kernel for a Placeholder).
    # whole (and has no kernel for a Placeholder). A body input that no op reads is then
    # in the graph nowhere, and is left out of `input_map` too (the import refuses a key it
    # cannot find).
    mapped = {t.split(":")[0] for t in body_in} | {f"gradmom_tap_{i}" for i in range(len(taps))}
    kept = [nd for nd in gdef.node if not (nd.op == "Placeholder" and nd.name in mapped)]
    read = {x.lstrip("^").split(":")[0] for nd in kept for x in nd.input}
    unread = mapped - read
    del gdef.node[:]
    gdef.node.extend(kept)
    steps = loop.op.outputs[0]  # the loop's final iteration counter: how many steps it ran
    # Under XLA a list has a size known at compile time, and a loop's gradient needs its
    # most iterations: both the steps the inputs show (`recurrent_rule` checks there are).
    # Items past the last step are never set and stack as zeros, which add nothing.
    bound = loop.steps_static if static_chunks_only() else None
    items = steps if bound is None else bound

    def element_shape(dims):
        return tf.constant([-1 if d is None else d for d in dims], tf.int32)

    def full_shape(dims):
        return tf.stack([items] + [n if d is None else d for d in dims])

    def item_shape(dims):  # an item's full shape, the batch included
        return tf.stack([tf.cast(n, tf.int32) if d is None else d for d in dims])

    # The variables, read once before the copy (none changes inside the loop: no stateful
    # op but reads there) and captured: the copy's backward then neither accumulates a
    # read per step nor builds the variables' gradients.
    values = {
        name: tf.raw_ops.ReadVariableOp(resource=inputs[i], dtype=dtype)
        for name, i, dtype in loop.reads
    }
    nc = len(loop.carried)
    iterations = loop.op.get_attr("parallel_iterations")
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        # the taps' P: lists of T items never set, which read as zeros of the item's
        # shape (no [T, n, ...] zero tensor is allocated); the gradient with respect to a
        # list is the list of its items' gradients
        tap_lists = [
            tf.raw_ops.TensorListReserve(
                element_shape=item_shape(t.dims), num_elements=items, element_dtype=t.dtype
            )
            for t in taps
        ]
        tape.watch(tap_lists)
        init_values = [tf.identity(inputs[i]) for i in inits]
        tape.watch(init_values)
        initial = dict(zip(inits, init_values))
        # Under XLA the records are kept as integers of the same width (a bitcast, no
        # copy): a list of floats carried by a loop is differentiable, and the loop's
        # gradient then takes zeros like it at every step, which needs the list itself at
        # every step (a list of lists, which XLA's compiler aborts on); a list of integers
        # gets no gradient.
        stored = {r.name: _BITS[r.dtype] if bound is not None else r.dtype for r in records}
        rec_lists = [
            tf.raw_ops.TensorListReserve(
                element_shape=element_shape(r.dims),
                num_elements=items,
                element_dtype=stored[r.name],
            )
            for r in records
        ]

        def cond(*loop_vars):
            return loop_vars[0] < steps

        def body(*loop_vars):
            carried = loop_vars[:nc]
            t_lists = loop_vars[nc : nc + len(taps)]
            r_lists = loop_vars[nc + len(taps) :]
            step = carried[0]  # the loop counter: 0, 1, ... (checked by the rule)
            mapping = {}
            for j, i in enumerate(loop.carried):
                mapping[body_in[i]] = carried[j]
            for i in loop.invariant:
                mapping[body_in[i]] = tf.identity(inputs[i])  # captured, not carried
            for name, value in values.items():
                mapping[name] = tf.identity(value)
            for i, (tap, lst) in enumerate(zip(taps, t_lists)):
                mapping[f"gradmom_tap_{i}:0"] = tf.raw_ops.TensorListGetItem(
                    input_handle=lst,
                    index=step,
                    element_shape=item_shape(tap.dims),
                    element_dtype=tap.dtype,
                )
            wanted = [body_out[i] for i in loop.carried] + [r.name for r in records]
            fetch = [w for w in wanted if w not in position]
            got = tf.graph_util.import_graph_def(
                gdef,
                input_map={k: v for k, v in mapping.items() if k.split(":")[0] not in unread},
                return_elements=fetch,
                name="gradmom_copy",
            )
            found = dict(zip(fetch, got))
            for w in wanted:
                if w in position:
                    found[w] = mapping[w]
            new = [found[body_out[i]] for i in loop.carried]
            # the records are read, never differentiated: no gradient pass through them
            new_records = [
                tf.stop_gradient(
                    tf.raw_ops.TensorListSetItem(
                        input_handle=lst,
                        index=step,
                        item=_as(tf.stop_gradient(found[r.name]), stored[r.name]),
                    )
                )
                for r, lst in zip(records, r_lists)
            ]
            return new + list(t_lists) + new_records

        loop_vars = [initial.get(i, inputs[i]) for i in loop.carried] + tap_lists + rec_lists
        invariants = [_invariant(loop, i, n) for i in loop.carried]
        invariants += [tf.TensorShape([])] * (len(tap_lists) + len(rec_lists))
        result = tf.while_loop(
            cond,
            body,
            loop_vars,
            shape_invariants=invariants,
            parallel_iterations=iterations,
            maximum_iterations=bound,
            name="gradmom_loop_copy",
        )
    ys, seeds_y = [], []
    for t, g in zip(outputs, grads):
        if g is None or t.value_index not in loop.carried:
            continue  # unconnected, or a loop-invariant input passed through
        ys.append(result[loop.carried.index(t.value_index)])
        seeds_y.append(tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g)
    out = {}
    lists = [None] * len(taps)
    init_grads: list = [None] * len(inits)
    if ys:
        found = tape.gradient(ys, tap_lists + init_values, output_gradients=seeds_y)
        lists, init_grads = found[: len(taps)], found[len(taps) :]
    for i, v, g in zip(inits, init_values, init_grads):
        if isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        out[f"init:{i}"] = tf.zeros_like(v) if g is None else g
    # One stack after the other: a list's items are freed once it is stacked, so at most
    # one tap is held twice (its list and its stack) instead of all of them.
    deltas: list = []
    for tap, lst in zip(taps, lists):
        if lst is None:
            deltas.append(tf.zeros(full_shape(tap.dims), tap.dtype))
            continue
        with tf.control_dependencies(deltas[-1:]):
            deltas.append(
                tf.raw_ops.TensorListStack(
                    input_handle=lst,
                    element_shape=item_shape(tap.dims),
                    element_dtype=tap.dtype,
                )
            )
    for tap, d in zip(taps, deltas):
        out[tap.name] = d
    for r, lst in zip(records, result[nc + len(taps) :]):
        stack = tf.raw_ops.TensorListStack(
            input_handle=lst, element_shape=element_shape(r.dims), element_dtype=stored[r.name]
        )
        out[r.name] = _as(stack, r.dtype)
    return out


_BITS = {
    tf.float16: tf.int16,
    tf.bfloat16: tf.int16,
    tf.float32: tf.int32,
    tf.float64: tf.int64,
}


def _as(t: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """``t`` bitcast to ``dtype`` (the same width), or ``t`` when it already is."""
    return t if t.dtype == dtype else tf.bitcast(t, dtype)
