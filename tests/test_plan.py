"""`gradmom.plan_moments`: the plan `gradients_and_moments` follows, printed per variable."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom as gradmom


@pytest.mark.filterwarnings("ignore:tb_gradmom. no exact rule")
def test_plan_shows_each_variable_path_axis_and_evidence():
    dense = keras.layers.Dense(3, name="head")
    dense.build((None, 4))
    scale = tf.Variable(tf.ones([4]), name="bn_scale")  # no rule: a fused batch norm
    seen = {}

    @tf.function
    def step(x):
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(
            x[:, None, None, :],
            scale,
            tf.zeros([4]),
            mean=tf.zeros([4]),
            variance=tf.ones([4]),
            is_training=False,
        )
        logits = dense(tf.reshape(y, [-1, 4]))
        loss = tf.reduce_mean(tf.reduce_sum(tf.square(logits), axis=1))
        plan = gradmom.plan_moments(loss, [*dense.trainable_variables, scale])
        seen["paths"] = [v.path for v in plan.variables]
        seen["text"] = str(plan)
        seen["n"] = tf.get_static_value(plan.n)
        return loss

    step(tf.constant(np.ones([5, 4], np.float32)))
    kernel, bias, bn = seen["paths"]
    assert kernel == "rule: MatMul" and bias == "rule: BiasAdd", seen["paths"]
    assert bn.startswith("fallback: FusedBatchNormV3 op '"), bn
    text = seen["text"]
    assert seen["n"] == 5
    assert "3 variables, orders (1, 2)" in text and "a mean of per-example losses" in text
    assert "batch size: 5" in text
    lines = text.splitlines()
    (kernel_line,) = [i for i, line in enumerate(lines) if line.startswith("head/kernel [4, 3]")]
    site = lines[kernel_line + 1]
    assert site.startswith("    MatMul '") and "examples on axis 0" in site and "evidence:" in site
    assert any(line.startswith("bn_scale [4]: fallback: FusedBatchNormV3") for line in lines)


def test_plan_refuses_what_gradients_and_moments_refuses():
    w = tf.Variable(tf.ones([3]))

    @tf.function
    def step(x):
        return gradmom.plan_moments(tf.reduce_max(tf.reduce_sum(x * w, axis=1)), [w])

    with pytest.raises(gradmom.PerExampleLossError):
        step(tf.ones([4, 3]))
    with pytest.raises(ValueError, match="orders"):
        tf.function(lambda x: gradmom.plan_moments(tf.reduce_mean(x * w), [w], orders=(5,)))(
            tf.ones([4, 3])
        )


def test_replica_context_outside_inside_and_under_a_strategy():
    """The lookup `make_plan` does for tf.distribute, on the fast path (no second device)."""
    from tb_gradmom.core.plan import replica_context

    assert replica_context() is None
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        assert replica_context() is None  # cross-replica context
        seen = []
        strategy.run(lambda: seen.append(replica_context()))
    assert seen == [None]  # one replica in sync: nothing to all-reduce
