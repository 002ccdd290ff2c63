export {default as drag} from "./drag.js";
export {default as dragDisable, yesdrag as dragEnable} from "./nodrag.js";
