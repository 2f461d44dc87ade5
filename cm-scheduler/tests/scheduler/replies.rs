//! Every reply from outside is read up to a bound (docs/guide/design.md, "Containment"): a
//! collector answering an export with a gigabyte, and a `/readyz` answering without end or
//! chunked inside a character, cost the scheduler and `cm-scheduler health` a few KiB and no
//! panic.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use crate::cli::{create_args, ok};
use crate::crash::SchedulerProcess;
use crate::support::{TestDb, cm_scheduler, eventually_within};

/// What the collector answers each export with: 1 GiB, written lazily from one small buffer.
const HUGE_REPLY: u64 = 1 << 30;

/// The most memory the scheduler may have held at its peak while exporting to that collector.
/// It runs in about 25 MiB; reading one such reply whole takes over 1 GiB.
const MOST_RESIDENT: u64 = 256 << 20;

/// Reads one HTTP/1.1 request (its head and its `content-length` body) from `stream`; `false`
/// when the connection ends first.
async fn read_request(stream: &mut TcpStream) -> bool {
    let mut seen = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(at) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&seen[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = seen.len() - head_end;
    while body < length {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => body += n,
        }
    }
    true
}

/// An OTLP/HTTP collector that takes every export and answers it `200` with [`HUGE_REPLY`]
/// bytes of body; its URL and the count of exports it took.
async fn collector_answering_a_gigabyte() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let exports = Arc::new(AtomicUsize::new(0));
    let counted = exports.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let exports = counted.clone();
            tokio::spawn(async move {
                let block = vec![0u8; 64 * 1024];
                while read_request(&mut stream).await {
                    exports.fetch_add(1, Ordering::SeqCst);
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\n\
                         content-length: {HUGE_REPLY}\r\n\r\n"
                    );
                    if stream.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let mut sent = 0;
                    while sent < HUGE_REPLY {
                        let n = block.len().min((HUGE_REPLY - sent) as usize);
                        if stream.write_all(&block[..n]).await.is_err() {
                            return;
                        }
                        sent += n as u64;
                    }
                }
            });
        }
    });
    (url, exports)
}

/// A process's peak resident memory (`VmHWM`), in bytes.
fn peak_resident(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_answering_a_gigabyte_costs_the_scheduler_no_memory() {
    let db = TestDb::new().await;
    let (endpoint, exports) = collector_answering_a_gigabyte().await;
    ok(
        &db.url,
        &create_args("traced", "* * * * * *", &["--message", "hello"]),
    );
    let mut scheduler = SchedulerProcess::start_with_settings(
        &db,
        "huge-replies",
        &["--tick-interval", "200ms"],
        &["--otlp-endpoint", endpoint.as_str()],
        // A batch every 200 ms rather than every 5 s: many exports in a short run.
        &[("OTEL_BSP_SCHEDULE_DELAY", "200")],
    );
    // It keeps exporting: each export's reply is left after its start, not waited out.
    eventually_within(Duration::from_secs(60), async || {
        (exports.load(Ordering::SeqCst) >= 3).then_some(())
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "{} exports within 60 s; log:\n{}",
            exports.load(Ordering::SeqCst),
            scheduler.log()
        )
    });
    let peak = peak_resident(scheduler.id());
    scheduler.kill();
    assert!(
        peak < MOST_RESIDENT,
        "the scheduler's peak resident memory was {} MiB exporting to a collector answering \
         1 GiB (at most {} MiB)",
        peak >> 20,
        MOST_RESIDENT >> 20
    );
}

/// A `/readyz` that answers every connection with `head`, then with `body` written again and
/// again, `times` times (`None`: until the reader leaves); its address.
async fn readyz_answering(
    head: &'static [u8],
    body: &'static [u8],
    times: Option<usize>,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                if !read_request(&mut stream).await || stream.write_all(head).await.is_err() {
                    return;
                }
                let mut sent = 0;
                while times.is_none_or(|t| sent < t) {
                    if stream.write_all(body).await.is_err() {
                        return;
                    }
                    sent += 1;
                }
            });
        }
    });
    addr
}

/// `cm-scheduler health --listen addr`: its exit code and what it printed on stderr.
async fn health(addr: &str) -> (Option<i32>, String) {
    let mut command = tokio::process::Command::from(cm_scheduler());
    let out = command
        .env_remove("CM_LISTEN")
        .args(["health", "--listen", addr, "--timeout", "10s"])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("running cm-scheduler health");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reads_a_503_chunked_inside_a_character() {
    // "é" is two bytes; a proxy's chunks may fall between them.
    let addr = readyz_answering(
        b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"3\r\ncaf\r\n1\r\n\xc3\r\n1\r\n\xa9\r\n0\r\n\r\n",
        Some(1),
    )
    .await;
    let (code, stderr) = health(&addr).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr, "cm-scheduler: not ready (503): café\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_an_endless_503_in_one_short_line() {
    let addr = readyz_answering(
        b"HTTP/1.1 503 Service Unavailable\r\n\r\n",
        b"the database is far away ",
        None,
    )
    .await;
    let (code, stderr) = health(&addr).await;
    assert_eq!(code, Some(1), "{stderr}");
    let start: String = stderr.chars().take(200).collect();
    assert_eq!(stderr.lines().count(), 1, "{start}");
    assert!(
        stderr.starts_with("cm-scheduler: not ready (503): the database is far away"),
        "{start}"
    );
    assert!(stderr.len() < 1024, "{} bytes: {start}…", stderr.len());
}
