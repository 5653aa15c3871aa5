//! Model-based test (proptest) of warm pools that reuse instances on scale-in (issue
//! 47): the ASG sends instances back to the pool and CA takes them out again between
//! any two steps (CA also lowering its target while capacity is on its way), beside
//! spot warnings, new workload pods, restarts of the service,
//! AWS throttling heartbeats and completions, and the API server refusing Node writes.
//! The service runs as it does in production: the lifecycle loop, the queue consumer,
//! the gRPC server CA calls. Our hook's timeout is 3 s, so an instance left without
//! heartbeats shows. After every step:
//!
//! - no hook of ours times out, and no instance ends but those the pool ends (a
//!   scale-in here only ever returns an instance to the pool; the pool ends one of
//!   its resting instances, perhaps one reused before, which our hook holds in
//!   `Warmed:Terminating:Wait` with a new action: issue 59);
//! - no pod is evicted twice; DaemonSet pods leave a node only after every workload
//!   pod placed there before them is gone;
//! - CA's view (after a Refresh): no instance in the pool is listed as the group's,
//!   no pool instance's Node maps to a group (NodeGroupForNode, as CA's loop asks it
//!   for every Node), and the target is the ASG's desired capacity.
//!
//! At the end, progress: no drain runs, no instance waits in `Warmed:Pending:Wait`
//! or `Warmed:Terminating:Wait`,
//! and every instance in service in the group has a Node with nothing of this service
//! on it unless a spot warning still cordons it (a node back from the pool is handed
//! back, whatever happened on its way).
//!
//! Cases: [`CASES`] (`MODEL_CASES=N`), 16 side by side, each on its own paused clock
//! (support::model; a case replays exactly, docs/models.md). A failure
//! prints its seed, case, smallest failing sequence and the replay line.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::HookEvent;
use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::cloud::queue::MemoryQueue;
use ca_asg_provider::cloud::{LifecycleState, WarmPool};
use ca_asg_provider::proto;
use ca_asg_provider::scalein::decide::notice::RebalanceAction;
use ca_asg_provider::scalein::sources::queue::Consumer;
use ca_asg_provider::scalein::{self, stages::cordon};
use ca_asg_provider::sim::{fixtures, Refusal};
use k8s_openapi::api::core::v1::Node;
use proptest::prelude::*;

mod support;
use support::notices::spot;
use support::pods::PodLog;
use support::queue::{consumer, handle_all};
use support::world::*;

const HOOK: &str = "ca-asg-provider-drain";
const HOOK_TIMEOUT_SECS: i32 = 3;
const NODES: usize = 3;
const MAX: i32 = 4;

#[derive(Debug, Clone)]
enum Op {
    /// A scale-in policy lowers the group by one: the ASG sends its newest instance
    /// in service back to the pool.
    ScaleIn,
    /// CA's IncreaseSize by one: the ASG takes a rested instance from the pool (or
    /// launches one).
    TakeBack,
    /// CA's DecreaseTargetSize by one: allowed only while capacity is unfulfilled
    /// (an instance still on its way in, from the pool or launched).
    Decrease,
    /// A new workload pod on the node of the i-th instance in service, if it takes
    /// pods (not cordoned).
    Deploy(usize),
    /// A spot warning for the i-th instance in service (EC2 does not end it here).
    Spot(usize),
    /// The process dies; a new one starts over the same cluster and AWS.
    Restart,
    /// AWS throttles the next heartbeats and completions.
    Throttle,
    /// The API server refuses the next Node patch.
    RefuseNodeWrites,
    /// The pool ends the i-th instance resting in it (the pool shrinks, an instance
    /// refresh): our hook holds it in `Warmed:Terminating:Wait`.
    PoolEnds(usize),
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::ScaleIn),
        3 => Just(Op::TakeBack),
        1 => Just(Op::Decrease),
        2 => (0..NODES).prop_map(Op::Deploy),
        1 => (0..NODES).prop_map(Op::Spot),
        1 => Just(Op::Restart),
        1 => Just(Op::Throttle),
        1 => Just(Op::RefuseNodeWrites),
        1 => (0..NODES).prop_map(Op::PoolEnds),
        2 => (1..15u64).prop_map(|t| Op::Wait(t * 100)),
    ]
}

fn settings() -> scalein::ScaleInSettings {
    scalein::ScaleInSettings {
        warm_pool_settle: Duration::from_millis(300),
        ..fast_settings()
    }
}

struct Model {
    w: World,
    q: Arc<MemoryQueue>,
    c: Arc<Consumer>,
    lifecycle: tokio::task::JoinHandle<()>,
    pods: PodLog,
    /// Workload pods created, by name.
    apps: BTreeSet<String>,
    deployed: usize,
    /// Instances a spot warning was given for.
    warned: BTreeSet<String>,
    /// Instances the pool was told to end.
    pool_ended: BTreeSet<String>,
}

impl Model {
    async fn new(pool_state: &str) -> Model {
        let group = MemoryGroup::new("web", 0, MAX, NODES as i32, "m5.large")
            .terminating_hook(HOOK, HOOK_TIMEOUT_SECS)
            .warm_pool(WarmPool {
                min_size: 0,
                max_prepared: None,
                pool_state: pool_state.into(),
                reuse_on_scale_in: true,
            });
        let w = World::builder()
            .group(group)
            .settings(settings())
            .ready_delay(Duration::from_millis(20))
            .in_process()
            .build()
            .await;
        let pods = PodLog::watch(&w.sim);
        w.put(&fixtures::daemonset("logging", "fluentd", 0.1, false));
        let mut apps = BTreeSet::new();
        for (i, (node, _)) in nodes_of(&w, "web").iter().enumerate() {
            let name = format!("app-{i}");
            w.put(&fixtures::pod("shop", &name, node, "app", 0.2));
            apps.insert(name);
        }
        pods_ready(&w, 2 * NODES).await;
        let q = Arc::new(MemoryQueue::default());
        let c = consumer(&w, &q, RebalanceAction::Cordon);
        let lifecycle =
            scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
        Model {
            deployed: apps.len(),
            w,
            q,
            c,
            lifecycle,
            pods,
            apps,
            warned: BTreeSet::new(),
            pool_ended: BTreeSet::new(),
        }
    }

    /// The instances in service in the group, in a stable order.
    fn in_service(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .w
            .cloud
            .instances()
            .into_iter()
            .filter(|(_, i)| i.state == LifecycleState::InService)
            .map(|(_, i)| (ca_asg_provider::sim::node_name(&i.id), i.id))
            .collect();
        v.sort();
        v
    }

    async fn step(&mut self, op: &Op) {
        match op {
            Op::ScaleIn => {
                let _ = self.w.cloud.external_scale_in("web", 1);
            }
            Op::TakeBack => {
                if self.w.cloud.desired("web").unwrap_or(MAX) < MAX {
                    let _ = self
                        .w
                        .ca
                        .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
                            id: "web".into(),
                            delta: 1,
                        })
                        .await;
                }
            }
            Op::Decrease => {
                // Refused (nothing unfulfilled) or done: the target check after the
                // step says whether the answer was exact.
                let _ = self
                    .w
                    .ca
                    .node_group_decrease_target_size(proto::NodeGroupDecreaseTargetSizeRequest {
                        id: "web".into(),
                        delta: -1,
                    })
                    .await;
            }
            Op::Deploy(i) => {
                let live = self.in_service();
                let Some((node, _)) = live.get(i % live.len().max(1)) else {
                    return;
                };
                let takes_pods = self.w.sim.get::<Node>("", node).is_some_and(|n| {
                    n["spec"]["unschedulable"] != true
                        && !n["spec"]["taints"]
                            .as_array()
                            .is_some_and(|t| t.iter().any(|t| t["key"] == cordon::TAINT_KEY))
                });
                if takes_pods {
                    let name = format!("app-{}", self.deployed);
                    self.deployed += 1;
                    self.w
                        .sim
                        .create(&fixtures::pod("shop", &name, node, "app", 0.2))
                        .unwrap();
                    self.apps.insert(name);
                }
            }
            Op::Spot(i) => {
                let live = self.in_service();
                let Some((_, iid)) = live.get(i % live.len().max(1)).cloned() else {
                    return;
                };
                self.warned.insert(iid.clone());
                self.q.send(&spot(&iid));
                let _ = handle_all(&self.c, &self.q).await;
            }
            Op::Restart => {
                self.lifecycle.abort();
                self.w.engine.abort_all();
                self.w.engine.shutdown();
                let (provider, engine, ca) =
                    service(&self.w.sim, &self.w.cloud, &self.w.groups, settings()).await;
                self.w.provider = provider;
                self.w.engine = engine;
                self.w.ca = ca;
                self.c = consumer(&self.w, &self.q, RebalanceAction::Cordon);
                self.lifecycle = scalein::sources::hook_scan::spawn_loop(
                    self.w.engine.clone(),
                    self.w.provider.clone(),
                );
            }
            Op::Throttle => {
                self.w.cloud.throttle("lifecycle_heartbeat", 2);
                self.w.cloud.throttle("complete_lifecycle_action", 1);
            }
            Op::RefuseNodeWrites => {
                self.w.sim.refuse("patch", "nodes", 1, Refusal::Unavailable);
            }
            Op::PoolEnds(i) => {
                let mut resting: Vec<String> = self
                    .w
                    .cloud
                    .pooled()
                    .into_iter()
                    .filter(|(_, p)| {
                        matches!(
                            p.state.as_str(),
                            "Warmed:Stopped" | "Warmed:Running" | "Warmed:Hibernated"
                        )
                    })
                    .map(|(_, p)| p.id)
                    .collect();
                resting.sort();
                if let Some(iid) = resting.get(i % resting.len().max(1)).cloned() {
                    if self.w.cloud.end_pool_instance(&iid) {
                        self.pool_ended.insert(iid);
                    }
                }
            }
            Op::Wait(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
        }
    }

    async fn check(&mut self) {
        support::invariants::assert_stories_hold(&self.w.engine);
        let cloud = &self.w.cloud;
        let log = cloud.lifecycle_log();
        let timed_out: Vec<_> = log
            .iter()
            .filter(|e| matches!(e, HookEvent::TimedOut { hook, .. } if hook == HOOK))
            .collect();
        assert!(
            timed_out.is_empty(),
            "a held instance was not heartbeated until its drain ended: {timed_out:?}"
        );
        let ended: Vec<_> = log
            .iter()
            .filter(|e| matches!(e, HookEvent::Terminated { instance } if !self.pool_ended.contains(instance)))
            .collect();
        assert!(
            ended.is_empty(),
            "an instance ended that the pool was not told to end: {ended:?}"
        );
        assert_eq!(cloud.calls().get("terminate_instance"), None);

        let audit = self.w.sim.audit();
        assert_no_pod_evicted_twice(&audit);
        let placed = self.pods.all();
        let mut created: Vec<(String, String)> = Vec::new();
        let mut removed: BTreeSet<&str> = BTreeSet::new();
        for e in audit.iter().filter(|e| e.kind == "Pod") {
            let name = e.name.as_str();
            match e.verb.as_str() {
                "create" if self.apps.contains(name) => {
                    if let Some(p) = placed.get(name) {
                        created.push((name.to_string(), p.node.clone()));
                    }
                }
                "removed" => {
                    removed.insert(name);
                }
                "deletion-started" => {
                    let Some(p) = placed.get(name).filter(|p| p.is_daemonset()) else {
                        continue;
                    };
                    for (app, node) in &created {
                        assert!(
                            node != &p.node || removed.contains(app.as_str()),
                            "{name} started leaving {} while {app} was there",
                            p.node
                        );
                    }
                }
                _ => {}
            }
        }

        // CA's view after its Refresh.
        self.w.provider.refresh_now().await.unwrap();
        let pooled: BTreeSet<String> = cloud.pooled().into_iter().map(|(_, i)| i.id).collect();
        let listed = self
            .w
            .ca
            .node_group_nodes(proto::NodeGroupNodesRequest { id: "web".into() })
            .await
            .unwrap()
            .into_inner()
            .instances;
        for i in &listed {
            assert!(
                !pooled.iter().any(|p| i.id.ends_with(p.as_str())),
                "{} is in the warm pool, listed as the group's node",
                i.id
            );
        }
        for id in &pooled {
            let group = group_for(&mut self.w.ca, id).await;
            assert_eq!(
                group, "",
                "{id} is in the warm pool, and its Node maps to a group"
            );
        }
        assert_eq!(
            target(&mut self.w, "web").await,
            self.w.cloud.desired("web").unwrap(),
            "CA's target is not the ASG's desired capacity"
        );
    }

    /// What has not finished that can: drains, our holds in the pool, and nodes in
    /// service that still carry this service's marks with no spot warning for them.
    fn unfinished(&self) -> Vec<String> {
        let mut left = Vec::new();
        if self.w.engine.drains_at_once() > 0 {
            left.push(format!(
                "{} drain(s) running",
                self.w.engine.drains_at_once()
            ));
            // What a failure needs: each draining instance, where AWS has it, its
            // Node's record and the pods still on the node.
            for (_, i) in self
                .w
                .cloud
                .instances()
                .into_iter()
                .chain(self.w.cloud.pooled())
            {
                if !self.w.engine.is_draining(&i.id) {
                    continue;
                }
                let node = ca_asg_provider::sim::node_name(&i.id);
                let record = self
                    .w
                    .sim
                    .get::<Node>("", &node)
                    .map(|n| n["metadata"]["annotations"].to_string());
                let pods: Vec<String> = self
                    .w
                    .sim
                    .list::<k8s_openapi::api::core::v1::Pod>()
                    .iter()
                    .filter(|p| p["spec"]["nodeName"] == node.as_str())
                    .map(|p| {
                        format!(
                            "{} (deleting: {})",
                            p["metadata"]["name"].as_str().unwrap_or("?"),
                            !p["metadata"]["deletionTimestamp"].is_null()
                        )
                    })
                    .collect();
                left.push(format!(
                    "draining {} ({}): annotations {record:?}, pods {pods:?}",
                    i.id,
                    i.state.as_str()
                ));
            }
        }
        for (_, i) in self.w.cloud.pooled() {
            if i.state.is_pool_bound_wait() || i.state.is_pool_ending_wait() {
                left.push(format!("{} held in {}", i.id, i.state.as_str()));
            }
        }
        for (node, iid) in self.in_service() {
            if self.warned.contains(&iid) {
                continue;
            }
            let Some(n) = self.w.sim.get::<Node>("", &node) else {
                continue;
            };
            let marked = n["metadata"]["annotations"]
                .as_object()
                .is_some_and(|a| a.keys().any(|k| k.starts_with("ca-asg-provider.io/")));
            if marked || n["spec"]["unschedulable"] == true {
                left.push(format!("{node} ({iid}) in service, not handed back"));
            }
        }
        left
    }
}

fn run(pool_state: &str, ops: &[Op]) -> Vec<String> {
    support::model::on_paused_clock(async {
        let start = ca_asg_provider::clock::now();
        let mut m = Model::new(pool_state).await;
        m.check().await;
        for op in ops {
            m.step(op).await;
            m.check().await;
        }
        // A drain our hook holds retries a failed run after 5 s, doubling: refused
        // Node writes in a row can put its next try tens of seconds off.
        support::model::settle_polling(SETTLE, Duration::from_millis(100), async || {
            m.check().await;
            m.unfinished()
        })
        .await;
        m.lifecycle.abort();
        m.w.engine.shutdown();
        support::model::transcript(&m.w.sim, &m.w.cloud, start)
    })
}

/// How long the drains may take to finish after the last step: a held drain's
/// retries after refused writes (5 s, 10 s, 20 s, 40 s) fit.
const SETTLE: Duration = Duration::from_secs(90);

/// Cases per run (`MODEL_CASES` overrides; see support::model).
const CASES: u32 = 300;

#[test]
fn pool_returns_and_reuse_between_any_two_steps_keep_every_promise() {
    support::model::run(
        "warm_pool_model",
        CASES,
        (
            prop_oneof![Just("Stopped"), Just("Running")],
            prop::collection::vec(op(), 1..12),
        ),
        |(state, ops)| run(state, &ops),
    );
}

/// A node scaled in twice into the pool and taken back twice, with a restart and
/// refused Node writes between: drained each time, handed back each time.
#[test]
fn twice_into_the_pool_and_back_with_a_restart_and_refused_writes() {
    run(
        "Stopped",
        &[
            Op::ScaleIn,
            Op::Wait(1200),
            Op::RefuseNodeWrites,
            Op::TakeBack,
            Op::Restart,
            Op::Wait(800),
            Op::Deploy(2),
            Op::ScaleIn,
            Op::Throttle,
            Op::TakeBack,
            Op::Wait(1000),
        ],
    );
}

/// Issue 59: an instance drained into the pool, reused, scaled in again, then ended
/// by the pool, with a restart between: each action of our hook completed, none left
/// to time out, and the pool's Nodes mapped to no group all along.
#[test]
fn a_reused_instance_the_pool_ends_after_a_restart_is_not_left_to_its_hook() {
    run(
        "Stopped",
        &[
            Op::ScaleIn,
            Op::Wait(1200),
            Op::TakeBack,
            Op::Wait(800),
            Op::ScaleIn,
            Op::Wait(1200),
            Op::Restart,
            Op::PoolEnds(0),
            Op::Wait(1400),
        ],
    );
}

/// Found by the model (seed 1795593553857478010, case 95): an instance taken back
/// from a running pool before any poll saw it rest there stayed cordoned in service
/// (the hand-back waited for a rest it had never seen).
#[test]
fn taken_back_from_a_running_pool_before_its_rest_was_seen() {
    run(
        "Running",
        &[
            Op::ScaleIn,
            Op::TakeBack,
            Op::ScaleIn,
            Op::ScaleIn,
            Op::TakeBack,
            Op::Wait(500),
            Op::TakeBack,
            Op::ScaleIn,
            Op::Wait(1200),
            Op::TakeBack,
            Op::TakeBack,
        ],
    );
}

/// Found by the model (seed 1795562455460356595, case 295): four heartbeats in a
/// row throttled (two Throttle ops) backed off past the hook's 3 s timeout, and the
/// held instance's hook ran out. A run of failures now retries before the timeout
/// runs out (holds::within_timeout).
#[test]
fn heartbeats_throttled_four_times_in_a_row_keep_the_hold() {
    run(
        "Stopped",
        &[
            Op::RefuseNodeWrites,
            Op::ScaleIn,
            Op::TakeBack,
            Op::ScaleIn,
            Op::Throttle,
            Op::Throttle,
        ],
    );
}
