//! The webhook backend: each occurrence is an HTTP POST signed per Standard Webhooks 1.0.
//!
//! # The contract
//!
//! The body is `{"type": "cm.routine.fired", "timestamp": <send time, RFC 3339>, "data":
//! {"routine_id", "routine_name", "scheduled_at" (RFC 3339 UTC), "attempt", "payload"}}`. The
//! headers are `webhook-id` (the occurrence's idempotency key: the same on every attempt at it,
//! different for any other), `webhook-timestamp` (unix seconds of this send), `webhook-signature`
//! (`v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`, signed by the `standardwebhooks`
//! crate with the operator's `whsec_…` secret) and `Idempotency-Key` (the id again).
//!
//! # What an answer means
//!
//! | answer | outcome |
//! |---|---|
//! | 2xx | fired; the receipt is `HTTP <status>` |
//! | 409 | fired as a duplicate: the receiver already has this `webhook-id` |
//! | 408, 429, 5xx, a timeout, a connection error | retried with exponential backoff and jitter (honouring `Retry-After`) while the dispatch's deadline allows, then failed |
//! | 3xx | failed at once: redirects are not followed, so the endpoint is exactly the configured one |
//! | any other 4xx | failed at once: the receiver refuses this message |
//!
//! Every send, retries included, is signed afresh with its own timestamp, so a receiver's
//! replay window never refuses a retry. A failure's text names the status and a short excerpt of
//! the answer (at most [`EXCERPT_CHARS`] characters), never a header, the URL or the secret.
//! Of an answer's body no more than 1 KiB is read, whatever its length or framing: an answer
//! is judged by its status, and a body that never ends holds neither the dispatch nor memory
//! (its connection is closed, not returned to the pool).
//! One pooled client serves every dispatch, so connections to the endpoint are reused.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDateTime, SecondsFormat, Utc};
use rand::Rng as _;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use tokio::time::Instant;

use crate::{Dispatch, DispatchError, Dispatcher, Receipt};

/// The most characters of a receiver's answer kept in an error.
pub const EXCERPT_CHARS: usize = 200;

/// The most bytes of an answer read to make the excerpt; the rest is never read.
const EXCERPT_BYTES: usize = 1024;

/// The event type every cm webhook carries.
pub const EVENT_TYPE: &str = "cm.routine.fired";

/// Why a webhook backend cannot be built from its configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookConfigError {
    /// The secret is not `whsec_` followed by a non-empty base64 key. The text never repeats it.
    #[error("the webhook secret must be \"whsec_\" followed by a base64 key")]
    MalformedSecret,
    /// The endpoint is not an absolute `http` or `https` URL.
    #[error("the webhook URL must be an absolute http:// or https:// URL: {0}")]
    BadUrl(String),
    /// The HTTP client could not be built (its TLS configuration).
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// A Standard Webhooks signing secret, `whsec_<base64 key>`. Its `Debug` form hides it.
pub struct WebhookSecret {
    signer: standardwebhooks::Webhook,
    text: String,
}

impl WebhookSecret {
    /// Parses a secret as an operator's file holds it (surrounding whitespace ignored).
    pub fn parse(text: &str) -> Result<Self, WebhookConfigError> {
        let text = text.trim();
        let key = text
            .strip_prefix("whsec_")
            .ok_or(WebhookConfigError::MalformedSecret)?;
        if key.is_empty() {
            return Err(WebhookConfigError::MalformedSecret);
        }
        let signer = standardwebhooks::Webhook::new(text)
            .map_err(|_| WebhookConfigError::MalformedSecret)?;
        Ok(WebhookSecret {
            signer,
            text: text.to_string(),
        })
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(***)")
    }
}

/// How a webhook dispatch retries inside its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The wait before the first retry; each later wait doubles, up to `max_backoff`.
    pub initial_backoff: Duration,
    /// The longest wait between two sends (a `Retry-After` is capped by it too).
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 250 ms doubling to 5 s: a dispatch's default 30 s deadline allows about eight sends.
    fn default() -> Self {
        RetryPolicy {
            initial_backoff: Duration::from_millis(250),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (0 for the first): exponential with full jitter in
    /// its upper half, so many schedulers retrying one receiver do not send in step.
    fn backoff(&self, retry: u32) -> Duration {
        let ceiling = self
            .initial_backoff
            .saturating_mul(2u32.saturating_pow(retry.min(16)))
            .min(self.max_backoff);
        let half = ceiling / 2;
        half + half.mul_f64(rand::rng().random::<f64>())
    }
}

/// Posts each occurrence to one operator-configured endpoint, signed per Standard Webhooks 1.0.
pub struct WebhookDispatcher {
    client: reqwest::Client,
    url: reqwest::Url,
    secret: WebhookSecret,
    retry: RetryPolicy,
}

impl fmt::Debug for WebhookDispatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookDispatcher")
            .field("url", &endpoint(self.url.as_str()))
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl WebhookDispatcher {
    /// A backend posting to `url`, signed with `secret`, with the default [`RetryPolicy`].
    pub fn new(url: &str, secret: WebhookSecret) -> Result<Self, WebhookConfigError> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| WebhookConfigError::BadUrl(format!("{e} ({})", endpoint(url))))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
            return Err(WebhookConfigError::BadUrl(endpoint(url)));
        }
        // reqwest is built without a crypto provider of its own; ring is the process default
        // (unless the embedding program installed another first).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            // Redirects are never followed: the endpoint is the operator's, and a redirect
            // must not move a signed message somewhere else.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(90))
            .user_agent(concat!("cm-scheduler/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| WebhookConfigError::Client(e.without_url().to_string()))?;
        Ok(WebhookDispatcher {
            client,
            url: parsed,
            secret,
            retry: RetryPolicy::default(),
        })
    }

    /// The same backend retrying by `retry`.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The endpoint as scheme, host and port only ([`endpoint`]), for logs.
    pub fn shown_url(&self) -> String {
        endpoint(self.url.as_str())
    }

    /// The body and headers of one send of `dispatch`, signed now.
    fn signed_request(&self, dispatch: &Dispatch) -> Result<(Vec<u8>, HeaderMap), DispatchError> {
        let mut headers = self.signed(
            dispatch.idempotency_key.as_str(),
            EVENT_TYPE,
            dispatch.message_data(),
        )?;
        let value = HeaderValue::from_str(&dispatch.traceparent().to_string()).map_err(|_| {
            DispatchError::Rejected("the trace context is not a valid header value".into())
        })?;
        headers.1.insert("traceparent", value);
        Ok(headers)
    }

    /// The body `{"type", "timestamp", "data"}` and the Standard Webhooks headers of one send
    /// of the message `id` (its `webhook-id`), signed now.
    fn signed(
        &self,
        id: &str,
        event_type: &str,
        data: serde_json::Value,
    ) -> Result<(Vec<u8>, HeaderMap), DispatchError> {
        let now = Utc::now();
        let body = serde_json::json!({
            "type": event_type,
            "timestamp": now.to_rfc3339_opts(SecondsFormat::Millis, true),
            "data": data,
        });
        let body = serde_json::to_vec(&body)
            .map_err(|e| DispatchError::Rejected(format!("cannot encode the webhook body: {e}")))?;
        let timestamp = now.timestamp();
        let signature = self
            .secret
            .signer
            .sign(id, timestamp, &body)
            .map_err(|e| DispatchError::Rejected(format!("cannot sign the webhook: {e}")))?;
        let mut headers = HeaderMap::new();
        let value = |text: &str| {
            HeaderValue::from_str(text).map_err(|_| {
                DispatchError::Rejected("the webhook id is not a valid header value".into())
            })
        };
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert("webhook-id", value(id)?);
        headers.insert("webhook-timestamp", HeaderValue::from(timestamp));
        headers.insert("webhook-signature", value(&signature)?);
        headers.insert("idempotency-key", value(id)?);
        Ok((body, headers))
    }

    /// Posts one message of type `event_type` with `data` under the id `id`, signed as every
    /// send is, once, within `timeout`: the receipt of a 2xx (or a 409, already received);
    /// [`DispatchError::Unavailable`] for an answer worth trying again later (no answer, 408,
    /// 429, 5xx) and [`DispatchError::Rejected`] for a refusal. The caller retries: an event
    /// log's delivery, which keeps its own backoff across restarts.
    pub async fn post(
        &self,
        id: &str,
        event_type: &str,
        data: serde_json::Value,
        timeout: Duration,
    ) -> Result<Receipt, DispatchError> {
        let (body, headers) = self.signed(id, event_type, data)?;
        let answer = tokio::time::timeout(timeout, self.send(body, headers))
            .await
            .map_err(|_| DispatchError::Unavailable("no answer in time".into()))?;
        match judge(answer) {
            Verdict::Done(receipt) => Ok(receipt),
            Verdict::Refused(error) => Err(DispatchError::Rejected(error)),
            Verdict::Retry { error, .. } => Err(DispatchError::Unavailable(error)),
        }
    }

    /// One send: what the receiver answered, or why there was no answer.
    async fn send_once(&self, dispatch: &Dispatch) -> Result<Answer, DispatchError> {
        let (body, headers) = self.signed_request(dispatch)?;
        Ok(self.send(body, headers).await)
    }

    /// One send of a signed body.
    async fn send(&self, body: Vec<u8>, headers: HeaderMap) -> Answer {
        let sent = self
            .client
            .post(self.url.clone())
            .headers(headers)
            .body(body)
            .send()
            .await;
        let mut response = match sent {
            Ok(response) => response,
            Err(e) => return Answer::NoAnswer(self.describe(&e)),
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, Utc::now()));
        let mut excerpt = Vec::new();
        while excerpt.len() < EXCERPT_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => excerpt.extend_from_slice(&chunk),
                // A body cut short still leaves the status to judge by.
                Ok(None) | Err(_) => break,
            }
        }
        Answer::Status {
            status,
            excerpt: self.scrub(&excerpt),
            retry_after,
        }
    }

    /// A transport error in words, without the URL (it may hold credentials).
    fn describe(&self, e: &reqwest::Error) -> String {
        let what = if e.is_timeout() {
            "the request timed out"
        } else if e.is_connect() {
            "cannot connect to the endpoint"
        } else {
            "the request failed"
        };
        let mut causes = Vec::new();
        let mut source = std::error::Error::source(e);
        while let Some(cause) = source {
            causes.push(cause.to_string());
            source = cause.source();
        }
        let text = if causes.is_empty() {
            what.to_string()
        } else {
            format!("{what}: {}", causes.join(": "))
        };
        self.scrub(text.as_bytes())
    }

    /// `bytes` as one bounded line of text, with the secret, the URL's credentials and its path removed
    /// wherever they appear (a receiver echoing a request must not leak them into the ledger).
    fn scrub(&self, bytes: &[u8]) -> String {
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(EXCERPT_BYTES)]);
        let mut text: String = text
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let key = self.secret.text.trim_start_matches("whsec_");
        let path = self.url.path();
        for secret in [
            self.secret.text.as_str(),
            key,
            self.url.password().unwrap_or(""),
            self.url.username(),
            if path == "/" { "" } else { path },
        ] {
            if !secret.is_empty() {
                text = text.replace(secret, "***");
            }
        }
        // A path segment as long as a token is hidden wherever it appears on its own.
        let segments = self.url.path_segments().into_iter().flatten();
        for segment in segments.filter(|s| s.chars().count() >= 16) {
            text = text.replace(segment, "***");
        }
        // A query often carries a token: each of its values is hidden too (those of a few
        // characters excepted, which would blank out ordinary words).
        let values = self.url.query_pairs().map(|(_, v)| v.into_owned());
        for value in values.filter(|v| v.chars().count() >= 4) {
            text = text.replace(&value, "***");
        }
        let text = text.trim();
        if text.chars().count() > EXCERPT_CHARS {
            let cut: String = text.chars().take(EXCERPT_CHARS).collect();
            format!("{cut}…")
        } else {
            text.to_string()
        }
    }
}

/// What one send produced.
enum Answer {
    /// The receiver answered with a status.
    Status {
        status: StatusCode,
        excerpt: String,
        retry_after: Option<Duration>,
    },
    /// No answer: a connection error or a timeout.
    NoAnswer(String),
}

/// What to do after one send.
enum Verdict {
    Done(Receipt),
    Refused(String),
    Retry {
        error: String,
        after: Option<Duration>,
    },
}

fn judge(answer: Answer) -> Verdict {
    match answer {
        Answer::NoAnswer(error) => Verdict::Retry { error, after: None },
        Answer::Status {
            status,
            excerpt,
            retry_after,
        } => {
            let named = match status.canonical_reason() {
                Some(reason) => format!("HTTP {} {reason}", status.as_u16()),
                None => format!("HTTP {}", status.as_u16()),
            };
            let error = if excerpt.is_empty() {
                named
            } else {
                format!("{named}: {excerpt}")
            };
            if status.is_success() {
                Verdict::Done(Receipt {
                    duplicate: false,
                    detail: format!("HTTP {}", status.as_u16()),
                })
            } else if status == StatusCode::CONFLICT {
                Verdict::Done(Receipt {
                    duplicate: true,
                    detail: "HTTP 409 already received".into(),
                })
            } else if status == StatusCode::REQUEST_TIMEOUT
                || status == StatusCode::TOO_MANY_REQUESTS
                || status.is_server_error()
            {
                Verdict::Retry {
                    error,
                    after: retry_after,
                }
            } else if status.is_redirection() {
                Verdict::Refused(format!("{error} (redirects are not followed)"))
            } else {
                Verdict::Refused(error)
            }
        }
    }
}

/// A `Retry-After` (RFC 9110 §10.2.3): delay seconds, or an HTTP-date in any of the three forms
/// a recipient must accept (IMF-fixdate, RFC 850, asctime), read as the time left until it by
/// this host's clock. A date in the past means "now"; anything else unreadable is treated as
/// absent, so the backoff applies.
fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = DateTime::parse_from_rfc2822(value)
        .map(|d| d.with_timezone(&Utc))
        .or_else(|_| {
            NaiveDateTime::parse_from_str(value, "%A, %d-%b-%y %H:%M:%S GMT").map(|d| d.and_utc())
        })
        .or_else(|_| {
            NaiveDateTime::parse_from_str(value, "%a %b %e %H:%M:%S %Y").map(|d| d.and_utc())
        })
        .ok()?;
    Some((date - now).to_std().unwrap_or(Duration::ZERO))
}

#[async_trait]
impl Dispatcher for WebhookDispatcher {
    async fn dispatch(&self, dispatch: &Dispatch) -> Result<Receipt, DispatchError> {
        let deadline = Instant::from_std(dispatch.deadline);
        let mut sends = 0u32;
        let mut last_error: Option<String> = None;
        // Retries are not logged here (the crate does no logging): the final error carries the
        // last answer and the number of sends.
        loop {
            sends += 1;
            let answer = tokio::time::timeout_at(deadline, self.send_once(dispatch))
                .await
                .map_err(|_| {
                    let earlier = last_error
                        .as_deref()
                        .map(|e| format!("; the send before answered {e}"))
                        .unwrap_or_default();
                    DispatchError::Unavailable(format!(
                        "no answer by the dispatch deadline (send {sends}{earlier})"
                    ))
                })??;
            match judge(answer) {
                Verdict::Done(receipt) => return Ok(receipt),
                Verdict::Refused(error) => return Err(DispatchError::Rejected(error)),
                Verdict::Retry { error, after } => {
                    let wait = after
                        .map(|a| a.min(self.retry.max_backoff))
                        .unwrap_or_else(|| self.retry.backoff(sends - 1));
                    if Instant::now() + wait >= deadline {
                        return Err(DispatchError::Unavailable(format!(
                            "{error} (after {sends} sends; the deadline leaves no time for another)"
                        )));
                    }
                    tokio::time::sleep(wait).await;
                    last_error = Some(error);
                }
            }
        }
    }
}

/// Where `url` points, for messages: its scheme, host and port only. Everything else may carry
/// a secret (a user and password; a path or query holding a token, as Slack's and Discord's
/// webhook URLs do). Several URLs separated by commas (NATS servers) are shown each so. A string
/// that is not a URL is shown as `<invalid URL>`, since it could be anything.
pub fn endpoint(url: &str) -> String {
    url.split(',')
        .map(|one| match url::Url::parse(one.trim()) {
            Ok(parsed) => {
                let host = parsed.host_str().unwrap_or("");
                match parsed.port_or_known_default() {
                    Some(port) => format!("{}://{host}:{port}", parsed.scheme()),
                    None => format!("{}://{host}", parsed.scheme()),
                }
            }
            Err(_) => "<invalid URL>".to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_parse_only_in_their_documented_form() {
        fn check(text: &str, ok: bool) {
            assert_eq!(WebhookSecret::parse(text).is_ok(), ok, "{text:?}");
        }
        check("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", true);
        check("  whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n", true);
        check("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", false);
        check("whsec_", false);
        check("whsec_not base64!", false);
        check("", false);
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_any_http_date() {
        let now = DateTime::parse_from_rfc3339("1994-11-06T08:49:30Z")
            .unwrap()
            .with_timezone(&Utc);
        let check = |value: &str, expected: Option<u64>| {
            assert_eq!(
                parse_retry_after(value, now),
                expected.map(Duration::from_secs),
                "{value:?}"
            );
        };
        check("120", Some(120));
        check(" 0 ", Some(0));
        check("Sun, 06 Nov 1994 08:49:37 GMT", Some(7));
        check("Sunday, 06-Nov-94 08:49:37 GMT", Some(7));
        check("Sun Nov  6 08:49:37 1994", Some(7));
        // A date already past: retry now, not never.
        check("Sun, 06 Nov 1994 08:49:00 GMT", Some(0));
        check("-5", None);
        check("soon", None);
        check("", None);
    }

    #[test]
    fn endpoints_are_shown_as_scheme_host_and_port() {
        fn check(url: &str, shown: &str) {
            assert_eq!(endpoint(url), shown);
        }
        check("https://hooks.example/in", "https://hooks.example:443");
        check(
            "https://u:p4ss@hooks.example:8443/services/T0/B0/t0ken?token=abc",
            "https://hooks.example:8443",
        );
        check("nats://t0ken@127.0.0.1:4222", "nats://127.0.0.1:4222");
        check(
            "nats://u:p@10.0.0.1:4222, nats://10.0.0.2:4222",
            "nats://10.0.0.1:4222,nats://10.0.0.2:4222",
        );
        check("not a url with p4ss", "<invalid URL>");
    }

    #[test]
    fn backoff_doubles_up_to_its_ceiling_with_jitter() {
        let policy = RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(1000),
        };
        fn check(policy: &RetryPolicy, retry: u32, low: u64, high: u64) {
            for _ in 0..50 {
                let wait = policy.backoff(retry);
                assert!(
                    wait >= Duration::from_millis(low) && wait <= Duration::from_millis(high),
                    "retry {retry}: {wait:?}"
                );
            }
        }
        check(&policy, 0, 50, 100);
        check(&policy, 1, 100, 200);
        check(&policy, 3, 400, 800);
        check(&policy, 10, 500, 1000);
    }
}
