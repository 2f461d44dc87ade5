//! Where the schedulers send their messages, one module per backend: each starts what it
//! needs before the schedulers (a receiver, a broker), gives the schedulers their flags, and
//! after the drain checks what it received against the ledger's rows.

use std::path::Path;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgPool;

use super::ledger::FireRow;
use super::options::{Options, Replication};
use super::report::Findings;

pub(super) mod authz;
pub(super) mod docker;
pub(super) mod nats;
pub(super) mod outbox;
pub(super) mod webhook;

/// A running backend.
pub(super) enum Backend {
    Outbox,
    Webhook(webhook::WebhookBackend),
    Nats(nats::NatsBackend),
    /// Mission routines on the run's own dockerd.
    Docker(docker::DockerBackend),
}

/// What the check must know of a failover: when the standby took over, and whether
/// occurrences may have been sent again since (asynchronous replication loses the claims the
/// standby never received).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Takeover {
    pub at: DateTime<Utc>,
    pub refires_allowed: bool,
}

impl Takeover {
    pub fn new(at: Option<DateTime<Utc>>, options: &Options) -> Option<Takeover> {
        Some(Takeover {
            at: at?,
            refires_allowed: options.failover == Some(Replication::Async),
        })
    }
}

impl Backend {
    /// Starts the backend `options` name, its files under `dir`.
    pub fn start(options: &Options, dir: &Path) -> anyhow::Result<Backend> {
        use super::options::MessageBackend as M;
        if options.docker {
            return Ok(Backend::Docker(docker::DockerBackend::start(
                dir,
                options.refuse_stops,
            )?));
        }
        Ok(match options.backend {
            M::Outbox => Backend::Outbox,
            M::Webhook => Backend::Webhook(webhook::WebhookBackend::start(options.seed, dir)?),
            M::Nats => Backend::Nats(nats::NatsBackend::start(dir)?),
        })
    }

    /// The flags every scheduler gets.
    pub fn scheduler_args(&self) -> Vec<String> {
        match self {
            Backend::Outbox => Vec::new(),
            Backend::Webhook(w) => w.scheduler_args(),
            Backend::Nats(n) => n.scheduler_args(),
            Backend::Docker(d) => d.scheduler_args(),
        }
    }

    /// The environment every scheduler gets.
    pub fn scheduler_env(&self) -> Vec<(String, String)> {
        match self {
            Backend::Docker(d) => d.scheduler_env(),
            _ => Vec::new(),
        }
    }

    /// What `routine create` is given for routine `i`: a message, or a mission.
    pub fn routine_args(&self, i: usize) -> Vec<String> {
        match self {
            Backend::Docker(d) => d.routine_args(i),
            _ => vec!["--message".to_string(), format!("chaos message {i:02}")],
        }
    }

    /// Checks what the backend received against the ledger's `rows`; `dir` keeps its record.
    pub fn check(
        &self,
        rt: &tokio::runtime::Runtime,
        pool: &PgPool,
        rows: &[FireRow],
        takeover: Option<Takeover>,
        dir: &Path,
    ) -> anyhow::Result<Findings> {
        let mut findings = match self {
            Backend::Outbox => return rt.block_on(outbox::check(pool)).map(|c| c.findings()),
            Backend::Webhook(w) => w.check(rows, takeover, dir)?,
            Backend::Nats(n) => n.check(rt, rows)?,
            Backend::Docker(d) => d.check(rows)?,
        };
        // The other backends (and mission routines) leave the outbox empty.
        let stray = rt.block_on(outbox::stray_rows(pool))?;
        findings.line("outbox rows", stray.to_string());
        findings.require(stray > 0, || {
            format!("doubled: {stray} outbox rows written although the messages went elsewhere")
        });
        Ok(findings)
    }
}
