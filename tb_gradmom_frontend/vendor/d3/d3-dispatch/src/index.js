export {default as dispatch} from "./dispatch.js";
