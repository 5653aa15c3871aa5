//! Whose a hold is: the one rule every source (the lifecycle scan, the queue's
//! lifecycle messages, a drain that finds nothing left to do) uses to decide whether
//! an instance AWS holds is held by a pending action of our hook, from what the
//! service remembers of the instance and what AWS answers.
//!
//! What is remembered of our hook's action on an instance can be older than the
//! action that holds it now (an instance that went back to its warm pool and is ended
//! by the pool later, or one reused and sent out again between two polls), and late
//! (a process stopped between completing an action and writing so on the Node). So a
//! memory never lets a hold go on its own word: AWS decides, and where AWS cannot be
//! asked a remembered completion only makes the source wait and ask again, while a
//! hold nothing remembers as finished is taken (a hook left to time out ends the
//! instance undrained).
//!
//! [`ActionMemories`] is what this process remembers of our hook's actions, one record
//! per instance ([`ActionMemory`]: the action it completed, AWS's recent "not held"),
//! with its transitions as functions of `now`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::clock::Instant;

/// What AWS says, asked directly (a heartbeat for our hook), of our hook's hold on
/// an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// A heartbeat for our hook's action was taken: our hook holds the instance now.
    Held,
    /// No action of our hook holds the instance: not yet in Terminating:Wait, past
    /// it, held by another tool's hook only, or our hook is gone.
    NotHeld,
    /// AWS could not be asked (throttled, unreachable), or a dry run, which writes
    /// nothing and so cannot ask.
    Unknown,
}

/// What the service knows of one instance's hold by our hook, from the memories that
/// hold it: the engine's book (a drain of it runs here; this process completed our
/// action on it) and the Node's record (an earlier process or another replica
/// completed it, less than a lifecycle action's limit ago).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HoldStory {
    /// A drain of the instance runs in this process: it holds the action already,
    /// or completed it just now.
    pub draining_here: bool,
    /// This process completed our hook's action on the instance.
    pub finished_here: bool,
    /// The instance's Node records our hook's action as completed.
    pub finished_on_node: bool,
}

/// Whose the hold is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A pending action of our hook: drain the instance and heartbeat the action.
    Ours,
    /// No action of ours holds it (another hook does, or ours is over): leave it.
    NotOurs,
    /// Cannot tell now (AWS unanswered, a completion remembered): neither drain nor
    /// let go; ask again (the scan's next poll, the queue's redelivery).
    AskAgain,
}

impl HoldStory {
    /// Whether AWS is asked before the verdict. A drain running here is not asked: it
    /// holds the action already, or completed it just now.
    pub fn asks_aws(&self) -> bool {
        !self.draining_here
    }

    /// Whether a completion of our hook's action is remembered, by this process or
    /// by the Node.
    pub fn remembers_done(&self) -> bool {
        self.finished_here || self.finished_on_node
    }

    /// Whose the hold is, given AWS's answer (`Hold::Unknown` when it was not asked).
    pub fn verdict(&self, aws: Hold) -> Verdict {
        if self.draining_here {
            return if self.finished_here {
                Verdict::NotOurs
            } else {
                Verdict::Ours
            };
        }
        match aws {
            Hold::Held => Verdict::Ours,
            Hold::NotHeld => Verdict::NotOurs,
            Hold::Unknown if self.remembers_done() => Verdict::AskAgain,
            Hold::Unknown => Verdict::Ours,
        }
    }
}

/// How long AWS's word that our hook holds no pending action on an instance is
/// believed, while the instance stays in the same wait, before AWS is asked again.
pub const NOT_HELD_RECHECK: Duration = Duration::from_secs(30);

/// What this process remembers of our hook's actions on one instance: the one record
/// it keeps per instance (in the engine's book), where a set of finished actions and a
/// map of AWS's "not held" answers were kept apart. Transitions take `now`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActionMemory {
    /// When this process completed our hook's action on the instance, or learned it
    /// was completed (the Node's record, confirmed).
    pub finished_at: Option<Instant>,
    /// AWS's last answer that no action of our hook holds the instance, with the wait
    /// the instance was in then.
    pub not_held: Option<(String, Instant)>,
}

impl ActionMemory {
    fn is_empty(&self) -> bool {
        self.finished_at.is_none() && self.not_held.is_none()
    }

    /// Whether AWS said, less than `recheck` before `now` and with the instance in the
    /// same wait (`state`), that our hook holds no action on it.
    pub fn not_held_lately(&self, state: &str, now: Instant, recheck: Duration) -> bool {
        self.not_held
            .as_ref()
            .is_some_and(|(s, at)| s == state && now.saturating_duration_since(*at) < recheck)
    }
}

/// Every instance's [`ActionMemory`], bounded: finished actions past `finished_kept`
/// lose the oldest (at worst one more drain that finds the action complete), and an
/// answer of AWS is forgotten once `recheck` old, so the memory stays as small as the
/// waits.
#[derive(Debug, Clone)]
pub struct ActionMemories {
    by_instance: BTreeMap<String, ActionMemory>,
    finished: usize,
    finished_kept: usize,
    recheck: Duration,
}

impl ActionMemories {
    pub fn new(finished_kept: usize, recheck: Duration) -> Self {
        Self {
            by_instance: BTreeMap::new(),
            finished: 0,
            finished_kept,
            recheck,
        }
    }

    /// The instance's memory, if any.
    pub fn of(&self, instance_id: &str) -> Option<&ActionMemory> {
        self.by_instance.get(instance_id)
    }

    /// Our hook's action on the instance is over, as of `now`.
    pub fn finished(&mut self, instance_id: &str, now: Instant) {
        if self.of(instance_id).and_then(|m| m.finished_at).is_none() {
            if self.finished >= self.finished_kept {
                let oldest = self
                    .by_instance
                    .iter()
                    .filter_map(|(id, m)| m.finished_at.map(|at| (at, id.clone())))
                    .min();
                if let Some((_, id)) = oldest {
                    self.forget_finished(&id);
                }
            }
            self.finished += 1;
        }
        self.by_instance
            .entry(instance_id.to_string())
            .or_default()
            .finished_at = Some(now);
    }

    /// Whether our hook's action on the instance is remembered as over.
    pub fn is_finished(&self, instance_id: &str) -> bool {
        self.of(instance_id)
            .is_some_and(|m| m.finished_at.is_some())
    }

    /// Forgets the instance's finished action (our hook holds it with a new one).
    pub fn forget_finished(&mut self, instance_id: &str) {
        let Some(m) = self.by_instance.get_mut(instance_id) else {
            return;
        };
        if m.finished_at.take().is_some() {
            self.finished -= 1;
        }
        if m.is_empty() {
            self.by_instance.remove(instance_id);
        }
    }

    /// Forgets the finished actions of the instances `keep` says no longer exist.
    pub fn keep_finished(&mut self, keep: impl Fn(&str) -> bool) {
        let gone: Vec<String> = self
            .by_instance
            .iter()
            .filter(|(id, m)| m.finished_at.is_some() && !keep(id))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            self.forget_finished(&id);
        }
    }

    /// AWS said, at `now`, that no action of our hook holds the instance waiting in
    /// `state`.
    pub fn aws_said_not_held(&mut self, instance_id: &str, state: &str, now: Instant) {
        self.by_instance
            .entry(instance_id.to_string())
            .or_default()
            .not_held = Some((state.to_string(), now));
    }

    /// Whether AWS said so lately ([`ActionMemory::not_held_lately`]); every answer
    /// `recheck` old is forgotten first.
    pub fn not_held_lately(&mut self, instance_id: &str, state: &str, now: Instant) -> bool {
        let recheck = self.recheck;
        self.by_instance.retain(|_, m| {
            if m.not_held
                .as_ref()
                .is_some_and(|(_, at)| now.saturating_duration_since(*at) >= recheck)
            {
                m.not_held = None;
            }
            !m.is_empty()
        });
        self.of(instance_id)
            .is_some_and(|m| m.not_held_lately(state, now, recheck))
    }

    /// The instances that have a memory.
    pub fn instances(&self) -> impl Iterator<Item = &String> {
        self.by_instance.keys()
    }

    /// How many instances have a memory.
    pub fn len(&self) -> usize {
        self.by_instance.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_instance.is_empty()
    }
}

/// What the engine holds of one instance, read at once from its one record (the
/// engine's book): the drain that runs for it, the slot that drain runs in, the
/// heartbeats of our hook's action, its turn to be ended, and what it remembers of our
/// hook's actions on it. [`InstanceStory::faults`] says which of these disagree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceStory {
    /// A drain of the instance runs (or waits for a slot) in this process.
    pub draining: bool,
    /// The running drain's reasons, as joined so far.
    pub reasons: Vec<crate::scalein::decide::record::Why>,
    /// The newest run of its drain, while that run runs or holds a slot.
    pub run: Option<u64>,
    /// The run that holds a slot the disruption budgets gave it.
    pub slot_run: Option<u64>,
    /// Its slot was taken past the budgets: an exempt drain (the instance ends
    /// anyway) or one our hook holds started to finish inside the hook's global
    /// timeout. Counted by the budgets all the same.
    pub slot_past_budgets: bool,
    /// Our hook's action on it is heartbeated, at this timeout.
    pub heartbeat_timeout: Option<Duration>,
    /// Its termination (and the note of it) runs now.
    pub ending: bool,
    /// What this process remembers of our hook's actions on it.
    pub action: ActionMemory,
}

impl InstanceStory {
    /// What in the story cannot be: a slot held for a run that is not the drain's
    /// newest, or by no running drain (a slot lost to `maxConcurrentDrains`); reasons
    /// kept for no drain. Empty when the story holds together.
    pub fn faults(&self) -> Vec<&'static str> {
        let mut faults = Vec::new();
        if let Some(holder) = self.slot_run {
            if Some(holder) != self.run {
                faults.push("a slot is held by a run that is not the drain's newest");
            }
            if !self.draining {
                faults.push("a slot is held while no drain of the instance runs");
            }
        }
        if !self.reasons.is_empty() && !self.draining {
            faults.push("reasons are kept for a drain that does not run");
        }
        faults
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each fault is named, alone, and a story without them has none.
    #[test]
    fn a_story_names_what_in_it_cannot_be() {
        let running = InstanceStory {
            draining: true,
            reasons: vec![crate::scalein::decide::record::Why::ScaleIn],
            run: Some(7),
            slot_run: Some(7),
            ..InstanceStory::default()
        };
        assert!(running.faults().is_empty());
        assert!(InstanceStory::default().faults().is_empty());
        let replaced = InstanceStory {
            slot_run: Some(6),
            ..running.clone()
        };
        assert_eq!(
            replaced.faults(),
            ["a slot is held by a run that is not the drain's newest"]
        );
        let over = InstanceStory {
            draining: false,
            reasons: Vec::new(),
            ..running.clone()
        };
        assert_eq!(
            over.faults(),
            ["a slot is held while no drain of the instance runs"]
        );
        let stale = InstanceStory {
            draining: false,
            slot_run: None,
            ..running
        };
        assert_eq!(
            stale.faults(),
            ["reasons are kept for a drain that does not run"]
        );
    }

    fn every_story() -> impl Iterator<Item = HoldStory> {
        (0..8u8).map(|b| HoldStory {
            draining_here: b & 1 != 0,
            finished_here: b & 2 != 0,
            finished_on_node: b & 4 != 0,
        })
    }

    const EVERY_ANSWER: [Hold; 3] = [Hold::Held, Hold::NotHeld, Hold::Unknown];

    /// AWS decides whenever it is asked: a memory, however it reads, neither keeps a
    /// hold AWS denies nor drops one AWS confirms.
    #[test]
    fn aws_decides_whenever_it_is_asked() {
        for s in every_story().filter(HoldStory::asks_aws) {
            assert_eq!(s.verdict(Hold::Held), Verdict::Ours, "{s:?}");
            assert_eq!(s.verdict(Hold::NotHeld), Verdict::NotOurs, "{s:?}");
        }
    }

    /// A hold is let go (`NotOurs`) only on AWS's word or on this process's own,
    /// fresh from the drain it runs: never on a remembered completion alone.
    #[test]
    fn no_memory_alone_lets_a_hold_go() {
        for s in every_story() {
            for aws in EVERY_ANSWER {
                let asked = if s.asks_aws() { aws } else { Hold::Unknown };
                if s.verdict(asked) == Verdict::NotOurs {
                    assert!(
                        asked == Hold::NotHeld || (s.draining_here && s.finished_here),
                        "{s:?} let go with AWS saying {asked:?}"
                    );
                }
            }
        }
    }

    /// Fail closed: AWS unanswered and nothing remembered as finished, the hold is
    /// taken (a hook left to time out ends the instance undrained); a remembered
    /// completion waits for AWS instead of draining an instance whose action may be
    /// over.
    #[test]
    fn unanswered_holds_are_taken_unless_a_completion_is_remembered() {
        for s in every_story().filter(HoldStory::asks_aws) {
            let want = if s.remembers_done() {
                Verdict::AskAgain
            } else {
                Verdict::Ours
            };
            assert_eq!(s.verdict(Hold::Unknown), want, "{s:?}");
        }
    }

    /// A drain running here knows its own action: ours until it completes it.
    #[test]
    fn a_drain_running_here_is_not_asked_and_knows_its_action() {
        for s in every_story().filter(|s| s.draining_here) {
            assert!(!s.asks_aws());
            let want = if s.finished_here {
                Verdict::NotOurs
            } else {
                Verdict::Ours
            };
            assert_eq!(s.verdict(Hold::Unknown), want, "{s:?}");
        }
    }

    /// One step of what the book does with its memories.
    #[derive(Debug, Clone)]
    enum Step {
        Finished(u8),
        Forget(u8),
        Keep(u8),
        NotHeld(u8, bool),
        Lately(u8, bool),
        Wait(u64),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        let i = 0..6u8;
        prop_oneof![
            (i.clone()).prop_map(Step::Finished),
            (i.clone()).prop_map(Step::Forget),
            any::<u8>().prop_map(Step::Keep),
            (i.clone(), any::<bool>()).prop_map(|(i, s)| Step::NotHeld(i, s)),
            (i, any::<bool>()).prop_map(|(i, s)| Step::Lately(i, s)),
            (0..40u64).prop_map(Step::Wait),
        ]
    }

    const KEPT: usize = 3;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 2000,
            failure_persistence: None,
            ..Default::default()
        })]

        /// The one record per instance keeps what the two memories it replaced kept:
        /// the finished actions (at most KEPT; a new one past that drops the oldest;
        /// each kept until forgotten), and AWS's "not held" answers for their wait,
        /// believed for NOT_HELD_RECHECK and no longer; and it holds no empty record.
        #[test]
        fn one_record_per_instance_keeps_what_two_memories_kept(
            steps in proptest::collection::vec(step(), 1..60)
        ) {
            let start = Instant::now();
            let mut now = start;
            let mut m = ActionMemories::new(KEPT, NOT_HELD_RECHECK);
            let mut finished: BTreeMap<String, Instant> = BTreeMap::new();
            let mut not_held: BTreeMap<String, (String, Instant)> = BTreeMap::new();
            let id = |i: u8| format!("i-{i}");
            let state = |s: bool| if s { "Terminating:Wait" } else { "Warmed:Pending:Wait" };
            for st in &steps {
                match st {
                    Step::Finished(i) => {
                        if !finished.contains_key(&id(*i)) && finished.len() >= KEPT {
                            let oldest = finished.iter().map(|(k, at)| (*at, k.clone())).min().unwrap().1;
                            finished.remove(&oldest);
                        }
                        finished.insert(id(*i), now);
                        m.finished(&id(*i), now);
                    }
                    Step::Forget(i) => {
                        finished.remove(&id(*i));
                        m.forget_finished(&id(*i));
                    }
                    Step::Keep(mask) => {
                        let keep = |k: &str| mask & (1 << k[2..].parse::<u8>().unwrap()) != 0;
                        finished.retain(|k, _| keep(k));
                        m.keep_finished(keep);
                    }
                    Step::NotHeld(i, s) => {
                        not_held.insert(id(*i), (state(*s).to_string(), now));
                        m.aws_said_not_held(&id(*i), state(*s), now);
                    }
                    Step::Lately(i, s) => {
                        not_held.retain(|_, (_, at)| now.saturating_duration_since(*at) < NOT_HELD_RECHECK);
                        let want = not_held.get(&id(*i)).is_some_and(|(w, _)| w == state(*s));
                        proptest::prop_assert_eq!(m.not_held_lately(&id(*i), state(*s), now), want, "{:?}", st);
                    }
                    Step::Wait(secs) => now += Duration::from_secs(*secs),
                }
                for i in 0..6u8 {
                    proptest::prop_assert_eq!(m.is_finished(&id(i)), finished.contains_key(&id(i)), "{} after {:?}", id(i), st);
                }
                proptest::prop_assert!(finished.len() <= KEPT);
                proptest::prop_assert!(m.by_instance.values().all(|r| !r.is_empty()), "an empty record is kept");
                proptest::prop_assert_eq!(m.finished, m.by_instance.values().filter(|r| r.finished_at.is_some()).count());
            }
        }
    }
}
