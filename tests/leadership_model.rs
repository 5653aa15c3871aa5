//! Model-based test (proptest) of leadership with the real Lease code: two replicas of
//! the service, each its own identity on the API server and its own view of AWS,
//! elect a leader through `scalein::engine::leader` (a 3 s Lease: renew deadline 2 s, a round
//! every 600 ms) while CA scales in through either of them (through our hook on
//! web, direct on batch) and the ASG ends web's instances itself. Between any two
//! of those steps: every Lease write answered late (up to 1.8 s, inside the renew
//! deadline; the effect lands at once), a replica cut off from the API server (not
//! from AWS), a replica's process dying without releasing the Lease and coming back
//! under the same name, a replica replaced by a new pod after a graceful shutdown
//! (which releases the Lease), time passing. Issue 39: leadership moving with a slow
//! renewal, judged from what the replicas did.
//!
//! After every step, each judged from the replicas' own action logs (their AWS
//! writes, logged as sent, and their API writes as the server got them), with the
//! replica that acted named in the failure:
//!
//! - a replica acts only while the Lease is its own: the last write to the Lease
//!   the API server accepted before the action was that replica's (answering CA's
//!   DeleteNodes, which every replica does, aside);
//! - no instance ends that neither CA nor the ASG chose;
//! - every instance our hook holds is heartbeated until completed, through every
//!   hand-over: no hook times out (a 10 s hook; a hand-over takes at most the
//!   Lease's 3 s plus a round);
//! - no pod is evicted twice; workload pods leave by eviction only (the pod whose
//!   budget allows nothing never leaves, and its app's Ready pods never fall below
//!   the budget); DaemonSet pods leave last on every node.
//!
//! Progress, once the network heals and Lease writes are answered at once: exactly
//! one replica leads, every instance CA or the ASG chose ends (but the guarded
//! one), no hook of ours holds an instance but the guarded one, and that one is
//! still held one hook timeout later.
//!
//! Cases: [`CASES`], each on its own paused clock (support::model; a case replays
//! exactly). `MODEL_SEED=S MODEL_CASE=I cargo test --test leadership_model` replays
//! one.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::clock::Instant;
use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::proto::cloud_provider_client::CloudProviderClient;
use ca_asg_provider::provider::Provider;
use ca_asg_provider::scalein::engine::leader::LeaseSettings;
use ca_asg_provider::scalein::{self, Engine};
use proptest::prelude::*;
use tokio::sync::watch;
use tonic::transport::Channel;

mod support;
use support::acting::{actions, assert_acts_while_holding, lease_writes, touching, Act, AwsActs};
use support::budget_floor::BudgetFloor;
use support::invariants::{
    apps_under_fluentd, assert_daemonsets_last, assert_workloads_evicted_once,
};
use support::model::web_and_batch;
use support::world::*;

const HOOK: &str = "ca-asg-provider-drain";
const HOOK_TIMEOUT_SECS: i32 = 10;
const LEASE: &str = "ca-asg-provider";
const LEASE_FOR: Duration = Duration::from_secs(3);
/// web-0..web-2 (our hook), batch-0, batch-1 (direct).
const NODES: usize = 5;
/// The pod on this web node has a budget that allows nothing: its drain holds our
/// hook, heartbeated, through every hand-over.
const GUARDED: usize = 1;
const REPLICAS: usize = 2;

#[derive(Debug, Clone)]
enum Op {
    /// CA's DeleteNodes for node `.0`, sent to replica `.1` (CA talks to whichever
    /// replica its Service picked, leader or not).
    CaScaleIn(usize, usize),
    /// The ASG ends its newest web instance itself, held by our hook.
    AsgEnds,
    /// Every Lease write is answered this many ms late from now on (0: at once).
    SlowRenewal(u64),
    /// Replica `.0` is cut off from the API server (skipped while the other is).
    Cut(usize),
    /// Every cut heals.
    Reconnect,
    /// Replica `.0`'s process dies (the Lease not released) and comes back under the
    /// same pod name.
    Crash(usize),
    /// Replica `.0` shuts down as on SIGTERM (releasing the Lease) and a new pod, a
    /// new name, takes its place.
    Rollout(usize),
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => ((0..NODES), (0..REPLICAS)).prop_map(|(n, r)| Op::CaScaleIn(n, r)),
        1 => Just(Op::AsgEnds),
        2 => prop_oneof![Just(0u64), Just(900), Just(1800)].prop_map(Op::SlowRenewal),
        3 => (0..REPLICAS).prop_map(Op::Cut),
        2 => Just(Op::Reconnect),
        1 => (0..REPLICAS).prop_map(Op::Crash),
        2 => (0..REPLICAS).prop_map(Op::Rollout),
        3 => prop_oneof![Just(300u64), Just(2_000), Just(5_000)].prop_map(Op::Wait),
    ]
}

fn settings() -> scalein::ScaleInSettings {
    scalein::ScaleInSettings {
        hook_heartbeat_timeout: Duration::from_secs(HOOK_TIMEOUT_SECS as u64),
        ..fast_settings()
    }
}

/// One replica: a process of the service with its Lease candidate.
struct Replica {
    who: String,
    engine: Arc<Engine>,
    ca: CloudProviderClient<Channel>,
    leads: watch::Receiver<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// False once its process died behind a partition, until the partition heals
    /// and it starts again.
    alive: bool,
}

impl Replica {
    async fn start(w: &World, aws: &AwsActs, who: String) -> Replica {
        let (provider, engine, ca): (Arc<Provider>, Arc<Engine>, _) = replica(
            &w.sim,
            &who,
            aws.cloud(&who, Arc::new(w.cloud.clone())),
            &w.groups,
            settings(),
        )
        .await;
        let election = engine.lead_as(LeaseSettings {
            name: LEASE.into(),
            namespace: "kube-system".into(),
            identity: who.clone(),
            duration: LEASE_FOR,
        });
        let leads = engine
            .leadership
            .receiver()
            .expect("the engine follows the election");
        let lp = scalein::sources::hook_scan::spawn_loop(engine.clone(), provider);
        Replica {
            who,
            engine,
            ca,
            leads,
            tasks: vec![election, lp],
            alive: true,
        }
    }

    /// The process dies where it is: nothing of it acts again, nothing released.
    fn kill(&self) {
        for t in &self.tasks {
            t.abort();
        }
        self.engine.shutdown();
    }

    /// SIGTERM, as `serve` handles it: step down (the Lease released), then exit.
    async fn terminate(&self) {
        self.engine.step_down().await;
        self.kill();
    }
}

struct Model {
    w: World,
    aws: AwsActs,
    replicas: Vec<Replica>,
    /// Every identity that ran, for the action log.
    ever: Vec<String>,
    /// How many pods each replica slot has had (a rollout's new name).
    generation: [usize; REPLICAS],
    cut: BTreeSet<String>,
    /// (replica, from, to) of every CA call: what a replica writes in answering CA
    /// is not the leader's work.
    ca_calls: Vec<(String, Instant, Instant)>,
    nodes: Vec<(String, String, &'static str)>,
    ca_named: BTreeSet<String>,
    ca_removed: BTreeSet<String>,
    asg_chose: BTreeSet<String>,
    /// Per node: its workload pod and its DaemonSet pod.
    pods: Vec<(String, String)>,
    guarded: BudgetFloor,
    start: Instant,
}

fn name(slot: usize, generation: usize) -> String {
    let base = ["replica-a", "replica-b"][slot];
    match generation {
        0 => base.to_string(),
        g => format!("{base}-{g}"),
    }
}

impl Model {
    async fn new() -> Model {
        let start = ca_asg_provider::clock::now();
        let web =
            MemoryGroup::new("web", 0, 6, 3, "m5.large").terminating_hook(HOOK, HOOK_TIMEOUT_SECS);
        let w = web_and_batch(web, settings()).build().await;
        // The world's own process takes no part: the replicas are the service.
        w.engine.shutdown();
        let nodes = nodes_of_groups(&w, &["web", "batch"]);
        assert_eq!(nodes.len(), NODES);
        let on: Vec<&str> = nodes.iter().map(|(n, _, _)| n.as_str()).collect();
        let pods = apps_under_fluentd(&w, &on, GUARDED).await;
        let guarded = BudgetFloor::watch(&w.sim, "guarded", 1);
        let aws = AwsActs::default();
        let mut replicas = Vec::new();
        for slot in 0..REPLICAS {
            replicas.push(Replica::start(&w, &aws, name(slot, 0)).await);
        }
        let ever = replicas.iter().map(|r| r.who.clone()).collect();
        let m = Model {
            w,
            aws,
            replicas,
            ever,
            generation: [0; REPLICAS],
            cut: BTreeSet::new(),
            ca_calls: Vec::new(),
            nodes,
            ca_named: BTreeSet::new(),
            ca_removed: BTreeSet::new(),
            asg_chose: BTreeSet::new(),
            pods,
            guarded,
            start,
        };
        support::eventually("a replica leads", 10, || m.leaders().len() == 1).await;
        m
    }

    fn leaders(&self) -> Vec<&str> {
        self.replicas
            .iter()
            .filter(|r| r.alive && *r.leads.borrow())
            .map(|r| r.who.as_str())
            .collect()
    }

    fn in_service(&self, id: &str) -> bool {
        in_service(&self.w.cloud, id)
    }

    async fn replace(&mut self, slot: usize, who: String) {
        self.replicas[slot] = Replica::start(&self.w, &self.aws, who.clone()).await;
        if !self.ever.contains(&who) {
            self.ever.push(who);
        }
    }

    async fn step(&mut self, op: &Op) {
        match *op {
            Op::CaScaleIn(i, r) => {
                let (node, iid, group) = self.nodes[i].clone();
                let down = !self.replicas[r].alive;
                if down || !self.in_service(&iid) || self.asg_chose.contains(&iid) {
                    return;
                }
                self.ca_named.insert(iid.clone());
                let who = self.replicas[r].who.clone();
                let from = ca_asg_provider::clock::now();
                let answer = self.replicas[r]
                    .ca
                    .node_group_delete_nodes(delete_request(group, &[(node, iid.clone())]))
                    .await;
                self.ca_calls
                    .push((who, from, ca_asg_provider::clock::now()));
                if answer.is_ok() {
                    self.ca_removed.insert(iid);
                }
            }
            Op::AsgEnds => {
                if support::model::live_in(&self.w, &self.nodes, "web") < 2 {
                    return;
                }
                for victim in self.w.cloud.external_scale_in("web", 1).unwrap() {
                    self.asg_chose.insert(victim);
                }
            }
            Op::SlowRenewal(ms) => {
                self.w
                    .sim
                    .slow_answers("update", "leases", Duration::from_millis(ms));
                self.w
                    .sim
                    .slow_answers("create", "leases", Duration::from_millis(ms));
            }
            Op::Cut(r) => {
                let who = self.replicas[r].who.clone();
                if self.cut.iter().any(|c| *c != who) {
                    return;
                }
                self.w.sim.cut(&who, true);
                self.cut.insert(who);
            }
            Op::Reconnect => self.reconnect().await,
            Op::Crash(r) => {
                if !self.replicas[r].alive {
                    return;
                }
                self.replicas[r].kill();
                let who = self.replicas[r].who.clone();
                if self.cut.contains(&who) {
                    // It comes back once it can reach the API server.
                    self.replicas[r].alive = false;
                } else {
                    self.replace(r, who).await;
                }
            }
            Op::Rollout(r) => {
                if self.replicas[r].alive {
                    self.replicas[r].terminate().await;
                }
                // The old pod's partition went with it.
                let old = self.replicas[r].who.clone();
                self.w.sim.cut(&old, false);
                self.cut.remove(&old);
                self.generation[r] += 1;
                self.replace(r, name(r, self.generation[r])).await;
            }
            Op::Wait(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
    }

    /// Every cut heals; a replica whose process died behind one starts again.
    async fn reconnect(&mut self) {
        for who in std::mem::take(&mut self.cut) {
            self.w.sim.cut(&who, false);
        }
        for r in 0..REPLICAS {
            if !self.replicas[r].alive {
                let who = self.replicas[r].who.clone();
                self.replace(r, who).await;
            }
        }
    }

    /// Whether `a` was part of answering a CA call to its replica: what the serve
    /// path writes (the Node's mark, the instance ended through the hook or the
    /// group's size), within the call.
    fn answering_ca(&self, a: &Act) -> bool {
        let serve_path = a.what.starts_with("patch nodes")
            || a.what.starts_with("TerminateInstanceInAutoScalingGroup")
            || a.what.starts_with("SetDesiredCapacity");
        serve_path
            && self
                .ca_calls
                .iter()
                .any(|(who, from, to)| *who == a.who && (*from..=*to).contains(&a.at))
    }

    fn check(&self) {
        for r in &self.replicas {
            support::invariants::assert_stories_hold(&r.engine);
        }
        let names: Vec<&str> = self.ever.iter().map(String::as_str).collect();
        let acts = actions(&self.w.sim, &self.aws, &names);
        let lease = lease_writes(&self.w.sim, LEASE);
        assert_acts_while_holding(&acts, &lease, self.start, |a| self.answering_ca(a));
        let who = |subject: &str| touching(&acts, subject, self.start);
        for (_, i) in self.w.cloud.instances() {
            if i.state.is_terminating() {
                assert!(
                    self.ca_named.contains(&i.id) || self.asg_chose.contains(&i.id),
                    "{} is ending, chosen by neither CA nor the ASG: {:#?}",
                    i.id,
                    who(&i.id)
                );
            }
        }
        assert_eq!(
            self.w.cloud.hook_timeouts(),
            Vec::<String>::new(),
            "a held instance was not heartbeated until its drain ended; heartbeats: {:?}",
            acts.iter()
                .filter(|a| a.what.starts_with("RecordLifecycleActionHeartbeat"))
                .map(|a| a.since(self.start))
                .collect::<Vec<_>>()
        );
        let audit = self.w.sim.audit();
        let left = assert_workloads_evicted_once(&audit, who);
        assert_daemonsets_last(&audit, &self.pods, who);
        // From outside: the guarded app never had fewer Ready pods than its budget
        // requires, whatever ended them (an eviction, an instance ended under them).
        self.guarded.assert_held();
        assert!(
            !left.contains(&format!("app-{GUARDED}")),
            "the pod whose budget allows nothing left"
        );
    }

    /// What has not finished that can, named; empty once everything did.
    fn unfinished(&self) -> Vec<String> {
        let mut left = Vec::new();
        let leaders = self.leaders();
        if leaders.len() != 1 {
            left.push(format!("{} replicas lead: {leaders:?}", leaders.len()));
        }
        for (i, (node, iid, _)) in self.nodes.iter().enumerate() {
            if i == GUARDED {
                continue;
            }
            let to_end = self.ca_removed.contains(iid) || self.asg_chose.contains(iid);
            if to_end && self.in_service(iid) {
                left.push(format!("{iid} ({node}) was to end and is in service"));
            }
            if self.w.cloud.pending_hooks(iid).iter().any(|h| h == HOOK) {
                left.push(format!("our hook still holds {iid} ({node})"));
            }
        }
        for r in &self.replicas {
            let guarded = usize::from(r.engine.is_draining(&self.nodes[GUARDED].1));
            if r.engine.drains_at_once() > guarded {
                left.push(format!(
                    "{} runs {} drain(s) but the guarded one",
                    r.who,
                    r.engine.drains_at_once() - guarded
                ));
            }
        }
        left
    }

    async fn settle(&mut self) {
        self.reconnect().await;
        self.step(&Op::SlowRenewal(0)).await;
        // A request sent into a partition is never answered: the service gives up on
        // it after ANSWER_WITHIN (60 s), and its drain goes on.
        let bound = scalein::kube::intercept::ANSWER_WITHIN + support::model::SETTLE_BOUND;
        support::model::settle_within(bound, || self.check(), || self.unfinished()).await;
        let past = Duration::from_secs(HOOK_TIMEOUT_SECS as u64 + 1);
        let guarded = &self.nodes[GUARDED].1;
        support::model::still_held_past_timeout(&self.w, guarded, HOOK, past, || self.check())
            .await;
    }
}

fn run(ops: &[Op]) -> Vec<String> {
    support::model::on_paused_clock(async {
        let mut m = Model::new().await;
        support::model::play(&mut m, ops, Model::step, Model::check).await;
        m.settle().await;
        for r in &m.replicas {
            r.kill();
        }
        support::model::transcript(&m.w.sim, &m.w.cloud, m.start)
    })
}

/// Cases per run (`MODEL_CASES` overrides; see support::model).
const CASES: u32 = 800;

/// Two replicas under the real Lease, `CASES` sequences of up to 12 ops.
#[test]
fn one_replica_acts_at_a_time_through_slow_renewals_cuts_crashes_and_rollouts() {
    support::model::run(
        "leadership_model",
        CASES,
        prop::collection::vec(op(), 1..13),
        |ops| run(&ops),
    );
}

/// A case replays exactly: the issue's slow renewal then a cut, a crash and a
/// rollout, three times, the same transcript.
#[test]
fn a_case_replays_exactly() {
    support::model::assert_replays_exactly(3, || run(&the_issues_slow_renewal()));
}

fn the_issues_slow_renewal() -> Vec<Op> {
    vec![
        Op::CaScaleIn(GUARDED, 1),
        Op::AsgEnds,
        Op::SlowRenewal(1800),
        Op::Cut(0),
        Op::Wait(5_000),
        Op::CaScaleIn(3, 0),
        Op::Reconnect,
        Op::Cut(1),
        Op::Wait(5_000),
        Op::Rollout(0),
        Op::Crash(1),
    ]
}

/// Issue 39, item 3, with drains running: a renewal that lands at once and is
/// answered late, the leader cut off; the other replica takes over, heartbeats the
/// held instances and finishes what can finish; never both acting.
#[test]
fn a_late_answered_renewal_then_a_cut_hands_over_once() {
    run(&the_issues_slow_renewal());
}

/// A graceful shutdown while Lease writes are answered late: the releasing replica
/// stops acting before its release can let the other take over.
#[test]
fn a_rollout_while_renewals_are_slow_never_leaves_two_actors() {
    run(&[
        Op::CaScaleIn(GUARDED, 0),
        Op::CaScaleIn(4, 1),
        Op::SlowRenewal(1800),
        Op::Rollout(0),
        Op::Rollout(1),
        Op::Wait(2_000),
    ]);
}

/// A drain begun by a leader cut off from the API server (CA's DeleteNodes reached
/// it; AWS's terminate went through, its Node mark did not): the requests it sent
/// into the partition are never answered. Once the network heals the drain goes on
/// within the service's bound on an answer (`ANSWER_WITHIN`); before that bound the
/// drain waited for ever and the hook held the instance, heartbeated, undrained.
#[test]
fn a_drain_begun_behind_a_partition_goes_on_once_it_heals() {
    run(&[Op::Cut(0), Op::CaScaleIn(0, 0)]);
}

/// A leader cut off mid-drain: its watches' first lists go unanswered until the
/// service's bound on an answer, and then retry after kube-runtime's jittered
/// backoff. That jitter is drawn per watch (`scalein::kube::watch_backoff`), so the case
/// replays exactly; before, it was kube-runtime's own random draw, and
/// `MODEL_REPLAY_CHECK=1` found this case taking another path on its second run.
#[test]
fn a_watch_retried_after_a_partition_replays_exactly() {
    support::model::assert_replays_exactly(3, || {
        run(&[Op::CaScaleIn(1, 0), Op::Cut(0), Op::CaScaleIn(0, 0)])
    });
}
