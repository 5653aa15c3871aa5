//! SDK types to the core's types, and what an SDK error means. Pure: no I/O.

use aws_sdk_autoscaling as asg;
use aws_sdk_ec2 as ec2;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use base64::Engine as _;

use crate::cloud::*;

/// The HTTP status of a raw response, when there is one.
pub trait HttpStatus {
    fn status_code(&self) -> Option<u16>;
}

impl HttpStatus for aws_smithy_runtime_api::http::Response {
    fn status_code(&self) -> Option<u16> {
        Some(self.status().as_u16())
    }
}

pub(super) const THROTTLE_CODES: [&str; 6] = [
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "SlowDown",
    "RequestThrottled",
];

/// One place that decides what an SDK error means.
pub fn classify<E, R>(
    op: &str,
    e: &aws_smithy_runtime_api::client::result::SdkError<E, R>,
) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + HttpStatus,
{
    use aws_smithy_runtime_api::client::result::SdkError;
    let operation = op.to_string();
    // Before the request is sent the SDK resolves credentials; when none come, the
    // failure reaches us as a dispatch failure wrapping the provider's error. It is
    // not a passing failure but a setup problem: say so, and what to check.
    if let Some(message) = std::error::Error::source(e).and_then(credentials_failure) {
        return CloudError::Credentials {
            operation,
            message,
            hint: credentials_hint(|k| std::env::var(k).ok()),
        };
    }
    match e {
        SdkError::ServiceError(se) => {
            let code = se.err().code().unwrap_or("").to_string();
            let message = se.err().message().unwrap_or("").to_string();
            let status = se.raw().status_code().unwrap_or(0);
            if THROTTLE_CODES.contains(&code.as_str()) || status == 429 {
                CloudError::Throttled {
                    operation,
                    message: if message.is_empty() { code } else { message },
                }
            } else if code.contains("NotFound")
                || code == "ResourceNotFoundException"
                || (code == "ValidationError" && message.to_ascii_lowercase().contains("not found"))
            {
                CloudError::NotFound {
                    what: "AWS resource",
                    name: format!("{op}: {message}"),
                }
            } else if status >= 500 || code == "InternalFailure" || code == "ServiceUnavailable" {
                CloudError::Transient {
                    operation,
                    message: format!("{code} (HTTP {status}): {message}"),
                }
            } else {
                CloudError::Rejected {
                    operation,
                    code,
                    message,
                }
            }
        }
        SdkError::TimeoutError(_) => CloudError::Transient {
            operation,
            message: "timed out".into(),
        },
        SdkError::DispatchFailure(d) => CloudError::Transient {
            operation,
            message: match d
                .as_connector_error()
                .map(|c| chain(c))
                .or_else(|| std::error::Error::source(e).map(chain))
            {
                Some(why) => format!("could not send the request: {why}"),
                None => "could not send the request".to_string(),
            },
        },
        SdkError::ResponseError(_) => CloudError::Transient {
            operation,
            message: match std::error::Error::source(e).map(chain) {
                Some(why) => format!("unreadable response: {why}"),
                None => "unreadable response".to_string(),
            },
        },
        other => CloudError::Transient {
            operation,
            message: format!("{other}"),
        },
    }
}

/// An error and what lies under it, as words (`a: b: c`), never Debug text: each
/// level's message once (the SDK's wrappers repeat what they wrap).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    chain_of(e, |text| text.to_string())
}

/// [`chain`] with each error's text put through `say` first (a part it makes empty,
/// or one an earlier part already says, is left out).
fn chain_of(e: &(dyn std::error::Error + 'static), say: impl Fn(&str) -> String) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        let text = say(&err.to_string());
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = err.source();
    }
    parts.join(": ")
}

/// Longest credentials message kept: the chain under an STS error can be long.
const CREDENTIALS_MESSAGE_MAX: usize = 300;

/// When the SDK got no credentials for the call, what it said: the credentials
/// provider's error and what lies under it, joined as a chain (`a: b: c`). `None` for
/// every other failure. The credentials provider's error is found by its type anywhere
/// in the error's source chain (the SDK wraps it in a dispatch failure and a connector
/// error); an identity cache that gave up waiting for the provider says so only in
/// text, which is matched too.
pub fn credentials_failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    use aws_credential_types::provider::error::CredentialsError;
    let mut cur = Some(e);
    while let Some(err) = cur {
        let found = err.downcast_ref::<CredentialsError>().is_some()
            || err.to_string().starts_with("identity resolver timed out");
        if found {
            // The default chain lists every provider it tried on further lines; the
            // first line says what matters (the log has the rest).
            let mut msg = chain_of(err, |t| {
                let t = t.lines().next().unwrap_or("").trim();
                let t = t.strip_suffix("Attempted:").unwrap_or(t).trim_end();
                t.strip_suffix('.').unwrap_or(t).to_string()
            });
            if msg.len() > CREDENTIALS_MESSAGE_MAX {
                let cut = (0..=CREDENTIALS_MESSAGE_MAX)
                    .rev()
                    .find(|i| msg.is_char_boundary(*i))
                    .unwrap_or(0);
                msg.truncate(cut);
                msg.push_str("...");
            }
            return Some(msg);
        }
        cur = err.source();
    }
    None
}

/// What to check when no credentials came, from the variables EKS puts in a pod's
/// environment (`env` looks one up): EKS Pod Identity's
/// `AWS_CONTAINER_CREDENTIALS_FULL_URI`, IRSA's `AWS_ROLE_ARN` and
/// `AWS_WEB_IDENTITY_TOKEN_FILE`, or neither. Pure.
pub fn credentials_hint(env: impl Fn(&str) -> Option<String>) -> String {
    let set = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    let ns = set("POD_NAMESPACE");
    let sa_of = |ns: &Option<String>| match ns {
        Some(ns) => format!("the pod's ServiceAccount in namespace {ns}"),
        None => "the pod's ServiceAccount".to_string(),
    };
    let restart = "EKS sets these variables when the pod is created, so restart the pod after a change (kubectl rollout restart)";
    if let Some(uri) = set("AWS_CONTAINER_CREDENTIALS_FULL_URI") {
        return format!(
            "EKS Pod Identity is set up for this pod (AWS_CONTAINER_CREDENTIALS_FULL_URI={uri}) but gave no credentials: check that the eks-pod-identity-agent add-on runs on this node (aws eks describe-addon --addon-name eks-pod-identity-agent; its DaemonSet in kube-system), and that the pod identity association for {} names a role that exists and trusts pods.eks.amazonaws.com (aws eks list-pod-identity-associations, then describe-pod-identity-association)",
            sa_of(&ns)
        );
    }
    let role = set("AWS_ROLE_ARN");
    let token = set("AWS_WEB_IDENTITY_TOKEN_FILE");
    match (role, token) {
        (Some(role), Some(_)) => format!(
            "IRSA is set up for this pod (AWS_ROLE_ARN={role}, AWS_WEB_IDENTITY_TOKEN_FILE) but gave no credentials: check that role {role} exists, that its trust policy trusts the cluster's OIDC provider with the condition sub = system:serviceaccount:<namespace>:<serviceaccount> for {} and aud = sts.amazonaws.com, and that the cluster's OIDC provider is registered in IAM",
            sa_of(&ns)
        ),
        (Some(_), None) | (None, Some(_)) => format!(
            "IRSA is only half set up for this pod: it needs both AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE, which EKS injects from the ServiceAccount's eks.amazonaws.com/role-arn annotation; set that annotation on {} rather than the variables by hand ({restart})",
            sa_of(&ns)
        ),
        (None, None) => format!(
            "Neither IRSA nor EKS Pod Identity reached this pod: its environment has no AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE (IRSA) and no AWS_CONTAINER_CREDENTIALS_FULL_URI (Pod Identity). IRSA: annotate {sa} with eks.amazonaws.com/role-arn: <the role's ARN>. Pod Identity: install the eks-pod-identity-agent add-on and create a pod identity association for {sa} with the role. Either way {restart}",
            sa = sa_of(&ns)
        ),
    }
}

pub(super) fn snapshot_of(g: &asg::types::AutoScalingGroup) -> Option<AsgSnapshot> {
    let name = g.auto_scaling_group_name()?.to_string();
    let lt_ref = |s: &asg::types::LaunchTemplateSpecification| LaunchTemplateRef {
        id: s.launch_template_id().map(str::to_string),
        name: s.launch_template_name().map(str::to_string),
        version: s.version().map(str::to_string),
    };
    let launch = if let Some(m) = g.mixed_instances_policy() {
        match m
            .launch_template()
            .and_then(|l| l.launch_template_specification())
        {
            Some(spec) => {
                let overrides = m
                    .launch_template()
                    .map(|l| l.overrides())
                    .unwrap_or_default();
                LaunchSpec::MixedInstances {
                    template: lt_ref(spec),
                    override_types: overrides
                        .iter()
                        .filter_map(|o| o.instance_type().map(str::to_string))
                        .collect(),
                    // As in-tree AWS: requirements come from a single override.
                    requirements: match overrides {
                        [only] => only
                            .instance_requirements()
                            .map(|r| Box::new(requirements_from_asg(r))),
                        _ => None,
                    },
                }
            }
            None => LaunchSpec::Unknown,
        }
    } else if let Some(lt) = g.launch_template() {
        LaunchSpec::LaunchTemplate(lt_ref(lt))
    } else if let Some(lc) = g.launch_configuration_name() {
        LaunchSpec::LaunchConfiguration(lc.to_string())
    } else {
        LaunchSpec::Unknown
    };
    Some(AsgSnapshot {
        name,
        min_size: g.min_size().unwrap_or(0),
        max_size: g.max_size().unwrap_or(0),
        desired_capacity: g.desired_capacity().unwrap_or(0),
        availability_zones: g.availability_zones().to_vec(),
        tags: g
            .tags()
            .iter()
            .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or("").to_string())))
            .collect(),
        launch,
        instances: g
            .instances()
            .iter()
            .filter_map(|i| {
                Some(AsgInstance {
                    id: i.instance_id()?.to_string(),
                    zone: i.availability_zone().unwrap_or("").to_string(),
                    state: LifecycleState::parse(
                        i.lifecycle_state().map(|s| s.as_str()).unwrap_or(""),
                    ),
                    instance_type: i.instance_type().map(str::to_string),
                })
            })
            .collect(),
        terminating_hooks: Vec::new(),
        warm_pool: g.warm_pool_configuration().map(|w| WarmPool {
            min_size: w.min_size().unwrap_or(0).max(0),
            max_prepared: w.max_group_prepared_capacity().filter(|m| *m >= 0),
            pool_state: w
                .pool_state()
                .map(|p| p.as_str().chars().take(32).collect())
                .unwrap_or_else(|| "Stopped".to_string()),
            reuse_on_scale_in: w
                .instance_reuse_policy()
                .and_then(|r| r.reuse_on_scale_in())
                .unwrap_or(false),
        }),
    })
}

/// A short code for a failed scaling activity, from its status message.
pub fn failure_code(message: &str) -> String {
    const KNOWN: [&str; 9] = [
        "InsufficientInstanceCapacity",
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "InsufficientFreeAddressesInSubnet",
        "InvalidParameterCombination",
        "Unsupported",
        "UnauthorizedOperation",
    ];
    KNOWN
        .iter()
        .find(|k| message.contains(*k))
        .map(|k| k.to_string())
        .unwrap_or_else(|| {
            if message.to_ascii_lowercase().contains("capacity") {
                "InsufficientInstanceCapacity".into()
            } else {
                "LaunchFailed".into()
            }
        })
}

pub(super) fn decode_user_data(raw: Option<&str>, what: &str) -> Option<String> {
    let raw = raw?.trim();
    if raw.is_empty() {
        return None;
    }
    match base64::engine::general_purpose::STANDARD.decode(raw) {
        Ok(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        Err(e) => {
            tracing::warn!(source = what, error = %e, "user data is not base64; ignored");
            None
        }
    }
}

pub(super) fn arch(a: &str) -> &'static str {
    match a {
        "arm64" | "arm64_mac" => "arm64",
        _ => "amd64",
    }
}

pub(super) fn type_info(t: &ec2::types::InstanceTypeInfo) -> Option<InstanceTypeInfo> {
    let name = t.instance_type()?.as_str().to_string();
    let gpus = t.gpu_info();
    let gpu_count: i64 = gpus
        .map(|g| {
            g.gpus()
                .iter()
                .map(|d| i64::from(d.count().unwrap_or(0)))
                .sum()
        })
        .unwrap_or(0);
    let gpu_type = gpus.and_then(|g| g.gpus().first()).map(|d| {
        gpu_name(
            d.manufacturer().unwrap_or("gpu"),
            d.name().unwrap_or("unknown"),
        )
    });
    let gpu_manufacturer = gpus
        .and_then(|g| g.gpus().first())
        .and_then(|d| d.manufacturer())
        .map(str::to_string)
        .filter(|_| gpu_count > 0);
    let archs = t
        .processor_info()
        .map(|p| p.supported_architectures())
        .unwrap_or_default();
    Some(InstanceTypeInfo {
        name,
        vcpus: i64::from(t.v_cpu_info().and_then(|v| v.default_v_cpus()).unwrap_or(0)),
        memory_mib: t.memory_info().and_then(|m| m.size_in_mib()).unwrap_or(0),
        gpus: gpu_count,
        gpu_type: gpu_type.filter(|_| gpu_count > 0),
        gpu_manufacturer,
        architecture: archs
            .first()
            .map(|a| arch(a.as_str()))
            .unwrap_or("amd64")
            .to_string(),
        max_enis: t
            .network_info()
            .and_then(|n| n.maximum_network_interfaces())
            .map(i64::from),
        ipv4_per_eni: t
            .network_info()
            .and_then(|n| n.ipv4_addresses_per_interface())
            .map(i64::from),
        instance_storage_gib: t.instance_storage_info().and_then(|s| s.total_size_in_gb()),
    })
}

/// The GPU model as the `k8s.amazonaws.com/accelerator` label names it, the way
/// CA's in-tree AWS provider lists its GPU types (`nvidia-tesla-t4`, `nvidia-a10g`):
/// NVIDIA's data-center models before A10G carry "tesla". Others: manufacturer-model.
pub fn gpu_name(manufacturer: &str, model: &str) -> String {
    let m = manufacturer.to_ascii_lowercase().replace([' ', '_'], "-");
    let n = model.to_ascii_lowercase().replace([' ', '_'], "-");
    let tesla = ["k80", "m60", "p100", "v100", "t4", "t4g", "a100"];
    if m == "nvidia" && tesla.contains(&n.as_str()) {
        format!("nvidia-tesla-{n}")
    } else {
        format!("{m}-{n}")
    }
}

/// InstanceRequirements of an ASG override and of a launch template have the same
/// shape in two SDK crates; one reading for both.
macro_rules! requirements_of {
    ($r:expr) => {{
        let r = $r;
        let nvidia_gpu = r
            .accelerator_manufacturers()
            .iter()
            .any(|m| m.as_str() == "nvidia")
            && (r.accelerator_types().is_empty()
                || r.accelerator_types().iter().any(|t| t.as_str() == "gpu"));
        InstanceRequirements {
            vcpu_min: r.v_cpu_count().and_then(|v| v.min()).map_or(0, i64::from),
            vcpu_max: r.v_cpu_count().and_then(|v| v.max()).map(i64::from),
            memory_mib_min: r.memory_mib().and_then(|v| v.min()).map_or(0, i64::from),
            memory_mib_max: r.memory_mib().and_then(|v| v.max()).map(i64::from),
            nvidia_gpus_min: if nvidia_gpu {
                Some(
                    r.accelerator_count()
                        .and_then(|c| c.min())
                        .map_or(1, i64::from),
                )
            } else {
                None
            },
            allowed_types: r.allowed_instance_types().to_vec(),
            excluded_types: r.excluded_instance_types().to_vec(),
            burstable: r.burstable_performance().map(|b| b.as_str().to_string()),
            bare_metal: r.bare_metal().map(|b| b.as_str().to_string()),
            cpu_manufacturers: r
                .cpu_manufacturers()
                .iter()
                .map(|m| m.as_str().to_string())
                .collect(),
        }
    }};
}

pub(super) fn requirements_from_asg(r: &asg::types::InstanceRequirements) -> InstanceRequirements {
    requirements_of!(r)
}

pub(super) fn requirements_from_ec2(r: &ec2::types::InstanceRequirements) -> InstanceRequirements {
    requirements_of!(r)
}

/// The request GetInstanceTypesFromInstanceRequirements takes.
pub(super) fn requirements_request(
    r: &InstanceRequirements,
) -> ec2::types::InstanceRequirementsRequest {
    use ec2::types::*;
    let to_i32 = |v: i64| i32::try_from(v).unwrap_or(i32::MAX);
    let mut b = InstanceRequirementsRequest::builder()
        .v_cpu_count(
            VCpuCountRangeRequest::builder()
                .min(to_i32(r.vcpu_min))
                .set_max(r.vcpu_max.map(to_i32))
                .build(),
        )
        .memory_mib(
            MemoryMiBRequest::builder()
                .min(to_i32(r.memory_mib_min))
                .set_max(r.memory_mib_max.map(to_i32))
                .build(),
        )
        .set_allowed_instance_types((!r.allowed_types.is_empty()).then(|| r.allowed_types.clone()))
        .set_excluded_instance_types(
            (!r.excluded_types.is_empty()).then(|| r.excluded_types.clone()),
        )
        .set_burstable_performance(r.burstable.as_deref().map(BurstablePerformance::from))
        .set_bare_metal(r.bare_metal.as_deref().map(BareMetal::from));
    for m in &r.cpu_manufacturers {
        b = b.cpu_manufacturers(CpuManufacturer::from(m.as_str()));
    }
    if let Some(n) = r.nvidia_gpus_min {
        b = b
            .accelerator_manufacturers(AcceleratorManufacturer::Nvidia)
            .accelerator_types(AcceleratorType::Gpu)
            .accelerator_count(AcceleratorCountRequest::builder().min(to_i32(n)).build());
    }
    b.build()
}

/// The EBS volumes of block device mappings (launch template or configuration).
pub(super) fn volumes<'a>(
    mappings: impl Iterator<Item = (Option<&'a str>, Option<i32>, bool)>,
) -> Vec<BlockVolume> {
    mappings
        .filter(|(_, _, ebs)| *ebs)
        .map(|(device, size, _)| BlockVolume {
            device: device.unwrap_or_default().to_string(),
            size_gib: size.map(i64::from),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    type Sdk = aws_smithy_runtime_api::client::result::SdkError<
        asg::operation::describe_auto_scaling_groups::DescribeAutoScalingGroupsError,
        aws_smithy_runtime_api::http::Response,
    >;

    /// A dispatch failure wrapping `source`, as the SDK's orchestrator builds one for an
    /// error raised before the request is sent (credentials are resolved then).
    fn dispatch(source: impl Into<aws_smithy_runtime_api::box_error::BoxError>) -> Sdk {
        Sdk::dispatch_failure(
            aws_smithy_runtime_api::client::result::ConnectorError::other(source.into(), None),
        )
    }

    #[test]
    fn missing_credentials_are_a_credentials_problem_not_a_transient_failure() {
        use aws_credential_types::provider::error::CredentialsError;
        let e = dispatch(CredentialsError::not_loaded(
            "no providers in chain provided credentials",
        ));
        let c = classify("DescribeAutoScalingGroups", &e);
        assert!(matches!(c, CloudError::Credentials { .. }), "{c:?}");
        assert!(!c.is_retryable());
        let text = c.to_string();
        assert!(text.contains("no AWS credentials"), "{text}");
        assert!(text.contains("a credentials problem"), "{text}");
        assert!(
            text.contains("the credential provider was not enabled: no providers in chain provided credentials"),
            "{text}"
        );
        assert!(!text.contains("transient"), "{text}");
        assert!(!text.contains("DispatchFailure"), "{text}");
        // The default chain's list of every provider it tried stays in the log.
        let chain = dispatch(CredentialsError::not_loaded(
            "no credentials found in chain. Attempted:\n  Environment: not set\n  Profile: none",
        ));
        match classify("DescribeAutoScalingGroups", &chain) {
            CloudError::Credentials { message, .. } => assert_eq!(
                message,
                "the credential provider was not enabled: no credentials found in chain"
            ),
            other => panic!("{other:?}"),
        }
        // Every kind of credentials error counts, under however many wrappers.
        for inner in [
            CredentialsError::provider_error("STS said AccessDenied"),
            CredentialsError::invalid_configuration("bad profile"),
            CredentialsError::provider_timed_out(std::time::Duration::from_secs(5)),
        ] {
            let c = classify("DescribeAutoScalingGroups", &dispatch(inner));
            assert!(matches!(c, CloudError::Credentials { .. }), "{c:?}");
        }
    }

    /// The SDK's identity cache gives up on a credentials provider that does not answer
    /// (a Pod Identity agent that never replies) with an error of a private type; its
    /// text is what is left to know it by.
    #[test]
    fn a_credentials_provider_that_never_answers_is_a_credentials_problem() {
        #[derive(Debug)]
        struct TimedOut;
        impl std::fmt::Display for TimedOut {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("identity resolver timed out after 5s")
            }
        }
        impl std::error::Error for TimedOut {}
        let c = classify("DescribeAutoScalingGroups", &dispatch(TimedOut));
        match &c {
            CloudError::Credentials { message, .. } => {
                assert_eq!(message, "identity resolver timed out after 5s")
            }
            other => panic!("{other:?}"),
        }
        assert!(!c.is_retryable());
    }

    /// Issue 62: a request that cannot be sent (a host name that does not resolve) is
    /// said in words, the chain of what failed, never the SDK's Debug text.
    #[test]
    fn a_dispatch_failure_is_said_in_words_not_debug_text() {
        let e = dispatch(std::io::Error::other(
            "dns error: failed to lookup address information: Name or service not known",
        ));
        let c = classify("DescribeAutoScalingGroups", &e);
        let text = c.to_string();
        assert!(
            text.contains("could not send the request")
                && text.contains("failed to lookup address information"),
            "{text}"
        );
        for debug in ["DispatchFailure", "ConnectorError", "{", "Some("] {
            assert!(!text.contains(debug), "{debug:?} in {text}");
        }
    }

    #[test]
    fn a_network_failure_stays_transient() {
        let e = dispatch(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
        let c = classify("DescribeAutoScalingGroups", &e);
        assert!(matches!(c, CloudError::Transient { .. }), "{c:?}");
        assert!(c.is_retryable());
    }

    #[test]
    fn the_credentials_hint_follows_what_the_pods_environment_shows() {
        let hint = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            credentials_hint(move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
        };
        let none = hint(&[("POD_NAMESPACE", "kube-system")]);
        for want in [
            "Neither IRSA nor EKS Pod Identity",
            "eks.amazonaws.com/role-arn",
            "pod identity association",
            "eks-pod-identity-agent",
            "namespace kube-system",
            "restart the pod",
        ] {
            assert!(none.contains(want), "{want:?} not in {none}");
        }
        let irsa = hint(&[
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
            (
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                "/var/run/secrets/eks.amazonaws.com/serviceaccount/token",
            ),
        ]);
        assert!(irsa.starts_with("IRSA is set up"), "{irsa}");
        assert!(
            irsa.contains("arn:aws:iam::1:role/r") && irsa.contains("trust policy"),
            "{irsa}"
        );
        assert!(!irsa.contains("Pod Identity"), "{irsa}");
        let half = hint(&[("AWS_ROLE_ARN", "arn:aws:iam::1:role/r")]);
        assert!(half.starts_with("IRSA is only half set up"), "{half}");
        let pod_identity = hint(&[(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "http://169.254.170.23/v1/credentials",
        )]);
        assert!(
            pod_identity.starts_with("EKS Pod Identity is set up"),
            "{pod_identity}"
        );
        assert!(
            pod_identity.contains("eks-pod-identity-agent"),
            "{pod_identity}"
        );
        assert!(
            pod_identity.contains("list-pod-identity-associations"),
            "{pod_identity}"
        );
        // An empty variable is not set.
        assert_eq!(hint(&[("AWS_ROLE_ARN", " ")]), hint(&[]));
    }

    #[test]
    fn gpu_names_follow_in_tree_aws() {
        assert_eq!(gpu_name("NVIDIA", "T4"), "nvidia-tesla-t4");
        assert_eq!(gpu_name("NVIDIA", "V100"), "nvidia-tesla-v100");
        assert_eq!(gpu_name("NVIDIA", "A100"), "nvidia-tesla-a100");
        assert_eq!(gpu_name("NVIDIA", "K80"), "nvidia-tesla-k80");
        assert_eq!(gpu_name("NVIDIA", "A10G"), "nvidia-a10g");
        assert_eq!(gpu_name("NVIDIA", "L4"), "nvidia-l4");
        assert_eq!(gpu_name("NVIDIA", "L40S"), "nvidia-l40s");
        assert_eq!(gpu_name("AMD", "Radeon Pro V520"), "amd-radeon-pro-v520");
    }

    #[test]
    fn failure_codes_come_from_the_message() {
        assert_eq!(failure_code("Launching a new EC2 instance. Status Reason: We currently do not have sufficient m5.large capacity in the Availability Zone you requested (us-east-1a). ... InsufficientInstanceCapacity"), "InsufficientInstanceCapacity");
        assert_eq!(failure_code("You have requested more vCPU capacity than your current vCPU limit of 32 allows. VcpuLimitExceeded"), "VcpuLimitExceeded");
        assert_eq!(
            failure_code("not enough capacity"),
            "InsufficientInstanceCapacity"
        );
        assert_eq!(failure_code("The image id does not exist"), "LaunchFailed");
    }

    #[test]
    fn user_data_decodes_or_is_dropped() {
        assert_eq!(
            decode_user_data(Some("aGVsbG8="), "t").as_deref(),
            Some("hello")
        );
        assert_eq!(decode_user_data(Some("not base64!"), "t"), None);
        assert_eq!(decode_user_data(Some(""), "t"), None);
        assert_eq!(decode_user_data(None, "t"), None);
    }
}
