//! What a rate remembers across leaders (issue 71): the starts each budget with a
//! `rate` counted, carried on the leader's Lease so that a restart or a new leader
//! does not start counting afresh. Pure: the text in, the map out, and back.
//!
//! The text is JSON, one list of start times (Unix milliseconds) per rate budget by
//! name, each list its budget's newest `rate.starts` within `rate.per`: at most the
//! sum of the rates' `starts`, capped at [`MAX_STARTS`]. Read back, it is bounded
//! and fails closed: text that does not parse (or is too long) reads as every rate
//! used up at the takeover, so each rate's budget waits one period rather than let a
//! burst through; a budget it does not name (renamed, new) starts afresh; a start
//! from the future (another replica's clock) counts as now.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration as Span, TimeZone, Utc};

use super::{Budget, World};

/// The Lease annotation that carries it.
pub const ANNOTATION: &str = "ca-asg-provider.io/rate-starts";

/// At most this many starts are carried in all (the annotation stays small).
pub const MAX_STARTS: usize = 2_000;

/// At most this much text is read back.
pub const MAX_TEXT: usize = 64 * 1024;

/// Per rate budget, by name, the start times it counts.
pub type Carried = BTreeMap<String, Vec<DateTime<Utc>>>;

/// The starts each rate budget counts now, as the leader carries them: its own
/// ([`World::starts`] it governs) and those it inherited, newest `rate.starts`
/// within `rate.per`.
pub fn carry(budgets: &[Budget], world: &World<'_>) -> Carried {
    let mut out = Carried::new();
    let mut room = MAX_STARTS;
    for b in budgets {
        let Some(rate) = b.rate else { continue };
        let mut counted = b.counted_starts(world);
        counted.reverse();
        counted.truncate((rate.starts as usize).min(room));
        counted.reverse();
        room -= counted.len();
        out.insert(b.name.clone(), counted);
    }
    out
}

/// The carried starts as the annotation holds them.
pub fn to_text(carried: &Carried) -> String {
    let millis: BTreeMap<&str, Vec<i64>> = carried
        .iter()
        .map(|(name, at)| {
            (
                name.as_str(),
                at.iter().map(|t| t.timestamp_millis()).collect(),
            )
        })
        .collect();
    serde_json::to_string(&millis).unwrap_or_default()
}

/// The annotation read back at a takeover (`None`: there was none, nothing is
/// known to have started). See the module's doc for how it fails closed.
pub fn from_text(text: Option<&str>, budgets: &[Budget], now: DateTime<Utc>) -> Carried {
    let Some(text) = text else {
        return Carried::new();
    };
    let parsed = (text.len() <= MAX_TEXT)
        .then(|| serde_json::from_str::<BTreeMap<String, Vec<i64>>>(text).ok())
        .flatten();
    let mut out = Carried::new();
    for b in budgets {
        let Some(rate) = b.rate else { continue };
        let starts: Vec<DateTime<Utc>> = match &parsed {
            // Unreadable: the rate is taken as used up now.
            None => vec![now; rate.starts as usize],
            Some(map) => map
                .get(&b.name)
                .map(|ms| {
                    let per = Span::from_std(rate.per).unwrap_or(Span::MAX);
                    let mut at: Vec<DateTime<Utc>> = ms
                        .iter()
                        .filter_map(|m| Utc.timestamp_millis_opt(*m).single())
                        .map(|t| t.min(now))
                        .filter(|t| *t > now - per)
                        .collect();
                    at.sort();
                    let keep = at.len().saturating_sub(rate.starts as usize);
                    at.drain(..keep);
                    at
                })
                .unwrap_or_default(),
        };
        out.insert(b.name.clone(), starts);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::{Nodes, Rate};
    use super::*;
    use std::time::Duration;

    fn rated(name: &str, starts: u32, per_secs: u64) -> Budget {
        Budget {
            rate: Some(Rate {
                starts,
                per: Duration::from_secs(per_secs),
            }),
            ..Budget::always(name, Nodes::Count(100))
        }
    }

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn read_back_it_is_what_was_carried_within_each_rate() {
        let budgets = [
            rated("four-per-ten", 4, 600),
            Budget::always("plain", Nodes::Count(1)),
        ];
        let carried: Carried = [("four-per-ten".to_string(), vec![at(10), at(20), at(30)])].into();
        let text = to_text(&carried);
        assert_eq!(from_text(Some(&text), &budgets, at(40)), carried);
        // Past the period, a start no longer counts.
        assert_eq!(
            from_text(Some(&text), &budgets, at(615))["four-per-ten"],
            vec![at(20), at(30)]
        );
        // A budget without a rate carries nothing; one the text does not name
        // starts afresh.
        let renamed = [rated("three-per-ten", 3, 600)];
        assert_eq!(
            from_text(Some(&text), &renamed, at(40)),
            [("three-per-ten".to_string(), vec![])].into()
        );
    }

    #[test]
    fn a_start_seen_and_inherited_counts_once_two_in_one_instant_twice() {
        let b = rated("r", 10, 600);
        let placed = super::super::Placed {
            group: "web".into(),
            ..Default::default()
        };
        let counted = |own: &[i64], inherited: &[i64]| {
            let starts: Vec<(DateTime<Utc>, super::super::Drain<'_>)> =
                own.iter().map(|s| (at(*s), placed.drain())).collect();
            let inherited: Carried =
                [("r".to_string(), inherited.iter().map(|s| at(*s)).collect())].into();
            b.counted_starts(&World {
                now: at(100),
                nodes: &[],
                draining: &[],
                starts: &starts,
                inherited: &inherited,
            })
            .len()
        };
        assert_eq!(counted(&[10, 10], &[]), 2, "two starts in one instant");
        assert_eq!(counted(&[10], &[10]), 1, "this replica's own, carried back");
        assert_eq!(counted(&[10, 10], &[10]), 2);
        assert_eq!(counted(&[10], &[10, 10]), 2);
        assert_eq!(counted(&[10], &[20, 30]), 3);
        // The carry is what is counted, newest `starts` of it.
        let three = rated("r", 3, 600);
        let starts: Vec<(DateTime<Utc>, super::super::Drain<'_>)> = [10, 20, 30, 40]
            .iter()
            .map(|s| (at(*s), placed.drain()))
            .collect();
        let none = Carried::new();
        let world = World {
            now: at(100),
            nodes: &[],
            draining: &[],
            starts: &starts,
            inherited: &none,
        };
        assert_eq!(carry(&[three], &world)["r"], vec![at(20), at(30), at(40)]);
    }

    #[test]
    fn it_fails_closed_and_stays_bounded() {
        let budgets = [rated("two-per-min", 2, 60)];
        // Nothing on the Lease: nothing known to have started.
        assert_eq!(from_text(None, &budgets, at(0)), Carried::new());
        // Unreadable (garbage, the wrong shape, too long): used up now.
        let used_up: Carried = [("two-per-min".to_string(), vec![at(0), at(0)])].into();
        for bad in [
            "{",
            "[1,2]",
            r#"{"two-per-min": ["x"]}"#,
            &"9".repeat(MAX_TEXT + 1),
        ] {
            assert_eq!(from_text(Some(bad), &budgets, at(0)), used_up, "{bad:.20}");
        }
        // From the future: now. More than the rate: its newest.
        let text =
            r#"{"two-per-min": [1800000000000, 1800000010000, 1800000020000, 1800009999000]}"#;
        assert_eq!(
            from_text(Some(text), &budgets, at(30))["two-per-min"],
            vec![at(20), at(30)]
        );
    }
}
