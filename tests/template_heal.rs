//! Every cached piece of a template heals (issue 46, item 2): each input has a
//! lifetime on a clock the test moves, a failed read is asked again on the next
//! Refresh, and the template is rebuilt when what it is built from changes. The
//! memory cloud answers DescribeNodegroup, launch template versions and instance
//! types; the provider is driven through `refresh` as CA's Refresh RPC drives it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryGroup, MemoryTiming};
use ca_asg_provider::cloud::{EksNodegroup, Taint};
use ca_asg_provider::provider::templates::{
    ManualClock, Part, EKS_NODEGROUP_TTL, FLOATING_LAUNCH_TTL, INSTANCE_TYPE_TTL, PINNED_LAUNCH_TTL,
};
use ca_asg_provider::provider::{Provider, ProviderSettings};
use ca_asg_provider::telemetry::metrics::{metrics, TemplatePartLabels};
use k8s_pb::api::core::v1::Node;
use prost::Message;

#[path = "support/templates.rs"]
mod templates;

fn quick() -> MemoryTiming {
    ca_asg_provider::sim::world::instant_timing()
}

/// A provider over `groups` with a hand-moved template clock, loaded once.
async fn provider(groups: Vec<MemoryGroup>) -> (MemoryCloud, Arc<Provider>, ManualClock) {
    provider_with(groups, |_| {}).await
}

/// The same, with `before` done to the cloud before the first refresh.
async fn provider_with(
    groups: Vec<MemoryGroup>,
    before: impl FnOnce(&MemoryCloud),
) -> (MemoryCloud, Arc<Provider>, ManualClock) {
    let names = groups.iter().map(|g| g.name.clone()).collect();
    let cloud = MemoryCloud::new(groups, quick());
    before(&cloud);
    let (p, clock) = templates::provider_on_manual_clock(Arc::new(cloud.clone()), names).await;
    (cloud, p, clock)
}

/// CA's Refresh (the ASGs are not due: only templates heal), then the prefetch.
async fn ca_refresh(p: &Arc<Provider>) {
    p.refresh().await.unwrap();
    p.templates_prefetched().await;
}

struct Seen {
    labels: BTreeMap<String, String>,
    taints: Vec<(String, String, String)>,
}

async fn template(p: &Provider, group: &str) -> Seen {
    let bytes = p.template_node(group).await.unwrap();
    let node = Node::decode(bytes.as_ref()).unwrap();
    let labels = node.metadata.unwrap().labels;
    let taints = templates::taint_triples(node.spec.unwrap().taints).collect();
    Seen { labels, taints }
}

fn incomplete(group: &str, part: &'static str) -> i64 {
    metrics()
        .template_incomplete
        .get_or_create(&TemplatePartLabels {
            node_group: group.to_string(),
            part,
        })
        .get()
}

fn calls(cloud: &MemoryCloud, op: &str) -> u64 {
    cloud.calls().get(op).copied().unwrap_or(0)
}

fn node_group(label: &str, taint: Option<&str>) -> EksNodegroup {
    EksNodegroup {
        name: Some("ng-1".into()),
        labels: BTreeMap::from([("team".into(), label.into())]),
        taints: taint
            .map(|k| Taint {
                key: k.into(),
                value: "true".into(),
                effect: "NoSchedule".into(),
            })
            .into_iter()
            .collect(),
        capacity_type: Some("SPOT".into()),
        ami_type: Some("AL2023_x86_64_STANDARD".into()),
        ..Default::default()
    }
}

fn managed(name: &str) -> MemoryGroup {
    MemoryGroup::new(name, 0, 5, 0, "m5.large").eks_managed("prod", name, 300)
}

#[tokio::test]
async fn a_throttled_describe_nodegroup_heals_on_the_next_refresh() {
    let g = "eks-throttled";
    // The first DescribeNodegroup is throttled.
    let (cloud, p, _clock) = provider_with(vec![managed(g)], |cloud| {
        cloud.set_eks_nodegroup("prod", g, Some(node_group("ml", Some("dedicated"))));
        cloud.throttle("eks_nodegroup", 1);
    })
    .await;
    let t = template(&p, g).await;
    assert!(
        !t.labels.contains_key("eks.amazonaws.com/capacityType"),
        "built while DescribeNodegroup was throttled"
    );
    let f = p.template_findings(g).unwrap();
    assert!(
        f.incomplete
            .iter()
            .any(|(part, why)| *part == Part::EksNodegroup && why.contains("throttled")),
        "{f:?}"
    );
    assert_eq!(incomplete(g, "eks_nodegroup"), 1);

    // CA's next Refresh (the ASGs are not due) asks EKS again; no clock moved.
    ca_refresh(&p).await;
    assert_eq!(calls(&cloud, "eks_nodegroup"), 2);
    let t = template(&p, g).await;
    assert_eq!(t.labels["eks.amazonaws.com/capacityType"], "SPOT");
    assert_eq!(t.labels["team"], "ml");
    assert!(
        t.taints
            .contains(&("dedicated".into(), "true".into(), "NoSchedule".into())),
        "{:?}",
        t.taints
    );
    assert!(p.template_findings(g).unwrap().incomplete.is_empty());
    assert_eq!(incomplete(g, "eks_nodegroup"), 0);

    // A healed group is not asked again before its answer's lifetime.
    ca_refresh(&p).await;
    assert_eq!(calls(&cloud, "eks_nodegroup"), 2);
}

#[tokio::test]
async fn eks_answers_found_or_refused_are_read_again_after_their_lifetime() {
    let g = "eks-refused";
    let (cloud, p, clock) = provider_with(vec![managed(g)], |cloud| {
        cloud.set_eks_nodegroup("prod", g, Some(node_group("ml", None)));
        cloud.refuse("eks_nodegroup", "AccessDeniedException", 1);
    })
    .await;
    assert!(!template(&p, g).await.labels.contains_key("team"));
    let f = p.template_findings(g).unwrap();
    assert!(
        f.incomplete
            .iter()
            .any(|(part, why)| *part == Part::EksNodegroup && why.contains("AccessDenied")),
        "{f:?}"
    );
    // The refusal is an answer: kept for its lifetime, not asked every loop.
    ca_refresh(&p).await;
    assert_eq!(calls(&cloud, "eks_nodegroup"), 1);
    // The permission is fixed; after the lifetime the next Refresh reads it.
    clock.advance(EKS_NODEGROUP_TTL);
    ca_refresh(&p).await;
    assert_eq!(calls(&cloud, "eks_nodegroup"), 2);
    let t = template(&p, g).await;
    assert_eq!(t.labels["team"], "ml");
    assert_eq!(incomplete(g, "eks_nodegroup"), 0);

    // UpdateNodegroupConfig: new labels and a taint reach the template after the
    // lifetime, not before.
    cloud.set_eks_nodegroup("prod", g, Some(node_group("web", Some("web-only"))));
    clock.advance(EKS_NODEGROUP_TTL - Duration::from_secs(1));
    ca_refresh(&p).await;
    assert_eq!(template(&p, g).await.labels["team"], "ml");
    clock.advance(Duration::from_secs(1));
    ca_refresh(&p).await;
    let t = template(&p, g).await;
    assert_eq!(t.labels["team"], "web");
    assert!(t
        .taints
        .contains(&("web-only".into(), "true".into(), "NoSchedule".into())));
}

/// `$Default` (no version named) and `$Latest`: a new version's instance type and
/// user data reach the template within [`FLOATING_LAUNCH_TTL`], without a restart.
async fn new_floating_version_reaches_the_template(g: MemoryGroup) {
    let name = g.name.clone();
    let (cloud, p, clock) = provider(vec![g.user_data(
        "#!/bin/bash\n/etc/eks/bootstrap.sh c --kubelet-extra-args '--node-labels=release=1'\n",
    )])
    .await;
    let t = template(&p, &name).await;
    assert_eq!(t.labels["node.kubernetes.io/instance-type"], "m5.large");
    assert_eq!(t.labels["release"], "1");
    cloud.new_launch_version(
        &name,
        "m5.xlarge",
        Some("#!/bin/bash\n/etc/eks/bootstrap.sh c --kubelet-extra-args '--node-labels=release=2 --register-with-taints=new=yes:NoSchedule'\n"),
    );
    clock.advance(FLOATING_LAUNCH_TTL - Duration::from_secs(1));
    ca_refresh(&p).await;
    assert_eq!(template(&p, &name).await.labels["release"], "1");
    clock.advance(Duration::from_secs(1));
    ca_refresh(&p).await;
    let t = template(&p, &name).await;
    assert_eq!(t.labels["node.kubernetes.io/instance-type"], "m5.xlarge");
    assert_eq!(t.labels["release"], "2");
    assert!(t
        .taints
        .contains(&("new".into(), "yes".into(), "NoSchedule".into())));
}

#[tokio::test]
async fn a_new_default_launch_template_version_reaches_the_template_without_a_restart() {
    new_floating_version_reaches_the_template(MemoryGroup::new("lt-default", 0, 5, 0, "m5.large"))
        .await;
}

#[tokio::test]
async fn a_new_latest_launch_template_version_reaches_the_template_without_a_restart() {
    new_floating_version_reaches_the_template(
        MemoryGroup::new("lt-latest", 0, 5, 0, "m5.large").launch_template_version("$Latest"),
    )
    .await;
}

#[tokio::test]
async fn a_pinned_version_and_instance_types_are_read_again_only_after_their_lifetimes() {
    let g = "lt-pinned";
    let (cloud, p, clock) = provider(vec![
        MemoryGroup::new(g, 0, 5, 0, "m5.large").launch_template_version("3")
    ])
    .await;
    template(&p, g).await;
    let (lt, it) = (
        calls(&cloud, "launch_template"),
        calls(&cloud, "instance_types"),
    );
    clock.advance(FLOATING_LAUNCH_TTL * 2);
    ca_refresh(&p).await;
    assert_eq!(
        calls(&cloud, "launch_template"),
        lt,
        "a numbered version never changes"
    );
    clock.advance(PINNED_LAUNCH_TTL);
    ca_refresh(&p).await;
    assert_eq!(calls(&cloud, "launch_template"), lt + 1);
    assert_eq!(calls(&cloud, "instance_types"), it);
    clock.advance(INSTANCE_TYPE_TTL);
    ca_refresh(&p).await;
    assert_eq!(calls(&cloud, "instance_types"), it + 1);
}

#[tokio::test]
async fn a_failed_re_read_keeps_the_last_answer_and_is_asked_again() {
    let g = "lt-throttled";
    let (cloud, p, clock) = provider(vec![MemoryGroup::new(g, 0, 5, 0, "m5.large")]).await;
    cloud.new_launch_version(g, "m5.xlarge", None);
    clock.advance(FLOATING_LAUNCH_TTL);
    cloud.throttle("launch_template", 2);
    ca_refresh(&p).await;
    let t = template(&p, g).await;
    assert_eq!(
        t.labels["node.kubernetes.io/instance-type"], "m5.large",
        "the last answer, not none"
    );
    assert_eq!(incomplete(g, "launch_data"), 1);
    assert!(p
        .template_findings(g)
        .unwrap()
        .incomplete
        .iter()
        .any(|(part, _)| *part == Part::LaunchData));
    ca_refresh(&p).await;
    assert_eq!(incomplete(g, "launch_data"), 0);
    assert_eq!(
        template(&p, g).await.labels["node.kubernetes.io/instance-type"],
        "m5.xlarge"
    );
}

#[tokio::test]
async fn check_config_counts_a_template_built_from_incomplete_data_as_a_problem() {
    let g = "eks-check";
    let (cloud, p, _clock) = provider_with(vec![managed(g)], |cloud| {
        cloud.set_eks_nodegroup("prod", g, Some(node_group("ml", None)));
    })
    .await;
    let report =
        || async { ca_asg_provider::commands::check::report(&p, &Default::default()).await };
    assert_eq!(report().await, std::process::ExitCode::SUCCESS);
    // Both the prefetch after check-config's own refresh and check-config's read
    // are throttled: the template it prints lacks the EKS data, and it says so.
    let p2 = Provider::new(
        Arc::new(cloud.clone()),
        ProviderSettings {
            selector: ca_asg_provider::world::named(&[g]),
            ..ProviderSettings::default()
        },
    );
    cloud.throttle("eks_nodegroup", 2);
    assert_eq!(
        ca_asg_provider::commands::check::report(&p2, &Default::default()).await,
        std::process::ExitCode::FAILURE
    );
    let problems =
        ca_asg_provider::commands::check::template_problems(g, p2.template_findings(g).as_ref());
    assert!(
        problems
            .iter()
            .any(|l| l.contains("incomplete data (eks_nodegroup)") && l.contains("prod/eks-check")),
        "{problems:?}"
    );
    p2.templates_prefetched().await;
    cloud.heal();
    ca_refresh(&p2).await;
    assert!(ca_asg_provider::commands::check::template_problems(
        g,
        p2.template_findings(g).as_ref()
    )
    .is_empty());
}

#[tokio::test]
async fn check_config_names_each_user_data_setting_the_template_does_not_read() {
    let g = "ud-unread";
    let (_cloud, p, _clock) = provider(vec![MemoryGroup::new(g, 0, 5, 0, "m5.large")
        .user_data("#!/bin/bash\n/etc/eks/bootstrap.sh c --kubelet-extra-args '--reserved-cpus=0-1 --node-label=team=ml --kube-reserved=memory=lots'\n")])
    .await;
    assert_eq!(
        ca_asg_provider::commands::check::report(&p, &Default::default()).await,
        std::process::ExitCode::FAILURE
    );
    let problems =
        ca_asg_provider::commands::check::template_problems(g, p.template_findings(g).as_ref());
    assert_eq!(problems.len(), 3, "{problems:?}");
    for needle in ["--reserved-cpus=\"0-1\"", "--node-label", "\"lots\""] {
        assert!(
            problems.iter().any(|l| l.contains(needle) && l.contains(g)),
            "{needle} in {problems:?}"
        );
    }
    assert_eq!(incomplete(g, "user_data"), 1);
}

#[tokio::test]
async fn a_template_that_cannot_be_built_is_not_tried_on_every_refresh() {
    let g = "unknown-type";
    let (cloud, p, clock) = provider(vec![MemoryGroup::new(g, 0, 5, 0, "x9.huge")]).await;
    assert!(p.template_node(g).await.is_err());
    let asked = calls(&cloud, "instance_types");
    for _ in 0..3 {
        ca_refresh(&p).await;
    }
    assert_eq!(calls(&cloud, "instance_types"), asked);
    clock.advance(FLOATING_LAUNCH_TTL);
    ca_refresh(&p).await;
    assert!(calls(&cloud, "instance_types") > asked, "tried again");
}
