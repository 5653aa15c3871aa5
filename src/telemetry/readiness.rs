//! Readiness said where an operator looks: a pod that stays unready names why in its own
//! Events (`kubectl describe pod`, `kubectl get events`), not only in its log. The
//! kubelet's probe Event says only "HTTP probe failed with statuscode: 503".
//!
//! [`Teller`] decides when (pure, time passed in); [`spawn`] watches `/readyz`'s answer
//! and publishes what the teller says as an Event on the service's own Pod.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::http::{readiness, Status};
use super::liveness::Liveness;

/// Unready for this long before it is told: a start loads its node groups in seconds.
pub const GRACE: Duration = Duration::from_secs(30);
/// The same cause told again this often while it lasts (the Event's count grows).
pub const REPEAT: Duration = Duration::from_secs(300);
/// How often the answer is looked at.
pub const LOOK_EVERY: Duration = Duration::from_secs(5);

/// What to tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tell {
    /// Unready past the grace period: why, and what to check.
    NotReady(String),
    /// Ready again after a `NotReady` was told.
    Ready,
}

/// When to tell: unready for [`GRACE`], then when the cause changes (no more often than
/// every [`GRACE`], as a cause can carry an AWS request id that changes every read) or
/// every [`REPEAT`]; ready again once after it was told. Times are the process's
/// monotonic age.
#[derive(Debug)]
pub struct Teller {
    grace: Duration,
    repeat: Duration,
    unready_since: Option<Duration>,
    told: Option<(String, Duration)>,
}

impl Default for Teller {
    fn default() -> Self {
        Self::new(GRACE, REPEAT)
    }
}

impl Teller {
    /// A teller with its own grace and repeat ([`GRACE`], [`REPEAT`] by default).
    pub fn new(grace: Duration, repeat: Duration) -> Self {
        Self {
            grace,
            repeat,
            unready_since: None,
            told: None,
        }
    }

    pub fn observe(&mut self, state: Result<(), String>, now: Duration) -> Option<Tell> {
        let why = match state {
            Ok(()) => {
                self.unready_since = None;
                return self.told.take().map(|_| Tell::Ready);
            }
            Err(why) => why,
        };
        let since = *self.unready_since.get_or_insert(now);
        if now.saturating_sub(since) < self.grace {
            return None;
        }
        let due = match &self.told {
            None => true,
            Some((told, at)) => {
                let quiet = now.saturating_sub(*at);
                (*told != why && quiet >= self.grace) || quiet >= self.repeat
            }
        };
        if !due {
            return None;
        }
        self.told = Some((why.clone(), now));
        Some(Tell::NotReady(why))
    }
}

/// The service's own Pod, from the downward API (`POD_NAME`, `POD_NAMESPACE`,
/// `POD_UID`: `kubectl describe pod` shows the Events whose object has its uid).
/// `None` outside a pod: the log line is all there is.
pub fn own_pod() -> Option<ObjectReference> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    Some(ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(var("POD_NAME")?),
        namespace: Some(var("POD_NAMESPACE")?),
        uid: var("POD_UID"),
        ..Default::default()
    })
}

/// The Event for `tell` (reason `NotReady`, a Warning, or `Ready`).
pub fn event(tell: &Tell) -> Event {
    let (type_, reason, note) = match tell {
        Tell::NotReady(why) => (EventType::Warning, "NotReady", format!("not ready: {why}")),
        Tell::Ready => (
            EventType::Normal,
            "Ready",
            "ready: node groups loaded; serving cluster-autoscaler".to_string(),
        ),
    };
    let mut note = note;
    if note.len() > 1000 {
        let mut cut = 1000;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Ready".into(),
        secondary: None,
    }
}

/// Looks at readiness every `look_every` ([`LOOK_EVERY`] in the service) for the life
/// of the process and tells the Pod's Events what `teller` says; also logged. A failure
/// to publish is logged (at debug: the log line above it says the same), never fatal.
pub fn spawn(
    client: kube::Client,
    pod: ObjectReference,
    status: Arc<dyn Status>,
    liveness: Arc<Liveness>,
    mut teller: Teller,
    look_every: Duration,
) -> tokio::task::JoinHandle<()> {
    let reporter = Reporter {
        controller: "ca-asg-provider".into(),
        instance: pod.name.clone(),
    };
    let recorder = Recorder::new(client, reporter);
    tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(look_every);
        loop {
            tick.tick().await;
            let Some(tell) = teller.observe(readiness(&*status, &liveness), start.elapsed()) else {
                continue;
            };
            match &tell {
                Tell::NotReady(why) => tracing::warn!("not ready: {why}"),
                Tell::Ready => tracing::info!("ready again"),
            }
            if let Err(e) = recorder.publish(&event(&tell), &pod).await {
                tracing::debug!(error = %e, "could not publish the readiness Event on the pod");
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn no(why: &str) -> Result<(), String> {
        Err(why.to_string())
    }

    #[test]
    fn a_start_that_gets_ready_within_the_grace_says_nothing() {
        let mut t = Teller::default();
        assert_eq!(t.observe(no("no refresh yet"), Duration::ZERO), None);
        assert_eq!(t.observe(no("no refresh yet"), GRACE - S), None);
        assert_eq!(t.observe(Ok(()), GRACE), None);
    }

    #[test]
    fn unready_past_the_grace_is_told_once_then_every_repeat_then_ready_once() {
        let mut t = Teller::default();
        let why = "no node group found";
        assert_eq!(t.observe(no(why), Duration::ZERO), None);
        assert_eq!(t.observe(no(why), GRACE), Some(Tell::NotReady(why.into())));
        assert_eq!(t.observe(no(why), GRACE + 5 * S), None);
        assert_eq!(t.observe(no(why), GRACE + REPEAT - S), None);
        assert_eq!(
            t.observe(no(why), GRACE + REPEAT),
            Some(Tell::NotReady(why.into()))
        );
        assert_eq!(t.observe(Ok(()), GRACE + REPEAT + S), Some(Tell::Ready));
        assert_eq!(t.observe(Ok(()), GRACE + REPEAT + 2 * S), None);
    }

    #[test]
    fn a_new_cause_is_told_but_not_more_often_than_the_grace() {
        let mut t = Teller::default();
        assert_eq!(t.observe(no("a"), Duration::ZERO), None);
        assert_eq!(t.observe(no("a"), GRACE), Some(Tell::NotReady("a".into())));
        assert_eq!(t.observe(no("b"), GRACE + 5 * S), None, "too soon");
        assert_eq!(
            t.observe(no("b"), 2 * GRACE),
            Some(Tell::NotReady("b".into()))
        );
    }

    #[test]
    fn unready_again_after_ready_waits_the_grace_again() {
        let mut t = Teller::default();
        t.observe(no("a"), Duration::ZERO);
        assert!(t.observe(no("a"), GRACE).is_some());
        assert_eq!(t.observe(Ok(()), GRACE + S), Some(Tell::Ready));
        let later = GRACE + 10 * S;
        assert_eq!(t.observe(no("a"), later), None);
        assert_eq!(
            t.observe(no("a"), later + GRACE),
            Some(Tell::NotReady("a".into()))
        );
    }

    #[test]
    fn the_event_names_the_cause_and_is_bounded() {
        let e = event(&Tell::NotReady(
            "no node group found: check the tags".into(),
        ));
        assert_eq!(e.reason, "NotReady");
        assert!(matches!(e.type_, EventType::Warning));
        assert_eq!(
            e.note.as_deref(),
            Some("not ready: no node group found: check the tags")
        );
        let long = event(&Tell::NotReady("é".repeat(2000)));
        assert!(long.note.unwrap().len() <= 1000);
    }
}
