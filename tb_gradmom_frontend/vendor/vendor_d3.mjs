// Vendors the d3 modules the Grad Moments tab uses, as native ES modules, with no bundler.
//
// Usage (from the repository root; needs npm and the npm registry):
//   node tb_gradmom_frontend/vendor/vendor_d3.mjs
//
// It installs the exact versions below into a temporary folder, copies each package's
// `src/` (the ES module sources published on npm) and its LICENSE to `vendor/d3/<package>/`,
// and rewrites the bare imports between packages (`from "d3-array"`) into relative paths
// (`from "../../d3-array/src/index.js"`), the only change made to the files. Browsers cannot
// resolve bare specifiers without an import map, and TensorBoard's content security policy
// forbids the inline script an import map would need.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

// The versions d3@7.9.0 resolved to when it was released; pinned exactly.
export const PACKAGES = {
  "d3-array": "3.2.4",
  "d3-axis": "3.0.0",
  "d3-color": "3.1.0",
  "d3-dispatch": "3.0.1",
  "d3-drag": "3.0.0",
  "d3-ease": "3.0.1",
  "d3-format": "3.1.0",
  "d3-interpolate": "3.0.1",
  "d3-scale": "4.0.2",
  "d3-selection": "3.0.0",
  "d3-time": "3.1.0",
  "d3-time-format": "4.1.0",
  "d3-timer": "3.0.1",
  "d3-transition": "3.0.1",
  "d3-zoom": "3.0.0",
  internmap: "2.0.3",
};

const here = path.dirname(fileURLToPath(import.meta.url));
const out = path.join(here, "d3");
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "vendor-d3-"));
fs.writeFileSync(path.join(tmp, "package.json"), JSON.stringify({ name: "vendor-d3", private: true }));
execFileSync(
  "npm",
  ["install", "--no-audit", "--no-fund", "--ignore-scripts", "--save-exact",
    ...Object.entries(PACKAGES).map(([name, v]) => `${name}@${v}`)],
  { cwd: tmp, stdio: "inherit" },
);

fs.rmSync(out, { recursive: true, force: true });
const bare = /(\bfrom\s*|\bimport\s*)(["'])([^"'./][^"']*)\2/g;
for (const [name, version] of Object.entries(PACKAGES)) {
  const src = path.join(tmp, "node_modules", name);
  const got = JSON.parse(fs.readFileSync(path.join(src, "package.json"), "utf8")).version;
  if (got !== version) throw new Error(`${name}: expected ${version}, npm installed ${got}`);
  const dst = path.join(out, name);
  fs.mkdirSync(dst, { recursive: true });
  fs.copyFileSync(path.join(src, "LICENSE"), path.join(dst, "LICENSE"));
  const walk = (dir) => {
    for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
      const p = path.join(dir, entry.name);
      if (entry.isDirectory()) walk(p);
      else if (entry.name.endsWith(".js")) {
        const rel = path.relative(src, p);
        const depth = rel.split(path.sep).length; // e.g. src/index.js -> 2
        const text = fs.readFileSync(p, "utf8").replace(bare, (m, kw, q, spec) => {
          if (!(spec in PACKAGES)) throw new Error(`${rel} in ${name} imports ${spec}, not vendored`);
          return `${kw}${q}${"../".repeat(depth)}${spec}/src/index.js${q}`;
        });
        fs.mkdirSync(path.dirname(path.join(dst, rel)), { recursive: true });
        fs.writeFileSync(path.join(dst, rel), text);
      }
    }
  };
  walk(path.join(src, "src"));
}
fs.writeFileSync(path.join(out, "VERSIONS.json"), JSON.stringify(PACKAGES, null, 2) + "\n");
fs.rmSync(tmp, { recursive: true, force: true });
console.log(`vendored ${Object.keys(PACKAGES).length} packages into ${out}`);
