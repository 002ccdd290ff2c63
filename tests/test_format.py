"""Format version 2 (docs/format.md): moment maps a screen can use by default, full resolution
on request, exact statistics every time, and version-1 logs still read by every reader.

References are independent of the encoder: numpy's float32 cast of the moments written, the
float64 variance ``M_2 - M_1**2`` of those, block means by slicing, and per-example gradients
one example at a time. The error bound of the float16 maps is the documented one: half a
float16 ulp (``2**-11`` relative) down to ``2**-29`` of a row's largest value, and subnormal
spacing below.
"""

from __future__ import annotations

import json
import math
import os
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.proto import summary_pb2
from tensorboard.util import tensor_util

import tb_gradmom as gradmom
from tb_gradmom import data, metadata
from tb_gradmom.analysis import reductions, stats
from tests import reference
from tests.test_plugin import get_json, make_app, nums

# The trainable variables of keras.applications.ResNet50(weights=None), in order (214: 53
# conv kernels and biases, 53 batch-norm gammas and betas, the classifier), with their Keras
# paths, as printed once by
#   python -c "import keras; print([(v.path, tuple(v.shape)) for v in
#              keras.applications.ResNet50(weights=None).trainable_variables])"
# Kept as data: building the model here costs 10 s and says nothing more.
# fmt: off
RESNET50_VARIABLES = [
    ("conv1_conv/kernel", (7, 7, 3, 64)), ("conv1_conv/bias", (64,)), ("conv1_bn/gamma", (64,)),
    ("conv1_bn/beta", (64,)), ("conv2_block1_1_conv/kernel", (1, 1, 64, 64)),
    ("conv2_block1_1_conv/bias", (64,)), ("conv2_block1_1_bn/gamma", (64,)),
    ("conv2_block1_1_bn/beta", (64,)), ("conv2_block1_2_conv/kernel", (3, 3, 64, 64)),
    ("conv2_block1_2_conv/bias", (64,)), ("conv2_block1_2_bn/gamma", (64,)),
    ("conv2_block1_2_bn/beta", (64,)), ("conv2_block1_0_conv/kernel", (1, 1, 64, 256)),
    ("conv2_block1_0_conv/bias", (256,)), ("conv2_block1_3_conv/kernel", (1, 1, 64, 256)),
    ("conv2_block1_3_conv/bias", (256,)), ("conv2_block1_0_bn/gamma", (256,)),
    ("conv2_block1_0_bn/beta", (256,)), ("conv2_block1_3_bn/gamma", (256,)),
    ("conv2_block1_3_bn/beta", (256,)), ("conv2_block2_1_conv/kernel", (1, 1, 256, 64)),
    ("conv2_block2_1_conv/bias", (64,)), ("conv2_block2_1_bn/gamma", (64,)),
    ("conv2_block2_1_bn/beta", (64,)), ("conv2_block2_2_conv/kernel", (3, 3, 64, 64)),
    ("conv2_block2_2_conv/bias", (64,)), ("conv2_block2_2_bn/gamma", (64,)),
    ("conv2_block2_2_bn/beta", (64,)), ("conv2_block2_3_conv/kernel", (1, 1, 64, 256)),
    ("conv2_block2_3_conv/bias", (256,)), ("conv2_block2_3_bn/gamma", (256,)),
    ("conv2_block2_3_bn/beta", (256,)), ("conv2_block3_1_conv/kernel", (1, 1, 256, 64)),
    ("conv2_block3_1_conv/bias", (64,)), ("conv2_block3_1_bn/gamma", (64,)),
    ("conv2_block3_1_bn/beta", (64,)), ("conv2_block3_2_conv/kernel", (3, 3, 64, 64)),
    ("conv2_block3_2_conv/bias", (64,)), ("conv2_block3_2_bn/gamma", (64,)),
    ("conv2_block3_2_bn/beta", (64,)), ("conv2_block3_3_conv/kernel", (1, 1, 64, 256)),
    ("conv2_block3_3_conv/bias", (256,)), ("conv2_block3_3_bn/gamma", (256,)),
    ("conv2_block3_3_bn/beta", (256,)), ("conv3_block1_1_conv/kernel", (1, 1, 256, 128)),
    ("conv3_block1_1_conv/bias", (128,)), ("conv3_block1_1_bn/gamma", (128,)),
    ("conv3_block1_1_bn/beta", (128,)), ("conv3_block1_2_conv/kernel", (3, 3, 128, 128)),
    ("conv3_block1_2_conv/bias", (128,)), ("conv3_block1_2_bn/gamma", (128,)),
    ("conv3_block1_2_bn/beta", (128,)), ("conv3_block1_0_conv/kernel", (1, 1, 256, 512)),
    ("conv3_block1_0_conv/bias", (512,)), ("conv3_block1_3_conv/kernel", (1, 1, 128, 512)),
    ("conv3_block1_3_conv/bias", (512,)), ("conv3_block1_0_bn/gamma", (512,)),
    ("conv3_block1_0_bn/beta", (512,)), ("conv3_block1_3_bn/gamma", (512,)),
    ("conv3_block1_3_bn/beta", (512,)), ("conv3_block2_1_conv/kernel", (1, 1, 512, 128)),
    ("conv3_block2_1_conv/bias", (128,)), ("conv3_block2_1_bn/gamma", (128,)),
    ("conv3_block2_1_bn/beta", (128,)), ("conv3_block2_2_conv/kernel", (3, 3, 128, 128)),
    ("conv3_block2_2_conv/bias", (128,)), ("conv3_block2_2_bn/gamma", (128,)),
    ("conv3_block2_2_bn/beta", (128,)), ("conv3_block2_3_conv/kernel", (1, 1, 128, 512)),
    ("conv3_block2_3_conv/bias", (512,)), ("conv3_block2_3_bn/gamma", (512,)),
    ("conv3_block2_3_bn/beta", (512,)), ("conv3_block3_1_conv/kernel", (1, 1, 512, 128)),
    ("conv3_block3_1_conv/bias", (128,)), ("conv3_block3_1_bn/gamma", (128,)),
    ("conv3_block3_1_bn/beta", (128,)), ("conv3_block3_2_conv/kernel", (3, 3, 128, 128)),
    ("conv3_block3_2_conv/bias", (128,)), ("conv3_block3_2_bn/gamma", (128,)),
    ("conv3_block3_2_bn/beta", (128,)), ("conv3_block3_3_conv/kernel", (1, 1, 128, 512)),
    ("conv3_block3_3_conv/bias", (512,)), ("conv3_block3_3_bn/gamma", (512,)),
    ("conv3_block3_3_bn/beta", (512,)), ("conv3_block4_1_conv/kernel", (1, 1, 512, 128)),
    ("conv3_block4_1_conv/bias", (128,)), ("conv3_block4_1_bn/gamma", (128,)),
    ("conv3_block4_1_bn/beta", (128,)), ("conv3_block4_2_conv/kernel", (3, 3, 128, 128)),
    ("conv3_block4_2_conv/bias", (128,)), ("conv3_block4_2_bn/gamma", (128,)),
    ("conv3_block4_2_bn/beta", (128,)), ("conv3_block4_3_conv/kernel", (1, 1, 128, 512)),
    ("conv3_block4_3_conv/bias", (512,)), ("conv3_block4_3_bn/gamma", (512,)),
    ("conv3_block4_3_bn/beta", (512,)), ("conv4_block1_1_conv/kernel", (1, 1, 512, 256)),
    ("conv4_block1_1_conv/bias", (256,)), ("conv4_block1_1_bn/gamma", (256,)),
    ("conv4_block1_1_bn/beta", (256,)), ("conv4_block1_2_conv/kernel", (3, 3, 256, 256)),
    ("conv4_block1_2_conv/bias", (256,)), ("conv4_block1_2_bn/gamma", (256,)),
    ("conv4_block1_2_bn/beta", (256,)), ("conv4_block1_0_conv/kernel", (1, 1, 512, 1024)),
    ("conv4_block1_0_conv/bias", (1024,)), ("conv4_block1_3_conv/kernel", (1, 1, 256, 1024)),
    ("conv4_block1_3_conv/bias", (1024,)), ("conv4_block1_0_bn/gamma", (1024,)),
    ("conv4_block1_0_bn/beta", (1024,)), ("conv4_block1_3_bn/gamma", (1024,)),
    ("conv4_block1_3_bn/beta", (1024,)), ("conv4_block2_1_conv/kernel", (1, 1, 1024, 256)),
    ("conv4_block2_1_conv/bias", (256,)), ("conv4_block2_1_bn/gamma", (256,)),
    ("conv4_block2_1_bn/beta", (256,)), ("conv4_block2_2_conv/kernel", (3, 3, 256, 256)),
    ("conv4_block2_2_conv/bias", (256,)), ("conv4_block2_2_bn/gamma", (256,)),
    ("conv4_block2_2_bn/beta", (256,)), ("conv4_block2_3_conv/kernel", (1, 1, 256, 1024)),
    ("conv4_block2_3_conv/bias", (1024,)), ("conv4_block2_3_bn/gamma", (1024,)),
    ("conv4_block2_3_bn/beta", (1024,)), ("conv4_block3_1_conv/kernel", (1, 1, 1024, 256)),
    ("conv4_block3_1_conv/bias", (256,)), ("conv4_block3_1_bn/gamma", (256,)),
    ("conv4_block3_1_bn/beta", (256,)), ("conv4_block3_2_conv/kernel", (3, 3, 256, 256)),
    ("conv4_block3_2_conv/bias", (256,)), ("conv4_block3_2_bn/gamma", (256,)),
    ("conv4_block3_2_bn/beta", (256,)), ("conv4_block3_3_conv/kernel", (1, 1, 256, 1024)),
    ("conv4_block3_3_conv/bias", (1024,)), ("conv4_block3_3_bn/gamma", (1024,)),
    ("conv4_block3_3_bn/beta", (1024,)), ("conv4_block4_1_conv/kernel", (1, 1, 1024, 256)),
    ("conv4_block4_1_conv/bias", (256,)), ("conv4_block4_1_bn/gamma", (256,)),
    ("conv4_block4_1_bn/beta", (256,)), ("conv4_block4_2_conv/kernel", (3, 3, 256, 256)),
    ("conv4_block4_2_conv/bias", (256,)), ("conv4_block4_2_bn/gamma", (256,)),
    ("conv4_block4_2_bn/beta", (256,)), ("conv4_block4_3_conv/kernel", (1, 1, 256, 1024)),
    ("conv4_block4_3_conv/bias", (1024,)), ("conv4_block4_3_bn/gamma", (1024,)),
    ("conv4_block4_3_bn/beta", (1024,)), ("conv4_block5_1_conv/kernel", (1, 1, 1024, 256)),
    ("conv4_block5_1_conv/bias", (256,)), ("conv4_block5_1_bn/gamma", (256,)),
    ("conv4_block5_1_bn/beta", (256,)), ("conv4_block5_2_conv/kernel", (3, 3, 256, 256)),
    ("conv4_block5_2_conv/bias", (256,)), ("conv4_block5_2_bn/gamma", (256,)),
    ("conv4_block5_2_bn/beta", (256,)), ("conv4_block5_3_conv/kernel", (1, 1, 256, 1024)),
    ("conv4_block5_3_conv/bias", (1024,)), ("conv4_block5_3_bn/gamma", (1024,)),
    ("conv4_block5_3_bn/beta", (1024,)), ("conv4_block6_1_conv/kernel", (1, 1, 1024, 256)),
    ("conv4_block6_1_conv/bias", (256,)), ("conv4_block6_1_bn/gamma", (256,)),
    ("conv4_block6_1_bn/beta", (256,)), ("conv4_block6_2_conv/kernel", (3, 3, 256, 256)),
    ("conv4_block6_2_conv/bias", (256,)), ("conv4_block6_2_bn/gamma", (256,)),
    ("conv4_block6_2_bn/beta", (256,)), ("conv4_block6_3_conv/kernel", (1, 1, 256, 1024)),
    ("conv4_block6_3_conv/bias", (1024,)), ("conv4_block6_3_bn/gamma", (1024,)),
    ("conv4_block6_3_bn/beta", (1024,)), ("conv5_block1_1_conv/kernel", (1, 1, 1024, 512)),
    ("conv5_block1_1_conv/bias", (512,)), ("conv5_block1_1_bn/gamma", (512,)),
    ("conv5_block1_1_bn/beta", (512,)), ("conv5_block1_2_conv/kernel", (3, 3, 512, 512)),
    ("conv5_block1_2_conv/bias", (512,)), ("conv5_block1_2_bn/gamma", (512,)),
    ("conv5_block1_2_bn/beta", (512,)), ("conv5_block1_0_conv/kernel", (1, 1, 1024, 2048)),
    ("conv5_block1_0_conv/bias", (2048,)), ("conv5_block1_3_conv/kernel", (1, 1, 512, 2048)),
    ("conv5_block1_3_conv/bias", (2048,)), ("conv5_block1_0_bn/gamma", (2048,)),
    ("conv5_block1_0_bn/beta", (2048,)), ("conv5_block1_3_bn/gamma", (2048,)),
    ("conv5_block1_3_bn/beta", (2048,)), ("conv5_block2_1_conv/kernel", (1, 1, 2048, 512)),
    ("conv5_block2_1_conv/bias", (512,)), ("conv5_block2_1_bn/gamma", (512,)),
    ("conv5_block2_1_bn/beta", (512,)), ("conv5_block2_2_conv/kernel", (3, 3, 512, 512)),
    ("conv5_block2_2_conv/bias", (512,)), ("conv5_block2_2_bn/gamma", (512,)),
    ("conv5_block2_2_bn/beta", (512,)), ("conv5_block2_3_conv/kernel", (1, 1, 512, 2048)),
    ("conv5_block2_3_conv/bias", (2048,)), ("conv5_block2_3_bn/gamma", (2048,)),
    ("conv5_block2_3_bn/beta", (2048,)), ("conv5_block3_1_conv/kernel", (1, 1, 2048, 512)),
    ("conv5_block3_1_conv/bias", (512,)), ("conv5_block3_1_bn/gamma", (512,)),
    ("conv5_block3_1_bn/beta", (512,)), ("conv5_block3_2_conv/kernel", (3, 3, 512, 512)),
    ("conv5_block3_2_conv/bias", (512,)), ("conv5_block3_2_bn/gamma", (512,)),
    ("conv5_block3_2_bn/beta", (512,)), ("conv5_block3_3_conv/kernel", (1, 1, 512, 2048)),
    ("conv5_block3_3_conv/bias", (2048,)), ("conv5_block3_3_bn/gamma", (2048,)),
    ("conv5_block3_3_bn/beta", (2048,)), ("predictions/kernel", (2048, 1000)),
    ("predictions/bias", (1000,)),
]
# fmt: on
RESNET50_SHAPES = [s for _, s in RESNET50_VARIABLES]
HALF_ULP = 2.0**-11  # float16: 11 significant bits, round to nearest


def test_resnet50_variables_are_kerass():
    """The list is ResNet50's: 214 variables, 25,583,592 parameters (Keras' summary)."""
    assert len(RESNET50_VARIABLES) == len({p for p, _ in RESNET50_VARIABLES}) == 214
    assert sum(math.prod(s) for s in RESNET50_SHAPES) == 25_583_592


def _file_bytes(logdir) -> int:
    return sum(os.path.getsize(os.path.join(logdir, f)) for f in os.listdir(logdir))


def _moments_of(shapes, seed, scale=1e-3):
    """Random raw moments: M_1 any sign, M_2 = M_1**2 + a positive variance."""
    rng = np.random.default_rng(seed)
    out = []
    for s in shapes:
        m1 = (rng.standard_normal(s, dtype=np.float32) * scale).astype(np.float32)
        var = (np.abs(rng.standard_normal(s, dtype=np.float32)) * scale**2).astype(np.float32)
        out.append({1: m1, 2: m1 * m1 + var})
    return out


def test_resnet50_logged_step_is_at_most_2_mb(tmp_path):
    """ResNet50's variables (214 tags under their Keras names, 25.6M parameters) logged with
    the defaults: at most 2 MB of event file per logged step, every tag's maps at most
    DEFAULT_MAX_ELEMENTS cells (float16 when pooled, float32 when not), and the exact
    statistics (/_stats) of every variable beside them."""
    variables = [tf.Variable(tf.zeros(s), name=p) for p, s in RESNET50_VARIABLES]
    moments = _moments_of(RESNET50_SHAPES, 0)
    writer = tf.summary.create_file_writer(str(tmp_path))
    sizes = []
    with writer.as_default():
        sizes.append(_file_bytes(tmp_path))
        for step in (0, 10):
            gradmom.summary.write(moments, variables, n=32, step=step, loss=0.5, learning_rate=0.1)
            writer.flush()
            sizes.append(_file_bytes(tmp_path))
    per_step = np.diff(sizes)
    # measured: 1,477,180 and 1,481,048 (24,574,191 with format version 1's defaults)
    print(f"ResNet50 bytes per logged step: {per_step.tolist()}")
    assert per_step.max() <= 2_000_000, per_step

    run = data.load(tmp_path)["."]
    tags = gradmom.summary.tag_names(variables)
    assert tags == [p for p, _ in RESNET50_VARIABLES]
    assert set(run) == set(tags) | {"_model"}
    for tag, shape, m in zip(tags, RESNET50_SHAPES, moments):
        rec = run[tag][-1]
        assert rec.content.version == metadata.FORMAT_VERSION == 3
        assert math.prod(rec.content.stored_shape) <= gradmom.summary.DEFAULT_MAX_ELEMENTS
        assert rec.content.pooled is (math.prod(shape) > gradmom.summary.DEFAULT_MAX_ELEMENTS)
        assert rec.content.encoding == ("float16" if rec.content.pooled else "float32")
        if not rec.pooled:  # stored as computed
            np.testing.assert_array_equal(rec.moments[1], m[1])
        # the statistics are the exact sums over every element (float64 numpy, stored float32)
        m1 = m[1].astype(np.float64)
        assert rec.stats["num_elements"] == math.prod(shape)
        assert rec.stats["sum_m2"] == pytest.approx(np.sum(m1 * m1), rel=1e-6)
        assert rec.stats["sum_m2_raw"] == pytest.approx(np.sum(m[2].astype(np.float64)), rel=1e-6)
        assert rec.hist.sum() == math.prod(shape)


def _ref_block_means(a, block):
    """Block means of the 2-D view by slicing (ragged edge blocks average what they cover)."""
    g = reductions.to_2d(np.asarray(a, np.float64))
    br, bc = block
    return np.array(
        [
            [g[i : i + br, j : j + bc].mean() for j in range(0, g.shape[1], bc)]
            for i in range(0, g.shape[0], br)
        ]
    )


def _assert_within_half_ulp(got, want, what):
    """``|got - want| <= 2**-11 |want|`` plus float16's subnormal spacing below ``2**-29`` of
    the row's largest finite magnitude; non-finite values kept as they are."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)], err_msg=what)
    top = np.abs(want[finite]).max(initial=0.0)
    err = np.abs(got[finite] - want[finite])
    bound = HALF_ULP * np.abs(want[finite]) + top * 2.0**-38
    assert np.all(err <= bound), (what, float((err / np.maximum(bound, 1e-300)).max()))


# (id, shape, variable dtype, scale of M_1, scale of the standard deviation): scales float16
# alone could not hold, a range of 8 decades in one map, zeros, NaN and infinities
FLOAT16_CASES = [
    ("gradients-1e-4", (30, 20), tf.float32, 1e-4, 1e-4),
    ("eight-decades", (40, 30), tf.float32, "wide", "wide"),
    ("tiny-1e-17", (7, 9), tf.float32, 1e-17, 1e-17),  # M_2 stays a normal float32
    ("huge-1e15", (5, 6), tf.float32, 1e15, 1e15),
    ("float64-variable", (10, 10), tf.float64, 1e-3, 1e-3),
    ("zero-variance", (12,), tf.float32, 1e-2, 0.0),
    ("all-zero", (3, 4), tf.float32, 0.0, 0.0),
    ("nan-and-inf", (6, 5), tf.float32, 1.0, 1.0),
]


def _case_moments(case, rng):
    _, shape, _, s1, s2 = case
    if s1 == "wide":
        m1 = rng.standard_normal(shape) * 10.0 ** rng.uniform(-6, 2, shape)
        var = np.abs(rng.standard_normal(shape)) * 10.0 ** rng.uniform(-12, 4, shape)
    else:
        m1 = rng.standard_normal(shape) * s1
        var = np.abs(rng.standard_normal(shape)) * s2**2
    m2 = m1 * m1 + var
    if case[0] == "nan-and-inf":
        m1.flat[[0, 3]] = [np.nan, -np.inf]
        m2.flat[[1, 2, 7]] = [np.inf, np.nan, np.inf]
    return m1, m2


@pytest.mark.parametrize("max_elements", [None, 60], ids=["full", "pooled"])
def test_float16_maps_hold_m1_and_the_variance_to_half_an_ulp(tmp_path, max_elements):
    """float16 maps through the real writer and `data.load`: M_1 and the variance derived
    from the decoded moments within half a float16 ulp of numpy's float32 moments (their block
    means when pooled), whatever the scale; the writer's tensors are `metadata.encode_float16`'s
    (its numpy twin) bit for bit."""
    rng = np.random.default_rng(3)
    variables, moments = [], []
    for i, case in enumerate(FLOAT16_CASES):
        variables.append(tf.Variable(tf.zeros(case[1], case[2]), name=f"v{i}/w"))
        moments.append(dict(zip((1, 2), _case_moments(case, rng))))
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default(step=4), np.errstate(invalid="ignore", over="ignore"):
        gradmom.summary.write(
            moments, variables, n=16, max_elements=max_elements, map_dtype="float16"
        )
    writer.close()
    run = data.load(tmp_path)["."]
    acc = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    acc.Reload()
    tags = gradmom.summary.tag_names(variables)
    for case, tag, m in zip(FLOAT16_CASES, tags, moments):
        rec = run[tag][0]
        c = rec.content
        assert c.encoding == "float16" and c.version == 3, case[0]
        m1 = np.asarray(m[1], np.float32).astype(np.float64)
        m2 = np.asarray(m[2], np.float32).astype(np.float64)
        if c.pooled:
            m1, m2 = _ref_block_means(m1, c.block), _ref_block_means(m2, c.block)
        with np.errstate(invalid="ignore", over="ignore"):
            var = m2 - m1 * m1
            got1 = rec.moments[1].astype(np.float64)
            got_var = rec.moments[2].astype(np.float64) - got1 * got1
        m1, var = m1.reshape(c.stored_shape), var.reshape(c.stored_shape)
        _assert_within_half_ulp(got1, m1, f"{case[0]} M_1")
        # M_2 is rebuilt in float32 from the variance: its rounding (2**-24 of M_2) on top
        slack = 2.0**-23 * np.abs(np.where(np.isfinite(m2), m2, 0)).reshape(c.stored_shape)
        finite = np.isfinite(var)
        top = np.abs(var[finite]).max(initial=0.0)
        err = np.abs(got_var[finite] - var[finite])
        assert np.all(err <= HALF_ULP * np.abs(var[finite]) + top * 2.0**-38 + slack[finite]), case[
            0
        ]
        # where M_1 is infinite, M_2 - M_1**2 is -inf or NaN: M_2 is lost, the variance NaN
        undefined = np.isnan(var) | ~np.isfinite(m1)
        np.testing.assert_array_equal(np.isnan(got_var), undefined, err_msg=case[0])
        if not c.pooled:
            raw = tensor_util.make_ndarray(acc.Tensors(tag)[0].tensor_proto)
            assert raw.dtype == np.float16 and raw.shape == metadata.tensor_shape(c)
            twin = metadata.encode_float16(m[1], m[2])
            np.testing.assert_array_equal(raw.view(np.uint16), twin.view(np.uint16), case[0])


def test_full_resolution_on_request_round_trips_exactly(tmp_path):
    """``max_elements=None``: every variable at its shape, as float32 (the default ``"auto"``
    maps), the moments the writer was given (cast to float32) read back bit for bit by
    `data.load` and the plugin."""
    shapes = [(3, 3, 8, 70), (5000,), (2048, 1000)]  # 5,040; 5,000; 2,048,000 elements
    variables = [tf.Variable(tf.zeros(s), name=f"big{i}/w") for i, s in enumerate(shapes)]
    moments = _moments_of(shapes, 1)
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default(step=7):
        gradmom.summary.write(moments, variables, n=8, max_elements=None)
    writer.close()
    run = data.load(tmp_path)["."]
    tags = gradmom.summary.tag_names(variables)
    for tag, shape, m in zip(tags, shapes, moments):
        rec = run[tag][0]
        assert rec.content.encoding == "float32" and not rec.pooled
        assert rec.content.stored_shape == shape
        for p in (1, 2):
            assert rec.moments[p].dtype == np.float32
            np.testing.assert_array_equal(rec.moments[p], m[p])
    client, _, _ = make_app(str(tmp_path))
    tag, m = tags[0], moments[0]
    d = get_json(client, "heatmap", run=".", tag=tag, step=7, stat="mean", max_rows=72, max_cols=70)
    assert d["stored_shape"] == list(shapes[0]) and d["pooled"] is False
    got = np.asarray(nums(d["values"]), np.float32).reshape(72, 70)
    np.testing.assert_array_equal(got, m[1].reshape(72, 70))


def test_full_resolution_costs_what_the_readme_says(tmp_path):
    """The README's figures for one variable: float16 maps 4 bytes a cell (2 orders x 2),
    float32 8, plus a few hundred bytes of event and metadata."""
    shape = (512, 512)
    v = [tf.Variable(tf.zeros(shape), name="k/w")]
    m = _moments_of([shape], 2)
    got = {}
    for dtype in ("float16", "float32"):
        d = tmp_path / dtype
        writer = tf.summary.create_file_writer(str(d))
        with writer.as_default(step=0):
            before = _file_bytes(d)
            gradmom.summary.write(m, v, n=8, max_elements=None, map_dtype=dtype)
            writer.flush()
            got[dtype] = _file_bytes(d) - before
    cells = math.prod(shape)
    # moments tag + stats tag + _model/_stats + 6 x 2 scalars: under 5 KB besides the maps
    assert 0 < got["float16"] - 4 * cells < 5000, got
    assert 0 < got["float32"] - 8 * cells < 5000, got


def test_the_default_maps_against_per_example_gradients(tmp_path):
    """`summary.moments` on a real model, default maps (pooled above 2,048 cells, as float16):
    the stored means against brute-force per-example gradients (block means of the pooled
    kernel), the statistics exact."""
    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [keras.Input((90,)), keras.layers.Dense(64, name="wide"), keras.layers.Dense(3, name="out")]
    )
    variables = model.trainable_variables
    rng = np.random.default_rng(5)
    x = rng.standard_normal((12, 90)).astype(np.float32)
    y = rng.standard_normal((12, 3)).astype(np.float32)

    def per_example(out, target):
        return tf.reduce_sum(tf.square(out - target), axis=1)

    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function
    def step(x, y):
        loss = tf.reduce_mean(per_example(model(x), y))
        with writer.as_default(step=0):
            return gradmom.summary.moments(loss, variables)

    step(tf.constant(x), tf.constant(y))
    writer.close()
    g = reference.per_example_gradients(model, variables, per_example, x, y)
    run = data.load(tmp_path)["."]
    for tag, ge in zip(gradmom.summary.tag_names(variables), g):
        rec = run[tag][0]
        assert rec.content.encoding == ("float16" if rec.pooled else "float32")
        m1 = ge.mean(0)
        var = ge.var(0, ddof=1)
        if rec.pooled:  # wide/kernel: 5,760 cells > 2,048
            assert rec.content.block == (2, 2)
            m1 = _ref_block_means(m1, rec.content.block)
            m2 = _ref_block_means((ge**2).mean(0), rec.content.block)
            var = 12 / 11 * (m2 - m1**2)
        m1 = m1.reshape(rec.content.stored_shape)
        var = var.reshape(rec.content.stored_shape)
        # float32 moments (1e-6) then float16 (2**-11)
        np.testing.assert_allclose(rec.moments[1], m1, rtol=HALF_ULP + 1e-5, atol=1e-7)
        got_var = reductions.stat_array(rec.moments, rec.batch_size, "variance")
        np.testing.assert_allclose(got_var, var, rtol=HALF_ULP + 1e-4, atol=1e-9 * var.max())
        # the statistics: exact sums over every element
        assert rec.stats["sum_var"] == pytest.approx(ge.var(0, ddof=1).sum(), rel=1e-5)


# ------------------------------------------------------------------------ version 1 logs


def _v1_moments_content(tag, shape, stored, block) -> bytes:
    """A content message exactly as tb_gradmom wrote it in format version 1."""
    pooled = block is not None
    d = {
        "block": list(block or (1, 1)),
        "dtype": "float32",
        "kind": "moments",
        "layer": tag.rsplit("/", 1)[0],
        "op": "MatMul",
        "orders": [1, 2],
        "pooled": pooled,
        "shape": list(shape),
        "stored_shape": list(stored),
        "variable": tag,
        "version": 1,
    }
    return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()


def _v1_stats_content(tag) -> bytes:
    d = {
        "fields": list(metadata.STATS_FIELDS),
        "hist": [-24, 8, 4],
        "kind": "stats",
        "variable": tag,
        "version": 1,
    }
    return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()


def _md(content: bytes):
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="gradmom", content=content),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


V1_TAGS = {"dense/kernel": ((30, 20), None), "big/kernel": ((300, 200), (2, 2))}


@pytest.fixture(scope="module")
def v1_log(tmp_path_factory):
    """A format-version-1 log: its content messages and float32 ``[k, *stored_shape]`` tensors
    as version 1 wrote them, two steps, one tag pooled."""
    root = tmp_path_factory.mktemp("v1")
    rng = np.random.default_rng(9)
    n = 10
    written = {}
    writer = tf.summary.create_file_writer(str(root))
    with writer.as_default():
        for step in (0, 5):
            for tag, (shape, block) in V1_TAGS.items():
                g = rng.standard_normal((n, *shape)) * 1e-3
                m1, m2 = g.mean(0), (g**2).mean(0)
                sums = stats.sums_from_moments(m1, m2, n)
                sums.update(loss=0.5, learning_rate=0.1)
                counts = stats.variance_histogram(
                    reductions.stat_array({1: m1, 2: m2}, n, "variance")
                )
                st = np.concatenate([[sums[f] for f in metadata.STATS_FIELDS], counts])
                if block is not None:
                    m1, m2 = _ref_block_means(m1, block), _ref_block_means(m2, block)
                stored = np.stack([m1, m2]).astype(np.float32)
                written[(tag, step)] = stored
                content = _v1_moments_content(tag, shape, stored.shape[1:], block)
                tf.summary.write(tag, stored, step=step, metadata=_md(content))
                tf.summary.write(
                    tag + "/_stats", st.astype(np.float32), step=step,
                    metadata=_md(_v1_stats_content(tag)),
                )  # fmt: skip
    writer.close()
    return str(root), written


def test_a_version_1_log_is_read_by_data_load(v1_log):
    root, written = v1_log
    run = data.load(root)["."]
    assert set(run) == set(V1_TAGS)
    for tag in V1_TAGS:
        assert [r.step for r in run[tag]] == [0, 5]
        for rec in run[tag]:
            c = rec.content
            assert (c.version, c.encoding) == (1, "float32")
            np.testing.assert_array_equal(rec.moments[1], written[(tag, rec.step)][0])
            np.testing.assert_array_equal(rec.moments[2], written[(tag, rec.step)][1])
            assert rec.batch_size == 10
    assert run["big/kernel"][0].pooled and run["big/kernel"][0].content.block == (2, 2)


def test_a_version_1_log_is_read_by_the_plugin(v1_log):
    root, written = v1_log
    client, _, _ = make_app(root)
    tags = get_json(client, "tags")["runs"]["."]
    assert set(tags) == set(V1_TAGS)
    assert tags["big/kernel"]["pooled"] is True and tags["big/kernel"]["block"] == [2, 2]
    for tag, step in [("dense/kernel", 5), ("big/kernel", 0)]:
        stored = written[(tag, step)]
        d = get_json(
            client, "heatmap", run=".", tag=tag, step=step, stat="mean", max_rows=400, max_cols=400
        )
        got = np.asarray(nums(d["values"]), np.float32).reshape(stored.shape[1:])
        np.testing.assert_array_equal(got, stored[0])
        d = get_json(
            client,
            "heatmap",
            run=".",
            tag=tag,
            step=step,
            stat="variance",
            max_rows=400,
            max_cols=400,
        )
        m1, m2 = stored.astype(np.float64)
        want = 10 / 9 * (m2 - m1**2)
        # JSON: 9 significant digits
        np.testing.assert_allclose(nums(d["values"]).reshape(want.shape), want, rtol=1e-8)


def test_a_float16_log_is_served_by_the_plugin(tmp_path):
    """float16 maps (version 2) through TensorBoard's loader and the plugin: the heatmap's
    means within half a float16 ulp of the float32 moments written."""
    shape = (50, 40)
    v = [tf.Variable(tf.zeros(shape), name="k/w")]
    m = _moments_of([shape], 4)
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default(step=3):
        gradmom.summary.write(m, v, n=8, map_dtype="float16")
    writer.close()
    client, _, _ = make_app(str(tmp_path))
    tag = gradmom.summary.tag_names(v)[0]
    assert get_json(client, "tags")["runs"]["."][tag]["stored_shape"] == [50, 40]
    d = get_json(client, "heatmap", run=".", tag=tag, step=3, stat="mean", max_rows=50, max_cols=40)
    _assert_within_half_ulp(nums(d["values"]).reshape(shape), m[0][1], "plugin mean")


# ------------------------------------------------------------- what readers and writers refuse


def _content16(**kw):
    base = {
        "block": [1, 1],
        "encoding": "float16",
        "kind": "moments",
        "orders": [1, 2],
        "pooled": False,
        "shape": [3, 4],
        "stored_shape": [3, 4],
        "version": 2,
    }
    return json.dumps({**base, **kw}).encode()


def test_float16_contents_and_tensors_are_checked():
    c = metadata.parse_plugin_content(_content16())
    assert c.encoding == "float16" and metadata.tensor_shape(c) == (2, 13)
    with pytest.raises(
        metadata.FormatError, match=r"float16 stores orders \[1, 2\], got \[1, 2, 3\]"
    ):
        metadata.parse_plugin_content(_content16(orders=[1, 2, 3]))
    with pytest.raises(metadata.FormatError, match=r"`encoding` must be one of .*'bfloat16'"):
        metadata.parse_plugin_content(_content16(encoding="bfloat16"))
    # version 1 knows float32 only: a field it did not have is ignored, as fields added are
    v1 = json.loads(_content16(version=1))
    assert metadata.parse_plugin_content(json.dumps(v1).encode()).encoding == "float32"
    with pytest.raises(metadata.FormatError, match=r"says float16 \[2, 13\]"):
        metadata.check_tensor(c, np.zeros([2, 13], np.float32))
    with pytest.raises(metadata.FormatError, match=r"says float16 \[2, 13\]"):
        metadata.check_tensor(c, np.zeros([2, 3, 4], np.float16))
    proto = tensor_util.make_tensor_proto(np.zeros([2, 13], np.float32))
    with pytest.raises(metadata.FormatError, match="dtype DT_FLOAT, but its metadata says float16"):
        metadata.check_tensor_proto(c, proto)
    metadata.check_tensor_proto(c, tensor_util.make_tensor_proto(np.zeros([2, 13], np.float16)))
    bad = np.zeros([2, 13], np.float16)
    bad[1, 0] = 0.5
    with pytest.raises(metadata.FormatError, match="exponents must be integers within 1100"):
        metadata.decode_moments(c, bad)


def test_a_bad_float16_step_is_skipped_with_a_warning(tmp_path):
    """A step whose exponent is not an integer: `data.load` skips it, naming run, tag, step."""
    c = metadata.parse_plugin_content(_content16(variable="w"))
    good = metadata.encode_float16(np.ones([3, 4]), 2 * np.ones([3, 4]))
    bad = good.copy()
    bad[0, 0] = 0.25
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        for step, t in ((1, good), (2, bad)):
            tf.summary.write("w", t, step=step, metadata=_md(metadata._encode(c)))
    writer.close()
    with pytest.warns(data.DataWarning, match=r"tag 'w' step 2: .*exponents must be integers"):
        recs = data.load(tmp_path)["."]["w"]
    assert [r.step for r in recs] == [1]
    np.testing.assert_array_equal(recs[0].moments[2], 2 * np.ones([3, 4], np.float32))


def test_writer_arguments_are_checked():
    v = [tf.Variable(tf.zeros([2]))]
    m = [{1: np.zeros(2), 2: np.zeros(2)}]
    with pytest.raises(
        ValueError, match=r"map_dtype must be one of 'auto', 'float32', 'float16', got 'bfloat16'"
    ):
        gradmom.summary.write(m, v, n=2, step=0, map_dtype="bfloat16")
    with pytest.raises(TypeError, match="max_elements must be a positive integer"):
        gradmom.summary.write(m, v, n=2, step=0, max_elements=0.5)
    with pytest.raises(ValueError, match="map_dtype must be one of"):
        gradmom.keras.GradMoments("unused", map_dtype="half")


def test_higher_orders_are_stored_float32(tmp_path):
    """float16 holds orders 1 and 2; a tag logging order 3 is float32 (exact)."""
    v = [tf.Variable(tf.zeros([4, 5]), name="w3/w")]
    rng = np.random.default_rng(0)
    m = [{p: rng.standard_normal([4, 5]).astype(np.float32) for p in (1, 2, 3)}]
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default(step=0):
        gradmom.summary.write(m, v, n=4, map_dtype="float16")
    writer.close()
    rec = data.load(tmp_path)["."][gradmom.summary.tag_names(v)[0]][0]
    assert rec.content.encoding == "float32" and rec.content.orders == (1, 2, 3)
    for p in (1, 2, 3):
        np.testing.assert_array_equal(rec.moments[p], m[0][p])


def test_the_callback_and_the_tape_pass_the_options_through(tmp_path):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((80,)), keras.layers.Dense(60, name="d")])
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(1).standard_normal((16, 80)).astype(np.float32)
    y = np.zeros((16, 60), np.float32)
    cb = gradmom.keras.GradMoments(
        str(tmp_path / "fit"), every_n_steps=1, max_elements=None, map_dtype="float32"
    )
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    rec = data.load(tmp_path / "fit")["."]["d/kernel"][0]
    assert rec.content.encoding == "float32" and rec.content.stored_shape == (80, 60)

    writer = tf.summary.create_file_writer(str(tmp_path / "tape"))

    @tf.function
    def step(x, y):
        with writer.as_default(step=0):
            with gradmom.GradientTape(max_elements=100, map_dtype="float16") as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
            return tape.gradient(loss, model.trainable_variables)

    step(tf.constant(x), tf.constant(y))
    writer.close()
    rec = data.load(tmp_path / "tape")["."]["d/kernel"][0]
    assert rec.content.encoding == "float16" and math.prod(rec.content.stored_shape) <= 100


def _loaders():
    from tests import test_plugin_subprocess as tps

    problem = tps._data_server_problem()  # noqa: SLF001
    return [
        "false",
        pytest.param("true", marks=pytest.mark.skipif(bool(problem), reason=str(problem))),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("load_fast", _loaders())
def test_both_loaders_serve_version_1_and_float16_runs(tmp_path, v1_log, load_fast):
    """A real `tensorboard` (Python loader, and RustBoard's data server over gRPC) on a log
    directory holding a version-1 run and a version-2 float16 run side by side: both listed,
    both heatmaps served, the v1 one exact, the float16 one within half an ulp."""
    import shutil

    from tests import test_plugin_subprocess as tps

    root = tmp_path / "logs"
    shutil.copytree(v1_log[0], root / "old")
    shape = (50, 40)
    v = [tf.Variable(tf.zeros(shape), name="k/w")]
    m = _moments_of([shape], 6)
    writer = tf.summary.create_file_writer(str(root / "new"))
    with writer.as_default(step=2):
        gradmom.summary.write(m, v, n=8, map_dtype="float16")
    writer.close()
    tag = gradmom.summary.tag_names(v)[0]
    from tests import test_readers

    (tmp_path / "tb").mkdir()
    server = test_readers._launch(  # noqa: SLF001
        str(root), tmp_path / "tb", f"--load_fast={load_fast}", "--reload_interval", "0"
    )
    try:
        p = "/data/plugin/gradmom/"
        runs = {}
        for _ in range(240):  # RustBoard loads asynchronously
            runs = server.json(p + "tags")["runs"]
            if tag in runs.get("new", {}) and set(V1_TAGS) <= set(runs.get("old", {})):
                break
            time.sleep(0.5)
        assert runs["new"][tag]["stored_shape"] == [50, 40], runs
        assert runs["old"]["big/kernel"]["block"] == [2, 2], runs
        d = server.json(
            p + "heatmap", run="new", tag=tag, step=2, stat="mean", max_rows=50, max_cols=40
        )
        _assert_within_half_ulp(nums(d["values"]).reshape(shape), m[0][1], "float16 mean")
        stored = v1_log[1][("dense/kernel", 5)]
        d = server.json(
            p + "heatmap", run="old", tag="dense/kernel", step=5, stat="mean", max_rows=30,
            max_cols=20,
        )  # fmt: skip
        got = np.asarray(nums(d["values"]), np.float32).reshape(stored.shape[1:])
        np.testing.assert_array_equal(got, stored[0])
    finally:
        tps.stop(server)


def _export_csv(logdir, out, tag, step, stat):
    """`tb-gradmom export` of one heatmap as CSV: ``{(row, col): value}``."""
    import csv

    from tb_gradmom import cli

    argv = ["export", "--logdir", str(logdir), "--out", str(out), "--format", "csv"]
    argv += ["--tag", f"^{tag}$", "--step", str(step), "--stat", stat, "--quiet"]
    assert cli.main(argv) == 0
    (path,) = out.iterdir()
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["row", "col", stat]
    return {(int(r), int(c)): float(v) for r, c, v in rows[1:]}


def test_the_export_reads_version_1_and_float16_logs(tmp_path, v1_log):
    """``tb-gradmom export`` (the CLI) reads a version-1 tag as stored, and a float16 one
    decoded (within half an ulp of the float32 moments written)."""
    root, written = v1_log
    stored = written[("dense/kernel", 5)]
    got = _export_csv(root, tmp_path / "v1", "dense/kernel", 5, "mean")
    assert len(got) == stored[0].size
    for (r, c), value in got.items():
        assert np.float32(value) == stored[0][r, c]
    shape = (30, 70)  # 2,100 elements: pooled by default, as float16
    v = [tf.Variable(tf.zeros(shape), name="k/w")]
    m = _moments_of([shape], 7)
    writer = tf.summary.create_file_writer(str(tmp_path / "v2"))
    with writer.as_default(step=1):
        gradmom.summary.write(m, v, n=8)
    writer.close()
    rec = data.load(tmp_path / "v2")["."]["k/w"][0]
    assert rec.content.encoding == "float16" and rec.content.block == (1, 2)
    got = _export_csv(tmp_path / "v2", tmp_path / "out2", "k/w", 1, "mean")
    grid = np.full(rec.content.stored_shape, np.nan)
    for (r, c), value in got.items():
        grid[r, c] = value
    _assert_within_half_ulp(grid, _ref_block_means(m[0][1], (1, 2)), "export mean")


def test_the_plugin_skips_a_bad_float16_step_and_serves_the_others(tmp_path):
    """A float16 step whose exponent is not an integer: the plugin answers 404 for it, naming
    the problem, and serves the tag's good step."""
    c = metadata.parse_plugin_content(_content16(variable="w"))
    m1, m2 = np.full([3, 4], 0.5), np.full([3, 4], 2.0)
    good = metadata.encode_float16(m1, m2)
    bad = good.copy()
    bad[1, 0] = 0.25
    sums = stats.sums_from_moments(m1, m2, 4)
    counts = stats.variance_histogram(reductions.stat_array({1: m1, 2: m2}, 4, "variance"))
    st = np.concatenate([[sums.get(f, np.nan) for f in metadata.STATS_FIELDS], counts])
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        for step, t in ((1, good), (2, bad)):
            tf.summary.write("w", t, step=step, metadata=_md(metadata._encode(c)))  # noqa: SLF001
            tf.summary.write(
                "w/_stats", st.astype(np.float32), step=step,
                metadata=_md(_v1_stats_content("w")),
            )  # fmt: skip
    writer.close()
    client, _, _ = make_app(str(tmp_path))
    d = get_json(client, "heatmap", run=".", tag="w", step=1, stat="variance")
    np.testing.assert_allclose(nums(d["values"]), 4 / 3 * (2.0 - 0.25), rtol=1e-7)
    r = client.get("/data/plugin/gradmom/heatmap", query_string=dict(run=".", tag="w", step=2))
    assert r.status_code == 404
    assert "exponents must be integers" in r.get_data(as_text=True)
