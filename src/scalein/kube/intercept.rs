//! A kube client with a step before each request: the drains' rate limit
//! ([`crate::scalein::kube::ratelimit`]), the dry run's guard ([`crate::scalein::stages::preview`]) and the bound on
//! an answer's wait ([`answered_within`]) all sit here, in front of the real client,
//! so no code path can go around them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use kube::client::Body;

/// What the step answers: the response, from the real client or made up.
pub type Answer = Pin<Box<dyn Future<Output = Result<http::Response<Body>, kube::Error>> + Send>>;

/// `step` gets every request and the real client, and answers it.
pub fn intercepted(
    client: kube::Client,
    step: impl Fn(http::Request<Body>, kube::Client) -> Answer + Send + Sync + 'static,
) -> kube::Client {
    let ns = client.default_namespace().to_string();
    kube::Client::new(
        Intercept {
            client,
            step: Arc::new(step),
        },
        ns,
    )
}

type Step = dyn Fn(http::Request<Body>, kube::Client) -> Answer + Send + Sync;

#[derive(Clone)]
struct Intercept {
    client: kube::Client,
    step: Arc<Step>,
}

impl tower_service::Service<http::Request<Body>> for Intercept {
    type Response = http::Response<Body>;
    type Error = kube::Error;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        (self.step)(req, self.client.clone())
    }
}

/// How long a request may wait for its answer to begin: the API server's own bound
/// on a request that is not a watch (`--request-timeout`, 60 s by default), so no
/// answer the server could still give is cut short. A watch's answer begins at once
/// and its stream is not bounded here.
pub const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// `client`, each request failing once its answer has not begun within `within`.
/// kube-rs sets no read timeout: a request sent into a network partition (a dropped
/// connection nobody resets) would wait for the kernel to give up, a quarter of an
/// hour, and hold its drain that long after the network heals (leadership_model).
pub fn answered_within(client: kube::Client, within: std::time::Duration) -> kube::Client {
    intercepted(client, move |req, client| {
        let what = format!("{} {}", req.method(), req.uri().path());
        Box::pin(async move {
            match tokio::time::timeout(within, client.send(req)).await {
                Ok(answer) => answer,
                Err(_) => Err(kube::Error::Service(Box::new(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("{what}: no answer within {within:?}"),
                )))),
            }
        })
    })
}
