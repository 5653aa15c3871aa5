//! Stage 1: cordon and mark the node, durably, so a restarted service (or a restarted
//! CA, which strips its own ToBeDeletedByClusterAutoscaler taint) still sees that the
//! node is leaving. Uncordon undoes only what this stage did.

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::json;

use super::Engine;

pub const TAINT_KEY: &str = "ca-asg-provider.io/draining";
pub const STARTED_ANNOTATION: &str = "ca-asg-provider.io/drain-started-at";
pub const MODE_ANNOTATION: &str = "ca-asg-provider.io/drain-mode";
pub const GROUP_ANNOTATION: &str = "ca-asg-provider.io/drain-group";
/// Set when this service (not someone before it) made the node unschedulable / added
/// the LB-exclusion label, so an abandoned drain restores exactly the old state.
const CORDONED_BY_US: &str = "ca-asg-provider.io/cordoned";
const LB_LABEL_BY_US: &str = "ca-asg-provider.io/lb-excluded";
pub const LB_EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// The taint cluster-autoscaler puts on a node it is deleting. A node handed back
/// after an abandoned drain must not keep it, or it stays unschedulable.
pub const CA_TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

const CONFLICT_RETRIES: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cordoned {
    /// Marked now, or found marked (a resumed drain); the RFC 3339 start time.
    Marked { started_at: String, resumed: bool },
    /// There is no Node object (never registered, or already deleted).
    NodeGone,
}

fn our_taint() -> Taint {
    Taint {
        key: TAINT_KEY.into(),
        value: Some("true".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

/// The mode of CA's scale-in of a group without our hook ([`super::Mode::Direct`]):
/// the mark the size accounting and the resume after a restart follow.
pub const DIRECT_MARK: &str = "direct";
/// The mode of a rebalance recommendation's cordon.
pub const REBALANCE_MARK: &str = "rebalance";
/// The mode of a drain an interruption notice started.
pub const INTERRUPTION_MARK: &str = "interruption";
/// The mode of `drain NODE` without `--terminate` ([`super::Mode::DrainOnly`]).
pub const DRAIN_ONLY_MARK: &str = "drain-only";

/// Which mark a node keeps when a second reason to cordon it comes: a drain that
/// ends the instance (CA's direct scale-in, a lifecycle hook) outranks an interruption
/// drain, which outranks a rebalance cordon. A rebalance-cordoned node that CA then
/// removes must carry CA's mode, or its drain is neither resumed nor counted.
pub fn mark_rank(mode: &str) -> u8 {
    match mode {
        REBALANCE_MARK => 0,
        INTERRUPTION_MARK | DRAIN_ONLY_MARK => 1,
        _ => 2,
    }
}

/// Cordons and marks the node. Idempotent; safe to call on a resumed drain. A mark
/// already there is kept unless the new one outranks it ([`mark_rank`]).
pub async fn cordon(
    engine: &Engine,
    node: &str,
    mode: &str,
    group: &str,
) -> Result<Cordoned, kube::Error> {
    let api: Api<Node> = Api::all(engine.client.clone());
    for _ in 0..CONFLICT_RETRIES {
        let Some(current) = api.get_opt(node).await? else {
            return Ok(Cordoned::NodeGone);
        };
        let annotations = current.metadata.annotations.clone().unwrap_or_default();
        if let Some(started) = annotations.get(STARTED_ANNOTATION) {
            let spec = current.spec.clone().unwrap_or_default();
            let has_taint = spec.taints.iter().flatten().any(|t| t.key == TAINT_KEY);
            let kept = annotations
                .get(MODE_ANNOTATION)
                .is_some_and(|m| mark_rank(m) >= mark_rank(mode));
            if spec.unschedulable == Some(true) && has_taint && kept {
                return Ok(Cordoned::Marked {
                    started_at: started.clone(),
                    resumed: true,
                });
            }
        }
        let started_at = annotations
            .get(STARTED_ANNOTATION)
            .cloned()
            .unwrap_or_else(|| k8s_openapi::jiff::Timestamp::now().to_string());
        let resumed = annotations.contains_key(STARTED_ANNOTATION);
        // Re-marked (someone uncordoned it): the higher-ranked mode stays.
        let mode = annotations
            .get(MODE_ANNOTATION)
            .map(String::as_str)
            .filter(|m| mark_rank(m) > mark_rank(mode))
            .unwrap_or(mode);
        let spec = current.spec.clone().unwrap_or_default();
        let mut taints = spec.taints.clone().unwrap_or_default();
        if !taints.iter().any(|t| t.key == TAINT_KEY) {
            taints.push(our_taint());
        }
        let labels = current.metadata.labels.clone().unwrap_or_default();
        let mut ann = json!({
            STARTED_ANNOTATION: started_at,
            MODE_ANNOTATION: mode,
            GROUP_ANNOTATION: group,
        });
        if spec.unschedulable != Some(true) {
            ann[CORDONED_BY_US] = json!("true");
        }
        if !labels.contains_key(LB_EXCLUDE_LABEL) {
            ann[LB_LABEL_BY_US] = json!("true");
        }
        let patch = json!({
            "metadata": {
                // Optimistic concurrency: a concurrent writer makes this a 409 and we
                // read again, so no taint someone else added is lost.
                "resourceVersion": current.metadata.resource_version,
                "annotations": ann,
                "labels": { LB_EXCLUDE_LABEL: "true" },
            },
            "spec": { "unschedulable": true, "taints": taints },
        });
        match api
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                return Ok(Cordoned::Marked {
                    started_at,
                    resumed,
                })
            }
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Cordoned::NodeGone),
            Err(e) => return Err(e),
        }
    }
    Err(kube::Error::Api(
        kube::core::Status::failure(
            &format!("node {node}: gave up after {CONFLICT_RETRIES} conflicting updates"),
            "Conflict",
        )
        .with_code(409)
        .boxed(),
    ))
}

/// Gives the node back: removes our taint, CA's ToBeDeletedByClusterAutoscaler
/// taint (CA asked for the removal that is now abandoned) and our marks, and
/// uncordons / unlabels only when this service did those.
pub async fn uncordon(engine: &Engine, node: &str) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(engine.client.clone());
    for _ in 0..CONFLICT_RETRIES {
        let Some(current) = api.get_opt(node).await? else {
            return Ok(());
        };
        let annotations = current.metadata.annotations.clone().unwrap_or_default();
        let spec = current.spec.clone().unwrap_or_default();
        let taints: Vec<Taint> = spec
            .taints
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.key != TAINT_KEY && t.key != CA_TO_BE_DELETED_TAINT)
            .collect();
        let mut spec_patch = json!({ "taints": taints });
        if annotations.contains_key(CORDONED_BY_US) {
            spec_patch["unschedulable"] = json!(false);
        }
        let mut labels = json!({});
        if annotations.contains_key(LB_LABEL_BY_US) {
            labels[LB_EXCLUDE_LABEL] = serde_json::Value::Null;
        }
        let patch = json!({
            "metadata": {
                "resourceVersion": current.metadata.resource_version,
                "annotations": {
                    STARTED_ANNOTATION: null, MODE_ANNOTATION: null, GROUP_ANNOTATION: null,
                    CORDONED_BY_US: null, LB_LABEL_BY_US: null,
                },
                "labels": labels,
            },
            "spec": spec_patch,
        });
        match api
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
