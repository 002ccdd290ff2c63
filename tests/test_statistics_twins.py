"""The in-graph statistics (`summary._derived`, the written scalars) and the numpy ones
(`stats.derived`) are one definition: each is checked against the other and against an
independent computation from brute-force per-example gradients (one ``tape.gradient`` per
example, float64), for every scalar `summary.moments` writes and every sum of its stats tensors.
"""

from __future__ import annotations

import glob
import math

import numpy as np
import pytest
import tensorflow as tf

from tb_gradmom.analysis import data, stats
from tb_gradmom.writers import summary

# Problems as data: the labels decide whether the signal or the noise dominates.
CASES = [
    {"id": "signal-dominated-n8", "n": 8, "labels": "teacher", "seed": 0},
    {"id": "noise-dominated-n4", "n": 4, "labels": "random", "seed": 3},
    {"id": "n3", "n": 3, "labels": "teacher", "seed": 6},
]
LR = 0.05


def _problem(case):
    rng = np.random.default_rng(case["seed"])
    n = case["n"]
    x = rng.normal(size=(n, 3))
    if case["labels"] == "teacher":
        y = (x @ np.array([1.0, -2.0, 0.5]) > 0).astype(np.int64)
    else:
        y = rng.integers(0, 2, size=n)
    w1 = tf.Variable(rng.normal(size=(3, 4)) * 0.5, name="w1", dtype=tf.float64)
    b1 = tf.Variable(rng.normal(size=(4,)) * 0.1, name="b1", dtype=tf.float64)
    w2 = tf.Variable(rng.normal(size=(4, 2)) * 0.5, name="w2", dtype=tf.float64)
    variables = [w1, b1, w2]

    def per_example_loss(xb, yb):
        logits = tf.nn.relu(xb @ w1 + b1) @ w2
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=yb, logits=logits)

    return x, y, variables, per_example_loss


def _brute_force(x, y, variables, per_example_loss):
    """Per-example gradients ``[n, *shape]`` per variable, one example at a time."""
    grads = [[] for _ in variables]
    for j in range(len(x)):
        with tf.GradientTape() as tape:
            lj = tf.reduce_sum(per_example_loss(x[j : j + 1], y[j : j + 1]))
        for i, g in enumerate(tape.gradient(lj, variables)):
            grads[i].append(g.numpy())
    loss = float(np.mean(per_example_loss(x, y).numpy()))
    return [np.stack(g) for g in grads], loss


def _definitions(g: np.ndarray, loss: float, lr: float) -> dict[str, float]:
    """Each statistic from its paper's definition, from per-example gradients ``g [n, D]``."""
    n, d = g.shape
    mean = g.mean(axis=0)
    dev = g - mean
    var = (dev**2).sum(axis=0) / (n - 1) if n > 1 else np.full(d, np.nan)
    tr_sigma = var.sum()
    norm_sq = float(mean @ mean)
    true_norm_sq = norm_sq - tr_sigma / n
    pos = var > 0
    gsnr = mean[pos] ** 2 / var[pos]
    return {
        "total_variance": tr_sigma,
        "grad_norm_sq": norm_sq,
        "grad_norm_sq_unbiased": true_norm_sq,
        "noise_scale": tr_sigma / true_norm_sq,
        "gsnr_mean": gsnr.mean() if gsnr.size else math.nan,
        "norm_test": math.sqrt(tr_sigma / (n * norm_sq)),
        "eb_criterion": 1 - n / d * gsnr.sum(),
        # CABS: lr * (biased, 1/n) total variance of the per-example gradients / loss
        "cabs_batch_size": lr * (dev**2).sum() / n / loss,
        # and the logged sums themselves
        "sum_m2": norm_sq,
        "sum_var": tr_sigma,
        "sum_gsnr": gsnr.sum(),
        "gsnr_count": float(pos.sum()),
        "sum_m2_raw": float((g**2).mean(axis=0).sum()),
        "num_elements": float(d),
        "batch_size": float(n),
    }


def _events(logdir):
    """{tag: value} of every tensor written (one step), scalars and stats tensors alike."""
    out = {}
    for path in glob.glob(f"{logdir}/**/events.out.tfevents.*", recursive=True):
        for raw in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(raw.numpy())
            for v in event.summary.value:
                out[v.tag] = tf.make_ndarray(v.tensor)
    return out


def _log(case, tmp_path):
    x, y, variables, per_example_loss = _problem(case)
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function
    def step(xb, yb):
        loss = tf.reduce_mean(per_example_loss(xb, yb))
        with writer.as_default(step=0):
            summary.moments(loss, variables, learning_rate=LR)
        return loss

    step(tf.constant(x), tf.constant(y))
    writer.flush()
    return x, y, variables, per_example_loss


def _variable_of(tag: str, names: list[str]) -> str | None:
    """The variable (or "_model") a written tag belongs to, with or without a name prefix."""
    parts = tag.split("/")
    if "_model" in parts:
        return "_model"
    for nm in names:
        if tag == nm or tag.endswith("/" + nm):
            return nm
    return None


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_every_written_scalar_matches_brute_force(case, tmp_path):
    x, y, variables, per_example_loss = _log(case, tmp_path)
    grads, loss = _brute_force(x, y, variables, per_example_loss)
    names = [v.name[:-2] for v in variables]
    flat = {nm: g.reshape(case["n"], -1) for nm, g in zip(names, grads, strict=True)}
    flat["_model"] = np.concatenate(list(flat.values()), axis=1)
    want = {k: _definitions(g, loss, LR) for k, g in flat.items()}

    events = _events(tmp_path)
    seen = {k: set() for k in want}
    for tag, value in events.items():
        if not tag.startswith("gradmom/"):
            continue
        head, key = tag[len("gradmom/") :].rsplit("/", 1)
        owner = _variable_of(head, names)
        assert owner is not None, tag
        assert key in want[owner], f"{tag}: a written scalar with no reference"
        ref = want[owner][key]
        got = float(value)
        if math.isnan(ref):
            assert math.isnan(got), tag
        else:
            # Written as float32 from float64 sums: the float32 rounding of the value, plus
            # the cancellation in |m|^2 - tr(Sigma)/n for the noise scale (measured <= 3e-7).
            assert got == pytest.approx(ref, rel=2e-6, abs=1e-12), tag
        seen[owner].add(key)
    for owner, keys in seen.items():
        assert keys == set(summary.SCALARS), (owner, sorted(set(summary.SCALARS) - keys))
    if case["labels"] == "random":  # noise-dominated: negative estimates are written, not clipped
        assert any(float(v) < 0 for k, v in events.items() if k.endswith("_model/noise_scale"))


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_every_logged_sum_matches_brute_force(case, tmp_path):
    x, y, variables, per_example_loss = _log(case, tmp_path)
    grads, loss = _brute_force(x, y, variables, per_example_loss)
    names = [v.name[:-2] for v in variables]
    flat = {nm: g.reshape(case["n"], -1) for nm, g in zip(names, grads, strict=True)}
    flat["_model"] = np.concatenate(list(flat.values()), axis=1)
    run = next(iter(data.load(str(tmp_path)).values()))
    checked = set()
    for tag, records in run.items():
        owner = _variable_of(tag, names)
        rec = records[0]
        if owner is None or rec.stats is None:
            continue
        ref = _definitions(flat[owner], loss, LR)
        for k in ("sum_m2", "sum_var", "sum_gsnr", "gsnr_count", "sum_m2_raw", "num_elements"):
            if math.isnan(ref[k]):
                assert math.isnan(rec.stats[k]), (tag, k)
            else:
                assert rec.stats[k] == pytest.approx(ref[k], rel=1e-6, abs=1e-12), (tag, k)
        assert rec.stats["batch_size"] == case["n"]
        assert rec.stats["loss"] == pytest.approx(loss, rel=1e-6)
        assert rec.stats["learning_rate"] == pytest.approx(LR, rel=1e-6)
        # The numpy statistics from the logged sums: the same numbers as from the gradients.
        d = stats.derived(rec.stats)
        for k in stats.STATISTICS:
            if math.isnan(ref[k]):
                assert math.isnan(d[k]), (tag, k)
            else:
                assert d[k] == pytest.approx(ref[k], rel=2e-5, abs=1e-12), (tag, k)
        checked.add(owner)
    assert checked == set(flat)


def _random_fields(rng, steps=5):
    n = rng.integers(2, 40, size=steps).astype(float)
    n[0] = 1.0  # a batch of one: no variance
    d = rng.integers(1, 100, size=steps).astype(float)
    fields = {
        "batch_size": n,
        "num_elements": d,
        "sum_m2": rng.uniform(0, 2, steps),
        "sum_var": rng.uniform(0, 20, steps),  # noise-dominated steps included
        "sum_gsnr": rng.uniform(0, 5, steps),
        "gsnr_count": np.where(rng.uniform(size=steps) < 0.3, 0.0, d),
        "sum_m2_raw": rng.uniform(2, 30, steps),
        "loss": rng.uniform(0.1, 3, steps),
        "learning_rate": np.full(steps, 0.1),
    }
    fields["sum_var"][0] = np.nan
    return fields


def test_in_graph_derived_is_stats_derived():
    """`summary._derived` (what the scalars are) against `stats.derived`, in float64."""
    fields = _random_fields(np.random.default_rng(0))
    graph = summary._derived({k: tf.constant(v, tf.float64) for k, v in fields.items()})
    numpy = stats.derived(fields)
    assert set(summary.SCALARS) <= set(graph)
    for k in summary.SCALARS:
        np.testing.assert_allclose(graph[k].numpy(), numpy[k], rtol=1e-13, err_msg=k)
