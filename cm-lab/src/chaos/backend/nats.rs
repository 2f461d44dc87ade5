//! The NATS JetStream backend (`--message-backend nats`): the run starts its own
//! `nats-server -js` on a free loopback port with a store directory of its own (never the
//! machine's shared server), and after the drain reads the stream back: exactly one stored
//! message per fired occurrence, carrying its idempotency key as `Nats-Msg-Id`, and none for
//! an occurrence without a fire.
//!
//! The server is shared with the broker fault (`--broker-restarts`), which kills it with
//! SIGKILL and starts it again on the same store.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::chaos::fleet::free_port;
use crate::chaos::ledger::FireRow;
use crate::chaos::report::Findings;

/// The stream and subjects the schedulers publish to (the product's defaults).
const STREAM: &str = "CM";

/// A `nats-server` of the run's own.
pub(in crate::chaos) struct NatsServer {
    port: u16,
    store: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl NatsServer {
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts it on its port and store and waits until it accepts connections.
    pub fn start(&mut self) -> anyhow::Result<Duration> {
        let began = Instant::now();
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let child = Command::new("nats-server")
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.store)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting nats-server (is it installed?)")?;
        self.child = Some(child);
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if began.elapsed() > Duration::from_secs(20) {
                bail!("nats-server did not listen on {addr} within 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(began.elapsed())
    }

    /// SIGKILL.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill().context("SIGKILL to nats-server")?;
            child.wait()?;
        }
        Ok(())
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// The NATS backend of a run.
pub(in crate::chaos) struct NatsBackend {
    server: Arc<Mutex<NatsServer>>,
}

impl NatsBackend {
    /// Starts the run's server, its store and log under `dir/nats`.
    pub fn start(dir: &Path) -> anyhow::Result<Self> {
        let dir = dir.join("nats");
        std::fs::create_dir_all(&dir)?;
        let mut server = NatsServer {
            port: free_port()?,
            store: dir.join("store"),
            log: dir.join("nats-server.log"),
            child: None,
            starts: 0,
        };
        server.start()?;
        eprintln!(
            "chaos: nats-server at {}, store in {}",
            server.url(),
            server.store.display()
        );
        Ok(NatsBackend {
            server: Arc::new(Mutex::new(server)),
        })
    }

    /// The server, for the broker fault.
    pub fn server(&self) -> Arc<Mutex<NatsServer>> {
        self.server.clone()
    }

    fn url(&self) -> String {
        self.server.lock().unwrap_or_else(|e| e.into_inner()).url()
    }

    pub fn scheduler_args(&self) -> Vec<String> {
        vec![
            "--message-backend".to_string(),
            "nats".to_string(),
            "--nats-url".to_string(),
            self.url(),
        ]
    }

    /// Reads every message of the stream back and checks them against the ledger's rows.
    pub fn check(
        &self,
        rt: &tokio::runtime::Runtime,
        rows: &[FireRow],
    ) -> anyhow::Result<Findings> {
        let url = self.url();
        let messages = rt.block_on(read_stream(&url))?;
        Ok(check_stream(rows, &messages).findings(&url))
    }
}

/// One stored message: its `Nats-Msg-Id` and `Cm-Attempt`.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::chaos) struct Stored {
    pub id: String,
    pub attempt: Option<i32>,
}

async fn read_stream(url: &str) -> anyhow::Result<Vec<Stored>> {
    let client = async_nats::connect(url)
        .await
        .with_context(|| format!("connecting to {url} to read the stream back"))?;
    let jetstream = async_nats::jetstream::new(client);
    let mut stream = jetstream
        .get_stream(STREAM)
        .await
        .with_context(|| format!("no stream {STREAM}"))?;
    let state = stream.info().await?.state.clone();
    let mut out = Vec::with_capacity(state.messages as usize);
    if state.messages == 0 {
        return Ok(out);
    }
    for seq in state.first_sequence..=state.last_sequence {
        let message = match stream.get_raw_message(seq).await {
            Ok(m) => m,
            // A sequence with no message (none is ever deleted here, but a gap is not a loss
            // of ours: every message is counted against the ledger below).
            Err(_) => continue,
        };
        let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_string());
        out.push(Stored {
            id: header("Nats-Msg-Id").unwrap_or_default(),
            attempt: header("Cm-Attempt").and_then(|a| a.parse().ok()),
        });
    }
    Ok(out)
}

/// What the stream holds, against the ledger.
#[derive(Debug, Clone, Default, PartialEq)]
pub(in crate::chaos) struct StreamCheck {
    pub messages: usize,
    pub distinct_ids: usize,
    pub fired: usize,
    /// Fired rows with no message.
    pub fired_without_message: usize,
    /// Messages whose id names no ledger row.
    pub messages_without_fire: usize,
    /// Messages past the first for one id.
    pub second_messages: usize,
    /// Messages at an attempt their row never reached.
    pub ahead_of_ledger: usize,
    /// Failed rows, and those of them with a stored message.
    pub failed: usize,
    pub failed_with_message: usize,
    pub examples: Vec<String>,
}

pub(in crate::chaos) fn check_stream(rows: &[FireRow], messages: &[Stored]) -> StreamCheck {
    let mut check = StreamCheck {
        messages: messages.len(),
        ..StreamCheck::default()
    };
    let mut by_id: HashMap<&str, Vec<&Stored>> = HashMap::new();
    for m in messages {
        by_id.entry(m.id.as_str()).or_default().push(m);
    }
    check.distinct_ids = by_id.len();
    check.second_messages = messages.len() - by_id.len();
    let note = |check: &mut StreamCheck, what: String| {
        if check.examples.len() < 10 {
            check.examples.push(what);
        }
    };
    let rows_by_key: HashMap<String, &FireRow> = rows.iter().map(|r| (r.key(), r)).collect();
    for (id, list) in &by_id {
        match rows_by_key.get(*id) {
            None => {
                check.messages_without_fire += list.len();
                note(&mut check, format!("{id} is stored but has no ledger row"));
            }
            Some(row) => {
                let ahead = list
                    .iter()
                    .filter(|m| m.attempt.is_some_and(|a| a > row.attempt))
                    .count();
                check.ahead_of_ledger += ahead;
            }
        }
        if list.len() > 1 {
            note(&mut check, format!("{id} is stored {} times", list.len()));
        }
    }
    for row in rows {
        let stored = by_id.contains_key(row.key().as_str());
        match row.status.as_str() {
            "fired" => {
                check.fired += 1;
                if !stored {
                    check.fired_without_message += 1;
                    note(&mut check, format!("{} is fired but not stored", row.key()));
                }
            }
            "failed" => {
                check.failed += 1;
                check.failed_with_message += usize::from(stored);
            }
            _ => {}
        }
    }
    check
}

impl StreamCheck {
    fn findings(&self, url: &str) -> Findings {
        let mut f = Findings::default();
        f.line(
            "missing",
            format!(
                "{} fired rows without a stored message",
                self.fired_without_message
            ),
        );
        f.line(
            "doubled",
            format!(
                "{} ({} second messages for one Nats-Msg-Id, {} for occurrences without a row)",
                self.second_messages + self.messages_without_fire,
                self.second_messages,
                self.messages_without_fire
            ),
        );
        f.line(
            "stream",
            format!(
                "{} messages, {} distinct ids, for {} fired rows ({url}, stream {STREAM}); {} at an attempt the ledger never reached; {} failed rows, {} of them stored",
                self.messages,
                self.distinct_ids,
                self.fired,
                self.ahead_of_ledger,
                self.failed,
                self.failed_with_message
            ),
        );
        let examples = || self.examples.join("; ");
        f.require(self.fired_without_message > 0, || {
            format!(
                "nats: {} fired occurrences have no stored message ({})",
                self.fired_without_message,
                examples()
            )
        });
        f.require(
            self.second_messages + self.messages_without_fire > 0,
            || {
                format!(
                    "nats: doubled: {} second messages, {} without a row ({})",
                    self.second_messages,
                    self.messages_without_fire,
                    examples()
                )
            },
        );
        f.require(self.ahead_of_ledger > 0, || {
            format!(
                "nats: {} messages at an attempt the ledger never reached",
                self.ahead_of_ledger
            )
        });
        f
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::chaos::ledger::tests::fire_row as row;

    fn stored(row: &FireRow) -> Stored {
        Stored {
            id: row.key(),
            attempt: Some(row.attempt),
        }
    }

    #[test]
    fn one_message_per_fire_passes_and_each_fault_is_found() {
        let r = Uuid::new_v4();
        let rows = vec![row(r, 0, "fired"), row(r, 1, "fired"), row(r, 2, "failed")];
        let clean: Vec<Stored> = rows[..2].iter().map(stored).collect();
        let check = check_stream(&rows, &clean);
        assert!(check.findings("u").problems.is_empty(), "{check:?}");
        assert_eq!((check.fired, check.failed), (2, 1));

        let mut doubled = clean.clone();
        doubled.push(stored(&rows[0]));
        doubled.push(stored(&row(Uuid::new_v4(), 0, "fired")));
        let check = check_stream(&rows, &doubled);
        assert_eq!((check.second_messages, check.messages_without_fire), (1, 1));
        assert_eq!(check.findings("u").problems.len(), 1);

        let lost = &clean[..1];
        let check = check_stream(&rows, lost);
        assert_eq!(check.fired_without_message, 1);
        assert!(check.findings("u").problems[0].contains("no stored message"));

        let mut ahead = clean.clone();
        ahead[0].attempt = Some(2);
        assert_eq!(check_stream(&rows, &ahead).ahead_of_ledger, 1);
    }
}
