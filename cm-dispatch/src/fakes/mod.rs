//! Fakes of the mission runtimes' HTTP APIs, served inside tests (the `fakes` feature): the
//! Docker Engine API ([`docker`]) and the Kubernetes API's Jobs ([`kubernetes`]); and the
//! Standard Webhooks verifier every test receiver checks signatures with
//! ([`standard_webhooks`]); and waiting for a state instead of sleeping ([`wait`]).
//!
//! Each fake answers the routes a backend uses with the real API's documented status codes and
//! error bodies, enforces unique names as the real runtime does, and records every call so a
//! test can count creates and starts. Each runs on a thread and runtime of its own, so a
//! synchronous test, or one that blocks its runtime while it waits on a child process, is still
//! answered; it stops when dropped.

pub mod docker;
pub mod kubernetes;
pub mod standard_webhooks;
pub mod wait;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use tokio::sync::oneshot;

/// One request a fake received, and what it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// `GET`, `POST`, `DELETE`.
    pub method: String,
    /// The path without the API version prefix (`/containers/create`).
    pub path: String,
    /// The query string, decoded (`name=cm-...`).
    pub query: String,
    /// The status answered; 0 while the answer is withheld (a stalled call).
    pub status: u16,
    /// The API version the path carried (`1.41` for `/v1.41/containers/create`), if any.
    pub version: Option<String>,
}

impl Call {
    /// `request`, received at `path`, not answered yet.
    pub(crate) fn received(request: &FakeRequest, path: &str) -> Call {
        Call {
            method: request.method.clone(),
            path: path.to_owned(),
            query: request
                .query
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("&"),
            status: 0,
            version: None,
        }
    }
}

/// A fake's state, even after a test thread panicked holding it: a panic must not hide the
/// record from the others.
pub(crate) fn lock<T>(state: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// An answer: status and JSON body (empty for none).
pub(crate) type Answer = (u16, String);

/// A request as the fakes see it: method, path, query pairs and body, all read.
pub(crate) struct FakeRequest {
    pub method: String,
    pub path: String,
    pub query: Vec<(String, String)>,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    pub body: Bytes,
}

impl FakeRequest {
    /// The value of query parameter `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A fake's request handler: answers now, or never (a stalled call), as the fake decides.
pub(crate) trait Handler: Send + Sync + 'static {
    /// The answer to `request`, or `None` to withhold it until the client gives up.
    fn answer(&self, request: &FakeRequest) -> Option<Answer>;

    /// A flood to answer `request` with instead, if the fake was told to.
    fn flood(&self, _request: &FakeRequest) -> Option<Flood> {
        None
    }
}

/// An answer whose body does not end, to see that a client reads no more of it than it
/// should: its status, then `flood ` again and again, as long as the client reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flood {
    /// The status it answers with.
    pub status: u16,
    /// How the body is framed.
    pub framing: Framing,
}

/// How a [`Flood`]'s body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Transfer-Encoding: chunked`, chunk after chunk, never the last.
    Chunked,
    /// A `Content-Length` of a terabyte.
    HugeLength,
}

/// What a fake's floods sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FloodRecord {
    /// How many floods were answered.
    pub answered: usize,
    /// How many are still being sent: their client has not closed the connection yet.
    pub open: usize,
    /// The most body bytes one flood handed to its connection before the client closed it.
    /// The client read that much, less what the kernel's buffers held when it stopped.
    pub most_sent: u64,
}

/// One flood's body, counting what it hands on into the fake's record.
struct FloodBody {
    piece: Bytes,
    sent: u64,
    framing: Framing,
    record: Arc<std::sync::Mutex<FloodRecord>>,
}

impl FloodBody {
    fn new(framing: Framing, record: Arc<std::sync::Mutex<FloodRecord>>) -> FloodBody {
        {
            let mut record = lock(&record);
            record.answered += 1;
            record.open += 1;
        }
        FloodBody {
            piece: Bytes::from("flood ".repeat(64 * 1024 / 6)),
            sent: 0,
            framing,
            record,
        }
    }
}

impl hyper::body::Body for FloodBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.sent += self.piece.len() as u64;
        let sent = self.sent;
        let most = &mut lock(&self.record).most_sent;
        *most = (*most).max(sent);
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(self.piece.clone()))))
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self.framing {
            Framing::Chunked => hyper::body::SizeHint::default(),
            Framing::HugeLength => hyper::body::SizeHint::with_exact(1 << 40),
        }
    }
}

impl Drop for FloodBody {
    fn drop(&mut self) {
        lock(&self.record).open -= 1;
    }
}

/// A running fake server; dropping it stops it.
pub(crate) struct Server {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    floods: Arc<std::sync::Mutex<FloodRecord>>,
}

impl Server {
    /// Serves `handler` on 127.0.0.1 at a free port.
    pub fn start(handler: Arc<dyn Handler>) -> Server {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a fake's port");
        listener
            .set_nonblocking(true)
            .expect("making the fake's socket non-blocking");
        let addr = listener.local_addr().expect("the fake's address");
        let (stop, stopped) = oneshot::channel::<()>();
        let floods = Arc::new(std::sync::Mutex::new(FloodRecord::default()));
        let record = floods.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the fake");
            runtime.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(listener).expect("the fake's listener");
                let accept = async {
                    loop {
                        let Ok((stream, _)) = listener.accept().await else {
                            continue;
                        };
                        let (handler, record) = (handler.clone(), record.clone());
                        tokio::spawn(async move {
                            let service = hyper::service::service_fn(move |request| {
                                let (handler, record) = (handler.clone(), record.clone());
                                async move { serve(handler.as_ref(), request, record).await }
                            });
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                .await;
                        });
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stopped => {}
                }
            });
        });
        Server {
            addr,
            stop: Some(stop),
            floods,
        }
    }

    /// What its floods sent so far.
    pub fn floods(&self) -> FloodRecord {
        *lock(&self.floods)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn serve(
    handler: &dyn Handler,
    request: Request<Incoming>,
    floods: Arc<std::sync::Mutex<FloodRecord>>,
) -> Result<Response<BoxBody<Bytes, Infallible>>, Infallible> {
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let query = url::form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let authorization = request
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let request = FakeRequest {
        method,
        path,
        query,
        authorization,
        body,
    };
    if let Some(flood) = handler.flood(&request) {
        return Ok(Response::builder()
            .status(flood.status)
            .header("content-type", "application/json")
            .body(FloodBody::new(flood.framing, floods).boxed())
            .expect("a fake's response is well formed"));
    }
    let Some((status, body)) = handler.answer(&request) else {
        // Withheld: the client's deadline, or its death, ends the call.
        std::future::pending::<()>().await;
        unreachable!("a pending future never completes");
    };
    let mut response = Response::builder().status(status);
    if !body.is_empty() {
        response = response.header("content-type", "application/json");
    }
    Ok(response
        .body(Full::new(Bytes::from(body)).boxed())
        .expect("a fake's response is well formed"))
}
