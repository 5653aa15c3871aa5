//! A drain storm: every instance of a hooked group enters Terminating:Wait in the same
//! instant (an instance refresh, an AZ rebalance), each node running ReplicaSet pods
//! under PDBs that allow one at a time and DaemonSet pods; the lifecycle loop finds
//! them and drains them all. Reports how long the storm took against the pods' own
//! grace floor, the heartbeats and the slack left on every hook, the API request rate
//! against `apiQps`, PDB refusals, and the process's CPU and peak RSS; and checks
//! that no hook timed out, no PDB was broken and DaemonSet pods left last everywhere.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::until;
use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::scalein::decide::budget::{Budget, Groups, Nodes};
use ca_asg_provider::scalein::{sources::hook_scan, ScaleInSettings};
use ca_asg_provider::sim::world::Ground;
use ca_asg_provider::sim::{fixtures, SimCluster};
use ca_asg_provider::telemetry::process::ProcWatch;
use ca_asg_provider::world::{Service, ServiceBuilder};

/// The storm's shape.
#[derive(Debug, Clone)]
pub struct StormOptions {
    pub nodes: usize,
    pub pods_per_node: usize,
    /// Replicas per ReplicaSet (each with a PDB of maxUnavailable 1).
    pub set_size: usize,
    /// Nodes of a second group that take the evicted pods.
    pub spare_nodes: usize,
    pub api_qps: f64,
    pub api_burst: u32,
    /// scaleIn.maxConcurrentDrains: drains beyond it wait (their hooks heartbeated).
    pub max_concurrent_drains: usize,
    pub hook_timeout_secs: i32,
    /// Gives up after this long.
    pub limit: Duration,
    /// Also the DaemonSets an EKS node carries that the DaemonSet controller puts
    /// straight back on a cordoned, tainted node: kube-proxy and the EBS CSI node
    /// plugin (tolerate everything, system-node-critical) and a log shipper that
    /// tolerates the drain taint.
    pub daemonsets_that_come_back: bool,
    /// A disruption budget (`scaleIn.budgets`) over the storm's group beside
    /// `maxConcurrentDrains`: the most restrictive wins.
    pub budget: Option<Nodes>,
}

impl StormOptions {
    pub fn new(nodes: usize) -> Self {
        Self {
            nodes,
            pods_per_node: 10,
            set_size: 10,
            spare_nodes: nodes.div_ceil(2).max(2),
            api_qps: 50.0,
            api_burst: 100,
            max_concurrent_drains: ScaleInSettings::default().max_concurrent_drains,
            hook_timeout_secs: 120,
            limit: Duration::from_secs(1800),
            daemonsets_that_come_back: false,
            budget: None,
        }
    }
}

#[derive(Debug, Serialize, Clone)]
pub struct StormReport {
    pub nodes: usize,
    pub max_concurrent_drains: usize,
    /// The disruption budget over the storm's group (`10%`), if any.
    pub budget: Option<String>,
    /// The most nodes draining at one instant: a node drains from its first eviction
    /// request to its lifecycle action's completion.
    pub most_draining_at_once: usize,
    /// Drains begun (first eviction request) per minute, from the storm's start to the
    /// last drain's beginning.
    pub drains_started_per_min: f64,
    /// Lifecycle actions completed per minute over the whole storm.
    pub drains_finished_per_min: f64,
    /// The storm's API requests over its nodes.
    pub requests_per_node: f64,
    pub workload_pods: usize,
    pub daemonset_pods: usize,
    /// From the instant all entered Terminating:Wait to the last lifecycle action.
    pub all_ended_s: f64,
    /// Per node: its cordon to its lifecycle action's completion.
    pub node_drain_s: Spread,
    /// Per node: its pods' own floor (the longest workload preStop, then the longest
    /// DaemonSet preStop).
    pub slowest_floor_s: f64,
    /// The time `apiQps` alone needs for the storm's requests beyond the burst.
    pub api_pacing_s: f64,
    /// The requests no drainer can do without: one eviction per pod and one cordon
    /// per node.
    pub necessary_requests: u64,
    /// The storm's floor: the time `apiQps` needs for the necessary requests beyond
    /// the burst, plus the shortest DaemonSet preStop of a node (what follows the last
    /// of them), or the slowest node's own floor if that is longer.
    pub floor_s: f64,
    /// all_ended_s / floor_s: what this code adds, as a factor.
    pub ratio: f64,
    /// The target: 1.1 x the floor.
    pub target_s: f64,
    pub heartbeats_per_hook: f64,
    /// The least time any hook had left at a heartbeat or its completion.
    pub min_hook_slack_s: f64,
    pub hook_timeouts: usize,
    pub api_requests: u64,
    /// The storm's requests by "verb resource", most first.
    pub api_requests_by_kind: Vec<(String, u64)>,
    pub api_qps_mean: f64,
    pub api_qps_peak: f64,
    pub api_qps_limit: f64,
    pub api_burst: u32,
    pub evictions_refused_by_pdb: u64,
    /// Tries held back (no request) because the budget's cached status allowed none.
    pub evictions_held_by_budget: u64,
    /// Tries sent anyway: the budget's status allowed none and had not changed for
    /// `evictionRetryInterval` (what a stopped disruption controller would cause).
    pub evictions_past_a_still_budget: u64,
    /// Per-pod Evicted Events still queued when the last instance ended (they yield
    /// to drain requests), and how long after that the queue was empty.
    pub pod_events_queued_at_end: usize,
    pub pod_events_flushed_after_s: f64,
    /// ReplicaSets seen with fewer Ready pods than replicas - maxUnavailable.
    pub pdb_violations: usize,
    /// Nodes where a DaemonSet pod began leaving while a workload pod was there.
    pub daemonset_last_violations: usize,
    /// The most eviction requests any DaemonSet pod there when the storm began got
    /// (1: evicted once).
    pub daemonset_evictions_max_per_node: usize,
    /// Eviction requests of DaemonSet pods the controller put back during the storm
    /// (0: what came back was not chased).
    pub put_back_daemonset_evictions: usize,
    /// Nodes where a node-critical DaemonSet pod (kube-proxy, the CSI node plugin)
    /// began leaving before another DaemonSet pod of the node.
    pub node_critical_order_violations: usize,
    /// Evictions of pods created during the storm (replacements that landed on a node
    /// of the storm before its drain began and cordoned it).
    pub evictions_of_replacements: usize,
    pub cpu_s: f64,
    pub peak_rss_mib: f64,
    /// RSS with the in-memory API server, cloud and pods loaded, before the engine
    /// started: the peak minus this is the engine's share (all run in one process).
    pub rss_before_engine_mib: f64,
    /// After a (re)start, from the provider's start until it accepts size changes:
    /// its groups read and the drain marks of the first Node list (all Nodes of the
    /// storm and the spare group).
    pub size_changes_open_s: f64,
}

/// p50, p99 and max of a sample, in seconds.
#[derive(Debug, Serialize, Clone, PartialEq)]
pub struct Spread {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        let at = |p: f64| {
            if v.is_empty() {
                return 0.0;
            }
            let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
            (v[i] * 100.0).round() / 100.0
        };
        Spread {
            p50: at(0.50),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

fn ready(p: &serde_json::Value) -> bool {
    p["metadata"]["deletionTimestamp"].is_null() && p["status"]["conditions"][0]["status"] == "True"
}

/// How long the fake kubelet takes to make a pod Ready.
const READY_DELAY: Duration = Duration::from_millis(100);

/// preStop seconds of the ReplicaSet `i`: a mix from half a second to three.
fn prestop_of(i: usize) -> f64 {
    [0.5, 1.0, 2.0, 3.0][i % 4]
}

/// Counts Ready pods per `app` label from the store's own change stream, and keeps the
/// lowest count each app reached: every change is seen, not a sample.
fn spawn_ready_watch(
    sim: &SimCluster,
    min_ready: Arc<parking_lot::Mutex<BTreeMap<String, i32>>>,
) -> tokio::task::JoinHandle<()> {
    let app = |p: &serde_json::Value| p["metadata"]["labels"]["app"].as_str().map(str::to_string);
    let count_all = move |pods: &[Arc<serde_json::Value>]| {
        let mut count: HashMap<String, i32> = HashMap::new();
        for p in pods.iter().filter(|p| ready(p)) {
            if let Some(a) = app(p) {
                *count.entry(a).or_default() += 1;
            }
        }
        count
    };
    let pods_res = ca_asg_provider::sim::store::resource("", "pods").expect("pods");
    // Subscribed and counted under the store's lock: no change is missed or counted twice.
    let (pods, mut rx) = sim.store.list_and_subscribe(pods_res, None);
    let mut count = count_all(&pods);
    let store = sim.store.clone();
    tokio::spawn(async move {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            let c = match rx.recv().await {
                Ok(c) => c,
                Err(RecvError::Lagged(_)) => {
                    // Fell behind: recount, and follow the changes after the recount
                    // (a dip in between may be missed).
                    let (pods, fresh) = store.list_and_subscribe(pods_res, None);
                    count = count_all(&pods);
                    rx = fresh;
                    continue;
                }
                Err(RecvError::Closed) => return,
            };
            if c.res != pods_res {
                continue;
            }
            // A Deleted change carries the object as it last was: it leaves the count.
            let (old, new) = match c.kind {
                ca_asg_provider::sim::store::EventType::Deleted => (Some(&*c.object), None),
                _ => (c.old.as_deref(), Some(&*c.object)),
            };
            let app_of_ready = |p: Option<&serde_json::Value>| p.filter(|p| ready(p)).and_then(app);
            if let Some(a) = app_of_ready(new) {
                *count.entry(a).or_default() += 1;
            }
            // Only a pod that stops being Ready can lower the count.
            if let Some(a) = app_of_ready(old) {
                let now = count.entry(a.clone()).or_default();
                *now -= 1;
                if let Some(low) = min_ready.lock().get_mut(&a) {
                    *low = (*low).min(*now);
                }
            }
        }
    })
}

pub async fn run(o: &StormOptions) -> anyhow::Result<StormReport> {
    let me = ProcWatch::new(std::process::id());
    let n = o.nodes as i32;
    let ground = Ground::builder()
        .group(
            MemoryGroup::new("storm", 0, n, n, "m5.large")
                .terminating_hook("ca-asg-provider-drain", o.hook_timeout_secs),
        )
        .group(MemoryGroup::new(
            "spare",
            0,
            o.spare_nodes as i32,
            o.spare_nodes as i32,
            "m5.large",
        ))
        .ready_delay(READY_DELAY)
        .nodes_within(Some(o.limit))
        .build()
        .await?;
    let (sim, cloud) = (&ground.sim, &ground.cloud);
    let total_nodes = o.nodes + o.spare_nodes;
    let spare: Vec<String> = cloud
        .instances()
        .into_iter()
        .filter(|(g, _)| g == "spare")
        .map(|(_, i)| ca_asg_provider::sim::node_name(&i.id))
        .collect();
    // The workloads go to the storm's nodes: the spare ones take only what is evicted.
    for node in &spare {
        ground.set_unschedulable(node, true).await?;
    }
    sim.create(&fixtures::daemonset("logging", "log-shipper", 0.5, false))?;
    sim.create(&fixtures::daemonset(
        "monitoring",
        "metrics-agent",
        0.2,
        false,
    ))?;
    let mut daemonsets_per_node = 2;
    if o.daemonsets_that_come_back {
        sim.create(&fixtures::kube_proxy(0.1))?;
        sim.create(&fixtures::csi_node(0.1))?;
        let mut shipper = fixtures::log_shipper_tolerating_drain(0.3);
        shipper.metadata.name = Some("tolerant-shipper".into());
        if let Some(s) = shipper.spec.as_mut() {
            let tolerant = [("app".to_string(), "tolerant-shipper".to_string())];
            s.selector.match_labels = Some(tolerant.clone().into());
            if let Some(m) = s.template.metadata.as_mut() {
                m.labels = Some(tolerant.into());
            }
        }
        sim.create(&shipper)?;
        daemonsets_per_node += 3;
    }
    // One ReplicaSet per node's worth of pods; each spreads over the least loaded
    // nodes, so a node carries pods of several ReplicaSets.
    let size = o.set_size.max(1);
    let sets = (o.nodes * o.pods_per_node).div_ceil(size);
    let mut replicas_of: BTreeMap<String, i32> = BTreeMap::new();
    for i in 0..sets {
        let app = format!("app-{i:04}");
        sim.create(&fixtures::replicaset(
            "shop",
            &app,
            size as i32,
            prestop_of(i),
        ))?;
        sim.create(&fixtures::pdb("shop", &app, 1))?;
        replicas_of.insert(app, size as i32);
    }
    let want = sets * size + daemonsets_per_node * total_nodes;
    until("every pod ready", o.limit, || {
        sim.list_shared::<Pod>().iter().filter(|p| ready(p)).count() >= want
    })
    .await?;
    for node in &spare {
        ground.set_unschedulable(node, false).await?;
    }
    let critical_at_start: std::collections::HashSet<String> = sim
        .list::<Pod>()
        .iter()
        .filter(|p| p["spec"]["priorityClassName"] == "system-node-critical")
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    let pods_on: HashMap<String, (String, bool, f64)> = sim
        .list::<Pod>()
        .iter()
        .filter_map(|p| {
            let ds = p["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet";
            let prestop = p["metadata"]["annotations"]
                [ca_asg_provider::sim::cluster::PRESTOP_ANNOTATION]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0.0);
            Some((
                p["metadata"]["name"].as_str()?.to_string(),
                (p["spec"]["nodeName"].as_str()?.to_string(), ds, prestop),
            ))
        })
        .collect();

    let rss_before_engine_mib = me
        .sample()
        .map(|s| s.rss_bytes as f64 / (1024.0 * 1024.0))
        .unwrap_or(0.0);
    let settings = ScaleInSettings {
        api_qps: o.api_qps,
        api_burst: o.api_burst,
        max_concurrent_drains: o.max_concurrent_drains.max(1),
        lifecycle_poll_interval: Duration::from_secs(2),
        eviction_retry: Duration::from_secs(1),
        budgets: o
            .budget
            .iter()
            .map(|nodes| Budget {
                groups: Groups::Named(["storm".to_string()].into()),
                ..Budget::always("storm", *nodes)
            })
            .collect(),
        ..ScaleInSettings::default()
    };
    // A restart's window: from the provider's start until it takes size changes (the
    // groups read from AWS and the drain marks from the first Node list).
    let starting = Instant::now();
    let Service { provider, engine } = ServiceBuilder::on(&ground)
        .scale_in(settings)
        .drain_behind_delete(false)
        .build()
        .await?;
    while !provider.drain_state_known() {
        anyhow::ensure!(
            starting.elapsed() < o.limit,
            "the first Node list never came"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let size_changes_open_s = starting.elapsed().as_secs_f64();

    // PDBs, from every change: the fewest Ready pods each ReplicaSet ever had.
    let min_ready: Arc<parking_lot::Mutex<BTreeMap<String, i32>>> =
        Arc::new(parking_lot::Mutex::new(replicas_of.clone()));
    let sampler = spawn_ready_watch(sim, min_ready.clone());

    let cpu_before = me.sample().map(|s| s.cpu_seconds).unwrap_or(0.0);
    let requests_before = sim.requests().total();
    let kinds_before = sim.requests().snapshot();
    let started = Instant::now();
    let ended = cloud.external_scale_in("storm", n)?;
    anyhow::ensure!(
        ended.len() == o.nodes,
        "only {} instances entered Terminating:Wait",
        ended.len()
    );
    let lifecycle_loop = hook_scan::spawn_loop(engine.clone(), provider.clone());
    let mut rate = Vec::new();
    let mut peak_rss = 0.0f64;
    let mut last = requests_before;
    let mut next_sample = Instant::now() + Duration::from_secs(1);
    loop {
        // The end is looked for every 10 ms (a second's granularity hid what a change
        // gained); the rate and RSS are sampled every second.
        tokio::time::sleep(Duration::from_millis(10)).await;
        if Instant::now() >= next_sample {
            next_sample += Duration::from_secs(1);
            let now = sim.requests().total();
            rate.push((now - last) as f64);
            last = now;
            if let Ok(s) = me.sample() {
                peak_rss = peak_rss.max(s.rss_bytes as f64 / (1024.0 * 1024.0));
            }
        }
        if cloud.completed_actions().len() >= o.nodes {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < o.limit,
            "storm not over after {:?}: {} of {} lifecycle actions completed",
            o.limit,
            cloud.completed_actions().len(),
            o.nodes
        );
    }
    let all_ended = started.elapsed();
    let api_requests = sim.requests().total() - requests_before;
    let mut api_requests_by_kind: Vec<(String, u64)> = sim
        .requests()
        .snapshot()
        .into_iter()
        .map(|((verb, res), n)| {
            let before = kinds_before.get(&(verb.clone(), res.clone())).copied();
            (format!("{verb} {res}"), n - before.unwrap_or(0))
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    api_requests_by_kind.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let cpu_s = me.sample().map(|s| s.cpu_seconds).unwrap_or(0.0) - cpu_before;
    let pod_events_queued_at_end = engine.tools.events.pod_events_pending();
    let flushing = Instant::now();
    until("the per-pod Events to be published", o.limit, || {
        engine.tools.events.pod_events_pending() == 0
    })
    .await?;
    let pod_events_flushed_after_s = flushing.elapsed().as_secs_f64();
    lifecycle_loop.abort();
    sampler.abort();
    engine.shutdown();

    let audit = sim.audit();
    // Per node: from its cordon (its drain's first write) to its lifecycle action's
    // completion. Not from Events: in a storm they wait for spare API tokens.
    let mut began: HashMap<String, Instant> = HashMap::new();
    let done: HashMap<String, Instant> = cloud
        .completed_at()
        .into_iter()
        .filter(|(_, at)| *at >= started)
        .map(|(id, at)| (ca_asg_provider::sim::node_name(&id), at))
        .collect();
    let mut last_workload_gone: HashMap<String, usize> = HashMap::new();
    let mut first_ds_leaving: HashMap<String, usize> = HashMap::new();
    for (i, a) in audit.iter().enumerate() {
        match (a.kind, a.verb.as_str()) {
            ("Node", "patch") if a.at >= started && done.contains_key(&a.name) => {
                began.entry(a.name.clone()).or_insert(a.at);
            }
            ("Pod", "removed") => {
                if let Some((node, false, _)) = pods_on.get(&a.name) {
                    last_workload_gone.insert(node.clone(), i);
                }
            }
            ("Pod", "deletion-started") => {
                if let Some((node, true, _)) = pods_on.get(&a.name) {
                    first_ds_leaving.entry(node.clone()).or_insert(i);
                }
            }
            _ => {}
        }
    }
    // Pods evicted that were not there when the storm began: replacements placed on a
    // node of the storm whose drain had not begun yet.
    let evictions_of_replacements = audit
        .iter()
        .filter(|a| a.at >= started && a.kind == "Pod" && a.verb == "evicted")
        .filter(|a| !pods_on.contains_key(&a.name))
        .count();
    let daemonset_last_violations = first_ds_leaving
        .iter()
        .filter(|(node, ds)| last_workload_gone.get(*node).is_some_and(|w| w > ds))
        .count();
    // Eviction requests of DaemonSet pods: of those there when the storm began, by
    // set and node; and of those put back since (a DaemonSet's pods are named after
    // it), which the drain must not chase.
    let ds_set = |name: &str| name.rsplit_once('-').map(|(set, _)| set.to_string());
    let ds_sets: std::collections::HashSet<String> = pods_on
        .iter()
        .filter(|(_, (_, ds, _))| *ds)
        .filter_map(|(name, _)| ds_set(name))
        .collect();
    let mut ds_asked: HashMap<(String, String), usize> = HashMap::new();
    let mut put_back_daemonset_evictions = 0;
    for a in audit
        .iter()
        .filter(|a| a.at >= started && a.kind == "Pod" && a.verb == "eviction-requested")
    {
        match (pods_on.get(&a.name), ds_set(&a.name)) {
            (Some((node, true, _)), Some(set)) => {
                *ds_asked.entry((set, node.clone())).or_default() += 1;
            }
            (None, Some(set)) if ds_sets.contains(&set) => put_back_daemonset_evictions += 1,
            _ => {}
        }
    }
    let daemonset_evictions_max_per_node = ds_asked.values().copied().max().unwrap_or(0);
    // Node-critical DaemonSet pods leave after the node's other DaemonSet pods.
    let mut first_critical: HashMap<&str, usize> = HashMap::new();
    let mut last_other_ds: HashMap<&str, usize> = HashMap::new();
    for (i, a) in audit.iter().enumerate() {
        if a.kind != "Pod" || a.verb != "deletion-started" {
            continue;
        }
        if let Some((node, true, _)) = pods_on.get(&a.name) {
            if critical_at_start.contains(&a.name) {
                first_critical.entry(node.as_str()).or_insert(i);
            } else {
                last_other_ds.insert(node.as_str(), i);
            }
        }
    }
    let node_critical_order_violations = first_critical
        .iter()
        .filter(|(node, c)| last_other_ds.get(*node).is_some_and(|o| o > c))
        .count();
    // Per node: when its drain began, as budgets count it (its first eviction request).
    let mut first_eviction: HashMap<String, Instant> = HashMap::new();
    for a in audit
        .iter()
        .filter(|a| a.at >= started && a.kind == "Pod" && a.verb == "eviction-requested")
    {
        if let Some((node, _, _)) = pods_on.get(&a.name) {
            first_eviction.entry(node.clone()).or_insert(a.at);
        }
    }
    let most_draining_at_once = most_at_once(
        done.iter()
            .filter_map(|(node, end)| Some((*first_eviction.get(node)?, *end))),
    );
    let last_start_s = first_eviction
        .values()
        .map(|at| at.duration_since(started).as_secs_f64())
        .fold(0.0, f64::max)
        .max(1e-9);
    let drain_s: Vec<f64> = done
        .iter()
        .filter_map(|(node, end)| Some(end.duration_since(*began.get(node)?).as_secs_f64()))
        .collect();
    let mut floor: HashMap<String, (f64, f64)> = HashMap::new();
    for (node, ds, prestop) in pods_on.values() {
        let f = floor.entry(node.clone()).or_default();
        if *ds {
            f.1 = f.1.max(*prestop);
        } else {
            f.0 = f.0.max(*prestop);
        }
    }
    let slowest_floor_s = floor.values().map(|(w, d)| w + d).fold(0.0, f64::max);
    let api_pacing_s = (api_requests as f64 - f64::from(o.api_burst)).max(0.0) / o.api_qps;
    let storm_pods = pods_on
        .values()
        .filter(|(node, _, _)| began.contains_key(node) || done.contains_key(node))
        .count() as u64;
    let necessary_requests = storm_pods + o.nodes as u64;
    // The last necessary request is some node's last DaemonSet eviction; that node
    // ends no sooner than its DaemonSet preStop later. (The slowest node's own floor
    // overlaps the others' requests: adding the two, as this report did before,
    // over-stated the floor.)
    let shortest_tail_s = floor
        .iter()
        .filter(|(node, _)| done.contains_key(*node))
        .map(|(_, (_, ds))| *ds)
        .fold(f64::INFINITY, f64::min);
    let necessary_pacing_s =
        (necessary_requests as f64 - f64::from(o.api_burst)).max(0.0) / o.api_qps;
    let floor_s = slowest_floor_s
        .max(necessary_pacing_s + shortest_tail_s.min(slowest_floor_s))
        .max(1e-9);
    let slack = cloud.hook_slack();
    let min_hook_slack_s = slack
        .iter()
        .map(|(_, d)| d.as_secs_f64())
        .fold(f64::INFINITY, f64::min);
    let pdb_violations = min_ready
        .lock()
        .iter()
        .filter(|(app, low)| **low < replicas_of[*app] - 1)
        .count();
    let secs = all_ended.as_secs_f64().max(1e-9);
    Ok(StormReport {
        nodes: o.nodes,
        max_concurrent_drains: o.max_concurrent_drains,
        budget: o.budget.map(|n| match n {
            Nodes::Count(c) => c.to_string(),
            Nodes::Percent(p) => format!("{p}%"),
        }),
        most_draining_at_once,
        drains_started_per_min: first_eviction.len() as f64 * 60.0 / last_start_s,
        drains_finished_per_min: done.len() as f64 * 60.0 / secs,
        requests_per_node: api_requests as f64 / o.nodes as f64,
        workload_pods: sets * size,
        daemonset_pods: daemonsets_per_node * total_nodes,
        all_ended_s: secs,
        node_drain_s: Spread::of(drain_s),
        slowest_floor_s,
        api_pacing_s,
        necessary_requests,
        floor_s,
        ratio: secs / floor_s.max(1e-9),
        target_s: 1.1 * floor_s,
        heartbeats_per_hook: cloud.heartbeats().len() as f64 / o.nodes as f64,
        min_hook_slack_s,
        hook_timeouts: cloud.hook_timeouts().len(),
        api_requests,
        api_requests_by_kind,
        api_qps_mean: api_requests as f64 / secs,
        api_qps_peak: rate.iter().copied().fold(0.0, f64::max),
        api_qps_limit: o.api_qps,
        api_burst: o.api_burst,
        evictions_refused_by_pdb: engine
            .tools
            .stats
            .evictions_pdb_blocked
            .load(std::sync::atomic::Ordering::Relaxed),
        evictions_held_by_budget: engine
            .tools
            .stats
            .evictions_held
            .load(std::sync::atomic::Ordering::Relaxed),
        evictions_past_a_still_budget: engine
            .tools
            .stats
            .evictions_forced
            .load(std::sync::atomic::Ordering::Relaxed),
        pod_events_queued_at_end,
        pod_events_flushed_after_s,
        pdb_violations,
        daemonset_last_violations,
        daemonset_evictions_max_per_node,
        put_back_daemonset_evictions,
        node_critical_order_violations,
        evictions_of_replacements,
        cpu_s,
        peak_rss_mib: peak_rss,
        rss_before_engine_mib,
        size_changes_open_s,
    })
}

/// The most of `spans` (from, to) open at one instant; at one instant an end goes
/// before a start.
fn most_at_once(spans: impl Iterator<Item = (Instant, Instant)>) -> usize {
    let mut edges: Vec<(Instant, i32)> = spans.flat_map(|(a, b)| [(a, 1), (b, -1)]).collect();
    edges.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        open += step;
        most = most.max(open);
    }
    most as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_at_once_counts_overlaps_and_lets_an_end_go_before_a_start() {
        let t = Instant::now();
        let s = |a: u64, b: u64| (t + Duration::from_secs(a), t + Duration::from_secs(b));
        assert_eq!(most_at_once([].into_iter()), 0);
        assert_eq!(most_at_once([s(0, 2), s(2, 4), s(4, 6)].into_iter()), 1);
        assert_eq!(
            most_at_once([s(0, 5), s(1, 2), s(1, 3), s(3, 4)].into_iter()),
            3
        );
    }
}
