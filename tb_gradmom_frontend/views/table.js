// The model summary table: per variable its size, total variance, GSNR, noise scale and batch
// size at one step; sortable by any column; a click on a row opens its heatmap.

import { formatValue, sortRows, toCSV } from "../core.js";
import { drawTitle, exportButtons, h, newFigure, toJSON, View } from "./common.js";

// The tab's columns with their short headers (the statistic columns are keys of /meta's
// summary_statistics, checked by the node tests; their tooltips are /meta's explanations).
export const COLUMNS = [
  { key: "tag", label: "variable", numeric: false },
  { key: "size", label: "size", numeric: true },
  { key: "total_variance", label: "total variance", numeric: true },
  { key: "gsnr_mean", label: "GSNR", numeric: true },
  { key: "noise_scale", label: "noise scale", numeric: true },
  { key: "batch_size", label: "batch", numeric: true },
];

const PLAIN_TITLES = {
  tag: "The variable's tag (its path without the model's name); a click on a row opens its heatmap",
  size: "Number of scalar parameters of the variable",
  batch_size: "n, the number of examples the moments average over at this step",
};

/** A column header's tooltip: the backend's explanation of the statistic (/meta's statistics). */
export function columnTitle(key, statistics) {
  const st = statistics?.[key];
  if (!st) return PLAIN_TITLES[key] ?? key;
  return [
    `${st.name}: ${st.meaning}.`,
    `Formula: ${st.formula}`,
    st.unit && `Unit: ${st.unit}`,
    st.reading && `Reading: ${st.reading}`,
    st.reference && `Reference: ${st.reference}`,
  ]
    .filter(Boolean)
    .join("\n");
}

const cellText = (col, v) =>
  v === null || v === undefined
    ? "–"
    : col.numeric
      ? col.key === "size" || col.key === "batch_size"
        ? formatValue(v, 12)
        : formatValue(v, 4)
      : String(v);

export class TableView extends View {
  /** `onSelect(tag)` is called when a row is clicked; rows start sorted by `sortKey`, descending. */
  constructor(container, onSelect, sortKey) {
    super(container);
    this.onSelect = onSelect;
    this.sortKey = sortKey;
    this.descending = true;
  }

  /**
   * model: {rows, model (the whole model's row or null), run, step, selected, group (its label
   * when the tab shows one group of several, else null), statistics (the columns'
   * explanations, /meta's statistics), theme, exportTheme}.
   */
  update(model) {
    this.model = model;
    this.render();
  }

  sorted() {
    return sortRows(this.model.rows, this.sortKey, this.descending);
  }

  render() {
    const { run, step, selected } = this.model;
    const head = h(
      "tr",
      {},
      COLUMNS.map((col) => {
        const active = col.key === this.sortKey;
        const th = h("th", {
          class: `${col.numeric ? "num" : ""} ${active ? "sorted" : ""}`,
          scope: "col",
          tabindex: 0,
          role: "columnheader",
          "aria-sort": active ? (this.descending ? "descending" : "ascending") : "none",
          "data-key": col.key,
          title: columnTitle(col.key, this.model.statistics),
          text: `${col.label}${active ? (this.descending ? " ▼" : " ▲") : ""}`,
        });
        const sort = () => {
          if (this.sortKey === col.key) this.descending = !this.descending;
          else {
            this.sortKey = col.key;
            this.descending = col.numeric;
          }
          this.render();
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
      this.sorted().map((row) => {
        const tr = h(
          "tr",
          {
            class: row.tag === selected ? "selected" : "",
            tabindex: 0,
            "data-tag": row.tag,
            title: "Open the heatmap of this variable",
          },
          COLUMNS.map((col) =>
            h("td", { class: col.numeric ? "num" : "tag-cell", text: cellText(col, row[col.key]) }),
          ),
        );
        tr.addEventListener("click", () => this.onSelect(row.tag));
        tr.addEventListener("keydown", (e) => {
          if (e.key === "Enter") this.onSelect(row.tag);
        });
        return tr;
      }),
    );
    const whole = this.model.model;
    const foot =
      whole &&
      h("tfoot", {}, [
        h(
          "tr",
          { class: "model-row" },
          COLUMNS.map((col) =>
            h("td", {
              class: col.numeric ? "num" : "tag-cell",
              text: col.key === "tag" ? this.wholeLabel() : cellText(col, whole[col.key]),
            }),
          ),
        ),
      ]);
    this.container.replaceChildren(
      h("div", { class: "card-tools" }, [
        h("span", {
          class: "hint",
          text: `run ${run}${this.model.group ? ` · model ${this.model.group}` : ""} · step ${step} · ${this.model.rows.length} variables`,
        }),
        exportButtons({
          figure: () => this.figure(this.model.exportTheme).node(),
          csv: () => this.csv(),
          json: () => toJSON({ run, step, rows: this.sorted() }),
          name: () => [run, "summary", `step${step}`],
        }),
      ]),
      h("div", { class: "table-wrap" }, [
        h("table", { class: "summary" }, [h("thead", {}, [head]), body, foot]),
      ]),
    );
  }

  /** The table as a figure (for PNG/SVG export). */
  figure(theme) {
    const { run, step } = this.model;
    const rows = this.sorted();
    const widths = [260, 80, 110, 90, 100, 60];
    const width = 24 + widths.reduce((a, b) => a + b, 0);
    const rowH = 18;
    const whole = this.model.model;
    const height = 60 + rowH * (rows.length + (whole ? 2 : 1)) + 12;
    const svg = newFigure(width, height, theme);
    drawTitle(
      svg,
      "Model summary",
      `run ${run}${this.model.group ? ` · model ${this.model.group}` : ""} · step ${step} · sorted by ${this.sortKey}${this.descending ? " (descending)" : ""}`,
      theme,
    );
    const g = svg.append("g").attr("transform", "translate(12,52)");
    const xs = widths.map((_, k) => widths.slice(0, k).reduce((a, b) => a + b, 0));
    COLUMNS.forEach((col, k) => {
      g.append("text")
        .attr("x", col.numeric ? xs[k] + widths[k] - 6 : xs[k])
        .attr("y", 12)
        .attr("text-anchor", col.numeric ? "end" : "start")
        .attr("font-weight", 600)
        .attr("fill", theme.text)
        .text(col.label);
    });
    g.append("line")
      .attr("x1", 0)
      .attr("x2", width - 24)
      .attr("y1", 17)
      .attr("y2", 17)
      .attr("stroke", theme.axis);
    rows.forEach((row, r) => {
      const y = 12 + rowH * (r + 1);
      COLUMNS.forEach((col, k) => {
        g.append("text")
          .attr("x", col.numeric ? xs[k] + widths[k] - 6 : xs[k])
          .attr("y", y)
          .attr("text-anchor", col.numeric ? "end" : "start")
          .attr("fill", theme.text)
          .text(cellText(col, row[col.key]));
      });
    });
    if (whole) {
      const y = 12 + rowH * (rows.length + 1);
      g.append("line")
        .attr("x1", 0)
        .attr("x2", width - 24)
        .attr("y1", y - 13)
        .attr("y2", y - 13)
        .attr("stroke", theme.axis);
      COLUMNS.forEach((col, k) => {
        g.append("text")
          .attr("x", col.numeric ? xs[k] + widths[k] - 6 : xs[k])
          .attr("y", y)
          .attr("text-anchor", col.numeric ? "end" : "start")
          .attr("font-weight", 600)
          .attr("fill", theme.text)
          .text(col.key === "tag" ? this.wholeLabel() : cellText(col, whole[col.key]));
      });
    }
    return svg;
  }

  wholeLabel() {
    return this.model.group ? `whole model ${this.model.group}` : "whole model";
  }

  csv() {
    const rows = this.sorted().map((row) => COLUMNS.map((c) => row[c.key]));
    if (this.model.model)
      rows.push(
        COLUMNS.map((c) => (c.key === "tag" ? this.model.model.tag : this.model.model[c.key])),
      );
    return toCSV(
      COLUMNS.map((c) => c.key),
      rows,
    );
  }
}
