//! `run`'s message backend flags, and building the message dispatcher they name.
//!
//! Endpoints and credentials are the operator's, given here, never a routine's. Everything that
//! can be checked without the network (the secret file, the URL, names, the credentials file) is
//! checked by [`MessageArgs::plan`] before the database is touched, so bad input exits 2 and
//! writes nothing; connecting happens in [`MessagePlan::build`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, ValueEnum};
use cm_dispatch::nats::{NatsConfig, NatsConfigError, NatsDispatcher};
use cm_dispatch::webhook::{WebhookConfigError, WebhookDispatcher, WebhookSecret, endpoint};
use cm_dispatch::{Dispatcher, OutboxDispatcher};
use cm_domain::SchedulerConfig;
use cm_store::PgStore;

use super::secrets;
use crate::failure::{Failure, input};

/// Where message routines go, and how to reach it.
#[derive(Debug, Args)]
pub struct MessageArgs {
    /// Where message routines go.
    #[arg(long, value_enum, default_value_t = MessageBackend::Outbox)]
    message_backend: MessageBackend,
    /// How the outbox backend writes its rows.
    #[arg(long, value_enum, default_value_t = OutboxMode::Transactional)]
    outbox_mode: OutboxMode,
    /// The webhook endpoint (with --message-backend webhook).
    #[arg(long, value_name = "URL")]
    webhook_url: Option<String>,
    /// A file holding the webhook signing secret, `whsec_<base64 key>`.
    #[arg(long, value_name = "PATH")]
    webhook_secret_file: Option<PathBuf>,
    /// The NATS server(s) (with --message-backend nats).
    #[arg(long, value_name = "URL")]
    nats_url: Option<String>,
    /// Messages are published to <prefix>.<routine id>.
    #[arg(long, value_name = "P", default_value = "cm.routines")]
    nats_subject_prefix: String,
    /// The JetStream stream, created if absent.
    #[arg(long, value_name = "NAME", default_value = "CM")]
    nats_stream: String,
    /// A NATS credentials (.creds) file.
    #[arg(long, value_name = "PATH")]
    nats_credentials_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MessageBackend {
    /// Rows in the database's outbox_messages table.
    Outbox,
    /// HTTP POSTs signed per Standard Webhooks 1.0.
    Webhook,
    /// Messages in a NATS JetStream stream.
    Nats,
}

/// How the outbox backend writes its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutboxMode {
    /// In the claim's own transaction: a fire and its message exist together or not at all.
    Transactional,
    /// By a dispatch after the claim, as an external backend's effect would be (idempotent,
    /// not transactional; for comparison and for testing the dispatch path).
    Dispatched,
}

/// A message backend whose configuration has been checked, not yet connected.
pub(crate) enum MessagePlan {
    Outbox(OutboxMode),
    Webhook(WebhookDispatcher),
    Nats(NatsConfig),
}

/// The sink of `run --events-webhook URL --events-webhook-secret-file PATH`, checked as the
/// message webhook's flags are (before anything is written); none without the flags.
pub(crate) fn events_sink(
    url: Option<&str>,
    secret_file: Option<&Path>,
) -> Result<Option<Arc<dyn crate::EventSink>>, Failure> {
    let (Some(url), Some(path)) = (url, secret_file) else {
        return Ok(None);
    };
    secrets::register_url(url);
    let secret = WebhookSecret::parse(&read_secret_file(
        path,
        "--events-webhook-secret-file",
        "events webhook secret",
    )?)
    .map_err(|e| input(format!("{}: {e}", path.display())))?;
    let webhook =
        WebhookDispatcher::new(url, secret).map_err(|e| input(format!("--events-webhook: {e}")))?;
    tracing::info!(endpoint = %webhook.shown_url(), "posting events");
    Ok(Some(Arc::new(crate::WebhookEventSink::new(webhook))))
}

impl MessageArgs {
    /// Checks the flags of the chosen backend, reading its secret or credentials file.
    /// `config` sizes the NATS duplicate window: every attempt at one occurrence falls in it.
    pub(crate) fn plan(&self, config: &SchedulerConfig) -> Result<MessagePlan, Failure> {
        let stray = |flag: &str| {
            input(format!(
                "{flag} is for another --message-backend than {}",
                self.message_backend
                    .to_possible_value()
                    .map(|v| v.get_name().to_string())
                    .unwrap_or_default()
            ))
        };
        if self.message_backend != MessageBackend::Webhook {
            if self.webhook_url.is_some() {
                return Err(stray("--webhook-url"));
            }
            if self.webhook_secret_file.is_some() {
                return Err(stray("--webhook-secret-file"));
            }
        }
        if self.message_backend != MessageBackend::Nats {
            if self.nats_url.is_some() {
                return Err(stray("--nats-url"));
            }
            if self.nats_credentials_file.is_some() {
                return Err(stray("--nats-credentials-file"));
            }
        }
        match self.message_backend {
            MessageBackend::Outbox => Ok(MessagePlan::Outbox(self.outbox_mode)),
            MessageBackend::Webhook => {
                let url = self
                    .webhook_url
                    .clone()
                    .ok_or_else(|| input("--message-backend webhook needs --webhook-url"))?;
                secrets::register_url(&url);
                let path = self.webhook_secret_file.as_deref().ok_or_else(|| {
                    input("--message-backend webhook needs --webhook-secret-file")
                })?;
                let secret = WebhookSecret::parse(&read_secret_file(
                    path,
                    "--webhook-secret-file",
                    "webhook secret",
                )?)
                .map_err(|e| input(format!("{}: {e}", path.display())))?;
                // Building the client touches no network, so a bad URL is bad input here,
                // before anything is written.
                let webhook = WebhookDispatcher::new(&url, secret).map_err(webhook_failure)?;
                Ok(MessagePlan::Webhook(webhook))
            }
            MessageBackend::Nats => {
                let url = self
                    .nats_url
                    .clone()
                    .ok_or_else(|| input("--message-backend nats needs --nats-url"))?;
                secrets::register_url(&url);
                if let Some(path) = &self.nats_credentials_file {
                    read_secret_file(path, "--nats-credentials-file", "NATS credentials")?;
                }
                let attempts = config.max_attempts.max(1);
                Ok(MessagePlan::Nats(NatsConfig {
                    url,
                    subject_prefix: self.nats_subject_prefix.clone(),
                    stream: self.nats_stream.clone(),
                    credentials_file: self.nats_credentials_file.clone(),
                    duplicate_window: config.lease.duration() * attempts,
                }))
            }
        }
    }
}

impl MessagePlan {
    /// Connects the planned backend. The transactional outbox writes through the claim's own
    /// store; a dispatched one through `dispatch_store`, a pool without the claim's timeouts
    /// (a dispatch is bounded by --dispatch-timeout, and may wait on the outbox's locks that
    /// long).
    pub(crate) async fn build(
        self,
        store: &PgStore,
        dispatch_store: &PgStore,
    ) -> Result<Arc<dyn Dispatcher>, Failure> {
        Ok(match self {
            MessagePlan::Outbox(OutboxMode::Transactional) => {
                Arc::new(OutboxDispatcher::new(store.clone()))
            }
            MessagePlan::Outbox(OutboxMode::Dispatched) => {
                Arc::new(OutboxDispatcher::dispatched(dispatch_store.clone()))
            }
            MessagePlan::Webhook(webhook) => {
                tracing::info!(url = %webhook.shown_url(), "message backend: webhook");
                Arc::new(webhook)
            }
            MessagePlan::Nats(config) => {
                let nats = NatsDispatcher::connect(&config)
                    .await
                    .map_err(|e| match e {
                        NatsConfigError::BadName(_) | NatsConfigError::Credentials { .. } => {
                            input(e.to_string())
                        }
                        other => {
                            Failure::Other(format!("{other} (server {})", endpoint(&config.url)))
                        }
                    })?;
                tracing::info!(stream = %config.stream, prefix = %config.subject_prefix,
                    duplicate_window = ?config.duplicate_window, "message backend: NATS JetStream");
                Arc::new(nats)
            }
        })
    }
}

fn webhook_failure(e: WebhookConfigError) -> Failure {
    match e {
        WebhookConfigError::Client(_) => Failure::Other(e.to_string()),
        _ => input(format!("--webhook-url: {e}")),
    }
}

/// Reads a file of secret material, registering its content with the scrubber; the error names
/// the flag, the file and the problem, never content.
fn read_secret_file(path: &Path, flag: &str, what: &str) -> Result<String, Failure> {
    let text = crate::bounded::read_file(path, crate::bounded::SECRET_FILE).map_err(|e| {
        input(format!(
            "cannot read {flag} {}, the {what} file: {e}",
            path.display()
        ))
    })?;
    secrets::register_file(&text);
    Ok(text)
}
