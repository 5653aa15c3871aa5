//! What the drain benchmarks share: the memory cloud's timing, the provider and engine
//! over it and the in-memory API server, and cordoning a node while pods are placed.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;

use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryTiming};
use ca_asg_provider::cloud::GroupSelector;
use ca_asg_provider::provider::{Provider, ProviderSettings};
use ca_asg_provider::scalein::{Engine, ScaleInSettings};
use ca_asg_provider::sim::SimCluster;

/// Launches and terminations in 50 ms, hooks that hold at once.
pub fn timing() -> MemoryTiming {
    MemoryTiming {
        launch_delay: Duration::from_millis(50),
        terminate_delay: Duration::from_millis(50),
        hook_delay: Duration::ZERO,
    }
}

/// The provider over `groups` of the memory cloud, refreshed once, and a drain engine
/// on the in-memory API server.
pub async fn provider_and_engine(
    sim: &SimCluster,
    cloud: &MemoryCloud,
    groups: &[&str],
    settings: ScaleInSettings,
) -> anyhow::Result<(Arc<Provider>, Arc<Engine>)> {
    let provider = Provider::new(
        Arc::new(cloud.clone()),
        ProviderSettings {
            selector: GroupSelector {
                names: groups.iter().map(|g| g.to_string()).collect(),
                tag_sets: vec![],
            },
            ..ProviderSettings::default()
        },
    );
    provider.refresh_now().await?;
    let engine = Engine::new(
        sim.client(),
        Arc::new(cloud.clone()),
        Some(provider.clone()),
        settings,
    );
    Ok((provider, engine))
}

pub async fn set_unschedulable(sim: &SimCluster, node: &str, on: bool) -> anyhow::Result<()> {
    let nodes: kube::Api<Node> = kube::Api::all(sim.client());
    nodes
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"unschedulable": on}})),
        )
        .await?;
    Ok(())
}
