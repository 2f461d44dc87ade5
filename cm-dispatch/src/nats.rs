//! The NATS JetStream backend: each occurrence is a message published with `Nats-Msg-Id` set to
//! its idempotency key, so the stream stores it once.
//!
//! A message goes to `<prefix>.<routine_id>`; its body is [`Dispatch::message_data`] as JSON.
//! The stream (default `CM`, subjects `<prefix>.>`) is created when absent, with a duplicate
//! window the caller sizes to cover every attempt at one occurrence (the scheduler passes its
//! lease times its attempt limit); an existing stream whose window is shorter is widened. A
//! dispatch is `fired` only on the server's acknowledgement; an acknowledgement saying
//! `duplicate` is `fired` too, and its receipt says so. A publish that gets no acknowledgement
//! is sent again (same `Nats-Msg-Id`, so the stream still stores it once) until the dispatch's
//! deadline.
//!
//! # What is read of the server, unbounded
//!
//! What the server sends back (an acknowledgement, a stream's info, a stored message) is read
//! by async-nats (0.51), whose connection task buffers each protocol message whole at the length
//! the server declares (`MSG`/`HMSG`, not checked against any maximum) and each control line up
//! to its line end, however long. It has no bound of its own on what it receives, and no hook
//! to add one: it opens its connections itself (no custom transport), and its
//! `read_buffer_capacity` is only the buffer's initial size. So a server that answers with a
//! message that never completes (declared a terabyte long, or bytes without a line end) makes
//! the client read and keep all it sends, in the background, after the dispatch is over; and
//! the rest of that connection's traffic waits behind it.
//!
//! What is bounded is time: every call is made under the dispatch's deadline (or start-up's
//! connect timeout), so a dispatch ends, unacknowledged (`unavailable`), at its deadline
//! whatever the server sends. The test
//! `an_endless_reply_ends_the_dispatch_at_its_deadline_but_async_nats_reads_all_of_it` shows
//! both: the deadline kept, and the client reading the whole flood. The server is the
//! operator's own, like the database; use TLS to it where the network between is not the
//! operator's.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, stream::LastRawMessageErrorKind};
use async_trait::async_trait;
use tokio::time::Instant;

use crate::{Dispatch, DispatchError, Dispatcher, Receipt};

/// How long to wait before sending an unacknowledged publish again.
const REPUBLISH_BACKOFF: Duration = Duration::from_millis(200);

/// Where and how the NATS backend publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// The server(s), `nats://host:port` (comma-separated for several).
    pub url: String,
    /// Messages go to `<subject_prefix>.<routine_id>`.
    pub subject_prefix: String,
    /// The JetStream stream holding them.
    pub stream: String,
    /// A `.creds` file (JWT and NKey seed), when the server wants one.
    pub credentials_file: Option<PathBuf>,
    /// How long the stream remembers a `Nats-Msg-Id`: at least as long as any retry of one
    /// occurrence can come after its first attempt.
    pub duplicate_window: Duration,
}

impl NatsConfig {
    /// Checks the subject prefix and the stream name as NATS would take them, without the
    /// network: what [`NatsDispatcher::connect`] refuses first, for a caller to refuse before it
    /// writes or waits for anything.
    pub fn check_names(&self) -> Result<(), NatsConfigError> {
        check_prefix(&self.subject_prefix)?;
        check_stream_name(&self.stream)
    }
}

/// Why the NATS backend could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsConfigError {
    /// A subject prefix or stream name NATS would refuse (bad input).
    #[error("{0}")]
    BadName(String),
    /// The credentials file is missing, unreadable or malformed (bad input).
    #[error("cannot read the NATS credentials file {path}: {reason}")]
    Credentials {
        /// The file.
        path: String,
        /// Why (never its content).
        reason: String,
    },
    /// The server did not accept the connection.
    #[error("cannot connect to NATS: {0}")]
    Connect(String),
    /// The stream could not be found, created or widened (the server failing or not ready:
    /// JetStream answers late after a restart).
    #[error("JetStream stream {stream}: {reason}")]
    Stream {
        /// The stream.
        stream: String,
        /// Why.
        reason: String,
    },
    /// The stream exists but does not take the prefix's subjects: a configuration to change,
    /// not a moment to wait out.
    #[error(
        "JetStream stream {stream}: it exists but does not take {wanted} (its subjects: {subjects})"
    )]
    StreamSubjects {
        /// The stream.
        stream: String,
        /// The subjects it takes, comma-separated.
        subjects: String,
        /// The subjects cm publishes to.
        wanted: String,
    },
}

impl NatsConfigError {
    /// Whether waiting may help: the server not answering, or its stream calls failing (a
    /// server starting again, JetStream not ready yet). Bad names, an unreadable credentials
    /// file and a stream that takes other subjects stay wrong until the operator changes them.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            NatsConfigError::Connect(_) | NatsConfigError::Stream { .. }
        )
    }
}

/// Publishes each occurrence to a JetStream stream, deduplicated by `Nats-Msg-Id`.
#[derive(Debug, Clone)]
pub struct NatsDispatcher {
    jetstream: jetstream::Context,
    subject_prefix: String,
    stream: String,
    /// The stream's duplicate window as it stands after [`NatsDispatcher::connect`].
    duplicate_window: Duration,
}

impl NatsDispatcher {
    /// Connects to the server and makes sure the stream exists with a wide enough duplicate
    /// window.
    pub async fn connect(config: &NatsConfig) -> Result<Self, NatsConfigError> {
        config.check_names()?;
        let mut options = async_nats::ConnectOptions::new()
            .name("cm-scheduler")
            .connection_timeout(Duration::from_secs(10));
        if let Some(path) = &config.credentials_file {
            options =
                options
                    .credentials_file(path)
                    .await
                    .map_err(|e| NatsConfigError::Credentials {
                        path: path.display().to_string(),
                        reason: e.kind().to_string(),
                    })?;
        }
        // The connect error names no credentials; the URL itself is never repeated.
        let client = options
            .connect(config.url.as_str())
            .await
            .map_err(|e| NatsConfigError::Connect(e.kind().to_string()))?;
        let jetstream = jetstream::new(client);
        let mut dispatcher = NatsDispatcher {
            jetstream,
            subject_prefix: config.subject_prefix.clone(),
            stream: config.stream.clone(),
            duplicate_window: config.duplicate_window,
        };
        dispatcher.duplicate_window = dispatcher.ensure_stream(config.duplicate_window).await?;
        Ok(dispatcher)
    }

    /// Makes sure the stream exists, takes the prefix's subjects and dedupes over at least
    /// `window`; returns its duplicate window.
    async fn ensure_stream(&self, window: Duration) -> Result<Duration, NatsConfigError> {
        let failed = |reason: String| NatsConfigError::Stream {
            stream: self.stream.clone(),
            reason,
        };
        let subjects = format!("{}.>", self.subject_prefix);
        let stream = self
            .jetstream
            .get_or_create_stream(jetstream::stream::Config {
                name: self.stream.clone(),
                subjects: vec![subjects.clone()],
                duplicate_window: window,
                ..Default::default()
            })
            .await
            .map_err(|e| failed(e.to_string()))?;
        let mut config = stream.cached_info().config.clone();
        if !config.subjects.iter().any(|s| s == &subjects || s == ">") {
            return Err(NatsConfigError::StreamSubjects {
                stream: self.stream.clone(),
                subjects: config.subjects.join(", "),
                wanted: subjects,
            });
        }
        if config.duplicate_window < window {
            config.duplicate_window = window;
            self.jetstream
                .update_stream(&config)
                .await
                .map_err(|e| failed(format!("cannot widen its duplicate window: {e}")))?;
        }
        Ok(config.duplicate_window)
    }

    /// Whether a retry whose first attempt is older than the duplicate window may publish.
    ///
    /// Past the window the stream no longer drops a second copy by its `Nats-Msg-Id`, so the
    /// stream is read instead: the subject's last message being this occurrence's proves it is
    /// stored (the retry publishes nothing and reports the duplicate), and an empty subject
    /// proves it is not (the retry publishes). Anything else cannot be told apart from "stored
    /// earlier", and the retry is refused, naming why, rather than risk a second message.
    async fn past_the_window(&self, dispatch: &Dispatch) -> Result<Option<Receipt>, DispatchError> {
        // What matters is when a publish now could still be stored: up to the deadline.
        let left = dispatch
            .deadline
            .saturating_duration_since(std::time::Instant::now());
        let age = dispatch.first_attempt_age.saturating_add(left);
        if dispatch.attempt <= 1 || age < self.duplicate_window {
            return Ok(None);
        }
        let subject = self.subject(dispatch.occurrence.routine_id);
        let unreadable = |e: String| {
            DispatchError::Unavailable(format!("cannot read stream {}: {e}", self.stream))
        };
        let stream = self
            .jetstream
            .get_stream_no_info(&self.stream)
            .await
            .map_err(|e| unreadable(e.to_string()))?;
        match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(last) => {
                let id = last
                    .headers
                    .get(async_nats::header::NATS_MESSAGE_ID)
                    .map(|v| v.as_str());
                if id == Some(dispatch.idempotency_key.as_str()) {
                    return Ok(Some(Receipt {
                        duplicate: true,
                        detail: format!(
                            "jetstream stream {} seq {} duplicate (found in the stream)",
                            self.stream, last.sequence
                        ),
                    }));
                }
                Err(DispatchError::Rejected(format!(
                    "not published: the first attempt began {}s ago, past the stream's {}s \
                     duplicate window, so the stream would not drop a second copy, and it may \
                     hold this occurrence already (its last message on {subject} is another's)",
                    dispatch.first_attempt_age.as_secs(),
                    self.duplicate_window.as_secs_f64()
                )))
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unreadable(e.to_string())),
        }
    }

    /// The subject an occurrence of `routine_id` is published to.
    pub fn subject(&self, routine_id: uuid::Uuid) -> String {
        format!("{}.{routine_id}", self.subject_prefix)
    }

    async fn publish_once(
        &self,
        dispatch: &Dispatch,
        body: &[u8],
    ) -> Result<jetstream::publish::PublishAck, (bool, String)> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            dispatch.idempotency_key.as_str(),
        );
        headers.insert("Cm-Attempt", dispatch.attempt.to_string().as_str());
        headers.insert("traceparent", dispatch.traceparent().to_string().as_str());
        let retryable = |kind: PublishErrorKind| {
            !matches!(
                kind,
                PublishErrorKind::StreamNotFound | PublishErrorKind::MaxPayloadExceeded
            )
        };
        let ack = self
            .jetstream
            .publish_with_headers(
                self.subject(dispatch.occurrence.routine_id),
                headers,
                body.to_vec().into(),
            )
            .await
            .map_err(|e| (retryable(e.kind()), e.to_string()))?;
        ack.await.map_err(|e| (retryable(e.kind()), e.to_string()))
    }
}

#[async_trait]
impl Dispatcher for NatsDispatcher {
    async fn dispatch(&self, dispatch: &Dispatch) -> Result<Receipt, DispatchError> {
        let deadline = Instant::from_std(dispatch.deadline);
        let body = serde_json::to_vec(&dispatch.message_data())
            .map_err(|e| DispatchError::Rejected(format!("cannot encode the message: {e}")))?;
        let checked = tokio::time::timeout_at(deadline, self.past_the_window(dispatch))
            .await
            .map_err(|_| {
                DispatchError::Unavailable("the stream could not be read by the deadline".into())
            })?;
        if let Some(receipt) = checked? {
            return Ok(receipt);
        }
        let mut publishes = 0u32;
        loop {
            publishes += 1;
            let error = match tokio::time::timeout_at(deadline, self.publish_once(dispatch, &body))
                .await
            {
                Err(_) => format!(
                    "no JetStream acknowledgement by the dispatch deadline (publish {publishes})"
                ),
                Ok(Ok(ack)) => {
                    let duplicate = if ack.duplicate { " duplicate" } else { "" };
                    return Ok(Receipt {
                        duplicate: ack.duplicate,
                        detail: format!(
                            "jetstream stream {} seq {}{duplicate}",
                            ack.stream, ack.sequence
                        ),
                    });
                }
                Ok(Err((false, error))) => {
                    return Err(DispatchError::Rejected(format!("jetstream: {error}")));
                }
                Ok(Err((true, error))) => format!("jetstream: {error}"),
            };
            if Instant::now() + REPUBLISH_BACKOFF >= deadline {
                return Err(DispatchError::Unavailable(format!(
                    "{error} (after {publishes} publishes)"
                )));
            }
            tokio::time::sleep(REPUBLISH_BACKOFF).await;
        }
    }
}

/// A subject prefix: dot-separated tokens, none empty, no wildcards or whitespace.
fn check_prefix(prefix: &str) -> Result<(), NatsConfigError> {
    let token_ok = |t: &str| {
        !t.is_empty()
            && t.chars()
                .all(|c| !c.is_whitespace() && !c.is_control() && c != '*' && c != '>')
    };
    if prefix.split('.').all(token_ok) {
        Ok(())
    } else {
        Err(NatsConfigError::BadName(format!(
            "invalid NATS subject prefix {prefix:?}: dot-separated tokens without spaces, '*' or '>'"
        )))
    }
}

/// A stream name: non-empty, no whitespace, `.`, `*`, `>`, `/` or `\`.
fn check_stream_name(name: &str) -> Result<(), NatsConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name.chars().all(|c| {
            !c.is_whitespace() && !c.is_control() && !matches!(c, '.' | '*' | '>' | '/' | '\\')
        });
    if ok {
        Ok(())
    } else {
        Err(NatsConfigError::BadName(format!(
            "invalid JetStream stream name {name:?}: no spaces, '.', '*', '>', '/' or '\\'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_nats_would_refuse_are_refused_before_connecting() {
        fn check_p(prefix: &str, ok: bool) {
            assert_eq!(check_prefix(prefix).is_ok(), ok, "prefix {prefix:?}");
        }
        fn check_s(stream: &str, ok: bool) {
            assert_eq!(check_stream_name(stream).is_ok(), ok, "stream {stream:?}");
        }
        check_p("cm.routines", true);
        check_p("cm", true);
        check_p("cm..x", false);
        check_p("cm.*", false);
        check_p("cm.>", false);
        check_p("", false);
        check_p("a b", false);
        check_s("CM", true);
        check_s("CM_FIRES-1", true);
        check_s("CM.X", false);
        check_s("", false);
        check_s("a b", false);
    }
}
