//! A budget's `schedule`: five-field cron (minute hour day-of-month month
//! day-of-week), UTC, as Karpenter's NodePool budgets and `crontab(5)` write it.
//!
//! Accepted: `*`, `?` (same as `*`), numbers, ranges `a-b`, steps `*/n` and `a-b/n`
//! and `a/n`, lists `a,b`, names for months (`jan`..`dec`) and days (`sun`..`sat`,
//! 0 and 7 both Sunday), and the macros `@yearly` `@annually` `@monthly` `@weekly`
//! `@daily` `@midnight` `@hourly`. The day rule is cron's: when both day fields are
//! restricted (neither is exactly `*` or `?`), a day matches when either matches;
//! otherwise both must. Anything else is refused, naming the field and the value.

use chrono::{DateTime, Datelike, Duration as Span, Timelike, Utc};

/// The longest schedule text read (a cron line is a few dozen characters).
const MAX_TEXT: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u32,
    /// Bits 1..=31.
    days: u32,
    /// Bits 1..=12.
    months: u16,
    /// Bits 0..=6, Sunday 0.
    weekdays: u8,
    days_any: bool,
    weekdays_any: bool,
}

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
};
const DAY: Field = Field {
    name: "day of month",
    min: 1,
    max: 31,
    names: &[],
};
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
};
const WEEKDAY: Field = Field {
    name: "day of week",
    min: 0,
    max: 7,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

impl Cron {
    pub fn parse(text: &str) -> Result<Cron, String> {
        if text.len() > MAX_TEXT {
            return Err(format!(
                "a schedule of {} characters (at most {MAX_TEXT})",
                text.len()
            ));
        }
        let text = text.trim();
        let expanded = match text.to_ascii_lowercase().as_str() {
            "@yearly" | "@annually" => "0 0 1 1 *".to_string(),
            "@monthly" => "0 0 1 * *".to_string(),
            "@weekly" => "0 0 * * 0".to_string(),
            "@daily" | "@midnight" => "0 0 * * *".to_string(),
            "@hourly" => "0 * * * *".to_string(),
            other if other.starts_with('@') => {
                return Err(format!(
                "{text:?} is not a macro cron knows (@yearly, @monthly, @weekly, @daily, @hourly)"
            ))
            }
            _ => text.to_string(),
        };
        let parts: Vec<&str> = expanded.split_whitespace().collect();
        let [minute, hour, day, month, weekday] = parts[..] else {
            return Err(format!(
                "{text:?} has {} fields; a schedule has five: minute hour day-of-month month day-of-week (UTC)",
                parts.len()
            ));
        };
        let any = |f: &str| f == "*" || f == "?";
        let mut weekdays = set(weekday, &WEEKDAY)?;
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays | 1) & 0x7f;
        }
        Ok(Cron {
            minutes: set(minute, &MINUTE)?,
            hours: set(hour, &HOUR)? as u32,
            days: set(day, &DAY)? as u32,
            months: set(month, &MONTH)? as u16,
            weekdays: weekdays as u8,
            days_any: any(day),
            weekdays_any: any(weekday),
        })
    }

    /// Whether the schedule fires at the minute of `t`.
    pub fn fires_at(&self, t: DateTime<Utc>) -> bool {
        self.day_matches(t)
            && self.hours & (1 << t.hour()) != 0
            && self.minutes & (1 << t.minute()) != 0
    }

    fn day_matches(&self, t: DateTime<Utc>) -> bool {
        if self.months & (1 << t.month()) == 0 {
            return false;
        }
        let day = self.days & (1 << t.day()) != 0;
        let weekday = self.weekdays & (1 << t.weekday().num_days_from_sunday()) != 0;
        if self.days_any || self.weekdays_any {
            day && weekday
        } else {
            day || weekday
        }
    }

    /// The latest minute at or before `now` the schedule fired, if one is after
    /// `now - within` (a window of `within` opened then is still open at `now`).
    pub fn fired_within(&self, now: DateTime<Utc>, within: Span) -> Option<DateTime<Utc>> {
        let earliest = now - within;
        let now = now.with_second(0)?.with_nanosecond(0)?;
        // Day by day, hour by hour, minute by minute, newest first: days and hours
        // that do not match are skipped whole.
        let mut day = now.date_naive();
        while day >= earliest.date_naive() {
            let midnight = day.and_hms_opt(0, 0, 0)?.and_utc();
            if self.day_matches(midnight) {
                let last_hour = if day == now.date_naive() {
                    now.hour()
                } else {
                    23
                };
                for hour in (0..=last_hour).rev() {
                    if self.hours & (1 << hour) == 0 {
                        continue;
                    }
                    let last_minute = if day == now.date_naive() && hour == now.hour() {
                        now.minute()
                    } else {
                        59
                    };
                    for minute in (0..=last_minute).rev() {
                        if self.minutes & (1 << minute) == 0 {
                            continue;
                        }
                        let at = midnight + Span::hours(hour as i64) + Span::minutes(minute as i64);
                        return (at > earliest).then_some(at);
                    }
                }
            }
            day = day.pred_opt()?;
        }
        None
    }
}

/// One field's values as a bit set.
fn set(text: &str, f: &Field) -> Result<u64, String> {
    let mut bits = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s
                    .parse()
                    .ok()
                    .filter(|s| *s >= 1 && *s <= f.max)
                    .ok_or_else(|| bad(f, item, "its step is not a number from 1"))?;
                (r, step)
            }
            None => (item, 1),
        };
        let (low, high) = if range == "*" || range == "?" {
            (f.min, if f.names.len() == 7 { 6 } else { f.max })
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a, f, item)?, value(b, f, item)?)
        } else {
            let a = value(range, f, item)?;
            // `a/n`: from a to the end, every n.
            (a, if item.contains('/') { f.max } else { a })
        };
        if low > high {
            return Err(bad(f, item, "its range runs backwards"));
        }
        let mut v = low;
        while v <= high {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok(bits)
}

fn value(text: &str, f: &Field, item: &str) -> Result<u32, String> {
    let lower = text.to_ascii_lowercase();
    if let Some(i) = f.names.iter().position(|n| *n == lower) {
        return Ok(i as u32 + if f.names.len() == 12 { 1 } else { 0 });
    }
    text.parse::<u32>()
        .ok()
        .filter(|v| (f.min..=f.max).contains(v))
        .ok_or_else(|| {
            bad(
                f,
                item,
                &format!("{text:?} is not a value from {} to {}", f.min, f.max),
            )
        })
}

fn bad(f: &Field, item: &str, why: &str) -> String {
    let item: String = item.chars().take(32).collect();
    format!("{} field {item:?}: {why}", f.name)
}
