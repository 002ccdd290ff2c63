// The per-example view's pure parts (views/examples.js) and its state (state.js). Run from the
// repository root:
//   node --test tests/js/
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  exampleColumn,
  exampleRun,
  exampleTag,
  fromURLParams,
  initialState,
  toURLParams,
  update,
  viewKeys,
} from "../../tb_gradmom_frontend/state.js";

const { fanData, parsePositive, quantilesCSV, outliersCSV, clipCSV, cellText, OUTLIER_COLUMNS } =
  await import("../../tb_gradmom_frontend/views/examples.js");

const META = JSON.parse(readFileSync(new URL("./meta.json", import.meta.url), "utf-8"));

// An /examples/quantiles payload as the backend sends it (analysis.examples.quantiles).
const Q = {
  steps: [0, 10],
  batch_size: [8, 100],
  rows: [8, 24],
  capped: [false, true],
  keys: ["p0.5", "p5", "p25", "p50", "p75", "p95", "p99.5"],
  quantiles: {
    "p0.5": [0.1, 0.2],
    p5: [0.5, 0.6],
    p25: [1, 1.1],
    p50: [2, 2.1],
    p75: [3, 3.1],
    p95: [5, 5.1],
    "p99.5": [9, 9.1],
  },
  max: [10, 11],
  mean_sq: [4.5, 5],
  bands: [
    { label: "99 %", lower: "p0.5", upper: "p99.5" },
    { label: "90 %", lower: "p5", upper: "p95" },
    { label: "50 %", lower: "p25", upper: "p75" },
  ],
};

test("the fan's bands are the payload's named quantiles, widest first", () => {
  const fan = fanData(Q);
  assert.deepEqual(fan.steps, [0, 10]);
  assert.deepEqual(
    fan.bands.map((b) => [b.label, b.lower, b.upper]),
    [
      ["99 %", [0.1, 0.2], [9, 9.1]],
      ["90 %", [0.5, 0.6], [5, 5.1]],
      ["50 %", [1, 1.1], [3, 3.1]],
    ],
  );
  assert.deepEqual(fan.median, [2, 2.1]);
  assert.deepEqual(fan.max, [10, 11]);
  assert.deepEqual(fan.capped, [false, true]);
  assert.equal(fan.log, true);
  // a zero norm (a dead example) makes the axis linear
  const zero = { ...Q, quantiles: { ...Q.quantiles, "p0.5": [0, 0.2] } };
  assert.equal(fanData(zero).log, false);
  assert.equal(fanData({ steps: [] }).log, false);
});

test("inputs take positive finite numbers only", () => {
  assert.equal(parsePositive(" 2.5 "), 2.5);
  assert.equal(parsePositive("1e3"), 1000);
  for (const bad of ["", "0", "-1", "abc", "Infinity", "NaN"])
    assert.equal(parsePositive(bad), null);
});

test("the CSV texts hold the payloads", () => {
  const q = quantilesCSV(Q).trim().split("\r\n");
  assert.equal(q[0], "step,batch_size,rows,capped,p0.5,p5,p25,p50,p75,p95,p99.5,max,mean_sq");
  assert.equal(q[2], "10,100,24,1,0.2,0.6,1.1,2.1,3.1,5.1,9.1,11,5");
  const rows = [
    {
      id: "a,b",
      outlier_steps: 2,
      seen: 3,
      max_ratio: 12.5,
      max_step: 10,
      mean_ratio: 8,
      last_loss: Infinity,
      last_step: 20,
      last_ratio: 4,
    },
  ];
  const o = outliersCSV(rows).trim().split("\r\n");
  assert.equal(
    o[0],
    "id,outlier_steps,seen,max_ratio,max_step,mean_ratio,last_loss,last_step,last_ratio",
  );
  assert.equal(o[1], '"a,b",2,3,12.5,10,8,Infinity,20,4');
  const c = clipCSV({
    steps: [5],
    batch_size: [10],
    capped: [false],
    clipped: [3],
    fraction: [0.3],
    clip_norm: 2,
  });
  assert.equal(c.trim().split("\r\n")[1], "5,10,0,3,0.3,2");
});

test("table cells: counts and steps as integers, ratios with 4 digits, ids as they are", () => {
  const col = (k) => OUTLIER_COLUMNS.find((c) => c.key === k);
  const row = { id: 42, outlier_steps: 8, max_ratio: 28.8712, max_step: 12000, last_loss: 3199.4 };
  assert.equal(cellText(col("id"), row), "42");
  assert.equal(cellText(col("outlier_steps"), row), "8");
  assert.equal(cellText(col("max_step"), row), "12\u2009000");
  assert.equal(cellText(col("max_ratio"), row), "28.87");
  assert.equal(cellText(col("last_loss"), row), "3.199k");
});

const EX = {
  ex: {
    "capped/_examples": { group: "capped", columns: ["model", "capped/out"] },
    "full/_examples": { group: "full", columns: ["model", "full/out"] },
  },
  only: { _examples: { group: "", columns: ["model", "dense"] } },
};

test("the section follows the active run, or keeps its own choice", () => {
  let s = update(initialState(META, "light"), { type: "examples", runs: EX }, META);
  assert.equal(exampleRun(s), "ex"); // no active run: the first with norms
  assert.equal(exampleTag(s), "capped/_examples");
  s = { ...s, run: "only" };
  assert.equal(exampleRun(s), "only");
  s = update(s, { type: "setExamples", key: "exRun", value: "ex" }, META);
  s = update(s, { type: "setExamples", key: "exTag", value: "full/_examples" }, META);
  s = update(s, { type: "setExamples", key: "exColumn", value: "full/out" }, META);
  assert.deepEqual(
    [exampleRun(s), exampleTag(s), exampleColumn(s)],
    ["ex", "full/_examples", "full/out"],
  );
  // a column the tag does not have falls back to the whole model
  const other = update(s, { type: "setExamples", key: "exTag", value: "capped/_examples" }, META);
  assert.equal(exampleColumn(other), "model");
  // bad values are refused; the argument is never changed
  const before = JSON.stringify(s);
  for (const [key, value] of [
    ["exThreshold", 0.5],
    ["clipNorm", -1],
    ["exStep", 1.5],
    ["nope", 1],
  ])
    assert.equal(update(s, { type: "setExamples", key, value }, META), s);
  assert.equal(JSON.stringify(s), before);
  const k0 = viewKeys(s).examples;
  const s2 = update(s, { type: "setExamples", key: "clipNorm", value: 2.5 }, META);
  assert.notEqual(viewKeys(s2).examples, k0);
  assert.equal(viewKeys(s2).heatmap, viewKeys(s).heatmap);
});

test("the section's selection round-trips through the URL", () => {
  let s = update(initialState(META, "light"), { type: "examples", runs: EX }, META);
  for (const [key, value] of [
    ["exRun", "ex"],
    ["exTag", "full/_examples"],
    ["exColumn", "full/out"],
    ["exStep", 10],
    ["exThreshold", 3],
    ["clipNorm", 0.25],
  ])
    s = update(s, { type: "setExamples", key, value }, META);
  const params = toURLParams(s);
  assert.deepEqual(
    [params.exrun, params.extag, params.excol, params.exstep, params.exthr, params.clip],
    ["ex", "full/_examples", "full/out", "10", "3", "0.25"],
  );
  const back = fromURLParams(params);
  assert.deepEqual(
    [back.exRun, back.exTag, back.exColumn, back.exStep, back.exThreshold, back.clipNorm],
    ["ex", "full/_examples", "full/out", 10, 3, 0.25],
  );
  // malformed values are dropped
  const bad = fromURLParams({ exthr: "0.5", clip: "-2", exstep: "x" });
  assert.deepEqual([bad.exThreshold, bad.clipNorm, bad.exStep], [undefined, undefined, undefined]);
  // the whole model is the default: not written
  assert.equal(toURLParams({ ...s, exColumn: "model" }).excol, undefined);
});
