//! ASG lifecycle integration: find instances held in `Terminating:Wait` (whoever
//! started the termination), keep their hooks alive with heartbeats while they drain,
//! create hooks when asked, and resume drains after a restart from what AWS and the
//! Nodes say.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::cloud::{LifecycleAction, LifecycleHook, LifecycleState};
use crate::provider::Provider;
use crate::telemetry::metrics::{metrics, Metrics};

use super::{DrainRequest, Engine, Mode, ModeChoice, Source};

/// Sends RecordLifecycleActionHeartbeat at a third of the hook's timeout until
/// aborted, so a long drain never lets the hook expire.
pub fn heartbeats(
    engine: Arc<Engine>,
    action: LifecycleAction,
    timeout: Duration,
) -> tokio::task::JoinHandle<()> {
    let every = (timeout / 3).max(Duration::from_millis(200));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            match engine.cloud.lifecycle_heartbeat(&action).await {
                Ok(()) => {
                    engine.stats.heartbeats.fetch_add(1, Ordering::Relaxed);
                    Metrics::outcome(&metrics().heartbeats, "ok");
                    tracing::debug!(instance = %action.instance_id, hook = %action.hook, "lifecycle heartbeat recorded");
                }
                Err(e) => {
                    Metrics::outcome(&metrics().heartbeats, "error");
                    tracing::warn!(instance = %action.instance_id, hook = %action.hook, error = %e, "lifecycle heartbeat failed")
                }
            }
        }
    })
}

/// One pass: create missing hooks (when configured) and start a drain for every
/// instance in Terminating:Wait that is not draining yet. Returns how many started.
pub async fn scan(engine: &Arc<Engine>, provider: &Arc<Provider>) -> usize {
    if let Err(e) = provider.refresh().await {
        tracing::warn!(error = %e, "lifecycle scan: refresh failed");
        return 0;
    }
    let reg = provider.registry();
    let mut started = 0;
    for g in &reg.groups {
        if g.hooks.is_empty() {
            if engine.settings.create_hook && engine.settings.mode == ModeChoice::Auto {
                let hook = LifecycleHook {
                    name: engine.settings.hook_name.clone(),
                    heartbeat_timeout_secs: engine
                        .settings
                        .hook_heartbeat_timeout
                        .as_secs()
                        .clamp(30, 7200) as i32,
                    default_result: "CONTINUE".into(),
                };
                match engine.cloud.put_terminating_hook(&g.asg.name, &hook).await {
                    Ok(()) => {
                        tracing::info!(group = %g.asg.name, hook = %hook.name, "created EC2_INSTANCE_TERMINATING lifecycle hook");
                        provider.invalidate();
                    }
                    Err(e) => {
                        tracing::warn!(group = %g.asg.name, error = %e, "could not create the lifecycle hook")
                    }
                }
            }
            continue;
        }
        for inst in &g.asg.instances {
            if inst.state != LifecycleState::TerminatingWait || engine.is_draining(&inst.id) {
                continue;
            }
            let mode = engine.mode_for(g, &inst.id);
            if !matches!(mode, Mode::Lifecycle { .. }) {
                continue;
            }
            if engine.start(DrainRequest {
                instance_id: inst.id.clone(),
                group: g.asg.name.clone(),
                node_name: None,
                mode,
                source: Source::Asg,
            }) {
                started += 1;
            }
        }
    }
    started
}

/// Resumes direct-mode drains recorded on Nodes (lifecycle-mode ones are found by
/// [`scan`] from AWS). Returns how many resumed.
pub async fn resume(engine: &Arc<Engine>, provider: &Arc<Provider>) -> usize {
    engine.nodes.ready(Duration::from_secs(30)).await;
    let reg = provider.registry();
    let marked: Vec<(String, String)> = engine
        .nodes
        .marked_for_drain()
        .into_iter()
        .filter(|(_, _, mode)| mode == "direct")
        .filter_map(|(node, iid, _)| Some((node, iid?)))
        .filter(|(_, iid)| !engine.is_draining(iid))
        .collect();
    if marked.is_empty() {
        return 0;
    }
    // AWS, not the snapshot, says whether the instance is still there to end.
    let ids: Vec<String> = marked.iter().map(|(_, i)| i.clone()).collect();
    let live = match engine.cloud.locate_instances(&ids).await {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(error = %e, "cannot check marked instances; resume later");
            return 0;
        }
    };
    let mut n = 0;
    for (node, iid) in marked {
        let Some(loc) = live.iter().find(|l| l.instance_id == iid) else {
            continue;
        };
        if loc.state.is_terminating() {
            continue;
        }
        let Some(g) = reg.group(&loc.group) else {
            tracing::warn!(node = %node, instance = %iid, "node marked for drain but its instance is in no managed group");
            continue;
        };
        provider.register_deferred(&iid, &g.asg.name);
        if engine.start(DrainRequest {
            instance_id: iid.clone(),
            group: g.asg.name.clone(),
            node_name: Some(node.clone()),
            mode: Mode::Direct,
            source: Source::Resume,
        }) {
            tracing::info!(node = %node, instance = %iid, "resuming drain after restart");
            n += 1;
        }
    }
    n
}

/// The background loop. While this replica leads (always, without leader election):
/// resume drains recorded on Nodes (after a restart, or marked by another replica) and
/// scan AWS for instances in Terminating:Wait, every poll interval. A replica that
/// stops leading stops its drains where they are; the new leader resumes them.
pub fn spawn_loop(engine: Arc<Engine>, provider: Arc<Provider>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !provider.is_loaded() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut leadership = engine.leadership();
        let mut was_leader = false;
        loop {
            let leader = engine.is_leader();
            metrics().leader.set(i64::from(leader));
            if leader {
                resume(&engine, &provider).await;
                scan(&engine, &provider).await;
            } else if was_leader {
                tracing::warn!(
                    drains = engine.in_progress(),
                    "lost leadership: stopping drains where they are for the new leader"
                );
                engine.abort_all();
            }
            was_leader = leader;
            let poll = tokio::time::sleep(engine.settings.lifecycle_poll_interval);
            match leadership.as_mut() {
                Some(rx) => {
                    tokio::select! {
                        _ = poll => {}
                        changed = rx.changed() => if changed.is_err() { leadership = None },
                    }
                }
                None => poll.await,
            }
        }
    })
}
