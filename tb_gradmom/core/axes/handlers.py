"""The per-op transfer functions of the analysis: ``(analysis, op, input states) -> output
state(s)``, one per op family, pure (they read the op and the states, build nothing).

Each returns the state of the op's outputs (one for all, or a list), `UNKNOWN` where it cannot
prove where the examples go (the driver records the op for messages). A handler is called only
when some input holds examples (`Axis` or `Elements`) and none is `UNKNOWN`. Which op types take
which handler is `tb_gradmom.core.axes.registry`.
"""

from __future__ import annotations

import numpy as np

from tb_gradmom.core.axes.lattice import FREE, REDUCED, UNKNOWN, Axis, Elements, Padded
from tb_gradmom.core.axes.symbolic import Sym, add, div, mul, prod, static, sym_value


def h_unary(ex, op, states):
    return states[0] if isinstance(states[0], Axis | Elements) else UNKNOWN


def h_broadcast(ex, op, states):
    """Numpy broadcasting: an input's example axis lands at the same output position for every
    input that has one, and is never broadcast itself."""
    out = op.outputs[0]
    rank = out.shape.rank
    if rank is None:
        return UNKNOWN
    inputs = list(op.inputs)
    if op.type == "BiasAdd":
        fmt = op.get_attr("data_format")
        fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
        if fmt != "NHWC" and any(isinstance(s, Axis) for s in states[1:]):
            return UNKNOWN
    shapes = []
    for x in inputs:
        dims = ex.sym_shape(x)
        if dims is None:
            return UNKNOWN
        shapes.append([1] * (rank - len(dims)) + dims)
    found = None
    for x, st, dims in zip(inputs, states, shapes):
        if not isinstance(st, Axis):
            continue
        pos = st.axis + (rank - x.shape.rank)
        own = dims[pos]
        if own is None:
            return UNKNOWN
        for other in shapes:
            d = other[pos]
            if d is None or d == 1 or d == own:
                continue
            return UNKNOWN  # the example axis would be broadcast against another size
        if own == 1 and out.shape[pos] not in (1, None):
            return UNKNOWN
        cand = st.moved(pos)
        if found is not None and found != cand:
            return UNKNOWN
        found = cand
    return found if found is not None else REDUCED


def _axes_of(op, rank):
    axes = static(op.inputs[1])
    if axes is None or rank is None:
        return None
    return sorted({int(a) % rank for a in axes.reshape(-1)}) if rank else []


def h_reduce(ex, op, states):
    st = states[0]
    if not isinstance(st, Axis):
        return UNKNOWN if st == UNKNOWN else REDUCED
    x = op.inputs[0]
    rank = x.shape.rank
    axes = _axes_of(op, rank)
    if axes is None:
        return UNKNOWN
    if op.type in ("ArgMax", "ArgMin"):
        keep = False
    else:
        keep = bool(op.get_attr("keep_dims"))
    if st.axis in axes:
        return REDUCED
    if keep:
        return st
    return st.moved(st.axis - sum(1 for a in axes if a < st.axis))


def h_last_axis(ex, op, states):
    st = states[0]
    rank = op.inputs[0].shape.rank
    if not isinstance(st, Axis) or rank is None or st.axis == rank - 1:
        return UNKNOWN
    if op.type == "L2Loss":
        return REDUCED
    if op.type == "InTopKV2":
        return st if st.axis == 0 else UNKNOWN
    return st


def _values(ex, t):
    """``t``'s value as a list (of ints, `Sym` or None where unknown), computed with the batch
    size kept symbolic (`sym_value`: ``Range``, ``Pack``, ``ConcatV2`` of constants and shape
    values), or None."""
    v = sym_value(ex, t)
    if v is None:
        return None
    return v if isinstance(v, list) else [v]


def h_transpose(ex, op, states):
    """The permutation may be computed (``softmax(x, axis=1)`` swaps the axis with the last one
    by a ``ConcatV2`` of ``Range``s of the rank)."""
    st = states[0]
    perm = _values(ex, op.inputs[1])
    if not isinstance(st, Axis) or perm is None or any(not isinstance(p, int) for p in perm):
        return UNKNOWN
    if sorted(perm) != list(range(len(perm))):
        return UNKNOWN
    return st.moved(perm.index(st.axis))


def h_expand_dims(ex, op, states):
    st = states[0]
    axis = static(op.inputs[1])
    rank = op.outputs[0].shape.rank
    if not isinstance(st, Axis) or axis is None or rank is None:
        return UNKNOWN
    a = int(axis) % rank
    return st.moved(st.axis + 1 if a <= st.axis else st.axis)


def h_squeeze(ex, op, states):
    st = states[0]
    x = op.inputs[0]
    rank = x.shape.rank
    if not isinstance(st, Axis) or rank is None:
        return UNKNOWN
    dims = list(op.get_attr("squeeze_dims"))
    if dims:
        dims = sorted({int(d) % rank for d in dims})
    else:
        shape = x.shape.as_list()
        if any(s is None for i, s in enumerate(shape) if i != st.axis):
            return UNKNOWN
        dims = [i for i, s in enumerate(shape) if s == 1]
    if st.axis in dims:
        # A batch of one squeezed away (Keras adds a [1, d] operand as a bias): the values
        # are those of the one example, with no examples' axis left, as after a sum over it.
        return REDUCED if x.shape[st.axis] == 1 and st.pure else UNKNOWN
    return st.moved(st.axis - sum(1 for d in dims if d < st.axis))


def h_reshape(ex, op, states):
    st = states[0]
    if not isinstance(st, Axis):
        return UNKNOWN
    x = op.inputs[0]
    in_dims = ex.sym_shape(x)
    if in_dims is None:
        return UNKNOWN
    pre = prod(in_dims[: st.axis])
    post = prod(in_dims[st.axis + 1 :])
    if pre is None or post is None or isinstance(pre, Sym) or isinstance(post, Sym):
        return UNKNOWN
    big_p, big_q = pre * st.outer, st.inner * post  # elements before / after the example block
    out_dims = _reshape_dims(ex, op, in_dims)
    if out_dims is None:
        return UNKNOWN
    n = ex.n_value(st.batch)
    if n is None:
        return UNKNOWN
    for k, d in enumerate(out_dims):
        before, after = prod(out_dims[:k]), prod(out_dims[k + 1 :])
        if before is None or after is None or isinstance(before, Sym) or isinstance(after, Sym):
            continue
        if before == 0 or after == 0 or big_p % before or big_q % after:
            continue
        o, i = big_p // before, big_q // after
        if d is not None and d == mul(n, o * i):
            return Axis(k, o, i, st.batch)
    return UNKNOWN


def _reshape_dims(ex, op, in_dims):
    out = op.outputs[0]
    static = out.shape.as_list() if out.shape.rank is not None else None
    if static is not None and all(s is not None for s in static) and ex.n_static is not None:
        return static
    val = sym_value(ex, op.inputs[1])
    if val is None:
        return static if static is not None and all(s is not None for s in static) else None
    if not isinstance(val, list):
        val = [val]
    total = prod(in_dims)
    if total is None:
        return None
    if -1 in val:
        known = prod([v for v in val if v != -1])
        rest = div(total, known)
        if rest is None:
            return None
        val = [rest if v == -1 else v for v in val]
    if any(v is None for v in val):
        return None
    return val


def h_matmul(ex, op, states):
    a, b = states
    ta, tb = op.get_attr("transpose_a"), op.get_attr("transpose_b")
    out = None
    if isinstance(a, Axis):
        a_rows = 1 if ta else 0
        if a.axis != a_rows:
            return REDUCED if not isinstance(b, Axis) else UNKNOWN
        out = a.moved(0)
    if isinstance(b, Axis):
        b_cols = 0 if tb else 1
        if b.axis != b_cols or out is not None:
            return UNKNOWN if out is not None else REDUCED
        out = b.moved(1)
    return out if out is not None else REDUCED


def h_batch_matmul(ex, op, states):
    x, y = op.inputs
    out = op.outputs[0]
    rank = out.shape.rank
    if rank is None or x.shape.rank is None or y.shape.rank is None:
        return UNKNOWN
    adj = (op.get_attr("adj_x"), op.get_attr("adj_y"))
    found = None
    for i, (t, st) in enumerate(zip((x, y), states)):
        if not isinstance(st, Axis):
            continue
        r = t.shape.rank
        if st.axis < r - 2:  # a batch dim, broadcast like an element-wise op
            pos = st.axis + (rank - r)
            if t.shape[st.axis] == 1 and out.shape[pos] != 1:
                return UNKNOWN
            cand = st.moved(pos)
        else:
            mat = st.axis - (r - 2)  # 0: rows, 1: columns of the operand as stored
            if adj[i]:
                mat = 1 - mat
            if (i == 0 and mat == 1) or (i == 1 and mat == 0):
                return REDUCED if found is None else UNKNOWN  # contracted
            cand = st.moved(rank - 2 if i == 0 else rank - 1)
        if found is not None and found != cand:
            return UNKNOWN
        found = cand
    return found if found is not None else REDUCED


def h_einsum(ex, op, states):
    eq = op.get_attr("equation")
    eq = (eq.decode() if isinstance(eq, bytes) else eq).replace(" ", "")
    if "..." in eq or "->" not in eq:
        return UNKNOWN
    ins, out = eq.split("->")
    parts = ins.split(",")
    if len(parts) != len(op.inputs):
        return UNKNOWN
    found = None
    for subs, st in zip(parts, states):
        if not isinstance(st, Axis):
            continue
        letter = subs[st.axis]
        if letter not in out:
            return REDUCED if found is None else UNKNOWN
        cand = st.moved(out.index(letter))
        if found is not None and found != cand:
            return UNKNOWN
        # the same letter must not index examples in one operand and something else in another
        for other, ost in zip(parts, states):
            if letter in other and not isinstance(ost, Axis) and ost != FREE:
                return UNKNOWN
        found = cand
    return found if found is not None else REDUCED


def h_concat(ex, op, states):
    axis = static(op.inputs[-1])
    rank = op.outputs[0].shape.rank
    if axis is None or rank is None:
        return UNKNOWN
    axis = int(axis) % rank
    if any(isinstance(st, Axis) and st.axis == axis for st in states[:-1]):
        return _union(ex, op, states, axis)
    found = None
    for st in states[:-1]:
        if isinstance(st, Axis):
            if st.axis == axis or (found is not None and found != st):
                return UNKNOWN
            found = st
    return found if found is not None else REDUCED


def _union(ex, op, states, axis):
    """A concatenation of example batches along their examples' axis (a discriminator's
    ``concat([real, fake])``, SimCLR's two views): each row is an example of a new batch, the
    union, ``n = n1 + n2`` (`Examples.union`). Every input must hold one example per row on
    that axis (a pure axis), or none (rows that are parameters or draws: examples too, each
    its own); a batch statistic, a folded axis or an unknown size is not proven."""
    size = 0
    sizes = []
    for x, st in zip(op.inputs[:-1], states[:-1]):
        if isinstance(st, Axis):
            if st.axis != axis or not st.pure:
                return UNKNOWN
        elif st != FREE:
            return UNKNOWN
        dims = ex.sym_shape(x)
        if dims is None or len(dims) <= axis or dims[axis] is None:
            return UNKNOWN
        sizes.append(dims[axis])
        size = add(size, dims[axis])
    if size is None:  # a batch size unknown at trace time plus a fixed number of rows
        return _padded(ex, op, states[:-1], sizes, axis)
    return Axis(axis, batch=ex.union(size, op))


def _padded(ex, op, states, sizes, axis):
    """``concat([x, rows])`` along the examples' axis with the batch size unknown at trace time
    and a fixed number of rows that hold no example: `Padded` (the rows are not examples), or
    `UNKNOWN` with the reason when more than one input holds examples."""
    held = [i for i, st in enumerate(states) if isinstance(st, Axis)]
    if len(held) != 1 or any(
        not isinstance(sizes[i], int) for i in range(len(sizes)) if i != held[0]
    ):
        return ex.refuse(
            op,
            f"ConcatV2 op '{op.name}' joins example batches and rows that hold no example along "
            "the examples' axis, with the batch size unknown at trace time",
        )
    k = held[0]
    st = states[k]
    return Padded(axis, sum(sizes[:k]), sum(sizes[k + 1 :]), op.name, st.batch)


def h_pack(ex, op, states):
    rank = op.outputs[0].shape.rank
    if rank is None:
        return UNKNOWN
    axis = int(op.get_attr("axis")) % rank
    found = None
    for st in states:
        if isinstance(st, Axis):
            cand = st.moved(st.axis + 1 if st.axis >= axis else st.axis)
            if found is not None and found != cand:
                return UNKNOWN
            found = cand
    return found if found is not None else REDUCED


def h_unpack(ex, op, states):
    st = states[0]
    rank = op.inputs[0].shape.rank
    if not isinstance(st, Axis) or rank is None:
        return UNKNOWN
    axis = int(op.get_attr("axis")) % rank
    if axis == st.axis:
        return UNKNOWN
    return st.moved(st.axis - 1 if st.axis > axis else st.axis)


def h_split(ex, op, states):
    # Split(axis, value, num_split) / SplitV(value, size_splits, axis)
    if op.type == "Split":
        axis_t, x, st = op.inputs[0], op.inputs[1], states[1]
    else:
        axis_t, x, st = op.inputs[2], op.inputs[0], states[0]
    axis = static(axis_t)
    rank = x.shape.rank
    if not isinstance(st, Axis) or axis is None or rank is None or int(axis) % rank == st.axis:
        return UNKNOWN
    return st


def h_pad(ex, op, states):
    """The paddings ``[rank, 2]`` may be computed (``tf.image.pad_to_bounding_box``): the
    example axis's two entries must be 0."""
    st = states[0]
    src = op.inputs[1]
    while src.op.type == "Reshape":  # values in row-major order: the reshape keeps it
        src = src.op.inputs[0]
    pads = _values(ex, src)
    rank = op.inputs[0].shape.rank
    if not isinstance(st, Axis) or pads is None or rank is None or len(pads) != 2 * rank:
        return UNKNOWN
    if pads[2 * st.axis] != 0 or pads[2 * st.axis + 1] != 0:
        return UNKNOWN
    return st


def h_tile(ex, op, states):
    st = states[0]
    if not isinstance(st, Axis):
        return UNKNOWN
    # The multiples are often computed (tf.repeat, keras.ops.repeat: grouped-query attention's
    # key/value heads): read them with the batch size kept symbolic.
    mult = sym_value(ex, op.inputs[1])
    if not isinstance(mult, list) or len(mult) <= st.axis or mult[st.axis] != 1:
        return UNKNOWN
    return st


def h_broadcast_to(ex, op, states):
    st = states[0]
    x, out = op.inputs[0], op.outputs[0]
    if not isinstance(st, Axis) or x.shape.rank is None or out.shape.rank is None:
        return UNKNOWN
    pos = st.axis + out.shape.rank - x.shape.rank
    in_dim = ex.sym_shape(x)[st.axis]
    val = sym_value(ex, op.inputs[1])
    out_dim = val[pos] if isinstance(val, list) and len(val) > pos else out.shape[pos]
    if in_dim is None or out_dim is None or in_dim != out_dim:
        return UNKNOWN
    return st.moved(pos)


def h_slice(ex, op, states):
    st = states[0]
    x = op.inputs[0]
    if not isinstance(st, Axis):
        return UNKNOWN
    dims = ex.sym_shape(x)
    if dims is None:
        return UNKNOWN
    if op.type == "Slice":  # begin and size may be computed (tf.image.crop_to_bounding_box)
        begin, size = _values(ex, op.inputs[1]), _values(ex, op.inputs[2])
        if begin is None or size is None or len(begin) <= st.axis or len(size) <= st.axis:
            return UNKNOWN
        b, s = begin[st.axis], size[st.axis]
        full = b == 0 and (s == -1 or (s is not None and s == dims[st.axis]))
        if full:
            return st
        part = _union_part(ex, st, b, None if s == -1 else add(b, s))
        return part if part is not None else UNKNOWN
    # StridedSlice: only the example axis's entries of begin, end and strides must be known
    begin, end, strides = (_values(ex, t) for t in op.inputs[1:4])
    if begin is None or end is None or strides is None:
        return UNKNOWN
    if not len(begin) == len(end) == len(strides):
        return UNKNOWN
    ellipsis = op.get_attr("ellipsis_mask")
    new_axis = op.get_attr("new_axis_mask")
    shrink = op.get_attr("shrink_axis_mask")
    bmask, emask = op.get_attr("begin_mask"), op.get_attr("end_mask")
    rank = x.shape.rank
    if rank is None:
        return UNKNOWN
    # Walk the spec, mapping input dims to output dims.
    spec = len(begin)
    in_dim, out_dim = 0, 0
    target = None
    for i in range(spec):
        bit = 1 << i
        if ellipsis & bit:
            covered = rank - (
                spec - i - 1 - sum(1 for j in range(i + 1, spec) if new_axis >> j & 1)
            )
            while in_dim < covered:
                if in_dim == st.axis:
                    target = out_dim
                in_dim += 1
                out_dim += 1
            continue
        if new_axis & bit:
            out_dim += 1
            continue
        if in_dim == st.axis:
            full = (
                (bmask & bit or begin[i] == 0)
                and (emask & bit or _end_is_full(end[i], dims[in_dim]))
                and strides[i] == 1
                and not shrink & bit
            )
            if not full:
                if strides[i] != 1 or shrink & bit:
                    return UNKNOWN
                b = 0 if bmask & bit else begin[i]
                part = _union_part(ex, st, b, None if emask & bit else end[i])
                if part is None:
                    return UNKNOWN
                st = part
            target = out_dim
        in_dim += 1
        if not shrink & bit:
            out_dim += 1
    if target is None:  # the example axis is past the spec: untouched
        target = out_dim + (st.axis - in_dim)
    return st.moved(target)


def _union_part(ex, st, begin, end):
    """The examples' `Axis` of the input of a union (`Examples.union`: ``concat([x, rows])``
    along the examples' axis) whose entries are exactly ``[begin, end)`` of the union's axis
    (``end`` None: to its end), when that input holds one example per entry (``h[:n]`` of
    ``concat([x, rows])`` is ``x``'s examples again); else None. Entry ``j`` there is a
    function of that input's entry ``j`` and of tensors that hold no example."""
    op = ex.union_op(st.batch)
    if op is None or not st.pure or op.graph is not ex.graph:
        return None
    axis = static(op.inputs[-1])
    if axis is None or begin is None:
        return None
    offset = 0
    for x in op.inputs[:-1]:
        dims = ex.sym_shape(x)
        if dims is None or x.shape.rank is None:
            return None
        size = dims[int(axis) % x.shape.rank]
        stop = add(offset, size)
        if (
            offset == begin
            and stop is not None
            and (stop == end or (end is None and x is op.inputs[-2]))
        ):
            found = ex.of(x)
            return (
                Axis(st.axis, batch=found.batch) if isinstance(found, Axis) and found.pure else None
            )
        offset = stop
        if offset is None:
            return None
    return None


def _end_is_full(end, dim) -> bool:
    """Whether a slice's ``end`` reaches the end of an axis of size ``dim`` (ints or `Sym`)."""
    if end is None or dim is None:
        return False
    if end == dim:
        return True
    if isinstance(end, int) and end >= 2**31 - 1:
        return True
    return isinstance(end, int) and isinstance(dim, int) and end >= dim


def h_gather(ex, op, states):
    params, indices = op.inputs[0], op.inputs[1]
    sp, si = states[0], states[1]
    batch_dims = int(op.get_attr("batch_dims")) if op.type != "ResourceGather" else 0
    if op.type == "ResourceGather":
        sp = FREE
        axis = 0
    else:
        axis_v = static(op.inputs[2])
        if axis_v is None or params.shape.rank is None:
            return UNKNOWN
        axis = int(axis_v) % params.shape.rank
    ri = indices.shape.rank
    if ri is None:
        return UNKNOWN
    # out = params.shape[:axis] + indices.shape[batch_dims:] + params.shape[axis + 1:], where
    # params.shape[:batch_dims] == indices.shape[:batch_dims] (gathered row by row).
    if isinstance(sp, Axis) and isinstance(si, Axis):
        # Both hold the examples: fine on a shared batch axis only (row j gathers from row j).
        return sp if sp == si and sp.axis < batch_dims else UNKNOWN
    if isinstance(si, Axis):
        if sp == REDUCED:
            return UNKNOWN
        return si if si.axis < batch_dims else si.moved(axis + si.axis - batch_dims)
    if isinstance(sp, Axis):
        if si != FREE:
            return UNKNOWN  # indices computed from the batch choose what each example sees
        if sp.axis < batch_dims or sp.axis < axis:
            return sp
        if sp.axis == axis:
            return UNKNOWN  # selects examples
        return sp.moved(sp.axis + ri - batch_dims - 1)
    return REDUCED


def h_gather_nd(ex, op, states):
    sp, si = states[0], states[1]
    ri = op.inputs[1].shape.rank
    if isinstance(si, Axis) and sp in (FREE, REDUCED) and ri is not None and si.axis < ri - 1:
        return si
    return UNKNOWN


def h_one_hot(ex, op, states):
    st = states[0]
    axis = int(op.get_attr("axis"))
    if not isinstance(st, Axis):
        return UNKNOWN
    if axis == -1 or axis > st.axis:
        return st
    return st.moved(st.axis + 1)


def h_batch_row(ex, op, states):
    """NHWC ops whose batch axis (0) is processed row by row."""
    idx = 2 if op.type in ("Conv2DBackpropInput", "Conv3DBackpropInputV2") else 0
    st = states[idx]
    for i, s in enumerate(states):
        if i != idx and isinstance(s, Axis):
            return UNKNOWN
    if op.type.startswith("Matrix"):
        rank = op.inputs[0].shape.rank
        if not isinstance(st, Axis) or rank is None or st.axis >= rank - 2:
            return UNKNOWN
        if op.type == "MatrixTranspose":
            return st
        return st
    if "data_format" in op.node_def.attr:
        fmt = op.get_attr("data_format")
        fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
        if not fmt.startswith("N"):
            return UNKNOWN
    if not isinstance(st, Axis) or st.axis != 0:
        return UNKNOWN
    if op.type.startswith("FusedBatchNorm"):
        training = bool(op.get_attr("is_training"))
        rest = [REDUCED if training else FREE] * (len(op.outputs) - 1)
        return [st] + rest
    return st


def h_image_transform(ex, op, states):
    """``ImageProjectiveTransformV2/V3`` (Keras' random rotation, zoom and translation): image
    ``j`` of the batch (axis 0) is resampled by row ``j`` of the transforms (or by their one
    row), which must hold example ``j``'s or none."""
    st, transforms = states[0], states[1]
    if st != Axis(0) or any(isinstance(s, Axis | Elements) for s in states[2:]):
        return UNKNOWN
    if isinstance(transforms, Axis | Elements) and transforms != Axis(0):
        return UNKNOWN
    return st


def h_space_to_batch(ex, op, states):
    st = states[0]
    block = static(op.inputs[1])
    if not isinstance(st, Axis) or st.axis != 0 or block is None:
        return UNKNOWN
    return Axis(0, st.outer * int(np.prod(block)), st.inner, st.batch)


def h_batch_to_space(ex, op, states):
    st = states[0]
    block = static(op.inputs[1])
    if not isinstance(st, Axis) or st.axis != 0 or block is None:
        return UNKNOWN
    b = int(np.prod(block))
    if st.outer % b:
        return UNKNOWN
    return Axis(0, st.outer // b, st.inner, st.batch)


def along_axes(axes_input: int):
    """The handler of ops that move or combine entries along the axes given by input
    ``axes_input`` (``Cumsum``, ``ReverseV2``, ``Roll``): the examples stay where they are when
    their axis is not among them; along it, the op mixes or moves the examples (`UNKNOWN`: a
    coupling). Their other inputs (a roll's shift) must not hold examples."""

    def h_along_axes(ex, op, states):
        st = states[0]
        axes = static(op.inputs[axes_input])
        rank = op.inputs[0].shape.rank
        if not isinstance(st, Axis) or axes is None or rank is None:
            return UNKNOWN
        if any(isinstance(s, Axis | Elements) for s in states[1:]):
            return UNKNOWN
        along = {int(a) % rank for a in axes.reshape(-1)} if rank else set()
        if st.axis in along:
            return ex.refuse(
                op, f"{op.type} op '{op.name}' along the examples' axis {st.axis} (mixes them)"
            )
        return st

    h_along_axes.__name__ = f"h_along_axes_{axes_input}"
    return h_along_axes


def innermost(k: int):
    """The handler of ops on the ``k`` innermost axes (``FFT`` 1, ``FFT2D`` 2, ``FFT3D`` 3, and
    their inverse and real forms): the examples must be on an outer axis."""

    def h_innermost(ex, op, states):
        st = states[0]
        rank = op.inputs[0].shape.rank
        if not isinstance(st, Axis) or rank is None or st.axis >= rank - k:
            return UNKNOWN
        if any(isinstance(s, Axis | Elements) for s in states[1:]):
            return UNKNOWN
        return st

    h_innermost.__name__ = f"h_innermost_{k}"
    return h_innermost


def h_select(ex, op, states):
    # Select(cond, t, e): a vector cond selects rows of t/e.
    cond = op.inputs[0]
    if cond.shape.rank == 1 and op.inputs[1].shape.rank not in (None, 1):
        sc = states[0]
        rows = [s for s in states[1:] if isinstance(s, Axis)]
        if sc in (FREE, REDUCED):
            if all(s.axis == 0 for s in rows):
                return rows[0] if rows else REDUCED
            return UNKNOWN
        if isinstance(sc, Axis) and sc.pure and all(s == Axis(0) for s in rows):
            return Axis(0)
        return UNKNOWN
    return h_broadcast(ex, op, states)


def h_cross_entropy(ex, op, states):
    """``(Sparse)SoftmaxCrossEntropyWithLogits``: rows of logits and labels, a loss per row.
    The rows may fold the examples with positions (``[n, T, V]`` logits reshaped to
    ``[n * T, V]`` by ``tf.nn.sparse_softmax_cross_entropy_with_logits``): each row is still one
    example's."""
    rows = [s for s in states if isinstance(s, Axis)]
    if not rows or any(s != rows[0] or s.axis != 0 for s in rows):
        return UNKNOWN
    if op.inputs[0].shape.rank != 2:
        return UNKNOWN
    return [rows[0], rows[0]]


def h_identity_n(ex, op, states):
    return list(states)


# --- rows that hold no example beside the examples (`Padded`) -------------------------------


def h_padded(ex, op, states, handler):
    """The state of ``op``'s outputs when an input is `Padded` (examples and rows that hold no
    example on one axis): element-wise ops with operands that hold no example, products that
    keep the axis, reductions, and slices (a slice that takes back exactly the examples' rows,
    ``h[:tf.shape(x)[0]]``, gives their `Axis` again). ``handler``: the op type's handler in
    the registry, which names its family. Anything else stops the proof, the concat named."""
    padded = [s for s in states if isinstance(s, Padded)]
    st = padded[0]

    def stop():
        return ex.refuse(
            op,
            f"{op.type} op '{op.name}' on examples with {st.before + st.after} rows that hold "
            f"no example beside them (ConcatV2 op '{st.op}', the batch size unknown at trace "
            "time); element-wise ops, products and slices are followed there",
        )

    rank = op.outputs[0].shape.rank if op.outputs else None
    if rank is None or any(s != FREE for s in states if not isinstance(s, Padded)):
        return stop()
    if handler is h_unary:
        return st
    if len(padded) > 1 and handler is not h_broadcast:  # two operands' rows would meet
        return stop()
    if handler is h_broadcast and (op.type != "BiasAdd" or isinstance(states[0], Padded)):
        found = None
        for x, s in zip(op.inputs, states):
            if isinstance(s, Padded):
                cand = s.moved(s.axis + rank - x.shape.rank)
                if found is not None and found != cand:
                    return stop()
                found = cand
        return found
    if handler is h_reduce:
        axes = _axes_of(op, op.inputs[0].shape.rank)
        if axes is None or not isinstance(states[0], Padded):
            return stop()
        if st.axis in axes:
            return REDUCED
        if op.type not in ("ArgMax", "ArgMin") and op.get_attr("keep_dims"):
            return st
        return st.moved(st.axis - sum(1 for a in axes if a < st.axis))
    if handler is h_matmul:
        a, b = states
        ta, tb = op.get_attr("transpose_a"), op.get_attr("transpose_b")
        if isinstance(a, Padded):
            return a.moved(0) if a.axis == (1 if ta else 0) else REDUCED
        return b.moved(1) if b.axis == (0 if tb else 1) else REDUCED
    if handler is h_slice and isinstance(states[0], Padded):
        return _slice_padded(ex, op, st, stop)
    return stop()


def _slice_padded(ex, op, st, stop):
    """A slice of a `Padded` tensor: the examples' rows alone (their `Axis`), or every row of
    that axis (still `Padded`)."""
    n = ex.n_value(st.batch)
    if op.type == "Slice":
        begin, size = _values(ex, op.inputs[1]), _values(ex, op.inputs[2])
        if begin is None or size is None or len(begin) <= st.axis or len(size) <= st.axis:
            return stop()
        b, s = begin[st.axis], size[st.axis]
        if b == st.before and s is not None and s == n:
            return Axis(st.axis, batch=st.batch)
        return st if b == 0 and s == -1 else stop()
    begin, end, strides = (_values(ex, t) for t in op.inputs[1:4])
    if begin is None or end is None or strides is None or len(begin) <= st.axis:
        return stop()
    if op.get_attr("ellipsis_mask") or op.get_attr("new_axis_mask"):
        return stop()
    shrink = op.get_attr("shrink_axis_mask")
    bit = 1 << st.axis
    if shrink & bit or strides[st.axis] != 1:
        return stop()
    axis = st.axis - sum(1 for i in range(st.axis) if shrink >> i & 1)
    b = 0 if op.get_attr("begin_mask") & bit else begin[st.axis]
    e = None if op.get_attr("end_mask") & bit else end[st.axis]
    if b == 0 and (e is None or (isinstance(e, int) and e >= 2**31 - 1)):
        return st.moved(axis)
    last = add(st.before, n)
    if b == st.before and ((e is not None and e == last) or (e is None and st.after == 0)):
        return Axis(axis, batch=st.batch)
    return stop()
