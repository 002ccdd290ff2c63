"""Issue 26: examples made in the step. Random draws of the batch's size (a GAN's latents) are
an example source; draws of other shapes stay shared by every example. The moments are checked
against one gradient per example from the batch's forward pass (`tests/test_core.py` runs the
case-table rows `cases.ISSUE26_SOURCE_CASES`); here: the path each variable takes, and draws
whose rows only look like the batch.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom as gradmom
from tests import reference
from tests.cases import (
    CASES_BY_ID,
    ISSUE26_FIXED_ROWS_CASES,
    ISSUE26_SOURCE_CASES,
    ISSUE26_STATIC_TILED_CASES,
    ISSUE26_TILED_CASES,
    squared_error,
)

ORDERS = (1, 2, 3, 4)


def _paths(case_id, dtype="float64", dynamic=False, **kwargs):
    case = CASES_BY_ID[case_id]
    forward, variables = case.build(dtype)
    x, y = case.inputs(np.random.default_rng(0), dtype)
    seen = {}
    sig = None
    if dynamic:
        sig = [tf.TensorSpec([None, *t.shape[1:]], tf.as_dtype(t.dtype)) for t in (x, y)]

    @tf.function(input_signature=sig)
    def step(x, y):
        total = tf.reduce_mean((case.per_example_loss or squared_error)(forward(x), y))
        seen["plan"] = gradmom.plan_moments(total, variables, ORDERS, **kwargs)
        return total

    step(tf.constant(x), tf.constant(y))
    return [v.path for v in seen["plan"].variables]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("case_id", [c.id for c in ISSUE26_SOURCE_CASES])
def test_examples_made_in_the_step_keep_the_rules(case_id, dynamic):
    """Before: the generator's loss "depends on no example" and raised; the discriminator's
    and the two views' concatenation along the batch was not proven (every variable on the
    fallback). The numbers: `tests/test_core.py` (case-table rows, static and dynamic batch).

    The discriminator's generator variables: with a static batch ``tf.shape(x)[0]`` is a
    constant, the latents are shared draws and the fake rows a parameter derived from them,
    pulled back row by row where they join the real ones (``rule: ConcatV2``); with a dynamic
    batch the latents are examples of the real batch, used before the union, and take the
    exact fallback (the rules cannot place their rows among the union's)."""
    paths = _paths(case_id, dynamic=dynamic)
    on_fallback = 2 if dynamic and case_id == "gan-discriminator-concat-real-fake" else 0
    fallback = [p for p in paths if p.startswith("fallback")]
    assert len(fallback) == on_fallback, paths
    assert all("concatenates into the loss's batch" in p for p in fallback), fallback
    assert all(p.startswith("rule") for p in paths[: len(paths) - len(fallback)]), paths


def test_a_variable_before_the_union_with_fallback_error_raises_naming_the_concat():
    with pytest.raises(gradmom.UnsupportedOpError, match=r"ConcatV2 op '.*concat"):
        _paths("gan-discriminator-concat-real-fake", dynamic=True, fallback="error")


def test_losses_over_two_batches_are_refused():
    """``mean(D(concat([real, fake]))) + mean(D(real))``: two sets of examples (the union's
    ``2 n`` rows and the real batch's ``n``), no one split."""
    from tests.cases import RealFakeDiscriminator

    model = RealFakeDiscriminator()
    x = tf.zeros([3, 4], tf.float64)
    model(x)

    @tf.function
    def step(x):
        both = model(x)
        alone = model.d2(model.d1(x))
        total = tf.reduce_mean(both) + tf.reduce_mean(alone)
        return gradmom.gradients_and_moments(total, model.d2.trainable_variables)

    with pytest.raises(gradmom.PerExampleLossError, match="different batches of examples"):
        step(x)


def test_latents_shaped_by_a_python_number_are_examples_when_nothing_else_is():
    """``[batch_size, 3]`` with a Python number (as ``tf.shape(x)[0]`` of a static shape, which
    TensorFlow folds into a constant): read as the batch size only when the loss holds no
    example otherwise (a random matrix ``[d_in, d_out]`` whose ``d_in`` equals it must stay
    shared: the next test). Exact on the rules against the batch's jacobian."""
    from tests.cases import _latent_generator, fake_is_real_ce

    forward, variables = _latent_generator(static=4)("float64")
    x = np.zeros((4, 2))

    seen = {}

    @tf.function
    def step(x):
        total = tf.reduce_mean(fake_is_real_ce(forward(x), None))
        seen["plan"] = gradmom.plan_moments(total, variables, ORDERS, fallback="error")
        return gradmom.gradients_and_moments(total, variables, ORDERS, fallback="error")[1]

    moments = step(tf.constant(x))
    paths = [v.path for v in seen["plan"].variables]
    assert all(p.startswith("rule") for p in paths), paths
    ref = reference.per_example_jacobian(forward, variables, fake_is_real_ce, x, None)
    for m, g in zip(moments, ref):
        want = reference.moments(g, ORDERS)
        for p in ORDERS:
            np.testing.assert_allclose(m[p], want[p], rtol=1e-10, atol=1e-14)


def test_a_random_matrix_whose_rows_match_the_batch_stays_shared():
    """``x @ R`` with ``R = stateless_normal([4, 2])`` drawn in the step and a batch of 4: the
    draw's first axis has the batch's size by coincidence; it stays shared and the rules
    hold."""
    rng = np.random.default_rng(3)
    w = tf.Variable(rng.normal(size=(2, 3)), name="w")

    def forward(x):
        r = tf.random.stateless_normal([4, 2], seed=[5, 6], dtype=tf.float64)
        return tf.tanh(x @ r) @ w

    x, y = rng.normal(size=(4, 4)), rng.normal(size=(4, 3))

    @tf.function
    def step(x, y):
        total = tf.reduce_mean(squared_error(forward(x), y))
        return gradmom.gradients_and_moments(total, [w], ORDERS, fallback="error")[1]

    moments = step(tf.constant(x), tf.constant(y))
    ref = reference.moments(
        reference.per_example_gradients(forward, [w], squared_error, x, y)[0], ORDERS
    )
    for p in ORDERS:
        np.testing.assert_allclose(moments[0][p], ref[p], rtol=1e-10, atol=1e-14)


def test_draws_of_another_shape_stay_shared():
    """Noise ``[d]`` added to every example: shared, the rules hold as before."""
    rng = np.random.default_rng(4)
    w = tf.Variable(rng.normal(size=(3, 2)), name="w")

    def forward(x):
        noise = tf.random.stateless_normal([3], seed=[1, 1], dtype=tf.float64)
        return tf.tanh(x + noise) @ w

    x, y = rng.normal(size=(3, 3)), rng.normal(size=(3, 2))

    @tf.function
    def step(x, y):
        total = tf.reduce_mean(squared_error(forward(x), y))
        return gradmom.gradients_and_moments(total, [w], ORDERS, fallback="error")[1]

    moments = step(tf.constant(x), tf.constant(y))
    ref = reference.moments(
        reference.per_example_gradients(forward, [w], squared_error, x, y)[0], ORDERS
    )
    for p in ORDERS:
        np.testing.assert_allclose(moments[0][p], ref[p], rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("case_id", [c.id for c in ISSUE26_SOURCE_CASES])
def test_examples_made_in_the_step_with_a_dynamic_batch_match_brute_force(case_id):
    """The case-table rows with the batch size unknown at trace time (the latents then hold
    examples, and the generator's variables take the fallback in the discriminator's step),
    against one gradient per row of the batch's loss vector, float64."""
    case = CASES_BY_ID[case_id]
    forward, variables = case.build("float64")
    x, y = case.inputs(np.random.default_rng(0), "float64")
    sig = [tf.TensorSpec([None, *t.shape[1:]], tf.float64) for t in (x, y)]
    reduce = tf.reduce_sum if case.loss == "sum" else tf.reduce_mean

    @tf.function(input_signature=sig)
    def step(x, y):
        total = reduce(case.per_example_loss(forward(x), y))
        return gradmom.gradients_and_moments(total, variables, ORDERS, reduction=case.loss)[1]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning
        moments = step(tf.constant(x), tf.constant(y))
    ref = reference.per_row_jacobian(forward, variables, case.per_example_loss, x, y)
    for m, g in zip(moments, ref):
        want = reference.moments(g, ORDERS)
        for p in ORDERS:
            scale = max(float(np.max(np.abs(want[p]))), 1e-30)
            assert float(np.max(np.abs(np.asarray(m[p]) - want[p]))) <= 1e-10 * scale, (case_id, p)


def test_a_learned_initial_state_tiled_to_the_batch_keeps_the_rules():
    """``tf.tile(h0[None], [tf.shape(x)[0], 1])`` into an LSTM, the batch size unknown at trace
    time: each example's copy is its row (``rule: Tile``: the copy's gradient), the LSTM keeps
    the loop rule. Before: the fallback, "the variable's value changes from step to step". With
    a static batch: the next test."""
    case = ISSUE26_TILED_CASES[0]
    paths = _paths(case.id, dynamic=True, fallback="error")
    assert paths.count("rule: Tile") == 2, paths
    assert all(p.startswith("rule") for p in paths), paths


@pytest.mark.parametrize("case_id", [c.id for c in ISSUE26_TILED_CASES])
def test_a_learned_initial_state_tiled_to_a_static_batch_keeps_the_rules(case_id):
    """Tiled, repeated or broadcast to a static batch (a constant first multiple, as
    ``tf.shape(x)[0]`` of a static shape is folded into): the copies are a parameter derived
    from ``h0``, and the loop's state holds the examples on axis 0 (its fixed point), so the
    loop's rule takes example ``j``'s gradient of the initial state as row ``j`` of its
    gradient, pulled back through the tile (``rule: While``). Before: the fallback, "the
    variable's value changes from step to step". The numbers: `tests/test_core.py` (case rows,
    float64 and float32) and the next test."""
    paths = _paths(case_id, fallback="error")
    assert all(p.startswith("rule") for p in paths), paths
    if case_id in {c.id for c in ISSUE26_STATIC_TILED_CASES}:
        assert paths[:2] == ["rule: While", "rule: While"], paths  # h0 and c0


@pytest.mark.parametrize("case_id", [c.id for c in ISSUE26_TILED_CASES])
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_tiled_states_with_a_static_batch_match_brute_force(case_id, chunk_size):
    case = CASES_BY_ID[case_id]
    forward, variables = case.build("float64")
    x, y = case.inputs(np.random.default_rng(1), "float64")

    @tf.function
    def step(x, y):
        total = tf.reduce_mean(squared_error(forward(x), y))
        return gradmom.gradients_and_moments(
            total, variables, ORDERS, fallback="error", chunk_size=chunk_size
        )

    grads, moments = step(tf.constant(x), tf.constant(y))
    ref = reference.per_example_gradients(forward, variables, squared_error, x, y)
    for g, m, per_ex in zip(grads, moments, ref):
        want = reference.moments(per_ex, ORDERS)
        np.testing.assert_allclose(g, want[1], rtol=1e-10, atol=1e-14)
        for p in ORDERS:
            scale = max(float(np.max(np.abs(want[p]))), 1e-30)
            assert float(np.max(np.abs(np.asarray(m[p]) - want[p]))) <= 1e-10 * scale, (case_id, p)


def test_a_static_tile_into_a_loop_with_a_dynamic_batch_names_the_loop_variable():
    """``tf.tile(h0[None], [4, 1])`` while the batch is unknown at trace time: the loop's state
    (4 rows) and the inputs (n rows) are not proven to be the same examples. The reason names
    the loop variable whose initial value the variable is, not "the variable's value changes
    from step to step"."""
    case = CASES_BY_ID["lstm-learned-initial-state-number-static"]
    with pytest.raises(gradmom.UnsupportedOpError) as info:
        _paths(case.id, dynamic=True, fallback="error")
    msg = str(info.value)
    assert "changes from step to step" not in msg
    assert re.search(r"initial value of loop variable \d+ of While op '.*while'", msg), msg
    assert "examples' axis inside the loop is not proven" in msg, msg


@pytest.mark.parametrize(
    "case_id", [ISSUE26_TILED_CASES[0].id, "lstm-learned-initial-state-broadcast-shape"]
)
def test_tiled_states_with_a_dynamic_batch_match_brute_force(case_id):
    case = CASES_BY_ID[case_id]
    forward, variables = case.build("float64")
    x, y = case.inputs(np.random.default_rng(0), "float64")
    sig = [tf.TensorSpec([None, *t.shape[1:]], tf.float64) for t in (x, y)]

    @tf.function(input_signature=sig)
    def step(x, y):
        total = tf.reduce_mean(squared_error(forward(x), y))
        return gradmom.gradients_and_moments(total, variables, ORDERS, fallback="error")[1]

    moments = step(tf.constant(x), tf.constant(y))
    ref = reference.per_example_gradients(forward, variables, squared_error, x, y)
    for m, g in zip(moments, ref):
        want = reference.moments(g, ORDERS)
        for p in ORDERS:
            scale = max(float(np.max(np.abs(want[p]))), 1e-30)
            assert float(np.max(np.abs(np.asarray(m[p]) - want[p]))) <= 1e-10 * scale, (case_id, p)


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
@pytest.mark.parametrize("case_id", [c.id for c in ISSUE26_FIXED_ROWS_CASES[:2]])
def test_fixed_rows_taken_back_match_brute_force(case_id, dynamic):
    """``concat([x, rows])`` along the batch with the batch size unknown at trace time, a
    shared MLP, then ``h[:tf.shape(x)[0]]``: the two rows hold no example, and the slice takes
    the examples' rows back, so the per-example losses are proven (before: "cannot prove where
    the examples are", every variable on the fallback with a hedging warning). The variables
    used on the joined rows take the exact fallback (named reason), the learned rows' variable
    too; all against one gradient per example, float64, orders 1-4. With a static batch the
    concat is a union (each row an example) and the slice takes its first part back: the
    examples of the input batch again (before: "cannot prove where the examples are"); the
    variables used on the union's rows take the fallback."""
    case = CASES_BY_ID[case_id]
    forward, variables = case.build("float64")
    x, y = case.inputs(np.random.default_rng(2), "float64")
    sig = [
        tf.TensorSpec([None if dynamic else t.shape[0], *t.shape[1:]], tf.float64) for t in (x, y)
    ]
    seen = {}

    @tf.function(input_signature=sig)
    def step(x, y):
        total = tf.reduce_mean(squared_error(forward(x), y))
        seen["plan"] = gradmom.plan_moments(total, variables, ORDERS)
        return gradmom.gradients_and_moments(total, variables, ORDERS)[1]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        moments = step(tf.constant(x), tf.constant(y))
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "cannot prove where the examples are" in m], messages
    paths = [v.path for v in seen["plan"].variables]
    if dynamic:
        assert all("rows that hold no example" in p for p in paths), paths
        assert all("(appended by ConcatV2 op " in p for p in paths if "extra" not in p), paths
    else:
        assert all(p.startswith("fallback") and "ConcatV2 op" in p for p in paths), paths
    ref = reference.per_example_gradients(forward, variables, squared_error, x, y)
    for m, g in zip(moments, ref):
        want = reference.moments(g, ORDERS)
        for p in ORDERS:
            scale = max(float(np.max(np.abs(want[p]))), 1e-30)
            assert float(np.max(np.abs(np.asarray(m[p]) - want[p]))) <= 1e-10 * scale, (case_id, p)


def test_a_loss_over_fixed_rows_with_a_dynamic_batch_is_refused():
    """The same rows left in the loss (``mean`` over ``n + 2`` rows) with the batch size unknown
    at trace time: whether the two rows are examples (a union, as the static batch reads them:
    `tests/test_core.py`, against one gradient per row) or padding cannot be told; the loss is
    refused, the concat named and the fixes given. Before: a warning, and the rows taken as
    examples."""
    case = CASES_BY_ID["concat-learned-rows-in-the-loss"]
    forward, variables = case.build("float64")
    x, y = case.inputs(np.random.default_rng(2), "float64")
    sig = [tf.TensorSpec([None, *t.shape[1:]], tf.float64) for t in (x, y)]

    @tf.function(input_signature=sig)
    def step(x, y):
        total = tf.reduce_mean(case.per_example_loss(forward(x), y))
        return gradmom.gradients_and_moments(total, variables, ORDERS)[1]

    with pytest.raises(gradmom.PerExampleLossError) as info:
        step(tf.constant(x), tf.constant(y))
    msg = str(info.value)
    assert re.search(r"2 more rows that ConcatV2 op '[^']*concat[^']*' joins", msg), msg
    assert "h[:tf.shape(x)[0]]" in msg and "static size" in msg, msg
