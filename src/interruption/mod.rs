//! Queue mode (`interruption.queueUrl`): EC2 interruption notices and the ASG's
//! lifecycle actions from an SQS queue fed by EventBridge, each turned into the same
//! DaemonSet-last, PDB-safe drain. Only the leader consumes. A message is deleted
//! once it is handled (the drain started, the node cordoned, or nothing to do), or
//! when it can never be handled (malformed, or received too often); anything else is
//! left for SQS to deliver again.
//!
//! - [`notice`]: what a message says (pure);
//! - [`decide`]: what to do about it (pure);
//! - [`consumer`]: the loop, the look-ups and the engine calls.

pub mod consumer;
pub mod decide;
pub mod notice;

use std::time::Duration;

use serde::Deserialize;

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

/// Queue-mode configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct InterruptionSettings {
    /// The SQS queue; `None` turns queue mode off.
    pub queue_url: Option<String>,
    pub rebalance: RebalanceAction,
    /// Also act on instances of groups this service does not manage.
    pub unmanaged: bool,
    /// Messages per receive (SQS allows 1 to 10).
    pub batch: i32,
    /// Messages handled at once.
    pub concurrency: usize,
    /// Long-poll wait per receive (at most 20 s).
    pub wait: Duration,
    /// Of a spot interruption's two minutes (or a scheduled change's time), what the
    /// DaemonSet pods get at the end.
    pub daemonset_share: Duration,
    /// A message received this often without being handled is dropped.
    pub max_receives: u32,
    /// With the queue on, the lifecycle poll is only a safety net this slow.
    pub safety_net_poll: Duration,
}

impl Default for InterruptionSettings {
    fn default() -> Self {
        Self {
            queue_url: None,
            rebalance: RebalanceAction::Cordon,
            unmanaged: false,
            batch: 10,
            concurrency: 10,
            wait: Duration::from_secs(20),
            daemonset_share: Duration::from_secs(20),
            max_receives: 5,
            safety_net_poll: Duration::from_secs(300),
        }
    }
}
