//! Every RPC through a real tonic client against the server on an ephemeral port,
//! backed by the in-memory cloud.

use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryGroup, MemoryTiming};
use ca_asg_provider::cloud::Cloud;
use ca_asg_provider::proto::cloud_provider_client::CloudProviderClient;
use ca_asg_provider::proto::{self, instance_status::InstanceState};
use ca_asg_provider::provider::{Bounds, Provider, ProviderSettings};
use tonic::transport::Channel;
use tonic::Code;

struct Harness {
    ca: CloudProviderClient<Channel>,
    cloud: MemoryCloud,
    provider: Arc<Provider>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn fast() -> MemoryTiming {
    MemoryTiming {
        launch_delay: Duration::from_millis(100),
        terminate_delay: Duration::from_millis(100),
        hook_delay: Duration::ZERO,
    }
}

fn groups() -> Vec<MemoryGroup> {
    vec![
        MemoryGroup::new("web", 1, 5, 2, "m5.large")
            .tag("k8s.io/cluster-autoscaler/enabled", "true"),
        MemoryGroup::new("gpu", 0, 3, 0, "g4dn.xlarge")
            .tag("k8s.io/cluster-autoscaler/enabled", "true"),
        MemoryGroup::new("unmanaged", 0, 3, 1, "m5.large"),
    ]
}

fn discovery() -> ProviderSettings {
    ProviderSettings {
        selector: ca_asg_provider::world::tagged(&["k8s.io/cluster-autoscaler/enabled"]),
        refresh_interval: Duration::from_millis(50),
        lookup_interval: Duration::from_millis(20),
        ..ProviderSettings::default()
    }
}

async fn start_with(cloud: MemoryCloud, settings: ProviderSettings, refresh: bool) -> Harness {
    let provider = Provider::new(Arc::new(cloud.clone()), settings);
    provider.start_background();
    let (listener, addr) = ca_asg_provider::grpc::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(ca_asg_provider::grpc::serve(
        listener,
        provider.clone(),
        None,
        async {
            let _ = rx.await;
        },
    ));
    let mut ca = CloudProviderClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    if refresh {
        ca.refresh(proto::RefreshRequest {}).await.unwrap();
    }
    Harness {
        ca,
        cloud,
        provider,
        _stop: tx,
    }
}

async fn start() -> Harness {
    start_with(MemoryCloud::new(groups(), fast()), discovery(), true).await
}

/// A node as CA sends it for an instance NodeGroupNodes listed (clusterstate's fake
/// node): name and providerID are both `aws:///zone/i-...`.
/// The gRPC server over a provider of [`groups`] on a free port, at most 4
/// connections open at once, each closed after `first_byte_timeout` without a byte.
async fn served_with_a_cap_of_4(first_byte_timeout: Duration) -> std::net::SocketAddr {
    let provider = Provider::new(Arc::new(MemoryCloud::new(groups(), fast())), discovery());
    provider.refresh_now().await.unwrap();
    let (listener, addr) = ca_asg_provider::grpc::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let limits = ca_asg_provider::grpc::ConnectionLimits {
        max_connections: 4,
        first_byte_timeout,
    };
    tokio::spawn(ca_asg_provider::grpc::serve_with(
        listener,
        provider,
        None,
        std::future::pending(),
        limits,
    ));
    addr
}

fn node(pid: &str) -> proto::ExternalGrpcNode {
    proto::ExternalGrpcNode {
        provider_id: pid.into(),
        name: pid.into(),
        ..Default::default()
    }
}

async fn target(h: &mut Harness, id: &str) -> i32 {
    h.ca.node_group_target_size(proto::NodeGroupTargetSizeRequest { id: id.into() })
        .await
        .unwrap()
        .into_inner()
        .target_size
}

async fn instances(h: &mut Harness, id: &str) -> Vec<proto::Instance> {
    h.ca.node_group_nodes(proto::NodeGroupNodesRequest { id: id.into() })
        .await
        .unwrap()
        .into_inner()
        .instances
}

/// CA's client.
type Ca = CloudProviderClient<Channel>;

/// CA's IncreaseSize of group `id` by `delta`.
async fn increase(ca: &mut Ca, id: &str, delta: i32) -> Result<(), tonic::Status> {
    let r = proto::NodeGroupIncreaseSizeRequest {
        id: id.into(),
        delta,
    };
    ca.node_group_increase_size(r).await.map(|_| ())
}

/// CA's DecreaseTargetSize of group `id` by `delta` (negative to decrease).
async fn decrease(ca: &mut Ca, id: &str, delta: i32) -> Result<(), tonic::Status> {
    let r = proto::NodeGroupDecreaseTargetSizeRequest {
        id: id.into(),
        delta,
    };
    ca.node_group_decrease_target_size(r).await.map(|_| ())
}

/// CA's DeleteNodes of `nodes` from `group`; a refusal as its message.
async fn delete(
    h: &mut Harness,
    group: &str,
    nodes: Vec<proto::ExternalGrpcNode>,
) -> Result<(), String> {
    h.ca.node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
        id: group.into(),
        nodes,
    })
    .await
    .map(|_| ())
    .map_err(|e| e.message().to_string())
}

/// Group `id` as CA's NodeGroups lists it.
async fn group_listed(h: &mut Harness, id: &str) -> proto::NodeGroup {
    h.ca.node_groups(proto::NodeGroupsRequest {})
        .await
        .unwrap()
        .into_inner()
        .node_groups
        .into_iter()
        .find(|g| g.id == id)
        .unwrap()
}

fn state(i: &proto::Instance) -> InstanceState {
    InstanceState::try_from(i.status.as_ref().unwrap().instance_state).unwrap()
}

async fn group_of(h: &mut Harness, pid: &str) -> String {
    h.ca.node_group_for_node(proto::NodeGroupForNodeRequest {
        node: Some(node(pid)),
    })
    .await
    .unwrap()
    .into_inner()
    .node_group
    .unwrap()
    .id
}

/// Waits for a condition, with a generous bound; never asserts a time.
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn node_groups_lists_discovered_groups_only() {
    let mut h = start().await;
    let gs =
        h.ca.node_groups(proto::NodeGroupsRequest {})
            .await
            .unwrap()
            .into_inner()
            .node_groups;
    let ids: Vec<_> = gs
        .iter()
        .map(|g| (g.id.as_str(), g.min_size, g.max_size))
        .collect();
    assert_eq!(ids, vec![("gpu", 0, 3), ("web", 1, 5)]);
    assert!(gs[1].debug.contains("web"));
}

#[tokio::test]
async fn static_bounds_are_kept_inside_the_asg() {
    let mut settings = discovery();
    settings.selector = ca_asg_provider::world::named(&["web", "missing"]);
    settings.static_bounds.insert(
        "web".into(),
        Bounds {
            min: Some(2),
            max: Some(50),
        },
    );
    let mut h = start_with(MemoryCloud::new(groups(), fast()), settings, true).await;
    let gs =
        h.ca.node_groups(proto::NodeGroupsRequest {})
            .await
            .unwrap()
            .into_inner()
            .node_groups;
    assert_eq!(gs.len(), 1);
    assert_eq!(
        (gs[0].min_size, gs[0].max_size),
        (2, 5),
        "max clamped to the ASG's 5"
    );
}

#[tokio::test]
async fn node_group_for_node_maps_provider_ids_and_bare_ids() {
    let mut h = start().await;
    let inst = instances(&mut h, "web").await;
    assert_eq!(inst.len(), 2);
    let pid = inst[0].id.clone();
    assert!(pid.starts_with("aws:///us-east-1"), "{pid}");
    assert_eq!(group_of(&mut h, &pid).await, "web");
    let bare = pid.rsplit('/').next().unwrap().to_string();
    assert_eq!(group_of(&mut h, &bare).await, "web");
    assert_eq!(group_of(&mut h, "gce://project/zone/vm").await, "");
    assert_eq!(group_of(&mut h, "").await, "");
    assert_eq!(
        group_of(&mut h, "aws:///us-east-1a/not-an-instance").await,
        ""
    );
    // The unmanaged group's instance: empty group, not an error.
    let other = h
        .cloud
        .instances()
        .into_iter()
        .find(|(g, _)| g == "unmanaged")
        .unwrap()
        .1;
    assert_eq!(group_of(&mut h, &other.provider_id()).await, "");
    let missing =
        h.ca.node_group_for_node(proto::NodeGroupForNodeRequest { node: None })
            .await
            .unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument);
    assert!(missing.message().contains("node"));
}

/// Issue 47: an instance in its group's warm pool is not the group's: its Node (a
/// stopped instance keeps it) maps to no group, as CA's own AWS provider answers, also
/// after the background lookup finds it in `Warmed:Stopped` (before, the lookup mapped
/// it back to the group, so CA counted a stopped node as the group's). Here the
/// process starts after the instance went to the pool; one that saw it leave maps it
/// to its former group for ten minutes first (provider::departed: CA's cached
/// instance list still names it).
#[tokio::test]
async fn a_node_whose_instance_is_in_the_warm_pool_maps_to_no_group() {
    let cloud = MemoryCloud::new(groups(), fast());
    let pooled = cloud
        .instances()
        .into_iter()
        .filter(|(g, _)| g == "web")
        .map(|(_, i)| i)
        .next()
        .unwrap();
    assert!(cloud.send_to_warm_pool(&pooled.id, "Warmed:Stopped"));
    let mut h = start_with(cloud, discovery(), true).await;
    let pid = pooled.provider_id();
    let before = h
        .cloud
        .calls()
        .get("locate_instances")
        .copied()
        .unwrap_or(0);
    assert_eq!(group_of(&mut h, &pid).await, "", "not in the group's list");
    let cloud = h.cloud.clone();
    eventually("the background lookup ran", || {
        let n = cloud.calls().get("locate_instances").copied().unwrap_or(0);
        async move { n > before }
    })
    .await;
    // The lookup's answer is applied right after the call returns.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        group_of(&mut h, &pid).await,
        "",
        "an instance in the warm pool was mapped to its group"
    );
}

#[tokio::test]
async fn a_fresh_instance_maps_to_its_group_before_the_next_refresh() {
    let mut settings = discovery();
    settings.refresh_interval = Duration::from_secs(3600);
    let mut h = start_with(MemoryCloud::new(groups(), fast()), settings, true).await;
    // Capacity added behind the provider's back (another CA replica, a person).
    h.cloud.set_desired_capacity("web", 3).await.unwrap();
    let fresh = h
        .cloud
        .instances()
        .into_iter()
        .filter(|(g, _)| g == "web")
        .map(|(_, i)| i)
        .next_back()
        .unwrap();
    let calls_before = h
        .cloud
        .calls()
        .get("locate_instances")
        .copied()
        .unwrap_or(0);
    // The first ask answers empty (unknown) and queues a background lookup.
    assert_eq!(
        group_of(&mut h, &fresh.provider_id()).await,
        "",
        "an instance the snapshot does not know yet is in no group for now"
    );
    let pid = fresh.provider_id();
    let ca = &mut h.ca;
    eventually("the fresh instance maps to web", || {
        let mut ca = ca.clone();
        let pid = pid.clone();
        async move {
            ca.node_group_for_node(proto::NodeGroupForNodeRequest {
                node: Some(node(&pid)),
            })
            .await
            .unwrap()
            .into_inner()
            .node_group
            .unwrap()
            .id == "web"
        }
    })
    .await;
    let calls = h
        .cloud
        .calls()
        .get("locate_instances")
        .copied()
        .unwrap_or(0)
        - calls_before;
    assert_eq!(calls, 1, "one batched lookup, not one per call");
    // The next Refresh reads AWS although the interval has not passed.
    let before = h.cloud.calls()["describe_groups"];
    h.ca.refresh(proto::RefreshRequest {}).await.unwrap();
    assert_eq!(h.cloud.calls()["describe_groups"], before + 1);
    assert_eq!(instances(&mut h, "web").await.len(), 3);
}

#[tokio::test]
async fn unknown_and_empty_group_ids_are_errors() {
    let mut h = start().await;
    let e =
        h.ca.node_group_target_size(proto::NodeGroupTargetSizeRequest { id: "nope".into() })
            .await
            .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("nope"));
    let e =
        h.ca.node_group_nodes(proto::NodeGroupNodesRequest { id: "".into() })
            .await
            .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("id"));
    let e = increase(&mut h.ca, "unmanaged", 1).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}

#[tokio::test]
async fn increase_size_validates_and_sets_desired_capacity() {
    let mut h = start().await;
    let e = increase(&mut h.ca, "web", 0).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = increase(&mut h.ca, "web", 4).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("2 + delta 4 = 6 > maxSize 5"),
        "{}",
        e.message()
    );
    assert_eq!(
        h.cloud.calls().get("set_desired_capacity"),
        None,
        "nothing written on a rejected call"
    );
    increase(&mut h.ca, "web", 3).await.unwrap();
    assert_eq!(target(&mut h, "web").await, 5);
    let inst = instances(&mut h, "web").await;
    assert_eq!(
        inst.len(),
        5,
        "2 instances + 3 placeholders until the refresh"
    );
    // After a refresh the real instances are there, launching or running.
    let cloud_count = h
        .cloud
        .instances()
        .iter()
        .filter(|(g, _)| g == "web")
        .count();
    assert_eq!(cloud_count, 5);
}

#[tokio::test]
async fn decrease_target_size_removes_only_unfulfilled_capacity() {
    let mut h = start().await;
    h.cloud
        .fail_launches("gpu", Some("InsufficientInstanceCapacity"));
    increase(&mut h.ca, "gpu", 2).await.unwrap();
    let e = decrease(&mut h.ca, "web", -1).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("existing"), "{}", e.message());
    let e = decrease(&mut h.ca, "gpu", 1).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    decrease(&mut h.ca, "gpu", -2).await.unwrap();
    assert_eq!(target(&mut h, "gpu").await, 0);
}

#[tokio::test]
async fn failed_launches_show_as_placeholders_with_out_of_resources() {
    let mut h = start().await;
    h.cloud
        .fail_launches("gpu", Some("InsufficientInstanceCapacity"));
    increase(&mut h.ca, "gpu", 2).await.unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    h.ca.refresh(proto::RefreshRequest {}).await.unwrap();
    let inst = instances(&mut h, "gpu").await;
    assert_eq!(inst.len(), 2);
    for i in &inst {
        assert!(i.id.contains("i-placeholder-gpu-"), "{}", i.id);
        assert_eq!(state(i), InstanceState::InstanceCreating);
        let e = i
            .status
            .as_ref()
            .unwrap()
            .error_info
            .as_ref()
            .expect("error info");
        assert_eq!(e.instance_error_class, 1, "OutOfResources");
        assert_eq!(e.error_code, "InsufficientInstanceCapacity");
    }
    // CA builds a fake node per placeholder (name = providerID = the id) and asks for
    // its group: it must be the group, or CA never counts it as unregistered.
    for i in &inst {
        assert_eq!(group_of(&mut h, &i.id).await, "gpu", "{}", i.id);
        let bare = i.id.rsplit('/').next().unwrap();
        assert_eq!(group_of(&mut h, bare).await, "gpu", "{bare}");
    }
    assert_eq!(
        group_of(&mut h, "aws:///us-east-1a/i-placeholder-nosuchgroup-0").await,
        "",
        "a placeholder of an unmanaged group maps to no group"
    );
    // CA may delete placeholders: that lowers desired capacity, nothing is terminated.
    let ph = inst[0].id.clone();
    h.ca.node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
        id: "gpu".into(),
        nodes: vec![node(&ph)],
    })
    .await
    .unwrap();
    assert_eq!(target(&mut h, "gpu").await, 1);
    assert_eq!(h.cloud.calls().get("terminate_instance"), None);
}

fn has_error(i: &proto::Instance) -> bool {
    i.status
        .as_ref()
        .and_then(|s| s.error_info.as_ref())
        .is_some()
}

/// Two replicas over one cloud. Replica A scales up, the launches fail; half a
/// minute later A scales up again (the ASG starts a new launch activity, not yet
/// failed) and then A goes away. Replica B, which never saw either increase, must
/// not attach the older failure to the fresh capacity (CA would back off the group
/// and delete the nodes it just asked for); before the fresh scale-up, B does
/// attach it, so the failure itself is not lost in a failover.
#[tokio::test]
async fn after_failover_an_older_failure_is_not_attached_to_a_fresh_scale_up() {
    let cloud = MemoryCloud::new(groups(), fast());
    let mut a = start_with(cloud.clone(), discovery(), true).await;
    cloud.fail_launches("gpu", Some("InsufficientInstanceCapacity"));
    increase(&mut a.ca, "gpu", 1).await.unwrap();
    // Let the ASG try (and fail), then let 30 s go by.
    assert_eq!(instances(&mut a, "gpu").await.len(), 1);
    cloud.age_activities("gpu", 30);

    let mut b = start_with(cloud.clone(), discovery(), true).await;
    let before = instances(&mut b, "gpu").await;
    assert_eq!(before.len(), 1);
    assert!(
        has_error(&before[0]),
        "a replica that did not scale up still reports the failure: {before:?}"
    );

    // The capacity is back: the fresh launch activity does not fail (the memory cloud,
    // like AWS, records a failed activity for every new launch while launches fail).
    cloud.fail_launches("gpu", None);
    increase(&mut a.ca, "gpu", 1).await.unwrap();
    drop(a);
    let mut c = start_with(cloud.clone(), discovery(), true).await;
    let after = instances(&mut c, "gpu").await;
    assert_eq!(after.len(), 2);
    assert!(
        after.iter().all(|i| !has_error(i)),
        "the failure from before the fresh scale-up is attached: {after:?}"
    );
    // The same for the replica that was already running, once it reads AWS again.
    tokio::time::sleep(Duration::from_millis(80)).await;
    b.ca.refresh(proto::RefreshRequest {}).await.unwrap();
    let after_b = instances(&mut b, "gpu").await;
    assert!(after_b.iter().all(|i| !has_error(i)), "{after_b:?}");
}

#[tokio::test]
async fn placeholders_without_a_failure_carry_no_error() {
    let mut h = start().await;
    increase(&mut h.ca, "gpu", 1).await.unwrap();
    let inst = instances(&mut h, "gpu").await;
    assert_eq!(inst.len(), 1);
    assert!(inst[0].status.as_ref().unwrap().error_info.is_none());
}

#[tokio::test]
async fn delete_nodes_validates_everything_before_touching_anything() {
    let mut h = start().await;
    let web: Vec<String> = instances(&mut h, "web")
        .await
        .into_iter()
        .map(|i| i.id)
        .collect();
    let other = h
        .cloud
        .instances()
        .into_iter()
        .find(|(g, _)| g == "unmanaged")
        .unwrap()
        .1
        .provider_id();
    // One good node and one from another group: rejected, nothing terminated.
    let e =
        h.ca.node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
            id: "web".into(),
            nodes: vec![node(&web[0]), node(&other)],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("not in node group web"),
        "{}",
        e.message()
    );
    // Both web nodes: 2 -> 0 would go below min 1.
    let e =
        h.ca.node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
            id: "web".into(),
            nodes: vec![node(&web[0]), node(&web[1])],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("below minSize 1"), "{}", e.message());
    let e =
        h.ca.node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
            id: "web".into(),
            nodes: vec![node("gce://x/y/z")],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("gce://x/y/z"));
    assert_eq!(h.cloud.calls().get("terminate_instance"), None);
}

#[tokio::test]
async fn delete_nodes_terminates_with_decrement_and_is_idempotent() {
    let mut h = start().await;
    increase(&mut h.ca, "web", 1).await.unwrap();
    h.ca.refresh(proto::RefreshRequest {}).await.unwrap();
    let web: Vec<String> = instances(&mut h, "web")
        .await
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(web.len(), 3);
    let victim = web[2].clone();
    // CA's fake node for an instance that never registered: name and providerID are
    // the bare instance id.
    let bare = victim.rsplit('/').next().unwrap().to_string();
    let fake = proto::ExternalGrpcNode {
        provider_id: bare.clone(),
        name: bare.clone(),
        ..Default::default()
    };
    h.ca.node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
        id: "web".into(),
        nodes: vec![fake.clone()],
    })
    .await
    .unwrap();
    assert_eq!(target(&mut h, "web").await, 2);
    let inst = instances(&mut h, "web").await;
    let v = inst.iter().find(|i| i.id == victim).unwrap();
    assert_eq!(state(v), InstanceState::InstanceDeleting);
    // CA re-sends: skipped, not an error, not terminated twice, target unchanged.
    h.ca.node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
        id: "web".into(),
        nodes: vec![fake],
    })
    .await
    .unwrap();
    assert_eq!(h.cloud.calls()["terminate_instance"], 1);
    assert_eq!(target(&mut h, "web").await, 2);
    // After a refresh AWS agrees.
    h.ca.refresh(proto::RefreshRequest {}).await.unwrap();
    assert_eq!(target(&mut h, "web").await, 2);
}

#[tokio::test]
async fn refresh_serves_the_last_state_when_aws_fails_and_fails_when_nothing_was_loaded() {
    // Never loaded: Unavailable.
    let cloud = MemoryCloud::new(groups(), fast());
    cloud.throttle("describe_groups", 1);
    let mut h = start_with(cloud, discovery(), false).await;
    let e = h.ca.refresh(proto::RefreshRequest {}).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    assert!(e.message().contains("throttled"), "{}", e.message());
    h.ca.refresh(proto::RefreshRequest {}).await.unwrap();
    assert_eq!(target(&mut h, "web").await, 2);
    // Loaded, then AWS throttles: Refresh succeeds on the last good state.
    tokio::time::sleep(Duration::from_millis(60)).await;
    h.cloud.throttle("describe_groups", 1);
    h.ca.refresh(proto::RefreshRequest {}).await.unwrap();
    assert_eq!(target(&mut h, "web").await, 2);
    assert_eq!(
        h.provider
            .stats
            .stale_serves
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

/// During an AWS outage Refresh backs off (1 s, doubling, up to refreshInterval)
/// instead of calling AWS on every CA loop, and serves the last state meanwhile.
#[tokio::test]
async fn a_failing_refresh_backs_off_instead_of_calling_aws_every_loop() {
    let mut settings = discovery();
    settings.refresh_interval = Duration::ZERO;
    let mut h = start_with(MemoryCloud::new(groups(), fast()), settings, true).await;
    let before = h.cloud.calls()["describe_groups"];
    h.cloud.throttle("describe_groups", 1000);
    for _ in 0..20 {
        h.ca.refresh(proto::RefreshRequest {}).await.unwrap();
        assert_eq!(target(&mut h, "web").await, 2, "the last state is served");
    }
    let during = h.cloud.calls()["describe_groups"] - before;
    assert!(
        during <= 2,
        "{during} DescribeAutoScalingGroups calls for 20 Refresh RPCs during an outage"
    );
    // AWS is back: the next Refresh after the back-off reads it again.
    h.cloud.throttle("describe_groups", 0);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    h.ca.refresh(proto::RefreshRequest {}).await.unwrap();
    assert!(h.provider.last_refresh_error().is_none());
}

#[tokio::test]
async fn refresh_reads_aws_at_most_once_per_interval() {
    let mut settings = discovery();
    settings.refresh_interval = Duration::from_secs(3600);
    let mut h = start_with(MemoryCloud::new(groups(), fast()), settings, true).await;
    for _ in 0..5 {
        h.ca.refresh(proto::RefreshRequest {}).await.unwrap();
    }
    assert_eq!(h.cloud.calls()["describe_groups"], 1);
    // Hot RPCs never reach the cloud.
    let before: u64 = h.cloud.calls().values().sum();
    for _ in 0..20 {
        let _ = target(&mut h, "web").await;
        let _ = instances(&mut h, "web").await;
        let _ = h.ca.node_groups(proto::NodeGroupsRequest {}).await.unwrap();
    }
    let after: u64 = h.cloud.calls().values().sum();
    assert_eq!(before, after);
}

#[tokio::test]
async fn gpu_label_pricing_and_cleanup() {
    let mut h = start().await;
    let l =
        h.ca.gpu_label(proto::GpuLabelRequest {})
            .await
            .unwrap()
            .into_inner()
            .label;
    assert_eq!(l, "k8s.amazonaws.com/accelerator");
    let e =
        h.ca.pricing_node_price(proto::PricingNodePriceRequest::default())
            .await
            .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    let e =
        h.ca.pricing_pod_price(proto::PricingPodPriceRequest::default())
            .await
            .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    h.ca.cleanup(proto::CleanupRequest {}).await.unwrap();
    // Nothing a later call needs was stopped.
    assert_eq!(target(&mut h, "web").await, 2);
    h.ca.refresh(proto::RefreshRequest {}).await.unwrap();
}

/// A hostile id (4 MiB, control characters) gets a short answer: the value is echoed
/// escaped and capped, so many such calls cannot blow up memory.
#[tokio::test]
async fn huge_and_hostile_values_are_echoed_capped_and_escaped() {
    let mut h = start().await;
    let id = format!("web\u{1b}[31m{}", "x".repeat((4 << 20) - 64));
    let e =
        h.ca.node_group_target_size(proto::NodeGroupTargetSizeRequest { id })
            .await
            .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(e.message().len() < 256, "{} bytes", e.message().len());
    assert!(e.message().contains("\\u{1b}"), "{}", e.message());
    assert!(!e.message().contains('\u{1b}'));
    let name = "n".repeat(1 << 20);
    let e =
        h.ca.node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
            id: "web".into(),
            nodes: vec![proto::ExternalGrpcNode {
                provider_id: format!("gce://{name}"),
                name,
                ..Default::default()
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().len() < 512, "{} bytes", e.message().len());
}

/// The front door: connections that never speak (a port scan, a TLS client that never
/// starts) are closed after the first-byte timeout, at most `max_connections` are
/// open at once, and CA is still served while such connections come and go.
#[tokio::test]
async fn silent_connections_are_closed_and_capped_without_starving_ca() {
    use tokio::io::AsyncReadExt;
    let addr = served_with_a_cap_of_4(Duration::from_millis(300)).await;
    // Ten silent connections: more than the server takes at once.
    let mut silent = Vec::new();
    for _ in 0..10 {
        silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // CA connects behind them and is served once the silent ones are closed.
    let mut ca = tokio::time::timeout(Duration::from_secs(20), async {
        let mut ca = CloudProviderClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        ca.node_groups(proto::NodeGroupsRequest {}).await.unwrap();
        ca
    })
    .await
    .expect("CA served while silent connections come and go");
    // Every silent connection is closed by the server (EOF or reset), none left open.
    // (The server may first send its HTTP/2 SETTINGS: read until the end.)
    for s in &mut silent {
        let mut buf = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut buf))
            .await
            .expect("the server closes a silent connection");
        assert!(buf.len() < 1024, "{} bytes to a silent client", buf.len());
        let _ = r;
    }
    // CA's own connection, which speaks, stays usable.
    ca.node_groups(proto::NodeGroupsRequest {}).await.unwrap();
}

/// A group whose template cannot be built (an instance type AWS does not know) answers
/// Unimplemented, which CA does not log: the failure is counted per group and reason
/// and warned about once, not every loop.
#[tokio::test]
async fn a_template_that_cannot_be_built_is_counted_and_told_once() {
    let cloud = MemoryCloud::new(
        vec![MemoryGroup::new("odd", 0, 3, 0, "x9.imaginary")
            .tag("k8s.io/cluster-autoscaler/enabled", "true")],
        fast(),
    );
    let mut h = start_with(cloud, discovery(), true).await;
    let count = || {
        ca_asg_provider::telemetry::metrics::metrics()
            .encode()
            .lines()
            .find(|l| {
                l.starts_with("ca_asg_provider_template_failures_total")
                    && l.contains("node_group=\"odd\"")
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = count();
    let mut why = String::new();
    for _ in 0..3 {
        let e =
            h.ca.node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest {
                id: "odd".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
        why = e.message().to_string();
    }
    assert_eq!(count() - before, 3);
    assert!(h.provider.template_failure_told("odd", &why), "{why}");
}

/// /metrics: build_info, per-group series labelled `node_group` like CA's own, and a
/// group that is no longer managed loses its series instead of keeping stale values.
#[tokio::test]
async fn metrics_name_groups_like_ca_and_drop_groups_that_went_away_and_healthz_names_a_wedged_loop(
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cloud = MemoryCloud::new(
        vec![
            MemoryGroup::new("metrics-stays", 0, 3, 1, "m5.large")
                .tag("k8s.io/cluster-autoscaler/enabled", "true"),
            MemoryGroup::new("metrics-goes", 0, 3, 1, "m5.large")
                .tag("k8s.io/cluster-autoscaler/enabled", "true"),
        ],
        fast(),
    );
    let provider = Provider::new(Arc::new(cloud.clone()), discovery());
    provider.refresh_now().await.unwrap();
    let liveness = Arc::new(ca_asg_provider::telemetry::liveness::Liveness::default());
    let (l, addr) = ca_asg_provider::telemetry::http::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    tokio::spawn(ca_asg_provider::telemetry::http::serve(
        l,
        provider.clone(),
        liveness.clone(),
        std::future::pending(),
    ));
    let get = |path: &'static str| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    };
    let scrape = || get("/metrics");
    // /healthz: ok while the loops turn; 503 naming a loop that stopped turning.
    let h = get("/healthz").await;
    assert!(h.starts_with("HTTP/1.1 200") && h.ends_with("ok\n"), "{h}");
    liveness.beat("drain loop", Duration::from_secs(3600));
    assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
    liveness.beat("leader election", Duration::from_millis(1));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let h = get("/healthz").await;
    assert!(h.starts_with("HTTP/1.1 503"), "{h}");
    assert!(
        h.contains("leader election has not turned") && !h.contains("drain loop"),
        "{h}"
    );
    liveness.done("leader election");
    assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
    let text = scrape().await;
    assert!(
        text.contains(&format!(
            "ca_asg_provider_build_info{{version=\"{}\",revision=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION"),
            ca_asg_provider::telemetry::REVISION
        )),
        "{text}"
    );
    assert!(text.contains("ca_asg_provider_node_group_max_size{node_group=\"metrics-goes\"} 3"));
    cloud.delete_group("metrics-goes");
    provider.refresh_now().await.unwrap();
    let text = scrape().await;
    assert!(text.contains("node_group=\"metrics-stays\""), "{text}");
    assert!(!text.contains("node_group=\"metrics-goes\""), "{text}");
}

/// CA's view of one group, computed as clusterstate does in 1.31 to 1.36
/// (updateIncorrectNodeGroupSizes, getNotRegisteredNodes, expectedToRegister): an
/// instance not registered counts as unregistered unless it is deleting or carries
/// an error; the size is "incorrect" when registered < target - unregistered.
/// Returns the delta fixNodeGroupSize would pass to DecreaseTargetSize, if any.
async fn ca_fix_node_group_size_delta(
    h: &mut Harness,
    group: &str,
    registered: &[String],
) -> Option<i32> {
    let target = target(h, group).await;
    let listed = instances(h, group).await;
    let registered_here = listed.iter().filter(|i| registered.contains(&i.id)).count() as i32;
    let unregistered = listed
        .iter()
        .filter(|i| !registered.contains(&i.id))
        .filter(|i| {
            let st = i.status.as_ref().unwrap();
            state(i) != InstanceState::InstanceDeleting && st.error_info.is_none()
        })
        .count() as i32;
    let incorrect = registered_here > target || registered_here < target - unregistered;
    let delta = registered_here - target;
    (incorrect && delta < 0).then_some(delta)
}

#[tokio::test]
async fn ca_clean_up_of_a_half_failed_scale_up_never_aborts_its_loop() {
    // One instance launches and never registers (slow bootstrap), the rest of the
    // scale-up fails for capacity. CA (fixNodeGroupSize, after maxNodeProvisionTime)
    // asks to remove everything not registered: an error there ends CA's RunOnce
    // every loop (static_autoscaler.go, 1.31 to 1.36).
    let slow = MemoryTiming {
        launch_delay: Duration::from_secs(3600),
        terminate_delay: Duration::from_millis(100),
        hook_delay: Duration::ZERO,
    };
    let cloud = MemoryCloud::new(groups(), slow);
    let mut h = start_with(cloud, discovery(), true).await;
    let registered: Vec<String> = instances(&mut h, "web")
        .await
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(registered.len(), 2);
    increase(&mut h.ca, "web", 1).await.unwrap();
    h.cloud
        .fail_launches("web", Some("InsufficientInstanceCapacity"));
    increase(&mut h.ca, "web", 2).await.unwrap();
    h.provider.refresh_now().await.unwrap();
    let pending: Vec<String> = h
        .cloud
        .instances()
        .into_iter()
        .filter(|(g, i)| g == "web" && i.state.is_pending())
        .map(|(_, i)| i.id)
        .collect();
    assert_eq!(
        pending.len(),
        1,
        "one instance launched and is still pending"
    );

    let delta = ca_fix_node_group_size_delta(&mut h, "web", &registered)
        .await
        .expect("CA sees an incorrect size: two placeholders carry errors");
    assert_eq!(delta, -3, "registered 2, target 5");
    // The answer CA's loop depends on: success, removing only what never launched.
    decrease(&mut h.ca, "web", delta).await.expect(
        "DecreaseTargetSize from fixNodeGroupSize must not fail when capacity is unfulfilled",
    );
    assert_eq!(target(&mut h, "web").await, 3);
    assert_eq!(h.cloud.desired("web"), Some(3));
    let live: Vec<String> = h
        .cloud
        .instances()
        .into_iter()
        .filter(|(g, i)| g == "web" && !i.state.is_leaving())
        .map(|(_, i)| i.id)
        .collect();
    assert_eq!(live.len(), 3, "no instance ended: {live:?}");
    assert!(live.contains(&pending[0]));
    // CA's next loop sees a consistent group: nothing more to fix.
    h.provider.refresh_now().await.unwrap();
    assert_eq!(
        ca_fix_node_group_size_delta(&mut h, "web", &registered).await,
        None
    );
    // And with nothing unfulfilled left, asking again is refused, naming the numbers
    // (CA then deletes the unregistered instance through DeleteNodes).
    let e = decrease(&mut h.ca, "web", -1).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message().contains("3 existing instances"),
        "{}",
        e.message()
    );
}

/// A mixed instances policy with InstanceRequirements (attribute-based selection) gets
/// a template, not Unimplemented: the first type that qualifies names it, the
/// requirements' minimums size it (a new node may be the smallest that qualifies).
#[tokio::test]
async fn attribute_based_groups_scale_from_zero() {
    use ca_asg_provider::cloud::InstanceRequirements;
    let cloud = MemoryCloud::new(
        vec![MemoryGroup::new("abs", 0, 5, 0, "m5.xlarge")
            .tag("k8s.io/cluster-autoscaler/enabled", "true")
            .instance_requirements(InstanceRequirements {
                vcpu_min: 3,
                memory_mib_min: 12 * 1024,
                excluded_types: vec!["r5*".into()],
                ..Default::default()
            })],
        fast(),
    );
    let mut h = start_with(cloud, discovery(), true).await;
    let info = h
        .ca
        .node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest { id: "abs".into() })
        .await
        .expect("a template for an attribute-based group")
        .into_inner();
    let node =
        <k8s_pb::api::core::v1::Node as prost::Message>::decode(&info.node_bytes[..]).unwrap();
    let labels = node.metadata.unwrap().labels;
    // The smallest that qualifies (the in-memory cloud orders by size, then name).
    assert_eq!(labels["node.kubernetes.io/instance-type"], "g4ad.xlarge");
    let capacity = node.status.unwrap().capacity;
    assert_eq!(capacity["cpu"].string.as_deref(), Some("3"));
    assert!(
        !capacity.contains_key("nvidia.com/gpu"),
        "GPUs the requirements do not guarantee are not promised"
    );
    assert!(!capacity.contains_key("amd.com/gpu"));
    assert!(!labels.contains_key("k8s.amazonaws.com/accelerator"));
    // The requirements' 12288 MiB minimum less 7.5 % for the VM (922 MiB).
    assert_eq!(capacity["memory"].string.as_deref(), Some("11366Mi"));
}

/// The template CA decodes (field 2, CA >= 1.35; field 1 is the same bytes): memory
/// below the nominal by the VM overhead (default and configured), the OS of a
/// Windows group, and each GPU maker's own resource.
#[tokio::test]
async fn templates_over_grpc_carry_vm_overhead_os_and_gpu_maker() {
    use ca_asg_provider::provider::template::TemplateOverrides;
    let en = |g: MemoryGroup| g.tag("k8s.io/cluster-autoscaler/enabled", "true");
    let cloud = MemoryCloud::new(
        vec![
            en(MemoryGroup::new("lin", 0, 3, 0, "m5.large")),
            en(MemoryGroup::new("tight", 0, 3, 0, "m5.large")),
            en(MemoryGroup::new("win", 0, 3, 0, "m5.large").user_data(
                "<powershell>\n& $env:ProgramFiles\\Amazon\\EKS\\Start-EKSBootstrap.ps1 -EKSClusterName c\n</powershell>\n",
            )),
            en(MemoryGroup::new("amd", 0, 3, 0, "g4ad.xlarge")),
            en(MemoryGroup::new("nv", 0, 3, 0, "g4dn.xlarge")),
        ],
        fast(),
    );
    let mut settings = discovery();
    settings.templates.insert(
        "tight".into(),
        TemplateOverrides {
            vm_memory_overhead_percent: Some(10.0),
            ..Default::default()
        },
    );
    let mut h = start_with(cloud, settings, true).await;
    let mut get = async |id: &str| {
        let info =
            h.ca.node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest {
                id: id.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("template of {id}: {e}"))
            .into_inner();
        assert_eq!(info.node_info, info.node_bytes, "fields 1 and 2 agree");
        let node =
            <k8s_pb::api::core::v1::Node as prost::Message>::decode(&info.node_bytes[..]).unwrap();
        let status = node.status.unwrap();
        let q = |m: &std::collections::BTreeMap<
            String,
            k8s_pb::apimachinery::pkg::api::resource::Quantity,
        >,
                 k: &str| { m.get(k).and_then(|v| v.string.clone()) };
        let mut out = std::collections::BTreeMap::new();
        for (k, v) in node.metadata.unwrap().labels {
            out.insert(format!("label {k}"), v);
        }
        for k in ["memory", "pods", "nvidia.com/gpu", "amd.com/gpu"] {
            if let Some(v) = q(&status.capacity, k) {
                out.insert(format!("capacity {k}"), v);
            }
            if let Some(v) = q(&status.allocatable, k) {
                out.insert(format!("allocatable {k}"), v);
            }
        }
        out
    };
    let lin = get("lin").await;
    // 8192 nominal less ceil(7.5 %) = 615; less 574 kube-reserved and 100 eviction.
    assert_eq!(lin["capacity memory"], "7577Mi");
    assert_eq!(lin["allocatable memory"], "6903Mi");
    assert_eq!(lin["label kubernetes.io/os"], "linux");
    let tight = get("tight").await;
    // 10 %: 820 MiB.
    assert_eq!(tight["capacity memory"], "7372Mi");
    assert_eq!(tight["allocatable memory"], "6698Mi");
    let win = get("win").await;
    assert_eq!(win["label kubernetes.io/os"], "windows");
    assert_eq!(
        win["capacity pods"], "9",
        "one ENI of 10 addresses, less its own"
    );
    let amd = get("amd").await;
    assert_eq!(
        amd.get("capacity amd.com/gpu").map(String::as_str),
        Some("1")
    );
    assert_eq!(
        amd.get("allocatable amd.com/gpu").map(String::as_str),
        Some("1")
    );
    assert!(!amd.contains_key("capacity nvidia.com/gpu"), "{amd:?}");
    assert_eq!(
        amd["label k8s.amazonaws.com/accelerator"],
        "amd-radeon-pro-v520"
    );
    let nv = get("nv").await;
    assert_eq!(
        nv.get("capacity nvidia.com/gpu").map(String::as_str),
        Some("1")
    );
    assert!(!nv.contains_key("capacity amd.com/gpu"));
}

/// CA's name and providerID for an instance it lists (FakeNode in clusterstate: both
/// are the instance id NodeGroupNodes gave, `aws:///zone/i-...`).
fn ca_fake_node(id: &str) -> proto::ExternalGrpcNode {
    proto::ExternalGrpcNode {
        provider_id: id.into(),
        name: id.into(),
        ..Default::default()
    }
}

/// CA's memory of one group between loops (clusterstate): the nodes it saw as
/// unregistered and the incorrect size it saw, each with the loop it was first seen.
#[derive(Default)]
struct CaGroupModel {
    unregistered: std::collections::HashSet<String>,
    incorrect: Option<(i32, i32)>,
}

/// One RunOnce of CA against one group, as far as it touches the provider, in the
/// order of static_autoscaler.go RunOnce (1.31.5 to 1.35.2); each call stands for a
/// loop MaxNodeProvisionTime after the previous one, so what was seen in the previous
/// loop and is seen again has lasted long enough.
/// - NodeGroupNodes once; instances not registered, not deleting and without error
///   info are fake "unregistered" nodes (clusterstate getNotRegisteredNodes); the
///   size is incorrect when registered < target - unregistered
///   (updateIncorrectNodeGroupSizes), kept only while the numbers stay the same.
/// - removeOldUnregisteredNodes: NodeGroupForNode per long-unregistered fake node
///   (name = providerID = the listed id), then TargetSize - MinSize <= 0 skips the
///   group with the warning "min size reached"; else DeleteNodes, whose error is only
///   a warning.
/// - deleteCreatedNodesWithErrors: DeleteNodes of the errored instances (warning on
///   error).
/// - fixNodeGroupSize: DecreaseTargetSize(registered - target) for a lasting incorrect
///   size; its error ends RunOnce ("Failed to fix node group sizes").
///
/// Returns Err(message) when CA's loop would abort, else what CA logged.
async fn ca_loop(
    h: &mut Harness,
    m: &mut CaGroupModel,
    group: &str,
    registered: &[String],
) -> Result<Vec<String>, String> {
    let mut logged = Vec::new();
    let listed = instances(h, group).await;
    let target_now = target(h, group).await;
    let reg_here = listed.iter().filter(|i| registered.contains(&i.id)).count() as i32;
    let errored: Vec<String> = listed
        .iter()
        .filter(|i| !registered.contains(&i.id))
        .filter(|i| {
            state(i) == InstanceState::InstanceCreating
                && i.status.as_ref().unwrap().error_info.is_some()
        })
        .map(|i| i.id.clone())
        .collect();
    let unregistered: Vec<String> = listed
        .iter()
        .filter(|i| !registered.contains(&i.id))
        .filter(|i| {
            state(i) != InstanceState::InstanceDeleting
                && i.status.as_ref().unwrap().error_info.is_none()
        })
        .map(|i| i.id.clone())
        .collect();
    let incorrect =
        (reg_here < target_now - unregistered.len() as i32).then_some((reg_here, target_now));
    let lasting_incorrect = incorrect.filter(|now| m.incorrect.as_ref() == Some(now));
    let long: Vec<String> = unregistered
        .iter()
        .filter(|u| m.unregistered.contains(*u))
        .cloned()
        .collect();
    m.unregistered = unregistered.iter().cloned().collect();
    m.incorrect = incorrect;

    if !long.is_empty() {
        for u in &long {
            let g =
                h.ca.node_group_for_node(proto::NodeGroupForNodeRequest {
                    node: Some(ca_fake_node(u)),
                })
                .await
                .unwrap()
                .into_inner()
                .node_group
                .unwrap();
            assert_eq!(g.id, group, "CA must find the group of {u}");
        }
        let min = group_listed(h, group).await.min_size;
        let size = target(h, group).await;
        if size - min <= 0 {
            logged.push(format!(
                "Node group {group} min size reached, skipping removal of {} unregistered nodes",
                long.len()
            ));
        } else {
            let nodes = long
                .iter()
                .take((size - min) as usize)
                .map(|u| ca_fake_node(u))
                .collect();
            logged.push(match delete(h, group, nodes).await {
                Ok(()) => format!("Removing unregistered nodes for node group {group}"),
                Err(e) => format!("Failed to remove unregistered nodes: {e}"),
            });
        }
    }
    if !errored.is_empty() {
        let nodes = errored.iter().map(|u| ca_fake_node(u)).collect();
        logged.push(match delete(h, group, nodes).await {
            Ok(()) => format!("Deleting from {group} node group because of create errors"),
            Err(e) => format!("Error while trying to delete nodes from {group}: {e}"),
        });
    }
    if let Some((current, expected)) = lasting_incorrect {
        let delta = current - expected;
        if delta < 0 {
            decrease(&mut h.ca, group, delta)
                .await
                .map_err(|e| format!("Failed to fix node group sizes: {}", e.message()))?;
            logged.push(format!("Decreasing size of {group} delta={delta}"));
        }
    }
    Ok(logged)
}

/// Issue 21 item 1: an ASG held at its MinSize whose relaunch fails for capacity must
/// not stop CA's loop (every version's fixNodeGroupSize error aborts RunOnce), and the
/// failure is still reported: in the group's debug string, a metric, and as error
/// info on capacity above the minimum that CA asks for.
#[tokio::test]
async fn a_group_held_at_its_asg_min_with_failing_relaunches_never_stops_cas_loop() {
    let cloud = MemoryCloud::new(
        vec![
            MemoryGroup::new("floor", 2, 5, 2, "m5.large")
                .tag("k8s.io/cluster-autoscaler/enabled", "true"),
            MemoryGroup::new("web", 1, 5, 2, "m5.large")
                .tag("k8s.io/cluster-autoscaler/enabled", "true"),
        ],
        fast(),
    );
    let mut h = start_with(cloud, discovery(), true).await;
    let before: Vec<String> = instances(&mut h, "floor")
        .await
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(before.len(), 2);
    // One instance dies (hardware, spot); the ASG's relaunch fails for capacity.
    h.cloud
        .fail_launches("floor", Some("InsufficientInstanceCapacity"));
    let dead = before[1].rsplit('/').next().unwrap().to_string();
    h.cloud.terminate_instance(&dead, false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    h.provider.refresh_now().await.unwrap();
    let registered = vec![before[0].clone()];
    assert_eq!(target(&mut h, "floor").await, 2);

    // CA loops, each MaxNodeProvisionTime after the last: none aborts, and from the
    // second on (the placeholder is long unregistered) CA only warns.
    let mut m = CaGroupModel::default();
    ca_loop(&mut h, &mut m, "floor", &registered)
        .await
        .expect("CA's RunOnce must go on");
    for _ in 0..3 {
        let logged = ca_loop(&mut h, &mut m, "floor", &registered)
            .await
            .expect("CA's RunOnce must go on");
        assert_eq!(
            logged,
            vec!["Node group floor min size reached, skipping removal of 1 unregistered nodes"]
        );
    }
    assert_eq!(
        h.cloud.desired("floor"),
        Some(2),
        "the ASG keeps its minimum"
    );
    // Other groups still scale in the same loop.
    increase(&mut h.ca, "web", 1).await.unwrap();

    // The failure is still told: the debug string and a gauge name it.
    let debug = group_listed(&mut h, "floor").await.debug;
    assert!(
        debug.contains("InsufficientInstanceCapacity") && debug.contains("below MinSize"),
        "{debug}"
    );
    {
        use ca_asg_provider::telemetry::http::Status;
        h.provider.before_scrape();
    }
    let gauge_after = ca_asg_provider::telemetry::metrics::metrics()
        .encode()
        .lines()
        .find(|l| {
            l.starts_with("ca_asg_provider_node_group_failed_below_min")
                && l.contains("node_group=\"floor\"")
        })
        .map(str::to_string);
    assert!(
        gauge_after.as_deref().is_some_and(|l| l.ends_with(" 1")),
        "{gauge_after:?}"
    );

    // Capacity CA asks for above the minimum still carries the error, so CA backs
    // off this group and its clean-up (DeleteNodes of the errored placeholder, then
    // fixNodeGroupSize) succeeds.
    increase(&mut h.ca, "floor", 1).await.unwrap();
    let listed = instances(&mut h, "floor").await;
    let errored: Vec<&proto::Instance> = listed
        .iter()
        .filter(|i| i.status.as_ref().unwrap().error_info.is_some())
        .collect();
    assert_eq!(errored.len(), 1, "{listed:?}");
    assert_eq!(
        errored[0]
            .status
            .as_ref()
            .unwrap()
            .error_info
            .as_ref()
            .unwrap()
            .instance_error_class,
        1
    );
    for _ in 0..3 {
        ca_loop(&mut h, &mut m, "floor", &registered)
            .await
            .expect("CA's RunOnce must go on after a failed scale-up above the minimum");
    }
    assert_eq!(target(&mut h, "floor").await, 2);
    assert_eq!(h.cloud.desired("floor"), Some(2));
    let logged = ca_loop(&mut h, &mut m, "floor", &registered)
        .await
        .expect("and on the loop after");
    assert_eq!(
        logged,
        vec!["Node group floor min size reached, skipping removal of 1 unregistered nodes"]
    );
}

/// Issue 21 item 5: AWS allows ASG names with spaces, `/`, `:` and up to 255
/// characters. Their placeholders must map back to their group when CA asks for the
/// group of its fake node (name = providerID = the listed id), and DeleteNodes on
/// them must lower the target, as for any other group.
#[tokio::test]
async fn placeholders_of_any_legal_asg_name_map_to_their_group_and_can_be_deleted() {
    let long = format!("pool:{}", "a/b c".repeat(50));
    assert_eq!(long.len(), 255);
    let names = ["team a/prod:spot", long.as_str(), "eks_ng.1"];
    let cloud = MemoryCloud::new(
        names
            .iter()
            .map(|n| {
                MemoryGroup::new(n, 0, 5, 0, "m5.large")
                    .tag("k8s.io/cluster-autoscaler/enabled", "true")
            })
            .collect(),
        fast(),
    );
    let mut h = start_with(cloud, discovery(), true).await;
    for name in names {
        h.cloud
            .fail_launches(name, Some("InsufficientInstanceCapacity"));
        increase(&mut h.ca, name, 2).await.unwrap();
        let listed = instances(&mut h, name).await;
        assert_eq!(listed.len(), 2, "{name}");
        for i in &listed {
            assert!(i.id.starts_with("aws:///"), "{}", i.id);
            let g =
                h.ca.node_group_for_node(proto::NodeGroupForNodeRequest {
                    node: Some(ca_fake_node(&i.id)),
                })
                .await
                .unwrap()
                .into_inner()
                .node_group
                .unwrap();
            assert_eq!(g.id, name, "{}", i.id);
        }
        h.ca.node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
            id: name.into(),
            nodes: vec![ca_fake_node(&listed[1].id)],
        })
        .await
        .unwrap_or_else(|e| panic!("DeleteNodes on a placeholder of {name:?}: {e:?}"));
        assert_eq!(target(&mut h, name).await, 1, "{name}");
        assert_eq!(h.cloud.desired(name), Some(1), "{name}");
        // A placeholder of this group is not one of another's.
        let other = if name == names[0] { names[2] } else { names[0] };
        let e =
            h.ca.node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
                id: other.into(),
                nodes: vec![ca_fake_node(&listed[0].id)],
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    }
    assert_eq!(h.cloud.calls().get("terminate_instance"), None);
}

/// Issue 21 item 9: the front door never locks CA out. With the connection cap full
/// of connections that sent no request (silent TCP, and idle HTTP/2 clients that sent
/// only their preface and SETTINGS), a fresh client is served at once: the oldest
/// idle connection is closed to make room. A connection that sent a request (CA's)
/// is never the one closed.
#[tokio::test]
async fn a_fresh_client_is_served_while_the_cap_is_full_of_idle_connections() {
    use tokio::io::AsyncReadExt;
    // Far longer than the test: only making room may close them.
    let addr = served_with_a_cap_of_4(Duration::from_secs(600)).await;
    let url = format!("http://{addr}");
    // CA, connected and speaking.
    let mut ca = CloudProviderClient::connect(url.clone()).await.unwrap();
    ca.node_groups(proto::NodeGroupsRequest {}).await.unwrap();
    // Fill the cap and more: silent TCP connections and idle HTTP/2 clients.
    let mut silent = Vec::new();
    for _ in 0..6 {
        silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    let mut idle = Vec::new();
    for _ in 0..2 {
        let ch = tonic::transport::Endpoint::from_shared(url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        idle.push(ch);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A fresh client is served well within CA's 5 s call timeout, more than once.
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(5), async {
            let mut fresh = CloudProviderClient::connect(url.clone()).await.unwrap();
            fresh
                .node_groups(proto::NodeGroupsRequest {})
                .await
                .unwrap();
        })
        .await
        .expect("a fresh client served while the cap is full of idle connections");
    }
    // The oldest idle connection was closed to make room (EOF after the server's
    // SETTINGS, long before the first-byte timeout).
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), silent[0].read_to_end(&mut buf))
        .await
        .expect("the oldest silent connection is closed to make room")
        .ok();
    // CA's own connection, which sent requests, is still served.
    tokio::time::timeout(
        Duration::from_secs(5),
        ca.node_groups(proto::NodeGroupsRequest {}),
    )
    .await
    .expect("CA's connection kept")
    .unwrap();
    drop(idle);
}

/// The `grpc_requests_total` counts and `grpc_request_duration_seconds` counts of a
/// metrics text, as (method, code) -> n and method -> n.
type RpcCounts = (
    std::collections::BTreeMap<(String, String), u64>,
    std::collections::BTreeMap<String, u64>,
);

fn rpc_counts(text: &str) -> RpcCounts {
    let label = |l: &str, k: &str| -> String {
        l.split(&format!("{k}=\""))
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .to_string()
    };
    let value = |l: &str| -> u64 { l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64 };
    let mut requests = std::collections::BTreeMap::new();
    let mut timed = std::collections::BTreeMap::new();
    for l in text.lines() {
        if l.starts_with("ca_asg_provider_grpc_requests_total{") {
            requests.insert((label(l, "method"), label(l, "code")), value(l));
        } else if l.starts_with("ca_asg_provider_grpc_request_duration_seconds_count{") {
            timed.insert(label(l, "method"), value(l));
        }
    }
    (requests, timed)
}

/// One layer around the generated server counts every RPC once, by its method and the
/// code the client got: the 15 RPCs (errors among them), a request tonic cannot
/// decode (through the lean NodeGroupForNode decoder) and a method that does not exist.
#[tokio::test]
async fn every_rpc_is_counted_once_by_method_and_the_code_the_client_got() {
    use ca_asg_provider::telemetry::metrics::{code_name, Metrics};
    let counts: &'static Metrics = Box::leak(Box::new(Metrics::new()));
    let provider = Provider::new(Arc::new(MemoryCloud::new(groups(), fast())), discovery());
    provider.refresh_now().await.unwrap();
    let (listener, addr) = ca_asg_provider::grpc::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    tokio::spawn(ca_asg_provider::grpc::serve_counted(
        listener,
        provider.clone(),
        None,
        std::future::pending(),
        ca_asg_provider::grpc::ConnectionLimits::default(),
        counts,
    ));
    let url = format!("http://{addr}");
    let mut ca = CloudProviderClient::connect(url.clone()).await.unwrap();
    fn got<T>(r: &Result<tonic::Response<T>, tonic::Status>) -> Code {
        r.as_ref().map_or_else(|s| s.code(), |_| Code::Ok)
    }
    let mut sent: Vec<(&str, Code)> = Vec::new();

    let r = ca.refresh(proto::RefreshRequest {}).await;
    sent.push(("Refresh", got(&r)));
    let r = ca.node_groups(proto::NodeGroupsRequest {}).await;
    sent.push(("NodeGroups", got(&r)));
    let web = ca
        .node_group_nodes(proto::NodeGroupNodesRequest { id: "web".into() })
        .await;
    sent.push(("NodeGroupNodes", got(&web)));
    let pid = web.unwrap().into_inner().instances[0].id.clone();
    let r = ca
        .node_group_for_node(proto::NodeGroupForNodeRequest {
            node: Some(node(&pid)),
        })
        .await;
    sent.push(("NodeGroupForNode", got(&r)));
    let r = ca
        .pricing_node_price(proto::PricingNodePriceRequest::default())
        .await;
    sent.push(("PricingNodePrice", got(&r)));
    let r = ca
        .pricing_pod_price(proto::PricingPodPriceRequest::default())
        .await;
    sent.push(("PricingPodPrice", got(&r)));
    let r = ca.gpu_label(proto::GpuLabelRequest {}).await;
    sent.push(("GPULabel", got(&r)));
    let r = ca
        .get_available_gpu_types(proto::GetAvailableGpuTypesRequest {})
        .await;
    sent.push(("GetAvailableGPUTypes", got(&r)));
    let r = ca
        .node_group_target_size(proto::NodeGroupTargetSizeRequest { id: "web".into() })
        .await;
    sent.push(("NodeGroupTargetSize", got(&r)));
    let r = ca
        .node_group_target_size(proto::NodeGroupTargetSizeRequest { id: "nope".into() })
        .await;
    sent.push(("NodeGroupTargetSize", got(&r)));
    let r = ca
        .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
            id: "gpu".into(),
            delta: 1,
        })
        .await;
    sent.push(("NodeGroupIncreaseSize", got(&r)));
    let r = ca
        .node_group_decrease_target_size(proto::NodeGroupDecreaseTargetSizeRequest {
            id: "web".into(),
            delta: 0,
        })
        .await;
    sent.push(("NodeGroupDecreaseTargetSize", got(&r)));
    let r = ca
        .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
            id: String::new(),
            nodes: vec![node(&pid)],
        })
        .await;
    sent.push(("NodeGroupDeleteNodes", got(&r)));
    let r = ca
        .node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest { id: "web".into() })
        .await;
    sent.push(("NodeGroupTemplateNodeInfo", got(&r)));
    let r = ca
        .node_group_get_options(proto::NodeGroupAutoscalingOptionsRequest {
            id: "web".into(),
            defaults: None,
        })
        .await;
    sent.push(("NodeGroupGetOptions", got(&r)));
    let r = ca.cleanup(proto::CleanupRequest {}).await;
    sent.push(("Cleanup", got(&r)));

    // Raw calls tonic answers itself: a NodeGroupForNode whose `node` (field 1, a
    // message) comes as a varint, and a method the service does not have.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Malformed {
        #[prost(uint64, tag = "1")]
        node: u64,
    }
    let mut raw = tonic::client::Grpc::new(
        tonic::transport::Endpoint::from_shared(url)
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let service = "/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider";
    for (path, label) in [
        (format!("{service}/NodeGroupForNode"), "NodeGroupForNode"),
        (format!("{service}/NoSuchRpc"), "unknown"),
    ] {
        raw.ready().await.unwrap();
        let r = raw
            .unary::<Malformed, Malformed, _>(
                tonic::Request::new(Malformed { node: 7 }),
                http::uri::PathAndQuery::try_from(path).unwrap(),
                tonic_prost::ProstCodec::default(),
            )
            .await;
        sent.push((label, got(&r)));
    }

    // The codes the client got are the ones this test means to see.
    let code_of = |m: &str| -> Vec<Code> {
        sent.iter()
            .filter(|(n, _)| *n == m)
            .map(|(_, c)| *c)
            .collect()
    };
    assert_eq!(code_of("PricingNodePrice"), [Code::Unimplemented]);
    assert_eq!(code_of("NodeGroupTargetSize"), [Code::Ok, Code::NotFound]);
    assert_eq!(code_of("NodeGroupDeleteNodes"), [Code::InvalidArgument]);
    assert_eq!(code_of("NodeGroupForNode"), [Code::Ok, Code::Internal]);
    assert_eq!(code_of("unknown"), [Code::Unimplemented]);
    for m in [
        "NodeGroups",
        "GPULabel",
        "NodeGroupTemplateNodeInfo",
        "Cleanup",
    ] {
        assert_eq!(code_of(m), [Code::Ok], "{m}");
    }

    let mut want_requests = std::collections::BTreeMap::new();
    let mut want_timed = std::collections::BTreeMap::new();
    for (m, c) in &sent {
        *want_requests
            .entry((m.to_string(), code_name(*c).to_string()))
            .or_insert(0u64) += 1;
        *want_timed.entry(m.to_string()).or_insert(0u64) += 1;
    }
    assert_eq!(want_timed.len(), 16, "the 15 RPCs and the unknown one");
    let (requests, timed) = rpc_counts(&counts.encode());
    assert_eq!(requests, want_requests);
    assert_eq!(timed, want_timed);
}

/// An instance that ended without a decrement (EC2 reclaimed it; the relaunch fails)
/// stays in CA's cached instance list for up to 2 minutes after its Node is gone, so CA
/// builds a fake unregistered node for it and asks for its group. Answered "no group",
/// CA counts the group one node short with nothing unregistered and, after
/// MaxNodeProvisionTime, asks DecreaseTargetSize below MinSize at a group held at its
/// minimum: refused, that error ended real CA 1.31.5's loop every loop (issue 43). It is
/// its former group; and DeleteNodes for it (CA cleaning up a long-unregistered node)
/// ends nothing and gives up no slot.
#[tokio::test]
async fn an_instance_gone_from_its_group_still_maps_to_it_and_deleting_it_ends_nothing() {
    let mut h = start().await;
    let gone = instances(&mut h, "web").await[0].id.clone();
    let iid = gone.rsplit('/').next().unwrap().to_string();
    h.cloud
        .fail_launches("web", Some("InsufficientInstanceCapacity"));
    h.cloud.terminate_instance(&iid, false).await.unwrap();
    eventually_refreshed(&mut h, |ids| !ids.iter().any(|i| i.contains(&iid))).await;
    assert_eq!(group_of(&mut h, &gone).await, "web", "{gone}");
    assert_eq!(group_of(&mut h, &iid).await, "web", "{iid}");
    let before = target(&mut h, "web").await;
    let terminates = h.cloud.calls().get("terminate_instance").copied();
    h.ca.node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
        id: "web".into(),
        nodes: vec![node(&gone)],
    })
    .await
    .expect("deleting a node already gone is no error");
    assert_eq!(target(&mut h, "web").await, before, "no slot given up");
    assert_eq!(
        h.cloud.calls().get("terminate_instance").copied(),
        terminates
    );
    // Another group's id is still refused: the memory is per group.
    let err =
        h.ca.node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
            id: "gpu".into(),
            nodes: vec![node(&gone)],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
}

/// Refreshes until the instance ids of `web` satisfy `done` (at most 5 s).
async fn eventually_refreshed(h: &mut Harness, done: impl Fn(&[String]) -> bool) {
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        h.ca.refresh(proto::RefreshRequest {}).await.unwrap();
        let ids: Vec<String> = instances(h, "web")
            .await
            .into_iter()
            .map(|i| i.id)
            .collect();
        if done(&ids) {
            return;
        }
    }
    panic!("web's instances never changed as expected");
}
