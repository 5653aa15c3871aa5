//! Model-based test of queue mode (proptest): random sequences of interruption
//! notices (spot, rebalance, retirement, state changes, lifecycle actions of
//! instances the ASG holds), duplicates, poison and restarts mid-drain, on the
//! in-memory API server and the memory cloud. After every step:
//!
//! - no instance ends that CA or the ASG did not choose: the service never
//!   terminates or resizes, and completes only lifecycle actions of held instances;
//! - a notice seen twice, or redelivered after a restart, drains once: no pod is
//!   evicted twice, none deleted twice, and every workload pod that left was evicted
//!   (none deleted around its budget);
//! - DaemonSet pods leave last: on every node, no DaemonSet pod started leaving
//!   while a workload pod was still there, unless the budget was spent;
//! - every message is deleted once handled: nothing is left but what is in flight.
//!
//! The drain loop runs beside the consumer, as `serve` runs it. Progress, after the
//! last step: every instance the ASG chose has ended (our hook's action completed),
//! every node a spot warning or retirement drained has lost its workload and
//! DaemonSet pods (unless a stopping notice stopped the drain), no drain in flight.
//!
//! Cases: [`CASES`] (2,000; 1,000 take 20 s on a 2-core machine, debug build, 50 s
//! before the paused clock; `MODEL_CASES=N`), 16 side by side, each on its own paused
//! clock (support::model; a case replays exactly, docs/models.md). A
//! failure prints its seed, case and replay line (`MODEL_SEED=S MODEL_CASE=I cargo
//! test --test interruption_model queue_mode`) and the smallest failing sequence.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::cloud::queue::MemoryQueue;
use ca_asg_provider::scalein;
use ca_asg_provider::scalein::decide::notice::RebalanceAction;
use ca_asg_provider::scalein::sources::queue::{Consumer, Handled};
use proptest::prelude::*;

mod support;
use support::acting::Processes;
use support::notices::{eventbridge, lifecycle};
use support::queue::{consumer, handle_all};
use support::world::*;

const NODES: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Spot(usize),
    Rebalance(usize),
    Retirement(usize),
    Stopping(usize),
    /// The ASG ends the instance itself (held by the hook), and says so on the queue.
    AsgEnds(usize),
    /// The last message again.
    Duplicate,
    Poison,
    /// The process dies; the new one resumes from the Nodes and gets the last
    /// message again.
    Restart,
    Wait,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..NODES).prop_map(Op::Spot),
        (0..NODES).prop_map(Op::Rebalance),
        (0..NODES).prop_map(Op::Retirement),
        (0..NODES).prop_map(Op::Stopping),
        (0..NODES).prop_map(Op::AsgEnds),
        Just(Op::Duplicate),
        Just(Op::Poison),
        Just(Op::Restart),
        Just(Op::Wait),
    ]
}

struct Model {
    w: World,
    q: Arc<MemoryQueue>,
    c: Arc<Consumer>,
    /// The drain loop (the scan for held instances, resumes), as `serve` runs it
    /// beside the queue consumer.
    loop_task: tokio::task::JoinHandle<()>,
    nodes: Vec<(String, String)>,
    last: Option<String>,
    /// Instances the ASG chose to end.
    held: BTreeSet<String>,
    /// Instances a drain notice (spot, retirement) was sent for, and those a
    /// stopping notice was sent for (their drain stops where it is).
    drained: BTreeSet<String>,
    stopped: BTreeSet<String>,
    /// Per node: its workload pod and its DaemonSet pod.
    pods: Vec<(String, String)>,
    /// Every process that ran, each its own identity: who acted, in a failure.
    procs: Processes,
    origin: ca_asg_provider::clock::Instant,
}

impl Model {
    async fn new() -> Model {
        let origin = ca_asg_provider::clock::now();
        let mut w = World::builder()
            .group(
                MemoryGroup::new("web", 0, 6, NODES as i32, "m5.large")
                    .terminating_hook("ca-asg-provider-drain", 300),
            )
            .ready_delay(Duration::from_millis(20))
            .in_process()
            .build()
            .await;
        let nodes = nodes_of(&w, "web");
        fluentd_and_an_app_on_each(&w, &nodes, 0.1, 0.3);
        pods_ready(&w, 2 * NODES).await;
        let on: Vec<&str> = nodes.iter().map(|(n, _)| n.as_str()).collect();
        let pods = support::invariants::app_and_fluentd_on_each(&w, &on);
        // The service is replica-1, named on the API server and in AWS's log.
        w.engine.shutdown();
        let mut procs = Processes::default();
        let (who, view) = procs.next(&w.cloud);
        (w.provider, w.engine, w.ca) =
            replica(&w.sim, &who, view, &w.groups, fast_settings()).await;
        let q = Arc::new(MemoryQueue::default());
        let c = consumer(&w, &q, RebalanceAction::Cordon);
        let loop_task =
            scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone());
        Model {
            w,
            q,
            c,
            loop_task,
            nodes,
            last: None,
            held: BTreeSet::new(),
            drained: BTreeSet::new(),
            stopped: BTreeSet::new(),
            pods,
            procs,
            origin,
        }
    }

    async fn send(&mut self, body: String) {
        self.q.send(&body);
        self.last = Some(body);
        self.drain_queue().await;
    }

    async fn drain_queue(&self) {
        for out in handle_all(&self.c, &self.q).await {
            assert!(!matches!(out, Handled::Retry(_)), "{out:?}");
        }
    }

    async fn step(&mut self, op: &Op) {
        let iid = |i: &usize| self.nodes[*i].1.clone();
        match op {
            Op::Spot(i) => {
                self.drained.insert(iid(i));
                let body = support::notices::spot(&iid(i));
                self.send(body).await
            }
            Op::Rebalance(i) => {
                let body = support::notices::rebalance(&iid(i));
                self.send(body).await
            }
            Op::Retirement(i) => {
                self.drained.insert(iid(i));
                let body = support::notices::retirement(&iid(i));
                self.send(body).await
            }
            Op::Stopping(i) => {
                self.stopped.insert(iid(i));
                let body = eventbridge(
                    "EC2 Instance State-change Notification",
                    "aws.ec2",
                    serde_json::json!({"instance-id": iid(i), "state": "stopping"}),
                );
                self.send(body).await
            }
            Op::AsgEnds(i) => {
                let id = iid(i);
                let still_in_service = self
                    .w
                    .cloud
                    .instances()
                    .iter()
                    .any(|(_, inst)| inst.id == id && !inst.state.is_terminating());
                if !still_in_service || self.held.len() + 1 >= NODES {
                    return;
                }
                // The ASG picks its own victim (the newest); that one is held.
                for victim in self.w.cloud.external_scale_in("web", 1).unwrap() {
                    self.held.insert(victim.clone());
                    let token = format!("tok-{victim}");
                    // Stamped when sent, as AWS does (a Duplicate replays it).
                    let body = lifecycle("web", &victim, "ca-asg-provider-drain", Some(&token));
                    self.send(body).await;
                }
            }
            Op::Duplicate => {
                if let Some(b) = self.last.clone() {
                    self.send(b).await
                }
            }
            Op::Poison => {
                self.q.send("{\"detail-type\": 5}");
                self.drain_queue().await;
            }
            Op::Restart => {
                // The process dies: nothing of it acts again (its loop may be on
                // another thread mid-turn; as a non-leader it starts nothing).
                let (_, dead) = tokio::sync::watch::channel(false);
                self.w.engine.leadership.follow(dead);
                self.loop_task.abort();
                self.w.engine.abort_all();
                self.w.engine.shutdown();
                let (who, view) = self.procs.next(&self.w.cloud);
                let (provider, engine, ca) =
                    replica(&self.w.sim, &who, view, &self.w.groups, fast_settings()).await;
                self.w.provider = provider;
                self.w.engine = engine;
                self.w.ca = ca;
                scalein::sources::hook_scan::resume(&self.w.engine, &self.w.provider).await;
                self.loop_task = scalein::sources::hook_scan::spawn_loop(
                    self.w.engine.clone(),
                    self.w.provider.clone(),
                );
                self.c = consumer(&self.w, &self.q, RebalanceAction::Cordon);
                if let Some(b) = self.last.clone() {
                    self.send(b).await;
                }
            }
            Op::Wait => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }

    fn check(&self) {
        support::invariants::assert_stories_hold(&self.w.engine);
        let calls = self.w.cloud.calls();
        assert_eq!(calls.get("terminate_instance"), None, "{calls:?}");
        assert_eq!(calls.get("set_desired_capacity"), None, "{calls:?}");
        let who = |subject: &str| self.procs.who_touched(&self.w.sim, subject, self.origin);
        for (a, _) in self.w.cloud.completed_actions() {
            assert!(
                self.held.contains(&a.instance_id),
                "completed the action of {}, which the ASG did not choose: {:#?}",
                a.instance_id,
                who(&a.instance_id)
            );
        }
        let audit = self.w.sim.audit();
        support::invariants::assert_workloads_evicted_once(&audit, who);
        assert_eq!(
            self.q.pending(),
            0,
            "a handled message was left in the queue"
        );
        // DaemonSet-last on every node (no budget in this model is ever spent).
        support::invariants::assert_daemonsets_last(&audit, &self.pods, who);
    }
}

impl Model {
    /// What has not finished that can: every instance the ASG chose has ended
    /// (our hook's action completed), every node a spot warning or retirement drained
    /// has no workload or DaemonSet pod of its own left (unless a stopping notice
    /// stopped its drain), and no drain is in flight. Empty: all finished.
    fn unfinished(&self) -> Vec<String> {
        let mut left = Vec::new();
        let instances = self.w.cloud.instances();
        let pods: Vec<(String, String)> = self
            .w
            .sim
            .list::<k8s_openapi::api::core::v1::Pod>()
            .iter()
            .map(|p| {
                (
                    p["metadata"]["name"].as_str().unwrap_or("").to_string(),
                    p["spec"]["nodeName"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        for (i, (node, iid)) in self.nodes.iter().enumerate() {
            if self.held.contains(iid) {
                if instances
                    .iter()
                    .any(|(_, x)| &x.id == iid && !x.state.is_terminating())
                {
                    left.push(format!("{iid} was chosen by the ASG and is not ending"));
                }
                if self
                    .w
                    .cloud
                    .pending_hooks(iid)
                    .iter()
                    .any(|h| h == "ca-asg-provider-drain")
                {
                    left.push(format!("our hook still holds {iid}"));
                }
            } else if self.drained.contains(iid) && !self.stopped.contains(iid) {
                let (app, ds) = &self.pods[i];
                for name in [app, ds] {
                    if pods.iter().any(|(n, on)| n == name && on == node) {
                        left.push(format!("{name} is still on {node}, drained by a notice"));
                    }
                }
            }
        }
        if self.w.engine.drains_at_once() > 0 {
            left.push(format!(
                "{} drain(s) in flight",
                self.w.engine.drains_at_once()
            ));
        }
        left
    }

    /// Lets the drains run after the last step and fails naming what did not finish
    /// within a generous bound; the invariants are checked on the way.
    async fn settle(&self) {
        support::model::settle(|| self.check(), || self.unfinished()).await;
    }
}

fn run(ops: &[Op]) -> Vec<String> {
    support::model::on_paused_clock(async {
        let start = ca_asg_provider::clock::now();
        let mut m = Model::new().await;
        support::model::play(&mut m, ops, Model::step, Model::check).await;
        m.settle().await;
        m.loop_task.abort();
        m.w.engine.shutdown();
        support::model::transcript(&m.w.sim, &m.w.cloud, start)
    })
}

/// Cases per run (`MODEL_CASES` overrides; see support::model for the seed, replay
/// and shrinking knobs).
const CASES: u32 = 2000;

/// Queue mode, `CASES` sequences of up to 9 ops (`MODEL_CASES`, `MODEL_SEED`,
/// `MODEL_CASE` to replay one: see support::model).
#[test]
fn queue_mode_keeps_its_invariants_under_any_sequence() {
    support::model::run(
        "interruption_model",
        CASES,
        prop::collection::vec(op(), 1..10),
        |ops| run(&ops),
    );
}

/// A case on the paused clock takes the same steps at the same times on every run
/// (issue 39): the transcript of a sequence with every kind of op, run three times,
/// is the same line for line.
#[test]
fn a_case_replays_exactly() {
    support::model::assert_replays_exactly(3, || {
        run(&[
            Op::Spot(0),
            Op::Duplicate,
            Op::Restart,
            Op::Stopping(2),
            Op::AsgEnds(0),
            Op::Spot(2),
            Op::Wait,
        ])
    });
}

/// The sequence of the issue: a spot warning, the same again, a restart mid-drain
/// with the message redelivered.
#[test]
fn a_spot_warning_twice_and_a_restart_drain_once() {
    run(&[Op::Spot(0), Op::Duplicate, Op::Restart, Op::Wait]);
}

/// The sequence that failed once on a new machine's CI (issue 39, 7: case 780 of
/// MODEL_SEED=1795644253034324200, "app-2 was evicted twice"): a stopping notice, the
/// ASG ending an instance through the hook, a spot warning for the stopped node and
/// that warning again. Replayed 30 times, six at once, on this tree it did not fail
/// (the likeliest cause, a joining reason re-sending an eviction still in flight, was
/// fixed by 3d7456d, though not proven to be this one); it runs on every test run.
#[test]
fn a_stopping_notice_an_asg_end_and_a_spot_warning_twice_evict_once() {
    run(&[Op::Stopping(2), Op::AsgEnds(0), Op::Spot(2), Op::Duplicate]);
}
