//! What a rate remembers across leaders (issue 71): the starts each budget with a
//! `rate` counted, carried on the leader's Lease so that a restart or a new leader
//! does not start counting afresh. Pure: the text in, the map out, and back.
//!
//! The text is JSON, one list of starts per rate budget by name (each `[Unix
//! milliseconds, instance id]`), each list its budget's newest `rate.starts` within
//! `rate.per`: at most the sum of the rates' `starts`, capped at [`MAX_STARTS`]. The
//! instance tells a drain resumed after a restart (or run again) from a new one: it
//! started already, so the rate neither holds it again nor counts it twice
//! ([`already_started`]). Read back, it is bounded
//! and fails closed: text that does not parse (or is too long) reads as every rate
//! used up at the takeover, so each rate's budget waits one period rather than let a
//! burst through; a budget it does not name (renamed, new) starts afresh; a start
//! from the future (another replica's clock) counts as now.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration as Span, TimeZone, Utc};

use super::Budget;

/// The Lease annotation that carries it.
pub const ANNOTATION: &str = "ca-asg-provider.io/rate-starts";

/// At most this many starts are carried in all (the annotation stays small).
pub const MAX_STARTS: usize = 2_000;

/// At most this much text is read back.
pub const MAX_TEXT: usize = 64 * 1024;

/// Per rate budget, by name, the starts it counts: when, and which instance.
pub type Carried = BTreeMap<String, Vec<(DateTime<Utc>, String)>>;

/// A start as the gate keeps it: when, the drain's facts, the instance.
pub type OwnStart<'a> = (DateTime<Utc>, super::Drain<'a>, &'a str);

/// Instance ids longer than this are not carried (an EC2 id is 19 characters).
const MAX_ID: usize = 64;

/// When `instance`'s drain started within `budget`'s rate period, if it did (this
/// replica's own start, or one the last leader carried): its drain is resumed or run
/// again, not a new start.
pub fn already_started(
    budget: &Budget,
    instance: &str,
    own: &[OwnStart<'_>],
    inherited: &Carried,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let rate = budget.rate?;
    let per = Span::from_std(rate.per).unwrap_or(Span::MAX);
    let within = |at: &DateTime<Utc>| *at > now - per && *at <= now;
    own.iter()
        .filter(|(at, _, id)| *id == instance && within(at))
        .map(|(at, _, _)| *at)
        .chain(
            inherited
                .get(&budget.name)
                .into_iter()
                .flatten()
                .filter(|(at, id)| id == instance && within(at))
                .map(|(at, _)| *at),
        )
        .min()
}

/// The starts each rate budget counts now, as the leader carries them: its own it
/// governs and those it inherited, once each by instance and time, newest
/// `rate.starts` within `rate.per`.
pub fn carry(
    budgets: &[Budget],
    own: &[OwnStart<'_>],
    inherited: &Carried,
    now: DateTime<Utc>,
) -> Carried {
    let mut out = Carried::new();
    let mut room = MAX_STARTS;
    for b in budgets {
        let Some(rate) = b.rate else { continue };
        let per = Span::from_std(rate.per).unwrap_or(Span::MAX);
        let within = |at: &DateTime<Utc>| *at > now - per && *at <= now;
        let mut all: Vec<(DateTime<Utc>, String)> = own
            .iter()
            .filter(|(at, d, _)| within(at) && b.governs(d))
            .map(|(at, _, id)| (*at, id.to_string()))
            .chain(
                inherited
                    .get(&b.name)
                    .into_iter()
                    .flatten()
                    .filter(|(at, _)| within(at))
                    .cloned(),
            )
            .collect();
        all.sort();
        all.dedup_by(|a, b| a.0.timestamp_millis() == b.0.timestamp_millis() && a.1 == b.1);
        let keep = all.len().saturating_sub((rate.starts as usize).min(room));
        all.drain(..keep);
        room -= all.len();
        out.insert(b.name.clone(), all);
    }
    out
}

/// The carried starts as the annotation holds them.
pub fn to_text(carried: &Carried) -> String {
    let millis: BTreeMap<&str, Vec<(i64, &str)>> = carried
        .iter()
        .map(|(name, starts)| {
            (
                name.as_str(),
                starts
                    .iter()
                    .map(|(t, id)| (t.timestamp_millis(), id.as_str()))
                    .collect(),
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
        .then(|| serde_json::from_str::<BTreeMap<String, Vec<(i64, String)>>>(text).ok())
        .flatten()
        .filter(|m| m.values().flatten().all(|(_, id)| id.len() <= MAX_ID));
    let mut out = Carried::new();
    for b in budgets {
        let Some(rate) = b.rate else { continue };
        let starts: Vec<(DateTime<Utc>, String)> = match &parsed {
            // Unreadable: the rate is taken as used up now (by no instance).
            None => vec![(now, String::new()); rate.starts as usize],
            Some(map) => map
                .get(&b.name)
                .map(|ms| {
                    let per = Span::from_std(rate.per).unwrap_or(Span::MAX);
                    let mut at: Vec<(DateTime<Utc>, String)> = ms
                        .iter()
                        .filter_map(|(m, id)| {
                            Some((Utc.timestamp_millis_opt(*m).single()?.min(now), id.clone()))
                        })
                        .filter(|(t, _)| *t > now - per)
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
    use super::super::{Nodes, Placed, Rate, World};
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

    fn s(secs: i64, id: &str) -> (DateTime<Utc>, String) {
        (at(secs), id.to_string())
    }

    #[test]
    fn read_back_it_is_what_was_carried_within_each_rate() {
        let budgets = [
            rated("four-per-ten", 4, 600),
            Budget::always("plain", Nodes::Count(1)),
        ];
        let carried: Carried = [(
            "four-per-ten".to_string(),
            vec![s(10, "i-1"), s(20, "i-2"), s(30, "i-3")],
        )]
        .into();
        let text = to_text(&carried);
        assert_eq!(from_text(Some(&text), &budgets, at(40)), carried);
        // Past the period, a start no longer counts.
        assert_eq!(
            from_text(Some(&text), &budgets, at(615))["four-per-ten"],
            vec![s(20, "i-2"), s(30, "i-3")]
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
    fn it_fails_closed_and_stays_bounded() {
        let budgets = [rated("two-per-min", 2, 60)];
        // Nothing on the Lease: nothing known to have started.
        assert_eq!(from_text(None, &budgets, at(0)), Carried::new());
        // Unreadable (garbage, the wrong shape, an id too long, too long): used up now.
        let used_up: Carried = [("two-per-min".to_string(), vec![s(0, ""), s(0, "")])].into();
        let long_id = format!(
            r#"{{"two-per-min": [[1800000000000, "{}"]]}}"#,
            "i".repeat(65)
        );
        for bad in [
            "{",
            "[1,2]",
            r#"{"two-per-min": [1800000000000]}"#,
            &long_id,
            &"9".repeat(MAX_TEXT + 1),
        ] {
            assert_eq!(from_text(Some(bad), &budgets, at(0)), used_up, "{bad:.30}");
        }
        // From the future: now. More than the rate: its newest.
        let text = r#"{"two-per-min": [[1800000000000, "a"], [1800000010000, "b"], [1800000020000, "c"], [1800009999000, "d"]]}"#;
        assert_eq!(
            from_text(Some(text), &budgets, at(30))["two-per-min"],
            vec![s(20, "c"), s(30, "d")]
        );
    }

    #[test]
    fn a_drain_resumed_or_run_again_started_already() {
        let b = rated("r", 1, 600);
        let placed = Placed {
            group: "web".into(),
            ..Default::default()
        };
        let own: Vec<OwnStart<'_>> = vec![(at(10), placed.drain(), "i-own")];
        let inherited: Carried = [("r".to_string(), vec![s(20, "i-old")])].into();
        let now = at(100);
        assert_eq!(
            already_started(&b, "i-own", &own, &inherited, now),
            Some(at(10))
        );
        assert_eq!(
            already_started(&b, "i-old", &own, &inherited, now),
            Some(at(20))
        );
        assert_eq!(already_started(&b, "i-new", &own, &inherited, now), None);
        // Past the period it is a new start; a budget without a rate has none.
        assert_eq!(
            already_started(&b, "i-own", &own, &inherited, at(611)),
            None
        );
        let plain = Budget::always("r", Nodes::Count(1));
        assert_eq!(
            already_started(&plain, "i-own", &own, &inherited, now),
            None
        );
    }

    #[test]
    fn a_start_seen_and_inherited_counts_once_two_in_one_instant_twice() {
        let b = rated("r", 10, 600);
        let placed = Placed {
            group: "web".into(),
            ..Default::default()
        };
        let counted = |own: &[i64], inherited: &[i64]| {
            let starts: Vec<(DateTime<Utc>, super::super::Drain<'_>)> =
                own.iter().map(|s| (at(*s), placed.drain())).collect();
            let inherited: Carried = [(
                "r".to_string(),
                inherited.iter().map(|t| s(*t, "i")).collect(),
            )]
            .into();
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
        // The carry is what is counted, newest `starts` of it, once each.
        let three = rated("r", 3, 600);
        let own: Vec<OwnStart<'_>> = [(10, "a"), (20, "b"), (30, "c"), (40, "d")]
            .iter()
            .map(|(t, id)| (at(*t), placed.drain(), *id))
            .collect();
        let inherited: Carried = [("r".to_string(), vec![s(40, "d")])].into();
        assert_eq!(
            carry(&[three], &own, &inherited, at(100))["r"],
            vec![s(20, "b"), s(30, "c"), s(40, "d")]
        );
    }
}
