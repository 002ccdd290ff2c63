// @ts-check
// TensorBoard's side of the plugin frame, as its plugin library defines it
// (tensorboard/components/experimental/plugin_lib): the frame posts "experimental.bootstrap"
// with a MessagePort to its parent; over that port both sides send JSON messages
// {type, id, payload, error, isReply}. TensorBoard answers "experimental.GetURLPluginData"
// with the `p.<plugin>.` pairs of its URL hash (a shared link's view) and broadcasts
// "experimental.DataReloaded" after each reload (its reload button and its auto-reload).
// Written here (about 60 lines) rather than loaded from a CDN: the tab has no dependency.

import { fromHostHash, hostHash } from "./state.js";

const VERSION = "experimental";

/**
 * @typedef {object} Host
 * @property {() => Promise<Record<string, string>>} getURLPluginData the plugin's
 *   parameters in TensorBoard's URL: TensorBoard's answer, or, when it answers with none or
 *   not in time, the `p.<plugin>.` pairs of its URL hash read directly (TensorBoard 2.21's
 *   answer comes from a legacy hash store that no longer holds the page's hash)
 * @property {(callback: () => void) => void} onReload runs `callback` after each of
 *   TensorBoard's reloads
 * @property {(params: Record<string, string>) => void} setURLPluginData writes the plugin's
 *   parameters into TensorBoard's URL hash (a reload or a copied link opens the same view)
 */

/**
 * Connects to TensorBoard when the tab runs in its plugin frame; null when it runs on its own
 * page (no parent frame).
 * @param {string} plugin the plugin's name
 * @param {{timeoutMs?: number}} [options]
 * @returns {Host | null}
 */
export function connectHost(plugin, { timeoutMs = 2000 } = {}) {
  if (typeof window === "undefined" || window.parent === window) return null;
  const channel = new MessageChannel();
  const port = channel.port1;
  let id = 0;
  /** @type {Map<number, (payload: any) => void>} */
  const waiting = new Map();
  /** @type {Map<string, () => void>} */
  const listeners = new Map();
  /** @param {object} message */
  const post = (message) => port.postMessage(JSON.stringify(message));
  port.addEventListener("message", (event) => {
    let m;
    try {
      m = JSON.parse(event.data);
    } catch {
      return;
    }
    if (m.isReply) {
      const done = waiting.get(m.id);
      waiting.delete(m.id);
      done?.(m.error ? null : m.payload);
      return;
    }
    listeners.get(m.type)?.();
    post({ type: m.type, id: m.id, payload: null, error: null, isReply: true });
  });
  port.start();
  window.parent.postMessage(`${VERSION}.bootstrap`, "*", [channel.port2]);

  return {
    async getURLPluginData() {
      /** @type {Record<string, string> | null} */
      const answer = await new Promise((resolve) => {
        const ask = id++;
        post({
          type: `${VERSION}.GetURLPluginData`,
          id: ask,
          payload: null,
          error: null,
          isReply: false,
        });
        const timer = setTimeout(() => {
          waiting.delete(ask);
          resolve(null);
        }, timeoutMs);
        waiting.set(ask, (payload) => {
          clearTimeout(timer);
          resolve(payload && typeof payload === "object" ? payload : null);
        });
      });
      if (answer && Object.keys(answer).length) return answer;
      try {
        return fromHostHash(window.parent.location.hash, plugin);
      } catch {
        return {}; // TensorBoard on another origin
      }
    },
    onReload(callback) {
      listeners.set(`${VERSION}.DataReloaded`, callback);
    },
    setURLPluginData(params) {
      try {
        const top = window.parent;
        const hash = hostHash(top.location.hash, plugin, params);
        if (hash !== null && hash !== top.location.hash) {
          const url = new URL(top.location.href);
          url.hash = hash;
          top.history.replaceState(top.history.state, "", url.href);
        }
      } catch {
        // TensorBoard on another origin: its URL is not ours to write.
      }
    },
  };
}
