//! This service's own writes of desired capacity, and how a read that predates them
//! is told apart.
//!
//! AWS's describe calls are eventually consistent: a DescribeAutoScalingGroups answered
//! just after a SetDesiredCapacity (or a TerminateInstanceInAutoScalingGroup with
//! decrement) may still show the capacity from before it. A size change computed from
//! such a read undoes the write: a scale-down's decrement read back as the old capacity,
//! then an IncreaseSize of one, leaves CA's target one above what CA asked for; the same
//! read under a DecreaseTargetSize counts too few instances.
//!
//! A read that shows a capacity one of this service's writes replaced less than
//! [`SETTLE`] before is suspect ([`Written::stands`]), and the provider reads that group
//! again a few times ([`super::refresh`]). Whatever the read still shows after that is
//! AWS's truth: another writer (a person, a scheduled action, the other replica) may have
//! set that same capacity. A read that shows the write itself, or a capacity none of our
//! recent writes replaced, is taken at once. Pure: the clock is the caller's.

use std::time::Duration;

use crate::clock::Instant;

/// How long after a write a read showing what it replaced is taken as stale.
pub const SETTLE: Duration = Duration::from_secs(60);

/// Most replaced capacities remembered per group (the writes of one busy minute).
const HISTORY: usize = 16;

/// The last desired capacity this service wrote to one group, and what its recent
/// writes replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    desired: i32,
    /// Capacities replaced by this service's writes, with when each was replaced,
    /// oldest first.
    replaced: Vec<(i32, Instant)>,
}

impl Written {
    /// A write of `desired` answered at `at`, over `before` (the capacity this service
    /// took AWS to have; `None` when it did not know), following `previous`, the
    /// group's write still held, if any.
    pub fn new(previous: Option<&Written>, before: Option<i32>, desired: i32, at: Instant) -> Self {
        let mut replaced: Vec<(i32, Instant)> = previous
            .map(|p| {
                p.replaced
                    .iter()
                    .copied()
                    .filter(|(_, t)| at.saturating_duration_since(*t) < SETTLE)
                    .collect()
            })
            .unwrap_or_default();
        if let Some(before) = before.filter(|b| *b != desired) {
            replaced.retain(|(v, _)| *v != before && *v != desired);
            replaced.push((before, at));
        } else {
            replaced.retain(|(v, _)| *v != desired);
        }
        if replaced.len() > HISTORY {
            replaced.drain(..replaced.len() - HISTORY);
        }
        Self { desired, replaced }
    }

    /// The desired capacity written.
    pub fn desired(&self) -> i32 {
        self.desired
    }

    /// Whether nothing is left to tell a stale read by: every replaced capacity was
    /// replaced [`SETTLE`] or more before `now`.
    pub fn settled(&self, now: Instant) -> bool {
        self.replaced
            .iter()
            .all(|(_, t)| now.saturating_duration_since(*t) >= SETTLE)
    }

    /// Whether the write still stands against a read of `read` made at `now`: the read
    /// shows a capacity one of our writes replaced less than [`SETTLE`] before.
    pub fn stands(&self, read: i32, now: Instant) -> bool {
        read != self.desired
            && self
                .replaced
                .iter()
                .any(|(v, t)| *v == read && now.saturating_duration_since(*t) < SETTLE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    #[test]
    fn a_read_of_what_the_write_replaced_is_stale_until_it_settles() {
        let t0 = Instant::now();
        let w = Written::new(None, Some(5), 4, t0);
        assert_eq!(w.desired(), 4);
        assert!(w.stands(5, at(t0, 0)));
        assert!(w.stands(5, at(t0, 59)));
        assert!(
            !w.stands(5, at(t0, 60)),
            "settled: AWS's answer is the truth"
        );
        assert!(!w.stands(4, at(t0, 1)), "the read shows the write");
        assert!(!w.stands(7, at(t0, 1)), "another writer's capacity is news");
    }

    #[test]
    fn a_read_older_than_several_writes_is_stale_too() {
        let t0 = Instant::now();
        let w1 = Written::new(None, Some(3), 4, t0);
        let w2 = Written::new(Some(&w1), Some(4), 3, at(t0, 10));
        assert_eq!(w2.desired(), 3);
        // 4 was replaced at 10 s; 3 was our own write, so a read of 3 shows it.
        assert!(w2.stands(4, at(t0, 20)));
        assert!(!w2.stands(3, at(t0, 20)));
        let w3 = Written::new(Some(&w2), Some(3), 6, at(t0, 30));
        assert!(w3.stands(3, at(t0, 31)) && w3.stands(4, at(t0, 31)));
        assert!(!w3.stands(4, at(t0, 70)), "4 was replaced at 10 s");
        assert!(w3.stands(3, at(t0, 89)) && !w3.stands(3, at(t0, 90)));
    }

    #[test]
    fn an_unknown_before_or_a_write_of_the_same_capacity_replaces_nothing() {
        let t0 = Instant::now();
        let w = Written::new(None, None, 4, t0);
        assert!(!w.stands(5, t0) && !w.stands(3, t0));
        let w = Written::new(None, Some(4), 4, t0);
        assert!(!w.stands(4, t0) && !w.stands(5, t0));
    }

    #[test]
    fn settled_once_every_replaced_capacity_is_old_enough() {
        let t0 = Instant::now();
        let w1 = Written::new(None, Some(3), 4, t0);
        let w2 = Written::new(Some(&w1), Some(4), 5, at(t0, 30));
        assert!(!w2.settled(at(t0, 59)));
        assert!(!w2.settled(at(t0, 60)), "4 was replaced at 30 s");
        assert!(w2.settled(at(t0, 90)));
        assert!(
            Written::new(None, None, 4, t0).settled(t0),
            "nothing replaced"
        );
    }

    #[test]
    fn the_history_is_bounded() {
        let t0 = Instant::now();
        let mut w = Written::new(None, Some(0), 1, t0);
        for i in 1..100 {
            w = Written::new(Some(&w), Some(i), i + 1, t0);
        }
        assert!(w.replaced.len() <= HISTORY);
        assert!(w.stands(99, t0), "the newest replaced capacity is kept");
    }

    #[test]
    fn for_any_writes_a_read_of_the_last_write_never_stands() {
        let t0 = Instant::now();
        let mut w: Option<Written> = None;
        for step in 0..200u64 {
            let before = (step * 7 % 11) as i32;
            let desired = (step * 5 % 13) as i32;
            let now = at(t0, step % 90);
            let next = Written::new(w.as_ref(), Some(before), desired, now);
            assert!(!next.stands(desired, now));
            if before != desired {
                assert!(next.stands(before, now));
            }
            w = Some(next);
        }
    }
}
