//! Leader election over a Lease, against the in-memory API server over HTTP: one
//! leader, takeover after expiry, and a stopping leader releasing the Lease.

use std::time::Duration;

use ca_asg_provider::scalein;
use ca_asg_provider::sim::{SimCluster, SimOptions};

mod support;
use support::eventually;

#[tokio::test]
async fn one_lease_one_leader_and_takeover_after_expiry() {
    use scalein::leader::{round, LeaseSettings};
    let sim = SimCluster::start(SimOptions::default()).await.unwrap();
    let settings = |who: &str| LeaseSettings {
        name: "ca-asg-provider".into(),
        namespace: "kube-system".into(),
        identity: who.into(),
        duration: Duration::from_secs(1),
    };
    let api: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(sim.client_as(support::rbac::ENGINE_USER), "kube-system");
    let (a, b) = (settings("replica-a"), settings("replica-b"));
    assert!(
        round(&api, &a).await.unwrap(),
        "a creates and holds the lease"
    );
    assert!(!round(&api, &b).await.unwrap(), "b follows while a renews");
    assert!(round(&api, &a).await.unwrap(), "a renews");
    assert!(!round(&api, &b).await.unwrap());
    // a stops renewing; once the lease expires b takes over, and a then follows.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(
        round(&api, &b).await.unwrap(),
        "b takes over an expired lease"
    );
    assert!(!round(&api, &a).await.unwrap(), "a follows b now");
    let lease = api.get("ca-asg-provider").await.unwrap().spec.unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some("replica-b"));
    assert_eq!(lease.lease_transitions, Some(1));
    // b shuts down and releases it: a takes over at once, without waiting for expiry.
    assert!(
        !scalein::leader::release(&api, &a).await.unwrap(),
        "not a's to release"
    );
    assert!(scalein::leader::release(&api, &b).await.unwrap());
    assert!(
        round(&api, &a).await.unwrap(),
        "a takes the released lease at once"
    );
    // Leases are in the RBAC.
    support::rbac::assert_rbac_covers(&sim);
}

#[tokio::test]
async fn two_replicas_elect_one_leader_and_a_stopping_leader_hands_over() {
    use scalein::leader::{spawn, LeaseSettings};
    let sim = SimCluster::start(SimOptions::default()).await.unwrap();
    // A long lease: a takeover within this test can only come from the release.
    let settings = |who: &str| LeaseSettings {
        name: "ca-asg-provider".into(),
        namespace: "kube-system".into(),
        identity: who.into(),
        duration: Duration::from_secs(60),
    };
    let (stop_a, stop_a_rx) = tokio::sync::watch::channel(false);
    let (_stop_b, stop_b_rx) = tokio::sync::watch::channel(false);
    let live_a = std::sync::Arc::new(ca_asg_provider::telemetry::liveness::Liveness::default());
    let live_b = std::sync::Arc::new(ca_asg_provider::telemetry::liveness::Liveness::default());
    let a = spawn(
        live_a.clone(),
        sim.client_as(support::rbac::ENGINE_USER),
        settings("replica-a"),
        stop_a_rx,
    );
    let b = spawn(
        live_b.clone(),
        sim.client_as(support::rbac::ENGINE_USER),
        settings("replica-b"),
        stop_b_rx,
    );
    eventually("a leader", 10, || *a.borrow() || *b.borrow()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(*a.borrow() ^ *b.borrow(), "exactly one leader");
    let (leader_stop, other) = if *a.borrow() {
        (&stop_a, &b)
    } else {
        (&_stop_b, &a)
    };
    // Both election loops turn, so /healthz would say ok.
    assert!(live_a.problem().is_none() && live_b.problem().is_none());
    assert!(live_a.wedged().is_empty());
    leader_stop.send_replace(true);
    eventually("the other replica leads after the release", 20, || {
        *other.borrow()
    })
    .await;
    support::rbac::assert_rbac_covers(&sim);
}
