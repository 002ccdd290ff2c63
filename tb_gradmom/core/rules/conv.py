"""Convolutions: ``Conv2D``, ``Conv3D`` (Keras Conv1D arrives as ``ExpandDims -> Conv2D``), grouped
(``groups=G``: the input has ``G`` times the filter's in-channels), ``DepthwiseConv2dNative``
(``DepthwiseConv2D``, the depthwise half of ``SeparableConv2D``), and the transposed
``Conv2DBackpropInput``/``Conv3DBackpropInputV2`` (``Conv1DTranspose`` to ``Conv3DTranspose``).
Keras wraps grouped convolutions in an XLA-compiled function call: see `tb_gradmom.core.rules.call`,
which reads the call's body and hands the same `ConvSpec` to `conv_contribution`.

The filter gradient of example ``j`` sums over output positions ``q``:
``g_j = sum_q u_{j,q} delta_{j,q}^T``, with ``u_{j,q}`` the (strided, dilated, padded) input patch
that output position ``q`` sees. Each kernel element belongs to one kernel offset, so for the
power sums (a variable with this one consumer) the rule takes a few offsets at a time: the
strided slices of the input that the offsets meet, side by side, one batched matmul with
``delta`` (positions summed inside it, per example), then the powers, summed over examples.
As many offsets per product as a share of the chunk's memory allows (one for big layers), and
at most two products in flight, bound memory. A 2-D convolution with one group, several kernel
offsets and a filter of at most `_NATIVE_MAX_ELEMENTS` elements, on a static batch, instead
takes each example's gradient from TensorFlow's own ``Conv2DBackpropFilter`` of that example
alone (`native_sums`): the same sum over positions, formed by the op's own kernel (not for a
dilated kernel: TF's CPU kernel has no dilation). With several consumers (or a dilated
convolution, which arrives as ``SpaceToBatchND``) the per-example gradients are built by im2col
for a chunk of examples. Raising patches and output gradients to the power first (as the TF1
code did) drops every cross term between positions and is wrong.

Groups. A filter ``[*k, c, o]`` on an input of ``G * c`` channels is ``G`` ordinary convolutions:
group ``h`` maps input channels ``[h c, (h + 1) c)`` to output channels ``[h o/G, (h + 1) o/G)``
with the filter's columns ``[h o/G, (h + 1) o/G)``. So the per-example gradient is the rule
above per group (the group is one more batch axis of the matmul). A depthwise filter
``[*k, C, m]`` is the grouped filter ``[*k, 1, C m]`` with ``G = C`` (same element order).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from tb_gradmom.core import axes as _axes
from tb_gradmom.core.rules.base import (
    UNROLL,
    Contribution,
    Count,
    Rule,
    RuleError,
    Site,
    constant,
    example_count,
    example_slice,
    norms_chunk,
    norms_over_chunks,
    norms_squared,
    power_sums_of,
    reshape,
    sq_norms_of,
    sum_over_chunks,
)

if TYPE_CHECKING:
    from tb_gradmom.core.axes import Examples

__all__ = [
    "CONV_RULE",
    "conv_rule",
    "conv_spec",
    "ConvSpec",
    "conv_contribution",
    "attr_str",
    "conv_batch_check",
    "grouped_hazard",
]

# Kernel offsets whose per-example work may be in flight at once in `power_sums`: offset k waits
# for the sums of offset k - _IN_FLIGHT. Bounds memory (a few slices and [n, c_in, c_out] blocks)
# while letting the executor overlap neighbours (measured: 1 is ~7 % slower on 3C3D, 2 or 3 are as
# fast as no chain; no chain lets every block of a layer be alive at once).
_IN_FLIGHT = 2
# Elements (per chunk) that the products of several kernel offsets may hold at once, at most:
# a quarter of the moments' 8M-element chunk budget, as several layers' sums run at the same
# time. ResNet50 (b16, 64x64): with the whole chunk budget, peak 1.50-1.59x the plain step's;
# with a quarter, 1.26-1.30x, as with one offset per product (1.27-1.33x).
_PRODUCT_ELEMENTS = 1 << 21
# A 2-D convolution's power sums by TensorFlow's own filter gradient, one example at a time
# (`conv_contribution`'s ``native``), for static batches of at most this many examples: one op
# per example, so a bigger batch takes the kernel offsets' products (a bounded number of ops).
_NATIVE_MAX_EXAMPLES = 128
# ... and for filters of at most this many elements: a bigger one's per-example gradients cost
# more to write and reduce than the products' (16 x 16x16, 3x3, 256 -> 256 channels: 69 against
# 61 ms; ResNet50's 3x3 filters of 256 and 512 channels took its moments step from 1.28x to
# 1.47x the plain step's, in chunks of one or two examples).
_NATIVE_MAX_ELEMENTS = 1 << 18


# The norms of a one-group filter take the unfolded input's slices channels-first for at most
# this many input channels (see `conv_contribution`'s ``unfolded_norms``).
_CHANNELS_FIRST_MAX = 32
# Tests: force the form of a convolution's norms ("ghost", "unfolded", "native" or
# "products"; the first two for one group only); None: `_norms_form`.
FORCE_NORMS_FORM: str | None = None


def _norms_form(positions: int | None, k_in: int, c_out: int) -> str:
    """``"ghost"`` when the Gram form's FLOPs per example, ``Q^2 (k_in + c_out)``, are below
    materialising ``U_j^T D_j``'s ``Q k_in c_out`` (``Q`` output positions, static), else
    ``"unfolded"`` (materialised by one batched matmul)."""
    if positions is not None and positions * (k_in + c_out) < k_in * c_out:
        return "ghost"
    return "unfolded"


def attr_str(op: tf.Operation, name: str) -> str:
    value = op.get_attr(name)
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class ConvSpec:
    """A channels-last convolution, as the rule sees it.

    Attributes:
      kernel_sizes: the spatial kernel sizes.
      filter_shape: the shape of the consumed filter tensor (the result is reshaped to it).
      groups: ``G``; the input has ``G * group_in`` channels, the output ``G * group_out``.
      group_in, group_out: channels per group (depthwise: 1 and the multiplier).
      strides, dilations: per spatial axis.
      padding: ``"VALID"``, ``"SAME"``, ``"EXPLICIT"`` (``explicit``: (before, after) per spatial
        axis) or ``"BEFORE"`` (``explicit``: (before, unused); after: as much as the output needs).
      blocks: rows per example of the convolution's batch (``SpaceToBatchND`` before it, the
        rows block-major), 1 otherwise.
      what: ``"{type} op '{name}'"`` for messages.
    """

    kernel_sizes: tuple
    filter_shape: tuple
    groups: int
    group_in: int
    group_out: int
    strides: tuple
    dilations: tuple
    padding: str
    explicit: tuple = ()
    blocks: int = 1
    what: str = "convolution"


# operands(delta, n, start, size) -> (x, d): for examples [start, start + size), the input of the
# convolution (unpadded, [rows, *in_spatial, G * group_in]) and the gradient of its output
# ([rows, *out_spatial, G * group_out]), in the moment dtype.
OperandsFn = Callable[[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor], tuple]


def _spatial_pads(spec: ConvSpec, in_sizes, out_sizes):
    """Per spatial axis (before, after) padding, as ints or scalar tensors."""
    nd = len(spec.kernel_sizes)
    if spec.padding == "VALID":
        return [(0, 0)] * nd
    if spec.padding == "EXPLICIT":
        return list(spec.explicit)
    if spec.padding in ("SAME", "BEFORE"):
        pads = []
        for i, (k, s, d, size, o) in enumerate(
            zip(spec.kernel_sizes, spec.strides, spec.dilations, in_sizes, out_sizes)
        ):
            need = (o - 1) * s + (k - 1) * d + 1 - size
            # static sizes: Python ints (no ops); else scalar tensors
            static = isinstance(need, int)
            total = max(need, 0) if static else tf.maximum(need, 0)
            if spec.padding == "SAME":
                before = total // 2
                pads.append((before, total - before))
            else:
                before = spec.explicit[i][0]
                after = total - before
                pads.append((before, max(after, 0) if static else tf.maximum(after, 0)))
        return pads
    raise RuleError(f"padding {spec.padding!r} is not supported")


def _dim(t: tf.Tensor, i: int):
    """Axis ``i`` of ``t``: a Python int when static (no op), else a scalar tensor."""
    if t.shape.rank is not None and t.shape[i] is not None:
        return int(t.shape[i])
    return tf.shape(t)[i]


def _shape(dims):
    """A shape argument from ints and scalar tensors (a constant when all are ints)."""
    if all(isinstance(v, int) for v in dims):
        return dims
    return tf.stack([tf.convert_to_tensor(v, tf.int32) for v in dims])


def _offsets_per_product(
    n_off: int, rows: int, budget: int, positions: int, c_in: int, c_out: int
) -> int:
    """Kernel offsets per batched matmul in a convolution's power sums (``groups == 1``): the
    most whose work for ``rows`` examples fits in ``budget`` elements. A product of ``k``
    offsets holds their slices, the slices side by side and ``[k c_in, c_out]`` per example
    (``_IN_FLIGHT`` products at once): fewer ops per layer for the same FLOPs (ResNet50's 7x7
    stem at batch 16: 5 products instead of 49)."""

    def elements(k: int) -> int:
        return min(_IN_FLIGHT, -(-n_off // k)) * k * (2 * positions * c_in + c_in * c_out)

    k = n_off
    while k > 1 and rows * elements(k) > budget:
        k -= 1
    return k


def conv_contribution(
    spec: ConvSpec,
    operands: OperandsFn,
    dtype: tf.DType,
    examples: tf.Tensor,
    evidence: str,
    positions: int,
    static_positions: int | None = None,
) -> Contribution:
    """The `Contribution` of a convolution's filter. ``positions``: output positions per row
    of the convolution's batch (an estimate if not static); ``static_positions`` the same when
    known at trace time (else None: the norms never take the Gram form)."""
    nd = len(spec.kernel_sizes)
    kernel_sizes = list(spec.kernel_sizes)
    strides, dilations = list(spec.strides), list(spec.dilations)
    groups, c_g, o_g = spec.groups, spec.group_in, spec.group_out
    c_in, c_out = groups * c_g, groups * o_g
    blocks = spec.blocks
    offsets = list(itertools.product(*[range(k) for k in kernel_sizes]))
    n_off = len(offsets)

    def padded(x, d):
        """``x`` padded as the op pads it, and the output's spatial sizes."""
        in_sizes = [_dim(x, 1 + i) for i in range(nd)]
        out_sizes = [_dim(d, 1 + i) for i in range(nd)]
        pads = _spatial_pads(spec, in_sizes, out_sizes)
        if any(
            not (isinstance(b, int) and b == 0 and isinstance(a, int) and a == 0) for b, a in pads
        ):
            paddings = [[0, 0]] + [[b, a] for b, a in pads] + [[0, 0]]
            if all(isinstance(v, int) for pair in paddings for v in pair):
                paddings = constant(paddings)
            x = tf.pad(x, paddings)
        return x, out_sizes

    def offset_slice(x, off, out_sizes, channels_first=False):
        """The inputs that kernel offset ``off`` meets at every output position (``x``
        channels-last, or ``[rows, channels, *spatial]`` with ``channels_first``)."""
        lead = [0, 0] if channels_first else [0]
        tail = [] if channels_first else [0]
        begin = lead + [o * dil for o, dil in zip(off, dilations)] + tail
        spatial = [
            o * dil + (q - 1) * s + 1 for o, dil, q, s in zip(off, dilations, out_sizes, strides)
        ]
        if channels_first:
            end = [_dim(x, 0), _dim(x, 1), *spatial]
            steps = [1, 1, *strides]
        else:
            end = [_dim(x, 0), *spatial, _dim(x, -1)]
            steps = [1, *strides, 1]
        static = all(isinstance(e, int) for e in end)
        if static and all(b == 0 for b in begin) and all(st == 1 for st in strides):
            if list(end) == [_dim(x, i) for i in range(nd + 2)]:
                return x  # the whole input (a 1x1 kernel, stride 1, no padding)
        if static:
            return tf.strided_slice(x, constant(begin), constant(end), constant(steps))
        return tf.strided_slice(x, begin, end, steps)

    def per_example(delta: tf.Tensor, n: Count, start: Count, size: Count) -> tf.Tensor:
        x, d = operands(delta, n, start, size)
        x, out_sizes = padded(x, d)
        u = tf.stack([offset_slice(x, off, out_sizes) for off in offsets], axis=-2)
        rows_n = _dim(u, 0)
        if groups == 1:  # [rows, Q, K * c_in] with [rows, Q, c_out]
            u = reshape(u, [rows_n, -1, n_off * c_in])
            g = tf.einsum("nqk,nqo->nko", u, reshape(d, [rows_n, -1, c_out]))
        elif c_g == 1:  # depthwise: [rows, Q, K, G] with [rows, Q, G, o_g]
            u = reshape(u, [rows_n, -1, n_off, groups])
            d = reshape(d, [rows_n, -1, groups, o_g])
            g = tf.einsum("nqkg,nqgo->nkgo", u, d)
        else:  # [rows, Q, K, G, c_g] with [rows, Q, G, o_g] -> the filter's [K, c_g, G, o_g]
            u = reshape(u, [rows_n, -1, n_off, groups, c_g])
            d = reshape(d, [rows_n, -1, groups, o_g])
            g = tf.einsum("nqkgc,nqgo->nkcgo", u, d)
        if blocks > 1:
            g = tf.reduce_sum(reshape(g, [blocks, -1, n_off * c_g * c_out]), axis=0)
        return reshape(g, [-1, *spec.filter_shape])

    # A depthwise filter (one input channel per group) with equal strides and no dilation in 2-D:
    # the examples' gradients come from one native depthwise filter gradient with the examples
    # folded into the channels (input channel (j, c) is example j's channel c, and its outputs
    # are example j's outputs c * o_g + m), instead of one slice and product per kernel offset.
    # Same numbers, one op instead of ~10 per offset (a 7x7 kernel: 49 offsets), which keeps
    # graphs with many separable convolutions (NASNet, EfficientNet) small.
    native_depthwise = (
        nd == 2 and c_g == 1 and strides[0] == strides[1] and all(d == 1 for d in dilations)
    )

    # A 2-D convolution with several kernel offsets and one group: each example's filter
    # gradient is TensorFlow's own `Conv2DBackpropFilter` of that example's (padded) input and
    # output gradient, one op per example, stacked [rows, K c_in, c_out] (the filter's order),
    # then the powers summed. The op forms the patches itself, block by block, with no slice or
    # product per offset: on this project's 2-core CPU it takes 1.0-1.3x the time of the
    # batch's filter gradient, where the offsets' products took 1.3-2.7x (16 x 45x45, 3x3, 32
    # -> 64 channels: 20.6 against 51.9 ms, batch gradient 19.4; a 1x1 kernel is one product
    # already and keeps it). Memory: the chunk's stacked gradients, at most a quarter of the
    # chunk budget (`power_sums_elements` below).
    native_elements = n_off * c_in * c_out  # one example's gradient
    native = (
        nd == 2
        and groups == 1
        and blocks == 1
        and n_off > 1
        and native_elements <= _NATIVE_MAX_ELEMENTS
        # TF's CPU kernel has no dilation (a raw tf.nn.conv2d with dilations=2 reaches here;
        # Keras' dilated Conv2D arrives as SpaceToBatchND, blocks > 1)
        and all(dl == 1 for dl in dilations)
    )

    def native_sums(x, d, orders):
        """{p: [K c_in, c_out]} for the ``rows`` examples of ``x`` (padded) and ``d``, a
        static number; None when it is not (a chunk inside a traced loop)."""
        g = native_gradients(x, d)
        if g is None:
            return None
        return norms_squared(power_sums_of(g, orders, unsquared=True), orders)

    def native_gradients(x, d):
        """``[rows, K c_in, c_out]``: the per-example filter gradients of `native_sums`, or
        None."""
        rows_n = _dim(d, 0)
        if not isinstance(rows_n, int):
            return None
        # the input's extent that the output positions reach (padding may leave a row more)
        ends = [
            (q - 1) * st + (k - 1) * dil + 1
            for q, st, k, dil in zip(
                [_dim(d, 1 + i) for i in range(nd)], strides, kernel_sizes, dilations
            )
        ]
        if not all(isinstance(e, int) for e in ends):
            return None
        # (a spatial size of x not known at trace time is cropped all the same: no compare)
        if any(not isinstance(h, int) or h != e for h, e in zip(x.shape[1:-1], ends)):
            x = x[:, : ends[0], : ends[1], :]
        xs = tf.split(x, rows_n, axis=constant(0)) if rows_n > 1 else [x]
        ds = tf.split(d, rows_n, axis=constant(0)) if rows_n > 1 else [d]
        sizes = constant([*kernel_sizes, c_in, c_out])
        g = tf.stack(
            [
                tf.raw_ops.Conv2DBackpropFilter(
                    input=xj,
                    filter_sizes=sizes,
                    out_backprop=dj,
                    strides=[1, *strides, 1],
                    padding="VALID",
                    dilations=[1, *dilations, 1],
                )
                for xj, dj in zip(xs, ds)
            ]
        )
        return reshape(g, [rows_n, n_off * c_in, c_out])

    # The per-offset sums as each case's product leaves them, concatenated (groups == 1) or
    # stacked over the offsets (the filter's order but for the grouped case's transpose; one
    # reshape at the end, none per offset): [K c_in, c_out], [K, G], [K, G, 1, o_g] or
    # [K, G, c_g, o_g].
    if groups == 1:  # offsets in products of several (see `offset_sums`): [K * c_in, c_out]
        sums_shape = [n_off * c_in, c_out]
    elif c_g == 1 and o_g == 1:
        sums_shape = [n_off, groups]
    elif c_g == 1:
        sums_shape = [n_off, groups, 1, o_g]
    else:
        sums_shape = [n_off, groups, c_g, o_g]

    def depthwise_sums(x, d, orders):
        sums = power_sums_of(depthwise_gradients(x, d), orders)
        return {p: reshape(sums[p], sums_shape) for p in orders}

    def depthwise_gradients(x, d):
        """``[rows, K, G, o_g]``: the per-example filter gradients of a depthwise filter."""
        rows_n = _dim(d, 0)
        xs = [1, _dim(x, 1), _dim(x, 2), rows_n * groups]
        ds = [1, _dim(d, 1), _dim(d, 2), rows_n * c_out]
        xf = reshape(tf.transpose(x, [1, 2, 0, 3]), _shape(xs))
        df = reshape(tf.transpose(d, [1, 2, 0, 3]), _shape(ds))
        g = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=xf,
            filter_sizes=_shape([kernel_sizes[0], kernel_sizes[1], rows_n * groups, o_g]),
            out_backprop=df,
            strides=[1, strides[0], strides[1], 1],
            padding="VALID",
        )
        # [kh, kw, rows * G, o_g] -> [rows, K, G, o_g]
        return tf.transpose(reshape(g, [n_off, rows_n, groups, o_g]), [1, 0, 2, 3])

    def offset_sums(delta, n, start, size, orders, per_product=1, native_chunk=False):
        """{p: sums_shape}: sums of g**p over examples [start, start + size), per offset.
        ``per_product``: offsets whose gradients one batched matmul gives (``groups == 1``);
        ``native_chunk``: by `native_sums` where the chunk's size is static."""
        x, d = operands(delta, n, start, size)
        x, out_sizes = padded(x, d)
        if native_depthwise:
            return depthwise_sums(x, d, orders)
        if native_chunk:
            out = native_sums(x, d, orders)
            if out is not None:
                return out
        sums: dict[int, list] = {p: [] for p in orders}

        def reduce(g, first, count):
            # order 2 as norms, squared once for every product below
            g_sums = power_sums_of(g, orders, unsquared=True)
            for p in orders:
                sums[p].append(g_sums[p])  # no reshape per product
            return [sums[p][-1] for p in orders]

        products(x, d, out_sizes, per_product, reduce)
        if groups == 1:  # [k * c_in, c_out] per product -> [K * c_in, c_out]
            out = {p: v[0] if len(v) == 1 else tf.concat(v, 0) for p, v in sums.items()}
        else:
            out = {p: tf.stack(v) for p, v in sums.items()}
        return norms_squared(out, orders)

    def products(x, d, out_sizes, per_product, reduce):
        """The per-example filter gradients of ``per_product`` kernel offsets at a time
        (``groups == 1``; else one), ``g`` in the layout of `sums_shape`'s rows for offsets
        ``[first, first + count)``, each handed to ``reduce(g, first, count)``, whose returned
        tensors the product ``_IN_FLIGHT`` later waits for."""
        rows_n = _dim(d, 0)
        if groups == 1:
            d3 = reshape(d, [rows_n, -1, c_out])
        elif c_g == 1 and o_g == 1:
            d3 = reshape(d, [rows_n, -1, groups])
        else:  # [rows, G, Q, o_g]
            d3 = tf.transpose(reshape(d, [rows_n, -1, groups, o_g]), [0, 2, 1, 3])
        done = []  # per product, what `reduce` made of it
        step = per_product if groups == 1 else 1
        for k, first in enumerate(range(0, n_off, step)):
            prev = done[k - _IN_FLIGHT] if k >= _IN_FLIGHT else []
            with tf.control_dependencies(prev):  # bounded memory, see _IN_FLIGHT
                slices = [offset_slice(x, off, out_sizes) for off in offsets[first : first + step]]
            if groups == 1:
                # the offsets' slices side by side: [rows, Q, k * c_in], the filter's order
                x_off = slices[0] if len(slices) == 1 else tf.concat(slices, axis=-1)
                x_off = reshape(x_off, [rows_n, -1, len(slices) * c_in])
                g = tf.linalg.matmul(x_off, d3, transpose_a=True)  # [rows, k * c_in, c_out]
            elif c_g == 1 and o_g == 1:
                (x_off,) = slices
                # A multiply and a sum over positions. Measured on the offset loop alone: 8.5x
                # faster than einsum("nqc,nqcm->ncm") (16 x 32x32x64, 7x7), 4x faster than a
                # [1, Q] x [Q, 1] matmul per example and channel (16 x 32x32x32, 5x5); with a
                # multiplier of 2 or more the matmul below is the fastest of the three.
                g = tf.reduce_sum(reshape(x_off, [rows_n, -1, groups]) * d3, axis=1)
            elif c_g == 1:
                x_off = tf.transpose(reshape(slices[0], [rows_n, -1, groups]), [0, 2, 1])
                g = tf.linalg.matmul(x_off[:, :, None, :], d3)  # [rows, G, 1, o_g]
            else:
                x_off = tf.transpose(reshape(slices[0], [rows_n, -1, groups, c_g]), [0, 2, 1, 3])
                g = tf.linalg.matmul(x_off, d3, transpose_a=True)  # [rows, G, c_g, o_g]
            done.append(reduce(g, first, len(slices)))

    # Per example, an offset's slice and its gradient, two offsets in flight, and a grouped
    # filter's output gradient regrouped once per chunk. A 1x1 kernel has one offset, but is
    # counted twice all the same: counted once, its bigger chunks raised EfficientNetB0's peak
    # (b16, 64x64) from 205-214 to 224-227 MB (plain 155 MB), for 500 ops fewer in ResNet50.
    elements_per_example = _IN_FLIGHT * (positions * c_in + c_g * c_out) + (
        positions * c_out if groups > 1 else 0
    )

    def use_native(n: Count, chunk: int | None) -> bool:
        """`native_sums` for a static batch of at most `_NATIVE_MAX_EXAMPLES` whose chunks
        have static sizes (one call, or chunks that `sum_over_chunks` unrolls)."""
        n_static = tf.get_static_value(n)
        if not native or n_static is None or int(n_static) > _NATIVE_MAX_EXAMPLES:
            return False
        return chunk is None or -(-int(n_static) // chunk) <= UNROLL

    def per_product(n: Count, chunk: int | None) -> int:
        # one offset per product for a grouped filter or a batch not known at trace time
        if groups != 1 or n_off == 1 or chunk is None:
            return 1
        n_static = tf.get_static_value(n)
        if n_static is None:
            return 1
        count = -(-int(n_static) // chunk)
        rows = -(-int(n_static) // count)  # examples in the largest chunk
        return _offsets_per_product(
            n_off,
            rows,
            min(chunk * elements_per_example, _PRODUCT_ELEMENTS),
            positions,
            c_in,
            c_out,
        )

    def power_sums(
        delta: tf.Tensor, n: Count, orders: tuple[int, ...], chunk: int | None = None
    ) -> dict[int, tf.Tensor]:
        """{p: sum_j g_j**p} for orders that may include 1, in chunks of examples."""
        orders = tuple(sorted(orders))
        offsets_per_product = per_product(n, chunk)
        native_chunk = use_native(n, chunk)
        sums = sum_over_chunks(
            n,
            chunk,
            orders,
            sums_shape,
            dtype,
            lambda start, size: offset_sums(
                delta, n, start, size, orders, offsets_per_product, native_chunk
            ),
            name="conv_chunks",
            unroll=UNROLL,
        )
        out = {}
        for p, v in sums.items():
            if groups > 1 and c_g > 1:  # the filter's order: [K, c_g, G, o_g]
                v = tf.transpose(reshape(v, [n_off, groups, c_g, o_g]), [0, 2, 1, 3])
            out[p] = reshape(v, spec.filter_shape)
        return out

    def shift_blocks(shift):
        """The shift (the filter's shape) in the layout of `sums_shape`: per offset first."""
        if groups > 1 and c_g > 1:  # [K, c_g, G, o_g] -> [K, G, c_g, o_g]
            return tf.transpose(reshape(shift, [n_off, c_g, groups, o_g]), [0, 2, 1, 3])
        return reshape(shift, sums_shape)

    def sq_norms(
        delta: tf.Tensor, n: Count, shift: tf.Tensor | None, chunk: int | None = None
    ) -> tf.Tensor:
        """``||g_j + C||^2`` from the per-example gradients the power sums build: the kernel
        offsets' blocks partition the filter, so the squared norm is the blocks' sum."""
        return norms_and_sum(delta, n, shift, chunk, False)[0]

    def sq_norms_and_sum(
        delta: tf.Tensor, n: Count, shift: tf.Tensor | None, chunk: int | None = None
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """`sq_norms` and ``sum_j g_j`` (the filter's shape), from the same blocks."""
        return norms_and_sum(delta, n, shift, chunk, True)

    # A one-group filter's norms (and sum) from the unfolded input (im2col): per example
    # U_j [Q, K c_in], the K offsets' slices side by side (the filter's order), and D_j
    # [Q, c_out], so g_j = U_j^T D_j. By the FLOPs per example (`_norms_form`): the Gram
    # ("ghost") form ||g_j||^2 = <U_j U_j^T, D_j D_j^T> (2 Q^2 (K c_in + c_out)) when Q is
    # static and that is below materialising g_j by one batched matmul (2 Q K c_in c_out); the
    # filter's sum is then one matmul of every example's rows, U^T D. With few input channels
    # the slices are taken channels-first ([rows, c_in, K, Q]: long contiguous rows instead
    # of c_in floats at a time). Either way no separate filter gradient runs. On 3C3D (b64),
    # one interleaved run (ms): 5x5x3->64 on 32x32 (channels-first) 11.1 against 16.7 for
    # TF's per-example filter gradients (`native_gradients`), 3x3x64->96 on 14x14
    # (materialised) 18.0 against 26.6, 3x3x96->128 on 6x6 (Gram) 9.7 against 27.8; TF's
    # batch filter gradients 9.6, 11.6, 6.9 (benchmarks/README.md, bench_norms).
    def norms_form() -> str:
        if FORCE_NORMS_FORM is not None:
            forced = FORCE_NORMS_FORM
            if forced in ("ghost", "unfolded") and groups != 1:
                return "native" if native_depthwise else "products"
            return forced
        if groups != 1:
            return "native" if native_depthwise else "products"
        return _norms_form(static_positions, n_off * c_in, c_out)

    def unfolded_elements(form: str) -> int:
        """Per example: the unfolded input (twice with a channels-first copy) and the Gram
        matrices or the per-example gradient."""
        unfold = positions * n_off * c_in * (2 if c_in <= _CHANNELS_FIRST_MAX else 1)
        if form == "ghost":
            return unfold + 2 * positions * positions + positions * c_out
        return unfold + n_off * c_in * c_out

    def unfold(x, out_sizes, channels_first=False):
        """The offsets' slices stacked before the channels (after them channels-first): one
        slice, no copy, for a 1x1 kernel."""
        slices = [offset_slice(x, off, out_sizes, channels_first) for off in offsets]
        if len(slices) == 1:
            return tf.expand_dims(slices[0], constant(2 if channels_first else -2))
        return tf.stack(slices, axis=2 if channels_first else -2)

    def unfolded_norms(x, d, out_sizes, c, with_sum, ghost):
        """``([rows] ||g_j + C||^2, sum_j g_j [K c_in, c_out] or None)`` for the rows of ``x``
        (padded) and ``d`` (see above)."""
        rows_n = _dim(d, 0)
        k_in = n_off * c_in
        d3 = reshape(d, [rows_n, -1, c_out])
        if ghost:
            u = reshape(unfold(x, out_sizes), [rows_n, -1, k_in])  # [rows, Q, K c_in]
            grams = tf.linalg.matmul(u, u, transpose_b=True) * tf.linalg.matmul(
                d3, d3, transpose_b=True
            )
            norms = tf.reduce_sum(grams, axis=constant([1, 2]))
            if c is not None:  # + 2 <g_j, C> + ||C||^2, <g_j, C> = sum_q (U_j C)_q . D_{j,q}
                uc = reshape(tf.linalg.matmul(reshape(u, [-1, k_in]), c), [rows_n, -1, c_out])
                norms += 2.0 * tf.reduce_sum(uc * d3, axis=constant([1, 2]))
                norms += tf.reduce_sum(tf.square(c))
            total = None
            if with_sum:
                total = tf.linalg.matmul(
                    reshape(u, [-1, k_in]), reshape(d3, [-1, c_out]), transpose_a=True
                )
            return norms, total
        if c_in <= _CHANNELS_FIRST_MAX and n_off > 1:  # (a 1x1 kernel: x itself, no copy)
            # [rows, c_in, *spatial]; the slices stacked [rows, c_in, K, *out]: [c_in K, c_out]
            xt = tf.transpose(x, [0, nd + 1, *range(1, nd + 1)])
            u = unfold(xt, out_sizes, channels_first=True)
            g = tf.linalg.matmul(reshape(u, [rows_n, k_in, -1]), d3)  # [rows, c_in K, c_out]

            def filter_order(t):  # [c_in K, c_out] -> [K c_in, c_out]
                return reshape(
                    tf.transpose(reshape(t, [c_in, n_off, c_out]), [1, 0, 2]), [k_in, c_out]
                )

            cg = None
            if c is not None:
                cg = reshape(
                    tf.transpose(reshape(c, [n_off, c_in, c_out]), [1, 0, 2]), [k_in, c_out]
                )
        else:
            u = reshape(unfold(x, out_sizes), [rows_n, -1, k_in])
            g = tf.linalg.matmul(u, d3, transpose_a=True)  # [rows, K c_in, c_out]

            def filter_order(t):
                return t

            cg = c
        total = filter_order(tf.reduce_sum(g, axis=constant(0))) if with_sum else None
        # one pass, no squared copy of the [rows, K c_in, c_out] gradients: the Euclidean
        # norms, squared (float32: 1.3e-7 relative against 6.6e-8 for the sum of squares,
        # 0.5 against 1.3 ms on 3C3D's second layer, b64, measured)
        g = g if cg is None else g + cg
        norms = tf.math.reduce_euclidean_norm(reshape(g, [rows_n, -1]), axis=constant(1))
        return tf.square(norms), total

    def norms_and_sum(delta, n, shift, chunk, with_sum):
        """``([n] norms, the filter's sum or None)``; with the sum, one chunk's norms and its
        sum travel as one vector (`norms_over_chunks` sums the chunks' vectors)."""
        size_sum = int(np.prod(spec.filter_shape)) if with_sum else 0
        form = norms_form()
        if form in ("ghost", "unfolded"):
            chunk = norms_chunk(chunk, unfolded_elements(form))
        else:
            chunk = norms_chunk(
                chunk,
                max(elements_per_example, 4 * native_elements) if native else elements_per_example,
            )
        offsets_per_product = per_product(n, chunk)
        native_chunk = form == "native" and use_native(n, chunk)
        c = None if shift is None else shift_blocks(shift)

        def chunk_work(start: Count, size: Count) -> tuple[tf.Tensor, tf.Tensor | None]:
            x, d = operands(delta, n, start, size)
            x, out_sizes = padded(x, d)
            if form in ("ghost", "unfolded"):
                return unfolded_norms(x, d, out_sizes, c, with_sum, form == "ghost")
            g = None
            if native_depthwise:  # [rows, K, G, o_g], the filter's order
                g = depthwise_gradients(x, d)
                cg = None if c is None else reshape(c, [n_off, groups, o_g])
            elif native_chunk:  # [rows, K c_in, c_out], the filter's order
                g = native_gradients(x, d)
                cg = c
            if g is not None:
                total = tf.reduce_sum(g, axis=constant(0)) if with_sum else None
                return sq_norms_of(g if cg is None else g + cg), total
            parts, sums = [], []

            def reduce(g, first, count):
                if with_sum:
                    sums.append(tf.reduce_sum(g, axis=constant(0)))
                if c is not None:
                    if groups == 1:
                        g = g + c[first * c_in : (first + count) * c_in]
                    else:
                        g = g + c[first]
                parts.append(sq_norms_of(g))
                return parts[-1:]

            products(x, d, out_sizes, offsets_per_product, reduce)
            norms = parts[0] if len(parts) == 1 else tf.add_n(parts)
            if not with_sum:
                return norms, None
            if groups == 1:  # [k * c_in, c_out] per product -> [K * c_in, c_out]
                return norms, sums[0] if len(sums) == 1 else tf.concat(sums, 0)
            stacked = tf.stack(sums)  # [K, G, ...] -> the filter's order
            if c_g > 1:
                stacked = tf.transpose(reshape(stacked, [n_off, groups, c_g, o_g]), [0, 2, 1, 3])
            return norms, stacked

        if not with_sum:
            norms = norms_over_chunks(
                n, chunk, dtype, lambda s, k: chunk_work(s, k)[0], name="conv_norm_chunks"
            )
            return norms, None

        # per chunk one vector: its examples' norms in their place among n, then its sum
        n_static = tf.get_static_value(n)
        if chunk is None or (n_static is not None and int(n_static) <= chunk):
            norms, total = chunk_work(0, n)
            both = tf.concat([norms, reshape(total, [-1])], 0)
        else:
            count = int(n_static) if n_static is not None else n

            def chunk_vector(start: Count, size: Count) -> dict[int, tf.Tensor]:
                norms, total = chunk_work(start, size)
                pads = tf.reshape(
                    tf.cast(tf.stack([start, count - start - size]), tf.int32), [1, 2]
                )
                return {0: tf.concat([tf.pad(norms, pads), reshape(total, [-1])], 0)}

            length = (
                count + size_sum if isinstance(count, int) else tf.reshape(count + size_sum, [1])
            )
            both = sum_over_chunks(
                n,
                chunk,
                (0,),
                [length] if isinstance(length, int) else length,
                dtype,
                chunk_vector,
                name="conv_norm_chunks",
                unroll=UNROLL,
            )[0]
        norms, total = both[:-size_sum], both[-size_sum:]
        return norms, reshape(total, spec.filter_shape)

    elements = blocks * (positions * n_off * c_in + n_off * c_g * c_out)
    return Contribution(
        examples=examples,
        evidence=evidence,
        per_example=per_example,
        per_example_elements=int(elements),
        # SpaceToBatch (dilated) convolutions keep the im2col path.
        power_sums=power_sums if blocks == 1 else None,
        # native: a chunk's stacked gradients take at most a quarter of the chunk budget
        power_sums_elements=int(
            max(elements_per_example, 4 * native_elements) if native else elements_per_example
        ),
        gradient_from_sums=blocks == 1,
        # SpaceToBatch (dilated) convolutions: their per-example gradients, materialised
        sq_norms=sq_norms if blocks == 1 else None,
        sq_norms_and_sum=sq_norms_and_sum if blocks == 1 else None,
    )


def conv_spec(op: tf.Operation, kshape: tf.TensorShape, blocks: int = 1) -> ConvSpec:
    """The `ConvSpec` of ``Conv2D``, ``Conv3D``, ``DepthwiseConv2dNative`` or a transposed
    convolution ``op`` whose filter has the static shape ``kshape`` (``blocks`` rows per
    example); `RuleError` for what the rule does not cover (channels-first, a strided batch,
    channels that do not form groups). Shared with the loop rule
    (`tb_gradmom.core.rules.loops`: a convolution inside a ``while`` loop)."""
    what = f"{op.type} op '{op.name}'"
    # A transposed convolution z = conv_transpose(x, W) (Conv2DBackpropInput: input sizes,
    # filter, x) is the input-gradient of the conv x = conv(z, W): its filter gradient pairs
    # the patches of dL/dz with x, exactly as a conv pairs the patches of its input with dL/dx.
    transposed = op.type in ("Conv2DBackpropInput", "Conv3DBackpropInputV2")
    fmt = attr_str(op, "data_format")
    if fmt not in ("NHWC", "NDHWC"):
        raise RuleError(f"data_format {fmt} is not supported (only channels-last)")
    nd = kshape.rank - 2
    # Filter [*kernel, c_in, c_out], or for a depthwise conv [*kernel, c_in, multiplier] with
    # c_in * multiplier output channels (channel c's m-th output is channel c * mult + m).
    depthwise = op.type == "DepthwiseConv2dNative"
    f_in, f_last = int(kshape[nd]), int(kshape[nd + 1])
    x_in = op.inputs[2 if transposed else 0]  # the tensor whose channels meet the filter's f_in
    channels = x_in.shape[-1] if x_in.shape.rank is not None else None
    if depthwise:
        groups, group_in, group_out = f_in, 1, f_last
    else:
        if transposed:  # the transposed op's input meets the filter's last axis
            if channels is not None and channels != f_last:
                raise RuleError(
                    f"grouped transposed convolution (input channels {channels}, filter "
                    f"{kshape.as_list()}) is not supported"
                )
            groups = 1
        elif channels is None:
            raise RuleError(
                "the input's channel count is not static (needed to tell a grouped convolution)"
            )
        elif channels % f_in or f_last % (channels // f_in):
            raise RuleError(
                f"input channels {channels} and filter {kshape.as_list()} do not form groups"
            )
        else:
            groups = channels // f_in
        group_in, group_out = f_in, f_last // groups
    strides = list(op.get_attr("strides"))
    dilations = list(op.get_attr("dilations"))
    if strides[0] != 1 or strides[-1] != 1 or dilations[0] != 1 or dilations[-1] != 1:
        raise RuleError("strides or dilations over the batch or channel axis are not supported")
    padding = attr_str(op, "padding")
    explicit: tuple[tuple[int, int], ...] = ()
    if padding == "EXPLICIT":
        flat = list(op.get_attr("explicit_paddings"))
        explicit = tuple((flat[2 * i], flat[2 * i + 1]) for i in range(len(flat) // 2))[1 : 1 + nd]
    return ConvSpec(
        kernel_sizes=tuple(int(k) for k in kshape[:nd]),
        filter_shape=tuple(int(k) for k in kshape),
        groups=groups,
        group_in=group_in,
        group_out=group_out,
        strides=tuple(strides[1:-1]),
        dilations=tuple(dilations[1:-1]),
        padding=padding,
        explicit=explicit,
        blocks=blocks,
        what=what,
    )


def conv_rule(site: Site) -> Contribution:
    """The rule for ``Conv2D``, ``Conv3D`` and ``DepthwiseConv2dNative`` filters."""
    op = site.op
    what = f"{op.type} op '{op.name}'"
    if site.index != 1:
        raise RuleError("the variable is the convolution's input, not its filter")
    transposed = op.type in ("Conv2DBackpropInput", "Conv3DBackpropInputV2")
    fmt = attr_str(op, "data_format")
    if fmt not in ("NHWC", "NDHWC"):
        raise RuleError(f"data_format {fmt} is not supported (only channels-last)")
    kshape = site.view.shape
    if not kshape.is_fully_defined():
        raise RuleError("the filter shape is not static")
    x_in = op.inputs[2 if transposed else 0]
    # Dilated convolutions on CPU arrive as SpaceToBatchND -> conv -> BatchToSpaceND: the conv's
    # batch holds `blocks` rows per example, block-major (row b * n + j belongs to example j).
    blocks, batch_source = 1, x_in
    src = op.inputs[0]
    while src.op.type in ("ExpandDims", "Identity"):
        src = src.op.inputs[0]
    if src.op.type == "SpaceToBatchND":
        block_shape = tf.get_static_value(src.op.inputs[1])
        if block_shape is None:
            raise RuleError("the SpaceToBatchND block shape before the convolution is not static")
        blocks = int(np.prod(block_shape))
        batch_source = src.op.inputs[0]
    spec = conv_spec(op, kshape, blocks)

    def rows(t, n, start, size):
        if blocks == 1:
            return example_slice(t, start, size)  # the tensor itself for the whole batch
        t = reshape(t, tf.concat([[blocks, n], tf.shape(t)[1:]], 0))[:, start : start + size]
        return reshape(t, tf.concat([[-1], tf.shape(t)[2:]], 0))

    def operands(delta, n, start, size):
        """(the conv's input, the gradient of its output) for examples [start, start + size)."""
        if transposed:
            x = tf.cast(rows(op.inputs[2], n, start, size), site.dtype)  # slice, then cast
            return rows(delta, n, start, size), x
        x = tf.cast(rows(op.inputs[0], n, start, size), site.dtype)
        return x, rows(delta, n, start, size)

    positions = 1
    out_spatial = (op.inputs[2] if transposed else op.outputs[0]).shape[1:-1]
    for s in out_spatial:
        positions *= s if s is not None else 1024
    contribution = conv_contribution(
        spec,
        operands,
        site.dtype,
        examples=example_count(batch_source, 0),
        evidence=f"the batch axis of the input of {what}",
        positions=positions,
        static_positions=positions if all(s is not None for s in out_spatial) else None,
    )
    if op.type not in _FILTER_GRADIENTS:
        return contribution
    return replace(contribution, plain_gradient=lambda dz: _filter_gradient(op, dz))


# The filter gradients TensorFlow registers for these ops (its nn_grad), the `plain_gradient`
# of their filter (input 1): per op, the raw gradient op and the attributes it takes from the
# forward op. The transposed convolutions have none here: their filter is deferred nowhere.
_FILTER_GRADIENTS = {
    "Conv2D": (
        tf.raw_ops.Conv2DBackpropFilter,
        ("strides", "use_cudnn_on_gpu", "padding", "explicit_paddings", "data_format", "dilations"),
    ),
    "DepthwiseConv2dNative": (
        tf.raw_ops.DepthwiseConv2dNativeBackpropFilter,
        ("strides", "padding", "explicit_paddings", "data_format", "dilations"),
    ),
    "Conv3D": (
        tf.raw_ops.Conv3DBackpropFilterV2,
        ("strides", "padding", "data_format", "dilations"),
    ),
}


def _filter_gradient(op: tf.Operation, dz: tf.Tensor) -> tf.Tensor:
    """TensorFlow's filter gradient of the convolution ``op`` from its output gradient ``dz``."""
    raw, attrs = _FILTER_GRADIENTS[op.type]
    return raw(
        input=op.inputs[0],
        filter_sizes=tf.shape(op.inputs[1]),
        out_backprop=dz,
        **{a: op.get_attr(a) for a in attrs},
    )


_TRANSPOSED = ("Conv2DBackpropInput", "Conv3DBackpropInputV2")


def conv_batch_check(op: tf.Operation, index: int, ex: Examples) -> str | None:
    """Why the conv rule must not fire at ``op`` (its batch axis not proven to be the
    examples, alone or as SpaceToBatchND's blocks x examples), or None (`Rule.precheck`)."""
    src = op.inputs[2] if op.type in _TRANSPOSED else op.inputs[0]
    while src.op.type in ("ExpandDims", "Identity"):
        src = src.op.inputs[0]
    if src.op.type == "SpaceToBatchND":
        src = src.op.inputs[0]
    st = ex.of(src)
    if isinstance(st, _axes.Axis) and st.axis == 0 and st.pure:  # of any batch (a union too)
        return None
    why = f" (stopped at {ex.why(src)})" if st == _axes.UNKNOWN else ""
    return (
        f"the batch axis of '{src.name}', the input of {op.type} op '{op.name}', is not proven "
        f"to hold the examples alone: {_axes.describe(st)}{why}"
    )


def grouped_hazard(op: tf.Operation, depth: int) -> str | None:
    """A grouped ``Conv2D``/``Conv3D`` (the input has more channels than the filter's
    in-channels): ``pfor`` vectorises its filter gradient wrongly (`Rule.vectorisation_hazard`)."""
    if op.type in ("Conv2D", "Conv3D") and len(op.inputs) >= 2:
        c_in, k_in = op.inputs[0].shape[-1], op.inputs[1].shape[-2]
        if c_in is None or k_in is None or c_in != k_in:
            return "a grouped convolution, whose filter gradient pfor vectorises wrongly"
    return None


CONV_RULE = Rule(
    "conv",
    ops=("Conv2D", "Conv3D", "DepthwiseConv2dNative", *_TRANSPOSED),
    contribution=conv_rule,
    precheck=conv_batch_check,
    vectorisation_hazard=grouped_hazard,
)
