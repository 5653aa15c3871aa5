//! When the sources' loop takes its next turn: at its poll interval, or every
//! [`SOON`] while a hold AWS announced is not visible yet, or while Nodes resting
//! in a warm pool may come back. Only the sources use it; the engine carries it
//! because it is the one object every source already shares.

use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::Instant;
use crate::scalein::holds::SOON;

#[derive(Default)]
pub struct ScanSchedule {
    /// Until when every turn scans the lifecycle holds: a hold AWS announced and
    /// does not show yet.
    scan_until: Mutex<Option<Instant>>,
    /// Until when the loop follows the Nodes resting in a warm pool every [`SOON`]
    /// (and scans at its poll interval): CA raised a pooled group
    /// ([`crate::scalein::sources::warm_pool::capacity_added`]).
    follow_until: Mutex<Option<Instant>>,
    /// Wakes the loop when either is set.
    wake: tokio::sync::Notify,
}

impl ScanSchedule {
    /// A hold AWS announced (a lifecycle message) that its reads do not show yet
    /// (they lag the notification): the lifecycle scan runs every [`SOON`] for
    /// `within` instead of waiting out its poll interval (five minutes in queue
    /// mode, longer than a short hook's timeout).
    pub fn expect_hold(&self, within: Duration) {
        extend(&self.scan_until, within);
        self.wake.notify_one();
    }

    /// The loop follows the Nodes resting in a warm pool every [`SOON`] for
    /// `within` from now, scanning at its poll interval all the same.
    pub fn follow_soon(&self, within: Duration) {
        extend(&self.follow_until, within);
        self.wake.notify_one();
    }

    /// Whether a hold AWS announced is expected now ([`Self::expect_hold`]): every
    /// turn of the loop scans.
    pub fn scanning_soon(&self) -> bool {
        ahead(&self.scan_until)
    }

    /// How long the loop waits before its next turn, `poll` being its interval.
    pub fn next_turn_in(&self, poll: Duration) -> Duration {
        if self.scanning_soon() || ahead(&self.follow_until) {
            poll.min(SOON)
        } else {
            poll
        }
    }

    /// Resolves when [`Self::expect_hold`] or [`Self::follow_soon`] is called.
    pub async fn asked(&self) {
        self.wake.notified().await
    }
}

fn extend(until: &Mutex<Option<Instant>>, within: Duration) {
    let to = Instant::now() + within;
    let mut until = until.lock();
    *until = Some(until.map_or(to, |u| u.max(to)));
}

fn ahead(until: &Mutex<Option<Instant>>) -> bool {
    until.lock().is_some_and(|u| Instant::now() < u)
}
