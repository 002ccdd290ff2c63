"""per_example_norms against brute force: one gradient per example, then its squared norm.

float64, 1e-12 relative to the largest squared norm of the variable (the two differ by
summation order only), on the case table, generated architectures, penalised losses, sum and
mean reductions and vector losses; the Gram ("ghost") and materialised forms of a Dense on
sequences against each other.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom as gradmom
from tb_gradmom.core.plan import variable_name
from tests import reference
from tests.cases import CASES, CASES_BY_ID, squared_error

TOL = 1e-12


def _loss(case, out, y):
    per_example = (case.per_example_loss or squared_error)(out, y)
    if case.loss == "vector":
        return per_example
    if case.loss == "sum":
        return tf.reduce_sum(per_example)
    return tf.reduce_mean(per_example)


def _reference(case, forward, variables, x, y):
    brute = {
        "brute": reference.per_example_gradients,
        "jacobian": reference.per_example_jacobian,
        "rows": reference.per_row_jacobian,
    }[case.reference]
    per_ex = brute(forward, variables, case.per_example_loss or squared_error, x, y)
    return [np.sum(g.reshape(g.shape[0], -1).astype(np.float64) ** 2, axis=1) for g in per_ex]


def _assert_norms(got, want, what, tol=TOL, floor=0.0):
    """Max error <= tol * the largest reference value (at least ``floor``: where a variable's
    true gradient vanishes, the attention key bias that softmax does not see, its squared norm
    is rounding noise, measured up to 4e-31 against the model's largest of order 1; callers
    pass the model's largest squared norm)."""
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    scale = max(float(np.max(np.abs(want))) if want.size else 0.0, floor, 1e-300)
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:g} * {scale:.3g}"


def _run_case(case, dtype="float64", **kwargs):
    forward, variables = case.build(dtype)
    x, y = case.inputs(np.random.default_rng(0), dtype)

    @tf.function
    def step(x, y):
        loss = _loss(case, forward(x), y)
        reduction = case.loss if case.loss != "vector" else "mean"
        return gradmom.per_example_norms(loss, variables, reduction=reduction, **kwargs)

    grads, norms = step(tf.constant(x), tf.constant(y))
    return forward, variables, x, y, grads, norms


@pytest.mark.filterwarnings("ignore:tb_gradmom.*training mode")
@pytest.mark.filterwarnings("ignore:tb_gradmom. no exact rule")
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_norms_match_brute_force(case):
    forward, variables, x, y, grads, norms = _run_case(case)
    want = _reference(case, forward, variables, x, y)
    assert len(norms) == len(variables) == len(grads)
    floor = max(float(np.max(w)) if w.size else 0.0 for w in want)
    for v, got, w in zip(variables, norms, want):
        vdtype = tf.float64 if tf.as_dtype(v.dtype) == tf.float64 else tf.float32
        assert got.dtype == vdtype
        tol = TOL if vdtype == tf.float64 else 2e-5  # LoRA adapters are float32
        _assert_norms(got, w, f"{case.id} {variable_name(v)}", tol, floor)


def _entry_norms(entry):
    """``(variables, ours, reference)`` for a `tests.zoo.Entry` (archgen's), float64."""
    from tests import zoo, zoo_worker

    forward, variables, (x, y), per_example_loss = entry.build("float64")
    scalar = None
    if isinstance(per_example_loss, zoo.ScalarLoss):
        scalar, per_example_loss = per_example_loss.scalar, per_example_loss.per_example
    total = scalar or (lambda out, y: tf.reduce_mean(per_example_loss(out, y)))

    @tf.function
    def step(x, y):
        return gradmom.per_example_norms(total(forward(x), y), variables, fallback=entry.fallback)

    _, norms = step(tf.constant(x), tf.constant(y))
    tf_vars = [
        v.value if isinstance(getattr(v, "value", None), tf.Variable) else v for v in variables
    ]
    in_batch = not zoo_worker.forward_spread(forward, x) <= zoo_worker.SPREAD_TOLERANCE
    brute = reference.per_example_jacobian if in_batch else reference.per_example_gradients
    per_ex = brute(forward, tf_vars, per_example_loss, x, y)
    want = [np.sum(g.reshape(g.shape[0], -1).astype(np.float64) ** 2, axis=1) for g in per_ex]
    return variables, norms, want


def _check_entry(entry):
    variables, norms, want = _entry_norms(entry)
    floor = max(float(np.max(w)) if w.size else 0.0 for w in want)
    for v, got, w in zip(variables, norms, want):
        _assert_norms(got, w, f"{entry.id} {variable_name(v)} ({entry.note})", TOL, floor)


# A subset of the generated architectures (tests/archgen.py): every stem, convolutions,
# attention, recurrent layers, normalisation, tied embeddings, penalised and summed losses.
ARCHGEN_SEEDS = list(range(12))


@pytest.mark.parametrize("seed", ARCHGEN_SEEDS)
def test_generated_architectures(seed):
    import keras

    from tests import archgen

    try:
        _check_entry(archgen.entry(archgen.generate(seed)))
    finally:
        keras.backend.clear_session()


# Penalised (l_j + R, l_j + R / n), scaled and summed losses on the three stems.
LOSS_FORMS = [
    ("sequence", ["dense_seq"], {"reduction": "sum", "const": "left", "penalty": "l2"}),
    ("image", ["conv2d"], {"const": "right", "penalty": "l1", "total": "add_n"}),
    ("tokens", ["dense_seq"], {"reduction": "sum", "penalty": "l2_loss", "total": "stack_sum"}),
    ("sequence", ["dense_seq"], {"penalty": "l2", "total": "stack_mean"}),
    ("image", ["depthwise2d"], {"penalty": "l2"}),
]


@pytest.mark.parametrize("stem, blocks, loss", LOSS_FORMS, ids=[str(i) for i in range(5)])
def test_penalised_losses(stem, blocks, loss):
    import keras

    from tests import archgen

    arch = archgen.generate(7, (), stem=stem, blocks=blocks, batch_rule="small", loss=loss)
    assert arch.n > 1 and "penalty" in arch.kinds(), arch.describe()
    try:
        _check_entry(archgen.entry(arch))
    finally:
        keras.backend.clear_session()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("case_id", ["conv2d-valid", "depthwise-conv2d-stride2-same", "mlp"])
def test_grads_are_those_of_tf_gradients(case_id, reduction, monkeypatch):
    """A convolution's gradient is the sum of the per-example filter gradients its norms
    build (TensorFlow's filter gradient is not built), by every conv path, with a penalty and
    a loss scale; the others are TensorFlow's own, bit for bit."""
    from tb_gradmom.core.rules import conv

    case = CASES_BY_ID[case_id]
    forward, variables = case.build("float64")
    x, y = case.inputs(np.random.default_rng(0), "float64")

    def step(x, y):
        per = squared_error(forward(x), y)
        loss = tf.reduce_mean(per) if reduction == "mean" else tf.reduce_sum(per)
        loss = 4.0 * (loss + 0.1 * tf.add_n([tf.reduce_sum(tf.square(v)) for v in variables]))
        # (a power of two: the core takes 1 / loss_scale in float32, as for the moments)
        grads, _ = gradmom.per_example_norms(loss, variables, loss_scale=4.0)
        return grads, tf.gradients(loss, variables)

    # the form chosen by FLOPs, then each form forced (grouped filters: native or products)
    for form in (None, "ghost", "unfolded", "native", "products"):
        monkeypatch.setattr(conv, "FORCE_NORMS_FORM", form)
        ours, tfs = tf.function(step)(tf.constant(x), tf.constant(y))
        for v, a, b in zip(variables, ours, tfs):
            a, b = np.asarray(a), np.asarray(b)
            if "conv" in v.path and "kernel" in v.path:
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * np.max(np.abs(b)))
            else:
                np.testing.assert_array_equal(a, b)


def test_errors_are_those_of_gradients_and_moments():
    w = tf.Variable(np.ones((3, 2)))
    with pytest.raises(RuntimeError, match="needs a graph"):
        gradmom.per_example_norms(tf.reduce_sum(tf.ones([2, 3], tf.float64) @ w), [w])

    @tf.function
    def not_per_example(x):
        return gradmom.per_example_norms(tf.reduce_max(x @ w), [w])

    with pytest.raises(gradmom.PerExampleLossError):
        not_per_example(tf.ones([4, 3], tf.float64))

    scale = tf.Variable(tf.ones([3]), name="odd_kernel")

    @tf.function
    def unsupported(x):  # a fused batch norm: no rule
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            x, scale, tf.zeros([3]), mean=tf.zeros([3]), variance=tf.ones([3]), is_training=False
        )
        loss = tf.reduce_mean(tf.reduce_sum(tf.square(y), axis=[1, 2, 3]))
        return gradmom.per_example_norms(loss, [scale], fallback="error")

    with pytest.raises(gradmom.UnsupportedOpError, match="odd_kernel"):
        unsupported(tf.ones([4, 2, 2, 3]))

    @tf.function
    def bad_batch(x):
        return gradmom.per_example_norms(tf.reduce_mean(x @ w), [w], batch_size=5)

    with pytest.raises(gradmom.BatchSizeError):
        bad_batch(tf.ones([4, 3], tf.float64))

    with pytest.raises(ValueError, match="reduction"):
        tf.function(
            lambda x: gradmom.per_example_norms(tf.reduce_mean(x @ w), [w], reduction="max")
        )(tf.ones([4, 3], tf.float64))


def test_disconnected_variable_gets_zeros_and_the_dynamic_batch_its_shape():
    w = tf.Variable(np.ones((3, 2)))
    unused = tf.Variable(np.ones((2,)))

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float64)])
    def step(x):
        return gradmom.per_example_norms(tf.reduce_mean(tf.square(x @ w)), [w, unused])[1]

    x = np.arange(12.0).reshape(4, 3)
    with pytest.warns(UserWarning, match="does not depend"):
        norms = step(tf.constant(x))
    np.testing.assert_array_equal(norms[1], np.zeros(4))
    # the mean over [n, 2] is a mean of l_j = ||x_j w||^2 / 2: g_j = x_j (x_j w)^T,
    # ||g_j||^2 = ||x_j||^2 ||x_j w||^2
    z = x @ np.ones((3, 2))
    want = np.sum(x**2, 1) * np.sum(z**2, 1)
    np.testing.assert_allclose(norms[0], want, rtol=1e-14)


SEQUENCE_CASES = [
    "dense-sequence",
    "dense-sequence-sum",
    "transformer-encoder-block",
    "raw-einsum",
    "lora-dense-sequence",
    "swin-windows",
    "bert-broadcast-position",
]


@pytest.mark.parametrize("case_id", SEQUENCE_CASES)
def test_gram_and_materialised_forms_agree(case_id, monkeypatch):
    """Dense and EinsumDense on sequences: the Gram ("ghost") form and the materialised
    per-example gradients, each forced, against brute force and against each other."""
    from tb_gradmom.core.rules import base

    case = CASES_BY_ID[case_id]
    results = {}
    for ghost in (True, False):
        monkeypatch.setattr(base, "FORCE_GHOST", ghost)
        forward, variables, x, y, _, norms = _run_case(case)
        results[ghost] = [np.asarray(v) for v in norms]
    want = _reference(case, forward, variables, x, y)
    floor = max(float(np.max(w)) for w in want)
    for v, g, m, w in zip(variables, results[True], results[False], want):
        tol = TOL if tf.as_dtype(v.dtype) == tf.float64 else 2e-5
        _assert_norms(g, w, f"{case_id} {variable_name(v)} ghost", tol, floor)
        _assert_norms(m, w, f"{case_id} {variable_name(v)} materialised", tol, floor)
        _assert_norms(g, m, f"{case_id} {variable_name(v)} ghost vs materialised", tol, floor)


@pytest.mark.parametrize("case_id", ["dense-sequence", "transformer-encoder-block", "mlp"])
@pytest.mark.parametrize("chunk_size", [1, 2])
def test_chunks_and_a_batch_unknown_at_trace_time(case_id, chunk_size, monkeypatch):
    from tb_gradmom.core.rules import base

    case = CASES_BY_ID[case_id]
    forward, variables = case.build("float64")
    x, y = case.inputs(np.random.default_rng(0), "float64")
    sig = [tf.TensorSpec([None, *t.shape[1:]], tf.as_dtype(t.dtype)) for t in (x, y)]

    def step(x, y):
        loss = _loss(case, forward(x), y)
        return gradmom.per_example_norms(loss, variables, chunk_size=chunk_size)[1]

    want = _reference(case, forward, variables, x, y)
    floor = max(float(np.max(w)) for w in want)
    for ghost in (True, False):
        monkeypatch.setattr(base, "FORCE_GHOST", ghost)
        norms = tf.function(step, input_signature=sig)(tf.constant(x), tf.constant(y))
        for v, got, w in zip(variables, norms, want):
            _assert_norms(got, w, f"{case_id} {variable_name(v)} ghost={ghost}", TOL, floor)


PENALISED_CASES = [
    "mlp",
    "raw-module",
    "dense-sequence",
    "transformer-encoder-block",
    "layernorm-sequence",
    "embedding-repeated-ids",
    "embedding-tied-output",
    "conv1d-stride2-same",
    "conv2d-valid",
    "conv2d-stride2-same",
    "conv3d-stride2-same",
    "depthwise-conv2d-stride2-same",
    "separable-conv2d-valid",
    "conv2d-transpose-stride2-valid",
    "lstm-classifier",
    "custom-ops-fallback",
]


def _penalised(case_id, reduction, dtype="float64"):
    """``reduction`` of the case's per-example losses plus ``R = 0.3 sum_v ||v||^2`` over
    every variable: ``(variables, ours, reference)``; the reference's per-example loss is
    ``l_j + R`` (mean) or ``l_j + R / n`` (sum)."""
    case = CASES_BY_ID[case_id]
    forward, variables = case.build(dtype)
    x, y = case.inputs(np.random.default_rng(0), dtype)
    n = x.shape[0]
    per_example = case.per_example_loss or squared_error

    def penalty():
        return 0.3 * tf.add_n([tf.reduce_sum(tf.square(tf.cast(v, dtype))) for v in variables])

    @tf.function
    def step(x, y):
        per = per_example(forward(x), y)
        loss = tf.reduce_mean(per) if reduction == "mean" else tf.reduce_sum(per)
        return gradmom.per_example_norms(loss + penalty(), variables)[1]

    norms = step(tf.constant(x), tf.constant(y))
    share = 1.0 if reduction == "mean" else 1.0 / n
    per_ex = reference.per_example_gradients(
        forward, variables, lambda out, y: per_example(out, y) + share * penalty(), x, y
    )
    want = [np.sum(g.reshape(n, -1).astype(np.float64) ** 2, axis=1) for g in per_ex]
    return variables, norms, want


@pytest.mark.filterwarnings("ignore:tb_gradmom. no exact rule")
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("case_id", PENALISED_CASES)
def test_penalty_on_every_variable(case_id, reduction):
    variables, norms, want = _penalised(case_id, reduction)
    floor = max(float(np.max(w)) for w in want)
    for v, got, w in zip(variables, norms, want):
        _assert_norms(got, w, f"{case_id} {reduction} {variable_name(v)}", TOL, floor)


CONV_CASES = [
    "conv1d-valid",
    "conv2d-valid",
    "conv2d-stride2-same",
    "conv2d-stride21-valid",
    "conv3d-stride2-same",
    "depthwise-conv2d-stride2-same",
    "conv2d-transpose-stride2-valid",
]


CONV_PATHS = [
    "default",
    "ghost",
    "unfolded-channels-first",
    "unfolded-channels-last",
    "native",
    "products-1",
    "products-2",
    "products-all",
]


@pytest.mark.parametrize("case_id", CONV_CASES)
@pytest.mark.parametrize("path", CONV_PATHS)
def test_conv_paths(case_id, path, monkeypatch):
    """A convolution's norms by the form chosen per layer (`default`), the Gram form of the
    unfolded input (`ghost`), its per-example gradients by one batched matmul of the unfolded
    input (channels first or last), TensorFlow's per-example filter gradients (`native`) or
    products of 1, 2 or all kernel offsets, with a penalty (the shift split by the blocks)."""
    from tb_gradmom.core.rules import conv

    if path == "ghost":
        monkeypatch.setattr(conv, "FORCE_NORMS_FORM", "ghost")
    elif path.startswith("unfolded"):
        monkeypatch.setattr(conv, "FORCE_NORMS_FORM", "unfolded")
        first = path.endswith("first")
        monkeypatch.setattr(conv, "_CHANNELS_FIRST_MAX", 1 << 20 if first else 0)
    elif path == "native":
        monkeypatch.setattr(conv, "FORCE_NORMS_FORM", "native")
    elif path != "default":
        per = {"products-1": 1, "products-2": 2, "products-all": 100}[path]
        monkeypatch.setattr(conv, "FORCE_NORMS_FORM", "products")
        monkeypatch.setattr(conv, "_NATIVE_MAX_EXAMPLES", 0)
        monkeypatch.setattr(conv, "_offsets_per_product", lambda n_off, *_: min(per, n_off))
    variables, norms, want = _penalised(case_id, "mean")
    floor = max(float(np.max(w)) for w in want)
    for v, got, w in zip(variables, norms, want):
        _assert_norms(got, w, f"{case_id} {path} {variable_name(v)}", TOL, floor)


@pytest.mark.parametrize(
    "positions, k_in, c_out, form",
    [
        (36, 864, 128, "ghost"),  # 3C3D's third layer: 36 * 992 < 110592
        (144, 576, 96, "unfolded"),  # its second: 144 * 672 > 55296
        (784, 75, 64, "unfolded"),
        (None, 864, 128, "unfolded"),  # positions unknown at trace time
    ],
)
def test_conv_norms_form_by_flops(positions, k_in, c_out, form):
    from tb_gradmom.core.rules import conv

    assert conv._norms_form(positions, k_in, c_out) == form


@pytest.mark.parametrize(
    "case_id",
    [
        "mlp",
        "raw-module",
        "dense-sequence",
        "transformer-encoder-block",
        "layernorm-sequence",
        "embedding-repeated-ids",
        "conv2d-stride2-same",
        "depthwise-conv2d-stride2-same",
        "separable-conv2d-valid",
    ],
)
def test_single_site_variables_take_their_rules_norms(case_id, monkeypatch):
    """No per-example gradient is materialised for these (each variable has one site whose
    rule has a norms form): the core's materialising path is never built."""
    from tb_gradmom.core import norms

    def refuse(vplan, *args, **kwargs):
        raise AssertionError(f"'{vplan.name}' materialised its per-example gradients")

    monkeypatch.setattr(norms, "_materialised", refuse)
    case = CASES_BY_ID[case_id]
    forward, variables, x, y, _, got = _run_case(case)
    want = _reference(case, forward, variables, x, y)
    floor = max(float(np.max(w)) for w in want)
    for v, g, w in zip(variables, got, want):
        _assert_norms(g, w, f"{case_id} {variable_name(v)}", TOL, floor)


def _conv_model(dtype="float64"):
    import keras

    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [
            keras.Input((9, 9, 3), dtype=dtype),
            keras.layers.Conv2D(4, 3, strides=2, padding="same", name="c1", dtype=dtype),
            keras.layers.DepthwiseConv2D(3, padding="valid", name="dw", dtype=dtype),
            keras.layers.Conv2D(6, 1, name="pw", dtype=dtype),
            keras.layers.Flatten(),
            keras.layers.Dense(3, name="out", dtype=dtype),
        ]
    )
    rng = np.random.default_rng(4)
    x = tf.constant(rng.normal(size=(6, 9, 9, 3)), dtype)
    y = tf.constant(rng.integers(0, 3, size=6))
    return model, x, y


def _top_level_ops(fn, *args) -> list[str]:
    """The op types that ``fn``'s outputs need (its graph, without those inside ``tf.cond``
    branches; TensorFlow's Conv2D gradient builds its filter gradient beside the input gradient
    even when nothing reads it, and the function's run prunes it)."""
    graph = fn.get_concrete_function(*args).graph
    seen: set[str] = set()
    todo = [t.op for t in graph.outputs] + list(graph.control_outputs)
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        todo.extend(t.op for t in op.inputs)
        todo.extend(op.control_inputs)
    return [graph.get_operation_by_name(name).type for name in seen]


@pytest.mark.parametrize("penalty", [0.0, 0.3])
def test_norms_mode_takes_conv_gradients_from_the_norms_work(penalty):
    """``compute_logged(mode="norms", exact_gradients=False)``: the kernels' gradients from the
    per-example filter gradients the norms build (no Conv2DBackpropFilter in the step), equal
    to tf.gradients to 1e-12 in float64, and the logged sums equal to those of
    ``exact_gradients=True``."""
    from tb_gradmom.core import moments as core_moments
    from tb_gradmom.core import plan as core_plan
    from tests.cases import sparse_ce

    model, x, y = _conv_model()
    variables = model.trainable_variables

    def make(exact):
        @tf.function
        def step(x, y):
            loss = tf.reduce_mean(sparse_ce(model(x), y))
            loss += penalty * tf.add_n([tf.reduce_sum(tf.square(v)) for v in variables])
            want = tf.gradients(loss, variables)
            plan = core_plan.make_plan(loss, variables, core_plan.Options.check((1,)))
            computed = core_moments.compute_logged(plan, mode="norms", exact_gradients=exact)
            sums = [
                tf.stack([s[k] for k in ("sum_m2", "sum_var", "sum_m2_raw")])
                for s in computed.logged.sums
            ]
            return want, computed.grads, sums

        return step

    results = {}
    for exact in (True, False):
        step = make(exact)
        filters = _top_level_ops(step, x, y).count("Conv2DBackpropFilter")
        # the reference's tf.gradients (2: the 3x3 and 1x1 Conv2D kernels; the depthwise
        # filter keeps its own gradient op), and as many more in the exact step
        assert filters == (4 if exact else 2), (exact, filters)
        want, got, sums = step(x, y)
        for w, g, v in zip(want, got, variables):
            w, g = w.numpy(), g.numpy()
            err = np.max(np.abs(g - w))
            assert err <= 1e-12 * np.max(np.abs(w)), f"{v.path} exact={exact}: {err:.3g}"
        results[exact] = np.array([s.numpy() for s in sums])
    np.testing.assert_allclose(results[False], results[True], rtol=1e-12, atol=0)


def test_norms_mode_summary_exact_gradients_false_on_logged_and_skipped_steps(tmp_path):
    """``summary.moments(mode="norms", exact_gradients=False)`` in a step logged or not (a
    ``tf.cond``): the gradients equal tf.gradients on both sides; TensorFlow's filter gradient
    runs only in the branch that does not log; the written stats equal the exact run's."""
    from tests.cases import sparse_ce

    model, x, y = _conv_model()
    variables = model.trainable_variables
    logs = {}

    def make(exact):
        writer = tf.summary.create_file_writer(str(tmp_path / f"exact{exact}"))
        logs[exact] = (writer, tmp_path / f"exact{exact}")

        @tf.function
        def step(x, y, record):
            loss = tf.reduce_mean(sparse_ce(model(x), y))
            want = tf.gradients(loss, variables)
            with writer.as_default(step=1), tf.summary.record_if(record):
                got = gradmom.summary.moments(loss, variables, mode="norms", exact_gradients=exact)
            return want, got

        return step

    for exact in (True, False):
        step = make(exact)
        ops = _top_level_ops(step, x, y, tf.constant(True))
        # the reference's tf.gradients, and the exact step's own
        assert ops.count("Conv2DBackpropFilter") == (4 if exact else 2), exact
        for record in (False, True):
            want, got = step(x, y, tf.constant(record))
            for w, g, v in zip(want, got, variables):
                w, g = w.numpy(), g.numpy()
                err = np.max(np.abs(g - w))
                assert err <= 1e-12 * np.max(np.abs(w)), f"{v.path} {exact} {record}: {err:.3g}"
        logs[exact][0].close()
    runs = {e: gradmom.data.load(str(logs[e][1]))["."] for e in logs}
    a, b = runs[True], runs[False]
    assert set(a) == set(b) and "_model" in a
    for tag in a:
        (ra,), (rb,) = a[tag], b[tag]
        for key in ("sum_m2", "sum_var", "sum_m2_raw"):
            # float32 on disk: equal, or neighbours where float64 values straddle a rounding
            np.testing.assert_allclose(
                rb.stats[key], ra.stats[key], rtol=2.0**-22, err_msg=f"{tag} {key}"
            )
