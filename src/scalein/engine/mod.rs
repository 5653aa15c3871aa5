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
use crate::scalein::kube::{budgets, events, fence, nodes, pass, ratelimit, user_agent};
use crate::scalein::stages::{drain, evict, port, preview, terminate, Stage};
use crate::scalein::{DrainRequest, Mode, ModeChoice, Outcome, ScaleInSettings, Start};

pub use crate::scalein::stats::DrainStats;

pub mod book;
pub mod ca_hold;
pub mod gate;
pub mod keeper;
pub mod leader;
pub mod marks_sync;
pub mod schedule;
use crate::cloud::{Cloud, LifecycleAction};
use crate::provider::{Group, Provider, ProviderError};
use crate::telemetry::metrics::{metrics, Metrics};

/// Between a failed drain and its retry while our hook holds the instance.
const HELD_RETRY: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a drain given its slot waits, at most, for the drains asked for beside
/// it to cordon their nodes before it evicts (one try each: a cordon refused is
/// retried by its own drain, not waited for). A cordon is one read and one write.
const CORDONS_FIRST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs drains: at most one per instance, as many at once as the disruption budgets
/// allow ([`gate`]), all sharing one API rate limit.
pub struct Engine {
    /// What drains and the sources' loops work with on the Kubernetes side.
    pub tools: Tools,
    pub(crate) cloud: Arc<dyn Cloud>,
    pub(crate) provider: Option<Arc<Provider>>,
    pub(crate) settings: ScaleInSettings,
    /// The disruption budgets' gate (`maxConcurrentDrains` among them), passed by
    /// a drain after its cordon, for its stages.
    pub(crate) gate: gate::Gate,
    /// Which drains run, which actions are held or over, what was said once.
    pub book: Book,
    /// Whether this replica may act now, and the election that says so.
    pub leadership: leader::Leadership,
    /// When the sources' loop takes its next turn (only the sources use it).
    pub schedule: schedule::ScanSchedule,
    /// Feeds the provider's accounting with the drain marks on Nodes.
    marks_sync: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Tells CA which nodes a budget holds from its scale-down ([`ca_hold`]).
    ca_hold: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// What the engine's drains and the sources' loops work with: the API clients and
/// what is read or said through them, the counters, the loops' turns.
pub struct Tools {
    pub(crate) client: kube::Client,
    /// The same, for what a caller waits for within its deadline (DeleteNodes
    /// marking its Node): ahead of the drains in the rate limit.
    pub(crate) answer_client: kube::Client,
    pub events: events::Events,
    pub nodes: nodes::NodeIndex,
    /// Watches of the pods of budgets that refused an eviction.
    pub budgets: budgets::BudgetWatches,
    /// Evictions this process asked for, so a restarted drain does not ask again.
    pub(crate) evictions: Arc<evict::Ledger>,
    /// What drains running together read once for all of them.
    pub passes: pass::Passes,
    pub stats: DrainStats,
    /// The background loops' turns, for `/healthz`.
    pub liveness: Arc<crate::telemetry::liveness::Liveness>,
    /// What the last mile read of the load balancers lately, shared by drains.
    pub sightings: Arc<crate::scalein::stages::last_mile::Sightings>,
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
        let leadership = leader::Leadership::new(lease_client);
        let client = user_agent::named(client, user_agent::DRAIN);
        // CA's answers mark Nodes for the leader on any replica; the drains and the
        // loops write only while this one leads, asked after the rate limit's wait.
        let answer_client =
            ratelimit::limited_client(client.clone(), limiter.clone(), ratelimit::Priority::Answer);
        let acting = leadership.acting();
        let client = fence::fenced(client, Arc::new(move || acting.now()));
        let pod_event_client =
            ratelimit::limited_client(client.clone(), limiter.clone(), ratelimit::Priority::Spare);
        let client = ratelimit::limited_client(client, limiter.clone(), ratelimit::Priority::Drain);
        let nodes = nodes::NodeIndex::start(client.clone());
        let liveness = Arc::new(crate::telemetry::liveness::Liveness::default());
        let marks_sync = provider
            .as_ref()
            .map(|p| spawn_marks_sync(&nodes, Arc::downgrade(p), liveness.clone()));
        let tools = Tools {
            budgets: budgets::BudgetWatches::new(client.clone()),
            evictions: Arc::default(),
            passes: pass::Passes::new(client.clone(), settings.shared_pod_watch_from),
            events: events::Events::new(client.clone(), pod_event_client, Some(limiter)),
            nodes,
            client,
            answer_client,
            stats: DrainStats::default(),
            liveness,
            sightings: Arc::default(),
        };
        let has_groups = provider.is_some();
        let engine = Arc::new(Self {
            tools,
            marks_sync: Mutex::new(marks_sync),
            ca_hold: Mutex::new(None),
            cloud,
            provider,
            settings,
            gate: gate::Gate::default(),
            book: Book::default(),
            leadership,
            schedule: schedule::ScanSchedule::default(),
        });
        if has_groups {
            *engine.ca_hold.lock() = Some(ca_hold::spawn(Arc::downgrade(&engine)));
        }
        engine
    }

    pub fn settings(&self) -> &ScaleInSettings {
        &self.settings
    }

    /// Starts leader election when configured ([`leader::Leadership::elect`]).
    pub fn elect_leader(&self) {
        self.leadership.elect(&self.settings, &self.tools.liveness);
    }

    /// Runs the election for the Lease `lease` names and follows it; [`Self::step_down`]
    /// ends it. Returns the election's task (a test aborts it to play a process that
    /// died).
    pub fn lead_as(&self, lease: leader::LeaseSettings) -> tokio::task::JoinHandle<()> {
        self.leadership.lead_as(&self.tools.liveness, lease)
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
        self.leadership.stop_acting();
        self.abort_all();
        self.leadership.release().await;
    }

    /// Whether this replica may drain: always, unless leader election says otherwise
    /// or it is stepping down.
    pub fn is_leader(&self) -> bool {
        self.leadership.leads()
    }

    /// The plan settings of [`record::DrainRecord::plan`] for a drain of no known
    /// group: the cluster's.
    pub fn limits(&self) -> record::Limits {
        self.settings.limits()
    }

    /// What a drain of an instance of `group` begins with
    /// ([`ScaleInSettings::limits_for`]), the group's tags read from the provider's
    /// registry (none known: only overrides by name select it).
    pub fn limits_for(&self, group: &str, hook_heartbeat: Option<Duration>) -> record::Limits {
        self.settings
            .limits_for(group, &self.group_tags(group), hook_heartbeat)
    }

    /// The group's tags as the provider's registry has them (none known: only
    /// overrides by name select it).
    fn group_tags(&self, group: &str) -> std::collections::BTreeMap<String, String> {
        self.provider
            .as_ref()
            .and_then(|p| p.registry().group(group).map(|g| g.asg.tags.clone()))
            .unwrap_or_default()
    }

    /// [`Self::limits_for`] the request's group, with its hook's heartbeat timeout
    /// when our hook holds it.
    pub fn limits_of(&self, req: &DrainRequest) -> record::Limits {
        let heartbeat = match &req.mode {
            Mode::Lifecycle {
                heartbeat_timeout, ..
            } => Some(*heartbeat_timeout),
            _ => None,
        };
        self.limits_for(&req.group, heartbeat)
    }

    /// What a stage of a drain may reach ([`Stage`]): the pieces that work on one
    /// node, not the engine, its book of drains or its slots.
    pub fn stage(&self) -> Stage<'_> {
        let t = &self.tools;
        Stage {
            client: &t.client,
            settings: &self.settings,
            nodes: &t.nodes,
            passes: &t.passes,
            evictions: &t.evictions,
            budgets: &t.budgets,
            events: &t.events,
            stats: &t.stats,
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
        let limits = self.limits_of(&req);
        self.book.start(req, limits, |req, how, run, marking| {
            if how == Start::Started {
                self.tools.stats.started.fetch_add(1, Ordering::Relaxed);
                metrics().drains_started.inc();
            }
            tokio::spawn(drain_task(self.clone(), req, run, marking))
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
        self.book.held_timeout(instance_id).is_some()
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

    /// The dry run's `start`: describes the drain once per instance (a lifecycle
    /// action seen on every poll is described the first time), in the background.
    fn observe(self: &Arc<Self>, req: DrainRequest) -> bool {
        if !self
            .book
            .note_once("dry-run drain", req.instance_id.clone())
        {
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

    /// The instance stopped or ended (EC2's state-change notice): its drain stops
    /// where it is, and the reasons that only drained it are recorded done on its
    /// Node ([`record::DrainRecord::instance_left`]), or the next poll would resume
    /// what was stopped. Returns whether a drain ran or a reason was closed; an
    /// error when the Node could not be read or written (the notice is then tried
    /// again). EC2 sends these notices for every instance of the account: only a
    /// Node this replica drains, or whose cached record holds such a reason, is
    /// read from the API server.
    pub async fn instance_left(&self, instance_id: &str) -> Result<bool, kube::Error> {
        let stopped = self.book.stop(instance_id);
        let Some(node) = self.tools.nodes.node_for_instance(instance_id) else {
            return Ok(stopped);
        };
        let closes = self
            .cached_record(&node)
            .is_some_and(|mut r| r.instance_left(crate::clock::utc_now()));
        if !(stopped || closes) {
            return Ok(false);
        }
        crate::scalein::kube::node_record::update_record(
            &self.tools.nodes,
            &self.tools.client,
            &node,
            |r| r.instance_left(crate::clock::utc_now()),
        )
        .await?;
        Ok(true)
    }

    /// Whether the instance's Node (as the cache has it) records our hook's action
    /// as completed ([`record::DrainRecord::lifecycle_completed`]); remembered from
    /// then on, as if this process had completed it.
    pub fn action_done_on_node(&self, instance_id: &str) -> bool {
        let done = self
            .tools
            .nodes
            .node_for_instance(instance_id)
            .and_then(|n| self.cached_record(&n))
            .is_some_and(|r| r.lifecycle_completed(crate::clock::utc_now()));
        if done {
            self.book.note_action_done(instance_id);
        }
        done
    }

    /// The drain record on the Node `node` as the cache has it.
    pub fn cached_record(&self, node: &str) -> Option<record::DrainRecord> {
        let n = self.tools.nodes.cached(node)?;
        crate::scalein::kube::node_record::record_of(n.metadata.annotations.as_ref()?)
    }

    /// The drain starts this replica counted for the budgets' rates (its own, not
    /// those it inherited), oldest first: for tests and models.
    pub fn recent_starts(
        &self,
    ) -> Vec<(
        chrono::DateTime<chrono::Utc>,
        crate::scalein::decide::budget::Placed,
        String,
    )> {
        self.gate.recent_starts()
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
        self.tools.nodes.stop();
        if let Some(t) = self.marks_sync.lock().take() {
            t.abort();
        }
        if let Some(t) = self.ca_hold.lock().take() {
            t.abort();
        }
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
            last_mile: crate::scalein::stages::last_mile::LastMile {
                settings: self.settings.load_balancers,
                dry_run: self.settings.dry_run,
                sightings: self.tools.sightings.clone(),
            },
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

    async fn take_slot(
        &self,
        req: &DrainRequest,
        node: &str,
        record: &record::DrainRecord,
        run: u64,
    ) -> bool {
        gate::take_slot(self, req, node, record, run).await
    }

    fn give_back_slot(&self, instance_id: &str, run: u64) {
        self.book.give_back_slot(instance_id, run);
    }

    fn marked(&self, run: u64) {
        self.book.marked(run);
    }

    async fn cordons_first(&self, run: u64) -> usize {
        self.book.cordons_first(run, CORDONS_FIRST_WAIT).await
    }

    fn drains_at_once(&self) -> usize {
        self.book.running()
    }

    fn limits_of(&self, req: &DrainRequest) -> record::Limits {
        Engine::limits_of(self, req)
    }

    fn hold(&self, action: &LifecycleAction, timeout: Duration) {
        Engine::hold(self, action, timeout);
    }

    fn held_timeout(&self, instance_id: &str) -> Option<Duration> {
        self.book.held_timeout(instance_id)
    }

    fn release(&self, instance_id: &str) {
        self.book.release(instance_id);
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
        self.book.end_turn(instance_id).await
    }

    fn action_done(&self, instance_id: &str) {
        self.book.note_action_done(instance_id);
    }

    async fn ask_hold(&self, group: &str, instance_id: &str) -> crate::scalein::holds::Hold {
        keeper::ask_hold(self, group, instance_id).await
    }

    async fn hooks_now(&self, group: &Group) -> Result<Group, ProviderError> {
        self.with_current_hooks(group).await
    }
}

/// What the wait for the load balancers reaches of the engine.
#[async_trait::async_trait]
impl crate::scalein::stages::last_mile::WaitPort for Engine {
    async fn say(&self, node: &str, reason: events::Reason, text: String) {
        self.tools.events.node(node, reason, text).await;
    }

    fn held_since(
        &self,
        instance_id: &str,
        node: Option<&str>,
    ) -> Option<(crate::clock::Instant, Duration)> {
        let (seen, timeout) = self.book.held_since(instance_id)?;
        let recorded_ago = node
            .and_then(|n| self.cached_record(n))
            .and_then(|r| r.hold_began())
            .map(|at| (crate::clock::utc_now() - at).to_std().unwrap_or_default());
        let began =
            crate::scalein::decide::last_mile::hold_began(seen, recorded_ago, crate::clock::now());
        Some((began, timeout))
    }

    fn deregisters(&self, group: &str) -> bool {
        self.settings.deregisters(group, &self.group_tags(group))
    }

    async fn note_wait(
        &self,
        node: &str,
        waiting: Option<&crate::scalein::decide::last_mile::Waiting>,
    ) {
        use crate::scalein::decide::last_mile::ANNOTATION;
        use crate::scalein::kube::node_record::{read_modify_write, Write};
        let value = waiting.map(|w| w.to_json());
        let written = read_modify_write(&self.tools.nodes, &self.tools.client, node, |n| {
            let now = n
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION));
            if now == value.as_ref() {
                return Write::Keep(());
            }
            let patch = serde_json::json!({"metadata": {"annotations": {ANNOTATION: value}}});
            Write::Patch(patch, ())
        })
        .await;
        if let Err(e) = written {
            tracing::debug!(node, error = %e, "could not note the wait for the load balancers on the Node; status will not show it");
        }
    }
}

/// One drain from its first try to its outcome: tried again while our hook holds
/// the instance, stopped where it is when this replica loses the Lease, counted.
/// `_marking`: the run's place among those not yet past their first cordon, held
/// until the run says it is past it, or ends.
async fn drain_task(
    engine: Arc<Engine>,
    req: DrainRequest,
    run: u64,
    _marking: book::MarkingRun,
) -> Outcome {
    let lost_lease = engine.leadership.receiver();
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
    // The run is over: its slot goes back, also one it took over from the run it
    // replaced (a reason joining) but ended before its own slot step (a refused
    // cordon), which no guard of its own holds. A no-op when a newer run holds it.
    engine.book.give_back_slot(&req.instance_id, run);
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
        Outcome::Ended => (&engine.tools.stats.ended, "ended"),
        Outcome::Drained => (&engine.tools.stats.ended, "drained"),
        Outcome::Abandoned(_) => (&engine.tools.stats.abandoned, "abandoned"),
        Outcome::Failed(_) => (&engine.tools.stats.failed, "failed"),
        // Dry runs go through `observe`, never here.
        Outcome::Observed(_) => (&engine.tools.stats.ended, "observed"),
    };
    counter.fetch_add(1, Ordering::Relaxed);
    Metrics::outcome(&metrics().drains_finished, label);
}
