//! Queue mode against moto: deploy/aws/interruption-queue.yaml deployed through
//! CloudFormation, events put through EventBridge land on the SQS queue its rules
//! target, and the consumer on the real SQS client drains the node on the in-memory
//! API server (the ASGs are the memory cloud's: moto has no lifecycle wait states).

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_cloudformation as cfn;
use aws_sdk_eventbridge as eventbridge;
use ca_asg_provider::cloud::aws::sqs::SqsQueue;
use ca_asg_provider::cloud::queue::Queue;
use ca_asg_provider::scalein::settings::InterruptionSettings;
use ca_asg_provider::scalein::sources::queue::Consumer;
use ca_asg_provider::scalein::Outcome;
use k8s_openapi::api::core::v1::Pod;

mod support;
use support::eventually;
use support::moto::MotoServer;
use support::world::*;

/// Deploys the shipped template; returns the queue's URL.
async fn deploy_stack(cfg: &aws_config::SdkConfig) -> String {
    let template = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/aws/interruption-queue.yaml"),
    )
    .unwrap();
    let cf = cfn::Client::new(cfg);
    cf.create_stack()
        .stack_name("ca-asg-provider-queue")
        .template_body(template)
        .parameters(
            cfn::types::Parameter::builder()
                .parameter_key("QueueName")
                .parameter_value("ca-asg-provider-test")
                .build(),
        )
        .send()
        .await
        .expect("the template deploys");
    let stack = cf
        .describe_stacks()
        .stack_name("ca-asg-provider-queue")
        .send()
        .await
        .unwrap()
        .stacks
        .unwrap()
        .remove(0);
    assert_eq!(
        stack.stack_status,
        Some(cfn::types::StackStatus::CreateComplete),
        "{:?}",
        stack.stack_status_reason
    );
    stack
        .outputs
        .unwrap_or_default()
        .into_iter()
        .find(|o| o.output_key.as_deref() == Some("QueueURL"))
        .and_then(|o| o.output_value)
        .expect("the QueueURL output")
}

fn entry(
    source: &str,
    detail_type: &str,
    detail: serde_json::Value,
) -> eventbridge::types::PutEventsRequestEntry {
    eventbridge::types::PutEventsRequestEntry::builder()
        .source(source)
        .detail_type(detail_type)
        .detail(detail.to_string())
        .build()
}

#[tokio::test]
async fn events_through_eventbridge_reach_the_drain_through_sqs() {
    let moto = MotoServer::start();
    let cfg = moto.sdk_config().await;
    let url = deploy_stack(&cfg).await;

    // The five rules exist and target the queue.
    let eb = eventbridge::Client::new(&cfg);
    let rules = eb
        .list_rules()
        .send()
        .await
        .unwrap()
        .rules
        .unwrap_or_default();
    assert_eq!(rules.len(), 5, "{rules:?}");
    for r in &rules {
        let targets = eb
            .list_targets_by_rule()
            .rule(r.name.clone().unwrap())
            .send()
            .await
            .unwrap()
            .targets
            .unwrap_or_default();
        assert!(
            targets
                .iter()
                .any(|t| t.arn.ends_with(":ca-asg-provider-test")),
            "{:?} -> {targets:?}",
            r.name
        );
    }

    let w = World::builder().web(3, 2).build().await;
    let web = nodes_of(&w, "web");
    let ((node, iid), other) = (web[0].clone(), web[1].clone());
    w.put(&ca_asg_provider::sim::fixtures::daemonset(
        "logging", "fluentd", 0.2, false,
    ));
    w.put(&ca_asg_provider::sim::fixtures::pod(
        "shop", "app", &node, "app", 1.0,
    ));
    pods_ready(&w, 3).await;
    let sqs = aws_sdk_sqs::Client::new(&cfg);
    let queue = Arc::new(SqsQueue::from_client(sqs.clone(), &url));
    let consumer = Consumer::new(
        w.engine.clone(),
        w.provider.clone(),
        queue.clone() as Arc<dyn Queue>,
        InterruptionSettings {
            wait: Duration::from_secs(1),
            ..Default::default()
        },
    );
    let task = consumer.spawn();

    // check-config's queue report: this queue answers, a missing one does not.
    let settings = InterruptionSettings::default();
    assert!(ca_asg_provider::commands::check::queue_report(&queue, &url, &settings).await);
    let missing = url.replace("ca-asg-provider-test", "no-such-queue");
    let gone = SqsQueue::from_client(sqs.clone(), &missing);
    assert!(!ca_asg_provider::commands::check::queue_report(&gone, &missing, &settings).await);

    // A spot warning and a rebalance recommendation, as EC2 sends them; an event no
    // rule matches never reaches the queue.
    let put = eb
        .put_events()
        .entries(entry(
            "aws.ec2",
            "EC2 Spot Instance Interruption Warning",
            serde_json::json!({"instance-id": iid, "instance-action": "terminate"}),
        ))
        .entries(entry(
            "aws.ec2",
            "EC2 Instance Rebalance Recommendation",
            serde_json::json!({"instance-id": other.1}),
        ))
        .entries(entry(
            "aws.ec2",
            "EC2 Instance State-change Notification",
            serde_json::json!({"instance-id": other.1, "state": "running"}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(put.failed_entry_count, 0);
    // A poison message and the ASG's own test notification, sent straight to SQS.
    for body in [
        "{ not json".to_string(),
        serde_json::json!({"AccountId": "123456789012", "RequestId": "r", "AutoScalingGroupName": "web", "Service": "AWS Auto Scaling", "Event": "autoscaling:TEST_NOTIFICATION", "Time": "2026-11-23T10:00:00Z"}).to_string(),
    ] {
        sqs.send_message()
            .queue_url(&url)
            .message_body(body)
            .send()
            .await
            .unwrap();
    }

    eventually("the spot drain starts", 20, || w.engine.is_draining(&iid)).await;
    assert_eq!(w.engine.wait_for(&iid).await, Some(Outcome::Drained));
    let pods = w.sim.list::<Pod>();
    assert!(
        pods.iter().all(|p| p["spec"]["nodeName"] != node.as_str()
            || !p["metadata"]["deletionTimestamp"].is_null()),
        "the spot node is drained"
    );
    eventually("the rebalanced node is cordoned", 20, || {
        w.sim
            .get::<k8s_openapi::api::core::v1::Node>("", &other.0)
            .is_some_and(|n| n["spec"]["unschedulable"] == true)
    })
    .await;
    // Every message was handled or dropped, and deleted: nothing waits or is in flight.
    let mut left = u64::MAX;
    for _ in 0..100 {
        left = queue.waiting().await.unwrap();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(left, 0, "messages left in the queue");
    task.abort();
    let got = queue.receive(10, Duration::ZERO).await.unwrap();
    assert!(got.is_empty(), "{got:?}");
}
