//! Configuration parsing and validation: every key, every error names key and file.
use super::*;

fn ok(yaml: &str) -> Config {
    resolve(
        FileConfig::parse(yaml, "t.yaml").unwrap(),
        &Overrides::default(),
        "t.yaml",
    )
    .unwrap()
}

fn problems(yaml: &str, flags: &Overrides) -> Vec<Problem> {
    match resolve(FileConfig::parse(yaml, "t.yaml").unwrap(), flags, "t.yaml") {
        Err(ConfigError::Invalid { problems, .. }) => problems,
        other => panic!("expected problems, got {other:?}"),
    }
}

#[test]
fn full_file_parses() {
    let c = ok(r#"
listen: 127.0.0.1:9000
aws: {region: eu-west-1, endpoint: "http://127.0.0.1:5000", maxAttempts: 5}
refreshInterval: 30s
nodeGroups:
  - {name: a, minSize: 1, maxSize: 5}
  - {name: b}
autoDiscovery:
  - tags: ["k8s.io/cluster-autoscaler/enabled", "k8s.io/cluster-autoscaler/prod"]
templates:
  "*": {labels: {team: x}}
  a: {taints: ["dedicated=gpu:NoSchedule"], maxPods: 58}
launchFailureWindow: 5m
"#);
    assert_eq!(c.listen.to_string(), "127.0.0.1:9000");
    assert_eq!(c.region, "eu-west-1");
    assert_eq!(c.aws_max_attempts, 5);
    assert_eq!(c.provider.refresh_interval, Duration::from_secs(30));
    assert_eq!(c.provider.selector.names, vec!["a", "b"]);
    assert_eq!(
        c.provider.static_bounds["a"],
        Bounds {
            min: Some(1),
            max: Some(5)
        }
    );
    assert_eq!(c.provider.selector.tag_sets[0].len(), 2);
    assert_eq!(c.provider.templates["a"].max_pods, Some(58));
    assert_eq!(c.provider.launch_failure_window, Duration::from_secs(300));
}

#[test]
fn empty_file_gives_defaults() {
    let c = ok("");
    assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
    assert!(c.require_groups().is_err());
}

#[test]
fn unknown_key_names_the_key_and_file() {
    let e =
        FileConfig::parse("nodeGroups:\n  - {name: a, minsize: 1}\n", "/etc/x.yaml").unwrap_err();
    let m = e.to_string();
    assert!(m.contains("/etc/x.yaml") && m.contains("minsize"), "{m}");
    let e = FileConfig::parse("refreshIntervall: 5s\n", "c.yaml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("refreshIntervall"), "{e}");
}

#[test]
fn every_problem_is_reported_with_key_and_value() {
    let p = problems(
        r#"
listen: "nowhere"
refreshInterval: 5 parsecs
nodeGroups:
  - {name: a, minSize: 5, maxSize: 2}
  - {name: a}
  - {name: "", minSize: -1}
autoDiscovery:
  - tags: ["=x"]
templates:
  a: {taints: ["k=v:Sometimes"], maxPods: 0}
  b: {vmMemoryOverheadPercent: 75}
  c: {vmMemoryOverheadPercent: -1}
  d: {vmMemoryOverheadPercent: .nan}
  e: {vmMemoryOverheadPercent: 0}
  f: {vmMemoryOverheadPercent: 7.5}
"#,
        &Overrides::default(),
    );
    let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
    for k in [
        "listen",
        "refreshInterval",
        "nodeGroups[0]",
        "nodeGroups[1]",
        "nodeGroups[2].name",
        "autoDiscovery[0].tags",
        "templates.a.taints[0]",
        "templates.a.maxPods",
        "templates.b.vmMemoryOverheadPercent",
        "templates.c.vmMemoryOverheadPercent",
        "templates.d.vmMemoryOverheadPercent",
    ] {
        assert!(keys.contains(&k), "missing {k} in {p:?}");
    }
    for ok in [
        "templates.e.vmMemoryOverheadPercent",
        "templates.f.vmMemoryOverheadPercent",
    ] {
        assert!(!keys.contains(&ok), "{ok} is valid: {p:?}");
    }
    let pct = p
        .iter()
        .find(|p| p.key == "templates.b.vmMemoryOverheadPercent")
        .unwrap();
    assert!(
        pct.message.contains("75") && pct.message.contains("between 0 and 50"),
        "{}",
        pct.message
    );
    let listen = p.iter().find(|p| p.key == "listen").unwrap();
    assert!(listen.message.contains("nowhere"));
    let taint = p.iter().find(|p| p.key == "templates.a.taints[0]").unwrap();
    assert!(taint.message.contains("Sometimes"));
}

#[test]
fn flags_override_the_file_and_accept_ca_syntax() {
    let flags = Overrides {
        listen: Some("0.0.0.0:7000".into()),
        nodes: vec!["1:10:flag-group".into()],
        auto_discovery: vec!["asg:tag=k8s.io/cluster-autoscaler/enabled,env=prod".into()],
        refresh_interval: Some("2m".into()),
        insecure: true,
        ..Default::default()
    };
    let c = resolve(
        FileConfig::parse("listen: 127.0.0.1:1\nrefreshInterval: 10s\n", "f").unwrap(),
        &flags,
        "f",
    )
    .unwrap();
    assert_eq!(c.listen.to_string(), "0.0.0.0:7000");
    assert_eq!(c.provider.refresh_interval, Duration::from_secs(120));
    assert_eq!(c.provider.selector.names, vec!["flag-group"]);
    let set = &c.provider.selector.tag_sets[0];
    assert_eq!(
        set[0],
        TagFilter {
            key: "k8s.io/cluster-autoscaler/enabled".into(),
            value: None
        }
    );
    assert_eq!(
        set[1],
        TagFilter {
            key: "env".into(),
            value: Some("prod".into())
        }
    );
}

#[test]
fn bad_flags_name_the_flag_and_value() {
    let flags = Overrides {
        nodes: vec!["1:x:g".into(), "1:2".into()],
        auto_discovery: vec!["mig:foo".into(), "asg:tag=".into()],
        ..Default::default()
    };
    let p = problems("", &flags);
    assert_eq!(p.len(), 4, "{p:?}");
    assert!(
        p[0].key == "--nodes[0]" && p[0].message.contains("\"x\""),
        "{p:?}"
    );
    assert!(p
        .iter()
        .any(|x| x.key == "--node-group-auto-discovery[0]" && x.message.contains("mig:foo")));
}

#[test]
fn scale_in_section_parses_and_validates() {
    let c = ok(r#"
scaleIn:
  mode: direct
  daemonSets: keep
  workloadDeadline: 90s
  workloadDeadlinePolicy: proceed
  evictionRetryInterval: 1s
  maxConcurrentDrains: 7
  sharedPodWatchFrom: 0
"#);
    assert_eq!(c.scale_in.mode, ModeChoice::Direct);
    assert_eq!(c.scale_in.daemonsets, DaemonSetPolicy::Keep);
    assert_eq!(c.scale_in.workload_deadline, Duration::from_secs(90));
    assert_eq!(c.scale_in.workload_deadline_policy, DeadlinePolicy::Proceed);
    assert_eq!(c.scale_in.max_concurrent_drains, 7);
    assert_eq!(
        c.scale_in.shared_pod_watch_from, 0,
        "0 is never, not the default"
    );
    assert_eq!(
        ok("scaleIn: {}\n").scale_in.shared_pod_watch_from,
        10,
        "the default"
    );
    assert!(c.drain_enabled);
    let e = FileConfig::parse("scaleIn: {daemonSets: evict-first}\n", "c.yaml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("evict-first") && e.contains("c.yaml"), "{e}");
    let p = problems(
        "scaleIn: {workloadDeadline: soon, maxConcurrentDrains: 0, sharedPodWatchFrom: 99999, apiQps: -1}\n",
        &Overrides::default(),
    );
    let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        vec![
            "scaleIn.workloadDeadline",
            "scaleIn.maxConcurrentDrains",
            "scaleIn.sharedPodWatchFrom",
            "scaleIn.apiQps"
        ]
    );
}

#[test]
fn node_critical_daemonsets_are_selectors_and_a_bad_one_is_named() {
    let cfg = resolve(
        FileConfig::parse(
            "scaleIn: {nodeCriticalDaemonSets: [\"k8s-app=cilium\", \"app=efs-csi-node,role=node\"]}\n",
            "c.yaml",
        )
        .unwrap(),
        &Overrides::default(),
        "c.yaml",
    )
    .unwrap();
    assert_ne!(
        cfg.scale_in.node_critical,
        crate::scalein::decide::plan::NodeCritical::default()
    );
    let p = problems(
        "scaleIn: {nodeCriticalDaemonSets: [\"k8s-app\"]}\n",
        &Overrides::default(),
    );
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].key, "scaleIn.nodeCriticalDaemonSets");
    assert!(p[0].message.contains("k8s-app"), "{:?}", p[0]);
}

#[test]
fn non_loopback_without_tls_is_refused_unless_insecure() {
    let p = problems("listen: 0.0.0.0:8086\n", &Overrides::default());
    assert_eq!(p[0].key, "listen");
    assert!(
        p[0].message.contains("0.0.0.0:8086") && p[0].message.contains("--insecure"),
        "{p:?}"
    );
    let flags = Overrides {
        insecure: true,
        ..Default::default()
    };
    assert!(resolve(
        FileConfig::parse("listen: 0.0.0.0:8086\n", "f").unwrap(),
        &flags,
        "f"
    )
    .is_ok());
    let p = problems(
        "tls: {cert: /nope/c.pem, key: /nope/k.pem, clientCA: /nope/ca.pem}\n",
        &Overrides::default(),
    );
    let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, vec!["tls.cert", "tls.key", "tls.clientCA"]);
}

#[test]
fn a_unix_socket_needs_no_tls_and_refuses_it() {
    let c = resolve(
        FileConfig::parse("listen: unix:///run/ca/grpc.sock\n", "f").unwrap(),
        &Overrides::default(),
        "f",
    )
    .unwrap();
    assert_eq!(c.listen, ListenAddr::Unix("/run/ca/grpc.sock".into()));
    let p = problems(
        "listen: unix:///run/ca/grpc.sock\ntls: {cert: /c.pem, key: /k.pem, clientCA: /ca.pem}\n",
        &Overrides::default(),
    );
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].key, "tls");
    assert!(p[0].message.contains("unix:///run/ca/grpc.sock"), "{p:?}");
    let p = problems("listen: unix://run/grpc.sock\n", &Overrides::default());
    assert_eq!(p[0].key, "listen");
    assert!(p[0].message.contains("absolute path"), "{p:?}");
}

#[test]
fn nodes_flag_parses() {
    let g = parse_nodes_flag("0:100:my-asg:with-colon").unwrap();
    assert_eq!(
        (g.min_size, g.max_size, g.name.as_str()),
        (Some(0), Some(100), "my-asg:with-colon")
    );
    assert!(parse_nodes_flag("1:2:").is_err());
}

#[test]
fn taints_validate() {
    assert_eq!(
        parse_taint("a=b:NoSchedule").unwrap(),
        ("a".into(), "b".into(), "NoSchedule".into())
    );
    assert_eq!(parse_taint("a:NoExecute").unwrap().1, "");
    assert!(parse_taint("a=b").is_err());
    assert!(parse_taint("=b:NoSchedule").is_err());
}

/// docs/configuration.md's configuration reference is a real configuration: every key in it
/// exists, every value is valid (only the example certificate paths are missing).
#[test]
fn the_documented_configuration_reference_is_valid() {
    let doc = include_str!("../../docs/configuration.md");
    let section = &doc[doc.find("# Configuration\n").expect("section")..];
    let start = section.find("```yaml\n").expect("yaml block") + "```yaml\n".len();
    let text = &section[start..start + section[start..].find("```").expect("end")];
    let file = FileConfig::parse(text, "docs/configuration.md").unwrap();
    assert!(file.scale_in.leader_election.is_some() && file.tls.is_some());
    match resolve(file, &Overrides::default(), "docs/configuration.md") {
        Err(ConfigError::Invalid { problems, .. }) => {
            let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
            assert_eq!(
                keys,
                ["tls.cert", "tls.key", "tls.clientCA"],
                "{problems:?}"
            );
        }
        other => panic!("expected only the certificate files to be missing: {other:?}"),
    }
}

#[test]
fn refresh_wait_must_stay_below_cas_call_timeout() {
    let c = ok("refreshWait: 3s\ncaCallTimeout: 10s\nnodeGroups: [{name: web}]\n");
    assert_eq!(c.provider.refresh_wait, Duration::from_secs(3));
    assert_eq!(
        ok("nodeGroups: [{name: web}]\n").provider.refresh_wait,
        Duration::from_secs(4)
    );
    let p = problems(
        "refreshWait: 6s\nnodeGroups: [{name: web}]\n",
        &Overrides::default(),
    );
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].key, "refreshWait");
    assert!(
        p[0].message.contains("caCallTimeout") && p[0].message.contains("grpc_timeout"),
        "{p:?}"
    );
}

#[test]
fn queue_mode_reads_its_keys_and_slows_the_lifecycle_poll() {
    let c = ok(r#"
interruption:
  queueUrl: https://sqs.us-east-1.amazonaws.com/123456789012/q
  rebalance: drain
  unmanagedInstances: true
  batchSize: 5
  waitTime: 10s
  safetyNetPollInterval: 10m
"#);
    let i = &c.interruption;
    assert_eq!(
        i.queue_url.as_deref(),
        Some("https://sqs.us-east-1.amazonaws.com/123456789012/q")
    );
    assert_eq!(
        i.rebalance,
        crate::scalein::decide::notice::RebalanceAction::Drain
    );
    assert!(i.unmanaged);
    assert_eq!(i.batch, 5);
    assert_eq!(i.wait, Duration::from_secs(10));
    assert_eq!(c.scale_in.lifecycle_poll_interval, Duration::from_secs(600));
    // Off by default, and then the poll is the primary path.
    let off = ok("{}");
    assert!(off.interruption.queue_url.is_none());
    assert_eq!(off.scale_in.lifecycle_poll_interval, Duration::from_secs(5));
}

#[test]
fn queue_mode_problems_name_their_keys() {
    let p = problems(
        r#"
interruption:
  queueUrl: sqs-queue
  batchSize: 11
  concurrency: 0
  waitTime: 30s
  maxReceives: 0
scaleIn: {enabled: false}
"#,
        &Overrides::default(),
    );
    let keys: Vec<&str> = p.iter().map(|p| p.key.as_str()).collect();
    for k in [
        "interruption.queueUrl",
        "interruption.batchSize",
        "interruption.concurrency",
        "interruption.waitTime",
        "interruption.maxReceives",
    ] {
        assert!(keys.contains(&k), "{k} missing in {p:?}");
    }
    assert!(p.iter().any(|x| x.message.contains("sqs-queue")));
    assert!(p.iter().any(|x| x.message.contains("scaleIn.enabled")));
}

#[test]
fn options_without_startup_time_defaults_to_unimplemented_and_names_a_bad_value() {
    use crate::provider::options::OptionsWithoutStartupTime as O;
    assert_eq!(
        ok("").provider.options_without_startup_time,
        O::Unimplemented
    );
    assert_eq!(
        ok("optionsWithoutStartupTime: answer")
            .provider
            .options_without_startup_time,
        O::Answer
    );
    let e = FileConfig::parse("optionsWithoutStartupTime: maybe", "t.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("optionsWithoutStartupTime") && e.contains("maybe") && e.contains("t.yaml"),
        "{e}"
    );
}

/// `scaleIn.loadBalancers.deregister`: off by default, read when set, and refused by
/// name while the wait it needs is off (the instance would end with its targets
/// draining).
#[test]
fn load_balancers_deregister_reads_and_needs_the_wait() {
    assert!(!ok("").scale_in.load_balancers.deregister);
    let c = ok("scaleIn: {loadBalancers: {deregister: true}}");
    assert!(c.scale_in.load_balancers.deregister && c.scale_in.load_balancers.enabled);
    let p = problems(
        "scaleIn: {loadBalancers: {deregister: true, waitForDeregistration: false}}",
        &Overrides::default(),
    );
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].key, "scaleIn.loadBalancers.deregister");
    assert!(p[0].message.contains("waitForDeregistration"), "{p:?}");
    assert!(FileConfig::parse(
        "scaleIn: {loadBalancers: {deregister: yes-please}}",
        "t.yaml"
    )
    .is_err());
}
