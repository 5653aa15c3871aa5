//! Which replica acted, and when: the AWS writes each replica sends (through
//! [`Logged`], its view of the shared cloud) and the API writes that reached the
//! in-memory API server under its identity, merged into one action log, so a test of
//! leadership judges the replicas by what they did rather than by what they believed.

use ca_asg_provider::clock::Instant;
use std::sync::Arc;

use async_trait::async_trait;
use ca_asg_provider::cloud::memory::MemoryCloud;
use ca_asg_provider::cloud::*;
use ca_asg_provider::sim::SimCluster;
use parking_lot::Mutex;

/// One action: when it was sent, by whom, what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Act {
    pub at: Instant,
    pub who: String,
    pub what: String,
}

impl Act {
    /// "who at T: what", T since `origin`.
    pub fn since(&self, origin: Instant) -> String {
        format!(
            "{} at {:?}: {}",
            self.who,
            self.at.saturating_duration_since(origin),
            self.what
        )
    }
}

/// The AWS writes of every replica, in the order they were sent.
#[derive(Debug, Default, Clone)]
pub struct AwsActs(Arc<Mutex<Vec<Act>>>);

impl AwsActs {
    /// `inner` as the replica `who` sees it: every write it sends is logged first.
    pub fn cloud(&self, who: &str, inner: Arc<dyn Cloud>) -> Arc<dyn Cloud> {
        Arc::new(Logged {
            who: who.to_string(),
            inner,
            log: self.clone(),
        })
    }

    fn note(&self, who: &str, what: String) {
        self.0.lock().push(Act {
            at: Instant::now(),
            who: who.to_string(),
            what,
        });
    }

    pub fn all(&self) -> Vec<Act> {
        self.0.lock().clone()
    }
}

/// Every action of `replicas` (their identities on the API server, and the names
/// their AWS writes were logged under): AWS writes, and the API writes that reached
/// the server, but for the Lease (the election itself) and Events (what is said, not
/// done; a replica's queued Events may land after it stopped leading).
pub fn actions(sim: &SimCluster, aws: &AwsActs, replicas: &[&str]) -> Vec<Act> {
    let mut acts: Vec<Act> = sim
        .requests()
        .writes()
        .into_iter()
        .filter(|w| replicas.contains(&w.user.as_str()))
        .filter(|w| w.resource != "leases" && w.resource != "events")
        .map(|w| Act {
            at: w.at,
            who: w.user,
            what: format!("{} {} {}", w.verb, w.resource, w.name)
                .trim_end()
                .to_string(),
        })
        .collect();
    acts.extend(aws.all());
    acts.sort_by_key(|a| a.at);
    acts
}

/// Fails when the actions of two replicas interleave: once a replica acted after
/// another, the other never acts again (at most one hand-over per leadership change,
/// counted in `handovers`).
pub fn assert_one_actor_at_a_time(acts: &[Act], handovers: usize) {
    let mut turns: Vec<&Act> = Vec::new();
    for a in acts {
        if turns.last().is_none_or(|t| t.who != a.who) {
            turns.push(a);
        }
    }
    let origin = acts.first().map(|a| a.at);
    let show = |a: &Act| {
        format!(
            "{} at {:?}: {}",
            a.who,
            origin.map(|o| a.at.duration_since(o)),
            a.what
        )
    };
    assert!(
        turns.len() <= handovers + 1,
        "the replicas' actions interleave ({} turns for {handovers} hand-over(s)): {:#?}",
        turns.len(),
        turns.iter().map(|a| show(a)).collect::<Vec<_>>()
    );
}

/// Who held the Lease `lease` from when, as the API server saw it: every write to it
/// that was answered 2xx (a renewal, a takeover, a release), by whom, in order.
pub fn lease_writes(sim: &SimCluster, lease: &str) -> Vec<(Instant, String)> {
    let mut w: Vec<(Instant, String)> = sim
        .requests()
        .writes()
        .into_iter()
        .filter(|w| w.resource == "leases" && (w.name == lease || w.verb == "create"))
        .filter(|w| (200..300).contains(&w.status))
        .map(|w| (w.at, w.user))
        .collect();
    w.sort_by_key(|(at, _)| *at);
    w
}

/// Fails when a replica acted while the Lease was not its own: the last write to the
/// Lease at or before the action (`lease`, from [`lease_writes`]) was another
/// replica's, or there was none. Judged from what the replicas did, not what they
/// believed; the message names the replica, the action, its time since `origin` and
/// the Lease's holder then. `answering_ca` says which actions were part of
/// answering a CA call to that replica, which every replica does, leading or not.
pub fn assert_acts_while_holding(
    acts: &[Act],
    lease: &[(Instant, String)],
    origin: Instant,
    answering_ca: impl Fn(&Act) -> bool,
) {
    let since = |at: Instant| at.saturating_duration_since(origin);
    for a in acts.iter().filter(|a| !answering_ca(a)) {
        let holder = lease.iter().rev().find(|(at, _)| *at <= a.at);
        match holder {
            Some((_, who)) if *who == a.who => {}
            Some((at, who)) => panic!(
                "{} acted while {who} held the Lease (its write at {:?}): {} at {:?}; the Lease's writes: {:?}",
                a.who,
                since(*at),
                a.what,
                since(a.at),
                lease
                    .iter()
                    .map(|(at, who)| format!("{who} at {:?}", since(*at)))
                    .collect::<Vec<_>>()
            ),
            None => panic!(
                "{} acted before anyone held the Lease: {} at {:?}",
                a.who,
                a.what,
                since(a.at)
            ),
        }
    }
}

/// The replicas that sent an eviction of `pod` (namespace aside) and when, for an
/// invariant's message: who acted.
pub fn who_evicted(sim: &SimCluster, pod: &str, origin: Instant) -> Vec<String> {
    sim.requests()
        .writes()
        .into_iter()
        .filter(|w| w.resource == "pods/eviction" && w.name == pod)
        .map(|w| {
            format!(
                "{} at {:?} ({})",
                w.user,
                w.at.saturating_duration_since(origin),
                w.status
            )
        })
        .collect()
}

/// The processes a model starts one after another, each named (`replica-1`, then
/// `replica-2`, ...) and running as that identity on the API server with its view of
/// AWS logged under that name: so an invariant's failure can say which one acted.
#[derive(Debug, Default)]
pub struct Processes {
    pub aws: AwsActs,
    names: Vec<String>,
}

impl Processes {
    /// The next process's name, and its view of `cloud`.
    pub fn next(&mut self, cloud: &MemoryCloud) -> (String, Arc<dyn Cloud>) {
        let who = format!("replica-{}", self.names.len() + 1);
        self.names.push(who.clone());
        let view = self.aws.cloud(&who, Arc::new(cloud.clone()));
        (who, view)
    }

    /// What any process did to `subject` (an instance id, a pod or Node name), with
    /// who and when since `origin`: for an invariant's message.
    pub fn who_touched(&self, sim: &SimCluster, subject: &str, origin: Instant) -> Vec<String> {
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        touching(&actions(sim, &self.aws, &names), subject, origin)
    }
}

/// The acts of `acts` on `subject` (an instance id, a pod or Node name), each as
/// [`Act::since`] says it: for an invariant's message.
pub fn touching(acts: &[Act], subject: &str, origin: Instant) -> Vec<String> {
    acts.iter()
        .filter(|a| a.what.split(' ').any(|w| w == subject))
        .map(|a| a.since(origin))
        .collect()
}

struct Logged {
    who: String,
    inner: Arc<dyn Cloud>,
    log: AwsActs,
}

#[async_trait]
impl Cloud for Logged {
    async fn describe_groups(&self, s: &GroupSelector) -> CloudResult<Vec<AsgSnapshot>> {
        self.inner.describe_groups(s).await
    }
    async fn launch_history(&self, g: &str) -> CloudResult<LaunchHistory> {
        self.inner.launch_history(g).await
    }
    async fn locate_instances(&self, ids: &[String]) -> CloudResult<Vec<InstanceLocation>> {
        self.inner.locate_instances(ids).await
    }
    async fn ended_instances(&self, ids: &[String]) -> CloudResult<Vec<String>> {
        self.inner.ended_instances(ids).await
    }
    async fn warm_pool_instances(&self, g: &str) -> CloudResult<Vec<AsgInstance>> {
        self.inner.warm_pool_instances(g).await
    }
    async fn set_desired_capacity(&self, g: &str, d: i32) -> CloudResult<()> {
        self.log
            .note(&self.who, format!("SetDesiredCapacity {g} {d}"));
        self.inner.set_desired_capacity(g, d).await
    }
    async fn terminate_instance(&self, id: &str, dec: bool) -> CloudResult<()> {
        self.log.note(
            &self.who,
            format!("TerminateInstanceInAutoScalingGroup {id}"),
        );
        self.inner.terminate_instance(id, dec).await
    }
    async fn instance_types(&self, n: &[String]) -> CloudResult<Vec<InstanceTypeInfo>> {
        self.inner.instance_types(n).await
    }
    async fn launch_template(&self, t: &LaunchTemplateRef) -> CloudResult<LaunchData> {
        self.inner.launch_template(t).await
    }
    async fn launch_configuration(&self, n: &str) -> CloudResult<LaunchData> {
        self.inner.launch_configuration(n).await
    }
    async fn terminating_hooks(&self, g: &str) -> CloudResult<Vec<LifecycleHook>> {
        self.inner.terminating_hooks(g).await
    }
    async fn put_terminating_hook(&self, g: &str, h: &LifecycleHook) -> CloudResult<()> {
        self.log.note(&self.who, format!("PutLifecycleHook {g}"));
        self.inner.put_terminating_hook(g, h).await
    }
    async fn delete_terminating_hook(&self, g: &str, h: &str) -> CloudResult<()> {
        self.log.note(&self.who, format!("DeleteLifecycleHook {g}"));
        self.inner.delete_terminating_hook(g, h).await
    }
    async fn tag_group(&self, g: &str, k: &str, v: &str) -> CloudResult<()> {
        self.log.note(&self.who, format!("CreateOrUpdateTags {g}"));
        self.inner.tag_group(g, k, v).await
    }
    async fn untag_group(&self, g: &str, k: &str) -> CloudResult<()> {
        self.log.note(&self.who, format!("DeleteTags {g}"));
        self.inner.untag_group(g, k).await
    }
    async fn lifecycle_heartbeat(&self, a: &LifecycleAction) -> CloudResult<()> {
        self.log.note(
            &self.who,
            format!("RecordLifecycleActionHeartbeat {}", a.instance_id),
        );
        self.inner.lifecycle_heartbeat(a).await
    }
    async fn complete_lifecycle_action(
        &self,
        a: &LifecycleAction,
        r: LifecycleResult,
    ) -> CloudResult<()> {
        self.log.note(
            &self.who,
            format!("CompleteLifecycleAction {}", a.instance_id),
        );
        self.inner.complete_lifecycle_action(a, r).await
    }
    async fn eks_nodegroup(&self, c: &str, n: &str) -> CloudResult<EksNodegroup> {
        self.inner.eks_nodegroup(c, n).await
    }
    async fn termination_cause(&self, g: &str, id: &str) -> CloudResult<Option<String>> {
        self.inner.termination_cause(g, id).await
    }
    async fn instance_addresses(&self, id: &str) -> CloudResult<InstanceAddresses> {
        self.inner.instance_addresses(id).await
    }
    async fn target_groups(&self) -> CloudResult<Vec<TargetGroup>> {
        self.inner.target_groups().await
    }
    async fn target_health(&self, arn: &str) -> CloudResult<Vec<TargetHealth>> {
        self.inner.target_health(arn).await
    }
    async fn deregistration_delay(&self, arn: &str) -> CloudResult<Option<String>> {
        self.inner.deregistration_delay(arn).await
    }
    async fn group_target_groups(&self, g: &str) -> CloudResult<Vec<String>> {
        self.inner.group_target_groups(g).await
    }
    async fn deregister_targets(&self, arn: &str, t: &[TargetHealth]) -> CloudResult<()> {
        let ids: Vec<&str> = t.iter().map(|t| t.id.as_str()).collect();
        self.log.note(
            &self.who,
            format!(
                "DeregisterTargets {} {}",
                ids.join(" "),
                ca_asg_provider::scalein::decide::last_mile::group_name(arn)
            ),
        );
        self.inner.deregister_targets(arn, t).await
    }
    async fn instance_types_for_requirements(
        &self,
        r: &InstanceRequirements,
        image: Option<&str>,
    ) -> CloudResult<Vec<String>> {
        self.inner.instance_types_for_requirements(r, image).await
    }
}
