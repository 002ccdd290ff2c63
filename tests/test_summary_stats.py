"""`summary._records` (the tensors and scalars a logged step writes) against a straightforward
numpy computation from the same moments, one variable at a time, with adversarial values.

The statistics of all variables are computed together in the graph (concatenated, padded to
blocks, one bincount for every histogram): these tests check that nothing of one variable
leaks into another, that the padding changes no count, and that the histogram equals numpy's
``searchsorted`` exactly.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from tb_gradmom import metadata
from tb_gradmom.analysis import stats
from tb_gradmom.core.moments import Moments
from tb_gradmom.writers import summary

EDGES = np.asarray(metadata.HIST_EDGES, np.float64)
NB = metadata.NUM_HIST_BUCKETS
LOSS, LR = 0.7, 0.05


def _on_edges(n, rng, size):
    """float64 (m1, m2) whose unbiased variance ``max(m2 - m1**2, 0) * n/(n-1)`` is exactly
    an edge of the histogram, or the float next to one."""
    factor = n / (n - 1.0)
    m2 = []
    for e in rng.choice(EDGES, size=size):
        v = e / factor
        for _ in range(8):  # the float whose product with factor rounds to the edge
            if v * factor < e:
                v = np.nextafter(v, np.inf)
            elif v * factor > e:
                v = np.nextafter(v, 0.0)
        m2.append(v if v * factor == e else e)
    m2 = np.asarray(m2)
    step = rng.integers(-1, 2, size=size)  # the edge, or the float below or above it
    m2 = np.where(step < 0, np.nextafter(m2, 0.0), np.where(step > 0, np.nextafter(m2, 1.0), m2))
    return np.zeros(size), m2


def _variables(n, rng):
    """[(name, shape, dtype, m1, m2)]: moments with the values that break naive versions."""
    out = []
    # float32, 1500 elements (not a multiple of the 1024-element blocks): ordinary values,
    # zeros, m2 == m1**2 (variance 0), m2 a float below m1**2 (negative, clipped to 0), a
    # gradient with no noise (m1 != 0, s2 = 0), tiny and huge (normal float32) values.
    m1 = rng.normal(size=1500).astype(np.float32) * 1e-2
    m2 = (m1.astype(np.float64) ** 2 + rng.exponential(size=1500) * 1e-4).astype(np.float32)
    m1[:20], m2[:20] = 0.0, 0.0
    sq = (m1[20:40].astype(np.float64) ** 2).astype(np.float32)
    m2[20:40] = sq
    m2[40:60] = np.nextafter(sq, np.float32(0.0))  # m2 - m1**2 < 0 from rounding
    m1[60:70], m2[60:70] = 1e-19, 3e-38
    m1[70:80], m2[70:80] = 1e17, 1e36
    out.append(("dense/kernel", (300, 5), np.float32, m1, m2))
    # float64 with variances on the histogram's edges and next to them
    e1, e2 = _on_edges(n, rng, 2048) if n > 1 else (np.zeros(2048), np.ones(2048))
    out.append(("edges/kernel", (32, 64), np.float64, e1, e2))
    # a scalar and a one-element bias
    out.append(("scale", (), np.float32, np.float32(0.5), np.float32(0.75)))
    out.append(("dense/bias", (1,), np.float32, np.float32([-2.0]), np.float32([4.5])))
    # NaN and Inf in one variable only; an exact multiple of the block
    m1 = rng.normal(size=1024)
    m2 = m1**2 + rng.exponential(size=1024)
    m1[3], m2[5], m2[7], m1[9] = np.nan, np.nan, np.inf, np.inf
    out.append(("bad/kernel", (1024,), np.float64, m1, m2))
    # float16 (a third dtype group)
    m1 = rng.normal(size=(4, 6)).astype(np.float16)
    m2 = (m1.astype(np.float32) ** 2 + 0.5).astype(np.float16)
    out.append(("half/kernel", (4, 6), np.float16, m1, m2))
    # a big float32 variable, stored block-pooled (max_elements 5000), statistics exact
    m1 = rng.normal(size=(130, 70)).astype(np.float32)
    m2 = (m1.astype(np.float64) ** 2 * rng.uniform(1.0, 3.0, size=(130, 70))).astype(np.float32)
    out.append(("big/kernel", (130, 70), np.float32, m1, m2))
    return [
        (
            name,
            shape,
            dtype,
            np.asarray(a, dtype).reshape(shape),
            np.asarray(b, dtype).reshape(shape),
        )
        for name, shape, dtype, a, b in out
    ]


def _reference_fields(m1, m2, n):
    """The STATS_FIELDS and the histogram of one variable, straight from the definitions."""
    m1 = np.asarray(m1, np.float64).ravel()
    m2 = np.asarray(m2, np.float64).ravel()
    factor = n / (n - 1.0) if n > 1 else math.nan
    with np.errstate(all="ignore"):
        sq = m1 * m1
        biased = np.maximum(m2 - sq, 0.0)  # NaN stays NaN
        gsnr = np.where(biased == 0.0, 0.0, sq / biased)  # divide_no_nan
        s2 = biased * factor
        fields = {
            "batch_size": float(n),
            "num_elements": float(m1.size),
            "sum_m2": sq.sum(),
            "sum_var": biased.sum() * factor,
            "sum_gsnr": gsnr.sum() * ((n - 1.0) / n if n > 1 else 0.0),
            # elements with a positive variance; none for a batch of one
            "gsnr_count": float((biased > 0).sum()) if n > 1 else 0.0,
            "sum_m2_raw": m2.sum(),
            "loss": LOSS,
            "learning_rate": LR,
        }
    finite = np.isfinite(s2)
    hist = np.bincount(np.searchsorted(EDGES, s2[finite], side="right"), minlength=NB)
    return fields, hist.astype(np.float64)


def _reference_moments(m, orders, content):
    """The stored moments: float32, block means of the 2-D view when pooled."""
    out = []
    for p in orders:
        a = np.asarray(m[p], np.float32)
        if content.pooled:
            rows, cols = metadata.to_2d_shape(content.shape)
            br, bc = content.block
            grid = a.astype(np.float64).reshape(rows, cols)
            a = np.array(
                [
                    [grid[i : i + br, j : j + bc].mean() for j in range(0, cols, bc)]
                    for i in range(0, rows, br)
                ]
            )
        out.append(a)
    return np.stack(out)


def _assert_float32_of(got, want, what):
    """``got`` (float32) is ``want`` (float64) rounded to float32, within one float32 ulp
    (the sums are added in another order); NaN and +-inf where ``want`` has them."""
    got = np.asarray(got, np.float32)
    with np.errstate(over="ignore"):
        want32 = np.asarray(want, np.float64).astype(np.float32)
    finite = np.isfinite(want32)
    np.testing.assert_array_equal(got[~finite], want32[~finite], err_msg=what)
    if finite.any():
        np.testing.assert_array_max_ulp(got[finite], want32[finite], maxulp=1)


@pytest.fixture(params=["xla", "ops"])
def xla(request, monkeypatch):
    """Both versions of the element-wise statistics: one XLA computation, TF ops one by one."""
    monkeypatch.setenv("TB_GRADMOM_XLA", "1" if request.param == "xla" else "0")
    assert summary._use_xla() == (request.param == "xla")
    return request.param


@pytest.mark.parametrize("chunk", ["one", "several", "groups"])
@pytest.mark.parametrize("n", [1, 2, 8])
def test_records_equal_numpy_per_variable(n, xla, chunk, monkeypatch):
    if chunk == "several":  # variables of one dtype in chunks of 2048 elements (or one bigger)
        monkeypatch.setattr(summary, "_CHUNK", 2048)
    if chunk == "groups":  # with XLA: variables of 3000 elements or more on their own
        monkeypatch.setattr(summary, "_GROUP", 3000)
    rng = np.random.default_rng(n)
    variables = _variables(n, rng)
    orders = (1, 2, 3)
    tags = [name for name, *_ in variables]
    contents = [
        summary._moments_content(
            SimpleNamespace(variable=tf.Variable(tf.zeros(shape, dtype)), name=name),
            name,
            orders,
            "MatMul",
            max_elements=5000,
        )
        for name, shape, dtype, _, _ in variables
    ]
    assert [c.pooled for c in contents] == [False] * 6 + [True]
    moms_np = [{1: m1, 2: m2, 3: m1 * 0.5} for _, _, _, m1, m2 in variables]
    backward = SimpleNamespace(plan=SimpleNamespace(loss=tf.constant(LOSS)), inv_scale=None)

    written = {}

    @tf.function
    def run():
        moms = [{p: tf.constant(m[p]) for p in orders} for m in moms_np]
        tensors, scalars = summary._records(
            backward,
            range(len(tags)),
            tags,
            contents,
            orders,
            tf.constant(LR, tf.float64),
            Moments(moms, tf.constant(n)),
        )
        written["tensors"] = [tag for tag, _, _ in tensors]
        written["scalars"] = [(tag, stag) for tag, stag, _ in scalars]
        return [t for _, t, _ in tensors], [v for _, _, v in scalars]

    got_tensors, got_scalars = run()
    # the tags, in the order they are written
    want_tags = [t for tag in tags for t in (tag, metadata.stats_tag(tag))]
    assert written["tensors"] == want_tags + [metadata.stats_tag("_model")]

    model_fields, model_hist = None, np.zeros(NB)
    per_tag = {}
    tokens = set()
    for i, (tag, content, m) in enumerate(zip(tags, contents, moms_np)):
        np.testing.assert_allclose(
            got_tensors[2 * i].numpy(),
            _reference_moments(m, orders, content),
            rtol=0 if not content.pooled else 1e-6,
            err_msg=tag,
        )
        fields, hist = _reference_fields(m[1], m[2], n)
        per_tag[tag] = fields
        stats_tensor = got_tensors[2 * i + 1].numpy()
        fields3 = metadata.WRITER_STATS_FIELDS
        assert stats_tensor.shape == (len(fields3) + metadata.NUM_HIST_BUCKETS,)
        head, counts = stats.split_stats_tensor(stats_tensor, fields3)
        np.testing.assert_array_equal(counts, hist, err_msg=tag)
        # format 3: the sum of |stored moments| beside them, and one writer's token
        stored = np.abs(got_tensors[2 * i].numpy().astype(np.float64)).sum()
        np.testing.assert_array_equal(head["moments_sum"], np.float32(stored), err_msg=tag)
        assert metadata.same_moments(head["moments_sum"], metadata.moments_sum(got_tensors[2 * i]))
        tokens.add(metadata.source_of(head))
        _assert_float32_of(
            [head[k] for k in metadata.STATS_FIELDS],
            [fields[k] for k in metadata.STATS_FIELDS],
            tag,
        )
        if model_fields is None:
            model_fields = dict(fields)
        else:
            for k in ("num_elements", "sum_m2", "sum_var", "sum_gsnr", "gsnr_count"):
                model_fields[k] += fields[k]
            model_fields["sum_m2_raw"] += fields["sum_m2_raw"]
        model_hist += hist
    per_tag["_model"] = model_fields
    head, counts = stats.split_stats_tensor(got_tensors[-1].numpy(), metadata.WRITER_STATS_FIELDS)
    np.testing.assert_array_equal(counts, model_hist)
    assert np.isnan(head["moments_sum"])
    tokens.add(metadata.source_of(head))
    assert len(tokens) == 1 and None not in tokens  # one writer: one source token
    _assert_float32_of(
        [head[k] for k in metadata.STATS_FIELDS],
        [model_fields[k] for k in metadata.STATS_FIELDS],
        "_model",
    )
    if n > 1:  # the adversarial values are there
        assert counts.sum() > 4000 and model_fields["gsnr_count"] < model_fields["num_elements"]
        assert math.isnan(head["sum_m2"]) and math.isnan(head["sum_var"])  # from bad/kernel
    else:
        assert counts.sum() == 0 and head["gsnr_count"] == 0

    # the scalars: every (tag, statistic), the values of `stats.derived` of the sums
    assert [stag for _, stag in written["scalars"]] == [
        f"gradmom/{tag}/{key}" for tag in tags + ["_model"] for key in summary.SCALARS
    ]
    for (tag, stag), value in zip(written["scalars"], got_scalars):
        with np.errstate(over="ignore"):
            want = float(np.float32(stats.derived(per_tag[tag])[stag.rsplit("/", 1)[1]]))
        got = float(np.float32(value))  # written as float32
        if not np.isfinite(want):
            assert got == want or (math.isnan(got) and math.isnan(want)), stag
        else:
            assert got == pytest.approx(want, rel=1e-5, abs=1e-30), stag


def test_histogram_of_any_float64_bit_pattern_equals_numpy():
    """Random bit patterns (every sign, exponent and NaN payload) and the edges: the bucket
    from the top bits and one compare is numpy's searchsorted; not finite values left out."""
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**64, size=300_000, dtype=np.uint64, endpoint=False)
    values = np.concatenate(
        [
            bits.view(np.float64),
            EDGES,
            np.nextafter(EDGES, 0.0),
            np.nextafter(EDGES, np.inf),
            -EDGES,
            [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, 2.0**-1022, np.finfo(np.float64).max],
        ]
    )
    finite = values[np.isfinite(values)]
    want = np.bincount(np.searchsorted(EDGES, finite, side="right"), minlength=NB)
    got = tf.function(summary._histogram)(tf.constant(values)).numpy()
    np.testing.assert_array_equal(got, want)
    assert got[0] > 100_000 and (got[1:-1] > 0).all()  # negatives in bucket 0, every bucket hit
    # the same bins from XLA (the statistics' element-wise part runs there)
    bins = tf.function(summary._bins, jit_compile=True)(tf.constant(values)).numpy()
    counts = np.bincount(bins, minlength=summary._BINS)
    hist = np.concatenate([[counts[0] + counts[1]], counts[2 : NB + 1]])
    np.testing.assert_array_equal(hist, want)


def test_variables_without_elements_and_one_dtype_group(xla):
    """Empty variables (no block at all) next to ordinary ones keep their rows."""
    rng = np.random.default_rng(0)
    shapes = [(0,), (3, 2), (0, 4), (5,)]
    moms = [
        {1: rng.normal(size=s).astype(np.float32), 2: rng.uniform(1, 2, size=s).astype(np.float32)}
        for s in shapes
    ]
    fields, hist = tf.function(
        lambda: summary._stats_fields(
            [{p: tf.constant(m[p]) for p in (1, 2)} for m in moms],
            tf.constant(4),
            tf.constant(LOSS, tf.float64),
            None,
        )
    )()
    for i, m in enumerate(moms):
        want, want_hist = _reference_fields(m[1], m[2], 4)
        np.testing.assert_array_equal(hist[i].numpy(), want_hist)
        for k in ("num_elements", "sum_m2", "sum_var", "sum_gsnr", "gsnr_count", "sum_m2_raw"):
            assert fields[k][i].numpy() == pytest.approx(want[k], rel=1e-12), (i, k)
    assert fields["num_elements"][-1].numpy() == 6 + 5
    assert math.isnan(fields["learning_rate"][0].numpy())
