"""``tb-gradmom demo --mislabelled``: a finite generated data set with known flipped labels, and
the per-example gradient norms that find them.

A classification task is generated here (nothing is downloaded): ``classes`` classes in
``dim`` dimensions, each class two Gaussian clusters around random centres; then a fixed
fraction of the labels (5 % by default) is flipped to another class, at examples chosen at
random. An MLP trains on that finite set for several epochs with a custom ``tf.function`` step
that calls `tb_gradmom.writers.summary.moments` with ``example_ids`` (each example's index in the
set): it logs the moments every ``every`` steps, and every step of the last epoch, so each
example's squared gradient norm ``||g_j||^2`` is logged once in the last epoch.

Examples whose labels were flipped disagree with what the network learns from the rest, so they
keep large losses and large gradients (the basis of GraNd scores, Paul et al. 2021, and of
dataset cartography, Swayamdipta et al. 2020). `measure` reads the log back
(`tb_gradmom.analysis.data.load_examples`) and reports which fraction of the examples with the
largest mean gradient norm over the last epoch are the flipped ones; the ids of the flipped
examples are written next to the run (``flipped.json``) so that anyone can check.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np

__all__ = ["Config", "generate", "run", "measure", "main", "RUN", "FLIPPED_FILE"]

RUN = "mislabelled"
FLIPPED_FILE = "flipped.json"


@dataclasses.dataclass(frozen=True)
class Config:
    """The demo's data set, model and schedule (the defaults: about half a minute on 2 cores).

    Attributes:
      examples: the size of the finite training set.
      classes: the number of classes; each is two Gaussian clusters.
      dim: the input dimension.
      separation: the scale of the cluster centres (standard normal times this) relative to
        the clusters' unit spread: smaller overlaps the classes more.
      flip: the fraction of labels flipped to another class (chosen at random, exactly
        ``round(flip * examples)`` of them).
      epochs: passes over the set (reshuffled every epoch).
      batch: examples per step.
      hidden: the MLP's hidden widths.
      learning_rate: SGD's.
      every: log the moments every this many steps before the last epoch (every step of it).
      top: the fraction of examples with the largest mean norm that `measure` looks at.
      seed: seeds the data, the flips, the shuffles and the initial weights.
    """

    examples: int = 4000
    classes: int = 5
    dim: int = 16
    separation: float = 1.0
    flip: float = 0.05
    epochs: int = 8
    batch: int = 100
    hidden: tuple[int, ...] = (64, 64)
    learning_rate: float = 0.1
    every: int = 10
    top: float = 0.05
    seed: int = 0


def generate(config: Config) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The data set: ``(x [N, dim] float32, labels [N] int32 (flipped ones included),
    true labels [N] int32, flipped ids [F] int64 ascending)``."""
    rng = np.random.default_rng(config.seed)
    n, k = config.examples, config.classes
    centres = rng.normal(size=(2 * k, config.dim)) * config.separation
    cluster = rng.integers(0, 2 * k, size=n)
    true = (cluster % k).astype(np.int32)
    x = (centres[cluster] + rng.normal(size=(n, config.dim))).astype(np.float32)
    count = int(round(config.flip * n))
    flipped = np.sort(rng.choice(n, size=count, replace=False)).astype(np.int64)
    labels = true.copy()
    # Another class, uniformly among the k - 1 others.
    labels[flipped] = (true[flipped] + rng.integers(1, k, size=count)) % k
    return x, labels, true, flipped


def _last_epoch_start(config: Config) -> int:
    per_epoch = -(-config.examples // config.batch)
    return per_epoch * (config.epochs - 1)


def run(logdir: str, config: Config = Config(), stream=None) -> str:
    """Trains the MLP and writes run `RUN` under ``logdir`` with `FLIPPED_FILE` beside its
    events; returns the run's directory.

    Args:
      logdir: the parent directory of the run.
      config: the data set, model and schedule.
      stream: where the progress goes (default stderr).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    from tb_gradmom.demo import _Progress
    from tb_gradmom.writers import summary

    if config.epochs < 1 or config.examples < config.batch or config.batch < 2:
        raise ValueError(
            f"the demo needs epochs >= 1 and 2 <= batch <= examples, got epochs={config.epochs}, "
            f"batch={config.batch}, examples={config.examples}"
        )
    out = stream or sys.stderr
    x, labels, true, flipped = generate(config)
    run_dir = os.path.join(logdir, RUN)
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, FLIPPED_FILE), "w", encoding="utf-8") as f:
        json.dump(
            {
                "flipped_ids": flipped.tolist(),
                "true_labels": true[flipped].tolist(),
                "given_labels": labels[flipped].tolist(),
                "examples": config.examples,
                "config": dataclasses.asdict(config),
            },
            f,
            indent=1,
        )
    keras.utils.set_random_seed(config.seed)
    model = keras.Sequential(
        [
            keras.Input((config.dim,)),
            *(
                keras.layers.Dense(w, activation="relu", name=f"hidden{i + 1}")
                for i, w in enumerate(config.hidden)
            ),
            keras.layers.Dense(config.classes, name="logits"),
        ],
        name="mlp",
    )
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.SGD(config.learning_rate)
    writer = tf.summary.create_file_writer(run_dir)
    last_epoch = _last_epoch_start(config)

    @tf.function
    def train_step(xb, yb, ids, step):
        loss = loss_fn(yb, model(xb, training=True))
        record = tf.logical_or(step >= last_epoch, step % config.every == 0)
        with writer.as_default(step=step), tf.summary.record_if(record):
            grads = summary.moments(
                loss,
                model.trainable_variables,
                example_ids=ids,
                learning_rate=config.learning_rate,
                max_examples=max(1024, config.batch),
            )
            tf.summary.scalar("loss", loss)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    print(
        f"Grad Moments demo: {config.examples} generated examples, {len(flipped)} labels "
        f"flipped ({config.flip:.0%}), {config.epochs} epochs; writing run {RUN!r} to {logdir}",
        file=out,
    )
    rng = np.random.default_rng(config.seed + 1)
    per_epoch = -(-config.examples // config.batch)
    bar = _Progress(per_epoch * config.epochs, "mislabelled", out)
    step = 0
    smooth = None
    for _ in range(config.epochs):
        order = rng.permutation(config.examples)
        for start in range(0, config.examples, config.batch):
            idx = order[start : start + config.batch]
            loss = float(
                train_step(x[idx], labels[idx], idx.astype(np.int64), tf.constant(step, tf.int64))
            )
            smooth = loss if smooth is None else 0.95 * smooth + 0.05 * loss
            step += 1
            bar.step(step, f"loss {smooth:.3f}")
    bar.close()
    writer.flush()
    writer.close()
    return run_dir


def measure(run_dir: str, top: float | None = None) -> dict:
    """Reads run `RUN` back and scores the per-example norms of its last epoch.

    Each example's mean gradient norm ``sqrt(||g_j||^2)`` over the steps of the last epoch
    that logged it (once per example there) ranks the examples; of the ``top`` fraction with
    the largest, ``precision`` is the share whose labels were flipped (`FLIPPED_FILE`); the
    base rate, what a random pick would find, is ``flip``.

    Returns:
      ``{"precision", "found", "picked", "flipped", "base_rate", "examples_ranked", "steps"}``.
    """
    from tb_gradmom.analysis import data

    with open(os.path.join(run_dir, FLIPPED_FILE), encoding="utf-8") as f:
        info = json.load(f)
    cfg = Config(**{**info["config"], "hidden": tuple(info["config"]["hidden"])})
    top = cfg.top if top is None else top
    parent, name = os.path.split(os.path.normpath(run_dir))
    recs = data.load_examples(parent, runs=[name])[name]["_examples"]
    last = _last_epoch_start(cfg)
    ids, norms = [], []
    steps = []
    for r in recs:
        if r.step >= last:
            ids.append(np.asarray(r.ids, dtype=np.int64))
            norms.append(np.sqrt(np.maximum(r.model, 0.0)))
            steps.append(r.step)
    if not ids:
        raise ValueError(f"run {run_dir!r} has no per-example norms logged in its last epoch")
    all_ids, all_norms = np.concatenate(ids), np.concatenate(norms)
    uniq, inv = np.unique(all_ids, return_inverse=True)
    mean = np.bincount(inv, weights=all_norms) / np.bincount(inv)
    picked = max(1, int(round(top * uniq.size)))
    best = uniq[np.argsort(-mean, kind="stable")[:picked]]
    flipped = set(info["flipped_ids"])
    found = sum(int(i) in flipped for i in best)
    return {
        "precision": found / picked,
        "found": found,
        "picked": picked,
        "flipped": len(flipped),
        "base_rate": len(flipped) / info["examples"],
        "examples_ranked": int(uniq.size),
        "steps": len(steps),
    }


def main(args) -> int:
    """Entry point of ``tb-gradmom demo --mislabelled`` (``args`` from the CLI's argparse)."""
    config = Config()
    if args.quick:
        config = dataclasses.replace(config, examples=1000, epochs=2)
    if args.steps is not None:
        raise SystemExit("--steps does not apply to --mislabelled (it trains whole epochs)")
    run_dir = run(args.logdir, config)
    m = measure(run_dir)
    print(
        f"Of the {m['picked']} examples with the largest mean gradient norm over the last epoch, "
        f"{m['found']} ({m['precision']:.0%}) are mislabelled (base rate {m['base_rate']:.0%}); "
        f"their ids: {os.path.join(run_dir, FLIPPED_FILE)}"
    )
    print("Look at them with:")
    print(f"  tensorboard --logdir {args.logdir}")
    print("then open http://localhost:6006 and the 'Grad Moments' tab.")
    return 0
