"""The tab says which runs several summary writers wrote (issue 31), in real Chromium against a
real TensorBoard (the harness of test_frontend_browser.py; skipped without Chromium unless
``CI=true``)."""

from __future__ import annotations

import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_frontend_browser as fb  # noqa: E402
import test_writers_collide as wc  # noqa: E402
from test_frontend_browser import browser  # noqa: E402, F401 - a fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def writers_tensorboard(tmp_path_factory):
    """TensorBoard on runs ``one`` (one writer) and ``two`` (two writers, `wc._two_writers`)."""
    logdir = tmp_path_factory.mktemp("writers")
    wc._two_writers(str(logdir))  # noqa: SLF001
    gen = fb.tensorboard.__wrapped__(logdir, tmp_path_factory)
    yield next(gen)
    next(gen, None)


def test_a_run_of_several_writers_has_a_warning_line(browser, writers_tensorboard):  # noqa: F811
    p = fb.Page(browser, writers_tensorboard)
    try:
        # Under RustBoard (which keeps one record per step) the run's event files say which
        # steps have more, once the plugin has indexed them (in the background): wait for it.
        deadline = time.time() + 60
        while not fb.get_json(p.base, "tags")["writers"] and time.time() < deadline:
            time.sleep(0.5)
        pg = p.open_plugin()
        p.settle()
        want = fb.get_json(p.base, "tags")["writers"]
        assert list(want) == ["two"]
        box = pg.locator(".run-writers")
        assert box.is_visible()
        lines = box.locator("p.run-writers-line")
        assert lines.evaluate_all("ps => ps.map(p => p.dataset.run)") == ["two"]
        text = lines.first.inner_text()
        assert text == want["two"]["message"]
        assert "holds the records of 2 writers" in text and "its own log directory" in text
        assert box.get_attribute("role") == "note"
        fb.shot(pg, "writers_warning.png")
        assert not p.errors, p.errors
    finally:
        p.close()
