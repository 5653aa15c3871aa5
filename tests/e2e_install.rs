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
//! With real cluster-autoscaler (`E2E_CA_BINS`, each binary made into an image at test
//! time, issue 45): bundled mode installed over TCP and upgraded to the Unix socket, CA
//! scaling a group up through the provider before and after; and, with CA's own chart
//! (`E2E_CA_CHART`), sidecar mode installed from the example values, over the socket.
//! Without them those scenarios say they were skipped.
//!
//! The service's pods run on the real node (kubelet + containerd); the ASG's instances are
//! Nodes of the suite's fake kubelet (tests/e2e/kubelet.rs), following moto.
//! Needs root, containerd, runc, the CNI plugins, `E2E_IMAGES` (scripts/e2e/node-deps.sh),
//! umoci and skopeo (scripts/image.sh installs them), helm (`.venv/bin/helm` or
//! `E2E_HELM`) and moto.

use std::collections::BTreeMap;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

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
#[path = "e2e/real_ca.rs"]
mod real_ca;
#[path = "e2e/real_node.rs"]
mod real_node;
#[path = "e2e/release.rs"]
mod release;
#[path = "e2e/rig.rs"]
mod rig;

use control_plane::{ControlPlane, Who};
use kubelet::FakeKubelet;
use real_node::RealNode;
use rig::{
    binaries, create, is_ready as ready, ready_pods, until, Report, APP_MIN_READY, APP_REPLICAS,
    SERIAL,
};

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

fn pod_ip(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default()
}

/// The service's pods, Ready or not, by name.
async fn service_pods(pods: &Api<Pod>) -> BTreeMap<String, Pod> {
    labelled(
        pods,
        &format!("app.kubernetes.io/name=ca-asg-provider,app.kubernetes.io/instance={RELEASE}"),
    )
    .await
}

/// Pods that the label selector names, Ready or not, by name.
async fn labelled(pods: &Api<Pod>, selector: &str) -> BTreeMap<String, Pod> {
    let lp = ListParams::default().labels(selector);
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

/// What the pods and the real node (its kubelet and containerd) said, for a failure
/// message.
async fn diagnose(pods: &Api<Pod>, node: &RealNode) -> String {
    let mut out = String::new();
    // The chart's pods, and in sidecar mode CA's chart's.
    let selector = "app.kubernetes.io/name in (ca-asg-provider, cluster-autoscaler)";
    for (name, p) in labelled(pods, selector).await {
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
            if !path.display().to_string().starts_with(&dir) {
                continue;
            }
            // Each container's (the provider's; in bundled mode CA's too).
            for container in ["ca-asg-provider", "cluster-autoscaler"] {
                let Ok(log) = std::fs::read_to_string(path.join(container).join("0.log")) else {
                    continue;
                };
                let lines: Vec<&str> = log.lines().collect();
                out += &format!(
                    "--- log of {name}/{container}:\n{}\n",
                    lines[lines.len().saturating_sub(15)..].join("\n")
                );
            }
        }
    }
    out + &format!(
        "--- kubelet:\n{}\n--- containerd:\n{}",
        node.log_tail("kubelet"),
        node.log_tail("containerd")
    )
}

/// Waits up to `secs` (polling every `pause_ms`) until `probe` answers `Ok`; on a
/// timeout fails with its last `Err` (what was waited for, and what was seen), then what
/// the pods and the real node said.
async fn wait_or_diagnose<T>(
    pods: &Api<Pod>,
    node: &RealNode,
    secs: u64,
    pause_ms: u64,
    mut probe: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        let why = match probe().await {
            Ok(t) => return t,
            Err(why) => why,
        };
        if Instant::now() > end {
            panic!("{why}:\n{}", diagnose(pods, node).await);
        }
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
    }
}

/// The Secrets the chart leaves to the user: standalone mode's server certificate and,
/// with `client`, CA's client certificate (mTLS), from new certificates (returned).
async fn mtls_secrets(admin: &kube::Client, client: bool) -> install::Certs {
    let certs = install::Certs::new(SERVER_NAME).unwrap();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NS);
    let mut made = vec![("ca-asg-provider-server-tls", &certs.server)];
    if client {
        made.push(("cluster-autoscaler-grpc-client-tls", &certs.client));
    }
    for (name, (crt, key)) in made {
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": name}, "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": crt, "tls.key": key, "ca.crt": certs.ca}
        }))
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    certs
}

/// The values of a standalone install ([`chart_values`]) serving gRPC over the server
/// Secret of [`mtls_secrets`], `more` merged over them.
fn standalone_values(aws_endpoint: &str, more: serde_json::Value) -> serde_json::Value {
    let mut values = chart_values(
        aws_endpoint,
        json!({
            "mode": "standalone",
            "tls": {"certManager": {"enabled": false}, "serverSecretName": "ca-asg-provider-server-tls"},
        }),
    );
    merge(&mut values, more);
    values
}

/// The values of an install on the real node with AWS at `aws_endpoint` (moto's keys,
/// fast probes and refreshes, the ASGs found by the cluster's tags), `more` merged over
/// them (RFC 7386: a null removes).
fn chart_values(aws_endpoint: &str, more: serde_json::Value) -> serde_json::Value {
    let mut values = json!({
        "nodeSelector": {"kubernetes.io/hostname": SYSTEM_NODE},
        "extraEnv": [
            {"name": "AWS_ACCESS_KEY_ID", "value": "test"},
            {"name": "AWS_SECRET_ACCESS_KEY", "value": "test"},
        ],
        "readinessProbe": {"periodSeconds": 2},
        "config": {
            "refreshInterval": "10s",
            "autoDiscovery": [{"tags": ["k8s.io/cluster-autoscaler/enabled", format!("k8s.io/cluster-autoscaler/{CLUSTER}")]}],
            "aws": {"region": "us-east-1", "endpoint": aws_endpoint},
        },
    });
    merge(&mut values, more);
    values
}

/// `patch` merged over `v` as a JSON merge patch (RFC 7386).
fn merge(v: &mut serde_json::Value, patch: serde_json::Value) {
    let serde_json::Value::Object(patch) = patch else {
        *v = patch;
        return;
    };
    if !v.is_object() {
        *v = json!({});
    }
    let obj = v.as_object_mut().unwrap();
    for (k, p) in patch {
        if p.is_null() {
            obj.remove(&k);
        } else {
            merge(obj.entry(k).or_insert(serde_json::Value::Null), p);
        }
    }
}

/// The scale-in settings of the scenarios that drain: DaemonSet pods evicted last, a
/// workload deadline that never comes in a scenario.
fn evict_last() -> serde_json::Value {
    json!({"daemonSets": "evict-last", "workloadDeadline": "10m", "workloadDeadlinePolicy": "abandon"})
}

/// The image values of the service's image `image_ref` (`repository:tag`), imported
/// into the node (never pulled).
fn image_values(image_ref: &str) -> serde_json::Value {
    let (repo, tag) = image_ref.rsplit_once(':').unwrap();
    json!({"repository": repo, "tag": tag, "pullPolicy": "Never"})
}

/// `values` written to `name` in `dir`; the file's path.
fn values_file(dir: &std::path::Path, name: &str, values: &serde_json::Value) -> String {
    let file = dir.join(name);
    std::fs::write(&file, values.to_string()).unwrap();
    file.display().to_string()
}

/// `helm VERB RELEASE CHART --namespace kube-system --values FILE` (install or upgrade);
/// what helm said.
fn helm_values(helm: &install::Helm, verb: &str, release: &str, chart: &str, file: &str) -> String {
    let out = helm
        .run(&[verb, release, chart, "--namespace", NS, "--values", file])
        .unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("e2e: helm {verb} {release}:\n{out}");
    out
}

/// The logs of container `container` of each pod (on the real node) whose directory
/// under /var/log/pods starts with `prefix` (`NAMESPACE_NAME`): the API server cannot
/// reach this kubelet's port, which listens on 127.0.0.1.
fn node_logs(prefix: &str, container: &str) -> Vec<String> {
    std::fs::read_dir("/var/log/pods")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .filter_map(|e| std::fs::read_to_string(e.path().join(container).join("0.log")).ok())
        .collect()
}

/// An AWS endpoint on moto's host that nobody answers on (a port bound, then let go).
fn dead_endpoint(moto: &install::Moto) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let host = moto.url.rsplit_once(':').unwrap().0.to_string();
    format!("{host}:{port}")
}

/// The ASG [`GROUP`] as moto describes it.
async fn web_group(
    asg: &aws_sdk_autoscaling::Client,
) -> aws_sdk_autoscaling::types::AutoScalingGroup {
    asg.describe_auto_scaling_groups()
        .auto_scaling_group_names(GROUP)
        .send()
        .await
        .unwrap()
        .auto_scaling_groups()[0]
        .clone()
}

/// The provider's metrics text of pod `name` (port 8087); a failure names the pod.
async fn metrics_of(name: &str, pod: &Pod) -> (u16, String) {
    let addr = format!("{}:8087", pod_ip(pod));
    install::http_get(&addr, "/metrics")
        .await
        .unwrap_or_else(|e| panic!("scrape {name} at {addr}: {e:#}"))
}

/// `helm test` of the release (check-config in the cluster) reports its pod Succeeded.
fn helm_test_succeeds(helm: &install::Helm) {
    let out = helm
        .run(&["test", RELEASE, "--namespace", NS])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let check_log = node_logs(&format!("{NS}_{RELEASE}-check-config_"), "check-config");
    eprintln!(
        "e2e: helm test:\n{out}\ncheck-config said:\n{}",
        check_log.join("\n--\n")
    );
    assert!(
        out.contains("Succeeded"),
        "helm test did not report the check-config pod Succeeded:\n{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chart_installed_runs_two_replicas_holds_the_lease_and_drains_a_ca_scale_in() {
    let scenario = "chart install: standalone, two replicas, CA scale-in drained in the cluster";
    let driver = "the chart's pods; CA's calls by the suite's client over mTLS";
    let Some((_one_at_a_time, report, site)) = install_scenario(scenario, driver).await else {
        return;
    };
    let Site {
        work,
        image_ref,
        mut cp,
        admin,
        route: _route,
        node,
        moto,
        asg,
        kubelet,
        helm,
        chart,
    } = site;

    report.step("the Secrets the chart leaves to the user: mTLS certificates");
    let certs = mtls_secrets(&admin, true).await;

    report.step("helm install (standalone, two replicas)");
    let values = standalone_values(
        &moto.url,
        json!({"replicas": 2, "image": image_values(&image_ref), "config": {"scaleIn": evict_last()}}),
    );
    let file = values_file(work.path(), "values.yaml", &values);
    helm_values(&helm, "install", RELEASE, chart, &file);

    report.step("both pods scheduled on the real node and Ready through their probes");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let ps = wait_or_diagnose(&pods, &node, 120, 500, async || {
        let ps = service_pods(&pods).await;
        if ps.len() == 2 && ps.values().all(ready) {
            return Ok(ps);
        }
        Err("the service's two pods were not Ready within 120 s".to_string())
    })
    .await;
    for p in ps.values() {
        assert_eq!(
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some(SYSTEM_NODE),
            "the service's pod on the real node"
        );
    }

    report.step("one replica holds the Lease");
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NS);
    let leader = wait_or_diagnose(&pods, &node, 60, 500, async || {
        lease_holder(&leases)
            .await
            .ok_or_else(|| "no replica holds the Lease ca-asg-provider after 60 s".to_string())
    })
    .await;
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
        let (status, body) = metrics_of(name, p).await;
        assert_eq!(status, 200, "GET /metrics of {name}");
        assert!(
            body.contains("ca_asg_provider_"),
            "{name}'s /metrics has none of the service's metrics:\n{body}"
        );
        scraped.push(name.clone());
    }

    report.step("helm test (check-config in the cluster)");
    // helm's --logs goes through the API server to the kubelet, whose port listens on
    // 127.0.0.1 here: the log is read on the node instead.
    helm_test_succeeds(&helm);

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
    let victims = ca_scales_in_occupied_nodes(
        &report,
        "CA: NodeGroupDeleteNodes of two occupied nodes (direct mode)",
        (&admin, &kubelet, &mut ca),
        2,
        (&pods, &node),
    )
    .await;

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
    let g = web_group(&asg).await;
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
    let target = rig::ca_target(&mut ca).await;
    assert_eq!(target, NODES - 2, "the target size CA reads");

    report.step("check: no error answered to CA's calls (both pods' own counts, scraped)");
    let mut texts = Vec::new();
    for (name, p) in service_pods(&pods).await {
        texts.push(metrics_of(&name, &p).await.1);
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
    wait_or_diagnose(&pods, &node, 90, 500, async || {
        let holder = lease_holder(&leases).await;
        if holder.as_deref() == Some(follower.as_str()) {
            return Ok(());
        }
        Err(format!(
            "after {leader} was deleted the Lease is held by {holder:?}, not {follower}"
        ))
    })
    .await;
    report.step("the Deployment's replacement pod becomes Ready beside the new leader");
    cordon(false).await;
    wait_or_diagnose(&pods, &node, 120, 500, async || {
        let ps = service_pods(&pods).await;
        if ps.len() == 2 && ps.values().all(ready) && !ps.contains_key(&leader) {
            return Ok(());
        }
        Err(format!("no Ready replacement for {leader} within 120 s"))
    })
    .await;
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

/// `helm uninstall` leaves nothing holding instances (issue 62, 3): the chart installed
/// in standalone mode with `createLifecycleHook: true` puts its hook (and its record) on
/// the group; a hook made by hand sits beside it. `helm uninstall` runs the chart's
/// post-delete Job (`remove-hooks`, under a ServiceAccount of the provider's name, on
/// the provider's config), which succeeds: the group has no hook of ours and no record,
/// the hand-made hook is untouched, the Job, its ServiceAccount and ConfigMap are gone,
/// and a scale-in of the group is not held (the instance ends; no Terminating:Wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn helm_uninstall_removes_the_hook_the_service_created_and_only_it() {
    use ca_asg_provider::cloud::{LifecycleHook, LifecycleState};
    let scenario = "chart uninstall: the post-delete Job removes the service's hook";
    let driver = "the chart's pods and its post-delete Job";
    let Some((_one_at_a_time, report, site)) = install_scenario(scenario, driver).await else {
        return;
    };
    let (admin, node, helm, moto) = (&site.admin, &site.node, &site.helm, &site.moto);
    let cloud = AwsCloud::from_sdk_config(&moto.sdk_config().await);

    report.step("the server certificate Secret standalone mode mounts");
    mtls_secrets(admin, false).await;

    report.step("a hook made by hand on the group (never ours to remove)");
    let by_hand = LifecycleHook {
        name: "by-hand".into(),
        heartbeat_timeout_secs: 600,
        default_result: "CONTINUE".into(),
    };
    cloud.put_terminating_hook(GROUP, &by_hand).await.unwrap();

    report.step("helm install (standalone, one replica, createLifecycleHook)");
    let values = standalone_values(
        &moto.url,
        json!({
            "replicas": 1,
            "image": image_values(&site.image_ref),
            "uninstall": {"timeoutSeconds": 60},
            "config": {"scaleIn": {"createLifecycleHook": true, "lifecyclePollInterval": "2s"}},
        }),
    );
    let file = values_file(site.work.path(), "values.yaml", &values);
    helm_values(helm, "install", RELEASE, site.chart, &file);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);

    report.step("the service puts its hook on the group, with its record");
    wait_or_diagnose(&pods, node, 120, 500, async || {
        let names = hooks_of(&cloud).await;
        if names.contains(&"ca-asg-provider-drain".to_string()) && record(&cloud).await.is_some() {
            return Ok(());
        }
        Err(format!(
            "no hook of the service on the group within 120 s (hooks {names:?})"
        ))
    })
    .await;
    assert_eq!(
        record(&cloud).await.as_deref(),
        Some("ca-asg-provider-drain")
    );

    report.step("helm uninstall: the post-delete Job removes the hook");
    let started = Instant::now();
    let out = match helm.run(&["uninstall", RELEASE, "--namespace", NS, "--timeout", "3m"]) {
        Ok(out) => out,
        Err(e) => panic!(
            "helm uninstall failed: {e:#}\n{}",
            diagnose(&pods, node).await
        ),
    };
    eprintln!(
        "e2e: helm uninstall ({:.1} s):\n{out}",
        started.elapsed().as_secs_f64()
    );
    let job_logs = node_logs(&format!("{NS}_{RELEASE}-remove-hooks-"), "remove-hooks");
    eprintln!("e2e: remove-hooks said:\n{}", job_logs.join("\n--\n"));

    report.step("check: no hook of ours, no record, the hand-made hook untouched");
    assert_eq!(hooks_of(&cloud).await, ["by-hand"]);
    assert_eq!(record(&cloud).await, None);

    report.step("check: the Job, its ServiceAccount and ConfigMap are gone");
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(admin.clone(), NS);
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(admin.clone(), NS);
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let name = format!("{RELEASE}-remove-hooks");
    until("the hook objects deleted", 60, || {
        let (jobs, sas, cms, name) = (jobs.clone(), sas.clone(), cms.clone(), name.clone());
        async move {
            jobs.get_opt(&name).await.unwrap().is_none()
                && cms.get_opt(&name).await.unwrap().is_none()
                && sas.get_opt(RELEASE).await.unwrap().is_none()
        }
    })
    .await;
    assert!(
        service_pods(&pods).await.is_empty(),
        "a service pod is left"
    );

    report.step("check: a scale-in of the group is not held");
    let id = described(&cloud).await.instances.remove(0).id;
    site.asg
        .terminate_instance_in_auto_scaling_group()
        .instance_id(&id)
        .should_decrement_desired_capacity(true)
        .send()
        .await
        .unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let held = cloud
            .locate_instances(std::slice::from_ref(&id))
            .await
            .unwrap()
            .into_iter()
            .any(|l| l.state == LifecycleState::TerminatingWait);
        assert!(!held, "{id} waits in Terminating:Wait after the uninstall");
        if site.kubelet.instances_ended().contains(&id) {
            break;
        }
        assert!(
            Instant::now() < end,
            "{id} did not end within 30 s of its termination"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    report.step("done");
}

/// When the uninstall Job cannot do its work (here AWS does not answer: the config's
/// endpoint is a closed port), `helm uninstall` says the post-delete hook failed, and the
/// Job stays, its log saying in one plain sentence what failed and what to check
/// (docs/helm.md, Uninstall); its ServiceAccount and ConfigMap are deleted and the release
/// is gone, so nothing blocks a later install.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn helm_uninstall_whose_job_fails_says_why_and_keeps_the_job_to_read() {
    let scenario = "chart uninstall: the post-delete Job fails and says why";
    let driver = "the chart's post-delete Job";
    let Some((_one_at_a_time, report, site)) = install_scenario(scenario, driver).await else {
        return;
    };
    let (admin, helm) = (&site.admin, &site.helm);

    report.step("helm install with an AWS endpoint nobody answers on");
    mtls_secrets(admin, false).await;
    let values = standalone_values(
        &dead_endpoint(&site.moto),
        json!({
            "replicas": 1,
            "image": image_values(&site.image_ref),
            "readinessProbe": null,
            "uninstall": {"timeoutSeconds": 20},
            "config": {"refreshInterval": null, "aws": {"maxAttempts": 1}},
        }),
    );
    let file = values_file(site.work.path(), "values.yaml", &values);
    helm_values(helm, "install", RELEASE, site.chart, &file);

    report.step("helm uninstall: the post-delete Job fails, and helm says so");
    let started = Instant::now();
    let out = helm.run(&["uninstall", RELEASE, "--namespace", NS, "--timeout", "3m"]);
    eprintln!(
        "e2e: helm uninstall ({:.1} s): {out:#?}",
        started.elapsed().as_secs_f64()
    );
    let err = format!(
        "{:#}",
        out.expect_err("helm uninstall succeeded with a failing Job")
    );
    assert!(err.contains("remove-hooks"), "{err}");

    report.step("check: the Job is kept, and its log says what failed and what to check");
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(admin.clone(), NS);
    let name = format!("{RELEASE}-remove-hooks");
    let job = jobs
        .get_opt(&name)
        .await
        .unwrap()
        .expect("the failed Job is kept");
    let failed = job
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Failed" && c.status == "True");
    assert!(failed, "the Job is not Failed");
    let logs = node_logs(&format!("{NS}_{name}-"), "remove-hooks");
    eprintln!("e2e: remove-hooks said:\n{}", logs.join("\n--\n"));
    assert!(
        logs.iter().any(|l| l.contains(
            "FAILED: AWS did not answer DescribeAutoScalingGroups while listing the configured Auto Scaling Groups: check the region, the endpoint and the network"
        )),
        "{logs:?}"
    );
    assert!(
        logs.iter().all(|l| !l.contains("DispatchFailure")),
        "{logs:?}"
    );
    report.step(
        "check: only the Job is left (not its ServiceAccount or ConfigMap); the release is gone",
    );
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(admin.clone(), NS);
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    // helm 4 deletes the hook objects that succeeded (hook-succeeded) even when a later
    // one fails: only the failed Job is left, which blocks no later install.
    assert!(sas.get_opt(RELEASE).await.unwrap().is_none());
    assert!(cms.get_opt(&name).await.unwrap().is_none());
    let status = helm.run(&["status", RELEASE, "--namespace", NS]);
    assert!(status.is_err(), "the release is still there: {status:?}");
    report.step("done");
}

/// The quickstart's scripts (deploy/quickstart/, docs/quickstart-eks.md includes their
/// text; issue 61, 2) run as written, with kubectl and helm from PATH and the cluster from
/// KUBECONFIG, on the real control plane with moto for AWS: `install.sh` with AWS out of
/// reach (it fails at its timeout, showing the pods' NotReady Events), then (standalone,
/// two replicas; the image by IMAGE_REPOSITORY and IMAGE_TAG) twice over that failed
/// release, the second run changing no pod; `verify.sh` (rollout, both replicas Ready, the Lease held, helm test,
/// check-config in the pod through `kubectl exec`); `scale-in.sh` of an occupied node
/// (`drain NODE --terminate` in a pod of the release), after which the instance has
/// ended, the group is one smaller, the Node is gone, every workload pod was evicted (none
/// deleted), the app's budget held and the DaemonSet pods went last; then again on the
/// gone node; `upgrade.sh` turning the lifecycle hook on (the pods roll, never zero Ready;
/// the hook appears); `uninstall.sh` twice: the hook removed from the group, nothing of
/// the release, RBAC or Lease left. A failure names the script and the step it stopped in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quickstart_scripts_install_verify_scale_in_upgrade_and_uninstall() {
    let scenario = "quickstart scripts: install, verify, scale-in, upgrade, uninstall";
    let driver = "deploy/quickstart/*.sh (kubectl and helm)";
    let Some((_one_at_a_time, report, site)) = install_scenario(scenario, driver).await else {
        return;
    };
    let (admin, node) = (&site.admin, &site.node);
    let cloud = AwsCloud::from_sdk_config(&site.moto.sdk_config().await);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);

    report.step("the server certificate Secret standalone mode mounts (the operator's)");
    mtls_secrets(admin, false).await;

    report.step("the operator's values file (standalone, two replicas, AWS at moto)");
    let values = standalone_values(
        &site.moto.url,
        json!({
            "replicas": 2,
            "image": {"repository": "placeholder.invalid/overridden-by-IMAGE_REPOSITORY", "pullPolicy": "Never"},
            "uninstall": {"timeoutSeconds": 60},
            "config": {"scaleIn": evict_last()},
        }),
    );
    let file = values_file(site.work.path(), "my-values.yaml", &values);
    let (repo, tag) = site.image_ref.rsplit_once(':').unwrap();
    // Issue 74, 4: the scripts run on Helm 3 and Helm 4. This scenario runs them with
    // Helm 3 where scripts/test.sh put one (E2E_HELM3); the other scenarios run install.sh
    // with the suite's Helm 4.
    let helm3 = std::env::var_os("E2E_HELM3").map(std::path::PathBuf::from);
    let major = if helm3.is_some() { 3 } else { 4 };
    report.step(&format!("the scripts run with Helm {major}"));
    let scripts = Scripts::with_helm(
        site.work.path(),
        &site.helm,
        helm3.as_deref().unwrap_or(&site.helm.bin),
    );
    let chart = [
        ("CHART", site.chart.to_string()),
        ("VALUES", file),
        ("IMAGE_REPOSITORY", repo.to_string()),
        ("IMAGE_TAG", tag.to_string()),
        ("TIMEOUT", "3m".to_string()),
    ];

    report
        .step("install.sh with AWS out of reach: it times out and shows the pods' NotReady Events");
    let mut unreachable = values.clone();
    merge(
        &mut unreachable,
        json!({"config": {"aws": {"endpoint": dead_endpoint(&site.moto), "maxAttempts": 1}}}),
    );
    let mut timing_out = chart.clone();
    timing_out[1].1 = values_file(site.work.path(), "unreachable-values.yaml", &unreachable);
    timing_out[4].1 = "50s".to_string();
    let (ok, out) = scripts.output("install.sh", &timing_out, &[]).await;
    assert!(!ok, "install.sh succeeded with AWS out of reach:\n{out}");
    for line in [
        "install.sh: FAILED at step \"helm upgrade --install",
        "NotReady",
        "Warning Events of pod ca-asg-provider-",
    ] {
        assert!(
            out.contains(line),
            "install.sh's timeout did not say {line:?}:\n{out}"
        );
    }

    report.step("install.sh (over the release that failed)");
    let out = scripts.run("install.sh", &chart, &[], &pods, node).await;
    assert!(
        out.contains(&format!("(helm {major}: ")),
        "install.sh did not say it runs on Helm {major}:\n{out}"
    );
    let installed: Vec<String> = service_pods(&pods).await.into_keys().collect();
    assert_eq!(
        installed.len(),
        2,
        "two pods after install.sh: {installed:?}"
    );
    report.step("install.sh again: nothing changes");
    scripts.run("install.sh", &chart, &[], &pods, node).await;
    let again: Vec<String> = service_pods(&pods).await.into_keys().collect();
    assert_eq!(again, installed, "a second install.sh replaced pods");

    report.step("verify.sh");
    let out = scripts.run("verify.sh", &[], &[], &pods, node).await;
    for line in [
        "2 of 2 replicas Ready",
        "configuration: ok",
        "node groups found: 1",
        "no problems found",
        "verify.sh: done",
    ] {
        assert!(out.contains(line), "verify.sh did not say {line:?}:\n{out}");
    }
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NS);
    let holder = lease_holder(&leases).await.expect("the Lease held");
    assert!(
        out.contains(&format!("held by {holder}")),
        "verify.sh names another holder than {holder}:\n{out}"
    );

    report.step("scale-in.sh of a node running an app pod");
    let (victim, iid) = rig::occupied(admin, &site.kubelet)
        .await
        .into_iter()
        .next()
        .expect("a node running an app pod");
    report.scale_in_begins("scale-in.sh (drain NODE --terminate in the pod)");
    let started = Instant::now();
    let out = scripts
        .run("scale-in.sh", &[("NODE", victim.clone())], &[], &pods, node)
        .await;
    *report.scale_in_secs.lock() = Some(started.elapsed().as_secs_f64());
    for line in [
        &format!("the service's leader {holder} runs the drain (recorded for it on {victim})"),
        "done: node drained and its instance terminated",
        &format!("node {victim} is gone"),
        "scale-in.sh: done",
    ] {
        assert!(
            out.contains(line),
            "scale-in.sh did not say {line:?}:\n{out}"
        );
    }
    assert!(
        site.kubelet.instances_ended().contains(&iid),
        "{iid} did not end"
    );
    assert_eq!(
        web_group(&site.asg).await.desired_capacity(),
        Some(NODES - 1),
        "the group's desired capacity after one scale-in"
    );
    report.step("check: evictions only, by the chart's ServiceAccount; the budget held; DaemonSet pods last");
    let (audit, stops) = (site.cp.audit(), site.kubelet.stops());
    let drained = vec![victim.clone()];
    // One engine drained the node: the command handed its drain to the Lease holder
    // (before, the holder also resumed the drain the command ran itself, and a pod
    // could be evicted twice). `evictions_only_as` refuses a second eviction of a pod.
    if let Err(e) = checks::evictions_only_as(SERVICE_ACCOUNT_USER, &audit, &stops, &drained) {
        let evictions: Vec<String> = audit
            .iter()
            .filter(|a| a.is("create", "pods", "eviction"))
            .map(|a| {
                format!(
                    "{:?} {} {} {}",
                    a.stage_timestamp,
                    a.target(),
                    a.code(),
                    a.user_agent
                )
            })
            .collect();
        panic!(
            "{e}\nevictions:\n{}\n{}",
            evictions.join("\n"),
            diagnose(&pods, node).await
        );
    }
    let fewest = checks::fewest_ready(&site.kubelet.readies(), &stops, "shop/app-", APP_REPLICAS);
    assert!(
        fewest >= APP_MIN_READY,
        "only {fewest} app pods Ready at one moment"
    );
    let asked = report.scale_in_asked.lock().expect("asked");
    checks::daemonset_last(&stops, &drained, asked).unwrap_or_else(|e| panic!("{e}"));
    report.step("scale-in.sh again: the node is gone already");
    let out = scripts
        .run("scale-in.sh", &[("NODE", victim.clone())], &[], &pods, node)
        .await;
    assert!(out.contains("gone already"), "{out}");

    report.step("upgrade.sh turning the lifecycle hook on (the pods roll)");
    let out = scripts
        .run(
            "upgrade.sh",
            &chart,
            &["--set", "config.scaleIn.createLifecycleHook=true"],
            &pods,
            node,
        )
        .await;
    assert!(
        out.contains("never fewer than 1 Ready replica(s)")
            || out.contains("never fewer than 2 Ready replica(s)"),
        "{out}"
    );
    let rolled: Vec<String> = service_pods(&pods).await.into_keys().collect();
    assert!(
        rolled.iter().all(|p| !installed.contains(p)),
        "upgrade.sh's change did not roll the pods: {installed:?} then {rolled:?}"
    );
    until("the service's hook on the group", 120, || {
        let cloud = &cloud;
        async move { hooks_of(cloud).await == ["ca-asg-provider-drain"] }
    })
    .await;

    report
        .step("a drain in flight: a pod whose budget allows nothing, drained through kubectl exec");
    let ended = site.kubelet.instances_ended();
    let (gnode, giid) = site
        .kubelet
        .nodes()
        .into_iter()
        .find(|(_, i)| !ended.contains(i))
        .expect("a live node");
    create(
        admin,
        Some("shop"),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "guarded", "labels": {"app": "guarded"}},
            "spec": {"nodeName": gnode, "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "main", "image": "e2e/app:1",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}
        }),
    )
    .await;
    create(
        admin,
        Some("shop"),
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guarded"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}
        }),
    )
    .await;
    until("the guarded pod Ready", 60, || {
        let admin = admin.clone();
        async move { ready_pods(&admin).await.contains_key("shop/guarded") }
    })
    .await;
    let mut drain = scripts.spawn_kubectl(&[
        "--namespace",
        NS,
        "exec",
        &format!("deployment/{RELEASE}"),
        "--",
        "ca-asg-provider",
        "drain",
        &gnode,
    ]);
    let nodes: Api<Node> = Api::all(admin.clone());
    let marks = |n: &Node| -> Vec<String> {
        let taints = n.spec.iter().flat_map(|s| s.taints.iter().flatten());
        let annotations = n.metadata.annotations.iter().flat_map(|a| a.keys());
        taints
            .map(|t| t.key.clone())
            .chain(annotations.cloned())
            .filter(|k| k.starts_with("ca-asg-provider.io/"))
            .collect()
    };
    wait_or_diagnose(&pods, node, 90, 500, async || {
        let n = nodes.get(&gnode).await.map_err(|e| e.to_string())?;
        let refused = site.cp.audit().iter().any(|e| {
            e.is("create", "pods", "eviction") && e.code() == 429 && e.target() == "shop/guarded"
        });
        match (marks(&n).is_empty(), refused) {
            (false, true) => Ok(()),
            _ => Err(format!(
                "{gnode} is not marked and held by the budget within 90 s (marks {:?}, refused {refused})",
                marks(&n)
            )),
        }
    })
    .await;

    report.step("uninstall.sh with that drain in flight");
    let out = scripts.run("uninstall.sh", &[], &[], &pods, node).await;
    assert!(out.contains("uninstall.sh: done"), "{out}");
    let _ = drain.kill().await;
    report.step("check: the drained node given back, the guarded pod and its instance kept");
    let n = nodes.get(&gnode).await.unwrap();
    assert_eq!(
        marks(&n),
        Vec::<String>::new(),
        "{gnode} still carries the service's marks after uninstall.sh"
    );
    assert_ne!(
        n.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "{gnode} stays cordoned after uninstall.sh"
    );
    for said in [
        "0 replicas, no pod left",
        "no Node carries a mark of the service",
    ] {
        assert!(
            out.contains(said),
            "uninstall.sh did not say {said:?}:\n{out}"
        );
    }
    assert!(
        ready_pods(admin).await.contains_key("shop/guarded"),
        "the guarded pod was evicted"
    );
    assert!(
        !site.kubelet.instances_ended().contains(&giid),
        "the drained node's instance ended"
    );
    let all_nodes = nodes.list(&ListParams::default()).await.unwrap();
    assert!(
        all_nodes.items.iter().all(|n| marks(n).is_empty()),
        "a node carries the service's marks after uninstall.sh"
    );
    report.step("check: no hook of the service on the group, no record, no object, no Lease");
    assert_eq!(hooks_of(&cloud).await, Vec::<String>::new());
    assert_eq!(record(&cloud).await, None);
    assert!(service_pods(&pods).await.is_empty(), "a pod is left");
    assert!(
        leases.get_opt("ca-asg-provider").await.unwrap().is_none(),
        "the Lease is left"
    );
    let crs: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(admin.clone());
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}"));
    assert!(
        crs.list(&lp).await.unwrap().items.is_empty(),
        "a ClusterRole is left"
    );
    report.step("uninstall.sh again: nothing to uninstall, nothing left");
    let out = scripts.run("uninstall.sh", &[], &[], &pods, node).await;
    assert!(out.contains("uninstalled already"), "{out}");
    eprintln!(
        "e2e: the quickstart's scripts, site included, in {:.0} s",
        report.began.elapsed().as_secs_f64()
    );
    report.step("done");
}

/// The quickstart's scripts run as an operator runs them: deploy/quickstart/NAME with
/// kubectl (from PATH) and helm (the suite's, as `helm` on PATH), the cluster from
/// KUBECONFIG (the admin's), helm's state in the site's directory.
struct Scripts {
    path: String,
    env: Vec<(String, String)>,
}

impl Scripts {
    /// In `work` (a `bin/` of its own there, for `helm`), with `helm`'s kubeconfig and
    /// state.
    fn new(work: &std::path::Path, helm: &install::Helm) -> Scripts {
        Scripts::with_helm(work, helm, &helm.bin)
    }

    /// As [`Scripts::new`], with another helm binary (Helm 3) as `helm`.
    fn with_helm(
        work: &std::path::Path,
        helm: &install::Helm,
        bin_path: &std::path::Path,
    ) -> Scripts {
        let bin = work.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(bin_path, bin.join("helm")).unwrap();
        let home = &helm.home;
        let env = [
            ("KUBECONFIG", helm.kubeconfig.display().to_string()),
            ("HELM_CACHE_HOME", home.join("cache").display().to_string()),
            (
                "HELM_CONFIG_HOME",
                home.join("config").display().to_string(),
            ),
            ("HELM_DATA_HOME", home.join("data").display().to_string()),
        ];
        Scripts {
            path: format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
            env: env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }

    /// Runs one script with `env` and `args`; its output (stdout then stderr). A failure
    /// names the script and shows its last lines (the step it stopped in) and the pods.
    async fn run(
        &self,
        name: &str,
        env: &[(&str, String)],
        args: &[&str],
        pods: &Api<Pod>,
        node: &RealNode,
    ) -> String {
        let (ok, text) = self.output(name, env, args).await;
        if !ok {
            let lines: Vec<&str> = text.lines().collect();
            panic!(
                "deploy/quickstart/{name} failed:\n{}\n{}",
                lines[lines.len().saturating_sub(30)..].join("\n"),
                diagnose(pods, node).await
            );
        }
        text
    }

    /// `kubectl ARGS` in the background, as the operator's terminal runs it (killed on drop).
    fn spawn_kubectl(&self, args: &[&str]) -> tokio::process::Child {
        tokio::process::Command::new("kubectl")
            .args(args)
            .env("PATH", &self.path)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"))
    }

    /// Runs one script with `env` and `args`: whether it exited 0, and its output
    /// (stdout then stderr).
    async fn output(&self, name: &str, env: &[(&str, String)], args: &[&str]) -> (bool, String) {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/quickstart/").to_string() + name;
        let started = Instant::now();
        let out = tokio::process::Command::new(&script)
            .args(args)
            .env("PATH", &self.path)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true)
            .output()
            .await
            .unwrap_or_else(|e| panic!("run {script}: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "e2e: deploy/quickstart/{name} ({:.1} s, {}):\n{text}",
            started.elapsed().as_secs_f64(),
            out.status
        );
        (out.status.success(), text)
    }
}

/// The group's terminating hooks, by name.
async fn hooks_of(cloud: &AwsCloud) -> Vec<String> {
    let mut names: Vec<String> = cloud
        .terminating_hooks(GROUP)
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.name)
        .collect();
    names.sort();
    names
}

/// The group's record of the hook the service created, if any.
async fn record(cloud: &AwsCloud) -> Option<String> {
    described(cloud)
        .await
        .tags
        .get(ca_asg_provider::scalein::decide::hooks::HOOK_RECORD_TAG)
        .cloned()
}

/// The group [`GROUP`] as the service's cloud describes it.
async fn described(cloud: &AwsCloud) -> ca_asg_provider::cloud::AsgSnapshot {
    cloud
        .describe_groups(&GroupSelector {
            names: vec![GROUP.into()],
            tag_sets: vec![],
        })
        .await
        .unwrap()
        .remove(0)
}

/// What every install scenario needs here: the control plane's binaries, a real node's
/// images and helm; `None` after saying which is missing (a failure under
/// `E2E_REQUIRED=1`).
fn install_needs(
    scenario: &str,
) -> Option<(
    control_plane::Binaries,
    std::path::PathBuf,
    std::path::PathBuf,
)> {
    let bin = binaries(scenario)?;
    let Some(images) = real_node::available() else {
        skip_or_fail(scenario, "no real node here (root, containerd, runc, CNI plugins and E2E_IMAGES are needed: scripts/e2e/node-deps.sh)");
        return None;
    };
    let Some(helm_bin) = install::helm_binary() else {
        skip_or_fail(
            scenario,
            "no helm (.venv/bin/helm from scripts/test.sh, or E2E_HELM)",
        );
        return None;
    };
    Some((bin, images, helm_bin))
}

/// An install scenario's start: what it needs (`None` after saying what is missing),
/// then, one scenario at a time (the guard returned), its report (`driver` making CA's
/// calls) and its [`Site`].
async fn install_scenario(
    scenario: &str,
    driver: &str,
) -> Option<(tokio::sync::MutexGuard<'static, ()>, Report, Site)> {
    let (bin, images, helm_bin) = install_needs(scenario)?;
    let one_at_a_time = SERIAL.lock().await;
    let report = Report::new(scenario, driver, &bin.version);
    let site = Site::start(&report, &bin, &images, helm_bin).await;
    Some((one_at_a_time, report, site))
}

/// The real-CA tier's binaries (`E2E_CA_BINS`); `None` after the one line that says
/// the tier was skipped and why.
fn real_cas(scenario: &str) -> Option<Vec<real_ca::CaBinary>> {
    match real_ca::binaries_from_env() {
        Ok(cas) if !cas.is_empty() => Some(cas),
        Ok(_) => {
            eprintln!("{scenario}: real-CA tier skipped (no binaries)");
            None
        }
        Err(why) => {
            eprintln!("{scenario}: real-CA tier skipped ({why})");
            None
        }
    }
}

/// A site for one CA version: its report, the [`Site`], and CA's image made from the
/// binary and imported into the node (its reference returned).
async fn ca_site(
    scenario: &str,
    driver: &str,
    bin: &control_plane::Binaries,
    images: &std::path::Path,
    helm_bin: std::path::PathBuf,
    ca: &real_ca::CaBinary,
) -> (Report, Site, String) {
    let report = Report::new(
        &format!("{scenario} (CA {})", ca.version),
        &format!("real cluster-autoscaler {} {driver}", ca.version),
        &bin.version,
    );
    let site = Site::start(&report, bin, images, helm_bin).await;
    report.step("CA's image from its binary (umoci), imported into the node");
    let (ca_image, ca_ref) = install::ca_image(&ca.path, &ca.version, site.work.path())
        .unwrap_or_else(|e| panic!("{e:#}"));
    site.node
        .import_image(&ca_image)
        .unwrap_or_else(|e| panic!("ctr images import {}: {e:#}", ca_image.display()));
    (report, site, ca_ref)
}

/// The end of a real-CA install: no error answered to CA (the provider's own counts in
/// `pod`), no container of `pod` restarted (its sidecar included).
async fn no_errors_no_restarts(site: &Site, pods: &Api<Pod>, pod: &Pod) {
    let (_, text) = install::http_get(&format!("{}:8087", pod_ip(pod)), "/metrics")
        .await
        .unwrap_or_else(|e| panic!("scrape the provider: {e:#}"));
    checks::provider_errors(&[text], &[]).unwrap_or_else(|e| panic!("{e}"));
    let now = pods
        .get(&pod.metadata.name.clone().unwrap_or_default())
        .await
        .unwrap();
    let status = now.status.unwrap_or_default();
    for c in status
        .container_statuses
        .into_iter()
        .flatten()
        .chain(status.init_container_statuses.into_iter().flatten())
    {
        assert_eq!(c.restart_count, 0, "container {} restarted", c.name);
    }
    // The fake kubelet's loops end with this site, before the next CA version's.
    site.kubelet.stop();
}

/// What every install scenario stands on: the service's image imported into a real
/// node's containerd, the control plane with the `kubernetes` Service's route and the
/// root CA ConfigMap, moto on the node's IP with the ASG `web` of [`NODES`] instances
/// (the fake kubelet's Nodes), and on them the app (a budget of 1) and a log shipper.
struct Site {
    work: tempfile::TempDir,
    image_ref: String,
    cp: ControlPlane,
    admin: kube::Client,
    route: install::ServiceRoute,
    node: RealNode,
    moto: install::Moto,
    asg: aws_sdk_autoscaling::Client,
    kubelet: FakeKubelet,
    helm: install::Helm,
    chart: &'static str,
}

impl Site {
    async fn start(
        report: &Report,
        bin: &control_plane::Binaries,
        images: &std::path::Path,
        helm_bin: std::path::PathBuf,
    ) -> Site {
        Site::start_with(report, bin, images, helm_bin, true).await
    }

    /// With `build_image` false, no image of the service is built or imported (`image_ref`
    /// is empty): the scenario brings its own (the release's, pulled from a registry).
    async fn start_with(
        report: &Report,
        bin: &control_plane::Binaries,
        images: &std::path::Path,
        helm_bin: std::path::PathBuf,
        build_image: bool,
    ) -> Site {
        let work = tempfile::Builder::new()
            .prefix("ca-asg-e2e-install-")
            .tempdir()
            .unwrap();

        let built = build_image.then(|| {
            report.step("build the service's image (scripts/image.sh)");
            install::service_image(work.path()).unwrap_or_else(|e| panic!("{e:#}"))
        });

        report.step("start the control plane");
        let mut cp = ControlPlane::start(bin)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let admin = cp.client(Who::Admin).await.unwrap();

        report.step("route the kubernetes Service's IP to the API server (kube-proxy's part)");
        let route = install::ServiceRoute::start(&cp.url)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));

        report.step("start a real node for the service's pods");
        let node = RealNode::start(
            &cp,
            &bin.k8s.join("kubelet"),
            images,
            SYSTEM_NODE,
            "aws:///us-east-1a/i-0e2e00000000system",
            "e2e.ca-asg-provider.io/role=system",
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
        let image_ref = match built {
            Some((image, image_ref)) => {
                report.step("import the service's image into the node");
                let imported = node
                    .import_image(&image)
                    .unwrap_or_else(|e| panic!("ctr images import {}: {e:#}", image.display()));
                eprintln!("e2e: ctr imported: {}", imported.trim());
                image_ref
            }
            None => String::new(),
        };
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
        support::moto::launch_template(&sdk, "web").await;
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
        let kubelet =
            FakeKubelet::start_following(cp.client(Who::Kubelet).await.unwrap(), move || {
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
        until("the app's pods Ready", 60, || async {
            rig::app_ready(&admin).await == APP_REPLICAS
        })
        .await;

        report.step("the root CA ConfigMap (the root CA publisher's part)");
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

        let helm = install::Helm {
            bin: helm_bin,
            kubeconfig: cp.kubeconfig(Who::Admin).unwrap(),
            home: work.path().join("helm"),
        };
        Site {
            work,
            image_ref,
            cp,
            admin,
            route,
            node,
            moto,
            asg,
            kubelet,
            helm,
            chart: concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/chart"),
        }
    }
}

/// Bundled mode with real cluster-autoscaler in the pod (issue 45, 2 and 4), for each
/// binary of `E2E_CA_BINS` (skipped without: no registry serves CA). First installed as
/// chart 0.1.0 wired it (`transport: tcp`, 127.0.0.1:8086): CA's loop reaches the
/// provider and CA scales the group up for a pending pod. Then `helm upgrade` with the
/// same values, which takes the new default transport: the pod rolls; the new one has
/// no gRPC port, one emptyDir that both containers mount at socketDir, and CA's
/// cloud-config names the socket; CA's loop reaches the provider through it and scales
/// up again. Counted from both sides: the provider's gRPC counts and CA's own metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bundled_with_real_ca_scales_up_over_tcp_then_over_the_socket_after_upgrade() {
    let scenario = "chart install: bundled with real CA, TCP, then helm upgrade to the socket";
    let Some((bin, images, helm_bin)) = install_needs(scenario) else {
        return;
    };
    let Some(cas) = real_cas(scenario) else {
        return;
    };
    for ca in &cas {
        bundled_with(scenario, &bin, &images, helm_bin.clone(), ca).await;
    }
}

/// The chart's default number of pods (values.yaml `replicas`), bundled mode included.
const CHART_REPLICAS: usize = 2;

/// The release's pods once [`CHART_REPLICAS`] of them are Ready and none is one of
/// `not` (the pods a roll replaces), then the one whose cluster-autoscaler holds CA's
/// Lease (its holder identity is the pod's host name, in some versions followed by an
/// underscore and a UUID): the
/// pod whose CA runs the loop and calls its own provider.
async fn bundled_pods(pods: &Api<Pod>, node: &RealNode, not: &[String]) -> (Pod, Vec<String>) {
    let leases: Api<Lease> = Api::namespaced(pods.clone().into_client(), NS);
    wait_or_diagnose(pods, node, 180, 500, async || {
        let ps = service_pods(pods).await;
        let fresh =
            ps.len() == CHART_REPLICAS && ps.iter().all(|(n, p)| ready(p) && !not.contains(n));
        let holder = leases
            .get_opt("cluster-autoscaler")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .unwrap_or_default();
        if fresh {
            if let Some((_, p)) = ps
                .iter()
                .find(|(n, _)| holder == **n || holder.starts_with(&format!("{n}_")))
            {
                return Ok((p.clone(), ps.keys().cloned().collect()));
            }
        }
        Err(format!(
            "not {CHART_REPLICAS} new bundled pods Ready with one CA holding its Lease within 180 s (holder {holder:?})"
        ))
    })
    .await
}

/// Sums the samples of `name` in a Prometheus text that carry every `labels` pair.
fn counter(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    real_ca::samples(text, name, labels).into_iter().sum()
}

/// Waits until both sides of the pod count CA's loop: the provider answered CA's
/// NodeGroups (its own counts, port 8087) and CA's main loop ran (CA's metrics, 8085).
async fn ca_reaches_the_provider(pods: &Api<Pod>, node: &RealNode, pod: &Pod) {
    let ip = pod_ip(pod);
    wait_or_diagnose(pods, node, 120, 1000, async || {
        let provider = install::http_get(&format!("{ip}:8087"), "/metrics").await;
        let ca = install::http_get(&format!("{ip}:8085"), "/metrics").await;
        if let (Ok((200, provider)), Ok((200, ca))) = (&provider, &ca) {
            let answered = counter(
                provider,
                "ca_asg_provider_grpc_requests_total",
                &[("method", "NodeGroups"), ("code", "Ok")],
            );
            let loops = counter(
                ca,
                "cluster_autoscaler_function_duration_seconds_count",
                &[("function", "main")],
            );
            if answered > 0.0 && loops > 0.0 {
                return Ok(());
            }
        }
        Err(format!(
            "CA's loop did not reach the provider within 120 s (provider: {:?}, CA: {:?})",
            provider.map(|(c, _)| c),
            ca.map(|(c, _)| c),
        ))
    })
    .await
}

/// The app grows to `replicas` (one pod per node): real CA must add the node.
async fn ca_scales_up_to(site: &Site, pods: &Api<Pod>, pod: &Pod, replicas: usize) {
    rig::scale_app(&site.admin, replicas).await;
    wait_or_diagnose(pods, &site.node, 180, 500, async || {
        let on = rig::app_ready(&site.admin).await;
        if on == replicas && site.kubelet.nodes().len() == replicas {
            return Ok(());
        }
        Err(format!(
            "CA did not bring the app to {replicas} Ready pods on {replicas} Nodes within 180 s ({on} Ready, {} Nodes)",
            site.kubelet.nodes().len(),
        ))
    })
    .await;
    let (_, ca) = install::http_get(&format!("{}:8085", pod_ip(pod)), "/metrics")
        .await
        .unwrap_or_else(|e| panic!("scrape CA's metrics: {e:#}"));
    let up = counter(&ca, "cluster_autoscaler_scaled_up_nodes_total", &[]);
    assert!(
        up >= 1.0,
        "CA's own metrics count {up} nodes scaled up by this pod's CA"
    );
    assert_eq!(
        web_group(&site.asg).await.desired_capacity(),
        Some(replicas as i32),
        "the ASG's desired capacity after CA's scale-up"
    );
}

async fn bundled_with(
    scenario: &str,
    bin: &control_plane::Binaries,
    images: &std::path::Path,
    helm_bin: std::path::PathBuf,
    ca: &real_ca::CaBinary,
) {
    let _one_at_a_time = SERIAL.lock().await;
    let (report, site, ca_ref) =
        ca_site(scenario, "in the chart's pod", bin, images, helm_bin, ca).await;

    let values = |transport: Option<&str>| {
        let mut v = chart_values(
            &site.moto.url,
            json!({
                "mode": "bundled",
                "image": image_values(&site.image_ref),
                "clusterAutoscaler": {
                    "image": image_values(&ca_ref),
                    // The scenario's node count stays its own: CA only scales up here
                    // (--scale-down-enabled is deprecated from 1.36).
                    "flags": {"scale-down-unneeded-time": "1h", "scan-interval": "5s"},
                },
            }),
        );
        if let Some(t) = transport {
            v["transport"] = json!(t);
        }
        let name = format!("values-{}.yaml", transport.unwrap_or("default"));
        values_file(site.work.path(), &name, &v)
    };
    let pods: Api<Pod> = Api::namespaced(site.admin.clone(), NS);

    report.step("helm install, bundled, transport tcp (chart 0.1.0's wiring)");
    let file = values(Some("tcp"));
    helm_values(&site.helm, "install", RELEASE, site.chart, &file);
    let (first, first_pods) = bundled_pods(&pods, &site.node, &[]).await;
    let grpc_port = |p: &Pod| {
        p.spec
            .iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.ports.iter().flatten())
            .any(|port| port.container_port == 8086)
    };
    let cloud_config = || async {
        let config: ConfigMap = Api::namespaced(site.admin.clone(), NS)
            .get("cluster-autoscaler-cloud-config")
            .await
            .unwrap();
        config
            .data
            .unwrap_or_default()
            .into_values()
            .collect::<String>()
    };
    let tcp = cloud_config().await;
    assert!(
        tcp.contains("127.0.0.1:8086"),
        "transport tcp: CA's cloud-config names the provider's loopback port:\n{tcp}"
    );

    report.step("tcp: CA's loop reaches the provider");
    ca_reaches_the_provider(&pods, &site.node, &first).await;
    report.step("tcp: a pending app pod; CA scales the group up through the provider");
    ca_scales_up_to(&site, &pods, &first, NODES as usize + 1).await;

    report.step("helm upgrade with the same values: the new default transport, unix");
    helm_values(&site.helm, "upgrade", RELEASE, site.chart, &values(None));
    let (second, _) = bundled_pods(&pods, &site.node, &first_pods).await;

    report.step("unix: no gRPC port; one emptyDir at socketDir in both containers");
    assert!(
        !grpc_port(&second),
        "transport unix: a gRPC port is still on the pod"
    );
    let spec = second.spec.clone().unwrap_or_default();
    let socket_volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "grpc-socket")
        .expect("the grpc-socket volume");
    assert!(
        socket_volume.empty_dir.is_some(),
        "the socket's volume is an emptyDir"
    );
    for c in &spec.containers {
        assert!(
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == "grpc-socket" && m.mount_path == "/var/run/ca-asg-provider"),
            "container {} mounts the socket directory",
            c.name
        );
    }
    let unix = cloud_config().await;
    assert!(
        unix.contains("unix:///var/run/ca-asg-provider/grpc.sock"),
        "CA's cloud-config names the socket:\n{unix}"
    );

    report.step("unix: helm test (check-config in the cluster)");
    helm_test_succeeds(&site.helm);

    report.step("unix: CA's loop reaches the provider through the socket");
    ca_reaches_the_provider(&pods, &site.node, &second).await;
    report.step("unix: another pending app pod; CA scales up through the socket");
    ca_scales_up_to(&site, &pods, &second, NODES as usize + 2).await;

    report.step("check: no error answered to CA; no container restarted");
    no_errors_no_restarts(&site, &pods, &second).await;
    report.step("done");
}

/// Where CA's own Helm chart is (`E2E_CA_CHART`: the directory of chart
/// `cluster-autoscaler`, e.g. `helm pull autoscaler/cluster-autoscaler --version 9.59.0
/// --untar`): no registry this suite reaches serves it.
const CA_CHART_ENV: &str = "E2E_CA_CHART";

/// Sidecar mode as docs/helm.md installs it (issue 45, 4): this chart in sidecar mode,
/// then CA's own chart with `deploy/chart/examples/cluster-autoscaler-values.yaml`,
/// changed only where the example says to override it (the cluster's name, CA's and
/// the provider's images) and where the suite differs from EKS (moto's credentials, the
/// node to run on, CA's scan and unneeded times). The provider runs as a native sidecar
/// in CA's pod, on the socket both mount; CA's loop reaches it and scales the group up
/// for a pending pod. For each binary of `E2E_CA_BINS`; skipped without it or without
/// `E2E_CA_CHART`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sidecar_in_cas_own_chart_scales_up_over_the_socket() {
    let scenario = "chart install: sidecar in CA's own chart, over the Unix socket";
    let Some((bin, images, helm_bin)) = install_needs(scenario) else {
        return;
    };
    let Some(cas) = real_cas(scenario) else {
        return;
    };
    let Some(ca_chart) = std::env::var_os(CA_CHART_ENV).map(std::path::PathBuf::from) else {
        return eprintln!(
            "{scenario}: skipped ({CA_CHART_ENV} is not set: the directory of CA's chart cluster-autoscaler)"
        );
    };
    assert!(
        ca_chart.join("Chart.yaml").is_file(),
        "{CA_CHART_ENV}={}: no Chart.yaml there",
        ca_chart.display()
    );
    for ca in &cas {
        sidecar_with(scenario, &bin, &images, helm_bin.clone(), ca, &ca_chart).await;
    }
}

async fn sidecar_with(
    scenario: &str,
    bin: &control_plane::Binaries,
    images: &std::path::Path,
    helm_bin: std::path::PathBuf,
    ca: &real_ca::CaBinary,
    ca_chart: &std::path::Path,
) {
    let _one_at_a_time = SERIAL.lock().await;
    let (report, site, ca_ref) =
        ca_site(scenario, "from CA's chart", bin, images, helm_bin, ca).await;

    report.step("helm install of this chart, sidecar mode (docs/helm.md)");
    let ours = json!({
        "mode": "sidecar",
        "clusterName": CLUSTER,
        "config": {"refreshInterval": "10s", "aws": {"region": "us-east-1", "endpoint": site.moto.url}},
    });
    let ours_file = values_file(site.work.path(), "values-sidecar.yaml", &ours);
    helm_values(&site.helm, "install", RELEASE, site.chart, &ours_file);

    report.step("helm install of CA's chart with the example values");
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/chart/examples/cluster-autoscaler-values.yaml"
    );
    let mut theirs: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(example).unwrap())
            .unwrap_or_else(|e| panic!("{example}: {e}"));
    // What the example says to override (--set in its header).
    theirs["autoDiscovery"]["clusterName"] = json!(CLUSTER);
    theirs["image"] = image_values(&ca_ref);
    let sidecar = &mut theirs["initContainers"][0];
    sidecar["image"] = json!(site.image_ref);
    // Where the suite is not EKS: images imported, not pulled; moto's credentials
    // instead of the ServiceAccount's role; the one real node.
    sidecar["imagePullPolicy"] = json!("Never");
    for (k, v) in [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
    ] {
        sidecar["env"]
            .as_array_mut()
            .expect("the example's sidecar env")
            .push(json!({"name": k, "value": v}));
    }
    theirs["nodeSelector"] = json!({"kubernetes.io/hostname": SYSTEM_NODE});
    // The scenario's node count stays its own: CA only scales up here.
    theirs["extraArgs"]["scan-interval"] = json!("5s");
    theirs["extraArgs"]["scale-down-unneeded-time"] = json!("1h");
    let theirs_file = values_file(site.work.path(), "values-cluster-autoscaler.yaml", &theirs);
    helm_values(
        &site.helm,
        "install",
        "cluster-autoscaler",
        &ca_chart.display().to_string(),
        &theirs_file,
    );

    report.step("CA's pod Ready: the provider a sidecar, no gRPC port, the socket shared");
    let pods: Api<Pod> = Api::namespaced(site.admin.clone(), NS);
    let ca_pods = "app.kubernetes.io/name=cluster-autoscaler";
    let pod = wait_or_diagnose(&pods, &site.node, 180, 500, async || {
        let ps = labelled(&pods, ca_pods).await;
        ps.values()
            .find(|p| ready(p))
            .cloned()
            .ok_or_else(|| "CA's pod was not Ready within 180 s".to_string())
    })
    .await;
    let spec = pod.spec.clone().unwrap_or_default();
    let all: Vec<_> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    assert!(
        !all.iter()
            .flat_map(|c| c.ports.iter().flatten())
            .any(|p| p.container_port == 8086),
        "a gRPC port is on CA's pod"
    );
    for c in &all {
        assert!(
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path == "/var/run/ca-asg-provider"),
            "container {} does not mount the socket directory",
            c.name
        );
    }

    report.step("CA's loop reaches the provider through the socket");
    ca_reaches_the_provider(&pods, &site.node, &pod).await;
    report.step("a pending app pod; CA scales the group up through the provider");
    ca_scales_up_to(&site, &pods, &pod, NODES as usize + 1).await;

    report.step("check: no error answered to CA; no container restarted");
    no_errors_no_restarts(&site, &pods, &pod).await;
    report.step("done");
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
    rig::ca_deletes(u.ca, &[(gnode.clone(), giid.clone())]).await;
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
    wait_or_diagnose(u.pods, u.node, 60, 500, async || match refused(u.cp) {
        0 => Err(
            "the budget never refused the drain's eviction of shop/guarded within 60 s".to_string(),
        ),
        _ => Ok(()),
    })
    .await;

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
    let holder = wait_or_diagnose(u.pods, u.node, 180, 500, async || {
        let ps = service_pods(u.pods).await;
        let rolled =
            ps.len() == 2 && ps.values().all(ready) && ps.keys().all(|p| !before.contains(p));
        let holder = lease_holder(u.leases).await;
        match holder {
            Some(h) if rolled && ps.contains_key(&h) => Ok(h),
            _ => Err(format!(
                "the upgrade did not end with two new Ready pods, one holding the Lease, within 180 s (holder {holder:?})"
            )),
        }
    })
    .await;
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
    wait_or_diagnose(u.pods, u.node, 120, 200, async || {
        match u.kubelet.instances_ended().contains(&giid) {
            true => Ok(()),
            false => Err(format!(
                "the instance {giid} did not end within 120 s after the budget let go"
            )),
        }
    })
    .await;
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
    let target = rig::ca_target(&mut ca).await;
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

/// The release pipeline, run for real (issue 61, 1; docs/release.md): `scripts/release.sh`
/// builds the images (amd64 from the debug binary the suite built, arm64 cross-compiled
/// with the dev profile: CI's cheaper run of the same script), pushes them, the index, the
/// SBOMs and the chart to a registry on loopback, and signs with a key made here. Then:
/// cosign verifies the index's signature with that key and refuses another key; the
/// image's SBOM is attached, signed, and names the binary's SHA-256, the Debian packages
/// and the crates; the chart is installed from the registry by digest, the real node's
/// containerd pulls the image by the index's digest, and a CA scale-in is drained (the
/// instance ends after its pods are evicted).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn release_pushed_signed_then_installed_by_digest_drains_a_ca_scale_in() {
    let scenario = "release: scripts/release.sh to a registry, verified, installed by digest";
    let Some((bin, images, helm_bin)) = install_needs(scenario) else {
        return;
    };
    if std::process::Command::new("go")
        .arg("version")
        .output()
        .is_err()
    {
        return skip_or_fail(
            scenario,
            "no go (scripts/release.sh builds crane and cosign with it)",
        );
    }
    let _one_at_a_time = SERIAL.lock().await;
    let report = Report::new(
        scenario,
        "the chart and image from the registry; CA's calls by the suite's client over mTLS",
        &bin.version,
    );
    let work = tempfile::Builder::new()
        .prefix("ca-asg-e2e-release-")
        .tempdir()
        .unwrap();

    report.step("crane and cosign (scripts/release.sh --tools)");
    let tools = release::Tools::build().unwrap_or_else(|e| panic!("{e:#}"));
    report.step("a registry on loopback (crane registry serve)");
    let registry = release::Registry::start(&tools.crane, &work.path().join("registry.log"))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    report.step("the release's cosign key pair, and another");
    let (key, public) = tools
        .key_pair(work.path(), "release")
        .unwrap_or_else(|e| panic!("{e:#}"));
    let (_, other) = tools
        .key_pair(work.path(), "other")
        .unwrap_or_else(|e| panic!("{e:#}"));

    report.step("scripts/release.sh to the registry");
    let arches = std::env::var("E2E_RELEASE_ARCHES").unwrap_or_else(|_| "amd64,arm64".into());
    let prefix = format!("{}/e2e", registry.host);
    let result = release::run_release(
        &[
            "--registry",
            &prefix,
            "--plain-http",
            "--key",
            &key.display().to_string(),
            "--allow-dirty",
            "--profile",
            "dev",
            "--arch",
            &arches,
            "--binary",
            &format!("amd64={}", env!("CARGO_BIN_EXE_ca-asg-provider")),
        ],
        &work.path().join("result.json"),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("e2e: release result: {result:#}");
    let text = |v: &serde_json::Value| v.as_str().expect("a string in the result").to_string();
    let repo = text(&result["image"]["repository"]);
    let index = text(&result["image"]["ref"]);
    let index_digest = text(&result["image"]["digest"]);
    assert_eq!(repo, format!("{prefix}/ca-asg-provider"));

    report.step("the build's own tag (version and revision), and no second push over it");
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    let revision = format!(
        "{}{}",
        git(&["rev-parse", "--short=12", "HEAD"]),
        if dirty { "-dirty" } else { "" }
    );
    assert_eq!(
        text(&result["image"]["tag"]),
        format!("{}-{revision}", env!("CARGO_PKG_VERSION")),
        "the image's tag is the version and the revision"
    );
    assert!(
        text(&result["chart"]["version"]).ends_with(&format!("+{revision}")),
        "the chart's version carries the revision: {}",
        result["chart"]["version"]
    );
    let again = std::process::Command::new(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/release.sh"),
    )
    .current_dir(env!("CARGO_MANIFEST_DIR"))
    .args([
        "--registry",
        &prefix,
        "--plain-http",
        "--key",
        &key.display().to_string(),
        "--allow-dirty",
        "--arch",
        &arches,
        "--result",
    ])
    .arg(work.path().join("again.json"))
    .output()
    .unwrap();
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success()
            && said.contains("exists already")
            && said.contains(&text(&result["image"]["tag"])),
        "a second release of the same build was not refused: {said}"
    );
    assert!(!work.path().join("again.json").exists());
    let platforms = result["platforms"].as_object().expect("platforms");
    assert_eq!(
        platforms.keys().cloned().collect::<Vec<_>>().join(","),
        arches,
        "one image per architecture asked for"
    );

    report.step("the index lists each architecture's image by digest");
    let manifest: serde_json::Value =
        serde_json::from_str(&tools_crane(&tools, &["manifest", "--insecure", &index])).unwrap();
    for (arch, p) in platforms {
        let digest = text(&p["digest"]);
        assert!(
            manifest["manifests"].as_array().unwrap().iter().any(|m| {
                m["digest"] == digest.as_str() && m["platform"]["architecture"] == arch.as_str()
            }),
            "the index has no {arch} image {digest}:\n{manifest:#}"
        );
    }

    report.step("cosign verifies the index's signature with the release's key");
    let http = ["--allow-http-registry", "--allow-insecure-registry"];
    let verify = |key: &std::path::Path, what: &str| {
        let key = key.display().to_string();
        let mut args = vec!["verify", "--key", key.as_str(), "--insecure-ignore-tlog"];
        args.extend(http);
        args.push(what);
        tools.cosign(&args)
    };
    let verified = verify(&public, &index).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        verified.contains(&index_digest),
        "cosign verify's claims do not name {index_digest}:\n{verified}"
    );
    report.step("and refuses it with another key");
    let refused = verify(&other, &index);
    assert!(
        refused.is_err(),
        "cosign verify accepted another key's check: {refused:?}"
    );

    report.step("each image's SBOM is attached, signed by the release's key");
    for (arch, p) in platforms {
        let image = text(&p["ref"]);
        let public = public.display().to_string();
        let mut args = vec![
            "verify-attestation",
            "--key",
            public.as_str(),
            "--insecure-ignore-tlog",
            "--type",
            "spdxjson",
        ];
        args.extend(http);
        args.push(&image);
        let out = tools.cosign(&args).unwrap_or_else(|e| panic!("{e:#}"));
        let statements = release::statements(&out).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(statements.len(), 1, "one SBOM attestation on {image}");
        let sbom = &statements[0]["predicate"];
        let packages = sbom["packages"].as_array().expect("SPDX packages");
        let named = |n: &str| packages.iter().any(|p| p["name"] == n);
        for n in [
            "libc6",
            "libgcc-s1",
            "ca-certificates",
            "ca-asg-provider",
            "tokio",
        ] {
            assert!(named(n), "{arch}'s SBOM does not name {n}");
        }
        let binary_sum = text(&p["binary_sha256"]);
        assert!(
            packages.iter().any(|p| {
                p["name"] == "/usr/local/bin/ca-asg-provider"
                    && format!(
                        "sha256:{}",
                        p["checksums"][0]["checksumValue"].as_str().unwrap_or("")
                    ) == binary_sum
            }),
            "{arch}'s SBOM does not carry the binary's {binary_sum}"
        );
        assert_eq!(
            statements[0]["subject"][0]["digest"]["sha256"],
            text(&p["digest"]).trim_start_matches("sha256:"),
            "the attestation is about the {arch} image"
        );
    }

    let Site {
        work: _site_work,
        image_ref: _,
        cp,
        admin,
        route: _route,
        node,
        moto,
        asg: _asg,
        kubelet,
        helm,
        chart: _,
    } = Site::start_with(&report, &bin, &images, helm_bin, false).await;
    report.step("the node's containerd may pull from the loopback registry (hosts.toml)");
    node.trust_registry(&registry.host)
        .unwrap_or_else(|e| panic!("{e:#}"));

    report.step("the Secrets the chart leaves to the user: mTLS certificates");
    let certs = mtls_secrets(&admin, true).await;

    report.step("helm install of the chart from the registry, by digest");
    let values = standalone_values(
        &moto.url,
        json!({
            "replicas": 1,
            "image": {"repository": repo, "digest": index_digest},
            "config": {"scaleIn": evict_last()},
        }),
    );
    let file = values_file(work.path(), "values.yaml", &values);
    let chart = &result["chart"];
    install_released_chart(
        &Scripts::new(work.path(), &helm),
        &text(&chart["repository"]),
        &text(&chart["digest"]),
        std::path::Path::new(&file),
    )
    .await;

    report.step("the pod runs the image containerd pulled by the index's digest");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let pod = wait_or_diagnose(&pods, &node, 180, 500, async || {
        let ps = service_pods(&pods).await;
        ps.values()
            .find(|p| ready(p))
            .cloned()
            .ok_or_else(|| "the service's pod was not Ready within 180 s".to_string())
    })
    .await;
    let spec_image = pod.spec.as_ref().unwrap().containers[0]
        .image
        .clone()
        .unwrap_or_default();
    assert!(
        spec_image.starts_with(&repo) && spec_image.ends_with(&format!("@{index_digest}")),
        "the pod's image {spec_image} is not the release's {repo}@{index_digest}"
    );
    let status = pod.status.clone().unwrap_or_default();
    let container = &status.container_statuses.unwrap_or_default()[0];
    assert!(
        container.image_id.ends_with(&index_digest),
        "the image containerd ran is {}, not the index {index_digest}",
        container.image_id
    );

    report.step("CA: NodeGroupDeleteNodes of an occupied node, drained by the release");
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let mut ca = connect_ca(&certs, &pod_name, &pod).await;
    ca.refresh(proto::RefreshRequest {}).await.expect("Refresh");
    let victims = ca_scales_in_occupied_nodes(
        &report,
        "CA: NodeGroupDeleteNodes of an occupied node",
        (&admin, &kubelet, &mut ca),
        1,
        (&pods, &node),
    )
    .await;
    report.step("check: the app pod was evicted by the chart's ServiceAccount before the end");
    let drained: Vec<String> = victims.iter().map(|(n, _)| n.clone()).collect();
    let evicted = checks::evictions_only_as(
        SERVICE_ACCOUNT_USER,
        &cp.audit(),
        &kubelet.stops(),
        &drained,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        evicted >= 1,
        "the chart's ServiceAccount evicted {evicted} pods; the app pod at least"
    );
    report.step("done");
    drop(node);
    drop(registry);
}

/// CA's scale-in of `count` nodes that run an app pod: NodeGroupDeleteNodes as CA sends
/// it (node name, providerID, hostname label, CA's 5 s deadline), then the wait, up to
/// 180 s, until their instances ended (timed in the report). The victims, (node,
/// instance); a failure shows the pods and the node.
async fn ca_scales_in_occupied_nodes(
    report: &Report,
    what: &str,
    (admin, kubelet, ca): (
        &kube::Client,
        &FakeKubelet,
        &mut CloudProviderClient<tonic::transport::Channel>,
    ),
    count: usize,
    (pods, node): (&Api<Pod>, &RealNode),
) -> Vec<(String, String)> {
    let victims: Vec<(String, String)> = rig::occupied(admin, kubelet)
        .await
        .into_iter()
        .take(count)
        .collect();
    assert_eq!(victims.len(), count, "{count} node(s) running an app pod");
    report.scale_in_begins(what);
    rig::ca_deletes(ca, &victims).await;

    report.step("wait for the instances to end (the leader's drain)");
    let started = Instant::now();
    wait_or_diagnose(pods, node, 180, 200, async || {
        let ended = kubelet.instances_ended();
        if victims.iter().all(|(_, i)| ended.contains(i)) {
            return Ok(());
        }
        Err(format!(
            "the instances {victims:?} did not end within 180 s (ended: {ended:?})"
        ))
    })
    .await;
    *report.scale_in_secs.lock() = Some(started.elapsed().as_secs_f64());
    victims
}

/// `crane ARGS`'s stdout (panics with crane's words when it fails).
fn tools_crane(tools: &release::Tools, args: &[&str]) -> String {
    let out = std::process::Command::new(&tools.crane)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run crane: {e}"));
    assert!(
        out.status.success(),
        "crane {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The install step of the release scenario: the quickstart's own `install.sh` (as
/// docs/quickstart-eks.md shows it), with the chart `repository` (`oci://...`) pinned
/// by its `digest` on the loopback registry, which speaks plain HTTP.
async fn install_released_chart(
    scripts: &Scripts,
    repository: &str,
    digest: &str,
    values: &std::path::Path,
) {
    let (ok, out) = scripts
        .output(
            "install.sh",
            &[
                ("CHART", format!("{repository}@{digest}")),
                ("VALUES", values.display().to_string()),
                ("NAMESPACE", NS.to_string()),
                ("RELEASE", RELEASE.to_string()),
                ("TIMEOUT", "3m".to_string()),
            ],
            &["--plain-http"],
        )
        .await;
    assert!(
        ok,
        "deploy/quickstart/install.sh of the released chart failed:\n{out}"
    );
}
