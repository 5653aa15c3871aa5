//! The one clock the service, the memory cloud and the in-memory API server read
//! (issue 39: model tests that replay exactly).
//!
//! - [`Instant`] is tokio's: the same as std's in production, and under a test
//!   runtime started with a paused clock it moves only when every task waits, so a
//!   timeout, a poll or a heartbeat falls at the same point of a case whatever the
//!   machine's load.
//! - [`utc_now`] is wall time. In production it is the system's. A test that runs on
//!   a paused clock calls [`simulate_wall_clock`] first: from then on, on that
//!   thread, wall time is the start it gives plus the paused clock's travel, so a
//!   deadline written to a Node, a message's age and a PDB's `disruptedPods` stamp
//!   move with the same clock as every timer.
//!
//! - [`random_fraction`] is the service's one source of chance (the jitter that
//!   spreads retries and heartbeats). Under a simulated wall clock each key (a pod,
//!   an instance) draws its own fixed sequence, so a case's jitter replays too, even
//!   where two tasks draw at one instant in an order that varies.
//!
//! Wall time is kept per thread because a paused clock is only allowed on tokio's
//! current-thread runtime, whose tasks all run on the thread that drives it.

use std::cell::Cell;
use std::time::SystemTime;

use chrono::{DateTime, Utc};

pub use tokio::time::Instant;

thread_local! {
    /// Wall time at a point of the paused clock, when this thread simulates it.
    static SIMULATED: Cell<Option<(DateTime<Utc>, Instant)>> = const { Cell::new(None) };
    /// How many draws each key made on this thread, while it simulates.
    static CHANCE: std::cell::RefCell<Option<std::collections::BTreeMap<String, u64>>> =
        const { std::cell::RefCell::new(None) };
}

/// The seed of the fixed sequence of chance a simulating thread starts from.
const SIMULATED_SEED: u64 = 0x5eed_0fca_a59d_7a15;

/// A number in [0, 1) for whoever `key` names: from a fresh random source per call
/// in production (the key unused), from the key's own fixed sequence while the
/// thread simulates (see the module's face).
pub fn random_fraction(key: &str) -> f64 {
    let simulated = CHANCE.with(|c| {
        c.borrow_mut().as_mut().map(|draws| {
            let n = draws.entry(key.to_string()).or_insert(0);
            *n += 1;
            let of_key = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
            mix(SIMULATED_SEED ^ of_key ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        })
    });
    let bits = match simulated {
        Some(bits) => bits,
        None => {
            use std::hash::{BuildHasher, Hasher};
            use std::sync::atomic::{AtomicU64, Ordering};
            static CALLS: AtomicU64 = AtomicU64::new(0);
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
            h.finish()
        }
    };
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// `policy` with jitter: random in production; on a simulating thread from a seed
/// the key's own sequence gives (see [`random_fraction`]), so a retry's waits replay.
pub fn jittered(policy: backon::ExponentialBuilder, key: &str) -> backon::ExponentialBuilder {
    let policy = policy.with_jitter();
    if CHANCE.with(|c| c.borrow().is_none()) {
        return policy;
    }
    policy.with_jitter_seed((random_fraction(key) * (1u64 << 53) as f64) as u64)
}

/// SplitMix64's output step: every bit of the state reaches every bit of the result.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Now, on the monotonic clock.
pub fn now() -> Instant {
    Instant::now()
}

/// Wall time now: the system's, or the simulated one on a thread that set it.
pub fn utc_now() -> DateTime<Utc> {
    match SIMULATED.with(Cell::get) {
        None => Utc::now(),
        Some((start, at)) => {
            let travelled = Instant::now().saturating_duration_since(at);
            start + chrono::Duration::from_std(travelled).unwrap_or(chrono::TimeDelta::MAX)
        }
    }
}

/// [`utc_now`] as the Kubernetes types' timestamp (nanoseconds kept).
pub fn timestamp_now() -> k8s_openapi::jiff::Timestamp {
    let t = utc_now();
    let nanos = i128::from(t.timestamp()) * 1_000_000_000 + i128::from(t.timestamp_subsec_nanos());
    k8s_openapi::jiff::Timestamp::from_nanosecond(nanos)
        .unwrap_or(k8s_openapi::jiff::Timestamp::MAX)
}

/// [`utc_now`] as a [`SystemTime`].
pub fn system_now() -> SystemTime {
    SystemTime::from(utc_now())
}

/// From now on, on this thread, wall time starts at `start` and moves with tokio's
/// clock (see the module's face), until the guard is dropped.
///
/// # Panics
/// Outside a current-thread tokio runtime: on a multi-thread runtime a task may run
/// on a thread that does not simulate, and read a wall time from another clock.
pub fn simulate_wall_clock(start: DateTime<Utc>) -> SimulatedWallClock {
    let flavor = tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor());
    assert!(
        matches!(flavor, Ok(tokio::runtime::RuntimeFlavor::CurrentThread)),
        "a simulated wall clock needs a current-thread tokio runtime (found {flavor:?})"
    );
    SIMULATED.with(|s| s.set(Some((start, Instant::now()))));
    CHANCE.with(|c| *c.borrow_mut() = Some(Default::default()));
    SimulatedWallClock {
        _not_send: std::marker::PhantomData,
    }
}

/// Ends the simulated wall time on its thread when dropped.
pub struct SimulatedWallClock {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for SimulatedWallClock {
    fn drop(&mut self) {
        SIMULATED.with(|s| s.set(None));
        CHANCE.with(|c| *c.borrow_mut() = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn simulated_wall_time_moves_with_the_paused_clock_and_ends_with_its_guard() {
        let start = Utc::now() + chrono::Duration::days(1000);
        let guard = simulate_wall_clock(start);
        assert_eq!(utc_now(), start);
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert_eq!(utc_now(), start + chrono::Duration::seconds(90));
        assert_eq!(
            system_now(),
            SystemTime::from(start + chrono::Duration::seconds(90))
        );
        assert_eq!(timestamp_now().as_second(), start.timestamp() + 90);
        drop(guard);
        assert!(
            utc_now() < start,
            "the system's clock again after the guard"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn chance_is_a_fixed_sequence_while_simulating_and_spread_in_range() {
        let draw = || {
            (0..200)
                .map(|_| random_fraction("a pod"))
                .collect::<Vec<f64>>()
        };
        let first = {
            let _g = simulate_wall_clock(Utc::now());
            draw()
        };
        let again = {
            let _g = simulate_wall_clock(Utc::now());
            draw()
        };
        assert_eq!(first, again, "the same sequence on every simulation");
        let free = draw();
        assert_ne!(free, first, "production's chance is not the fixed sequence");
        for x in first.iter().chain(&free) {
            assert!((0.0..1.0).contains(x), "{x} out of [0, 1)");
        }
        let distinct: std::collections::BTreeSet<u64> = first.iter().map(|x| x.to_bits()).collect();
        assert!(distinct.len() > 190, "{} distinct of 200", distinct.len());
        // A key's sequence does not depend on other keys' draws in between.
        let _g = simulate_wall_clock(Utc::now());
        let alone = random_fraction("a pod");
        let _g = simulate_wall_clock(Utc::now());
        random_fraction("another pod");
        assert_eq!(random_fraction("a pod"), alone);
        assert_ne!(random_fraction("another pod"), random_fraction("a pod"));
    }

    #[test]
    #[should_panic(expected = "current-thread tokio runtime")]
    fn a_simulated_wall_clock_refuses_a_multi_thread_runtime() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        rt.block_on(async {
            let _ = simulate_wall_clock(Utc::now());
        });
    }
}
