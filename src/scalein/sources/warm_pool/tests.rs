use chrono::TimeZone;

use super::*;
use crate::scalein::decide::record::{DrainReason, Why};

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 25, 12, 0, 0).unwrap()
}

fn ago(secs: i64) -> DateTime<Utc> {
    now() - chrono::Duration::seconds(secs)
}

/// Every state AWS names (the pool's twelve, as the SDK lists them, included), and
/// one it does not.
fn states() -> Vec<LifecycleState> {
    [
        "Pending",
        "Pending:Wait",
        "Pending:Proceed",
        "Quarantined",
        "InService",
        "Terminating",
        "Terminating:Wait",
        "Terminating:Proceed",
        "Terminated",
        "Detaching",
        "Detached",
        "EnteringStandby",
        "Standby",
        "Something:New",
    ]
    .into_iter()
    .map(LifecycleState::parse)
    .chain(LifecycleState::pool_states())
    .collect()
}

fn lifecycle(at: DateTime<Utc>, done: bool) -> DrainReason {
    DrainReason {
        why: Why::Lifecycle {
            hook: "ours".into(),
            by_ca: false,
        },
        at,
        done,
    }
}

fn record(reasons: Vec<DrainReason>, in_pool: Option<DateTime<Utc>>) -> DrainRecord {
    DrainRecord {
        reasons,
        in_warm_pool_since: in_pool,
        ..DrainRecord::default()
    }
}

fn steps(r: &DrainRecord) -> Vec<(String, Step)> {
    let mut out: Vec<(String, Step)> = states()
        .iter()
        .map(|s| (s.as_str().to_string(), step(r, Some(s), now(), SETTLED)))
        .collect();
    out.push(("unknown to AWS".into(), step(r, None, now(), SETTLED)));
    out
}

fn only(r: &DrainRecord, want: Step, states: &[&str]) {
    for (state, got) in steps(r) {
        let expected = if states.contains(&state.as_str()) {
            want
        } else {
            Step::Nothing
        };
        assert_eq!(got, expected, "state {state}, record {r:?}");
    }
}

const BACK_IN_GROUP: [&str; 4] = ["Pending", "Pending:Wait", "Pending:Proceed", "InService"];

#[test]
fn a_completed_action_is_noted_only_once_the_instance_rests_in_the_pool() {
    let r = record(vec![lifecycle(ago(20), true)], None);
    only(
        &r,
        Step::InPool,
        &[
            "Warmed:Pending:Proceed",
            "Warmed:Stopped",
            "Warmed:Running",
            "Warmed:Hibernated",
        ],
    );
}

/// Taken back from the pool before any poll saw it rest (a running pool gives an
/// instance back within seconds; no replica may have led meanwhile): handed back
/// all the same, once a read can no longer be one from before the scale-in.
#[test]
fn a_node_taken_back_before_its_rest_was_seen_is_handed_back_once_settled() {
    let r = record(vec![lifecycle(ago(31), true)], None);
    for (state, got) in steps(&r) {
        let want = if BACK_IN_GROUP.contains(&state.as_str()) {
            Step::HandBack
        } else if [
            "Warmed:Pending:Proceed",
            "Warmed:Stopped",
            "Warmed:Running",
            "Warmed:Hibernated",
        ]
        .contains(&state.as_str())
        {
            Step::InPool
        } else {
            Step::Nothing
        };
        assert_eq!(got, want, "state {state}");
    }
    // A read right after the hold arrived may be one from before the scale-in.
    let fresh = record(vec![lifecycle(ago(29), true)], None);
    for state in BACK_IN_GROUP {
        assert_eq!(
            step(&fresh, Some(&LifecycleState::parse(state)), now(), SETTLED),
            Step::Nothing,
            "{state}"
        );
    }
    // Long after, too: the pool can keep an instance for days.
    let old = record(vec![lifecycle(ago(9 * 24 * 3600), true)], None);
    assert_eq!(
        step(&old, Some(&LifecycleState::InService), now(), SETTLED),
        Step::HandBack
    );
}

#[test]
fn the_node_is_handed_back_only_from_the_groups_own_states_once_settled() {
    let r = record(vec![lifecycle(ago(600), true)], Some(ago(31)));
    only(
        &r,
        Step::HandBack,
        &["Pending", "Pending:Wait", "Pending:Proceed", "InService"],
    );
    // The settle counts from the hold's arrival, not from when this service saw the
    // instance rest (issue 59: a fixed rest delayed the very scale-up the pool is
    // for): a scale-up a second after the rest was seen hands back at once...
    let rested_briefly = record(vec![lifecycle(ago(600), true)], Some(ago(1)));
    only(
        &rested_briefly,
        Step::HandBack,
        &["Pending", "Pending:Wait", "Pending:Proceed", "InService"],
    );
    // ...while a read soon after the hold arrived may still be one from before the
    // scale-in.
    let fresh = record(vec![lifecycle(ago(29), true)], Some(ago(5)));
    only(&fresh, Step::HandBack, &[]);
    // A rest older than any lifecycle action still hands back: the pool can keep
    // an instance for days.
    let old = record(
        vec![lifecycle(ago(5 * 24 * 3600), true)],
        Some(ago(4 * 24 * 3600)),
    );
    only(
        &old,
        Step::HandBack,
        &["Pending", "Pending:Wait", "Pending:Proceed", "InService"],
    );
}

#[test]
fn nothing_while_a_reason_drains() {
    // Our hook holds the instance again (a new scale-in), anywhere but back in the
    // group: its drain decides, not the pool.
    for in_pool in [None, Some(ago(600))] {
        let r = record(
            vec![lifecycle(ago(900), true), lifecycle(ago(10), false)],
            in_pool,
        );
        for (state, got) in steps(&r) {
            if !BACK_IN_GROUP.contains(&state.as_str()) {
                assert_eq!(got, Step::Nothing, "state {state}");
            }
        }
        // Another reason (a notice) drains: nothing anywhere.
        let notice = DrainReason::new(
            Why::Notice {
                notice: "spot_interruption".into(),
                ends_at: None,
                daemonset_share_secs: 0,
            },
            ago(5),
        );
        let r = record(vec![lifecycle(ago(900), true), notice], in_pool);
        only(&r, Step::HandBack, &[]);
    }
}

#[test]
fn nothing_for_a_drain_that_was_not_our_hooks() {
    // CA's direct scale-in and the drain command end no lifecycle action: their
    // instance never went to the pool through our hook.
    for why in [Why::ScaleIn, Why::DrainCommand, Why::Rebalance] {
        let r = record(
            vec![DrainReason {
                why,
                at: ago(120),
                done: true,
            }],
            None,
        );
        only(&r, Step::InPool, &[]);
    }
    // Our hook's action from past its longest life is not the one that sent the
    // instance to the pool now: no rest is noted for it (a node back in the group
    // is still handed back).
    let r = record(vec![lifecycle(ago(49 * 3600), true)], None);
    only(&r, Step::HandBack, &BACK_IN_GROUP);
}

/// Our action was completed but its note on the Node was lost (a refused write, a
/// crash right after CompleteLifecycleAction): the record still says our hook holds
/// the instance. Back in the group, no terminating action is pending, whatever the
/// record says: the node is handed back all the same, once settled.
#[test]
fn a_lost_note_of_the_completion_does_not_keep_a_reused_node_cordoned() {
    let r = record(vec![lifecycle(ago(31), false)], None);
    only(&r, Step::HandBack, &BACK_IN_GROUP);
    let fresh = record(vec![lifecycle(ago(29), false)], None);
    only(&fresh, Step::HandBack, &[]);
}
