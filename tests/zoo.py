"""The model zoo: real architectures as data, checked exactly by `tests/test_zoo.py`.

Each `Entry` builds a model in a given dtype at its smallest valid input and returns
``(forward, variables, (x, y), per_example_loss)``:

- ``forward(x)`` the model output for a batch ``x`` (a numpy array whose axis 0 is the example
  axis; models with several inputs get them packed on the last axis and unpacked inside
  ``forward``, so that ``x[j:j+1]`` is example ``j``'s own input for the brute-force reference);
- ``variables`` the variables to compute moments for;
- ``per_example_loss(out, y) -> [n]``.

The loss given to ``gradients_and_moments`` is the mean of the per-example losses.

Entries with BatchNormalization (most of ``keras.applications``) are called with
``training=False`` (inference mode: the moving statistics are constants, so examples are not
coupled and the brute-force reference on each example's own slice is the definition). Dropout is
off in that mode too. No entry downloads anything: ``weights=None``, keras_hub backbones are built
from tiny configs (never ``from_preset``), no tokenizers.

Which entries run: ``GRADMOM_ZOO`` = ``default`` (the smallest member of every
``keras.applications`` family and every other entry) or ``full`` (every entry, the heavy
applications included). See `selected`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass

# Nothing may be downloaded: make the hubs fail fast instead of reaching the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("KAGGLEHUB_CACHE", os.path.join(os.sep, "nonexistent", "kagglehub"))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import ops  # noqa: E402


@dataclass(frozen=True)
class ScalarLoss:
    """A scalar loss other than ``mean_j l_j`` for an entry's ``build`` to return in place of
    its per-example loss: ``scalar(out, y)`` is what the step differentiates;
    ``per_example(out, y)`` (``[n]``) the per-example losses it is ``reduction`` of, terms
    that hold no example included (``l_j + R`` for a mean, ``l_j + R / n`` for a sum): what
    the reference differentiates one example at a time."""

    scalar: Callable
    per_example: Callable
    reduction: str = "mean"


@dataclass(frozen=True)
class Entry:
    """One model of the zoo.

    Attributes:
      id: a readable id such as ``app-resnet50``.
      family: the group it belongs to (a ``keras.applications`` module, ``keras_hub``, ...).
      build: ``dtype -> (forward, variables, (x, y), per_example_loss)``; the step's loss is
        ``mean(per_example_loss(forward(x), y))``, or a `ScalarLoss` in its place.
      heavy: only in the full run (``GRADMOM_ZOO=full``).
      fallback: the ``fallback=`` argument: ``"error"`` (every variable must go through a
        rule) or ``"exact"`` (recurrent layers: the while loop has no rule).
      isolate: run in a subprocess of its own (`tests/zoo_worker.py`): big models, for memory
        and so that two of them can run at once.
      float32_inside: why the model computes in float32 whatever its dtype (empty if it does
        not). In float64 such an entry is built and run inside `float64_inside`, which turns
        those float32 casts and layers into float64, so that it is judged at float64 rounding
        like every other entry; `tests/zoo_worker.py` checks first that TensorFlow's own batch
        gradient then matches the reference to float64 rounding (that the patch reached every
        float32 cast).
      note: how the model is called (inference mode, which inputs), for the report.
      reference: ``"auto"`` (each example's loss on its own slice, or from the batch's forward
        pass when the two forward passes differ: `tests/zoo_worker.forward_spread`) or
        ``"batch"`` (always from the batch's forward pass: a model whose examples are coupled
        in its backward pass only, such as a custom gradient centred over the batch) or
        ``"rows"`` (one example per entry of the per-example loss vector of the whole batch's
        forward pass, however many rows it has: a batch built in the step, as a GAN
        discriminator's ``concat([real, fake])``, or examples drawn in the step).
      raises: ``(error type name, message fragment)`` when the core must refuse the entry
        (a loss that mixes the examples), else None.
      on_fallback: how many variables take the exact fallback today (asserted, so that an
        improvement shows: lower it when a proof lands).
    """

    id: str
    family: str
    build: Callable
    heavy: bool = False
    fallback: str = "error"
    isolate: bool = False
    float32_inside: str = ""
    note: str = ""
    reference: str = "auto"
    raises: tuple[str, str] | None = None
    on_fallback: int = 0


@contextlib.contextmanager
def dtype_policy(dtype: str):
    """Layers created inside are ``dtype`` (keras.applications take no ``dtype=``)."""
    old_policy = keras.config.dtype_policy()
    old_floatx = keras.config.floatx()
    keras.config.set_floatx(dtype)
    keras.config.set_dtype_policy(dtype)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(old_policy)
        keras.config.set_floatx(old_floatx)


_FLOAT32_NAMES = ("float32", tf.float32)


def _float64_if_float32(dtype):
    return "float64" if any(dtype == f for f in _FLOAT32_NAMES) else dtype


@contextlib.contextmanager
def float64_inside():
    """Inside, ``keras.ops.cast``/``arange``, new layers and new weights turn float32 into float64.

    keras_hub's Llama, Mistral and Gemma norms cast to ``"float32"``, several attention
    softmaxes are ``Softmax(dtype="float32")`` and ``enable_lora`` makes float32 adapters,
    whatever the model's dtype. A float64 model built and called inside this context computes
    in float64 throughout, so that it can be checked at float64 rounding. Only the public
    ``keras.ops`` entry points (what keras_hub calls), ``Layer.__init__``'s and
    ``Layer.add_weight``'s ``dtype`` are patched; Keras' own internals are untouched.
    """
    layer_cls = keras.layers.Layer
    saved = {name: getattr(keras.ops, name) for name in ("cast", "arange")}
    saved_init, saved_add_weight = layer_cls.__init__, layer_cls.add_weight

    def cast(x, dtype):
        return saved["cast"](x, _float64_if_float32(dtype))

    def arange(*args, dtype=None, **kwargs):
        return saved["arange"](*args, dtype=_float64_if_float32(dtype), **kwargs)

    def init(self, *args, **kwargs):
        if "dtype" in kwargs:
            kwargs["dtype"] = _float64_if_float32(kwargs["dtype"])
        saved_init(self, *args, **kwargs)

    def add_weight(self, *args, **kwargs):
        if "dtype" in kwargs:
            kwargs["dtype"] = _float64_if_float32(kwargs["dtype"])
        return saved_add_weight(self, *args, **kwargs)

    keras.ops.cast, keras.ops.arange = cast, arange
    layer_cls.__init__, layer_cls.add_weight = init, add_weight
    try:
        yield
    finally:
        keras.ops.cast, keras.ops.arange = saved["cast"], saved["arange"]
        layer_cls.__init__, layer_cls.add_weight = saved_init, saved_add_weight


def squared_error(out, y):
    """Half the squared error, summed over every non-batch axis: ``[n]``."""
    axes = list(range(1, len(out.shape)))
    return 0.5 * tf.reduce_sum(tf.square(out - tf.cast(y, out.dtype)), axis=axes)


def sparse_ce_logits(out, y):
    """Cross-entropy of integer labels (``[n]`` or ``[n, T]``, summed over T) and logits."""
    ce = keras.losses.sparse_categorical_crossentropy(tf.cast(y, tf.int32), out, from_logits=True)
    return tf.reshape(ce, [tf.shape(ce)[0], -1]) if len(ce.shape) > 1 else ce


def sparse_ce_sum_tokens(out, y):
    ce = keras.losses.sparse_categorical_crossentropy(tf.cast(y, tf.int32), out, from_logits=True)
    return tf.reduce_sum(ce, axis=list(range(1, len(ce.shape))))


def sparse_ce_probs(out, y):
    """Cross-entropy of integer labels and probabilities (the keras.io example's softmax head)."""
    return keras.losses.sparse_categorical_crossentropy(tf.cast(y, tf.int32), out)


def _flat_outputs(out):
    """One ``[n, features]`` tensor from a tensor or a dict/list of tensors (sorted by key)."""
    if isinstance(out, dict):
        parts = [out[k] for k in sorted(out)]
    elif isinstance(out, (list, tuple)):
        parts = list(out)
    else:
        return out
    n = tf.shape(parts[0])[0]
    return tf.concat([tf.reshape(p, [n, -1]) for p in parts], axis=1)


def _target_like(forward, x, rng, dtype):
    """A fixed random target shaped like ``forward(x)``."""
    shape = tuple(forward(x[:1]).shape[1:])
    return rng.normal(size=(x.shape[0], *shape)).astype(dtype)


# ---------------------------------------------------------------------------------------------
# keras.applications
# ---------------------------------------------------------------------------------------------

# family -> [(constructor, smallest input side, include_top builds at that side, heavy)].
# The smallest input side is the constructors' own minimum (`obtain_input_shape`'s min_size:
# 32, 75 for the Inception family, 71 for Xception). With include_top=True the head is
# `classes=3` logits (classifier_activation=None) and the loss is half the squared error to a
# fixed random target.
#
# The heavy members' measured cost and error: `TIMINGS` below.
APPLICATIONS: dict[str, list[tuple[str, int, bool, bool]]] = {
    "convnext": [
        ("ConvNeXtTiny", 32, True, False),
        ("ConvNeXtSmall", 32, True, True),
        ("ConvNeXtBase", 32, True, True),
        ("ConvNeXtLarge", 32, True, True),
        ("ConvNeXtXLarge", 32, True, True),
    ],
    "densenet": [
        ("DenseNet121", 32, True, False),
        ("DenseNet169", 32, True, True),
        ("DenseNet201", 32, True, True),
    ],
    "efficientnet": [
        ("EfficientNetB0", 32, True, False),
        ("EfficientNetB1", 32, True, True),
        ("EfficientNetB2", 32, True, True),
        ("EfficientNetB3", 32, True, True),
        ("EfficientNetB4", 32, True, True),
        ("EfficientNetB5", 32, True, True),
        ("EfficientNetB6", 32, True, True),
        ("EfficientNetB7", 32, True, True),
    ],
    "efficientnet_v2": [
        ("EfficientNetV2B0", 32, True, False),
        ("EfficientNetV2B1", 32, True, True),
        ("EfficientNetV2B2", 32, True, True),
        ("EfficientNetV2B3", 32, True, True),
        ("EfficientNetV2S", 32, True, True),
        ("EfficientNetV2M", 32, True, True),
        ("EfficientNetV2L", 32, True, True),
    ],
    "inception_resnet_v2": [("InceptionResNetV2", 75, True, False)],
    "inception_v3": [("InceptionV3", 75, True, False)],
    "mobilenet": [("MobileNet", 32, True, False)],
    "mobilenet_v2": [("MobileNetV2", 32, True, False)],
    "mobilenet_v3": [
        ("MobileNetV3Small", 32, True, False),
        ("MobileNetV3Large", 32, True, True),
    ],
    "nasnet": [
        ("NASNetMobile", 32, True, False),
        ("NASNetLarge", 32, True, True),
    ],
    "resnet": [
        ("ResNet50", 32, True, False),
        ("ResNet101", 32, True, True),
        ("ResNet152", 32, True, True),
    ],
    "resnet_v2": [
        ("ResNet50V2", 32, True, False),
        ("ResNet101V2", 32, True, True),
        ("ResNet152V2", 32, True, True),
    ],
    "vgg": [
        ("VGG16", 32, True, False),
        ("VGG19", 32, True, True),
    ],
    "xception": [("Xception", 71, True, False)],
}

APP_BATCH = 2

# The heavy members (``GRADMOM_ZOO=full``), measured on the 2-core machine on 2026-11-25, core
# at 27cf017, float64, batch 2, orders 1-4, one child process at a time (`tests/zoo_worker.py`,
# ``--jobs 1``), load average 4-13 from other jobs: params (millions), variables, groups of
# variables (`zoo_worker._groups`: over 800 MB of parameters each group is its own
# `gradients_and_moments` trace, against a reference streamed one example at a time), seconds
# to trace and run `gradients_and_moments` and for the brute-force reference (summed over the
# groups; wall time, inflated by the load), peak RSS (GB) and the worst relative error over
# orders 1-4 and the gradient (bound 1e-9). Every variable went through a rule. Together about
# 3.5 h of wall time: not in CI. ConvNeXtLarge's reference took 51 min (Keras' grouped conv
# retraces its XLA tf.function on every eager call; the streamed reference is now traced once per
# chunk; ConvNeXtXLarge's still took 35 min). ConvNeXtSmall/Base/XLarge and EfficientNetV2L:
# measured on 2026-11-25 at d4be865 (load 4-12; ConvNeXtXLarge with 13.4 GB resident, alone).
# EfficientNetV2L against the reference from the batch's forward pass (`zoo_worker.forward_spread`: at random initialisation
# its outputs on one example differ from the batch's by 35% in float64, so a reference on each
# example's own slice is another function; it was reported wrong at 3.4e7 against that).
TIMINGS: dict[str, tuple[float, int, int, int, int, int, float, float]] = {
    "app-convnextsmall": (49.5, 344, 1, 34, 78, 128, 5.2, 6.3e-15),
    "app-convnextbase": (87.6, 344, 1, 40, 92, 211, 8.3, 6.4e-15),
    "app-convnextlarge": (196.2, 344, 2, 102, 372, 3053, 9.2, 6.7e-15),
    "app-convnextxlarge": (348.2, 344, 4, 66, 716, 2096, 13.4, 6.7e-15),
    "app-densenet169": (12.5, 508, 1, 152, 107, 7, 2.5, 4.1e-15),
    "app-densenet201": (18.1, 604, 1, 75, 64, 13, 2.6, 3.1e-15),
    "app-efficientnetb1": (6.5, 301, 1, 57, 43, 8, 1.5, 7.2e-16),
    "app-efficientnetb2": (7.7, 301, 1, 29, 18, 5, 1.5, 5.3e-16),
    "app-efficientnetb3": (10.7, 340, 1, 51, 22, 9, 1.8, 6.7e-16),
    "app-efficientnetb4": (17.6, 418, 1, 38, 23, 10, 2.5, 6.8e-16),
    "app-efficientnetb5": (28.3, 506, 1, 53, 38, 15, 3.4, 8.9e-16),
    "app-efficientnetb6": (40.7, 584, 1, 84, 81, 53, 4.5, 2.8e-15),
    "app-efficientnetb7": (63.8, 711, 1, 179, 84, 39, 6.6, 3.6e-15),
    "app-efficientnetv2b1": (6.9, 297, 1, 58, 45, 7, 1.6, 8.9e-15),
    "app-efficientnetv2b2": (8.7, 310, 1, 34, 24, 7, 1.6, 7.8e-15),
    "app-efficientnetv2b3": (12.8, 362, 1, 31, 25, 7, 2.0, 2.6e-14),
    "app-efficientnetv2s": (20.2, 452, 1, 37, 43, 13, 2.7, 2.0e-14),
    "app-efficientnetv2m": (52.9, 649, 1, 156, 108, 42, 5.4, 7.6e-14),
    "app-efficientnetv2l": (117.2, 897, 3, 166, 106, 251, 7.1, 5.3e-14),
    "app-mobilenetv3large": (4.2, 174, 1, 14, 6, 2, 1.2, 1.5e-15),
    "app-nasnetlarge": (84.7, 1018, 1, 204, 184, 64, 7.9, 9.1e-15),
    "app-resnet101": (42.6, 418, 1, 35, 30, 20, 4.4, 5.5e-15),
    "app-resnet152": (58.2, 622, 1, 60, 56, 31, 5.9, 1.0e-14),
    "app-resnet101v2": (42.5, 344, 1, 93, 82, 30, 4.5, 6.9e-15),
    "app-resnet152v2": (58.2, 514, 1, 83, 60, 32, 5.9, 9.7e-15),
    "app-vgg19": (38.9, 38, 1, 7, 12, 6, 4.7, 4.4e-15),
}


def _application(name: str, side: int, top: bool):
    def build(dtype):
        keras.utils.set_random_seed(0)
        ctor = getattr(keras.applications, name)
        with dtype_policy(dtype):
            if top:
                model = ctor(
                    weights=None,
                    input_shape=(side, side, 3),
                    include_top=True,
                    classes=3,
                    classifier_activation=None,
                )
            else:
                model = ctor(
                    weights=None, input_shape=(side, side, 3), include_top=False, pooling="avg"
                )
        rng = np.random.default_rng(0)
        x = rng.normal(size=(APP_BATCH, side, side, 3)).astype(dtype)

        def forward(x):
            return model(x, training=False)

        y = rng.normal(size=(APP_BATCH, *model.output_shape[1:])).astype(dtype)
        return forward, model.trainable_variables, (x, y), squared_error

    return build


def _app_id(name: str) -> str:
    return "app-" + name.lower()


APPLICATION_ENTRIES = [
    Entry(
        _app_id(name),
        f"applications.{family}",
        _application(name, side, top),
        heavy=heavy,
        isolate=True,
        note=f"{name} {side}x{side}, {'include_top classes=3' if top else 'no top, avg pool'}, "
        "training=False",
    )
    for family, members in APPLICATIONS.items()
    for name, side, top, heavy in members
]


# ---------------------------------------------------------------------------------------------
# keras_hub backbones from tiny configs
# ---------------------------------------------------------------------------------------------

SEQ = 5  # tokens per example
VOCAB = 11
HUB_BATCH = 3


def _token_inputs(rng, n, t, vocab, keys):
    """Packed ``[n, t, len(keys)]`` int32 inputs: token ids, segment ids, padding mask.

    Every example has repeated ids; the last example has its last token padded.
    """
    cols = []
    for k in keys:
        if k == "token_ids":
            ids = rng.integers(1, vocab, size=(n, t))
            ids[:, 1] = ids[:, 0]
            cols.append(ids)
        elif k == "segment_ids":
            seg = np.zeros((n, t), np.int64)
            seg[:, t // 2 :] = 1
            cols.append(seg)
        elif k == "padding_mask":
            mask = np.ones((n, t), np.int64)
            mask[-1, -1] = 0
            cols.append(mask)
        else:
            raise ValueError(k)
    return np.stack(cols, axis=-1).astype("int32")


def _unpack(x, keys):
    return {k: x[..., i] for i, k in enumerate(keys)}


def _hub_text(cls_name, keys, lora=0, **config):
    def build(dtype):
        import keras_hub

        keras.utils.set_random_seed(0)
        backbone = getattr(keras_hub.models, cls_name)(dtype=dtype, **config)
        if lora:
            backbone.enable_lora(lora)
            _randomize_lora(backbone, dtype)
        rng = np.random.default_rng(0)
        x = _token_inputs(rng, HUB_BATCH, SEQ, config["vocabulary_size"], keys)

        def forward(x):
            return _flat_outputs(backbone(_unpack(x, keys)))

        return (
            forward,
            backbone.trainable_variables,
            (x, _target_like(forward, x, rng, dtype)),
            (squared_error),
        )

    return build


_LORA_FLOAT32 = "Keras' enable_lora makes float32 adapters whatever the layer's dtype"


def _randomize_lora(model, dtype):
    """LoRA's B starts at zeros (then A's gradient is 0): give every adapter random values."""
    rng = np.random.default_rng(7)
    for v in model.trainable_variables:
        v.assign(0.5 * rng.normal(size=v.shape).astype(dtype))


def _hub_image(cls_name, side, **config):
    def build(dtype):
        import keras_hub

        keras.utils.set_random_seed(0)
        backbone = getattr(keras_hub.models, cls_name)(
            image_shape=(side, side, 3), dtype=dtype, **config
        )
        rng = np.random.default_rng(0)
        x = rng.normal(size=(HUB_BATCH, side, side, 3)).astype(dtype)

        def forward(x):
            return _flat_outputs(backbone(x))

        return (
            forward,
            backbone.trainable_variables,
            (x, _target_like(forward, x, rng, dtype)),
            (squared_error),
        )

    return build


_TEXT = dict(vocabulary_size=VOCAB, num_layers=2, max_sequence_length=8)
_BERTLIKE = dict(_TEXT, num_heads=2, hidden_dim=8, intermediate_dim=16, dropout=0.0)
_DECODER = dict(_TEXT, num_query_heads=2, num_key_value_heads=1, hidden_dim=8, intermediate_dim=12)
_DECODER.pop("max_sequence_length")
_TOK_MASK = ("token_ids", "padding_mask")
_TOK_SEG_MASK = ("token_ids", "segment_ids", "padding_mask")

HUB_ENTRIES = [
    Entry("hub-bert", "keras_hub", _hub_text("BertBackbone", _TOK_SEG_MASK, **_BERTLIKE)),
    Entry("hub-distilbert", "keras_hub", _hub_text("DistilBertBackbone", _TOK_MASK, **_BERTLIKE)),
    Entry(
        "hub-albert",
        "keras_hub",
        _hub_text(
            "AlbertBackbone",
            _TOK_SEG_MASK,
            **dict(_BERTLIKE, embedding_dim=4, num_groups=1, num_inner_repetitions=1),
        ),
        note="one shared transformer layer applied num_layers=2 times",
    ),
    Entry("hub-roberta", "keras_hub", _hub_text("RobertaBackbone", _TOK_MASK, **_BERTLIKE)),
    Entry(
        "hub-debertav3",
        "keras_hub",
        _hub_text("DebertaV3Backbone", _TOK_MASK, **dict(_BERTLIKE, bucket_size=4)),
        float32_inside="keras_hub DeBERTaV3: Softmax(dtype='float32') in "
        "disentangled_self_attention.py",
        note="relative position table through a LayerNorm, the attention projections, tiled "
        "to the batch and gathered by relative positions (a derived region)",
    ),
    Entry("hub-gpt2", "keras_hub", _hub_text("GPT2Backbone", _TOK_MASK, **_BERTLIKE)),
    Entry(
        "hub-llama",
        "keras_hub",
        _hub_text("LlamaBackbone", _TOK_MASK, **_DECODER),
        float32_inside="keras_hub LlamaLayerNorm casts to float32 (llama_layernorm.py); "
        "measured: TF's own gradient off by about 4e-7, as the moments",
    ),
    Entry(
        "hub-mistral",
        "keras_hub",
        _hub_text("MistralBackbone", _TOK_MASK, **dict(_DECODER, sliding_window=4)),
        float32_inside="keras_hub MistralLayerNormalization casts to float32; measured: TF's "
        "own gradient off by about 4e-7, as the moments",
    ),
    Entry(
        "hub-gemma",
        "keras_hub",
        _hub_text("GemmaBackbone", _TOK_MASK, **dict(_DECODER, head_dim=4)),
        float32_inside="keras_hub Gemma: Softmax(dtype='float32') in gemma_attention.py and "
        "RMSNormalization casts to float32 (rms_normalization.py); measured: TF's own gradient "
        "off by 3.9e-7, tb_gradmom's moments by <= 1.9e-6 (17bccd5)",
    ),
    Entry(
        "hub-vit",
        "keras_hub",
        _hub_image(
            "ViTBackbone", 8, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16
        ),
    ),
    Entry(
        "hub-swin",
        "keras_hub",
        _hub_image(
            "SwinTransformerBackbone",
            8,
            embed_dim=8,
            depths=[1, 1],
            num_heads=[2, 2],
            window_size=2,
            patch_size=2,
            drop_path=0.0,
        ),
    ),
    Entry(
        "hub-gpt2-lora",
        "lora",
        _hub_text("GPT2Backbone", _TOK_MASK, lora=2, **_BERTLIKE),
        float32_inside=_LORA_FLOAT32,
        note="backbone.enable_lora(2): the trainable variables are the adapters only",
    ),
]


# ---------------------------------------------------------------------------------------------
# keras.io "Text classification with Transformer"
# ---------------------------------------------------------------------------------------------


class TransformerBlock(keras.layers.Layer):
    """As on keras.io (examples/nlp/text_classification_with_transformer)."""

    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.att = keras.layers.MultiHeadAttention(
            num_heads=num_heads, key_dim=embed_dim, dtype=self.dtype_policy
        )
        self.ffn = keras.Sequential(
            [
                keras.layers.Dense(ff_dim, activation="relu", dtype=self.dtype_policy),
                keras.layers.Dense(embed_dim, dtype=self.dtype_policy),
            ]
        )
        self.layernorm1 = keras.layers.LayerNormalization(epsilon=1e-6, dtype=self.dtype_policy)
        self.layernorm2 = keras.layers.LayerNormalization(epsilon=1e-6, dtype=self.dtype_policy)
        self.dropout1 = keras.layers.Dropout(rate)
        self.dropout2 = keras.layers.Dropout(rate)

    def call(self, inputs, training=None):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output, training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output, training=training)
        return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(keras.layers.Layer):
    """As on keras.io: token embedding plus ``pos_emb(ops.arange(maxlen))`` (no example axis)."""

    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.token_emb = keras.layers.Embedding(
            input_dim=vocab_size, output_dim=embed_dim, dtype=self.dtype_policy
        )
        self.pos_emb = keras.layers.Embedding(
            input_dim=maxlen, output_dim=embed_dim, dtype=self.dtype_policy
        )

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions


def _text_classifier(batch, maxlen, vocab=9, embed_dim=4, num_heads=2, ff_dim=6):
    def build(dtype):
        keras.utils.set_random_seed(0)
        with dtype_policy(dtype):
            inputs = keras.layers.Input(shape=(maxlen,))
            x = TokenAndPositionEmbedding(maxlen, vocab, embed_dim)(inputs)
            x = TransformerBlock(embed_dim, num_heads, ff_dim)(x)
            x = keras.layers.GlobalAveragePooling1D()(x)
            x = keras.layers.Dropout(0.1)(x)
            x = keras.layers.Dense(5, activation="relu")(x)
            x = keras.layers.Dropout(0.1)(x)
            outputs = keras.layers.Dense(2, activation="softmax")(x)
            model = keras.Model(inputs=inputs, outputs=outputs)
        rng = np.random.default_rng(1)
        ids = rng.integers(0, vocab, size=(batch, maxlen))
        ids[:, 1] = ids[:, 0]
        x = ids.astype(dtype)  # the example feeds float ids (Input's default dtype)
        y = rng.integers(0, 2, size=(batch,))

        def forward(x):
            return model(x, training=False)

        return forward, model.trainable_variables, (x, y), sparse_ce_probs

    return build


KERAS_IO_ENTRIES = [
    Entry(
        "kerasio-text-transformer-batch-eq-seq",
        "keras.io",
        _text_classifier(batch=4, maxlen=4),
        note="batch 4 == maxlen 4; training=False (dropout off)",
    ),
    Entry(
        "kerasio-text-transformer-batch-ne-seq",
        "keras.io",
        _text_classifier(batch=3, maxlen=5),
        note="batch 3, maxlen 5; training=False (dropout off)",
    ),
]


# ---------------------------------------------------------------------------------------------
# Layers: LoRA, ReversibleEmbedding, PReLU, grouped convolutions, sparse lookups, RNNs
# ---------------------------------------------------------------------------------------------


def _sequential(layers_fn, input_shape, x_fn, loss=squared_error, y_fn=None, training=False):
    """``layers_fn(dtype) -> [layers]`` in a Sequential; ``x_fn(rng, dtype) -> x``."""

    def build(dtype):
        keras.utils.set_random_seed(0)
        with dtype_policy(dtype):
            model = keras.Sequential([keras.Input(input_shape)] + layers_fn(dtype))
        rng = np.random.default_rng(0)
        x = x_fn(rng, dtype)

        def forward(x):
            return model(x, training=training)

        y = y_fn(rng, x) if y_fn else _target_like(forward, x, rng, dtype)
        return forward, model.trainable_variables, (x, y), loss

    return build


def _normal(*shape):
    return lambda rng, dtype: rng.normal(size=shape).astype(dtype)


def _labels(classes):
    return lambda rng, x: rng.integers(0, classes, size=(x.shape[0],))


def _dense_lora(dtype):
    dense = keras.layers.Dense(6, activation="tanh")
    dense.build((None, 5))
    dense.enable_lora(2, b_initializer="random_normal")
    return [dense, keras.layers.Dense(3)]


def _einsum_lora(dtype):
    ed = keras.layers.EinsumDense("abc,cd->abd", output_shape=(None, 6), bias_axes="d")
    ed.build((None, 4, 5))
    ed.enable_lora(2, b_initializer="random_normal")
    return [ed, keras.layers.Activation("tanh"), keras.layers.Dense(2)]


class TiedReversible(keras.Model):
    """keras_hub's ReversibleEmbedding: ids -> vectors, and vectors -> logits (``reverse=True``)
    with the same table."""

    def __init__(self, vocab, dim, **kwargs):
        super().__init__(**kwargs)
        import keras_hub

        self.emb = keras_hub.layers.ReversibleEmbedding(vocab, dim, tie_weights=True)
        self.mix = keras.layers.Dense(dim, activation="tanh")

    def call(self, ids):
        return self.emb(self.mix(self.emb(ids)), reverse=True)


def _reversible(dtype):
    keras.utils.set_random_seed(0)
    vocab, t, n = 7, 4, 3
    with dtype_policy(dtype):
        model = TiedReversible(vocab, 5)
        model(np.zeros((1, t), "int32"))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, size=(n, t)).astype("int32")
    ids[:, 1] = ids[:, 0]
    y = rng.integers(0, vocab, size=(n, t))
    return model, model.trainable_variables, (ids, y), sparse_ce_sum_tokens


def _regularized(dtype):
    """Keras regularisers (L2 and L1 kernels, an L2 bias) on a conv net, its loss Keras' total
    ``ops.sum([mean loss, *model.losses])``: each example's loss is ``l_j + R``."""
    keras.utils.set_random_seed(0)
    reg = keras.regularizers
    with dtype_policy(dtype):
        inp = keras.Input((5, 5, 2))
        h = keras.layers.Conv2D(3, 3, activation="tanh", kernel_regularizer=reg.L2(0.05))(inp)
        h = keras.layers.Flatten()(h)
        h = keras.layers.Dense(
            4, activation="tanh", kernel_regularizer=reg.L1(0.01), bias_regularizer=reg.L2(0.1)
        )(h)
        model = keras.Model(inp, keras.layers.Dense(2)(h))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 5, 5, 2)).astype(dtype)
    y = rng.normal(size=(4, 2)).astype(dtype)

    def penalty():
        return ops.sum(ops.stack(model.losses))

    def scalar(out, y):
        return ops.sum(ops.stack([ops.mean(squared_error(out, y)), *model.losses]))

    def per_example(out, y):
        return squared_error(out, y) + penalty()

    return model, model.trainable_variables, (x, y), ScalarLoss(scalar, per_example)


def _convnext_block(dtype):
    """ConvNeXt's block: depthwise 3x3 as ``Conv2D(groups=channels)``, LayerNorm, MLP, residual
    with layer scale (a broadcast multiply by a variable)."""
    keras.utils.set_random_seed(0)
    c = 4
    with dtype_policy(dtype):
        inp = keras.Input((5, 5, c))
        h = keras.layers.Conv2D(c, 3, padding="same", groups=c)(inp)
        h = keras.layers.LayerNormalization(epsilon=1e-6)(h)
        h = keras.layers.Dense(4 * c, activation="gelu")(h)
        h = keras.layers.Dense(c)(h)
        scale = LayerScale(c)
        h = keras.layers.Add()([inp, scale(h)])
        out = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(h))
        model = keras.Model(inp, out)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5, 5, c)).astype(dtype)
    y = rng.normal(size=(3, 2)).astype(dtype)
    return model, model.trainable_variables, (x, y), squared_error


class LayerScale(keras.layers.Layer):
    def __init__(self, dim, **kwargs):
        super().__init__(**kwargs)
        self.gamma = self.add_weight(shape=(dim,), initializer="random_normal", name="gamma")

    def call(self, x):
        return x * self.gamma


_SPARSE_NOTE = (
    "the examples' axis is lost at the SparseTensor's Where (row indices are values, not an "
    "axis): every variable past it takes the exact fallback, with its warning"
)


class SparseLookup(tf.Module):
    """``tf.nn.embedding_lookup_sparse`` on a variable: ids padded with -1 per example, the
    non-negative ones make the SparseTensor (row = example), optionally weighted."""

    def __init__(self, dtype, combiner, weighted):
        super().__init__()
        rng = np.random.default_rng(3)
        self.table = tf.Variable(rng.normal(size=(9, 3)).astype(dtype), name="table")
        self.w = tf.Variable(rng.normal(size=(3, 2)).astype(dtype), name="w")
        self.combiner = combiner
        self.weighted = weighted

    def __call__(self, x):
        ids = tf.cast(x[..., 0], tf.int64)
        where = tf.where(ids >= 0)
        sp_ids = tf.SparseTensor(where, tf.gather_nd(ids, where), tf.shape(ids, tf.int64))
        sp_w = None
        if self.weighted:
            sp_w = tf.SparseTensor(where, tf.gather_nd(x[..., 1], where), tf.shape(ids, tf.int64))
        rows = tf.nn.embedding_lookup_sparse(self.table, sp_ids, sp_w, combiner=self.combiner)
        return tf.matmul(tf.tanh(rows), self.w)


def _sparse_lookup(combiner, weighted):
    def build(dtype):
        m = SparseLookup(dtype, combiner, weighted)
        rng = np.random.default_rng(0)
        n, k = 4, 4
        ids = rng.integers(0, 9, size=(n, k))
        ids[:, 1] = ids[:, 0]  # a repeated id in every example
        ids[1, 2:] = -1  # ragged: fewer ids in some examples
        ids[3, 3] = -1
        weights = rng.uniform(0.5, 2.0, size=(n, k))
        x = np.stack([ids, weights], axis=-1).astype(dtype)
        y = rng.normal(size=(n, 2)).astype(dtype)
        return m, [m.table, m.w], (x, y), squared_error

    return build


def _rnn(cls_name, **kw):
    return lambda dtype: [getattr(keras.layers, cls_name)(4, **kw), keras.layers.Dense(3)]


def _image_normal(n, *shape):
    return _normal(n, *shape)


LAYER_ENTRIES = [
    Entry(
        "lora-dense",
        "lora",
        _sequential(_dense_lora, (5,), _normal(4, 5)),
        float32_inside=_LORA_FLOAT32,
        note="Dense(6).enable_lora(2, b_initializer=random_normal): kernel frozen",
    ),
    Entry(
        "lora-dense-float32-adapters",
        "lora",
        _sequential(_dense_lora, (5,), _normal(4, 5)),
        note="as lora-dense with Keras' own float32 adapters in a float64 layer: float32 "
        "moments, judged at 2e-5",
    ),
    Entry(
        "lora-einsumdense-sequence",
        "lora",
        _sequential(_einsum_lora, (4, 5), _normal(3, 4, 5)),
        float32_inside=_LORA_FLOAT32,
        note="EinsumDense('abc,cd->abd').enable_lora(2): kernel frozen",
    ),
    Entry("reversible-embedding-tied", "layers", _reversible),
    Entry(
        "kernel-regularized-keras-total",
        "layers",
        _regularized,
        note="Conv2D and Dense with kernel and bias regularisers; the loss is Keras' total "
        "ops.sum([loss, *model.losses]), each example's loss l_j + R",
    ),
    Entry(
        "prelu-dense",
        "layers",
        _sequential(
            lambda dtype: [
                keras.layers.Dense(5),
                keras.layers.PReLU(alpha_initializer=keras.initializers.RandomUniform(0.1, 0.5)),
                keras.layers.Dense(2),
            ],
            (4,),
            _normal(4, 4),
        ),
    ),
    Entry(
        "prelu-conv-shared-axes",
        "layers",
        _sequential(
            lambda dtype: [
                keras.layers.Conv2D(3, 2),
                keras.layers.PReLU(
                    alpha_initializer=keras.initializers.RandomUniform(0.1, 0.5),
                    shared_axes=[1, 2],
                ),
                keras.layers.Flatten(),
                keras.layers.Dense(2),
            ],
            (4, 4, 2),
            _normal(3, 4, 4, 2),
        ),
    ),
    Entry(
        "grouped-conv1d",
        "layers",
        _sequential(
            lambda dtype: [keras.layers.Conv1D(4, 3, groups=2), keras.layers.Flatten()],
            (7, 4),
            _normal(3, 7, 4),
        ),
    ),
    Entry(
        "grouped-conv2d",
        "layers",
        _sequential(
            lambda dtype: [
                keras.layers.Conv2D(6, 3, groups=2, padding="same", strides=2),
                keras.layers.Flatten(),
                keras.layers.Dense(2),
            ],
            (5, 6, 4),
            _normal(3, 5, 6, 4),
        ),
    ),
    Entry(
        "grouped-conv3d",
        "layers",
        _sequential(
            lambda dtype: [keras.layers.Conv3D(4, 2, groups=2)],
            (3, 4, 3, 4),
            _normal(2, 3, 4, 3, 4),
        ),
    ),
    Entry("convnext-block-depthwise-groups", "layers", _convnext_block),
    Entry(
        "embedding-lookup-sparse-mean",
        "tf.nn",
        _sparse_lookup("mean", False),
        fallback="exact",
        on_fallback=2,
        note=_SPARSE_NOTE,
    ),
    Entry(
        "embedding-lookup-sparse-sum-weighted",
        "tf.nn",
        _sparse_lookup("sum", True),
        fallback="exact",
        on_fallback=2,
        note=_SPARSE_NOTE,
    ),
    Entry(
        "lstm-classifier",
        "recurrent",
        _sequential(_rnn("LSTM"), (5, 3), _normal(4, 5, 3), sparse_ce_logits, _labels(3)),
    ),
    Entry(
        "gru-classifier",
        "recurrent",
        _sequential(_rnn("GRU"), (5, 3), _normal(4, 5, 3), sparse_ce_logits, _labels(3)),
    ),
    Entry(
        "simplernn-classifier",
        "recurrent",
        _sequential(_rnn("SimpleRNN"), (5, 3), _normal(4, 5, 3), sparse_ce_logits, _labels(3)),
    ),
    # convolutions inside the loop (issue 26: every kernel on the fallback before, trace + first
    # call 22 s against 3 s for a ConvLSTM2D classifier)
    Entry(
        "convlstm2d-classifier",
        "recurrent",
        _sequential(
            lambda dtype: [
                keras.layers.ConvLSTM2D(3, 3, padding="same", return_sequences=True),
                keras.layers.ConvLSTM2D(2, 2, strides=2),
                keras.layers.Flatten(),
                keras.layers.Dense(3),
            ],
            (3, 6, 6, 2),
            _normal(4, 3, 6, 6, 2),
            sparse_ce_logits,
            _labels(3),
        ),
        note="two ConvLSTM2D layers (same padding with sequences, then strided), every kernel "
        "on the loop rule",
    ),
    Entry(
        "convlstm1d-classifier",
        "recurrent",
        _sequential(
            lambda dtype: [
                keras.layers.ConvLSTM1D(3, 3),
                keras.layers.Flatten(),
                keras.layers.Dense(3),
            ],
            (4, 7, 2),
            _normal(4, 4, 7, 2),
            sparse_ce_logits,
            _labels(3),
        ),
        note="ConvLSTM1D (ExpandDims -> Conv2D inside the loop), every kernel on the loop rule",
    ),
]


# ---------------------------------------------------------------------------------------------
# Issue 26: shifted windows, a mixture of experts' aux loss, contrastive losses, a GAN step
# ---------------------------------------------------------------------------------------------


def _mixtral_aux(dtype):
    """keras_hub Mixtral in training mode: every MoE layer adds ``router_aux_loss_coef *
    load_balancing_loss`` with `add_loss`, and the step trains ``loss + tf.add_n(model.losses)``.
    The load-balancing loss is ``sum_e f_e P_e`` over batch means: not a sum of per-example
    terms (the core must refuse it, naming the term). Built in float32 whatever ``dtype``:
    keras_hub's load-balancing loss multiplies a float32 one-hot by the mask cast to the
    compute dtype, which fails in float64 (and `float64_inside` makes it fail the other way);
    the core refuses the loss at trace time, before any number."""
    import keras_hub

    dtype = "float32"

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.MixtralBackbone(
        vocabulary_size=VOCAB,
        num_layers=1,
        num_query_heads=2,
        hidden_dim=8,
        intermediate_dim=12,
        num_key_value_heads=1,
        num_experts=3,
        top_k=2,
        sliding_window=4,
        dtype=dtype,
    )
    rng = np.random.default_rng(0)
    x = _token_inputs(rng, HUB_BATCH, SEQ, VOCAB, _TOK_MASK)

    def forward(x):
        return backbone(_unpack(x, _TOK_MASK), training=True)

    y = rng.normal(size=(HUB_BATCH, SEQ, 8)).astype(dtype)

    def scalar(out, y):
        return tf.reduce_mean(squared_error(out, y)) + tf.add_n(backbone.losses)

    def per_example(out, y):  # nominal: the core refuses the loss
        return squared_error(out, y)

    return forward, backbone.trainable_variables, (x, y), ScalarLoss(scalar, per_example)


_IMAGE_SIDE, _TEXT_LEN = 8, 5


def _contrastive(kind):
    """keras_hub CLIP or SigLIP from tiny encoders and its own loss over the ``[n, n]`` logits
    (CLIP: cross-entropy of each row and each column against the diagonal; SigLIP: the
    pairwise sigmoid loss, labels ``2 I - 1``). Each logit holds an image and a text of two
    examples: the loss mixes them and the core must refuse it. The images and token ids are
    packed on the last axis of ``x`` (``[n, side * side * 3 + T]``)."""

    def build(dtype):
        import keras_hub

        keras.utils.set_random_seed(0)
        m = keras_hub.models
        small = dict(num_layers=1, num_heads=2, intermediate_dim=16, dtype=dtype)
        text = dict(small, vocabulary_size=VOCAB, embedding_dim=8, hidden_dim=8)
        image = dict(small, patch_size=4, hidden_dim=8, image_shape=(_IMAGE_SIDE,) * 2 + (3,))
        if kind == "clip":
            backbone = m.CLIPBackbone(
                m.CLIPVisionEncoder(**image),
                m.CLIPTextEncoder(**text, max_sequence_length=_TEXT_LEN),
                projection_dim=4,
                dtype=dtype,
            )
        else:
            backbone = m.SigLIPBackbone(
                m.SigLIPVisionEncoder(**image),
                m.SigLIPTextEncoder(**text, max_sequence_length=_TEXT_LEN),
                dtype=dtype,
            )
        rng = np.random.default_rng(0)
        n, pixels = HUB_BATCH, _IMAGE_SIDE * _IMAGE_SIDE * 3
        images = rng.normal(size=(n, pixels))
        ids = rng.integers(1, VOCAB, size=(n, _TEXT_LEN))
        x = np.concatenate([images, ids], axis=1).astype(dtype)

        def forward(x):
            images = tf.reshape(x[:, :pixels], [-1, _IMAGE_SIDE, _IMAGE_SIDE, 3])
            ids = tf.cast(x[:, pixels:], tf.int32)
            return backbone({"images": images, "token_ids": ids})["vision_logits"]

        def per_example(logits, y):
            labels = tf.range(tf.shape(logits)[0])
            if kind == "clip":
                rows = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
                cols = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, tf.transpose(logits))
                return 0.5 * (rows + cols)
            signs = 2.0 * tf.eye(tf.shape(logits)[0], dtype=logits.dtype) - 1.0
            return -tf.reduce_sum(tf.math.log_sigmoid(signs * logits), axis=1)

        return forward, backbone.trainable_variables, (x, np.zeros((n, 1), dtype)), per_example

    return build


_LATENT, _GAN_SIDE = 3, 4


def _gan_models(dtype):
    """A small DCGAN: the generator maps latents ``[n, 3]`` to ``[n, 4, 4, 1]`` images (Dense,
    a transposed convolution), the discriminator scores images (a strided convolution, a
    Dense)."""
    keras.utils.set_random_seed(0)
    L = keras.layers
    with dtype_policy(dtype):
        generator = keras.Sequential(
            [
                keras.Input((_LATENT,)),
                L.Dense(8, activation="tanh"),
                L.Reshape((2, 2, 2)),
                L.Conv2DTranspose(1, 2, strides=2, activation="tanh"),
            ]
        )
        discriminator = keras.Sequential(
            [
                keras.Input((_GAN_SIDE, _GAN_SIDE, 1)),
                L.Conv2D(2, 2, strides=2, activation="tanh"),
                L.Flatten(),
                L.Dense(1),
            ]
        )
    return generator, discriminator


def _sigmoid_ce(logits, labels):
    """Binary cross-entropy of logits ``[rows, 1]``: ``[rows]``."""
    ce = tf.nn.sigmoid_cross_entropy_with_logits(tf.cast(labels, logits.dtype), logits)
    return tf.reduce_sum(ce, axis=1)


def _fake_ce(logits, y):
    """The generator's loss as GANs write it: ``bce(ones_like(logits), logits)``, labels made in
    the step (``y`` unused): ``[rows]``."""
    return _sigmoid_ce(logits, tf.ones_like(logits))


def _real_fake_ce(logits, y):
    """The discriminator's loss on ``concat([real, fake])``: ``bce(1, .)`` on the first half of
    the rows, ``bce(0, .)`` on the second, labels made in the step (``y`` unused): ``[2 n]``."""
    half = tf.shape(logits)[0] // 2
    labels = tf.concat([tf.ones([half, 1], logits.dtype), tf.zeros([half, 1], logits.dtype)], 0)
    return _sigmoid_ce(logits, labels)


def _latents_like(x):
    """Latents drawn in the step, one row per example of ``x`` (stateless: the reference draws
    the same ones)."""
    return tf.random.stateless_normal([tf.shape(x)[0], _LATENT], seed=[26, 1], dtype=x.dtype)


def _gan(step):
    """A GAN's steps (`_gan_models`), with the non-saturating losses.

    - ``generator``: the step's input is the latents: ``bce(1, D(G(z)))``, the generator's
      variables (through the discriminator);
    - ``generator-latents-in-step``: the step's input is the real batch, used for its size only;
      the latents are drawn in the step (``[tf.shape(x)[0], 3]``) and the labels made there
      (``ones_like``): each row is an example. (With the labels a step input, the examples come
      from them, and the generator's variables are exact already: the whole generator is a
      parameter derived from them, pulled back per example where it meets the labels.)
    - ``discriminator``: ``bce(labels, D(concat([real, G(z)])))`` with ``z`` drawn in the step,
      the discriminator's variables: the examples are the union of the two batches, ``2 n``
      rows, each one example.
    """

    def build(dtype):
        generator, discriminator = _gan_models(dtype)
        rng = np.random.default_rng(0)
        n = 4
        real = rng.normal(size=(n, _GAN_SIDE, _GAN_SIDE, 1)).astype(dtype)
        if step == "generator":
            x = rng.normal(size=(n, _LATENT)).astype(dtype)

            def forward(z):
                return discriminator(generator(z))

            return forward, generator.trainable_variables, (x, np.ones((n, 1), dtype)), _sigmoid_ce
        if step == "generator-latents-in-step":

            def forward(x):
                return discriminator(generator(_latents_like(x)))

            return forward, generator.trainable_variables, (real, np.ones((n, 1), dtype)), _fake_ce

        def forward(x):
            fake = generator(_latents_like(x))
            return discriminator(tf.concat([x, fake], axis=0))

        return (
            forward,
            discriminator.trainable_variables,
            (real, np.zeros((n, 1), dtype)),
            _real_fake_ce,
        )

    return build


_SWIN_SHIFTED = dict(
    embed_dim=8, depths=[2, 1], num_heads=[2, 2], window_size=2, patch_size=2, drop_path=0.0
)

ISSUE26_ENTRIES = [
    Entry(
        "hub-swin-shifted",
        "keras_hub",
        _hub_image("SwinTransformerBackbone", 8, **_SWIN_SHIFTED),
        fallback="exact",
        # Exact by rules: the shifted block's Roll moves elements inside each example (axes'
        # Roll proof); on the fallback before it (48 of 48 variables).
        on_fallback=0,
        note="SwinTransformerBackbone depths=[2, 1], window 2: the second block of stage 0 is "
        "shifted (tf.roll and attention masks)",
    ),
    Entry(
        "hub-mixtral-aux-loss",
        "keras_hub",
        _mixtral_aux,
        raises=("PerExampleLossError", "added to the loss, goes through values that mix"),
        note="MixtralBackbone(training=True), loss + tf.add_n(model.losses): the router's "
        "load-balancing loss is a batch statistic, refused by name",
    ),
    Entry(
        "hub-clip-contrastive",
        "keras_hub",
        _contrastive("clip"),
        raises=("PerExampleLossError", "mix the examples"),
        note="CLIPBackbone and CLIP's loss over the [n, n] logits: refused",
    ),
    Entry(
        "hub-siglip-contrastive",
        "keras_hub",
        _contrastive("siglip"),
        raises=("PerExampleLossError", "mix the examples"),
        note="SigLIPBackbone and the pairwise sigmoid loss over the [n, n] logits: refused",
    ),
    Entry(
        "gan-generator-step",
        "gan",
        _gan("generator"),
        note="bce(1, D(G(z))), z the step's input; the generator's variables",
    ),
    Entry(
        "gan-generator-step-latents-in-step",
        "gan",
        _gan("generator-latents-in-step"),
        reference="rows",
        note="as gan-generator-step with z = stateless_normal([tf.shape(x)[0], 3]) and the "
        "labels ones_like(logits) made in the step: each row of z is an example (before: "
        "refused, the loss depended on no example)",
    ),
    Entry(
        "gan-discriminator-step-concat",
        "gan",
        _gan("discriminator"),
        reference="rows",
        note="bce(labels, D(concat([real, G(z)]))), z drawn in the step, labels made there; the "
        "discriminator's variables on their rules; 2n examples (the union of the two batches; "
        "before: every variable on the fallback, the concatenation not proven)",
    ),
]


ENTRIES: list[Entry] = (
    APPLICATION_ENTRIES + HUB_ENTRIES + KERAS_IO_ENTRIES + LAYER_ENTRIES + ISSUE26_ENTRIES
)
ENTRIES_BY_ID = {e.id: e for e in ENTRIES}
assert len(ENTRIES_BY_ID) == len(ENTRIES), "duplicate zoo ids"


def zoo_mode() -> str:
    mode = os.environ.get("GRADMOM_ZOO", "default").strip().lower() or "default"
    if mode not in ("default", "full"):
        raise ValueError(f"GRADMOM_ZOO must be 'default' or 'full', got {mode!r}")
    return mode


def selected(mode: str | None = None) -> list[Entry]:
    """The entries of a run: every non-heavy entry, plus the heavy ones with ``full``."""
    mode = mode or zoo_mode()
    return [e for e in ENTRIES if mode == "full" or not e.heavy]
