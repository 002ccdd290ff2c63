"""The test-case table for the graph core: data, not code paths.

Each case builds a small model in a given dtype, its inputs and targets, and names how the
loss reduces the examples. `tests/reference.py` computes the brute-force moments (one gradient
per example) and `tests/test_core.py` compares them with `gradients_and_moments`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf


@dataclass(frozen=True)
class Case:
    """One row of the table.

    Attributes:
      id: a readable id such as ``conv2d-stride2-same``.
      build: ``dtype -> (forward, variables)``; ``forward(x)`` returns the model output.
      inputs: ``(rng, dtype) -> (x, y)`` numpy arrays.
      loss: ``"mean"``, ``"sum"`` or ``"vector"``: how the per-example losses are combined.
      per_example_loss: ``(outputs, y) -> [n]`` losses; defaults to half the squared error
        summed over every non-batch axis.
      reference: ``"brute"`` (one forward and gradient per example) or ``"jacobian"`` (each
        example's loss differentiated in the forward pass of the whole batch: the definition
        when a layer couples the examples, as BatchNormalization in training mode does).
    """

    id: str
    build: Callable
    inputs: Callable
    loss: str = "mean"
    per_example_loss: Callable | None = None
    reference: str = "brute"


def squared_error(out, y):
    axes = list(range(1, len(out.shape)))
    return 0.5 * tf.reduce_sum(tf.square(out - y), axis=axes)


def _normal(*shape):
    return lambda rng, dtype: (
        rng.normal(size=shape).astype(dtype),
        None,
    )


def _xy(x_shape, y_shape):
    def make(rng, dtype):
        return rng.normal(size=x_shape).astype(dtype), rng.normal(size=y_shape).astype(dtype)

    return make


def _keras(*layers_fn, input_shape):
    """A Sequential model built in the given dtype."""

    def build(dtype):
        keras.utils.set_random_seed(1)
        model = keras.Sequential(
            [keras.Input(input_shape, dtype=dtype)] + [f(dtype) for f in layers_fn]
        )
        return model, model.trainable_variables

    return build


def dense(units, activation=None, **kw):
    return lambda dtype: keras.layers.Dense(units, activation=activation, dtype=dtype, **kw)


def conv(kind, filters, kernel, **kw):
    cls = {1: keras.layers.Conv1D, 2: keras.layers.Conv2D, 3: keras.layers.Conv3D}[kind]
    return lambda dtype: cls(filters, kernel, dtype=dtype, **kw)


def layer_norm():
    # Non-trivial scale and offset so that their gradients are not the identity's.
    return lambda dtype: keras.layers.LayerNormalization(
        dtype=dtype, gamma_initializer="random_normal", beta_initializer="random_normal"
    )


def batch_norm(axis=-1):
    # Random scale and offset; `training` is set by the caller (see `_training`).
    return lambda dtype: keras.layers.BatchNormalization(
        axis=axis,
        dtype=dtype,
        gamma_initializer="random_normal",
        beta_initializer="random_normal",
        moving_variance_initializer=keras.initializers.RandomUniform(0.5, 2.0),
        moving_mean_initializer="random_normal",
    )


def _training(build):
    """The model called with ``training=True`` (BatchNormalization uses batch statistics)."""

    def wrapped(dtype):
        model, variables = build(dtype)
        return (lambda x: model(x, training=True)), variables

    return wrapped


def flatten():
    return lambda dtype: keras.layers.Flatten(dtype=dtype)


def _functional(dtype):
    keras.utils.set_random_seed(2)
    inp = keras.Input((6,), dtype=dtype)
    h = keras.layers.Dense(5, activation="relu", dtype=dtype)(inp)
    skip = keras.layers.Dense(5, use_bias=False, dtype=dtype)(inp)
    h = keras.layers.Add(dtype=dtype)([h, skip])
    out = keras.layers.Dense(2, dtype=dtype)(h)
    model = keras.Model(inp, out)
    return model, model.trainable_variables


class SubclassedConv(keras.Model):
    def __init__(self, dtype):
        super().__init__(dtype=dtype)
        self.conv = keras.layers.Conv2D(3, 3, padding="same", activation="tanh", dtype=dtype)
        self.flat = keras.layers.Flatten(dtype=dtype)
        self.out = keras.layers.Dense(2, dtype=dtype)

    def call(self, x):
        return self.out(self.flat(self.conv(x)))


def _subclassed(dtype):
    keras.utils.set_random_seed(3)
    model = SubclassedConv(dtype)
    model(np.zeros((1, 5, 5, 2), dtype))
    return model, model.trainable_variables


class RawModule(tf.Module):
    """Raw TF ops: W as the left operand with a transposed input, and a broadcast bias."""

    def __init__(self, dtype):
        super().__init__()
        rng = np.random.default_rng(4)
        self.w1 = tf.Variable(rng.normal(size=(5, 4)).astype(dtype), name="w1")
        self.b1 = tf.Variable(rng.normal(size=(5,)).astype(dtype), name="b1")
        self.w2 = tf.Variable(rng.normal(size=(3, 5)).astype(dtype), name="w2")

    def __call__(self, x):
        h = tf.transpose(tf.matmul(self.w1, x, transpose_b=True))  # [n, 5]
        h = tf.tanh(h + self.b1)
        return tf.matmul(h, self.w2, transpose_b=True)  # [n, 3]


def _raw(dtype):
    m = RawModule(dtype)
    return m, [m.w1, m.b1, m.w2]


class SharedDense(keras.Model):
    """A Dense layer applied to two inputs: contributions sum per example before the power."""

    def __init__(self, dtype):
        super().__init__(dtype=dtype)
        self.shared = keras.layers.Dense(3, activation="tanh", dtype=dtype)
        self.out = keras.layers.Dense(2, dtype=dtype)

    def call(self, x):
        return self.out(self.shared(x[:, :4]) * self.shared(x[:, 4:]))


def _twice(dtype):
    keras.utils.set_random_seed(5)
    model = SharedDense(dtype)
    model(np.zeros((1, 8), dtype))
    return model, model.trainable_variables


def _ids(shape, vocab, y_shape):
    """Integer ids with repeats inside every example, and float targets."""

    def make(rng, dtype):
        ids = rng.integers(0, vocab, size=shape).astype("int32")
        ids[:, 1] = ids[:, 0]  # a repeated id in every example
        return ids, rng.normal(size=y_shape).astype(dtype)

    return make


def _embedding(dtype):
    keras.utils.set_random_seed(6)
    model = keras.Sequential(
        [
            keras.Input((5,), dtype="int32"),
            keras.layers.Embedding(7, 3, dtype=dtype),
            keras.layers.GlobalAveragePooling1D(dtype=dtype),
            keras.layers.Dense(2, dtype=dtype),
        ]
    )
    return model, model.trainable_variables


class TiedEmbedding(keras.Model):
    """Token embedding reused as the output projection (a gather and a matmul of one table)."""

    def __init__(self, dtype):
        super().__init__(dtype=dtype)
        self.emb = keras.layers.Embedding(6, 4, dtype=dtype)
        self.mix = keras.layers.Dense(4, activation="tanh", dtype=dtype)

    def call(self, ids):
        h = self.mix(tf.reduce_mean(self.emb(ids), axis=1))
        return tf.matmul(h, self.emb.embeddings, transpose_b=True)


def _tied(dtype):
    keras.utils.set_random_seed(8)
    model = TiedEmbedding(dtype)
    model(np.zeros((1, 4), "int32"))
    return model, model.trainable_variables


class SparseReadModule(tf.Module):
    """Raw TF: ``tf.nn.embedding_lookup`` on a resource variable is a ``ResourceGather``."""

    def __init__(self, dtype):
        super().__init__()
        rng = np.random.default_rng(9)
        self.table = tf.Variable(rng.normal(size=(8, 2)).astype(dtype), name="table")
        self.w = tf.Variable(rng.normal(size=(2, 3)).astype(dtype), name="w")

    def __call__(self, ids):
        rows = tf.nn.embedding_lookup(self.table, ids)  # [n, T, 2]
        return tf.matmul(tf.reduce_sum(tf.tanh(rows), axis=1), self.w)


def _sparse_read(dtype):
    m = SparseReadModule(dtype)
    return m, [m.table, m.w]


def _encoder_block(dtype):
    """A transformer encoder block: self-attention + layer norm + MLP, both residual."""
    keras.utils.set_random_seed(10)
    inp = keras.Input((5, 8), dtype=dtype)
    att = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, dtype=dtype)(inp, inp)
    h = keras.layers.LayerNormalization(dtype=dtype)(keras.layers.Add(dtype=dtype)([inp, att]))
    mlp = keras.layers.Dense(8, dtype=dtype)(keras.layers.Dense(16, "relu", dtype=dtype)(h))
    out = keras.layers.LayerNormalization(dtype=dtype)(keras.layers.Add(dtype=dtype)([h, mlp]))
    model = keras.Model(inp, out)
    return model, model.trainable_variables


class RawEinsum(tf.Module):
    """A plain ``tf.einsum`` projection with the batch letter first in the output."""

    def __init__(self, dtype):
        super().__init__()
        rng = np.random.default_rng(12)
        self.w = tf.Variable(rng.normal(size=(4, 2, 3)).astype(dtype), name="w")

    def __call__(self, x):
        return tf.einsum("btd,dhk->bthk", x, self.w)


def _raw_einsum(dtype):
    m = RawEinsum(dtype)
    return m, [m.w]


class CustomOps(tf.Module):
    """Consumers without a rule (the exact fallback): ``tf.sin(W)``, a ``tf.custom_gradient``
    straight-through estimator, and a variable that also feeds a supported ``MatMul``."""

    def __init__(self, dtype):
        super().__init__()
        rng = np.random.default_rng(13)
        self.w_sin = tf.Variable(rng.normal(size=(4, 3)).astype(dtype), name="w_sin")
        self.w_ste = tf.Variable(rng.normal(size=(3, 3)).astype(dtype), name="w_ste")
        self.w_both = tf.Variable(rng.normal(size=(3, 2)).astype(dtype), name="w_both")
        self.b = tf.Variable(rng.normal(size=(2,)).astype(dtype), name="b")

    def __call__(self, x):
        h = tf.tanh(tf.matmul(x, tf.sin(self.w_sin)))
        h = tf.tanh(tf.matmul(h, _straight_through(self.w_ste)))
        return tf.matmul(h, self.w_both) + tf.reduce_sum(tf.cos(self.w_both) * self.b)


@tf.custom_gradient
def _straight_through(w):
    """Rounds to quarters; the gradient passes through, scaled by 1.5 (a custom gradient)."""

    def grad(dy):
        return 1.5 * dy

    return tf.round(w * 4.0) / 4.0, grad


def _custom_ops(dtype):
    m = CustomOps(dtype)
    return m, [m.w_sin, m.w_ste, m.w_both, m.b]


def rnn(kind, units, **kw):
    cls = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}[kind]
    return lambda dtype: cls(units, dtype=dtype, **kw)


def sparse_ce(out, y):
    return keras.losses.sparse_categorical_crossentropy(tf.cast(y, tf.int32), out, from_logits=True)


def _labels(x_shape, classes):
    def make(rng, dtype):
        return rng.normal(size=x_shape).astype(dtype), rng.integers(0, classes, size=x_shape[0])

    return make


CASES: list[Case] = [
    Case("mlp", _keras(dense(7, "tanh"), dense(3), input_shape=(4,)), _xy((5, 4), (5, 3))),
    Case(
        "mlp-sum", _keras(dense(7, "tanh"), dense(3), input_shape=(4,)), _xy((5, 4), (5, 3)), "sum"
    ),
    Case(
        "mlp-vector-loss",
        _keras(dense(7, "tanh"), dense(3), input_shape=(4,)),
        _xy((5, 4), (5, 3)),
        "vector",
    ),
    Case(
        "mlp-cross-entropy",
        _keras(dense(6, "relu"), dense(4), input_shape=(3,)),
        _labels((6, 3), 4),
        per_example_loss=sparse_ce,
    ),
    Case("batch-of-one", _keras(dense(3, "tanh"), dense(2), input_shape=(4,)), _xy((1, 4), (1, 2))),
    Case(
        "dense-sequence",
        _keras(dense(5, "tanh"), dense(3), input_shape=(4, 6)),
        _xy((3, 4, 6), (3, 4, 3)),
    ),
    Case(
        "dense-sequence-sum",
        _keras(dense(3), input_shape=(2, 3, 4)),
        _xy((3, 2, 3, 4), (3, 2, 3, 3)),
        "sum",
    ),
    Case(
        "conv1d-valid",
        _keras(conv(1, 3, 3), flatten(), dense(2), input_shape=(7, 2)),
        _xy((4, 7, 2), (4, 2)),
    ),
    Case(
        "conv1d-stride2-same",
        _keras(conv(1, 3, 3, strides=2, padding="same"), input_shape=(8, 2)),
        _xy((4, 8, 2), (4, 4, 3)),
    ),
    Case(
        "conv1d-dilation2-causal",
        _keras(conv(1, 2, 3, dilation_rate=2, padding="causal"), input_shape=(9, 2)),
        _xy((3, 9, 2), (3, 9, 2)),
    ),
    Case(
        "conv2d-valid",
        _keras(conv(2, 3, (2, 3)), flatten(), dense(2), input_shape=(5, 6, 2)),
        _xy((4, 5, 6, 2), (4, 2)),
    ),
    Case(
        "conv2d-stride2-same",
        _keras(conv(2, 4, 3, strides=2, padding="same"), input_shape=(7, 6, 3)),
        _xy((3, 7, 6, 3), (3, 4, 3, 4)),
    ),
    Case(
        "conv2d-stride21-valid",
        _keras(conv(2, 2, (3, 2), strides=(2, 1)), input_shape=(7, 5, 2)),
        _xy((3, 7, 5, 2), (3, 3, 4, 2)),
    ),
    Case(
        "conv2d-dilation2-same",
        _keras(conv(2, 3, 3, dilation_rate=2, padding="same"), input_shape=(6, 7, 2)),
        _xy((3, 6, 7, 2), (3, 6, 7, 3)),
    ),
    Case(
        "conv2d-no-bias-then-dense",
        _keras(
            conv(2, 3, 3, use_bias=False, activation="relu"),
            flatten(),
            dense(2),
            input_shape=(5, 5, 1),
        ),
        _xy((4, 5, 5, 1), (4, 2)),
    ),
    Case(
        "conv3d-stride2-same",
        _keras(conv(3, 2, 3, strides=2, padding="same"), input_shape=(5, 4, 5, 2)),
        _xy((3, 5, 4, 5, 2), (3, 3, 2, 3, 2)),
    ),
    Case(
        "conv3d-dilation2-valid",
        _keras(conv(3, 2, 2, dilation_rate=2), input_shape=(5, 5, 4, 1)),
        _xy((2, 5, 5, 4, 1), (2, 3, 3, 2, 2)),
    ),
    Case(
        "depthwise-conv2d-stride2-same",
        _keras(
            lambda dtype: keras.layers.DepthwiseConv2D(
                3, strides=2, padding="same", depth_multiplier=2, dtype=dtype
            ),
            input_shape=(6, 5, 3),
        ),
        _xy((3, 6, 5, 3), (3, 3, 3, 6)),
    ),
    Case(
        "separable-conv2d-valid",
        _keras(
            lambda dtype: keras.layers.SeparableConv2D(4, (2, 3), depth_multiplier=2, dtype=dtype),
            flatten(),
            dense(2),
            input_shape=(5, 6, 2),
        ),
        _xy((3, 5, 6, 2), (3, 2)),
    ),
    Case(
        "depthwise-conv2d-dilation2",
        _keras(
            lambda dtype: keras.layers.DepthwiseConv2D(2, dilation_rate=2, dtype=dtype),
            input_shape=(6, 6, 2),
        ),
        _xy((2, 6, 6, 2), (2, 4, 4, 2)),
    ),
    Case(
        "conv1d-transpose-stride2-same",
        _keras(
            lambda dtype: keras.layers.Conv1DTranspose(
                3, 3, strides=2, padding="same", dtype=dtype
            ),
            input_shape=(4, 2),
        ),
        _xy((3, 4, 2), (3, 8, 3)),
    ),
    Case(
        "conv2d-transpose-stride2-valid",
        _keras(
            lambda dtype: keras.layers.Conv2DTranspose(2, (3, 2), strides=2, dtype=dtype),
            flatten(),
            dense(2),
            input_shape=(3, 4, 2),
        ),
        _xy((3, 3, 4, 2), (3, 2)),
    ),
    Case(
        "conv3d-transpose-same",
        _keras(
            lambda dtype: keras.layers.Conv3DTranspose(2, 2, padding="same", dtype=dtype),
            input_shape=(3, 2, 3, 1),
        ),
        _xy((2, 3, 2, 3, 1), (2, 3, 2, 3, 2)),
    ),
    Case("functional-residual", _functional, _xy((5, 6), (5, 2))),
    Case("subclassed-conv", _subclassed, _xy((3, 5, 5, 2), (3, 2)), "sum"),
    Case("raw-module", _raw, _xy((5, 4), (5, 3))),
    Case("layer-used-twice", _twice, _xy((4, 8), (4, 2))),
    Case(
        "layernorm-sequence",
        _keras(dense(6), layer_norm(), input_shape=(4, 5)),
        _xy((3, 4, 5), (3, 4, 6)),
    ),
    Case(
        "layernorm-then-dense",
        _keras(layer_norm(), dense(2), input_shape=(5,)),
        _xy((4, 5), (4, 2)),
    ),
    Case("transformer-encoder-block", _encoder_block, _xy((3, 5, 8), (3, 5, 8))),
    Case("raw-einsum", _raw_einsum, _xy((3, 5, 4), (3, 5, 2, 3))),
    Case("embedding-repeated-ids", _embedding, _ids((4, 5), 7, (4, 2))),
    Case("embedding-tied-output", _tied, _ids((4, 4), 6, (4, 6))),
    Case("embedding-resource-gather", _sparse_read, _ids((3, 6), 8, (3, 3))),
    # The exact fallback: while loops (Keras LSTM/GRU) and ops without a rule.
    Case(
        "lstm-classifier-fallback",
        _keras(rnn("lstm", 4), dense(3), input_shape=(5, 3)),
        _labels((6, 5, 3), 3),
        per_example_loss=sparse_ce,
    ),
    Case(
        "gru-sequence-fallback",
        _keras(rnn("gru", 3, return_sequences=True), dense(2), input_shape=(4, 2)),
        _xy((5, 4, 2), (5, 4, 2)),
        "sum",
    ),
    Case("custom-ops-fallback", _custom_ops, _xy((5, 4), (5, 2))),
    Case("custom-ops-fallback-vector-loss", _custom_ops, _xy((5, 4), (5, 2)), "vector"),
    # BatchNormalization in inference mode: the moving statistics are constants.
    Case(
        "batchnorm-inference",
        _keras(dense(4, "tanh"), batch_norm(), dense(2), input_shape=(3,)),
        _xy((5, 3), (5, 2)),
    ),
    # In training mode the batch statistics couple the examples; gamma and beta (the first
    # layer here, nothing upstream) are exact against the per-example loss's jacobian.
    Case(
        "batchnorm-training-dense",
        _training(_keras(batch_norm(), dense(2, "tanh"), input_shape=(5,))),
        _xy((6, 5), (6, 2)),
        reference="jacobian",
    ),
    Case(
        "batchnorm-training-images",
        _training(_keras(batch_norm(), flatten(), dense(2), input_shape=(3, 3, 2))),
        _xy((4, 3, 3, 2), (4, 2)),
        "sum",
        reference="jacobian",
    ),
    Case(
        "batchnorm-training-channels-first",
        _training(_keras(batch_norm(axis=1), flatten(), dense(2), input_shape=(2, 3, 3))),
        _xy((4, 2, 3, 3), (4, 2)),
        reference="jacobian",
    ),
]

CASES_BY_ID = {c.id: c for c in CASES}
