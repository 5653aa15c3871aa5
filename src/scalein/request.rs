//! What a drain is asked for and how it ends: the request (who asks, how the
//! instance ends, the reasons it brings), what starting it did, its outcome, and how
//! a request joins the one that runs.

use std::time::Duration;

use crate::cloud::LifecycleAction;
use crate::scalein::decide::record;

/// How the instance ends once the node is drained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// The ASG holds the instance in Terminating:Wait; finish with CONTINUE.
    Lifecycle {
        action: LifecycleAction,
        heartbeat_timeout: Duration,
    },
    /// No hook: terminate with decrement once drained.
    Direct,
    /// `drain NODE` from the command line: drain only, the instance is left alone.
    DrainOnly,
}

impl Mode {
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Lifecycle { .. } => "lifecycle",
            Mode::Direct => record::DIRECT_MARK,
            Mode::DrainOnly => record::DRAIN_ONLY_MARK,
        }
    }
}

/// Who asked for the drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    ClusterAutoscaler,
    /// The ASG started the termination (policy, rebalancing, refresh, a person).
    Asg,
    /// Found half-done after a restart.
    Resume,
    Cli,
    /// An EC2 interruption notice from the queue (spot, rebalance, scheduled change).
    Interruption,
}

impl Source {
    /// Metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Source::ClusterAutoscaler => "cluster-autoscaler",
            Source::Asg => "asg",
            Source::Resume => "resumed",
            Source::Cli => "drain-command",
            Source::Interruption => "interruption",
        }
    }

    /// Who asked, in words (Events and logs an operator reads).
    pub fn said(&self) -> &'static str {
        match self {
            Source::ClusterAutoscaler => "cluster-autoscaler",
            Source::Asg => "the Auto Scaling group",
            Source::Resume => "a drain resumed after a restart",
            Source::Cli => "the drain command",
            Source::Interruption => "an EC2 interruption notice",
        }
    }

    /// Why the node is drained, for the Events on its pods.
    pub fn why(&self) -> &'static str {
        match self {
            Source::ClusterAutoscaler => "scale-in by cluster-autoscaler",
            Source::Asg => "the Auto Scaling Group is ending the instance (scaling policy, rebalancing, instance refresh or a person); held by a lifecycle hook",
            Source::Resume => "a scale-in resumed after a restart",
            Source::Cli => "the drain command",
            Source::Interruption => "an EC2 interruption notice (spot interruption, rebalance recommendation or scheduled maintenance)",
        }
    }
}

#[derive(Debug, Clone)]
pub struct DrainRequest {
    pub instance_id: String,
    pub group: String,
    /// The Node's name when known; otherwise found by providerID.
    pub node_name: Option<String>,
    pub mode: Mode,
    pub source: Source,
    /// The reasons this request brings (recorded on the Node with every reason
    /// already there). Empty: a resumed drain, which follows what the Node says.
    pub reasons: Vec<record::DrainReason>,
    /// The notice that asked for the drain (queue mode): its kind and AWS's time,
    /// for the time from notice to the instance's end.
    pub noticed: Option<(&'static str, chrono::DateTime<chrono::Utc>)>,
}

impl DrainRequest {
    /// The drain of an instance our hook holds (`mode`, lifecycle), as every source
    /// that finds a hold asks for it (the lifecycle scan, the queue): the ASG's own
    /// scale-in, the Node found by providerID, our hook's reason, and the notice that
    /// told of it when a message did.
    pub fn lifecycle(
        instance_id: &str,
        group: &str,
        mode: Mode,
        noticed: Option<(&'static str, chrono::DateTime<chrono::Utc>)>,
    ) -> Self {
        DrainRequest {
            instance_id: instance_id.to_string(),
            group: group.to_string(),
            node_name: None,
            reasons: vec![ca_reason(&mode)],
            mode,
            source: Source::Asg,
            noticed,
        }
    }
}

/// How a drain ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The instance was ended (or its lifecycle action completed).
    Ended,
    /// Drain-only finished (CLI).
    Drained,
    Abandoned(String),
    Failed(String),
    /// `serve --dry-run`: what the drain would have done; nothing was.
    Observed(String),
}

/// What [`Engine::start`] did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// A new drain runs.
    Started,
    /// A drain ran; the request's reasons changed its plan, so it goes on with them.
    Joined,
    /// A drain runs whose plan the request does not change (a duplicate).
    Unchanged,
    /// Not started: dry run already described it, or this replica does not lead.
    Refused,
}

impl Start {
    /// Whether the request now drives a drain (new or joined).
    pub fn acted(self) -> bool {
        matches!(self, Start::Started | Start::Joined)
    }
}

/// The request a joined drain goes on with: every reason, the hook's action (with
/// its token) when either request has it, and what either knew of the Node and the
/// notice.
pub(crate) fn merge(
    old: DrainRequest,
    new: DrainRequest,
    joined: record::DrainRecord,
) -> DrainRequest {
    let mode = match (&old.mode, &new.mode) {
        (_, Mode::Lifecycle { .. }) => new.mode.clone(),
        (Mode::Lifecycle { .. }, _) => old.mode.clone(),
        (Mode::Direct, _) | (_, Mode::Direct) => Mode::Direct,
        _ => new.mode.clone(),
    };
    DrainRequest {
        group: if new.group.is_empty() {
            old.group
        } else {
            new.group
        },
        node_name: new.node_name.or(old.node_name),
        noticed: new.noticed.or(old.noticed),
        reasons: joined.reasons,
        mode,
        ..new
    }
}

/// The reason CA's scale-in brings in `mode`.
pub fn ca_reason(mode: &Mode) -> record::DrainReason {
    record::DrainReason::new(reason_of_mode(mode), crate::clock::utc_now())
}

/// What a drain in `mode` is asked for: our hook's action, CA's direct scale-in, or
/// the drain command.
pub fn reason_of_mode(mode: &Mode) -> record::Why {
    match mode {
        Mode::Lifecycle { action, .. } => record::Why::Lifecycle {
            hook: action.hook.clone(),
            by_ca: false,
        },
        Mode::Direct => record::Why::ScaleIn,
        Mode::DrainOnly => record::Why::DrainCommand,
    }
}
