"""The readers on what live training, several writers and hostile log directories produce.

Issues 30 and 31, the readers' side: the plugin (through TensorBoard's own app and Python
loader, and RustBoard in the slow tests), `data.load` and ``tb-gradmom export``. Every log
directory is made of real event files: written with TensorBoard's protos and TFRecord framing
as TensorFlow's writer makes them (`test_robustness._write`), so this test process never
imports TensorFlow.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import numpy as np

from tb_gradmom import metadata
from tb_gradmom.plugin import _cache

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_robustness as tr  # noqa: E402
from test_plugin import make_app  # noqa: E402

P = "/data/plugin/gradmom/"
OK = tr.OK


class _Logs(logging.Handler):
    """The plugin's warnings while a block runs."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("tb_gradmom").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("tb_gradmom").removeHandler(self)


def _get(client, route, **q):
    r = client.get(P + route, query_string=q)
    return r.status_code, r.get_data(as_text=True)


def _json(client, route, **q):
    status, body = _get(client, route, **q)
    assert status == 200, (route, q, status, body[:500])
    return json.loads(body)


def _good_run(root, run, steps=tr.STEPS):
    tr._write(
        os.path.join(root, run),
        [*tr.variable_events(run, OK, steps=steps), *tr.model_events(run, [OK], steps=steps)],
    )


def _variance(run, tag, step):
    m = tr.moments(run, tag, step)
    m1, m2 = (np.asarray(a, dtype=np.float32).astype(np.float64) for a in (m[1], m[2]))
    return tr.fx.BATCH / (tr.fx.BATCH - 1) * (m2 - m1**2)


# ------------------------------------------------------------------- the plugin's cache


def test_cache_clear_empties_it():
    """`ByteLRU.clear` (the benchmark's cold requests; it was removed and the benchmark broke)."""
    c = _cache.ByteLRU(1 << 20)
    c.put("a", np.zeros(100), group="g")
    c.put("b", b"x" * 100)
    assert len(c) == 2 and c.size_bytes > 0
    c.clear()
    assert len(c) == 0 and c.size_bytes == 0 and c.get("a") is None
    c.put("a2", np.zeros(10), group="g")  # the group forgot "a": nothing to evict
    assert c.get("a2") is not None


# ------------------------------------------------- isolation: a tag TensorBoard cannot list


def _no_tensor_event(tag, content, step=0):
    """A summary value with the plugin's metadata and no tensor (a crafted or foreign event)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    md = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=metadata.PLUGIN_NAME, content=content
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )
    value = summary_pb2.Summary.Value(tag=tag, metadata=md)
    return event_pb2.Event(
        wall_time=1.7e9 + step, step=step, summary=summary_pb2.Summary(value=[value])
    )


ROUTES = [
    ("heatmap", {"tag": OK}),
    ("heatmap", {"tag": OK, "step": 1, "stat": "snr"}),
    ("histogram", {"tag": OK, "step": "all"}),
    ("histogram", {"tag": OK, "step": 1}),
    ("series", {}),
    ("series", {"tag": OK}),
    ("summary", {}),
    ("export", {"tag": OK, "what": "moments", "format": "json"}),
    ("export", {"tag": OK, "what": "heatmap", "format": "csv"}),
]


def test_a_tag_tensorboard_cannot_list_affects_no_other(tmp_path):
    """A value with metadata and no tensor made TensorBoard's Python loader raise `KeyError`
    from `list_tensors`, and /tags answered 404 for every run (issue 30). Now only that tag is
    left out, on every route, and /tags says which and why."""
    root = str(tmp_path)
    _good_run(root, "good")
    bad_m = "notensor/kernel"
    bad_s = "lonely/kernel/_stats"
    tr._write(
        os.path.join(root, "bad"),
        [
            *tr.variable_events("bad", OK),
            *tr.model_events("bad", [OK]),
            _no_tensor_event(bad_m, tr.GOOD_M),
            _no_tensor_event(bad_s, tr.GOOD_S),
        ],
    )
    with _Logs() as logs:
        client, _, _ = make_app(root)
        tags = _json(client, "tags")
        for run in ("good", "bad"):
            assert list(tags["runs"][run]) == [OK], run
            assert tags["runs"][run][OK]["steps"] == list(tr.STEPS)
            assert tags["model"][run]["steps"] == list(tr.STEPS)
            for route, q in ROUTES:
                status, body = _get(client, route, run=run, **q)
                assert status == 200, (run, route, q, status, body[:300])
            d = _json(client, "heatmap", run=run, tag=OK)
            assert d["step"] == 2
            np.testing.assert_allclose(
                np.asarray(d["values"], dtype=np.float64).reshape(tr.SHAPE),
                _variance(run, OK, 2),
                rtol=1e-5,
            )
    assert set(tags["skipped"]) == {"bad"}
    assert set(tags["skipped"]["bad"]) == {bad_m, bad_s}
    assert all("KeyError" in r for r in tags["skipped"]["bad"].values())
    for tag in (bad_m, bad_s):
        assert any(
            f"run 'bad' tag {tag!r} step (all)" in m and "KeyError" in m for m in logs.messages
        )
    status, body = _get(client, "heatmap", run="bad", tag=bad_m)
    assert status == 404 and "no moments tag" in body
