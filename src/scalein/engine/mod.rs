//! The engine: runs drains (one per instance, at most `maxConcurrentDrains` at once,
//! all sharing one API rate limit), holds lifecycle actions, follows the Lease, and
//! answers what mode an instance of a group ends in. What it keeps track of lives in
//! [`inflight`](crate::scalein::engine::book).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::scalein::decide::record;
use crate::scalein::decide::story::Verdict;
use crate::scalein::engine::book::{Book, HoldChange};
use crate::scalein::engine::marks_sync::spawn_marks_sync;
use crate::scalein::kube::{budgets, events, nodes, pass, ratelimit, user_agent};
use crate::scalein::stages::{drain, evict, port, preview, terminate, Stage};
use crate::scalein::{DrainRequest, Mode, ModeChoice, Outcome, ScaleInSettings, Start};

pub use crate::scalein::stats::DrainStats;

pub mod book;
pub mod keeper;
pub mod leader;
pub mod marks_sync;
use crate::cloud::{Cloud, LifecycleAction};
use crate::provider::{Group, Provider, ProviderError};
use crate::telemetry::metrics::{metrics, Metrics};

/// Between a failed drain and its retry while our hook holds the instance.
const HELD_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs drains: at most one per instance, at most `max_concurrent_drains` at once,
/// all sharing one API rate limit.
pub struct Engine {
    pub(crate) client: kube::Client,
    /// The same, for what a caller waits for within its deadline (DeleteNodes
    /// marking its Node): ahead of the drains in the rate limit.
    pub(crate) answer_client: kube::Client,
    pub(crate) cloud: Arc<dyn Cloud>,
    pub(crate) provider: Option<Arc<Provider>>,
    pub(crate) settings: ScaleInSettings,
    /// The client without the drains' rate limit, for the Lease alone: a renewal
    /// must not queue behind a storm's evictions, or leadership is lost mid-storm.
    lease_client: kube::Client,
    pub(crate) events: events::Events,
    pub(crate) nodes: nodes::NodeIndex,
    /// Watches of the pods of budgets that refused an eviction.
    pub budgets: budgets::BudgetWatches,
    /// Evictions this process asked for, so a restarted drain does not ask again.
    pub(crate) evictions: Arc<evict::Ledger>,
    /// What drains running together read once for all of them.
    pub passes: pass::Passes,
    /// `maxConcurrentDrains`: taken by a drain after its cordon, for its stages.
    pub(crate) slots: Arc<tokio::sync::Semaphore>,
    /// Which drains run, which actions are held or over, what was said once.
    pub(crate) book: Book,
    /// Feeds the provider's accounting with the drain marks on Nodes.
    marks_sync: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Set when leader election runs: whether this replica leads now.
    leadership: std::sync::OnceLock<tokio::sync::watch::Receiver<bool>>,
    /// Tells the leader-election task to release the lease and stop.
    step_down: tokio::sync::watch::Sender<bool>,
    /// Set by [`Self::step_down`]: this replica acts no more, whatever the Lease says.
    stepping_down: std::sync::atomic::AtomicBool,
    pub stats: DrainStats,
    /// Until when the lifecycle scan runs every [`crate::scalein::holds::SOON`] instead of its
    /// poll interval: a hold AWS announced and does not show yet.
    scan_soon: Mutex<Option<crate::clock::Instant>>,
    /// Wakes the lifecycle loop when `scan_soon` is set.
    scan_wake: tokio::sync::Notify,
    /// Until when the loop follows the Nodes resting in a warm pool every
    /// [`crate::scalein::holds::SOON`] (and scans at its poll interval): CA raised a pooled group
    /// ([`crate::scalein::sources::warm_pool::capacity_added`]).
    follow_soon: Mutex<Option<crate::clock::Instant>>,
    /// The background loops' turns, for `/healthz`.
    pub liveness: Arc<crate::telemetry::liveness::Liveness>,
}

impl Engine {
    pub fn new(
        client: kube::Client,
        cloud: Arc<dyn Cloud>,
        provider: Option<Arc<Provider>>,
        settings: ScaleInSettings,
    ) -> Arc<Self> {
        let limiter = Arc::new(ratelimit::RateLimiter::new(
            settings.api_qps,
            settings.api_burst,
        ));
        // Every request, watches and Events included, as client-go's own limiter
        // does: the rate holds however many drains run.
        // Each request says who sends it (the audit log's userAgent).
        let client = crate::scalein::kube::intercept::answered_within(
            client,
            crate::scalein::kube::intercept::ANSWER_WITHIN,
        );
        let lease_client = user_agent::named(client.clone(), user_agent::LEASE);
        let client = user_agent::named(client, user_agent::DRAIN);
        let pod_event_client =
            ratelimit::limited_client(client.clone(), limiter.clone(), ratelimit::Priority::Spare);
        let answer_client =
            ratelimit::limited_client(client.clone(), limiter.clone(), ratelimit::Priority::Answer);
        let client = ratelimit::limited_client(client, limiter.clone(), ratelimit::Priority::Drain);
        let slots = Arc::new(tokio::sync::Semaphore::new(
            settings.max_concurrent_drains.max(1),
        ));
        let nodes = nodes::NodeIndex::start(client.clone());
        let liveness = Arc::new(crate::telemetry::liveness::Liveness::default());
        let marks_sync = provider
            .as_ref()
            .map(|p| spawn_marks_sync(&nodes, Arc::downgrade(p), liveness.clone()));
        Arc::new(Self {
            budgets: budgets::BudgetWatches::new(client.clone()),
            evictions: Arc::default(),
            passes: pass::Passes::new(client.clone(), settings.shared_pod_watch_from),
            events: events::Events::new(client.clone(), pod_event_client, Some(limiter)),
            nodes,
            marks_sync: Mutex::new(marks_sync),
            client,
            answer_client,
            cloud,
            provider,
            settings,
            lease_client,
            slots,
            book: Book::default(),
            leadership: std::sync::OnceLock::new(),
            step_down: tokio::sync::watch::channel(false).0,
            stepping_down: std::sync::atomic::AtomicBool::new(false),
            stats: DrainStats::default(),
            scan_soon: Mutex::new(None),
            scan_wake: tokio::sync::Notify::new(),
            liveness,
            follow_soon: Mutex::default(),
        })
    }

    pub fn settings(&self) -> &ScaleInSettings {
        &self.settings
    }

    /// Makes the background loop and drains follow a leader election (see [`leader`]).
    pub fn follow_leadership(&self, rx: tokio::sync::watch::Receiver<bool>) {
        let _ = self.leadership.set(rx);
    }

    /// The leadership receiver, when leader election runs.
    pub fn leadership(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.leadership.get().cloned()
    }

    /// Starts leader election when configured (identity: POD_NAME, else the host name).
    pub fn elect_leader(&self) {
        if !self.settings.leader_election {
            return;
        }
        if self.settings.dry_run {
            tracing::info!("dry run: no leader election (it writes a Lease); every replica describes what it would drain");
            return;
        }
        let identity = std::env::var("POD_NAME")
            .ok()
            .filter(|s| !s.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
            .unwrap_or_else(|| format!("ca-asg-provider-{}", std::process::id()));
        let lease = leader::lease_for(&self.settings, identity);
        tracing::info!(lease = %lease.name, namespace = %lease.namespace, identity = %lease.identity, "leader election: the drain loop runs on the Lease holder");
        self.lead_as(lease);
    }

    /// Runs the election for the Lease `lease` names and follows it; [`Self::step_down`]
    /// ends it. Returns the election's task (a test aborts it to play a process that
    /// died).
    pub fn lead_as(&self, lease: leader::LeaseSettings) -> tokio::task::JoinHandle<()> {
        let (leads, task) = leader::spawn_task(
            self.liveness.clone(),
            self.lease_client.clone(),
            lease,
            self.step_down.subscribe(),
        );
        self.follow_leadership(leads);
        task
    }

    /// On shutdown: stop leading and release the Lease so another replica takes over
    /// at once (bounded; without an answer the Lease expires by itself).
    ///
    /// In this order: this replica stops acting (no new drain starts, every running
    /// one stops where it is), then the election releases the Lease. Released first,
    /// the Lease could be taken over while this replica's drains still evict and
    /// heartbeat, for as long as the release's answer takes (leadership_model found
    /// it with Lease writes answered late).
    pub async fn step_down(&self) {
        self.stepping_down
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.abort_all();
        self.step_down.send_replace(true);
        if let Some(mut rx) = self.leadership() {
            // The election's task ends once the release is answered (or failed).
            let _ = tokio::time::timeout(Duration::from_secs(3), async {
                while rx.changed().await.is_ok() {}
            })
            .await;
        }
    }

    /// Whether this replica may drain: always, unless leader election says otherwise
    /// or it is stepping down.
    pub fn is_leader(&self) -> bool {
        !self.stepping_down.load(std::sync::atomic::Ordering::SeqCst)
            && self.leadership.get().is_none_or(|rx| *rx.borrow())
    }

    /// The plan settings of [`record::DrainRecord::plan`].
    pub fn limits(&self) -> record::Limits {
        self.stage().limits()
    }

    /// What a stage of a drain may reach ([`Stage`]): the pieces that work on one
    /// node, not the engine, its book of drains or its slots.
    pub fn stage(&self) -> Stage<'_> {
        Stage {
            client: &self.client,
            settings: &self.settings,
            nodes: &self.nodes,
            passes: &self.passes,
            evictions: &self.evictions,
            budgets: &self.budgets,
            events: &self.events,
            stats: &self.stats,
        }
    }

    /// Starts the drain of an instance, or joins the request's reasons into the one
    /// that runs: a reason that changes the plan (a budget, a hook, CA's scale-in)
    /// restarts the drain with every reason (its state is on the Node and in the
    /// pods, so it goes on where it was); a duplicate changes nothing. A hook's
    /// lifecycle action is heartbeated from here on, whatever drain runs. Returns at
    /// once. A replica that does not lead starts nothing.
    pub fn start(self: &Arc<Self>, req: DrainRequest) -> Start {
        if self.settings.dry_run {
            return if self.observe(req) {
                Start::Started
            } else {
                Start::Refused
            };
        }
        if !self.is_leader() {
            tracing::info!(instance = %req.instance_id, "not the leader: no drain started here");
            return Start::Refused;
        }
        if let Mode::Lifecycle {
            action,
            heartbeat_timeout,
        } = &req.mode
        {
            self.hold(action, *heartbeat_timeout);
        }
        self.book.start(req, self.limits(), |req, how, run| {
            if how == Start::Started {
                self.stats.started.fetch_add(1, Ordering::Relaxed);
                metrics().drains_started.inc();
            }
            tokio::spawn(drain_task(self.clone(), req, run))
        })
    }

    /// Heartbeats the lifecycle action until it is completed, AWS says it is gone,
    /// or the hook's global limit, at `timeout`: the hook's heartbeat timeout as
    /// read when the hold starts. A second call for the same instance starts nothing
    /// but corrects the timeout when the hook's changed (the heartbeats reschedule).
    pub fn hold(self: &Arc<Self>, action: &crate::cloud::LifecycleAction, timeout: Duration) {
        if self.settings.dry_run {
            return;
        }
        let change = self.book.hold(&action.instance_id, timeout, |rx| {
            keeper::heartbeats(self.clone(), action.clone(), rx)
        });
        if let HoldChange::Changed { was } = change {
            tracing::info!(instance = %action.instance_id, hook = %action.hook, ?was, now = ?timeout, "the hook's heartbeat timeout changed; heartbeats follow it");
        }
    }

    /// Whether our hook's action for the instance is being heartbeated.
    pub fn holds_hook(&self, instance_id: &str) -> bool {
        self.held_timeout(instance_id).is_some()
    }

    /// The heartbeat timeout a held instance is heartbeated at, if it is held.
    pub fn held_timeout(&self, instance_id: &str) -> Option<Duration> {
        self.book.held_timeout(instance_id)
    }

    /// Our hook's heartbeat timeout on `group` as AWS has it now. `None`: AWS
    /// cannot be asked, or the group (or our hook on it) is gone.
    pub async fn hook_timeout_now(&self, group: &str) -> Option<Duration> {
        let known = self.provider.as_ref()?.registry().group(group)?.clone();
        let fresh = match self.with_current_hooks(&known).await {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(group, error = %e, "cannot read the lifecycle hook's current heartbeat timeout");
                return None;
            }
        };
        self.our_hook(&fresh)
            .map(|h| Duration::from_secs(h.heartbeat_timeout_secs.max(1) as u64))
    }

    /// Stops the heartbeats: the action was completed, or the instance is gone.
    pub(crate) fn release(&self, instance_id: &str) {
        self.book.release(instance_id);
    }

    /// The dry run's `start`: describes the drain once per instance (a lifecycle
    /// action seen on every poll is described the first time), in the background.
    fn observe(self: &Arc<Self>, req: DrainRequest) -> bool {
        if !self.note_once("dry-run drain", req.instance_id.clone()) {
            return false;
        }
        let this = self.clone();
        let task_req = req.clone();
        let handle = tokio::spawn(async move {
            Outcome::Observed(preview::describe(&this.stage(), &task_req).await)
        });
        self.book.observe(req, handle);
        true
    }

    /// Stops the drain of an instance where it is (the instance stopped or ended:
    /// nothing is left to protect). True when one ran.
    pub fn stop_drain(&self, instance_id: &str) -> bool {
        self.book.stop(instance_id)
    }

    /// The instance stopped or ended (EC2's state-change notice): its drain stops
    /// where it is, and the reasons that only drained it are recorded done on its
    /// Node ([`record::DrainRecord::instance_left`]), or the next poll would resume
    /// what was stopped. Returns whether a drain ran or a reason was closed; an
    /// error when the Node could not be read or written (the notice is then tried
    /// again). EC2 sends these notices for every instance of the account: only a
    /// Node this replica drains, or whose cached record holds such a reason, is
    /// read from the API server.
    pub async fn instance_left(&self, instance_id: &str) -> Result<bool, kube::Error> {
        let stopped = self.stop_drain(instance_id);
        let Some(node) = self.nodes.node_for_instance(instance_id) else {
            return Ok(stopped);
        };
        let closes = self
            .cached_record(&node)
            .is_some_and(|mut r| r.instance_left(crate::clock::utc_now()));
        if !(stopped || closes) {
            return Ok(false);
        }
        crate::scalein::kube::node_record::update_record(&self.nodes, &self.client, &node, |r| {
            r.instance_left(crate::clock::utc_now())
        })
        .await?;
        Ok(true)
    }

    /// A hold AWS announced (a lifecycle message) that its reads do not show yet
    /// (they lag the notification): the lifecycle scan runs every
    /// [`crate::scalein::holds::SOON`] for `within` instead of waiting out its poll interval
    /// (five minutes in queue mode, longer than a short hook's timeout).
    pub fn expect_hold(&self, within: Duration) {
        let until = crate::clock::Instant::now() + within;
        let mut soon = self.scan_soon.lock();
        *soon = Some(soon.map_or(until, |s| s.max(until)));
        drop(soon);
        self.scan_wake.notify_one();
    }

    /// The loop follows the Nodes resting in a warm pool every [`crate::scalein::holds::SOON`]
    /// for `within` from now, scanning at its poll interval all the same.
    pub fn follow_soon(&self, within: Duration) {
        let until = crate::clock::Instant::now() + within;
        let mut soon = self.follow_soon.lock();
        *soon = Some(soon.map_or(until, |s| s.max(until)));
        drop(soon);
        self.scan_wake.notify_one();
    }

    /// Whether a hold AWS announced is expected now ([`Self::expect_hold`]): every
    /// turn of the loop scans.
    pub(crate) fn scanning_soon(&self) -> bool {
        self.scan_soon
            .lock()
            .is_some_and(|until| crate::clock::Instant::now() < until)
    }

    /// How long the lifecycle loop waits before its next turn.
    pub(crate) fn next_scan_in(&self) -> Duration {
        let poll = self.settings.lifecycle_poll_interval;
        let following = self
            .follow_soon
            .lock()
            .is_some_and(|until| crate::clock::Instant::now() < until);
        if self.scanning_soon() || following {
            poll.min(crate::scalein::holds::SOON)
        } else {
            poll
        }
    }

    /// Resolves when [`Self::expect_hold`] is called.
    pub(crate) async fn scan_asked(&self) {
        self.scan_wake.notified().await
    }

    /// Our hook's lifecycle action for `instance_id` is over (completed by this
    /// replica, or found complete).
    pub(crate) fn note_action_done(&self, instance_id: &str) {
        self.book.note_action_done(instance_id);
    }

    /// The instance's turn to be ended: held while its termination and the note
    /// of it run, so a second drain of the instance waits for them.
    pub(crate) async fn end_turn(&self, instance_id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        self.book.end_turn(instance_id).await
    }

    /// Per-pod Events queued and not yet published (the drain storm benchmark waits
    /// for them to drain).
    pub fn pod_events_pending(&self) -> usize {
        self.events.pod_events_pending()
    }

    /// The instance's Node, as the engine's cache of Nodes has it.
    pub fn node_for_instance(&self, instance_id: &str) -> Option<String> {
        self.nodes.node_for_instance(instance_id)
    }

    /// What the engine holds of the instance, read at once from its one record.
    pub fn story(&self, instance_id: &str) -> crate::scalein::decide::story::InstanceStory {
        self.book.story(instance_id)
    }

    /// What the engine holds of every instance it knows, read at once.
    pub fn stories(
        &self,
    ) -> std::collections::BTreeMap<String, crate::scalein::decide::story::InstanceStory> {
        self.book.stories()
    }

    /// Whether our hook's lifecycle action for `instance_id` is known to be over.
    pub fn action_done(&self, instance_id: &str) -> bool {
        self.book.action_done(instance_id)
    }

    /// Whether the instance's Node (as the cache has it) records our hook's action
    /// as completed ([`record::DrainRecord::lifecycle_completed`]); remembered from
    /// then on, as if this process had completed it.
    pub fn action_done_on_node(&self, instance_id: &str) -> bool {
        let done = self
            .nodes
            .node_for_instance(instance_id)
            .and_then(|n| self.cached_record(&n))
            .is_some_and(|r| r.lifecycle_completed(crate::clock::utc_now()));
        if done {
            self.note_action_done(instance_id);
        }
        done
    }

    /// How the Node came to be cordoned, as the engine's Node watch saw it
    /// ([`crate::scalein::stages::cordon::CordonSeen`]): whose cordon a drain starts from.
    pub fn cordon_seen(&self, node: &str) -> Option<crate::scalein::stages::cordon::CordonSeen> {
        self.nodes.cordon_seen(node)
    }

    /// The drain record on the Node `node` as the cache has it.
    pub fn cached_record(&self, node: &str) -> Option<record::DrainRecord> {
        let n = self.nodes.cached(node)?;
        crate::scalein::kube::node_record::record_of(n.metadata.annotations.as_ref()?)
    }

    /// Forgets what this process remembers of the instance's finished action (our
    /// hook holds it with a new one).
    pub(crate) fn forget_action_done(&self, instance_id: &str) {
        self.book.forget_action_done(instance_id);
    }

    /// Forgets the ended actions of instances `keep` says no longer exist.
    pub(crate) fn forget_actions_done(&self, keep: impl Fn(&str) -> bool) {
        self.book.forget_actions_done(keep);
    }

    /// Drains asked for and not finished: running, or cordoned and waiting for a slot.
    pub fn drains_at_once(&self) -> usize {
        self.book.running()
    }

    pub fn is_draining(&self, instance_id: &str) -> bool {
        self.book.is_running(instance_id)
    }

    /// Stops every drain where it is, as a crash would (tests; shutdown leaves drains
    /// resumable because their state lives on the Node and in AWS).
    pub fn abort_all(&self) {
        self.book.stop_all();
    }

    /// Stops every drain and the engine's Node watch (end of a load test or a CLI run;
    /// drains resume on the next start).
    pub fn shutdown(&self) {
        self.abort_all();
        self.nodes.stop();
        if let Some(t) = self.marks_sync.lock().take() {
            t.abort();
        }
    }

    pub fn in_progress(&self) -> usize {
        self.book.running()
    }

    /// Waits for the drain of an instance (tests, the CLI).
    pub async fn wait_for(&self, instance_id: &str) -> Option<Outcome> {
        self.book.take(instance_id)?.await.ok()
    }

    /// The mode for an instance of a group, per configuration and the group's hooks.
    pub fn mode_for(&self, group: &Group, instance_id: &str) -> Mode {
        match (self.settings.mode, self.our_hook(group)) {
            (ModeChoice::Auto, Some(h)) => Mode::Lifecycle {
                action: LifecycleAction {
                    group: group.asg.name.clone(),
                    hook: h.name.clone(),
                    instance_id: instance_id.to_string(),
                    token: None,
                },
                heartbeat_timeout: Duration::from_secs(h.heartbeat_timeout_secs.max(1) as u64),
            },
            _ => Mode::Direct,
        }
    }

    /// The group with its terminating hooks as AWS has them now (and the provider
    /// told when they changed).
    pub async fn with_current_hooks(&self, group: &Group) -> Result<Group, ProviderError> {
        let hooks = self
            .cloud
            .terminating_hooks(&group.asg.name)
            .await
            .map_err(|e| {
                ProviderError::Unavailable(format!(
                    "cannot confirm the lifecycle hook of group {} before ending an instance through it: {e}",
                    group.asg.name
                ))
            })?;
        let ours = hooks
            .iter()
            .find(|h| h.name == self.settings.hook_name)
            .cloned();
        let known = self.our_hook(group).cloned();
        if ours != known {
            tracing::info!(group = %group.asg.name, was = ?known, now = ?ours, "the group's lifecycle hook changed; using what AWS says now");
            if let Some(p) = &self.provider {
                p.note_hooks(&group.asg.name, hooks.clone());
            }
        }
        let mut fresh = group.clone();
        fresh.hooks = hooks;
        Ok(fresh)
    }

    /// True the first time a foreign hook of a group is noted.
    pub(crate) fn note_foreign_hook(&self, group: &str, hook: &str) -> bool {
        self.note_once("foreign hook", format!("{group}/{hook}"))
    }

    /// True the first time `(kind, key)` is noted.
    pub(crate) fn note_once(&self, kind: &'static str, key: String) -> bool {
        self.book.note_once(kind, key)
    }

    /// The group's EC2_INSTANCE_TERMINATING hook named `hookName`. Another tool's
    /// hook on the group (NTH's, say) is never completed by this service.
    pub fn our_hook<'g>(&self, group: &'g Group) -> Option<&'g crate::cloud::LifecycleHook> {
        group
            .hooks
            .iter()
            .find(|h| h.name == self.settings.hook_name)
    }

    /// Finds the Node of an instance for a drain: the cache when it knows it, else
    /// the API server. `Ok(None)` only when the API server said no Node is the
    /// instance's; `Err` when nobody could tell.
    pub async fn find_node(
        &self,
        instance_id: &str,
        name: Option<&str>,
    ) -> Result<Option<String>, kube::Error> {
        self.stage().find_node(instance_id, name).await
    }
}

impl Engine {
    /// What the last stage may reach of this engine ([`terminate::Ending`]).
    pub fn ending(self: &Arc<Self>) -> terminate::Ending {
        terminate::Ending {
            cloud: self.cloud.clone(),
            provider: self.provider.clone(),
            hook_name: self.settings.hook_name.clone(),
            port: self.clone(),
        }
    }
}

impl Engine {
    /// What the stage list's runner may reach of this engine ([`port::Runner`]).
    fn runner(self: &Arc<Self>) -> port::Runner<'_> {
        port::Runner {
            stage: self.stage(),
            ending: self.ending(),
            port: self,
        }
    }
}

/// The runner's way into the engine: its slots, its book's holds and memories.
#[async_trait::async_trait]
impl port::DrainPort for Arc<Engine> {
    fn has_slot(&self, instance_id: &str, run: u64) -> bool {
        self.book.has_slot(instance_id, run)
    }

    async fn take_slot(&self, instance_id: &str, run: u64) -> bool {
        let Ok(permit) = self.slots.clone().acquire_owned().await else {
            return false;
        };
        self.book.keep_slot(instance_id, run, permit);
        true
    }

    fn give_back_slot(&self, instance_id: &str, run: u64) {
        self.book.give_back_slot(instance_id, run);
    }

    fn drains_at_once(&self) -> usize {
        Engine::drains_at_once(self)
    }

    fn hold(&self, action: &LifecycleAction, timeout: Duration) {
        Engine::hold(self, action, timeout);
    }

    fn held_timeout(&self, instance_id: &str) -> Option<Duration> {
        Engine::held_timeout(self, instance_id)
    }

    fn release(&self, instance_id: &str) {
        Engine::release(self, instance_id);
    }

    async fn hook_timeout_now(&self, group: &str) -> Option<Duration> {
        Engine::hook_timeout_now(self, group).await
    }

    async fn confirm_finished(&self, group: &str, instance_id: &str) -> Verdict {
        keeper::confirm_finished_on_node(self, group, instance_id).await
    }
}

#[async_trait::async_trait]
impl terminate::EndPort for Engine {
    fn may_end(&self) -> bool {
        self.is_leader()
    }

    async fn turn(&self, instance_id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        self.end_turn(instance_id).await
    }

    fn action_done(&self, instance_id: &str) {
        self.note_action_done(instance_id);
    }

    async fn ask_hold(&self, group: &str, instance_id: &str) -> crate::scalein::holds::Hold {
        keeper::ask_hold(self, group, instance_id).await
    }

    async fn hooks_now(&self, group: &Group) -> Result<Group, ProviderError> {
        self.with_current_hooks(group).await
    }

    async fn say(&self, node: &str, reason: events::Reason, text: String) {
        self.events.node(node, reason, text).await;
    }
}

/// One drain from its first try to its outcome: tried again while our hook holds
/// the instance, stopped where it is when this replica loses the Lease, counted.
async fn drain_task(engine: Arc<Engine>, req: DrainRequest, run: u64) -> Outcome {
    let lost_lease = engine.leadership();
    // A replica that loses the Lease stops its drains where they are, at once: not
    // when its lifecycle loop next wakes (a scan stuck on a slow AWS call would leave
    // them evicting, deleting at deadlines and uncordoning beside the new leader,
    // which resumes them).
    // The lost Lease first: a drain that would take a step at the very instant the
    // Lease is lost does not.
    let outcome = tokio::select! {
        biased;
        () = leader::lost(lost_lease) => {
            tracing::warn!(instance = %req.instance_id, "this replica lost the Lease: the drain stops where it is; the new leader resumes it");
            Outcome::Failed("this replica lost the Lease; the new leader resumes the drain".into())
        }
        outcome = drain_while_held(&engine, &req, run) => outcome,
    };
    count(&engine, &outcome);
    outcome
}

/// Runs the drain; one that failed while our hook holds the instance is tried again
/// promptly, heartbeats going on, instead of waiting for the next scan: the hook's
/// timeout would end the instance undrained. The drain takes one of
/// `maxConcurrentDrains` slots once its node is cordoned and marked.
async fn drain_while_held(engine: &Arc<Engine>, req: &DrainRequest, run: u64) -> Outcome {
    let mut retry = HELD_RETRY;
    loop {
        let outcome = drain::run(&engine.runner(), req, run).await;
        match &outcome {
            Outcome::Failed(why) if engine.holds_hook(&req.instance_id) => {
                tracing::warn!(instance = %req.instance_id, error = %why, ?retry, "drain failed while our hook holds the instance; retrying");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(Duration::from_secs(60));
            }
            _ => return outcome,
        }
    }
}

/// A drain's outcome in the engine's counters and the metrics.
fn count(engine: &Engine, outcome: &Outcome) {
    let (counter, label) = match outcome {
        Outcome::Ended => (&engine.stats.ended, "ended"),
        Outcome::Drained => (&engine.stats.ended, "drained"),
        Outcome::Abandoned(_) => (&engine.stats.abandoned, "abandoned"),
        Outcome::Failed(_) => (&engine.stats.failed, "failed"),
        // Dry runs go through `observe`, never here.
        Outcome::Observed(_) => (&engine.stats.ended, "observed"),
    };
    counter.fetch_add(1, Ordering::Relaxed);
    Metrics::outcome(&metrics().drains_finished, label);
}
