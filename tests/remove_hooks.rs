//! Issue 62, build 3: uninstall leaves nothing holding instances. `remove-hooks`
//! removes the EC2_INSTANCE_TERMINATING hook this service created (its name AND the
//! group's record), never a hook it did not create; an instance the removed hook held
//! goes on terminating; a second run has nothing to remove. Against the memory cloud
//! (where hooks hold instances) and through the real binary against moto.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_autoscaling as asg;
use ca_asg_provider::cloud::aws::AwsCloud;
use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryGroup, MemoryTiming};
use ca_asg_provider::cloud::{Cloud, GroupSelector, LifecycleHook, LifecycleState};
use ca_asg_provider::scalein::decide::hooks::HOOK_RECORD_TAG;
use ca_asg_provider::scalein::remove_hooks::{remove_hooks, Outcome, RemoveOptions};

const OURS: &str = "ca-asg-provider-drain";
const ENABLED: &str = "k8s.io/cluster-autoscaler/enabled";
const CLUSTER: &str = "k8s.io/cluster-autoscaler/prod";

fn hook(name: &str) -> LifecycleHook {
    LifecycleHook {
        name: name.into(),
        heartbeat_timeout_secs: 3600,
        default_result: "ABANDON".into(),
    }
}

fn discovery() -> GroupSelector {
    ca_asg_provider::world::tagged(&[ENABLED, CLUSTER])
}

fn opts(include_unmarked: bool, dry_run: bool) -> RemoveOptions {
    RemoveOptions {
        name: OURS.into(),
        include_unmarked,
        dry_run,
        region: "us-east-1".into(),
    }
}

fn managed(name: &str) -> MemoryGroup {
    MemoryGroup::new(name, 0, 5, 2, "m5.large")
        .tag(ENABLED, "true")
        .tag(CLUSTER, "owned")
}

async fn run(cloud: &MemoryCloud, o: &RemoveOptions) -> BTreeMap<String, Outcome> {
    let mut lines = Vec::new();
    let reports = remove_hooks(cloud, &discovery(), o, |r| lines.push(r.line(o)))
        .await
        .unwrap();
    println!("{}", lines.join("\n"));
    reports.into_iter().map(|r| (r.group, r.outcome)).collect()
}

async fn hook_names(cloud: &dyn Cloud, group: &str) -> Vec<String> {
    let mut names: Vec<String> = cloud
        .terminating_hooks(group)
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.name)
        .collect();
    names.sort();
    names
}

use support::world::state_of;

/// Our recorded hook goes, with its record, and the instance it held in
/// Terminating:Wait goes on terminating (AWS's CONTINUE): a scale-in is no longer
/// held. A hook of our name without the record is kept unless asked; EKS's hook and
/// any group the configuration does not name are never touched. A second run has
/// nothing to remove.
#[tokio::test]
async fn removes_only_the_hooks_it_created_and_lets_held_instances_go() {
    let cloud = MemoryCloud::new(
        vec![
            managed("web").hook(hook(OURS)).tag(HOOK_RECORD_TAG, OURS),
            managed("eks")
                .eks_managed("prod", "ng-1", 900)
                .hook(hook(OURS))
                .tag(HOOK_RECORD_TAG, OURS),
            managed("old").hook(hook(OURS)),
            managed("plain"),
            // Not the configuration's: never read, never touched.
            MemoryGroup::new("other-cluster", 0, 5, 1, "m5.large")
                .tag(ENABLED, "true")
                .hook(hook(OURS))
                .tag(HOOK_RECORD_TAG, OURS),
        ],
        MemoryTiming {
            launch_delay: Duration::ZERO,
            terminate_delay: Duration::from_secs(3600),
            hook_delay: Duration::ZERO,
        },
    );
    let held = cloud.external_scale_in("web", 1).unwrap().remove(0);
    assert_eq!(
        state_of(&cloud, &held),
        Some(LifecycleState::TerminatingWait)
    );

    // A dry run changes nothing.
    let dry = run(&cloud, &opts(false, true)).await;
    assert_eq!(dry["web"], Outcome::WouldRemove { marked: true });
    assert_eq!(cloud.calls().get("delete_terminating_hook"), None);
    assert_eq!(hook_names(&cloud, "web").await, [OURS]);

    let first = run(&cloud, &opts(false, false)).await;
    let removed = Outcome::Removed {
        marked: true,
        record_left: None,
    };
    assert_eq!(first["web"], removed);
    assert_eq!(first["eks"], removed);
    assert_eq!(first["old"], Outcome::KeptUnmarked);
    assert_eq!(first["plain"], Outcome::NothingToRemove);
    assert!(!first.contains_key("other-cluster"), "{first:?}");
    assert!(hook_names(&cloud, "web").await.is_empty());
    assert_eq!(hook_names(&cloud, "eks").await, ["Terminate-LC-Hook"]);
    assert_eq!(hook_names(&cloud, "old").await, [OURS]);
    assert_eq!(hook_names(&cloud, "other-cluster").await, [OURS]);
    // The held instance is let go (no longer waiting for a hook nobody answers).
    assert_eq!(
        state_of(&cloud, &held),
        Some(LifecycleState::TerminatingProceed)
    );
    // The record went with the hook.
    let groups = cloud.describe_groups(&discovery()).await.unwrap();
    let web = groups.iter().find(|g| g.name == "web").unwrap();
    assert!(!web.tags.contains_key(HOOK_RECORD_TAG), "{:?}", web.tags);
    // A new scale-in of the group is not held at all.
    let next = cloud.external_scale_in("web", 1).unwrap().remove(0);
    assert_eq!(state_of(&cloud, &next), Some(LifecycleState::Terminating));

    // Idempotent: nothing left to remove, no delete called.
    let deletes = cloud.calls().get("delete_terminating_hook").copied();
    let second = run(&cloud, &opts(false, false)).await;
    assert_eq!(second["web"], Outcome::NothingToRemove);
    assert_eq!(second["eks"], Outcome::NothingToRemove);
    assert_eq!(second["old"], Outcome::KeptUnmarked);
    assert_eq!(
        cloud.calls().get("delete_terminating_hook").copied(),
        deletes
    );

    // Asked for, the unmarked hook of our name goes too; EKS's still stays.
    let third = run(&cloud, &opts(true, false)).await;
    assert_eq!(
        third["old"],
        Outcome::Removed {
            marked: false,
            record_left: None
        }
    );
    assert!(hook_names(&cloud, "old").await.is_empty());
    assert_eq!(hook_names(&cloud, "eks").await, ["Terminate-LC-Hook"]);
}

/// A refused delete is a failure of that group, said in a plain sentence with what
/// to check (never the error's Debug text); the other groups are still done, and a
/// run after the fix removes what was left.
#[tokio::test]
async fn a_refused_delete_fails_that_group_in_plain_words() {
    let cloud = MemoryCloud::new(
        vec![
            managed("a").hook(hook(OURS)).tag(HOOK_RECORD_TAG, OURS),
            managed("b").hook(hook(OURS)).tag(HOOK_RECORD_TAG, OURS),
        ],
        MemoryTiming::default(),
    );
    cloud.refuse("delete_terminating_hook", "AccessDenied", 1);
    let o = opts(false, false);
    let reports = remove_hooks(&cloud, &discovery(), &o, |_| {})
        .await
        .unwrap();
    let failed: Vec<_> = reports.iter().filter(|r| r.failed()).collect();
    assert_eq!(failed.len(), 1, "{reports:?}");
    let line = failed[0].line(&o);
    println!("{line}");
    assert!(line.contains("FAILED"), "{line}");
    assert!(line.contains("autoscaling:DeleteLifecycleHook"), "{line}");
    assert!(!line.contains("Rejected {"), "{line}");
    assert_eq!(reports.iter().filter(|r| !r.failed()).count(), 1);
    let again = run(&cloud, &o).await;
    assert_eq!(
        again
            .values()
            .filter(|o| o == &&Outcome::NothingToRemove)
            .count(),
        1
    );
    assert!(again.values().any(|o| matches!(o, Outcome::Removed { .. })));
}

// ---- through the real binary, against moto ----

async fn moto_group(sdk: &aws_config::SdkConfig, name: &str, tags: &[(&str, &str)]) {
    let req = support::moto::group_on(&asg::Client::new(sdk), name, "lt", "$Default")
        .max_size(5)
        .desired_capacity(1);
    support::moto::tagged(req, name, tags).send().await.unwrap();
}

/// The AWS backend's three new calls against moto: the record is a group tag that
/// DescribeAutoScalingGroups reads back, DeleteTags removes it, DeleteLifecycleHook
/// removes the hook and leaves the others.
#[tokio::test]
async fn aws_backend_records_and_removes_over_moto() {
    let moto = support::moto::MotoServer::start();
    let sdk = moto.sdk_config().await;
    support::moto::launch_template(&sdk, "lt").await;
    moto_group(&sdk, "web", &[(ENABLED, "true"), (CLUSTER, "owned")]).await;
    let cloud = AwsCloud::from_sdk_config(&sdk);
    ours_and_one_by_hand_on_web(&cloud).await;
    let g = cloud.describe_groups(&discovery()).await.unwrap().remove(0);
    assert_eq!(g.tags.get(HOOK_RECORD_TAG).map(String::as_str), Some(OURS));
    assert_eq!(hook_names(&cloud, "web").await, ["by-hand", OURS]);
    cloud.delete_terminating_hook("web", OURS).await.unwrap();
    cloud.untag_group("web", HOOK_RECORD_TAG).await.unwrap();
    let g = cloud.describe_groups(&discovery()).await.unwrap().remove(0);
    assert!(!g.tags.contains_key(HOOK_RECORD_TAG), "{:?}", g.tags);
    assert_eq!(g.tags.get(ENABLED).map(String::as_str), Some("true"));
    assert_eq!(hook_names(&cloud, "web").await, ["by-hand"]);
}

/// On group `web`: our hook, recorded as ours in the group's tag, and one put there
/// by hand.
async fn ours_and_one_by_hand_on_web(cloud: &AwsCloud) {
    cloud.tag_group("web", HOOK_RECORD_TAG, OURS).await.unwrap();
    cloud
        .put_terminating_hook("web", &hook(OURS))
        .await
        .unwrap();
    cloud
        .put_terminating_hook("web", &hook("by-hand"))
        .await
        .unwrap();
}

/// The shipped binary as the chart's uninstall Job runs it: exit 0 with one line per
/// group, our hook gone, the unmarked one kept with the aws command that removes it,
/// the foreign one untouched; a terminated instance then ends at once; a second run
/// says there is nothing to remove; a bad configuration exits 2.
#[tokio::test]
async fn the_binary_removes_our_hooks_over_moto_and_a_second_run_has_nothing_to_do() {
    let moto = support::moto::MotoServer::start();
    let sdk = moto.sdk_config().await;
    support::moto::launch_template(&sdk, "lt").await;
    let tags = [(ENABLED, "true"), (CLUSTER, "owned")];
    moto_group(&sdk, "web", &tags).await;
    moto_group(&sdk, "old", &tags).await;
    let cloud = AwsCloud::from_sdk_config(&sdk);
    ours_and_one_by_hand_on_web(&cloud).await;
    cloud
        .put_terminating_hook("old", &hook(OURS))
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!("aws:\n  region: us-east-1\nautoDiscovery:\n  - tags: [{ENABLED}, {CLUSTER}]\n"),
    )
    .unwrap();
    let remove = |extra: &[&str]| {
        let mut cmd = support::moto::offline("remove-hooks", &moto.url, &config, dir.path());
        cmd.args(extra);
        support::moto::said(&mut cmd, &format!("remove-hooks {extra:?}"))
    };

    let (code, text) = remove(&[]);
    assert_eq!(code, Some(0), "{text}");
    support::assert_says(&text, &[
        "web: removed hook ca-asg-provider-drain (created by this service)",
        "[other hooks left alone: by-hand]",
        "old: kept hook ca-asg-provider-drain",
        "aws autoscaling delete-lifecycle-hook --region us-east-1 --auto-scaling-group-name old --lifecycle-hook-name ca-asg-provider-drain",
    ]);
    assert!(!text.contains("{ "), "Debug text in:\n{text}");
    assert_eq!(hook_names(&cloud, "web").await, ["by-hand"]);
    assert_eq!(hook_names(&cloud, "old").await, [OURS]);

    // A scale-in of the group: the instance ends, no hook of ours waits for it.
    let client = asg::Client::new(&sdk);
    let id = cloud
        .describe_groups(&ca_asg_provider::world::named(&["web"]))
        .await
        .unwrap()
        .remove(0)
        .instances
        .remove(0)
        .id;
    client
        .terminate_instance_in_auto_scaling_group()
        .instance_id(&id)
        .should_decrement_desired_capacity(true)
        .send()
        .await
        .unwrap();
    let still = cloud
        .locate_instances(std::slice::from_ref(&id))
        .await
        .unwrap();
    assert!(
        still
            .iter()
            .all(|l| l.state != LifecycleState::TerminatingWait),
        "{still:?}"
    );

    let (code, text) = remove(&[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("web: nothing to remove (no hook named ca-asg-provider-drain)"),
        "{text}"
    );

    let (code, text) = remove(&["--include-unmarked"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("old: removed hook"), "{text}");
    assert!(hook_names(&cloud, "old").await.is_empty());

    std::fs::write(&config, "scaleIn:\n  nope: 1\n").unwrap();
    let (code, text) = remove(&[]);
    assert_eq!(code, Some(2), "{text}");
}
