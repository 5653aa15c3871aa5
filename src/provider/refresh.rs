//! Refresh: re-read the managed ASGs (batched, paginated, at most once per interval),
//! keep serving the last good state when AWS fails, and look up unknown instances in
//! the background so a node that just joined maps to its group by CA's next loop.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;

use backon::{ExponentialBuilder, Retryable};
use futures::stream::{self, StreamExt};
use parking_lot::Mutex;

use super::registry::{effective_bounds, Group, Registry};
use super::{now, Provider, ProviderError};
use crate::cloud::{AsgSnapshot, LifecycleHook, LifecycleState};
use crate::telemetry::metrics;

/// How many launch-failure reads run at once during a refresh.
const FAILURE_READ_CONCURRENCY: usize = 8;
/// DescribeAutoScalingInstances takes at most 50 ids.
const LOOKUP_BATCH: usize = 50;
/// An id that was not found is not asked about again for this long.
const LOOKUP_NEGATIVE_TTL: Duration = Duration::from_secs(60);
/// Most ids kept waiting for lookup (bounds memory under a flood of bogus ids).
const LOOKUP_QUEUE_MAX: usize = 10_000;

/// How long an instance found by lookup stays mapped while no snapshot shows it.
const LOCATED_GRACE: std::time::Duration = std::time::Duration::from_secs(120);

#[derive(Default)]
pub(crate) struct RefreshState {
    inner: Mutex<RefreshInner>,
    /// One refresh at a time; later callers wait for it and reuse its result.
    running: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct RefreshInner {
    last_ok: Option<Instant>,
    last_error: Option<String>,
    /// Set when something (a found instance, a write) makes the snapshot stale.
    force: bool,
    hooks: BTreeMap<String, (Instant, Vec<LifecycleHook>)>,
    missing_static_reported: BTreeSet<String>,
    /// Refreshes failed in a row, and when the next may read AWS.
    failures: u32,
    retry_at: Option<Instant>,
}

/// First wait after a failed refresh; it doubles per failure up to the refresh
/// interval, so an outage or a throttled account is not called on every CA loop.
const FAILURE_BACKOFF: Duration = Duration::from_secs(1);
/// How many times a group whose answer predates our own write is read again (the
/// waits: `stale_reread_wait`, doubling; 100, 200, 400 ms by default).
const STALE_REREADS: u32 = 3;

/// The wait after `failures` refreshes failed in a row. Pure.
pub(crate) fn failure_backoff(failures: u32, interval: Duration) -> Duration {
    let cap = interval.max(FAILURE_BACKOFF);
    let exp = failures.saturating_sub(1).min(16);
    FAILURE_BACKOFF.saturating_mul(1u32 << exp).min(cap)
}

#[derive(Default)]
pub(crate) struct LookupQueue {
    pending: BTreeSet<String>,
    tried: BTreeMap<String, Instant>,
}

impl Provider {
    /// CA's Refresh. Re-reads AWS when the snapshot is older than the refresh interval
    /// (or was marked stale), waiting at most `refresh_wait`; a slow read finishes in
    /// the background. Fails only when no state was ever loaded.
    pub async fn refresh(self: &Arc<Self>) -> Result<(), ProviderError> {
        if let Some(e) = self.backing_off() {
            return self.stale_or_fail(e);
        }
        if !self.refresh_due() {
            // A template input past its lifetime, or a read that failed, is read
            // again now rather than at the next full refresh.
            self.heal_templates();
            return Ok(());
        }
        let this = self.clone();
        let task = tokio::spawn(async move { this.refresh_now().await });
        match tokio::time::timeout(self.settings.refresh_wait, task).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => self.stale_or_fail(e),
            Ok(Err(join)) => self.stale_or_fail(ProviderError::Unavailable(format!(
                "refresh task failed: {join}"
            ))),
            Err(_) => self.stale_or_fail(ProviderError::Unavailable(format!(
                "AWS did not answer within {:?}; the refresh goes on in the background",
                self.settings.refresh_wait
            ))),
        }
    }

    fn stale_or_fail(&self, e: ProviderError) -> Result<(), ProviderError> {
        if self.is_loaded() {
            self.stats.stale_serves.fetch_add(1, Ordering::Relaxed);
            metrics::Metrics::outcome(&metrics::metrics().refreshes, "stale_served");
            tracing::warn!(error = %e, "refresh failed; serving the last good state");
            Ok(())
        } else {
            Err(ProviderError::Unavailable(format!(
                "no node-group state loaded yet: {e}"
            )))
        }
    }

    /// While backing off after failures: the last error, to answer from the last state.
    fn backing_off(&self) -> Option<ProviderError> {
        // Before the first load every call may try: there is nothing to serve.
        if !self.is_loaded() {
            return None;
        }
        let inner = self.refresh.inner.lock();
        let until = inner.retry_at?;
        (now() < until).then(|| {
            ProviderError::Unavailable(format!(
                "AWS failed {} time(s) in a row; next read in {:?}: {}",
                inner.failures,
                until.saturating_duration_since(now()),
                inner.last_error.as_deref().unwrap_or("unknown error")
            ))
        })
    }

    fn refresh_due(&self) -> bool {
        let inner = self.refresh.inner.lock();
        inner.force
            || inner
                .last_ok
                .is_none_or(|t| t.elapsed() >= self.settings.refresh_interval)
    }

    /// Marks the snapshot stale so the next Refresh reads AWS.
    pub fn invalidate(&self) {
        self.refresh.inner.lock().force = true;
    }

    /// The group's terminating hooks as just read or written (a hook created, one
    /// found gone, a changed heartbeat timeout): the next refresh uses them instead of
    /// a list up to `hook_refresh_interval` old.
    pub fn note_hooks(&self, group: &str, hooks: Vec<LifecycleHook>) {
        {
            let mut inner = self.refresh.inner.lock();
            inner
                .hooks
                .insert(group.to_string(), (now(), hooks.clone()));
            inner.force = true;
        }
        // Known at once, not at the next refresh: a replica CA does not call may not
        // refresh for a while, and its lifecycle scan reads the snapshot (it would
        // put a hook it created again on every poll).
        let mut registry = self.registry.write();
        if registry.group(group).is_some() {
            let mut groups = registry.groups.clone();
            for g in groups.iter_mut().filter(|g| g.asg.name == group) {
                g.hooks = hooks.clone();
            }
            *registry = Arc::new(Registry::new(groups));
        }
    }

    /// The groups with the hook lists learned since `since` (`note_hooks`, or a read
    /// of this refresh): a list noted after this refresh read the hooks is newer than
    /// what the refresh is about to swap in.
    fn with_hooks_noted_since(&self, mut groups: Vec<Group>, since: Instant) -> Vec<Group> {
        let inner = self.refresh.inner.lock();
        for g in &mut groups {
            if let Some((at, hooks)) = inner.hooks.get(&g.asg.name) {
                if *at > since {
                    g.hooks = hooks.clone();
                }
            }
        }
        groups
    }

    /// Keeps the snapshot fresh without CA: every refresh interval, while `acting`
    /// says so (the replica leads the drains), the node groups are read again unless
    /// CA's Refresh already did. A replica CA does not talk to (bundled or standalone
    /// mode with two replicas) still drains from a current picture of AWS.
    pub fn spawn_keep_fresh(
        self: &Arc<Self>,
        acting: impl Fn() -> bool + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        let every = self
            .settings
            .refresh_interval
            .max(Duration::from_millis(100));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(this) = weak.upgrade() else { return };
                if acting() && this.refresh_due() {
                    if let Err(e) = this.refresh().await {
                        tracing::warn!(error = %e, "refresh on the service's own timer failed; the next one tries again");
                    }
                }
            }
        })
    }

    /// The last refresh error, if the last attempt failed.
    pub fn last_refresh_error(&self) -> Option<String> {
        self.refresh.inner.lock().last_error.clone()
    }

    /// Reads AWS now and swaps in a new snapshot.
    pub async fn refresh_now(self: &Arc<Self>) -> Result<(), ProviderError> {
        let _one = self.refresh.running.lock().await;
        let started = now();
        self.refresh.inner.lock().force = false;
        let result = self.load().await;
        let mut inner = self.refresh.inner.lock();
        match &result {
            Ok(()) => {
                metrics::Metrics::outcome(&metrics::metrics().refreshes, "ok");
                metrics::metrics().refreshed();
                inner.last_ok = Some(started);
                inner.last_error = None;
                inner.failures = 0;
                inner.retry_at = None;
                self.stats.refreshes.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                metrics::Metrics::outcome(&metrics::metrics().refreshes, "failed");
                inner.last_error = Some(e.to_string());
                inner.failures += 1;
                inner.retry_at =
                    Some(now() + failure_backoff(inner.failures, self.settings.refresh_interval));
                self.stats.refresh_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    async fn load(self: &Arc<Self>) -> Result<(), ProviderError> {
        let writes_before = self.writes.load(Ordering::Acquire);
        let read_at = now();
        let mut asgs = self.cloud.describe_groups(&self.settings.selector).await?;
        self.read_again_if_older_than_our_writes(&mut asgs).await?;
        self.report_missing_static(&asgs);
        let hooks_from = now();
        let hooks = self.hooks_for(&asgs).await;
        let failures = self.failures_for(&asgs).await;
        let groups: Vec<Group> = asgs
            .into_iter()
            .map(|asg| {
                let (min, max, warnings) =
                    effective_bounds(&asg, self.settings.static_bounds.get(&asg.name).copied());
                for w in &warnings {
                    tracing::warn!("{w}");
                }
                let hooks = hooks.get(&asg.name).cloned().unwrap_or_default();
                let history = failures.get(&asg.name).cloned().unwrap_or_default();
                Group {
                    asg,
                    min,
                    max,
                    failures: history.failures,
                    last_launch_unix: history.last_launch_unix,
                    hooks,
                    warnings,
                }
            })
            .collect();
        // Apply under the write lock so no size change interleaves with the swap.
        let _ops = self.ops.lock().await;
        let groups = self.with_hooks_noted_since(groups, hooks_from);
        let registry = Arc::new(Registry::new(
            self.keep_groups_read_again_since(groups, writes_before),
        ));
        let old = std::mem::replace(&mut *self.registry.write(), registry.clone());
        self.loaded.store(true, Ordering::Release);
        self.note_open();
        let raced = self.writes.load(Ordering::Acquire) != writes_before;
        {
            let mut ov = self.overlay.lock();
            if raced {
                // A size change landed while AWS was being read: the read may predate
                // it, so keep our targets and read again next time.
                self.refresh.inner.lock().force = true;
            } else {
                ov.target.clear();
            }
            Self::prune_deleting(&mut ov, &registry);
            ov.known.note_departures(&old, &registry, now());
            // A located instance this read should have shown but did not has left
            // (terminated, detached): forgotten after a grace for AWS's eventual
            // consistency, so the map stays as small as the instances still on their
            // way into a snapshot.
            ov.known.keep_located(|id, at| {
                registry.group_of_instance(id).is_none()
                    && (at > read_at || at.elapsed() < LOCATED_GRACE)
            });
            Self::apply_marks(&mut ov, &registry);
        }
        drop(_ops);
        self.confirm_departed().await;
        self.forget_gone_templates(&registry);
        tracing::debug!(
            groups = registry.groups.len(),
            instances = registry.instance_count(),
            "node groups refreshed"
        );
        self.spawn_prefetch();
        Ok(())
    }

    /// The groups a refresh read, except that a group a size change read again from
    /// AWS after this refresh began reading (`since`) keeps that newer snapshot: AWS's
    /// answer to the refresh may predate the change's own write. The hooks and
    /// launch-failure history the refresh read are kept either way. The caller holds
    /// the size lock.
    fn keep_groups_read_again_since(&self, read: Vec<Group>, since: u64) -> Vec<Group> {
        let mut reread = self.reread_at.lock();
        reread.retain(|g, _| read.iter().any(|r| &r.asg.name == g));
        let current = self.registry();
        read.into_iter()
            .map(|g| match (reread.get(&g.asg.name), current.group(&g.asg.name)) {
                (Some(at), Some(newer)) if *at > since => {
                    tracing::debug!(group = %g.asg.name, "a size change read this group after the refresh did; its snapshot stays");
                    Group {
                        asg: newer.asg.clone(),
                        min: newer.min,
                        max: newer.max,
                        warnings: newer.warnings.clone(),
                        ..g
                    }
                }
                _ => g,
            })
            .collect()
    }

    /// Asks AWS where the instances went that left their group without being seen
    /// ending ([`super::known`]): still in an Auto Scaling group (its warm pool,
    /// another group; DescribeAutoScalingInstances) they did not end, unless AWS shows
    /// them ending there; in none, EC2 says whether they ended or run on detached
    /// (DescribeInstances). Until AWS answered, they map to no group; a failed read
    /// leaves them to the next refresh.
    async fn confirm_departed(&self) {
        let ids = self.overlay.lock().known.to_confirm();
        if ids.is_empty() {
            return;
        }
        let located = match self.cloud.locate_instances(&ids).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, count = ids.len(), "cannot ask AWS where instances that left their group went; they map to no group until the next refresh asks again");
                return;
            }
        };
        let (mut ended, mut not_ended, mut in_no_group) = (Vec::new(), Vec::new(), Vec::new());
        for id in ids {
            match located.iter().find(|l| l.instance_id == id) {
                Some(l) if l.state.is_terminating() => ended.push(id),
                Some(l) => {
                    tracing::debug!(instance = %id, group = %l.group, state = l.state.as_str(), "an instance that left its group's list is still in an Auto Scaling group (its warm pool?): it maps to no group");
                    not_ended.push(id)
                }
                None => in_no_group.push(id),
            }
        }
        if !in_no_group.is_empty() {
            match self.cloud.ended_instances(&in_no_group).await {
                Ok(gone) => {
                    for id in in_no_group {
                        if gone.contains(&id) {
                            ended.push(id);
                        } else {
                            tracing::info!(instance = %id, "an instance left its group and still runs (detached): it maps to no group");
                            not_ended.push(id);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, count = in_no_group.len(), "cannot ask EC2 whether instances that left their group ended; they map to no group until the next refresh asks again");
                }
            }
        }
        self.overlay
            .lock()
            .known
            .confirm_departures(&ended, &not_ended);
    }

    /// Re-reads one group from AWS before a size change (the caller holds the write
    /// lock), so the change is computed from AWS's desired capacity and instances now,
    /// not from a snapshot up to a refresh interval old: another replica may have
    /// ended or abandoned a drain since, and a desired capacity computed from the old
    /// numbers would be off by those drains. Returns the registry holding it.
    pub(crate) async fn reread_group(&self, id: &str) -> Result<Arc<Registry>, ProviderError> {
        if self.registry().group(id).is_none() {
            return Err(ProviderError::UnknownGroup(id.to_string()));
        }
        // A full refresh reading AWS now must not replace this fresher group.
        let at = self.writes.fetch_add(1, Ordering::AcqRel) + 1;
        self.reread_at.lock().insert(id.to_string(), at);
        let selector = crate::cloud::GroupSelector {
            names: vec![id.to_string()],
            tag_sets: Vec::new(),
        };
        let mut asgs = self.cloud.describe_groups(&selector).await?;
        self.read_again_if_older_than_our_writes(&mut asgs).await?;
        let asg = asgs
            .into_iter()
            .find(|a| a.name == id)
            .ok_or_else(|| ProviderError::UnknownGroup(id.to_string()))?;
        let (min, max, warnings) =
            effective_bounds(&asg, self.settings.static_bounds.get(id).copied());
        // Into the registry as it is now, not as it was before the read: what was
        // learned while AWS answered (a hook noted, `note_hooks`) stays. Only what
        // this read says of the group is replaced; its hooks and launch-failure
        // history are the registry's.
        let (old, registry) = {
            let mut current = self.registry.write();
            let groups = current
                .groups
                .iter()
                .map(|g| {
                    if g.asg.name == id {
                        Group {
                            asg: asg.clone(),
                            min,
                            max,
                            warnings: warnings.clone(),
                            ..g.clone()
                        }
                    } else {
                        g.clone()
                    }
                })
                .collect();
            let registry = Arc::new(Registry::new(groups));
            (std::mem::replace(&mut *current, registry.clone()), registry)
        };
        let mut ov = self.overlay.lock();
        ov.target.remove(id);
        Self::prune_deleting(&mut ov, &registry);
        ov.known.note_departures(&old, &registry, now());
        Self::apply_marks(&mut ov, &registry);
        Ok(registry)
    }

    /// Reads again, up to [`STALE_REREADS`] times, the groups whose answer shows a
    /// desired capacity that one of this service's recent writes replaced: that answer
    /// is older than the write (AWS's eventual consistency), and a size change computed
    /// from it would undo the write ([`super::written`]). What a group still shows after
    /// that is AWS's truth (another writer set the same capacity).
    async fn read_again_if_older_than_our_writes(
        &self,
        asgs: &mut [AsgSnapshot],
    ) -> Result<(), ProviderError> {
        for attempt in 0..STALE_REREADS {
            let names: Vec<String> = {
                let ov = self.overlay.lock();
                let at = now();
                asgs.iter()
                    .filter(|a| {
                        ov.written
                            .get(&a.name)
                            .is_some_and(|w| w.stands(a.desired_capacity, at))
                    })
                    .map(|a| a.name.clone())
                    .collect()
            };
            if names.is_empty() {
                return Ok(());
            }
            tracing::debug!(groups = ?names, attempt, "AWS answered with a desired capacity from before this service's own write; reading again");
            metrics::metrics().stale_reads.inc_by(names.len() as u64);
            tokio::time::sleep(self.settings.stale_reread_wait * (1 << attempt)).await;
            let selector = crate::cloud::GroupSelector {
                names,
                tag_sets: Vec::new(),
            };
            for again in self.cloud.describe_groups(&selector).await? {
                if let Some(a) = asgs.iter_mut().find(|a| a.name == again.name) {
                    *a = again;
                }
            }
        }
        Ok(())
    }

    /// Instances we ended stop being tracked once AWS shows them terminating or gone.
    fn prune_deleting(ov: &mut super::Overlay, registry: &Registry) {
        ov.known.keep_ending(|id| {
            registry
                .group_of_instance(id)
                .and_then(|g| g.asg.instances.iter().find(|i| i.id == id))
                .is_some_and(|i| !i.state.is_terminating())
        });
    }

    fn report_missing_static(&self, asgs: &[AsgSnapshot]) {
        let found: BTreeSet<&str> = asgs.iter().map(|a| a.name.as_str()).collect();
        let mut inner = self.refresh.inner.lock();
        for name in &self.settings.selector.names {
            if !found.contains(name.as_str()) && inner.missing_static_reported.insert(name.clone())
            {
                tracing::warn!(group = %name, "configured node group not found in AWS");
            }
        }
    }

    /// Terminating hooks per group: taken from the describe when the backend fills
    /// them, else read per group once and again every `hook_refresh_interval`.
    async fn hooks_for(&self, asgs: &[AsgSnapshot]) -> BTreeMap<String, Vec<LifecycleHook>> {
        /// How old a group's hook list may be while one of its instances waits in
        /// Terminating:Wait.
        const HELD_HOOKS_REREAD: Duration = Duration::from_secs(10);
        let mut out = BTreeMap::new();
        let mut to_read = Vec::new();
        {
            let inner = self.refresh.inner.lock();
            for a in asgs {
                if !a.terminating_hooks.is_empty() {
                    out.insert(a.name.clone(), a.terminating_hooks.clone());
                    continue;
                }
                // An instance held in Terminating:Wait may be held by a hook added
                // since the last read (the quickstart has operators add ours by
                // hand): read the group's hooks again soon, not in 30 minutes, or
                // the hook times out with no heartbeat and the instance ends
                // undrained.
                let held = a
                    .instances
                    .iter()
                    .any(|i| i.state == LifecycleState::TerminatingWait);
                let max_age = if held {
                    self.settings.hook_refresh_interval.min(HELD_HOOKS_REREAD)
                } else {
                    self.settings.hook_refresh_interval
                };
                match inner.hooks.get(&a.name) {
                    Some((at, h)) if at.elapsed() < max_age => {
                        out.insert(a.name.clone(), h.clone());
                    }
                    _ => to_read.push(a.name.clone()),
                }
            }
        }
        let read_from = now();
        let read: Vec<(String, Result<Vec<LifecycleHook>, _>)> = stream::iter(to_read)
            .map(|name| async move {
                // DescribeAutoScalingGroups carries no hooks: a group whose hooks
                // cannot be read looks unhooked, and an instance our hook holds would
                // go without heartbeats. A throttled or failed read is tried again
                // at once, a few times, before the last known list stands in.
                let read = || self.cloud.terminating_hooks(&name);
                let r = read
                    .retry(crate::clock::jittered(
                        ExponentialBuilder::default()
                            .with_min_delay(Duration::from_millis(100))
                            .with_max_delay(Duration::from_secs(1))
                            .with_max_times(4),
                        &format!("hooks of {name}"),
                    ))
                    .sleep(tokio::time::sleep)
                    .when(|e: &crate::cloud::CloudError| e.is_retryable())
                    .await;
                (name, r)
            })
            .buffer_unordered(FAILURE_READ_CONCURRENCY)
            .collect()
            .await;
        let mut inner = self.refresh.inner.lock();
        for (name, r) in read {
            match r {
                // Learned while AWS answered (`note_hooks`): newer than this read.
                Ok(_)
                    if inner
                        .hooks
                        .get(&name)
                        .is_some_and(|(at, _)| *at > read_from) =>
                {
                    out.insert(name.clone(), inner.hooks[&name].1.clone());
                }
                Ok(h) => {
                    inner.hooks.insert(name.clone(), (now(), h.clone()));
                    out.insert(name, h);
                }
                Err(e) => {
                    tracing::warn!(group = %name, error = %e, "could not read lifecycle hooks; keeping the last known");
                    if let Some((_, h)) = inner.hooks.get(&name) {
                        out.insert(name, h.clone());
                    }
                }
            }
        }
        out
    }

    /// Launch failures, read only for groups whose desired capacity is not met.
    async fn failures_for(
        &self,
        asgs: &[AsgSnapshot],
    ) -> BTreeMap<String, crate::cloud::LaunchHistory> {
        let short: Vec<String> = asgs
            .iter()
            .filter(|a| a.desired_capacity > a.instances_filling_slots())
            .map(|a| a.name.clone())
            .collect();
        stream::iter(short)
            .map(|name| async move {
                match self.cloud.launch_history(&name).await {
                    Ok(f) => Some((name, f)),
                    Err(e) => {
                        tracing::warn!(group = %name, error = %e, "could not read scaling activities");
                        None
                    }
                }
            })
            .buffer_unordered(FAILURE_READ_CONCURRENCY)
            .filter_map(|x| async move { x })
            .collect()
            .await
    }

    // ---- background lookup of instances the snapshot does not know ----

    pub(crate) fn enqueue_lookup(&self, instance_id: &str) {
        let mut q = self.lookups.lock();
        if q.pending.len() >= LOOKUP_QUEUE_MAX || q.pending.contains(instance_id) {
            return;
        }
        if q.tried
            .get(instance_id)
            .is_some_and(|t| t.elapsed() < LOOKUP_NEGATIVE_TTL)
        {
            return;
        }
        q.pending.insert(instance_id.to_string());
        drop(q);
        self.lookup_wake.notify_one();
    }

    /// Loads the first state in the background, retrying 1 s doubling to 30 s with
    /// jitter until AWS answers, so the server listens at once and Refresh answers
    /// Unavailable until AWS has been read. While the state holds no group, it is read
    /// again every refresh interval until one is found.
    pub fn spawn_initial_refresh(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let mut this = self.clone();
        let policy = crate::clock::jittered(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_secs(1))
                .with_max_delay(Duration::from_secs(30))
                .without_max_times(),
            "initial refresh",
        );
        tokio::spawn(async move {
            let first = || async {
                if this.is_loaded() {
                    return Ok(());
                }
                this.refresh_now().await
            };
            let loaded = first
                .retry(policy)
                .sleep(tokio::time::sleep)
                .notify(|e, retry_in| {
                    tracing::warn!(error = %e, ?retry_in, "first refresh failed");
                })
                .await;
            if loaded.is_err() {
                return;
            }
            tracing::info!(groups = this.registry().groups.len(), "node groups loaded");
            // Nothing found: /readyz says so, and every replica (not only the leader,
            // whose timer keeps its own picture fresh) reads again each refresh
            // interval, so that a replica CA cannot reach while it is unready still
            // becomes ready once a group exists.
            let every = this
                .settings
                .refresh_interval
                .max(Duration::from_millis(100));
            let mut said = false;
            loop {
                if !this.registry().groups.is_empty() {
                    if said {
                        tracing::info!(groups = this.registry().groups.len(), "node groups found");
                    }
                    return;
                }
                if !said {
                    tracing::warn!(
                        looked_for = %super::looked_for(&this.settings.selector),
                        "no node group found: /readyz answers 503 until one is; check the discovery tags (the cluster name), the static names and the region (ca-asg-provider check-config)"
                    );
                    said = true;
                }
                let weak = Arc::downgrade(&this);
                drop(this);
                tokio::time::sleep(every).await;
                let Some(again) = weak.upgrade() else { return };
                this = again;
                if this.refresh_due() {
                    if let Err(e) = this.refresh().await {
                        tracing::warn!(error = %e, "reading the node groups again failed; the next interval tries again");
                    }
                }
            }
        })
    }

    /// Starts the background work of the core (instance lookups). Returns its handle.
    pub fn start_background(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        let wake = self.lookup_wake.clone();
        tokio::spawn(async move {
            loop {
                let notified = wake.notified();
                let Some(this) = weak.upgrade() else { return };
                let has_work = !this.lookups.lock().pending.is_empty();
                if !has_work {
                    drop(this);
                    // Wakes on new work; the timeout lets the task end once the
                    // provider is gone.
                    let _ = tokio::time::timeout(Duration::from_secs(30), notified).await;
                    continue;
                }
                this.run_lookups().await;
                let gap = this.settings.lookup_interval;
                drop(this);
                tokio::time::sleep(gap).await;
            }
        })
    }

    async fn run_lookups(&self) {
        let ids: Vec<String> = {
            let mut q = self.lookups.lock();
            let ids: Vec<String> = std::mem::take(&mut q.pending).into_iter().collect();
            let t = now();
            for id in &ids {
                q.tried.insert(id.clone(), t);
            }
            q.tried.retain(|_, at| at.elapsed() < LOOKUP_NEGATIVE_TTL);
            ids
        };
        for chunk in ids.chunks(LOOKUP_BATCH) {
            self.stats.lookups.fetch_add(1, Ordering::Relaxed);
            match self.cloud.locate_instances(chunk).await {
                Ok(found) => {
                    let reg = self.registry();
                    let mut any = false;
                    let mut ov = self.overlay.lock();
                    for loc in found {
                        // An instance in the warm pool is not the group's: its Node
                        // (a stopped instance keeps it) maps to no group, as CA's
                        // own AWS provider answers.
                        if loc.state.in_warm_pool() {
                            tracing::debug!(instance = %loc.instance_id, group = %loc.group, state = loc.state.as_str(), "instance in the warm pool: mapped to no group");
                            continue;
                        }
                        if reg.group(&loc.group).is_some() {
                            tracing::info!(instance = %loc.instance_id, group = %loc.group, "new instance mapped to its group");
                            ov.known.locate(&loc.instance_id, loc.group, now());
                            any = true;
                        }
                    }
                    drop(ov);
                    if any {
                        self.invalidate();
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, count = chunk.len(), "instance lookup failed; will retry later");
                    let mut q = self.lookups.lock();
                    for id in chunk {
                        q.tried.remove(id);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::memory::{MemoryCloud, MemoryGroup, MemoryTiming};

    fn hook(secs: i32) -> LifecycleHook {
        LifecycleHook {
            name: "ca-asg-provider-drain".into(),
            heartbeat_timeout_secs: secs,
            default_result: "ABANDON".into(),
        }
    }

    async fn provider_over(cloud: &MemoryCloud) -> Arc<Provider> {
        let p = Provider::new(
            Arc::new(cloud.clone()),
            super::super::ProviderSettings {
                selector: crate::cloud::GroupSelector {
                    names: vec!["web".into()],
                    tag_sets: Vec::new(),
                },
                // Every refresh reads the hooks.
                hook_refresh_interval: Duration::ZERO,
                ..Default::default()
            },
        );
        p.refresh_now().await.unwrap();
        p
    }

    /// Issue 59 (suspected item, proven): a size change reads its group again from
    /// AWS and built the registry from the copy it took before that read, so a hook
    /// learned while AWS answered (`note_hooks`: the lifecycle scan creating it,
    /// DeleteNodes confirming a changed one) was gone again until the next refresh:
    /// the scan saw the group unhooked. What is learned during the read stays.
    #[tokio::test(start_paused = true)]
    async fn a_hook_noted_while_a_size_change_reads_its_group_stays() {
        let cloud = MemoryCloud::new(
            vec![MemoryGroup::new("web", 0, 5, 2, "m5.large")],
            MemoryTiming::default(),
        );
        let p = provider_over(&cloud).await;
        assert!(p.registry().group("web").unwrap().hooks.is_empty());
        cloud.slow(Duration::from_secs(2));
        let size = tokio::spawn({
            let p = p.clone();
            async move { p.increase_size("web", 1).await }
        });
        // The size change is reading the group.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!size.is_finished());
        p.note_hooks("web", vec![hook(60)]);
        assert_eq!(p.registry().group("web").unwrap().hooks, vec![hook(60)]);
        size.await.unwrap().unwrap();
        let reg = p.registry();
        let g = reg.group("web").unwrap();
        assert_eq!(g.hooks, vec![hook(60)], "the hook learned meanwhile stays");
        assert_eq!(p.target_size("web").unwrap(), 3);
    }

    /// A hook learned while a full refresh reads AWS (`note_hooks`: the lifecycle
    /// scan creating our hook, whose read of it lags) stays: the refresh's swap, built
    /// from hooks read before the note, and its store of that older read, do not put
    /// the group back to unhooked until the next refresh.
    #[tokio::test(start_paused = true)]
    async fn a_hook_noted_while_a_refresh_reads_aws_stays() {
        let cloud = MemoryCloud::new(
            vec![MemoryGroup::new("web", 0, 5, 2, "m5.large")],
            MemoryTiming::default(),
        );
        let p = provider_over(&cloud).await;
        assert!(p.registry().group("web").unwrap().hooks.is_empty());
        // AWS acts on each read at once and answers 2 s later: a hook created while
        // a read's answer is on its way is not in that answer.
        cloud.slow_answers(Duration::from_secs(2));
        for noted_at in [Duration::from_millis(500), Duration::from_millis(2500)] {
            // The first hook is created while the groups are read (the hooks' read,
            // later, sees it), the second while the hooks are read (that read does
            // not).
            let refresh = tokio::spawn({
                let p = p.clone();
                async move { p.refresh_now().await }
            });
            tokio::time::sleep(noted_at).await;
            assert!(!refresh.is_finished());
            let h = hook(60 + noted_at.as_secs() as i32);
            cloud.add_hook("web", h.clone());
            p.note_hooks("web", vec![h.clone()]);
            refresh.await.unwrap().unwrap();
            assert_eq!(
                p.registry().group("web").unwrap().hooks,
                vec![h],
                "the hook noted {noted_at:?} into the refresh stays"
            );
        }
    }

    /// The other change of the registry, a full refresh, cannot land during that
    /// read: it swaps its snapshot under the size lock the size change holds, and
    /// keeps the group the size change read after it began. Pinned: the refresh that
    /// ran meanwhile brings what it read (a hook added in AWS), and the size change's
    /// write stands.
    #[tokio::test(start_paused = true)]
    async fn a_refresh_during_a_size_changes_read_keeps_both() {
        let cloud = MemoryCloud::new(
            vec![MemoryGroup::new("web", 0, 5, 2, "m5.large")],
            MemoryTiming::default(),
        );
        let p = provider_over(&cloud).await;
        cloud.add_hook("web", hook(90));
        cloud.slow(Duration::from_secs(2));
        let size = tokio::spawn({
            let p = p.clone();
            async move { p.increase_size("web", 1).await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let refresh = tokio::spawn({
            let p = p.clone();
            async move { p.refresh_now().await }
        });
        size.await.unwrap().unwrap();
        refresh.await.unwrap().unwrap();
        let reg = p.registry();
        let g = reg.group("web").unwrap();
        assert_eq!(g.hooks, vec![hook(90)]);
        assert_eq!(p.target_size("web").unwrap(), 3);
        assert_eq!(cloud.desired("web"), Some(3));
    }

    #[test]
    fn failure_backoff_doubles_up_to_the_refresh_interval() {
        let minute = Duration::from_secs(60);
        let waits: Vec<u64> = (1..=8)
            .map(|n| failure_backoff(n, minute).as_secs())
            .collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(failure_backoff(u32::MAX, minute), minute);
        assert_eq!(
            failure_backoff(3, Duration::ZERO),
            Duration::from_secs(1),
            "never less than the first wait"
        );
    }
}
