"""gradients_and_moments against brute-force per-example gradients, for every case and order."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom as gradmom
from tb_gradmom.core.plan import variable_name
from tests import reference
from tests.cases import CASES, CASES_BY_ID, squared_error

ORDERS = (1, 2, 3, 4)
# float64: the rules and the reference differ only by summation order (measured <= 1e-13).
# float32: measured <= 2e-6 relative to the largest magnitude of each moment.
TOLERANCE = {"float64": 1e-10, "float32": 2e-5}


def _loss(case, out, y):
    per_example = (case.per_example_loss or squared_error)(out, y)
    if case.loss == "vector":
        return per_example
    if case.loss == "sum":
        return tf.reduce_sum(per_example)
    return tf.reduce_mean(per_example)


def _run(case, dtype, *, dynamic_batch=False, **kwargs):
    rng = np.random.default_rng(0)
    forward, variables = case.build(dtype)
    x, y = case.inputs(rng, dtype)

    def step(x, y):
        out = forward(x)
        return gradmom.gradients_and_moments(
            _loss(case, out, y),
            variables,
            orders=ORDERS,
            reduction=case.loss if case.loss != "vector" else "mean",
            **kwargs,
        )

    if dynamic_batch:
        sig = [
            tf.TensorSpec([None, *x.shape[1:]], tf.as_dtype(x.dtype)),
            tf.TensorSpec([None, *y.shape[1:]], tf.as_dtype(y.dtype)),
        ]
        fn = tf.function(step, input_signature=sig)
    else:
        fn = tf.function(step)
    grads, moments = fn(tf.constant(x), tf.constant(y))
    per_example_loss = case.per_example_loss or squared_error
    brute = {
        "brute": reference.per_example_gradients,
        "jacobian": reference.per_example_jacobian,
        "rows": reference.per_row_jacobian,
    }[case.reference]
    ref = brute(forward, variables, per_example_loss, x, y)
    return variables, grads, moments, ref


def _assert_close(ours, ref, tol, what, floor=0.0):
    """Max error <= tol * the reference's largest magnitude (at least ``floor``).

    ``floor``: for a variable whose true moments vanish (a key bias in attention: softmax does
    not see it), rounding noise of the size of the model's other gradients is all there is
    (measured 1.7e-7 in float32 against a largest moment of 1.4e-7); the callers pass 1e-3 of
    the largest moment of the same order over the whole model.
    """
    ours = np.asarray(ours, np.float64)
    scale = max(float(np.max(np.abs(ref))), floor, 1e-30)
    err = float(np.max(np.abs(ours - ref))) if ref.size else 0.0
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:g} * {scale:.3g}"


@pytest.mark.filterwarnings("ignore:tb_gradmom.*training mode")
@pytest.mark.filterwarnings("ignore:tb_gradmom. no exact rule")
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_moments_match_brute_force(case, dtype):
    variables, grads, moments, ref = _run(case, dtype)
    assert len(moments) == len(variables)
    expected_all = [reference.moments(per_ex, ORDERS) for per_ex in ref]
    # float32: a moment that vanishes (the key bias) is TF's own rounding noise, measured up to
    # 3.3e-7 for M_1 (TensorFlow's gradient itself) against a largest M_1 of 8.75 in the model.
    rel = 1e-3 if dtype == "float64" else 1e-2
    floor = {p: rel * max(float(np.max(np.abs(e[p]))) for e in expected_all) for p in ORDERS}
    for v, g, m, per_ex, expected in zip(variables, grads, moments, ref, expected_all):
        name = variable_name(v)
        assert set(m) == set(ORDERS)
        # moments follow the variable's dtype (LoRA adapters are float32 in a float64 model)
        vdtype = "float64" if tf.as_dtype(v.dtype) == tf.float64 else "float32"
        for p in ORDERS:
            assert m[p].dtype == tf.as_dtype(vdtype)
            _assert_close(m[p], expected[p], TOLERANCE[vdtype], f"{case.id} {name} M{p}", floor[p])
        # grads are those of the loss as given (of the mean for a vector loss)
        scale = per_ex.shape[0] if case.loss == "sum" else 1
        # IndexedSlices for gathers, as tf.gradients gives them
        g = tf.convert_to_tensor(g)
        _assert_close(
            g, expected[1] * scale, TOLERANCE[vdtype], f"{case.id} {name} grad", floor[1] * scale
        )


@pytest.mark.parametrize(
    "case_id",
    [
        "conv2d-stride2-same",
        "depthwise-conv2d-stride2-same",
        "dense-sequence",
        "layer-used-twice",
        "mlp",
        "embedding-tied-output",
        "transformer-encoder-block",
        "bert-broadcast-position",
        "token-and-position-batch-ne-seq",
        "swin-windows",
        "lora-dense-sequence",
        "vit-class-token-position-ids",
    ],
)
def test_dynamic_batch_and_small_chunks(case_id):
    """Unknown batch size at trace time, and chunks smaller than the batch (a while loop)."""
    case = CASES_BY_ID[case_id]
    variables, _, moments, ref = _run(case, "float64", dynamic_batch=True, chunk_size=2)
    expected_all = [reference.moments(per_ex, ORDERS) for per_ex in ref]
    floor = {p: 1e-3 * max(float(np.max(np.abs(e[p]))) for e in expected_all) for p in ORDERS}
    for v, m, expected in zip(variables, moments, expected_all):
        tol = 1e-10 if tf.as_dtype(v.dtype) == tf.float64 else TOLERANCE["float32"]  # LoRA: f32
        for p in ORDERS:
            _assert_close(m[p], expected[p], tol, f"{case_id} {v.path} M{p}", floor[p])


@pytest.mark.parametrize(
    "case_id",
    ["conv2d-stride2-same", "depthwise-conv2d-stride2-same", "layer-used-twice", "dense-sequence"],
)
@pytest.mark.parametrize("chunk_size", [2, 3])
def test_static_batch_unrolled_chunks(case_id, chunk_size):
    """A static batch bigger than the chunk: chunks unrolled (uneven ones with 3), no loop."""
    case = CASES_BY_ID[case_id]
    variables, _, moments, ref = _run(case, "float64", chunk_size=chunk_size)
    for v, m, per_ex in zip(variables, moments, ref):
        expected = reference.moments(per_ex, ORDERS)
        for p in ORDERS:
            _assert_close(m[p], expected[p], 1e-10, f"{case_id} {v.path} M{p}")


@pytest.mark.parametrize("case_id", ["conv2d-stride2-same", "conv3d-stride2-same", "conv2d-valid"])
@pytest.mark.parametrize("per_product", [1, 2, 4, 100])
def test_conv_offsets_in_products_of_any_size(case_id, per_product, monkeypatch):
    """A convolution's power sums with its kernel offsets in batched products of 1, 2, 4 or all
    of them (the last product shorter when the count does not divide the offsets)."""
    from tb_gradmom.core.rules import conv

    monkeypatch.setattr(conv, "_NATIVE_MAX_EXAMPLES", 0)  # the products, not `native_sums`
    monkeypatch.setattr(conv, "_offsets_per_product", lambda n_off, *_: min(per_product, n_off))
    case = CASES_BY_ID[case_id]
    variables, grads, moments, ref = _run(case, "float64")
    for v, g, m, per_ex in zip(variables, grads, moments, ref):
        expected = reference.moments(per_ex, ORDERS)
        _assert_close(g, expected[1], 1e-10, f"{case_id} {v.path} grad")
        for p in ORDERS:
            _assert_close(m[p], expected[p], 1e-10, f"{case_id} {v.path} M{p}")


_NATIVE_CASES = [
    "conv1d-valid",
    "conv1d-stride2-same",
    "conv2d-valid",
    "conv2d-stride2-same",
    "conv2d-stride21-valid",
    "conv1d-transpose-stride2-same",
    "conv2d-transpose-stride2-valid",
    "subclassed-conv",
]


def _filter_gradient_ops(case, dtype, **kwargs):
    """The library's `Conv2DBackpropFilter` ops in the moments step of ``case``."""
    forward, variables = case.build(dtype)
    x, y = case.inputs(np.random.default_rng(0), dtype)

    def step(x, y):
        loss = _loss(case, forward(x), y)
        reduction = case.loss if case.loss != "vector" else "mean"
        return gradmom.gradients_and_moments(
            loss, variables, orders=ORDERS, reduction=reduction, **kwargs
        )

    graph = tf.function(step).get_concrete_function(tf.constant(x), tf.constant(y)).graph
    graphs, ops = [graph], []
    while graphs:  # the step's graph and the functions it calls (loops, conditions)
        g = graphs.pop()
        graphs += [f.graph for f in g._functions.values() if hasattr(f, "graph")]
        ops += [o for o in g.get_operations() if o.type == "Conv2DBackpropFilter"]
    # the library's, not the backward pass's own
    return [o for o in ops if "gradients_and_moments" in o.name and "/gradients/" not in o.name]


@pytest.mark.parametrize("case_id", _NATIVE_CASES)
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_conv_native_per_example_filter_gradients(case_id, chunk_size):
    """A 2-D convolution's power sums from one TF filter gradient per example (`native_sums`):
    exact against brute force, orders 1-4, in one chunk or in unrolled chunks of 3, strides,
    padding (SAME, VALID) and transposed convolutions included; and the path is taken (one
    `Conv2DBackpropFilter` per example and filter). A dilated convolution arrives as
    ``SpaceToBatchND`` and keeps the im2col path."""
    case = CASES_BY_ID[case_id]
    kwargs = {} if chunk_size is None else {"chunk_size": chunk_size}
    variables, grads, moments, ref = _run(case, "float64", **kwargs)
    n = case.inputs(np.random.default_rng(0), "float64")[0].shape[0]
    for v, g, m, per_ex in zip(variables, grads, moments, ref):
        expected = reference.moments(per_ex, ORDERS)
        # the gradient of a sum of the per-example losses is n times their mean
        gradient = expected[1] * (n if case.loss == "sum" else 1)
        _assert_close(g, gradient, 1e-10, f"{case_id} {v.path} grad")
        for p in ORDERS:
            _assert_close(m[p], expected[p], 1e-10, f"{case_id} {v.path} M{p}")
    ops = _filter_gradient_ops(case, "float64", **kwargs)
    assert len(ops) >= n, f"{case_id}: {len(ops)} per-example filter gradients for {n} examples"
    assert all(op.inputs[0].shape[0] == 1 for op in ops)


def test_conv_native_path_limits(monkeypatch):
    """Above `_NATIVE_MAX_EXAMPLES` examples, or with a batch unknown at trace time, the
    offsets' products (a bounded number of ops), exact all the same."""
    from tb_gradmom.core.rules import conv

    case = CASES_BY_ID["conv2d-stride2-same"]
    assert _filter_gradient_ops(case, "float64")
    for variant in ("limit", "dynamic"):
        with monkeypatch.context() as mp:
            kwargs = {}
            if variant == "limit":
                mp.setattr(conv, "_NATIVE_MAX_EXAMPLES", 2)
                assert not _filter_gradient_ops(case, "float64")
            else:
                kwargs["dynamic_batch"] = True
            variables, grads, moments, ref = _run(case, "float64", **kwargs)
        for v, g, m, per_ex in zip(variables, grads, moments, ref):
            expected = reference.moments(per_ex, ORDERS)
            _assert_close(g, expected[1], 1e-10, f"{variant} {v.path} grad")
            for p in ORDERS:
                _assert_close(m[p], expected[p], 1e-10, f"{variant} {v.path} M{p}")


def test_conv_dilated_kernel_keeps_the_offsets_products():
    """A raw ``tf.nn.conv2d`` with ``dilations=2`` (Keras' dilated Conv2D arrives as
    SpaceToBatchND instead): TF's CPU ``Conv2DBackpropFilter`` has no dilation, so the native
    per-example path must not take it. Exact, orders 1-3, against per-example tapes of the same
    function as ``tf.nn.atrous_conv2d``."""
    rng = np.random.default_rng(5)
    x = tf.constant(rng.normal(size=(5, 11, 11, 3)))
    w = tf.Variable(rng.normal(size=(3, 3, 3, 4)))

    def per_example_losses(xb):
        z = tf.nn.conv2d(xb, w, strides=1, padding="SAME", dilations=2)
        return tf.reduce_sum(tf.tanh(z) ** 2, axis=[1, 2, 3])

    @tf.function
    def step(x):
        loss = tf.reduce_mean(per_example_losses(x))
        return gradmom.gradients_and_moments(loss, [w], orders=(1, 2, 3))[1][0]

    moments = step(x)
    per_ex = []
    for j in range(5):  # the same function by SpaceToBatchND, which TF can differentiate on CPU
        with tf.GradientTape() as tape:
            z = tf.nn.atrous_conv2d(x[j : j + 1], w, rate=2, padding="SAME")
            loss = tf.reduce_sum(tf.tanh(z) ** 2)
        per_ex.append(tape.gradient(loss, w).numpy())
    expected = reference.moments(np.stack(per_ex), (1, 2, 3))
    for p in (1, 2, 3):
        _assert_close(moments[p], expected[p], 1e-10, f"dilated conv2d M{p}")


def test_conv_offsets_per_product_fit_the_chunk_memory():
    """As many offsets per product as the memory the chunks were sized for allows."""
    from tb_gradmom.core.rules.conv import _offsets_per_product

    # ResNet50's 7x7 stem at 64x64, batch 16: 1024 positions, 3 -> 64 channels, one chunk of
    # the 8M-element budget: all 49 offsets in one product (5.0M elements)
    one = 2 * (1024 * 3 + 3 * 64)  # elements per example with one offset per product
    chunk = (1 << 23) // one
    assert _offsets_per_product(49, 16, chunk * one, 1024, 3, 64) == 49
    # batch 32: 49 offsets would be 9.9M; 24 per product, two in flight, are 9.7M > 8.4M, 20
    # are 8.1M
    k = _offsets_per_product(49, 32, chunk * one, 1024, 3, 64)
    assert k == 20
    assert 32 * 2 * k * (2 * 1024 * 3 + 3 * 64) <= chunk * one
    # a 3x3 conv of 512 -> 512 channels on 2x2 positions, chunks of 15 of a batch of 16 (two
    # chunks of 8): one offset per product, as before
    one = 2 * (4 * 512 + 512 * 512)
    assert _offsets_per_product(9, 8, 15 * one, 4, 512, 512) == 1
    # a budget that fits every offset in one product (one in flight)
    assert _offsets_per_product(9, 4, 10**9, 4, 8, 8) == 9


def test_old_tf1_conv_rule_counterexample():
    """The counter-example of docs/math.md: two positions, inputs [1, 1], output gradients [1, -1].

    The true per-example filter gradient is 0, so its square is 0; raising patches and output
    gradients to the power first (the TF1 rule) gives 2.
    """
    w = tf.Variable(tf.ones([1, 1, 1, 1], tf.float64))

    @tf.function
    def step(x):
        z = tf.nn.conv2d(x, w, strides=1, padding="VALID")
        c = tf.constant([[[[1.0], [-1.0]]]], tf.float64)  # dl/dz at the two positions
        loss = tf.reduce_sum(z * c)
        return gradmom.gradients_and_moments(loss, [w], orders=(2,), reduction="sum")[1]

    m2 = step(tf.ones([1, 1, 2, 1], tf.float64))[0][2].numpy()
    np.testing.assert_allclose(m2, 0.0, atol=1e-12)


def test_tf1_session_graph():
    case = CASES_BY_ID["mlp"]
    rng = np.random.default_rng(0)
    x_np, y_np = case.inputs(rng, "float64")
    graph = tf.Graph()
    with graph.as_default():
        w1 = tf.compat.v1.get_variable("w1", initializer=rng.normal(size=(4, 6)), use_resource=True)
        w2 = tf.compat.v1.get_variable("w2", initializer=rng.normal(size=(6, 3)), use_resource=True)
        x = tf.compat.v1.placeholder(tf.float64, [None, 4])
        y = tf.compat.v1.placeholder(tf.float64, [None, 3])
        # A second, unrelated read of w1 that is not on the loss's path.
        _ = tf.reduce_sum(w1.read_value())
        out = tf.matmul(tf.tanh(tf.matmul(x, w1)), w2)
        loss = tf.reduce_mean(squared_error(out, y))
        grads, moments = gradmom.gradients_and_moments(loss, [w1, w2], orders=ORDERS)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got = sess.run(moments, {x: x_np, y: y_np})
            w1_np, w2_np = sess.run([w1, w2])
    # Reference in numpy: per-example gradients of the same two-layer net.
    h = np.tanh(x_np @ w1_np)
    out_np = h @ w2_np
    d_out = out_np - y_np  # [n, 3], per-example dl/dout
    g2 = np.einsum("ni,no->nio", h, d_out)
    d_h = (d_out @ w2_np.T) * (1 - h**2)
    g1 = np.einsum("ni,no->nio", x_np, d_h)
    for p in ORDERS:
        np.testing.assert_allclose(got[0][p], np.mean(g1**p, 0), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got[1][p], np.mean(g2**p, 0), rtol=1e-9, atol=1e-12)


def test_eager_call_raises_with_advice():
    v = tf.Variable([1.0])
    with pytest.raises(RuntimeError, match=r"inside a tf\.function"):
        gradmom.gradients_and_moments(tf.reduce_sum(v), [v])


def test_unsupported_op_names_variable_op_and_supported_list():
    # A fused batch norm (several outputs) in inference mode: no rule, and the masked VJP
    # (any single-output op) does not apply either.
    w = tf.Variable(tf.ones([3]), name="odd_kernel")

    @tf.function
    def step(x):
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            x, w, tf.zeros([3]), mean=tf.zeros([3]), variance=tf.ones([3]), is_training=False
        )
        loss = tf.reduce_mean(tf.reduce_sum(tf.square(y), axis=[1, 2, 3]))
        return gradmom.gradients_and_moments(loss, [w], fallback="error")

    with pytest.raises(gradmom.UnsupportedOpError) as info:
        step(tf.ones([4, 2, 2, 3]))
    msg = str(info.value)
    assert "'odd_kernel'" in msg
    assert "FusedBatchNorm" in msg and "op '" in msg
    assert "Supported ops:" in msg and "MatMul" in msg and "Conv2D" in msg
    assert "fallback='exact'" in msg


def test_fallback_warns_once_per_trace_naming_variables_and_ops():
    w = tf.Variable(tf.ones([3]), name="wavy")
    v = tf.Variable(tf.ones([3]), name="plain_bias")

    def step(x):
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            x, w, tf.zeros([3]), mean=tf.zeros([3]), variance=tf.ones([3]), is_training=False
        )
        loss = tf.reduce_mean(tf.reduce_sum(tf.square(y) + v, axis=[1, 2, 3]))
        return gradmom.gradients_and_moments(loss, [w, v])[1]

    def twice(x):  # two calls in one step (one trace): one warning
        return step(x), step(x)

    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = tf.function(twice)
        traced(tf.ones([4, 2, 2, 3]))
        traced(tf.ones([4, 2, 2, 3]))  # the same trace runs again: nothing new to say
        tf.function(step)(tf.ones([4, 2, 2, 3]))  # another trace (another model): told again
    msgs = [str(c.message) for c in caught if "no exact rule" in str(c.message)]
    assert len(msgs) == 2, msgs
    assert "'wavy' (FusedBatchNormV3 op '" in msgs[0] and "plain_bias" not in msgs[0]
    assert "fallback='error'" in msgs[0]


@pytest.mark.filterwarnings("ignore:tb_gradmom. no exact rule")
def test_fallback_on_a_statically_empty_batch():
    """A batch of static size 0 has no chunk to vectorise: the fallback's sums are zeros (it
    used to return None and fail with a TypeError), as a rule's are."""
    w = tf.Variable(tf.ones([3]), name="wavy")
    v = tf.Variable(tf.ones([3]), name="plain_bias")

    @tf.function
    def step(x):
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            x, w, tf.zeros([3]), mean=tf.zeros([3]), variance=tf.ones([3]), is_training=False
        )
        loss = tf.reduce_mean(tf.reduce_sum(tf.square(y) + v, axis=[1, 2, 3]))
        return gradmom.gradients_and_moments(loss, [w, v])

    grads, moments = step(tf.ones([0, 2, 2, 3]))
    for g, m in zip(grads, moments):
        np.testing.assert_array_equal(g.numpy(), np.zeros(3))
        np.testing.assert_array_equal(m[1].numpy(), np.zeros(3))
        assert m[2].shape == (3,)


@pytest.mark.filterwarnings("ignore:tb_gradmom. no exact rule")
@pytest.mark.parametrize(
    "make_loss, op",
    [
        (lambda per_example: tf.reduce_max(per_example), "Max"),
        (lambda per_example: tf.sqrt(tf.reduce_mean(per_example)), "Sqrt"),
        (lambda per_example: tf.norm(per_example), "Sqrt"),
        (lambda per_example: tf.reduce_prod(per_example), "Prod"),
        (lambda per_example: tf.reduce_mean(per_example - tf.reduce_mean(per_example)) ** 2, "Pow"),
        (lambda per_example: tf.reduce_sum(tf.reduce_max(per_example[:, None], axis=0)), "Max"),
    ],
    ids=["max", "sqrt-of-mean", "norm", "product", "square-of-mean", "sum-of-max-over-batch"],
)
def test_loss_that_is_not_a_mean_or_sum_is_refused(make_loss, op):
    """With a rule (MatMul) or the fallback (Pow), a loss that is not a mean or a sum of
    per-example losses raises, naming the op and the vector to pass: never a wrong number."""
    w = tf.Variable(tf.ones([3, 2]), name="wavy")
    v = tf.Variable(tf.ones([3]), name="powered")

    @tf.function
    def step(x):
        per_example = tf.reduce_sum(tf.matmul(x, w) ** 2, axis=1)
        per_example += tf.reduce_sum(tf.pow(tf.abs(x) + 1.0, v), axis=1)
        return gradmom.gradients_and_moments(make_loss(per_example), [w, v])

    with pytest.raises(gradmom.PerExampleLossError) as info:
        step(tf.ones([4, 3]))
    msg = str(info.value)
    assert f"{op})" in msg or f", {op}" in msg, msg
    assert "per-example losses" in msg and "[n] vector" in msg


@pytest.mark.filterwarnings("ignore:tb_gradmom. no exact rule")
class _FusedNorm(tf.Module):
    """An inference-mode fused batch norm on ``[n, 2, 2, 3]`` images: several outputs, no
    rule, so its scale takes the exact fallback (the recurrent layers no longer do)."""

    def __init__(self):
        super().__init__()
        self.scale = tf.Variable(tf.linspace(0.5, 1.5, 3), name="fused_scale")

    def __call__(self, x):
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            x,
            self.scale,
            tf.zeros([3]),
            mean=tf.zeros([3]),
            variance=tf.ones([3]),
            is_training=False,
        )
        return y


def test_fallback_finds_keras_losses_and_adds_regularisation():
    """Keras' sum / size reduction, a loss scale, and an L2 term ``R`` (no examples in it, part
    of every example's loss: ``g_j = grad(l_j + R)``), in front of a variable on the exact
    fallback."""
    import keras

    keras.utils.set_random_seed(5)
    norm = _FusedNorm()
    head = keras.layers.Dense(2)
    head.build((None, 12))

    def model(x):
        return head(tf.reshape(norm(x), [-1, 12]))

    variables = [norm.scale, *head.trainable_variables]
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 2, 2, 3)).astype("float32")
    y = rng.normal(size=(5, 2)).astype("float32")
    mse = keras.losses.MeanSquaredError()

    def penalty():
        return 0.01 * tf.add_n([tf.reduce_sum(v**2) for v in variables])

    @tf.function
    def step(x, y):
        loss = mse(y, model(x)) * 3.0 + penalty()
        return gradmom.gradients_and_moments(loss, variables, orders=(1, 2))[1]

    with pytest.warns(UserWarning, match="'fused_scale' \\(FusedBatchNormV3"):
        moments = step(x, y)

    def per_example(out, y):
        return 3.0 * tf.reduce_mean(tf.square(out - y), axis=1) + penalty()

    ref = reference.per_example_gradients(model, variables, per_example, x, y)
    for v, m, r in zip(variables, moments, ref):
        expected = reference.moments(r, (1, 2))
        _assert_close(m[1], expected[1], 2e-5, f"{v.name} M1")
        _assert_close(m[2], expected[2], 2e-5, f"{v.name} M2")


def test_disagreeing_batch_evidence_is_an_error():
    w = tf.Variable(tf.ones([3, 2]), name="k")

    @tf.function
    def step(x):
        per_example = tf.reduce_sum(tf.matmul(x, w), axis=1)  # 4 rows
        return gradmom.gradients_and_moments(per_example, [w], batch_size=5)

    with pytest.raises(gradmom.BatchSizeError, match=r"batch_size= says 5.*says 4"):
        step(tf.ones([4, 3]))


def test_dynamic_disagreement_fails_at_run_time():
    w = tf.Variable(tf.ones([3, 2]), name="k")

    @tf.function(input_signature=[tf.TensorSpec([None, 3])])
    def step(x):
        per_example = tf.reduce_sum(tf.matmul(x, w), axis=1)
        return gradmom.gradients_and_moments(per_example, [w], batch_size=5)[1][0][2]

    with pytest.raises(tf.errors.InvalidArgumentError, match="batch size mismatch"):
        step(tf.ones([4, 3]))


def test_bad_arguments():
    w = tf.Variable(tf.ones([3, 2]))

    @tf.function
    def step(orders=(1, 2), reduction="mean", var_list=None, loss_rank=0):
        out = tf.matmul(tf.ones([4, 3]), w)
        loss = tf.reduce_mean(out) if loss_rank == 0 else out
        return gradmom.gradients_and_moments(
            loss, var_list or [w], orders=orders, reduction=reduction
        )

    with pytest.raises(ValueError, match="orders must be integers from 1 to 4"):
        step(orders=(2, 5))
    with pytest.raises(
        ValueError, match=r"reduction must be None \(read from the graph\), 'mean' or 'sum'"
    ):
        step(reduction="avg")
    with pytest.raises(TypeError, match=r"var_list\[0\] is a str"):
        step(var_list=["w"])
    with pytest.raises(ValueError, match=r"scalar or a \[n\] vector"):
        step(loss_rank=2)


def test_variable_not_on_loss_path_gets_zero_moments_and_none_grad():
    w = tf.Variable(tf.ones([3, 2]))
    unused = tf.Variable(tf.ones([2]))

    @tf.function
    def step(x):
        _ = unused * 2.0  # read, but not on the loss's path
        loss = tf.reduce_mean(tf.reduce_sum(tf.matmul(x, w), axis=1))
        return gradmom.gradients_and_moments(loss, [w, unused])

    grads, moments = step(tf.ones([4, 3]))
    assert grads[1] is None
    np.testing.assert_array_equal(moments[1][2].numpy(), np.zeros(2))


def test_variance_helper_unbiased_and_biased():
    g = np.random.default_rng(0).normal(size=(6, 3))
    m = {1: tf.constant(g.mean(0)), 2: tf.constant((g**2).mean(0))}
    np.testing.assert_allclose(gradmom.variance(m, 6).numpy(), g.var(0, ddof=1), rtol=1e-12)
    np.testing.assert_allclose(gradmom.variance(m, 6, unbiased=False).numpy(), g.var(0), rtol=1e-12)
    with pytest.raises(ValueError, match="at least 2 examples"):
        gradmom.variance(m, 1)
    with pytest.raises(ValueError, match="orders 1 and 2"):
        gradmom.variance({1: m[1]}, 6)


def test_import_is_lazy():
    import subprocess
    import sys

    code = "import sys, tb_gradmom; assert 'tensorflow' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_embedding_memory_is_per_token_not_per_vocabulary():
    """No tensor of the moments step holds n * vocab * dim values (nor more than the table)."""
    vocab, dim, n = 50_000, 8, 16
    table = tf.Variable(tf.random.normal([vocab, dim], seed=1), name="table")

    @tf.function
    def step(ids):
        h = tf.reduce_mean(tf.gather(table, ids), axis=1)
        loss = tf.reduce_mean(tf.reduce_sum(tf.square(h), axis=1))
        return gradmom.gradients_and_moments(loss, [table], orders=(1, 2, 3, 4))[1]

    ids = tf.constant(np.random.default_rng(0).integers(0, vocab, size=(n, 6)), tf.int32)
    graph = step.get_concrete_function(ids).graph
    biggest = max(
        (t.shape.num_elements() or 0)
        for op in graph.get_operations()
        for t in op.outputs
        if t.shape.is_fully_defined()
    )
    assert biggest <= vocab * dim
    moments = step(ids)[0]
    # Brute force on the rows the batch touches: per example, rows sum their repeated ids.
    ids_np = ids.numpy()
    h = table.numpy()[ids_np].mean(axis=1)  # [n, dim]
    g = np.zeros((n, vocab, dim))
    for j in range(n):
        for t in range(ids_np.shape[1]):
            g[j, ids_np[j, t]] += 2 * h[j] / ids_np.shape[1]
    touched = np.unique(ids_np)
    for p in (1, 2, 3, 4):
        want = (g[:, touched] ** p).mean(axis=0)
        np.testing.assert_allclose(moments[p].numpy()[touched], want, rtol=2e-4, atol=1e-12)


def test_warnings_about_many_variables_name_a_few_and_count_the_rest():
    """A warning about a big model's normalisation layers (ResNet50 in training mode: 106
    variables) names at most `plan.LISTED` variables and counts the rest; the listing helper
    too. Nine Dense -> BatchNormalization (training) blocks: each normalisation's statistics
    couple the examples after the scale and offset of every normalisation before it, whose
    variables take the exact fallback; the last one's keep their rules."""
    import warnings

    import keras

    from tb_gradmom.core import plan as plan_lib

    assert plan_lib.listing(["a", "b"]) == "a, b"
    items = [f"v{i}" for i in range(plan_lib.LISTED + 3)]
    assert plan_lib.listing(items, sep="; ") == "; ".join(items[: plan_lib.LISTED]) + " and 3 more"

    keras.utils.set_random_seed(1)
    layers = []
    for i in range(plan_lib.LISTED + 1):
        layers += [
            keras.layers.Dense(3, name=f"d{i}"),
            keras.layers.BatchNormalization(name=f"bn{i}"),
        ]
    model = keras.Sequential([keras.Input((3,)), *layers], name="net")
    bns = [
        v
        for layer in model.layers
        if layer.name.startswith("bn")
        for v in layer.trainable_variables
    ]
    x = tf.constant(np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32))
    seen = {}

    @tf.function
    def step(x):
        loss = tf.reduce_mean(tf.square(model(x, training=True)))
        seen["paths"] = [v.path for v in gradmom.plan_moments(loss, bns).variables]
        return gradmom.gradients_and_moments(loss, bns)[1]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step(x)
    n = plan_lib.LISTED + 1
    paths = seen["paths"]
    assert all(p.startswith("fallback: the examples are coupled") for p in paths[:-2]), paths
    assert all(p.startswith("rule") for p in paths[-2:]), paths
    (message,) = [str(w.message) for w in caught if "no exact rule" in str(w.message)]
    coupled = 2 * (n - 1)
    assert "'net/bn0/gamma' (the examples are coupled after its use, by " in message, message
    assert f" and {coupled - plan_lib.LISTED} more (gradmom.plan_moments" in message, message
    assert "net/bn4/gamma" not in message and "net/bn8" not in message, message
    assert len(message) < 2000, len(message)


def test_batchnorm_training_layers_before_it_take_the_exact_fallback():
    """Dense -> BatchNorm (training) -> Dense. Every example's loss depends on the other
    examples' rows of the first Dense's output through the batch statistics: its variables
    take the exact fallback (rows of the jacobian of the per-example losses), with a warning
    per trace naming them and the normalisation's op; gamma, beta and the last Dense keep their
    rules (the statistics come before them and are held fixed, as in their gradient). All
    exact against the jacobian."""
    import warnings

    import keras

    keras.utils.set_random_seed(7)
    first = keras.layers.Dense(4, dtype="float64")
    bn = keras.layers.BatchNormalization(
        dtype="float64", gamma_initializer="random_normal", beta_initializer="random_normal"
    )
    last = keras.layers.Dense(2, activation="tanh", dtype="float64")
    rng = np.random.default_rng(3)
    x = tf.constant(rng.normal(size=(6, 3)))
    y = tf.constant(rng.normal(size=(6, 2)))
    forward = lambda x: last(bn(first(x), training=True))  # noqa: E731
    forward(x)
    variables = first.trainable_variables + bn.trainable_variables + last.trainable_variables
    seen = {}

    @tf.function
    def step(x, y):
        loss = tf.reduce_mean(squared_error(forward(x), y))
        seen["paths"] = [v.path for v in gradmom.plan_moments(loss, variables).variables]
        return gradmom.gradients_and_moments(loss, variables, orders=(1, 2, 3))[1]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        moments = step(x, y)
    (message,) = [str(w.message) for w in caught if "tb_gradmom" in str(w.message)]
    assert "no exact rule for " in message and "kernel' (the examples are coupled" in message
    assert "op 'batch_normalization" in message and "gamma" not in message, message
    paths = seen["paths"]
    assert [p.split(":")[0] for p in paths] == ["fallback"] * 2 + ["rule"] * 4, paths

    per_ex = reference.per_example_jacobian(forward, variables, squared_error, x.numpy(), y.numpy())
    expected_all = [reference.moments(g, (1, 2, 3)) for g in per_ex]
    # The bias before the normalisation has a zero gradient (the batch mean removes it).
    floor = {p: 1e-6 * max(float(np.max(np.abs(e[p]))) for e in expected_all) for p in (1, 2, 3)}
    for v, m, expected in zip(variables, moments, expected_all):
        for p in (1, 2, 3):
            _assert_close(m[p], expected[p], 1e-10, f"{v.path} M{p}", floor[p])


@pytest.mark.parametrize(
    "case_id",
    [
        "token-and-position-batch-eq-seq",
        "token-and-position-batch-1",
        "bert-broadcast-position-batch-eq-seq",
        "vit-class-token-position-ids",
        "swin-windows-batch-eq-windows",
        "lora-dense",
        "lora-dense-sequence",
        "lora-einsum-dense",
        "prelu-weight-norm",
        "param-operands",
        "param-operands-batch-eq-rows",
        "custom-ops-fallback",
        "dense-sequence-token-cross-entropy",
        "view-used-twice-by-one-op",
    ],
)
def test_architecture_cases_take_exact_rules(case_id):
    """Position tables, class tokens, windows, LoRA, PReLU, weight norm, ``tf.sin(W)`` and a
    custom gradient: every variable by a rule (derived parameters chained back), no fallback."""
    case = CASES_BY_ID[case_id]
    _run(case, "float64", fallback="error")  # raises UnsupportedOpError on any fallback


def test_embedding_lookup_sparse_is_exact_or_refused():
    """``tf.nn.embedding_lookup_sparse``: the sparse ids' values have no examples' axis (their
    rows are the non-zeros). The result is never a wrong number."""
    rng = np.random.default_rng(3)
    table = tf.Variable(rng.normal(size=(6, 3)), name="table")
    w = tf.Variable(rng.normal(size=(3, 2)), name="w")
    ids = tf.sparse.from_dense(tf.constant([[1, 2, 0], [4, 4, 5], [0, 3, 0], [5, 1, 2]], tf.int64))
    y = tf.constant(rng.normal(size=(4, 2)))

    @tf.function
    def step(sp, y):
        h = tf.nn.embedding_lookup_sparse(table, sp, None, combiner="sum")
        per_example = tf.reduce_sum((tf.matmul(h, w) - y) ** 2, axis=1)
        return gradmom.gradients_and_moments(tf.reduce_mean(per_example), [table, w], orders=(2,))

    try:
        _, moments = step(ids, y)
    except gradmom.GradMomentsError as e:
        assert "table" in str(e) or "loss" in str(e)
        return
    dense = tf.sparse.to_dense(ids).numpy()
    per = []
    for j in range(4):
        with tf.GradientTape() as tape:
            # from_dense dropped the zeros: example j looks up its non-zero ids
            rows = tf.gather(table, [i for i in dense[j] if i != 0])
            h = tf.reduce_sum(rows, axis=0, keepdims=True)
            lj = tf.reduce_sum((tf.matmul(h, w) - y[j : j + 1]) ** 2)
        per.append([tf.convert_to_tensor(g).numpy() for g in tape.gradient(lj, [table, w])])
    for i in range(2):
        ref = np.mean(np.stack([p[i] for p in per]) ** 2, axis=0)
        np.testing.assert_allclose(moments[i][2].numpy(), ref, rtol=1e-9, atol=1e-12)


def test_arguments_are_checked_at_the_call_naming_the_argument():
    """Not rounded, not converted: 2.7 is not an order, True is not a count."""
    w = tf.Variable(tf.ones([3, 2]))

    def make(**kw):
        @tf.function
        def step(x):
            loss = tf.reduce_mean(tf.reduce_sum(tf.matmul(x, w), axis=1))
            return gradmom.gradients_and_moments(loss, [w], **kw)

        return lambda: step(tf.ones([4, 3]))

    with pytest.raises(ValueError, match=r"orders must be integers.*2\.7"):
        make(orders=(2.7,))()
    with pytest.raises(ValueError, match=r"orders must be integers.*True"):
        make(orders=(True,))()
    with pytest.raises(TypeError, match=r"batch_size must be an integer.*8\.0"):
        make(batch_size=8.0)()
    with pytest.raises(ValueError, match=r"batch_size must be a positive integer"):
        make(batch_size=0)()
    with pytest.raises(TypeError, match=r"chunk_size must be a positive integer.*1\.5"):
        make(chunk_size=1.5)()
    with pytest.raises(TypeError, match=r"loss_scale must be a number.*'2'"):
        make(loss_scale="2")()


def test_disconnected_and_integer_variables_warn_once():
    w = tf.Variable(tf.ones([3, 2]), name="used")
    unused = tf.Variable(tf.ones([2]), name="unused")
    counter = tf.Variable(3, name="counter")

    @tf.function
    def step(x):
        loss = tf.reduce_mean(tf.reduce_sum(tf.matmul(x, w), axis=1))
        return gradmom.gradients_and_moments(loss, [w, unused, counter])[1]

    with pytest.warns(
        UserWarning,
        match=r"'unused' \(the loss does not depend on it\).*"
        r"'counter' \(int32, not floating point\)",
    ):
        moments = step(tf.ones([4, 3]))
    np.testing.assert_array_equal(moments[1][2].numpy(), np.zeros([2]))


def test_the_rules_caches_keep_no_graph_alive():
    """The per-graph caches of the rules (shared constants, rearranged operands) hold their
    tensors weakly: a traced step's graph is freed once its function is gone (a strong hold
    kept every traced graph for the life of the process)."""
    import gc
    import weakref

    import keras

    from tb_gradmom.core.rules import base

    def trace():
        model = keras.Sequential([keras.Input((5, 3)), keras.layers.Dense(2)])  # on sequences
        x = tf.constant(np.ones((4, 5, 3), np.float32))

        @tf.function
        def step(x):
            loss = tf.reduce_mean(tf.reduce_sum(model(x) ** 2, axis=[1, 2]))
            return gradmom.gradients_and_moments(loss, model.trainable_variables, orders=(1, 2))

        graph = step.get_concrete_function(x).graph
        assert graph in base._CONSTANTS and graph in base._EXAMPLES_FIRST, "caches unused"
        return weakref.ref(graph)

    ref = trace()
    gc.collect()
    assert ref() is None, "the traced graph is still alive"


def test_the_rules_build_no_idle_ops_and_share_their_constants():
    """The rules' graph holds no reshape that changes nothing, no slice of a whole static
    batch, and one copy of each small constant they ask for, made without control inputs
    (shared, it must not order its users); the moments stay those of brute-force per-example
    gradients. BatchNormalization runs in inference mode: its scale still reaches the batch
    through ``rsqrt(var + eps) * gamma`` (the derived-parameter path), with no coupling."""
    import keras

    rng = np.random.default_rng(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 3), dtype="float64"),
            keras.layers.Conv2D(4, 3, padding="same", dtype="float64"),
            keras.layers.BatchNormalization(dtype="float64"),
            keras.layers.ReLU(dtype="float64"),
            keras.layers.Conv2D(4, 1, dtype="float64"),
            keras.layers.BatchNormalization(dtype="float64"),
            keras.layers.GlobalAveragePooling2D(dtype="float64"),
            keras.layers.Dense(3, dtype="float64"),
        ]
    )
    x_np, y_np = rng.normal(size=(4, 8, 8, 3)), rng.normal(size=(4, 3))
    x, y = tf.constant(x_np), tf.constant(y_np)

    @tf.function
    def step(x, y):
        loss = tf.reduce_mean(squared_error(model(x, training=False), y))
        return gradmom.gradients_and_moments(loss, model.trainable_variables, orders=ORDERS)

    graph = step.get_concrete_function(x, y).graph

    def from_rules(op):
        return any("/tb_gradmom/core/rules/" in frame.filename for frame in op.traceback)

    ours = [op for op in graph.get_operations() if from_rules(op)]
    assert ours, "no op traced back to the rules: the check would see nothing"
    idle = [
        op.name
        for op in ours
        if op.type in ("Reshape", "StridedSlice")
        and op.inputs[0].shape.is_fully_defined()
        and op.inputs[0].shape == op.outputs[0].shape
    ]
    assert idle == [], idle
    values: dict = {}
    for op in ours:
        if op.type != "Const" or op.outputs[0].dtype != tf.int32:
            continue
        assert not op.control_inputs, f"shared constant {op.name} has control inputs"
        key = tf.get_static_value(op.outputs[0]).tobytes() + bytes(op.outputs[0].shape)
        values.setdefault(key, []).append(op.name)
    repeated = {k: v for k, v in values.items() if len(v) > 1}
    assert repeated == {}, repeated
    _, moments = step(x, y)
    variables = model.trainable_variables
    forward = lambda t: model(t, training=False)  # noqa: E731
    ref = reference.per_example_gradients(forward, variables, squared_error, x_np, y_np)
    for v, m, per_ex in zip(variables, moments, ref):
        expected = reference.moments(per_ex, ORDERS)
        for p in ORDERS:
            _assert_close(m[p], expected[p], TOLERANCE["float64"], f"{variable_name(v)} M{p}")
