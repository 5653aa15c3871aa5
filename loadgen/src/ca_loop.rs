//! The calls cluster-autoscaler makes, in the order and mix of one of its loops.

use std::collections::HashMap;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use prost::Message as _;
use tonic::transport::Channel;

use super::floor::{path_of, Recorded};
use super::stats::Samples;
use ca_asg_provider::proto::cloud_provider_client::CloudProviderClient;
use ca_asg_provider::proto::{self, ExternalGrpcNode};

pub type Client = CloudProviderClient<Channel>;

/// What the load generator knows of the fleet (read once through the API).
#[derive(Debug, Clone)]
pub struct Fleet {
    pub groups: Vec<String>,
    pub nodes: Vec<ExternalGrpcNode>,
}

/// Times one call into `samples` and turns a gRPC error into one that names it.
macro_rules! timed {
    ($samples:expr, $name:literal, $call:expr) => {{
        let t = Instant::now();
        let r = $call.await;
        $samples.add($name, t.elapsed());
        r.map_err(|s| anyhow::anyhow!("{} failed: {}: {}", $name, s.code(), s.message()))?
    }};
}

/// Reads the groups and their instances the way CA first sees them, and builds the
/// Node objects CA would send (providerID, name, the usual labels).
pub async fn discover(ca: &mut Client) -> anyhow::Result<Fleet> {
    let groups: Vec<String> = ca
        .node_groups(proto::NodeGroupsRequest {})
        .await?
        .into_inner()
        .node_groups
        .into_iter()
        .map(|g| g.id)
        .collect();
    let mut nodes = Vec::new();
    for g in &groups {
        let instances = ca
            .node_group_nodes(proto::NodeGroupNodesRequest { id: g.clone() })
            .await?
            .into_inner()
            .instances;
        for i in instances {
            nodes.push(node_for(&i.id, g, nodes.len()));
        }
    }
    Ok(Fleet { groups, nodes })
}

/// A Node as CA passes it: providerID, name and about a dozen labels.
pub fn node_for(provider_id: &str, group: &str, n: usize) -> ExternalGrpcNode {
    let zone = provider_id
        .strip_prefix("aws:///")
        .and_then(|r| r.split('/').next())
        .unwrap_or("us-east-1a")
        .to_string();
    let name = format!(
        "ip-10-{}-{}-{}.ec2.internal",
        n / 65536 % 256,
        n / 256 % 256,
        n % 256
    );
    let labels: HashMap<String, String> = [
        ("kubernetes.io/arch", "amd64"),
        ("kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", "amd64"),
        ("beta.kubernetes.io/os", "linux"),
        ("node.kubernetes.io/instance-type", "m5.large"),
        ("beta.kubernetes.io/instance-type", "m5.large"),
        ("topology.kubernetes.io/region", "us-east-1"),
        ("failure-domain.beta.kubernetes.io/region", "us-east-1"),
        ("eks.amazonaws.com/capacityType", "ON_DEMAND"),
        ("eks.amazonaws.com/nodegroup", group),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([
        ("kubernetes.io/hostname".to_string(), name.clone()),
        ("topology.kubernetes.io/zone".to_string(), zone.clone()),
        ("failure-domain.beta.kubernetes.io/zone".to_string(), zone),
    ])
    .collect();
    ExternalGrpcNode {
        provider_id: provider_id.to_string(),
        name,
        labels,
        annotations: HashMap::from([("node.alpha.kubernetes.io/ttl".to_string(), "0".to_string())]),
    }
}

/// CA's defaults for NodeGroupGetOptions, as CA sends them.
fn defaults() -> proto::NodeGroupAutoscalingOptions {
    ca_asg_provider::grpc::options::to_proto(
        &ca_asg_provider::provider::options::AutoscalingOptions::ca_defaults(),
    )
}

/// The NodeGroupForNode request for a node of the fleet. Every loop builds it anew
/// from the same Fleet node, and the floor replays answers keyed by its bytes, so the
/// bytes must not change between builds. The labels and annotations are HashMaps, which
/// prost encodes in iteration order; a clone of a HashMap keeps the original's hasher
/// keys and bucket layout (hashbrown copies the control bytes and clones each entry
/// into the same bucket), so every clone iterates, and encodes, like the original. A
/// test below pins it, and should it ever break, the floor answers NotFound and the
/// loop fails: it cannot go unnoticed. (Decoding the request in the floor to key it by
/// providerID would not depend on this, but would add a decode the floor is meant
/// not to do.)
fn for_node(n: &ExternalGrpcNode) -> proto::NodeGroupForNodeRequest {
    proto::NodeGroupForNodeRequest {
        node: Some(n.clone()),
    }
}

/// The NodeGroupGetOptions request for a group, with CA's defaults.
fn options_for(
    id: &str,
    defaults: proto::NodeGroupAutoscalingOptions,
) -> proto::NodeGroupAutoscalingOptionsRequest {
    proto::NodeGroupAutoscalingOptionsRequest {
        id: id.to_string(),
        defaults: Some(defaults),
    }
}

/// One exchange for the floor: the request's bytes and the real server's answer.
fn recorded<A: prost::Message>(
    method: &str,
    request: Vec<u8>,
    answer: Result<tonic::Response<A>, tonic::Status>,
) -> Recorded {
    Recorded {
        path: path_of(method),
        request,
        answer: answer.map(|r| r.get_ref().encode_to_vec()),
    }
}

/// Sends every distinct request of one loop once to the real server, built as
/// `run_loop` builds it, and returns each with its answer: what the floor replays.
/// An error answer is recorded (the floor gives it back) but only GetOptions'
/// Unimplemented is expected; any other means the real loop fails too, so it is
/// reported here.
pub async fn record(ca: &mut Client, fleet: &Fleet) -> anyhow::Result<Vec<Recorded>> {
    let mut out = Vec::with_capacity(2 + fleet.nodes.len() + 4 * fleet.groups.len());
    let q = proto::RefreshRequest {};
    out.push(recorded("Refresh", q.encode_to_vec(), ca.refresh(q).await));
    let q = proto::NodeGroupsRequest {};
    out.push(recorded(
        "NodeGroups",
        q.encode_to_vec(),
        ca.node_groups(q).await,
    ));
    for n in &fleet.nodes {
        let q = for_node(n);
        out.push(recorded(
            "NodeGroupForNode",
            q.encode_to_vec(),
            ca.node_group_for_node(q).await,
        ));
    }
    let options = defaults();
    for g in &fleet.groups {
        let q = proto::NodeGroupTargetSizeRequest { id: g.clone() };
        out.push(recorded(
            "NodeGroupTargetSize",
            q.encode_to_vec(),
            ca.node_group_target_size(q).await,
        ));
        let q = proto::NodeGroupNodesRequest { id: g.clone() };
        out.push(recorded(
            "NodeGroupNodes",
            q.encode_to_vec(),
            ca.node_group_nodes(q).await,
        ));
        let q = proto::NodeGroupTemplateNodeInfoRequest { id: g.clone() };
        out.push(recorded(
            "NodeGroupTemplateNodeInfo",
            q.encode_to_vec(),
            ca.node_group_template_node_info(q).await,
        ));
        let q = options_for(g, options);
        out.push(recorded(
            "NodeGroupGetOptions",
            q.encode_to_vec(),
            ca.node_group_get_options(q).await,
        ));
    }
    for r in &out {
        if let Err(s) = &r.answer {
            let expected =
                s.code() == tonic::Code::Unimplemented && r.path == path_of("NodeGroupGetOptions");
            anyhow::ensure!(
                expected,
                "recording the floor's answers: {} failed: {}: {}",
                r.path,
                s.code(),
                s.message()
            );
        }
    }
    Ok(out)
}

/// One loop, sequential like CA's: Refresh, NodeGroups, NodeGroupForNode twice per
/// node, then per group TargetSize (twice), NodeGroupNodes, TemplateNodeInfo and
/// GetOptions: 2N + 5G + 2 calls.
pub async fn run_loop(ca: &mut Client, fleet: &Fleet, samples: &mut Samples) -> anyhow::Result<()> {
    timed!(samples, "Refresh", ca.refresh(proto::RefreshRequest {}));
    timed!(
        samples,
        "NodeGroups",
        ca.node_groups(proto::NodeGroupsRequest {})
    );
    for _ in 0..2 {
        for n in &fleet.nodes {
            let r = timed!(
                samples,
                "NodeGroupForNode",
                ca.node_group_for_node(for_node(n))
            );
            if r.get_ref()
                .node_group
                .as_ref()
                .is_none_or(|g| g.id.is_empty())
            {
                anyhow::bail!("NodeGroupForNode: no group for {}", n.provider_id);
            }
        }
    }
    let options = defaults();
    for g in &fleet.groups {
        let id = || g.clone();
        for _ in 0..2 {
            timed!(
                samples,
                "NodeGroupTargetSize",
                ca.node_group_target_size(proto::NodeGroupTargetSizeRequest { id: id() })
            );
        }
        timed!(
            samples,
            "NodeGroupNodes",
            ca.node_group_nodes(proto::NodeGroupNodesRequest { id: id() })
        );
        timed!(
            samples,
            "NodeGroupTemplateNodeInfo",
            ca.node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest { id: id() })
        );
        // Unimplemented is an answer (no option tags: CA keeps its defaults).
        let t = Instant::now();
        let r = ca.node_group_get_options(options_for(g, options)).await;
        samples.add("NodeGroupGetOptions", t.elapsed());
        match r {
            Ok(_) => {}
            Err(s) if s.code() == tonic::Code::Unimplemented => {}
            Err(s) => anyhow::bail!("NodeGroupGetOptions failed: {}: {}", s.code(), s.message()),
        }
    }
    Ok(())
}

/// NodeGroupForNode for every node `passes` times, spread over `connections` HTTP/2
/// connections, each sending its share one call at a time. Returns the samples and
/// the wall time.
pub async fn run_concurrent(
    channels: &[Channel],
    fleet: &Fleet,
    passes: usize,
) -> anyhow::Result<(Samples, Duration)> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (c, ch) in channels.iter().enumerate() {
        let mut ca = Client::new(ch.clone());
        let mine: Vec<ExternalGrpcNode> = fleet
            .nodes
            .iter()
            .skip(c)
            .step_by(channels.len())
            .cloned()
            .collect();
        tasks.push(tokio::spawn(async move {
            let mut samples = Samples::default();
            for _ in 0..passes {
                for n in &mine {
                    timed!(
                        samples,
                        "NodeGroupForNode",
                        ca.node_group_for_node(for_node(n))
                    );
                }
            }
            anyhow::Ok(samples)
        }));
    }
    let mut all = Samples::default();
    for t in tasks {
        all.merge(t.await??);
    }
    Ok((all, started.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_carry_zone_name_and_group_labels() {
        let n = node_for("aws:///us-east-1b/i-0abc", "ng-001", 258);
        assert_eq!(n.name, "ip-10-0-1-2.ec2.internal");
        assert_eq!(n.labels["topology.kubernetes.io/zone"], "us-east-1b");
        assert_eq!(n.labels["eks.amazonaws.com/nodegroup"], "ng-001");
        assert_eq!(n.labels["kubernetes.io/hostname"], n.name);
        assert_eq!(n.labels.len(), 13);
    }

    /// The floor keys NodeGroupForNode by the request's bytes (see `for_node`): every
    /// build from the same node, and from a clone of it, encodes alike.
    #[test]
    fn a_node_request_encodes_the_same_every_time_it_is_built() {
        let fleet: Vec<ExternalGrpcNode> = (0..200)
            .map(|i| node_for(&format!("aws:///us-east-1a/i-{i:017x}"), "ng-001", i))
            .collect();
        let copy = fleet.clone();
        for (n, c) in fleet.iter().zip(&copy) {
            let first = for_node(n).encode_to_vec();
            assert_eq!(first, for_node(n).encode_to_vec());
            assert_eq!(first, for_node(c).encode_to_vec());
            assert_eq!(first, for_node(&for_node(c).node.unwrap()).encode_to_vec());
        }
    }
}
