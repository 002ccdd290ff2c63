// @ts-check
// Shared drawing helpers of the views: DOM building (text only, never HTML), axes, figure
// frames, export buttons and downloads.

import * as d3 from "../vendor/d3.js";
import { fileName, formatTick, logTicks, niceTicks, svgDocument } from "../core.js";

export const SVG_NS = "http://www.w3.org/2000/svg";

/**
 * An HTML element. `text` is set as textContent (names are data, never markup); other options
 * become attributes, `on*` functions event listeners.
 */
export function h(tag, options = {}, children = []) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(options)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") node.textContent = String(v);
    else if (k === "class") node.className = v;
    else if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
    else if (k === "checked" || k === "value" || k === "selected" || k === "disabled") node[k] = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) if (c) node.append(c);
  return node;
}

/** A <select> with options [{value, label}] or plain strings. */
export function select(options, value, onchange, attrs = {}) {
  const node = h("select", { ...attrs, onchange: () => onchange(node.value) });
  const option = (o) => {
    const { value: v, label, title } = typeof o === "string" ? { value: o, label: o } : o;
    return h("option", { value: v, text: label, title, selected: v === value });
  };
  for (const o of options) {
    // {group, title, options}: an <optgroup> of options.
    if (o && typeof o === "object" && Array.isArray(o.options))
      node.append(h("optgroup", { label: o.group, title: o.title }, o.options.map(option)));
    else node.append(option(o));
  }
  node.value = value;
  return node;
}

/**
 * A checkbox followed by its `text`, in a <label class="check">: `onchange(checked)` runs on
 * each change; `attrs` go to the <input>.
 */
export function checkbox(text, checked, onchange, attrs = {}) {
  const node = h("input", {
    type: "checkbox",
    checked,
    ...attrs,
    onchange: () => onchange(node.checked),
  });
  return h("label", { class: "check" }, [node, h("span", { text })]);
}

/** Starts a browser download of a Blob. */
export function download(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = h("a", { href: url, download: name, style: "display:none" });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

/** A standalone SVG file of an <svg> element. */
export function serializeSVG(svgNode) {
  return svgDocument(new XMLSerializer().serializeToString(svgNode));
}

/** Renders SVG text to a PNG Blob at `scale` times its size, on an opaque background. */
export async function svgToPNG(svgText, width, height, scale = 2, background = "#ffffff") {
  const url = URL.createObjectURL(new Blob([svgText], { type: "image/svg+xml" }));
  try {
    const img = new Image();
    img.decoding = "sync";
    const loaded = new Promise((resolve, reject) => {
      img.onload = resolve;
      img.onerror = () => reject(new Error("the figure's SVG could not be drawn as an image"));
    });
    img.src = url;
    await loaded;
    const canvas = document.createElement("canvas");
    canvas.width = Math.round(width * scale);
    canvas.height = Math.round(height * scale);
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = background;
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.drawImage(img, 0, 0, canvas.width, canvas.height);
    return await new Promise((resolve) => canvas.toBlob(resolve, "image/png"));
  } finally {
    URL.revokeObjectURL(url);
  }
}

/**
 * The export buttons of a card: PNG, SVG, CSV, JSON (and more). `figure()` returns a detached
 * <svg> drawn for export; `csv()` / `json()` return text. `name` gives file name parts.
 */
export function exportButtons({ figure, csv, json, name, extra = [] }) {
  // A button that downloads `file()` (a Blob, or a promise of one) named
  // `fileName(name(), ext)`; a failure is logged, never thrown at the page.
  const button = (text, title, ext, file) =>
    h("button", {
      type: "button",
      text,
      title,
      onclick: async () => {
        try {
          download(await file(), fileName(name(), ext));
        } catch (e) {
          console.warn("export failed:", e);
        }
      },
    });
  const png = () => {
    const svg = figure();
    return svgToPNG(serializeSVG(svg), +svg.getAttribute("width"), +svg.getAttribute("height"));
  };
  // A file of the text `make()` returns, of MIME type `type`.
  const textFile = (make, type) => () => new Blob([make()], { type });
  const bar = h("div", { class: "export" }, [
    h("span", { class: "export-label", text: "Download" }),
    button("PNG", "The figure as a PNG image (2x resolution)", "png", png),
    button(
      "SVG",
      "The figure as an SVG vector image",
      "svg",
      textFile(() => serializeSVG(figure()), "image/svg+xml"),
    ),
    button("CSV", "The plotted data as CSV", "csv", textFile(csv, "text/csv")),
    json && button("JSON", "The plotted data as JSON", "json", textFile(json, "application/json")),
    ...extra,
  ]);
  return bar;
}

/** JSON text with NaN as null and +-Inf as "Infinity"/"-Infinity" (as the backend sends). */
export function toJSON(obj) {
  return JSON.stringify(
    obj,
    (_, v) => {
      if (typeof v === "number" && !Number.isFinite(v))
        return Number.isNaN(v) ? null : v > 0 ? "Infinity" : "-Infinity";
      if (ArrayBuffer.isView(v))
        return Array.from(/** @type {ArrayLike<number>} */ (/** @type {unknown} */ (v)), (x) =>
          Number.isFinite(x) ? x : Number.isNaN(x) ? null : x > 0 ? "Infinity" : "-Infinity",
        );
      return v;
    },
    1,
  );
}

/** A note in the middle of an empty figure ("no finite values ..."). */
export function drawEmpty(svg, width, height, text, theme) {
  svg
    .append("text")
    .attr("class", "empty-note")
    .attr("x", width / 2)
    .attr("y", height / 2)
    .attr("text-anchor", "middle")
    .attr("fill", theme.muted)
    .text(text);
}

/** What every view shares: the card body it fills, its model, and its messages. */
export class View {
  constructor(container) {
    this.container = container;
    this.model = null;
  }

  showMessage(text, kind) {
    this.model = null;
    message(this.container, text, kind);
  }

  clear() {
    this.model = null;
    this.container.replaceChildren();
  }
}

/** A fresh <svg> of the given size with a background, text colour and font set as attributes. */
export function newFigure(width, height, theme) {
  const svg = d3
    .create("svg")
    .attr("xmlns", SVG_NS)
    .attr("width", width)
    .attr("height", height)
    .attr("viewBox", `0 0 ${width} ${height}`)
    .attr("font-family", FONT_FAMILY)
    .attr("font-size", 11)
    .attr("color", theme.text)
    .attr("fill", theme.text);
  svg
    .append("rect")
    .attr("class", "bg")
    .attr("width", width)
    .attr("height", height)
    .attr("fill", theme.background);
  return svg;
}

/** A figure's title (and an optional subtitle) at its top left. */
export function drawTitle(svg, title, subtitle, theme, reserve = 0) {
  // `reserve`: pixels kept free at the right (a legend in the top right corner).
  const room = Number(svg.attr("width")) - 24 - reserve;
  fitText(
    svg
      .append("text")
      .attr("class", "title")
      .attr("x", 12)
      .attr("y", 18)
      .attr("font-size", 13)
      .attr("font-weight", 600)
      .attr("fill", theme.text)
      .text(title),
    room,
  );
  if (subtitle) {
    fitText(
      svg
        .append("text")
        .attr("class", "subtitle")
        .attr("x", 12)
        .attr("y", 34)
        .attr("font-size", 11)
        .attr("fill", theme.muted)
        .text(subtitle),
      room,
    );
  }
}

/**
 * A table drawn as a figure (PNG/SVG export): a title, a header row, a rule, one text row per
 * entry of `rows`, and optionally a bold total row under a second rule.
 * @param {{title: string, subtitle: string, theme: any, columns: readonly {key: string, label?: string, numeric?: boolean}[], widths: number[], rows: any[], text: (col: any, row: any) => string, total?: ((col: any) => string) | null}} spec
 */
export function tableFigure({ title, subtitle, theme, columns, widths, rows, text, total = null }) {
  const rowH = 18;
  const width = 24 + widths.reduce((a, b) => a + b, 0);
  const height = 60 + rowH * (rows.length + (total ? 2 : 1)) + 12;
  const svg = newFigure(width, height, theme);
  drawTitle(svg, title, subtitle, theme);
  const g = svg.append("g").attr("transform", "translate(12,52)");
  const xs = widths.map((_, k) => widths.slice(0, k).reduce((a, b) => a + b, 0));
  /** @param {number} y @param {(col: any) => string} label @param {boolean} bold */
  const line = (y, label, bold) =>
    columns.forEach((col, k) => {
      g.append("text")
        .attr("x", col.numeric ? xs[k] + widths[k] - 6 : xs[k])
        .attr("y", y)
        .attr("text-anchor", col.numeric ? "end" : "start")
        .attr("font-weight", bold ? 600 : null)
        .attr("fill", theme.text)
        .text(label(col));
    });
  /** @param {number} y */
  const rule = (y) =>
    g
      .append("line")
      .attr("x1", 0)
      .attr("x2", width - 24)
      .attr("y1", y)
      .attr("y2", y)
      .attr("stroke", theme.axis);
  line(12, (col) => col.label ?? "", true);
  rule(17);
  rows.forEach((row, r) => line(12 + rowH * (r + 1), (col) => text(col, row), false));
  if (total) {
    const y = 12 + rowH * (rows.length + 1);
    rule(y - 13);
    line(y, total, true);
  }
  return svg;
}

const FONT_FAMILY = "Roboto, Helvetica, Arial, sans-serif";
let measureContext = null;

/** The width in pixels of an SVG text element's text, laid out or not (figures are drawn
 * before they are attached: a canvas measures them with the same font). */
function textWidth(node) {
  if (node.isConnected && typeof node.getComputedTextLength === "function") {
    return node.getComputedTextLength();
  }
  if (typeof document === "undefined") return 0;
  measureContext ??= document.createElement("canvas").getContext("2d");
  if (!measureContext) return 0;
  const size = node.getAttribute("font-size") ?? 11;
  const weight = node.getAttribute("font-weight") ?? 400;
  measureContext.font = `${weight} ${size}px ${FONT_FAMILY}`;
  return measureContext.measureText(node.textContent).width;
}

/**
 * Shortens an SVG text to at most `maxWidth` pixels, ending it with "…", and keeps the whole
 * text as its tooltip (a <title> child, also in exported SVGs). A text that fits is left as it
 * is.
 */
export function fitText(text, maxWidth) {
  const node = text.node();
  if (!node || !(maxWidth > 0)) return text;
  const full = node.textContent;
  // A few per cent of slack: the canvas and the SVG renderer may round glyphs differently.
  const room = maxWidth * 0.97;
  if (textWidth(node) <= room) return text;
  let lo = 0;
  let hi = full.length;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    node.textContent = `${full.slice(0, mid).trimEnd()}…`;
    if (textWidth(node) <= room) lo = mid;
    else hi = mid - 1;
  }
  node.textContent = `${full.slice(0, lo).trimEnd()}…`;
  text.append("title").text(full);
  return text;
}

/** The ticks of a d3 linear or log scale with core's tick choice. */
export function scaleTicks(scale, log, count) {
  const [a, b] = scale.domain();
  return log
    ? logTicks(Math.min(a, b), Math.max(a, b), count)
    : niceTicks(Math.min(a, b), Math.max(a, b), count);
}

/**
 * An axis with core's ticks and labels, coloured by the theme, optional grid lines across
 * `gridLength` pixels, and a label.
 * @param {any} g the d3 selection of the axis' <g>
 * @param {any} scale a d3 scale
 * @param {{orient: string, log?: boolean, count?: number, theme: any, label?: string,
 *   gridLength?: number, tickValues?: number[], tickFormat?: (v: number) => string}} options
 */
export function drawAxis(
  g,
  scale,
  { orient, log = false, count = 5, theme, label, gridLength = 0, tickValues, tickFormat },
) {
  const make = { bottom: d3.axisBottom, left: d3.axisLeft, right: d3.axisRight, top: d3.axisTop }[
    orient
  ];
  const values = tickValues ?? scaleTicks(scale, log, count);
  const axis = make(scale)
    .tickValues(values)
    .tickFormat(tickFormat ?? formatTick)
    .tickSizeOuter(0);
  g.attr("color", theme.axis).call(axis);
  g.selectAll(".tick text").attr("fill", theme.muted);
  if (gridLength) {
    const sign = orient === "bottom" || orient === "right" ? -1 : 1;
    g.selectAll(".tick")
      .append("line")
      .attr("class", "grid")
      .attr(orient === "bottom" || orient === "top" ? "y2" : "x2", sign * gridLength)
      .attr("stroke", theme.grid)
      .attr("stroke-opacity", 0.7);
  }
  if (label) {
    const [r0, r1] = scale.range();
    const mid = (r0 + r1) / 2;
    const t = g
      .append("text")
      .attr("class", "axis-label")
      .attr("fill", theme.muted)
      .attr("text-anchor", "middle")
      .attr("font-size", 11)
      .text(label);
    if (orient === "bottom") t.attr("x", mid).attr("y", 32);
    else if (orient === "left") t.attr("transform", `translate(-46,${mid}) rotate(-90)`);
    else if (orient === "right") t.attr("transform", `translate(48,${mid}) rotate(90)`);
    else t.attr("x", mid).attr("y", -24);
  }
  return g;
}

/**
 * A vertical colour bar at (x, y): the colour map's LUT as an image (top = top of the scale), a
 * frame, ticks on the colour scale, a key for what has no colour (NaN; values <= 0 on a log
 * scale) below it, and the rotated label at the figure's right edge. Returns the bar's group and
 * its d3 scale (null without a domain) for what a view adds beside it.
 * @param {any} svg a d3 selection
 * @param {{x: number, y: number, height: number, figureWidth: number, lut: Uint8Array,
 *   domain: number[] | null, log: boolean, values: ArrayLike<number>, label: string,
 *   suffix?: string, theme: any}} options
 */
export function drawColorbar(
  svg,
  { x, y, height, figureWidth, lut, domain, log, values, label, suffix = "", theme },
) {
  const bar = svg
    .append("g")
    .attr("class", "colorbar")
    .attr("data-lo", domain ? domain[0] : "")
    .attr("data-hi", domain ? domain[1] : "")
    .attr("transform", `translate(${x},${y})`);
  const strip = document.createElement("canvas");
  strip.width = 1;
  strip.height = 256;
  const px = new ImageData(1, 256);
  for (let i = 0; i < 256; i++) {
    px.data.set([lut[3 * i], lut[3 * i + 1], lut[3 * i + 2], 255], 4 * (255 - i));
  }
  /** @type {CanvasRenderingContext2D} */ (strip.getContext("2d")).putImageData(px, 0, 0);
  for (const el of ["image", "rect"]) {
    const node = bar
      .append(el)
      .attr("width", 14)
      .attr("height", height)
      .attr("preserveAspectRatio", "none");
    if (el === "image") node.attr("href", strip.toDataURL("image/png"));
    else node.attr("fill", "none").attr("stroke", theme.axis).attr("stroke-width", 0.5);
  }
  let scale = null;
  if (domain) {
    const degenerate = domain[0] === domain[1];
    scale = (log ? d3.scaleLog() : d3.scaleLinear())
      .domain(degenerate ? [domain[0], domain[0] + (log ? domain[0] : 1)] : domain)
      .range([height, 0]);
    drawAxis(bar.append("g").attr("transform", "translate(14,0)"), scale, {
      orient: "right",
      log,
      count: 6,
      theme,
    });
  }
  let nan = false;
  let nonPositive = false;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (Number.isNaN(v)) nan = true;
    else if (log && v <= 0) nonPositive = true;
  }
  const keys = [
    ...(nan ? [["NaN", theme.missing, "missing-nan"]] : []),
    ...(nonPositive ? [["≤ 0", theme.nonPositive, "missing-nonpositive"]] : []),
  ];
  keys.forEach(([text, colour, cls], k) => {
    const g = svg
      .append("g")
      .attr("class", cls)
      .attr("transform", `translate(${x},${y + height + 12 + 14 * k})`);
    g.append("rect")
      .attr("width", 14)
      .attr("height", 10)
      .attr("fill", `rgb(${colour.slice(0, 3).join(",")})`);
    g.append("text").attr("x", 18).attr("y", 9).attr("fill", theme.muted).text(text);
  });
  // Read bottom to top, its glyphs to the left of the anchor: inside the figure's right edge.
  svg
    .append("text")
    .attr("class", "colorbar-label")
    .attr("fill", theme.muted)
    .attr("font-size", 11)
    .attr("text-anchor", "middle")
    .attr("transform", `translate(${figureWidth - 6},${y + height / 2}) rotate(-90)`)
    .text(`${label}${log ? " (log scale)" : ""}${suffix}`);
  return { bar, scale };
}

/** A message in place of a plot (no data, an error from the backend). */
export function message(container, text, kind = "info") {
  container.replaceChildren(h("div", { class: `message ${kind}`, text }));
}
