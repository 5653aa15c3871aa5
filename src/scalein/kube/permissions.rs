//! The Kubernetes permissions the service needs, and a check of them with
//! SelfSubjectAccessReview (for `check-config`). deploy/base/rbac.yaml grants exactly
//! these; a test keeps the two equal, and the scale-in tests check that every request
//! the engine makes is among them.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

/// How the service's ClusterRole and Role come, both ways it is installed: what a
/// hint about a missing permission names.
pub const HOW_TO_GRANT: &str = "with Helm the chart creates them (rbac.create: true, the default); with the overlays apply deploy/base/rbac.yaml";

/// One permission: verb, API group, resource (or `resource/subresource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Permission {
    pub verb: &'static str,
    pub group: &'static str,
    pub resource: &'static str,
    /// What needs it, for the table `check-config` prints.
    pub why: &'static str,
}

const fn p(
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    why: &'static str,
) -> Permission {
    Permission {
        verb,
        group,
        resource,
        why,
    }
}

pub const REQUIRED: &[Permission] = &[
    p("get", "", "nodes", "cordon and mark the node"),
    p("list", "", "nodes", "node index (instance -> node, resume)"),
    p(
        "watch",
        "",
        "nodes",
        "node index (instance -> node, resume)",
    ),
    p(
        "patch",
        "",
        "nodes",
        "cordon, taint, drain markers, scale-down hold for CA",
    ),
    p(
        "patch",
        "",
        "nodes/status",
        "the drain's state as Node conditions (DrainInProgress, Drained)",
    ),
    p("get", "", "pods", "pod state while draining"),
    p("list", "", "pods", "pods on the draining node"),
    p("watch", "", "pods", "wait for pods to exit (no polling)"),
    p(
        "delete",
        "",
        "pods",
        "end what is left of the workloads at a proceed deadline, with their own grace",
    ),
    p(
        "create",
        "",
        "pods/eviction",
        "evict through the Eviction API (PDB-aware)",
    ),
    p(
        "get",
        "",
        "persistentvolumeclaims",
        "leave out of the volume wait the volumes of pods that stay on the node",
    ),
    p(
        "list",
        "policy",
        "poddisruptionbudgets",
        "find the budget that refused an eviction, and name overlapping budgets",
    ),
    p(
        "watch",
        "policy",
        "poddisruptionbudgets",
        "one cache of budgets for all drains running together",
    ),
    p(
        "list",
        "storage.k8s.io",
        "volumeattachments",
        "wait for volumes to detach",
    ),
    p(
        "watch",
        "storage.k8s.io",
        "volumeattachments",
        "wait for volumes to detach",
    ),
    p("create", "events.k8s.io", "events", "Events on the Node"),
    p("patch", "events.k8s.io", "events", "Events on the Node"),
    p("get", "coordination.k8s.io", "leases", "leader election"),
    p("create", "coordination.k8s.io", "leases", "leader election"),
    p("update", "coordination.k8s.io", "leases", "leader election"),
];

/// A permission and whether the API server says we have it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub permission: Permission,
    pub allowed: bool,
    /// The authorizer's reason, when it gave one.
    pub reason: String,
}

/// Asks the API server, with one SelfSubjectAccessReview per permission, whether the
/// identity of `client` holds each of [`REQUIRED`] (cluster-wide; leases in
/// `lease_namespace`).
pub async fn check(
    client: kube::Client,
    lease_namespace: &str,
    lease_name: &str,
) -> Result<Vec<Checked>, kube::Error> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client);
    let mut out = Vec::with_capacity(REQUIRED.len());
    for perm in REQUIRED {
        let (resource, subresource) = match perm.resource.split_once('/') {
            Some((r, s)) => (r, Some(s.to_string())),
            None => (perm.resource, None),
        };
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(perm.verb.into()),
                    group: Some(perm.group.into()),
                    resource: Some(resource.into()),
                    subresource,
                    namespace: (perm.resource == "leases").then(|| lease_namespace.to_string()),
                    // The Role grants get/update on its own Lease by name only.
                    name: (perm.resource == "leases" && perm.verb != "create")
                        .then(|| lease_name.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = api.create(&PostParams::default(), &review).await?;
        let status = answer.status.unwrap_or_default();
        out.push(Checked {
            permission: *perm,
            allowed: status.allowed,
            reason: status.reason.unwrap_or_default(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::REQUIRED;

    /// The quickstart's sample of check-config's output gives the count the command
    /// prints, in both its lines (it once said 19 in one and 18 in the other).
    #[test]
    fn the_quickstart_counts_the_permissions_the_check_asks_for() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/quickstart-eks.md"
        ))
        .expect("docs/quickstart-eks.md");
        let flat = doc.split_whitespace().collect::<Vec<_>>().join(" ");
        let n = REQUIRED.len();
        assert!(
            flat.contains(&format!("all {n} permissions held")),
            "the quickstart should show `all {n} permissions held`"
        );
        assert!(
            flat.contains(&format!("missing <n> of {n}:")),
            "the quickstart should show `missing <n> of {n}:`"
        );
    }
}
