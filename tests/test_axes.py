"""The examples' axis analysis (`tb_gradmom.core.axes`) on tiny graphs: a table of rows, each a
few ops traced in a `tf.function` and the state the analysis must prove for their output.

Every row is traced on its own (milliseconds each); the expected states are worked out by hand
from the ops' semantics, not read from the analysis. At least one row per handler family, the
lattice's join and the bound on a ``while`` loop's fixed point.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import tensorflow as tf

from tb_gradmom.core import axes
from tb_gradmom.core.axes import FREE, REDUCED, UNKNOWN, Axis, Elements, Padded, join, registry

N, T, D = 3, 4, 5


def spec(*shape, dtype=tf.float32):
    return tf.TensorSpec(shape, dtype)


@dataclass(frozen=True)
class Row:
    """``fn(*inputs)`` traced with ``specs``; the analysis must give its output ``expected``."""

    id: str
    fn: Callable
    specs: tuple
    expected: object


def analyse(fn, specs):
    """``(state of fn's output, analysis, output tensor)``."""
    graph = tf.function(fn).get_concrete_function(*specs).graph
    ex = axes.Examples(graph)
    out = graph.outputs[0]
    return ex.of(out), ex, out


W = np.arange(D * 2, dtype=np.float32).reshape(D, 2)


def _shift_loop(k):
    """A loop whose variable ``v_i`` takes ``v_{i-1}``'s value at each iteration, ``v_0 = x``:
    the examples reach ``v_k`` after ``k`` iterations, so the fixed point needs ``k + 1``
    passes over the body."""

    def fn(x):
        def body(i, *vs):
            return (i + 1, vs[0], *vs[:-1])

        zeros = [tf.zeros_like(x)] * k
        out = tf.while_loop(lambda i, *vs: i < k, body, (tf.constant(0), x, *zeros))
        return out[-1]

    return fn


def _accumulate_loop(x):
    def body(i, h):
        return i + 1, h + tf.tanh(x)

    return tf.while_loop(lambda i, h: i < 3, body, (tf.constant(0), tf.zeros_like(x)))[1]


def _tensor_array_loop(x):
    # [n, T, d] -> T elements [n, d], each passed through tanh, stacked back to [T, n, d]
    ta = tf.TensorArray(tf.float32, size=T).unstack(tf.transpose(x, [1, 0, 2]))
    out = tf.TensorArray(tf.float32, size=T)

    def body(i, out):
        return i + 1, out.write(i, tf.tanh(ta.read(i)))

    _, out = tf.while_loop(lambda i, o: i < T, body, (tf.constant(0), out))
    return out.stack()


def _differentiated_loop(x):
    # the loop above differentiated in the step: TensorFlow's gradient appends a list per value
    # its backward loop needs, pushed at every step (here tanh's output): stacked, [T, n, d]
    y = _tensor_array_loop(x)
    tf.gradients(tf.reduce_sum(y), x)
    loop = next(op for op in y.graph.get_operations() if op.type in ("While", "StatelessWhile"))
    body = axes.function_graph(loop, "body")
    pushed = [
        i
        for i, t in enumerate(body.outputs)
        if t.op.type == "TensorListPushBack" and t.op.inputs[1].op.type == "Tanh"
    ]
    return tf.raw_ops.TensorListStack(
        input_handle=loop.outputs[pushed[0]], element_shape=[-1, D], element_dtype=tf.float32
    )


@tf.function
def _inner(x):
    return tf.nn.relu(x) * 2.0


ROWS = [
    # sources and free values
    Row("input", lambda x: x, (spec(N, D),), Axis(0)),
    Row("scalar-input-is-free", lambda s: s * 2.0, (spec(),), FREE),
    # random draws of the batch's size are an example source: row j drawn for example j
    Row(
        "random-of-the-batch-shape",
        lambda x: tf.random.normal(tf.shape(x)),
        (spec(None, D),),
        Axis(0),
    ),
    # a static batch: tf.shape(x) is folded into a constant, which might be any [d_in, d_out]
    # (read as the batch size only for a loss with no other examples: Examples(static_draws))
    Row(
        "random-of-a-static-batch-shape",
        lambda x: tf.random.normal(tf.shape(x)),
        (spec(N, D),),
        FREE,
    ),
    Row(
        "random-latents-of-the-batch-size",
        lambda x: tf.random.stateless_normal([tf.shape(x)[0], 3], seed=[1, 2]),
        (spec(None, D),),
        Axis(0),
    ),
    Row("random-of-another-shape", lambda x: tf.random.normal([D, N]), (spec(N, D),), FREE),
    Row("stop-gradient", lambda x: tf.stop_gradient(x), (spec(N, D),), FREE),
    Row("shape", lambda x: tf.shape(x), (spec(N, D),), FREE),
    # defelementwise
    Row("elementwise", lambda x: tf.tanh(tf.exp(x)), (spec(N, D),), Axis(0)),
    # defbroadcasting
    Row("broadcast-bias", lambda x: x + tf.ones([D]), (spec(N, D),), Axis(0)),
    Row(
        "broadcast-moves-axis",
        lambda x: tf.expand_dims(x, 0) + tf.ones([2, 1, 1]),
        (spec(N, D),),
        Axis(1),
    ),
    Row(
        "broadcast-examples-on-two-axes",
        lambda x: x[:, :1] * tf.transpose(x[:, :N]),
        (spec(N, D),),
        UNKNOWN,
    ),
    Row("batch-statistic", lambda x: tf.reduce_mean(x, 0) * 2.0, (spec(N, D),), REDUCED),
    Row("centred-by-batch-mean", lambda x: x - tf.reduce_mean(x, 0), (spec(N, D),), Axis(0)),
    # defreduction
    Row("reduce-other-axis", lambda x: tf.reduce_sum(x, 1), (spec(N, T, D),), Axis(0)),
    Row("reduce-batch-axis", lambda x: tf.reduce_max(x, 0), (spec(N, D),), REDUCED),
    Row("argmax-rows", lambda x: tf.argmax(x, 1), (spec(N, D),), Axis(0)),
    # deflastaxis
    Row("softmax-rows", lambda x: tf.nn.softmax(x), (spec(N, D),), Axis(0)),
    Row("softmax-over-batch", lambda x: tf.nn.softmax(tf.transpose(x)), (spec(N, D),), UNKNOWN),
    # defbatchrows
    Row(
        "conv2d",
        lambda x: tf.nn.conv2d(x, tf.ones([2, 2, 3, 2]), 1, "SAME"),
        (spec(N, 4, 4, 3),),
        Axis(0),
    ),
    Row(
        "conv2d-on-transposed-batch",
        lambda x: tf.nn.conv2d(tf.transpose(x, [1, 0, 2, 3]), tf.ones([2, 2, 3, 2]), 1, "SAME"),
        (spec(N, 4, 4, 3),),
        UNKNOWN,
    ),
    # shapes and layouts
    Row("transpose", lambda x: tf.transpose(x, [1, 2, 0]), (spec(N, T, D),), Axis(2)),
    Row(  # the permutation is a ConcatV2 of Range(s) and Pack of the rank
        "softmax-over-axis-1", lambda x: tf.nn.softmax(x, axis=1), (spec(None, T, D),), Axis(0)
    ),
    Row("softmax-over-axis-0", lambda x: tf.nn.softmax(x, axis=0), (spec(N, T, D),), UNKNOWN),
    Row(
        "transpose-computed-perm",
        lambda x: tf.transpose(x, tf.concat([tf.range(1, tf.rank(x)), [0]], 0)),
        (spec(None, T, D),),
        Axis(2),
    ),
    Row("expand-dims", lambda x: tf.expand_dims(x, 0), (spec(N, D),), Axis(1)),
    Row("squeeze", lambda x: tf.squeeze(x, 1), (spec(N, 1, D),), Axis(0)),
    Row("reshape-fold", lambda x: tf.reshape(x, [N * T, D]), (spec(N, T, D),), Axis(0, 1, T)),
    Row(
        "reshape-fold-dynamic-batch",
        lambda x: tf.reshape(x, [-1, D]),
        (spec(None, T, D),),
        Axis(0, 1, T),
    ),
    Row(
        "reshape-unfold",
        lambda x: tf.reshape(tf.reshape(x, [-1, D]), [-1, T, D]),
        (spec(None, T, D),),
        Axis(0),
    ),
    Row(
        "reshape-across-examples",
        lambda x: tf.reshape(x, [T, N, D]),
        (spec(N, T, D),),
        UNKNOWN,
    ),
    Row("concat-features", lambda x: tf.concat([x, x * 2.0], 1), (spec(N, D),), Axis(0)),
    # along the batch: a union, each row an example of a new batch (n = n1 + n2)
    Row("concat-batch", lambda x: tf.concat([x, x], 0), (spec(N, D),), Axis(0, batch=1)),
    Row(
        "concat-batch-and-rows-of-parameters",
        lambda x: tf.concat([x, tf.ones([2, D])], 0),
        (spec(N, D),),
        Axis(0, batch=1),
    ),
    # n + 2 rows with n unknown at trace time: the two rows are not examples (`Padded`) until a
    # slice takes the examples' rows back
    Row(
        "concat-dynamic-batch-and-rows-of-parameters",
        lambda x: tf.concat([x, tf.ones([2, D])], 0),
        (spec(None, D),),
        Padded(0, 0, 2, "concat"),
    ),
    Row(
        "padded-through-a-dense-layer",
        lambda x: tf.tanh(tf.concat([x, tf.ones([2, D])], 0) @ W + 1.0),
        (spec(None, D),),
        Padded(0, 0, 2, "concat"),
    ),
    Row(
        "padded-taken-back",
        lambda x: tf.tanh(tf.concat([x, tf.ones([2, D])], 0) @ W)[: tf.shape(x)[0]],
        (spec(None, D),),
        Axis(0),
    ),
    Row(
        "padded-before-taken-back",
        lambda x: tf.concat([tf.ones([2, D]), x], 0)[2:, 1:],
        (spec(None, D),),
        Axis(0),
    ),
    Row(
        "padded-sliced-on-another-axis",
        lambda x: tf.concat([x, tf.ones([2, D])], 0)[:, 1:],
        (spec(None, D),),
        Padded(0, 0, 2, "concat"),
    ),
    Row(  # off by one: a fixed row and all but one example
        "padded-taken-back-at-the-wrong-rows",
        lambda x: tf.concat([x, tf.ones([2, D])], 0)[1 : tf.shape(x)[0] + 1],
        (spec(None, D),),
        UNKNOWN,
    ),
    Row(
        "padded-summed-over-its-rows",
        lambda x: tf.reduce_sum(tf.concat([x, tf.ones([2, D])], 0), 0),
        (spec(None, D),),
        REDUCED,
    ),
    Row(
        "padded-meets-a-batch-statistic",
        lambda x: tf.concat([x, tf.ones([2, D])], 0) - tf.reduce_mean(x, 0),
        (spec(None, D),),
        UNKNOWN,
    ),
    Row(  # every row with every row: the examples meet
        "padded-times-its-transpose",
        lambda x: tf.matmul(p := tf.concat([x, tf.ones([2, D])], 0), p, transpose_b=True),
        (spec(None, D),),
        UNKNOWN,
    ),
    Row(
        "padded-times-itself-element-wise",
        lambda x: tf.square(p := tf.concat([x, tf.ones([2, D])], 0)) * p,
        (spec(None, D),),
        Padded(0, 0, 2, "concat"),
    ),
    Row(
        "padded-reshaped",
        lambda x: tf.reshape(tf.concat([x, tf.ones([2, D])], 0), [-1]),
        (spec(None, D),),
        UNKNOWN,
    ),
    Row(
        "concat-dynamic-two-batches-and-rows",
        lambda x: tf.concat([x, x, tf.ones([2, D])], 0),
        (spec(None, D),),
        UNKNOWN,
    ),
    Row(
        "concat-batch-and-a-batch-statistic",
        lambda x: tf.concat([x, tf.reduce_mean(x, 0, keepdims=True)], 0),
        (spec(N, D),),
        UNKNOWN,
    ),
    # a slice that takes back exactly one part of a union: that part's examples again (entry j
    # is a function of x's entry j), so it meets x row by row
    Row(
        "union-part-meets-its-batch",
        lambda x: tf.concat([x, x], 0)[:N] + x,
        (spec(N, D),),
        Axis(0),
    ),
    Row(
        "union-taken-back-past-a-dense-layer",
        lambda x: tf.tanh(tf.concat([x, tf.ones([2, D])], 0) @ W)[:N],
        (spec(N, D),),
        Axis(0),
    ),
    Row(
        "union-second-part-taken-back",
        lambda x: tf.slice(tf.concat([tf.ones([2, D]), x], 0), [2, 0], [-1, -1]),
        (spec(N, D),),
        Axis(0),
    ),
    Row(
        "union-rows-of-parameters-taken-back",
        lambda x: tf.concat([x, tf.ones([2, D])], 0)[N:],
        (spec(N, D),),
        UNKNOWN,
    ),
    Row(
        "union-taken-back-at-the-wrong-rows",
        lambda x: tf.concat([x, tf.ones([2, D])], 0)[1 : N + 1],
        (spec(N, D),),
        UNKNOWN,
    ),
    Row(
        "union-reshaped-by-its-size",
        lambda x: tf.reshape(tf.concat([x, x], 0), [-1, 1, D]),
        (spec(None, D),),
        Axis(0, batch=1),
    ),
    Row("pack", lambda x: tf.stack([x, x], 0), (spec(N, D),), Axis(1)),
    Row("unpack", lambda x: tf.unstack(x, axis=1)[0], (spec(N, T, D),), Axis(0)),
    Row("split", lambda x: tf.split(x, [2, 3], axis=1)[1], (spec(N, D),), Axis(0)),
    Row("pad-features", lambda x: tf.pad(x, [[0, 0], [1, 1]]), (spec(N, D),), Axis(0)),
    Row("pad-batch", lambda x: tf.pad(x, [[1, 0], [0, 0]]), (spec(N, D),), UNKNOWN),
    Row(
        "pad-to-bounding-box",  # paddings computed from the shape
        lambda x: tf.image.pad_to_bounding_box(x[:, 1:, 1:], 0, 0, 4, 4),
        (spec(None, 4, 4, 3),),
        Axis(0),
    ),
    Row(
        "pad-batch-computed",
        lambda x: tf.pad(x, tf.reshape(tf.stack([tf.shape(x)[1] - D, 1, 0, 0]), [2, 2])),
        (spec(None, D),),
        UNKNOWN,
    ),
    Row("tile-features", lambda x: tf.tile(x, [1, 2]), (spec(N, D),), Axis(0)),
    Row("tile-batch", lambda x: tf.tile(x, [2, 1]), (spec(N, D),), UNKNOWN),
    Row(
        "broadcast-to",
        lambda x: tf.broadcast_to(x[:, None], [N, T, D]),
        (spec(N, D),),
        Axis(0),
    ),
    Row("slice-features", lambda x: x[:, 1:3], (spec(N, D),), Axis(0)),
    Row("slice-batch", lambda x: x[1:], (spec(N, D),), UNKNOWN),
    Row(
        "crop-to-bounding-box",
        lambda x: tf.image.crop_to_bounding_box(x, 1, 1, 2, 2),
        (spec(None, 4, 4, 3),),
        Axis(0),
    ),
    Row(
        "slice-size-from-shape",
        lambda x: tf.slice(x, [0, 1], tf.stack([tf.shape(x)[0], 2])),
        (spec(None, D),),
        Axis(0),
    ),
    Row(
        "slice-size-from-shape-cuts-batch",
        lambda x: tf.slice(x, [0, 1], tf.stack([tf.shape(x)[0] - 1, 2])),
        (spec(None, D),),
        UNKNOWN,
    ),
    Row(
        "strided-slice-end-from-shape",
        lambda x: x[:, : tf.shape(x)[1] - 1],
        (spec(None, T, D),),
        Axis(0),
    ),
    Row(
        "strided-slice-batch-end-from-shape",
        lambda x: x[: tf.shape(x)[0] - 1],
        (spec(None, T, D),),
        UNKNOWN,
    ),
    Row(
        "strided-slice-full-batch-from-shape",
        lambda x: x[: tf.shape(x)[0], 1:],
        (spec(None, T, D),),
        Axis(0),
    ),
    Row(
        "relative-shift",  # XLNet: reshape-slice-reshape on non-batch axes
        lambda x: tf.reshape(tf.reshape(x, [-1, D, T])[:, 1:, :], [-1, T, D - 1]),
        (spec(None, T, D),),
        Axis(0),
    ),
    Row(
        "space-to-batch",
        lambda x: tf.space_to_batch(x, [2, 2], [[0, 0], [0, 0]]),
        (spec(N, 4, 4, 3),),
        Axis(0, 4, 1),
    ),
    Row(
        "space-to-batch-and-back",
        lambda x: tf.batch_to_space(
            tf.space_to_batch(x, [2, 2], [[0, 0], [0, 0]]), [2, 2], [[0, 0], [0, 0]]
        ),
        (spec(N, 4, 4, 3),),
        Axis(0),
    ),
    Row("identity-n", lambda x: tf.identity_n([x, x * 2.0])[1], (spec(N, D),), Axis(0)),
    Row(
        "image-transform-per-example",  # Keras' RandomRotation: a transform per image
        lambda x: tf.raw_ops.ImageProjectiveTransformV3(
            images=x,
            transforms=tf.random.uniform([tf.shape(x)[0], 8]),
            output_shape=[4, 4],
            fill_value=0.0,
            interpolation="BILINEAR",
        ),
        (spec(None, 4, 4, 3),),
        Axis(0),
    ),
    Row(
        "image-transform-of-transposed-batch",
        lambda x: tf.raw_ops.ImageProjectiveTransformV3(
            images=tf.transpose(x, [1, 0, 2, 3]),
            transforms=tf.ones([1, 8]),
            output_shape=[4, 4],
            fill_value=0.0,
            interpolation="BILINEAR",
        ),
        (spec(4, 4, 4, 3),),
        UNKNOWN,
    ),
    Row(
        "bucketize",
        lambda x: tf.raw_ops.Bucketize(input=x, boundaries=[0.0]),
        (spec(N, D),),
        Axis(0),
    ),
    # defalongaxes
    Row("cumsum-features", lambda x: tf.cumsum(x, 1), (spec(N, D),), Axis(0)),
    Row("cumsum-batch", lambda x: tf.cumsum(x, 0), (spec(N, D),), UNKNOWN),
    Row("reverse-sequence", lambda x: tf.reverse(x, [1]), (spec(N, T, D),), Axis(0)),
    Row("reverse-batch", lambda x: tf.reverse(x, [0]), (spec(N, T, D),), UNKNOWN),
    Row("roll-sequence", lambda x: tf.roll(x, [1, -2], [1, 2]), (spec(N, T, D),), Axis(0)),
    Row("roll-batch", lambda x: tf.roll(x, 1, 0), (spec(N, T, D),), UNKNOWN),
    Row("roll-batch-negative-axis", lambda x: tf.roll(x, 1, -3), (spec(N, T, D),), UNKNOWN),
    Row(
        "roll-folded-windows",  # examples x windows on axis 0: a roll along it mixes them
        lambda x: tf.roll(tf.reshape(x, [N * T, D]), 1, 0),
        (spec(N, T, D),),
        UNKNOWN,
    ),
    Row(
        "cumsum-batch-of-one-hot",  # Switch's capacity: no gradient, a constant for the split
        lambda x: tf.cumsum(tf.one_hot(tf.argmax(x, 1), 4), 0),
        (spec(N, D),),
        FREE,
    ),
    Row(
        "capacity-mask-times-probabilities",
        lambda x: (
            tf.nn.softmax(x)
            * tf.cast(tf.cumsum(tf.one_hot(tf.argmax(x, 1), D), 0) <= 2.0, tf.float32)
        ),
        (spec(N, D),),
        Axis(0),
    ),
    Row(
        "cumsum-batch-of-differentiable",  # carries a gradient: stays unproven (a coupling)
        lambda x: tf.argmax(tf.cumsum(tf.nn.softmax(x), 0), 1),
        (spec(N, D),),
        UNKNOWN,
    ),
    # definnermost
    Row(
        "fft2d-sequence-features",
        lambda x: tf.math.real(tf.signal.fft2d(tf.cast(x, tf.complex64))),
        (spec(None, T, D),),
        Axis(0),
    ),
    Row(
        "fft2d-over-batch",
        lambda x: tf.signal.fft2d(tf.cast(x, tf.complex64)),
        (spec(N, D),),
        UNKNOWN,
    ),
    Row("rfft-magnitude", lambda x: tf.abs(tf.signal.rfft(x)), (spec(N, T, D),), Axis(0)),
    Row(
        "fft-over-batch",
        lambda x: tf.signal.fft(tf.complex(tf.transpose(x), 0.0)),
        (spec(N, D),),
        UNKNOWN,
    ),
    Row("irfft3d", lambda x: tf.signal.irfft3d(tf.signal.rfft3d(x)), (spec(N, 2, T, D),), Axis(0)),
    # products
    Row("matmul", lambda x: x @ W, (spec(N, D),), Axis(0)),
    Row(
        "matmul-examples-as-columns",
        lambda x: tf.matmul(tf.ones([2, D]), x, transpose_b=True),
        (spec(N, D),),
        Axis(1),
    ),
    Row("matmul-contracts-batch", lambda x: tf.matmul(tf.ones([2, N]), x), (spec(N, D),), REDUCED),
    Row(
        "matmul-gram-of-batch", lambda x: tf.matmul(x, x, transpose_b=True), (spec(N, D),), UNKNOWN
    ),
    Row("batch-matmul", lambda x: tf.matmul(x, tf.ones([D, 2])), (spec(N, T, D),), Axis(0)),
    Row("einsum", lambda x: tf.einsum("ntd,de->tne", x, W), (spec(N, T, D),), Axis(1)),
    # selections and lookups
    Row("gather-features", lambda x: tf.gather(x, [0, 2], axis=1), (spec(N, D),), Axis(0)),
    Row("gather-examples", lambda x: tf.gather(x, [0, 2], axis=0), (spec(N, D),), UNKNOWN),
    Row(
        "gather-rows-by-ids",
        lambda ids: tf.gather(tf.ones([7, D]), ids),
        (spec(N, T, dtype=tf.int32),),
        Axis(0),
    ),
    Row(
        "gather-nd-by-ids",
        lambda ids: tf.gather_nd(tf.ones([7, D]), ids[..., None]),
        (spec(N, T, dtype=tf.int32),),
        Axis(0),
    ),
    Row(
        "select-rows-by-a-vector",
        lambda x: tf.compat.v1.where(x[:, 0] > 0.0, x, tf.zeros_like(x)),
        (spec(N, D),),
        Axis(0),
    ),
    Row("one-hot", lambda x: tf.one_hot(tf.argmax(x, 1), 4), (spec(N, D),), Axis(0)),
    Row(
        "select-rows",
        lambda x: tf.where(x > 0.0, x, tf.zeros_like(x)),
        (spec(N, D),),
        Axis(0),
    ),
    Row(
        "cross-entropy",
        lambda x: tf.nn.softmax_cross_entropy_with_logits(tf.nn.softmax(x), x),
        (spec(N, D),),
        Axis(0),
    ),
    # control flow
    Row("call", lambda x: _inner(x), (spec(N, D),), Axis(0)),
    Row("while-accumulates", _accumulate_loop, (spec(N, D),), Axis(0)),
    Row("while-tensor-array", _tensor_array_loop, (spec(N, T, D),), Axis(1)),
    Row("while-differentiated-accumulator", _differentiated_loop, (spec(N, T, D),), Axis(1)),
    Row("while-settles-within-bound", _shift_loop(3), (spec(N, D),), Axis(0)),
    Row(
        "while-past-bound",
        _shift_loop(axes.MAX_LOOP_PASSES + 2),
        (spec(N, D),),
        UNKNOWN,
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_axes_of_tiny_graphs(row):
    st, ex, out = analyse(row.fn, row.specs)
    assert st == row.expected, f"{row.id}: {st} != {row.expected} ({ex.why(out)})"


def test_every_family_has_a_row():
    """Each handler of the registry is exercised by some row (the table covers the families)."""
    seen = set()
    for row in ROWS:
        graph = tf.function(row.fn).get_concrete_function(*row.specs).graph
        ops = list(graph.get_operations())
        for op in list(ops):  # and the bodies of loops and calls
            for attr in ("body", "f"):
                fg = axes.function_graph(op, attr)
                if fg is not None:
                    ops.extend(fg.get_operations())
        seen.update(registry.HANDLERS[op.type] for op in ops if op.type in registry.HANDLERS)
    missing = {h.__name__ for h in registry.HANDLERS.values()} - {h.__name__ for h in seen}
    assert not missing, f"handlers with no row in the table: {sorted(missing)}"


def test_loop_past_the_bound_names_the_loop_and_the_bound():
    st, ex, out = analyse(_shift_loop(axes.MAX_LOOP_PASSES + 2), (spec(N, D),))
    assert st == UNKNOWN
    why = ex.why(out)
    assert "did not settle" in why and f"{axes.MAX_LOOP_PASSES} passes" in why, why
    assert "While op" in why


def test_loop_at_the_bound_is_proven():
    # k variables in a shift chain need k + 1 passes: the longest chain within the bound
    st, _, _ = analyse(_shift_loop(axes.MAX_LOOP_PASSES - 1), (spec(N, D),))
    assert st == Axis(0)


# --- the lattice ------------------------------------------------------------------------------

STATES = [FREE, REDUCED, UNKNOWN, Axis(0), Axis(1), Axis(0, 1, 4), Elements(FREE)]
STATES += [Elements(Axis(0)), Elements(Axis(1)), Padded(0, 0, 2, "concat")]

JOINS = [
    (FREE, Axis(0), Axis(0)),
    (FREE, REDUCED, REDUCED),
    (Axis(0), Axis(0), Axis(0)),
    (Axis(0), Axis(1), UNKNOWN),
    (Axis(0), Axis(0, 1, 4), UNKNOWN),
    (REDUCED, Axis(0), UNKNOWN),
    (UNKNOWN, FREE, UNKNOWN),
    (Elements(FREE), Elements(Axis(0)), Elements(Axis(0))),
    (Elements(Axis(0)), Elements(Axis(1)), UNKNOWN),
    (FREE, Elements(Axis(0)), Elements(Axis(0))),
    (Elements(Axis(0)), Axis(0), UNKNOWN),
]


@pytest.mark.parametrize("a, b, expected", JOINS, ids=[f"{a}|{b}" for a, b, _ in JOINS])
def test_join(a, b, expected):
    assert join(a, b) == expected
    assert join(b, a) == expected


def test_join_is_a_least_upper_bound():
    """Commutative, associative, idempotent, FREE the bottom and UNKNOWN the top; its longest
    strictly increasing chain has `HEIGHT` steps (what bounds the loop's fixed point)."""
    for a, b, c in itertools.product(STATES, repeat=3):
        assert join(a, b) == join(b, a)
        assert join(join(a, b), c) == join(a, join(b, c))
    for a in STATES:
        assert join(a, a) == a and join(FREE, a) == a and join(UNKNOWN, a) == UNKNOWN

    def below(a, b):
        return a != b and join(a, b) == b

    longest = {a: 0 for a in STATES}
    for _ in STATES:  # relax: longest chain ending at each state
        for a, b in itertools.product(STATES, repeat=2):
            if below(a, b):
                longest[b] = max(longest[b], longest[a] + 1)
    assert max(longest.values()) == axes.lattice.HEIGHT


def test_states_are_an_enum_with_words_for_messages():
    assert {s.value for s in axes.State} == {"free", "reduced", "unknown"}
    assert axes.describe(REDUCED) == "batch statistics"
    assert axes.describe(Axis(0, 2, 3)) == "axis 0 (folded: 2 x examples x 3)"


def test_an_op_type_registered_twice_is_refused():
    with pytest.raises(ValueError, match="'Tanh' is registered twice"):
        registry.defelementwise("Tanh")


# --- the proofs at work: the variables around these ops keep their rules ---------------------

# case id -> the variables on the exact fallback (coupled: the op mixes the examples)
FALLBACKS = {
    "swin-shifted-windows-roll": 0,
    "softmax-over-axis-1": 0,
    "fnet-fft2d-token-mixing": 0,
    "fnet-rfft-magnitude": 0,
    "cumsum-along-sequence": 0,
    "switch-capacity-cumsum": 0,
    "crop-pad-and-dynamic-slice": 0,
    "preprocessing-layers": 0,
    "xlnet-relative-shift": 0,
    "ids-reversed-along-batch": 0,
    # along the batch: nothing after the op is proven, the per-example losses included, so
    # every variable takes the fallback (rows of the jacobian), the op named as the reason
    "cumsum-along-batch": 4,
    "roll-along-batch": 4,
}
MIXERS = {"cumsum-along-batch": "Cumsum op 'Cumsum'", "roll-along-batch": "Roll op 'Roll'"}


def _plan_paths(case, batch_signature=False):
    import tb_gradmom as gradmom
    from tests.cases import squared_error

    forward, variables = case.build("float64")
    x, y = case.inputs(np.random.default_rng(0), "float64")
    seen = {}

    def step(x, y):
        per_example = (case.per_example_loss or squared_error)(forward(x), y)
        loss = tf.reduce_sum(per_example) if case.loss == "sum" else tf.reduce_mean(per_example)
        seen["paths"] = [v.path for v in gradmom.plan_moments(loss, variables).variables]
        return loss

    sig = None
    if batch_signature:  # the batch size unknown at trace time
        sig = [tf.TensorSpec([None, *a.shape[1:]], tf.as_dtype(a.dtype)) for a in (x, y)]
    tf.function(step, input_signature=sig).get_concrete_function(
        *(sig or (tf.constant(x), tf.constant(y)))
    )
    return seen["paths"]


@pytest.mark.filterwarnings("ignore:tb_gradmom. cannot prove where the examples are")
@pytest.mark.parametrize("batch_signature", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("case_id", list(FALLBACKS))
def test_variables_around_proven_ops_keep_their_rules(case_id, batch_signature):
    """Counted in the plan: every variable takes a rule, except those before an op along the
    batch (coupled: the exact fallback). The numbers are checked against brute force (or the
    jacobian) in tests/test_core.py, float64 and float32, orders 1-4."""
    from tests.cases import CASES_BY_ID

    paths = _plan_paths(CASES_BY_ID[case_id], batch_signature)
    fallback = [p for p in paths if p.startswith("fallback")]
    assert len(fallback) == FALLBACKS[case_id], paths
    assert all(f"{MIXERS.get(case_id)} along the examples' axis 0" in p for p in fallback), paths
    assert all(p.startswith("rule") for p in paths if not p.startswith("fallback")), paths


def test_switch_capacity_drops_tokens_that_depend_on_other_examples():
    """The case is not vacuous: with the batch, some tokens are past their expert's capacity,
    and a token's fate changes with the other examples (alone, example 3's tokens are kept), so
    its per-example gradient is the jacobian's row, not its own slice's gradient."""
    from tests import reference
    from tests.cases import CASES_BY_ID, squared_error

    case = CASES_BY_ID["switch-capacity-cumsum"]
    forward, variables = case.build("float64")
    x, y = case.inputs(np.random.default_rng(0), "float64")
    alone = reference.per_example_gradients(forward, variables, squared_error, x, y)
    in_batch = reference.per_example_jacobian(forward, variables, squared_error, x, y)
    differ = [float(np.max(np.abs(a - b))) for a, b in zip(alone, in_batch)]
    assert max(differ) > 1e-3, differ


def _moments_against(forward, variables, inputs, y, rows):
    """Max error of `gradients_and_moments` (orders 1-4, float64) against ``rows``' moments,
    relative to each moment's largest magnitude over the model (moments that vanish are
    rounding noise: a floor of 1e-9 of the model's largest)."""
    import tb_gradmom as gradmom
    from tests import reference

    def per_example(out, y):
        return 0.5 * tf.reduce_sum(tf.square(out - y), axis=list(range(1, len(out.shape))))

    seen = {}

    @tf.function
    def step(inputs, y):
        loss = tf.reduce_mean(per_example(forward(inputs), y))
        plan = gradmom.plan_moments(loss, variables)
        seen["fallback"] = [v.name for v in plan.variables if v.path.startswith("fallback")]
        return gradmom.gradients_and_moments(loss, variables, orders=(1, 2, 3, 4))[1]

    moments = step(inputs, y)
    fallback = seen["fallback"]
    expected = [reference.moments(np.stack(r), (1, 2, 3, 4)) for r in zip(*rows)]
    errors = []
    for p in (1, 2, 3, 4):
        scale = max(float(np.max(np.abs(e[p]))) for e in expected)
        errors += [
            float(np.max(np.abs(np.asarray(m[p]) - e[p]))) / scale
            for m, e in zip(moments, expected)
        ]
    return fallback, max(errors)


def _example_rows(loss_of, variables, n):
    rows = []
    for j in range(n):
        with tf.GradientTape() as tape:
            lj = loss_of(j)
        grads = tape.gradient(lj, variables)
        rows.append(
            [
                np.zeros(v.shape) if g is None else np.asarray(tf.convert_to_tensor(g))
                for g, v in zip(grads, variables)
            ]
        )
    return rows


def test_keras_hub_swin_shifted_windows_by_rules():
    """keras_hub's Swin with shifted windows (its second block rolls the map): on main every
    one of its 32 variables took the fallback (stopped at ``Roll``); now none, exact."""
    keras_hub = pytest.importorskip("keras_hub")
    import keras

    keras.utils.set_random_seed(0)
    model = keras_hub.models.SwinTransformerBackbone(
        image_shape=(16, 16, 3),
        embed_dim=8,
        depths=[2],
        num_heads=[2],
        window_size=2,
        patch_size=4,
        drop_path=0.0,
        dtype="float64",
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 16, 16, 3))
    y = rng.normal(size=model(x).shape)
    rows = _example_rows(
        lambda j: 0.5 * tf.reduce_sum(tf.square(model(x[j : j + 1]) - y[j : j + 1])),
        model.trainable_variables,
        3,
    )
    fallback, err = _moments_against(model, model.trainable_variables, x, y, rows)
    assert fallback == [], fallback
    assert len(model.trainable_variables) == 32
    assert err < 1e-10, err


def test_keras_hub_xlnet_relative_attention_by_rules():
    """keras_hub's XLNet (relative shift, its attention mask layer): on main 18 of its 19
    variables (one layer) took the fallback; now none. Its mask layer reshapes the ``[n, T]``
    padding mask to ``[T, n]`` (no transpose), so an example's loss depends on the others'
    padding: a mask carries no gradient, and each example's gradient is the jacobian's row in
    the batch's forward pass (not its own slice's), exact by the rules."""
    keras_hub = pytest.importorskip("keras_hub")
    import keras

    keras.utils.set_random_seed(0)
    model = keras_hub.models.XLNetBackbone(
        vocabulary_size=20,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=8,
        dtype="float64",
    )
    rng = np.random.default_rng(0)
    n = 3
    inputs = {
        "token_ids": rng.integers(1, 20, size=(n, 5)).astype(np.int32),
        "padding_mask": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], np.int32),
        "segment_ids": np.array([[0, 0, 1, 1, 1]] * n, np.int32),
    }
    y = rng.normal(size=(n, 5, 8))
    variables = model.trainable_variables
    assert len(variables) == 19

    def loss_in_batch(j):
        return 0.5 * tf.reduce_sum(tf.square(model(inputs)[j] - y[j]))

    rows = _example_rows(loss_in_batch, variables, n)
    fallback, err = _moments_against(model, variables, inputs, y, rows)
    assert fallback == [], fallback
    assert err < 1e-10, err
    # the mask mixes the examples: alone, example 0's gradient differs from its row
    alone = _example_rows(
        lambda j: (
            0.5
            * tf.reduce_sum(
                tf.square(model({k: v[j : j + 1] for k, v in inputs.items()})[0] - y[j])
            )
        ),
        variables,
        1,
    )
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(alone[0], rows[0])) > 1e-6
