//! The drain's state on the Node as conditions, as KEP-5683 names them:
//! `DrainInProgress` (True while a drain runs) and `Drained` (True once the workload
//! and DaemonSet pods are gone, before the instance ends). Pure: what the Node has now
//! and what the drain says in, the strategic merge patch of `nodes/status` out.
//!
//! The rules, in the order they apply:
//! - only our two condition types are ever in the patch (a merge list keyed by
//!   `type`: the kubelet's conditions and anyone else's stay as they are);
//! - nothing is written when status, reason and message already say the same
//!   (a phase that repeats costs no write);
//! - `lastTransitionTime` moves only when the status changes (or the condition is
//!   new): a message that changes keeps the time the drain began;
//! - a drain that starts sets `Drained=False` with it (a new drain is not drained);
//! - a drain that stops without ending the instance (given back, undone, failed)
//!   sets both False, with the reason saying which.

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

/// The condition a controller sets while it drains the Node (KEP-5683).
pub const DRAIN_IN_PROGRESS: &str = "DrainInProgress";
/// The condition a controller sets once the drain's pods are gone (KEP-5683).
pub const DRAINED: &str = "Drained";

/// The longest message written (the API server takes more; a reader does not).
pub const MAX_MESSAGE: usize = 1024;

/// How a `DrainInProgress` message of a drain waiting for a disruption budget begins
/// (the gate writes it; `status` shows it).
pub const WAITING_FOR_BUDGET: &str = "waiting for disruption budget";

/// What the drain says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainState {
    /// It runs: `reason` who asked (CamelCase), `message` its phase, what blocks it,
    /// its deadline.
    Running { reason: String, message: String },
    /// Its pods are gone; the instance ends next (or stays, for `drain` without
    /// `--terminate`).
    Drained { reason: String, message: String },
    /// It stopped without ending the instance: `reason` says how (`DrainAbandoned`,
    /// `DrainUndone`, `DrainFailed`).
    Stopped {
        reason: &'static str,
        message: String,
    },
}

impl DrainState {
    /// The two conditions this state means: (type, status, reason, message).
    fn conditions(&self) -> [(&'static str, &'static str, &str, &str); 2] {
        match self {
            DrainState::Running { reason, message } => [
                (DRAIN_IN_PROGRESS, "True", reason, message),
                (DRAINED, "False", "DrainStarted", "a drain runs"),
            ],
            DrainState::Drained { reason, message } => [
                (DRAIN_IN_PROGRESS, "False", "DrainFinished", message),
                (DRAINED, "True", reason, message),
            ],
            DrainState::Stopped { reason, message } => [
                (DRAIN_IN_PROGRESS, "False", reason, message),
                (DRAINED, "False", reason, message),
            ],
        }
    }
}

/// Cut to [`MAX_MESSAGE`] bytes on a character boundary, `...` marking the cut.
pub fn bounded(message: &str) -> String {
    if message.len() <= MAX_MESSAGE {
        return message.to_string();
    }
    let mut end = MAX_MESSAGE - 3;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

/// The strategic merge patch of `nodes/status` that says `state`, given the Node's
/// conditions now; `None` when they already say it.
pub fn patch(current: &[NodeCondition], state: &DrainState, now: Timestamp) -> Option<Value> {
    // metav1.Time is whole seconds.
    let now = Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string();
    let mut changed = Vec::new();
    for (kind, status, reason, message) in state.conditions() {
        let message = bounded(message);
        let have = current.iter().find(|c| c.type_ == kind);
        let same = have.is_some_and(|c| {
            c.status == status
                && c.reason.as_deref() == Some(reason)
                && c.message.as_deref() == Some(message.as_str())
        });
        if same {
            continue;
        }
        let mut c = json!({
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
        });
        let transition = have.is_none_or(|c| c.status != status);
        if transition {
            c["lastTransitionTime"] = json!(now);
        }
        changed.push(c);
    }
    (!changed.is_empty()).then(|| json!({ "status": { "conditions": changed } }))
}

/// What the Node's conditions say of a drain: the `DrainInProgress` condition when it
/// is True, else `Drained` when True (for `status`).
pub fn said(current: &[NodeCondition]) -> Option<&NodeCondition> {
    let by = |kind: &str| {
        current
            .iter()
            .find(|c| c.type_ == kind && c.status == "True")
    };
    by(DRAIN_IN_PROGRESS).or_else(|| by(DRAINED))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// The Node's conditions after the patch, as the API server merges it (by type).
    fn applied(current: &[NodeCondition], patch: &Option<Value>) -> Vec<NodeCondition> {
        let mut out = current.to_vec();
        let Some(p) = patch else { return out };
        for c in p["status"]["conditions"].as_array().unwrap() {
            let mut new: NodeCondition = serde_json::from_value(c.clone()).unwrap();
            match out.iter_mut().find(|o| o.type_ == new.type_) {
                Some(old) => {
                    if new.last_transition_time.is_none() {
                        new.last_transition_time = old.last_transition_time.clone();
                    }
                    *old = new;
                }
                None => out.push(new),
            }
        }
        out
    }

    fn running(message: &str) -> DrainState {
        DrainState::Running {
            reason: "ClusterAutoscaler".into(),
            message: message.into(),
        }
    }

    fn kubelet_ready() -> NodeCondition {
        NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_drain_that_starts_says_in_progress_and_not_drained_and_leaves_the_kubelets_alone() {
        let now = at("2026-11-28T10:00:00Z");
        let p = patch(&[kubelet_ready()], &running("evicting"), now);
        let listed = p.as_ref().unwrap()["status"]["conditions"]
            .as_array()
            .unwrap()
            .clone();
        let types: Vec<&str> = listed.iter().map(|c| c["type"].as_str().unwrap()).collect();
        assert_eq!(types, vec![DRAIN_IN_PROGRESS, DRAINED]);
        let after = applied(&[kubelet_ready()], &p);
        assert_eq!(after[0], kubelet_ready());
        let dip = after.iter().find(|c| c.type_ == DRAIN_IN_PROGRESS).unwrap();
        assert_eq!(dip.status, "True");
        assert_eq!(dip.last_transition_time, Some(Time(now)));
        let drained = after.iter().find(|c| c.type_ == DRAINED).unwrap();
        assert_eq!(drained.status, "False");
    }

    #[test]
    fn the_same_words_again_write_nothing_and_new_words_keep_the_transition_time() {
        let t0 = at("2026-11-28T10:00:00Z");
        let t1 = at("2026-11-28T10:01:00Z");
        let first = applied(&[], &patch(&[], &running("evicting"), t0));
        assert_eq!(patch(&first, &running("evicting"), t1), None);
        let p = patch(&first, &running("waiting for DaemonSet pods"), t1).unwrap();
        // Only the condition whose words changed, and without a transition time.
        let listed = p["status"]["conditions"].as_array().unwrap();
        assert_eq!(listed.len(), 1);
        assert!(listed[0].get("lastTransitionTime").is_none());
        let after = applied(&first, &Some(p));
        let dip = after.iter().find(|c| c.type_ == DRAIN_IN_PROGRESS).unwrap();
        assert_eq!(dip.last_transition_time, Some(Time(t0)));
        assert_eq!(dip.message.as_deref(), Some("waiting for DaemonSet pods"));
    }

    #[test]
    fn every_state_after_every_state_moves_the_transition_time_exactly_when_the_status_changes() {
        let states = [
            running("a"),
            running("b"),
            DrainState::Drained {
                reason: "ClusterAutoscaler".into(),
                message: "gone".into(),
            },
            DrainState::Stopped {
                reason: "DrainUndone",
                message: "undone".into(),
            },
            DrainState::Stopped {
                reason: "DrainAbandoned",
                message: "abandoned".into(),
            },
        ];
        let t0 = at("2026-11-28T10:00:00Z");
        let t1 = at("2026-11-28T10:05:00Z");
        for a in &states {
            for b in &states {
                let before = applied(&[kubelet_ready()], &patch(&[kubelet_ready()], a, t0));
                let after = applied(&before, &patch(&before, b, t1));
                assert_eq!(after.len(), 3, "{a:?} then {b:?}");
                for kind in [DRAIN_IN_PROGRESS, DRAINED] {
                    let was = before.iter().find(|c| c.type_ == kind).unwrap();
                    let now = after.iter().find(|c| c.type_ == kind).unwrap();
                    let expect = if was.status == now.status { t0 } else { t1 };
                    assert_eq!(
                        now.last_transition_time,
                        Some(Time(expect)),
                        "{kind} after {a:?} then {b:?}"
                    );
                }
                // What b says is what the Node says.
                let want = b.conditions();
                for (kind, status, reason, message) in want {
                    let c = after.iter().find(|c| c.type_ == kind).unwrap();
                    assert_eq!(
                        (c.status.as_str(), c.reason.as_deref(), c.message.as_deref()),
                        (status, Some(reason), Some(message))
                    );
                }
                // A state said twice writes nothing the second time.
                assert_eq!(patch(&after, b, t1), None);
            }
        }
    }

    #[test]
    fn messages_are_bounded_on_a_character_boundary() {
        let long = "é".repeat(MAX_MESSAGE);
        let b = bounded(&long);
        assert!(b.len() <= MAX_MESSAGE && b.ends_with("..."), "{}", b.len());
        assert_eq!(bounded("short"), "short");
    }

    #[test]
    fn status_reads_the_running_condition_first() {
        let t0 = at("2026-11-28T10:00:00Z");
        let after = applied(&[], &patch(&[], &running("evicting"), t0));
        assert_eq!(said(&after).unwrap().type_, DRAIN_IN_PROGRESS);
        let drained = DrainState::Drained {
            reason: "X".into(),
            message: "gone".into(),
        };
        let after = applied(&after, &patch(&after, &drained, t0));
        assert_eq!(said(&after).unwrap().type_, DRAINED);
        let undone = DrainState::Stopped {
            reason: "DrainUndone",
            message: "undone".into(),
        };
        let after = applied(&after, &patch(&after, &undone, t0));
        assert_eq!(said(&after), None);
    }
}
