"""``tb-gradmom demo``: train two small models on a fresh stream of generated data and log their
gradient moments.

Two runs are written under ``--logdir``:

* ``mlp``: an MLP regressing a fixed random "teacher" network's 4 outputs plus Gaussian noise
  (target noise that no model can fit), trained with a custom ``tf.function`` step that
  calls `tb_gradmom.writers.summary.moments` (the one-line integration);
* ``cnn``: a small conv net on generated 12x12 RGB images (class-dependent oriented stripes plus
  noise, 5 % label noise), trained with ``model.fit`` and the `tb_gradmom.writers.keras.GradMoments`
  callback.

Every batch is freshly drawn: no example is seen twice, so the models cannot memorise, the loss
stays above the label-noise floor and the gradient noise stays real. What the tab then shows
(McCandlish et al. 2018): the noise scale grows as the loss falls, the layers differ in their
signal-to-noise ratio, and a few ReLU filters stop receiving gradient (dead filters: zero
variance columns in the log-scale heatmaps). Nothing is downloaded; the default takes about a
minute on 2 CPU cores.
"""

from __future__ import annotations

import math
import os
import sys
import time

__all__ = ["main", "run"]

DEFAULT_STEPS = {"mlp": 1500, "cnn": 640}
# Large batches: both models' noise scales grow past 1,000 examples as they learn, and the
# bias-corrected |G|^2 estimated from a batch much smaller than that is dominated by noise
# (measured: at batch 128 half of the CNN's smoothed estimates in the second half were
# negative, at 256 the MLP's curve spiked to 3.4x its median; at these sizes every smoothed
# estimate of the second half is positive).
BATCH = {"mlp": 1024, "cnn": 512}
LEARNING_RATE = {"mlp": 0.1, "cnn": 0.03}
# Logged every this many steps (150 points for the MLP, 64 for the CNN).
EVERY = {"mlp": 10, "cnn": 10}
QUICK_STEPS = {"mlp": 12, "cnn": 6}
LABEL_NOISE = {"mlp": 0.5, "cnn": 0.05}


class _Progress:
    """A progress bar: one redrawn line on a terminal, one line per update otherwise.

    The rate (and so the ETA) is measured from the first finished step on: the first step
    traces the training function and would make every early ETA many times too long.
    """

    def __init__(self, total: int, label: str, stream=None, tty: bool | None = None):
        self.total, self.label = max(int(total), 1), label
        self.stream = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty()) if tty is None else tty
        self.start = time.monotonic()
        self.mark: tuple[float, int] | None = None  # (time, steps done) after the first step
        self.done = 0
        self.printed = 0

    def step(self, done: int, note: str = "") -> None:
        """Reports ``done`` finished steps; prints when an update is due."""
        now = time.monotonic()
        if self.mark is None:
            self.mark = (now, done)
            return
        every = max(1, self.total // (50 if self.tty else 10))
        if done - self.printed >= every or done >= self.total:
            self.update(done, note, now)

    def eta(self, done: int, now: float) -> float | None:
        if self.mark is None or done <= self.mark[1]:
            return None
        rate = (now - self.mark[0]) / (done - self.mark[1])
        return rate * (self.total - done)

    def update(self, done: int, note: str = "", now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.done = self.printed = done
        frac = min(done / self.total, 1.0)
        width = 28
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        eta = self.eta(done, now)
        eta_text = "  --" if eta is None else f"{eta:4.0f}s"
        line = (
            f"{self.label:<4} [{bar}] {done:>5}/{self.total} "
            f"{now - self.start:5.1f}s eta {eta_text} {note}"
        )
        self.stream.write(f"\r{line}" if self.tty else f"{line}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class _Teacher:
    """A fixed random two-layer network; its outputs plus Gaussian noise are the MLP's targets.

    The noise (``noise`` times a standard normal per target) is what no model can fit: as the
    MLP learns, the gradient's signal shrinks while this noise stays, so the noise scale grows.
    """

    def __init__(self, rng, dim=32, hidden=64, outputs=4, noise=0.5):
        import numpy as np

        self.w1 = rng.normal(size=(dim, hidden)) * (2.0 / np.sqrt(dim))
        self.w2 = rng.normal(size=(hidden, outputs)) / np.sqrt(hidden)
        self.dim, self.outputs, self.noise = dim, outputs, noise

    def sample(self, rng, n):
        import numpy as np

        x = rng.normal(size=(n, self.dim))
        y = np.tanh(x @ self.w1) @ self.w2 + self.noise * rng.normal(size=(n, self.outputs))
        return x.astype("float32"), y.astype("float32")


def _stripes(rng, n, size=12, classes=4, noise=0.10):
    """Images of oriented stripes (the class), random phase and colour, plus pixel noise."""
    import numpy as np

    y = rng.integers(0, classes, size=n)
    ii, jj = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    angle = y[:, None, None] * (np.pi / classes)
    phase = rng.uniform(0, 2 * np.pi, size=(n, 1, 1))
    wave = np.sin(0.9 * (np.cos(angle) * ii + np.sin(angle) * jj) + phase)
    colour = rng.uniform(0.3, 1.0, size=(n, 1, 1, 3))
    x = wave[..., None] * colour + 0.8 * rng.normal(size=(n, size, size, 3))
    flip = rng.uniform(size=n) < noise
    y = np.where(flip, rng.integers(0, classes, size=n), y)
    return x.astype("float32"), y.astype("int32")


def run_mlp(
    logdir: str,
    steps: int,
    every: int = EVERY["mlp"],
    batch: int = BATCH["mlp"],
    seed: int = 0,
    stream=None,
) -> None:
    """Trains the MLP on a fresh teacher stream with a custom step and `summary.moments`."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tb_gradmom.writers import summary

    rng = np.random.default_rng(seed)
    keras.utils.set_random_seed(seed)
    teacher = _Teacher(rng, noise=LABEL_NOISE["mlp"])
    model = keras.Sequential(
        [
            keras.Input((teacher.dim,)),
            keras.layers.Dense(128, activation="relu", name="hidden1"),
            keras.layers.Dense(64, activation="relu", name="hidden2"),
            keras.layers.Dense(teacher.outputs, name="output"),
        ],
        name="mlp",
    )
    loss_fn = keras.losses.MeanSquaredError()
    lr = LEARNING_RATE["mlp"]
    optimizer = keras.optimizers.SGD(lr)
    writer = tf.summary.create_file_writer(os.path.join(logdir, "mlp"))

    @tf.function
    def train_step(xb, yb, step):
        loss = loss_fn(yb, model(xb, training=True))
        with writer.as_default(step=step), tf.summary.record_if(step % every == 0):
            grads = summary.moments(loss, model.trainable_variables, learning_rate=lr)
            tf.summary.scalar("loss", loss)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    bar = _Progress(steps, "mlp", stream)
    smooth = None
    for step in range(steps):
        xb, yb = teacher.sample(rng, batch)
        loss = float(train_step(xb, yb, tf.constant(step, tf.int64)))
        smooth = loss if smooth is None else 0.98 * smooth + 0.02 * loss
        bar.step(step + 1, f"loss {smooth:.3f}")
    bar.close()
    writer.flush()
    writer.close()


def run_cnn(
    logdir: str,
    steps: int,
    every: int = EVERY["cnn"],
    batch: int = BATCH["cnn"],
    seed: int = 1,
    stream=None,
) -> None:
    """Trains the CNN with ``model.fit`` (one pass over fresh images) and `GradMoments`."""
    import keras
    import numpy as np

    from tb_gradmom.writers.keras import GradMoments

    rng = np.random.default_rng(seed)
    keras.utils.set_random_seed(seed)
    # One epoch over steps * batch freshly generated images: no image is seen twice.
    x, y = _stripes(rng, steps * batch, noise=LABEL_NOISE["cnn"])
    model = keras.Sequential(
        [
            keras.Input(x.shape[1:]),
            keras.layers.Conv2D(16, 3, activation="relu", name="conv1"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(16, 3, activation="relu", name="conv2"),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu", name="dense"),
            keras.layers.Dense(4, name="logits"),
        ],
        name="cnn",
    )
    model.compile(
        optimizer=keras.optimizers.SGD(LEARNING_RATE["cnn"]),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    bar = _Progress(steps, "cnn", stream)

    class _Bar(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.smooth = None

        def on_train_batch_end(self, batch_index, logs=None):
            loss = float((logs or {}).get("loss", math.nan))
            self.smooth = loss if self.smooth is None else 0.98 * self.smooth + 0.02 * loss
            bar.step(batch_index + 1, f"loss {self.smooth:.3f}")

    model.fit(
        x,
        y,
        batch_size=batch,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[GradMoments(os.path.join(logdir, "cnn"), every_n_steps=every), _Bar()],
    )
    bar.close()


def run(
    logdir: str = "runs/demo", steps: int | None = None, quick: bool = False, stream=None
) -> str:
    """Writes the demo runs; returns the logdir.

    Args:
      logdir: the parent directory of the runs ``mlp`` and ``cnn``.
      steps: training steps per run (default `DEFAULT_STEPS`: about a minute in all).
      quick: a few steps per run only (a smoke test).
      stream: where the progress goes (default stderr).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if steps is not None and steps < 1:
        raise ValueError(f"--steps must be a positive integer, got {steps}")
    plan = QUICK_STEPS if quick else DEFAULT_STEPS
    mlp_steps = steps or plan["mlp"]
    cnn_steps = steps or plan["cnn"]
    every = {k: 2 if quick else v for k, v in EVERY.items()}
    os.makedirs(logdir, exist_ok=True)
    out = stream or sys.stderr
    print(f"Grad Moments demo: writing runs 'mlp' and 'cnn' to {logdir}", file=out)
    run_mlp(logdir, mlp_steps, every=every["mlp"], stream=out)
    run_cnn(logdir, cnn_steps, every=every["cnn"], stream=out)
    return logdir


def main(args) -> int:
    """Entry point of ``tb-gradmom demo`` (``args`` from the CLI's argparse)."""
    logdir = run(logdir=args.logdir, steps=args.steps, quick=args.quick)
    print("Done. Look at the moments with:")
    print(f"  tensorboard --logdir {logdir}")
    print("then open http://localhost:6006 and the 'Grad Moments' tab.")
    return 0
