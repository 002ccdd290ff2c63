"""The rule contract: a new op is a rule module and one registry entry, nothing else in the core.

Each test registers a rule of its own (defined here, as a new rule module would define it) for
an op that no rule covers, with one `REGISTRY` entry (``monkeypatch.setitem``), and checks that
`gradients_and_moments` / `per_example_norms` use it and are exact against brute force (one
gradient per example, float64). No other core module is touched.
"""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import tb_gradmom as gradmom
from tb_gradmom.core import rules as _rules
from tb_gradmom.core.axes import FREE, UNKNOWN, Axis
from tb_gradmom.core.rules import REGISTRY, Contribution, Rule, RuleError, Site
from tb_gradmom.core.rules.base import Count, example_count, example_slice
from tests import reference

TOL = 1e-12
ORDERS = (1, 2, 3, 4)


# --- a toy rule module: z = x / w, the variable ``w: [d]`` the divisor -----------------------
#
# dz/dw = -x / w**2 element-wise, so example j's gradient is g_j = sum_S -x_j delta_j / w**2,
# summed over the positions S that w is broadcast over.


def _divisor_rule(calls: list) -> Rule:
    def contribution(site: Site) -> Contribution:
        op = site.op
        if site.index != 1:
            raise RuleError("the variable is the dividend, not the divisor")
        out = op.outputs[0]
        if site.view.shape.rank != 1 or out.shape.rank is None or out.shape.rank < 2:
            raise RuleError("only a [d] divisor of a [n, ..., d] dividend")
        ax = site.example_axis(out, f"the output of RealDiv op '{op.name}'")
        if not (ax.axis == 0 and ax.pure):
            raise RuleError("the examples are not on axis 0 alone")
        positions = list(range(1, out.shape.rank - 1))

        def per_example(delta: tf.Tensor, n: Count, start: Count, size: Count) -> tf.Tensor:
            calls.append("per_example")
            x = example_slice(site.input(0), start, size)
            d = example_slice(delta, start, size)
            w = site.input(1)
            g = -x * d / (w * w)
            return tf.reduce_sum(g, axis=positions) if positions else g

        return Contribution(
            examples=example_count(out, 0),
            evidence=f"toy divisor rule: the batch axis of '{out.name}'",
            per_example=per_example,
            per_example_elements=int(np.prod(out.shape[1:])),
        )

    return Rule("toy_divisor", ops=("RealDiv",), contribution=contribution)


def _divisor_model(dtype=tf.float64):
    w = tf.Variable(1.5 + np.random.default_rng(1).uniform(size=[4]), dtype=dtype, name="w")
    b = tf.Variable(np.random.default_rng(2).normal(size=[4]), dtype=dtype, name="b")

    def forward(x):
        return tf.tanh(x / w + b)

    return forward, [w, b]


def _per_example_loss(out, y):
    return tf.reduce_sum(tf.square(out - y), axis=list(range(1, out.shape.rank)))


def _inputs(shape, dtype=np.float64):
    rng = np.random.default_rng(0)
    return rng.normal(size=shape).astype(dtype), rng.normal(size=shape).astype(dtype)


def _moments_and_paths(forward, variables, x, y, **kwargs):
    seen = {}

    @tf.function
    def step(x, y):
        loss = tf.reduce_mean(_per_example_loss(forward(x), y))
        plan = gradmom.plan_moments(loss, variables, orders=ORDERS)
        seen["paths"] = [v.path for v in plan.variables]
        seen["text"] = str(plan)
        return gradmom.gradients_and_moments(loss, variables, orders=ORDERS, **kwargs)

    grads, moments = step(tf.constant(x), tf.constant(y))
    return grads, moments, seen


def _assert_close(got, want, what):
    got = np.asarray(got, np.float64)
    scale = max(float(np.max(np.abs(want))), 1e-300)
    err = float(np.max(np.abs(got - want)))
    assert err <= TOL * scale, f"{what}: max error {err:.3g} > {TOL:g} * {scale:.3g}"


def _assert_exact(forward, variables, x, y, grads, moments):
    """Gradients and moments against brute-force per-example gradients."""
    per_ex = reference.per_example_gradients(forward, variables, _per_example_loss, x, y)
    for v, g, m, want in zip(variables, grads, moments, per_ex):
        ref = reference.moments(want, ORDERS)
        _assert_close(g, ref[1], f"{v.name} gradient")
        for p in ORDERS:
            _assert_close(m[p], ref[p], f"{v.name} M_{p}")


@pytest.mark.parametrize("shape", [(6, 4), (5, 3, 4)], ids=["rows", "sequence"])
def test_a_new_rule_registered_once_is_used_and_exact(monkeypatch, shape):
    calls: list = []
    monkeypatch.setitem(REGISTRY, "RealDiv", _divisor_rule(calls))
    forward, variables = _divisor_model()
    x, y = _inputs(shape)
    grads, moments, seen = _moments_and_paths(forward, variables, x, y, fallback="error")
    assert seen["paths"] == ["rule: RealDiv", "rule: AddV2"], seen["paths"]
    assert "toy divisor rule" in seen["text"], seen["text"]
    assert calls, "the registered rule's per_example was never built"
    _assert_exact(forward, variables, x, y, grads, moments)


def test_a_new_rule_gives_per_example_norms_exactly(monkeypatch):
    monkeypatch.setitem(REGISTRY, "RealDiv", _divisor_rule([]))
    forward, variables = _divisor_model()
    x, y = _inputs((5, 3, 4))

    @tf.function
    def step(x, y):
        loss = tf.reduce_mean(_per_example_loss(forward(x), y))
        return gradmom.per_example_norms(loss, variables, fallback="error")

    _, norms = step(tf.constant(x), tf.constant(y))
    per_ex = reference.per_example_gradients(forward, variables, _per_example_loss, x, y)
    for v, got, g in zip(variables, norms, per_ex):
        want = np.sum(g.reshape(g.shape[0], -1) ** 2, axis=1)
        _assert_close(got, want, f"{v.name} squared norms")


def test_without_the_entry_the_op_is_not_on_that_rule():
    """The control: the same model without the entry takes the generic masked VJP."""
    assert "RealDiv" not in REGISTRY
    forward, variables = _divisor_model()
    x, y = _inputs((6, 4))
    _, _, seen = _moments_and_paths(forward, variables, x, y)
    assert seen["paths"][0] == "rule: RealDiv"
    assert "toy divisor rule" not in seen["text"]


@pytest.mark.filterwarnings("ignore:tb_gradmom. no exact rule")
def test_a_rule_precheck_sends_the_variable_to_the_fallback_with_its_reason(monkeypatch):
    def refuse(op, index, ex):
        return f"the toy precheck refuses input {index} of {op.type}"

    rule = _divisor_rule([])
    monkeypatch.setitem(
        REGISTRY, "RealDiv", Rule(rule.name, rule.ops, rule.contribution, precheck=refuse)
    )
    forward, variables = _divisor_model()
    x, y = _inputs((6, 4))
    grads, moments, seen = _moments_and_paths(forward, variables, x, y)
    assert seen["paths"][0].startswith("fallback: RealDiv op"), seen["paths"]
    assert "the toy precheck refuses input 1 of RealDiv" in seen["paths"][0]
    per_ex = reference.per_example_gradients(forward, variables, _per_example_loss, x, y)
    ref = reference.moments(per_ex[0], ORDERS)
    for p in ORDERS:  # the exact fallback
        _assert_close(moments[0][p], ref[p], f"w M_{p}")
    with pytest.raises(gradmom.UnsupportedOpError, match="the toy precheck refuses input 1"):
        _moments_and_paths(forward, variables, x, y, fallback="error")


# --- a rule that brings the examples' axis of an op the analysis does not know ----------------
#
# ``BiasAddV1`` (the deprecated bias add): no handler in `tb_gradmom.core.axes`, so without a
# rule the analysis stops there. Its rule says the output holds the examples where the value
# does, and g_j = sum_S delta_j.


def _bias_v1_axes(ex, op, states):
    value, bias = states
    return value if isinstance(value, Axis) and bias == FREE else UNKNOWN


def _bias_v1_rule(site: Site) -> Contribution:
    op = site.op
    if site.index != 1:
        raise RuleError("the variable is the value, not the bias")
    out = op.outputs[0]
    ax = site.example_axis(out, f"the output of BiasAddV1 op '{op.name}'")
    if not (ax.axis == 0 and ax.pure) or out.shape.rank is None:
        raise RuleError("the examples are not on axis 0 alone")
    positions = list(range(1, out.shape.rank - 1))

    def per_example(delta: tf.Tensor, n: Count, start: Count, size: Count) -> tf.Tensor:
        d = example_slice(delta, start, size)
        return tf.reduce_sum(d, axis=positions) if positions else d

    return Contribution(
        examples=example_count(out, 0),
        evidence="toy bias rule",
        per_example=per_example,
        per_example_elements=int(np.prod(out.shape[1:])),
    )


BIAS_V1_RULE = Rule(
    "toy_bias_v1", ops=("BiasAddV1",), contribution=_bias_v1_rule, axes=_bias_v1_axes
)


def _bias_v1_model():
    rng = np.random.default_rng(3)
    kernel = tf.Variable(rng.normal(size=[4, 3]), dtype=tf.float64, name="kernel")
    bias = tf.Variable(rng.normal(size=[3]), dtype=tf.float64, name="bias_v1")

    def forward(x):
        h = tf.reshape(tf.matmul(tf.reshape(x, [-1, 4]), kernel), [-1, x.shape[1], 3])
        return tf.tanh(tf.raw_ops.BiasAddV1(value=h, bias=bias))

    return forward, [kernel, bias]


def test_a_rule_brings_the_axes_of_an_op_the_analysis_does_not_know(monkeypatch):
    forward, variables = _bias_v1_model()
    x, _ = _inputs((5, 2, 4))
    y = np.random.default_rng(4).normal(size=(5, 2, 3))
    with (
        pytest.warns(UserWarning, match="stopped at BiasAddV1 op"),
        pytest.raises(gradmom.UnsupportedOpError, match="BiasAddV1"),
    ):
        _moments_and_paths(forward, variables, x, y, fallback="error")
    monkeypatch.setitem(REGISTRY, "BiasAddV1", BIAS_V1_RULE)
    grads, moments, seen = _moments_and_paths(forward, variables, x, y, fallback="error")
    assert seen["paths"] == ["rule: MatMul", "rule: BiasAddV1"], seen["paths"]
    _assert_exact(forward, variables, x, y, grads, moments)


# --- the registry and the modules that must not list op types ---------------------------------


def test_every_op_maps_to_the_rule_that_claims_it():
    assert set(REGISTRY) == {op for rule in _rules.RULES for op in rule.ops}
    for rule in _rules.RULES:
        assert all(REGISTRY[op] is rule for op in rule.ops), rule.name
    with pytest.raises(ValueError, match="'MatMul' is claimed by rules 'matmul' and 'twin'"):
        _rules._by_op((*_rules.RULES, Rule("twin", ("MatMul",), _rules.MATMUL_RULE.contribution)))


def test_a_rule_of_several_outputs_needs_a_seed():
    with pytest.raises(TypeError, match="outputs and seed go together"):
        Rule("loop", ("While",), _rules.RECURRENT_RULE.contribution, outputs=lambda op, p: ())
    with pytest.raises(TypeError, match="non-empty tuple"):
        Rule("bad", "MatMul", _rules.MATMUL_RULE.contribution)  # type: ignore[arg-type]


# The one literal allowed: the ops whose function-running copies the fallback gates (pfor's own
# loops and calls), not any rule's knowledge.
_ALLOWED = {
    "fallback.py": {"While", "StatelessWhile", "PartitionedCall", "StatefulPartitionedCall"}
}


@pytest.mark.parametrize("module", ["sites.py", "moments.py", "fallback.py", "norms.py", "plan.py"])
def test_the_core_modules_name_no_op_type_of_a_rule(module):
    path = pathlib.Path(_rules.__file__).parent.parent / module
    literals = {
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    named = (literals & set(REGISTRY)) - _ALLOWED.get(module, set())
    assert not named, f"{module} names op types that belong to rules: {sorted(named)}"
