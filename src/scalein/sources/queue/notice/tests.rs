//! The shapes AWS documents for each event, and what is wrong with bad ones.

use super::*;

fn eb(detail_type: &str, source: &str, detail: &str) -> String {
    format!(
        r#"{{"version":"0","id":"7bf73129-1428-4cd3-a780-95db273d1602","detail-type":"{detail_type}","source":"{source}","account":"123456789012","time":"2026-11-23T10:00:00Z","region":"us-east-1","resources":["arn:aws:ec2:us-east-1a:instance/i-0abc123"],"detail":{detail}}}"#
    )
}

fn at(s: &str) -> Option<DateTime<Utc>> {
    Some(DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc))
}

#[test]
fn spot_interruption_warning() {
    let n = parse(&eb(
        "EC2 Spot Instance Interruption Warning",
        "aws.ec2",
        r#"{"instance-id":"i-0abc123","instance-action":"terminate"}"#,
    ))
    .unwrap();
    assert_eq!(
        n,
        Notice::Spot {
            instance_id: "i-0abc123".into(),
            time: at("2026-11-23T10:00:00Z")
        }
    );
    assert_eq!(n.kind(), "spot_interruption");
}

#[test]
fn rebalance_recommendation() {
    let n = parse(&eb(
        "EC2 Instance Rebalance Recommendation",
        "aws.ec2",
        r#"{"instance-id":"i-0abc123"}"#,
    ))
    .unwrap();
    assert!(matches!(n, Notice::Rebalance { ref instance_id, .. } if instance_id == "i-0abc123"));
}

#[test]
fn state_change() {
    let n = parse(&eb(
        "EC2 Instance State-change Notification",
        "aws.ec2",
        r#"{"instance-id":"i-0abc123","state":"stopping"}"#,
    ))
    .unwrap();
    assert!(matches!(n, Notice::StateChange { ref state, .. } if state == "stopping"));
}

#[test]
fn health_scheduled_change_with_the_health_time_format() {
    let n = parse(&eb(
        "AWS Health Event",
        "aws.health",
        r#"{"eventArn":"arn:aws:health:us-east-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/x","service":"EC2","eventTypeCode":"AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED","eventTypeCategory":"scheduledChange","startTime":"Mon, 30 Nov 2026 15:10:09 GMT","endTime":"Mon, 30 Nov 2026 16:10:09 GMT","eventDescription":[{"language":"en_US","latestDescription":"retirement"}],"affectedEntities":[{"entityValue":"i-0abc123"},{"entityValue":"i-0def456"}]}"#,
    ))
    .unwrap();
    assert_eq!(
        n,
        Notice::Scheduled {
            instance_ids: vec!["i-0abc123".into(), "i-0def456".into()],
            event_type: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED".into(),
            start: at("2026-11-30T15:10:09Z"),
            time: at("2026-11-23T10:00:00Z"),
        }
    );
}

#[test]
fn health_events_of_other_categories_are_nothing() {
    let n = parse(&eb(
        "AWS Health Event",
        "aws.health",
        r#"{"service":"EC2","eventTypeCode":"AWS_EC2_OPERATIONAL_ISSUE","eventTypeCategory":"issue"}"#,
    ))
    .unwrap();
    assert!(matches!(n, Notice::Nothing(_)));
}

const LIFECYCLE_DETAIL: &str = r#"{"LifecycleActionToken":"87654321-4321-4321-4321-210987654321","AutoScalingGroupName":"web","LifecycleHookName":"ca-asg-provider-drain","EC2InstanceId":"i-0abc123","LifecycleTransition":"autoscaling:EC2_INSTANCE_TERMINATING","NotificationMetadata":"x","Origin":"AutoScalingGroup","Destination":"EC2"}"#;

fn expected_action() -> LifecycleAction {
    LifecycleAction {
        group: "web".into(),
        hook: "ca-asg-provider-drain".into(),
        instance_id: "i-0abc123".into(),
        token: Some("87654321-4321-4321-4321-210987654321".into()),
    }
}

#[test]
fn lifecycle_action_through_eventbridge() {
    let n = parse(&eb(
        "EC2 Instance-terminate Lifecycle Action",
        "aws.autoscaling",
        LIFECYCLE_DETAIL,
    ))
    .unwrap();
    assert_eq!(
        n,
        Notice::LifecycleTerminate {
            action: expected_action(),
            time: at("2026-11-23T10:00:00Z")
        }
    );
}

#[test]
fn lifecycle_action_from_the_hooks_own_notification() {
    let body = r#"{"Origin":"AutoScalingGroup","Destination":"EC2","Service":"AWS Auto Scaling","Time":"2026-11-23T10:00:05.123Z","AccountId":"123456789012","LifecycleTransition":"autoscaling:EC2_INSTANCE_TERMINATING","RequestId":"abc","AutoScalingGroupName":"web","LifecycleHookName":"ca-asg-provider-drain","EC2InstanceId":"i-0abc123","LifecycleActionToken":"87654321-4321-4321-4321-210987654321"}"#;
    let n = parse(body).unwrap();
    assert!(
        matches!(n, Notice::LifecycleTerminate { ref action, .. } if *action == expected_action())
    );
    assert_eq!(n.time(), at("2026-11-23T10:00:05.123Z"));
    // The same through SNS.
    let sns =
        serde_json::json!({"Type": "Notification", "MessageId": "m", "Message": body}).to_string();
    assert_eq!(parse(&sns).unwrap(), n);
}

#[test]
fn test_notification_and_launches_are_nothing() {
    let test = r#"{"AccountId":"123456789012","RequestId":"r","AutoScalingGroupARN":"arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:x:autoScalingGroupName/web","AutoScalingGroupName":"web","Service":"AWS Auto Scaling","Event":"autoscaling:TEST_NOTIFICATION","Time":"2026-11-23T10:00:00Z"}"#;
    assert!(
        matches!(parse(test).unwrap(), Notice::Nothing(ref w) if w.contains("test notification of group web"))
    );
    let launch = LIFECYCLE_DETAIL.replace("EC2_INSTANCE_TERMINATING", "EC2_INSTANCE_LAUNCHING");
    assert!(matches!(parse(&launch).unwrap(), Notice::Nothing(_)));
    let other = eb("EC2 Instance Launch Successful", "aws.autoscaling", "{}");
    assert!(matches!(parse(&other).unwrap(), Notice::Nothing(_)));
}

#[test]
fn poison_messages_say_what_is_wrong() {
    let cases = [
        ("not json", "not JSON"),
        ("[1,2]", "not a JSON object"),
        (r#"{"hello":"world"}"#, "neither an EventBridge event"),
        (r#"{"Type":"Notification","Message":5}"#, "SNS envelope"),
        (
            &eb("EC2 Spot Instance Interruption Warning", "aws.ec2", "{}"),
            "instance-id is missing",
        ),
        (
            &eb(
                "EC2 Spot Instance Interruption Warning",
                "aws.ec2",
                r#"{"instance-id":"web-1; rm -rf"}"#,
            ),
            "is not an EC2 instance id",
        ),
        (
            &eb("EC2 Spot Instance Interruption Warning", "aws.ec2", "5"),
            "detail is missing",
        ),
        (
            &LIFECYCLE_DETAIL.replace("EC2_INSTANCE_TERMINATING", "EC2_INSTANCE_EXPLODING"),
            "LifecycleTransition \"autoscaling:EC2_INSTANCE_EXPLODING\" is unknown",
        ),
        (
            &LIFECYCLE_DETAIL.replace(r#""LifecycleHookName":"ca-asg-provider-drain","#, ""),
            "LifecycleHookName is missing",
        ),
        (
            &eb(
                "AWS Health Event",
                "aws.health",
                r#"{"service":"EC2","eventTypeCode":"X","eventTypeCategory":"scheduledChange","affectedEntities":[]}"#,
            ),
            "affectedEntities is empty",
        ),
    ];
    for (body, want) in cases {
        let e = parse(body).expect_err(body);
        assert!(e.contains(want), "{body}: {e}");
    }
}

mod any_body {
    use super::*;
    use proptest::prelude::*;

    /// A body of the shapes the queue carries, with every field free: strings where
    /// numbers go, huge or negative times, missing parts.
    fn eventish() -> impl Strategy<Value = String> {
        let value = prop_oneof![
            Just("null".to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|n| format!("{n:?}")),
            ".{0,24}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            Just(r#"{"instance-id":"i-0abc"}"#.to_string()),
        ];
        let keys = prop::sample::select(vec![
            "detail-type",
            "source",
            "time",
            "detail",
            "instance-id",
            "instance-action",
            "LifecycleTransition",
            "EC2InstanceId",
            "AutoScalingGroupName",
            "LifecycleActionToken",
            "LifecycleHookName",
            "Event",
            "not-before",
            "startTime",
        ]);
        proptest::collection::vec((keys, value), 0..8).prop_map(|kv| {
            let fields: Vec<String> = kv.iter().map(|(k, v)| format!("{k:?}:{v}")).collect();
            format!("{{{}}}", fields.join(","))
        })
    }

    proptest! {
        /// Whatever arrives on the queue, parsing answers (a notice or an error naming
        /// what is wrong) and never panics.
        #[test]
        fn any_string_parses_or_is_refused(body in ".{0,200}") {
            let _ = parse(&body);
        }

        #[test]
        fn any_event_shaped_body_parses_or_is_refused(body in eventish()) {
            if let Err(e) = parse(&body) {
                prop_assert!(!e.is_empty(), "a refusal says why");
            }
        }
    }
}

/// Every shape a warm pool's lifecycle transitions take (issue 47), through
/// EventBridge, the hook's own notification and SNS: the terminating transition is a
/// hold whatever its Origin and Destination (back into the pool: Destination
/// WarmPool; the pool ending an instance: Origin WarmPool, Destination EC2), and
/// the consumer asks AWS where the instance waits; every launching transition
/// (warming up into the pool, leaving the pool for the group) is nothing.
#[test]
fn warm_pool_transitions_in_every_shape() {
    let with = |transition: &str, origin: &str, destination: &str| {
        LIFECYCLE_DETAIL
            .replace("EC2_INSTANCE_TERMINATING", transition)
            .replace(
                r#""Origin":"AutoScalingGroup","Destination":"EC2""#,
                &format!(r#""Origin":"{origin}","Destination":"{destination}""#),
            )
    };
    let holds = [
        ("AutoScalingGroup", "WarmPool"),
        ("WarmPool", "EC2"),
        ("AutoScalingGroup", "EC2"),
    ];
    for (origin, destination) in holds {
        let detail = with("EC2_INSTANCE_TERMINATING", origin, destination);
        let own = detail.replace(
            r#"{"LifecycleActionToken""#,
            r#"{"Service":"AWS Auto Scaling","Time":"2026-11-23T10:00:05Z","LifecycleActionToken""#,
        );
        let sns = serde_json::json!({"Type": "Notification", "MessageId": "m", "Message": own})
            .to_string();
        for body in [
            eb(
                "EC2 Instance-terminate Lifecycle Action",
                "aws.autoscaling",
                &detail,
            ),
            own.clone(),
            sns,
        ] {
            let n = parse(&body).unwrap_or_else(|e| panic!("{origin} -> {destination}: {e}"));
            assert!(
                matches!(n, Notice::LifecycleTerminate { ref action, .. } if *action == expected_action()),
                "{origin} -> {destination}: {n:?}"
            );
        }
    }
    let launches = [
        ("EC2", "WarmPool"),
        ("WarmPool", "AutoScalingGroup"),
        ("EC2", "AutoScalingGroup"),
    ];
    for (origin, destination) in launches {
        let detail = with("EC2_INSTANCE_LAUNCHING", origin, destination);
        for body in [
            eb(
                "EC2 Instance-launch Lifecycle Action",
                "aws.autoscaling",
                &detail,
            ),
            detail.clone(),
        ] {
            assert!(
                matches!(parse(&body).unwrap(), Notice::Nothing(_)),
                "{origin} -> {destination}"
            );
        }
    }
}
