export {default as zoom} from "./zoom.js";
export {default as zoomTransform, identity as zoomIdentity, Transform as ZoomTransform} from "./transform.js";
