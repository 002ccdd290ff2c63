export {
  default as scaleBand,
  point as scalePoint
} from "./band.js";

export {
  default as scaleIdentity
} from "./identity.js";

export {
  default as scaleLinear
} from "./linear.js";

export {
  default as scaleLog
} from "./log.js";

export {
  default as scaleSymlog
} from "./symlog.js";

export {
  default as scaleOrdinal,
  implicit as scaleImplicit
} from "./ordinal.js";

export {
  default as scalePow,
  sqrt as scaleSqrt
} from "./pow.js";

export {
  default as scaleRadial
} from "./radial.js";

export {
  default as scaleQuantile
} from "./quantile.js";

export {
  default as scaleQuantize
} from "./quantize.js";

export {
  default as scaleThreshold
} from "./threshold.js";

export {
  default as scaleTime
} from "./time.js";

export {
  default as scaleUtc
} from "./utcTime.js";

export {
  default as scaleSequential,
  sequentialLog as scaleSequentialLog,
  sequentialPow as scaleSequentialPow,
  sequentialSqrt as scaleSequentialSqrt,
  sequentialSymlog as scaleSequentialSymlog
} from "./sequential.js";

export {
  default as scaleSequentialQuantile
} from "./sequentialQuantile.js";

export {
  default as scaleDiverging,
  divergingLog as scaleDivergingLog,
  divergingPow as scaleDivergingPow,
  divergingSqrt as scaleDivergingSqrt,
  divergingSymlog as scaleDivergingSymlog
} from "./diverging.js";

export {
  default as tickFormat
} from "./tickFormat.js";
