//! The RBAC in deploy/ against what the code really asked the API server for.

use std::path::Path;

use ca_asg_provider::sim::{Grant, RbacUse, SimCluster};
use serde::Deserialize;

/// The identity the engine's client uses in tests (its bearer token in the sim).
pub const ENGINE_USER: &str = "system:serviceaccount:kube-system:cluster-autoscaler";

/// A rule as written in RBAC YAML; checked through the sim's own [`Grant`].
#[derive(Debug, Deserialize)]
struct Rule {
    #[serde(rename = "apiGroups", default)]
    api_groups: Vec<String>,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
}

/// The rules of the ClusterRole/Role named `name` in a multi-document YAML file.
pub fn role_rules(file: &Path, name: &str) -> Vec<Grant> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut rules = Vec::new();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).expect("valid YAML");
    for v in docs {
        let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
        let this = v
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(|n| n.as_str());
        if (kind == "ClusterRole" || kind == "Role") && this == Some(name) {
            let r: Vec<Rule> = serde_json::from_value(v.get("rules").cloned().unwrap_or_default())
                .expect("rules parse");
            rules.extend(r.into_iter().map(|r| Grant {
                verbs: r.verbs,
                groups: r.api_groups,
                resources: r.resources,
            }));
        }
    }
    assert!(!rules.is_empty(), "no role {name} in {}", file.display());
    rules
}

/// The service's own ClusterRole, as deploy/base/rbac.yaml ships it.
pub fn service_role() -> Vec<Grant> {
    role_rules(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/base/rbac.yaml"),
        "ca-asg-provider",
    )
}

/// Fails naming what `used` needs that the service's own role does not grant.
pub fn assert_service_role_grants(used: &[RbacUse]) {
    let gaps = missing(&service_role(), used);
    assert!(gaps.is_empty(), "the service's role lacks {gaps:?}");
}

/// What `used` needs that `rules` do not grant.
pub fn missing(rules: &[Grant], used: &[RbacUse]) -> Vec<RbacUse> {
    used.iter()
        .filter(|u| {
            !rules
                .iter()
                .any(|r| r.allows(&u.verb, &u.group, &u.resource))
        })
        .cloned()
        .collect()
}

/// Fails when the engine used a verb/resource that deploy/base/rbac.yaml does not grant.
pub fn assert_rbac_covers(sim: &SimCluster) {
    let rules = service_role();
    let used = sim.requests().used_by(ENGINE_USER);
    assert!(
        !used.is_empty(),
        "the engine made no API request under {ENGINE_USER}"
    );
    // RBAC_REPORT=1 prints what each test used (to keep the role minimal).
    if std::env::var_os("RBAC_REPORT").is_some() {
        eprintln!("RBAC used: {used:?}");
    }
    let gaps = missing(&rules, &used);
    assert!(
        gaps.is_empty(),
        "deploy/base/rbac.yaml lacks what the code uses: {gaps:#?}"
    );
}

/// Fails unless every request the engine sent says who is calling: the User-Agent
/// `ca-asg-provider/<version> (lease)` for the Lease, `(drain)` for everything else,
/// so the API server's audit log (`userAgent`) tells them from cluster-autoscaler's.
pub fn assert_says_who_is_calling(sim: &SimCluster) {
    let sent = sim.requests().agents_of(ENGINE_USER);
    assert!(
        !sent.is_empty(),
        "the engine made no API request under {ENGINE_USER}"
    );
    let version = env!("CARGO_PKG_VERSION");
    let wrong: Vec<_> = sent
        .iter()
        .filter(|(agent, used)| {
            let component = if used.resource == "leases" {
                "lease"
            } else {
                "drain"
            };
            *agent != format!("ca-asg-provider/{version} ({component})")
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "requests without the service's User-Agent: {wrong:#?}"
    );
}
