//! A replica that does not lead changes nothing in the cluster: the engine's clients
//! (the drains', the source loops', the pod Events') answer every write but an Event
//! themselves while this replica does not lead, whatever path asked for it. A pass
//! that began as the leader and whose AWS read outlasted its term (the soak, seed
//! 3008: a warm-pool rest written on a Node 2.6 s after its replica stepped down) is
//! stopped here, at the last moment before the request leaves (after the rate
//! limiter's wait), so no source has to remember to look again.
//!
//! Not fenced: the Lease's own client (the election), and CA's answer client (a
//! follower that CA asks to delete a node marks the Node for the leader to drain).
//! What was sent before the step-down may still land; the soak's checker judges
//! those by when they were sent.

use std::sync::Arc;

use kube::client::Body;

use crate::scalein::kube::intercept::Answer;

/// Whether the request only reads or says something (an Event, created or patched
/// as a series): what a replica may send whether it leads or not, and all a dry run
/// sends.
pub fn reads_or_says(method: &http::Method, path: &str) -> bool {
    if matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    ) {
        return true;
    }
    if !matches!(*method, http::Method::POST | http::Method::PATCH) {
        return false;
    }
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let Some(i) = segs.iter().rposition(|s| *s == "events") else {
        return false;
    };
    let core = segs.get(1..3) == Some(&["api", "v1"][..]);
    let events_api = segs.get(1..4) == Some(&["apis", "events.k8s.io", "v1"][..]);
    (core || events_api)
        && i >= 2
        && segs[i - 2] == "namespaces"
        && (i + 1 == segs.len() || (i + 2 == segs.len() && *method == http::Method::PATCH))
}

/// A client that sends a write only while `leads()` says this replica leads, asked
/// as the request leaves; otherwise it answers 403 itself, naming the fence.
pub fn fenced(client: kube::Client, leads: Arc<dyn Fn() -> bool + Send + Sync>) -> kube::Client {
    crate::scalein::kube::intercept::intercepted(client, move |req, client| {
        if reads_or_says(req.method(), req.uri().path()) || leads() {
            return Box::pin(async move { client.send(req).await });
        }
        let what = format!("{} {}", req.method(), req.uri().path());
        tracing::warn!(request = %what, "this replica does not lead: the write is not sent (the leader acts)");
        refused(&format!(
            "{what} was not sent: this replica does not lead (leader election)"
        ))
    })
}

/// A 403 answered here, with `message`.
pub fn refused(message: &str) -> Answer {
    let status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Forbidden",
        "code": 403,
    });
    let answer = http::Response::builder()
        .status(403)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(status.to_string().into_bytes()))
        .expect("a static response");
    Box::pin(async move { Ok(answer) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_events_pass_every_other_request_is_a_write() {
        use http::Method;
        let cases = [
            (Method::GET, "/api/v1/nodes/n1", true),
            (Method::GET, "/api/v1/pods?watch=true", true),
            (Method::HEAD, "/api/v1/nodes", true),
            (Method::POST, "/api/v1/namespaces/default/events", true),
            (Method::PATCH, "/api/v1/namespaces/default/events/e1", true),
            (
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/default/events",
                true,
            ),
            (
                Method::PATCH,
                "/apis/events.k8s.io/v1/namespaces/default/events/e1/",
                true,
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/default/events/e1",
                false,
            ),
            (Method::PUT, "/api/v1/namespaces/default/events/e1", false),
            (Method::PATCH, "/api/v1/nodes/n1", false),
            (Method::PATCH, "/api/v1/nodes/n1/status", false),
            (
                Method::POST,
                "/api/v1/namespaces/shop/pods/p/eviction",
                false,
            ),
            (Method::DELETE, "/api/v1/namespaces/shop/pods/p", false),
            (
                Method::POST,
                "/api/v1/namespaces/events/pods/p/eviction",
                false,
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/x/configmaps/events",
                false,
            ),
            (
                Method::POST,
                "/apis/example.com/v1/namespaces/x/events",
                false,
            ),
            (Method::POST, "/api/v1/events", false),
            (
                Method::POST,
                "/api/v1/namespaces/default/pods/events",
                false,
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x",
                false,
            ),
            (
                Method::POST,
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases",
                false,
            ),
            (
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/default/events/e1",
                false,
            ),
        ];
        for (method, path, passes) in cases {
            assert_eq!(reads_or_says(&method, path), passes, "{method} {path}");
        }
    }
}
