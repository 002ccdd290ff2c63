// @ts-check
// The model summary table: per variable its size, total variance, GSNR, noise scale and batch
// size at one step; sortable by any column; a click on a row opens its heatmap.

import { estimateStatus, formatEstimate, formatNumber, sortRows, toCSV } from "../core.js";
import { exportButtons, h, tableFigure, toJSON, View } from "./common.js";

// The tab's columns. The statistic columns' headers are /meta's short names with their
// symbols (`columns(statistics)`); their tooltips /meta's explanations.
const COLUMN_KEYS = [
  { key: "tag", label: "variable", numeric: false },
  { key: "size", label: "size", numeric: true },
  { key: "total_variance", numeric: true },
  { key: "gsnr_mean", numeric: true },
  { key: "noise_scale", numeric: true },
  { key: "batch_size", label: "batch", numeric: true },
];

/** The columns with their headers: a statistic's /meta short name, and its symbol. */
export function columns(statistics) {
  return COLUMN_KEYS.map((c) => {
    if (c.label) return c;
    const st = statistics?.[c.key];
    const short = st?.short ?? c.key;
    const symbol = st?.symbol && !short.includes(st.symbol) ? ` ${st.symbol}` : "";
    return { ...c, label: `${short}${symbol}` };
  });
}

// The column keys, for the node tests (the statistic columns are /meta summary_statistics).
export const COLUMNS = COLUMN_KEYS;

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

const COUNTS = new Set(["size", "batch_size"]);

/** A cell's text: counts in full, statistics by core.formatEstimate (the tab's one format). */
export function cellText(col, row, positiveOnly = []) {
  const v = row[col.key];
  if (!col.numeric) return v === null || v === undefined ? "–" : String(v);
  if (COUNTS.has(col.key)) return formatNumber(v, { integer: true });
  return formatEstimate(v, { positiveOnly: positiveOnly.includes(col.key) });
}

/**
 * A statistic cell's tooltip: the value shown (smoothed, with its standard error), and the
 * per-step value at the row's step.
 */
export function cellTitle(col, row, smoothing, positiveOnly = []) {
  if (!col.numeric || COUNTS.has(col.key) || !row.perStep) return null;
  const pos = { positiveOnly: positiveOnly.includes(col.key) };
  const raw = row.perStep[col.key];
  const lines = [];
  if (smoothing > 0 && row.smoothed)
    lines.push(
      `smoothed (${smoothing.toFixed(2)}, as the curves): ${formatEstimate(row[col.key], { ...pos, se: row.se[col.key] })}`,
    );
  lines.push(
    `this step (${row.step ?? "–"}) alone: ${formatEstimate(raw, pos)}` +
      (Number.isFinite(raw) && estimateStatus(raw, pos.positiveOnly) !== "value"
        ? ` (${formatNumber(raw)})`
        : ""),
  );
  return lines.join("\n");
}

export class TableView extends View {
  /** `onSelect(tag)` is called when a row is clicked; rows start sorted by `sortKey`, descending. */
  constructor(container, onSelect, sortKey) {
    super(container);
    this.onSelect = onSelect;
    this.sortKey = sortKey;
    this.descending = true;
  }

  /**
   * model: {rows and model (the whole model's row or null) as core.tableRow gives them, run,
   * step, selected, group (its label when the tab shows one group of several, else null),
   * statistics (the columns' explanations, /meta's statistics), smoothing (the curves'; 0: per
   * step), positiveOnly (/meta's positive_only), theme, exportTheme}.
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
      this.columns().map((col) => {
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
          this.columns().map((col) => this.cell(col, row)),
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
          this.columns().map((col) =>
            col.key === "tag"
              ? h("td", { class: "tag-cell", text: this.wholeLabel() })
              : this.cell(col, whole),
          ),
        ),
      ]);
    this.container.replaceChildren(
      h("div", { class: "card-tools" }, [
        h("span", {
          class: "hint",
          text: `run ${run}${this.model.group ? ` · model ${this.model.group}` : ""} · step ${step} · ${this.model.rows.length} variables · ${this.caption()}`,
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

  columns() {
    return columns(this.model.statistics);
  }

  /** What the statistic columns show: the curves' smoothed estimate at this step, or the step's. */
  caption() {
    const s = this.model.smoothing;
    return s > 0
      ? `statistics smoothed at ${s.toFixed(2)} as the curves (hover a cell for this step's own value)`
      : "statistics of this step alone (smoothing 0)";
  }

  cell(col, row) {
    const status = col.numeric
      ? estimateStatus(row[col.key], (this.model.positiveOnly ?? []).includes(col.key))
      : "value";
    return h("td", {
      class: `${col.numeric ? "num" : "tag-cell"}${status === "value" || status === "missing" ? "" : ` ${status}`}`,
      "data-key": col.key,
      "data-value": col.numeric ? String(row[col.key]) : undefined,
      title: cellTitle(col, row, this.model.smoothing, this.model.positiveOnly) ?? undefined,
      text: cellText(col, row, this.model.positiveOnly),
    });
  }

  /** The table as a figure (for PNG/SVG export). */
  figure(theme) {
    const { run, step } = this.model;
    const whole = this.model.model;
    return tableFigure({
      title: "Model summary",
      subtitle: `run ${run}${this.model.group ? ` · model ${this.model.group}` : ""} · step ${step} · ${this.caption()} · sorted by ${this.sortKey}${this.descending ? " (descending)" : ""}`,
      theme,
      columns: this.columns(),
      widths: [260, 80, 150, 100, 170, 60],
      rows: this.sorted(),
      text: (col, row) => cellText(col, row, this.model.positiveOnly),
      total: whole
        ? (col) =>
            col.key === "tag" ? this.wholeLabel() : cellText(col, whole, this.model.positiveOnly)
        : null,
    });
  }

  wholeLabel() {
    return this.model.group ? `whole model ${this.model.group}` : "whole model";
  }

  /**
   * The table as CSV: each column's shown value in full precision; for each statistic also
   * its per-step value, its standard error and, where an estimate is not a value, what it is
   * (`<key>_status`: "noise-dominated" or "undefined").
   */
  csv() {
    const stats = COLUMNS.filter((c) => c.numeric && !COUNTS.has(c.key)).map((c) => c.key);
    const pos = this.model.positiveOnly ?? [];
    const line = (row, tag) => [
      ...COLUMNS.map((c) => (c.key === "tag" ? tag : row[c.key])),
      ...stats.flatMap((k) => {
        const st = estimateStatus(row[k], pos.includes(k));
        return [row.perStep?.[k], row.se?.[k], st === "value" || st === "missing" ? "" : st];
      }),
      this.model.smoothing,
    ];
    const rows = this.sorted().map((row) => line(row, row.tag));
    if (this.model.model) rows.push(line(this.model.model, this.model.model.tag));
    return toCSV(
      [
        ...COLUMNS.map((c) => c.key),
        ...stats.flatMap((k) => [`${k}_per_step`, `${k}_se`, `${k}_status`]),
        "smoothing",
      ],
      rows,
    );
  }
}
