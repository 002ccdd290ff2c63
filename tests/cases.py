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
      reference: ``"brute"`` (one forward and gradient per example), ``"jacobian"`` (each
        example's loss differentiated in the forward pass of the whole batch: the definition
        when a layer couples the examples, as BatchNormalization in training mode does) or
        ``"rows"`` (as ``"jacobian"``, one example per entry of the loss vector however many
        rows it has: a batch concatenated in the step).
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
    cls = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU, "rnn": keras.layers.SimpleRNN}[kind]
    return lambda dtype: cls(units, dtype=dtype, **kw)


def bidirectional(kind, units, **kw):
    return lambda dtype: keras.layers.Bidirectional(rnn(kind, units, **kw)(dtype), dtype=dtype)


def masking():
    return lambda dtype: keras.layers.Masking(0.0, dtype=dtype)


def _padded(x_shape, y_shape, lengths):
    """Sequences whose steps past ``lengths[j]`` are zeros (masked by ``Masking(0.0)``)."""

    def make(rng, dtype):
        x = rng.normal(size=x_shape).astype(dtype)
        for j, length in enumerate(lengths):
            x[j, length:] = 0.0
        return x, rng.normal(size=y_shape).astype(dtype)

    return make


def _masked_embedding(dtype):
    keras.utils.set_random_seed(7)
    model = keras.Sequential(
        [
            keras.Input((5,), dtype="int32"),
            keras.layers.Embedding(7, 3, mask_zero=True, dtype=dtype),
            keras.layers.LSTM(3, dtype=dtype),
            keras.layers.Dense(2, dtype=dtype),
        ]
    )
    return model, model.trainable_variables


def _padded_ids(shape, vocab, y_shape):
    """Ids padded with 0 (masked by ``mask_zero``) after a different length per example."""

    def make(rng, dtype):
        ids = rng.integers(1, vocab, size=shape).astype("int32")
        for j in range(shape[0]):
            ids[j, 1 + j % (shape[1] - 1) :] = 0
        return ids, rng.normal(size=y_shape).astype(dtype)

    return make


def sparse_ce(out, y):
    return keras.losses.sparse_categorical_crossentropy(tf.cast(y, tf.int32), out, from_logits=True)


def _labels(x_shape, classes):
    def make(rng, dtype):
        return rng.normal(size=x_shape).astype(dtype), rng.integers(0, classes, size=x_shape[0])

    return make


def _token_labels(x_shape, classes):
    """Inputs ``[n, T, d]`` and a label per token ``[n, T]``."""

    def make(rng, dtype):
        return rng.normal(size=x_shape).astype(dtype), rng.integers(0, classes, size=x_shape[:2])

    return make


def token_ce(out, y):
    """Cross-entropy per token (logits ``[n, T, V]``; TensorFlow reshapes them to ``[n * T,
    V]``: the examples folded with the positions), summed per example."""
    ce = keras.losses.sparse_categorical_crossentropy(tf.cast(y, tf.int32), out, from_logits=True)
    return tf.reduce_sum(ce, axis=1)


class TokenAndPosition(keras.layers.Layer):
    """keras.io's "text classification with Transformer": ``tok(ids) + pos(arange(T))``."""

    def __init__(self, maxlen, vocab, dim, dtype):
        super().__init__(dtype=dtype)
        self.tok = keras.layers.Embedding(vocab, dim, dtype=dtype)
        self.pos = keras.layers.Embedding(maxlen, dim, dtype=dtype)

    def call(self, x):
        positions = keras.ops.arange(0, keras.ops.shape(x)[-1], 1)
        return self.tok(x) + self.pos(positions)


def _token_and_position(maxlen=5, vocab=7, dim=4, heads=2):
    """Position table (no examples in its ids), attention, a Dense on sequences, pooling."""

    def build(dtype):
        keras.utils.set_random_seed(21)
        inp = keras.Input((maxlen,), dtype="int32")
        h = TokenAndPosition(maxlen, vocab, dim, dtype)(inp)
        att = keras.layers.MultiHeadAttention(heads, 3, dtype=dtype)(h, h)
        h = keras.layers.LayerNormalization(dtype=dtype)(keras.layers.Add(dtype=dtype)([h, att]))
        h = keras.layers.Dense(dim, activation="tanh", dtype=dtype)(h)
        h = keras.layers.GlobalAveragePooling1D(dtype=dtype)(h)
        out = keras.layers.Dense(2, dtype=dtype)(h)
        model = keras.Model(inp, out)
        return model, model.trainable_variables

    return build


class PositionIds(keras.layers.Layer):
    """keras_hub style: a learned table looked up with ``position_ids`` of shape ``[1, T]``."""

    def __init__(self, length, dim, dtype):
        super().__init__(dtype=dtype)
        self.length = length
        self.table = self.add_weight((length, dim), initializer="random_normal", name="table")

    def call(self, x):
        ids = keras.ops.expand_dims(keras.ops.arange(self.length), 0)  # [1, T]
        return x + keras.ops.take(self.table, ids, axis=0)


class BroadcastPosition(keras.layers.Layer):
    """keras_hub's ``PositionEmbedding``: the table sliced and broadcast to ``[n, T, d]``."""

    def __init__(self, length, dim, dtype):
        super().__init__(dtype=dtype)
        self.table = self.add_weight((length, dim), initializer="random_normal", name="table")

    def call(self, x):
        shape = keras.ops.shape(x)
        table = keras.ops.slice(self.table, (0, 0), (shape[-2], shape[-1]))
        return x + keras.ops.broadcast_to(table, shape)


def _bert_like(dtype):
    keras.utils.set_random_seed(26)
    inp = keras.Input((5,), dtype="int32")
    h = keras.layers.Embedding(7, 4, dtype=dtype)(inp)
    h = BroadcastPosition(6, 4, dtype)(h)
    h = keras.layers.LayerNormalization(dtype=dtype)(h)
    h = keras.layers.Dense(3, activation="tanh", dtype=dtype)(h)
    out = keras.layers.Dense(2, dtype=dtype)(keras.layers.Flatten(dtype=dtype)(h))
    model = keras.Model(inp, out)
    return model, model.trainable_variables


class ClassToken(keras.layers.Layer):
    """ViT: a learned token broadcast to the batch and prepended to the patches."""

    def __init__(self, dim, dtype):
        super().__init__(dtype=dtype)
        self.token = self.add_weight((1, 1, dim), initializer="random_normal", name="token")

    def call(self, x):
        n = keras.ops.shape(x)[0]
        token = keras.ops.tile(keras.ops.cast(self.token, x.dtype), [n, 1, 1])
        return keras.ops.concatenate([token, x], axis=1)


def _vit_like(dtype):
    keras.utils.set_random_seed(22)
    inp = keras.Input((4, 3), dtype=dtype)
    h = keras.layers.Dense(3, dtype=dtype)(inp)
    h = ClassToken(3, dtype)(h)
    h = PositionIds(5, 3, dtype)(h)
    h = keras.layers.Dense(4, activation="tanh", dtype=dtype)(h)
    out = keras.layers.Dense(2, dtype=dtype)(h[:, 0])
    model = keras.Model(inp, out)
    return model, model.trainable_variables


class Windows(keras.layers.Layer):
    """Swin-style window attention's layout: ``[n, H, W, C]`` folded into ``[n * windows,
    w * w, C]`` (examples x windows on the leading axis), a projection, and back."""

    def __init__(self, window, units, dtype):
        super().__init__(dtype=dtype)
        self.window = window
        self.proj = keras.layers.EinsumDense("bwc,cd->bwd", (None, units), dtype=dtype)
        self.dense = keras.layers.Dense(units, dtype=dtype)

    def call(self, x):
        n, h, w, c = (keras.ops.shape(x)[i] for i in range(4))
        s = self.window
        t = keras.ops.reshape(x, (-1, h // s, s, w // s, s, c))
        t = keras.ops.transpose(t, (0, 1, 3, 2, 4, 5))
        t = keras.ops.reshape(t, (-1, s * s, c))
        t = keras.ops.tanh(self.proj(t))
        t = self.dense(t)  # a Dense on the windows: MatMul on [n * windows * s * s, c]
        u = t.shape[-1]
        t = keras.ops.reshape(t, (-1, h // s, w // s, s, s, u))
        t = keras.ops.transpose(t, (0, 1, 3, 2, 4, 5))
        return keras.ops.reshape(t, (-1, h, w, u))


def _windows(dtype):
    keras.utils.set_random_seed(23)
    inp = keras.Input((4, 4, 3), dtype=dtype)
    h = Windows(2, 3, dtype)(inp)
    out = keras.layers.Dense(2, dtype=dtype)(keras.layers.Flatten(dtype=dtype)(h))
    model = keras.Model(inp, out)
    return model, model.trainable_variables


def _lora(kind, rank=2):
    """Keras LoRA: only the adapters ``A``, ``B`` are trainable; the kernel is ``W0 + s A B``."""

    def build(dtype):
        keras.utils.set_random_seed(24)
        if kind == "dense":
            inp = keras.Input((3,), dtype=dtype)
            layer = keras.layers.Dense(4, dtype=dtype)
        elif kind == "dense-sequence":
            inp = keras.Input((5, 3), dtype=dtype)
            layer = keras.layers.Dense(4, dtype=dtype)
        else:
            inp = keras.Input((5, 3), dtype=dtype)
            layer = keras.layers.EinsumDense("btc,cd->btd", (5, 4), bias_axes="d", dtype=dtype)
        h = layer(inp)
        floatx = keras.config.floatx()
        keras.config.set_floatx(dtype)  # enable_lora creates its weights in floatx
        try:
            layer.enable_lora(rank, lora_alpha=3.0)
        finally:
            keras.config.set_floatx(floatx)
        # random adapters (B starts at zero), so that every path carries a gradient
        for v in (layer.lora_kernel_a, layer.lora_kernel_b):
            v.assign(np.random.default_rng(7).normal(size=v.shape).astype(dtype))
        h = keras.layers.Activation("tanh", dtype=dtype)(h)
        out = keras.layers.Dense(2, dtype=dtype)(
            h if kind == "dense" else keras.layers.Flatten(dtype=dtype)(h)
        )
        model = keras.Model(inp, out)
        return model, [layer.lora_kernel_a, layer.lora_kernel_b]

    return build


class WeightNorm(keras.layers.Layer):
    """A kernel rebuilt from other variables: ``W = g * v / |v|`` (weight normalisation)."""

    def __init__(self, units, dtype):
        super().__init__(dtype=dtype)
        self.units = units

    def build(self, shape):
        self.v = self.add_weight((shape[-1], self.units), initializer="random_normal", name="v")
        self.g = self.add_weight((self.units,), initializer="ones", name="g")

    def call(self, x):
        norm = keras.ops.sqrt(keras.ops.sum(self.v * self.v, axis=0))
        return keras.ops.matmul(x, self.v * (self.g / norm))


def _prelu_weightnorm(dtype):
    keras.utils.set_random_seed(25)
    inp = keras.Input((4,), dtype=dtype)
    h = keras.layers.Dense(5, dtype=dtype)(inp)
    h = keras.layers.PReLU(alpha_initializer="random_normal", dtype=dtype)(h)
    h = WeightNorm(3, dtype)(h)
    out = keras.layers.Dense(2, dtype=dtype)(keras.layers.PReLU(dtype=dtype)(h))
    model = keras.Model(inp, out)
    return model, model.trainable_variables


class ParamOperands(tf.Module):
    """Parameters where no specific rule reaches them: a matrix as the *left* operand of a
    batched matmul, the same matrix tiled to the batch first (DeBERTa's relative position
    projections), a parameter normalised by a chain of ops with diamonds (a LayerNorm of a
    table) before it meets the batch, and an exponent (``Pow`` has no rule)."""

    def __init__(self, dtype):
        super().__init__()
        rng = np.random.default_rng(31)
        self.w_left = tf.Variable(rng.normal(size=(2, 4)).astype(dtype), name="w_left")
        self.w_tiled = tf.Variable(rng.normal(size=(2, 4)).astype(dtype), name="w_tiled")
        self.table = tf.Variable(rng.normal(size=(3, 4)).astype(dtype), name="table")
        self.expo = tf.Variable(rng.normal(size=(3,)).astype(dtype), name="expo")

    def __call__(self, x):  # x: [n, 4, 3]
        a = tf.matmul(self.w_left, x)  # [n, 2, 3], the variable on the left
        tiled = tf.tile(self.w_tiled[None], tf.stack([tf.shape(x)[0], 1, 1]))
        b = tf.matmul(tiled, tf.tanh(x))  # [n, 2, 3]
        mean = tf.reduce_mean(self.table, axis=-1, keepdims=True)
        centred = self.table - mean
        normed = centred * tf.math.rsqrt(tf.reduce_mean(tf.square(centred), -1, keepdims=True))
        c = tf.einsum("nij,kj->nik", tf.transpose(x, [0, 2, 1]), normed)  # [n, 3, 3]
        d = tf.pow(1.0 + tf.square(x[:, 0, :]), self.expo)  # [n, 3]
        return tf.concat([tf.reshape(a + b, [-1, 6]), tf.reshape(c, [-1, 9]), d], axis=1)


def _param_operands(dtype):
    m = ParamOperands(dtype)
    return m, [m.w_left, m.w_tiled, m.table, m.expo]


class ViewTwice(tf.Module):
    """One view of a variable at both inputs of one op: ``w * w`` (``w = tf.identity(s)``),
    ``r @ r`` (``r = tf.reshape(t)``), and ``expm(e)``, which squares its argument inside. An
    op that reads a tensor at two inputs is listed twice by ``t.consumers()``: each use must
    still count once (issue 26, D)."""

    def __init__(self, dtype):
        super().__init__()
        rng = np.random.default_rng(41)
        self.s = tf.Variable((0.5 * rng.normal(size=(3, 3))).astype(dtype), name="s")
        self.t = tf.Variable((0.5 * rng.normal(size=(9,))).astype(dtype), name="t")
        self.e = tf.Variable((0.5 * rng.normal(size=(3, 3))).astype(dtype), name="e")

    def __call__(self, x):  # x: [n, 3]
        w = tf.identity(self.s)
        r = tf.reshape(self.t, [3, 3])
        h = tf.tanh(tf.matmul(x, w * w)) + tf.tanh(tf.matmul(x, r @ r))
        return tf.matmul(h, tf.linalg.expm(self.e))


def _view_twice(dtype):
    m = ViewTwice(dtype)
    return m, [m.s, m.t, m.e]


def _minibatch_std(dtype):
    """Dense -> StyleGAN's minibatch standard deviation (one statistic over the batch,
    concatenated as a feature) -> Dense: the first Dense is coupled (exact fallback)."""
    keras.utils.set_random_seed(43)
    first = keras.layers.Dense(4, activation="tanh", dtype=dtype)
    last = keras.layers.Dense(2, dtype=dtype)

    def forward(x):
        h = first(x)
        std = tf.reduce_mean(tf.sqrt(tf.math.reduce_variance(h, axis=0) + 1e-3))
        return last(tf.concat([h, tf.ones_like(h[:, :1]) * std], axis=1))

    forward(np.zeros((1, 3), dtype))
    return forward, first.trainable_variables + last.trainable_variables


@tf.custom_gradient
def _batch_centred_gradient(h):
    """The identity; its gradient is centred over the batch (a backward that couples)."""

    def grad(dy):
        return dy - 0.5 * tf.reduce_mean(dy, axis=0, keepdims=True)

    return tf.identity(h), grad


def _coupled_custom_gradient(dtype):
    keras.utils.set_random_seed(44)
    first = keras.layers.Dense(4, activation="tanh", dtype=dtype)
    last = keras.layers.Dense(2, dtype=dtype)

    def forward(x):
        return last(_batch_centred_gradient(first(x)))

    forward(np.zeros((1, 3), dtype))
    return forward, first.trainable_variables + last.trainable_variables


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
    # Where the examples are must be proven, never guessed from shapes: position tables with no
    # examples in their ids, folded windows, LoRA's A @ B, class tokens, weight norm, and batch
    # sizes that coincide with the sequence length, the vocabulary, the width or 1.
    Case("token-and-position-batch-eq-seq", _token_and_position(), _ids((5, 5), 7, (5, 2))),
    Case("token-and-position-batch-ne-seq", _token_and_position(), _ids((3, 5), 7, (3, 2))),
    Case("token-and-position-batch-eq-vocab", _token_and_position(), _ids((7, 5), 7, (7, 2))),
    Case("token-and-position-batch-eq-width", _token_and_position(), _ids((4, 5), 7, (4, 2))),
    Case("token-and-position-batch-1", _token_and_position(), _ids((1, 5), 7, (1, 2)), "sum"),
    Case("bert-broadcast-position-batch-eq-seq", _bert_like, _ids((5, 5), 7, (5, 2))),
    Case("bert-broadcast-position", _bert_like, _ids((3, 5), 7, (3, 2)), "sum"),
    Case("vit-class-token-position-ids", _vit_like, _xy((5, 4, 3), (5, 2))),
    Case("vit-class-token-batch-eq-tokens", _vit_like, _xy((5, 4, 3), (5, 2)), "vector"),
    Case("swin-windows-batch-eq-windows", _windows, _xy((4, 4, 4, 3), (4, 2))),
    Case("swin-windows", _windows, _xy((3, 4, 4, 3), (3, 2)), "sum"),
    Case("lora-dense", _lora("dense"), _xy((2, 3), (2, 2))),
    Case("lora-dense-sequence", _lora("dense-sequence"), _xy((5, 5, 3), (5, 2))),
    Case("lora-einsum-dense", _lora("einsum"), _xy((3, 5, 3), (3, 2)), "vector"),
    Case("prelu-weight-norm", _prelu_weightnorm, _xy((3, 4), (3, 2))),
    Case("param-operands", _param_operands, _xy((3, 4, 3), (3, 18))),
    Case("param-operands-batch-eq-rows", _param_operands, _xy((2, 4, 3), (2, 18)), "sum"),
    Case("prelu-weight-norm-batch-eq-width", _prelu_weightnorm, _xy((5, 4), (5, 2)), "sum"),
    Case(
        "dense-sequence-token-cross-entropy",
        _keras(dense(5, "tanh"), dense(4), input_shape=(3, 2)),
        _token_labels((4, 3, 2), 4),
        per_example_loss=token_ce,
    ),
    Case("view-used-twice-by-one-op", _view_twice, _xy((4, 3), (4, 3))),
    Case("view-used-twice-by-one-op-batch-eq-width", _view_twice, _xy((3, 3), (3, 3)), "sum"),
    # Keras recurrent layers (a while loop; `tb_gradmom.core.rules.loops`), in
    # RECURRENT_CASE_IDS: each is also run with fallback="error" by tests/test_recurrent.py.
    Case(
        "lstm-classifier",
        _keras(rnn("lstm", 4), dense(3), input_shape=(5, 3)),
        _labels((6, 5, 3), 3),
        per_example_loss=sparse_ce,
    ),
    Case(
        "gru-sequence",
        _keras(rnn("gru", 3, return_sequences=True), dense(2), input_shape=(4, 2)),
        _xy((5, 4, 2), (5, 4, 2)),
        "sum",
    ),
    Case("gru-last", _keras(rnn("gru", 4), dense(2), input_shape=(5, 3)), _xy((6, 5, 3), (6, 2))),
    Case(
        "gru-reset-before-sequence",
        _keras(rnn("gru", 3, reset_after=False, return_sequences=True), input_shape=(4, 2)),
        _xy((5, 4, 2), (5, 4, 3)),
        "vector",
    ),
    Case(
        "gru-reset-before-last",
        _keras(rnn("gru", 4, reset_after=False), dense(2), input_shape=(5, 3)),
        _xy((4, 5, 3), (4, 2)),
    ),
    Case(
        "simplernn-last",
        _keras(rnn("rnn", 3), dense(2), input_shape=(4, 3)),
        _xy((5, 4, 3), (5, 2)),
    ),
    Case(
        "simplernn-sequence-dense-head",
        _keras(rnn("rnn", 3, return_sequences=True), dense(2), input_shape=(4, 3)),
        _xy((5, 4, 3), (5, 4, 2)),
        "sum",
    ),
    Case(
        "lstm-sequence-dense-head",
        _keras(rnn("lstm", 3, return_sequences=True), dense(2, "tanh"), input_shape=(5, 2)),
        _xy((4, 5, 2), (4, 5, 2)),
        "vector",
    ),
    Case(
        "lstm-stacked",
        _keras(rnn("lstm", 4, return_sequences=True), rnn("lstm", 3), dense(2), input_shape=(5, 3)),
        _xy((4, 5, 3), (4, 2)),
    ),
    Case(
        "lstm-bidirectional",
        _keras(bidirectional("lstm", 3), dense(2), input_shape=(4, 3)),
        _xy((5, 4, 3), (5, 2)),
        "sum",
    ),
    Case(
        "gru-bidirectional-sequence",
        _keras(bidirectional("gru", 2, return_sequences=True), input_shape=(4, 3)),
        _xy((3, 4, 3), (3, 4, 4)),
    ),
    Case(
        "lstm-go-backwards-sequence",
        _keras(rnn("lstm", 3, go_backwards=True, return_sequences=True), input_shape=(5, 2)),
        _xy((4, 5, 2), (4, 5, 3)),
    ),
    Case(
        "simplernn-go-backwards",
        _keras(rnn("rnn", 3, go_backwards=True), dense(2), input_shape=(5, 2)),
        _xy((4, 5, 2), (4, 2)),
        "vector",
    ),
    Case(
        "lstm-batch-1", _keras(rnn("lstm", 3), dense(2), input_shape=(4, 2)), _xy((1, 4, 2), (1, 2))
    ),
    Case(
        "gru-batch-1-sum",
        _keras(rnn("gru", 3, return_sequences=True), input_shape=(4, 2)),
        _xy((1, 4, 2), (1, 4, 3)),
        "sum",
    ),
    # batch == sequence length == units == features: no axis is told apart by its size
    Case(
        "lstm-batch-eq-seq-eq-units",
        _keras(rnn("lstm", 4, return_sequences=True), input_shape=(4, 4)),
        _xy((4, 4, 4), (4, 4, 4)),
    ),
    Case(
        "gru-batch-eq-seq-eq-units",
        _keras(rnn("gru", 4), dense(4), input_shape=(4, 4)),
        _xy((4, 4, 4), (4, 4)),
        "sum",
    ),
    # Masked steps keep the previous state: still exact by the rule (the body selects).
    Case(
        "gru-masking",
        _keras(masking(), rnn("gru", 3), dense(2), input_shape=(5, 2)),
        _padded((5, 5, 2), (5, 2), [5, 3, 1, 4, 2]),
    ),
    Case(
        "lstm-masking-sequence",
        _keras(masking(), rnn("lstm", 3, return_sequences=True), input_shape=(4, 2)),
        _padded((4, 4, 2), (4, 4, 3), [2, 4, 1, 3]),
        "sum",
    ),
    Case("lstm-embedding-mask-zero", _masked_embedding, _padded_ids((5, 5), 7, (5, 2))),
    # The exact fallback: ops without a rule.
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
    # Something couples the examples after a layer (issue 26, E and G): the layers before it
    # take the exact fallback, exact against the jacobian; those after it keep their rules.
    Case(
        "batchnorm-training-after-dense",
        _training(_keras(dense(4, "tanh"), batch_norm(), dense(2), input_shape=(3,))),
        _xy((5, 3), (5, 2)),
        reference="jacobian",
    ),
    Case(
        "batchnorm-training-stacked",
        _training(_keras(batch_norm(), dense(3, "tanh"), batch_norm(), dense(2), input_shape=(3,))),
        _xy((4, 3), (4, 2)),
        "sum",
        reference="jacobian",
    ),
    Case("minibatch-std", _minibatch_std, _xy((5, 3), (5, 2)), reference="jacobian"),
    Case(
        "custom-gradient-coupled-activation",
        _coupled_custom_gradient,
        _xy((4, 3), (4, 2)),
        "vector",
        reference="jacobian",
    ),
    Case(
        "batchnorm-training-channels-first",
        _training(_keras(batch_norm(axis=1), flatten(), dense(2), input_shape=(2, 3, 3))),
        _xy((4, 2, 3, 3), (4, 2)),
        reference="jacobian",
    ),
]

# --- Issue 26, "prove more": ops the examples' axis analysis now sees through ------------------


class ShiftedWindows(Windows):
    """Swin's shifted windows (keras_hub's every second block): the feature map is rolled by
    half a window along height and width, cut in windows, projected, put back and rolled back
    (``tf.roll`` along non-batch axes)."""

    def call(self, x):
        s = self.window // 2
        x = keras.ops.roll(x, (-s, -s), axis=(1, 2))
        return keras.ops.roll(super().call(x), (s, s), axis=(1, 2))


def _shifted_windows(dtype):
    keras.utils.set_random_seed(61)
    inp = keras.Input((4, 4, 3), dtype=dtype)
    h = keras.layers.Dense(3, activation="tanh", dtype=dtype)(inp)
    h = ShiftedWindows(2, 3, dtype)(h)
    out = keras.layers.Dense(2, dtype=dtype)(keras.layers.Flatten(dtype=dtype)(h))
    model = keras.Model(inp, out)
    return model, model.trainable_variables


def _softmax_over_axis_1(dtype):
    """CCT's sequence pooling and EANet's external attention normalise over a non-last axis:
    ``softmax(x, axis=1)`` transposes with a permutation computed from ``Range``/``Pack``."""
    keras.utils.set_random_seed(62)
    inp = keras.Input((5, 3), dtype=dtype)
    h = keras.layers.Dense(4, dtype=dtype)(inp)
    h = keras.layers.Softmax(axis=1, dtype=dtype)(h)
    out = keras.layers.Dense(2, dtype=dtype)(keras.layers.Flatten(dtype=dtype)(h))
    model = keras.Model(inp, out)
    return model, model.trainable_variables


def _fnet(kind):
    """FNet's token mixing: the real part of a 2-D FFT over (sequence, features) of a complex
    cast (``fft2d``), or the magnitude of a real FFT over the features (``rfft``)."""

    def build(dtype):
        keras.utils.set_random_seed(63)
        complex_dtype = tf.complex128 if dtype == "float64" else tf.complex64
        first = keras.layers.Dense(4, activation="tanh", dtype=dtype)
        last = keras.layers.Dense(2, dtype=dtype)

        def forward(x):
            h = first(x)
            if kind == "fft2d":
                mixed = tf.math.real(tf.signal.fft2d(tf.cast(h, complex_dtype)))
            else:
                mixed = tf.abs(tf.signal.rfft(h))
            return last(tf.reshape(mixed, [tf.shape(x)[0], -1]))

        forward(np.zeros((1, 5, 3), dtype))
        return forward, first.trainable_variables + last.trainable_variables

    return build


def _cumsum(axis):
    """A cumulative sum of a layer's output along the sequence (``axis=1``: per example), or
    along the batch (``axis=0``: example j's loss sees the rows of the examples before it, a
    coupling: the layer before it takes the exact fallback)."""

    def build(dtype):
        keras.utils.set_random_seed(64)
        first = keras.layers.Dense(4, activation="tanh", dtype=dtype)
        last = keras.layers.Dense(2, dtype=dtype)

        def forward(x):
            h = tf.cumsum(first(x), axis=axis)
            return last(tf.reshape(h, [tf.shape(x)[0], -1]))

        forward(np.zeros((1, 3, 3), dtype))
        return forward, first.trainable_variables + last.trainable_variables

    return build


def _roll_batch(dtype):
    """``tf.roll`` along the batch: example j's loss reads example j-1's row (a coupling)."""
    keras.utils.set_random_seed(65)
    first = keras.layers.Dense(4, activation="tanh", dtype=dtype)
    last = keras.layers.Dense(2, dtype=dtype)

    def forward(x):
        return last(tf.roll(first(x), 1, axis=0) + first(x))

    forward(np.zeros((1, 3), dtype))
    return forward, first.trainable_variables + last.trainable_variables


def _switch_capacity(dtype):
    """The Switch Transformer's expert capacity (keras.io): tokens of the flattened batch are
    routed to their top expert, and a token past the expert's capacity (a ``cumsum`` of the
    argmax's one-hot over all tokens of the batch) is dropped. Which tokens are dropped depends
    on the other examples, through integer and one-hot values that carry no gradient: the
    per-example gradient is that of ``l_j`` in the batch's forward pass (the jacobian reference)
    with the dispatch mask as it is, and every variable keeps its rule. The experts are applied
    densely and masked (no dispatch ``einsum`` over the tokens)."""
    keras.utils.set_random_seed(66)
    experts, capacity, units = 2, 3, 3
    router = keras.layers.Dense(experts, dtype=dtype)
    expert = keras.layers.Dense(experts * units, activation="tanh", dtype=dtype)
    head = keras.layers.Dense(2, dtype=dtype)

    def forward(x):
        tokens = tf.reshape(x, [-1, x.shape[-1]])  # [n * T, d]
        probs = tf.nn.softmax(router(tokens))
        mask = tf.one_hot(tf.argmax(probs, axis=-1), experts, dtype=x.dtype)
        position = tf.cumsum(mask, axis=0) * mask  # 1-based slot of each token in its expert
        keep = mask * tf.cast(position <= capacity, x.dtype)
        gate = tf.reduce_sum(probs * keep, axis=-1, keepdims=True)  # 0 for dropped tokens
        out = tf.reshape(expert(tokens), [-1, experts, units])
        out = gate * tf.einsum("te,teu->tu", keep, out)
        return head(tf.reshape(out, [tf.shape(x)[0], -1]))

    forward(np.zeros((1, 4, 3), dtype))
    variables = router.trainable_variables + expert.trainable_variables
    return forward, variables + head.trainable_variables


def _crops(dtype):
    """The shifted-patch ViT's tokenisation (keras.io): the image shifted by cropping and
    padding back to its size (``tf.image.crop_to_bounding_box``, ``pad_to_bounding_box``: a
    ``Slice`` whose size is computed from the shape), concatenated with the image."""
    keras.utils.set_random_seed(67)
    first = keras.layers.Dense(2, activation="tanh", dtype=dtype)
    last = keras.layers.Dense(2, dtype=dtype)

    def forward(x):
        h = first(x)
        shifted = tf.image.crop_to_bounding_box(h, 1, 1, 3, 3)
        shifted = tf.image.pad_to_bounding_box(shifted, 0, 0, 4, 4)
        tail = h[:, : tf.shape(h)[1] - 1]  # a StridedSlice whose end is computed
        feats = [tf.reshape(t, [tf.shape(x)[0], -1]) for t in (h, shifted, tail)]
        return last(tf.concat(feats, axis=1))

    forward(np.zeros((1, 4, 4, 3), dtype))
    return forward, first.trainable_variables + last.trainable_variables


def _preprocessing(dtype):
    """Keras' preprocessing layers in a model, in inference: Rescaling, Normalization (fixed
    statistics), CenterCrop, RandomFlip, after a fixed projective transform of the input
    images (the op of RandomRotation, RandomZoom and RandomTranslation). Neither Resizing nor
    the transform sits between a variable and the loss: their gradients are float32-accurate
    (with Resizing and the transform after the conv of a float64 model, the conv kernel's M_1
    was 2.0e-8 off brute force, relative 4.6e-8; with the transform alone 4.5e-8, relative
    7.1e-8: TensorFlow's rounding in the batch's gradient); their axes are in
    tests/test_axes.py."""
    keras.utils.set_random_seed(68)
    layers = [
        keras.layers.Rescaling(0.5, 0.1, dtype=dtype),
        keras.layers.Normalization(mean=0.2, variance=1.5, dtype=dtype),
        keras.layers.CenterCrop(4, 4, dtype=dtype),
        keras.layers.RandomFlip(dtype=dtype),
        keras.layers.Conv2D(2, 3, padding="same", activation="tanh", dtype=dtype),
    ]
    last = keras.layers.Dense(2, dtype=dtype)
    # a rotation by 0.3 rad about the centre of the 5 x 5 images, as RandomRotation builds it
    c, s = np.cos(0.3), np.sin(0.3)
    transform = np.array([[c, -s, 2 - 2 * c + 2 * s, s, c, 2 - 2 * s - 2 * c, 0, 0]])

    def forward(x):
        h = tf.raw_ops.ImageProjectiveTransformV3(
            images=x,
            transforms=tf.constant(transform, tf.float32),
            output_shape=[5, 5],
            fill_value=0.0,
            interpolation="BILINEAR",
            fill_mode="REFLECT",
        )
        for layer in layers:
            h = layer(h, training=False) if isinstance(layer, keras.layers.RandomFlip) else layer(h)
        return last(tf.reshape(h, [tf.shape(x)[0], -1]))

    forward(np.zeros((1, 5, 5, 3), dtype))
    variables = [v for layer in layers for v in layer.trainable_variables]
    return forward, variables + last.trainable_variables


def _relative_shift(dtype):
    """XLNet's relative shift of attention scores (keras_hub's layout): the scores
    ``[n, heads, qlen, klen]`` are transposed to put the examples on axis 2, reshaped to swap
    the two lengths, their first row cut by a ``Slice`` whose sizes are read from the shape at
    run time, reshaped back and cut to ``klen`` columns."""
    keras.utils.set_random_seed(69)
    heads, qlen, klen = 2, 3, 4
    scores = keras.layers.Dense(heads * qlen * klen, activation="tanh", dtype=dtype)
    last = keras.layers.Dense(2, dtype=dtype)

    def forward(x):
        h = tf.reshape(scores(x), [tf.shape(x)[0], heads, qlen, klen])
        h = tf.transpose(h, [2, 3, 0, 1])  # [qlen, klen, n, heads]
        size = tf.shape(h)
        h = tf.reshape(h, tf.stack([size[1], size[0], size[2], size[3]]))
        h = tf.slice(h, [1, 0, 0, 0], tf.stack([size[1] - 1, size[0], size[2], size[3]]))
        h = tf.reshape(h, tf.stack([size[0], size[1] - 1, size[2], size[3]]))
        h = tf.slice(h, [0, 0, 0, 0], tf.stack([size[0], klen - 1, size[2], size[3]]))
        h = tf.transpose(h, [2, 3, 0, 1])  # [n, heads, qlen, klen - 1]
        return last(tf.reshape(h, [tf.shape(x)[0], -1]))

    forward(np.zeros((1, 5), dtype))
    return forward, scores.trainable_variables + last.trainable_variables


def _reversed_ids(dtype):
    """Token ids reversed along the batch before an embedding: example j's loss reads example
    n-1-j's ids (integers: no gradient), so the embedding's output carries no examples' axis
    and the table's use is a derived parameter met by the targets; each example's gradient is
    the jacobian's row in the batch's forward pass."""
    keras.utils.set_random_seed(70)
    emb = keras.layers.Embedding(7, 3, dtype=dtype)
    last = keras.layers.Dense(2, dtype=dtype)

    def forward(ids):
        return last(tf.reduce_mean(emb(tf.reverse(ids, [0])), axis=1))

    forward(np.zeros((1, 4), "int32"))
    return forward, emb.trainable_variables + last.trainable_variables


PROVEN_CASES = [
    Case("swin-shifted-windows-roll", _shifted_windows, _xy((3, 4, 4, 3), (3, 2))),
    Case("softmax-over-axis-1", _softmax_over_axis_1, _xy((4, 5, 3), (4, 2)), "sum"),
    Case("fnet-fft2d-token-mixing", _fnet("fft2d"), _xy((3, 5, 3), (3, 2))),
    Case("fnet-rfft-magnitude", _fnet("rfft"), _xy((3, 5, 3), (3, 2))),
    Case("cumsum-along-sequence", _cumsum(1), _xy((4, 3, 3), (4, 2))),
    Case("switch-capacity-cumsum", _switch_capacity, _xy((4, 4, 3), (4, 2)), reference="jacobian"),
    Case("crop-pad-and-dynamic-slice", _crops, _xy((3, 4, 4, 3), (3, 2))),
    Case("preprocessing-layers", _preprocessing, _xy((3, 5, 5, 3), (3, 2))),
    Case("xlnet-relative-shift", _relative_shift, _xy((4, 5), (4, 2))),
    Case("ids-reversed-along-batch", _reversed_ids, _ids((3, 4), 7, (3, 2)), reference="jacobian"),
    # along the batch: coupled, not proven (the layer before takes the exact fallback)
    Case("cumsum-along-batch", _cumsum(0), _xy((4, 3, 3), (4, 2)), reference="jacobian"),
    Case("roll-along-batch", _roll_batch, _xy((4, 3), (4, 2)), reference="jacobian"),
]
CASES += PROVEN_CASES

CASES_BY_ID = {c.id: c for c in CASES}

# The cases whose recurrent layers must take the loop rule (never the exact fallback).
RECURRENT_CASE_IDS = [
    "lstm-classifier",
    "gru-sequence",
    "gru-last",
    "gru-reset-before-sequence",
    "gru-reset-before-last",
    "simplernn-last",
    "simplernn-sequence-dense-head",
    "lstm-sequence-dense-head",
    "lstm-stacked",
    "lstm-bidirectional",
    "gru-bidirectional-sequence",
    "lstm-go-backwards-sequence",
    "simplernn-go-backwards",
    "lstm-batch-1",
    "gru-batch-1-sum",
    "lstm-batch-eq-seq-eq-units",
    "gru-batch-eq-seq-eq-units",
    "gru-masking",
    "lstm-masking-sequence",
    "lstm-embedding-mask-zero",
]


class SinCell(keras.layers.Layer):
    """A custom recurrent cell whose input kernel ``w`` enters as ``sin(w)``: the loop rule
    refuses that use (exact fallback), the recurrent kernel ``u`` keeps the rule."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.state_size = units

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], self.units), name="w")
        self.u = self.add_weight(shape=(self.units, self.units), name="u")

    def call(self, x, states):
        h = tf.tanh(tf.matmul(x, tf.sin(self.w)) + tf.matmul(states[0], self.u))
        return h, [h]


# --- Issue 26: examples made in the step -----------------------------------------------------


class LatentGenerator(keras.Model):
    """A GAN's generator step: latents drawn in the step, one row per example of ``x`` (the
    real batch, used for its size only), through a generator and a fixed discriminator head;
    the loss ``bce(ones_like(logits), logits)`` is made in the step too. ``static``: the latents'
    shape is the Python batch size ``[n, 3]`` instead of ``[tf.shape(x)[0], 3]``. Stateless
    draws, so that the reference's batch forward pass draws the same latents."""

    def __init__(self, static=None, **kwargs):
        super().__init__(**kwargs)
        self.static = static
        self.g1 = keras.layers.Dense(5, activation="tanh")
        self.g2 = keras.layers.Dense(4)
        self.d = keras.layers.Dense(1)

    def call(self, x):
        rows = self.static if self.static is not None else tf.shape(x)[0]
        z = tf.random.stateless_normal([rows, 3], seed=[26, 3], dtype=x.dtype)
        return self.d(tf.nn.relu(self.g2(self.g1(z))))


def _latent_generator(static=None):
    def build(dtype):
        keras.utils.set_random_seed(45)
        with _floatx(dtype):
            model = LatentGenerator(static)
            model(np.zeros((2, 2), dtype))
        return model, model.g1.trainable_variables + model.g2.trainable_variables

    return build


class _floatx:
    """Layers created inside are ``dtype``."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __enter__(self):
        self.old = keras.config.floatx(), keras.config.dtype_policy()
        keras.config.set_floatx(self.dtype)
        keras.config.set_dtype_policy(self.dtype)

    def __exit__(self, *exc):
        keras.config.set_floatx(self.old[0])
        keras.config.set_dtype_policy(self.old[1])


def fake_is_real_ce(out, y):
    """The generator's loss: ``bce(1, logits)`` per row, labels made in the step."""
    ce = tf.nn.sigmoid_cross_entropy_with_logits(tf.ones_like(out), out)
    return tf.reduce_sum(ce, axis=1)


ISSUE26_SOURCE_CASES = [
    Case(
        "gan-generator-latents-in-step",
        _latent_generator(),
        _xy((5, 2), (5, 1)),
        per_example_loss=fake_is_real_ce,
        reference="jacobian",
    ),
    Case(
        "gan-generator-latents-in-step-sum",
        _latent_generator(),
        _xy((4, 2), (4, 1)),
        "sum",
        per_example_loss=fake_is_real_ce,
        reference="jacobian",
    ),
]


class RealFakeDiscriminator(keras.Model):
    """A GAN's discriminator step: ``D(concat([real, G(z)]))``, ``z`` drawn in the step, one
    row per example of the real batch; the examples are the union of the two batches (``2 n``
    rows). The generator's variables are used on the fake rows before they join."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.g = keras.layers.Dense(4, activation="tanh")
        self.d1 = keras.layers.Dense(3, activation="tanh")
        self.d2 = keras.layers.Dense(1)

    def call(self, x):
        z = tf.random.stateless_normal([tf.shape(x)[0], 2], seed=[26, 4], dtype=x.dtype)
        return self.d2(self.d1(tf.concat([x, self.g(z)], axis=0)))


def _real_fake(dtype):
    keras.utils.set_random_seed(46)
    with _floatx(dtype):
        model = RealFakeDiscriminator()
        model(np.zeros((2, 4), dtype))
    # the discriminator's variables first (rules), the generator's last (the fallback)
    variables = model.d1.trainable_variables + model.d2.trainable_variables
    return model, variables + model.g.trainable_variables


def real_fake_ce(out, y):
    """``bce(1, .)`` on the first half of the rows (real), ``bce(0, .)`` on the second."""
    half = tf.shape(out)[0] // 2
    labels = tf.concat([tf.ones([half, 1], out.dtype), tf.zeros([half, 1], out.dtype)], 0)
    return tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels, out), axis=1)


class TwoViews(keras.Model):
    """SimCLR's batch: two views of every example (a shift, a scaling) concatenated along the
    batch, an encoder, and a loss per row (each view an example: ``2 n`` of them)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.enc = keras.layers.Dense(3, activation="tanh")
        self.head = keras.layers.Dense(2)

    def call(self, x):
        views = tf.concat([x + 0.3, 0.8 * x], axis=0)
        return self.head(self.enc(views))


def _two_views(dtype):
    keras.utils.set_random_seed(47)
    with _floatx(dtype):
        model = TwoViews()
        model(np.zeros((2, 3), dtype))
    return model, model.trainable_variables


def half_square(out, y):
    """``0.5 * |out_r|^2`` per row (however many rows)."""
    return 0.5 * tf.reduce_sum(tf.square(out), axis=1)


ISSUE26_SOURCE_CASES += [
    Case(
        "gan-discriminator-concat-real-fake",
        _real_fake,
        _xy((3, 4), (3, 1)),
        per_example_loss=real_fake_ce,
        reference="rows",
    ),
    Case(
        "simclr-two-views-union-sum",
        _two_views,
        _xy((4, 3), (4, 1)),
        "sum",
        per_example_loss=half_square,
        reference="rows",
    ),
]
CASES.extend(ISSUE26_SOURCE_CASES)
CASES_BY_ID.update({c.id: c for c in ISSUE26_SOURCE_CASES})


class LearnedInitialState(keras.Model):
    """An LSTM whose initial states are variables tiled to the batch,
    ``tf.tile(h0[None], [tf.shape(x)[0], 1])``: each example's copy is its own row.

    ``how``: ``"shape"`` (the multiples read from ``tf.shape(x)``, a constant when the batch is
    static), ``"number"`` (``tf.tile(h0[None], [4, 1])``, the batch size as a Python number),
    ``"repeat"`` (``tf.repeat(h0[None], 4, axis=0)``) or ``"broadcast"``
    (``tf.broadcast_to(h0, [4, 3])``)."""

    def __init__(self, how="shape", batch=4, **kwargs):
        super().__init__(**kwargs)
        self.how, self.batch = how, batch
        self.lstm = keras.layers.LSTM(3)
        self.head = keras.layers.Dense(2)

    def _to_batch(self, v, x):
        if self.how == "number":
            return tf.tile(v[None], [self.batch, 1])
        if self.how == "repeat":
            return tf.repeat(v[None], self.batch, axis=0)
        if self.how == "broadcast":
            return tf.broadcast_to(v, [self.batch, 3])
        if self.how == "broadcast-shape":  # the batch size read from x: static or not
            return tf.broadcast_to(v, [tf.shape(x)[0], 3])
        return tf.tile(v[None], [tf.shape(x)[0], 1])

    def build(self, shape):
        self.h0 = self.add_weight(shape=(3,), initializer="random_normal", name="h0")
        self.c0 = self.add_weight(shape=(3,), initializer="random_normal", name="c0")

    def call(self, x):
        states = [self._to_batch(self.h0, x), self._to_batch(self.c0, x)]
        return self.head(self.lstm(x, initial_state=states))


def _learned_initial_state(how="shape"):
    def build(dtype):
        keras.utils.set_random_seed(48)
        with _floatx(dtype):
            model = LearnedInitialState(how)
            model(np.zeros((4, 4, 2), dtype))
        return model, model.trainable_variables

    return build


ISSUE26_TILED_CASES = [
    Case("lstm-learned-initial-state-tiled", _learned_initial_state(), _xy((4, 4, 2), (4, 2))),
]
# Tiled to a static batch (a Python number, as ``tf.shape(x)[0]`` of a static shape is folded
# into): the copies hold no examples by themselves; the loop proves its state's rows are the
# examples' and the loop's rule takes the gradient of its initial value (rule: While).
ISSUE26_STATIC_TILED_CASES = [
    Case(
        f"lstm-learned-initial-state-{how}-static",
        _learned_initial_state(how),
        _xy((4, 4, 2), (4, 2)),
    )
    for how in ("number", "repeat", "broadcast")
]
# broadcast to the batch size read from x: a parameter (no Tile to read the batch from) whether
# the batch is static or not, on the loop's rule either way
ISSUE26_STATIC_TILED_CASES.append(
    Case(
        "lstm-learned-initial-state-broadcast-shape",
        _learned_initial_state("broadcast-shape"),
        _xy((4, 4, 2), (4, 2)),
    )
)
ISSUE26_TILED_CASES += ISSUE26_STATIC_TILED_CASES
CASES.extend(ISSUE26_TILED_CASES)
CASES_BY_ID.update({c.id: c for c in ISSUE26_TILED_CASES})


class FixedRows(keras.Model):
    """A fixed number of rows joined to the batch along its axis: ``learned`` (a ``[2, d]``
    variable, as memory tokens) or ``padding`` (two rows of zeros), then a shared MLP row by
    row. ``back``: the examples' rows are taken back before the loss (``h[:tf.shape(x)[0]]``);
    otherwise the loss is over every row."""

    def __init__(self, rows="learned", back=True, **kwargs):
        super().__init__(**kwargs)
        self.rows, self.back = rows, back
        self.hidden = keras.layers.Dense(4, activation="tanh")
        self.out = keras.layers.Dense(2)

    def build(self, shape):
        self.extra = self.add_weight(shape=(2, 3), initializer="random_normal", name="extra")

    def call(self, x):
        extra = self.extra if self.rows == "learned" else tf.zeros([2, 3], x.dtype)
        h = self.out(self.hidden(tf.concat([x, extra], axis=0)))
        return h[: tf.shape(x)[0]] if self.back else h


def _fixed_rows(rows, back):
    def build(dtype):
        keras.utils.set_random_seed(49)
        with _floatx(dtype):
            model = FixedRows(rows, back)
            model(np.zeros((4, 3), dtype))
        # the padding's `extra` is not used
        return model, [
            v for v in model.trainable_variables if rows == "learned" or "extra" not in v.path
        ]

    return build


# Fixed rows joined to the examples (issue 26): with the batch size unknown at trace time the
# rows are not examples; taken back before the loss, the loss is proven per example
# (`tests/test_example_sources.py` runs these with a dynamic batch against brute force), and a
# loss over every row is refused. With a static batch they are rows of a union (each an example).
ISSUE26_FIXED_ROWS_CASES = [
    Case("concat-learned-rows-taken-back", _fixed_rows("learned", True), _xy((4, 3), (4, 2))),
    Case("concat-padding-rows-taken-back", _fixed_rows("padding", True), _xy((4, 3), (4, 2))),
    Case(
        "concat-learned-rows-in-the-loss",
        _fixed_rows("learned", False),
        _xy((4, 3), (4, 2)),
        per_example_loss=half_square,
        reference="rows",
    ),
]
CASES.extend(ISSUE26_FIXED_ROWS_CASES)
CASES_BY_ID.update({c.id: c for c in ISSUE26_FIXED_ROWS_CASES})


def conv_lstm(kind, filters, kernel, **kw):
    cls = {1: keras.layers.ConvLSTM1D, 2: keras.layers.ConvLSTM2D, 3: keras.layers.ConvLSTM3D}[kind]
    return lambda dtype: cls(filters, kernel, dtype=dtype, **kw)


# Convolutions inside a while loop (Keras' ConvLSTM1D/2D: the input and the recurrent
# convolution at every step), on the loop rule (`tests/test_recurrent.py`, fallback="error").
CONV_RECURRENT_CASES = [
    Case(
        "convlstm1d-valid",
        _keras(conv_lstm(1, 3, 3), flatten(), dense(2), input_shape=(3, 6, 2)),
        _xy((4, 3, 6, 2), (4, 2)),
    ),
    Case(
        "convlstm2d-same-sequences",
        _keras(
            conv_lstm(2, 2, 3, padding="same", return_sequences=True),
            flatten(),
            dense(2),
            input_shape=(3, 4, 4, 2),
        ),
        _xy((3, 3, 4, 4, 2), (3, 2)),
    ),
    Case(
        "convlstm3d-valid",
        _keras(conv_lstm(3, 2, 2), flatten(), dense(2), input_shape=(2, 3, 3, 3, 1)),
        _xy((3, 2, 3, 3, 3, 1), (3, 2)),
    ),
    Case(
        "convlstm2d-strided-batch-eq-steps",
        _keras(conv_lstm(2, 2, 2, strides=2), flatten(), dense(2), input_shape=(3, 5, 5, 1)),
        _xy((3, 3, 5, 5, 1), (3, 2)),
    ),
]
CASES.extend(CONV_RECURRENT_CASES)
CASES_BY_ID.update({c.id: c for c in CONV_RECURRENT_CASES})
CONV_RECURRENT_CASE_IDS = [c.id for c in CONV_RECURRENT_CASES]
