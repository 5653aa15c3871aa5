//! Counts and times every RPC of a gRPC service once, around the generated server,
//! so that no handler carries metrics code: `grpc_requests_total{method,code}` and
//! `grpc_request_duration_seconds{method}`.
//!
//! What it sees is what the client gets: the code of a trailers-only answer
//! (`grpc-status` in the headers: every error a handler returns, a request that fails
//! to decode, an unknown method), `Ok` for an answer that starts with a message, and
//! `Cancelled` when the call is dropped before it answered (the client went away, e.g.
//! at CA's call timeout). The time runs from the request's head to the response's
//! head: reading and decoding the request included, the response's encoding not.
//!
//! Allocation-free per call: the method label is one of [`METHODS`] (`&'static str`),
//! the code comes from the header's bytes, and the future is wrapped in place (the
//! generated server's future is already boxed, hence `Unpin`).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use tonic::server::NamedService;
use tonic::Code;
use tower_service::Service;

use crate::telemetry::metrics::Metrics;

/// The CloudProvider RPCs, named as in proto/externalgrpc.proto: the `method` label.
pub const METHODS: [&str; 15] = [
    "NodeGroups",
    "NodeGroupForNode",
    "PricingNodePrice",
    "PricingPodPrice",
    "GPULabel",
    "GetAvailableGPUTypes",
    "Cleanup",
    "Refresh",
    "NodeGroupTargetSize",
    "NodeGroupIncreaseSize",
    "NodeGroupDeleteNodes",
    "NodeGroupDecreaseTargetSize",
    "NodeGroupNodes",
    "NodeGroupTemplateNodeInfo",
    "NodeGroupGetOptions",
];

/// The label of a method not in [`METHODS`]: any name a client sends is one series.
pub const UNKNOWN_METHOD: &str = "unknown";

/// The `method` label for a request path `/<service>/<Method>` of `service`.
pub fn method_label(service: &str, path: &str) -> &'static str {
    let name = path
        .strip_prefix('/')
        .and_then(|p| p.strip_prefix(service))
        .and_then(|p| p.strip_prefix('/'));
    name.and_then(|n| METHODS.iter().find(|m| **m == n).copied())
        .unwrap_or(UNKNOWN_METHOD)
}

/// The gRPC code a response's head tells: its `grpc-status` (a trailers-only answer),
/// else `Ok` when HTTP said 200 (the code then follows in the trailers, and a handler
/// that returned `Ok` sent its message), else `Unknown`.
pub fn head_code<B>(resp: &http::Response<B>) -> Code {
    match resp.headers().get(tonic::Status::GRPC_STATUS) {
        Some(v) => match Code::from_bytes(v.as_bytes()) {
            Code::Internal if request_never_came(resp) => Code::Cancelled,
            code => code,
        },
        None if resp.status() == http::StatusCode::OK => Code::Ok,
        None => Code::Unknown,
    }
}

/// Whether an Internal answer is tonic's for a request whose message never came: a
/// client that cancels a call (RST_STREAM CANCEL, as CA's client does when the call's
/// context ends or the process stops) before its message arrived reads, through hyper,
/// as a clean end of the request body, which tonic answers "Missing request message."
/// Nobody receives that answer: the client went away, so it is counted Cancelled, not
/// as an error of this service.
fn request_never_came<B>(resp: &http::Response<B>) -> bool {
    resp.headers()
        .get(tonic::Status::GRPC_MESSAGE)
        .is_some_and(|m| {
            let m = m.as_bytes();
            m == b"Missing request message." || m == b"Missing%20request%20message."
        })
}

/// A gRPC service whose every call is counted and timed into `metrics`.
#[derive(Clone)]
pub struct Metered<S> {
    inner: S,
    metrics: &'static Metrics,
}

impl<S> Metered<S> {
    pub fn new(inner: S, metrics: &'static Metrics) -> Self {
        Self { inner, metrics }
    }
}

impl<S: NamedService> NamedService for Metered<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, RB> Service<http::Request<B>> for Metered<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>, Error = Infallible> + NamedService,
    S::Future: Unpin,
{
    type Response = http::Response<RB>;
    type Error = Infallible;
    type Future = MeteredCall<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = method_label(S::NAME, req.uri().path());
        MeteredCall {
            started: Instant::now(),
            method,
            metrics: self.metrics,
            done: false,
            inner: self.inner.call(req),
        }
    }
}

/// One call in flight: counted when its response head is ready, or on drop.
pub struct MeteredCall<F> {
    inner: F,
    started: Instant,
    method: &'static str,
    metrics: &'static Metrics,
    done: bool,
}

impl<F, RB> Future for MeteredCall<F>
where
    F: Future<Output = Result<http::Response<RB>, Infallible>> + Unpin,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let out = std::task::ready!(Pin::new(&mut self.inner).poll(cx));
        let code = match &out {
            Ok(resp) => head_code(resp),
            Err(never) => match *never {},
        };
        self.done = true;
        self.metrics.rpc(self.method, code, self.started);
        Poll::Ready(out)
    }
}

impl<F> Drop for MeteredCall<F> {
    fn drop(&mut self) {
        if !self.done {
            self.metrics.rpc(self.method, Code::Cancelled, self.started);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVICE: &str = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider";

    #[test]
    fn methods_are_the_protos_rpcs_in_order() {
        let proto = include_str!("../../proto/externalgrpc.proto");
        let rpcs: Vec<&str> = proto
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .map(|l| l.split('(').next().unwrap().trim())
            .collect();
        assert_eq!(rpcs, METHODS);
        assert_eq!(SERVICE, crate::proto::cloud_provider_server::SERVICE_NAME);
    }

    #[test]
    fn labels_come_from_the_path_and_unknown_names_share_one() {
        let p = |m: &str| format!("/{SERVICE}/{m}");
        for m in METHODS {
            assert_eq!(method_label(SERVICE, &p(m)), m);
        }
        assert_eq!(method_label(SERVICE, &p("NoSuchRpc")), UNKNOWN_METHOD);
        assert_eq!(method_label(SERVICE, &p("")), UNKNOWN_METHOD);
        assert_eq!(
            method_label(SERVICE, "/other.Service/NodeGroups"),
            UNKNOWN_METHOD
        );
        assert_eq!(method_label(SERVICE, "NodeGroups"), UNKNOWN_METHOD);
    }

    #[test]
    fn the_code_is_the_heads_grpc_status_or_ok() {
        let with = |status: u16, grpc: Option<&'static str>| {
            let mut r = http::Response::new(());
            *r.status_mut() = http::StatusCode::from_u16(status).unwrap();
            if let Some(g) = grpc {
                r.headers_mut()
                    .insert("grpc-status", http::HeaderValue::from_static(g));
            }
            head_code(&r)
        };
        assert_eq!(with(200, None), Code::Ok);
        assert_eq!(with(200, Some("5")), Code::NotFound);
        assert_eq!(with(200, Some("12")), Code::Unimplemented);
        assert_eq!(with(200, Some("0")), Code::Ok);
        assert_eq!(with(200, Some("junk")), Code::Unknown);
        assert_eq!(with(503, None), Code::Unknown);
    }

    #[test]
    fn a_request_whose_message_never_came_is_cancelled_other_internal_errors_stay() {
        let with = |grpc: &'static str, message: Option<&'static str>| {
            let mut r = http::Response::new(());
            r.headers_mut()
                .insert("grpc-status", http::HeaderValue::from_static(grpc));
            if let Some(m) = message {
                r.headers_mut()
                    .insert("grpc-message", http::HeaderValue::from_static(m));
            }
            head_code(&r)
        };
        assert_eq!(
            with("13", Some("Missing%20request%20message.")),
            Code::Cancelled
        );
        assert_eq!(
            with("13", Some("Missing request message.")),
            Code::Cancelled
        );
        assert_eq!(with("13", None), Code::Internal);
        assert_eq!(with("13", Some("something%20broke")), Code::Internal);
        assert_eq!(
            with("14", Some("Missing%20request%20message.")),
            Code::Unavailable
        );
    }

    /// What tonic answers when a unary call's request body ends without a message (what
    /// hyper makes of a client's RST_STREAM CANCEL before the message): its text is
    /// the one [`request_never_came`] looks for. Any tonic unary server answers alike;
    /// the health service needs no provider behind it.
    #[tokio::test]
    async fn tonics_answer_to_a_request_without_its_message_is_recognised() {
        use tower_service::Service as _;
        let (_reporter, mut svc) = tonic_health::server::health_reporter();
        let req = http::Request::builder()
            .method("POST")
            .uri("/grpc.health.v1.Health/Check")
            .header("content-type", "application/grpc")
            .body(tonic::body::Body::empty())
            .unwrap();
        let resp = svc.call(req).await.unwrap();
        assert_eq!(
            resp.headers()
                .get(tonic::Status::GRPC_STATUS)
                .map(|v| v.as_bytes()),
            Some(&b"13"[..]),
            "tonic answers Internal: {:?}",
            resp.headers()
        );
        assert_eq!(head_code(&resp), Code::Cancelled, "{:?}", resp.headers());
    }

    /// Allocations made by this thread (the test binary's allocator counts them).
    mod counting {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local! {
            static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
        }

        pub struct Counting;

        // SAFETY: every call goes to System unchanged; only a counter is added.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                ALLOCATIONS.with(|n| n.set(n.get() + 1));
                unsafe { System.alloc(layout) }
            }
            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                unsafe { System.dealloc(ptr, layout) }
            }
            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
                ALLOCATIONS.with(|n| n.set(n.get() + 1));
                unsafe { System.realloc(ptr, layout, new_size) }
            }
        }

        #[global_allocator]
        static COUNTING: Counting = Counting;

        pub fn allocations() -> u64 {
            ALLOCATIONS.with(|n| n.get())
        }
    }

    /// A service that answers at once, with `grpc-status` when the path says so.
    #[derive(Clone)]
    struct Answers;

    impl NamedService for Answers {
        const NAME: &'static str = SERVICE;
    }

    impl Service<http::Request<()>> for Answers {
        type Response = http::Response<()>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<http::Response<()>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<()>) -> Self::Future {
            let mut r = http::Response::new(());
            if req.uri().path().ends_with("/Refresh") {
                r.headers_mut().insert(
                    tonic::Status::GRPC_STATUS,
                    http::HeaderValue::from_static("14"),
                );
            }
            std::future::ready(Ok(r))
        }
    }

    #[test]
    fn counting_and_timing_a_call_allocates_nothing() {
        let metrics: &'static Metrics = Box::leak(Box::new(Metrics::new()));
        let mut svc = Metered::new(Answers, metrics);
        let requests = |n: usize| -> Vec<http::Request<()>> {
            (0..n)
                .flat_map(|_| ["NodeGroupForNode", "NodeGroups", "NoSuchRpc"])
                .map(|m| {
                    http::Request::builder()
                        .uri(format!("/{SERVICE}/{m}"))
                        .body(())
                        .unwrap()
                })
                .collect()
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut run = |reqs: Vec<http::Request<()>>| {
            for req in reqs {
                let mut call = svc.call(req);
                assert!(Pin::new(&mut call).poll(&mut cx).is_ready());
            }
        };
        // The first call of each (method, code) creates its series.
        run(requests(1));
        let before = counting::allocations();
        let reqs = requests(1000);
        let built = counting::allocations();
        assert!(built > before, "the counter counts");
        run(reqs);
        // Requests are built before the counted calls (freeing is not counted).
        assert_eq!(
            counting::allocations() - built,
            0,
            "allocations in 3000 calls"
        );
        let text = metrics.encode();
        for series in [
            "grpc_requests_total{method=\"NodeGroupForNode\",code=\"Ok\"} 1001",
            "grpc_requests_total{method=\"unknown\",code=\"Ok\"} 1001",
            "grpc_request_duration_seconds_count{method=\"NodeGroups\"} 1001",
        ] {
            assert!(text.contains(series), "{series} in\n{text}");
        }
        // A call dropped before it answered is Cancelled; a grpc-status is its code.
        drop(
            svc.call(
                http::Request::builder()
                    .uri(format!("/{SERVICE}/Cleanup"))
                    .body(())
                    .unwrap(),
            ),
        );
        let mut refresh = svc.call(
            http::Request::builder()
                .uri(format!("/{SERVICE}/Refresh"))
                .body(())
                .unwrap(),
        );
        assert!(Pin::new(&mut refresh).poll(&mut cx).is_ready());
        drop(refresh);
        let text = metrics.encode();
        for series in [
            "grpc_requests_total{method=\"Cleanup\",code=\"Cancelled\"} 1",
            "grpc_requests_total{method=\"Refresh\",code=\"Unavailable\"} 1",
        ] {
            assert!(text.contains(series), "{series} in\n{text}");
        }
        assert!(!text.contains("method=\"Refresh\",code=\"Cancelled\""));
    }
}
