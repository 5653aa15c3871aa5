//! A drain storm on the real control plane (issue 44): N nodes played by the fake
//! kubelet, each running two app pods (Deployments of `set_size` replicas, each under a
//! budget of `maxUnavailable: 1`) and one DaemonSet pod that tolerates everything, all
//! ended in the same instant. The service ends half of them through its hook (the ASG
//! scales in) and half through CA's NodeGroupDeleteNodes, one node per call and
//! `ca_parallelism` calls at once, each node cordoned first as CA >= 1.34 does. The same
//! storm can be ended by `kubectl drain` per node instead (a drain-then-terminate script),
//! or by a real cluster-autoscaler's own drain (CA evicts, then hands each drained node
//! to the service's NodeGroupDeleteNodes), each on a control plane of its own, for the
//! figures side by side.
//!
//! Everything is measured from outside the drainer: requests by verb and resource from
//! the API server's audit log, watches opened, requests rejected by priority and fairness
//! (429s, and the server's own counter), the CPU seconds of kube-apiserver, etcd and the
//! controllers, the drainer's CPU and memory, and the time from the decision to the last
//! instance's end against the floor the pods, the budgets and `apiQps` set.
#![allow(dead_code)] // shared by the e2e test crates, each using a part

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryGroup};
use ca_asg_provider::cloud::queue::{MemoryQueue, Queue};
use ca_asg_provider::cloud::Cloud as _;
use ca_asg_provider::config::ListenAddr;
use ca_asg_provider::proto::{self, cloud_provider_client::CloudProviderClient};
use ca_asg_provider::scalein::settings::InterruptionSettings;
use ca_asg_provider::scalein::sources::queue::Consumer;
use ca_asg_provider::scalein::{self, ScaleInSettings};
use chrono::{DateTime, Utc};
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde::Serialize;
use serde_json::json;

use super::checks;
use super::control_plane::{AuditEvent, Binaries, ControlPlane, Who, DRAINER_USER, SERVICE_USER};
use super::kubelet::{Ending, FakeKubelet, PodStop};
use super::real_ca::{CaBinary, RealCa, FIRST_LOOP_SECS};
use super::rig::{
    apply_shipped_rbac, budget, containers, create, log_shipper, namespaces, until, HOOK,
};
use super::support::world::timing;

/// The storm's shape.
#[derive(Debug, Clone, Serialize)]
pub struct Shape {
    pub nodes: usize,
    /// How many of the nodes end in the storm (the first ones; the others stay with
    /// their pods): the service's memory with the cluster fixed and the drains varied.
    pub draining: usize,
    /// Replicas of each app Deployment; its budget allows one unavailable.
    pub set_size: usize,
    pub app_prestop_s: u32,
    pub daemonset_prestop_s: u32,
    /// CA's NodeGroupDeleteNodes calls at once (`--max-scale-down-parallelism`, 10).
    pub ca_parallelism: usize,
    /// `kubectl drain` processes at once in the anchor.
    pub kubectl_parallelism: usize,
    /// The service's `apiQps` and `apiBurst` (as it ships: 50 and 100).
    pub api_qps: f64,
    pub api_burst: u32,
    /// The storm's bound in seconds, when set (`E2E_STORM_LIMIT_S`); otherwise
    /// [`Shape::storm_limit`]'s.
    pub storm_limit_s: Option<u64>,
}

impl Shape {
    pub fn new(nodes: usize) -> Self {
        Shape {
            nodes,
            draining: nodes,
            set_size: 4,
            app_prestop_s: 2,
            daemonset_prestop_s: 1,
            ca_parallelism: 10,
            kubectl_parallelism: 10,
            api_qps: shipped_settings().api_qps,
            api_burst: shipped_settings().api_burst,
            storm_limit_s: None,
        }
    }

    /// [`Shape::new`] with the storm cut after `secs` from the decision: what ended by
    /// then is measured and recorded, and the storm fails.
    pub fn storm_limit_s(self, secs: u64) -> Self {
        Shape {
            storm_limit_s: Some(secs),
            ..self
        }
    }

    /// [`Shape::new`] with the service's API rate set to `qps`, its burst twice that
    /// (the shipped ratio).
    pub fn api_qps(self, qps: f64) -> Self {
        Shape {
            api_qps: qps,
            api_burst: (2.0 * qps).round() as u32,
            ..self
        }
    }

    /// The service's settings in this storm: as it ships, at this API rate.
    pub fn settings(&self) -> ScaleInSettings {
        ScaleInSettings {
            api_qps: self.api_qps,
            api_burst: self.api_burst,
            ..shipped_settings()
        }
    }

    /// [`Shape::new`] with only `draining` of the nodes ending (at most all of them).
    pub fn draining(self, draining: usize) -> Self {
        Shape {
            draining: draining.min(self.nodes),
            ..self
        }
    }

    pub fn apps(&self) -> usize {
        (2 * self.nodes).div_ceil(self.set_size)
    }

    pub fn app_pods(&self) -> usize {
        self.apps() * self.set_size
    }

    /// Nodes of a second group, added once the storm's pods run, that take the evicted
    /// app pods (20 app pods each, of 40 that fit).
    pub fn spare(&self) -> usize {
        self.app_pods().div_ceil(20).max(self.set_size)
    }

    /// Enough for any N these machines hold: setup plus the storm.
    fn limit(&self) -> u64 {
        300 + 3 * self.nodes as u64
    }

    /// The storm's bound for `drainer`: CA drains one occupied node at a time by default,
    /// one every scan (10 s) or so, so its bound grows by a minute a node.
    fn storm_limit(&self, drainer: &Drainer) -> u64 {
        if let Some(s) = self.storm_limit_s {
            return s;
        }
        match drainer {
            Drainer::RealCa(_) => 600 + 60 * self.draining as u64,
            _ => self.limit(),
        }
    }
}

/// How the service learns of the instances the ASG ends through its hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intake {
    /// The lifecycle poll, every `lifecycleHookPollInterval` (5 s).
    Poll,
    /// Queue mode: the ASG's notification per instance on the interruption queue,
    /// consumed as `serve` consumes it; the poll slowed to the safety net's 5 min.
    Queue,
}

/// Who ends the storm.
#[derive(Debug, Clone)]
pub enum Drainer {
    /// This service, as it ships: its ServiceAccount and RBAC, `apiQps` 50 / burst 100,
    /// leader election on; half the nodes through the hook, half through DeleteNodes.
    Service(Intake),
    /// `kubectl drain --ignore-daemonsets` per node (this binary), then
    /// TerminateInstanceInAutoScalingGroup with a decrement.
    KubectlDrain(PathBuf),
    /// A real cluster-autoscaler (this binary) deciding and draining by itself, every flag
    /// of its drain at CA's default ([`ca_flags`]), under a name of its own on the API
    /// server. It hands each node it has drained to the service's NodeGroupDeleteNodes,
    /// which ends the instance (web has no hook here: CA is the only way in).
    RealCa(CaBinary),
}

impl Drainer {
    pub fn name(&self) -> String {
        match self {
            Drainer::Service(Intake::Poll) => "ca-asg-provider".into(),
            Drainer::Service(Intake::Queue) => "ca-asg-provider (queue)".into(),
            Drainer::KubectlDrain(_) => "kubectl drain".into(),
            Drainer::RealCa(bin) => format!("cluster-autoscaler {} (its own drain)", bin.version),
        }
    }
}

/// CA's flags in the storm: every flag of its drain at CA's default
/// (`--max-drain-parallelism` 1, `--max-scale-down-parallelism` 10,
/// `--daemonset-eviction-for-occupied-nodes` true, `--max-graceful-termination-sec` 600,
/// `--kube-client-qps` 5 / `--kube-client-burst` 10, `--scan-interval` 10 s); only the
/// waits before a first scale-down are the harness's short ones
/// (`--scale-down-unneeded-time` 5 s, `--scale-down-delay-after-add` 0 s), so that it
/// decides within seconds of its start. `--v=4` as CA's chart runs it. `extra`
/// (`E2E_STORM_CA_FLAGS`) comes last and wins.
pub fn ca_flags(extra: &[String]) -> Vec<String> {
    let mut f: Vec<String> = vec!["--scan-interval=10s".into(), "--v=4".into()];
    f.extend(extra.iter().cloned());
    f
}

/// CA's client-go rate limit at its defaults (`--kube-client-qps`, `--kube-client-burst`).
const CA_CLIENT_QPS: f64 = 5.0;
const CA_CLIENT_BURST: f64 = 10.0;

/// CA's client-go rate (qps, burst) under `flags`: the last `--kube-client-qps=` and
/// `--kube-client-burst=` given, else CA's defaults.
pub fn ca_client_rate(flags: &[String]) -> (f64, f64) {
    let last = |name: &str, default: f64| {
        flags
            .iter()
            .rev()
            .find_map(|f| f.strip_prefix(name)?.parse::<f64>().ok())
            .unwrap_or(default)
    };
    (
        last("--kube-client-qps=", CA_CLIENT_QPS),
        last("--kube-client-burst=", CA_CLIENT_BURST),
    )
}

/// A process's CPU and peak RSS from /proc (a real CA).
pub struct ProcessGauge(pub u32);

impl Gauge for ProcessGauge {
    fn cpu_seconds(&self) -> f64 {
        ca_asg_provider::telemetry::process::ProcWatch::new(self.0)
            .sample()
            .map_or(0.0, |s| s.cpu_seconds)
    }
    fn peak_memory(&self) -> Option<(u64, &'static str)> {
        let peak = super::control_plane::proc_peak_rss(self.0)?;
        Some((peak, "peak RSS of the process"))
    }
    /// Linux resets VmHWM to the current RSS on `5` written to clear_refs.
    fn reset_peak(&self) {
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.0), "5");
    }
}

/// kubectl's processes, once they have exited (getrusage of waited-for children).
pub struct ChildrenGauge;

impl ChildrenGauge {
    fn usage() -> libc::rusage {
        // SAFETY: getrusage writes into the struct it is given.
        unsafe {
            let mut u: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_CHILDREN, &mut u);
            u
        }
    }
}

impl Gauge for ChildrenGauge {
    fn cpu_seconds(&self) -> f64 {
        let u = Self::usage();
        let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
        t(u.ru_utime) + t(u.ru_stime)
    }
    /// getrusage's maxrss would also hold the control planes already waited for: the
    /// storm reads each kubectl's own peak from /proc while it runs instead.
    fn peak_memory(&self) -> Option<(u64, &'static str)> {
        None
    }
    fn reset_peak(&self) {}
}

/// The drainer's own CPU and memory, read by whoever runs it.
pub trait Gauge: Send + Sync {
    /// CPU seconds so far.
    fn cpu_seconds(&self) -> f64;
    /// Peak memory so far (bytes), and what it is; `None` when the storm reads it
    /// itself (kubectl's processes, from /proc while each runs).
    fn peak_memory(&self) -> Option<(u64, &'static str)>;
    /// Forget the peak: the next reading is the peak from now on.
    fn reset_peak(&self);
}

/// What one storm measured.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub drainer: String,
    pub k8s_version: String,
    pub nodes: usize,
    /// The service's `apiQps` (the pacing floor's rate).
    pub api_qps: f64,
    /// The time the drainer's own requests take at `apiQps` past its burst: the end
    /// can come no sooner while every request waits for the service's bucket (0 for
    /// kubectl, which has no such bucket here).
    pub own_requests_paced_s: f64,
    /// The nodes ended in the storm (of `nodes`).
    pub draining: usize,
    /// The cluster's app pods.
    pub app_pods: usize,
    /// The DaemonSet pods on the ending nodes (one each).
    pub daemonset_pods: usize,
    /// From the decision to the last instance's end; in a cut storm, to the cut.
    pub all_ended_s: f64,
    /// The instances that ended (of `draining`), and each one's end from the decision,
    /// in order: how the storm went, not only how long it took.
    pub ended: usize,
    pub end_times_s: Vec<f64>,
    /// Set when the storm reached its bound before every instance had ended: the
    /// figures are those of the part that ran, `all_ended_s` is the bound and `ratio`
    /// only a lower bound.
    pub cut: bool,
    /// Why it was cut, with CA's log when CA drained: the storm fails with it once its
    /// figures are recorded.
    #[serde(skip)]
    pub cut_why: Option<String>,
    /// The last end among the instances the ASG chose (the hook's half; 0 if none),
    /// and among the others (CA's DeleteNodes, or kubectl's).
    pub hook_half_last_end_s: f64,
    pub other_last_end_s: f64,
    /// The drainer's first and last eviction the API server accepted, from the decision.
    pub first_eviction_s: f64,
    pub last_eviction_s: f64,
    /// What no drainer can beat: the slowest of the node's own pods (app preStop then
    /// DaemonSet preStop), `apiQps` for the requests every drainer needs, and each
    /// budget's chain as the disruption controller let it go (`chain_floor_s`).
    pub floor_s: f64,
    pub node_floor_s: f64,
    pub pacing_floor_s: f64,
    /// Per budget: the time from each of the drainer's evictions to the disruption
    /// controller's next status of the budget that allows one (what the Eviction API
    /// reads), summed over all but the last, plus the last pod's preStop and the
    /// DaemonSet preStop; the longest budget.
    pub chain_floor_s: f64,
    /// On the budget whose chain sets `chain_floor_s`: the time from each status that
    /// allowed its next eviction to the drainer's eviction, summed. What the drainer's
    /// own reaction (its watch of the budget, its queue, its rate limit) adds to the
    /// chain; the floor does not count it.
    pub chain_reaction_s: f64,
    pub ratio: f64,
    /// The drainer's requests (audit log), in all and per instance ended (all of them
    /// unless the storm was cut).
    pub requests: usize,
    pub requests_per_node: f64,
    /// Pods per node (app and DaemonSet): the yardstick for requests per node.
    pub pods_per_node: f64,
    pub requests_by_kind: BTreeMap<String, usize>,
    pub watches_opened: usize,
    /// The drainer's requests answered 429: by a budget (eviction refused) and by
    /// priority and fairness (any other 429).
    pub refused_by_budget: usize,
    pub rejected_429_other: usize,
    /// The API server's own counter of requests priority and fairness rejected, all
    /// clients, during the storm.
    pub apf_rejected: f64,
    /// Seconds requests spent queued by priority and fairness, all clients.
    pub apf_queued_s: f64,
    pub apiserver_cpu_s: f64,
    pub etcd_cpu_s: f64,
    pub controllers_cpu_s: f64,
    pub apiserver_peak_rss_mb: f64,
    pub drainer_cpu_s: f64,
    pub drainer_peak_mb: f64,
    pub drainer_memory_is: String,
    /// Checks, read from outside.
    pub fewest_ready_margin: i64,
    pub daemonset_pods_ended_with_instance: usize,
    /// DaemonSet pods of the ending nodes that began to stop before their node's last
    /// workload pod had exited (a log shipper gone while the apps still wrote).
    pub daemonset_pods_stopped_early: usize,
    pub workload_pods_ended_with_instance: usize,
    pub hook_timeouts: usize,
    pub lifecycle_actions_completed: usize,
    pub terminate_calls: u64,
}

/// Runs one storm of `shape` ended by `drainer` on a control plane of its own.
/// `service_rt` is the runtime the service runs on, and `service_gauge` reads its CPU
/// and memory (its runtime's threads and heap, which only the test binary's allocator
/// knows); the storm reads kubectl's ([`ChildrenGauge`]) and CA's ([`ProcessGauge`])
/// itself.
pub async fn run(
    bin: &Binaries,
    shape: &Shape,
    drainer: &Drainer,
    service_rt: &tokio::runtime::Handle,
    service_gauge: &dyn Gauge,
    step: &(dyn Fn(&str) + Sync),
) -> Figures {
    let n = shape.nodes;
    step("start the control plane");
    let mut cp = ControlPlane::start(bin)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let admin = cp.client(Who::Admin).await.unwrap();
    apply_shipped_rbac(&admin).await;

    step("register a Ready Node per instance");
    let mut web = MemoryGroup::new("web", 0, n as i32, n as i32, "m5.xlarge");
    // Only the service's storm has the ASG scale in through the hook; CA's drain and
    // kubectl's are the only way in for theirs.
    if matches!(drainer, Drainer::Service(_)) {
        web = web.terminating_hook(HOOK, 300);
    }
    let cloud = MemoryCloud::new(vec![web], timing());
    let kubelet = FakeKubelet::start(cp.client(Who::Kubelet).await.unwrap(), cloud.clone());
    nodes_ready(&kubelet, n, shape.limit()).await;

    step("run the workloads");
    workloads(&admin, &mut cp, shape).await;
    let want = shape.app_pods() + n;
    until("every app and DaemonSet pod Ready", shape.limit(), || {
        let a = admin.clone();
        async move { super::rig::ready_pods(&a).await.len() >= want }
    })
    .await;

    step("add the spare nodes that take the evicted pods");
    let spare = shape.spare();
    // At its minimum size: a CA deciding by itself must not take the spare nodes away.
    cloud.add_group(MemoryGroup::new(
        "spare",
        spare as i32,
        spare as i32,
        spare as i32,
        "m5.xlarge",
    ));
    nodes_ready(&kubelet, n + spare, shape.limit()).await;
    let web_nodes: Vec<(String, String)> = kubelet
        .nodes()
        .into_iter()
        .filter(|(_, iid)| {
            cloud
                .instances()
                .iter()
                .any(|(g, i)| g == "web" && &i.id == iid)
        })
        .collect();
    assert_eq!(web_nodes.len(), n, "web's Nodes");

    step("start the drainer");
    let service = match drainer {
        Drainer::Service(intake) => {
            Some(start_service(&cp, &cloud, *intake, shape.settings(), service_rt).await)
        }
        // CA's provider: the service as it ships, ending what CA hands it.
        Drainer::RealCa(_) => {
            Some(start_service(&cp, &cloud, Intake::Poll, shape.settings(), service_rt).await)
        }
        Drainer::KubectlDrain(_) => None,
    };
    let k = shape.draining;
    let mut ca: Option<RealCa> = None;
    let mut ca_rate = (CA_CLIENT_QPS, CA_CLIENT_BURST);
    if let (Drainer::RealCa(bin), Some(svc)) = (drainer, &service) {
        let staying: Vec<String> = web_nodes[k..].iter().map(|(n, _)| n.clone()).collect();
        super::rig::scale_down_disabled(&admin, &staying).await;
        let extra: Vec<String> = std::env::var("E2E_STORM_CA_FLAGS")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let flags = ca_flags(&extra);
        ca_rate = ca_client_rate(&flags);
        let mut c = RealCa::start_as(bin, &cp, Who::Drainer, &svc.addr, &flags)
            .unwrap_or_else(|e| panic!("{e:#}"));
        step(&format!("{} reaches its first loop", c.label()));
        c.first_loop(FIRST_LOOP_SECS)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        ca = Some(c);
    }
    let ca_gauge = ca.as_ref().and_then(RealCa::pid).map(ProcessGauge);
    let gauge: &dyn Gauge = match (drainer, &ca_gauge) {
        (Drainer::Service(_), _) => service_gauge,
        (Drainer::KubectlDrain(_), _) => &ChildrenGauge,
        (Drainer::RealCa(_), Some(g)) => g,
        (Drainer::RealCa(_), None) => panic!("cluster-autoscaler has no process id"),
    };

    step("the storm: every node ended at once");
    let cpu0 = cp.cpu_seconds();
    let apf0 = apf_counters(&admin).await;
    let audit0 = cp.audit().len();
    let drainer_cpu0 = gauge.cpu_seconds();
    gauge.reset_peak();
    if let Some(c) = ca.as_mut() {
        // CA decides by itself, node by node: the storm's clock starts at its first
        // decision, the first ToBeDeletedByClusterAutoscaler taint on a web node.
        step("wait for CA's first decision");
        first_ca_taint(&admin, c, &web_nodes[..k]).await;
    }
    let asked = Utc::now();
    let t0 = Instant::now();
    let mut kubectl_peak_rss = 0;
    let mut chosen = Vec::new();
    let ending: Vec<(String, String)> = match (drainer, &service) {
        (Drainer::RealCa(_), _) => web_nodes[..k].to_vec(),
        (Drainer::KubectlDrain(kubectl), _) => {
            let ending = web_nodes[..k].to_vec();
            kubectl_peak_rss =
                kubectl_drains(&cp, &cloud, kubectl, &ending, shape.kubectl_parallelism).await;
            ending
        }
        (Drainer::Service(_), svc) => {
            let svc = svc.as_ref().expect("the service was started");
            chosen = cloud
                .external_scale_in("web", (k / 2) as i32)
                .expect("the ASG scales in");
            if let Some(q) = &svc.queue {
                for iid in &chosen {
                    let token = cloud.action_token(iid, HOOK);
                    q.send(&super::support::notices::lifecycle(
                        "web",
                        iid,
                        HOOK,
                        token.as_deref(),
                    ));
                }
            }
            let rest: Vec<(String, String)> = web_nodes
                .iter()
                .filter(|(_, iid)| !chosen.contains(iid))
                .take(k - k / 2)
                .cloned()
                .collect();
            ca_deletes(&admin, svc, &rest, shape.ca_parallelism).await;
            web_nodes
                .iter()
                .filter(|(_, iid)| chosen.contains(iid) || rest.iter().any(|(_, r)| r == iid))
                .cloned()
                .collect()
        }
    };
    assert_eq!(ending.len(), k, "the nodes ending in the storm");
    step("wait for every instance to end");
    let iids: Vec<String> = ending.iter().map(|(_, i)| i.clone()).collect();
    let mut ended_at: BTreeMap<String, f64> = BTreeMap::new();
    let limit = shape.storm_limit(drainer);
    let mut said = 0;
    let mut cut_why = None;
    while ended_at.len() < iids.len() {
        if let Some(c) = ca.as_mut() {
            c.check_alive()
                .unwrap_or_else(|e| panic!("during the storm: {e:#}"));
            let minutes = t0.elapsed().as_secs() / 60;
            if minutes > said {
                said = minutes;
                step(&format!("{} of {k} instances ended", ended_at.len()));
            }
        }
        if t0.elapsed() >= Duration::from_secs(limit) {
            let log = ca
                .as_ref()
                .map(|c| format!("\n{}", c.failure("its log at the end")))
                .unwrap_or_default();
            cut_why = Some(format!(
                "only {} of {k} instances ended in {limit} s{log}",
                ended_at.len()
            ));
            break;
        }
        let ended = kubelet.instances_ended();
        for i in iids.iter().filter(|i| ended.contains(i)) {
            ended_at
                .entry(i.clone())
                .or_insert_with(|| t0.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cut = cut_why.is_some();
    let mut end_times_s: Vec<f64> = ended_at.values().copied().collect();
    end_times_s.sort_by(f64::total_cmp);
    let all_ended_s = if cut {
        t0.elapsed().as_secs_f64()
    } else {
        end_times_s.last().copied().unwrap_or(0.0)
    };
    let drainer_cpu_s = gauge.cpu_seconds() - drainer_cpu0;
    let (peak, memory_is) = gauge
        .peak_memory()
        .unwrap_or((kubectl_peak_rss, "RSS of the largest kubectl process"));
    let cpu1 = cp.cpu_seconds();
    let apf1 = apf_counters(&admin).await;
    let rss = cp.peak_rss();
    if let Some(mut c) = ca.take() {
        c.stop();
    }
    if let Some(svc) = service {
        svc.stop(service_rt);
    }
    kubelet.stop();

    step("read the audit log");
    let audit: Vec<AuditEvent> = cp.audit().into_iter().skip(audit0).collect();
    let user = match drainer {
        Drainer::Service(_) => SERVICE_USER,
        Drainer::KubectlDrain(_) | Drainer::RealCa(_) => DRAINER_USER,
    };
    let mine: Vec<&AuditEvent> = audit.iter().filter(|e| e.user.username == user).collect();
    let done: Vec<&&AuditEvent> = mine
        .iter()
        .filter(|e| e.stage == "ResponseComplete")
        .collect();
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for e in &done {
        *by_kind.entry(kind(e)).or_default() += 1;
    }
    let watches_opened = mine
        .iter()
        .filter(|e| e.verb == "watch" && e.stage == "ResponseStarted")
        .count();
    let refused_by_budget = done
        .iter()
        .filter(|e| e.code() == 429 && e.is("create", "pods", "eviction"))
        .count();
    let rejected_429_other = done
        .iter()
        .filter(|e| e.code() == 429 && !e.is("create", "pods", "eviction"))
        .count();

    step("check the promises");
    let stops = kubelet.stops();
    let node_names: BTreeSet<String> = ending.iter().map(|(n, _)| n.clone()).collect();
    let on_storm = |s: &&PodStop| node_names.contains(&s.node) && s.started < asked;
    let daemonset_with_instance = stops
        .iter()
        .filter(on_storm)
        .filter(|s| s.daemonset && s.how == Ending::WithInstance)
        .count();
    let daemonset_early: usize = node_names
        .iter()
        .map(|node| checks::daemonsets_stopped_early(&stops, node, asked).len())
        .sum();
    let workload_with_instance = stops
        .iter()
        .filter(on_storm)
        .filter(|s| !s.daemonset && s.how == Ending::WithInstance)
        .count();
    let readies = kubelet.readies();
    let fewest_ready_margin = (0..shape.apps())
        .map(|k| {
            let fewest =
                checks::fewest_ready(&readies, &stops, &format!("shop/app-{k}-"), shape.set_size);
            fewest as i64 - (shape.set_size as i64 - 1)
        })
        .min()
        .unwrap_or(0);

    let floors = floors(shape, &audit, user);
    let last = |hooked: bool| {
        ended_at
            .iter()
            .filter(|(i, _)| chosen.contains(i) == hooked)
            .map(|(_, t)| *t)
            .fold(0.0, f64::max)
    };
    let since = |t: Option<DateTime<Utc>>| {
        t.map_or(0.0, |t| (t - asked).num_milliseconds() as f64 / 1000.0)
    };
    let evictions: Vec<DateTime<Utc>> = done
        .iter()
        .filter(|e| e.is("create", "pods", "eviction") && e.code() == 201)
        .filter_map(|e| e.stage_timestamp)
        .collect();
    let calls = cloud.calls();
    let ended = end_times_s.len();
    let figures = Figures {
        drainer: drainer.name(),
        k8s_version: bin.version.clone(),
        nodes: n,
        api_qps: match drainer {
            Drainer::RealCa(_) => ca_rate.0,
            _ => shape.api_qps,
        },
        own_requests_paced_s: match drainer {
            Drainer::Service(_) => {
                (done.len() as f64 - f64::from(shape.api_burst)).max(0.0) / shape.api_qps
            }
            Drainer::RealCa(_) => (done.len() as f64 - ca_rate.1).max(0.0) / ca_rate.0,
            Drainer::KubectlDrain(_) => 0.0,
        },
        draining: k,
        app_pods: shape.app_pods(),
        daemonset_pods: k,
        all_ended_s,
        ended,
        end_times_s,
        cut,
        cut_why,
        hook_half_last_end_s: last(true),
        other_last_end_s: last(false),
        first_eviction_s: since(evictions.iter().min().copied()),
        last_eviction_s: since(evictions.iter().max().copied()),
        floor_s: floors.floor,
        node_floor_s: floors.node,
        pacing_floor_s: floors.pacing,
        chain_floor_s: floors.chain,
        chain_reaction_s: floors.reaction,
        ratio: all_ended_s / floors.floor,
        requests: done.len(),
        requests_per_node: done.len() as f64 / ended.max(1) as f64,
        pods_per_node: (shape.app_pods() + n) as f64 / n as f64,
        requests_by_kind: by_kind,
        watches_opened,
        refused_by_budget,
        rejected_429_other,
        apf_rejected: apf1.rejected - apf0.rejected,
        apf_queued_s: apf1.queued_s - apf0.queued_s,
        apiserver_cpu_s: delta(&cpu0, &cpu1, "kube-apiserver"),
        etcd_cpu_s: delta(&cpu0, &cpu1, "etcd"),
        controllers_cpu_s: delta(&cpu0, &cpu1, "kube-controller-manager")
            + delta(&cpu0, &cpu1, "kube-scheduler"),
        apiserver_peak_rss_mb: rss.get("kube-apiserver").copied().unwrap_or(0) as f64 / 1e6,
        drainer_cpu_s,
        drainer_peak_mb: peak as f64 / 1e6,
        drainer_memory_is: memory_is.into(),
        fewest_ready_margin,
        daemonset_pods_ended_with_instance: daemonset_with_instance,
        daemonset_pods_stopped_early: daemonset_early,
        workload_pods_ended_with_instance: workload_with_instance,
        hook_timeouts: cloud.hook_timeouts().len(),
        lifecycle_actions_completed: cloud.completed_actions().len(),
        terminate_calls: calls.get("terminate_instance").copied().unwrap_or(0),
    };
    if matches!(drainer, Drainer::Service(_)) {
        step("check: evictions only, none twice, DaemonSet pods last");
        let names: Vec<String> = node_names.iter().cloned().collect();
        checks::evictions_only(&audit, &stops, &names).unwrap_or_else(|e| panic!("{e}"));
        checks::daemonset_last(&stops, &names, asked).unwrap_or_else(|e| panic!("{e}"));
        step("check: each instance ended once, no hook timed out");
        each_chosen_ended_once(&kubelet, &web_nodes, &iids, !cut);
        let done = cloud.completed_actions();
        for (_, iid) in &web_nodes {
            let k = done.iter().filter(|(a, _)| &a.instance_id == iid).count();
            assert!(k <= 1, "lifecycle actions completed for {iid}: {k}");
        }
        assert!(
            figures.terminate_calls as usize <= k - k / 2,
            "TerminateInstanceInAutoScalingGroup calls: {calls:?} for {} nodes CA named",
            k - k / 2
        );
        assert_eq!(figures.hook_timeouts, 0, "a held hook timed out");
        assert_eq!(
            figures.rejected_429_other, 0,
            "priority and fairness rejected the service"
        );
        assert!(figures.fewest_ready_margin >= 0, "a budget was broken");
    }
    if matches!(drainer, Drainer::RealCa(_)) {
        step("check: each instance CA chose ended once, no other ended");
        each_chosen_ended_once(&kubelet, &web_nodes, &iids, !cut);
    }
    cp.check_alive()
        .unwrap_or_else(|e| panic!("a control plane component died: {e}"));
    figures
}

/// Each of web's instances in `chosen` ended exactly once (at most once when the storm
/// was cut before it was `complete`), and no other ended.
fn each_chosen_ended_once(
    kubelet: &FakeKubelet,
    web_nodes: &[(String, String)],
    chosen: &[String],
    complete: bool,
) {
    let ended = kubelet.instances_ended();
    for (_, iid) in web_nodes {
        let times = ended.iter().filter(|i| *i == iid).count();
        let want = usize::from(chosen.contains(iid));
        let ok = if complete {
            times == want
        } else {
            times <= want
        };
        assert!(ok, "{iid} ended {times} times (chosen: {})", want == 1);
    }
}

/// Waits for CA's first ToBeDeletedByClusterAutoscaler taint on one of `nodes`, failing
/// with CA's log when CA dies or has decided nothing in 5 minutes.
async fn first_ca_taint(admin: &kube::Client, ca: &mut RealCa, nodes: &[(String, String)]) {
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    let names: BTreeSet<&str> = nodes.iter().map(|(n, _)| n.as_str()).collect();
    let end = Instant::now() + Duration::from_secs(300);
    loop {
        let listed = api.list(&Default::default()).await;
        let tainted = listed.iter().flat_map(|l| &l.items).any(|node| {
            names.contains(node.metadata.name.as_deref().unwrap_or_default())
                && node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == "ToBeDeletedByClusterAutoscaler"))
        });
        if tainted {
            return;
        }
        ca.check_alive()
            .unwrap_or_else(|e| panic!("before its first decision: {e:#}"));
        assert!(
            Instant::now() < end,
            "{}",
            ca.failure("no node of web tainted ToBeDeletedByClusterAutoscaler in 300 s")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The Deployments (each behind its budget) and the DaemonSet of the storm.
async fn workloads(admin: &kube::Client, cp: &mut ControlPlane, shape: &Shape) {
    namespaces(admin, cp, &["shop", "logging"]).await;
    for k in 0..shape.apps() {
        let name = format!("app-{k}");
        create(
            admin,
            Some("shop"),
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name},
                "spec": {"replicas": shape.set_size, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}}, "spec": {
                        "terminationGracePeriodSeconds": 30,
                        "containers": containers(shape.app_prestop_s)}}}
            }),
        )
        .await;
        budget(admin, &name).await;
    }
    log_shipper(admin, shape.daemonset_prestop_s).await;
}

async fn nodes_ready(kubelet: &FakeKubelet, want: usize, secs: u64) {
    until(&format!("{want} Ready Nodes"), secs, || {
        let k = kubelet.clone();
        async move { k.nodes().len() >= want }
    })
    .await;
}

/// The service on its own runtime: its ServiceAccount's client, leader election on,
/// the lifecycle loop, gRPC on a Unix socket.
pub struct RunningService {
    pub engine: Arc<scalein::Engine>,
    pub addr: ListenAddr,
    /// The interruption queue, in queue mode.
    pub queue: Option<Arc<MemoryQueue>>,
    lifecycle: tokio::task::JoinHandle<()>,
    consumer: Option<tokio::task::JoinHandle<()>>,
}

impl RunningService {
    fn stop(self, rt: &tokio::runtime::Handle) {
        let _guard = rt.enter();
        self.lifecycle.abort();
        if let Some(c) = self.consumer {
            c.abort();
        }
        self.engine.abort_all();
        self.engine.shutdown();
    }
}

/// The service as it ships (apiQps 50, burst 100, maxConcurrentDrains and every other
/// setting at its default, leader election on), over `cloud`.
pub fn shipped_settings() -> ScaleInSettings {
    ScaleInSettings {
        leader_election: true,
        lease_namespace: Some("kube-system".into()),
        ..ScaleInSettings::default()
    }
}

async fn start_service(
    cp: &ControlPlane,
    cloud: &MemoryCloud,
    intake: Intake,
    mut settings: ScaleInSettings,
    rt: &tokio::runtime::Handle,
) -> RunningService {
    let kubeconfig = cp.kubeconfig(Who::Service).unwrap();
    let cloud = cloud.clone();
    rt.spawn(async move {
        let client = super::control_plane::client_from(&kubeconfig)
            .await
            .expect("the service's client");
        let interruption = InterruptionSettings::default();
        if intake == Intake::Queue {
            // As the configuration slows it in queue mode.
            settings.lifecycle_poll_interval = interruption.safety_net_poll;
        }
        let (provider, engine, _ca, addr, _counts) =
            super::rig::serve(client, &cloud, settings).await;
        engine.elect_leader();
        let leads = Arc::downgrade(&engine);
        provider.spawn_keep_fresh(move || leads.upgrade().is_some_and(|e| e.is_leader()));
        until("the service to lead", 60, || {
            let e = engine.clone();
            async move { e.is_leader() }
        })
        .await;
        let (queue, consumer) = match intake {
            Intake::Poll => (None, None),
            Intake::Queue => {
                let queue = Arc::new(MemoryQueue::default());
                let consumer = Consumer::new(
                    engine.clone(),
                    provider.clone(),
                    queue.clone() as Arc<dyn Queue>,
                    interruption,
                );
                (Some(queue), Some(consumer.spawn()))
            }
        };
        let lifecycle = scalein::sources::hook_scan::spawn_loop(engine.clone(), provider);
        RunningService {
            engine,
            addr,
            queue,
            lifecycle,
            consumer,
        }
    })
    .await
    .expect("the service starts")
}

/// CA >= 1.34 scaling `nodes` down: each node tainted ToBeDeletedByClusterAutoscaler,
/// then one NodeGroupDeleteNodes per node under CA's 5 s deadline, `parallelism` at once.
async fn ca_deletes(
    admin: &kube::Client,
    svc: &RunningService,
    nodes: &[(String, String)],
    parallelism: usize,
) {
    use futures::StreamExt;
    let ListenAddr::Unix(path) = &svc.addr else {
        panic!("the service serves on a socket")
    };
    let ca = CloudProviderClient::new(
        ca_asg_provider::grpc::connect_unix(path)
            .await
            .expect("connect to the service"),
    );
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    futures::stream::iter(nodes.iter().cloned())
        .for_each_concurrent(parallelism, |(name, iid)| {
            let mut ca = ca.clone();
            let api = api.clone();
            async move {
                let taint = json!({"spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler",
                    "value": Utc::now().timestamp().to_string(), "effect": "NoSchedule"}]}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(taint))
                    .await
                    .unwrap_or_else(|e| panic!("CA's taint on {name}: {e}"));
                let req = proto::NodeGroupDeleteNodesRequest {
                    id: "web".into(),
                    nodes: vec![proto::ExternalGrpcNode {
                        provider_id: format!("aws:///us-east-1a/{iid}"),
                        name: name.clone(),
                        labels: [("kubernetes.io/hostname".to_string(), name.clone())].into(),
                        ..Default::default()
                    }],
                };
                let mut r = tonic::Request::new(req);
                r.set_timeout(Duration::from_secs(5));
                ca.node_group_delete_nodes(r)
                    .await
                    .unwrap_or_else(|e| panic!("NodeGroupDeleteNodes {name}: {e}"));
            }
        })
        .await;
}

/// A drain-then-terminate script: `kubectl drain --ignore-daemonsets` per node,
/// `parallelism` at once, then TerminateInstanceInAutoScalingGroup with a decrement.
/// Returns the largest peak RSS of a kubectl process (read from /proc while it ran).
async fn kubectl_drains(
    cp: &ControlPlane,
    cloud: &MemoryCloud,
    kubectl: &std::path::Path,
    nodes: &[(String, String)],
    parallelism: usize,
) -> u64 {
    use futures::StreamExt;
    let kubeconfig = cp.kubeconfig(Who::Drainer).unwrap();
    let peak = std::sync::atomic::AtomicU64::new(0);
    futures::stream::iter(nodes.iter().cloned())
        .for_each_concurrent(parallelism, |(name, iid)| {
            let kubeconfig = kubeconfig.clone();
            let cloud = cloud.clone();
            let peak = &peak;
            async move {
                let mut child = tokio::process::Command::new(kubectl)
                    .arg(format!("--kubeconfig={}", kubeconfig.display()))
                    .args([
                        "drain",
                        &name,
                        "--ignore-daemonsets",
                        "--delete-emptydir-data",
                    ])
                    .arg("--timeout=600s")
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap_or_else(|e| panic!("run {}: {e}", kubectl.display()));
                let pid = child.id().expect("kubectl's pid");
                let status = loop {
                    if let Some(rss) = super::control_plane::proc_peak_rss(pid) {
                        peak.fetch_max(rss, std::sync::atomic::Ordering::Relaxed);
                    }
                    match tokio::time::timeout(Duration::from_millis(50), child.wait()).await {
                        Ok(status) => break status.expect("kubectl's exit"),
                        Err(_) => continue,
                    }
                };
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use tokio::io::AsyncReadExt;
                    let _ = e.read_to_string(&mut err).await;
                }
                assert!(status.success(), "kubectl drain {name}: {err}");
                cloud
                    .terminate_instance(&iid, true)
                    .await
                    .expect("TerminateInstanceInAutoScalingGroup");
            }
        })
        .await;
    peak.into_inner()
}

fn kind(e: &AuditEvent) -> String {
    let r = e.object_ref.clone().unwrap_or_default();
    let resource = if r.subresource.is_empty() {
        r.resource
    } else {
        format!("{}/{}", r.resource, r.subresource)
    };
    format!("{} {resource}", e.verb)
}

fn delta(a: &BTreeMap<&str, f64>, b: &BTreeMap<&str, f64>, name: &str) -> f64 {
    b.get(name).copied().unwrap_or(0.0) - a.get(name).copied().unwrap_or(0.0)
}

struct Floors {
    floor: f64,
    node: f64,
    pacing: f64,
    chain: f64,
    /// On the budget whose chain is `chain`: the drainer's reaction to each status
    /// that allowed an eviction (see [`Figures::chain_reaction_s`]).
    reaction: f64,
}

/// The storm's floor (see [`Figures::floor_s`]).
fn floors(shape: &Shape, audit: &[AuditEvent], user: &str) -> Floors {
    let settings = shape.settings();
    let node = (shape.app_prestop_s + shape.daemonset_prestop_s) as f64;
    // One eviction per pod and one cordon per node, beyond the burst, at apiQps: the
    // draining nodes' (two app pods and a DaemonSet pod each).
    let necessary = (4 * shape.draining) as f64;
    let pacing = (necessary - settings.api_burst as f64).max(0.0) / settings.api_qps
        + shape.daemonset_prestop_s as f64;
    let mut chain: f64 = 0.0;
    let mut reaction: f64 = 0.0;
    for k in 0..shape.apps() {
        let prefix = format!("app-{k}-");
        let mut evictions: Vec<DateTime<Utc>> = audit
            .iter()
            .filter(|e| {
                e.user.username == user
                    && e.stage == "ResponseComplete"
                    && e.is("create", "pods", "eviction")
                    && e.code() == 201
                    && e.object_ref
                        .as_ref()
                        .is_some_and(|r| r.name.starts_with(&prefix))
            })
            .filter_map(|e| e.stage_timestamp)
            .collect();
        evictions.sort();
        // When the disruption controller's status of the budget next allowed one
        // (the Eviction API reads that status: no drainer can go sooner).
        let allows: Vec<DateTime<Utc>> = audit
            .iter()
            .filter(|e| {
                e.stage == "ResponseComplete"
                    && e.is("update", "poddisruptionbudgets", "status")
                    && e.object_ref
                        .as_ref()
                        .is_some_and(|r| r.name == format!("app-{k}"))
                    && e.request_object.as_ref().is_some_and(|o| {
                        o["status"]["disruptionsAllowed"].as_i64().unwrap_or(0) >= 1
                    })
            })
            .filter_map(|e| e.stage_timestamp)
            .collect();
        let secs = |d: chrono::TimeDelta| d.num_milliseconds().max(0) as f64 / 1000.0;
        let waits: f64 = evictions
            .iter()
            .take(evictions.len().saturating_sub(1))
            .filter_map(|e| allows.iter().find(|a| *a > e).map(|a| *a - *e))
            .map(secs)
            .sum();
        // From each status that allowed the next eviction to that eviction.
        let reacted: f64 = evictions
            .windows(2)
            .filter_map(|w| allows.iter().find(|a| **a > w[0]).map(|a| w[1] - *a))
            .map(secs)
            .sum();
        if waits + node > chain {
            chain = waits + node;
            reaction = reacted;
        }
    }
    Floors {
        floor: node.max(pacing).max(chain),
        node,
        pacing,
        chain,
        reaction,
    }
}

struct Apf {
    rejected: f64,
    queued_s: f64,
}

/// Priority and fairness, as the API server counts it (`/metrics`): requests rejected,
/// and the seconds requests waited in its queues.
async fn apf_counters(admin: &kube::Client) -> Apf {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = admin.request_text(req).await.unwrap_or_default();
    let sum = |metric: &str| -> f64 {
        text.lines()
            .filter(|l| {
                l.starts_with(metric)
                    && (l.len() == metric.len() || l[metric.len()..].starts_with(['{', ' ']))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    Apf {
        rejected: sum("apiserver_flowcontrol_rejected_requests_total"),
        queued_s: sum("apiserver_flowcontrol_request_wait_duration_seconds_sum"),
    }
}

/// The figures as Markdown rows, one per storm.
pub fn table(rows: &[Figures]) -> String {
    let mut s = String::from(
        "| drainer | N (ending) | ended | floor | ratio | own requests at apiQps | requests/node | watches | 429 (budget / APF) | kube-apiserver CPU | etcd CPU | drainer CPU | drainer memory | DaemonSet pods ended with the instance | DaemonSet pods stopped before their node's workloads |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for f in rows {
        let ended = if f.cut {
            format!(
                "{} of {} by {:.0} s (cut)",
                f.ended, f.draining, f.all_ended_s
            )
        } else {
            format!("{:.1} s", f.all_ended_s)
        };
        s.push_str(&format!(
            "| {} | {} ({}) | {} | {:.1} s | {:.2} | {:.1} s ({:.0}/s) | {:.1} | {} | {} / {} | {:.1} s | {:.1} s | {:.1} s | {:.0} MB ({}) | {} of {} | {} of {} |\n",
            f.drainer,
            f.nodes,
            f.draining,
            ended,
            f.floor_s,
            f.ratio,
            f.own_requests_paced_s,
            f.api_qps,
            f.requests_per_node,
            f.watches_opened,
            f.refused_by_budget,
            f.rejected_429_other,
            f.apiserver_cpu_s,
            f.etcd_cpu_s,
            f.drainer_cpu_s,
            f.drainer_peak_mb,
            f.drainer_memory_is,
            f.daemonset_pods_ended_with_instance,
            f.daemonset_pods,
            f.daemonset_pods_stopped_early,
            f.daemonset_pods,
        ));
    }
    s
}
