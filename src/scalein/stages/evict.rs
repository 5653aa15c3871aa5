//! Evictions through the Eviction API (policy/v1). A 429 means a
//! PodDisruptionBudget does not allow it yet: wait and retry, never delete around it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::clock::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, EvictParams, ListParams, Preconditions};
use kube::core::Selector;
use kube::Api;

use crate::scalein::decide::plan::PodRef;
use crate::scalein::kube::budgets::{selector_picking, Settle};
use crate::scalein::kube::events::Reason;
use crate::scalein::kube::pass::Verdict;
use crate::scalein::stages::Stage;
use crate::telemetry::metrics::{metrics, Metrics};

/// What one eviction attempt answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// Accepted: graceful deletion started.
    Evicted,
    /// The pod is gone already, or another pod holds its name now (409 on the UID
    /// precondition): the one the drain meant is gone.
    Gone,
    /// A PodDisruptionBudget refused it (429 with a DisruptionBudget cause), with
    /// the API server's message.
    Blocked(String),
    /// The API server is shedding load (API Priority and Fairness 429, no budget
    /// involved): retry after this long.
    Throttled(Duration),
    /// More than one PodDisruptionBudget selects the pod: the Eviction API refuses
    /// it (500) until the budgets are fixed. Their names, when they could be read.
    OverlappingBudgets(Vec<String>),
    /// Anything else (API unreachable, 5xx, ...).
    Error(String),
}

/// The evictions this process asked for, by pod UID: in flight, or accepted. A drain
/// that a new reason restarts (or a drain of the same node after it) may look at a
/// pod list that does not show an eviction of the previous run yet (its answer lost
/// to the restart, or the watch a moment behind): it asks this instead of the API
/// server again. Requests run to their answer even when the drain that sent them
/// stops, so what they did is known. Entries are forgotten after 15 minutes.
#[derive(Default)]
pub struct Ledger(parking_lot::Mutex<std::collections::BTreeMap<String, Sent>>);

struct Sent {
    at: Instant,
    /// `None` while in flight; then whether the API server accepted it.
    answer: tokio::sync::watch::Sender<Option<bool>>,
}

const LEDGER_KEEPS: Duration = Duration::from_secs(15 * 60);

impl Ledger {
    /// An eviction of the pod is being sent.
    fn sending(&self, uid: &str) {
        let mut m = self.0.lock();
        let now = Instant::now();
        m.retain(|_, s| now.duration_since(s.at) < LEDGER_KEEPS);
        m.insert(
            uid.to_string(),
            Sent {
                at: now,
                answer: tokio::sync::watch::channel(None).0,
            },
        );
    }

    /// Its answer came: accepted, or not.
    fn answered(&self, uid: &str, accepted: bool) {
        let mut m = self.0.lock();
        if accepted {
            if let Some(s) = m.get(uid) {
                s.answer.send_replace(Some(true));
            }
        } else if let Some(s) = m.remove(uid) {
            s.answer.send_replace(Some(false));
        }
    }

    /// What this process already sent for the pod, waiting (until `deadline`) for
    /// the answer of one still in flight.
    pub async fn earlier(&self, uid: &str, deadline: Instant) -> Earlier {
        let mut rx = match self.0.lock().get(uid) {
            Some(s) => s.answer.subscribe(),
            None => return Earlier::Nothing,
        };
        let answer = tokio::time::timeout_at(deadline, rx.wait_for(|a| a.is_some())).await;
        match answer {
            Ok(Ok(a)) if *a == Some(true) => Earlier::Accepted,
            Ok(_) => Earlier::Nothing,
            Err(_) => Earlier::Unanswered,
        }
    }
}

/// An eviction this process sent earlier for a pod (a run of the drain before a new
/// reason restarted it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Earlier {
    /// None, or one the API server refused.
    Nothing,
    /// Accepted: the pod is leaving.
    Accepted,
    /// Still unanswered at the deadline: it may yet be accepted, so no second one
    /// goes (the API server would answer it 200 too, and the pod would be asked to
    /// leave twice).
    Unanswered,
}

/// Tells a PodDisruptionBudget's 429 from API Priority and Fairness' 429. Pure.
pub fn classify_429(status: &kube::core::Status) -> Attempt {
    let causes = status
        .details
        .as_ref()
        .map(|d| d.causes.as_slice())
        .unwrap_or_default();
    if let Some(c) = causes.iter().find(|c| c.reason == "DisruptionBudget") {
        let why = if c.message.is_empty() {
            status.message.clone()
        } else {
            c.message.clone()
        };
        return Attempt::Blocked(why);
    }
    let secs = status
        .details
        .as_ref()
        .map(|d| d.retry_after_seconds)
        .filter(|s| *s > 0)
        .unwrap_or(1);
    Attempt::Throttled(Duration::from_secs(u64::from(secs.min(60))))
}

/// One eviction request, rate-limited, for exactly the pod the drain saw (its UID
/// is a precondition).
pub async fn attempt(stage: &Stage<'_>, pod: &PodRef) -> Attempt {
    let api: Api<Pod> = Api::namespaced(stage.client.clone(), &pod.namespace);
    let params = EvictParams {
        delete_options: Some(DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        }),
        ..EvictParams::default()
    };
    // Sent from its own task: a drain stopped meanwhile (a new reason restarts it)
    // does not lose the answer, and the ledger tells the next run.
    let ledger = stage.evictions.clone();
    let (name, uid) = (pod.name.clone(), pod.uid.clone());
    ledger.sending(&uid);
    let sent = tokio::spawn(async move {
        let r = api.evict(&name, &params).await;
        ledger.answered(&uid, r.is_ok());
        r
    });
    let answer = match sent.await {
        Ok(r) => r,
        Err(e) => return Attempt::Error(format!("the eviction request's task failed: {e}")),
    };
    let outcome = match answer {
        Ok(_) => {
            stage.stats.evictions_ok.fetch_add(1, Ordering::Relaxed);
            Attempt::Evicted
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Attempt::Gone,
        Err(kube::Error::Api(s)) if s.code == 429 => classify_429(&s),
        Err(kube::Error::Api(s))
            if s.code == 500 && s.message.contains("more than one PodDisruptionBudget") =>
        {
            Attempt::OverlappingBudgets(budgets_selecting(stage, pod).await)
        }
        Err(e) => Attempt::Error(e.to_string()),
    };
    let label = match &outcome {
        Attempt::Evicted => "ok",
        Attempt::Gone => "gone",
        Attempt::Blocked(_) => {
            stage
                .stats
                .evictions_pdb_blocked
                .fetch_add(1, Ordering::Relaxed);
            "pdb_blocked"
        }
        Attempt::Throttled(_) => "throttled",
        Attempt::OverlappingBudgets(_) => {
            stage.stats.evictions_error.fetch_add(1, Ordering::Relaxed);
            "overlapping_pdbs"
        }
        Attempt::Error(_) => {
            stage.stats.evictions_error.fetch_add(1, Ordering::Relaxed);
            "error"
        }
    };
    Metrics::outcome(&metrics().evictions, label);
    outcome
}

/// The PodDisruptionBudgets of the pod's namespace whose selector matches it.
async fn budgets_selecting(stage: &Stage<'_>, pod: &PodRef) -> Vec<String> {
    selecting(stage, pod)
        .await
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// The budgets selecting the pod, with their selectors. From the drain pass's watch
/// of every budget (one list per pass, not one per refused pod); a list if that
/// watch has no answer yet.
async fn selecting(stage: &Stage<'_>, pod: &PodRef) -> Vec<(String, Selector)> {
    let name = |b: &PodDisruptionBudget| b.metadata.name.clone().unwrap_or_default();
    let pass = stage.passes.join();
    if pass
        .budgets()
        .ready(Instant::now() + BUDGET_LIST_WAIT)
        .await
    {
        return pass
            .budgets_selecting(&pod.namespace, &pod.labels)
            .into_iter()
            .map(|(b, sel)| (name(&b), sel))
            .collect();
    }
    let api: Api<PodDisruptionBudget> = Api::namespaced(stage.client.clone(), &pod.namespace);
    match api.list(&ListParams::default()).await {
        Ok(l) => l
            .items
            .iter()
            .filter_map(|b| selector_picking(b, &pod.labels).map(|sel| (name(b), sel)))
            .collect(),
        Err(e) => {
            tracing::debug!(pod = %pod, error = %e, "could not list PodDisruptionBudgets");
            Vec::new()
        }
    }
}

/// How long a refused eviction waits for the pass's first list of budgets before it
/// lists its namespace's itself.
const BUDGET_LIST_WAIT: Duration = Duration::from_secs(5);

/// A pod held by its budget's status this long (or `evictionRetryInterval`, if
/// shorter) gets an `EvictionBlocked` Event.
const TELL_HELD_AFTER: Duration = Duration::from_secs(5);

/// What the wait before a try ended with.
enum Held {
    /// Try now; the ticket counts the try against the budget's status, if known.
    Try(Option<crate::scalein::kube::budgets::Ticket>),
    /// Try now, although the budget's status allows none: it stood still for
    /// `evictionRetryInterval`.
    Anyway,
    /// The pod is gone meanwhile.
    Gone,
    /// The drain's deadline passed.
    PastDeadline,
}

/// Before a try, the budget's own word, from the drain pass's cache: while the status
/// of the budget that selects the pod allows no disruption (or this process's tries in
/// flight took what it allows, or it already refused one at this status), waits for
/// the budget's next status instead of collecting a 429 that spends the API rate.
/// When the budget has not changed for about `evictionRetryInterval`, it tries anyway:
/// a stopped disruption controller writes no new status, and the API server has the
/// last word. (While the budget changes, other drains are using it: no try could go.)
/// Says so in an Event once the pod has waited 5 s (or `evictionRetryInterval`): a budget
/// that lets a storm's evictions through one by one is no news, one that holds a
/// drain is.
async fn hold(
    stage: &Stage<'_>,
    node: &str,
    pod: &PodRef,
    deadline: Instant,
    (told, held_since): (&mut bool, &mut Option<Instant>),
    still_there: &impl Fn() -> bool,
) -> Held {
    if !stage.settings.budget_watch {
        return Held::Try(None);
    }
    let retry = stage.settings.eviction_retry;
    let mut give_up = Instant::now() + jitter(retry, pod);
    let mut counted = false;
    loop {
        let Some(pass) = stage.passes.current() else {
            return Held::Try(None);
        };
        let (budget, allowed, pending, mut changes) =
            match pass.verdict(&pod.namespace, &pod.labels) {
                Verdict::Go(ticket) => return Held::Try(ticket),
                Verdict::Hold {
                    budget,
                    allowed,
                    answer_pending,
                    changes,
                } => (budget, allowed, answer_pending, changes),
            };
        drop(pass);
        let now = Instant::now();
        if now >= deadline {
            return Held::PastDeadline;
        }
        // A try of ours at this status waits for its answer (in a storm, for its API
        // token): the answer moves the status, no timer needs to.
        if pending {
            give_up = give_up.max(now + jitter(retry, pod));
        } else if now >= give_up {
            stage.stats.evictions_forced.fetch_add(1, Ordering::Relaxed);
            return Held::Anyway;
        }
        if !counted {
            Metrics::outcome(&metrics().evictions, "held_by_budget");
            stage.stats.evictions_held.fetch_add(1, Ordering::Relaxed);
            counted = true;
        }
        let since = *held_since.get_or_insert(now);
        let tell_after = retry.min(TELL_HELD_AFTER);
        if !*told && now >= since + tell_after {
            stage
                .events
                .node_about_pod(node, Reason::EvictionBlocked, format!("eviction of {pod} waits on PodDisruptionBudget {budget}: its status allows {} disruption(s) now and they are taken; trying when it allows one", allowed.max(0)), pod)
                .await;
            *told = true;
        }
        let tell_at = if *told { deadline } else { since + tell_after };
        let wake = give_up.min(deadline).min(tell_at);
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(wake) => {}
            changed = changes.changed() => match changed {
                Ok(()) => give_up = Instant::now() + jitter(retry, pod),
                // Nobody ticks any more (the pass ended): only the timer is left.
                Err(_) => tokio::time::sleep_until(wake).await,
            },
        }
        if !still_there() {
            return Held::Gone;
        }
    }
}

/// Evicts one pod, retrying refusals until accepted, gone, or the deadline. Publishes
/// one Event the first time a PDB blocks it. Returns whether it was accepted or gone.
pub async fn until_accepted(
    stage: &Stage<'_>,
    node: &str,
    pod: &PodRef,
    why: &str,
    deadline: Instant,
    still_there: impl Fn() -> bool,
) -> bool {
    let mut tries = Tries::new(stage);
    loop {
        if !still_there() {
            return true;
        }
        // Sent already by this process (a run of this drain before a restart): its
        // answer stands. One still in flight at the deadline leaves the pod to the
        // deadline's policy, never to a second eviction.
        match stage.evictions.earlier(&pod.uid, deadline).await {
            Earlier::Accepted => return true,
            Earlier::Unanswered => return false,
            Earlier::Nothing => {}
        }
        let tell = (&mut tries.told, &mut tries.held_since);
        let (ticket, anyway) = match hold(stage, node, pod, deadline, tell, &still_there).await {
            Held::Try(ticket) => (ticket, false),
            Held::Anyway => (None, true),
            Held::Gone => return true,
            Held::PastDeadline => return false,
        };
        // The budget's status is known: after a refusal the next wait is on it (in
        // `hold`, which tries again at least every `evictionRetryInterval`).
        let status_known = ticket.is_some() || anyway;
        let outcome = attempt(stage, pod).await;
        if let Some(t) = ticket {
            t.settle(match outcome {
                Attempt::Evicted => Settle::Used,
                Attempt::Blocked(_) => Settle::Refused,
                _ => Settle::Unused,
            });
        }
        // Whether a change of the budget's pods may bring the next try forward (only
        // a budget's refusal: an APF 429 keeps its Retry-After).
        let early = match outcome {
            Attempt::Evicted => {
                say_evicted(stage, node, pod, why).await;
                return true;
            }
            Attempt::Gone => return true,
            Attempt::Blocked(why) => {
                tries.blocked(node, pod, &why).await;
                if status_known {
                    if Instant::now() >= deadline {
                        return false;
                    }
                    continue;
                }
                tries.watch_budgets(pod).await;
                true
            }
            Attempt::Throttled(after) => {
                tracing::debug!(node, pod = %pod, retry_after = ?after, "eviction throttled by the API server (not a PodDisruptionBudget)");
                tries.backoff = after;
                false
            }
            Attempt::OverlappingBudgets(names) => {
                tries.overlapping(node, pod, &names).await;
                false
            }
            Attempt::Error(e) => {
                tracing::warn!(node, pod = %pod, error = %e, "eviction failed; retrying");
                tries.back_off();
                false
            }
        };
        if !tries.wait_next(pod, deadline, early).await {
            return false;
        }
    }
}

/// The `PodEvicted` Event on the pod: who evicted it and why.
async fn say_evicted(stage: &Stage<'_>, node: &str, pod: &PodRef, why: &str) {
    stage
        .events
        .pod(
            pod,
            node,
            Reason::PodEvicted,
            format!("evicted by ca-asg-provider: node {node} is being drained ({why})"),
        )
        .await;
}

/// What the tries of one pod's eviction carry from one to the next.
struct Tries<'s, 'a> {
    stage: &'s Stage<'a>,
    /// The refusal was said (one Event per pod).
    told: bool,
    /// Since when a budget's status has held the pod back ([`hold`]).
    held_since: Option<Instant>,
    /// How long until the next try.
    backoff: Duration,
    /// Once a budget refused and its status could not say when it allows again: the
    /// watches of its pods, so the next try goes the moment a replacement is Ready
    /// instead of at the next tick of the fixed retry.
    budget_waits: Option<Vec<crate::scalein::kube::budgets::BudgetWait>>,
}

impl<'s, 'a> Tries<'s, 'a> {
    fn new(stage: &'s Stage<'a>) -> Self {
        Tries {
            stage,
            told: false,
            held_since: None,
            backoff: stage.settings.eviction_retry,
            budget_waits: None,
        }
    }

    /// A budget refused: said once, and the next try at the fixed retry.
    async fn blocked(&mut self, node: &str, pod: &PodRef, why: &str) {
        let backoff = self.backoff;
        if !self.told {
            self.stage
                .events
                .node_about_pod(node, Reason::EvictionBlocked, format!("eviction of {pod} blocked by a PodDisruptionBudget: {why}; retrying when the budget allows, at the latest every {backoff:?}"), pod)
                .await;
            self.told = true;
        }
        self.backoff = self.stage.settings.eviction_retry;
    }

    /// Watches the pods of the budgets that select `pod` (once).
    async fn watch_budgets(&mut self, pod: &PodRef) {
        let stage = self.stage;
        if self.budget_waits.is_none() && stage.settings.budget_watch {
            let every_pod = stage.passes.shared_pods();
            let waits = selecting(stage, pod)
                .await
                .iter()
                .map(|(_, sel)| {
                    stage
                        .budgets
                        .subscribe(&pod.namespace, sel, every_pod.clone())
                })
                .collect();
            self.budget_waits = Some(waits);
        }
    }

    /// More than one budget selects the pod: said once, and tried again backing off.
    async fn overlapping(&mut self, node: &str, pod: &PodRef, names: &[String]) {
        if !self.told {
            let which = if names.is_empty() {
                "more than one PodDisruptionBudget".to_string()
            } else {
                format!("PodDisruptionBudgets {}", names.join(", "))
            };
            self.stage
                .events
                .node_about_pod(node, Reason::EvictionBlocked, format!("eviction of {pod} refused: {which} select it, and the Eviction API accepts at most one; fix the overlapping budgets; retrying"), pod)
                .await;
            self.told = true;
        }
        self.back_off();
    }

    /// Doubles the wait, from the fixed retry up to 30 s.
    fn back_off(&mut self) {
        self.backoff = (self.backoff * 2)
            .min(Duration::from_secs(30))
            .max(self.stage.settings.eviction_retry);
    }

    /// Waits for the next try: the backoff (jittered), cut short by a change of the
    /// watched budgets' pods when `early`. `false`: the deadline has passed.
    async fn wait_next(&mut self, pod: &PodRef, deadline: Instant, early: bool) -> bool {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        let timer = tokio::time::sleep(jitter(self.backoff, pod).min(deadline - now));
        match self.budget_waits.as_mut().filter(|_| early) {
            Some(waits) => {
                tokio::select! {
                    biased;
                    _ = timer => {}
                    _ = crate::scalein::kube::budgets::any_changed(waits) => {
                        // Many drains may wait on one budget whose status says nothing:
                        // spread their tries over a moment so the one it allows is not
                        // lost in a herd.
                        let spread = jitter(Duration::from_millis(150), pod);
                        tokio::time::sleep(spread.min(deadline.saturating_duration_since(Instant::now()))).await;
                    }
                }
            }
            None => timer.await,
        }
        true
    }
}

/// 0.8x to 1.2x, from a random source per call, so many drains blocked by the same
/// budget do not retry in lockstep.
fn jitter(d: Duration, pod: &PodRef) -> Duration {
    d.mul_f64(0.8 + 0.4 * crate::clock::random_fraction(&pod.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::response::{StatusCause, StatusDetails};
    use kube::core::Status;

    fn status_429(causes: Vec<StatusCause>, retry_after: u32) -> Status {
        let mut s = Status::failure("Too many requests", "TooManyRequests").with_code(429);
        s.details = Some(StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: "pods".into(),
            uid: String::new(),
            causes,
            retry_after_seconds: retry_after,
        });
        s
    }

    #[test]
    fn a_budgets_429_blocks_and_apfs_429_throttles() {
        let pdb = status_429(
            vec![StatusCause {
                reason: "DisruptionBudget".into(),
                message: "The disruption budget web-pdb needs 2 healthy pods and has 2 currently"
                    .into(),
                field: String::new(),
            }],
            0,
        );
        assert_eq!(
            classify_429(&pdb),
            Attempt::Blocked(
                "The disruption budget web-pdb needs 2 healthy pods and has 2 currently".into()
            )
        );
        assert_eq!(
            classify_429(&status_429(vec![], 3)),
            Attempt::Throttled(Duration::from_secs(3))
        );
        assert_eq!(
            classify_429(&status_429(vec![], 0)),
            Attempt::Throttled(Duration::from_secs(1)),
            "no Retry-After: one second"
        );
        let mut bare = Status::failure("Too many requests", "TooManyRequests").with_code(429);
        bare.details = None;
        assert_eq!(
            classify_429(&bare),
            Attempt::Throttled(Duration::from_secs(1))
        );
    }

    #[test]
    fn jitter_spreads_and_stays_within_a_fifth() {
        let d = Duration::from_secs(5);
        let pod = PodRef {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: "u".into(),
            labels: Default::default(),
        };
        let samples: Vec<Duration> = (0..200).map(|_| jitter(d, &pod)).collect();
        assert!(samples
            .iter()
            .all(|s| *s >= d.mul_f64(0.8) && *s <= d.mul_f64(1.2)));
        let distinct: std::collections::BTreeSet<Duration> = samples.into_iter().collect();
        assert!(distinct.len() > 100, "{} distinct of 200", distinct.len());
    }
}
