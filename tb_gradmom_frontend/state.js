// @ts-check
// The tab's state in one place: an initial state, `update(state, action)` returning the next
// state (pure: no DOM, no fetch, the argument never mutated), the selectors every view reads,
// and the URL round trip of the selection (`toURLParams` / `fromURLParams`). index.js holds
// the one current state, sends every change through `update` and redraws what `viewKeys` says
// changed. Node-tested in tests/js/state.test.mjs.

import { availableStats, defaultView, filterTags, groupsOf, nearestStep } from "./core.js";

/**
 * @typedef {{shape?: number[], op?: string, pooled?: boolean, orders?: number[],
 *   steps?: number[], group?: string, layer?: string, maps?: boolean, source?: string,
 *   maps_note?: string}} TagInfo
 * @typedef {{steps?: number[]}} GroupInfo
 * @typedef {{runs: Record<string, Record<string, TagInfo>>, model: Record<string, any>,
 *   groups: Record<string, Record<string, GroupInfo>>}} TagsData
 * @typedef {"off" | "runs" | "steps"} CompareMode
 * @typedef {"step" | "steps"} HistMode
 * @typedef {{landing: {stat: string, curve: string, sort: string}, default_smoothing: number,
 *   element_statistics: {key: string, signed?: boolean, default_scale?: string}[]} & Record<string, any>} Meta
 */

/**
 * @typedef {object} State
 * @property {Record<string, Record<string, TagInfo>>} runs /tags' runs: run -> tag -> info
 * @property {Record<string, any>} model /tags' model
 * @property {Record<string, Record<string, GroupInfo>>} groups /tags' groups: run -> group
 * @property {string[]} runList every run, sorted
 * @property {number} loaded how many times /tags was loaded (every view redraws after one)
 * @property {string[]} checked the runs shown (the sidebar's checked runs), sorted
 * @property {string[] | null} known the runs seen so far (null before the first /tags)
 * @property {string | null} run the active run: the table, heatmap and histograms show it
 * @property {string} group the shown group (one per summary.moments call; "" unnamed)
 * @property {string | null} tag the selected variable
 * @property {string} filter the variables' regular expression filter
 * @property {string} stat the element-wise statistic of the heatmap and histograms
 * @property {string} colormap the heatmap's colour map
 * @property {string} scale the heatmap's colour scale, "linear" or "log"
 * @property {boolean} histLog log x on the histograms
 * @property {number | null} step the step wanted (null: the latest)
 * @property {boolean} follow follow the latest step on reload
 * @property {HistMode} histMode one step, or all steps offset
 * @property {string} metric the quantity of the curves
 * @property {boolean} logy log y on the curves
 * @property {number} smoothing the curves' and table's EMA decay, 0 to 0.99
 * @property {boolean} landed whether the noisiest variable was selected since the last run switch
 * @property {string} theme "light" or "dark"
 * @property {boolean} info whether the curves' "What is this?" panel is open
 * @property {CompareMode} compare the comparison: off, the shown runs side by side, two steps
 * @property {number | null} compareStep the other step of a two-step comparison (null: the first)
 * @property {string} notice a short message for the status line ("" none)
 * @property {Record<string, Record<string, ExamplesInfo>>} examples /examples/tags' runs: run ->
 *   per-example tag -> info (runs with per-example norms, also those without moments)
 * @property {string | null} exRun the per-example section's run (null: the active run if it has
 *   per-example norms, else the first run that has)
 * @property {string | null} exTag its per-example tag (null: the run's first)
 * @property {string} exColumn its column: "model", a layer or a variable
 * @property {number | null} exStep the step of its histogram (null: the latest)
 * @property {number | null} exThreshold its outlier threshold (null: the backend's default)
 * @property {number | null} clipNorm the clipping norm C of its clipped-fraction curve (null: none)
 */

/**
 * @typedef {{group?: string, columns?: string[], layers?: string[], variables?: string[],
 *   ids?: string, max_examples?: number, max_step?: number}} ExamplesInfo
 * @typedef {"exRun" | "exTag" | "exColumn" | "exStep" | "exThreshold" | "clipNorm"} ExamplesKey
 */

/**
 * @typedef {{type: "tags", data: TagsData}
 *   | {type: "setRun", run: string}
 *   | {type: "toggleRun", run: string, checked: boolean}
 *   | {type: "selectGroup", group: string}
 *   | {type: "selectTag", tag: string}
 *   | {type: "land", tag: string | null}
 *   | {type: "setFilter", filter: string}
 *   | {type: "setStat", stat: string}
 *   | {type: "set", key: OptionKey, value: any}
 *   | {type: "setStep", step: number, last: boolean}
 *   | {type: "setFollow", follow: boolean}
 *   | {type: "setTheme", theme: string}
 *   | {type: "setCompare", compare: CompareMode}
 *   | {type: "setCompareStep", step: number | null}
 *   | {type: "examples", runs: Record<string, Record<string, ExamplesInfo>>}
 *   | {type: "setExamples", key: ExamplesKey, value: any}} Action
 * @typedef {"colormap" | "scale" | "histLog" | "histMode" | "metric" | "logy" | "smoothing" | "info"} OptionKey
 */

/** The options a "set" action may change, each with the check of its value. */
const OPTIONS = /** @type {Record<OptionKey, (v: any) => boolean>} */ ({
  colormap: (v) => typeof v === "string" && v.length > 0,
  scale: (v) => v === "linear" || v === "log",
  histLog: (v) => typeof v === "boolean",
  histMode: (v) => v === "step" || v === "steps",
  metric: (v) => typeof v === "string" && v.length > 0,
  logy: (v) => typeof v === "boolean",
  smoothing: (v) => typeof v === "number" && v >= 0 && v <= 0.99,
  info: (v) => typeof v === "boolean",
});

export const COMPARE_MODES = /** @type {readonly CompareMode[]} */ (
  Object.freeze(["off", "runs", "steps"])
);

/**
 * The state the tab opens with: `meta`'s landing statistic and curve in their default views,
 * then whatever `params` (fromURLParams of the page's URL) restores.
 * @param {Meta} meta
 * @param {string} theme
 * @param {Partial<State>} [params]
 * @returns {State}
 */
export function initialState(meta, theme, params = {}) {
  const landing = meta.landing;
  const stat = params.stat ?? landing.stat;
  /** @type {State} */
  const state = {
    runs: {},
    model: {},
    groups: {},
    runList: [],
    loaded: 0,
    checked: [],
    known: null,
    run: null,
    group: "",
    tag: null,
    filter: "",
    stat,
    ...defaultView(stat, meta),
    step: null,
    follow: true,
    histMode: "step",
    metric: landing.curve,
    logy: false,
    smoothing: meta.default_smoothing,
    landed: false,
    theme,
    info: false,
    compare: "off",
    compareStep: null,
    notice: "",
    examples: {},
    exRun: null,
    exTag: null,
    exColumn: "model",
    exStep: null,
    exThreshold: null,
    clipNorm: null,
  };
  const restored = { ...state, ...params };
  // A view restored with a variable keeps it: no landing on the noisiest one.
  restored.landed = params.tag != null;
  restored.follow = params.step == null;
  return restored;
}

// ---------------------------------------------------------------------------------------------
// Selectors.

/** @param {State} s @param {string} run */
const hasTags = (s, run) => Object.keys(s.runs[run] ?? {}).length > 0;

/** The checked runs that have variables: those the toolbar's Run offers. @param {State} s */
export function activeRuns(s) {
  return s.runList.filter((r) => s.checked.includes(r) && hasTags(s, r));
}

/** The groups with a whole-model tag in the shown runs. @param {State} s */
export function groupList(s) {
  return groupsOf(
    s.groups,
    s.runList.filter((r) => s.checked.includes(r) || r === s.run),
  );
}

/** Whether the tab shows one group at a time (more than one whole-model tag is shown). @param {State} s */
export function grouped(s) {
  return groupList(s).length > 1;
}

/**
 * The variables of a run, only the chosen group's when the tab shows groups.
 * @param {State} s
 * @param {string | null} run
 */
export function tagsOf(s, run) {
  const info = (run && s.runs[run]) || {};
  const g = grouped(s);
  return Object.keys(info)
    .filter((t) => !g || (info[t].group ?? "") === s.group)
    .sort();
}

/** The selected variable's info in the active run, or null. @param {State} s */
export function tagInfo(s) {
  return (s.run && s.tag && s.runs[s.run]?.[s.tag]) || null;
}

/** The steps of the selected variable in the active run, ascending. @param {State} s */
export function steps(s) {
  return [...(tagInfo(s)?.steps ?? [])].sort((a, b) => a - b);
}

/** The step the heatmap and histogram show (the latest when following). @param {State} s */
export function currentStep(s) {
  return nearestStep(steps(s), s.follow ? null : s.step);
}

/**
 * The runs a run comparison shows, one panel (or one overlaid histogram) each: the active run
 * first, then the other checked runs that have the selected variable.
 * @param {State} s
 */
export function comparedRuns(s) {
  if (!s.run) return [];
  const others = activeRuns(s).filter((r) => r !== s.run && s.tag && s.runs[r]?.[s.tag]);
  return [s.run, ...others];
}

/**
 * The two steps a step comparison shows, earlier first: the chosen other step (the first
 * step when none is chosen) and the current step. Null without steps.
 * @param {State} s
 * @returns {[number, number] | null}
 */
export function comparedSteps(s) {
  const all = steps(s);
  const cur = currentStep(s);
  if (cur === null || !all.length) return null;
  const other = nearestStep(all, s.compareStep ?? all[0]) ?? all[0];
  return other <= cur ? [other, cur] : [cur, other];
}

/**
 * What each part of the page shows, as a key: a part is redrawn when its key changes (the
 * one render pass of index.js compares them). The data parts include `loaded`, so a reload
 * redraws them with the new data.
 * @param {State} s
 */
export function viewKeys(s) {
  const step = currentStep(s);
  const k = (/** @type {any[]} */ ...parts) => JSON.stringify(parts);
  const compare =
    s.compare === "runs" ? comparedRuns(s) : s.compare === "steps" ? comparedSteps(s) : null;
  return {
    runs: k(s.runList, s.checked, s.run, s.theme),
    tags: k(s.loaded, s.run, s.group, s.tag, s.filter, grouped(s)),
    toolbar: k(
      s.loaded,
      activeRuns(s),
      s.run,
      s.group,
      s.tag,
      s.stat,
      s.colormap,
      s.scale,
      step,
      s.follow,
      s.histMode,
      s.histLog,
      s.metric,
      s.logy,
      s.smoothing,
      s.info,
      s.compare,
      s.compareStep,
      groupList(s),
    ),
    info: k(s.metric, s.info),
    heatmap: k(
      s.loaded,
      s.run,
      s.tag,
      s.stat,
      step,
      s.colormap,
      s.scale,
      s.theme,
      s.compare,
      compare,
    ),
    histogram: k(
      s.loaded,
      s.run,
      s.tag,
      s.stat,
      step,
      s.histMode,
      s.histLog,
      s.theme,
      s.compare,
      compare,
      s.checked,
    ),
    curves: k(s.loaded, s.checked, s.tag, s.group, s.metric, s.logy, s.smoothing, s.theme),
    table: k(s.loaded, s.run, s.group, step, s.smoothing, s.filter, s.tag, s.theme, s.landed),
    examples: k(
      s.loaded,
      s.examples,
      exampleRun(s),
      exampleTag(s),
      exampleColumn(s),
      s.exStep,
      s.exThreshold,
      s.clipNorm,
      s.theme,
    ),
  };
}

/** The runs with per-example norms, sorted. @param {State} s */
export function exampleRuns(s) {
  return Object.keys(s.examples)
    .filter((r) => Object.keys(s.examples[r] ?? {}).length)
    .sort();
}

/**
 * The run the per-example section shows: its own choice if that run has per-example norms,
 * else the active run if it has, else the first run that has (null: none has).
 * @param {State} s
 */
export function exampleRun(s) {
  const runs = exampleRuns(s);
  if (s.exRun && runs.includes(s.exRun)) return s.exRun;
  if (s.run && runs.includes(s.run)) return s.run;
  return runs[0] ?? null;
}

/** The per-example tag the section shows (null: none). @param {State} s */
export function exampleTag(s) {
  const run = exampleRun(s);
  const tags = Object.keys((run && s.examples[run]) || {}).sort();
  return s.exTag && tags.includes(s.exTag) ? s.exTag : (tags[0] ?? null);
}

/** The column the section shows: its choice if the tag has it, else "model". @param {State} s */
export function exampleColumn(s) {
  const run = exampleRun(s);
  const tag = exampleTag(s);
  const cols = (run && tag && s.examples[run]?.[tag]?.columns) || ["model"];
  return cols.includes(s.exColumn) ? s.exColumn : "model";
}

/** The checks of the per-example section's settings. */
const EXAMPLE_OPTIONS = /** @type {Record<ExamplesKey, (v: any) => boolean>} */ ({
  exRun: (v) => v === null || typeof v === "string",
  exTag: (v) => v === null || typeof v === "string",
  exColumn: (v) => typeof v === "string" && v.length > 0,
  exStep: (v) => v === null || Number.isInteger(v),
  exThreshold: (v) => v === null || (typeof v === "number" && Number.isFinite(v) && v >= 1),
  clipNorm: (v) => v === null || (typeof v === "number" && Number.isFinite(v) && v > 0),
});

// ---------------------------------------------------------------------------------------------
// Transitions.

/**
 * Keeps the chosen group one the active run has (else its first), or, for a run without
 * whole-model tags, one of the shown runs' groups.
 * @param {State} s a fresh copy, changed in place
 */
function ensureGroup(s) {
  const own = groupsOf(s.groups, s.run ? [s.run] : []);
  const groups = own.length ? own : groupList(s);
  if (groups.length && !groups.includes(s.group)) s.group = groups[0];
}

/**
 * Keeps the selected variable one of the active run (the first the filter shows, else its
 * first) and the statistic one the variable has (the landing statistic if it has it, else its
 * first, in that statistic's default view).
 * @param {State} s a fresh copy, changed in place
 * @param {Meta} meta
 */
function ensureTag(s, meta) {
  const tags = tagsOf(s, s.run);
  if (!s.tag || !tags.includes(s.tag)) {
    const { tags: shown } = filterTags(tags, s.filter);
    s.tag = shown[0] ?? tags[0] ?? null;
  }
  const info = tagInfo(s);
  if (info) {
    const stats = availableStats(info.orders ?? [1, 2], meta);
    if (!stats.includes(s.stat)) {
      s.stat = stats.includes(meta.landing.stat) ? meta.landing.stat : stats[0];
      Object.assign(s, defaultView(s.stat, meta));
    }
  }
}

/** @param {string[]} list @param {string} item */
const withItem = (list, item) => (list.includes(item) ? list : [...list, item].sort());

/**
 * The next state after `action`; `state` is left as it was. An action that does not apply
 * (an unknown run, a value out of range) returns the state unchanged, or with a `notice`.
 * @param {State} state
 * @param {Action} action
 * @param {Meta} meta
 * @returns {State}
 */
export function update(state, action, meta) {
  /** @type {State} */
  const s = { ...state, notice: "" };
  switch (action.type) {
    case "tags": {
      const { runs, model, groups } = action.data;
      s.runs = runs;
      s.model = model;
      s.groups = groups;
      s.runList = [...new Set([...Object.keys(runs), ...Object.keys(model)])].sort();
      s.loaded = state.loaded + 1;
      if (s.known === null) {
        // First load: the runs a restored view named (those that exist), else every run.
        const wanted = s.checked.filter((r) => s.runList.includes(r));
        s.checked = wanted.length ? wanted : [...s.runList];
      } else {
        const known = s.known;
        s.checked = [...new Set([...s.checked, ...s.runList.filter((r) => !known.includes(r))])];
        s.checked = s.checked.filter((r) => s.runList.includes(r)).sort();
      }
      s.known = [...s.runList];
      const withTags = s.runList.filter((r) => hasTags(s, r));
      if (!withTags.length) return s;
      if (!activeRuns(s).length) s.checked = withItem(s.checked, withTags[0]);
      if (!s.run || !activeRuns(s).includes(s.run)) {
        // A restored run that exists is checked and kept; else the first shown run.
        if (s.run && hasTags(s, s.run) && state.loaded === 0)
          s.checked = withItem(s.checked, s.run);
        else {
          s.run = activeRuns(s)[0];
          s.landed = false;
        }
      }
      ensureGroup(s);
      ensureTag(s, meta);
      // A restored variable that does not exist: land on the noisiest one instead.
      if (state.loaded === 0 && s.tag !== state.tag) s.landed = false;
      if (s.follow) s.step = null;
      return s;
    }
    case "setRun": {
      if (!hasTags(s, action.run)) return state;
      s.run = action.run;
      s.checked = withItem(s.checked, action.run);
      s.landed = false; // the noisiest variable of this run, once its table is in
      ensureGroup(s);
      ensureTag(s, meta);
      return s;
    }
    case "toggleRun": {
      const { run, checked } = action;
      if (!s.runList.includes(run)) return state;
      if (checked) s.checked = withItem(s.checked, run);
      else {
        const others = activeRuns(s).filter((r) => r !== run);
        if (run === s.run && !others.length) {
          return { ...s, notice: "At least one run stays shown: check another run first." };
        }
        s.checked = s.checked.filter((r) => r !== run);
        if (run === s.run) {
          s.run = others[0];
          s.landed = false;
        }
      }
      const wasGrouped = grouped(state);
      ensureGroup(s);
      if (s.group !== state.group || wasGrouped !== grouped(s) || s.run !== state.run) {
        s.landed = false;
        ensureTag(s, meta);
      }
      return s;
    }
    case "selectGroup": {
      s.group = action.group;
      if (!s.run || !s.groups[s.run]?.[action.group]) {
        // Another run has this group: show that run's variables and table.
        const other = s.runList.find((r) => s.groups[r]?.[action.group] && hasTags(s, r));
        if (other) {
          s.run = other;
          s.checked = withItem(s.checked, other);
        }
      }
      s.landed = false;
      ensureTag(s, meta);
      return s;
    }
    case "selectTag":
    case "land": {
      if (action.type === "land") s.landed = true;
      if (action.tag !== null && tagsOf(s, s.run).includes(action.tag)) s.tag = action.tag;
      ensureTag(s, meta);
      return s;
    }
    case "setFilter":
      s.filter = action.filter;
      return s;
    case "setStat": {
      const info = tagInfo(s);
      if (info && !availableStats(info.orders ?? [1, 2], meta).includes(action.stat)) return state;
      s.stat = action.stat;
      Object.assign(s, defaultView(action.stat, meta));
      return s;
    }
    case "set": {
      const check = OPTIONS[action.key];
      if (!check || !check(action.value)) return state;
      return { ...s, [action.key]: action.value };
    }
    case "setStep": {
      s.step = action.step;
      s.follow = action.last && state.follow;
      return s;
    }
    case "setFollow":
      s.follow = action.follow;
      if (s.follow) s.step = null;
      return s;
    case "setTheme":
      s.theme = action.theme === "dark" ? "dark" : "light";
      return s;
    case "setCompare":
      if (!COMPARE_MODES.includes(action.compare)) return state;
      s.compare = action.compare;
      return s;
    case "setCompareStep":
      s.compareStep = action.step;
      return s;
    case "examples":
      s.examples = action.runs ?? {};
      return s;
    case "setExamples": {
      const check = EXAMPLE_OPTIONS[action.key];
      if (!check || !check(action.value)) return state;
      /** @type {Record<string, any>} */ (s)[action.key] = action.value;
      // another run or tag: its latest step
      if (action.key === "exRun" || action.key === "exTag") s.exStep = null;
      return s;
    }
    default:
      return state;
  }
}

// ---------------------------------------------------------------------------------------------
// The selection in the URL.

/** The URL keys of the selection, and the state fields they hold. */
const URL_KEYS = /** @type {const} */ ({
  run: "run",
  runs: "checked",
  group: "group",
  tag: "tag",
  filter: "filter",
  stat: "stat",
  cmap: "colormap",
  scale: "scale",
  hist: "histMode",
  histlog: "histLog",
  step: "step",
  metric: "metric",
  logy: "logy",
  smoothing: "smoothing",
  compare: "compare",
  vs: "compareStep",
  exrun: "exRun",
  extag: "exTag",
  excol: "exColumn",
  exstep: "exStep",
  exthr: "exThreshold",
  clip: "clipNorm",
});

/**
 * The selection as URL parameters (strings; what a shared link or a reload restores): the
 * run, the shown runs, the group, variable, statistic and its view, the step (only when not
 * following the latest), the curves' quantity and smoothing, and the comparison (its other
 * step only in a step comparison).
 * @param {State} s
 * @returns {Record<string, string>}
 */
export function toURLParams(s) {
  /** @type {Record<string, string>} */
  const out = {};
  for (const [key, field] of Object.entries(URL_KEYS)) {
    let v = /** @type {any} */ (s)[field];
    if (field === "step" && s.follow) continue;
    if (field === "compareStep" && s.compare !== "steps") continue;
    if (field === "exColumn" && v === "model") continue;
    if (v === null || v === undefined) continue;
    if (field === "checked") v = JSON.stringify(v);
    out[key] = String(v);
  }
  return out;
}

/**
 * The selection a URL's parameters restore (`params`: what toURLParams wrote, as strings);
 * malformed values are left out. Checked against the runs and variables once they are loaded
 * (the "tags" action).
 * @param {Record<string, string>} params
 * @returns {Partial<State>}
 */
export function fromURLParams(params) {
  /** @type {Record<string, any>} */
  const out = {};
  const get = (/** @type {string} */ k) =>
    Object.prototype.hasOwnProperty.call(params, k) ? String(params[k]) : null;
  for (const k of ["run", "group", "tag", "filter", "stat", "metric"]) {
    const v = get(k);
    if (v !== null && (v !== "" || k === "group" || k === "filter")) out[URL_KEYS[k]] = v;
  }
  const cmap = get("cmap");
  if (cmap) out.colormap = cmap;
  const scale = get("scale");
  if (scale === "linear" || scale === "log") out.scale = scale;
  const hist = get("hist");
  if (hist === "step" || hist === "steps") out.histMode = hist;
  for (const [k, field] of [
    ["histlog", "histLog"],
    ["logy", "logy"],
  ]) {
    const v = get(k);
    if (v === "true" || v === "false") out[field] = v === "true";
  }
  const int = (/** @type {string | null} */ v) =>
    v !== null && /^-?\d+$/.test(v) ? Number(v) : null;
  const step = int(get("step"));
  if (step !== null) out.step = step;
  const vs = int(get("vs"));
  if (vs !== null) out.compareStep = vs;
  for (const k of ["exrun", "extag", "excol"]) {
    const v = get(k);
    if (v) out[URL_KEYS[k]] = v;
  }
  const exStep = int(get("exstep"));
  if (exStep !== null) out.exStep = exStep;
  /** @type {[string, string, number][]} */
  const positive = [
    ["exthr", "exThreshold", 1],
    ["clip", "clipNorm", 0],
  ];
  for (const [k, field, lo] of positive) {
    const raw = get(k);
    const v = Number(raw ?? NaN);
    if (raw !== null && raw !== "" && Number.isFinite(v) && v >= lo && v > 0) out[field] = v;
  }
  const smoothing = Number(get("smoothing") ?? NaN);
  if (get("smoothing") !== null && smoothing >= 0 && smoothing <= 0.99) out.smoothing = smoothing;
  const compare = get("compare");
  if (compare && COMPARE_MODES.includes(/** @type {CompareMode} */ (compare)))
    out.compare = compare;
  const runs = get("runs");
  if (runs) {
    try {
      const list = JSON.parse(runs);
      if (Array.isArray(list) && list.every((r) => typeof r === "string"))
        out.checked = [...new Set(list)].sort();
    } catch {
      // A malformed list: every run is shown.
    }
  }
  return out;
}

/**
 * The tab's URL hash ("#run=...&tag=..."), URLSearchParams-encoded.
 * @param {Record<string, string>} params
 */
export function toHash(params) {
  const q = new URLSearchParams(params).toString();
  return q ? `#${q}` : "";
}

/**
 * The parameters of a hash written by toHash.
 * @param {string} hash
 * @returns {Record<string, string>}
 */
export function fromHash(hash) {
  return Object.fromEntries(new URLSearchParams(hash.replace(/^#/, "")));
}

/**
 * The plugin's parameters in TensorBoard's URL hash (the `p.<plugin>.` pairs hostHash writes),
 * read as TensorBoard reads its hash: split on "&", then on "=", each part URI-decoded.
 * @param {string} hash
 * @param {string} plugin
 * @returns {Record<string, string>}
 */
export function fromHostHash(hash, plugin) {
  const prefix = `p.${plugin}.`;
  /** @type {Record<string, string>} */
  const out = {};
  for (const part of hash.replace(/^#/, "").split("&")) {
    const kv = part.split("=");
    if (kv.length !== 2) continue;
    try {
      const [k, v] = kv.map(decodeURIComponent);
      if (k.startsWith(prefix)) out[k.slice(prefix.length)] = v;
    } catch {
      // A malformed escape: not ours.
    }
  }
  return out;
}

/**
 * TensorBoard's URL hash with the plugin's parameters set: TensorBoard keeps a plugin's data
 * in its hash as `p.<plugin>.<key>=<value>` pairs joined by "&" (the first part, without
 * "=", names the active dashboard) and hands them to the plugin frame (plugin_lib's
 * `getURLPluginData`). Other pairs are kept; the plugin's old ones are replaced. Null when the
 * hash names another dashboard (TensorBoard keeps a plugin's frame while another tab shows):
 * that URL is not the plugin's to write.
 * @param {string} hash TensorBoard's current hash ("#gradmom&..." or "")
 * @param {string} plugin
 * @param {Record<string, string>} params
 * @returns {string | null}
 */
export function hostHash(hash, plugin, params) {
  const prefix = `p.${plugin}.`;
  const tab = hash.replace(/^#/, "").split("&")[0];
  if (tab && !tab.includes("=") && tab !== plugin) return null;
  const parts = hash
    .replace(/^#/, "")
    .split("&")
    .filter((p) => p && !decodeURIComponent(p.split("=")[0]).startsWith(prefix));
  for (const [k, v] of Object.entries(params))
    parts.push(`${encodeURIComponent(prefix + k)}=${encodeURIComponent(v)}`);
  return parts.length ? `#${parts.join("&")}` : "";
}
