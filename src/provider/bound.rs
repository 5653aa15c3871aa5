//! The time a size change (IncreaseSize, DecreaseTargetSize, and DeleteNodes giving up
//! placeholders) may spend before it must answer, and the point after which it no
//! longer starts its write.
//!
//! CA gives each call a deadline (its cloud-config `grpc_timeout`). A change that
//! answers after it reaches CA as DeadlineExceeded: CA counts the scale-up as failed
//! and backs the group off, while the change may still land in AWS behind its back.
//! So the waits before the write (the size lock, the group's re-read) end at the
//! bound, and the write starts only while enough is left for AWS to answer it: at
//! least [`reserve`], and at least as long as AWS took to answer this call's own read
//! (AWS slow for the read is slow for the write). Otherwise the call answers
//! Unavailable having changed nothing. A write AWS answers later than the bound all
//! the same is told as such: it may have landed, and it runs on, holding the size
//! lock, until AWS answers.

use std::future::Future;
use std::time::Duration;

use crate::clock::Instant;
use parking_lot::Mutex;
use tokio::task::JoinHandle;

use super::ProviderError;

/// The most time kept back for the write's own AWS request, whatever the reads took.
const WRITE_RESERVE: Duration = Duration::from_secs(1);

/// The time kept back for the write within a bound of `bound`, when this call's reads
/// took `read` at the slowest: a quarter of the bound, at most [`WRITE_RESERVE`], or
/// the read's time when that is longer. Pure.
pub fn reserve(bound: Duration, read: Duration) -> Duration {
    (bound / 4).min(WRITE_RESERVE).max(read)
}

/// A size change's bound, started when the call arrived.
#[derive(Debug)]
pub struct Bound {
    what: &'static str,
    group: String,
    /// When it must answer, and the bound it was given; `None`: no bound.
    by: Option<(Instant, Duration)>,
    /// The slowest wait on AWS so far ([`Self::read`]).
    slowest_read: Mutex<Duration>,
}

impl Bound {
    /// `what` (the RPC's name) on `group`, answering within `bound` from now.
    pub fn new(what: &'static str, group: &str, bound: Option<Duration>) -> Self {
        Self {
            what,
            group: group.to_string(),
            by: bound.map(|b| (Instant::now() + b, b)),
            slowest_read: Mutex::new(Duration::ZERO),
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

    /// [`Self::wait`] for a read of AWS, whose time the write's reserve then covers.
    pub async fn read<T>(
        &self,
        work: impl Future<Output = Result<T, ProviderError>>,
    ) -> Result<T, ProviderError> {
        let t0 = Instant::now();
        let r = self.wait(work).await;
        self.note_read(t0.elapsed());
        r
    }

    /// Counts a read of AWS made for this call by someone else (a DeleteNodes batch
    /// reads the group once for all its calls): the write's reserve covers it as it
    /// covers [`Self::read`]'s own.
    pub fn note_read(&self, took: Duration) {
        let mut slowest = self.slowest_read.lock();
        *slowest = (*slowest).max(took);
    }

    /// When the call must answer; `None`: no bound.
    pub fn deadline(&self) -> Option<Instant> {
        self.by.map(|(by, _)| by)
    }

    /// Waits for the size lock until the bound.
    pub async fn lock(
        &self,
        lock: &std::sync::Arc<tokio::sync::Mutex<()>>,
    ) -> Result<tokio::sync::OwnedMutexGuard<()>, ProviderError> {
        self.wait(async { Ok(lock.clone().lock_owned().await) })
            .await
    }

    /// Whether the write may start: enough of the bound is left for AWS to answer it.
    pub fn may_write(&self) -> Result<(), ProviderError> {
        self.may_write_at(Instant::now())
    }

    /// [`Self::may_write`] at `now`. Pure.
    fn may_write_at(&self, now: Instant) -> Result<(), ProviderError> {
        let read = *self.slowest_read.lock();
        match self.by {
            Some((by, bound)) if now + reserve(bound, read) > by => Err(self.late()),
            _ => Ok(()),
        }
    }

    /// Waits for the write, running as its own task (`write`), until the bound. Past
    /// it, the call answers that the write was sent and may land; the task runs on.
    pub async fn write(
        &self,
        desired: i32,
        write: JoinHandle<Result<(), ProviderError>>,
    ) -> Result<(), ProviderError> {
        let stopped = |e: tokio::task::JoinError| {
            ProviderError::Unavailable(format!("the size write stopped: {e}"))
        };
        let Some((by, _)) = self.by else {
            return write.await.unwrap_or_else(|e| Err(stopped(e)));
        };
        match tokio::time::timeout_at(by, write).await {
            Ok(done) => done.unwrap_or_else(|e| Err(stopped(e))),
            Err(_) => Err(self.sent(desired)),
        }
    }

    /// The answer when the write was sent and AWS did not answer it within the bound:
    /// it may have landed, or may still.
    pub fn sent(&self, desired: i32) -> ProviderError {
        let bound = self.by.map(|(_, b)| b).unwrap_or_default();
        ProviderError::Unavailable(format!(
            "{} for node group {}: SetDesiredCapacity {desired} was sent to AWS, which did not answer within {bound:?} (what is left of cluster-autoscaler's deadline); it may still land, and the next Refresh shows the group's size",
            self.what,
            super::echo(&self.group)
        ))
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
    fn the_reserve_is_a_quarter_up_to_a_second_or_the_reads_time() {
        let ms = Duration::from_millis;
        assert_eq!(reserve(ms(4000), ms(0)), ms(1000));
        assert_eq!(reserve(ms(40_000), ms(0)), ms(1000));
        assert_eq!(reserve(ms(800), ms(0)), ms(200));
        assert_eq!(reserve(ms(0), ms(0)), ms(0));
        assert_eq!(reserve(ms(4000), ms(300)), ms(1000), "a fast read");
        assert_eq!(reserve(ms(4000), ms(2500)), ms(2500), "AWS at 2.5 s");
        assert_eq!(reserve(ms(800), ms(500)), ms(500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_read_keeps_back_its_own_time_for_the_write() {
        let b = Bound::new("IncreaseSize", "web", Some(Duration::from_secs(4)));
        let slow_read = async {
            tokio::time::sleep(Duration::from_millis(2500)).await;
            Ok(())
        };
        b.read(slow_read).await.unwrap();
        let e = b.may_write().unwrap_err().to_string();
        assert!(e.contains("nothing was changed"), "{e}");
        let b = Bound::new("IncreaseSize", "web", Some(Duration::from_secs(4)));
        let read = async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Ok(())
        };
        b.read(read).await.unwrap();
        assert!(
            b.may_write().is_ok(),
            "2.5 s left for a write like a 1.5 s read"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_answered_past_the_bound_is_told_as_sent_and_runs_on() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let t0 = Instant::now();
        let b = Bound::new("IncreaseSize", "web", Some(Duration::from_secs(4)));
        let landed = std::sync::Arc::new(AtomicBool::new(false));
        let l = landed.clone();
        let write = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(6)).await;
            l.store(true, Ordering::SeqCst);
            Ok(())
        });
        let e = b.write(7, write).await.unwrap_err().to_string();
        assert!(
            e.contains("SetDesiredCapacity 7 was sent") && e.contains("may still land"),
            "{e}"
        );
        assert_eq!(
            t0.elapsed(),
            Duration::from_secs(4),
            "answered at the bound"
        );
        assert!(!landed.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(landed.load(Ordering::SeqCst), "the write ran on");
        let b = Bound::new("IncreaseSize", "web", Some(Duration::from_secs(4)));
        assert!(b.write(7, tokio::spawn(async { Ok(()) })).await.is_ok());
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
