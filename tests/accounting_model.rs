//! Model-based test of size accounting while drains run (proptest).
//!
//! Two replicas of the provider core over one in-memory AWS, CA talking to one of
//! them, random sequences of IncreaseSize, DecreaseTargetSize, DeleteNodes (real
//! nodes and placeholders; and one call per node, several at once, as CA sends them,
//! with the AWS calls they make throttled), drain completions and abandonments,
//! launch failures, Refresh, restarts and leader changes. After every step:
//! - the ASG never picked a victim itself (no SetDesiredCapacity below the
//!   instances it had to keep);
//! - CA's target is exactly what CA asked for (a decrease removes the unfulfilled
//!   part of what it asks, and is refused only when nothing is unfulfilled);
//! - AWS's desired capacity is CA's target plus the drains still running;
//! - once no drain runs, the instances that stay equal CA's target.
//!
//! The drain engine is modelled by what it promises the core: direct-mode drains are
//! recorded as Node marks (which survive restarts) before DeleteNodes returns, the
//! leader ends them with a decrement or abandons them, and every replica reads the
//! marks ([`Provider::sync_direct_drains`]). Lifecycle-mode removals terminate with
//! decrement at once and are held by the hook until completed. The real engine
//! against the in-memory API server keeps those promises in tests/scalein.rs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use async_trait::async_trait;
use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryGroup, MemoryTiming};
use ca_asg_provider::cloud::{
    AsgInstance, Cloud, LifecycleAction, LifecycleResult, LifecycleState,
};
use ca_asg_provider::provider::{
    DrainMarks, Group, NodeRef, Provider, ProviderError, Removal, ScaleIn,
};
use parking_lot::Mutex;
use proptest::prelude::*;

mod support;

const DIRECT: &str = "direct";
const HOOKED: &str = "hooked";
const HOOK: &str = "ca-asg-provider-drain";
const GROUPS: [&str; 2] = [DIRECT, HOOKED];
/// The AWS operations a DeleteNodes call makes, any of which AWS may throttle.
const THROTTLED: [&str; 3] = [
    "describe_groups",
    "terminate_instance",
    "set_desired_capacity",
];

/// The Nodes' drain marks: instance -> group. Durable across restarts.
type Marks = Arc<Mutex<BTreeMap<String, String>>>;

/// The engine's side of DeleteNodes, as the core sees it.
struct ModelScaleIn {
    cloud: MemoryCloud,
    marks: Marks,
}

#[async_trait]
impl ScaleIn for ModelScaleIn {
    async fn remove(
        &self,
        group: &Group,
        instance: &AsgInstance,
        _node: Option<&str>,
    ) -> Result<Removal, ProviderError> {
        if group.hooks.iter().any(|h| h.name == HOOK) {
            self.cloud.terminate_instance(&instance.id, true).await?;
            Ok(Removal::Decremented)
        } else {
            self.marks
                .lock()
                .insert(instance.id.clone(), group.asg.name.clone());
            Ok(Removal::Deferred)
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Increase(usize, i32),
    Decrease(usize, i32),
    /// Delete up to `n` running nodes, chosen by `pick`.
    Delete(usize, usize, u64),
    DeletePlaceholders(usize),
    /// Two DeleteNodes calls at once naming the same placeholder (a call CA gave up
    /// on and sent again while the first was still recorded): one slot is given up.
    DeletePlaceholderTwice(usize),
    /// CA's scale-down: up to `n` running nodes, one DeleteNodes call each, all at
    /// once (CA's `--max-scale-down-parallelism`), with the next `times` calls of an
    /// AWS operation throttled while they run.
    DeleteAtOnce {
        g: usize,
        n: usize,
        pick: u64,
        throttle: Option<(usize, u32)>,
    },
    /// The leader ends a pending drain (direct: terminate with decrement; hooked:
    /// complete the lifecycle action).
    Complete(u64),
    /// The leader abandons a pending direct drain: the node is uncordoned and stays.
    Abandon(u64),
    FailLaunches(usize, bool),
    Refresh,
    Restart(usize),
    LeaderChange,
    /// CA's connection moves to the other replica (its next loop starts with Refresh).
    CaSwitch,
}

fn op() -> impl Strategy<Value = Op> {
    let g = 0..GROUPS.len();
    prop_oneof![
        3 => (g.clone(), 1..4i32).prop_map(|(g, d)| Op::Increase(g, d)),
        2 => (g.clone(), 1..3i32).prop_map(|(g, d)| Op::Decrease(g, d)),
        4 => (g.clone(), 1..4usize, any::<u64>()).prop_map(|(g, n, p)| Op::Delete(g, n, p)),
        1 => g.clone().prop_map(Op::DeletePlaceholders),
        1 => g.clone().prop_map(Op::DeletePlaceholderTwice),
        4 => (
            g.clone(),
            1..6usize,
            any::<u64>(),
            prop::option::of((0..THROTTLED.len(), 1..3u32))
        )
            .prop_map(|(g, n, pick, throttle)| Op::DeleteAtOnce { g, n, pick, throttle }),
        4 => any::<u64>().prop_map(Op::Complete),
        1 => any::<u64>().prop_map(Op::Abandon),
        1 => (g, any::<bool>()).prop_map(|(g, on)| Op::FailLaunches(g, on)),
        2 => Just(Op::Refresh),
        1 => (0..2usize).prop_map(Op::Restart),
        1 => Just(Op::LeaderChange),
        1 => Just(Op::CaSwitch),
    ]
}

struct World {
    cloud: MemoryCloud,
    marks: Marks,
    /// Instances whose Node is gone (deleted after the instance ended).
    nodes_gone: BTreeSet<String>,
    replicas: [Arc<Provider>; 2],
    leader: usize,
    ca_on: usize,
    /// What CA asked for, per group.
    target: BTreeMap<String, i32>,
    /// Groups whose launches fail now (capacity stays unfulfilled).
    launches_fail: BTreeSet<String>,
}

impl World {
    async fn new() -> Self {
        let cloud = MemoryCloud::new(
            vec![
                MemoryGroup::new(DIRECT, 1, 12, 4, "m5.large"),
                MemoryGroup::new(HOOKED, 1, 12, 4, "m5.large").terminating_hook(HOOK, 3600),
            ],
            ca_asg_provider::sim::world::instant_timing(),
        );
        let marks: Marks = Arc::default();
        let a = replica(&cloud, &marks).await;
        let b = replica(&cloud, &marks).await;
        let mut w = World {
            cloud,
            marks,
            nodes_gone: BTreeSet::new(),
            replicas: [a, b],
            leader: 0,
            ca_on: 0,
            target: GROUPS.iter().map(|g| (g.to_string(), 4)).collect(),
            launches_fail: BTreeSet::new(),
        };
        w.sync();
        w
    }

    fn ca(&self) -> &Arc<Provider> {
        &self.replicas[self.ca_on]
    }

    /// The Node watch delivers the marks to every replica.
    fn sync(&mut self) {
        let marks = self.drain_marks();
        for r in &self.replicas {
            r.sync_direct_drains(marks.clone());
        }
    }

    fn drain_marks(&self) -> DrainMarks {
        let marked: BTreeSet<String> = self.marks.lock().keys().cloned().collect();
        let mut m = DrainMarks::default();
        for (_, i) in self.cloud.instances() {
            if self.nodes_gone.contains(&i.id) {
                continue;
            }
            if marked.contains(&i.id) {
                m.marked.insert(i.id);
            } else {
                m.unmarked.insert(i.id);
            }
        }
        m
    }

    /// Capacity AWS owes the group: desired less the drains and the instances that
    /// stay.
    fn owed(&self, g: &str) -> i32 {
        let marks = self.marks.lock().clone();
        let (mut draining, mut live) = (0, 0);
        for (ig, i) in self.cloud.instances() {
            if ig != g || i.state.is_terminating() {
                continue;
            }
            if marks.contains_key(&i.id) {
                draining += 1;
            } else {
                live += 1;
            }
        }
        (self.cloud.desired(g).unwrap() - draining - live).max(0)
    }

    /// Drains that still run: direct marks of instances in service, and hooked
    /// instances held in Terminating:Wait.
    fn pending(&self) -> Vec<(String, String)> {
        let marks = self.marks.lock().clone();
        let mut out = Vec::new();
        for (g, i) in self.cloud.instances() {
            let direct = marks.contains_key(&i.id) && !i.state.is_terminating();
            if direct || i.state == LifecycleState::TerminatingWait {
                out.push((g, i.id));
            }
        }
        out
    }

    async fn step(&mut self, op: &Op) {
        match op {
            Op::Increase(g, d) => {
                let g = GROUPS[*g];
                if self.ca().increase_size(g, *d).await.is_ok() {
                    *self.target.get_mut(g).unwrap() += d;
                }
            }
            Op::Decrease(g, d) => {
                let g = GROUPS[*g];
                // Only unfulfilled capacity goes, never below the ASG's min (1); CA
                // asking for more (its clean-up paths) gets the unfulfilled part.
                let removable = (*d).min(self.owed(g)).min(self.target[g] - 1).max(0);
                match self.ca().decrease_target_size(g, -d).await {
                    Ok(()) => {
                        assert!(
                            removable > 0,
                            "group {g}: decrease by {d} accepted with nothing unfulfilled"
                        );
                        *self.target.get_mut(g).unwrap() -= removable;
                    }
                    Err(ProviderError::FailedPrecondition(m)) => {
                        assert_eq!(
                            removable, 0,
                            "group {g}: decrease by {d} refused with {removable} unfulfilled: {m}"
                        );
                    }
                    Err(_) => {}
                }
            }
            Op::Delete(g, n, pick) => {
                let g = GROUPS[*g];
                let running = support::world::running(self.ca(), g);
                if running.is_empty() {
                    return;
                }
                let chosen: Vec<NodeRef> = support::world::pick(&running, *n, *pick)
                    .iter()
                    .map(|pid| support::world::ca_node(pid))
                    .collect();
                if self.ca().delete_nodes(g, &chosen).await.is_ok() {
                    *self.target.get_mut(g).unwrap() -= chosen.len() as i32;
                }
            }
            Op::DeleteAtOnce {
                g,
                n,
                pick,
                throttle,
            } => {
                let g = GROUPS[*g];
                let running = support::world::running(self.ca(), g);
                if running.is_empty() {
                    return;
                }
                let chosen = support::world::pick(&running, *n, *pick);
                if let Some((op, times)) = throttle {
                    self.cloud.throttle(THROTTLED[*op], *times);
                }
                let ca = self.ca().clone();
                let answers = futures::future::join_all(chosen.iter().map(|pid| {
                    let ca = ca.clone();
                    let node = support::world::ca_node(pid);
                    async move { ca.delete_nodes(g, &[node]).await }
                }))
                .await;
                self.cloud.heal();
                for (pid, answer) in chosen.iter().zip(answers) {
                    match answer {
                        Ok(()) => *self.target.get_mut(g).unwrap() -= 1,
                        // A failed call removed nothing: CA keeps the node.
                        Err(e) => {
                            let iid = pid.rsplit('/').next().unwrap();
                            assert!(
                                !self.marks.lock().contains_key(iid)
                                    && self.cloud.instances().iter().any(|(_, i)| i.id == iid
                                        && !i.state.is_terminating()),
                                "group {g}: the DeleteNodes call for {iid} failed ({e}), yet its removal went ahead"
                            );
                        }
                    }
                }
            }
            Op::DeletePlaceholders(g) => {
                let g = GROUPS[*g];
                let placeholders = support::world::placeholders(self.ca(), g);
                // Placeholders stand for capacity not launched yet; a placeholder
                // whose instance launched since CA's listing is gone already.
                let owed = self.owed(g);
                if !placeholders.is_empty()
                    && self.ca().delete_nodes(g, &placeholders).await.is_ok()
                {
                    *self.target.get_mut(g).unwrap() -= (placeholders.len() as i32).min(owed);
                }
            }
            Op::DeletePlaceholderTwice(g) => {
                let g = GROUPS[*g];
                let Some(first) = self
                    .ca()
                    .nodes(g)
                    .unwrap()
                    .into_iter()
                    .find(|v| v.id.contains("i-placeholder-"))
                else {
                    return;
                };
                let node = NodeRef {
                    name: first.id.clone(),
                    provider_id: first.id,
                };
                let owed = self.owed(g);
                let ca = self.ca().clone();
                let (a, b) = futures::join!(
                    ca.delete_nodes(g, std::slice::from_ref(&node)),
                    ca.delete_nodes(g, std::slice::from_ref(&node))
                );
                if a.is_ok() || b.is_ok() {
                    *self.target.get_mut(g).unwrap() -= owed.min(1);
                }
            }
            Op::Complete(pick) => {
                let pending = self.pending();
                if pending.is_empty() {
                    return;
                }
                let (g, id) = pending[(*pick as usize) % pending.len()].clone();
                let leader = self.replicas[self.leader].clone();
                if g == HOOKED {
                    let action = LifecycleAction {
                        group: g.clone(),
                        hook: HOOK.into(),
                        instance_id: id.clone(),
                        token: None,
                    };
                    self.cloud
                        .complete_lifecycle_action(&action, LifecycleResult::Continue)
                        .await
                        .unwrap();
                } else {
                    self.cloud.terminate_instance(&id, true).await.unwrap();
                    leader.deferred_terminated(&id);
                    // The ended instance's Node goes away, marks and all.
                    self.marks.lock().remove(&id);
                }
                self.nodes_gone.insert(id);
            }
            Op::Abandon(pick) => {
                let pending: Vec<(String, String)> = self
                    .pending()
                    .into_iter()
                    .filter(|(g, _)| g == DIRECT)
                    .collect();
                if pending.is_empty() {
                    return;
                }
                let (g, id) = pending[(*pick as usize) % pending.len()].clone();
                self.marks.lock().remove(&id);
                self.replicas[self.leader].deferred_cancelled(&id);
                // CA's deletion of the node failed; the node is back in its count.
                *self.target.get_mut(&g).unwrap() += 1;
            }
            Op::FailLaunches(g, on) => {
                let g = GROUPS[*g];
                self.cloud
                    .fail_launches(g, on.then_some("InsufficientInstanceCapacity"));
                if *on {
                    self.launches_fail.insert(g.to_string());
                } else {
                    self.launches_fail.remove(g);
                }
            }
            Op::Refresh => {
                for r in &self.replicas {
                    r.refresh_now().await.unwrap();
                }
            }
            Op::Restart(r) => {
                self.replicas[*r] = replica(&self.cloud, &self.marks).await;
            }
            Op::LeaderChange => self.leader = 1 - self.leader,
            Op::CaSwitch => {
                self.ca_on = 1 - self.ca_on;
                self.ca().refresh_now().await.unwrap();
            }
        }
        self.sync();
    }

    fn check(&self, history: &[Op]) {
        let victims = self.cloud.chosen_by_asg();
        assert!(
            victims.is_empty(),
            "the ASG ended instances of its own choosing: {victims:?}\nafter {history:#?}"
        );
        let pending = self.pending();
        for g in GROUPS {
            let want = self.target[g];
            assert!(
                want >= 1,
                "group {g}: CA's deletions took the target to {want}, below MinSize 1\nafter {history:#?}"
            );
            let got = self.ca().target_size(g).unwrap();
            assert_eq!(
                got, want,
                "group {g}: CA's target is {got}, CA asked for {want}\nafter {history:#?}"
            );
            let draining = pending
                .iter()
                .filter(|(pg, id)| pg == g && self.marks.lock().contains_key(id))
                .count() as i32;
            let desired = self.cloud.desired(g).unwrap();
            assert_eq!(
                desired,
                want + draining,
                "group {g}: AWS desired {desired} != CA's target {want} + {draining} direct drain(s)\nafter {history:#?}"
            );
            if pending.iter().all(|(pg, _)| pg != g) {
                let live = self
                    .cloud
                    .instances()
                    .iter()
                    .filter(|(ig, i)| ig == g && !i.state.is_terminating())
                    .count() as i32;
                // Capacity that failed to launch stays owed (CA sees placeholders).
                let ok = if self.launches_fail.contains(g) {
                    live <= want
                } else {
                    live == want
                };
                assert!(
                    ok,
                    "group {g}: no drain runs, yet {live} instances stay for a target of {want}\nafter {history:#?}"
                );
            }
        }
    }
}

async fn replica(cloud: &MemoryCloud, marks: &Marks) -> Arc<Provider> {
    let p = Provider::new(
        Arc::new(cloud.clone()),
        support::model::provider_settings(&GROUPS),
    );
    p.set_scale_in(Arc::new(ModelScaleIn {
        cloud: cloud.clone(),
        marks: marks.clone(),
    }));
    p.expect_drain_marks();
    p.refresh_now().await.unwrap();
    p
}

/// One case on a current-thread runtime whose clock is paused: time moves only when
/// every task waits (AWS's latency, the backoffs), so a case replays exactly whatever
/// the machine's load.
fn run(ops: &[Op]) {
    support::model::on_paused_clock(async {
        let mut w = World::new().await;
        support::model::play_judged_by_history(&mut w, ops, World::step, World::check).await;
    });
}

proptest! {
    #![proptest_config(support::model::proptest_cases(3000))]

    #[test]
    fn size_accounting_holds_under_any_sequence(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops);
    }
}

/// Two calls of one batch naming the same placeholder give up one slot, not two.
#[test]
fn a_placeholder_named_twice_in_one_batch_gives_up_one_slot() {
    run(&[
        Op::FailLaunches(0, true),
        Op::Increase(0, 2),
        Op::DeletePlaceholderTwice(0),
    ]);
}

/// The sequence the issue reproduced: desired 4, two direct drains pending, +1.
#[test]
fn an_increase_while_two_drains_run_ends_no_instance_of_the_asgs_choosing() {
    run(&[Op::Delete(0, 2, 0), Op::Increase(0, 1)]);
}

/// CA moves to the other replica, which changes the size, and back: the first replica
/// reads the other's write of a capacity it had itself replaced, and takes it as AWS's
/// truth after reading again (not as a stale answer to outvote with its own write).
#[test]
fn a_replica_ca_comes_back_to_takes_the_other_replicas_write() {
    run(&[
        Op::Delete(1, 2, 0),
        Op::CaSwitch,
        Op::Increase(1, 1),
        Op::CaSwitch,
    ]);
}

/// Size changes wait until the drain marks are known: with them unknown, CA's
/// target cannot be told from AWS's desired capacity.
#[tokio::test]
async fn size_changes_wait_for_the_drain_marks() {
    let cloud = MemoryCloud::new(
        vec![MemoryGroup::new(DIRECT, 1, 12, 4, "m5.large")],
        MemoryTiming::default(),
    );
    let marks: Marks = Arc::default();
    let p = replica(&cloud, &marks).await;
    let e = p.increase_size(DIRECT, 1).await.unwrap_err();
    assert!(
        matches!(e, ProviderError::Unavailable(ref m) if m.contains("drains recorded on Nodes")),
        "{e}"
    );
    assert_eq!(cloud.desired(DIRECT), Some(4));
    p.sync_direct_drains(DrainMarks::default());
    p.increase_size(DIRECT, 1).await.unwrap();
    assert_eq!(cloud.desired(DIRECT), Some(5));
}
