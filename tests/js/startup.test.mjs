// The tab's start-up without a server: api.fetchMeta against a stubbed fetch, and index.start
// in a minimal stand-in for the DOM (only what views/common.js's h() uses). Run from the
// repository root:
//   node --test tests/js/
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { afterEach, test } from "node:test";

const META_TEXT = readFileSync(new URL("./meta.json", import.meta.url), "utf-8");

/** An element with the few DOM members h() and replaceChildren() need; textContent as the DOM's. */
class FakeElement {
  constructor(tag) {
    this.tagName = tag.toUpperCase();
    this.attributes = {};
    this.children = [];
    this.className = "";
    this.ownText = "";
  }
  setAttribute(k, v) {
    this.attributes[k] = String(v);
  }
  getAttribute(k) {
    return this.attributes[k] ?? null;
  }
  addEventListener() {}
  append(...nodes) {
    this.children.push(...nodes);
  }
  replaceChildren(...nodes) {
    this.children = [...nodes];
  }
  set textContent(v) {
    this.children = [];
    this.ownText = String(v);
  }
  get textContent() {
    const text = (c) => (c instanceof FakeElement ? c.textContent : String(c));
    return this.ownText + this.children.map(text).join("");
  }
  /** Elements below this one (depth first) for which `pred` holds. */
  findAll(pred) {
    const out = [];
    for (const c of this.children)
      if (c instanceof FakeElement) {
        if (pred(c)) out.push(c);
        out.push(...c.findAll(pred));
      }
    return out;
  }
}

globalThis.document = { createElement: (tag) => new FakeElement(tag) };
const realFetch = globalThis.fetch;
afterEach(() => {
  globalThis.fetch = realFetch;
});

/** fetch answering every request with `status` and `body`; records the URLs asked for. */
function stubFetch(status, body) {
  const urls = [];
  globalThis.fetch = async (url) => {
    urls.push(String(url));
    return new Response(body, { status, headers: { "Content-Type": "application/json" } });
  };
  return urls;
}

const api = await import("../../tb_gradmom_frontend/api.js");
const { start, showStartupError } = await import("../../tb_gradmom_frontend/index.js");

test("fetchMeta returns the checked, frozen /meta", async () => {
  const urls = stubFetch(200, META_TEXT);
  const meta = await api.fetchMeta();
  assert.equal(urls.length, 1);
  assert.match(urls[0], /\/meta$/);
  assert.deepEqual(meta, JSON.parse(META_TEXT));
  assert.ok(Object.isFrozen(meta.element_statistics[0]));
});

test("fetchMeta rejects a failing route and a payload the tab cannot read", async () => {
  stubFetch(404, "Not found: no such route");
  await assert.rejects(api.fetchMeta(), (e) => {
    assert.ok(e instanceof api.ApiError);
    assert.equal(e.status, 404);
    assert.equal(e.message, "meta: 404 Not found: no such route");
    return true;
  });
  stubFetch(200, "<html>a proxy's login page</html>");
  await assert.rejects(api.fetchMeta(), /meta: 200 response is not JSON/);
  const old = JSON.parse(META_TEXT);
  delete old.run_palette;
  stubFetch(200, JSON.stringify(old));
  await assert.rejects(
    api.fetchMeta(),
    /meta: unexpected payload, missing or invalid: run_palette \(object, got undefined\)/,
  );
});

test("without /meta the tab shows an error saying why, never a blank page", async () => {
  for (const [status, body, why] of [
    [500, "Internal error", "meta: 500 Internal error"],
    [200, "{}", "meta: unexpected payload, missing or invalid: version"],
  ]) {
    stubFetch(status, body);
    const root = new FakeElement("body");
    root.append(new FakeElement("p")); // whatever was there is replaced
    assert.equal(await start(root), null);
    const alerts = root.findAll((e) => e.getAttribute("role") === "alert");
    assert.equal(alerts.length, 1);
    assert.equal(root.children.length, 1);
    assert.match(alerts[0].className, /\bstatus error\b/);
    const text = root.textContent;
    assert.match(text, /The Grad Moments tab could not start\./);
    assert.ok(text.includes(why), text);
    assert.match(text, /Reload the page/);
  }
  // A network failure (TensorBoard gone): fetch itself rejects.
  globalThis.fetch = async () => {
    throw new TypeError("Failed to fetch");
  };
  const root = new FakeElement("body");
  assert.equal(await start(root), null);
  assert.match(root.textContent, /could not be loaded from the plugin: Failed to fetch\./);
  // Any loader: the message names what went wrong.
  const other = new FakeElement("body");
  assert.equal(await start(other, () => Promise.reject(new Error("boom"))), null);
  assert.match(other.textContent, /: boom\. Reload/);
  showStartupError(other, "plain text");
  assert.match(other.textContent, /: plain text\. Reload/);
});
