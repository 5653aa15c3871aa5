//! The last mile (issue 73): before the instance ends, wait until it is out of every
//! ELBv2 target group that has it as a target, bounded ([`crate::scalein::decide::last_mile`]
//! decides; this room reads AWS and says what it waits for). Called by
//! [`super::terminate::finish`] before its end call, while our hook's heartbeats go on
//! (they belong to the engine's book, not to this wait).
//!
//! Calls per drain, with `N` target groups in the region and the instance in `k` of
//! them: one DescribeInstances (its addresses, when a group has `ip` targets),
//! `ceil(N / 400)` DescribeTargetGroups and `N` DescribeTargetHealth to find the `k`
//! (shared by drains within one poll, see [`Sightings`]), `k`
//! DescribeTargetGroupAttributes (kept for ten minutes), then `k` DescribeTargetHealth
//! per poll (10 s) while it waits. With no target group in the region: one
//! DescribeTargetGroups (shared).
//!
//! Fails closed, bounded: a read that fails is read again next poll (the list, the
//! instance's addresses, a group's targets, its delay), and until it answers the
//! wait holds as for a group that cannot be read (its delay, or AWS's default 300 s,
//! plus the margin), with one Event naming what and the permission it needs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::Instant;
use crate::cloud::{Cloud, CloudError, TargetGroup, TargetHealth};
use crate::scalein::decide::last_mile::{
    self, parse_delay, Addresses, Bounds, GiveUp, Seen, Unread, Verdict, Watched,
};
use crate::scalein::holds::global_limit;
use crate::scalein::kube::events::Reason;
use crate::scalein::LoadBalancerWait;
use crate::scalein::Mode;
use crate::telemetry::metrics::{metrics, TargetGroupLabels};

/// What the wait needs of whoever runs the drain (the engine), and no more: since
/// when our hook's hold is heartbeated, the Node's Event, and the Node's note of the
/// wait. [`super::terminate::EndPort`] extends it.
#[async_trait::async_trait]
pub trait WaitPort: Send + Sync {
    /// An Event on the Node.
    async fn say(&self, node: &str, reason: Reason, text: String);
    /// Since when our hook holds the instance, and at which heartbeat timeout; `None`
    /// when it does not. The hold's start as the Node `node`'s drain record keeps it
    /// when that is earlier than this process's heartbeats (a restart, a new leader:
    /// [`last_mile::hold_began`]).
    fn held_since(&self, instance_id: &str, node: Option<&str>) -> Option<(Instant, Duration)>;
    /// Whether an instance of `group` is deregistered from the target groups
    /// attached to it before the wait (the group's override, else the cluster's
    /// `loadBalancers.deregister`).
    fn deregisters(&self, group: &str) -> bool;
    /// Writes on the Node that the drain waits for the load balancers (`None`: it no
    /// longer does), for `status`.
    async fn note_wait(&self, node: &str, waiting: Option<&last_mile::Waiting>);
}

/// A delay read is kept this long (operators change it rarely).
const DELAY_KEPT: Duration = Duration::from_secs(600);

/// At most this many target groups are kept (DescribeTargetGroups answers 400 a page;
/// an account allows 3000 a region by default).
const MAX_GROUPS: usize = 10_000;

/// What this process read of the region's target groups lately, shared by the drains
/// that end instances at about the same time: a read younger than the poll interval
/// is answered from here. Bounded: one list, one health answer and one delay per group.
#[derive(Default)]
pub struct Sightings {
    inner: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    list: Option<(Instant, Vec<TargetGroup>)>,
    health: HashMap<String, (Instant, Vec<TargetHealth>)>,
    delays: HashMap<String, (Instant, Option<Duration>)>,
}

impl Sightings {
    async fn groups(
        &self,
        cloud: &dyn Cloud,
        fresh: Duration,
    ) -> Result<Vec<TargetGroup>, CloudError> {
        if let Some((at, list)) = &self.inner.lock().list {
            if at.elapsed() < fresh {
                return Ok(list.clone());
            }
        }
        let mut list = cloud.target_groups().await?;
        list.truncate(MAX_GROUPS);
        let mut inner = self.inner.lock();
        let known: BTreeSet<&str> = list.iter().map(|g| g.arn.as_str()).collect();
        inner.health.retain(|arn, _| known.contains(arn.as_str()));
        inner.delays.retain(|arn, _| known.contains(arn.as_str()));
        inner.list = Some((Instant::now(), list.clone()));
        Ok(list)
    }

    async fn health(
        &self,
        cloud: &dyn Cloud,
        arn: &str,
        fresh: Duration,
    ) -> Result<Vec<TargetHealth>, CloudError> {
        if let Some((at, h)) = self.inner.lock().health.get(arn) {
            if at.elapsed() < fresh {
                return Ok(h.clone());
            }
        }
        let h = cloud.target_health(arn).await?;
        let mut inner = self.inner.lock();
        if inner.health.len() >= MAX_GROUPS {
            inner.health.retain(|_, (at, _)| at.elapsed() < fresh);
        }
        inner
            .health
            .insert(arn.to_string(), (Instant::now(), h.clone()));
        Ok(h)
    }

    /// Forgets what was read of one group's targets: the next read asks AWS (after
    /// the service changed them).
    pub(super) fn forget(&self, arn: &str) {
        self.inner.lock().health.remove(arn);
    }

    /// The group's delay, `None` when it could not be read or did not parse (the
    /// default then counts); the error, for the Event.
    async fn delay(&self, cloud: &dyn Cloud, arn: &str) -> (Option<Duration>, Option<CloudError>) {
        if let Some((at, d)) = self.inner.lock().delays.get(arn) {
            if at.elapsed() < DELAY_KEPT {
                return (*d, None);
            }
        }
        match cloud.deregistration_delay(arn).await {
            Ok(v) => {
                let d = match v.as_deref().map(parse_delay) {
                    Some(Ok(d)) => Some(d),
                    Some(Err(why)) => {
                        tracing::warn!(
                            target_group = arn,
                            "{why}; waiting AWS's default 300 s at most"
                        );
                        None
                    }
                    None => None,
                };
                let mut inner = self.inner.lock();
                if inner.delays.len() >= MAX_GROUPS {
                    inner.delays.clear();
                }
                inner.delays.insert(arn.to_string(), (Instant::now(), d));
                (d, None)
            }
            Err(e) => (None, Some(e)),
        }
    }
}

/// What the wait needs besides AWS and the engine's port.
#[derive(Clone)]
pub struct LastMile {
    pub settings: LoadBalancerWait,
    /// `serve --dry-run`: nothing ends, nothing is waited for.
    pub dry_run: bool,
    pub sightings: Arc<Sightings>,
}

/// The permission a call needs, for the Event of a refusal.
fn permission(operation: &str) -> String {
    format!("elasticloadbalancing:{operation}")
}

/// How a read that failed counts: a refusal names the permission, the rest passes.
fn unread(operation: &str, e: &CloudError) -> Unread {
    refusal(permission(operation), e)
}

/// How a call that failed counts: a refusal names `permission` (the IAM action the
/// call needs), the rest passes.
pub(super) fn refusal(permission: String, e: &CloudError) -> Unread {
    match e {
        CloudError::Rejected { code, .. } if is_denied(code) => Unread::Forbidden {
            permission,
            code: code.clone(),
        },
        CloudError::Credentials { .. } => Unread::Forbidden {
            permission,
            code: "NoCredentials".into(),
        },
        other => Unread::Failed {
            why: other.to_string(),
        },
    }
}

fn is_denied(code: &str) -> bool {
    matches!(
        code,
        "AccessDenied" | "AccessDeniedException" | "UnauthorizedOperation" | "UnauthorizedAccess"
    )
}

/// The name under which the list of target groups is waited on while it cannot be read.
const THE_LIST: &str = "(the region's target groups)";

/// Whether the wait runs for this end: on, not a dry run, and the instance ends (not
/// `drain NODE`).
pub fn waits(lm: &LastMile, mode: &Mode) -> bool {
    lm.settings.enabled && !lm.dry_run && !matches!(mode, Mode::DrainOnly)
}

/// Waits until the instance is out of every target group that has it, or the wait's
/// bound ([`last_mile::verdict`]). Never fails: the instance ends after it whatever
/// the load balancers say.
pub async fn wait_out(
    cloud: &dyn Cloud,
    lm: &LastMile,
    port: &dyn WaitPort,
    mode: &Mode,
    instance_id: &str,
    node: Option<&str>,
) {
    if !waits(lm, mode) {
        return;
    }
    let poll = lm.settings.poll;
    let started = Instant::now();
    // The first read: no target group in the region is the common answer, and ends
    // the wait before anything else is asked.
    let first = lm.sightings.groups(cloud, poll).await;
    if matches!(&first, Ok(list) if list.is_empty()) {
        return;
    }
    let _stage = metrics().stage("load-balancers");
    let latest = match mode {
        Mode::Lifecycle { .. } => port
            .held_since(instance_id, node)
            .map(|(since, timeout)| since + global_limit(timeout).saturating_sub(timeout)),
        _ => None,
    };
    let bounds = Bounds {
        margin: lm.settings.margin,
        latest,
    };
    let mut w = Wait {
        cloud,
        lm,
        port,
        instance_id,
        node,
        addresses: None,
        watched: BTreeMap::new(),
        said_unread: BTreeSet::new(),
        delay_unread: BTreeSet::new(),
        listed: false,
    };
    w.look(first, started).await;
    let mut announced = false;
    loop {
        let now = Instant::now();
        let groups: Vec<Watched> = w.watched.values().map(|(_, g)| g.clone()).collect();
        match last_mile::verdict(&groups, bounds, now) {
            Verdict::Done => {
                w.observe_all(now, "left");
                if let (true, Some(n)) = (announced, node) {
                    port.note_wait(n, None).await;
                }
                if announced {
                    tracing::info!(instance = instance_id, waited = ?now.duration_since(started), "the instance is out of every target group that had it");
                }
                return;
            }
            Verdict::GiveUp(why) => {
                w.give_up(&why, now).await;
                if let (true, Some(n)) = (announced, node) {
                    port.note_wait(n, None).await;
                }
                return;
            }
            Verdict::Wait {
                groups,
                waited,
                at_most,
            } => {
                let line = last_mile::said(groups, waited, at_most);
                tracing::info!(instance = instance_id, "{line}");
                if !announced {
                    announced = true;
                    if let Some(n) = node {
                        let since = crate::clock::utc_now()
                            - chrono::Duration::from_std(waited).unwrap_or_default();
                        let note = last_mile::Waiting {
                            groups,
                            since,
                            at_most_seconds: at_most.as_secs(),
                        };
                        port.note_wait(n, Some(&note)).await;
                    }
                    let names: Vec<&str> = w
                        .watched
                        .values()
                        .filter(|(_, g)| g.still_in())
                        .map(|(_, g)| g.name.as_str())
                        .collect();
                    w.say(
                        Reason::WaitingForLoadBalancers,
                        format!("{line} ({}) before the instance ends", names.join(", ")),
                    )
                    .await;
                }
            }
        }
        tokio::time::sleep(poll).await;
        w.read_delays_again().await;
        let list = if w.listed {
            None
        } else {
            Some(lm.sightings.groups(cloud, poll).await)
        };
        match list {
            Some(list) => w.look(list, Instant::now()).await,
            None => w.again().await,
        }
    }
}

/// The name under which the wait holds while the instance's own addresses cannot be
/// read: without them no `ip` target can be told to be the instance's, so the wait
/// fails closed (bounded as an unread group) and reads them again each poll.
const THE_ADDRESSES: &str = "(the instance's addresses)";

/// One wait's state: the groups watched (by ARN: the group and when it was read),
/// the unreadable ones said once.
struct Wait<'a> {
    cloud: &'a dyn Cloud,
    lm: &'a LastMile,
    port: &'a dyn WaitPort,
    instance_id: &'a str,
    node: Option<&'a str>,
    /// The instance's addresses; `None` until DescribeInstances answered (asked
    /// only when a group has `ip` targets).
    addresses: Option<Addresses>,
    watched: BTreeMap<String, (TargetGroup, Watched)>,
    said_unread: BTreeSet<String>,
    /// Groups whose deregistration delay could not be read yet: read again each
    /// poll (a throttled read must not cost the default 300 s).
    delay_unread: BTreeSet<String>,
    /// The region's target groups were listed and every target of the instance
    /// could be told (its addresses read where a group has `ip` targets): once per
    /// wait; until then each poll lists them again.
    listed: bool,
}

impl Wait<'_> {
    /// The instance's addresses (DescribeInstances), when a group has `ip` targets.
    /// Unread, the wait holds on [`THE_ADDRESSES`] and the next poll looks at every
    /// group again, these first.
    async fn read_addresses(&mut self, now: Instant) {
        match self.cloud.instance_addresses(self.instance_id).await {
            Ok(a) => {
                self.addresses = Some(Addresses::parse(&a.addresses, &a.prefixes));
                self.watched.remove(THE_ADDRESSES);
            }
            Err(e) => {
                let why = refusal("ec2:DescribeInstances".into(), &e);
                self.hold_unread(THE_ADDRESSES, why, now).await;
            }
        }
    }

    /// What cannot be read (the list, the addresses: [`is_pseudo`]) is waited on as
    /// a group that cannot be read, from when it first could not be, said once.
    async fn hold_unread(&mut self, key: &str, why: Unread, now: Instant) {
        self.unreadable(key, &why).await;
        let since = self.watched.get(key).map(|(_, w)| w.since).unwrap_or(now);
        let pseudo = TargetGroup {
            arn: String::new(),
            name: key.into(),
            target_type: String::new(),
        };
        let w = Watched {
            name: key.into(),
            delay: None,
            since,
            seen: Seen::Unread(why),
        };
        self.watched.insert(key.to_string(), (pseudo, w));
    }

    /// The delays that could not be read, read again.
    async fn read_delays_again(&mut self) {
        let arns: Vec<String> = self.delay_unread.iter().cloned().collect();
        for arn in arns {
            let (delay, failed) = self.lm.sightings.delay(self.cloud, &arn).await;
            if failed.is_none() {
                self.delay_unread.remove(&arn);
                if let Some((_, w)) = self.watched.get_mut(&arn) {
                    w.delay = delay;
                }
            }
        }
    }

    /// The first look (and again while the list cannot be read): every group's
    /// targets, keeping those that have the instance or cannot be read.
    async fn look(&mut self, list: Result<Vec<TargetGroup>, CloudError>, now: Instant) {
        let list = match list {
            Ok(l) => l,
            Err(e) => {
                let why = unread("DescribeTargetGroups", &e);
                self.hold_unread(THE_LIST, why, now).await;
                return;
            }
        };
        self.watched.remove(THE_LIST);
        // The instance's addresses matter only where a group has `ip` targets.
        let has_ip = list.iter().any(|g| g.target_type == "ip");
        if has_ip && self.addresses.is_none() {
            self.read_addresses(now).await;
        }
        if !has_ip {
            self.watched.remove(THE_ADDRESSES);
        }
        // Listed for good once every target of the instance could be told.
        self.listed = !has_ip || self.addresses.is_some();
        for g in list {
            if !matches!(g.target_type.as_str(), "instance" | "ip") {
                continue;
            }
            let seen = self.read(&g).await;
            let has = match &seen {
                Seen::Read(states) => !states.is_empty(),
                Seen::Unread(_) => true,
            };
            if let Some((_, w)) = self.watched.get_mut(&g.arn) {
                // Looked at again (the addresses came): its wait keeps its start.
                w.seen = seen;
            } else if has {
                self.watch(g, seen, now).await;
            }
        }
    }

    /// A poll: the groups still in read again.
    async fn again(&mut self) {
        let arns: Vec<String> = self
            .watched
            .iter()
            .filter(|(arn, (_, w))| w.still_in() && !is_pseudo(arn))
            .map(|(arn, _)| arn.clone())
            .collect();
        for arn in arns {
            let Some(g) = self.watched.get(&arn).map(|(g, _)| g.clone()) else {
                continue;
            };
            let seen = self.read(&g).await;
            if let Some((_, w)) = self.watched.get_mut(&arn) {
                w.seen = seen;
            }
        }
    }

    async fn read(&mut self, g: &TargetGroup) -> Seen {
        let lm = self.lm;
        match lm
            .sightings
            .health(self.cloud, &g.arn, lm.settings.poll)
            .await
        {
            Ok(targets) => Seen::Read(last_mile::states_of(
                &g.target_type,
                &targets,
                self.instance_id,
                self.addresses.as_ref().unwrap_or(&Addresses::default()),
            )),
            // Deleted meanwhile: it sends nothing any more.
            Err(CloudError::NotFound { .. }) => Seen::Read(Vec::new()),
            Err(e) => {
                let why = unread("DescribeTargetHealth", &e);
                self.unreadable(&g.name, &why).await;
                Seen::Unread(why)
            }
        }
    }

    async fn watch(&mut self, g: TargetGroup, seen: Seen, now: Instant) {
        let (delay, failed) = self.lm.sightings.delay(self.cloud, &g.arn).await;
        if let Some(e) = failed {
            let why = unread("DescribeTargetGroupAttributes", &e);
            self.unreadable(&g.name, &why).await;
            self.delay_unread.insert(g.arn.clone());
        }
        let w = Watched {
            name: g.name.clone(),
            delay,
            since: now,
            seen,
        };
        self.watched.insert(g.arn.clone(), (g, w));
    }

    /// One Event per group and missing permission (or throttling), the first time.
    async fn unreadable(&mut self, group: &str, why: &Unread) {
        let what = if is_pseudo(group) {
            group.trim_matches(['(', ')']).to_string()
        } else {
            format!("target group {group}")
        };
        let (key, text) = match why {
            Unread::Forbidden { permission, code } => (
                format!("{group} {permission}"),
                format!(
                    "cannot read {what}: {code}, the service's role lacks {permission}; the instance waits at most the group's deregistration delay plus margin, then ends"
                ),
            ),
            Unread::Failed { why } => (
                format!("{group} failed"),
                format!(
                    "cannot read {what} now ({why}); the instance waits at most the group's deregistration delay plus margin, then ends"
                ),
            ),
        };
        if self.said_unread.insert(key) {
            tracing::warn!(instance = self.instance_id, "{text}");
            self.say(Reason::LoadBalancerUnreadable, text).await;
        }
    }

    fn observe_all(&self, now: Instant, outcome: &'static str) {
        for (_, w) in self.watched.values() {
            observe(&w.name, outcome, now.saturating_duration_since(w.since));
        }
    }

    async fn give_up(&self, why: &[GiveUp], now: Instant) {
        let mut given: BTreeMap<&str, &'static str> = BTreeMap::new();
        for g in why {
            match g {
                GiveUp::Bound { group, .. } => {
                    given.insert(group, "bound");
                }
                GiveUp::Unreadable { group, .. } => {
                    given.insert(group, "unreadable");
                }
                GiveUp::Hook { groups } => {
                    for g in groups {
                        given.insert(g, "hook");
                    }
                }
            }
        }
        for (_, w) in self.watched.values() {
            let outcome = given.get(w.name.as_str()).copied().unwrap_or("left");
            observe(&w.name, outcome, now.saturating_duration_since(w.since));
        }
        let text = format!(
            "the instance ends still in a load balancer: {}",
            why.iter().map(GiveUp::said).collect::<Vec<_>>().join("; ")
        );
        tracing::warn!(instance = self.instance_id, "{text}");
        self.say(Reason::LoadBalancerWaitOver, text).await;
    }

    async fn say(&self, reason: Reason, text: String) {
        if let Some(n) = self.node {
            self.port.say(n, reason, text).await;
        }
    }
}

/// Whether a key of the watched groups is what the wait holds on while the list
/// or the addresses cannot be read, not a target group.
fn is_pseudo(key: &str) -> bool {
    key == THE_LIST || key == THE_ADDRESSES
}

fn observe(group: &str, outcome: &'static str, took: Duration) {
    metrics()
        .load_balancer_wait
        .get_or_create(&TargetGroupLabels {
            target_group: group.to_string(),
            outcome,
        })
        .observe(took.as_secs_f64());
}
