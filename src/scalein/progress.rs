//! Where a drain stands, read from the Node's drain record and the cluster: its
//! phase, the pods that keep it and the budgets that block each. Pure: no I/O, no
//! clock (`now` comes in). What `status` lists for every drain and what `drain NODE`
//! prints while it runs ([`Narrator`]) are both this.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event as EventV1;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde::Serialize;

use crate::clock::Instant;
use crate::scalein::decide::plan::{self, Disposition, NodeCritical};
use crate::scalein::decide::record::{self, DeadlinePolicy, DrainRecord, How, Limits};
use crate::scalein::decide::{conditions, deadlock};
use crate::scalein::kube::budgets;
use crate::scalein::kube::events::{Reason, REPORTER};

/// Where a drain is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Pods that are not DaemonSet pods are still on the node.
    Workloads,
    /// Only DaemonSet pods are left.
    Daemonsets,
    /// No pod left to drain: the instance is being ended (or left, as the reasons say).
    Drained,
    /// Every reason's drain is finished (or was given up); the record stays on the Node.
    Finished,
    /// Cordoned for a rebalance recommendation, nothing drains.
    Cordoned,
    /// The record does not read (see `unreadable`).
    Unreadable,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Workloads => "workloads",
            Phase::Daemonsets => "daemonsets",
            Phase::Drained => "drained",
            Phase::Finished => "finished",
            Phase::Cordoned => "cordoned",
            Phase::Unreadable => "unreadable record",
        }
    }
}

/// What a follower of one drain (`drain NODE` beside the service's leader) reads
/// from the Node's record: decided from the record alone, never from an Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followed {
    /// Not recorded yet: the leader has not taken it up (our hook's hold waits for
    /// its scan).
    NotYet,
    /// It runs.
    Runs,
    /// It ended, as the service that ran it wrote.
    Ended(How),
    /// The record left the Node (or began again from one) after the drain was
    /// seen: given back, at its deadline with policy `abandon` or by `undrain`.
    GivenBack,
    /// The record shows the drain no longer running and says nothing of how it
    /// ended (an older version finished it, or its reasons were closed by hand).
    Stopped,
    /// A later drain (this number) runs or ran, and this one's end was not seen.
    Passed(u64),
}

/// Where drain number `drain` stands by `record` (none on the Node), `seen`: the
/// follower saw it recorded before.
pub fn followed(record: Option<&DrainRecord>, drain: u64, seen: bool) -> Followed {
    let Some(r) = record else {
        return if seen {
            Followed::GivenBack
        } else {
            Followed::NotYet
        };
    };
    if let Some(e) = r.end_of(drain) {
        return Followed::Ended(e.how.clone());
    }
    match r.drain.cmp(&drain) {
        std::cmp::Ordering::Greater => Followed::Passed(r.drain),
        std::cmp::Ordering::Less if seen => Followed::GivenBack,
        std::cmp::Ordering::Less => Followed::NotYet,
        std::cmp::Ordering::Equal if r.drain_began().is_some() => Followed::Runs,
        std::cmp::Ordering::Equal => Followed::Stopped,
    }
}

/// A pod that keeps the drain in its workload phase, and the budgets that allow no
/// disruption of it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Blocker {
    /// `namespace/name`.
    pub pod: String,
    /// `namespace/name` of each PodDisruptionBudget that selects the pod and allows
    /// no disruption (`disruptionsAllowed` 0, or no status for its current spec).
    pub budgets: Vec<String>,
    /// Why its budget can never allow its eviction while the drain waits (the
    /// deadline ends the wait), when that is so ([`deadlock`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub never: Option<String>,
    /// The pod is already deleted (evicted, or deleted by someone): it is leaving
    /// within its grace period, and no budget keeps it any more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminating: Option<Terminating>,
}

impl Blocker {
    /// The pod at `now`, with the budgets of `pdbs` that keep it (none once it is
    /// terminating: its eviction or deletion went through).
    fn of(pod: &Pod, pdbs: &[PodDisruptionBudget], now: DateTime<Utc>) -> Self {
        let terminating = Terminating::of(pod, now);
        let (budgets, never) = match terminating {
            Some(_) => (Vec::new(), None),
            None => (blocking_budgets(pod, pdbs), never_allowed(pod, pdbs)),
        };
        Blocker {
            pod: plan::pod_ref(pod).to_string(),
            budgets,
            never,
            terminating,
        }
    }
}

/// A pod with a deletionTimestamp: the grace its kubelet still gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Terminating {
    /// Seconds until its deletionTimestamp (when its grace period ends); 0 once past.
    pub grace_left_seconds: u64,
    /// Its whole grace period (`deletionGracePeriodSeconds`), when the API server
    /// wrote one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace_seconds: Option<u64>,
}

/// Longest grace read from a pod (a day): a larger value reads as this.
const MAX_GRACE: u64 = 86_400;

impl Terminating {
    /// `None` when the pod is not being deleted.
    pub fn of(pod: &Pod, now: DateTime<Utc>) -> Option<Self> {
        let at = pod.metadata.deletion_timestamp.as_ref()?.0.as_second();
        let left = at
            .saturating_sub(now.timestamp())
            .clamp(0, MAX_GRACE as i64) as u64;
        let grace = pod
            .metadata
            .deletion_grace_period_seconds
            .map(|g| g.clamp(0, MAX_GRACE as i64) as u64);
        Some(Terminating {
            grace_left_seconds: left,
            grace_seconds: grace,
        })
    }

    /// `terminating, 12s of its 30s grace left` (or that its grace is over).
    pub fn said(&self) -> String {
        let d = |s: u64| crate::duration::format_duration(Duration::from_secs(s));
        match (self.grace_left_seconds, self.grace_seconds) {
            (0, _) => "terminating, its grace period over and its end not confirmed yet".into(),
            (left, Some(all)) => format!("terminating, {} of its {} grace left", d(left), d(all)),
            (left, None) => format!("terminating, {} of its grace left", d(left)),
        }
    }
}

/// One drain, as printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    pub node: String,
    /// The group written with the cordon, when there is one.
    pub group: Option<String>,
    /// The reasons not done, by the names Events use (`CA scale-in`, ...); every
    /// reason when none is left.
    pub reasons: Vec<String>,
    pub phase: Phase,
    /// When the drain began (the first reason's arrival when nothing drains).
    pub started: Option<DateTime<Utc>>,
    /// Seconds since `started`.
    pub elapsed_seconds: Option<u64>,
    /// The pods the phase waits for: in the workload phase the workload pods still
    /// on the node, in the DaemonSet phase the DaemonSet pods; empty otherwise.
    pub blocked_by: Vec<Blocker>,
    /// When the workload phase stops waiting; none when nothing drains.
    pub deadline: Option<DateTime<Utc>>,
    /// What happens then: `proceed` or `abandon`.
    pub deadline_policy: Option<&'static str>,
    /// When AWS ends the instance whatever the drain does (an interruption notice).
    pub instance_ends_at: Option<DateTime<Utc>>,
    /// The annotation that does not read, for an unreadable record.
    pub unreadable: Option<&'static str>,
    /// How the record's drain ended, as the service wrote it (`abandoned: ...`).
    pub ended: Option<String>,
    /// What the Node's drain condition says (`DrainInProgress: ...` while True, else
    /// `Drained: ...` while True), as the service (or another drainer) wrote it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    /// The workload deadline and its policy in words ([`record::Plan::deadline_said`]),
    /// while the drain runs; for lines, not in the JSON (`deadline`, `deadline_policy`).
    #[serde(skip)]
    pub deadline_said: Option<String>,
    /// Drained, the instance waits to be out of the load balancers: the progress line
    /// (left out of the JSON when it does not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_balancers: Option<String>,
}

impl Row {
    /// The disruption budget the drain waits for before its first eviction, as the
    /// Node's `DrainInProgress` condition says it (the gate writes it; the drain's
    /// first phase replaces it).
    pub fn waiting_for_budget(&self) -> Option<&str> {
        self.condition
            .as_deref()?
            .strip_prefix(conditions::DRAIN_IN_PROGRESS)?
            .strip_prefix(": ")
            .filter(|m| m.starts_with(conditions::WAITING_FOR_BUDGET))
    }

    /// `waited 4m30s of 10m0s, workload deadline 2026-11-27T07:15:30Z (then the drain
    /// is abandoned and the node given back)`: how long the drain has waited and
    /// what ends the wait; `None` when nothing drains.
    pub fn waited(&self) -> Option<String> {
        let said = self.deadline_said.as_deref()?;
        let d = |s: u64| crate::duration::format_duration(Duration::from_secs(s));
        let elapsed = d(self.elapsed_seconds.unwrap_or(0));
        let of = match (self.started, self.deadline) {
            (Some(s), Some(e)) => format!(" of {}", d((e - s).num_seconds().max(0) as u64)),
            _ => String::new(),
        };
        Some(format!("waited {elapsed}{of}, {said}"))
    }
}

/// The drains on `nodes`, at `now`, with the pods on those nodes and the cluster's
/// budgets. Pure: no I/O, no clock. Sorted by node name.
pub fn rows(
    nodes: &[Node],
    pods: &[Pod],
    pdbs: &[PodDisruptionBudget],
    limits: Limits,
    now: DateTime<Utc>,
) -> Vec<Row> {
    let mut out: Vec<Row> = nodes
        .iter()
        .filter_map(|n| row(n, pods, pdbs, limits, now))
        .collect();
    out.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

/// One Node's drain at `now` ([`rows`]); `None` when it carries no record.
pub fn row(
    node: &Node,
    pods: &[Pod],
    pdbs: &[PodDisruptionBudget],
    limits: Limits,
    now: DateTime<Utc>,
) -> Option<Row> {
    let empty = BTreeMap::new();
    let annotations = node.metadata.annotations.as_ref().unwrap_or(&empty);
    let name = node.metadata.name.clone().unwrap_or_default();
    let group = annotations.get(record::GROUP_ANNOTATION).cloned();
    // The record alone, through the one reader: `None` when the JSON does not read
    // (the reader would fall back to the older annotations; status says so instead).
    if let Some(json) = annotations.get(record::ANNOTATION) {
        let alone = BTreeMap::from([(record::ANNOTATION.to_string(), json.clone())]);
        if DrainRecord::read(&alone, now).is_none() {
            return Some(Row {
                node: name,
                group,
                reasons: Vec::new(),
                phase: Phase::Unreadable,
                started: None,
                elapsed_seconds: None,
                blocked_by: Vec::new(),
                deadline: None,
                deadline_policy: None,
                instance_ends_at: None,
                unreadable: Some(record::ANNOTATION),
                ended: None,
                condition: condition_of(node),
                deadline_said: None,
                load_balancers: None,
            });
        }
    }
    let rec = DrainRecord::read(annotations, now)?;
    let p = rec.plan(limits);
    let active: Vec<String> = rec
        .reasons
        .iter()
        .filter(|r| !r.done)
        .map(|r| r.why.label().to_string())
        .collect();
    let reasons = if active.is_empty() {
        rec.reasons
            .iter()
            .map(|r| r.why.label().to_string())
            .collect()
    } else {
        active
    };
    let stamp = to_timestamp(now);
    let on_node: Vec<&Pod> = pods
        .iter()
        .filter(|pod| pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&name))
        .collect();
    let mut workloads = Vec::new();
    let mut daemonsets = Vec::new();
    for pod in &on_node {
        match plan::classify_at(pod, &NodeCritical::default(), stamp) {
            Disposition::Evict(t) | Disposition::Wait(t) if t.is_daemonset() => {
                daemonsets.push(*pod)
            }
            Disposition::Evict(_) | Disposition::Wait(_) => workloads.push(*pod),
            Disposition::Skip(_) => {}
        }
    }
    let phase = if !p.drains {
        if rec.reasons.iter().any(|r| r.why.drains()) {
            Phase::Finished
        } else {
            Phase::Cordoned
        }
    } else if !workloads.is_empty() {
        Phase::Workloads
    } else if !daemonsets.is_empty() {
        Phase::Daemonsets
    } else {
        Phase::Drained
    };
    // The pods the phase waits for: the workload pods, then (once they are gone)
    // the DaemonSet pods, never a pod of a phase that is over.
    let waited = match phase {
        Phase::Workloads => &workloads,
        Phase::Daemonsets => &daemonsets,
        _ => &Vec::new(),
    };
    let mut blocked_by: Vec<Blocker> = waited
        .iter()
        .map(|pod| Blocker::of(pod, pdbs, now))
        .collect();
    blocked_by.sort_by(|x, y| x.pod.cmp(&y.pod));
    let started = rec.drain_began().or_else(|| rec.first_at());
    Some(Row {
        node: name,
        group,
        reasons,
        phase,
        started,
        elapsed_seconds: started.map(|s| (now - s).num_seconds().max(0) as u64),
        blocked_by,
        deadline: p.workload_deadline,
        deadline_policy: p.workload_deadline.map(|_| p.on_deadline.as_str()),
        instance_ends_at: p.budget_ends,
        unreadable: None,
        ended: rec
            .end_of(rec.drain)
            .map(|e| printable(&e.how.summary(), record::MAX_WHY)),
        condition: condition_of(node),
        deadline_said: p.drains.then(|| p.deadline_said()),
        load_balancers: annotations
            .get(crate::scalein::decide::last_mile::ANNOTATION)
            .and_then(|a| crate::scalein::decide::last_mile::Waiting::read(a))
            .filter(|_| phase == Phase::Drained)
            .map(|w| w.line(now)),
    })
}

/// The Node's drain condition in one line, when one is True.
fn condition_of(node: &Node) -> Option<String> {
    let all = node.status.as_ref()?.conditions.as_deref()?;
    let c = conditions::said(all)?;
    Some(printable(
        &format!("{}: {}", c.type_, c.message.as_deref().unwrap_or("")),
        conditions::MAX_MESSAGE,
    ))
}

/// Why the budgets that select the pod can never allow its eviction, if they can't.
fn never_allowed(pod: &Pod, pdbs: &[PodDisruptionBudget]) -> Option<String> {
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let selecting: Vec<&PodDisruptionBudget> = pdbs
        .iter()
        .filter(|b| b.metadata.namespace.as_deref().unwrap_or_default() == ns)
        .filter(|b| budgets::selector_picking(b, labels).is_some())
        .collect();
    let found = deadlock::deadlocks(&[deadlock::Guarded {
        pod,
        budgets: &selecting,
    }]);
    found.first().map(|d| d.why.said())
}

/// The budgets in the pod's namespace that select it and allow no disruption now.
fn blocking_budgets(pod: &Pod, pdbs: &[PodDisruptionBudget]) -> Vec<String> {
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let mut out: Vec<String> = pdbs
        .iter()
        .filter(|b| b.metadata.namespace.as_deref().unwrap_or_default() == ns)
        .filter(|b| budgets::selector_picking(b, labels).is_some())
        .filter(|b| budgets::allowance(b).is_none_or(|a| a <= 0))
        .map(|b| format!("{ns}/{}", b.metadata.name.as_deref().unwrap_or_default()))
        .collect();
    out.sort();
    out
}

fn to_timestamp(t: DateTime<Utc>) -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::from_second(t.timestamp())
        .unwrap_or(k8s_openapi::jiff::Timestamp::MAX)
}

/// What [`Narrator`] said last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Said {
    Phase(Phase),
    Volumes,
}

/// What `drain NODE` prints while its drain runs, from what it reads every few
/// seconds: a line when the drain enters a phase (cordoned, evicting N pods, the
/// DaemonSet pods, waiting for volumes), and while pods keep it in the workload or
/// the DaemonSet phase, every `every`, the pods still there (a terminating one with
/// its grace left) and the budgets that block each.
/// Pure: the reads and the time come in.
#[derive(Debug)]
pub struct Narrator {
    node: String,
    every: Duration,
    cordoned: bool,
    said: Option<Said>,
    /// When the pods that block it were last named (or the workload phase began).
    blockers_at: Option<Instant>,
    /// The DaemonSet phase's deadline and its policy, when known.
    daemonsets: Option<(Duration, DeadlinePolicy)>,
    /// When the DaemonSet phase was first seen.
    daemonsets_since: Option<Instant>,
    /// `scaleIn.daemonSets: keep`: the drain evicts no DaemonSet pod.
    daemonsets_stay: bool,
}

impl Narrator {
    pub fn new(node: &str, every: Duration) -> Self {
        Self {
            node: node.to_string(),
            every,
            cordoned: false,
            said: None,
            blockers_at: None,
            daemonsets: None,
            daemonsets_since: None,
            daemonsets_stay: false,
        }
    }

    /// The drain keeps the DaemonSet pods (`scaleIn.daemonSets: keep`): its lines say
    /// they stay, not that they go last.
    pub fn daemonsets_stay(mut self, stay: bool) -> Self {
        self.daemonsets_stay = stay;
        self
    }

    /// The node it narrates.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The DaemonSet phase's waiting lines say how long of `deadline` it has waited
    /// and what `policy` does then.
    pub fn daemonset_deadline(mut self, deadline: Duration, policy: DeadlinePolicy) -> Self {
        self.daemonsets = Some((deadline, policy));
        self
    }

    /// How long the phase of `row` has waited and what ends the wait (the workload
    /// deadline from the record, the DaemonSet deadline from when the phase was seen).
    fn waited(&self, row: &Row, now: Instant) -> Option<String> {
        match row.phase {
            Phase::Daemonsets => {
                let (deadline, policy) = self.daemonsets?;
                let since = self.daemonsets_since?;
                let d = crate::duration::format_duration;
                let waited = Duration::from_secs(now.saturating_duration_since(since).as_secs());
                Some(format!(
                    "waited {} of {}, the DaemonSet pods' deadline (then {})",
                    d(waited),
                    d(deadline),
                    policy.then_said()
                ))
            }
            _ => row.waited(),
        }
    }

    /// The lines to print for the drain as `row` shows it at `now` (`None`: no record
    /// on the Node yet), with `volumes` VolumeAttachments still naming the node.
    pub fn observe(&mut self, row: Option<&Row>, volumes: usize, now: Instant) -> Vec<String> {
        let mut out = Vec::new();
        let Some(row) = row else { return out };
        if !self.cordoned {
            self.cordoned = true;
            out.push(format!(
                "cordoned {}: nothing new is scheduled there",
                self.node
            ));
        }
        let said = match row.phase {
            Phase::Workloads => Said::Phase(Phase::Workloads),
            Phase::Drained if volumes > 0 => Said::Volumes,
            p => Said::Phase(p),
        };
        if self.said != Some(said) {
            let line = match said {
                Said::Phase(Phase::Workloads) => {
                    self.blockers_at = Some(now);
                    Some(format!(
                        "evicting {} ({})",
                        pods(row.blocked_by.len()),
                        match self.daemonsets_stay {
                            true => "DaemonSet pods stay: scaleIn.daemonSets is keep",
                            false => "DaemonSet pods last",
                        }
                    ))
                }
                Said::Phase(Phase::Daemonsets) => {
                    self.blockers_at = Some(now);
                    self.daemonsets_since = Some(now);
                    Some(format!(
                        "workload pods gone; evicting the DaemonSet pods: {}",
                        names(&row.blocked_by)
                    ))
                }
                Said::Volumes => Some(format!(
                    "pods gone; waiting for {} to detach",
                    plural(volumes, "volume attachment")
                )),
                Said::Phase(Phase::Drained) if self.said == Some(Said::Volumes) => {
                    Some("volumes detached".to_string())
                }
                Said::Phase(Phase::Drained) => Some("pods gone".to_string()),
                Said::Phase(Phase::Unreadable) => Some(format!(
                    "the drain record on {} does not read ({})",
                    self.node,
                    record::ANNOTATION
                )),
                Said::Phase(Phase::Finished | Phase::Cordoned) => None,
            };
            out.extend(line);
            self.said = Some(said);
            return out;
        }
        let waits = matches!(said, Said::Phase(Phase::Workloads | Phase::Daemonsets));
        if waits && !row.blocked_by.is_empty() {
            let due = self.blockers_at.is_none_or(|t| now >= t + self.every);
            if due {
                self.blockers_at = Some(now);
                let mut line = blocked_line(row.phase, &row.blocked_by);
                if let Some(waited) = self.waited(row, now) {
                    line = format!("{line}; {waited}");
                }
                out.push(line);
            }
        }
        // Drained, the instance waits to be out of the load balancers (issue 73).
        if let (Said::Phase(Phase::Drained), Some(lb)) = (said, &row.load_balancers) {
            if self.blockers_at.is_none_or(|t| now >= t + self.every) {
                self.blockers_at = Some(now);
                out.push(lb.clone());
            }
        }
        out
    }
}

/// The service's Warning Events on the node that `drain NODE` relays as it follows
/// the drain, wherever the drain runs (the service's leader, or the command's own
/// engine): a deadline hit, a drain failed or abandoned, a heartbeat refused, pods not
/// waited for. Each Event once, and again when it recurs (its series counts up).
/// `EvictionBlocked` is not relayed: [`Narrator`] names the pods and budgets that
/// keep the drain. What was on the node before the command began is primed, never
/// relayed, by the Events' own identity and count, not their times (another
/// machine's clock). Pure: the Events come in.
#[derive(Debug, Default)]
pub struct Warnings {
    node: String,
    /// Each relayed (or primed) Event's uid, and its count then.
    seen: BTreeMap<String, i32>,
    /// The note of the last `DrainAbandoned` relayed: the drain was given up.
    abandoned: Option<String>,
    /// Whether a `DrainFailed` was relayed: the drain could not go on.
    failed: bool,
}

/// `s` without control characters (a terminal's escapes), at most `max` characters.
/// `s` as a terminal may show it, at most `max` characters: control characters (a
/// terminal's escapes) and Unicode's invisible format characters (bidirectional
/// overrides and isolates, zero-width marks, which can make a line read as another)
/// become spaces.
pub fn printable(s: &str, max: usize) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() || is_format(c) {
                ' '
            } else {
                c
            }
        })
        .take(max)
        .collect()
}

/// Unicode's format characters (general category Cf) that change how a line reads.
fn is_format(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206F}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}'
        | '\u{E0001}' | '\u{E0020}'..='\u{E007F}')
}

/// One of the service's warnings on the node, as relayed.
#[derive(Debug)]
struct Warning {
    uid: String,
    count: i32,
    reason: String,
    note: String,
}

impl Warning {
    /// `warning: DeadlineHit (3 times): …`.
    fn line(&self) -> String {
        let times = if self.count > 1 {
            format!(" ({} times)", self.count)
        } else {
            String::new()
        };
        format!("warning: {}{times}: {}", self.reason, self.note)
    }
}

/// Events relayed at most per look: a flood says how many were left out.
pub const WARNINGS_PER_LOOK: usize = 20;

impl Warnings {
    /// Nothing of `events` (the node's, as they stand before the drain) is relayed.
    pub fn primed(node: &str, events: &[EventV1]) -> Self {
        let mut w = Self {
            node: node.to_string(),
            ..Self::default()
        };
        for said in w.ours(events) {
            w.seen.insert(said.uid, said.count);
        }
        w
    }

    /// Why the drain was given up, when a `DrainAbandoned` was relayed.
    pub fn abandoned(&self) -> Option<&str> {
        self.abandoned.as_deref()
    }

    /// Whether the warning the leader writes as a drain ends `how` was relayed (true
    /// for an end it writes none for): a given-up drain's `DrainAbandoned`, a failed
    /// one's `DrainFailed`. The leader may write it after the record (and queue it
    /// behind the drains' requests in a storm). One primed from before the command
    /// does not count.
    pub fn heard_last_word(&self, how: &How) -> bool {
        match how {
            How::Abandoned { .. } => self.abandoned.is_some(),
            How::Failed { .. } => self.failed,
            How::Drained | How::Ending | How::InstanceLeft => true,
        }
    }

    /// The lines for the Warnings among `events` not relayed yet, or recurred.
    pub fn observe(&mut self, events: &[EventV1]) -> Vec<String> {
        let mut fresh = Vec::new();
        for said in self.ours(events) {
            if self.seen.get(&said.uid).is_some_and(|&c| c >= said.count) {
                continue;
            }
            self.seen.insert(said.uid.clone(), said.count);
            self.failed |= said.reason == Reason::DrainFailed.as_str();
            fresh.push(said.line());
            if said.reason == Reason::DrainAbandoned.as_str() {
                self.abandoned = Some(said.note);
            }
        }
        let left = fresh.len().saturating_sub(WARNINGS_PER_LOOK);
        fresh.truncate(WARNINGS_PER_LOOK);
        if left > 0 {
            fresh.push(format!(
                "(and {left} more warning(s): `kubectl describe node {}`)",
                self.node
            ));
        }
        fresh
    }

    /// This service's Warning Events on the node, but the blocked evictions, in the
    /// order the service said them.
    fn ours(&self, events: &[EventV1]) -> Vec<Warning> {
        let mut out: Vec<(Option<k8s_openapi::jiff::Timestamp>, Warning)> = events
            .iter()
            .filter(|e| self.relays(e))
            .filter_map(|e| {
                let uid = e.metadata.uid.clone()?;
                let count = e
                    .series
                    .as_ref()
                    .map(|s| s.count)
                    .or(e.deprecated_count)
                    .unwrap_or(1)
                    .max(1);
                // In the order the service said them (its own clock, for the order
                // of the lines only).
                let at = e
                    .series
                    .as_ref()
                    .map(|s| s.last_observed_time.0)
                    .or_else(|| e.event_time.as_ref().map(|t| t.0));
                // Anyone who may write Events may write these: printable only, bounded.
                let reason = printable(e.reason.as_deref().unwrap_or("Warning"), 128);
                let note = printable(e.note.as_deref().unwrap_or_default(), 1024);
                Some((
                    at,
                    Warning {
                        uid,
                        count,
                        reason,
                        note,
                    },
                ))
            })
            .collect();
        out.sort_by(|a, b| (a.0, &a.1.uid).cmp(&(b.0, &b.1.uid)));
        out.into_iter().map(|(_, w)| w).collect()
    }

    /// A Warning of this service's about the node, not a blocked eviction.
    fn relays(&self, e: &EventV1) -> bool {
        e.type_.as_deref() == Some("Warning")
            && e.reporting_controller.as_deref() == Some(REPORTER)
            && e.reason.as_deref() != Some(Reason::EvictionBlocked.as_str())
            && e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("Node") && r.name.as_deref() == Some(self.node.as_str())
            })
    }
}

/// `waiting for 2 pods: shop/app (PodDisruptionBudget shop/app-pdb allows no
/// disruption now); shop/cart`, or in the DaemonSet phase `waiting for 1 DaemonSet
/// pod: logging/fluentd-x`.
pub fn blocked_line(phase: Phase, blockers: &[Blocker]) -> String {
    let each: Vec<String> = blockers
        .iter()
        .map(|b| match b.budgets.len() {
            _ if b.terminating.is_some() => {
                format!(
                    "{} ({})",
                    b.pod,
                    b.terminating.map(|t| t.said()).unwrap_or_default()
                )
            }
            0 => b.pod.clone(),
            1 => format!(
                "{} (PodDisruptionBudget {} allows no disruption now)",
                b.pod, b.budgets[0]
            ),
            _ => format!(
                "{} (PodDisruptionBudgets {} allow no disruption now)",
                b.pod,
                b.budgets.join(", ")
            ),
        })
        .collect();
    let what = match phase {
        Phase::Daemonsets => plural(blockers.len(), "DaemonSet pod"),
        _ => pods(blockers.len()),
    };
    format!("waiting for {what}: {}", each.join("; "))
}

/// `logging/fluentd-x, logging/node-exporter-y`.
fn names(blockers: &[Blocker]) -> String {
    let each: Vec<&str> = blockers.iter().map(|b| b.pod.as_str()).collect();
    each.join(", ")
}

fn pods(n: usize) -> String {
    plural(n, "pod")
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

#[cfg(test)]
mod tests;
