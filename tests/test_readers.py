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

from tb_gradmom.plugin import _cache

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_robustness as tr  # noqa: E402

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
