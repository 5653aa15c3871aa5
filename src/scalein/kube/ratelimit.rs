//! A token bucket shared by every drain, so many nodes draining at once stay within a
//! bounded Kubernetes API request rate. Per-pod Events take what the drains leave: in
//! a storm an Event never holds back an eviction.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;

use parking_lot::Mutex;

/// Who waits for whom at the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// What a caller waits for within its own deadline (CA's DeleteNodes marking its
    /// Node): never queued behind the drains ([`RateLimiter::acquire_first`]).
    Answer,
    /// The drains' requests: [`RateLimiter::acquire`].
    Drain,
    /// What may wait (per-pod Events): a token only when no drain request waits for
    /// one ([`RateLimiter::acquire_spare`]).
    Spare,
}

/// A client whose every request first takes a token from `limiter`, at `priority`.
pub fn limited_client(
    client: kube::Client,
    limiter: Arc<RateLimiter>,
    priority: Priority,
) -> kube::Client {
    crate::scalein::kube::intercept::intercepted(client, move |req, client| {
        let limiter = limiter.clone();
        Box::pin(async move {
            match priority {
                Priority::Answer => limiter.acquire_first().await,
                Priority::Drain => limiter.acquire().await,
                Priority::Spare => limiter.acquire_spare().await,
            }
            client.send(req).await
        })
    })
}

pub struct RateLimiter {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
    /// Drain requests waiting for a token right now.
    waiting: AtomicUsize,
}

/// Counts a waiting drain request for as long as it waits.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl RateLimiter {
    pub fn new(qps: f64, burst: u32) -> Self {
        let qps = if qps.is_finite() && qps > 0.0 {
            qps
        } else {
            1.0
        };
        let burst = f64::from(burst.max(1));
        Self {
            qps,
            burst,
            state: Mutex::new((burst, Instant::now())),
            waiting: AtomicUsize::new(0),
        }
    }

    /// Takes one token, waiting for it when the bucket is empty.
    pub async fn acquire(&self) {
        let Err(mut wait) = self.try_acquire_at(Instant::now()) else {
            return;
        };
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let _counted = Waiting(&self.waiting);
        loop {
            tokio::time::sleep(wait).await;
            match self.try_acquire_at(Instant::now()) {
                Ok(()) => return,
                Err(w) => wait = w,
            }
        }
    }

    /// Takes a token ahead of every waiting drain request: at once while the bucket
    /// can lend it (down to one burst of debt, which the drains then wait out), so a
    /// request a caller waits for within its deadline is counted in the rate but
    /// never queued behind a storm. Past that debt it waits like the others.
    pub async fn acquire_first(&self) {
        loop {
            let wait = {
                let mut st = self.state.lock();
                let now = Instant::now();
                let refill = now.saturating_duration_since(st.1).as_secs_f64() * self.qps;
                st.0 = (st.0 + refill).min(self.burst);
                st.1 = st.1.max(now);
                if st.0 - 1.0 >= -self.burst {
                    st.0 -= 1.0;
                    return;
                }
                Duration::from_secs_f64((-self.burst + 1.0 - st.0) / self.qps)
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Takes a token only when no drain request waits for one and the bucket holds
    /// more than half its burst: low-priority requests (Events) use what the drains
    /// leave, never the token the next eviction would need, and in a storm that keeps
    /// the bucket low they wait for its end. A quiet bucket is full: they go at once.
    pub async fn acquire_spare(&self) {
        let reserve = (self.burst / 2.0).floor();
        loop {
            let wait = if self.waiting.load(Ordering::Acquire) == 0 {
                match self.try_acquire_above(Instant::now(), reserve) {
                    Ok(()) => return,
                    Err(w) => w,
                }
            } else {
                Duration::from_secs_f64(1.0 / self.qps)
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// Whether a drain request waits for a token now (the API rate is the limit).
    pub fn contended(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }

    /// Takes a token at `now`, or says how long until one is there.
    fn try_acquire_at(&self, now: Instant) -> Result<(), Duration> {
        self.try_acquire_above(now, 0.0)
    }

    /// Takes a token at `now` if `reserve` tokens stay, or says how long until then.
    fn try_acquire_above(&self, now: Instant, reserve: f64) -> Result<(), Duration> {
        let mut st = self.state.lock();
        let refill = now.saturating_duration_since(st.1).as_secs_f64() * self.qps;
        st.0 = (st.0 + refill).min(self.burst);
        st.1 = st.1.max(now);
        if st.0 >= 1.0 + reserve {
            st.0 -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64((1.0 + reserve - st.0) / self.qps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_answer_goes_ahead_of_waiting_drains_and_is_counted() {
        let rl = Arc::new(RateLimiter::new(1.0, 2));
        // The burst is spent; a drain request waits for the next token.
        rl.acquire().await;
        rl.acquire().await;
        let drain = tokio::spawn({
            let rl = rl.clone();
            async move { rl.acquire().await }
        });
        tokio::task::yield_now().await;
        assert!(rl.contended(), "a drain request waits");
        // An answer does not: it borrows up to one burst ahead.
        for _ in 0..2 {
            tokio::time::timeout(Duration::from_millis(50), rl.acquire_first())
                .await
                .expect("an answer never queues behind the drains while the bucket can lend");
        }
        // The debt is the drains' to wait out: the bucket is two tokens in the red.
        let st = *rl.state.lock();
        assert!(st.0 < -1.0 + 1e-6, "counted: {}", st.0);
        drain.abort();
    }

    #[test]
    fn burst_then_steady_rate() {
        let rl = RateLimiter::new(10.0, 5);
        let t0 = rl.state.lock().1;
        for _ in 0..5 {
            assert!(rl.try_acquire_at(t0).is_ok(), "the burst is free");
        }
        let wait = rl.try_acquire_at(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // 100 ms later exactly one more token is there.
        let t1 = t0 + Duration::from_millis(100);
        assert!(rl.try_acquire_at(t1).is_ok());
        assert!(rl.try_acquire_at(t1).is_err());
        // A long pause refills only up to the burst.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..5 {
            assert!(rl.try_acquire_at(t2).is_ok());
        }
        assert!(rl.try_acquire_at(t2).is_err());
    }

    #[tokio::test]
    async fn events_wait_while_a_drain_request_waits() {
        let rl = Arc::new(RateLimiter::new(100.0, 1));
        rl.acquire().await; // the burst is spent
        let order = Arc::new(Mutex::new(Vec::new()));
        let spare = {
            let (rl, order) = (rl.clone(), order.clone());
            tokio::spawn(async move {
                rl.acquire_spare().await;
                order.lock().push("event");
            })
        };
        tokio::task::yield_now().await;
        let drains: Vec<_> = (0..3)
            .map(|i| {
                let (rl, order) = (rl.clone(), order.clone());
                tokio::spawn(async move {
                    rl.acquire().await;
                    order.lock().push(["evict-0", "evict-1", "evict-2"][i]);
                })
            })
            .collect();
        for d in drains {
            d.await.unwrap();
        }
        spare.await.unwrap();
        let order = order.lock().clone();
        assert_eq!(order.last(), Some(&"event"), "{order:?}");
        assert_eq!(order.len(), 4);
    }

    #[test]
    fn events_leave_half_the_burst_to_the_drains() {
        let rl = RateLimiter::new(10.0, 10);
        let t0 = rl.state.lock().1;
        // A full bucket: Events go at once, down to half of it.
        for _ in 0..5 {
            assert!(rl.try_acquire_above(t0, 5.0).is_ok());
        }
        let wait = rl.try_acquire_above(t0, 5.0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // The drains still have the other half.
        for _ in 0..5 {
            assert!(rl.try_acquire_at(t0).is_ok());
        }
        assert!(rl.try_acquire_at(t0).is_err());
    }

    #[test]
    fn nonsense_rates_are_clamped() {
        let rl = RateLimiter::new(f64::NAN, 0);
        assert_eq!(rl.qps, 1.0);
        assert_eq!(rl.burst, 1.0);
    }
}
