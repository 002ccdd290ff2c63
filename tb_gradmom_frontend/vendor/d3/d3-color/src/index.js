export {default as color, rgb, hsl} from "./color.js";
export {default as lab, hcl, lch, gray} from "./lab.js";
export {default as cubehelix} from "./cubehelix.js";
