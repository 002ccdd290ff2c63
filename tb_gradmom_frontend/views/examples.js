// @ts-check
// The per-example view: per-example gradient norms ||g_j|| of one run's per-example tag, for
// the whole model or one layer: a fan chart of their quantiles over steps (median, 50/90/99 %
// bands, max), the histogram at a step (log x), the outlier table by example id (sortable, with
// the loss) and, for a clipping norm C, the fraction of examples clipped per step. Every number
// comes from the backend (/examples/*, computed by tb_gradmom.analysis.examples); this module
// only draws them. The pure parts (fanData, the CSV texts, parsePositive) are node-tested in
// tests/js/examples.test.mjs.

import * as d3 from "../vendor/d3.js";
import { formatNumber, formatValue, linePath, niceDomain, sortRows, toCSV } from "../core.js";
import {
  drawAxis,
  drawEmpty,
  drawTitle,
  exportButtons,
  h,
  newFigure,
  tableFigure,
  toJSON,
  View,
} from "./common.js";

const MARGIN = { top: 48, right: 24, bottom: 50, left: 72 };
// The bands' fill opacity, widest first (99 %, 90 %, 50 %): they add up where they overlap.
// Darker backgrounds need more: the same light blue at 0.12 nearly vanishes on #303030.
const BAND_OPACITY = { light: [0.12, 0.18, 0.3], dark: [0.22, 0.3, 0.45] };

/**
 * @typedef {{label: string, lower: number[], upper: number[]}} Band
 * @typedef {{steps: number[], median: number[], max: number[], bands: Band[], capped: boolean[],
 *   log: boolean}} Fan
 */

/**
 * What the fan chart draws from an /examples/quantiles payload: the bands (widest first, as the
 * payload's `bands` name them), the median, the max, and whether the y axis is logarithmic (all
 * the drawn values positive).
 * @param {any} q the payload (api.fetchExampleQuantiles)
 * @returns {Fan}
 */
export function fanData(q) {
  const get = (/** @type {string} */ k) => Array.from(q.quantiles?.[k] ?? [], Number);
  const bands = (q.bands ?? []).map((/** @type {any} */ b) => ({
    label: String(b.label),
    lower: get(b.lower),
    upper: get(b.upper),
  }));
  const median = get("p50");
  const max = Array.from(q.max ?? [], Number);
  const all = [...bands.flatMap((b) => [...b.lower, ...b.upper]), ...median, ...max].filter(
    Number.isFinite,
  );
  return {
    steps: Array.from(q.steps ?? [], Number),
    median,
    max,
    bands,
    capped: Array.from(q.capped ?? [], Boolean),
    log: all.length > 0 && all.every((v) => v > 0),
  };
}

/**
 * A positive finite number typed in an input, or null (empty, not a number, <= 0).
 * @param {string} text
 */
export function parsePositive(text) {
  const t = String(text ?? "").trim();
  if (!t) return null;
  const v = Number(t);
  return Number.isFinite(v) && v > 0 ? v : null;
}

/**
 * The quantiles' CSV: one row per step, as the payload holds them (full precision).
 * @param {any} q
 */
export function quantilesCSV(q) {
  const keys = q.keys ?? Object.keys(q.quantiles ?? {});
  return toCSV(
    ["step", "batch_size", "rows", "capped", ...keys, "max", "mean_sq"],
    (q.steps ?? []).map((/** @type {number} */ s, /** @type {number} */ i) => [
      s,
      q.batch_size?.[i],
      q.rows?.[i],
      q.capped?.[i] ? 1 : 0,
      ...keys.map((/** @type {string} */ k) => q.quantiles[k][i]),
      q.max?.[i],
      q.mean_sq?.[i],
    ]),
  );
}

/** @param {any} hist an /examples/histogram payload */
export function histogramCSV(hist) {
  return toCSV(
    ["lower", "upper", "count"],
    (hist.counts ?? []).map((/** @type {number} */ c, /** @type {number} */ i) => [
      hist.edges[i],
      hist.edges[i + 1],
      c,
    ]),
  );
}

export const OUTLIER_COLUMNS = Object.freeze([
  { key: "id", label: "id", numeric: false, title: "the example's id (or batch position)" },
  {
    key: "outlier_steps",
    integer: true,
    label: "outlier steps",
    numeric: true,
    title: "logged steps at which its norm exceeded the threshold times the step's median",
  },
  {
    key: "seen",
    integer: true,
    label: "seen",
    numeric: true,
    title: "logged steps at which it was kept",
  },
  { key: "max_ratio", label: "max ratio", numeric: true, title: "its largest norm / median" },
  {
    key: "max_step",
    integer: true,
    label: "at step",
    numeric: true,
    title: "the step of its max ratio",
  },
  { key: "mean_ratio", label: "mean ratio", numeric: true, title: "its mean norm / median" },
  { key: "last_loss", label: "last loss", numeric: true, title: "its loss at the last step seen" },
  {
    key: "last_step",
    integer: true,
    label: "last step",
    numeric: true,
    title: "the last step it was seen",
  },
]);

/**
 * A cell of the outlier table as shown: counts and steps as integers, ratios and losses with 4
 * significant digits, ids as they are.
 * @param {{key: string, numeric: boolean, integer?: boolean}} col
 * @param {any} row
 */
export function cellText(col, row) {
  const v = row[col.key];
  if (!col.numeric) return String(v);
  return formatNumber(v, { digits: 4, integer: !!col.integer });
}

/**
 * The outlier table's CSV, in the order given.
 * @param {any[]} rows
 */
export function outliersCSV(rows) {
  const keys = [...OUTLIER_COLUMNS.map((c) => c.key), "last_ratio"];
  return toCSV(
    keys,
    rows.map((r) => keys.map((k) => r[k])),
  );
}

/** @param {any} c an /examples/clip payload */
export function clipCSV(c) {
  return toCSV(
    ["step", "batch_size", "capped", "clipped", "fraction", "clip_norm"],
    (c.steps ?? []).map((/** @type {number} */ s, /** @type {number} */ i) => [
      s,
      c.batch_size?.[i],
      c.capped?.[i] ? 1 : 0,
      c.clipped?.[i],
      c.fraction?.[i],
      c.clip_norm,
    ]),
  );
}

/** `[[x, ...ys], ...]` as a data attribute (the browser tests read what is drawn from it). */
const dataValues = (/** @type {any[]} */ rows) => JSON.stringify(rows);

/**
 * A line-chart frame: the figure, its plot group, and x (steps) and y scales.
 * @param {{width: number, height: number, steps: number[], values: number[], log: boolean,
 *   theme: any, title: string, subtitle: string, ylabel: string, yDomain?: number[],
 *   extraBottom?: number}} o extraBottom: pixels kept free below the x axis' label (a legend)
 */
function stepFrame(o) {
  const { width, height, steps, values, log, theme } = o;
  const svg = newFigure(width, height, theme);
  drawTitle(svg, o.title, o.subtitle, theme);
  const plotW = width - MARGIN.left - MARGIN.right;
  const plotH = height - MARGIN.top - MARGIN.bottom - (o.extraBottom ?? 0);
  let [s0, s1] = [Math.min(...steps), Math.max(...steps)];
  if (s0 === s1) [s0, s1] = [s0 - 1, s1 + 1];
  const x = d3.scaleLinear().domain([s0, s1]).range([0, plotW]);
  const finite = values.filter((v) => Number.isFinite(v) && (!log || v > 0));
  let [y0, y1] = o.yDomain ?? (finite.length ? [Math.min(...finite), Math.max(...finite)] : [0, 1]);
  if (y0 === y1) [y0, y1] = log ? [y0 / 2, y1 * 2] : [y0 - 0.5, y1 + 0.5];
  const y = log
    ? d3.scaleLog().domain([y0, y1]).range([plotH, 0])
    : d3
        .scaleLinear()
        .domain(niceDomain(y0, y1, 5))
        .range([plotH, 0]);
  const g = svg.append("g").attr("transform", `translate(${MARGIN.left},${MARGIN.top})`);
  drawAxis(g.append("g").attr("transform", `translate(0,${plotH})`), x, {
    orient: "bottom",
    theme,
    label: "step",
    tickValues: x.ticks(Math.max(2, Math.floor(plotW / 90))).filter(Number.isInteger),
    tickFormat: (v) => String(v),
  });
  drawAxis(g.append("g"), y, { orient: "left", log, theme, label: o.ylabel, gridLength: plotW });
  return { svg, g, x, y, plotW, plotH };
}

export class ExamplesView extends View {
  /**
   * @param {HTMLElement} container
   * @param {{onStep: (step: number | null) => void, onThreshold: (v: number | null) => void,
   *   onClip: (v: number | null) => void}} actions state changes (index.js dispatches them)
   */
  constructor(container, actions) {
    super(container);
    this.actions = actions;
    this.sortKey = "outlier_steps";
    this.descending = true;
    /** @type {Record<string, any>} the numbers drawn, per part (for the tests) */
    this.drawn = {};
  }

  /**
   * model: {run, tag, column, view (/examples/tags' view), quantiles, histogram, outliers, clip
   * (null without a clipping norm), clipNorm, threshold, step (the histogram's, null: the
   * latest), theme, exportTheme}.
   * @param {any} model
   */
  update(model) {
    this.model = model;
    this.width = Math.max(320, Math.min(this.container.clientWidth || 720, 1100));
    const parts = [
      this.part("ex-fan", this.fanTools(), () => this.fanFigure(model.theme, true)),
      this.part("ex-hist", this.histTools(), () => this.histFigure(model.theme, true)),
      this.outlierPart(),
      this.part("ex-clip", this.clipTools(), () => this.clipFigure(model.theme, true)),
    ];
    this.container.replaceChildren(...parts);
  }

  /**
   * @param {string} cls
   * @param {HTMLElement} tools
   * @param {() => any} draw the figure (a d3 selection)
   */
  part(cls, tools, draw) {
    const svg = draw();
    return h("div", { class: `ex-part ${cls}` }, [
      h("div", { class: "card-tools" }, [tools]),
      h("div", { class: "figure", style: `width:${this.width}px` }, [svg.node()]),
    ]);
  }

  subject() {
    const { run, column } = this.model;
    return `${column === "model" ? "whole model" : column} · run ${run}`;
  }

  // ------------------------------------------------------------------------------- fan chart

  fanTools() {
    const m = this.model;
    const capped = (m.quantiles?.capped ?? []).filter(Boolean).length;
    const notes = m.view?.notes ?? {};
    // What capping means for the numbers (exact when no step was capped), from the backend.
    const exactness = capped
      ? `${capped} of ${m.quantiles.steps.length} steps capped. ${notes.capped ?? ""}`
      : "No step capped: every quantile is exact.";
    return h("span", { class: "ex-tools" }, [
      h("span", { class: "hint" }, [
        h("span", { text: notes.quantiles ?? "" }),
        h("span", { class: "ex-exactness", text: ` ${exactness}` }),
      ]),
      exportButtons({
        figure: () => this.fanFigure(this.model.exportTheme, false).node(),
        csv: () => quantilesCSV(m.quantiles),
        json: () => toJSON(m.quantiles),
        name: () => [m.run, m.column, "norm_quantiles"],
      }),
    ]);
  }

  /** @param {any} theme @param {boolean} interactive */
  fanFigure(theme, interactive) {
    const fan = fanData(this.model.quantiles);
    if (interactive) this.drawn.fan = fan;
    const capped = fan.capped.filter(Boolean).length;
    const subtitle =
      `${this.subject()} · median, ${fan.bands.map((b) => b.label).join(", ")} bands, max` +
      (capped ? ` · ${capped} capped step${capped === 1 ? "" : "s"} (quantiles estimated)` : "") +
      (this.model.quantiles.max_steps_read
        ? ` · a sample of ${this.model.quantiles.max_steps_read} steps (the data server's reply limit)`
        : "");
    const width = this.width;
    const height = 338;
    if (!fan.steps.length) {
      const svg = newFigure(width, height, theme);
      drawTitle(svg, "Per-example gradient norms", subtitle, theme);
      drawEmpty(svg, width, height, "no logged steps", theme);
      return svg;
    }
    const values = [...fan.bands.flatMap((b) => [...b.lower, ...b.upper]), ...fan.max];
    const { svg, g, x, y } = stepFrame({
      width,
      height,
      steps: fan.steps,
      values,
      log: fan.log,
      theme,
      title: "Per-example gradient norms over training",
      subtitle,
      ylabel: `||g_j||${fan.log ? " (log)" : ""}`,
      extraBottom: 18,
    });
    const light = theme.text === "#212121";
    const color = light ? "#1565c0" : "#64b5f6";
    const opacity = BAND_OPACITY[light ? "light" : "dark"];
    const ok = (/** @type {number} */ v) => Number.isFinite(v) && (!fan.log || v > 0);
    fan.bands.forEach((b, k) => {
      const upper = fan.steps.map((s, i) => [x(s), ok(b.upper[i]) ? y(b.upper[i]) : NaN]);
      const lower = fan.steps.map((s, i) => [x(s), ok(b.lower[i]) ? y(b.lower[i]) : NaN]);
      const d =
        fan.steps.length === 1
          ? linePath([upper[0], lower[0]])
          : `${linePath(upper)}L${linePath([...lower].reverse()).slice(1)}Z`;
      g.append("path")
        .attr("class", "ex-band")
        .attr("data-band", b.label)
        .attr("data-values", dataValues(fan.steps.map((s, i) => [s, b.lower[i], b.upper[i]])))
        .attr("d", d)
        .attr("fill", fan.steps.length === 1 ? "none" : color)
        .attr("fill-opacity", opacity[k] ?? 0.2)
        .attr("stroke", fan.steps.length === 1 ? color : "none");
    });
    const line = (/** @type {number[]} */ v, /** @type {string} */ cls, dash = "") =>
      g
        .append("path")
        .attr("class", cls)
        .attr("data-values", dataValues(fan.steps.map((s, i) => [s, v[i]])))
        .attr("d", linePath(fan.steps.map((s, i) => [x(s), ok(v[i]) ? y(v[i]) : NaN])))
        .attr("fill", "none")
        .attr("stroke", color)
        .attr("stroke-width", cls === "ex-median" ? 2 : 1.25)
        .attr("stroke-dasharray", dash);
    line(fan.median, "ex-median");
    line(fan.max, "ex-max", "4,3");
    if (interactive && fan.steps.length <= 120) {
      fan.steps.forEach((s, i) => {
        if (!ok(fan.median[i])) return;
        const tip = [
          `step ${s}`,
          `median ${formatValue(fan.median[i], 4)}`,
          ...fan.bands.map(
            (b) => `${b.label}: ${formatValue(b.lower[i], 4)} – ${formatValue(b.upper[i], 4)}`,
          ),
          `max ${formatValue(fan.max[i], 4)}`,
          fan.capped[i] ? "capped: quantiles estimated" : "",
        ];
        g.append("circle")
          .attr("class", "ex-point")
          .attr("cx", x(s))
          .attr("cy", y(fan.median[i]))
          .attr("r", 3)
          .attr("fill", color)
          .append("title")
          .text(tip.filter(Boolean).join("\n"));
      });
    }
    // legend, below the x axis (never over the bands)
    const legend = svg
      .append("g")
      .attr("class", "legend")
      .attr("transform", `translate(${MARGIN.left},${height - 8})`);
    const items = [
      ...fan.bands.map((b, k) => ({ label: b.label, op: opacity[k] ?? 0.2, dash: null })),
      { label: "median", op: null, dash: "" },
      { label: "max", op: null, dash: "4,3" },
    ];
    let lx = 0;
    for (const it of items) {
      if (it.op !== null)
        legend
          .append("rect")
          .attr("x", lx)
          .attr("y", -8)
          .attr("width", 14)
          .attr("height", 9)
          .attr("fill", color)
          .attr("fill-opacity", it.op);
      else
        legend
          .append("line")
          .attr("x1", lx)
          .attr("x2", lx + 14)
          .attr("y1", -4)
          .attr("y2", -4)
          .attr("stroke", color)
          .attr("stroke-width", 2)
          .attr("stroke-dasharray", it.dash);
      legend
        .append("text")
        .attr("x", lx + 18)
        .attr("y", 0)
        .attr("fill", theme.muted)
        .text(it.label);
      lx += 26 + 6.5 * it.label.length;
    }
    return svg;
  }

  // ------------------------------------------------------------------------------- histogram

  histTools() {
    const m = this.model;
    const steps = Array.from(m.quantiles?.steps ?? [], Number);
    const shown = m.histogram?.step;
    const stepSelect = h(
      "select",
      {
        class: "ex-step",
        "aria-label": "step of the histogram",
        onchange: (/** @type {Event} */ e) => {
          const v = /** @type {HTMLSelectElement} */ (e.target).value;
          this.actions.onStep(v === "latest" ? null : Number(v));
        },
      },
      [
        h("option", { value: "latest", text: "latest", selected: m.step === null }),
        ...steps.map((s) =>
          h("option", { value: String(s), text: String(s), selected: m.step === s }),
        ),
      ],
    );
    return h("span", { class: "ex-tools" }, [
      h("label", { class: "field" }, [h("span", { text: "step" }), stepSelect]),
      h("span", {
        class: "hint",
        text:
          shown === undefined
            ? ""
            : `step ${shown} · ${m.histogram.batch_size} examples${m.histogram.capped ? ` (${m.histogram.rows} rows kept: counts estimated)` : ""}`,
      }),
      exportButtons({
        figure: () => this.histFigure(this.model.exportTheme, false).node(),
        csv: () => histogramCSV(m.histogram),
        json: () => toJSON(m.histogram),
        name: () => [m.run, m.column, "norm_histogram", `step${shown}`],
      }),
    ]);
  }

  /** @param {any} theme @param {boolean} interactive */
  histFigure(theme, interactive) {
    const hist = this.model.histogram;
    const width = this.width;
    const height = 260;
    const svg = newFigure(width, height, theme);
    const extra = [
      hist.zeros
        ? `${formatNumber(hist.zeros, { digits: 4, trim: true })} zero norms not shown`
        : "",
      hist.nonfinite ? `${hist.nonfinite} non-finite` : "",
    ].filter(Boolean);
    drawTitle(
      svg,
      `Per-example gradient norms at step ${hist.step}`,
      `${this.subject()} · log x, ${hist.per_decade} bins per decade${extra.length ? ` · ${extra.join(", ")}` : ""}`,
      theme,
    );
    const edges = hist.edges;
    const counts = hist.counts;
    if (interactive) this.drawn.histogram = { step: hist.step, edges, counts };
    if (!counts.length) {
      drawEmpty(svg, width, height, "no positive norms at this step", theme);
      return svg;
    }
    const plotW = width - MARGIN.left - MARGIN.right;
    const plotH = height - MARGIN.top - MARGIN.bottom;
    const x = d3
      .scaleLog()
      .domain([edges[0], edges[edges.length - 1]])
      .range([0, plotW]);
    const y = d3
      .scaleLinear()
      .domain(niceDomain(0, Math.max(1, ...counts), 5))
      .range([plotH, 0]);
    const g = svg.append("g").attr("transform", `translate(${MARGIN.left},${MARGIN.top})`);
    drawAxis(g.append("g").attr("transform", `translate(0,${plotH})`), x, {
      orient: "bottom",
      log: true,
      theme,
      label: "||g_j|| (log)",
    });
    drawAxis(g.append("g"), y, { orient: "left", theme, label: "examples", gridLength: plotW });
    const color = theme.text === "#212121" ? "#1565c0" : "#64b5f6";
    counts.forEach((c, i) => {
      if (!(c > 0)) return;
      const x0 = x(edges[i]);
      const x1 = x(edges[i + 1]);
      g.append("rect")
        .attr("class", "ex-bar")
        .attr("data-lo", edges[i])
        .attr("data-hi", edges[i + 1])
        .attr("data-count", c)
        .attr("x", x0 + 0.5)
        .attr("width", Math.max(1, x1 - x0 - 1))
        .attr("y", y(c))
        .attr("height", plotH - y(c))
        .attr("fill", color)
        .attr("fill-opacity", 0.75)
        .append("title")
        .text(
          `${formatValue(edges[i], 4)} – ${formatValue(edges[i + 1], 4)}: ${formatValue(c, 4)}`,
        );
    });
    return svg;
  }

  // -------------------------------------------------------------------------------- outliers

  sortedOutliers() {
    return sortRows(this.model.outliers?.rows ?? [], this.sortKey, this.descending);
  }

  outlierPart() {
    const m = this.model;
    const o = m.outliers;
    const input = /** @type {HTMLInputElement} */ (
      h("input", {
        type: "number",
        class: "ex-threshold",
        min: 1,
        step: "any",
        value: String(o.threshold),
        "aria-label": "outlier threshold (times the step's median norm)",
      })
    );
    input.addEventListener("change", () => this.actions.onThreshold(parsePositive(input.value)));
    const byPosition = o.keyed_by === "position";
    const caption =
      `${o.total} example${o.total === 1 ? "" : "s"} above ${formatNumber(o.threshold, { trim: true })}× ` +
      `the step's median norm at least once, over ${o.steps.length} logged step${o.steps.length === 1 ? "" : "s"}` +
      (o.rows.length < o.total ? ` (the first ${o.rows.length} by outlier steps shown)` : "") +
      (byPosition ? " · no example ids were logged: rows are batch positions" : "");
    const tools = h("span", { class: "ex-tools" }, [
      h("label", { class: "field", title: m.view?.notes?.outliers ?? "" }, [
        h("span", { text: "outlier: norm / median >" }),
        input,
      ]),
      h("span", { class: "hint ex-outlier-caption", text: caption }),
      exportButtons({
        figure: () => this.outlierFigure(this.model.exportTheme).node(),
        csv: () => outliersCSV(this.sortedOutliers()),
        json: () => toJSON({ ...o, rows: this.sortedOutliers() }),
        name: () => [m.run, m.column, "outliers"],
      }),
    ]);
    const wrap = h("div", { class: "table-wrap ex-table-wrap" });
    const renderTable = () => {
      const head = h(
        "tr",
        {},
        OUTLIER_COLUMNS.map((col) => {
          const active = col.key === this.sortKey;
          const th = h("th", {
            class: `${col.numeric ? "num" : ""} ${active ? "sorted" : ""}`,
            scope: "col",
            tabindex: 0,
            "aria-sort": active ? (this.descending ? "descending" : "ascending") : "none",
            "data-key": col.key,
            title: col.title,
            text: `${col.key === "id" && byPosition ? "position" : col.label}${active ? (this.descending ? " ▼" : " ▲") : ""}`,
          });
          const sort = () => {
            if (this.sortKey === col.key) this.descending = !this.descending;
            else {
              this.sortKey = col.key;
              this.descending = col.numeric;
            }
            renderTable();
          };
          th.addEventListener("click", sort);
          th.addEventListener("keydown", (e) => {
            if (e.key === "Enter" || e.key === " ") {
              e.preventDefault();
              sort();
            }
          });
          return th;
        }),
      );
      const body = h(
        "tbody",
        {},
        this.sortedOutliers().map((r) =>
          h(
            "tr",
            { "data-id": String(r.id) },
            OUTLIER_COLUMNS.map((col) =>
              h("td", {
                class: col.numeric ? "num" : "id-cell",
                "data-key": col.key,
                "data-value": String(r[col.key]),
                text: cellText(col, r),
              }),
            ),
          ),
        ),
      );
      wrap.replaceChildren(
        o.rows.length
          ? h("table", { class: "summary ex-outliers" }, [h("thead", {}, [head]), body])
          : h("div", { class: "message info", text: "No outliers at this threshold." }),
      );
    };
    renderTable();
    return h("div", { class: "ex-part ex-outlier-part" }, [
      h("div", { class: "card-tools" }, [tools]),
      wrap,
    ]);
  }

  /** The outlier table as a figure (PNG/SVG export). @param {any} theme */
  outlierFigure(theme) {
    const o = this.model.outliers;
    return tableFigure({
      title: "Outlier examples",
      subtitle: `${this.subject()} · norm / median > ${o.threshold} · sorted by ${this.sortKey}${this.descending ? " (descending)" : ""}`,
      theme,
      columns: OUTLIER_COLUMNS,
      widths: [140, 100, 60, 90, 70, 90, 110, 80],
      rows: this.sortedOutliers(),
      text: cellText,
    });
  }

  // ---------------------------------------------------------------------------- clipping

  clipTools() {
    const m = this.model;
    const input = /** @type {HTMLInputElement} */ (
      h("input", {
        type: "number",
        class: "ex-clip-norm",
        min: 0,
        step: "any",
        value: m.clipNorm === null ? "" : String(m.clipNorm),
        placeholder: "C",
        "aria-label": "clipping norm C",
      })
    );
    input.addEventListener("change", () => this.actions.onClip(parsePositive(input.value)));
    return h("span", { class: "ex-tools" }, [
      h("label", { class: "field", title: m.view?.notes?.clip ?? "" }, [
        h("span", { text: "clipping norm C" }),
        input,
      ]),
      m.clip &&
        exportButtons({
          figure: () => this.clipFigure(this.model.exportTheme, false).node(),
          csv: () => clipCSV(m.clip),
          json: () => toJSON(m.clip),
          name: () => [m.run, m.column, "clipped", `C${m.clipNorm}`],
        }),
    ]);
  }

  /** @param {any} theme @param {boolean} interactive */
  clipFigure(theme, interactive) {
    const c = this.model.clip;
    const width = this.width;
    const height = 240;
    if (!c) {
      const svg = newFigure(width, height, theme);
      drawTitle(svg, "Clipped examples", this.subject(), theme);
      const med = this.model.quantiles?.quantiles?.p50;
      const hint = med?.length
        ? ` (the latest median norm is ${formatValue(med[med.length - 1], 3)})`
        : "";
      drawEmpty(
        svg,
        width,
        height,
        `Enter a clipping norm C to see the fraction clipped per step${hint}`,
        theme,
      );
      if (interactive) this.drawn.clip = null;
      return svg;
    }
    const steps = Array.from(c.steps, Number);
    const frac = Array.from(c.fraction, Number);
    if (interactive) this.drawn.clip = { steps, fraction: frac, clipNorm: c.clip_norm };
    const { svg, g, x, y } = stepFrame({
      width,
      height,
      steps,
      values: frac,
      log: false,
      theme,
      title: `Fraction of examples clipped at C = ${formatNumber(c.clip_norm, { digits: 6, trim: true })}`,
      subtitle: `${this.subject()} · ||g_j|| > C, per logged step`,
      ylabel: "fraction clipped",
      yDomain: [0, Math.max(0.05, ...frac.filter(Number.isFinite))],
    });
    const color = theme.text === "#212121" ? "#c62828" : "#ef9a9a";
    g.append("path")
      .attr("class", "ex-clip-line")
      .attr("data-values", dataValues(steps.map((s, i) => [s, frac[i]])))
      .attr("d", linePath(steps.map((s, i) => [x(s), Number.isFinite(frac[i]) ? y(frac[i]) : NaN])))
      .attr("fill", "none")
      .attr("stroke", color)
      .attr("stroke-width", 1.75);
    if (steps.length <= 120)
      steps.forEach((s, i) => {
        if (!Number.isFinite(frac[i])) return;
        g.append("circle")
          .attr("cx", x(s))
          .attr("cy", y(frac[i]))
          .attr("r", 2.5)
          .attr("fill", color)
          .append("title")
          .text(
            `step ${s}: ${formatValue(100 * frac[i], 4)} % clipped (${c.clipped[i]} of ${c.batch_size[i]})`,
          );
      });
    return svg;
  }
}
