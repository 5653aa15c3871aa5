//! Wire compatibility with the message shapes of different CA versions: our real
//! responses decoded with definitions shaped like CA 1.31 (template Node embedded in
//! field 1, meta Duration in fields 3-5) and CA 1.35 (nodeBytes in field 2, google
//! Duration in fields 8-11), and requests from each decoded by our server.

use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryGroup, MemoryTiming};
use ca_asg_provider::proto;
use ca_asg_provider::proto::cloud_provider_client::CloudProviderClient;
use ca_asg_provider::provider::options::OptionsWithoutStartupTime;
use ca_asg_provider::provider::{Provider, ProviderSettings};
use k8s_pb::api::core::v1::Node;
use prost::Message;

/// CA <= 1.34: `k8s.io.api.core.v1.Node nodeInfo = 1;`
#[derive(Clone, PartialEq, Message)]
struct Ca131TemplateResponse {
    #[prost(message, optional, tag = "1")]
    node_info: Option<Node>,
}

/// CA >= 1.35: `bytes nodeBytes = 2;` (field 1 gone).
#[derive(Clone, PartialEq, Message)]
struct Ca135TemplateResponse {
    #[prost(bytes = "vec", tag = "2")]
    node_bytes: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct MetaDuration {
    #[prost(int64, tag = "1")]
    duration: i64,
}

/// CA 1.31: fields 1-7, durations as meta/v1 Duration.
#[derive(Clone, PartialEq, Message)]
struct Ca131Options {
    #[prost(double, tag = "1")]
    scale_down_utilization_threshold: f64,
    #[prost(double, tag = "2")]
    scale_down_gpu_utilization_threshold: f64,
    #[prost(message, optional, tag = "3")]
    scale_down_unneeded_time: Option<MetaDuration>,
    #[prost(message, optional, tag = "4")]
    scale_down_unready_time: Option<MetaDuration>,
    #[prost(message, optional, tag = "5")]
    max_node_provision_time: Option<MetaDuration>,
    #[prost(bool, tag = "6")]
    zero_or_max_node_scaling: bool,
    #[prost(bool, tag = "7")]
    ignore_daemon_sets_utilization: bool,
}

/// CA 1.35: google Durations in 8-11, no 3-5.
#[derive(Clone, PartialEq, Message)]
struct Ca135Options {
    #[prost(double, tag = "1")]
    scale_down_utilization_threshold: f64,
    #[prost(double, tag = "2")]
    scale_down_gpu_utilization_threshold: f64,
    #[prost(bool, tag = "6")]
    zero_or_max_node_scaling: bool,
    #[prost(bool, tag = "7")]
    ignore_daemon_sets_utilization: bool,
    #[prost(message, optional, tag = "8")]
    scale_down_unneeded_duration: Option<prost_types::Duration>,
    #[prost(message, optional, tag = "9")]
    scale_down_unready_duration: Option<prost_types::Duration>,
    #[prost(message, optional, tag = "10")]
    max_node_provision_duration: Option<prost_types::Duration>,
}

#[derive(Clone, PartialEq, Message)]
struct Ca131OptionsRequest {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(message, optional, tag = "2")]
    defaults: Option<Ca131Options>,
}

#[derive(Clone, PartialEq, Message)]
struct Ca135OptionsRequest {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(message, optional, tag = "2")]
    defaults: Option<Ca135Options>,
}

async fn server() -> CloudProviderClient<tonic::transport::Channel> {
    server_with(OptionsWithoutStartupTime::default()).await.0
}

async fn server_with(
    policy: OptionsWithoutStartupTime,
) -> (
    CloudProviderClient<tonic::transport::Channel>,
    Arc<Provider>,
) {
    let cloud = MemoryCloud::new(
        vec![MemoryGroup::new("gpu", 0, 4, 0, "g4dn.xlarge")
            .tag("k8s.io/cluster-autoscaler/node-template/label/pool", "ml")
            .tag(
                "k8s.io/cluster-autoscaler/node-template/autoscaling-options/scaledownunneededtime",
                "20m",
            ),
            MemoryGroup::new("plain", 0, 4, 0, "m5.large").tag(
                "k8s.io/cluster-autoscaler/node-template/autoscaling-options/maxnodestartuptime",
                "20m",
            ),
            // One option tag CA can use, one malformed, one unknown.
            MemoryGroup::new("mixed", 0, 4, 0, "m5.large")
                .tag(
                    "k8s.io/cluster-autoscaler/node-template/autoscaling-options/scaledownunneededtime",
                    "20m",
                )
                .tag(
                    "k8s.io/cluster-autoscaler/node-template/autoscaling-options/scaledownutilizationthreshold",
                    "half",
                )
                .tag(
                    "k8s.io/cluster-autoscaler/node-template/autoscaling-options/scaledownfaster",
                    "yes",
                )],
        MemoryTiming::default(),
    );
    let settings = ProviderSettings {
        selector: ca_asg_provider::world::named(&["gpu", "plain", "mixed"]),
        options_without_startup_time: policy,
        ..ProviderSettings::default()
    };
    let p = Provider::new(Arc::new(cloud), settings);
    p.refresh_now().await.unwrap();
    let (l, addr) = ca_asg_provider::grpc::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    tokio::spawn(ca_asg_provider::grpc::serve(
        l,
        p.clone(),
        None,
        std::future::pending(),
    ));
    let ca = CloudProviderClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    (ca, p)
}

fn ten_minutes_131() -> Ca131Options {
    Ca131Options {
        scale_down_utilization_threshold: 0.5,
        scale_down_gpu_utilization_threshold: 0.5,
        scale_down_unneeded_time: Some(MetaDuration {
            duration: 600_000_000_000,
        }),
        scale_down_unready_time: Some(MetaDuration {
            duration: 1_200_000_000_000,
        }),
        max_node_provision_time: Some(MetaDuration {
            duration: 900_000_000_000,
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn template_node_decodes_as_ca_131_and_ca_135() {
    let mut ca = server().await;
    let resp = ca
        .node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest { id: "gpu".into() })
        .await
        .unwrap()
        .into_inner();
    let wire = resp.encode_to_vec();
    let old = Ca131TemplateResponse::decode(wire.as_slice())
        .unwrap()
        .node_info
        .expect("field 1 is a Node for CA 1.31");
    let new = Node::decode(
        Ca135TemplateResponse::decode(wire.as_slice())
            .unwrap()
            .node_bytes
            .as_slice(),
    )
    .unwrap();
    assert_eq!(old, new, "both versions see the same Node");
    let labels = &new.metadata.as_ref().unwrap().labels;
    assert_eq!(labels["pool"], "ml");
    assert_eq!(labels["node.kubernetes.io/instance-type"], "g4dn.xlarge");
    let cap = &new.status.as_ref().unwrap().capacity;
    assert_eq!(cap["nvidia.com/gpu"].string.as_deref(), Some("1"));
    assert_eq!(cap["cpu"].string.as_deref(), Some("4"));
}

/// Sends raw request bytes for NodeGroupGetOptions and returns the raw response.
async fn raw_get_options(
    ca: &mut CloudProviderClient<tonic::transport::Channel>,
    body: Vec<u8>,
) -> Vec<u8> {
    // Re-decode the foreign request with our own type: the bytes are what CA sends.
    let req = proto::NodeGroupAutoscalingOptionsRequest::decode(body.as_slice()).unwrap();
    let resp = ca.node_group_get_options(req).await.unwrap().into_inner();
    resp.node_group_autoscaling_options.unwrap().encode_to_vec()
}

#[tokio::test]
async fn options_round_trip_for_ca_131() {
    let mut ca = server().await;
    let body = Ca131OptionsRequest {
        id: "gpu".into(),
        defaults: Some(ten_minutes_131()),
    }
    .encode_to_vec();
    let out = Ca131Options::decode(raw_get_options(&mut ca, body).await.as_slice()).unwrap();
    // The tag overrides scale-down-unneeded; the rest echoes CA's defaults.
    assert_eq!(
        out.scale_down_unneeded_time.unwrap().duration,
        1_200_000_000_000
    );
    assert_eq!(
        out.scale_down_unready_time.unwrap().duration,
        1_200_000_000_000
    );
    assert_eq!(
        out.max_node_provision_time.unwrap().duration,
        900_000_000_000
    );
    assert_eq!(out.scale_down_utilization_threshold, 0.5);
}

/// The wire shape CA 1.35 reads, when the tags are answered to it
/// (`optionsWithoutStartupTime: answer`).
#[tokio::test]
async fn options_round_trip_for_ca_135() {
    let (mut ca, _p) = server_with(OptionsWithoutStartupTime::Answer).await;
    let secs = |s| {
        Some(prost_types::Duration {
            seconds: s,
            nanos: 0,
        })
    };
    let defaults = Ca135Options {
        scale_down_utilization_threshold: 0.6,
        scale_down_gpu_utilization_threshold: 0.4,
        scale_down_unneeded_duration: secs(600),
        scale_down_unready_duration: secs(1200),
        max_node_provision_duration: secs(900),
        ..Default::default()
    };
    let body = Ca135OptionsRequest {
        id: "gpu".into(),
        defaults: Some(defaults),
    }
    .encode_to_vec();
    let out = Ca135Options::decode(raw_get_options(&mut ca, body).await.as_slice()).unwrap();
    assert_eq!(
        out.scale_down_unneeded_duration.unwrap().seconds,
        1200,
        "tag: 20m"
    );
    assert_eq!(out.scale_down_unready_duration.unwrap().seconds, 1200);
    assert_eq!(out.max_node_provision_duration.unwrap().seconds, 900);
    assert_eq!(out.scale_down_utilization_threshold, 0.6);
}

#[tokio::test]
async fn missing_durations_are_filled_never_omitted() {
    let mut ca = server().await;
    let body = Ca131OptionsRequest {
        id: "gpu".into(),
        defaults: None,
    }
    .encode_to_vec();
    let bytes = raw_get_options(&mut ca, body).await;
    let old = Ca131Options::decode(bytes.as_slice()).unwrap();
    let new = Ca135Options::decode(bytes.as_slice()).unwrap();
    for d in [old.scale_down_unready_time, old.max_node_provision_time] {
        assert!(d.unwrap().duration > 0);
    }
    for d in [
        new.scale_down_unready_duration,
        new.max_node_provision_duration,
    ] {
        assert!(d.unwrap().seconds > 0);
    }
    assert_eq!(
        Duration::from_nanos(old.scale_down_unneeded_time.unwrap().duration as u64),
        Duration::from_secs(1200)
    );
}

/// A group whose tags set no option CA can carry answers Unimplemented, so every CA
/// version keeps its own defaults for every field (CA 1.35+ would otherwise read
/// MaxNodeStartupTime as 0, CA 1.31/1.32 would turn ignore-daemonsets-utilization off).
#[tokio::test]
async fn a_group_without_usable_option_tags_leaves_every_ca_its_defaults() {
    let mut ca = server().await;
    for body in [
        Ca131OptionsRequest {
            id: "plain".into(),
            defaults: Some(ten_minutes_131()),
        }
        .encode_to_vec(),
        Ca135OptionsRequest {
            id: "plain".into(),
            defaults: Some(Ca135Options {
                scale_down_utilization_threshold: 0.5,
                ..Default::default()
            }),
        }
        .encode_to_vec(),
    ] {
        let req = proto::NodeGroupAutoscalingOptionsRequest::decode(body.as_slice()).unwrap();
        let e = ca.node_group_get_options(req).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
    }
}

/// Defaults CA could never have sent (NaN threshold) are not echoed back; and since
/// any error but Unimplemented makes CA skip the deletion of the node it asked about
/// (every version 1.31 to master), the answer is Unimplemented (CA keeps its own
/// defaults), naming the field.
#[tokio::test]
async fn out_of_range_values_are_refused_by_field() {
    let mut ca = server().await;
    let mut d = ten_minutes_131();
    d.scale_down_utilization_threshold = f64::NAN;
    let body = Ca131OptionsRequest {
        id: "gpu".into(),
        defaults: Some(d),
    }
    .encode_to_vec();
    let req = proto::NodeGroupAutoscalingOptionsRequest::decode(body.as_slice()).unwrap();
    let e = ca.node_group_get_options(req).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
    assert!(
        e.message().contains("scaleDownUtilizationThreshold"),
        "{}",
        e.message()
    );
}

/// CA 1.34's request: both Duration sets (externalgrpc_node_group.go GetOptions).
fn ca_134_request(id: &str) -> Vec<u8> {
    let mut both = proto::NodeGroupAutoscalingOptions::decode(
        Ca131Options::encode_to_vec(&ten_minutes_131()).as_slice(),
    )
    .unwrap();
    both.scale_down_unneeded_duration = Some(prost_types::Duration {
        seconds: 600,
        nanos: 0,
    });
    both.scale_down_unready_duration = Some(prost_types::Duration {
        seconds: 1200,
        nanos: 0,
    });
    both.max_node_provision_duration = Some(prost_types::Duration {
        seconds: 900,
        nanos: 0,
    });
    proto::NodeGroupAutoscalingOptionsRequest {
        id: id.into(),
        defaults: Some(both),
    }
    .encode_to_vec()
}

fn ca_135_request(id: &str) -> Vec<u8> {
    let secs = |s| {
        Some(prost_types::Duration {
            seconds: s,
            nanos: 0,
        })
    };
    Ca135OptionsRequest {
        id: id.into(),
        defaults: Some(Ca135Options {
            scale_down_utilization_threshold: 0.5,
            scale_down_gpu_utilization_threshold: 0.5,
            scale_down_unneeded_duration: secs(600),
            scale_down_unready_duration: secs(1200),
            max_node_provision_duration: secs(900),
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

fn startup_time_count(group: &str, answer: &str) -> u64 {
    ca_asg_provider::telemetry::metrics::metrics()
        .encode()
        .lines()
        .find(|l| {
            l.starts_with("ca_asg_provider_options_without_startup_time_total")
                && l.contains(&format!("node_group=\"{group}\""))
                && l.contains(&format!("answer=\"{answer}\""))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// Issue 21 item 2: CA >= 1.35 (defaults in fields 8-10, none in 3-5) would read
/// MaxNodeStartupTime as 0 from any answer (kubernetes/autoscaler#10245). By default
/// an option-tagged group answers it Unimplemented, so CA keeps its own defaults;
/// CA 1.31 to 1.34 still get the tagged options. Each such call is counted, and the
/// group is warned about once.
#[tokio::test]
async fn ca_135_gets_unimplemented_for_tagged_groups_by_default_and_older_cas_the_tags() {
    let (mut ca, p) = server_with(OptionsWithoutStartupTime::default()).await;
    let before = startup_time_count("gpu", "unimplemented");
    for _ in 0..3 {
        let req =
            proto::NodeGroupAutoscalingOptionsRequest::decode(ca_135_request("gpu").as_slice())
                .unwrap();
        let e = ca.node_group_get_options(req).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
        assert!(e.message().contains("10245"), "{}", e.message());
    }
    assert_eq!(startup_time_count("gpu", "unimplemented") - before, 3);
    assert!(p.startup_time_told("gpu"));
    // CA 1.31 and 1.34 carry no MaxNodeStartupTime to lose: the tags apply.
    let out = Ca131Options::decode(
        raw_get_options(
            &mut ca,
            Ca131OptionsRequest {
                id: "gpu".into(),
                defaults: Some(ten_minutes_131()),
            }
            .encode_to_vec(),
        )
        .await
        .as_slice(),
    )
    .unwrap();
    assert_eq!(
        out.scale_down_unneeded_time.unwrap().duration,
        1_200_000_000_000
    );
    let out = Ca135Options::decode(
        raw_get_options(&mut ca, ca_134_request("gpu"))
            .await
            .as_slice(),
    )
    .unwrap();
    assert_eq!(out.scale_down_unneeded_duration.unwrap().seconds, 1200);
    assert_eq!(startup_time_count("gpu", "unimplemented") - before, 3);
}

/// With `optionsWithoutStartupTime: answer` CA 1.35 gets the tags, still counted
/// and warned about.
#[tokio::test]
async fn ca_135_gets_the_tags_when_configured_to_answer() {
    let (mut ca, p) = server_with(OptionsWithoutStartupTime::Answer).await;
    let before = startup_time_count("gpu", "answer");
    let out = Ca135Options::decode(
        raw_get_options(&mut ca, ca_135_request("gpu"))
            .await
            .as_slice(),
    )
    .unwrap();
    assert_eq!(out.scale_down_unneeded_duration.unwrap().seconds, 1200);
    assert_eq!(startup_time_count("gpu", "answer") - before, 1);
    assert!(p.startup_time_told("gpu"));
}

/// A group with a malformed option tag still scales down: CA 1.31 to master skip the
/// deletion of a node whose GetOptions answers any error but Unimplemented, so the
/// usable tags are answered, CA's defaults stand in for the rest, and the metric
/// `node_group_option_tags_unusable` counts what was left out.
#[tokio::test]
async fn a_malformed_option_tag_never_blocks_scale_down() {
    let (mut ca, p) = server_with(OptionsWithoutStartupTime::default()).await;
    let body = Ca131OptionsRequest {
        id: "mixed".into(),
        defaults: Some(ten_minutes_131()),
    }
    .encode_to_vec();
    let out = Ca131Options::decode(raw_get_options(&mut ca, body).await.as_slice()).unwrap();
    assert_eq!(
        out.scale_down_unneeded_time.unwrap().duration,
        1_200_000_000_000,
        "the usable tag applies"
    );
    assert_eq!(
        out.scale_down_utilization_threshold, 0.5,
        "CA's default for the bad one"
    );
    // CA >= 1.35 gets Unimplemented for a tagged group by default: also not an error
    // that blocks a deletion.
    let req = proto::NodeGroupAutoscalingOptionsRequest::decode(ca_135_request("mixed").as_slice())
        .unwrap();
    match ca.node_group_get_options(req).await {
        Ok(_) => {}
        Err(e) => assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}"),
    }
    // What the operations port does at each scrape.
    ca_asg_provider::telemetry::http::Status::before_scrape(p.as_ref());
    let text = ca_asg_provider::telemetry::metrics::metrics().encode();
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("ca_asg_provider_node_group_option_tags_unusable{")
                && l.contains("node_group=\"mixed\"")
        })
        .unwrap_or_else(|| panic!("no unusable-tags series for mixed:\n{text}"));
    assert!(line.ends_with(" 2"), "{line}");
}
