//! The Docker backend's connection to the engine: bollard over a hyper client of cm's, so that
//! every reply is read up to [`crate::MAX_REPLY_BYTES`].
//!
//! bollard reads most replies whole before it parses them (a create's, an inspection, an
//! error's text) and lets no caller wrap a reply's body: its custom transport must hand back
//! hyper's own body type. So the bound is on the connection: each connection carries one
//! request and its reply (no idle connection is kept, as bollard's own transports keep none),
//! and its reads fail once they pass the bound ([`Capped`]). hyper then fails the reply's body,
//! bollard reports the call failed, and the connection is closed.
//!
//! The requests are bollard's, built as for its own transports: `http://HOST:PORT/v1.NN/…` for
//! a `tcp://` or `http://` engine, whose connection goes to that host and port (80 when none is
//! given, as bollard's did); for a `unix://` engine the URI's authority is `localhost`, and the
//! connection goes to the socket.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bollard::errors::Error as DockerError;
use bollard::{BollardRequest, Docker};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::bounded::Capped;

/// Whose replies the bound cuts, in its error.
const FROM: &str = "the Docker engine";

/// A client of the engine at `host` (`unix:///var/run/docker.sock`, `tcp://127.0.0.1:2375`,
/// `http://…`) whose calls time out after `timeout_secs`, at bollard's default API version.
/// A `unix://` socket that is not there is `SocketNotFoundError`, as bollard's own
/// `connect_with_host` says.
pub(super) fn connect(host: &str, timeout_secs: u64) -> Result<Docker, DockerError> {
    let (endpoint, client_addr) = if let Some(path) = host.strip_prefix("unix://") {
        if !std::path::Path::new(path).exists() {
            return Err(DockerError::SocketNotFoundError(path.to_owned()));
        }
        (Endpoint::Unix(path.into()), "http://localhost".to_owned())
    } else if let Some(addr) = host
        .strip_prefix("tcp://")
        .or_else(|| host.strip_prefix("http://"))
    {
        (Endpoint::Tcp, format!("http://{addr}"))
    } else {
        return Err(DockerError::UnsupportedURISchemeError {
            uri: host.to_owned(),
        });
    };
    let mut builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    // One request and its reply per connection: the bound is per reply.
    builder.pool_max_idle_per_host(0);
    let client = Arc::new(builder.build(Connector(Arc::new(endpoint))));
    let transport = move |request: BollardRequest| {
        let client = Arc::clone(&client);
        async move { client.request(request).await.map_err(DockerError::from) }
    };
    Docker::connect_with_custom_transport(
        transport,
        Some(client_addr),
        timeout_secs,
        bollard::API_DEFAULT_VERSION,
    )
}

/// Where the engine listens.
#[derive(Debug)]
enum Endpoint {
    /// A Unix socket at this path.
    Unix(PathBuf),
    /// The host and port of each request's URI.
    Tcp,
}

/// Opens a capped connection to the engine for each request.
#[derive(Debug, Clone)]
struct Connector(Arc<Endpoint>);

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<Capped<Stream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let endpoint = Arc::clone(&self.0);
        Box::pin(async move {
            let stream = match &*endpoint {
                Endpoint::Unix(path) => Stream::Unix(UnixStream::connect(path).await?),
                Endpoint::Tcp => {
                    let host = uri.host().ok_or_else(|| {
                        io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "the engine's address has no host",
                        )
                    })?;
                    let host = host.trim_start_matches('[').trim_end_matches(']');
                    let port = uri.port_u16().unwrap_or(80);
                    Stream::Tcp(TcpStream::connect((host, port)).await?)
                }
            };
            Ok(TokioIo::new(Capped::new(stream, FROM)))
        })
    }
}

/// A connection to the engine.
#[derive(Debug)]
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Connection for Capped<Stream> {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Unix(s) => s.is_write_vectored(),
            Stream::Tcp(s) => s.is_write_vectored(),
        }
    }
}
