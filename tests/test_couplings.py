"""Issue 26, causes D-G: views used twice by one op, batch statistics and custom gradients
between a layer and the loss, losses that mix the examples. Never a silent wrong number.

Each model is small and float64; the moments are compared with one gradient per example:
``reference.per_example_gradients`` (each example's loss on its own slice) where nothing
couples the examples, ``reference.per_example_jacobian`` (each example's loss from the batch's
forward pass: the definition ``g_j = d l_j / d theta``) where something does.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom as gradmom
from tests import reference
from tests.cases import squared_error

ORDERS = (1, 2, 3, 4)


def _moments(forward, variables, x, y, *, loss=squared_error, **kwargs):
    """``(plan paths, moments, warnings)`` of ``mean(loss(forward(x), y))`` in one trace."""
    seen = {}

    @tf.function
    def step(x, y):
        total = tf.reduce_mean(loss(forward(x), y))
        plan = gradmom.plan_moments(total, variables, ORDERS, **kwargs)
        seen["paths"] = [v.path for v in plan.variables]
        return gradmom.gradients_and_moments(total, variables, ORDERS, **kwargs)[1]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        moments = step(tf.constant(x), tf.constant(y))
    messages = [str(w.message) for w in caught if "tb_gradmom" in str(w.message)]
    return seen["paths"], moments, messages


def _assert_exact(moments, per_example, what, tol=1e-10, orders=ORDERS):
    for i, (m, g) in enumerate(zip(moments, per_example)):
        expected = reference.moments(g, orders)
        for p in orders:
            ref = expected[p]
            scale = max(float(np.max(np.abs(ref))), 1e-30)
            err = float(np.max(np.abs(np.asarray(m[p]) - ref)))
            assert err <= tol * scale, f"{what}: variable {i} M{p}: error {err:.3g} of {scale:.3g}"


# --- D: one view of a variable at two inputs of one op ---------------------------------------


def _twice(kind):
    rng = np.random.default_rng(1)
    shape = {"identity-mul": (3, 2), "reshape-matmul": (9,), "expm": (3, 3)}[kind]
    s = tf.Variable(rng.normal(size=shape) * 0.5, name="s")

    def kernel():
        if kind == "identity-mul":
            w = tf.identity(s)
            return w * w  # [3, 2]
        if kind == "reshape-matmul":
            r = tf.reshape(s, [3, 3])
            return r @ r
        return tf.linalg.expm(s)

    out = 2 if kind == "identity-mul" else 3
    return (lambda x: tf.tanh(x @ kernel())), [s], (3, out)


@pytest.mark.parametrize("kind", ["identity-mul", "reshape-matmul", "expm"])
def test_a_view_used_at_two_inputs_of_one_op_counts_once(kind):
    """``w * w``, ``r @ r`` (one view, both inputs of one op) and ``expm(S)`` (which squares
    its argument): ``t.consumers()`` lists such an op once per input, and each use was
    counted twice (M_2 at 4x, M_4 at 16x, expm 7.6 % off)."""
    forward, variables, (d_in, d_out) = _twice(kind)
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(5, d_in)), rng.normal(size=(5, d_out))
    paths, moments, _ = _moments(forward, variables, x, y, fallback="error")
    assert all(p.startswith("rule") for p in paths), paths
    ref = reference.per_example_gradients(forward, variables, squared_error, x, y)
    _assert_exact(moments, ref, kind)


# --- E: a batch statistic between a layer and the loss ----------------------------------------


def _dense(units, activation=None, seed=0):
    return keras.layers.Dense(
        units,
        activation=activation,
        dtype="float64",
        kernel_initializer=keras.initializers.RandomNormal(seed=seed),
        bias_initializer=keras.initializers.RandomNormal(seed=seed + 1),
    )


def _bn(**kwargs):
    return keras.layers.BatchNormalization(
        dtype="float64",
        gamma_initializer="random_normal",
        beta_initializer="random_normal",
        **kwargs,
    )


def _minibatch_std(h):
    """StyleGAN's minibatch standard deviation: one statistic over the batch, as a feature."""
    std = tf.reduce_mean(tf.sqrt(tf.math.reduce_variance(h, axis=0) + 1e-3))
    return tf.concat([h, tf.ones_like(h[:, :1]) * std], axis=1)


def _coupled_model(kind):
    """``(forward, layers, coupled, coupler)``: a model with a batch statistic after its first
    layer; ``coupled`` the indices of the variables used before it; ``coupler`` the start of
    the coupling op's description."""
    keras.utils.set_random_seed(3)
    first, last = _dense(4, "tanh", 10), _dense(2, None, 20)
    if kind == "minibatch-std":
        return (
            (lambda x: last(_minibatch_std(first(x)))),
            [first, last],
            {0, 1},
            "ConcatV2 op 'concat",
        )
    if kind == "centred-by-batch-mean":
        middle = lambda h: h - tf.reduce_mean(h, axis=0, keepdims=True)  # noqa: E731
        return (lambda x: last(middle(first(x)))), [first, last], {0, 1}, "Sub op 'sub"
    if kind == "bn-no-center-no-scale":
        bn = _bn(center=False, scale=False)
        return (lambda x: last(bn(first(x), training=True))), [first, last], {0, 1}, "op 'batch_n"
    if kind == "bn-gamma-beta-not-requested":
        bn = _bn()
        return (lambda x: last(bn(first(x), training=True))), [first, last], {0, 1}, "op 'batch_n"
    assert kind == "stacked-bn"
    bn1, mid, bn2 = _bn(), _dense(3, "tanh", 30), _bn()

    def forward(x):
        return last(bn2(mid(bn1(first(x), training=True)), training=True))

    # the first normalisation's scale and offset feed the second one's statistics
    return forward, [first, bn1, mid, bn2, last], {0, 1, 2, 3, 4, 5}, "op 'batch_n"


_KINDS = [
    "minibatch-std",
    "centred-by-batch-mean",
    "bn-no-center-no-scale",
    "bn-gamma-beta-not-requested",
    "stacked-bn",
]


def _build(kind, x):
    forward, layers, coupled, coupler = _coupled_model(kind)
    forward(x)
    variables = [v for layer in layers for v in layer.trainable_variables]
    return forward, variables, coupled, coupler


@pytest.mark.parametrize("kind", _KINDS)
def test_a_batch_statistic_after_a_layer_takes_the_exact_fallback(kind):
    """Every variable used before a batch statistic that re-enters the examples gets
    ``d l_j / d theta`` through the batch's forward pass (the jacobian rows, by the exact
    fallback), whatever the variables requested; the ones after it keep their rules; the
    warning names the op. Before: no warning, 2 % to 20x off."""
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    forward, variables, coupled, coupler = _build(kind, x)
    paths, moments, messages = _moments(forward, variables, x, y)
    ref = reference.per_example_jacobian(forward, variables, squared_error, x, y)
    _assert_exact(moments, ref, kind)
    for i, path in enumerate(paths):
        if i in coupled:
            assert path.startswith("fallback: the examples are coupled after its use, by "), path
            assert coupler in path and "a batch statistic into the examples" in path, path
        else:
            assert path.startswith("rule"), (i, path)
    (message,) = [m for m in messages if "no exact rule" in m]
    assert coupler in message, message


def test_a_coupled_variable_with_fallback_error_raises_naming_the_op():
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    forward, variables, _, _ = _build("centred-by-batch-mean", x)
    with pytest.raises(gradmom.UnsupportedOpError) as info:
        _moments(forward, variables, x, y, fallback="error")
    msg = str(info.value)
    assert "variable '" in msg and "kernel' is used before Sub op '" in msg, msg
    assert "couples the examples" in msg and "fallback='exact'" in msg, msg


# --- F: losses that mix the examples; warnings per trace -----------------------------------


def _contrastive():
    """CLIP's loss: image and text embeddings of the same examples, logits ``img @ txt^T``
    ``[n, n]``, cross-entropy of each row and each column against the diagonal."""
    keras.utils.set_random_seed(6)
    img, txt = _dense(3, None, 40), _dense(3, None, 50)

    def per_example(x):  # x: [n, 5] image features 0:2, text features 2:5
        logits = tf.matmul(img(x[:, :2]), txt(x[:, 2:]), transpose_b=True)
        labels = tf.range(tf.shape(x)[0])
        rows = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        cols = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, tf.transpose(logits))
        return 0.5 * (rows + cols)

    return per_example, [img, txt]


@pytest.mark.parametrize("vector", [False, True], ids=["mean", "vector"])
def test_a_contrastive_loss_over_the_batch_raises(vector):
    """Each entry of CLIP's logits depends on an image and a text of two examples: there is
    no per-example gradient to take moments of. Before: a warning that hedged, every layer on
    its rule, 28 % to 4.7x off."""
    per_example, layers = _contrastive()
    x = tf.constant(np.random.default_rng(7).normal(size=(4, 5)))
    per_example(x)
    variables = [v for layer in layers for v in layer.trainable_variables]

    @tf.function
    def step(x):
        losses = per_example(x)
        return gradmom.gradients_and_moments(
            losses if vector else tf.reduce_mean(losses), variables
        )

    with pytest.raises(gradmom.PerExampleLossError) as info:
        step(x)
    msg = str(info.value)
    assert "mix the examples: MatMul op '" in msg, msg
    assert "hold the examples" in msg and "contrastive" in msg, msg
    assert "per-example terms" in msg and "[n] vector" in msg, msg


def _prototypes(m):
    """A prototypical network: queries ``x [n, 3]`` scored by their squared distances to the
    embeddings of a support set ``s [m, 3]``, a second input of the step."""
    keras.utils.set_random_seed(8)
    embed = _dense(2, "tanh", 60)
    embed(tf.zeros([1, 3], tf.float64))
    rng = np.random.default_rng(9)
    support = rng.normal(size=(m, 3))
    labels = rng.integers(0, m, size=5)

    def per_example(q, s):
        d = tf.reduce_sum(tf.square(embed(q)[:, None, :] - embed(s)[None, :, :]), axis=-1)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels, -d)

    return per_example, embed.trainable_variables, support


def test_prototypes_against_a_support_set_of_the_batch_size_raise():
    """Support set of the batch's size: both inputs are taken to hold the examples, and the
    distances between them mix them; the loss raises instead of running the rules on it."""
    per_example, variables, support = _prototypes(5)
    x = np.random.default_rng(10).normal(size=(5, 3))

    @tf.function
    def step(q, s):
        return gradmom.gradients_and_moments(tf.reduce_mean(per_example(q, s)), variables)

    with pytest.raises(gradmom.PerExampleLossError, match=r"mix the examples: Sub op '"):
        step(tf.constant(x), tf.constant(support))


def test_prototypes_against_a_support_set_of_another_size_are_exact():
    """Support set of another size: the inputs disagree about the batch size, nothing is
    proven, and every variable takes the exact fallback (jacobian rows of the per-query
    losses), with a warning."""
    per_example, variables, support = _prototypes(3)
    x = np.random.default_rng(10).normal(size=(5, 3))
    s = tf.constant(support)
    paths, moments, messages = _moments(
        lambda q: q, variables, x, s, loss=per_example, batch_size=5
    )
    ref = reference.per_example_jacobian(lambda q: q, variables, per_example, x, support)
    _assert_exact(moments, ref, "prototypes")
    assert all(p.startswith("fallback") for p in paths), paths
    assert any("cannot prove where the examples are" in m for m in messages), messages


def _rolled():
    """Each example's loss takes the next example's hidden row too (``tf.roll`` over the
    batch, an op the analysis does not follow): the per-example losses are unproven."""
    keras.utils.set_random_seed(11)
    first, last = _dense(4, "tanh", 70), _dense(2, None, 80)

    def forward(x):
        h = first(x)
        return last(h + 0.5 * tf.roll(h, shift=1, axis=0))

    forward(tf.zeros([2, 3], tf.float64))
    return forward, first.trainable_variables + last.trainable_variables


def test_unproven_per_example_losses_take_the_fallback_and_warn_per_trace():
    """Past an op the analysis cannot follow, every variable whose use reaches the losses takes
    the exact fallback (before: the layers before it kept their rules and came out wrong), and
    the warning is given in every trace of a step (before: once per process)."""
    forward, variables = _rolled()
    rng = np.random.default_rng(12)
    x, y = rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    paths, moments, messages = _moments(forward, variables, x, y)
    ref = reference.per_example_jacobian(forward, variables, squared_error, x, y)
    _assert_exact(moments, ref, "roll")
    assert all(p.startswith("fallback") for p in paths), paths
    (unproven,) = [m for m in messages if "cannot prove where the examples are" in m]
    assert "Roll op '" in unproven, unproven
    # another trace (a new model, or new shapes): told again; the same trace: once
    _, _, again = _moments(forward, variables, x, y)
    assert sum("cannot prove where the examples are" in m for m in again) == 1, again


# --- G: a custom gradient between a layer and the loss ----------------------------------------


@tf.custom_gradient
def _rms_normalised_gradient(h):
    """The identity, whose gradient is divided by the batch's RMS: the backward pass couples
    the examples (and is not linear in ``dy``), the forward pass does not."""

    def grad(dy):
        return dy / tf.sqrt(tf.reduce_mean(tf.square(dy)) + 1e-3)

    return tf.identity(h), grad


@tf.custom_gradient
def _centred_gradient(h):
    """The identity, whose gradient is centred over the batch: linear in ``dy``, coupled."""

    def grad(dy):
        return dy - 0.5 * tf.reduce_mean(dy, axis=0, keepdims=True)

    return tf.identity(h), grad


@tf.custom_gradient
def _scaled_weight(w):
    """A custom gradient on a weight (no examples in it): a derived parameter, kept on its
    rule."""

    def grad(dy):
        return 1.5 * dy

    return tf.identity(w), grad


@pytest.mark.parametrize("kind", ["centred", "rms"])
def test_a_custom_gradient_after_a_layer_takes_the_exact_fallback(kind):
    """A custom gradient that an example-carrying tensor passes through is opaque: the layers
    before it take the exact fallback (which differentiates through the real backward), the
    layers after it and a custom gradient on a weight keep their rules. Before: no warning,
    M_2 2.8x off (``rms``).

    A backward pass that is not linear in its incoming gradient (``rms``) has no per-example
    split whose mean is the batch's gradient: M_1 stays that gradient (what the optimizer
    applies), M_2 to M_4 are those of ``d l_j / d theta`` through the real backward."""
    keras.utils.set_random_seed(13)
    first = _dense(4, "tanh", 90)
    w = tf.Variable(np.random.default_rng(14).normal(size=(4, 2)), name="w")
    custom = {"centred": _centred_gradient, "rms": _rms_normalised_gradient}[kind]

    def forward(x):
        return tf.matmul(custom(first(x)), _scaled_weight(w))

    rng = np.random.default_rng(15)
    x, y = rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    forward(tf.constant(x))
    variables = [*first.trainable_variables, w]
    paths, moments, messages = _moments(forward, variables, x, y)
    ref = reference.per_example_jacobian(forward, variables, squared_error, x, y)
    if kind == "rms":
        with tf.GradientTape() as tape:
            total = tf.reduce_mean(squared_error(forward(tf.constant(x)), tf.constant(y)))
        grads = tape.gradient(total, variables)
        for m, g in zip(moments, grads):
            np.testing.assert_allclose(m[1], g, rtol=1e-10, atol=1e-14)
    orders = ORDERS[1:] if kind == "rms" else ORDERS
    _assert_exact(moments, ref, f"custom gradient {kind}", orders=orders)
    for path in paths[:2]:
        assert "coupled after its use, by IdentityN op '" in path, path
        assert "a custom gradient whose backward pass" in path, path
    assert paths[2] == "rule: MatMul", paths
    assert any("IdentityN op '" in m for m in messages), messages


def test_coupled_variables_the_fallback_cannot_take_keep_their_rules_with_a_warning():
    """A grouped convolution before a batch norm in training mode: the fallback would cross
    the grouped filter gradient, which TensorFlow's vectorisation gets wrong, so the kernel
    keeps its rule (``n * dL/dz_j``, M_1 the gradient) and a warning per trace says so,
    naming the coupler; its bias, whose backward pass does not cross the convolution, takes
    the fallback and is exact."""
    keras.utils.set_random_seed(16)
    conv = keras.layers.Conv2D(4, 1, groups=2, dtype="float64")
    bn, head = _bn(), _dense(2, None, 100)

    def forward(x):
        return head(tf.reshape(bn(tf.tanh(conv(x)), training=True), [-1, 16]))

    rng = np.random.default_rng(17)
    x, y = rng.normal(size=(3, 2, 2, 4)), rng.normal(size=(3, 2))
    forward(tf.constant(x))
    variables = conv.trainable_variables
    paths, moments, messages = _moments(forward, variables, x, y)
    assert paths[0].startswith("rule: StatefulPartitionedCall (the examples are coupled"), paths
    assert paths[1].startswith("fallback: the examples are coupled after its use, by "), paths
    (message,) = [m for m in messages if "the exact fallback cannot run" in m]
    assert f"'{variables[0].path}' (by " in message and "op 'batch_n" in message, message
    assert "grouped convolution" in message and variables[1].path not in message, message
    with tf.GradientTape() as tape:
        total = tf.reduce_mean(squared_error(forward(tf.constant(x)), tf.constant(y)))
    np.testing.assert_allclose(moments[0][1], tape.gradient(total, variables[0]), rtol=1e-10)
    ref = reference.per_example_jacobian(forward, variables[1:], squared_error, x, y)
    _assert_exact(moments[1:], ref, "bias")


@tf.custom_gradient
def _straight_through_clip(h):
    """Clips to [-1, 1]; the gradient passes where ``|h| < 1.2`` (per entry, linear in dy)."""

    def grad(dy):
        return tf.where(tf.abs(h) < 1.2, dy, tf.zeros_like(dy))

    return tf.clip_by_value(h, -1.0, 1.0), grad


@pytest.mark.parametrize("kind", ["silu", "straight-through"])
def test_a_custom_gradient_that_keeps_the_examples_apart_keeps_the_rules(kind):
    """TensorFlow's own ``tf.nn.silu`` (Llama's and EfficientNet's activation) is a custom
    gradient, as is a straight-through estimator: their backward passes, traced on their own,
    map each example's output gradient to its input gradient linearly, so every layer keeps
    its rule (``fallback="error"``) and is exact against per-example tapes."""
    keras.utils.set_random_seed(18)
    first, last = _dense(4, None, 110), _dense(2, None, 120)
    act = {"silu": tf.nn.silu, "straight-through": _straight_through_clip}[kind]

    def forward(x):
        return last(act(2.0 * first(x)))

    rng = np.random.default_rng(19)
    x, y = rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    forward(tf.constant(x))
    variables = first.trainable_variables + last.trainable_variables
    paths, moments, _ = _moments(forward, variables, x, y, fallback="error")
    assert all(p.startswith("rule") for p in paths), paths
    ref = reference.per_example_gradients(forward, variables, squared_error, x, y)
    _assert_exact(moments, ref, kind)
