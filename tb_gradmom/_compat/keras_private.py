"""Every private Keras API that tb_gradmom uses, in one place.

`tb_gradmom.writers.keras.GradMoments` runs, on the steps it logs, a copy of Keras' own
``train_step`` (``keras/src/backend/tensorflow/trainer.py``, ``TensorFlowTrainer.train_step``)
that takes its gradients with `tb_gradmom.GradientTape`, , in a dry run before the step. Mirroring it needs what that ``train_step`` uses. Where Keras exports the same object publicly it is used instead
(``keras.utils.unpack_x_y_sample_weight``, ``keras.tree.flatten``; ``tests/test_compat.py``
checks that they are the objects Keras' trainer uses). The private symbols (`SYMBOLS`), each
looked up when first used; a missing one raises `tb_gradmom._compat.PrivateAPIError`, which
names the symbol, the installed Keras and the feature that is unavailable:

``unscale_loss_for_distribution`` - ``keras.src.losses.loss.unscale_loss_for_distribution``
    Multiplies the loss back by the number of replicas before it updates the loss metric, as
    Keras does under ``tf.distribute``. Without it the callback cannot report Keras' loss.
``compute_loss`` - ``Trainer._compute_loss`` (``keras.src.trainers.trainer``)
    The loss exactly as Keras' ``train_step`` computes it: ``model.compute_loss``, with or
    without ``training=`` depending on the override's signature. Without it the callback cannot
    compute the model's loss as Keras does.
``loss_tracker`` - ``model._loss_tracker`` (set by ``Trainer.compile``)
    The ``Mean`` metric behind the ``loss`` that ``fit`` reports. Without it the callback
    cannot report the loss.
``call_has_training_arg`` - ``model._call_has_training_arg`` (set by ``Layer.__init__``)
    Whether ``model.call`` takes ``training=``. Without it the callback cannot call the model
    as Keras does.
``default_train_step`` - ``TensorFlowTrainer.train_step`` (``keras.src.backend.tensorflow.trainer``)
    Keras' own ``train_step``: a model whose ``train_step`` is another one was written by the
    user, and the callback runs that one unchanged.

All of them are needed by the callback only; without any of them
``gradmom.keras.GradMoments`` is unavailable (``tb_gradmom.writers.summary.moments`` in a custom
training loop is not affected).
"""

from __future__ import annotations

from typing import Any

from tb_gradmom._compat import PrivateAPIError, resolve

__all__ = [
    "SYMBOLS",
    "unscale_loss_for_distribution",
    "compute_loss",
    "loss_tracker",
    "call_has_training_arg",
    "default_train_step",
]

_FEATURE = "gradmom.keras.GradMoments (its train_step mirrors Keras' own)"

# name -> (module, attribute: dotted, or the instance attribute's name; the feature)
SYMBOLS: dict[str, tuple[str, str, str]] = {
    "unscale_loss_for_distribution": (
        "keras.src.losses.loss",
        "unscale_loss_for_distribution",
        _FEATURE,
    ),
    "compute_loss": ("keras.src.trainers.trainer", "Trainer._compute_loss", _FEATURE),
    "loss_tracker": ("keras.src.trainers.trainer", "Trainer._loss_tracker", _FEATURE),
    "call_has_training_arg": ("keras.src.layers.layer", "Layer._call_has_training_arg", _FEATURE),
    "default_train_step": (
        "keras.src.backend.tensorflow.trainer",
        "TensorFlowTrainer.train_step",
        _FEATURE,
    ),
}

# Instance attributes (set in __init__/compile), looked up on the model, not on the class.
_INSTANCE = frozenset({"loss_tracker", "call_has_training_arg"})


def _get(name: str) -> Any:
    module, attribute, feature = SYMBOLS[name]
    return resolve("keras", module, attribute, feature)


def _instance_attribute(model: Any, name: str) -> Any:
    module, attribute, feature = SYMBOLS[name]
    try:
        return getattr(model, attribute.rsplit(".", 1)[1])
    except AttributeError as e:
        raise PrivateAPIError(f"{module}.{attribute}", "keras", feature, e) from e


def unscale_loss_for_distribution(value: Any) -> Any:
    """``value`` times the number of replicas in sync under a ``tf.distribute`` strategy
    (the loss Keras' ``loss`` metric is updated with); ``value`` itself otherwise."""
    return _get("unscale_loss_for_distribution")(value)


def compute_loss(model: Any, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> Any:
    """The training loss of ``model`` as Keras' ``train_step`` computes it (``training=True``)."""
    _get("compute_loss")  # the wrapper exists on Keras' Trainer
    return model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)


def loss_tracker(model: Any) -> Any:
    """The ``Mean`` metric behind the ``loss`` reported by ``fit`` (None before compile)."""
    return _instance_attribute(model, "loss_tracker")


def call_has_training_arg(model: Any) -> bool:
    """Whether ``model.call`` takes a ``training`` argument."""
    return bool(_instance_attribute(model, "call_has_training_arg"))


def default_train_step() -> Any:
    """Keras' own ``train_step`` (the function on its TensorFlow trainer class)."""
    return _get("default_train_step")
