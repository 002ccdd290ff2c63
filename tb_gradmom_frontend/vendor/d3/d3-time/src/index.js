export {
  timeInterval
} from "./interval.js";

export {
  millisecond as utcMillisecond,
  milliseconds as utcMilliseconds,
  millisecond as timeMillisecond,
  milliseconds as timeMilliseconds
} from "./millisecond.js";

export {
  second as utcSecond,
  seconds as utcSeconds,
  second as timeSecond,
  seconds as timeSeconds
} from "./second.js";

export {
  timeMinute,
  timeMinutes,
  utcMinute,
  utcMinutes
} from "./minute.js";

export {
  timeHour,
  timeHours,
  utcHour,
  utcHours
} from "./hour.js";

export {
  timeDay,
  timeDays,
  utcDay,
  utcDays,
  unixDay,
  unixDays
} from "./day.js";

export {
  timeSunday as timeWeek,
  timeSundays as timeWeeks,
  timeSunday,
  timeSundays,
  timeMonday,
  timeMondays,
  timeTuesday,
  timeTuesdays,
  timeWednesday,
  timeWednesdays,
  timeThursday,
  timeThursdays,
  timeFriday,
  timeFridays,
  timeSaturday,
  timeSaturdays,
  utcSunday as utcWeek,
  utcSundays as utcWeeks,
  utcSunday,
  utcSundays,
  utcMonday,
  utcMondays,
  utcTuesday,
  utcTuesdays,
  utcWednesday,
  utcWednesdays,
  utcThursday,
  utcThursdays,
  utcFriday,
  utcFridays,
  utcSaturday,
  utcSaturdays
} from "./week.js";

export {
  timeMonth,
  timeMonths,
  utcMonth,
  utcMonths
} from "./month.js";

export {
  timeYear,
  timeYears,
  utcYear,
  utcYears
} from "./year.js";

export {
  utcTicks,
  utcTickInterval,
  timeTicks,
  timeTickInterval
} from "./ticks.js";
