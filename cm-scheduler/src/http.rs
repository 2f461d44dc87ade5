//! `/metrics`, `/livez` and `/readyz` over plain HTTP/1.1.
//!
//! Three read-only GET endpoints do not need a web framework: this answers each request with
//! `Connection: close`, which every Prometheus scraper and orchestrator probe handles.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

use crate::stats::Stats;

/// Decides readiness: the database answers, and the last tick succeeded recently.
#[async_trait::async_trait]
pub trait Readiness: Send + Sync + 'static {
    /// Whether the database answers.
    async fn database_answers(&self) -> bool;
}

/// What the endpoints read.
pub struct Health<R> {
    /// The scheduler's counters.
    pub stats: Arc<Stats>,
    /// How the database is checked.
    pub readiness: R,
    /// How recent the last successful tick must be for `/readyz` to answer 200.
    pub fresh_within: Duration,
}

/// Serves the endpoints on `listener` until the task is dropped.
pub async fn serve<R: Readiness>(listener: TcpListener, health: Arc<Health<R>>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let health = health.clone();
                tokio::spawn(async move {
                    if let Err(e) = answer(stream, &health).await {
                        debug!(error = %e, "health connection ended with an error");
                    }
                });
            }
            Err(e) => {
                warn!(error = %e, "accepting a health connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer<R: Readiness>(mut stream: TcpStream, health: &Health<R>) -> std::io::Result<()> {
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    // Read until the end of the request head (or the buffer fills); the body is never needed.
    while len < buf.len() {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf[len..]))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request head"))??;
        if n == 0 {
            break;
        }
        len += n;
        if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let head = String::from_utf8_lossy(&buf[..len]);
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/livez") => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", "/readyz") => {
            let ticking = health
                .stats
                .last_success()
                .is_some_and(|at| at.elapsed() <= health.fresh_within);
            let database = health.readiness.database_answers().await;
            match (database, ticking) {
                (true, true) => ("200 OK", "text/plain", "ready\n".to_string()),
                (false, _) => (
                    "503 Service Unavailable",
                    "text/plain",
                    "the database does not answer\n".to_string(),
                ),
                (true, false) => {
                    let error = health
                        .stats
                        .last_error()
                        .unwrap_or_else(|| "no tick has succeeded yet".into());
                    (
                        "503 Service Unavailable",
                        "text/plain",
                        format!("no recent successful tick: {error}\n"),
                    )
                }
            }
        }
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4",
            health.stats.render_prometheus(),
        ),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_string(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}
