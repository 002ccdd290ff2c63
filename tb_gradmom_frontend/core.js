// @ts-check
// Pure functions of the Grad Moments tab: no DOM, no fetch. Tested with `node --test`.
//
// Colour maps and scales, tick choice, pooling, histogram binning, index arithmetic for the
// 2-D view of a variable, CSV and SVG text, sorting and filtering. The views draw with these;
// the browser tests compute expected colours with the same lookup tables. Labels, statistic
// orders, signs, run colours and defaults are not here: the backend serves them (GET /meta,
// tb_gradmom.analysis.views.meta) and the functions that need them take that payload as `meta`.

import { COLORMAP_HEX } from "./colormaps.js";

// ---------------------------------------------------------------------------------------------
// Decoding the backend's JSON numbers (non-finite as "NaN"/"Infinity"/"-Infinity", null: n/a).

/** One JSON value from the backend as a number: null -> NaN, "Infinity" -> Infinity. */
export function decodeNumber(v) {
  if (v === null || v === undefined) return NaN;
  if (typeof v === "number") return v;
  if (v === "Infinity" || v === "inf" || v === "+Infinity") return Infinity;
  if (v === "-Infinity" || v === "-inf") return -Infinity;
  if (v === "NaN" || v === "nan") return NaN;
  const x = Number(v);
  return Number.isNaN(x) ? NaN : x;
}

/** An array of backend JSON values as a Float64Array. */
export function decodeArray(values) {
  const out = new Float64Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = decodeNumber(values[i]);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Colour maps.

export const COLORMAPS = Object.freeze(Object.keys(COLORMAP_HEX));
const lutCache = new Map();

/** The 256-entry lookup table of a colour map: Uint8Array of 768 bytes (r, g, b per entry). */
export function colormapLUT(name) {
  if (!(name in COLORMAP_HEX)) {
    throw new Error(
      `unknown colour map ${JSON.stringify(name)}; expected one of ${COLORMAPS.join(", ")}`,
    );
  }
  let lut = lutCache.get(name);
  if (!lut) {
    const hex = COLORMAP_HEX[name];
    lut = new Uint8Array(hex.length / 2);
    for (let i = 0; i < lut.length; i++) lut[i] = parseInt(hex.substr(2 * i, 2), 16);
    lutCache.set(name, lut);
  }
  return lut;
}

/** Index into a 256-entry LUT for t in [0, 1] (matplotlib's rule: floor(t * 256), clamped). */
export function lutIndex(t) {
  return Math.max(0, Math.min(255, Math.floor(t * 256)));
}

/** The [r, g, b] of the normalised value t in a colour map; null for NaN. */
export function colormapColor(name, t) {
  if (!Number.isFinite(t)) return null;
  const lut = colormapLUT(name);
  const i = 3 * lutIndex(t);
  return [lut[i], lut[i + 1], lut[i + 2]];
}

export function rgbHex([r, g, b]) {
  return "#" + [r, g, b].map((c) => c.toString(16).padStart(2, "0")).join("");
}

/**
 * The domain of a colour (or axis) scale over values: [min, max] of the finite values, for a
 * log scale of the finite positive values. null when there is none.
 */
export function finiteExtent(values, scale = "linear") {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (!Number.isFinite(v) || (scale === "log" && !(v > 0))) continue;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return lo <= hi ? [lo, hi] : null;
}

/**
 * A normaliser v -> t in [0, 1] for a linear or log scale over domain [lo, hi]. Values outside
 * the domain give t outside [0, 1] (the LUT clamps them); values a log scale cannot show (<= 0)
 * and NaN give NaN. A constant domain maps every value to 0.5.
 */
export function normalizer(domain, scale = "linear") {
  if (scale !== "linear" && scale !== "log") {
    throw new Error(`unknown scale ${JSON.stringify(scale)}; expected "linear" or "log"`);
  }
  if (!domain) return () => NaN;
  const f = scale === "log" ? Math.log10 : (x) => x;
  const lo = f(domain[0]);
  const hi = f(domain[1]);
  const span = hi - lo;
  return (v) => {
    if (Number.isNaN(v) || (scale === "log" && !(v > 0))) return NaN;
    if (v === Infinity) return 1;
    if (v === -Infinity) return 0;
    return span > 0 ? (f(v) - lo) / span : 0.5;
  };
}

/**
 * RGBA pixels (Uint8ClampedArray, 4 bytes per value) for values under a colour map and a
 * normaliser; values with no colour get `missing` [r, g, b, a] (NaN) or `nonPositive` (a value
 * <= 0 on a log scale; default: `missing`), so that the two stay distinguishable.
 */
export function colorize(values, name, normalize, missing = [0, 0, 0, 0], nonPositive = missing) {
  const lut = colormapLUT(name);
  const out = new Uint8ClampedArray(values.length * 4);
  for (let k = 0; k < values.length; k++) {
    const t = normalize(values[k]);
    const o = 4 * k;
    if (Number.isNaN(t)) {
      const c = Number.isNaN(values[k]) ? missing : nonPositive;
      out[o] = c[0];
      out[o + 1] = c[1];
      out[o + 2] = c[2];
      out[o + 3] = c[3];
    } else {
      const i = 3 * lutIndex(t);
      out[o] = lut[i];
      out[o + 1] = lut[i + 1];
      out[o + 2] = lut[i + 2];
      out[o + 3] = 255;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Ticks.

const E10 = Math.sqrt(50);
const E5 = Math.sqrt(10);
const E2 = Math.sqrt(2);

/** The "nice" step (1, 2 or 5 times a power of ten) for about `count` ticks over [lo, hi]. */
export function tickStep(lo, hi, count = 5) {
  const raw = Math.abs(hi - lo) / Math.max(1, count);
  if (!(raw > 0) || !Number.isFinite(raw)) return 0;
  const power = Math.floor(Math.log10(raw));
  const error = raw / 10 ** power;
  const factor = error >= E10 ? 10 : error >= E5 ? 5 : error >= E2 ? 2 : 1;
  return factor * 10 ** power;
}

/**
 * About `count` nice linear ticks inside [lo, hi]: multiples of tickStep, computed as integer
 * multiples so that 0.1 + 0.2 style errors do not show (0.30000000000000004).
 */
export function niceTicks(lo, hi, count = 5) {
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) return [];
  if (lo > hi) [lo, hi] = [hi, lo];
  if (lo === hi) return [lo];
  const step = tickStep(lo, hi, count);
  if (!(step > 0)) return [lo];
  const power = Math.floor(Math.log10(step));
  const decimals = Math.max(0, -power);
  const i0 = Math.ceil(lo / step - 1e-9);
  const i1 = Math.floor(hi / step + 1e-9);
  const ticks = [];
  for (let i = i0; i <= i1; i++) ticks.push(Number((i * step).toFixed(decimals)));
  return ticks;
}

/** The domain [lo, hi] widened to multiples of the nice tick step (as d3's scale.nice()). */
export function niceDomain(lo, hi, count = 5) {
  const step = tickStep(lo, hi, count);
  if (!(step > 0)) return [lo, hi];
  return [Math.floor(lo / step) * step, Math.ceil(hi / step) * step];
}

/**
 * Ticks for a log scale over [lo, hi] (lo > 0): the powers of ten inside, thinned to at most
 * `count`; with fewer than two decades inside, 1-2-5 multiples as well.
 */
export function logTicks(lo, hi, count = 6) {
  if (!(lo > 0) || !(hi > 0)) return [];
  if (lo > hi) [lo, hi] = [hi, lo];
  const e0 = Math.ceil(Math.log10(lo) - 1e-9);
  const e1 = Math.floor(Math.log10(hi) + 1e-9);
  const inside = (v) => v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9);
  if (e1 - e0 + 1 >= 2) {
    const every = Math.max(1, Math.ceil((e1 - e0 + 1) / count));
    const ticks = [];
    for (let e = e0; e <= e1; e++) if ((e - e0) % every === 0) ticks.push(Number(`1e${e}`));
    return ticks;
  }
  const ticks = [];
  for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
    for (const m of [1, 2, 5]) {
      const v = Number(`${m}e${e}`);
      if (inside(v)) ticks.push(v);
    }
  }
  return ticks.length ? ticks : niceTicks(lo, hi, 3).filter((v) => v > 0);
}

// SI suffixes for 1e3 .. 1e15 (k, M, G, T, P); beyond, and below 0.01, scientific notation.
const SI = ["", "k", "M", "G", "T", "P"];

/**
 * A number as the tab writes it everywhere (tables, tooltips, axis ticks, figures): `digits`
 * significant digits; from 0.01 to below 1000 plainly (12.35, 0.03135), from 1000 with an SI
 * suffix (8.545k, -142.8k, 3.2M), below 0.01 and from 1e18 in scientific notation (3.135e-3).
 * `trim` drops trailing zeros (ticks: "1.5k"; tables keep them, "1.500k", so a column's
 * numbers have one precision). `integer` writes whole numbers (sizes, batch sizes) in full
 * with thin-space thousands ("4 608"). NaN is "NaN", infinities "∞" and "-∞", null "–".
 */
export function formatNumber(v, { digits = 4, trim = false, integer = false } = {}) {
  if (v === null || v === undefined) return "–";
  if (Number.isNaN(v)) return "NaN";
  if (v === Infinity) return "∞";
  if (v === -Infinity) return "-∞";
  if (v === 0) return "0";
  const cut = (text) => (trim && text.includes(".") ? text.replace(/\.?0+$/, "") : text);
  if (integer && Number.isInteger(v) && Math.abs(v) < 1e15) {
    const text = String(Math.abs(v)).replace(/\B(?=(\d{3})+(?!\d))/g, "\u2009");
    return `${v < 0 ? "-" : ""}${text}`;
  }
  const rounded = Number(v.toPrecision(digits));
  const a = Math.abs(rounded);
  if (a >= 0.01 && a < 1e3) return cut(rounded.toPrecision(digits));
  if (a >= 1e3 && a < 1e18) {
    const k = Math.min(SI.length - 1, Math.floor(Math.log10(a) / 3 + 1e-12));
    if (k < SI.length && a < 10 ** (3 * k + 3)) {
      const m = Number((rounded / 10 ** (3 * k)).toPrecision(digits));
      if (Math.abs(m) < 1000) return `${cut(m.toPrecision(digits))}${SI[k]}`;
    }
  }
  const [m, e] = rounded.toExponential(digits - 1).split("e");
  return `${cut(m)}e${Number(e)}`;
}

/** An axis tick: formatNumber with 3 significant digits and no trailing zeros ("25k", "1e-7"). */
export function formatTick(v) {
  return formatNumber(v, { digits: 3, trim: true });
}

/** A value for tooltips: formatNumber (`digits` significant digits, trailing zeros kept). */
export function formatValue(v, digits = 4) {
  return formatNumber(v, { digits });
}

/**
 * What an estimate is: "undefined" (NaN: no variance, no loss logged, ...), "noise-dominated"
 * (a positive-only statistic, such as the noise scale or a batch size, that came out <= 0 or
 * infinite: its denominator's estimate is <= 0, docs/math.md), "missing" (null: not logged at
 * this step) or "value".
 */
export function estimateStatus(v, positiveOnly = false) {
  if (v === null || v === undefined) return "missing";
  if (Number.isNaN(v)) return "undefined";
  if (!Number.isFinite(v) || (positiveOnly && v <= 0)) return "noise-dominated";
  return "value";
}

/**
 * An estimate as text, the same in the table, the tooltips and the exports: its number by
 * formatNumber, or "noise-dominated" / "undefined" / "–" (estimateStatus); with `se` (a
 * standard error) "1.234k ± 56.70".
 */
export function formatEstimate(v, { positiveOnly = false, digits = 4, se = null } = {}) {
  const status = estimateStatus(v, positiveOnly);
  if (status === "missing") return "–";
  if (status !== "value") return status;
  const text = formatNumber(v, { digits });
  return Number.isFinite(se) ? `${text} ± ${formatNumber(se, { digits: 2 })}` : text;
}

// ---------------------------------------------------------------------------------------------
// The 2-D view of a variable, pooling and indices.

/** The 2-D view of a shape (all axes but the last become rows), as metadata.to_2d_shape. */
export function to2dShape(shape) {
  if (shape.length === 0) return [1, 1];
  if (shape.length === 1) return [1, shape[0]];
  return [shape.slice(0, -1).reduce((a, b) => a * b, 1), shape[shape.length - 1]];
}

/** The multi-dimensional index of a flat row-major index into `shape`. */
export function unravelIndex(flat, shape) {
  const index = new Array(shape.length);
  for (let d = shape.length - 1; d >= 0; d--) {
    index[d] = flat % shape[d];
    flat = Math.floor(flat / shape[d]);
  }
  return index;
}

/**
 * The original element(s) behind cell (i, j) of a displayed grid.
 *
 * `shape` is the variable's shape, `block` [br, bc] how many rows/columns of its 2-D view one
 * displayed cell averages. Returns {rows: [r0, r1], cols: [c0, c1]} (inclusive ranges in the
 * 2-D view) and, for a single element, `index`: its index in the variable (a conv kernel's
 * row r is (i * kw + j) * cin + c, so [i, j, c, col]).
 */
export function cellElements(i, j, shape, block = [1, 1]) {
  const [R, C] = to2dShape(shape);
  const [br, bc] = block;
  const rows = [i * br, Math.min((i + 1) * br, R) - 1];
  const cols = [j * bc, Math.min((j + 1) * bc, C) - 1];
  const out = { rows, cols, index: null };
  if (rows[0] === rows[1] && cols[0] === cols[1]) {
    if (shape.length === 0) out.index = [];
    else if (shape.length === 1) out.index = [cols[0]];
    else out.index = [...unravelIndex(rows[0], shape.slice(0, -1)), cols[0]];
  }
  return out;
}

/** Text for cellElements: "[1, 2, 0, 3]" or "rows 0–3, cols 4–7". */
export function describeCell(cell) {
  if (cell.index) return `[${cell.index.join(", ")}]`;
  const range = (a, b) => (a === b ? `${a}` : `${a}–${b}`);
  return `rows ${range(...cell.rows)}, cols ${range(...cell.cols)}`;
}

/**
 * NaN-aware block means of a row-major grid, so that it has at most maxRows x maxCols cells.
 * Returns {values, rows, cols, block: [br, bc]}; a block of only NaN is NaN, +-Inf propagate.
 */
export function poolGrid(values, rows, cols, maxRows, maxCols) {
  const br = Math.max(1, Math.ceil(rows / maxRows));
  const bc = Math.max(1, Math.ceil(cols / maxCols));
  if (br === 1 && bc === 1) return { values: Float64Array.from(values), rows, cols, block: [1, 1] };
  const pr = Math.ceil(rows / br);
  const pc = Math.ceil(cols / bc);
  const sum = new Float64Array(pr * pc);
  const count = new Uint32Array(pr * pc);
  for (let r = 0; r < rows; r++) {
    const pi = Math.floor(r / br) * pc;
    for (let c = 0; c < cols; c++) {
      const v = values[r * cols + c];
      if (Number.isNaN(v)) continue;
      const k = pi + Math.floor(c / bc);
      sum[k] += v;
      count[k] += 1;
    }
  }
  const out = new Float64Array(pr * pc);
  for (let k = 0; k < out.length; k++) out[k] = count[k] ? sum[k] / count[k] : NaN;
  return { values: out, rows: pr, cols: pc, block: [br, bc] };
}

// ---------------------------------------------------------------------------------------------
// Histograms.

/**
 * Bin edges for `bins` equal-width bins over [lo, hi] (log: equal width in log10). A constant
 * range is widened by 0.5 (linear) or a factor sqrt(10) (log) either side.
 */
export function binEdges(lo, hi, bins = 30, scale = "linear") {
  if (scale === "log") {
    let a = Math.log10(lo);
    let b = Math.log10(hi);
    if (a === b) [a, b] = [a - 0.5, b + 0.5];
    return Array.from({ length: bins + 1 }, (_, k) => 10 ** (a + ((b - a) * k) / bins));
  }
  if (lo === hi) [lo, hi] = [lo - 0.5, hi + 0.5];
  return Array.from({ length: bins + 1 }, (_, k) => lo + ((hi - lo) * k) / bins);
}

/**
 * Counts of values in bins with the given edges: bin k is [edges[k], edges[k+1]), the last bin
 * includes its right edge. Values outside the edges, NaN and (log) values <= 0 are not counted;
 * `dropped` says how many.
 */
export function binCounts(values, edges, scale = "linear") {
  const bins = edges.length - 1;
  const counts = new Array(bins).fill(0);
  let dropped = 0;
  const f = scale === "log" ? Math.log10 : (x) => x;
  const lo = f(edges[0]);
  const hi = f(edges[bins]);
  for (const v of values) {
    if (!Number.isFinite(v) || (scale === "log" && !(v > 0))) {
      dropped++;
      continue;
    }
    const x = f(v);
    if (x < lo || x > hi) {
      dropped++;
      continue;
    }
    // Locate by arithmetic, then correct against the exact edges (rounding at bin borders).
    let k = Math.min(bins - 1, Math.floor(((x - lo) / (hi - lo)) * bins));
    while (k > 0 && v < edges[k]) k--;
    while (k < bins - 1 && v >= edges[k + 1]) k++;
    counts[k]++;
  }
  return { counts, dropped };
}

/** A histogram of values: {edges, counts, dropped}, edges over the finite (positive) range. */
export function histogram(values, bins = 30, scale = "linear") {
  const extent = finiteExtent(values, scale);
  if (!extent) return { edges: [], counts: [], dropped: values.length };
  const edges = binEdges(extent[0], extent[1], bins, scale);
  return { edges, ...binCounts(values, edges, scale) };
}

/**
 * The steps a histogram payload shows, for its subtitle: "step 40", "steps 0–40", or, when the
 * server binned a sample of the steps (`downsampled`), "134 of 500 steps in 0–499 (a sample)".
 */
export function histogramStepsLabel(data, mode = "steps") {
  const steps = (data.series ?? []).map((s) => s.step).sort((a, b) => a - b);
  if (!steps.length) return "no steps";
  if (mode !== "steps") return `step ${steps[steps.length - 1]}`;
  const range = `${steps[0]}–${steps[steps.length - 1]}`;
  if (!data.downsampled) return `steps ${range}`;
  const of = Number.isFinite(data.stored_steps) ? ` of ${data.stored_steps}` : "";
  return `${steps.length}${of} steps in ${range} (a sample)`;
}

// ---------------------------------------------------------------------------------------------
// Text out: CSV and SVG.

/** One CSV field (RFC 4180): numbers in full precision, NaN/Inf spelled out, quoted if needed. */
export function csvField(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number") {
    if (Number.isNaN(v)) return "NaN";
    if (v === Infinity) return "Infinity";
    if (v === -Infinity) return "-Infinity";
    return String(v);
  }
  const s = String(v);
  return /[",\r\n]|^\s|\s$/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

/** CSV text from a header and rows (arrays), CRLF line ends as RFC 4180 says. */
export function toCSV(header, rows) {
  const lines = [header.map(csvField).join(",")];
  for (const row of rows) lines.push(row.map(csvField).join(","));
  return lines.join("\r\n") + "\r\n";
}

/** Text escaped for XML/SVG character data and attribute values. */
export function escapeXML(s) {
  return String(s)
    .replace(/&/g, "&amp;")
    .replace(/</g, "&lt;")
    .replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;")
    .replace(/'/g, "&apos;");
}

/** An SVG element as text; attribute values and string children are escaped. */
export function svgElement(tag, attrs = {}, children = []) {
  const a = Object.entries(attrs)
    .filter(([, v]) => v !== null && v !== undefined)
    .map(([k, v]) => ` ${k}="${escapeXML(v)}"`)
    .join("");
  const body = (Array.isArray(children) ? children : [children])
    .map((c) => (c && typeof c === "object" && "svg" in c ? c.svg : escapeXML(c)))
    .join("");
  return { svg: `<${tag}${a}>${body}</${tag}>` };
}

/** A standalone SVG file from serialised markup of an <svg> element (adds the XML prolog). */
export function svgDocument(markup) {
  let m = markup.trim();
  if (!/^<svg[^>]*\sxmlns=/.test(m))
    m = m.replace(/^<svg/, '<svg xmlns="http://www.w3.org/2000/svg"');
  return `<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n${m}\n`;
}

/**
 * An SVG path "M x,y L ..." through points; points with a non-finite coordinate break the line
 * into separate pieces.
 */
export function linePath(points) {
  let d = "";
  let pen = false;
  for (const [x, y] of points) {
    if (!Number.isFinite(x) || !Number.isFinite(y)) {
      pen = false;
      continue;
    }
    d += `${pen ? "L" : "M"}${+x.toFixed(2)},${+y.toFixed(2)}`;
    pen = true;
  }
  return d;
}

/** FNV-1a (32 bits) of the UTF-8 bytes of `text`, as 8 hex digits (as encode._fnv1a). */
function fnv1a(text) {
  let h = 0x811c9dc5;
  for (const b of new TextEncoder().encode(text)) {
    h = Math.imul(h ^ b, 0x01000193) >>> 0;
  }
  return h.toString(16).padStart(8, "0");
}

/**
 * A file name from parts, by the rule of tb_gradmom.analysis.encode.file_name (checked on shared cases,
 * tests/js/file_names.json): each part's runs of characters outside [A-Za-z0-9._-] become "_",
 * leading and trailing ".", "_", "-" go (the root run "." drops out), the non-empty parts are
 * joined by "-"; a name over 255 bytes keeps its start and ends with a hash of the whole stem.
 */
export function fileName(parts, ext, maxBytes = 255) {
  const stem =
    parts
      .filter((p) => p !== null && p !== undefined)
      .map((p) =>
        String(p)
          .replace(/[^A-Za-z0-9._-]+/g, "_")
          .replace(/^[._-]+|[._-]+$/g, ""),
      )
      .filter(Boolean)
      .join("-") || "gradmom";
  const suffix = `.${ext}`;
  if (stem.length + suffix.length <= maxBytes) return stem + suffix;
  const keep = Math.max(1, maxBytes - suffix.length - 1 - 8);
  return `${stem.slice(0, keep)}-${fnv1a(stem)}${suffix}`;
}

// ---------------------------------------------------------------------------------------------
// What the backend says the tab shows: GET /meta (tb_gradmom.analysis.views.meta, docs/http_api.md).
// The tab keeps no copy of a label, an order, a palette or a default; the node tests read the
// same payload from tests/js/meta.json (checked against views.meta() by a Python test).

/** The keys of /meta the tab reads, and what each must be. */
const META_SHAPE = Object.freeze({
  version: "number",
  element_statistics: "array",
  statistics: "object",
  statistic_groups: "object",
  summary_statistics: "array",
  series_keys: "array",
  series_names: "object",
  positive_only: "array",
  default_smoothing: "number",
  run_palette: "object",
  landing: "object",
});

const kindOf = (v) => (Array.isArray(v) ? "array" : v === null ? "null" : typeof v);

/**
 * The /meta payload, checked and frozen: throws an Error naming every key that is missing or
 * of the wrong kind (an older or newer backend than this tab), so the tab can say so instead
 * of drawing with half its labels.
 */
export function checkMeta(meta) {
  if (kindOf(meta) !== "object") throw new Error(`expected an object, got ${kindOf(meta)}`);
  const problems = [];
  for (const [key, kind] of Object.entries(META_SHAPE)) {
    if (kindOf(meta[key]) !== kind) problems.push(`${key} (${kind}, got ${kindOf(meta[key])})`);
  }
  if (!problems.length) {
    const bad = meta.element_statistics.filter(
      (s) => typeof s?.key !== "string" || typeof s.label !== "string" || !Array.isArray(s.orders),
    );
    if (bad.length || !meta.element_statistics.length)
      problems.push("element_statistics (objects with key, label, orders)");
    for (const theme of ["light", "dark"])
      if (!meta.run_palette[theme]?.length) problems.push(`run_palette.${theme} (colours)`);
    for (const key of ["stat", "curve", "sort"])
      if (typeof meta.landing[key] !== "string") problems.push(`landing.${key} (string)`);
  }
  if (problems.length) throw new Error(`missing or invalid: ${problems.join(", ")}`);
  return deepFreeze(meta);
}

function deepFreeze(v) {
  if (v && typeof v === "object" && !Object.isFrozen(v)) {
    Object.freeze(v);
    for (const x of Object.values(v)) deepFreeze(x);
  }
  return v;
}

/** The /meta entry of an element-wise statistic ({key, label, orders, signed, ...}), or null. */
export function elementStat(stat, meta) {
  return meta.element_statistics.find((s) => s.key === stat) ?? null;
}

/** A statistic's readable label, naming which variance it uses (reductions.STAT_LABELS). */
export function statLabel(stat, meta) {
  return elementStat(stat, meta)?.label ?? stat;
}

/** The statistics computable from the stored moment orders, in display order. */
export function availableStats(orders, meta) {
  const have = new Set(orders);
  return meta.element_statistics
    .filter((s) => s.orders.every((o) => have.has(o)))
    .map((s) => s.key);
}

/** Whether a statistic takes both signs (a diverging colour map centred on zero). */
export function isSigned(stat, meta) {
  return !!elementStat(stat, meta)?.signed;
}

/**
 * The colour scale and map a statistic opens with: log for the non-negative ones (variances
 * span decades; log shows dead filters at once), a linear diverging map for signed ones.
 */
export function defaultView(stat, meta) {
  const signed = isSigned(stat, meta);
  const known = meta.element_statistics.find((e) => e.key === stat)?.default_scale;
  const scale = known ?? (signed ? "linear" : "log");
  // Histograms open on the heatmap's scale: log x for variances (they span decades).
  return { scale, colormap: signed ? "rdbu_r" : "viridis", histLog: scale === "log" };
}

/**
 * How to bin the histograms of a variable of `size` elements: `bins` by the Rice rule
 * (2 size^(1/3), between 4 and `maxBins`: a 4-element bias gets 4 bins, not 30 mostly empty
 * ones) and at most `ridges` steps in the all-steps view (twice the elements, between 8 and
 * `maxRidges`: a handful of values per ridge reads badly in 40 overlapping outlines).
 */
export function histogramPlan(size, maxBins = 30, maxRidges = 40) {
  const n = Math.max(1, Math.floor(size) || 1);
  const bins = Math.max(4, Math.min(maxBins, Math.ceil(2 * Math.cbrt(n))));
  const ridges = Math.max(8, Math.min(maxRidges, 2 * n));
  return { bins, ridges };
}

/** The run colours (TensorBoard's palette, light or dark), assigned in sorted run order. */
export function runColors(runs, meta, dark = false) {
  const palette = meta.run_palette[dark ? "dark" : "light"];
  const sorted = [...runs].sort();
  return new Map(sorted.map((r, k) => [r, palette[k % palette.length]]));
}

/**
 * What a /series quantity is: a derived statistic's explanation (stats.STATISTICS: name,
 * meaning, formula, unit, ...), else {name, unit} of the logged quantities (batch size, loss,
 * learning rate), else its key as its name.
 */
export function seriesInfo(key, meta) {
  return meta.statistics[key] ?? meta.series_names[key] ?? { name: key, unit: "" };
}

/**
 * The quantities the curves' select offers, in order: the derived statistics (display
 * order), then the other /series quantities but the loss (drawn in its own plot).
 */
export function curveChoices(meta) {
  const stats = Object.keys(meta.statistics);
  const rest = meta.series_keys.filter((k) => !stats.includes(k) && k !== "loss");
  return [...stats, ...rest];
}

/**
 * The curves' quantities grouped by what they are, in display order: one entry per kind of
 * statistic of /meta's statistic_groups ({key, name, description, keys}), then the logged
 * quantities (batch size, learning rate; not the loss, drawn in its own plot).
 */
export function curveGroups(meta) {
  const groups = Object.entries(meta.statistic_groups ?? {}).map(([key, g]) => ({
    key,
    name: g.name,
    description: g.description,
    keys: Object.keys(meta.statistics).filter((k) => meta.statistics[k].group === key),
  }));
  const grouped = new Set(groups.flatMap((g) => g.keys));
  const rest = curveChoices(meta).filter((k) => !grouped.has(k));
  if (rest.length)
    groups.push({
      key: "logged",
      name: "Logged with the moments",
      description: "",
      keys: rest,
    });
  return groups.filter((g) => g.keys.length);
}

/** A quantity's name with its symbol: "Gradient noise scale Bₛᵢₘₚₗₑ" (no code names). */
export function seriesTitle(key, meta) {
  const st = seriesInfo(key, meta);
  return st.symbol && !st.name.includes(st.symbol) ? `${st.name} ${st.symbol}` : st.name;
}

/** An axis label: the short name, symbol and unit, "noise scale Bₛᵢₘₚₗₑ [examples]". */
export function axisLabel(key, meta) {
  const st = seriesInfo(key, meta);
  const short = st.short ?? st.name;
  const symbol =
    st.symbol && st.symbol !== short && !short.includes(st.symbol) ? ` ${st.symbol}` : "";
  const unit = st.unit ? ` [${st.unit.replace(/ \(.*\)$/, "")}]` : "";
  return `${short}${symbol}${unit}`;
}

/** Whether a curve's values <= 0 mean "noise-dominated" (marked, not drawn). */
export function isPositiveOnly(key, meta) {
  return meta.positive_only.includes(key);
}

/**
 * A /summary row as the table shows it: each statistic (meta.summary_statistics) is its
 * smoothed value when the row has one (/summary?smoothing=: the curves' value at that step),
 * else its per-step value; `perStep` and `se` keep the per-step values and the standard
 * errors (NaN without smoothing).
 */
export function tableRow(row, meta) {
  const out = { ...row, perStep: {}, se: {} };
  for (const k of meta.summary_statistics) {
    out.perStep[k] = row[k];
    out.se[k] = row.smoothed_se?.[k] ?? NaN;
    if (row.smoothed) out[k] = row.smoothed[k];
  }
  return out;
}

/** The numeric fields of a /summary row: its size and batch size, and the statistics. */
export function summaryNumericKeys(meta) {
  return ["size", "batch_size", ...meta.summary_statistics];
}

// ---------------------------------------------------------------------------------------------
// Runs, tags, steps, tables.

/**
 * Tags matching a regular expression, case-insensitive as in TensorBoard's tag filter.
 * Returns {tags, error}: with an invalid pattern, all tags and the error message.
 */
export function filterTags(tags, pattern) {
  if (!pattern) return { tags: [...tags], error: null };
  let re;
  try {
    re = new RegExp(pattern, "i");
  } catch (e) {
    return { tags: [...tags], error: e.message };
  }
  return { tags: tags.filter((t) => re.test(t)), error: null };
}

/** The step to show for a wanted step: the last one <= wanted, else the first; null if none. */
export function nearestStep(steps, wanted) {
  if (!steps.length) return null;
  if (wanted === null || wanted === undefined) return steps[steps.length - 1];
  let best = null;
  for (const s of steps) if (s <= wanted && (best === null || s > best)) best = s;
  return best === null ? Math.min(...steps) : best;
}

/**
 * Rows sorted by a key, ascending or descending; missing and NaN values last either way,
 * strings by locale order.
 */
export function sortRows(rows, key, descending = false) {
  const missing = (v) =>
    v === null || v === undefined || (typeof v === "number" && Number.isNaN(v));
  return [...rows].sort((a, b) => {
    const x = a[key];
    const y = b[key];
    if (missing(x) || missing(y)) return Number(missing(x)) - Number(missing(y));
    const c =
      typeof x === "string" || typeof y === "string" ? String(x).localeCompare(String(y)) : x - y;
    return descending ? -c : c;
  });
}

/** Colours of the plots for TensorBoard's light and dark themes (attributes, for export). */
export const THEMES = Object.freeze({
  light: {
    background: "#ffffff",
    text: "#212121",
    muted: "#616161",
    grid: "#e0e0e0",
    axis: "#9e9e9e",
    // Cells without a colour: NaN (undefined) in magenta, <= 0 on a log scale in grey; neither
    // is a colour of the maps' low ends.
    missing: [255, 0, 255, 255],
    nonPositive: [189, 189, 189, 255],
  },
  dark: {
    background: "#303030",
    text: "#e0e0e0",
    muted: "#a0a0a0",
    grid: "#484848",
    axis: "#8a8a8a",
    missing: [255, 64, 255, 255],
    nonPositive: [176, 176, 176, 255],
  },
});

// ---------------------------------------------------------------------------------------------
// Noise statistics.

/** A colour domain symmetric around zero ([-a, a], a the largest |finite value|), or null. */
export function symmetricDomain(values) {
  let a = 0;
  for (const v of values) if (Number.isFinite(v) && Math.abs(v) > a) a = Math.abs(v);
  return a > 0 ? [-a, a] : null;
}

/**
 * Splits a curve into what is drawn and what is marked: `line` has NaN where the value is
 * not finite or (with `positiveOnly`, e.g. the noise scale or a log axis) not positive, and
 * `marked` lists the indices of those steps with a reason ("noise-dominated" for values <= 0
 * or infinite, "undefined" for NaN), so that no estimate is dropped silently.
 */
export function splitCurve(values, positiveOnly) {
  const line = [];
  const marked = [];
  values.forEach((v, k) => {
    if (Number.isNaN(v) || v === null || v === undefined) {
      line.push(NaN);
      marked.push({ index: k, reason: "undefined" });
    } else if (!Number.isFinite(v) || (positiveOnly && v <= 0)) {
      line.push(NaN);
      marked.push({ index: k, reason: "noise-dominated" });
    } else line.push(v);
  });
  return { line, marked };
}

/**
 * The uncertainty band of a smoothed curve: `value ± se` (se: the standard error of the
 * smoothed statistic over the steps in its window, /series smoothed_se, docs/math.md), in
 * runs of consecutive steps where both are finite (and, with `positiveOnly`, the value
 * positive: a noise-dominated estimate has no band). Returns [{steps, lo, hi}], one per run.
 */
export function bandSegments(steps, values, se, positiveOnly = false) {
  const out = [];
  let cur = null;
  steps.forEach((st, k) => {
    const v = values[k];
    const e = se?.[k];
    const ok = Number.isFinite(v) && Number.isFinite(e) && (!positiveOnly || v > 0);
    if (!ok) {
      cur = null;
      return;
    }
    if (!cur) {
      cur = { steps: [], lo: [], hi: [] };
      out.push(cur);
    }
    cur.steps.push(st);
    cur.lo.push(v - e);
    cur.hi.push(v + e);
  });
  return out;
}

/** The index of the row with the largest finite `key` (the noisiest variable), or -1. */
export function argmaxRow(rows, key) {
  let best = -1;
  rows.forEach((r, k) => {
    const v = r[key];
    if (Number.isFinite(v) && (best < 0 || v > rows[best][key])) best = k;
  });
  return best;
}

/** At most `max` items, evenly spaced, first and last kept (a readable number of ridges). */
export function evenSample(items, max) {
  if (items.length <= max) return items.slice();
  const out = [];
  for (let k = 0; k < max; k++) out.push(items[Math.round((k * (items.length - 1)) / (max - 1))]);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Groups: one per summary.moments call (docs/format.md, "Groups: several calls per step").

/** The whole-model tag of a group ("_model", or "<group>/_model"), as metadata.model_tag. */
export function modelTag(group) {
  return group ? `${group}/_model` : "_model";
}

/** A group's readable name: its name, or "(no name)" for the unprefixed group. */
export function groupLabel(group) {
  return group ? group : "(no name)";
}

/** The groups (sorted, "" first) that have a whole-model tag in any of `runs`; `groups` is /tags' `groups`. */
export function groupsOf(groups, runs) {
  const out = new Set();
  for (const r of runs) for (const g of Object.keys(groups?.[r] ?? {})) out.add(g);
  return [...out].sort();
}

/**
 * A robust x range of binned data: the bins from the one holding the `lo` quantile to the one
 * holding the `hi` quantile of all counts together (the ridges' x range: a few tiny or huge
 * values, e.g. 1e-36 next to 1e-4, would otherwise squeeze every ridge into a few pixels).
 * Returns {first, last} bin indices (inclusive) and `outside`, the count left out; null if
 * there are no counts.
 */
export function robustBinRange(countsList, lo = 0.005, hi = 0.995) {
  if (!countsList.length) return null;
  const total = new Array(countsList[0].length).fill(0);
  for (const counts of countsList)
    counts.forEach((c, k) => {
      total[k] += c;
    });
  const sum = total.reduce((a, b) => a + b, 0);
  if (!(sum > 0)) return null;
  let acc = 0;
  let first = -1;
  let last = total.length - 1;
  for (let k = 0; k < total.length; k++) {
    acc += total[k];
    if (first < 0 && acc > lo * sum) first = k;
    if (acc >= hi * sum) {
      last = k;
      break;
    }
  }
  first = Math.max(0, first);
  const inside = total.slice(first, last + 1).reduce((a, b) => a + b, 0);
  return { first, last, outside: sum - inside };
}

/**
 * A y range robust to spikes: [lo, hi] of the finite values, except that when the largest
 * (smallest) value is more than `factor` times farther from the median than the 95th (5th)
 * percentile, the range stops at 1.5 times that percentile's distance; `clipped` says whether
 * values lie outside (the curve marks them at the edge). A ratio whose smoothed denominator
 * crosses zero spikes to huge values, which would flatten the rest of the curve.
 */
export function robustRange(values, factor = 4) {
  const v = values.filter(Number.isFinite).sort((a, b) => a - b);
  if (!v.length) return null;
  const q = (p) => v[Math.min(v.length - 1, Math.max(0, Math.round(p * (v.length - 1))))];
  const med = q(0.5);
  let [lo, hi] = [v[0], v[v.length - 1]];
  const up = q(0.95) - med;
  const down = med - q(0.05);
  let clipped = false;
  if (up > 0 && hi - med > factor * up) {
    hi = med + 1.5 * up;
    clipped = true;
  }
  if (down > 0 && med - lo > factor * down) {
    lo = med - 1.5 * down;
    clipped = true;
  }
  return { lo, hi, clipped };
}
