//! `serve --dry-run` for the drain (like NTH's `dryRun`): every drain is decided as
//! usual and described instead of done. The Node gets a `DryRunDrain` Event naming
//! the pods in the order they would go, the log says the same, and nothing is
//! cordoned, evicted, heartbeated or ended.
//!
//! The decisions are made above (the engine describes instead of draining); the
//! client here makes sure a path that forgot to ask still writes nothing: every
//! request but reads and Events stops in this process.

use kube::client::Body;

use crate::scalein::decide::plan::{self, PodRef};
use crate::scalein::kube::events::Reason;
use crate::scalein::kube::fence;
use crate::scalein::kube::intercept::Answer;
use crate::scalein::stages::Stage;
use crate::scalein::{DaemonSetPolicy, DrainRequest, Mode};
use crate::telemetry::metrics::metrics;

/// A client that sends reads and Events to the API server and answers every other
/// request itself with a 403 naming the dry run.
pub fn read_only_client(client: kube::Client) -> kube::Client {
    crate::scalein::kube::intercept::intercepted(client, guard)
}

/// Sends reads and Events ([`fence::reads_or_says`]); answers everything else itself.
fn guard(req: http::Request<Body>, client: kube::Client) -> Answer {
    if fence::reads_or_says(req.method(), req.uri().path()) {
        return Box::pin(async move { client.send(req).await });
    }
    let what = format!("{} {}", req.method(), req.uri().path());
    tracing::info!(request = %what, "dry run: not sending the request to the API server");
    metrics().dry_run(&format!("kube {}", req.method()));
    fence::refused(&format!("dry run: {what} was not sent"))
}

/// What the drain of `req` would do, from what the cluster shows now. Publishes it
/// as a `DryRunDrain` Event on the Node (when there is one) and logs it.
pub async fn describe(stage: &Stage<'_>, req: &DrainRequest) -> String {
    metrics().dry_run("drain");
    let end = match &req.mode {
        Mode::Lifecycle { action, .. } => {
            format!("complete lifecycle action CONTINUE (hook {})", action.hook)
        }
        Mode::Direct => "terminate the instance with decrement".into(),
        Mode::DrainOnly => "leave the instance running".into(),
    };
    let id = &req.instance_id;
    let node = match stage.find_node(id, req.node_name.as_deref()).await {
        Err(e) => {
            let text = format!(
                "dry run: cannot tell whether instance {id} has a Node ({e}): would not end it"
            );
            tracing::info!(instance = %id, "{text}");
            return text;
        }
        Ok(None) => {
            let text = format!("dry run: instance {id} has no Node: would {end} at once");
            tracing::info!(instance = %id, "{text}");
            return text;
        }
        Ok(Some(n)) => n,
    };
    let text = match crate::scalein::kube::nodes::pods_on(stage.client, &node).await {
        Err(e) => format!(
            "dry run: cannot list the pods of node {node} ({e}): would not end instance {id}"
        ),
        Ok(list) => {
            let evict_ds = stage.settings.daemonsets == DaemonSetPolicy::EvictLast;
            summary(
                &node,
                req,
                &plan::full_plan(&list, evict_ds, crate::clock::timestamp_now()),
                &end,
            )
        }
    };
    tracing::info!(node = %node, instance = %id, group = %req.group, "{text}");
    stage
        .events
        .node(&node, Reason::DryRunDrain, text.clone())
        .await;
    text
}

/// The plan in one line, in drain order. Pure.
pub fn summary(
    node: &str,
    req: &DrainRequest,
    plan: &[(PodRef, Result<plan::Tier, &'static str>)],
    end: &str,
) -> String {
    let names = |pick: &dyn Fn(&Result<plan::Tier, &'static str>) -> bool| -> Vec<String> {
        plan.iter()
            .filter(|(_, r)| pick(r))
            .map(|(p, _)| p.to_string())
            .collect()
    };
    let workloads = names(&|r| matches!(r, Ok(t) if !t.is_daemonset()));
    let daemonsets = names(&|r| matches!(r, Ok(t) if t.is_daemonset()));
    let left = names(&|r| r.is_err());
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    format!(
        "dry run: would drain node {node} (instance {}, group {}, {} mode): cordon and taint it; evict {} workload pod(s) ({}); then {} DaemonSet pod(s) last ({}); leave {} pod(s) ({}); then {end}",
        req.instance_id,
        req.group,
        req.mode.as_str(),
        workloads.len(),
        list(&workloads),
        daemonsets.len(),
        list(&daemonsets),
        left.len(),
        list(&left),
    )
}
