//! The backoff of every watch the drains run: kube-runtime's own (0.8 s doubling to
//! 30 s, jittered, reset after 2 quiet minutes), with its jitter drawn through
//! [`crate::clock::jittered`]. In production that is as random as kube-runtime's; in a
//! model case on the paused clock each watch draws from its own fixed sequence, so a
//! watch that failed (an initial list left unanswered past
//! [`crate::scalein::kube::intercept::ANSWER_WITHIN`]) retries at the same instant on every replay.

use std::time::Duration;

use kube::runtime::utils::{Backoff, ResetTimerBackoff};

/// The backoff for the watch named `key` (what it watches).
pub fn for_watch(key: &str) -> ResetTimerBackoff<Jittered> {
    let builder = crate::clock::jittered(
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(800))
            .with_max_delay(Duration::from_secs(30))
            .with_factor(2.0)
            .without_max_times(),
        &format!("watch {key}"),
    );
    ResetTimerBackoff::new(
        Jittered {
            inner: backon::BackoffBuilder::build(builder),
            builder,
        },
        Duration::from_secs(120),
    )
}

/// An exponential backoff that starts over (the same way) when reset.
pub struct Jittered {
    inner: backon::ExponentialBackoff,
    builder: backon::ExponentialBuilder,
}

impl Iterator for Jittered {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.inner.next()
    }
}

impl Backoff for Jittered {
    fn reset(&mut self) {
        self.inner = backon::BackoffBuilder::build(self.builder);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_under_a_second_to_half_a_minute() {
        let mut b = for_watch("nodes");
        let first = b.next().unwrap();
        assert!(
            first >= Duration::from_millis(800) && first <= Duration::from_millis(1600),
            "{first:?}"
        );
        let later: Vec<Duration> = b.take(10).collect();
        assert!(
            later.iter().all(|d| *d <= Duration::from_secs(60)),
            "{later:?}"
        );
        assert!(
            later.last().unwrap() >= &Duration::from_secs(30),
            "{later:?}"
        );
    }
}
