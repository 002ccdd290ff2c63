// Types for the vendored d3 (vendor/d3.js) as the tab's type check (`npx tsc`, jsconfig.json)
// sees it: loosely typed, so that the check covers the tab's own code and not d3's sources.
// Written by hand for this repository (not part of d3); vendor_d3.mjs leaves it alone.
export const axisBottom: any;
export const axisLeft: any;
export const axisRight: any;
export const axisTop: any;
export const create: any;
export const pointer: any;
export const scaleLinear: any;
export const scaleLog: any;
export const select: any;
export const zoom: any;
export const selectAll: any;
export const zoomIdentity: any;
export const zoomTransform: any;
