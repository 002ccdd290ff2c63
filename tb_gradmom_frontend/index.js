// The Grad Moments tab. TensorBoard loads this module in the plugin frame
// (/data/plugin_entry.html?name=gradmom, base href /data/plugin/gradmom/) and calls render().
//
// State lives in App; api.js fetches, core.js transforms, views/ draw. Every label, statistic
// order, sign, run colour and default comes from the backend's /meta (tb_gradmom.analysis.views.meta),
// fetched once before anything is drawn; without it the tab says why instead of starting.

import * as api from "./api.js";
import {
  COLORMAPS,
  THEMES,
  argmaxRow,
  availableStats,
  axisLabel,
  curveGroups,
  defaultView,
  filterTags,
  groupLabel,
  groupsOf,
  histogramPlan,
  isPositiveOnly,
  isSigned,
  modelTag,
  nearestStep,
  runColors,
  seriesInfo,
  seriesTitle,
  statLabel,
  summaryNumericKeys,
  tableRow,
} from "./core.js";
import { checkbox, h, select } from "./views/common.js";
import { CurvesView } from "./views/curves.js";
import { HeatmapView } from "./views/heatmap.js";
import { HistogramView } from "./views/histogram.js";
import { TableView } from "./views/table.js";

const RELOAD_MS = 30000; // TensorBoard's default reload period
// Element-wise statistics the heatmap's tooltip and CSV show beside the selected one (those
// the variable's orders allow).
const TOOLTIP_STATS = ["mean", "variance", "std", "snr"];

/** Builds the tab into document.body. Returns the app (tests and the console can reach it). */
export async function render() {
  await loadStylesheet(new URL("./style.css", import.meta.url).href);
  document.documentElement.dataset.theme = detectTheme(); // for a start-up error too
  return start(document.body);
}

/**
 * Starts the tab in `root`: loads /meta (`loadMeta`), then the app. If /meta cannot be loaded
 * the tab shows why (showStartupError) and returns null; it never stays blank.
 */
export async function start(root, loadMeta = api.fetchMeta) {
  let meta;
  try {
    meta = await loadMeta();
  } catch (e) {
    showStartupError(root, e);
    return null;
  }
  const app = new App(root, meta);
  window.gradmom = app; // for debugging and the browser tests
  await app.start();
  return app;
}

/** The tab's content when it cannot start: what failed and what to check. */
export function showStartupError(root, error) {
  root.replaceChildren(
    h("div", { class: "status error startup-error", role: "alert" }, [
      h("p", { text: "The Grad Moments tab could not start." }),
      h("p", {
        text:
          `Its labels and settings could not be loaded from the plugin: ${error?.message ?? error}. ` +
          "Reload the page; if this persists, check TensorBoard's log for errors from " +
          "Grad Moments, and that the tb_gradmom installed where TensorBoard runs is the one " +
          "that served this tab.",
      }),
    ]),
  );
}

function loadStylesheet(href) {
  return new Promise((resolve) => {
    const link = h("link", { rel: "stylesheet", href });
    link.addEventListener("load", resolve);
    link.addEventListener("error", resolve);
    document.head.append(link);
  });
}

/** "dark" when TensorBoard (the parent page) is in dark mode, or, outside TensorBoard, the OS is. */
function detectTheme() {
  try {
    const parentBody = window.parent !== window ? window.parent.document.body : null;
    if (parentBody) return parentBody.classList.contains("dark-mode") ? "dark" : "light";
  } catch {
    // A parent from another origin: fall through to the media query.
  }
  return window.matchMedia?.("(prefers-color-scheme: dark)").matches ? "dark" : "light";
}

class App {
  /** `meta`: the backend's /meta payload (core.checkMeta), for every label and default. */
  constructor(root, meta) {
    this.root = root;
    this.meta = meta;
    const landing = meta.landing;
    this.state = {
      runs: {},
      model: {},
      groups: {},
      group: "",
      runList: [],
      checked: new Set(),
      known: new Set(),
      run: null,
      tag: null,
      filter: "",
      stat: landing.stat,
      ...defaultView(landing.stat, meta),
      step: null,
      follow: true,
      histMode: "step",
      metric: landing.curve,
      logy: false,
      smoothing: meta.default_smoothing,
      landed: false,
      theme: detectTheme(),
    };
    this.cache = new Map();
    this.generation = { heatmap: 0, histogram: 0, curves: 0, table: 0 };
  }

  async start() {
    this.buildSkeleton();
    this.watchTheme();
    await this.reload();
    this.timer = setInterval(() => {
      if (this.state.follow && !document.hidden) this.reload({ keepZoom: true });
    }, RELOAD_MS);
  }

  // -------------------------------------------------------------------------------------------
  // Layout.

  buildSkeleton() {
    const card = (id, title, controls) => {
      const body = h("div", { class: "card-body" });
      const node = h("section", { class: "card", id }, [
        h("header", { class: "card-header" }, [h("h2", { text: title }), controls ?? h("span")]),
        body,
      ]);
      return { node, body };
    };
    this.el = {};
    this.el.runs = h("div", { class: "run-list" });
    this.el.filter = h("input", {
      type: "search",
      class: "tag-filter",
      placeholder: "Filter variables (regular expressions supported)",
      "aria-label": "Filter variables by regular expression",
      value: this.state.filter,
    });
    this.el.filter.addEventListener("input", () => {
      this.state.filter = this.el.filter.value;
      this.renderTags();
      if (this.tagInfo()) this.loadTable();
    });
    this.el.filterError = h("div", { class: "filter-error", hidden: true });
    this.el.tags = h("ul", { class: "tag-list" });
    const sidebar = h("aside", { class: "sidebar" }, [
      h("section", {}, [h("h3", { text: "Runs" }), this.el.runs]),
      h("section", { class: "grow" }, [
        h("h3", { text: "Variables" }),
        this.el.filter,
        this.el.filterError,
        this.el.tags,
      ]),
    ]);

    this.el.toolbar = h("div", { class: "toolbar" });
    this.el.status = h("div", { class: "status", role: "status" });

    this.el.histControls = h("span", { class: "card-controls" });
    this.el.curveControls = h("span", { class: "card-controls" });
    const summary = card("summary-card", "Model summary");
    const heatmap = card("heatmap-card", "Heatmap");
    const hist = card("histogram-card", "Histograms", this.el.histControls);
    const curves = card("curves-card", "Noise over training", this.el.curveControls);
    this.el.curvesLayer = h("div", { class: "curves-layer" });
    this.el.curvesModel = h("div", { class: "curves-model" });
    this.el.curvesLoss = h("div", { class: "curves-loss" });
    this.el.info = h("div", { class: "stat-info", hidden: true, role: "note" });
    curves.body.append(this.el.info, this.el.curvesModel, this.el.curvesLoss, this.el.curvesLayer);

    this.views = {
      table: new TableView(
        summary.body,
        (tag) => this.selectTag(tag, true),
        this.meta.landing.sort,
      ),
      heatmap: new HeatmapView(heatmap.body),
      histogram: new HistogramView(hist.body),
      layerCurves: new CurvesView(this.el.curvesLayer),
      modelCurves: new CurvesView(this.el.curvesModel),
      lossCurves: new CurvesView(this.el.curvesLoss),
    };
    this.el.heatmapCard = heatmap.node;
    // The whole model first (noise and loss over training, the table), then one variable.
    const main = h("main", { class: "main" }, [
      this.el.toolbar,
      this.el.status,
      curves.node,
      summary.node,
      heatmap.node,
      hist.node,
    ]);
    this.root.replaceChildren(h("div", { class: "app" }, [sidebar, main]));
    this.applyTheme();
    this.watchResize(main);
    // The sticky toolbar's height, for the cards' scroll margin (style.css --toolbar-h).
    new ResizeObserver(() => {
      document.documentElement.style.setProperty(
        "--toolbar-h",
        `${this.el.toolbar.offsetHeight}px`,
      );
    }).observe(this.el.toolbar);
  }

  /** Every plot re-lays out to its card's new width (debounced). */
  watchResize(node) {
    let width = node.clientWidth;
    let timer = null;
    new ResizeObserver(() => {
      if (node.clientWidth === width) return;
      width = node.clientWidth;
      clearTimeout(timer);
      timer = setTimeout(() => this.relayout(), 120);
    }).observe(node);
  }

  relayout() {
    const v = this.views;
    if (v.heatmap.model) v.heatmap.render();
    for (const c of [v.histogram, v.layerCurves, v.modelCurves, v.lossCurves])
      if (c.model) c.update(c.model);
    this.resized = (this.resized ?? 0) + 1;
  }

  watchTheme() {
    const update = () => {
      const theme = detectTheme();
      if (theme !== this.state.theme) {
        this.state.theme = theme;
        this.applyTheme();
        this.renderRuns();
        this.loadViews();
      }
    };
    try {
      if (window.parent !== window) {
        new window.parent.MutationObserver(update).observe(window.parent.document.body, {
          attributes: true,
          attributeFilter: ["class"],
        });
      }
    } catch {
      // Not reachable: only the media query below.
    }
    window.matchMedia?.("(prefers-color-scheme: dark)").addEventListener?.("change", update);
  }

  applyTheme() {
    document.documentElement.dataset.theme = this.state.theme;
    this.colors = runColors(this.state.runList, this.meta, this.state.theme === "dark");
  }

  get theme() {
    return THEMES[this.state.theme];
  }

  // -------------------------------------------------------------------------------------------
  // Data.

  /** Memoised fetch until the next reload. */
  cached(key, fetcher) {
    if (!this.cache.has(key)) {
      const p = fetcher();
      p.catch(() => this.cache.delete(key));
      this.cache.set(key, p);
    }
    return this.cache.get(key);
  }

  /** Fetches the tag list again (new runs, new steps) and redraws everything. */
  async reload({ keepZoom = false } = {}) {
    let data;
    try {
      data = await api.fetchTags();
    } catch (e) {
      this.setStatus(`Could not load the list of runs: ${e.message}`, "error");
      return;
    }
    this.cache.clear();
    const s = this.state;
    s.runs = data.runs;
    s.model = data.model;
    s.groups = data.groups;
    s.runList = [...new Set([...Object.keys(data.runs), ...Object.keys(data.model)])].sort();
    for (const r of s.runList) {
      if (!s.known.has(r)) {
        s.known.add(r);
        s.checked.add(r);
      }
    }
    this.applyTheme();
    const withTags = s.runList.filter((r) => Object.keys(s.runs[r] ?? {}).length);
    if (!withTags.length) {
      this.setStatus(
        "No Grad Moments data in this log directory yet. Log moments with tb_gradmom (see the README), " +
          "or write a demo with `tb-gradmom demo --logdir <dir>`; this page reloads every 30 s.",
        "info",
      );
      this.renderRuns();
      this.renderTags();
      this.renderToolbar();
      return;
    }
    this.setStatus("");
    if (!this.activeRuns().length) s.checked.add(withTags[0]);
    if (!this.activeRuns().includes(s.run)) {
      s.run = this.activeRuns()[0];
      s.landed = false;
    }
    this.ensureGroup();
    this.ensureTag();
    if (s.follow) s.step = null;
    this.renderRuns();
    this.renderTags();
    this.renderToolbar();
    this.loadViews({ keepZoom });
  }

  setStatus(text, kind = "info") {
    this.el.status.textContent = text;
    this.el.status.className = `status ${kind}`;
    this.el.status.hidden = !text;
  }

  /** The groups (one per summary.moments call) with a whole-model tag in the shown runs. */
  groupList() {
    const s = this.state;
    return groupsOf(
      s.groups,
      s.runList.filter((r) => s.checked.has(r) || r === s.run),
    );
  }

  /** Whether the tab shows one group at a time (more than one whole-model tag is shown). */
  grouped() {
    return this.groupList().length > 1;
  }

  /**
   * Keeps the chosen group one the active run has (else its first, "" when it exists), or,
   * for a run without whole-model tags, one of the shown runs' groups.
   */
  ensureGroup() {
    const s = this.state;
    const own = groupsOf(s.groups, [s.run]);
    const groups = own.length ? own : this.groupList();
    if (groups.length && !groups.includes(s.group)) s.group = groups[0];
  }

  /** The variables of a run, only the chosen group's when the tab shows groups. */
  tagsOf(run) {
    const info = this.state.runs[run] ?? {};
    const grouped = this.grouped();
    return Object.keys(info)
      .filter((t) => !grouped || (info[t].group ?? "") === this.state.group)
      .sort();
  }

  tagInfo() {
    return this.state.runs[this.state.run]?.[this.state.tag] ?? null;
  }

  /** Keeps the selected tag valid for the active run and the filter. */
  ensureTag() {
    const s = this.state;
    const tags = this.tagsOf(s.run);
    if (!tags.includes(s.tag)) {
      const { tags: shown } = filterTags(tags, s.filter);
      s.tag = shown[0] ?? tags[0] ?? null;
    }
    const info = this.tagInfo();
    if (info) {
      const stats = availableStats(info.orders ?? [1, 2], this.meta);
      if (!stats.includes(s.stat)) {
        // The landing statistic if this variable has it, else its first; in its default view.
        s.stat = stats.includes(this.meta.landing.stat) ? this.meta.landing.stat : stats[0];
        Object.assign(s, defaultView(s.stat, this.meta));
      }
    }
  }

  /** The steps of the selected variable in the active run. */
  steps() {
    return [...(this.tagInfo()?.steps ?? [])].sort((a, b) => a - b);
  }

  currentStep() {
    const steps = this.steps();
    return nearestStep(steps, this.state.follow ? null : this.state.step);
  }

  // -------------------------------------------------------------------------------------------
  // Controls.

  /**
   * The runs, one selection for every view: a checked run is shown (its curves overlaid); the
   * active one (bold, also the toolbar's Run) is always checked, and the table, heatmap and
   * histograms show it. A click on a run's name makes it active; unchecking the active run
   * makes the next checked run active; the last checked run stays checked.
   */
  renderRuns() {
    const s = this.state;
    this.el.runs.replaceChildren(
      ...s.runList.map((run) => {
        const box = h("input", {
          type: "checkbox",
          checked: s.checked.has(run),
          "aria-label": `show run ${run}`,
        });
        box.addEventListener("change", () => {
          if (box.checked) {
            s.checked.add(run);
            this.afterRunsChanged();
            return;
          }
          const others = this.activeRuns().filter((r) => r !== run);
          if (run === s.run && !others.length) {
            box.checked = true;
            this.setStatus("At least one run stays shown: check another run first.", "info");
            return;
          }
          s.checked.delete(run);
          if (run === s.run) this.setRun(others[0]);
          else this.afterRunsChanged();
        });
        const name = h("span", {
          class: "run-name",
          text: run,
          title: `show ${run} in every view`,
        });
        name.addEventListener("click", (e) => {
          e.preventDefault(); // not a click on the checkbox
          if (Object.keys(s.runs[run] ?? {}).length) this.setRun(run);
        });
        return h(
          "label",
          {
            class: `run-row ${run === s.run ? "active" : ""}`,
            title: run,
            "data-run": run,
          },
          [box, h("span", { class: "swatch", style: `background:${this.colors.get(run)}` }), name],
        );
      }),
    );
  }

  /** The checked runs that have variables: those the toolbar's Run offers. */
  activeRuns() {
    const s = this.state;
    return s.runList.filter((r) => s.checked.has(r) && Object.keys(s.runs[r] ?? {}).length);
  }

  /** Shows `run` in every view (checked, active) and lands on its noisiest variable. */
  setRun(run) {
    const s = this.state;
    s.run = run;
    s.checked.add(run);
    s.landed = false; // the noisiest variable of this run, once its table is in
    this.ensureGroup();
    this.ensureTag();
    this.renderRuns();
    this.renderTags();
    this.renderToolbar();
    this.loadViews();
  }

  /** After a run other than the active one was checked or unchecked: the overlays. */
  afterRunsChanged() {
    const s = this.state;
    this.setStatus("");
    const group = s.group;
    const wasGrouped = this.grouped();
    this.ensureGroup();
    this.renderRuns();
    this.renderToolbar();
    if (group !== s.group || wasGrouped !== this.grouped()) this.selectGroup(s.group);
    else this.loadCurves();
  }

  renderTags() {
    const s = this.state;
    const all = this.tagsOf(s.run);
    const { tags, error } = filterTags(all, s.filter);
    this.el.filterError.hidden = !error;
    this.el.filterError.textContent = error ? `Invalid regular expression: ${error}` : "";
    this.el.filter.classList.toggle("invalid", !!error);
    const info = s.runs[s.run] ?? {};
    this.el.tags.replaceChildren(
      ...tags.map((tag) => {
        const t = info[tag];
        const meta = `[${(t.shape ?? []).join("×")}] ${t.op ?? ""}${t.pooled ? " · pooled" : ""}`;
        const button = h(
          "button",
          {
            type: "button",
            class: `tag ${tag === s.tag ? "selected" : ""}`,
            "data-tag": tag,
            title: tag,
          },
          [
            h("span", { class: "tag-name", text: tag }),
            h("span", { class: "tag-meta", text: meta }),
          ],
        );
        button.addEventListener("click", () => this.selectTag(tag, false));
        return h("li", {}, [button]);
      }),
    );
    if (!tags.length && all.length)
      this.el.tags.append(h("li", { class: "empty", text: "No variable matches the filter." }));
  }

  renderToolbar() {
    const s = this.state;
    const info = this.tagInfo();
    const steps = this.steps();
    const step = this.currentStep();
    const withTags = this.activeRuns();
    const field = (label, control) =>
      h("label", { class: "field" }, [h("span", { text: label }), control]);
    const stats = availableStats(info?.orders ?? [1, 2], this.meta).map((v) => ({
      value: v,
      label: statLabel(v, this.meta),
    }));

    const slider = h("input", {
      type: "range",
      class: "step-slider",
      min: 0,
      max: Math.max(0, steps.length - 1),
      value: Math.max(0, steps.indexOf(step)),
      "aria-label": "step",
      disabled: steps.length < 2,
    });
    const stepLabel = h("output", { class: "step-value", text: step ?? "–" });
    slider.addEventListener("input", () => {
      stepLabel.textContent = String(steps[+slider.value]);
    });
    slider.addEventListener("change", () => {
      s.step = steps[+slider.value];
      s.follow = +slider.value === steps.length - 1 && s.follow;
      follow.checked = s.follow;
      this.loadViews({ keepZoom: true });
    });
    const follow = h("input", { type: "checkbox", checked: s.follow, class: "follow" });
    follow.addEventListener("change", () => {
      s.follow = follow.checked;
      if (s.follow) this.reload();
    });
    const reload = h("button", {
      type: "button",
      class: "reload",
      text: "Reload",
      title: "Fetch new runs and steps",
    });
    reload.addEventListener("click", () => this.reload());

    this.el.toolbar.replaceChildren(
      field(
        "Run",
        select(withTags, s.run, (v) => this.setRun(v), {
          class: "run-select",
          title: "The run the table, heatmap and histograms show (the sidebar's checked runs)",
        }),
      ),
      ...(this.grouped()
        ? [
            field(
              "Model",
              select(
                this.groupList().map((g) => ({ value: g, label: groupLabel(g) })),
                s.group,
                (v) => this.selectGroup(v),
                {
                  class: "group-select",
                  title:
                    "One group per summary.moments call (name=): its whole-model curves, summary table and variables",
                },
              ),
            ),
          ]
        : []),
      field(
        "Statistic",
        select(
          stats,
          s.stat,
          (v) => {
            s.stat = v;
            Object.assign(s, defaultView(v, this.meta));
            this.renderToolbar();
            this.loadViews({ only: ["heatmap", "histogram"] });
          },
          { class: "stat-select" },
        ),
      ),
      field(
        "Colour map",
        select(
          COLORMAPS,
          s.colormap,
          (v) => {
            s.colormap = v;
            this.loadViews({ only: ["heatmap"], keepZoom: true });
          },
          { class: "colormap-select" },
        ),
      ),
      field(
        "Scale",
        select(
          ["linear", "log"],
          s.scale,
          (v) => {
            s.scale = v;
            this.loadViews({ only: ["heatmap"], keepZoom: true });
          },
          { class: "scale-select" },
        ),
      ),
      h("div", { class: "field step-field" }, [h("span", { text: "Step" }), slider, stepLabel]),
      h("label", { class: "field check" }, [follow, h("span", { text: "Follow latest" })]),
      reload,
    );

    this.el.histControls.replaceChildren(
      select(
        [
          { value: "step", label: "this step" },
          { value: "steps", label: "over steps (offset)" },
        ],
        s.histMode,
        (v) => {
          s.histMode = v;
          this.loadHistogram();
        },
        { class: "hist-mode", "aria-label": "histogram mode" },
      ),
      checkbox(
        "log x",
        s.histLog,
        (checked) => {
          s.histLog = checked;
          this.loadHistogram();
        },
        { class: "hist-log" },
      ),
    );
    const smoothing = h("input", {
      type: "range",
      class: "smoothing",
      min: 0,
      max: 0.99,
      step: 0.01,
      value: s.smoothing,
      "aria-label": "smoothing",
      title: "EMA decay: numerator and denominator are smoothed separately, then divided",
    });
    const smoothingValue = h("output", { class: "smoothing-value", text: s.smoothing.toFixed(2) });
    smoothing.addEventListener("input", () => {
      smoothingValue.textContent = (+smoothing.value).toFixed(2);
    });
    smoothing.addEventListener("change", () => {
      s.smoothing = +smoothing.value;
      smoothingValue.textContent = s.smoothing.toFixed(2);
      this.loadViews({ only: ["curves", "table"] });
    });
    const infoButton = h("button", {
      type: "button",
      class: "info-button",
      text: "What is this?",
      "aria-label": "what this statistic is",
      "aria-expanded": String(!this.el.info.hidden),
    });
    infoButton.addEventListener("click", () => {
      this.el.info.hidden = !this.el.info.hidden;
      infoButton.setAttribute("aria-expanded", String(!this.el.info.hidden));
      this.renderInfo();
    });
    this.el.curveControls.replaceChildren(
      select(
        curveGroups(this.meta).map((g) => ({
          group: g.name,
          title: g.description,
          options: g.keys.map((k) => ({
            value: k,
            label: seriesTitle(k, this.meta),
            title: seriesInfo(k, this.meta).meaning,
          })),
        })),
        s.metric,
        (v) => {
          s.metric = v;
          this.renderInfo();
          this.loadCurves();
        },
        { class: "metric-select", "aria-label": "quantity" },
      ),
      infoButton,
      h("label", { class: "check smoothing-field" }, [
        h("span", { text: "Smoothing" }),
        smoothing,
        smoothingValue,
      ]),
      checkbox(
        "log y",
        s.logy,
        (checked) => {
          s.logy = checked;
          this.loadCurves();
        },
        { class: "curves-log" },
      ),
    );
  }

  /**
   * The info panel: the selected quantity's name, meaning, formula, unit, reading, reference
   * (those it has: the logged quantities have a name, meaning and unit only).
   */
  renderInfo() {
    const st = seriesInfo(this.state.metric, this.meta);
    const kind = curveGroups(this.meta).find((g) => g.keys.includes(this.state.metric));
    const row = (k, v) =>
      v &&
      h("div", { class: `info-row info-${k}` }, [
        h("span", { class: "info-key", text: k }),
        h("span", { class: "info-value", text: v }),
      ]);
    this.el.info.replaceChildren(
      ...[
        h("h3", { text: seriesTitle(this.state.metric, this.meta) }),
        st.meaning && h("p", { class: "info-meaning", text: `${st.meaning}.` }),
        kind && row("kind", `${kind.name}${kind.description ? `: ${kind.description}` : ""}`),
        row("formula", st.formula),
        row("unit", st.unit),
        row("reading", st.reading),
        row("smoothing", st.smoothing),
        row("reference", st.reference),
      ].filter(Boolean),
    );
  }

  /** Shows another group: its model curves and table, landing on its noisiest variable. */
  selectGroup(group) {
    const s = this.state;
    s.group = group;
    if (!s.groups[s.run]?.[group]) {
      // Another run has this group: show that run's variables and table.
      const other = s.runList.find(
        (r) => s.groups[r]?.[group] && Object.keys(s.runs[r] ?? {}).length,
      );
      if (other) s.run = other;
    }
    s.landed = false;
    this.ensureTag();
    this.renderRuns();
    this.renderTags();
    this.renderToolbar();
    this.loadViews();
  }

  selectTag(tag, scroll) {
    this.state.tag = tag;
    this.ensureTag();
    this.renderTags();
    this.renderToolbar();
    this.loadViews({ only: ["heatmap", "histogram", "curves", "table"] });
    if (scroll) this.el.heatmapCard.scrollIntoView({ behavior: "smooth", block: "start" });
  }

  // -------------------------------------------------------------------------------------------
  // Views.

  loadViews({ only = ["heatmap", "histogram", "curves", "table"], keepZoom = false } = {}) {
    if (!this.tagInfo()) return;
    const jobs = [];
    if (only.includes("heatmap")) jobs.push(this.loadHeatmap(keepZoom));
    if (only.includes("histogram")) jobs.push(this.loadHistogram());
    if (only.includes("curves")) jobs.push(this.loadCurves());
    if (only.includes("table")) jobs.push(this.loadTable());
    this.pending = Promise.all(jobs);
    return this.pending;
  }

  /**
   * Starts a load of one kind of view ("heatmap", "histogram", "curves", "table"); returns a
   * function that tells whether it is still the newest load of that kind, so that a slow answer
   * never replaces what a later load drew.
   */
  startLoad(kind) {
    const gen = ++this.generation[kind];
    return () => gen === this.generation[kind];
  }

  /**
   * Loads the view `kind` ("heatmap", "histogram", "table"): `fetch()` gets the data and
   * `show(data)` draws it, unless a newer load of that view started meanwhile. If either
   * fails, the view says "Could not load `what`: <reason>" (again only for the newest load).
   */
  async load(kind, what, fetch, show) {
    const current = this.startLoad(kind);
    try {
      const data = await fetch();
      if (current()) show(data);
    } catch (e) {
      if (current()) this.views[kind].showMessage(`Could not load ${what}: ${e.message}`, "error");
    }
  }

  /** The heatmap of the shown statistic, with the tooltip's other statistics at the same step. */
  async loadHeatmap(keepZoom = false) {
    const s = this.state;
    const { run, tag, stat } = s;
    const step = this.currentStep();
    const info = this.tagInfo();
    const get = (st) =>
      this.cached(`heatmap|${run}|${tag}|${step}|${st}`, () =>
        api.fetchHeatmap({ run, tag, step, stat: st }),
      );
    return this.load(
      "heatmap",
      `the heatmap of ${tag}`,
      async () => {
        const extraStats = TOOLTIP_STATS.filter(
          (x) => x !== stat && availableStats(info.orders ?? [1, 2], this.meta).includes(x),
        );
        const [data, ...extras] = await Promise.all([
          get(stat),
          ...extraStats.map((x) => get(x).catch(() => null)),
        ]);
        return { data, extras: Object.fromEntries(extraStats.map((x, k) => [x, extras[k]])) };
      },
      ({ data, extras }) =>
        this.views.heatmap.update(
          {
            data,
            extras,
            stat,
            label: statLabel(stat, this.meta),
            signed: isSigned(stat, this.meta),
            run,
            tag,
            colormap: s.colormap,
            scale: s.scale,
            theme: this.theme,
            exportTheme: THEMES.light,
          },
          { keepZoom },
        ),
    );
  }

  /** The histogram of the shown statistic at the current step, or over all steps. */
  async loadHistogram() {
    const s = this.state;
    const { run, tag, stat, histMode } = s;
    const step = histMode === "steps" ? "all" : this.currentStep();
    const scale = s.histLog ? "log" : "linear";
    const size = (this.tagInfo()?.shape ?? []).reduce((a, b) => a * b, 1);
    const plan = histogramPlan(size);
    return this.load(
      "histogram",
      `the histogram of ${tag}`,
      () =>
        this.cached(`histogram|${run}|${tag}|${stat}|${step}|${scale}|${plan.bins}`, () =>
          api.fetchHistogram({ run, tag, stat, step, bins: plan.bins, scale }),
        ),
      (data) =>
        this.views.histogram.update({
          data,
          mode: histMode,
          maxRidges: plan.ridges,
          label: statLabel(stat, this.meta),
          run,
          tag,
          stat,
          color: this.colors.get(run),
          theme: this.theme,
          exportTheme: THEMES.light,
        }),
    );
  }

  /**
   * The curves of the checked runs: the variable's, the whole model's and the loss. A run that
   * fails is left out of the plots and named in the status line.
   */
  async loadCurves() {
    const current = this.startLoad("curves");
    const s = this.state;
    const runs = s.runList.filter((r) => s.checked.has(r));
    const fetchAll = async (tag, hasTag) => {
      const out = [];
      for (const run of runs) {
        if (!hasTag(run)) continue;
        try {
          const smoothing = s.smoothing;
          const d = await this.cached(`series|${run}|${tag}|${smoothing}`, () =>
            api.fetchSeries({ run, tag, smoothing: smoothing > 0 ? smoothing : undefined }),
          );
          const pick = (m) => ({
            run,
            color: this.colors.get(run),
            steps: d.steps,
            wall_times: d.wall_times,
            values: d.values[m] ?? [],
            smoothed: d.smoothed?.[m] ?? null,
            se: d.smoothed_se?.[m] ?? null,
          });
          out.push({ ...pick(s.metric), loss: pick("loss") });
        } catch (e) {
          out.push({ run, color: this.colors.get(run), steps: [], values: [], error: e.message });
        }
      }
      return out;
    };
    const tag = s.tag;
    const [layer, model] = await Promise.all([
      fetchAll(tag, (r) => !!s.runs[r]?.[tag]),
      fetchAll(modelTag(s.group), (r) => !!s.groups[r]?.[s.group]),
    ]);
    if (!current()) return;
    const common = {
      metric: s.metric,
      logy: s.logy,
      smoothing: s.smoothing,
      statistic: seriesInfo(s.metric, this.meta),
      title: seriesTitle(s.metric, this.meta),
      axisLabel: axisLabel(s.metric, this.meta),
      positiveOnly: isPositiveOnly(s.metric, this.meta),
      theme: this.theme,
      exportTheme: THEMES.light,
    };
    this.views.layerCurves.update({
      ...common,
      label: tag,
      tag,
      series: layer.filter((x) => !x.error),
    });
    if (model.some((x) => !x.error)) {
      const ok = model.filter((x) => !x.error);
      const label = this.grouped() ? `whole model ${groupLabel(s.group)}` : "whole model";
      this.views.modelCurves.update({ ...common, label, tag: modelTag(s.group), series: ok });
      const loss = ok.map((x) => x.loss).filter((x) => x.values.some(Number.isFinite));
      if (loss.length) {
        this.views.lossCurves.update({
          ...common,
          metric: "loss",
          logy: false,
          statistic: seriesInfo("loss", this.meta),
          title: seriesTitle("loss", this.meta),
          axisLabel: axisLabel("loss", this.meta),
          positiveOnly: isPositiveOnly("loss", this.meta),
          label: this.grouped() ? `${groupLabel(s.group)}, as logged` : "as logged",
          tag: modelTag(s.group),
          series: loss,
        });
      } else this.views.lossCurves.showMessage("No loss logged with the moments.");
    } else {
      this.views.modelCurves.showMessage(
        `No whole-model statistics (${modelTag(s.group)}/_stats) in the shown runs.`,
      );
      this.views.lossCurves.clear();
    }
    const failed = [...layer, ...model].filter((x) => x.error);
    if (failed.length)
      this.setStatus(
        `Some curves could not be loaded: ${failed.map((x) => `${x.run}: ${x.error}`).join("; ")}`,
        "error",
      );
  }

  /** The summary table of the run (of the shown group) at the model step nearest the current. */
  async loadTable() {
    const s = this.state;
    const run = s.run;
    const groupInfo = s.groups[run]?.[s.group];
    const group = groupInfo ? s.group : undefined;
    const modelSteps = groupInfo?.steps ?? this.steps();
    const step = nearestStep(
      [...modelSteps].sort((a, b) => a - b),
      this.currentStep(),
    );
    const smoothing = s.smoothing;
    return this.load(
      "table",
      `the summary of run ${run}`,
      () =>
        this.cached(`summary|${run}|${step}|${group}|${smoothing}`, () =>
          api
            .fetchSummary({
              run,
              step,
              group,
              numeric: summaryNumericKeys(this.meta),
              smoothing: smoothing > 0 ? smoothing : undefined,
            })
            .then((d) => ({
              ...d,
              rows: d.rows.map((r) => tableRow(r, this.meta)),
              model: d.model && tableRow(d.model, this.meta),
            })),
        ),
      (d) => {
        const { tags } = filterTags(
          d.rows.map((r) => r.tag),
          s.filter,
        );
        const keep = new Set(tags);
        if (!s.landed) {
          // Land on the noisiest variable (largest total variance: /meta's landing.sort), once
          // per page load.
          s.landed = true;
          const best = argmaxRow(
            d.rows.filter((r) => keep.has(r.tag)),
            this.meta.landing.sort,
          );
          const rows = d.rows.filter((r) => keep.has(r.tag));
          if (best >= 0 && rows[best].tag !== s.tag) {
            this.selectTag(rows[best].tag, false);
            return;
          }
        }
        this.views.table.update({
          rows: d.rows.filter((r) => keep.has(r.tag)),
          model: d.model,
          run,
          step,
          selected: s.tag,
          theme: this.theme,
          exportTheme: THEMES.light,
          group: this.grouped() ? groupLabel(s.group) : null,
          statistics: this.meta.statistics,
          smoothing,
          positiveOnly: this.meta.positive_only,
        });
      },
    );
  }
}
