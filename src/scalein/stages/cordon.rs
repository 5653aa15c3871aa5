//! Cordon and mark the node, durably, so a restarted service (or a restarted
//! CA, which strips its own ToBeDeletedByClusterAutoscaler taint) still sees that the
//! node is leaving. Uncordon undoes only what this stage did.

use k8s_openapi::api::core::v1::Taint;
use serde_json::json;

// The marks live with the record that reads them; re-exported where the Node is marked.
pub use crate::scalein::decide::record::{
    mark_rank, CordonSeen, CA_TO_BE_DELETED_TAINT, DIRECT_MARK, DRAIN_ONLY_MARK, GROUP_ANNOTATION,
    INTERRUPTION_MARK, LIFECYCLE_MARK, MODE_ANNOTATION, REBALANCE_MARK, STARTED_ANNOTATION,
    TAINT_KEY,
};
use crate::scalein::decide::record::{
    DrainReason, DrainRecord, Limits, ANNOTATION as RECORD_ANNOTATION,
};
use crate::scalein::kube::node_record::{read_modify_write, Write};
use crate::scalein::stages::Stage;

/// Set when this service (not someone before it) made the node unschedulable, or
/// cluster-autoscaler did with its deletion taint (value `cluster-autoscaler`), and
/// when this service added the LB-exclusion label, so an abandoned drain restores
/// exactly the state from before the scale-in.
const CORDONED_BY_US: &str = "ca-asg-provider.io/cordoned";
const LB_LABEL_BY_US: &str = "ca-asg-provider.io/lb-excluded";
pub const LB_EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cordoned {
    /// Marked now, or found marked (a resumed drain): every reason recorded on the
    /// Node, the new one joined in.
    Marked {
        record: DrainRecord,
        /// The Node already carried a drain.
        resumed: bool,
    },
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

/// Cordons and marks the node, and records `reasons` with every reason already
/// there (none: a resumed drain follows what the Node says). `keep`: the engine
/// that runs the drain gives it its group's deadline to keep
/// ([`DrainRecord::keep`]); `None` keeps nothing (the `drain` command following the
/// leader, whose own settings may differ). Idempotent. Written with optimistic concurrency, so two reasons arriving at once
/// both land.
pub async fn cordon(
    stage: &Stage<'_>,
    node: &str,
    reasons: &[DrainReason],
    group: &str,
    keep: Option<Limits>,
) -> Result<Cordoned, kube::Error> {
    cordon_via(stage, stage.client, node, reasons, group, keep).await
}

/// [`cordon`] through `client`: DeleteNodes marks its Node through the engine's
/// answer client, ahead of the drains in the API rate limit, since CA waits for it.
pub async fn cordon_via(
    stage: &Stage<'_>,
    client: &kube::Client,
    node: &str,
    reasons: &[DrainReason],
    group: &str,
    keep: Option<Limits>,
) -> Result<Cordoned, kube::Error> {
    let limits = keep.unwrap_or_else(|| stage.settings.limits());
    let mut unsure = false;
    let marked = read_modify_write(stage.nodes, client, node, |current| {
        let annotations = current.metadata.annotations.clone().unwrap_or_default();
        let found = crate::scalein::kube::node_record::record_of(&annotations);
        let resumed = found.is_some();
        let mut record = found.unwrap_or_default();
        for r in reasons {
            record.join(r.clone(), limits);
        }
        if let Some(k) = keep {
            record.keep(k);
        }
        let spec = current.spec.clone().unwrap_or_default();
        let has_taint = spec.taints.iter().flatten().any(|t| t.key == TAINT_KEY);
        let recorded = annotations.get(RECORD_ANNOTATION) == Some(&record.to_json());
        // A resume of a Node whose mark is gone (given back meanwhile) asks for no
        // drain and cordons nothing.
        if record.reasons.is_empty() || (spec.unschedulable == Some(true) && has_taint && recorded)
        {
            return Write::Keep(Cordoned::Marked { record, resumed });
        }
        // When the drain began (what a reader of the mode and this time alone, an
        // older version, counts deadlines from), not an earlier cordon's time.
        let started_at = record
            .drain_began()
            .or_else(|| record.first_at())
            .map(|t| t.to_rfc3339())
            .or_else(|| annotations.get(STARTED_ANNOTATION).cloned())
            .unwrap_or_else(|| {
                crate::clock::utc_now().to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
            });
        let mut taints = spec.taints.clone().unwrap_or_default();
        if !taints.iter().any(|t| t.key == TAINT_KEY) {
            taints.push(our_taint());
        }
        let labels = current.metadata.labels.clone().unwrap_or_default();
        let group = annotations
            .get(GROUP_ANNOTATION)
            .filter(|g| group.is_empty() && !g.is_empty())
            .map(String::as_str)
            .unwrap_or(group);
        let mut ann = json!({
            STARTED_ANNOTATION: started_at,
            MODE_ANNOTATION: record.mark(),
            GROUP_ANNOTATION: group,
            RECORD_ANNOTATION: record.to_json(),
        });
        match cordon_owner(stage.nodes.cordon_seen(node), &spec) {
            Owner::Service => ann[CORDONED_BY_US] = json!("true"),
            Owner::ClusterAutoscaler => ann[CORDONED_BY_US] = json!(CA_OWNER),
            Owner::Other => {}
            Owner::Unknown => unsure = true,
        }
        if !labels.contains_key(LB_EXCLUDE_LABEL) {
            ann[LB_LABEL_BY_US] = json!("true");
        }
        let patch = json!({
            "metadata": {
                "annotations": ann,
                "labels": { LB_EXCLUDE_LABEL: "true" },
            },
            "spec": { "unschedulable": true, "taints": taints },
        });
        Write::Patch(patch, Cordoned::Marked { record, resumed })
    })
    .await?;
    if unsure {
        tracing::warn!(node, "the node was already cordoned, with cluster-autoscaler's deletion taint, when this service first saw it: it cannot tell whether a person cordoned it before CA, so a give-back leaves it cordoned");
    }
    Ok(marked.unwrap_or(Cordoned::NodeGone))
}

/// [`CORDONED_BY_US`]'s value for cluster-autoscaler's cordon.
const CA_OWNER: &str = "cluster-autoscaler";

/// Whose cordon a drain starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// None yet: this service cordons the node, and a give-back uncordons it.
    Service,
    /// cluster-autoscaler's (>= 1.34 cordons the node in the same write as its
    /// `ToBeDeletedByClusterAutoscaler` taint before DeleteNodes; its own cleanup
    /// undoes both): a give-back uncordons it.
    ClusterAutoscaler,
    /// Someone else's (a person, another tool): it stays.
    Other,
    /// Cordoned with CA's taint, but the Node was never seen without them: a person
    /// may have cordoned it before CA tainted it. It stays (a cordon too many, said
    /// in the log, rather than a person's cordon undone).
    Unknown,
}

/// Whose cordon the Node in `spec` carries, from how the Node index saw it come
/// (`seen`): the spec alone cannot tell a person's cordon that CA's taint joined
/// later from CA's own.
fn cordon_owner(seen: Option<CordonSeen>, spec: &k8s_openapi::api::core::v1::NodeSpec) -> Owner {
    if spec.unschedulable != Some(true) {
        return Owner::Service;
    }
    let ca_marked = spec
        .taints
        .iter()
        .flatten()
        .any(|t| t.key == CA_TO_BE_DELETED_TAINT);
    match (ca_marked, seen) {
        (false, _) | (true, Some(CordonSeen::ByOther)) => Owner::Other,
        // Last seen schedulable (the watch behind this read): cordoned in one
        // write with CA's taint since.
        (true, Some(CordonSeen::ByCa | CordonSeen::Schedulable)) => Owner::ClusterAutoscaler,
        (true, None) => Owner::Unknown,
    }
}

/// What a give-back left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GivenBack {
    /// Uncordoned, or it was not cordoned.
    Schedulable,
    /// The cordon the drain found stays: not this service's, nor (as far as it could
    /// tell) cluster-autoscaler's.
    CordonKept,
}

impl GivenBack {
    /// For the give-back's Event.
    pub fn note(self) -> &'static str {
        match self {
            GivenBack::Schedulable => "",
            GivenBack::CordonKept => "; it stays cordoned as it was before the drain (not this service's cordon, nor as far as it can tell cluster-autoscaler's: a person's or another tool's; uncordon it by hand if that cordon is not wanted)",
        }
    }
}

/// Whose marks a give-back removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveBackOf {
    /// The service's abandoned drain: its marks, and cluster-autoscaler's taint and
    /// cordon too (CA asked for the removal that is now abandoned).
    Drain,
    /// A person's `undrain`: only this service's marks (its taint, its record, its
    /// own cordon and LB-exclusion label); CA's taint and cordon are CA's.
    ServiceOnly,
}

/// The merge patch that gives `current` back, and what it leaves. Pure. Removes our
/// taint and marks (and, for [`GiveBackOf::Drain`], CA's ToBeDeletedByClusterAutoscaler
/// taint), and uncordons / unlabels only when this service (or, for a drain's
/// give-back, CA) did those. Every other taint, label and annotation stays.
pub fn give_back_patch(
    current: &k8s_openapi::api::core::v1::Node,
    of: GiveBackOf,
) -> (serde_json::Value, GivenBack) {
    let annotations = current.metadata.annotations.clone().unwrap_or_default();
    let spec = current.spec.clone().unwrap_or_default();
    let uncordon = match (annotations.get(CORDONED_BY_US).map(String::as_str), of) {
        (None, _) => false,
        (Some(CA_OWNER), GiveBackOf::ServiceOnly) => false,
        (Some(_), _) => true,
    };
    let kept = if spec.unschedulable == Some(true) && !uncordon {
        GivenBack::CordonKept
    } else {
        GivenBack::Schedulable
    };
    let taints: Vec<Taint> = spec
        .taints
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|t| {
            t.key != TAINT_KEY && (of == GiveBackOf::ServiceOnly || t.key != CA_TO_BE_DELETED_TAINT)
        })
        .collect();
    let mut spec_patch = json!({ "taints": taints });
    if uncordon {
        spec_patch["unschedulable"] = json!(false);
    }
    let mut labels = json!({});
    if annotations.contains_key(LB_LABEL_BY_US) {
        labels[LB_EXCLUDE_LABEL] = serde_json::Value::Null;
    }
    let patch = json!({
        "metadata": {
            "annotations": {
                STARTED_ANNOTATION: null, MODE_ANNOTATION: null, GROUP_ANNOTATION: null,
                RECORD_ANNOTATION: null, CORDONED_BY_US: null, LB_LABEL_BY_US: null,
                crate::scalein::decide::last_mile::ANNOTATION: null,
            },
            "labels": labels,
        },
        "spec": spec_patch,
    });
    (patch, kept)
}

/// Whether `current` carries any mark of this service (its taint, or an annotation
/// or label a drain wrote): what `undrain` has to give back.
pub fn has_marks(current: &k8s_openapi::api::core::v1::Node) -> bool {
    let annotations = current.metadata.annotations.clone().unwrap_or_default();
    let tainted = current
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_KEY));
    tainted
        || [
            STARTED_ANNOTATION,
            MODE_ANNOTATION,
            GROUP_ANNOTATION,
            RECORD_ANNOTATION,
            CORDONED_BY_US,
            LB_LABEL_BY_US,
            crate::scalein::decide::last_mile::ANNOTATION,
        ]
        .iter()
        .any(|k| annotations.contains_key(*k))
}

/// Gives the node back after an abandoned drain ([`give_back_patch`] of
/// [`GiveBackOf::Drain`]).
pub async fn uncordon(stage: &Stage<'_>, node: &str) -> Result<GivenBack, kube::Error> {
    let given = give_back_while(stage, node, |_| true).await?;
    Ok(given.unwrap_or(GivenBack::Schedulable))
}

/// [`uncordon`], only while the Node's record is still `decided_on`, the record the
/// give-back was decided from: a reason recorded since (CA's scale-in, a notice, a
/// lifecycle hold) keeps the node and its marks. `Ok(None)`: not given back (the
/// record changed, or there is no Node).
pub async fn uncordon_if(
    stage: &Stage<'_>,
    node: &str,
    decided_on: &DrainRecord,
) -> Result<Option<GivenBack>, kube::Error> {
    let given = give_back_while(stage, node, |now| now == Some(decided_on)).await?;
    if given.is_some() {
        let state = crate::scalein::decide::conditions::DrainState::Stopped {
            reason: "DrainGivenBack",
            message: "given back: the reason the node was drained for is gone".into(),
        };
        stage.say_state(node, &state).await;
    }
    Ok(given)
}

/// Gives the node back ([`give_back_patch`] of [`GiveBackOf::Drain`]) when `still`
/// holds for its record as read in the same read-modify-write. `Ok(None)`: not given
/// back (`still` refused, or there is no Node).
async fn give_back_while(
    stage: &Stage<'_>,
    node: &str,
    still: impl Fn(Option<&DrainRecord>) -> bool,
) -> Result<Option<GivenBack>, kube::Error> {
    let given = read_modify_write(stage.nodes, stage.client, node, |current| {
        let annotations = current.metadata.annotations.clone().unwrap_or_default();
        if !still(crate::scalein::kube::node_record::record_of(&annotations).as_ref()) {
            return Write::Keep(None);
        }
        let (patch, kept) = give_back_patch(current, GiveBackOf::Drain);
        Write::Patch(patch, Some(kept))
    })
    .await?
    .flatten();
    if given == Some(GivenBack::CordonKept) {
        tracing::info!(node, "given back; the cordon it had before the drain stays (not this service's, nor as far as it can tell cluster-autoscaler's)");
    }
    Ok(given)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;

    fn node(unschedulable: bool, taints: &[&str]) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "spec": {
                "unschedulable": unschedulable,
                "taints": taints.iter().map(|k| json!({"key": k, "effect": "NoSchedule"})).collect::<Vec<_>>(),
            },
        }))
        .unwrap()
    }

    fn seen(states: &[Node]) -> Option<CordonSeen> {
        states.iter().fold(None, CordonSeen::after)
    }

    /// Issue 59: whose cordon a drain starts from follows how the Node came to be
    /// cordoned, not only what it shows: CA's taint joining a person's cordon leaves
    /// it the person's, and a Node first seen cordoned with CA's taint is unknown
    /// (kept on give-back).
    #[test]
    fn a_cordon_is_cas_only_when_seen_coming_with_its_taint() {
        let free = node(false, &[]);
        let person = node(true, &[]);
        let ca = node(true, &[CA_TO_BE_DELETED_TAINT]);
        let ours = node(true, &[TAINT_KEY]);
        let spec = |n: &Node| n.spec.clone().unwrap();

        assert_eq!(
            cordon_owner(seen(std::slice::from_ref(&free)), &spec(&free)),
            Owner::Service
        );
        // CA's own cordon, seen come in one write with its taint (or the watch is
        // behind the read and last saw the node schedulable).
        let by_ca = seen(&[free.clone(), ca.clone()]);
        assert_eq!(by_ca, Some(CordonSeen::ByCa));
        assert_eq!(cordon_owner(by_ca, &spec(&ca)), Owner::ClusterAutoscaler);
        assert_eq!(
            cordon_owner(seen(std::slice::from_ref(&free)), &spec(&ca)),
            Owner::ClusterAutoscaler
        );
        // A person's cordon, CA's taint after it.
        let by_person = seen(&[free.clone(), person.clone(), ca.clone()]);
        assert_eq!(by_person, Some(CordonSeen::ByOther));
        assert_eq!(cordon_owner(by_person, &spec(&ca)), Owner::Other);
        // A cordon without CA's taint is never CA's.
        assert_eq!(cordon_owner(None, &spec(&person)), Owner::Other);
        // First seen cordoned with CA's taint: nobody can tell.
        let first = seen(std::slice::from_ref(&ca));
        assert_eq!(first, None);
        assert_eq!(cordon_owner(first, &spec(&ca)), Owner::Unknown);
        // This service's own cordon teaches nothing; uncordoned starts afresh.
        assert_eq!(
            seen(&[free.clone(), ours.clone()]),
            Some(CordonSeen::Schedulable)
        );
        assert_eq!(
            seen(&[person.clone(), ca.clone(), free.clone(), ca.clone()]),
            Some(CordonSeen::ByCa)
        );
    }
}
