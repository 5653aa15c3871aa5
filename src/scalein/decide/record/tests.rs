use std::collections::BTreeMap;

use super::*;

const MIN: i64 = 60;

fn t0() -> DateTime<Utc> {
    "2026-11-23T10:00:00Z".parse().unwrap()
}

fn at(secs: i64) -> DateTime<Utc> {
    t0() + chrono::Duration::seconds(secs)
}

fn limits(policy: DeadlinePolicy) -> Limits {
    Limits {
        workload_deadline: Duration::from_secs(10 * 60),
        workload_policy: policy,
        hook_room: None,
    }
}

fn spot(ends: i64) -> Why {
    Why::Notice {
        notice: "spot_interruption".into(),
        ends_at: Some(at(ends)),
        daemonset_share_secs: 20,
    }
}

fn hook() -> Why {
    Why::Lifecycle {
        hook: "ours".into(),
        by_ca: false,
    }
}

fn record(reasons: &[(Why, i64)], l: Limits) -> DrainRecord {
    let mut r = DrainRecord::default();
    for (why, secs) in reasons {
        r.join(DrainReason::new(why.clone(), at(*secs)), l);
    }
    r
}

/// Every kind of reason, with and without a budget.
fn kinds() -> Vec<Why> {
    vec![
        Why::Rebalance,
        Why::DrainCommand,
        Why::Notice {
            notice: "rebalance_recommendation".into(),
            ends_at: None,
            daemonset_share_secs: 0,
        },
        spot(120),
        spot(30 * MIN),
        Why::ScaleIn,
        hook(),
    ]
}

/// Every sequence of up to three reasons (arriving at 0, 5 and 61 minutes, in every
/// order), under both policies.
fn sequences() -> Vec<(Vec<(Why, i64)>, Limits)> {
    let times = [0, 5 * MIN, 61 * MIN];
    let mut out = Vec::new();
    for policy in [DeadlinePolicy::Proceed, DeadlinePolicy::Abandon] {
        let l = limits(policy);
        for a in kinds() {
            out.push((vec![(a.clone(), times[0])], l));
            for b in kinds() {
                for (ta, tb) in [(0, 1), (1, 0), (0, 2), (2, 0)] {
                    out.push((vec![(a.clone(), times[ta]), (b.clone(), times[tb])], l));
                    for c in kinds() {
                        out.push((
                            vec![
                                (a.clone(), times[ta]),
                                (b.clone(), times[tb]),
                                (c.clone(), times[2 - ta.min(1)]),
                            ],
                            l,
                        ));
                    }
                }
            }
        }
    }
    out
}

/// A reason's own workload deadline: ten minutes from its arrival.
fn own_deadline(arrived: i64) -> DateTime<Utc> {
    at(arrived + 10 * MIN)
}

#[test]
fn a_later_drain_never_inherits_an_earlier_cordon() {
    // The seen failure: `rebalance: cordon` marks the node; an hour later the ASG ends
    // it through the hook. The hook's drain gets its own ten minutes.
    let l = limits(DeadlinePolicy::Abandon);
    let r = record(&[(Why::Rebalance, 0), (hook(), 60 * MIN)], l);
    let p = r.plan(l);
    assert!(p.drains);
    assert_eq!(
        p.ends,
        End::Lifecycle {
            hook: "ours".into()
        }
    );
    assert_eq!(p.workload_deadline, Some(at(70 * MIN)));
    assert_eq!(p.on_deadline, DeadlinePolicy::Proceed);

    // After the same cordon a spot warning drains within its own two minutes.
    let r = record(&[(Why::Rebalance, 0), (spot(62 * MIN), 60 * MIN)], l);
    let p = r.plan(l);
    assert_eq!(p.workload_deadline, Some(at(62 * MIN - 20)));
    assert_eq!(p.on_deadline, DeadlinePolicy::Proceed);
    assert_eq!(p.ends, End::Leave);
    assert_eq!(p.budget_ends, Some(at(62 * MIN)));
}

#[test]
fn a_cordon_only_reason_never_drains_and_never_changes_a_drain() {
    for (seq, l) in sequences() {
        let r = record(&seq, l);
        let mut with = r.clone();
        let joined = with.join(DrainReason::new(Why::Rebalance, at(30 * MIN)), l);
        assert_eq!(joined, Joined::Same, "{seq:?}");
        assert_eq!(with.plan(l), r.plan(l), "{seq:?}");
    }
    let l = limits(DeadlinePolicy::Proceed);
    let p = record(&[(Why::Rebalance, 0)], l).plan(l);
    assert!(!p.drains);
    assert_eq!(p.workload_deadline, None);
}

#[test]
fn the_order_reasons_arrive_in_does_not_change_the_plan() {
    for (seq, l) in sequences() {
        let mut rev = seq.clone();
        rev.reverse();
        assert_eq!(record(&seq, l).plan(l), record(&rev, l).plan(l), "{seq:?}");
    }
}

#[test]
fn no_deadline_comes_before_the_deadline_of_every_reason_that_goes_on() {
    // "No workload pod is deleted around a PDB before that drain's own deadline":
    // the drain forces only at the earliest deadline of a reason that itself goes
    // on past its deadline, or when a budget (AWS's own end) comes first; a drain
    // that gives up does so only when its last reason would.
    for (seq, l) in sequences() {
        let p = record(&seq, l).plan(l);
        let drains: Vec<&(Why, i64)> = seq.iter().filter(|(w, _)| w.drains()).collect();
        assert_eq!(p.drains, !drains.is_empty(), "{seq:?}");
        let Some(deadline) = p.workload_deadline else {
            assert!(drains.is_empty(), "{seq:?}");
            continue;
        };
        let budget_force = seq
            .iter()
            .filter_map(|(w, _)| match w {
                Why::Notice {
                    ends_at: Some(e),
                    daemonset_share_secs,
                    ..
                } => Some(*e - chrono::Duration::seconds(*daemonset_share_secs as i64)),
                _ => None,
            })
            .min();
        // Earliest arrival per kind (a kind joins once).
        let own: Vec<(DateTime<Utc>, bool)> = drains
            .iter()
            .map(|(w, _)| {
                let first = seq
                    .iter()
                    .filter(|(o, _)| o.same_kind(w))
                    .map(|(_, t)| *t)
                    .min()
                    .unwrap();
                let goes_on = matches!(w, Why::Lifecycle { .. })
                    || l.workload_policy == DeadlinePolicy::Proceed;
                (own_deadline(first), goes_on)
            })
            .collect();
        let earliest_going_on = own.iter().filter(|(_, g)| *g).map(|(d, _)| *d).min();
        let latest_giving_up = own.iter().filter(|(_, g)| !*g).map(|(d, _)| *d).max();
        let expected = match (earliest_going_on, latest_giving_up) {
            (Some(d), _) => (d, DeadlinePolicy::Proceed),
            (None, Some(d)) => (d, DeadlinePolicy::Abandon),
            (None, None) => unreachable!(),
        };
        let expected = match budget_force {
            Some(b) if b < expected.0 => (b, DeadlinePolicy::Proceed),
            _ => expected,
        };
        assert_eq!((deadline, p.on_deadline), expected, "{seq:?}");
    }
}

#[test]
fn the_strongest_reason_decides_how_the_instance_ends() {
    for (seq, l) in sequences() {
        let p = record(&seq, l).plan(l);
        let has = |f: fn(&Why) -> bool| seq.iter().any(|(w, _)| f(w));
        let want = if has(|w| matches!(w, Why::Lifecycle { .. })) {
            End::Lifecycle {
                hook: "ours".into(),
            }
        } else if has(|w| *w == Why::ScaleIn) {
            End::Terminate
        } else {
            End::Leave
        };
        assert_eq!(p.ends, want, "{seq:?}");
    }
}

#[test]
fn a_budget_only_shortens_and_a_redelivery_never_lengthens() {
    let l = limits(DeadlinePolicy::Abandon);
    let mut r = record(&[(spot(30 * MIN), 0)], l);
    assert_eq!(r.plan(l).workload_deadline, Some(at(10 * MIN)));
    assert_eq!(r.plan(l).on_deadline, DeadlinePolicy::Abandon);
    // A spot warning (2 minutes) on a retirement's drain: the budget reaches it.
    assert_eq!(
        r.join(DrainReason::new(spot(3 * MIN), at(MIN)), l),
        Joined::Changed
    );
    let p = r.plan(l);
    assert_eq!(p.workload_deadline, Some(at(3 * MIN - 20)));
    assert_eq!(p.on_deadline, DeadlinePolicy::Proceed);
    // The same notice again, or a later budget: nothing moves.
    for later in [spot(3 * MIN), spot(40 * MIN)] {
        assert_eq!(
            r.join(DrainReason::new(later, at(2 * MIN)), l),
            Joined::Same
        );
        assert_eq!(r.plan(l), p);
    }
    // The reason keeps its first arrival.
    assert_eq!(r.reasons[0].at, at(0));
}

#[test]
fn a_hook_joining_a_drain_that_gives_up_makes_it_go_on_from_its_own_arrival() {
    let l = limits(DeadlinePolicy::Abandon);
    let mut r = record(&[(Why::DrainCommand, 0)], l);
    assert_eq!(
        r.join(DrainReason::new(hook(), at(9 * MIN)), l),
        Joined::Changed
    );
    let p = r.plan(l);
    assert_eq!(p.workload_deadline, Some(at(19 * MIN)));
    assert_eq!(p.on_deadline, DeadlinePolicy::Proceed);
}

#[test]
fn a_done_drain_does_not_hand_its_deadline_to_the_next_reason() {
    let l = limits(DeadlinePolicy::Proceed);
    let mut r = record(&[(Why::DrainCommand, 0)], l);
    r.mark_done();
    assert!(!r.plan(l).drains, "finished: nothing to resume");
    assert_eq!(
        r.join(DrainReason::new(hook(), at(60 * MIN)), l),
        Joined::Changed
    );
    assert_eq!(r.plan(l).workload_deadline, Some(at(70 * MIN)));
    // The same kind again after it was done starts afresh, at its new arrival.
    let mut r = record(&[(Why::DrainCommand, 0)], l);
    r.mark_done();
    assert_eq!(
        r.join(DrainReason::new(Why::DrainCommand, at(60 * MIN)), l),
        Joined::Changed
    );
    assert_eq!(r.plan(l).workload_deadline, Some(at(70 * MIN)));
    // A done notice's budget is still AWS's end of the instance.
    let mut r = record(&[(spot(2 * MIN), 0)], l);
    r.mark_done();
    r.join(DrainReason::new(hook(), at(MIN)), l);
    assert_eq!(r.plan(l).workload_deadline, Some(at(2 * MIN - 20)));
}

/// SQS delivers a notice again after its drain finished (the first delivery's
/// delete lost to a restart, a new leader, a refused write; or a replay): the
/// record is the memory that survives the process, and the same notice stays done,
/// so no second drain evicts the DaemonSet pods that came back to ship the node's
/// last logs. News (another notice, an earlier end) still drains afresh.
#[test]
fn the_same_notice_after_its_drain_is_done_stays_done() {
    let l = limits(DeadlinePolicy::Proceed);
    let rebalance_drain = || Why::Notice {
        notice: "rebalance_recommendation".into(),
        ends_at: None,
        daemonset_share_secs: 0,
    };
    let scheduled = |ends: i64| Why::Notice {
        notice: "scheduled_change".into(),
        ends_at: Some(at(ends)),
        daemonset_share_secs: 20,
    };
    // (done reason, the one that arrives, whether it is the same notice again)
    let cases = [
        (spot(2 * MIN), spot(2 * MIN), true),
        (spot(2 * MIN), spot(3 * MIN), true),
        (spot(2 * MIN), spot(MIN), false),
        (rebalance_drain(), rebalance_drain(), true),
        (rebalance_drain(), spot(2 * MIN), false),
        (spot(2 * MIN), scheduled(2 * MIN), false),
        (scheduled(30 * MIN), scheduled(30 * MIN), true),
        (scheduled(30 * MIN), scheduled(20 * MIN), false),
        (Why::DrainCommand, Why::DrainCommand, false),
        // Our hook's completed action, AWS still showing Terminating:Wait.
        (hook(), hook(), true),
        (Why::ScaleIn, Why::ScaleIn, false),
    ];
    for (done, new, same) in cases {
        let mut r = record(&[(done.clone(), 0)], l);
        r.mark_done();
        let before = r.clone();
        let joined = r.join(DrainReason::new(new.clone(), at(MIN)), l);
        if same {
            assert_eq!(joined, Joined::Same, "{done:?} then {new:?}");
            assert_eq!(r, before, "{done:?} then {new:?}: kept as it was, done");
            assert_eq!(r.drain_began(), None, "{done:?} then {new:?}");
        } else {
            assert_eq!(
                r.drain_began(),
                Some(at(MIN)),
                "{done:?} then {new:?}: afresh"
            );
        }
    }
    // Before its drain is done, the same notice joins it as always.
    let mut r = record(&[(spot(2 * MIN), 0)], l);
    assert_eq!(
        r.join(DrainReason::new(spot(2 * MIN), at(MIN)), l),
        Joined::Same
    );
    assert_eq!(r.drain_began(), Some(at(0)));
}

/// Issue 39 (suspected, proven): our hook's action was completed, and EKS's hook
/// holds the instance in Terminating:Wait a while yet. A restarted process or a new
/// leader, which does not remember the completion, sees the instance held: the
/// Node's record says the action was completed, and the hold joins as done, so
/// nothing drains the node a second time. Past the longest any action lasts, a hold
/// is a new action (an instance back from a warm pool whose record was not cleared
/// is not left undrained forever).
#[test]
fn a_completed_lifecycle_action_is_known_from_the_record_while_it_can_still_be_that_action() {
    let l = limits(DeadlinePolicy::Abandon);
    let mut r = record(&[(hook(), 0), (spot(10 * MIN), 30)], l);
    assert!(!r.lifecycle_completed(at(MIN)), "still draining");
    r.mark_done();
    assert!(r.lifecycle_completed(at(MIN)));
    let limit = LIFECYCLE_ACTION_LIMIT.as_secs() as i64;
    assert!(r.lifecycle_completed(at(limit - 1)));
    assert!(!r.lifecycle_completed(at(limit)));
    // The hold seen again: the same action, kept done.
    let before = r.clone();
    assert_eq!(
        r.join(DrainReason::new(hook(), at(5 * MIN)), l),
        Joined::Same
    );
    assert_eq!(r, before);
    assert!(!r.plan(l).drains);
    assert_eq!(
        r.plan(l).ends,
        End::Lifecycle {
            hook: "ours".into()
        }
    );
    // Past the limit: a new action, drained afresh from its own arrival.
    assert_eq!(
        r.join(DrainReason::new(hook(), at(limit)), l),
        Joined::Changed
    );
    assert_eq!(r.drain_began(), Some(at(limit)));
    assert!(!r.lifecycle_completed(at(limit)));
    // Nothing else is taken for a completed action.
    for why in kinds().into_iter().filter(|w| *w != hook()) {
        let mut r = record(&[(why.clone(), 0)], l);
        r.mark_done();
        assert!(!r.lifecycle_completed(at(MIN)), "{why:?}");
    }
}

/// Issue 39, 1: with `rebalance: drain`, a rebalance recommendation drains the node
/// and a spot warning joins; after the drain, the spot warning delivered again (a
/// restarted consumer, a new leader) is the same notice, not news. Before, the
/// record kept one notice name for both kinds and drained again.
#[test]
fn a_spot_warning_that_joined_a_rebalance_drain_is_known_again_after_it() {
    let l = limits(DeadlinePolicy::Proceed);
    let rebalance_drain = Why::Notice {
        notice: "rebalance_recommendation".into(),
        ends_at: None,
        daemonset_share_secs: 0,
    };
    let mut r = record(&[(rebalance_drain.clone(), 0)], l);
    r.join(DrainReason::new(spot(2 * MIN), at(30)), l);
    assert_eq!(r.reasons.len(), 2, "each notice kept as itself: {r:?}");
    assert_eq!(
        r.drain_began(),
        Some(at(0)),
        "the drain began with the rebalance"
    );
    assert_eq!(
        r.plan(l).budget_ends,
        Some(at(2 * MIN)),
        "the spot warning's budget binds"
    );
    r.mark_done();
    for again in [spot(2 * MIN), rebalance_drain] {
        let before = r.clone();
        assert_eq!(
            r.join(DrainReason::new(again.clone(), at(3 * MIN)), l),
            Joined::Same,
            "{again:?}"
        );
        assert_eq!(r, before, "{again:?}: stays done");
        assert_eq!(r.drain_began(), None, "{again:?}: nothing drains again");
    }
}

/// Issue 39, 2: a scheduled reboot drained the node; its time passed and the
/// instance stayed. A later scale-in with the `abandon` policy is bound by its own
/// deadline and policy, not by the finished notice's past budget (which forced an
/// immediate `proceed`: the pod behind a budget deleted, the instance ended). A
/// notice whose end is still ahead (a spot warning's reclaim) keeps binding.
#[test]
fn a_finished_notice_whose_time_passed_binds_no_later_drain() {
    let l = limits(DeadlinePolicy::Abandon);
    let reboot = Why::Notice {
        notice: "scheduled_change".into(),
        ends_at: Some(at(10 * MIN)),
        daemonset_share_secs: 20,
    };
    let mut r = record(&[(reboot.clone(), 0)], l);
    r.mark_done();
    r.join(DrainReason::new(Why::ScaleIn, at(60 * MIN)), l);
    let p = r.plan(l);
    assert_eq!(p.workload_deadline, Some(own_deadline(60 * MIN)), "{p:?}");
    assert_eq!(p.on_deadline, DeadlinePolicy::Abandon, "{p:?}");
    assert_eq!(p.budget_ends, None, "{p:?}");
    // A done notice ending after the new drain began still binds it.
    let mut r = record(&[(spot(70 * MIN), 0)], l);
    r.mark_done();
    r.join(DrainReason::new(Why::ScaleIn, at(60 * MIN)), l);
    let p = r.plan(l);
    assert_eq!(p.budget_ends, Some(at(70 * MIN)), "{p:?}");
    assert_eq!(p.on_deadline, DeadlinePolicy::Proceed, "{p:?}");
    assert!(p.workload_deadline.unwrap() < at(70 * MIN), "{p:?}");
}

#[test]
fn abandoning_a_scale_in_keeps_the_other_reasons() {
    let l = limits(DeadlinePolicy::Abandon);
    let mut r = record(&[(Why::ScaleIn, 0)], l);
    assert!(
        !r.without_scale_in(),
        "nothing else: the node is given back"
    );
    let mut r = record(&[(Why::Rebalance, 0), (Why::ScaleIn, MIN)], l);
    assert!(r.without_scale_in());
    assert_eq!(r.mark(), super::REBALANCE_MARK);
    assert!(!r.plan(l).drains);
}

#[test]
fn the_record_survives_the_node_and_older_marks_are_read() {
    let l = limits(DeadlinePolicy::Abandon);
    let r = record(
        &[(Why::Rebalance, 0), (spot(2 * MIN), MIN), (hook(), 2 * MIN)],
        l,
    );
    let mut a = BTreeMap::new();
    a.insert(ANNOTATION.to_string(), r.to_json());
    assert_eq!(DrainRecord::read(&a, at(10 * MIN)), Some(r.clone()));
    assert_eq!(r.mark(), super::LIFECYCLE_MARK);
    assert_eq!(r.first_at(), Some(at(0)));

    // A mark from before the record: its mode and start time.
    for (mode, why) in [
        ("rebalance", Why::Rebalance),
        ("drain-only", Why::DrainCommand),
        ("direct", Why::ScaleIn),
        (
            "lifecycle",
            Why::Lifecycle {
                hook: "".into(),
                by_ca: false,
            },
        ),
        // A newer version's mode: drained, the instance left (never a decrement).
        ("something-else", Why::DrainCommand),
    ] {
        let mut a = BTreeMap::new();
        a.insert(
            super::STARTED_ANNOTATION.to_string(),
            "2026-11-23T10:00:00Z".to_string(),
        );
        a.insert(super::MODE_ANNOTATION.to_string(), mode.to_string());
        let r = DrainRecord::read(&a, t0()).unwrap();
        assert_eq!(r.reasons, vec![DrainReason::new(why, at(0))], "{mode}");
        // A garbled record falls back to the same reading, never to "no drain".
        a.insert(ANNOTATION.to_string(), "{not json".into());
        assert_eq!(DrainRecord::read(&a, t0()).unwrap(), r, "{mode}");
    }
    assert_eq!(DrainRecord::read(&BTreeMap::new(), t0()), None);
}

#[test]
fn times_at_the_edge_of_the_calendar_do_not_panic() {
    let l = Limits {
        workload_deadline: Duration::from_secs(u64::MAX / 4),
        workload_policy: DeadlinePolicy::Abandon,
        hook_room: None,
    };
    let far = Why::Notice {
        notice: "spot_interruption".into(),
        ends_at: Some(DateTime::<Utc>::MAX_UTC),
        daemonset_share_secs: u64::MAX,
    };
    let mut r = DrainRecord::default();
    r.join(DrainReason::new(far, DateTime::<Utc>::MIN_UTC), l);
    r.join(DrainReason::new(hook(), DateTime::<Utc>::MAX_UTC), l);
    let p = r.plan(l);
    assert!(p.drains);
}

/// A rebalance cordon an hour before the hook: the drain began with the hook, not the
/// cordon (which pods are replacements counts from it); finished reasons neither.
#[test]
fn the_drain_begins_with_the_reason_that_drains() {
    let l = limits(DeadlinePolicy::Abandon);
    let r = record(&[(Why::Rebalance, 0), (hook(), 60 * MIN)], l);
    assert_eq!(r.first_at(), Some(at(0)));
    assert_eq!(r.drain_began(), Some(at(60 * MIN)));
    assert_eq!(r.plan(l).workload_deadline, Some(at(70 * MIN)));
    let only_cordon = record(&[(Why::Rebalance, 0)], l);
    assert_eq!(only_cordon.drain_began(), None);
    let mut done = record(&[(Why::DrainCommand, 0)], l);
    done.mark_done();
    done.join(DrainReason::new(Why::Rebalance, at(MIN)), l);
    assert_eq!(done.drain_began(), None, "a finished drain begins nothing");
    done.join(DrainReason::new(spot(3 * MIN), at(2 * MIN)), l);
    assert_eq!(done.drain_began(), Some(at(2 * MIN)));
}

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Values read back from a Node are bounded once, where they are read: a share past
/// what configuration allows, a reason from the future, a start time nobody can read
/// (now, never the epoch: that would put every deadline in the past).
#[test]
fn values_read_back_are_bounded() {
    let now = at(0);
    let json = r#"{"reasons":[{"kind":"notice","notice":"spot_interruption","ends_at":"2026-11-23T10:02:00Z","daemonset_share_secs":10000000000000000000,"at":"2026-11-23T10:00:00Z"},{"kind":"lifecycle","hook":"ours","at":"2999-01-01T00:00:00Z"}]}"#;
    let r = DrainRecord::read(&annotations(&[(ANNOTATION, json)]), now).unwrap();
    let Why::Notice {
        daemonset_share_secs,
        ..
    } = &r.reasons[0].why
    else {
        panic!("{r:?}")
    };
    assert_eq!(*daemonset_share_secs, MAX_DAEMONSET_SHARE.as_secs());
    assert_eq!(r.reasons[1].at, now, "no reason arrives in the future");

    for garbled in ["", "yesterday", "0", "not-a-time"] {
        let r = DrainRecord::read(
            &annotations(&[(STARTED_ANNOTATION, garbled), (MODE_ANNOTATION, "direct")]),
            now,
        )
        .unwrap();
        assert_eq!(
            r.reasons,
            vec![DrainReason::new(Why::ScaleIn, now)],
            "{garbled:?}"
        );
        let p = r.plan(limits(DeadlinePolicy::Proceed));
        assert_eq!(p.workload_deadline, Some(at(10 * MIN)), "{garbled:?}");
    }
}

/// Whatever a Node carries, reading it never panics, and what is read is bounded:
/// no reason after now, no share past the maximum, the plan computable.
mod read_back {
    use super::*;
    use proptest::prelude::*;

    /// Mostly what the field holds (so many records parse), sometimes anything.
    fn time() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => (-10_000_000_000i64..10_000_000_000i64).prop_map(|s| format!("\"{}\"", at(s).to_rfc3339())),
            1 => Just("\"+262143-12-31T23:59:59Z\"".to_string()),
            1 => Just("\"-262143-01-01T00:00:00Z\"".to_string()),
            1 => any::<String>(),
        ]
    }

    fn share() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => any::<u64>().prop_map(|n| n.to_string()),
            1 => Just("1e19".to_string()),
            1 => Just("-1".to_string()),
            1 => any::<String>(),
        ]
    }

    fn reason_json() -> impl Strategy<Value = String> {
        (
            prop_oneof![
                Just("rebalance"),
                Just("drain-command"),
                Just("notice"),
                Just("scale-in"),
                Just("lifecycle"),
                Just("from-a-newer-version"),
            ],
            time(),
            prop_oneof![Just("null".to_string()), time()],
            share(),
            prop_oneof![3 => Just("\"ours\"".to_string()), 1 => any::<String>()],
            any::<bool>(),
        )
            .prop_map(|(kind, at, ends, share, hook, done)| {
                format!(
                    r#"{{"kind":"{kind}","at":{at},"notice":"spot","ends_at":{ends},"daemonset_share_secs":{share},"hook":{hook},"done":{done}}}"#
                )
            })
    }

    fn record_json() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            proptest::collection::vec(reason_json(), 0..4)
                .prop_map(|rs| format!(r#"{{"reasons":[{}]}}"#, rs.join(","))),
        ]
    }

    proptest! {
        #[test]
        fn reading_a_node_never_panics_and_is_bounded(
            json in proptest::option::of(record_json()),
            started in proptest::option::of(prop_oneof![any::<String>(), Just("2026-11-23T10:00:00Z".to_string()), Just("+262143-12-31T23:59:59Z".to_string())]),
            mode in proptest::option::of(prop_oneof![any::<String>(), Just("direct".to_string()), Just("lifecycle".to_string())]),
            policy in prop_oneof![Just(DeadlinePolicy::Proceed), Just(DeadlinePolicy::Abandon)],
            deadline_secs in 0u64..u64::MAX,
        ) {
            let now = at(0);
            let mut a = BTreeMap::new();
            if let Some(j) = json { a.insert(ANNOTATION.to_string(), j); }
            if let Some(s) = started { a.insert(STARTED_ANNOTATION.to_string(), s); }
            if let Some(m) = &mode { a.insert(MODE_ANNOTATION.to_string(), m.clone()); }
            let Some(r) = DrainRecord::read(&a, now) else {
                prop_assert!(!a.contains_key(STARTED_ANNOTATION));
                return Ok(());
            };
            prop_assert!(!r.reasons.is_empty());
            for reason in &r.reasons {
                prop_assert!(reason.at <= now);
                if let Why::Notice { daemonset_share_secs, .. } = &reason.why {
                    prop_assert!(*daemonset_share_secs <= MAX_DAEMONSET_SHARE.as_secs());
                }
            }
            // Only a mode this version wrote for it is read as CA's direct scale-in.
            if r.has_scale_in() && !a.contains_key(ANNOTATION) {
                prop_assert!(mode.is_none() || mode.as_deref() == Some(DIRECT_MARK));
            }
            let l = Limits { workload_deadline: Duration::from_secs(deadline_secs), workload_policy: policy, hook_room: None };
            let p = r.plan(l);
            prop_assert!(p.daemonset_share <= MAX_DAEMONSET_SHARE);
            prop_assert_eq!(p.drains, r.drain_began().is_some());
            let _ = r.to_json();
        }
    }
}

#[test]
fn the_node_shows_the_strongest_reasons_mode_whatever_the_order() {
    let l = limits(DeadlinePolicy::Abandon);
    let cases: [(&[(Why, i64)], &str); 5] = [
        (&[(Why::Rebalance, 0)], REBALANCE_MARK),
        (&[(spot(100), 0), (Why::Rebalance, 1)], INTERRUPTION_MARK),
        (
            &[(Why::ScaleIn, 0), (spot(100), 1), (Why::Rebalance, 2)],
            DIRECT_MARK,
        ),
        (
            &[(hook(), 0), (Why::ScaleIn, 1), (Why::Rebalance, 2)],
            LIFECYCLE_MARK,
        ),
        (
            &[(Why::DrainCommand, 0), (Why::Rebalance, 1)],
            DRAIN_ONLY_MARK,
        ),
    ];
    for (reasons, want) in cases {
        assert_eq!(record(reasons, l).mark(), want, "{reasons:?}");
        let mut reversed = reasons.to_vec();
        reversed.reverse();
        assert_eq!(record(&reversed, l).mark(), want, "{reversed:?}");
    }
    assert_eq!(DrainRecord::default().mark(), REBALANCE_MARK);
}

#[test]
fn each_reason_has_the_name_events_and_the_docs_use() {
    let names: Vec<&str> = [
        Why::Rebalance,
        Why::DrainCommand,
        spot(100),
        Why::ScaleIn,
        hook(),
    ]
    .iter()
    .map(Why::label)
    .collect();
    assert_eq!(
        names,
        [
            "rebalance cordon",
            "drain command",
            "interruption notice",
            "CA scale-in",
            "lifecycle hook"
        ]
    );
}

/// Issue 39: EC2 says the instance stopped or ended. The reasons that only drain it
/// and leave it to AWS are done (nothing left to protect; the next poll must not
/// resume them); CA's scale-in and our hook still decide how it ends.
#[test]
fn a_stopped_instance_closes_only_the_reasons_that_leave_it_to_aws() {
    let l = limits(DeadlinePolicy::Proceed);
    for why in kinds() {
        let mut r = record(&[(why.clone(), 0)], l);
        let changed = r.instance_left(at(60));
        let leaves = matches!(why, Why::Notice { .. } | Why::DrainCommand);
        assert_eq!(changed, leaves, "{why:?}");
        let still = !matches!(why, Why::Rebalance) && !leaves;
        assert_eq!(r.plan(l).drains, still, "{why:?}");
        assert!(
            !r.instance_left(at(60)),
            "{why:?}: a second stop changes nothing"
        );
    }
    let mut r = record(&[(spot(2 * MIN), 0), (Why::ScaleIn, 30)], l);
    assert!(r.instance_left(at(60)));
    assert!(r.plan(l).drains);
    assert_eq!(r.plan(l).ends, End::Terminate);
    assert_eq!(
        r.drain_began(),
        Some(at(30)),
        "CA's scale-in from its own arrival"
    );
}

/// Issue 69: each drain of a node has a number, and its end is written with it. A
/// reason that drains, joining a record on which nothing drains, begins the next
/// drain; reasons joining a running drain keep its number; an end is the running
/// drain's; a record an older version wrote (unnumbered, no end) reads as drain 0.
#[test]
fn each_drain_has_a_number_and_its_end_is_written_with_it() {
    let l = limits(DeadlinePolicy::Abandon);
    let mut r = DrainRecord::default();
    assert_eq!(DrainRecord::drain_joined(None), Some(1));
    r.join(DrainReason::new(Why::Rebalance, at(0)), l);
    assert_eq!(r.drain, 0, "a cordon is no drain");
    assert_eq!(DrainRecord::drain_joined(Some(&r)), Some(1));
    r.join(DrainReason::new(Why::DrainCommand, at(10)), l);
    assert_eq!(r.drain, 1);
    assert_eq!(
        DrainRecord::drain_joined(Some(&r)),
        Some(1),
        "joins the running one"
    );
    r.join(DrainReason::new(spot(30 * MIN), at(20)), l);
    assert_eq!(
        r.drain, 1,
        "a reason joining a running drain keeps its number"
    );
    r.end(How::Drained, at(60));
    assert_eq!(r.end_of(1).map(|e| &e.how), Some(&How::Drained));
    assert_eq!(r.end_of(2), None);
    assert!(!r.plan(l).drains);
    assert_eq!(DrainRecord::drain_joined(Some(&r)), Some(2));
    // The same notice again is no news and begins nothing.
    r.join(DrainReason::new(spot(30 * MIN), at(70)), l);
    assert_eq!(r.drain, 1);
    r.join(DrainReason::new(Why::ScaleIn, at(80)), l);
    assert_eq!(r.drain, 2, "the next drain");
    assert_eq!(
        r.end_of(1).map(|e| &e.how),
        Some(&How::Drained),
        "kept until it ends"
    );
    r.without_scale_in();
    r.end(
        How::Abandoned {
            why: "deadline".into(),
        },
        at(90),
    );
    assert_eq!(r.end_of(1), None);
    assert!(matches!(
        r.end_of(2).map(|e| &e.how),
        Some(How::Abandoned { .. })
    ));
    // Read back as written.
    let json = r.to_json();
    let back =
        DrainRecord::read(&BTreeMap::from([(ANNOTATION.to_string(), json)]), at(100)).unwrap();
    assert_eq!(back, r);
    // An end noted without closing the reasons (CA's direct scale-in terminated).
    let mut d = record(&[(Why::ScaleIn, 0)], l);
    d.note_end(How::Ending, at(30));
    assert!(d.plan(l).drains && d.has_scale_in());
    assert_eq!(d.end_of(1).map(|e| &e.how), Some(&How::Ending));
    // A stopped instance ends a drain that leaves it to AWS.
    let mut n = record(&[(spot(2 * MIN), 0)], l);
    assert!(n.instance_left(at(30)));
    assert_eq!(n.end_of(1).map(|e| &e.how), Some(&How::InstanceLeft));
    // An older version's record: unnumbered, its running drain followed the old way.
    let old = r#"{"reasons":[{"kind":"drain-command","at":"2026-11-23T10:00:00Z"}]}"#;
    let old = DrainRecord::read(
        &BTreeMap::from([(ANNOTATION.to_string(), old.to_string())]),
        at(100),
    )
    .unwrap();
    assert_eq!((old.drain, old.ended.clone()), (0, None));
    assert_eq!(DrainRecord::drain_joined(Some(&old)), None);
}

/// An end read back from a Node is parsed once and bounded: one this version cannot
/// read (a newer version's) is none and the reasons still read; a long `why` or
/// notice kind is cut; an end dated in the future is now.
#[test]
fn an_end_read_back_is_bounded_and_an_unknown_one_is_none() {
    let read =
        |json: String| DrainRecord::read(&BTreeMap::from([(ANNOTATION.to_string(), json)]), at(0));
    let unknown = r#"{"reasons":[{"kind":"drain-command","at":"2026-11-23T10:00:00Z"}],"drain":3,"ended":{"drain":3,"how":"vanished","at":"2026-11-23T10:00:00Z"}}"#;
    let r = read(unknown.to_string()).expect("the reasons still read");
    assert_eq!((r.drain, r.ended), (3, None));
    let long = "x".repeat(5 * MAX_WHY);
    let json = serde_json::json!({
        "reasons": [{"kind": "notice", "notice": "y".repeat(1000), "at": "2026-11-23T10:00:00Z"}],
        "drain": 2,
        "ended": {"drain": 2, "how": "failed", "why": long, "at": "2099-01-01T00:00:00Z"},
    });
    let r = read(json.to_string()).unwrap();
    let e = r.ended.unwrap();
    assert_eq!(e.at, at(0));
    match e.how {
        How::Failed { why } => assert_eq!(why.chars().count(), MAX_WHY),
        other => panic!("{other:?}"),
    }
    match &r.reasons[0].why {
        Why::Notice { notice, .. } => assert_eq!(notice.chars().count(), MAX_NOTICE),
        other => panic!("{other:?}"),
    }
}

fn kept(deadline_min: u64, policy: DeadlinePolicy, room_min: Option<u64>) -> Limits {
    Limits {
        workload_deadline: Duration::from_secs(deadline_min * 60),
        workload_policy: policy,
        hook_room: room_min.map(|m| Duration::from_secs(m * 60)),
    }
}

/// `reasons` joined, then kept with `l` by the engine that runs the drain.
fn kept_record(reasons: &[(Why, i64)], l: Limits) -> DrainRecord {
    let mut r = record(reasons, l);
    r.keep(l);
    r
}

/// Issue 72: a drain keeps the deadline it began with (its group's then); a
/// reader with other settings (another group's, a changed file, `status`) plans
/// the same deadline, and only the next drain takes new settings.
#[test]
fn a_drain_keeps_the_deadline_it_began_with() {
    let group = kept(60, DeadlinePolicy::Abandon, None);
    let cluster = kept(10, DeadlinePolicy::Proceed, None);
    // Nothing drains: nothing is kept.
    let mut cordoned = record(&[(Why::Rebalance, 0)], group);
    cordoned.keep(group);
    assert_eq!(cordoned.limits, None);
    // The `drain` command's cordon keeps nothing; the engine running it does.
    let mut r = record(&[(Why::ScaleIn, 0)], group);
    assert_eq!(r.limits, None);
    r.keep(group);
    assert_eq!(r.limits, Some(group));
    // Kept once: another engine's settings do not move it.
    r.keep(cluster);
    assert_eq!(r.limits, Some(group));
    for reader in [group, cluster] {
        let p = r.plan(reader);
        assert_eq!(p.workload_deadline, Some(at(60 * MIN)));
        assert_eq!(p.on_deadline, DeadlinePolicy::Abandon);
        assert_eq!(p.kept, group);
    }
    // A second reason joining the running drain keeps it too.
    r.join(DrainReason::new(Why::DrainCommand, at(5 * MIN)), cluster);
    r.keep(cluster);
    assert_eq!(r.limits, Some(group));
    // The next drain forgets it and takes the settings it begins with.
    r.mark_done();
    r.join(DrainReason::new(Why::ScaleIn, at(70 * MIN)), cluster);
    assert_eq!(r.limits, None);
    r.keep(cluster);
    assert_eq!(r.limits, Some(cluster));
    assert_eq!(r.plan(group).workload_deadline, Some(at(80 * MIN)));
    // A record an older version wrote keeps none: the reader's settings decide.
    let mut old = r.clone();
    old.limits = None;
    assert_eq!(old.plan(group).workload_deadline, Some(at(130 * MIN)));
}

/// Issue 72: a hold of our hook ends at the hook's global timeout whatever the
/// drain does, so its workload deadline is never later than the room the hook
/// leaves; the plan says when the hook set it.
#[test]
fn a_hold_of_our_hook_gets_no_more_than_the_room_its_timeout_leaves() {
    for (deadline, room, want, cut) in [
        (10, Some(5), 5, true),
        (10, Some(20), 10, false),
        (10, Some(10), 10, false),
        (10, None, 10, false),
        (60, Some(0), 0, true),
    ] {
        let l = kept(deadline, DeadlinePolicy::Abandon, room);
        let p = kept_record(&[(hook(), 0)], l).plan(l);
        assert_eq!(
            p.workload_deadline,
            Some(at(want * MIN)),
            "{deadline} {room:?}"
        );
        assert_eq!(p.cut_by_hook, cut, "{deadline} {room:?}");
        assert_eq!(p.on_deadline, DeadlinePolicy::Proceed);
    }
    // The room binds only lifecycle reasons: a drain command's deadline is its own.
    let l = kept(10, DeadlinePolicy::Abandon, Some(2));
    let p = kept_record(&[(Why::DrainCommand, 0)], l).plan(l);
    assert_eq!(p.workload_deadline, Some(at(10 * MIN)));
    assert!(!p.cut_by_hook);
    // A spot warning earlier than the hook's room decides: the hook did not.
    let p = kept_record(
        &[(hook(), 0), (spot(60), 0)],
        kept(10, DeadlinePolicy::Proceed, Some(5)),
    )
    .plan(l);
    assert_eq!(p.workload_deadline, Some(at(40)));
    assert!(!p.cut_by_hook);
}

/// Issue 72: our hook's hold joining a drain that began without one (CA's direct
/// scale-in, then the ASG's own hook) brings the hook's room into the kept limits.
#[test]
fn a_hook_joining_a_running_drain_brings_its_room() {
    let mut r = kept_record(
        &[(Why::ScaleIn, 0)],
        kept(10, DeadlinePolicy::Proceed, None),
    );
    assert_eq!(r.limits.unwrap().hook_room, None);
    let held = kept(30, DeadlinePolicy::Proceed, Some(3));
    r.join(DrainReason::new(hook(), at(MIN)), held);
    r.keep(held);
    let k = r.limits.unwrap();
    assert_eq!(
        k.workload_deadline,
        Duration::from_secs(600),
        "the drain's own deadline stays"
    );
    assert_eq!(k.hook_room, Some(Duration::from_secs(180)));
    let p = r.plan(kept(10, DeadlinePolicy::Proceed, None));
    assert_eq!(p.workload_deadline, Some(at(4 * MIN)));
    assert!(p.cut_by_hook);
}

/// What a Node carries is read back bounded: a deadline past what AWS could hold,
/// or one unreadable, reads as none (the reader's settings decide) and the rest of
/// the record is kept.
#[test]
fn a_kept_deadline_is_read_back_bounded() {
    let r = kept_record(&[(hook(), 0)], kept(10, DeadlinePolicy::Proceed, Some(5)));
    let text = serde_json::to_string(&r).unwrap();
    assert!(
        text.contains(
            r#""limits":{"workloadDeadlineMs":600000,"policy":"proceed","hookRoomMs":300000}"#
        ),
        "{text}"
    );
    let back: DrainRecord = serde_json::from_str(&text).unwrap();
    assert_eq!(back, r);
    for bad in [
        r#"{"workloadDeadlineMs":999999999999,"policy":"proceed"}"#,
        r#"{"workloadDeadlineMs":600000,"policy":"proceed","hookRoomMs":172800001}"#,
        r#"{"workloadDeadlineMs":-1,"policy":"proceed"}"#,
        r#"{"workloadDeadlineMs":600000,"policy":"later"}"#,
        r#""600s""#,
    ] {
        let text = text.replace(
            r#"{"workloadDeadlineMs":600000,"policy":"proceed","hookRoomMs":300000}"#,
            bad,
        );
        let back: DrainRecord = serde_json::from_str(&text).expect(bad);
        assert_eq!(back.limits, None, "{bad}");
        assert_eq!(back.reasons, r.reasons, "{bad}");
    }
}

/// CA's ask rides on our hook's reason (issue 71): written only when true, so a record
/// of before reads as it always did (not CA's); a hold found by the lifecycle scan
/// joining CA's keeps CA's word, whichever came first.
#[test]
fn a_hold_ca_asked_for_says_so_and_keeps_saying_it() {
    let ca = DrainReason::new(hook(), at(0)).asked_by_ca();
    assert!(matches!(ca.why, Why::Lifecycle { by_ca: true, .. }));
    let plain = serde_json::to_string(&DrainReason::new(hook(), at(0))).unwrap();
    assert!(!plain.contains("by_ca"), "{plain}");
    let written = serde_json::to_string(&ca).unwrap();
    assert!(written.contains("\"by_ca\":true"), "{written}");
    let back: DrainReason = serde_json::from_str(&written).unwrap();
    assert_eq!(back, ca);
    let old: DrainReason = serde_json::from_str(&plain).unwrap();
    assert!(matches!(old.why, Why::Lifecycle { by_ca: false, .. }));
    // Any other reason is left as it was.
    for why in kinds()
        .into_iter()
        .filter(|w| !matches!(w, Why::Lifecycle { .. }))
    {
        assert_eq!(DrainReason::new(why.clone(), at(0)).asked_by_ca().why, why);
    }
    let l = limits(DeadlinePolicy::Proceed);
    for order in [
        [ca.clone(), DrainReason::new(hook(), at(5))],
        [DrainReason::new(hook(), at(5)), ca.clone()],
    ] {
        let mut r = DrainRecord::default();
        for reason in order {
            r.join(reason, l);
        }
        assert_eq!(r.reasons.len(), 1, "{r:?}");
        assert!(
            matches!(r.reasons[0].why, Why::Lifecycle { by_ca: true, .. }),
            "{r:?}"
        );
        assert_eq!(r.reasons[0].at, at(0));
    }
}
