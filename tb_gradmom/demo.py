"""``tb-gradmom demo``: train two small models on generated data and log their gradient moments.

Two runs are written under ``--logdir``:

* ``mlp``: a 3-layer MLP on a generated 10-class Gaussian-mixture problem, trained with a custom
  ``tf.function`` step that calls `tb_gradmom.summary.moments` (the one-line integration);
* ``cnn``: a small conv net on generated 16x16 RGB images (class-dependent stripes plus noise),
  trained with ``model.fit`` and the `tb_gradmom.keras.GradMoments` callback.

Nothing is downloaded. The default takes about a minute on 2 CPU cores.
"""

from __future__ import annotations

import os
import sys
import time

__all__ = ["main", "run"]

DEFAULT_STEPS = {"mlp": 20000, "cnn": 10000}
QUICK_STEPS = {"mlp": 12, "cnn": 6}


class _Progress:
    """A one-line text progress bar on stderr."""

    def __init__(self, total: int, label: str, stream=None):
        self.total, self.label = max(int(total), 1), label
        self.stream = stream or sys.stderr
        self.start = time.monotonic()
        self.done = 0

    def update(self, done: int, note: str = "") -> None:
        self.done = done
        frac = min(done / self.total, 1.0)
        width = 28
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        elapsed = time.monotonic() - self.start
        eta = elapsed / frac - elapsed if frac > 0 else 0.0
        self.stream.write(
            f"\r{self.label:<4} [{bar}] {done}/{self.total} {elapsed:5.1f}s eta {eta:4.0f}s {note}"
        )
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def _mixture(rng, n, dim=32, classes=10):

    centers = rng.normal(size=(classes, dim)).astype("float32") * 1.5
    y = rng.integers(0, classes, size=n)
    x = centers[y] + rng.normal(size=(n, dim)).astype("float32") * 2.0
    return x.astype("float32"), y.astype("int32")


def _stripes(rng, n, size=16, classes=4):
    import numpy as np

    y = rng.integers(0, classes, size=n)
    ii, jj = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    angle = y[:, None, None] * (np.pi / classes)
    phase = rng.uniform(0, 2 * np.pi, size=(n, 1, 1))
    wave = np.sin(0.8 * (np.cos(angle) * ii + np.sin(angle) * jj) + phase)
    colour = rng.uniform(0.5, 1.0, size=(n, 1, 1, 3))
    x = wave[..., None] * colour + 0.6 * rng.normal(size=(n, size, size, 3))
    return x.astype("float32"), y.astype("int32")


def run_mlp(logdir: str, steps: int, every: int = 10, batch: int = 64, seed: int = 0) -> None:
    """Trains the MLP with a custom step and `gradmom.summary.moments`."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tb_gradmom import summary

    rng = np.random.default_rng(seed)
    keras.utils.set_random_seed(seed)
    x, y = _mixture(rng, 4096)
    model = keras.Sequential(
        [
            keras.Input((x.shape[1],)),
            keras.layers.Dense(128, activation="relu", name="hidden1"),
            keras.layers.Dense(64, activation="relu", name="hidden2"),
            keras.layers.Dense(10, name="logits"),
        ],
        name="mlp",
    )
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    lr = 0.05
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

    bar = _Progress(steps, "mlp")
    for step in range(steps):
        idx = rng.integers(0, len(x), size=batch)
        loss = train_step(x[idx], y[idx], tf.constant(step, tf.int64))
        if step % 10 == 0 or step == steps - 1:
            bar.update(step + 1, f"loss {float(loss):.3f}")
    bar.close()
    writer.flush()
    writer.close()


def run_cnn(logdir: str, steps: int, every: int = 10, batch: int = 32, seed: int = 1) -> None:
    """Trains the CNN with ``model.fit`` and the `GradMoments` callback."""
    import keras
    import numpy as np

    from tb_gradmom.keras import GradMoments

    rng = np.random.default_rng(seed)
    keras.utils.set_random_seed(seed)
    x, y = _stripes(rng, min(steps * batch, 8192))
    per_epoch = len(x) // batch
    epochs = -(-steps // per_epoch)
    model = keras.Sequential(
        [
            keras.Input(x.shape[1:]),
            keras.layers.Conv2D(16, 3, activation="relu", name="conv1"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(32, 3, activation="relu", name="conv2"),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu", name="dense"),
            keras.layers.Dense(4, name="logits"),
        ],
        name="cnn",
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.02, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    bar = _Progress(steps, "cnn")

    class _Bar(keras.callbacks.Callback):
        def on_train_batch_end(self, batch_index, logs=None):
            done = int(self.model.optimizer.iterations.numpy())
            if done % 10 == 0 or done == steps:
                bar.update(done, f"loss {float((logs or {}).get('loss', 0.0)):.3f}")
            if done >= steps:
                self.model.stop_training = True

    model.fit(
        x,
        y,
        batch_size=batch,
        epochs=epochs,
        verbose=0,
        callbacks=[GradMoments(os.path.join(logdir, "cnn"), every_n_steps=every), _Bar()],
    )
    bar.close()


def run(logdir: str = "runs/demo", steps: int | None = None, quick: bool = False) -> str:
    """Writes the demo runs; returns the logdir.

    Args:
      logdir: the parent directory of the runs ``mlp`` and ``cnn``.
      steps: training steps per run (default about a minute in all: 20000 MLP, 10000 CNN steps).
      quick: a few steps per run only (a smoke test).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if steps is not None and steps < 1:
        raise ValueError(f"--steps must be a positive integer, got {steps}")
    plan = QUICK_STEPS if quick else DEFAULT_STEPS
    mlp_steps = steps or plan["mlp"]
    cnn_steps = steps or plan["cnn"]
    every = 2 if quick else 50
    os.makedirs(logdir, exist_ok=True)
    print(f"Grad Moments demo: writing runs 'mlp' and 'cnn' to {logdir}", file=sys.stderr)
    run_mlp(logdir, mlp_steps, every=every)
    run_cnn(logdir, cnn_steps, every=every)
    return logdir


def main(args) -> int:
    """Entry point of ``tb-gradmom demo`` (``args`` from the CLI's argparse)."""
    logdir = run(logdir=args.logdir, steps=args.steps, quick=args.quick)
    print("Done. Look at the moments with:")
    print(f"  tensorboard --logdir {logdir}")
    print("then open http://localhost:6006 and the 'Grad Moments' tab.")
    return 0
