"""Per-step sums over a variable's elements and the quantities derived from them (numpy only).

With ``m = M_1``, ``s = M_2``, the unbiased variance ``s2 = n/(n-1) (s - m**2)`` element-wise
and ``D`` parameters (see MATH.md):

* total variance ``tr(Sigma) = sum s2``; unbiased squared norm of the true gradient
  ``|G|^2 = |m|^2 - tr(Sigma)/n``;
* gradient noise scale ``B_simple = tr(Sigma) / |G|^2`` (McCandlish et al. 2018, "An Empirical
  Model of Large-Batch Training"), optionally with numerator and denominator smoothed
  separately by an exponential moving average over steps;
* mean gradient signal-to-noise ratio ``mean(m**2 / s2)`` (Liu et al. 2020);
* norm test ``sqrt(tr(Sigma) / (n |m|^2))`` (Byrd et al. 2012);
* EB criterion ``1 - (n/D) sum(m**2 / s2)`` (Mahsereci et al. 2017; stop when > 0);
* CABS batch size ``lr * sum(s - m**2) / loss`` (Balles, Romero, Hennig 2017).

The sums are the ``STATS_FIELDS`` of `tb_gradmom.metadata`, the head of every ``stats`` tensor.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tb_gradmom import metadata, reductions

__all__ = [
    "DERIVED",
    "sums_from_moments",
    "variance_histogram",
    "split_stats_tensor",
    "derived",
]

# Derived quantities, in display order, with a one-line description each.
DERIVED: dict[str, str] = {
    "total_variance": "tr(Sigma): sum of the unbiased per-element variances",
    "grad_norm_sq": "|m|^2: squared norm of the mini-batch gradient",
    "grad_norm_sq_unbiased": "|G|^2 = |m|^2 - tr(Sigma)/n: unbiased squared norm of the true gradient",
    "noise_scale": "B_simple = tr(Sigma) / |G|^2: gradient noise scale (McCandlish et al. 2018)",
    "gsnr_mean": "mean of M1^2 / s2 over elements with s2 > 0 (Liu et al. 2020)",
    "norm_test": "sqrt(tr(Sigma) / (n |m|^2)): norm test (Byrd et al. 2012)",
    "eb_criterion": "1 - (n/D) sum(M1^2 / s2): EB criterion, stop when > 0 (Mahsereci et al. 2017)",
    "cabs_batch_size": "lr * sum(M2 - M1^2) / loss: CABS batch size (Balles et al. 2017)",
}


def sums_from_moments(m1: np.ndarray, m2: np.ndarray, n: int) -> dict[str, float]:
    """The exact ``STATS_FIELDS`` sums of one variable from its first two raw moments.

    Element-wise variances come from `reductions.stat_array` (clipped at 0, NaN for ``n == 1``).
    Elements with ``s2 == 0`` (or NaN) are left out of ``sum_gsnr`` and ``gsnr_count``.

    Args:
      m1: ``M_1``, the variable's shape (unpooled, for exact sums).
      m2: ``M_2``, same shape.
      n: the batch size (>= 1).

    Returns:
      A dict with every field of `metadata.STATS_FIELDS`; ``loss`` and ``learning_rate`` are NaN.
    """
    m1 = np.asarray(m1, dtype=np.float64)
    m2 = np.asarray(m2, dtype=np.float64)
    if m1.shape != m2.shape:
        raise ValueError(f"m1 and m2 must have one shape, got {m1.shape} and {m2.shape}")
    moments = {1: m1, 2: m2}
    s2 = reductions.stat_array(moments, n, "variance")
    positive = s2 > 0
    sq = m1 * m1
    sums = {
        "batch_size": float(n),
        "num_elements": float(m1.size),
        "sum_m2": float(sq.sum()),
        "sum_var": float(s2.sum()),
        "sum_gsnr": float((sq[positive] / s2[positive]).sum()),
        "gsnr_count": float(positive.sum()),
        "sum_m2_raw": float(m2.sum()),
        "loss": float("nan"),
        "learning_rate": float("nan"),
    }
    return {f: sums[f] for f in metadata.STATS_FIELDS}


def variance_histogram(s2: np.ndarray) -> np.ndarray:
    """Counts of per-element unbiased variances over the fixed buckets `metadata.HIST_EDGES`.

    Bucket 0 holds values below ``HIST_EDGES[0]`` (zeros included), bucket ``i`` holds
    ``HIST_EDGES[i-1] <= v < HIST_EDGES[i]``, the last bucket values at or above
    ``HIST_EDGES[-1]``. NaN values are not counted.

    Args:
      s2: the per-element unbiased variance, any shape.

    Returns:
      float64 counts ``[metadata.NUM_HIST_BUCKETS]``.
    """
    v = np.asarray(s2, dtype=np.float64).ravel()
    v = v[~np.isnan(v)]
    idx = np.searchsorted(np.asarray(metadata.HIST_EDGES), v, side="right")
    return np.bincount(idx, minlength=metadata.NUM_HIST_BUCKETS).astype(np.float64)


def split_stats_tensor(
    values: np.ndarray, fields: tuple[str, ...] = metadata.STATS_FIELDS
) -> tuple[dict[str, float], np.ndarray]:
    """Splits a logged ``stats`` tensor into its sums and its histogram counts.

    Args:
      values: the 1-D stats tensor ``[len(fields) + number of buckets]``.
      fields: the field names from the tag's `metadata.StatsContent`.

    Returns:
      ``(sums, counts)``: a dict field -> float, and the bucket counts.

    Raises:
      ValueError: if the tensor is shorter than the fields.
    """
    values = np.asarray(values, dtype=np.float64).ravel()
    if values.size < len(fields):
        raise ValueError(
            f"a stats tensor needs at least {len(fields)} values ({', '.join(fields)}), "
            f"got {values.size}"
        )
    sums = {f: float(values[i]) for i, f in enumerate(fields)}
    return sums, values[len(fields) :].copy()


def _ema(x: np.ndarray, decay: float) -> np.ndarray:
    # Zero-initialised EMA over the last axis; non-finite steps keep the previous average.
    # Numerator and denominator share the bias correction 1 - decay**t, so their ratio is
    # the same with or without it; it is applied anyway so that each smoothed sum is unbiased.
    out = np.empty_like(x)
    acc = np.zeros(x.shape[:-1])
    weight = np.zeros(x.shape[:-1])
    for t in range(x.shape[-1]):
        xt = x[..., t]
        ok = np.isfinite(xt)
        acc = np.where(ok, decay * acc + (1.0 - decay) * np.where(ok, xt, 0.0), acc)
        weight = np.where(ok, decay * weight + (1.0 - decay), weight)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[..., t] = np.where(weight > 0, acc / np.where(weight > 0, weight, 1.0), np.nan)
    return out


def derived(sums: Mapping[str, float | np.ndarray], ema: float | None = None) -> dict:
    """Derived quantities from the ``STATS_FIELDS`` sums, for one step or many.

    Every sum may be a scalar or an array (e.g. one value per step, steps on the last axis);
    the results broadcast. Divisions follow IEEE rules without warnings and are not clipped:

    * ``noise_scale`` is returned as computed: when ``|G|^2 <= 0`` (the gradient is dominated
      by noise, common late in training or with small batches) it is negative or ``+-inf``;
      callers decide how to show that. NaN for ``n == 1`` (no variance).
    * ``gsnr_mean`` is NaN when ``gsnr_count == 0``; ``norm_test`` is ``inf`` (or NaN) when
      ``|m|^2 == 0``.
    * ``cabs_batch_size`` is NaN when the loss or the learning rate was not logged (NaN).

    Args:
      sums: field -> value, with at least ``batch_size``, ``num_elements``, ``sum_m2``,
        ``sum_var``, ``sum_gsnr``, ``gsnr_count``, ``sum_m2_raw``; ``loss`` and
        ``learning_rate`` default to NaN.
      ema: optional decay in ``[0, 1)`` for an exponential moving average over the last axis
        (steps, oldest first), applied to the numerator ``tr(Sigma)`` and the denominator
        ``|G|^2`` of the noise scale separately (McCandlish et al. 2018, appendix A.1). Steps
        with a non-finite value keep the previous average. The result is added as
        ``noise_scale_ema`` (``noise_scale`` stays the per-step value).

    Returns:
      A dict with the keys of `DERIVED` (plus ``noise_scale_ema`` when ``ema`` is given), each a
      float for scalar input or a float64 array.

    Raises:
      KeyError: naming a missing sum.
      ValueError: for an ``ema`` outside ``[0, 1)``.
    """
    required = (
        "batch_size",
        "num_elements",
        "sum_m2",
        "sum_var",
        "sum_gsnr",
        "gsnr_count",
        "sum_m2_raw",
    )
    missing = [k for k in required if k not in sums]
    if missing:
        raise KeyError(f"derived() needs the sums {list(required)}; missing {missing}")
    a = {k: np.asarray(sums[k], dtype=np.float64) for k in required}
    loss = np.asarray(sums.get("loss", np.nan), dtype=np.float64)
    lr = np.asarray(sums.get("learning_rate", np.nan), dtype=np.float64)
    n, d = a["batch_size"], a["num_elements"]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        total_variance = a["sum_var"]
        grad_norm_sq = a["sum_m2"]
        unbiased = grad_norm_sq - total_variance / n
        out = {
            "total_variance": total_variance,
            "grad_norm_sq": grad_norm_sq,
            "grad_norm_sq_unbiased": unbiased,
            "noise_scale": total_variance / unbiased,
            "gsnr_mean": np.where(
                a["gsnr_count"] > 0,
                a["sum_gsnr"] / np.where(a["gsnr_count"] > 0, a["gsnr_count"], 1),
                np.nan,
            ),
            "norm_test": np.sqrt(total_variance / (n * grad_norm_sq)),
            "eb_criterion": 1.0 - (n / d) * a["sum_gsnr"],
            "cabs_batch_size": lr * (a["sum_m2_raw"] - grad_norm_sq) / loss,
        }
        if ema is not None:
            if not 0.0 <= float(ema) < 1.0:
                raise ValueError(f"ema must be a decay in [0, 1), got {ema}")
            num, den = np.broadcast_arrays(total_variance, unbiased)
            num = np.atleast_1d(np.asarray(num, dtype=np.float64))
            den = np.atleast_1d(np.asarray(den, dtype=np.float64))
            smoothed = _ema(num, float(ema)) / _ema(den, float(ema))
            out["noise_scale_ema"] = smoothed.reshape(np.shape(total_variance * unbiased))
    scalar = all(np.ndim(v) == 0 for v in (*a.values(), loss, lr))
    return {k: (float(v) if scalar else np.asarray(v, dtype=np.float64)) for k, v in out.items()}
