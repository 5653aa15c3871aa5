//! Model-based test (proptest) of `drain NODE` beside the service's leader (issue 69):
//! the command hands its drain to the replica that leads (the record on the Node, or,
//! `--terminate` on a group with our hook, the instance handed to the hook) and
//! follows it to its end. The moves, at random and at once: a command for any node,
//! drain only or `--terminate` (web through our hook, batch direct), while an earlier
//! command's record may still be on the Node; a rebalance recommendation cordoning a
//! node; the app's PodDisruptionBudget letting pods go or none; the leader's Events
//! refused (late, as in a storm) or let through; the leader replaced by another
//! replica (its Lease released); `undrain NODE` by a person; time passing past the
//! drains' deadlines (4 s, policy `abandon`: the leader gives drains up).
//!
//! After every step, for every command that ended, judged from what the Node's record,
//! its pods and AWS showed when it ended:
//!
//! - a command that says "done" ends a drain that finished: no workload pod is left on
//!   its node, and with `--terminate`, AWS no longer shows the instance in service;
//! - a command that fails never fails a drain its record says ended well (the latest
//!   drain drained, its instance handed on), and never says "done";
//! - an `undrain` that gave a node back left none of the service's marks on it.
//!
//! Progress: once the budget lets pods go, Events flow and a replica leads, every
//! command ends (none waits for ever).
//!
//! Cases: [`CASES`] (`MODEL_CASES=N`), each on its own paused clock (support::model; a
//! case replays exactly). `MODEL_SEED=S MODEL_CASE=I cargo test --test follow_model`
//! replays one.

use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::commands::drain::DrainArgs;
use ca_asg_provider::config::ConfigArgs;
use ca_asg_provider::scalein::decide::record::{DrainReason, DrainRecord, Why};
use ca_asg_provider::scalein::decide::undo::Window;
use ca_asg_provider::scalein::engine::leader::LeaseSettings;
use ca_asg_provider::scalein::stages::cordon;
use ca_asg_provider::scalein::{self, DeadlinePolicy, Engine};
use ca_asg_provider::sim::{fixtures, SimCluster};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use parking_lot::Mutex;
use proptest::prelude::*;

mod support;
use support::acting::Processes;
use support::model::web_and_batch;
use support::world::*;

const HOOK: &str = "ca-asg-provider-drain";
const HOOK_TIMEOUT_SECS: i32 = 10;
/// web-0, web-1 (our hook), batch-0, batch-1 (direct).
const NODES: usize = 4;
const CASES: u32 = 400;
/// The drains' workload deadline (policy `abandon`).
const DEADLINE: Duration = Duration::from_secs(4);
const LEASE_FOR: Duration = Duration::from_secs(3);

#[derive(Debug, Clone)]
enum Op {
    /// `drain NODE`, with `--terminate` when `.1`, unless a command for it runs.
    Command(usize, bool),
    /// A rebalance recommendation cordons the node (its reason recorded).
    Rebalance(usize),
    /// The app's budget lets pods go (`false`: none again).
    Budget(bool),
    /// The API server refuses the leader's Events (`true`) or takes them again.
    EventsRefused(bool),
    /// The leader shuts down (its Lease released) and another replica leads.
    LeaderChange,
    /// `undrain NODE`, by a person.
    Undrain(usize),
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => ((0..NODES), any::<bool>()).prop_map(|(n, t)| Op::Command(n, t)),
        2 => (0..NODES).prop_map(Op::Rebalance),
        1 => any::<bool>().prop_map(Op::Budget),
        2 => any::<bool>().prop_map(Op::EventsRefused),
        1 => Just(Op::LeaderChange),
        1 => (0..NODES).prop_map(Op::Undrain),
        4 => prop_oneof![Just(500u64), Just(2_000), Just(5_000), Just(10_000)].prop_map(Op::Wait),
    ]
}

fn settings() -> scalein::ScaleInSettings {
    scalein::ScaleInSettings {
        workload_deadline: DEADLINE,
        workload_deadline_policy: DeadlinePolicy::Abandon,
        hook_heartbeat_timeout: Duration::from_secs(HOOK_TIMEOUT_SECS as u64),
        ..fast_settings()
    }
}

/// What the command's config names: the region, the Lease the replicas elect by,
/// the two groups.
fn command_config() -> ca_asg_provider::config::Config {
    let mut cfg = ConfigArgs {
        region: Some("us-east-1".into()),
        ..Default::default()
    }
    .load()
    .unwrap();
    cfg.provider.selector = ca_asg_provider::world::named(&["web", "batch"]);
    cfg.scale_in = scalein::ScaleInSettings {
        leader_election: true,
        ..settings()
    };
    cfg
}

/// How a command ended, and what its node showed at that moment.
#[derive(Debug, Clone)]
struct Ended {
    said: Result<String, String>,
    /// Workload pods (not DaemonSet pods) still on the node.
    workloads: usize,
    /// AWS shows the instance in service.
    in_service: bool,
    record: Option<DrainRecord>,
    node_gone: bool,
}

struct Command {
    node: usize,
    terminate: bool,
    ended: Arc<Mutex<Option<Ended>>>,
    judged: bool,
    task: tokio::task::JoinHandle<()>,
}

struct Leader {
    engine: Arc<Engine>,
    scan: tokio::task::JoinHandle<()>,
}

struct Model {
    w: World,
    procs: Processes,
    leader: Leader,
    nodes: Vec<(String, String, &'static str)>,
    commands: Vec<Command>,
    budget: bool,
}

fn workloads_on(sim: &SimCluster, node: &str) -> usize {
    sim.list::<k8s_openapi::api::core::v1::Pod>()
        .iter()
        .filter(|p| p["spec"]["nodeName"] == node)
        .filter(|p| {
            !p["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|o| o.iter().any(|r| r["kind"] == "DaemonSet"))
        })
        .count()
}

fn record_on(sim: &SimCluster, node: &str) -> (Option<DrainRecord>, bool) {
    match sim.get::<Node>("", node) {
        Some(n) => {
            let annotations =
                serde_json::from_value(n["metadata"]["annotations"].clone()).unwrap_or_default();
            (
                DrainRecord::read(&annotations, ca_asg_provider::clock::utc_now()),
                false,
            )
        }
        None => (None, true),
    }
}

impl Model {
    async fn new() -> Self {
        let web =
            MemoryGroup::new("web", 0, 6, 2, "m5.large").terminating_hook(HOOK, HOOK_TIMEOUT_SECS);
        let w = web_and_batch(web, settings()).build().await;
        let nodes = nodes_of_groups(&w, &["web", "batch"]);
        let on: Vec<(String, String)> = nodes
            .iter()
            .map(|(n, i, _)| (n.clone(), i.clone()))
            .collect();
        fluentd_and_an_app_on_each(&w, &on, 0.2, 0.2);
        w.sim.create(&fixtures::pdb("shop", "app", 0)).unwrap();
        pods_ready(&w, 2 * NODES).await;
        let mut procs = Processes::default();
        let leader = Self::start_leader(&w, &mut procs).await;
        support::eventually("a replica leads", 10, || leader.engine.is_leader()).await;
        Model {
            w,
            procs,
            leader,
            nodes,
            commands: Vec::new(),
            budget: false,
        }
    }

    async fn start_leader(w: &World, procs: &mut Processes) -> Leader {
        let (who, view) = procs.next(&w.cloud);
        let (provider, engine, _ca) = replica(&w.sim, &who, view, &w.groups, settings()).await;
        engine.lead_as(LeaseSettings {
            name: "ca-asg-provider".into(),
            namespace: "kube-system".into(),
            identity: who,
            duration: LEASE_FOR,
        });
        let scan = scalein::sources::hook_scan::spawn_loop(engine.clone(), provider);
        Leader { engine, scan }
    }

    fn running(&self, node: usize) -> bool {
        self.commands
            .iter()
            .any(|c| c.node == node && c.ended.lock().is_none())
    }

    fn command(&mut self, i: usize, terminate: bool) {
        if self.running(i) {
            return;
        }
        let (node, _, _) = self.nodes[i].clone();
        let args = DrainArgs {
            node: node.clone(),
            dry_run: false,
            terminate,
            config: ConfigArgs::default(),
        };
        let cfg = command_config();
        let ended = Arc::new(Mutex::new(None));
        let out = ended.clone();
        let w = (self.w.sim.clone(), self.w.cloud.clone());
        let iid = self.nodes[i].1.clone();
        let task = tokio::spawn(async move {
            let (sim, cloud) = w;
            let lines = Arc::new(Mutex::new(Vec::<String>::new()));
            let sink = lines.clone();
            let said = ca_asg_provider::commands::drain::drain_in(
                sim.client(),
                Some(Arc::new(cloud.clone())),
                &cfg,
                &args,
                Arc::new(move |l: &str| sink.lock().push(l.to_string())),
            )
            .await
            // Its last word: the last line said, or the error.
            .map(|()| lines.lock().last().cloned().unwrap_or_default());
            // What the node shows the moment the command ends.
            let (record, node_gone) = record_on(&sim, &node);
            *out.lock() = Some(Ended {
                said: said.map_err(|e| format!("{e:#}")),
                workloads: workloads_on(&sim, &node),
                in_service: in_service(&cloud, &iid),
                record,
                node_gone,
            });
        });
        self.commands.push(Command {
            node: i,
            terminate,
            ended,
            judged: false,
            task,
        });
    }

    async fn step(&mut self, op: &Op) {
        match op {
            Op::Command(i, terminate) => {
                self.command(*i, *terminate);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Op::Rebalance(i) => {
                let node = &self.nodes[*i].0;
                let reason = DrainReason::new(Why::Rebalance, ca_asg_provider::clock::utc_now());
                let stage = self.leader.engine.stage();
                let group = self.nodes[*i].2;
                let keep = Some(self.leader.engine.limits_for(group, None));
                let _ = cordon::cordon(&stage, node, &[reason], group, keep).await;
            }
            Op::Budget(allows) => {
                if *allows && !self.budget {
                    self.w.sim.remove::<PodDisruptionBudget>("shop", "app-pdb");
                } else if !*allows && self.budget {
                    self.w.sim.create(&fixtures::pdb("shop", "app", 0)).unwrap();
                }
                self.budget = *allows;
            }
            Op::EventsRefused(refused) => {
                if *refused {
                    self.w.sim.deny(&[("create", "events")]);
                } else {
                    self.w.sim.deny(&[]);
                }
            }
            Op::LeaderChange => {
                self.leader.scan.abort();
                self.leader.engine.step_down().await;
                self.leader.engine.shutdown();
                self.leader = Self::start_leader(&self.w, &mut self.procs).await;
            }
            Op::Undrain(i) => {
                let node = &self.nodes[*i].0;
                let s = settings();
                let window = Window {
                    limits: s.limits(),
                    after_deadline: s.daemonset_deadline + s.volume_deadline,
                };
                let done = ca_asg_provider::commands::undrain::undrain(
                    &self.w.sim.client(),
                    node,
                    window,
                    false,
                    ca_asg_provider::clock::utc_now(),
                )
                .await;
                if let Ok(Some(ca_asg_provider::commands::undrain::Undone::GivenBack { .. })) = done
                {
                    let n = self.w.sim.get::<Node>("", node).expect("the node");
                    let node: Node = serde_json::from_value(n).unwrap();
                    assert!(
                        !cordon::has_marks(&node),
                        "undrain said it gave {} back, and the service's marks are still on it",
                        self.nodes[*i].0
                    );
                }
            }
            Op::Wait(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
        }
    }

    /// The invariants, for every command that ended since the last check.
    fn check(&mut self) {
        for c in &mut self.commands {
            if c.judged {
                continue;
            }
            let Some(e) = c.ended.lock().clone() else {
                continue;
            };
            c.judged = true;
            let (node, iid, group) = &self.nodes[c.node];
            let what = format!(
                "drain {node}{} ({group}, {iid})",
                if c.terminate { " --terminate" } else { "" }
            );
            match &e.said {
                Ok(line) => {
                    assert!(
                        line.starts_with("done"),
                        "{what} ended well saying {line:?}"
                    );
                    assert!(
                        e.node_gone || e.workloads == 0,
                        "{what} said {line:?} with {} workload pod(s) still on the node; record {:?}",
                        e.workloads,
                        e.record
                    );
                    assert!(
                        !c.terminate || e.node_gone || !e.in_service,
                        "{what} said {line:?} while AWS shows the instance in service; record {:?}",
                        e.record
                    );
                }
                Err(why) => {
                    assert!(!why.contains("done:"), "{what} failed saying {why:?}");
                    let ended_well = e.record.as_ref().is_some_and(|r| {
                        r.drain_began().is_none()
                            && r.end_of(r.drain).is_some_and(|end| end.how.drained())
                    });
                    assert!(
                        !(ended_well && e.workloads == 0),
                        "{what} failed ({why}) though its node's record says its latest drain ended well: {:?}",
                        e.record
                    );
                }
            }
        }
    }

    /// Commands that have not ended, named.
    fn unfinished(&self) -> Vec<String> {
        self.commands
            .iter()
            .filter(|c| c.ended.lock().is_none())
            .map(|c| {
                format!(
                    "drain {}{} has not ended",
                    self.nodes[c.node].0,
                    if c.terminate { " --terminate" } else { "" }
                )
            })
            .collect()
    }

    fn stop(&self) {
        for c in &self.commands {
            c.task.abort();
        }
        self.leader.scan.abort();
        self.leader.engine.shutdown();
        self.w.engine.shutdown();
    }
}

fn run(ops: &[Op]) -> Vec<String> {
    support::model::on_paused_clock(async {
        let start = ca_asg_provider::clock::Instant::now();
        let mut m = Model::new().await;
        m.check();
        for op in ops {
            m.step(op).await;
            m.check();
        }
        // Progress: the budget lets pods go, Events flow, a replica leads; every
        // command ends.
        m.step(&Op::Budget(true)).await;
        m.step(&Op::EventsRefused(false)).await;
        let bound = ca_asg_provider::clock::now() + Duration::from_secs(90);
        loop {
            let left = m.unfinished();
            m.check();
            if left.is_empty() {
                break;
            }
            assert!(
                ca_asg_provider::clock::now() < bound,
                "not ended 90 s after the last step: {left:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let t = support::model::transcript(&m.w.sim, &m.w.cloud, start);
        m.stop();
        t
    })
}

#[test]
fn every_followed_drain_ends_and_says_what_happened() {
    support::model::run(
        "follow_model",
        CASES,
        proptest::collection::vec(op(), 1..14),
        |ops| run(&ops),
    );
}

/// The three defects of issue 69 as one sequence: a rebalance cordon, then a direct
/// `--terminate` given up at its deadline (the follower waited for ever); a drain-only
/// command given up with the leader's Events refused (it said "done"); then
/// `--terminate` through our hook on a node whose earlier drain's record finished (it
/// said "done" at once).
#[test]
fn the_defects_of_issue_69_in_one_sequence() {
    run(&[
        Op::Rebalance(2),
        Op::Command(2, true),
        Op::Wait(5_000),
        Op::EventsRefused(true),
        Op::Command(0, false),
        Op::Wait(5_000),
        Op::Wait(5_000),
        Op::EventsRefused(false),
        Op::Command(0, true),
        Op::Wait(2_000),
    ]);
}
