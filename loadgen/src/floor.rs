//! The transport floor: a CloudProvider server that answers each request of CA's loop
//! with the bytes the real server gave to the same request, recorded once beforehand.
//! It decodes no message and runs no provider code, but it runs on the same tonic
//! transport, settings and front door as `serve`. Its CPU per loop is therefore what
//! the gRPC stack (tonic, h2, hyper, the kernel's loopback) costs by itself, and what
//! the real server spends above it is the part this project's code adds.
//! `loadgen --floor` starts it as a child process
//! (`loadgen --serve-floor FILE --floor-listen ADDR`) and alternates loops between the
//! two servers.
//!
//! Per RPC the floor does only a table look-up: the request's protobuf bytes are
//! hashed (SipHash over a few hundred bytes for NodeGroupForNode, nothing for the
//! empty requests) and the recorded response is handed to tonic as it is, with no
//! re-encoding.
//!
//! The answers file is JSON with the protobuf bytes in base64:
//! `{"answers": [{"path": "/<package>.CloudProvider/<Method>", "request": BASE64,
//! "answer": {"message": BASE64} | {"status": {"code": N, "message": "..."}}}]}`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use anyhow::Context as _;
use base64::Engine as _;
use bytes::{Buf as _, BufMut as _, Bytes};
use serde::{Deserialize, Serialize};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

use ca_asg_provider::config::ListenAddr;
use ca_asg_provider::grpc::Listener;
use ca_asg_provider::proto::cloud_provider_server::SERVICE_NAME;

/// One request of CA's loop, as the typed client encodes it, and the real server's
/// answer: the response message's bytes or the status it answered with.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The gRPC path, `/<package>.CloudProvider/<Method>`.
    pub path: String,
    pub request: Vec<u8>,
    pub answer: Result<Vec<u8>, Status>,
}

/// The gRPC path of a CloudProvider method.
pub fn path_of(method: &str) -> String {
    format!("/{SERVICE_NAME}/{method}")
}

#[derive(Serialize, Deserialize)]
struct AnswersFile {
    answers: Vec<StoredAnswer>,
}

#[derive(Serialize, Deserialize)]
struct StoredAnswer {
    path: String,
    request: String,
    answer: Stored,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Stored {
    Message(String),
    Status { code: i32, message: String },
}

/// Writes the answers file (format in the module comment).
pub fn write(file: &Path, answers: &[Recorded]) -> anyhow::Result<()> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let stored = AnswersFile {
        answers: answers
            .iter()
            .map(|r| StoredAnswer {
                path: r.path.clone(),
                request: b64.encode(&r.request),
                answer: match &r.answer {
                    Ok(response) => Stored::Message(b64.encode(response)),
                    Err(s) => Stored::Status {
                        code: s.code() as i32,
                        message: s.message().to_string(),
                    },
                },
            })
            .collect(),
    };
    std::fs::write(file, serde_json::to_vec(&stored)?)
        .with_context(|| format!("writing the floor's answers to {}", file.display()))
}

/// Reads an answers file written by [`write`].
pub fn read(file: &Path) -> anyhow::Result<Vec<Recorded>> {
    let what = || format!("reading the floor's answers from {}", file.display());
    let text = std::fs::read(file).with_context(what)?;
    let stored: AnswersFile = serde_json::from_slice(&text).with_context(what)?;
    let b64 = base64::engine::general_purpose::STANDARD;
    stored
        .answers
        .into_iter()
        .map(|a| -> anyhow::Result<Recorded> {
            let request = b64
                .decode(&a.request)
                .with_context(|| format!("{}: a request of {}", what(), a.path))?;
            let answer = match a.answer {
                Stored::Message(m) => Ok(b64
                    .decode(&m)
                    .with_context(|| format!("{}: an answer of {}", what(), a.path))?),
                Stored::Status { code, message } => {
                    Err(Status::new(tonic::Code::from(code), message))
                }
            };
            Ok(Recorded {
                path: a.path,
                request,
                answer,
            })
        })
        .collect()
}

/// The recorded answers, by path and then by request bytes.
#[derive(Debug, Default)]
pub struct Table {
    methods: HashMap<String, Arc<Method>>,
}

/// The answers of one method.
#[derive(Debug)]
struct Method {
    path: String,
    answers: HashMap<Vec<u8>, Result<Bytes, Status>>,
}

impl Table {
    pub fn new(answers: impl IntoIterator<Item = Recorded>) -> Self {
        let mut methods: HashMap<String, Method> = HashMap::new();
        for r in answers {
            let m = methods.entry(r.path.clone()).or_insert_with(|| Method {
                path: r.path.clone(),
                answers: HashMap::new(),
            });
            m.answers.insert(r.request, r.answer.map(Bytes::from));
        }
        Self {
            methods: methods
                .into_iter()
                .map(|(path, m)| (path, Arc::new(m)))
                .collect(),
        }
    }

    /// The answers for `path`; a path never recorded gets none, so each of its
    /// requests is answered NotFound.
    fn method(&self, path: &str) -> Arc<Method> {
        match self.methods.get(path) {
            Some(m) => m.clone(),
            None => Arc::new(Method {
                path: path.to_string(),
                answers: HashMap::new(),
            }),
        }
    }
}

impl Method {
    /// The recorded answer to `request`, or NotFound naming the path: the loop sent a
    /// request that was not recorded, which must fail it, not pass unseen.
    fn answer(&self, request: &[u8]) -> Result<Bytes, Status> {
        match self.answers.get(request) {
            Some(answer) => answer.clone(),
            None => Err(Status::not_found(format!(
                "the floor has no recorded answer to this {} request ({} bytes)",
                self.path,
                request.len()
            ))),
        }
    }
}

/// A codec of raw message bytes: a request is taken as its bytes, a response is
/// written as the recorded bytes. tonic still adds and reads the gRPC frame header.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// One unary call: the answer recorded for the request's bytes.
struct Replay(Arc<Method>);

impl tonic::server::UnaryService<Bytes> for Replay {
    type Response = Bytes;
    type Future = std::future::Ready<Result<tonic::Response<Bytes>, Status>>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        std::future::ready(self.0.answer(request.get_ref()).map(tonic::Response::new))
    }
}

/// The floor as a tonic service under the CloudProvider's name, shaped like the
/// generated server (`call` hands the request to `Grpc::unary`) minus the decoding
/// into message types.
#[derive(Debug, Clone)]
pub struct FloorService {
    table: Arc<Table>,
}

impl FloorService {
    pub fn new(table: Table) -> Self {
        Self {
            table: Arc::new(table),
        }
    }
}

impl tower_service::Service<http::Request<tonic::body::Body>> for FloorService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let method = self.table.method(req.uri().path());
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(RawCodec);
            Ok(grpc.unary(Replay(method), req).await)
        })
    }
}

impl tonic::server::NamedService for FloorService {
    const NAME: &'static str = SERVICE_NAME;
}

/// Serves the answers in `file` on `listen` until the process is killed, with the
/// real server's transport settings and front door (`ca_asg_provider::grpc`). No health
/// service: loadgen waits for the floor with Refresh, which the floor answers.
pub async fn serve_file(file: &Path, listen: &ListenAddr) -> anyhow::Result<()> {
    let table = Table::new(read(file)?);
    let (listener, _) = ca_asg_provider::grpc::bind_listen(listen).await?;
    let router = ca_asg_provider::grpc::transport().add_service(FloorService::new(table));
    let limits = ca_asg_provider::grpc::ConnectionLimits::default();
    match listener {
        Listener::Tcp(l) => {
            router
                .serve_with_incoming(ca_asg_provider::grpc::door::incoming(l, limits))
                .await?
        }
        Listener::Unix(l, _file) => {
            router
                .serve_with_incoming(ca_asg_provider::grpc::unix_incoming(l, limits))
                .await?
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(method: &str, request: &[u8], answer: Result<&[u8], Status>) -> Recorded {
        Recorded {
            path: path_of(method),
            request: request.to_vec(),
            answer: answer.map(<[u8]>::to_vec),
        }
    }

    fn table() -> Table {
        Table::new([
            recorded("Refresh", b"", Ok(&b""[..])),
            recorded("NodeGroupTargetSize", b"\x0a\x02ng", Ok(&b"\x08\x03"[..])),
            recorded(
                "NodeGroupGetOptions",
                b"\x0a\x02ng",
                Err(Status::unimplemented("no options")),
            ),
        ])
    }

    #[test]
    fn known_requests_get_the_recorded_bytes_or_status() {
        let t = table();
        let size = t.method(&path_of("NodeGroupTargetSize"));
        assert_eq!(
            size.answer(b"\x0a\x02ng").unwrap(),
            Bytes::from_static(b"\x08\x03")
        );
        assert_eq!(
            t.method(&path_of("Refresh")).answer(b"").unwrap(),
            Bytes::new()
        );
        let s = t
            .method(&path_of("NodeGroupGetOptions"))
            .answer(b"\x0a\x02ng")
            .unwrap_err();
        assert_eq!(
            (s.code(), s.message()),
            (tonic::Code::Unimplemented, "no options")
        );
    }

    #[test]
    fn unknown_requests_and_paths_answer_not_found_naming_the_path() {
        let t = table();
        let path = path_of("NodeGroupTargetSize");
        let s = t.method(&path).answer(b"\x0a\x02xx").unwrap_err();
        assert_eq!(s.code(), tonic::Code::NotFound);
        assert!(s.message().contains(&path), "{}", s.message());
        let s = t.method("/some.Other/Method").answer(b"").unwrap_err();
        assert_eq!(s.code(), tonic::Code::NotFound);
        assert!(
            s.message().contains("/some.Other/Method"),
            "{}",
            s.message()
        );
    }

    #[test]
    fn the_answers_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("answers.json");
        let answers = vec![
            recorded("NodeGroupTargetSize", b"\x0a\x02ng", Ok(&b"\x08\x03"[..])),
            recorded(
                "NodeGroupGetOptions",
                b"\x0a\x02ng",
                Err(Status::unimplemented("no")),
            ),
        ];
        write(&file, &answers).unwrap();
        let back = read(&file).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].path, answers[0].path);
        assert_eq!(back[0].request, answers[0].request);
        assert_eq!(back[0].answer.as_ref().unwrap(), b"\x08\x03");
        let s = back[1].answer.as_ref().unwrap_err();
        assert_eq!((s.code(), s.message()), (tonic::Code::Unimplemented, "no"));
    }

    #[test]
    fn a_missing_file_is_named_in_the_error() {
        let e = read(Path::new("/nonexistent/floor-answers.json")).unwrap_err();
        assert!(
            format!("{e:#}").contains("/nonexistent/floor-answers.json"),
            "{e:#}"
        );
    }
}
