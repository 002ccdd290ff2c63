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

const numbers = (a) => decodeArray(a ?? []);

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

/** GET tags: {runs: {run: {tag: info}}, model: {run: {steps}}}. */
export async function fetchTags(signal) {
  const d = await getJSON("tags", {}, signal);
  return { runs: d.runs ?? {}, model: d.model ?? {}, groups: d.groups ?? {} };
}

/** GET heatmap: the statistic of one variable at one step, values decoded to a Float64Array. */
export async function fetchHeatmap(
  { run, tag, step, stat, maxRows = 1024, maxCols = 1024 },
  signal,
) {
  const d = await getJSON(
    "heatmap",
    { run, tag, step, stat, max_rows: maxRows, max_cols: maxCols },
    signal,
  );
  return { ...d, values: numbers(d.values), min: decodeNumber(d.min), max: decodeNumber(d.max) };
}

/** GET histogram: {edges, scale, stat, downsampled, stored_steps, series: [{step, counts}]} with numeric edges. */
export async function fetchHistogram(
  { run, tag, stat, step, bins = 30, scale = "linear" },
  signal,
) {
  const d = await getJSON("histogram", { run, tag, stat, step, bins, scale }, signal);
  return {
    ...d,
    edges: Array.from(numbers(d.edges)),
    series: (d.series ?? []).map((s) => ({ step: s.step, counts: Array.from(numbers(s.counts)) })),
  };
}

/**
 * GET series: per-step derived quantities of one variable, or of the model (tag "_model");
 * with `smoothing`, `smoothed` from separately smoothed numerators and denominators.
 */
export async function fetchSeries({ run, tag, smoothing }, signal) {
  const d = await getJSON("series", { run, tag, smoothing }, signal);
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
