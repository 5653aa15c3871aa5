//! Leader election over a `coordination.k8s.io/v1` Lease, so that with more than one
//! replica the background work (the lifecycle scan and drains) runs in one place while
//! every replica serves gRPC. A replica that is not the leader still answers
//! DeleteNodes: it ends the instance through the hook or marks the Node, and the
//! leader's loop drains it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use tokio::sync::watch;

#[derive(Debug, Clone, PartialEq)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    /// Who we are in `holderIdentity` (the pod name).
    pub identity: String,
    /// How long a holder that stopped renewing keeps the lease.
    pub duration: Duration,
}

impl LeaseSettings {
    /// How often the holder renews, and others retry (client-go: every 2 s for a 15 s
    /// lease); at most 2 s, so a released lease is taken over quickly.
    pub fn retry_every(&self) -> Duration {
        (self.duration / 5).clamp(Duration::from_millis(100), Duration::from_secs(2))
    }
}

/// What to do with the lease as it is now. Pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No lease object: create it, holding it.
    Create,
    /// Ours: renew it.
    Renew,
    /// Free or expired: take it over (one more transition).
    Acquire,
    /// Someone else holds it and renews it.
    Follow { holder: String },
}

pub fn decide(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> Decision {
    let Some(spec) = spec else {
        return Decision::Create;
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == me {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::Acquire;
    }
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    let last = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0);
    match last {
        Some(t) if t + duration > now => Decision::Follow { holder },
        _ => Decision::Acquire,
    }
}

fn spec_for(me: &str, s: &LeaseSettings, old: Option<&LeaseSpec>, acquire: bool) -> LeaseSpec {
    let now = MicroTime(Timestamp::now());
    let old = old.cloned().unwrap_or_default();
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(s.duration.as_secs().max(1) as i32),
        acquire_time: if acquire {
            Some(now.clone())
        } else {
            old.acquire_time.clone()
        },
        renew_time: Some(now),
        lease_transitions: Some(
            old.lease_transitions.unwrap_or(0)
                + i32::from(acquire && old.holder_identity.is_some()),
        ),
        ..old
    }
}

/// One round: read the lease and act on it. `Ok(true)` when we hold it afterwards.
/// A conflict (someone else wrote first) is a lost round, not an error.
pub async fn round(api: &Api<Lease>, s: &LeaseSettings) -> Result<bool, kube::Error> {
    let current = api.get_opt(&s.name).await?;
    let decision = decide(
        current.as_ref().and_then(|l| l.spec.as_ref()),
        &s.identity,
        Timestamp::now(),
    );
    let result = match (&decision, current) {
        (Decision::Follow { .. }, _) => return Ok(false),
        (Decision::Create, _) => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(s.name.clone()),
                    namespace: Some(s.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(spec_for(&s.identity, s, None, true)),
            };
            api.create(&PostParams::default(), &lease).await.map(|_| ())
        }
        (Decision::Renew | Decision::Acquire, Some(mut lease)) => {
            let acquire = decision == Decision::Acquire;
            lease.spec = Some(spec_for(&s.identity, s, lease.spec.as_ref(), acquire));
            // resourceVersion in the object makes this a compare-and-swap.
            api.replace(&s.name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        }
        (_, None) => return Ok(false),
    };
    match result {
        Ok(()) => {
            if decision == Decision::Acquire || decision == Decision::Create {
                tracing::info!(lease = %s.name, identity = %s.identity, "became the leader");
            }
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the lease up if we hold it, so another replica takes over at once instead of
/// after the lease expires. `Ok(true)` when it was ours and is released now.
pub async fn release(api: &Api<Lease>, s: &LeaseSettings) -> Result<bool, kube::Error> {
    let Some(mut lease) = api.get_opt(&s.name).await? else {
        return Ok(false);
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(false);
    };
    if spec.holder_identity.as_deref() != Some(s.identity.as_str()) {
        return Ok(false);
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    match api.replace(&s.name, &PostParams::default(), &lease).await {
        Ok(_) => {
            tracing::info!(lease = %s.name, identity = %s.identity, "released the lease");
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Keeps trying to hold the lease until `stop` turns true, then releases it. The
/// receiver says whether we are the leader now. A leader that cannot renew steps down
/// once its lease would have expired, so two replicas never both believe they lead.
pub fn spawn(
    liveness: std::sync::Arc<crate::telemetry::liveness::Liveness>,
    client: kube::Client,
    s: LeaseSettings,
    mut stop: watch::Receiver<bool>,
) -> watch::Receiver<bool> {
    const NAME: &str = "leader election";
    let (tx, rx) = watch::channel(false);
    let quiet = (s.retry_every() * 4).max(std::time::Duration::from_secs(60));
    tokio::spawn(async move {
        let api: Api<Lease> = Api::namespaced(client, &s.namespace);
        let mut last_renewed: Option<tokio::time::Instant> = None;
        loop {
            liveness.beat(NAME, quiet);
            if *stop.borrow() {
                liveness.done(NAME);
                if let Err(e) = release(&api, &s).await {
                    tracing::warn!(lease = %s.name, error = %e, "could not release the lease; it expires by itself");
                }
                // Only now: whoever waits for `false` knows the release is done.
                let _ = tx.send(false);
                return;
            }
            let leading = match round(&api, &s).await {
                Ok(true) => {
                    last_renewed = Some(tokio::time::Instant::now());
                    true
                }
                Ok(false) => false,
                Err(e) => {
                    tracing::warn!(lease = %s.name, error = %e, "lease round failed");
                    // Still ours until it would expire for the others.
                    last_renewed.is_some_and(|t| t.elapsed() < s.duration * 2 / 3)
                }
            };
            if !leading {
                last_renewed = None;
            }
            if *tx.borrow() != leading {
                if !leading {
                    tracing::warn!(lease = %s.name, identity = %s.identity, "not the leader any more");
                }
                let _ = tx.send(leading);
            }
            if tx.is_closed() {
                liveness.done(NAME);
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(s.retry_every()) => {}
                _ = stop.changed() => {}
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed_secs_ago: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(duration),
            renew_time: Some(MicroTime(
                Timestamp::now() - SignedDuration::from_secs(renewed_secs_ago),
            )),
            ..Default::default()
        }
    }

    #[test]
    fn decisions() {
        let now = Timestamp::now();
        assert_eq!(decide(None, "a", now), Decision::Create);
        assert_eq!(decide(Some(&spec("a", 100, 15)), "a", now), Decision::Renew);
        assert_eq!(
            decide(Some(&spec("b", 3, 15)), "a", now),
            Decision::Follow { holder: "b".into() }
        );
        assert_eq!(
            decide(Some(&spec("b", 16, 15)), "a", now),
            Decision::Acquire
        );
        assert_eq!(decide(Some(&spec("", 1, 15)), "a", now), Decision::Acquire);
        let never_renewed = LeaseSpec {
            holder_identity: Some("b".into()),
            ..Default::default()
        };
        assert_eq!(decide(Some(&never_renewed), "a", now), Decision::Acquire);
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let s = LeaseSettings {
            name: "l".into(),
            namespace: "kube-system".into(),
            identity: "a".into(),
            duration: Duration::from_secs(15),
        };
        let old = spec("b", 30, 15);
        let taken = spec_for("a", &s, Some(&old), true);
        assert_eq!(taken.lease_transitions, Some(1));
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        let renewed = spec_for("a", &s, Some(&taken), false);
        assert_eq!(renewed.lease_transitions, Some(1));
        assert_eq!(renewed.acquire_time, taken.acquire_time);
        assert_eq!(s.retry_every(), Duration::from_secs(2));
    }
}
