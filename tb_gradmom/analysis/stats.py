"""Per-step sums over a variable's elements and the quantities derived from them (numpy only).

With ``m = M_1``, ``s = M_2``, the unbiased variance ``s2 = n/(n-1) (s - m**2)`` element-wise
and ``D`` parameters (see docs/math.md):

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

import dataclasses
import json
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from tb_gradmom import metadata
from tb_gradmom.analysis import reductions

__all__ = [
    "DERIVED",
    "STATISTICS",
    "Statistic",
    "sums_from_moments",
    "variance_histogram",
    "split_stats_tensor",
    "derived",
    "ema",
    "smoothed",
    "smoothed_se",
    "smoothed_at",
    "RATIO_FORMS",
    "describe",
    "ADDITIVE_FIELDS",
    "SHARED_FIELDS",
    "layer_sums",
    "layer_members",
    "RATIO_PARTS",
    "NOISE_SCALE_NOTE",
]


@dataclasses.dataclass(frozen=True)
class Statistic:
    """What a derived statistic is, for people: shown by the tab, the CLI's help and exports.

    Attributes:
      name: the human name ("Gradient noise scale"), without symbols.
      short: a short label for table headers and legends ("noise scale").
      symbol: its symbol, typeset in Unicode ("Bₛᵢₘₚₗₑ", "tr(Σ)").
      group: what kind of statistic it is (a key of `tb_gradmom.analysis.views.STATISTIC_GROUPS`:
        "noise_scale", "signal_to_noise", "step_size", "magnitude").
      meaning: one line saying what it measures.
      formula: the estimator, typeset in Unicode (``M₁``, ``s²`` the unbiased variance, ``Σ``).
      unit: what its values count ("examples", "a batch size", "ratio", ...).
      reading: what high and low values suggest.
      reference: the paper it comes from ("" for plain definitions).
      smoothing: how ``smoothed`` smooths it (numerator and denominator separately, ...).
    """

    name: str
    short: str
    symbol: str
    group: str
    meaning: str
    formula: str
    unit: str
    reading: str
    reference: str
    smoothing: str

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


# Every derived statistic, in display order: the one source of truth for labels and
# explanations (the plugin serves it, the tab and the CLI show it). The prose lives in
# statistics.json next to this module (package data); docs/math.md has the math.
_CATALOGUE = pathlib.Path(__file__).with_name("statistics.json")


def _load_statistics() -> dict[str, Statistic]:
    entries = json.loads(_CATALOGUE.read_text(encoding="utf-8"))
    return {key: Statistic(**entry) for key, entry in entries.items()}


STATISTICS: dict[str, Statistic] = _load_statistics()

# The derived quantities, in display order, with a one-line description each.
DERIVED: dict[str, str] = {
    k: f"{v.formula}: {v.name[0].lower()}{v.name[1:]}" for k, v in STATISTICS.items()
}


def describe(key: str) -> str:
    """A statistic's explanation as a few lines of plain text (the CLI's help)."""
    s = STATISTICS[key]
    lines = [
        f"{key}: {s.name} {s.symbol} [{s.unit}]",
        f"  {s.meaning}.",
        f"  {s.formula}",
        f"  {s.reading}.",
    ]
    if s.reference:
        lines.append(f"  Ref.: {s.reference}.")
    return "\n".join(lines)


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


# The default smoothing of the curves (the tab, `plot`, `tb-gradmom export`): a decay of 0.9
# averages about ten logged steps, numerators and denominators separately (`smoothed`). The
# tab reads it from GET /meta (`tb_gradmom.analysis.views.meta`).
DEFAULT_SMOOTHING = 0.9


def ema(x: np.ndarray, beta: float) -> np.ndarray:
    """Bias-corrected exponential moving average over the last axis (steps, oldest first).

    ``a_k = beta a_{k-1} + (1 - beta) x_k`` from ``a_0 = 0``, divided by the weight
    ``w_k = 1 - beta**k`` (Adam's bias correction: Kingma & Ba 2015), so the first steps are not
    pulled towards 0. A step whose value is not finite (not logged, NaN) is skipped: the average
    and its weight stay as they were. ``beta = 0`` returns ``x`` (non-finite values aside).

    Args:
      x: values, steps on the last axis.
      beta: the decay in ``[0, 1)``.

    Returns:
      float64, the shape of ``x``; NaN before the first finite value.
    """
    x = np.asarray(x, dtype=np.float64)
    beta = _check_beta(beta)
    out = np.empty_like(x)
    acc = np.zeros(x.shape[:-1])
    weight = np.zeros(x.shape[:-1])
    for t in range(x.shape[-1]):
        xt = x[..., t]
        ok = np.isfinite(xt)
        acc = np.where(ok, beta * acc + (1.0 - beta) * np.where(ok, xt, 0.0), acc)
        weight = np.where(ok, beta * weight + (1.0 - beta), weight)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[..., t] = np.where(weight > 0, acc / np.where(weight > 0, weight, 1.0), np.nan)
    return out


def _check_beta(beta) -> float:
    try:
        b = float(beta)
    except (TypeError, ValueError):
        raise ValueError(f"the smoothing must be a decay in [0, 1), got {beta!r}") from None
    if not 0.0 <= b < 1.0:
        raise ValueError(f"the smoothing must be a decay in [0, 1), got {beta!r}")
    return b


def _parts(sums: Mapping[str, float | np.ndarray]) -> dict[str, np.ndarray]:
    """The additive per-step parts every derived statistic is a function of."""
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
    a["loss"] = np.asarray(sums.get("loss", np.nan), dtype=np.float64)
    a["learning_rate"] = np.asarray(sums.get("learning_rate", np.nan), dtype=np.float64)
    return a


def _from_parts(p: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    # The one definition of every derived statistic, from (possibly smoothed) parts:
    #   tv = tr(Sigma), m2 = |m|^2, g2 = |G|^2 = |m|^2 - tr(Sigma)/n, gs = sum M1^2/s2 over
    #   elements with s2 > 0, gc = their count, eb = (n/D) gs, cabs_num = lr sum(M2 - M1^2).
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return {
            "total_variance": p["tv"],
            "grad_norm_sq": p["m2"],
            "grad_norm_sq_unbiased": p["g2"],
            "noise_scale": p["tv"] / p["g2"],
            "gsnr_mean": np.where(p["gc"] > 0, p["gs"] / np.where(p["gc"] > 0, p["gc"], 1), np.nan),
            "norm_test": np.sqrt(p["tv_n"] / p["m2"]),
            "eb_criterion": 1.0 - p["eb"],
            "cabs_batch_size": p["cabs_num"] / p["loss"],
        }


def _raw_parts(a: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    n, d = a["batch_size"], a["num_elements"]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return {
            "tv": a["sum_var"],
            "m2": a["sum_m2"],
            "g2": a["sum_m2"] - a["sum_var"] / n,
            "tv_n": a["sum_var"] / n,
            "gs": a["sum_gsnr"],
            "gc": a["gsnr_count"],
            "eb": (n / d) * a["sum_gsnr"],
            "cabs_num": a["learning_rate"] * (a["sum_m2_raw"] - a["sum_m2"]),
            "loss": a["loss"],
        }


def smoothed(sums: Mapping[str, float | np.ndarray], beta: float) -> dict[str, np.ndarray]:
    """Every derived statistic from separately smoothed numerators and denominators.

    Each additive part (``tr(Sigma)``, ``|m|^2``, ``|G|^2``, ``tr(Sigma)/n``, the GSNR sum and
    count, ``(n/D)`` times the GSNR sum, ``lr sum(M_2 - M_1^2)`` and the loss) is smoothed over
    the steps by `ema` (bias-corrected), and the ratios are taken afterwards: for instance
    ``noise_scale = EMA(tr Sigma) / EMA(|G|^2)`` (McCandlish et al. 2018, App. A.1), never an
    EMA of per-step ratios. ``beta = 0`` gives `derived`'s per-step values. A smoothed
    denominator ``<= 0`` gives a negative or infinite noise scale: the noise dominates at this
    batch size, and it is returned as such (see docs/math.md).

    Args:
      sums: as for `derived`, each a 1-D array over steps (oldest first), or a scalar.
      beta: the decay in ``[0, 1)`` (TensorBoard's "smoothing").

    Returns:
      A dict with the keys of `STATISTICS`, float64 arrays shaped like the steps.
    """
    beta = _check_beta(beta)
    a = _parts(sums)
    raw = _raw_parts(a)
    shape = np.broadcast_shapes(*(np.shape(v) for v in raw.values()))
    smooth = {}
    for k, v in raw.items():
        v = np.atleast_1d(np.broadcast_to(v, shape).astype(np.float64))
        smooth[k] = ema(v, beta).reshape(shape)
    return {k: np.asarray(v, dtype=np.float64) for k, v in _from_parts(smooth).items()}


# Every statistic as ``f(EMA(num) / EMA(den))`` over the additive parts of `_raw_parts` (``den``
# None: the statistic is the EMA of ``num`` itself): the form `smoothed_se` differentiates.
# ``f`` is "identity", "sqrt" (the norm test) or "one_minus" (the EB criterion).
RATIO_FORMS: dict[str, tuple[str, str | None, str]] = {
    "total_variance": ("tv", None, "identity"),
    "grad_norm_sq": ("m2", None, "identity"),
    "grad_norm_sq_unbiased": ("g2", None, "identity"),
    "noise_scale": ("tv", "g2", "identity"),
    "gsnr_mean": ("gs", "gc", "identity"),
    "norm_test": ("tv_n", "m2", "sqrt"),
    "eb_criterion": ("eb", None, "one_minus"),
    "cabs_batch_size": ("cabs_num", "loss", "identity"),
}


# The statistics that are a ratio of two other statistics, each smoothed on its own by
# `smoothed` (``noise_scale``: ``EMA(tr Sigma) / EMA(|G|^2)``): statistic -> (numerator,
# denominator). The tab draws the two beside the ratio, as a dashboard cannot divide EMAs.
_ADDITIVE = {num: k for k, (num, den, f) in RATIO_FORMS.items() if den is None and f == "identity"}
RATIO_PARTS: dict[str, tuple[str, str]] = {
    k: (_ADDITIVE[num], _ADDITIVE[den])
    for k, (num, den, f) in RATIO_FORMS.items()
    if den is not None and f == "identity" and num in _ADDITIVE and den in _ADDITIVE
}

# What the noise scale estimates, and under which assumptions: the tab's info panel for the
# noise statistics (served by GET /meta). References checked against the papers' abstracts.
NOISE_SCALE_NOTE: dict = {
    "title": "What the noise scale estimates, and what it does not",
    "paragraphs": [
        "Bₛᵢₘₚₗₑ = tr(Σ) / |G|² compares how much the per-example gradients scatter (tr(Σ), "
        "their variance summed over the parameters) with the squared length of their mean "
        "(|G|², estimated without bias as |m|² − tr(Σ)/n). A mini-batch of B examples has "
        "gradient noise tr(Σ)/B, so Bₛᵢₘₚₗₑ is the batch size at which that noise equals the "
        "squared signal.",
        "McCandlish et al. (2018) derive that the critical batch size (beyond which larger "
        "batches stop saving optimisation steps) is about the noise scale under a local "
        "quadratic model of the loss with a well-tuned step size; Bₛᵢₘₚₗₑ equals their "
        "noise scale only when the Hessian is close to a multiple of the identity. Read it "
        "as an estimate of the critical batch size only under those assumptions.",
        "Recent work questions them: Merrill et al. (2025) argue that strong assumptions are "
        "needed to use the noise scale as a proxy for the critical batch size, and measure "
        "the critical batch size directly instead. Gray et al. (2024) compute layer-wise "
        "noise scales in transformers and find that the normalisation layers' alone predict "
        "the whole model's well: compare the layer curve with the whole model's here.",
        "Here the numerator tr(Σ) and the denominator |G|² are each smoothed (EMA, "
        "bias-corrected) and only then divided; both are drawn beside the ratio. A smoothed "
        "|G|² ≤ 0 means the noise dominates at this batch size: the noise scale is then "
        "marked, not drawn. A layer's noise scale adds its variables' tr(Σ) and |G|².",
    ],
    "references": [
        {
            "authors": "McCandlish, Kaplan, Amodei and the OpenAI Dota Team",
            "year": 2018,
            "title": "An Empirical Model of Large-Batch Training",
            "where": "arXiv:1812.06162",
            "url": "https://arxiv.org/abs/1812.06162",
        },
        {
            "authors": "Gray, Tiwari, Bergsma, Hestness",
            "year": 2024,
            "title": "Normalization Layer Per-Example Gradients are Sufficient to Predict "
            "Gradient Noise Scale in Transformers",
            "where": "NeurIPS 2024, arXiv:2411.00999",
            "url": "https://arxiv.org/abs/2411.00999",
        },
        {
            "authors": "Merrill, Arora, Groeneveld, Hajishirzi",
            "year": 2025,
            "title": "Critical Batch Size Revisited: A Simple Empirical Approach to "
            "Large-Batch Language Model Training",
            "where": "arXiv:2505.23971",
            "url": "https://arxiv.org/abs/2505.23971",
        },
    ],
}


def _ratio_se(a: np.ndarray, b: np.ndarray, beta: float) -> tuple[np.ndarray, np.ndarray]:
    # The standard error of R_k = A_k / B_k, A and B the EMAs of a and b over the steps where
    # both are finite (docs/math.md, "Uncertainty"): with the EMA's normalised weights w_t,
    #   SE^2 = sum_t w_t^2 (a_t - R b_t)^2 / (B^2 (1 - sum_t w_t^2)),
    # where sum_t w_t^2 x_t = (sum_t w_t^2) * EMA_{beta^2}(x) and, over m finite steps,
    #   sum_t w_t^2 = (1 - beta)(1 + beta^m) / ((1 + beta)(1 - beta^m)).
    ok = np.isfinite(a) & np.isfinite(b)
    a = np.where(ok, a, np.nan)
    b = np.where(ok, b, np.nan)
    big_a, big_b = ema(a, beta), ema(b, beta)
    b2 = beta * beta
    aa, ab, bb = ema(a * a, b2), ema(a * b, b2), ema(b * b, b2)
    m = np.cumsum(ok, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        bm = np.power(beta, m)
        w2 = np.where(m > 0, (1 - beta) * (1 + bm) / ((1 + beta) * (1 - bm)), np.nan)
        r = big_a / big_b
        resid = np.maximum(aa - 2 * r * ab + r * r * bb, 0.0)
        var = w2 * resid / (big_b * big_b * (1 - w2))
        return np.where((m > 1) & (beta > 0), np.sqrt(var), np.nan), r


def smoothed_se(sums: Mapping[str, float | np.ndarray], beta: float) -> dict[str, np.ndarray]:
    """The standard error of every statistic of `smoothed`, over the steps in its window.

    Each smoothed statistic is ``f(A / B)``, ``A`` and ``B`` bias-corrected EMAs of additive
    per-step parts (`RATIO_FORMS`; ``B = 1`` for the additive statistics). Treating the logged
    steps inside the window as independent draws around the smoothed value, the linearised
    (delta-method) standard error of the ratio of the two weighted means is
    ``SE(R)^2 = sum_t w_t^2 (a_t - R b_t)^2 / (B^2 (1 - sum_t w_t^2))`` with ``w_t`` the EMA's
    normalised weights (the ``1 - sum w^2`` makes it unbiased for equal weights, the ``n - 1``
    of a sample variance); then ``SE(sqrt R) = SE(R) / (2 sqrt R)`` and ``SE(1 - R) = SE(R)``.
    Steps where ``a`` or ``b`` is not finite are left out. NaN with fewer than two finite
    steps, and for ``beta = 0`` (a single step says nothing about its own spread). See
    docs/math.md, "Uncertainty of the smoothed statistics".

    Args:
      sums: as for `smoothed`, each a 1-D array over steps (oldest first).
      beta: the decay in ``[0, 1)``.

    Returns:
      A dict with the keys of `STATISTICS`, float64 arrays shaped like the steps.
    """
    beta = _check_beta(beta)
    a = _parts(sums)
    raw = _raw_parts(a)
    shape = np.broadcast_shapes(*(np.shape(v) for v in raw.values()))
    parts = {k: np.atleast_1d(np.broadcast_to(v, shape).astype(np.float64)) for k, v in raw.items()}
    ones = np.ones(np.atleast_1d(np.empty(shape)).shape)
    out = {}
    for key, (num, den, f) in RATIO_FORMS.items():
        se, r = _ratio_se(parts[num], ones if den is None else parts[den], beta)
        if f == "sqrt":
            with np.errstate(divide="ignore", invalid="ignore"):
                se = np.where(r > 0, se / (2 * np.sqrt(np.where(r > 0, r, 1.0))), np.nan)
        out[key] = np.asarray(se, dtype=np.float64).reshape(shape)
    return out


def smoothed_at(
    sums: Mapping[str, np.ndarray], index: int, beta: float
) -> tuple[dict[str, float], dict[str, float]]:
    """`smoothed` and `smoothed_se` of every statistic at one step of a series.

    The EMA is causal, so only the steps up to ``index`` are smoothed.

    Args:
      sums: as for `smoothed`, 1-D arrays over steps (oldest first).
      index: the step's position in the arrays.
      beta: the decay in ``[0, 1)``.

    Returns:
      ``(values, standard_errors)``, each a dict with the keys of `STATISTICS`.
    """
    head = {k: np.atleast_1d(np.asarray(v, dtype=np.float64))[: index + 1] for k, v in sums.items()}
    values = smoothed(head, beta)
    se = smoothed_se(head, beta)
    return (
        {k: float(np.atleast_1d(v)[-1]) for k, v in values.items()},
        {k: float(np.atleast_1d(v)[-1]) for k, v in se.items()},
    )


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
    a = _parts(sums)
    out = _from_parts(_raw_parts(a))
    if ema is not None:
        out["noise_scale_ema"] = smoothed(sums, ema)["noise_scale"]
    scalar = all(np.ndim(v) == 0 for v in a.values())
    return {k: (float(v) if scalar else np.asarray(v, dtype=np.float64)) for k, v in out.items()}


# The ``STATS_FIELDS`` sums that add over variables (a layer's or the whole model's value is
# the sum of its variables'), and those every variable of one call shares at a step.
ADDITIVE_FIELDS = ("num_elements", "sum_m2", "sum_var", "sum_gsnr", "gsnr_count", "sum_m2_raw")
SHARED_FIELDS = ("batch_size", "loss", "learning_rate")


def layer_members(layers: Mapping[str, str], tag: str, groups: Sequence[str] = ()) -> list[str]:
    """The variables of the layer of variable ``tag``: those with its layer name in its group.

    One `summary.moments` call is a group (docs/format.md, "Groups"; its variables' tags start
    with ``<name>/``, the unnamed group ``""`` has no prefix): a GAN's generator and
    discriminator may both have a layer ``dense`` and are two layers.

    Args:
      layers: variable tag -> layer name (`metadata.MomentsContent.layer`), of one run.
      tag: a variable of ``layers``.
      groups: the run's group names (the prefixes of its whole-model tags).

    Returns:
      The tags, sorted; ``[]`` when ``tag`` has no layer name.

    Raises:
      KeyError: ``tag`` is not in ``layers``.
    """
    if tag not in layers:
        raise KeyError(f"no variable {tag!r} among {sorted(layers)}")

    def group_of(t: str) -> str:
        return max((g for g in groups if g and t.startswith(g + "/")), key=len, default="")

    layer, group = layers[tag], group_of(tag)
    if not layer:
        return []
    return sorted(t for t, name in layers.items() if name == layer and group_of(t) == group)


def layer_sums(
    series: Mapping[str, tuple[np.ndarray, Mapping[str, np.ndarray]]],
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The ``STATS_FIELDS`` sums of a group of variables (a layer), step by step.

    Every sum over elements adds over variables: a layer's ``tr(Sigma)``, ``|m|^2``, element
    count, GSNR sum and count are those of its variables added, so every derived statistic of
    the layer (its noise scale ``B_simple = tr(Sigma) / |G|^2``, and through `smoothed` the
    separately smoothed parts) follows from these sums exactly as a variable's or the whole
    model's does. Only the steps that every variable has are kept (a step missing from one
    variable has no layer value). The batch size, loss and learning rate are shared by the
    variables of one logged call: taken from the first variable that has them.

    Args:
      series: variable name -> ``(steps, sums)``: int ``[T_v]`` ascending steps and
        field -> float ``[T_v]`` arrays (`ADDITIVE_FIELDS` required; `SHARED_FIELDS`
        optional, NaN when absent).

    Returns:
      ``(steps, sums)``: int64 ``[T]`` the common steps and field -> float64 ``[T]`` for every
      field of `ADDITIVE_FIELDS` and `SHARED_FIELDS`.

    Raises:
      ValueError: for no variable, or variables logged with different batch sizes at a step
        (they come from different calls: pick the variables of one call).
      KeyError: naming a variable and the additive sum it lacks.
    """
    if not series:
        raise ValueError("layer_sums() needs at least one variable's (steps, sums)")
    names = list(series)
    common: np.ndarray | None = None
    for name in names:
        st = np.asarray(series[name][0], dtype=np.int64)
        common = st if common is None else np.intersect1d(common, st)
    assert common is not None
    out: dict[str, np.ndarray] = {f: np.zeros(common.size) for f in ADDITIVE_FIELDS}
    shared: dict[str, np.ndarray] = {f: np.full(common.size, np.nan) for f in SHARED_FIELDS}
    first_n: np.ndarray | None = None
    for name in names:
        st, sums = series[name]
        idx = np.searchsorted(np.asarray(st, dtype=np.int64), common)
        for f in ADDITIVE_FIELDS:
            if f not in sums:
                raise KeyError(
                    f"variable {name!r} has no sum {f!r}; layer_sums() needs {ADDITIVE_FIELDS}"
                )
            out[f] = out[f] + np.asarray(sums[f], dtype=np.float64)[idx]
        for f in SHARED_FIELDS:
            if f in sums:
                v = np.asarray(sums[f], dtype=np.float64)[idx]
                shared[f] = np.where(np.isnan(shared[f]), v, shared[f])
        if "batch_size" in sums:
            n = np.asarray(sums["batch_size"], dtype=np.float64)[idx]
            if first_n is None:
                first_n = n
            else:
                bad = np.flatnonzero(np.isfinite(n) & np.isfinite(first_n) & (n != first_n))
                if bad.size:
                    k = int(bad[0])
                    raise ValueError(
                        f"variables {names[0]!r} and {name!r} were logged with batch sizes "
                        f"{first_n[k]:g} and {n[k]:g} at step {int(common[k])}: they come from "
                        "different calls; sum only the variables of one call (one group)"
                    )
    return common, {**out, **shared}
