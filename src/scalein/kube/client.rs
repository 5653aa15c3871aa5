//! The environment's Kubernetes client (in-cluster config or KUBECONFIG), as the
//! service and its commands build it.

/// The Kubernetes client the service uses: in-cluster config or KUBECONFIG, with the
/// client's own retry of 429/503 turned off. kube-rs retries those by default (up to
/// 15 times, backing off to minutes), which would hide a PodDisruptionBudget's
/// refusal inside one eviction call instead of letting the drain wait, event and
/// honour its deadline.
pub async fn kube_client() -> anyhow::Result<kube::Client> {
    let mut cfg = kube::Config::infer().await.map_err(|e| {
        anyhow::anyhow!("cannot configure the Kubernetes client (in-cluster or KUBECONFIG): {e}")
    })?;
    cfg.default_retry = false;
    kube::Client::try_from(cfg)
        .map_err(|e| anyhow::anyhow!("cannot build the Kubernetes client: {e}"))
}
