//! Templates heal through the real SDK against moto: a new launch template version
//! that becomes `$Default` (ModifyLaunchTemplate) or `$Latest`
//! (CreateLaunchTemplateVersion) reaches the template after its lifetime, without a
//! restart, and a numbered version is kept.

mod support;

use std::sync::Arc;

use aws_sdk_autoscaling as asg;
use aws_sdk_ec2 as ec2;
use base64::Engine as _;
use ca_asg_provider::cloud::aws::AwsCloud;
use ca_asg_provider::provider::templates::{ManualClock, FLOATING_LAUNCH_TTL};
use ca_asg_provider::provider::{Provider, ProviderSettings};
use k8s_pb::api::core::v1::Node;
use prost::Message;
use support::moto::MotoServer;

const AMI: &str = "ami-12c6146b";

fn data(itype: &str, release: &str) -> ec2::types::RequestLaunchTemplateData {
    let user_data = format!(
        "#!/bin/bash\n/etc/eks/bootstrap.sh prod --kubelet-extra-args '--node-labels=release={release}'\n"
    );
    ec2::types::RequestLaunchTemplateData::builder()
        .image_id(AMI)
        .instance_type(ec2::types::InstanceType::from(itype))
        .user_data(base64::engine::general_purpose::STANDARD.encode(user_data))
        .build()
}

/// A launch template (version 1: m5.large, release 1) and an ASG naming it at
/// `version`, a provider over it with a hand-moved template clock.
async fn setup(
    moto: &MotoServer,
    lt: &str,
    version: &str,
) -> (ec2::Client, Arc<Provider>, ManualClock) {
    let cfg = moto.sdk_config().await;
    let ec2c = ec2::Client::new(&cfg);
    let asgc = asg::Client::new(&cfg);
    first_version(&ec2c, lt).await;
    support::moto::group_on(&asgc, lt, lt, version)
        .send()
        .await
        .unwrap();
    let (p, clock) = support::templates::provider_on_manual_clock(
        Arc::new(AwsCloud::from_sdk_config(&cfg)),
        vec![lt.into()],
    )
    .await;
    (ec2c, p, clock)
}

/// Launch template `lt`, its version 1: m5.large, release 1.
async fn first_version(ec2c: &ec2::Client, lt: &str) {
    ec2c.create_launch_template()
        .launch_template_name(lt)
        .launch_template_data(data("m5.large", "1"))
        .send()
        .await
        .unwrap();
}

async fn seen(p: &Provider, g: &str) -> (String, String) {
    let b = p.template_node(g).await.unwrap();
    let labels = Node::decode(b.as_ref()).unwrap().metadata.unwrap().labels;
    (
        labels["node.kubernetes.io/instance-type"].clone(),
        labels["release"].clone(),
    )
}

async fn new_version(ec2c: &ec2::Client, lt: &str) {
    ec2c.create_launch_template_version()
        .launch_template_name(lt)
        .launch_template_data(data("m5.xlarge", "2"))
        .send()
        .await
        .unwrap();
}

async fn after_lifetime(p: &Arc<Provider>, clock: &ManualClock) {
    clock.advance(FLOATING_LAUNCH_TTL);
    p.refresh().await.unwrap();
    p.templates_prefetched().await;
}

fn m5_large_release_1() -> (String, String) {
    ("m5.large".into(), "1".into())
}

#[tokio::test]
async fn a_version_made_default_reaches_the_template_through_the_sdk() {
    let moto = MotoServer::start();
    let lt = "lt-default";
    let (ec2c, p, clock) = setup(&moto, lt, "$Default").await;
    assert_eq!(seen(&p, lt).await, m5_large_release_1());
    new_version(&ec2c, lt).await;
    after_lifetime(&p, &clock).await;
    assert_eq!(
        seen(&p, lt).await,
        m5_large_release_1(),
        "version 2 is not the default yet"
    );
    ec2c.modify_launch_template()
        .launch_template_name(lt)
        .default_version("2")
        .send()
        .await
        .unwrap();
    after_lifetime(&p, &clock).await;
    assert_eq!(seen(&p, lt).await, ("m5.xlarge".into(), "2".into()));
}

#[tokio::test]
async fn a_new_latest_version_reaches_the_template_and_a_pinned_one_stays() {
    let moto = MotoServer::start();
    let (ec2c, latest, clock) = setup(&moto, "lt-latest", "$Latest").await;
    let cfg = moto.sdk_config().await;
    support::moto::group_on(&asg::Client::new(&cfg), "pinned", "lt-latest", "1")
        .send()
        .await
        .unwrap();
    let pinned = Provider::new(
        Arc::new(AwsCloud::from_sdk_config(&cfg)),
        ProviderSettings {
            selector: ca_asg_provider::world::named(&["pinned"]),
            ..ProviderSettings::default()
        },
    );
    pinned.set_template_clock(Arc::new(clock.clone()));
    pinned.refresh_now().await.unwrap();
    pinned.templates_prefetched().await;
    new_version(&ec2c, "lt-latest").await;
    after_lifetime(&latest, &clock).await;
    after_lifetime(&pinned, &clock).await;
    assert_eq!(
        seen(&latest, "lt-latest").await,
        ("m5.xlarge".into(), "2".into())
    );
    assert_eq!(seen(&pinned, "pinned").await, m5_large_release_1());
}

/// Through the real SDK end to end: ASGs and launch templates from moto, EKS through
/// the SDK's mock layer answering the first DescribeNodegroup with a
/// ThrottlingException and every later one with the node group. The template CA gets
/// after the next Refresh carries the node group's labels, taint and capacity type.
#[tokio::test]
async fn a_throttled_describe_nodegroup_through_the_sdk_heals_on_the_next_refresh() {
    use aws_sdk_eks::operation::describe_nodegroup::{
        DescribeNodegroupError, DescribeNodegroupOutput,
    };
    use aws_sdk_eks::types::{CapacityTypes, Nodegroup, Taint, TaintEffect};
    use aws_smithy_mocks::{mock, RuleMode};
    use aws_smithy_types::error::ErrorMetadata;

    let moto = MotoServer::start();
    let cfg = moto.sdk_config().await;
    let ec2c = ec2::Client::new(&cfg);
    let asgc = asg::Client::new(&cfg);
    first_version(&ec2c, "lt-eks").await;
    let eks = [("eks:cluster-name", "prod"), ("eks:nodegroup-name", "ng-1")];
    let req = support::moto::group_on(&asgc, "eks-ng", "lt-eks", "$Default");
    support::moto::tagged(req, "eks-ng", &eks)
        .send()
        .await
        .unwrap();
    let describe = mock!(aws_sdk_eks::Client::describe_nodegroup)
        .sequence()
        .error(|| {
            DescribeNodegroupError::generic(
                ErrorMetadata::builder()
                    .code("ThrottlingException")
                    .message("Rate exceeded")
                    .build(),
            )
        })
        .output(|| {
            DescribeNodegroupOutput::builder()
                .nodegroup(
                    Nodegroup::builder()
                        .nodegroup_name("ng-1")
                        .capacity_type(CapacityTypes::Spot)
                        .labels("team", "ml")
                        .taints(
                            Taint::builder()
                                .key("dedicated")
                                .value("ml")
                                .effect(TaintEffect::NoSchedule)
                                .build(),
                        )
                        .build(),
                )
                .build()
        })
        .repeatedly()
        .build();
    // The mock layer by hand: this crate's EKS SDK has no test defaults to build on.
    let eks = aws_sdk_eks::Client::from_conf(
        aws_sdk_eks::Config::builder()
            .behavior_version_latest()
            .region(aws_sdk_eks::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_eks::config::Credentials::new(
                "test", "test", None, None, "test",
            ))
            .retry_config(aws_sdk_eks::config::retry::RetryConfig::disabled())
            .http_client(aws_smithy_mocks::create_mock_http_client())
            .interceptor(
                aws_smithy_mocks::MockResponseInterceptor::new()
                    .rule_mode(RuleMode::Sequential)
                    .with_rule(&describe),
            )
            .build(),
    );
    let p = ca_asg_provider::world::provider(
        Arc::new(AwsCloud::from_clients(asgc, ec2c, eks)),
        ca_asg_provider::world::named(&["eks-ng"]),
    )
    .await
    .unwrap();
    p.templates_prefetched().await;
    let node = |b: bytes::Bytes| Node::decode(b.as_ref()).unwrap();
    let first = node(p.template_node("eks-ng").await.unwrap());
    assert!(!first
        .metadata
        .unwrap()
        .labels
        .contains_key("eks.amazonaws.com/capacityType"));
    // CA's next Refresh: the ASGs are not due, the template is.
    p.refresh().await.unwrap();
    p.templates_prefetched().await;
    let healed = node(p.template_node("eks-ng").await.unwrap());
    let labels = healed.metadata.unwrap().labels;
    assert_eq!(labels["eks.amazonaws.com/capacityType"], "SPOT");
    assert_eq!(labels["team"], "ml");
    assert!(healed
        .spec
        .unwrap()
        .taints
        .iter()
        .any(|t| t.key.as_deref() == Some("dedicated")));
    assert!(p.template_findings("eks-ng").unwrap().incomplete.is_empty());
}
