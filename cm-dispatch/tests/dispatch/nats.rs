//! The NATS backend against the JetStream server at 127.0.0.1:4222 (`NATS_URL` overrides it).
//!
//! Each test uses a stream and subject prefix of its own and deletes the stream at the end.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{TimeZone, Utc};
use cm_dispatch::conformance::{EffectProbe, check_backend};
use cm_dispatch::nats::{NatsConfig, NatsConfigError};
use cm_dispatch::{Dispatch, Dispatcher, NatsDispatcher};
use cm_domain::RoutineKind;
use cm_domain::{IdempotencyKey, Occurrence};
use serde_json::{Value, json};

use crate::nats_proxy::{Mode, NatsProxy};

fn server() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

fn config(window: Duration) -> NatsConfig {
    let unique = uuid::Uuid::new_v4().simple().to_string();
    NatsConfig {
        url: server(),
        subject_prefix: format!("cmtest.{unique}"),
        stream: format!("CMTEST_{unique}"),
        credentials_file: None,
        duplicate_window: window,
    }
}

/// The server's view of a stream, read with a client of the test's own.
async fn jetstream() -> async_nats::jetstream::Context {
    async_nats::jetstream::new(async_nats::connect(server()).await.unwrap())
}

fn dispatch(routine_id: uuid::Uuid, minute: u32, attempt: u32) -> Dispatch {
    Dispatch::new(
        Occurrence::new(
            routine_id,
            Utc.with_ymd_and_hms(2026, 3, 29, 1, minute, 0).unwrap(),
        ),
        "standup",
        RoutineKind::Message,
        json!({ "text": "standup in 5" }),
        attempt,
        Instant::now() + Duration::from_secs(10),
    )
}

#[tokio::test]
async fn a_second_publish_of_one_occurrence_is_stored_once() {
    let config = config(Duration::from_secs(180));
    let nats = NatsDispatcher::connect(&config).await.unwrap();
    let js = jetstream().await;
    let routine = uuid::Uuid::new_v4();

    let first = nats.dispatch(&dispatch(routine, 0, 1)).await.unwrap();
    let again = nats.dispatch(&dispatch(routine, 0, 2)).await.unwrap();
    let other = nats.dispatch(&dispatch(routine, 1, 1)).await.unwrap();

    let mut stream = js.get_stream(&config.stream).await.unwrap();
    let info = stream.info().await.unwrap().clone();
    js.delete_stream(&config.stream).await.unwrap();

    assert!(!first.duplicate);
    assert_eq!(
        first.detail,
        format!("jetstream stream {} seq 1", config.stream)
    );
    assert!(again.duplicate);
    assert_eq!(
        again.detail,
        format!("jetstream stream {} seq 1 duplicate", config.stream)
    );
    assert!(!other.duplicate);
    assert_eq!(
        other.detail,
        format!("jetstream stream {} seq 2", config.stream)
    );
    assert_eq!(info.state.messages, 2, "two occurrences, three publishes");
    assert_eq!(info.config.duplicate_window, Duration::from_secs(180));
    assert_eq!(
        info.config.subjects,
        vec![format!("{}.>", config.subject_prefix)]
    );
}

/// A retry whose first attempt is older than the stream's duplicate window (here a stream of
/// the test's own with a one-second window) publishes no second message: found in the stream,
/// it is reported as the duplicate it is; not provably absent, it is refused naming the window;
/// provably absent (nothing on its subject), it is published.
#[tokio::test]
async fn a_retry_past_the_duplicate_window_never_stores_a_second_message() {
    let config = config(Duration::from_secs(1));
    let nats = NatsDispatcher::connect(&config).await.unwrap();
    let js = jetstream().await;
    let routine = uuid::Uuid::new_v4();
    let late =
        |minute, attempt, age| dispatch(routine, minute, attempt).with_first_attempt_age(age);

    let first = nats.dispatch(&dispatch(routine, 0, 1)).await.unwrap();
    // Time passes on purpose: past the stream's 1 s duplicate window.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let retry = nats.dispatch(&late(0, 2, Duration::from_secs(2))).await;
    let next = nats.dispatch(&dispatch(routine, 1, 1)).await.unwrap();
    let retry_after_next = nats.dispatch(&late(0, 3, Duration::from_secs(3))).await;
    let never_published =
        dispatch(uuid::Uuid::new_v4(), 0, 2).with_first_attempt_age(Duration::from_secs(5));
    let unpublished = nats.dispatch(&never_published).await;

    let mut stream = js.get_stream(&config.stream).await.unwrap();
    let messages = stream.info().await.unwrap().state.messages;
    js.delete_stream(&config.stream).await.unwrap();

    assert_eq!(
        first.detail,
        format!("jetstream stream {} seq 1", config.stream)
    );
    let retry = retry.unwrap();
    assert!(retry.duplicate, "{retry:?}");
    assert!(retry.detail.contains("seq 1 duplicate"), "{retry:?}");
    assert_eq!(
        next.detail,
        format!("jetstream stream {} seq 2", config.stream)
    );
    let refused = retry_after_next.unwrap_err().to_string();
    assert!(
        refused.contains("not published") && refused.contains("duplicate window"),
        "{refused}"
    );
    let unpublished = unpublished.unwrap();
    assert!(!unpublished.duplicate, "{unpublished:?}");
    assert_eq!(messages, 3, "three occurrences, each stored once");
}

#[tokio::test]
async fn a_message_carries_its_key_subject_and_body() {
    let config = config(Duration::from_secs(120));
    let nats = NatsDispatcher::connect(&config).await.unwrap();
    let js = jetstream().await;
    let d = dispatch(uuid::Uuid::new_v4(), 5, 1);
    nats.dispatch(&d).await.unwrap();

    let stream = js.get_stream(&config.stream).await.unwrap();
    let message = stream.get_raw_message(1).await.unwrap();
    js.delete_stream(&config.stream).await.unwrap();

    assert_eq!(
        message.subject.as_str(),
        format!("{}.{}", config.subject_prefix, d.occurrence.routine_id)
    );
    let headers = message.headers;
    assert_eq!(
        headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|v| v.as_str()),
        Some(d.idempotency_key.as_str())
    );
    assert_eq!(
        headers.get("traceparent").map(|v| v.as_str().to_owned()),
        Some(d.traceparent().to_string())
    );
    let body: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
    assert_eq!(body, d.message_data());
}

#[tokio::test]
async fn an_existing_stream_with_a_short_window_is_widened() {
    let config = config(Duration::from_secs(600));
    let js = jetstream().await;
    js.create_stream(async_nats::jetstream::stream::Config {
        name: config.stream.clone(),
        subjects: vec![format!("{}.>", config.subject_prefix)],
        duplicate_window: Duration::from_secs(30),
        ..Default::default()
    })
    .await
    .unwrap();
    let connected = NatsDispatcher::connect(&config).await;
    let mut stream = js.get_stream(&config.stream).await.unwrap();
    let window = stream.info().await.unwrap().config.duplicate_window;
    js.delete_stream(&config.stream).await.unwrap();
    connected.unwrap();
    assert_eq!(window, Duration::from_secs(600));
}

/// A server that does not answer is worth waiting for; a stream taking other subjects is not:
/// the scheduler waits out the first and refuses to start on the second.
#[tokio::test]
async fn an_unreachable_server_is_transient_and_a_stream_of_other_subjects_is_not() {
    let mut down = config(Duration::from_secs(60));
    down.url = "nats://127.0.0.1:1".into();
    let err = NatsDispatcher::connect(&down).await.unwrap_err();
    assert!(matches!(err, NatsConfigError::Connect(_)), "{err}");
    assert!(err.is_transient(), "{err}");

    let config = config(Duration::from_secs(60));
    let js = jetstream().await;
    js.create_stream(async_nats::jetstream::stream::Config {
        name: config.stream.clone(),
        subjects: vec![format!("{}.other.>", config.subject_prefix)],
        ..Default::default()
    })
    .await
    .unwrap();
    let refused = NatsDispatcher::connect(&config).await;
    js.delete_stream(&config.stream).await.unwrap();
    let err = refused.unwrap_err();
    assert!(!err.is_transient(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("does not take") && text.contains(&format!("{}.>", config.subject_prefix)),
        "{text}"
    );
}

#[tokio::test]
async fn bad_names_and_a_missing_credentials_file_are_refused_at_start() {
    fn check(result: Result<NatsDispatcher, NatsConfigError>, fragment: &str) {
        let err = result.unwrap_err().to_string();
        assert!(err.contains(fragment), "{err}");
    }
    let mut bad = config(Duration::from_secs(60));
    bad.stream = "CM.X".into();
    check(
        NatsDispatcher::connect(&bad).await,
        "invalid JetStream stream name",
    );
    let mut bad = config(Duration::from_secs(60));
    bad.subject_prefix = "cm.*".into();
    check(
        NatsDispatcher::connect(&bad).await,
        "invalid NATS subject prefix",
    );
    let mut bad = config(Duration::from_secs(60));
    bad.credentials_file = Some("/nonexistent/cm.creds".into());
    check(
        NatsDispatcher::connect(&bad).await,
        "cannot read the NATS credentials file",
    );
}

/// The conformance suite's hold on JetStream: the stream itself counts effects (messages with the
/// key as `Nats-Msg-Id`), and the proxy in front of the server stalls or refuses publishes.
struct NatsProbe {
    proxy: NatsProxy,
    jetstream: async_nats::jetstream::Context,
    stream: String,
}

impl NatsProbe {
    /// The bodies of the stream's messages published under `key`.
    async fn messages(&self, key: &IdempotencyKey) -> Result<Vec<Value>, String> {
        let mut stream = self
            .jetstream
            .get_stream(&self.stream)
            .await
            .map_err(|e| e.to_string())?;
        let state = stream
            .info()
            .await
            .map_err(|e| e.to_string())?
            .state
            .clone();
        let mut found = Vec::new();
        for seq in state.first_sequence..=state.last_sequence {
            let Ok(message) = stream.get_raw_message(seq).await else {
                continue;
            };
            let id = message
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .map(|v| v.as_str().to_owned());
            if id.as_deref() == Some(key.as_str()) {
                found.push(serde_json::from_slice(&message.payload).map_err(|e| e.to_string())?);
            }
        }
        Ok(found)
    }
}

#[async_trait]
impl EffectProbe for NatsProbe {
    async fn effects(&self, key: &IdempotencyKey) -> Result<usize, String> {
        Ok(self.messages(key).await?.len())
    }
    async fn payload(&self, key: &IdempotencyKey) -> Result<Option<Value>, String> {
        Ok(self
            .messages(key)
            .await?
            .first()
            .map(|body| body["payload"].clone()))
    }
    async fn stall(&self) -> Result<(), String> {
        self.proxy.set(Mode::Stall);
        Ok(())
    }
    async fn fail(&self, reason: &str) -> Result<(), String> {
        self.proxy.set(Mode::Refuse(reason.to_owned()));
        Ok(())
    }
    async fn heal(&self) -> Result<(), String> {
        self.proxy.set(Mode::Pass);
        Ok(())
    }
    fn secret(&self) -> Option<String> {
        None
    }
}

/// A configuration whose URL is a proxy in front of the real server, the proxy, and a backend
/// connected through it.
async fn through_proxy() -> (NatsConfig, NatsProxy, NatsDispatcher) {
    let mut config = config(Duration::from_secs(120));
    let upstream = server()
        .trim_start_matches("nats://")
        .trim_end_matches('/')
        .to_owned();
    let proxy = NatsProxy::start(upstream, config.subject_prefix.clone()).await;
    config.url = proxy.url();
    let nats = NatsDispatcher::connect(&config).await.unwrap();
    (config, proxy, nats)
}

/// The whole conformance suite, stall and refusal included: the backend talks to the real
/// server through a proxy that can swallow publishes or answer them with a JetStream error.
#[tokio::test]
async fn nats_backend_conforms() {
    let (config, proxy, nats) = through_proxy().await;
    let probe = NatsProbe {
        proxy,
        jetstream: jetstream().await,
        stream: config.stream.clone(),
    };
    let outcome = check_backend(&nats, &probe, RoutineKind::Message).await;
    probe.jetstream.delete_stream(&config.stream).await.unwrap();
    outcome.unwrap();
}

/// What is bounded of a NATS reply, and what is not. async-nats reads every protocol message
/// whole at the length the server declares, and a control line up to its line end, with no
/// bound of its own and no hook to add one (see `cm_dispatch::nats`). So a reply that never
/// completes (an acknowledgement declared a terabyte long, or bytes without a line end) ends the
/// dispatch at its deadline, but the client goes on reading it into memory: the test's proxy
/// sees the client take all FLOOD_BYTES it sends. Should async-nats ever bound its reads, the
/// last assertion fails, and the module's documentation is to be updated.
#[tokio::test]
async fn an_endless_reply_ends_the_dispatch_at_its_deadline_but_async_nats_reads_all_of_it() {
    use crate::nats_proxy::{FLOOD_BYTES, Flood};
    use cm_dispatch::DispatchError;
    for flood in [Flood::HugeMessage, Flood::NoLineEnd] {
        let (config, proxy, nats) = through_proxy().await;
        proxy.set(Mode::Flood(flood));
        let mut d = dispatch(uuid::Uuid::new_v4(), 0, 1);
        d.deadline = Instant::now() + Duration::from_secs(2);
        // Bounded: the dispatch ends at its deadline, unacknowledged.
        let err = nats.dispatch(&d).await.unwrap_err();
        assert!(
            matches!(err, DispatchError::Unavailable(_)),
            "{flood:?}: {err:?}"
        );
        // Not bounded: the client takes every byte, far more than the kernel's buffers hold
        // (a client that stopped reading would hold the proxy's writes a few MiB in).
        cm_dispatch::fakes::wait::wait_until(
            "the client to take the whole flood",
            cm_dispatch::fakes::wait::PATIENCE,
            async || proxy.flooded(),
            |taken| *taken == FLOOD_BYTES,
        )
        .await;
        jetstream()
            .await
            .delete_stream(&config.stream)
            .await
            .unwrap();
    }
}
