//! Whether a person may give a node back (`ca-asg-provider undrain NODE`): only when
//! no drain runs for it. Pure: decided from the drain record on the Node, read with
//! the drain's own reader ([`DrainRecord::read`]), at the `now` given.
//!
//! A drain that may still run is one whose record says so: a reason that drains and
//! is not done, while its deadline (plus, when it proceeds, the DaemonSet and volume
//! phases after it) is ahead. A record past that is a drain nobody runs any more
//! (an interrupted `drain NODE`, a drain whose service went away): the service would
//! have ended or given it back by then. Our hook holding the instance, its action
//! completed (the instance is ending), or the instance resting in a warm pool are
//! refused too: giving the node back would put pods on an instance that is leaving,
//! or take the service's own give-back from it. A record that does not read is
//! refused (fail closed: nobody can tell whether it drains).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::scalein::decide::record::{
    self, after, DeadlinePolicy, DrainRecord, Limits, Why, LIFECYCLE_ACTION_LIMIT,
};

/// The settings that bound how long a drain may still run.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub limits: Limits,
    /// How long a drain that goes on past its workload deadline still runs: the
    /// DaemonSet phase's deadline and the volume detach's.
    pub after_deadline: Duration,
}

/// Why a give-back is refused: what runs, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Running {
    /// A drain that may still run, for these reasons (their names in Events), until
    /// `until` at the latest.
    Drain {
        reasons: Vec<&'static str>,
        until: DateTime<Utc>,
    },
    /// Our lifecycle hook holds the instance in Terminating:Wait: it ends whatever
    /// happens to the node.
    Held { hook: String },
    /// Our hook's lifecycle action was completed at `at`: AWS is ending the instance.
    Ending { at: DateTime<Utc> },
    /// An interruption notice says AWS ends (or acts on) the instance at `ends_at`,
    /// still ahead: a node given back now would take pods that end with it.
    Reclaimed {
        notice: String,
        ends_at: DateTime<Utc>,
    },
    /// The instance rests in its group's warm pool since `since`: the service gives
    /// the node back itself when the instance returns.
    WarmPool { since: DateTime<Utc> },
    /// The record annotation does not read.
    Unreadable,
}

/// What `undrain` may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undo {
    /// No drain runs: the service's marks may go.
    GiveBack,
    /// A drain runs (or may): nothing changes unless forced.
    Refuse(Running),
}

/// Decides from the Node's annotations at `now`.
pub fn decide(annotations: &BTreeMap<String, String>, window: Window, now: DateTime<Utc>) -> Undo {
    if let Some(json) = annotations.get(record::ANNOTATION) {
        let alone = BTreeMap::from([(record::ANNOTATION.to_string(), json.clone())]);
        if DrainRecord::read(&alone, now).is_none() {
            return Undo::Refuse(Running::Unreadable);
        }
    }
    let Some(rec) = DrainRecord::read(annotations, now) else {
        return Undo::GiveBack;
    };
    if let Some(since) = rec.in_warm_pool_since {
        return Undo::Refuse(Running::WarmPool { since });
    }
    // A hold cannot outlast AWS's limit on a lifecycle action.
    let live_action = |at: DateTime<Utc>| now < after(at, LIFECYCLE_ACTION_LIMIT);
    for r in &rec.reasons {
        if let Why::Lifecycle { hook, .. } = &r.why {
            if !live_action(r.at) {
                continue;
            }
            if !r.done {
                return Undo::Refuse(Running::Held { hook: hook.clone() });
            }
            return Undo::Refuse(Running::Ending { at: r.at });
        }
    }
    let plan = rec.plan(window.limits);
    if let (true, Some(deadline)) = (plan.drains, plan.workload_deadline) {
        let until = match plan.on_deadline {
            DeadlinePolicy::Proceed => after(deadline, window.after_deadline),
            DeadlinePolicy::Abandon => deadline,
        };
        if now < until {
            let reasons = rec
                .reasons
                .iter()
                .filter(|r| !r.done && r.why.drains())
                .map(|r| r.why.label())
                .collect();
            return Undo::Refuse(Running::Drain { reasons, until });
        }
    }
    // A notice's end is a fact about the instance, not a drain: its drain finished
    // (or given up), the instance still ends then.
    let reclaimed = rec
        .reasons
        .iter()
        .filter_map(|r| match &r.why {
            Why::Notice {
                notice,
                ends_at: Some(e),
                ..
            } if now < *e => Some((e, notice)),
            _ => None,
        })
        .min_by_key(|(e, _)| **e);
    if let Some((ends_at, notice)) = reclaimed {
        return Undo::Refuse(Running::Reclaimed {
            notice: notice.clone(),
            ends_at: *ends_at,
        });
    }
    Undo::GiveBack
}

impl Running {
    /// The refusal in one sentence: what runs, what to wait for, how to force.
    pub fn sentence(&self, node: &str) -> String {
        let force = format!("`ca-asg-provider undrain {node} --force` gives it back anyway");
        match self {
            Running::Drain { reasons, until } => format!(
                "node {node} is not given back: a drain may still run for it ({}); wait until it ends, by {} at the latest (`ca-asg-provider status` shows it), or, if you know nothing runs it (the service is stopped, the `drain` command was interrupted), {force}",
                reasons.join(", "),
                until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            Running::Held { hook } => format!(
                "node {node} is not given back: the lifecycle hook {hook:?} holds its instance in Terminating:Wait, so the instance ends whatever happens to the node; wait for the drain to end it, or {force} (pods scheduled there end with the instance)"
            ),
            Running::Ending { at } => format!(
                "node {node} is not given back: its instance was handed to AWS to end (the lifecycle hook's drain from {}); wait for the Node to go, or {force}",
                at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            Running::Reclaimed { notice, ends_at } => format!(
                "node {node} is not given back: an interruption notice ({notice}) says AWS ends or acts on its instance at {}; pods scheduled there now would end with it; wait for the Node to go, or {force}",
                ends_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            Running::WarmPool { since } => format!(
                "node {node} is not given back: its instance rests in its group's warm pool (since {}) and the service gives the node back itself when the instance returns; {force}",
                since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            Running::Unreadable => format!(
                "node {node} is not given back: its drain record ({}) does not read, so nobody can tell whether a drain runs; check the service's log, or {force}",
                record::ANNOTATION
            ),
        }
    }
}

#[cfg(test)]
mod tests;
