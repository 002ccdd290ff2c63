// @ts-check
// The heatmap of one statistic of one variable at one step: cells on a canvas (exact colour
// map colours, no smoothing), axes, a colour bar with ticks and the value distribution, a
// tooltip with the element's index and values, zoom (wheel) and pan (drag).

import * as d3 from "../vendor/d3.js";
import {
  lutIndex,
  cellElements,
  colorize,
  colormapLUT,
  describeCell,
  finiteExtent,
  formatValue,
  histogram,
  niceTicks,
  normalizer,
  poolGrid,
  symmetricDomain,
  to2dShape,
  toCSV,
} from "../core.js";
import {
  drawAxis,
  drawColorbar,
  drawTitle,
  exportButtons,
  h,
  newFigure,
  toJSON,
  View,
} from "./common.js";

const MARGIN = { top: 48, right: 118, bottom: 50, left: 66 };
const MIN_PLOT_H = 36;
const MAX_PLOT_H = 520;
const MIN_BAR_H = 160;

// A 1-D variable (a bias, a norm's scale) is drawn as bars this tall, not as a thin strip.
export const BARS_PLOT_H = 200;
// Bars start this far (a fraction of the plot) above the bottom: the smallest value shows.
const BAR_FLOOR = 0.04;

/** Whether a heatmap payload is drawn as bars: one row of a variable with at most one axis. */
export function isBars(data) {
  return data.rows === 1 && (data.shape?.length ?? 0) <= 1;
}

/** Plot geometry for a grid of rows x cols in a figure `width` wide (`bars`: 1-D as bars). */
export function heatmapLayout(width, rows, cols, bars = false) {
  const plotW = Math.max(80, width - MARGIN.left - MARGIN.right);
  const plotH = bars
    ? BARS_PLOT_H
    : Math.round(Math.max(MIN_PLOT_H, Math.min(MAX_PLOT_H, (rows * plotW) / cols)));
  const barH = Math.max(plotH, MIN_BAR_H);
  return { width, height: MARGIN.top + barH + MARGIN.bottom, plotW, plotH, barH, ...MARGIN };
}

const integerTicks = (lo, hi, count) => niceTicks(lo, hi, count).filter((v) => Number.isInteger(v));

/**
 * Draws an axis of cell indices into `g` (d3 selection) for `scale`, which maps cell edges
 * (cell v spans [v, v + 1]) to pixels. Ticks at cell centres read as the cell's index: tick v
 * marks the middle of cell v. Of the `n` cells, only those whose middles lie inside the plot's
 * `length` (pixels) get a tick, about one every `spacing` pixels.
 */
function drawIndexAxis(g, scale, { n, length, spacing, orient, theme, label }) {
  const ticks = integerTicks(...scale.domain(), Math.max(2, Math.floor(length / spacing)));
  drawAxis(
    g,
    d3
      .scaleLinear()
      .domain(scale.domain().map((v) => v - 0.5))
      .range(scale.range()),
    {
      orient,
      theme,
      tickValues: ticks.filter((v) => v < n && scale(v + 0.5) >= 0 && scale(v + 0.5) <= length),
      tickFormat: (v) => String(v),
      label,
    },
  );
}

export class HeatmapView extends View {
  /** `container`: the card body the view fills. */
  constructor(container) {
    super(container);
    this.transform = d3.zoomIdentity;
    this.images = new Map();
  }

  /**
   * Shows a heatmap. model: {data (fetchHeatmap), extras: {stat: data}, stat, signed (whether
   * the statistic takes both signs, from /meta), colormap, scale, theme, run, tag}.
   * `keepZoom` keeps the current zoom when the same variable is redrawn.
   */
  update(model, { keepZoom = false } = {}) {
    const same = this.model && this.model.run === model.run && this.model.tag === model.tag;
    if (!(keepZoom && same)) this.transform = d3.zoomIdentity;
    this.model = model;
    this.images.clear();
    this.render();
  }

  /** The colour normaliser and the colour scale's domain of the current model. */
  colorScale() {
    const { data, scale, signed } = this.model;
    // Signed statistics on a linear scale: centred on zero, for the diverging colour maps.
    const domain =
      scale === "linear" && signed
        ? (symmetricDomain(data.values) ?? finiteExtent(data.values, scale))
        : finiteExtent(data.values, scale);
    return { domain, normalize: normalizer(domain, scale) };
  }

  /** An image (canvas) of the grid pooled by [br, bc], coloured; cached. */
  image(br, bc) {
    const key = `${br}x${bc}`;
    if (this.images.has(key)) return this.images.get(key);
    const { data, colormap, theme } = this.model;
    const pooled =
      br === 1 && bc === 1
        ? { values: data.values, rows: data.rows, cols: data.cols }
        : poolGrid(
            data.values,
            data.rows,
            data.cols,
            Math.ceil(data.rows / br),
            Math.ceil(data.cols / bc),
          );
    const canvas = document.createElement("canvas");
    canvas.width = pooled.cols;
    canvas.height = pooled.rows;
    const ctx = canvas.getContext("2d");
    const pixels = colorize(
      pooled.values,
      colormap,
      this.colorScale().normalize,
      theme.missing,
      theme.nonPositive,
    );
    ctx.putImageData(new ImageData(pixels, pooled.cols, pooled.rows), 0, 0);
    this.images.set(key, canvas);
    return canvas;
  }

  /**
   * The bar of each element of a 1-D variable, in fractions of the plot's height from the
   * bottom ([from, to]; the colour scale's domain spans the height above BAR_FLOOR), and the
   * colour; NaN and (log) values <= 0 get a short bar of their own colour.
   */
  barGeometry(theme) {
    const { data, colormap, scale, signed } = this.model;
    const { normalize } = this.colorScale();
    const lut = colormapLUT(colormap);
    const f = (t) => BAR_FLOOR + (1 - BAR_FLOOR) * t;
    const base = scale === "linear" && signed ? f(Math.max(0, Math.min(1, normalize(0)))) : 0;
    return Array.from(data.values, (v) => {
      const t = normalize(v);
      if (Number.isNaN(t)) {
        const c = Number.isNaN(v) ? theme.missing : theme.nonPositive;
        return { from: 0, to: BAR_FLOOR, rgb: c.slice(0, 3) };
      }
      const i = 3 * lutIndex(t);
      const top = f(Math.max(0, Math.min(1, t)));
      return {
        from: Math.min(base, top),
        to: Math.max(base, top, BAR_FLOOR / 2),
        rgb: [lut[i], lut[i + 1], lut[i + 2]],
      };
    });
  }

  /** Draws the cells under the zoom transform onto a 2-D context of a plotW x plotH area. */
  paint(ctx, L, transform, pixelScale = 1) {
    const { data } = this.model;
    if (this.bars) {
      ctx.save();
      ctx.clearRect(0, 0, L.plotW * pixelScale, L.plotH * pixelScale);
      ctx.setTransform(
        pixelScale * transform.k,
        0,
        0,
        pixelScale * transform.k,
        pixelScale * transform.x,
        pixelScale * transform.y,
      );
      const w = L.plotW / data.cols;
      const gap = w > 6 ? Math.min(2, w * 0.1) : 0;
      this.barGeometry(this.model.theme).forEach((b, k) => {
        ctx.fillStyle = `rgb(${b.rgb.join(",")})`;
        const y0 = L.plotH * (1 - b.to);
        ctx.fillRect(k * w + gap / 2, y0, w - gap, L.plotH * (b.to - b.from));
      });
      ctx.restore();
      return;
    }
    const k = transform.k;
    // Pool on the client when one screen pixel would cover several cells (no aliasing).
    const pxPerCol = (L.plotW * k * pixelScale) / data.cols;
    const pxPerRow = (L.plotH * k * pixelScale) / data.rows;
    const bc = pxPerCol < 1 ? Math.ceil(1 / pxPerCol) : 1;
    const br = pxPerRow < 1 ? Math.ceil(1 / pxPerRow) : 1;
    const img = this.image(br, bc);
    ctx.save();
    ctx.imageSmoothingEnabled = false;
    ctx.clearRect(0, 0, L.plotW * pixelScale, L.plotH * pixelScale);
    // Pooled images cover whole blocks: their last block may reach past the grid's edge.
    const w = (img.width * bc * L.plotW) / data.cols;
    const h = (img.height * br * L.plotH) / data.rows;
    ctx.setTransform(
      pixelScale * k,
      0,
      0,
      pixelScale * k,
      pixelScale * transform.x,
      pixelScale * transform.y,
    );
    ctx.drawImage(img, 0, 0, w, h);
    ctx.restore();
  }

  /** Draws axes, colour bar and title into an <svg> (d3 selection); returns the layout. */
  drawFrame(svg, L, transform, theme) {
    const { data, stat, scale, colormap, run, tag } = this.model;
    const [R, C] = data.grid_shape ?? to2dShape(data.shape);
    const shape = data.shape;
    const pooledNote =
      data.block && (data.block[0] > 1 || data.block[1] > 1)
        ? ` · cells are block means of ${data.block[0]}×${data.block[1]}`
        : "";
    drawTitle(
      svg,
      `${this.model.label ?? stat} of ${tag}${this.bars ? " (one bar per element)" : ""}`,
      `run ${run} · step ${data.step} · batch ${data.batch_size} · shape [${shape.join(", ")}]${pooledNote}`,
      theme,
    );

    const x = transform.rescaleX(d3.scaleLinear().domain([0, C]).range([0, L.plotW]));
    const y = transform.rescaleY(d3.scaleLinear().domain([0, R]).range([0, L.plotH]));
    const plot = svg
      .append("g")
      .attr("class", "plot")
      .attr("transform", `translate(${L.left},${L.top})`);
    plot
      .append("rect")
      .attr("class", "frame")
      .attr("width", L.plotW)
      .attr("height", L.plotH)
      .attr("fill", "none")
      .attr("stroke", theme.axis)
      .attr("stroke-width", 0.5);
    drawIndexAxis(
      plot.append("g").attr("class", "x-axis").attr("transform", `translate(0,${L.plotH})`),
      x,
      {
        n: C,
        length: L.plotW,
        spacing: 70,
        orient: "bottom",
        theme,
        label: `column: axis ${Math.max(0, shape.length - 1)} (${C})`,
      },
    );
    if (this.bars) {
      // Bars: the value on the colour scale's axis (the domain spans the plot above the floor).
      const { domain } = this.colorScale();
      if (domain) {
        const log = scale === "log";
        const d = domain[0] === domain[1] ? [domain[0], domain[0] + (log ? domain[0] : 1)] : domain;
        const v = (log ? d3.scaleLog() : d3.scaleLinear())
          .domain(d)
          .range([L.plotH * (1 - BAR_FLOOR), 0]);
        drawAxis(plot.append("g").attr("class", "y-axis"), transform.rescaleY(v), {
          orient: "left",
          log,
          theme,
          count: 4,
          gridLength: L.plotW,
          label: this.model.label ?? stat,
        });
      }
    } else
      drawIndexAxis(plot.append("g").attr("class", "y-axis"), y, {
        n: R,
        length: L.plotH,
        spacing: 40,
        orient: "left",
        theme,
        label:
          shape.length > 2
            ? `row: flat index over [${shape.slice(0, -1).join(", ")}]`
            : shape.length === 2
              ? `row: axis 0 (${R})`
              : "row",
      });

    // Colour bar: the LUT as an image, ticks on the colour scale, the values' distribution.
    const { domain } = this.colorScale();
    const bx = L.left + L.plotW + 22;
    const { bar, scale: s } = drawColorbar(svg, {
      x: bx,
      y: L.top,
      height: L.barH,
      figureWidth: L.width,
      lut: colormapLUT(colormap),
      domain,
      log: scale === "log",
      values: data.values,
      label: stat,
      theme,
    });
    if (s) {
      // The distribution of the values along the colour bar (to its left), in the bar's scale.
      const hist = histogram(data.values, 48, scale);
      const maxCount = Math.max(1, ...hist.counts);
      const dist = bar.append("g").attr("class", "distribution");
      dist
        .append("line")
        .attr("x1", -3)
        .attr("x2", -3)
        .attr("y1", 0)
        .attr("y2", L.barH)
        .attr("stroke", theme.grid)
        .attr("stroke-width", 1);
      hist.counts.forEach((c, k) => {
        if (!c) return;
        const y0 = s(hist.edges[k + 1]);
        const y1 = s(hist.edges[k]);
        const wdt = Math.max(1.5, 12 * (c / maxCount));
        dist
          .append("rect")
          .attr("x", -3 - wdt)
          .attr("y", Math.min(y0, y1))
          .attr("width", wdt)
          .attr("height", Math.max(1, Math.abs(y1 - y0)))
          .attr("fill", theme.muted);
      });
      dist.append("title").text("distribution of the values over the colour scale");
      dist
        .append("text")
        .attr("class", "distribution-label")
        .attr("fill", theme.muted)
        .attr("font-size", 9)
        .attr("text-anchor", "start")
        .attr("x", -16)
        .attr("y", -5)
        .text("◂ value counts");
    }
    return { x, y };
  }

  render() {
    const { data, theme } = this.model;
    const width = Math.max(360, Math.min(this.container.clientWidth || 720, 1100));
    this.bars = isBars(data);
    const L = heatmapLayout(width, data.rows, data.cols, this.bars);
    this.layout = L;

    const figure = h("div", {
      class: "figure heatmap-figure",
      style: `width:${L.width}px;height:${L.height}px`,
    });
    const svg = newFigure(L.width, L.height, theme);
    this.frameSVG = svg;
    figure.append(svg.node());
    const canvas = h("canvas", {
      class: "heatmap-canvas",
      width: Math.round(L.plotW * devicePixelRatio),
      height: Math.round(L.plotH * devicePixelRatio),
      style: `left:${L.left}px;top:${L.top}px;width:${L.plotW}px;height:${L.plotH}px`,
      "data-rows": data.rows,
      "data-cols": data.cols,
    });
    this.canvas = canvas;
    const tooltip = h("div", { class: "tooltip", role: "tooltip", hidden: true });
    this.tooltip = tooltip;
    figure.append(canvas, tooltip);
    const reset = h("button", {
      type: "button",
      class: "small",
      text: "Reset zoom",
      onclick: () => this.resetZoom(),
    });
    this.container.replaceChildren(
      h("div", { class: "card-tools" }, [
        h("span", { class: "hint", text: "Wheel to zoom, drag to pan, double-click to reset." }),
        reset,
        exportButtons({
          figure: () => this.exportFigure(),
          csv: () => this.csv(),
          json: () => toJSON(this.model.data),
          name: () => [this.model.run, this.model.tag, this.model.stat, `step${data.step}`],
        }),
      ]),
      figure,
    );
    this.redraw();

    this.zoom = d3
      .zoom()
      .scaleExtent([1, Math.max(4, Math.max(data.rows, data.cols) / 2)])
      .translateExtent([
        [0, 0],
        [L.plotW, L.plotH],
      ])
      .extent([
        [0, 0],
        [L.plotW, L.plotH],
      ])
      .filter(
        (event) =>
          (!event.ctrlKey || event.type === "wheel") && !event.button && event.type !== "dblclick",
      )
      .on("zoom", (event) => {
        this.transform = event.transform;
        this.redraw();
      });
    const sel = d3.select(canvas).call(this.zoom).call(this.zoom.transform, this.transform);
    sel.on("dblclick", () => this.resetZoom());
    canvas.addEventListener("pointermove", (e) => this.hover(e));
    canvas.addEventListener("pointerleave", () => {
      tooltip.hidden = true;
    });
  }

  resetZoom() {
    if (this.zoom && this.canvas) d3.select(this.canvas).call(this.zoom.transform, d3.zoomIdentity);
  }

  redraw() {
    const L = this.layout;
    const svg = this.frameSVG;
    svg.selectAll(":scope > :not(.bg)").remove();
    this.drawFrame(svg, L, this.transform, this.model.theme);
    const ctx = this.canvas.getContext("2d");
    this.paint(ctx, L, this.transform, devicePixelRatio);
  }

  /** The displayed cell under a point of the canvas (CSS px), or null. */
  cellAt(px, py) {
    const { data } = this.model;
    const L = this.layout;
    const [gx, gy] = this.transform.invert([px, py]);
    const col = Math.floor((gx / L.plotW) * data.cols);
    const row = Math.floor((gy / L.plotH) * data.rows);
    if (row < 0 || col < 0 || row >= data.rows || col >= data.cols) return null;
    return { row, col };
  }

  hover(event) {
    const rect = this.canvas.getBoundingClientRect();
    const px = event.clientX - rect.left;
    const py = event.clientY - rect.top;
    const cell = this.cellAt(px, py);
    const tip = this.tooltip;
    if (!cell) {
      tip.hidden = true;
      return;
    }
    const { data, extras, stat } = this.model;
    const k = cell.row * data.cols + cell.col;
    const elements = cellElements(cell.row, cell.col, data.shape, data.block ?? [1, 1]);
    const lines = [
      ["index", describeCell(elements)],
      [stat, formatValue(data.values[k], 6)],
    ];
    for (const [name, d] of Object.entries(extras ?? {})) {
      if (name !== stat && d && d.values.length === data.values.length)
        lines.push([name, formatValue(d.values[k], 6)]);
    }
    tip.replaceChildren(
      ...lines.map(([a, b], i) =>
        h("div", { class: i === 1 ? "tip-row tip-main" : "tip-row" }, [
          h("span", { class: "tip-key", text: a }),
          h("span", { class: "tip-value", text: b }),
        ]),
      ),
    );
    tip.dataset.row = cell.row;
    tip.dataset.col = cell.col;
    tip.hidden = false;
    const L = this.layout;
    const left = L.left + px + 14;
    const flip = left + 220 > L.width;
    tip.style.left = `${flip ? L.left + px - 14 - tip.offsetWidth : left}px`;
    tip.style.top = `${L.top + py + 12}px`;
  }

  /** A detached <svg> of the figure as shown (zoom included), drawn in the light theme. */
  exportFigure() {
    const theme = this.model.exportTheme;
    const L = this.layout;
    const svg = newFigure(L.width, L.height, theme);
    const scale = 2;
    const canvas = document.createElement("canvas");
    canvas.width = Math.round(L.plotW * scale);
    canvas.height = Math.round(L.plotH * scale);
    const saved = this.model.theme;
    this.model.theme = theme; // NaN cells in the export's colours
    this.images.clear();
    this.paint(canvas.getContext("2d"), L, this.transform, scale);
    this.model.theme = saved;
    this.images.clear();
    svg
      .append("image")
      .attr("x", L.left)
      .attr("y", L.top)
      .attr("width", L.plotW)
      .attr("height", L.plotH)
      .attr("preserveAspectRatio", "none")
      .attr("href", canvas.toDataURL("image/png"));
    this.drawFrame(svg, L, this.transform, theme);
    return svg.node();
  }

  /** The data as CSV: one line per displayed cell with its element index and values. */
  csv() {
    const { data, extras, stat } = this.model;
    const others = Object.entries(extras ?? {}).filter(
      ([n, d]) => n !== stat && d && d.values.length === data.values.length,
    );
    const rows = [];
    for (let i = 0; i < data.rows; i++) {
      for (let j = 0; j < data.cols; j++) {
        const k = i * data.cols + j;
        const cell = cellElements(i, j, data.shape, data.block ?? [1, 1]);
        rows.push([
          i,
          j,
          describeCell(cell),
          data.values[k],
          ...others.map(([, d]) => d.values[k]),
        ]);
      }
    }
    return toCSV(["row", "col", "element", stat, ...others.map(([n]) => n)], rows);
  }
}
