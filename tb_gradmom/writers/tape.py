"""`gradmom.GradientTape`: a ``tf.GradientTape`` that logs the moments of what it differentiates.

    with gradmom.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)  # what tf.GradientTape returns

``tape.gradient`` returns exactly what ``tf.GradientTape.gradient`` returns. Inside a
``tf.function``, when there is somewhere to log, it also logs the moments of the per-example
gradients of that call (`tb_gradmom.writers.summary.moments`, one backward pass for both):

* a `tb_gradmom.keras.GradMoments` callback is attached to the ``fit`` this step runs in: its
  writer, step (the optimizer's iteration count) and interval (the callback runs the steps it
  logs once more, beforehand, with their updates undone, and writes what the tapes computed);
* else the tape's own ``writer=`` (at ``step=``, or ``tf.summary``'s default step);
* else the default summary writer, when it records (``writer.as_default()`` and
  ``tf.summary.record_if``, as for any ``tf.summary`` op).

Otherwise, and eagerly, it is ``tf.GradientTape`` and nothing else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import tensorflow as tf

from tb_gradmom.core import graph as _graph
from tb_gradmom.core import moments as _moments
from tb_gradmom.core import plan as _plan
from tb_gradmom.core.errors import BatchSizeError, PerExampleLossError, UnsupportedOpError
from tb_gradmom.writers import summary as _summary

__all__ = ["GradientTape", "CallbackContext", "active_context"]


@dataclasses.dataclass
class CallbackContext:
    """What a `GradMoments` callback lends to the tapes traced in its logged train step."""

    writer: Any
    every_n_steps: int
    orders: tuple[int, ...]
    variables: list | None
    max_elements: int | None
    per_variable_scalars: bool
    log_learning_rate: bool
    fallback: str
    optimizer: Any
    coupled: str = "exact"
    map_dtype: str = _summary.DEFAULT_MAP_DTYPE
    # per-example norms (`summary.moments`' log_examples, max_examples, per_variable_norms)
    log_examples: bool = False
    max_examples: int = 1024
    per_variable_norms: bool = False
    # what a logged step computes (`summary.moments`' mode): "moments" or "norms"
    mode: str = "moments"
    # set when a tape of the traced step logged: the callback warns when none did
    used: bool = False
    # what the tapes of the traced step computed, in order: returned by the logged step
    collected: list = dataclasses.field(default_factory=list)
    # (group, variables) of each entry of `collected`, from the step's trace
    layout: list = dataclasses.field(default_factory=list)
    # why tape calls of the traced step could not log
    errors: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Collected:
    """What one tape call computed under a callback: its tag group and its `Logged` record
    (``n`` int64, the loss unscaled float64)."""

    group: str | None
    logged: _moments.Logged


_LOCAL = threading.local()


def active_context() -> CallbackContext | None:
    """The callback context of the train step being traced, if any."""
    stack = getattr(_LOCAL, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def callback_context(ctx: CallbackContext) -> Iterator[CallbackContext]:
    """Lends ``ctx`` to the tapes traced inside (a `GradMoments` logged train step)."""
    stack = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = _LOCAL.stack = []
    stack.append(ctx)
    try:
        yield ctx
    finally:
        stack.pop()


_WARNED: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(message, stacklevel=4)


class GradientTape(tf.GradientTape):
    """``tf.GradientTape`` that also logs gradient moments (see the module docstring).

    Args:
      persistent, watch_accessed_variables: as for ``tf.GradientTape``.
      writer: a summary writer to log to (default: the callback's, else the default writer).
      step: the step to log at with ``writer`` (default ``tf.summary``'s step).
      name: the tag group of this tape's calls (a GAN's ``"generator"``), as
        `tb_gradmom.summary.moments`' ``name``.
      **kwargs: more `tb_gradmom.summary.moments` arguments (``orders``, ``max_elements``,
        ``per_variable_scalars``, ``learning_rate``, ``fallback``, ``loss_scale``, ...); a
        callback's own settings take precedence under ``fit``.
    """

    def __init__(
        self,
        persistent: bool = False,
        watch_accessed_variables: bool = True,
        *,
        writer=None,
        step=None,
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(persistent=persistent, watch_accessed_variables=watch_accessed_variables)
        bad = set(kwargs) - _SUMMARY_KWARGS
        if bad:
            raise TypeError(
                f"gradmom.GradientTape got unexpected arguments {sorted(bad)}; it takes "
                f"persistent, watch_accessed_variables, writer, step, name and "
                f"{sorted(_SUMMARY_KWARGS)}"
            )
        self._gm_writer = writer
        self._gm_step = step
        self._gm_name = name
        self._gm_kwargs = kwargs

    @tf.autograph.experimental.do_not_convert
    def gradient(
        self,
        target,
        sources,
        output_gradients=None,
        unconnected_gradients=tf.UnconnectedGradients.NONE,
    ):
        plain = super().gradient
        if output_gradients is not None or not tf.inside_function():
            return plain(target, sources, output_gradients, unconnected_gradients)
        ctx = active_context()
        if ctx is None and self._gm_writer is None and not _default_writer_may_record():
            return plain(target, sources, output_gradients, unconnected_gradients)
        flat = tf.nest.flatten(sources)
        if not flat or not all(_is_variable(s) for s in flat):
            _warn_once(
                "sources",
                "gradmom.GradientTape logs moments for variables only: a call whose sources "
                "include tensors is differentiated as tf.GradientTape does, without logging.",
            )
            return plain(target, sources, output_gradients, unconnected_gradients)
        if tf.nest.is_nested(target):
            return plain(target, sources, output_gradients, unconnected_gradients)
        target = tf.convert_to_tensor(target)
        if target.shape.rank not in (0, 1):
            _warn_once(
                "rank",
                "gradmom.GradientTape logs moments of a scalar loss or a [n] vector of "
                f"per-example losses; a target of shape {target.shape} is differentiated "
                "as tf.GradientTape does, without logging.",
            )
            return plain(target, sources, output_gradients, unconnected_gradients)
        # the sources the tape would give a gradient for
        watched = {id(_plan.tf_variable(v, i)) for i, v in enumerate(self.watched_variables())}
        keep = [i for i, v in enumerate(flat) if id(_plan.tf_variable(v, i)) in watched]
        log_only = None
        if ctx is not None and ctx.variables is not None:
            wanted = {id(_plan.tf_variable(v, i)) for i, v in enumerate(ctx.variables)}
            log_only = [flat[i] for i in keep if id(_plan.tf_variable(flat[i], i)) in wanted]
            if not log_only:
                return plain(target, sources, output_gradients, unconnected_gradients)
        if not keep:
            return plain(target, sources, output_gradients, unconnected_gradients)
        loss = tf.reduce_sum(target) if target.shape.rank == 1 else target
        try:
            with self.stop_recording() if self._recording else contextlib.nullcontext():
                grads = self._logged_gradients(loss, [flat[i] for i in keep], ctx, log_only)
        except _LOG_ERRORS as e:
            if ctx is None:
                raise
            # under a callback the step's trace must finish (it may create the optimizer's
            # variables): the callback says why this call logs nothing
            ctx.errors.append(f"{type(e).__name__}: {e}")
            return plain(target, sources, output_gradients, unconnected_gradients)
        out: list[Any] = [None] * len(flat)
        for i, g in zip(keep, grads):
            out[i] = g
        if unconnected_gradients == tf.UnconnectedGradients.ZERO:
            out = [tf.zeros_like(v) if g is None else g for v, g in zip(flat, out)]
        if not self._persistent:
            # as tf.GradientTape: a non-persistent tape gives one gradient call
            self._tape = None
        return tf.nest.pack_sequence_as(sources, out)

    def _logged_gradients(self, loss, variables: Sequence, ctx, log_only):
        kwargs = dict(self._gm_kwargs)
        if ctx is not None:
            return self._collect(loss, variables, ctx, log_only)
        if self._gm_writer is not None:
            with self._gm_writer.as_default():
                return _summary.moments(
                    loss, variables, name=self._gm_name, step=self._gm_step, **kwargs
                )
        return _summary.moments(loss, variables, name=self._gm_name, step=self._gm_step, **kwargs)

    def _collect(self, loss, variables: Sequence, ctx: CallbackContext, log_only):
        """Under a callback (its logged step, a dry run whose updates are undone): the moments
        go to ``ctx.collected``, to be returned by the step and written outside it."""
        ctx.used = True
        scale = _loss_scale_of(loss, ctx.optimizer)
        orders = tuple(sorted(set(ctx.orders) | {1, 2})) if ctx.mode == "moments" else (1,)
        options = _plan.Options.check(
            orders, None, None, None, ctx.fallback, scale, coupled=ctx.coupled
        )
        plan = _plan.make_plan(loss, variables, options, name="gradmom_callback")
        ids = {id(_plan.tf_variable(v, i)) for i, v in enumerate(log_only or variables)}
        indices = [i for i, v in enumerate(variables) if id(_plan.tf_variable(v, i)) in ids]
        # a dry run: its gradients are never applied (Keras' own step runs the batch), so
        # they may come from the moments' sums (no separate filter gradient)
        ids = _summary._example_ids(self._gm_kwargs.get("example_ids"))
        norms = ctx.log_examples or bool(self._gm_kwargs.get("log_examples")) or ids is not None
        computed = _moments.compute_logged(
            plan, indices, exact_gradients=False, norms=norms, ids=ids, mode=ctx.mode
        )
        assert computed.logged is not None
        logged = computed.logged
        ctx.collected.append(
            Collected(group=self._gm_name, logged=replace(logged, n=tf.cast(logged.n, tf.int64)))
        )
        return computed.grads


_LOG_ERRORS = (PerExampleLossError, UnsupportedOpError, BatchSizeError)

_SUMMARY_KWARGS = frozenset(
    {
        "orders",
        "reduction",
        "max_elements",
        "per_variable_scalars",
        "learning_rate",
        "batch_size",
        "chunk_size",
        "fallback",
        "loss_scale",
        "coupled",
        "map_dtype",
        "log_examples",
        "example_ids",
        "max_examples",
        "per_variable_norms",
        "mode",
    }
)


def _is_variable(v: Any) -> bool:
    try:
        _plan.tf_variable(v, 0)
    except (TypeError, ValueError):
        return False
    return True


def _default_writer_may_record() -> bool:
    """Whether a ``tf.summary`` write here could record (a default writer, recording not
    statically off)."""
    from tb_gradmom._compat import PrivateAPIError, tf_private

    try:
        if tf_private.default_summary_writer() is None:
            return False
    except PrivateAPIError:
        pass
    should = tf.summary.should_record_summaries()
    static = tf.get_static_value(should)
    return static is None or bool(static)


def _loss_scale_of(loss: tf.Tensor, optimizer: Any):
    """The dynamic loss scale of a ``keras.optimizers.LossScaleOptimizer`` when ``loss`` was
    multiplied by it (``optimizer.scale_loss``, as Keras' train step does), else None."""
    from keras.optimizers import LossScaleOptimizer

    if not isinstance(optimizer, LossScaleOptimizer):
        return None
    scale = optimizer.dynamic_scale if optimizer.built else optimizer.initial_scale
    try:
        handle = _graph.internal_handle(loss.graph, _plan.tf_variable(scale, 0))
    except (TypeError, ValueError):
        return scale  # an initial scale as a number: scale_loss multiplies by it
    if handle is None:
        return None
    seen: set[str] = set()
    stack = [loss.op]
    while stack:  # the few ops of `loss * scale` (casts, identities)
        op = stack.pop()
        if op.name in seen or len(seen) > 64:
            continue
        seen.add(op.name)
        if op.type == "ReadVariableOp" and op.inputs[0] is handle:
            return scale
        if op.type in ("Mul", "Cast", "Identity", "ReadVariableOp"):
            stack.extend(t.op for t in op.inputs)
    return None
