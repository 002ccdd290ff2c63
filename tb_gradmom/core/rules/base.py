"""What a moment rule receives and what it returns.

A *site* is one op that consumes a requested variable (after pass-through views such as
``Identity``, ``Cast``, ``ExpandDims``, ``Reshape``, ``Squeeze``). A rule looks at the site once,
at trace time, and returns a `Contribution`: how many examples the site sees (evidence for the
batch size) and how to turn the unscaled per-example output gradient ``delta`` into the
per-example gradients of the consumed tensor, or directly into sums of their powers.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np
import tensorflow as tf

from tb_gradmom._compat import PrivateAPIError, tf_private

if TYPE_CHECKING:
    from tb_gradmom.core.axes import Axis, Examples

__all__ = [
    "Site",
    "Contribution",
    "Rule",
    "RuleError",
    "PerExampleFn",
    "PowerSumsFn",
    "PlainGradientFn",
    "RuleFn",
    "PrecheckFn",
    "OutputsFn",
    "SeedFn",
    "TargetFn",
    "HazardFn",
    "AxesFn",
    "sum_over_chunks",
    "static_chunks",
    "static_chunks_only",
    "power",
    "power_sum",
    "UNROLL",
    "power_sums_of",
    "reshape",
    "example_slice",
    "constant",
    "NormsFn",
    "NormsAndSumFn",
    "NORMS_CHUNK_ELEMENTS",
    "norms_chunk",
    "norms_over_chunks",
    "sq_norms_of",
    "ghost_form",
    "sequence_sq_norms",
    "examples_first",
    "per_example_masked",
]

# A static batch of at most this many chunks is summed by unrolled calls chained by control
# dependencies instead of a ``tf.while_loop`` (`sum_over_chunks`): no loop to build, lower and
# run, and static shapes in every chunk. Above it the loop keeps the graph's size bounded.
UNROLL = 16


# Whether the rules being built must give every chunk of examples a size known at trace time
# (`static_chunks`): set by the core for a plan made inside an XLA-compiled function.
_STATIC = threading.local()


@contextlib.contextmanager
def static_chunks(enabled: bool) -> Iterator[None]:
    """Within it, the rules being built (when ``enabled``) slice the examples in chunks of sizes
    known at trace time only (`static_chunks_only`).

    XLA compiles a computation for static shapes. A chunk of ``tf.minimum(chunk, n - start)``
    examples has a size computed in a loop, which XLA carries as a dynamic size bounded by
    ``chunk``; on CPU the convolution rule's sums came out wrong on it, with no error (a Conv1D,
    a batch of 8 known only at run time in chunks of 3: M_4 195 times too big; even a batch of
    3 in one such chunk: 58 times), and a depthwise one did not compile. Nothing of the kind
    happens with sizes known at trace time. The core enters this once per plan
    (`tb_gradmom.core.plan.Plan.xla`) around the moment ops it builds, so every rule of the
    plan follows the same decision."""
    before = getattr(_STATIC, "on", False)
    _STATIC.on = bool(enabled)
    try:
        yield
    finally:
        _STATIC.on = before


def static_chunks_only() -> bool:
    """Whether the moment ops being built must slice the examples in chunks of static sizes
    (inside `static_chunks`): a static batch in chunks with Python-int sizes, a batch known
    only at run time in one chunk of the whole batch (see `sum_over_chunks`)."""
    return bool(getattr(_STATIC, "on", False))


class RuleError(Exception):
    """Raised by a rule when the op is of a supported type but used in an unsupported way."""


@dataclass(frozen=True)
class Site:
    """One op that consumes a requested variable.

    Attributes:
      op: the consuming op.
      index: which input of ``op`` carries the variable's value.
      view: that input tensor (the variable after pass-through views).
      output: the op's output whose gradient the rule needs (a loop's site: a tuple of
        outputs, see `tb_gradmom.core.rules.loops`).
      dtype: the dtype in which moments are computed (float32, or float64 for float64 models).
      var_shape: the variable's shape (``view`` is the resource handle for ``ResourceGather``).
      axes: the analysis of where the examples are (`tb_gradmom.core.axes.Examples`): a rule fires
        only where it proves the axis it treats as the examples, and raises `RuleError`
        otherwise.
      rule: the `Rule` registered for ``op.type``, whose op-level hooks the core asks at
        execution (a site of several outputs: its ``seed``; under XLA: its ``xla_target``);
        None for an op no rule covers (a parameter into any op: the masked VJP).
    """

    op: tf.Operation
    index: int
    view: tf.Tensor
    output: tf.Tensor | tuple[tf.Tensor, ...]
    dtype: tf.DType
    var_shape: tf.TensorShape | None = None
    axes: Examples = field(kw_only=True)
    rule: Rule | None = field(default=None, kw_only=True)

    def input(self, i: int) -> tf.Tensor:
        """The op's i-th input, cast to the moment dtype."""
        return tf.cast(self.op.inputs[i], self.dtype)

    def example_axis(self, t: tf.Tensor, what: str) -> Axis:
        """The proven `Axis` of the examples in ``t``, or `RuleError` naming ``what`` it is."""
        from tb_gradmom.core.axes import UNKNOWN, Axis, describe

        st = self.axes.of(t)
        if isinstance(st, Axis):
            return st
        why = f" (stopped at {self.axes.why(t)})" if st == UNKNOWN else ""
        raise RuleError(
            f"the examples' axis of {what} '{t.name}' is not proven: {describe(st)}{why}"
        )


# A Python int where it is static, else a scalar int tensor (the batch size, a chunk's start
# and size).
Count: TypeAlias = int | tf.Tensor


class PerExampleFn(Protocol):
    """``per_example(delta, n, start, size) -> [size, *view.shape]``: the per-example gradients
    of the consumed tensor ``view`` for examples ``[start, start + size)``. ``delta``: the
    unscaled output gradient (``n * dL/dz`` for a mean loss; for a rule whose `Rule.seed` is
    set, what that seed made of the outputs' gradients, e.g. a loop's ``LoopGrads``), ``n``:
    the batch size."""

    def __call__(self, delta: Any, n: Count, start: Count, size: Count, /) -> tf.Tensor: ...


class PowerSumsFn(Protocol):
    """``power_sums(delta, n, orders, chunk) -> {p: sum_j g_j ** p}``, each shaped like
    ``view``, without materialising every per-example gradient at once. ``chunk``: the most
    examples to process at once (None: all), for rules whose fast path materialises per
    example."""

    def __call__(
        self, delta: Any, n: Count, orders: tuple[int, ...], chunk: int | None, /
    ) -> dict[int, tf.Tensor]: ...


class NormsFn(Protocol):
    """``sq_norms(delta, n, shift, chunk) -> [n]``: ``||g_j + shift||^2`` for every example
    ``j`` of a variable with this one site, ``g_j`` its per-example gradient of the consumed
    tensor (``delta`` as for `PerExampleFn`). ``shift``: None, or a tensor shaped like
    ``view`` (``var_shape`` for a resource) added to every ``g_j`` (the loss's example-free
    terms). ``chunk``: the most examples whose per-example work is held at once (None: the
    rule chooses, see `norms_chunk`). Returns None where the rule has no cheaper form for
    these arguments: the core then materialises ``per_example``."""

    def __call__(
        self, delta: Any, n: Count, shift: tf.Tensor | None, chunk: int | None
    ) -> tf.Tensor | None: ...


class NormsAndSumFn(Protocol):
    """`NormsFn`'s norms and ``sum_j g_j`` (shaped like ``view``, without the shift): the
    gradient of the per-example part of the loss, from the same per-example work."""

    def __call__(
        self, delta: Any, n: Count, shift: tf.Tensor | None, chunk: int | None
    ) -> tuple[tf.Tensor, tf.Tensor]: ...


class PlainGradientFn(Protocol):
    """``plain_gradient(dz) -> [*view.shape]``: the gradient of the consumed tensor as
    ``tf.gradients`` gives it, from the op's output gradient ``dz`` as ``tf.gradients`` gives
    that (scaled as the loss is), by the one op TensorFlow registers for it (a convolution's
    ``Conv2DBackpropFilter``)."""

    def __call__(self, dz: tf.Tensor, /) -> tf.Tensor: ...


@dataclass(frozen=True)
class Contribution:
    """A rule's answer for one site.

    Attributes:
      examples: the number of examples this site sees (batch evidence): a Python int when
        static, else a scalar int tensor (`example_count`).
      evidence: a short description of where ``examples`` comes from, for error messages.
      per_example: the per-example gradients of the consumed tensor for examples
        ``[start, start + size)``, shaped ``[size, *view.shape]``. ``delta`` is the unscaled
        output gradient (``n * dL/dz`` for a mean loss) and ``n`` the batch size.
      per_example_elements: how many elements one example's work materialises at peak
        (used to choose a chunk size).
      power_sums: optional fast path returning ``{p: sum_j g_j ** p}`` without materialising
        per-example gradients (used when the variable has this site only).

    Only the first four are required: with them alone the core computes the moments and the
    per-example norms by materialising ``per_example`` in chunks. The optional members (below,
    each typed by its Protocol) are faster exact forms and what the core may ask of them: the
    power sums, the norms (`NormsFn`, `NormsAndSumFn`), the gradient from the sums
    (``gradient_from_sums``) and TensorFlow's own gradient (`PlainGradientFn`). A contribution
    chained back through a derived parameter (`tb_gradmom.core.rules.derived`) keeps only what
    holds for the variable (its gradient is not the consumed tensor's).
    """

    examples: tf.Tensor | int
    evidence: str
    per_example: PerExampleFn
    per_example_elements: int
    power_sums: PowerSumsFn | None = None
    # Per-example elements the power_sums path holds at once (chunk sizing); None: not chunked.
    power_sums_elements: int | None = None
    # power_sums also gives order 1 (sum_j g_j) at no extra cost, so the core may take the
    # variable's gradient from it instead of building TF's own (e.g. Conv2DBackpropFilter).
    gradient_from_sums: bool = False
    # Optional: the squared norms of the per-example gradients by the rule's cheapest exact
    # form (`NormsFn`), used when the variable has this site only.
    sq_norms: NormsFn | None = None
    # Optional: `NormsAndSumFn`, the same norms and ``sum_j g_j`` from the same per-example
    # work (whose sum is the gradient, as with ``gradient_from_sums``).
    sq_norms_and_sum: NormsAndSumFn | None = None
    # Optional: TensorFlow's own gradient of the consumed tensor from the output gradient
    # (`PlainGradientFn`). A variable with this one site whose gradient comes from the power
    # sums (``gradient_from_sums``) may then be deferred into a gated step's branches
    # (`tb_gradmom.core.moments.run_backward`, ``defer``): from the sums where the moments are
    # logged, by this op where they are not.
    plain_gradient: PlainGradientFn | None = None
    # Under XLA, ``tf.gradients`` must not be asked for the op's gradient (a function call:
    # its ``SymbolicGradient`` does not compile, see `Rule.xla_target`): such a variable is
    # deferred as above, its gradient from the order-1 power sums in both branches.
    xla_gradient_from_sums: bool = False


class RuleFn(Protocol):
    """``rule(site) -> Contribution``, at trace time: the math for one site, or `RuleError`
    where the op is used in a way the rule does not cover."""

    def __call__(self, site: Site, /) -> Contribution: ...


class PrecheckFn(Protocol):
    """``precheck(op, index, axes) -> why``: None where the rule may look at ``op`` (its input
    ``index`` carries the variable), else why not, from where the examples are (``axes``, the
    `tb_gradmom.core.axes.Examples` of the step): the variable then takes the exact fallback
    with that reason (`UnsupportedOpError` with ``fallback="error"``), and no other rule is
    tried at the op."""

    def __call__(self, op: tf.Operation, index: int, axes: Examples, /) -> str | None: ...


class OutputsFn(Protocol):
    """``outputs(op, on_path) -> (t, ...)``: the outputs of ``op`` whose gradients the rule needs
    (``Site.output``), for an op whose rule needs more than its first output (a loop: those
    the loss depends on; ``on_path``: the ops on the loss's path)."""

    def __call__(self, op: tf.Operation, on_path: Collection[tf.Operation], /) -> tuple: ...


class SeedFn(Protocol):
    """``seed(grads, factor) -> delta``: what the rule's functions take as ``delta`` for a site
    of several outputs (`OutputsFn`), from the loss's gradients of those outputs (a tuple in
    their order, None where one is structurally zero) and the factor the core scales an
    output gradient by (the batch size for a mean loss, the loss scale's inverse)."""

    def __call__(self, grads: tuple, factor: float | tf.Tensor, /) -> Any: ...


class TargetFn(Protocol):
    """``xla_target(out) -> t``: under XLA, the tensor whose gradient the core asks of
    ``tf.gradients`` in place of the site's output ``out`` (the same values)."""

    def __call__(self, out: tf.Tensor, /) -> tf.Tensor: ...


class HazardFn(Protocol):
    """``hazard(op, depth) -> why``: why TensorFlow's ``pfor`` must not vectorise the backward
    pass through ``op`` (the exact fallback would return wrong numbers, with no error), or
    None; ``depth``: how many function calls deep ``op`` is (`vectorisation_hazard`)."""

    def __call__(self, op: tf.Operation, depth: int, /) -> str | None: ...


class AxesFn(Protocol):
    """``axes(ex, op, states) -> state``: where the examples are in the outputs of ``op`` (one
    `tb_gradmom.core.axes.State` for all, or a list, one per output) from its inputs'
    ``states``; the transfer function of `tb_gradmom.core.axes.handlers` for an op that the
    analysis has no handler for."""

    def __call__(self, ex: Examples, op: tf.Operation, states: list, /) -> Any: ...


@dataclass(frozen=True)
class Rule:
    """One op family's rule and all that the core asks of its ops (`tb_gradmom.core.rules.REGISTRY`
    maps each of ``ops`` to it). Only ``name``, ``ops`` and ``contribution`` are required.

    Attributes:
      name: a short name for messages (``"conv"``).
      ops: the op types the rule covers.
      contribution: `RuleFn`, the math: ``Site -> Contribution``.
      precheck: `PrecheckFn`, run before the site is built (the conv rule: the batch axis of its
        input holds the examples alone).
      outputs: `OutputsFn`, for a site that needs the gradients of several outputs (default:
        the op's first output); then ``seed`` is required too.
      seed: `SeedFn`, the ``delta`` of such a site.
      xla_target: `TargetFn`, under XLA the tensor differentiated in place of an output of
        ``ops`` (a function call's output: past an identity).
      vectorisation_hazard: `HazardFn`, the reason the exact fallback must refuse a variable
        whose backward pass crosses one of ``ops``.
      broadcasts: the rule covers a parameter broadcast by the op itself (an add or a multiply):
        a parameter broadcast to the batch before such an op is seen as used by it directly.
      axes: `AxesFn`, where the examples go through one of ``ops`` that the analysis
        (`tb_gradmom.core.axes`) has no handler for; ignored for an op that has one.
    """

    name: str
    ops: tuple[str, ...]
    contribution: RuleFn
    precheck: PrecheckFn | None = None
    outputs: OutputsFn | None = None
    seed: SeedFn | None = None
    xla_target: TargetFn | None = None
    vectorisation_hazard: HazardFn | None = None
    broadcasts: bool = False
    axes: AxesFn | None = None

    def __post_init__(self) -> None:
        if isinstance(self.ops, str) or not self.ops:
            raise TypeError(f"rule '{self.name}': ops must be a non-empty tuple of op types")
        if (self.outputs is None) != (self.seed is None):
            raise TypeError(
                f"rule '{self.name}': outputs and seed go together (a site of several outputs "
                "needs the seed that makes its delta from their gradients)"
            )

    def __call__(self, site: Site) -> Contribution:
        """The rule's `Contribution` for ``site`` (`RuleError` where it does not apply)."""
        return self.contribution(site)


def example_count(t: tf.Tensor, axis: int, partners: int = 1) -> Count:
    """The number of examples along ``axis`` of ``t`` (``partners`` entries per example): a
    Python int when the axis is static (no op, and no run-time check), else a scalar tensor."""
    dim = t.shape[axis] if t.shape.rank is not None else None
    if dim is not None:
        return int(dim) // partners
    size = tf.shape(t)[axis]
    return size if partners == 1 else size // partners


# Per graph being built: int32 constants by value (`constant`). The tensors are held by weak
# references: a graph's tensors refer to their graph, so holding them would keep every graph
# (every traced function) alive for as long as the process.
_CONSTANTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cache_graph() -> tf.Graph | None:
    """The graph being built, where ops may be shared across its users; None eagerly or inside
    a TF1 control-flow context (a ``tf.compat.v1`` loop or cond body, XLA), whose ops cannot be
    used outside it, or where TensorFlow lacks the private method that tells (no sharing)."""
    if tf.executing_eagerly():
        return None
    graph = tf.compat.v1.get_default_graph()
    try:
        if tf_private.control_flow_context(graph) is not None:
            return None
    except PrivateAPIError:
        return None
    return graph


def _cached(cache: weakref.WeakKeyDictionary, graph: tf.Graph, key: Any) -> tf.Tensor | None:
    ref = cache.get(graph, {}).get(key)
    return None if ref is None else ref()


def _cache(cache: weakref.WeakKeyDictionary, graph: tf.Graph, key: Any, t: tf.Tensor) -> None:
    cache.setdefault(graph, {})[key] = weakref.ref(t)


def constant(value: Any) -> Any:
    """An int32 constant (a reduction axis, a shape, slice bounds, paddings: an int or nested
    lists of ints) made once per graph and shared by every op of the graph that asks for the
    same value.

    The rules ask for the same few small constants thousands of times (ResNet50's moments
    step: 6,000 constants, most of them copies of ``0``, ``[16, -1, 64]`` and the like); each
    is an op to trace and to optimise at the first call. Made with no control dependencies, so
    sharing one adds no ordering between its users. Where ops are being added to a TF1
    control-flow context (a ``tf.compat.v1`` loop or cond body, XLA), or eagerly, ``value`` is
    returned as it is and TensorFlow makes its own constant, as before."""
    graph = _cache_graph()
    if graph is None:
        return value
    array = np.asarray(value, dtype=np.int64)
    return _shared_constant(graph, (array.shape, tuple(array.ravel().tolist())), array, tf.int32)


def scalar(value: float, dtype: tf.DType) -> tf.Tensor:
    """A scalar constant of ``dtype`` (a batch size, a power of it), made once per graph as
    `constant` is; TensorFlow's own constant where `constant` would not share."""
    graph = _cache_graph()
    if graph is None:
        return tf.constant(value, dtype)
    dtype = tf.as_dtype(dtype)
    return _shared_constant(graph, ("scalar", dtype.name, float(value)), value, dtype)


def _shared_constant(graph: tf.Graph, key: Any, value: Any, dtype: tf.DType) -> tf.Tensor:
    """The constant cached under ``key`` in ``graph``, made (with no control dependencies)
    the first time."""
    t = _cached(_CONSTANTS, graph, key)
    if t is None:
        with tf.control_dependencies(None), tf.name_scope("gradmom_constants/"):
            t = tf.constant(value, dtype)
        _cache(_CONSTANTS, graph, key, t)
    return t


def times(t: tf.Tensor, factor: float | tf.Tensor) -> tf.Tensor:
    """``t * factor``: ``t`` itself for a factor of 1, a shared constant for a number."""
    if isinstance(factor, int | float):
        return t if factor == 1 else t * scalar(factor, t.dtype)
    return t * factor


def examples_first(t: tf.Tensor, ax: Axis, n) -> tf.Tensor:
    """``t`` rearranged to ``[n, partners, *other dims]``: the examples first, then the entries of
    the (folded) example axis that belong to each example, then the remaining axes in order.

    Static sizes stay static (a reshape to Python numbers: no shape ops, and the shapes of
    what follows are known), and an axis laid out ``[n, inner]`` (``outer == 1``: a Dense on
    sequences) is one reshape, no transpose."""
    rank = t.shape.rank
    if ax.axis != 0:
        t = tf.transpose(t, [ax.axis] + [i for i in range(rank) if i != ax.axis])
    if ax.pure:
        return tf.expand_dims(t, 1)
    n_static = tf.get_static_value(n)
    n_dim = int(n_static) if n_static is not None else n
    rest_shape = t.shape[1:]
    if rest_shape.is_fully_defined() and n_static is not None:
        dims = rest_shape.as_list()

        def shape(*lead):
            return [*lead, *dims]

    else:
        rest = tf.shape(t)[1:]

        def shape(*lead):
            return tf.concat([list(lead), rest], 0)

    if ax.outer == 1:  # [n, inner] row-major: already examples first
        return tf.reshape(t, shape(n_dim, ax.inner))
    t = tf.reshape(t, shape(ax.outer, n_dim, ax.inner))
    t = tf.transpose(t, [1, 0, 2] + list(range(3, rank + 2)))
    return tf.reshape(t, shape(n_dim, ax.partners))


def per_example_masked(t: tf.Tensor, ax: Axis, n, start, size) -> tf.Tensor:
    """``[size, *t.shape]``: entry ``s`` is ``t`` with every entry zeroed but those of example
    ``start + s``. For a parameter broadcast to the batch (a class token tiled to ``[n, 1, d]``)
    whose copies meet the examples one by one: example ``j``'s gradient of it is ``j``'s copy."""
    rank = t.shape.rank
    ef = examples_first(t, ax, n)[start : start + size]  # [size, P, *rest]
    hot = tf.one_hot(tf.range(size) + start, n, dtype=t.dtype)  # [size, n]
    extra = [1] * rank  # P and the rank - 1 other axes
    full = tf.reshape(hot, tf.concat([tf.shape(hot), extra], 0)) * ef[:, None]  # [size, n, P, rest]
    rest = tf.shape(ef)[2:]
    # back from [n, outer * inner, *rest] to t's layout, for each of the `size` copies
    full = tf.reshape(full, tf.concat([[size, n, ax.outer, ax.inner], rest], 0))
    full = tf.transpose(full, [0, 2, 1, 3] + list(range(4, rank + 3)))
    full = tf.reshape(full, tf.concat([[size, -1], rest], 0))  # [size, outer*n*inner, *rest]
    if ax.axis != 0:
        perm = [0] + list(range(2, ax.axis + 2)) + [1] + list(range(ax.axis + 2, rank + 1))
        full = tf.transpose(full, perm)
    return full


# Per graph being built: `examples_first` of a tensor, by (tensor, axis, static batch).
_EXAMPLES_FIRST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def examples_first_once(t: tf.Tensor, ax: Axis, n: Count) -> tf.Tensor:
    """`examples_first` of ``t``, made once per graph for a static batch:
    the unrolled chunks of a variable's per-example gradients slice the same rearranged tensor
    instead of each rearranging all of ``t`` again (ops to trace, and a full copy per chunk where
    the rearrangement is a transpose). Inside a TF1 control-flow context, eagerly, or for a
    batch known only at run time, it is made at each call, as before."""
    n_static = tf.get_static_value(n)
    graph = _cache_graph()
    if n_static is None or graph is None:
        return examples_first(t, ax, n)
    # by id: the graph holds its tensors (an id is not reused while it lives), and a key that
    # held ``t`` would hold the graph
    key = (id(t), ax, int(n_static))
    found = _cached(_EXAMPLES_FIRST, graph, key)
    if found is None:
        found = examples_first(t, ax, int(n_static))
        _cache(_EXAMPLES_FIRST, graph, key, found)
    return found


def reshape(x: tf.Tensor, shape: Any) -> tf.Tensor:
    """``tf.reshape(x, shape)``, or ``x`` itself when its static shape already is ``shape``.

    A reshape that changes nothing still costs an op and its shape constant to trace and to
    optimise at the first call (ResNet50's moments step had about 900 of them, from views of a
    per-example gradient already in the variable's shape). ``shape``: a list of ints (at most
    one -1) or a `tf.TensorShape`; anything else (tensors, unknown sizes) goes to
    ``tf.reshape``."""
    dims = None
    if isinstance(shape, tf.TensorShape):
        dims = shape.as_list() if shape.rank is not None else None
    elif isinstance(shape, list | tuple):
        dims = list(shape)
    if dims is not None and x.shape.is_fully_defined() and len(dims) == x.shape.rank:
        if all(type(d) is int for d in dims):
            current = x.shape.as_list()
            free = [i for i, d in enumerate(dims) if d == -1]
            known = int(np.prod([d for d in dims if d != -1], dtype=np.int64))
            total = int(np.prod(current, dtype=np.int64))
            if len(free) == 1 and known > 0 and total % known == 0:
                dims[free[0]] = total // known
            if dims == current:
                return x
    if isinstance(shape, list | tuple) and all(type(d) is int for d in shape):
        return tf.reshape(x, constant(shape))
    return tf.reshape(x, shape)


def example_slice(x: tf.Tensor, start: Count, size: Count) -> tf.Tensor:
    """``x[start : start + size]``, or ``x`` itself when that is all of it (a static batch in
    one chunk): no slice op and its three constants."""
    if type(start) is int and start == 0 and x.shape.rank and x.shape[0] is not None:
        size_static = size if type(size) is int else tf.get_static_value(size)
        if size_static is not None and int(size_static) == x.shape[0]:
            return x
    if type(start) is int and type(size) is int:
        return tf.strided_slice(x, constant([start]), constant([start + size]), constant([1]))
    if type(size) is int and x.shape.rank:
        # a start computed in a loop and a static size (`static_chunks`): a Slice, whose size
        # XLA knows (a DynamicSlice), and whose output keeps it in its static shape
        begin = tf.concat([tf.reshape(tf.cast(start, tf.int32), [1]), [0] * (x.shape.rank - 1)], 0)
        return tf.slice(x, begin, [size] + [-1] * (x.shape.rank - 1))
    return x[start : start + size]


def power(g_pow: dict[int, tf.Tensor], p: int) -> tf.Tensor:
    """``g ** p`` by products, reusing and filling ``g_pow`` (``{1: g}`` at first)."""
    for q in range(2, p + 1):
        if q not in g_pow:
            g_pow[q] = g_pow[q // 2] * g_pow[q - q // 2]
    return g_pow[p]


def power_sum(g_pow: dict[int, tf.Tensor], p: int) -> tf.Tensor:
    """``sum over axis 0 of g ** p`` (see `power`)."""
    return tf.reduce_sum(power(g_pow, p), axis=constant(0))


def power_sums_of(
    g: tf.Tensor, orders: Sequence[int], *, unsquared: bool = False
) -> dict[int, tf.Tensor]:
    """``{p: sum over axis 0 of g ** p}`` for every ``p`` in ``orders``.

    When no order above 2 is asked for, ``sum g ** 2`` is the square of TF's Euclidean-norm
    reduction, one pass over ``g`` that squares as it sums: no ``g ** 2`` tensor is written
    (as big as the per-example gradients, e.g. ``[32, 128, 512]`` for a Dense on sequences)
    and read back. Two roundings more than summing the squares (the root and the square:
    a relative 2.4e-7 in float32). With ``unsquared`` the norm is returned as it is, for the
    caller to square (once for many pieces; see `norms_squared`).
    """
    orders = tuple(orders)
    if orders and max(orders) == 2:
        out = {}
        for p in orders:
            if p == 1:
                out[1] = tf.reduce_sum(g, axis=constant(0))
            elif static_chunks_only():
                # XLA has no EuclideanNorm kernel; it fuses the square into the sum itself
                squares = tf.reduce_sum(tf.square(g), axis=constant(0))
                out[2] = tf.sqrt(squares) if unsquared else squares
            else:
                norm = tf.math.reduce_euclidean_norm(g, axis=constant(0))
                out[2] = norm if unsquared else tf.square(norm)
        return out
    g_pow = {1: g}
    return {p: power_sum(g_pow, p) for p in orders}


def norms_squared(sums: dict[int, tf.Tensor], orders: Sequence[int]) -> dict[int, tf.Tensor]:
    """``sums`` from `power_sums_of` with ``unsquared=True``, their order 2 squared."""
    if orders and max(orders) == 2 and 2 in sums:
        return {**sums, 2: tf.square(sums[2])}
    return sums


def sum_over_chunks(
    n: Count,
    chunk: int | None,
    orders: Sequence[int],
    shape: tf.TensorShape | Sequence[int],
    dtype: tf.DType,
    chunk_sums: Callable[[Count, Count], dict[int, tf.Tensor]],
    name: str = "chunks",
    unroll: int = 0,
) -> dict[int, tf.Tensor]:
    """``{p: sum over chunks of chunk_sums(start, size)[p]}`` for examples ``[0, n)``.

    One call when the batch is statically no bigger than ``chunk`` (or ``chunk`` is None);
    otherwise a ``tf.while_loop`` over chunks of ``chunk`` examples, one at a time, so only one
    chunk's per-example tensors are alive. With ``unroll``, a static batch of at most
    ``unroll`` chunks is summed by that many calls instead, each one's ops made to wait for the
    previous chunk's sums (the same one-at-a-time order, without a loop to trace, lower and
    differentiate-proof at run time). The unrolled chunks are as even as their number allows
    (16 examples in chunks of at most 6: 6, 5, 5) and their bounds are Python ints, so every
    chunk's tensors keep static shapes.

    Inside `static_chunks` (an XLA-compiled function) no chunk has a size computed at run time:
    a batch known only at run time is one chunk of the whole batch (the per-example tensors of
    all its examples alive at once), and a static batch of more than ``unroll`` chunks goes in
    a loop over chunks of exactly ``chunk`` examples (a start computed in the loop, a Python
    int size: XLA's dynamic slice), then one last chunk of the rest with Python-int bounds.
    """
    n_static = tf.get_static_value(n)
    if chunk is None or (n_static is not None and int(n_static) <= chunk):
        return chunk_sums(0, n)
    if static_chunks_only():
        if n_static is None:
            return chunk_sums(0, n)
        if -(-int(n_static) // chunk) > unroll:
            return _static_loop(int(n_static), chunk, orders, shape, dtype, chunk_sums, name)
    if n_static is not None and -(-int(n_static) // chunk) <= unroll:
        total = int(n_static)
        count = -(-total // chunk)
        acc: dict[int, tf.Tensor] = {}
        start = 0
        for k in range(count):
            size = total // count + (1 if k < total % count else 0)
            with tf.control_dependencies([acc[p] for p in orders] if acc else []):
                sums = chunk_sums(start, size)
            acc = {p: acc[p] + sums[p] if acc else sums[p] for p in orders}
            start += size
        return acc
    return _chunk_loop(
        (n + chunk - 1) // chunk,
        lambda start: tf.minimum(chunk, n - start),
        chunk,
        orders,
        shape,
        dtype,
        chunk_sums,
        name,
    )


def _chunk_loop(
    count: Count,
    size_of: Callable[[tf.Tensor], Count],
    chunk: int,
    orders: Sequence[int],
    shape: tf.TensorShape | Sequence[int],
    dtype: tf.DType,
    chunk_sums: Callable[[Count, Count], dict[int, tf.Tensor]],
    name: str,
    maximum_iterations: int | None = None,
) -> dict[int, tf.Tensor]:
    """``{p: sum of chunk_sums(k * chunk, size_of(k * chunk))[p]}`` over ``k < count``, in a
    ``tf.while_loop`` that runs one chunk at a time."""
    zeros = tuple(tf.zeros(shape, dtype) for _ in orders)

    def body(i: tf.Tensor, accs: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, tuple[tf.Tensor, ...]]:
        start = i * chunk
        sums = chunk_sums(start, size_of(start))
        return i + 1, tuple(a + sums[p] for a, p in zip(accs, orders))

    _, accs = tf.while_loop(
        lambda i, _: i < count,
        body,
        (tf.constant(0), zeros),
        parallel_iterations=1,
        maximum_iterations=maximum_iterations,
        name=name,
    )
    return dict(zip(orders, accs))


def _static_loop(
    n: int,
    chunk: int,
    orders: Sequence[int],
    shape: tf.TensorShape | Sequence[int],
    dtype: tf.DType,
    chunk_sums: Callable[[Count, Count], dict[int, tf.Tensor]],
    name: str,
) -> dict[int, tf.Tensor]:
    """`sum_over_chunks` of a static batch of ``n`` examples where every chunk's size must be a
    Python int (`static_chunks`): a ``tf.while_loop`` over ``n // chunk`` chunks of ``chunk``
    examples, then one chunk of the ``n % chunk`` left."""
    full, rest = divmod(n, chunk)
    out = _chunk_loop(full, lambda _: chunk, chunk, orders, shape, dtype, chunk_sums, name, full)
    if rest:
        with tf.control_dependencies([out[p] for p in orders]):
            sums = chunk_sums(full * chunk, rest)
        out = {p: out[p] + sums[p] for p in orders}
    return out


# Per-example elements that the norms' work of one chunk of examples may hold at once (16 MiB
# in float32): a Dense on sequences' per-example kernels, or its per-example Gram matrices.
NORMS_CHUNK_ELEMENTS = 1 << 22


def norms_chunk(chunk: int | None, per_example: int) -> int:
    """``chunk`` if given, else the examples whose ``per_example`` elements fit in
    `NORMS_CHUNK_ELEMENTS`."""
    if chunk is not None:
        return int(chunk)
    return max(1, NORMS_CHUNK_ELEMENTS // max(int(per_example), 1))


def sq_norms_of(g: tf.Tensor) -> tf.Tensor:
    """``[rows]``: the squared Euclidean norm of each row of ``g`` (every axis but the first)."""
    rank = g.shape.rank
    if rank is not None and rank <= 1:
        return tf.square(g)
    axes = constant(list(range(1, rank))) if rank is not None else tf.range(1, tf.rank(g))
    return tf.reduce_sum(tf.square(g), axis=axes)


def norms_over_chunks(
    n: Count,
    chunk: int | None,
    dtype: tf.DType,
    chunk_norms: Callable[[Count, Count], tf.Tensor],
    name: str = "norm_chunks",
) -> tf.Tensor:
    """The ``[n]`` vector whose entries ``[start, start + size)`` are ``chunk_norms(start,
    size)``, for chunks of at most ``chunk`` examples taken one at a time (`sum_over_chunks`:
    each chunk's vector is padded to ``[n]`` with zeros and the chunks summed)."""
    n_static = tf.get_static_value(n)
    if chunk is None or (n_static is not None and int(n_static) <= chunk):
        return chunk_norms(0, n)
    total = int(n_static) if n_static is not None else n

    def padded(start: Count, size: Count) -> dict[int, tf.Tensor]:
        v = chunk_norms(start, size)
        if type(start) is int and type(size) is int and type(total) is int:
            pads = constant([[start, total - start - size]])
        else:
            pads = tf.reshape(tf.stack([start, total - start - size]), [1, 2])
            pads = tf.cast(pads, tf.int32)
        return {0: tf.pad(v, pads)}

    shape = [total] if type(total) is int else tf.reshape(tf.cast(total, tf.int32), [1])
    return sum_over_chunks(n, chunk, (0,), shape, dtype, padded, name=name, unroll=UNROLL)[0]


# Tests set it to force one form of `sequence_sq_norms` (True: Gram, False: materialised).
FORCE_GHOST: bool | None = None


def ghost_form(positions: int | None, d_in: int, d_out: int) -> bool:
    """Whether the squared norms of ``g_j = sum_t a_{j,t} delta_{j,t}^T`` (``positions``
    terms of ``d_in x d_out``) take the Gram form: ``2 T^2 <= d_in d_out`` (the two ``T x T``
    Gram matrices against one ``d_in x d_out`` per-example gradient, as fastDP's mixed rule
    chooses; Bu et al. 2023). Never for a ``T`` unknown at trace time (its memory unbounded)."""
    if FORCE_GHOST is not None:
        return FORCE_GHOST
    return positions is not None and 2 * positions * positions <= d_in * d_out


def sequence_sq_norms(
    a: tf.Tensor,
    d: tf.Tensor,
    n: Count,
    shift: tf.Tensor | None,
    chunk: int | None,
    ghost: bool,
) -> tf.Tensor:
    """``[n]``: ``||A_j^T D_j + C||^2`` for ``a: [n, T, d_in]``, ``d: [n, T, d_out]`` (the
    examples first) and ``shift`` ``C: [d_in, d_out]`` or None.

    Gram ("ghost") form: ``||A_j^T D_j||^2 = <A_j A_j^T, D_j D_j^T>`` (Li et al. 2022, "Large
    language models can be strong differentially private learners"), ``O(T^2 (d_in + d_out))``
    per example and ``2 T^2`` elements; materialised: ``A_j^T D_j`` itself, ``O(T d_in d_out)``
    and ``d_in d_out`` elements. The shift enters as ``2 <A_j^T D_j, C> + ||C||^2`` with
    ``<A_j^T D_j, C> = sum_t (A_j C)_t . D_{j,t}``. Chunks of at most ``chunk`` examples."""
    t = a.shape[1]
    d_in, d_out = int(a.shape[-1]), int(d.shape[-1])
    per_example = 2 * (t or 1024) ** 2 if ghost else d_in * d_out
    if shift is not None and ghost:
        per_example += (t or 1024) * d_out
    c2 = None if shift is None else tf.reduce_sum(tf.square(shift))

    def chunk_norms(start: Count, size: Count) -> tf.Tensor:
        aj = example_slice(a, start, size)
        dj = example_slice(d, start, size)
        if not ghost:
            g = tf.linalg.matmul(aj, dj, transpose_a=True)  # [size, d_in, d_out]
            return sq_norms_of(g if shift is None else g + shift)
        grams = tf.linalg.matmul(aj, aj, transpose_b=True) * tf.linalg.matmul(
            dj, dj, transpose_b=True
        )
        out = tf.reduce_sum(grams, axis=constant([1, 2]))
        if shift is not None:
            dots = tf.reduce_sum(tf.linalg.matmul(aj, shift) * dj, axis=constant([1, 2]))
            out = out + times(dots, 2.0) + c2
        return out

    return norms_over_chunks(n, norms_chunk(chunk, per_example), a.dtype, chunk_norms)
