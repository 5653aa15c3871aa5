//! Kubernetes Events on the Node for every stage, and the matching log line.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use std::sync::Arc;

use crate::scalein::decide::plan::PodRef;
use crate::scalein::kube::ratelimit::RateLimiter;

pub const REPORTER: &str = "ca-asg-provider";

pub struct Events {
    recorder: Recorder,
    /// Per-pod Events go through this queue to one publisher, so an eviction never
    /// waits for its Event. `None` outside a runtime: published inline.
    pod_events: Option<tokio::sync::mpsc::Sender<(ObjectReference, Event)>>,
    /// Node Events wait here (published before any pod Event) while drain requests
    /// wait for API tokens: in a storm paced by `apiQps` the drains' own requests
    /// go first, and the Node's story follows in order when the storm leaves room.
    node_events: Option<tokio::sync::mpsc::Sender<(ObjectReference, Event)>>,
    /// Whether a drain request waits for an API token now.
    limiter: Option<Arc<RateLimiter>>,
}

/// Node Events waiting for a storm to leave room; beyond this a Node Event is
/// published at once, at the drains' priority (never lost, and the drains slow to
/// what the API allows for both). 500 nodes make about 3,500.
const NODE_EVENT_QUEUE: usize = 16_384;

/// Per-pod Events waiting to be published; beyond this they are dropped and counted
/// (`pod_events_dropped_total`), their log line already written. A storm of 500 nodes
/// makes about 6,000.
const POD_EVENT_QUEUE: usize = 8192;

/// Why an Event was published (the Event's `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    DrainStarted,
    EvictionBlocked,
    EvictingDoNotDisrupt,
    /// Pods that run to completion (`safe-to-evict: "on-completion"`) are waited for.
    WaitingForCompletion,
    /// CA scales in a node of a group some of whose autoscaling-options tags could
    /// not be used: CA decided with its defaults for those.
    OptionTagsIgnored,
    WorkloadsGone,
    DaemonSetsGone,
    VolumesDetached,
    DeadlineHit,
    DrainAbandoned,
    InstanceTerminated,
    LifecycleCompleted,
    DrainFailed,
    HeartbeatFailed,
    PodNotWaitedFor,
    DaemonSetEvictedEarly,
    /// On the pod: evicted (or, at a proceed deadline, deleted) for a drain.
    PodEvicted,
    /// `serve --dry-run`: the drain that would have run, pod by pod.
    DryRunDrain,
    /// An interruption drain (spot, scheduled change) ended: how it stood against
    /// the time AWS ends the instance.
    InterruptionDrained,
    /// An interruption drain still ran when AWS ended the instance.
    InterruptionBudgetMissed,
    /// A rebalance recommendation: cordoned only.
    RebalanceCordoned,
    /// The drained instance rests in its group's warm pool (ReuseOnScaleIn).
    ReturnedToWarmPool,
    /// The instance left the warm pool for its group: the node is handed back.
    BackFromWarmPool,
    /// An instance in the warm pool has a Node this service never drained: its
    /// bootstrap joined the cluster while warming.
    RegisteredWhileWarming,
    /// A cordoned node's drain waits for a disruption budget (once per wait).
    DrainWaitingForBudget,
    /// A drain our hook holds started past a budget, to finish inside the hook's
    /// global timeout.
    DrainForcedPastBudget,
    /// At a drain's start: a PodDisruptionBudget that can never allow the eviction
    /// of some of its pods while the drain waits (the deadline ends the wait).
    EvictionDeadlocked,
    /// At a drain's start: our hook's global timeout leaves the workloads less than
    /// their group's deadline.
    DeadlineCutByHook,
    /// Before the instance ends: waiting until it is out of the load balancers'
    /// target groups that have it.
    WaitingForLoadBalancers,
    /// A target group could not be read (a permission missing, AWS throttling): it is
    /// waited on up to its bound only.
    LoadBalancerUnreadable,
    /// The wait for the load balancers ended with the instance still in a target
    /// group (its bound reached): the instance ends anyway.
    LoadBalancerWaitOver,
    /// The service deregistered the instance from target groups attached to its
    /// Auto Scaling group (`scaleIn.loadBalancers.deregister`).
    DeregisteredFromLoadBalancers,
    /// The service could not deregister the instance from a target group attached
    /// to its group (a permission missing, AWS throttling): the wait goes on as
    /// without it, bounded.
    LoadBalancerNotDeregistered,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::DrainStarted => "DrainStarted",
            Reason::EvictionBlocked => "EvictionBlocked",
            Reason::EvictingDoNotDisrupt => "EvictingDoNotDisrupt",
            Reason::WaitingForCompletion => "WaitingForCompletion",
            Reason::OptionTagsIgnored => "OptionTagsIgnored",
            Reason::WorkloadsGone => "WorkloadsGone",
            Reason::DaemonSetsGone => "DaemonSetsGone",
            Reason::VolumesDetached => "VolumesDetached",
            Reason::DeadlineHit => "DeadlineHit",
            Reason::DrainAbandoned => "DrainAbandoned",
            Reason::InstanceTerminated => "InstanceTerminated",
            Reason::LifecycleCompleted => "LifecycleCompleted",
            Reason::DrainFailed => "DrainFailed",
            Reason::HeartbeatFailed => "LifecycleHeartbeatFailed",
            Reason::PodNotWaitedFor => "PodNotWaitedFor",
            Reason::DaemonSetEvictedEarly => "DaemonSetEvictedEarly",
            Reason::PodEvicted => "Evicted",
            Reason::DryRunDrain => "DryRunDrain",
            Reason::InterruptionDrained => "InterruptionDrained",
            Reason::InterruptionBudgetMissed => "InterruptionBudgetMissed",
            Reason::RebalanceCordoned => "RebalanceCordoned",
            Reason::ReturnedToWarmPool => "ReturnedToWarmPool",
            Reason::BackFromWarmPool => "BackFromWarmPool",
            Reason::RegisteredWhileWarming => "RegisteredWhileWarming",
            Reason::DrainWaitingForBudget => "DrainWaitingForBudget",
            Reason::DrainForcedPastBudget => "DrainForcedPastBudget",
            Reason::EvictionDeadlocked => "EvictionDeadlocked",
            Reason::DeadlineCutByHook => "DeadlineCutByHook",
            Reason::WaitingForLoadBalancers => "WaitingForLoadBalancers",
            Reason::LoadBalancerUnreadable => "LoadBalancerUnreadable",
            Reason::LoadBalancerWaitOver => "LoadBalancerWaitOver",
            Reason::DeregisteredFromLoadBalancers => "DeregisteredFromLoadBalancers",
            Reason::LoadBalancerNotDeregistered => "LoadBalancerNotDeregistered",
        }
    }

    fn is_warning(self) -> bool {
        matches!(
            self,
            Reason::EvictionBlocked
                | Reason::DeadlineHit
                | Reason::DrainAbandoned
                | Reason::DrainFailed
                | Reason::EvictingDoNotDisrupt
                | Reason::OptionTagsIgnored
                | Reason::HeartbeatFailed
                | Reason::PodNotWaitedFor
                | Reason::DaemonSetEvictedEarly
                | Reason::InterruptionBudgetMissed
                | Reason::RegisteredWhileWarming
                | Reason::DrainForcedPastBudget
                | Reason::EvictionDeadlocked
                | Reason::DeadlineCutByHook
                | Reason::LoadBalancerUnreadable
                | Reason::LoadBalancerWaitOver
                | Reason::LoadBalancerNotDeregistered
        )
    }
}

impl Events {
    /// `spare_client` publishes what waits (a lower-priority client); `limiter` says
    /// when drain requests wait for tokens (`None`: Node Events always inline).
    pub fn new(
        client: kube::Client,
        spare_client: kube::Client,
        limiter: Option<Arc<RateLimiter>>,
    ) -> Self {
        let reporter = Reporter {
            controller: REPORTER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let recorder = Recorder::new(client, reporter.clone());
        let queues = tokio::runtime::Handle::try_current().ok().map(|rt| {
            let (pod_tx, mut pods) =
                tokio::sync::mpsc::channel::<(ObjectReference, Event)>(POD_EVENT_QUEUE);
            let (node_tx, mut nodes) =
                tokio::sync::mpsc::channel::<(ObjectReference, Event)>(NODE_EVENT_QUEUE);
            let recorder = Recorder::new(spare_client, reporter);
            // Ends when the Events (and so the senders) are dropped.
            rt.spawn(async move {
                loop {
                    let next = tokio::select! {
                        biased;
                        Some(e) = nodes.recv() => e,
                        Some(e) = pods.recv() => e,
                        else => break,
                    };
                    publish_to(&recorder, next.0, next.1).await;
                }
            });
            (pod_tx, node_tx)
        });
        let (pod_events, node_events) = queues.unzip();
        Self {
            recorder,
            pod_events,
            node_events,
            limiter,
        }
    }

    /// Publishes an Event on the Node. A failure to publish is logged, never fatal.
    pub async fn node(&self, node: &str, reason: Reason, note: String) {
        self.publish(node, reason, note, None).await
    }

    /// An Event on the Node about one of its pods: the pod is the Event's related
    /// object, so events about different pods are not folded into one series.
    pub async fn node_about_pod(&self, node: &str, reason: Reason, note: String, pod: &PodRef) {
        self.publish(node, reason, note, Some(pod_reference(pod)))
            .await
    }

    /// Per-pod Events queued and not yet published.
    pub fn pod_events_pending(&self) -> usize {
        self.pod_events
            .as_ref()
            .map_or(0, |q| q.max_capacity() - q.capacity())
    }

    /// An Event on the Pod itself (its node as the related object), where the
    /// application's owners look (`kubectl describe pod`, `kubectl get events -n`).
    /// Queued, not awaited: the drain goes on while it is published, and the rate
    /// limiter sends Events only with tokens no drain request waits for.
    pub async fn pod(&self, pod: &PodRef, node: &str, reason: Reason, note: String) {
        tracing::info!(node, pod = %pod, reason = reason.as_str(), "{note}");
        let ev = event(reason, note, Some(node_reference(node)));
        match &self.pod_events {
            Some(queue) => {
                if queue.try_send((pod_reference(pod), ev)).is_err() {
                    crate::telemetry::metrics::metrics()
                        .pod_events_dropped
                        .inc();
                }
            }
            None => publish_to(&self.recorder, pod_reference(pod), ev).await,
        }
    }

    async fn publish(
        &self,
        node: &str,
        reason: Reason,
        note: String,
        related: Option<ObjectReference>,
    ) {
        if reason.is_warning() {
            tracing::warn!(node, reason = reason.as_str(), "{note}");
        } else {
            tracing::info!(node, reason = reason.as_str(), "{note}");
        }
        let ev = event(reason, note, related);
        // Queued only while drain requests wait for tokens, and after that while
        // older ones are queued, so a Node's Events keep their order.
        if let Some(queue) = &self.node_events {
            let busy = self.limiter.as_ref().is_some_and(|l| l.contended());
            if busy || queue.capacity() < queue.max_capacity() {
                match queue.try_send((node_reference(node), ev)) {
                    Ok(()) => return,
                    Err(e) => {
                        let (reference, ev) = e.into_inner();
                        return publish_to(&self.recorder, reference, ev).await;
                    }
                }
            }
        }
        publish_to(&self.recorder, node_reference(node), ev).await
    }
}

/// A failure to publish is logged, never fatal.
async fn publish_to(recorder: &Recorder, reference: ObjectReference, ev: Event) {
    if let Err(e) = recorder.publish(&ev, &reference).await {
        tracing::debug!(object = ?reference.name, error = %e, "could not publish event");
    }
}

fn event(reason: Reason, note: String, related: Option<ObjectReference>) -> Event {
    Event {
        type_: if reason.is_warning() {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.as_str().into(),
        note: Some(truncate(note, 1000)),
        action: "Drain".into(),
        secondary: related,
    }
}

fn node_reference(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_string()),
        uid: Some(node.to_string()),
        ..Default::default()
    }
}

fn pod_reference(pod: &PodRef) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(pod.namespace.clone()),
        name: Some(pod.name.clone()),
        uid: Some(pod.uid.clone()),
        ..Default::default()
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}
