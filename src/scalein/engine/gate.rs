//! The gate every drain passes once its node is cordoned and marked, whatever asked
//! for it (CA, our hook, the queue, the warm pool, the command line): the
//! disruption budgets ([`crate::scalein::decide::budget`], `maxConcurrentDrains`
//! among them) decide whether it starts now. The rule lives there; this room only
//! gathers what it reads and waits:
//!
//! - the drain's facts ([`Placed`]): its group and the group's tags, its zone, its
//!   causes from the record's reasons, whether it is exempt;
//! - every node the budgets may cover (the provider's groups, warm pools aside);
//! - the slots held now (the book), and the recent starts (kept here);
//! - for a drain our hook holds, the latest it may start ([`budget::force_at`]).
//!
//! Taking a slot is decided and kept under one lock, so two drains never both take
//! the last room of a budget. A drain that waits says so once (an Event naming the
//! budget and until when), is counted per budget, and looks again when a slot goes
//! back, when what held it should have passed, and at least every
//! [`RECHECK`] (the groups' sizes change a percent).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;

use crate::scalein::decide::budget::{self, asg_cause, Asked, Placed, Verdict};
use crate::scalein::decide::ca_hold;
use crate::scalein::decide::conditions::{DrainState, WAITING_FOR_BUDGET};
use crate::scalein::decide::plan::{self, Disposition, Tier};
use crate::scalein::decide::record::{DrainRecord, Why};
use crate::scalein::engine::Engine;
use crate::scalein::kube::events::Reason;
use crate::scalein::stages::port::condition_reason;
use crate::scalein::{DrainRequest, Mode, Source};
use crate::telemetry::metrics::{metrics, BudgetLabels};

/// A waiting drain looks again at least this often.
pub const RECHECK: Duration = Duration::from_secs(30);
/// Starts kept for the rates: at most this many, none older than a week (the
/// longest `rate.per`).
const STARTS_KEPT: usize = 100_000;
const STARTS_FOR: chrono::Duration = chrono::Duration::days(7);

/// A node as budgets place it: its group, its zone, the group's tags.
type NodePlace = (String, String, Arc<BTreeMap<String, String>>);

/// What the gate remembers: the recent starts the rates count.
#[derive(Default)]
pub struct Gate {
    starts: Mutex<VecDeque<Start>>,
    /// The ASG's own cause of each held instance's scale-in, once read, by the
    /// instance and when its hold began (an activity's cause does not change; an
    /// instance back from a warm pool and scaled in again is another hold); at most
    /// [`CAUSES_KEPT`].
    asg_causes: Mutex<BTreeMap<HoldKey, budget::Cause>>,
    /// The starts the previous leader's rates counted, read back from the Lease
    /// at this replica's takeover ([`budget::carried`]).
    inherited: Mutex<budget::carried::Carried>,
}

/// A start the rates count: when, the drain's facts, the instance.
type Start = (DateTime<Utc>, Placed, String);

/// An instance and when our hook's hold of it began.
type HoldKey = (String, Option<DateTime<Utc>>);

/// At most this many instances' ASG causes are kept.
const CAUSES_KEPT: usize = 10_000;

impl Gate {
    /// The starts this replica counted for the rates, oldest first.
    pub(crate) fn recent_starts(&self) -> Vec<Start> {
        self.starts.lock().iter().cloned().collect()
    }
}

/// What taking a slot came to.
enum Taken {
    /// Kept in the book (or the run was replaced meanwhile: nothing to keep).
    Yes {
        forced_past: Option<String>,
    },
    Wait(budget::Hold),
}

/// Waits until the budgets let this run of the drain start, and keeps its slot in
/// the book. True once it holds one (or its run was replaced, which ends it).
pub(crate) async fn take_slot(
    engine: &Engine,
    req: &DrainRequest,
    node: &str,
    record: &DrainRecord,
    run: u64,
) -> bool {
    let budgets = engine.settings.budgets_in_order();
    let placed = placed(engine, req, node, record, &budgets).await;
    let force_at = force_at(engine, req, record);
    await_replacement(engine, req, node, record, &placed, force_at).await;
    let mut waiting = Waiting(None);
    loop {
        let freed = engine.book.slot_freed();
        tokio::pin!(freed);
        freed.as_mut().enable();
        let now = crate::clock::utc_now();
        let forced = force_at.is_some_and(|at| now >= at);
        match decide_and_keep(engine, &budgets, &placed, req, run, now, forced) {
            Taken::Yes { forced_past } => {
                waiting.stop();
                if let Some(budget) = forced_past {
                    say_forced(engine, node, req, &budget, force_at).await;
                }
                return true;
            }
            Taken::Wait(hold) => {
                if waiting.0.as_ref() != Some(&hold.budget) {
                    waiting.start(&hold.budget);
                    say_waiting(engine, node, req, record, &hold, force_at).await;
                }
                let wake = wake_in(&hold.until, force_at, now);
                tokio::select! {
                    () = &mut freed => {}
                    () = tokio::time::sleep(wake) => {}
                }
            }
        }
    }
}

/// How `waitForReplacement` is named where budgets are: in
/// `drains_waiting_for_budget`, Events and the forced count.
pub const REPLACEMENT: &str = "waitForReplacement";
/// How often a drain waiting for its group's replacement reads the group again.
const REPLACEMENT_LOOK: Duration = Duration::from_secs(10);

/// `waitForReplacement` ([`budget::awaits_replacement`]), before the budgets: a
/// drain of a group that asks for it waits until AWS shows the group's desired
/// capacity InService, read fresh at each look (never the registry's memory). A
/// group AWS does not answer for waits too (the node stays cordoned, nothing is
/// evicted) and is read again; a group gone has nothing to wait for. A drain our
/// hook holds goes at its force time whatever. Said once, as a budget's wait is
/// (`DrainWaitingForBudget` naming [`REPLACEMENT`]), and counted alike.
async fn await_replacement(
    engine: &Engine,
    req: &DrainRequest,
    node: &str,
    record: &DrainRecord,
    placed: &Placed,
    force_at: Option<DateTime<Utc>>,
) {
    if placed.exempt
        || !engine
            .settings
            .waits_for_replacement(&placed.group, &placed.tags)
    {
        return;
    }
    let mut waiting = Waiting(None);
    let selector = crate::cloud::GroupSelector {
        names: vec![placed.group.clone()],
        tag_sets: Vec::new(),
    };
    loop {
        let now = crate::clock::utc_now();
        if force_at.is_some_and(|at| now >= at) {
            say_forced(engine, node, req, REPLACEMENT, force_at).await;
            return;
        }
        let seen = match engine.cloud.describe_groups(&selector).await {
            Ok(groups) => match groups.into_iter().find(|g| g.name == placed.group) {
                Some(g) => Ok(in_service_of(&g)),
                None => return,
            },
            Err(e) => Err(e.to_string()),
        };
        let said = match seen {
            Ok((in_service, desired)) if !budget::awaits_replacement(false, in_service, desired) => {
                return
            }
            Ok((in_service, desired)) => format!(
                "group {} has {in_service} of its desired {desired} instances InService; it starts once the replacement is",
                placed.group
            ),
            Err(e) => format!("group {} cannot be read from AWS ({e}); it waits and reads it again", placed.group),
        };
        if waiting.0.is_none() {
            waiting.start(REPLACEMENT);
            say_waiting_said(engine, node, req, record, REPLACEMENT, &said, force_at).await;
        }
        let wake = force_at
            .and_then(|at| (at - now).to_std().ok())
            .map_or(REPLACEMENT_LOOK, |d| d.min(REPLACEMENT_LOOK))
            .max(Duration::from_millis(100));
        tokio::time::sleep(wake).await;
    }
}

/// (InService instances, desired capacity) of a group as AWS showed it.
fn in_service_of(g: &crate::cloud::AsgSnapshot) -> (usize, usize) {
    let in_service = g
        .instances
        .iter()
        .filter(|i| i.state == crate::cloud::LifecycleState::InService)
        .count();
    (in_service, usize::try_from(g.desired_capacity).unwrap_or(0))
}

/// Under the one lock: the verdict, and the slot kept when it is go.
fn decide_and_keep(
    engine: &Engine,
    budgets: &[budget::Budget],
    placed: &Placed,
    req: &DrainRequest,
    run: u64,
    now: DateTime<Utc>,
    forced: bool,
) -> Taken {
    let mut starts = engine.gate.starts.lock();
    // A drain that started within a rate's period already (resumed after a restart
    // or a new leader, or run again) is no new start for that rate: it neither
    // waits for it again nor counts twice.
    let started = already_started(engine, budgets, &starts, &req.instance_id, now);
    let here: Vec<budget::Budget> = budgets
        .iter()
        .map(|b| match started.contains_key(&b.name) {
            true => budget::Budget {
                rate: None,
                ..b.clone()
            },
            false => b.clone(),
        })
        .collect();
    let budgets_here = &here;
    let verdict = in_world(engine, &starts, now, |world| {
        for b in budgets {
            let (allowed, count) = b.room(world);
            metrics()
                .budget_room
                .get_or_create(&BudgetLabels {
                    budget: b.name.clone(),
                })
                .set(allowed.saturating_sub(count) as i64);
        }
        budget::verdict(budgets_here, &placed.drain(), world)
    });
    let forced_past = match verdict {
        Verdict::Go => None,
        Verdict::Wait(hold) if !forced => return Taken::Wait(hold),
        Verdict::Wait(hold) => Some(hold.budget),
    };
    let placed = Placed {
        forced: forced_past.is_some(),
        ..placed.clone()
    };
    if engine.book.keep_slot(&req.instance_id, run, placed.clone()) {
        // Started already by this replica (within each rate's period): counted.
        let own = !started.is_empty() && started.values().all(|(_, own)| *own);
        if !own {
            // A new start now, or one the last leader counted, adopted at its time.
            let at = started.values().map(|(at, _)| *at).min().unwrap_or(now);
            starts.push_back((at, placed, req.instance_id.clone()));
        }
        while starts.len() > STARTS_KEPT
            || starts
                .front()
                .is_some_and(|(at, _, _)| *at < now - STARTS_FOR)
        {
            starts.pop_front();
        }
        carry_rates(engine, budgets, &starts, now);
    }
    Taken::Yes { forced_past }
}

/// Per rate budget by name: when `instance`'s drain started within its period, and
/// whether that start is this replica's own (else the last leader's).
fn already_started(
    engine: &Engine,
    budgets: &[budget::Budget],
    starts: &VecDeque<Start>,
    instance: &str,
    now: DateTime<Utc>,
) -> BTreeMap<String, (DateTime<Utc>, bool)> {
    absorb_inherited(engine, now);
    let own = own_starts(starts);
    let inherited = engine.gate.inherited.lock();
    let none = budget::carried::Carried::new();
    budgets
        .iter()
        .filter_map(|b| {
            let any = budget::carried::already_started(b, instance, &own, &inherited, now)?;
            let mine = budget::carried::already_started(b, instance, &own, &none, now);
            Some((b.name.clone(), (any, mine == Some(any))))
        })
        .collect()
}

/// The gate's starts as the carry reads them.
fn own_starts(starts: &VecDeque<Start>) -> Vec<budget::carried::OwnStart<'_>> {
    starts
        .iter()
        .map(|(at, p, id)| (*at, p.drain(), id.as_str()))
        .collect()
}

/// What the leader's Lease carries from now on: the starts each rate counts, so a
/// restart or the next leader goes on counting them.
fn carry_rates(
    engine: &Engine,
    budgets: &[budget::Budget],
    starts: &VecDeque<Start>,
    now: DateTime<Utc>,
) {
    if budgets.iter().all(|b| b.rate.is_none()) {
        return;
    }
    let own = own_starts(starts);
    let carried = budget::carried::carry(budgets, &own, &engine.gate.inherited.lock(), now);
    engine
        .leadership
        .carry
        .set_out(budget::carried::to_text(&carried));
}

/// What the budgets read now ([`budget::World`]), handed to `read`: every node
/// they may cover, the slots held, the recent starts.
fn in_world<T>(
    engine: &Engine,
    starts: &VecDeque<Start>,
    now: DateTime<Utc>,
    read: impl FnOnce(&budget::World<'_>) -> T,
) -> T {
    let holders = engine.book.slot_holders();
    let nodes = node_places(engine);
    let node_refs: Vec<budget::Place<'_>> = nodes
        .iter()
        .map(|(g, z, t)| budget::Place {
            group: g,
            zone: z,
            tags: t,
        })
        .collect();
    let draining: Vec<budget::Drain<'_>> = holders.iter().map(Placed::drain).collect();
    let counted: Vec<(DateTime<Utc>, budget::Drain<'_>)> =
        starts.iter().map(|(at, p, _)| (*at, p.drain())).collect();
    absorb_inherited(engine, now);
    let inherited = engine.gate.inherited.lock();
    read(&budget::World {
        now,
        nodes: &node_refs,
        draining: &draining,
        starts: &counted,
        inherited: &inherited,
    })
}

/// Just took over: what the last leader's rates counted, read back from its Lease.
fn absorb_inherited(engine: &Engine, now: DateTime<Utc>) {
    let Some(found) = engine.leadership.carry.take_inherited() else {
        return;
    };
    let budgets = engine.settings.budgets_in_order();
    let mut inherited = engine.gate.inherited.lock();
    *inherited = budget::carried::from_text(found.as_deref(), &budgets, now);
    let n: usize = inherited.values().map(Vec::len).sum();
    if n > 0 {
        tracing::info!(
            starts = n,
            "took over the rates' recent starts from the last leader's Lease"
        );
    }
}

/// [`in_world`] as the gate has it now, for what else asks the budgets (which nodes
/// CA may not pick).
pub(crate) fn read_world<T>(
    engine: &Engine,
    now: DateTime<Utc>,
    read: impl FnOnce(&budget::World<'_>) -> T,
) -> T {
    let starts = engine.gate.starts.lock();
    in_world(engine, &starts, now, read)
}

/// The drain's facts as budgets see them: the group and its tags and the instance's
/// zone from the provider's registry (else the Node's zone label), the causes from
/// the record's reasons.
async fn placed(
    engine: &Engine,
    req: &DrainRequest,
    node: &str,
    record: &DrainRecord,
    budgets: &[budget::Budget],
) -> Placed {
    let registry = engine.provider.as_ref().map(|p| p.registry());
    let group = registry.as_ref().and_then(|r| r.group(&req.group).cloned());
    let zone = group
        .as_ref()
        .and_then(|g| g.asg.instances.iter().find(|i| i.id == req.instance_id))
        .map(|i| i.zone.clone())
        .or_else(|| {
            engine.tools.nodes.cached(node).and_then(|n| {
                n.metadata
                    .labels
                    .as_ref()?
                    .get("topology.kubernetes.io/zone")
                    .cloned()
            })
        })
        .unwrap_or_default();
    let asked = Asked {
        by_ca: req.source == Source::ClusterAutoscaler,
        empty: if ca_hold::tells_empty_from_occupied(budgets) && asks_ca(record, req) {
            node_is_empty(engine, node).await
        } else {
            None
        },
        to_warm_pool: group
            .as_ref()
            .and_then(|g| g.asg.warm_pool.as_ref())
            .is_some_and(|w| w.reuse_on_scale_in),
        asg: None,
    };
    let asked = Asked {
        asg: if asg_cause::tells_apart(budgets) && asks_asg(record, asked) {
            asg_cause_of(engine, req, record.hold_began()).await
        } else {
            None
        },
        ..asked
    };
    let (causes, exempt) = budget::causes_of(record, asked);
    Placed {
        group: req.group.clone(),
        zone,
        tags: Arc::new(group.map(|g| g.asg.tags).unwrap_or_default()),
        causes,
        exempt,
        forced: false,
    }
}

/// Whether the drain is the group's own scale-in held by our hook (not CA's, not
/// a return to the warm pool): the one whose cause the scaling activity says.
fn asks_asg(record: &DrainRecord, asked: Asked) -> bool {
    !asked.by_ca && !asked.to_warm_pool && record.hold_began().is_some()
}

/// The group's own cause of the instance's scale-in, from its scaling activity (one
/// DescribeScalingActivities walk per instance, kept). `None` when AWS cannot be
/// read now: every `asg-*` cause then applies, and the next look reads again.
async fn asg_cause_of(
    engine: &Engine,
    req: &DrainRequest,
    hold_began: Option<DateTime<Utc>>,
) -> Option<budget::Cause> {
    let key = (req.instance_id.clone(), hold_began);
    if let Some(c) = engine.gate.asg_causes.lock().get(&key) {
        return Some(*c);
    }
    let cause = match engine
        .cloud
        .termination_cause(&req.group, &req.instance_id)
        .await
    {
        Ok(text) => asg_cause::classify(text.as_deref().unwrap_or_default()),
        Err(e) => {
            tracing::warn!(instance = %req.instance_id, error = %e, "could not read the group's scaling activities; the drain counts under every asg-* cause");
            return None;
        }
    };
    let mut kept = engine.gate.asg_causes.lock();
    if kept.len() >= CAUSES_KEPT {
        kept.clear();
    }
    kept.insert(key, cause);
    Some(cause)
}

fn asks_ca(record: &DrainRecord, req: &DrainRequest) -> bool {
    req.source == Source::ClusterAutoscaler
        || record
            .reasons
            .iter()
            .any(|r| !r.done && matches!(r.why, Why::ScaleIn))
}

/// Whether the node runs no workload pod (DaemonSet, mirror and finished pods
/// aside). `None` when the API server cannot say: both causes then apply.
async fn node_is_empty(engine: &Engine, node: &str) -> Option<bool> {
    let pods: kube::Api<Pod> = kube::Api::all(engine.tools.client.clone());
    let lp = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
    let list = match pods.list(&lp).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(node, error = %e, "cannot list the node's pods to tell an empty node from an occupied one; both budgets apply");
            return None;
        }
    };
    Some(!runs_workload(engine, &list.items))
}

/// Whether any of `pods` is a workload pod (not a DaemonSet, mirror or finished
/// pod): what tells CA's scale-in of an occupied node from an empty one's.
pub(crate) fn runs_workload<'a>(engine: &Engine, pods: impl IntoIterator<Item = &'a Pod>) -> bool {
    let now = crate::clock::timestamp_now();
    pods.into_iter().any(|p| {
        matches!(
            plan::classify_at(p, &engine.settings.node_critical, now),
            Disposition::Evict(Tier::Workload) | Disposition::Wait(Tier::Workload)
        )
    })
}

/// Every node the budgets may cover: each instance of each group the provider
/// knows, warm-pool instances aside (they are not nodes).
fn node_places(engine: &Engine) -> Vec<NodePlace> {
    let Some(provider) = &engine.provider else {
        return Vec::new();
    };
    let registry = provider.registry();
    let mut places = Vec::new();
    for g in &registry.groups {
        let tags = Arc::new(g.asg.tags.clone());
        for i in g.asg.instances.iter().filter(|i| !i.state.in_warm_pool()) {
            places.push((g.asg.name.clone(), i.zone.clone(), tags.clone()));
        }
    }
    places
}

/// For a drain our hook holds: the latest it may start, the hold having begun when
/// its reason was recorded (known to within the lifecycle poll, the margin).
fn force_at(engine: &Engine, req: &DrainRequest, record: &DrainRecord) -> Option<DateTime<Utc>> {
    let Mode::Lifecycle {
        heartbeat_timeout, ..
    } = &req.mode
    else {
        return None;
    };
    let began = record.hold_began().unwrap_or_else(crate::clock::utc_now);
    let s = &engine.settings;
    // The deadline the drain keeps (its group's; never past the hook's room).
    let limits = record.kept_or(engine.limits_of(req));
    let workloads = limits.hook_room.map_or(limits.workload_deadline, |room| {
        limits.workload_deadline.min(room)
    });
    let takes = workloads + s.after_workloads();
    Some(budget::force_at(
        began,
        *heartbeat_timeout,
        takes,
        s.hook_margin(),
    ))
}

/// How long to wait before looking again.
fn wake_in(until: &budget::Until, force_at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Duration {
    let mut at = match until {
        budget::Until::WindowCloses(t) | budget::Until::Token(t) => Some(*t),
        budget::Until::SlotFrees { .. } => None,
    };
    if let Some(f) = force_at {
        at = Some(at.map_or(f, |a| a.min(f)));
    }
    at.and_then(|t| (t - now).to_std().ok())
        .unwrap_or(Duration::from_millis(100))
        .clamp(Duration::from_millis(100), RECHECK)
}

fn gauge(budget: &str) -> prometheus_client::metrics::gauge::Gauge {
    metrics()
        .drains_waiting_for_budget
        .get_or_create(&BudgetLabels {
            budget: budget.to_string(),
        })
        .clone()
}

/// The budget a drain is counted as waiting for in `drains_waiting_for_budget`;
/// uncounted when the wait ends, and when the drain's task is stopped or replaced
/// while it waits (dropped).
struct Waiting(Option<String>);

impl Waiting {
    fn start(&mut self, budget: &str) {
        self.stop();
        gauge(budget).inc();
        self.0 = Some(budget.to_string());
    }

    fn stop(&mut self) {
        if let Some(b) = self.0.take() {
            gauge(&b).dec();
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn say_waiting(
    engine: &Engine,
    node: &str,
    req: &DrainRequest,
    record: &DrainRecord,
    hold: &budget::Hold,
    force_at: Option<DateTime<Utc>>,
) {
    say_waiting_said(
        engine,
        node,
        req,
        record,
        &hold.budget,
        &hold.until.said(),
        force_at,
    )
    .await;
}

/// The one `DrainWaitingForBudget` Event of a wait: the budget that holds the drain
/// and until when (`said`); the same on the Node's `DrainInProgress` condition (which
/// `status` shows), until the drain's first phase says where it is.
async fn say_waiting_said(
    engine: &Engine,
    node: &str,
    req: &DrainRequest,
    record: &DrainRecord,
    budget: &str,
    said: &str,
    force_at: Option<DateTime<Utc>>,
) {
    let forced = force_at
        .map(|at| {
            format!(
                "; our lifecycle hook holds the instance, so its drain starts by {} whatever the budget says",
                at.format("%Y-%m-%d %H:%M:%S UTC")
            )
        })
        .unwrap_or_default();
    let note = format!(
        "node cordoned; its drain (instance {}, asked by {}) waits for disruption budget {budget:?}: {said}{forced}",
        req.instance_id,
        req.source.said(),
    );
    tracing::info!(node, instance = %req.instance_id, budget, "{note}");
    let state = DrainState::Running {
        reason: condition_reason(req.source, record).to_string(),
        message: format!("{WAITING_FOR_BUDGET} {budget:?}: {said}{forced}"),
    };
    engine.stage().say_state(node, &state).await;
    engine
        .tools
        .events
        .node(node, Reason::DrainWaitingForBudget, note)
        .await;
}

async fn say_forced(
    engine: &Engine,
    node: &str,
    req: &DrainRequest,
    budget: &str,
    force_at: Option<DateTime<Utc>>,
) {
    metrics()
        .drains_forced_past_budget
        .get_or_create(&BudgetLabels {
            budget: budget.to_string(),
        })
        .inc();
    let note = format!(
        "drain of instance {} starts past disruption budget {budget:?}: our lifecycle hook holds the instance, and waiting longer than {} would leave the drain no time inside the hook's global timeout",
        req.instance_id,
        force_at
            .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
            .unwrap_or_default()
    );
    tracing::warn!(node, instance = %req.instance_id, budget, "{note}");
    engine
        .tools
        .events
        .node(node, Reason::DrainForcedPastBudget, note)
        .await;
}
