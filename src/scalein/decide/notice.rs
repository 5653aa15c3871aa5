//! What to do about a queue message (the fourth source's decision). Pure: the
//! look-ups (is the instance managed, which group, is its hook ours) and the time come
//! in as arguments. The message itself is parsed in
//! [`crate::scalein::sources::queue::notice`].

use std::time::Duration;

use chrono::{DateTime, Utc};

use serde::Deserialize;

use super::record::after;
use crate::cloud::LifecycleAction;

/// A spot instance is reclaimed this long after the warning.
pub const SPOT_WARNING: Duration = Duration::from_secs(120);

/// A scheduled change further ahead than this is not taken as a budget.
pub const MAX_SCHEDULED_AHEAD: Duration = Duration::from_secs(366 * 86400);

/// What a rebalance recommendation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RebalanceAction {
    /// Cordon (and taint) the node, nothing more: new pods go elsewhere; the node
    /// drains only if an interruption or scale-in follows.
    #[default]
    Cordon,
    /// Drain it now, leaving the instance to AWS or CA.
    Drain,
}

/// One message, understood.
#[derive(Debug, Clone, PartialEq)]
pub enum Notice {
    /// `EC2 Spot Instance Interruption Warning`: EC2 ends the instance two minutes
    /// after `time`.
    Spot {
        instance_id: String,
        time: Option<DateTime<Utc>>,
    },
    /// `EC2 Instance Rebalance Recommendation`: an interruption is likelier soon.
    Rebalance {
        instance_id: String,
        time: Option<DateTime<Utc>>,
    },
    /// `AWS Health Event`, category `scheduledChange`, service EC2: the instances
    /// are retired, stopped or rebooted at `start`.
    Scheduled {
        instance_ids: Vec<String>,
        event_type: String,
        start: Option<DateTime<Utc>>,
        time: Option<DateTime<Utc>>,
    },
    /// `EC2 Instance State-change Notification`.
    StateChange {
        instance_id: String,
        state: String,
        time: Option<DateTime<Utc>>,
    },
    /// The ASG holds the instance in Terminating:Wait (EventBridge
    /// `EC2 Instance-terminate Lifecycle Action`, or the hook's own notification).
    LifecycleTerminate {
        action: LifecycleAction,
        time: Option<DateTime<Utc>>,
    },
    /// Valid, and nothing to do: the ASG's test notification, a launch transition,
    /// another Health category. Says what it was.
    Nothing(String),
}

/// The kind of an EC2 rebalance recommendation, as records and metrics spell it.
pub const REBALANCE_KIND: &str = "rebalance_recommendation";

impl Notice {
    /// The metric label of the kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Notice::Spot { .. } => "spot_interruption",
            Notice::Rebalance { .. } => REBALANCE_KIND,
            Notice::Scheduled { .. } => "scheduled_change",
            Notice::StateChange { .. } => "state_change",
            Notice::LifecycleTerminate { .. } => "lifecycle_terminate",
            Notice::Nothing(_) => "other",
        }
    }

    /// When AWS sent it (the event's time), when the message says.
    pub fn time(&self) -> Option<DateTime<Utc>> {
        match self {
            Notice::Spot { time, .. }
            | Notice::Rebalance { time, .. }
            | Notice::Scheduled { time, .. }
            | Notice::StateChange { time, .. }
            | Notice::LifecycleTerminate { time, .. } => *time,
            Notice::Nothing(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Drain the node and leave the instance to AWS, done by `ends_at` when set.
    Drain {
        instance_id: String,
        ends_at: Option<DateTime<Utc>>,
    },
    /// The lifecycle drain, ending with CONTINUE, as the poll would find it.
    LifecycleDrain(LifecycleAction),
    /// Cordon and taint only.
    Cordon { instance_id: String },
    /// Stop a running drain: the instance stopped or ended.
    StopDrain { instance_id: String },
    /// Nothing to do, and why.
    Nothing(String),
}

impl Action {
    /// The metric label of the outcome.
    pub fn label(&self) -> &'static str {
        match self {
            Action::Drain { .. } => "drain",
            Action::LifecycleDrain(_) => "lifecycle_drain",
            Action::Cordon { .. } => "cordon",
            Action::StopDrain { .. } => "stopped",
            Action::Nothing(_) => "ignored",
        }
    }
}

/// The actions for a notice. `our_hook` is this service's hook name; the time of a
/// spot warning without one is `now`.
pub fn decide(
    n: &Notice,
    rebalance: RebalanceAction,
    our_hook: &str,
    now: DateTime<Utc>,
) -> Vec<Action> {
    match n {
        Notice::Spot { instance_id, time } => {
            // A warning from the future is a wrong clock: the two minutes count
            // from now. One from the past has spent part of its budget.
            let warned = time.filter(|t| *t <= now).unwrap_or(now);
            vec![Action::Drain {
                instance_id: instance_id.clone(),
                ends_at: Some(after(warned, SPOT_WARNING)),
            }]
        }
        Notice::Rebalance { instance_id, .. } => match rebalance {
            RebalanceAction::Cordon => vec![Action::Cordon {
                instance_id: instance_id.clone(),
            }],
            RebalanceAction::Drain => vec![Action::Drain {
                instance_id: instance_id.clone(),
                ends_at: None,
            }],
        },
        Notice::Scheduled {
            instance_ids,
            event_type,
            start,
            ..
        } => {
            // A start already past is not a budget: drain with the usual deadlines.
            // One beyond a year is no budget either (AWS schedules weeks ahead).
            let ends_at = start.filter(|t| *t > now && *t <= after(now, MAX_SCHEDULED_AHEAD));
            let mut out: Vec<Action> = instance_ids
                .iter()
                .map(|id| Action::Drain {
                    instance_id: id.clone(),
                    ends_at,
                })
                .collect();
            if out.is_empty() {
                out.push(Action::Nothing(format!("{event_type} names no instance")));
            }
            out
        }
        Notice::StateChange {
            instance_id, state, ..
        } => match state.as_str() {
            "stopping" | "stopped" | "shutting-down" | "terminated" => vec![Action::StopDrain {
                instance_id: instance_id.clone(),
            }],
            other => vec![Action::Nothing(format!(
                "instance {instance_id} is {other}: nothing to do"
            ))],
        },
        Notice::LifecycleTerminate { action, .. } => {
            if action.hook == our_hook {
                vec![Action::LifecycleDrain(action.clone())]
            } else {
                vec![Action::Nothing(format!(
                    "lifecycle action of hook {} (not ours, {our_hook}) for {}; another tool completes it",
                    action.hook, action.instance_id
                ))]
            }
        }
        Notice::Nothing(what) => vec![Action::Nothing(format!("{what}: nothing to do"))],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_action_has_the_metric_label_the_docs_name() {
        let id = || "i-1".to_string();
        let labels: Vec<&str> = [
            Action::Drain {
                instance_id: id(),
                ends_at: None,
            },
            Action::LifecycleDrain(action("h")),
            Action::Cordon { instance_id: id() },
            Action::StopDrain { instance_id: id() },
            Action::Nothing("why".into()),
        ]
        .iter()
        .map(Action::label)
        .collect();
        assert_eq!(
            labels,
            ["drain", "lifecycle_drain", "cordon", "stopped", "ignored"]
        );
    }

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn action(hook: &str) -> LifecycleAction {
        LifecycleAction {
            group: "web".into(),
            hook: hook.into(),
            instance_id: "i-1".into(),
            token: Some("tok".into()),
        }
    }

    #[test]
    fn every_kind_maps_to_its_action() {
        let s = RebalanceAction::default();
        let now = t("2026-11-23T10:00:30Z");
        let cases: Vec<(Notice, Vec<Action>)> = vec![
            (
                Notice::Spot {
                    instance_id: "i-1".into(),
                    time: Some(t("2026-11-23T10:00:00Z")),
                },
                vec![Action::Drain {
                    instance_id: "i-1".into(),
                    ends_at: Some(t("2026-11-23T10:02:00Z")),
                }],
            ),
            (
                Notice::Spot {
                    instance_id: "i-1".into(),
                    time: None,
                },
                vec![Action::Drain {
                    instance_id: "i-1".into(),
                    ends_at: Some(t("2026-11-23T10:02:30Z")),
                }],
            ),
            (
                Notice::Rebalance {
                    instance_id: "i-1".into(),
                    time: None,
                },
                vec![Action::Cordon {
                    instance_id: "i-1".into(),
                }],
            ),
            (
                Notice::Scheduled {
                    instance_ids: vec!["i-1".into(), "i-2".into()],
                    event_type: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED".into(),
                    start: Some(t("2026-11-30T00:00:00Z")),
                    time: None,
                },
                vec![
                    Action::Drain {
                        instance_id: "i-1".into(),
                        ends_at: Some(t("2026-11-30T00:00:00Z")),
                    },
                    Action::Drain {
                        instance_id: "i-2".into(),
                        ends_at: Some(t("2026-11-30T00:00:00Z")),
                    },
                ],
            ),
            (
                Notice::Scheduled {
                    instance_ids: vec!["i-1".into()],
                    event_type: "X".into(),
                    start: Some(t("2026-11-23T09:00:00Z")),
                    time: None,
                },
                vec![Action::Drain {
                    instance_id: "i-1".into(),
                    ends_at: None,
                }],
            ),
            (
                Notice::LifecycleTerminate {
                    action: action("ours"),
                    time: None,
                },
                vec![Action::LifecycleDrain(action("ours"))],
            ),
        ];
        for (n, want) in cases {
            assert_eq!(decide(&n, s, "ours", now), want, "{n:?}");
        }
        for state in ["stopping", "stopped", "shutting-down", "terminated"] {
            let n = Notice::StateChange {
                instance_id: "i-1".into(),
                state: state.into(),
                time: None,
            };
            assert_eq!(
                decide(&n, s, "ours", now),
                vec![Action::StopDrain {
                    instance_id: "i-1".into()
                }]
            );
        }
        for n in [
            Notice::StateChange {
                instance_id: "i-1".into(),
                state: "running".into(),
                time: None,
            },
            Notice::LifecycleTerminate {
                action: action("nth"),
                time: None,
            },
            Notice::Nothing("a test notification".into()),
        ] {
            let got = decide(&n, s, "ours", now);
            assert!(matches!(got.as_slice(), [Action::Nothing(_)]), "{got:?}");
        }
    }

    #[test]
    fn notice_times_at_the_edge_of_the_calendar_never_panic() {
        let s = RebalanceAction::default();
        let now = t("2026-11-23T10:00:00Z");
        for time in [DateTime::<Utc>::MAX_UTC, DateTime::<Utc>::MIN_UTC, now] {
            let spot = Notice::Spot {
                instance_id: "i-1".into(),
                time: Some(time),
            };
            let got = decide(&spot, s, "ours", now);
            let [Action::Drain {
                ends_at: Some(end), ..
            }] = got.as_slice()
            else {
                panic!("{got:?}")
            };
            // Never later than two minutes from now: a clock ahead gives no extra time.
            assert!(
                *end <= now + chrono::Duration::seconds(120),
                "{time}: {end}"
            );
            let scheduled = Notice::Scheduled {
                instance_ids: vec!["i-1".into()],
                event_type: "X".into(),
                start: Some(time),
                time: Some(time),
            };
            let got = decide(&scheduled, s, "ours", now);
            assert!(
                matches!(got.as_slice(), [Action::Drain { ends_at: None, .. }]),
                "{got:?}"
            );
        }
    }

    #[test]
    fn rebalance_drains_when_configured() {
        let s = RebalanceAction::Drain;
        let n = Notice::Rebalance {
            instance_id: "i-1".into(),
            time: None,
        };
        assert_eq!(
            decide(&n, s, "ours", t("2026-11-23T10:00:00Z")),
            vec![Action::Drain {
                instance_id: "i-1".into(),
                ends_at: None
            }]
        );
    }
}
