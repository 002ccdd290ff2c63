"""The one table from op type to handler, built by family.

An op family shares one transfer function (`tb_gradmom.core.axes.handlers`), and is registered
by the named helper of its family, as JAX registers batching rules (``defvectorized``,
``defbroadcasting``): supporting a new element-wise op is one word in `defelementwise`'s list,
and an op type registered twice is an error at import. Op types with no handler stop the proof
(`UNKNOWN`, the op named), unless the op's moment rule brings a handler of its own
(`handler`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tb_gradmom.core.axes import control
from tb_gradmom.core.axes import handlers as h

__all__ = [
    "HANDLERS",
    "Handler",
    "handler",
    "is_free",
    "is_source",
    "defsource",
    "deffree",
    "defelementwise",
    "defbroadcasting",
    "defreduction",
    "deflastaxis",
    "defbatchrows",
    "defalongaxes",
    "definnermost",
    "defop",
]

# (analysis, op, input states) -> the output state, or a list of one per output
Handler = Callable[..., object]

HANDLERS: dict[str, Handler] = {}
_FREE: set[str] = set()
_SOURCES: set[str] = set()
# Stateful random ops: their numbers depend on no example (words in their op types).
_RANDOM_WORDS = ("Random", "Multinomial", "TruncatedNormal")


def _claim(op_types: Iterable[str]) -> list[str]:
    types = list(op_types)
    for t in types:
        if t in HANDLERS or t in _FREE or t in _SOURCES:
            raise ValueError(f"op type '{t}' is registered twice in tb_gradmom.core.axes")
    return types


def defop(op_types: Iterable[str], handler: Handler) -> None:
    """``handler`` for each of ``op_types`` (a family of one, or ops sharing a handler)."""
    for t in _claim(op_types):
        HANDLERS[t] = handler


def defsource(*op_types: str) -> None:
    """Ops whose outputs hold the examples on axis 0 (an iterator's elements)."""
    _SOURCES.update(_claim(op_types))


def deffree(*op_types: str) -> None:
    """Ops whose outputs depend on no example, whatever their inputs (constants, shapes; a
    ``StopGradient``, which for the per-example split is a constant)."""
    _FREE.update(_claim(op_types))


def defelementwise(*op_types: str) -> None:
    """Element-wise ops of one data input: the output holds the examples where input 0 does."""
    defop(op_types, h.h_unary)


def defbroadcasting(*op_types: str) -> None:
    """Element-wise ops with numpy broadcasting: an input's examples' axis lands at the same
    output position for every input that has one, and must not be broadcast itself."""
    defop(op_types, h.h_broadcast)


def defreduction(*op_types: str) -> None:
    """Reductions ``(data, axes)``: over the examples' axis the result is `REDUCED`, else the
    axis moves past the reduced ones."""
    defop(op_types, h.h_reduce)


def deflastaxis(*op_types: str) -> None:
    """Ops on each row of the last axis (softmax, top-k): the examples must not be on it."""
    defop(op_types, h.h_last_axis)


def defbatchrows(*op_types: str) -> None:
    """NHWC/NDHWC ops (convolutions, pooling, resizing, fused batch norm) that treat every row
    of their batch axis 0 on its own: the examples must be on axis 0."""
    defop(op_types, h.h_batch_row)


def defalongaxes(*op_types: str, axes_input: int) -> None:
    """Ops along the axes given by input ``axes_input`` (a cumulative sum, a reverse, a roll):
    the examples must not be on one of them."""
    defop(op_types, h.along_axes(axes_input))


def definnermost(*op_types: str, k: int) -> None:
    """Ops on the ``k`` innermost axes (FFTs): the examples must be on an outer axis."""
    defop(op_types, h.innermost(k))


def handler(op_type: str) -> Handler | None:
    """The handler of ``op_type``: this table's, else the transfer function that the op's moment
    rule brings (`tb_gradmom.core.rules.Rule.axes`, for an op this table does not know), else
    None (the proof stops there)."""
    found = HANDLERS.get(op_type)
    if found is not None:
        return found
    from tb_gradmom.core.rules import REGISTRY  # here: the rules import this package

    rule = REGISTRY.get(op_type)
    return None if rule is None else rule.axes


def is_free(op_type: str) -> bool:
    """Whether ``op_type``'s outputs depend on no example whatever its inputs."""
    if op_type in _FREE:
        return True
    return any(w in op_type for w in _RANDOM_WORDS) and "Seed" not in op_type[:4]


def is_random(op_type: str) -> bool:
    """Whether ``op_type`` draws random numbers (stateful or stateless)."""
    return (
        op_type not in _FREE
        and any(w in op_type for w in _RANDOM_WORDS)
        and ("Seed" not in op_type[:4])
    )


def is_source(op_type: str) -> bool:
    """Whether ``op_type`` yields the step's examples (axis 0 of each output)."""
    return op_type in _SOURCES


# --- the table ------------------------------------------------------------------------------

defsource("IteratorGetNext", "IteratorGetNextSync", "OptionalGetValue", "IteratorGetNextAsOptional")
deffree(
    *"""Const VarHandleOp ReadVariableOp VariableShape Shape ShapeN Size Rank ZerosLike OnesLike
    Range Fill BroadcastArgs NoOp StopGradient TensorListElementShape TensorListLength""".split()
)
defelementwise(
    *"""Identity Cast Neg Abs Exp Log Log1p Expm1 Sqrt Rsqrt Square Reciprocal Inv Relu Relu6 Elu
    Selu LeakyRelu Softplus Softsign Sigmoid Tanh Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh
    Atanh Erf Erfc Erfinv Floor Ceil Round Rint Sign IsNan IsInf IsFinite LogicalNot Snapshot
    CheckNumerics CheckNumericsV2 EnsureShape PreventGradient Real Imag Conj Lgamma Digamma
    Invert PopulationCount DebugIdentity DebugIdentityV2 DebugIdentityV3 Gelu Mish
    Bitcast ComplexAbs Angle Bucketize""".split()
)
defbroadcasting(
    *"""AddV2 Add Sub Mul RealDiv Div DivNoNan MulNoNan FloorDiv FloorMod TruncateDiv TruncateMod
    Maximum Minimum Pow SquaredDifference Greater GreaterEqual Less LessEqual Equal NotEqual
    LogicalAnd LogicalOr SelectV2 Atan2 Xdivy Xlogy Xlog1py ClipByValue BitwiseAnd BitwiseOr
    BitwiseXor LeftShift RightShift Igamma Igammac Zeta Polygamma ApproximateEqual AddN
    BiasAdd Complex""".split()
)
defreduction("Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "EuclideanNorm", "ArgMax", "ArgMin")
deflastaxis("Softmax", "LogSoftmax", "TopKV2", "InTopKV2", "L2Loss")
defbatchrows(
    *"""Conv2D Conv3D DepthwiseConv2dNative MaxPool MaxPoolV2 AvgPool MaxPool3D AvgPool3D
    FusedBatchNorm FusedBatchNormV2 FusedBatchNormV3 ResizeBilinear ResizeNearestNeighbor
    ResizeBicubic ResizeArea LRN SpaceToDepth DepthToSpace ExtractImagePatches
    ExtractVolumePatches Conv2DBackpropInput Conv3DBackpropInputV2 MatrixBandPart
    MatrixDiagPartV3 MatrixSetDiagV3 MatrixTranspose""".split()
)
# shapes and layouts
defop(["Transpose"], h.h_transpose)
defop(["ExpandDims"], h.h_expand_dims)
defop(["Squeeze"], h.h_squeeze)
defop(["Reshape"], h.h_reshape)
defop(["ConcatV2"], h.h_concat)
defop(["Pack"], h.h_pack)
defop(["Unpack"], h.h_unpack)
defop(["Split", "SplitV"], h.h_split)
defop(["Pad", "PadV2", "MirrorPad"], h.h_pad)
defop(["Tile"], h.h_tile)
defop(["BroadcastTo"], h.h_broadcast_to)
defop(["Slice", "StridedSlice"], h.h_slice)
defop(["SpaceToBatchND"], h.h_space_to_batch)
defop(["ImageProjectiveTransformV2", "ImageProjectiveTransformV3"], h.h_image_transform)
defop(["BatchToSpaceND"], h.h_batch_to_space)
defop(["IdentityN"], h.h_identity_n)
# along some axes
defalongaxes("Cumsum", "Cumprod", "CumulativeLogsumexp", "ReverseV2", axes_input=1)
defalongaxes("Roll", axes_input=2)
definnermost("FFT", "IFFT", "RFFT", "IRFFT", k=1)
definnermost("FFT2D", "IFFT2D", "RFFT2D", "IRFFT2D", k=2)
definnermost("FFT3D", "IFFT3D", "RFFT3D", "IRFFT3D", k=3)
# products
defop(["MatMul"], h.h_matmul)
defop(["BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"], h.h_batch_matmul)
defop(["Einsum"], h.h_einsum)
# selections and lookups
defop(["Select"], h.h_select)
defop(["GatherV2", "ResourceGather"], h.h_gather)
defop(["GatherNd"], h.h_gather_nd)
defop(["OneHot"], h.h_one_hot)
defop(["SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits"], h.h_cross_entropy)
# control flow and the lists it carries
defop(["TensorListFromTensor"], control.h_list_from_tensor)
defop(["TensorListGetItem"], control.h_list_get)
defop(["TensorListSetItem"], control.h_list_set)
defop(["TensorListPushBack"], control.h_list_push)
defop(["TensorListStack"], control.h_list_stack)
defop(["While", "StatelessWhile"], control.h_while)
defop(["PartitionedCall", "StatefulPartitionedCall"], control.h_call)
