//! A kube client with a step before each request: the drains' rate limit
//! ([`super::ratelimit`]) and the dry run's guard ([`super::dry_run`]) both sit here,
//! in front of the real client, so no code path can go around them.

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
