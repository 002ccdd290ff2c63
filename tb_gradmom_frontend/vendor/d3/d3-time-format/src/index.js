export {default as timeFormatDefaultLocale, timeFormat, timeParse, utcFormat, utcParse} from "./defaultLocale.js";
export {default as timeFormatLocale} from "./locale.js";
export {default as isoFormat} from "./isoFormat.js";
export {default as isoParse} from "./isoParse.js";
