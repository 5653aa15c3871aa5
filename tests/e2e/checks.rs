//! What users care about after a scale-in, read from the real API server's audit log,
//! the fake kubelet's record of how each pod stopped, and the cloud. Each check returns
//! the broken promise in words, naming pods and nodes.
#![allow(dead_code)] // shared by the e2e test crates, each using a part

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::control_plane::{AuditEvent, SERVICE_USER};
use super::kubelet::{Ending, PodStop};

/// No pod of the service's was deleted around the Eviction API (a delete is only
/// allowed at a configured deadline, which these scenarios never reach), no pod was
/// evicted twice, and every workload pod that left a drained node left through an
/// eviction of the service's. Returns how many pods the service evicted.
pub fn evictions_only(
    audit: &[AuditEvent],
    stops: &[PodStop],
    nodes: &[String],
) -> Result<usize, String> {
    evictions_only_as(SERVICE_USER, audit, stops, nodes)
}

/// [`evictions_only`] for the service as `user` (installed by the chart: its own
/// ServiceAccount).
pub fn evictions_only_as(
    user: &str,
    audit: &[AuditEvent],
    stops: &[PodStop],
    nodes: &[String],
) -> Result<usize, String> {
    let deletes: Vec<String> = audit
        .iter()
        .filter(|e| e.user.username == user && e.is("delete", "pods", ""))
        .map(|e| e.target())
        .collect();
    if !deletes.is_empty() {
        return Err(format!(
            "the service deleted pods around the Eviction API: {deletes:?}"
        ));
    }
    let mut evicted: BTreeMap<String, usize> = BTreeMap::new();
    for e in audit {
        if e.user.username == user && e.is("create", "pods", "eviction") && e.code() == 201 {
            *evicted.entry(e.target()).or_default() += 1;
        }
    }
    let twice: Vec<&String> = evicted
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(p, _)| p)
        .collect();
    if !twice.is_empty() {
        return Err(format!("pods evicted more than once: {twice:?}"));
    }
    let unevicted: Vec<&String> = stops
        .iter()
        .filter(|s| !s.daemonset && s.how == Ending::Graceful && nodes.contains(&s.node))
        .map(|s| &s.pod)
        .filter(|p| !evicted.contains_key(*p))
        .collect();
    if !unevicted.is_empty() {
        return Err(format!(
            "workload pods left drained nodes without an eviction of the service's: {unevicted:?}"
        ));
    }
    Ok(evicted.len())
}

/// The evictions the API server refused (429: a budget, or API Priority and Fairness).
pub fn refused_evictions(audit: &[AuditEvent]) -> usize {
    audit
        .iter()
        .filter(|e| {
            e.user.username == SERVICE_USER && e.is("create", "pods", "eviction") && e.code() == 429
        })
        .count()
}

/// On every drained node, each DaemonSet pod began to stop only after every workload pod
/// that was there when the scale-in was asked for (`asked`) had exited, and none of those
/// died with its instance. (A pod that lands on the node after that, as one that
/// tolerates every taint may, is no drain's to stop: it ends with the instance.)
pub fn daemonset_last(
    stops: &[PodStop],
    nodes: &[String],
    asked: DateTime<Utc>,
) -> Result<(), String> {
    for node in nodes {
        let workloads: Vec<&PodStop> = stops
            .iter()
            .filter(|s| &s.node == node && !s.daemonset && s.started < asked)
            .collect();
        if let Some(lost) = workloads.iter().find(|s| s.how == Ending::WithInstance) {
            return Err(format!(
                "{node}: workload pod {} was still running when the instance ended",
                lost.pod
            ));
        }
        if let Some((early, last_workload)) = daemonsets_stopped_early(stops, node, asked).first() {
            return Err(format!(
                "{node}: DaemonSet pod {} began stopping at {} before the last workload pod exited at {}",
                early.pod, early.began, last_workload
            ));
        }
    }
    Ok(())
}

/// The DaemonSet pods of `node` that began a graceful stop before the last workload pod
/// that was there when the scale-in was asked for (`asked`) had exited, each with that
/// pod's exit: a log shipper gone while the app still wrote.
pub fn daemonsets_stopped_early<'a>(
    stops: &'a [PodStop],
    node: &str,
    asked: DateTime<Utc>,
) -> Vec<(&'a PodStop, DateTime<Utc>)> {
    let Some(last_workload) = stops
        .iter()
        .filter(|s| s.node == node && !s.daemonset && s.started < asked)
        .map(|s| s.ended)
        .max()
    else {
        return Vec::new();
    };
    stops
        .iter()
        .filter(|s| {
            s.node == node && s.daemonset && s.how == Ending::Graceful && s.began < last_workload
        })
        .map(|s| (s, last_workload))
        .collect()
}

/// The fewest pods whose name starts with `prefix` that were Ready at once, from the first
/// moment `want` of them were Ready until the end (a pod stops being Ready when its stop
/// begins).
pub fn fewest_ready(
    readies: &[(String, DateTime<Utc>)],
    stops: &[PodStop],
    prefix: &str,
    want: usize,
) -> usize {
    let mut moves: Vec<(DateTime<Utc>, i64)> = readies
        .iter()
        .filter(|(p, _)| p.starts_with(prefix))
        .map(|(_, t)| (*t, 1))
        .chain(
            stops
                .iter()
                .filter(|s| s.pod.starts_with(prefix))
                .map(|s| (s.began, -1)),
        )
        .collect();
    // At one instant, count the stop first: the worse reading.
    moves.sort_by_key(|(t, d)| (*t, *d));
    let (mut now, mut fewest, mut seen_full) = (0i64, i64::MAX, false);
    for (_, d) in moves {
        now += d;
        if now >= want as i64 {
            seen_full = true;
        }
        if seen_full {
            fewest = fewest.min(now);
        }
    }
    if fewest == i64::MAX {
        0
    } else {
        fewest.max(0) as usize
    }
}

/// The User-Agents the service's requests carried, as the audit log shows them.
pub fn service_user_agents(audit: &[AuditEvent]) -> std::collections::BTreeSet<String> {
    audit
        .iter()
        .filter(|e| e.user.username == SERVICE_USER)
        .map(|e| e.user_agent.clone())
        .collect()
}

/// The answers the service gave (its own `grpc_requests_total{method,code}` counts, one
/// text per process) other than OK, Unimplemented (the protocol's "nothing to say"),
/// Cancelled (a call its client gave up on or dropped) and the `expected` (method, code)
/// pairs: `method code xN` each.
pub fn provider_errors(counts: &[String], expected: &[(&str, &str)]) -> Result<(), String> {
    let mut found = BTreeMap::<(String, String), f64>::new();
    for text in counts {
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("ca_asg_provider_grpc_requests_total{") else {
                continue;
            };
            let Some((labels, n)) = rest.split_once("} ") else {
                continue;
            };
            let label = |k: &str| {
                labels.split(',').find_map(|kv| {
                    let (lk, v) = kv.split_once('=')?;
                    (lk.trim() == k).then(|| v.trim_matches('"').to_string())
                })
            };
            let (Some(method), Some(code)) = (label("method"), label("code")) else {
                continue;
            };
            if ["Ok", "Unimplemented", "Cancelled"].contains(&code.as_str())
                || expected.iter().any(|(m, c)| *m == method && *c == code)
            {
                continue;
            }
            *found.entry((method, code)).or_default() += n.trim().parse::<f64>().unwrap_or(0.0);
        }
    }
    if found.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the service answered CA's calls with errors: {}",
        found
            .iter()
            .map(|((m, c), n)| format!("{m} {c} x{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// The node is schedulable again and carries neither the service's taint nor CA's
/// (after an abandoned drain, or CA's clean-up).
pub fn handed_back(node: &k8s_openapi::api::core::v1::Node) -> Result<(), String> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let spec = node.spec.clone().unwrap_or_default();
    if spec.unschedulable == Some(true) {
        return Err(format!("{name} is still cordoned"));
    }
    let left: Vec<String> = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        .filter(|t| {
            t.key == "ToBeDeletedByClusterAutoscaler" || t.key == "ca-asg-provider.io/draining"
        })
        .map(|t| t.key)
        .collect();
    if !left.is_empty() {
        return Err(format!("{name} still carries {left:?}"));
    }
    Ok(())
}

/// Each node's drain: (node, from, to).
pub type Drains = Vec<(String, DateTime<Utc>, DateTime<Utc>)>;

/// How many of `nodes` drained at once at most, and each node's drain as
/// (node, from, to): a node drains from the first eviction the service asked for a pod
/// on it (refused ones too: the drain had begun) to the exit of its last pod that
/// stopped gracefully, as the kubelet saw it. An error names a node of `nodes` with no eviction at all.
pub fn most_draining_at_once(
    audit: &[AuditEvent],
    stops: &[PodStop],
    nodes: &[String],
) -> Result<(usize, Drains), String> {
    let mut drains = Vec::new();
    for node in nodes {
        let pods: Vec<&str> = stops
            .iter()
            .filter(|s| &s.node == node)
            .map(|s| s.pod.as_str())
            .collect();
        let from = audit
            .iter()
            .filter(|e| e.user.username == SERVICE_USER && e.is("create", "pods", "eviction"))
            .filter(|e| pods.contains(&e.target().as_str()))
            .filter_map(|e| e.stage_timestamp)
            .min()
            .ok_or_else(|| format!("{node}: the service evicted no pod of it"))?;
        // The DaemonSet controller puts a new DaemonSet pod on the cordoned node once
        // the old one is gone; it ends with the instance, after the drain.
        let to = stops
            .iter()
            .filter(|s| &s.node == node && s.how == Ending::Graceful)
            .map(|s| s.ended)
            .max()
            .expect("a pod was evicted, so one stopped");
        drains.push((node.clone(), from, to));
    }
    // A sweep over the drains' edges; at one instant an end goes before a start.
    let mut edges: Vec<(DateTime<Utc>, i32)> = drains
        .iter()
        .flat_map(|(_, from, to)| [(*from, 1), (*to, -1)])
        .collect();
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    Ok((most as usize, drains))
}

/// No workload pod began on one of `nodes` after the scale-in was asked for (`asked`):
/// a pod evicted from a node of a mass event never lands on the next one.
pub fn none_landed_on(
    stops: &[PodStop],
    nodes: &[String],
    asked: DateTime<Utc>,
) -> Result<(), String> {
    let landed: Vec<String> = stops
        .iter()
        .filter(|s| nodes.contains(&s.node) && !s.daemonset && s.started >= asked)
        .map(|s| format!("{} on {} at {}", s.pod, s.node, s.started))
        .collect();
    if landed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "pods landed on nodes already asked to go: {landed:?}"
        ))
    }
}
