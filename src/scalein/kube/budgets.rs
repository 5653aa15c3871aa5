//! Waiting on a PodDisruptionBudget, not on a timer. After a budget refuses an
//! eviction, the drain waits until a pod the budget selects changes (its replacement
//! is created, becomes Ready, a pod leaves): that is when the budget can allow the
//! next eviction. The fixed `evictionRetryInterval` stays as the fallback (a change
//! missed while the watch starts, a budget whose status lags). One watch per budget
//! selector, shared by every drain blocked on it and dropped when none waits, so a
//! storm of drains behind one budget opens one watch, not one per pod; and none at all
//! while the drain pass already watches every pod (its changes are matched here).

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::Selector;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::scalein::kube::wait::PodWatch;

/// (namespace, label selector) -> the watch of its pods, while anyone waits on it.
pub struct BudgetWatches {
    client: kube::Client,
    open: Mutex<BTreeMap<(String, String), Weak<Shared>>>,
}

struct Shared {
    changes: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Shared {
    /// The last waiter gone: the watch closes.
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A subscription to the changes of one budget's pods.
pub struct BudgetWait {
    /// What keeps its watch open.
    _source: Source,
    changes: watch::Receiver<u64>,
}

enum Source {
    /// A watch of this budget's pods alone.
    Own { _watch: Arc<Shared> },
    /// The drain pass's watch of every pod.
    Pass { _watch: Arc<PodWatch> },
}

impl BudgetWatches {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            open: Mutex::new(BTreeMap::new()),
        }
    }

    /// Waits from now on for changes of the pods `selector` picks in `namespace`:
    /// on the pass's watch of every pod when there is one (no request), else on a
    /// watch of those pods.
    pub fn subscribe(
        &self,
        namespace: &str,
        selector: &Selector,
        every_pod: Option<Arc<PodWatch>>,
    ) -> BudgetWait {
        if let Some(pods) = every_pod {
            return BudgetWait {
                changes: pods.selector_changes(namespace, selector),
                _source: Source::Pass { _watch: pods },
            };
        }
        let selector = selector.to_string();
        let key = (namespace.to_string(), selector.clone());
        let mut open = self.open.lock();
        open.retain(|_, w| w.strong_count() > 0);
        let shared = match open.get(&key).and_then(Weak::upgrade) {
            Some(s) => s,
            None => {
                let s = Arc::new(self.start(namespace, &selector));
                open.insert(key, Arc::downgrade(&s));
                s
            }
        };
        let mut changes = shared.changes.clone();
        changes.borrow_and_update();
        BudgetWait {
            _source: Source::Own { _watch: shared },
            changes,
        }
    }

    /// Budget watches open now (tests, and the storm's request count).
    pub fn open(&self) -> usize {
        self.open
            .lock()
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    fn start(&self, namespace: &str, selector: &str) -> Shared {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let cfg = watcher::Config::default().labels(selector);
        let (tx, changes) = watch::channel(0u64);
        let what = format!("{namespace}/{selector}");
        let backoff =
            crate::scalein::kube::watch_backoff::for_watch(&format!("budget pods {what}"));
        let task = tokio::spawn(async move {
            let stream = watcher::watcher(api, cfg).backoff(backoff);
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    // The initial list says nothing new; a change after it does.
                    Ok(Event::Init | Event::InitApply(_) | Event::InitDone) => {}
                    Ok(Event::Apply(_) | Event::Delete(_)) => tx.send_modify(|g| *g += 1),
                    Err(e) => {
                        tracing::debug!(pods = %what, error = %e, "budget watch error; the fixed retry covers the gap")
                    }
                }
            }
        });
        Shared { changes, task }
    }
}

impl BudgetWait {
    /// Resolves at the next change of a selected pod (never, if the watch is gone:
    /// callers race it against their fallback timer).
    pub async fn changed(&mut self) {
        if self.changes.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Resolves when any of the waits sees a change.
pub async fn any_changed(waits: &mut [BudgetWait]) {
    if waits.is_empty() {
        return std::future::pending().await;
    }
    let futs = waits.iter_mut().map(|w| Box::pin(w.changed()));
    futures::future::select_all(futs).await;
}

/// The budget's selector, if it picks a pod with these labels.
pub fn selector_picking(
    budget: &PodDisruptionBudget,
    labels: &std::collections::BTreeMap<String, String>,
) -> Option<Selector> {
    use kube::core::SelectorExt;
    let sel = budget
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .and_then(|sel| Selector::try_from(sel).ok())?;
    sel.matches(labels).then_some(sel)
}

/// What a budget's status allows now, when it can be told: `disruptionsAllowed`, if
/// the status describes the budget's current spec. `None` for a budget without a
/// status yet or whose new spec the disruption controller has not seen (the API
/// server refuses then; the try finds out).
pub fn allowance(budget: &PodDisruptionBudget) -> Option<i32> {
    let status = budget.status.as_ref()?;
    let observed = status.observed_generation?;
    if observed < budget.metadata.generation.unwrap_or(0) {
        return None;
    }
    Some(status.disruptions_allowed)
}

/// One budget as a try sees it: its key, the resourceVersion of what the cache holds,
/// and what that status allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetView {
    pub namespace: String,
    pub name: String,
    pub resource_version: String,
    pub allowed: Option<i32>,
}

impl BudgetView {
    pub fn of(budget: &PodDisruptionBudget) -> Self {
        Self {
            namespace: budget.metadata.namespace.clone().unwrap_or_default(),
            name: budget.metadata.name.clone().unwrap_or_default(),
            resource_version: budget.metadata.resource_version.clone().unwrap_or_default(),
            allowed: allowance(budget),
        }
    }
}

/// This process's tries against each budget's status: a status that allows `n`
/// disruptions lets `n` tries go, not one per waiting drain (the rest would only
/// collect 429s and spend the API rate), and a status the API server already refused
/// a try at lets none go. A new status (a new resourceVersion) starts over. Held per
/// drain pass, so it holds only the budgets its drains met.
#[derive(Default)]
pub struct Claims {
    taken: Mutex<BTreeMap<(String, String), Taken>>,
}

#[derive(Debug, Default)]
struct Taken {
    resource_version: String,
    /// Tries at that status sent and not answered yet.
    in_flight: i32,
    /// Tries at that status the API server accepted.
    used: i32,
    /// The API server refused a try at that status: it is stale.
    refused: bool,
}

/// What the cached status says of a try.
#[derive(Debug)]
pub enum Claim {
    /// Try; the ticket, if the status was known, settles what the try took.
    Go(Option<Ticket>),
    /// The status allows none now (or this process's tries took what it allows).
    /// `answer_pending`: one of them is not answered yet, and its answer changes the
    /// status (an accepted eviction writes it) or settles it.
    Hold { allowed: i32, answer_pending: bool },
}

/// How a try went, for the budget's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Accepted: it took one disruption until the budget's next status.
    Used,
    /// A 429 from the budget: no try goes at this status.
    Refused,
    /// Anything else (gone, throttled, an error): it took nothing.
    Unused,
}

/// One try counted against one budget's status, settled when dropped: as
/// [`Ticket::settle`] said, or `Unused` (it took nothing).
#[derive(Debug)]
pub struct Ticket {
    claims: Weak<Claims>,
    key: (String, String),
    resource_version: String,
    how: Settle,
}

impl Claims {
    /// Whether a pod these budgets select may be tried now. No budget: go. Several:
    /// go too (the Eviction API refuses overlapping budgets and says which).
    pub fn claim(self: &Arc<Self>, budgets: &[BudgetView]) -> Claim {
        let [b] = budgets else {
            return Claim::Go(None);
        };
        let Some(allowed) = b.allowed else {
            return Claim::Go(None);
        };
        let key = (b.namespace.clone(), b.name.clone());
        let mut taken = self.taken.lock();
        let t = taken.entry(key.clone()).or_default();
        if t.resource_version != b.resource_version {
            *t = Taken {
                resource_version: b.resource_version.clone(),
                ..Taken::default()
            };
        }
        if t.refused || t.in_flight + t.used >= allowed {
            return Claim::Hold {
                allowed,
                answer_pending: t.in_flight > 0,
            };
        }
        t.in_flight += 1;
        Claim::Go(Some(Ticket {
            claims: Arc::downgrade(self),
            key,
            resource_version: b.resource_version.clone(),
            how: Settle::Unused,
        }))
    }

    fn settle(&self, ticket: &Ticket, how: Settle) {
        let mut taken = self.taken.lock();
        let Some(t) = taken.get_mut(&ticket.key) else {
            return;
        };
        // A newer status counts from scratch: this try is in it or not, as the API
        // server wrote it.
        if t.resource_version != ticket.resource_version {
            return;
        }
        t.in_flight = (t.in_flight - 1).max(0);
        match how {
            Settle::Used => t.used += 1,
            Settle::Refused => t.refused = true,
            Settle::Unused => {}
        }
    }
}

impl Ticket {
    pub fn settle(mut self, how: Settle) {
        self.how = how;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(c) = self.claims.upgrade() {
            c.settle(self, self.how);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_picks_the_pods_its_selector_matches() {
        let labels =
            |app: &str| std::collections::BTreeMap::from([("app".to_string(), app.to_string())]);
        let budget: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}},
        }))
        .unwrap();
        let sel = selector_picking(&budget, &labels("web")).expect("picks app=web");
        assert_eq!(sel.to_string(), "app=web");
        assert!(selector_picking(&budget, &labels("batch")).is_none());
        let mut bare = budget.clone();
        bare.spec.as_mut().unwrap().selector = None;
        assert!(
            selector_picking(&bare, &labels("web")).is_none(),
            "no selector picks nothing"
        );
    }
    use k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus;

    fn view(rv: &str, allowed: Option<i32>) -> BudgetView {
        BudgetView {
            namespace: "shop".into(),
            name: "web".into(),
            resource_version: rv.into(),
            allowed,
        }
    }

    fn go(c: Claim) -> Option<Ticket> {
        match c {
            Claim::Go(t) => t,
            Claim::Hold { allowed, .. } => panic!("held (allowed {allowed})"),
        }
    }

    fn held(c: &Claim) -> bool {
        matches!(c, Claim::Hold { .. })
    }

    #[test]
    fn a_status_lets_as_many_tries_go_as_it_allows() {
        let claims = Arc::new(Claims::default());
        let one = go(claims.claim(&[view("7", Some(2))])).expect("a ticket");
        let _two = go(claims.claim(&[view("7", Some(2))])).expect("a ticket");
        assert!(
            held(&claims.claim(&[view("7", Some(2))])),
            "two allowed, two out"
        );
        // A try that took nothing gives its place back.
        one.settle(Settle::Unused);
        assert!(go(claims.claim(&[view("7", Some(2))])).is_some());
    }

    #[test]
    fn a_hold_says_whether_an_answer_is_pending() {
        let claims = Arc::new(Claims::default());
        let out = go(claims.claim(&[view("7", Some(1))])).unwrap();
        assert!(matches!(
            claims.claim(&[view("7", Some(1))]),
            Claim::Hold {
                allowed: 1,
                answer_pending: true
            }
        ));
        out.settle(Settle::Used);
        assert!(matches!(
            claims.claim(&[view("7", Some(1))]),
            Claim::Hold {
                answer_pending: false,
                ..
            }
        ));
    }

    #[test]
    fn an_accepted_try_keeps_its_place_until_the_next_status() {
        let claims = Arc::new(Claims::default());
        go(claims.claim(&[view("7", Some(1))]))
            .unwrap()
            .settle(Settle::Used);
        assert!(held(&claims.claim(&[view("7", Some(1))])));
        // The API server's next status (written with the eviction, or by the
        // disruption controller) is what counts from then on.
        assert!(go(claims.claim(&[view("8", Some(1))])).is_some());
        assert!(held(&claims.claim(&[view("9", Some(0))])));
    }

    #[test]
    fn a_refusal_holds_every_try_at_that_status() {
        let claims = Arc::new(Claims::default());
        go(claims.claim(&[view("7", Some(3))]))
            .unwrap()
            .settle(Settle::Refused);
        assert!(
            held(&claims.claim(&[view("7", Some(3))])),
            "the status is stale"
        );
        assert!(go(claims.claim(&[view("8", Some(3))])).is_some());
    }

    #[test]
    fn a_settle_for_an_older_status_changes_nothing() {
        let claims = Arc::new(Claims::default());
        let old = go(claims.claim(&[view("7", Some(1))])).unwrap();
        let new = go(claims.claim(&[view("8", Some(1))])).unwrap();
        old.settle(Settle::Refused);
        assert!(
            held(&claims.claim(&[view("8", Some(1))])),
            "the new one is out"
        );
        drop(new);
        assert!(
            go(claims.claim(&[view("8", Some(1))])).is_some(),
            "dropped: given back"
        );
    }

    #[test]
    fn unknown_none_or_several_budgets_never_hold() {
        let claims = Arc::new(Claims::default());
        assert!(go(claims.claim(&[])).is_none());
        assert!(go(claims.claim(&[view("7", None)])).is_none());
        assert!(go(claims.claim(&[view("7", Some(0)), view("3", Some(0))])).is_none());
        assert!(held(&claims.claim(&[view("7", Some(0))])));
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A drain asks to try.
        Claim,
        /// The answer to the n-th try still out (modulo how many are out).
        Answer(usize, Settle),
        /// The API server or the disruption controller writes a new status.
        NewStatus(i32),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => Just(Op::Claim),
            3 => (0usize..8, prop_oneof![Just(Settle::Used), Just(Settle::Refused), Just(Settle::Unused)])
                .prop_map(|(n, s)| Op::Answer(n, s)),
            1 => (0i32..3).prop_map(Op::NewStatus),
        ]
    }

    proptest::proptest! {
        /// Random tries, answers and statuses, checked after every step: at one
        /// status, the tries out plus those accepted never exceed what it allows; none
        /// goes at a status a try was refused at; and when nothing is out, taken or
        /// refused at a status that allows one, a try goes.
        #[test]
        fn tries_at_a_status_never_exceed_what_it_allows(ops in proptest::collection::vec(op(), 1..60)) {
            let claims = Arc::new(Claims::default());
            let (mut rv, mut allowed) = (1u32, 1i32);
            // Tickets out, with the status they were taken at.
            let mut out: Vec<(u32, Ticket)> = Vec::new();
            let (mut used, mut refused) = (0i32, false);
            for op in ops {
                match op {
                    Op::Claim => match claims.claim(&[view(&rv.to_string(), Some(allowed))]) {
                        Claim::Go(t) => {
                            let here = out.iter().filter(|(r, _)| *r == rv).count() as i32;
                            proptest::prop_assert!(!refused, "a try at a status that refused one");
                            proptest::prop_assert!(here + used < allowed, "a try past the allowance: {here} out, {used} used of {allowed}");
                            out.push((rv, t.expect("a known status gives a ticket")));
                        }
                        Claim::Hold { answer_pending, .. } => {
                            let here = out.iter().filter(|(r, _)| *r == rv).count() as i32;
                            proptest::prop_assert!(refused || here + used >= allowed, "held with room: {here} out, {used} used of {allowed}");
                            proptest::prop_assert_eq!(answer_pending, here > 0);
                        }
                    },
                    Op::Answer(n, how) => {
                        if out.is_empty() { continue; }
                        let (at, t) = out.remove(n % out.len());
                        t.settle(how);
                        if at == rv {
                            match how {
                                Settle::Used => used += 1,
                                Settle::Refused => refused = true,
                                Settle::Unused => {}
                            }
                        }
                    }
                    Op::NewStatus(a) => {
                        rv += 1;
                        allowed = a;
                        used = 0;
                        refused = false;
                    }
                }
                let here = out.iter().filter(|(r, _)| *r == rv).count() as i32;
                proptest::prop_assert!(here + used <= allowed, "{here} out + {used} used > {allowed} allowed");
            }
        }
    }

    #[test]
    fn allowance_needs_a_status_of_the_current_spec() {
        let mut b = PodDisruptionBudget::default();
        b.metadata.generation = Some(2);
        assert_eq!(allowance(&b), None, "no status yet");
        b.status = Some(PodDisruptionBudgetStatus {
            disruptions_allowed: 1,
            observed_generation: Some(1),
            ..Default::default()
        });
        assert_eq!(allowance(&b), None, "it describes the older spec");
        b.status.as_mut().unwrap().observed_generation = Some(2);
        assert_eq!(allowance(&b), Some(1));
        b.status.as_mut().unwrap().observed_generation = None;
        assert_eq!(allowance(&b), None, "no observedGeneration: not told");
    }
}
