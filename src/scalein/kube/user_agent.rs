//! Who is calling: every Kubernetes request of the service carries the User-Agent
//! `ca-asg-provider/<version> (<component>)`, so the API server's audit log (its
//! `userAgent` field) tells the service's evictions, patches and Lease renewals from
//! cluster-autoscaler's, even under the same ServiceAccount (sidecar and bundled mode).

use http::header::{HeaderValue, USER_AGENT};

/// The drains: cordons, marks, evictions, pod and Node reads, Events.
pub const DRAIN: &str = "drain";
/// Leader election: the Lease.
pub const LEASE: &str = "lease";
/// `check-config`: SelfSubjectAccessReviews and its reads.
pub const CHECK_CONFIG: &str = "check-config";
/// `status`: its reads of Nodes, pods and budgets.
pub const STATUS: &str = "status";
/// `undrain`: its read and patch of one Node.
pub const UNDRAIN: &str = "undrain";

/// `ca-asg-provider/<version> (<component>)`.
pub fn of(component: &str) -> String {
    format!(
        "{}/{} ({component})",
        env!("CARGO_PKG_NAME"),
        env!("CARGO_PKG_VERSION")
    )
}

/// `client`, with every request sent as `component` (replacing any User-Agent set
/// before, so the outermost name wins).
pub fn named(client: kube::Client, component: &str) -> kube::Client {
    let value =
        HeaderValue::from_str(&of(component)).expect("a component name is a valid header value");
    crate::scalein::kube::intercept::intercepted(client, move |mut req, client| {
        req.headers_mut().insert(USER_AGENT, value.clone());
        Box::pin(async move { client.send(req).await })
    })
}

/// A client from the environment ([`super::client::kube_client`]: in the cluster, or
/// the kubeconfig) whose requests name `component`, as [`named`] does.
pub async fn client_for(component: &str) -> anyhow::Result<kube::Client> {
    Ok(named(super::client::kube_client().await?, component))
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_the_program_its_version_and_the_component() {
        assert_eq!(
            super::of(super::LEASE),
            format!("ca-asg-provider/{} (lease)", env!("CARGO_PKG_VERSION"))
        );
    }
}
