//! `check-config` and `drain NODE` through the same code the binary runs.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use ca_asg_provider::cloud::memory::{MemoryCloud, MemoryGroup, MemoryTiming};
use ca_asg_provider::commands::drain::DrainArgs;
use ca_asg_provider::config::ConfigArgs;
use ca_asg_provider::provider::{Bounds, Provider, ProviderSettings};
use ca_asg_provider::sim::{fixtures, SimCluster, SimOptions};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use kube::api::ObjectMeta;

mod support;

#[tokio::test]
async fn check_config_reports_groups_and_problems() {
    let cloud = MemoryCloud::new(
        vec![MemoryGroup::new("web", 1, 5, 1, "m5.large")],
        MemoryTiming::default(),
    );
    let ok = ProviderSettings {
        selector: ca_asg_provider::world::named(&["web"]),
        ..ProviderSettings::default()
    };
    let p = Provider::new(Arc::new(cloud.clone()), ok);
    assert_eq!(
        ca_asg_provider::commands::check::report(&p, &Default::default()).await,
        ExitCode::SUCCESS
    );
    // A missing group and bounds outside the ASG's are problems: exit 1.
    let mut bad = ProviderSettings {
        selector: ca_asg_provider::world::named(&["web", "gone"]),
        ..ProviderSettings::default()
    };
    bad.static_bounds.insert(
        "web".into(),
        Bounds {
            min: Some(0),
            max: Some(50),
        },
    );
    let p = Provider::new(Arc::new(cloud), bad);
    assert_eq!(
        ca_asg_provider::commands::check::report(&p, &Default::default()).await,
        ExitCode::FAILURE
    );
}

#[tokio::test]
async fn invalid_config_files_name_the_key_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(
        &path,
        "nodeGroups:\n  - {name: web, minSize: 3, maxSize: 1}\nrefreshInterval: often\n",
    )
    .unwrap();
    let args = ConfigArgs {
        config: Some(path.clone()),
        ..Default::default()
    };
    let e = args.load().unwrap_err().to_string();
    assert!(e.contains("c.yaml"), "{e}");
    assert!(
        e.contains("nodeGroups[0]") && e.contains("refreshInterval") && e.contains("often"),
        "{e}"
    );
    std::fs::write(&path, "nodeGroup: []\n").unwrap();
    let e = args.load().unwrap_err().to_string();
    assert!(e.contains("nodeGroup") && e.contains("c.yaml"), "{e}");
}

#[tokio::test]
async fn drain_command_dry_run_changes_nothing_and_drain_leaves_the_node_cordoned() {
    let sim = SimCluster::start(SimOptions {
        ready_delay: Duration::from_millis(30),
    })
    .await
    .unwrap();
    n1_with_fluentd_and_an_app(&sim, 0.1);
    support::eventually("both pods", 10, || sim.list::<Pod>().len() >= 2).await;
    let cfg = drain_config();
    let mut args = DrainArgs {
        dry_run: true,
        ..drain_args("n1")
    };
    ca_asg_provider::commands::drain::drain(sim.client(), &cfg, &args)
        .await
        .unwrap();
    assert_eq!(sim.list::<Pod>().len(), 2, "dry run evicts nothing");
    assert!(sim.get::<Node>("", "n1").unwrap()["spec"]["unschedulable"].is_null());
    args.dry_run = false;
    ca_asg_provider::commands::drain::drain(sim.client(), &cfg, &args)
        .await
        .unwrap();
    assert!(
        sim.list::<Pod>()
            .iter()
            .all(|p| p["spec"]["nodeName"] != "n1"),
        "drained"
    );
    assert_eq!(
        sim.get::<Node>("", "n1").unwrap()["spec"]["unschedulable"],
        true,
        "left cordoned"
    );
    let e = ca_asg_provider::commands::drain::drain(
        sim.client(),
        &cfg,
        &DrainArgs {
            node: "nope".into(),
            ..args
        },
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("nope"));
}

#[tokio::test]
async fn the_drain_waits_for_volume_attachments_to_detach() {
    let sim = Arc::new(SimCluster::start(SimOptions::default()).await.unwrap());
    sim.create(&fixtures::node("n1", "aws:///us-east-1a/i-0abc", &[]))
        .unwrap();
    let va = VolumeAttachment {
        metadata: ObjectMeta {
            name: Some("csi-1".into()),
            ..Default::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: "ebs.csi.aws.com".into(),
            node_name: "n1".into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some("pv-1".into()),
                ..Default::default()
            },
        },
        status: None,
    };
    sim.create(&va).unwrap();
    let s2 = sim.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        s2.remove::<VolumeAttachment>("", "csi-1");
    });
    let cfg = drain_config();
    let args = drain_args("n1");
    ca_asg_provider::commands::drain::drain(sim.client(), &cfg, &args)
        .await
        .unwrap();
    let audit = sim.audit();
    let va_gone = audit
        .iter()
        .position(|a| a.kind == "VolumeAttachment" && a.verb == "removed")
        .expect("detached");
    let events: Vec<String> = sim
        .list::<k8s_openapi::api::events::v1::Event>()
        .iter()
        .map(|e| e["reason"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(events.iter().any(|r| r == "VolumesDetached"), "{events:?}");
    let detached_event = audit
        .iter()
        .rposition(|a| a.kind == "Event" && a.verb == "create")
        .unwrap();
    assert!(
        va_gone < detached_event,
        "the drain finished only after the attachment was gone"
    );
}

#[test]
fn check_config_warns_of_another_drainers_hook_and_a_hook_shorter_than_the_poll() {
    use ca_asg_provider::cloud::LifecycleHook;
    use ca_asg_provider::commands::check::hook_problems;
    let hook = |name: &str, secs| LifecycleHook {
        name: name.into(),
        heartbeat_timeout_secs: secs,
        default_result: "CONTINUE".into(),
    };
    let poll = Duration::from_secs(15);
    let tags = Default::default();
    assert!(hook_problems("web", &tags, &[hook("ours", 300)], "ours", poll).is_empty());
    let p = hook_problems(
        "web",
        &tags,
        &[hook("ours", 300), hook("nth", 300)],
        "ours",
        poll,
    );
    assert_eq!(p.len(), 1);
    assert!(
        p[0].contains("\"nth\"") && p[0].contains("two drainers"),
        "{p:?}"
    );
    let p = hook_problems("web", &tags, &[hook("ours", 10)], "ours", poll);
    assert!(
        p[0].contains("10s") && p[0].contains("lifecyclePollInterval 15s"),
        "{p:?}"
    );
}

/// EKS's own Terminate-LC-Hook on a managed node group (both EKS tags) is explained,
/// not reported: with our hook or without it. NTH's hook, an unknown hook, an EKS-named
/// hook on a group without the EKS tags, and our hook named as EKS's on a managed node
/// group stay problems.
#[test]
fn check_config_explains_eks_managed_node_group_hooks_and_still_fails_on_a_second_drainer() {
    use ca_asg_provider::cloud::LifecycleHook;
    use ca_asg_provider::commands::check::{hook_notes, hook_problems};
    use std::collections::BTreeMap;
    let hook = |name: &str| LifecycleHook {
        name: name.into(),
        heartbeat_timeout_secs: 300,
        default_result: "CONTINUE".into(),
    };
    let poll = Duration::from_secs(15);
    let managed: BTreeMap<String, String> =
        [("eks:nodegroup-name", "ng-1"), ("eks:cluster-name", "prod")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    let plain = BTreeMap::new();
    let only_cluster_tag: BTreeMap<String, String> =
        [("eks:cluster-name".to_string(), "prod".to_string())].into();
    let eks = hook("Terminate-LC-Hook");
    // Managed node group, with our hook and without it: no problem, an explanation.
    for hooks in [vec![hook("ours"), eks.clone()], vec![eks.clone()]] {
        assert!(
            hook_problems("ng", &managed, &hooks, "ours", poll).is_empty(),
            "{hooks:?}"
        );
        let notes = hook_notes("ng", &managed, &hooks, "ours");
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("EKS's own hook") && notes[0].contains("ng-1"));
    }
    let with = &hook_notes("ng", &managed, &[hook("ours"), eks.clone()], "ours")[0];
    for s in [
        "waits for every hook",
        "Eviction API",
        "does not evict DaemonSet pods",
    ] {
        assert!(with.contains(s), "{s:?} not in {with}");
    }
    // A real second drainer stays a problem, on a managed node group too.
    for (tags, hooks, why) in [
        (
            &managed,
            vec![hook("ours"), eks.clone(), hook("nth-hook")],
            "\"nth-hook\"",
        ),
        (&managed, vec![hook("ours"), hook("unknown")], "\"unknown\""),
        (&plain, vec![hook("ours"), eks.clone()], "lacks the tags"),
        (&only_cluster_tag, vec![eks.clone()], "lacks the tags"),
        (
            &managed,
            vec![hook("ours"), hook("Launch-LC-Hook")],
            "launch hook",
        ),
    ] {
        let p = hook_problems("ng", tags, &hooks, "ours", poll);
        assert_eq!(p.len(), 1, "{hooks:?} {tags:?}: {p:?}");
        assert!(p[0].contains("two drainers") && p[0].contains(why), "{p:?}");
        assert!(
            hook_notes("ng", tags, &hooks, "ours").len() <= 1,
            "only EKS's hook is explained"
        );
    }
    // Our hook named as EKS's on a managed node group would complete EKS's actions.
    let p = hook_problems(
        "ng",
        &managed,
        std::slice::from_ref(&eks),
        "Terminate-LC-Hook",
        poll,
    );
    assert!(p.len() == 1 && p[0].contains("another name"), "{p:?}");
    assert!(hook_problems("ng", &plain, &[eks], "Terminate-LC-Hook", poll).is_empty());
}

#[tokio::test]
async fn check_config_finds_missing_kubernetes_permissions() {
    use ca_asg_provider::scalein::kube::permissions::{check, REQUIRED};
    use ca_asg_provider::sim::Grant;
    let sim = SimCluster::start(SimOptions::default()).await.unwrap();
    let grant = |verbs: &[&str], group: &str, resources: &[&str]| Grant {
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        groups: vec![group.to_string()],
        resources: resources.iter().map(|s| s.to_string()).collect(),
    };
    // Everything the ClusterRole grants, except watching pods and evicting.
    sim.grant(vec![
        grant(&["get", "list", "watch", "patch"], "", &["nodes"]),
        grant(&["patch"], "", &["nodes/status"]),
        grant(&["get", "list", "delete"], "", &["pods"]),
        grant(&["list", "watch"], "policy", &["poddisruptionbudgets"]),
        grant(&["get"], "", &["persistentvolumeclaims"]),
        grant(&["list", "watch"], "storage.k8s.io", &["volumeattachments"]),
        grant(&["create", "patch"], "events.k8s.io", &["events"]),
        grant(
            &["get", "create", "update"],
            "coordination.k8s.io",
            &["leases"],
        ),
    ]);
    let checked = check(sim.client(), "kube-system", "ca-asg-provider")
        .await
        .unwrap();
    assert_eq!(checked.len(), REQUIRED.len());
    let missing: Vec<(&str, &str)> = checked
        .iter()
        .filter(|c| !c.allowed)
        .map(|c| (c.permission.verb, c.permission.resource))
        .collect();
    assert_eq!(missing, [("watch", "pods"), ("create", "pods/eviction")]);
    assert!(
        !ca_asg_provider::commands::check::kube_report(
            sim.client(),
            "kube-system",
            "ca-asg-provider"
        )
        .await
    );
    // With the ClusterRole deploy/ ships, nothing is missing.
    sim.grant(support::rbac::service_role());
    assert!(
        ca_asg_provider::commands::check::kube_report(
            sim.client(),
            "kube-system",
            "ca-asg-provider"
        )
        .await
    );
}

/// The region is never guessed: with none in the config, the environment or a profile,
/// and no instance metadata service, `check-config` and `serve` refuse to start and
/// say where to set it; given through AWS_REGION, it is used.
#[test]
fn a_missing_region_refuses_to_start_and_says_where_to_set_it() {
    // A closed local port: nothing leaves this machine, and the call fails fast.
    let (dir, cfg) = support::process::config_file(
        "nodeGroups: [{name: web}]\naws: {endpoint: \"http://127.0.0.1:9\", maxAttempts: 1}\n",
    );
    let run = |args: &[&str], region: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ca-asg-provider"));
        cmd.args(args)
            .arg("--config")
            .arg(&cfg)
            .env_remove("AWS_REGION")
            .env_remove("AWS_DEFAULT_REGION")
            .env_remove("AWS_PROFILE")
            .env("HOME", dir.path())
            .env("AWS_CONFIG_FILE", dir.path().join("no-config"))
            .env(
                "AWS_SHARED_CREDENTIALS_FILE",
                dir.path().join("no-credentials"),
            )
            // No instance metadata service is asked (and no packet leaves loopback).
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test");
        if let Some(r) = region {
            cmd.env("AWS_REGION", r);
        }
        // A command that should have refused to start but serves instead is stopped
        // (a guard against hanging the suite, not an assertion on time): it reads as
        // no exit code.
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let since = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if since.elapsed() > std::time::Duration::from_secs(120) {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, text) = run(&["check-config"], None);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("no AWS region") && text.contains("aws.region"),
        "{text}"
    );
    // The SDK's own warnings (its region providers that found nothing) stay quiet at
    // check-config's default log level: the answer is the report (issue 62).
    assert!(!text.contains("aws_config"), "{text}");
    // serve on ports of its own choosing (it must refuse before it listens).
    let serve = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let (code, text) = run(&serve, None);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("no AWS region"), "{text}");
    // The region is used; AWS (a closed port) does not answer: an AWS problem, exit 1,
    // said as one sentence of what to check, not the SDK's Debug text (issue 62).
    let (code, text) = run(&["check-config"], Some("eu-west-1"));
    assert!(text.contains("region:           eu-west-1"), "{text}");
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("AWS: FAILED to read Auto Scaling Groups: AWS DescribeAutoScalingGroups could not send the request: ")
            && text.contains("check the region (aws.region, --region, AWS_REGION)"),
        "{text}"
    );
    for debug in ["DispatchFailure", "ConnectorError", "Some(", "source:"] {
        assert!(!text.contains(debug), "{debug:?} in:\n{text}");
    }
    // A region AWS cannot have is refused before any call, naming one it can (issue 62).
    let (code, text) = run(&["check-config"], Some("eu-wset-1"));
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("region \"eu-wset-1\" is not an AWS region (expected like eu-west-1)"),
        "{text}"
    );
    assert!(
        !text.contains("node groups found"),
        "no call was made:\n{text}"
    );
    // remove-hooks (uninstall) refuses it the same way, before any call.
    let (code, text) = run(&["remove-hooks"], Some("eu-wset-1"));
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("region \"eu-wset-1\" is not an AWS region (expected like eu-west-1)"),
        "{text}"
    );
    // serve refuses it at start the same way, before it listens or calls AWS.
    let (code, text) = run(&serve, Some("eu-wset-1"));
    assert_ne!(code, Some(0), "{text}");
    assert!(
        text.contains("region \"eu-wset-1\" is not an AWS region (expected like eu-west-1)"),
        "{text}"
    );
}

/// Without credentials, `check-config` says it is a credentials problem and what to
/// check for the kind of credentials the pod was given (IRSA, EKS Pod Identity, or
/// neither), and exits 1; not a long "transient" error chain.
#[test]
fn check_config_without_credentials_says_what_to_check() {
    // A closed local port: nothing leaves this machine.
    let (dir, cfg) = support::process::config_file("nodeGroups: [{name: web}]\naws: {region: eu-west-1, endpoint: \"http://127.0.0.1:9\", maxAttempts: 1}\nscaleIn: {enabled: false}\n");
    let run = |env: &[(&str, String)]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ca-asg-provider"));
        cmd.args(["check-config", "--config"]).arg(&cfg);
        support::process::without_credentials(&mut cmd, dir.path());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, text) = run(&[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("AWS: FAILED to read Auto Scaling Groups: AWS DescribeAutoScalingGroups: no AWS credentials, a credentials problem"),
        "{text}"
    );
    assert!(
        text.contains("Neither IRSA nor EKS Pod Identity reached this pod"),
        "{text}"
    );
    assert!(!text.contains("transient"), "{text}");

    // IRSA's variables present, the token file unreadable: the role's trust is named.
    let (code, text) = run(&[
        (
            "AWS_ROLE_ARN",
            "arn:aws:iam::210987654321:role/ca-asg-provider".into(),
        ),
        (
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            dir.path().join("no-token").display().to_string(),
        ),
    ]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("no AWS credentials"), "{text}");
    assert!(
        text.contains("IRSA is set up for this pod (AWS_ROLE_ARN=arn:aws:iam::210987654321:role/ca-asg-provider"),
        "{text}"
    );
}

/// Pod `ns/name` of one container, the rest of its spec as `set` sets it.
fn pod_with(
    ns: &str,
    name: &str,
    set: impl FnOnce(&mut k8s_openapi::api::core::v1::PodSpec),
) -> Pod {
    let mut spec = k8s_openapi::api::core::v1::PodSpec {
        containers: vec![Default::default()],
        ..Default::default()
    };
    set(&mut spec);
    Pod {
        metadata: ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(spec),
        ..Default::default()
    }
}

fn spread_pod(ns: &str, name: &str, key: &str, when: &str) -> Pod {
    use k8s_openapi::api::core::v1::TopologySpreadConstraint;
    let spread = TopologySpreadConstraint {
        max_skew: 1,
        topology_key: key.into(),
        when_unsatisfiable: when.into(),
        ..Default::default()
    };
    pod_with(ns, name, |s| {
        s.topology_spread_constraints = Some(vec![spread])
    })
}

fn claim_pod(ns: &str, name: &str, claim: &str) -> Pod {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, Volume};
    let volume = Volume {
        name: "data".into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.into(),
            read_only: None,
        }),
        ..Default::default()
    };
    pod_with(ns, name, |s| s.volumes = Some(vec![volume]))
}

fn claim(
    ns: &str,
    name: &str,
    provisioner: Option<&str>,
) -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
    k8s_openapi::api::core::v1::PersistentVolumeClaim {
        metadata: ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            annotations: provisioner.map(|p| {
                [(
                    "volume.kubernetes.io/storage-provisioner".to_string(),
                    p.to_string(),
                )]
                .into()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Which pods pin themselves to zones, from data alone: every zone key with
/// DoNotSchedule counts, ScheduleAnyway and non-zone keys do not; EBS claims and
/// claims that could not be read count, EFS ones do not; finished pods do not.
#[test]
fn zonal_use_finds_zonal_spread_and_zonal_volumes() {
    use ca_asg_provider::commands::check::{zonal_use, ZONE_KEYS};
    use std::collections::BTreeMap;
    let mut pods = Vec::new();
    for (i, key) in ZONE_KEYS.iter().enumerate() {
        pods.push(spread_pod("a", &format!("dns-{i}"), key, "DoNotSchedule"));
        pods.push(spread_pod("a", &format!("any-{i}"), key, "ScheduleAnyway"));
    }
    pods.push(spread_pod(
        "a",
        "host",
        "kubernetes.io/hostname",
        "DoNotSchedule",
    ));
    pods.push(spread_pod("a", "odd", "", ""));
    let mut done = spread_pod("a", "done", ZONE_KEYS[0], "DoNotSchedule");
    done.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Succeeded".into()),
        ..Default::default()
    });
    pods.push(done);
    pods.push(claim_pod("b", "ebs", "c-ebs"));
    pods.push(claim_pod("b", "legacy", "c-legacy"));
    pods.push(claim_pod("b", "efs", "c-efs"));
    pods.push(claim_pod("b", "unread", "c-gone"));
    pods.push(claim_pod("b", "static", "c-static"));
    pods.push(Pod::default());
    let claims: BTreeMap<_, _> = [
        claim("b", "c-ebs", Some("ebs.csi.aws.com")),
        claim("b", "c-legacy", Some("kubernetes.io/aws-ebs")),
        claim("b", "c-efs", Some("efs.csi.aws.com")),
        claim("b", "c-static", None),
    ]
    .into_iter()
    .map(|c| {
        (
            (
                c.metadata.namespace.clone().unwrap(),
                c.metadata.name.clone().unwrap(),
            ),
            c,
        )
    })
    .collect();
    let u = zonal_use(&pods, &claims);
    let want: Vec<String> = (0..ZONE_KEYS.len()).map(|i| format!("a/dns-{i}")).collect();
    assert_eq!(u.spread, want);
    assert_eq!(u.volumes, ["b/ebs", "b/legacy", "b/unread", "b/static"]);
}

/// A warning per group with several zones, none for single-zone groups or when no
/// pod pins itself to a zone; it names the zones, the pods and the fix.
#[test]
fn zonal_warnings_name_multi_zone_groups_and_the_fix() {
    use ca_asg_provider::commands::check::{zonal_warnings, ZonalUse};
    let groups = vec![
        (
            "multi".to_string(),
            vec!["us-east-1b".to_string(), "us-east-1a".to_string()],
        ),
        ("one".to_string(), vec!["us-east-1a".to_string()]),
        (
            "dup".to_string(),
            vec!["us-east-1a".to_string(), "us-east-1a".to_string()],
        ),
        ("none".to_string(), vec![]),
    ];
    assert!(zonal_warnings(&groups, &ZonalUse::default()).is_empty());
    let u = ZonalUse {
        spread: (0..5).map(|i| format!("a/p{i}")).collect(),
        volumes: vec![],
    };
    let w = zonal_warnings(&groups, &u);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("group multi spans 2 zones (us-east-1a, us-east-1b)"),
        "{}",
        w[0]
    );
    assert!(w[0].contains("5 pod(s)") && w[0].contains("a/p0") && w[0].contains("2 more"));
    assert!(w[0].contains("one ASG per zone"), "{}", w[0]);
    let u = ZonalUse {
        spread: vec![],
        volumes: vec!["b/db".into()],
    };
    let w = zonal_warnings(&groups, &u);
    assert_eq!(w.len(), 1);
    assert!(w[0].contains("b/db") && w[0].contains("EBS"), "{}", w[0]);
}

/// Against the API server: pods with a zonal spread and a group over two zones give
/// the warning; the check still passes (a warning, not a problem).
#[tokio::test]
async fn check_config_warns_of_a_multi_zone_group_under_zonal_spread() {
    let sim = SimCluster::start(SimOptions::default()).await.unwrap();
    let cloud = MemoryCloud::new(
        vec![
            MemoryGroup::new("multi", 0, 5, 0, "m5.large").zones(&["us-east-1a", "us-east-1b"]),
            MemoryGroup::new("single", 0, 5, 0, "m5.large").zones(&["us-east-1a"]),
        ],
        MemoryTiming::default(),
    );
    let p = Provider::new(
        Arc::new(cloud),
        ProviderSettings {
            selector: ca_asg_provider::world::named(&["multi", "single"]),
            ..ProviderSettings::default()
        },
    );
    assert_eq!(
        ca_asg_provider::commands::check::report(&p, &Default::default()).await,
        ExitCode::SUCCESS
    );
    let none = ca_asg_provider::commands::check::zonal_report(sim.client(), &p).await;
    assert_eq!(none, Some(vec![]), "no pod pins itself to a zone yet");
    sim.create(&spread_pod(
        "shop",
        "web-1",
        "topology.kubernetes.io/zone",
        "DoNotSchedule",
    ))
    .unwrap();
    sim.create(&spread_pod(
        "shop",
        "web-2",
        "topology.kubernetes.io/zone",
        "ScheduleAnyway",
    ))
    .unwrap();
    let w = ca_asg_provider::commands::check::zonal_report(sim.client(), &p)
        .await
        .expect("pods were read");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].starts_with("group multi spans 2 zones"), "{w:?}");
    assert!(
        w[0].contains("shop/web-1") && !w[0].contains("web-2"),
        "{w:?}"
    );
    // A pod list that cannot be read is not called fine.
    let mut cfg = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
    cfg.default_namespace = "default".into();
    let unreachable = kube::Client::try_from(cfg).unwrap();
    let unread = ca_asg_provider::commands::check::zonal_report(unreachable, &p).await;
    assert_eq!(unread, None);
}

/// `check-config`'s Kubernetes requests say who sends them (the audit log's userAgent).
#[tokio::test]
async fn check_config_requests_say_who_is_calling() {
    let sim = SimCluster::start(SimOptions::default()).await.unwrap();
    let who = "system:serviceaccount:kube-system:check";
    assert!(
        ca_asg_provider::commands::check::kube_report(
            sim.client_as(who),
            "kube-system",
            "ca-asg-provider"
        )
        .await
    );
    let sent = sim.requests().agents_of(who);
    assert!(!sent.is_empty());
    let want = format!(
        "ca-asg-provider/{} (check-config)",
        env!("CARGO_PKG_VERSION")
    );
    assert!(sent.iter().all(|(agent, _)| *agent == want), "{sent:#?}");
}

/// Issue 47: a group's warm pool is shown; reuse on scale-in is drained through our
/// hook, and is a problem only on a group without it (nothing drains an instance
/// going back to the pool there); a pool without reuse is none.
#[test]
fn check_config_shows_a_warm_pool_and_fails_on_reuse_on_scale_in_without_our_hook() {
    use ca_asg_provider::cloud::WarmPool;
    use ca_asg_provider::commands::check::warm_pool_findings;
    assert_eq!(warm_pool_findings("web", None, false), (None, Vec::new()));
    let mut pool = WarmPool {
        min_size: 2,
        max_prepared: None,
        pool_state: "Stopped".into(),
        reuse_on_scale_in: false,
    };
    for hooked in [false, true] {
        let (line, problems) = warm_pool_findings("web", Some(&pool), hooked);
        assert_eq!(
            line.as_deref(),
            Some("warm pool: Stopped, min 2, max prepared the group's max size, reuse on scale-in no")
        );
        assert!(problems.is_empty(), "{problems:?}");
    }
    pool.reuse_on_scale_in = true;
    pool.max_prepared = Some(5);
    let (line, problems) = warm_pool_findings("web", Some(&pool), false);
    assert!(line
        .unwrap()
        .ends_with("max prepared 5, reuse on scale-in yes"));
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0].starts_with("group web: its warm pool reuses instances on scale-in")
            && problems[0].contains("no EC2_INSTANCE_TERMINATING hook of ours")
            && problems[0].contains("Warmed:Pending:Wait")
            && problems[0].contains("ReuseOnScaleIn=false"),
        "{}",
        problems[0]
    );
    let (line, problems) = warm_pool_findings("web", Some(&pool), true);
    assert!(problems.is_empty(), "{problems:?}");
    assert!(line
        .unwrap()
        .contains("reuse on scale-in yes (drained through our hook"));
}

/// Issue 47: check-config names a Node registered by an instance still in a warm
/// pool (its bootstrap joined while warming), and not one this service drained on
/// its way into the pool, nor a Node of an instance in service.
#[test]
fn check_config_names_a_node_registered_while_warming() {
    use ca_asg_provider::cloud::{AsgInstance, LifecycleState};
    use ca_asg_provider::commands::check::registered_while_warming;
    let inst = |id: &str, state: &str| AsgInstance {
        id: id.into(),
        zone: "us-east-1a".into(),
        state: LifecycleState::parse(state),
        instance_type: None,
    };
    let pools = vec![(
        "web".to_string(),
        vec![
            inst("i-0warm", "Warmed:Stopped"),
            inst("i-0back", "Warmed:Running"),
        ],
    )];
    let nodes = vec![
        (
            "ip-warm".to_string(),
            "aws:///us-east-1a/i-0warm".to_string(),
            false,
        ),
        (
            "ip-back".to_string(),
            "aws:///us-east-1a/i-0back".to_string(),
            true,
        ),
        (
            "ip-live".to_string(),
            "aws:///us-east-1a/i-0live".to_string(),
            false,
        ),
        ("ip-odd".to_string(), "kind://x".to_string(), false),
    ];
    let said = registered_while_warming(&pools, &nodes);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].starts_with("group web: instance i-0warm is in the warm pool (Warmed:Stopped) and registered Node ip-warm while warming"),
        "{}",
        said[0]
    );
    assert!(registered_while_warming(&[], &nodes).is_empty());
}

/// Issue 60, 3: the shipped binary keeps serve, check-config, drain, status, undrain,
/// remove-hooks (issue 62) and demo; the load
/// generator is a binary of its own (loadgen/, `cargo run -p loadgen`), and
/// `ca-asg-provider loadgen` is an unknown subcommand (clap's usage error, exit 2).
#[test]
fn the_shipped_binary_has_the_product_commands_and_not_the_test_rig() {
    use clap::CommandFactory;
    let cli = ca_asg_provider::commands::Cli::command();
    let mut names: Vec<&str> = cli
        .get_subcommands()
        .map(|c| c.get_name())
        .filter(|n| *n != "help")
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "check-config",
            "demo",
            "drain",
            "remove-hooks",
            "serve",
            "status",
            "undrain"
        ]
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ca-asg-provider"))
        .args(["loadgen", "--nodes", "10"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("unrecognized subcommand 'loadgen'"),
        "{stderr}"
    );
}

/// Issue 62: `status` lists the drains in progress from the Node records and the
/// cluster, over the API server: the table and the JSON name the node, its group,
/// reasons, phase, elapsed time, the pod a budget blocks and the deadline; a Node
/// without a record is not listed. Read-only: it only gets and lists, and the
/// service's ClusterRole (deploy/base/rbac.yaml) grants all it used. An API server
/// it cannot reach is a plain error.
#[tokio::test]
async fn status_lists_the_drains_in_progress_read_only() {
    use ca_asg_provider::commands::status::{self, Output};
    use ca_asg_provider::scalein::decide::record::Limits;
    use ca_asg_provider::scalein::DeadlinePolicy;
    let sim = SimCluster::start(SimOptions {
        ready_delay: Duration::from_millis(30),
    })
    .await
    .unwrap();
    let started: chrono::DateTime<chrono::Utc> = "2026-11-27T07:00:00Z".parse().unwrap();
    let now = started + chrono::Duration::seconds(95);
    sim.create(&n1_scaled_in_since(started)).unwrap();
    sim.create(&fixtures::node("n2", "aws:///us-east-1a/i-0def", &[]))
        .unwrap();
    sim.create(&fixtures::pod("shop", "app", "n1", "app", 0.2))
        .unwrap();
    sim.create(&fixtures::pod("shop", "other", "n2", "app", 0.2))
        .unwrap();
    sim.create(&fixtures::pdb("shop", "app", 0)).unwrap();
    let user = "system:serviceaccount:kube-system:status-reader";
    let limits = Limits {
        workload_deadline: Duration::from_secs(600),
        workload_policy: DeadlinePolicy::Abandon,
        hook_room: None,
    };
    let table = status::report(sim.client_as(user), limits, Output::Table, now)
        .await
        .unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "{table}");
    assert!(
        lines[0].starts_with("NODE ") && lines[0].contains("PHASE"),
        "{table}"
    );
    for want in [
        "n1",
        "web",
        "CA scale-in",
        "workloads",
        "1m35s",
        "shop/app (shop/app-pdb, never allows)",
        "2026-11-27T07:10:00Z",
        "abandon",
    ] {
        assert!(lines[1].contains(want), "{want} missing: {table}");
    }
    let json = status::report(sim.client_as(user), limits, Output::Json, now)
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    // Its budget (maxUnavailable: 0) can never allow the pod's eviction; the JSON says why.
    assert!(
        v[0]["blocked_by"][0]["never"]
            .as_str()
            .is_some_and(|n| n.contains("maxUnavailable: 0")),
        "{v}"
    );
    assert_eq!(
        v,
        serde_json::json!([{
            "node": "n1",
            "group": "web",
            "reasons": ["CA scale-in"],
            "phase": "workloads",
            "started": "2026-11-27T07:00:00Z",
            "elapsed_seconds": 95,
            "blocked_by": [{"pod": "shop/app", "budgets": ["shop/app-pdb"], "never": v[0]["blocked_by"][0]["never"].clone()}],
            "deadline": "2026-11-27T07:10:00Z",
            "deadline_policy": "abandon",
            "instance_ends_at": null,
            "unreadable": null,
            "ended": null,
        }])
    );
    let used = sim.requests().used_by(user);
    assert!(!used.is_empty());
    assert!(
        used.iter().all(|u| u.verb == "get" || u.verb == "list"),
        "status only reads: {used:?}"
    );
    support::rbac::assert_service_role_grants(&used);
    // No API server there (a closed local port): a plain error, no table.
    let closed =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let e = status::report(closed, limits, Output::Table, now)
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("cannot read the cluster from the Kubernetes API server"),
        "{e}"
    );
}

/// Node n1 of group web, its drain record saying CA's scale-in asked at `started`.
fn n1_scaled_in_since(started: chrono::DateTime<chrono::Utc>) -> Node {
    use ca_asg_provider::scalein::decide::record::{self, DrainReason, DrainRecord, Why};
    let rec = DrainRecord {
        reasons: vec![DrainReason::new(Why::ScaleIn, started)],
        ..Default::default()
    };
    let mut n1 = fixtures::node("n1", "aws:///us-east-1a/i-0abc", &[]);
    n1.metadata.annotations = Some(
        [
            (record::ANNOTATION.to_string(), rec.to_json()),
            (record::GROUP_ANNOTATION.to_string(), "web".to_string()),
        ]
        .into(),
    );
    n1
}

/// Issue 74: `status --watch` prints the drains again every `--interval` (2 s by
/// default): two rounds on tokio's paused clock against the in-process API server,
/// the wall clock injected (each round reads the time once); `--interval` only
/// with `--watch`.
#[tokio::test(start_paused = true)]
async fn status_watch_prints_the_drains_every_interval() {
    use ca_asg_provider::commands::status::{self, Output};
    use ca_asg_provider::commands::{Cli, Command};
    use clap::Parser;
    let sim = SimCluster::start_in_process(SimOptions {
        ready_delay: Duration::from_millis(30),
    })
    .await
    .unwrap();
    let started: chrono::DateTime<chrono::Utc> = "2026-11-27T07:00:00Z".parse().unwrap();
    sim.create(&n1_scaled_in_since(started)).unwrap();
    sim.create(&fixtures::pod("shop", "app", "n1", "app", 0.2))
        .unwrap();
    sim.create(&fixtures::pdb("shop", "app", 0)).unwrap();
    let limits = drain_config().scale_in.limits();
    let round = std::sync::atomic::AtomicI64::new(0);
    let now = || {
        let n = round.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        started + chrono::Duration::seconds(95 + 2 * n)
    };
    let mut frames = Vec::new();
    let t0 = Instant::now();
    status::watch(
        sim.client(),
        limits,
        Output::Table,
        Duration::from_secs(2),
        Some(2),
        now,
        |f: &str| frames.push(f.to_string()),
    )
    .await;
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert!(
        frames[0].starts_with("every 2s, at 2026-11-27T07:01:35Z:\nNODE"),
        "{}",
        frames[0]
    );
    assert!(
        frames[0].contains("1m35s") && frames[0].contains("shop/app"),
        "{}",
        frames[0]
    );
    assert!(
        frames[1].starts_with("every 2s, at 2026-11-27T07:01:37Z:\n")
            && frames[1].contains("1m37s"),
        "{}",
        frames[1]
    );
    // The second round came one interval after the first (tokio's clock, paused).
    assert!(Instant::now() - t0 >= Duration::from_secs(2));
    let mut json = Vec::new();
    status::watch(
        sim.client(),
        limits,
        Output::Json,
        Duration::from_secs(5),
        Some(1),
        now,
        |f: &str| json.push(f.to_string()),
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&json[0]).unwrap();
    assert_eq!(v[0]["node"], "n1");
    let parsed =
        Cli::try_parse_from(["ca-asg-provider", "status", "-w", "--interval", "5s"]).unwrap();
    match parsed.command {
        Command::Status(a) => assert!(a.watch && a.interval == Duration::from_secs(5)),
        other => panic!("{other:?}"),
    }
    match Cli::try_parse_from(["ca-asg-provider", "status", "--watch"]).map(|c| c.command) {
        Ok(Command::Status(a)) => assert_eq!(a.interval, Duration::from_secs(2), "the default"),
        other => panic!("{other:?}"),
    }
    assert!(Cli::try_parse_from(["ca-asg-provider", "status", "--interval", "5s"]).is_err());
}

/// `undrain` of a `node` the API server has: what it did (or refused).
async fn undrain_found(
    client: &kube::Client,
    node: &str,
    window: ca_asg_provider::scalein::decide::undo::Window,
    force: bool,
    at: chrono::DateTime<chrono::Utc>,
) -> ca_asg_provider::commands::undrain::Undone {
    ca_asg_provider::commands::undrain::undrain(client, node, window, force, at)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no Node {node}"))
}

/// Issue 62: `undrain NODE` gives a node back after an interrupted `drain`, in one
/// command: it refuses while the record says the drain may still run (nothing
/// changes), and once nobody runs it removes exactly the service's marks (its taint,
/// the record, its own cordon) and nothing else: an operator's cordon, CA's taint and
/// foreign taints stay. Through the service's own ClusterRole (get and patch Nodes).
#[tokio::test]
async fn undrain_gives_back_an_interrupted_drain_and_only_the_services_marks() {
    use ca_asg_provider::commands::undrain::{self, Undone};
    use ca_asg_provider::scalein::decide::record::{
        self, DrainReason, DrainRecord, Limits, Why, TAINT_KEY,
    };
    use ca_asg_provider::scalein::decide::undo::{Running, Window};
    use ca_asg_provider::scalein::stages::cordon::GivenBack;
    use ca_asg_provider::scalein::DeadlinePolicy;
    use k8s_openapi::api::core::v1::Taint;
    let sim = SimCluster::start(SimOptions {
        ready_delay: Duration::from_millis(30),
    })
    .await
    .unwrap();
    let foreign = Taint {
        key: "example.com/gpu".into(),
        value: Some("true".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    };
    let mut n1 = fixtures::node("n1", "aws:///us-east-1a/i-0abc", &[]);
    n1.spec.as_mut().unwrap().taints = Some(vec![foreign.clone()]);
    sim.create(&n1).unwrap();
    sim.create(&fixtures::pod("shop", "app", "n1", "app", 0.2))
        .unwrap();
    sim.create(&fixtures::pdb("shop", "app", 0)).unwrap();
    support::eventually("the app pod", 10, || !sim.list::<Pod>().is_empty()).await;
    // A `drain n1` that the budget blocks, interrupted once it has marked the node.
    let cfg = drain_config();
    let args = drain_args("n1");
    let client = sim.client();
    let drain =
        tokio::spawn(
            async move { ca_asg_provider::commands::drain::drain(client, &cfg, &args).await },
        );
    let end = Instant::now() + Duration::from_secs(10);
    let tainted = |n: &serde_json::Value| {
        n["spec"]["taints"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["key"] == TAINT_KEY))
    };
    // Marked, and its last write to the Node before the budget's long wait done: the
    // DrainInProgress condition naming the budget that never allows (issue 72).
    let held = |n: &serde_json::Value| {
        n["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter().any(|c| {
                c["type"] == "DrainInProgress"
                    && c["message"].as_str().is_some_and(|m| m.contains("held:"))
            })
        })
    };
    while !(tainted(&sim.get::<Node>("", "n1").unwrap())
        && held(&sim.get::<Node>("", "n1").unwrap()))
    {
        assert!(Instant::now() < end, "the drain marks the node");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drain.abort();
    let _ = drain.await;
    let window = Window {
        limits: Limits {
            workload_deadline: Duration::from_secs(600),
            workload_policy: DeadlinePolicy::Abandon,
            hook_room: None,
        },
        after_deadline: Duration::from_secs(240),
    };
    let user = "system:serviceaccount:kube-system:undrain";
    let client = sim.client_as(user);
    let now = ca_asg_provider::clock::utc_now();
    // While its deadline is ahead the drain may still run (the service resumes it):
    // refused, the node as it was, exit 3.
    let before = sim.get::<Node>("", "n1").unwrap();
    let refused = undrain_found(&client, "n1", window, false, now).await;
    assert!(
        matches!(&refused, Undone::Refused(Running::Drain { reasons, .. }) if reasons == &["drain command"]),
        "{refused:?}"
    );
    let (text, code) = refused.say("n1");
    assert_eq!(code, ExitCode::from(undrain::REFUSED));
    assert!(
        text.contains("a drain may still run") && text.contains("--force"),
        "{text}"
    );
    assert_eq!(
        sim.get::<Node>("", "n1").unwrap()["metadata"]["resourceVersion"],
        before["metadata"]["resourceVersion"],
        "a refusal writes nothing"
    );
    // Past the deadline nobody runs it: given back in one command.
    let later = now + chrono::Duration::minutes(11);
    let done = undrain_found(&client, "n1", window, false, later).await;
    assert_eq!(
        done,
        Undone::GivenBack {
            given: GivenBack::Schedulable,
            ca_taint: false
        }
    );
    let n = sim.get::<Node>("", "n1").unwrap();
    assert_ne!(n["spec"]["unschedulable"], true, "{n}");
    assert_eq!(
        n["spec"]["taints"],
        serde_json::json!([{"key": "example.com/gpu", "value": "true", "effect": "NoSchedule"}]),
        "only our taint went"
    );
    let annotations = n["metadata"]["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert!(
        annotations
            .keys()
            .all(|k| !k.starts_with("ca-asg-provider.io/")),
        "{annotations:?}"
    );
    assert!(n["metadata"]["labels"]
        .get("node.kubernetes.io/exclude-from-external-load-balancers")
        .is_none());
    // Again: nothing of ours left.
    let again = undrain_found(&client, "n1", window, false, later).await;
    assert_eq!(again, Undone::NothingToDo);
    assert_eq!(again.say("n1").1, ExitCode::SUCCESS);

    // An operator's cordon with CA's taint, our taint and a finished record: the
    // marks go, the cordon and CA's taint stay, and the answer says so.
    let mut rec = DrainRecord {
        reasons: vec![DrainReason::new(Why::ScaleIn, now)],
        ..Default::default()
    };
    rec.mark_done();
    let mut n2 = fixtures::node("n2", "aws:///us-east-1a/i-0def", &[]);
    let spec = n2.spec.as_mut().unwrap();
    spec.unschedulable = Some(true);
    spec.taints = Some(vec![
        foreign.clone(),
        Taint {
            key: TAINT_KEY.into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        },
        Taint {
            key: record::CA_TO_BE_DELETED_TAINT.into(),
            value: Some("1700000000".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        },
    ]);
    n2.metadata.annotations = Some(
        [
            (record::ANNOTATION.to_string(), rec.to_json()),
            (record::GROUP_ANNOTATION.to_string(), "web".to_string()),
            ("team".to_string(), "payments".to_string()),
        ]
        .into(),
    );
    sim.create(&n2).unwrap();
    let done = undrain_found(&client, "n2", window, false, now).await;
    assert_eq!(
        done,
        Undone::GivenBack {
            given: GivenBack::CordonKept,
            ca_taint: true
        }
    );
    let (text, code) = done.say("n2");
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(
        text.contains("stays cordoned") && text.contains("kubectl uncordon n2"),
        "{text}"
    );
    let n = sim.get::<Node>("", "n2").unwrap();
    assert_eq!(
        n["spec"]["unschedulable"], true,
        "the operator's cordon stays"
    );
    let keys: Vec<&str> = n["spec"]["taints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["example.com/gpu", record::CA_TO_BE_DELETED_TAINT]);
    let annotations = n["metadata"]["annotations"].as_object().unwrap();
    assert_eq!(annotations.len(), 1, "{annotations:?}");
    assert_eq!(annotations["team"], "payments");

    // A node held by our hook is refused whatever the time; --force gives it back.
    let held = DrainRecord {
        reasons: vec![DrainReason::new(
            Why::Lifecycle {
                hook: "ca-asg-provider-drain".into(),
                by_ca: false,
            },
            now,
        )],
        ..Default::default()
    };
    let mut n3 = fixtures::node("n3", "aws:///us-east-1a/i-0fed", &[]);
    n3.metadata.annotations = Some([(record::ANNOTATION.to_string(), held.to_json())].into());
    sim.create(&n3).unwrap();
    let r = undrain_found(&client, "n3", window, false, later).await;
    assert!(matches!(r, Undone::Refused(Running::Held { .. })), "{r:?}");
    assert!(r.say("n3").0.contains("Terminating:Wait"));
    let forced = undrain_found(&client, "n3", window, true, later).await;
    assert!(matches!(forced, Undone::GivenBack { .. }), "{forced:?}");
    assert!(
        sim.get::<Node>("", "n3").unwrap()["metadata"]["annotations"]
            .get(record::ANNOTATION)
            .is_none()
    );
    // No such node.
    assert_eq!(
        undrain::undrain(&client, "gone", window, false, now)
            .await
            .unwrap(),
        None
    );
    // Only get and patch on Nodes, and patch of their status (the drain
    // conditions set False), which the service's own ClusterRole grants.
    let used = sim.requests().used_by(user);
    assert!(
        used.iter().all(
            |u| (u.resource == "nodes" && (u.verb == "get" || u.verb == "patch"))
                || (u.resource == "nodes/status" && u.verb == "patch")
        ),
        "{used:?}"
    );
    support::rbac::assert_service_role_grants(&used);
}

/// Issue 62: `drain NODE` says where it stands: a line per phase (cordoned, evicting
/// N pods, the DaemonSet pods, done), and while a budget blocks it, every few
/// seconds, the pod still there and the budget that blocks it; no internal text.
/// On tokio's paused clock, against the in-process API server.
#[tokio::test(start_paused = true)]
async fn drain_command_says_each_phase_and_what_blocks_it() {
    use ca_asg_provider::commands::drain::{drain_saying, BLOCKERS_EVERY};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let sim = SimCluster::start_in_process(SimOptions {
        ready_delay: Duration::from_millis(30),
    })
    .await
    .unwrap();
    n1_with_fluentd_and_an_app(&sim, 5.0);
    sim.create(&fixtures::pdb("shop", "app", 0)).unwrap();
    while sim.list::<Pod>().len() < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cfg = drain_config();
    let args = drain_args("n1");
    let lines = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let client = sim.client();
    let drain = tokio::spawn(async move {
        drain_saying(
            client,
            &cfg,
            &args,
            Arc::new(move |l: &str| sink.lock().unwrap().push(l.to_string())),
        )
        .await
    });
    let waiting = |lines: &[String]| {
        lines
            .iter()
            .filter(|l| l.starts_with("waiting for"))
            .count()
    };
    while waiting(&lines.lock().unwrap()) == 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Blocked for three more rounds, then the budget goes.
    tokio::time::sleep(BLOCKERS_EVERY * 3).await;
    let blocked = waiting(&lines.lock().unwrap());
    assert!((3..=5).contains(&blocked), "{:?}", lines.lock().unwrap());
    assert!(sim.remove::<PodDisruptionBudget>("shop", "app-pdb"));
    drain.await.unwrap().unwrap();
    let lines = lines.lock().unwrap().clone();
    let text = lines.join("\n");
    let mut at = 0;
    for want in [
        "plan for node n1 (instance i-0abc):",
        "draining n1: workloads first, DaemonSet pods last; the instance keeps running",
        "cordoned n1: nothing new is scheduled there",
        "evicting 1 pod (DaemonSet pods last)",
        "waiting for 1 pod: shop/app (PodDisruptionBudget shop/app-pdb allows no disruption now)",
        "workload pods gone; evicting the DaemonSet pods",
        "done: node drained; it stays cordoned (`ca-asg-provider undrain n1` gives it back)",
    ] {
        let i = lines[at..]
            .iter()
            .position(|l| l.starts_with(want))
            .unwrap_or_else(|| panic!("{want:?} not after line {at}:\n{text}"));
        at += i + 1;
    }
    for phase in ["cordoned n1", "evicting 1 pod", "workload pods gone"] {
        assert_eq!(
            lines.iter().filter(|l| l.starts_with(phase)).count(),
            1,
            "{phase} once:\n{text}"
        );
    }
    for internal in ["of group  (", "Cli", "Some(", "None", "{ ", "DrainOnly"] {
        assert!(!text.contains(internal), "{internal:?} in:\n{text}");
    }
}

/// Issue 74: with `scaleIn.daemonSets: keep`, `drain NODE` says the DaemonSet pods
/// stay, never that they go last, and they do stay.
#[tokio::test(start_paused = true)]
async fn drain_command_with_daemonsets_kept_says_they_stay() {
    use ca_asg_provider::commands::drain::drain_saying;
    use ca_asg_provider::scalein::DaemonSetPolicy;
    let sim = SimCluster::start_in_process(SimOptions {
        ready_delay: Duration::from_millis(30),
    })
    .await
    .unwrap();
    n1_with_fluentd_and_an_app(&sim, 0.2);
    while sim.list::<Pod>().len() < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut cfg = drain_config();
    cfg.scale_in.daemonsets = DaemonSetPolicy::Keep;
    let lines: Said = Default::default();
    let sink = lines.clone();
    drain_saying(
        sim.client(),
        &cfg,
        &drain_args("n1"),
        Arc::new(move |l: &str| sink.lock().unwrap().push(l.to_string())),
    )
    .await
    .unwrap();
    let lines = lines.lock().unwrap().clone();
    let text = lines.join("\n");
    // (The narrator's own line for the phase: progress::tests.)
    let want = "draining n1: workload pods only, DaemonSet pods stay (scaleIn.daemonSets: keep); the instance keeps running";
    assert!(
        lines.iter().any(|l| l.starts_with(want)),
        "{want:?} not in:\n{text}"
    );
    assert!(!text.contains("DaemonSet pods last"), "{text}");
    assert!(!text.contains("evicting the DaemonSet pods"), "{text}");
    let left: Vec<String> = sim
        .list::<Pod>()
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    assert!(
        left.iter().any(|n| n.starts_with("fluentd")),
        "the DaemonSet pod stayed: {left:?}\n{text}"
    );
}

/// Issue 62: every subcommand's `--help` states its exit codes, and each takes only
/// the flags it uses: `--listen`, `--metrics-listen` and `--insecure` are `serve`'s
/// alone (check-config and drain refuse them), under their old names.
#[test]
fn every_subcommand_states_its_exit_codes_and_takes_only_its_flags() {
    use ca_asg_provider::commands::{Cli, Command};
    use clap::{CommandFactory, Parser};
    let mut cli = Cli::command();
    let names: Vec<String> = cli
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    assert!(names.len() >= 6, "{names:?}");
    for name in &names {
        let help = cli
            .find_subcommand_mut(name)
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(help.contains("Exit codes: 0 "), "{name} --help:\n{help}");
    }
    let parse = |args: &[&str]| {
        Cli::try_parse_from(std::iter::once("ca-asg-provider").chain(args.iter().copied()))
    };
    for flag in [
        &["--listen", "0.0.0.0:1"][..],
        &["--metrics-listen", "0.0.0.0:2"],
        &["--insecure"],
    ] {
        for cmd in [
            &["check-config"][..],
            &["drain", "n1"],
            &["undrain", "n1"],
            &["remove-hooks"],
        ] {
            let args: Vec<&str> = cmd.iter().chain(flag).copied().collect();
            let e = parse(&args).unwrap_err();
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::UnknownArgument,
                "{args:?}"
            );
        }
    }
    let serve = parse(&[
        "serve",
        "--listen",
        "0.0.0.0:1",
        "--metrics-listen",
        "0.0.0.0:2",
        "--insecure",
        "--region",
        "eu-west-1",
    ])
    .unwrap();
    let Command::Serve(s) = serve.command else {
        panic!("serve")
    };
    assert_eq!(s.serve.listen.as_deref(), Some("0.0.0.0:1"));
    assert_eq!(s.serve.metrics_listen.as_deref(), Some("0.0.0.0:2"));
    assert!(s.serve.insecure);
    let c = s.config.load_serving(&s.serve).unwrap();
    assert_eq!(c.listen.to_string(), "0.0.0.0:1");
    assert!(parse(&["check-config", "--region", "eu-west-1"]).is_ok());
}

/// Issue 62: a pod that stays unready says why where the operator looks, in its own
/// Events (`kubectl describe pod` shows those whose object has the pod's uid), through
/// the service's own RBAC; and says so once it is ready again. (When it tells, and how
/// often, is the teller's, tested without I/O in `telemetry::readiness`.)
#[tokio::test]
async fn an_unready_service_names_the_cause_in_its_pods_events() {
    use ca_asg_provider::telemetry::http::Status;
    use ca_asg_provider::telemetry::liveness::Liveness;
    use ca_asg_provider::telemetry::readiness::{self, Teller};
    use k8s_openapi::api::core::v1::ObjectReference;

    struct Answer(parking_lot::Mutex<Result<(), String>>);
    impl Status for Answer {
        fn readiness(&self) -> Result<(), String> {
            self.0.lock().clone()
        }
    }
    let sim = SimCluster::start(SimOptions {
        ready_delay: Duration::from_millis(30),
    })
    .await
    .unwrap();
    let why = "no node group found: no Auto Scaling Group is tagged k8s.io/cluster-autoscaler/prod";
    let answer = Arc::new(Answer(parking_lot::Mutex::new(Err(why.into()))));
    let pod = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some("ca-asg-provider-7d9f-abcde".into()),
        namespace: Some("kube-system".into()),
        uid: Some("5f0e-uid".into()),
        ..Default::default()
    };
    let task = readiness::spawn(
        sim.client_as(support::rbac::ENGINE_USER),
        pod,
        answer.clone(),
        Arc::new(Liveness::default()),
        Teller::new(Duration::ZERO, Duration::from_secs(3600)),
        Duration::from_millis(20),
    );
    let told = |reason: &str| {
        sim.list::<k8s_openapi::api::events::v1::Event>()
            .into_iter()
            .filter(|e| e["reason"] == reason)
            .collect::<Vec<_>>()
    };
    support::eventually("the NotReady Event", 10, || !told("NotReady").is_empty()).await;
    let e = &told("NotReady")[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["note"], format!("not ready: {why}"));
    assert_eq!(e["regarding"]["kind"], "Pod");
    assert_eq!(e["regarding"]["namespace"], "kube-system");
    assert_eq!(e["regarding"]["uid"], "5f0e-uid");
    assert_eq!(e["metadata"]["namespace"], "kube-system");
    *answer.0.lock() = Ok(());
    support::eventually("the Ready Event", 10, || !told("Ready").is_empty()).await;
    assert_eq!(
        told("NotReady").len(),
        1,
        "told once while the cause lasted"
    );
    task.abort();
}

/// Node n1 with a fluentd DaemonSet (its preStop `fluentd_prestop` seconds) and an app pod on it.
fn n1_with_fluentd_and_an_app(sim: &SimCluster, fluentd_prestop: f64) {
    sim.create(&fixtures::node("n1", "aws:///us-east-1a/i-0abc", &[]))
        .unwrap();
    sim.create(&fixtures::daemonset(
        "logging",
        "fluentd",
        fluentd_prestop,
        false,
    ))
    .unwrap();
    sim.create(&fixtures::pod("shop", "app", "n1", "app", 0.2))
        .unwrap();
}

/// The config the drain command loads here: the region set, the rest defaults.
fn drain_config() -> ca_asg_provider::config::Config {
    ConfigArgs {
        region: Some("us-east-1".into()),
        ..Default::default()
    }
    .load()
    .unwrap()
}

/// `drain NODE`: drain only, not a dry run, the default config.
fn drain_args(node: &str) -> DrainArgs {
    DrainArgs {
        node: node.into(),
        dry_run: false,
        terminate: false,
        config: ConfigArgs::default(),
    }
}

/// The lines a command said.
type Said = Arc<std::sync::Mutex<Vec<String>>>;

/// Runs `drain NODE` (drain only) in the background, its lines collected.
fn drain_command_in_background(
    client: kube::Client,
    node: &str,
) -> (tokio::task::JoinHandle<anyhow::Result<()>>, Said) {
    drain_command_with_lease(client, node, None)
}

/// [`drain_command_in_background`], the config's lease duration given.
fn drain_command_with_lease(
    client: kube::Client,
    node: &str,
    lease: Option<Duration>,
) -> (tokio::task::JoinHandle<anyhow::Result<()>>, Said) {
    let mut cfg = drain_config();
    if let Some(d) = lease {
        cfg.scale_in.lease_duration = d;
    }
    let args = drain_args(node);
    let lines = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let task = tokio::spawn(async move {
        ca_asg_provider::commands::drain::drain_saying(
            client,
            &cfg,
            &args,
            Arc::new(move |l: &str| sink.lock().unwrap().push(l.to_string())),
        )
        .await
    });
    (task, lines)
}

/// How many times the API server evicted each pod.
fn evictions(sim: &SimCluster) -> std::collections::BTreeMap<String, usize> {
    let mut n = std::collections::BTreeMap::new();
    for a in sim.audit().iter().filter(|a| a.verb == "evicted") {
        *n.entry(format!("{}/{}", a.namespace, a.name)).or_insert(0) += 1;
    }
    n
}

/// Fails unless each of `n` pods was evicted exactly once.
fn assert_each_evicted_once(sim: &SimCluster, n: usize, case: &str) {
    let evicted = evictions(sim);
    assert_eq!(evicted.len(), n, "{case}: {evicted:?}");
    assert!(
        evicted.values().all(|&n| n == 1),
        "{case}: evicted twice: {evicted:?}"
    );
}

/// Fails unless the command said each of `wants`, naming what it said instead.
fn assert_said(said: &Said, wants: &[&str], case: &str) {
    let text = said.lock().unwrap().join("\n");
    for want in wants {
        assert!(text.contains(want), "{case}: {want:?} not said:\n{text}");
    }
}

/// How many drains the world's engine started.
fn drains_started(w: &support::world::World) -> u64 {
    w.engine
        .tools
        .stats
        .started
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// The world's service as a replica `who` electing itself by the Lease the command's
/// config names (`lease` long), with its background loop; returns the loop.
fn replica_electing(
    w: &support::world::World,
    who: &str,
    lease: Duration,
) -> tokio::task::JoinHandle<()> {
    use ca_asg_provider::scalein::engine::leader::LeaseSettings;
    w.engine.lead_as(LeaseSettings {
        name: "ca-asg-provider".into(),
        namespace: "kube-system".into(),
        identity: who.into(),
        duration: lease,
    });
    ca_asg_provider::scalein::sources::hook_scan::spawn_loop(w.engine.clone(), w.provider.clone())
}

/// A world of one node in group web (at most 3) with fluentd and an app on it, both
/// ready; with `budget`, a PodDisruptionBudget that lets no app pod go (a drain waits
/// on it until the test removes it). Returns the world and the node's name.
async fn one_node_guarded(budget: bool) -> (support::world::World, String) {
    use support::world::*;
    let w = World::builder()
        .web(3, 1)
        .ready_delay(Duration::from_millis(30))
        .build()
        .await;
    let (node, _) = nodes_of(&w, "web").remove(0);
    fluentd_and_an_app_on_each(&w, &[(node.clone(), String::new())], 0.2, 0.2);
    if budget {
        w.sim.create(&fixtures::pdb("shop", "app", 0)).unwrap();
    }
    pods_ready(&w, 2).await;
    (w, node)
}

/// A world of one node in group web (at most 3) with fluentd and an app on it, both
/// ready, a PodDisruptionBudget that lets no app pod go, and a 2 s workload deadline
/// whose policy gives the drain up. Returns the world, the node and its instance.
async fn one_node_given_up_at_2s() -> (support::world::World, String, String) {
    use ca_asg_provider::scalein::{DeadlinePolicy, ScaleInSettings};
    use support::world::*;
    let w = World::builder()
        .web(3, 1)
        .ready_delay(Duration::from_millis(30))
        .settings(ScaleInSettings {
            workload_deadline: Duration::from_secs(2),
            workload_deadline_policy: DeadlinePolicy::Abandon,
            ..fast_settings()
        })
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    fluentd_and_an_app_on_each(&w, &[(node.clone(), iid.clone())], 0.2, 0.2);
    w.sim.create(&fixtures::pdb("shop", "app", 0)).unwrap();
    pods_ready(&w, 2).await;
    (w, node, iid)
}

/// Waits (10 s at most) until the API server denied an eviction: a budget holds a drain.
async fn budget_holds(sim: &SimCluster, what: &str) {
    support::eventually(what, 10, || {
        sim.audit().iter().any(|a| a.verb == "eviction-denied")
    })
    .await;
}

/// Waits (30 s at most) for a drain command's task, which must end well.
async fn command_ends(task: tokio::task::JoinHandle<anyhow::Result<()>>, what: &str) {
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect(what)
        .unwrap()
        .unwrap();
}

/// The world's service leading as `replica-a` (3 s Lease), its loop running.
async fn leading_replica(w: &support::world::World) -> tokio::task::JoinHandle<()> {
    let lp = replica_electing(w, "replica-a", Duration::from_secs(3));
    support::eventually("replica-a leads", 10, || w.engine.is_leader()).await;
    lp
}

/// `drain NODE` beside a running service (the quickstart's scale-in found two engines
/// draining one node: the command's, and the Lease holder's resume of the drain the
/// command recorded, a DaemonSet pod evicted twice). The command reads the Lease, sees
/// a replica renew it, records the drain on the Node for that leader and follows it:
/// one engine drains, each pod is evicted once, the command ends when the record says
/// the drain is finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_command_hands_its_drain_to_the_services_leader() {
    let (w, node) = one_node_guarded(false).await;
    // The service: one replica, leading by the Lease the command's config names.
    let lp = leading_replica(&w).await;

    let (drain, lines) = drain_command_in_background(w.sim.client(), &node);
    command_ends(
        drain,
        "the command ends once the leader's drain is finished",
    )
    .await;
    assert_said(
        &lines,
        &[
            "the service's leader replica-a runs the drain (recorded for it on",
            "evicting 1 pod (DaemonSet pods last)",
            "done: node drained; it stays cordoned",
        ],
        "a leader",
    );
    assert_eq!(drains_started(&w), 1, "the leader ran the drain");
    assert_each_evicted_once(&w.sim, 2, "a leader");
    lp.abort();
    w.engine.shutdown();
}

/// With no replica renewing the Lease (its holder gone), the command takes it after a
/// lease duration and drains itself; a replica that starts meanwhile follows and does
/// not resume the drain beside it. Released at the end, the Lease goes to the replica,
/// which finds the drain finished and starts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_command_holds_the_lease_while_it_drains_when_nobody_leads() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use support::world::*;
    let (w, node) = one_node_guarded(true).await;
    // A Lease whose holder died: nobody renews it.
    w.sim
        .create(&Lease {
            metadata: ObjectMeta {
                name: Some("ca-asg-provider".into()),
                namespace: Some("kube-system".into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("replica-gone".into()),
                lease_duration_seconds: Some(1),
                ..Default::default()
            }),
        })
        .unwrap();
    let (drain, lines) = drain_command_in_background(w.sim.client(), &node);
    let holder = |w: &World| {
        w.sim
            .get::<Lease>("kube-system", "ca-asg-provider")
            .unwrap()["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    support::eventually("the command takes the Lease", 10, || {
        holder(&w).starts_with("drain-command-")
    })
    .await;
    budget_holds(&w.sim, "the budget holds the command's drain").await;
    // A replica starts while the command drains.
    let lp = replica_electing(&w, "replica-b", Duration::from_secs(1));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !w.engine.is_leader(),
        "the replica follows while the command holds the Lease"
    );
    assert!(w.sim.remove::<PodDisruptionBudget>("shop", "app-pdb"));
    command_ends(drain, "the command ends").await;
    assert_said(
        &lines,
        &[
            "reading the Lease kube-system/ca-asg-provider for up to",
            "done: node drained; it stays cordoned",
        ],
        "nobody leads",
    );
    support::eventually("the released Lease goes to the replica", 10, || {
        w.engine.is_leader()
    })
    .await;
    // Two of the replica's polls as leader: the drain on the Node is finished.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        drains_started(&w),
        0,
        "the replica resumed the command's drain"
    );
    assert_each_evicted_once(&w.sim, 2, "nobody leads");
    lp.abort();
    w.engine.shutdown();
}

/// Issue 74: `drain NODE` stopped (Ctrl-C or SIGTERM: here the future it stops on)
/// while it holds the Lease and a budget keeps its drain: it says how the node is left
/// (cordoned, tainted, marked, nothing evicted yet), gives the Lease back at once (not
/// left to expire), prints the `undrain` line that gives the node back, and fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_drain_command_releases_its_lease_and_prints_the_undrain_line() {
    use k8s_openapi::api::coordination::v1::Lease;
    let (w, node) = one_node_guarded(true).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (cfg, args) = (drain_config(), drain_args(&node));
    let lines: Said = Arc::default();
    let sink = lines.clone();
    let client = w.sim.client();
    let task = tokio::spawn(async move {
        ca_asg_provider::commands::drain::drain_until(
            client,
            None,
            &cfg,
            &args,
            Arc::new(move |l: &str| sink.lock().unwrap().push(l.to_string())),
            async {
                let _ = stopped.await;
            },
        )
        .await
    });
    let holder = || {
        w.sim
            .get::<Lease>("kube-system", "ca-asg-provider")
            .map(|l| {
                l["spec"]["holderIdentity"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .unwrap_or_default()
    };
    support::eventually("the command takes the Lease", 10, || {
        holder().starts_with("drain-command-")
    })
    .await;
    budget_holds(&w.sim, "the budget holds the command's drain").await;
    stop.send(()).unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the command ends when stopped")
        .unwrap()
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("interrupted before the drain of node"),
        "{e}"
    );
    assert_eq!(holder(), "", "the Lease is given back at once");
    assert_said(
        &lines,
        &[
            &format!("interrupted: the drain of {node} stopped; node {node} is left cordoned, tainted, marked with its drain record; evicted so far: none; still on it: "),
            "released the Lease kube-system/ca-asg-provider",
            &format!("to give the node back: ca-asg-provider undrain {node}"),
        ],
        "interrupted",
    );
    // Stopped: the drain evicts nothing more once its budget goes.
    let denied = w.sim.audit().len();
    assert!(w
        .sim
        .remove::<k8s_openapi::api::policy::v1::PodDisruptionBudget>("shop", "app-pdb"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        evictions(&w.sim).is_empty(),
        "{:?}",
        &w.sim.audit()[denied..]
    );
    w.engine.shutdown();
}

/// Two drain commands at once and no service: the second waits while the first holds
/// the Lease (a command drains only its own node, so it is never handed a drain), and
/// drains once the first gave the Lease back: never two engines at once, each node
/// drained by one, each pod evicted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_drain_command_waits_for_the_first_one_lease_at_a_time() {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use support::world::*;
    let w = World::builder()
        .web(3, 2)
        .ready_delay(Duration::from_millis(30))
        .build()
        .await;
    let nodes = nodes_of(&w, "web");
    fluentd_and_an_app_on_each(&w, &nodes, 0.2, 0.2);
    w.sim.create(&fixtures::pdb("shop", "app", 0)).unwrap();
    pods_ready(&w, 4).await;
    let lease = Some(Duration::from_secs(2));
    let (first, said_first) = drain_command_with_lease(w.sim.client(), &nodes[0].0, lease);
    budget_holds(&w.sim, "the budget holds the first command's drain").await;
    let (second, said_second) = drain_command_with_lease(w.sim.client(), &nodes[1].0, lease);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let cordoned = |n: &str| w.sim.get::<Node>("", n).unwrap()["spec"]["unschedulable"] == true;
    assert!(
        !cordoned(&nodes[1].0),
        "the second command changed its node while the first held the Lease:\n{}",
        said_second.lock().unwrap().join("\n")
    );
    assert!(
        said_second
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("another drain command: waiting for it")),
        "{:?}",
        said_second.lock().unwrap()
    );
    assert!(w.sim.remove::<PodDisruptionBudget>("shop", "app-pdb"));
    for (task, said) in [(first, &said_first), (second, &said_second)] {
        command_ends(task, "each command ends").await;
        let text = said.lock().unwrap().join("\n");
        assert!(
            text.contains("done: node drained; it stays cordoned"),
            "{text}"
        );
    }
    assert!(cordoned(&nodes[0].0) && cordoned(&nodes[1].0));
    assert_each_evicted_once(&w.sim, 4, "two commands");
    w.engine.shutdown();
}

/// `drain NODE --terminate` beside a leading replica ends the instance as CA's
/// scale-in does, run by the leader: with our hook on the group the command hands
/// the instance to it (terminate with decrement; AWS holds it) and the leader's scan
/// drains it and completes the action; without, the command records CA's scale-in
/// on the Node and the leader's resume drains it and terminates with decrement.
/// Either way one engine drains, each pod is evicted once, the group is one smaller,
/// and the command follows to the end. Through the memory cloud, which holds an
/// instance in Terminating:Wait as AWS does (moto does not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_terminate_beside_the_leader_ends_the_instance_through_the_leader() {
    use support::world::*;
    for hooked in [true, false] {
        let w = World::builder().ready_delay(Duration::from_millis(30));
        let w = if hooked {
            w.web_hooked(3, 2, 60)
        } else {
            w.web(3, 2)
        };
        let w = w.build().await;
        let (node, iid) = nodes_of(&w, "web").remove(0);
        fluentd_and_an_app_on_each(&w, &[(node.clone(), iid.clone())], 0.2, 0.2);
        pods_ready(&w, 2).await;
        let lp = leading_replica(&w).await;

        let mut cfg = drain_config();
        cfg.provider.selector = ca_asg_provider::world::named(&["web"]);
        let args = DrainArgs {
            terminate: true,
            ..drain_args(&node)
        };
        let lines = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let sink = lines.clone();
        let cloud: Arc<dyn ca_asg_provider::cloud::Cloud> = Arc::new(w.cloud.clone());
        tokio::time::timeout(
            Duration::from_secs(60),
            ca_asg_provider::commands::drain::drain_in(
                w.sim.client(),
                Some(cloud),
                &cfg,
                &args,
                Arc::new(move |l: &str| sink.lock().unwrap().push(l.to_string())),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("hooked {hooked}: the command ends"))
        .unwrap();
        let case = format!("hooked {hooked}");
        let (intent, done) = if hooked {
            (
                "then the lifecycle hook's action for instance",
                "done: node drained; the lifecycle hook's action was completed",
            )
        } else {
            (
                "is terminated and group web's desired capacity lowered by one",
                "done: node drained and its instance terminated",
            )
        };
        let leader = "the service's leader replica-a runs the drain";
        assert_said(&lines, &[intent, leader, done], &case);
        support::eventually("the instance ends", 10, || !in_service(&w.cloud, &iid)).await;
        assert_eq!(
            w.cloud.desired("web"),
            Some(1),
            "hooked {hooked}: one smaller"
        );
        assert_eq!(
            drains_started(&w),
            1,
            "{case}: the leader ran the one drain"
        );
        assert_each_evicted_once(&w.sim, 2, &case);
        lp.abort();
        w.engine.shutdown();
    }
}

/// The leader the command handed its drain to dies mid-drain (its process gone, the
/// Lease left standing): the command says once that no replica leads and the drain
/// waits, recorded on the Node; when a replica takes the Lease over, it says so, and
/// the new leader resumes the drain to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_drain_says_when_no_replica_leads_and_when_one_does_again() {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use support::world::*;
    let (w, node) = one_node_guarded(true).await;
    // replica-a leads, and dies without releasing the Lease.
    let (first, election) = {
        use ca_asg_provider::scalein::engine::leader::LeaseSettings;
        let (provider, engine, _ca) = service(&w.sim, &w.cloud, &w.groups, fast_settings()).await;
        let election = engine.lead_as(LeaseSettings {
            name: "ca-asg-provider".into(),
            namespace: "kube-system".into(),
            identity: "replica-a".into(),
            duration: Duration::from_secs(2),
        });
        let lp = ca_asg_provider::scalein::sources::hook_scan::spawn_loop(engine.clone(), provider);
        support::eventually("replica-a leads", 10, || engine.is_leader()).await;
        ((engine, lp), election)
    };
    let (drain, lines) = drain_command_in_background(w.sim.client(), &node);
    let said = |what: &str| lines.lock().unwrap().iter().any(|l| l.contains(what));
    support::eventually("the command hands its drain to replica-a", 10, || {
        said("the service's leader replica-a runs the drain")
    })
    .await;
    budget_holds(&w.sim, "replica-a's drain is held by the budget").await;
    election.abort();
    first.1.abort();
    first.0.shutdown();
    support::eventually("the command says nobody leads", 10, || {
        said("no replica of the service renews the Lease kube-system/ca-asg-provider now")
    })
    .await;
    // replica-b starts, takes the Lease over and resumes the recorded drain.
    let lp = replica_electing(&w, "replica-b", Duration::from_secs(2));
    assert!(w.sim.remove::<PodDisruptionBudget>("shop", "app-pdb"));
    command_ends(drain, "the command ends once replica-b's drain is finished").await;
    assert_said(
        &lines,
        &[
            "replica-b leads again: the drain goes on",
            "done: node drained; it stays cordoned",
        ],
        "a leader gone",
    );
    assert_eq!(drains_started(&w), 1, "replica-b resumed the drain");
    lp.abort();
    w.engine.shutdown();
}

/// `drain NODE` following the leader's drain relays the leader's warnings on the node
/// (before, it said phases only), and a drain the leader gave up at its deadline ends
/// the command with an error, as the command's own drain does (before, the finished
/// record read as "done: node drained"). A warning already on the node before the
/// command is not relayed. The leader's Events land 1.5 s late here (as queued behind a
/// storm's requests): its last word, `DrainAbandoned`, comes after the record that
/// ends the drain, and is still relayed (CI once saw the command end without it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_drain_relays_the_leaders_warnings_and_fails_when_it_gives_up() {
    let (w, node, _) = one_node_given_up_at_2s().await;
    // An earlier warning of the service on the node, from before the command.
    w.sim
        .create(&k8s_openapi::api::events::v1::Event {
            metadata: ObjectMeta {
                name: Some(format!("{node}.earlier")),
                namespace: Some("default".into()),
                ..Default::default()
            },
            type_: Some("Warning".into()),
            reason: Some("DrainFailed".into()),
            note: Some("an earlier drain failed".into()),
            reporting_controller: Some("ca-asg-provider".into()),
            regarding: Some(k8s_openapi::api::core::v1::ObjectReference {
                kind: Some("Node".into()),
                name: Some(node.clone()),
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap();
    let lp = leading_replica(&w).await;
    w.sim
        .slow_requests("create", "events", Duration::from_millis(1500));

    let (drain, lines) = drain_command_in_background(w.sim.client(), &node);
    let result = tokio::time::timeout(Duration::from_secs(30), drain)
        .await
        .expect("the command ends")
        .unwrap();
    let err = result
        .expect_err("a drain given up is not done")
        .to_string();
    assert!(
        err.contains("the service's leader gave the drain up: drain abandoned"),
        "{err}"
    );
    assert_said(
        &lines,
        &[
            "the service's leader replica-a runs the drain",
            "warning: DeadlineHit: workloads deadline 2s passed with 1 pod(s) still on the node; policy abandon",
            "warning: DrainAbandoned: drain abandoned:",
        ],
        "given up",
    );
    let said = lines.lock().unwrap().join("\n");
    assert!(!said.contains("an earlier drain failed"), "{said}");
    assert!(!said.contains("done: node drained"), "{said}");
    lp.abort();
    w.engine.shutdown();
}

/// Puts `record` on the Node as the service writes it (the annotation alone).
async fn put_record(
    w: &support::world::World,
    node: &str,
    record: &ca_asg_provider::scalein::decide::record::DrainRecord,
) {
    use ca_asg_provider::scalein::decide::record::ANNOTATION;
    let nodes: kube::Api<Node> = kube::Api::all(w.sim.client());
    let patch = serde_json::json!({"metadata": {"annotations": {ANNOTATION: record.to_json()}}});
    nodes
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

/// `drain --terminate` for a group without our hook, following the leader.
fn terminate_command_in_background(
    w: &support::world::World,
    node: &str,
) -> (tokio::task::JoinHandle<anyhow::Result<()>>, Said) {
    let mut cfg = drain_config();
    cfg.provider.selector = ca_asg_provider::world::named(&["web"]);
    let args = DrainArgs {
        terminate: true,
        ..drain_args(node)
    };
    let lines = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let cloud: Arc<dyn ca_asg_provider::cloud::Cloud> = Arc::new(w.cloud.clone());
    let client = w.sim.client();
    let task = tokio::spawn(async move {
        ca_asg_provider::commands::drain::drain_in(
            client,
            Some(cloud),
            &cfg,
            &args,
            Arc::new(move |l: &str| sink.lock().unwrap().push(l.to_string())),
        )
        .await
    });
    (task, lines)
}

/// Issue 69, defect 1: the leader gives a direct-mode drain up on a node that also
/// carries a rebalance cordon. It keeps the cordon's reason, so the record reads
/// "cordoned", not "finished": the follower waited for ever (after printing the
/// `DrainAbandoned` warning). The record now says how the drain it followed ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_terminate_given_up_beside_a_rebalance_cordon_ends_the_command() {
    use ca_asg_provider::scalein::decide::record::{DrainReason, DrainRecord, Why};
    use support::world::*;
    let (w, node, iid) = one_node_given_up_at_2s().await;
    let cordon = DrainRecord {
        reasons: vec![DrainReason::new(
            Why::Rebalance,
            ca_asg_provider::clock::utc_now(),
        )],
        ..DrainRecord::default()
    };
    put_record(&w, &node, &cordon).await;
    let lp = leading_replica(&w).await;

    let (drain, lines) = terminate_command_in_background(&w, &node);
    let err = tokio::time::timeout(Duration::from_secs(30), drain)
        .await
        .expect("the command ends (before: it waited for ever)")
        .unwrap()
        .expect_err("a drain given up is not done")
        .to_string();
    assert!(
        err.contains("the service's leader gave the drain up: drain abandoned"),
        "{err}"
    );
    let said = lines.lock().unwrap().join("\n");
    assert!(!said.contains("done:"), "{said}");
    assert!(in_service(&w.cloud, &iid), "the instance stays");
    lp.abort();
    w.engine.shutdown();
}

/// Issue 69, defect 2: `drain --terminate` on a group with our hook, the Node still
/// carrying an earlier drain's finished record (here as an older version wrote it,
/// unnumbered). The command said "done" within 2 s, before any pod left, reading the
/// old record as this drain's end. It now follows the drain the hand-over joins, and
/// ends only when the leader's drain of it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_terminate_through_the_hook_is_not_done_by_an_earlier_finished_record() {
    use ca_asg_provider::scalein::decide::record::{DrainReason, DrainRecord, Why};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use support::world::*;
    let w = World::builder()
        .web_hooked(3, 2, 60)
        .ready_delay(Duration::from_millis(30))
        .build()
        .await;
    let (node, iid) = nodes_of(&w, "web").remove(0);
    fluentd_and_an_app_on_each(&w, &[(node.clone(), iid.clone())], 0.2, 0.2);
    w.sim.create(&fixtures::pdb("shop", "app", 0)).unwrap();
    pods_ready(&w, 2).await;
    let mut earlier = DrainReason::new(Why::DrainCommand, ca_asg_provider::clock::utc_now());
    earlier.done = true;
    let finished = DrainRecord {
        reasons: vec![earlier],
        ..DrainRecord::default()
    };
    assert!(!finished.to_json().contains("\"drain\""), "unnumbered");
    put_record(&w, &node, &finished).await;
    let lp = leading_replica(&w).await;

    let (drain, lines) = terminate_command_in_background(&w, &node);
    budget_holds(&w.sim, "the leader's drain is held by the budget").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let said = lines.lock().unwrap().join("\n");
    assert!(
        !drain.is_finished(),
        "the command must follow the drain the budget holds: {said}"
    );
    assert!(!said.contains("done:"), "{said}");
    assert!(w.sim.remove::<PodDisruptionBudget>("shop", "app-pdb"));
    command_ends(drain, "the command ends once the leader's drain ended").await;
    assert_said(
        &lines,
        &[
            "the service's leader replica-a runs the drain",
            "done: node drained; the lifecycle hook's action was completed",
        ],
        "through the hook",
    );
    lp.abort();
    w.engine.shutdown();
}

/// Issue 69, defect 3: a drain the leader gave up, its `DrainAbandoned` Event never
/// written (Events refused here; in a storm they lag behind the drains): the command
/// said "done" and exited 0, since only the Event told. The record now says how the
/// drain ended, in the update that ended it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_drain_given_up_fails_the_command_without_the_leaders_event() {
    let (w, node, _) = one_node_given_up_at_2s().await;
    w.sim.deny(&[("create", "events")]);
    let lp = leading_replica(&w).await;

    let (drain, lines) = drain_command_in_background(w.sim.client(), &node);
    let err = tokio::time::timeout(Duration::from_secs(30), drain)
        .await
        .expect("the command ends")
        .unwrap()
        .expect_err("a drain given up is not done")
        .to_string();
    assert!(
        err.contains("the service's leader gave the drain up: drain abandoned"),
        "{err}"
    );
    let said = lines.lock().unwrap().join("\n");
    assert!(
        !said.contains("warning: DrainAbandoned"),
        "no Event: {said}"
    );
    assert!(!said.contains("done:"), "{said}");
    lp.abort();
    w.engine.shutdown();
}

/// Issue 74: `--version` names the source revision beside the crate's version, so two
/// builds of one version are told apart: the checkout's commit here (or `unknown` when
/// the tree has no git), the same the `build_info` metric carries.
#[test]
fn version_carries_the_revision() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ca-asg-provider"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    let git = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_string());
    let want = std::env::var("CA_ASG_PROVIDER_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .or(git)
        .unwrap_or_else(|| "unknown".into());
    assert_eq!(
        printed.trim(),
        format!(
            "ca-asg-provider {} (revision {want})",
            env!("CARGO_PKG_VERSION")
        )
    );
    assert_eq!(ca_asg_provider::telemetry::REVISION, want);
}

/// Issue 74, 5: `undrain --all` (what `helm uninstall`'s post-delete Job runs once the
/// replicas are gone) gives back every node that carries a mark of this service and
/// touches no other: a node whose record says our hook holds it is refused (exit 3)
/// unless forced; with --force no mark is left anywhere. One list of Nodes, then get and
/// patch of the marked ones only.
#[tokio::test]
async fn undrain_all_gives_back_every_marked_node_and_touches_no_other() {
    use ca_asg_provider::commands::undrain::{self, Undone};
    use ca_asg_provider::scalein::decide::record::{
        self, DrainReason, DrainRecord, Limits, Why, TAINT_KEY,
    };
    use ca_asg_provider::scalein::decide::undo::Window;
    use ca_asg_provider::scalein::DeadlinePolicy;
    use k8s_openapi::api::core::v1::Taint;
    let sim = SimCluster::start(SimOptions {
        ready_delay: Duration::from_millis(30),
    })
    .await
    .unwrap();
    let now = ca_asg_provider::clock::utc_now();
    let taint = |key: &str| Taint {
        key: key.into(),
        value: Some("true".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    };
    // a: our taint and cordon left by a drain nobody runs; b: held by our hook; c: only
    // a foreign taint and an operator's cordon.
    let mut a = fixtures::node("a", "aws:///us-east-1a/i-0a", &[]);
    a.spec.as_mut().unwrap().taints = Some(vec![taint(TAINT_KEY)]);
    sim.create(&a).unwrap();
    let held = DrainRecord {
        reasons: vec![DrainReason::new(
            Why::Lifecycle {
                hook: "ca-asg-provider-drain".into(),
                by_ca: false,
            },
            now,
        )],
        ..Default::default()
    };
    let mut b = fixtures::node("b", "aws:///us-east-1a/i-0b", &[]);
    b.spec.as_mut().unwrap().taints = Some(vec![taint(TAINT_KEY)]);
    b.metadata.annotations = Some([(record::ANNOTATION.to_string(), held.to_json())].into());
    sim.create(&b).unwrap();
    let mut c = fixtures::node("c", "aws:///us-east-1a/i-0c", &[]);
    c.spec.as_mut().unwrap().unschedulable = Some(true);
    c.spec.as_mut().unwrap().taints = Some(vec![taint("example.com/gpu")]);
    sim.create(&c).unwrap();
    let c_before = sim.get::<Node>("", "c").unwrap();
    // d: kept out of CA's scale-down by a budget (our mark); e: by its operator.
    use ca_asg_provider::scalein::decide::ca_hold::{HELD_BY, SCALE_DOWN_DISABLED};
    let mut d = fixtures::node("d", "aws:///us-east-1a/i-0d", &[]);
    d.metadata.annotations = Some(
        [
            (SCALE_DOWN_DISABLED.to_string(), "true".to_string()),
            (HELD_BY.to_string(), "frozen".to_string()),
        ]
        .into(),
    );
    sim.create(&d).unwrap();
    let mut e = fixtures::node("e", "aws:///us-east-1a/i-0e", &[]);
    e.metadata.annotations = Some([(SCALE_DOWN_DISABLED.to_string(), "true".to_string())].into());
    sim.create(&e).unwrap();
    let e_before = sim.get::<Node>("", "e").unwrap();

    let window = Window {
        limits: Limits {
            workload_deadline: Duration::from_secs(600),
            workload_policy: DeadlinePolicy::Abandon,
            hook_room: None,
        },
        after_deadline: Duration::from_secs(240),
    };
    let user = "system:serviceaccount:kube-system:remove-hooks";
    let client = sim.client_as(user);
    let done = undrain::undrain_all(&client, window, false, now)
        .await
        .unwrap();
    let names: Vec<&str> = done.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "b", "d"], "{done:?}");
    assert!(matches!(done[0].1, Undone::GivenBack { .. }), "{done:?}");
    assert!(matches!(done[1].1, Undone::Refused(_)), "{done:?}");
    assert_eq!(done[2].1, Undone::Released, "{done:?}");
    let (lines, code) = undrain::say_all(&done);
    assert_eq!(code, ExitCode::from(undrain::REFUSED));
    assert_eq!(
        lines.last().unwrap().1,
        "1 node(s) given back, 1 refused (a drain runs or may run for them); 1 node(s) given back to cluster-autoscaler's scale-down"
    );
    let d_now = sim.get::<Node>("", "d").unwrap();
    let d_annotations = d_now["metadata"]["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert!(
        !d_annotations.contains_key(SCALE_DOWN_DISABLED) && !d_annotations.contains_key(HELD_BY),
        "{d_now}"
    );
    assert_eq!(
        sim.get::<Node>("", "e").unwrap(),
        e_before,
        "an operator's annotation stays"
    );

    let forced = undrain::undrain_all(&client, window, true, now)
        .await
        .unwrap();
    assert_eq!(forced.len(), 1, "only b was still marked: {forced:?}");
    assert!(matches!(forced[0].1, Undone::GivenBack { .. }));
    for n in ["a", "b"] {
        let node = sim.get::<Node>("", n).unwrap();
        let taints = node["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(taints.iter().all(|t| t["key"] != TAINT_KEY), "{n}: {node}");
        assert!(
            node["metadata"]["annotations"]
                .as_object()
                .is_none_or(|a| !a.contains_key(record::ANNOTATION)),
            "{n}: {node}"
        );
    }
    assert_eq!(
        sim.get::<Node>("", "c").unwrap(),
        c_before,
        "a node without our marks is not touched"
    );
    let (lines, code) = undrain::say_all(&[]);
    assert_eq!(code, ExitCode::SUCCESS);
    assert!(lines[0].1.starts_with("no node carries a mark"));
    let used = sim.requests().used_by(user);
    assert!(
        used.iter().all(|u| (u.resource == "nodes"
            && matches!(u.verb.as_str(), "list" | "get" | "patch"))
            || (u.resource == "nodes/status" && u.verb == "patch")),
        "{used:?}"
    );
    let writes = sim.requests().writes();
    assert!(
        !writes
            .iter()
            .any(|w| w.user == user && (w.name == "c" || w.name == "e")),
        "{writes:?}"
    );
}
