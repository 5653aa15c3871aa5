//! The last mile (issue 73): an instance ends only once it is out of every load
//! balancer's target group that has it, each waited at most its deregistration delay
//! plus a margin. The scale-in end to end on the memory cloud (which plays ELBv2's
//! `draining` for a group's delay, then `unused`), and the AWS backend against moto's
//! ELBv2.

mod support;

use std::time::Duration;

use aws_sdk_ec2 as ec2;
use aws_sdk_elasticloadbalancingv2 as elb;
use ca_asg_provider::clock::Instant;
use ca_asg_provider::cloud::aws::AwsCloud;
use ca_asg_provider::cloud::memory::MemoryCloud;
use ca_asg_provider::cloud::Cloud;
use ca_asg_provider::scalein::decide::last_mile::{self, Addresses};
use ca_asg_provider::scalein::{LoadBalancerWait, Outcome, ScaleInSettings};
use k8s_openapi::api::core::v1::Node;
use serde_json::Value;

use support::moto::MotoServer;
use support::world::*;

fn settings(margin: Duration) -> ScaleInSettings {
    ScaleInSettings {
        load_balancers: LoadBalancerWait {
            enabled: true,
            margin,
            poll: Duration::from_millis(100),
        },
        ..fast_settings()
    }
}

/// The service's Events on the node: (reason, note).
fn said(w: &World, node: &str) -> Vec<(String, String)> {
    w.sim
        .list::<k8s_openapi::api::events::v1::Event>()
        .into_iter()
        .filter(|e| e["regarding"]["kind"] == "Node" && e["regarding"]["name"] == node)
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or_default().to_string(),
                e["note"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn cordoned(w: &World, node: &str) -> bool {
    w.sim
        .get::<Node>("", node)
        .is_some_and(|n: Value| n["spec"]["unschedulable"] == true)
}

/// Lifecycle mode: the instance is a target of an ALB's instance group and an NLB's IP
/// group (its node's address). The load balancer controller deregisters it when the
/// drain begins; each group drains for its delay. Our hook's action is completed only
/// after both show the instance `unused`, and heartbeats kept the hook (1 s timeout)
/// alive through the wait.
#[tokio::test]
async fn the_instance_ends_only_after_its_targets_left_every_group() {
    let mut w = World::builder()
        .web_hooked(3, 2, 1)
        .settings(settings(Duration::from_secs(5)))
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web")[0].clone();
    // A pod whose preStop takes 0.3 s: the drain outlasts the controller's 20 ms look
    // at the cordon, so the wait's first read finds both targets already draining
    // (a group nobody has begun to take the instance out of is waited on for the
    // margin alone, and the note would say so).
    w.put(&ca_asg_provider::sim::fixtures::pod(
        "shop", "app", &node, "app", 0.3,
    ));
    pod_ready(&w, "app").await;
    let address = MemoryCloud::address_of(&iid).unwrap();
    let alb = w.cloud.add_target_group("web-alb", "instance", "2");
    let nlb = w.cloud.add_target_group("web-nlb", "ip", "1");
    let other = w.cloud.add_target_group("lambda", "lambda", "300");
    w.cloud.register_target(&alb, &iid);
    w.cloud.register_target(&nlb, &address);
    w.cloud.register_target(&other, "arn:aws:lambda:fn");
    // The load balancer controller: the drain's cordon excludes the node, the
    // controller deregisters its targets.
    let controller = {
        let (sim, cloud) = (w.sim.clone(), w.cloud.clone());
        let (node, iid, alb, nlb, address) = (
            node.clone(),
            iid.clone(),
            alb.clone(),
            nlb.clone(),
            address.clone(),
        );
        tokio::spawn(async move {
            loop {
                if sim
                    .get::<Node>("", &node)
                    .is_some_and(|n: Value| n["spec"]["unschedulable"] == true)
                {
                    let at = Instant::now();
                    cloud.deregister_target(&alb, &iid);
                    cloud.deregister_target(&nlb, &address);
                    return at;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    // `status` reads the wait from the Node while it lasts.
    let noted = {
        let (sim, node) = (w.sim.clone(), node.clone());
        tokio::spawn(async move {
            for _ in 0..500 {
                let note = sim.get::<Node>("", &node).and_then(|n: Value| {
                    n["metadata"]["annotations"][last_mile::ANNOTATION]
                        .as_str()
                        .and_then(last_mile::Waiting::read)
                });
                if let Some(n) = note {
                    return Some(n);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            None
        })
    };
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let deregistered = controller.await.unwrap();
    let note = noted
        .await
        .unwrap()
        .expect("the Node said the drain waits for the load balancers");
    assert_eq!((note.groups, note.at_most_seconds), (2, 7), "{note:?}");
    let completed = w
        .cloud
        .completed_at()
        .into_iter()
        .find(|(i, _)| *i == iid)
        .expect("our hook's action was completed")
        .1;
    // Not before the longer of the two groups' delays ran out after deregistration.
    assert!(
        completed >= deregistered + Duration::from_secs(2),
        "completed before the ALB's target left"
    );
    assert!(w
        .cloud
        .target_states(&alb)
        .iter()
        .all(|(_, s)| s == "unused"));
    assert!(w
        .cloud
        .target_states(&nlb)
        .iter()
        .all(|(_, s)| s == "unused"));
    // The hook never timed out: the heartbeats went on while the wait lasted.
    assert!(
        w.cloud.hook_timeouts().is_empty(),
        "{:?}",
        w.cloud.hook_timeouts()
    );
    assert!(
        w.cloud
            .heartbeats()
            .iter()
            .filter(|a| a.instance_id == iid)
            .count()
            >= 2
    );
    let events = said(&w, &node);
    let waiting = events
        .iter()
        .find(|(r, _)| r == "WaitingForLoadBalancers")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert!(
        waiting.1.contains("web-alb") && waiting.1.contains("web-nlb"),
        "{waiting:?}"
    );
    assert!(
        waiting
            .1
            .contains("waiting for 2 target groups to deregister"),
        "{waiting:?}"
    );
    assert!(
        !events.iter().any(|(r, _)| r == "LoadBalancerWaitOver"),
        "{events:?}"
    );
    assert!(
        !events.iter().any(|(r, _)| r == "LoadBalancerUnreadable"),
        "{events:?}"
    );
    let calls = w.cloud.lb_calls();
    // One list (shared), the instance's addresses once, each delay once.
    assert_eq!(calls.get("target_groups"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("instance_addresses"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("deregistration_delay"), Some(&2), "{calls:?}");
}

/// A target group the service may not read (its role lacks DescribeTargetHealth) is
/// waited on up to its bound (delay 1 s + margin 1 s), said once by name with the
/// missing permission, and then the instance ends as it would without the wait.
#[tokio::test]
async fn a_forbidden_target_group_is_waited_on_up_to_its_bound_then_the_instance_ends() {
    let mut w = World::builder()
        .web(3, 1)
        .settings(settings(Duration::from_secs(1)))
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web")[0].clone();
    let locked = w.cloud.add_target_group("locked", "instance", "1");
    w.cloud.register_target(&locked, &iid);
    w.cloud.refuse("target_health", "AccessDenied", 1_000);
    let started = Instant::now();
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    assert!(
        Instant::now() >= started + Duration::from_secs(2),
        "ended before the group's bound"
    );
    let events = said(&w, &node);
    let unreadable: Vec<&(String, String)> = events
        .iter()
        .filter(|(r, _)| r == "LoadBalancerUnreadable")
        .collect();
    assert_eq!(unreadable.len(), 1, "said once: {events:?}");
    assert!(
        unreadable[0].1.contains("locked")
            && unreadable[0]
                .1
                .contains("elasticloadbalancing:DescribeTargetHealth")
            && unreadable[0].1.contains("AccessDenied"),
        "{unreadable:?}"
    );
    let over = events
        .iter()
        .find(|(r, _)| r == "LoadBalancerWaitOver")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert!(over.1.contains("locked"), "{over:?}");
    assert!(
        events.iter().any(|(r, _)| r == "InstanceTerminated"),
        "{events:?}"
    );
    // The target still shows healthy: the wait was bounded, not satisfied.
    assert_eq!(
        w.cloud.target_states(&locked),
        vec![(iid.clone(), "healthy".to_string())]
    );
}

/// Throttled reads wait, then read: a group AWS throttles twice is read on the third
/// poll and the instance ends once its target is `unused`, without a give-up.
#[tokio::test]
async fn throttled_reads_are_waited_through_and_the_wait_off_waits_for_nothing() {
    let mut w = World::builder()
        .web(3, 2)
        .settings(settings(Duration::from_secs(5)))
        .build()
        .await;
    let nodes = nodes_of(&w, "web");
    let (node, iid) = nodes[0].clone();
    let tg = w.cloud.add_target_group("web", "instance", "1");
    w.cloud.register_target(&tg, &iid);
    w.cloud.deregister_target(&tg, &iid);
    w.cloud.throttle("target_health", 2);
    delete_nodes(&mut w, "web", &[(node.clone(), iid.clone())]).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Ended));
    let events = said(&w, &node);
    assert!(
        !events.iter().any(|(r, _)| r == "LoadBalancerWaitOver"),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "LoadBalancerUnreadable" && n.contains("web")),
        "{events:?}"
    );
    assert_eq!(
        w.cloud.target_states(&tg),
        vec![(iid.clone(), "unused".to_string())]
    );

    // Off: a healthy target does not hold the instance.
    let mut off = World::builder()
        .web(3, 1)
        .settings(ScaleInSettings {
            load_balancers: LoadBalancerWait {
                enabled: false,
                ..LoadBalancerWait::default()
            },
            ..fast_settings()
        })
        .build()
        .await;
    let (node, iid) = nodes_of(&off, "web")[0].clone();
    let tg = off.cloud.add_target_group("web", "instance", "3600");
    off.cloud.register_target(&tg, &iid);
    delete_nodes(&mut off, "web", &[(node.clone(), iid.clone())]).await;
    assert_eq!(off.engine.wait_for(&iid).await, Some(Outcome::Ended));
    assert!(off.cloud.lb_calls().is_empty());
    assert!(cordoned(&off, &node) || off.sim.get::<Node>("", &node).is_none());
}

/// The AWS backend against moto's ELBv2: target groups listed with their types, an instance's addresses, its targets by id and by address, the
/// deregistration delay as set, and a deregistered target gone from the group.
#[tokio::test]
async fn the_aws_backend_reads_target_groups_health_and_delays_from_moto() {
    let moto = MotoServer::start();
    let cfg = moto.sdk_config().await;
    let ec2c = ec2::Client::new(&cfg);
    let elbc = elb::Client::new(&cfg);
    let cloud = AwsCloud::from_sdk_config(&cfg);
    assert!(cloud.target_groups().await.unwrap().is_empty());

    let vpc = ec2c
        .create_vpc()
        .cidr_block("10.0.0.0/16")
        .send()
        .await
        .unwrap();
    let vpc_id = vpc.vpc().unwrap().vpc_id().unwrap().to_string();
    let subnet = ec2c
        .create_subnet()
        .vpc_id(&vpc_id)
        .cidr_block("10.0.1.0/24")
        .availability_zone("us-east-1a")
        .send()
        .await
        .unwrap();
    let subnet_id = subnet.subnet().unwrap().subnet_id().unwrap().to_string();
    let run = ec2c
        .run_instances()
        .image_id("ami-12c6146b")
        .min_count(1)
        .max_count(1)
        .subnet_id(&subnet_id)
        .send()
        .await
        .unwrap();
    let inst = &run.instances()[0];
    let iid = inst.instance_id().unwrap().to_string();
    let ip = inst.private_ip_address().unwrap().to_string();

    let group = |name: &str, kind: elb::types::TargetTypeEnum| {
        elbc.create_target_group()
            .name(name)
            .protocol(elb::types::ProtocolEnum::Http)
            .port(80)
            .vpc_id(&vpc_id)
            .target_type(kind)
            .send()
    };
    let web = group("web", elb::types::TargetTypeEnum::Instance)
        .await
        .unwrap();
    let web = web.target_groups()[0]
        .target_group_arn()
        .unwrap()
        .to_string();
    let pods = group("pods", elb::types::TargetTypeEnum::Ip).await.unwrap();
    let pods = pods.target_groups()[0]
        .target_group_arn()
        .unwrap()
        .to_string();
    elbc.register_targets()
        .target_group_arn(&web)
        .targets(
            elb::types::TargetDescription::builder()
                .id(&iid)
                .port(80)
                .build(),
        )
        .send()
        .await
        .unwrap();
    elbc.register_targets()
        .target_group_arn(&pods)
        .targets(
            elb::types::TargetDescription::builder()
                .id(&ip)
                .port(8080)
                .build(),
        )
        .send()
        .await
        .unwrap();
    elbc.modify_target_group_attributes()
        .target_group_arn(&web)
        .attributes(
            elb::types::TargetGroupAttribute::builder()
                .key("deregistration_delay.timeout_seconds")
                .value("45")
                .build(),
        )
        .send()
        .await
        .unwrap();
    // Groups without the instance besides. (moto answers DescribeTargetGroups in one
    // page whatever PageSize asks; the paging loop is the same as DescribeWarmPool's.)
    for n in 0..10 {
        group(&format!("extra-{n}"), elb::types::TargetTypeEnum::Instance)
            .await
            .unwrap();
    }

    let groups = cloud.target_groups().await.unwrap();
    assert_eq!(groups.len(), 12);
    let kind = |arn: &str| {
        groups
            .iter()
            .find(|g| g.arn == arn)
            .map(|g| (g.name.clone(), g.target_type.clone()))
    };
    assert_eq!(kind(&web), Some(("web".into(), "instance".into())));
    assert_eq!(kind(&pods), Some(("pods".into(), "ip".into())));
    assert_eq!(cloud.calls().count("DescribeTargetGroups"), 2);

    let a = cloud.instance_addresses(&iid).await.unwrap();
    assert!(a.addresses.contains(&ip), "{a:?}");
    let addresses = Addresses::parse(&a.addresses, &a.prefixes);
    let in_web = last_mile::states_of(
        "instance",
        &cloud.target_health(&web).await.unwrap(),
        &iid,
        &addresses,
    );
    let in_pods = last_mile::states_of(
        "ip",
        &cloud.target_health(&pods).await.unwrap(),
        &iid,
        &addresses,
    );
    assert_eq!(in_web.len(), 1, "{in_web:?}");
    assert_eq!(in_pods.len(), 1, "{in_pods:?}");
    assert!(in_web.iter().chain(&in_pods).all(|s| !last_mile::is_out(s)));
    let delay = cloud.deregistration_delay(&web).await.unwrap();
    assert_eq!(
        delay.as_deref().map(last_mile::parse_delay),
        Some(Ok(Duration::from_secs(45)))
    );
    let default = cloud.deregistration_delay(&pods).await.unwrap();
    assert_eq!(
        default.as_deref().map(last_mile::parse_delay),
        Some(Ok(Duration::from_secs(300)))
    );

    elbc.deregister_targets()
        .target_group_arn(&web)
        .targets(
            elb::types::TargetDescription::builder()
                .id(&iid)
                .port(80)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let after = last_mile::states_of(
        "instance",
        &cloud.target_health(&web).await.unwrap(),
        &iid,
        &addresses,
    );
    assert!(after.iter().all(|s| last_mile::is_out(s)), "{after:?}");
    // A group gone is NotFound, which the wait counts as out.
    elbc.delete_target_group()
        .target_group_arn(&pods)
        .send()
        .await
        .unwrap();
    assert!(matches!(
        cloud.target_health(&pods).await,
        Err(ca_asg_provider::cloud::CloudError::NotFound { .. })
    ));
    // A backend built from clients without ELBv2 sees no load balancers.
    let bare = AwsCloud::from_clients(
        aws_sdk_autoscaling::Client::new(&cfg),
        ec2c.clone(),
        aws_sdk_eks::Client::new(&cfg),
    );
    assert!(bare.target_groups().await.unwrap().is_empty());
}

/// What moto does not model, through the SDK's mock layer: DescribeTargetGroups in
/// pages of 400 followed by their marker, a target without a state read as one that
/// may carry traffic, and AWS's refusals classified as the wait counts them (throttled:
/// passing; AccessDenied: a missing permission, by its code; a group gone: NotFound).
#[tokio::test]
async fn target_groups_are_paged_and_refusals_classified_through_the_sdks_mock_layer() {
    use aws_sdk_elasticloadbalancingv2::operation::describe_target_groups::DescribeTargetGroupsOutput;
    use aws_sdk_elasticloadbalancingv2::operation::describe_target_health::{
        DescribeTargetHealthError, DescribeTargetHealthOutput,
    };
    use aws_smithy_mocks::{mock, mock_client, RuleMode};
    use aws_smithy_types::error::ErrorMetadata;
    use ca_asg_provider::cloud::CloudError;

    let tg = |n: usize| {
        elb::types::TargetGroup::builder()
            .target_group_arn(format!("arn:tg/{n}"))
            .target_group_name(format!("tg-{n}"))
            .target_type(elb::types::TargetTypeEnum::Ip)
            .build()
    };
    let first = mock!(elb::Client::describe_target_groups)
        .match_requests(|r| r.marker().is_none() && r.page_size() == Some(400))
        .then_output(move || {
            DescribeTargetGroupsOutput::builder()
                .set_target_groups(Some((0..400).map(tg).collect()))
                .next_marker("page-2")
                .build()
        });
    let second = mock!(elb::Client::describe_target_groups)
        .match_requests(|r| r.marker() == Some("page-2"))
        .then_output(move || {
            DescribeTargetGroupsOutput::builder()
                .set_target_groups(Some((400..402).map(tg).collect()))
                .build()
        });
    let stateless = mock!(elb::Client::describe_target_health)
        .match_requests(|r| r.target_group_arn() == Some("arn:tg/1"))
        .then_output(|| {
            DescribeTargetHealthOutput::builder()
                .target_health_descriptions(
                    elb::types::TargetHealthDescription::builder()
                        .target(
                            elb::types::TargetDescription::builder()
                                .id("10.0.1.5")
                                .build(),
                        )
                        .build(),
                )
                .build()
        });
    let error = |code: &'static str| {
        move || {
            DescribeTargetHealthError::generic(
                ErrorMetadata::builder().code(code).message(code).build(),
            )
        }
    };
    let throttled = mock!(elb::Client::describe_target_health)
        .match_requests(|r| r.target_group_arn() == Some("arn:tg/2"))
        .then_error(error("Throttling"));
    let denied = mock!(elb::Client::describe_target_health)
        .match_requests(|r| r.target_group_arn() == Some("arn:tg/3"))
        .then_error(error("AccessDenied"));
    let gone = mock!(elb::Client::describe_target_health)
        .match_requests(|r| r.target_group_arn() == Some("arn:tg/4"))
        .then_error(error("TargetGroupNotFound"));
    let client: elb::Client = mock_client!(
        aws_sdk_elasticloadbalancingv2,
        RuleMode::MatchAny,
        &[&first, &second, &stateless, &throttled, &denied, &gone]
    );
    let cloud = AwsCloud::from_clients(
        aws_sdk_autoscaling::Client::from_conf(
            aws_sdk_autoscaling::Config::builder()
                .behavior_version_latest()
                .region(aws_sdk_autoscaling::config::Region::new("us-east-1"))
                .build(),
        ),
        aws_sdk_ec2::Client::from_conf(
            aws_sdk_ec2::Config::builder()
                .behavior_version_latest()
                .region(aws_sdk_ec2::config::Region::new("us-east-1"))
                .build(),
        ),
        aws_sdk_eks::Client::from_conf(
            aws_sdk_eks::Config::builder()
                .behavior_version_latest()
                .region(aws_sdk_eks::config::Region::new("us-east-1"))
                .build(),
        ),
    )
    .with_elb(client);

    let groups = cloud.target_groups().await.unwrap();
    assert_eq!(groups.len(), 402);
    assert_eq!((first.num_calls(), second.num_calls()), (1, 1));
    assert_eq!(groups[401].name, "tg-401");
    assert_eq!(groups[0].target_type, "ip");

    let h = cloud.target_health("arn:tg/1").await.unwrap();
    assert_eq!(h.len(), 1);
    assert!(!last_mile::is_out(&h[0].state), "{h:?}");
    let e = cloud.target_health("arn:tg/2").await.unwrap_err();
    assert!(matches!(e, CloudError::Throttled { .. }), "{e:?}");
    let e = cloud.target_health("arn:tg/3").await.unwrap_err();
    assert!(
        matches!(&e, CloudError::Rejected { code, .. } if code == "AccessDenied"),
        "{e:?}"
    );
    let e = cloud.target_health("arn:tg/4").await.unwrap_err();
    assert!(matches!(e, CloudError::NotFound { .. }), "{e:?}");
}
