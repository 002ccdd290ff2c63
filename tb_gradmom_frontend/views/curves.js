// @ts-check
// Noise curves: a derived statistic (noise scale, total variance, GSNR, ...) over steps, one
// line per run, for one variable or the whole model. Hover shows each run's value.

import * as d3 from "../vendor/d3.js";
import {
  bandSegments,
  estimateStatus,
  formatEstimate,
  formatValue,
  linePath,
  niceDomain,
  robustRange,
  splitCurve,
  toCSV,
} from "../core.js";
import {
  drawAxis,
  drawEmpty,
  drawTitle,
  exportButtons,
  fitText,
  h,
  newFigure,
  toJSON,
  View,
} from "./common.js";

const MARGIN = { top: 48, right: 24, bottom: 50, left: 72 };

export class CurvesView extends View {
  /**
   * @param {HTMLElement} container where the plot goes
   * @param {HTMLElement | null} [partsContainer] where a ratio's parts go (model.parts), a
   *   sibling of `container`, so that the plot's own container holds one figure
   */
  constructor(container, partsContainer = null) {
    super(container);
    this.partsContainer = partsContainer;
    /** @type {CurvesView[]} the panels of the ratio's parts */
    this.partViews = [];
  }

  /**
   * model: {label (what the curves are of), tag, metric, logy, smoothing, statistic (what the
   * metric is, from /meta: core.seriesInfo), positiveOnly (values <= 0 mean noise-dominated:
   * core.isPositiveOnly), series: [{run, color, steps, values (numbers), smoothed (numbers, or
   * null), wall_times}], theme, exportTheme}; optionally `parts`: the numerator and the
   * denominator of a ratio (the noise scale's tr(Σ) and |G|², /meta ratio_parts), each a model
   * like this one with its own smoothed series, drawn as two small panels below the ratio;
   * `compact`: a small panel.
   */
  update(model) {
    this.model = model;
    const width = Math.max(320, Math.min(this.container.clientWidth || 720, 1100));
    const base = model.compact ? 220 : 300;
    this.size = { width, height: base + Math.max(0, 14 * model.series.length - 24) };
    const svg = this.figure(model.theme, true);
    this.tooltip = h("div", { class: "tooltip", role: "tooltip", hidden: true });
    const fig = h("div", { class: "figure", style: `width:${width}px` }, [
      svg.node(),
      this.tooltip,
    ]);
    this.container.replaceChildren(
      h("div", { class: "card-tools" }, [
        exportButtons({
          figure: () => this.figure(this.model.exportTheme, false).node(),
          csv: () => this.csv(),
          json: () => toJSON({ tag: model.tag, metric: model.metric, series: model.series }),
          name: () => [model.tag === "_model" ? "model" : model.tag, model.metric],
        }),
      ]),
      fig,
    );
    this.drawParts(model);
  }

  /** The ratio's parts (model.parts) as small panels in `partsContainer`, or nothing. */
  drawParts(model) {
    const row = this.partsContainer;
    this.partViews = [];
    if (!row) return;
    if (!model.parts?.length) {
      row.replaceChildren();
      return;
    }
    // Every cell first, then the plots: each sizes itself to its cell's final width.
    const cells = model.parts.map((part) =>
      h("div", { class: "curves-part", "data-metric": part.metric }),
    );
    row.replaceChildren(...cells);
    this.partViews = model.parts.map((part, k) => {
      const view = new CurvesView(cells[k]);
      view.update({ ...part, compact: true, theme: model.theme, exportTheme: model.exportTheme });
      return view;
    });
  }

  showMessage(text, kind) {
    super.showMessage(text, kind);
    this.drawParts({});
  }

  clear() {
    super.clear();
    this.drawParts({});
  }

  figure(theme, interactive) {
    const { label, metric, logy, series } = this.model;
    const { width, height } = this.size;
    const svg = newFigure(width, height, theme);
    const { statistic, smoothing } = this.model;
    const name = this.model.title ?? statistic?.name ?? metric;
    const smooth = series.some((s) => s.smoothed);
    const band = series.some((x) => x.se) ? " · band ± 1 standard error over the window" : "";
    // The legend (run names, top right) keeps its corner: the title and subtitle stop before it.
    const legendW = 30 + 6.5 * Math.max(0, ...series.map((x) => String(x.run).length));
    drawTitle(
      svg,
      `${name}: ${label}`,
      `${series.length} run${series.length === 1 ? "" : "s"}${logy ? " · log y" : ""}` +
        `${smooth ? ` · smoothing ${smoothing}${band} · ${statistic?.smoothing ?? "EMA, bias-corrected"}; raw per step faint` : ""}`,
      theme,
      Math.min(legendW, width / 3),
    );
    // Positive-only quantities (a noise scale, a batch size) and log axes: values <= 0 are
    // not drawn as a line but marked, with the reason, along the bottom of the plot.
    const positiveOnly = logy || !!this.model.positiveOnly;
    // The legend (one line per run, top right) pushes the plot down when there are many runs.
    const top = Math.max(MARGIN.top, 24 + 14 * series.length);
    const plotW = width - MARGIN.left - MARGIN.right;
    const plotH = height - top - MARGIN.bottom;
    const allSteps = series.flatMap((s) => s.steps);
    const shown = (s) => splitCurve(s.smoothed ?? s.values, positiveOnly).line;
    // The axis fits what the line shows (the smoothed values; raw values beyond it are
    // clipped), robust to spikes (robustRange, on log10 for a log axis): a ratio whose smoothed
    // denominator nears 0 spikes far beyond the rest; such steps are drawn at the edge, marked.
    const allValues = series.flatMap(shown);
    const pool = logy ? allValues.filter((v) => v > 0).map(Math.log10) : allValues;
    const rr = robustRange(pool);
    let yext = rr && (logy ? [10 ** rr.lo, 10 ** rr.hi] : [rr.lo, rr.hi]);
    if (!allSteps.length) {
      drawEmpty(svg, width, height, `no steps of ${metric}`, theme);
      return svg;
    }
    // Steps but no value to draw (every estimate noise-dominated or undefined): the axes, the
    // markers along the bottom and the tooltip still say what each step is.
    const nothing = !yext;
    if (nothing) yext = logy ? [1, 10] : [0, 1];
    let [s0, s1] = [Math.min(...allSteps), Math.max(...allSteps)];
    if (s0 === s1) [s0, s1] = [s0 - 1, s1 + 1];
    const x = d3.scaleLinear().domain([s0, s1]).range([0, plotW]);
    let [y0, y1] = yext;
    if (y0 === y1)
      [y0, y1] = logy ? [y0 / 2, y1 * 2] : [y0 - Math.abs(y0 || 1) / 2, y1 + Math.abs(y1 || 1) / 2];
    const y = logy
      ? d3.scaleLog().domain([y0, y1]).range([plotH, 0])
      : d3
          .scaleLinear()
          .domain(niceDomain(y0, y1, 5))
          .range([plotH, 0]);
    const g = svg.append("g").attr("transform", `translate(${MARGIN.left},${top})`);
    drawAxis(g.append("g").attr("transform", `translate(0,${plotH})`), x, {
      orient: "bottom",
      theme,
      label: "step",
      count: Math.floor(plotW / 90),
      tickValues: x.ticks(Math.floor(plotW / 90)).filter(Number.isInteger),
      tickFormat: (v) => String(v),
    });
    drawAxis(g.append("g"), y, {
      orient: "left",
      log: logy,
      theme,
      label: this.model.axisLabel ?? metric,
      gridLength: plotW,
      count: 5,
    });
    if (nothing)
      g.append("text")
        .attr("class", "empty-note")
        .attr("x", plotW / 2)
        .attr("y", plotH / 2)
        .attr("text-anchor", "middle")
        .attr("fill", theme.muted)
        .text(`no ${logy || this.model.positiveOnly ? "positive " : ""}finite values to draw`);
    const lines = g.append("g").attr("class", "lines");
    const inRange = (v) => {
      const [d0, d1] = y.domain();
      return v >= Math.min(d0, d1) && v <= Math.max(d0, d1);
    };
    let markedCount = 0;
    // The bands drawn, in values (the browser tests compare them with the backend's numbers).
    const bands = [];
    if (interactive) this.bands = bands;
    let clippedCount = 0;
    const [dLo, dHi] = [Math.min(...y.domain()), Math.max(...y.domain())];
    for (const s of series) {
      if (s.smoothed) {
        const raw = splitCurve(s.values, positiveOnly).line;
        const rawPts = s.steps.map((st, k) => [
          x(st),
          Number.isFinite(raw[k]) && inRange(raw[k]) ? y(raw[k]) : NaN,
        ]);
        lines
          .append("path")
          .attr("class", "curve-raw")
          .attr("data-run", s.run)
          .attr("d", linePath(rawPts))
          .attr("fill", "none")
          .attr("stroke", s.color)
          .attr("stroke-opacity", 0.25)
          .attr("stroke-width", 1);
      }
      // The uncertainty band: the smoothed value ± its standard error (docs/math.md), clipped
      // to the axis.
      if (s.smoothed && s.se) {
        const clampY = (v) => y(Math.min(dHi, Math.max(dLo, v)));
        for (const b of bandSegments(s.steps, s.smoothed, s.se, positiveOnly)) {
          const upper = b.steps.map((st, k) => [x(st), clampY(b.hi[k])]);
          const lower = b.steps.map((st, k) => [x(st), clampY(b.lo[k])]).reverse();
          const d =
            b.steps.length === 1
              ? linePath([upper[0], lower[0]])
              : `${linePath(upper)}L${linePath(lower).slice(1)}Z`;
          lines
            .append("path")
            .attr("class", "band")
            .attr("data-run", s.run)
            .attr("d", d)
            .attr("fill", b.steps.length === 1 ? "none" : s.color)
            .attr("fill-opacity", 0.15)
            .attr("stroke", b.steps.length === 1 ? s.color : "none")
            .attr("stroke-opacity", 0.4);
          bands.push({ run: s.run, ...b });
        }
      }
      const { line, marked } = splitCurve(s.smoothed ?? s.values, positiveOnly);
      const pts = s.steps.map((st, k) => [
        x(st),
        Number.isFinite(line[k]) ? y(Math.min(dHi, Math.max(dLo, line[k]))) : NaN,
      ]);
      s.steps.forEach((st, k) => {
        const v = line[k];
        if (!Number.isFinite(v) || (v >= dLo && v <= dHi)) return;
        clippedCount += 1;
        const top = v > dHi;
        lines
          .append("path")
          .attr("class", "clip-marker")
          .attr("data-run", s.run)
          .attr("transform", `translate(${x(st)},${top ? 4 : plotH - 12})`)
          .attr("d", top ? "M-3.5,3L3.5,3L0,-3Z" : "M-3.5,-3L3.5,-3L0,3Z")
          .attr("fill", "none")
          .attr("stroke", s.color)
          .append("title")
          .text(`${s.run} @ ${st}: ${formatValue(v, 4)}, beyond the axis`);
      });
      lines
        .append("path")
        .attr("class", s.smoothed ? "curve smoothed" : "curve")
        .attr("data-run", s.run)
        .attr("d", linePath(pts))
        .attr("fill", "none")
        .attr("stroke", s.color)
        .attr("stroke-width", 1.75);
      // Gaps get a marker at the bottom of the plot: a triangle for noise-dominated
      // estimates (<= 0 or infinite), a cross for undefined ones (NaN).
      markedCount += marked.length;
      for (const { index, reason } of marked) {
        const mx = x(s.steps[index]);
        const mark = lines
          .append("path")
          .attr("class", `gap-marker ${reason}`)
          .attr("data-run", s.run)
          .attr("transform", `translate(${mx},${plotH - 4})`)
          .attr("d", reason === "undefined" ? "M-3,-3L3,3M-3,3L3,-3" : "M-3.5,-3L3.5,-3L0,3Z")
          .attr("fill", reason === "undefined" ? "none" : s.color)
          .attr("stroke", s.color)
          .attr("stroke-width", 1);
        mark
          .append("title")
          .text(
            `${s.run} @ ${s.steps[index]}: ${reason} (${formatValue((s.smoothed ?? s.values)[index], 4)})`,
          );
      }
      if (s.steps.length <= 60 || s.steps.length === 1) {
        pts.forEach(([px, py]) => {
          if (Number.isFinite(px) && Number.isFinite(py)) {
            lines.append("circle").attr("cx", px).attr("cy", py).attr("r", 2).attr("fill", s.color);
          }
        });
      }
    }
    // One note per line below the axis; the figure grows by a line for the second.
    const notes = [];
    if (markedCount)
      notes.push(
        `▼ ${markedCount} step${markedCount === 1 ? "" : "s"} noise-dominated (≤ 0 or ∞), × undefined: not on the line`,
      );
    if (clippedCount)
      notes.push(
        `△ ${clippedCount} spike${clippedCount === 1 ? "" : "s"} beyond the axis, drawn at its edge`,
      );
    const full = height + 14 * Math.max(0, notes.length - 1);
    if (full !== height) {
      svg.attr("height", full).attr("viewBox", `0 0 ${width} ${full}`);
      svg.select("rect.bg").attr("height", full);
    }
    notes.forEach((note, k) => {
      fitText(
        svg
          .append("text")
          .attr("class", "gap-note")
          .attr("x", 8)
          .attr("y", height - 6 + 14 * k)
          .attr("fill", theme.muted)
          .text(note),
        width - 16,
      );
    });
    // Legend: run names as text, top right, one per line.
    const legend = svg
      .append("g")
      .attr("class", "legend")
      .attr("transform", `translate(${width - MARGIN.right},${16})`);
    series.forEach((s, k) => {
      const row = legend.append("g").attr("transform", `translate(0,${k * 14})`);
      row
        .append("text")
        .attr("x", -14)
        .attr("y", 4)
        .attr("text-anchor", "end")
        .attr("fill", theme.text)
        .text(s.run);
      row
        .append("rect")
        .attr("x", -10)
        .attr("y", -4)
        .attr("width", 10)
        .attr("height", 3)
        .attr("fill", s.color);
    });
    if (interactive) {
      const rule = g
        .append("line")
        .attr("class", "rule")
        .attr("y1", 0)
        .attr("y2", plotH)
        .attr("stroke", theme.axis)
        .attr("stroke-dasharray", "3,3")
        .attr("visibility", "hidden");
      g.append("rect")
        .attr("class", "hover-target")
        .attr("width", plotW)
        .attr("height", plotH)
        .attr("fill", "transparent")
        .on("pointermove", (event) => this.hover(event, x, rule, plotW, top))
        .on("pointerleave", () => {
          rule.attr("visibility", "hidden");
          this.tooltip.hidden = true;
        });
    }
    return svg;
  }

  hover(event, x, rule, plotW, top) {
    const [px, py] = d3.pointer(event);
    const wanted = x.invert(px);
    const rows = [];
    let at = null;
    for (const s of this.model.series) {
      if (!s.steps.length) continue;
      let best = 0;
      s.steps.forEach((st, k) => {
        if (Math.abs(st - wanted) < Math.abs(s.steps[best] - wanted)) best = k;
      });
      at = at ?? s.steps[best];
      rows.push({
        run: s.run,
        color: s.color,
        step: s.steps[best],
        value: s.smoothed ? s.smoothed[best] : s.values[best],
        se: s.se ? s.se[best] : null,
        raw: s.smoothed ? s.values[best] : null,
      });
    }
    if (!rows.length) return;
    rule.attr("x1", x(at)).attr("x2", x(at)).attr("visibility", "visible");
    const tip = this.tooltip;
    const positiveOnly = !!this.model.positiveOnly;
    tip.replaceChildren(
      ...rows.map(({ run, color, step, value, se, raw }) =>
        h("div", { class: "tip-row" }, [
          h("span", { class: "swatch", style: `background:${color}` }),
          h("span", { class: "tip-key", text: run }),
          h("span", {
            class: "tip-value",
            "data-status": estimateStatus(value, positiveOnly),
            text:
              `${formatEstimate(value, { positiveOnly, se })} @ ${step}` +
              (raw === null ? "" : ` · this step ${formatEstimate(raw, { positiveOnly })}`),
          }),
        ]),
      ),
    );
    tip.hidden = false;
    const left = MARGIN.left + px + 14;
    tip.style.left = `${left + 240 > MARGIN.left + plotW ? MARGIN.left + px - 14 - tip.offsetWidth : left}px`;
    tip.style.top = `${top + py + 10}px`;
  }

  /**
   * The curves as CSV: per run and step the per-step value, the smoothed value and its
   * standard error (with smoothing), and what a positive-only estimate is when it is not a
   * value (`<metric>_status`: "noise-dominated" or "undefined", core.estimateStatus).
   */
  csv() {
    const { metric, series, positiveOnly } = this.model;
    const rows = [];
    const smooth = series.some((s) => s.smoothed);
    const status = (v) => {
      const st = estimateStatus(v, !!positiveOnly);
      return st === "value" || st === "missing" ? "" : st;
    };
    for (const s of series) {
      s.steps.forEach((st, k) => {
        const shown = s.smoothed ? s.smoothed[k] : s.values[k];
        rows.push([
          s.run,
          st,
          s.wall_times?.[k],
          s.values[k],
          ...(smooth ? [s.smoothed?.[k], s.se?.[k]] : []),
          status(shown),
        ]);
      });
    }
    return toCSV(
      [
        "run",
        "step",
        "wall_time",
        metric,
        ...(smooth ? [`${metric}_smoothed`, `${metric}_smoothed_se`] : []),
        `${metric}_status`,
      ],
      rows,
    );
  }
}
