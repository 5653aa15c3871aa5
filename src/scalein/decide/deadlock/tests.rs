use super::*;
use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

fn pod(name: &str, ready: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some("shop".into()),
            name: Some(name.into()),
            ..Default::default()
        },
        status: Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[derive(Debug, Clone, Copy)]
enum Spec {
    MinInt(i32),
    MinPct(i32),
    MaxInt(i32),
    MaxPct(i32),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum StatusIs {
    Current,
    Stale,
    Absent,
}

/// What the disruption controller wants healthy of `expected` pods (rounding up, as
/// it does for both fields).
fn desired(spec: Spec, expected: i32) -> i32 {
    let pct = |p: i32| (p * expected + 99) / 100;
    match spec {
        Spec::MinInt(n) => n,
        Spec::MinPct(p) => pct(p),
        Spec::MaxInt(n) => (expected - n).max(0),
        Spec::MaxPct(p) => (expected - pct(p)).max(0),
    }
}

fn budget(
    name: &str,
    spec: Spec,
    expected: i32,
    healthy: i32,
    policy: Option<&str>,
    status: StatusIs,
) -> PodDisruptionBudget {
    let v = |n: i32, pct: bool| {
        if pct {
            IntOrString::String(format!("{n}%"))
        } else {
            IntOrString::Int(n)
        }
    };
    let (min, max) = match spec {
        Spec::MinInt(n) => (Some(v(n, false)), None),
        Spec::MinPct(p) => (Some(v(p, true)), None),
        Spec::MaxInt(n) => (None, Some(v(n, false))),
        Spec::MaxPct(p) => (None, Some(v(p, true))),
    };
    let d = desired(spec, expected);
    PodDisruptionBudget {
        metadata: ObjectMeta {
            namespace: Some("shop".into()),
            name: Some(name.into()),
            generation: Some(2),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: min,
            max_unavailable: max,
            unhealthy_pod_eviction_policy: policy.map(String::from),
            ..Default::default()
        }),
        status: (status != StatusIs::Absent).then(|| PodDisruptionBudgetStatus {
            observed_generation: Some(if status == StatusIs::Current { 2 } else { 1 }),
            expected_pods: expected,
            current_healthy: healthy,
            desired_healthy: d,
            disruptions_allowed: (healthy - d).max(0),
            ..Default::default()
        }),
    }
}

fn specs() -> Vec<Spec> {
    let mut out = Vec::new();
    for n in 0..=4 {
        out.push(Spec::MinInt(n));
    }
    for p in [0, 34, 50, 100] {
        out.push(Spec::MinPct(p));
        out.push(Spec::MaxPct(p));
    }
    for n in 0..=2 {
        out.push(Spec::MaxInt(n));
    }
    out
}

/// Every small case against the eviction rule itself: a ready pod is evicted when
/// `currentHealthy - desiredHealthy > 0`; an unready one under IfHealthyBudget when
/// `currentHealthy >= desiredHealthy`, under AlwaysAllow always. "Never" is: no count
/// of healthy pods up to the expected allows a ready pod (rule 2); else an unready
/// pod held now (rule 3). A stale or absent status: only what the spec spells.
#[test]
fn every_small_budget_is_named_exactly_when_the_eviction_rule_never_allows() {
    let mut seen = BTreeMap::<&str, usize>::new();
    for spec in specs() {
        for expected in 1..=3 {
            for healthy in 0..=expected {
                for ready in [true, false] {
                    for policy in [None, Some("IfHealthyBudget"), Some("AlwaysAllow")] {
                        for status in [StatusIs::Current, StatusIs::Stale, StatusIs::Absent] {
                            let b = budget("web", spec, expected, healthy, policy, status);
                            let p = pod("web-1", ready);
                            let bs = [&b];
                            let found = deadlocks(&[Guarded {
                                pod: &p,
                                budgets: &bs,
                            }]);
                            let d = desired(spec, expected);
                            let spelled = matches!(
                                spec,
                                Spec::MaxInt(0) | Spec::MaxPct(0) | Spec::MinPct(100)
                            );
                            let wants_every = if status == StatusIs::Current {
                                expected - d <= 0
                            } else {
                                spelled
                            };
                            let held = !wants_every
                                && status == StatusIs::Current
                                && !ready
                                && policy != Some("AlwaysAllow")
                                && healthy < d;
                            let case = format!("{spec:?} expected {expected} healthy {healthy} ready {ready} {policy:?} {status:?}");
                            match found.as_slice() {
                                [] => {
                                    assert!(!wants_every && !held, "not named: {case}");
                                    *seen.entry("none").or_default() += 1;
                                }
                                [one] => {
                                    assert_eq!(one.budget, "shop/web", "{case}");
                                    assert_eq!(one.pods, vec!["shop/web-1".to_string()], "{case}");
                                    match &one.why {
                                        Never::WantsEvery { .. } => assert!(wants_every, "{case}"),
                                        Never::UnhealthyHeld {
                                            healthy: h,
                                            desired: dd,
                                        } => {
                                            assert!(held, "{case}");
                                            assert_eq!((*h, *dd), (healthy, d), "{case}");
                                        }
                                        Never::Overlapping => panic!("{case}"),
                                    }
                                    *seen.entry(one.why.kind()).or_default() += 1;
                                }
                                more => panic!("{case}: {more:?}"),
                            }
                            // A spelled form is never missed, whatever the status.
                            if spelled {
                                assert!(
                                    matches!(
                                        found.first().map(|f| &f.why),
                                        Some(Never::WantsEvery { .. })
                                    ),
                                    "{case}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    // Every outcome happened in the sweep.
    for k in ["none", "wants-every-pod", "unhealthy-held"] {
        assert!(seen.get(k).copied().unwrap_or(0) > 0, "{k}: {seen:?}");
    }
}

#[test]
fn a_single_replica_under_min_available_one_is_named_with_its_spec() {
    let b = budget("web", Spec::MinInt(1), 1, 1, None, StatusIs::Current);
    let p = pod("web-1", true);
    let bs = [&b];
    let found = deadlocks(&[Guarded {
        pod: &p,
        budgets: &bs,
    }]);
    assert_eq!(found.len(), 1);
    let line = found[0].said();
    assert!(
        line.contains("shop/web")
            && line.contains("minAvailable: 1")
            && line.contains("shop/web-1"),
        "{line}"
    );
}

#[test]
fn overlapping_budgets_are_named_together_and_pods_of_one_budget_once() {
    let a = budget("a", Spec::MaxInt(1), 3, 3, None, StatusIs::Current);
    let b = budget("b", Spec::MaxInt(1), 3, 3, None, StatusIs::Current);
    let strict = budget("strict", Spec::MaxInt(0), 2, 2, None, StatusIs::Current);
    let free = budget("free", Spec::MaxInt(1), 3, 3, None, StatusIs::Current);
    let (p1, p2, p3, p4, p5) = (
        pod("x", true),
        pod("y", true),
        pod("s1", true),
        pod("s2", true),
        pod("f", true),
    );
    let mut gone = pod("s3", true);
    gone.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let both = [&b, &a];
    let only_strict = [&strict];
    let only_free = [&free];
    let found = deadlocks(&[
        Guarded {
            pod: &p1,
            budgets: &both,
        },
        Guarded {
            pod: &p2,
            budgets: &both,
        },
        Guarded {
            pod: &p3,
            budgets: &only_strict,
        },
        Guarded {
            pod: &p4,
            budgets: &only_strict,
        },
        Guarded {
            pod: &gone,
            budgets: &only_strict,
        },
        Guarded {
            pod: &p5,
            budgets: &only_free,
        },
        Guarded {
            pod: &p5,
            budgets: &[],
        },
    ]);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0].budget, "shop/a + shop/b");
    assert_eq!(found[0].why, Never::Overlapping);
    assert_eq!(found[0].pods, vec!["shop/x", "shop/y"]);
    assert_eq!(found[1].budget, "shop/strict");
    assert_eq!(
        found[1].pods,
        vec!["shop/s1", "shop/s2"],
        "the terminating pod is already leaving"
    );
}

#[test]
fn malformed_values_name_nothing_and_do_not_panic() {
    for s in ["", "%", "abc", "-5%", "1e309%", "NaN%", "  0 % "] {
        let mut b = budget("w", Spec::MaxInt(1), 3, 3, None, StatusIs::Absent);
        b.spec.as_mut().unwrap().max_unavailable = Some(IntOrString::String(s.into()));
        let p = pod("p", true);
        let bs = [&b];
        let found = deadlocks(&[Guarded {
            pod: &p,
            budgets: &bs,
        }]);
        // Only a value that reads as zero is the spelled deadlock.
        assert_eq!(!found.is_empty(), s.trim() == "0 %", "{s:?}: {found:?}");
    }
}
