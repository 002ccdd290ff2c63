"""The loop rule (`tb_gradmom.core.rules.loops`): Keras LSTM, GRU and SimpleRNN, and a raw
``tf.while_loop``, exact against brute-force per-example gradients with ``fallback="error"``
(so the rule, not the exact fallback, computed them); what it does not cover goes to the exact
fallback with its warning; a step that records no moments runs none of the loop's copy."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom as gradmom
from tb_gradmom.core import moments as _moments
from tb_gradmom.core import plan as _plan
from tb_gradmom.core.rules import loops
from tb_gradmom.core.rules.loops import chunks as _chunks
from tb_gradmom.core.rules.loops import loop as _loop
from tests import reference
from tests.cases import (
    CASES_BY_ID,
    CONV_RECURRENT_CASE_IDS,
    RECURRENT_CASE_IDS,
    Case,
    SinCell,
    _keras,
    _xy,
    conv_lstm,
    dense,
    flatten,
    squared_error,
)
from tests.test_core import ORDERS, TOLERANCE, _assert_close, _run


def _check(case, dtype="float64", **kwargs):
    variables, grads, moments, ref = _run(case, dtype, fallback="error", **kwargs)
    expected_all = [reference.moments(r, ORDERS) for r in ref]
    rel = 1e-3 if dtype == "float64" else 1e-2
    floor = {p: rel * max(float(np.max(np.abs(e[p]))) for e in expected_all) for p in ORDERS}
    for v, g, m, per_ex, expected in zip(variables, grads, moments, ref, expected_all):
        name = _plan.variable_name(v)
        for p in ORDERS:
            _assert_close(m[p], expected[p], TOLERANCE[dtype], f"{case.id} {name} M{p}", floor[p])
        scale = per_ex.shape[0] if case.loss == "sum" else 1
        _assert_close(
            tf.convert_to_tensor(g),
            expected[1] * scale,
            TOLERANCE[dtype],
            f"{case.id} {name} grad",
            floor[1] * scale,
        )


@pytest.mark.parametrize("case_id", RECURRENT_CASE_IDS)
def test_recurrent_layers_take_the_rule_exactly(case_id):
    _check(CASES_BY_ID[case_id])


@pytest.mark.parametrize("case_id", CONV_RECURRENT_CASE_IDS)
def test_convolutions_inside_the_loop_take_the_rule_exactly(case_id):
    """ConvLSTM1D/2D: the input and recurrent convolutions' filters read at every step (the
    conv rule's per-example filter gradient of each step's input and delta, summed over the
    steps per example), float64, orders 1-4, ``fallback="error"``. Before: every kernel on the
    fallback ("the variable is used by Conv2D op ... inside the loop")."""
    _check(CASES_BY_ID[case_id])


@pytest.mark.parametrize("case_id", CONV_RECURRENT_CASE_IDS[:1])
@pytest.mark.parametrize("dtype", ["float32"])
def test_convolutions_inside_the_loop_float32(case_id, dtype):
    _check(CASES_BY_ID[case_id], dtype)


@pytest.mark.parametrize("case_id", CONV_RECURRENT_CASE_IDS[:2])
def test_convolutions_inside_the_loop_dynamic_batch_small_chunks(case_id):
    _check(CASES_BY_ID[case_id], dynamic_batch=True, chunk_size=2)


@pytest.mark.parametrize("case_id", ["lstm-classifier", "gru-reset-before-last", "lstm-stacked"])
def test_recurrent_layers_float32(case_id):
    _check(CASES_BY_ID[case_id], "float32")


@pytest.mark.parametrize(
    "case_id", ["lstm-stacked", "lstm-bidirectional", "gru-masking", "lstm-embedding-mask-zero"]
)
def test_dynamic_batch_size(case_id):
    _check(CASES_BY_ID[case_id], dynamic_batch=True)


@pytest.mark.parametrize("case_id", ["gru-last", "gru-masking", "lstm-sequence-dense-head"])
def test_chunks_of_examples(case_id):
    """Two examples per chunk: the chunk loop over examples reads the copy's stacks."""
    _check(CASES_BY_ID[case_id], chunk_size=2)


@pytest.mark.parametrize("chunk", [1, 2])
@pytest.mark.parametrize(
    "case_id",
    RECURRENT_CASE_IDS + CONV_RECURRENT_CASE_IDS[:2] + ["lstm-learned-initial-state-number-static"],
)
def test_copy_on_chunks_of_examples(case_id, chunk, monkeypatch):
    """The copy of the loop run on chunks of ``chunk`` examples (one after the other in a
    while loop), for every case whose loop inputs and seeds can be sliced; the others keep the
    whole batch's copy. Exact either way."""
    monkeypatch.setattr(_chunks, "COPY_ELEMENTS", chunk)
    monkeypatch.setattr(loops.Loop, "copy_elements", lambda self: 1)
    ran = []
    chunk_sums = loops.Loop.chunk_sums

    def spy(self, *args, **kwargs):
        out = chunk_sums(self, *args, **kwargs)
        ran.append(out is not None)
        return out

    monkeypatch.setattr(loops.Loop, "chunk_sums", spy)
    _check(CASES_BY_ID[case_id])
    if case_id in ("lstm-classifier", "gru-last", "gru-sequence", "lstm-stacked"):
        assert ran and all(ran), ran


def _rule_paths(build, x, y, loss="mean"):
    """The path the core takes for each variable: ``op type`` or ``fallback: reason``."""
    forward, variables = build("float64")
    seen = {}

    @tf.function
    def step(x, y):
        per = squared_error(forward(x), y)
        total = tf.reduce_mean(per) if loss == "mean" else tf.reduce_sum(per)
        plan = _plan.make_plan(total, variables, _plan.Options.check(orders=(1, 2)))
        seen["paths"] = [
            f"fallback: {p.fallback}" if p.fallback else plan.op_type(i)
            for i, p in enumerate(plan.variables)
        ]
        return _moments.run_backward(plan).grads

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step(tf.constant(x), tf.constant(y))
    return dict(zip([_plan.variable_name(v) for v in variables], seen["paths"]))


def test_keras_rnn_variables_are_consumed_by_the_loop():
    case = CASES_BY_ID["gru-last"]
    x, y = case.inputs(np.random.default_rng(0), "float64")
    paths = _rule_paths(case.build, x, y)
    loop = [k for k, p in paths.items() if "gru_cell" in k]
    assert len(loop) == 3
    assert all(paths[k] == "While" for k in loop), paths


class SharedLSTM(keras.Model):
    """One LSTM applied to both halves of the features: two loops read the same variables, so
    each variable has two sites whose per-example gradients are summed before the powers."""

    def __init__(self, dtype):
        super().__init__(dtype=dtype)
        self.lstm = keras.layers.LSTM(3, dtype=dtype)
        self.head = keras.layers.Dense(2, dtype=dtype)

    def call(self, x):
        a = self.lstm(x[:, :, :2])
        b = self.lstm(x[:, :, 2:])
        return self.head(tf.concat([a, b], axis=1))


def _shared_lstm(dtype):
    keras.utils.set_random_seed(11)
    model = SharedLSTM(dtype)
    model(np.zeros((1, 4, 4), dtype))
    return model, model.trainable_variables


def test_variables_shared_by_two_loops():
    _check(Case("lstm-shared-two-loops", _shared_lstm, _xy((5, 4, 4), (5, 2))))
    _check(Case("lstm-shared-two-loops", _shared_lstm, _xy((5, 4, 4), (5, 2)), "sum"), chunk_size=2)


class RawRecurrence(tf.Module):
    """A hand-written ``tf.while_loop`` over a TensorArray of steps (no Keras). ``read_outside``:
    the recurrent kernel's value is read before the loop and captured (not its handle)."""

    def __init__(self, dtype, read_outside=False):
        super().__init__()
        self.read_outside = read_outside
        rng = np.random.default_rng(4)
        self.w = tf.Variable(rng.normal(size=(3, 4)).astype(dtype), name="w")
        self.u = tf.Variable(0.5 * rng.normal(size=(4, 4)).astype(dtype), name="u")
        self.b = tf.Variable(rng.normal(size=(4,)).astype(dtype), name="b")

    def __call__(self, x):
        steps = tf.TensorArray(x.dtype, size=x.shape[1]).unstack(tf.transpose(x, [1, 0, 2]))
        h0 = tf.zeros([tf.shape(x)[0], 4], x.dtype)
        u = tf.convert_to_tensor(self.u) if self.read_outside else self.u

        def body(t, h, total):
            h = tf.tanh(tf.matmul(steps.read(t), self.w) + tf.matmul(h, u) + self.b)
            return t + 1, h, total + h

        _, h, total = tf.while_loop(lambda t, h, s: t < x.shape[1], body, (0, h0, h0))
        return tf.concat([h, total], axis=1)


def _raw_recurrence(read_outside=False):
    def build(dtype):
        m = RawRecurrence(dtype, read_outside)
        return m, [m.w, m.u, m.b]

    return build


def test_raw_while_loop():
    _check(Case("raw-while-loop", _raw_recurrence(), _xy((4, 5, 3), (4, 8))))
    _check(Case("raw-while-loop-sum", _raw_recurrence(), _xy((3, 5, 3), (3, 8)), "sum"), "float32")


def test_raw_while_loop_capturing_a_value():
    """A variable's value read outside the loop and captured: the site is the loop, consuming a
    float tensor rather than a handle."""
    case = Case("raw-while-loop-value", _raw_recurrence(read_outside=True), _xy((4, 5, 3), (4, 8)))
    x, y = case.inputs(np.random.default_rng(0), "float64")
    assert _rule_paths(case.build, x, y)["u"] == "While"
    _check(case)


class DepthwiseRecurrence(tf.Module):
    """A hand-written loop over images: ``h_t = tanh(depthwise(h_{t-1}, D) + conv(x_t, K) + b)``
    (a depthwise and an ordinary 2-D convolution inside the body, same padding)."""

    def __init__(self, dtype):
        super().__init__()
        rng = np.random.default_rng(5)
        self.k = tf.Variable(rng.normal(size=(2, 2, 2, 3)).astype(dtype), name="k")
        self.d = tf.Variable(0.5 * rng.normal(size=(3, 3, 3, 1)).astype(dtype), name="d")
        self.b = tf.Variable(rng.normal(size=(3,)).astype(dtype), name="b")

    def __call__(self, x):  # x: [n, T, 4, 4, 2]
        steps = tf.TensorArray(x.dtype, size=x.shape[1]).unstack(tf.transpose(x, [1, 0, 2, 3, 4]))
        h0 = tf.zeros([tf.shape(x)[0], 4, 4, 3], x.dtype)

        def body(t, h):
            z = tf.nn.depthwise_conv2d(h, self.d, [1, 1, 1, 1], "SAME")
            z = z + tf.nn.conv2d(steps.read(t), self.k, 1, "SAME")
            return t + 1, tf.tanh(tf.nn.bias_add(z, self.b))

        _, h = tf.while_loop(lambda t, h: t < x.shape[1], body, (0, h0))
        return tf.reshape(h, [-1, 48])


def _depthwise_recurrence(dtype):
    m = DepthwiseRecurrence(dtype)
    return m, [m.k, m.d, m.b]


def test_a_depthwise_and_a_plain_convolution_in_a_raw_loop_take_the_rule():
    case = Case("raw-while-loop-depthwise", _depthwise_recurrence, _xy((3, 3, 4, 4, 2), (3, 48)))
    x, y = case.inputs(np.random.default_rng(0), "float64")
    paths = _rule_paths(case.build, x, y)
    assert all(p == "While" for p in paths.values()), paths
    _check(case)


def _sin_rnn(dtype):
    keras.utils.set_random_seed(12)
    model = keras.Sequential(
        [
            keras.Input((4, 3), dtype=dtype),
            keras.layers.RNN(SinCell(3, dtype=dtype), dtype=dtype),
            keras.layers.Dense(2, dtype=dtype),
        ]
    )
    return model, model.trainable_variables


def test_use_without_a_rule_takes_the_exact_fallback_with_its_warning():
    case = Case("sin-cell", _sin_rnn, _xy((4, 4, 3), (4, 2)))
    x, y = case.inputs(np.random.default_rng(0), "float64")
    paths = _rule_paths(case.build, x, y)
    w = next(k for k in paths if k.endswith("/w"))
    u = next(k for k in paths if k.endswith("/u"))
    assert paths[w].startswith("fallback:") and "Sin" in paths[w], paths
    assert paths[u] == "While", paths  # the other variable of the same loop keeps the rule
    with pytest.raises(gradmom.UnsupportedOpError, match="Sin"):
        _run(case, "float64", fallback="error")
    with pytest.warns(UserWarning, match=r"no exact rule for .*/w'.*Sin"):
        variables, _, moments, ref = _run(case, "float64")
    for v, m, r in zip(variables, moments, ref):
        expected = reference.moments(r, ORDERS)
        for p in ORDERS:
            _assert_close(m[p], expected[p], 1e-10, f"sin-cell {v.path} M{p}")


class NoisyCell(SinCell):
    """Random numbers inside the step: a copy of the loop would draw others."""

    def call(self, x, states):
        noise = tf.random.uniform(tf.shape(states[0]), dtype=x.dtype)
        h = tf.tanh(tf.matmul(x, self.w) + tf.matmul(states[0], self.u) + 0.01 * noise)
        return h, [h]


class CoupledRecurrence(RawRecurrence):
    """The state mixes the examples (a batch mean at every step): no examples' axis to prove."""

    def __call__(self, x):
        steps = tf.TensorArray(x.dtype, size=x.shape[1]).unstack(tf.transpose(x, [1, 0, 2]))
        h0 = tf.zeros([tf.shape(x)[0], 4], x.dtype)

        def body(t, h):
            h = h - tf.reduce_mean(h, axis=0, keepdims=True)
            z = tf.matmul(steps.read(t), self.w) + tf.matmul(h, self.u) + self.b
            return t + 1, tf.tanh(z)

        _, h = tf.while_loop(lambda t, h: t < x.shape[1], body, (0, h0))
        return h


@pytest.mark.parametrize(
    "build, match",
    [
        (
            lambda: keras.Sequential(
                [keras.Input((4, 3)), keras.layers.RNN(NoisyCell(3)), keras.layers.Dense(2)]
            ),
            "stateful",
        ),
        (lambda: CoupledRecurrence("float32"), "statistic over the batch"),
    ],
    ids=["random-numbers-in-the-body", "examples-mixed-in-the-state"],
)
def test_unsupported_loops_are_refused_not_guessed(build, match):
    model = build()
    variables = model.trainable_variables

    def step(x, fallback):
        out = model(x)
        loss = tf.reduce_mean(tf.reduce_sum(out**2, axis=1))
        return gradmom.gradients_and_moments(loss, variables, fallback=fallback)[1]

    x = tf.constant(np.random.default_rng(0).normal(size=(4, 4, 3)), tf.float32)
    with pytest.raises(gradmom.UnsupportedOpError, match=match):
        tf.function(lambda x: step(x, "error"))(x)
    with pytest.warns(UserWarning, match="no exact rule"):
        moments = tf.function(lambda x: step(x, "exact"))(x)
    assert all(np.all(np.isfinite(m[2].numpy())) for m in moments)


def test_skipped_steps_run_no_copy_of_the_loop(tmp_path, monkeypatch):
    """The copy of the loop is built where the moments are, inside summary.moments' cond: a
    check attached to the copy never fires on a skipped step, and fires on a recorded one."""
    built = []
    original = loops.Loop.build

    def build(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        built.append(self.op.name)
        check = tf.debugging.Assert(False, ["the copy of the loop ran"])
        with tf.control_dependencies([check]):
            return {k: tf.identity(v) for k, v in out.items()}

    monkeypatch.setattr(loops.Loop, "build", build)
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((5, 3)), keras.layers.GRU(4), keras.layers.Dense(2)])
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function(input_signature=[tf.TensorSpec([6, 5, 3]), tf.TensorSpec([], tf.bool)])
    def step(x, record):
        loss = tf.reduce_mean(tf.reduce_sum(model(x) ** 2, axis=1))
        with writer.as_default(step=0), tf.summary.record_if(record):
            grads = gradmom.summary.moments(loss, model.trainable_variables, fallback="error")
        return grads[0]

    x = tf.constant(np.random.default_rng(1).normal(size=(6, 5, 3)), tf.float32)
    g = step(x, tf.constant(False))
    assert len(built) == 1  # one copy for the loop's three variables
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.reduce_sum(model(x) ** 2, axis=1))
    expected = tape.gradient(loss, model.trainable_variables[0])
    np.testing.assert_allclose(g.numpy(), expected.numpy(), rtol=1e-5, atol=1e-7)
    with pytest.raises(tf.errors.InvalidArgumentError, match="the copy of the loop ran"):
        step(x, tf.constant(True))


@pytest.mark.parametrize("layer", ["lstm", "gru"])
def test_dropout_masks_are_the_loops_own(layer):
    """In training mode with dropout and recurrent dropout, the masks are drawn once per step
    (before the loop) and the copy reuses them: the rule's per-example gradients sum to the
    step's own gradient. (A brute-force reference would draw other masks.)"""
    keras.utils.set_random_seed(9)
    cls = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}[layer]
    model = keras.Sequential(
        [
            keras.Input((5, 3)),
            cls(4, dropout=0.3, recurrent_dropout=0.3, dtype="float64"),
            keras.layers.Dense(2, dtype="float64"),
        ]
    )
    variables = model.trainable_variables

    @tf.function
    def step(x):
        loss = tf.reduce_mean(tf.reduce_sum(model(x, training=True) ** 2, axis=1))
        plan = _plan.make_plan(loss, variables, _plan.Options.check((1, 2), fallback="error"))
        backward = _moments.run_backward(plan)
        sums = []
        for vplan in plan.variables[:3]:  # the cell's variables
            (site, c) = vplan.sites[0]
            assert site.op.type == "While"
            grads = tuple(backward.out_grads[backward.index[t.ref()]] for t in site.output)
            g = c.per_example(loops.LoopGrads(grads, 1.0), plan.n, 0, plan.n)
            sums.append(tf.reduce_sum(g, axis=0))
        return sums, backward.grads[:3]

    x = tf.constant(np.random.default_rng(2).normal(size=(6, 5, 3)))
    sums, grads = step(x)
    for s, g in zip(sums, grads):
        np.testing.assert_allclose(s.numpy(), g.numpy(), rtol=1e-10, atol=1e-13)


def test_sequence_length_unknown_at_trace_time():
    """``Input((None, d))`` traced with an unknown batch and sequence length: the copy runs
    as many steps as the loop did (its final counter), whatever the length of the batch."""
    keras.utils.set_random_seed(13)
    model = keras.Sequential(
        [
            keras.Input((None, 3), dtype="float64"),
            keras.layers.GRU(3, return_sequences=True, dtype="float64"),
            keras.layers.LSTM(2, dtype="float64"),
        ]
    )
    variables = model.trainable_variables

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, None, 3], tf.float64),
            tf.TensorSpec([None, 2], tf.float64),
        ]
    )
    def step(x, y):
        loss = tf.reduce_sum(squared_error(model(x), y))
        return gradmom.gradients_and_moments(loss, variables, orders=ORDERS, fallback="error")[1]

    rng = np.random.default_rng(5)
    for n, steps in ((4, 6), (3, 2)):
        x, y = rng.normal(size=(n, steps, 3)), rng.normal(size=(n, 2))
        moments = step(tf.constant(x), tf.constant(y))
        ref = reference.per_example_gradients(model, variables, squared_error, x, y)
        for v, m, r in zip(variables, moments, ref):
            expected = reference.moments(r, ORDERS)
            for p in ORDERS:
                _assert_close(m[p], expected[p], 1e-10, f"T={steps} {v.path} M{p}")


# Stacked loops whose second loop's input needs a gradient: TensorFlow's gradient of each loop
# (while_v2) rewrites the loop in place, appending a list per value its backward loop needs
# (the kernels' reads, the gates), which the body pushes at every step.
STACKED_CASES = [
    CASES_BY_ID["lstm-stacked"],
    Case(
        "convlstm2d-stacked",
        _keras(
            conv_lstm(2, 2, 2, padding="same", return_sequences=True),
            conv_lstm(2, 2, 2),
            flatten(),
            dense(2),
            input_shape=(3, 4, 4, 1),
        ),
        _xy((3, 3, 4, 4, 1), (3, 2)),
    ),
]


@pytest.mark.parametrize("first", ["gradients_and_moments", "tape"])
@pytest.mark.parametrize("case", STACKED_CASES, ids=[c.id for c in STACKED_CASES])
def test_a_call_after_a_backward_pass_of_stacked_loops(case, first):
    """A call of the core after a backward pass through stacked loops in the same function
    (a first call's, or the user's tape's), which rewrote the loops with accumulators: the
    analysis leaves the accumulators out, so the second call takes the loop rule too
    (``fallback="error"``), and both calls' moments equal brute force."""
    forward, variables = case.build("float64")
    x, y = case.inputs(np.random.default_rng(0), "float64")

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(squared_error(forward(x), y))
        if first == "tape":
            before = [tf.reduce_sum(g) for g in tape.gradient(loss, variables)]
        else:
            before = gradmom.gradients_and_moments(
                loss, variables, orders=ORDERS, fallback="error"
            )[1]
        after = gradmom.gradients_and_moments(loss, variables, orders=ORDERS, fallback="error")
        return before, after[1]

    before, after = step(tf.constant(x), tf.constant(y))
    ref = reference.per_example_gradients(forward, variables, squared_error, x, y)
    expected_all = [reference.moments(r, ORDERS) for r in ref]
    floor = {p: 1e-3 * max(float(np.max(np.abs(e[p]))) for e in expected_all) for p in ORDERS}
    calls = [("second", after)] + ([("first", before)] if first != "tape" else [])
    for call, moments in calls:
        for v, m, expected in zip(variables, moments, expected_all):
            for p in ORDERS:
                what = f"{case.id} {call} call {v.path} M{p}"
                _assert_close(m[p], expected[p], TOLERANCE["float64"], what, floor[p])


def test_each_plan_owns_its_loops():
    """The loops a plan analyses (and the copies built from them) are the plan's own: two
    plans in one function hold distinct analyses, nothing is kept once a plan is made, and a
    plan made after a backward pass through the loops analyses them without the accumulators
    that pass appended (the same loop variables as before it)."""
    forward, variables = CASES_BY_ID["lstm-stacked"].build("float64")
    x, y = CASES_BY_ID["lstm-stacked"].inputs(np.random.default_rng(0), "float64")
    seen = {}

    @tf.function
    def step(x, y):
        loss = tf.reduce_mean(squared_error(forward(x), y))
        options = _plan.Options.check((1, 2), fallback="error")
        first = _plan.make_plan(loss, variables, options)
        ops = [site.op for vplan in first.variables for site, _ in vplan.sites]
        loops_ops = {op.name: op for op in ops if op.type in loops.LOOP_OPS}
        seen["inputs"] = {k: len(op.inputs) for k, op in loops_ops.items()}
        tf.gradients(loss, variables)
        seen["rewritten"] = {k: len(op.inputs) for k, op in loops_ops.items()}
        second = _plan.make_plan(loss, variables, options)
        seen["active"] = _loop.active()
        seen["plans"] = first, second
        return loss

    step(tf.constant(x), tf.constant(y))
    first, second = seen["plans"]
    assert len(first.loops) == len(second.loops) == 2
    assert first.loops is not second.loops
    assert all(seen["rewritten"][k] > n for k, n in seen["inputs"].items())  # accumulators

    def analysed(plan, name):
        site = next(s for vplan in plan.variables for s, _ in vplan.sites if s.op.name == name)
        return plan.loops.of(site)

    for name, n in seen["inputs"].items():
        a, b = analysed(first, name), analysed(second, name)
        assert len(first.loops) == len(second.loops) == 2  # the plans' own, analysed once
        assert a is not b
        assert not a.dropped and b.dropped
        assert len(a.inputs) == len(b.inputs) == n
        assert a.carried == b.carried and a.invariant == b.invariant
    assert len(seen["active"]) == 0  # outside a plan: loops of its own, nothing kept
    assert _loop.active() is not _loop.active()
