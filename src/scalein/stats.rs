//! The drains' counters, which the engine and the stages add to (read by tests,
//! the demo and the load generator; the metrics are in `crate::telemetry`).

use std::sync::atomic::AtomicU64;

/// Counters for metrics and tests.
#[derive(Debug, Default)]
pub struct DrainStats {
    pub started: AtomicU64,
    pub ended: AtomicU64,
    pub abandoned: AtomicU64,
    pub failed: AtomicU64,
    pub deadlines_hit: AtomicU64,
    pub evictions_ok: AtomicU64,
    pub evictions_pdb_blocked: AtomicU64,
    /// Tries held back because the budget's cached status allowed none (no request).
    pub evictions_held: AtomicU64,
    /// Tries sent although the budget's cached status allowed none: it had not
    /// changed for `evictionRetryInterval` (a stopped disruption controller).
    pub evictions_forced: AtomicU64,
    pub evictions_error: AtomicU64,
    pub heartbeats: AtomicU64,
}
