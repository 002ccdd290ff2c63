"""Moments inside ``tf.function(jit_compile=True)``, exact against brute-force per-example
gradients: `gradients_and_moments`, and the gated moments (`run_backward` with a gate, then
`Backward.moments` in a ``tf.cond``, as `tb_gradmom.writers.summary` uses them).

XLA compiles for static shapes. A chunk of ``tf.minimum(chunk, n - start)`` examples has a size
XLA cannot know, and the moments came out wrong with no error (a Conv1D, batch 8 in chunks of
3, batch known only at run time: M_4 195 times too big). Every chunk now has a static size
(`tb_gradmom.core.rules.base.static_chunks`): each case runs (a) a static batch of 7 in chunks
of 2 (a last chunk of 1), (b) the same batch unknown at trace time (``input_signature`` with
``None``: one chunk of the whole batch), (c) gated, with the batch unknown at trace time.
"""

from __future__ import annotations

import functools
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom as gradmom
from tb_gradmom.core import moments as _moments
from tb_gradmom.core import plan as _plan
from tb_gradmom.core.errors import UnsupportedOpError
from tests import reference
from tests.cases import CASES_BY_ID, Case, SinCell, _keras, _xy, conv, rnn, squared_error
from tests.test_core import _assert_close, _loss

ORDERS = (1, 2, 3, 4)
# float64, as in tests/test_core.py: the rules and the reference differ by summation order.
TOL = 1e-10
BATCH = 7  # more than a chunk of CHUNK, not a multiple of it
CHUNK = 2


def _sin_rnn(dtype):
    """A recurrent cell that uses its input kernel as ``sin(w)``: the loop rule refuses ``w``
    (the exact fallback: pfor over the loop's gradient), ``u`` keeps the rule."""
    keras.utils.set_random_seed(12)
    model = keras.Sequential(
        [
            keras.Input((4, 3), dtype=dtype),
            keras.layers.RNN(SinCell(3, dtype=dtype), dtype=dtype),
            keras.layers.Dense(2, dtype=dtype),
        ]
    )
    return model, model.trainable_variables


EXTRA = [
    # a grouped convolution (Keras compiles it as a nested XLA function; `rules/call.py`)
    Case(
        "conv2d-grouped-stride2-same",
        _keras(conv(2, 6, 3, groups=2, strides=2, padding="same"), input_shape=(7, 6, 4)),
        _xy((3, 7, 6, 4), (3, 4, 3, 6)),
    ),
]
CASES = {c.id: c for c in EXTRA} | {
    i: CASES_BY_ID[i]
    for i in [
        "mlp",
        "dense-sequence",
        "conv1d-stride2-same",
        "conv2d-valid",
        "conv2d-stride2-same",
        "depthwise-conv2d-stride2-same",
        "conv2d-transpose-stride2-valid",
        "layer-used-twice",
        "embedding-repeated-ids",
        "layernorm-sequence",
        "batchnorm-inference",
        "transformer-encoder-block",  # MultiHeadAttention
        "param-operands",  # the masked vector-Jacobian rule (pfor)
        "lstm-classifier",
        "gru-sequence",
    ]
}
# The recurrent layers' variables take the loop rule, never the exact fallback.
RECURRENT = {"lstm-classifier", "gru-sequence"}


def _reduction(case: Case) -> str:
    return case.loss if case.loss != "vector" else "mean"


def _grow(a: np.ndarray, n: int) -> np.ndarray:
    """``a``'s examples repeated to ``n``, each repeat a different example: ids rolled along
    their last axis, real values scaled."""
    parts = []
    for k in range(-(-n // a.shape[0])):
        if a.dtype.kind in "iu":
            parts.append(np.roll(a, k, axis=-1) if a.ndim > 1 else a)
        else:
            parts.append(a * (1.0 + 0.25 * k))
    return np.concatenate(parts)[:n]


@functools.cache
def _setup(case_id: str, n: int = BATCH):
    """The case's model (float64), a batch of ``n`` examples and its per-example gradients."""
    case = CASES[case_id]
    forward, variables = case.build("float64")
    x, y = case.inputs(np.random.default_rng(0), "float64")
    x, y = _grow(x, n), _grow(y, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = reference.per_example_gradients(
            forward, variables, case.per_example_loss or squared_error, x, y
        )
    return case, forward, variables, x, y, ref


def _signature(x, y, *extra):
    return [
        tf.TensorSpec([None, *x.shape[1:]], tf.as_dtype(x.dtype)),
        tf.TensorSpec([None, *y.shape[1:]], tf.as_dtype(y.dtype)),
        *extra,
    ]


def _check_plan(case_id: str, plan: _plan.Plan) -> None:
    assert plan.xla, "the plan was made inside an XLA-compiled function"
    on_fallback = [plan.variables[i].name for i in plan.fallback_ids]
    assert not on_fallback, f"{case_id}: on the exact fallback: {on_fallback}"


def _check(case_id, variables, grads, moments, tf_grads, from_sums, ref):
    """Moments and gradients against the brute force; the gradients against TensorFlow's own
    (bit for bit, except those the plan takes from its rule's order-1 sums)."""
    case = CASES[case_id]
    expected_all = [reference.moments(g, ORDERS) for g in ref]
    # a moment that vanishes (attention's key bias) is rounding noise: compared to 1e-3 of the
    # largest moment of its order in the model, as in tests/test_core.py
    floor = {p: 1e-3 * max(float(np.max(np.abs(e[p]))) for e in expected_all) for p in ORDERS}
    scale = ref[0].shape[0] if case.loss == "sum" else 1
    for v, g, m, tg, summed, expected in zip(
        variables, grads, moments, tf_grads, from_sums, expected_all
    ):
        name = _plan.variable_name(v)
        for p in ORDERS:
            _assert_close(m[p], expected[p], TOL, f"{case_id} {name} M{p}", floor[p])
        g, tg = np.asarray(tf.convert_to_tensor(g)), np.asarray(tf.convert_to_tensor(tg))
        _assert_close(g, expected[1] * scale, TOL, f"{case_id} {name} grad", floor[1] * scale)
        # Taken by TensorFlow's own gradient functions, they equal the tape's up to XLA's
        # fusion of the two backward passes in one computation (1-ulp differences, measured
        # <= 1e-13 of the largest entry); from the rule's sums, up to summation order.
        tol = TOL if summed else 1e-13
        _assert_close(g, tg, tol, f"{case_id} {name} grad vs the tape's", floor[1] * scale)


def _fused(plan: _plan.Plan) -> list[bool]:
    """Per variable, whether `gradients_and_moments` takes its gradient from its rule's sums."""
    return [
        len(v.sites) == 1 and v.sites[0][1].gradient_from_sums and v.fallback is None
        for v in plan.variables
    ]


def _forward(case, forward, variables, x, y):
    """The loss, and a function that gives TensorFlow's own gradients of it (of the mean for a
    vector loss), to be called after gradmom's: the tape's gradient of a loop or a function
    call rewrites the op (accumulators, a forward function with more outputs).

    By a `tf.GradientTape`: ``tf.gradients`` through Keras' grouped convolution (a function
    call) builds a ``SymbolicGradient``, which XLA cannot compile."""
    with tf.GradientTape() as tape:
        loss = _loss(case, forward(x), y)
        scalar = tf.reduce_mean(loss) if case.loss == "vector" else loss
    return loss, lambda: tape.gradient(scalar, variables)


def _run(case_id: str, dynamic: bool, n: int = BATCH, chunk_size: int = CHUNK):
    case, forward, variables, x, y, ref = _setup(case_id, n)
    seen = {}

    def step(x, y):
        loss, tf_grads = _forward(case, forward, variables, x, y)
        seen["plan"] = gradmom.plan_moments(loss, variables, ORDERS, _reduction(case))
        grads, moments = gradmom.gradients_and_moments(
            loss, variables, ORDERS, _reduction(case), chunk_size=chunk_size
        )
        return grads, moments, tf_grads()

    kw = {"input_signature": _signature(x, y)} if dynamic else {}
    fn = tf.function(step, jit_compile=True, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's and batch norm's warnings
        grads, moments, tf_grads = fn(tf.constant(x), tf.constant(y))
    _check_plan(case_id, seen["plan"])
    return fn, variables, grads, moments, tf_grads, _fused(seen["plan"]), ref


@pytest.mark.parametrize("case_id", list(CASES))
def test_static_batch_in_chunks(case_id):
    _, variables, grads, moments, tf_grads, fused, ref = _run(case_id, dynamic=False)
    _check(case_id, variables, grads, moments, tf_grads, fused, ref)


@pytest.mark.parametrize("case_id", list(CASES))
def test_batch_unknown_at_trace_time(case_id):
    _, variables, grads, moments, tf_grads, fused, ref = _run(case_id, dynamic=True)
    _check(case_id, variables, grads, moments, tf_grads, fused, ref)


@pytest.mark.parametrize("case_id", ["conv2d-valid", "conv1d-stride2-same", "layer-used-twice"])
def test_static_batch_in_more_chunks_than_unrolled(case_id):
    """35 examples in chunks of 2: more chunks than `sum_over_chunks` unrolls (16), so a loop
    over 17 chunks of exactly 2 examples, then one of 1 (the convolution's sums; a variable
    used by two layers, its per-example gradients summed over them)."""
    fn, variables, grads, moments, tf_grads, fused, ref = _run(case_id, False, n=35)
    _check(case_id, variables, grads, moments, tf_grads, fused, ref)
    _, _, _, x, y, _ = _setup(case_id, 35)
    graph = fn.get_concrete_function(tf.constant(x), tf.constant(y)).graph
    loops = [op for op in _all_ops(graph) if op.type in ("While", "StatelessWhile")]
    assert any("chunks" in op.name for op in loops), [op.name for op in loops]


def _all_ops(graph: tf.Graph):
    """The ops of ``graph`` and of every function it calls (a loop's body, a branch)."""
    seen: set[str] = set()
    stack = [graph]
    while stack:
        g = stack.pop()
        for op in g.get_operations():
            yield op
            for attr in ("body", "cond", "then_branch", "else_branch", "f"):
                try:
                    name = op.get_attr(attr).name
                except (ValueError, AttributeError):
                    continue
                fn = graph._get_function(name)
                if fn is not None and name not in seen:
                    seen.add(name)
                    stack.append(fn.graph)


@pytest.mark.parametrize("case_id", list(CASES))
def test_gated_moments_in_a_cond(case_id):
    """As `summary.moments` builds them: `run_backward` with the gate (the fallback gated, the
    convolutions' gradients deferred), the moments (and the deferred gradients from the rule's
    sums) in one branch of a ``tf.cond``, TF's own filter gradients in the other; the batch
    unknown at trace time."""
    case, forward, variables, x, y, ref = _setup(case_id)
    zeros = [{p: tf.zeros(v.shape, tf.float64) for p in ORDERS} for v in variables]

    def step(x, y, pred):
        loss, tf_grads = _forward(case, forward, variables, x, y)
        options = _plan.Options.check(ORDERS, _reduction(case), None, CHUNK, "exact", None)
        plan = _plan.make_plan(loss, variables, options)
        _check_plan(case_id, plan)
        indices = list(range(len(variables)))
        backward = _moments.run_backward(plan, gate=pred, defer=indices)

        def write():
            grads, logged = backward.from_sums(ORDERS) if backward.deferred else ([], backward)
            return grads, logged.moments(ORDERS, indices).values

        def skip():
            return (backward.plain_grads() if backward.deferred else []), zeros

        deferred, moments = tf.cond(pred, write, skip)
        grads = list(backward.grads)
        for i, g in zip(backward.deferred, deferred):
            grads[i] = g
        summed = [i in backward.deferred for i in indices]
        return grads, moments, tf_grads(), summed

    sig = _signature(x, y, tf.TensorSpec([], tf.bool))
    fn = tf.function(step, jit_compile=True, input_signature=sig)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grads, moments, tf_grads, summed = fn(tf.constant(x), tf.constant(y), tf.constant(True))
        _check(case_id, variables, grads, moments, tf_grads, [bool(s) for s in summed], ref)
        grads, moments, tf_grads, _ = fn(tf.constant(x), tf.constant(y), tf.constant(False))
    floor = 1e-3 * max(float(np.max(np.abs(tf.convert_to_tensor(g)))) for g in tf_grads)
    for v, m, g, tg in zip(variables, moments, grads, tf_grads):
        name = _plan.variable_name(v)
        for p in ORDERS:
            np.testing.assert_array_equal(m[p], 0.0, err_msg=f"{case_id} {name} M{p} (off)")
        # off: TF's own gradient, the same ops as tf.gradients (a filter gradient included)
        _assert_close(
            tf.convert_to_tensor(g),
            tf.convert_to_tensor(tg).numpy(),
            TOL,
            f"{case_id} {name} grad (off)",
            floor,
        )


def test_loop_with_steps_unknown_at_trace_time_names_the_layer():
    """Under XLA the loop rule needs the sequence length at trace time (the copy's lists are
    sized by it); without it the variables go to the exact fallback, and with
    ``fallback="error"`` the error names the variable, the loop and the reason."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((None, 3), dtype="float64")])
    model.add(rnn("lstm", 3)("float64"))
    model.add(keras.layers.Dense(2, dtype="float64"))
    x = np.random.default_rng(0).normal(size=(BATCH, 4, 3))
    y = np.random.default_rng(1).normal(size=(BATCH, 2))
    sig = [tf.TensorSpec([None, None, 3], tf.float64), tf.TensorSpec([None, 2], tf.float64)]

    @tf.function(jit_compile=True, input_signature=sig)
    def step(x, y):
        loss = tf.reduce_mean(squared_error(model(x), y))
        return gradmom.gradients_and_moments(loss, model.trainable_variables, fallback="error")

    with pytest.raises(UnsupportedOpError) as err:
        step(tf.constant(x), tf.constant(y))
    message = str(err.value)
    assert "lstm_cell/kernel" in message and "While" in message, message
    assert "XLA" in message and "static sequence length" in message, message


def _fused_batch_norm(dtype):
    """A raw fused batch norm in inference mode: an op with several outputs, no rule (the exact
    fallback for its scale and offset)."""
    rng = np.random.default_rng(5)
    scale = tf.Variable(rng.normal(size=(3,)).astype(dtype), name="scale")
    offset = tf.Variable(rng.normal(size=(3,)).astype(dtype), name="offset")
    mean = tf.constant(rng.normal(size=(3,)).astype(dtype))
    var = tf.constant(rng.uniform(0.5, 2.0, size=(3,)).astype(dtype))

    def forward(x):
        y = tf.compat.v1.nn.fused_batch_norm(x, scale, offset, mean, var, is_training=False)[0]
        return tf.reduce_sum(tf.tanh(y), axis=[1, 2])

    return forward, [scale, offset]


@pytest.mark.parametrize(
    "case",
    [
        Case("rnn-sin-cell", _sin_rnn, _xy((4, 4, 3), (4, 2))),
        Case("fused-batch-norm", _fused_batch_norm, _xy((4, 2, 2, 3), (4, 3))),
    ],
    ids=lambda c: c.id,
)
def test_exact_fallback_is_refused_naming_the_variables(case):
    """Inside XLA the exact fallback's vectorised per-example gradients come out wrong with no
    error (measured: the fused batch norm's scale M_2 off by 23, the sin cell's kernel zeros):
    an error that names the variables and their op, and says what to do."""
    dtype = "float32" if case.id == "fused-batch-norm" else "float64"  # its kernel: float32
    forward, variables = case.build(dtype)
    x, y = case.inputs(np.random.default_rng(0), dtype)

    @tf.function(jit_compile=True)
    def step(x, y):
        loss = tf.reduce_mean(squared_error(forward(x), y))
        return gradmom.gradients_and_moments(loss, variables)

    with pytest.raises(UnsupportedOpError) as err:
        step(tf.constant(x), tf.constant(y))
    message = str(err.value)
    on_fallback = {"rnn-sin-cell": ["/w"], "fused-batch-norm": ["scale", "offset"]}[case.id]
    names = [_plan.variable_name(v) for v in variables]
    for end in on_fallback:
        assert any(f"'{n}'" in message for n in names if n.endswith(end)), message
    assert "jit_compile" in message and ("FusedBatchNormV3" in message or "Sin" in message)


@pytest.mark.parametrize("case_id", ["conv2d-valid", "dense-sequence", "lstm-classifier"])
def test_default_orders(case_id):
    """Orders 1 and 2 (the default): sums of squares without TF's Euclidean norm, which XLA
    has no kernel for."""
    case, forward, variables, x, y, ref = _setup(case_id)

    @tf.function(jit_compile=True, input_signature=_signature(x, y))
    def step(x, y):
        loss = _loss(case, forward(x), y)
        return gradmom.gradients_and_moments(loss, variables, chunk_size=CHUNK)[1]

    moments = step(tf.constant(x), tf.constant(y))
    for v, m, per_ex in zip(variables, moments, ref):
        expected = reference.moments(per_ex, (1, 2))
        assert set(m) == {1, 2}
        for p in (1, 2):
            _assert_close(m[p], expected[p], TOL, f"{case_id} {_plan.variable_name(v)} M{p}")
