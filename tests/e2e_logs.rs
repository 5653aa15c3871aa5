//! The field report, on real containers: when a node is scaled in, are the lines an app
//! writes through its preStop shipped, or lost with the log shipper? One real node (a
//! kubelet built from k8s.io/kubernetes with its own containerd, registered with the
//! providerID of the ASG's instance), an app writing a numbered line every 100 ms through
//! a 15 s preStop, a buffered log shipper DaemonSet forwarding the node's container logs
//! to a receiver on 127.0.0.1 outside the cluster. Lines written and lines received are
//! counted, for each way the node can be ended:
//!
//! - this service, CA's scale-in (NodeGroupDeleteNodes, direct mode): zero lost, asserted;
//! - this service, the ASG ending the instance through the hook: zero lost, asserted;
//! - CA's own drain with `--daemonset-eviction-for-occupied-nodes=true` (the default),
//!   every pod evicted at once, played by the suite (upstream CA cannot be built here:
//!   docs/e2e.md): measured;
//! - `kubectl drain --ignore-daemonsets` then the instance ends (as CA does with the flag
//!   false): measured.
//!
//! Needs root, containerd, runc and the CNI plugins (scripts/e2e/node-deps.sh installs
//! them) and the images (`E2E_IMAGES`, from scripts/e2e/images.py).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::AsyncReadExt;

mod support;

#[path = "e2e/checks.rs"]
mod checks;
#[path = "e2e/control_plane.rs"]
mod control_plane;
#[path = "e2e/kubelet.rs"]
mod kubelet;
#[path = "e2e/real_node.rs"]
mod real_node;
#[path = "e2e/rig.rs"]
mod rig;

use rig::{binaries, other_drainer, until, Rig, Setup, Workloads, SERIAL};

/// A receiver on 127.0.0.1: the bytes the shipper sent, in the order they came (the
/// shipper sends one batch at a time, so the batches join into its stream).
#[derive(Clone, Default)]
struct Receiver {
    stream: Arc<Mutex<Vec<u8>>>,
}

impl Receiver {
    async fn start() -> (Receiver, u16) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let r = Receiver::default();
        let stream = r.stream.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = l.accept().await {
                let stream = stream.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 65536];
                    // The shipper's nc waits for us to close: read until it has said nothing
                    // for half a second, or until it closes.
                    while let Ok(Ok(n)) =
                        tokio::time::timeout(Duration::from_millis(500), conn.read(&mut chunk))
                            .await
                    {
                        if n == 0 {
                            break;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    if std::env::var_os("E2E_TRACE").is_some() {
                        let text = String::from_utf8_lossy(&buf);
                        let last = text.lines().last().unwrap_or("").to_string();
                        eprintln!(
                            "e2e receiver: {} {} bytes, last: {last}",
                            chrono::Utc::now().format("%H:%M:%S%.3f"),
                            buf.len()
                        );
                    }
                    stream.lock().extend_from_slice(&buf);
                });
            }
        });
        (r, port)
    }

    /// The app's line numbers in the complete CRI log lines received
    /// (`<time> stdout F line N`); a line cut short by the end of the stream counts as
    /// not received.
    fn received(&self) -> BTreeSet<u64> {
        let bytes = self.stream.lock().clone();
        let text = String::from_utf8_lossy(&bytes);
        let complete = match text.rfind('\n') {
            Some(end) => &text[..end],
            None => "",
        };
        complete
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(4, ' ');
                let (_time, _stream, _tag) = (f.next()?, f.next()?, f.next()?);
                f.next()?.strip_prefix("line ")?.trim().parse().ok()
            })
            .collect()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Way {
    ServiceCaScaleIn,
    ServiceAsgHook,
    CaDefaultEvictAll,
    KubectlDrainIgnoreDaemonsets,
}

impl Way {
    fn label(self) -> &'static str {
        match self {
            Way::ServiceCaScaleIn => "lost logs: CA scale-in with this service (direct)",
            Way::ServiceAsgHook => "lost logs: ASG scale-in through this service's hook",
            Way::CaDefaultEvictAll => {
                "lost logs: CA's own drain, DaemonSet pods evicted with the app (default flag; played by the suite)"
            }
            Way::KubectlDrainIgnoreDaemonsets => {
                "lost logs: kubectl drain --ignore-daemonsets, then the instance ends (CA's flag false)"
            }
        }
    }
}

async fn lines_lost(way: Way) {
    let Some(bin) = binaries(way.label()) else {
        return;
    };
    let Some(images) = real_node::available() else {
        if std::env::var("E2E_REQUIRED").as_deref() == Ok("1") {
            panic!("{}: no real node here (root, containerd, runc, CNI plugins and E2E_IMAGES are needed: scripts/e2e/node-deps.sh)", way.label());
        }
        eprintln!(
            "{}: skipped (no real node: run scripts/e2e.sh)",
            way.label()
        );
        return;
    };
    let _one_at_a_time = SERIAL.lock().await;
    let (receiver, port) = Receiver::start().await;
    let setup = Setup {
        desired: 1,
        hooked: way == Way::ServiceAsgHook,
        real: Some(images),
        workloads: Workloads::Logging { port },
    };
    let mut rig = Rig::start_with(way.label(), &bin, setup).await;
    if way == Way::ServiceAsgHook {
        rig.run_lifecycle_loop();
    }
    let (node, iid) = rig
        .kubelet
        .nodes()
        .into_iter()
        .next()
        .expect("the real node");
    let shared = rig
        .real
        .as_ref()
        .and_then(|n| n.lock().as_ref().map(|n| n.shared.clone()))
        .expect("the real node");
    rig.report.step("the shipper ships the app's lines");
    until("the receiver to get the app's first lines", 60, || {
        let r = receiver.clone();
        async move { !r.received().is_empty() }
    })
    .await;
    rig.report.scale_in_begins(match way {
        Way::ServiceCaScaleIn => "CA: NodeGroupDeleteNodes of the node",
        Way::ServiceAsgHook => "the ASG scales in by one",
        Way::CaDefaultEvictAll => "evict every pod at once, then end the instance",
        Way::KubectlDrainIgnoreDaemonsets => {
            "kubectl drain --ignore-daemonsets, then end the instance"
        }
    });
    match way {
        Way::ServiceCaScaleIn => rig.ca_deletes(&[(node.clone(), iid.clone())]).await,
        Way::ServiceAsgHook => {
            assert_eq!(
                rig.cloud.external_scale_in("web", 1).unwrap(),
                vec![iid.clone()]
            );
        }
        Way::CaDefaultEvictAll => other_drainer(&rig.admin, &rig.cloud, &node, &iid, true).await,
        Way::KubectlDrainIgnoreDaemonsets => {
            let kubeconfig = rig.cp.kubeconfig(control_plane::Who::Admin).unwrap();
            let out = tokio::process::Command::new("kubectl")
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .args([
                    "drain",
                    &node,
                    "--ignore-daemonsets",
                    "--delete-emptydir-data",
                    "--timeout=120s",
                ])
                .output()
                .await
                .expect("kubectl");
            assert!(
                out.status.success(),
                "kubectl drain: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            use ca_asg_provider::cloud::Cloud as _;
            rig.cloud.terminate_instance(&iid, true).await.unwrap();
        }
    }
    rig.report.step("wait for the instance to end");
    rig.wait_ended(std::slice::from_ref(&iid), 180).await;
    // What was on its way when the machine went is lost; what was sent has landed.
    tokio::time::sleep(Duration::from_secs(1)).await;
    rig.report.step("count the lines");
    let written: BTreeSet<u64> = std::fs::read_to_string(shared.join("written"))
        .expect("the app's count file")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let received = receiver.received();
    let missing: Vec<u64> = written.difference(&received).copied().collect();
    let (lost, first_lost) = (missing.len() as u64, missing.first().copied());
    let written = written.len() as u64;
    eprintln!(
        "e2e: {}: {written} lines written, {} received, {lost} lost (first lost: {first_lost:?})",
        way.label(),
        received.len()
    );
    {
        let mut extra = rig.report.extra.lock();
        extra.insert("lines_written".into(), written.into());
        extra.insert("lines_lost".into(), lost.into());
    }
    if matches!(way, Way::ServiceCaScaleIn | Way::ServiceAsgHook) {
        rig.report
            .step("check: zero lines lost, DaemonSet pods last");
        assert_eq!(
            lost, 0,
            "{lost} of {written} lines never reached the receiver (first: line {first_lost:?})"
        );
        let audit = rig.cp.audit();
        checks::evictions_only(&audit, &[], &[]).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lines_lost_with_this_service_on_ca_scale_in() {
    lines_lost(Way::ServiceCaScaleIn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lines_lost_with_this_service_on_asg_scale_in() {
    lines_lost(Way::ServiceAsgHook).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lines_lost_with_cas_default_drain() {
    lines_lost(Way::CaDefaultEvictAll).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lines_lost_with_kubectl_drain_ignoring_daemonsets() {
    lines_lost(Way::KubectlDrainIgnoreDaemonsets).await;
}
