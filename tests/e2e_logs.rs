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

/// The rig's one node, the real one: its name, its instance, and the host directory
/// its pods can share with the test.
fn the_real_node(rig: &Rig) -> (String, String, std::path::PathBuf) {
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
    (node, iid, shared)
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
    let (node, iid, shared) = the_real_node(&rig);
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

/// Issue 72 on a real kubelet: two pods that no eviction can move (each a single
/// replica under `minAvailable: 1`), one with 6 s of grace and one with 2 s, that
/// ignore SIGTERM, and a DaemonSet pod; CA deletes the node, `workloadDeadline` 10 s
/// with `proceed`. The service deletes each at (deadline - its own grace), the longer
/// grace first; the kubelet sends each its SIGTERM and removes it no sooner than its
/// grace after the delete, so each gets all of it; the DaemonSet pod is evicted only
/// once both graces have run out (their containers have exited). Read from the audit
/// log and from marks the containers leave on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_pod_past_the_deadline_gets_its_own_grace_on_a_real_kubelet() {
    use ca_asg_provider::scalein::{DeadlinePolicy, ScaleInSettings};
    use serde_json::json;
    const SCENARIO: &str = "per-pod grace at the workload deadline, real kubelet";
    let Some(bin) = binaries(SCENARIO) else {
        return;
    };
    let Some(images) = real_node::available() else {
        if std::env::var("E2E_REQUIRED").as_deref() == Ok("1") {
            panic!("{SCENARIO}: no real node here (scripts/e2e/node-deps.sh)");
        }
        eprintln!("{SCENARIO}: skipped (no real node: run scripts/e2e.sh)");
        return;
    };
    let _one_at_a_time = SERIAL.lock().await;
    let setup = Setup {
        desired: 1,
        hooked: false,
        real: Some(images),
        workloads: Workloads::Own,
    };
    let more = rig::More {
        settings: ScaleInSettings {
            workload_deadline: Duration::from_secs(10),
            workload_deadline_policy: DeadlinePolicy::Proceed,
            ..rig::settings()
        },
        ..rig::More::default()
    };
    let mut rig = Rig::start_more(SCENARIO, &bin, setup, more).await;
    let (node, iid, shared) = the_real_node(&rig);
    // Each container leaves a mark on SIGTERM and goes on: the kubelet ends it at its
    // grace.
    let spec = |name: &str, grace: u32| {
        json!({
            "nodeSelector": {"e2e/real": "true"},
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": grace,
            "volumes": [{"name": "marks", "hostPath": {"path": shared.display().to_string()}}],
            "containers": [{"name": "main", "image": "e2e.local/busybox:1", "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c"],
                "args": [format!("trap 'touch /marks/{name}.term' TERM\nwhile :; do sleep 0.1; done\n")],
                "volumeMounts": [{"name": "marks", "mountPath": "/marks"}]}],
        })
    };
    rig.report
        .step("two single replicas under minAvailable: 1 (grace 6 s and 2 s), a DaemonSet");
    for (name, grace) in [("long", 6), ("short", 2)] {
        rig::create(
            &rig.admin,
            Some("shop"),
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}}, "spec": spec(name, grace)}}
            }),
        )
        .await;
        rig::create(&rig.admin, Some("shop"), json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name}}}
        }))
        .await;
    }
    rig::create(
        &rig.admin,
        Some("logging"),
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}}, "spec": spec("agent", 2)}}
        }),
    )
    .await;
    let admin = rig.admin.clone();
    until("the three pods Ready and both budgets computed", 90, || {
        let admin = admin.clone();
        async move {
            let pdbs: kube::Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
                kube::Api::namespaced(admin.clone(), "shop");
            let mut computed = true;
            for name in ["long", "short"] {
                computed &= pdbs
                    .get(name)
                    .await
                    .ok()
                    .and_then(|b| b.status)
                    .is_some_and(|s| s.expected_pods == 1 && s.current_healthy == 1);
            }
            computed && rig::ready_pods(&admin).await.len() == 3
        }
    })
    .await;
    let pods = rig::ready_pods(&rig.admin).await;
    let named = |prefix: &str| {
        pods.keys()
            .find(|p| p.starts_with(prefix))
            .cloned()
            .unwrap_or_else(|| panic!("no pod {prefix}*: {pods:?}"))
    };
    let (long, short, agent) = (
        named("shop/long-"),
        named("shop/short-"),
        named("logging/agent-"),
    );

    rig.report
        .scale_in_begins("CA: NodeGroupDeleteNodes of the node (workloadDeadline 10 s, proceed)");
    rig.ca_deletes(&[(node.clone(), iid.clone())]).await;
    rig.report.step("wait for the instance to end");
    rig.wait_ended(std::slice::from_ref(&iid), 120).await;

    let audit = rig.cp.audit();
    let at = |pod: &str, by_service: bool, verb: &str, sub: &str| {
        audit
            .iter()
            .filter(|e| e.target() == pod && e.is(verb, "pods", sub))
            .filter(|e| (e.user.username == control_plane::SERVICE_USER) == by_service)
            .filter_map(|e| e.stage_timestamp)
            .min()
            .unwrap_or_else(|| panic!("no {verb} {sub} of {pod} (by the service: {by_service})"))
    };
    rig.report
        .step("check: the longer grace deleted first, each removed no sooner than its grace");
    let (long_deleted, short_deleted) = (
        at(&long, true, "delete", ""),
        at(&short, true, "delete", ""),
    );
    assert!(
        long_deleted < short_deleted,
        "the pod with 6 s of grace was deleted at {long_deleted}, not before the one with 2 s at {short_deleted}"
    );
    let mut gone = Vec::new();
    for (pod, deleted, grace) in [(&long, long_deleted, 6.0), (&short, short_deleted, 2.0)] {
        // The kubelet's own removal, once the container ended.
        let removed = at(pod, false, "delete", "");
        let had = (removed - deleted).num_milliseconds() as f64 / 1000.0;
        assert!(
            had >= grace - 0.5,
            "{pod}: deleted at {deleted}, removed by the kubelet {had} s later: less than its {grace} s of grace"
        );
        gone.push(removed);
        eprintln!("e2e: {pod}: deleted by the service at {deleted}, removed {had:.1} s later (grace {grace} s)");
    }
    rig.report.step("check: each got its SIGTERM");
    for name in ["long", "short"] {
        assert!(
            shared.join(format!("{name}.term")).exists(),
            "{name}: no SIGTERM mark"
        );
    }
    rig.report
        .step("check: the DaemonSet pod evicted only once both graces had run out");
    // The kubelet kills a container at its delete plus its grace at the latest, and then
    // marks the pod Failed (the drain's cue: its containers have exited); it removes
    // the object a little later still, which the drain need not wait for.
    let agent_evicted = at(&agent, true, "create", "eviction");
    for (pod, deleted, grace) in [(&long, long_deleted, 6), (&short, short_deleted, 2)] {
        let killed_by = deleted + chrono::Duration::seconds(grace);
        assert!(
            agent_evicted >= killed_by,
            "the DaemonSet pod was evicted at {agent_evicted}, before {pod}'s grace ran out at {killed_by}"
        );
    }
    let last_gone = gone.into_iter().max().unwrap();
    eprintln!(
        "e2e: the DaemonSet pod evicted at {agent_evicted}; the last workload pod's object removed at {last_gone}"
    );
    {
        let first = long_deleted.min(short_deleted);
        let mut extra = rig.report.extra.lock();
        extra.insert(
            "grace_gap_secs".into(),
            ((short_deleted - first).num_milliseconds() as f64 / 1000.0).into(),
        );
    }
}
