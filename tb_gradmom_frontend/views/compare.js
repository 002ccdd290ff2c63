// @ts-check
// A comparison of one variable's heatmaps side by side: the same statistic in several runs, or
// in one run at two steps, each panel coloured on ONE colour scale (the finite extent over all
// panels, centred on zero for signed statistics on a linear scale) with one colour bar, so
// that a colour means the same value in every panel. 1-D variables are drawn as bars on that
// scale. Exported as one figure (PNG, SVG) and one table (CSV, JSON).

import * as d3 from "../vendor/d3.js";
import {
  cellElements,
  colorize,
  colormapLUT,
  describeCell,
  finiteExtent,
  formatValue,
  lutIndex,
  niceTicks,
  normalizer,
  symmetricDomain,
  toCSV,
} from "../core.js";
import { isBars } from "./heatmap.js";
import {
  drawAxis,
  drawColorbar,
  drawTitle,
  exportButtons,
  fitText,
  h,
  newFigure,
  toJSON,
  View,
} from "./common.js";

const MARGIN = { top: 52, right: 112, bottom: 44, left: 60 };
const GAP = 28; // between panels
const PANEL_TITLE = 18; // a panel's name above its plot
const MIN_PANEL_W = 220;
const MAX_PLOT_H = 360;
const BARS_H = 160;
const MIN_BAR_H = 160;
const BAR_FLOOR = 0.04; // bars start this far (a fraction of the plot) above the bottom

/**
 * @typedef {{run: string, step: number | null, label: string, color?: string,
 *   data: {values: Float64Array, rows: number, cols: number, shape: number[], step: number,
 *   batch_size?: number, block?: number[]}}} Panel
 * @typedef {{panels: Panel[], mode: string, stat: string, label: string, signed: boolean,
 *   tag: string, colormap: string, scale: string, theme: any, exportTheme: any}} CompareModel
 */

/**
 * The one colour domain of all panels: their values' finite extent (positive values only on a
 * log scale), or, for a signed statistic on a linear scale, symmetric about zero.
 * @param {Float64Array[]} arrays
 * @param {string} scale
 * @param {boolean} signed
 * @returns {[number, number] | null}
 */
export function sharedDomain(arrays, scale, signed) {
  const n = arrays.reduce((a, v) => a + v.length, 0);
  const all = new Float64Array(n);
  let o = 0;
  for (const v of arrays) {
    all.set(v, o);
    o += v.length;
  }
  const domain =
    scale === "linear" && signed
      ? (symmetricDomain(all) ?? finiteExtent(all, scale))
      : finiteExtent(all, scale);
  return domain ? [domain[0], domain[1]] : null;
}

export class CompareHeatmapView extends View {
  /** @param {HTMLElement} container */
  constructor(container) {
    super(container);
    /** @type {CompareModel | null} */
    this.model = null;
    /** @type {[number, number] | null} the colour domain every panel is drawn with */
    this.domain = null;
    /** @type {HTMLElement | null} */
    this.node = null;
  }

  /** @param {CompareModel} model */
  update(model) {
    this.model = model;
    this.render();
  }

  clear() {
    this.model = null;
    this.node?.remove();
    this.node = null;
  }

  /** @param {string} text @param {string} [kind] */
  showMessage(text, kind = "info") {
    this.clear();
    this.node = h("div", { class: `message ${kind} compare-message`, text });
    this.container.replaceChildren(this.node);
  }

  /** The layout: panels per row, panel and plot sizes, figure size. */
  layout() {
    const m = /** @type {CompareModel} */ (this.model);
    const width = Math.max(420, Math.min(this.container.clientWidth || 900, 1400));
    const n = Math.max(1, m.panels.length);
    const inner = width - MARGIN.left - MARGIN.right;
    let perRow = n;
    const panelW = (/** @type {number} */ k) => (inner - GAP * (k - 1)) / k;
    while (perRow > 1 && panelW(perRow) < MIN_PANEL_W) perRow -= 1;
    const pw = Math.floor(panelW(perRow));
    const first = m.panels[0]?.data;
    const bars = !!first && isBars(first);
    const ph = bars
      ? BARS_H
      : Math.round(
          Math.max(36, Math.min(MAX_PLOT_H, ((first?.rows ?? 1) * pw) / (first?.cols ?? 1))),
        );
    const rows = Math.ceil(n / perRow);
    const rowH = PANEL_TITLE + ph + MARGIN.bottom;
    const barH = Math.max(ph, MIN_BAR_H);
    const height = Math.max(MARGIN.top + rows * rowH, MARGIN.top + PANEL_TITLE + barH + 40);
    return { width, height, perRow, pw, ph, rowH, barH, bars };
  }

  render() {
    const m = this.model;
    if (!m) return;
    this.domain = sharedDomain(
      m.panels.map((p) => p.data.values),
      m.scale,
      m.signed,
    );
    const svg = this.figure(m.theme);
    const L = this.layout();
    const tip = h("div", { class: "tooltip", role: "tooltip", hidden: true });
    svg.addEventListener("pointermove", (e) => this.hover(e, svg, tip));
    svg.addEventListener("pointerleave", () => {
      tip.hidden = true;
    });
    this.node = h("div", { class: "compare" }, [
      h("div", { class: "card-tools" }, [
        h("span", {
          class: "hint",
          text: "One colour scale for every panel: a colour is the same value in each.",
        }),
        exportButtons({
          figure: () => this.figure(/** @type {CompareModel} */ (this.model).exportTheme),
          csv: () => this.csv(),
          json: () => this.json(),
          name: () => this.fileParts(),
        }),
      ]),
      h("div", { class: "figure compare-figure", style: `width:${L.width}px` }, [svg, tip]),
    ]);
    this.container.replaceChildren(this.node);
  }

  /** The file name's parts: the variable, the statistic and what is compared. */
  fileParts() {
    const m = /** @type {CompareModel} */ (this.model);
    const what =
      m.mode === "runs"
        ? `runs-${m.panels.map((p) => p.run).join("-vs-")}`
        : `${m.panels[0]?.run}-steps-${m.panels.map((p) => p.data.step).join("-vs-")}`;
    return ["compare", m.tag, m.stat, what];
  }

  /**
   * The figure as an <svg> element in `theme`: one panel per run or step, one colour bar.
   * @param {any} theme
   * @returns {SVGSVGElement}
   */
  figure(theme) {
    const m = /** @type {CompareModel} */ (this.model);
    const L = this.layout();
    const svg = newFigure(L.width, L.height, theme).attr("class", "compare-svg");
    const domain = this.domain;
    const log = m.scale === "log";
    const first = m.panels[0]?.data;
    const shape = first?.shape ?? [];
    const what =
      m.mode === "runs"
        ? `${m.panels.length} runs at step ${[...new Set(m.panels.map((p) => p.data.step))].join(", ")}`
        : `run ${m.panels[0]?.run}, steps ${m.panels.map((p) => p.data.step).join(" and ")}`;
    drawTitle(
      svg,
      `${m.label} of ${m.tag}: ${m.mode === "runs" ? "runs" : "steps"} compared`,
      `${what} · shape [${shape.join(", ")}] · one colour scale${log ? " (log)" : ""}`,
      theme,
    );
    const normalize = domain ? normalizer(domain, m.scale) : () => NaN;
    const lut = colormapLUT(m.colormap);
    m.panels.forEach((p, i) => {
      const col = i % L.perRow;
      const [x0, y0] = panelOrigin(L, i);
      const g = svg
        .append("g")
        .attr("class", "compare-panel")
        .attr("data-run", p.run)
        .attr("data-step", p.data.step)
        .attr("data-lo", domain ? domain[0] : "")
        .attr("data-hi", domain ? domain[1] : "")
        .attr("transform", `translate(${x0},${y0})`);
      if (p.color && m.mode === "runs")
        g.append("rect")
          .attr("class", "swatch")
          .attr("y", 2)
          .attr("width", 10)
          .attr("height", 10)
          .attr("fill", p.color);
      fitText(
        g
          .append("text")
          .attr("class", "panel-title")
          .attr("x", p.color && m.mode === "runs" ? 14 : 0)
          .attr("y", 11)
          .attr("font-size", 12)
          .attr("font-weight", 600)
          .attr("fill", theme.text)
          .text(m.mode === "runs" ? `${p.label} · step ${p.data.step}` : p.label),
        L.pw - 16,
      );
      const plot = g
        .append("g")
        .attr("class", "panel-plot")
        .attr("transform", `translate(0,${PANEL_TITLE})`);
      const d = p.data;
      if (L.bars) this.drawBars(plot, d, L, normalize, lut, theme);
      else {
        const canvas = document.createElement("canvas");
        canvas.width = d.cols;
        canvas.height = d.rows;
        const ctx = /** @type {CanvasRenderingContext2D} */ (canvas.getContext("2d"));
        const pixels = colorize(d.values, m.colormap, normalize, theme.missing, theme.nonPositive);
        ctx.putImageData(new ImageData(pixels, d.cols, d.rows), 0, 0);
        plot
          .append("image")
          .attr("class", "panel-image")
          .attr("width", L.pw)
          .attr("height", L.ph)
          .attr("preserveAspectRatio", "none")
          .attr("style", "image-rendering: pixelated")
          .attr("href", canvas.toDataURL("image/png"));
      }
      plot
        .append("rect")
        .attr("width", L.pw)
        .attr("height", L.ph)
        .attr("fill", "none")
        .attr("stroke", theme.axis)
        .attr("stroke-width", 0.5);
      const cells = (/** @type {number} */ n, /** @type {number} */ length) =>
        d3
          .scaleLinear()
          .domain([-0.5, n - 0.5])
          .range([0, length]);
      const ticks = (
        /** @type {number} */ n,
        /** @type {number} */ length,
        /** @type {number} */ spacing,
      ) =>
        niceTicks(0, n - 1, Math.max(2, Math.floor(length / spacing))).filter(
          (v) => Number.isInteger(v) && v >= 0 && v < n,
        );
      drawAxis(plot.append("g").attr("transform", `translate(0,${L.ph})`), cells(d.cols, L.pw), {
        orient: "bottom",
        theme,
        tickValues: ticks(d.cols, L.pw, 60),
        tickFormat: (/** @type {number} */ v) => String(v),
        label: "column",
      });
      if (!L.bars && col === 0)
        drawAxis(plot.append("g"), cells(d.rows, L.ph), {
          orient: "left",
          theme,
          tickValues: ticks(d.rows, L.ph, 36),
          tickFormat: (/** @type {number} */ v) => String(v),
          label: "row",
        });
    });
    this.drawColorbar(svg, L, domain, lut, theme);
    return /** @type {SVGSVGElement} */ (svg.node());
  }

  /**
   * A 1-D variable's bars on the shared scale (BAR_FLOOR up to the top of the plot).
   * @param {any} plot @param {Panel["data"]} d @param {ReturnType<CompareHeatmapView["layout"]>} L
   * @param {(v: number) => number} normalize @param {Uint8Array} lut @param {any} theme
   */
  drawBars(plot, d, L, normalize, lut, theme) {
    const m = /** @type {CompareModel} */ (this.model);
    const f = (/** @type {number} */ t) => BAR_FLOOR + (1 - BAR_FLOOR) * t;
    const base = m.scale === "linear" && m.signed ? f(Math.max(0, Math.min(1, normalize(0)))) : 0;
    const w = L.pw / d.cols;
    const gap = w > 6 ? Math.min(2, w * 0.1) : 0;
    Array.from(d.values).forEach((v, k) => {
      const t = normalize(v);
      let from = 0;
      let to = BAR_FLOOR;
      let rgb;
      if (Number.isNaN(t)) rgb = (Number.isNaN(v) ? theme.missing : theme.nonPositive).slice(0, 3);
      else {
        const top = f(Math.max(0, Math.min(1, t)));
        from = Math.min(base, top);
        to = Math.max(base, top, BAR_FLOOR / 2);
        const i = 3 * lutIndex(t);
        rgb = [lut[i], lut[i + 1], lut[i + 2]];
      }
      plot
        .append("rect")
        .attr("class", "bar")
        .attr("x", k * w + gap / 2)
        .attr("y", L.ph * (1 - to))
        .attr("width", Math.max(0.5, w - gap))
        .attr("height", L.ph * (to - from))
        .attr("fill", `rgb(${rgb.join(",")})`)
        .append("title")
        .text(`${k}: ${v}`);
    });
  }

  /**
   * The one colour bar, right of the panels, with the NaN and <= 0 keys below it.
   * @param {any} svg @param {ReturnType<CompareHeatmapView["layout"]>} L
   * @param {[number, number] | null} domain @param {Uint8Array} lut @param {any} theme
   */
  drawColorbar(svg, L, domain, lut, theme) {
    const m = /** @type {CompareModel} */ (this.model);
    const values = m.panels.flatMap((p) => Array.from(p.data.values));
    drawColorbar(svg, {
      x: L.width - MARGIN.right + 24,
      y: MARGIN.top + PANEL_TITLE,
      height: L.barH,
      figureWidth: L.width,
      lut,
      domain,
      log: m.scale === "log",
      values,
      label: m.stat,
      suffix: ", all panels",
      theme,
    });
  }

  /**
   * The tooltip over a panel's cell: its element index and its value in every panel (the
   * comparison read off, run by run or step by step).
   * @param {PointerEvent} event @param {SVGSVGElement} svg @param {HTMLElement} tip
   */
  hover(event, svg, tip) {
    const m = this.model;
    if (!m) return;
    const L = this.layout();
    const box = svg.getBoundingClientRect();
    const px = event.clientX - box.left;
    const py = event.clientY - box.top;
    const at = m.panels.findIndex((_, i) => {
      const [x0, y0] = panelOrigin(L, i);
      return px >= x0 && px < x0 + L.pw && py >= y0 + PANEL_TITLE && py < y0 + PANEL_TITLE + L.ph;
    });
    if (at < 0) {
      tip.hidden = true;
      return;
    }
    const [x0, y0] = panelOrigin(L, at);
    const d = m.panels[at].data;
    const col = Math.min(d.cols - 1, Math.floor(((px - x0) / L.pw) * d.cols));
    const row = L.bars
      ? 0
      : Math.min(d.rows - 1, Math.floor(((py - y0 - PANEL_TITLE) / L.ph) * d.rows));
    const k = row * d.cols + col;
    /** @param {string} a @param {string} b @param {string} cls */
    const line = (a, b, cls) =>
      h("div", { class: cls }, [
        h("span", { class: "tip-key", text: a }),
        h("span", { class: "tip-value", text: b }),
      ]);
    tip.replaceChildren(
      line("index", describeCell(cellElements(row, col, d.shape, d.block ?? [1, 1])), "tip-row"),
      ...m.panels.map((p, i) =>
        line(
          m.mode === "runs" ? `${p.label} · step ${p.data.step}` : p.label,
          p.data.rows === d.rows && p.data.cols === d.cols ? formatValue(p.data.values[k], 6) : "–",
          i === at ? "tip-row tip-main" : "tip-row",
        ),
      ),
    );
    tip.dataset.row = String(row);
    tip.dataset.col = String(col);
    tip.hidden = false;
    const flip = px + 14 + 240 > L.width;
    tip.style.left = `${flip ? px - 14 - tip.offsetWidth : px + 14}px`;
    tip.style.top = `${py + 12}px`;
  }

  /** One line per panel and cell: the run, step, cell, element index and value. */
  csv() {
    const m = /** @type {CompareModel} */ (this.model);
    /** @type {any[][]} */
    const rows = [];
    for (const p of m.panels) {
      const d = p.data;
      for (let i = 0; i < d.rows; i++)
        for (let j = 0; j < d.cols; j++)
          rows.push([
            p.run,
            d.step,
            i,
            j,
            describeCell(cellElements(i, j, d.shape, d.block ?? [1, 1])),
            d.values[i * d.cols + j],
          ]);
    }
    return toCSV(["run", "step", "row", "col", "element", m.stat], rows);
  }

  /** The compared payloads and the one colour domain, as JSON. */
  json() {
    const m = /** @type {CompareModel} */ (this.model);
    return toJSON({
      tag: m.tag,
      stat: m.stat,
      mode: m.mode,
      scale: m.scale,
      colormap: m.colormap,
      domain: this.domain,
      panels: m.panels.map((p) => ({ run: p.run, step: p.data.step, ...p.data })),
    });
  }
}

/**
 * The top left corner of panel `i` (its name above its plot) in the figure.
 * @param {{perRow: number, pw: number, rowH: number}} L
 * @param {number} i
 * @returns {[number, number]}
 */
function panelOrigin(L, i) {
  const col = i % L.perRow;
  const row = Math.floor(i / L.perRow);
  return [MARGIN.left + col * (L.pw + GAP), MARGIN.top + row * L.rowH];
}
