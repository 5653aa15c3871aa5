//! The real-CA harness (`tests/e2e/real_ca.rs`) against each binary of `E2E_CA_BINS`, on
//! the real control plane: CA, as its ServiceAccount with exactly the shipped RBAC,
//! reaches its loop, drives the service over externalgrpc (NodeGroups, Refresh,
//! NodeGroupForNode, ... seen on both sides), writes its status, serves its metrics, scales
//! in an empty node through NodeGroupDeleteNodes, and comes back after a kill -9.
//! Without `E2E_CA_BINS` (or the control plane's binaries) it prints one line and passes.

#[path = "e2e/control_plane.rs"]
mod control_plane;
#[path = "e2e/kubelet.rs"]
mod kubelet;
#[path = "e2e/real_ca.rs"]
mod real_ca;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryGroup, MemoryTiming};
use ca_asg_provider::cloud::GroupSelector;
use ca_asg_provider::provider::{Provider, ProviderSettings};
use ca_asg_provider::scalein::{DrainScaleIn, Engine, ScaleInSettings};
use ca_asg_provider::telemetry::metrics::Metrics;

use control_plane::{Binaries, ControlPlane, Who};
use kubelet::FakeKubelet;
use real_ca::{CaBinary, RealCa};

/// The service over `cloud` as it runs in a cluster (its drain engine as the
/// ServiceAccount), served on a free port with its own RPC counts.
async fn serve(cp: &ControlPlane, cloud: &MemoryCloud) -> (SocketAddr, &'static Metrics) {
    let provider = Provider::new(
        Arc::new(cloud.clone()),
        ProviderSettings {
            selector: GroupSelector {
                names: vec!["web".into()],
                tag_sets: vec![],
            },
            refresh_interval: Duration::from_millis(500),
            ..ProviderSettings::default()
        },
    );
    provider.refresh_now().await.expect("first refresh");
    let engine = Engine::new(
        cp.client(Who::Service)
            .await
            .expect("client as the service"),
        Arc::new(cloud.clone()),
        Some(provider.clone()),
        ScaleInSettings {
            eviction_retry: Duration::from_millis(500),
            lifecycle_poll_interval: Duration::from_millis(500),
            ..ScaleInSettings::default()
        },
    );
    provider.set_scale_in(Arc::new(DrainScaleIn(engine)));
    let counts: &'static Metrics = Box::leak(Box::new(Metrics::new()));
    let (l, addr) = ca_asg_provider::grpc::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    tokio::spawn(ca_asg_provider::grpc::serve_counted(
        l,
        provider.clone(),
        None,
        std::future::pending(),
        Default::default(),
        counts,
    ));
    let end = Instant::now() + Duration::from_secs(20);
    while !provider.drain_state_known() {
        assert!(
            Instant::now() < end,
            "the service never read the drain marks"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (addr, counts)
}

/// Calls of `method` the service answered (any code).
fn served(counts: &Metrics, method: &str) -> f64 {
    let text = counts.encode();
    let head = format!("ca_asg_provider_grpc_requests_total{{method=\"{method}\",");
    text.lines()
        .filter(|l| l.starts_with(&head))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One binary: a group "web" of 2 (min 1) with empty Ready nodes; CA must reach its loop,
/// call the service, and scale the group in to 1.
async fn smoke(bin: &CaBinary, cp: &ControlPlane) -> Vec<String> {
    let mut notes = Vec::new();
    let cloud = MemoryCloud::new(
        vec![MemoryGroup::new("web", 1, 4, 2, "m5.large")],
        MemoryTiming {
            launch_delay: Duration::from_millis(50),
            terminate_delay: Duration::from_millis(50),
            hook_delay: Duration::ZERO,
        },
    );
    let kubelet = FakeKubelet::start(cp.client(Who::Kubelet).await.unwrap(), cloud.clone());
    let end = Instant::now() + Duration::from_secs(30);
    while kubelet.nodes().len() != 2 {
        assert!(Instant::now() < end, "no Ready Node per instance");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (addr, counts) = serve(cp, &cloud).await;

    let mut ca = RealCa::start(
        bin,
        cp,
        &ca_asg_provider::config::ListenAddr::Tcp(addr),
        &[],
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let took = ca
        .first_loop(real_ca::FIRST_LOOP_SECS)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    notes.push(format!(
        "first loop {:.1} s after start",
        took.as_secs_f64()
    ));

    ca.wait("a second loop", 30, |ca| {
        ca.log_lines_matching("Starting main loop").len() >= 2
    })
    .await;
    for rpc in [
        "NodeGroups",
        "Refresh",
        "NodeGroupForNode",
        "NodeGroupTargetSize",
    ] {
        assert!(
            ca.rpc_calls(rpc) > 0 && served(counts, rpc) > 0.0,
            "{}",
            ca.failure(&format!(
                "{rpc}: {} calls in CA's log, {} served",
                ca.rpc_calls(rpc),
                served(counts, rpc)
            ))
        );
    }
    assert_eq!(
        ca.metric(
            "cluster_autoscaler_node_groups_count",
            &[("node_group_type", "autoscaled")]
        ),
        Some(1.0),
        "{}",
        ca.failure("CA's metrics: one autoscaled node group")
    );
    assert!(
        ca.metric("cluster_autoscaler_last_activity", &[("activity", "main")])
            .is_some(),
        "{}",
        ca.failure("CA's metrics: last_activity{activity=main}")
    );
    let status = ca.status_text().await.unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        status.contains("web"),
        "{}",
        ca.failure(&format!(
            "CA's status ConfigMap names no group web:\n{status}"
        ))
    );

    // Two empty nodes, min 1: CA deletes one through NodeGroupDeleteNodes.
    ca.wait("CA to scale web in to 1", 90, |_| {
        cloud.desired("web") == Some(1) && kubelet.nodes().len() == 1
    })
    .await;
    ca.wait("CA to count the scale-down", 30, |ca| {
        ca.metric_sum("cluster_autoscaler_scaled_down_nodes_total", &[])
            .unwrap_or(0.0)
            >= 1.0
    })
    .await;
    assert!(served(counts, "NodeGroupDeleteNodes") >= 1.0);
    notes.push(format!(
        "scaled in after {:.1} s",
        ca.uptime().as_secs_f64()
    ));

    ca.restart().unwrap_or_else(|e| panic!("{e:#}"));
    let again = ca
        .first_loop(real_ca::FIRST_LOOP_SECS)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    notes.push(format!(
        "after kill -9, first loop {:.1} s after start",
        again.as_secs_f64()
    ));

    ca.assert_log_clean();
    if !ca.dropped_flags().is_empty() {
        notes.push(format!("not passed: {}", ca.dropped_flags().join(" ")));
    }
    ca.stop();
    notes
}

#[test]
fn each_real_ca_reaches_its_loop_and_drives_the_service() {
    let bins = match real_ca::binaries_from_env() {
        Ok(b) => b,
        Err(why) => {
            eprintln!("real-CA tier skipped: {why}");
            return;
        }
    };
    let Some(k8s) = Binaries::from_env() else {
        eprintln!("real-CA tier skipped: no real control plane (E2E_K8S_BIN/E2E_ETCD unset; run scripts/e2e.sh)");
        return;
    };
    // Every binary runs, whatever the others did; the failures are named at the end.
    let mut failed = Vec::new();
    for bin in &bins {
        eprintln!(
            "e2e: {} (version from its {}), {} flags",
            bin.label(),
            bin.version_source,
            bin.flags.len()
        );
        // A control plane and a runtime per binary: one CA's taints and status never
        // meet the next, and the fake kubelet's tasks end with their API server.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .expect("a runtime");
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(run_one(bin, &k8s))
        }));
        rt.shutdown_timeout(Duration::from_secs(5));
        if ran.is_err() {
            failed.push(bin.label());
        }
    }
    assert!(
        failed.is_empty(),
        "the real-CA smoke test failed with: {} (each one's step and log are above)",
        failed.join(", ")
    );
}

async fn run_one(bin: &CaBinary, k8s: &Binaries) {
    let cp = ControlPlane::start(k8s)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let admin = cp.client(Who::Admin).await.unwrap();
    real_ca::apply_shipped_rbac_for_ca(&admin)
        .await
        .unwrap_or_else(|e| panic!("apply the shipped RBAC: {e:#}"));
    let notes = smoke(bin, &cp).await;
    eprintln!(
        "e2e: {} on Kubernetes {}: PASS ({})",
        bin.label(),
        k8s.version,
        notes.join("; ")
    );
}
