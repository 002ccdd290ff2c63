"""Loss forms the per-example split must read right (issue 26, causes A-C), against brute force.

A. A factor of the per-example losses holds no example: ``c * batch_statistic`` and
   ``mean(l) * mean(h)`` are refused (`PerExampleLossError` naming the op and the term), on
   whichever side the constant stands; a count no gradient flows through still divides.
B. An example-free term ``R`` of the loss (a weight penalty) is part of every example's loss:
   ``g_j = grad(l_j + R)`` for a mean loss, ``grad(l_j + R / n)`` for a sum, so ``M_1`` is the
   gradient and ``M_2 - M_1**2`` the variance of the per-example gradients; the variable keeps
   its rule.
C. Keras' loss total ``ops.sum([loss, *model.losses])`` (``Sum(Pack(...))``), ``tf.add_n`` and
   nested forms are sums of terms.

Every case is float64 and small; the reference takes one gradient per example
(`tests.reference`) of the per-example loss the definition names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom as gradmom
from tests import reference

ORDERS = (1, 2, 3, 4)
N, D, K = 5, 3, 2


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(N, D)), rng.normal(size=(N, K))


def _variables(seed: int = 1):
    rng = np.random.default_rng(seed)
    w = tf.Variable(rng.normal(size=(D, K)), name="w")
    v = tf.Variable(rng.normal(size=(D, 1)), name="v")
    return w, v


def _per_example(w):
    """``l_j = 0.5 * |tanh(x_j W) - y_j|^2``: ``[n]``."""

    def loss(out, y):
        return 0.5 * tf.reduce_sum(tf.square(out - y), axis=1)

    def forward(x):
        return tf.tanh(x @ w)

    return forward, loss


def _assert_moments(got, want, what: str, rtol: float = 1e-9):
    for p, expected in want.items():
        g = np.asarray(got[p])
        scale = max(float(np.max(np.abs(expected))), 1e-300)
        err = float(np.max(np.abs(g - expected))) / scale
        assert err <= rtol, f"{what} M_{p}: relative error {err:.3g}\n{g}\nvs\n{expected}"


# --- A: a factor holds no example ---------------------------------------------------------------

# (id, loss from (per [n], x, w, v), the op type the message names)
REFUSED = [
    (
        "const-times-square-of-batch-mean",
        lambda per, x, w, v: tf.reduce_mean(per) + 0.5 * tf.square(tf.reduce_mean(tf.tanh(x @ v))),
        "Square",
    ),
    (
        "square-of-batch-mean-times-const",
        lambda per, x, w, v: tf.reduce_mean(per) + tf.square(tf.reduce_mean(tf.tanh(x @ v))) * 0.5,
        "Square",
    ),
    (
        "mean-times-batch-mean",
        lambda per, x, w, v: tf.reduce_mean(per) * tf.reduce_mean(tf.sigmoid(x @ v)),
        "Mul",
    ),
    (
        "batch-mean-times-mean",
        lambda per, x, w, v: tf.reduce_mean(tf.sigmoid(x @ v)) * tf.reduce_mean(per),
        "Mul",
    ),
    (
        "sum-over-batch-statistic",
        lambda per, x, w, v: tf.reduce_sum(per) / tf.reduce_sum(tf.sigmoid(x @ v)),
        "RealDiv",
    ),
    (
        # keras_hub Mixtral/Qwen-MoE: router_aux_loss_coef * load-balancing loss
        "coef-times-load-balancing-loss",
        lambda per, x, w, v: tf.reduce_mean(per) + 0.02 * _load_balancing(x, w),
        "Mul",
    ),
]


def _load_balancing(x, w):
    """A mixture-of-experts load-balancing loss over the batch (Switch Transformer, Mixtral):
    ``E * sum_e f_e * P_e`` with ``f`` the fraction of examples routed to expert ``e`` and ``P``
    the mean router probability: a statistic of the whole batch, through the router ``w``."""
    probs = tf.nn.softmax(x @ w, axis=-1)
    routed = tf.one_hot(tf.argmax(probs, axis=-1), K, dtype=probs.dtype)
    return K * tf.reduce_sum(tf.reduce_mean(routed, axis=0) * tf.reduce_mean(probs, axis=0))


@pytest.mark.parametrize("make_loss, op", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_batch_statistic_is_not_a_constant_factor(make_loss, op):
    """Every form of a batch statistic of the variables times (or dividing) the loss raises,
    naming the op; never a silent number (the first form gave M_1 and M_2 1 % off)."""
    x, y = _data()
    w, v = _variables()
    forward, loss = _per_example(w)

    @tf.function
    def step(x, y):
        total = make_loss(loss(forward(x), y), x, w, v)
        return gradmom.gradients_and_moments(total, [w, v], orders=(1, 2))

    with pytest.raises(gradmom.PerExampleLossError) as info:
        step(x, y)
    msg = str(info.value)
    assert f", {op})" in msg, msg
    assert "[n] vector" in msg and "no per-example split" in msg, msg


def test_a_the_error_names_an_added_term_and_what_to_do():
    """A batch statistic added to the loss (the aux loss of a mixture of experts): the message
    names the term and says to log a loss without it."""
    x, y = _data()
    w, v = _variables()
    forward, loss = _per_example(w)

    @tf.function
    def step(x, y):
        aux = tf.identity(_load_balancing(x, v @ tf.ones([1, K], tf.float64)), name="aux")
        total = tf.reduce_mean(loss(forward(x), y)) + tf.multiply(
            tf.constant(0.01, tf.float64), aux, name="aux_term"
        )
        return gradmom.gradients_and_moments(total, [w, v], orders=(1, 2))

    with pytest.raises(gradmom.PerExampleLossError) as info:
        step(x, y)
    msg = str(info.value)
    assert "its term 'aux_term:0', added to the loss" in msg, msg
    assert "auxiliary loss" in msg and "without that term" in msg, msg


def test_a_a_count_no_gradient_flows_through_still_divides():
    """``sum(l * m) / sum(m)`` with a mask from the labels: the divisor is a batch statistic no
    gradient flows through, a constant for the per-example split (``l_j' = m_j l_j / sum(m)``,
    read as a sum)."""
    x, y = _data()
    w, _ = _variables()
    forward, loss = _per_example(w)
    mask = np.array([1.0, 0.0, 1.0, 1.0, 0.0])

    def per_example(out, yy):
        m = tf.constant(mask)
        return loss(out, yy) * m / tf.reduce_sum(m)

    @tf.function
    def step(x, y, m):
        values = loss(forward(x), y) * m
        return gradmom.gradients_and_moments(
            tf.reduce_sum(values) / tf.reduce_sum(m), [w], orders=ORDERS
        )

    grads, moments = step(x, y, mask)
    ref = reference.per_example_jacobian(forward, [w], per_example, x, y)[0]
    want = reference.moments(ref, ORDERS)
    _assert_moments(moments[0], want, "masked sum")
    np.testing.assert_allclose(grads[0], ref.sum(axis=0), rtol=1e-12)


# --- B: an example-free term is part of every example's loss ------------------------------------


def _mse(out, y):
    """Keras' mean squared error per example: ``[n]``."""
    return tf.reduce_mean(tf.square(out - y), axis=-1)


def _keras_dense(dtype="float64"):
    import keras

    keras.utils.set_random_seed(3)
    inp = keras.Input((D,), dtype=dtype)
    h = keras.layers.Dense(
        4, activation="tanh", kernel_regularizer=keras.regularizers.L2(0.1), dtype=dtype
    )(inp)
    out = keras.layers.Dense(
        K,
        kernel_regularizer=keras.regularizers.L1(0.05),
        bias_regularizer=keras.regularizers.L2(0.2),
        bias_initializer="random_normal",
        dtype=dtype,
    )(h)
    return keras.Model(inp, out)


def _keras_conv():
    import keras

    keras.utils.set_random_seed(4)
    inp = keras.Input((4, 4, 2), dtype="float64")
    h = keras.layers.Conv2D(
        3, 2, activation="tanh", kernel_regularizer=keras.regularizers.L2(0.1), dtype="float64"
    )(inp)
    out = keras.layers.Dense(K, dtype="float64")(keras.layers.Flatten(dtype="float64")(h))
    return keras.Model(inp, out)


@dataclass
class Penalised:
    """A model whose loss has example-free terms: ``total(out, y)`` is the scalar loss,
    ``per_example(out, y)`` the ``[n]`` per-example part, ``penalty()`` the free part ``R``
    (read inside the reference's tape), ``mode`` the reduction, ``ruled`` the variables that
    must keep their rule."""

    forward: Callable
    variables: list
    per_example: Callable
    penalty: Callable
    total: Callable
    mode: str
    ruled: list
    x: np.ndarray
    y: np.ndarray


def _keras_case(make_model, reduction: str, x_shape) -> Callable[[], Penalised]:
    def build() -> Penalised:
        import keras

        model = make_model()
        rng = np.random.default_rng(7)
        x = rng.normal(size=(N, *x_shape))
        y = rng.normal(size=(N, K))
        loss_fn = keras.losses.MeanSquaredError(reduction=reduction, dtype="float64")

        def penalty():
            return tf.add_n(model.losses)

        def total(out, y):
            return loss_fn(y, out) + tf.add_n(model.losses)

        variables = model.trainable_variables
        mode = "sum" if reduction == "sum" else "mean"
        return Penalised(lambda x: model(x), variables, _mse, penalty, total, mode, variables, x, y)

    return build


def _raw_case(kind: str) -> Callable[[], Penalised]:
    """Raw TensorFlow: ``W`` (a matmul), ``b`` (an add) and the penalties of ``kind``."""

    def build() -> Penalised:
        x, y = _data(11)
        rng = np.random.default_rng(12)
        w = tf.Variable(rng.normal(size=(D, K)), name="w")
        b = tf.Variable(rng.normal(size=(K,)), name="b")
        u = tf.Variable(rng.normal(size=(2,)), name="penalty_only")
        s = tf.Variable(0.3, dtype=tf.float64, name="log_sigma")
        g = tf.Variable(rng.uniform(0.5, 1.5, size=(K,)), name="norm_g")

        def kernel():
            if kind == "weight-norm":  # derived: K = g * W / |W|, penalised as well
                # (not tf.norm: its Mul(w, w) is issue 26's cause D, another fix)
                return g * w / tf.sqrt(tf.reduce_sum(tf.square(w), axis=0))
            return w

        def forward(x):
            return tf.tanh(x @ kernel() + b)

        def per_example(out, y):
            scale = tf.exp(-s) if kind == "uncertainty" else 1.0
            return scale * 0.5 * tf.reduce_sum(tf.square(out - y), axis=1)

        def penalty():
            if kind in ("l2-mean", "l2-sum"):
                return 0.1 * tf.nn.l2_loss(w) - 0.05 * tf.reduce_sum(tf.abs(b))
            if kind == "penalty-only":
                return 0.1 * tf.nn.l2_loss(w) + 0.3 * tf.reduce_sum(tf.square(u))
            if kind == "uncertainty":  # exp(-s) * mean(l) + s (multi-task uncertainty weights)
                return s
            return 0.2 * tf.reduce_sum(tf.square(kernel()))  # weight-norm

        def total(out, y):
            per = 0.5 * tf.reduce_sum(tf.square(out - y), axis=1)
            if kind == "l2-sum":
                return tf.reduce_sum(per) + 0.1 * tf.nn.l2_loss(w) - 0.05 * tf.reduce_sum(tf.abs(b))
            if kind == "uncertainty":
                return tf.exp(-s) * tf.reduce_mean(per) + s
            return tf.reduce_mean(per) + penalty()

        variables = {
            "l2-mean": [w, b],
            "l2-sum": [w, b],
            "penalty-only": [w, b, u],
            "uncertainty": [w, b, s],
            "weight-norm": [w, b, g],
        }[kind]
        ruled = [w, b] if kind != "weight-norm" else [w, b, g]
        mode = "sum" if kind == "l2-sum" else "mean"
        return Penalised(forward, variables, per_example, penalty, total, mode, ruled, x, y)

    return build


PENALISED = [
    ("keras-l2-l1-regularizers-mean", _keras_case(_keras_dense, "sum_over_batch_size", (D,))),
    ("keras-l2-l1-regularizers-sum", _keras_case(_keras_dense, "sum", (D,))),
    ("keras-conv-l2-regularizer", _keras_case(_keras_conv, "sum_over_batch_size", (4, 4, 2))),
    ("l2-loss-and-l1-mean", _raw_case("l2-mean")),
    ("l2-loss-and-l1-sum", _raw_case("l2-sum")),
    ("variable-only-in-the-penalty", _raw_case("penalty-only")),
    ("uncertainty-weighting", _raw_case("uncertainty")),
    ("weight-norm-kernel-penalised", _raw_case("weight-norm")),
]


def _reference(case: Penalised, orders=ORDERS):
    """``M_p`` of ``g_j = grad(l_j + R)`` (mean) or ``grad(l_j + R / n)`` (sum), one tape
    gradient per example."""
    n = case.x.shape[0]
    share = 1.0 if case.mode == "mean" else 1.0 / n

    def per_example(out, y):
        return case.per_example(out, y) + share * case.penalty()

    # the tf.Variables behind Keras variables (a tape's zeros need a tf.DType)
    tf_vars = [v if isinstance(v, tf.Variable) else v.value for v in case.variables]
    rows = reference.per_example_gradients(case.forward, tf_vars, per_example, case.x, case.y)
    return [reference.moments(r, orders) for r in rows]


@pytest.mark.filterwarnings("ignore:tb_gradmom. no exact rule")  # log_sigma: the fallback
@pytest.mark.parametrize("build", [c[1] for c in PENALISED], ids=[c[0] for c in PENALISED])
def test_b_penalties_are_part_of_every_examples_loss(build):
    """``M_1`` is the gradient and ``M_2..M_4`` are of the same per-example gradients
    ``grad(l_j + R)``: exact against one gradient per example, orders 1-4, mean and sum; the
    penalised variables keep their rule (they took the fallback, with ``M_1`` inconsistent
    with ``M_2``)."""
    case = build()
    seen = {}

    @tf.function
    def step(x, y):
        loss = case.total(case.forward(x), y)
        seen["plan"] = gradmom.plan_moments(loss, case.variables, orders=ORDERS)
        return gradmom.gradients_and_moments(loss, case.variables, orders=ORDERS)

    grads, moments = step(case.x, case.y)
    want = _reference(case)
    n = case.x.shape[0]
    plan = seen["plan"]
    ruled = {id(v) for v in case.ruled}
    for k, v in enumerate(case.variables):
        name = plan.variables[k].name
        _assert_moments(moments[k], want[k], name)
        scale = 1.0 if case.mode == "mean" else float(n)
        np.testing.assert_allclose(grads[k], want[k][1] * scale, rtol=1e-9, atol=1e-12)
        if id(v) in ruled:
            assert plan.variables[k].path.startswith("rule: "), (name, plan.variables[k].path)
    assert plan.mode == case.mode
    text = str(plan)
    assert "+ the gradient of the loss's example-free terms" in text, text


def test_b_the_logged_step_and_the_plain_step_both_add_the_penalty(tmp_path):
    """`summary.moments` gates the moments in a ``tf.cond`` and takes a convolution's gradient
    from its rule's sums where it logs and from TF's filter gradient where it does not: both
    gradients hold the penalty's, and the logged moments are those of ``grad(l_j + R)``."""
    from tb_gradmom.analysis import data

    case = _keras_case(_keras_conv, "sum_over_batch_size", (4, 4, 2))()
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function
    def step(x, y, s):
        loss = case.total(case.forward(x), y)
        with writer.as_default(step=s), tf.summary.record_if(s % 2 == 0):
            grads = gradmom.summary.moments(loss, case.variables, orders=(1, 2))
        return grads, tf.gradients(loss, case.variables)

    for s in range(2):  # step 0 logs, step 1 does not
        grads, plain = step(case.x, case.y, tf.constant(s, tf.int64))
        for v, g, want in zip(case.variables, grads, plain):
            np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-13, err_msg=f"{v.path} {s}")
    writer.close()
    logged = data.load(str(tmp_path))["."]
    ref = _reference(case, (1, 2))
    tags = gradmom.summary.tag_names(case.variables)
    for v, tag, want in zip(case.variables, tags, ref):
        (record,) = logged[tag]
        for p in (1, 2):  # stored in float32
            err = np.max(np.abs(record.moments[p] - want[p])) / np.max(np.abs(want[p]))
            assert err < 1e-6, (v.path, p, err)


# --- C: Keras' loss total and other sums of terms -----------------------------------------------


class _WeightPenalty:
    """A Keras layer ``x * w`` that adds ``0.05 * sum(w**2)`` with ``add_loss`` (no example)."""

    @staticmethod
    def make():
        import keras

        class WeightPenalty(keras.layers.Layer):
            def build(self, shape):
                self.w = self.add_weight(
                    shape=(shape[-1],), initializer="random_normal", dtype="float64"
                )

            def call(self, x):
                self.add_loss(0.05 * tf.reduce_sum(tf.square(self.w)))
                return x * self.w

        return WeightPenalty(dtype="float64")


def _keras_compiled(with_add_loss: bool):
    import keras

    keras.utils.set_random_seed(9)
    inp = keras.Input((D,), dtype="float64")
    h = keras.layers.Dense(
        4,
        activation="tanh",
        kernel_regularizer=keras.regularizers.L2(0.1),
        bias_regularizer=keras.regularizers.L1(0.02),
        bias_initializer="random_normal",
        dtype="float64",
    )(inp)
    if with_add_loss:
        h = _WeightPenalty.make()(h)
    out = keras.layers.Dense(K, dtype="float64")(h)
    model = keras.Model(inp, out)
    model.compile(loss=keras.losses.MeanSquaredError(dtype="float64"), optimizer="sgd")
    return model


@pytest.fixture
def keras_float64():
    """Keras' floatx float64 while the test builds and traces (``compute_loss`` stacks its
    terms in floatx)."""
    from tests import zoo

    with zoo.dtype_policy("float64"):
        yield


@pytest.mark.usefixtures("keras_float64")
@pytest.mark.parametrize("with_add_loss", [False, True], ids=["regularizers", "add-loss"])
def test_c_keras_compute_loss_is_a_sum_of_terms(with_add_loss):
    """``model.compute_loss`` as ``model.fit`` calls it: ``Sum(Pack([loss, *model.losses]))``.
    It raised PerExampleLossError ("values that mix the examples ... Pack")."""
    model = _keras_compiled(with_add_loss)
    x, y = _data(21)
    variables = model.trainable_variables
    seen = {}

    @tf.function
    def step(x, y):
        y_pred = model(x, training=True)
        loss = model.compute_loss(x, y, y_pred)
        seen["plan"] = gradmom.plan_moments(loss, variables, orders=ORDERS)
        return gradmom.gradients_and_moments(loss, variables, orders=ORDERS)

    grads, moments = step(x, y)
    case = Penalised(
        lambda x: model(x),
        variables,
        _mse,
        lambda: tf.add_n(model.losses),
        None,
        "mean",
        variables,
        x,
        y,
    )
    want = _reference(case)
    for k, v in enumerate(variables):
        _assert_moments(moments[k], want[k], v.path)
        np.testing.assert_allclose(grads[k], want[k][1], rtol=1e-9, atol=1e-12)
        path = seen["plan"].variables[k].path
        assert path.startswith("rule: "), (v.path, path)


# (id, scalar loss from (mean loss, penalties p1 p2), the same as a sum)
SUMS = [
    ("sum-of-stack", lambda m, p1, p2: tf.reduce_sum(tf.stack([m, p1, p2])), 1.0),
    ("mean-of-stack", lambda m, p1, p2: tf.reduce_mean(tf.stack([m, p1, p2])), 1.0 / 3.0),
    (
        "nested-stacks",
        lambda m, p1, p2: tf.reduce_sum(tf.stack([tf.stack([m, p1]), tf.stack([p2, 0.0 * p2])])),
        1.0,
    ),
    (
        "stack-of-sums-and-add-n",
        lambda m, p1, p2: tf.add_n([tf.reduce_sum(tf.stack([m, p1])), p2]),
        1.0,
    ),
    ("add-n", lambda m, p1, p2: tf.add_n([p1, m, p2]), 1.0),
]


@pytest.mark.parametrize("combine, scale", [c[1:] for c in SUMS], ids=[c[0] for c in SUMS])
def test_c_sums_of_terms_in_any_form(combine, scale):
    """``tf.stack`` then ``reduce_sum``/``reduce_mean`` (``1/k`` times the sum), nested, and
    ``tf.add_n``: the scalar is ``scale * (mean_j l_j + R)``, each example's loss
    ``scale * (l_j + R)``."""
    x, y = _data(31)
    w, v = _variables(32)
    forward, loss = _per_example(w)

    def penalties():
        return 0.1 * tf.nn.l2_loss(w), 0.2 * tf.reduce_sum(tf.abs(v))

    @tf.function
    def step(x, y):
        p1, p2 = penalties()
        total = combine(tf.reduce_mean(loss(forward(x), y)), p1, p2)
        return gradmom.gradients_and_moments(total, [w, v], orders=ORDERS)

    grads, moments = step(x, y)
    case = Penalised(
        forward,
        [w, v],
        lambda out, y: scale * loss(out, y),
        lambda: scale * tf.add_n(penalties()),
        None,
        "mean",
        [w],
        x,
        y,
    )
    want = _reference(case)
    for k, name in enumerate(("w", "v")):
        _assert_moments(moments[k], want[k], name)


@pytest.mark.usefixtures("keras_float64")
def test_c_a_keras_aux_loss_over_the_batch_is_refused_by_name():
    """keras_hub Mixtral's ``add_loss(router_aux_loss_coef * aux_loss)`` where ``aux_loss`` is
    a load-balancing loss over the batch: no per-example split, an error naming the term (the
    layer's op) and what to do instead of a number 0.1-20 % off."""
    import keras

    class Router(keras.layers.Layer):
        def build(self, shape):
            self.w = self.add_weight(shape=(shape[-1], K), dtype="float64")

        def call(self, x):
            aux = _load_balancing(x, self.w)
            self.add_loss(tf.multiply(tf.constant(0.01, tf.float64), aux, name="aux_term"))
            return x

    keras.utils.set_random_seed(13)
    inp = keras.Input((D,), dtype="float64")
    out = keras.layers.Dense(K, dtype="float64")(Router(name="router", dtype="float64")(inp))
    model = keras.Model(inp, out)
    model.compile(loss=keras.losses.MeanSquaredError(dtype="float64"), optimizer="sgd")
    x, y = _data(41)

    @tf.function
    def step(x, y):
        loss = model.compute_loss(x, y, model(x, training=True))
        return gradmom.gradients_and_moments(loss, model.trainable_variables)

    with pytest.raises(gradmom.PerExampleLossError) as info:
        step(x, y)
    msg = str(info.value)
    assert "its term '" in msg and "router" in msg and "aux_term" in msg, msg
    assert "without that term" in msg and "model.losses" in msg, msg


@pytest.mark.usefixtures("keras_float64")
def test_c_the_keras_callback_logs_a_regularised_model(tmp_path):
    """``model.fit`` with the callback on a model with regularisers and an ``add_loss``: it
    stopped with PerExampleLossError; the logged moments are those of ``grad(l_j + R)``."""
    import keras

    from tb_gradmom.analysis import data

    model = _keras_compiled(with_add_loss=True)
    model.compile(loss=keras.losses.MeanSquaredError(dtype="float64"), optimizer="sgd")
    x, y = _data(51)
    case = Penalised(
        lambda x: model(x), model.trainable_variables, _mse, lambda: tf.add_n(model.losses),
        None, "mean", [], x, y,
    )  # fmt: skip
    want = _reference(case, (1, 2))  # before fit: the callback logs the first step's moments
    model.optimizer.learning_rate = 0.0
    cb = gradmom.keras.GradMoments(str(tmp_path), every_n_steps=1)
    model.fit(x, y, batch_size=N, epochs=1, verbose=0, shuffle=False, callbacks=[cb])
    logged = data.load(str(tmp_path))["."]
    for v, tag, w in zip(
        model.trainable_variables, gradmom.summary.tag_names(case.variables), want
    ):
        (record,) = logged[tag]
        for p in (1, 2):  # stored in float32
            err = np.max(np.abs(record.moments[p] - w[p])) / np.max(np.abs(w[p]))
            assert err < 1e-6, (v.path, p, err)
