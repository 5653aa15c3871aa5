use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};

use super::*;
use crate::scalein::decide::budget::cron::Cron;
use crate::scalein::decide::budget::{Groups, Nodes, Rate, Window};

fn at(h: u32, mi: u32) -> DateTime<Utc> {
    // Friday 27 November 2026.
    Utc.with_ymd_and_hms(2026, 11, 27, h, mi, 0).unwrap()
}

fn budget(name: &str, nodes: Nodes) -> Budget {
    Budget {
        name: name.into(),
        ..crate::scalein::decide::budget::tests::budget(nodes)
    }
}

/// Business hours, 09:00 to 17:00 UTC on weekdays, no disruption.
fn office(name: &str) -> Budget {
    Budget {
        window: Some(Window {
            schedule: Cron::parse("0 9 * * mon-fri").unwrap(),
            duration: Duration::from_secs(8 * 3600),
        }),
        ..budget(name, Nodes::Count(0))
    }
}

fn only(b: Budget, groups: &[&str]) -> Budget {
    Budget {
        groups: Groups::Named(groups.iter().map(|g| g.to_string()).collect()),
        ..b
    }
}

fn causes(b: Budget, c: &[Cause]) -> Budget {
    Budget {
        causes: Some(c.iter().copied().collect()),
        ..b
    }
}

const NO_TAGS: &BTreeMap<String, String> = &BTreeMap::new();

fn place(group: &str) -> Place<'_> {
    Place {
        group,
        zone: "z1",
        tags: NO_TAGS,
    }
}

/// web-0..2 and batch-0..2, the given emptiness for every node.
fn candidates(empty: Option<bool>) -> Vec<(String, &'static str, Option<bool>)> {
    ["web", "batch"]
        .iter()
        .flat_map(|g| (0..3).map(move |i| (format!("{g}-{i}"), *g, empty)))
        .collect()
}

fn decide(
    budgets: &[Budget],
    now: DateTime<Utc>,
    draining_in: &[&str],
    started: &[(DateTime<Utc>, &str)],
    nodes: &[(String, &'static str, Option<bool>)],
) -> BTreeMap<String, String> {
    let places: Vec<Place> = nodes.iter().map(|(_, g, _)| place(g)).collect();
    let drain = |g| Drain {
        place: place(g),
        causes: &[Cause::CaOccupied],
        exempt: false,
    };
    let draining: Vec<Drain> = draining_in.iter().map(|g| drain(g)).collect();
    let starts: Vec<(DateTime<Utc>, Drain)> = started.iter().map(|(t, g)| (*t, drain(g))).collect();
    let world = World {
        now,
        nodes: &places,
        draining: &draining,
        starts: &starts,
        inherited: &Default::default(),
    };
    let cands: Vec<Candidate> = nodes
        .iter()
        .map(|(n, g, e)| Candidate {
            node: n,
            place: place(g),
            empty: *e,
        })
        .collect();
    held(budgets, &world, &cands)
}

fn names(h: &BTreeMap<String, String>) -> Vec<&str> {
    h.keys().map(String::as_str).collect()
}

#[test]
fn a_closed_window_holds_the_groups_it_covers_and_no_other_and_nothing_once_open() {
    let b = [only(office("office"), &["web"])];
    let nodes = candidates(None);
    let during = decide(&b, at(10, 0), &[], &[], &nodes);
    assert_eq!(names(&during), ["web-0", "web-1", "web-2"]);
    assert!(during.values().all(|v| v == "office"));
    for outside in [at(8, 59), at(17, 0), at(23, 0)] {
        assert!(
            decide(&b, outside, &[], &[], &nodes).is_empty(),
            "{outside}"
        );
    }
}

#[test]
fn a_budget_without_room_holds_and_one_with_room_does_not() {
    let b = [only(budget("two", Nodes::Count(2)), &["web"])];
    let nodes = candidates(None);
    for (draining, held_web) in [
        (&[][..], false),
        (&["web"][..], false),
        (&["web", "batch"][..], false),
        (&["web", "web"][..], true),
        (&["web", "web", "web"][..], true),
    ] {
        let h = decide(&b, at(10, 0), draining, &[], &nodes);
        let want: Vec<&str> = if held_web {
            vec!["web-0", "web-1", "web-2"]
        } else {
            vec![]
        };
        assert_eq!(names(&h), want, "draining in {draining:?}");
    }
    // A percent of the nodes covered: 34% of 3 is 2 (rounded up).
    let pct = [only(budget("pct", Nodes::Percent(34)), &["web"])];
    assert!(decide(&pct, at(10, 0), &["web"], &[], &nodes).is_empty());
    assert_eq!(
        decide(&pct, at(10, 0), &["web", "web"], &[], &nodes).len(),
        3
    );
}

#[test]
fn a_used_rate_holds_until_a_start_leaves_its_period() {
    let b = [Budget {
        rate: Some(Rate {
            starts: 1,
            per: Duration::from_secs(600),
        }),
        ..budget("slow", Nodes::Count(100))
    }];
    let nodes = candidates(None);
    let started = [(at(10, 0), "batch")];
    assert_eq!(decide(&b, at(10, 5), &[], &started, &nodes).len(), 6);
    assert!(decide(&b, at(10, 10), &[], &started, &nodes).is_empty());
    assert!(decide(&b, at(10, 5), &[], &[], &nodes).is_empty());
}

#[test]
fn a_budget_for_other_causes_never_holds_ca() {
    for c in [
        Cause::AsgInstanceRefresh,
        Cause::AsgScaling,
        Cause::DrainCommand,
        Cause::WarmPool,
        Cause::Rebalance,
    ] {
        let b = [causes(office("office"), &[c])];
        assert!(
            decide(&b, at(10, 0), &[], &[], &candidates(None)).is_empty(),
            "{c:?}"
        );
    }
}

/// Per node by its pods; a node whose pods are not known is held by either budget.
#[test]
fn empty_and_occupied_are_told_apart_and_unknown_counts_as_both() {
    let cases = [
        (vec![Cause::CaEmpty], Some(true), true),
        (vec![Cause::CaEmpty], Some(false), false),
        (vec![Cause::CaEmpty], None, true),
        (vec![Cause::CaOccupied], Some(true), false),
        (vec![Cause::CaOccupied], Some(false), true),
        (vec![Cause::CaOccupied], None, true),
        (vec![Cause::CaEmpty, Cause::CaOccupied], Some(true), true),
        (vec![Cause::CaEmpty, Cause::CaOccupied], Some(false), true),
        (vec![Cause::CaEmpty, Cause::CaOccupied], None, true),
    ];
    for (c, empty, want) in cases {
        let b = [causes(office("office"), &c)];
        let h = decide(&b, at(10, 0), &[], &[], &candidates(empty));
        assert_eq!(h.len() == 6, want, "{c:?} on empty={empty:?}");
        assert!(h.is_empty() || h.len() == 6);
    }
    assert!(tells_empty_from_occupied(&[causes(
        office("o"),
        &[Cause::CaEmpty]
    )]));
    assert!(tells_empty_from_occupied(&[causes(
        office("o"),
        &[Cause::CaOccupied]
    )]));
    assert!(!tells_empty_from_occupied(&[causes(
        office("o"),
        &[Cause::CaEmpty, Cause::CaOccupied]
    )]));
    assert!(!tells_empty_from_occupied(&[office("o")]));
    assert!(!tells_empty_from_occupied(&[causes(
        office("o"),
        &[Cause::DrainCommand]
    )]));
}

#[test]
fn the_first_budget_that_holds_names_the_hold() {
    let b = [
        only(budget("roomy", Nodes::Count(50)), &["web"]),
        only(office("office"), &["web", "batch"]),
        only(office("late"), &["batch"]),
    ];
    let h = decide(&b, at(10, 0), &[], &[], &candidates(None));
    assert_eq!(h.len(), 6);
    assert!(h.values().all(|v| v == "office"), "{h:?}");
}

fn annotations(ours: Option<&str>, disabled: Option<&str>) -> BTreeMap<String, String> {
    let mut a = BTreeMap::from([("other".to_string(), "x".to_string())]);
    if let Some(o) = ours {
        a.insert(HELD_BY.into(), o.into());
    }
    if let Some(d) = disabled {
        a.insert(SCALE_DOWN_DISABLED.into(), d.into());
    }
    a
}

/// Applies a merge patch of annotations as the API server does.
fn apply(a: &BTreeMap<String, String>, c: &Change) -> BTreeMap<String, String> {
    let mut a = a.clone();
    let patch = c.patch();
    for (k, v) in patch["metadata"]["annotations"].as_object().unwrap() {
        match v.as_str() {
            Some(s) => {
                a.insert(k.clone(), s.to_string());
            }
            None => {
                a.remove(k);
            }
        }
    }
    a
}

/// Every state a Node can be in, every wish: only ours is ever released, an
/// operator's annotation is never taken over nor removed, what is written makes
/// the Node say the wish, and a Node that already says it is not written.
#[test]
fn only_transitions_are_written_and_an_operators_annotation_is_never_touched() {
    for ours in [None, Some("office"), Some("other")] {
        for disabled in [None, Some("true"), Some("false"), Some("")] {
            for want in [None, Some("office")] {
                let a = annotations(ours, disabled);
                let c = change(&a, want);
                let operators = ours.is_none() && disabled.is_some();
                let case = format!("ours={ours:?} disabled={disabled:?} want={want:?}: {c:?}");
                if operators {
                    assert_eq!(c, None, "{case}");
                    continue;
                }
                if ours.is_none() {
                    assert_ne!(c, Some(Change::Release), "{case}");
                }
                let after = c.as_ref().map_or(a.clone(), |c| apply(&a, c));
                assert_eq!(after.get("other").map(String::as_str), Some("x"), "{case}");
                match want {
                    Some(b) => {
                        assert_eq!(after.get(HELD_BY).map(String::as_str), Some(b), "{case}");
                        assert_eq!(
                            after.get(SCALE_DOWN_DISABLED).map(String::as_str),
                            Some("true"),
                            "{case}"
                        );
                    }
                    None => {
                        assert!(!after.contains_key(HELD_BY), "{case}");
                        assert!(!after.contains_key(SCALE_DOWN_DISABLED), "{case}");
                    }
                }
                assert_eq!(change(&after, want), None, "written twice: {case}");
                let already = want.is_some() == ours.is_some()
                    && (want.is_none() || (ours == want && disabled == Some("true")));
                assert_eq!(c.is_none(), already, "{case}");
                assert_eq!(is_ours(&a), ours.is_some());
            }
        }
    }
}
