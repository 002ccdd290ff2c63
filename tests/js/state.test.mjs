// The tab's state module: pure transitions (the argument never changes), the selectors, and
// the URL round trip. Run from the repository root:
//   node --test tests/js/
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  activeRuns,
  comparedRuns,
  comparedSteps,
  currentStep,
  fromHash,
  fromHostHash,
  fromURLParams,
  hostHash,
  initialState,
  tagsOf,
  toHash,
  toURLParams,
  update,
  viewKeys,
} from "../../tb_gradmom_frontend/state.js";

const META = JSON.parse(readFileSync(new URL("./meta.json", import.meta.url), "utf-8"));

const info = (steps, orders = [1, 2], group = "") => ({ shape: [4], orders, steps, group });
const TAGS = {
  runs: {
    alpha: { "a/kernel": info([0, 10, 20]), "b/bias": info([0, 10, 20]) },
    beta: { "a/kernel": info([0, 10, 20, 30]), "c/kernel": info([0, 30]) },
    empty: {},
  },
  model: { alpha: { steps: [0, 10, 20] }, beta: { steps: [0, 10, 20, 30] } },
  groups: { alpha: { "": { steps: [0, 10, 20] } }, beta: { "": { steps: [0, 10, 20, 30] } } },
};

/** The state after start-up (optionally restored from `params`) and the first /tags. */
function loaded(params = {}) {
  return update(initialState(META, "light", params), { type: "tags", data: TAGS }, META);
}

/** A deep copy to compare with after an update: the update must leave its argument as it was. */
const snapshot = (s) => structuredClone(s);

test("initial state: /meta's landing statistic and curve, in their default views", () => {
  const s = initialState(META, "dark");
  assert.equal(s.stat, META.landing.stat);
  assert.equal(s.metric, META.landing.curve);
  assert.equal(s.smoothing, META.default_smoothing);
  assert.equal(s.scale, "log");
  assert.equal(s.histLog, true);
  assert.equal(s.theme, "dark");
  assert.equal(s.compare, "off");
  assert.equal(s.landed, false);
  assert.equal(s.follow, true);
});

test("the first /tags shows every run, the first run with variables, its first variable", () => {
  const before = initialState(META, "light");
  const copy = snapshot(before);
  const s = update(before, { type: "tags", data: TAGS }, META);
  assert.deepEqual(before, copy);
  assert.deepEqual(s.runList, ["alpha", "beta", "empty"]);
  assert.deepEqual(s.checked, ["alpha", "beta", "empty"]);
  assert.deepEqual(activeRuns(s), ["alpha", "beta"]);
  assert.equal(s.run, "alpha");
  assert.equal(s.tag, "a/kernel");
  assert.equal(s.loaded, 1);
  assert.equal(currentStep(s), 20);
});

test("every transition is pure: the state given is never changed", () => {
  const s = loaded();
  const actions = [
    { type: "setRun", run: "beta" },
    { type: "toggleRun", run: "beta", checked: false },
    { type: "toggleRun", run: "alpha", checked: false },
    { type: "selectTag", tag: "b/bias" },
    { type: "land", tag: "b/bias" },
    { type: "setFilter", filter: "bias" },
    { type: "setStat", stat: "mean" },
    { type: "set", key: "smoothing", value: 0.5 },
    { type: "setStep", step: 10, last: false },
    { type: "setFollow", follow: true },
    { type: "setTheme", theme: "dark" },
    { type: "setCompare", compare: "runs" },
    { type: "setCompareStep", step: 0 },
    { type: "tags", data: TAGS },
  ];
  for (const action of actions) {
    const copy = snapshot(s);
    const next = update(s, action, META);
    assert.deepEqual(s, copy, `${action.type} changed its argument`);
    assert.notEqual(next, s, `${action.type} returned its argument`);
  }
});

test("a run switch checks the run, keeps a variable it has and lands again", () => {
  const s = update(
    update(loaded(), { type: "land", tag: "a/kernel" }, META),
    { type: "setRun", run: "beta" },
    META,
  );
  assert.equal(s.run, "beta");
  assert.equal(s.tag, "a/kernel");
  assert.equal(s.landed, false);
  const t = update(s, { type: "land", tag: "c/kernel" }, META);
  assert.equal(t.tag, "c/kernel");
  assert.equal(t.landed, true);
  // A run without variables is not a run to show.
  assert.equal(update(s, { type: "setRun", run: "empty" }, META), s);
});

test("unchecking the active run makes the next one active; the last one stays", () => {
  let s = loaded();
  s = update(s, { type: "toggleRun", run: "alpha", checked: false }, META);
  assert.equal(s.run, "beta");
  assert.deepEqual(s.checked, ["beta", "empty"]);
  const kept = update(s, { type: "toggleRun", run: "beta", checked: false }, META);
  assert.equal(kept.run, "beta");
  assert.deepEqual(kept.checked, s.checked);
  assert.match(kept.notice, /At least one run stays shown/);
  assert.equal(update(kept, { type: "setFilter", filter: "" }, META).notice, "");
});

test("a statistic the variable lacks is refused; a new one opens in its default view", () => {
  const s = loaded();
  assert.equal(update(s, { type: "setStat", stat: "kurtosis" }, META), s); // orders [1, 2]
  const m = update(s, { type: "setStat", stat: "mean" }, META);
  assert.equal(m.stat, "mean");
  assert.equal(m.scale, "linear");
  assert.equal(m.colormap, "rdbu_r");
  // Options are checked: a smoothing of 2 or an unknown key changes nothing.
  assert.equal(update(s, { type: "set", key: "smoothing", value: 2 }, META), s);
  assert.equal(update(s, { type: "set", key: "run", value: "beta" }, META), s);
});

test("the step slider stops following; following again shows the latest step", () => {
  let s = update(loaded(), { type: "setStep", step: 10, last: false }, META);
  assert.equal(s.follow, false);
  assert.equal(currentStep(s), 10);
  // A reload keeps the chosen step.
  s = update(s, { type: "tags", data: TAGS }, META);
  assert.equal(currentStep(s), 10);
  s = update(s, { type: "setFollow", follow: true }, META);
  assert.equal(currentStep(s), 20);
});

test("a new run appears checked on reload; runs unchecked by the user stay unchecked", () => {
  let s = update(loaded(), { type: "toggleRun", run: "beta", checked: false }, META);
  const more = structuredClone(TAGS);
  more.runs.gamma = { "a/kernel": info([0, 5]) };
  s = update(s, { type: "tags", data: more }, META);
  assert.deepEqual(s.checked, ["alpha", "empty", "gamma"]);
});

test("comparisons: the shown runs with the variable, active first; two steps, earlier first", () => {
  let s = update(loaded(), { type: "setRun", run: "beta" }, META);
  assert.deepEqual(comparedRuns(s), ["beta", "alpha"]);
  s = update(s, { type: "selectTag", tag: "c/kernel" }, META);
  assert.deepEqual(comparedRuns(s), ["beta"]); // alpha has no c/kernel
  s = update(s, { type: "selectTag", tag: "a/kernel" }, META);
  assert.deepEqual(comparedSteps(s), [0, 30]); // the first step, by default
  s = update(s, { type: "setCompareStep", step: 20 }, META);
  assert.deepEqual(comparedSteps(s), [20, 30]);
  s = update(s, { type: "setStep", step: 10, last: false }, META);
  assert.deepEqual(comparedSteps(s), [10, 20]);
  assert.equal(update(s, { type: "setCompare", compare: "sideways" }, META), s);
});

test("the render pass's keys: a change redraws the views that show it, and only those", () => {
  const s = loaded();
  const k0 = viewKeys(s);
  const changed = (next) =>
    Object.keys(k0)
      .filter((k) => viewKeys(next)[k] !== k0[k])
      .sort();
  assert.deepEqual(changed(update(s, { type: "set", key: "colormap", value: "magma" }, META)), [
    "heatmap",
    "toolbar",
  ]);
  assert.deepEqual(changed(update(s, { type: "set", key: "smoothing", value: 0.5 }, META)), [
    "curves",
    "table",
    "toolbar",
  ]);
  assert.deepEqual(changed(update(s, { type: "set", key: "logy", value: true }, META)), [
    "curves",
    "toolbar",
  ]);
  assert.deepEqual(changed(update(s, { type: "setCompare", compare: "runs" }, META)), [
    "heatmap",
    "histogram",
    "toolbar",
  ]);
  // A reload (new data) redraws every data view.
  const reloaded = changed(update(s, { type: "tags", data: TAGS }, META));
  for (const k of ["heatmap", "histogram", "curves", "table"]) assert.ok(reloaded.includes(k), k);
});

test("URL round trip: the selection written is the selection restored", () => {
  let s = loaded();
  s = update(s, { type: "setRun", run: "beta" }, META);
  s = update(s, { type: "selectTag", tag: "c/kernel" }, META);
  s = update(s, { type: "setStat", stat: "mean" }, META);
  s = update(s, { type: "set", key: "scale", value: "log" }, META);
  s = update(s, { type: "set", key: "smoothing", value: 0.6 }, META);
  s = update(s, { type: "set", key: "metric", value: "gsnr_mean" }, META);
  s = update(s, { type: "set", key: "logy", value: true }, META);
  s = update(s, { type: "toggleRun", run: "empty", checked: false }, META);
  s = update(s, { type: "setStep", step: 0, last: false }, META);
  s = update(s, { type: "setCompare", compare: "steps" }, META);
  s = update(s, { type: "setCompareStep", step: 30 }, META);
  const hash = toHash(toURLParams(s));
  assert.match(hash, /^#run=beta&/);
  const r = loaded(fromURLParams(fromHash(hash)));
  for (const k of ["run", "tag", "stat", "scale", "colormap", "smoothing", "metric", "logy"])
    assert.deepEqual(r[k], s[k], k);
  assert.deepEqual(r.checked, ["alpha", "beta"]);
  assert.equal(r.follow, false);
  assert.equal(currentStep(r), 0);
  assert.equal(r.compare, "steps");
  assert.deepEqual(comparedSteps(r), [0, 30]);
  // A restored variable is kept: no landing on the noisiest one.
  assert.equal(r.landed, true);
  // Run names are data: any text survives the round trip.
  const odd = { ...s, run: "<img src=x>&a=b #1", checked: ["<img src=x>&a=b #1"] };
  const back = fromURLParams(fromHash(toHash(toURLParams(odd))));
  assert.equal(back.run, odd.run);
  assert.deepEqual(back.checked, odd.checked);
});

test("URL parameters that do not apply are dropped, never trusted", () => {
  const p = fromURLParams({
    scale: "cubic",
    smoothing: "7",
    step: "ten",
    compare: "sideways",
    runs: "[1, 2",
    logy: "yes",
  });
  assert.deepEqual(p, {});
  // A restored run or variable that does not exist: the first run, and landing again.
  const s = loaded(fromURLParams({ run: "nope", tag: "nope/kernel" }));
  assert.equal(s.run, "alpha");
  assert.equal(s.tag, "a/kernel");
  assert.equal(s.landed, false);
  assert.deepEqual(activeRuns(s), ["alpha", "beta"]);
  assert.deepEqual(tagsOf(s, "beta"), ["a/kernel", "c/kernel"]);
});

test("TensorBoard's hash: the plugin's p.<name>. pairs replaced, the others kept", () => {
  const params = { run: "a b&c", tag: "dense/kernel" };
  const hash = hostHash("#gradmom&p.gradmom.run=old&regexInput=x", "gradmom", params);
  assert.equal(hash, "#gradmom&regexInput=x&p.gradmom.run=a%20b%26c&p.gradmom.tag=dense%2Fkernel");
  // As TensorBoard reads it (tf_storage: split on "&", then "=", each part URI-decoded).
  const dict = Object.fromEntries(
    hash
      .slice(1)
      .split("&")
      .filter((p) => p.includes("="))
      .map((p) => p.split("=").map(decodeURIComponent)),
  );
  assert.equal(dict["p.gradmom.run"], "a b&c");
  assert.equal(dict["p.gradmom.tag"], "dense/kernel");
  assert.equal(dict.regexInput, "x");
  assert.equal(hostHash("", "gradmom", {}), "");
  // Another dashboard shows: its URL is left alone.
  assert.equal(hostHash("#scalars&regexInput=x", "gradmom", params), null);
  // Read back by the tab: only its own pairs, decoded.
  assert.deepEqual(fromHostHash(hash, "gradmom"), params);
  assert.deepEqual(fromHostHash("#scalars&p.other.run=x&p.gradmom.bad=%E0%A4%A", "gradmom"), {});
});
