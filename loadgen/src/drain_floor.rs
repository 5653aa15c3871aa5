//! One node's drain against its pods' own floor (`loadgen --drain-floor`). The shape
//! of a real rollout step: the ASG ends an instance through our hook; on the node two
//! replicas of one ReplicaSet with a preStop, under a budget that allows one at a
//! time, and a DaemonSet pod. Nothing can end the instance sooner than the floor:
//! the first eviction's replacement Ready elsewhere (only then does the budget allow
//! the second), the second replica's preStop, then the DaemonSet pod's preStop. The
//! report gives, per way of finding the held instance (the lifecycle poll or the
//! queue's lifecycle message), the time from Terminating:Wait to the completed
//! action, the floor, and their ratio, for the shipped settings and for the settings
//! before the drain waited on budgets (a fixed 5 s retry, a 15 s poll).

use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::until;
use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::cloud::queue::{MemoryQueue, Queue};
use ca_asg_provider::scalein::settings::InterruptionSettings;
use ca_asg_provider::scalein::sources::queue::Consumer;
use ca_asg_provider::scalein::{sources::hook_scan, ScaleInSettings};
use ca_asg_provider::sim::fixtures;
use ca_asg_provider::sim::world::Ground;
use ca_asg_provider::world::{Service, ServiceBuilder};

/// The replicas' preStop, the DaemonSet pod's, and a replacement's time to Ready.
const APP_PRESTOP: f64 = 2.0;
const DS_PRESTOP: f64 = 0.5;
const READY_DELAY: Duration = Duration::from_millis(500);
const HOOK: &str = "ca-asg-provider-drain";

#[derive(Debug, Serialize, Clone)]
pub struct FloorRun {
    /// `before` (fixed retry, 15 s poll) or `shipped`.
    pub settings: &'static str,
    /// `poll` or `queue`.
    pub found_by: &'static str,
    /// Terminating:Wait to CompleteLifecycleAction, per run.
    pub ended_s: Vec<f64>,
    pub mean_s: f64,
    pub floor_s: f64,
    pub ratio: f64,
}

#[derive(Debug, Serialize, Clone)]
pub struct FloorReport {
    pub runs_each: usize,
    pub results: Vec<FloorRun>,
}

/// The floor: the replacement Ready, the second replica's preStop, the DaemonSet's.
pub fn floor() -> Duration {
    READY_DELAY + Duration::from_secs_f64(APP_PRESTOP + DS_PRESTOP)
}

pub async fn run(runs: usize) -> anyhow::Result<FloorReport> {
    let mut results = Vec::new();
    for (name, poll, budget_watch) in [
        ("before", Duration::from_secs(15), false),
        (
            "shipped",
            ScaleInSettings::default().lifecycle_poll_interval,
            true,
        ),
    ] {
        for queue in [false, true] {
            let mut ended = Vec::new();
            for _ in 0..runs.max(1) {
                let s = ScaleInSettings {
                    lifecycle_poll_interval: poll,
                    budget_watch,
                    ..ScaleInSettings::default()
                };
                ended.push(one(s, queue).await?.as_secs_f64());
            }
            let mean = ended.iter().sum::<f64>() / ended.len() as f64;
            let round = |x: f64| (x * 100.0).round() / 100.0;
            results.push(FloorRun {
                settings: name,
                found_by: if queue { "queue" } else { "poll" },
                ended_s: ended.iter().map(|x| round(*x)).collect(),
                mean_s: round(mean),
                floor_s: floor().as_secs_f64(),
                ratio: round(mean / floor().as_secs_f64()),
            });
        }
    }
    Ok(FloorReport {
        runs_each: runs.max(1),
        results,
    })
}

/// One drain: the time from the ASG holding the instance to the completed action.
async fn one(settings: ScaleInSettings, queue: bool) -> anyhow::Result<Duration> {
    let limit = Duration::from_secs(120);
    let ground = Ground::builder()
        .group(MemoryGroup::new("web", 0, 3, 2, "m5.large").terminating_hook(HOOK, 120))
        .ready_delay(READY_DELAY)
        .nodes_within(Some(limit))
        .build()
        .await?;
    let (sim, cloud) = (&ground.sim, &ground.cloud);
    // The ASG ends its newest instance: the replicas go there, the other takes the
    // replacements.
    let nodes: Vec<String> = cloud
        .instances()
        .into_iter()
        .map(|(_, i)| ca_asg_provider::sim::node_name(&i.id))
        .collect();
    let (other, victim) = (nodes[0].clone(), nodes[1].clone());
    ground.set_unschedulable(&other, true).await?;
    sim.create(&fixtures::daemonset(
        "logging", "fluentd", DS_PRESTOP, false,
    ))?;
    sim.create(&fixtures::replicaset("shop", "app", 2, APP_PRESTOP))?;
    sim.create(&fixtures::pdb("shop", "app", 1))?;
    until("the pods Ready", limit, || ground.ready_pods() == 4).await?;
    anyhow::ensure!(
        sim.list::<Pod>()
            .iter()
            .filter(|p| p["spec"]["nodeName"] == victim.as_str()
                && p["metadata"]["labels"]["app"] == "app")
            .count()
            == 2,
        "both replicas on the node that ends"
    );
    ground.set_unschedulable(&other, false).await?;
    let service = ServiceBuilder::on(&ground)
        .scale_in(settings)
        .drain_behind_delete(false)
        .build()
        .await?;
    service.drain_marks_read(limit).await?;
    let Service { provider, engine } = service;
    let lifecycle_loop = hook_scan::spawn_loop(engine.clone(), provider.clone());
    let q = Arc::new(MemoryQueue::default());
    let consumer = queue.then(|| {
        Consumer::new(
            engine.clone(),
            provider.clone(),
            q.clone() as Arc<dyn Queue>,
            InterruptionSettings {
                wait: Duration::from_millis(100),
                ..InterruptionSettings::default()
            },
        )
        .spawn()
    });
    // Let the poll fall anywhere in its period, as it does in production.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(u64::from(nanos) % 5000)).await;
    let started = Instant::now();
    let ended = cloud.external_scale_in("web", 1)?;
    anyhow::ensure!(ended.len() == 1, "the ASG ended no instance");
    if queue {
        q.send(
            &serde_json::json!({
                "Origin": "AutoScalingGroup", "Destination": "EC2", "Service": "AWS Auto Scaling",
                "Time": chrono::Utc::now().to_rfc3339(), "AccountId": "123456789012",
                "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING", "RequestId": "r",
                "AutoScalingGroupName": "web", "LifecycleHookName": HOOK,
                "EC2InstanceId": ended[0], "LifecycleActionToken": "tok",
            })
            .to_string(),
        );
    }
    until("the lifecycle action completed", limit, || {
        !cloud.completed_actions().is_empty()
    })
    .await?;
    let took = started.elapsed();
    lifecycle_loop.abort();
    if let Some(c) = consumer {
        c.abort();
    }
    engine.shutdown();
    Ok(took)
}
