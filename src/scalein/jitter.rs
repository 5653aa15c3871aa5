//! Spread: many drains must not retry or heartbeat in lockstep.

use std::sync::atomic::{AtomicU64, Ordering};

/// A number in [0, 1) from a fresh random source per call (no dependency): it spreads
/// retries and heartbeats, so many drains do not act in lockstep.
pub(crate) fn random_fraction() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}
