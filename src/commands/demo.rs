//! `ca-asg-provider demo`: the real gRPC server on the in-memory cloud, driven over
//! gRPC the way cluster-autoscaler drives it. Finishes by itself in well under a
//! minute.

use std::time::Duration;

use crate::clock::Instant;

use anyhow::Context;
use prost::Message;
use tonic::transport::Channel;

use crate::cloud::memory::{MemoryGroup, MemoryTiming};
use crate::proto::cloud_provider_client::CloudProviderClient;
use crate::proto::{self, instance_status::InstanceState};
use crate::provider::options::AutoscalingOptions;
use crate::scalein::ScaleInSettings;
use crate::sim::world::Ground;
use crate::sim::{fixtures, SimCluster};
use crate::world::{Service, ServiceBuilder};

#[derive(Debug, clap::Args, Clone)]
pub struct DemoArgs {
    /// Seconds an in-memory instance takes to launch.
    #[arg(long, default_value_t = 2.0)]
    pub launch_seconds: f64,
}

type Client = CloudProviderClient<Channel>;

/// The in-memory ASGs the demo (and the load generator) start with.
pub fn demo_groups() -> Vec<MemoryGroup> {
    vec![
        MemoryGroup::new("demo-general", 1, 10, 2, "m5.large")
            .tag("k8s.io/cluster-autoscaler/enabled", "true")
            .tag("k8s.io/cluster-autoscaler/demo", "owned"),
        MemoryGroup::new("demo-gpu", 0, 4, 0, "g4dn.xlarge")
            .zones(&["us-east-1b"])
            .tag("k8s.io/cluster-autoscaler/enabled", "true")
            .tag("k8s.io/cluster-autoscaler/node-template/label/workload", "ml")
            .tag(
                "k8s.io/cluster-autoscaler/node-template/autoscaling-options/scaledownunneededtime",
                "30m",
            )
            .tag("k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu", "true:NoSchedule")
            .user_data(
                "#!/bin/bash\n/etc/eks/bootstrap.sh demo --kubelet-extra-args '--node-labels=team=research,gpu=t4 --register-with-taints=dedicated=ml:NoSchedule'\n",
            ),
        MemoryGroup::new("demo-arm", 0, 5, 0, "m6g.large")
            .tag("k8s.io/cluster-autoscaler/enabled", "true")
            .terminating_hook("ca-asg-provider-drain", 300),
    ]
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let timing = MemoryTiming {
        launch_delay: Duration::from_secs_f64(args.launch_seconds.clamp(0.1, 20.0)),
        ..MemoryTiming::default()
    };
    // The in-memory API server and cloud: a Node registers for every running instance.
    let ground = Ground::builder()
        .groups(demo_groups())
        .timing(timing)
        .nodes_within(None)
        .build()
        .await?;
    let (sim, cloud) = (ground.sim.clone(), ground.cloud.clone());
    let service = ServiceBuilder::on(&ground)
        .tagged("k8s.io/cluster-autoscaler/enabled")
        .refresh_interval(Duration::from_millis(500))
        .background(true)
        .scale_in(ScaleInSettings {
            eviction_retry: Duration::from_millis(500),
            volume_deadline: Duration::from_secs(1),
            ..ScaleInSettings::default()
        })
        .build()
        .await?;
    let door = service
        .ca_over_tcp()
        .await
        .context("connecting to the demo server")?;
    // The provider stays with its server and background loop until the end.
    let Service { provider, engine } = service;
    let addr = door.addr;
    println!("== ca-asg-provider demo: the real gRPC server on an in-memory cloud, at {addr}");
    println!("   (cluster-autoscaler would run with --cloud-provider=externalgrpc and address: {addr})\n");

    let mut ca = door.ca.clone();
    let ca = &mut ca;
    scene_groups(ca).await?;
    scene_template(ca).await?;
    scene_options(ca).await?;
    // Size changes wait until the groups (CA's Refresh above) and the drains recorded
    // on Nodes have been read once (CA would retry its call); the demo waits for that
    // read instead, so that a slow machine does not make its first IncreaseSize an
    // error.
    let known_by = Instant::now() + Duration::from_secs(30);
    while !provider.drain_state_known() && Instant::now() < known_by {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    scene_scale_up(ca).await?;
    let victim = scene_workloads(ca, &sim).await?;
    scene_delete(ca, &sim, &engine, &victim).await?;
    scene_group_for_node(ca, &victim.0).await?;
    scene_failed_launch(ca, &cloud).await?;
    scene_refused(ca).await?;

    door.close().await;
    println!(
        "\n== demo finished in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    println!("   What you saw: CA's calls answered by the real gRPC server; the node drained");
    println!("   with its DaemonSet pods last and its PodDisruptionBudget honoured, then ended.");
    println!("   Next: run it against your cluster (docs/quickstart-eks.md), or see what each");
    println!("   setting does (docs/configuration.md).");
    Ok(())
}

/// CA refreshes and lists the groups the tag finds.
async fn scene_groups(ca: &mut Client) -> anyhow::Result<()> {
    step("Refresh, then NodeGroups (groups found by tag k8s.io/cluster-autoscaler/enabled)");
    ca.refresh(proto::RefreshRequest {}).await?;
    let groups = ca
        .node_groups(proto::NodeGroupsRequest {})
        .await?
        .into_inner()
        .node_groups;
    for g in &groups {
        println!(
            "   {:<14} min {:>2}  max {:>2}   {}",
            g.id, g.min_size, g.max_size, g.debug
        );
    }
    Ok(())
}

/// The scale-from-zero template of the GPU group, in both of the protocol's fields.
async fn scene_template(ca: &mut Client) -> anyhow::Result<()> {
    step("NodeGroupTemplateNodeInfo demo-gpu (scale-from-zero template)");
    let t = ca
        .node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest {
            id: "demo-gpu".into(),
        })
        .await?
        .into_inner();
    let node = k8s_pb::api::core::v1::Node::decode(t.node_bytes.as_ref())?;
    println!(
        "   {} bytes, same Node in field 1 (CA <= 1.34) and field 2 (CA >= 1.35): {}",
        t.node_bytes.len(),
        t.node_info == t.node_bytes
    );
    print!("{}", crate::provider::template::describe(&node));
    Ok(())
}

/// The groups' autoscaling options: CA's defaults, and one group's tag.
async fn scene_options(ca: &mut Client) -> anyhow::Result<()> {
    step(
        "NodeGroupGetOptions: demo-general has no option tags, demo-gpu sets scaleDownUnneededTime",
    );
    for id in ["demo-general", "demo-gpu"] {
        let r = ca
            .node_group_get_options(proto::NodeGroupAutoscalingOptionsRequest {
                id: id.into(),
                defaults: Some(crate::grpc::options::to_proto(
                    &AutoscalingOptions::ca_defaults(),
                )),
            })
            .await;
        match r {
            Ok(o) => {
                let o = o
                    .into_inner()
                    .node_group_autoscaling_options
                    .unwrap_or_default();
                // The same time in both of the protocol's fields (CA before 1.33 reads
                // the first, a meta.v1 Duration in ns; later ones the second).
                let unneeded = o
                    .scale_down_unneeded_duration
                    .map(|d| Duration::from_secs(d.seconds.max(0) as u64))
                    .or_else(|| {
                        o.scale_down_unneeded_time
                            .map(|d| Duration::from_nanos(d.duration.max(0) as u64))
                    });
                println!(
                    "   {id}: scale-down utilization threshold {}, unneeded time {}",
                    o.scale_down_utilization_threshold,
                    unneeded.map_or_else(
                        || "CA's default".to_string(),
                        crate::duration::format_duration
                    ),
                );
            }
            Err(s) if s.code() == tonic::Code::Unimplemented => {
                println!(
                    "   {id}: Unimplemented ({}): CA keeps its own defaults",
                    s.message()
                );
            }
            Err(s) => return Err(anyhow::anyhow!("NodeGroupGetOptions {id}: {s}")),
        }
    }
    Ok(())
}

/// CA grows a group by two; the instances launch and register.
async fn scene_scale_up(ca: &mut Client) -> anyhow::Result<()> {
    step("NodeGroupIncreaseSize demo-general +2, then watch instances launch");
    show_target(ca, "demo-general").await?;
    ca.node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
        id: "demo-general".into(),
        delta: 2,
    })
    .await?;
    show_target(ca, "demo-general").await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut shown = String::new();
    loop {
        ca.refresh(proto::RefreshRequest {}).await?;
        // Each state of the group once, as it changes.
        let (line, (running, creating, _)) = nodes_line(ca, "demo-general").await?;
        if line != shown {
            println!("{line}");
            shown = line;
        }
        if (running == 4 && creating == 0) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    Ok(())
}

/// A web app with its budget and a log shipper on the new nodes; returns the node CA will remove (its providerID, instance and Node name).
async fn scene_workloads(
    ca: &mut Client,
    sim: &SimCluster,
) -> anyhow::Result<(String, String, String)> {
    step("Workloads on the new nodes: a web app (preStop 1.5 s), a PDB, a fluentd DaemonSet");
    sim.create(&fixtures::replicaset("shop", "web", 4, 1.5))?;
    sim.create(&fixtures::pdb("shop", "web", 1))?;
    sim.create(&fixtures::daemonset("logging", "fluentd", 0.5, false))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && ready_pods(sim) < 4 + 4 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let nodes = ca
        .node_group_nodes(proto::NodeGroupNodesRequest {
            id: "demo-general".into(),
        })
        .await?
        .into_inner()
        .instances;
    let victim = nodes.last().map(|i| i.id.clone()).unwrap_or_default();
    let victim_id = crate::provider::provider_id::instance_id(&victim)
        .unwrap_or_default()
        .to_string();
    let node_name = crate::sim::node_name(&victim_id);
    for p in sim.list::<k8s_openapi::api::core::v1::Pod>() {
        if p["spec"]["nodeName"] == node_name.as_str() {
            println!(
                "   on {node_name}: {}/{}",
                p["metadata"]["namespace"].as_str().unwrap_or(""),
                p["metadata"]["name"].as_str().unwrap_or("")
            );
        }
    }
    Ok((victim, victim_id, node_name))
}

/// CA's DeleteNodes of that node: answered at once, the drain behind it, told as the API server saw it.
async fn scene_delete(
    ca: &mut Client,
    sim: &SimCluster,
    engine: &crate::scalein::Engine,
    (victim, victim_id, node_name): &(String, String, String),
) -> anyhow::Result<()> {
    step("NodeGroupDeleteNodes demo-general: one node (returns at once; the drain runs behind it)");
    println!("   deleting {victim} (node {node_name})");
    let called = Instant::now();
    ca.node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
        id: "demo-general".into(),
        nodes: vec![proto::ExternalGrpcNode {
            provider_id: victim.to_string(),
            name: node_name.to_string(),
            ..Default::default()
        }],
    })
    .await?;
    println!(
        "   DeleteNodes answered in {:.0} ms",
        called.elapsed().as_secs_f64() * 1000.0
    );
    show_target(ca, "demo-general").await?;
    show_nodes(ca, "demo-general").await?;
    let outcome = engine.wait_for(victim_id).await;
    println!("   the drain {}", told(outcome.as_ref()));
    println!("   timeline on {node_name} (from the API server's log):");
    let audit = sim.audit();
    let t0 = audit
        .iter()
        .find(|a| a.kind == "Node" && a.name == *node_name && a.verb == "patch")
        .map(|a| a.at)
        .unwrap_or_else(Instant::now);
    // Writes of the same kind at the same hundredth of a second are one line.
    let mut lines: Vec<(String, usize)> = Vec::new();
    for a in audit.iter().filter(|a| a.at >= t0) {
        let pod =
            a.kind == "Pod" && matches!(a.verb.as_str(), "evicted" | "eviction-denied" | "removed");
        let node = a.kind == "Node"
            && a.name == *node_name
            && matches!(a.verb.as_str(), "removed" | "patch" | "patch status");
        if pod || node {
            let what = match a.verb.as_str() {
                "patch status" => "conditions",
                v => v,
            };
            let line = format!(
                "   +{:>6.2}s  {:<16} {} {}/{}",
                a.at.duration_since(t0).as_secs_f64(),
                what,
                a.kind,
                a.namespace,
                a.name
            );
            match lines.last_mut() {
                Some((last, n)) if *last == line => *n += 1,
                _ => lines.push((line, 1)),
            }
        }
    }
    for (line, n) in lines {
        if n > 1 {
            println!("{line} (x{n})");
        } else {
            println!("{line}");
        }
    }
    println!("   Events on the node:");
    for e in sim.list::<k8s_openapi::api::events::v1::Event>() {
        if e["regarding"]["name"] == node_name.as_str() {
            println!(
                "   {:<20} {}",
                e["reason"].as_str().unwrap_or(""),
                e["note"].as_str().unwrap_or("")
            );
        }
    }
    ca.refresh(proto::RefreshRequest {}).await?;
    show_target(ca, "demo-general").await?;
    show_nodes(ca, "demo-general").await?;
    Ok(())
}

/// Which group a managed node, an unknown instance and a non-AWS node belong to.
async fn scene_group_for_node(ca: &mut Client, victim: &str) -> anyhow::Result<()> {
    step("NodeGroupForNode for a managed node, an unknown instance and a non-AWS node");
    for pid in [
        victim,
        "aws:///us-east-1a/i-0000000000000dead",
        "gce://p/z/n",
    ] {
        let g = ca
            .node_group_for_node(proto::NodeGroupForNodeRequest {
                node: Some(proto::ExternalGrpcNode {
                    provider_id: pid.into(),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner()
            .node_group
            .unwrap_or_default();
        let group = if g.id.is_empty() {
            "no node group (not an instance of a managed group)"
        } else {
            g.id.as_str()
        };
        println!("   {pid:<45} -> {group}");
    }
    Ok(())
}

/// A launch that fails: the placeholders carry the error and CA gives the capacity back.
async fn scene_failed_launch(
    ca: &mut Client,
    cloud: &crate::cloud::memory::MemoryCloud,
) -> anyhow::Result<()> {
    step("A launch that fails: demo-arm has no capacity (placeholders carry the error)");
    cloud.fail_launches("demo-arm", Some("InsufficientInstanceCapacity"));
    ca.node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
        id: "demo-arm".into(),
        delta: 1,
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(600)).await;
    ca.refresh(proto::RefreshRequest {}).await?;
    show_nodes(ca, "demo-arm").await?;
    ca.node_group_decrease_target_size(proto::NodeGroupDecreaseTargetSizeRequest {
        id: "demo-arm".into(),
        delta: -1,
    })
    .await?;
    println!("   CA gives the capacity back with DecreaseTargetSize -1:");
    show_target(ca, "demo-arm").await?;
    Ok(())
}

/// An error CA would see.
async fn scene_refused(ca: &mut Client) -> anyhow::Result<()> {
    step("An error CA would see: increase past maxSize");
    match ca
        .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
            id: "demo-gpu".into(),
            delta: 9,
        })
        .await
    {
        Ok(_) => println!("   unexpectedly accepted"),
        Err(s) => println!(
            "   refused with gRPC status {:?}: {}",
            s.code(),
            s.message()
        ),
    }
    Ok(())
}

/// How a drain ended, as a sentence.
fn told(outcome: Option<&crate::scalein::Outcome>) -> String {
    use crate::scalein::Outcome;
    match outcome {
        Some(Outcome::Ended) => "ended: every pod left, then the instance was terminated".into(),
        Some(Outcome::Drained) => "finished: the node is drained".into(),
        Some(Outcome::Abandoned(why)) => format!("was abandoned: {why}"),
        Some(Outcome::Failed(why)) => format!("failed: {why}"),
        Some(Outcome::Observed(what)) => format!("was described (dry run): {what}"),
        None => "ended without an answer (the engine stopped)".into(),
    }
}

fn ready_pods(sim: &SimCluster) -> usize {
    sim.list::<k8s_openapi::api::core::v1::Pod>()
        .iter()
        .filter(|p| {
            p["metadata"]["deletionTimestamp"].is_null()
                && p["status"]["conditions"][0]["status"] == "True"
        })
        .count()
}

fn step(title: &str) {
    println!("\n-> {title}");
}

async fn show_target(ca: &mut Client, id: &str) -> anyhow::Result<()> {
    let t = ca
        .node_group_target_size(proto::NodeGroupTargetSizeRequest { id: id.into() })
        .await?
        .into_inner()
        .target_size;
    println!("   {id} target size: {t}");
    Ok(())
}

async fn show_nodes(ca: &mut Client, id: &str) -> anyhow::Result<(usize, usize, usize)> {
    let (line, counts) = nodes_line(ca, id).await?;
    println!("{line}");
    Ok(counts)
}

/// The group's instances in one line, and how many run, are created, are deleted.
async fn nodes_line(ca: &mut Client, id: &str) -> anyhow::Result<(String, (usize, usize, usize))> {
    let list = ca
        .node_group_nodes(proto::NodeGroupNodesRequest { id: id.into() })
        .await?
        .into_inner()
        .instances;
    let (mut r, mut c, mut d) = (0, 0, 0);
    let mut line = Vec::new();
    for i in &list {
        let st = i.status.clone().unwrap_or_default();
        let state =
            InstanceState::try_from(st.instance_state).unwrap_or(InstanceState::Unspecified);
        let short = i.id.rsplit('/').next().unwrap_or(&i.id);
        let label = match state {
            InstanceState::InstanceRunning => {
                r += 1;
                "running"
            }
            InstanceState::InstanceCreating => {
                c += 1;
                "creating"
            }
            InstanceState::InstanceDeleting => {
                d += 1;
                "deleting"
            }
            InstanceState::Unspecified => "?",
        };
        match st.error_info {
            Some(e) if !e.error_code.is_empty() => line.push(format!(
                "{short}={label} [error {} class {}: {}]",
                e.error_code, e.instance_error_class, e.error_message
            )),
            _ => line.push(format!("{short}={label}")),
        }
    }
    let line = format!(
        "   {id}: {}",
        if line.is_empty() {
            "(no instances)".to_string()
        } else {
            line.join("  ")
        }
    );
    Ok((line, (r, c, d)))
}
