// host.js against a stand-in for TensorBoard's side of the plugin frame protocol
// (tensorboard/components/experimental/plugin_lib): a parent that takes the bootstrap port and
// answers over it as TensorBoard's IPC does (JSON {type, id, payload, error, isReply}).
// Run from the repository root:
//   node --test tests/js/
import assert from "node:assert/strict";
import { after, test } from "node:test";

/** TensorBoard's page: its URL, history, and the frames' bootstrap messages. */
const parent = {
  bootstraps: [],
  location: { href: "http://tb/#gradmom&p.gradmom.run=beta", hash: "#gradmom&p.gradmom.run=beta" },
  history: {
    state: { page: 1 },
    replaceState(state, _title, url) {
      parent.history.state = state;
      parent.location.href = url;
      parent.location.hash = new URL(url).hash;
    },
  },
  postMessage(message, _origin, ports) {
    parent.bootstraps.push({ message, ports });
  },
};
globalThis.window = { parent };

const { connectHost } = await import("../../tb_gradmom_frontend/host.js");
const host = connectHost("gradmom", { timeoutMs: 100 });
const [{ message, ports }] = parent.bootstraps;
const port = ports[0];
/** What TensorBoard answers to GetURLPluginData next (undefined: no answer). */
let answer;
const received = [];
port.addEventListener("message", (event) => {
  const m = JSON.parse(event.data);
  received.push(m);
  if (!m.isReply && m.type === "experimental.GetURLPluginData" && answer !== undefined)
    port.postMessage(JSON.stringify({ ...m, payload: answer, isReply: true }));
});
port.start();
after(() => port.close());

test("the frame bootstraps with one port, as plugin_lib's guest does", () => {
  assert.equal(message, "experimental.bootstrap");
  assert.equal(ports.length, 1);
});

test("getURLPluginData: TensorBoard's answer, else the p.gradmom.* pairs of its hash", async () => {
  answer = { run: "alpha", tag: "dense/kernel" };
  assert.deepEqual(await host.getURLPluginData(), answer);
  answer = {}; // TensorBoard 2.21 answers from a store that no longer holds the page's hash
  assert.deepEqual(await host.getURLPluginData(), { run: "beta" });
  answer = undefined; // no answer in time
  assert.deepEqual(await host.getURLPluginData(), { run: "beta" });
  const asks = received.filter((m) => m.type === "experimental.GetURLPluginData");
  assert.equal(asks.length, 3);
  assert.deepEqual(
    asks.map((m) => m.isReply),
    [false, false, false],
  );
});

test("DataReloaded runs the reload callback and is answered", async () => {
  let reloads = 0;
  host.onReload(() => (reloads += 1));
  const replied = new Promise((resolve) => {
    port.addEventListener("message", function once(event) {
      const m = JSON.parse(event.data);
      if (m.isReply && m.type === "experimental.DataReloaded") {
        port.removeEventListener("message", once);
        resolve(m);
      }
    });
  });
  const msg = { type: "experimental.DataReloaded", id: 7, payload: null, error: null };
  port.postMessage(JSON.stringify({ ...msg, isReply: false }));
  const reply = await replied;
  assert.equal(reloads, 1);
  assert.equal(reply.id, 7);
});

test("setURLPluginData writes TensorBoard's hash, only while the tab is its dashboard", () => {
  host.setURLPluginData({ run: "gamma", tag: "a/b" });
  assert.equal(parent.location.hash, "#gradmom&p.gradmom.run=gamma&p.gradmom.tag=a%2Fb");
  assert.deepEqual(parent.history.state, { page: 1 }); // TensorBoard's history state kept
  parent.location.hash = "#scalars";
  parent.location.href = "http://tb/#scalars";
  host.setURLPluginData({ run: "delta" });
  assert.equal(parent.location.hash, "#scalars");
});
