//! The time a size change (IncreaseSize, DecreaseTargetSize) may spend before it must
//! answer, and the point after which it no longer starts its write.
//!
//! CA gives each call a deadline (its cloud-config `grpc_timeout`). A change that
//! answers after it reaches CA as DeadlineExceeded: CA counts the scale-up as failed
//! and backs the group off, while the change may still land in AWS behind its back.
//! So the waits before the write (the size lock, the group's re-read) end at the
//! bound, and the write starts only while there is still [`reserve`] left for AWS to
//! answer it; otherwise the call answers Unavailable having changed nothing.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::ProviderError;

/// The most time kept back for the write's own AWS request.
const WRITE_RESERVE: Duration = Duration::from_secs(1);

/// The time kept back for the write within a bound of `bound`: a quarter of it, at
/// most [`WRITE_RESERVE`]. Pure.
pub fn reserve(bound: Duration) -> Duration {
    (bound / 4).min(WRITE_RESERVE)
}

/// A size change's bound, started when the call arrived.
#[derive(Debug, Clone)]
pub struct Bound {
    what: &'static str,
    group: String,
    /// When it must answer, and the bound it was given; `None`: no bound.
    by: Option<(Instant, Duration)>,
}

impl Bound {
    /// `what` (the RPC's name) on `group`, answering within `bound` from now.
    pub fn new(what: &'static str, group: &str, bound: Option<Duration>) -> Self {
        Self {
            what,
            group: group.to_string(),
            by: bound.map(|b| (Instant::now() + b, b)),
        }
    }

    /// Waits for `work`, which changes nothing (a lock, a read), until the bound.
    pub async fn wait<T>(
        &self,
        work: impl Future<Output = Result<T, ProviderError>>,
    ) -> Result<T, ProviderError> {
        match self.by {
            None => work.await,
            Some((by, _)) => tokio::time::timeout_at(by, work)
                .await
                .unwrap_or_else(|_| Err(self.late())),
        }
    }

    /// Waits for the size lock until the bound.
    pub async fn lock<'a>(
        &self,
        lock: &'a tokio::sync::Mutex<()>,
    ) -> Result<tokio::sync::MutexGuard<'a, ()>, ProviderError> {
        self.wait(async { Ok(lock.lock().await) }).await
    }

    /// Whether the write may start: enough of the bound is left for AWS to answer it.
    pub fn may_write(&self) -> Result<(), ProviderError> {
        self.may_write_at(Instant::now())
    }

    /// [`Self::may_write`] at `now`. Pure.
    fn may_write_at(&self, now: Instant) -> Result<(), ProviderError> {
        match self.by {
            Some((by, bound)) if now + reserve(bound) > by => Err(self.late()),
            _ => Ok(()),
        }
    }

    fn late(&self) -> ProviderError {
        let bound = self.by.map(|(_, b)| b).unwrap_or_default();
        ProviderError::Unavailable(format!(
            "{} for node group {}: AWS did not answer in time to change the size within {bound:?} (what is left of cluster-autoscaler's deadline); nothing was changed; retry",
            self.what,
            super::echo(&self.group)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_a_quarter_up_to_a_second() {
        assert_eq!(reserve(Duration::from_secs(4)), Duration::from_secs(1));
        assert_eq!(reserve(Duration::from_secs(40)), Duration::from_secs(1));
        assert_eq!(
            reserve(Duration::from_millis(800)),
            Duration::from_millis(200)
        );
        assert_eq!(reserve(Duration::ZERO), Duration::ZERO);
    }

    #[tokio::test]
    async fn a_wait_past_the_bound_changes_nothing_and_says_so() {
        let b = Bound::new("IncreaseSize", "web", Some(Duration::from_millis(20)));
        let never = std::future::pending::<Result<u8, ProviderError>>();
        let e = b.wait(never).await.unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, ProviderError::Unavailable(_)), "{m}");
        assert!(
            m.contains("IncreaseSize for node group \"web\"")
                && m.contains("within 20ms")
                && m.contains("nothing was changed"),
            "{m}"
        );
        let b = Bound::new("IncreaseSize", "web", Some(Duration::from_secs(3600)));
        assert_eq!(b.wait(async { Ok(7) }).await.unwrap(), 7);
        let unbounded = Bound::new("IncreaseSize", "web", None);
        assert_eq!(unbounded.wait(async { Ok(8) }).await.unwrap(), 8);
    }

    #[test]
    fn the_write_starts_only_with_its_reserve_left() {
        let b = Bound::new("DecreaseTargetSize", "web", Some(Duration::from_secs(4)));
        let (by, _) = b.by.unwrap();
        let at = |left_ms: u64| by - Duration::from_millis(left_ms);
        assert!(b.may_write_at(at(4000)).is_ok());
        assert!(
            b.may_write_at(at(1100)).is_ok(),
            "1.1 s left, 1 s kept back"
        );
        assert!(b.may_write_at(at(1000)).is_ok(), "exactly the reserve left");
        assert!(b.may_write_at(at(900)).is_err(), "0.9 s left");
        assert!(b.may_write_at(by + Duration::from_secs(1)).is_err());
        let unbounded = Bound::new("DecreaseTargetSize", "web", None);
        assert!(unbounded
            .may_write_at(Instant::now() + Duration::from_secs(3600))
            .is_ok());
    }
}
