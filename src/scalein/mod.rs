//! Scale-in: the drain that ends a node safely, one module per stage, like Karpenter's
//! termination controller.
//!
//! - [`cordon`]: mark the node (unschedulable, our taint, LB exclusion, start time);
//! - [`evict`]: Eviction API with PDB-aware retry;
//! - [`wait`]: one watch per draining node tells when pods are gone;
//! - [`volumes`]: wait for the node's VolumeAttachments to detach;
//! - [`terminate`]: CompleteLifecycleAction or TerminateInstanceInAutoScalingGroup;
//! - [`lifecycle`]: find instances in `Terminating:Wait`, heartbeat, resume after restart;
//! - [`drain`]: runs the stages in order for one node;
//! - [`plan`]: the pure decisions (which pod in which tier).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::Deserialize;

use crate::cloud::{AsgInstance, Cloud, LifecycleAction};
use crate::provider::{Group, Provider, ProviderError, Removal, ScaleIn};
use crate::telemetry::metrics::{metrics, Metrics};

pub mod budgets;
pub mod cordon;
pub mod drain;
pub mod dry_run;
pub mod events;
pub mod evict;
pub mod hooks;
pub mod intercept;
pub mod leader;
pub mod lifecycle;
pub mod nodes;
pub mod pass;
pub mod permissions;
pub mod plan;
pub mod ratelimit;
pub mod record;
pub mod terminate;
pub mod user_agent;
pub mod volumes;
pub mod wait;

/// The Kubernetes client the engine uses: in-cluster config or KUBECONFIG, with the
/// client's own retry of 429/503 turned off. kube-rs retries those by default (up to
/// 15 times, backing off to minutes), which would hide a PodDisruptionBudget's
/// refusal inside one eviction call instead of letting the drain wait, event and
/// honour its deadline.
pub async fn kube_client() -> anyhow::Result<kube::Client> {
    let mut cfg = kube::Config::infer().await.map_err(|e| {
        anyhow::anyhow!("cannot configure the Kubernetes client (in-cluster or KUBECONFIG): {e}")
    })?;
    cfg.default_retry = false;
    kube::Client::try_from(cfg)
        .map_err(|e| anyhow::anyhow!("cannot build the Kubernetes client: {e}"))
}

/// Which scale-in mode a group uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ModeChoice {
    /// Lifecycle mode when the ASG has an EC2_INSTANCE_TERMINATING hook, else direct.
    #[default]
    Auto,
    Direct,
}

/// What to do with DaemonSet pods after the workloads are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DaemonSetPolicy {
    /// Evict them, gracefully, after every workload pod has exited.
    #[default]
    EvictLast,
    /// Leave them running; they end with the instance.
    Keep,
}

/// What happens when a phase's deadline passes.
///
/// In lifecycle mode both hook results end the instance, so a deadline there always
/// proceeds: giving up could not keep the node, only skip the DaemonSet phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeadlinePolicy {
    /// Go on: workload pods still there are deleted with their own grace period
    /// (the instance ends anyway), DaemonSet pods follow once they are gone, then
    /// volumes, then the instance ends.
    Proceed,
    /// Direct mode: stop the drain and give the node back (uncordoned, our taint and
    /// CA's ToBeDeletedByClusterAutoscaler removed, CA's target counts it again).
    Abandon,
}

impl DeadlinePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Proceed => "proceed",
            Self::Abandon => "abandon",
        }
    }
}

/// Scale-in configuration.
#[derive(Debug, Clone)]
pub struct ScaleInSettings {
    pub mode: ModeChoice,
    /// Put an EC2_INSTANCE_TERMINATING hook on groups that lack one.
    pub create_hook: bool,
    pub hook_name: String,
    pub hook_heartbeat_timeout: Duration,
    pub daemonsets: DaemonSetPolicy,
    pub workload_deadline: Duration,
    pub workload_deadline_policy: DeadlinePolicy,
    pub daemonset_deadline: Duration,
    pub daemonset_deadline_policy: DeadlinePolicy,
    pub volume_deadline: Duration,
    /// Wait between evictions a PodDisruptionBudget refused (kubectl uses 5 s).
    pub eviction_retry: Duration,
    pub max_concurrent_drains: usize,
    /// Kubernetes API requests per second across all drains, and the burst.
    pub api_qps: f64,
    pub api_burst: u32,
    /// How often AWS is checked for instances in Terminating:Wait.
    pub lifecycle_poll_interval: Duration,
    /// With more than one replica: drain only on the holder of a Lease.
    pub leader_election: bool,
    pub lease_name: String,
    /// `None`: POD_NAMESPACE, then kube-system.
    pub lease_namespace: Option<String>,
    pub lease_duration: Duration,
    /// A pod still terminating this long after its grace period ended is stuck and
    /// no longer waited for (Karpenter's rule: one minute).
    pub stuck_after: Duration,
    /// `serve --dry-run`: drains are described (Event + log), never run.
    pub dry_run: bool,
    /// DaemonSets that leave after the volume detach, besides critical-priority ones.
    pub node_critical: plan::NodeCritical,
    /// After a budget's 429, retry when its pods change, not only at the fixed
    /// interval. Always on; off only in `loadgen --drain-floor`'s "before" runs.
    pub budget_watch: bool,
    /// From this many drains at once they share one watch of every pod instead of
    /// one watch of its node's pods each (0: never).
    pub shared_pod_watch_from: usize,
}

impl Default for ScaleInSettings {
    fn default() -> Self {
        Self {
            mode: ModeChoice::Auto,
            create_hook: false,
            hook_name: "ca-asg-provider-drain".into(),
            hook_heartbeat_timeout: Duration::from_secs(300),
            daemonsets: DaemonSetPolicy::EvictLast,
            workload_deadline: Duration::from_secs(10 * 60),
            workload_deadline_policy: DeadlinePolicy::Abandon,
            daemonset_deadline: Duration::from_secs(2 * 60),
            daemonset_deadline_policy: DeadlinePolicy::Proceed,
            volume_deadline: Duration::from_secs(2 * 60),
            eviction_retry: Duration::from_secs(5),
            max_concurrent_drains: 50,
            api_qps: 50.0,
            api_burst: 100,
            // 200 hooked groups cost 24 DescribeAutoScalingGroups a minute at 5 s
            // (one per 100 groups per scan; tests/interruption.rs counts it): on the
            // account's one shared Auto Scaling bucket, whose size AWS does not publish,
            // about what CA's in-tree provider spends re-reading its groups. A held
            // instance is found 2.5 s after it is held on average instead of 7.5 s.
            lifecycle_poll_interval: Duration::from_secs(5),
            leader_election: false,
            lease_name: "ca-asg-provider".into(),
            lease_namespace: None,
            lease_duration: Duration::from_secs(15),
            stuck_after: Duration::from_secs(60),
            dry_run: false,
            node_critical: plan::NodeCritical::default(),
            budget_watch: true,
            // A lone drain's own watch is two requests the API server answers from
            // its index by node; the shared one lists every pod and keeps them. Ten
            // drains at once save twenty requests for that list: a storm, not an
            // everyday scale-in of a few nodes.
            shared_pod_watch_from: 10,
        }
    }
}

/// How the instance ends once the node is drained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// The ASG holds the instance in Terminating:Wait; finish with CONTINUE.
    Lifecycle {
        action: LifecycleAction,
        heartbeat_timeout: Duration,
    },
    /// No hook: terminate with decrement once drained.
    Direct,
    /// `drain NODE` from the command line: drain only, the instance is left alone.
    DrainOnly,
}

impl Mode {
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Lifecycle { .. } => "lifecycle",
            Mode::Direct => cordon::DIRECT_MARK,
            Mode::DrainOnly => cordon::DRAIN_ONLY_MARK,
        }
    }
}

/// Who asked for the drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    ClusterAutoscaler,
    /// The ASG started the termination (policy, rebalancing, refresh, a person).
    Asg,
    /// Found half-done after a restart.
    Resume,
    Cli,
    /// An EC2 interruption notice from the queue (spot, rebalance, scheduled change).
    Interruption,
}

#[derive(Debug, Clone)]
pub struct DrainRequest {
    pub instance_id: String,
    pub group: String,
    /// The Node's name when known; otherwise found by providerID.
    pub node_name: Option<String>,
    pub mode: Mode,
    pub source: Source,
    /// The reasons this request brings (recorded on the Node with every reason
    /// already there). Empty: a resumed drain, which follows what the Node says.
    pub reasons: Vec<record::DrainReason>,
    /// The notice that asked for the drain (queue mode): its kind and AWS's time,
    /// for the time from notice to the instance's end.
    pub noticed: Option<(&'static str, chrono::DateTime<chrono::Utc>)>,
}

/// How a drain ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The instance was ended (or its lifecycle action completed).
    Ended,
    /// Drain-only finished (CLI).
    Drained,
    Abandoned(String),
    Failed(String),
    /// `serve --dry-run`: what the drain would have done; nothing was.
    Observed(String),
}

/// Counters for metrics and tests.
#[derive(Debug, Default)]
pub struct DrainStats {
    pub started: AtomicU64,
    pub ended: AtomicU64,
    pub abandoned: AtomicU64,
    pub failed: AtomicU64,
    pub deadlines_hit: AtomicU64,
    pub evictions_ok: AtomicU64,
    pub evictions_pdb_blocked: AtomicU64,
    /// Tries held back because the budget's cached status allowed none (no request).
    pub evictions_held: AtomicU64,
    /// Tries sent although the budget's cached status allowed none: it had not
    /// changed for `evictionRetryInterval` (a stopped disruption controller).
    pub evictions_forced: AtomicU64,
    pub evictions_error: AtomicU64,
    pub heartbeats: AtomicU64,
}

/// Finished drains are kept (for [`Engine::wait_for`]) until this many are known.
const FINISHED_KEPT: usize = 10_000;

/// A drain task and what it was started with (its reasons joined so far).
struct Inflight {
    handle: tokio::task::JoinHandle<Outcome>,
    req: DrainRequest,
}

/// What [`Engine::start`] did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// A new drain runs.
    Started,
    /// A drain ran; the request's reasons changed its plan, so it goes on with them.
    Joined,
    /// A drain runs whose plan the request does not change (a duplicate).
    Unchanged,
    /// Not started: dry run already described it, or this replica does not lead.
    Refused,
}

impl Start {
    /// Whether the request now drives a drain (new or joined).
    pub fn acted(self) -> bool {
        matches!(self, Start::Started | Start::Joined)
    }
}

/// Records a drain task, forgetting finished ones once [`FINISHED_KEPT`] are known.
fn track(inflight: &mut HashMap<String, Inflight>, id: String, drain: Inflight) {
    if inflight.len() >= FINISHED_KEPT {
        inflight.retain(|_, f| !f.handle.is_finished());
    }
    inflight.insert(id, drain);
}

/// A number in [0, 1) from a fresh random source per call (no dependency): it spreads
/// retries and heartbeats, so many drains do not act in lockstep.
pub(crate) fn random_fraction() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The heartbeats of one lifecycle action, and the hook's heartbeat timeout they
/// follow (a changed timeout reschedules them).
struct Hold {
    task: drain::AbortOnDrop,
    timeout: tokio::sync::watch::Sender<Duration>,
}

/// Between a failed drain and its retry while our hook holds the instance.
const HELD_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs drains: at most one per instance, at most `max_concurrent_drains` at once,
/// all sharing one API rate limit.
pub struct Engine {
    pub(crate) client: kube::Client,
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
    inflight: Mutex<HashMap<String, Inflight>>,
    /// Heartbeats of the lifecycle actions our hook holds, by instance: they follow
    /// the hook, not the drain (a drain restarted for a new reason, or failed and
    /// retrying, keeps them).
    holds: Mutex<HashMap<String, Hold>>,
    /// Instances whose lifecycle action of our hook this replica completed (or found
    /// complete). AWS keeps such an instance in Terminating:Wait while another hook
    /// (EKS's `Terminate-LC-Hook` on a managed node group) still holds it; the scan
    /// must not take it for a new action and drain it again.
    actions_done: Mutex<HashMap<String, Instant>>,
    /// Feeds the provider's accounting with the drain marks on Nodes.
    marks_sync: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// (kind, key) pairs already said once: another tool's terminating hook, a dry
    /// run's drain or hook.
    noted: Mutex<std::collections::HashSet<(&'static str, String)>>,
    /// Set when leader election runs: whether this replica leads now.
    leadership: std::sync::OnceLock<tokio::sync::watch::Receiver<bool>>,
    /// Tells the leader-election task to release the lease and stop.
    step_down: tokio::sync::watch::Sender<bool>,
    pub stats: DrainStats,
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
        let lease_client = user_agent::named(client.clone(), user_agent::LEASE);
        let client = user_agent::named(client, user_agent::DRAIN);
        let pod_event_client =
            ratelimit::limited_client(client.clone(), limiter.clone(), ratelimit::Priority::Spare);
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
            noted: Mutex::new(Default::default()),
            client,
            cloud,
            provider,
            settings,
            lease_client,
            slots,
            inflight: Mutex::new(HashMap::new()),
            holds: Mutex::new(HashMap::new()),
            actions_done: Mutex::new(HashMap::new()),
            leadership: std::sync::OnceLock::new(),
            step_down: tokio::sync::watch::channel(false).0,
            stats: DrainStats::default(),
            liveness,
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
        let namespace = self
            .settings
            .lease_namespace
            .clone()
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "kube-system".into());
        tracing::info!(lease = %self.settings.lease_name, %namespace, %identity, "leader election: the drain loop runs on the Lease holder");
        self.follow_leadership(leader::spawn(
            self.liveness.clone(),
            self.lease_client.clone(),
            leader::LeaseSettings {
                name: self.settings.lease_name.clone(),
                namespace,
                identity,
                duration: self.settings.lease_duration,
            },
            self.step_down.subscribe(),
        ));
    }

    /// On shutdown: stop leading and release the Lease so another replica takes over
    /// at once (bounded; without an answer the Lease expires by itself).
    pub async fn step_down(&self) {
        self.step_down.send_replace(true);
        if let Some(mut rx) = self.leadership() {
            let _ = tokio::time::timeout(Duration::from_secs(3), async {
                while *rx.borrow_and_update() {
                    if rx.changed().await.is_err() {
                        break;
                    }
                }
            })
            .await;
        }
    }

    /// Whether this replica may drain: always, unless leader election says otherwise.
    pub fn is_leader(&self) -> bool {
        self.leadership.get().is_none_or(|rx| *rx.borrow())
    }

    /// The plan settings of [`record::DrainRecord::plan`].
    pub fn limits(&self) -> record::Limits {
        record::Limits {
            workload_deadline: self.settings.workload_deadline,
            workload_policy: self.settings.workload_deadline_policy,
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
        let mut inflight = self.inflight.lock();
        let (req, how) = match inflight.remove(&req.instance_id) {
            Some(running) if !running.handle.is_finished() => {
                let limits = self.limits();
                let mut joined = record::DrainRecord {
                    reasons: running.req.reasons.clone(),
                };
                // A hook's reason always changes the plan's end, so a lifecycle
                // request never passes as a duplicate of another kind of drain.
                let mut changed = false;
                for r in &req.reasons {
                    changed |= joined.join(r.clone(), limits) == record::Joined::Changed;
                }
                if !changed {
                    inflight.insert(req.instance_id.clone(), running);
                    return Start::Unchanged;
                }
                running.handle.abort();
                tracing::info!(instance = %req.instance_id, source = ?req.source, "a new reason joins the running drain; it goes on with every reason");
                (merge(running.req, req, joined), Start::Joined)
            }
            _ => (req, Start::Started),
        };
        let this = self.clone();
        let id = req.instance_id.clone();
        if how == Start::Started {
            self.stats.started.fetch_add(1, Ordering::Relaxed);
            metrics().drains_started.inc();
        }
        let task_req = req.clone();
        let handle = tokio::spawn(async move {
            let req = task_req;
            let mut retry = HELD_RETRY;
            let outcome = loop {
                // The drain takes one of `maxConcurrentDrains` slots once its node is
                // cordoned and marked (`drain_node`).
                let outcome = drain::run(&this, &req).await;
                // A drain that failed while our hook holds the instance retries
                // promptly, heartbeats going on, instead of waiting for the next
                // scan: the hook's timeout would end the instance undrained.
                match &outcome {
                    Outcome::Failed(why) if this.holds_hook(&req.instance_id) => {
                        tracing::warn!(instance = %req.instance_id, error = %why, ?retry, "drain failed while our hook holds the instance; retrying");
                        tokio::time::sleep(retry).await;
                        retry = (retry * 2).min(std::time::Duration::from_secs(60));
                    }
                    _ => break outcome,
                }
            };
            let (counter, label) = match &outcome {
                Outcome::Ended => (&this.stats.ended, "ended"),
                Outcome::Drained => (&this.stats.ended, "drained"),
                Outcome::Abandoned(_) => (&this.stats.abandoned, "abandoned"),
                Outcome::Failed(_) => (&this.stats.failed, "failed"),
                // Dry runs go through `observe`, never here.
                Outcome::Observed(_) => (&this.stats.ended, "observed"),
            };
            counter.fetch_add(1, Ordering::Relaxed);
            Metrics::outcome(&metrics().drains_finished, label);
            outcome
        });
        track(&mut inflight, id, Inflight { handle, req });
        how
    }

    /// Heartbeats the lifecycle action until it is completed, AWS says it is gone,
    /// or the hook's global limit, at `timeout`: the hook's heartbeat timeout as
    /// read when the hold starts. A second call for the same instance starts nothing
    /// but corrects the timeout when the hook's changed (the heartbeats reschedule).
    pub fn hold(self: &Arc<Self>, action: &crate::cloud::LifecycleAction, timeout: Duration) {
        if self.settings.dry_run {
            return;
        }
        let mut holds = self.holds.lock();
        if let Some(h) = holds
            .get(&action.instance_id)
            .filter(|h| !h.task.0.is_finished())
        {
            let mut was = timeout;
            let changed = h.timeout.send_if_modified(|t| {
                was = std::mem::replace(t, timeout);
                was != timeout
            });
            if changed {
                tracing::info!(instance = %action.instance_id, hook = %action.hook, ?was, now = ?timeout, "the hook's heartbeat timeout changed; heartbeats follow it");
            }
            return;
        }
        if holds.len() >= FINISHED_KEPT {
            holds.retain(|_, h| !h.task.0.is_finished());
        }
        let (tx, rx) = tokio::sync::watch::channel(timeout);
        holds.insert(
            action.instance_id.clone(),
            Hold {
                task: drain::AbortOnDrop(lifecycle::heartbeats(self.clone(), action.clone(), rx)),
                timeout: tx,
            },
        );
    }

    /// Whether our hook's action for the instance is being heartbeated.
    pub fn holds_hook(&self, instance_id: &str) -> bool {
        self.held_timeout(instance_id).is_some()
    }

    /// The heartbeat timeout a held instance is heartbeated at, if it is held.
    pub fn held_timeout(&self, instance_id: &str) -> Option<Duration> {
        self.holds
            .lock()
            .get(instance_id)
            .filter(|h| !h.task.0.is_finished())
            .map(|h| *h.timeout.borrow())
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
        self.holds.lock().remove(instance_id);
    }

    /// The dry run's `start`: describes the drain once per instance (a lifecycle
    /// action seen on every poll is described the first time), in the background.
    fn observe(self: &Arc<Self>, req: DrainRequest) -> bool {
        if !self.note_once("dry-run drain", req.instance_id.clone()) {
            return false;
        }
        let this = self.clone();
        let id = req.instance_id.clone();
        let task_req = req.clone();
        let handle =
            tokio::spawn(
                async move { Outcome::Observed(dry_run::describe(&this, &task_req).await) },
            );
        track(&mut self.inflight.lock(), id, Inflight { handle, req });
        true
    }

    /// Stops the drain of an instance where it is (the instance stopped or ended:
    /// nothing is left to protect). True when one ran.
    pub fn stop_drain(&self, instance_id: &str) -> bool {
        self.release(instance_id);
        match self.inflight.lock().remove(instance_id) {
            Some(f) if !f.handle.is_finished() => {
                f.handle.abort();
                true
            }
            _ => false,
        }
    }

    /// Our hook's lifecycle action for `instance_id` is over (completed by this
    /// replica, or found complete).
    pub(crate) fn note_action_done(&self, instance_id: &str) {
        let mut done = self.actions_done.lock();
        // Bounded: the scan forgets instances AWS no longer shows; past the bound
        // the oldest go (at worst one more drain that finds the action complete).
        if done.len() >= FINISHED_KEPT {
            if let Some(oldest) = done
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(k, _)| k.clone())
            {
                done.remove(&oldest);
            }
        }
        done.insert(instance_id.to_string(), Instant::now());
    }

    /// Whether our hook's lifecycle action for `instance_id` is known to be over.
    pub fn action_done(&self, instance_id: &str) -> bool {
        self.actions_done.lock().contains_key(instance_id)
    }

    /// Forgets the ended actions of instances `keep` says no longer exist.
    pub(crate) fn forget_actions_done(&self, keep: impl Fn(&str) -> bool) {
        self.actions_done.lock().retain(|id, _| keep(id));
    }

    /// Drains asked for and not finished: running, or cordoned and waiting for a slot.
    pub fn drains_at_once(&self) -> usize {
        self.inflight
            .lock()
            .values()
            .filter(|f| !f.handle.is_finished())
            .count()
    }

    pub fn is_draining(&self, instance_id: &str) -> bool {
        self.inflight
            .lock()
            .get(instance_id)
            .is_some_and(|f| !f.handle.is_finished())
    }

    /// Stops every drain where it is, as a crash would (tests; shutdown leaves drains
    /// resumable because their state lives on the Node and in AWS).
    pub fn abort_all(&self) {
        for (_, f) in self.inflight.lock().drain() {
            f.handle.abort();
        }
        self.holds.lock().clear();
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
        self.inflight
            .lock()
            .values()
            .filter(|f| !f.handle.is_finished())
            .count()
    }

    /// Waits for the drain of an instance (tests, the CLI).
    pub async fn wait_for(&self, instance_id: &str) -> Option<Outcome> {
        let f = self.inflight.lock().remove(instance_id)?;
        f.handle.await.ok()
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

    /// [`Self::mode_for`] with the group's hooks read from AWS now, not from a list
    /// up to `hookRefreshInterval` old: terminating through the hook when it was
    /// deleted (or the ASG recreated under the same name without it) would end the
    /// instance undrained. A changed heartbeat timeout takes effect at once. When
    /// AWS cannot be asked, the caller gets an error for CA to retry.
    pub async fn current_mode(
        &self,
        group: &Group,
        instance_id: &str,
    ) -> Result<Mode, ProviderError> {
        let Mode::Lifecycle { .. } = self.mode_for(group, instance_id) else {
            return Ok(Mode::Direct);
        };
        let fresh = self.with_current_hooks(group).await?;
        Ok(self.mode_for(&fresh, instance_id))
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
        let mut noted = self.noted.lock();
        // Bounded: a dry run sees every instance the ASGs ever end. Past the bound the
        // oldest facts are said again, once.
        if noted.len() >= FINISHED_KEPT {
            noted.clear();
        }
        noted.insert((kind, key))
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
        if name.is_none() {
            if let Some(n) = self.nodes.node_for_instance(instance_id) {
                return Ok(Some(n));
            }
        }
        nodes::find_node(&self.client, instance_id, name).await
    }
}

/// The request a joined drain goes on with: every reason, the hook's action (with
/// its token) when either request has it, and what either knew of the Node and the
/// notice.
fn merge(old: DrainRequest, new: DrainRequest, joined: record::DrainRecord) -> DrainRequest {
    let mode = match (&old.mode, &new.mode) {
        (_, Mode::Lifecycle { .. }) => new.mode.clone(),
        (Mode::Lifecycle { .. }, _) => old.mode.clone(),
        (Mode::Direct, _) | (_, Mode::Direct) => Mode::Direct,
        _ => new.mode.clone(),
    };
    DrainRequest {
        group: if new.group.is_empty() {
            old.group
        } else {
            new.group
        },
        node_name: new.node_name.or(old.node_name),
        noticed: new.noticed.or(old.noticed),
        reasons: joined.reasons,
        mode,
        ..new
    }
}

/// Every Node change (and every few seconds, for refreshes that changed which
/// instances are in service) hands the direct-mode drain marks to the provider.
fn spawn_marks_sync(
    nodes: &nodes::NodeIndex,
    provider: std::sync::Weak<Provider>,
    liveness: Arc<crate::telemetry::liveness::Liveness>,
) -> tokio::task::JoinHandle<()> {
    const NAME: &str = "drain-mark sync";
    if let Some(p) = provider.upgrade() {
        p.expect_drain_marks();
    }
    let mut changes = nodes.changes();
    let store = nodes.store();
    let mut ready = nodes.readiness();
    tokio::spawn(async move {
        if ready.wait_for(|r| *r).await.is_err() {
            return;
        }
        loop {
            let Some(p) = provider.upgrade() else {
                liveness.done(NAME);
                return;
            };
            liveness.beat(NAME, Duration::from_secs(60));
            p.sync_direct_drains(nodes::direct_marks(&store));
            drop(p);
            match tokio::time::timeout(Duration::from_secs(2), changes.changed()).await {
                Ok(Ok(())) => {
                    // Coalesce a burst of Node updates into one pass over the Nodes.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    changes.borrow_and_update();
                }
                // The Node watch is gone: keep re-reading its last state slowly.
                Ok(Err(_)) => tokio::time::sleep(Duration::from_secs(2)).await,
                Err(_) => {}
            }
        }
    })
}

/// DeleteNodes through the drain: returns within CA's call timeout, the drain runs
/// in the background. Before it returns, the drain is recorded where a restart, a
/// lost lease or another replica finds it: in AWS (lifecycle mode: the instance is
/// held in Terminating:Wait) or on the Node (direct mode: cordon, taint, marks).
pub struct DrainScaleIn(pub Arc<Engine>);

#[async_trait]
impl ScaleIn for DrainScaleIn {
    async fn remove(
        &self,
        group: &Group,
        instance: &AsgInstance,
        node_name: Option<&str>,
    ) -> Result<Removal, ProviderError> {
        let engine = &self.0;
        let mode = engine.current_mode(group, &instance.id).await?;
        let leader = engine.is_leader();
        let (removal, node) = match &mode {
            Mode::Lifecycle { .. } => {
                // The ASG holds the instance in Terminating:Wait while we drain; a
                // follower leaves the drain to the leader's scan.
                tracing::info!(group = %group.asg.name, instance = %instance.id, leader, "terminating with decrement; the lifecycle hook holds it for the drain");
                engine.cloud.terminate_instance(&instance.id, true).await?;
                (Removal::Decremented, node_name.map(str::to_string))
            }
            _ => match mark_for_drain(engine, group, instance, node_name).await? {
                Some(node) => (Removal::Deferred, Some(node)),
                None => {
                    // The API server says no Node is this instance's: nothing runs
                    // on it, so it ends at once.
                    tracing::info!(group = %group.asg.name, instance = %instance.id, "no Node exists for this instance; terminating with decrement");
                    engine.cloud.terminate_instance(&instance.id, true).await?;
                    metrics().drains_without_node.inc();
                    return Ok(Removal::Decremented);
                }
            },
        };
        if leader {
            let reasons = vec![ca_reason(&mode)];
            engine.start(DrainRequest {
                instance_id: instance.id.clone(),
                group: group.asg.name.clone(),
                node_name: node,
                mode,
                source: Source::ClusterAutoscaler,
                reasons,
                noticed: None,
            });
        } else {
            tracing::info!(group = %group.asg.name, instance = %instance.id, "not the leader: the drain is recorded; the leader runs it");
        }
        Ok(removal)
    }

    async fn preview(
        &self,
        group: &Group,
        instance: &AsgInstance,
        node_name: Option<&str>,
    ) -> String {
        let engine = &self.0;
        dry_run::describe(
            engine,
            &DrainRequest {
                instance_id: instance.id.clone(),
                group: group.asg.name.clone(),
                node_name: node_name.map(str::to_string),
                mode: engine.mode_for(group, &instance.id),
                source: Source::ClusterAutoscaler,
                reasons: Vec::new(),
                noticed: None,
            },
        )
        .await
    }
}

/// The reason CA's scale-in brings in `mode`.
pub fn ca_reason(mode: &Mode) -> record::DrainReason {
    record::DrainReason::new(reason_of_mode(mode), chrono::Utc::now())
}

/// What a drain in `mode` is asked for: our hook's action, CA's direct scale-in, or
/// the drain command.
pub fn reason_of_mode(mode: &Mode) -> record::Why {
    match mode {
        Mode::Lifecycle { action, .. } => record::Why::Lifecycle {
            hook: action.hook.clone(),
        },
        Mode::Direct => record::Why::ScaleIn,
        Mode::DrainOnly => record::Why::DrainCommand,
    }
}

/// Direct mode: cordon and mark the Node before DeleteNodes answers. `Ok(None)`:
/// the API server says there is no Node for the instance. Any doubt is an error
/// for CA to retry, never a termination.
async fn mark_for_drain(
    engine: &Arc<Engine>,
    group: &Group,
    instance: &AsgInstance,
    node_name: Option<&str>,
) -> Result<Option<String>, ProviderError> {
    let unavailable = |e: kube::Error| {
        ProviderError::Unavailable(format!(
            "cannot record the drain of instance {} on its Node: {e}",
            instance.id
        ))
    };
    // CA names the Node: marking it is two requests. Only when that name is gone (or
    // is CA's providerID-shaped name of a node that never registered) is the Node
    // looked for by providerID.
    let mut name = node_name.filter(|n| nodes::is_node_name(n));
    for _ in 0..3 {
        let node = match name.take() {
            Some(n) => n.to_string(),
            None => match engine
                .find_node(&instance.id, None)
                .await
                .map_err(unavailable)?
            {
                Some(n) => n,
                None => return Ok(None),
            },
        };
        let reason = record::DrainReason::new(record::Why::ScaleIn, chrono::Utc::now());
        match cordon::cordon(
            engine,
            &node,
            std::slice::from_ref(&reason),
            &group.asg.name,
        )
        .await
        {
            Ok(cordon::Cordoned::Marked { .. }) => return Ok(Some(node)),
            // Deleted between the lookup and the patch: look again.
            Ok(cordon::Cordoned::NodeGone) => continue,
            Err(e) => return Err(unavailable(e)),
        }
    }
    Err(ProviderError::Unavailable(format!(
        "the Node of instance {} kept disappearing while being marked for drain",
        instance.id
    )))
}
