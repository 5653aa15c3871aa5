//! What moto does not model, through the SDK's own mock layer: scaling activities,
//! lifecycle actions and heartbeats, throttles and server errors.

use std::sync::{Arc, Mutex};

use aws_sdk_autoscaling as asg;
use aws_sdk_autoscaling::operation::complete_lifecycle_action::{
    CompleteLifecycleActionError, CompleteLifecycleActionOutput,
};
use aws_sdk_autoscaling::operation::describe_auto_scaling_groups::{
    DescribeAutoScalingGroupsError, DescribeAutoScalingGroupsOutput,
};
use aws_sdk_autoscaling::operation::describe_scaling_activities::DescribeScalingActivitiesOutput;
use aws_sdk_autoscaling::operation::record_lifecycle_action_heartbeat::RecordLifecycleActionHeartbeatOutput;
use aws_sdk_autoscaling::Client;
use aws_smithy_mocks::{mock, mock_client, Rule, RuleMode};
use aws_smithy_types::error::ErrorMetadata;
use ca_asg_provider::cloud::aws::AwsCloud;
use ca_asg_provider::cloud::{Cloud, CloudError, LifecycleAction, LifecycleResult};

fn cloud(rules: &[&Rule]) -> AwsCloud {
    let asg_client: Client = mock_client!(aws_sdk_autoscaling, RuleMode::MatchAny, rules);
    let ec2_client = aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::Config::builder()
            .behavior_version_latest()
            .region(aws_sdk_ec2::config::Region::new("us-east-1"))
            .build(),
    );
    cloud_with_ec2(asg_client, ec2_client)
}

fn cloud_with_ec2(asg_client: Client, ec2_client: aws_sdk_ec2::Client) -> AwsCloud {
    let eks_client = aws_sdk_eks::Client::from_conf(
        aws_sdk_eks::Config::builder()
            .behavior_version_latest()
            .region(aws_sdk_eks::config::Region::new("us-east-1"))
            .build(),
    );
    AwsCloud::from_clients(asg_client, ec2_client, eks_client)
}

/// DescribeAutoScalingGroups' answer: one group `name` (0 to 5, none desired) with a
/// mixed instances policy on launch template `lt-1` (at `version`) and `overrides`.
fn mixed_group(
    name: &str,
    version: Option<&str>,
    overrides: Vec<asg::types::LaunchTemplateOverrides>,
) -> DescribeAutoScalingGroupsOutput {
    let template = asg::types::LaunchTemplate::builder()
        .launch_template_specification(
            asg::types::LaunchTemplateSpecification::builder()
                .launch_template_id("lt-1")
                .set_version(version.map(str::to_string))
                .build(),
        )
        .set_overrides(Some(overrides))
        .build();
    let policy = asg::types::MixedInstancesPolicy::builder()
        .launch_template(template)
        .build();
    DescribeAutoScalingGroupsOutput::builder()
        .auto_scaling_groups(
            asg::types::AutoScalingGroup::builder()
                .auto_scaling_group_name(name)
                .min_size(0)
                .max_size(5)
                .desired_capacity(0)
                .mixed_instances_policy(policy)
                .build(),
        )
        .build()
}

/// A mixed instances policy's override of an instance type.
fn of_type(instance_type: &str) -> asg::types::LaunchTemplateOverrides {
    asg::types::LaunchTemplateOverrides::builder()
        .instance_type(instance_type)
        .build()
}

fn action(token: Option<&str>) -> LifecycleAction {
    LifecycleAction {
        group: "web".into(),
        hook: "drain".into(),
        instance_id: "i-0abc".into(),
        token: token.map(str::to_string),
    }
}

#[tokio::test]
async fn launch_history_has_failed_activities_newest_first_and_the_newest_launch() {
    let rule = mock!(Client::describe_scaling_activities)
        .match_requests(|r| r.auto_scaling_group_name() == Some("web"))
        .then_output(|| {
            let act = |code: &str, msg: &str, secs: i64| {
                let description = if msg == "terminated" {
                    "Terminating EC2 instance: i-0ded".to_string()
                } else if code == "Failed" {
                    format!("Launching a new EC2 instance.  Status Reason: {msg}")
                } else {
                    "Launching a new EC2 instance: i-0new".to_string()
                };
                asg::types::Activity::builder()
                    .activity_id(format!("a-{secs}"))
                    .description(description)
                    .auto_scaling_group_name("web")
                    .cause("c")
                    .start_time(aws_smithy_types::DateTime::from_secs(secs))
                    .status_code(asg::types::ScalingActivityStatusCode::from(code))
                    .status_message(msg)
                    .build()
            };
            DescribeScalingActivitiesOutput::builder()
                .activities(act("Successful", "ok", 100))
                .activities(act("Failed", "We currently do not have sufficient m5.large capacity. InsufficientInstanceCapacity", 200))
                .activities(act("Failed", "You have requested more vCPU capacity than your current vCPU limit. VcpuLimitExceeded", 300))
                .activities(act("InProgress", "launching", 350))
                .activities(act("Successful", "terminated", 400))
                .build()
        });
    let c = cloud(&[&rule]);
    let h = c.launch_history("web").await.unwrap();
    // The newest launch, in progress; the later termination is no launch.
    assert_eq!(h.last_launch_unix, Some(350));
    let f = h.failures;
    assert_eq!(f.len(), 2);
    assert_eq!(
        (f[0].code.as_str(), f[0].started_at_unix),
        ("VcpuLimitExceeded", 300)
    );
    assert_eq!(f[1].code, "InsufficientInstanceCapacity");
    assert!(f[1].message.contains("m5.large"));
}

#[tokio::test]
async fn complete_lifecycle_action_sends_group_hook_instance_token_and_result() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let rule = mock!(Client::complete_lifecycle_action)
        .match_requests(move |r| {
            s.lock().unwrap().push((
                r.auto_scaling_group_name().map(str::to_string),
                r.lifecycle_hook_name().map(str::to_string),
                r.instance_id().map(str::to_string),
                r.lifecycle_action_token().map(str::to_string),
                r.lifecycle_action_result().map(str::to_string),
            ));
            true
        })
        .then_output(|| CompleteLifecycleActionOutput::builder().build());
    let c = cloud(&[&rule]);
    c.complete_lifecycle_action(&action(Some("tok-123")), LifecycleResult::Continue)
        .await
        .unwrap();
    c.complete_lifecycle_action(&action(None), LifecycleResult::Abandon)
        .await
        .unwrap();
    let seen = seen.lock().unwrap();
    let s = |x: &str| Some(x.to_string());
    assert_eq!(
        seen[0],
        (
            s("web"),
            s("drain"),
            s("i-0abc"),
            s("tok-123"),
            s("CONTINUE")
        )
    );
    assert_eq!(
        seen[1],
        (s("web"), s("drain"), s("i-0abc"), None, s("ABANDON"))
    );
}

#[tokio::test]
async fn heartbeat_names_the_action() {
    let rule = mock!(Client::record_lifecycle_action_heartbeat)
        .match_requests(|r| {
            r.auto_scaling_group_name() == Some("web")
                && r.lifecycle_hook_name() == Some("drain")
                && r.instance_id() == Some("i-0abc")
        })
        .then_output(|| RecordLifecycleActionHeartbeatOutput::builder().build());
    let c = cloud(&[&rule]);
    c.lifecycle_heartbeat(&action(None)).await.unwrap();
    assert_eq!(rule.num_calls(), 1);
}

#[tokio::test]
async fn throttles_and_server_errors_are_classified() {
    let throttle = mock!(Client::describe_auto_scaling_groups).then_error(|| {
        DescribeAutoScalingGroupsError::generic(
            ErrorMetadata::builder()
                .code("Throttling")
                .message("Rate exceeded")
                .build(),
        )
    });
    let c = cloud(&[&throttle]);
    let sel = ca_asg_provider::world::named(&["web"]);
    let e = c.describe_groups(&sel).await.unwrap_err();
    assert!(matches!(e, CloudError::Throttled { .. }), "{e:?}");
    assert!(e.is_retryable());
    assert_eq!(
        c.calls().snapshot().get(&(
            "DescribeAutoScalingGroups".to_string(),
            "throttled".to_string()
        )),
        Some(&1)
    );

    let boom = mock!(Client::describe_auto_scaling_groups).then_http_response(|| {
        aws_smithy_runtime_api::http::Response::new(
            aws_smithy_runtime_api::http::StatusCode::try_from(500).unwrap(),
            aws_smithy_types::body::SdkBody::from("<html>Internal Server Error</html>"),
        )
    });
    let c = cloud(&[&boom]);
    let e = c.describe_groups(&sel).await.unwrap_err();
    assert!(matches!(e, CloudError::Transient { .. }), "{e:?}");

    let rejected = mock!(Client::complete_lifecycle_action).then_error(|| {
        CompleteLifecycleActionError::generic(
            ErrorMetadata::builder()
                .code("ValidationError")
                .message("No active Lifecycle Action found with instance ID i-0abc")
                .build(),
        )
    });
    let c = cloud(&[&rejected]);
    let e = c
        .complete_lifecycle_action(&action(None), LifecycleResult::Continue)
        .await
        .unwrap_err();
    match e {
        CloudError::Rejected { code, message, .. } => {
            assert_eq!(code, "ValidationError");
            assert!(message.contains("No active Lifecycle Action"));
        }
        other => panic!("{other:?}"),
    }
}

/// A credentials provider that has none, as the SDK's default chain is in a pod that
/// neither IRSA nor EKS Pod Identity reached.
#[derive(Debug)]
struct NoCredentials;

impl aws_credential_types::provider::ProvideCredentials for NoCredentials {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::ready(Err(
            aws_credential_types::provider::error::CredentialsError::not_loaded(
                "no providers in chain provided credentials",
            ),
        ))
    }
}

/// Through the real SDK client (not a constructed error): a call made without
/// credentials is a `Credentials` error that says so and is not retried as a passing
/// failure. No request leaves: credentials are resolved before the request is sent
/// (the endpoint is a closed local port all the same).
#[tokio::test]
async fn a_call_without_credentials_is_a_credentials_error_not_a_transient_one() {
    let asg_client = Client::from_conf(
        aws_sdk_autoscaling::Config::builder()
            .behavior_version_latest()
            .region(aws_sdk_autoscaling::config::Region::new("us-east-1"))
            .endpoint_url("http://127.0.0.1:9")
            .credentials_provider(NoCredentials)
            .build(),
    );
    let ec2_client = aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::Config::builder()
            .behavior_version_latest()
            .region(aws_sdk_ec2::config::Region::new("us-east-1"))
            .build(),
    );
    let c = cloud_with_ec2(asg_client, ec2_client);
    let sel = ca_asg_provider::world::named(&["web"]);
    let e = c.describe_groups(&sel).await.unwrap_err();
    assert!(matches!(e, CloudError::Credentials { .. }), "{e:?}");
    assert!(!e.is_retryable());
    let text = e.to_string();
    assert!(
        text.starts_with(
            "AWS DescribeAutoScalingGroups: no AWS credentials, a credentials problem"
        ),
        "{text}"
    );
    assert!(
        text.contains("no providers in chain provided credentials"),
        "{text}"
    );
    // What to check (the hint follows this process's environment).
    assert!(
        text.contains("IRSA") || text.contains("Pod Identity"),
        "{text}"
    );
    assert!(!text.contains("transient"), "{text}");
    assert_eq!(
        c.calls().snapshot().get(&(
            "DescribeAutoScalingGroups".to_string(),
            "credentials".to_string()
        )),
        Some(&1)
    );
}

#[tokio::test]
async fn mixed_instances_overrides_are_read_in_order() {
    let rule = mock!(Client::describe_auto_scaling_groups).then_output(|| {
        mixed_group(
            "mixed",
            Some("3"),
            vec![of_type("m5.xlarge"), of_type("m5a.xlarge")],
        )
    });
    let c = cloud(&[&rule]);
    let g = c
        .describe_groups(&ca_asg_provider::world::named(&["mixed"]))
        .await
        .unwrap()
        .remove(0);
    match g.launch {
        ca_asg_provider::cloud::LaunchSpec::MixedInstances {
            template,
            override_types,
            requirements,
        } => {
            assert_eq!(requirements, None);
            assert_eq!(template.id.as_deref(), Some("lt-1"));
            assert_eq!(template.version.as_deref(), Some("3"));
            assert_eq!(override_types, vec!["m5.xlarge", "m5a.xlarge"]);
        }
        other => panic!("{other:?}"),
    }
}

/// Attribute-based selection, which moto does not model: the policy's single override
/// with InstanceRequirements is read, and the type lookup asks AWS with the AMI's
/// architecture and the requirements, taking AWS's first answer.
#[tokio::test]
async fn instance_requirements_are_read_and_looked_up_with_the_amis_architecture() {
    use aws_sdk_ec2::operation::describe_images::DescribeImagesOutput;
    use aws_sdk_ec2::operation::get_instance_types_from_instance_requirements::GetInstanceTypesFromInstanceRequirementsOutput;
    let groups = mock!(Client::describe_auto_scaling_groups).then_output(|| {
        let requirements = asg::types::InstanceRequirements::builder()
            .v_cpu_count(
                asg::types::VCpuCountRequest::builder()
                    .min(4)
                    .max(16)
                    .build(),
            )
            .memory_mib(asg::types::MemoryMiBRequest::builder().min(16384).build())
            .accelerator_manufacturers(asg::types::AcceleratorManufacturer::Nvidia)
            .accelerator_types(asg::types::AcceleratorType::Gpu)
            .accelerator_count(
                asg::types::AcceleratorCountRequest::builder()
                    .min(1)
                    .build(),
            )
            .excluded_instance_types("g3*")
            .build();
        let with_requirements = asg::types::LaunchTemplateOverrides::builder()
            .instance_requirements(requirements)
            .build();
        mixed_group("abs", None, vec![with_requirements])
    });
    let images = mock!(aws_sdk_ec2::Client::describe_images)
        .match_requests(|r| r.image_ids() == ["ami-arm"])
        .then_output(|| {
            DescribeImagesOutput::builder()
                .images(
                    aws_sdk_ec2::types::Image::builder()
                        .image_id("ami-arm")
                        .architecture(aws_sdk_ec2::types::ArchitectureValues::Arm64)
                        .build(),
                )
                .build()
        });
    let seen = Arc::new(Mutex::new(None));
    let seen_in = seen.clone();
    let types = mock!(aws_sdk_ec2::Client::get_instance_types_from_instance_requirements)
        .match_requests(move |r| {
            *seen_in.lock().unwrap() = Some(r.clone());
            true
        })
        .then_output(|| {
            GetInstanceTypesFromInstanceRequirementsOutput::builder()
                .instance_types(
                    aws_sdk_ec2::types::InstanceTypeInfoFromInstanceRequirements::builder()
                        .instance_type("g5g.xlarge")
                        .build(),
                )
                .instance_types(
                    aws_sdk_ec2::types::InstanceTypeInfoFromInstanceRequirements::builder()
                        .instance_type("g5g.2xlarge")
                        .build(),
                )
                .build()
        });
    let asg_client: Client = mock_client!(aws_sdk_autoscaling, RuleMode::MatchAny, [&groups]);
    let ec2_client: aws_sdk_ec2::Client =
        mock_client!(aws_sdk_ec2, RuleMode::MatchAny, [&images, &types]);
    let c = cloud_with_ec2(asg_client, ec2_client);
    let g = c
        .describe_groups(&ca_asg_provider::world::named(&["abs"]))
        .await
        .unwrap()
        .remove(0);
    let req = match g.launch {
        ca_asg_provider::cloud::LaunchSpec::MixedInstances {
            override_types,
            requirements,
            ..
        } => {
            assert!(override_types.is_empty());
            requirements.expect("the override's InstanceRequirements")
        }
        other => panic!("{other:?}"),
    };
    assert_eq!((req.vcpu_min, req.vcpu_max), (4, Some(16)));
    assert_eq!((req.memory_mib_min, req.memory_mib_max), (16384, None));
    assert_eq!(req.nvidia_gpus_min, Some(1));
    assert_eq!(req.excluded_types, vec!["g3*"]);
    let found = c
        .instance_types_for_requirements(&req, Some("ami-arm"))
        .await
        .unwrap();
    assert_eq!(found, vec!["g5g.xlarge", "g5g.2xlarge"]);
    let sent = seen.lock().unwrap().clone().expect("the lookup was made");
    assert_eq!(
        sent.architecture_types(),
        [aws_sdk_ec2::types::ArchitectureType::Arm64]
    );
    let r = sent.instance_requirements().unwrap();
    assert_eq!(r.v_cpu_count().unwrap().min(), Some(4));
    assert_eq!(r.v_cpu_count().unwrap().max(), Some(16));
    assert_eq!(r.memory_mib().unwrap().min(), Some(16384));
    assert_eq!(r.accelerator_count().unwrap().min(), Some(1));
    assert_eq!(r.excluded_instance_types(), ["g3*"]);
}

/// DescribeWarmPool, which moto answers with no instances: every page is read (the
/// token of one asks for the next), each instance with its `Warmed:*` state.
#[tokio::test]
async fn a_warm_pools_instances_are_read_page_by_page() {
    use aws_sdk_autoscaling::operation::describe_warm_pool::DescribeWarmPoolOutput;
    use aws_sdk_autoscaling::types::{Instance, LifecycleState as AwsState};
    let instance = |id: &str, state: &str| {
        Instance::builder()
            .instance_id(id)
            .availability_zone("us-east-1a")
            .lifecycle_state(AwsState::from(state))
            .instance_type("m5.large")
            .health_status("Healthy")
            .protected_from_scale_in(false)
            .build()
    };
    let first = mock!(Client::describe_warm_pool)
        .match_requests(|r| r.auto_scaling_group_name() == Some("web") && r.next_token().is_none())
        .then_output(move || {
            DescribeWarmPoolOutput::builder()
                .instances(instance("i-0one", "Warmed:Pending:Wait"))
                .next_token("page-2")
                .build()
        });
    let second = mock!(Client::describe_warm_pool)
        .match_requests(|r| r.next_token() == Some("page-2") && r.max_records() == Some(50))
        .then_output(move || {
            DescribeWarmPoolOutput::builder()
                .instances(instance("i-0two", "Warmed:Stopped"))
                .build()
        });
    let c = cloud(&[&first, &second]);
    let got = c.warm_pool_instances("web").await.unwrap();
    let seen: Vec<(String, String)> = got
        .iter()
        .map(|i| (i.id.clone(), i.state.as_str().to_string()))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("i-0one".to_string(), "Warmed:Pending:Wait".to_string()),
            ("i-0two".to_string(), "Warmed:Stopped".to_string())
        ]
    );
    assert!(got[0].state.is_pool_bound_wait());
    assert_eq!(got[1].instance_type.as_deref(), Some("m5.large"));
    assert_eq!((first.num_calls(), second.num_calls()), (1, 1));
}

/// Issue 71: the group's own cause of an instance's termination is its scaling
/// activity's `Cause`, found page by page (100 a page, newest first), matched by the
/// activity's description to the exact instance (`i-0abc` is not `i-0abcd`), cut to
/// 4 KiB; an instance no activity of the pages names has none; throttling is an
/// error the caller fails closed on.
#[tokio::test]
async fn the_termination_cause_is_read_page_by_page_for_the_exact_instance() {
    let act = |id: &str, cause: &str| {
        asg::types::Activity::builder()
            .activity_id(format!("a-{id}"))
            .description(format!("Terminating EC2 instance: {id}"))
            .auto_scaling_group_name("web")
            .cause(cause)
            .start_time(aws_smithy_types::DateTime::from_secs(100))
            .status_code(asg::types::ScalingActivityStatusCode::from("InProgress"))
            .build()
    };
    let long = format!("{} in response to an instance refresh.", "x".repeat(5000));
    let first = mock!(Client::describe_scaling_activities)
        .match_requests(|r| {
            r.auto_scaling_group_name() == Some("web")
                && r.next_token().is_none()
                && r.max_records() == Some(100)
        })
        .then_output(move || {
            DescribeScalingActivitiesOutput::builder()
                .activities(act("i-0abcd", "not this one"))
                .activities(act("i-0long", &long))
                .next_token("page-2")
                .build()
        });
    let second = mock!(Client::describe_scaling_activities)
        .match_requests(|r| r.next_token() == Some("page-2"))
        .then_output(move || {
            DescribeScalingActivitiesOutput::builder()
                .activities(act(
                    "i-0abc",
                    "At 2026-11-28T10:00:00Z an instance was taken out of service in response to an instance refresh.",
                ))
                .build()
        });
    let c = cloud(&[&first, &second]);
    let cause = c.termination_cause("web", "i-0abc").await.unwrap();
    assert!(
        cause
            .as_deref()
            .is_some_and(|t| t.ends_with("in response to an instance refresh.")),
        "{cause:?}"
    );
    assert_eq!((first.num_calls(), second.num_calls()), (1, 1));
    let cut = c
        .termination_cause("web", "i-0long")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cut.len(), 4096);
    assert_eq!(c.termination_cause("web", "i-0gone").await.unwrap(), None);

    let throttle = mock!(Client::describe_scaling_activities).then_error(|| {
        aws_sdk_autoscaling::operation::describe_scaling_activities::DescribeScalingActivitiesError::generic(
            ErrorMetadata::builder()
                .code("Throttling")
                .message("Rate exceeded")
                .build(),
        )
    });
    let c = cloud(&[&throttle]);
    let e = c.termination_cause("web", "i-0abc").await.unwrap_err();
    assert!(matches!(e, CloudError::Throttled { .. }), "{e:?}");
}
