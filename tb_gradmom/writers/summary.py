"""Writing gradient moments to TensorBoard: one call in a training step.

    with writer.as_default(step=step):
        grads = gradmom.summary.moments(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))

The gradients come from the same backward pass as the moments. When nothing is recorded
(``tf.summary.record_if(False)``, no default writer, a step off the schedule) the moment ops sit
in the untaken branch of a ``tf.cond`` and do not run. A logged variable whose rule gives its
gradient with its per-example sums (convolutions) takes its gradient inside that ``cond``: from
the sums of the moments on a logged step (no separate filter gradient), from TensorFlow's own
filter gradient otherwise. The event format is in ``docs/format.md``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import secrets
import threading
import warnings
import weakref
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from tensorboard.plugins.scalar import metadata as scalar_metadata

from tb_gradmom import metadata
from tb_gradmom.core import moments as _moments
from tb_gradmom.core import plan as _plan
from tb_gradmom.core import validate as _validate

__all__ = [
    "moments",
    "write",
    "tag_names",
    "create_file_writer",
    "keep_examples",
    "DEFAULT_MAX_ELEMENTS",
    "DEFAULT_MAP_DTYPE",
    "MAP_DTYPES",
    "DEFAULT_MAX_EXAMPLES",
    "SCALARS",
]

# Largest number of cells stored per moment array; bigger variables are block-pooled to at most
# this many cells (a heatmap on a screen), with exact sums and a variance histogram beside them.
# ``max_elements=None`` stores every variable at full resolution. A ResNet50 (214 variables,
# 25.6M parameters) writes 1.5 MB per logged step with the defaults (tests/test_format.py;
# 24.6 MB with format version 1's 65,536 float32 cells).
DEFAULT_MAX_ELEMENTS = 1 << 11

# How the moment maps are stored: "auto" (the default) float16 for pooled maps (block means,
# already an approximation of the elements, rounded 2**-11 further) and float32 for maps at
# full resolution (the moments as computed, bit for bit); "float16" or "float32" for every map
# (`metadata.ENCODINGS`). float16 stores M_1 and the variance, each map scaled by a power of
# two (docs/format.md). The statistics (`/_stats`) are exact either way; a tag with orders
# above 2 is always float32.
MAP_DTYPE_AUTO = "auto"
DEFAULT_MAP_DTYPE = MAP_DTYPE_AUTO
MAP_DTYPES = (MAP_DTYPE_AUTO, *metadata.ENCODINGS)

# Per-example norms: rows of the examples tensor per logged step (`moments`' max_examples).
DEFAULT_MAX_EXAMPLES = 1024

# Derived statistics also written as ordinary scalars, under "gradmom/<tag>/<name>".
SCALARS = (
    "total_variance",
    "grad_norm_sq",
    "noise_scale",
    "gsnr_mean",
    "norm_test",
    "eb_criterion",
    "cabs_batch_size",
)


@tf.autograph.experimental.do_not_convert
def moments(
    loss,
    var_list: Sequence,
    orders: Sequence[int] = (1, 2),
    name: str | None = None,
    reduction: str | None = None,
    max_elements: int | None = DEFAULT_MAX_ELEMENTS,
    per_variable_scalars: bool = True,
    *,
    step=None,
    learning_rate=None,
    batch_size=None,
    chunk_size: int | None = None,
    log_only=None,
    fallback: str = "exact",
    loss_scale=None,
    exact_gradients: bool = True,
    coupled: str = "exact",
    map_dtype: str = DEFAULT_MAP_DTYPE,
    log_examples: bool = False,
    example_ids=None,
    max_examples: int = DEFAULT_MAX_EXAMPLES,
    per_variable_norms: bool = False,
    mode: str = "moments",
):
    """Computes gradients and logs the moments of the per-example gradients.

    Inside a ``tf.function`` it writes to the default summary writer (``tf.summary``) and
    returns the gradients. In a ``tf.compat.v1`` graph it returns a serialized ``Summary`` op to
    run and pass to ``FileWriter.add_summary`` (as ``tf.compat.v1.summary.*`` do).

    The format is in ``docs/format.md``.

    Tags are the variables' paths with a model name common to all of them left out (Keras
    numbers automatic model names, ``sequential_1/dense/kernel`` in one run and
    ``sequential_2/dense/kernel`` in another: both log ``dense/kernel``), under ``name/``
    when given. For each variable it writes:

    * tag ``<variable path>``: the raw moments ``M_p = (1/n) sum_j g_j**p`` of the orders
      logged, block-pooled above ``max_elements`` cells (pooled maps float16 by default,
      ``map_dtype``);
    * tag ``<variable path>/_stats``: exact sums (``|m|^2``, total variance, GSNR, ...) and a
      histogram of the per-element unbiased variance;
    * tag ``_model/_stats``: the same sums over all variables of the call;
    * scalars ``gradmom/<tag>/<statistic>`` for the statistics in `SCALARS` (per variable when
      ``per_variable_scalars``, always for ``_model``).

    Args:
      loss: as in `gradients_and_moments`: a mean (or sum) scalar loss, or per-example losses.
      var_list: the variables (``model.trainable_variables``).
      orders: moment orders to log, 1 to 4. Orders 1 and 2 are always logged: every statistic
        needs them.
      name: the group of this call's tags: ``<name>/<variable>``, ``<name>/_model/_stats``
        and ``gradmom/<name>/...`` scalars. Default: no prefix for the first set of variables
        logged to a writer; a further call on the same writer with other variables (a GAN's
        generator after its discriminator) gets ``moments_1``, ``moments_2``, ... with a
        warning, so two calls never mix their model statistics. Letters, digits and ``_-.``;
        ``/`` nests.
      reduction: None (read from the graph), or ``"mean"``/``"sum"``: see
        `gradients_and_moments`.
      max_elements: variables with more elements are stored block-pooled to at most this many
        cells per order (statistics stay exact); default 2,048. None stores every variable at
        full resolution.
      per_variable_scalars: also write per-variable scalars (not only the model's).
      step: the step; default ``tf.summary.experimental.get_step()``.
      learning_rate: optional; with it the CABS batch size is logged.
      batch_size: the number of examples, if it cannot be inferred (checked against the graph).
      chunk_size: examples per chunk for materialised per-example gradients.
      log_only: optional subset of ``var_list`` to log; gradients are still returned for every
        variable of ``var_list`` from the same backward pass.
      fallback: ``"exact"`` or ``"error"``, for variables consumed by ops without a rule (see
        `gradients_and_moments`). The fallback's per-example gradients run only on the steps
        that record, like the rules' moments.
      loss_scale: the factor ``loss`` was multiplied by (mixed precision; see
        `gradients_and_moments`): the returned gradients are of the scaled loss, the logged
        moments and statistics of the unscaled one.
      exact_gradients: True (default): the returned gradients are TensorFlow's own, the ones
        ``tf.gradients``/``tf.GradientTape`` give, bit for bit, on every step, so training is
        unchanged. False: on logged steps a convolution kernel's gradient is the order-1 sum
        of the per-example work the moments (``mode="norms"``: the per-example norms) already
        do (no separate filter gradient; equal to TensorFlow's up to float rounding). Not
        under ``tf.distribute`` in the norms and replicas modes.
      coupled: ``"exact"`` or ``"rules"``, for variables used before an op that couples the
        examples (a training-mode batch normalisation): see `gradients_and_moments`.
      map_dtype: ``"auto"`` (default): pooled maps as float16 (``M_1`` and the variance, each
        scaled by a power of two: 3.3 significant digits, half the bytes), maps at full
        resolution as float32 (the moments as computed, cast to float32, bit for bit);
        ``"float16"`` or ``"float32"``: every map so. Tags with orders above 2 are float32.
        See ``docs/format.md``.
      log_examples: also log the per-example squared gradient norms ``||g_j||^2`` of the
        step (whole model and per layer, from the same backward pass) with each example's
        loss, under tag ``_examples`` (``<name>/_examples``); see docs/format.md,
        "Per-example norms". On by default when ``example_ids`` is given.
      example_ids: optional ``[n]`` int or string tensor, an id per example (dataset indices,
        keys), logged beside its norms (tag ``_examples/ids``).
      max_examples: at most this many examples per logged step: the ``max_examples // 4``
        largest and smallest whole-model norms always, the others evenly spaced in rank.
      per_variable_norms: also log each variable's norms (not only the layers' and model's).
      mode: what a logged step computes. ``"moments"`` (default): the element-wise moments
        above. ``"norms"``: only what the noise statistics need, the batch gradient and the
        per-example squared norms ``||g_j||^2`` (each rule's cheapest exact form, never
        ``g_j**2`` element-wise): the ``/_stats`` tags hold the same exact ``|m|^2``,
        ``tr(Sigma)`` and ``sum M_2`` (so the noise scale, ``|G|^2``, the norm test and CABS
        are the same), with NaN for the GSNR sums and the variance histogram, and no maps (no
        ``<variable>`` tags). ``"replicas"``: inside ``strategy.run`` of a ``tf.distribute``
        strategy with several replicas, McCandlish et al.'s (2018, App. A.1) unbiased
        ``tr(Sigma)`` and ``|G|^2`` from each replica's gradient and the global one (no
        per-example work; a noisier estimate, docs/math.md). ``orders`` must stay (1, 2).

    Returns:
      In a ``tf.function``: the gradients, aligned with ``var_list`` (``None`` where the loss
      does not depend on a variable). In a TF1 graph: a scalar string tensor, the merged
      ``Summary``.
    """
    orders = tuple(sorted(set(_plan.check_orders(orders)) | {1, 2}))
    mode = _moments.check_log_mode(mode)
    if mode != "moments" and orders != (1, 2):
        raise ValueError(
            f"orders={tuple(orders)} needs the element-wise moments: mode={mode!r} logs no "
            "maps, only the noise statistics (orders 1 and 2). Pass mode='moments' for "
            "higher orders."
        )
    if not isinstance(exact_gradients, bool):
        raise TypeError(f"exact_gradients must be True or False, got {exact_gradients!r}")
    max_elements = _check_max_elements(max_elements)
    map_dtype = _check_map_dtype(map_dtype)
    per_variable_scalars = _validate.boolean("per_variable_scalars", per_variable_scalars)
    step = _validate.int_tensor_or_int("step", step)
    learning_rate = _validate.positive_float("learning_rate", learning_rate)
    max_examples = _validate.positive_int("max_examples", max_examples)
    per_variable_norms = _validate.boolean("per_variable_norms", per_variable_norms)
    log_examples = _validate.boolean("log_examples", log_examples)
    example_ids = _example_ids(example_ids)
    log_examples = log_examples or example_ids is not None
    inside = tf.inside_function()
    if inside and _plan.in_xla_context():
        raise RuntimeError(
            "gradmom.summary.moments cannot write inside an XLA-compiled function "
            "(tf.function(jit_compile=True)): TensorFlow's summary ops do not run in XLA. "
            "Compute the moments there with gradmom.gradients_and_moments, return them, and "
            "write them outside with gradmom.summary.write(moments, var_list, n, step=...); "
            "or use the Keras callback, which keeps jit_compile for training."
        )
    should = tf.summary.should_record_summaries() if inside else None
    # Under tf.distribute TF records on replica 0 only, but every replica must compute (and
    # all-reduce) the moments: their gate is the recording condition without that part.
    distributed = inside and _plan.replica_context() is not None
    compute = _recording_any_replica() if distributed else should
    static = None if compute is None else tf.get_static_value(compute)
    off = static is not None and not bool(static)
    options = _plan.Options.check(
        # off: no writer or recording off at trace time, no moments at all; the norms and
        # replicas modes need no power sum above 1 (the exact fallback's included)
        (1,) if off or mode != "moments" else orders,
        reduction,
        batch_size,
        chunk_size,
        fallback,
        loss_scale,
        coupled=coupled,
    )
    plan = _plan.make_plan(loss, var_list, options, name="gradmom_summary")
    indices = _log_indices(var_list, log_only)
    group = _group(name, var_list, inside)
    tags = _unique_tags(_tag_names([plan.names[i] for i in indices], group))
    if inside:
        _claim(
            tags,
            [plan.variables[i].variable for i in indices],
            [plan.names[i] for i in indices],
            group,
        )
    lr = None if learning_rate is None else tf.cast(learning_rate, tf.float64)
    writer = _Writer(
        tags,
        group,
        max_elements,
        per_variable_scalars,
        lr,
        max_examples,
        per_variable_norms,
        map_dtype=map_dtype,
    )
    examples = {"norms": log_examples, "ids": example_ids, "mode": mode}

    if not inside:
        return _moments.compute_logged(plan, indices, write=writer.v1_summary, **examples).written
    if off:  # (mode="replicas" outside tf.distribute raises here too)
        return _moments.compute_logged(plan, indices, gate=tf.constant(False), mode=mode).grads
    if step is None:
        step = tf.summary.experimental.get_step()
        if step is None:
            raise ValueError(
                "gradmom.summary.moments needs a step: pass step= or use "
                "writer.as_default(step=...) / tf.summary.experimental.set_step(...)"
            )
    return _moments.compute_logged(
        plan,
        indices,
        # tf.distribute: every replica computes (and all-reduces) the moments; TF records on
        # replica 0 only (`should` is False elsewhere), which writes
        gate=compute if static is None else tf.constant(True),
        record=should,
        exact_gradients=exact_gradients,
        write=lambda logged: writer.emit(logged, step),
        **examples,
    ).grads


class _Writer:
    """Writes a `tb_gradmom.core.moments.Logged` record under the given tags: the moments'
    tensors, their statistics and scalars (see `moments`), as ``tf.summary`` writes
    (`emit`) or a merged TF1 ``Summary`` (`v1_summary`)."""

    def __init__(
        self,
        tags,
        group,
        max_elements,
        per_variable_scalars,
        lr,
        max_examples: int = 1024,
        per_variable_norms: bool = False,
        map_dtype: str = DEFAULT_MAP_DTYPE,
    ) -> None:
        self.tags = tags
        self.group = group
        self.max_elements = max_elements
        self.per_variable_scalars = per_variable_scalars
        self.lr = lr
        self.max_examples = max_examples
        self.per_variable_norms = per_variable_norms
        self.map_dtype = map_dtype

    def _records(self, logged: _moments.Logged):
        if logged.sums is not None:
            return _sums_records(logged, self.tags, self.lr, self.group)
        orders = logged.orders
        contents = [
            _content_of(v, nm, tag, orders, op, self.max_elements, self.map_dtype)
            for v, nm, tag, op in zip(logged.variables, logged.names, self.tags, logged.op_types)
        ]
        return _records_of(
            logged.moments, logged.n, logged.loss, self.tags, contents, orders, self.lr, self.group
        )

    def _all_records(self, logged: _moments.Logged):
        tensors, scalar_values = self._records(logged)
        if logged.sq_norms is not None:
            tensors = tensors + _examples_records(
                logged, self.tags, self.group, self.max_examples, self.per_variable_norms
            )
        return tensors, scalar_values

    def emit(self, logged: _moments.Logged, step) -> list:
        """The ``tf.summary.write`` ops of ``logged`` at ``step`` (where the caller decided to
        record: each write skips its own recording condition)."""
        tensors, scalar_values = self._all_records(logged)
        ok = []
        # In the branch where the caller records: record_if(True) lets each tf.summary.write
        # skip its own cond on the recording condition (an `If` op, a function call per write
        # at run time). Under tf.distribute the "replica 0" part of the condition stays.
        with tf.summary.record_if(True):
            for tag, tensor, md in tensors:
                ok.append(tf.summary.write(tag, tensor, step=step, metadata=md))
            for stag, value in _selected_scalars(scalar_values, self.per_variable_scalars):
                # tf.summary.write keeps the tag as given (tf.summary.scalar prefixes scopes).
                ok.append(tf.summary.write(stag, tf.cast(value, tf.float32), step, _SCALAR_MD))
        return ok

    def v1_summary(self, logged: _moments.Logged):
        """A merged TF1 ``Summary`` with the same tags and tensors as the TF2 path."""
        tensors, scalar_values = self._all_records(logged)
        parts = [
            tf.raw_ops.TensorSummaryV2(
                tag=tag, tensor=tensor, serialized_summary_metadata=md.SerializeToString()
            )
            for tag, tensor, md in tensors
        ]
        parts += [
            tf.raw_ops.ScalarSummary(tags=stag, values=tf.cast(value, tf.float32))
            for stag, value in _selected_scalars(scalar_values, self.per_variable_scalars)
        ]
        return tf.raw_ops.MergeSummary(inputs=parts)


@tf.autograph.experimental.do_not_convert
def write(
    moments,
    var_list: Sequence | None = None,
    n=None,
    *,
    step=None,
    loss=None,
    learning_rate=None,
    name: str | None = None,
    max_elements: int | None = DEFAULT_MAX_ELEMENTS,
    per_variable_scalars: bool = True,
    map_dtype: str = DEFAULT_MAP_DTYPE,
    max_examples: int = DEFAULT_MAX_EXAMPLES,
    per_variable_norms: bool = False,
):
    """Writes moments computed elsewhere (an XLA-compiled step) to the default summary writer.

    Summary ops cannot run inside XLA (``tf.function(jit_compile=True)``): compute the moments
    there with `gradients_and_moments`, return them, and write them outside::

        @tf.function(jit_compile=True)
        def logged_step(x, y):
            loss = loss_fn(y, model(x, training=True))
            grads, moments = gradmom.gradients_and_moments(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss, moments

        loss, moments = logged_step(x, y)
        with writer.as_default(step=step):
            gradmom.summary.write(moments, model.trainable_variables, n=len(x), loss=loss)

    Eagerly or in a ``tf.function`` without XLA. The tags, tensors and statistics are those
    `moments` writes (the op of each variable is not known here and is left empty).

    Args:
      moments: ``moments[i]`` a dict from order to ``M_p`` of ``var_list[i]`` (orders 1 and 2
        at least), as `gradients_and_moments` returns them; or a
        `tb_gradmom.core.moments.Logged` record (what `compute_logged` returns, and the
        callback's and the tape's dry runs), which holds the variables, ``n`` and the loss.
      var_list: the variables, aligned with ``moments`` (not with a ``Logged``).
      n: the number of examples the moments average over (not with a ``Logged``).
      step: the step; default ``tf.summary.experimental.get_step()``.
      loss: the mean loss of the batch (for the CABS batch size; NaN if not given).
      learning_rate: with it the CABS batch size is logged.
      name, max_elements, per_variable_scalars, map_dtype: as for `moments`.
      max_examples, per_variable_norms: as for `moments`, for a ``Logged`` record that holds
        per-example norms (written under ``_examples``).

    A ``Logged`` record of the norms or replicas mode (`Logged.sums`, ``compute_logged(...,
    mode="norms")``) is written as `moments` writes it in that mode: stats tags and scalars,
    no maps (``max_elements`` and ``map_dtype`` do not apply).

    Returns:
      True when the default writer recorded (a bool tensor), as ``tf.summary.write``.
    """
    logged = moments if isinstance(moments, _moments.Logged) else None
    if logged is not None:
        if var_list is not None or n is not None:
            raise ValueError(
                "a Logged record holds its variables and n: call write(logged, step=...) "
                "without var_list and n"
            )
        var_list, n, moments = logged.variables, logged.n, logged.moments
        if loss is None:
            loss = logged.loss
        if logged.sums is not None:  # the norms or replicas mode: sums, no maps
            return _write_sums(
                logged,
                loss,
                step,
                learning_rate,
                name,
                per_variable_scalars,
                max_examples,
                per_variable_norms,
            )
    if var_list is None or n is None:
        raise TypeError(
            "gradmom.summary.write(moments, var_list, n, ...) needs var_list and n with the "
            "moments gradients_and_moments returned"
        )
    var_list = list(var_list)
    moments = list(moments)
    if len(moments) != len(var_list):
        raise ValueError(
            f"moments has {len(moments)} entries and var_list {len(var_list)}: pass the "
            "moments gradients_and_moments returned for the same var_list"
        )
    orders_seen = {tuple(sorted(m)) for m in moments}
    if len(orders_seen) != 1 or not {1, 2} <= set(next(iter(orders_seen), ())):
        raise ValueError(
            "every entry of moments must hold the same orders, 1 and 2 included (pass "
            "orders=(1, 2, ...) to gradients_and_moments); got "
            f"{sorted(orders_seen)}"
        )
    orders = tuple(_plan.check_orders(next(iter(orders_seen))))
    max_elements = _check_max_elements(max_elements)
    map_dtype = _check_map_dtype(map_dtype)
    per_variable_scalars = _validate.boolean("per_variable_scalars", per_variable_scalars)
    step = _validate.int_tensor_or_int("step", step)
    learning_rate = _validate.positive_float("learning_rate", learning_rate)
    if step is None:
        step = tf.summary.experimental.get_step()
        if step is None:
            raise ValueError(
                "gradmom.summary.write needs a step: pass step= or use "
                "writer.as_default(step=...) / tf.summary.experimental.set_step(...)"
            )
    if tf.inside_function():
        from tb_gradmom.core.plan import in_xla_context

        if in_xla_context():
            raise RuntimeError(
                "gradmom.summary.write cannot run inside an XLA-compiled function: return the "
                "moments from the compiled step and call it outside (see its docstring)"
            )
    variables = [_plan.tf_variable(v, i) for i, v in enumerate(var_list)]
    names = [_plan.variable_name(v) for v in var_list] if logged is None else logged.names
    group = _group(name, var_list, tf.inside_function())
    tags = _unique_tags(_tag_names(names, group))
    _claim(tags, variables, names, group)
    moms = [
        {
            p: tf.convert_to_tensor(m[p], v.dtype if v.dtype.is_floating else tf.float32)
            for p in orders
        }
        for m, v in zip(moments, variables)
    ]
    for m, v in zip(moms, variables):
        for p in orders:
            m[p].shape.assert_is_compatible_with(v.shape)
            m[p] = tf.reshape(m[p], v.shape)
    record = _moments.Logged(
        variables=variables,
        names=names,
        op_types=[""] * len(variables) if logged is None else logged.op_types,
        moments=moms,
        n=n,
        loss=None if loss is None else tf.cast(loss, tf.float64),
    )
    if logged is not None and logged.sq_norms is not None:
        record = dataclasses.replace(
            record, sq_norms=logged.sq_norms, losses=logged.losses, ids=logged.ids
        )
    lr = None if learning_rate is None else tf.cast(learning_rate, tf.float64)
    max_examples = _validate.positive_int("max_examples", max_examples)
    per_variable_norms = _validate.boolean("per_variable_norms", per_variable_norms)
    writer = _Writer(
        tags,
        group,
        max_elements,
        per_variable_scalars,
        lr,
        max_examples,
        per_variable_norms,
        map_dtype=map_dtype,
    )
    return _write_logged(writer, record, step)


def _write_sums(
    logged: _moments.Logged,
    loss,
    step,
    learning_rate,
    name,
    per_variable_scalars,
    max_examples,
    per_variable_norms,
):
    """`write` of a `Logged` record of the norms or replicas mode (`Logged.sums`)."""
    per_variable_scalars = _validate.boolean("per_variable_scalars", per_variable_scalars)
    step = _validate.int_tensor_or_int("step", step)
    learning_rate = _validate.positive_float("learning_rate", learning_rate)
    if step is None:
        step = tf.summary.experimental.get_step()
        if step is None:
            raise ValueError(
                "gradmom.summary.write needs a step: pass step= or use "
                "writer.as_default(step=...) / tf.summary.experimental.set_step(...)"
            )
    variables = [_plan.tf_variable(v, i) for i, v in enumerate(logged.variables)]
    group = _group(name, logged.variables, tf.inside_function())
    tags = _unique_tags(_tag_names(list(logged.names), group))
    _claim(tags, variables, logged.names, group)
    record = dataclasses.replace(logged, loss=None if loss is None else tf.cast(loss, tf.float64))
    lr = None if learning_rate is None else tf.cast(learning_rate, tf.float64)
    writer = _Writer(
        tags,
        group,
        None,
        per_variable_scalars,
        lr,
        _validate.positive_int("max_examples", max_examples),
        _validate.boolean("per_variable_norms", per_variable_norms),
    )
    return _write_logged(writer, record, step)


def _write_logged(writer: _Writer, logged: _moments.Logged, step):
    """Writes ``logged`` where ``tf.summary`` records and the batch is not empty: eagerly, or
    in a ``tf.cond`` in a ``tf.function``. True when it wrote (a bool tensor)."""

    def record():
        return tf.reduce_all(tf.stack(writer.emit(logged, step)))

    should = tf.logical_and(
        tf.summary.should_record_summaries(), tf.cast(logged.n, tf.int64) > 0
    )  # an empty batch has no moments
    if not tf.inside_function():
        return record() if bool(should) else tf.constant(False)
    return tf.cond(should, record, lambda: tf.constant(False), name="gradmom_write")


def _recording_any_replica():
    """``tf.summary``'s recording condition, without its "replica 0 only" part."""
    from tb_gradmom._compat import tf_private  # PrivateAPIError if TensorFlow lacks it

    if tf_private.default_summary_writer() is None:
        return tf.constant(False)
    cond = tf_private.summary_recording_condition()
    return tf.constant(True) if cond is None else tf.cast(cond, tf.bool)


def _log_indices(var_list, log_only) -> list[int]:
    var_list = list(var_list)
    if log_only is None:
        return list(range(len(var_list)))
    ids = {id(v): i for i, v in enumerate(var_list)}
    out = []
    for v in log_only:
        if id(v) not in ids:
            raise ValueError(
                f"log_only holds '{_plan.variable_name(v)}', which is not in var_list; "
                "log_only must be a subset of var_list"
            )
        out.append(ids[id(v)])
    if not out:
        raise ValueError("log_only is empty: pass None to log every variable of var_list")
    return out


# The longest tag group `name=` takes; with the variables' paths the tags stay well under the
# 4,096 characters of a layer name the readers accept.
MAX_NAME = 256

_GROUP_RE = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$")
# Per summary writer: the variable sets logged to it, in order (the default group of a call).
_WRITER_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _group(name, var_list, inside: bool) -> str | None:
    """The tag group of one call: ``name`` (checked), or by default None for the first set of
    variables logged to the current writer and ``moments_<k>`` for the k-th other set."""
    if name is not None:
        if isinstance(name, str) and len(name) > MAX_NAME:
            raise ValueError(
                f"name has {len(name)} characters; a tag group has at most {MAX_NAME} (the "
                "readers refuse longer tags): pass a shorter name, e.g. name='generator'"
            )
        if (
            not isinstance(name, str)
            or not _GROUP_RE.match(name)
            or any(part in (".", "..", "_model") for part in name.split("/"))
        ):
            raise ValueError(
                f"name={name!r}: a tag group is letters, digits and '_-.' with '/' between "
                "parts (no '.', '..' or '_model' part), e.g. name='generator'"
            )
        return name
    writer = _current_writer() if inside else None
    if writer is None:
        return None
    key = frozenset(id(_plan.tf_variable(v, i)) for i, v in enumerate(var_list))
    try:
        seen = _WRITER_GROUPS.setdefault(writer, [])
    except TypeError:  # a writer that cannot be weakly referenced: no default groups
        return None
    if key not in seen:
        seen.append(key)
    k = seen.index(key)
    if k == 0:
        return None
    group = f"moments_{k}"
    warnings.warn(
        f"tb_gradmom: summary.moments is called on one writer for a {_ordinal(k + 1)} set of "
        f"variables; its tags go under '{group}/' so that the calls' model statistics stay "
        "apart. Pass name= to each call to choose the groups (e.g. name='generator').",
        stacklevel=3,
    )
    return group


# Per summary writer: tag -> (the variable it logs, its name); per writer and graph: the tags
# written there (one step's function).
_WRITER_TAGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_GRAPH_TAGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _claim(
    tags: Sequence[str], variables: Sequence, names: Sequence[str], group: str | None = None
) -> None:
    """Refuses, at trace time, tags that would mix two calls' data on the current writer: a tag
    already logged for another variable (two calls whose group and layer names coincide), or
    a tag written twice by one step (the same variables logged twice); and, where Grad Moments
    knows the writer's directory (`_claim_directory`), a tag another open writer logs there."""
    writer = _current_writer() if tf.inside_function() else None
    if writer is None or writer is _ANY_WRITER:
        return
    _claim_directory(writer, [*tags, metadata.model_tag(group)])
    try:
        claimed = _WRITER_TAGS.setdefault(writer, {})
    except TypeError:  # a writer that cannot be weakly referenced
        return
    graph = tf.compat.v1.get_default_graph() if tf.inside_function() else None
    if _plan.replica_context() is not None:
        graph = None  # strategy.run traces the step once per replica in one graph
    in_graph: set = set()
    if graph is not None:
        per_graph = _GRAPH_TAGS.setdefault(graph, weakref.WeakKeyDictionary())
        try:
            in_graph = per_graph.setdefault(writer, set())
        except TypeError:
            in_graph = set()
    for tag, v, nm in zip(tags, variables, names):
        ref = weakref.ref(v) if _weakrefable(v) else (lambda v=v: v)
        old = claimed.get(tag)
        if old is not None and old[0]() is not None and old[0]() is not v:
            raise ValueError(
                f"tag '{tag}' is already logged on this summary writer for variable "
                f"'{old[1]}', and this call would log '{nm}' under it: the two calls' data "
                "would mix. Pass a distinct name= to each call (e.g. name='discriminator' "
                "and name='generator')."
            )
        if tag in in_graph:
            raise ValueError(
                f"tag '{tag}' ('{nm}') is logged twice in one step on this summary writer: "
                "the second call would hide the first. Log each set of variables once per "
                "step, or pass a distinct name= to each call."
            )
        claimed[tag] = (ref, nm)
        in_graph.add(tag)


# The writers Grad Moments made for a directory it knows (the Keras callback's,
# `create_file_writer`'s): writer -> (os.path.realpath of the directory, who made it); per
# directory, the tags its writers log: tag -> (weak reference to the writer, who made it).
# TensorFlow's writer does not expose its directory (it is only in its init op), so a writer the
# user made with tf.summary.create_file_writer is not known here: two such writers, or two
# processes, on one directory are told apart when read (format 3's source tokens).
_WRITER_DIRS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_DIR_TAGS: dict[str, dict[str, tuple]] = {}


def create_file_writer(logdir, **kwargs):
    """``tf.summary.create_file_writer(logdir, **kwargs)``, known to Grad Moments by its
    directory: a `moments` call (or a `GradientTape`, or the Keras callback) that would log a
    tag another open writer known so logs to the same directory (``os.path.realpath``) raises
    a ``ValueError`` naming both at trace time, instead of mixing the two writers' records in
    one run. Use it for the writer of your own step when a `tb_gradmom.keras.GradMoments`
    callback (or another such writer) may write to the same directory in this process.

    Args:
      logdir: the run directory (not empty).
      **kwargs: passed to ``tf.summary.create_file_writer`` (``max_queue``,
        ``flush_millis``, ``filename_suffix``, ``name``, ``experimental_trackable``).

    Returns:
      The ``tf.summary.SummaryWriter``.
    """
    path = os.fspath(logdir)
    if not isinstance(path, str) or not path:
        raise ValueError(f"logdir={logdir!r}: pass the run directory to write to, e.g. 'runs/exp1'")
    writer = tf.summary.create_file_writer(path, **kwargs)
    _register_writer(writer, path, f"gradmom.summary.create_file_writer({path!r})")
    return writer


def _register_writer(writer, logdir: str, owner: str, fit: bool = False) -> None:
    """Keys the tags ``writer`` logs by ``logdir``'s real path too (`_claim_directory`);
    ``owner`` names who made it in messages (``GradMoments('runs/x')``). ``fit``: the writer
    of a Keras ``fit`` running in this thread (the callback's), which an interrupted fit never
    closes: a later writer of this same thread (a fit runs one at a time per thread) takes its
    directory over, as does any writer once that thread has ended."""
    thread = threading.get_ident() if fit else None
    try:
        _WRITER_DIRS[writer] = (os.path.realpath(logdir), owner, thread)
    except TypeError:  # a writer that cannot be weakly referenced: not known
        pass


def _release_writer(writer) -> None:
    """Forgets ``writer``'s directory claims (it is closed: another writer may log there)."""
    try:
        entry = _WRITER_DIRS.pop(writer, None)
    except TypeError:
        return
    if entry is None:
        return
    claimed = _DIR_TAGS.get(entry[0], {})
    for tag in [t for t, (ref, _) in claimed.items() if ref() is writer]:
        del claimed[tag]


def _open_writer(ref):
    """The writer of a directory claim while it may still write (alive, registered, not
    closed, and for a fit's writer, its fit possibly running: another thread's, still alive),
    else None (a fit's writer left over is released)."""
    from tb_gradmom._compat import PrivateAPIError, tf_private

    writer = ref()
    entry = None if writer is None else _WRITER_DIRS.get(writer)
    if entry is None:
        return None
    thread = entry[2]
    if thread is not None and (
        thread == threading.get_ident() or thread not in {t.ident for t in threading.enumerate()}
    ):
        _release_writer(writer)  # an interrupted fit of this thread, or of an ended one
        return None
    try:
        return None if tf_private.summary_writer_closed(writer) else writer
    except PrivateAPIError:
        return writer


def _claim_directory(writer, tags: Sequence[str]) -> None:
    """Refuses, at trace time, tags that another open writer logs to the same directory as
    ``writer`` (both known to Grad Moments: `_register_writer`)."""
    try:
        entry = _WRITER_DIRS.get(writer)
    except TypeError:
        return
    if entry is None:
        return
    path, owner, _ = entry
    claimed = _DIR_TAGS.setdefault(path, {})
    for tag in tags:
        old = claimed.get(tag)
        if old is None:
            continue
        other = _open_writer(old[0])
        if other is not None and other is not writer:
            raise ValueError(
                f"tag '{tag}' is already logged to directory '{path}' by {old[1]}, and "
                f"{owner} would log it there too with another summary writer: the two "
                "writers' records would mix in one run. Give each its own log directory "
                "(e.g. GradMoments('runs/exp1/a') and GradMoments('runs/exp1/b')), or log "
                "both through one writer with a distinct name= per call."
            )
    for tag in tags:
        claimed[tag] = (weakref.ref(writer), owner)


def _weakrefable(v) -> bool:
    try:
        weakref.ref(v)
    except TypeError:
        return False
    return True


def tag_names(var_list: Sequence, name: str | None = None) -> list[str]:
    """The tags `moments` logs ``var_list`` under (the first call on a writer, or with
    ``name``): e.g. ``["dense/kernel", "dense/bias"]`` for a Sequential model's
    ``sequential_3/dense/kernel`` and ``sequential_3/dense/bias``."""
    var_list = list(var_list)
    for i, v in enumerate(var_list):
        _plan.tf_variable(v, i)  # a clear error for anything that is not a variable
    group = _group(name, var_list, inside=False)
    return _unique_tags(_tag_names([_plan.variable_name(v) for v in var_list], group))


def _ordinal(k: int) -> str:
    return {2: "second", 3: "third"}.get(k, f"{k}th")


class _AnyWriter:
    """Stands for every writer when this TensorFlow cannot say which one is the default."""


_ANY_WRITER = _AnyWriter()


def _current_writer():
    """The default summary writer (to group the calls per writer), found through TensorFlow's
    private summary state. Without it, every writer is taken as one (the calls on all writers
    are then grouped together), with a warning: logging goes on."""
    from tb_gradmom._compat import PrivateAPIError, tf_private

    try:
        return tf_private.default_summary_writer()
    except PrivateAPIError as e:
        if not getattr(_current_writer, "warned", False):
            _current_writer.warned = True
            warnings.warn(
                f"tb_gradmom: cannot tell summary writers apart on this TensorFlow ({e}); the "
                "default tag groups count the calls on all writers together. Pass name= to "
                "each summary.moments call to choose its group.",
                stacklevel=4,
            )
        return _ANY_WRITER


def _tag_names(names: list[str], group: str | None) -> list[str]:
    """The variables' tags: their paths without a model name common to all of them (only when
    every path has a layer and a variable below it), under ``group/``."""
    parts = [nm.split("/") for nm in names]
    if parts and all(len(p) >= 3 for p in parts) and len({p[0] for p in parts}) == 1:
        names = ["/".join(p[1:]) for p in parts]
    if group:
        names = [f"{group}/{nm}" for nm in names]
    return names


def _unique_tags(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for nm in names:
        tag = nm
        if nm in seen:
            seen[nm] += 1
            tag = f"{nm}_{seen[nm]}"
        seen.setdefault(tag, 0)
        out.append(tag)
    return out


def _check_max_elements(max_elements) -> int | None:
    """``max_elements`` checked: a positive int, or None (full resolution)."""
    if max_elements is None:
        return None
    return _validate.positive_int("max_elements", max_elements)


def _check_map_dtype(map_dtype) -> str:
    if map_dtype not in MAP_DTYPES:
        raise ValueError(
            f"map_dtype must be one of {', '.join(map(repr, MAP_DTYPES))}, got {map_dtype!r}: "
            "'auto' stores pooled maps as float16 and full-resolution ones as float32, "
            "'float16' every map compact (3.3 significant digits), 'float32' the moments as "
            "computed"
        )
    return str(map_dtype)


def _encoding(orders, map_dtype: str, pooled: bool) -> str:
    """The encoding of a tag's maps (see `DEFAULT_MAP_DTYPE`). float16 holds orders 1 and 2 only
    (higher orders' statistics cancel more than float16 keeps): with more orders, float32."""
    half = map_dtype == metadata.ENCODING_FLOAT16 or (map_dtype == MAP_DTYPE_AUTO and pooled)
    if half and tuple(orders) == metadata.FLOAT16_ORDERS:
        return metadata.ENCODING_FLOAT16
    return metadata.ENCODING_FLOAT32


def _moments_content(
    plan, tag, orders, op_type, max_elements, map_dtype=DEFAULT_MAP_DTYPE
) -> metadata.MomentsContent:
    return _content_of(plan.variable, plan.name, tag, orders, op_type, max_elements, map_dtype)


def _content_of(
    variable, name, tag, orders, op_type, max_elements, map_dtype=DEFAULT_MAP_DTYPE
) -> metadata.MomentsContent:
    shape = tuple(int(s) for s in variable.shape)
    if max_elements is None:
        block = (1, 1)
    else:
        block = metadata.pool_block(shape, int(max_elements))
    pooled = block != (1, 1)
    stored: tuple[int, ...]
    if pooled:
        rows, cols = metadata.to_2d_shape(shape)
        stored = (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    else:
        stored = shape
    layer = tag.rsplit("/", 1)[0] if "/" in tag else ""
    return metadata.MomentsContent(
        orders=orders,
        shape=shape,
        stored_shape=stored,
        pooled=pooled,
        block=block,
        dtype=variable.dtype.base_dtype.name,
        op=op_type,
        layer=layer,
        variable=name,
        encoding=_encoding(orders, map_dtype, pooled),
    )


def _encode_float16(arrays):
    """The ``"float16"`` tensors (`metadata.encode_float16`, its numpy twin) of several tags at
    once: ``arrays[k]`` the float32 ``[2, *stored]`` (``M_1``, ``M_2``) of tag k, the result
    its float16 ``[2, 1 + S_k]``. One set of ops for all tags: the rows are concatenated, each
    row's largest finite magnitude found per tag by a segment max."""
    sizes = [int(np.prod(a.shape.as_list()[1:])) for a in arrays]
    flat = tf.cast(tf.concat([tf.reshape(a, [2, -1]) for a in arrays], 1), tf.float64)
    m1 = flat[0]
    rows = tf.stack([m1, flat[1] - m1 * m1])  # [2, T]: M_1 and the biased variance
    seg = tf.constant(np.repeat(np.arange(len(sizes), dtype=np.int32), sizes))
    mag = tf.where(tf.math.is_finite(rows), tf.abs(rows), tf.zeros_like(rows))
    top = tf.math.unsorted_segment_max(tf.transpose(mag), seg, len(sizes))  # [V, 2]
    # e = ceil(log2(top)) - 15 (to a ulp of the logarithm either way, the values stay below
    # float16's 65504): the largest value lands in (2**14, 2**15]
    log2 = tf.math.log(tf.where(top > 0, top, tf.ones_like(top))) / math.log(2.0)
    exps = tf.where(top > 0, tf.math.ceil(log2) - metadata.FLOAT16_TOP_LOG2, tf.zeros_like(top))
    scale = tf.transpose(tf.gather(tf.pow(tf.constant(2.0, tf.float64), -exps), seg))  # [2, T]
    half = tf.split(tf.cast(rows * scale, tf.float16), sizes, axis=1)
    heads = tf.split(tf.cast(tf.transpose(exps), tf.float16), len(sizes), axis=1)  # [2, 1] each
    return [tf.concat([h, x], 1) for h, x in zip(heads, half)]


def _pool(x: tf.Tensor, shape, block) -> tf.Tensor:
    """Block means over the 2-D view; edge blocks average the cells they cover."""
    rows, cols = metadata.to_2d_shape(shape)
    br, bc = block
    pr, pc = (-rows) % br, (-cols) % bc
    r2, c2 = (rows + pr) // br, (cols + pc) // bc
    grid = tf.reshape(x, [rows, cols])
    if pr or pc:
        grid = tf.pad(grid, [[0, pr], [0, pc]])
    # two contiguous reductions are much faster than one over axes [1, 3]; rows first (a
    # reduction over a middle axis, vectorised along the columns), so that the reduction over
    # the few innermost cells of a block runs on a br times smaller array
    sums = tf.reduce_sum(tf.reshape(grid, [r2, br, cols + pc]), axis=1)
    sums = tf.reduce_sum(tf.reshape(sums, [r2, c2, bc]), axis=2)
    # cells per block: known at trace time
    count = np.full([r2, c2], float(br * bc))
    if pr:
        count[-1, :] *= (br - pr) / br
    if pc:
        count[:, -1] *= (bc - pc) / bc
    return sums / tf.constant(count, sums.dtype)


_SCALAR_MD = scalar_metadata.create_summary_metadata(display_name="", description="")
_EDGES = np.asarray(metadata.HIST_EDGES, np.float64)
_NB = metadata.NUM_HIST_BUCKETS

# The variance histogram without logarithms or binary searches. The bits of a float64 read as
# an unsigned integer grow with its value, for each sign. The top 13 bits (sign, the 11
# exponent bits and the first mantissa bit) cut [0, inf) into intervals [2**e, 1.5 * 2**e) and
# [1.5 * 2**e, 2**(e+1)), each at most 1.5 wide as a ratio; the edges are 10**(1/per_decade)
# >= 1.5 apart (checked below), so an interval holds at most one edge. A value's bucket is
# then `_KEY_BIN[key]` (the bucket of the interval's start) plus one if it is at or above the
# edge inside its interval, `_KEY_EDGE[key]` (+inf when there is none): exactly numpy's
# ``searchsorted(HIST_EDGES, v, side="right")``, edges and values next to them included.
# The counts go to _BINS bins per variable, so that one bincount also gives the number of
# positive variances (``gsnr_count``) and the padding can be taken out:
#   bin 0               zero (either sign), subnormal or negative: bucket 0, not positive
#   bin 1 + b           a positive finite value in histogram bucket b (0 <= b < _NB)
#   bin _NAN_BIN        NaN or -inf: in no bucket (values that are not finite are left out)
#   bin _NAN_BIN + 1    +inf: in no bucket, but positive
_KEY_SHIFT = 51
_NAN_BIN = _NB + 1
_BINS = _NB + 3


def _key_tables():
    keys = np.arange(1 << (64 - _KEY_SHIFT), dtype=np.uint64)
    start = (keys << np.uint64(_KEY_SHIFT)).view(np.float64)  # first value of each interval
    half = len(keys) // 2  # keys >= half: the sign bit is set
    # keys (half - 2, half - 1): exponent all ones: +inf (and NaNs with a first mantissa bit
    # of 0), NaNs. +inf is the only one that is >= its "edge" +inf: it lands in _NAN_BIN + 1.
    finite = half - 2
    bins = np.full(len(keys), _NAN_BIN, np.int32)
    edge = np.full(len(keys), np.inf)
    # -0.0 and negative values; +0.0 and the positive subnormals (key 0): bucket 0, not
    # positive. TensorFlow's CPU threads flush subnormals to zero (an element-wise biased
    # variance is never subnormal, and `biased > 0` used to see them as 0); no compare
    # against a subnormal edge, which those threads would read as 0.
    bins[half : half + finite] = 0
    bins[0] = 0
    for k in range(1, finite):
        lo = start[k]
        hi = start[k + 1]  # exclusive
        bins[k] = 1 + np.searchsorted(_EDGES, lo, side="right")
        inside = _EDGES[(_EDGES > lo) & (_EDGES < hi)]
        assert len(inside) <= 1, "two histogram edges in one key interval"
        if len(inside):
            edge[k] = inside[0]
    assert np.searchsorted(_EDGES, start[1], side="right") == 0  # key 0: all in bucket 0
    return bins, edge


_KEY_BIN, _KEY_EDGE = _key_tables()


def _bins(s2, offsets=None):
    """The bin (see `_KEY_BIN`) of each element of the float64 ``s2``, plus ``offsets``."""
    bits = tf.bitcast(s2, tf.uint64)  # no copy
    key = tf.bitcast(tf.bitwise.right_shift(bits, tf.constant(_KEY_SHIFT, tf.uint64)), tf.int64)
    above = tf.cast(s2 >= tf.gather(tf.constant(_KEY_EDGE), key), tf.int32)
    base = tf.gather(tf.constant(_KEY_BIN), key)
    if offsets is not None:
        base = base + offsets
    return base + above


def _histogram_of_bins(counts):
    """``[..., _BINS]`` bin counts -> (``[..., NUM_HIST_BUCKETS]`` histogram, positive count)."""
    hist = tf.concat([counts[..., :1] + counts[..., 1:2], counts[..., 2 : _NB + 1]], -1)
    positive = tf.reduce_sum(counts[..., 1 : _NB + 1], -1) + counts[..., _NAN_BIN + 1]
    return hist, positive


def _histogram(s2, finite=None):
    """numpy's ``bincount(searchsorted(HIST_EDGES, s2, side="right"))`` over the finite values
    of the float64 ``s2 >= 0`` (``NUM_HIST_BUCKETS`` counts; values that are not finite are
    left out). ``finite`` is accepted for the callers of the former version and unused."""
    del finite
    counts = _bincount(_bins(tf.reshape(s2, [-1])), _BINS)
    return _histogram_of_bins(counts)[0]


def _bincount(bins, size: int):
    """``[size]`` int32 counts of the int32 ``bins`` (each in ``[0, size)``): TensorFlow's
    ``Bincount`` op, which counts in per-thread partial histograms (``tf.math.bincount`` runs
    ``DenseBincount``: about 1.7x slower on the MLP's 672k bins, 2.5 against 4.3 ms)."""
    return tf.raw_ops.Bincount(arr=bins, size=size, weights=tf.constant([], tf.int32))


# Elements per partial sum: each variable is padded with zeros to a multiple of this, the
# padded vector summed per block of _BLOCK elements and the block sums added per variable.
_BLOCK = 1024
# Elements per concatenation (a bigger variable is one on its own): 4M float64 temporaries.
_CHUNK = 1 << 22


def _flat(arrays, pads):
    """The arrays flattened and concatenated, each followed by ``pad`` zeros."""
    pieces = []
    for a, pad in zip(arrays, pads):
        pieces.append(tf.reshape(a, [-1]))
        pieces.append(tf.zeros([pad], a.dtype))
    return tf.concat(pieces, 0)


def _groups(sizes, group: int) -> list[list[int]]:
    """Consecutive indices of ``sizes`` in groups: a size of at least ``group`` on its own, the
    smaller ones together until a group holds at least ``group`` elements."""
    out: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i, d in enumerate(sizes):
        if d >= group:
            if cur:
                out.append(cur)
                cur, used = [], 0
            out.append([i])
            continue
        cur.append(i)
        used += d
        if used >= group:
            out.append(cur)
            cur, used = [], 0
    if cur:
        out.append(cur)
    return out


# In the XLA computation, variables of at least this many elements are not concatenated with
# others: XLA fuses a concatenation into its consumers as a choice among the operands for each
# element, which costs more the more operands there are (ResNet50's 214 variables: statistics
# 406 -> 295 ms with the groups, load 4-5; the MLP and 3C3D: no difference).
_GROUP = 1 << 16


def _elementwise(m1s, m2s, factor, block_offsets, pads, xla: bool, group: int = 0):
    """The per-element work of the statistics of variables of one dtype (``m1s``, ``m2s``:
    their moments; ``pads``: the zeros after each, so that each fills whole blocks):
    ``(per_block [blocks, 4] float64, bins)``, ``bins`` a list of int32 vectors whose
    concatenation is ``[blocks * _BLOCK]``.

    ``per_block[:, k]`` are the block sums of ``M_1**2``, ``biased = max(M_2 - M_1**2, 0)``,
    ``M_1**2 / biased`` (0 where ``biased`` is 0) and ``M_2``; ``bins`` the bin (see
    `_KEY_BIN`) of ``s2 = biased * factor``, plus the block's offset (its variable's first
    bin). Every element-wise value is the float64 one `tb_gradmom.analysis.stats` computes: the moments
    are cast to float64 first (``M_2 - M_1**2`` cancels, so float32 arithmetic would change
    the variances and their buckets). With XLA the variables go through the same ops in
    groups of about ``group`` elements (`_groups`, `_GROUP`), without it all at once (fewer
    ops)."""
    sizes = [int(np.prod(m.shape.as_list())) + pad for m, pad in zip(m1s, pads)]
    groups = _groups(sizes, group or _GROUP) if xla else [list(range(len(m1s)))]
    sums, bins, start = [], [], 0
    for g in groups:
        gpads = [pads[i] for i in g]
        m1 = tf.cast(_flat([m1s[i] for i in g], gpads), tf.float64)
        m2 = tf.cast(_flat([m2s[i] for i in g], gpads), tf.float64)
        m1sq = m1 * m1
        biased = tf.maximum(m2 - m1sq, 0.0)
        gsnr = tf.math.divide_no_nan(m1sq, biased)
        parts = (m1sq, biased, gsnr, m2)
        if xla:
            # XLA fuses the element-wise ops into the products; its row reductions are slow
            # on CPU, its dot (Eigen's) is not: block sums as [blocks, _BLOCK] @ ones
            ones = tf.ones([_BLOCK], tf.float64)
            sums.append(
                tf.stack([tf.linalg.matvec(tf.reshape(x, [-1, _BLOCK]), ones) for x in parts], 1)
            )
        else:
            sums.append(
                tf.stack([tf.reduce_sum(tf.reshape(x, [-1, _BLOCK]), axis=1) for x in parts], 1)
            )
        blocks = sum(sizes[i] for i in g) // _BLOCK
        offsets = block_offsets[start : start + blocks, None]
        start += blocks
        bins.append(tf.reshape(_bins(tf.reshape(biased * factor, [-1, _BLOCK]), offsets), [-1]))
    return (sums[0] if len(sums) == 1 else tf.concat(sums, 0)), bins


def _pool_all(arrays, specs):
    """``[P, *stored shape]`` per pooled variable: ``arrays[k]`` its P float32 moment arrays,
    ``specs[k]`` its (shape, block)."""
    return [
        tf.stack([_pool(a, shape, block) for a in orders])
        for orders, (shape, block) in zip(arrays, specs)
    ]


# The element-wise part of the statistics and the pooling as XLA computations: a few passes
# over memory instead of one per op (a logged step's statistics cost about a third of
# TensorFlow's op-by-op version, the pooling half). Compiled once per set of shapes (the
# first logged step). TB_GRADMOM_XLA=0, or a TensorFlow built without XLA, runs the same ops
# one by one.
_elementwise_xla = tf.function(
    lambda m1s, m2s, factor, offsets, pads, group: _elementwise(
        m1s, m2s, factor, offsets, pads, True, group
    ),
    jit_compile=True,
    autograph=False,
)
_pool_xla = tf.function(_pool_all, jit_compile=True, autograph=False)


def _use_xla() -> bool:
    return os.environ.get("TB_GRADMOM_XLA", "1") != "0" and tf.test.is_built_with_xla()


def _stats_sums(moms, factor):
    """The per-variable sums of the statistics and the variance histograms, all variables at
    once: ``(sums [V, 4] float64, counts [V, _BINS] int32, pads)``.

    ``sums[:, k]`` are the sums over each variable's elements of the four `_elementwise`
    quantities; ``counts`` the bins of its unbiased variance (see `_KEY_BIN`; NaN for a
    batch of one, so then every element is in _NAN_BIN and nothing is positive).

    The variables of one dtype are concatenated (in chunks of about `_CHUNK` elements), each
    padded with zeros to a multiple of `_BLOCK`, and go through one set of element-wise ops (a
    few dozen ops for any number of variables, instead of a hundred per variable); the block sums are added per variable
    (float64 sums of float64 values: no accuracy lost to the grouping). The padding adds
    nothing to the sums (its elements are 0 in each summand: 0, max(0, 0), 0/0 -> 0, 0)
    and puts exactly ``pads[i]`` elements in bin 0 of variable i (s2 = +0.0 when n > 1; NaN
    when n = 1: then in _NAN_BIN, which no count uses): the caller subtracts them.
    """
    sizes = [int(np.prod(m[1].shape.as_list())) for m in moms]
    pads = np.array([(-d) % _BLOCK for d in sizes], np.int32)
    # Chunks of variables of one dtype, at most _CHUNK elements each unless one variable is
    # bigger: the float64 temporaries (five per element) are of one chunk at a time.
    chunks: dict = {}  # (dtype, k) -> [variable index]
    filled: dict = {}  # dtype -> (k, elements in chunk k)
    for i, m in enumerate(moms):
        dtype, size = m[1].dtype, sizes[i] + int(pads[i])
        k, used = filled.get(dtype, (0, 0))
        if used and used + size > _CHUNK:
            k, used = k + 1, 0
        filled[dtype] = (k, used + size)
        chunks.setdefault((dtype, k), []).append(i)
    xla = _use_xla()
    parts_sums, parts_counts, order = [], [], []
    for members in chunks.values():
        blocks = np.array([(sizes[i] + int(pads[i])) // _BLOCK for i in members])
        var_of_block = np.repeat(np.arange(len(members), dtype=np.int32), blocks)
        args = (
            [moms[i][1] for i in members],
            [moms[i][2] for i in members],
            factor,
            tf.constant(var_of_block * _BINS),
            tuple(int(pads[i]) for i in members),
        )
        # the group size is an argument, part of the XLA function's trace key
        per_block, bins = _elementwise_xla(*args, _GROUP) if xla else _elementwise(*args, xla=False)
        parts_sums.append(
            tf.math.unsorted_segment_sum(
                per_block, tf.constant(var_of_block), num_segments=len(members)
            )
        )
        size = len(members) * _BINS
        # one bincount per piece (a concatenation of the pieces would copy them all)
        counts = tf.add_n([_bincount(b, size) for b in bins])
        parts_counts.append(tf.reshape(counts, [len(members), _BINS]))
        order += members
    if len(parts_sums) == 1:
        sums, counts = parts_sums[0], parts_counts[0]
    else:
        back = np.argsort(order)  # the groups' rows back in variable order
        sums = tf.gather(tf.concat(parts_sums, 0), back)
        counts = tf.gather(tf.concat(parts_counts, 0), back)
    return sums, counts, pads


def _stats_fields(moms, n, loss, lr):
    """The STATS_FIELDS sums (each a float64 ``[V + 1]`` vector: the variables, then the
    model) and the variance histograms (``[V + 1, NUM_HIST_BUCKETS]`` float64)."""
    nf = tf.cast(n, tf.float64)
    several = nf > 1.0
    # n/(n-1): NaN for a batch of one (the unbiased variance is undefined), 0 in `inv_factor`.
    factor = tf.where(several, nf / tf.maximum(nf - 1.0, 1.0), np.nan)
    # sum of m1^2 / s2 over positive s2 = (n-1)/n * sum of m1^2 / biased
    inv_factor = tf.where(several, (nf - 1.0) / nf, 0.0)
    sums, counts, pads = _stats_sums(moms, factor)
    # the zero padding is in bin 0 when n > 1, in _NAN_BIN when n = 1 (see `_stats_sums`)
    pad_bins = np.zeros([len(moms), _BINS], np.int32)
    pad_bins[:, 0] = pads
    counts = counts - tf.constant(pad_bins) * tf.cast(several, tf.int32)
    hist, positive = _histogram_of_bins(tf.cast(counts, tf.float64))
    sizes = np.array([float(np.prod(m[1].shape.as_list())) for m in moms])
    sums = tf.concat([sums, tf.reduce_sum(sums, 0, keepdims=True)], 0)  # + the model's
    hist = tf.concat([hist, tf.reduce_sum(hist, 0, keepdims=True)], 0)
    positive = tf.concat([positive, tf.reduce_sum(positive, 0, keepdims=True)], 0)
    ones = tf.ones([len(moms) + 1], tf.float64)
    nan = tf.constant(np.nan, tf.float64)
    fields = {
        "batch_size": nf * ones,
        "num_elements": tf.constant(np.append(sizes, sizes.sum())),
        "sum_m2": sums[:, 0],
        "sum_var": sums[:, 1] * factor,
        "sum_gsnr": sums[:, 2] * inv_factor,
        # 0 for a batch of one: every s2 is NaN then
        "gsnr_count": positive,
        "sum_m2_raw": sums[:, 3],
        "loss": (nan if loss is None else loss) * ones,
        "learning_rate": (nan if lr is None else lr) * ones,
    }
    return fields, hist


def _derived(f):
    """The in-graph twin of `tb_gradmom.analysis.stats.derived` (same formulas), element-wise."""
    n, d = f["batch_size"], f["num_elements"]
    unbiased = f["sum_m2"] - f["sum_var"] / n
    return {
        "total_variance": f["sum_var"],
        "grad_norm_sq": f["sum_m2"],
        "noise_scale": f["sum_var"] / unbiased,
        "gsnr_mean": tf.where(
            f["gsnr_count"] > 0,
            tf.math.divide_no_nan(f["sum_gsnr"], f["gsnr_count"]),
            tf.constant(np.nan, tf.float64),
        ),
        "norm_test": tf.sqrt(f["sum_var"] / (n * f["sum_m2"])),
        "eb_criterion": 1.0 - (n / d) * f["sum_gsnr"],
        "cabs_batch_size": f["learning_rate"] * (f["sum_m2_raw"] - f["sum_m2"]) / f["loss"],
    }


def _records(backward, indices, tags, contents, orders, lr, moms=None, group=None):
    """The tensors and scalars one logged step writes.

    The statistics of every variable and of the model are computed together (`_stats_fields`)
    as ``[V + 1]`` vectors, and split into the per-tag tensors and scalars by one ``Unpack``
    each: the number of ops does not grow with the statistics per variable."""
    computed = backward.moments(orders, indices) if moms is None else moms
    loss = tf.cast(backward.plan.loss, tf.float64)
    if backward.inv_scale is not None:
        loss = loss * tf.cast(backward.inv_scale, tf.float64)
    return _records_of(computed.values, computed.n, loss, tags, contents, orders, lr, group)


_STATS_COLUMNS = metadata.WRITER_STATS_FIELDS
# Per summary writer: its source token (`metadata.SOURCE_FIELDS`), drawn once.
_WRITER_TOKENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PROCESS_TOKEN: list[int] = []


def _source_token() -> int:
    """The current summary writer's random 48-bit source token (one per writer object; a
    writer that cannot be told apart gets the process's own)."""
    writer = _current_writer()
    if writer is not None and writer is not _ANY_WRITER:
        try:
            if writer not in _WRITER_TOKENS:
                _WRITER_TOKENS[writer] = secrets.randbits(2 * metadata.SOURCE_HALF_BITS)
            return _WRITER_TOKENS[writer]
        except TypeError:  # a writer that cannot be weakly referenced
            pass
    if not _PROCESS_TOKEN:
        _PROCESS_TOKEN.append(secrets.randbits(2 * metadata.SOURCE_HALF_BITS))
    return _PROCESS_TOKEN[0]


def _source_fields(stored) -> dict:
    """The `metadata.SOURCE_FIELDS` columns (float64 ``[V + 1]``) for the stored moments
    tensors of V variables: the writer's token, and each tensor's sum of absolute values (NaN
    for the model)."""
    token = _source_token()
    half = 1 << metadata.SOURCE_HALF_BITS
    count = len(stored) + 1
    sums = [tf.reduce_sum(tf.abs(tf.cast(t, tf.float64))) for t in stored]
    return {
        "source_hi": tf.fill([count], tf.constant(float(token // half), tf.float64)),
        "source_lo": tf.fill([count], tf.constant(float(token % half), tf.float64)),
        "moments_sum": tf.stack([*sums, tf.constant(math.nan, tf.float64)]),
    }


def _records_of(moms, n, loss, tags, contents, orders, lr, group):
    """`_records` from the moments ``moms`` (``moms[k][p]``) over ``n`` examples."""
    model_tag = metadata.model_tag(group)
    fields, hist = _stats_fields(moms, n, loss, lr)
    pooled = [i for i, c in enumerate(contents) if c.pooled]
    stored = {}
    if pooled:
        arrays = [[tf.cast(moms[i][p], tf.float32) for p in orders] for i in pooled]
        specs = tuple((contents[i].shape, contents[i].block) for i in pooled)
        stored = dict(zip(pooled, (_pool_xla if _use_xla() else _pool_all)(arrays, specs)))
    for i, m in enumerate(moms):
        if i not in stored:
            stored[i] = tf.stack([tf.cast(m[p], tf.float32) for p in orders])
    half = [i for i, c in enumerate(contents) if c.encoding == metadata.ENCODING_FLOAT16]
    if half:
        stored.update(zip(half, _encode_float16([stored[i] for i in half])))
    fields.update(_source_fields([stored[i] for i in range(len(moms))]))
    head = tf.stack([fields[k] for k in _STATS_COLUMNS], axis=1)
    packed = tf.unstack(tf.cast(tf.concat([head, hist], 1), tf.float32))  # V + 1 stats tensors
    tensors = []
    for i, (tag, content, stats) in enumerate(zip(tags, contents, packed)):
        md = metadata.create_summary_metadata(content)
        tensors.append((tag, stored[i], md))
        stats_md = metadata.create_summary_metadata(
            metadata.StatsContent(fields=_STATS_COLUMNS, variable=tag)
        )
        tensors.append((metadata.stats_tag(tag), stats, stats_md))
    model_md = metadata.create_summary_metadata(
        metadata.StatsContent(fields=_STATS_COLUMNS, variable=model_tag)
    )
    tensors.append((metadata.stats_tag(model_tag), packed[-1], model_md))
    keys = [k for k in SCALARS if not (k == "cabs_batch_size" and lr is None)]
    return tensors, _scalar_values(fields, keys, list(tags) + [model_tag])


def _scalar_values(fields, keys, tags):
    """The derived scalars ``keys`` of every tag (the variables, then the model), tag-major:
    ``(tag, scalar tag, float32 value)``."""
    derived = _derived(fields)
    values = tf.unstack(
        tf.reshape(tf.cast(tf.stack([derived[k] for k in keys], 1), tf.float32), [-1])
    )
    return [
        (tag, f"gradmom/{tag}/{key}", values[i * len(keys) + j])
        for i, tag in enumerate(tags)
        for j, key in enumerate(keys)
    ]


# The statistics that need the element-wise variances: not written in the norms and replicas
# modes (their sums are NaN there).
ELEMENTWISE_ONLY = ("gsnr_mean", "eb_criterion")


def _sums_records(logged: _moments.Logged, tags, lr, group):
    """`_records_of` for a record of the norms or replicas mode (`Logged.sums`): the stats
    tags of the variables and the model (``sum_gsnr``, ``gsnr_count`` and the histogram NaN:
    no element-wise variance exists) and the scalars; no moments tags (no maps)."""
    assert logged.sums is not None
    model_tag = metadata.model_tag(group)
    nf = tf.cast(logged.n, tf.float64)
    count = len(logged.sums) + 1
    ones = tf.ones([count], tf.float64)
    nan = tf.constant(np.nan, tf.float64)

    def column(key):
        per_var = tf.stack([tf.cast(s[key], tf.float64) for s in logged.sums])
        return tf.concat([per_var, tf.reduce_sum(per_var, keepdims=True)], 0)

    sizes = np.array([float(np.prod(v.shape.as_list())) for v in logged.variables])
    loss = logged.loss
    fields = {
        "batch_size": nf * ones,
        "num_elements": tf.constant(np.append(sizes, sizes.sum())),
        "sum_m2": column("sum_m2"),
        "sum_var": column("sum_var"),
        "sum_gsnr": nan * ones,
        "gsnr_count": nan * ones,
        "sum_m2_raw": column("sum_m2_raw"),
        "loss": (nan if loss is None else tf.cast(loss, tf.float64)) * ones,
        "learning_rate": (nan if lr is None else lr) * ones,
    }
    # The writer's token, and no moments beside these records (moments_sum NaN, as a model's).
    token = _source_fields([])
    fields["source_hi"] = token["source_hi"][0] * ones
    fields["source_lo"] = token["source_lo"][0] * ones
    fields["moments_sum"] = nan * ones
    head = tf.stack([fields[k] for k in _STATS_COLUMNS], axis=1)
    hist = tf.fill([count, _NB], nan)
    packed = tf.unstack(tf.cast(tf.concat([head, hist], 1), tf.float32))
    tensors = []
    for tag, stats in zip(list(tags) + [model_tag], packed):
        content = metadata.StatsContent(fields=_STATS_COLUMNS, variable=tag, source=logged.mode)
        tensors.append((metadata.stats_tag(tag), stats, metadata.create_summary_metadata(content)))
    keys = [
        k
        for k in SCALARS
        if k not in ELEMENTWISE_ONLY and not (k == "cabs_batch_size" and lr is None)
    ]
    return tensors, _scalar_values(fields, keys, list(tags) + [model_tag])


def _selected_scalars(scalar_values, per_variable_scalars):
    return [
        (stag, value)
        for tag, stag, value in scalar_values
        if per_variable_scalars or metadata.is_model_tag(tag)
    ]


# ----------------------------------------------------------------------- per-example norms


def examples_columns(tags: Sequence[str], per_variable_norms: bool) -> tuple[list, list, list]:
    """``(names, kinds, members)`` of the norm columns of an examples tensor: one per layer
    (the tags' paths without their last part, in order of first appearance; a tag without a
    layer is its own), then one per variable when ``per_variable_norms``; ``members[c]`` the
    positions in ``tags`` that column ``c`` sums."""
    layers: dict[str, list[int]] = {}
    for k, tag in enumerate(tags):
        layers.setdefault(tag.rsplit("/", 1)[0] if "/" in tag else tag, []).append(k)
    names, kinds, members = list(layers), ["layer"] * len(layers), list(layers.values())
    if per_variable_norms:
        names += list(tags)
        kinds += ["variable"] * len(tags)
        members += [[k] for k in range(len(tags))]
    return names, kinds, members


def keep_examples(model: tf.Tensor, cap: int) -> tf.Tensor:
    """The positions (ascending) of the examples kept of a batch whose whole-model squared
    norms are ``model`` (``[n]``): all of them when ``n <= cap``; else the ``cap // 4`` largest
    and the ``cap // 4`` smallest norms, always, and ``cap - 2 * (cap // 4)`` examples evenly
    spaced in rank between them (quantiles of the rest)."""
    n = tf.shape(model, out_type=tf.int64)[0]
    k = cap // 4
    mid = cap - 2 * k

    def capped():
        order = tf.argsort(model, direction="DESCENDING", stable=True)
        rest = n - 2 * k
        picks = k + (tf.range(mid, dtype=tf.int64) * rest) // mid
        chosen = tf.concat([order[:k], tf.gather(order, picks), order[n - k :]], 0)
        return tf.sort(tf.cast(chosen, tf.int64))

    return tf.cond(n > cap, capped, lambda: tf.range(n, dtype=tf.int64))


def _examples_records(logged, tags, group, cap: int, per_variable_norms: bool) -> list:
    """The examples tag's tensor (float64 ``[rows, columns]``, see `metadata.ExamplesContent`)
    and, with ids, the ids tag's (``[rows]``), of the kept examples."""
    names, kinds, members = examples_columns(tags, per_variable_norms)
    norms = [tf.cast(t, tf.float64) for t in logged.sq_norms]
    model = tf.add_n(norms)
    keep = keep_examples(model, cap)
    n = tf.shape(model, out_type=tf.int64)[0]
    columns = [
        tf.cast(tf.fill([n], n), tf.float64),
        tf.cast(tf.range(n), tf.float64),
        tf.cast(logged.losses, tf.float64),
        model,
    ] + [norms[m[0]] if len(m) == 1 else tf.add_n([norms[i] for i in m]) for m in members]
    table = tf.gather(tf.stack(columns, 1), keep)
    if logged.ids is not None:
        check = tf.debugging.assert_equal(
            tf.shape(logged.ids, out_type=tf.int64)[0],
            n,
            message="tb_gradmom: example_ids must hold one id per example of the batch",
        )
        with tf.control_dependencies([check]):
            table = tf.identity(table)
    ids_kind = ""
    if logged.ids is not None:
        ids_kind = "string" if logged.ids.dtype == tf.string else "int64"
    content = metadata.ExamplesContent(
        columns=metadata.EXAMPLE_COLUMNS + tuple(names),
        norms=tuple(kinds),
        max_examples=int(cap),
        ids=ids_kind,
    )
    md = metadata.create_examples_metadata(content)
    tag = metadata.examples_tag(group)
    out = [(tag, table, md)]
    if logged.ids is not None:
        ids = logged.ids if ids_kind == "string" else tf.cast(logged.ids, tf.int64)
        out.append((metadata.examples_ids_tag(tag), tf.gather(ids, keep), md))
    return out


def _example_ids(ids):
    """``example_ids`` as a ``[n]`` int64 or string tensor (checked), or None."""
    if ids is None:
        return None
    t = tf.convert_to_tensor(ids)
    if t.dtype != tf.string and not t.dtype.is_integer:
        raise TypeError(
            f"example_ids must be a [n] tensor of integers (dataset indices) or strings "
            f"(keys), got dtype {t.dtype.name}"
        )
    if t.shape.rank is not None and t.shape.rank != 1:
        raise ValueError(
            f"example_ids must be a [n] vector, one id per example of the batch; got shape "
            f"{t.shape}"
        )
    return t
