//! cluster-autoscaler's permissions, proven on the real API server: every CA role this
//! project ships, rendered as a user renders it, applied to a real kube-apiserver and
//! bound to the ServiceAccount it names; then, for every CA version of
//! `tests/e2e/ca_permissions.rs` (read from CA's source at its tag), every permission
//! that version needs is asked of the API server as that ServiceAccount: a
//! SubjectAccessReview for each, and for each informer an impersonated list and watch
//! (which also proves the API server serves the resource where CA looks for it).
//!
//! The shipped roles: `kubectl kustomize deploy/cluster-autoscaler` (both overlays use
//! it), the chart's bundled mode (`helm template` with `deploy/chart/ci/bundled-values.yaml`),
//! and the same with CA's Lease and status ConfigMap renamed through
//! `clusterAutoscaler.flags` (the Role must follow the flags CA reads). Only CA's roles
//! are applied: they must stand alone, whatever else shares the ServiceAccount.
//!
//! A control role (deploy/cluster-autoscaler's without its `resource.k8s.io` rule) must
//! fail exactly for the versions that need `resource.k8s.io`: the check can fail.
//!
//! Without `E2E_K8S_BIN` it says it was skipped (and fails when `E2E_REQUIRED=1`).

#[path = "e2e/ca_permissions.rs"]
mod ca_permissions;
#[path = "e2e/control_plane.rs"]
mod control_plane;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use anyhow::{bail, Context};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use serde_json::Value;

use ca_permissions::{CaVersion, Perm, Scope, VERSIONS};
use control_plane::{Binaries, ControlPlane, Who};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn binaries(test: &str) -> Option<Binaries> {
    match Binaries::from_env() {
        Some(b) => Some(b),
        None if std::env::var("E2E_REQUIRED").as_deref() == Ok("1") => {
            panic!(
                "{test}: E2E_REQUIRED=1 but E2E_K8S_BIN/E2E_ETCD are not set (run scripts/e2e.sh)"
            )
        }
        None => {
            eprintln!("{test}: skipped (no real control plane: run scripts/e2e.sh)");
            None
        }
    }
}

/// One CA role as shipped: CA's ClusterRole and Role of one render, their bindings, the
/// ServiceAccount they bind and the names CA's flags give its Lease and status ConfigMap.
struct Shipped {
    /// How it was rendered, for the failure message.
    name: String,
    docs: Vec<Value>,
    /// "ClusterRole/x + Role/ns/y, bound to ServiceAccount ns/sa".
    roles: String,
    sa_namespace: String,
    sa_name: String,
    /// CA's `--namespace`, `--leader-elect-resource-name`, `--status-config-map-name`.
    ca_namespace: String,
    lease: String,
    status: String,
}

impl Shipped {
    /// CA's roles of one render, with the names from CA's container in it (when the
    /// render has one; CA's defaults otherwise).
    fn from_render(name: &str, rendered: &str) -> anyhow::Result<Shipped> {
        let all: Vec<Value> = serde_saphyr::from_multiple(rendered)
            .with_context(|| format!("{name}: the render is not YAML"))?;
        let all: Vec<Value> = all.into_iter().filter(|d| !d.is_null()).collect();
        let kind = |d: &Value| d["kind"].as_str().unwrap_or_default().to_string();
        let meta_name = |d: &Value| {
            d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        let is_ca = |n: &str| n == "cluster-autoscaler" || n.ends_with("-cluster-autoscaler");
        let roles: Vec<&Value> = all
            .iter()
            .filter(|d| matches!(kind(d).as_str(), "ClusterRole" | "Role") && is_ca(&meta_name(d)))
            .collect();
        let role_names: BTreeSet<(String, String)> =
            roles.iter().map(|d| (kind(d), meta_name(d))).collect();
        let bindings: Vec<&Value> = all
            .iter()
            .filter(|d| {
                matches!(kind(d).as_str(), "ClusterRoleBinding" | "RoleBinding")
                    && role_names.contains(&(
                        d["roleRef"]["kind"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        d["roleRef"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    ))
            })
            .collect();
        let count = |k: &str, of: &[&Value]| of.iter().filter(|d| kind(d) == k).count();
        if count("ClusterRole", &roles) != 1
            || count("Role", &roles) != 1
            || count("ClusterRoleBinding", &bindings) != 1
            || count("RoleBinding", &bindings) != 1
        {
            bail!(
                "{name}: expected CA's ClusterRole and Role and one binding of each, found {:?}",
                roles
                    .iter()
                    .chain(&bindings)
                    .map(|d| format!("{}/{}", kind(d), meta_name(d)))
                    .collect::<Vec<_>>()
            );
        }
        let mut subjects = BTreeSet::new();
        for b in &bindings {
            for s in b["subjects"].as_array().into_iter().flatten() {
                subjects.insert((
                    s["kind"].as_str().unwrap_or_default().to_string(),
                    s["namespace"].as_str().unwrap_or_default().to_string(),
                    s["name"].as_str().unwrap_or_default().to_string(),
                ));
            }
        }
        let [(sa_kind, sa_namespace, sa_name)]: [(String, String, String); 1] = subjects
            .into_iter()
            .collect::<Vec<_>>()
            .try_into()
            .map_err(|s| {
                anyhow::anyhow!("{name}: CA's bindings must name one ServiceAccount, name {s:?}")
            })?;
        if sa_kind != "ServiceAccount" {
            bail!("{name}: CA's bindings name a {sa_kind}, not a ServiceAccount");
        }
        // CA's flags, as CA reads them, from its container in the render.
        let mut flags = BTreeMap::new();
        for d in all.iter().filter(|d| kind(d) == "Deployment") {
            for c in d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if c["name"] != "cluster-autoscaler" {
                    continue;
                }
                for a in ["command", "args"]
                    .iter()
                    .flat_map(|k| c[*k].as_array().into_iter().flatten())
                    .filter_map(|a| a.as_str())
                {
                    if let Some((k, v)) = a.trim_start_matches('-').split_once('=') {
                        flags.insert(k.to_string(), v.to_string());
                    }
                }
            }
        }
        let flag = |k: &str, default: &str| flags.get(k).cloned().unwrap_or_else(|| default.into());
        let role = roles
            .iter()
            .find(|d| kind(d) == "Role")
            .expect("counted above");
        let roles_text = format!(
            "{} + Role/{}/{}, bound to ServiceAccount {sa_namespace}/{sa_name}",
            roles
                .iter()
                .filter(|d| kind(d) == "ClusterRole")
                .map(|d| format!("ClusterRole/{}", meta_name(d)))
                .collect::<String>(),
            role["metadata"]["namespace"].as_str().unwrap_or("?"),
            meta_name(role),
        );
        Ok(Shipped {
            name: name.to_string(),
            docs: roles.into_iter().chain(bindings).cloned().collect(),
            roles: roles_text,
            sa_namespace,
            sa_name,
            ca_namespace: flag("namespace", ca_permissions::DEFAULT_NAMESPACE),
            lease: flag("leader-elect-resource-name", ca_permissions::DEFAULT_LEASE),
            status: flag(
                "status-config-map-name",
                ca_permissions::DEFAULT_STATUS_CONFIG_MAP,
            ),
        })
    }

    fn user(&self) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.sa_namespace, self.sa_name
        )
    }

    fn groups(&self) -> Vec<String> {
        vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{}", self.sa_namespace),
            "system:authenticated".into(),
        ]
    }

    /// Where a permission is asked: (namespace, name).
    fn place(&self, p: &Perm) -> (Option<String>, Option<String>) {
        match p.scope {
            Scope::Cluster => (None, None),
            Scope::CaNamespace => (Some(self.ca_namespace.clone()), None),
            Scope::Lease => (Some(self.ca_namespace.clone()), Some(self.lease.clone())),
            Scope::StatusConfigMap => (Some(self.ca_namespace.clone()), Some(self.status.clone())),
        }
    }
}

fn run(what: &str, cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("{what}: cannot run {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn kustomize(dir: &str) -> anyhow::Result<String> {
    run(
        &format!("kubectl kustomize {dir}"),
        Command::new("kubectl")
            .arg("kustomize")
            .arg(root().join(dir)),
    )
}

/// `helm template` of the chart in bundled mode, as tests/deploy/validate.py renders it
/// (release ca-asg-provider in kube-system, deploy/chart/ci/bundled-values.yaml), with
/// `sets` on top.
fn helm_bundled(release: &str, sets: &[&str], home: &Path) -> anyhow::Result<String> {
    let helm = root().join(".venv/bin/helm");
    if !helm.exists() {
        bail!("{} is missing: scripts/test.sh installs it", helm.display());
    }
    let mut cmd = Command::new(helm);
    cmd.args(["template", release])
        .arg(root().join("deploy/chart"))
        .args(["-n", "kube-system", "-f"])
        .arg(root().join("deploy/chart/ci/bundled-values.yaml"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    for s in sets {
        cmd.args(["--set-string", s]);
    }
    run(&format!("helm template deploy/chart {sets:?}"), &mut cmd)
}

/// Creates the documents (roles and bindings) as they were rendered.
async fn apply(admin: &kube::Client, docs: &[Value]) -> anyhow::Result<()> {
    for d in docs {
        let what = format!("{}/{}", d["kind"], d["metadata"]["name"]);
        control_plane::create_rbac(admin, d)
            .await
            .with_context(|| format!("create {what}"))?;
    }
    Ok(())
}

/// The API server's answer for one permission of one shipped role.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    /// SubjectAccessReview: allowed.
    reviewed: bool,
    /// For an informer's list or watch: the HTTP status of the same call, impersonated.
    call: Option<u16>,
}

impl Answer {
    fn granted(&self) -> bool {
        self.reviewed && self.call.is_none_or(|c| c == 200)
    }

    fn why(&self) -> String {
        let mut s = format!(
            "SubjectAccessReview {}",
            if self.reviewed { "allowed" } else { "denied" }
        );
        if let Some(c) = self.call {
            s += &format!(", the impersonated call answered {c}");
            if c == 404 {
                s += " (the API server does not serve this resource there)";
            }
        }
        s
    }
}

async fn review(admin: &kube::Client, who: &Shipped, p: &Perm) -> anyhow::Result<bool> {
    let (namespace, name) = who.place(p);
    let sar = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(who.user()),
            groups: Some(who.groups()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(p.verb.into()),
                group: Some(p.res.group.into()),
                version: Some(p.res.version.into()),
                resource: Some(p.res.resource.into()),
                subresource: (!p.subresource.is_empty()).then(|| p.subresource.into()),
                namespace,
                name,
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let got = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &sar)
        .await
        .context("SubjectAccessReview")?;
    Ok(got.status.is_some_and(|s| s.allowed))
}

/// An informer's list (`limit=1`) or watch (`timeoutSeconds=1`), as the ServiceAccount
/// (impersonated by the admin): the status line only.
async fn call_as(admin: &kube::Client, who: &Shipped, p: &Perm) -> anyhow::Result<u16> {
    let base = if p.res.group.is_empty() {
        format!("/api/{}/{}", p.res.version, p.res.resource)
    } else {
        format!("/apis/{}/{}/{}", p.res.group, p.res.version, p.res.resource)
    };
    let uri = match p.verb {
        "list" => format!("{base}?limit=1"),
        "watch" => format!("{base}?watch=true&timeoutSeconds=1"),
        other => bail!("no call for verb {other}"),
    };
    let mut req = http::Request::get(&uri).header("Impersonate-User", who.user());
    for g in who.groups() {
        req = req.header("Impersonate-Group", g);
    }
    let res = admin
        .send(req.body(kube::client::Body::from(Vec::new()))?)
        .await
        .with_context(|| format!("GET {uri}"))?;
    Ok(res.status().as_u16())
}

async fn ask(admin: &kube::Client, who: &Shipped, p: &Perm) -> anyhow::Result<Answer> {
    let reviewed = review(admin, who, p).await?;
    let call = if p.scope == Scope::Cluster
        && p.subresource.is_empty()
        && matches!(p.verb, "list" | "watch")
    {
        Some(call_as(admin, who, p).await?)
    } else {
        None
    };
    Ok(Answer { reviewed, call })
}

/// Every permission any version needs, asked once; the permissions not granted are
/// asked again until `settle` passes (RBAC reaches the authorizer through its own
/// informers, a moment after the create).
async fn answers(
    admin: &kube::Client,
    who: &Shipped,
    all: &BTreeSet<Perm>,
    settle: Duration,
) -> anyhow::Result<BTreeMap<Perm, Answer>> {
    let mut out = BTreeMap::new();
    for p in all {
        out.insert(*p, ask(admin, who, p).await?);
    }
    let deadline = Instant::now() + settle;
    while Instant::now() < deadline && out.values().any(|a| !a.granted()) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        for (p, a) in out.iter_mut().filter(|(_, a)| !a.granted()) {
            *a = ask(admin, who, p).await?;
        }
    }
    Ok(out)
}

/// Waits until the API server authorizes what every CA role here grants whatever its
/// names (a cluster-wide list of nodes, a Lease create in CA's namespace): the roles and
/// bindings have reached the authorizer.
async fn wait_bound(admin: &kube::Client, who: &Shipped) -> anyhow::Result<()> {
    let probes = [
        Perm {
            verb: "list",
            res: ca_permissions::NODES,
            subresource: "",
            scope: Scope::Cluster,
        },
        Perm {
            verb: "create",
            res: ca_permissions::LEASES,
            subresource: "",
            scope: Scope::CaNamespace,
        },
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut all = true;
        for p in &probes {
            all &= review(admin, who, p).await?;
        }
        if all {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{}: the API server never authorized {probes:?} for {}",
                who.name,
                who.user()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The grants of the rendered rules no version needs (verb, group, resource), for the
/// report: least privilege, read by a person.
fn unneeded(who: &Shipped, needed: &BTreeSet<Perm>) -> Vec<String> {
    let need: BTreeSet<(String, String, String)> = needed
        .iter()
        .map(|p| {
            let r = if p.subresource.is_empty() {
                p.res.resource.to_string()
            } else {
                format!("{}/{}", p.res.resource, p.subresource)
            };
            (p.verb.to_string(), p.res.group.to_string(), r)
        })
        .collect();
    let mut out = BTreeSet::new();
    for d in &who.docs {
        for rule in d["rules"].as_array().into_iter().flatten() {
            let list = |k: &str| -> Vec<String> {
                rule[k]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            };
            let names = list("resourceNames");
            for v in list("verbs") {
                for g in list("apiGroups") {
                    for r in list("resources") {
                        if !need.contains(&(v.clone(), g.clone(), r.clone())) {
                            let g = if g.is_empty() {
                                "core".into()
                            } else {
                                g.clone()
                            };
                            let n = if names.is_empty() {
                                String::new()
                            } else {
                                format!(" {names:?}")
                            };
                            out.insert(format!("{v} {g}/{r}{n}"));
                        }
                    }
                }
            }
        }
    }
    out.into_iter().collect()
}

/// The shipped role without its `resource.k8s.io` rule (what this project shipped
/// before CA 1.35's needs were added), bound to a ServiceAccount of its own.
fn control(from: &Shipped) -> Shipped {
    let sa = "e2e-ca-rbac-control";
    let docs = from
        .docs
        .iter()
        .map(|d| {
            let mut d = d.clone();
            let kind = d["kind"].as_str().unwrap_or_default().to_string();
            d["metadata"]["name"] = Value::from(format!("{sa}-{}", kind.to_lowercase()));
            if let Some(rules) = d["rules"].as_array_mut() {
                rules.retain(|r| {
                    !r["apiGroups"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|g| g == "resource.k8s.io")
                });
            }
            if let Some(role_ref) = d.get_mut("roleRef") {
                let k = role_ref["kind"].as_str().unwrap_or_default().to_lowercase();
                role_ref["name"] = Value::from(format!("{sa}-{k}"));
                d["subjects"] = serde_json::json!([{
                    "kind": "ServiceAccount", "name": sa, "namespace": from.sa_namespace
                }]);
            }
            d
        })
        .collect();
    Shipped {
        name: format!("control: {} without its resource.k8s.io rule", from.name),
        docs,
        roles: format!("{sa}'s copy of {}", from.roles),
        sa_namespace: from.sa_namespace.clone(),
        sa_name: sa.into(),
        ca_namespace: from.ca_namespace.clone(),
        lease: from.lease.clone(),
        status: from.status.clone(),
    }
}

/// What a version needs that a role does not grant, each with why and where CA needs it.
fn missing(version: &CaVersion, got: &BTreeMap<Perm, Answer>) -> Vec<(Perm, String, Vec<String>)> {
    version
        .needs()
        .into_iter()
        .filter_map(|(p, from)| {
            let a = &got[&p];
            (!a.granted()).then(|| (p, a.why(), from))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shipped_ca_role_grants_what_each_ca_version_needs() {
    const TEST: &str = "every_shipped_ca_role_grants_what_each_ca_version_needs";
    let Some(bin) = binaries(TEST) else {
        return;
    };
    let started = Instant::now();
    let home = tempfile::tempdir().unwrap();
    let kustomized = kustomize("deploy/cluster-autoscaler").unwrap();
    let shipped = vec![
        Shipped::from_render("deploy/cluster-autoscaler (kubectl kustomize)", &kustomized).unwrap(),
        Shipped::from_render(
            "deploy/chart, bundled mode (helm template, ci/bundled-values.yaml)",
            &helm_bundled("ca-asg-provider", &[], home.path()).unwrap(),
        )
        .unwrap(),
        Shipped::from_render(
            "deploy/chart, bundled mode, CA's Lease and status ConfigMap renamed by its flags",
            &helm_bundled(
                "renamed",
                &[
                    "clusterAutoscaler.flags.leader-elect-resource-name=e2e-ca-lease",
                    "clusterAutoscaler.flags.status-config-map-name=e2e-ca-status",
                ],
                home.path(),
            )
            .unwrap(),
        )
        .unwrap(),
    ];
    assert_eq!(
        (shipped[2].lease.as_str(), shipped[2].status.as_str()),
        ("e2e-ca-lease", "e2e-ca-status"),
        "the renamed render's CA container does not carry the flags it was given"
    );
    let control = control(&shipped[0]);

    let cp = ControlPlane::start_api_server(&bin).await.unwrap();
    let admin = cp.client(Who::Admin).await.unwrap();
    // The API server makes kube-system itself, a moment after it is ready.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while namespaces.get_opt("kube-system").await.unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "no kube-system namespace after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for s in shipped.iter().chain([&control]) {
        apply(&admin, &s.docs)
            .await
            .unwrap_or_else(|e| panic!("{}: {e:#}", s.name));
    }
    for s in shipped.iter().chain([&control]) {
        wait_bound(&admin, s).await.unwrap();
    }

    let all: BTreeSet<Perm> = VERSIONS
        .iter()
        .flat_map(|v| v.needs().into_keys())
        .collect();
    let mut failures = Vec::new();
    let mut table = Vec::new();
    for s in &shipped {
        let got = answers(&admin, s, &all, Duration::from_secs(3))
            .await
            .unwrap();
        for v in VERSIONS {
            let miss = missing(v, &got);
            table.push(format!(
                "  CA {:<7} {:>2} permissions  {:<4} {}",
                v.name,
                v.needs().len(),
                if miss.is_empty() { "ok" } else { "FAIL" },
                s.name
            ));
            for (p, why, from) in miss {
                failures.push(format!(
                    "CA {}: needs {p}, for {}\n    not granted by {}: {}\n    ({why})",
                    v.name,
                    from.join("; "),
                    s.name,
                    s.roles,
                ));
            }
        }
        let extra = unneeded(s, &all);
        if !extra.is_empty() {
            eprintln!(
                "{TEST}: {} grants what no version read needs (a flag may need it): {}",
                s.name,
                extra.join(", ")
            );
        }
    }

    // The control: it must fail for exactly the versions that need resource.k8s.io,
    // and for those exactly on resource.k8s.io.
    let got = answers(&admin, &control, &all, Duration::from_secs(1))
        .await
        .unwrap();
    for v in VERSIONS {
        let miss: BTreeSet<Perm> = missing(v, &got).into_iter().map(|(p, _, _)| p).collect();
        let want: BTreeSet<Perm> = v
            .needs()
            .into_keys()
            .filter(|p| p.res.group == "resource.k8s.io")
            .collect();
        table.push(format!(
            "  CA {:<7} control without resource.k8s.io: {} missing (expected {})",
            v.name,
            miss.len(),
            want.len()
        ));
        if miss != want {
            failures.push(format!(
                "the check cannot tell a role without resource.k8s.io for CA {}: missing {:?}, expected {:?}",
                v.name,
                miss.iter().map(ToString::to_string).collect::<Vec<_>>(),
                want.iter().map(ToString::to_string).collect::<Vec<_>>()
            ));
        }
    }

    eprintln!(
        "{TEST}: Kubernetes {}, {} permissions asked per role, {:.1} s\n{}",
        bin.version,
        all.len(),
        started.elapsed().as_secs_f64(),
        table.join("\n")
    );
    assert!(
        failures.is_empty(),
        "{} missing permission(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
