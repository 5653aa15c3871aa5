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
            })
            .collect(),
        deadline: None,
        deadline_policy: None,
        instance_ends_at: None,
        unreadable: None,
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
    let ds = row(Phase::Daemonsets, &[]);
    assert_eq!(
        n.observe(Some(&ds), 0, s(24)),
        ["workload pods gone; evicting the DaemonSet pods"]
    );
    assert!(n.observe(Some(&ds), 0, s(40)).is_empty());
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

#[test]
fn a_quick_drain_says_cordoned_then_pods_gone() {
    let t0 = Instant::now();
    let mut n = Narrator::new("n1", Duration::from_secs(10));
    assert_eq!(
        n.observe(Some(&row(Phase::Drained, &[])), 0, t0),
        ["cordoned n1: nothing new is scheduled there", "pods gone"]
    );
}
