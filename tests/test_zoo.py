"""The model zoo (`tests/zoo.py`) against brute-force per-example gradients.

Every entry, float64, orders 1-4: `gradients_and_moments(mean loss, variables,
orders=(1, 2, 3, 4), fallback="error")` in a `tf.function` (``fallback="exact"`` for the
recurrent entries) against one tape gradient per example on its own slice of the batch
(`tests/reference.py`; from the batch's forward pass instead when the model's outputs are not
the same on the batch and on one example, `zoo_worker.forward_spread`). Relative error <= 1e-9 per variable and order (`max_rel_err`), and no
variable on the fallback path outside the sparse-lookup entries. Entries marked
``float32_inside`` (keras_hub Llama/Mistral/Gemma/DeBERTaV3 and LoRA, whose layers cast to or
create float32 whatever the model's dtype) run inside `zoo.float64_inside`, which makes those
float32 computations float64, and are judged at 1e-9 too. One documented exception: the
``lora-dense-float32-adapters`` entry keeps Keras' own float32 LoRA adapters in a float64 layer;
their float32 moments are judged at test_core's float32 bound 2e-5.

``GRADMOM_ZOO=full`` adds the heavy ``keras.applications`` members. Entries marked ``isolate``
(the applications) run in a child process each (`tests/zoo_worker.py`), ``GRADMOM_ZOO_JOBS``
(default 2) at a time, started together when the first of them is reached.

Entries with ``raises`` (a mixture of experts' aux loss through ``model.losses``, CLIP's and
SigLIP's contrastive losses) must be refused with that error; every other entry asserts how
many variables take the exact fallback (``Entry.on_fallback``: 0 but for the sparse lookups and
the shifted-window Swin), so that a proof that lands shows. ``reference="rows"`` entries (a
GAN's steps with latents drawn in the step, a discriminator on ``concat([real, fake])``) are
checked against one gradient per entry of the batch's loss vector.

Measured on the 2-core machine: see the timings in `tests/zoo.py` and `KNOWN_FAILURES` below.
The entries are marked slow but for `QUICK`, one of each kind; the other tests check the
worker's machinery on small models and are quick.
"""

from __future__ import annotations

import concurrent.futures
import os

import pytest

from tests import zoo, zoo_worker

pytestmark = [
    pytest.mark.filterwarnings("ignore:tb_gradmom"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

# The entries in the quick set (``-m "not slow"``), one per path `test_zoo_entry_exact` takes:
# a ``keras.applications`` member in its child process, an in-process entry, a refused loss.
# Every other entry is marked slow.
QUICK = ("app-mobilenet", "lora-dense", "hub-clip-contrastive")

# The entries that fail under the current core, with the failure seen (core at 17bccd5). Remove
# a line when its fix lands: strict xfail turns a fixed entry into an XPASS(strict) failure.
KNOWN_FAILURES: dict[str, str] = {}


def _params():
    # In-process entries first: the isolated ones run meanwhile in their child processes.
    for entry in sorted(zoo.selected(), key=lambda e: e.isolate):
        marks = [] if entry.id in QUICK else [pytest.mark.slow]
        if entry.id in KNOWN_FAILURES:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[entry.id]))
        yield pytest.param(entry, id=entry.id, marks=marks)


_POOL: dict = {}


@pytest.fixture(scope="module")
def isolated_results(request):
    """Futures of the isolated entries selected in this session, started together."""
    selected = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        entry = callspec.params.get("entry") if callspec else None
        if isinstance(entry, zoo.Entry) and entry.isolate:
            selected.append(entry.id)
    jobs = int(os.environ.get("GRADMOM_ZOO_JOBS", "2"))
    pool = concurrent.futures.ThreadPoolExecutor(max(1, jobs))
    futures = {i: pool.submit(zoo_worker.run_in_subprocess, i) for i in selected}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("entry", list(_params()))
def test_zoo_entry_exact(entry, isolated_results):
    if entry.raises:  # a loss the core must refuse, with the documented error
        with pytest.raises(Exception) as info:
            zoo_worker.evaluate(entry)
        kind, fragment = entry.raises
        assert type(info.value).__name__ == kind, info.value
        assert fragment in str(info.value), str(info.value)
        return
    if entry.isolate:
        future = isolated_results.get(entry.id)
        result = future.result() if future else zoo_worker.run_in_subprocess(entry.id)
        if result.get("error"):
            err = result["error"]
            raise AssertionError(
                f"{entry.id}: {err['type']}: {err['first_line']}\n{err.get('traceback', '')}"
            )
    else:
        result = zoo_worker.evaluate(entry)
    bad = zoo_worker.failures(result, entry)
    assert not bad, (
        f"{entry.id}: "
        + "; ".join(bad[:20])
        + (f" (and {len(bad) - 20} more)" if len(bad) > 20 else "")
    )
    paths = [v["path"] for v in result["vars"]]
    assert "unknown" not in paths, (
        f"{entry.id}: could not see the path taken (tb_gradmom.core.plan.make_plan changed?): "
        "adapt zoo_worker.spy_plans"
    )
    if entry.fallback == "error":
        assert all(p.startswith("rule") for p in paths), paths
    # exact by rules, or through the fallback for exactly this many variables (an improvement
    # shows: lower `Entry.on_fallback`)
    on_fallback = [p for p in paths if p.startswith("fallback")]
    assert len(on_fallback) == entry.on_fallback, (len(on_fallback), on_fallback[:3])


def test_max_rel_err_judges_vanishing_moments_against_the_model():
    import numpy as np

    # own scale 2: error 2e-9 is 1e-9 relative
    assert zoo_worker.max_rel_err(np.array([2.0 + 2e-9]), np.array([2.0]), 10.0) == pytest.approx(
        1e-9
    )
    # a vanishing true moment (1e-20 of a model scale 1): judged against 1
    assert zoo_worker.max_rel_err(np.array([3e-12]), np.array([1e-20]), 1.0) == pytest.approx(3e-12)
    assert zoo_worker.max_rel_err(np.array([np.nan]), np.array([1.0]), 1.0) == float("inf")
    assert zoo_worker.max_rel_err(np.zeros(2), np.zeros(3), 1.0) == float("inf")


def test_quick_entries_exist_and_cover_each_path():
    entries = [zoo.ENTRIES_BY_ID[i] for i in QUICK]
    assert all(not e.heavy for e in entries)
    assert [bool(e.isolate) for e in entries] == [True, False, False]
    assert [e.raises is not None for e in entries] == [False, False, True]


def test_zoo_covers_every_application_family_by_default():
    import keras

    default = {e.id for e in zoo.selected("default")}
    families = {}
    for e in zoo.APPLICATION_ENTRIES:
        families.setdefault(e.family, []).append(e.id)
    for family, ids in families.items():
        assert any(i in default for i in ids), family
    constructors = {n for n in dir(keras.applications) if n[:1].isupper()}
    listed = {name for members in zoo.APPLICATIONS.values() for name, *_ in members}
    assert constructors == listed, constructors ^ listed


def test_groups_cover_every_variable_in_order_within_the_budget():
    import numpy as np
    import tensorflow as tf

    sizes = (10, 3, 50, 7, 7, 1, 30)
    variables = [tf.Variable(np.zeros(s)) for s in sizes]
    assert zoo_worker._groups(variables, 8 * sum(sizes)) == [list(range(len(sizes)))]
    groups = zoo_worker._groups(variables, 8 * 40)
    assert [i for g in groups for i in g] == list(range(len(sizes)))
    assert len(groups) > 2
    for g in groups:  # the 50-element variable is a group of its own
        assert len(g) == 1 or 8 * sum(sizes[i] for i in g) <= 8 * 40


@pytest.mark.parametrize("entry_id", ["prelu-conv-shared-axes", "lora-dense"])
def test_grouped_evaluation_checks_every_variable_as_one_call_does(entry_id, monkeypatch):
    """Over `GROUP_BYTES` (the heavy ConvNeXt/EfficientNetV2L members) `evaluate` traces one
    `gradients_and_moments` per group of variables against a streamed reference: the same
    variables, paths and errors (judged against the whole model's largest moments)."""
    entry = zoo.ENTRIES_BY_ID[entry_id]
    whole = zoo_worker.evaluate(entry)
    monkeypatch.setattr(zoo_worker, "GROUP_BYTES", 64)
    grouped = zoo_worker.evaluate(entry)
    assert whole["groups"] == 1 and grouped["groups"] > 2
    assert whole["reference"] == grouped["reference"] == "own slice"
    assert not zoo_worker.failures(grouped, entry)
    assert grouped["floor"] == pytest.approx(whole["floor"], abs=1e-15)
    for a, b in zip(whole["vars"], grouped["vars"], strict=True):
        # (a second build in the process: Keras numbers the layer names on)
        assert (a["shape"], a["path"]) == (b["shape"], b["path"])
        assert b["grad_rel"] == pytest.approx(a["grad_rel"], abs=1e-15)
        for p in zoo_worker.ORDERS:
            assert b["rel"][p] == pytest.approx(a["rel"][p], abs=1e-15)


def _coupled_entry() -> zoo.Entry:
    """Dense -> BatchNormalization (training) -> Dense: each example's output depends on the
    others, so one example's own forward pass is another function. Only the variables from the
    normalisation on are checked (those are exact against the batch's jacobian; see README)."""
    import keras
    import numpy as np

    def build(dtype):
        keras.utils.set_random_seed(0)
        with zoo.dtype_policy(dtype):
            model = keras.Sequential(
                [
                    keras.Input((5,)),
                    keras.layers.Dense(4),
                    keras.layers.BatchNormalization(),
                    keras.layers.Dense(3),
                ]
            )
        rng = np.random.default_rng(0)
        x = rng.normal(size=(4, 5)).astype(dtype)
        y = rng.normal(size=(4, 3)).astype(dtype)

        def forward(x):
            return model(x, training=True)

        return forward, model.trainable_variables[2:], (x, y), zoo.squared_error

    return zoo.Entry("bn-training-coupled", "tests", build)


@pytest.mark.parametrize("group_bytes", [None, 64])
def test_reference_from_the_batch_forward_when_one_example_is_another_function(
    group_bytes, monkeypatch
):
    """EfficientNetV2L at random initialisation amplifies float64 rounding until its outputs on
    one example differ from the batch's by 35%: a reference on each example's own slice is then
    not the model the core sees. `evaluate` measures that spread and takes each example's loss
    from the batch's forward pass instead (one gradient per example still), in one call and in
    groups; here the spread comes from a batch statistic."""
    entry = _coupled_entry()
    if group_bytes:
        monkeypatch.setattr(zoo_worker, "GROUP_BYTES", group_bytes)
    result = zoo_worker.evaluate(entry)
    assert result["spread"] > 1e-3
    assert result["reference"] == "batch forward"
    assert (result["groups"] > 1) == bool(group_bytes)
    assert not zoo_worker.failures(result, entry), zoo_worker.failures(result, entry)
    assert "reference from the batch's forward pass" in zoo_worker.status(result, entry)
