"""Exact moment rules, one op family per module, and the one registry from op type to rule.

Adding support for an op is: a rule module (a pure function ``Site -> Contribution``), one line
in `REGISTRY`, and a row in ``tests/cases.py``.
"""

from __future__ import annotations

from tb_gradmom.core.rules.base import Contribution, RuleError, Site
from tb_gradmom.core.rules.bias import bias_rule
from tb_gradmom.core.rules.call import call_rule
from tb_gradmom.core.rules.concat import concat_rule
from tb_gradmom.core.rules.conv import conv_rule
from tb_gradmom.core.rules.einsum import batch_matmul_rule, einsum_rule
from tb_gradmom.core.rules.embedding import gather_rule
from tb_gradmom.core.rules.loops import recurrent_rule
from tb_gradmom.core.rules.matmul import matmul_rule

__all__ = ["REGISTRY", "Contribution", "RuleError", "Site", "supported_ops"]

REGISTRY = {
    "MatMul": matmul_rule,
    "Conv2D": conv_rule,
    "Conv3D": conv_rule,
    "DepthwiseConv2dNative": conv_rule,
    "Conv2DBackpropInput": conv_rule,
    "Conv3DBackpropInputV2": conv_rule,
    "BiasAdd": bias_rule,
    "AddV2": bias_rule,
    "Add": bias_rule,
    "Sub": bias_rule,
    "Mul": bias_rule,
    "GatherV2": gather_rule,
    "ResourceGather": gather_rule,
    "BatchMatMulV2": batch_matmul_rule,
    "BatchMatMulV3": batch_matmul_rule,
    "Einsum": einsum_rule,
    "ConcatV2": concat_rule,
    # Keras' grouped convolutions: an XLA-compiled function call wrapping Conv2D/Conv3D
    "PartitionedCall": call_rule,
    "StatefulPartitionedCall": call_rule,
    # Keras recurrent layers: a variable read inside a tf.while_loop
    "While": recurrent_rule,
    "StatelessWhile": recurrent_rule,
}


def supported_ops() -> list[str]:
    """The op types that have an exact rule, sorted."""
    return sorted(REGISTRY)
