//! The chart installed for real (issue 40, 2): the service's image (scripts/image.sh)
//! imported into a real node's containerd, `helm install` of deploy/chart in standalone
//! mode with two replicas on the suite's real control plane, AWS played by moto on the
//! node's IP. Checked from outside: both pods scheduled and Ready through their probes,
//! one replica holding the Lease, the metrics port scraped, `helm test` passing, one CA
//! scale-in (NodeGroupDeleteNodes over mTLS, as CA sends it) drained by the service in the
//! cluster under the chart's ServiceAccount and RBAC, with the checks of the other
//! scenarios (evictions only, the budget held, DaemonSet pods last, the ASG's capacity),
//! then the other replica taking the Lease when the leader's pod is deleted, and last
//! `helm upgrade` in the middle of a drain held by a budget: a new pod takes the Lease,
//! the drain resumes and the instance ends once.
//!
//! The service's pods run on the real node (kubelet + containerd); the ASG's instances are
//! Nodes of the suite's fake kubelet (tests/e2e/kubelet.rs), following moto.
//! Needs root, containerd, runc, the CNI plugins, `E2E_IMAGES` (scripts/e2e/node-deps.sh),
//! umoci and skopeo (scripts/image.sh installs them), helm (`.venv/bin/helm` or
//! `E2E_HELM`) and moto.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ca_asg_provider::cloud::aws::AwsCloud;
use ca_asg_provider::cloud::{Cloud, GroupSelector};
use ca_asg_provider::proto::{self, cloud_provider_client::CloudProviderClient};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::Api;
use serde_json::json;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

mod support;

#[path = "e2e/checks.rs"]
mod checks;
#[path = "e2e/control_plane.rs"]
mod control_plane;
#[path = "e2e/install.rs"]
mod install;
#[path = "e2e/kubelet.rs"]
mod kubelet;
#[path = "e2e/real_node.rs"]
mod real_node;
#[path = "e2e/rig.rs"]
mod rig;

use control_plane::{ControlPlane, Who};
use kubelet::FakeKubelet;
use real_node::RealNode;
use rig::{binaries, create, ready_pods, until, Report, APP_MIN_READY, APP_REPLICAS, SERIAL};

const NS: &str = "kube-system";
const RELEASE: &str = "ca-asg-provider";
/// The chart's ServiceAccount (its full name), as the API server's audit log names it.
const SERVICE_ACCOUNT_USER: &str = "system:serviceaccount:kube-system:ca-asg-provider";
const CLUSTER: &str = "e2e";
const GROUP: &str = "web";
const NODES: i32 = 5;
const SYSTEM_NODE: &str = "system-0";
const SERVER_NAME: &str = "ca-asg-provider.kube-system.svc";

fn skip_or_fail(what: &str, why: &str) {
    if std::env::var("E2E_REQUIRED").as_deref() == Ok("1") {
        panic!("{what}: {why}");
    }
    eprintln!("{what}: skipped ({why})");
}

fn ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_ip(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default()
}

/// The service's pods, Ready or not, by name.
async fn service_pods(pods: &Api<Pod>) -> BTreeMap<String, Pod> {
    let lp = ListParams::default().labels(&format!(
        "app.kubernetes.io/name=ca-asg-provider,app.kubernetes.io/instance={RELEASE}"
    ));
    pods.list(&lp)
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .map(|p| (p.metadata.name.clone().unwrap_or_default(), p))
                .collect()
        })
        .unwrap_or_default()
}

async fn lease_holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("ca-asg-provider")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

/// What the pods and the real node said, for a failure message.
async fn diagnose(pods: &Api<Pod>, node: &RealNode) -> String {
    let mut out = String::new();
    for (name, p) in service_pods(pods).await {
        let status = p.status.clone().unwrap_or_default();
        out += &format!(
            "pod {name}: phase {:?}, conditions {:?}, containers {:?}\n",
            status.phase,
            status
                .conditions
                .unwrap_or_default()
                .iter()
                .map(|c| format!("{}={}", c.type_, c.status))
                .collect::<Vec<_>>(),
            status
                .container_statuses
                .unwrap_or_default()
                .iter()
                .map(|c| format!(
                    "{} restarts={} state={:?}",
                    c.name, c.restart_count, c.state
                ))
                .collect::<Vec<_>>()
        );
        // The container's log on the node (the API server cannot reach this kubelet's
        // port, which listens on 127.0.0.1).
        let dir = format!("/var/log/pods/{NS}_{name}_");
        for e in std::fs::read_dir("/var/log/pods")
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = e.path();
            if path.display().to_string().starts_with(&dir) {
                let log =
                    std::fs::read_to_string(path.join("ca-asg-provider/0.log")).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                out += &format!(
                    "--- log of {name}:\n{}\n",
                    lines[lines.len().saturating_sub(15)..].join("\n")
                );
            }
        }
    }
    out + &format!("--- kubelet:\n{}", node.log_tail("kubelet"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chart_installed_runs_two_replicas_holds_the_lease_and_drains_a_ca_scale_in() {
    let scenario = "chart install: standalone, two replicas, CA scale-in drained in the cluster";
    let Some(bin) = binaries(scenario) else {
        return;
    };
    let Some(images) = real_node::available() else {
        return skip_or_fail(scenario, "no real node here (root, containerd, runc, CNI plugins and E2E_IMAGES are needed: scripts/e2e/node-deps.sh)");
    };
    let Some(helm_bin) = install::helm_binary() else {
        return skip_or_fail(
            scenario,
            "no helm (.venv/bin/helm from scripts/test.sh, or E2E_HELM)",
        );
    };
    let _one_at_a_time = SERIAL.lock().await;
    let report = Report {
        scenario: scenario.to_string(),
        driver: "the chart's pods; CA's calls by the suite's client over mTLS".to_string(),
        version: bin.version.clone(),
        step: parking_lot::Mutex::new(String::new()),
        scale_in_secs: parking_lot::Mutex::new(None),
        scale_in_began: parking_lot::Mutex::new(None),
        scale_in_asked: parking_lot::Mutex::new(None),
        began: Instant::now(),
        extra: Default::default(),
    };
    let work = tempfile::Builder::new()
        .prefix("ca-asg-e2e-install-")
        .tempdir()
        .unwrap();

    report.step("build the service's image (scripts/image.sh)");
    let (image, image_ref) =
        install::service_image(work.path()).unwrap_or_else(|e| panic!("{e:#}"));

    report.step("start the control plane");
    let mut cp = ControlPlane::start(&bin)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let admin = cp.client(Who::Admin).await.unwrap();

    report.step("route the kubernetes Service's IP to the API server (kube-proxy's part)");
    let _route = install::ServiceRoute::start(&cp.url)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));

    report.step("start a real node for the service's pods, import the image");
    let node = RealNode::start(
        &cp,
        &bin.k8s.join("kubelet"),
        &images,
        SYSTEM_NODE,
        "aws:///us-east-1a/i-0e2e00000000system",
        "e2e.ca-asg-provider.io/role=system",
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let imported = node
        .import_image(&image)
        .unwrap_or_else(|e| panic!("ctr images import {}: {e:#}", image.display()));
    eprintln!("e2e: ctr imported: {}", imported.trim());
    let node_ip = Api::<Node>::all(admin.clone())
        .get(SYSTEM_NODE)
        .await
        .unwrap()
        .status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .expect("the real node's InternalIP");

    report.step("start moto on the node's IP, with the ASG");
    let moto = install::Moto::start(&node_ip).unwrap_or_else(|e| panic!("{e:#}"));
    let sdk = moto.sdk_config().await;
    let asg = aws_sdk_autoscaling::Client::new(&sdk);
    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    ec2.create_launch_template()
        .launch_template_name("web")
        .launch_template_data(
            aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
                .image_id("ami-12c6146b")
                .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let tag = |k: &str| {
        aws_sdk_autoscaling::types::Tag::builder()
            .resource_id(GROUP)
            .resource_type("auto-scaling-group")
            .key(k)
            .value("owned")
            .propagate_at_launch(true)
            .build()
    };
    asg.create_auto_scaling_group()
        .auto_scaling_group_name(GROUP)
        .min_size(0)
        .max_size(8)
        .desired_capacity(NODES)
        .availability_zones("us-east-1a")
        .launch_template(
            aws_sdk_autoscaling::types::LaunchTemplateSpecification::builder()
                .launch_template_name("web")
                .version("$Default")
                .build(),
        )
        .tags(tag("k8s.io/cluster-autoscaler/enabled"))
        .tags(tag(&format!("k8s.io/cluster-autoscaler/{CLUSTER}")))
        .send()
        .await
        .unwrap();

    report.step("register a Ready Node per instance of the ASG (the fake kubelet)");
    let cloud = std::sync::Arc::new(AwsCloud::from_sdk_config(&sdk));
    let kubelet = FakeKubelet::start_following(cp.client(Who::Kubelet).await.unwrap(), move || {
        let cloud = cloud.clone();
        async move {
            let selector = GroupSelector {
                names: vec![GROUP.to_string()],
                tag_sets: vec![],
            };
            let groups = cloud.describe_groups(&selector).await.ok()?;
            Some(
                groups
                    .into_iter()
                    .flat_map(|g| {
                        let name = g.name.clone();
                        g.instances.into_iter().map(move |i| (name.clone(), i))
                    })
                    .collect(),
            )
        }
    });
    until("a Node per instance", 60, || {
        let k = kubelet.clone();
        async move { k.nodes().len() == NODES as usize }
    })
    .await;

    report.step("the app (3 replicas, a budget of 1) and a log shipper on the ASG's nodes");
    for ns in ["shop", "logging"] {
        create(
            &admin,
            None,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
        cp.wait_default_service_account(ns).await.unwrap();
    }
    let on_group = json!({"e2e.ca-asg-provider.io/group": GROUP});
    let container = |prestop: u32| {
        json!([{"name": "main", "image": "e2e/app:1",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", prestop.to_string()]}}}}])
    };
    create(&admin, Some("shop"), json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app"},
        "spec": {"replicas": APP_REPLICAS, "selector": {"matchLabels": {"app": "app"}},
            "template": {"metadata": {"labels": {"app": "app"}}, "spec": {
                "nodeSelector": on_group, "terminationGracePeriodSeconds": 30,
                "containers": container(2),
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "app"}}, "topologyKey": "kubernetes.io/hostname"}]}}}}}
    })).await;
    create(
        &admin,
        Some("shop"),
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "app"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "app"}}}
        }),
    )
    .await;
    create(
        &admin,
        Some("logging"),
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "fluent-bit"},
            "spec": {"selector": {"matchLabels": {"app": "fluent-bit"}},
                "template": {"metadata": {"labels": {"app": "fluent-bit"}}, "spec": {
                    "nodeSelector": on_group, "terminationGracePeriodSeconds": 30,
                    "tolerations": [{"operator": "Exists"}], "containers": container(1)}}}
        }),
    )
    .await;
    until("the app's pods Ready", 60, || {
        let admin = admin.clone();
        async move {
            ready_pods(&admin)
                .await
                .keys()
                .filter(|p| p.starts_with("shop/app-"))
                .count()
                == APP_REPLICAS
        }
    })
    .await;

    report
        .step("the Secrets the chart leaves to the user: mTLS certificates; the root CA ConfigMap");
    let certs = install::Certs::new(SERVER_NAME).unwrap();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NS);
    for (name, (crt, key)) in [
        ("ca-asg-provider-server-tls", &certs.server),
        ("cluster-autoscaler-grpc-client-tls", &certs.client),
    ] {
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": name}, "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": crt, "tls.key": key, "ca.crt": certs.ca}
        }))
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    // The root CA publisher's ConfigMap (kube-controller-manager's, not run by the suite):
    // the pods' ServiceAccount token volume projects it.
    let api_ca = std::fs::read_to_string(cp.kubeconfig(Who::Admin).unwrap())
        .unwrap()
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("certificate-authority-data: ")
                .map(str::to_string)
        })
        .expect("the admin kubeconfig's CA");
    let api_ca = {
        use base64::Engine as _;
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(api_ca)
                .unwrap(),
        )
        .unwrap()
    };
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": api_ca}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();

    report.step("the in-cluster address of the API server answers, over its certificate");
    {
        let mut cfg = kube::Config::new(
            format!("https://{}:443", install::SERVICE_IP)
                .parse()
                .unwrap(),
        );
        cfg.root_cert = Some(pem_ders(&api_ca));
        let client = kube::Client::try_from(cfg).unwrap();
        let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
        if let Err(e) = client.request_text(req).await {
            let mut chain = format!("{e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                chain += &format!(": {s}");
                src = s.source();
            }
            panic!("GET https://{}:443/readyz: {chain}", install::SERVICE_IP);
        }
    }

    report.step("helm install (standalone, two replicas)");
    let (repo, tag) = image_ref.rsplit_once(':').unwrap();
    let values = json!({
        "mode": "standalone",
        "replicas": 2,
        "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
        "nodeSelector": {"kubernetes.io/hostname": SYSTEM_NODE},
        "tls": {"certManager": {"enabled": false}, "serverSecretName": "ca-asg-provider-server-tls"},
        "extraEnv": [
            {"name": "AWS_ACCESS_KEY_ID", "value": "test"},
            {"name": "AWS_SECRET_ACCESS_KEY", "value": "test"},
        ],
        "readinessProbe": {"periodSeconds": 2},
        "config": {
            "refreshInterval": "10s",
            "autoDiscovery": [{"tags": ["k8s.io/cluster-autoscaler/enabled", format!("k8s.io/cluster-autoscaler/{CLUSTER}")]}],
            "aws": {"region": "us-east-1", "endpoint": moto.url},
            "scaleIn": {"daemonSets": "evict-last", "workloadDeadline": "10m", "workloadDeadlinePolicy": "abandon"},
        },
    });
    let values_file = work.path().join("values.yaml");
    std::fs::write(&values_file, values.to_string()).unwrap();
    let helm = install::Helm {
        bin: helm_bin,
        kubeconfig: cp.kubeconfig(Who::Admin).unwrap(),
        home: work.path().join("helm"),
    };
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/chart");
    let values_arg = values_file.display().to_string();
    let out = helm
        .run(&[
            "install",
            RELEASE,
            chart,
            "--namespace",
            NS,
            "--values",
            &values_arg,
        ])
        .unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("e2e: helm install:\n{out}");

    report.step("both pods scheduled on the real node and Ready through their probes");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let ps = service_pods(&pods).await;
        if ps.len() == 2 && ps.values().all(ready) {
            break;
        }
        if Instant::now() > end {
            panic!(
                "the service's two pods were not Ready within 120 s:\n{}",
                diagnose(&pods, &node).await
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ps = service_pods(&pods).await;
    for p in ps.values() {
        assert_eq!(
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some(SYSTEM_NODE),
            "the service's pod on the real node"
        );
    }

    report.step("one replica holds the Lease");
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NS);
    let end = Instant::now() + Duration::from_secs(60);
    let leader = loop {
        if let Some(h) = lease_holder(&leases).await {
            break h;
        }
        if Instant::now() > end {
            panic!(
                "no replica holds the Lease ca-asg-provider after 60 s:\n{}",
                diagnose(&pods, &node).await
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        ps.contains_key(&leader),
        "the Lease's holder {leader} is not one of the pods {:?}",
        ps.keys()
    );
    let follower = ps
        .keys()
        .find(|n| **n != leader)
        .cloned()
        .expect("a second pod");
    eprintln!("e2e: leader {leader}, follower {follower}");

    report.step("the metrics port answers on both pods");
    let mut scraped = Vec::new();
    for (name, p) in &ps {
        let addr = format!("{}:8087", pod_ip(p));
        let (status, body) = install::http_get(&addr, "/metrics")
            .await
            .unwrap_or_else(|e| panic!("scrape {name} at {addr}: {e:#}"));
        assert_eq!(status, 200, "GET /metrics of {name}");
        assert!(
            body.contains("ca_asg_provider_"),
            "{name}'s /metrics has none of the service's metrics:\n{body}"
        );
        scraped.push(name.clone());
    }

    report.step("helm test (check-config in the cluster)");
    let out = helm
        .run(&["test", RELEASE, "--namespace", NS])
        .unwrap_or_else(|e| panic!("{e:#}"));
    // helm's --logs goes through the API server to the kubelet, whose port listens on
    // 127.0.0.1 here: the log is read on the node instead.
    let check_log = std::fs::read_dir("/var/log/pods")
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{NS}_{RELEASE}-check-config_"))
        })
        .and_then(|e| std::fs::read_to_string(e.path().join("check-config/0.log")).ok())
        .unwrap_or_default();
    eprintln!("e2e: helm test:\n{out}\ncheck-config said:\n{check_log}");
    assert!(
        out.contains("Succeeded"),
        "helm test did not report the check-config pod Succeeded:\n{out}"
    );

    report.step("CA connects over mTLS to the follower and reads the group");
    let mut ca = connect_ca(&certs, &follower, &ps[&follower]).await;
    ca.refresh(proto::RefreshRequest {}).await.expect("Refresh");
    let groups = ca
        .node_groups(proto::NodeGroupsRequest {})
        .await
        .expect("NodeGroups")
        .into_inner()
        .node_groups;
    assert_eq!(
        groups.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
        vec![GROUP],
        "the groups the service found in moto"
    );

    report.step("CA: NodeGroupDeleteNodes of two occupied nodes (direct mode)");
    let on: std::collections::BTreeSet<String> = ready_pods(&admin)
        .await
        .into_iter()
        .filter(|(p, _)| p.starts_with("shop/app-"))
        .map(|(_, n)| n)
        .collect();
    let victims: Vec<(String, String)> = kubelet
        .nodes()
        .into_iter()
        .filter(|(n, _)| on.contains(n))
        .take(2)
        .collect();
    assert_eq!(victims.len(), 2, "two nodes running an app pod");
    report.scale_in_begins("CA: NodeGroupDeleteNodes of two occupied nodes (direct mode)");
    let mut req = tonic::Request::new(proto::NodeGroupDeleteNodesRequest {
        id: GROUP.into(),
        nodes: victims
            .iter()
            .map(|(name, iid)| proto::ExternalGrpcNode {
                provider_id: format!("aws:///us-east-1a/{iid}"),
                name: name.clone(),
                labels: [("kubernetes.io/hostname".to_string(), name.clone())].into(),
                ..Default::default()
            })
            .collect(),
    });
    req.set_timeout(Duration::from_secs(5));
    ca.node_group_delete_nodes(req)
        .await
        .unwrap_or_else(|e| panic!("NodeGroupDeleteNodes: {e}"));

    report.step("wait for the instances to end (the leader's drain)");
    let started = Instant::now();
    let end = started + Duration::from_secs(180);
    loop {
        let ended = kubelet.instances_ended();
        if victims.iter().all(|(_, i)| ended.contains(i)) {
            break;
        }
        if Instant::now() > end {
            panic!(
                "the instances {victims:?} did not end within 180 s (ended: {ended:?}):\n{}",
                diagnose(&pods, &node).await
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    *report.scale_in_secs.lock() = Some(started.elapsed().as_secs_f64());

    let audit = cp.audit();
    let stops = kubelet.stops();
    let drained: Vec<String> = victims.iter().map(|(n, _)| n.clone()).collect();
    report.step("check: evictions only, none twice, by the chart's ServiceAccount");
    let evicted = checks::evictions_only_as(SERVICE_ACCOUNT_USER, &audit, &stops, &drained)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        evicted >= 2,
        "the chart's ServiceAccount evicted {evicted} pods; the two app pods at least"
    );
    report.step("check: the budget held (Ready app pods never below 2)");
    let fewest = checks::fewest_ready(&kubelet.readies(), &stops, "shop/app-", APP_REPLICAS);
    assert!(
        fewest >= APP_MIN_READY,
        "only {fewest} app pods were Ready at one moment; the budget allows no fewer than {APP_MIN_READY}"
    );
    report.step("check: DaemonSet pods last on every drained node");
    let asked = report.scale_in_asked.lock().expect("asked");
    checks::daemonset_last(&stops, &drained, asked).unwrap_or_else(|e| panic!("{e}"));
    report.step("check: the ASG's desired capacity and CA's target are 3, the others live");
    let g = asg
        .describe_auto_scaling_groups()
        .auto_scaling_group_names(GROUP)
        .send()
        .await
        .unwrap();
    let g = &g.auto_scaling_groups()[0];
    assert_eq!(
        g.desired_capacity(),
        Some(NODES - 2),
        "the ASG's desired capacity"
    );
    let live: Vec<&str> = g
        .instances()
        .iter()
        .filter_map(|i| i.instance_id())
        .collect();
    assert_eq!(
        live.len(),
        (NODES - 2) as usize,
        "the ASG's instances: {live:?}"
    );
    assert!(
        victims.iter().all(|(_, i)| !live.contains(&i.as_str())),
        "a drained instance is still in the ASG: {live:?}"
    );
    ca.refresh(proto::RefreshRequest {}).await.expect("Refresh");
    let target = ca
        .node_group_target_size(proto::NodeGroupTargetSizeRequest { id: GROUP.into() })
        .await
        .expect("NodeGroupTargetSize")
        .into_inner()
        .target_size;
    assert_eq!(target, NODES - 2, "the target size CA reads");

    report.step("check: no error answered to CA's calls (both pods' own counts, scraped)");
    let mut texts = Vec::new();
    for (name, p) in service_pods(&pods).await {
        let addr = format!("{}:8087", pod_ip(&p));
        let (_, body) = install::http_get(&addr, "/metrics")
            .await
            .unwrap_or_else(|e| panic!("scrape {name}: {e:#}"));
        texts.push(body);
    }
    checks::provider_errors(&texts, &[]).unwrap_or_else(|e| panic!("{e}"));
    cp.check_alive()
        .unwrap_or_else(|e| panic!("a control plane component died: {e}"));

    report.step("the leader's pod is deleted: the other replica takes the Lease");
    // The node is cordoned first, so the Deployment's replacement stays Pending and the
    // one candidate is the replica that was following (a replacement that starts while
    // the released Lease is free may take it first, which proves less).
    let nodes: Api<Node> = Api::all(admin.clone());
    let cordon = |on: bool| {
        let nodes = nodes.clone();
        async move {
            nodes
                .patch(
                    SYSTEM_NODE,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(json!({"spec": {"unschedulable": on}})),
                )
                .await
                .unwrap_or_else(|e| panic!("cordon {SYSTEM_NODE} ({on}): {e}"));
        }
    };
    cordon(true).await;
    pods.delete(&leader, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {leader}: {e}"));
    let end = Instant::now() + Duration::from_secs(90);
    loop {
        let holder = lease_holder(&leases).await;
        if holder.as_deref() == Some(follower.as_str()) {
            break;
        }
        if Instant::now() > end {
            panic!(
                "after {leader} was deleted the Lease is held by {holder:?}, not {follower}:\n{}",
                diagnose(&pods, &node).await
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    report.step("the Deployment's replacement pod becomes Ready beside the new leader");
    cordon(false).await;
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let ps = service_pods(&pods).await;
        if ps.len() == 2 && ps.values().all(ready) && !ps.contains_key(&leader) {
            break;
        }
        if Instant::now() > end {
            panic!(
                "no Ready replacement for {leader} within 120 s:\n{}",
                diagnose(&pods, &node).await
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        lease_holder(&leases).await.as_deref(),
        Some(follower.as_str()),
        "the Lease stays with the replica that took it over"
    );
    upgrade_keeps_the_lease_and_the_drain(Upgrade {
        report: &report,
        admin: &admin,
        cp: &cp,
        ca: &mut ca,
        certs: &certs,
        kubelet: &kubelet,
        pods: &pods,
        leases: &leases,
        node: &node,
        helm: &helm,
        chart,
        ended_before: victims.len() as i32,
    })
    .await;
    report.step("done");
    drop(node);
}

/// The image is reproducible (issue 40, 1; docs/image.md): built twice from the same
/// binary and the same pinned packages, the two OCI archives are the same bytes, so
/// their manifest digests are the same.
#[tokio::test]
async fn the_image_built_twice_from_the_same_binary_is_the_same_bytes() {
    let what = "the image is reproducible";
    if std::env::var_os("E2E_SERVICE_IMAGE").is_some() {
        return skip_or_fail(what, "E2E_SERVICE_IMAGE gives a prebuilt image");
    }
    if real_node::available().is_none() {
        return skip_or_fail(
            what,
            "no real node here (the image tier runs with it: scripts/e2e/node-deps.sh)",
        );
    }
    let work = tempfile::Builder::new()
        .prefix("ca-asg-e2e-image-")
        .tempdir()
        .unwrap();
    let mut built = Vec::new();
    for n in ["first", "second"] {
        let dir = work.path().join(n);
        std::fs::create_dir_all(&dir).unwrap();
        let (path, _) = install::service_image(&dir).unwrap_or_else(|e| panic!("{e:#}"));
        built.push(std::fs::read(&path).unwrap());
    }
    assert!(!built[0].is_empty());
    assert!(
        built[0] == built[1],
        "two builds from the same binary differ ({} and {} bytes)",
        built[0].len(),
        built[1].len()
    );
}

/// CA's client over mTLS to `pod`'s gRPC port, as CA connects.
async fn connect_ca(
    certs: &install::Certs,
    name: &str,
    pod: &Pod,
) -> CloudProviderClient<tonic::transport::Channel> {
    let tls = ClientTlsConfig::new()
        .domain_name(SERVER_NAME)
        .ca_certificate(Certificate::from_pem(&certs.ca))
        .identity(Identity::from_pem(&certs.client.0, &certs.client.1));
    let channel = Endpoint::from_shared(format!("https://{}:8086", pod_ip(pod)))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {name}'s gRPC port: {e:?}"));
    CloudProviderClient::new(channel)
}

/// What the upgrade step works with.
struct Upgrade<'a> {
    report: &'a Report,
    admin: &'a kube::Client,
    cp: &'a ControlPlane,
    ca: &'a mut CloudProviderClient<tonic::transport::Channel>,
    certs: &'a install::Certs,
    kubelet: &'a FakeKubelet,
    pods: &'a Api<Pod>,
    leases: &'a Api<Lease>,
    node: &'a RealNode,
    helm: &'a install::Helm,
    chart: &'a str,
    /// Instances the scenario ended before this step.
    ended_before: i32,
}

/// `helm upgrade` in the middle of a drain (issue 40, 2): CA scales in a node whose
/// pod has a budget that allows nothing, so the drain waits; the release is upgraded
/// (a changed value, so the Deployment rolls both pods: no earlier chart version has
/// been released to upgrade from); the Lease passes to a new pod, the drain is not
/// lost (the Node's record), the budget holds through the roll, and once it lets go
/// the new leader ends the instance, the desired capacity one lower, once.
async fn upgrade_keeps_the_lease_and_the_drain(u: Upgrade<'_>) {
    let report = u.report;
    report.step("upgrade: a pod with a budget that allows nothing on a live node");
    let before: std::collections::BTreeSet<String> =
        service_pods(u.pods).await.into_keys().collect();
    let ended = u.kubelet.instances_ended();
    let (gnode, giid) = u
        .kubelet
        .nodes()
        .into_iter()
        .find(|(_, i)| !ended.contains(i))
        .expect("a live node");
    create(
        u.admin,
        Some("shop"),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "guarded", "labels": {"app": "guarded"}},
            "spec": {"nodeName": gnode, "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "main", "image": "e2e/app:1",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                    "lifecycle": {"preStop": {"exec": {"command": ["sleep", "1"]}}}}]}
        }),
    )
    .await;
    create(
        u.admin,
        Some("shop"),
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guarded"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}
        }),
    )
    .await;
    until("the guarded pod Ready", 60, || {
        let admin = u.admin.clone();
        async move { ready_pods(&admin).await.contains_key("shop/guarded") }
    })
    .await;

    report.step("upgrade: CA scales that node in; the budget holds the drain");
    let mut req = tonic::Request::new(proto::NodeGroupDeleteNodesRequest {
        id: GROUP.into(),
        nodes: vec![proto::ExternalGrpcNode {
            provider_id: format!("aws:///us-east-1a/{giid}"),
            name: gnode.clone(),
            labels: [("kubernetes.io/hostname".to_string(), gnode.clone())].into(),
            ..Default::default()
        }],
    });
    req.set_timeout(Duration::from_secs(5));
    u.ca.node_group_delete_nodes(req)
        .await
        .unwrap_or_else(|e| panic!("NodeGroupDeleteNodes: {e}"));
    let refused = |cp: &ControlPlane| {
        cp.audit()
            .iter()
            .filter(|e| {
                e.user.username == SERVICE_ACCOUNT_USER
                    && e.is("create", "pods", "eviction")
                    && e.code() == 429
                    && e.target() == "shop/guarded"
            })
            .count()
    };
    let end = Instant::now() + Duration::from_secs(60);
    while refused(u.cp) == 0 {
        assert!(
            Instant::now() < end,
            "the budget never refused the drain's eviction of shop/guarded within 60 s:\n{}",
            diagnose(u.pods, u.node).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    report.step("upgrade: helm upgrade rolls both pods mid-drain");
    let out = u
        .helm
        .run(&[
            "upgrade",
            RELEASE,
            u.chart,
            "--namespace",
            NS,
            "--reuse-values",
            "--set-string",
            "podAnnotations.e2e-rollout=1",
        ])
        .unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("e2e: helm upgrade:\n{out}");
    let end = Instant::now() + Duration::from_secs(180);
    let holder = loop {
        let ps = service_pods(u.pods).await;
        let rolled =
            ps.len() == 2 && ps.values().all(ready) && ps.keys().all(|p| !before.contains(p));
        let holder = lease_holder(u.leases).await;
        if rolled && holder.as_ref().is_some_and(|h| ps.contains_key(h)) {
            break holder.unwrap();
        }
        assert!(
            Instant::now() < end,
            "the upgrade did not end with two new Ready pods, one holding the Lease, within 180 s (holder {holder:?}):\n{}",
            diagnose(u.pods, u.node).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!("e2e: after the upgrade, {holder} holds the Lease");
    assert!(
        !u.kubelet.instances_ended().contains(&giid),
        "the instance ended while its pod's budget allowed nothing"
    );
    assert!(
        ready_pods(u.admin).await.contains_key("shop/guarded"),
        "the guarded pod left through the upgrade"
    );

    report.step("upgrade: the budget lets go; the new leader ends the instance");
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(u.admin.clone(), "shop");
    pdbs.delete("guarded", &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete the guarded budget: {e}"));
    let end = Instant::now() + Duration::from_secs(120);
    while !u.kubelet.instances_ended().contains(&giid) {
        assert!(
            Instant::now() < end,
            "the instance {giid} did not end within 120 s after the budget let go:\n{}",
            diagnose(u.pods, u.node).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    report.step("check: evictions only; CA, on a new pod, reads the target one lower");
    checks::evictions_only_as(
        SERVICE_ACCOUNT_USER,
        &u.cp.audit(),
        &u.kubelet.stops(),
        std::slice::from_ref(&gnode),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let ps = service_pods(u.pods).await;
    let mut ca = connect_ca(u.certs, &holder, &ps[&holder]).await;
    ca.refresh(proto::RefreshRequest {}).await.expect("Refresh");
    let target = ca
        .node_group_target_size(proto::NodeGroupTargetSizeRequest { id: GROUP.into() })
        .await
        .expect("NodeGroupTargetSize")
        .into_inner()
        .target_size;
    assert_eq!(
        target,
        NODES - u.ended_before - 1,
        "the target size CA reads after the upgrade's drain"
    );
}

/// The DER bytes of every certificate of a PEM text.
fn pem_ders(pem: &str) -> Vec<Vec<u8>> {
    use base64::Engine as _;
    pem.split("-----BEGIN CERTIFICATE-----")
        .skip(1)
        .map(|c| {
            let body: String = c
                .lines()
                .take_while(|l| !l.starts_with("-----END"))
                .collect();
            base64::engine::general_purpose::STANDARD
                .decode(body.trim())
                .unwrap()
        })
        .collect()
}
