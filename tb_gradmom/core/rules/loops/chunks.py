"""Running the loop's copy on chunks of examples, and summing per-example gradients in parts.

The copy (`tb_gradmom.core.rules.loops.graphdef`) of a loop whose inputs and seeds can be sliced
by example (`tb_gradmom.core.rules.loops.body._slicing`) runs on chunks of examples, one after
the other in a ``tf.while_loop``, so that only one chunk's stacks are alive; within a chunk the
power sums take the per-example gradients of a bounded number of elements at once. The budgets
below were measured (``benchmarks/README.md``).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tb_gradmom.core.rules.base import power_sums_of, static_chunks_only, sum_over_chunks
from tb_gradmom.core.rules.loops.body import list_source
from tb_gradmom.core.rules.loops.gradients import slice_examples, variable_gradients

__all__ = ["CHUNK_ELEMENTS", "COPY_ELEMENTS", "UNROLL", "chunk_sums", "slice_input"]

# The power sums take the per-example gradients of at most this many elements at once (1 MiB in
# float32; with their squares, 2 MiB): a variable's examples go in parts of
# CHUNK_ELEMENTS // its size, or fewer where the copy's stacks are small (`Loop.part_elements`).
# The copy of the loop already holds stacks bigger than that (for
# an LSTM(128) at T 50 and batch 64, the output gradients of its gates are 1.6M elements), while
# the core's default chunk (8M elements) lets the per-example recurrent kernels of the whole
# batch (4M elements) and their squares dominate the step's memory (peak 50 MB against 13 MB
# for the plain step; 4 MiB chunks: 29 MB; these: 17-18 MB).
CHUNK_ELEMENTS = 1 << 18
# The copy of the loop runs on chunks of examples whose stacks (deltas at the taps, recorded
# operands; a list of the steps and its stack) hold at most this many elements (20 MiB in
# float32), one chunk after the other: its memory no longer grows with the batch (GRU(128), T 50,
# batch 64: 93k elements per example, 5.9M in all: two chunks of 32, peak 28 -> 15.5 MB against
# 11.4 MB plain). Each chunk is one more pass of the recurrence, a cost in step time (LSTM(128),
# 4.3M elements, one chunk: with two, its moments step took 174 ms against 94, one 7-round run
# at load 10; with three, 1.8x too), so the budget is not smaller.
COPY_ELEMENTS = 5 << 20
# At most this many chunks of per-example gradients are summed unrolled (chunks chained by control
# dependencies); more go in a tf.while_loop (one chunk's ops traced). Each unrolled chunk is ops to
# trace and optimise on the first call: with 16 (LSTM(128), batch 64: 16 chunks of 4 examples of
# its recurrent kernel) the moments step's trace + first call took 2.52x the plain step's, with 2
# (a loop) 2.08x, its step time unchanged (2.00x against 1.98x, 7 interleaved rounds, load 0.6-1.3).
UNROLL = 2


def chunk_sums(loop, grads: tuple, outputs: tuple, n, orders: tuple, chunk: int):
    """``{variable key: {p: sum_j g_j ** p}}`` (unscaled) for every registered variable,
    from copies of the loop run on chunks of at most ``chunk`` examples, one after the
    other in a ``tf.while_loop`` (one copy traced): only one chunk's stacks are alive.
    None when the seeds cannot be sliced (the caller uses the whole batch's stacks)."""
    if loop.slicing is None:
        return None
    seeds: list[tuple | None] = []
    for t, g in zip(outputs, grads):
        if g is None or t.value_index not in loop.carried:
            seeds.append(None)
            continue
        if isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        how = loop.slicing[t.value_index]
        if how is None:  # holds no examples
            return None
        if how[0] == "dense":
            seeds.append(("dense", how[1], g))
        elif g.op.type == "TensorListFromTensor" and how[0] in ("reserve", "from_tensor"):
            seeds.append(("list", how[1], g.op))
        else:
            return None
    graph = tf.compat.v1.get_default_graph()
    key: tuple = ("chunks", id(graph), tuple(None if g is None else id(g) for g in grads))
    key += (tuple(sorted(loop.taps)), tuple(sorted(loop.records)))
    key += (tuple(loop.variables), tuple(orders), int(chunk))
    hit = loop.built.get(key)
    if hit is not None and hit[0] is graph:
        return hit[1]
    names = list(loop.variables)
    zeros = tuple(
        tf.zeros(loop.variables[k][1], loop.variables[k][3]) for k in names for _ in orders
    )
    n_static = tf.get_static_value(n)
    xla = static_chunks_only()
    if xla and n_static is None:
        return None  # no chunk of a static size: the copy runs on the whole batch
    static = None  # a chunk size that divides a static batch: every chunk's shapes static
    rest = 0  # under XLA, the examples left after the chunks of `static` examples
    if n_static is not None:  # as even as their number allows: 64 in chunks of 45 -> 32
        chunk = -(-int(n_static) // -(-int(n_static) // chunk))
        static = next(
            (d for d in range(chunk, (chunk + 1) // 2 - 1, -1) if int(n_static) % d == 0), None
        )
        if static is None and xla:  # chunks of `chunk`, then one of the rest
            static, rest = chunk, int(n_static) % chunk
        chunk = chunk if static is None else static
    n_t = tf.convert_to_tensor(n, tf.int32)
    count = (n_t + chunk - 1) // chunk if not rest else int(n_static) // chunk

    def one_chunk(start, size) -> list:
        inputs = [slice_input(loop, k, start, size) for k in range(len(loop.inputs))]
        chunk_grads = tuple(None if sd is None else _slice_seed(sd, start, size) for sd in seeds)
        stacks = loop.build(chunk_grads, outputs, size, inputs)
        new: list = []
        for k in names:
            sums = _variable_sums(loop, k, stacks, size, orders, chunk)
            new.extend(sums[p] for p in orders)
        return new

    def body(i, accs):
        start = i * chunk
        size = static if static is not None else tf.minimum(chunk, n_t - start)
        return i + 1, tuple(a + b for a, b in zip(accs, one_chunk(start, size)))

    _, accs = tf.while_loop(
        lambda i, _: i < count,
        body,
        (tf.constant(0), zeros),
        parallel_iterations=1,
        maximum_iterations=count if xla else None,
        name="gradmom_copy_chunks",
    )
    if rest:
        with tf.control_dependencies(list(accs)):
            accs = tuple(a + b for a, b in zip(accs, one_chunk(int(n_static) - rest, rest)))
    out = {}
    for j, k in enumerate(names):
        out[k] = {p: accs[j * len(orders) + q] for q, p in enumerate(orders)}
    loop.built[key] = (graph, out)
    return out


def _variable_sums(loop, key, stacks, size, orders, chunk) -> dict:
    """``{p: sum_j g_j ** p}`` over the ``size`` examples of one chunk's stacks, at most
    `part_elements` per-example elements at once (`sum_over_chunks`: up to `UNROLL`
    parts unrolled, more in one traced loop)."""
    uses, shape, flat, dtype = loop.variables[key]
    own = max(1, loop.part_elements(chunk) // max(flat, 1))

    def part_sums(start, count):
        g = variable_gradients(uses, stacks, start, count, shape, flat, dtype)
        return power_sums_of(g, orders)

    if own >= chunk:  # the whole chunk in one part, whether its size is static or not
        return part_sums(0, size)
    return sum_over_chunks(
        size, own, orders, shape, dtype, part_sums, name="gradmom_parts", unroll=UNROLL
    )


def slice_input(loop, k: int, start, size):
    """Loop input ``k`` restricted to the examples ``[start, start + size)``."""
    t = loop.inputs[k]
    how = loop.slicing[k] if loop.slicing is not None else None
    if how is None:
        return t
    kind, axis = how
    if kind == "dense":
        return slice_examples(t, axis - 1, start, size)
    src = list_source(t)
    if kind == "reserve":
        return tf.raw_ops.TensorListReserve(
            element_shape=_open_axis(src.inputs[0], axis, size),
            num_elements=src.inputs[1],
            element_dtype=src.get_attr("element_dtype"),
        )
    return tf.raw_ops.TensorListFromTensor(
        tensor=slice_examples(src.inputs[0], axis, start, size),
        element_shape=_open_axis(src.inputs[1], axis, size),
    )


def _open_axis(element_shape: tf.Tensor, axis: int, size=-1) -> tf.Tensor:
    """A list's element shape with the examples' ``axis`` left open (-1), or set to a static
    chunk ``size`` (a Python int)."""
    rank = element_shape.shape.num_elements() if element_shape.shape.rank == 1 else None
    if rank is None:  # an unknown rank (-1): nothing to open
        return element_shape
    mask = np.zeros(rank, element_shape.dtype.as_numpy_dtype)
    mask[axis] = 1
    value = size if isinstance(size, int) and size > 1 else -1
    return element_shape * (1 - mask) + value * mask


def _slice_seed(seed, start, size):
    """A seed (the gradient of a loop output) restricted to the examples of a chunk."""
    kind, axis, g = seed
    if kind == "dense":
        return slice_examples(g, axis - 1, start, size)
    return tf.raw_ops.TensorListFromTensor(  # g: the seed list's TensorListFromTensor op
        tensor=slice_examples(g.inputs[0], axis, start, size),
        element_shape=_open_axis(g.inputs[1], axis, size),
    )
