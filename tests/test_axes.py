"""The examples' axis analysis (`tb_gradmom.core.axes`) on tiny graphs: a table of rows, each a
few ops traced in a `tf.function` and the state the analysis must prove for their output.

Every row is traced on its own (milliseconds each); the expected states are worked out by hand
from the ops' semantics, not read from the analysis. At least one row per handler family, the
lattice's join and the bound on a ``while`` loop's fixed point.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import tensorflow as tf

from tb_gradmom.core import axes
from tb_gradmom.core.axes import FREE, REDUCED, UNKNOWN, Axis, Elements, join, registry

N, T, D = 3, 4, 5


def spec(*shape, dtype=tf.float32):
    return tf.TensorSpec(shape, dtype)


@dataclass(frozen=True)
class Row:
    """``fn(*inputs)`` traced with ``specs``; the analysis must give its output ``expected``."""

    id: str
    fn: Callable
    specs: tuple
    expected: object


def analyse(fn, specs):
    """``(state of fn's output, analysis, output tensor)``."""
    graph = tf.function(fn).get_concrete_function(*specs).graph
    ex = axes.Examples(graph)
    out = graph.outputs[0]
    return ex.of(out), ex, out


W = np.arange(D * 2, dtype=np.float32).reshape(D, 2)


def _shift_loop(k):
    """A loop whose variable ``v_i`` takes ``v_{i-1}``'s value at each iteration, ``v_0 = x``:
    the examples reach ``v_k`` after ``k`` iterations, so the fixed point needs ``k + 1``
    passes over the body."""

    def fn(x):
        def body(i, *vs):
            return (i + 1, vs[0], *vs[:-1])

        zeros = [tf.zeros_like(x)] * k
        out = tf.while_loop(lambda i, *vs: i < k, body, (tf.constant(0), x, *zeros))
        return out[-1]

    return fn


def _accumulate_loop(x):
    def body(i, h):
        return i + 1, h + tf.tanh(x)

    return tf.while_loop(lambda i, h: i < 3, body, (tf.constant(0), tf.zeros_like(x)))[1]


def _tensor_array_loop(x):
    # [n, T, d] -> T elements [n, d], each passed through tanh, stacked back to [T, n, d]
    ta = tf.TensorArray(tf.float32, size=T).unstack(tf.transpose(x, [1, 0, 2]))
    out = tf.TensorArray(tf.float32, size=T)

    def body(i, out):
        return i + 1, out.write(i, tf.tanh(ta.read(i)))

    _, out = tf.while_loop(lambda i, o: i < T, body, (tf.constant(0), out))
    return out.stack()


@tf.function
def _inner(x):
    return tf.nn.relu(x) * 2.0


ROWS = [
    # sources and free values
    Row("input", lambda x: x, (spec(N, D),), Axis(0)),
    Row("scalar-input-is-free", lambda s: s * 2.0, (spec(),), FREE),
    # random draws of the batch's size are an example source: row j drawn for example j
    Row(
        "random-of-the-batch-shape",
        lambda x: tf.random.normal(tf.shape(x)),
        (spec(None, D),),
        Axis(0),
    ),
    # a static batch: tf.shape(x) is folded into a constant, which might be any [d_in, d_out]
    # (read as the batch size only for a loss with no other examples: Examples(static_draws))
    Row(
        "random-of-a-static-batch-shape",
        lambda x: tf.random.normal(tf.shape(x)),
        (spec(N, D),),
        FREE,
    ),
    Row(
        "random-latents-of-the-batch-size",
        lambda x: tf.random.stateless_normal([tf.shape(x)[0], 3], seed=[1, 2]),
        (spec(None, D),),
        Axis(0),
    ),
    Row("random-of-another-shape", lambda x: tf.random.normal([D, N]), (spec(N, D),), FREE),
    Row("stop-gradient", lambda x: tf.stop_gradient(x), (spec(N, D),), FREE),
    Row("shape", lambda x: tf.shape(x), (spec(N, D),), FREE),
    # defelementwise
    Row("elementwise", lambda x: tf.tanh(tf.exp(x)), (spec(N, D),), Axis(0)),
    # defbroadcasting
    Row("broadcast-bias", lambda x: x + tf.ones([D]), (spec(N, D),), Axis(0)),
    Row(
        "broadcast-moves-axis",
        lambda x: tf.expand_dims(x, 0) + tf.ones([2, 1, 1]),
        (spec(N, D),),
        Axis(1),
    ),
    Row(
        "broadcast-examples-on-two-axes",
        lambda x: x[:, :1] * tf.transpose(x[:, :N]),
        (spec(N, D),),
        UNKNOWN,
    ),
    Row("batch-statistic", lambda x: tf.reduce_mean(x, 0) * 2.0, (spec(N, D),), REDUCED),
    Row("centred-by-batch-mean", lambda x: x - tf.reduce_mean(x, 0), (spec(N, D),), Axis(0)),
    # defreduction
    Row("reduce-other-axis", lambda x: tf.reduce_sum(x, 1), (spec(N, T, D),), Axis(0)),
    Row("reduce-batch-axis", lambda x: tf.reduce_max(x, 0), (spec(N, D),), REDUCED),
    Row("argmax-rows", lambda x: tf.argmax(x, 1), (spec(N, D),), Axis(0)),
    # deflastaxis
    Row("softmax-rows", lambda x: tf.nn.softmax(x), (spec(N, D),), Axis(0)),
    Row("softmax-over-batch", lambda x: tf.nn.softmax(tf.transpose(x)), (spec(N, D),), UNKNOWN),
    # defbatchrows
    Row(
        "conv2d",
        lambda x: tf.nn.conv2d(x, tf.ones([2, 2, 3, 2]), 1, "SAME"),
        (spec(N, 4, 4, 3),),
        Axis(0),
    ),
    Row(
        "conv2d-on-transposed-batch",
        lambda x: tf.nn.conv2d(tf.transpose(x, [1, 0, 2, 3]), tf.ones([2, 2, 3, 2]), 1, "SAME"),
        (spec(N, 4, 4, 3),),
        UNKNOWN,
    ),
    # shapes and layouts
    Row("transpose", lambda x: tf.transpose(x, [1, 2, 0]), (spec(N, T, D),), Axis(2)),
    Row("expand-dims", lambda x: tf.expand_dims(x, 0), (spec(N, D),), Axis(1)),
    Row("squeeze", lambda x: tf.squeeze(x, 1), (spec(N, 1, D),), Axis(0)),
    Row("reshape-fold", lambda x: tf.reshape(x, [N * T, D]), (spec(N, T, D),), Axis(0, 1, T)),
    Row(
        "reshape-fold-dynamic-batch",
        lambda x: tf.reshape(x, [-1, D]),
        (spec(None, T, D),),
        Axis(0, 1, T),
    ),
    Row(
        "reshape-unfold",
        lambda x: tf.reshape(tf.reshape(x, [-1, D]), [-1, T, D]),
        (spec(None, T, D),),
        Axis(0),
    ),
    Row(
        "reshape-across-examples",
        lambda x: tf.reshape(x, [T, N, D]),
        (spec(N, T, D),),
        UNKNOWN,
    ),
    Row("concat-features", lambda x: tf.concat([x, x * 2.0], 1), (spec(N, D),), Axis(0)),
    # along the batch: a union, each row an example of a new batch (n = n1 + n2)
    Row("concat-batch", lambda x: tf.concat([x, x], 0), (spec(N, D),), Axis(0, batch=1)),
    Row(
        "concat-batch-and-rows-of-parameters",
        lambda x: tf.concat([x, tf.ones([2, D])], 0),
        (spec(N, D),),
        Axis(0, batch=1),
    ),
    # (n + 2 rows with n unknown at trace time: a size the symbolic sizes do not hold)
    Row(
        "concat-dynamic-batch-and-rows-of-parameters",
        lambda x: tf.concat([x, tf.ones([2, D])], 0),
        (spec(None, D),),
        UNKNOWN,
    ),
    Row(
        "concat-batch-and-a-batch-statistic",
        lambda x: tf.concat([x, tf.reduce_mean(x, 0, keepdims=True)], 0),
        (spec(N, D),),
        UNKNOWN,
    ),
    Row(
        "union-meets-its-parts",
        lambda x: tf.concat([x, x], 0)[:N] + x,
        (spec(N, D),),
        UNKNOWN,
    ),
    Row(
        "union-reshaped-by-its-size",
        lambda x: tf.reshape(tf.concat([x, x], 0), [-1, 1, D]),
        (spec(None, D),),
        Axis(0, batch=1),
    ),
    Row("pack", lambda x: tf.stack([x, x], 0), (spec(N, D),), Axis(1)),
    Row("unpack", lambda x: tf.unstack(x, axis=1)[0], (spec(N, T, D),), Axis(0)),
    Row("split", lambda x: tf.split(x, [2, 3], axis=1)[1], (spec(N, D),), Axis(0)),
    Row("pad-features", lambda x: tf.pad(x, [[0, 0], [1, 1]]), (spec(N, D),), Axis(0)),
    Row("pad-batch", lambda x: tf.pad(x, [[1, 0], [0, 0]]), (spec(N, D),), UNKNOWN),
    Row("tile-features", lambda x: tf.tile(x, [1, 2]), (spec(N, D),), Axis(0)),
    Row("tile-batch", lambda x: tf.tile(x, [2, 1]), (spec(N, D),), UNKNOWN),
    Row(
        "broadcast-to",
        lambda x: tf.broadcast_to(x[:, None], [N, T, D]),
        (spec(N, D),),
        Axis(0),
    ),
    Row("slice-features", lambda x: x[:, 1:3], (spec(N, D),), Axis(0)),
    Row("slice-batch", lambda x: x[1:], (spec(N, D),), UNKNOWN),
    Row(
        "space-to-batch",
        lambda x: tf.space_to_batch(x, [2, 2], [[0, 0], [0, 0]]),
        (spec(N, 4, 4, 3),),
        Axis(0, 4, 1),
    ),
    Row(
        "space-to-batch-and-back",
        lambda x: tf.batch_to_space(
            tf.space_to_batch(x, [2, 2], [[0, 0], [0, 0]]), [2, 2], [[0, 0], [0, 0]]
        ),
        (spec(N, 4, 4, 3),),
        Axis(0),
    ),
    Row("identity-n", lambda x: tf.identity_n([x, x * 2.0])[1], (spec(N, D),), Axis(0)),
    # along one axis
    Row("cumsum-features", lambda x: tf.cumsum(x, 1), (spec(N, D),), Axis(0)),
    Row("cumsum-batch", lambda x: tf.cumsum(x, 0), (spec(N, D),), UNKNOWN),
    Row("reverse-sequence", lambda x: tf.reverse(x, [1]), (spec(N, T, D),), Axis(0)),
    Row("reverse-batch", lambda x: tf.reverse(x, [0]), (spec(N, T, D),), UNKNOWN),
    # products
    Row("matmul", lambda x: x @ W, (spec(N, D),), Axis(0)),
    Row(
        "matmul-examples-as-columns",
        lambda x: tf.matmul(tf.ones([2, D]), x, transpose_b=True),
        (spec(N, D),),
        Axis(1),
    ),
    Row("matmul-contracts-batch", lambda x: tf.matmul(tf.ones([2, N]), x), (spec(N, D),), REDUCED),
    Row(
        "matmul-gram-of-batch", lambda x: tf.matmul(x, x, transpose_b=True), (spec(N, D),), UNKNOWN
    ),
    Row("batch-matmul", lambda x: tf.matmul(x, tf.ones([D, 2])), (spec(N, T, D),), Axis(0)),
    Row("einsum", lambda x: tf.einsum("ntd,de->tne", x, W), (spec(N, T, D),), Axis(1)),
    # selections and lookups
    Row("gather-features", lambda x: tf.gather(x, [0, 2], axis=1), (spec(N, D),), Axis(0)),
    Row("gather-examples", lambda x: tf.gather(x, [0, 2], axis=0), (spec(N, D),), UNKNOWN),
    Row(
        "gather-rows-by-ids",
        lambda ids: tf.gather(tf.ones([7, D]), ids),
        (spec(N, T, dtype=tf.int32),),
        Axis(0),
    ),
    Row(
        "gather-nd-by-ids",
        lambda ids: tf.gather_nd(tf.ones([7, D]), ids[..., None]),
        (spec(N, T, dtype=tf.int32),),
        Axis(0),
    ),
    Row(
        "select-rows-by-a-vector",
        lambda x: tf.compat.v1.where(x[:, 0] > 0.0, x, tf.zeros_like(x)),
        (spec(N, D),),
        Axis(0),
    ),
    Row("one-hot", lambda x: tf.one_hot(tf.argmax(x, 1), 4), (spec(N, D),), Axis(0)),
    Row(
        "select-rows",
        lambda x: tf.where(x > 0.0, x, tf.zeros_like(x)),
        (spec(N, D),),
        Axis(0),
    ),
    Row(
        "cross-entropy",
        lambda x: tf.nn.softmax_cross_entropy_with_logits(tf.nn.softmax(x), x),
        (spec(N, D),),
        Axis(0),
    ),
    # control flow
    Row("call", lambda x: _inner(x), (spec(N, D),), Axis(0)),
    Row("while-accumulates", _accumulate_loop, (spec(N, D),), Axis(0)),
    Row("while-tensor-array", _tensor_array_loop, (spec(N, T, D),), Axis(1)),
    Row("while-settles-within-bound", _shift_loop(3), (spec(N, D),), Axis(0)),
    Row(
        "while-past-bound",
        _shift_loop(axes.MAX_LOOP_PASSES + 2),
        (spec(N, D),),
        UNKNOWN,
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_axes_of_tiny_graphs(row):
    st, ex, out = analyse(row.fn, row.specs)
    assert st == row.expected, f"{row.id}: {st} != {row.expected} ({ex.why(out)})"


def test_every_family_has_a_row():
    """Each handler of the registry is exercised by some row (the table covers the families)."""
    seen = set()
    for row in ROWS:
        graph = tf.function(row.fn).get_concrete_function(*row.specs).graph
        ops = list(graph.get_operations())
        for op in list(ops):  # and the bodies of loops and calls
            for attr in ("body", "f"):
                fg = axes.function_graph(op, attr)
                if fg is not None:
                    ops.extend(fg.get_operations())
        seen.update(registry.HANDLERS[op.type] for op in ops if op.type in registry.HANDLERS)
    missing = {h.__name__ for h in registry.HANDLERS.values()} - {h.__name__ for h in seen}
    assert not missing, f"handlers with no row in the table: {sorted(missing)}"


def test_loop_past_the_bound_names_the_loop_and_the_bound():
    st, ex, out = analyse(_shift_loop(axes.MAX_LOOP_PASSES + 2), (spec(N, D),))
    assert st == UNKNOWN
    why = ex.why(out)
    assert "did not settle" in why and f"{axes.MAX_LOOP_PASSES} passes" in why, why
    assert "While op" in why


def test_loop_at_the_bound_is_proven():
    # k variables in a shift chain need k + 1 passes: the longest chain within the bound
    st, _, _ = analyse(_shift_loop(axes.MAX_LOOP_PASSES - 1), (spec(N, D),))
    assert st == Axis(0)


# --- the lattice ------------------------------------------------------------------------------

STATES = [FREE, REDUCED, UNKNOWN, Axis(0), Axis(1), Axis(0, 1, 4), Elements(FREE)]
STATES += [Elements(Axis(0)), Elements(Axis(1))]

JOINS = [
    (FREE, Axis(0), Axis(0)),
    (FREE, REDUCED, REDUCED),
    (Axis(0), Axis(0), Axis(0)),
    (Axis(0), Axis(1), UNKNOWN),
    (Axis(0), Axis(0, 1, 4), UNKNOWN),
    (REDUCED, Axis(0), UNKNOWN),
    (UNKNOWN, FREE, UNKNOWN),
    (Elements(FREE), Elements(Axis(0)), Elements(Axis(0))),
    (Elements(Axis(0)), Elements(Axis(1)), UNKNOWN),
    (FREE, Elements(Axis(0)), Elements(Axis(0))),
    (Elements(Axis(0)), Axis(0), UNKNOWN),
]


@pytest.mark.parametrize("a, b, expected", JOINS, ids=[f"{a}|{b}" for a, b, _ in JOINS])
def test_join(a, b, expected):
    assert join(a, b) == expected
    assert join(b, a) == expected


def test_join_is_a_least_upper_bound():
    """Commutative, associative, idempotent, FREE the bottom and UNKNOWN the top; its longest
    strictly increasing chain has `HEIGHT` steps (what bounds the loop's fixed point)."""
    for a, b, c in itertools.product(STATES, repeat=3):
        assert join(a, b) == join(b, a)
        assert join(join(a, b), c) == join(a, join(b, c))
    for a in STATES:
        assert join(a, a) == a and join(FREE, a) == a and join(UNKNOWN, a) == UNKNOWN

    def below(a, b):
        return a != b and join(a, b) == b

    longest = {a: 0 for a in STATES}
    for _ in STATES:  # relax: longest chain ending at each state
        for a, b in itertools.product(STATES, repeat=2):
            if below(a, b):
                longest[b] = max(longest[b], longest[a] + 1)
    assert max(longest.values()) == axes.lattice.HEIGHT


def test_states_are_an_enum_with_words_for_messages():
    assert {s.value for s in axes.State} == {"free", "reduced", "unknown"}
    assert axes.describe(REDUCED) == "batch statistics"
    assert axes.describe(Axis(0, 2, 3)) == "axis 0 (folded: 2 x examples x 3)"


def test_an_op_type_registered_twice_is_refused():
    with pytest.raises(ValueError, match="'Tanh' is registered twice"):
        registry.defelementwise("Tanh")
