//! A TCP forwarder on 127.0.0.1 between the schedulers and PostgreSQL, for the faults that a
//! closed connection does not show: a network that hangs (every socket stays open and nothing
//! moves, in either direction, until it resumes) and a failover (new connections go to
//! another server, and those to the old one are cut).
//!
//! It runs on a runtime of its own, so the run's loop never delays a byte. A hang holds what
//! was already read and reads nothing more; bytes written by either side wait in the kernel's
//! buffers, as they would behind a router that stopped forwarding. A connection accepted during
//! a hang is not passed on until it ends.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::watch;

struct State {
    target: Mutex<SocketAddr>,
    /// `true` while bytes flow.
    flowing: watch::Sender<bool>,
    /// Bumped to cut every connection open now.
    cuts: watch::Sender<u64>,
}

/// The forwarder, serving until dropped.
pub(super) struct Forwarder {
    port: u16,
    state: Arc<State>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Forwarder {
    /// Listens on an ephemeral port of 127.0.0.1 and forwards every connection to `target`.
    pub fn start(target: SocketAddr) -> anyhow::Result<Forwarder> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("chaos-forwarder")
            .enable_all()
            .build()?;
        let state = Arc::new(State {
            target: Mutex::new(target),
            flowing: watch::channel(true).0,
            cuts: watch::channel(0).0,
        });
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").context("binding the forwarder")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let shared = state.clone();
        runtime.spawn(async move {
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("chaos: the forwarder cannot listen: {e}");
                    return;
                }
            };
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(forward(client, shared.clone()));
            }
        });
        Ok(Forwarder {
            port,
            state,
            runtime: Some(runtime),
        })
    }

    /// Where it listens on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `url` pointing at the forwarder instead.
    pub fn url(&self, url: &str) -> anyhow::Result<String> {
        let mut url = url::Url::parse(url).with_context(|| format!("invalid URL {url:?}"))?;
        url.set_host(Some("127.0.0.1"))?;
        url.set_port(Some(self.port))
            .map_err(|()| anyhow::anyhow!("{url} cannot have a port"))?;
        Ok(url.to_string())
    }

    /// Stops forwarding, every socket left open.
    pub fn hang(&self) {
        self.state.flowing.send_replace(false);
    }

    /// Forwards again what was held and whatever comes.
    pub fn resume(&self) {
        self.state.flowing.send_replace(true);
    }

    /// Sends new connections to `target` and cuts every open one.
    pub fn switch(&self, target: SocketAddr) {
        *self.state.target.lock().unwrap_or_else(|e| e.into_inner()) = target;
        self.state.cuts.send_modify(|n| *n += 1);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn forward(client: TcpStream, state: Arc<State>) {
    let mut cuts = state.cuts.subscribe();
    let mut flowing = state.flowing.subscribe();
    if flowing.wait_for(|f| *f).await.is_err() {
        return;
    }
    let target = *state.target.lock().unwrap_or_else(|e| e.into_inner());
    let Ok(upstream) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    // Whichever side ends first ends both: dropping the halves closes the sockets.
    tokio::select! {
        _ = pump(client_read, upstream_write, state.flowing.subscribe()) => {}
        _ = pump(upstream_read, client_write, state.flowing.subscribe()) => {}
        _ = cuts.changed() => {}
    }
}

/// Copies `from` to `to` while the network flows; holds what it read while it does not.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut flowing: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if flowing.wait_for(|f| *f).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if flowing.wait_for(|f| *f).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::time::Duration;

    use super::*;

    /// An echo server of the test's own, behind the forwarder: bytes pass, a hang holds them
    /// with the socket open, a resume delivers them, a switch cuts the connection and sends the
    /// next one to the other server.
    #[test]
    fn the_forwarder_passes_hangs_resumes_and_switches() {
        let echo = |tag: u8| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            std::thread::spawn(move || {
                for mut s in listener.incoming().flatten() {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 64];
                        while let Ok(n) = s.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            let mut answer = buf[..n].to_vec();
                            answer.push(tag);
                            if s.write_all(&answer).is_err() {
                                break;
                            }
                        }
                    });
                }
            });
            addr
        };
        let (a, b) = (echo(b'a'), echo(b'b'));
        let forwarder = Forwarder::start(a).unwrap();
        let connect = || {
            let s = std::net::TcpStream::connect(("127.0.0.1", forwarder.port())).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            s
        };
        let ask = |s: &mut std::net::TcpStream| -> Option<Vec<u8>> {
            s.write_all(b"x").ok()?;
            let mut buf = [0u8; 8];
            let n = s.read(&mut buf).ok()?;
            Some(buf[..n].to_vec())
        };
        let mut s = connect();
        assert_eq!(ask(&mut s), Some(b"xa".to_vec()));

        forwarder.hang();
        assert_eq!(ask(&mut s), None, "nothing passes while hung");
        forwarder.resume();
        let mut buf = [0u8; 8];
        let n = s.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"xa", "what was held arrives after the resume");

        forwarder.switch(b);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            matches!(s.read(&mut buf), Ok(0) | Err(_)),
            "the old one is cut"
        );
        let mut s = connect();
        assert_eq!(ask(&mut s), Some(b"xb".to_vec()));
    }
}
