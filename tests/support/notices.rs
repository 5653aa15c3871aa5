//! Queue messages in the shapes AWS sends, for the queue-mode tests.

/// An EventBridge event as EventBridge delivers it to SQS, sent now.
pub fn eventbridge(detail_type: &str, source: &str, detail: serde_json::Value) -> String {
    serde_json::json!({
        "version": "0",
        "id": "6a7e8feb-b491-4cf7-a9f1-bf3703467718",
        "detail-type": detail_type,
        "source": source,
        "account": "123456789012",
        "time": ca_asg_provider::clock::utc_now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "region": "us-east-1",
        "resources": [],
        "detail": detail,
    })
    .to_string()
}

/// An EC2 spot interruption warning for `iid`, sent now.
pub fn spot(iid: &str) -> String {
    eventbridge(
        "EC2 Spot Instance Interruption Warning",
        "aws.ec2",
        serde_json::json!({"instance-id": iid, "instance-action": "terminate"}),
    )
}

/// A spot interruption warning for `iid` that EC2 sent at `at`.
pub fn spot_at(iid: &str, at: chrono::DateTime<chrono::Utc>) -> String {
    let mut v: serde_json::Value = serde_json::from_str(&spot(iid)).unwrap();
    v["time"] = serde_json::json!(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    v.to_string()
}

/// An EC2 rebalance recommendation for `iid`, sent now.
pub fn rebalance(iid: &str) -> String {
    eventbridge(
        "EC2 Instance Rebalance Recommendation",
        "aws.ec2",
        serde_json::json!({"instance-id": iid}),
    )
}

/// An AWS Health scheduled retirement of `iid`, starting at `start`, sent now.
pub fn retirement_at(iid: &str, start: chrono::DateTime<chrono::Utc>) -> String {
    eventbridge(
        "AWS Health Event",
        "aws.health",
        serde_json::json!({
            "service": "EC2", "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
            "eventTypeCategory": "scheduledChange", "startTime": start.to_rfc2822(),
            "affectedEntities": [{"entityValue": iid}],
        }),
    )
}

/// [`retirement_at`] two hours from now.
pub fn retirement(iid: &str) -> String {
    retirement_at(
        iid,
        ca_asg_provider::clock::utc_now() + chrono::Duration::hours(2),
    )
}

/// The ASG's EC2_INSTANCE_TERMINATING notification for `iid` of `group` under
/// `hook`, as the hook's notification target gets it, sent at `at`; without
/// `LifecycleActionToken` when `token` is `None` (a forged or cut message).
pub fn lifecycle_at(
    group: &str,
    iid: &str,
    hook: &str,
    token: Option<&str>,
    at: chrono::DateTime<chrono::Utc>,
) -> String {
    let mut v = serde_json::json!({
        "Origin": "AutoScalingGroup", "Destination": "EC2", "Service": "AWS Auto Scaling",
        "Time": at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "AccountId": "123456789012",
        "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING", "RequestId": "r",
        "AutoScalingGroupName": group, "LifecycleHookName": hook, "EC2InstanceId": iid,
    });
    if let Some(t) = token {
        v["LifecycleActionToken"] = t.into();
    }
    v.to_string()
}

/// [`lifecycle`] for an instance going back into its group's warm pool (a scale-in
/// under ReuseOnScaleIn): `Destination` is `WarmPool`.
pub fn lifecycle_into_pool(group: &str, iid: &str, hook: &str, token: Option<&str>) -> String {
    let mut v: serde_json::Value =
        serde_json::from_str(&lifecycle(group, iid, hook, token)).expect("our own JSON");
    v["Destination"] = "WarmPool".into();
    v.to_string()
}

/// [`lifecycle_at`] sent now, as AWS stamps it.
pub fn lifecycle(group: &str, iid: &str, hook: &str, token: Option<&str>) -> String {
    lifecycle_at(group, iid, hook, token, ca_asg_provider::clock::utc_now())
}
