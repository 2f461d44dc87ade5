//! The probe `cm-scheduler health` runs: asks a running scheduler's `/readyz` over plain HTTP/1.1 on a raw TCP
//! connection, for a container's HEALTHCHECK (the image holds no curl, no shell).
//!
//! It succeeds only on a `200`; anything else is one line naming the reason: the body of a
//! `503` (the scheduler's own words), a refused connection, a timeout.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::flags::HealthArgs;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The most of an answer read: `/readyz` answers a line or two.
const MAX_ANSWER: u64 = 64 * 1024;

/// Asks `/readyz`; `Err` is the one line saying why the scheduler is not ready.
pub async fn probe(args: HealthArgs) -> Result<(), String> {
    let addr = probe_address(args.listen);
    match tokio::time::timeout(args.timeout, ask(addr)).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "no answer from {addr} within {}",
            humantime::format_duration(args.timeout)
        )),
    }
}

/// Where to connect for a listen address: an unspecified one is reached on loopback.
fn probe_address(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), listen.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), listen.port())
        }
        _ => listen,
    }
}

async fn ask(addr: SocketAddr) -> Result<(), String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::ConnectionRefused {
            format!("connection refused at {addr}")
        } else {
            format!("cannot connect to {addr}: {e}")
        }
    })?;
    let request = format!(
        "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nUser-Agent: cm-scheduler-health\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("cannot ask {addr}: {e}"))?;
    let mut answer = Vec::new();
    (&mut stream)
        .take(MAX_ANSWER)
        .read_to_end(&mut answer)
        .await
        .map_err(|e| format!("reading the answer of {addr}: {e}"))?;
    verdict(addr, &answer)
}

/// The status line's code decides; the body of anything but a 200 is the reason.
fn verdict(addr: SocketAddr, answer: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.lines().next().unwrap_or("");
    let code = status
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("{addr} did not answer HTTP (status line {status:?})"))?;
    if code == 200 {
        return Ok(());
    }
    let body = unchunk(head, body);
    let reason = body.split_whitespace().collect::<Vec<_>>().join(" ");
    if reason.is_empty() {
        Err(format!("not ready: /readyz at {addr} answered {code}"))
    } else {
        Err(format!("not ready ({code}): {reason}"))
    }
}

/// A chunked body's data (axum sends a short `String` with a length, but a proxy may chunk it).
fn unchunk(head: &str, body: &str) -> String {
    let chunked = head.lines().any(|line| {
        let line = line.to_ascii_lowercase();
        line.starts_with("transfer-encoding:") && line.contains("chunked")
    });
    if !chunked {
        return body.to_string();
    }
    let mut data = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
        else {
            break;
        };
        if size == 0 || after.len() < size {
            break;
        }
        data.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> SocketAddr {
        "127.0.0.1:8080".parse().unwrap()
    }

    #[test]
    fn a_200_is_ready_and_a_503_gives_its_body() {
        assert_eq!(
            verdict(addr(), b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nready"),
            Ok(())
        );
        assert_eq!(
            verdict(
                addr(),
                b"HTTP/1.1 503 Service Unavailable\r\n\r\ndatabase unreachable\n"
            ),
            Err("not ready (503): database unreachable".to_string())
        );
        assert!(verdict(addr(), b"SSH-2.0-OpenSSH\r\n").is_err());
    }

    #[test]
    fn a_chunked_body_is_read_back() {
        let answer = b"HTTP/1.1 503 No\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nlate\r\n0\r\n\r\n";
        assert_eq!(
            verdict(addr(), answer),
            Err("not ready (503): late".to_string())
        );
    }

    #[test]
    fn an_unspecified_address_is_asked_on_loopback() {
        assert_eq!(
            probe_address("0.0.0.0:9".parse().unwrap()),
            "127.0.0.1:9".parse().unwrap()
        );
        assert_eq!(
            probe_address("[::]:9".parse().unwrap()),
            "[::1]:9".parse().unwrap()
        );
    }
}
