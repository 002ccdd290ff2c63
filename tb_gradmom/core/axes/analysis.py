"""The driver: the analysis of one graph, from its batch-carrying inputs to every tensor.

`Examples.of` visits the ops a tensor depends on in topological order (iteratively, memoised)
and gives each op's outputs a state from its inputs' states by the op type's handler
(`tb_gradmom.core.axes.registry`). Sources: the step's dense tensor arguments (axis 0; a
`tf.function`'s non-captured inputs, a TF1 graph's placeholders) and the elements an iterator
yields; variables, constants, shapes and random numbers are `FREE`.
"""

from __future__ import annotations

import tensorflow as tf

from tb_gradmom._compat import PrivateAPIError, tf_private
from tb_gradmom.core.axes import registry
from tb_gradmom.core.axes.handlers import h_padded
from tb_gradmom.core.axes.lattice import FREE, REDUCED, UNKNOWN, Axis, Elements, Padded
from tb_gradmom.core.axes.symbolic import Sym, mul, sym_value

__all__ = ["Examples"]


class Examples:
    """The example axis of every tensor on the way from the step's inputs to its loss.

    One analysis per traced call (`of` memoises). ``n_static`` is the batch size when a
    batch-carrying input has a static first axis, else None (sizes are then kept symbolic).
    ``inputs``: for the body of a call or a loop (`nested`), the states of the body's inputs.
    """

    def __init__(
        self,
        graph: tf.Graph,
        inputs=None,
        n_static=None,
        depth: int = 0,
        *,
        static_draws: bool = False,
    ):
        self.graph = graph
        self.depth = depth
        # the unions of batches made in the step (`union`): batch id -> (its size as in
        # `n_value`, the op that makes it); batch 0, the step's inputs, is not listed
        self.unions: dict = {}
        # random draws whose shape starts with a constant equal to the static batch size are
        # rows of examples too (`_random`; for a loss that holds no example otherwise)
        self.static_draws = static_draws
        self._memo: dict = {}
        self._why: dict = {}
        self._inert: set = set()  # refs of the tensors that carry no gradient (`_gradient_free`)
        if inputs is not None:  # the body of a called function: its inputs' states are given
            self._sources = _RefMap()
            for t, st in zip(graph.inputs, inputs):
                self._sources.set(t, st)
            self.n_static = n_static
            return
        self._sources = self._find_sources(graph)
        sizes = {
            int(t.shape[0])
            for t, st in self._sources.items_tensors()
            if isinstance(st, Axis) and t.shape.rank and t.shape[0] is not None
        }
        self.n_static = next(iter(sizes)) if len(sizes) == 1 else None
        if len(sizes) > 1:  # several static batch sizes among the inputs: prove nothing from them
            for t, st in list(self._sources.items_tensors()):
                if isinstance(st, Axis):
                    self._sources.set(t, UNKNOWN)
                    self._why[t.ref()] = (
                        f"the step's inputs disagree about the batch size ('{t.name}')"
                    )

    def nested(self, graph: tf.Graph, states) -> Examples:
        """The analysis of the body ``graph`` of a call or loop of this graph, whose inputs hold
        ``states``."""
        sub = Examples(graph, inputs=list(states), n_static=self.n_static, depth=self.depth + 1)
        sub.unions = self.unions
        return sub

    # --- sources ---------------------------------------------------------------------------

    @staticmethod
    def _find_sources(graph) -> _RefMap:
        out = _RefMap()
        captured = set()
        for t in getattr(graph, "internal_captures", None) or []:
            captured.add(t.ref())
        args = [t for t in getattr(graph, "inputs", []) if t.ref() not in captured]
        composite = set()
        signature = getattr(graph, "structured_input_signature", None)
        if signature is not None and args:
            kinds = []
            for spec in tf.nest.flatten(signature, expand_composites=False):
                if isinstance(spec, tf.TypeSpec):
                    kinds.extend(_leaf_kinds(spec))
            if len(kinds) != len(args):  # an unexpected layout: prove nothing from sparse parts
                text = repr(signature)
                sparse = "Sparse" in text or "Ragged" in text
                kinds = ["sparse" if sparse else "dense"] * len(args)
            for t, kind in zip(args, kinds):
                if kind != "dense":
                    composite.add(t.ref())
        for t in args:
            if t.dtype in (tf.resource, tf.variant):
                out.set(t, FREE if t.dtype == tf.resource else UNKNOWN)
            elif t.ref() in composite:
                out.set(t, UNKNOWN)
            elif t.shape.rank == 0:
                out.set(t, FREE)
            else:
                out.set(t, Axis(0))
        return out

    # --- queries ---------------------------------------------------------------------------

    def of(self, t: tf.Tensor):
        """`Axis`, `FREE`, `REDUCED` or `UNKNOWN` for ``t``."""
        key = t.ref()
        if key in self._memo:
            return self._memo[key]
        stack = [t.op]
        while stack:
            op = stack[-1]
            if op.outputs and op.outputs[0].ref() in self._memo:
                stack.pop()
                continue
            pending = [x.op for x in op.inputs if x.ref() not in self._memo]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            self._gradient_free(op)
            try:
                states = self._visit(op)
            except Exception as e:  # noqa: BLE001 - an analysis gap must never crash the step
                states = [self._unknown(op, f"{op.type} op '{op.name}' ({e})")] * len(op.outputs)
            for out, st in zip(op.outputs, states):
                self._memo[out.ref()] = st
        return self._memo.get(key, UNKNOWN)

    def why(self, t: tf.Tensor) -> str:
        """Which op stopped the proof for ``t`` (for messages)."""
        self.of(t)
        return self._why.get(t.ref(), f"'{t.name}'")

    def free(self, t: tf.Tensor) -> bool:
        return self.of(t) == FREE

    def n_value(self, batch: int = 0):
        """The size of batch ``batch`` (`Axis.batch`) as a number: an int when static, a `Sym`
        (a multiple of the step's batch size) when not, None if unknown."""
        if batch:
            found = self.unions.get(batch)
            return None if found is None else found[0]
        return self.n_static if self.n_static is not None else Sym(1)

    def static_size(self, batch: int = 0) -> int | None:
        """The size of batch ``batch`` when it is static, else None."""
        n = self.n_value(batch)
        return n if isinstance(n, int) else None

    def union(self, size, op) -> int:
        """A new batch: the rows of ``op``'s output (a concatenation of example batches along
        their examples' axis), ``size`` of them; its id for `Axis.batch`."""
        batch = max(self.unions, default=0) + 1
        self.unions[batch] = (size, op)
        return batch

    def union_op(self, batch: int):
        """The op that made batch ``batch``, or None (batch 0, or unknown)."""
        found = self.unions.get(batch)
        return None if found is None else found[1]

    # --- symbolic shapes and integer values --------------------------------------------------

    def sym_shape(self, t: tf.Tensor):
        """Dims of ``t`` as ints, `Sym` (multiples of the batch size) or None; None if the rank
        is unknown."""
        if t.shape.rank is None:
            return None
        dims = list(t.shape.as_list())
        st = self.of(t)
        if isinstance(st, Axis) and dims[st.axis] is None:
            dims[st.axis] = mul(self.n_value(st.batch), st.partners)
        return dims

    def sym_value(self, t: tf.Tensor):
        """`tb_gradmom.core.axes.symbolic.sym_value` of ``t`` in this graph."""
        return sym_value(self, t)

    # --- for the handlers ------------------------------------------------------------------

    def refuse(self, op, why: str):
        """`UNKNOWN`, with ``why`` recorded as the reason for each of ``op``'s outputs."""
        for out in op.outputs:
            self._why.setdefault(out.ref(), why)
        return UNKNOWN

    def explain(self, t: tf.Tensor, why: str) -> None:
        """Record ``why`` as the reason ``t`` is `UNKNOWN` (unless one is recorded)."""
        self._why.setdefault(t.ref(), why)

    # --- the driver --------------------------------------------------------------------------

    def _unknown(self, op, why=None):
        return self.refuse(
            op, why or f"{op.type} op '{op.name}', which the analysis cannot see through"
        )

    def _inherit_unknown(self, op):
        for x in op.inputs:
            if self._memo.get(x.ref()) == UNKNOWN:
                for out in op.outputs:
                    self._why.setdefault(out.ref(), self._why.get(x.ref(), f"'{x.name}'"))
                return True
        return False

    def _gradient_free(self, op) -> None:
        """Record which outputs of ``op`` carry no gradient to anything: integer and boolean
        tensors, and the outputs of ops whose inputs all carry none (a one-hot of an argmax,
        a cast of a comparison, a cumulative sum of those), or constants."""
        inert = op.type == "Const" or (
            bool(op.inputs) and all(x.ref() in self._inert for x in op.inputs)
        )
        for t in op.outputs:
            if inert or not _carries_gradient(t.dtype):
                self._inert.add(t.ref())

    def _stopped(self, op, result: list) -> list:
        """``result`` with each `UNKNOWN` output recorded (`_unknown`), or `FREE` when the
        output carries no gradient (`_gradient_free`).

        The per-example gradient of a variable is a row of the jacobian of the per-example
        losses in the batch's forward pass; a tensor that carries no gradient contributes
        nothing to it, whatever examples its value mixes, exactly as ``StopGradient``'s output
        (a constant for the split): the Switch Transformer's capacity, a ``cumsum`` over the
        whole batch of its routing's one-hot, decides which tokens are dropped, and every
        example's gradient is taken with the tokens dropped as they are. Only where a known
        op's handler stops the proof: an op without a handler (its effect on the layout not
        known) or an inherited `UNKNOWN` (a sparse input's ids) stays `UNKNOWN`."""
        out = []
        for t, r in zip(op.outputs, result):
            if r == UNKNOWN and t.ref() in self._inert:
                r = FREE
            elif r == UNKNOWN:
                r = self._unknown(op)
            out.append(r)
        return out

    def _visit(self, op) -> list:
        ty = op.type
        outs = op.outputs
        if not outs:
            return []
        if ty in ("Placeholder", "PlaceholderWithDefault"):
            return [self._placeholder(op)]
        if registry.is_source(ty):
            return [
                Axis(0) if (t.shape.rank and t.dtype != tf.variant) else self._unknown(op)
                for t in outs
            ]
        if registry.is_random(ty) and op.inputs:
            return [self._random(op)] * len(outs)
        if registry.is_free(ty) or not op.inputs:
            return [FREE] * len(outs)
        states = [self._memo[x.ref()] for x in op.inputs]
        if all(s == FREE for s in states):
            if ty == "Tile" and self._tiled_to_the_batch(op):
                return [Axis(0)]
            return [FREE] * len(outs)
        if self._inherit_unknown(op):
            return [UNKNOWN] * len(outs)
        if any(isinstance(s, Padded) for s in states):
            result = h_padded(self, op, states, registry.handler(ty))
            return self._stopped(op, result if isinstance(result, list) else [result] * len(outs))
        data = [s for s in states if isinstance(s, Axis | Elements)]
        if not data:  # only FREE and REDUCED inputs: batch statistics stay batch statistics
            return [REDUCED] * len(outs)
        handler = registry.handler(ty)
        if handler is None:
            return [self._unknown(op)] * len(outs)
        result = handler(self, op, states)
        if not isinstance(result, list):
            result = [result] * len(outs)
        return self._stopped(op, result)

    def _random(self, op):
        """Random numbers drawn in the step: `Axis` 0 when their shape's first entry is computed
        from the batch size (``tf.random.normal([tf.shape(x)[0], d])``,
        ``tf.random.uniform(tf.shape(x))``; `_batch_size_first`): row ``j`` is drawn for
        example ``j`` (a GAN's latents, a VAE's noise, a dropout mask), so a loss of the draws
        alone has one example per row; else `FREE` (numbers shared by every example). A
        constant equal to the batch size (a Python number, or ``tf.shape(x)[0]`` of a static
        shape, which TensorFlow folds into a constant) is read as one only with
        ``static_draws`` (`tb_gradmom.core.plan` asks for it when the loss holds no example
        otherwise): a random projection ``[d_in, d_out]`` whose ``d_in`` happens to equal the
        batch size would otherwise seem to mix the examples.

        Where a proof holds with the draws as rows, each example's loss depends on its own row,
        as it does with the draws held fixed: the per-example losses are the same."""
        shape = op.inputs[0]
        out = op.outputs[0]
        if (
            shape.dtype not in (tf.int32, tf.int64)
            or shape.shape.rank != 1
            or not out.shape.rank
            or self.depth  # inside a loop or a call: draws per iteration are not rows
        ):
            return FREE
        if out.shape.rank and self._batch_size_first(shape):
            return Axis(0)
        if self.static_draws and self.n_static is not None and out.shape.rank:
            dims = self.sym_value(shape)  # (a StridedSlice of a folded shape included)
            if isinstance(dims, list) and dims and dims[0] == self.n_static:
                return Axis(0)
        return FREE

    def _batch_size_first(self, shape: tf.Tensor, depth: int = 0) -> bool:
        """Whether the first entry of the shape vector ``shape`` is computed from the batch
        size: ``tf.shape(x)`` or ``tf.shape(x)[0]`` (packed or concatenated first) of a tensor
        whose examples are on its axis 0 alone. Read from the ops, not from the value: a
        constant equal to the batch size (``[d_in, d_out]`` with ``d_in == n``) is not one."""
        op = shape.op
        if depth > 16:
            return False
        if op.type in ("Identity", "Cast"):
            return self._batch_size_first(op.inputs[0], depth + 1)
        if op.type == "Shape":
            return self.of(op.inputs[0]) == Axis(0)
        if op.type == "ConcatV2":
            first = op.inputs[0]
            return first.shape.rank == 1 and self._batch_size_first(first, depth + 1)
        if op.type == "Pack":
            return self._batch_size(op.inputs[0], depth + 1)
        return False

    def _tiled_to_the_batch(self, op) -> bool:
        """``tf.tile(p[None], [tf.shape(x)[0], 1, ...])``: a value that holds no example (a
        learned initial state) copied once per example, its first multiple read from the batch
        size of an input (`_batch_size_first`, not a constant). Row ``j`` is example ``j``'s
        copy: the per-example gradient of ``p`` is the gradient of its own copy, and the
        copies enter what follows (an RNN's loop) as the examples' rows. Sound as the random
        draws are (`_random`): a proof that holds with the rows as examples holds the same
        per-example losses as one with the copies shared."""
        x = op.inputs[0]
        if self.depth or not x.shape.rank or x.shape[0] != 1:
            return False
        return self._batch_size_first(op.inputs[1])

    def _batch_size(self, t: tf.Tensor, depth: int) -> bool:
        """Whether the scalar ``t`` is ``tf.shape(x)[0]`` of a tensor ``x`` whose examples are on
        its axis 0 alone."""
        op = t.op
        if depth > 16:
            return False
        if op.type in ("Identity", "Cast"):
            return self._batch_size(op.inputs[0], depth + 1)
        if op.type == "StridedSlice" and op.inputs[0].op.type == "Shape":
            begin, end = tf.get_static_value(op.inputs[1]), tf.get_static_value(op.inputs[2])
            shrink = op.get_attr("shrink_axis_mask")
            if begin is None or end is None or begin.size != 1 or not shrink & 1:
                return False
            return int(begin[0]) == 0 and self.of(op.inputs[0].op.inputs[0]) == Axis(0)
        return False

    def _placeholder(self, op):
        t = op.outputs[0]
        src = self._sources.get(t)
        if src is not None:
            if src == UNKNOWN:
                self._why[t.ref()] = (
                    f"input '{t.name}' of the body, whose state is not proven on entry or after "
                    "a pass over it"
                    if self.depth
                    else f"input '{t.name}' (a sparse or ragged tensor, or the inputs "
                    "disagree about the batch size)"
                )
            return src
        # a TF1 graph (no signature), or a captured value
        captured = {c.ref() for c in getattr(op.graph, "internal_captures", None) or []}
        if t.ref() in captured or t.dtype == tf.resource or t.shape.rank == 0:
            return FREE
        if isinstance(op.graph, tf.Graph) and not hasattr(op.graph, "internal_captures"):
            return Axis(0)
        return FREE


def _carries_gradient(dtype: tf.DType) -> bool:
    return dtype.is_floating or dtype.is_complex or dtype in (tf.resource, tf.variant)


def _leaf_kinds(spec) -> list[str]:
    """Per placeholder of an argument's spec: "dense", or "sparse" for the parts of a sparse or
    ragged tensor (their first axis holds non-zeros or values, not examples)."""
    if isinstance(spec, tf.SparseTensorSpec | tf.RaggedTensorSpec):
        return ["sparse"] * len(tf.nest.flatten(spec, expand_composites=True))
    if isinstance(spec, tf.TensorSpec):
        return ["dense"]
    try:  # e.g. a distribution's PerReplicaSpec
        components = tf_private.component_specs(spec)
    except PrivateAPIError:
        components = None
    if components is None:
        return ["sparse"] * len(tf.nest.flatten(spec, expand_composites=True))
    out: list[str] = []
    for c in tf.nest.flatten(components, expand_composites=False):
        if isinstance(c, tf.TypeSpec):
            out.extend(_leaf_kinds(c))
    return out


class _RefMap:
    def __init__(self):
        self._d = {}

    def set(self, t, v):
        self._d[t.ref()] = (t, v)

    def get(self, t):
        item = self._d.get(t.ref())
        return None if item is None else item[1]

    def items_tensors(self):
        return list(self._d.values())
