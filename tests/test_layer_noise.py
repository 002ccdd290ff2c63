"""Per-layer noise statistics (`stats.layer_sums`, the plugin's ``/series?over=layer``) on a
real log, against numpy on brute-force per-example gradients.

A float64 Keras MLP is trained for a few SGD steps with `summary.moments` logging every step;
before each update the reference takes one `tf.GradientTape` gradient per example
(`tests.reference`) and computes each layer's ``tr(Sigma)``, ``|G|^2`` and ``B_simple`` with
numpy, and their separately smoothed forms with an EMA written out here.
"""

from __future__ import annotations

import csv
import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard import context

import tb_gradmom as gradmom
from tb_gradmom import metadata
from tb_gradmom.analysis import data, stats
from tests import reference

N = 16
STEPS = 6
BETA = 0.7
LAYERS = {"hidden": ("hidden/kernel", "hidden/bias"), "out": ("out/kernel", "out/bias")}


def _per_example_loss(logits, y):
    return keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)


def _ema(x: np.ndarray, beta: float) -> np.ndarray:
    """Bias-corrected EMA, written out (every value finite here)."""
    out, acc = [], 0.0
    for k, v in enumerate(x, start=1):
        acc = beta * acc + (1 - beta) * v
        out.append(acc / (1 - beta**k))
    return np.array(out)


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """(logdir, {layer: {"tv": [STEPS], "g2": [STEPS], "m2": [STEPS]}}) from brute force."""
    logdir = tmp_path_factory.mktemp("layer_noise")
    keras.utils.set_random_seed(3)
    inp = keras.Input((5,), dtype="float64")
    h = keras.layers.Dense(6, activation="tanh", dtype="float64", name="hidden")(inp)
    model = keras.Model(inp, keras.layers.Dense(3, dtype="float64", name="out")(h))
    rng = np.random.default_rng(0)
    writer = tf.summary.create_file_writer(str(logdir))
    opt = keras.optimizers.SGD(0.5)

    @tf.function
    def step(x, y, s):
        with writer.as_default(step=s):
            loss = tf.reduce_mean(_per_example_loss(model(x), y))
            grads = gradmom.summary.moments(loss, model.trainable_variables, max_elements=None)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    paths = [v.path for v in model.trainable_variables]  # the tags: "hidden/kernel", ...
    ref = {layer: {"tv": [], "m2": []} for layer in LAYERS}
    for s in range(STEPS):
        x = rng.normal(size=(N, 5))
        y = (x[:, 0] > 0).astype(np.int64) + (rng.random(N) < 0.3)
        per_ex = reference.per_example_gradients(
            model, model.trainable_variables, _per_example_loss, x, y
        )
        by_tag = dict(zip(paths, per_ex, strict=True))
        for layer, tags in LAYERS.items():
            g = [by_tag[t].reshape(N, -1) for t in tags]
            ref[layer]["tv"].append(sum(np.var(a, axis=0, ddof=1).sum() for a in g))
            ref[layer]["m2"].append(sum((a.mean(axis=0) ** 2).sum() for a in g))
        step(x, y, tf.constant(s, tf.int64))
    writer.close()
    out = {}
    for layer, r in ref.items():
        tv, m2 = np.array(r["tv"]), np.array(r["m2"])
        out[layer] = {"tv": tv, "m2": m2, "g2": m2 - tv / N}
    return logdir, out


def _layer_of_records(logdir, layer):
    runs = data.load(logdir)
    (recs,) = runs.values()
    tags = [t for t, rs in recs.items() if rs and getattr(rs[0].content, "layer", "") == layer]
    assert sorted(tags) == sorted(LAYERS[layer])
    series = {}
    for t in tags:
        rs = recs[t]
        series[t] = (
            np.array([r.step for r in rs]),
            {f: np.array([r.stats[f] for r in rs]) for f in metadata.STATS_FIELDS},
        )
    return recs, series


@pytest.mark.parametrize("layer", list(LAYERS))
def test_layer_noise_scale_equals_numpy_on_brute_force(logged, layer):
    logdir, ref = logged
    _, series = _layer_of_records(logdir, layer)
    steps, sums = stats.layer_sums(series)
    assert steps.tolist() == list(range(STEPS))
    d = stats.derived(sums)
    r = ref[layer]
    # The stats tensor is logged in float32: 1e-6 relative is its rounding.
    np.testing.assert_allclose(d["total_variance"], r["tv"], rtol=2e-6)
    np.testing.assert_allclose(d["grad_norm_sq_unbiased"], r["g2"], rtol=2e-5)
    np.testing.assert_allclose(d["noise_scale"], r["tv"] / r["g2"], rtol=2e-5)
    sm = stats.smoothed(sums, BETA)
    np.testing.assert_allclose(sm["total_variance"], _ema(r["tv"], BETA), rtol=2e-6)
    np.testing.assert_allclose(sm["grad_norm_sq_unbiased"], _ema(r["g2"], BETA), rtol=2e-5)
    np.testing.assert_allclose(
        sm["noise_scale"], _ema(r["tv"], BETA) / _ema(r["g2"], BETA), rtol=2e-5
    )


def test_layers_add_up_to_the_whole_model(logged):
    logdir, _ = logged
    recs, _ = _layer_of_records(logdir, "hidden")
    per_layer = [stats.layer_sums(_layer_of_records(logdir, layer)[1])[1] for layer in LAYERS]
    model = recs[metadata.MODEL_TAG]
    for f in stats.ADDITIVE_FIELDS:
        want = np.array([r.stats[f] for r in model])
        np.testing.assert_allclose(sum(p[f] for p in per_layer), want, rtol=1e-6)
    np.testing.assert_array_equal(per_layer[0]["batch_size"], N)


def test_layer_sums_keeps_common_steps_and_refuses_mixed_calls():
    a = (np.array([0, 1, 2]), {f: np.arange(3.0) + 1 for f in stats.ADDITIVE_FIELDS})
    b = (np.array([1, 2, 3]), {f: np.full(3, 10.0) for f in stats.ADDITIVE_FIELDS})
    a[1]["batch_size"] = np.full(3, 8.0)
    steps, sums = stats.layer_sums({"a": a, "b": b})
    assert steps.tolist() == [1, 2]
    np.testing.assert_array_equal(sums["sum_var"], [12.0, 13.0])
    np.testing.assert_array_equal(sums["batch_size"], [8.0, 8.0])
    assert np.isnan(sums["loss"]).all()
    b[1]["batch_size"] = np.array([8.0, 4.0, 8.0])
    with pytest.raises(ValueError, match=r"'a' and 'b' .* batch sizes 8 and 4 at step 2"):
        stats.layer_sums({"a": a, "b": b})
    with pytest.raises(KeyError, match=r"variable 'c' has no sum 'sum_m2'"):
        stats.layer_sums({"c": (np.array([0]), {"num_elements": np.ones(1)})})
    with pytest.raises(ValueError, match="at least one variable"):
        stats.layer_sums({})


def test_plugin_series_over_layer_equals_numpy(logged):
    from tests.test_plugin import get, get_json, make_app, nums

    logdir, ref = logged
    client, plugin = make_app(str(logdir))[:2]
    for layer, tags in LAYERS.items():
        for tag in tags:
            body = get_json(client, "series", run=".", tag=tag, over="layer", smoothing=BETA)
            assert body["layer"] == layer and sorted(body["variables"]) == sorted(tags)
            assert body["steps"] == list(range(STEPS))
            r = ref[layer]
            np.testing.assert_allclose(
                nums(body["values"]["noise_scale"]), r["tv"] / r["g2"], rtol=2e-5
            )
            np.testing.assert_allclose(
                nums(body["smoothed"]["total_variance"]), _ema(r["tv"], BETA), rtol=2e-6
            )
            np.testing.assert_allclose(
                nums(body["smoothed"]["grad_norm_sq_unbiased"]), _ema(r["g2"], BETA), rtol=2e-5
            )
            np.testing.assert_allclose(
                nums(body["smoothed"]["noise_scale"]),
                _ema(r["tv"], BETA) / _ema(r["g2"], BETA),
                rtol=2e-5,
            )
    # A variable's own series is unchanged by the option's default.
    own = get_json(client, "series", run=".", tag="out/bias")
    assert "layer" not in own
    r = get(client, "series", 404, run=".", tag="nope/kernel", over="layer")
    assert "over=layer takes a variable's tag" in r.get_data(as_text=True)
    r = get(client, "series", 400, run=".", tag="out/bias", over="model")
    assert "over" in r.get_data(as_text=True)
    ctx = context.RequestContext()
    direct = plugin.series_impl(ctx, "", run=".", tag="hidden/kernel", over="layer")
    assert direct["variables"] == sorted(LAYERS["hidden"])
    assert math.isfinite(direct["values"]["noise_scale"][0])


def test_plot_and_export_draw_the_same_layer_numbers(logged, tmp_path):
    from tb_gradmom.viz import export, plot

    logdir, ref = logged
    for layer, tags in LAYERS.items():
        d = plot.curves_data(
            logdir, tag=tags[1], quantities=["noise_scale"], smoothing=BETA, over="layer"
        )
        assert d["layers"]["."] == (layer, sorted(tags))
        r = ref[layer]
        np.testing.assert_allclose(d["runs"]["."]["noise_scale"], r["tv"] / r["g2"], rtol=2e-5)
        np.testing.assert_allclose(
            d["runs"]["."]["noise_scale_smoothed"],
            _ema(r["tv"], BETA) / _ema(r["g2"], BETA),
            rtol=2e-5,
        )
    # One CSV per layer, whichever of its variables --tag matches.
    paths = export.export(
        logdir, tmp_path, tag="kernel|bias", plot_kind="curves", fmt="csv", over="layer",
        quantities=["noise_scale", "total_variance"], smoothing=BETA,
    )  # fmt: skip
    assert sorted(p.rsplit("/", 1)[-1] for p in paths) == [
        "layer-hidden-curves.csv",
        "layer-out-curves.csv",
    ]
    for path in paths:
        layer = path.rsplit("/", 1)[-1][len("layer-") : -len("-curves.csv")]
        rows = list(csv.DictReader(open(path)))
        got = np.array([float(x["noise_scale_smoothed"]) for x in rows])
        r = ref[layer]
        np.testing.assert_allclose(got, _ema(r["tv"], BETA) / _ema(r["g2"], BETA), rtol=2e-5)
        tv = np.array([float(x["total_variance"]) for x in rows])
        np.testing.assert_allclose(tv, r["tv"], rtol=2e-6)
    with pytest.raises(ValueError, match="--over layer draws curves; got --plot heatmap"):
        export.export(logdir, tmp_path / "x", plot_kind="heatmap", fmt="csv", over="layer")
    with pytest.raises(ValueError, match="no variable with a layer name"):
        plot.curves_data(logdir, tag="_model", over="layer")
    pytest.importorskip("matplotlib")
    fig = plot.curves(logdir, tag="out/kernel", over="layer", quantities=["noise_scale"])
    assert fig.axes[0].get_title().startswith("layer out (2 variables summed)")


def test_layer_members_keeps_a_layer_inside_its_group():
    layers = {
        "dense/kernel": "dense",
        "dense/bias": "dense",
        "generator/dense/kernel": "dense",
        "generator/dense/bias": "dense",
        "generator/out/kernel": "out",
        "norm/gamma": "",
    }
    groups = ["", "generator"]
    assert stats.layer_members(layers, "dense/bias", groups) == ["dense/bias", "dense/kernel"]
    assert stats.layer_members(layers, "generator/dense/kernel", groups) == [
        "generator/dense/bias",
        "generator/dense/kernel",
    ]
    assert stats.layer_members(layers, "norm/gamma", groups) == []
    with pytest.raises(KeyError, match="no variable 'x/kernel'"):
        stats.layer_members(layers, "x/kernel", groups)
