//! Spread: many drains must not retry or heartbeat in lockstep.

/// A number in [0, 1) for whoever `key` names (a pod, an instance) that spreads retries and heartbeats, so many drains do not act
/// in lockstep: the service's one source of chance (a fixed sequence on a simulated
/// clock, see crate::clock).
pub(crate) fn random_fraction(key: &str) -> f64 {
    crate::clock::random_fraction(key)
}
