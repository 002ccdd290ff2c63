// Unit tests of tb_gradmom_frontend/core.js. Run from the repository root:
//   node --test tests/js/
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import * as core from "../../tb_gradmom_frontend/core.js";

// The backend's GET /meta as the tab receives it: tb_gradmom.analysis.views.meta(), written by
// tests/js/meta_fixture.py and checked against it by tests/test_stats.py.
const META = core.checkMeta(JSON.parse(readFileSync(new URL("./meta.json", import.meta.url))));

test("decodeNumber reads the backend's NaN/Inf encoding", () => {
  assert.ok(Number.isNaN(core.decodeNumber(null)));
  assert.equal(core.decodeNumber("Infinity"), Infinity);
  assert.equal(core.decodeNumber("-Infinity"), -Infinity);
  assert.equal(core.decodeNumber(1.5e-7), 1.5e-7);
  const a = core.decodeArray([1, null, "Infinity", "-Infinity", 0]);
  assert.ok(a instanceof Float64Array);
  assert.deepEqual([...a].map(String), ["1", "NaN", "Infinity", "-Infinity", "0"]);
});

test("colour map LUTs have 256 entries and matplotlib's end points", () => {
  for (const name of core.COLORMAPS) assert.equal(core.colormapLUT(name).length, 768, name);
  // Reference colours from matplotlib (round(255 * x)): viridis(0), viridis(1), magma(1).
  assert.equal(core.rgbHex(core.colormapColor("viridis", 0)), "#440154");
  assert.equal(core.rgbHex(core.colormapColor("viridis", 1)), "#fde725");
  assert.equal(core.rgbHex(core.colormapColor("magma", 0)), "#000004");
  assert.equal(core.rgbHex(core.colormapColor("inferno", 1)), "#fcffa4");
  assert.equal(core.rgbHex(core.colormapColor("gray", 0.5)), "#808080");
  assert.equal(core.colormapColor("viridis", NaN), null);
  assert.throws(() => core.colormapLUT("jet"), /unknown colour map "jet"; expected one of viridis/);
});

test("lutIndex follows matplotlib: floor(t * 256) clamped to [0, 255]", () => {
  assert.equal(core.lutIndex(0), 0);
  assert.equal(core.lutIndex(1 / 256 - 1e-12), 0);
  assert.equal(core.lutIndex(1 / 256), 1);
  assert.equal(core.lutIndex(0.999), 255);
  assert.equal(core.lutIndex(1), 255);
  assert.equal(core.lutIndex(-3), 0);
  assert.equal(core.lutIndex(7), 255);
});

test("normalizer maps linear and log domains to [0, 1]", () => {
  const lin = core.normalizer([2, 6], "linear");
  assert.equal(lin(2), 0);
  assert.equal(lin(4), 0.5);
  assert.equal(lin(6), 1);
  assert.ok(Number.isNaN(lin(NaN)));
  assert.equal(lin(Infinity), 1);
  const log = core.normalizer([1e-4, 1], "log");
  assert.ok(Math.abs(log(1e-2) - 0.5) < 1e-12);
  assert.ok(Number.isNaN(log(0)));
  assert.ok(Number.isNaN(log(-1)));
  assert.equal(core.normalizer([3, 3])(3), 0.5);
  assert.throws(() => core.normalizer([0, 1], "sqrt"), /unknown scale "sqrt"/);
});

test("finiteExtent skips NaN, Inf and (log) non-positive values", () => {
  assert.deepEqual(core.finiteExtent([3, NaN, -1, Infinity, 2]), [-1, 3]);
  assert.deepEqual(core.finiteExtent([3, 0, -1, 0.5], "log"), [0.5, 3]);
  assert.equal(core.finiteExtent([NaN, 0], "log"), null);
});

test("colorize writes LUT colours and the missing colour for NaN", () => {
  const px = core.colorize([0, 1, NaN], "viridis", core.normalizer([0, 1]), [1, 2, 3, 4]);
  assert.deepEqual([...px], [0x44, 0x01, 0x54, 255, 0xfd, 0xe7, 0x25, 255, 1, 2, 3, 4]);
});

test("niceTicks picks 1-2-5 steps without float noise", () => {
  assert.deepEqual(core.niceTicks(0, 1, 5), [0, 0.2, 0.4, 0.6, 0.8, 1]);
  assert.deepEqual(core.niceTicks(0.1, 0.35, 5), [0.1, 0.15, 0.2, 0.25, 0.3, 0.35]);
  assert.deepEqual(core.niceTicks(-3, 7, 5), [-2, 0, 2, 4, 6]);
  assert.deepEqual(core.niceTicks(0, 1000, 4), [0, 200, 400, 600, 800, 1000]);
  assert.deepEqual(core.niceTicks(5, 5), [5]);
  assert.deepEqual(
    core.niceTicks(1.2e-7, 1.9e-7, 4).map((v) => +v.toPrecision(3)),
    [1.2e-7, 1.4e-7, 1.6e-7, 1.8e-7],
  );
  assert.equal(core.tickStep(0, 10, 10), 1);
  assert.deepEqual(core.niceDomain(0.13, 0.92, 5), [0, 1]);
});

test("logTicks gives decades, or 1-2-5 within one decade", () => {
  assert.deepEqual(core.logTicks(1e-6, 1, 10), [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1]);
  assert.deepEqual(core.logTicks(1e-12, 1, 4), [1e-12, 1e-8, 1e-4, 1]); // 13 decades, every 4th
  assert.deepEqual(core.logTicks(0.15, 0.9), [0.2, 0.5]);
  assert.deepEqual(core.logTicks(0, 1), []);
});

test("formatTick and formatValue", () => {
  assert.equal(core.formatTick(0.2), "0.2");
  assert.equal(core.formatTick(1e-7), "1e-7");
  assert.equal(core.formatTick(2.5e-7), "2.5e-7");
  assert.equal(core.formatTick(25000), "25k");
  assert.equal(core.formatTick(1500), "1.5k");
  assert.equal(core.formatValue(0.000123456), "1.235e-4");
  assert.equal(core.formatValue(12.3456), "12.35");
  assert.equal(core.formatValue(NaN), "NaN");
  assert.equal(core.formatValue(-Infinity), "-∞");
});

test("formatNumber: significant digits, SI from 1000, scientific below 0.01", () => {
  // The column (4608, 0.0021, 0.003135, -1.428e5) in one style.
  const f = (v, o) => core.formatNumber(v, o);
  assert.equal(f(4608), "4.608k");
  assert.equal(f(0.0021), "2.100e-3");
  assert.equal(f(0.003135), "3.135e-3");
  assert.equal(f(-1.428e5), "-142.8k");
  assert.equal(f(8545), "8.545k");
  assert.equal(f(999.96), "1.000k"); // rounding carries into the next range
  assert.equal(f(999_960_000), "1.000G");
  assert.equal(f(0.0099996), "0.01000");
  assert.equal(f(12.3456), "12.35");
  assert.equal(f(0.5), "0.5000");
  assert.equal(f(0.5, { trim: true }), "0.5");
  assert.equal(f(3.2e6, { trim: true }), "3.2M");
  assert.equal(f(2e18), "2.000e18");
  assert.equal(f(1e-300, { trim: true }), "1e-300");
  assert.equal(f(4608, { integer: true }), "4\u2009608");
  assert.equal(f(-1234567, { integer: true }), "-1\u2009234\u2009567");
  assert.equal(f(12.5, { integer: true }), "12.50");
  assert.equal(f(0), "0");
  assert.equal(f(null), "–");
  assert.equal(f(NaN), "NaN");
  assert.equal(f(Infinity), "∞");
  // Read back (suffix expanded), every number is its value to the digits asked.
  const scale = { k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15 };
  const read = (t) => (t.at(-1) in scale ? Number(t.slice(0, -1)) * scale[t.at(-1)] : Number(t));
  for (const v of [1.234567e-5, 0.0123456, 1.5, 99.99, 1234.5678, 5.5e7, -3.3e-4, 7.7e16])
    assert.ok(Math.abs(read(f(v, { digits: 6 })) - v) <= 5e-6 * Math.abs(v), v);
});

test("formatEstimate marks noise-dominated and undefined estimates the same everywhere", () => {
  const pos = { positiveOnly: true };
  assert.equal(core.formatEstimate(-7059, pos), "noise-dominated");
  assert.equal(core.formatEstimate(Infinity, pos), "noise-dominated");
  assert.equal(core.formatEstimate(0, pos), "noise-dominated");
  assert.equal(core.formatEstimate(NaN, pos), "undefined");
  assert.equal(core.formatEstimate(null, pos), "–");
  assert.equal(core.formatEstimate(-7059), "-7.059k"); // a signed statistic is a number
  assert.equal(core.formatEstimate(1234.5, { ...pos, se: 56.7 }), "1.235k ± 57");
  assert.equal(core.formatEstimate(1234.5, { ...pos, se: NaN }), "1.235k");
  assert.equal(core.estimateStatus(-1, true), "noise-dominated");
  assert.equal(core.estimateStatus(-1, false), "value");
});

test("cellElements recovers a conv kernel's multi-dimensional index", () => {
  // Conv2D kernel [kh=3, kw=2, cin=4, cout=5]: row (i * kw + j) * cin + c.
  const shape = [3, 2, 4, 5];
  assert.deepEqual(core.to2dShape(shape), [24, 5]);
  const [i, j, c, o] = [2, 1, 3, 4];
  const row = (i * 2 + j) * 4 + c;
  assert.deepEqual(core.cellElements(row, o, shape).index, [2, 1, 3, 4]);
  assert.deepEqual(core.cellElements(0, 3, [7]).index, [3]); // bias: 1 x 7
  assert.deepEqual(core.cellElements(4, 1, [5, 2]).index, [4, 1]);
  const pooled = core.cellElements(2, 1, [10, 7], [4, 4]);
  assert.deepEqual(pooled, { rows: [8, 9], cols: [4, 6], index: null });
  assert.equal(core.describeCell(pooled), "rows 8–9, cols 4–6");
  assert.equal(core.describeCell(core.cellElements(row, o, shape)), "[2, 1, 3, 4]");
  assert.deepEqual(core.unravelIndex(23, [2, 3, 4]), [1, 2, 3]);
});

test("poolGrid takes NaN-aware block means", () => {
  // 3 x 4 grid pooled to at most 2 x 2: blocks of 2 x 2 (last block row has one row).
  const v = [1, 2, 3, NaN, 5, 6, NaN, NaN, 9, 10, 11, 12];
  const p = core.poolGrid(v, 3, 4, 2, 2);
  assert.equal(p.rows, 2);
  assert.equal(p.cols, 2);
  assert.deepEqual(p.block, [2, 2]);
  assert.deepEqual([...p.values], [(1 + 2 + 5 + 6) / 4, 3, (9 + 10) / 2, (11 + 12) / 2]);
  assert.ok(Number.isNaN(core.poolGrid([NaN, NaN], 1, 2, 1, 1).values[0]));
  assert.deepEqual([...core.poolGrid([1, 2], 1, 2, 5, 5).values], [1, 2]);
});

test("histogram bins: equal width, last bin closed, log bins in log10", () => {
  const h = core.histogram([0, 1, 2, 3, 4, NaN], 4);
  assert.deepEqual(h.edges, [0, 1, 2, 3, 4]);
  assert.deepEqual(h.counts, [1, 1, 1, 2]);
  assert.equal(h.dropped, 1);
  const lg = core.histogram([1e-3, 1e-2, 1e-1, 1, 0, -1], 3, "log");
  assert.deepEqual(
    lg.edges.map((e) => +e.toPrecision(6)),
    [1e-3, 1e-2, 1e-1, 1],
  );
  assert.deepEqual(lg.counts, [1, 1, 2]);
  assert.equal(lg.dropped, 2);
  // Brute force: each value's bin by linear search agrees with binCounts.
  const vals = Array.from({ length: 500 }, (_, k) => (Math.sin(k * 12.9898) * 43758.5453) % 1);
  const edges = core.binEdges(-1, 1, 7);
  const { counts } = core.binCounts(vals, edges);
  const ref = new Array(7).fill(0);
  for (const x of vals) {
    for (let k = 0; k < 7; k++) {
      if (x >= edges[k] && (x < edges[k + 1] || (k === 6 && x <= edges[7]))) {
        ref[k]++;
        break;
      }
    }
  }
  assert.deepEqual(counts, ref);
  assert.deepEqual(core.binEdges(2, 2, 2), [1.5, 2, 2.5]);
});

test("CSV quoting follows RFC 4180", () => {
  const csv = core.toCSV(
    ["run", "value"],
    [
      ["<img src=x onerror=alert(1)>", 1.5],
      ["a,b", NaN],
      ['say "hi"', Infinity],
      ["two\nlines", -Infinity],
      [" padded", 1e-30],
    ],
  );
  assert.equal(
    csv,
    'run,value\r\n<img src=x onerror=alert(1)>,1.5\r\n"a,b",NaN\r\n"say ""hi""",Infinity\r\n' +
      '"two\nlines",-Infinity\r\n" padded",1e-30\r\n',
  );
  assert.equal(core.csvField(0.1 + 0.2), "0.30000000000000004"); // full precision, round trip
});

test("SVG helpers escape text", () => {
  assert.equal(core.escapeXML(`<a href="x">&'`), "&lt;a href=&quot;x&quot;&gt;&amp;&apos;");
  const t = core.svgElement("text", { x: 1, y: null }, ["<img src=x onerror=alert(1)>"]);
  assert.equal(t.svg, '<text x="1">&lt;img src=x onerror=alert(1)&gt;</text>');
  const g = core.svgElement("g", {}, [t, "&"]);
  assert.equal(g.svg, `<g>${t.svg}&amp;</g>`);
  const doc = core.svgDocument('<svg width="2"><g/></svg>');
  assert.match(doc, /^<\?xml version="1.0"/);
  assert.match(doc, /<svg xmlns="http:\/\/www.w3.org\/2000\/svg" width="2">/);
  assert.equal(
    core.linePath([
      [0, 0],
      [1, 2],
      [2, NaN],
      [3, 1],
      [4, 1.23456],
    ]),
    "M0,0L1,2M3,1L4,1.23",
  );
  assert.equal(
    core.fileName(["run/a b", "dense/kernel", "step", 3], "png"),
    "run_a_b-dense_kernel-step-3.png",
  );
  assert.equal(core.fileName(["<img src=x>"], "csv"), "img_src_x.csv");
});

test("file names follow tb_gradmom.analysis.encode.file_name on the shared cases", async () => {
  const { readFile } = await import("node:fs/promises");
  const url = new URL("./file_names.json", import.meta.url);
  const cases = JSON.parse(await readFile(url, "utf-8"));
  assert.ok(cases.length >= 10);
  for (const c of cases) assert.equal(core.fileName(c.parts, c.ext), c.name, JSON.stringify(c));
});

test("runs, tags, steps and sorting", () => {
  const colors = core.runColors(["b", "a", "c"], META);
  assert.equal(colors.get("a"), META.run_palette.light[0]);
  assert.equal(colors.get("c"), META.run_palette.light[2]);
  assert.equal(colors.get("a"), "#425066"); // TensorBoard's first run colour
  assert.equal(core.runColors(["a"], META, true).get("a"), "#8e98a3");
  const many = core.runColors(
    Array.from({ length: 9 }, (_, k) => `r${k}`),
    META,
  );
  assert.equal(many.get("r7"), META.run_palette.light[0]); // the palette repeats
  const upToOrderTwo = ["mean", "second_moment", "variance", "biased_variance", "std", "snr"];
  assert.deepEqual(core.availableStats([1, 2], META), upToOrderTwo);
  assert.deepEqual(core.availableStats([1], META), ["mean"]);
  assert.deepEqual(core.availableStats([2, 1, 4], META).slice(-1), ["fourth_moment"]);
  assert.equal(core.availableStats([1, 2, 3, 4], META).length, 10);
  assert.deepEqual(
    core.availableStats([1, 2, 3, 4], META),
    META.element_statistics.map((s) => s.key),
  );
  const tags = ["dense/kernel", "dense/bias", "conv2d/kernel"];
  assert.deepEqual(core.filterTags(tags, "KERNEL$").tags, ["dense/kernel", "conv2d/kernel"]);
  const bad = core.filterTags(tags, "(");
  assert.deepEqual(bad.tags, tags);
  assert.match(bad.error, /Invalid regular expression/);
  assert.equal(core.nearestStep([0, 10, 20], 15), 10);
  assert.equal(core.nearestStep([5, 10], 1), 5);
  assert.equal(core.nearestStep([5, 10], null), 10);
  assert.equal(core.nearestStep([], 3), null);
  const rows = [
    { t: "b", v: 2 },
    { t: "a", v: NaN },
    { t: "c", v: 1 },
  ];
  assert.deepEqual(
    core.sortRows(rows, "v").map((r) => r.t),
    ["c", "b", "a"],
  );
  assert.deepEqual(
    core.sortRows(rows, "v", true).map((r) => r.t),
    ["b", "c", "a"],
  );
  assert.deepEqual(
    core.sortRows(rows, "t", true).map((r) => r.t),
    ["c", "b", "a"],
  );
});

test("the vendored d3 modules load as native ES modules", async () => {
  const d3 = await import("../../tb_gradmom_frontend/vendor/d3.js");
  const s = d3.scaleLog().domain([1e-3, 10]).range([0, 100]);
  assert.equal(s(0.1), 50);
  assert.equal(typeof d3.zoom, "function");
  assert.equal(typeof d3.axisBottom, "function");
});

test("histogramStepsLabel says when the steps are a sample", () => {
  const series = [{ step: 40 }, { step: 0 }, { step: 499 }];
  assert.equal(core.histogramStepsLabel({ series: [{ step: 7 }] }, "step"), "step 7");
  assert.equal(core.histogramStepsLabel({ series, downsampled: false }), "steps 0–499");
  assert.equal(
    core.histogramStepsLabel({ series, downsampled: true, stored_steps: 500 }),
    "3 of 500 steps in 0–499 (a sample)",
  );
  assert.equal(
    core.histogramStepsLabel({ series, downsampled: true, stored_steps: null }),
    "3 steps in 0–499 (a sample)",
  );
  assert.equal(core.histogramStepsLabel({ series: [] }), "no steps");
});

test("defaultView: log viridis for variances, linear diverging for signed statistics", () => {
  const c = core;
  const variance = { scale: "log", colormap: "viridis", histLog: true };
  assert.deepEqual(c.defaultView("variance", META), variance);
  const mean = { scale: "linear", colormap: "rdbu_r", histLog: false };
  assert.deepEqual(c.defaultView("mean", META), mean);
  for (const s of META.signed_stats) assert.equal(c.defaultView(s, META).colormap, "rdbu_r", s);
  assert.deepEqual(c.defaultView("unknown", META), variance);
  assert.ok(c.COLORMAPS.includes("rdbu_r"));
  // diverging: the middle is near white, the ends blue (low) and red (high)
  const [r0, , b0] = c.colormapColor("rdbu_r", 0);
  const [r1, , b1] = c.colormapColor("rdbu_r", 1);
  assert.ok(b0 > r0 && r1 > b1);
  assert.deepEqual(c.symmetricDomain([-1, 3, NaN, Infinity]), [-3, 3]);
  assert.equal(c.symmetricDomain([0, NaN]), null);
});

test("splitCurve marks noise-dominated and undefined estimates instead of dropping them", () => {
  const c = core;
  const { line, marked } = c.splitCurve([2, -1, NaN, Infinity, 5], true);
  assert.deepEqual(
    line.map((v) => (Number.isNaN(v) ? "gap" : v)),
    [2, "gap", "gap", "gap", 5],
  );
  assert.deepEqual(marked, [
    { index: 1, reason: "noise-dominated" },
    { index: 2, reason: "undefined" },
    { index: 3, reason: "noise-dominated" },
  ]);
  assert.deepEqual(c.splitCurve([-1, 2], false).marked, []);
});

test("argmaxRow and evenSample", () => {
  const c = core;
  assert.equal(c.argmaxRow([{ v: 1 }, { v: NaN }, { v: 3 }, { v: 2 }], "v"), 2);
  assert.equal(c.argmaxRow([{ v: NaN }], "v"), -1);
  assert.deepEqual(c.evenSample([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 4), [0, 3, 6, 9]);
  assert.deepEqual(c.evenSample([1, 2], 4), [1, 2]);
});

test("groups: model tags, labels, the groups of the shown runs", () => {
  assert.equal(core.modelTag(""), "_model");
  assert.equal(core.modelTag("generator"), "generator/_model");
  assert.equal(core.groupLabel(""), "(no name)");
  assert.equal(core.groupLabel("moments_1"), "moments_1");
  const groups = { a: { "": {}, generator: {} }, b: { moments_1: {} }, c: {} };
  assert.deepEqual(core.groupsOf(groups, ["a", "b"]), ["", "generator", "moments_1"]);
  assert.deepEqual(core.groupsOf(groups, ["b", "c", "missing"]), ["moments_1"]);
  assert.deepEqual(core.groupsOf(undefined, ["a"]), []);
});

test("robustBinRange leaves out the tails of the pooled counts", () => {
  // 1 tiny value in bin 0, 1 huge in bin 9, the bulk in bins 3-6 over two steps.
  const a = [1, 0, 0, 100, 200, 0, 0, 0, 0, 0];
  const b = [0, 0, 0, 0, 150, 149, 100, 0, 0, 1];
  assert.deepEqual(core.robustBinRange([a, b]), { first: 3, last: 6, outside: 2 });
  assert.deepEqual(core.robustBinRange([[0, 5, 0]]), { first: 1, last: 1, outside: 0 });
  assert.equal(core.robustBinRange([[0, 0]]), null);
  assert.equal(core.robustBinRange([]), null);
  // Wider quantiles keep everything.
  assert.deepEqual(core.robustBinRange([a, b], 0, 1), { first: 0, last: 9, outside: 0 });
});

test("robustRange keeps ordinary curves whole and cuts spikes", () => {
  const calm = Array.from({ length: 50 }, (_, k) => 100 + k);
  assert.deepEqual(core.robustRange(calm), { lo: 100, hi: 149, clipped: false });
  const spiky = [...calm, 1e6, NaN, Infinity];
  const r = core.robustRange(spiky);
  assert.ok(r.clipped && r.hi < 200 && r.hi >= 146 && r.lo === 100, JSON.stringify(r));
  const dip = [...calm, -1e6];
  const d = core.robustRange(dip);
  assert.ok(d.clipped && d.lo > 0 && d.hi === 149, JSON.stringify(d));
  assert.equal(core.robustRange([NaN]), null);
});

test("/meta: labels, orders and signs of the element-wise statistics", () => {
  assert.equal(core.statLabel("variance", META), "variance (unbiased, n/(n−1))");
  assert.equal(core.statLabel("biased_variance", META), "variance (biased, M₂ − M₁²)");
  assert.equal(core.statLabel("nope", META), "nope");
  assert.deepEqual(core.elementStat("kurtosis", META).orders, [1, 2, 3, 4]);
  assert.equal(core.elementStat("snr", META).needs_batch_size, true);
  assert.equal(core.elementStat("nope", META), null);
  assert.deepEqual(
    META.element_statistics.filter((s) => core.isSigned(s.key, META)).map((s) => s.key),
    META.signed_stats,
  );
  assert.ok(core.isSigned("mean", META) && !core.isSigned("variance", META));
  // Labels and orders come from the payload, whatever it says.
  const other = {
    ...META,
    element_statistics: [{ key: "variance", label: "var", orders: [2, 1], signed: true }],
  };
  assert.equal(core.statLabel("variance", other), "var");
  assert.deepEqual(core.availableStats([1, 2], other), ["variance"]);
  assert.deepEqual(core.availableStats([1], other), []);
  assert.deepEqual(core.defaultView("variance", other).colormap, "rdbu_r");
});

test("/meta: curve quantities, their names and the summary's numeric fields", () => {
  const choices = core.curveChoices(META);
  assert.deepEqual(choices.slice(0, META.summary_statistics.length), Object.keys(META.statistics));
  assert.ok(choices.includes("batch_size") && choices.includes("learning_rate"));
  assert.ok(!choices.includes("loss")); // the loss has its own plot
  assert.deepEqual(new Set([...choices, "loss"]), new Set(META.series_keys));
  assert.ok(choices.includes(META.landing.curve));
  assert.equal(core.seriesInfo("noise_scale", META), META.statistics.noise_scale);
  assert.match(core.seriesInfo("noise_scale", META).name, /noise scale/i);
  assert.equal(core.seriesInfo("loss", META).name, "Training loss");
  assert.deepEqual(core.seriesInfo("mystery", META), { name: "mystery", unit: "" });
  assert.ok(core.isPositiveOnly("noise_scale", META));
  assert.ok(core.isPositiveOnly("cabs_batch_size", META));
  assert.ok(!core.isPositiveOnly("eb_criterion", META));
  assert.deepEqual(core.summaryNumericKeys(META), [
    "size",
    "batch_size",
    ...META.summary_statistics,
  ]);
  assert.equal(META.default_smoothing, 0.9);
});

test("checkMeta freezes the payload and names what is missing", () => {
  assert.ok(Object.isFrozen(META) && Object.isFrozen(META.run_palette.light));
  const copy = () => JSON.parse(JSON.stringify(META));
  assert.doesNotThrow(() => core.checkMeta(copy()));
  const noLabels = copy();
  delete noLabels.element_statistics;
  delete noLabels.default_smoothing;
  assert.throws(
    () => core.checkMeta(noLabels),
    /missing or invalid: element_statistics \(array, got undefined\), default_smoothing/,
  );
  const badPalette = copy();
  badPalette.run_palette = { light: ["#000000"], dark: [] };
  assert.throws(() => core.checkMeta(badPalette), /run_palette\.dark/);
  const badStat = copy();
  badStat.element_statistics = [{ key: "mean" }];
  assert.throws(() => core.checkMeta(badStat), /element_statistics \(objects with key/);
  const badLanding = copy();
  badLanding.landing = { stat: "variance" };
  assert.throws(() => core.checkMeta(badLanding), /landing\.curve \(string\), landing\.sort/);
  assert.throws(() => core.checkMeta(null), /expected an object, got null/);
  assert.throws(() => core.checkMeta([]), /expected an object, got array/);
});

test("the summary table's columns are fields of /summary rows (/meta)", async () => {
  const { COLUMNS, columnTitle } = await import("../../tb_gradmom_frontend/views/table.js");
  const numeric = core.summaryNumericKeys(META);
  for (const col of COLUMNS) {
    if (col.numeric) assert.ok(numeric.includes(col.key), col.key);
    if (META.summary_statistics.includes(col.key)) {
      const st = META.statistics[col.key];
      assert.ok(columnTitle(col.key, META.statistics).startsWith(`${st.name}: ${st.meaning}.`));
    }
  }
  assert.ok(COLUMNS.some((c) => c.key === META.landing.sort)); // the table starts sorted by it
});

test("curveGroups: statistics grouped by what they are, human names, units", () => {
  const groups = core.curveGroups(META);
  const of = (key) => groups.find((g) => g.keys.includes(key))?.key;
  assert.equal(of("noise_scale"), "noise_scale");
  assert.equal(of("cabs_batch_size"), "step_size"); // not beside the noise scale
  assert.equal(of("gsnr_mean"), "signal_to_noise");
  assert.equal(of("learning_rate"), "logged");
  assert.equal(of("loss"), undefined); // its own plot
  // Every curve choice exactly once.
  assert.deepEqual(groups.flatMap((g) => g.keys).sort(), core.curveChoices(META).sort());
  for (const g of groups) assert.ok(g.name && !g.name.includes("_"), g.name);
  assert.equal(core.seriesTitle("noise_scale", META), "Gradient noise scale Bₛᵢₘₚₗₑ");
  assert.equal(core.axisLabel("noise_scale", META), "noise scale Bₛᵢₘₚₗₑ [examples]");
  assert.equal(
    core.axisLabel("total_variance", META),
    "total variance tr(Σ) [squared gradient units]",
  );
  assert.equal(core.axisLabel("learning_rate", META), "Learning rate");
  for (const key of core.curveChoices(META)) {
    assert.ok(!core.axisLabel(key, META).includes(key), key); // no code names
    assert.ok(!core.seriesTitle(key, META).includes("_"), key);
  }
});

test("histogramPlan: a bin count and a ridge count that suit tiny variables", () => {
  assert.deepEqual(core.histogramPlan(4), { bins: 4, ridges: 8 }); // a 4-element bias
  assert.deepEqual(core.histogramPlan(72), { bins: 9, ridges: 40 });
  assert.deepEqual(core.histogramPlan(4608), { bins: 30, ridges: 40 });
  assert.deepEqual(core.histogramPlan(1), { bins: 4, ridges: 8 });
  assert.equal(core.histogramPlan(1e9, 60).bins, 60);
});

test("colorize keeps NaN and <= 0 (log scale) apart, both off the colour map", () => {
  const norm = core.normalizer([1, 10], "log");
  const px = core.colorize([NaN, 0, -1, 1], "viridis", norm, [1, 2, 3, 255], [9, 9, 9, 255]);
  assert.deepEqual([...px.slice(0, 4)], [1, 2, 3, 255]);
  assert.deepEqual([...px.slice(4, 8)], [9, 9, 9, 255]);
  assert.deepEqual([...px.slice(8, 12)], [9, 9, 9, 255]);
  const low = core.colormapColor("viridis", 0);
  for (const theme of Object.values(core.THEMES)) {
    assert.notDeepEqual(theme.missing.slice(0, 3), theme.nonPositive.slice(0, 3));
    for (const c of [theme.missing, theme.nonPositive]) {
      const far = Math.max(...c.slice(0, 3).map((v, k) => Math.abs(v - low[k])));
      assert.ok(far > 80, `${c} is close to viridis' low end ${low}`);
    }
  }
});

test("bandSegments: value ± standard error where both are finite", () => {
  const steps = [0, 10, 20, 30, 40, 50];
  const v = [5, 6, -1, 7, 8, NaN];
  const se = [NaN, 1, 1, 2, 0.5, 1];
  const bands = core.bandSegments(steps, v, se, true);
  // Step 0 has no SE yet (one step in the window); step 20 is noise-dominated; 50 undefined.
  assert.deepEqual(bands, [
    { steps: [10], lo: [5], hi: [7] },
    { steps: [30, 40], lo: [5, 7.5], hi: [9, 8.5] },
  ]);
  assert.equal(core.bandSegments(steps, v, se, false)[0].steps.length, 4); // a signed statistic
  assert.deepEqual(core.bandSegments(steps, v, null), []);
});
