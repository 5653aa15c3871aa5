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

#[cfg(test)]
mod tests {
    use super::*;

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
}
