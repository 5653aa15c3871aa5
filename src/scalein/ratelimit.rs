//! A token bucket shared by every drain, so many nodes draining at once stay within a
//! bounded Kubernetes API request rate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A client whose every request first takes a token from `limiter`.
pub fn limited_client(client: kube::Client, limiter: Arc<RateLimiter>) -> kube::Client {
    super::intercept::intercepted(client, move |req, client| {
        let limiter = limiter.clone();
        Box::pin(async move {
            limiter.acquire().await;
            client.send(req).await
        })
    })
}

pub struct RateLimiter {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
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
        }
    }

    /// Takes one token, waiting for it when the bucket is empty.
    pub async fn acquire(&self) {
        while let Err(wait) = self.try_acquire_at(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
    }

    /// Takes a token at `now`, or says how long until one is there.
    fn try_acquire_at(&self, now: Instant) -> Result<(), Duration> {
        let mut st = self.state.lock();
        let refill = now.saturating_duration_since(st.1).as_secs_f64() * self.qps;
        st.0 = (st.0 + refill).min(self.burst);
        st.1 = st.1.max(now);
        if st.0 >= 1.0 {
            st.0 -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64((1.0 - st.0) / self.qps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn nonsense_rates_are_clamped() {
        let rl = RateLimiter::new(f64::NAN, 0);
        assert_eq!(rl.qps, 1.0);
        assert_eq!(rl.burst, 1.0);
    }
}
