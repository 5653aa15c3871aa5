//! Issue 62: `drain NODE` says each phase once, and while pods keep it, which pods
//! and which budgets, every few seconds.

use super::*;

fn row(phase: Phase, blocked: &[(&str, &[&str])]) -> Row {
    Row {
        node: "n1".into(),
        group: None,
        reasons: vec!["drain command".into()],
        phase,
        started: None,
        elapsed_seconds: None,
        blocked_by: blocked
            .iter()
            .map(|(p, b)| Blocker {
                pod: p.to_string(),
                budgets: b.iter().map(|s| s.to_string()).collect(),
                never: None,
                terminating: None,
            })
            .collect(),
        deadline: None,
        deadline_policy: None,
        instance_ends_at: None,
        unreadable: None,
        ended: None,
        condition: None,
        deadline_said: None,
        load_balancers: None,
    }
}

#[test]
fn each_phase_is_said_once_and_the_blockers_every_few_seconds() {
    let t0 = Instant::now();
    let s = |n: u64| t0 + Duration::from_secs(n);
    let mut n = Narrator::new("n1", Duration::from_secs(10));
    assert!(
        n.observe(None, 0, s(0)).is_empty(),
        "no record yet: nothing"
    );
    let blocked = row(
        Phase::Workloads,
        &[("shop/app", &["shop/app-pdb"]), ("shop/cart", &[])],
    );
    assert_eq!(
        n.observe(Some(&blocked), 0, s(2)),
        [
            "cordoned n1: nothing new is scheduled there",
            "evicting 2 pods (DaemonSet pods last)"
        ]
    );
    // Not yet due; then every 10 s, naming the pods and the budget.
    assert!(n.observe(Some(&blocked), 0, s(4)).is_empty());
    assert!(n.observe(Some(&blocked), 0, s(11)).is_empty());
    let said = n.observe(Some(&blocked), 0, s(12));
    assert_eq!(
        said,
        ["waiting for 2 pods: shop/app (PodDisruptionBudget shop/app-pdb allows no disruption now); shop/cart"]
    );
    assert!(n.observe(Some(&blocked), 0, s(14)).is_empty());
    let one = row(Phase::Workloads, &[("shop/app", &["a/x", "a/y"])]);
    assert_eq!(
        n.observe(Some(&one), 0, s(22)),
        ["waiting for 1 pod: shop/app (PodDisruptionBudgets a/x, a/y allow no disruption now)"]
    );
    // The phases after it, each once.
    // Issue 74: the DaemonSet phase names its pods, then every 10 s those still
    // there, never a workload pod.
    let ds = row(
        Phase::Daemonsets,
        &[("logging/fluentd-x", &[]), ("monitoring/exporter-y", &[])],
    );
    assert_eq!(
        n.observe(Some(&ds), 0, s(24)),
        ["workload pods gone; evicting the DaemonSet pods: logging/fluentd-x, monitoring/exporter-y"]
    );
    assert!(n.observe(Some(&ds), 0, s(33)).is_empty());
    let ds1 = row(Phase::Daemonsets, &[("logging/fluentd-x", &[])]);
    assert_eq!(
        n.observe(Some(&ds1), 0, s(34)),
        ["waiting for 1 DaemonSet pod: logging/fluentd-x"]
    );
    assert!(n.observe(Some(&ds1), 0, s(40)).is_empty());
    let drained = row(Phase::Drained, &[]);
    assert_eq!(
        n.observe(Some(&drained), 1, s(42)),
        ["pods gone; waiting for 1 volume attachment to detach"]
    );
    assert!(n.observe(Some(&drained), 1, s(60)).is_empty());
    assert_eq!(n.observe(Some(&drained), 0, s(62)), ["volumes detached"]);
    assert!(n.observe(Some(&drained), 0, s(64)).is_empty());
    assert!(n
        .observe(Some(&row(Phase::Finished, &[])), 0, s(66))
        .is_empty());
}

/// Issue 74: every waiting line says how long the phase has waited, of how long,
/// and what its deadline's policy does then: the workload phase from the record
/// (the plan's own words), the DaemonSet phase from when it was seen.
#[test]
fn each_waiting_line_says_the_time_waited_and_the_deadline_with_its_policy() {
    let t0 = Instant::now();
    let s = |n: u64| t0 + Duration::from_secs(n);
    let mut n = Narrator::new("n1", Duration::from_secs(10))
        .daemonset_deadline(Duration::from_secs(120), DeadlinePolicy::Proceed);
    let began: DateTime<Utc> = "2026-11-27T07:00:00Z".parse().unwrap();
    let plan = record::Plan {
        drains: true,
        ends: record::End::Leave,
        workload_deadline: Some(began + chrono::Duration::seconds(600)),
        on_deadline: DeadlinePolicy::Abandon,
        budget_ends: None,
        daemonset_share: Duration::ZERO,
        began: Some(began),
        cut_by_hook: false,
        kept: record::Limits {
            workload_deadline: Duration::from_secs(600),
            workload_policy: DeadlinePolicy::Abandon,
            hook_room: None,
        },
    };
    let mut blocked = row(Phase::Workloads, &[("shop/app", &["shop/app-pdb"])]);
    blocked.started = Some(began);
    blocked.elapsed_seconds = Some(80);
    blocked.deadline = plan.workload_deadline;
    blocked.deadline_said = Some(plan.deadline_said());
    n.observe(Some(&blocked), 0, s(0));
    assert_eq!(
        n.observe(Some(&blocked), 0, s(10)),
        ["waiting for 1 pod: shop/app (PodDisruptionBudget shop/app-pdb allows no disruption now); \
          waited 1m20s of 10m0s, workload deadline 2026-11-27T07:10:00Z (then the drain is abandoned and the node given back)"]
    );
    let mut ds = row(Phase::Daemonsets, &[("logging/fluentd-x", &[])]);
    ds.deadline_said = blocked.deadline_said.clone();
    n.observe(Some(&ds), 0, s(12));
    assert_eq!(
        n.observe(Some(&ds), 0, s(22)),
        ["waiting for 1 DaemonSet pod: logging/fluentd-x; \
          waited 10s of 2m0s, the DaemonSet pods' deadline (then what is left is deleted with its own grace period)"]
    );
    // Nothing drains: no deadline to say.
    let mut none = row(Phase::Workloads, &[("shop/app", &[])]);
    none.elapsed_seconds = Some(5);
    assert_eq!(none.waited(), None);
}

#[test]
fn a_quick_drain_says_cordoned_then_pods_gone() {
    let t0 = Instant::now();
    let mut n = Narrator::new("n1", Duration::from_secs(10));
    assert_eq!(
        n.observe(Some(&row(Phase::Drained, &[])), 0, t0),
        ["cordoned n1: nothing new is scheduled there", "pods gone"]
    );
}

/// An Event as the service's recorder writes it about node `node`.
fn event(uid: &str, node: &str, kind: &str, reason: &str, count: Option<i32>) -> EventV1 {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::EventSeries;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    let at = |s: i64| MicroTime(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
    EventV1 {
        metadata: ObjectMeta {
            uid: Some(uid.into()),
            ..Default::default()
        },
        type_: Some(kind.into()),
        reason: Some(reason.into()),
        note: Some(format!("{reason} of {uid}")),
        reporting_controller: Some(crate::scalein::kube::events::REPORTER.into()),
        regarding: Some(ObjectReference {
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..Default::default()
        }),
        event_time: Some(at(1_000)),
        series: count.map(|count| EventSeries {
            count,
            last_observed_time: at(1_000 + i64::from(count)),
        }),
        ..Default::default()
    }
}

/// `drain NODE` relays the service's warnings on the node: each once, again when it
/// recurs, never what was there before the command began, never another node's, a
/// Normal Event, another controller's or a blocked eviction (the narrator names
/// those pods already).
#[test]
fn the_services_warnings_on_the_node_are_relayed_once_and_when_they_recur() {
    let before = event("u-old", "n1", "Warning", "DrainFailed", None);
    let mut w = Warnings::primed("n1", std::slice::from_ref(&before));
    let mut old_again = before.clone();
    assert!(
        w.observe(std::slice::from_ref(&before)).is_empty(),
        "primed"
    );

    let deadline = event("u-1", "n1", "Warning", "DeadlineHit", None);
    let mut other = event("u-2", "n1", "Warning", "DrainFailed", None);
    other.reporting_controller = Some("kubelet".into());
    let said = w.observe(&[
        before.clone(),
        deadline.clone(),
        other,
        event("u-3", "n2", "Warning", "DrainFailed", None),
        event("u-4", "n1", "Normal", "DrainStarted", None),
        event("u-5", "n1", "Warning", "EvictionBlocked", None),
    ]);
    assert_eq!(said, vec!["warning: DeadlineHit: DeadlineHit of u-1"]);
    assert!(
        w.observe(std::slice::from_ref(&deadline)).is_empty(),
        "said once"
    );

    // The old one recurring is news; so is the new one's series counting up.
    old_again.series = event("u-old", "n1", "Warning", "DrainFailed", Some(2)).series;
    let failed_again = event("u-1", "n1", "Warning", "DeadlineHit", Some(3));
    assert_eq!(
        w.observe(&[old_again.clone(), failed_again.clone()]),
        vec![
            "warning: DrainFailed (2 times): DrainFailed of u-old",
            "warning: DeadlineHit (3 times): DeadlineHit of u-1",
        ],
        "in the order the service said them"
    );
    assert!(w.observe(&[old_again, failed_again]).is_empty());

    // A drain given up: said, and remembered as why; one that was there before the
    // command is not.
    assert_eq!(w.abandoned(), None);
    let primed_abandon = event("u-a0", "n1", "Warning", "DrainAbandoned", None);
    let mut fresh = Warnings::primed("n1", std::slice::from_ref(&primed_abandon));
    assert!(fresh
        .observe(std::slice::from_ref(&primed_abandon))
        .is_empty());
    assert_eq!(fresh.abandoned(), None, "an earlier drain's");
    let gave_up = How::Abandoned { why: "x".into() };
    assert!(!fresh.heard_last_word(&gave_up), "an earlier drain's");
    assert!(
        fresh.heard_last_word(&How::Drained),
        "no last word to wait for"
    );
    let given_up = event("u-a1", "n1", "Warning", "DrainAbandoned", None);
    assert_eq!(
        fresh.observe(&[primed_abandon, given_up]),
        vec!["warning: DrainAbandoned: DrainAbandoned of u-a1"]
    );
    assert_eq!(fresh.abandoned(), Some("DrainAbandoned of u-a1"));
    assert!(fresh.heard_last_word(&gave_up));
    assert!(
        !fresh.heard_last_word(&How::Failed { why: "x".into() }),
        "a failed drain's last word is DrainFailed"
    );

    // A pod's kind of object with the node's name is not the node.
    let mut pod = event("u-6", "n1", "Warning", "DrainFailed", None);
    pod.regarding.as_mut().unwrap().kind = Some("Pod".into());
    assert!(w.observe(&[pod]).is_empty());
    // Without a uid nothing can be told apart: not relayed.
    let mut anonymous = event("u-7", "n1", "Warning", "DrainFailed", None);
    anonymous.metadata.uid = None;
    assert!(w.observe(&[anonymous]).is_empty());
}

/// A flood of warnings says a bounded number of lines and how many it left out.
#[test]
fn a_flood_of_warnings_is_bounded() {
    let mut w = Warnings::primed("n1", &[]);
    let many: Vec<EventV1> = (0..WARNINGS_PER_LOOK + 5)
        .map(|i| {
            event(
                &format!("u-{i:03}"),
                "n1",
                "Warning",
                "PodNotWaitedFor",
                None,
            )
        })
        .collect();
    let said = w.observe(&many);
    assert_eq!(said.len(), WARNINGS_PER_LOOK + 1);
    assert_eq!(
        said.last().unwrap(),
        "(and 5 more warning(s): `kubectl describe node n1`)"
    );
}

/// Any text, often with control characters (a terminal's escapes among them).
fn text() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    prop_oneof![
        any::<String>(),
        proptest::collection::vec(proptest::char::range('\0', '\u{a0}'), 0..300)
            .prop_map(String::from_iter),
        // Right-to-left overrides, isolates and zero-width marks among letters.
        proptest::collection::vec(
            prop_oneof![
                proptest::char::range('a', 'z'),
                proptest::char::range('\u{200B}', '\u{200F}'),
                proptest::char::range('\u{202A}', '\u{202E}'),
                proptest::char::range('\u{2066}', '\u{2069}'),
                Just('\u{FEFF}'),
                Just('\u{061C}'),
            ],
            0..300
        )
        .prop_map(String::from_iter),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 256,
        failure_persistence: None,
        // The same cases on every run: a failure replays.
        rng_seed: proptest::test_runner::RngSeed::Fixed(62),
        ..Default::default()
    })]

    /// Events are anyone's to write: whatever their reason and note, relaying them
    /// never panics, prints no control character (a terminal's escapes) and stays
    /// bounded per line and per look.
    #[test]
    fn relayed_warnings_are_printable_and_bounded(
        notes in proptest::collection::vec(
            (text(), text(), 1i32..5),
            0..40,
        ),
    ) {
        let mut w = Warnings::primed("n1", &[]);
        let events: Vec<EventV1> = notes
            .iter()
            .enumerate()
            .map(|(i, (reason, note, count))| {
                let mut e = event(&format!("u-{i}"), "n1", "Warning", "DrainFailed", Some(*count));
                e.reason = Some(reason.clone());
                e.note = Some(note.repeat(3));
                e
            })
            .collect();
        let said = w.observe(&events);
        proptest::prop_assert!(said.len() <= WARNINGS_PER_LOOK + 1);
        for line in &said {
            proptest::prop_assert!(!line.chars().any(char::is_control), "{line:?}");
            // Issue 69: nor a format character that makes a line read as another.
            proptest::prop_assert!(!line.chars().any(is_format), "{line:?}");
            proptest::prop_assert!(line.chars().count() <= 128 + 1024 + 40, "{}", line.len());
        }
    }
}

/// Issue 69: what a follower decides, from the record alone, for every shape the
/// record can have: not recorded yet, running, ended (each way), given back (gone, or
/// numbered from the start again), passed by a later drain, stopped without an end.
#[test]
fn a_follower_decides_from_the_record_alone() {
    use crate::scalein::decide::record::{DrainReason, Why};
    let t: DateTime<Utc> = "2026-11-27T07:00:00Z".parse().unwrap();
    let l = Limits {
        workload_deadline: Duration::from_secs(600),
        workload_policy: crate::scalein::DeadlinePolicy::Abandon,
        hook_room: None,
    };
    let running = |n: u64| {
        let mut r = DrainRecord::default();
        r.join(DrainReason::new(Why::DrainCommand, t), l);
        r.drain = n;
        r
    };
    let ended = |n: u64, how: How| {
        let mut r = running(n);
        r.end(how, t);
        r
    };
    let abandoned = How::Abandoned { why: "w".into() };
    let cases: Vec<(Option<DrainRecord>, u64, bool, Followed)> = vec![
        (None, 1, false, Followed::NotYet),
        (None, 1, true, Followed::GivenBack),
        (Some(running(1)), 1, false, Followed::Runs),
        (Some(running(1)), 1, true, Followed::Runs),
        (Some(running(1)), 2, false, Followed::NotYet),
        (Some(running(1)), 2, true, Followed::GivenBack),
        (Some(running(3)), 2, true, Followed::Passed(3)),
        (
            Some(ended(2, How::Drained)),
            2,
            true,
            Followed::Ended(How::Drained),
        ),
        (
            Some(ended(2, How::Ending)),
            2,
            false,
            Followed::Ended(How::Ending),
        ),
        (
            Some(ended(2, abandoned.clone())),
            2,
            true,
            Followed::Ended(abandoned.clone()),
        ),
        (Some(ended(1, How::Drained)), 2, false, Followed::NotYet),
        (Some(ended(3, How::Drained)), 2, true, Followed::Passed(3)),
        (
            Some({
                let mut r = running(2);
                r.mark_done();
                r
            }),
            2,
            true,
            Followed::Stopped,
        ),
    ];
    for (record, drain, seen, want) in cases {
        assert_eq!(
            followed(record.as_ref(), drain, seen),
            want,
            "{record:?} following {drain}, seen {seen}"
        );
    }
}

/// Issue 73: drained, while the instance waits to be out of the load balancers, the
/// wait is said every few seconds with how long it has lasted.
#[test]
fn a_wait_for_the_load_balancers_is_said_every_few_seconds() {
    let mut n = Narrator::new("n1", Duration::from_secs(10));
    let t0 = Instant::now();
    let mut drained = row(Phase::Drained, &[]);
    assert_eq!(
        n.observe(Some(&drained), 0, t0).len(),
        2,
        "cordoned, pods gone"
    );
    assert!(n.observe(Some(&drained), 0, t0).is_empty());
    drained.load_balancers =
        Some("waiting for 1 target group to deregister, 5 s of at most 330 s".into());
    assert_eq!(
        n.observe(Some(&drained), 0, t0 + Duration::from_secs(1)),
        vec!["waiting for 1 target group to deregister, 5 s of at most 330 s".to_string()]
    );
    assert!(n
        .observe(Some(&drained), 0, t0 + Duration::from_secs(5))
        .is_empty());
    assert_eq!(
        n.observe(Some(&drained), 0, t0 + Duration::from_secs(11))
            .len(),
        1
    );
}

#[test]
fn with_daemonsets_kept_the_workload_line_says_they_stay() {
    let s = |secs: u64| Instant::now() + Duration::from_secs(secs);
    let blocked = row(Phase::Workloads, &[("shop/app", &[])]);
    let mut kept = Narrator::new("n1", Duration::from_secs(10)).daemonsets_stay(true);
    assert_eq!(
        kept.observe(Some(&blocked), 0, s(1)),
        [
            "cordoned n1: nothing new is scheduled there",
            "evicting 1 pod (DaemonSet pods stay: scaleIn.daemonSets is keep)"
        ]
    );
    let mut last = Narrator::new("n1", Duration::from_secs(10)).daemonsets_stay(false);
    assert_eq!(
        last.observe(Some(&blocked), 0, s(1))[1],
        "evicting 1 pod (DaemonSet pods last)"
    );
}
