//! pods/eviction like the real API server: PodDisruptionBudgets decide, a refusal is
//! HTTP 429, and everything happens under the store lock so concurrent evictions can
//! never break a budget.

use std::borrow::Borrow;

use serde_json::{json, Value};

use super::preconditions::check_uid_precondition;
use super::selectors::selector_selects_object;
use super::store::{resource, ApiError, Inner};

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn terminating(pod: &Value) -> bool {
    !pod["metadata"]["deletionTimestamp"].is_null()
}

/// `minAvailable` / `maxUnavailable` as an int or a percentage of `expected`
/// (rounded up, as the disruption controller does).
fn scaled(v: &Value, expected: i64) -> Option<i64> {
    if let Some(n) = v.as_i64() {
        return Some(n);
    }
    let s = v.as_str()?;
    let pct: f64 = s.strip_suffix('%')?.parse().ok()?;
    Some((pct * expected as f64 / 100.0).ceil() as i64)
}

/// (healthy, desired healthy, expected) for a PDB over the pods of its namespace.
/// Expected pods come from the owning controllers' scale (as the disruption
/// controller does), so a pod that is terminating still counts until replaced;
/// pods without a controller count while they are not terminating.
pub fn budget(
    pdb: &Value,
    pods: &[impl Borrow<Value>],
    controllers: &[impl Borrow<Value>],
) -> (i64, i64, i64) {
    let sel = &pdb["spec"]["selector"];
    let controllers: Vec<&Value> = controllers.iter().map(Borrow::borrow).collect();
    let matching: Vec<&Value> = pods
        .iter()
        .map(Borrow::borrow)
        .filter(|p| selector_selects_object(sel, p))
        .filter(|p| {
            !matches!(
                p["status"]["phase"].as_str(),
                Some("Succeeded") | Some("Failed")
            )
        })
        .collect();
    // Each controller's UID read once, not once per matching pod.
    let scale_of: std::collections::HashMap<&str, i64> = controllers
        .iter()
        .map(|c| {
            (
                c["metadata"]["uid"].as_str().unwrap_or(""),
                c["spec"]["replicas"].as_i64().unwrap_or(1),
            )
        })
        .collect();
    let mut owners = std::collections::BTreeSet::new();
    let mut bare = 0i64;
    for p in &matching {
        let owner = p["metadata"]["ownerReferences"]
            .as_array()
            .and_then(|o| o.iter().find(|r| r["controller"] == true))
            .and_then(|r| r["uid"].as_str());
        match owner.filter(|uid| scale_of.contains_key(uid)) {
            Some(uid) => {
                owners.insert(uid);
            }
            None if !terminating(p) => bare += 1,
            None => {}
        }
    }
    let scale: i64 = owners.iter().map(|uid| scale_of[uid]).sum();
    let expected = scale + bare;
    let healthy = matching
        .iter()
        .filter(|p| !terminating(p) && is_ready(p))
        .count() as i64;
    let spec = &pdb["spec"];
    let desired = if !spec["minAvailable"].is_null() {
        scaled(&spec["minAvailable"], expected).unwrap_or(expected)
    } else if !spec["maxUnavailable"].is_null() {
        expected - scaled(&spec["maxUnavailable"], expected).unwrap_or(0)
    } else {
        expected
    };
    (healthy, desired.max(0), expected)
}

/// The PDB status the disruption controller would write.
pub fn status(
    pdb: &Value,
    pods: &[impl Borrow<Value>],
    controllers: &[impl Borrow<Value>],
) -> Value {
    let (healthy, desired, expected) = budget(pdb, pods, controllers);
    json!({
        "currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": expected,
        "disruptionsAllowed": (healthy - desired).max(0),
        "observedGeneration": pdb["metadata"]["generation"].as_i64().unwrap_or(1),
    })
}

/// The disruption controller's write for one budget: its status recomputed from the
/// pods now, stored (a new resourceVersion and a watch event) only when it differs.
pub(crate) fn refresh_status(inner: &mut Inner, ns: &str, name: &str) {
    refresh_statuses(inner, ns, std::iter::once(name));
}

/// `refresh_status` for several budgets of one namespace (its ReplicaSets read once).
pub(crate) fn refresh_statuses<'a>(
    inner: &mut Inner,
    ns: &str,
    names: impl IntoIterator<Item = &'a str>,
) {
    let pdb_res = resource("policy", "poddisruptionbudgets").expect("pdbs");
    let controllers = inner.list(resource("apps", "replicasets").expect("rs"), Some(ns));
    for name in names {
        let Some(pdb) = inner.get_shared(pdb_res, ns, name).cloned() else {
            continue;
        };
        let pods = candidates(inner, ns, &pdb["spec"]["selector"]);
        let now = status(&pdb, &pods, &controllers);
        if pdb["status"] != now {
            let _ = inner.update(pdb_res, ns, name, "status", |o| {
                let mut n = o.clone();
                n["status"] = now;
                Ok(n)
            });
        }
    }
}

/// The budgets of `ns` whose selector picks `pod`.
pub(crate) fn budgets_selecting(
    inner: &Inner,
    ns: &str,
    pod: &Value,
) -> Vec<std::sync::Arc<Value>> {
    let pdb_res = resource("policy", "poddisruptionbudgets").expect("pdbs");
    inner
        .iter(pdb_res, Some(ns))
        .filter(|p| selector_selects_object(&p["spec"]["selector"], pod))
        .cloned()
        .collect()
}

/// Every budget of `ns`.
pub(crate) fn budget_names(inner: &Inner, ns: Option<&str>) -> Vec<(String, String)> {
    let pdb_res = resource("policy", "poddisruptionbudgets").expect("pdbs");
    inner
        .iter(pdb_res, ns)
        .filter_map(|p| {
            Some((
                p["metadata"]["namespace"].as_str()?.to_string(),
                p["metadata"]["name"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// Whether the stored status (what the API server decides on) forbids a disruption:
/// none is allowed, or it describes an older spec (or none yet).
fn stored_status_forbids(pdb: &Value) -> bool {
    let st = &pdb["status"];
    let generation = pdb["metadata"]["generation"].as_i64().unwrap_or(1);
    st["observedGeneration"].as_i64().unwrap_or(0) < generation
        || st["disruptionsAllowed"].as_i64().unwrap_or(0) <= 0
}

/// The pods of `ns` a selector may select: those with its first `matchLabels` pair
/// (from the store's label index), or every pod of the namespace. `budget` applies
/// the whole selector.
pub(crate) fn candidates(inner: &Inner, ns: &str, selector: &Value) -> Vec<std::sync::Arc<Value>> {
    let first = selector["matchLabels"]
        .as_object()
        .and_then(|m| m.iter().find_map(|(k, v)| Some((k, v.as_str()?))));
    match first {
        Some((k, v)) => inner.pods_labelled(ns, k, v).cloned().collect(),
        None => inner.list(resource("", "pods").expect("pods"), Some(ns)),
    }
}

/// Handles one eviction. `Ok` carries the Status to answer with (201).
pub(crate) fn evict(
    inner: &mut Inner,
    ns: &str,
    name: &str,
    body: &Value,
) -> Result<Value, ApiError> {
    let pods_res = resource("", "pods").expect("pods");
    let pod = inner
        .get_shared(pods_res, ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(pods_res, name))?;
    let grace = body["deleteOptions"]["gracePeriodSeconds"].as_i64();
    check_uid_precondition(&pod, &body["deleteOptions"]["preconditions"])?;
    if terminating(&pod) {
        // Already going: nothing a budget could protect.
        return Ok(json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}));
    }
    let pdbs = budgets_selecting(inner, ns, &pod);
    if pdbs.len() > 1 {
        return Err(ApiError::new(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."));
    }
    if let Some(pdb) = pdbs.first() {
        let pods = candidates(inner, ns, &pdb["spec"]["selector"]);
        let controllers = inner.list(resource("apps", "replicasets").expect("rs"), Some(ns));
        let (healthy, desired, _) = budget(pdb, &pods, &controllers);
        // Evicting a pod that is not Ready costs the budget nothing.
        let counts = is_ready(&pod);
        // Like the real API server, it decides on the stored status, which the
        // disruption controller writes a moment after the pods change: a client that
        // tries before the status caught up is refused. The budget counted from the
        // pods now refuses too, so the fake never lets a budget break.
        if counts && (healthy - desired <= 0 || stored_status_forbids(pdb)) {
            inner.note("eviction-denied", pods_res, ns, name);
            let pdb_name = pdb["metadata"]["name"].as_str().unwrap_or("");
            let mut e = ApiError::new(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            );
            let message = if healthy - desired > 0 {
                format!("The disruption budget {pdb_name} is still being processed by the server.")
            } else {
                format!("The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently")
            };
            e.causes = vec![json!({"reason": "DisruptionBudget", "message": message})];
            return Err(e);
        }
    }
    inner.note("evicted", pods_res, ns, name);
    inner.delete(pods_res, ns, name, grace)?;
    // The API server writes the budget's status with the eviction (one disruption
    // fewer), before it answers.
    if let Some(pdb) = pdbs.first() {
        refresh_status(inner, ns, pdb["metadata"]["name"].as_str().unwrap_or(""));
    }
    Ok(
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_RS: &[Value] = &[];

    fn pod(ready: bool, terminating: bool) -> Value {
        let mut p = json!({"metadata": {"labels": {"app": "web"}}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}});
        if terminating {
            p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        p
    }

    #[test]
    fn max_unavailable_one_of_two() {
        let pdb =
            json!({"spec": {"selector": {"matchLabels": {"app": "web"}}, "maxUnavailable": 1}});
        assert_eq!(
            budget(&pdb, &[pod(true, false), pod(true, false)], NO_RS),
            (2, 1, 2)
        );
        // One is going: the other may not.
        assert_eq!(
            budget(&pdb, &[pod(true, true), pod(true, false)], NO_RS),
            (1, 0, 1)
        );
        let st = status(&pdb, &[pod(true, false), pod(false, false)], NO_RS);
        assert_eq!(st["disruptionsAllowed"], 0);
    }

    #[test]
    fn a_replaced_pod_counts_against_the_controller_scale() {
        let pdb =
            json!({"spec": {"selector": {"matchLabels": {"app": "web"}}, "maxUnavailable": 1}});
        let rs = json!({"metadata": {"uid": "rs1"}, "spec": {"replicas": 2}});
        let owned = |ready, term| {
            let mut p = pod(ready, term);
            p["metadata"]["ownerReferences"] = json!([{"uid": "rs1", "controller": true}]);
            p
        };
        // One evicted (terminating), one healthy: nothing more may go.
        assert_eq!(
            budget(
                &pdb,
                &[owned(true, true), owned(true, false)],
                std::slice::from_ref(&rs)
            ),
            (1, 1, 2)
        );
        // The replacement is Ready: one may go again, although the old one still terminates.
        assert_eq!(
            budget(
                &pdb,
                &[owned(true, true), owned(true, false), owned(true, false)],
                &[rs]
            ),
            (2, 1, 2)
        );
    }

    #[test]
    fn min_available_percent_rounds_up() {
        let pdb = json!({"spec": {"selector": {}, "minAvailable": "50%"}});
        assert_eq!(
            budget(
                &pdb,
                &[pod(true, false), pod(true, false), pod(true, false)],
                NO_RS
            ),
            (3, 2, 3)
        );
        let pdb = json!({"spec": {"selector": {}, "maxUnavailable": "34%"}});
        assert_eq!(
            budget(
                &pdb,
                &[pod(true, false), pod(true, false), pod(true, false)],
                NO_RS
            )
            .1,
            1
        );
    }
}
