//! The engine's bookkeeping: which drain runs for each instance (a new reason joins
//! the one that runs, a duplicate changes nothing), which lifecycle actions this
//! replica heartbeats and at what timeout, which of our hook's actions are over,
//! whose direct-mode end is in flight, and what was said once. Every map is
//! bounded; nothing here does I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;

use parking_lot::Mutex;
use tokio::sync::{watch, OwnedMutexGuard, OwnedSemaphorePermit};
use tokio::task::JoinHandle;

use crate::scalein::decide::record::{DrainRecord, Joined, Limits};
use crate::scalein::decide::story::{ActionMemories, NOT_HELD_RECHECK};
use crate::scalein::request::{merge, DrainRequest, Outcome, Start};
use crate::scalein::stages::drain::AbortOnDrop;

/// Finished drains (and the other facts kept here) are kept until this many are
/// known.
pub(crate) const FINISHED_KEPT: usize = 10_000;

/// A drain task and what it was started with (its reasons joined so far).
struct Inflight {
    handle: JoinHandle<Outcome>,
    req: DrainRequest,
}

/// The `maxConcurrentDrains` slots of drains, kept here and not in the drain tasks:
/// a drain restarted for a new reason (a spot warning joining) goes on in the slot
/// it had instead of queueing behind drains that budgets block.
#[derive(Default)]
struct Slots {
    /// The newest run of each instance's drain ([`Book::start`] counts the runs).
    newest: BTreeMap<String, u64>,
    /// The slot each drain holds, and the run that holds it.
    held: BTreeMap<String, (u64, OwnedSemaphorePermit)>,
}

/// The heartbeats of one lifecycle action, and the hook's heartbeat timeout they
/// follow (a changed timeout reschedules them).
struct Hold {
    task: AbortOnDrop,
    timeout: watch::Sender<Duration>,
}

/// What [`Book::hold`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldChange {
    Started,
    Same,
    /// The heartbeats run and now follow another timeout: this one was.
    Changed {
        was: Duration,
    },
}

/// What the engine keeps track of.
#[derive(Default)]
pub(crate) struct Book {
    drains: Mutex<BTreeMap<String, Inflight>>,
    /// The number of the next drain run started.
    runs: std::sync::atomic::AtomicU64,
    slots: Mutex<Slots>,
    /// Heartbeats of the lifecycle actions our hook holds, by instance: they follow
    /// the hook, not the drain (a drain restarted for a new reason, or failed and
    /// retrying, keeps them).
    holds: Mutex<BTreeMap<String, Hold>>,
    /// What this replica remembers of our hook's actions, one record per instance
    /// ([`ActionMemories`]): the actions it completed (or found complete; AWS keeps such
    /// an instance in Terminating:Wait while another hook, EKS's `Terminate-LC-Hook` on
    /// a managed node group, still holds it, and the scan must not take it for a new
    /// action and drain it again while AWS cannot be asked), and AWS's recent answers
    /// that our hook holds no action on it.
    memories: Memories,
    /// One direct-mode end per instance at a time (see [`Book::end_turn`]).
    ends: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// (kind, key) pairs already said once: another tool's terminating hook, a dry
    /// run's drain or hook.
    noted: Mutex<BTreeSet<(&'static str, String)>>,
}

/// The book's [`ActionMemories`], bounded by [`FINISHED_KEPT`] finished actions and
/// [`NOT_HELD_RECHECK`].
struct Memories(Mutex<ActionMemories>);

impl Default for Memories {
    fn default() -> Self {
        Self(Mutex::new(ActionMemories::new(
            FINISHED_KEPT,
            NOT_HELD_RECHECK,
        )))
    }
}

/// The reasons of a running drain with a new request's joined, when they change its
/// plan (a budget, a hook, CA's scale-in); `None`: the request is a duplicate. A
/// hook's reason always changes the plan's end, so a lifecycle request never passes
/// as a duplicate of another kind of drain.
pub(crate) fn joined(
    running: &DrainRequest,
    new: &DrainRequest,
    limits: Limits,
) -> Option<DrainRecord> {
    let mut record = DrainRecord {
        reasons: running.reasons.clone(),
        ..DrainRecord::default()
    };
    let mut changed = false;
    for r in &new.reasons {
        changed |= record.join(r.clone(), limits) == Joined::Changed;
    }
    changed.then_some(record)
}

impl Book {
    /// Runs `req`'s drain (through `spawn`, given the request it goes on with), or
    /// joins it into the drain that runs for the instance: a request that changes
    /// the plan stops that drain and starts one with every reason; a duplicate
    /// changes nothing. Under one lock: two requests for one instance never run two
    /// drains.
    pub(crate) fn start(
        &self,
        req: DrainRequest,
        limits: Limits,
        spawn: impl FnOnce(DrainRequest, Start, u64) -> JoinHandle<Outcome>,
    ) -> Start {
        let mut drains = self.drains.lock();
        let (req, how) = match drains.remove(&req.instance_id) {
            Some(running) if !running.handle.is_finished() => {
                let Some(record) = joined(&running.req, &req, limits) else {
                    drains.insert(req.instance_id.clone(), running);
                    return Start::Unchanged;
                };
                running.handle.abort();
                tracing::info!(instance = %req.instance_id, source = ?req.source, "a new reason joins the running drain; it goes on with every reason");
                (merge(running.req, req, record), Start::Joined)
            }
            _ => (req, Start::Started),
        };
        let run = self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        {
            // The slot the instance's drain holds passes to this run.
            let mut slots = self.slots.lock();
            if slots.newest.len() >= FINISHED_KEPT {
                // Bounded by the drains that run: one still waiting for a slot holds
                // none yet, and forgetting its run would make the slot it then takes
                // look like a replaced run's (given back at once, the drain going on
                // without one, beyond `maxConcurrentDrains`).
                let Slots { newest, held } = &mut *slots;
                newest.retain(|i, _| {
                    held.contains_key(i) || drains.get(i).is_some_and(|f| !f.handle.is_finished())
                });
            }
            slots.newest.insert(req.instance_id.clone(), run);
            if let Some((holder, _)) = slots.held.get_mut(&req.instance_id) {
                *holder = run;
            }
        }
        let handle = spawn(req.clone(), how, run);
        track(&mut drains, req, handle);
        how
    }

    /// Whether drain run `run` of the instance holds a slot (its own, or the one of
    /// the run it replaced).
    pub(crate) fn has_slot(&self, instance_id: &str, run: u64) -> bool {
        self.slots
            .lock()
            .held
            .get(instance_id)
            .is_some_and(|(holder, _)| *holder == run)
    }

    /// Keeps the slot drain run `run` took; a run that was replaced meanwhile gives
    /// it back at once (dropped).
    pub(crate) fn keep_slot(&self, instance_id: &str, run: u64, slot: OwnedSemaphorePermit) {
        let mut slots = self.slots.lock();
        if slots.newest.get(instance_id) == Some(&run) {
            slots.held.insert(instance_id.to_string(), (run, slot));
        }
    }

    /// Drain run `run` is over: its slot goes back, unless a newer run took it over.
    pub(crate) fn give_back_slot(&self, instance_id: &str, run: u64) {
        let mut slots = self.slots.lock();
        if slots
            .held
            .get(instance_id)
            .is_some_and(|(holder, _)| *holder == run)
        {
            slots.held.remove(instance_id);
            slots.newest.remove(instance_id);
        }
    }

    /// Keeps a dry run's description task like a drain (for `wait_for`).
    pub(crate) fn observe(&self, req: DrainRequest, handle: JoinHandle<Outcome>) {
        track(&mut self.drains.lock(), req, handle);
    }

    /// Drains asked for and not finished: running, or cordoned and waiting for a slot.
    pub(crate) fn running(&self) -> usize {
        self.drains
            .lock()
            .values()
            .filter(|f| !f.handle.is_finished())
            .count()
    }

    pub(crate) fn is_running(&self, instance_id: &str) -> bool {
        self.drains
            .lock()
            .get(instance_id)
            .is_some_and(|f| !f.handle.is_finished())
    }

    /// The instance's drain task, no longer tracked (to wait for its outcome).
    pub(crate) fn take(&self, instance_id: &str) -> Option<JoinHandle<Outcome>> {
        self.drains.lock().remove(instance_id).map(|f| f.handle)
    }

    /// Stops the instance's drain and its heartbeats. True when a drain ran.
    pub(crate) fn stop(&self, instance_id: &str) -> bool {
        self.release(instance_id);
        self.slots.lock().held.remove(instance_id);
        match self.drains.lock().remove(instance_id) {
            Some(f) if !f.handle.is_finished() => {
                f.handle.abort();
                true
            }
            _ => false,
        }
    }

    /// Stops every drain and every heartbeat where they are.
    pub(crate) fn stop_all(&self) {
        for (_, f) in std::mem::take(&mut *self.drains.lock()) {
            f.handle.abort();
        }
        *self.slots.lock() = Slots::default();
        self.holds.lock().clear();
    }

    /// Starts the heartbeats of the instance's lifecycle action (through `spawn`,
    /// given the timeout they follow) unless they run; when they do, corrects the
    /// timeout they follow.
    pub(crate) fn hold(
        &self,
        instance_id: &str,
        timeout: Duration,
        spawn: impl FnOnce(watch::Receiver<Duration>) -> JoinHandle<()>,
    ) -> HoldChange {
        let mut holds = self.holds.lock();
        if let Some(h) = holds.get(instance_id).filter(|h| !h.task.0.is_finished()) {
            let mut was = timeout;
            let changed = h.timeout.send_if_modified(|t| {
                was = std::mem::replace(t, timeout);
                was != timeout
            });
            return if changed {
                HoldChange::Changed { was }
            } else {
                HoldChange::Same
            };
        }
        if holds.len() >= FINISHED_KEPT {
            holds.retain(|_, h| !h.task.0.is_finished());
        }
        let (tx, rx) = watch::channel(timeout);
        holds.insert(
            instance_id.to_string(),
            Hold {
                task: AbortOnDrop(spawn(rx)),
                timeout: tx,
            },
        );
        HoldChange::Started
    }

    /// The heartbeat timeout a held instance is heartbeated at, if it is held.
    pub(crate) fn held_timeout(&self, instance_id: &str) -> Option<Duration> {
        self.holds
            .lock()
            .get(instance_id)
            .filter(|h| !h.task.0.is_finished())
            .map(|h| *h.timeout.borrow())
    }

    /// Stops the heartbeats of the instance's action.
    pub(crate) fn release(&self, instance_id: &str) {
        self.holds.lock().remove(instance_id);
    }

    /// Our hook's lifecycle action for `instance_id` is over.
    pub(crate) fn note_action_done(&self, instance_id: &str) {
        self.memories.0.lock().finished(instance_id, Instant::now());
    }

    pub(crate) fn action_done(&self, instance_id: &str) -> bool {
        self.memories.0.lock().is_finished(instance_id)
    }

    /// Forgets the ended actions of instances `keep` says no longer exist.
    pub(crate) fn forget_actions_done(&self, keep: impl Fn(&str) -> bool) {
        self.memories.0.lock().keep_finished(keep);
    }

    /// Forgets the instance's ended action (our hook holds it with a new one).
    pub(crate) fn forget_action_done(&self, instance_id: &str) {
        self.memories.0.lock().forget_finished(instance_id);
    }

    /// AWS said just now that no action of our hook holds the instance, waiting in
    /// `state`.
    pub(crate) fn aws_said_not_held(&self, instance_id: &str, state: &str) {
        self.memories
            .0
            .lock()
            .aws_said_not_held(instance_id, state, Instant::now());
    }

    /// Whether AWS said so lately, with the instance in the same wait.
    pub(crate) fn not_held_lately(&self, instance_id: &str, state: &str) -> bool {
        self.memories
            .0
            .lock()
            .not_held_lately(instance_id, state, Instant::now())
    }

    /// The instance's turn to be ended: held while its termination and the note of
    /// it run, so a second drain of the instance waits for them.
    pub(crate) async fn end_turn(&self, instance_id: &str) -> OwnedMutexGuard<()> {
        let turn = {
            let mut ends = self.ends.lock();
            if ends.len() >= FINISHED_KEPT {
                ends.retain(|_, t| Arc::strong_count(t) > 1);
            }
            ends.entry(instance_id.to_string()).or_default().clone()
        };
        turn.lock_owned().await
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
}

/// Records a drain task, forgetting finished ones once [`FINISHED_KEPT`] are known.
fn track(drains: &mut BTreeMap<String, Inflight>, req: DrainRequest, handle: JoinHandle<Outcome>) {
    if drains.len() >= FINISHED_KEPT {
        drains.retain(|_, f| !f.handle.is_finished());
    }
    drains.insert(req.instance_id.clone(), Inflight { handle, req });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scalein::decide::record::{DrainReason, Why};
    use crate::scalein::{DeadlinePolicy, Mode, Source};

    fn req(reasons: Vec<Why>) -> DrainRequest {
        let at = crate::clock::utc_now();
        DrainRequest {
            instance_id: "i-1".into(),
            group: "web".into(),
            node_name: None,
            mode: Mode::Direct,
            source: Source::ClusterAutoscaler,
            reasons: reasons
                .into_iter()
                .map(|w| DrainReason::new(w, at))
                .collect(),
            noticed: None,
        }
    }

    fn limits() -> Limits {
        Limits {
            workload_deadline: Duration::from_secs(600),
            workload_policy: DeadlinePolicy::Abandon,
        }
    }

    #[test]
    fn a_duplicate_joins_nothing_and_a_new_reason_joins_with_every_reason() {
        let running = req(vec![Why::ScaleIn]);
        assert!(joined(&running, &req(vec![Why::ScaleIn]), limits()).is_none());
        assert!(joined(&running, &req(vec![]), limits()).is_none());
        // A rebalance cordon changes no plan of a drain that runs.
        assert!(joined(&running, &req(vec![Why::Rebalance]), limits()).is_none());
        let hook = Why::Lifecycle {
            hook: "ca-asg-provider-drain".into(),
        };
        let with_hook = joined(&running, &req(vec![hook.clone()]), limits())
            .expect("a hook's reason changes the end");
        let whys: Vec<&Why> = with_hook.reasons.iter().map(|r| &r.why).collect();
        assert_eq!(whys, [&Why::ScaleIn, &hook]);
    }

    #[tokio::test]
    async fn one_drain_per_instance_and_the_maps_stay_bounded() {
        let book = Book::default();
        let spawned = std::sync::atomic::AtomicUsize::new(0);
        let spawn = |_: DrainRequest, _: Start, _: u64| {
            spawned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::spawn(std::future::pending::<Outcome>())
        };
        assert_eq!(
            book.start(req(vec![Why::ScaleIn]), limits(), spawn),
            Start::Started
        );
        let again = |_: DrainRequest, _: Start, _: u64| -> JoinHandle<Outcome> {
            panic!("a duplicate spawns nothing")
        };
        assert_eq!(
            book.start(req(vec![Why::ScaleIn]), limits(), again),
            Start::Unchanged
        );
        assert!(book.is_running("i-1"));
        assert_eq!(book.running(), 1);
        assert!(book.stop("i-1"));
        assert!(!book.stop("i-1"), "nothing runs any more");
        assert_eq!(spawned.load(std::sync::atomic::Ordering::Relaxed), 1);

        for i in 0..FINISHED_KEPT + 5 {
            book.note_action_done(&format!("i-{i}"));
            book.note_once("k", format!("{i}"));
        }
        assert!(book.memories.0.lock().len() <= FINISHED_KEPT);
        assert!(book.noted.lock().len() <= FINISHED_KEPT);
        assert!(book.action_done(&format!("i-{}", FINISHED_KEPT + 4)));
    }

    fn req_for(instance: &str) -> DrainRequest {
        DrainRequest {
            instance_id: instance.into(),
            ..req(vec![Why::ScaleIn])
        }
    }

    /// Starts a drain that runs until stopped; returns its run.
    fn start_pending(book: &Book, instance: &str) -> u64 {
        let run = std::cell::Cell::new(None);
        book.start(req_for(instance), limits(), |_, _, r| {
            run.set(Some(r));
            tokio::spawn(std::future::pending::<Outcome>())
        });
        run.get().expect("a drain started")
    }

    /// What the drain does for its slot (drain::queue_for_slot): its own when it holds
    /// one, else the next free one, kept in the book.
    async fn take_slot(book: &Book, slots: &Arc<tokio::sync::Semaphore>, instance: &str, run: u64) {
        if !book.has_slot(instance, run) {
            let permit = slots.clone().acquire_owned().await.unwrap();
            book.keep_slot(instance, run, permit);
        }
    }

    /// Issue 59 (suspected item, proven): past FINISHED_KEPT runs the book forgot
    /// every run that held no slot, also a drain's still waiting for one. The slot it
    /// then took was taken for a replaced run's and given back at once: the drain went
    /// on without one, and the next drain took the same slot, two running with
    /// `maxConcurrentDrains` 1. A waiting drain keeps its place however many drains
    /// came and went: at most `maxConcurrentDrains` run.
    #[tokio::test(start_paused = true)]
    async fn a_drain_waiting_for_a_slot_keeps_it_past_the_books_bound() {
        let book = Book::default();
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let a = start_pending(&book, "i-a");
        take_slot(&book, &slots, "i-a", a).await;
        // b waits for the only slot.
        let b = start_pending(&book, "i-b");
        assert!(!book.has_slot("i-b", b));
        assert_eq!(slots.available_permits(), 0);
        // Drains that ended before their slot (a Node gone, a cordon-only record,
        // an instance that left): more than the book keeps.
        for i in 0..FINISHED_KEPT + 10 {
            let id = format!("i-gone-{i}");
            start_pending(&book, &id);
            book.stop(&id);
        }
        assert!(book.slots.lock().newest.len() <= FINISHED_KEPT);
        // a ends: b takes the slot, and holds it.
        book.give_back_slot("i-a", a);
        take_slot(&book, &slots, "i-b", b).await;
        assert!(book.has_slot("i-b", b), "b runs in its slot");
        assert_eq!(
            slots.available_permits(),
            0,
            "while b runs, no other drain has a slot"
        );
        let c = start_pending(&book, "i-c");
        assert!(
            tokio::time::timeout(
                Duration::from_millis(10),
                take_slot(&book, &slots, "i-c", c)
            )
            .await
            .is_err(),
            "c waits: one drain at a time"
        );
        book.give_back_slot("i-b", b);
        take_slot(&book, &slots, "i-c", c).await;
        assert!(book.has_slot("i-c", c));
    }
}
