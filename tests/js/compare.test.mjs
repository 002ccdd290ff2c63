// The comparison's numbers: the one colour domain of all panels (views/compare.js) and the
// overlaid histograms' heights (views/histogram.js). Run from the repository root:
//   node --test tests/js/
import assert from "node:assert/strict";
import { test } from "node:test";

const { sharedDomain } = await import("../../tb_gradmom_frontend/views/compare.js");
const { overlayDensity } = await import("../../tb_gradmom_frontend/views/histogram.js");

const f64 = (a) => Float64Array.from(a);

test("the shared domain is the extent over every panel, not any one panel's", () => {
  const a = f64([2, 3, NaN]);
  const b = f64([0.5, 8, Infinity]);
  assert.deepEqual(sharedDomain([a, b], "linear", false), [0.5, 8]);
  assert.deepEqual(sharedDomain([a], "linear", false), [2, 3]);
  // Log: values <= 0 have no colour and do not stretch the domain.
  assert.deepEqual(
    sharedDomain([f64([0, -1, 1e-4]), f64([1e-2, NaN])], "log", false),
    [1e-4, 1e-2],
  );
  // Signed on a linear scale: symmetric about zero over all panels.
  assert.deepEqual(sharedDomain([f64([-1, 0.5]), f64([3, -2])], "linear", true), [-3, 3]);
  // Nothing finite anywhere: no domain.
  assert.equal(sharedDomain([f64([NaN]), f64([])], "linear", false), null);
});

test("overlaid histograms: each bin's share per unit of x, adding up to 1", () => {
  const data = { edges: [0, 1, 3, 4], series: [{ step: 5, counts: [2, 4, 2] }] };
  const { density, total, edges } = overlayDensity(data);
  assert.equal(total, 8);
  assert.deepEqual(edges, data.edges);
  assert.deepEqual(density, [0.25, 0.25, 0.25]); // 2/8 per 1, 4/8 per 2, 2/8 per 1
  const area = density.reduce((s, d, k) => s + d * (edges[k + 1] - edges[k]), 0);
  assert.equal(area, 1);
  // Log x: per decade.
  const log = { edges: [1e-4, 1e-3, 1e-1], series: [{ step: 0, counts: [1, 3] }] };
  const d = overlayDensity(log, Math.log10).density;
  assert.ok(Math.abs(d[0] - 0.25) < 1e-12 && Math.abs(d[1] - 0.375) < 1e-12, String(d));
  // No counts: nothing to draw.
  assert.deepEqual(overlayDensity({ edges: [0, 1], series: [{ step: 0, counts: [0] }] }).edges, []);
});
