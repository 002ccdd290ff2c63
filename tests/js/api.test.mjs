// The tab's transport (api.js): the binary form of /heatmap and /histogram, decoded from bytes
// laid out here by hand as docs/http_api.md ("Binary responses") specifies, and the objects
// fetchHeatmap / fetchHistogram hand to the views, equal to those of the JSON form. Run from the
// repository root:
//   node --test tests/js/
import assert from "node:assert/strict";
import { afterEach, test } from "node:test";

import {
  ApiError,
  HEATMAP_MAX_CELLS,
  decodeBinary,
  fetchHeatmap,
  fetchHistogram,
} from "../../tb_gradmom_frontend/api.js";

const realFetch = globalThis.fetch;
afterEach(() => {
  globalThis.fetch = realFetch;
});

/**
 * A binary payload written field by field: "GMB1", the header's length (uint32 LE), the header
 * padded with spaces to a multiple of 8, then each array at its 8-aligned offset, little-endian.
 * arrays: [{dtype, shape, values}]; the header refers to them as {"$array": i}.
 */
function layOut(header, arrays, { misalign = false } = {}) {
  const size = { float32: 4, float64: 8, uint32: 4 };
  const specs = [];
  let offset = misalign ? 4 : 0;
  for (const a of arrays) {
    specs.push({ dtype: a.dtype, shape: a.shape, offset });
    offset += Math.ceil((a.values.length * size[a.dtype]) / 8) * 8 + (misalign ? 4 : 0);
  }
  let text = JSON.stringify({ ...header, $arrays: specs });
  while ((8 + text.length) % 8) text += " ";
  const buffer = new ArrayBuffer(8 + text.length + offset);
  const view = new DataView(buffer);
  "GMB1".split("").forEach((c, i) => view.setUint8(i, c.charCodeAt(0)));
  view.setUint32(4, text.length, true);
  for (let i = 0; i < text.length; i++) view.setUint8(8 + i, text.charCodeAt(i));
  const start = 8 + text.length;
  arrays.forEach((a, k) => {
    a.values.forEach((v, i) => {
      const at = start + specs[k].offset + i * size[a.dtype];
      if (a.dtype === "float32") view.setFloat32(at, v, true);
      else if (a.dtype === "float64") view.setFloat64(at, v, true);
      else view.setUint32(at, v, true);
    });
  });
  return buffer;
}

function stubFetch(answers) {
  const asked = [];
  globalThis.fetch = async (url) => {
    asked.push(new URL(url));
    const { body, type } = answers(new URL(url));
    return new Response(body, { status: 200, headers: { "Content-Type": type } });
  };
  return asked;
}

// Values exactly representable in float32, so the JSON and binary forms carry the same numbers.
const VALUES = [0.5, NaN, Infinity, -Infinity, 1.25, 3.0517578125e-5];
const HEAT = {
  run: "train",
  tag: "dense/kernel",
  step: 20,
  wall_time: 1795214310.638639,
  stat: "variance",
  label: "variance (unbiased, n/(n-1))",
  batch_size: 8,
  shape: [2, 3],
  grid_shape: [2, 3],
  stored_shape: [2, 3],
  rows: 2,
  cols: 3,
  block: [1, 1],
  pooled: false,
  min: 3.0517578125e-5,
  max: 1.25,
  unbiased: true,
};
const JSON_TOKEN = (v) =>
  Number.isNaN(v) ? "NaN" : v === Infinity ? "Infinity" : v === -Infinity ? "-Infinity" : v;

test("decodeBinary reads float32, float64 and uint32 arrays, NaN and infinities kept", () => {
  const buffer = layOut(
    { a: { $array: 0 }, nested: [{ b: { $array: 1 } }, { c: { $array: 2 } }] },
    [
      { dtype: "float32", shape: [2, 3], values: VALUES },
      { dtype: "float64", shape: [2], values: [1e-300, -2.5e300] },
      { dtype: "uint32", shape: [3], values: [0, 7, 4294967295] },
    ],
  );
  const d = decodeBinary(buffer);
  assert.ok(d.a instanceof Float32Array);
  assert.deepEqual(Array.from(d.a), VALUES);
  assert.ok(d.nested[0].b instanceof Float64Array);
  assert.deepEqual(Array.from(d.nested[0].b), [1e-300, -2.5e300]);
  assert.ok(d.nested[1].c instanceof Uint32Array);
  assert.deepEqual(Array.from(d.nested[1].c), [0, 7, 4294967295]);
  assert.equal("$arrays" in d, false);
});

test("decodeBinary reads arrays at offsets not aligned to their element size", () => {
  const buffer = layOut(
    { x: { $array: 0 }, y: { $array: 1 } },
    [
      { dtype: "float64", shape: [2], values: [0.1, -7] },
      { dtype: "float32", shape: [1], values: [2.5] },
    ],
    { misalign: true },
  );
  const d = decodeBinary(buffer);
  assert.deepEqual(Array.from(d.x), [0.1, -7]);
  assert.deepEqual(Array.from(d.y), [2.5]);
});

test("decodeBinary rejects what is not a binary payload, saying why", () => {
  const good = layOut({ v: { $array: 0 } }, [{ dtype: "float32", shape: [2], values: [1, 2] }]);
  const bad = good.slice(0);
  new Uint8Array(bad)[0] = "X".charCodeAt(0);
  assert.throws(() => decodeBinary(bad), /not "GMB1"/);
  assert.throws(() => decodeBinary(good.slice(0, good.byteLength - 4)), /runs past the end/);
  assert.throws(() => decodeBinary(new ArrayBuffer(3)), /8-byte prefix/);
  assert.throws(() => decodeBinary(withDtype("int64")), /unknown dtype "int64"/);
});

/** A payload whose one array has the given dtype (the decoder must refuse unknown ones). */
function withDtype(dtype) {
  let text = JSON.stringify({ v: { $array: 0 }, $arrays: [{ dtype, shape: [1], offset: 0 }] });
  while ((8 + text.length) % 8) text += " ";
  const buffer = new ArrayBuffer(8 + text.length + 8);
  const view = new DataView(buffer);
  "GMB1".split("").forEach((c, i) => view.setUint8(i, c.charCodeAt(0)));
  view.setUint32(4, text.length, true);
  for (let i = 0; i < text.length; i++) view.setUint8(8 + i, text.charCodeAt(i));
  return buffer;
}

test("fetchHeatmap asks for the binary form and returns what the JSON form gives", async () => {
  const binary = layOut({ ...HEAT, values: { $array: 0 } }, [
    { dtype: "float32", shape: [2, 3], values: VALUES },
  ]);
  const asked = stubFetch((url) =>
    url.searchParams.get("format") === "binary"
      ? { body: binary, type: "application/octet-stream" }
      : {
          body: JSON.stringify({ ...HEAT, values: VALUES.map(JSON_TOKEN) }),
          type: "application/json",
        },
  );
  const got = await fetchHeatmap({ run: "train", tag: "dense/kernel", step: 20, stat: "variance" });
  const url = asked[0];
  assert.equal(url.pathname.endsWith("/heatmap"), true);
  assert.equal(url.searchParams.get("format"), "binary");
  assert.equal(url.searchParams.get("max_cells"), String(HEATMAP_MAX_CELLS));
  assert.equal(url.searchParams.get("max_rows"), "1024");
  assert.ok(got.values instanceof Float64Array);
  assert.deepEqual(Array.from(got.values), VALUES);
  // A server that answers JSON (one that does not know format=binary) gives the same object.
  globalThis.fetch = async () =>
    new Response(JSON.stringify({ ...HEAT, values: VALUES.map(JSON_TOKEN) }), {
      headers: { "Content-Type": "application/json" },
    });
  const fromJSON = await fetchHeatmap({
    run: "train",
    tag: "dense/kernel",
    step: 20,
    stat: "variance",
  });
  assert.deepEqual(got, fromJSON);
  assert.equal(got.min, 3.0517578125e-5);
  assert.equal(got.max, 1.25);
});

test("fetchHistogram decodes edges and counts of every step to arrays of numbers", async () => {
  const head = {
    run: "train",
    tag: "dense/kernel",
    stat: "variance",
    label: "variance (unbiased, n/(n-1))",
    scale: "log",
    bins: 3,
    downsampled: false,
    stored_steps: 6,
  };
  const edges = [0.0078125, 0.03125, 0.125, 0.5];
  const series = [
    { step: 0, wall_time: 1.5, counts: [1, 4, 8], nonfinite: 0 },
    { step: 10, wall_time: 2.5, counts: [0, 6, 9], nonfinite: 2 },
  ];
  const binary = layOut(
    {
      ...head,
      edges: { $array: 0 },
      series: series.map((s, i) => ({ ...s, counts: { $array: i + 1 } })),
    },
    [
      { dtype: "float64", shape: [4], values: edges },
      ...series.map((s) => ({ dtype: "uint32", shape: [3], values: s.counts })),
    ],
  );
  stubFetch(() => ({ body: binary, type: "application/octet-stream" }));
  const args = {
    run: "train",
    tag: "dense/kernel",
    stat: "variance",
    step: "all",
    bins: 3,
    scale: "log",
  };
  const got = await fetchHistogram(args);
  assert.deepEqual(got.edges, edges);
  assert.deepEqual(
    got.series,
    series.map((s) => ({ step: s.step, counts: s.counts })),
  );
  assert.ok(Array.isArray(got.series[0].counts));
  stubFetch(() => ({ body: JSON.stringify({ ...head, edges, series }), type: "application/json" }));
  assert.deepEqual(await fetchHistogram(args), got);
});

test("an error answer is an ApiError with the server's message", async () => {
  globalThis.fetch = async () =>
    new Response("Not found: run 'x' has no moments tag 'y'", {
      status: 404,
      headers: { "Content-Type": "text/plain" },
    });
  await assert.rejects(
    fetchHeatmap({ run: "x", tag: "y" }),
    (e) => e instanceof ApiError && e.status === 404 && /no moments tag/.test(e.message),
  );
});
