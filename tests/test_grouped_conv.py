"""Grouped convolutions (``Conv1D/2D/3D(groups=G)``, ConvNeXt's ``Conv2D(groups=channels)``, a raw
``tf.nn.conv2d`` with a grouped filter) through the exact rules, against one gradient per
example.

Keras runs a grouped convolution in an XLA-compiled function call (`tb_gradmom.core.rules.call`); a
raw grouped ``tf.nn.conv2d`` is a plain ``Conv2D`` op (`tb_gradmom.core.rules.conv`), whose gradient
TensorFlow computes on CPU only under XLA (the rule does not need it).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom as gradmom
from tb_gradmom.core import graph as _graph
from tb_gradmom.core.plan import variable_name
from tb_gradmom.core.rules.call import function_body
from tests import reference
from tests.cases import squared_error

ORDERS = (1, 2, 3, 4)
# Errors relative to the largest moment of each order (of the model, where one vanishes), every
# case and variable, orders 1-4, grads included. float64: measured <= 2.2e-15 (summation order).
# float32: measured <= 8.1e-7.
TOLERANCE = {"float64": 1e-9, "float32": 1e-5}


def _seq(layers, input_shape):
    def build(dtype):
        keras.utils.set_random_seed(3)
        model = keras.Sequential(
            [keras.Input(input_shape, dtype=dtype)] + [f(dtype) for f in layers]
        )
        return model, model.trainable_variables

    return build


def _layer(cls, *args, **kw):
    return lambda dtype: cls(*args, dtype=dtype, **kw)


def _conv(kind, *args, **kw):
    cls = {1: keras.layers.Conv1D, 2: keras.layers.Conv2D, 3: keras.layers.Conv3D}[kind]
    return _layer(cls, *args, **kw)


def _shared(input_shape, **kw):
    """The same grouped conv applied twice (two sites: the per-example im2col path)."""

    def build(dtype):
        keras.utils.set_random_seed(4)
        layer = keras.layers.Conv2D(dtype=dtype, **kw)
        inp = keras.Input(input_shape, dtype=dtype)
        out = layer(keras.layers.Activation("tanh", dtype=dtype)(layer(inp)))
        model = keras.Model(inp, out)
        return model, model.trainable_variables

    return build


def _convnext_block(dtype):
    """ConvNeXt's block: depthwise 7x7 as Conv2D(groups=channels), LayerNorm, pointwise MLP."""
    keras.utils.set_random_seed(5)
    c = 6
    inp = keras.Input((9, 9, c), dtype=dtype)
    h = keras.layers.Conv2D(c, 7, groups=c, padding="same", dtype=dtype)(inp)
    h = keras.layers.LayerNormalization(dtype=dtype)(h)
    h = keras.layers.Conv2D(2 * c, 1, activation="gelu", dtype=dtype)(h)
    h = keras.layers.Conv2D(c, 1, dtype=dtype)(h)
    model = keras.Model(inp, keras.layers.Add(dtype=dtype)([inp, h]))
    return model, model.trainable_variables


# id -> (build, input shape without the batch, loss reduction)
CASES = {
    "conv2d-g2-stride2-same": (
        _seq([_conv(2, 6, 3, groups=2, strides=2, padding="same")], (7, 6, 4)),
        (7, 6, 4),
        "mean",
    ),
    "conv2d-g2-valid-then-dense": (
        _seq(
            [
                _conv(2, 4, (2, 3), groups=2, activation="tanh"),
                _layer(keras.layers.Flatten),
                _layer(keras.layers.Dense, 3),
            ],
            (5, 6, 6),
        ),
        (5, 6, 6),
        "sum",
    ),
    "conv2d-g3-dilation2-same": (
        _seq([_conv(2, 6, 3, groups=3, dilation_rate=2, padding="same")], (7, 8, 6)),
        (7, 8, 6),
        "vector",
    ),
    "conv2d-g2-dilation-2x3-valid": (
        _seq([_conv(2, 4, 2, groups=2, dilation_rate=(2, 3))], (6, 7, 4)),
        (6, 7, 4),
        "mean",
    ),
    "conv1d-g2-stride2-valid": (
        _seq([_conv(1, 4, 3, groups=2, strides=2)], (9, 4)),
        (9, 4),
        "mean",
    ),
    "conv1d-g2-dilation2-causal": (
        _seq([_conv(1, 6, 2, groups=2, dilation_rate=2, padding="causal")], (9, 4)),
        (9, 4),
        "sum",
    ),
    "conv1d-g3-dilation2-same": (
        _seq([_conv(1, 3, 3, groups=3, dilation_rate=2, padding="same")], (8, 6)),
        (8, 6),
        "vector",
    ),
    "conv3d-g2-same": (
        _seq([_conv(3, 4, 2, groups=2, padding="same")], (4, 5, 3, 4)),
        (4, 5, 3, 4),
        "mean",
    ),
    "conv3d-g2-stride2-valid": (
        _seq([_conv(3, 6, (2, 3, 2), groups=2, strides=2)], (5, 6, 5, 4)),
        (5, 6, 5, 4),
        "vector",
    ),
    # depthwise-style: one input channel per group, multiplier 1, 2 and 5 (three code paths)
    "conv2d-depthwise-groups-equal-channels": (
        _seq([_conv(2, 5, 3, groups=5, padding="same")], (6, 6, 5)),
        (6, 6, 5),
        "mean",
    ),
    "conv2d-depthwise-multiplier2-stride2": (
        _seq([_conv(2, 6, 3, groups=3, strides=2, padding="same")], (7, 7, 3)),
        (7, 7, 3),
        "sum",
    ),
    "conv2d-depthwise-multiplier5": (
        _seq([_conv(2, 10, 2, groups=2)], (5, 5, 2)),
        (5, 5, 2),
        "mean",
    ),
    "convnext-block": (_convnext_block, (9, 9, 6), "mean"),
    "conv2d-g2-shared-twice": (
        _shared((6, 6, 4), filters=4, kernel_size=3, groups=2, padding="same"),
        (6, 6, 4),
        "mean",
    ),
    "conv2d-g2-shared-twice-dilated": (
        _shared((7, 7, 4), filters=4, kernel_size=2, groups=2, dilation_rate=2, padding="same"),
        (7, 7, 4),
        "sum",
    ),
}


def _loss(kind, out, y):
    per_example = squared_error(out, y)
    if kind == "vector":
        return per_example
    return tf.reduce_sum(per_example) if kind == "sum" else tf.reduce_mean(per_example)


def _inputs(shape, n, dtype, model):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, *shape)).astype(dtype)
    return x, rng.normal(size=(n, *model(x[:1]).shape[1:])).astype(dtype)


def _assert_close(ours, ref, tol, what, floor=0.0):
    """Max error <= tol * (the largest magnitude of ``ref``, at least ``floor``)."""
    ours = np.asarray(ours, np.float64)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"
    scale = max(float(np.max(np.abs(ref))), floor, 1e-30)
    err = float(np.max(np.abs(ours - ref)))
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:g} * {scale:.3g}"
    return err / scale


def _check(variables, grads, moments, ref, batch_grads, loss_kind, tol, case_id):
    expected_all = [reference.moments(g, ORDERS) for g in ref]
    # A moment that vanishes is compared to the largest of its order over the model.
    floor = {p: 1e-3 * max(float(np.max(np.abs(e[p]))) for e in expected_all) for p in ORDERS}
    worst = 0.0
    for v, g, m, expected, tape_g in zip(variables, grads, moments, expected_all, batch_grads):
        name = variable_name(v)
        for p in ORDERS:
            worst = max(
                worst, _assert_close(m[p], expected[p], tol, f"{case_id} {name} M{p}", floor[p])
            )
        # the kernel gradient: that of the loss as given (of the mean for a vector loss)
        _assert_close(g, tape_g, tol, f"{case_id} {name} grad vs GradientTape", floor[1])
        scale = ref[0].shape[0] if loss_kind == "sum" else 1
        _assert_close(g, expected[1] * scale, tol, f"{case_id} {name} grad", floor[1] * scale)
    return worst


def _tape_grads(model, variables, x, y, loss_kind):
    with tf.GradientTape() as tape:
        loss = _loss(loss_kind, model(tf.constant(x)), tf.constant(y))
        if loss_kind == "vector":
            loss = tf.reduce_mean(loss)
    return [np.asarray(g) for g in tape.gradient(loss, variables)]


def _run_keras(case_id, dtype, n=5, chunk_size=None, dynamic=False):
    build, shape, loss_kind = CASES[case_id]
    model, variables = build(dtype)
    x, y = _inputs(shape, n, dtype, model)

    def step(x, y):
        return gradmom.gradients_and_moments(
            _loss(loss_kind, model(x), y),
            variables,
            orders=ORDERS,
            reduction="sum" if loss_kind == "sum" else "mean",
            chunk_size=chunk_size,
            fallback="error",  # the rules, never the exact fallback
        )

    if dynamic:
        sig = [
            tf.TensorSpec([None, *x.shape[1:]], dtype),
            tf.TensorSpec([None, *y.shape[1:]], dtype),
        ]
        fn = tf.function(step, input_signature=sig)
    else:
        fn = tf.function(step)
    grads, moments = fn(tf.constant(x), tf.constant(y))
    ref = reference.per_example_gradients(
        model, variables, lambda out, y: squared_error(out, y), x, y
    )
    return variables, grads, moments, ref, _tape_grads(model, variables, x, y, loss_kind), loss_kind


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case_id", list(CASES))
def test_grouped_conv_moments_match_brute_force(case_id, dtype):
    variables, grads, moments, ref, tape, kind = _run_keras(case_id, dtype)
    _check(variables, grads, moments, ref, tape, kind, TOLERANCE[dtype], case_id)


@pytest.mark.parametrize(
    "case_id",
    [
        "conv2d-g2-stride2-same",
        "conv1d-g2-dilation2-causal",
        "conv3d-g2-same",
        "convnext-block",
        "conv2d-g2-shared-twice-dilated",
    ],
)
def test_batch_bigger_than_chunk_and_dynamic_batch(case_id):
    """Seven examples in chunks of two (a while loop), the batch size unknown at trace time."""
    variables, grads, moments, ref, tape, kind = _run_keras(
        case_id, "float64", n=7, chunk_size=2, dynamic=True
    )
    _check(variables, grads, moments, ref, tape, kind, TOLERANCE["float64"], case_id)


@pytest.mark.parametrize("case_id", ["conv2d-g2-stride2-same", "conv1d-g3-dilation2-same"])
def test_batch_of_one(case_id):
    variables, grads, moments, ref, tape, kind = _run_keras(case_id, "float64", n=1)
    _check(variables, grads, moments, ref, tape, kind, TOLERANCE["float64"], case_id)


def test_keras_grouped_conv_is_a_function_call_the_rule_reads():
    """The pattern the call rule relies on: the kernel's handle goes into an XLA-compiled call
    whose body is ReadVariableOp -> Conv2D with a filter of C_in / G in-channels."""
    layer = keras.layers.Conv2D(6, 3, groups=2)
    layer.build((None, 5, 5, 4))

    @tf.function
    def f(x):
        return layer(x)

    graph = f.get_concrete_function(tf.TensorSpec([None, 5, 5, 4])).graph
    handle = _graph.internal_handle(graph, layer.kernel.value)
    calls = [op for op in handle.consumers() if op.type.endswith("PartitionedCall")]
    assert len(calls) == 1 and calls[0].get_attr("_XlaMustCompile")
    body = function_body(calls[0])
    convs = [op for op in body.get_operations() if op.type == "Conv2D"]
    assert len(convs) == 1 and convs[0].inputs[0].shape[-1] == 4


# A raw tf.nn.conv2d with a grouped filter: a plain Conv2D op whose filter has C_in / G
# in-channels. TensorFlow runs its forward on CPU, its gradients only under XLA (the reference and
# the tape compile the forward).
RAW = {
    "raw-conv2d-g2-same": dict(x=(6, 7, 4), w=(3, 3, 2, 6), strides=1, padding="SAME"),
    "raw-conv2d-g4-stride2-explicit": dict(
        x=(7, 6, 8), w=(3, 2, 2, 4), strides=2, padding=[[0, 0], [1, 2], [0, 1], [0, 0]]
    ),
}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("loss_kind", ["mean", "sum", "vector"])
@pytest.mark.parametrize("case_id", list(RAW))
def test_raw_grouped_conv2d_under_xla(case_id, loss_kind, dtype):
    spec = RAW[case_id]
    rng = np.random.default_rng(1)
    n = 5
    w = tf.Variable(rng.normal(size=spec["w"]).astype(dtype), name="grouped_filter")
    x = rng.normal(size=(n, *spec["x"])).astype(dtype)

    def forward(x):
        return tf.tanh(tf.nn.conv2d(x, w, spec["strides"], spec["padding"]))

    y = rng.normal(size=(n, *forward(x[:1]).shape[1:])).astype(dtype)

    # Not compiled: TensorFlow's own (CPU-less) filter gradient is never built, the rule gives
    # the gradient from its order-1 sum; x is the input, so no input gradient is needed either.
    # (Under jit_compile=True, see tests/test_xla.py: XLA once mis-computed the chunk loop's
    # dynamically sized slices, for plain convolutions too; see the report to the lead.)
    @tf.function
    def step(x, y):
        return gradmom.gradients_and_moments(
            _loss(loss_kind, forward(x), y),
            [w],
            orders=ORDERS,
            reduction="sum" if loss_kind == "sum" else "mean",
            fallback="error",
        )

    grads, moments = step(tf.constant(x), tf.constant(y))
    assert [op.type for op in step.get_concrete_function(x, y).graph.get_operations()].count(
        "Conv2D"
    ) >= 1
    compiled = tf.function(forward, jit_compile=True)  # the reference's backward needs XLA
    ref = reference.per_example_gradients(compiled, [w], squared_error, x, y)

    @tf.function(jit_compile=True)
    def tape_grad(x, y):
        with tf.GradientTape() as tape:
            loss = _loss(loss_kind, forward(x), y)
            loss = tf.reduce_mean(loss) if loss_kind == "vector" else loss
        return tape.gradient(loss, w)

    _check(
        [w], grads, moments, ref, [tape_grad(x, y).numpy()], loss_kind, TOLERANCE[dtype], case_id
    )


def test_channels_first_grouped_conv_is_refused_with_the_reason():
    """Not covered: a channels-first grouped conv. The rule says what is unsupported."""
    layer = keras.layers.Conv2D(4, 3, groups=2, data_format="channels_first")
    x = tf.ones([2, 4, 5, 5])
    layer(x)

    @tf.function
    def step(x):
        loss = tf.reduce_mean(layer(x))
        return gradmom.gradients_and_moments(loss, [layer.kernel], fallback="error")

    with pytest.raises(gradmom.UnsupportedOpError, match="channels-last"):
        step(x)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_grouped_conv(policy):
    """16-bit compute: the kernel is cast inside the XLA call's body (a view of the filter);
    moments in float32 against the same weights in float32, brute force."""
    from tests import test_mixed_precision as mp

    def build(dtype):
        return keras.Sequential(
            [
                keras.Input((6, 6, 4)),
                keras.layers.Conv2D(6, 3, groups=2, activation="tanh", dtype=dtype),
                keras.layers.Conv2D(6, 3, groups=6, padding="same", dtype=dtype),
                keras.layers.GlobalAveragePooling2D(dtype=dtype),
                keras.layers.Dense(3, dtype=dtype),
            ]
        )

    keras.utils.set_random_seed(21)
    mixed, full = build(policy), build("float32")
    full.set_weights(mixed.get_weights())
    rng = np.random.default_rng(5)
    x = rng.normal(size=(5, 6, 6, 4)).astype("float32")
    y = rng.integers(0, 3, size=5)

    @tf.function
    def step(x, y):
        loss = tf.reduce_mean(mp.sparse_ce(tf.cast(mixed(x), tf.float32), y))
        return gradmom.gradients_and_moments(
            loss, mixed.trainable_variables, orders=ORDERS, fallback="error"
        )

    _, moments = step(x, y)
    mp._check(moments, full, x, y, mp.TOLERANCE[policy], f"grouped {policy}")


def test_call_with_expand_dims_but_no_squeeze_is_refused_not_crashed():
    """A called function ExpandDims -> Conv2D whose output keeps the inserted axis (no Squeeze):
    not a Conv1D. The call rule refuses it with a RuleError (it used to raise AttributeError on
    the missing Squeeze), so `fallback="error"` names the reason and the exact fallback computes
    the moments."""
    rng = np.random.default_rng(8)
    w = tf.Variable(rng.normal(size=(1, 3, 2, 4)).astype("float64"), name="filter")
    x = rng.normal(size=(3, 5, 2))

    @tf.function
    def forward(x):  # called from a tf.function: a StatefulPartitionedCall
        return tf.nn.conv2d(tf.expand_dims(x, 1), w, 1, "VALID")

    def per_example_loss(out, _y):
        return tf.reduce_sum(tf.square(out), axis=[1, 2, 3])

    def step(fallback):
        @tf.function
        def run(x):
            loss = tf.reduce_mean(per_example_loss(forward(x), None))
            return gradmom.gradients_and_moments(loss, [w], orders=(1, 2), fallback=fallback)

        return run

    with pytest.raises(gradmom.UnsupportedOpError, match="ExpandDims and Squeeze do not match"):
        step("error")(tf.constant(x))
    with pytest.warns(UserWarning, match="exact fallback"):
        _, moments = step("exact")(tf.constant(x))
    ref = reference.moments(
        reference.per_example_gradients(forward, [w], per_example_loss, x, None)[0], (1, 2)
    )
    for p in (1, 2):
        np.testing.assert_allclose(moments[0][p].numpy(), ref[p], rtol=1e-9, atol=1e-12)
