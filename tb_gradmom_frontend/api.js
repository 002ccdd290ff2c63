// Fetching from the plugin's routes (docs/http_api.md). The plugin frame's document has
// <base href="plugin/gradmom/"> under /data/, so relative URLs resolve to /data/plugin/gradmom/;
// this module builds them from its own URL instead, which is the same folder and does not
// depend on the frame's base.

import { checkMeta, decodeArray, decodeNumber } from "./core.js";

const BASE = new URL("./", import.meta.url);

/** An error from a route: the HTTP status and the backend's text message. */
export class ApiError extends Error {
  constructor(route, status, message) {
    super(`${route}: ${status} ${message}`);
    this.route = route;
    this.status = status;
  }
}

/** The absolute URL of a route with query parameters (undefined/null parameters left out). */
export function routeURL(route, params = {}) {
  const url = new URL(route, BASE);
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null) url.searchParams.set(k, String(v));
  }
  return url.href;
}

async function getJSON(route, params, signal) {
  const response = await fetch(routeURL(route, params), { signal, cache: "no-store" });
  const text = await response.text();
  if (!response.ok) throw new ApiError(route, response.status, text.trim() || response.statusText);
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ApiError(route, response.status, `response is not JSON (${e.message})`);
  }
}

/**
 * The most cells the tab asks a heatmap for (the server pools bigger variables to block means
 * of at most this many cells; docs/http_api.md, /heatmap `max_cells`): 512 x 512, about twice
 * the width of a heatmap card on a 2560 px screen, so a zoom of 2 still shows served cells.
 */
export const HEATMAP_MAX_CELLS = 512 * 512;

const BINARY_MAGIC = "GMB1";
const BINARY_TYPES = { float32: Float32Array, float64: Float64Array, uint32: Uint32Array };
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

function binaryArray(buffer, view, start, spec) {
  const Type = BINARY_TYPES[spec.dtype];
  if (!Type) throw new Error(`binary payload: unknown dtype ${JSON.stringify(spec.dtype)}`);
  const count = (spec.shape ?? []).reduce((a, b) => a * b, 1);
  const offset = start + spec.offset;
  const size = Type.BYTES_PER_ELEMENT;
  if (!(offset >= start && offset + count * size <= buffer.byteLength))
    throw new Error(`binary payload: array at offset ${spec.offset} runs past the end`);
  if (LITTLE_ENDIAN && offset % size === 0) return new Type(buffer, offset, count);
  const out = new Type(count);
  const get = { float32: "getFloat32", float64: "getFloat64", uint32: "getUint32" }[spec.dtype];
  for (let i = 0; i < count; i++) out[i] = view[get](offset + i * size, true);
  return out;
}

/**
 * Decodes a binary response of /heatmap or /histogram (docs/http_api.md, "Binary responses"):
 * "GMB1", the JSON header's byte length (uint32, little-endian), the header, then the arrays.
 * Returns the header's payload with every {"$array": i} replaced by a typed array
 * (Float32Array, Float64Array or Uint32Array, as sent; NaN and ±Infinity as they are).
 * Throws an Error when the bytes are not such a payload.
 */
export function decodeBinary(buffer) {
  if (!(buffer instanceof ArrayBuffer)) throw new Error("binary payload: expected an ArrayBuffer");
  if (buffer.byteLength < 8) throw new Error("binary payload: shorter than its 8-byte prefix");
  const magic = String.fromCharCode(...new Uint8Array(buffer, 0, 4));
  if (magic !== BINARY_MAGIC)
    throw new Error(`binary payload: starts with ${JSON.stringify(magic)}, not "GMB1"`);
  const view = new DataView(buffer);
  const n = view.getUint32(4, true);
  if (8 + n > buffer.byteLength) throw new Error("binary payload: header runs past the end");
  const head = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 8, n)));
  const arrays = (head.$arrays ?? []).map((spec) => binaryArray(buffer, view, 8 + n, spec));
  delete head.$arrays;
  const walk = (v) => {
    if (Array.isArray(v)) return v.map(walk);
    if (v !== null && typeof v === "object") {
      const keys = Object.keys(v);
      if (keys.length === 1 && keys[0] === "$array") {
        const a = arrays[v.$array];
        if (!a) throw new Error(`binary payload: no array ${v.$array}`);
        return a;
      }
      return Object.fromEntries(keys.map((k) => [k, walk(v[k])]));
    }
    return v;
  };
  return walk(head);
}

/** GET a route's binary form (format=binary); a JSON answer (an older server) is parsed. */
async function getArrays(route, params, signal) {
  const response = await fetch(routeURL(route, { ...params, format: "binary" }), {
    signal,
    cache: "no-store",
  });
  if (!response.ok) {
    const text = await response.text();
    throw new ApiError(route, response.status, text.trim() || response.statusText);
  }
  const type = response.headers.get("Content-Type") ?? "";
  if (type.includes("json")) {
    const text = await response.text();
    try {
      return JSON.parse(text);
    } catch (e) {
      throw new ApiError(route, response.status, `response is not JSON (${e.message})`);
    }
  }
  try {
    return decodeBinary(await response.arrayBuffer());
  } catch (e) {
    throw new ApiError(route, response.status, e.message);
  }
}

// JSON numbers (with "NaN"/"Infinity" tokens) or a typed array of the binary form, as Float64Array.
const numbers = (a) =>
  ArrayBuffer.isView(a)
    ? Float64Array.from(/** @type {ArrayLike<number>} */ (/** @type {unknown} */ (a)))
    : decodeArray(a ?? []);

/**
 * GET meta: the labels, statistic orders, palettes and defaults the tab shows
 * (tb_gradmom.analysis.views.meta), checked (core.checkMeta) and frozen. Fetched once, at start-up;
 * rejects with an ApiError when the route fails, an Error when the payload is not what this
 * tab reads.
 */
export async function fetchMeta(signal) {
  const d = await getJSON("meta", {}, signal);
  try {
    return checkMeta(d);
  } catch (e) {
    throw new Error(`meta: unexpected payload, ${e.message}`);
  }
}

/**
 * GET tags: {runs: {run: {tag: info}}, model: {run: {steps}}, groups, writers}; `writers`: the
 * runs written by several summary writers, {run: {count, sources, steps, message}}.
 */
export async function fetchTags(signal) {
  const d = await getJSON("tags", {}, signal);
  return {
    runs: d.runs ?? {},
    model: d.model ?? {},
    groups: d.groups ?? {},
    writers: d.writers ?? {},
  };
}

/**
 * GET heatmap (binary form): the statistic of one variable at one step, pooled by the server to
 * at most maxRows x maxCols and maxCells cells, values decoded to a Float64Array.
 */
export async function fetchHeatmap(
  { run, tag, step, stat, maxRows = 1024, maxCols = 1024, maxCells = HEATMAP_MAX_CELLS },
  signal,
) {
  const d = await getArrays(
    "heatmap",
    { run, tag, step, stat, max_rows: maxRows, max_cols: maxCols, max_cells: maxCells },
    signal,
  );
  return { ...d, values: numbers(d.values), min: decodeNumber(d.min), max: decodeNumber(d.max) };
}

/**
 * GET histogram (binary form): {edges, scale, stat, downsampled, stored_steps, series: [{step,
 * counts}]} with edges and counts as arrays of numbers.
 */
export async function fetchHistogram(
  { run, tag, stat, step, bins = 30, scale = "linear" },
  signal,
) {
  const d = await getArrays("histogram", { run, tag, stat, step, bins, scale }, signal);
  return {
    ...d,
    edges: Array.from(numbers(d.edges)),
    series: (d.series ?? []).map((s) => ({ step: s.step, counts: Array.from(numbers(s.counts)) })),
  };
}

/**
 * GET series: per-step derived quantities of one variable, or of the model (tag "_model"), or
 * (`over: "layer"`) of the layer of variable `tag`: its variables' sums added;
 * with `smoothing`, `smoothed` from separately smoothed numerators and denominators.
 */
export async function fetchSeries({ run, tag, smoothing, over }, signal) {
  const d = await getJSON("series", { run, tag, smoothing, over }, signal);
  const values = {};
  for (const [k, v] of Object.entries(d.values ?? {})) values[k] = Array.from(numbers(v));
  const decoded = (part) =>
    part
      ? Object.fromEntries(Object.entries(part).map(([k, v]) => [k, Array.from(numbers(v))]))
      : null;
  const smoothed = decoded(d.smoothed);
  const smoothedSE = decoded(d.smoothed_se);
  return {
    ...d,
    steps: d.steps ?? [],
    wall_times: Array.from(numbers(d.wall_times)),
    values,
    smoothed,
    smoothed_se: smoothedSE,
  };
}

function summaryRow(r, numeric) {
  const out = { ...r };
  // null is "not available" (shown as a dash), "NaN"/"Infinity" are numbers.
  for (const k of numeric) if (k in out && out[k] !== null) out[k] = decodeNumber(out[k]);
  for (const part of ["smoothed", "smoothed_se"])
    if (out[part])
      out[part] = Object.fromEntries(
        Object.entries(out[part]).map(([k, v]) => [k, decodeNumber(v)]),
      );
  return out;
}

/**
 * GET summary: one row per variable at a step, and the whole model's row (or null). `numeric`
 * names the fields to decode as numbers (core.summaryNumericKeys of /meta); with `smoothing`
 * each row has `smoothed` and `smoothed_se` (the curves' values at that step).
 */
export async function fetchSummary({ run, step, group, numeric, smoothing }, signal) {
  const d = await getJSON("summary", { run, step, group, smoothing }, signal);
  return {
    ...d,
    rows: (d.rows ?? []).map((r) => summaryRow(r, numeric)),
    model: d.model ? summaryRow(d.model, numeric) : null,
  };
}

/** The URL of the backend's export route (the server-side raw data: npy and friends). */
export function exportURL(params) {
  return routeURL("export", params);
}

// ---------------------------------------------------------------------------- per-example norms

/** @param {any} a */
const plain = (a) => Array.from(numbers(a));

/**
 * GET examples/tags: {runs: {run: {tag: info}}, skipped, view}: the runs with per-example norms
 * (also those without moments) and what the per-example view shows (its quantiles, bands,
 * defaults and explanations, from tb_gradmom.analysis.examples.view_info).
 */
export async function fetchExamplesTags(signal) {
  const d = await getJSON("examples/tags", {}, signal);
  return { runs: d.runs ?? {}, skipped: d.skipped ?? {}, view: d.view ?? null };
}

/**
 * GET examples/quantiles: per step the quantiles of the per-example gradient norm, the max and
 * the mean squared norm (numbers decoded).
 */
export async function fetchExampleQuantiles({ run, tag, column }, signal) {
  const d = await getJSON("examples/quantiles", { run, tag, column }, signal);
  const quantiles = {};
  for (const [k, v] of Object.entries(d.quantiles ?? {})) quantiles[k] = plain(v);
  return { ...d, quantiles, max: plain(d.max), mean_sq: plain(d.mean_sq) };
}

/** GET examples/histogram: the norms at one step on log-spaced bins. */
export async function fetchExampleHistogram({ run, tag, column, step }, signal) {
  const d = await getJSON("examples/histogram", { run, tag, column, step }, signal);
  return { ...d, edges: plain(d.edges), counts: plain(d.counts) };
}

const OUTLIER_NUMBERS = ["max_ratio", "mean_ratio", "last_ratio", "last_loss"];

/** GET examples/outliers: the outlier examples by id (ids kept as sent: numbers or strings). */
export async function fetchExampleOutliers({ run, tag, column, threshold }, signal) {
  const d = await getJSON("examples/outliers", { run, tag, column, threshold }, signal);
  const rows = (d.rows ?? []).map((/** @type {any} */ r) => {
    const out = { ...r };
    for (const k of OUTLIER_NUMBERS) out[k] = decodeNumber(r[k]);
    return out;
  });
  return { ...d, rows, medians: plain(d.medians) };
}

/** GET examples/clip: per step the fraction of examples whose norm exceeds `clipNorm`. */
export async function fetchExampleClip({ run, tag, column, clipNorm }, signal) {
  const d = await getJSON("examples/clip", { run, tag, column, clip_norm: clipNorm }, signal);
  return { ...d, fraction: plain(d.fraction), clipped: plain(d.clipped) };
}
