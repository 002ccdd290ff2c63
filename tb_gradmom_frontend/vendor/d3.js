// The parts of d3 the views use, from the vendored ES module sources in ./d3/ (see
// ./d3/VERSIONS.json and ./vendor_d3.mjs; each package's LICENSE is in its folder).
export { create, pointer, select, selectAll } from "./d3/d3-selection/src/index.js";
export { default as scaleLinear } from "./d3/d3-scale/src/linear.js";
export { default as scaleLog } from "./d3/d3-scale/src/log.js";
export { axisBottom, axisLeft, axisRight, axisTop } from "./d3/d3-axis/src/index.js";
export { zoom, zoomIdentity, zoomTransform } from "./d3/d3-zoom/src/index.js";
