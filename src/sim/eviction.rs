//! pods/eviction like the real API server: the stored status of the pod's
//! PodDisruptionBudget decides (what the disruption controller last wrote, never a
//! count of the pods at the time of the request), a refusal is HTTP 429, an allowed
//! eviction is charged to that status. A client that evicts on a stale status can
//! break a budget here as it can on a real cluster.

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
    let scale_of: std::collections::BTreeMap<&str, i64> = controllers
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
    // A pod the API server let go that has not started terminating yet is not
    // healthy any more; once it terminates (or is gone, or two minutes passed) the
    // controller forgets it.
    let listed = pdb["status"]["disruptedPods"].as_object();
    let now = crate::clock::utc_now();
    let mut disrupted = serde_json::Map::new();
    let mut unhealthy = 0;
    for p in pods.iter().map(Borrow::borrow) {
        let name = p["metadata"]["name"].as_str().unwrap_or("");
        let Some(at) = listed.and_then(|l| l.get(name)) else {
            continue;
        };
        let recent = at
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .is_some_and(|t| now.signed_duration_since(t) < chrono::Duration::minutes(2));
        if terminating(p) || !recent {
            continue;
        }
        disrupted.insert(name.to_string(), at.clone());
        if is_ready(p) && selector_selects_object(&pdb["spec"]["selector"], p) {
            unhealthy += 1;
        }
    }
    let healthy = healthy - unhealthy;
    let mut st = json!({
        "currentHealthy": healthy, "desiredHealthy": desired, "expectedPods": expected,
        "disruptionsAllowed": (healthy - desired).max(0),
        "observedGeneration": pdb["metadata"]["generation"].as_i64().unwrap_or(1),
    });
    if !disrupted.is_empty() {
        st["disruptedPods"] = Value::Object(disrupted);
    }
    st
}

/// The disruption controller's write for budgets of one namespace (its ReplicaSets
/// read once): each status recomputed from the pods now, stored (a new
/// resourceVersion and a watch event) only when it differs.
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

/// A pod the API server evicts without asking its budget: terminating already, not
/// started (Pending) or finished.
fn budget_ignores(pod: &Value) -> bool {
    terminating(pod)
        || matches!(
            pod["status"]["phase"].as_str(),
            None | Some("Pending") | Some("Succeeded") | Some("Failed")
        )
}

/// The 429 an eviction gets from a budget's stored status.
fn refusal(message: String) -> ApiError {
    let mut e = ApiError::new(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
    );
    e.causes = vec![json!({"reason": "DisruptionBudget", "message": message})];
    e
}

/// What the API server decides for a pod one budget selects, from that budget's
/// stored status alone (the disruption controller writes it; nothing here counts the
/// pods again). `Ok(true)`: allowed, and the status must be charged for it.
fn verdict(pdb: &Value, pod_ready: bool) -> Result<bool, ApiError> {
    let st = &pdb["status"];
    let name = pdb["metadata"]["name"].as_str().unwrap_or("");
    let current = st["currentHealthy"].as_i64().unwrap_or(0);
    let desired = st["desiredHealthy"].as_i64().unwrap_or(0);
    if !pod_ready {
        // A pod that is not Ready is not counted healthy: evicting it costs nothing,
        // when the policy says so.
        let always = pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow";
        if always || (current >= desired && desired > 0) {
            return Ok(false);
        }
    }
    let generation = pdb["metadata"]["generation"].as_i64().unwrap_or(1);
    if st["observedGeneration"].as_i64().unwrap_or(0) < generation {
        return Err(refusal(format!(
            "The disruption budget {name} is still being processed by the server."
        )));
    }
    if st["disruptionsAllowed"].as_i64().unwrap_or(0) <= 0 {
        return Err(refusal(format!(
            "The disruption budget {name} needs {desired} healthy pods and has {current} currently"
        )));
    }
    Ok(true)
}

/// The API server's write with an allowed eviction: one disruption fewer, and the pod
/// listed in `disruptedPods` until the controller sees it go.
fn charge(inner: &mut Inner, ns: &str, pdb: &Value, pod: &str) {
    let pdb_res = resource("policy", "poddisruptionbudgets").expect("pdbs");
    let name = pdb["metadata"]["name"].as_str().unwrap_or("");
    let stamp = crate::clock::utc_now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let _ = inner.update(pdb_res, ns, name, "status", |o| {
        let mut n = o.clone();
        let left = n["status"]["disruptionsAllowed"].as_i64().unwrap_or(0) - 1;
        n["status"]["disruptionsAllowed"] = json!(left);
        n["status"]["disruptedPods"][pod] = json!(stamp);
        Ok(n)
    });
}

/// Handles one eviction. `Ok` carries the Status to answer with (200 for a pod that
/// was already terminating, 201 for an eviction that starts its deletion). Every
/// request is in the audit (`eviction-requested`), then its outcome (`evicted`,
/// `eviction-denied`).
pub(crate) fn evict(
    inner: &mut Inner,
    ns: &str,
    name: &str,
    body: &Value,
) -> Result<Value, ApiError> {
    let pods_res = resource("", "pods").expect("pods");
    inner.note("eviction-requested", pods_res, ns, name);
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
    if !budget_ignores(&pod) {
        let pdbs = budgets_selecting(inner, ns, &pod);
        if pdbs.len() > 1 {
            return Err(ApiError::new(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."));
        }
        if let Some(pdb) = pdbs.first() {
            match verdict(pdb, is_ready(&pod)) {
                Err(e) => {
                    inner.note("eviction-denied", pods_res, ns, name);
                    return Err(e);
                }
                Ok(true) => charge(inner, ns, pdb, name),
                Ok(false) => {}
            }
        }
    }
    inner.note("evicted", pods_res, ns, name);
    inner.delete(pods_res, ns, name, grace)?;
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

    /// A store with `n` Ready pods of app web, and a budget over them whose stored
    /// status is `status` (as the disruption controller last wrote it).
    fn store_with(n: usize, spec: Value, status: Value) -> super::super::store::Store {
        let store = super::super::store::Store::new();
        {
            let mut inner = store.lock();
            let pods = resource("", "pods").expect("pods");
            for i in 0..n {
                let mut p = pod(true, false);
                p["metadata"]["name"] = json!(format!("web-{i}"));
                inner.create(pods, "default", p).unwrap();
            }
            let pdb_res = resource("policy", "poddisruptionbudgets").expect("pdbs");
            let mut spec = spec;
            spec["selector"] = json!({"matchLabels": {"app": "web"}});
            inner
                .create(
                    pdb_res,
                    "default",
                    json!({"metadata": {"name": "web-pdb"}, "spec": spec}),
                )
                .unwrap();
            inner
                .update(pdb_res, "default", "web-pdb", "status", |o| {
                    let mut o = o.clone();
                    o["status"] = status;
                    Ok(o)
                })
                .unwrap();
        }
        store
    }

    fn stored_budget(store: &super::super::store::Store) -> Value {
        let pdb_res = resource("policy", "poddisruptionbudgets").expect("pdbs");
        store
            .lock()
            .get(pdb_res, "default", "web-pdb")
            .unwrap()
            .clone()
    }

    fn cause(e: &ApiError) -> String {
        e.causes[0]["message"].as_str().unwrap_or("").to_string()
    }

    #[test]
    fn the_stored_status_decides_not_a_count_of_the_pods() {
        // Two Ready pods, minAvailable 2: counted now, nothing may go. The status the
        // controller wrote (before a pod became Ready, say) allows one: the API server
        // goes by it, and so does the fake.
        let store = store_with(
            2,
            json!({"minAvailable": 2}),
            json!({"currentHealthy": 3, "desiredHealthy": 2, "expectedPods": 3,
                   "disruptionsAllowed": 1, "observedGeneration": 1}),
        );
        let mut inner = store.lock();
        let ok = evict(&mut inner, "default", "web-0", &json!({})).unwrap();
        assert_eq!(ok["code"], 201);
        drop(inner);
        // Charged with the eviction: one fewer, the pod listed as disrupted.
        let st = &stored_budget(&store)["status"];
        assert_eq!(st["disruptionsAllowed"], 0);
        assert!(st["disruptedPods"]["web-0"].is_string(), "{st}");
        // The next one is refused from the charged status, before any controller.
        let e = evict(&mut store.lock(), "default", "web-1", &json!({})).unwrap_err();
        assert_eq!(e.code, 429);
        assert!(
            cause(&e).contains("needs 2 healthy pods and has 3"),
            "{e:?}"
        );
    }

    #[test]
    fn a_status_of_an_older_spec_refuses_even_when_it_allows() {
        let store = store_with(
            3,
            json!({"maxUnavailable": 1}),
            json!({"currentHealthy": 3, "desiredHealthy": 2, "expectedPods": 3,
                   "disruptionsAllowed": 1, "observedGeneration": 0}),
        );
        let e = evict(&mut store.lock(), "default", "web-0", &json!({})).unwrap_err();
        assert_eq!(e.code, 429);
        assert!(cause(&e).contains("still being processed"), "{e:?}");
    }

    #[test]
    fn an_unready_pod_goes_by_the_unhealthy_pod_eviction_policy() {
        let unready = |store: &super::super::store::Store| {
            let pods = resource("", "pods").expect("pods");
            store
                .lock()
                .update(pods, "default", "web-0", "unready", |p| {
                    let mut p = p.clone();
                    p["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
                    Ok(p)
                })
                .unwrap();
        };
        // Default (IfHealthyBudget): the budget is not healthy (1 of 2 desired), so
        // the unready pod stays like any other.
        let broken = json!({"currentHealthy": 1, "desiredHealthy": 2, "expectedPods": 2,
                            "disruptionsAllowed": 0, "observedGeneration": 1});
        let store = store_with(2, json!({"minAvailable": 2}), broken.clone());
        unready(&store);
        let e = evict(&mut store.lock(), "default", "web-0", &json!({})).unwrap_err();
        assert_eq!(e.code, 429);
        // A healthy budget lets an unready pod go without charging it.
        let healthy = json!({"currentHealthy": 2, "desiredHealthy": 2, "expectedPods": 3,
                             "disruptionsAllowed": 0, "observedGeneration": 1});
        let store = store_with(3, json!({"minAvailable": 2}), healthy);
        unready(&store);
        assert_eq!(
            evict(&mut store.lock(), "default", "web-0", &json!({})).unwrap()["code"],
            201
        );
        assert_eq!(stored_budget(&store)["status"]["disruptionsAllowed"], 0);
        // AlwaysAllow: an unready pod goes whatever the budget says.
        let store = store_with(
            2,
            json!({"minAvailable": 2, "unhealthyPodEvictionPolicy": "AlwaysAllow"}),
            broken,
        );
        unready(&store);
        assert_eq!(
            evict(&mut store.lock(), "default", "web-0", &json!({})).unwrap()["code"],
            201
        );
        // A Ready pod still needs an allowed disruption.
        let e = evict(&mut store.lock(), "default", "web-1", &json!({})).unwrap_err();
        assert_eq!(e.code, 429);
    }

    #[test]
    fn every_eviction_request_is_in_the_audit() {
        let store = store_with(
            3,
            json!({"maxUnavailable": 1}),
            json!({"currentHealthy": 3, "desiredHealthy": 2, "expectedPods": 3,
                   "disruptionsAllowed": 1, "observedGeneration": 1}),
        );
        let nodes = resource("", "nodes").expect("nodes");
        let pods = resource("", "pods").expect("pods");
        {
            let mut inner = store.lock();
            inner
                .create(nodes, "", json!({"metadata": {"name": "n1"}, "spec": {}}))
                .unwrap();
            // Bound to a node: its deletion is graceful, so it stays terminating.
            inner
                .update(pods, "default", "web-0", "bind", |p| {
                    let mut p = p.clone();
                    p["spec"]["nodeName"] = json!("n1");
                    Ok(p)
                })
                .unwrap();
        }
        for _ in 0..2 {
            evict(&mut store.lock(), "default", "web-0", &json!({})).unwrap();
        }
        let asked = store
            .audit()
            .iter()
            .filter(|a| a.verb == "eviction-requested" && a.name == "web-0")
            .count();
        assert_eq!(asked, 2, "the second eviction of a terminating pod is seen");
    }
}
