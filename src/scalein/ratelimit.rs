//! A token bucket shared by every drain, so many nodes draining at once stay within a
//! bounded Kubernetes API request rate.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

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
        loop {
            let wait = {
                let mut st = self.state.lock();
                let now = Instant::now();
                let refill = now.duration_since(st.1).as_secs_f64() * self.qps;
                st.0 = (st.0 + refill).min(self.burst);
                st.1 = now;
                if st.0 >= 1.0 {
                    st.0 -= 1.0;
                    return;
                }
                Duration::from_secs_f64((1.0 - st.0) / self.qps)
            };
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_rate() {
        let rl = RateLimiter::new(10.0, 5);
        let start = tokio::time::Instant::now();
        for _ in 0..5 {
            rl.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst is free");
        // Paused time only advances through the limiter's sleeps.
        for _ in 0..10 {
            rl.acquire().await;
        }
        assert!(
            start.elapsed() >= Duration::from_millis(900),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn nonsense_rates_are_clamped() {
        let rl = RateLimiter::new(f64::NAN, 0);
        assert_eq!(rl.qps, 1.0);
        assert_eq!(rl.burst, 1.0);
    }
}
