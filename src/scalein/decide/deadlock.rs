//! PodDisruptionBudgets that can never allow an eviction while a drain waits, named
//! when the drain starts instead of when its deadline ends it. Pure: the workload pods
//! the drain will evict, each with the budgets that select it, in; the deadlocks out.
//! It is information only: no eviction changes because of it, the deadline still
//! decides.
//!
//! A pod's eviction is refused for as long as the drain waits when, in this order:
//! 1. more than one budget selects it: the Eviction API refuses such a pod always;
//! 2. its budget wants every pod it expects healthy (`maxUnavailable: 0` or `0%`,
//!    `minAvailable` as many as it expects or `100%`, or the disruption controller's
//!    own count saying so: `desiredHealthy >= expectedPods`): no pod's readiness can
//!    change that, and the workload's controller adds no pod for an eviction;
//! 3. the pod is not ready, its budget evicts unhealthy pods only when the budget is
//!    met (`unhealthyPodEvictionPolicy: IfHealthyBudget`, the default) and it is not
//!    (`currentHealthy < desiredHealthy`): only other pods becoming ready unblock it.
//!
//! A budget whose status was not computed for its current spec is judged by its spec
//! alone (rules 1 and 2's spelled forms); one that allows nothing now but would allow
//! an eviction once a pod of it becomes ready (a replacement starting elsewhere) is
//! not a deadlock: it is waited for.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// A workload pod the drain will evict, and the budgets that select it.
#[derive(Debug, Clone, Copy)]
pub struct Guarded<'a> {
    pub pod: &'a Pod,
    pub budgets: &'a [&'a PodDisruptionBudget],
}

/// Why a budget never allows the eviction.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Never {
    /// Several budgets select the pods (all named in the deadlock's `budget`).
    Overlapping,
    /// The budget wants every pod it expects healthy; `spec` says how it says so.
    WantsEvery { spec: String },
    /// The pods are not ready and the budget, short of healthy pods, evicts
    /// unhealthy pods only when it is met.
    UnhealthyHeld { healthy: i32, desired: i32 },
}

impl Never {
    /// Metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            Never::Overlapping => "overlapping",
            Never::WantsEvery { .. } => "wants-every-pod",
            Never::UnhealthyHeld { .. } => "unhealthy-held",
        }
    }

    /// Why, in words.
    pub fn said(&self) -> String {
        match self {
            Never::Overlapping => "more than one budget selects the pods, and the Eviction API refuses such a pod always".into(),
            Never::WantsEvery { spec } => format!("it wants every pod it expects healthy ({spec}), so it allows no eviction however many are ready, and the workload's controller adds no pod for an eviction"),
            Never::UnhealthyHeld { healthy, desired } => format!("the pods are not ready and the budget has {healthy} healthy of the {desired} it needs; with unhealthyPodEvictionPolicy IfHealthyBudget an unready pod is evicted only when the budget is met, so only its other pods becoming ready unblock it (AlwaysAllow would let them go)"),
        }
    }
}

/// One budget (or set of overlapping budgets, `ns/a + ns/b`) that holds pods of the
/// drain for good, and the pods (`namespace/name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deadlock {
    pub budget: String,
    pub pods: Vec<String>,
    pub why: Never,
}

impl Deadlock {
    /// One line: the budget, why, the pods.
    pub fn said(&self) -> String {
        format!(
            "PodDisruptionBudget {} can never allow an eviction while the drain waits: {} (pods: {})",
            self.budget,
            self.why.said(),
            self.pods.join(", ")
        )
    }
}

fn key(b: &PodDisruptionBudget) -> String {
    format!(
        "{}/{}",
        b.metadata.namespace.as_deref().unwrap_or(""),
        b.metadata.name.as_deref().unwrap_or("")
    )
}

fn pod_key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or(""),
        p.metadata.name.as_deref().unwrap_or("")
    )
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The budget's status, when it was computed for its current spec.
fn current_status(
    b: &PodDisruptionBudget,
) -> Option<&k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus> {
    let s = b.status.as_ref()?;
    (s.observed_generation? >= b.metadata.generation.unwrap_or(0)).then_some(s)
}

fn zero(v: &IntOrString) -> bool {
    match v {
        IntOrString::Int(n) => *n <= 0,
        IntOrString::String(s) => s.trim().trim_end_matches('%').trim().parse::<f64>() == Ok(0.0),
    }
}

fn full_percent(v: &IntOrString) -> bool {
    matches!(v, IntOrString::String(s) if s.trim().ends_with('%')
        && s.trim().trim_end_matches('%').trim().parse::<f64>().is_ok_and(|p| p >= 100.0))
}

/// Rule 2: whether the budget wants every pod it expects healthy, said as its spec
/// (or its status) says it.
fn wants_every(b: &PodDisruptionBudget) -> Option<String> {
    let spec = b.spec.as_ref()?;
    if let Some(m) = spec.max_unavailable.as_ref().filter(|m| zero(m)) {
        return Some(format!("maxUnavailable: {}", said_int_or_string(m)));
    }
    if let Some(m) = spec.min_available.as_ref().filter(|m| full_percent(m)) {
        return Some(format!("minAvailable: {}", said_int_or_string(m)));
    }
    let s = current_status(b)?;
    if s.expected_pods > 0 && s.desired_healthy >= s.expected_pods {
        let how = match (&spec.min_available, &spec.max_unavailable) {
            (Some(m), _) => format!("minAvailable: {}", said_int_or_string(m)),
            (None, Some(m)) => format!("maxUnavailable: {}", said_int_or_string(m)),
            (None, None) => "no minAvailable or maxUnavailable".into(),
        };
        return Some(format!(
            "{how}, {} healthy wanted of {} expected",
            s.desired_healthy, s.expected_pods
        ));
    }
    None
}

fn said_int_or_string(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// Rule 3, for an unready pod.
fn unhealthy_held(b: &PodDisruptionBudget) -> Option<Never> {
    let policy = b
        .spec
        .as_ref()
        .and_then(|s| s.unhealthy_pod_eviction_policy.as_deref());
    if policy == Some("AlwaysAllow") {
        return None;
    }
    let s = current_status(b)?;
    (s.current_healthy < s.desired_healthy).then_some(Never::UnhealthyHeld {
        healthy: s.current_healthy,
        desired: s.desired_healthy,
    })
}

/// Why the pod's eviction is refused for as long as the drain waits, and by which
/// budget(s); `None`: it may be allowed.
fn never(g: &Guarded<'_>) -> Option<(String, Never)> {
    match g.budgets {
        [] => None,
        [b] => {
            if let Some(spec) = wants_every(b) {
                return Some((key(b), Never::WantsEvery { spec }));
            }
            if is_ready(g.pod) {
                return None;
            }
            unhealthy_held(b).map(|n| (key(b), n))
        }
        several => {
            let mut names: Vec<String> = several.iter().map(|b| key(b)).collect();
            names.sort();
            names.dedup();
            Some((names.join(" + "), Never::Overlapping))
        }
    }
}

/// The deadlocks among the pods a drain evicts, one per budget (pods of the same
/// budget together), in budget order. Terminating pods are already leaving and left
/// out.
pub fn deadlocks(guarded: &[Guarded<'_>]) -> Vec<Deadlock> {
    let mut by: BTreeMap<(String, Never), Vec<String>> = BTreeMap::new();
    for g in guarded {
        if g.pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if let Some((budget, why)) = never(g) {
            by.entry((budget, why)).or_default().push(pod_key(g.pod));
        }
    }
    by.into_iter()
        .map(|((budget, why), mut pods)| {
            pods.sort();
            Deadlock { budget, pods, why }
        })
        .collect()
}

#[cfg(test)]
mod tests;
