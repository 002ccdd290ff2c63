"""Several writers on one run (issue 31): every reader agrees and none mixes them.

Format 3 event files written as TensorFlow's writer makes them (`test_robustness._write`),
with the writer's source token and ``moments_sum`` in every stats record
(`metadata.WRITER_STATS_FIELDS`), written without TensorFlow. Two writers ``A``
and ``B`` log the same tag at the same steps into two files of one run; ``B``'s file is cut
before its last stats record (a writer killed): the Python loader then holds, for the last
step, ``B``'s moments last and ``A``'s statistics last. The real writers (`summary.moments`,
the Keras callback) are in test_writers_trace.py and the slow tests of test_readers.py.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from tb_gradmom import metadata
from tb_gradmom.analysis import data, reductions

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_robustness as tr  # noqa: E402
from test_plugin import make_app  # noqa: E402

P = "/data/plugin/gradmom/"
OK = tr.OK
STEPS = (0, 1, 2, 3)
TOKENS = {"A": 0x0A0000000001, "B": 0x0B0000000002}
V3_STATS = metadata._encode(  # noqa: SLF001
    metadata.StatsContent(fields=metadata.WRITER_STATS_FIELDS, variable=OK)
)
V3_MODEL = metadata._encode(  # noqa: SLF001
    metadata.StatsContent(fields=metadata.WRITER_STATS_FIELDS, variable=metadata.MODEL_TAG)
)


def _v3_stats(m, token: int, stored) -> np.ndarray:
    """The stats tensor of one step as format 3 writes it: the sums, the writer's token, the
    stored moments' sum of |values|, then the histogram counts."""
    v = tr.fx.stats_values(m[1], m[2], tr.fx.BATCH)
    k = len(metadata.STATS_FIELDS)
    half = 1 << metadata.SOURCE_HALF_BITS
    source = [token // half, token % half, metadata.moments_sum(stored)]
    return np.concatenate([v[:k], source, v[k:]]).astype(np.float32)


def _writer_events(who: str, steps=STEPS, stats_steps=None):
    """Writer ``who``'s events: moments and stats of `OK`, and its ``_model`` stats."""
    stats_steps = steps if stats_steps is None else stats_steps
    events = []
    for step in steps:
        m = tr.moments(who, OK, step)
        stored = tr._stored(m)
        events.append(tr._event(OK, step, tr._proto(stored), tr.GOOD_M))
        if step in stats_steps:
            sv = _v3_stats(m, TOKENS[who], stored)
            events.append(tr._event(metadata.stats_tag(OK), step, tr._proto(sv), V3_STATS))
            model = sv.copy()
            model[len(metadata.STATS_FIELDS) + 2] = np.nan  # no moments beside it
            events.append(
                tr._event(metadata.stats_tag(metadata.MODEL_TAG), step, tr._proto(model), V3_MODEL)
            )
    return events


def _two_writers(root: str) -> str:
    """Run ``two``: ``A``'s file, then ``B``'s without its last step's stats; run ``one``
    (``A`` alone) beside it."""
    tr._write(os.path.join(root, "one"), _writer_events("A"))
    path = os.path.join(root, "two")
    tr._write(path, _writer_events("A"), name="events.out.tfevents.1700000000.A")
    tr._write(
        path, _writer_events("B", stats_steps=STEPS[:-1]), name="events.out.tfevents.1700000001.B"
    )
    return root


def _expected_writer(step: int) -> str:
    """Whose record of ``step`` every reader shows: the latest stats record's writer."""
    return "A" if step == STEPS[-1] else "B"


def _json(client, route, **q):
    r = client.get(P + route, query_string=q)
    body = r.get_data(as_text=True)
    assert r.status_code == 200, (route, q, r.status_code, body[:500])
    return json.loads(body)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    return _two_writers(str(tmp_path_factory.mktemp("writers")))


@pytest.fixture(scope="module")
def loaded(logdir):
    with pytest.warns(data.DataWarning) as caught:
        runs = data.load(logdir)
    return runs, [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def client(logdir):
    c, plugin, _ = make_app(logdir)
    assert plugin._reader._mux is not None  # noqa: SLF001 - the Python loader
    return c


def test_data_load_pairs_each_step_with_its_writer_and_says_so_once_per_run(loaded):
    runs, messages = loaded
    recs = runs["two"][OK]
    assert [r.step for r in recs] == list(STEPS)
    for r in recs:
        want = tr._stored(tr.moments(_expected_writer(r.step), OK, r.step))
        np.testing.assert_array_equal(np.stack([r.moments[1], r.moments[2]]), want)
        assert metadata.source_of(r.stats) == TOKENS[_expected_writer(r.step)]
    per_run = [m for m in messages if "holds the records of" in m]
    assert per_run == [data.writers_of(_held("two")).describe("two")], messages
    assert (
        "run 'two' holds the records of 2 writers (sources 0a0000000001, 0b0000000002)"
        in (per_run[0])
    )
    assert "at 4 steps (0, 1, 2, 3)" in per_run[0] and "its own log directory" in per_run[0]
    assert not any("run 'one'" in m for m in messages), messages


def _held(run: str):
    """The (tag, step, token) of every record of ``run`` (None for moments), from the events
    written."""
    out = []
    for who in "AB" if run == "two" else "A":
        stats_steps = STEPS[:-1] if (run, who) == ("two", "B") else STEPS
        out.extend((OK, step, None) for step in STEPS)
        for step in stats_steps:
            for tag in (OK, metadata.MODEL_TAG):
                out.append((metadata.stats_tag(tag), step, TOKENS[who]))
    return out


def test_writers_of():
    assert data.writers_of(_held("one")) is None
    two = data.writers_of(_held("two"))
    assert two is not None and two.count == 2 and two.sources == tuple(TOKENS.values())
    assert two.steps == STEPS  # the last step: its moments twice, its statistics once
    # One record per step (RustBoard), alternating writers: counted, no step named.
    alternating = [("t/_stats", s, TOKENS["AB"[s % 2]]) for s in STEPS]
    assert data.writers_of(alternating) == data.Writers(tuple(TOKENS.values()), ())
    # Formats 1 and 2: no token; a step stored twice still flags the run.
    assert data.writers_of([("t/_stats", 0, None), ("t/_stats", 0, None)]) == data.Writers((), (0,))
    assert data.writers_of([("t/_stats", 0, None), ("t/_stats", 1, None)]) is None


def test_tags_lists_each_step_once_and_names_the_writers(client, loaded):
    runs, _ = loaded
    tags = _json(client, "tags")
    assert tags["runs"]["two"][OK]["steps"] == [r.step for r in runs["two"][OK]]
    assert tags["model"]["two"]["steps"] == list(STEPS)
    assert tags["writers"] == {
        "two": {
            "count": 2,
            "sources": ["0a0000000001", "0b0000000002"],
            "steps": list(STEPS),
            "message": data.writers_of(_held("two")).describe("two"),
        }
    }


def test_every_route_shows_each_step_with_its_own_writer(client, loaded):
    runs, _ = loaded
    recs = {r.step: r for r in runs["two"][OK]}
    for step in STEPS:
        d = _json(client, "heatmap", run="two", tag=OK, step=step, stat="mean")
        np.testing.assert_array_equal(
            np.asarray(d["values"], np.float32).ravel(), recs[step].moments[1].ravel()
        )
    series = _json(client, "series", run="two", tag=OK)
    assert series["steps"] == list(STEPS)
    np.testing.assert_allclose(
        series["values"]["total_variance"], [recs[s].stats["sum_var"] for s in STEPS], rtol=1e-6
    )


def test_all_steps_histogram_never_bins_another_writers_moments(client, loaded):
    """The all-steps histogram read one record per step (the latest: ``B``'s moments at the
    last step) and binned it against ``A``'s statistics; it now bins the record that step's
    statistics were logged with, as `data.load` and the one-step routes do."""
    runs, _ = loaded
    recs = {r.step: r for r in runs["two"][OK]}
    hist = _json(client, "histogram", run="two", tag=OK, step="all", stat="mean", bins=16)
    assert [s["step"] for s in hist["series"]] == list(STEPS)
    assert hist["unpaired_steps"] == []

    def m1(who, step):
        return np.float32(tr.moments(who, OK, step)[1]).astype(np.float64)

    def counts(last):  # the binning is tested elsewhere; here: whose moments are binned
        grids = [m1(_expected_writer(s), s) for s in STEPS[:-1]] + [m1(last, STEPS[-1])]
        return [c.tolist() for c in reductions.histograms_over_steps(grids, bins=16)[1]]

    assert [s["counts"] for s in hist["series"]] == counts("A")
    for s in STEPS:
        np.testing.assert_array_equal(m1(_expected_writer(s), s), recs[s].moments[1])
    assert counts("A") != counts("B")  # the test tells the two apart


def test_a_step_no_record_of_which_pairs_is_left_out_everywhere(tmp_path):
    """``B`` logged the last step's statistics, but its moments record of that step is lost:
    the only moments record is ``A``'s. `data.load` skips the step, the one-step routes answer
    404 and the all-steps histogram leaves it out and names it; none shows ``A``'s moments
    with ``B``'s statistics."""
    path = os.path.join(str(tmp_path), "r")
    tr._write(path, _writer_events("A"), name="events.out.tfevents.1700000000.A")
    events = [
        e for e in _writer_events("B") if not (e.step == STEPS[-1] and e.summary.value[0].tag == OK)
    ]
    tr._write(path, events, name="events.out.tfevents.1700000001.B")
    with pytest.warns(data.DataWarning, match="step 3: its statistics .* the step is skipped"):
        recs = data.load(str(tmp_path))["r"][OK]
    assert [r.step for r in recs] == [0, 1, 2]
    client, _, _ = make_app(str(tmp_path))
    hist = _json(client, "histogram", run="r", tag=OK, step="all", stat="mean")
    assert [s["step"] for s in hist["series"]] == [0, 1, 2]
    assert hist["unpaired_steps"] == [3]
    r = client.get(P + "heatmap", query_string={"run": "r", "tag": OK, "step": 3})
    assert r.status_code == 404 and "two writers or processes" in r.get_data(as_text=True)


def test_export_prints_the_writers_and_writes_each_step_with_its_own(logdir, tmp_path, capsys):
    from tb_gradmom import cli

    out = str(tmp_path / "out")
    args = ["export", "--logdir", logdir, "--out", out, "--format", "csv", "--quiet"]
    curves = ["--run", "two", "--tag", "_model", "--plot", "curves", "--overwrite"]
    assert cli.main([*args, *curves]) == 0
    err = capsys.readouterr().err
    model = metadata.stats_tag(metadata.MODEL_TAG)  # the tags read: the model's statistics
    want = data.writers_of([h for h in _held("two") if h[0] == model]).describe("two")
    assert f"tb-gradmom export: warning: {want}" in err, err
    # The records read decide: at the last step, the moments are stored twice, the
    # statistics once (A's), and A's moments are exported.
    out = str(tmp_path / "step")
    args = ["export", "--logdir", logdir, "--out", out, "--format", "csv", "--quiet"]
    assert cli.main([*args, "--run", "two", "--tag", OK, "--stat", "mean", "--step", "3"]) == 0
    err = capsys.readouterr().err
    assert (
        "run 'two' holds the records of 2 writers (sources seen: 0a0000000001), at 1 step (3)"
        in err
    ), err
    (name,) = os.listdir(out)
    with open(os.path.join(out, name), encoding="utf-8", newline="") as f:
        rows = list(tr.csv_rows(f.read()))
    assert rows[0] == ["row", "col", "mean"]
    got = np.zeros(tr.SHAPE)
    for r, c, v in rows[1:]:
        got[int(r), int(c)] = float(v)
    np.testing.assert_array_equal(got, np.float32(tr.moments("A", OK, 3)[1]))
