//! Drain overhead: on the in-memory API server, the time from the last pod of a node
//! being gone to the instance being ended (the InstanceTerminated Event, which the
//! engine posts right after the terminate call returns, so this is an upper bound).

use std::collections::HashMap;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::until;
use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::provider::NodeRef;
use ca_asg_provider::scalein::ScaleInSettings;
use ca_asg_provider::sim::world::{self, Ground};
use ca_asg_provider::world::{Service, ServiceBuilder};

#[derive(Debug, Serialize, Clone)]
pub struct Overhead {
    pub nodes: usize,
    pub p50_ms: u64,
    pub max_ms: u64,
    /// Requests the engine and the sim's controllers made to the API server.
    pub api_requests: usize,
}

/// Drains `nodes` nodes at once (each with a workload pod and a DaemonSet pod) and
/// measures, per node, last pod removed -> InstanceTerminated.
pub async fn measure(nodes: usize) -> anyhow::Result<Overhead> {
    let ground = Ground::builder()
        .group(MemoryGroup::new(
            "drain",
            0,
            nodes as i32,
            nodes as i32,
            "m5.large",
        ))
        .ready_delay(Duration::from_millis(50))
        .nodes_within(Some(Duration::from_secs(30)))
        .build()
        .await?;
    let Service { provider, engine } = ServiceBuilder::on(&ground)
        .scale_in(ScaleInSettings {
            api_qps: 200.0,
            api_burst: 200,
            ..ScaleInSettings::default()
        })
        .build()
        .await?;

    let instances = ground.nodes_of("drain");
    world::daemonset_and_an_app_on_each(&ground.sim, "agent", 0.1, &instances, 0.3)?;
    until("every pod ready", Duration::from_secs(30), || {
        ground.ready_pods() == 2 * nodes
    })
    .await?;
    let sim = &ground.sim;
    let pods_on: HashMap<String, String> = sim
        .list::<Pod>()
        .iter()
        .filter_map(|p| {
            Some((
                p["metadata"]["name"].as_str()?.to_string(),
                p["spec"]["nodeName"].as_str()?.to_string(),
            ))
        })
        .collect();
    let requests_before = sim.requests().total();
    let refs: Vec<NodeRef> = instances
        .iter()
        .map(|(node, id)| NodeRef {
            provider_id: format!("aws:///us-east-1a/{id}"),
            name: node.clone(),
        })
        .collect();
    provider.delete_nodes("drain", &refs).await?;
    for (_, id) in &instances {
        engine.wait_for(id).await;
    }
    let api_requests = (sim.requests().total() - requests_before) as usize;
    engine.shutdown();

    // Per node: the last pod removal and the InstanceTerminated Event's creation.
    let terminated: HashMap<String, String> = sim
        .list::<k8s_openapi::api::events::v1::Event>()
        .iter()
        .filter(|e| e["reason"] == "InstanceTerminated")
        .filter_map(|e| {
            Some((
                e["metadata"]["name"].as_str()?.to_string(),
                e["regarding"]["name"].as_str()?.to_string(),
            ))
        })
        .collect();
    let mut last_pod: HashMap<String, Instant> = HashMap::new();
    let mut ended: HashMap<String, Instant> = HashMap::new();
    for a in sim.audit() {
        match (a.kind, a.verb.as_str()) {
            ("Pod", "removed") => {
                if let Some(node) = pods_on.get(&a.name) {
                    let e = last_pod.entry(node.clone()).or_insert(a.at);
                    *e = (*e).max(a.at);
                }
            }
            ("Event", "create") => {
                if let Some(node) = terminated.get(&a.name) {
                    ended.insert(node.clone(), a.at);
                }
            }
            _ => {}
        }
    }
    let mut gaps: Vec<u64> = ended
        .iter()
        .filter_map(|(node, end)| Some(end.duration_since(*last_pod.get(node)?).as_millis() as u64))
        .collect();
    anyhow::ensure!(
        gaps.len() == nodes,
        "only {} of {nodes} nodes were drained and ended",
        gaps.len()
    );
    gaps.sort_unstable();
    Ok(Overhead {
        nodes,
        p50_ms: gaps[(gaps.len() - 1) / 2],
        max_ms: *gaps.last().unwrap_or(&0),
        api_requests,
    })
}
