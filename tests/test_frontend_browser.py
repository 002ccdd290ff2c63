"""End-to-end tests of the Grad Moments tab in a real browser against a real TensorBoard.

Chromium is Debian's (`/usr/bin/chromium`, never a downloaded browser), driven by Playwright
for Python, headless. TensorBoard runs as a subprocess on a logdir written by the demo
(``tb-gradmom demo --quick``) when it is available, else by `_write_fixture_logdir` below with
real ``tf.summary.write`` events; either way a copy of one run is added under the name
``<img src=x onerror=alert(1)>``. Every number the page shows or exports is checked against the
backend's JSON; colours are checked against the colour map lookup tables in
``tb_gradmom_frontend/colormaps.js`` (themselves checked against matplotlib when it is there).

Screenshots go to ``artifacts/screenshots/`` (CI keeps that folder). Without Chromium these
tests skip, unless ``CI=true``: then they fail.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import numpy as np
import pytest

from tb_gradmom.analysis.stats import STATISTICS

ROOT = Path(__file__).resolve().parents[1]
FRONTEND = ROOT / "tb_gradmom_frontend"
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
XSS_RUN = "<img src=x onerror=alert(1)>"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------------------- helpers


def colormap_lut(name: str) -> np.ndarray:
    """The [256, 3] uint8 lookup table of a colour map, read from colormaps.js."""
    text = (FRONTEND / "colormaps.js").read_text()
    m = re.search(rf'\b{name}: "([0-9a-f]+)"', text)
    assert m, f"colour map {name} not in colormaps.js"
    return np.frombuffer(bytes.fromhex(m.group(1)), dtype=np.uint8).reshape(256, 3)


def expected_colour(value: float, lo: float, hi: float, lut: np.ndarray, scale="linear"):
    """The colour core.js gives `value` on a [lo, hi] scale: LUT[floor(t * 256)], clamped."""
    if scale == "log":
        value, lo, hi = math.log10(value), math.log10(lo), math.log10(hi)
    t = (value - lo) / (hi - lo) if hi > lo else 0.5
    return tuple(int(c) for c in lut[max(0, min(255, math.floor(t * 256)))])


def decode_png(data: bytes) -> np.ndarray:
    """A PNG (8-bit RGB/RGBA, not interlaced, as Chromium writes) as a [h, w, channels] array."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in PNG chunk {kind!r}"
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, ctype, _, _, interlace = header
    assert depth == 8 and ctype in (2, 6) and interlace == 0, header
    ch = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * ch
    out = np.zeros((height, stride), dtype=np.int32)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = np.frombuffer(raw, dtype=np.uint8, count=stride, offset=y * (stride + 1) + 1).astype(
            np.int32
        )
        cur = np.zeros(stride, dtype=np.int32)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) & 255
        else:
            for x in range(stride):
                a = cur[x - ch] if x >= ch else 0
                b = prev[x]
                c = prev[x - ch] if x >= ch else 0
                if f == 1:
                    p = a
                elif f == 3:
                    p = (a + b) >> 1
                else:  # Paeth
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    p = a if pa <= pb and pa <= pc else b if pb <= pc else c
                cur[x] = (line[x] + p) & 255
        out[y] = cur
        prev = cur
    return out.reshape(height, width, ch).astype(np.uint8)


def js_value(v):
    """A backend JSON number as a float (NaN as null, +-Inf as strings)."""
    if v is None:
        return math.nan
    if isinstance(v, str):
        return float(v.replace("Infinity", "inf"))
    return float(v)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_run(run_dir: Path, seed: int, steps=(0, 10, 20, 30, 40), n: int = 32) -> None:
    """One run of Grad Moments events: three variables with moments and stats, and the model."""
    import tensorflow as tf

    from tb_gradmom import metadata
    from tb_gradmom.analysis import stats

    rng = np.random.default_rng(seed)
    # tag: (shape, op, max_elements): "wide/kernel" is stored block-pooled, as the writer does
    # for a variable bigger than max_elements.
    variables = {
        "dense/kernel": ((6, 4), "MatMul", None),
        "dense/bias": ((4,), "BiasAdd", None),
        "conv2d/kernel": ((3, 3, 2, 5), "Conv2D", None),
        "big/kernel": ((96, 64), "MatMul", None),
        "wide/kernel": ((40, 600), "MatMul", 2048),
        # Almost no mean gradient: |G|^2 = |m|^2 - tr(Sigma)/n < 0, a noise-dominated
        # (negative) noise scale at every step, smoothed or not.
        "noise/bias": ((3,), "BiasAdd", None),
    }
    writer = tf.summary.create_file_writer(str(run_dir))
    with writer.as_default():
        for k, step in enumerate(steps):
            model = None
            for tag, (shape, op, max_elements) in variables.items():
                m1 = rng.normal(0.0, 0.1, shape) / (1 + k)
                if tag == "noise/bias":
                    m1 = m1 * 1e-6
                var = 10.0 ** rng.uniform(-6, -2, shape)
                m2 = m1**2 + var * (n - 1) / n
                m1, m2 = np.stack([m1, m2]).astype(np.float32).astype(np.float64)
                block = (1, 1)
                stored = np.stack([m1, m2])
                if max_elements is not None:
                    block = metadata.pool_block(shape, max_elements)
                    r, c = metadata.to_2d_shape(shape)
                    br, bc = block
                    grid = stored.reshape(2, r, c)
                    pr, pc = -(-r // br), -(-c // bc)
                    pad = np.full((2, pr * br, pc * bc), np.nan)
                    pad[:, :r, :c] = grid
                    stored = np.nanmean(pad.reshape(2, pr, br, pc, bc), axis=(2, 4))
                content = metadata.MomentsContent(
                    orders=(1, 2), shape=shape, stored_shape=stored.shape[1:],
                    pooled=block != (1, 1), block=block, op=op,
                    layer=tag.split("/")[0], variable=tag,
                )  # fmt: skip
                tf.summary.write(
                    tag,
                    stored.astype(np.float32),
                    step=step,
                    metadata=metadata.create_summary_metadata(content),
                )
                sums = stats.sums_from_moments(m1, m2, n)
                s2 = (m2 - m1**2) * n / (n - 1)
                hist = stats.variance_histogram(np.maximum(s2, 0))
                vec = np.array([sums[f] for f in metadata.STATS_FIELDS] + list(hist))
                tf.summary.write(
                    metadata.stats_tag(tag),
                    vec.astype(np.float32),
                    step=step,
                    metadata=metadata.create_summary_metadata(metadata.StatsContent(variable=tag)),
                )
                model = vec if model is None else model + vec
            fields = list(metadata.STATS_FIELDS)
            model[fields.index("batch_size")] = n
            model[fields.index("loss")] = math.nan
            model[fields.index("learning_rate")] = math.nan
            tf.summary.write(
                metadata.stats_tag(metadata.MODEL_TAG),
                model.astype(np.float32),
                step=step,
                metadata=metadata.create_summary_metadata(
                    metadata.StatsContent(variable=metadata.MODEL_TAG)
                ),
            )
    writer.close()


def _write_fixture_logdir(logdir: Path) -> None:
    _write_run(logdir / "alpha", seed=1)
    _write_run(logdir / "beta", seed=2, steps=(0, 10, 20, 30, 40, 50))


def _demo_available() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("tb_gradmom.demo") is not None
    except ImportError:
        return False


# --------------------------------------------------------------------------------- fixtures


FIXTURE_RUNS = ("alpha", "beta", XSS_RUN, "gamma")


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    """The demo's runs under demo/ (when the demo exists), two runs with known variables
    (alpha, beta) for the detailed checks, and a copy of one run named XSS_RUN."""
    d = tmp_path_factory.mktemp("gradmom_logdir")
    if _demo_available():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tb_gradmom.cli",
                "demo",
                "--quick",
                "--logdir",
                str(d / "demo"),
            ],
            check=True,
            cwd=ROOT,
            timeout=900,
        )
    _write_fixture_logdir(d)
    runs = sorted({p.parent for p in d.rglob("events.out.tfevents.*")})
    source = next((r for r in runs if r.parent.name == "demo"), d / "alpha")
    xss = d / XSS_RUN
    xss.mkdir()
    for f in source.glob("events.out.tfevents.*"):
        shutil.copy(f, xss / f.name)
    return d


def _tensorboard_command(logdir: Path, port: int) -> list[str]:
    args = ["--logdir", str(logdir), "--port", str(port), "--host", "127.0.0.1"]
    from importlib.metadata import entry_points

    if any(ep.name == "gradmom" for ep in entry_points(group="tensorboard_plugins")):
        return [sys.executable, "-m", "tensorboard.main", *args]
    # Not pip-installed (a source checkout): the same TensorBoard main, plugin added explicitly.
    launcher = (
        "import sys\n"
        "from tensorboard import default, program\n"
        "from tb_gradmom.plugin.loader import GradMomentsPluginLoader\n"
        "tb = program.TensorBoard(plugins=default.get_plugins() + [GradMomentsPluginLoader()])\n"
        "tb.configure(argv=[None] + sys.argv[1:])\n"
        "sys.exit(tb.main())\n"
    )
    return [sys.executable, "-c", launcher, *args]


@pytest.fixture(scope="module")
def tensorboard(logdir, tmp_path_factory):
    port = free_port()
    log = (tmp_path_factory.mktemp("tb") / "tensorboard.log").open("w")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        _tensorboard_command(logdir, port), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, f"tensorboard exited: see {log.name}"
            try:
                with urllib.request.urlopen(base + "/data/plugins_listing", timeout=5) as r:
                    listing = json.load(r)
                with urllib.request.urlopen(base + "/data/plugin/gradmom/tags", timeout=30) as r:
                    tags = json.load(r)
                if listing.get("gradmom", {}).get("enabled") and len(tags["runs"]) >= 2:
                    break
            except (OSError, ValueError):
                pass
            assert time.time() < deadline, f"tensorboard did not serve gradmom: see {log.name}"
            time.sleep(1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def get_json(base: str, route: str, **params):
    url = f"{base}/data/plugin/gradmom/{route}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{CHROMIUM} is missing; .ci/run installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is missing (install Debian's chromium package)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Page:
    """A browser page on the plugin frame URL, recording console errors and dialogs."""

    def __init__(self, browser, base, color_scheme="light"):
        self.context = browser.new_context(
            viewport={"width": 1400, "height": 1000},
            accept_downloads=True,
            color_scheme=color_scheme,
            device_scale_factor=1,
        )
        self.page = self.context.new_page()
        self.base = base
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

        def on_dialog(d):
            self.dialogs.append(d.message)
            d.dismiss()

        self.page.on("dialog", on_dialog)

    def _console(self, message):
        # Opening the plugin frame's URL as a top-level page makes Chromium ask for
        # /favicon.ico, which TensorBoard does not serve; inside TensorBoard it does not.
        if message.type == "error" and not message.location.get("url", "").endswith("/favicon.ico"):
            self.errors.append(f"{message.text} ({message.location.get('url')})")

    def open_plugin(self):
        self.page.goto(self.base + "/data/plugin_entry.html?name=gradmom")
        self.wait_ready()
        return self.page

    def wait_ready(self, frame=None):
        target = frame or self.page
        target.wait_for_function(
            "() => window.gradmom && window.gradmom.pending !== undefined", timeout=60000
        )
        target.evaluate("() => window.gradmom.pending")
        target.wait_for_selector(".heatmap-canvas", timeout=60000)

    def settle(self):
        self.page.evaluate("() => window.gradmom.pending")
        self.page.wait_for_timeout(150)

    def close(self):
        self.context.close()


@pytest.fixture
def page(browser, tensorboard):
    p = Page(browser, tensorboard)
    yield p
    p.close()
    assert not p.errors, f"console errors: {p.errors}"
    assert not p.dialogs, f"a dialog fired: {p.dialogs}"


def shot(page, name: str) -> Path:
    """A full-page screenshot, scrolled to the top (sticky bars where they belong)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / name
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(path), full_page=True)
    return path


def choose(page, selector: str, value: str, p: Page):
    page.select_option(selector, value)
    p.settle()


def open_variable(p: Page, run: str, tag: str, stat: str = "variance"):
    page = p.page
    choose(page, "select.run-select", run, p)
    page.click(f'.tag-list button[data-tag="{tag}"]')
    p.settle()
    choose(page, "select.stat-select", stat, p)
    return page


def download(page, button):
    with page.expect_download() as info:
        button.click()
    d = info.value
    return d.suggested_filename, Path(d.path()).read_bytes()


def get_binary(base: str, route: str, **params):
    """A payload as the tab gets it (``format=binary``, docs/http_api.md "Binary responses"),
    its arrays as lists of floats."""
    url = f"{base}/data/plugin/gradmom/{route}?{urllib.parse.urlencode(params)}&format=binary"
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
    n = int.from_bytes(body[4:8], "little")
    head = json.loads(body[8 : 8 + n])
    arrays = []
    for spec in head.pop("$arrays"):
        dtype = {"float32": "<f4", "float64": "<f8", "uint32": "<u4"}[spec["dtype"]]
        a = np.frombuffer(body, dtype, int(np.prod(spec["shape"])), 8 + n + spec["offset"])
        arrays.append([float(v) for v in a.ravel()])

    def put(v):
        if isinstance(v, dict):
            return (
                arrays[v["$array"]] if set(v) == {"$array"} else {k: put(x) for k, x in v.items()}
            )
        return [put(x) for x in v] if isinstance(v, list) else v

    return put(head)


def heatmap_json(p: Page, run: str, tag: str, stat: str, step=None):
    """The heatmap as the tab gets it: the JSON payload with the values of the binary form
    the tab asks for (float32 on the wire, docs/http_api.md "Binary responses")."""
    if step is None:
        tags = get_json(p.base, "tags")
        step = max(tags["runs"][run][tag]["steps"])
    q = {"run": run, "tag": tag, "step": step, "stat": stat, "max_rows": 1024, "max_cols": 1024}
    d = get_json(p.base, "heatmap", **q)
    d["values"] = get_binary(p.base, "heatmap", **q)["values"]
    assert len(d["values"]) == d["rows"] * d["cols"]
    return d


def conv_index(row: int, col: int, shape) -> list[int]:
    """The element of a conv kernel [kh, kw, cin, cout] at (row, col) of its 2-D view."""
    kh, kw, cin, cout = shape
    return [row // (kw * cin), (row // cin) % kw, row % cin, col]


def shown_view(pg) -> tuple[str, str]:
    """The heatmap's colour map and scale as the tab's controls show them."""
    return (
        pg.locator("select.colormap-select").input_value(),
        pg.locator("select.scale-select").input_value(),
    )


def canvas_box(pg):
    """The heatmap canvas scrolled into the viewport (the curves come first), and its box."""
    canvas = pg.locator(".heatmap-canvas")
    canvas.scroll_into_view_if_needed()
    return canvas, canvas.bounding_box()


def check_cell_colours(
    canvas_png: bytes, data: dict, colormap: str, scale: str, bars=False, domain=None
):
    """Every cell's centre pixel in a canvas screenshot has the colour map colour of its value
    (with ``bars``, a 1-D variable drawn as bars: the pixel just above each bar's foot), on the
    colour scale ``domain`` (by default the values' own finite extent)."""
    img = decode_png(canvas_png)
    rows, cols = data["rows"], data["cols"]
    values = np.array([js_value(v) for v in data["values"]]).reshape(rows, cols)
    finite = values[np.isfinite(values) & ((values > 0) if scale == "log" else True)]
    lo, hi = domain if domain is not None else (float(finite.min()), float(finite.max()))
    lut = colormap_lut(colormap)
    h, w = img.shape[:2]
    checked = 0
    for i in range(rows):
        for j in range(cols):
            v = float(values[i, j])
            if not math.isfinite(v) or (scale == "log" and v <= 0):
                continue
            y, x = int((i + 0.5) * h / rows), int((j + 0.5) * w / cols)
            if bars:
                y = h - 3
            got = tuple(int(c) for c in img[y, x, :3])
            want = expected_colour(v, lo, hi, lut, scale)
            assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1, (
                f"cell ({i}, {j}) value {v}: pixel {got}, expected {want}"
            )
            checked += 1
    assert checked == rows * cols or scale == "log"
    return checked


# ------------------------------------------------------------------------------------ tests


def test_colormap_luts_match_matplotlib():
    mpl = pytest.importorskip("matplotlib")
    for name in ["viridis", "magma", "inferno", "plasma", "cividis"]:
        ref = np.round(np.asarray(mpl.colormaps[name].colors)[:, :3] * 255).astype(np.uint8)
        np.testing.assert_array_equal(colormap_lut(name), ref, err_msg=name)
    np.testing.assert_array_equal(colormap_lut("gray")[:, 0], np.arange(256))


def test_tab_appears_in_tensorboard(browser, tensorboard):
    p = Page(browser, tensorboard)
    try:
        page = p.page
        page.goto(tensorboard + "/#gradmom")
        page.get_by_text("Grad Moments").first.wait_for(timeout=60000)
        frame_el = page.wait_for_selector(
            'iframe[src*="plugin_entry.html?name=gradmom"]', timeout=60000
        )
        frame = frame_el.content_frame()
        p.wait_ready(frame)
        frame.wait_for_selector(".summary tbody tr", timeout=30000)
        assert frame.evaluate("() => document.documentElement.dataset.theme") == "light"
        shot(page, "tensorboard_tab.png")
        assert not p.errors, p.errors
    finally:
        p.close()


def test_tab_follows_tensorboard_dark_mode(browser, tensorboard):
    p = Page(browser, tensorboard, color_scheme="dark")
    try:
        page = p.page
        page.goto(tensorboard + "/#gradmom")
        frame = page.wait_for_selector(
            'iframe[src*="plugin_entry.html?name=gradmom"]', timeout=60000
        ).content_frame()
        p.wait_ready(frame)
        assert page.evaluate("() => document.body.classList.contains('dark-mode')")
        assert frame.evaluate("() => document.documentElement.dataset.theme") == "dark"
        bg = frame.evaluate("() => getComputedStyle(document.body).backgroundColor")
        assert bg == "rgb(48, 48, 48)", bg  # TensorBoard's dark background #303030
        frame.wait_for_selector(".summary tbody tr", timeout=30000)
        shot(page, "tensorboard_tab_dark.png")
        # Switching TensorBoard to light mode switches the tab too.
        page.evaluate("() => document.body.classList.remove('dark-mode')")
        frame.wait_for_function("() => document.documentElement.dataset.theme === 'light'")
        assert not p.errors, p.errors
    finally:
        p.close()


def test_heatmap_pixels_have_the_colour_of_their_values(page):
    pg = open_variable_page(page, "alpha", "dense/kernel", "variance")
    data = heatmap_json(page, "alpha", "dense/kernel", "variance")
    assert (data["rows"], data["cols"]) == (6, 4)
    canvas = pg.locator(".heatmap-canvas")
    assert int(canvas.get_attribute("data-rows")) == 6
    # Variances open on a log colour scale (issue 13): every cell has its log-scale colour.
    assert shown_view(pg) == ("viridis", "log")
    check_cell_colours(canvas.screenshot(), data, "viridis", "log")
    shot(pg, "heatmap_dense_kernel.png")
    choose(pg, "select.scale-select", "linear", page)
    check_cell_colours(canvas.screenshot(), data, "viridis", "linear")

    # A conv kernel, another colour map, a log scale: every cell again.
    choose(pg, "select.colormap-select", "magma", page)
    choose(pg, "select.scale-select", "log", page)
    pg.click('.tag-list button[data-tag="conv2d/kernel"]')
    page.settle()
    conv = heatmap_json(page, "alpha", "conv2d/kernel", "variance")
    assert conv["grid_shape"] == [18, 5]
    check_cell_colours(canvas.screenshot(), conv, "magma", "log")
    shot(pg, "heatmap_conv_magma_log.png")


def open_variable_page(p: Page, run, tag, stat):
    p.open_plugin()
    return open_variable(p, run, tag, stat)


def test_heatmap_tooltip_shows_index_and_value(page):
    pg = open_variable_page(page, "alpha", "conv2d/kernel", "variance")
    data = heatmap_json(page, "alpha", "conv2d/kernel", "variance")
    mean = heatmap_json(page, "alpha", "conv2d/kernel", "mean")
    _, box = canvas_box(pg)
    rows, cols = data["rows"], data["cols"]
    for row, col in [(0, 0), (13, 2), (17, 4)]:
        pg.mouse.move(
            box["x"] + (col + 0.5) * box["width"] / cols,
            box["y"] + (row + 0.5) * box["height"] / rows,
        )
        tip = pg.locator(".heatmap-figure .tooltip")
        tip.wait_for(state="visible")
        pairs = tip.locator(".tip-row").evaluate_all(
            "rows => rows.map(r => [r.querySelector('.tip-key').textContent,"
            " r.querySelector('.tip-value').textContent])"
        )
        text = str(pairs)
        numbers = dict(pairs)
        index = conv_index(row, col, data["shape"])
        assert numbers["index"] == f"[{', '.join(map(str, index))}]", text
        want = js_value(data["values"][row * cols + col])
        assert math.isclose(float(numbers["variance"]), want, rel_tol=1e-5), (text, want)
        want_mean = js_value(mean["values"][row * cols + col])
        assert math.isclose(float(numbers["mean"]), want_mean, rel_tol=1e-5, abs_tol=1e-12), text
    shot(pg, "heatmap_tooltip.png")
    pg.mouse.move(0, 0)


def test_heatmap_exports_png_svg_csv_json(page):
    pg = open_variable_page(page, "alpha", "conv2d/kernel", "variance")
    data = heatmap_json(page, "alpha", "conv2d/kernel", "variance")
    card = pg.locator("#heatmap-card")
    width = float(pg.locator("#heatmap-card svg").first.get_attribute("width"))
    height = float(pg.locator("#heatmap-card svg").first.get_attribute("height"))

    name, png = download(pg, card.get_by_role("button", name="PNG"))
    assert name.endswith(".png") and "conv2d_kernel" in name
    img = decode_png(png)
    assert img.shape[:2] == (round(2 * height), round(2 * width))
    (SHOTS / "export_heatmap.png").parent.mkdir(parents=True, exist_ok=True)
    (SHOTS / "export_heatmap.png").write_bytes(png)
    # The cells in the PNG have their colours: crop the plot area from the figure's layout.
    svg_name, svg = download(pg, card.get_by_role("button", name="SVG"))
    assert svg_name.endswith(".svg")
    tree = ET.fromstring(svg)
    ns = {"s": "http://www.w3.org/2000/svg"}
    texts = [t.text or "" for t in tree.iter("{http://www.w3.org/2000/svg}text")]
    assert "variance (unbiased, n/(n−1)) of conv2d/kernel" in texts
    assert any(t.startswith("run alpha · step") for t in texts)
    assert any("column" in t for t in texts) and any("row" in t for t in texts)
    images = tree.findall(".//s:image", ns)
    assert len(images) == 2  # the cells and the colour bar
    cells = next(i for i in images if float(i.get("width")) > 20)
    x0, y0 = float(cells.get("x")), float(cells.get("y"))
    w, h = float(cells.get("width")), float(cells.get("height"))
    plot = img[round(2 * y0) : round(2 * (y0 + h)), round(2 * x0) : round(2 * (x0 + w))]
    buf = io.BytesIO()
    _write_png(buf, plot)
    check_cell_colours(buf.getvalue(), data, *shown_view(pg))
    ticks = [t for t in texts if re.fullmatch(r"[0-9.e-]+", t or "")]
    assert ticks, texts

    csv_name, body = download(pg, card.get_by_role("button", name="CSV"))
    assert csv_name.endswith(".csv")
    rows = list(csv.reader(io.StringIO(body.decode())))
    assert rows[0][:4] == ["row", "col", "element", "variance"]
    assert len(rows) - 1 == data["rows"] * data["cols"]
    for r in rows[1:]:
        i, j = int(r[0]), int(r[1])
        assert float(r[3]) == js_value(data["values"][i * data["cols"] + j])
        assert r[2] == "[" + ", ".join(map(str, conv_index(i, j, data["shape"]))) + "]"

    _, body = download(pg, card.get_by_role("button", name="JSON"))
    exported = json.loads(body)
    assert exported["values"] == data["values"] and exported["shape"] == data["shape"]


def _write_png(buf, rgb: np.ndarray) -> None:
    """A minimal PNG writer (filter 0) for crops of decoded images."""
    h, w, ch = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].astype(np.uint8).tobytes() for y in range(h))

    def chunk(kind, body):
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ctype = 2 if ch == 3 else 6
    buf.write(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, ctype, 0, 0, 0))
    )
    buf.write(chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_histograms_render_and_export(page):
    pg = open_variable_page(page, "beta", "conv2d/kernel", "variance")
    tags = get_json(page.base, "tags")
    last = max(tags["runs"]["beta"]["conv2d/kernel"]["steps"])
    # Variances open on a log x axis, as the heatmap's colour scale; the bins suit the size
    # (the Rice rule, 2 * 90^(1/3) -> 9 bins for the 90 elements).
    assert pg.locator("input.hist-log").is_checked()
    bins = max(4, min(30, math.ceil(2 * 90 ** (1 / 3))))
    ref = get_binary(
        page.base,
        "histogram",
        run="beta",
        tag="conv2d/kernel",
        stat="variance",
        step=last,
        bins=bins,
        scale="log",
    )
    bars = pg.locator("#histogram-card rect.bar")
    assert bars.count() == len(ref["edges"]) - 1 == bins == 9
    counts = [float(bars.nth(k).get_attribute("data-count")) for k in range(bars.count())]
    assert counts == [js_value(c) for c in ref["series"][0]["counts"]]
    assert sum(counts) == 90  # every element of the [3, 3, 2, 5] kernel
    _, body = download(pg, pg.locator("#histogram-card").get_by_role("button", name="CSV"))
    rows = list(csv.reader(io.StringIO(body.decode())))
    assert rows[0] == ["step", "bin_left", "bin_right", "count"]
    assert [float(r[3]) for r in rows[1:]] == counts
    assert [float(r[1]) for r in rows[1:]] == [js_value(e) for e in ref["edges"][:-1]]
    shot(pg, "histogram_step.png")

    # Over steps, log x: one ridge per step, axis ticks at powers of ten.
    choose(pg, "select.hist-mode", "steps", page)
    pg.check("input.hist-log")
    page.settle()
    ridges = pg.locator("#histogram-card path.ridge")
    steps = tags["runs"]["beta"]["conv2d/kernel"]["steps"]
    assert ridges.count() == len(steps)
    assert sorted(
        int(ridges.nth(k).get_attribute("data-step")) for k in range(ridges.count())
    ) == sorted(steps)
    ticks = pg.locator("#histogram-card .tick text").all_text_contents()
    assert any(re.fullmatch(r"1e-\d+", t) for t in ticks), ticks
    name, svg = download(pg, pg.locator("#histogram-card").get_by_role("button", name="SVG"))
    assert len(ET.fromstring(svg).findall(".//{http://www.w3.org/2000/svg}path")) >= len(steps)
    shot(pg, "histogram_ridges_logx.png")


def test_noise_curves_overlay_runs_and_export(page):
    pg = open_variable_page(page, "alpha", "dense/kernel", "variance")
    tags = get_json(page.base, "tags")
    runs = sorted(r for r in tags["runs"] if "dense/kernel" in tags["runs"][r])
    layer = pg.locator(".curves-layer path.curve")
    assert layer.count() == len(runs)
    assert sorted(layer.nth(k).get_attribute("data-run") for k in range(layer.count())) == runs
    assert all(layer.nth(k).get_attribute("d").startswith("M") for k in range(layer.count()))
    model = pg.locator(".curves-model path.curve")
    assert model.count() == len(tags["model"])

    _, body = download(pg, pg.locator(".curves-layer").get_by_role("button", name="CSV"))
    rows = list(csv.reader(io.StringIO(body.decode())))
    # Smoothing is on by default: the raw per-step values and the smoothed ones, both exported.
    smoothing = float(pg.locator("input.smoothing").input_value())
    assert smoothing == 0.9
    assert rows[0] == [
        "run",
        "step",
        "wall_time",
        "noise_scale",
        "noise_scale_smoothed",
        "noise_scale_smoothed_se",
        "noise_scale_status",
    ]
    for run in runs:
        ref = get_json(page.base, "series", run=run, tag="dense/kernel", smoothing=smoothing)
        got = [(int(r[1]), float(r[3]), float(r[4]), float(r[5])) for r in rows[1:] if r[0] == run]
        want = list(
            zip(
                ref["steps"],
                map(js_value, ref["values"]["noise_scale"]),
                map(js_value, ref["smoothed"]["noise_scale"]),
                map(js_value, ref["smoothed_se"]["noise_scale"]),
                strict=True,
            )
        )
        # What a noise scale that is not a value is, spelled out.
        for r in rows[1:]:
            v = float(r[4])
            want_status = "undefined" if math.isnan(v) else "" if v > 0 else "noise-dominated"
            assert r[6] == want_status, r
        assert len(got) == len(want)
        for (s1, *v1), (s2, *v2) in zip(got, want, strict=True):
            assert s1 == s2
            for a, b in zip(v1, v2, strict=True):
                assert a == b or (math.isnan(a) and math.isnan(b))
        # The first smoothed step is the raw one (a bias-corrected EMA).
        assert math.isclose(got[0][2], got[0][1], rel_tol=1e-9) or math.isnan(got[0][1])
    shot(pg, "noise_curves.png")

    # Hiding a run removes its line; another quantity, log y.
    pg.locator(".run-row", has_text="beta").locator("input").uncheck()
    page.settle()
    pg.wait_for_function(
        "(n) => document.querySelectorAll('.curves-layer path.curve').length === n",
        arg=len(runs) - 1,
    )
    choose(pg, "select.metric-select", "total_variance", page)
    pg.check("input.curves-log")
    page.settle()
    titles = pg.locator(".curves-layer text.title").all_text_contents()
    want_title = get_json(page.base, "series", run="alpha")["statistics"]["total_variance"]["name"]
    assert titles and titles[0].startswith(want_title), titles
    _, png = download(pg, pg.locator(".curves-model").get_by_role("button", name="PNG"))
    assert decode_png(png).shape[0] > 100


def curve_value_at(pg, view: str, run: str, step: int) -> dict:
    """The value a curve draws at a step, as the tab holds it (from /series), and the tooltip
    text there: the pointer moved over the plot at that step."""
    data = pg.evaluate(
        """([view, run, step]) => {
          const m = window.gradmom.views[view].model;
          const steps = m.series.flatMap((s) => s.steps);
          const s = m.series.find((x) => x.run === run);
          const k = s.steps.indexOf(step);
          return {smoothed: s.smoothed ? s.smoothed[k] : s.values[k], raw: s.values[k],
                  se: s.se ? s.se[k] : null, lo: Math.min(...steps), hi: Math.max(...steps)};
        }""",
        [view, run, step],
    )
    css = {"layerCurves": ".curves-layer", "modelCurves": ".curves-model"}[view]
    target = pg.locator(f"{css} rect.hover-target")
    target.scroll_into_view_if_needed()
    box = target.bounding_box()
    x = box["x"] + (step - data["lo"]) / (data["hi"] - data["lo"]) * box["width"]
    pg.mouse.move(x, box["y"] + box["height"] / 2)
    tip = pg.locator(f"{css} .tooltip .tip-row", has_text=run).first
    tip.wait_for(state="visible")
    data["tip"] = tip.locator(".tip-value").text_content()
    return data


def test_table_shows_the_curves_estimator_and_marks_noise_dominated(page):
    pg = open_variable_page(page, "alpha", "dense/kernel", "variance")
    step = max(get_json(page.base, "tags")["model"]["alpha"]["steps"])
    for smoothing in (0.9, 0.6):
        if smoothing != 0.9:
            pg.locator("input.smoothing").fill(str(smoothing))
            pg.locator("input.smoothing").dispatch_event("change")
            pg.wait_for_function(
                "(s) => window.gradmom.views.table.model.smoothing === s", arg=smoothing
            )
            page.settle()
        assert f"smoothed at {smoothing:.2f}" in pg.locator("#summary-card .hint").text_content()
        for view, row_sel, run in (
            ("layerCurves", 'tbody tr[data-tag="dense/kernel"]', "alpha"),
            ("modelCurves", "tfoot tr", "alpha"),
        ):
            for key in ("noise_scale",):
                cell = pg.locator(f'table.summary {row_sel} td[data-key="{key}"]')
                curve = curve_value_at(pg, view, run, step)
                # The same number as the curve's at that step (/series writes arrays with 9
                # significant digits, /summary's scalars exactly: docs/http_api.md)...
                got = float(cell.get_attribute("data-value"))
                assert got == pytest.approx(curve["smoothed"], rel=1e-8), (view, key)
                # ... written the same way as in the curve's tooltip.
                assert curve["tip"].startswith(cell.text_content()), (curve["tip"], view)
                # The per-step value is in the cell's tooltip.
                ref = get_json(page.base, "summary", run=run, step=step, smoothing=smoothing)
                assert "this step" in cell.get_attribute("title")
                assert ref["smoothing"] == smoothing
    # A negative estimate is not shown as a number: "noise-dominated", in the table, its
    # tooltip and the curves' tooltip.
    ref = {r["tag"]: r for r in get_json(page.base, "summary", run="alpha", smoothing=0.6)["rows"]}
    assert js_value(ref["noise/bias"]["smoothed"]["noise_scale"]) < 0
    cell = pg.locator('table.summary tbody tr[data-tag="noise/bias"] td[data-key="noise_scale"]')
    assert cell.text_content() == "noise-dominated"
    assert "noise-dominated" in cell.get_attribute("class")
    pg.click('table.summary tbody tr[data-tag="noise/bias"]')
    page.settle()
    curve = curve_value_at(pg, "layerCurves", "alpha", step)
    assert curve["smoothed"] < 0 and curve["tip"].startswith("noise-dominated"), curve


def test_summary_table_sorts_and_opens_heatmap(page):
    pg = open_variable_page(page, "alpha", "dense/kernel", "variance")
    tags = get_json(page.base, "tags")
    # One call per run (one whole-model tag): no group selector.
    assert pg.locator("select.group-select").count() == 0
    step = max(tags["model"]["alpha"]["steps"])
    # The table shows the curves' estimator: smoothed at the slider's value (0.9 by default).
    ref = get_json(page.base, "summary", run="alpha", step=step, smoothing=0.9)
    rows = pg.locator("table.summary tbody tr")
    assert rows.count() == len(ref["rows"]) == len(tags["runs"]["alpha"])
    # Sorted by total variance, descending, by default.
    order = [rows.nth(k).get_attribute("data-tag") for k in range(rows.count())]
    shown = lambda r, k: js_value(r["smoothed"][k]) if r.get("smoothed") else js_value(r[k])  # noqa: E731
    want = [r["tag"] for r in sorted(ref["rows"], key=lambda r: -shown(r, "total_variance"))]
    assert order == want
    # The statistics' headers explain them (name, meaning, formula, reference) from the backend.
    for key, stat in (("noise_scale", "noise_scale"), ("gsnr_mean", "gsnr_mean")):
        title = pg.locator(f'table.summary th[data-key="{key}"]').get_attribute("title")
        st = ref["statistics"][key]
        assert st == STATISTICS[stat].as_dict()
        assert title.startswith(f"{st['name']}: {st['meaning']}.") and st["formula"] in title
        assert st["reference"] in title, title
    pg.click('table.summary th[data-key="size"]')
    order = [rows.nth(k).get_attribute("data-tag") for k in range(rows.count())]
    assert order == [r["tag"] for r in sorted(ref["rows"], key=lambda r: -js_value(r["size"]))]
    pg.click('table.summary th[data-key="size"]')
    order = [rows.nth(k).get_attribute("data-tag") for k in range(rows.count())]
    assert order == [r["tag"] for r in sorted(ref["rows"], key=lambda r: js_value(r["size"]))]

    _, body = download(pg, pg.locator("#summary-card").get_by_role("button", name="CSV"))
    table = list(csv.DictReader(io.StringIO(body.decode())))
    by_tag = {r["tag"]: r for r in ref["rows"]}
    if ref.get("model"):  # the whole model's row comes last
        assert table[-1]["tag"] == "_model"
        by_tag["_model"] = ref["model"]
        assert pg.locator("table.summary tfoot td").first.text_content() == "whole model"
    for r in table:
        row = by_tag[r["tag"]]
        for key in ("size", "total_variance", "gsnr_mean", "noise_scale", "batch_size"):
            want = row[key]
            if key not in ("size", "batch_size") and row.get("smoothed"):
                want = row["smoothed"][key]
                per_step = float(r[f"{key}_per_step"])
                assert per_step == js_value(row[key]) or math.isnan(per_step), (r, key)
            if want is None:  # not available: an empty CSV field
                assert r[key] == "", (r, key)
                continue
            got = float(r[key])
            assert got == js_value(want) or (math.isnan(got) and math.isnan(js_value(want))), (
                r,
                key,
            )

    # The SVG export draws the table as shown: its rows in the shown order, cell for cell.
    _, svg = download(pg, pg.locator("#summary-card").get_by_role("button", name="SVG"))
    texts = [t.text or "" for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert texts[0] == "Model summary" and texts[1].startswith("run alpha · step"), texts[:2]
    shown_rows = [rows.nth(k).locator("td").all_text_contents() for k in range(rows.count())]
    foot = pg.locator("table.summary tfoot tr")
    if foot.count():
        shown_rows.append(foot.first.locator("td").all_text_contents())
    ncol = len(shown_rows[0])
    drawn = texts[2 + ncol :]  # after the title, the subtitle and the header row
    assert [drawn[k : k + ncol] for k in range(0, len(drawn), ncol)] == shown_rows

    pg.click('table.summary tbody tr[data-tag="dense/bias"]')
    page.settle()
    title = pg.locator("#heatmap-card text.title").text_content()
    assert title.startswith("variance (unbiased") and "of dense/bias (one bar per element)" in title
    assert pg.locator(".tag-list button.selected").get_attribute("data-tag") == "dense/bias"
    bias = heatmap_json(page, "alpha", "dense/bias", "variance")
    assert (bias["rows"], bias["cols"]) == (1, 4)
    # A 1-D variable is drawn as bars (each its value's colour), not as a thin strip, and its
    # PNG export is a figure, not mostly blank.
    canvas = pg.locator(".heatmap-canvas")
    assert canvas.bounding_box()["height"] >= 150
    check_cell_colours(canvas.screenshot(), bias, *shown_view(pg), bars=True)
    _, png = download(pg, pg.locator("#heatmap-card").get_by_role("button", name="PNG"))
    img = decode_png(png)[..., :3].astype(int)
    blank = (np.abs(img - 255).sum(axis=2) < 8).mean()
    assert img.shape[0] >= 2 * 250 and blank < 0.85, (img.shape, blank)
    shot(pg, "summary_and_bias_heatmap.png")


def window_se(a, b, beta):
    """The standard error of the smoothed ratio sum(w a) / sum(w b) at every step, from
    explicit EMA weights (docs/math.md, "Uncertainty of the smoothed statistics")."""
    out = []
    for k in range(len(a)):
        w = (1 - beta) * beta ** np.arange(k + 1)[::-1]
        w = w / w.sum()
        aa, bb = np.asarray(a[: k + 1]), np.asarray(b[: k + 1])
        r = (w @ aa) / (w @ bb)
        out.append(
            math.sqrt((w**2 @ (aa - r * bb) ** 2) / ((w @ bb) ** 2 * (1 - w @ w)))
            if k
            else math.nan
        )
    return out


def test_uncertainty_band_is_the_backends_standard_error(page):
    pg = page.open_plugin()
    choose(pg, "select.run-select", "alpha", page)
    pg.wait_for_selector(".curves-model path.band")
    bands = pg.evaluate("() => window.gradmom.views.modelCurves.bands")
    d = get_json(page.base, "series", run="alpha", tag="_model", smoothing=0.9)
    tv = [js_value(v) for v in d["values"]["total_variance"]]
    g2 = [js_value(v) for v in d["values"]["grad_norm_sq_unbiased"]]
    direct = dict(zip(d["steps"], window_se(tv, g2, 0.9), strict=True))
    served = dict(zip(d["steps"], map(js_value, d["smoothed_se"]["noise_scale"]), strict=True))
    smoothed = dict(zip(d["steps"], map(js_value, d["smoothed"]["noise_scale"]), strict=True))
    mine = [b for b in bands if b["run"] == "alpha"]
    assert mine, bands
    checked = 0
    for b in mine:
        for st, lo, hi in zip(b["steps"], b["lo"], b["hi"], strict=True):
            assert (hi + lo) / 2 == pytest.approx(smoothed[st], rel=1e-9)
            assert (hi - lo) / 2 == pytest.approx(served[st], rel=1e-6)
            # /series arrays carry 9 significant digits: the direct computation from them
            # agrees to about that.
            assert (hi - lo) / 2 == pytest.approx(direct[st], rel=1e-5)
            checked += 1
    assert checked >= len(d["steps"]) - 1 - sum(1 for v in smoothed.values() if not v > 0)
    # Drawn: a filled area per run, and the subtitle says what it is.
    assert pg.locator('.curves-model path.band[data-run="alpha"]').count() == len(mine)
    sub = pg.locator(".curves-model text.subtitle").text_content()
    assert "± 1 standard error" in sub
    # At smoothing 0 (per-step values) there is no band: one step says nothing of its spread.
    pg.locator("input.smoothing").fill("0")
    pg.locator("input.smoothing").dispatch_event("change")
    pg.wait_for_function("() => window.gradmom.state.smoothing === 0")
    page.settle()
    assert pg.locator(".curves-model path.band").count() == 0


def noisiest(base, run) -> str:
    """The variable with the largest total variance in the table's numbers (smoothed at 0.9)."""
    rows = get_json(base, "summary", run=run, smoothing=0.9)["rows"]
    return max(
        (r for r in rows if r.get("smoothed")),
        key=lambda r: js_value(r["smoothed"]["total_variance"]),
    )["tag"]


def shown_runs(pg) -> dict:
    """Which run each view shows, as the page says it."""
    return pg.evaluate(
        """() => ({
          toolbar: document.querySelector("select.run-select").value,
          active: document.querySelector(".run-row.active").dataset.run,
          table: window.gradmom.views.table.model.run,
          heatmap: window.gradmom.views.heatmap.model.run,
          histogram: window.gradmom.views.histogram.model.run,
          curves: [...document.querySelectorAll(".curves-model path.curve")].map(
            (p) => p.dataset.run),
          options: [...document.querySelectorAll("select.run-select option")].map((o) => o.value),
        })"""
    )


def test_one_run_selection_drives_every_view(page):
    pg = page.open_plugin()
    choose(pg, "select.run-select", "alpha", page)
    pg.wait_for_function("() => window.gradmom.views.table.model.run === 'alpha'")
    page.settle()
    runs = shown_runs(pg)
    assert {runs[k] for k in ("toolbar", "active", "table", "heatmap", "histogram")} == {"alpha"}
    assert "alpha" in runs["curves"] and "beta" in runs["curves"]
    # After a run switch, the noisiest variable of the new run is selected.
    assert pg.evaluate("() => window.gradmom.state.tag") == noisiest(page.base, "alpha")
    # Unchecking the active run in the sidebar: no view shows it any more.
    pg.locator('.run-row[data-run="alpha"] input').uncheck()
    pg.wait_for_function("() => window.gradmom.views.table.model.run !== 'alpha'")
    page.settle()
    runs = shown_runs(pg)
    new = runs["toolbar"]
    assert new != "alpha" and "alpha" not in runs["options"] and "alpha" not in runs["curves"]
    assert {runs[k] for k in ("active", "table", "heatmap", "histogram")} == {new}, runs
    assert pg.evaluate("() => window.gradmom.state.tag") == noisiest(page.base, new)
    # Clicking a run's name makes it the run of every view again (and checks it).
    pg.locator('.run-row[data-run="beta"] .run-name').click()
    pg.wait_for_function("() => window.gradmom.views.table.model.run === 'beta'")
    page.settle()
    runs = shown_runs(pg)
    assert {runs[k] for k in ("toolbar", "active", "table", "heatmap", "histogram")} == {"beta"}
    assert pg.evaluate("() => window.gradmom.state.tag") == noisiest(page.base, "beta")
    # Human names everywhere: the quantity selector is grouped by kind, no code names.
    groups = pg.locator("select.metric-select optgroup")
    labels = [groups.nth(k).get_attribute("label") for k in range(groups.count())]
    assert labels[:3] == ["Noise scale (critical batch size)", "Signal-to-noise", "Step-size rules"]
    cabs = pg.locator('select.metric-select option[value="cabs_batch_size"]')
    assert cabs.evaluate("o => o.parentElement.label") == "Step-size rules"
    for text in pg.locator("select.metric-select option").all_text_contents():
        assert "_" not in text and "[" not in text, text
    axis = pg.locator(".curves-model text.axis-label, .curves-model .y-label").all_text_contents()
    svg_text = " ".join(pg.locator(".curves-model svg text").all_text_contents())
    assert "noise_scale" not in svg_text and "Bₛᵢₘₚₗₑ" in svg_text, (axis, svg_text[:300])
    pg.click("button.info-button")
    info = pg.locator(".stat-info").text_content()
    assert "tr(Σ) / |G|²" in info and "Sigma" not in info and "Noise scale (critical" in info


def test_regex_filter_and_step_slider(page):
    pg = open_variable_page(page, "alpha", "dense/kernel", "variance")
    pg.fill("input.tag-filter", "KERNEL$")
    page.settle()
    shown = pg.locator(".tag-list button").evaluate_all("bs => bs.map(b => b.dataset.tag)")
    assert shown == sorted(
        t for t in get_json(page.base, "tags")["runs"]["alpha"] if t.endswith("kernel")
    )
    pg.fill("input.tag-filter", "(")
    assert "Invalid regular expression" in pg.locator(".filter-error").inner_text()
    pg.fill("input.tag-filter", "")

    steps = get_json(page.base, "tags")["runs"]["alpha"]["dense/kernel"]["steps"]
    assert pg.locator("output.step-value").inner_text() == str(max(steps))
    slider = pg.locator("input.step-slider")
    slider.evaluate(
        "(s) => { s.value = 1; s.dispatchEvent(new Event('input')); s.dispatchEvent(new Event('change')); }"
    )
    page.settle()
    assert not pg.locator("input.follow").is_checked()
    assert pg.locator("output.step-value").inner_text() == str(sorted(steps)[1])
    data = heatmap_json(page, "alpha", "dense/kernel", "variance", step=sorted(steps)[1])
    assert f"step {sorted(steps)[1]}" in pg.locator("#heatmap-card text.subtitle").text_content()
    check_cell_colours(pg.locator(".heatmap-canvas").screenshot(), data, *shown_view(pg))


WORDS_BROKEN = r"""() => {
  // Every word of the header's and toolbar's text on one line box: none wraps inside itself.
  const broken = [];
  const roots = document.querySelectorAll(".card-header, .toolbar");
  for (const root of roots) {
    const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let node = walk.nextNode(); node; node = walk.nextNode()) {
      const parent = node.parentElement;
      if (!parent || parent.closest("select, option") || !parent.offsetParent) continue;
      const re = /\S+/g;
      for (let m = re.exec(node.data); m; m = re.exec(node.data)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
        if (tops.size > 1) broken.push(m[0]);
      }
    }
    // A control's label and its text on one line (the "Smoothing", "log y" labels).
    for (const el of root.querySelectorAll("h2, label, .field > span, button")) {
      if (!el.offsetParent || el.closest("select")) continue;
      const spans = el.querySelectorAll(":scope > span");
      const texts = spans.length ? [...spans] : [el];
      for (const t of texts) {
        const rects = [...t.getClientRects()];
        const lines = new Set(rects.map((r) => Math.round(r.top)));
        if (lines.size > 1) broken.push(t.textContent);
      }
    }
  }
  return broken;
}"""


def scrolled_still(pg):
    """Waits until the page stops scrolling (a smooth scroll has ended)."""
    pg.wait_for_function(
        """() => new Promise((done) => {
          const y = window.scrollY;
          requestAnimationFrame(() => requestAnimationFrame(() => done(window.scrollY === y)));
        })"""
    )


@pytest.mark.parametrize("width", [800, 1024, 2560])
def test_layout_nothing_wraps_mid_word_and_titles_stay_below_the_toolbar(page, width):
    page.page.set_viewport_size({"width": width, "height": 700})
    pg = page.open_plugin()
    choose(pg, "select.run-select", "alpha", page)
    pg.wait_for_selector("table.summary tbody tr")
    assert pg.evaluate(WORDS_BROKEN) == []
    h2 = pg.locator("#curves-card h2")
    assert h2.evaluate("e => e.getClientRects().length") == 1
    # A table row's click brings the heatmap into view, its title below the sticky toolbar.
    pg.locator('table.summary tbody tr[data-tag="conv2d/kernel"]').click()
    page.settle()
    scrolled_still(pg)
    toolbar = pg.locator(".toolbar").bounding_box()
    title = pg.locator("#heatmap-card h2").bounding_box()
    figure_title = pg.locator("#heatmap-card text.title").bounding_box()
    assert title["y"] >= toolbar["y"] + toolbar["height"], (title, toolbar)
    assert figure_title["y"] >= toolbar["y"] + toolbar["height"], (figure_title, toolbar)
    assert pg.evaluate("() => window.scrollY") > 0  # it did scroll


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("width", [1024, 1440])
def test_screenshots_light_and_dark(browser, tensorboard, width, theme):
    """Screenshots of the tab as a reader sees it (artifacts/screenshots/tab_<width>_<theme>.png):
    the demo's CNN when there, else alpha; the last variable's 1-D bias in bars below; and a
    comparison of alpha and beta (compare_<width>_<theme>.png)."""
    p = Page(browser, tensorboard, color_scheme=theme)
    try:
        p.page.set_viewport_size({"width": width, "height": 900})
        pg = p.open_plugin()
        assert pg.evaluate("() => document.documentElement.dataset.theme") == theme
        runs = pg.locator("select.run-select option").evaluate_all("os => os.map(o => o.value)")
        run = next((r for r in runs if r.endswith("cnn")), "alpha")
        choose(pg, "select.run-select", run, p)
        pg.wait_for_selector("table.summary tbody tr")
        assert pg.evaluate(WORDS_BROKEN) == []
        shot(pg, f"tab_{width}_{theme}.png")
        choose(pg, "select.run-select", "alpha", p)
        pg.click('.tag-list button[data-tag="big/kernel"]')
        p.settle()
        choose(pg, "select.compare-select", "runs", p)
        pg.wait_for_selector('.compare-panel[data-run="beta"]')
        p.settle()
        assert pg.evaluate(WORDS_BROKEN) == []
        assert _svg_labels_outside(pg, "#heatmap-card, #histogram-card") == []
        pg.locator("#heatmap-card").scroll_into_view_if_needed()
        SHOTS.mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(SHOTS / f"compare_{width}_{theme}.png"), full_page=False)
        assert not p.errors, p.errors
    finally:
        p.close()


def test_html_run_name_is_text(page):
    pg = page.open_plugin()
    choose(pg, "select.run-select", XSS_RUN, page)
    names = pg.locator(".run-name").all_inner_texts()
    assert XSS_RUN in names
    assert pg.evaluate("() => document.querySelectorAll('img').length") == 0
    assert XSS_RUN in pg.locator("#heatmap-card text.subtitle").text_content()
    assert pg.locator("select.run-select option:checked").inner_text() == XSS_RUN
    _, svg = download(pg, pg.locator("#heatmap-card").get_by_role("button", name="SVG"))
    assert b"&lt;img src=x onerror=alert(1)&gt;" in svg
    texts = [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert any(XSS_RUN in (t or "") for t in texts)
    _, body = download(pg, pg.locator(".curves-layer").get_by_role("button", name="CSV"))
    assert XSS_RUN in {r[0] for r in csv.reader(io.StringIO(body.decode()))}
    shot(pg, "html_run_name.png")
    assert not page.dialogs


def test_reload_picks_up_a_new_run(page, logdir):
    pg = page.open_plugin()
    assert "gamma" not in pg.locator(".run-name").all_inner_texts()
    _write_run(logdir / "gamma", seed=3, steps=(0, 5))
    deadline = time.time() + 90
    while "gamma" not in pg.locator(".run-name").all_inner_texts():
        assert time.time() < deadline, "the new run did not show up after Reload"
        pg.wait_for_timeout(2000)
        pg.click("button.reload")
        page.settle()
    choose(pg, "select.run-select", "gamma", page)
    assert pg.locator("output.step-value").inner_text() == "5"


def test_heatmap_zoom_keeps_cells_and_colours(page):
    pg = open_variable_page(page, "alpha", "big/kernel", "variance")
    data = heatmap_json(page, "alpha", "big/kernel", "variance")
    rows, cols = data["rows"], data["cols"]
    assert (rows, cols) == (96, 64)
    values = [js_value(v) for v in data["values"]]
    lo, hi = min(values), max(values)
    colormap, scale = shown_view(pg)
    lut = colormap_lut(colormap)
    canvas, box = canvas_box(pg)
    row, col = 30, 17
    x = box["x"] + (col + 0.5) * box["width"] / cols
    y = box["y"] + (row + 0.5) * box["height"] / rows
    pg.mouse.move(x, y)
    for _ in range(4):
        pg.mouse.wheel(0, -400)
        pg.wait_for_timeout(100)
    k = pg.evaluate("() => window.gradmom.views.heatmap.transform.k")
    assert k > 3, k
    # Zooming about the pointer keeps the same cell under it, now drawn much bigger.
    pairs = dict(
        pg.locator(".heatmap-figure .tooltip .tip-row").evaluate_all(
            "rows => rows.map(r => [r.querySelector('.tip-key').textContent,"
            " r.querySelector('.tip-value').textContent])"
        )
    )
    assert pairs["index"] == f"[{row}, {col}]", pairs
    pg.mouse.move(0, 0)
    img = decode_png(canvas.screenshot())
    got = tuple(int(c) for c in img[int(y - box["y"]), int(x - box["x"]), :3])
    assert got == expected_colour(values[row * cols + col], lo, hi, lut, scale)
    shot(pg, "heatmap_zoomed.png")
    pg.dblclick(".heatmap-canvas")
    pg.wait_for_function("() => window.gradmom.views.heatmap.transform.k === 1")


def test_pooled_variable_shows_block_ranges(page):
    pg = open_variable_page(page, "alpha", "wide/kernel", "variance")
    data = heatmap_json(page, "alpha", "wide/kernel", "variance")
    assert data["pooled"] and data["block"] != [1, 1]
    br, bc = data["block"]
    r_total, c_total = data["grid_shape"]
    canvas, box = canvas_box(pg)
    check_cell_colours(canvas.screenshot(), data, *shown_view(pg))
    row, col = data["rows"] - 1, data["cols"] - 1  # the last block may be cut by the edge
    pg.mouse.move(
        box["x"] + (col + 0.5) * box["width"] / data["cols"],
        box["y"] + (row + 0.5) * box["height"] / data["rows"],
    )
    text = pg.locator(".heatmap-figure .tooltip .tip-value").first.text_content()

    def span(a, b):
        return str(a) if a == b else f"{a}–{b}"

    r0, r1 = row * br, min((row + 1) * br, r_total) - 1
    c0, c1 = col * bc, min((col + 1) * bc, c_total) - 1
    assert text == f"rows {span(r0, r1)}, cols {span(c0, c1)}"
    subtitle = pg.locator("#heatmap-card text.subtitle").text_content()
    assert f"block means of {br}×{bc}" in subtitle
    pg.mouse.move(0, 0)


def test_demo_runs_render_with_right_colours(page):
    """Every run of the demo: each variable whose cells get >= 2 pixels has each cell's colour."""
    tags = get_json(page.base, "tags")
    demo_runs = sorted(r for r in tags["runs"] if r not in FIXTURE_RUNS)
    if not _demo_available():
        pytest.skip("tb_gradmom.demo is not there yet")
    assert demo_runs, "the demo wrote no runs"
    pg = page.open_plugin()
    for run in demo_runs:
        checked = 0
        for tag in sorted(tags["runs"][run]):
            open_variable(page, run, tag, "variance")
            data = heatmap_json(page, run, tag, "variance")
            canvas, box = canvas_box(pg)
            if box["height"] / data["rows"] >= 2 and box["width"] / data["cols"] >= 2:
                bars = len(data["shape"]) <= 1  # a 1-D variable: bars, their feet checked
                check_cell_colours(canvas.screenshot(), data, *shown_view(pg), bars=bars)
                checked += 1
            if len(data["shape"]) == 4:  # a conv kernel: the tooltip names [i, j, c_in, c_out]
                row, col = data["rows"] - 1, data["cols"] - 1
                pg.mouse.move(
                    box["x"] + box["width"] * (col + 0.5) / data["cols"],
                    box["y"] + box["height"] * (row + 0.5) / data["rows"],
                )
                index = pg.locator(".heatmap-figure .tooltip .tip-value").first.text_content()
                if data["pooled"]:  # a block of the 2-D view (format v2 pools above 2,048)
                    br, bc = data["block"]
                    r_total, c_total = data["grid_shape"]
                    r0, r1 = row * br, min((row + 1) * br, r_total) - 1
                    c0, c1 = col * bc, min((col + 1) * bc, c_total) - 1

                    def span(a, b):
                        return str(a) if a == b else f"{a}–{b}"

                    assert index == f"rows {span(r0, r1)}, cols {span(c0, c1)}", (tag, index)
                else:
                    assert index == str(conv_index(row, col, data["shape"])), (tag, index)
                pg.mouse.move(0, 0)
        assert checked, f"no variable of {run} was checked"
        safe = re.sub(r"[^A-Za-z0-9]+", "_", run)
        shot(pg, f"demo_{safe}.png")


# ------------------------------------------------------------------ groups (issue 14, point 4)


@pytest.fixture(scope="module")
def gan_tensorboard(tmp_path_factory):
    """TensorBoard on two GAN-style runs (two `summary.moments` calls per step on one
    writer): ``default`` (groups ``""`` and ``moments_1``) and ``named`` (``discriminator``,
    ``generator``)."""
    from tests.test_plugin import write_gan_logdir

    logdir = tmp_path_factory.mktemp("gan")
    write_gan_logdir(logdir)
    gen = tensorboard.__wrapped__(logdir, tmp_path_factory)
    yield next(gen)
    next(gen, None)


def test_group_selector_shows_one_call_at_a_time(browser, gan_tensorboard):
    p = Page(browser, gan_tensorboard)
    try:
        pg = p.open_plugin()
        p.settle()
        tags = get_json(p.base, "tags")

        def group_tags(run, group):
            return sorted(t for t, i in tags["runs"][run].items() if i["group"] == group)

        def shown():
            p.settle()
            pg.wait_for_selector("table.summary tbody tr")
            table = pg.locator("table.summary tbody tr").evaluate_all(
                "rs => rs.map(r => r.dataset.tag)"
            )
            side = pg.locator(".tag-list button").evaluate_all("bs => bs.map(b => b.dataset.tag)")
            model_runs = pg.locator(".curves-model path.curve").evaluate_all(
                "ps => ps.map(p => p.dataset.run)"
            )
            title = pg.locator(".curves-model text.title").text_content()
            foot = pg.locator("table.summary tfoot td").first.text_content()
            return sorted(table), side, sorted(model_runs), title, foot

        options = pg.locator("select.group-select option").all_inner_texts()
        assert options == ["(no name)", "discriminator", "generator", "moments_1"]
        # The active run's first group: the unprefixed call's model, table and variables.
        assert pg.locator("select.run-select").input_value() == "default"
        table, side, model_runs, title, foot = shown()
        assert table == side == group_tags("default", "") and table
        assert model_runs == ["default"] and "whole model (no name)" in title
        assert foot == "whole model (no name)"
        shot(pg, "groups_default.png")

        choose(pg, "select.group-select", "moments_1", p)
        table, side, model_runs, title, foot = shown()
        assert table == side == group_tags("default", "moments_1") and table
        assert all(t.startswith("moments_1/") for t in table)
        assert model_runs == ["default"] and "whole model moments_1" in title
        # The model row is the group's own: /summary?group= for the table, and the heatmap
        # shows one of the group's variables.
        ref = get_json(p.base, "summary", run="default", group="moments_1")
        assert ref["model"]["tag"] == "moments_1/_model"
        assert pg.locator(".tag-list button.selected").get_attribute("data-tag") in table

        # A group of another run switches the run.
        choose(pg, "select.group-select", "generator", p)
        assert pg.locator("select.run-select").input_value() == "named"
        table, side, model_runs, title, foot = shown()
        assert table == side == group_tags("named", "generator") and table
        assert model_runs == ["named"] and foot == "whole model generator"
        shot(pg, "groups_generator.png")

        # Hiding the run leaves the unnamed run's two groups: still a selector.
        pg.locator(".run-row", has_text="named").locator("input").uncheck()
        p.settle()
        choose(pg, "select.run-select", "default", p)
        options = pg.locator("select.group-select option").all_inner_texts()
        assert options == ["(no name)", "moments_1"]
        assert not p.errors, p.errors
    finally:
        p.close()


def variance_from_log(run_dir: Path, tag: str, step: int, n: int = 32) -> np.ndarray:
    """The unbiased variance n/(n-1) (M2 - M1^2) of a variable at a step, from its moments as
    the event file holds them (read with TensorBoard's EventAccumulator, computed in numpy)."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    acc = event_accumulator.EventAccumulator(
        str(run_dir), size_guidance={event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    (event,) = [e for e in acc.Tensors(tag) if e.step == step]
    m1, m2 = tensor_util.make_ndarray(event.tensor_proto).astype(np.float64)
    return (m2 - m1**2) * n / (n - 1)


def show_only_runs(pg, page, runs):
    """Checks exactly ``runs`` in the sidebar (the run selection every view follows)."""
    for r in runs:
        box = pg.locator(f'.run-row[data-run="{r}"] input')
        if not box.is_checked():
            box.check()
            page.settle()
    for name in pg.locator(".run-row").evaluate_all("rs => rs.map(r => r.dataset.run)"):
        if name not in runs:
            pg.evaluate(
                """(name) => {
                  const row = [...document.querySelectorAll('.run-row')]
                    .find((r) => r.dataset.run === name);
                  const box = row.querySelector('input');
                  if (box.checked) box.click();
                }""",
                name,
            )
            page.settle()
    assert pg.evaluate("() => window.gradmom.state.checked") == sorted(runs)


def test_comparison_of_two_runs_has_one_colour_scale(page, logdir):
    pg = open_variable_page(page, "alpha", "dense/kernel", "variance")
    show_only_runs(pg, page, ["alpha", "beta"])
    choose(pg, "select.compare-select", "runs", page)
    pg.wait_for_selector('.compare-panel[data-run="beta"]')
    page.settle()
    panels = pg.locator(".compare-panel")
    assert panels.evaluate_all("ps => ps.map(p => p.dataset.run)") == ["alpha", "beta"]
    assert pg.locator("#heatmap-card .heatmap-canvas").count() == 0
    # The steps shown: the active run's latest (40), and beta's at that step.
    assert panels.evaluate_all("ps => ps.map(p => +p.dataset.step)") == [40, 40]
    # The domain: min and max over both runs' variances, from the event files with numpy.
    both = np.concatenate(
        [variance_from_log(logdir / r, "dense/kernel", 40).ravel() for r in ("alpha", "beta")]
    )
    assert pg.evaluate("() => window.gradmom.state.scale") == "log"
    want = (float(both[both > 0].min()), float(both[both > 0].max()))
    domains = panels.evaluate_all("ps => ps.map(p => [+p.dataset.lo, +p.dataset.hi])")
    bar = pg.locator("#heatmap-card g.colorbar")
    assert bar.count() == 1  # one colour bar for the comparison
    domains.append([float(bar.get_attribute("data-lo")), float(bar.get_attribute("data-hi"))])
    for d in domains:
        np.testing.assert_allclose(d, want, rtol=1e-6)
    # Each run alone spans less than the shared domain: the scale is really shared.
    alone = [variance_from_log(logdir / r, "dense/kernel", 40) for r in ("alpha", "beta")]
    assert any(a.min() > want[0] * (1 + 1e-6) or a.max() < want[1] * (1 - 1e-6) for a in alone)
    # Every cell of both panels has the colour of its value on that one scale.
    colormap, scale = shown_view(pg)
    for run in ("alpha", "beta"):
        data = heatmap_json(page, run, "dense/kernel", "variance", step=40)
        image = pg.locator(f'.compare-panel[data-run="{run}"] image.panel-image')
        checked = check_cell_colours(image.screenshot(), data, colormap, scale, domain=want)
        assert checked == data["rows"] * data["cols"]
    # The tooltip over a cell of one panel: that element's value in both runs.
    box = pg.locator('.compare-panel[data-run="beta"] image.panel-image').bounding_box()
    pg.mouse.move(box["x"] + 1.5 * box["width"] / 4, box["y"] + 2.5 * box["height"] / 6)
    tip = pg.locator(".compare-figure .tooltip")
    tip.wait_for(state="visible")
    assert (tip.get_attribute("data-row"), tip.get_attribute("data-col")) == ("2", "1")
    texts = tip.locator(".tip-value").all_text_contents()
    assert texts[0] == "[2, 1]", texts
    for run, text in zip(("alpha", "beta"), texts[1:], strict=True):
        ref = variance_from_log(logdir / run, "dense/kernel", 40)[2, 1]
        assert math.isclose(float(text), ref, rel_tol=1e-5), (run, text, ref)
    # Histograms: both runs overlaid, in the runs' colours, with a legend.
    overlays = pg.locator("#histogram-card path.overlay")
    assert overlays.evaluate_all("ps => ps.map(p => p.dataset.run)") == ["alpha", "beta"]
    legend = pg.locator("#histogram-card g.legend text").all_text_contents()
    assert legend == ["alpha", "beta"]
    colours = pg.evaluate("() => Object.fromEntries(window.gradmom.colors)")
    assert overlays.evaluate_all("ps => ps.map(p => p.getAttribute('stroke'))") == [
        colours["alpha"],
        colours["beta"],
    ]
    # Exports of the comparison: one figure with both panels, the numbers of both runs.
    card = pg.locator("#heatmap-card")
    name, body = download(pg, card.get_by_role("button", name="JSON"))
    assert name == "compare-dense_kernel-variance-runs-alpha-vs-beta.json", name
    exported = json.loads(body)
    np.testing.assert_allclose(exported["domain"], want, rtol=1e-6)
    assert [p["run"] for p in exported["panels"]] == ["alpha", "beta"]
    _, body = download(pg, card.get_by_role("button", name="CSV"))
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert len(rows) == 2 * 24 and {r["run"] for r in rows} == {"alpha", "beta"}
    for r in rows:
        ref = variance_from_log(logdir / r["run"], "dense/kernel", 40)
        assert math.isclose(float(r["variance"]), ref[int(r["row"]), int(r["col"])], rel_tol=1e-6)
    _, svg = download(pg, card.get_by_role("button", name="SVG"))
    root = ET.fromstring(svg)
    groups = [
        g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "compare-panel"
    ]
    assert [g.get("data-run") for g in groups] == ["alpha", "beta"]
    _, png = download(pg, card.get_by_role("button", name="PNG"))
    assert decode_png(png).shape[0] > 100
    SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / "compare_export.png").write_bytes(png)
    _, hist_csv = download(pg, pg.locator("#histogram-card").get_by_role("button", name="CSV"))
    assert {r["run"] for r in csv.DictReader(io.StringIO(hist_csv.decode()))} == {"alpha", "beta"}
    shot(pg, "compare_runs.png")
    # A 1-D variable: bars, each as tall as its value on the one (log) scale of both runs.
    pg.click('.tag-list button[data-tag="dense/bias"]')
    pg.wait_for_selector('.compare-panel[data-run="beta"] rect.bar')
    page.settle()
    values = {r: variance_from_log(logdir / r, "dense/bias", 40) for r in ("alpha", "beta")}
    lo = min(v.min() for v in values.values())
    hi = max(v.max() for v in values.values())
    for run, v in values.items():
        bars = pg.locator(f'.compare-panel[data-run="{run}"] rect.bar').evaluate_all(
            "rs => rs.map(r => [+r.getAttribute('y'), +r.getAttribute('height')])"
        )
        assert len(bars) == 4
        for (y, height), value in zip(bars, v, strict=True):
            t = (math.log10(value) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
            assert math.isclose(height / 160, 0.04 + 0.96 * t, abs_tol=1e-6), (run, value)
            assert math.isclose(y + height, 160, abs_tol=1e-6)


def test_comparison_of_two_steps(page, logdir):
    pg = open_variable_page(page, "beta", "dense/kernel", "variance")
    choose(pg, "select.compare-select", "steps", page)
    choose(pg, "select.compare-step", "10", page)
    pg.wait_for_selector('.compare-panel[data-step="10"]')
    page.settle()
    panels = pg.locator(".compare-panel")
    assert panels.evaluate_all("ps => ps.map(p => [p.dataset.run, +p.dataset.step])") == [
        ["beta", 10],
        ["beta", 50],
    ]
    both = np.concatenate(
        [variance_from_log(logdir / "beta", "dense/kernel", st).ravel() for st in (10, 50)]
    )
    lo, hi = float(both.min()), float(both.max())
    np.testing.assert_allclose(pg.evaluate("() => window.gradmom.views.compare.domain"), [lo, hi])
    steps = pg.locator("#histogram-card path.overlay").evaluate_all(
        "ps => ps.map(p => +p.dataset.step)"
    )
    assert steps == [10, 50]
    sub = pg.locator("#histogram-card text.subtitle").text_content()
    assert sub.startswith("step 10 · step 50 · share of elements per decade"), sub
    shot(pg, "compare_steps.png")


def wait_view(pg):
    """Waits until the tab has drawn its views (the heatmap, or a comparison's panels)."""
    pg.wait_for_function(
        "() => window.gradmom && window.gradmom.pending !== undefined", timeout=60000
    )
    pg.evaluate("() => window.gradmom.pending")
    pg.wait_for_selector(".heatmap-canvas, .compare-panel", timeout=60000)
    pg.evaluate("() => window.gradmom.pending")
    pg.wait_for_timeout(150)


SHOWN = """() => ({
  run: document.querySelector("select.run-select").value,
  tag: document.querySelector(".tag-list button.selected").dataset.tag,
  stat: document.querySelector("select.stat-select").value,
  scale: document.querySelector("select.scale-select").value,
  metric: document.querySelector("select.metric-select").value,
  smoothing: document.querySelector("input.smoothing").value,
  compare: document.querySelector("select.compare-select").value,
  vs: document.querySelector("select.compare-step")?.value ?? null,
  checked: [...document.querySelectorAll(".run-row input")].filter((b) => b.checked)
    .map((b) => b.closest(".run-row").dataset.run),
  panels: [...document.querySelectorAll(".compare-panel")].map(
    (p) => [p.dataset.run, +p.dataset.step]),
  curves: [...new Set([...document.querySelectorAll(".curves-model path.curve")].map(
    (p) => p.dataset.run))].sort(),
})"""


def test_reload_keeps_the_view(page):
    pg = open_variable_page(page, "beta", "conv2d/kernel", "mean")
    show_only_runs(pg, page, ["alpha", "beta"])
    choose(pg, "select.scale-select", "linear", page)
    choose(pg, "select.metric-select", "gsnr_mean", page)
    pg.locator("input.smoothing").fill("0.6")
    pg.locator("input.smoothing").dispatch_event("change")
    page.settle()
    choose(pg, "select.compare-select", "steps", page)
    choose(pg, "select.compare-step", "20", page)
    pg.wait_for_selector('.compare-panel[data-step="20"]')
    page.settle()
    before = pg.evaluate(SHOWN)
    assert before["run"] == "beta" and before["tag"] == "conv2d/kernel"
    assert before["stat"] == "mean" and before["compare"] == "steps" and before["vs"] == "20"
    assert before["panels"] == [["beta", 20], ["beta", 50]]
    assert before["checked"] == ["alpha", "beta"] and before["curves"] == ["alpha", "beta"]
    assert "run=beta" in pg.evaluate("() => location.hash")
    pg.reload()
    wait_view(pg)
    pg.wait_for_selector(".curves-model path.curve")
    page.settle()
    assert pg.evaluate(SHOWN) == before
    # The same link in a new page (a shared link) opens the same view too.
    url = pg.url
    other = Page(page.context.browser, page.base)
    try:
        other.page.goto(url)
        wait_view(other.page)
        other.page.wait_for_selector(".curves-model path.curve")
        other.settle()
        assert other.page.evaluate(SHOWN) == before
        assert not other.errors, other.errors
    finally:
        other.close()


def test_tensorboard_link_opens_the_view_and_reload_refreshes(browser, tensorboard):
    """Inside TensorBoard: the tab writes its selection into TensorBoard's URL hash
    (p.gradmom.*), a reload of that URL opens the same view (plugin_lib's GetURLPluginData), and
    TensorBoard's reload button reaches the tab (DataReloaded)."""
    p = Page(browser, tensorboard)
    try:
        page = p.page
        page.goto(tensorboard + "/#gradmom")
        frame = page.wait_for_selector(
            'iframe[src*="plugin_entry.html?name=gradmom"]', timeout=60000
        ).content_frame()
        p.wait_ready(frame)
        frame.select_option("select.run-select", "beta")
        frame.evaluate("() => window.gradmom.pending")
        frame.click('.tag-list button[data-tag="dense/bias"]')
        frame.evaluate("() => window.gradmom.pending")
        frame.select_option("select.stat-select", "mean")
        frame.evaluate("() => window.gradmom.pending")
        page.wait_for_function("() => location.hash.includes('p.gradmom.tag=dense%2Fbias')")
        url = page.url
        assert "#gradmom" in url and "p.gradmom.run=beta" in url, url
        page.goto("about:blank")
        page.goto(url)
        frame = page.wait_for_selector(
            'iframe[src*="plugin_entry.html?name=gradmom"]', timeout=60000
        ).content_frame()
        p.wait_ready(frame)
        frame.evaluate("() => window.gradmom.pending")
        state = frame.evaluate(
            "() => { const s = window.gradmom.state; return [s.run, s.tag, s.stat]; }"
        )
        assert state == ["beta", "dense/bias", "mean"]
        assert frame.locator("select.run-select").input_value() == "beta"
        # TensorBoard's reload button: the tab fetches the runs again.
        frame.evaluate(
            """() => {
              window.__tagsFetched = 0;
              const orig = window.fetch;
              window.fetch = (url, ...rest) => {
                if (String(url).includes("/tags")) window.__tagsFetched += 1;
                return orig(url, ...rest);
              };
            }"""
        )
        page.locator("button.reload-button, [aria-label='Reload data']").first.click()
        frame.wait_for_function("() => window.__tagsFetched > 0", timeout=30000)
        assert not p.errors, p.errors
    finally:
        p.close()


# ---------------------------------------------------------------------- the full demo (issue 13)

DEMO_SHOTS = Path(os.environ.get("GRADMOM_SHOTS", str(SHOTS)))


@pytest.fixture(scope="module")
def demo_tensorboard(tmp_path_factory):
    """TensorBoard on the full demo (``tb-gradmom demo``, about a minute), or on the logdir in
    ``GRADMOM_DEMO_LOGDIR`` when it is set (a demo written before)."""
    given = os.environ.get("GRADMOM_DEMO_LOGDIR")
    if given:
        logdir = Path(given)
    else:
        logdir = tmp_path_factory.mktemp("demo_full")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        subprocess.run(
            [sys.executable, "-m", "tb_gradmom.cli", "demo", "--logdir", str(logdir)],
            check=True,
            env=env,
            capture_output=True,
            timeout=900,
        )
    gen = tensorboard.__wrapped__(logdir, tmp_path_factory)
    yield next(gen)
    next(gen, None)


def _svg_labels_outside(p, selector):
    """Every <text> of the SVGs under ``selector`` whose box leaves its SVG's box."""
    return p.evaluate(
        """(sel) => {
          const out = [];
          for (const svg of document.querySelectorAll(sel + ' svg')) {
            const box = svg.getBoundingClientRect();
            for (const t of svg.querySelectorAll('text')) {
              const b = t.getBoundingClientRect();
              if (!b.width) continue;
              if (b.left < box.left - 0.5 || b.right > box.right + 0.5 || b.top < box.top - 0.5
                  || b.bottom > box.bottom + 0.5) out.push(t.textContent);
            }
          }
          return out;
        }""",
        selector,
    )


@pytest.mark.slow
def test_demo_landing_smoothing_info_and_resize(browser, demo_tensorboard):
    pg = Page(browser, demo_tensorboard)
    try:
        p = pg.open_plugin()
        pg.settle()
        p.wait_for_selector(".curves-model path.curve.smoothed")
        # Landing: the whole-model curves come first, above the heatmap.
        order = p.evaluate(
            "() => [...document.querySelectorAll('main > section')].map((s) => s.id)"
        )
        assert order[0] == "curves-card" and order.index("heatmap-card") > order.index(
            "summary-card"
        )
        # Landed on the variable with the largest total variance, in log scale.
        app_state = p.evaluate("() => ({tag: gradmom.state.tag, scale: gradmom.state.scale})")
        # (the table's numbers: smoothed at the curves' 0.9)
        assert app_state["tag"] == noisiest(demo_tensorboard, p.evaluate("() => gradmom.state.run"))
        assert app_state["scale"] == "log"
        DEMO_SHOTS.mkdir(parents=True, exist_ok=True)
        p.screenshot(path=str(DEMO_SHOTS / "demo_landing.png"), full_page=False)

        # The smoothing control: default 0.9, and the plotted curve is the backend's smoothed
        # noise scale (numerator and denominator smoothed separately).
        assert p.input_value(".smoothing") == "0.9"
        for run in ("mlp", "cnn"):
            d = get_json(demo_tensorboard, "series", run=run, tag="_model", smoothing=0.9)
            sm = [np.nan if v is None else float(v) for v in d["smoothed"]["noise_scale"]]
            sm = np.array(sm)
            half = sm[len(sm) // 2 :]
            assert np.all(half > 0), f"{run}: smoothed noise scale <= 0 in the second half: {sm}"
            # Growing as the loss falls: the second half's median above the first tenth's.
            assert np.median(half) > np.median(sm[: max(1, len(sm) // 10)]), (run, sm)
        p.eval_on_selector(
            ".smoothing", "(e) => { e.value = '0.6'; e.dispatchEvent(new Event('change')); }"
        )
        pg.settle()
        p.wait_for_function("() => gradmom.state.smoothing === 0.6")
        p.wait_for_selector(".curves-model .subtitle:has-text('smoothing 0.6')")
        assert p.text_content(".smoothing-value") == "0.60"

        # The info panel: formula, unit and reference from the backend's STATISTICS.
        p.click(".info-button")
        info = p.inner_text(".stat-info")
        st = d["statistics"]["noise_scale"]
        assert st["formula"] in info and st["unit"] in info and "McCandlish" in info
        p.screenshot(path=str(DEMO_SHOTS / "demo_curves_info.png"), full_page=False)

        # Ridges over all steps: at most 40 (evenly spaced), the rest said in the subtitle.
        p.select_option("select.hist-mode", "steps")
        pg.settle()
        ridges = p.locator("#histogram-card path.ridge")
        drawn = [int(ridges.nth(k).get_attribute("data-step")) for k in range(ridges.count())]
        sub = p.locator("#histogram-card text.subtitle").text_content()
        assert 2 <= len(drawn) <= 40, len(drawn)
        if len(drawn) == 40:
            assert "40 of " in sub, sub
        # Resize: every plot re-lays out, labels stay inside their SVGs.
        before = p.evaluate(
            "() => document.querySelector('#heatmap-card svg').getAttribute('width')"
        )
        p.set_viewport_size({"width": 900, "height": 1000})
        p.wait_for_function("() => (gradmom.resized ?? 0) > 0")
        pg.settle()
        after = p.evaluate(
            "() => document.querySelector('#heatmap-card svg').getAttribute('width')"
        )
        assert int(after) < int(before)
        card = p.evaluate(
            "() => document.querySelector('#heatmap-card').getBoundingClientRect().width"
        )
        assert int(after) <= card
        assert _svg_labels_outside(p, "main") == []
        p.locator("#heatmap-card").scroll_into_view_if_needed()
        p.locator("#heatmap-card").screenshot(path=str(DEMO_SHOTS / "demo_heatmap_resized.png"))
        # A phone-narrow window: the curves' notes and legends still fit their SVGs.
        p.set_viewport_size({"width": 380, "height": 900})
        p.wait_for_function("() => (gradmom.resized ?? 0) > 1")
        pg.settle()
        p.screenshot(path=str(DEMO_SHOTS / "demo_narrow.png"), full_page=True)
        outside = _svg_labels_outside(p, "main")
        assert outside == [], "\n".join(outside)
    finally:
        pg.close()
    assert not pg.errors, pg.errors
