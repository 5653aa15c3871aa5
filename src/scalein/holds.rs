//! AWS's word on lifecycle actions, with no engine: the pace of heartbeats and their
//! backoff inside the hook's timeout, AWS's limits, what a refusal means (no action
//! of ours), and whether AWS shows an instance in a state. The engine keeps the holds
//! with them ([`crate::scalein::engine::keeper`]); the scan that finds the holds is
//! `sources::hook_scan`.

use std::time::Duration;

use crate::clock::Instant;

use crate::cloud::{CloudError, LifecycleState};

/// The scan's pace while a hold AWS announced is expected
/// ([`crate::scalein::engine::schedule::ScanSchedule::expect_hold`]).
pub const SOON: Duration = Duration::from_secs(1);

/// AWS ends a lifecycle action after 100 heartbeat timeouts or 48 hours, whichever
/// is smaller, however many heartbeats it got.
pub fn global_limit(heartbeat_timeout: Duration) -> Duration {
    (heartbeat_timeout * 100).min(Duration::from_secs(48 * 3600))
}

/// A retry's wait, cut so the try lands while the action still has a fifth of its
/// timeout left counted from the last heartbeat AWS took; past that mark, at most
/// half of what is left before the timeout (never under 100 ms). A run of throttled
/// heartbeats backs off without letting the hook run out, and without retrying in
/// a tight loop near its end (a storm of held instances would throttle itself).
pub fn within_timeout(
    wait: Duration,
    last_ok: Instant,
    timeout: Duration,
    now: Instant,
) -> Duration {
    let to_mark = (last_ok + timeout.mul_f64(0.8)).saturating_duration_since(now);
    let cap = if to_mark.is_zero() {
        (last_ok + timeout).saturating_duration_since(now) / 2
    } else {
        to_mark
    };
    wait.min(cap).max(Duration::from_millis(100))
}

/// When the next heartbeat goes, apart from the heartbeat itself so it is tested
/// alone.
pub struct HeartbeatBackoff {
    every: Duration,
    pub failures: u32,
    /// AWS took a heartbeat of these: the action's clock is known from then on.
    taken: bool,
    /// Whose heartbeats (the instance): the key of its jitter (crate::clock).
    of: String,
}

impl HeartbeatBackoff {
    pub fn new(every: Duration, of: &str) -> Self {
        Self {
            every,
            failures: 0,
            taken: false,
            of: of.to_string(),
        }
    }

    /// The same heartbeats at another interval (the hook's timeout changed): the
    /// failures start again, what AWS took stays known.
    pub fn repaced(self, every: Duration) -> Self {
        Self {
            every,
            failures: 0,
            ..self
        }
    }

    /// After a success: a third of the timeout, less up to a tenth of it.
    pub fn ok(&mut self) -> Duration {
        self.failures = 0;
        self.taken = true;
        self.every
            .mul_f64(1.0 - 0.1 * crate::clock::random_fraction(&self.of))
    }

    /// After a failure: from a quarter of the interval, doubling per failure, with
    /// full jitter over its upper half, capped at the interval. Before AWS took one
    /// of these heartbeats it does not double: the action's clock started before it
    /// was found (an earlier process or leader heartbeated it, or nobody did), and
    /// its timeout may be near.
    pub fn failed(&mut self) -> Duration {
        let base = (self.every / 4).max(Duration::from_millis(100));
        let doublings = if self.taken { self.failures.min(8) } else { 0 };
        let ceiling = base.saturating_mul(1u32 << doublings).min(self.every);
        self.failures = self.failures.saturating_add(1);
        ceiling.mul_f64(0.5 + 0.5 * crate::clock::random_fraction(&self.of))
    }
}

/// What AWS's answer to a heartbeat or a completion says when it holds no lifecycle
/// action under our hook for the instance: "No active Lifecycle Action found ...", or
/// the hook (or its group) not found, deleted by hand while the instance was held or
/// just before. `None`: any other failure, which is retried. Whether the action is
/// still to come is the instance's state's to say.
pub(crate) fn no_action(e: &CloudError) -> Option<&str> {
    match e {
        CloudError::Rejected { message, .. } if message.contains("No active Lifecycle Action") => {
            Some(message)
        }
        CloudError::NotFound { name, .. } => Some(name),
        _ => None,
    }
}

pub use crate::scalein::decide::story::Hold;

pub use crate::scalein::decide::story::NOT_HELD_RECHECK;

/// AWS's shortest and longest heartbeat timeouts for a lifecycle hook.
pub const AWS_MIN_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(30);
pub const AWS_MAX_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(7200);

/// Whether AWS shows the instance in one of `states` now. An unknown answer (AWS
/// cannot be asked) says yes: callers use it to keep trying, which is safe, instead
/// of giving up early, which is not.
pub(crate) async fn in_state(
    cloud: &dyn crate::cloud::Cloud,
    instance_id: &str,
    states: &[LifecycleState],
) -> bool {
    match cloud.locate_instances(&[instance_id.to_string()]).await {
        Ok(found) => found.first().is_some_and(|l| states.contains(&l.state)),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_action_is_no_active_action_or_a_hook_gone_and_nothing_else() {
        let rejected = |code: &str, message: &str| CloudError::Rejected {
            operation: "CompleteLifecycleAction".into(),
            code: code.into(),
            message: message.into(),
        };
        let none = "No active Lifecycle Action found with instance ID i-1";
        assert_eq!(no_action(&rejected("ValidationError", none)), Some(none));
        assert_eq!(no_action(&rejected("Other", none)), Some(none));
        // Another refusal of a completion is not taken for "nothing to complete".
        assert_eq!(
            no_action(&rejected("ValidationError", "Invalid token")),
            None
        );
        let gone = CloudError::NotFound {
            what: "lifecycle hook",
            name: "ca-asg-provider-drain".into(),
        };
        assert_eq!(no_action(&gone), Some("ca-asg-provider-drain"));
        assert_eq!(no_action(&rejected("AccessDenied", "not allowed")), None);
        for retried in [
            CloudError::Throttled {
                operation: "x".into(),
                message: "Rate exceeded".into(),
            },
            CloudError::Transient {
                operation: "x".into(),
                message: "HTTP 500".into(),
            },
        ] {
            assert_eq!(no_action(&retried), None, "{retried}");
        }
    }

    #[test]
    fn a_run_of_failures_retries_before_the_timeout_runs_out() {
        let timeout = Duration::from_secs(300);
        let now = Instant::now();
        let secs = Duration::from_secs;
        // Fresh: the backoff's own wait.
        assert_eq!(within_timeout(secs(50), now, timeout, now), secs(50));
        // 230 s since AWS took the last heartbeat: 10 s left to the 240 s mark.
        assert_eq!(
            within_timeout(secs(100), now, timeout, now + secs(230)),
            secs(10)
        );
        // Past the mark: half of what is left, never a long wait.
        assert_eq!(
            within_timeout(secs(100), now, timeout, now + secs(290)),
            secs(5)
        );
        assert_eq!(
            within_timeout(secs(100), now, timeout, now + secs(300)),
            Duration::from_millis(100)
        );
        // A run of failures from 90 s after the last success: every try lands by
        // the 240 s mark, then within the timeout, halving what is left: a bounded
        // number of tries, not a tight loop.
        let mut b = HeartbeatBackoff::new(timeout / 3, "i-1");
        b.ok();
        let mut at = now + secs(90);
        let mark = now + timeout.mul_f64(0.8);
        let end = now + timeout;
        let mut past_mark = 0;
        while at + Duration::from_millis(200) < end {
            let w = within_timeout(b.failed(), now, timeout, at);
            if at + Duration::from_millis(100) <= mark {
                assert!(at + w <= mark, "{:?} past the mark", (at + w) - mark);
            } else {
                assert!(at + w <= end, "{:?} past the timeout", (at + w) - end);
                past_mark += 1;
            }
            at += w;
        }
        assert!(past_mark <= 12, "{past_mark} tries after the mark");
    }

    /// Issue 59: before AWS took a heartbeat of the hold, its timeout runs from a
    /// moment before it was found (a restart, a new leader): failures never back
    /// off past the first step, a twelfth of the timeout; once one is taken they
    /// double as before, and a changed timeout keeps that known.
    #[test]
    fn until_a_heartbeat_is_taken_failures_are_retried_within_a_twelfth() {
        let timeout = Duration::from_secs(300);
        let every = timeout / 3;
        let mut b = HeartbeatBackoff::new(every, "i-1");
        for _ in 0..20 {
            let d = b.failed();
            assert!(d <= timeout / 12, "{d:?}");
            assert!(d >= timeout / 24, "{d:?}");
        }
        b.ok();
        let grown = (0..6).map(|_| b.failed()).max().unwrap();
        assert!(
            grown > timeout / 12,
            "{grown:?}: backs off once the clock is known"
        );
        let mut b = b.repaced(every / 2);
        let grown = (0..6).map(|_| b.failed()).max().unwrap();
        assert!(grown > timeout / 24, "{grown:?}");
    }

    #[test]
    fn heartbeats_spread_back_off_and_stay_inside_the_timeout() {
        let every = Duration::from_secs(100);
        let mut firsts = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let mut b = HeartbeatBackoff::new(every, "i-1");
            let ok = b.ok();
            assert!(ok <= every && ok >= every.mul_f64(0.9), "{ok:?}");
            firsts.insert(ok.as_millis());
            let mut last = Duration::ZERO;
            let mut ceilings = Vec::new();
            for n in 0..12 {
                let d = b.failed();
                assert!(d <= every, "never past a third of the timeout: {d:?}");
                assert!(d >= Duration::from_millis(50), "{d:?}");
                ceilings.push(d);
                if n > 6 {
                    assert!(d >= every / 2, "capped near the interval: {d:?}");
                }
                last = d;
            }
            assert!(ceilings[0] <= every / 4);
            assert!(last > ceilings[0]);
            assert_eq!(b.failures, 12);
            b.ok();
            assert_eq!(b.failures, 0, "a success resets the backoff");
        }
        assert!(
            firsts.len() > 40,
            "50 instances do not heartbeat in lockstep: {}",
            firsts.len()
        );
    }
}
