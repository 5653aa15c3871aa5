//! One drain record per instance, many reasons. Pure: no I/O, and no clock but the
//! "now" that bounds a record read back from a Node ([`DrainRecord::read`]).
//!
//! A node can have several reasons to go at once: a rebalance recommendation cordons
//! it, CA picks it for scale-in, the ASG ends it through the hook, a spot warning
//! arrives, someone runs `drain NODE`. Each reason is kept with the time it arrived;
//! the record lives on the Node ([`ANNOTATION`], written by [`crate::scalein::stages::cordon`]) so a
//! restart or a new leader resumes every reason with its times and budgets.
//!
//! [`DrainRecord::join`] takes a reason in and says whether the drain's plan changed;
//! [`DrainRecord::plan`] says what the drain does now:
//! - it drains while any reason that asks for a drain is not done (a rebalance
//!   cordon never drains and never weakens a drain);
//! - the strongest reason decides how it ends: our hook's lifecycle action is
//!   completed, else CA's direct scale-in terminates with decrement, else the
//!   instance is left (to AWS, or running);
//! - each reason's deadline counts from its own arrival: a later drain never inherits
//!   an earlier cordon's start, and a budget (spot's two minutes, a retirement's date)
//!   only ever shortens the drain.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Node;
use serde::{Deserialize, Serialize};

/// What happens when a phase's deadline passes.
///
/// In lifecycle mode both hook results end the instance, so a deadline there always
/// proceeds: giving up could not keep the node, only skip the DaemonSet phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeadlinePolicy {
    /// Go on: workload pods still there are deleted with their own grace period
    /// (the instance ends anyway), DaemonSet pods follow once they are gone, then
    /// volumes, then the instance ends.
    Proceed,
    /// Direct mode: stop the drain and give the node back (uncordoned, our taint and
    /// CA's ToBeDeletedByClusterAutoscaler removed, CA's target counts it again).
    Abandon,
}

impl DeadlinePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Proceed => "proceed",
            Self::Abandon => "abandon",
        }
    }

    /// What happens at a deadline with this policy, in words.
    pub fn then_said(self) -> &'static str {
        match self {
            Self::Proceed => "what is left is deleted with its own grace period",
            Self::Abandon => "the drain is abandoned and the node given back",
        }
    }
}

/// The Node annotation that holds the record (JSON).
pub const ANNOTATION: &str = "ca-asg-provider.io/drain-reasons";
/// When the drain began ([`DrainRecord::drain_began`]; the first reason's time when
/// nothing drains), and the strongest reason's mode (for people, and what versions
/// before the record wrote).
pub const STARTED_ANNOTATION: &str = "ca-asg-provider.io/drain-started-at";
pub const MODE_ANNOTATION: &str = "ca-asg-provider.io/drain-mode";

/// The mode of CA's scale-in of a group without our hook ([`crate::scalein::Mode::Direct`]):
/// the mark the size accounting and the resume after a restart follow.
pub const DIRECT_MARK: &str = "direct";
/// The mode of a drain our lifecycle hook holds the instance for.
pub const LIFECYCLE_MARK: &str = "lifecycle";
/// The mode of a rebalance recommendation's cordon.
pub const REBALANCE_MARK: &str = "rebalance";
/// The mode of a drain an interruption notice started.
pub const INTERRUPTION_MARK: &str = "interruption";
/// The mode of `drain NODE` without `--terminate` ([`crate::scalein::Mode::DrainOnly`]).
pub const DRAIN_ONLY_MARK: &str = "drain-only";

/// The most a notice's budget gives the DaemonSet pods (`interruption.daemonSetShare`
/// allows no more): of a spot interruption's two minutes, the workloads keep ten
/// seconds. A larger value read back from a Node is this.
pub const MAX_DAEMONSET_SHARE: Duration = Duration::from_secs(110);

/// Which mode the Node shows when it has several reasons to go: a drain that ends
/// the instance (CA's direct scale-in, a lifecycle hook) outranks an interruption
/// drain, which outranks a rebalance cordon. The mode is for people and older
/// versions; the drain itself follows the whole record ([`DrainRecord`]).
pub fn mark_rank(mode: &str) -> u8 {
    match mode {
        REBALANCE_MARK => 0,
        INTERRUPTION_MARK | DRAIN_ONLY_MARK => 1,
        DIRECT_MARK => 2,
        _ => 3,
    }
}

/// Why a node is asked to go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Why {
    /// An EC2 rebalance recommendation with `rebalance: cordon`: cordon, nothing more.
    Rebalance,
    /// `drain NODE` without `--terminate`: drain, leave the instance running.
    DrainCommand,
    /// An interruption notice (spot warning, rebalance with `rebalance: drain`, a
    /// scheduled change): drain, AWS ends the instance, at `ends_at` when known.
    Notice {
        /// The notice's kind (metric label), e.g. `spot_interruption`.
        notice: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ends_at: Option<DateTime<Utc>>,
        /// Of the budget, what the DaemonSet pods get at its end.
        #[serde(default)]
        daemonset_share_secs: u64,
    },
    /// CA's scale-in of a group without our hook (direct mode): drain, then
    /// TerminateInstanceInAutoScalingGroup with decrement.
    ScaleIn,
    /// Our hook holds the instance in Terminating:Wait: drain, heartbeat, then
    /// CompleteLifecycleAction CONTINUE.
    Lifecycle {
        hook: String,
        /// CA's DeleteNodes asked for the hold (lifecycle mode ends CA's choice
        /// through the hook), so disruption budgets count it under CA's causes in
        /// whichever replica runs the drain; AWS's scaling activity calls it "a user
        /// request", as a person's terminate. Absent (false) in records written
        /// before it existed: those read as the group's own.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        by_ca: bool,
    },
}

/// Whether a notice ending at `new` ends earlier than one ending at `old` (an
/// unknown end is the latest): what shortens a running drain's budget, and what
/// makes the same notice after its drain finished news rather than a repeat.
fn ends_earlier(new: Option<DateTime<Utc>>, old: Option<DateTime<Utc>>) -> bool {
    new.is_some_and(|n| old.is_none_or(|o| n < o))
}

impl Why {
    /// Same kind of reason. A notice is one kind whatever its budget, and each kind
    /// of notice its own (a spot warning joining a rebalance drain is recorded as
    /// itself, so that it is known again when SQS delivers it a second time).
    fn same_kind(&self, other: &Why) -> bool {
        match (self, other) {
            (Why::Notice { notice: a, .. }, Why::Notice { notice: b, .. }) => a == b,
            _ => std::mem::discriminant(self) == std::mem::discriminant(other),
        }
    }

    /// Whether this reason, arriving after `done`'s drain finished, tells nothing
    /// new: the same notice again (SQS redelivering it after a restart or a new
    /// leader, a replay), of the same kind and with no earlier end. Its drain is
    /// not run again: the pods on the node now are the ones that came back to the
    /// cordoned node (DaemonSet pods shipping its last logs), not ones to chase.
    /// Our hook holding the instance again, within the longest any lifecycle action
    /// lasts of the one whose drain finished, is that action: AWS shows the
    /// instance in Terminating:Wait until every hook's action ends (EKS's on a
    /// managed node group), and ours was completed ([`DrainReason::repeats`]).
    fn repeats(&self, done: &Why) -> bool {
        match (self, done) {
            (Why::Lifecycle { .. }, Why::Lifecycle { .. }) => true,
            (
                Why::Notice {
                    notice,
                    ends_at: new_end,
                    ..
                },
                Why::Notice {
                    notice: old_notice,
                    ends_at: old_end,
                    ..
                },
            ) => notice == old_notice && !ends_earlier(*new_end, *old_end),
            _ => false,
        }
    }

    /// Whether this reason asks for the pods to be drained.
    pub fn drains(&self) -> bool {
        !matches!(self, Why::Rebalance)
    }

    /// The mode written to [`MODE_ANNOTATION`] for this reason.
    pub fn mark(&self) -> &'static str {
        match self {
            Why::Rebalance => REBALANCE_MARK,
            Why::DrainCommand => DRAIN_ONLY_MARK,
            Why::Notice { .. } => INTERRUPTION_MARK,
            Why::ScaleIn => DIRECT_MARK,
            Why::Lifecycle { .. } => LIFECYCLE_MARK,
        }
    }

    /// The short name used in Events and docs/scale-in.md's table.
    pub fn label(&self) -> &'static str {
        match self {
            Why::Rebalance => "rebalance cordon",
            Why::DrainCommand => "drain command",
            Why::Notice { .. } => "interruption notice",
            Why::ScaleIn => "CA scale-in",
            Why::Lifecycle { .. } => "lifecycle hook",
        }
    }
}

/// One reason with the time it arrived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainReason {
    #[serde(flatten)]
    pub why: Why,
    /// When this reason arrived (a notice: when the service recorded it).
    pub at: DateTime<Utc>,
    /// Its drain finished (or was given up): it no longer drives the drain. A new
    /// reason of the same kind starts afresh.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub done: bool,
}

impl DrainReason {
    pub fn new(why: Why, at: DateTime<Utc>) -> Self {
        Self {
            why,
            at,
            done: false,
        }
    }

    /// The reason as CA's DeleteNodes brings it: a hold of our hook it asked for says
    /// so ([`Why::Lifecycle`]'s `by_ca`); any other reason is as it was.
    pub fn asked_by_ca(mut self) -> Self {
        if let Why::Lifecycle { by_ca, .. } = &mut self.why {
            *by_ca = true;
        }
        self
    }

    /// Whether this reason, arriving after `done`'s drain finished, is the same
    /// reason again ([`Why::repeats`]). A lifecycle hold arriving more than
    /// [`LIFECYCLE_ACTION_LIMIT`] after the finished one cannot be its action,
    /// whose end AWS forces by then: it is a new one.
    fn repeats(&self, done: &DrainReason) -> bool {
        if let Why::Lifecycle { .. } = self.why {
            if !same_action_possible(done.at, self.at) {
                return false;
            }
        }
        self.why.repeats(&done.why)
    }
}

/// The longest AWS keeps a lifecycle action, whatever its heartbeats (48 hours).
pub const LIFECYCLE_ACTION_LIMIT: Duration = Duration::from_secs(48 * 3600);

/// Whether a hold seen at `at` can still be the lifecycle action whose reason
/// arrived at `arrived`: less than [`LIFECYCLE_ACTION_LIMIT`] later.
fn same_action_possible(arrived: DateTime<Utc>, at: DateTime<Utc>) -> bool {
    at < after(arrived, LIFECYCLE_ACTION_LIMIT)
}

/// Every reason a node was asked to go for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRecord {
    pub reasons: Vec<DrainReason>,
    /// Which drain of the node the reasons drive: one more each time a reason that
    /// drains joins a record on which nothing drained ([`Self::join`]); 1 for the
    /// first. 0: a record an older version wrote, which numbered no drain. A follower
    /// (`drain NODE` beside the service's leader) follows one number and reads its
    /// end from [`Self::ended`], never from an Event.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub drain: u64,
    /// How the drain numbered [`Ended::drain`] ended, written in the same update
    /// that ended it. Unreadable (a newer version's word) reads as none.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_ended"
    )]
    pub ended: Option<Ended>,
    /// When the instance was first seen resting in its group's warm pool after our
    /// hook's action was completed ([`crate::scalein::sources::warm_pool`]): the node is handed back
    /// when the instance leaves the pool for the group again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_warm_pool_since: Option<DateTime<Utc>>,
    /// The deadline the drain began with ([`Self::keep`], written by the engine
    /// that runs it): its group's settings then, and the room our hook left. A drain
    /// keeps its promise when the configuration changes; the next drain takes the
    /// new one. Every reader (`status`, `undrain`, a restarted leader) plans with
    /// it, so none needs the group's tags. Unreadable or out of bounds (a newer
    /// version, a hand edit): none, and the reader's own settings decide.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_limits"
    )]
    pub limits: Option<Limits>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How one drain ended, as the service that ran it wrote it on the Node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ended {
    /// The drain it is the end of ([`DrainRecord::drain`]).
    pub drain: u64,
    #[serde(flatten)]
    pub how: How,
    pub at: DateTime<Utc>,
}

/// The ways a drain ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "how", rename_all = "kebab-case")]
pub enum How {
    /// Its pods are gone; the instance is left running (the drain command) or to
    /// AWS (a notice).
    Drained,
    /// Its pods are gone and the instance was handed to its end: our hook's action
    /// completed, or the instance terminated (CA's direct scale-in).
    Ending,
    /// AWS stopped or ended the instance before the drain finished.
    InstanceLeft,
    /// Given up at its deadline (policy `abandon`).
    Abandoned { why: String },
    /// It could not go on (the instance could not be ended, the node not read); the
    /// record stays and a restarted service resumes it.
    Failed { why: String },
}

/// The most of a notice's kind read back from a Node that is kept.
pub const MAX_NOTICE: usize = 64;

/// The most of a `why` read back from a Node that is kept (anyone who may patch
/// Nodes may write it).
pub const MAX_WHY: usize = 1024;

impl How {
    /// The drain's pods are gone (whatever became of the instance).
    pub fn drained(&self) -> bool {
        matches!(self, How::Drained | How::Ending)
    }

    /// In a few words, for `status` (`abandoned: ...`).
    pub fn summary(&self) -> String {
        match self {
            How::Drained => "drained".into(),
            How::Ending => "drained, instance handed to its end".into(),
            How::InstanceLeft => "the instance stopped or ended first".into(),
            How::Abandoned { why } => format!("abandoned: {why}"),
            How::Failed { why } => format!("failed: {why}"),
        }
    }

    fn bounded(self) -> Self {
        let cut = |why: String| why.chars().take(MAX_WHY).collect::<String>();
        match self {
            How::Abandoned { why } => How::Abandoned { why: cut(why) },
            How::Failed { why } => How::Failed { why: cut(why) },
            other => other,
        }
    }
}

/// Reads [`DrainRecord::ended`]: a value this version cannot read (a newer version's
/// end) is none, so the rest of the record still reads.
fn lenient_ended<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Ended>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(d)?;
    Ok(value.and_then(|v| match serde_json::from_value::<Ended>(v) {
        Ok(e) => Some(e),
        Err(e) => {
            tracing::warn!(annotation = ANNOTATION, error = %e, "unreadable drain end in a Node's record (a newer version?); read as none");
            None
        }
    }))
}

fn lenient_limits<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Limits>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(d)?;
    Ok(value.and_then(|v| match serde_json::from_value::<Limits>(v) {
        Ok(l) if l.in_bounds() => Some(l),
        Ok(_) => {
            tracing::warn!(annotation = ANNOTATION, "a drain's deadline in a Node's record is out of bounds; the settings decide");
            None
        }
        Err(e) => {
            tracing::warn!(annotation = ANNOTATION, error = %e, "unreadable drain deadline in a Node's record (a newer version?); the settings decide");
            None
        }
    }))
}

/// What [`DrainRecord::join`] did to the drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    /// The plan is as before (a duplicate, a weaker reason, a later budget).
    Same,
    /// The plan changed: a running drain must take the new record.
    Changed,
}

/// How the instance ends once the node is drained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Complete our hook's lifecycle action CONTINUE.
    Lifecycle { hook: String },
    /// TerminateInstanceInAutoScalingGroup with decrement (CA's direct scale-in).
    Terminate,
    /// Leave the instance: AWS ends it (a notice) or it stays (the drain command).
    Leave,
}

/// The settings the plan needs: the drain's group's, kept in the record when the
/// drain begins ([`DrainRecord::limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    #[serde(rename = "workloadDeadlineMs", with = "millis")]
    pub workload_deadline: Duration,
    #[serde(rename = "policy")]
    pub workload_policy: DeadlinePolicy,
    /// For a drain our lifecycle hook holds: from the hold's start, the latest the
    /// workloads may take so that the DaemonSet and volume phases still end inside
    /// the hook's global timeout ([`crate::scalein::decide::budget::hook_room`]).
    /// A lifecycle reason's deadline is never later (AWS ends the instance then).
    #[serde(
        rename = "hookRoomMs",
        default,
        skip_serializing_if = "Option::is_none",
        with = "opt_millis"
    )]
    pub hook_room: Option<Duration>,
}

/// The longest deadline a record may carry: the longest AWS holds an instance.
const MAX_KEPT_DEADLINE: Duration = LIFECYCLE_ACTION_LIMIT;

impl Limits {
    fn in_bounds(&self) -> bool {
        self.workload_deadline <= MAX_KEPT_DEADLINE
            && self.hook_room.is_none_or(|r| r <= MAX_KEPT_DEADLINE)
    }
}

/// Durations on the Node in whole milliseconds (a deadline can be shorter than a
/// second in tests and models).
mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

mod opt_millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::millis::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<u64>::deserialize(d).map(|o| o.map(Duration::from_millis))
    }
}

/// What the drain does now, from every reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Some reason that asks for a drain is not done.
    pub drains: bool,
    pub ends: End,
    /// When the workload phase stops waiting; `None` when nothing drains.
    pub workload_deadline: Option<DateTime<Utc>>,
    /// What happens then.
    pub on_deadline: DeadlinePolicy,
    /// The earliest time AWS ends the instance whatever the drain does.
    pub budget_ends: Option<DateTime<Utc>>,
    /// Of that budget, what the DaemonSet pods get at its end.
    pub daemonset_share: Duration,
    /// When the drain began: the arrival of the earliest reason that drains
    /// ([`DrainRecord::drain_began`]); `None` when nothing drains.
    pub began: Option<DateTime<Utc>>,
    /// The workload deadline is our hook's: the group's deadline would not leave
    /// the DaemonSet and volume phases time inside the hook's global timeout.
    pub cut_by_hook: bool,
    /// The limits the plan was made with: the record's own, else the reader's.
    pub kept: Limits,
}

impl Plan {
    /// The workload deadline and its policy, in words: the one place a drain's
    /// deadline is said (the Node's conditions, `drain NODE`'s waiting lines).
    pub fn deadline_said(&self) -> String {
        match self.workload_deadline {
            Some(at) => format!(
                "workload deadline {}{} (then {})",
                at.format("%Y-%m-%dT%H:%M:%SZ"),
                if self.cut_by_hook {
                    ", set by our lifecycle hook's timeout"
                } else {
                    ""
                },
                self.on_deadline.then_said()
            ),
            None => "no workload deadline".into(),
        }
    }
}

/// `t + d`, saturating at the end of the calendar instead of panicking.
pub fn after(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn before(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| t.checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

impl DrainRecord {
    /// Reads the record from a Node's annotations at `now` (the only time it needs).
    /// A Node marked by an older version (start time and mode only) becomes one reason
    /// of that mode that arrived at the start time. `None`: the Node carries no drain.
    ///
    /// Every value is read back once here and bounded: what the rest of the drain sees
    /// can neither panic it nor make it bolder than the record meant. A reason never
    /// arrived after `now`; an unreadable start time is `now` (a deadline counted from
    /// long ago would end the workloads around their PodDisruptionBudgets at once);
    /// a DaemonSet share past [`MAX_DAEMONSET_SHARE`] is that maximum; a mode this
    /// version does not know (a newer one wrote it) drains and leaves the instance,
    /// never CA's direct scale-in (whose end lowers the desired capacity).
    pub fn read(
        annotations: &std::collections::BTreeMap<String, String>,
        now: DateTime<Utc>,
    ) -> Option<Self> {
        if let Some(json) = annotations.get(ANNOTATION) {
            match serde_json::from_str::<DrainRecord>(json) {
                Ok(r) if !r.reasons.is_empty() => return Some(r.bounded(now)),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(annotation = ANNOTATION, value = %json, error = %e, "unreadable drain record on a Node; reading its mode and start time instead");
                }
            }
        }
        let started = annotations.get(STARTED_ANNOTATION)?;
        let at = match started.parse::<DateTime<Utc>>() {
            Ok(t) => t.min(now),
            Err(e) => {
                tracing::warn!(annotation = STARTED_ANNOTATION, value = %started, error = %e, "unreadable drain start time on a Node; counting the drain from now");
                now
            }
        };
        let why = match annotations.get(MODE_ANNOTATION).map(String::as_str) {
            Some(REBALANCE_MARK) => Why::Rebalance,
            Some(DRAIN_ONLY_MARK) => Why::DrainCommand,
            Some(INTERRUPTION_MARK) => Why::Notice {
                notice: "unknown".into(),
                ends_at: None,
                daemonset_share_secs: 0,
            },
            Some(LIFECYCLE_MARK) => Why::Lifecycle {
                hook: String::new(),
                by_ca: false,
            },
            // `direct`, or no mode (what the first versions wrote for it): CA's
            // scale-in, so nothing CA counts on is lost.
            Some(DIRECT_MARK) | None => Why::ScaleIn,
            // A mode a newer version wrote: the node was leaving, so it drains (PDB-
            // safe), but nothing this version cannot name ends the instance or lowers
            // the desired capacity (fail closed).
            Some(other) => {
                tracing::warn!(annotation = MODE_ANNOTATION, mode = other, "unknown drain mode on a Node (a newer version?): draining it, leaving the instance");
                Why::DrainCommand
            }
        };
        Some(Self {
            reasons: vec![DrainReason::new(why, at)],
            ..Self::default()
        })
    }

    /// The record with what was read back bounded (see [`Self::read`]).
    fn bounded(mut self, now: DateTime<Utc>) -> Self {
        self.in_warm_pool_since = self.in_warm_pool_since.map(|t| t.min(now));
        self.ended = self.ended.map(|e| Ended {
            how: e.how.bounded(),
            at: e.at.min(now),
            ..e
        });
        for r in &mut self.reasons {
            r.at = r.at.min(now);
            if let Why::Notice {
                notice,
                daemonset_share_secs,
                ..
            } = &mut r.why
            {
                *daemonset_share_secs = (*daemonset_share_secs).min(MAX_DAEMONSET_SHARE.as_secs());
                if notice.chars().count() > MAX_NOTICE {
                    *notice = notice.chars().take(MAX_NOTICE).collect();
                }
            }
        }
        self
    }

    /// The JSON written to [`ANNOTATION`].
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a drain record serializes")
    }

    /// When the node was first asked to go (the cordon's time). For people only: no
    /// rule of the drain counts from it (see [`Self::drain_began`]).
    pub fn first_at(&self) -> Option<DateTime<Utc>> {
        self.reasons.iter().map(|r| r.at).min()
    }

    /// The reasons that drive the drain now: not done, and asking for a drain (a
    /// rebalance cordon never drains).
    fn draining(&self) -> impl Iterator<Item = &DrainReason> {
        self.reasons.iter().filter(|r| !r.done && r.why.drains())
    }

    /// When the drain began: the arrival of the earliest reason that drains and is
    /// not done, never a cordon-only or finished reason's. Every rule that counts
    /// from the drain's start (which pods are replacements, deadlines, budgets) asks
    /// this. `None`: nothing drains.
    pub fn drain_began(&self) -> Option<DateTime<Utc>> {
        self.draining().map(|r| r.at).min()
    }

    /// Takes a reason in. The same kind of reason again keeps its first arrival (a
    /// redelivered notice must not push its deadline out); a notice with an earlier
    /// budget shortens it; a reason whose drain is done starts afresh, unless it is
    /// the same notice again ([`Why::repeats`]), which stays done.
    pub fn join(&mut self, new: DrainReason, limits: Limits) -> Joined {
        let before = self.plan(limits);
        match self.reasons.iter_mut().find(|r| r.why.same_kind(&new.why)) {
            Some(old) if old.done && new.repeats(old) => {}
            Some(old) if old.done => *old = new,
            Some(old) => {
                if let (
                    Why::Notice {
                        ends_at: old_end,
                        daemonset_share_secs: old_share,
                        ..
                    },
                    Why::Notice {
                        ends_at: new_end,
                        daemonset_share_secs: new_share,
                        ..
                    },
                ) = (&mut old.why, &new.why)
                {
                    if ends_earlier(*new_end, *old_end) {
                        *old_end = *new_end;
                        *old_share = *new_share;
                    }
                }
                if let (
                    Why::Lifecycle {
                        hook: old_hook,
                        by_ca: old_by_ca,
                    },
                    Why::Lifecycle { hook, by_ca },
                ) = (&mut old.why, &new.why)
                {
                    if old_hook.is_empty() {
                        old_hook.clone_from(hook);
                    }
                    // CA asked for the hold (its DeleteNodes) whichever source
                    // found it first: it stays CA's.
                    *old_by_ca |= *by_ca;
                }
                old.at = old.at.min(new.at);
            }
            None => self.reasons.push(new),
        }
        // A drain begins where none ran: the next number, and none of the last
        // drain's deadline ([`Self::keep`] gives it its own).
        if !before.drains && self.drain_began().is_some() {
            self.limits = None;
        }
        let now = self.plan(limits);
        if now.drains && !before.drains {
            self.drain = self.next_drain();
        }
        if now == before {
            Joined::Same
        } else {
            Joined::Changed
        }
    }

    /// The drain that runs keeps `limits` (its group's, as the process that runs it
    /// has them) when it keeps none yet; a hold of our hook that joined it later
    /// brings the hook's room (the shorter one, if both have one). Nothing while
    /// nothing drains. The `drain` command's own cordon keeps nothing: the engine
    /// that runs the drain does.
    pub fn keep(&mut self, limits: Limits) {
        if self.drain_began().is_none() {
            return;
        }
        match &mut self.limits {
            None => self.limits = Some(limits),
            Some(kept) => {
                if let Some(room) = limits.hook_room {
                    kept.hook_room = Some(kept.hook_room.map_or(room, |r| r.min(room)));
                }
            }
        }
    }

    /// The limits the drain plans with: those it keeps, else the reader's.
    pub fn kept_or(&self, limits: Limits) -> Limits {
        self.limits.unwrap_or(limits)
    }

    /// Every reason's drain is finished (or given up): only a new reason drains again.
    pub fn mark_done(&mut self) {
        for r in &mut self.reasons {
            if r.why.drains() {
                r.done = true;
            }
        }
    }

    /// The drain ended `how`, at `at`: every reason's drain is done
    /// ([`Self::mark_done`]) and the end is written for the drain's followers.
    pub fn end(&mut self, how: How, at: DateTime<Utc>) {
        self.mark_done();
        self.note_end(how, at);
    }

    /// Writes how the running drain ended without marking its reasons done: CA's
    /// direct scale-in terminated the instance (its reason stays until AWS shows the
    /// instance gone), or a drain failed (a restart resumes it).
    pub fn note_end(&mut self, how: How, at: DateTime<Utc>) {
        self.ended = Some(Ended {
            drain: self.drain,
            how,
            at,
        });
    }

    /// The number of the drain a reason that drains, joining `record` now, drives:
    /// the running drain's, else the next one's ([`Self::join`] numbers it). `None`:
    /// the running drain is unnumbered (an older version wrote it), so only the
    /// older signs can tell its end.
    pub fn drain_joined(record: Option<&DrainRecord>) -> Option<u64> {
        let Some(r) = record else {
            return Some(1);
        };
        if r.drain_began().is_some() {
            return (r.drain != 0).then_some(r.drain);
        }
        Some(r.next_drain())
    }

    /// The number the next drain of the node takes: past the last one begun and the
    /// last one whose end is recorded.
    fn next_drain(&self) -> u64 {
        let last_ended = self.ended.as_ref().map_or(0, |e| e.drain);
        self.drain.max(last_ended) + 1
    }

    /// How drain number `drain` ended, when the record says.
    pub fn end_of(&self, drain: u64) -> Option<&Ended> {
        self.ended.as_ref().filter(|e| e.drain == drain)
    }

    /// The instance stopped or ended: the reasons that only drain it and leave it
    /// to AWS (a notice, the drain command) have nothing left to protect and are
    /// done. CA's scale-in and our hook stay: how the instance ends is still theirs
    /// (AWS's state says whether anything is left to do). True when anything
    /// changed.
    /// A drain that stops for it ended [`How::InstanceLeft`], at `at`.
    pub fn instance_left(&mut self, at: DateTime<Utc>) -> bool {
        let drained = self.drain_began().is_some();
        let mut changed = false;
        for r in &mut self.reasons {
            if !r.done && matches!(r.why, Why::Notice { .. } | Why::DrainCommand) {
                r.done = true;
                changed = true;
            }
        }
        if changed && drained && self.drain_began().is_none() {
            self.note_end(How::InstanceLeft, at);
        }
        changed
    }

    /// Drops CA's direct scale-in (its drain was abandoned and the node goes back to
    /// CA). True when anything else is left.
    pub fn without_scale_in(&mut self) -> bool {
        self.reasons.retain(|r| r.why != Why::ScaleIn);
        !self.reasons.is_empty()
    }

    /// Whether CA's direct scale-in is among the active reasons.
    pub fn has_scale_in(&self) -> bool {
        self.reasons
            .iter()
            .any(|r| r.why == Why::ScaleIn && !r.done)
    }

    /// Whether our hook's lifecycle action for the instance was completed, as far
    /// as `now` can still be that action: a finished lifecycle reason that arrived
    /// less than [`LIFECYCLE_ACTION_LIMIT`] ago. What a restarted process or a new
    /// leader knows of the action it did not complete itself. (An instance that
    /// went back to a warm pool and came out again must have its record cleared on
    /// its return, or its next action would be taken for this one.)
    pub fn lifecycle_completed(&self, now: DateTime<Utc>) -> bool {
        self.reasons.iter().any(|r| {
            r.done && matches!(r.why, Why::Lifecycle { .. }) && same_action_possible(r.at, now)
        })
    }

    /// When our hook's hold of the drain began, as the record keeps it: the earliest
    /// arrival of a lifecycle reason still driving the drain (known to within the
    /// lifecycle poll). What the gate's forced start and the load balancers' wait
    /// count the hook's global limit from, across restarts and leaders.
    pub fn hold_began(&self) -> Option<DateTime<Utc>> {
        self.reasons
            .iter()
            .filter(|r| !r.done && matches!(r.why, Why::Lifecycle { .. }))
            .map(|r| r.at)
            .min()
    }

    /// Our hook, when a lifecycle reason holds the instance.
    pub fn hook(&self) -> Option<&str> {
        self.reasons.iter().find_map(|r| match &r.why {
            Why::Lifecycle { hook, .. } => Some(hook.as_str()),
            _ => None,
        })
    }

    /// The mode written to the Node: the strongest reason's.
    pub fn mark(&self) -> &'static str {
        self.reasons
            .iter()
            .max_by_key(|r| mark_rank(r.why.mark()))
            .map(|r| r.why.mark())
            .unwrap_or(REBALANCE_MARK)
    }

    /// What the drain does now.
    pub fn plan(&self, limits: Limits) -> Plan {
        let limits = self.kept_or(limits);
        let drains = self.drain_began().is_some();
        let ends = if let Some(hook) = self.hook() {
            End::Lifecycle {
                hook: hook.to_string(),
            }
        } else if self.has_scale_in() {
            End::Terminate
        } else {
            End::Leave
        };
        // The earliest budget of any notice: it is a fact about the instance, not a
        // policy, so a notice whose drain is done still binds a new drain while its
        // end is ahead of that drain's start (a spot warning's reclaim). One that
        // ended before the new drain began (a scheduled reboot whose time passed,
        // the instance still in service) binds nothing any more.
        let began = self.drain_began();
        let budget = self
            .reasons
            .iter()
            .filter_map(|r| match &r.why {
                Why::Notice {
                    ends_at: Some(e),
                    daemonset_share_secs,
                    ..
                } if !r.done || began.is_some_and(|b| *e > b) => {
                    Some((*e, Duration::from_secs(*daemonset_share_secs)))
                }
                _ => None,
            })
            .min_by_key(|(e, _)| *e);
        let (budget_ends, daemonset_share) = match budget {
            Some((e, share)) => (Some(e), share),
            None => (None, Duration::ZERO),
        };
        // Each reason that drains keeps its own deadline, counted from its own
        // arrival (the earliest of them is [`Self::drain_began`]).
        let mut proceed: Option<DateTime<Utc>> = None;
        let mut abandon: Option<DateTime<Utc>> = None;
        let mut cut_by_hook = false;
        for r in self.draining() {
            let mut at = after(r.at, limits.workload_deadline);
            let policy = match r.why {
                // The ASG ends the instance whatever the hook's result, and at the
                // hook's global timeout at the latest: the workloads get what that
                // leaves the rest of the drain.
                Why::Lifecycle { .. } => {
                    if let Some(room) = limits.hook_room {
                        let cut = after(r.at, room);
                        if cut < at {
                            at = cut;
                            cut_by_hook = true;
                        }
                    }
                    DeadlinePolicy::Proceed
                }
                _ => limits.workload_policy,
            };
            match policy {
                DeadlinePolicy::Proceed => proceed = Some(proceed.map_or(at, |p| p.min(at))),
                DeadlinePolicy::Abandon => abandon = Some(abandon.map_or(at, |a| a.max(at))),
            }
        }
        // Any reason that goes on past its deadline decides (the instance ends
        // anyway); a drain kept only by reasons that give up is given up when the
        // last of them does.
        let mut deadline = match (proceed, abandon) {
            (Some(p), _) => Some((p, DeadlinePolicy::Proceed)),
            (None, Some(a)) => Some((a, DeadlinePolicy::Abandon)),
            (None, None) => None,
        };
        // A budget only ever shortens: when it runs out first the drain goes on
        // (the instance ends then anyway); a far one (a retirement days away) keeps
        // every deadline and policy.
        if let (true, Some((e, share))) = (drains, budget) {
            let forced = before(e, share);
            if deadline.is_none_or(|(d, _)| forced < d) {
                deadline = Some((forced, DeadlinePolicy::Proceed));
            }
        }
        let (workload_deadline, on_deadline) = match deadline {
            Some((d, p)) if drains => (Some(d), p),
            _ => (None, limits.workload_policy),
        };
        // The hook's cut is said only where it decides the drain's deadline.
        let cut_by_hook = cut_by_hook
            && workload_deadline.is_some()
            && self
                .draining()
                .filter(|r| matches!(r.why, Why::Lifecycle { .. }))
                .filter_map(|r| limits.hook_room.map(|room| after(r.at, room)))
                .any(|cut| Some(cut) == workload_deadline);
        Plan {
            drains,
            ends,
            workload_deadline,
            on_deadline,
            budget_ends,
            daemonset_share,
            began,
            cut_by_hook,
            kept: limits,
        }
    }
}

/// This service's taint on a Node it drains.
pub const TAINT_KEY: &str = "ca-asg-provider.io/draining";
/// The group a drained Node's instance was in, written with the cordon.
pub const GROUP_ANNOTATION: &str = "ca-asg-provider.io/drain-group";
/// The taint cluster-autoscaler puts on a node it is deleting. A node handed back
/// after an abandoned drain must not keep it, or it stays unschedulable.
pub const CA_TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// How a Node came to be cordoned, as the watch saw it happen. Only a change seen
/// tells who made it: cluster-autoscaler (>= 1.34) cordons the node it deletes in
/// the same write as its `ToBeDeletedByClusterAutoscaler` taint; a person's
/// `kubectl cordon` (or another tool's) comes without it. A Node first seen already
/// cordoned with CA's taint has no entry: who cordoned it is not known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CordonSeen {
    /// Last seen schedulable.
    Schedulable,
    /// Seen go from schedulable to cordoned with CA's deletion taint: CA's cordon.
    ByCa,
    /// Seen cordoned without CA's deletion taint or this service's taint: someone
    /// else's cordon (kept, whatever taint comes after).
    ByOther,
}

impl CordonSeen {
    /// What is known after seeing `n`, given what was known before.
    pub fn after(before: Option<CordonSeen>, n: &Node) -> Option<CordonSeen> {
        let spec = n.spec.as_ref();
        if spec.and_then(|s| s.unschedulable) != Some(true) {
            return Some(CordonSeen::Schedulable);
        }
        let tainted = |key: &str| {
            spec.and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == key))
        };
        if tainted(CA_TO_BE_DELETED_TAINT) {
            // Cordoned in the same write as CA's taint, or kept as it was.
            return match before {
                Some(CordonSeen::Schedulable) => Some(CordonSeen::ByCa),
                other => other,
            };
        }
        if tainted(TAINT_KEY) {
            // This service's own cordon (its record says so): nothing learned.
            return before;
        }
        Some(CordonSeen::ByOther)
    }
}

#[cfg(test)]
mod tests;
