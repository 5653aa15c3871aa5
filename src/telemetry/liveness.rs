//! Whether the background loops still turn, for `/healthz`. A loop says so on every
//! turn ([`Liveness::beat`]) and how long a quiet spell may last; a loop quieter than
//! that is wedged (an AWS or API call that never returns, a deadlock), and `/healthz`
//! answers 503 naming it, so the kubelet restarts the pod and the drains resume from
//! what is recorded on the Nodes and in AWS.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

#[derive(Default)]
pub struct Liveness {
    loops: Mutex<BTreeMap<&'static str, (Instant, Duration)>>,
    /// Loops that turn but cannot do their work (a Lease the RBAC forbids): `/readyz`
    /// says why.
    troubles: Mutex<BTreeMap<&'static str, String>>,
}

impl Liveness {
    /// The loop `name` cannot do its work, and why (`None`: it can again).
    pub fn trouble(&self, name: &'static str, why: Option<String>) {
        let mut t = self.troubles.lock();
        match why {
            Some(w) => {
                t.insert(name, w);
            }
            None => {
                t.remove(name);
            }
        }
    }

    /// What the loops in trouble say, joined; `None` when none is.
    pub fn troubles(&self) -> Option<String> {
        let t = self.troubles.lock();
        (!t.is_empty()).then(|| t.values().cloned().collect::<Vec<_>>().join("; "))
    }

    /// The loop `name` turned now; it must turn again within `max_quiet`.
    pub fn beat(&self, name: &'static str, max_quiet: Duration) {
        self.loops.lock().insert(name, (Instant::now(), max_quiet));
    }

    /// The loop ended on purpose (shutdown, stepping down): no longer watched.
    pub fn done(&self, name: &'static str) {
        self.loops.lock().remove(name);
    }

    /// The loops that have been quiet for longer than they may, with how long.
    pub fn wedged(&self) -> Vec<(&'static str, Duration, Duration)> {
        self.wedged_at(Instant::now())
    }

    fn wedged_at(&self, now: Instant) -> Vec<(&'static str, Duration, Duration)> {
        self.loops
            .lock()
            .iter()
            .filter_map(|(name, (last, max))| {
                let quiet = now.saturating_duration_since(*last);
                (quiet > *max).then_some((*name, quiet, *max))
            })
            .collect()
    }

    /// `/healthz`'s answer: None when every loop turns, else why not.
    pub fn problem(&self) -> Option<String> {
        let w = self.wedged();
        if w.is_empty() {
            return None;
        }
        Some(
            w.iter()
                .map(|(name, quiet, max)| {
                    format!(
                        "{name} has not turned for {}s (at most {}s expected)",
                        quiet.as_secs(),
                        max.as_secs()
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_is_wedged_only_past_its_own_quiet_limit() {
        let l = Liveness::default();
        assert!(l.problem().is_none());
        l.beat("drain loop", Duration::from_secs(60));
        l.beat("leader election", Duration::from_secs(10));
        let later = Instant::now() + Duration::from_secs(30);
        let w = l.wedged_at(later);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].0, "leader election");
        assert!(l.wedged_at(Instant::now() + Duration::from_secs(61)).len() == 2);
        l.done("leader election");
        assert!(l.wedged_at(later).is_empty());
    }
}
