"""Writing gradient moments to TensorBoard: one call in a training step.

    with writer.as_default(step=step):
        grads = gradmom.summary.moments(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))

The gradients come from the same backward pass as the moments. When nothing is recorded
(``tf.summary.record_if(False)``, no default writer, a step off the schedule) the moment ops sit
in the untaken branch of a ``tf.cond`` and do not run. The event format is in ``docs/format.md``.
"""

from __future__ import annotations

import math
import re
import warnings
import weakref
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from tensorboard.plugins.scalar import metadata as scalar_metadata

from tb_gradmom import _core, _validate, metadata

__all__ = ["moments", "tag_names", "DEFAULT_MAX_ELEMENTS", "SCALARS"]

# Largest number of cells stored per moment array; bigger variables are block-pooled to at most
# this many cells (256 x 256), with exact sums and a variance histogram beside them.
DEFAULT_MAX_ELEMENTS = 1 << 16

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
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    per_variable_scalars: bool = True,
    *,
    step=None,
    learning_rate=None,
    batch_size=None,
    chunk_size: int | None = None,
    log_only=None,
    fallback: str = "exact",
    loss_scale=None,
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
      logged, block-pooled above ``max_elements`` cells;
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
        cells per order (statistics stay exact).
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

    Returns:
      In a ``tf.function``: the gradients, aligned with ``var_list`` (``None`` where the loss
      does not depend on a variable). In a TF1 graph: a scalar string tensor, the merged
      ``Summary``.
    """
    orders = tuple(sorted(set(_core._check_orders(orders)) | {1, 2}))
    max_elements = _validate.positive_int("max_elements", max_elements)
    step = _validate.int_tensor_or_int("step", step)
    learning_rate = _validate.float_scalar("learning_rate", learning_rate)
    inside = tf.inside_function()
    should = tf.summary.should_record_summaries() if inside else None
    # Under tf.distribute TF records on replica 0 only, but every replica must compute (and
    # all-reduce) the moments: their gate is the recording condition without that part.
    distributed = inside and _core._replica_context() is not None
    compute = _recording_any_replica() if distributed else should
    static = None if compute is None else tf.get_static_value(compute)
    off = static is not None and not bool(static)
    prepared = _core.prepare(
        loss,
        var_list,
        reduction,
        batch_size=batch_size,
        name="gradmom_summary",
        chunk_size=chunk_size,
        fallback=fallback,
        # off: no writer or recording off at trace time, no moments at all
        orders=(1,) if off else orders,
        gate=compute if inside and static is None else None,
        loss_scale=loss_scale,
    )
    indices = _log_indices(var_list, log_only)
    group = _group(name, var_list, inside)
    tags = _unique_tags(_tag_names([prepared.names[i] for i in indices], group))
    contents = [
        _moments_content(prepared.plans[i], tag, orders, prepared.op_type(i), max_elements)
        for i, tag in zip(indices, tags)
    ]
    lr = None if learning_rate is None else tf.cast(learning_rate, tf.float64)

    if not inside:
        return _v1_summary(
            prepared, indices, tags, contents, orders, lr, chunk_size, per_variable_scalars, group
        )
    if off:
        return prepared.grads  # nothing is built
    if step is None:
        step = tf.summary.experimental.get_step()
        if step is None:
            raise ValueError(
                "gradmom.summary.moments needs a step: pass step= or use "
                "writer.as_default(step=...) / tf.summary.experimental.set_step(...)"
            )

    moms, pred = None, should
    if prepared.replica is not None:
        # tf.distribute: a cond branch cannot hold the all-reduce (a synchronisation point):
        # the replica's sums are gated by their own cond, the all-reduce of those sums runs on
        # every step (zeros when not recording), and replica 0 writes.
        # TF records on replica 0 only (`should` is False elsewhere); every replica must take
        # part in the sums, so their gate is the recording condition without that restriction.
        moms = prepared.moments(
            orders, chunk_size, indices, gate=compute if static is None else None
        )

    def write():
        tensors, scalar_values = _records(
            prepared, indices, tags, contents, orders, lr, chunk_size, moms, group
        )
        ok = []
        for tag, tensor, md in tensors:
            ok.append(tf.summary.write(tag, tensor, step=step, metadata=md))
        for stag, value in _selected_scalars(scalar_values, per_variable_scalars):
            # tf.summary.write keeps the tag as given (tf.summary.scalar would prefix scopes).
            ok.append(tf.summary.write(stag, tf.cast(value, tf.float32), step, _SCALAR_MD))
        with tf.control_dependencies(ok):
            return tf.constant(True)

    tf.cond(pred, write, lambda: tf.constant(False), name="gradmom_record")
    return prepared.grads


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
                f"log_only holds '{_core.variable_name(v)}', which is not in var_list; "
                "log_only must be a subset of var_list"
            )
        out.append(ids[id(v)])
    if not out:
        raise ValueError("log_only is empty: pass None to log every variable of var_list")
    return out


_GROUP_RE = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$")
# Per summary writer: the variable sets logged to it, in order (the default group of a call).
_WRITER_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _group(name, var_list, inside: bool) -> str | None:
    """The tag group of one call: ``name`` (checked), or by default None for the first set of
    variables logged to the current writer and ``moments_<k>`` for the k-th other set."""
    if name is not None:
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
    key = frozenset(id(_core._tf_variable(v, i)) for i, v in enumerate(var_list))
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


def tag_names(var_list: Sequence, name: str | None = None) -> list[str]:
    """The tags `moments` logs ``var_list`` under (the first call on a writer, or with
    ``name``): e.g. ``["dense/kernel", "dense/bias"]`` for a Sequential model's
    ``sequential_3/dense/kernel`` and ``sequential_3/dense/bias``."""
    var_list = list(var_list)
    for i, v in enumerate(var_list):
        _core._tf_variable(v, i)  # a clear error for anything that is not a variable
    group = _group(name, var_list, inside=False)
    return _unique_tags(_tag_names([_core.variable_name(v) for v in var_list], group))


def _ordinal(k: int) -> str:
    return {2: "second", 3: "third"}.get(k, f"{k}th")


def _current_writer():
    from tb_gradmom._compat import tf_private  # PrivateAPIError if TensorFlow lacks it

    return tf_private.default_summary_writer()


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


def _moments_content(plan, tag, orders, op_type, max_elements) -> metadata.MomentsContent:
    shape = tuple(int(s) for s in plan.variable.shape)
    block = metadata.pool_block(shape, int(max_elements))
    pooled = block != (1, 1)
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
        dtype=plan.variable.dtype.base_dtype.name,
        op=op_type,
        layer=layer,
        variable=plan.name,
    )


def _pool(x: tf.Tensor, shape, block) -> tf.Tensor:
    """Block means over the 2-D view; edge blocks average the cells they cover."""
    rows, cols = metadata.to_2d_shape(shape)
    br, bc = block
    pr, pc = (-rows) % br, (-cols) % bc
    r2, c2 = (rows + pr) // br, (cols + pc) // bc
    grid = tf.reshape(x, [rows, cols])
    if pr or pc:
        grid = tf.pad(grid, [[0, pr], [0, pc]])
    # two contiguous reductions (columns, then rows) are much faster than one over axes [1, 3]
    sums = tf.reduce_sum(tf.reshape(grid, [rows + pr, c2, bc]), axis=2)
    sums = tf.reduce_sum(tf.reshape(sums, [r2, br, c2]), axis=1)
    # cells per block: known at trace time
    count = np.full([r2, c2], float(br * bc))
    if pr:
        count[-1, :] *= (br - pr) / br
    if pc:
        count[:, -1] *= (bc - pc) / bc
    return sums / tf.constant(count, sums.dtype)


_SCALAR_MD = scalar_metadata.create_summary_metadata(display_name="", description="")
_EDGES = np.asarray(metadata.HIST_EDGES, np.float64)
_FIRST, _LAST, _PER_DECADE = metadata.HIST_SPEC
# A value whose scaled log lies this close to an integer may sit on either side of an edge
# after rounding (the log is good to ~1e-14 here): its bucket is found by a binary search.
_AMBIGUOUS = 1e-9


def _histogram(s2, finite):
    """numpy's ``bincount(searchsorted(HIST_EDGES, s2, side="right"))`` over finite ``s2 >= 0``
    (``NUM_HIST_BUCKETS`` counts; values that are not finite are left out). The edges are
    ``10 ** (k / per_decade)``, so a value's bucket is the floor of ``log10(s2) * per_decade``,
    shifted; only values whose log lies within rounding of an edge are bucketed by a binary
    search. A few cheap element-wise passes instead of a binary search per element
    (``UpperBound`` took a third of a logged step)."""
    m = len(_EDGES)
    nb = metadata.NUM_HIST_BUCKETS
    t = tf.math.log(tf.where(finite, s2, 1.0)) * (_PER_DECADE / np.log(10.0))
    floor = tf.floor(t)
    frac = t - floor  # NaN for s2 = 0 (-inf - -inf): never ambiguous
    ambiguous = tf.logical_and(finite, tf.logical_or(frac < _AMBIGUOUS, frac > 1.0 - _AMBIGUOUS))
    guess = tf.cast(tf.clip_by_value(floor - (_FIRST * _PER_DECADE - 1), 0.0, float(m)), tf.int32)
    sure = tf.where(tf.logical_and(finite, tf.logical_not(ambiguous)), guess, nb)
    hist = tf.math.bincount(sure, minlength=nb + 1, maxlength=nb + 1)[:nb]
    near = tf.boolean_mask(s2, ambiguous)
    exact = tf.searchsorted(tf.constant(_EDGES), near, side="right", out_type=tf.int32)
    return hist + tf.math.bincount(exact, minlength=nb, maxlength=nb)


def _stats_vector(m1, m2, n, loss, lr):
    """The STATS_FIELDS sums and the variance histogram of one variable, in float64.

    Element-wise passes are kept few (a logged step runs this over every element of every
    variable): the n-dependent factors are scalars applied after the sums."""
    m1 = tf.reshape(tf.cast(m1, tf.float64), [-1])
    m2 = tf.reshape(tf.cast(m2, tf.float64), [-1])
    nf = tf.cast(n, tf.float64)
    nan = tf.constant(np.nan, tf.float64)
    several = nf > 1.0
    # n/(n-1): NaN for a batch of one (the unbiased variance is undefined), 0 in `inv_factor`.
    factor = tf.where(several, nf / tf.maximum(nf - 1.0, 1.0), nan)
    inv_factor = tf.where(several, (nf - 1.0) / nf, 0.0)
    m1sq = m1 * m1
    biased = tf.maximum(m2 - m1sq, 0.0)
    s2 = biased * factor
    positive = biased > 0.0
    # sum of m1^2 / s2 over positive s2 = (n-1)/n * sum of m1^2 / biased
    sum_gsnr = tf.reduce_sum(tf.math.divide_no_nan(m1sq, biased)) * inv_factor
    gsnr_count = tf.where(several, tf.reduce_sum(tf.cast(positive, tf.float64)), 0.0)
    hist = _histogram(s2, tf.math.is_finite(s2))
    fields = {
        "batch_size": nf,
        "num_elements": tf.cast(tf.size(m1), tf.float64),
        "sum_m2": tf.reduce_sum(m1sq),
        "sum_var": tf.reduce_sum(biased) * factor,
        "sum_gsnr": sum_gsnr,
        "gsnr_count": gsnr_count,
        "sum_m2_raw": tf.reduce_sum(m2),
        "loss": nan if loss is None else loss,
        "learning_rate": nan if lr is None else lr,
    }
    return fields, tf.cast(hist, tf.float64)


def _derived(f):
    """The in-graph twin of `tb_gradmom.stats.derived` (same formulas)."""
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


def _pack(fields, hist):
    head = tf.stack([tf.cast(fields[k], tf.float64) for k in metadata.STATS_FIELDS])
    return tf.cast(tf.concat([head, hist], 0), tf.float32)


def _records(prepared, indices, tags, contents, orders, lr, chunk_size, moms=None, group=None):
    """The tensors and scalars one logged step writes."""
    model_tag = metadata.model_tag(group)
    if moms is None:
        moms = prepared.moments(orders, chunk_size, indices)
    loss = tf.cast(prepared.loss, tf.float64)
    if prepared.inv_scale is not None:
        loss = loss * tf.cast(prepared.inv_scale, tf.float64)
    n = prepared.n_total
    tensors, scalars = [], []  # scalars: (tag, fields)
    model_fields, model_hist = None, None
    for tag, content, m in zip(tags, contents, moms):
        arrays = []
        for p in orders:
            a = tf.cast(m[p], tf.float32)
            if content.pooled:
                a = _pool(a, content.shape, content.block)
            arrays.append(a)
        md = metadata.create_summary_metadata(content)
        tensors.append((tag, tf.stack(arrays), md))
        fields, hist = _stats_vector(m[1], m[2], n, loss, lr)
        stats_md = metadata.create_summary_metadata(metadata.StatsContent(variable=tag))
        tensors.append((metadata.stats_tag(tag), _pack(fields, hist), stats_md))
        scalars.append((tag, fields))
        if model_fields is None:
            model_fields, model_hist = dict(fields), hist
        else:
            for k in ("num_elements", "sum_m2", "sum_var", "sum_gsnr", "gsnr_count", "sum_m2_raw"):
                model_fields[k] = model_fields[k] + fields[k]
            model_hist = model_hist + hist
    model_md = metadata.create_summary_metadata(metadata.StatsContent(variable=model_tag))
    tensors.append((metadata.stats_tag(model_tag), _pack(model_fields, model_hist), model_md))
    scalar_values = []
    for tag, fields in scalars + [(model_tag, model_fields)]:
        derived = _derived(fields)
        for key in SCALARS:
            if key == "cabs_batch_size" and lr is None:
                continue
            scalar_values.append((tag, f"gradmom/{tag}/{key}", derived[key]))
    return tensors, scalar_values


def _selected_scalars(scalar_values, per_variable_scalars):
    return [
        (stag, value)
        for tag, stag, value in scalar_values
        if per_variable_scalars or metadata.is_model_tag(tag)
    ]


def _v1_summary(
    prepared, indices, tags, contents, orders, lr, chunk_size, per_variable_scalars, group
):
    """A merged TF1 ``Summary`` with the same tags and tensors as the TF2 path."""
    tensors, scalar_values = _records(
        prepared, indices, tags, contents, orders, lr, chunk_size, None, group
    )
    parts = [
        tf.raw_ops.TensorSummaryV2(
            tag=tag, tensor=tensor, serialized_summary_metadata=md.SerializeToString()
        )
        for tag, tensor, md in tensors
    ]
    parts += [
        tf.raw_ops.ScalarSummary(tags=stag, values=tf.cast(value, tf.float32))
        for stag, value in _selected_scalars(scalar_values, per_variable_scalars)
    ]
    return tf.raw_ops.MergeSummary(inputs=parts)
