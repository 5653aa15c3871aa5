//! The drain of one node: cordon, workloads (tiered, PDB-aware), DaemonSets last,
//! volumes, then end the instance. Deadlines count from the drain's recorded start, so
//! a resumed drain keeps its original deadlines.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use tracing::Instrument;

use super::cordon::{self, Cordoned};
use super::events::Reason;
use super::plan::{self, Tier};
use super::wait::NodePods;
use super::{
    evict, terminate, volumes, DaemonSetPolicy, DeadlinePolicy, DrainRequest, Engine, Mode,
    Outcome, Source,
};
use crate::telemetry::metrics::{metrics, StageLabels};

/// Why the pod phases stopped early.
enum Stop {
    Abandon(String),
    Fail(String),
}

pub async fn run(engine: &Arc<Engine>, req: &DrainRequest) -> Outcome {
    let span = tracing::info_span!(
        "drain",
        instance = %req.instance_id,
        group = %req.group,
        mode = req.mode.as_str(),
        source = ?req.source,
        node = tracing::field::Empty,
    );
    run_inner(engine, req).instrument(span).await
}

async fn run_inner(engine: &Arc<Engine>, req: &DrainRequest) -> Outcome {
    let node = match locate_node(engine, req).await {
        Ok(n) => n,
        Err(why) => return Outcome::Failed(why),
    };
    if let Some(n) = &node {
        tracing::Span::current().record("node", n.as_str());
    }
    let drained = match &node {
        Some(n) => drain_node(engine, req, n).await,
        None => {
            tracing::info!(
                "the API server has no Node for this instance (never registered or already gone); nothing to drain"
            );
            metrics().drains_without_node.inc();
            Ok(())
        }
    };
    let outcome = match drained {
        Ok(()) => match terminate::finish(
            engine,
            &req.mode,
            &req.group,
            &req.instance_id,
            node.as_deref(),
        )
        .await
        {
            Ok(_) if req.mode == Mode::DrainOnly => Outcome::Drained,
            Ok(_) => Outcome::Ended,
            Err(e) => {
                if let Some(n) = &node {
                    engine
                        .events
                        .node(
                            n,
                            Reason::DrainFailed,
                            format!("could not end instance {}: {e}", req.instance_id),
                        )
                        .await;
                }
                Outcome::Failed(e)
            }
        },
        Err(Stop::Abandon(why)) => {
            abandon(engine, req, node.as_deref(), &why).await;
            Outcome::Abandoned(why)
        }
        Err(Stop::Fail(why)) => {
            if let Some(n) = &node {
                engine
                    .events
                    .node(n, Reason::DrainFailed, why.clone())
                    .await;
            }
            Outcome::Failed(why)
        }
    };
    outcome
}

/// Fail closed: the drain goes on only with the instance's Node, or with the API
/// server's word that there is none. While the cache is not synced or the API server
/// cannot be asked (down, RBAC), it retries until the workload deadline and then
/// fails without ending the instance.
async fn locate_node(engine: &Engine, req: &DrainRequest) -> Result<Option<String>, String> {
    let give_up = Instant::now() + engine.settings.workload_deadline;
    let mut delay = Duration::from_millis(200);
    loop {
        match engine
            .find_node(&req.instance_id, req.node_name.as_deref())
            .await
        {
            Ok(n) => return Ok(n),
            Err(e) if Instant::now() + delay < give_up => {
                tracing::warn!(error = %e, retry_in = ?delay, "cannot tell whether the instance has a Node; not ending it, retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(15));
            }
            Err(e) => {
                return Err(format!(
                    "cannot tell whether instance {} has a Node ({e}); the instance is not ended",
                    req.instance_id
                ))
            }
        }
    }
}

pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn abandon(engine: &Engine, req: &DrainRequest, node: Option<&str>, why: &str) {
    let what = match &req.mode {
        Mode::Direct => {
            if let Some(n) = node {
                if let Err(e) = cordon::uncordon(engine, n).await {
                    tracing::warn!(node = n, error = %e, "could not uncordon the abandoned node");
                }
            }
            if let Some(p) = &engine.provider {
                p.deferred_cancelled(&req.instance_id);
            }
            "the node is uncordoned and stays; the target size is restored"
        }
        Mode::Lifecycle { .. } => {
            "heartbeats stop; the ASG ends the instance when the lifecycle hook times out (its default result applies)"
        }
        Mode::DrainOnly => "the node stays cordoned",
    };
    if let Some(n) = node {
        engine
            .events
            .node(
                n,
                Reason::DrainAbandoned,
                format!("drain abandoned: {why}; {what}"),
            )
            .await;
    }
}

fn started_instant(started_at: &str) -> Instant {
    let now = Instant::now();
    let Ok(ts) = started_at.parse::<k8s_openapi::jiff::Timestamp>() else {
        return now;
    };
    let elapsed = k8s_openapi::jiff::Timestamp::now().duration_since(ts);
    let secs = elapsed.as_secs_f64();
    if secs.is_finite() && secs > 0.0 {
        now.checked_sub(Duration::from_secs_f64(secs.min(30.0 * 86400.0)))
            .unwrap_or(now)
    } else {
        now
    }
}

async fn drain_node(engine: &Engine, req: &DrainRequest, node: &str) -> Result<(), Stop> {
    let s = &engine.settings;
    let m = metrics();
    let stage = m.stage("cordon");
    let started = match cordon::cordon(engine, node, req.mode.as_str(), &req.group).await {
        Ok(Cordoned::NodeGone) => {
            tracing::info!(node, "the Node object is gone; nothing to drain");
            return Ok(());
        }
        Ok(Cordoned::Marked {
            started_at,
            resumed,
        }) => {
            let note = format!(
                "draining node for instance {} of group {} ({} mode, asked by {:?}{}); workloads first, DaemonSet pods {}",
                req.instance_id,
                req.group,
                req.mode.as_str(),
                req.source,
                if resumed && req.source == Source::Resume {
                    ", resumed after a restart"
                } else {
                    ""
                },
                match s.daemonsets {
                    DaemonSetPolicy::EvictLast => "last",
                    DaemonSetPolicy::Keep => "kept",
                }
            );
            engine.events.node(node, Reason::DrainStarted, note).await;
            started_instant(&started_at)
        }
        Err(e) => return Err(Stop::Fail(format!("could not cordon node {node}: {e}"))),
    };
    drop(stage);
    let stage = m.stage("workloads");
    let mut pods = NodePods::watch(engine.client.clone(), node);
    let workload_deadline = started + s.workload_deadline;
    if !pods.synced(workload_deadline).await {
        return deadline(
            engine,
            node,
            "workloads",
            s.workload_deadline,
            s.workload_deadline_policy,
            0,
        )
        .await;
    }

    // Phase 1: every workload pod.
    if let Err(left) = phase(
        engine,
        node,
        &mut pods,
        plan::Phase::Workloads,
        workload_deadline,
    )
    .await
    {
        deadline(
            engine,
            node,
            "workloads",
            s.workload_deadline,
            s.workload_deadline_policy,
            left,
        )
        .await?;
    } else {
        engine
            .events
            .node(
                node,
                Reason::WorkloadsGone,
                "every workload pod has exited".into(),
            )
            .await;
    }

    // Phase 2: DaemonSet pods, only now.
    drop(stage);
    if s.daemonsets == DaemonSetPolicy::EvictLast {
        let _stage = m.stage("daemonsets");
        let ds_deadline = Instant::now() + s.daemonset_deadline;
        if let Err(left) = phase(
            engine,
            node,
            &mut pods,
            plan::Phase::DaemonSets,
            ds_deadline,
        )
        .await
        {
            deadline(
                engine,
                node,
                "DaemonSet pods",
                s.daemonset_deadline,
                s.daemonset_deadline_policy,
                left,
            )
            .await?;
        } else {
            engine
                .events
                .node(
                    node,
                    Reason::DaemonSetsGone,
                    "every DaemonSet pod has exited".into(),
                )
                .await;
        }
    }
    drop(pods);

    // Phase 3: volumes.
    let _stage = m.stage("volumes");
    let left = volumes::wait_detached(engine, node, Instant::now() + s.volume_deadline).await;
    if left.is_empty() {
        engine
            .events
            .node(
                node,
                Reason::VolumesDetached,
                "no VolumeAttachment left on the node".into(),
            )
            .await;
    } else {
        engine
            .events
            .node(node, Reason::DeadlineHit, format!("volume detach deadline {:?} passed with {} attachment(s) left ({}); proceeding", s.volume_deadline, left.len(), left.join(", ")))
            .await;
    }
    Ok(())
}

/// A phase deadline passed with `left` pods still there: apply the policy, loudly.
async fn deadline(
    engine: &Engine,
    node: &str,
    what: &str,
    limit: Duration,
    policy: DeadlinePolicy,
    left: usize,
) -> Result<(), Stop> {
    engine
        .stats
        .deadlines_hit
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    metrics()
        .deadlines
        .get_or_create(&StageLabels {
            stage: what.to_string(),
        })
        .inc();
    let note = format!(
        "{what} deadline {limit:?} passed with {left} pod(s) still on the node; policy {}",
        policy.as_str()
    );
    engine
        .events
        .node(node, Reason::DeadlineHit, note.clone())
        .await;
    match policy {
        DeadlinePolicy::Proceed => Ok(()),
        DeadlinePolicy::Abandon => Err(Stop::Abandon(note)),
    }
}

/// Runs tiers until nothing of the phase is left. `Err(n)`: the deadline passed with
/// `n` pods left.
async fn phase(
    engine: &Engine,
    node: &str,
    pods: &mut NodePods,
    which: plan::Phase,
    deadline: Instant,
) -> Result<(), usize> {
    // DaemonSets whose pods come back after eviction tolerate our taint; once one of
    // theirs was evicted, a replacement ends with the instance instead of looping.
    let mut evicted_uids: HashSet<String> = HashSet::new();
    let mut evicted_owners: HashSet<String> = HashSet::new();
    loop {
        let current: Vec<_> = pods
            .pods()
            .into_iter()
            .filter(|p| {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                if evicted_uids.contains(&uid) {
                    return true;
                }
                !(plan::is_daemonset_pod(p)
                    && owner_uid(p).is_some_and(|o| evicted_owners.contains(&o)))
            })
            .collect();
        let step = plan::next_step(&current, which);
        let Some(tier) = step.tier else { return Ok(()) };
        if tier == Tier::DoNotDisrupt && !step.evict.is_empty() {
            let names: Vec<String> = step.evict.iter().map(|p| p.to_string()).collect();
            engine
                .events
                .node(node, Reason::EvictingDoNotDisrupt, format!("evicting pods that asked not to be disrupted ({}): the instance is ending anyway, so they go last among workloads", names.join(", ")))
                .await;
        }
        for p in &current {
            if plan::is_daemonset_pod(p)
                && step
                    .evict
                    .iter()
                    .any(|r| Some(&r.uid) == p.metadata.uid.as_ref())
            {
                if let Some(o) = owner_uid(p) {
                    evicted_owners.insert(o);
                }
            }
        }
        let pods_ref: &NodePods = pods;
        let accepted = join_all(step.evict.iter().map(|p| {
            let uid = p.uid.clone();
            evict::until_accepted(engine, node, p, deadline, move || pods_ref.contains(&uid))
        }))
        .await;
        evicted_uids.extend(step.evict.iter().map(|p| p.uid.clone()));
        let uids: Vec<String> = step
            .evict
            .iter()
            .chain(step.wait.iter())
            .map(|p| p.uid.clone())
            .collect();
        if !accepted.iter().all(|a| *a) || !pods.wait_gone(&uids, deadline).await {
            let left = uids.iter().filter(|u| pods.contains(u)).count();
            return Err(left);
        }
        tracing::debug!(node, tier = tier.as_str(), count = uids.len(), "tier gone");
    }
}

fn owner_uid(p: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
    p.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.clone())
}
