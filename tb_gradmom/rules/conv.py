"""Convolutions: ``Conv2D``, ``Conv3D`` (Keras Conv1D arrives as ``ExpandDims -> Conv2D``) and
``DepthwiseConv2dNative`` (``DepthwiseConv2D``, the depthwise half of ``SeparableConv2D``), and
the transposed ``Conv2DBackpropInput``/``Conv3DBackpropInputV2`` (``Conv1DTranspose`` to
``Conv3DTranspose``).

The filter gradient of example ``j`` sums over output positions ``q``:
``g_j = sum_q u_{j,q} delta_{j,q}^T``, with ``u_{j,q}`` the (strided, dilated, padded) input patch
that output position ``q`` sees. Each kernel element belongs to one kernel offset, so for the
power sums (a variable with this one consumer) the rule takes one offset at a time: the strided
slice of the input that the offset meets, one batched matmul with ``delta`` (positions summed
inside it, per example), then the powers, summed over examples. Holding at most two offsets in
flight bounds memory. With several consumers (or a dilated convolution, which arrives as
``SpaceToBatchND``) the per-example gradients are built by im2col for a chunk of examples.
Raising patches and output gradients to the power first (as the TF1 code did) drops every
cross term between positions and is wrong.
"""

from __future__ import annotations

import itertools

import numpy as np
import tensorflow as tf

from tb_gradmom.rules.base import Contribution, RuleError, Site, power_sum, sum_over_chunks

__all__ = ["conv_rule"]

# Kernel offsets whose per-example work may be in flight at once in `power_sums`: offset k waits
# for the sums of offset k - _IN_FLIGHT. Bounds memory (a few slices and [n, c_in, c_out] blocks)
# while letting the executor overlap neighbours (measured: 1 is ~7 % slower on 3C3D, 2 or 3 are as
# fast as no chain; no chain lets every block of a layer be alive at once).
_IN_FLIGHT = 2


def _spatial_pads(op, kernel_sizes, strides, dilations, in_sizes, out_sizes):
    """Per spatial axis (before, after) padding, as ints or scalar tensors."""
    padding = op.get_attr("padding")
    padding = padding.decode() if isinstance(padding, bytes) else padding
    nd = len(kernel_sizes)
    if padding == "VALID":
        return [(0, 0)] * nd
    if padding == "EXPLICIT":
        flat = list(op.get_attr("explicit_paddings"))
        pairs = [(flat[2 * i], flat[2 * i + 1]) for i in range(len(flat) // 2)]
        return pairs[1 : 1 + nd]
    if padding == "SAME":
        pads = []
        for k, s, d, i, o in zip(kernel_sizes, strides, dilations, in_sizes, out_sizes):
            total = tf.maximum((o - 1) * s + (k - 1) * d + 1 - i, 0)
            before = total // 2
            pads.append((before, total - before))
        return pads
    raise RuleError(f"padding {padding!r} is not supported")


def conv_rule(site: Site) -> Contribution:
    """The rule for ``Conv2D``, ``Conv3D`` and ``DepthwiseConv2dNative`` filters."""
    op = site.op
    if site.index != 1:
        raise RuleError("the variable is the convolution's input, not its filter")
    # A transposed convolution z = conv_transpose(x, W) (Conv2DBackpropInput: input sizes,
    # filter, x) is the input-gradient of the conv x = conv(z, W): its filter gradient pairs
    # the patches of dL/dz with x, exactly as a conv pairs the patches of its input with dL/dx.
    transposed = op.type in ("Conv2DBackpropInput", "Conv3DBackpropInputV2")
    fmt = op.get_attr("data_format")
    fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
    if fmt not in ("NHWC", "NDHWC"):
        raise RuleError(f"data_format {fmt} is not supported (only channels-last)")
    kshape = site.view.shape
    if not kshape.is_fully_defined():
        raise RuleError("the filter shape is not static")
    nd = kshape.rank - 2
    kernel_sizes = list(kshape[:nd])
    # Filter [*kernel, c_in, c_out], or for a depthwise conv [*kernel, c_in, multiplier] with
    # c_in * multiplier output channels (channel c's m-th output is channel c * mult + m).
    depthwise = op.type == "DepthwiseConv2dNative"
    c_in, k_last = kshape[nd], kshape[nd + 1]
    c_out = c_in * k_last if depthwise else k_last
    strides = list(op.get_attr("strides"))
    dilations = list(op.get_attr("dilations"))
    if strides[0] != 1 or strides[-1] != 1 or dilations[0] != 1 or dilations[-1] != 1:
        raise RuleError("strides or dilations over the batch or channel axis are not supported")
    strides, dilations = strides[1:-1], dilations[1:-1]
    out = op.outputs[0]
    offsets = list(itertools.product(*[range(k) for k in kernel_sizes]))
    # Dilated convolutions on CPU arrive as SpaceToBatchND -> conv -> BatchToSpaceND: the conv's
    # batch holds `blocks` rows per example, block-major (row b * n + j belongs to example j).
    blocks, batch_source = 1, op.inputs[2 if transposed else 0]
    src = op.inputs[0]
    while src.op.type in ("ExpandDims", "Identity"):
        src = src.op.inputs[0]
    if src.op.type == "SpaceToBatchND":
        block_shape = tf.get_static_value(src.op.inputs[1])
        if block_shape is None:
            raise RuleError("the SpaceToBatchND block shape before the convolution is not static")
        blocks = int(np.prod(block_shape))
        batch_source = src.op.inputs[0]

    def rows(t, n, start, size):
        if blocks == 1:
            return t[start : start + size]
        t = tf.reshape(t, tf.concat([[blocks, n], tf.shape(t)[1:]], 0))[:, start : start + size]
        return tf.reshape(t, tf.concat([[-1], tf.shape(t)[2:]], 0))

    def padded(x, d):
        """``x`` padded as the op pads it, and the output's spatial sizes."""
        xs, ds = tf.shape(x), tf.shape(d)
        in_sizes = [xs[1 + i] for i in range(nd)]
        out_sizes = [ds[1 + i] for i in range(nd)]
        pads = _spatial_pads(op, kernel_sizes, strides, dilations, in_sizes, out_sizes)
        if any(
            not (isinstance(b, int) and b == 0 and isinstance(a, int) and a == 0) for b, a in pads
        ):
            x = tf.pad(x, [[0, 0]] + [[b, a] for b, a in pads] + [[0, 0]])
        return x, out_sizes

    def offset_slice(x, off, out_sizes):
        """The inputs that kernel offset ``off`` meets at every output position."""
        begin = [0] + [o * dil for o, dil in zip(off, dilations)] + [0]
        end = (
            [tf.shape(x)[0]]
            + [
                o * dil + (q - 1) * s + 1
                for o, dil, q, s in zip(off, dilations, out_sizes, strides)
            ]
            + [tf.shape(x)[-1]]
        )
        return tf.strided_slice(x, begin, end, [1] + strides + [1])

    def operands(delta, n, start, size):
        """(the conv's input, the gradient of its output) for examples [start, start + size)."""
        if transposed:
            return rows(delta, n, start, size), rows(site.input(2), n, start, size)
        return rows(site.input(0), n, start, size), rows(delta, n, start, size)

    def per_example(delta, n, start, size):
        x, d = operands(delta, n, start, size)
        x, out_sizes = padded(x, d)
        u = tf.stack([offset_slice(x, off, out_sizes) for off in offsets], axis=-2)
        rows_n = tf.shape(u)[0]
        if depthwise:  # [c, Q, K, c_in] with [c, Q, c_in, mult]
            u = tf.reshape(u, [rows_n, -1, len(offsets), c_in])
            d = tf.reshape(d, [rows_n, -1, c_in, k_last])
            g = tf.einsum("nqkc,nqcm->nkcm", u, d)
        else:  # [c, Q, K * c_in] with [c, Q, c_out]
            u = tf.reshape(u, [rows_n, -1, len(offsets) * c_in])
            g = tf.einsum("nqk,nqo->nko", u, tf.reshape(d, [rows_n, -1, c_out]))
        if blocks > 1:
            g = tf.reduce_sum(tf.reshape(g, [blocks, -1, len(offsets) * c_in, k_last]), axis=0)
        return tf.reshape(g, [-1, *kernel_sizes, c_in, k_last])

    def offset_sums(delta, n, start, size, orders):
        """{p: [K, c_in, c_out]}: sums of g**p over examples [start, start + size), per offset."""
        x, d = operands(delta, n, start, size)
        x, out_sizes = padded(x, d)
        rows_n = tf.shape(d)[0]
        d3 = tf.reshape(d, [rows_n, -1, c_in, k_last] if depthwise else [rows_n, -1, c_out])
        sums = {p: [] for p in orders}
        done = []  # per offset, its sums
        for k, off in enumerate(offsets):
            prev = done[k - _IN_FLIGHT] if k >= _IN_FLIGHT else []
            with tf.control_dependencies(prev):  # bounded memory, see _IN_FLIGHT
                x_off = offset_slice(x, off, out_sizes)
            x_off = tf.reshape(x_off, [rows_n, -1, c_in])
            if depthwise:
                g = tf.einsum("nqc,nqcm->ncm", x_off, d3)  # [rows, c_in, mult]
            else:
                g = tf.linalg.matmul(x_off, d3, transpose_a=True)  # [rows, c_in, c_out]
            g_pow = {1: g}
            for p in orders:
                sums[p].append(power_sum(g_pow, p))
            done.append([sums[p][-1] for p in orders])
        return {p: tf.stack(v) for p, v in sums.items()}

    def power_sums(delta, n, orders, chunk=None):
        """{p: sum_j g_j**p} for orders that may include 1, in chunks of examples."""
        orders = tuple(sorted(orders))
        sums = sum_over_chunks(
            n,
            chunk,
            orders,
            [len(offsets), c_in, k_last],
            site.dtype,
            lambda start, size: offset_sums(delta, n, start, size, orders),
            name="conv_chunks",
        )
        return {p: tf.reshape(v, [*kernel_sizes, c_in, k_last]) for p, v in sums.items()}

    positions = 1
    for s in (op.inputs[2] if transposed else out).shape[1:-1]:
        positions *= s if s is not None else 1024
    elements = blocks * (positions * len(offsets) * c_in + len(offsets) * c_in * k_last)
    return Contribution(
        examples=tf.shape(batch_source)[0],
        evidence=f"the batch axis of the input of {op.type} op '{op.name}'",
        per_example=per_example,
        per_example_elements=int(elements),
        # SpaceToBatch (dilated) convolutions keep the im2col path.
        power_sums=power_sums if blocks == 1 else None,
        # Per example, an offset's slice and its gradient (two offsets in flight).
        power_sums_elements=int(2 * (positions * c_in + c_in * k_last)),
        gradient_from_sums=blocks == 1,
    )
