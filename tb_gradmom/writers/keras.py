"""A Keras callback that logs per-example gradient moments during ``model.fit``.

    model.fit(x, y, callbacks=[gradmom.keras.GradMoments("runs/exp1", every_n_steps=100)])

Keras callbacks never see gradients, so the callback swaps the model's ``train_step`` for one
that computes the loss exactly as Keras does, gets the gradients and the moments from one
backward pass (`tb_gradmom.writers.summary.moments`), and applies the gradients with the model's
optimizer. Training is unchanged: same losses, same weights. The original ``train_step`` is
put back when training ends.
"""

from __future__ import annotations

import os
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

from tb_gradmom.core import validate as _validate
from tb_gradmom.core.plan import check_orders
from tb_gradmom.writers import summary as _summary

__all__ = ["GradMoments"]


class GradMoments(keras.callbacks.Callback):
    """Logs gradient moments to ``log_dir`` every ``every_n_steps`` training steps.

    A step is logged when the optimizer's iteration count *before* the update is a multiple of
    ``every_n_steps``: steps 0, N, 2N, ... (the step written is that count). The other steps run
    no moment ops and cost the same as plain training.

    Args:
      log_dir: the run directory to write event files to (``tensorboard --logdir`` its parent,
        or the directory itself).
      every_n_steps: how often to log.
      orders: moment orders (1 and 2 are always logged).
      variables: the variables to log (default: all of ``model.trainable_weights``). Gradients
        of every trainable weight still come from the same backward pass.
      max_elements: see `tb_gradmom.writers.summary.moments`.
      per_variable_scalars: also write per-variable scalars for the Scalars dashboard.
      log_learning_rate: pass the optimizer's learning rate so the CABS batch size is logged.
      fallback: ``"exact"`` or ``"error"`` for layers without an exact rule (LSTM, GRU, custom
        ops; see `tb_gradmom.gradients_and_moments`).

    Under mixed precision the optimizer's loss scale is taken out of the moments; under a
    ``tf.distribute`` strategy the moments are over the global batch, written by replica 0.
    """

    def __init__(
        self,
        log_dir: str,
        every_n_steps: int = 100,
        orders: Sequence[int] = (1, 2),
        variables: Sequence[tf.Variable] | None = None,
        max_elements: int = _summary.DEFAULT_MAX_ELEMENTS,
        per_variable_scalars: bool = True,
        log_learning_rate: bool = True,
        fallback: str = "exact",
    ) -> None:
        super().__init__()
        self.every_n_steps = _validate.positive_int("every_n_steps", every_n_steps)
        self.log_dir = os.fspath(log_dir)
        if os.path.exists(self.log_dir) and not os.path.isdir(self.log_dir):
            raise ValueError(
                f"log_dir '{self.log_dir}' is a file, not a directory; pass a directory for "
                "the run's event files (it is created if missing)"
            )
        self.orders = check_orders(orders)
        self.variables = None if variables is None else list(variables)
        self.max_elements = _validate.positive_int("max_elements", max_elements)
        self.per_variable_scalars = bool(per_variable_scalars)
        self.log_learning_rate = bool(log_learning_rate)
        if fallback not in ("exact", "error"):
            raise ValueError(f"fallback must be 'exact' or 'error', got {fallback!r}")
        self.fallback = fallback
        self._writer: tf.summary.SummaryWriter | None = None  # while training
        self._had_instance_step = False
        self._instance_step: Callable[..., Any] | None = None
        self._jit: bool | str | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        model = self.model
        if keras.backend.backend() != "tensorflow":
            raise RuntimeError(
                "gradmom.keras.GradMoments needs the TensorFlow backend of Keras "
                f"(KERAS_BACKEND=tensorflow); this Keras runs on {keras.backend.backend()!r}"
            )
        if model.optimizer is None:
            raise RuntimeError("GradMoments: compile the model with an optimizer before fit")
        self._writer = tf.summary.create_file_writer(self.log_dir)
        self._had_instance_step = "train_step" in model.__dict__
        self._instance_step = model.__dict__.get("train_step")
        if getattr(model, "jit_compile", False):
            warnings.warn(
                "GradMoments turns off jit_compile while it is attached: summary writes cannot "
                "run inside XLA.",
                stacklevel=2,
            )
            self._jit = model.jit_compile
            model.jit_compile = False
        model.train_step = types.MethodType(_make_train_step(self), model)
        model.make_train_function(force=True)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        model = self.model
        if self._had_instance_step:
            model.train_step = self._instance_step
        else:
            model.__dict__.pop("train_step", None)
        if self._jit is not None:
            model.jit_compile = self._jit
            self._jit = None
        model.train_function = None  # the next fit builds a plain train function again
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


def _loss_scale(optimizer: keras.optimizers.Optimizer) -> tf.Variable | float | None:
    """The dynamic loss scale of a ``LossScaleOptimizer`` (mixed precision), else None: the
    gradients stay scaled for the optimizer, the moments are unscaled."""
    from keras.optimizers import LossScaleOptimizer

    if isinstance(optimizer, LossScaleOptimizer):
        # what LossScaleOptimizer.scale_loss multiplies by
        return optimizer.dynamic_scale if optimizer.built else optimizer.initial_scale
    return None


def _make_train_step(cb: GradMoments) -> Callable[[keras.Model, Any], dict[str, Any]]:
    # Mirrors keras/src/backend/tensorflow/trainer.py `train_step` (Keras 3), with the gradients
    # taken by gradmom.summary.moments instead of a GradientTape.
    # Keras' private API, behind tb_gradmom._compat.keras_private.
    from tb_gradmom._compat import keras_private

    def train_step(self: keras.Model, data: Any) -> dict[str, Any]:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if keras_private.call_has_training_arg(self):
            y_pred = self(x, training=True)
        else:
            y_pred = self(x)
        loss = keras_private.compute_loss(self, x, y, y_pred, sample_weight)
        keras_private.loss_tracker(self).update_state(
            keras_private.unscale_loss_for_distribution(loss),
            sample_weight=tf.shape(next(i for i in keras.tree.flatten(x) if i is not None))[0],
        )
        scaled = self.optimizer.scale_loss(loss)
        if self.trainable_weights:
            assert cb._writer is not None  # created by on_train_begin
            weights = self.trainable_weights
            step = tf.cast(self.optimizer.iterations, tf.int64)
            lr = None
            if cb.log_learning_rate:
                lr = tf.cast(self.optimizer.learning_rate, tf.float64)
            with (
                cb._writer.as_default(step=step),
                tf.summary.record_if(tf.equal(step % cb.every_n_steps, 0)),
            ):
                grads = _summary.moments(
                    scaled,
                    weights,
                    orders=cb.orders,
                    max_elements=cb.max_elements,
                    per_variable_scalars=cb.per_variable_scalars,
                    learning_rate=lr,
                    log_only=cb.variables,
                    loss_scale=_loss_scale(self.optimizer),
                    fallback=cb.fallback,
                )
            self.optimizer.apply_gradients(zip(grads, weights))
        else:
            warnings.warn("The model does not have any trainable weights.", stacklevel=2)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    return train_step
