//! Nothing found is a failure everywhere (issue 40, 3): `check-config` exits 1 when
//! its selector finds no Auto Scaling Group, naming the tags, the region and the
//! account it looked in; `/readyz` answers 503 saying so until a group exists; a
//! refused DescribeNodegroup is a problem, not a warning.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_autoscaling as asg;
use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryGroup, MemoryTiming};
use ca_asg_provider::cloud::{GroupSelector, TagFilter};
use ca_asg_provider::commands::check::{account_of_role_arn, nothing_found, LookedIn};
use ca_asg_provider::provider::{Provider, ProviderSettings};
use ca_asg_provider::telemetry::http::Status;

mod support;

const ENABLED: &str = "k8s.io/cluster-autoscaler/enabled";

fn discovery(cluster: &str) -> GroupSelector {
    ca_asg_provider::world::tagged(&[ENABLED, &format!("k8s.io/cluster-autoscaler/{cluster}")])
}

fn quick() -> MemoryTiming {
    ca_asg_provider::sim::world::instant_timing()
}

/// The real binary against moto, as the `helm test` Pod runs it: a typo'd cluster name
/// in the discovery tags finds nothing and fails, naming what it looked for and where;
/// the right name finds the group and the problem is gone.
#[tokio::test]
async fn check_config_with_no_group_fails_naming_the_tags_region_and_account() {
    let moto = support::moto::MotoServer::start();
    let sdk = moto.sdk_config().await;
    support::moto::launch_template(&sdk, "lt").await;
    let req =
        support::moto::group_on(&asg::Client::new(&sdk), "prod-web", "lt", "$Default").max_size(5);
    let tags = [
        (ENABLED, "true"),
        ("k8s.io/cluster-autoscaler/prod", "owned"),
    ];
    support::moto::tagged(req, "prod-web", &tags)
        .send()
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let check = |cluster: &str, role_arn: Option<&str>| {
        let path = dir.path().join(format!("{cluster}.yaml"));
        std::fs::write(
            &path,
            format!(
                "aws:\n  region: us-east-1\nautoDiscovery:\n  - tags: [{ENABLED}, k8s.io/cluster-autoscaler/{cluster}]\nscaleIn: {{enabled: false}}\n"
            ),
        )
        .unwrap();
        let mut cmd = support::moto::offline("check-config", &moto.url, &path, dir.path());
        if let Some(arn) = role_arn {
            // IRSA's variable; the static keys above still come first in the chain.
            cmd.env("AWS_ROLE_ARN", arn);
        }
        support::moto::said(&mut cmd, cluster)
    };

    let (code, text) = check(
        "prd",
        Some("arn:aws:iam::210987654321:role/ca-asg-provider"),
    );
    assert_eq!(code, Some(1), "{text}");
    support::assert_says(&text, &[
        "node groups found: 0",
        "problems (1):",
        "no node group found: no Auto Scaling Group is tagged k8s.io/cluster-autoscaler/enabled and k8s.io/cluster-autoscaler/prd in region us-east-1, account 210987654321 (from AWS_ROLE_ARN)",
        "the chart's clusterName",
        // Issue 62: the cluster tags it did see on groups with the enabled tag.
        "Did you mean: the groups tagged k8s.io/cluster-autoscaler/enabled here carry the cluster tags k8s.io/cluster-autoscaler/prod (1 group)",
    ]);
    assert!(!text.contains("no problems found"), "{text}");

    let (code, text) = check("prd", None);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("in region us-east-1, account unknown"),
        "{text}"
    );

    let (code, text) = check("prod", None);
    assert!(text.contains("node groups found: 1"), "{text}");
    assert!(!text.contains("no node group found"), "{text}");
    assert_eq!(code, Some(0), "{text}");
}

/// The words of the problem, for every kind of selector; the account only from a
/// well-formed role ARN.
#[test]
fn nothing_found_names_every_selector_and_the_account_only_when_known() {
    let mut sel = discovery("prod");
    sel.names = vec!["web".into(), "batch".into()];
    sel.tag_sets.push(vec![TagFilter {
        key: "team".into(),
        value: Some("ml".into()),
    }]);
    let text = nothing_found(
        &sel,
        &LookedIn {
            region: "eu-west-1".into(),
            account: Some("111122223333".into()),
        },
    );
    assert!(
        text.contains("named web or batch, or tagged k8s.io/cluster-autoscaler/enabled and k8s.io/cluster-autoscaler/prod, or tagged team=ml in region eu-west-1, account 111122223333"),
        "{text}"
    );
    assert_eq!(
        account_of_role_arn(Some("arn:aws:iam::111122223333:role/x")),
        Some("111122223333".into())
    );
    assert_eq!(
        account_of_role_arn(Some("arn:aws-cn:iam::111122223333:role/a/b")),
        Some("111122223333".into())
    );
    for bad in [
        None,
        Some(""),
        Some("arn:aws:iam::1111:role/x"),
        Some("arn:aws:sts::111122223333:assumed-role/x"),
        Some("111122223333"),
    ] {
        assert_eq!(account_of_role_arn(bad), None, "{bad:?}");
    }
}

/// `/readyz`'s answer: not ready while the selector finds nothing (saying what it
/// looked for), and ready once a group with the tags exists, without CA calling: a
/// replica CA cannot reach while it is unready reads AWS again on its own.
#[tokio::test]
async fn readyz_says_no_group_was_found_and_turns_ready_when_one_appears() {
    let cloud = MemoryCloud::new(
        vec![MemoryGroup::new("other-cluster", 0, 5, 0, "m5.large")
            .tag(ENABLED, "true")
            .tag("k8s.io/cluster-autoscaler/other", "owned")],
        quick(),
    );
    let p = Provider::new(
        Arc::new(cloud.clone()),
        ProviderSettings {
            selector: discovery("prod"),
            refresh_interval: Duration::from_millis(200),
            ..ProviderSettings::default()
        },
    );
    assert!(p.readiness().unwrap_err().contains("not loaded"));
    p.spawn_initial_refresh();
    support::eventually("the first load", 10, || p.is_loaded()).await;
    let why = p.readiness().unwrap_err();
    assert!(
        why.contains("no node group found: no Auto Scaling Group is tagged k8s.io/cluster-autoscaler/enabled and k8s.io/cluster-autoscaler/prod")
            && why.contains("read again every"),
        "{why}"
    );
    cloud.add_group(
        MemoryGroup::new("prod-web", 0, 5, 0, "m5.large")
            .tag(ENABLED, "true")
            .tag("k8s.io/cluster-autoscaler/prod", "owned"),
    );
    support::eventually("ready once a group exists", 10, || p.readiness().is_ok()).await;
    assert_eq!(p.registry().groups.len(), 1);
}

/// A DescribeNodegroup that AWS refuses (no eks:DescribeNodegroup in the role) leaves
/// the template without the node group's labels and taints: check-config fails and
/// names the call, not a warning beside "no problems found".
#[tokio::test]
async fn a_refused_describe_nodegroup_fails_check_config() {
    let cloud = MemoryCloud::new(
        vec![MemoryGroup::new("eks-ml", 0, 5, 0, "m5.large").eks_managed("prod", "ml", 900)],
        quick(),
    );
    cloud.refuse("eks_nodegroup", "AccessDeniedException", 10);
    let p = Provider::new(
        Arc::new(cloud.clone()),
        ProviderSettings {
            selector: ca_asg_provider::world::named(&["eks-ml"]),
            ..ProviderSettings::default()
        },
    );
    assert_eq!(
        ca_asg_provider::commands::check::report(&p, &Default::default()).await,
        ExitCode::FAILURE
    );
    let problems = ca_asg_provider::commands::check::template_problems(
        "eks-ml",
        p.template_findings("eks-ml").as_ref(),
    );
    assert!(
        problems
            .iter()
            .any(|l| l.contains("DescribeNodegroup prod/ml was refused")
                && l.contains("AccessDenied")),
        "{problems:?}"
    );
}

/// Issue 62: when nothing matched, the problem names the cluster tags seen on the
/// groups that carry the enabled tag ("did you mean"), or says none carries it; the
/// node-template tags and the enabled tag itself are not cluster tags.
#[tokio::test]
async fn nothing_found_lists_the_cluster_tags_seen_on_enabled_groups() {
    use ca_asg_provider::commands::check::{cluster_tags_seen, cluster_tags_sentence, report_in};
    let cloud = MemoryCloud::new(
        vec![
            MemoryGroup::new("a", 0, 5, 0, "m5.large")
                .tag(ENABLED, "true")
                .tag("k8s.io/cluster-autoscaler/prod", "owned")
                .tag("k8s.io/cluster-autoscaler/node-template/label/x", "y"),
            MemoryGroup::new("b", 0, 5, 0, "m5.large")
                .tag(ENABLED, "true")
                .tag("k8s.io/cluster-autoscaler/prod", "owned"),
            MemoryGroup::new("c", 0, 5, 0, "m5.large")
                .tag(ENABLED, "true")
                .tag("k8s.io/cluster-autoscaler/staging", "owned"),
            MemoryGroup::new("d", 0, 5, 0, "m5.large")
                .tag("k8s.io/cluster-autoscaler/dev", "owned"),
        ],
        quick(),
    );
    let p = Provider::new(
        Arc::new(cloud),
        ProviderSettings {
            selector: discovery("prd"),
            ..ProviderSettings::default()
        },
    );
    assert_eq!(
        report_in(&p, &Default::default(), &LookedIn::default()).await,
        ExitCode::FAILURE
    );
    let groups = p
        .cloud()
        .describe_groups(&GroupSelector {
            names: vec![],
            tag_sets: vec![vec![TagFilter {
                key: ENABLED.into(),
                value: None,
            }]],
        })
        .await
        .unwrap();
    let seen = cluster_tags_seen(&groups);
    assert_eq!(
        seen,
        [
            ("k8s.io/cluster-autoscaler/prod".to_string(), 2),
            ("k8s.io/cluster-autoscaler/staging".to_string(), 1)
        ]
    );
    assert_eq!(
        cluster_tags_sentence(groups.len(), &seen),
        "Did you mean: the groups tagged k8s.io/cluster-autoscaler/enabled here carry the cluster tags k8s.io/cluster-autoscaler/prod (2 groups), k8s.io/cluster-autoscaler/staging (1 group)"
    );
    assert_eq!(
        cluster_tags_sentence(0, &[]),
        "No Auto Scaling Group in this region carries k8s.io/cluster-autoscaler/enabled"
    );
}
