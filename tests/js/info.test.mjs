// The noise statistics' info panel (views/info.js): when it applies and what it lists, from the
// backend's /meta (tests/js/meta.json). Run from the repository root: node --test tests/js/
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

const { isNoiseStatistic, noiseNote, referenceText } =
  await import("../../tb_gradmom_frontend/views/info.js");
const META = JSON.parse(readFileSync(new URL("./meta.json", import.meta.url), "utf-8"));

test("the note applies to the noise scale and to its two parts only", () => {
  assert.deepEqual(META.ratio_parts.noise_scale, ["total_variance", "grad_norm_sq_unbiased"]);
  for (const k of ["noise_scale", "total_variance", "grad_norm_sq_unbiased"])
    assert.equal(isNoiseStatistic(k, META), true, k);
  for (const k of ["gsnr_mean", "cabs_batch_size", "norm_test", "loss", "grad_norm_sq"])
    assert.equal(isNoiseStatistic(k, META), false, k);
  assert.equal(noiseNote("gsnr_mean", META), null);
  assert.equal(noiseNote("noise_scale", { ...META, noise_note: undefined }), null);
});

test("the note says what B_simple estimates, under which assumptions, with its references", () => {
  const note = noiseNote("noise_scale", META);
  assert.ok(note);
  const text = note.paragraphs.join(" ");
  assert.match(text, /critical batch size only under those assumptions/);
  assert.match(text, /Merrill et al\. \(2025\)/);
  assert.match(text, /Gray et al\. \(2024\)/);
  assert.deepEqual(
    note.references.map((r) => r.url),
    [
      "https://arxiv.org/abs/1812.06162",
      "https://arxiv.org/abs/2411.00999",
      "https://arxiv.org/abs/2505.23971",
    ],
  );
  assert.equal(
    note.references[0].text,
    "McCandlish, Kaplan, Amodei and the OpenAI Dota Team (2018). An Empirical Model of " +
      "Large-Batch Training. arXiv:1812.06162.",
  );
  // A link that is not https is shown as text, never as a link.
  const odd = noiseNote("noise_scale", {
    ...META,
    noise_note: {
      ...META.noise_note,
      references: [{ ...META.noise_note.references[0], url: "javascript:alert(1)" }],
    },
  });
  assert.equal(odd.references[0].url, null);
});

test("a reference without a venue ends at its title", () => {
  assert.equal(referenceText({ authors: "A, B", year: 2020, title: "T" }), "A, B (2020). T.");
});
