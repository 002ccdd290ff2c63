"""Writes real TensorBoard event files for the plugin tests and the benchmark.

Event files are written by TensorFlow's own summary writer (``tf.summary.write`` with the
content messages of `tb_gradmom.metadata`), so the plugin is tested on what TensorBoard really
reads. The moments come from per-example gradients drawn here with a seeded generator: the
tests redraw them with `samples` and compute their references from the samples directly
(``np.var(g, ddof=1)`` and so on), independently of the moment formulas.

Usage (TensorFlow is imported only by the writing functions)::

    python tests/plugin_logdir.py OUT_DIR            # the test fixture (a few seconds)
    python tests/plugin_logdir.py OUT_DIR --bench    # 3 runs x 500 steps x 20 variables

The test fixture has these runs:

* ``keras``: a tiny Keras model (Conv2D, Dense) trained with the real writer,
  `tb_gradmom.writers.summary.moments`, with its brute-force per-example gradients saved beside it.
* ``train``: Dense, bias, Conv2D, Conv1D and scalar variables, a pooled variable, one with
  orders 1-4, one with NaN and Inf moments, one without a stats tag, ``_model/_stats``, loss
  and learning rate, and a scalar ``loss`` tag from TensorBoard's scalar plugin.
* ``eval``: a tag written by a newer format version (must be skipped), a tag whose tensor does
  not match its metadata (must answer 404, not 500).
* ``n1``: batch size 1 (unbiased variance undefined).
* ``long``: `LONG_STEPS` steps of a bias (checks the plugin's default ``samples_per_plugin``).
* ``truncated``: the event file is cut in the middle of its last record.
* ``corrupt``: a valid event file followed by a file of garbage.
* `XSS_RUN` (if the file system allows that name).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tb_gradmom import metadata  # noqa: E402

XSS_RUN = "<img src=x onerror=alert(1)>"
BATCH = 8


@dataclasses.dataclass(frozen=True)
class Var:
    """One logged variable of the fixture."""

    tag: str
    shape: tuple[int, ...]
    op: str = "MatMul"
    orders: tuple[int, ...] = (1, 2)
    max_elements: int | None = None  # pool (block means on the 2-D view) above this size
    stats: bool = True  # write the `<tag>/_stats` tag
    special: str = ""  # "nonfinite": NaN and Inf in the moments

    @property
    def block(self) -> tuple[int, int]:
        if self.max_elements is None:
            return (1, 1)
        return metadata.pool_block(self.shape, self.max_elements)

    @property
    def pooled(self) -> bool:
        return self.block != (1, 1)

    @property
    def stored_shape(self) -> tuple[int, ...]:
        if not self.pooled:
            return self.shape
        rows, cols = metadata.to_2d_shape(self.shape)
        br, bc = self.block
        return (math.ceil(rows / br), math.ceil(cols / bc))


TRAIN_VARS = (
    Var("dense/kernel", (6, 4)),
    Var("dense/bias", (4,), op="BiasAdd"),
    Var("conv/kernel", (3, 3, 2, 4), op="Conv2D"),
    Var("conv1d/kernel", (3, 2, 5), op="Conv1D"),
    Var("scale", (), op="Mul"),
    Var("big/kernel", (40, 30), max_elements=100),
    Var("skew/kernel", (5, 5), orders=(1, 2, 3, 4)),
    Var("nonfinite/kernel", (4, 3), special="nonfinite"),
    Var("nostats/kernel", (3, 3), stats=False),
)
TRAIN_STEPS = (0, 10, 20, 30, 40, 50)
LONG_STEPS = 150


def _seed(*parts) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode("utf-8"))


def samples(run: str, tag: str, step: int, shape, n: int = BATCH) -> np.ndarray:
    """Per-example gradients ``[n, *shape]`` (float64) of one variable at one step."""
    rng = np.random.default_rng(_seed(run, tag, step))
    mean = rng.normal(size=shape) * 0.5
    spread = 0.2 + rng.random(size=shape)
    return mean + spread * rng.normal(size=(n, *tuple(shape)))


def raw_moments(g: np.ndarray, orders) -> dict[int, np.ndarray]:
    """``M_p = mean_j g_j**p`` over the batch axis."""
    return {p: np.mean(g**p, axis=0) for p in orders}


def block_means(array: np.ndarray, shape, block) -> np.ndarray:
    """Block means over the 2-D view; ragged edge blocks average the cells they have."""
    rows, cols = metadata.to_2d_shape(shape)
    grid = np.asarray(array, dtype=np.float64).reshape(rows, cols)
    br, bc = block
    out_r, out_c = math.ceil(rows / br), math.ceil(cols / bc)
    padded = np.zeros((out_r * br, out_c * bc))
    count = np.zeros_like(padded)
    padded[:rows, :cols] = grid
    count[:rows, :cols] = 1.0
    total = padded.reshape(out_r, br, out_c, bc).sum(axis=(1, 3))
    return total / count.reshape(out_r, br, out_c, bc).sum(axis=(1, 3))


def stats_values(m1, m2, n, loss=math.nan, lr=math.nan) -> np.ndarray:
    """The stats tensor by its definition in `metadata` (sums + variance histogram counts)."""
    m1 = np.asarray(m1, dtype=np.float64).ravel()
    m2 = np.asarray(m2, dtype=np.float64).ravel()
    with np.errstate(invalid="ignore", divide="ignore"):
        s2 = (n / (n - 1.0)) * np.maximum(m2 - m1**2, 0.0) if n > 1 else np.full(m1.shape, np.nan)
        pos = s2 > 0
        sums = {
            "batch_size": n,
            "num_elements": m1.size,
            "sum_m2": np.sum(m1**2),
            "sum_var": np.sum(s2),
            "sum_gsnr": np.sum(m1[pos] ** 2 / s2[pos]),
            "gsnr_count": np.count_nonzero(pos),
            "sum_m2_raw": np.sum(m2),
            "loss": loss,
            "learning_rate": lr,
        }
    edges = np.asarray(metadata.HIST_EDGES)
    # Bucket i holds edges[i-1] <= v < edges[i]; bucket 0 everything below edges[0].
    idx = np.searchsorted(edges, s2[~np.isnan(s2)], side="right")
    counts = np.bincount(idx, minlength=metadata.NUM_HIST_BUCKETS)
    head = [float(sums[f]) for f in metadata.STATS_FIELDS]
    return np.asarray(head + counts.tolist(), dtype=np.float64)


def var_moments(run: str, var: Var, step: int, n: int) -> dict[int, np.ndarray]:
    """The full-resolution moments of a fixture variable (float64)."""
    m = raw_moments(samples(run, var.tag, step, var.shape, n), var.orders)
    if var.special == "nonfinite":
        m[1] = m[1].copy()
        m[2] = m[2].copy()
        m[1][0, 0] = np.nan  # mean NaN: every statistic NaN there
        m[2][0, 1] = np.inf  # second moment Inf: variance Inf, SNR 0
        m[1][1, 0] = -np.inf  # mean -Inf, second moment Inf: variance NaN (Inf - Inf)
        m[2][1, 0] = np.inf
    return m


def stored_moments(var: Var, m: dict[int, np.ndarray]) -> np.ndarray:
    """The float32 tensor ``[k, *stored_shape]`` the writer stores."""
    arrs = []
    for p in var.orders:
        a = m[p]
        if var.pooled:
            a = block_means(a, var.shape, var.block)
        arrs.append(np.asarray(a, dtype=np.float32).reshape(var.stored_shape))
    return np.stack(arrs)


def moments_content(var: Var) -> metadata.MomentsContent:
    return metadata.MomentsContent(
        orders=tuple(var.orders),
        shape=tuple(var.shape),
        stored_shape=tuple(var.stored_shape),
        pooled=var.pooled,
        block=var.block,
        dtype="float32",
        op=var.op,
        layer=var.tag.rsplit("/", 1)[0] if "/" in var.tag else "",
        variable=var.tag + ":0",
    )


def loss_at(step: int) -> float:
    return 2.0 / (1.0 + step)


LEARNING_RATE = 0.01


# ----------------------------------------------------------------------------- writing


def _tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    return tf


def _write(tf, tag, values, step, content) -> None:
    md = metadata.create_summary_metadata(content)
    tf.summary.write(
        tag, tf.constant(values, dtype=tf.float32), step=step, metadata=md.SerializeToString()
    )


def write_run(
    logdir: str,
    run: str,
    variables,
    steps,
    n: int = BATCH,
    *,
    loss: bool = True,
    scalar: bool = False,
    model: bool = True,
) -> str:
    """Writes one run (a directory under ``logdir``) and returns its path."""
    tf = _tf()
    path = os.path.join(logdir, run)
    writer = tf.summary.create_file_writer(path)
    with writer.as_default():
        for step in steps:
            total = None
            lv = loss_at(step) if loss else math.nan
            lr = LEARNING_RATE if loss else math.nan
            for var in variables:
                m = var_moments(run, var, step, n)
                _write(tf, var.tag, stored_moments(var, m), step, moments_content(var))
                sv = stats_values(m[1], m[2], n, lv, lr)
                if var.stats:
                    _write(tf, metadata.stats_tag(var.tag), sv, step, metadata.StatsContent())
                if var.special or not var.stats:
                    continue
                total = sv.copy() if total is None else _add_stats(total, sv)
            if model and total is not None:
                _write(
                    tf, metadata.stats_tag(metadata.MODEL_TAG), total, step, metadata.StatsContent()
                )
            if scalar:
                tf.summary.scalar("loss", loss_at(step), step=step)
    writer.flush()
    writer.close()
    return path


def _add_stats(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = a + b
    for f in ("batch_size", "loss", "learning_rate"):  # shared, not summed
        i = metadata.STATS_FIELDS.index(f)
        out[i] = a[i]
    return out


def _event_files(path: str) -> list[str]:
    return sorted(os.path.join(path, f) for f in os.listdir(path) if "tfevents" in f)


def write_fixture(logdir: str) -> dict:
    """Writes the test fixture under ``logdir``; returns a description (also saved as JSON)."""
    tf = _tf()
    os.makedirs(logdir, exist_ok=True)
    write_keras_run(logdir)
    write_run(logdir, "train", TRAIN_VARS, TRAIN_STEPS, scalar=True)

    # eval: a tag of a newer format and a tag whose tensor does not match its metadata.
    dense = TRAIN_VARS[0]
    write_run(logdir, "eval", (dense,), (0, 1, 2), model=False)
    writer = tf.summary.create_file_writer(os.path.join(logdir, "eval"))
    with writer.as_default():
        future = json.loads(metadata._encode(moments_content(dense)))
        future["version"] = metadata.FORMAT_VERSION + 1
        md = metadata.create_summary_metadata(moments_content(dense))
        md.plugin_data.content = json.dumps(future).encode("utf-8")
        tf.summary.write(
            "future/kernel", tf.zeros((2, 6, 4)), step=0, metadata=md.SerializeToString()
        )
        bad = Var("mismatch/kernel", (3, 3))
        _write(tf, bad.tag, np.zeros((2, 4, 4)), 0, moments_content(bad))
    writer.close()

    write_run(logdir, "n1", (dense,), (0, 1), n=1, model=False)
    # More steps than TensorBoard keeps of an unknown plugin (10 Python, 100 RustBoard).
    write_run(logdir, "long", (TRAIN_VARS[1],), range(LONG_STEPS), model=False)

    path = write_run(logdir, "truncated", (dense,), (0, 1, 2, 3, 4), model=False)
    (events,) = _event_files(path)
    size = os.path.getsize(events)
    with open(events, "r+b") as f:
        f.truncate(size - 40)  # into the last record (a [2, 6, 4] float32 tensor is 192 bytes)

    path = write_run(logdir, "corrupt", (dense,), (0, 1), model=False)
    (events,) = _event_files(path)
    with open(events + ".zz_garbage", "wb") as f:
        f.write(b"\x00\xff" * 500 + os.urandom(1000))
    os.rename(
        events + ".zz_garbage",
        events[: -len(os.path.basename(events))] + "events.out.tfevents.9999999999.garbage",
    )

    xss = True
    try:
        write_run(logdir, XSS_RUN, (dense,), (0, 5), model=False)
    except Exception:  # noqa: BLE001 - a file system that refuses the name
        xss = False
    desc = {
        "xss_run": xss,
        "batch": BATCH,
        "train_steps": list(TRAIN_STEPS),
        "long_steps": LONG_STEPS,
    }
    with open(os.path.join(logdir, "fixture.json"), "w") as f:
        json.dump(desc, f)
    return desc


# ------------------------------------------------------------------ the real writer

KERAS_RUN = "keras"
KERAS_STEPS = 4
KERAS_BATCH = 6
KERAS_MAX_ELEMENTS = 64  # pools the Dense kernel [27, 4] (108 elements)
KERAS_LR = 0.05


def write_keras_run(logdir: str, run: str = KERAS_RUN) -> None:
    """A tiny Keras model trained with `tb_gradmom.writers.summary.moments` (the real writer).

    Before each step the per-example gradients ``d l_j / d theta`` are computed one example at
    a time with a `tf.GradientTape` (at the weights the step logs) and saved to
    ``<logdir>/<run>_reference.npz``: ``names`` (the variables' paths), ``steps``, and
    ``g<i>_<step>`` = ``[n, *shape]`` for variable ``i``.
    """
    tf = _tf()
    import keras

    import tb_gradmom as gradmom

    keras.utils.set_random_seed(7)
    model = keras.Sequential(
        [
            keras.Input((5, 5, 2)),
            keras.layers.Conv2D(3, 3, activation="tanh", name="conv"),
            keras.layers.Flatten(),
            keras.layers.Dense(4, activation="tanh", name="hidden"),
            keras.layers.Dense(1, name="out"),
        ]
    )
    variables = model.trainable_variables
    opt = keras.optimizers.SGD(KERAS_LR)
    writer = tf.summary.create_file_writer(os.path.join(logdir, run))
    rng = np.random.default_rng(11)

    def per_example_loss(x, y):
        return tf.reduce_mean(tf.square(model(x) - y), axis=1)

    @tf.function
    def train_step(x, y, step):
        with writer.as_default(step=step):
            loss = tf.reduce_mean(per_example_loss(x, y))
            grads = gradmom.summary.moments(
                loss, variables, max_elements=KERAS_MAX_ELEMENTS, learning_rate=KERAS_LR
            )
        opt.apply_gradients(zip(grads, variables))
        return loss

    ref = {
        "names": np.asarray(gradmom.summary.tag_names(variables)),
        "steps": np.arange(KERAS_STEPS),
    }
    for step in range(KERAS_STEPS):
        x = rng.normal(size=(KERAS_BATCH, 5, 5, 2)).astype(np.float32)
        y = rng.normal(size=(KERAS_BATCH, 1)).astype(np.float32)
        rows = []
        for j in range(KERAS_BATCH):
            with tf.GradientTape() as tape:
                lj = per_example_loss(x[j : j + 1], y[j : j + 1])[0]
            rows.append([np.asarray(g, dtype=np.float64) for g in tape.gradient(lj, variables)])
        for i in range(len(variables)):
            ref[f"g{i}_{step}"] = np.stack([r[i] for r in rows])
        train_step(tf.constant(x), tf.constant(y), tf.constant(step, tf.int64))
    writer.close()
    np.savez(os.path.join(logdir, f"{run}_reference.npz"), **ref)


# --------------------------------------------------------------------------- benchmark

BENCH_BIG = (1000, 1000)


def bench_vars(count: int = 20, big_max_elements: int | None = None) -> list[Var]:
    """``count`` variables: one 1M-element kernel and small Dense/conv/bias variables."""
    vs = [Var("big/kernel", BENCH_BIG, max_elements=big_max_elements)]
    i = 0
    while len(vs) < count:
        vs.append(Var(f"dense_{i}/kernel", (64, 64)))
        vs.append(Var(f"dense_{i}/bias", (64,), op="BiasAdd"))
        vs.append(Var(f"conv_{i}/kernel", (3, 3, 16, 16), op="Conv2D"))
        i += 1
    return vs[:count]


def write_bench(
    logdir: str,
    runs: int = 3,
    steps: int = 500,
    count: int = 20,
    big_max_elements: int | None = None,
) -> None:
    """The benchmark logdir: moments drawn directly (no per-example samples), float32."""
    tf = _tf()
    variables = bench_vars(count, big_max_elements)
    for r in range(runs):
        run = f"run{r}"
        rng = np.random.default_rng(r)
        writer = tf.summary.create_file_writer(os.path.join(logdir, run))
        with writer.as_default():
            for step in range(steps):
                total = None
                for var in variables:
                    m1 = (rng.standard_normal(var.shape) * 0.01).astype(np.float32)
                    v = (rng.random(var.shape, dtype=np.float32) * 1e-4).astype(np.float32)
                    m2 = m1 * m1 + v
                    m = {1: m1, 2: m2}
                    _write(tf, var.tag, stored_moments(var, m), step, moments_content(var))
                    sv = stats_values(m1, m2, BATCH, loss_at(step), LEARNING_RATE)
                    _write(tf, metadata.stats_tag(var.tag), sv, step, metadata.StatsContent())
                    total = sv.copy() if total is None else _add_stats(total, sv)
                _write(
                    tf, metadata.stats_tag(metadata.MODEL_TAG), total, step, metadata.StatsContent()
                )
        writer.close()


def _main(argv) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--bench", action="store_true", help="write the benchmark logdir")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--variables", type=int, default=20)
    p.add_argument(
        "--big-max-elements",
        type=int,
        default=None,
        help="pool the 1M-element kernel to at most this many cells (default: full)",
    )
    a = p.parse_args(argv)
    if a.bench:
        write_bench(a.out, a.runs, a.steps, a.variables, a.big_max_elements)
    else:
        print(json.dumps(write_fixture(a.out)))


if __name__ == "__main__":
    _main(sys.argv[1:])
