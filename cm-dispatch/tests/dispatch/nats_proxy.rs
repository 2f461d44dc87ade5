//! A NATS proxy that makes a JetStream server misbehave for the conformance suite.
//!
//! It sits between the backend and the real server (127.0.0.1:4222), forwarding the NATS
//! protocol frame by frame in both directions. For publishes to the subjects under one prefix
//! (the backend's) it can, on request:
//!
//! - **stall**: swallow the publish, so no acknowledgement ever comes (a hung server);
//! - **refuse**: answer the publish itself with a JetStream error whose description is the
//!   suite's text, the way the server answers a publish it rejects
//!   (`{"error": {"code", "err_code", "description"}}` on the request's reply subject);
//! - **flood**: answer the publish with a reply that never completes (an `HMSG` declaring a
//!   terabyte, or bytes without a line end), counting the bytes the client takes.
//!
//! Everything else (the stream API under `$JS.API`, pings, subscriptions) passes through
//! untouched, so the stream stays the judge of how many messages were stored.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does with a publish under the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Forward it.
    Pass,
    /// Swallow it: no acknowledgement, ever.
    Stall,
    /// Answer it with a JetStream error carrying this description.
    Refuse(String),
    /// Answer it with [`FLOOD_BYTES`] bytes of a reply that never completes, then nothing.
    Flood(Flood),
}

/// How a flooding answer never completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flood {
    /// An `HMSG` to the reply subject declaring a terabyte, of which [`FLOOD_BYTES`] come.
    HugeMessage,
    /// [`FLOOD_BYTES`] bytes with no line end: no operation the client can parse, ever.
    NoLineEnd,
}

/// How many bytes a flooding answer sends, a piece at a time, as fast as the client reads.
pub const FLOOD_BYTES: u64 = 64 << 20;

/// A running proxy; it stops with the test's runtime.
pub struct NatsProxy {
    addr: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    flooded: Arc<AtomicU64>,
}

impl NatsProxy {
    /// Starts a proxy to `upstream` (`host:port`) that acts on publishes under `prefix.`.
    pub async fn start(upstream: String, prefix: String) -> NatsProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(Mutex::new(Mode::Pass));
        let shared = mode.clone();
        let flooded = Arc::new(AtomicU64::new(0));
        let counted = flooded.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                tokio::spawn(relay(
                    client,
                    server,
                    prefix.clone(),
                    shared.clone(),
                    counted.clone(),
                ));
            }
        });
        NatsProxy {
            addr,
            mode,
            flooded,
        }
    }

    /// How many bytes of flooding answers the client has taken so far: what it read, less what
    /// the kernel's buffers hold.
    pub fn flooded(&self) -> u64 {
        self.flooded.load(Ordering::SeqCst)
    }

    /// The URL a client connects to.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// Sets what happens to publishes from now on.
    pub fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }
}

/// One client connection: frames from the server go to the client as they are; frames from the
/// client go to the server unless the mode says otherwise.
async fn relay(
    client: TcpStream,
    server: TcpStream,
    prefix: String,
    mode: Arc<Mutex<Mode>>,
    flooded: Arc<AtomicU64>,
) {
    let (client_read, client_write) = client.into_split();
    let (server_read, mut server_write) = server.into_split();
    let client_write = Arc::new(tokio::sync::Mutex::new(client_write));

    let down = {
        let client_write = client_write.clone();
        tokio::spawn(async move {
            let mut from_server = BufReader::new(server_read);
            while let Some(frame) = read_frame(&mut from_server).await {
                if client_write
                    .lock()
                    .await
                    .write_all(&frame.bytes)
                    .await
                    .is_err()
                {
                    break;
                }
            }
        })
    };

    let mut from_client = BufReader::new(client_read);
    // The client's subscriptions, (subject, sid), to address an answer to a reply subject.
    let mut subscriptions: Vec<(String, String)> = Vec::new();
    while let Some(frame) = read_frame(&mut from_client).await {
        let words = &frame.words;
        let op = words
            .first()
            .map(|w| w.to_ascii_uppercase())
            .unwrap_or_default();
        if op == "SUB" && words.len() >= 3 {
            subscriptions.push((words[1].clone(), words[words.len() - 1].clone()));
        }
        let under_prefix = (op == "PUB" || op == "HPUB")
            && words
                .get(1)
                .is_some_and(|s| s.starts_with(&format!("{prefix}.")));
        let current = mode.lock().unwrap().clone();
        match current {
            Mode::Stall if under_prefix => continue,
            Mode::Refuse(_) | Mode::Flood(_) if under_prefix => {
                // PUB <subject> <reply> <size>, HPUB <subject> <reply> <hdr> <total>.
                let reply = if (op == "PUB" && words.len() == 4) || words.len() == 5 {
                    words[2].clone()
                } else {
                    continue;
                };
                let Some(sid) = subscriptions
                    .iter()
                    .find(|(subject, _)| matches(subject, &reply))
                    .map(|(_, sid)| sid.clone())
                else {
                    continue;
                };
                let answered = match current {
                    Mode::Flood(flood) => {
                        let head = match flood {
                            Flood::HugeMessage => {
                                format!("HMSG {reply} {sid} 12 {}\r\nNATS/1.0\r\n\r\n", 1u64 << 40)
                            }
                            Flood::NoLineEnd => String::new(),
                        };
                        // The flood goes on in the background: the relay keeps passing the
                        // client's frames (its pings, its next publishes) meanwhile.
                        let client_write = client_write.clone();
                        let flooded = flooded.clone();
                        tokio::spawn(async move {
                            let mut client_write = client_write.lock().await;
                            if client_write.write_all(head.as_bytes()).await.is_err() {
                                return;
                            }
                            let piece = "flood ".repeat(64 * 1024 / 6);
                            let mut sent = 0u64;
                            while sent < FLOOD_BYTES {
                                let piece = &piece.as_bytes()
                                    [..piece.len().min((FLOOD_BYTES - sent) as usize)];
                                if client_write.write_all(piece).await.is_err() {
                                    return;
                                }
                                sent += piece.len() as u64;
                                flooded.fetch_add(piece.len() as u64, Ordering::SeqCst);
                            }
                        });
                        true
                    }
                    Mode::Refuse(reason) => {
                        let body = serde_json::json!({
                            "error": {"code": 503, "err_code": 10077, "description": reason}
                        })
                        .to_string();
                        let answer = format!("MSG {reply} {sid} {}\r\n{body}\r\n", body.len());
                        client_write
                            .lock()
                            .await
                            .write_all(answer.as_bytes())
                            .await
                            .is_ok()
                    }
                    _ => true,
                };
                if !answered {
                    break;
                }
            }
            _ => {
                if server_write.write_all(&frame.bytes).await.is_err() {
                    break;
                }
            }
        }
    }
    down.abort();
}

/// One protocol frame: its control line split into words, and its bytes (line and payload).
struct Frame {
    words: Vec<String>,
    bytes: Vec<u8>,
}

/// Reads a control line and, for the operations that carry one, its payload (the last word of
/// `PUB`/`MSG` is the payload's size, of `HPUB`/`HMSG` the headers' and payload's together).
async fn read_frame<R: tokio::io::AsyncBufRead + Unpin>(reader: &mut R) -> Option<Frame> {
    let mut bytes = Vec::new();
    if reader.read_until(b'\n', &mut bytes).await.ok()? == 0 {
        return None;
    }
    let line = String::from_utf8_lossy(&bytes).trim_end().to_owned();
    let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
    let op = words
        .first()
        .map(|w| w.to_ascii_uppercase())
        .unwrap_or_default();
    if matches!(op.as_str(), "PUB" | "HPUB" | "MSG" | "HMSG") {
        let size: usize = words.last()?.parse().ok()?;
        let start = bytes.len();
        bytes.resize(start + size + 2, 0);
        reader.read_exact(&mut bytes[start..]).await.ok()?;
    }
    Some(Frame { words, bytes })
}

/// Whether a subscription's subject (with `*` and `>` wildcards) matches a subject.
fn matches(pattern: &str, subject: &str) -> bool {
    let mut subject = subject.split('.');
    for token in pattern.split('.') {
        match (token, subject.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (t, Some(s)) if t == s => {}
            _ => return false,
        }
    }
    subject.next().is_none()
}
