// @ts-check
// The info panel of the noise statistics: what the noise scale estimates, under which
// assumptions it estimates the critical batch size, and the work that questions them, with
// references. The text is the backend's (GET /meta "noise_note": stats.NOISE_SCALE_NOTE);
// this module decides when it applies and lays it out.

import { h } from "./common.js";

/**
 * Whether `metric` is a noise statistic: one of the noise-scale group (meta.statistics'
 * `group`), or a part of such a ratio (meta.ratio_parts: the noise scale's tr(Σ) and |G|²).
 * @param {string} metric
 * @param {any} meta
 */
export function isNoiseStatistic(metric, meta) {
  const inGroup = (/** @type {string} */ k) => meta.statistics?.[k]?.group === "noise_scale";
  if (inGroup(metric)) return true;
  return Object.entries(meta.ratio_parts ?? {}).some(
    ([k, parts]) => inGroup(k) && /** @type {string[]} */ (parts).includes(metric),
  );
}

/**
 * One reference as a line of text: "Authors (year). Title. Where."
 * @param {{authors: string, year: number, title: string, where?: string}} r
 */
export function referenceText(r) {
  return `${r.authors} (${r.year}). ${r.title}.${r.where ? ` ${r.where}.` : ""}`;
}

/**
 * What the noise note shows for `metric`: null when it does not apply (or /meta has none),
 * else {title, paragraphs, references: [{text, url}]}.
 * @param {string} metric
 * @param {any} meta
 */
export function noiseNote(metric, meta) {
  const note = meta.noise_note;
  if (!note || !isNoiseStatistic(metric, meta)) return null;
  return {
    title: String(note.title),
    paragraphs: (note.paragraphs ?? []).map(String),
    references: (note.references ?? []).map((/** @type {any} */ r) => ({
      text: referenceText(r),
      url: typeof r.url === "string" && /^https:\/\//.test(r.url) ? r.url : null,
    })),
  };
}

/**
 * The note as a <section> (for the info panel), or null.
 * @param {string} metric
 * @param {any} meta
 */
export function noiseNoteNode(metric, meta) {
  const note = noiseNote(metric, meta);
  if (!note) return null;
  return h("section", { class: "noise-note", "aria-label": note.title }, [
    h("h4", { text: note.title }),
    ...note.paragraphs.map((p) => h("p", { text: p })),
    h(
      "ol",
      { class: "noise-refs" },
      note.references.map((r) =>
        h("li", {}, [
          r.url
            ? h("a", { href: r.url, target: "_blank", rel: "noopener noreferrer", text: r.text })
            : h("span", { text: r.text }),
        ]),
      ),
    ),
  ]);
}
