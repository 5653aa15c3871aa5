//! The ground a world stands on: the memory cloud's groups and the in-memory API
//! server that registers a Node for each of their instances, built by options, not
//! by position. The demo, the benchmarks (loadgen) and the tests start theirs here;
//! `crate::world` puts the service (provider, drain engine, CA's door) on it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::clock::Instant;
use crate::cloud::memory::{MemoryCloud, MemoryGroup, MemoryTiming};

use super::{fixtures, node_name, SimCluster, SimOptions};

/// Launches and terminations in 50 ms, hooks that hold at once: the timing of the
/// benchmarks' and the tests' clouds.
pub fn quick_timing() -> MemoryTiming {
    MemoryTiming {
        launch_delay: Duration::from_millis(50),
        terminate_delay: Duration::from_millis(50),
        hook_delay: Duration::ZERO,
    }
}

/// Launches, terminations and hooks at once: for cases that step the cloud
/// themselves.
pub fn instant_timing() -> MemoryTiming {
    MemoryTiming {
        launch_delay: Duration::ZERO,
        terminate_delay: Duration::ZERO,
        hook_delay: Duration::ZERO,
    }
}

/// The usual group of the tests and benchmarks: `web`, from 0 to `max` m5.large
/// instances, `desired` of them wanted.
pub fn web_group(max: i32, desired: i32) -> MemoryGroup {
    MemoryGroup::new("web", 0, max, desired, "m5.large")
}

/// Waits until `f` holds, polling every 20 ms (on [`crate::clock`]'s time, so a
/// paused clock moves it); an error naming `what` after `limit`.
pub async fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> anyhow::Result<()> {
    let end = Instant::now() + limit;
    while !f() {
        anyhow::ensure!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// What [`Ground::builder`] starts: the groups, the cloud's timing, the API server's
/// pod readiness delay, how its clients reach it, and how long to wait for a Node
/// per instance.
#[derive(Debug, Clone)]
pub struct GroundBuilder {
    groups: Vec<MemoryGroup>,
    timing: MemoryTiming,
    sim: SimOptions,
    in_process: bool,
    nodes_within: Option<Duration>,
}

/// The memory cloud and the in-memory API server following it.
pub struct Ground {
    pub sim: Arc<SimCluster>,
    pub cloud: MemoryCloud,
    /// The groups' names, in the order given.
    pub groups: Vec<String>,
}

impl Ground {
    /// No groups yet, [`quick_timing`], the API server's default readiness delay,
    /// reached over HTTP, a Node per instance awaited for up to 10 s.
    pub fn builder() -> GroundBuilder {
        GroundBuilder {
            groups: Vec::new(),
            timing: quick_timing(),
            sim: SimOptions::default(),
            in_process: false,
            nodes_within: Some(Duration::from_secs(10)),
        }
    }

    /// The (Node name, instance id) of every instance of `group` not on its way out.
    pub fn nodes_of(&self, group: &str) -> Vec<(String, String)> {
        nodes_of(&self.cloud, group)
    }

    /// Pods whose Ready condition is true.
    pub fn ready_pods(&self) -> usize {
        ready_pods(&self.sim)
    }

    /// Cordons (`on`) or uncordons a Node, as `kubectl cordon` does.
    pub async fn set_unschedulable(&self, node: &str, on: bool) -> anyhow::Result<()> {
        set_unschedulable(&self.sim, node, on).await
    }
}

impl GroundBuilder {
    pub fn group(mut self, g: MemoryGroup) -> Self {
        self.groups.push(g);
        self
    }

    pub fn groups(mut self, gs: impl IntoIterator<Item = MemoryGroup>) -> Self {
        self.groups.extend(gs);
        self
    }

    /// The memory cloud's launch, terminate and hook delays.
    pub fn timing(mut self, t: MemoryTiming) -> Self {
        self.timing = t;
        self
    }

    /// From a pod's binding to Ready.
    pub fn ready_delay(mut self, d: Duration) -> Self {
        self.sim.ready_delay = d;
        self
    }

    /// The API server's clients reach it in process (for a case on tokio's paused
    /// clock, where a socket's wait would let the clock jump; issue 39) or over HTTP.
    pub fn in_process(mut self, on: bool) -> Self {
        self.in_process = on;
        self
    }

    /// How long [`GroundBuilder::build`] waits for a Node per instance (`None`: it
    /// does not wait).
    pub fn nodes_within(mut self, limit: Option<Duration>) -> Self {
        self.nodes_within = limit;
        self
    }

    /// Starts the API server, then the cloud, the API server following it.
    pub async fn build(self) -> anyhow::Result<Ground> {
        let sim = if self.in_process {
            SimCluster::start_in_process(self.sim).await
        } else {
            SimCluster::start(self.sim).await
        };
        let sim = Arc::new(sim?);
        let groups: Vec<String> = self.groups.iter().map(|g| g.name.clone()).collect();
        let cloud = MemoryCloud::new(self.groups, self.timing);
        sim.follow_cloud(cloud.clone());
        if let Some(limit) = self.nodes_within {
            let want = cloud.instances().len();
            until("a Node per instance", limit, || {
                sim.list::<Node>().len() == want
            })
            .await?;
        }
        Ok(Ground { sim, cloud, groups })
    }
}

/// The (Node name, instance id) of every instance of `group` not on its way out.
pub fn nodes_of(cloud: &MemoryCloud, group: &str) -> Vec<(String, String)> {
    cloud
        .instances()
        .into_iter()
        .filter(|(g, i)| g == group && !i.state.is_terminating())
        .map(|(_, i)| (node_name(&i.id), i.id))
        .collect()
}

/// A DaemonSet (namespace `logging`, `daemonset` its app, its pods' preStop
/// `daemonset_prestop` s) and on each of `nodes` an app pod `app-{i}` in `shop` (label
/// app=app, preStop `app_prestop` s): the pods per node of the drain worlds. Callers
/// wait for what they need Ready.
pub fn daemonset_and_an_app_on_each(
    sim: &SimCluster,
    daemonset: &str,
    daemonset_prestop: f64,
    nodes: &[(String, String)],
    app_prestop: f64,
) -> anyhow::Result<()> {
    sim.create(&fixtures::daemonset(
        "logging",
        daemonset,
        daemonset_prestop,
        false,
    ))?;
    for (i, (node, _)) in nodes.iter().enumerate() {
        sim.create(&fixtures::pod(
            "shop",
            &format!("app-{i}"),
            node,
            "app",
            app_prestop,
        ))?;
    }
    Ok(())
}

/// Pods whose Ready condition is true.
pub fn ready_pods(sim: &SimCluster) -> usize {
    sim.list::<Pod>()
        .iter()
        .filter(|p| p["status"]["conditions"][0]["status"] == "True")
        .count()
}

/// Cordons (`on`) or uncordons a Node, as `kubectl cordon` does.
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
