//! Model test of cluster-autoscaler's loop over the provider (issue 46, 4), with
//! proptest: random sequences of CA's calls, made with CA's concurrency (one
//! DeleteNodes per node, several at once), against the memory cloud, with faults
//! injected per AWS operation (throttled, refused, slow) and the template's inputs
//! changing underneath (a new default launch
//! template version, the EKS node group's labels and taints). After every step:
//! - CA's target is exactly what CA asked for (a failed call changed nothing);
//! - no instance ended that CA did not name, and the ASG never picked one itself;
//! - a DeleteNodes call that failed removed nothing;
//! - once AWS answers again and every input's lifetime has passed, the template of
//!   each group equals the one a fresh process builds from AWS as it is now (what a
//!   node launched now would register with).
//!
//! Every call carries CA's deadline (`grpc_timeout`, 5 s) as the gRPC layer passes
//! it (four fifths of it as the call's bound), and AWS may be slower than that (up to
//! 3 s per request). After every call: its answer came within the bound. A
//! DeleteNodes whose removals were still being recorded when its time ran out says
//! so; its instance ends behind the answer like any other, and the next loop sees it
//! as deleting.
//!
//! Time is the test's: the runtime's clock is paused and moves only when every task
//! waits (AWS's latency, the bounds, the backoffs), and the templates' lifetimes run
//! on a `ManualClock`. No outcome depends on the machine's load, and a case replays
//! exactly.
//!
//! Among the faults: reads answered from an older state (AWS's eventual consistency).
//! A size change computed from a DescribeAutoScalingGroups that predates the
//! provider's own last write used to undo it (`[Stale(2), DeleteAtOnce(plain, 1),
//! Increase(plain, 1)]` left CA's target at 4 where CA asked for 3); the provider's
//! writes now stand against such reads (`provider::written`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryGroup};
use ca_asg_provider::cloud::{EksNodegroup, Taint};
use ca_asg_provider::provider::templates::ManualClock;
use ca_asg_provider::provider::{Provider, ProviderError};
use k8s_pb::api::core::v1::Node;
use proptest::prelude::*;

mod support;
use prost::Message;

const PLAIN: &str = "plain";
const EKS: &str = "eks";
const GROUPS: [&str; 2] = [PLAIN, EKS];
/// Every AWS operation a CA call or a template build makes.
const OPERATIONS: [&str; 6] = [
    "describe_groups",
    "terminate_instance",
    "set_desired_capacity",
    "eks_nodegroup",
    "launch_template",
    "instance_types",
];
const TYPES: [&str; 3] = ["m5.large", "c5.xlarge", "m6g.large"];
/// CA's `grpc_timeout` default, sent with every call.
const DEADLINE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
enum Fault {
    Throttle(usize, u32),
    Refuse(usize, u32),
    Slow(u64),
    /// The next reads of the groups answer from the state of now.
    Stale(u32),
}

#[derive(Debug, Clone)]
enum Op {
    Increase(usize, i32),
    Decrease(usize, i32),
    /// Up to `n` running nodes, one DeleteNodes call each, all at once.
    /// With an IncreaseSize of the group by the last field sent meanwhile (0: none):
    /// CA's deletions run in goroutines while its next loop scales the group up.
    DeleteAtOnce(usize, usize, u64, i32),
    Refresh,
    Template(usize),
    Fault(Fault),
    /// A new launch template version becomes the group's `$Default`.
    NewDefault(usize, usize),
    /// UpdateNodegroupConfig: the EKS node group's labels and taints change.
    EksChange(u8),
    /// Faults lifted, every lifetime passed, CA's Refresh: templates must equal
    /// AWS's now.
    Settle,
}

fn op() -> impl Strategy<Value = Op> {
    let g = 0..GROUPS.len();
    let fault = prop_oneof![
        (0..OPERATIONS.len(), 1..3u32).prop_map(|(o, n)| Fault::Throttle(o, n)),
        (0..OPERATIONS.len(), 1..2u32).prop_map(|(o, n)| Fault::Refuse(o, n)),
        (1..3000u64).prop_map(Fault::Slow),
        (1..4u32).prop_map(Fault::Stale),
    ];
    prop_oneof![
        3 => (g.clone(), 1..3i32).prop_map(|(g, d)| Op::Increase(g, d)),
        2 => (g.clone(), 1..3i32).prop_map(|(g, d)| Op::Decrease(g, d)),
        4 => (g.clone(), 1..5usize, any::<u64>(), prop_oneof![2 => Just(0), 1 => 1..3i32])
            .prop_map(|(g, n, p, up)| Op::DeleteAtOnce(g, n, p, up)),
        2 => Just(Op::Refresh),
        2 => g.clone().prop_map(Op::Template),
        4 => fault.prop_map(Op::Fault),
        1 => (g, 0..TYPES.len()).prop_map(|(g, t)| Op::NewDefault(g, t)),
        1 => any::<u8>().prop_map(Op::EksChange),
        1 => Just(Op::Settle),
    ]
}

fn eks_nodegroup(v: u8) -> EksNodegroup {
    EksNodegroup {
        name: Some("ng-1".into()),
        labels: [("team".to_string(), format!("t{}", v % 3))].into(),
        taints: (v % 2 == 1)
            .then(|| Taint {
                key: "dedicated".into(),
                value: format!("t{}", v % 3),
                effect: "NoSchedule".into(),
            })
            .into_iter()
            .collect(),
        capacity_type: Some(if v % 4 < 2 { "ON_DEMAND" } else { "SPOT" }.into()),
        ..Default::default()
    }
}

fn cloud() -> MemoryCloud {
    let cloud = MemoryCloud::new(
        vec![
            MemoryGroup::new(PLAIN, 1, 12, 3, "m5.large").launch_template_version("$Default"),
            MemoryGroup::new(EKS, 0, 12, 2, "m5.large").eks_managed("prod", "ng-1", 300),
        ],
        ca_asg_provider::sim::world::instant_timing(),
    );
    cloud.set_eks_nodegroup("prod", "ng-1", Some(eks_nodegroup(0)));
    cloud
}

async fn provider(cloud: &MemoryCloud, clock: &ManualClock) -> Arc<Provider> {
    let p = Provider::new(
        Arc::new(cloud.clone()),
        support::model::provider_settings(&GROUPS),
    );
    p.set_template_clock(Arc::new(clock.clone()));
    p.refresh_now().await.unwrap();
    p
}

/// What CA reads of a template node: labels, taints, capacity.
#[derive(Debug, PartialEq)]
struct Seen {
    labels: BTreeMap<String, String>,
    taints: BTreeSet<(String, String, String)>,
    capacity: BTreeMap<String, String>,
}

fn seen(bytes: &[u8]) -> Seen {
    let node = Node::decode(bytes).expect("a Node");
    let spec = node.spec.unwrap_or_default();
    let status = node.status.unwrap_or_default();
    Seen {
        labels: node
            .metadata
            .unwrap_or_default()
            .labels
            .into_iter()
            // The hostname label names a made-up node of the template, and the zone
            // is one chosen among the group's zones by where its instances are now.
            .filter(|(k, _)| k != "kubernetes.io/hostname" && !k.ends_with("/zone"))
            .collect(),
        taints: support::templates::taint_triples(spec.taints).collect(),
        capacity: status
            .capacity
            .into_iter()
            .map(|(k, v)| (k, v.string.unwrap_or_default()))
            .collect(),
    }
}

struct World {
    cloud: MemoryCloud,
    clock: ManualClock,
    ca: Arc<Provider>,
    target: BTreeMap<String, i32>,
    /// Every instance CA named in a DeleteNodes that succeeded.
    named: BTreeSet<String>,
    /// Every instance ever seen, with its group.
    seen: BTreeMap<String, String>,
}

impl World {
    async fn new() -> Self {
        let cloud = cloud();
        let clock = ManualClock::new();
        let ca = provider(&cloud, &clock).await;
        let mut w = World {
            target: GROUPS
                .iter()
                .map(|g| (g.to_string(), cloud.desired(g).unwrap()))
                .collect(),
            cloud,
            clock,
            ca,
            named: BTreeSet::new(),
            seen: BTreeMap::new(),
        };
        w.note_instances();
        w
    }

    fn note_instances(&mut self) {
        for (g, i) in self.cloud.instances() {
            self.seen.entry(i.id).or_insert(g);
        }
    }

    /// Whether a size write the answer said was sent has landed: the target is `want`
    /// once AWS has answered it.
    async fn landed(&self, g: &str, want: i32) -> bool {
        tokio::time::sleep(Duration::from_secs(60)).await;
        self.ca.target_size(g).unwrap() == want
    }

    /// Whether AWS has the instance ending (or gone).
    fn going(&self, iid: &str) -> bool {
        self.cloud
            .instances()
            .iter()
            .find(|(_, i)| i.id == iid)
            .is_none_or(|(_, i)| i.state.is_terminating())
    }

    async fn step(&mut self, op: &Op) {
        match op {
            Op::Increase(g, d) => {
                let g = GROUPS[*g];
                let ca = self.ca.clone();
                let before = self.ca.target_size(g).unwrap();
                let r = in_time(
                    "IncreaseSize",
                    ca.increase_size_within(g, *d, Some(bound())),
                )
                .await;
                match r {
                    Ok(()) => *self.target.get_mut(g).unwrap() += d,
                    Err(e) if sent(&e) => {
                        if self.landed(g, before + d).await {
                            *self.target.get_mut(g).unwrap() += d;
                        }
                    }
                    Err(_) => {}
                }
            }
            Op::Decrease(g, d) => {
                let g = GROUPS[*g];
                let before = self.ca.target_size(g).unwrap();
                let ca = self.ca.clone();
                let r = in_time(
                    "DecreaseTargetSize",
                    ca.decrease_target_size_within(g, -d, Some(bound())),
                )
                .await;
                if let Err(e) = &r {
                    // Sent and not answered in time: it lands or not, and the
                    // provider's target says which once AWS has answered.
                    if sent(e) {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        let after = self.ca.target_size(g).unwrap();
                        *self.target.get_mut(g).unwrap() -= before - after;
                    }
                }
                if r.is_ok() {
                    // Only unfulfilled capacity goes: what the provider says it took.
                    let after = self.ca.target_size(g).unwrap();
                    assert!(
                        after < before && after >= before - d,
                        "{g}: {before} -> {after} for -{d}"
                    );
                    *self.target.get_mut(g).unwrap() -= before - after;
                }
            }
            Op::DeleteAtOnce(g, n, pick, up) => {
                let g = GROUPS[*g];
                let running = support::world::running(&self.ca, g);
                if running.is_empty() {
                    return;
                }
                let chosen = support::world::pick(&running, *n, *pick);
                let ca = self.ca.clone();
                let deletions = futures::future::join_all(chosen.iter().map(|pid| {
                    let ca = ca.clone();
                    let node = support::world::ca_node(pid);
                    async move {
                        in_time("DeleteNodes", ca.delete_nodes_within(g, &[node], bound())).await
                    }
                }));
                let increase = async {
                    if *up == 0 {
                        return None;
                    }
                    let asked = ca.increase_size_within(g, *up, Some(bound()));
                    Some(in_time("IncreaseSize", asked).await)
                };
                let (answers, increased) = tokio::join!(deletions, increase);
                // Removals still being recorded when their call's time ran out end
                // behind the answers: long enough for them to land.
                tokio::time::sleep(Duration::from_secs(60)).await;
                for (pid, answer) in chosen.iter().zip(answers) {
                    let iid = pid.rsplit('/').next().unwrap().to_string();
                    match answer {
                        Ok(()) => {
                            *self.target.get_mut(g).unwrap() -= 1;
                            self.named.insert(iid);
                        }
                        // The answer said the removal goes on: CA named the instance,
                        // and its next loop sees it deleting (or its call's failure
                        // left it, when the recording failed too).
                        Err(e) if e.to_string().contains("was not recorded within") => {
                            if self.going(&iid) {
                                *self.target.get_mut(g).unwrap() -= 1;
                                self.named.insert(iid);
                            }
                        }
                        Err(e) => assert!(
                            self.cloud
                                .instances()
                                .iter()
                                .any(|(_, i)| i.id == iid && !i.state.is_terminating()),
                            "{g}: DeleteNodes for {iid} failed ({e}), yet the instance is going"
                        ),
                    }
                }
                match increased {
                    Some(Ok(())) => *self.target.get_mut(g).unwrap() += up,
                    // Sent, answered late: the provider's target says whether it landed.
                    Some(Err(e)) if sent(&e) => {
                        let want = self.target[g] + up;
                        if self.ca.target_size(g).unwrap() == want {
                            *self.target.get_mut(g).unwrap() += up;
                        }
                    }
                    _ => {}
                }
            }
            Op::Refresh => {
                let _ = self.ca.refresh().await;
            }
            Op::Template(g) => {
                // May fail while AWS does; CA skips the group then (1.31.x, 1.32.3+).
                let ca = self.ca.clone();
                let _ = in_time(
                    "NodeGroupTemplateNodeInfo",
                    ca.template_node_within(GROUPS[*g], Some(bound())),
                )
                .await;
            }
            Op::Fault(f) => match f {
                Fault::Throttle(o, n) => self.cloud.throttle(OPERATIONS[*o], *n),
                Fault::Refuse(o, n) => self.cloud.refuse(OPERATIONS[*o], "AccessDenied", *n),
                Fault::Slow(ms) => self.cloud.slow(Duration::from_millis(*ms)),
                Fault::Stale(n) => self.cloud.stale_reads(*n),
            },
            Op::NewDefault(g, t) => self.cloud.new_launch_version(GROUPS[*g], TYPES[*t], None),
            Op::EksChange(v) => {
                self.cloud
                    .set_eks_nodegroup("prod", "ng-1", Some(eks_nodegroup(*v)))
            }
            Op::Settle => self.settle().await,
        }
        self.note_instances();
    }

    /// AWS answers again, every lifetime passes, CA refreshes and asks for each
    /// template: it must be what a fresh process builds from AWS now.
    async fn settle(&mut self) {
        self.cloud.heal();
        self.clock.advance(Duration::from_secs(25 * 3600));
        // CA's next Refresh once the provider's backoff after a failed read is over
        // (a second at most here): it reads AWS.
        self.ca
            .refresh_now()
            .await
            .expect("Refresh once AWS answers");
        self.ca.templates_prefetched().await;
        let fresh = provider(&self.cloud, &ManualClock::new()).await;
        for g in GROUPS {
            let ours = self
                .ca
                .template_node(g)
                .await
                .expect("template once AWS answers");
            let want = fresh
                .template_node(g)
                .await
                .expect("a fresh process's template");
            assert_eq!(seen(&ours), seen(&want), "{g}: the template did not heal");
        }
    }

    fn check(&self, history: &[Op]) {
        let victims = self.cloud.chosen_by_asg();
        assert!(
            victims.is_empty(),
            "the ASG ended instances of its own choosing: {victims:?}\nafter {history:#?}"
        );
        let now: BTreeMap<String, bool> = self
            .cloud
            .instances()
            .into_iter()
            .map(|(_, i)| (i.id.clone(), i.state.is_terminating()))
            .collect();
        for (iid, g) in &self.seen {
            let going = now.get(iid).is_none_or(|t| *t);
            assert!(
                !going || self.named.contains(iid),
                "group {g}: instance {iid} ended and CA never named it\nafter {history:#?}"
            );
        }
        for g in GROUPS {
            let want = self.target[g];
            let got = self.ca.target_size(g).unwrap();
            assert_eq!(
                got, want,
                "group {g}: CA's target is {got}, CA asked for {want}\nafter {history:#?}"
            );
        }
    }
}

/// An answer that says the size write was sent and may still land.
fn sent(e: &ProviderError) -> bool {
    e.to_string().contains("may still land")
}

/// The time a call may work: what the gRPC layer passes on of CA's deadline.
fn bound() -> Duration {
    ca_asg_provider::grpc::deadline::share(DEADLINE)
}

/// Runs a call as the gRPC layer does, and checks its answer came within the bound
/// (on the paused clock: exactly, whatever the machine's load).
async fn in_time<T>(
    call: &str,
    answer: impl std::future::Future<Output = Result<T, ProviderError>>,
) -> Result<T, ProviderError> {
    let t0 = tokio::time::Instant::now();
    let r = answer.await;
    let took = t0.elapsed();
    assert!(
        took <= bound(),
        "{call} answered after {took:?}, past its bound of {:?} (CA's deadline {DEADLINE:?}): {}",
        bound(),
        match &r {
            Ok(_) => "OK".to_string(),
            Err(e) => e.to_string(),
        }
    );
    r
}

fn run(ops: &[Op]) {
    // RUST_LOG=ca_asg_provider=debug shows what the provider did in a failing case.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    support::model::on_paused_clock(async {
        let mut w = World::new().await;
        support::model::play_judged_by_history(&mut w, ops, World::step, World::check).await;
        w.settle().await;
        w.check(ops);
    });
}

proptest! {
    #![proptest_config(support::model::proptest_cases(2000))]

    #[test]
    fn ca_loop_keeps_sizes_exact_and_templates_heal(ops in prop::collection::vec(op(), 1..30)) {
        run(&ops);
    }
}

/// The sequence of issue 46, 2: one throttled DescribeNodegroup, then the node
/// group's labels change; the template heals once AWS answers.
#[test]
fn a_throttled_describe_nodegroup_then_a_change_heals() {
    run(&[
        Op::Fault(Fault::Throttle(3, 2)),
        Op::Template(1),
        Op::EksChange(5),
        Op::Refresh,
        Op::Settle,
    ]);
}

/// A read that predates the provider's own scale-down (AWS's eventual consistency)
/// must not undo it: CA asked for 3 - 1 + 1 = 3.
#[test]
fn a_stale_read_after_a_scale_down_does_not_undo_it() {
    run(&[
        Op::Fault(Fault::Stale(2)),
        Op::DeleteAtOnce(0, 1, 0, 0),
        Op::Increase(0, 1),
    ]);
}

/// The same with the stale read under a DecreaseTargetSize after an increase.
#[test]
fn a_stale_read_after_a_scale_up_does_not_undo_it() {
    run(&[
        Op::Increase(0, 2),
        Op::Fault(Fault::Stale(3)),
        Op::Decrease(0, 1),
        Op::Increase(0, 1),
        Op::Refresh,
    ]);
}

/// A read older than two increases lists fewer instances than run: a decrease
/// computed from it (our write standing for its desired capacity) would take the
/// slot of a running instance and the ASG would pick a victim. Refused until AWS
/// answers with the write (found by the model once stale reads were among its faults).
#[test]
fn a_stale_read_never_lets_a_decrease_take_a_running_instances_slot() {
    run(&[
        Op::Increase(0, 1),
        Op::Fault(Fault::Stale(2)),
        Op::Increase(0, 1),
        Op::Decrease(0, 1),
    ]);
}

#[allow(dead_code)]
fn _error_is_send(e: ProviderError) -> impl Send {
    e
}

/// Found by the model once it sent an IncreaseSize beside CA's deletions, with AWS
/// slow and reads stale: a Refresh that ran past its wait (re-reading stale answers)
/// went on in the background and swapped in its snapshot, read before the increase's
/// write, over the group the DeleteNodes batch had read again after that write. CA's
/// target read 2 where AWS had 3. A group read again since a refresh began reading
/// now keeps that newer snapshot (`keep_groups_read_again_since`).
#[test]
fn an_increase_beside_deletions_after_stale_reads_keeps_the_target() {
    run(&[
        Op::Fault(Fault::Refuse(0, 1)),
        Op::Fault(Fault::Stale(3)),
        Op::Increase(0, 1),
        Op::Fault(Fault::Slow(1334)),
        Op::DeleteAtOnce(0, 1, 0, 0),
        Op::Refresh,
        Op::DeleteAtOnce(0, 1, 0, 1),
    ]);
}
