//! The HTTP face of the in-memory API server: the URL forms, verbs and content types
//! kube-rs uses, with Status errors that name what was wrong.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::watch;

use super::eviction;
use super::preconditions::check_uid_precondition;
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{resource, ApiError, EventType, ResourceDef, Store};

pub struct Ctx {
    pub store: Arc<Store>,
    pub stats: Arc<super::RequestStats>,
    /// Bumped on restart so open watches end.
    pub epoch: watch::Receiver<u64>,
    /// What SelfSubjectAccessReviews answer: `None` allows everything.
    pub grants: Arc<parking_lot::Mutex<Option<Vec<super::Grant>>>>,
    /// Refusals on purpose (RBAC 403s, APF 429s).
    pub faults: Arc<parking_lot::Mutex<super::Faults>>,
}

fn json_response(code: StatusCode, v: &Value) -> Response {
    (
        code,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn error(e: ApiError) -> Response {
    json_response(
        StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &e.to_status(),
    )
}

/// What a URL names.
struct Target {
    res: &'static ResourceDef,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(path: &str) -> Result<Target, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!("the server could not find the requested resource ({path})"),
            ))
        }
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..] => {
            (Some(ns.to_string()), [&[*plural][..], tail].concat())
        }
        other => (None, other.to_vec()),
    };
    let plural = rest.first().copied().unwrap_or("");
    let res = resource(group, plural).ok_or_else(|| {
        ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    })?;
    Ok(Target {
        res,
        ns,
        name: rest.get(1).map(|s| s.to_string()),
        sub: rest.get(2).map(|s| s.to_string()),
    })
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            400,
            "BadRequest",
            format!("the request body is not valid JSON: {e}"),
        )
    })
}

/// RFC 7386 merge patch.
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// A strategic merge patch, as far as the objects the service patches need it: a
/// merge patch, except that a list of conditions (`status.conditions`, a merge list
/// keyed by `type` on every built-in kind) merges element by element by type instead
/// of being replaced.
pub(crate) fn strategic_merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        match (k.as_str(), v, t.get_mut(k)) {
            (_, Value::Null, _) => {
                t.remove(k);
            }
            ("conditions", Value::Array(new), Some(Value::Array(old))) => {
                for c in new {
                    match old.iter_mut().find(|o| o["type"] == c["type"]) {
                        Some(o) => merge(o, c),
                        None => old.push(c.clone()),
                    }
                }
            }
            (_, Value::Object(_), Some(existing)) => strategic_merge(existing, v),
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

/// The verb (as RBAC and the audit name it) and `resource[/subresource]` of a request.
fn verb_and_resource(
    method: &Method,
    t: &Target,
    q: &BTreeMap<String, String>,
) -> (&'static str, String) {
    let watching = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let verb = match (method, &t.name, watching) {
        (&Method::GET, None, true) => "watch",
        (&Method::GET, None, false) => "list",
        (&Method::GET, Some(_), _) => "get",
        (&Method::POST, _, _) => "create",
        (&Method::PUT, _, _) => "update",
        (&Method::PATCH, _, _) => "patch",
        (&Method::DELETE, _, _) => "delete",
        _ => "other",
    };
    let res_label = match &t.sub {
        Some(s) => format!("{}/{s}", t.res.plural),
        None => t.res.plural.to_string(),
    };
    (verb, res_label)
}

pub async fn handle(
    State(ctx): State<Arc<Ctx>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
    body: Bytes,
) -> Response {
    // A request behind a slow admission webhook ([`super::SimCluster::slow_requests`])
    // is taken on and carried out to the end even if its client goes away meanwhile,
    // as a write the API server already accepted: the answer is lost, not the effect.
    let key = parse_path(uri.path()).ok().map(|t| {
        let key = verb_and_resource(&method, &t, &q);
        ((key.0.to_string(), key.1), t.name.unwrap_or_default())
    });
    let (behind_webhook, answer_late) = {
        let f = ctx.faults.lock();
        key.as_ref().map_or((false, None), |(k, name)| {
            (
                f.slow_requests.contains_key(k)
                    || f.slow_objects
                        .contains_key(&(k.0.clone(), k.1.clone(), name.clone())),
                f.slow_answers.get(k).copied(),
            )
        })
    };
    let response = if behind_webhook {
        tokio::spawn(serve_request(ctx, method, uri, headers, q, body))
            .await
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
    } else {
        serve_request(ctx, method, uri, headers, q, body).await
    };
    // The effect is in; only the answer is slow ([`super::SimCluster::slow_answers`]).
    if let Some(late) = answer_late {
        tokio::time::sleep(late).await;
    }
    response
}

async fn serve_request(
    ctx: Arc<Ctx>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    q: BTreeMap<String, String>,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    if path == "/version" {
        return json_response(
            StatusCode::OK,
            &json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-sim", "platform": "linux/amd64"}),
        );
    }
    if path == "/api" {
        return json_response(
            StatusCode::OK,
            &json!({"kind": "APIVersions", "versions": ["v1"]}),
        );
    }
    let t = match parse_path(&path) {
        Ok(t) => t,
        Err(e) => return error(e),
    };
    let (verb, res_label) = verb_and_resource(&method, &t, &q);
    let user = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if user.is_some_and(|u| ctx.faults.lock().cut.contains(u)) {
        // Behind a partition: nothing reaches the server, nothing comes back.
        return std::future::pending().await;
    }
    let user_agent = headers
        .get(axum::http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok());
    ctx.stats
        .count(user, user_agent, verb, t.res.group, &res_label);
    let arrived = crate::clock::Instant::now();
    let name = t.name.clone().unwrap_or_default();
    let response = answer(
        &ctx, &method, &path, &headers, t, verb, &res_label, user, q, body,
    )
    .await;
    if matches!(verb, "create" | "update" | "patch" | "delete") {
        ctx.stats.wrote(super::WriteSeen {
            at: arrived,
            user: user.unwrap_or_default().to_string(),
            verb: verb.to_string(),
            resource: res_label,
            name,
            status: response.status().as_u16(),
        });
    }
    response
}

/// A request that reached the server, answered: latency and refusals first, then the
/// store.
#[allow(clippy::too_many_arguments)]
async fn answer(
    ctx: &Arc<Ctx>,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    t: Target,
    verb: &'static str,
    res_label: &str,
    user: Option<&str>,
    q: BTreeMap<String, String>,
    body: Bytes,
) -> Response {
    let res_label = res_label.to_string();
    let latency = {
        let f = ctx.faults.lock();
        f.latency
            + f.slow_requests
                .get(&(verb.to_string(), res_label.clone()))
                .copied()
                .unwrap_or_default()
            + f.slow_objects
                .get(&(
                    verb.to_string(),
                    res_label.clone(),
                    t.name.clone().unwrap_or_default(),
                ))
                .copied()
                .unwrap_or_default()
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    {
        let mut faults = ctx.faults.lock();
        if faults
            .denied
            .iter()
            .any(|(v, r)| v == verb && *r == res_label)
        {
            return error(ApiError::new(
                403,
                "Forbidden",
                format!(
                    "{res_label} is forbidden: User \"{}\" cannot {verb} resource \"{res_label}\"",
                    user.unwrap_or("system:anonymous")
                ),
            ));
        }
        let refusal = faults
            .refused
            .get_mut(&(verb.to_string(), res_label.clone()))
            .filter(|(n, _)| *n > 0)
            .map(|(n, how)| {
                *n -= 1;
                *how
            });
        match refusal {
            Some(super::Refusal::TooManyRequests) | None => {}
            Some(super::Refusal::Forbidden) => {
                return error(ApiError::new(
                    403,
                    "Forbidden",
                    format!("admission webhook \"deny.sim.ca-asg-provider.io\" denied the request: {verb} {res_label} refused"),
                ))
            }
            Some(super::Refusal::Internal) => {
                return error(ApiError::new(
                    500,
                    "InternalError",
                    "Internal error occurred: etcdserver: request timed out",
                ))
            }
            Some(super::Refusal::Unavailable) => {
                return error(ApiError::new(
                    503,
                    "ServiceUnavailable",
                    "the server is currently unable to handle the request",
                ))
            }
        }
        let throttled = refusal == Some(super::Refusal::TooManyRequests)
            || faults
                .throttled
                .get_mut(&(verb.to_string(), res_label.clone()))
                .filter(|n| **n > 0)
                .map(|n| *n -= 1)
                .is_some();
        if throttled {
            let mut body = ApiError::new(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
            )
            .to_status();
            body["details"] = json!({"retryAfterSeconds": 1});
            let mut r = json_response(StatusCode::TOO_MANY_REQUESTS, &body);
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                "1".parse().expect("header"),
            );
            return r;
        }
    }
    let ns = t.ns.clone().unwrap_or_default();
    if t.res.plural == "selfsubjectaccessreviews" {
        return match (verb, parse_body(&body)) {
            ("create", Ok(review)) => {
                json_response(StatusCode::CREATED, &access_review(ctx, review))
            }
            (_, Err(e)) => error(e),
            _ => error(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("{method} is not supported on {path}"),
            )),
        };
    }
    let result = match verb {
        "watch" => return watch_stream(ctx.clone(), t, q).await,
        // Writes answer the stored object itself; reads and Statuses are built here.
        "list" => list(ctx, &t, &q).map(Arc::new),
        "get" => get(ctx, &t).map(Arc::new),
        "create" => create(ctx, &t, &ns, &body),
        "update" => parse_body(&body).and_then(|obj| {
            let name = t.name.clone().unwrap_or_default();
            ctx.store.lock().update(t.res, &ns, &name, "update", |old| {
                let mut new = obj.clone();
                if t.sub.as_deref() == Some("status") {
                    let mut o = old.clone();
                    o["status"] = new["status"].take();
                    o["metadata"]["resourceVersion"] = new["metadata"]["resourceVersion"].clone();
                    return Ok(o);
                }
                if t.sub.is_none() && !old["status"].is_null() && new["status"].is_null() {
                    new["status"] = old["status"].clone();
                }
                Ok(new)
            })
        }),
        "patch" => patch(ctx, &t, &ns, headers, &body),
        "delete" => parse_body(&body).and_then(|opts| {
            let grace = q
                .get("gracePeriodSeconds")
                .and_then(|g| g.parse().ok())
                .or(opts["gracePeriodSeconds"].as_i64());
            let mut inner = ctx.store.lock();
            let name = t.name.as_deref().unwrap_or("");
            if let Some(obj) = inner.get(t.res, &ns, name) {
                check_uid_precondition(obj, &opts["preconditions"])?;
            }
            inner.delete(t.res, &ns, name, grace)
        }),
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("{method} is not supported on {path}"),
        )),
    };
    match result {
        Ok(v) => json_response(
            if verb == "create" {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            },
            &v,
        ),
        Err(e) => error(e),
    }
}

/// Answers a SelfSubjectAccessReview from the grants set on the cluster.
fn access_review(ctx: &Ctx, mut review: Value) -> Value {
    let attrs = &review["spec"]["resourceAttributes"];
    let field = |k: &str| attrs[k].as_str().unwrap_or("").to_string();
    let resource = match field("subresource").as_str() {
        "" => field("resource"),
        sub => format!("{}/{sub}", field("resource")),
    };
    let (verb, group) = (field("verb"), field("group"));
    let allowed = match &*ctx.grants.lock() {
        None => true,
        Some(grants) => grants.iter().any(|g| g.allows(&verb, &group, &resource)),
    };
    review["status"] = json!({
        "allowed": allowed,
        "reason": if allowed { "granted by the simulated RBAC" } else { "no rule grants it" },
    });
    review
}

fn selectors(q: &BTreeMap<String, String>) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let ls = LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
        .map_err(|m| ApiError::new(400, "BadRequest", m))?;
    let fs = FieldSelector::parse(q.get("fieldSelector").map(String::as_str).unwrap_or(""))
        .map_err(|m| ApiError::new(400, "BadRequest", m))?;
    Ok((ls, fs))
}

fn list(ctx: &Ctx, t: &Target, q: &BTreeMap<String, String>) -> Result<Value, ApiError> {
    let (ls, fs) = selectors(q)?;
    let (items, rv) = {
        let inner = ctx.store.lock();
        (inner.list(t.res, t.ns.as_deref()), inner.rv())
    };
    let items: Vec<Value> = items
        .into_iter()
        .filter(|o| ls.matches_object(o) && fs.matches(o))
        .map(Arc::unwrap_or_clone)
        .collect();
    Ok(json!({
        "apiVersion": t.res.api_version(), "kind": format!("{}List", t.res.kind),
        "metadata": {"resourceVersion": rv.to_string()}, "items": items,
    }))
}

fn get(ctx: &Ctx, t: &Target) -> Result<Value, ApiError> {
    let name = t.name.as_deref().unwrap_or("");
    let v = ctx
        .store
        .lock()
        .get(t.res, t.ns.as_deref().unwrap_or(""), name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(t.res, name))?;
    Ok(v)
}

fn create(ctx: &Ctx, t: &Target, ns: &str, body: &Bytes) -> Result<Arc<Value>, ApiError> {
    let obj = parse_body(body)?;
    if t.sub.as_deref() == Some("eviction") && t.res.plural == "pods" {
        let name = t.name.as_deref().unwrap_or("");
        return eviction::evict(&mut ctx.store.lock(), ns, name, &obj).map(Arc::new);
    }
    if t.name.is_some() {
        return Err(ApiError::new(
            405,
            "MethodNotAllowed",
            "POST to a named object is not supported",
        ));
    }
    ctx.store.lock().create(t.res, ns, obj)
}

fn patch(
    ctx: &Ctx,
    t: &Target,
    ns: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Arc<Value>, ApiError> {
    let ctype = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let name = t.name.clone().unwrap_or_default();
    let p = if ctype.contains("yaml") {
        serde_saphyr::from_slice::<Value>(body).map_err(|e| {
            ApiError::new(
                400,
                "BadRequest",
                format!("the patch is not valid YAML: {e}"),
            )
        })?
    } else {
        parse_body(body)?
    };
    // The audit tells a status patch apart (the real audit log's subresource).
    let verb = if t.sub.as_deref() == Some("status") {
        "patch status"
    } else {
        "patch"
    };
    ctx.store.lock().update(t.res, ns, &name, verb, |old| {
        let mut new = old.clone();
        // The optimistic-concurrency check applies only when the patch names a version.
        new["metadata"]["resourceVersion"] = Value::Null;
        if ctype.starts_with("application/json-patch+json") {
            let ops: json_patch::Patch = serde_json::from_value(p.clone()).map_err(|e| {
                ApiError::new(
                    400,
                    "BadRequest",
                    format!("the JSON patch does not parse: {e}"),
                )
            })?;
            json_patch::patch(&mut new, &ops).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the JSON patch does not apply: {e}"),
                )
            })?;
        } else if ctype.starts_with("application/strategic-merge-patch+json") {
            strategic_merge(&mut new, &p);
        } else if ctype.starts_with("application/merge-patch+json")
            || ctype.starts_with("application/apply-patch+yaml")
        {
            merge(&mut new, &p);
        } else {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("the patch content type {ctype:?} is not supported"),
            ));
        }
        if new["metadata"]["resourceVersion"].is_null() {
            new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        }
        // Through the status subresource the spec stays as it was (as the API
        // server's status strategies reset it; metadata goes through).
        if t.sub.as_deref() == Some("status") {
            new["spec"] = old["spec"].clone();
        }
        Ok(new)
    })
}

async fn watch_stream(ctx: Arc<Ctx>, t: Target, q: BTreeMap<String, String>) -> Response {
    let (ls, fs) = match selectors(&q) {
        Ok(s) => s,
        Err(e) => return error(e),
    };
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1800);
    let (past, mut rx) = if from == 0 {
        // rv 0 / absent: start with the current state as ADDED, then changes.
        let inner = ctx.store.lock();
        let rx = ctx.store.subscribe();
        let items = inner.list(t.res, t.ns.as_deref());
        let now = inner.rv();
        drop(inner);
        let past: Vec<Bytes> = items
            .iter()
            .filter(|o| ls.matches_object(o) && fs.matches(o))
            .map(|o| watch_line("ADDED", o))
            .collect();
        (past, (rx, now))
    } else {
        match ctx.store.since(from) {
            Ok((changes, rx)) => {
                let mut past = Vec::new();
                let mut last = from;
                for c in changes {
                    last = last.max(c.rv);
                    if c.res != t.res {
                        continue;
                    }
                    if let Some(ns) = &t.ns {
                        if c.object["metadata"]["namespace"].as_str() != Some(ns) {
                            continue;
                        }
                    }
                    if let Some(ev) = event_for(&c.kind, &c.object, c.old.as_deref(), &ls, &fs) {
                        past.push(ev);
                    }
                }
                (past, (rx, last))
            }
            Err(e) => {
                let ev = json!({"type": "ERROR", "object": e.to_status()});
                return json_response(StatusCode::OK, &ev);
            }
        }
    };
    let (tx, body_rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(256);
    let mut epoch = ctx.epoch.clone();
    let start_epoch = *epoch.borrow();
    let res = t.res;
    let ns = t.ns.clone();
    let faults = ctx.faults.clone();
    tokio::spawn(async move {
        for ev in past {
            if tx.send(Ok(ev)).await.is_err() {
                return;
            }
        }
        let (ref mut sub, last_rv) = rx;
        let deadline = crate::clock::Instant::now() + Duration::from_secs(timeout);
        loop {
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(deadline) => return,
                changed = epoch.changed() => {
                    if changed.is_err() || *epoch.borrow() != start_epoch { return; }
                }
                msg = sub.recv() => {
                    let c = match msg {
                        Ok(c) => c,
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                            let e = ApiError::new(410, "Expired", "watch fell behind; re-list");
                            let _ = tx.send(Ok(Bytes::from(format!("{}\n", json!({"type": "ERROR", "object": e.to_status()}))))).await;
                            return;
                        }
                        Err(_) => return,
                    };
                    if c.rv <= last_rv || c.res != res {
                        continue;
                    }
                    if let Some(ns) = &ns {
                        if c.object["metadata"]["namespace"].as_str() != Some(ns) { continue; }
                    }
                    if let Some(ev) = event_for(&c.kind, &c.object, c.old.as_deref(), &ls, &fs) {
                        let lag = faults.lock().watch_lag;
                        if !lag.is_zero() {
                            tokio::time::sleep(lag).await;
                        }
                        if tx.send(Ok(ev)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(body_rx);
    Response::builder()
        .status(StatusCode::OK)
        .header(axum::http::header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// One line of a watch stream, serialized straight from the stored object (a watch
/// of every pod in a storm sends thousands of these a second: no copy of the object).
fn watch_line(kind: &str, object: &Value) -> Bytes {
    #[derive(serde::Serialize)]
    struct WatchEvent<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        object: &'a Value,
    }
    let mut line = serde_json::to_vec(&WatchEvent { kind, object }).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// The event a selector-filtered watch sees: an object that starts matching is
/// ADDED, one that stops matching is DELETED.
fn event_for(
    kind: &EventType,
    obj: &Value,
    old: Option<&Value>,
    ls: &LabelSelector,
    fs: &FieldSelector,
) -> Option<Bytes> {
    let m = |o: &Value| ls.matches_object(o) && fs.matches(o);
    let now = m(obj);
    let before = old.map(m).unwrap_or(false);
    let t = match (kind, before, now) {
        (EventType::Deleted, _, true) => "DELETED",
        (EventType::Added, _, true) => "ADDED",
        (EventType::Modified, true, true) => "MODIFIED",
        (EventType::Modified, false, true) => "ADDED",
        (EventType::Modified, true, false) => "DELETED",
        _ => return None,
    };
    Some(watch_line(t, obj))
}
