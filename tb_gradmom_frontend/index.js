// @ts-check
// The Grad Moments tab. TensorBoard loads this module in the plugin frame
// (/data/plugin_entry.html?name=gradmom, base href /data/plugin/gradmom/) and calls render().
//
// state.js holds the state (one update path: App.dispatch; one render pass: App.renderAll,
// which redraws what changed and keeps the selection in the URL); api.js fetches, core.js
// transforms, views/ draw; host.js talks to TensorBoard (reloads, its URL). Every label, statistic
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
  filterTags,
  groupLabel,
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
import { connectHost } from "./host.js";
import {
  activeRuns,
  comparedRuns,
  comparedSteps,
  currentStep,
  exampleColumn,
  exampleRun,
  exampleRuns,
  exampleTag,
  fromHash,
  fromURLParams,
  groupList,
  grouped,
  initialState,
  steps,
  tagInfo,
  tagsOf,
  toHash,
  toURLParams,
  update,
  viewKeys,
} from "./state.js";
import { checkbox, h, select } from "./views/common.js";
import { CompareHeatmapView } from "./views/compare.js";
import { CurvesView } from "./views/curves.js";
import { ExamplesView } from "./views/examples.js";
import { noiseNoteNode } from "./views/info.js";
import { HeatmapView } from "./views/heatmap.js";
import { HistogramView } from "./views/histogram.js";
import { TableView } from "./views/table.js";

/** @typedef {import("./state.js").State} State */
/** @typedef {import("./state.js").Action} Action */

const PLUGIN = "gradmom"; // the plugin's name (tb_gradmom.metadata.PLUGIN_NAME)
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
  /** @type {any} */ (window).gradmom = app; // for debugging and the browser tests
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
  /**
   * `meta`: the backend's /meta payload (core.checkMeta), for every label and default.
   * @param {HTMLElement} root
   * @param {any} meta
   */
  constructor(root, meta) {
    this.root = root;
    this.meta = meta;
    this.host = connectHost(PLUGIN);
    /** @type {State} */
    this.state = initialState(meta, detectTheme());
    /** @type {Record<string, string>} */
    this.keys = {};
    /** @type {Map<string, Promise<any>>} */
    this.cache = new Map();
    this.generation = { heatmap: 0, histogram: 0, curves: 0, table: 0, examples: 0 };
    /** @type {any} what the per-example view shows (/examples/tags' view), once loaded */
    this.exView = null;
    /** @type {Promise<any> | undefined} the views' loads of the last render pass */
    this.pending = undefined;
    /** @type {Map<string, string>} */
    this.colors = new Map();
  }

  async start() {
    // The selection a reload or a shared link asks for: the frame's own hash (the tab opened on
    // its own page), else TensorBoard's URL (p.gradmom.* pairs, through the plugin library).
    let params = fromHash(window.location.hash);
    if (!Object.keys(params).length && this.host) params = await this.host.getURLPluginData();
    this.state = initialState(this.meta, detectTheme(), fromURLParams(params));
    this.buildSkeleton();
    this.watchTheme();
    await this.reload();
    if (this.host) {
      // Inside TensorBoard: its reload button and auto-reload (every 30 s by default) say when.
      this.host.onReload(() => {
        if (!document.hidden) this.reload({ auto: true });
      });
    } else {
      this.timer = setInterval(() => {
        if (this.state.follow && !document.hidden) this.reload({ auto: true });
      }, RELOAD_MS);
    }
  }

  // -------------------------------------------------------------------------------------------
  // The one update path and the one render pass.

  /**
   * Applies `action` (state.update) and redraws what changed. Returns the views' loads.
   * @param {Action} action
   */
  dispatch(action) {
    const next = update(this.state, action, this.meta);
    if (next === this.state) return this.pending ?? Promise.resolve();
    this.state = next;
    return this.renderAll();
  }

  /** Redraws each part of the page whose key (state.viewKeys) changed, and writes the URL. */
  renderAll() {
    const s = this.state;
    const keys = viewKeys(s);
    const prev = this.keys;
    this.keys = keys;
    /** @param {keyof typeof keys} k */
    const changed = (k) => keys[k] !== prev[k];
    if (s.notice) this.setStatus(s.notice, "info");
    if (changed("runs")) {
      this.applyTheme();
      this.renderRuns();
    }
    if (changed("tags")) this.renderTags();
    if (changed("toolbar")) this.renderToolbar();
    if (changed("info")) this.renderInfo();
    this.writeURL();
    const jobs = [];
    // The per-example section does not need moments: a run may have only per-example norms.
    if (changed("examples")) jobs.push(this.loadExamples());
    if (!tagInfo(s)) {
      if (jobs.length) this.pending = Promise.all(jobs);
      return this.pending ?? Promise.resolve();
    }
    if (changed("heatmap")) jobs.push(this.loadHeatmap());
    if (changed("histogram")) jobs.push(this.loadHistogram());
    if (changed("curves")) jobs.push(this.loadCurves());
    if (changed("table")) jobs.push(this.loadTable());
    if (jobs.length) this.pending = Promise.all(jobs);
    return this.pending;
  }

  /** The selection into the URL: the frame's hash, and TensorBoard's (p.gradmom.*). */
  writeURL() {
    if (!this.state.run && !exampleRun(this.state)) return;
    const params = toURLParams(this.state);
    const hash = toHash(params);
    if (hash !== window.location.hash) {
      const url = new URL(window.location.href);
      url.hash = hash;
      window.history.replaceState(window.history.state, "", url.href);
    }
    this.host?.setURLPluginData(params);
  }

  // -------------------------------------------------------------------------------------------
  // Layout.

  buildSkeleton() {
    /** @param {string} id @param {string} title @param {HTMLElement} [controls] */
    const card = (id, title, controls) => {
      const body = h("div", { class: "card-body" });
      const node = h("section", { class: "card", id }, [
        h("header", { class: "card-header" }, [h("h2", { text: title }), controls ?? h("span")]),
        body,
      ]);
      return { node, body };
    };
    const el = {
      runs: h("div", { class: "run-list" }),
      filter: /** @type {HTMLInputElement} */ (
        h("input", {
          type: "search",
          class: "tag-filter",
          placeholder: "Filter variables (regular expressions supported)",
          "aria-label": "Filter variables by regular expression",
          value: this.state.filter,
        })
      ),
      filterError: h("div", { class: "filter-error", hidden: true }),
      tags: h("ul", { class: "tag-list" }),
      toolbar: h("div", { class: "toolbar" }),
      status: h("div", { class: "status", role: "status" }),
      // One line per run whose records come from several writers (/tags `writers`).
      writers: h("div", { class: "status warning run-writers", role: "note", hidden: true }),
      heatmapControls: h("span", { class: "card-controls" }),
      histControls: h("span", { class: "card-controls" }),
      curveControls: h("span", { class: "card-controls" }),
      curvesLayer: h("div", { class: "curves-layer" }),
      curvesLayerTotal: h("div", { class: "curves-layer-total" }),
      // A noise scale's tr(Σ) and |G|² (/meta ratio_parts), below the plot of the ratio.
      curvesLayerParts: h("div", { class: "curves-parts curves-layer-parts" }),
      curvesModelParts: h("div", { class: "curves-parts curves-model-parts" }),
      curvesModel: h("div", { class: "curves-model" }),
      curvesLoss: h("div", { class: "curves-loss" }),
      info: h("div", { class: "stat-info", hidden: true, role: "note" }),
      heatmapCard: h("span"),
      exControls: h("span", { class: "card-controls" }),
      exCard: h("span"),
    };
    this.el = el;
    el.filter.addEventListener("input", () =>
      this.dispatch({ type: "setFilter", filter: el.filter.value }),
    );
    const sidebar = h("aside", { class: "sidebar" }, [
      h("section", {}, [h("h3", { text: "Runs" }), el.runs]),
      h("section", { class: "grow" }, [
        h("h3", { text: "Variables" }),
        el.filter,
        el.filterError,
        el.tags,
      ]),
    ]);
    const summary = card("summary-card", "Model summary");
    const heatmap = card("heatmap-card", "Heatmap", el.heatmapControls);
    const hist = card("histogram-card", "Histograms", el.histControls);
    const curves = card("curves-card", "Noise over training", el.curveControls);
    curves.body.append(
      el.info,
      el.curvesModel,
      el.curvesModelParts,
      el.curvesLoss,
      el.curvesLayerTotal,
      el.curvesLayerParts,
      el.curvesLayer,
    );
    el.heatmapCard = heatmap.node;
    const examples = card("examples-card", "Per-example gradient norms", el.exControls);
    examples.node.hidden = true; // shown when a run has per-example norms
    el.exCard = examples.node;

    this.views = {
      table: new TableView(
        summary.body,
        (/** @type {string} */ tag) => this.selectTag(tag, true),
        this.meta.landing.sort,
      ),
      heatmap: new HeatmapView(heatmap.body),
      compare: new CompareHeatmapView(heatmap.body),
      histogram: new HistogramView(hist.body),
      layerCurves: new CurvesView(el.curvesLayer),
      layerTotalCurves: new CurvesView(el.curvesLayerTotal, el.curvesLayerParts),
      modelCurves: new CurvesView(el.curvesModel, el.curvesModelParts),
      lossCurves: new CurvesView(el.curvesLoss),
      examples: new ExamplesView(examples.body, {
        onStep: (step) => this.dispatch({ type: "setExamples", key: "exStep", value: step }),
        onThreshold: (v) => this.dispatch({ type: "setExamples", key: "exThreshold", value: v }),
        onClip: (v) => this.dispatch({ type: "setExamples", key: "clipNorm", value: v }),
      }),
    };
    // The whole model first (noise and loss over training, the table), then one variable.
    const main = h("main", { class: "main" }, [
      el.toolbar,
      el.status,
      el.writers,
      curves.node,
      examples.node,
      summary.node,
      heatmap.node,
      hist.node,
    ]);
    this.root.replaceChildren(h("div", { class: "app" }, [sidebar, main]));
    this.applyTheme();
    this.watchResize(main);
    // The sticky toolbar's height, for the cards' scroll margin (style.css --toolbar-h).
    new ResizeObserver(() => {
      document.documentElement.style.setProperty("--toolbar-h", `${el.toolbar.offsetHeight}px`);
    }).observe(el.toolbar);
  }

  /**
   * Every plot re-lays out to its card's new width (debounced).
   * @param {HTMLElement} node
   */
  watchResize(node) {
    let width = node.clientWidth;
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let timer;
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
    if (v.compare.model) v.compare.render();
    const resizable = [v.histogram, v.layerCurves, v.layerTotalCurves, v.modelCurves, v.lossCurves];
    for (const c of [...resizable, v.examples]) if (c.model) c.update(c.model);
    this.resized = (this.resized ?? 0) + 1;
  }

  watchTheme() {
    const check = () => this.dispatch({ type: "setTheme", theme: detectTheme() });
    try {
      if (window.parent !== window) {
        const parent = /** @type {Window & typeof globalThis} */ (window.parent);
        new parent.MutationObserver(check).observe(parent.document.body, {
          attributes: true,
          attributeFilter: ["class"],
        });
      }
    } catch {
      // Not reachable: only the media query below.
    }
    window.matchMedia?.("(prefers-color-scheme: dark)").addEventListener?.("change", check);
  }

  applyTheme() {
    document.documentElement.dataset.theme = this.state.theme;
    this.colors = runColors(this.state.runList, this.meta, this.state.theme === "dark");
  }

  get theme() {
    return THEMES[/** @type {"light" | "dark"} */ (this.state.theme)];
  }

  // -------------------------------------------------------------------------------------------
  // Data.

  /**
   * Memoised fetch until the next reload.
   * @template T
   * @param {string} key
   * @param {() => Promise<T>} fetcher
   * @returns {Promise<T>}
   */
  cached(key, fetcher) {
    if (!this.cache.has(key)) {
      const p = fetcher();
      p.catch(() => this.cache.delete(key));
      this.cache.set(key, p);
    }
    return /** @type {Promise<T>} */ (this.cache.get(key));
  }

  /**
   * Fetches the tag list again (new runs, new steps) and redraws everything.
   * @param {{auto?: boolean}} [options] `auto`: a periodic reload (TensorBoard's or ours)
   */
  async reload({ auto = false } = {}) {
    let data;
    // The per-example norms' listing; a failure leaves their section out, not the tab.
    const examples = api.fetchExamplesTags().catch((e) => {
      this.setStatus(`Could not load the per-example norms: ${errorText(e)}`, "error");
      return null;
    });
    try {
      data = await api.fetchTags();
    } catch (e) {
      this.setStatus(`Could not load the list of runs: ${errorText(e)}`, "error");
      return;
    }
    this.renderWriters(data.writers);
    const ex = await examples;
    if (auto && !this.state.follow) {
      // Not following: a periodic reload adds new runs and steps but keeps what is drawn.
      const known = JSON.stringify([this.state.runs, this.state.groups]);
      if (known === JSON.stringify([data.runs, data.groups])) return;
    }
    this.cache.clear();
    if (ex) {
      // Before the tags: their render pass then draws the per-example section once, fresh.
      this.exView = ex.view;
      this.dispatch({ type: "examples", runs: ex.runs });
    }
    this.dispatch({ type: "tags", data });
    const s = this.state;
    if (!s.runList.some((r) => Object.keys(s.runs[r] ?? {}).length)) {
      if (exampleRuns(s).length) {
        this.setStatus(
          "These runs have per-example norms only (no moments): see Per-example gradient norms.",
          "info",
        );
        await this.pending;
        return;
      }
      this.setStatus(
        "No Grad Moments data in this log directory yet. Log moments with tb_gradmom (see the README), " +
          "or write a demo with `tb-gradmom demo --logdir <dir>`; " +
          (this.host
            ? "the tab reloads with TensorBoard (its reload button, or auto-reload)."
            : "this page reloads every 30 s."),
        "info",
      );
      return;
    }
    if (!s.notice) this.setStatus("");
    await this.pending;
  }

  /**
   * A warning line for each run whose records come from several summary writers: the
   * backend's message (how many writers, which steps, the fix).
   * @param {Record<string, {message: string}>} writers
   */
  renderWriters(writers) {
    const runs = Object.keys(writers).sort();
    this.el.writers.replaceChildren(
      ...runs.map((run) =>
        h("p", { class: "run-writers-line", "data-run": run, text: writers[run].message }),
      ),
    );
    this.el.writers.hidden = !runs.length;
  }

  /**
   * @param {string} text
   * @param {string} [kind]
   */
  setStatus(text, kind = "info") {
    this.el.status.textContent = text;
    this.el.status.className = `status ${kind}`;
    this.el.status.hidden = !text;
  }

  // -------------------------------------------------------------------------------------------
  // Controls.

  /**
   * The runs, one selection for every view: a checked run is shown (its curves overlaid, its
   * panel in a run comparison); the active one (bold, also the toolbar's Run) is always
   * checked, and the table, heatmap and histograms show it. A click on a run's name makes it
   * active; unchecking the active run makes the next checked run active; the last checked run
   * stays checked.
   */
  renderRuns() {
    const s = this.state;
    this.el.runs.replaceChildren(
      ...s.runList.map((run) => {
        const box = /** @type {HTMLInputElement} */ (
          h("input", {
            type: "checkbox",
            checked: s.checked.includes(run),
            "aria-label": `show run ${run}`,
          })
        );
        box.addEventListener("change", () => {
          this.dispatch({ type: "toggleRun", run, checked: box.checked });
          box.checked = this.state.checked.includes(run);
        });
        const name = h("span", {
          class: "run-name",
          text: run,
          title: `show ${run} in every view`,
        });
        name.addEventListener("click", (e) => {
          e.preventDefault(); // not a click on the checkbox
          this.dispatch({ type: "setRun", run });
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

  renderTags() {
    const s = this.state;
    const all = tagsOf(s, s.run);
    const { tags, error } = filterTags(all, s.filter);
    this.el.filterError.hidden = !error;
    this.el.filterError.textContent = error ? `Invalid regular expression: ${error}` : "";
    this.el.filter.classList.toggle("invalid", !!error);
    if (this.el.filter.value !== s.filter) this.el.filter.value = s.filter;
    const info = (s.run && s.runs[s.run]) || {};
    this.el.tags.replaceChildren(
      ...tags.map((tag) => {
        const t = info[tag];
        const meta =
          t.maps === false
            ? `no maps (${t.source} mode)`
            : `[${(t.shape ?? []).join("×")}] ${t.op ?? ""}${t.pooled ? " · pooled" : ""}`;
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
    const info = tagInfo(s);
    const all = steps(s);
    const step = currentStep(s);
    /** @param {string} label @param {HTMLElement} control */
    const field = (label, control) =>
      h("label", { class: "field" }, [h("span", { text: label }), control]);
    const stats = availableStats(info?.orders ?? [1, 2], this.meta).map((v) => ({
      value: v,
      label: statLabel(v, this.meta),
    }));
    /** @param {import("./state.js").OptionKey} key @param {any} value */
    const set = (key, value) => this.dispatch({ type: "set", key, value });

    const slider = /** @type {HTMLInputElement} */ (
      h("input", {
        type: "range",
        class: "step-slider",
        min: 0,
        max: Math.max(0, all.length - 1),
        value: Math.max(0, step === null ? 0 : all.indexOf(step)),
        "aria-label": "step",
        disabled: all.length < 2,
      })
    );
    const stepLabel = h("output", { class: "step-value", text: step ?? "–" });
    slider.addEventListener("input", () => {
      stepLabel.textContent = String(all[+slider.value]);
    });
    slider.addEventListener("change", () =>
      this.dispatch({
        type: "setStep",
        step: all[+slider.value],
        last: +slider.value === all.length - 1,
      }),
    );
    const follow = /** @type {HTMLInputElement} */ (
      h("input", { type: "checkbox", checked: s.follow, class: "follow" })
    );
    follow.addEventListener("change", () => {
      this.dispatch({ type: "setFollow", follow: follow.checked });
      if (follow.checked) this.reload();
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
        select(activeRuns(s), s.run, (v) => this.dispatch({ type: "setRun", run: v }), {
          class: "run-select",
          title: "The run the table, heatmap and histograms show (the sidebar's checked runs)",
        }),
      ),
      ...(grouped(s)
        ? [
            field(
              "Model",
              select(
                groupList(s).map((g) => ({ value: g, label: groupLabel(g) })),
                s.group,
                (v) => this.dispatch({ type: "selectGroup", group: v }),
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
        select(stats, s.stat, (v) => this.dispatch({ type: "setStat", stat: v }), {
          class: "stat-select",
        }),
      ),
      field(
        "Colour map",
        select(COLORMAPS, s.colormap, (v) => set("colormap", v), { class: "colormap-select" }),
      ),
      field(
        "Scale",
        select(["linear", "log"], s.scale, (v) => set("scale", v), { class: "scale-select" }),
      ),
      h("div", { class: "field step-field" }, [h("span", { text: "Step" }), slider, stepLabel]),
      h("label", { class: "field check" }, [follow, h("span", { text: "Follow latest" })]),
      reload,
    );

    this.el.heatmapControls.replaceChildren(...this.compareControls());
    this.el.histControls.replaceChildren(
      select(
        [
          { value: "step", label: "this step" },
          { value: "steps", label: "over steps (offset)" },
        ],
        s.histMode,
        (v) => set("histMode", v),
        {
          class: "hist-mode",
          "aria-label": "histogram mode",
          disabled: s.compare !== "off",
          title: s.compare !== "off" ? "A comparison overlays one step per histogram" : null,
        },
      ),
      checkbox("log x", s.histLog, (checked) => set("histLog", checked), { class: "hist-log" }),
    );
    const smoothing = /** @type {HTMLInputElement} */ (
      h("input", {
        type: "range",
        class: "smoothing",
        min: 0,
        max: 0.99,
        step: 0.01,
        value: s.smoothing,
        "aria-label": "smoothing",
        title: "EMA decay: numerator and denominator are smoothed separately, then divided",
      })
    );
    const smoothingValue = h("output", { class: "smoothing-value", text: s.smoothing.toFixed(2) });
    smoothing.addEventListener("input", () => {
      smoothingValue.textContent = (+smoothing.value).toFixed(2);
    });
    smoothing.addEventListener("change", () => set("smoothing", +smoothing.value));
    const infoButton = h("button", {
      type: "button",
      class: "info-button",
      text: "What is this?",
      "aria-label": "what this statistic is",
      "aria-expanded": String(s.info),
    });
    infoButton.addEventListener("click", () => set("info", !this.state.info));
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
        (v) => set("metric", v),
        { class: "metric-select", "aria-label": "quantity" },
      ),
      infoButton,
      h("label", { class: "check smoothing-field" }, [
        h("span", { text: "Smoothing" }),
        smoothing,
        smoothingValue,
      ]),
      checkbox("log y", s.logy, (checked) => set("logy", checked), { class: "curves-log" }),
    );
  }

  /**
   * The comparison's controls, in the heatmap card's header: off, the shown runs side by side
   * (the sidebar's checked runs that have the variable), or two steps of the run (the toolbar's
   * step and the one chosen here).
   */
  compareControls() {
    const s = this.state;
    const mode = select(
      [
        { value: "off", label: "no comparison" },
        { value: "runs", label: "compare the shown runs" },
        { value: "steps", label: "compare two steps" },
      ],
      s.compare,
      (v) => this.dispatch({ type: "setCompare", compare: /** @type {any} */ (v) }),
      {
        class: "compare-select",
        "aria-label": "comparison",
        title:
          "Side by side with one colour scale (heatmaps), overlaid (histograms): the runs checked in the sidebar, or two steps",
      },
    );
    if (s.compare !== "steps") return [mode];
    const pair = comparedSteps(s);
    const other = pair ? (pair[0] === currentStep(s) ? pair[1] : pair[0]) : null;
    const vs = select(
      steps(s).map((st) => String(st)),
      String(other ?? ""),
      (v) => this.dispatch({ type: "setCompareStep", step: Number(v) }),
      { class: "compare-step", "aria-label": "the other step" },
    );
    return [mode, h("label", { class: "check" }, [h("span", { text: "vs step" }), vs])];
  }

  /**
   * The info panel: the selected quantity's name, meaning, formula, unit, reading, reference
   * (those it has: the logged quantities have a name, meaning and unit only).
   */
  renderInfo() {
    const s = this.state;
    this.el.info.hidden = !s.info;
    const st = seriesInfo(s.metric, this.meta);
    const kind = curveGroups(this.meta).find((g) => g.keys.includes(s.metric));
    /** @param {string} k @param {string | undefined} v */
    const row = (k, v) =>
      v &&
      h("div", { class: `info-row info-${k}` }, [
        h("span", { class: "info-key", text: k }),
        h("span", { class: "info-value", text: v }),
      ]);
    this.el.info.replaceChildren(
      ...[
        h("h3", { text: seriesTitle(s.metric, this.meta) }),
        st.meaning && h("p", { class: "info-meaning", text: `${st.meaning}.` }),
        kind && row("kind", `${kind.name}${kind.description ? `: ${kind.description}` : ""}`),
        row("formula", st.formula),
        row("unit", st.unit),
        row("reading", st.reading),
        row("smoothing", st.smoothing),
        row("reference", st.reference),
        noiseNoteNode(s.metric, this.meta),
      ].filter((x) => !!x),
    );
  }

  /**
   * Selects a variable; `scroll` brings its heatmap into view (a click in the table).
   * @param {string} tag
   * @param {boolean} scroll
   */
  selectTag(tag, scroll) {
    const done = this.dispatch({ type: "selectTag", tag });
    if (scroll) this.el.heatmapCard.scrollIntoView({ behavior: "smooth", block: "start" });
    return done;
  }

  // -------------------------------------------------------------------------------------------
  // Views.

  /**
   * Starts a load of one kind of view ("heatmap", "histogram", "curves", "table"); returns a
   * function that tells whether it is still the newest load of that kind, so that a slow answer
   * never replaces what a later load drew.
   * @param {"heatmap" | "histogram" | "curves" | "table" | "examples"} kind
   */
  startLoad(kind) {
    const gen = ++this.generation[kind];
    return () => gen === this.generation[kind];
  }

  /**
   * Loads the view `kind`: `fetch()` gets the data and `show(data)` draws it, unless a newer
   * load of that view started meanwhile. If either fails, `view` says "Could not load `what`:
   * <reason>" (again only for the newest load).
   * @template T
   * @param {"heatmap" | "histogram" | "table" | "examples"} kind
   * @param {{showMessage: (text: string, kind?: string) => void}} view
   * @param {string} what
   * @param {() => Promise<T>} fetch
   * @param {(data: T) => void} show
   */
  async load(kind, view, what, fetch, show) {
    const current = this.startLoad(kind);
    try {
      const data = await fetch();
      if (current()) show(data);
    } catch (e) {
      if (current()) view.showMessage(`Could not load ${what}: ${errorText(e)}`, "error");
    }
  }

  /**
   * One heatmap payload (memoised).
   * @param {string} run @param {string} tag @param {number | null} step @param {string} stat
   */
  heatmapData(run, tag, step, stat) {
    return this.cached(`heatmap|${run}|${tag}|${step}|${stat}`, () =>
      api.fetchHeatmap({ run, tag, step, stat }),
    );
  }

  /**
   * Whether the selected variable was logged without maps (mode "norms" or "replicas"): then
   * `view` says so, with the backend's note, instead of a heatmap or histogram.
   * @param {{showMessage: (text: string, kind?: string) => void}} view
   */
  mapsOff(view) {
    const info = tagInfo(this.state);
    if (info?.maps !== false) return false;
    view.showMessage(info.maps_note ?? "Maps are off for this variable.", "info");
    return true;
  }

  /** The heatmap of the shown statistic, or the comparison's panels. */
  async loadHeatmap() {
    const s = this.state;
    if (this.mapsOff(this.views.heatmap)) {
      this.views.compare.clear();
      return;
    }
    if (s.compare !== "off") return this.loadComparison();
    this.views.compare.clear();
    const { run, tag, stat } = s;
    if (!run || !tag) return;
    const step = currentStep(s);
    const info = tagInfo(s);
    return this.load(
      "heatmap",
      this.views.heatmap,
      `the heatmap of ${tag}`,
      async () => {
        const extraStats = TOOLTIP_STATS.filter(
          (x) => x !== stat && availableStats(info?.orders ?? [1, 2], this.meta).includes(x),
        );
        const [data, ...extras] = await Promise.all([
          this.heatmapData(run, tag, step, stat),
          ...extraStats.map((x) => this.heatmapData(run, tag, step, x).catch(() => null)),
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
          { keepZoom: true },
        ),
    );
  }

  /**
   * The comparison's panels: the variable in each compared run at the current step, or in the
   * active run at two steps, side by side on one colour scale.
   */
  async loadComparison() {
    const s = this.state;
    const { tag, stat } = s;
    if (!s.run || !tag) return;
    const step = currentStep(s);
    const pair = comparedSteps(s);
    /** @type {{run: string, step: number | null, label: string}[]} */
    const panels =
      s.compare === "runs"
        ? comparedRuns(s).map((run) => ({
            run,
            step: nearestStep(stepsOf(s, run, tag), step),
            label: run,
          }))
        : (pair ?? []).map((st) => ({
            run: /** @type {string} */ (s.run),
            step: st,
            label: `step ${st}`,
          }));
    this.views.heatmap.clear();
    return this.load(
      "heatmap",
      this.views.compare,
      `the comparison of ${tag}`,
      () => Promise.all(panels.map((p) => this.heatmapData(p.run, tag, p.step, stat))),
      (datas) =>
        this.views.compare.update({
          panels: panels.map((p, k) => ({ ...p, data: datas[k], color: this.colors.get(p.run) })),
          mode: s.compare,
          stat,
          label: statLabel(stat, this.meta),
          signed: isSigned(stat, this.meta),
          tag,
          colormap: s.colormap,
          scale: s.scale,
          theme: this.theme,
          exportTheme: THEMES.light,
        }),
    );
  }

  /** The histogram of the shown statistic at the current step, or over all steps. */
  async loadHistogram() {
    const s = this.state;
    const { run, tag, stat, histMode } = s;
    if (!run || !tag) return;
    if (this.mapsOff(this.views.histogram)) return;
    const scale = s.histLog ? "log" : "linear";
    const size = (tagInfo(s)?.shape ?? []).reduce((a, b) => a * b, 1);
    const plan = histogramPlan(size);
    /** @param {string} r @param {number | "all" | null} st */
    const get = (r, st) =>
      this.cached(`histogram|${r}|${tag}|${stat}|${st}|${scale}|${plan.bins}`, () =>
        api.fetchHistogram({ run: r, tag, stat, step: st, bins: plan.bins, scale }),
      );
    const step = currentStep(s);
    /** @type {{run: string, step: number | "all" | null, label: string}[]} */
    let overlays = [];
    if (s.compare === "runs")
      overlays = comparedRuns(s).map((r) => ({
        run: r,
        step: nearestStep(stepsOf(s, r, tag), step),
        label: r,
      }));
    else if (s.compare === "steps")
      overlays = (comparedSteps(s) ?? []).map((st) => ({ run, step: st, label: `step ${st}` }));
    const mode = s.compare !== "off" ? "step" : histMode;
    return this.load(
      "histogram",
      this.views.histogram,
      `the histogram of ${tag}`,
      () =>
        overlays.length
          ? Promise.all(overlays.map((o) => get(o.run, o.step)))
          : get(run, histMode === "steps" ? "all" : step).then((d) => [d]),
      (datas) =>
        this.views.histogram.update({
          data: datas[0],
          overlays: overlays.length
            ? overlays.map((o, k) => ({
                ...o,
                data: datas[k],
                color:
                  s.compare === "runs"
                    ? this.colors.get(o.run)
                    : this.meta.run_palette[s.theme === "dark" ? "dark" : "light"][k],
              }))
            : null,
          mode,
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
    const runs = s.runList.filter((r) => s.checked.includes(r));
    // A ratio's parts (the noise scale's tr(Σ) and |G|², each smoothed before dividing) are
    // drawn beside it (/meta ratio_parts).
    const parts = this.meta.ratio_parts?.[s.metric] ?? [];
    /**
     * @param {string} tag @param {(run: string) => boolean} hasTag
     * @param {string} [over] "layer": the layer of variable `tag` (its variables' sums added)
     */
    const fetchAll = async (tag, hasTag, over) => {
      /** @type {any[]} */
      const out = [];
      for (const run of runs) {
        if (!hasTag(run)) continue;
        try {
          const smoothing = s.smoothing;
          const d = await this.cached(`series|${run}|${tag}|${smoothing}|${over ?? ""}`, () =>
            api.fetchSeries({ run, tag, smoothing: smoothing > 0 ? smoothing : undefined, over }),
          );
          /** @param {string} m */
          const pick = (m) => ({
            run,
            color: this.colors.get(run),
            steps: d.steps,
            wall_times: d.wall_times,
            values: d.values[m] ?? [],
            smoothed: d.smoothed?.[m] ?? null,
            se: d.smoothed_se?.[m] ?? null,
          });
          out.push({
            ...pick(s.metric),
            loss: pick("loss"),
            parts: Object.fromEntries(parts.map((/** @type {string} */ m) => [m, pick(m)])),
            layer: d.layer,
            variables: d.variables,
          });
        } catch (e) {
          out.push({
            run,
            color: this.colors.get(run),
            steps: [],
            values: [],
            error: errorText(e),
          });
        }
      }
      return out;
    };
    const tag = /** @type {string} */ (s.tag);
    const layerName = tagInfo(s)?.layer;
    const [layer, model, layerTotal] = await Promise.all([
      fetchAll(tag, (r) => !!s.runs[r]?.[tag]),
      fetchAll(modelTag(s.group), (r) => !!s.groups[r]?.[s.group]),
      layerName ? fetchAll(tag, (r) => !!s.runs[r]?.[tag], "layer") : Promise.resolve([]),
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
    /**
     * The panels of the ratio's parts for these series (none unless the metric is a ratio).
     * @param {any[]} ok @param {string} label @param {string} partTag
     */
    const partModels = (ok, label, partTag) =>
      parts.map((/** @type {string} */ m) => ({
        ...common,
        metric: m,
        logy: false,
        statistic: seriesInfo(m, this.meta),
        title: seriesTitle(m, this.meta),
        axisLabel: axisLabel(m, this.meta),
        positiveOnly: isPositiveOnly(m, this.meta),
        label,
        tag: partTag,
        series: ok.map((x) => x.parts[m]),
      }));
    this.views.layerCurves.update({
      ...common,
      label: tag,
      tag,
      series: layer.filter((x) => !x.error),
    });
    const layerOk = layerTotal.filter((x) => !x.error);
    if (layerOk.length) {
      const n = layerOk[0].variables?.length ?? 0;
      const label = `layer ${layerOk[0].layer} (${n} variable${n === 1 ? "" : "s"} summed)`;
      this.views.layerTotalCurves.update({
        ...common,
        label,
        tag: `layer:${layerOk[0].layer}`,
        series: layerOk,
        parts: partModels(layerOk, label, `layer:${layerOk[0].layer}`),
      });
    } else this.views.layerTotalCurves.clear();
    if (model.some((x) => !x.error)) {
      const ok = model.filter((x) => !x.error);
      const label = grouped(s) ? `whole model ${groupLabel(s.group)}` : "whole model";
      this.views.modelCurves.update({
        ...common,
        label,
        tag: modelTag(s.group),
        series: ok,
        parts: partModels(ok, label, modelTag(s.group)),
      });
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
          label: grouped(s) ? `${groupLabel(s.group)}, as logged` : "as logged",
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
    const failed = [...layer, ...model, ...layerTotal].filter((x) => x.error);
    if (failed.length)
      this.setStatus(
        `Some curves could not be loaded: ${failed.map((x) => `${x.run}: ${x.error}`).join("; ")}`,
        "error",
      );
  }

  /** The per-example section's controls: its run, its per-example tag (group), its column. */
  renderExamplesControls() {
    const s = this.state;
    const run = exampleRun(s);
    const tag = exampleTag(s);
    const info = (run && tag && s.examples[run]?.[tag]) || {};
    /** @param {string} label @param {HTMLElement} control */
    const field = (label, control) =>
      h("label", { class: "field" }, [h("span", { text: label }), control]);
    /** @param {"exRun" | "exTag" | "exColumn"} key @param {string} v */
    const set = (key, v) => this.dispatch({ type: "setExamples", key, value: v });
    const tags = Object.keys((run && s.examples[run]) || {}).sort();
    const columns = info.columns ?? ["model"];
    this.el.exControls.replaceChildren(
      field(
        "Run",
        select(exampleRuns(s), run ?? "", (v) => set("exRun", v), {
          class: "ex-run",
          "aria-label": "run of the per-example norms",
        }),
      ),
      ...(tags.length > 1
        ? [
            field(
              "Group",
              select(
                tags.map((t) => ({
                  value: t,
                  label: s.examples[run ?? ""]?.[t]?.group || "(default)",
                })),
                tag ?? "",
                (v) => set("exTag", v),
                { class: "ex-tag", "aria-label": "per-example tag" },
              ),
            ),
          ]
        : []),
      field(
        "Norm of",
        select(
          columns.map((c) => ({ value: c, label: c === "model" ? "whole model" : c })),
          exampleColumn(s),
          (v) => set("exColumn", v),
          { class: "ex-column", "aria-label": "whole model, layer or variable" },
        ),
      ),
    );
  }

  /** The per-example section: hidden without per-example norms, else its four parts. */
  async loadExamples() {
    const s = this.state;
    const run = exampleRun(s);
    const tag = exampleTag(s);
    this.el.exCard.hidden = !run || !tag;
    if (!run || !tag) return;
    this.renderExamplesControls();
    const column = exampleColumn(s);
    const { exStep: step, exThreshold: threshold, clipNorm } = s;
    const key = `${run}|${tag}|${column}`;
    return this.load(
      "examples",
      this.views.examples,
      `the per-example norms of run ${run}`,
      async () => {
        const quantiles = await this.cached(`exq|${key}`, () =>
          api.fetchExampleQuantiles({ run, tag, column }),
        );
        const steps = quantiles.steps ?? [];
        const at = step !== null && steps.includes(step) ? step : null;
        const [histogram, outliers, clip] = await Promise.all([
          this.cached(`exh|${key}|${at}`, () =>
            api.fetchExampleHistogram({ run, tag, column, step: at }),
          ),
          this.cached(`exo|${key}|${threshold}`, () =>
            api.fetchExampleOutliers({ run, tag, column, threshold }),
          ),
          clipNorm === null
            ? null
            : this.cached(`exc|${key}|${clipNorm}`, () =>
                api.fetchExampleClip({ run, tag, column, clipNorm }),
              ),
        ]);
        return { quantiles, histogram, outliers, clip, step: at };
      },
      (d) =>
        this.views.examples.update({
          ...d,
          run,
          tag,
          column,
          clipNorm,
          threshold,
          view: this.exView,
          theme: this.theme,
          exportTheme: THEMES.light,
        }),
    );
  }

  /** The summary table of the run (of the shown group) at the model step nearest the current. */
  async loadTable() {
    const s = this.state;
    const run = /** @type {string} */ (s.run);
    const groupInfo = s.groups[run]?.[s.group];
    const group = groupInfo ? s.group : undefined;
    const modelSteps = groupInfo?.steps ?? steps(s);
    const step = nearestStep(
      [...modelSteps].sort((a, b) => a - b),
      currentStep(s),
    );
    const smoothing = s.smoothing;
    return this.load(
      "table",
      this.views.table,
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
              rows: d.rows.map((/** @type {any} */ r) => tableRow(r, this.meta)),
              model: d.model && tableRow(d.model, this.meta),
            })),
        ),
      (d) => {
        const { tags } = filterTags(
          d.rows.map((/** @type {any} */ r) => r.tag),
          s.filter,
        );
        const keep = new Set(tags);
        const rows = d.rows.filter((/** @type {any} */ r) => keep.has(r.tag));
        if (!s.landed) {
          // Land on the noisiest variable (largest total variance: /meta's landing.sort), once
          // per run switch; the table is drawn by the render pass that follows.
          const best = argmaxRow(rows, this.meta.landing.sort);
          this.dispatch({ type: "land", tag: best >= 0 ? rows[best].tag : null });
          return;
        }
        this.views.table.update({
          rows,
          model: d.model,
          run,
          step,
          selected: s.tag,
          theme: this.theme,
          exportTheme: THEMES.light,
          group: grouped(s) ? groupLabel(s.group) : null,
          statistics: this.meta.statistics,
          smoothing,
          positiveOnly: this.meta.positive_only,
        });
      },
    );
  }
}

/**
 * The steps of `tag` in `run`, ascending.
 * @param {State} s @param {string} run @param {string} tag
 */
function stepsOf(s, run, tag) {
  return [...(s.runs[run]?.[tag]?.steps ?? [])].sort((a, b) => a - b);
}

/** @param {unknown} e */
function errorText(e) {
  return e instanceof Error ? e.message : String(e);
}
