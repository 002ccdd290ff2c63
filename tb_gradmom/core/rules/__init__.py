"""Exact moment rules, one op family per module, and the one registry from op type to rule.

Adding support for an op is: a rule module that defines a `Rule` (its op types, the math as a
pure function ``Site -> Contribution``, and the optional hooks the core asks of its ops: a
precheck of where the examples are, the outputs a site needs, the fallback's hazards, an
examples' axis transfer function for an op the analysis does not know), its entry in `RULES`
(each of its op types then maps to it in `REGISTRY`), and a row in ``tests/cases.py``. No other
core module names op types of a rule: `tb_gradmom.core.sites`, `tb_gradmom.core.moments`,
`tb_gradmom.core.fallback` and `tb_gradmom.core.axes` ask the rule
(``tests/test_rules_contract.py`` registers a rule of its own this way).
"""

from __future__ import annotations

import tensorflow as tf

from tb_gradmom.core.rules.base import Contribution, Rule, RuleError, Site
from tb_gradmom.core.rules.bias import BIAS_RULE
from tb_gradmom.core.rules.call import CALL_RULE
from tb_gradmom.core.rules.concat import CONCAT_RULE
from tb_gradmom.core.rules.conv import CONV_RULE
from tb_gradmom.core.rules.einsum import BATCH_MATMUL_RULE, EINSUM_RULE
from tb_gradmom.core.rules.embedding import GATHER_RULE
from tb_gradmom.core.rules.loops import RECURRENT_RULE
from tb_gradmom.core.rules.matmul import MATMUL_RULE

__all__ = [
    "REGISTRY",
    "RULES",
    "Contribution",
    "Rule",
    "RuleError",
    "Site",
    "supported_ops",
    "vectorisation_hazard",
]

RULES: tuple[Rule, ...] = (
    MATMUL_RULE,
    CONV_RULE,
    BIAS_RULE,
    GATHER_RULE,
    BATCH_MATMUL_RULE,
    EINSUM_RULE,
    CONCAT_RULE,
    # Keras' grouped convolutions: an XLA-compiled function call wrapping Conv2D/Conv3D
    CALL_RULE,
    RECURRENT_RULE,
)


def _by_op(rules: tuple[Rule, ...]) -> dict[str, Rule]:
    table: dict[str, Rule] = {}
    for rule in rules:
        for op_type in rule.ops:
            if op_type in table:
                raise ValueError(
                    f"op type '{op_type}' is claimed by rules '{table[op_type].name}' and "
                    f"'{rule.name}': give it to one of them"
                )
            table[op_type] = rule
    return table


# op type -> its rule
REGISTRY: dict[str, Rule] = _by_op(RULES)


def supported_ops() -> list[str]:
    """The op types that have an exact rule, sorted."""
    return sorted(REGISTRY)


def vectorisation_hazard(op: tf.Operation, depth: int = 0) -> str | None:
    """Why TensorFlow's ``pfor`` must not vectorise the backward pass through ``op`` (the rule
    of its op type says so: `Rule.vectorisation_hazard`), or None; ``depth``: how many function
    calls deep ``op`` is."""
    rule = REGISTRY.get(op.type)
    if rule is None or rule.vectorisation_hazard is None:
        return None
    return rule.vectorisation_hazard(op, depth)
