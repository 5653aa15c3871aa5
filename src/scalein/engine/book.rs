//! The engine's bookkeeping, one record per instance ([`Entry`]): the drain that runs
//! for it (a new reason joins the one that runs, a duplicate changes nothing), the
//! `maxConcurrentDrains` slot that drain runs in, the heartbeats of our hook's action
//! on it and the timeout they follow, its turn to be ended, and what this replica
//! remembers of our hook's actions on it ([`ActionMemories`]), all under one lock, so
//! no two of them can disagree about an instance. [`Book::story`] reads the record as
//! one [`InstanceStory`]. Also what was said once. Every map is bounded; nothing here
//! does I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;

use parking_lot::Mutex;
use tokio::sync::{watch, OwnedMutexGuard};
use tokio::task::JoinHandle;

use crate::scalein::decide::budget::Placed;
use crate::scalein::decide::record::{DrainRecord, Joined, Limits};
use crate::scalein::decide::story::{ActionMemories, InstanceStory, NOT_HELD_RECHECK};
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

impl Inflight {
    fn runs(&self) -> bool {
        !self.handle.is_finished()
    }
}

/// The heartbeats of one lifecycle action, and the hook's heartbeat timeout they
/// follow (a changed timeout reschedules them).
struct Hold {
    task: AbortOnDrop,
    timeout: watch::Sender<Duration>,
    /// When its heartbeats began: the hook's global limit counts from about then.
    since: Instant,
}

impl Hold {
    fn runs(&self) -> bool {
        !self.task.0.is_finished()
    }
}

/// What the engine holds of one instance.
#[derive(Default)]
struct Entry {
    /// Its drain task (or a dry run's description of one), running or finished.
    drain: Option<Inflight>,
    /// The newest run of its drain ([`Book::start`] counts the runs).
    newest_run: Option<u64>,
    /// The slot its drain holds under the disruption budgets, the run that holds it,
    /// and the drain's facts the budgets count it by. Kept here and not in the drain
    /// task: a drain restarted for a new reason (a spot warning joining) goes on in
    /// the slot it had instead of queueing behind drains that budgets block.
    slot: Option<(u64, Placed)>,
    /// Heartbeats of our hook's action on it: they follow the hook, not the drain (a
    /// drain restarted for a new reason, or failed and retrying, keeps them).
    hold: Option<Hold>,
    /// Its turn to be ended (see [`Book::end_turn`]).
    end: Option<Arc<tokio::sync::Mutex<()>>>,
}

impl Entry {
    fn draining(&self) -> bool {
        self.drain.as_ref().is_some_and(Inflight::runs)
    }

    fn heartbeats(&self) -> bool {
        self.hold.as_ref().is_some_and(Hold::runs)
    }

    fn ending(&self) -> bool {
        self.end.as_ref().is_some_and(|t| Arc::strong_count(t) > 1)
    }

    /// Lets go of what is over: a finished drain, the run of a drain that neither
    /// runs nor holds a slot, finished heartbeats, a turn nobody takes. True when
    /// nothing is left.
    fn forget_what_is_over(&mut self) -> bool {
        if !self.draining() {
            self.drain = None;
            if self.slot.is_none() {
                // A drain still waiting for a slot keeps its run, or the slot it then
                // takes would look like a replaced run's (given back at once, the drain
                // going on without one, beyond `maxConcurrentDrains`).
                self.newest_run = None;
            }
        }
        if !self.heartbeats() {
            self.hold = None;
        }
        if !self.ending() {
            self.end = None;
        }
        self.is_empty()
    }

    /// Nothing of the instance is held any more.
    fn is_empty(&self) -> bool {
        self.drain.is_none()
            && self.newest_run.is_none()
            && self.slot.is_none()
            && self.hold.is_none()
            && self.end.is_none()
    }
}

/// Every instance's [`Entry`] and [`ActionMemories`], under one lock.
struct Ledger {
    entries: BTreeMap<String, Entry>,
    /// What this replica remembers of our hook's actions: the actions it completed (or
    /// found complete; AWS keeps such an instance in Terminating:Wait while another
    /// hook, EKS's `Terminate-LC-Hook` on a managed node group, still holds it, and the
    /// scan must not take it for a new action and drain it again while AWS cannot be
    /// asked), and AWS's recent answers that our hook holds no action on it. Bounded by
    /// [`FINISHED_KEPT`] finished actions and [`NOT_HELD_RECHECK`].
    memories: ActionMemories,
}

impl Default for Ledger {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
            memories: ActionMemories::new(FINISHED_KEPT, NOT_HELD_RECHECK),
        }
    }
}

impl Ledger {
    /// The instance's entry, made when there is none. Past [`FINISHED_KEPT`] entries,
    /// what is over is forgotten first: the ledger stays as large as what runs.
    fn entry(&mut self, instance_id: &str) -> &mut Entry {
        if !self.entries.contains_key(instance_id) && self.entries.len() >= FINISHED_KEPT {
            self.entries.retain(|_, e| !e.forget_what_is_over());
        }
        self.entries.entry(instance_id.to_string()).or_default()
    }

    /// Drops the instance's entry once nothing of it is left.
    fn tidy(&mut self, instance_id: &str) {
        if self.entries.get(instance_id).is_some_and(Entry::is_empty) {
            self.entries.remove(instance_id);
        }
    }
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
pub struct Book {
    ledger: Mutex<Ledger>,
    /// The number of the next drain run started.
    runs: std::sync::atomic::AtomicU64,
    /// (kind, key) pairs already said once: another tool's terminating hook, a dry
    /// run's drain or hook.
    noted: Mutex<BTreeSet<(&'static str, String)>>,
    /// Woken when a slot goes back: the drains waiting for the budgets look again.
    freed: tokio::sync::Notify,
    /// The drain runs whose first cordon is not done yet ([`Book::cordons_first`]).
    marking: Arc<Marking>,
}

/// The drain runs started and not yet past their first try to cordon and mark
/// their node, and a bell that rings as each gets past it.
#[derive(Default)]
struct Marking {
    runs: Mutex<BTreeSet<u64>>,
    done: tokio::sync::Notify,
}

impl Marking {
    fn done(&self, run: u64) {
        if self.runs.lock().remove(&run) {
            self.done.notify_waiters();
        }
    }
}

/// A drain run's place among the runs not yet past their first cordon: it leaves
/// when the run says its node is marked ([`Book::marked`]), or when the run ends
/// or is aborted however it ends (this is dropped with the run's task, even one
/// never polled).
pub(crate) struct MarkingRun {
    marking: Arc<Marking>,
    run: u64,
}

impl Drop for MarkingRun {
    fn drop(&mut self) {
        self.marking.done(self.run);
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
        spawn: impl FnOnce(DrainRequest, Start, u64, MarkingRun) -> JoinHandle<Outcome>,
    ) -> Start {
        let mut ledger = self.ledger.lock();
        let entry = ledger.entry(&req.instance_id);
        let (req, how) = match entry.drain.take() {
            Some(running) if running.runs() => {
                let Some(record) = joined(&running.req, &req, limits) else {
                    entry.drain = Some(running);
                    return Start::Unchanged;
                };
                running.handle.abort();
                tracing::info!(instance = %req.instance_id, source = ?req.source, "a new reason joins the running drain; it goes on with every reason");
                (merge(running.req, req, record), Start::Joined)
            }
            _ => (req, Start::Started),
        };
        let run = self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The slot the instance's drain holds passes to this run.
        entry.newest_run = Some(run);
        if let Some((holder, _)) = &mut entry.slot {
            *holder = run;
        }
        self.marking.runs.lock().insert(run);
        let marking = MarkingRun {
            marking: self.marking.clone(),
            run,
        };
        let handle = spawn(req.clone(), how, run, marking);
        entry.drain = Some(Inflight { handle, req });
        how
    }

    /// Run `run` got past its first try to cordon and mark its node (done or not:
    /// a refused cordon is tried again by the run, not waited for by the others).
    pub(crate) fn marked(&self, run: u64) {
        self.marking.done(run);
    }

    /// Cordons first: waits, at most `within`, until every other drain run started
    /// so far is past its first try to cordon its node. A drain given its slot calls
    /// it before its first eviction, so that nothing it evicts is placed on a node
    /// another drain was asked for a moment before (an instance refresh asking for
    /// many at once); runs started after the call are not waited for. How many were
    /// still not past it when `within` ran out (0: none).
    pub(crate) async fn cordons_first(&self, run: u64, within: Duration) -> usize {
        let before: BTreeSet<u64> = self
            .marking
            .runs
            .lock()
            .iter()
            .copied()
            .filter(|r| *r != run)
            .collect();
        let until = tokio::time::Instant::now() + within;
        loop {
            let done = self.marking.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            let left = self.marking.runs.lock().intersection(&before).count();
            if left == 0 {
                return 0;
            }
            tokio::select! {
                () = &mut done => {}
                () = tokio::time::sleep_until(until) => return left,
            }
        }
    }

    /// Whether drain run `run` of the instance holds a slot (its own, or the one of
    /// the run it replaced).
    pub(crate) fn has_slot(&self, instance_id: &str, run: u64) -> bool {
        self.ledger
            .lock()
            .entries
            .get(instance_id)
            .and_then(|e| e.slot.as_ref())
            .is_some_and(|(holder, _)| *holder == run)
    }

    /// Keeps the slot drain run `run` takes, with the facts the budgets count it by.
    /// False: the run was replaced or stopped meanwhile, and takes nothing.
    pub(crate) fn keep_slot(&self, instance_id: &str, run: u64, placed: Placed) -> bool {
        let mut ledger = self.ledger.lock();
        match ledger.entries.get_mut(instance_id) {
            Some(e) if e.newest_run == Some(run) => {
                e.slot = Some((run, placed));
                true
            }
            _ => false,
        }
    }

    /// The facts of every drain that holds a slot now.
    pub fn slot_holders(&self) -> Vec<Placed> {
        self.ledger
            .lock()
            .entries
            .values()
            .filter_map(|e| e.slot.as_ref().map(|(_, p)| p.clone()))
            .collect()
    }

    /// Resolves when a slot goes back (register it before looking, as
    /// [`tokio::sync::Notify::notified`] says).
    pub(crate) fn slot_freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.freed.notified()
    }

    /// Drain run `run` is over: its slot goes back, unless a newer run took it over.
    pub(crate) fn give_back_slot(&self, instance_id: &str, run: u64) {
        let mut ledger = self.ledger.lock();
        let Some(e) = ledger.entries.get_mut(instance_id) else {
            return;
        };
        if e.slot.as_ref().is_some_and(|(holder, _)| *holder == run) {
            e.slot = None;
            e.newest_run = None;
            self.freed.notify_waiters();
        }
        ledger.tidy(instance_id);
    }

    /// Keeps a dry run's description task like a drain (for `wait_for`).
    pub(crate) fn observe(&self, req: DrainRequest, handle: JoinHandle<Outcome>) {
        let mut ledger = self.ledger.lock();
        let id = req.instance_id.clone();
        ledger.entry(&id).drain = Some(Inflight { handle, req });
    }

    /// Drains asked for and not finished: running, or cordoned and waiting for a slot.
    pub fn running(&self) -> usize {
        self.ledger
            .lock()
            .entries
            .values()
            .filter(|e| e.draining())
            .count()
    }

    pub fn is_running(&self, instance_id: &str) -> bool {
        self.ledger
            .lock()
            .entries
            .get(instance_id)
            .is_some_and(Entry::draining)
    }

    /// The instance's drain task, no longer tracked (to wait for its outcome).
    pub(crate) fn take(&self, instance_id: &str) -> Option<JoinHandle<Outcome>> {
        let mut ledger = self.ledger.lock();
        let drain = ledger.entries.get_mut(instance_id)?.drain.take();
        ledger.tidy(instance_id);
        drain.map(|f| f.handle)
    }

    /// Stops the instance's drain and its heartbeats. True when a drain ran.
    pub(crate) fn stop(&self, instance_id: &str) -> bool {
        let mut ledger = self.ledger.lock();
        let Some(e) = ledger.entries.get_mut(instance_id) else {
            return false;
        };
        e.hold = None;
        if e.slot.take().is_some() {
            self.freed.notify_waiters();
        }
        let ran = match e.drain.take() {
            Some(f) if f.runs() => {
                f.handle.abort();
                true
            }
            _ => false,
        };
        ledger.tidy(instance_id);
        ran
    }

    /// Stops every drain and every heartbeat where they are.
    pub(crate) fn stop_all(&self) {
        let mut ledger = self.ledger.lock();
        for e in ledger.entries.values_mut() {
            if let Some(f) = e.drain.take() {
                f.handle.abort();
            }
            e.newest_run = None;
            e.slot = None;
            e.hold = None;
        }
        ledger.entries.retain(|_, e| e.end.is_some());
        self.freed.notify_waiters();
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
        let mut ledger = self.ledger.lock();
        let entry = ledger.entry(instance_id);
        if let Some(h) = entry.hold.as_ref().filter(|h| h.runs()) {
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
        let (tx, rx) = watch::channel(timeout);
        entry.hold = Some(Hold {
            task: AbortOnDrop(spawn(rx)),
            timeout: tx,
            since: Instant::now(),
        });
        HoldChange::Started
    }

    /// The heartbeat timeout a held instance is heartbeated at, if it is held.
    pub fn held_timeout(&self, instance_id: &str) -> Option<Duration> {
        self.held_since(instance_id).map(|(_, timeout)| timeout)
    }

    /// Since when a held instance is heartbeated, and at which timeout.
    pub fn held_since(&self, instance_id: &str) -> Option<(Instant, Duration)> {
        self.ledger
            .lock()
            .entries
            .get(instance_id)
            .and_then(|e| e.hold.as_ref())
            .filter(|h| h.runs())
            .map(|h| (h.since, *h.timeout.borrow()))
    }

    /// Stops the heartbeats of the instance's action.
    pub(crate) fn release(&self, instance_id: &str) {
        let mut ledger = self.ledger.lock();
        if let Some(e) = ledger.entries.get_mut(instance_id) {
            e.hold = None;
            ledger.tidy(instance_id);
        }
    }

    /// Our hook's lifecycle action for `instance_id` is over.
    pub(crate) fn note_action_done(&self, instance_id: &str) {
        self.ledger
            .lock()
            .memories
            .finished(instance_id, Instant::now());
    }

    pub fn action_done(&self, instance_id: &str) -> bool {
        self.ledger.lock().memories.is_finished(instance_id)
    }

    /// Forgets the ended actions of instances `keep` says no longer exist.
    pub(crate) fn forget_actions_done(&self, keep: impl Fn(&str) -> bool) {
        self.ledger.lock().memories.keep_finished(keep);
    }

    /// Forgets the instance's ended action (our hook holds it with a new one).
    pub(crate) fn forget_action_done(&self, instance_id: &str) {
        self.ledger.lock().memories.forget_finished(instance_id);
    }

    /// AWS said just now that no action of our hook holds the instance, waiting in
    /// `state`.
    pub(crate) fn aws_said_not_held(&self, instance_id: &str, state: &str) {
        self.ledger
            .lock()
            .memories
            .aws_said_not_held(instance_id, state, Instant::now());
    }

    /// Whether AWS said so lately, with the instance in the same wait.
    pub(crate) fn not_held_lately(&self, instance_id: &str, state: &str) -> bool {
        self.ledger
            .lock()
            .memories
            .not_held_lately(instance_id, state, Instant::now())
    }

    /// The instance's turn to be ended: held while its termination and the note of
    /// it run, so a second drain of the instance waits for them.
    pub(crate) async fn end_turn(&self, instance_id: &str) -> OwnedMutexGuard<()> {
        let turn = self
            .ledger
            .lock()
            .entry(instance_id)
            .end
            .get_or_insert_with(Default::default)
            .clone();
        turn.lock_owned().await
    }

    /// What the book holds of the instance, read at once.
    pub fn story(&self, instance_id: &str) -> InstanceStory {
        let ledger = self.ledger.lock();
        story_of(&ledger, instance_id)
    }

    /// What the book holds of every instance it knows, read at once.
    pub fn stories(&self) -> BTreeMap<String, InstanceStory> {
        let ledger = self.ledger.lock();
        let ids: BTreeSet<&String> = ledger
            .entries
            .keys()
            .chain(ledger.memories.instances())
            .collect();
        ids.into_iter()
            .map(|id| (id.clone(), story_of(&ledger, id)))
            .collect()
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

fn story_of(ledger: &Ledger, instance_id: &str) -> InstanceStory {
    let entry = ledger.entries.get(instance_id);
    InstanceStory {
        draining: entry.is_some_and(Entry::draining),
        reasons: entry
            .and_then(|e| e.drain.as_ref())
            .filter(|f| f.runs())
            .map(|f| f.req.reasons.iter().map(|r| r.why.clone()).collect())
            .unwrap_or_default(),
        run: entry.and_then(|e| e.newest_run),
        slot_run: entry.and_then(|e| e.slot.as_ref()).map(|(run, _)| *run),
        slot_past_budgets: entry
            .and_then(|e| e.slot.as_ref())
            .is_some_and(|(_, p)| p.exempt || p.forced),
        heartbeat_timeout: entry
            .and_then(|e| e.hold.as_ref())
            .filter(|h| h.runs())
            .map(|h| *h.timeout.borrow()),
        ending: entry.is_some_and(Entry::ending),
        action: ledger.memories.of(instance_id).cloned().unwrap_or_default(),
    }
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
            hook_room: None,
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
            by_ca: false,
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
        let spawn = |_: DrainRequest, _: Start, _: u64, _: MarkingRun| {
            spawned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::spawn(std::future::pending::<Outcome>())
        };
        assert_eq!(
            book.start(req(vec![Why::ScaleIn]), limits(), spawn),
            Start::Started
        );
        let again = |_: DrainRequest, _: Start, _: u64, _: MarkingRun| -> JoinHandle<Outcome> {
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
        assert!(book.ledger.lock().memories.len() <= FINISHED_KEPT);
        assert!(book.noted.lock().len() <= FINISHED_KEPT);
        assert!(book.action_done(&format!("i-{}", FINISHED_KEPT + 4)));
    }

    /// The one record reads as one story through a drain's life: started, in its
    /// slot with its hook heartbeated, replaced by a run with a new reason (the slot
    /// passes to it), over (the slot goes back), the action remembered done, stopped.
    #[tokio::test(start_paused = true)]
    async fn the_record_tells_one_story_through_a_drains_life() {
        let book = Book::default();
        let slots = 1;
        assert_eq!(book.story("i-a"), InstanceStory::default());
        let first = start_pending(&book, "i-a");
        take_slot(&book, slots, "i-a", first).await;
        book.hold("i-a", Duration::from_secs(300), |_| {
            tokio::spawn(std::future::pending::<()>())
        });
        let story = book.story("i-a");
        assert!(story.draining);
        assert_eq!((story.run, story.slot_run), (Some(first), Some(first)));
        assert_eq!(story.heartbeat_timeout, Some(Duration::from_secs(300)));
        assert_eq!(story.reasons, [Why::ScaleIn]);
        assert!(story.faults().is_empty(), "{story:?}");

        let hook = Why::Lifecycle {
            hook: "ca-asg-provider-drain".into(),
            by_ca: false,
        };
        let mut second = None;
        let how = book.start(
            DrainRequest {
                instance_id: "i-a".into(),
                ..req(vec![hook.clone()])
            },
            limits(),
            |_, _, r, _| {
                second = Some(r);
                tokio::spawn(std::future::pending::<Outcome>())
            },
        );
        assert_eq!(how, Start::Joined);
        let second = second.expect("a new run");
        let story = book.story("i-a");
        assert_eq!((story.run, story.slot_run), (Some(second), Some(second)));
        assert_eq!(story.reasons, [Why::ScaleIn, hook]);
        assert!(story.faults().is_empty(), "{story:?}");
        // The replaced run's end gives nothing back.
        book.give_back_slot("i-a", first);
        assert_eq!(book.story("i-a").slot_run, Some(second));

        book.note_action_done("i-a");
        book.give_back_slot("i-a", second);
        assert!(book.stop("i-a"));
        let story = book.story("i-a");
        assert_eq!(
            (story.draining, story.slot_run, story.heartbeat_timeout),
            (false, None, None)
        );
        assert!(story.action.finished_at.is_some());
        assert!(story.reasons.is_empty());
        assert!(book.slot_holders().is_empty());
        assert_eq!(
            book.stories().keys().collect::<Vec<_>>(),
            ["i-a"],
            "the remembered action keeps the instance's story"
        );
    }

    fn req_for(instance: &str) -> DrainRequest {
        DrainRequest {
            instance_id: instance.into(),
            ..req(vec![Why::ScaleIn])
        }
    }

    /// Starts a drain that keeps its place among the runs not yet past their first
    /// cordon for as long as it runs (until stopped); returns its run.
    fn start_marking(book: &Book, instance: &str) -> u64 {
        let run = std::cell::Cell::new(None);
        book.start(req_for(instance), limits(), |_, _, r, marking| {
            run.set(Some(r));
            tokio::spawn(async move {
                let _marking = marking;
                std::future::pending::<Outcome>().await
            })
        });
        run.get().expect("a drain started")
    }

    /// Cordons first: a drain waits for every other run started before its call until
    /// each is marked, stopped (its task aborted: even one never polled lets go), or
    /// the wait runs out, which says how many were left; a run started after the
    /// call is not waited for, nor the drain's own.
    #[tokio::test(start_paused = true)]
    async fn a_drain_waits_for_the_cordons_of_the_drains_started_before_it() {
        let within = Duration::from_secs(10);
        let book = Arc::new(Book::default());
        let alone = start_marking(&book, "i-alone");
        assert_eq!(book.cordons_first(alone, within).await, 0, "its own run");

        let a = start_marking(&book, "i-a");
        let b = start_marking(&book, "i-b");
        let began = tokio::time::Instant::now();
        let waiting = {
            let book = book.clone();
            tokio::spawn(async move { book.cordons_first(alone, within).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let later = start_marking(&book, "i-later");
        book.marked(a);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "b is not past its cordon yet");
        assert!(book.stop("i-b"), "b's drain is stopped");
        assert_eq!(
            waiting.await.unwrap(),
            0,
            "a marked, b stopped; {later} not waited for"
        );
        assert_eq!(
            began.elapsed(),
            Duration::from_secs(2),
            "no longer than that"
        );

        book.marked(alone);
        let began = tokio::time::Instant::now();
        assert_eq!(
            book.cordons_first(b, within).await,
            1,
            "the run started later never marks: the wait runs out"
        );
        assert_eq!(began.elapsed(), within);
        book.marked(later);
        assert_eq!(book.cordons_first(b, within).await, 0);
    }

    /// Starts a drain that runs until stopped; returns its run.
    fn start_pending(book: &Book, instance: &str) -> u64 {
        let run = std::cell::Cell::new(None);
        book.start(req_for(instance), limits(), |_, _, r, _| {
            run.set(Some(r));
            tokio::spawn(std::future::pending::<Outcome>())
        });
        run.get().expect("a drain started")
    }

    /// What the drain does for its slot (drain::queue_for_slot, with one budget of
    /// `slots` drains): its own when it holds one, else the next that goes back,
    /// kept in the book.
    async fn take_slot(book: &Book, slots: usize, instance: &str, run: u64) {
        while !book.has_slot(instance, run) {
            let freed = book.slot_freed();
            if book.slot_holders().len() < slots {
                book.keep_slot(instance, run, Placed::default());
                return;
            }
            freed.await;
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
        let slots = 1;
        let a = start_pending(&book, "i-a");
        take_slot(&book, slots, "i-a", a).await;
        // b waits for the only slot.
        let b = start_pending(&book, "i-b");
        assert!(!book.has_slot("i-b", b));
        assert_eq!(book.slot_holders().len(), 1);
        // Drains that ended before their slot (a Node gone, a cordon-only record,
        // an instance that left): more than the book keeps.
        for i in 0..FINISHED_KEPT + 10 {
            let id = format!("i-gone-{i}");
            start_pending(&book, &id);
            book.stop(&id);
        }
        assert!(book.ledger.lock().entries.len() <= FINISHED_KEPT);
        // a ends: b takes the slot, and holds it.
        book.give_back_slot("i-a", a);
        take_slot(&book, slots, "i-b", b).await;
        assert!(book.has_slot("i-b", b), "b runs in its slot");
        assert_eq!(
            book.slot_holders().len(),
            1,
            "while b runs, no other drain has a slot"
        );
        let c = start_pending(&book, "i-c");
        assert!(
            tokio::time::timeout(Duration::from_millis(10), take_slot(&book, slots, "i-c", c))
                .await
                .is_err(),
            "c waits: one drain at a time"
        );
        book.give_back_slot("i-b", b);
        take_slot(&book, slots, "i-c", c).await;
        assert!(book.has_slot("i-c", c));
    }

    /// One step of the book's model: what the engine and its drains do to the book.
    #[derive(Debug, Clone)]
    enum Step {
        /// A source asks for a drain (a hook's reason changes the plan of one that runs).
        Start(u8, bool),
        /// The drain's newest run queues for a slot and takes one if one is free.
        TakeSlot(u8),
        /// The drain's newest run ends: its slot goes back, then its task ends.
        Finish(u8),
        /// A replaced run's end (its task was aborted) gives back what it held.
        FinishReplaced(u8),
        Hold(u8, bool),
        Release(u8),
        Done(u8),
        Stop(u8),
        StopAll,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        let i = 0..4u8;
        prop_oneof![
            (i.clone(), any::<bool>()).prop_map(|(i, h)| Step::Start(i, h)),
            i.clone().prop_map(Step::TakeSlot),
            i.clone().prop_map(Step::Finish),
            i.clone().prop_map(Step::FinishReplaced),
            (i.clone(), any::<bool>()).prop_map(|(i, t)| Step::Hold(i, t)),
            i.clone().prop_map(Step::Release),
            i.clone().prop_map(Step::Done),
            i.prop_map(Step::Stop),
            Just(Step::StopAll),
        ]
    }

    const SLOTS: usize = 2;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 500,
            failure_persistence: None,
            ..Default::default()
        })]

        /// After every step, in any order, the one record holds together: no story
        /// has a fault (a slot held by no running drain or by a replaced run; reasons
        /// for no drain), the slots the record holds are never more than there are
        /// (a slot kept once, given back once), at most one drain runs per instance, and a
        /// stopped instance has neither a drain, a slot nor heartbeats.
        #[test]
        fn the_books_record_holds_together_after_every_step(
            steps in proptest::collection::vec(step(), 1..40)
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let book = Book::default();
                // Each run's task ends when its sender is dropped.
                let mut ends: BTreeMap<u64, tokio::sync::oneshot::Sender<()>> = BTreeMap::new();
                let mut replaced: Vec<(String, u64)> = Vec::new();
                let id = |i: u8| format!("i-{i}");
                for st in &steps {
                    match st {
                        Step::Start(i, hook) => {
                            let why = if *hook {
                                Why::Lifecycle { hook: "h".into(), by_ca: false }
                            } else {
                                Why::ScaleIn
                            };
                            let before = book.story(&id(*i)).run;
                            let mut started = None;
                            book.start(
                                DrainRequest { instance_id: id(*i), ..req(vec![why]) },
                                limits(),
                                |_, _, run, _| {
                                    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                                    started = Some((run, tx));
                                    tokio::spawn(async move {
                                        let _ = rx.await;
                                        Outcome::Drained
                                    })
                                },
                            );
                            if let Some((run, tx)) = started {
                                ends.insert(run, tx);
                                if let Some(old) = before.filter(|_| book.story(&id(*i)).run != before) {
                                    replaced.push((id(*i), old));
                                }
                            }
                        }
                        Step::TakeSlot(i) => {
                            let story = book.story(&id(*i));
                            if let (true, Some(run)) = (story.draining, story.run) {
                                if !book.has_slot(&id(*i), run) && book.slot_holders().len() < SLOTS {
                                    book.keep_slot(&id(*i), run, Placed::default());
                                }
                            }
                        }
                        Step::Finish(i) => {
                            if let Some(run) = book.story(&id(*i)).run {
                                book.give_back_slot(&id(*i), run);
                                ends.remove(&run);
                            }
                        }
                        Step::FinishReplaced(i) => {
                            if let Some(pos) = replaced.iter().position(|(r, _)| *r == id(*i)) {
                                let (r, run) = replaced.remove(pos);
                                book.give_back_slot(&r, run);
                            }
                        }
                        Step::Hold(i, longer) => {
                            let t = Duration::from_secs(if *longer { 600 } else { 300 });
                            book.hold(&id(*i), t, |_| tokio::spawn(std::future::pending::<()>()));
                        }
                        Step::Release(i) => book.release(&id(*i)),
                        Step::Done(i) => book.note_action_done(&id(*i)),
                        Step::Stop(i) => {
                            book.stop(&id(*i));
                            tokio::task::yield_now().await;
                            let story = book.story(&id(*i));
                            proptest::prop_assert!(
                                !story.draining && story.slot_run.is_none() && story.heartbeat_timeout.is_none(),
                                "after stop: {story:?}"
                            );
                        }
                        Step::StopAll => book.stop_all(),
                    }
                    // Let ended and aborted tasks finish.
                    for _ in 0..3 {
                        tokio::task::yield_now().await;
                    }
                    let stories = book.stories();
                    for (i, story) in &stories {
                        proptest::prop_assert!(story.faults().is_empty(), "{i}: {story:?} after {st:?}");
                    }
                    let held = stories.values().filter(|s| s.slot_run.is_some()).count();
                    proptest::prop_assert_eq!(held, book.slot_holders().len());
                    proptest::prop_assert!(held <= SLOTS, "{} slots held after {:?}", held, st);
                    proptest::prop_assert_eq!(
                        book.running(),
                        stories.values().filter(|s| s.draining).count()
                    );
                }
                Ok::<(), proptest::test_runner::TestCaseError>(())
            })?;
        }
    }
}
