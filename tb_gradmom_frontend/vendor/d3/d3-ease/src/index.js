export {
  linear as easeLinear
} from "./linear.js";

export {
  quadInOut as easeQuad,
  quadIn as easeQuadIn,
  quadOut as easeQuadOut,
  quadInOut as easeQuadInOut
} from "./quad.js";

export {
  cubicInOut as easeCubic,
  cubicIn as easeCubicIn,
  cubicOut as easeCubicOut,
  cubicInOut as easeCubicInOut
} from "./cubic.js";

export {
  polyInOut as easePoly,
  polyIn as easePolyIn,
  polyOut as easePolyOut,
  polyInOut as easePolyInOut
} from "./poly.js";

export {
  sinInOut as easeSin,
  sinIn as easeSinIn,
  sinOut as easeSinOut,
  sinInOut as easeSinInOut
} from "./sin.js";

export {
  expInOut as easeExp,
  expIn as easeExpIn,
  expOut as easeExpOut,
  expInOut as easeExpInOut
} from "./exp.js";

export {
  circleInOut as easeCircle,
  circleIn as easeCircleIn,
  circleOut as easeCircleOut,
  circleInOut as easeCircleInOut
} from "./circle.js";

export {
  bounceOut as easeBounce,
  bounceIn as easeBounceIn,
  bounceOut as easeBounceOut,
  bounceInOut as easeBounceInOut
} from "./bounce.js";

export {
  backInOut as easeBack,
  backIn as easeBackIn,
  backOut as easeBackOut,
  backInOut as easeBackInOut
} from "./back.js";

export {
  elasticOut as easeElastic,
  elasticIn as easeElasticIn,
  elasticOut as easeElasticOut,
  elasticInOut as easeElasticInOut
} from "./elastic.js";
