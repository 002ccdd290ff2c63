"""The norms and replicas modes under MirroredStrategy over 2 logical CPUs, against brute force.

Run by `tests/test_norms_mode.py` in a fresh process (logical devices must be configured
before TensorFlow initialises its devices):

    python -m tests.norms_distributed_check LOGDIR

Prints one ``ok ...`` line per check; exits non-zero (an AssertionError naming the check, the
variable and the sum) on any mismatch.

- ``mode="norms"``: the sums over the global batch equal numpy sums of brute-force per-example
  gradients (float64, 1e-12), for a mean (``compute_average_loss``), a sum, the [n] vector, a
  weight penalty, an uneven split and a variable on the exact fallback.
- ``mode="replicas"``: the algebra of McCandlish et al.'s estimator, exactly: ``tr(Sigma)`` is
  ``(sum_r b_r |m_r|^2 - N |m|^2) / (R - 1)`` with ``m_r`` each replica's mean of the
  brute-force per-example gradients, ``sum_m2 = |m|^2``; and with one example per replica it
  is the exact per-example estimator (the norms mode's sums).
- Both estimate the same ``tr(Sigma)`` and ``|G|^2``: over many batches of one distribution at
  fixed weights, the mean of the per-step differences is within 4 standard errors of 0.
- ``summary.moments(mode="replicas")`` writes once (replica 0), read back by `data.load`.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

STRATEGY = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

import tb_gradmom as gradmom  # noqa: E402
from tb_gradmom.analysis import data  # noqa: E402
from tb_gradmom.core import moments as core_moments  # noqa: E402
from tb_gradmom.core import plan as core_plan  # noqa: E402
from tests import reference  # noqa: E402
from tests.cases import SinCell, sparse_ce  # noqa: E402

SUMS = ("sum_m2", "sum_var", "sum_m2_raw")
PENALTY = 0.03


def mlp():
    return keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(7, activation="tanh", dtype="float64", name="hidden"),
            keras.layers.Dense(3, dtype="float64", name="out"),
        ]
    )


def conv():
    return keras.Sequential(
        [
            keras.Input((5, 5, 2)),
            keras.layers.Conv2D(3, 3, activation="tanh", dtype="float64", name="conv"),
            keras.layers.Flatten(dtype="float64"),
            keras.layers.Dense(3, dtype="float64", name="out"),
        ]
    )


def sin_rnn():  # the kernel through the exact fallback
    return keras.Sequential(
        [
            keras.Input((4, 3)),
            keras.layers.RNN(SinCell(3, dtype="float64"), dtype="float64", name="rnn"),
            keras.layers.Dense(3, dtype="float64", name="out"),
        ]
    )


def close(a, b, what, tol=1e-12):
    a, b = float(a), float(b)
    assert abs(a - b) <= tol * max(abs(b), 1e-300), f"{what}: {a!r} vs {b!r}"


def penalty(variables):
    return PENALTY * tf.add_n([tf.reduce_sum(tf.square(v)) for v in variables])


class Setup:
    """A model under the strategy, its single-device twin with the same weights, a batch."""

    def __init__(self, build, x_shape, n, seed=4):
        keras.utils.set_random_seed(3)
        with STRATEGY.scope():
            self.model = build()
        self.single = build()
        self.single.set_weights(self.model.get_weights())
        self.x_shape, self.n = x_shape, n
        self.rng = np.random.default_rng(seed)

    def batch(self, n=None):
        n = self.n if n is None else n
        x = self.rng.normal(size=(n, *self.x_shape))
        return x, self.rng.integers(0, 3, size=n)

    def distributed(self, x, y):
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x))
        batch = next(iter(STRATEGY.experimental_distribute_dataset(dataset)))
        sizes = [int(t.shape[0]) for t in STRATEGY.experimental_local_results(batch[0])]
        return batch, sizes

    def step_fn(self, loss_kind, modes):
        """A ``tf.function`` of a distributed batch: per replica, per mode, `Logged.sums`."""
        variables = self.model.trainable_variables
        model = self.model

        @tf.function
        def step(batch, n):
            def replica_fn(x, y):
                losses = sparse_ce(model(x), y)
                if loss_kind == "vector":
                    loss = losses
                elif loss_kind.startswith("sum"):
                    loss = tf.reduce_sum(losses)
                else:
                    loss = tf.nn.compute_average_loss(losses, global_batch_size=n)
                if loss_kind.endswith("+penalty"):
                    loss += penalty(variables) / STRATEGY.num_replicas_in_sync
                reduction = "sum" if loss_kind.startswith("sum") else "mean"
                out = []
                for mode in modes:
                    options = core_plan.Options.check((1,), reduction, None, None, "exact", None)
                    plan = core_plan.make_plan(loss, variables, options, name=f"check_{mode}")
                    logged = core_moments.compute_logged(plan, mode=mode).logged
                    out.append((logged.sums, logged.n))
                return out

            return STRATEGY.run(replica_fn, args=batch)

        return step

    def brute(self, x, y, loss_kind):
        """Per-example gradients ``[n, D_v]`` per variable (float64), penalty included."""
        share = 0.0
        if loss_kind.endswith("+penalty"):
            share = 1.0 if loss_kind.startswith("mean") else 1.0 / len(x)
        single = self.single

        def loss_fn(out, yy):
            base = sparse_ce(out, yy)
            if share:
                base += share * penalty(single.trainable_variables)
            return base

        grads = reference.per_example_gradients(single, single.trainable_variables, loss_fn, x, y)
        return [g.reshape(len(x), -1).astype(np.float64) for g in grads]


def exact_sums(g):
    n = g.shape[0]
    m1 = g.mean(0)
    raw = float(np.sum(g * g)) / n
    m2 = float(m1 @ m1)
    return {"sum_m2": m2, "sum_var": n / (n - 1) * (raw - m2), "sum_m2_raw": raw}


def replica_sums(g, sizes):
    """McCandlish et al.'s estimator (App. A.1), for any split: ``m_r`` the mean of replica
    ``r``'s ``b_r`` per-example gradients, ``m`` the global mean over ``N``."""
    n = g.shape[0]
    m = g.mean(0)
    starts = np.cumsum([0, *sizes])
    groups = [g[a:b] for a, b in zip(starts, starts[1:]) if b > a]
    q = sum(len(gr) * float(gr.mean(0) @ gr.mean(0)) for gr in groups)
    var = (q - n * float(m @ m)) / (len(groups) - 1)
    m2 = float(m @ m)
    return {"sum_m2": m2, "sum_var": var, "sum_m2_raw": m2 + (n - 1) / n * var}


def per_replica(result):
    return STRATEGY.experimental_local_results(result)


def check_algebra(name, build, x_shape, n, loss_kind):
    s = Setup(build, x_shape, n)
    x, y = s.batch()
    batch, sizes = s.distributed(x, y)
    out = per_replica(s.step_fn(loss_kind, ("norms", "replicas"))(batch, n))
    brute = s.brute(x, y, loss_kind)
    variables = s.model.trainable_variables
    for r, ((norms, n_norms), (reps, n_reps)) in enumerate(out):
        assert int(n_norms) == n and int(n_reps) == n, (int(n_norms), int(n_reps))
        for v, a, b, g in zip(variables, norms, reps, brute):
            want_exact, want_rep = exact_sums(g), replica_sums(g, sizes)
            for key in SUMS:
                close(a[key], want_exact[key], f"{name} replica {r} {v.path} norms {key}")
                close(b[key], want_rep[key], f"{name} replica {r} {v.path} replicas {key}")
    print(f"ok {name} {loss_kind} n={n} split {sizes}")


def check_one_example_per_replica():
    """With ``b_r = 1`` the replicas' estimator is the exact per-example one."""
    s = Setup(mlp, (5,), 2)
    x, y = s.batch()
    batch, sizes = s.distributed(x, y)
    assert sizes == [1, 1], sizes
    out = per_replica(s.step_fn("mean+penalty", ("norms", "replicas"))(batch, 2))
    for (norms, _), (reps, _) in out:
        for v, a, b in zip(s.model.trainable_variables, norms, reps):
            for key in SUMS:
                close(b[key], a[key], f"one example per replica {v.path} {key}")
    print("ok replicas == norms with one example per replica")


def check_same_quantity(steps=300, n=16):
    """At fixed weights, per batch of one distribution: the exact (norms) and the replicas
    estimates of tr(Sigma) and |G|^2 of the whole model. Both are unbiased for the same
    quantity, so the mean of their per-step differences is 0 up to its standard error
    (the differences are independent across batches): assert it within 4 standard errors."""
    s = Setup(mlp, (5,), n, seed=11)
    step = s.step_fn("mean", ("norms", "replicas"))
    diffs = {"tr": [], "g2": []}
    exact = {"tr": [], "g2": []}
    for _ in range(steps):
        x, y = s.batch()
        batch, _ = s.distributed(x, y)
        (norms, _), (reps, _) = per_replica(step(batch, n))[0]
        tr_e = sum(float(v["sum_var"]) for v in norms)
        tr_r = sum(float(v["sum_var"]) for v in reps)
        g2_e = sum(float(v["sum_m2"]) - float(v["sum_var"]) / n for v in norms)
        g2_r = sum(float(v["sum_m2"]) - float(v["sum_var"]) / n for v in reps)
        diffs["tr"].append(tr_r - tr_e)
        diffs["g2"].append(g2_r - g2_e)
        exact["tr"].append(tr_e)
        exact["g2"].append(g2_e)
    for key in ("tr", "g2"):
        d = np.asarray(diffs[key])
        se = d.std(ddof=1) / np.sqrt(len(d))
        mean_exact = float(np.mean(exact[key]))
        assert abs(d.mean()) <= 4 * se, (key, d.mean(), se, mean_exact)
        print(
            f"ok same quantity {key}: exact mean {mean_exact:.6g}, replicas - exact "
            f"{d.mean():.3g} +- {se:.3g} (SE over {steps} batches), per-step spread of the "
            f"replicas estimate {np.std(np.asarray(exact[key]) + d, ddof=1):.3g} against the "
            f"exact one's {np.std(exact[key], ddof=1):.3g}"
        )


def check_summary(logdir):
    s = Setup(mlp, (5,), 6)
    x, y = s.batch()
    batch, _ = s.distributed(x, y)
    variables = s.model.trainable_variables
    writer = tf.summary.create_file_writer(logdir)
    model = s.model

    @tf.function
    def step(batch):
        def replica_fn(x, y):
            loss = tf.nn.compute_average_loss(sparse_ce(model(x), y), global_batch_size=6)
            with writer.as_default(step=2):
                return gradmom.summary.moments(loss, variables, mode="replicas", name="rep")

        return STRATEGY.run(replica_fn, args=batch)

    step(batch)
    writer.flush()
    run = data.load(logdir)["."]
    want = [replica_sums(g, [3, 3]) for g in s.brute(x, y, "mean")]
    (model_rec,) = run["rep/_model"]
    assert model_rec.content.source == "replicas" and model_rec.batch_size == 6
    for key in SUMS:
        close(model_rec.stats[key], sum(w[key] for w in want), f"logged _model {key}", 2e-7)
    assert not any(r.moments for recs in run.values() for r in recs)
    print("ok summary replicas")


def check_log_examples(logdir, build, x_shape, n, loss_kind, mode):
    """``log_examples=True`` with integer ids under the strategy: the logged rows are the
    global batch's examples in order, each norm and loss that of brute force."""
    s = Setup(build, x_shape, n)
    x, y = s.batch()
    ids = np.arange(n, dtype=np.int64) * 7 + 100
    dataset = tf.data.Dataset.from_tensor_slices((x, y, ids)).batch(n)
    batch = next(iter(STRATEGY.experimental_distribute_dataset(dataset)))
    sizes = [int(t.shape[0]) for t in STRATEGY.experimental_local_results(batch[0])]
    variables = s.model.trainable_variables
    model = s.model
    writer = tf.summary.create_file_writer(logdir)
    group = f"ex_{mode}_{loss_kind.replace('+', '_')}_{build.__name__}"

    @tf.function
    def step(batch):
        def replica_fn(x, y, i):
            losses = sparse_ce(model(x), y)
            if loss_kind.startswith("sum"):
                loss = tf.reduce_sum(losses)
            else:
                loss = tf.nn.compute_average_loss(losses, global_batch_size=n)
            if loss_kind.endswith("+penalty"):
                loss += penalty(variables) / STRATEGY.num_replicas_in_sync
            reduction = "sum" if loss_kind.startswith("sum") else "mean"
            with (
                writer.as_default(step=tf.constant(5, tf.int64)),
                tf.summary.record_if(tf.constant(True)),
            ):
                return gradmom.summary.moments(
                    loss,
                    variables,
                    reduction=reduction,
                    mode=mode,
                    example_ids=i,
                    per_variable_norms=True,
                    name=group,
                )

        return STRATEGY.run(replica_fn, args=batch)

    step(batch)
    writer.flush()
    (rec,) = data.load_examples(logdir)["."][f"{group}/_examples"]
    assert rec.batch_size == n and list(rec.positions) == list(range(n)), rec.positions
    assert list(rec.ids) == list(ids), rec.ids
    per_ex = s.brute(x, y, loss_kind)
    norms = [np.sum(g * g, axis=1) for g in per_ex]
    model_norm = np.sum(norms, axis=0)
    err = np.max(np.abs(rec.model - model_norm) / np.abs(model_norm))
    assert err <= 1e-12, (group, err)
    for v, want in zip(variables, norms):
        tag = next(t for t in rec.variables if v.path.endswith(t.split("/", 1)[1]))
        got = rec.variables[tag]
        assert np.max(np.abs(got - want)) <= 1e-12 * max(np.max(np.abs(want)), 1e-300), tag
    losses = sparse_ce(s.single(x), y).numpy()
    assert np.max(np.abs(rec.losses - losses)) <= 1e-12 * np.max(np.abs(losses)), group
    print(f"ok log_examples {mode} {build.__name__} {loss_kind} n={n} split {sizes}")


def check_per_example_norms(build, x_shape, n, loss_kind):
    """`gradmom.per_example_norms` inside `strategy.run`: each replica's ``[b_r]`` norms are
    those of its own examples, against brute force on the global batch."""
    s = Setup(build, x_shape, n)
    x, y = s.batch()
    batch, sizes = s.distributed(x, y)
    variables = s.model.trainable_variables
    model = s.model

    @tf.function
    def step(batch):
        def replica_fn(x, y):
            losses = sparse_ce(model(x), y)
            if loss_kind.startswith("sum"):
                loss = tf.reduce_sum(losses)
            else:
                loss = tf.nn.compute_average_loss(losses, global_batch_size=n)
            if loss_kind.endswith("+penalty"):
                loss += penalty(variables) / STRATEGY.num_replicas_in_sync
            reduction = "sum" if loss_kind.startswith("sum") else "mean"
            return gradmom.per_example_norms(loss, variables, reduction=reduction)[1]

        return STRATEGY.run(replica_fn, args=batch)

    out = per_replica(step(batch))
    norms = [np.sum(g * g, axis=1) for g in s.brute(x, y, loss_kind)]
    starts = np.cumsum([0, *sizes])
    for r, got in enumerate(out):
        for v, g, want in zip(variables, got, norms):
            w = want[starts[r] : starts[r + 1]]
            err = np.max(np.abs(np.asarray(g) - w)) / max(np.max(np.abs(w)), 1e-300)
            assert err <= 1e-12, (v.path, r, err)
    print(f"ok per_example_norms {build.__name__} {loss_kind} n={n} split {sizes}")


def main(logdir):
    assert STRATEGY.num_replicas_in_sync == 2
    check_algebra("mlp", mlp, (5,), 6, "mean")
    check_algebra("mlp", mlp, (5,), 7, "mean+penalty")
    check_algebra("mlp", mlp, (5,), 7, "sum+penalty")
    check_algebra("mlp", mlp, (5,), 6, "vector")
    check_algebra("conv", conv, (5, 5, 2), 6, "mean")
    check_algebra("sin_rnn", sin_rnn, (4, 3), 7, "sum")
    check_one_example_per_replica()
    check_same_quantity()
    check_summary(logdir)
    check_log_examples(logdir, mlp, (5,), 7, "mean+penalty", "norms")
    check_log_examples(logdir, mlp, (5,), 7, "sum+penalty", "moments")
    check_log_examples(logdir, sin_rnn, (4, 3), 7, "mean", "moments")
    check_log_examples(logdir, conv, (5, 5, 2), 6, "sum", "norms")
    check_per_example_norms(mlp, (5,), 7, "mean+penalty")
    check_per_example_norms(sin_rnn, (4, 3), 7, "sum+penalty")


if __name__ == "__main__":
    main(sys.argv[1])
