//! Issue 62: `undrain` gives a node back only when no drain runs for it.

use super::*;
use crate::scalein::decide::record::{
    DrainReason, DIRECT_MARK, MODE_ANNOTATION, STARTED_ANNOTATION,
};

fn at(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

const START: &str = "2026-11-27T07:00:00Z";

fn window(policy: DeadlinePolicy) -> Window {
    Window {
        limits: Limits {
            workload_deadline: Duration::from_secs(600),
            workload_policy: policy,
            hook_room: None,
        },
        after_deadline: Duration::from_secs(240),
    }
}

fn annotations(rec: &DrainRecord) -> BTreeMap<String, String> {
    BTreeMap::from([(record::ANNOTATION.to_string(), rec.to_json())])
}

fn one(why: Why, done: bool) -> DrainRecord {
    let mut r = DrainReason::new(why, at(START));
    r.done = done;
    DrainRecord {
        reasons: vec![r],
        ..DrainRecord::default()
    }
}

fn minutes(m: i64) -> DateTime<Utc> {
    at(START) + chrono::Duration::minutes(m)
}

/// No record: nothing runs (only marks, if any, to remove).
#[test]
fn a_node_without_a_record_is_given_back() {
    for p in [DeadlinePolicy::Abandon, DeadlinePolicy::Proceed] {
        assert_eq!(
            decide(&BTreeMap::new(), window(p), minutes(0)),
            Undo::GiveBack
        );
    }
}

/// A drain that drains and is not done is refused until its deadline (abandon: the
/// service gives it back itself then), or its deadline plus the DaemonSet and volume
/// phases (proceed); after that nobody runs it and it is given back.
#[test]
fn a_fresh_drain_is_refused_until_its_end_and_a_stale_one_given_back() {
    for why in [
        Why::DrainCommand,
        Why::ScaleIn,
        Why::Notice {
            notice: "rebalance_recommendation".into(),
            ends_at: None,
            daemonset_share_secs: 0,
        },
    ] {
        let a = annotations(&one(why.clone(), false));
        let deadline = minutes(10);
        match decide(&a, window(DeadlinePolicy::Abandon), minutes(3)) {
            Undo::Refuse(Running::Drain { reasons, until }) => {
                assert_eq!(reasons, [why.label()]);
                assert_eq!(until, deadline);
            }
            other => panic!("{why:?}: {other:?}"),
        }
        assert_eq!(
            decide(&a, window(DeadlinePolicy::Abandon), deadline),
            Undo::GiveBack,
            "{why:?}"
        );
        // Proceed: the DaemonSet and volume phases still run after the deadline.
        assert_eq!(
            decide(&a, window(DeadlinePolicy::Proceed), minutes(13)),
            Undo::Refuse(Running::Drain {
                reasons: vec![why.label()],
                until: minutes(14),
            }),
            "{why:?}"
        );
        assert_eq!(
            decide(&a, window(DeadlinePolicy::Proceed), minutes(14)),
            Undo::GiveBack
        );
        // Its drain finished (the node stays cordoned, the record done): given back.
        let done = annotations(&one(why.clone(), true));
        assert_eq!(
            decide(&done, window(DeadlinePolicy::Proceed), minutes(1)),
            Undo::GiveBack,
            "{why:?}"
        );
    }
}

/// An interruption notice's budget shortens the drain: past the budget's forced
/// deadline (and the phases after it) nothing runs.
#[test]
fn a_notice_budget_shortens_the_window() {
    let a = annotations(&one(
        Why::Notice {
            notice: "spot_interruption".into(),
            ends_at: Some(minutes(2)),
            daemonset_share_secs: 30,
        },
        false,
    ));
    // Forced at 1m30s, then proceeds for 4 more minutes.
    assert_eq!(
        decide(&a, window(DeadlinePolicy::Abandon), minutes(1)),
        Undo::Refuse(Running::Drain {
            reasons: vec!["interruption notice"],
            until: at("2026-11-27T07:05:30Z"),
        })
    );
    assert_eq!(
        decide(&a, window(DeadlinePolicy::Abandon), minutes(6)),
        Undo::GiveBack
    );
}

/// A rebalance cordon drains nothing: given back at once.
#[test]
fn a_rebalance_cordon_alone_is_given_back() {
    let a = annotations(&one(Why::Rebalance, false));
    assert_eq!(
        decide(&a, window(DeadlinePolicy::Proceed), minutes(0)),
        Undo::GiveBack
    );
}

/// Our hook holding the instance, or its action completed, is refused whatever the
/// deadline (the instance ends anyway), for as long as AWS keeps an action (48 h).
#[test]
fn a_held_or_ending_instance_is_refused_until_the_action_cannot_be_alive() {
    let hook = Why::Lifecycle {
        hook: "ca-asg-provider-drain".into(),
        by_ca: false,
    };
    let held = annotations(&one(hook.clone(), false));
    for m in [0, 11, 60, 47 * 60] {
        assert_eq!(
            decide(&held, window(DeadlinePolicy::Abandon), minutes(m)),
            Undo::Refuse(Running::Held {
                hook: "ca-asg-provider-drain".into()
            }),
            "{m}"
        );
    }
    let ended = annotations(&one(hook.clone(), true));
    assert_eq!(
        decide(&ended, window(DeadlinePolicy::Abandon), minutes(30)),
        Undo::Refuse(Running::Ending { at: at(START) })
    );
    for a in [&held, &ended] {
        assert_eq!(
            decide(a, window(DeadlinePolicy::Abandon), minutes(48 * 60)),
            Undo::GiveBack
        );
    }
    // A hook's hold joined to CA's scale-in is still the hook's.
    let mut both = one(Why::ScaleIn, false);
    both.reasons.push(DrainReason::new(hook, minutes(1)));
    assert!(matches!(
        decide(
            &annotations(&both),
            window(DeadlinePolicy::Abandon),
            minutes(30)
        ),
        Undo::Refuse(Running::Held { .. })
    ));
}

#[test]
fn a_node_in_a_warm_pool_is_refused() {
    let mut rec = one(
        Why::Lifecycle {
            hook: "h".into(),
            by_ca: false,
        },
        true,
    );
    rec.in_warm_pool_since = Some(minutes(5));
    assert_eq!(
        decide(
            &annotations(&rec),
            window(DeadlinePolicy::Abandon),
            minutes(60 * 72)
        ),
        Undo::Refuse(Running::WarmPool { since: minutes(5) })
    );
}

/// Fail closed: a record that does not read is refused, never taken for the older
/// annotations' drain nor for no drain.
#[test]
fn an_unreadable_record_is_refused() {
    let a = BTreeMap::from([
        (record::ANNOTATION.to_string(), "{not json".to_string()),
        (STARTED_ANNOTATION.to_string(), START.to_string()),
    ]);
    assert_eq!(
        decide(&a, window(DeadlinePolicy::Abandon), minutes(60)),
        Undo::Refuse(Running::Unreadable)
    );
}

/// An older version's marks (mode and start time, no record) are read by the one
/// reader: CA's direct scale-in, refused while fresh.
#[test]
fn an_older_versions_marks_are_read_as_the_drain_reads_them() {
    let a = BTreeMap::from([
        (STARTED_ANNOTATION.to_string(), START.to_string()),
        (MODE_ANNOTATION.to_string(), DIRECT_MARK.to_string()),
    ]);
    assert!(matches!(
        decide(&a, window(DeadlinePolicy::Abandon), minutes(5)),
        Undo::Refuse(Running::Drain { .. })
    ));
    assert_eq!(
        decide(&a, window(DeadlinePolicy::Abandon), minutes(10)),
        Undo::GiveBack
    );
}

/// Each refusal is one sentence naming what to wait for and how to force, with no
/// Rust Debug text.
#[test]
fn every_refusal_says_what_to_wait_for_and_how_to_force() {
    for r in [
        Running::Drain {
            reasons: vec!["drain command"],
            until: minutes(10),
        },
        Running::Held { hook: "h".into() },
        Running::Ending { at: minutes(0) },
        Running::WarmPool { since: minutes(0) },
        Running::Reclaimed {
            notice: "spot_interruption".into(),
            ends_at: minutes(2),
        },
        Running::Unreadable,
    ] {
        let s = r.sentence("n1");
        assert!(s.starts_with("node n1 is not given back: "), "{s}");
        assert!(s.contains("undrain n1 --force"), "{s}");
        assert!(
            !s.contains('\n') && !s.contains("Some(") && !s.contains("{ "),
            "{s}"
        );
    }
    assert!(Running::Drain {
        reasons: vec!["drain command"],
        until: minutes(10),
    }
    .sentence("n1")
    .contains("by 2026-11-27T07:10:00Z"));
}

/// Issue 69, defect 4: once a spot warning's drain finished, its reason reads done,
/// and `undrain` gave the node back although AWS reclaims the instance within the
/// two-minute warning: the scheduler then put pods on it. A notice whose end is
/// ahead is refused whether its drain runs, finished or was given up; once the end
/// passed (a scheduled reboot, the instance still in service) it is given back.
#[test]
fn a_node_whose_instance_a_notice_ends_is_refused_until_that_end() {
    let spot = Why::Notice {
        notice: "spot_interruption".into(),
        ends_at: Some(minutes(2)),
        daemonset_share_secs: 30,
    };
    let rebalance = Why::Notice {
        notice: "rebalance_recommendation".into(),
        ends_at: None,
        daemonset_share_secs: 0,
    };
    for policy in [DeadlinePolicy::Proceed, DeadlinePolicy::Abandon] {
        let done = annotations(&one(spot.clone(), true));
        assert_eq!(
            decide(&done, window(policy), minutes(1)),
            Undo::Refuse(Running::Reclaimed {
                notice: "spot_interruption".into(),
                ends_at: minutes(2),
            }),
            "{policy:?}: a finished spot drain, the reclaim ahead"
        );
        assert_eq!(
            decide(&done, window(policy), minutes(2)),
            Undo::GiveBack,
            "{policy:?}: the notice's end passed"
        );
        // A notice without an end (a rebalance drain that finished) ends nothing.
        assert_eq!(
            decide(
                &annotations(&one(rebalance.clone(), true)),
                window(policy),
                minutes(1)
            ),
            Undo::GiveBack
        );
        // Beside a finished drain of another kind, the earliest end is named.
        let mut rec = one(Why::DrainCommand, true);
        let mut notice = DrainReason::new(spot.clone(), at(START));
        notice.done = true;
        rec.reasons.push(notice);
        assert!(matches!(
            decide(&annotations(&rec), window(policy), minutes(1)),
            Undo::Refuse(Running::Reclaimed { .. })
        ));
    }
}
