//! Leader election over a `coordination.k8s.io/v1` Lease, so that with more than one
//! replica the background work (the lifecycle scan and drains) runs in one place while
//! every replica serves gRPC. A replica that is not the leader still answers
//! DeleteNodes: it ends the instance through the hook or marks the Node, and the
//! leader's loop drains it.
//!
//! Why not a crate. The two maintained ones were read against the rules below (2026-11):
//! `kube-leader-election` says of itself that it has no fencing and that candidates
//! compare timestamps (so it depends on the nodes' clocks agreeing), and it builds on an
//! older kube than this crate's; `kube-lease-manager` also judges expiry from the lease's
//! timestamps, with a configured tolerance for skew. The rules this service needs are
//! client-go's: another holder's lease has expired when its record stood still for a
//! whole lease duration *as this replica saw it* (no clock agreement needed), a leader
//! steps down once no renewal succeeded within the renew deadline counted from when the
//! renewal was *sent* (so it stops acting before anyone can take over), a write is a
//! compare-and-swap on resourceVersion, the lease is released on shutdown, and a failing
//! election is reported by `/readyz` with the RBAC to fix. Those rules and their tests
//! (here and in tests/leader.rs) are the point; the code they need is short.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;

#[derive(Debug, Clone, PartialEq)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    /// Who we are in `holderIdentity` (the pod name).
    pub identity: String,
    /// How long a holder that stopped renewing keeps the lease.
    pub duration: Duration,
}

impl LeaseSettings {
    /// How often the holder renews, and others retry (client-go: every 2 s for a 15 s
    /// lease); at most 2 s, so a released lease is taken over quickly.
    pub fn retry_every(&self) -> Duration {
        (self.duration / 5).clamp(Duration::from_millis(100), Duration::from_secs(2))
    }
}

/// What to do with the lease as it is now. Pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No lease object: create it, holding it.
    Create,
    /// Ours: renew it.
    Renew,
    /// Free or expired: take it over (one more transition).
    Acquire,
    /// Someone else holds it and renews it.
    Follow { holder: String },
}

/// What the lease was last seen saying, and when (this replica's monotonic clock).
/// Expiry is judged by local observation, as client-go does: another holder's lease
/// has expired when its record has not changed for a whole lease duration as *we*
/// saw it, whatever its renewTime says. Clocks of two nodes need not agree.
#[derive(Debug, Default, Clone)]
pub struct Observed {
    seen: Option<(String, Option<Timestamp>)>,
    since: Option<crate::clock::Instant>,
    /// Whether the record changed after the first read: its holder is alive.
    changed: bool,
}

impl Observed {
    /// Notes the lease as read now. Returns how long its record has stood unchanged.
    pub fn note(&mut self, spec: Option<&LeaseSpec>) -> Duration {
        let now = crate::clock::Instant::now();
        let record = spec.map(|s| {
            (
                s.holder_identity.clone().unwrap_or_default(),
                s.renew_time.as_ref().map(|t| t.0),
            )
        });
        if record != self.seen || self.since.is_none() {
            self.changed |= self.since.is_some();
            self.seen = record;
            self.since = Some(now);
        }
        now.saturating_duration_since(self.since.unwrap_or(now))
    }
}

impl Observed {
    /// Whether the record changed between two reads: someone writes it.
    pub fn changed(&self) -> bool {
        self.changed
    }
}

/// What `ca-asg-provider drain NODE` does about the Lease. The command is not a replica:
/// it must never drain beside one, and never keep a starting replica from leading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandTurn {
    /// Nobody leads: take the Lease and drain here.
    Take,
    /// A replica leads (it renewed the Lease while the command watched): record the
    /// drain on the Node for it, and follow.
    HandTo(String),
    /// Not known yet: read again.
    Watch,
}

/// How the drain command's holder identity begins: another command holding the Lease
/// drains its own node only, so it is waited for, never handed a drain.
pub const COMMAND_HOLDER_PREFIX: &str = "drain-command-";

/// [`CommandTurn`] for the Lease as read now. Pure. `unchanged_for` and `changed`
/// are [`Observed`]'s. A holder is alive only when seen renewing (timestamps are other
/// clocks'); a Lease released or standing still is taken only after a whole lease
/// duration as the command saw it, so a replica that is starting takes it first.
/// Another drain command renewing it is waited for: it drains only its own node.
pub fn command_turn(
    spec: Option<&LeaseSpec>,
    me: &str,
    unchanged_for: Duration,
    changed: bool,
) -> CommandTurn {
    let Some(spec) = spec else {
        return CommandTurn::Take;
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == me {
        return CommandTurn::Take;
    }
    if !holder.is_empty() && changed {
        if holder.starts_with(COMMAND_HOLDER_PREFIX) {
            return CommandTurn::Watch;
        }
        return CommandTurn::HandTo(holder);
    }
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
    if unchanged_for >= duration {
        CommandTurn::Take
    } else {
        CommandTurn::Watch
    }
}

/// Who drains for the drain command ([`claim_for_command`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The command holds the Lease (renew it with an election under the same identity).
    Ours,
    /// This replica leads and renews the Lease.
    Leader(String),
}

/// Reads the Lease until it is clear who drains: the command itself, holding the
/// Lease, or the replica that renews it. About a lease duration plus a round at most
/// when nobody renews it; as long as another drain command does. `watching` is
/// called once, with the holder then, when the answer is not there at the first
/// read. An error of the API server is returned: nothing was written.
pub async fn claim_for_command(
    api: &Api<Lease>,
    s: &LeaseSettings,
    watching: impl FnOnce(&str),
) -> Result<Claim, kube::Error> {
    let mut observed = Observed::default();
    let mut watching = Some(watching);
    loop {
        let current = api.get_opt(&s.name).await?;
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        let unchanged_for = observed.note(spec);
        match command_turn(spec, &s.identity, unchanged_for, observed.changed()) {
            CommandTurn::HandTo(holder) => return Ok(Claim::Leader(holder)),
            CommandTurn::Take => {
                // The round reads again and writes by compare-and-swap; one that loses
                // to a replica writing first is read again.
                if round(api, s, &mut observed).await? {
                    return Ok(Claim::Ours);
                }
            }
            CommandTurn::Watch => {
                if let Some(say) = watching.take() {
                    say(spec
                        .and_then(|s| s.holder_identity.as_deref())
                        .unwrap_or_default());
                }
            }
        }
        tokio::time::sleep(s.retry_every()).await;
    }
}

/// The Lease of `settings` held as `identity`. Its namespace: `leaseNamespace`, else
/// the pod's (`POD_NAMESPACE`), else kube-system.
pub fn lease_for(settings: &crate::scalein::ScaleInSettings, identity: String) -> LeaseSettings {
    let namespace = settings
        .lease_namespace
        .clone()
        .or_else(|| {
            std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "kube-system".into());
    LeaseSettings {
        name: settings.lease_name.clone(),
        namespace,
        identity,
        duration: settings.lease_duration,
    }
}

/// What to do with the lease. Pure. `unchanged_for`: how long this replica has seen
/// the lease's record stand still ([`Observed::note`]).
pub fn decide(spec: Option<&LeaseSpec>, me: &str, unchanged_for: Duration) -> Decision {
    let Some(spec) = spec else {
        return Decision::Create;
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == me {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::Acquire;
    }
    let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
    if unchanged_for < duration {
        Decision::Follow { holder }
    } else {
        Decision::Acquire
    }
}

fn spec_for(me: &str, s: &LeaseSettings, old: Option<&LeaseSpec>, acquire: bool) -> LeaseSpec {
    let now = MicroTime(crate::clock::timestamp_now());
    let old = old.cloned().unwrap_or_default();
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(s.duration.as_secs().max(1) as i32),
        acquire_time: if acquire {
            Some(now.clone())
        } else {
            old.acquire_time.clone()
        },
        renew_time: Some(now),
        lease_transitions: Some(
            old.lease_transitions.unwrap_or(0)
                + i32::from(acquire && old.holder_identity.is_some()),
        ),
        ..old
    }
}

/// One round: read the lease and act on it. `Ok(true)` when we hold it afterwards.
/// A conflict (someone else wrote first) is a lost round, not an error.
pub async fn round(
    api: &Api<Lease>,
    s: &LeaseSettings,
    observed: &mut Observed,
) -> Result<bool, kube::Error> {
    round_carrying(api, s, observed, None)
        .await
        .map(|(held, _)| held)
}

/// What the leader carries on its Lease besides the lease itself (issue 71: the
/// rates' starts, [`crate::scalein::decide::budget::carried`]): written with every
/// renewal, read back by the replica that takes over. A crash loses what changed
/// since the last renewal (at most the retry period).
#[derive(Default)]
pub struct Carry {
    /// The annotation this replica writes while it leads (`None`: nothing yet, the
    /// Lease's own is left as it is).
    out: parking_lot::Mutex<Option<String>>,
    /// What the Lease carried when this replica last became the leader, until the
    /// gate takes it (`Some(None)`: the Lease carried nothing).
    inherited: parking_lot::Mutex<Option<Option<String>>>,
}

impl Carry {
    /// What to write from the next renewal on.
    pub fn set_out(&self, text: String) {
        *self.out.lock() = Some(text);
    }

    /// What this replica writes with its next renewal.
    pub fn out(&self) -> Option<String> {
        self.out.lock().clone()
    }

    /// This replica became the leader of a Lease that carried `found`.
    pub fn took_over(&self, found: Option<String>) {
        *self.inherited.lock() = Some(found);
    }

    /// What the Lease carried at the last takeover, once.
    pub fn take_inherited(&self) -> Option<Option<String>> {
        self.inherited.lock().take()
    }
}

/// [`round`], writing `carry`'s annotation with the renewal and returning what
/// the Lease carried before it.
async fn round_carrying(
    api: &Api<Lease>,
    s: &LeaseSettings,
    observed: &mut Observed,
    carry: Option<&Carry>,
) -> Result<(bool, Option<String>), kube::Error> {
    use crate::scalein::decide::budget::carried::ANNOTATION;
    let current = api.get_opt(&s.name).await?;
    let found = current
        .as_ref()
        .and_then(|l| l.metadata.annotations.as_ref()?.get(ANNOTATION).cloned());
    let out = carry.and_then(Carry::out);
    let spec = current.as_ref().and_then(|l| l.spec.as_ref());
    let unchanged_for = observed.note(spec);
    let decision = decide(spec, &s.identity, unchanged_for);
    let result = match (&decision, current) {
        (Decision::Follow { .. }, _) => return Ok((false, found)),
        (Decision::Create, _) => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(s.name.clone()),
                    namespace: Some(s.namespace.clone()),
                    annotations: out.map(|o| [(ANNOTATION.to_string(), o)].into()),
                    ..Default::default()
                },
                spec: Some(spec_for(&s.identity, s, None, true)),
            };
            api.create(&PostParams::default(), &lease).await.map(|_| ())
        }
        (Decision::Renew | Decision::Acquire, Some(mut lease)) => {
            let acquire = decision == Decision::Acquire;
            lease.spec = Some(spec_for(&s.identity, s, lease.spec.as_ref(), acquire));
            if let Some(o) = out {
                lease
                    .metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(ANNOTATION.to_string(), o);
            }
            // resourceVersion in the object makes this a compare-and-swap.
            api.replace(&s.name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        }
        (_, None) => return Ok((false, found)),
    };
    match result {
        Ok(()) => {
            if decision == Decision::Acquire || decision == Decision::Create {
                tracing::info!(lease = %s.name, identity = %s.identity, "became the leader");
            }
            Ok((true, found))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok((false, found)),
        Err(e) => Err(e),
    }
}

/// Gives the lease up if we hold it, so another replica takes over at once instead of
/// after the lease expires. `Ok(true)` when it was ours and is released now.
pub async fn release(api: &Api<Lease>, s: &LeaseSettings) -> Result<bool, kube::Error> {
    let Some(mut lease) = api.get_opt(&s.name).await? else {
        return Ok(false);
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(false);
    };
    if spec.holder_identity.as_deref() != Some(s.identity.as_str()) {
        return Ok(false);
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    match api.replace(&s.name, &PostParams::default(), &lease).await {
        Ok(_) => {
            tracing::info!(lease = %s.name, identity = %s.identity, "released the lease");
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// A lease round that has not answered by then counts as failed: a renewal must end
/// well inside the lease, or this replica could still act after another took over
/// (client-go's RenewDeadline is 10 s of a 15 s lease).
pub fn renew_deadline(s: &LeaseSettings) -> Duration {
    (s.duration * 2 / 3).max(Duration::from_millis(100))
}

/// One short line for a failed round: a 403 names the RBAC to apply, other API
/// errors their code and message (never the whole response).
pub fn explain(e: &kube::Error, s: &LeaseSettings) -> String {
    match e {
        kube::Error::Api(st) if st.code == 403 => format!(
            "the Lease {}/{} is forbidden to this service account (403): grant get/create/update on coordination.k8s.io leases in namespace {} (the Role ca-asg-provider there: {}), or set leaseNamespace to where it is granted",
            s.namespace,
            s.name,
            s.namespace,
            crate::scalein::kube::permissions::HOW_TO_GRANT
        ),
        kube::Error::Api(st) => {
            let mut m = st.message.clone();
            m.truncate(200);
            format!("lease {}/{}: {} {}: {m}", s.namespace, s.name, st.code, st.reason)
        }
        other => {
            let mut m = other.to_string();
            m.truncate(200);
            format!("lease {}/{}: {m}", s.namespace, s.name)
        }
    }
}

/// Resolves when this replica stops leading: at once when it does not lead now;
/// never without leader election (`None`). An election that ended (its task gone:
/// aborted, panicked, released) leads no more ([`Acting::now`]).
pub async fn lost(leadership: Option<watch::Receiver<bool>>) {
    let Some(mut rx) = leadership else {
        return std::future::pending().await;
    };
    let _ = rx.wait_for(|leads| !*leads).await;
}

/// Keeps trying to hold the lease until `stop` turns true, then releases it. The
/// receiver says whether we are the leader now. A leader that cannot renew within
/// the renew deadline steps down before its lease could expire for the others, so
/// two replicas never both believe they lead. A failing election is logged once a
/// minute and reported by `/readyz` (through `liveness`'s troubles).
pub fn spawn(
    liveness: std::sync::Arc<crate::telemetry::liveness::Liveness>,
    client: kube::Client,
    s: LeaseSettings,
    stop: watch::Receiver<bool>,
) -> watch::Receiver<bool> {
    spawn_task(liveness, client, s, stop, None).0
}

/// [`spawn`], with the election's task: a test aborts it to play a process that
/// died, without releasing the Lease.
pub fn spawn_task(
    liveness: std::sync::Arc<crate::telemetry::liveness::Liveness>,
    client: kube::Client,
    s: LeaseSettings,
    mut stop: watch::Receiver<bool>,
    carry: Option<std::sync::Arc<Carry>>,
) -> (watch::Receiver<bool>, tokio::task::JoinHandle<()>) {
    const NAME: &str = "leader election";
    let (tx, rx) = watch::channel(false);
    let quiet = (s.retry_every() * 4).max(std::time::Duration::from_secs(60));
    let task = tokio::spawn(async move {
        let api: Api<Lease> = Api::namespaced(client, &s.namespace);
        let mut last_renewed: Option<crate::clock::Instant> = None;
        let mut observed = Observed::default();
        let mut last_logged: Option<(String, crate::clock::Instant)> = None;
        loop {
            liveness.beat(NAME, quiet);
            if *stop.borrow() {
                liveness.done(NAME);
                liveness.trouble(NAME, None);
                // Stop acting before the release can land: from then on another
                // replica may take over, however late the release's answer comes.
                let _ = tx.send(false);
                if let Err(e) = release(&api, &s).await {
                    tracing::warn!(lease = %s.name, error = %explain(&e, &s), "could not release the lease; it expires by itself");
                }
                // The task ends here, closing the channel: whoever waits for that
                // knows the release is done.
                return;
            }
            // A renewal counts from when it was sent, not from its answer: the others
            // may see the record change as early as that, and a slow answer must not
            // stretch this replica's belief that it still leads past their takeover.
            let sent = crate::clock::Instant::now();
            let attempt = tokio::time::timeout(
                renew_deadline(&s),
                round_carrying(&api, &s, &mut observed, carry.as_deref()),
            );
            tokio::pin!(attempt);
            // Leadership ends at the last renewal's send time plus the renew deadline,
            // whatever this round is still waiting for: the others may take over from
            // then on.
            let answer = loop {
                // Branches in a fixed order (here and below): the deadline first, so
                // an answer arriving at the deadline's very instant still finds this
                // replica stepped down, and a case on a paused clock replays.
                tokio::select! {
                    biased;
                    _ = until(leads_until(&tx, last_renewed, &s)) => {
                        step_down(&tx, &s, "no renewal succeeded within the renew deadline; a renewal is still in flight");
                        last_renewed = None;
                    }
                    r = &mut attempt => break r,
                }
            };
            let mut found = None;
            let result = match answer {
                Ok(r) => r
                    .map(|(held, f)| {
                        found = f;
                        held
                    })
                    .map_err(|e| explain(&e, &s)),
                Err(_) => Err(format!(
                    "lease {}/{}: no answer within the renew deadline {:?}",
                    s.namespace,
                    s.name,
                    renew_deadline(&s)
                )),
            };
            let leading = match result {
                Ok(held) => {
                    liveness.trouble(NAME, None);
                    last_logged = None;
                    if held {
                        last_renewed = Some(sent);
                    }
                    // Held, but answered so late that the renew deadline counted from the
                    // request has passed: not ours to act on any more.
                    held && sent.elapsed() < renew_deadline(&s)
                }
                Err(why) => {
                    // Once a minute per distinct problem, not every round.
                    let repeat = last_logged
                        .as_ref()
                        .is_some_and(|(w, at)| *w == why && at.elapsed() < Duration::from_secs(60));
                    if !repeat {
                        tracing::error!(lease = %s.name, "leader election failing: {why}");
                        last_logged = Some((why.clone(), crate::clock::Instant::now()));
                    }
                    liveness.trouble(NAME, Some(format!("leader election failing: {why}")));
                    // Still ours only while no renewal could have been missed by the
                    // others: within the renew deadline of the last success.
                    last_renewed.is_some_and(|t| t.elapsed() < renew_deadline(&s))
                }
            };
            if !leading {
                last_renewed = None;
            }
            if *tx.borrow() != leading {
                if !leading {
                    tracing::warn!(lease = %s.name, identity = %s.identity, "not the leader any more");
                } else if let Some(c) = &carry {
                    // Before anything acts as the leader: what the last one carried.
                    c.took_over(found);
                }
                let _ = tx.send(leading);
            }
            if tx.is_closed() {
                liveness.done(NAME);
                return;
            }
            tokio::select! {
                biased;
                _ = until(leads_until(&tx, last_renewed, &s)) => {
                    // The last renewal was answered so late that its deadline passes
                    // before the next round: stop acting now, then try again.
                    step_down(&tx, &s, "the renew deadline of the last renewal passed before the next round");
                    last_renewed = None;
                }
                _ = stop.changed() => {}
                _ = tokio::time::sleep(s.retry_every()) => {}
            }
        }
    });
    (rx, task)
}

/// Until when this replica may act as the leader: the send time of its last
/// successful renewal plus the renew deadline. `None` when it does not lead.
fn leads_until(
    tx: &watch::Sender<bool>,
    last_renewed: Option<crate::clock::Instant>,
    s: &LeaseSettings,
) -> Option<crate::clock::Instant> {
    last_renewed
        .filter(|_| *tx.borrow())
        .map(|t| t + renew_deadline(s))
}

/// Sleeps until `at`; never without one.
async fn until(at: Option<crate::clock::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn step_down(tx: &watch::Sender<bool>, s: &LeaseSettings, why: &str) {
    if *tx.borrow() {
        tracing::warn!(lease = %s.name, identity = %s.identity, "not the leader any more: {why}");
        let _ = tx.send(false);
    }
}

/// Whether this replica may act now: the one answer the engine's loops and the
/// fence on its API clients ([`crate::scalein::kube::fence`]) both read.
#[derive(Default)]
pub struct Acting {
    /// Set when leader election runs: whether this replica leads now.
    leads: std::sync::OnceLock<watch::Receiver<bool>>,
    /// Set by [`Leadership::stop_acting`]: this replica acts no more, whatever the
    /// Lease says.
    stopped: std::sync::atomic::AtomicBool,
}

impl Acting {
    /// Always, unless the election says otherwise or this replica stopped acting.
    /// An election whose task is gone (aborted, panicked) cannot renew the Lease, so
    /// its last word does not count: fail closed. (The leadership model found a
    /// process killed mid-call whose CA handler went on and drained as the leader,
    /// the election's last word being "leads".)
    pub fn now(&self) -> bool {
        !self.stopped.load(std::sync::atomic::Ordering::SeqCst)
            && self
                .leads
                .get()
                .is_none_or(|rx| *rx.borrow() && rx.has_changed().is_ok())
    }
}

/// This replica's leadership: whether it may act now, and the election that says so.
/// Without an election it always leads; [`Self::stop_acting`] ends that for good.
pub struct Leadership {
    /// The client without the drains' rate limit, for the Lease alone: a renewal
    /// must not queue behind a storm's evictions, or leadership is lost mid-storm.
    lease_client: kube::Client,
    acting: std::sync::Arc<Acting>,
    /// Tells the election's task to release the Lease and stop.
    stop: watch::Sender<bool>,
    /// What the leader carries on its Lease (the rates' starts).
    pub carry: std::sync::Arc<Carry>,
}

impl Leadership {
    pub fn new(lease_client: kube::Client) -> Self {
        Self {
            lease_client,
            acting: Default::default(),
            stop: watch::channel(false).0,
            carry: Default::default(),
        }
    }

    /// Whether this replica may act now, shared (the fence on the API clients).
    pub fn acting(&self) -> std::sync::Arc<Acting> {
        self.acting.clone()
    }

    /// Follows an election someone else runs (tests, a second engine of one process).
    pub fn follow(&self, rx: watch::Receiver<bool>) {
        let _ = self.acting.leads.set(rx);
    }

    /// The election's receiver, when one runs.
    pub fn receiver(&self) -> Option<watch::Receiver<bool>> {
        self.acting.leads.get().cloned()
    }

    /// Whether this replica may act: always, unless the election says otherwise or
    /// it stopped acting.
    pub fn leads(&self) -> bool {
        self.acting.now()
    }

    /// Starts the election when configured (identity: POD_NAME, else the host name).
    pub fn elect(
        &self,
        settings: &crate::scalein::ScaleInSettings,
        liveness: &std::sync::Arc<crate::telemetry::liveness::Liveness>,
    ) {
        if !settings.leader_election {
            return;
        }
        if settings.dry_run {
            tracing::info!("dry run: no leader election (it writes a Lease); every replica describes what it would drain");
            return;
        }
        let identity = std::env::var("POD_NAME")
            .ok()
            .filter(|s| !s.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
            .unwrap_or_else(|| format!("ca-asg-provider-{}", std::process::id()));
        let lease = lease_for(settings, identity);
        tracing::info!(lease = %lease.name, namespace = %lease.namespace, identity = %lease.identity, "leader election: the drain loop runs on the Lease holder");
        self.lead_as(liveness, lease);
    }

    /// Runs the election for the Lease `lease` names and follows it; [`Self::release`]
    /// ends it. Returns the election's task (a test aborts it to play a process that
    /// died).
    pub fn lead_as(
        &self,
        liveness: &std::sync::Arc<crate::telemetry::liveness::Liveness>,
        lease: LeaseSettings,
    ) -> tokio::task::JoinHandle<()> {
        let (leads, task) = spawn_task(
            liveness.clone(),
            self.lease_client.clone(),
            lease,
            self.stop.subscribe(),
            Some(self.carry.clone()),
        );
        self.follow(leads);
        task
    }

    /// From now on this replica does not act, whatever the Lease says (the first
    /// half of stepping down: its drains stop before the Lease is released).
    pub fn stop_acting(&self) {
        self.acting
            .stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Releases the Lease and waits (bounded) for the release's answer; without one
    /// the Lease expires by itself.
    pub async fn release(&self) {
        self.stop.send_replace(true);
        if let Some(mut rx) = self.receiver() {
            // The election's task ends once the release is answered (or failed).
            let _ = tokio::time::timeout(Duration::from_secs(3), async {
                while rx.changed().await.is_ok() {}
            })
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An election whose task is gone no longer leads, whatever its last word: a
    /// process killed mid-call (the leadership model, AWS slow) had its CA handler
    /// go on and drain as the leader 3 s after another replica took the Lease.
    #[tokio::test]
    async fn an_election_that_ended_leads_no_more() {
        let acting = Acting::default();
        assert!(acting.now(), "without an election it leads");
        let (election, leads) = watch::channel(true);
        let _ = acting.leads.set(leads.clone());
        assert!(acting.now(), "the election says it leads");
        let waiting = tokio::spawn(lost(Some(leads)));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "still leading");
        drop(election);
        assert!(!acting.now(), "its task gone: its last word does not count");
        waiting.await.unwrap();
        assert!(
            !Acting {
                stopped: true.into(),
                ..Default::default()
            }
            .now(),
            "stopped acting"
        );
    }
    use k8s_openapi::jiff::SignedDuration;

    fn spec(holder: &str, renewed_secs_ago: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(duration),
            renew_time: Some(MicroTime(
                crate::clock::timestamp_now() - SignedDuration::from_secs(renewed_secs_ago),
            )),
            ..Default::default()
        }
    }

    /// The drain command's turn over every shape of the Lease: it hands its drain only
    /// to a holder seen renewing, takes the Lease only when missing, its own, or
    /// standing still (held or released) for a whole lease duration as it saw it, and
    /// otherwise reads again. A timestamp alone (another clock's) decides nothing.
    #[test]
    fn the_drain_command_hands_over_only_to_a_holder_seen_renewing() {
        use CommandTurn::*;
        let d = Duration::from_secs(15);
        let released = LeaseSpec {
            lease_duration_seconds: Some(15),
            ..Default::default()
        };
        for holder in [
            None,
            Some("replica-a"),
            Some("drain-command-h-1"),
            Some("drain-command-other-7"),
            Some(""),
        ] {
            for renewed_ago in [0, 5, 100] {
                for unchanged in [
                    Duration::ZERO,
                    d / 2,
                    d - Duration::from_millis(1),
                    d,
                    d * 4,
                ] {
                    for changed in [false, true] {
                        let sp = match holder {
                            None => released.clone(),
                            Some(h) => spec(h, renewed_ago, 15),
                        };
                        let turn = command_turn(Some(&sp), "drain-command-h-1", unchanged, changed);
                        let live = changed && holder.is_some_and(|h| !h.is_empty());
                        let want = match holder {
                            Some("drain-command-h-1") => Take,
                            Some(h) if h.starts_with(COMMAND_HOLDER_PREFIX) && live => Watch,
                            _ if live => HandTo(holder.unwrap().to_string()),
                            _ if unchanged >= d => Take,
                            _ => Watch,
                        };
                        assert_eq!(turn, want, "{holder:?} renewed {renewed_ago}s ago, unchanged {unchanged:?}, changed {changed}");
                    }
                }
            }
        }
        assert_eq!(
            command_turn(None, "me", Duration::ZERO, false),
            Take,
            "no Lease: nobody leads"
        );
        // The Lease's own duration counts, not the command's.
        assert_eq!(
            command_turn(Some(&spec("replica-a", 0, 60)), "me", d, false),
            Watch
        );
    }

    /// `Observed::changed` is false until the record differs from the first read.
    #[test]
    fn a_record_is_changed_only_after_a_second_read_differs() {
        let mut o = Observed::default();
        let a = spec("replica-a", 0, 15);
        o.note(Some(&a));
        assert!(!o.changed());
        o.note(Some(&a));
        assert!(!o.changed());
        // Renewed: a renewTime 7 s later than the first read's.
        let mut b = a.clone();
        b.renew_time = a
            .renew_time
            .as_ref()
            .map(|t| MicroTime(t.0 + SignedDuration::from_secs(7)));
        o.note(Some(&b));
        assert!(o.changed());
        let mut o = Observed::default();
        o.note(None);
        o.note(Some(&a));
        assert!(o.changed(), "a Lease created since the first read");
    }

    #[test]
    fn decisions() {
        let fresh = Duration::from_secs(3);
        let stale = Duration::from_secs(16);
        assert_eq!(decide(None, "a", fresh), Decision::Create);
        assert_eq!(
            decide(Some(&spec("a", 100, 15)), "a", fresh),
            Decision::Renew
        );
        assert_eq!(
            decide(Some(&spec("b", 3, 15)), "a", fresh),
            Decision::Follow { holder: "b".into() }
        );
        assert_eq!(
            decide(Some(&spec("b", 3, 15)), "a", stale),
            Decision::Acquire
        );
        assert_eq!(
            decide(Some(&spec("", 1, 15)), "a", fresh),
            Decision::Acquire
        );
    }

    #[test]
    fn expiry_follows_what_this_replica_saw_not_the_holders_clock() {
        // The holder's clock is an hour behind ours: its renewTime looks long expired,
        // but the record keeps changing, so it is followed.
        let mut o = Observed::default();
        let behind = spec("b", 3600, 15);
        let unchanged = o.note(Some(&behind));
        assert_eq!(
            decide(Some(&behind), "a", unchanged),
            Decision::Follow { holder: "b".into() }
        );
        // The holder's clock is an hour ahead: its renewTime looks fresh for an hour,
        // but once the record stands still for a lease duration it is taken over.
        let ahead = LeaseSpec {
            renew_time: Some(MicroTime(
                crate::clock::timestamp_now() + SignedDuration::from_secs(3600),
            )),
            ..spec("b", 0, 1)
        };
        let mut o = Observed::default();
        assert!(o.note(Some(&ahead)) < Duration::from_secs(1));
        std::thread::sleep(Duration::from_millis(1100));
        let unchanged = o.note(Some(&ahead));
        assert_eq!(decide(Some(&ahead), "a", unchanged), Decision::Acquire);
        // A renewal seen restarts the count.
        let renewed = LeaseSpec {
            renew_time: Some(MicroTime(
                crate::clock::timestamp_now() + SignedDuration::from_secs(3601),
            )),
            ..ahead
        };
        assert!(o.note(Some(&renewed)) < Duration::from_secs(1));
    }

    #[test]
    fn a_forbidden_lease_is_one_line_naming_the_rbac() {
        let s = LeaseSettings {
            name: "ca-asg-provider".into(),
            namespace: "default".into(),
            identity: "a".into(),
            duration: Duration::from_secs(15),
        };
        let e = kube::Error::Api(
            kube::core::Status::failure(&"x".repeat(5000), "Forbidden")
                .with_code(403)
                .boxed(),
        );
        let line = explain(&e, &s);
        assert!(
            line.contains("default/ca-asg-provider") && line.contains("403"),
            "{line}"
        );
        // Issue 62: both ways the Role comes, the chart's and the overlays'.
        assert!(
            line.contains("rbac.create: true") && line.contains("deploy/base/rbac.yaml"),
            "{line}"
        );
        assert!(line.len() < 400, "{}", line.len());
        assert_eq!(renew_deadline(&s), Duration::from_secs(10));
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let s = LeaseSettings {
            name: "l".into(),
            namespace: "kube-system".into(),
            identity: "a".into(),
            duration: Duration::from_secs(15),
        };
        let old = spec("b", 30, 15);
        let taken = spec_for("a", &s, Some(&old), true);
        assert_eq!(taken.lease_transitions, Some(1));
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        let renewed = spec_for("a", &s, Some(&taken), false);
        assert_eq!(renewed.lease_transitions, Some(1));
        assert_eq!(renewed.acquire_time, taken.acquire_time);
        assert_eq!(s.retry_every(), Duration::from_secs(2));
    }
}
