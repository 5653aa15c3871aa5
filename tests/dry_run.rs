//! `serve --dry-run`, wired as `serve` wires it (the read-only cloud and client, the
//! dry-run provider and engine, the lifecycle loop, gRPC): every decision CA or the
//! ASG asks for is described in an error, an Event and a metric, and neither the
//! memory cloud nor the in-memory API server sees a single write besides Events.

use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::MemoryGroup;
use ca_asg_provider::cloud::read_only::ReadOnly;
use ca_asg_provider::cloud::Cloud;
use ca_asg_provider::proto;
use ca_asg_provider::provider::{Provider, ProviderSettings};
use ca_asg_provider::scalein::stages::preview;
use ca_asg_provider::scalein::{self, DrainScaleIn, Engine, ScaleInSettings};
use ca_asg_provider::sim::{fixtures, SimCluster, SimOptions};
use k8s_openapi::api::core::v1::{Node, Pod};

mod support;
use support::eventually;
use support::world::{delete_nodes_message, fast_settings, nodes_of_cloud, serve_ca, timing};

fn dry_run_events(sim: &SimCluster, node: &str) -> Vec<String> {
    sim.list::<k8s_openapi::api::events::v1::Event>()
        .iter()
        .filter(|e| e["reason"] == "DryRunDrain" && e["regarding"]["name"] == node)
        .map(|e| e["note"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test]
async fn a_dry_run_decides_everything_and_changes_nothing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let sim = Arc::new(SimCluster::start(SimOptions::default()).await.unwrap());
    let cloud = ca_asg_provider::cloud::memory::MemoryCloud::new(
        vec![
            MemoryGroup::new("web", 0, 5, 3, "m5.large")
                .terminating_hook("ca-asg-provider-drain", 300),
            MemoryGroup::new("api", 0, 5, 1, "m5.large"),
        ],
        timing(),
    );
    sim.follow_cloud(cloud.clone());
    eventually("a Node per instance", 10, || sim.list::<Node>().len() == 4).await;
    let web = nodes_of_cloud(&cloud, "web");
    let (node, iid) = web[0].clone();
    sim.create(&fixtures::daemonset("logging", "fluentd", 0.2, false))
        .unwrap();
    sim.create(&fixtures::pod("shop", "app", &node, "app", 1.0))
        .unwrap();
    eventually("fluentd everywhere and app running", 10, || {
        sim.list::<Pod>()
            .iter()
            .filter(|p| p["status"]["conditions"][0]["status"] == "True")
            .count()
            == 5
    })
    .await;

    // Wired as `serve --dry-run` wires it.
    let guarded: Arc<dyn Cloud> = Arc::new(ReadOnly(Arc::new(cloud.clone())));
    let provider = Provider::new(
        guarded.clone(),
        ProviderSettings {
            selector: ca_asg_provider::world::named(&["web", "api"]),
            refresh_interval: Duration::from_millis(100),
            dry_run: true,
            ..ProviderSettings::default()
        },
    );
    provider.refresh_now().await.unwrap();
    let engine = Engine::new(
        preview::read_only_client(sim.client_as(support::rbac::ENGINE_USER)),
        guarded,
        Some(provider.clone()),
        ScaleInSettings {
            dry_run: true,
            create_hook: true,
            leader_election: true,
            ..fast_settings()
        },
    );
    provider.set_scale_in(Arc::new(DrainScaleIn(engine.clone())));
    engine.elect_leader();
    scalein::sources::hook_scan::spawn_loop(engine.clone(), provider.clone());
    let mut ca = serve_ca(&provider).await;
    eventually("the drain marks on Nodes are read", 10, || {
        provider.drain_state_known()
    })
    .await;

    // CA's scale-up: refused with what would have happened.
    let up = ca
        .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
            id: "web".into(),
            delta: 2,
        })
        .await
        .unwrap_err();
    assert_eq!(up.code(), tonic::Code::FailedPrecondition);
    assert!(
        up.message().contains("dry run")
            && up
                .message()
                .contains("would raise the target of web from 3 to 5"),
        "{}",
        up.message()
    );

    // CA's scale-down of the node with the app: the whole drain, in order.
    let down = ca
        .node_group_delete_nodes(delete_nodes_message("web", &[(node.clone(), iid.clone())]))
        .await
        .unwrap_err();
    assert_eq!(down.code(), tonic::Code::FailedPrecondition);
    let m = down.message();
    let app = m.find("shop/app").expect("the app is named");
    let fluentd = m.find("logging/fluentd").expect("fluentd is named");
    assert!(
        m.contains(&format!("would drain node {node}"))
            && m.contains("evict 1 workload pod(s)")
            && m.contains("1 DaemonSet pod(s) last")
            && m.contains("complete lifecycle action CONTINUE")
            && app < fluentd,
        "{m}"
    );
    let on_node = dry_run_events(&sim, &node);
    assert_eq!(on_node.len(), 1, "{on_node:?}");
    assert!(on_node[0].contains("shop/app"), "{on_node:?}");

    // The ASG ends an instance by itself: the lifecycle loop describes its drain once.
    let ended = cloud.external_scale_in("web", 1).unwrap();
    let other = ca_asg_provider::sim::node_name(&ended[0]);
    eventually("the ASG's termination is described", 10, || {
        !dry_run_events(&sim, &other).is_empty()
    })
    .await;
    // Several more polls: still described once, never heartbeated or completed.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(dry_run_events(&sim, &other).len(), 1);
    assert!(cloud.heartbeats().is_empty());
    assert!(cloud.completed_actions().is_empty());

    // Nothing changed: sizes, the Nodes, the pods.
    assert_eq!(cloud.desired("web"), Some(2), "only the ASG's own scale-in");
    assert_eq!(cloud.desired("api"), Some(1));
    let n = sim.get::<Node>("", &node).unwrap();
    assert!(n["spec"]["unschedulable"].is_null() || n["spec"]["unschedulable"] == false);
    assert!(n["spec"]["taints"].is_null(), "{}", n["spec"]);
    assert!(sim
        .list::<Pod>()
        .iter()
        .all(|p| p["metadata"]["deletionTimestamp"].is_null()));
    // AWS saw reads only (the one termination is the test's own, as the ASG).
    let calls = cloud.calls();
    for write in [
        "set_desired_capacity",
        "put_terminating_hook",
        "tag_group",
        "lifecycle_heartbeat",
        "complete_lifecycle_action",
    ] {
        assert_eq!(calls.get(write), None, "{write}: {calls:?}");
    }
    assert_eq!(calls.get("terminate_instance"), None, "{calls:?}");
    // The API server saw reads and Events only: no cordon, eviction or Lease.
    let writes: Vec<_> = sim
        .requests()
        .used_by(support::rbac::ENGINE_USER)
        .into_iter()
        .filter(|u| !matches!(u.verb.as_str(), "get" | "list" | "watch"))
        .collect();
    assert!(
        writes.iter().all(|u| u.resource == "events"),
        "writes besides Events: {writes:?}"
    );
    assert!(!writes.is_empty(), "the Events were written");
}

#[tokio::test]
async fn the_read_only_client_reads_and_watches_and_refuses_writes() {
    let sim = SimCluster::start(SimOptions::default()).await.unwrap();
    sim.create(&fixtures::pod("shop", "app", "n1", "app", 0.0))
        .unwrap();
    let client = preview::read_only_client(sim.client());
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), "shop");
    assert_eq!(pods.list(&Default::default()).await.unwrap().items.len(), 1);
    let e = pods
        .delete("app", &Default::default())
        .await
        .expect_err("a delete is refused");
    assert!(
        e.to_string()
            .contains("dry run: DELETE /api/v1/namespaces/shop/pods/app was not sent"),
        "{e}"
    );
    assert_eq!(sim.requests().get("delete", "pods"), 0);
    assert!(sim.get::<Pod>("shop", "app").is_some());
    use futures::StreamExt;
    let mut w = std::pin::pin!(kube::runtime::watcher(pods, Default::default()));
    let first = tokio::time::timeout(Duration::from_secs(5), w.next()).await;
    assert!(matches!(first, Ok(Some(Ok(_)))), "{first:?}");
}
