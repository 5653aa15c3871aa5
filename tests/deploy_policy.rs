//! deploy/iam-policy.json and deploy/base/rbac.yaml against the code. The scale-in tests
//! check the other RBAC direction: every request the engine makes is granted.

use std::collections::BTreeSet;
use std::path::Path;

use ca_asg_provider::sim::RbacUse;

mod support;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `describe_auto_scaling_groups` -> `DescribeAutoScalingGroups`.
fn pascal(snake: &str) -> String {
    snake
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// Every AWS action the AWS backend calls: `self.<client>` followed by `.<operation>()`,
/// where the client field names the service.
fn actions_in_code() -> BTreeSet<String> {
    // Every file of the AWS backend.
    let mut src = String::new();
    for entry in std::fs::read_dir(root().join("src/cloud/aws")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            src += &std::fs::read_to_string(path).unwrap();
        }
    }
    let services = [
        ("asg", "autoscaling"),
        ("ec2", "ec2"),
        ("eks", "eks"),
        ("sqs", "sqs"),
        ("elb", "elasticloadbalancing"),
    ];
    let mut out = BTreeSet::new();
    for (field, service) in services {
        let needle = format!(".{field}");
        let mut rest = src.as_str();
        while let Some(i) = rest.find(&needle) {
            rest = &rest[i + needle.len()..];
            // A client field, not a longer identifier (`.asg_name`).
            if rest.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let after = rest.trim_start();
            let Some(call) = after.strip_prefix('.') else {
                continue;
            };
            let op: String = call
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if call[op.len()..].starts_with("()") && !op.is_empty() && op != "clone" {
                out.insert(format!("{service}:{}", pascal(&op)));
            }
        }
    }
    out
}

fn policy() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(root().join("deploy/iam-policy.json")).unwrap())
        .expect("iam-policy.json is JSON")
}

fn actions_of(statement: &serde_json::Value) -> Vec<String> {
    match &statement["Action"] {
        serde_json::Value::String(s) => vec![s.clone()],
        serde_json::Value::Array(a) => a
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
        _ => vec![],
    }
}

#[test]
fn the_code_scan_finds_the_known_calls() {
    let code = actions_in_code();
    // If the scan stopped matching, the policy test below would pass vacuously.
    for a in [
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
        "ec2:DescribeInstanceTypes",
        "eks:DescribeNodegroup",
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "elasticloadbalancing:DescribeTargetGroups",
        "elasticloadbalancing:DescribeTargetHealth",
        "elasticloadbalancing:DescribeTargetGroupAttributes",
        "elasticloadbalancing:DeregisterTargets",
        "autoscaling:DescribeLoadBalancerTargetGroups",
    ] {
        assert!(
            code.contains(a),
            "{a} not found in src/cloud/aws/: {code:?}"
        );
    }
}

#[test]
fn iam_policy_allows_every_action_the_code_calls_and_nothing_else() {
    let code = actions_in_code();
    let p = policy();
    let granted: BTreeSet<String> = p["Statement"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["Effect"] == "Allow")
        .flat_map(actions_of)
        .collect();
    let missing: Vec<_> = code.difference(&granted).collect();
    assert!(
        missing.is_empty(),
        "deploy/iam-policy.json lacks {missing:?}"
    );
    let extra: Vec<_> = granted.difference(&code).collect();
    assert!(
        extra.is_empty(),
        "deploy/iam-policy.json grants actions the code never calls: {extra:?}"
    );
    assert!(
        granted.iter().all(|a| !a.contains('*')),
        "no wildcard actions"
    );
}

#[test]
fn iam_write_actions_are_limited_to_managed_groups() {
    let p = policy();
    for s in p["Statement"].as_array().unwrap() {
        for a in actions_of(s) {
            let op = a.split(':').nth(1).unwrap_or_default();
            // Reads: Describe* and Get* (GetInstanceTypesFromInstanceRequirements).
            if op.starts_with("Describe") || op.starts_with("Get") {
                continue;
            }
            // The last mile's one write: target groups only (which of their targets is
            // the code's choice: the instance's own, in its group's attached groups).
            if a == "elasticloadbalancing:DeregisterTargets" {
                let r = s["Resource"].as_str().unwrap_or_default();
                assert_eq!(
                    r, "arn:aws:elasticloadbalancing:*:*:targetgroup/*/*",
                    "{a} must be limited to target groups"
                );
                continue;
            }
            // The interruption queue: only the one queue, by its ARN.
            if a.starts_with("sqs:") {
                let r = s["Resource"].as_str().unwrap_or_default();
                assert!(
                    r.starts_with("arn:aws:sqs:") && !r.contains('*'),
                    "{a} must be limited to the interruption queue's ARN, not {r:?}"
                );
                continue;
            }
            let tag = &s["Condition"]["StringEquals"]
                ["aws:ResourceTag/k8s.io/cluster-autoscaler/enabled"];
            assert_eq!(
                tag, "true",
                "{a} is a write and must be conditioned on the managed-group tag"
            );
            // And on this cluster's own tag, so one cluster's service cannot scale
            // another cluster's groups.
            let cluster = s["Condition"]["Null"]
                .as_object()
                .into_iter()
                .flatten()
                .find(|(k, v)| {
                    k.starts_with("aws:ResourceTag/k8s.io/cluster-autoscaler/")
                        && !k.ends_with("/enabled")
                        && v.as_str() == Some("false")
                });
            assert!(
                cluster.is_some_and(|(k, _)| k.ends_with("/CLUSTER_NAME")),
                "{a} must require the tag k8s.io/cluster-autoscaler/CLUSTER_NAME: {}",
                s["Condition"]
            );
        }
    }
}

/// The last mile reads the load balancers and changes one thing only (issue 73):
/// every elasticloadbalancing action granted is a Describe but DeregisterTargets, which
/// has a statement of its own (an operator who leaves `deregister` off drops it).
#[test]
fn load_balancers_are_read_and_only_targets_deregistered() {
    let p = policy();
    let statements = p["Statement"].as_array().unwrap();
    let elb: Vec<String> = statements
        .iter()
        .flat_map(actions_of)
        .filter(|a| a.starts_with("elasticloadbalancing:"))
        .collect();
    assert_eq!(elb.len(), 4, "{elb:?}");
    assert!(
        elb.iter()
            .all(|a| a.starts_with("elasticloadbalancing:Describe")
                || a == "elasticloadbalancing:DeregisterTargets"),
        "{elb:?}"
    );
    let own = statements
        .iter()
        .find(|s| s["Sid"] == "DeregisterFromAttachedTargetGroups")
        .expect("a statement of its own");
    assert_eq!(
        actions_of(own),
        vec!["elasticloadbalancing:DeregisterTargets"]
    );
}

#[test]
fn rbac_check_rejects_what_the_role_does_not_grant() {
    let rules = support::rbac::service_role();
    let u = |verb: &str, group: &str, resource: &str| RbacUse {
        verb: verb.into(),
        group: group.into(),
        resource: resource.into(),
    };
    let granted = [
        u("create", "", "pods/eviction"),
        u("watch", "", "pods"),
        u("patch", "", "nodes"),
    ];
    assert!(support::rbac::missing(&rules, &granted).is_empty());
    // The drain never deletes Nodes and never touches Secrets.
    let refused = [
        u("delete", "", "nodes"),
        u("get", "", "secrets"),
        u("create", "apps", "pods/eviction"),
    ];
    assert_eq!(support::rbac::missing(&rules, &refused).len(), 3);
}

#[test]
fn rbac_grants_exactly_what_check_config_checks() {
    use ca_asg_provider::scalein::kube::permissions::REQUIRED;
    let rules = support::rbac::service_role();
    let granted: BTreeSet<(String, String, String)> = rules
        .iter()
        .flat_map(|r| {
            r.groups.iter().flat_map(move |g| {
                r.resources.iter().flat_map(move |res| {
                    r.verbs
                        .iter()
                        .map(move |v| (v.clone(), g.clone(), res.clone()))
                })
            })
        })
        .collect();
    let required: BTreeSet<(String, String, String)> = REQUIRED
        .iter()
        .map(|p| {
            (
                p.verb.to_string(),
                p.group.to_string(),
                p.resource.to_string(),
            )
        })
        .collect();
    assert_eq!(
        granted, required,
        "deploy/base/rbac.yaml and scalein::kube::permissions::REQUIRED differ"
    );
}

/// The configuration shipped in deploy/ loads: known keys, valid values (only the
/// certificate files, which cert-manager mounts in the pod, are absent here).
#[test]
fn shipped_configurations_are_valid() {
    use ca_asg_provider::config::{resolve, ConfigError, FileConfig, Overrides};
    // The files the overlays' configMapGenerators read, as they are.
    let configs = [
        "deploy/base/config.yaml",
        "deploy/overlays/standalone/config.yaml",
    ]
    .map(|name| (name, std::fs::read_to_string(root().join(name)).unwrap()));
    for (name, text) in configs {
        let file = FileConfig::parse(&text, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let has_tls = file.tls.is_some();
        match resolve(file, &Overrides::default(), name) {
            Ok(_) => assert!(!has_tls, "{name}: tls files cannot exist here"),
            Err(ConfigError::Invalid { problems, .. }) => {
                assert!(has_tls, "{name}: {problems:?}");
                assert!(
                    problems.iter().all(|p| p.key.starts_with("tls.")),
                    "{name}: {problems:?}"
                );
            }
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

/// Every Helm values file's `config` (the chart renders it as is) loads in the
/// program: the schema in values.schema.json and the Rust types agree on each key.
#[test]
fn helm_values_configurations_load() {
    use ca_asg_provider::config::{resolve, ConfigError, FileConfig, Overrides};
    let dir = root().join("deploy/chart/ci");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let values: serde_json::Value =
            serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let Some(config) = values.get("config").cloned() else {
            continue;
        };
        let name = path.display().to_string();
        let file: FileConfig =
            serde_json::from_value(config).unwrap_or_else(|e| panic!("{name}: {e}"));
        match resolve(file, &Overrides::default(), &name) {
            Ok(_) => {}
            // The chart fills in listen addresses and TLS files at render time.
            Err(ConfigError::Invalid { problems, .. }) => assert!(
                problems.iter().all(|p| p.key.starts_with("tls.")),
                "{name}: {problems:?}"
            ),
            Err(e) => panic!("{name}: {e}"),
        }
        seen += 1;
    }
    assert!(seen >= 1, "no values file with a config section");
}

/// Issue 62: the tag writes (the record of the hook this service created, and its
/// removal at uninstall) may change that one tag only, never the discovery tags the
/// write statement's condition trusts.
#[test]
fn tag_writes_are_limited_to_the_hook_record() {
    use ca_asg_provider::scalein::decide::hooks::HOOK_RECORD_TAG;
    let p = policy();
    let mut seen = BTreeSet::new();
    for s in p["Statement"].as_array().unwrap() {
        for a in actions_of(s) {
            if !matches!(
                a.as_str(),
                "autoscaling:CreateOrUpdateTags" | "autoscaling:DeleteTags"
            ) {
                continue;
            }
            let keys = &s["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"];
            assert_eq!(
                keys,
                &serde_json::json!([HOOK_RECORD_TAG]),
                "{a} must be limited to the tag key {HOOK_RECORD_TAG}: {}",
                s["Condition"]
            );
            seen.insert(a);
        }
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
}
