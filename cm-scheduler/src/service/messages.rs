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
                let nats = NatsConfig {
                    url,
                    subject_prefix: self.nats_subject_prefix.clone(),
                    stream: self.nats_stream.clone(),
                    credentials_file: self.nats_credentials_file.clone(),
                    duplicate_window: config.lease.duration() * attempts,
                };
                nats.check_names().map_err(|e| input(e.to_string()))?;
                Ok(MessagePlan::Nats(nats))
            }
        }
    }
}

impl MessagePlan {
    /// Builds the planned backend. The transactional outbox writes through the claim's own
    /// store; a dispatched one through `dispatch_store`, a pool without the claim's timeouts
    /// (a dispatch is bounded by --dispatch-timeout, and may wait on the outbox's locks that
    /// long). NATS is connected later, by [`NatsConnection::wait`] during start-up's waits: the
    /// dispatcher returned stands in for it until then (nothing dispatches before start-up
    /// ends).
    pub(crate) fn build(
        self,
        store: &PgStore,
        dispatch_store: &PgStore,
    ) -> (Arc<dyn Dispatcher>, Option<NatsConnection>) {
        match self {
            MessagePlan::Outbox(OutboxMode::Transactional) => {
                (Arc::new(OutboxDispatcher::new(store.clone())), None)
            }
            MessagePlan::Outbox(OutboxMode::Dispatched) => (
                Arc::new(OutboxDispatcher::dispatched(dispatch_store.clone())),
                None,
            ),
            MessagePlan::Webhook(webhook) => {
                tracing::info!(url = %webhook.shown_url(), "message backend: webhook");
                (Arc::new(webhook), None)
            }
            MessagePlan::Nats(config) => {
                let slot = Arc::new(LateDispatcher::default());
                let connection = NatsConnection {
                    config,
                    slot: slot.clone(),
                };
                (slot, Some(connection))
            }
        }
    }
}

/// The NATS backend still to connect, and the slot its dispatcher goes in.
pub(crate) struct NatsConnection {
    config: NatsConfig,
    slot: Arc<LateDispatcher>,
}

impl NatsConnection {
    /// Connects, retrying with backoff while the server does not answer (a broker restarting
    /// as the scheduler starts), each failure kept as `/readyz`'s reason through `waiting`.
    /// A configuration the server refuses for good (a bad name, unreadable credentials, a
    /// stream taking other subjects) ends start-up with its error.
    pub(crate) async fn wait(self, waiting: impl Fn(Option<String>)) -> Result<(), Failure> {
        let server = endpoint(&self.config.url);
        let mut backoff = std::time::Duration::from_millis(500);
        let nats = loop {
            match NatsDispatcher::connect(&self.config).await {
                Ok(nats) => break nats,
                Err(e) if e.is_transient() => {
                    waiting(Some(format!("waiting for NATS: {e} (server {server})")));
                    tracing::warn!(error = %e, server = %server, retry_in = ?backoff,
                        "NATS does not answer yet; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(std::time::Duration::from_secs(5));
                }
                Err(e @ (NatsConfigError::BadName(_) | NatsConfigError::Credentials { .. })) => {
                    return Err(input(e.to_string()));
                }
                Err(e) => return Err(Failure::Other(format!("{e} (server {server})"))),
            }
        };
        waiting(None);
        tracing::info!(stream = %self.config.stream, prefix = %self.config.subject_prefix,
            duplicate_window = ?self.config.duplicate_window, "message backend: NATS JetStream");
        let _ = self.slot.0.set(Arc::new(nats));
        Ok(())
    }
}

/// A dispatcher filled in once its backend connects; until then every dispatch is unavailable.
/// It stands only for backends that dispatch (no in-claim effect), as NATS does.
#[derive(Default)]
pub(crate) struct LateDispatcher(std::sync::OnceLock<Arc<dyn Dispatcher>>);

#[async_trait::async_trait]
impl Dispatcher for LateDispatcher {
    async fn dispatch(
        &self,
        dispatch: &cm_dispatch::Dispatch,
    ) -> Result<cm_dispatch::Receipt, cm_dispatch::DispatchError> {
        match self.0.get() {
            Some(inner) => inner.dispatch(dispatch).await,
            None => Err(cm_dispatch::DispatchError::Unavailable(
                "the backend is not connected yet".into(),
            )),
        }
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
