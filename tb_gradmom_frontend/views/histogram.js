// @ts-check
// Histograms of a statistic over a variable's elements: one step as bars, or all steps as an
// offset ("ridge") view in the manner of TensorBoard's histogram dashboard; linear or log x.

import * as d3 from "../vendor/d3.js";
import {
  evenSample,
  formatTick,
  histogramStepsLabel,
  linePath,
  robustBinRange,
  toCSV,
} from "../core.js";
import {
  drawAxis,
  drawEmpty,
  drawTitle,
  exportButtons,
  h,
  newFigure,
  toJSON,
  View,
} from "./common.js";

const MARGIN = { top: 48, right: 24, bottom: 50, left: 66 };
// At most this many ridges (evenly spaced steps, first and last kept): about 7 px apart at the
// plot's height, so each stays readable.
export const MAX_RIDGES = 40;

export class HistogramView extends View {
  /**
   * model: {data (fetchHistogram), mode: "step"|"steps", run, tag, stat, color, theme,
   * exportTheme, overlays: null, or [{run, label, data, color}] overlaid (a comparison)}.
   */
  update(model) {
    this.model = model;
    const width = Math.max(360, Math.min(this.container.clientWidth || 720, 1100));
    const height = model.mode === "steps" ? 400 : 300;
    this.size = { width, height };
    const svg = this.figure(model.theme);
    this.container.replaceChildren(
      h("div", { class: "card-tools" }, [
        exportButtons({
          figure: () => this.figure(this.model.exportTheme).node(),
          csv: () => this.csv(),
          json: () =>
            toJSON(
              this.model.overlays
                ? this.model.overlays.map((o) => ({ run: o.run, label: o.label, ...o.data }))
                : this.model.data,
            ),
          name: () =>
            model.overlays
              ? [
                  "compare",
                  model.tag,
                  model.stat,
                  "histograms",
                  ...model.overlays.map((o) => `${o.run}-step${o.data.series[0]?.step}`),
                ]
              : [
                  model.run,
                  model.tag,
                  model.stat,
                  model.mode === "steps"
                    ? "histograms"
                    : `histogram-step${model.data.series[0]?.step}`,
                ],
        }),
      ]),
      h("div", { class: "figure" }, [svg.node()]),
    );
  }

  figure(theme) {
    if (this.model.overlays) return this.overlayFigure(theme);
    const { data, mode, tag, stat, run, color } = this.model;
    const { width, height } = this.size;
    const svg = newFigure(width, height, theme);
    const series = [...data.series].sort((a, b) => a.step - b.step);
    const log = data.scale === "log";
    const maxRidges = this.model.maxRidges ?? MAX_RIDGES;
    const shown = mode === "steps" ? evenSample(series, maxRidges) : series.slice(-1);
    // The ridges' x range: the bins holding the 0.5-99.5 % quantiles of the shown counts (a few
    // extreme values would otherwise squeeze the data into a few pixels); the rest is counted.
    const full = { first: 0, last: data.edges.length - 2, outside: 0 };
    const range = (mode === "steps" ? robustBinRange(shown.map((s) => s.counts)) : null) ?? full;
    const notes = [
      histogramStepsLabel(data, mode),
      shown.length < series.length ? `${shown.length} of ${series.length} steps drawn` : "",
      `${data.edges.length - 1} bins${log ? " · log x" : ""}`,
      range.outside ? `x: 0.5–99.5 % of the values, ${range.outside} outside` : "",
    ].filter(Boolean);
    drawTitle(
      svg,
      `Histogram of the ${this.model.label ?? stat} over the elements of ${tag}`,
      `run ${run} · ${notes.join(" · ")}`,
      theme,
    );
    if (!series.length || data.edges.length < 2) {
      drawEmpty(svg, width, height, "no finite values to bin", theme);
      return svg;
    }
    const plotW = width - MARGIN.left - MARGIN.right;
    const plotH = height - MARGIN.top - MARGIN.bottom;
    // Only the bins of the robust range are drawn.
    const edges = data.edges.slice(range.first, range.last + 2);
    const clip = (counts) => counts.slice(range.first, range.last + 1);
    const x = (log ? d3.scaleLog() : d3.scaleLinear())
      .domain([edges[0], edges[edges.length - 1]])
      .range([0, plotW]);
    const g = svg.append("g").attr("transform", `translate(${MARGIN.left},${MARGIN.top})`);
    const xlabel = `${this.model.label ?? stat}${log ? " (log scale)" : ""}`;
    // The x axis (the statistic's bins), below the plot in both modes.
    drawAxis(g.append("g").attr("transform", `translate(0,${plotH})`), x, {
      orient: "bottom",
      log,
      theme,
      label: xlabel,
      count: Math.floor(plotW / 80),
    });

    if (mode !== "steps") {
      const counts = clip(series[series.length - 1].counts);
      const y = d3
        .scaleLinear()
        .domain([0, Math.max(1, ...counts)])
        .nice()
        .range([plotH, 0]);
      drawAxis(g.append("g"), y, {
        orient: "left",
        theme,
        label: "elements",
        gridLength: plotW,
        count: 5,
        tickValues: y.ticks(5).filter(Number.isInteger),
      });
      const bars = g.append("g").attr("class", "bars");
      counts.forEach((c, k) => {
        const x0 = x(edges[k]);
        const x1 = x(edges[k + 1]);
        bars
          .append("rect")
          .attr("class", "bar")
          .attr("x", x0 + 0.5)
          .attr("width", Math.max(0.5, x1 - x0 - 1))
          .attr("y", y(c))
          .attr("height", plotH - y(c))
          .attr("fill", color)
          .attr("fill-opacity", 0.85)
          .attr("data-count", c)
          .append("title")
          .text(`[${formatTick(edges[k])}, ${formatTick(edges[k + 1])}): ${c}`);
      });
      return svg;
    }

    // Offset view: oldest step at the top, newest in front at the bottom.
    const maxCount = Math.max(1, ...shown.flatMap((s) => clip(s.counts)));
    // Each ridge is OVERLAP times as tall as the spacing between baselines (the oldest at the
    // top, its ridge fully inside the plot): ridgeH = OVERLAP * (plotH - ridgeH) / (n - 1).
    const OVERLAP = 2.5;
    const ridgeH = (OVERLAP * plotH) / (shown.length - 1 + OVERLAP);
    const yStep = d3
      .scaleLinear()
      .domain([shown[0].step, shown[shown.length - 1].step])
      .range([ridgeH, plotH]);
    if (shown.length === 1) yStep.domain([shown[0].step - 1, shown[0].step]);
    drawAxis(g.append("g"), yStep, {
      orient: "left",
      theme,
      label: "step",
      tickValues: d3
        .scaleLinear()
        .domain(yStep.domain())
        .ticks(6)
        .filter((v) => Number.isInteger(v) && v >= yStep.domain()[0] && v <= yStep.domain()[1]),
      tickFormat: (v) => String(v),
    });
    const ridges = g.append("g").attr("class", "ridges");
    shown.forEach((s, idx) => {
      const base = yStep(s.step);
      const pts = [[x(edges[0]), base]];
      clip(s.counts).forEach((c, k) => {
        const top = base - (c / maxCount) * ridgeH;
        pts.push([x(edges[k]), top], [x(edges[k + 1]), top]);
      });
      pts.push([x(edges[edges.length - 1]), base]);
      const opacity = 0.25 + (0.6 * (idx + 1)) / shown.length;
      ridges
        .append("path")
        .attr("class", "ridge")
        .attr("data-step", s.step)
        .attr("d", linePath(pts) + "Z")
        .attr("fill", theme.background)
        .attr("stroke", "none");
      ridges
        .append("path")
        .attr("d", linePath(pts) + "Z")
        .attr("fill", color)
        .attr("fill-opacity", opacity * 0.6)
        .attr("stroke", color)
        .attr("stroke-opacity", opacity)
        .attr("stroke-width", 1)
        .append("title")
        .text(`step ${s.step}`);
    });
    return svg;
  }

  /**
   * A comparison: one histogram per run (or step) overlaid as outlines, each bin's height its
   * share of the elements per unit of x (per decade on log x), so that histograms binned
   * over different ranges read on one axis; a legend names each.
   */
  overlayFigure(theme) {
    const { overlays, tag, stat } = this.model;
    const { width, height } = this.size;
    const svg = newFigure(width, height, theme);
    const log = overlays.some((o) => o.data.scale === "log");
    const tx = (v) => (log ? Math.log10(v) : v);
    const curves = overlays.map((o) => ({ ...o, ...overlayDensity(o.data, tx) }));
    const legendW = 30 + 6.5 * Math.max(0, ...overlays.map((o) => String(o.label).length));
    drawTitle(
      svg,
      `Histograms of the ${this.model.label ?? stat} over the elements of ${tag}, compared`,
      `${overlays
        .map((o) => {
          const step = `step ${o.data.series[0]?.step ?? "–"}`;
          return o.label === step ? step : `${o.label}: ${step}`;
        })
        .join(" · ")}` + ` · share of elements per ${log ? "decade (log x)" : "unit of x"}`,
      theme,
      Math.min(legendW, width / 3),
    );
    const edges = curves.flatMap((c) => c.edges);
    if (!edges.length) {
      drawEmpty(svg, width, height, "no finite values to bin", theme);
      return svg;
    }
    const top = Math.max(MARGIN.top, 24 + 14 * overlays.length);
    const plotW = width - MARGIN.left - MARGIN.right;
    const plotH = height - top - MARGIN.bottom;
    const x = (log ? d3.scaleLog() : d3.scaleLinear())
      .domain([Math.min(...edges), Math.max(...edges)])
      .range([0, plotW]);
    const ymax = Math.max(1e-300, ...curves.flatMap((c) => c.density.filter(Number.isFinite)));
    const y = d3.scaleLinear().domain([0, ymax]).nice().range([plotH, 0]);
    const g = svg.append("g").attr("transform", `translate(${MARGIN.left},${top})`);
    drawAxis(g.append("g").attr("transform", `translate(0,${plotH})`), x, {
      orient: "bottom",
      log,
      theme,
      label: `${this.model.label ?? stat}${log ? " (log scale)" : ""}`,
      count: Math.floor(plotW / 80),
    });
    drawAxis(g.append("g"), y, {
      orient: "left",
      theme,
      label: log ? "share per decade" : "share per unit",
      gridLength: plotW,
      count: 5,
    });
    const outlines = g.append("g").attr("class", "overlays");
    curves.forEach((c) => {
      if (!c.edges.length) return;
      const pts = [[x(c.edges[0]), y(0)]];
      c.density.forEach((v, k) => {
        pts.push([x(c.edges[k]), y(v)], [x(c.edges[k + 1]), y(v)]);
      });
      pts.push([x(c.edges[c.edges.length - 1]), y(0)]);
      outlines
        .append("path")
        .attr("class", "overlay")
        .attr("data-run", c.run)
        .attr("data-step", c.data.series[0]?.step)
        .attr("d", linePath(pts))
        .attr("fill", c.color)
        .attr("fill-opacity", 0.12)
        .attr("stroke", c.color)
        .attr("stroke-width", 1.5)
        .append("title")
        .text(`${c.label}: ${c.total} elements`);
    });
    const legend = svg
      .append("g")
      .attr("class", "legend")
      .attr("transform", `translate(${width - MARGIN.right - legendW + 24},14)`);
    overlays.forEach((o, k) => {
      const row = legend.append("g").attr("transform", `translate(0,${14 * k})`);
      row.append("rect").attr("y", -8).attr("width", 12).attr("height", 3).attr("fill", o.color);
      row
        .append("text")
        .attr("x", 16)
        .attr("y", -3)
        .attr("font-size", 11)
        .attr("fill", theme.text)
        .text(o.label);
    });
    return svg;
  }

  csv() {
    if (this.model.overlays) {
      const rows = [];
      for (const o of this.model.overlays) {
        const s = o.data.series[0];
        if (s)
          s.counts.forEach((c, k) =>
            rows.push([o.run, s.step, o.data.edges[k], o.data.edges[k + 1], c]),
          );
      }
      return toCSV(["run", "step", "bin_left", "bin_right", "count"], rows);
    }
    const { data, mode } = this.model;
    const series = [...data.series].sort((a, b) => a.step - b.step);
    const shown = mode === "steps" ? series : series.slice(-1);
    const rows = [];
    for (const s of shown)
      s.counts.forEach((c, k) => rows.push([s.step, data.edges[k], data.edges[k + 1], c]));
    return toCSV(["step", "bin_left", "bin_right", "count"], rows);
  }
}

/**
 * One overlaid histogram's outline: its bin edges and each bin's share of the elements per
 * unit of `tx(x)` (x itself, or log10 x on a log axis), and the elements counted.
 */
export function overlayDensity(data, tx = (v) => v) {
  const counts = data.series[0]?.counts ?? [];
  const total = counts.reduce((a, b) => a + b, 0);
  if (!total || data.edges.length < 2) return { edges: [], density: [], total };
  const density = counts.map((c, k) => {
    const w = tx(data.edges[k + 1]) - tx(data.edges[k]);
    return w > 0 ? c / total / w : 0;
  });
  return { edges: data.edges, density, total };
}
