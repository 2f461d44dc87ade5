//! What the HTTP handlers read, in one place: the probes' and the page's handlers import it, and
//! [`crate::http::router`] wires them to it (as axum's examples keep their state).

use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderValue;
use cm_store::{RoutineStore, StatusReader};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::counters::Stats;
use crate::health::Health;
use crate::hosts::AllowedHosts;

/// What the endpoints read.
pub struct HttpState {
    /// This scheduler's counters.
    pub stats: Arc<Stats>,
    /// The database's health, checked in the background and cached: no request waits for it.
    pub health: Arc<Health>,
    /// How recent the last successful tick must be for `/readyz` to answer 200.
    pub fresh_within: Duration,
    /// Renders the process's metrics recorder for `/metrics`.
    pub metrics: PrometheusHandle,
    /// The status page, if served.
    pub status: Option<StatusPage>,
    /// The token the status page and its actions require, if any.
    pub token: Option<BearerToken>,
}

/// What the status page reads and changes besides the counters. Give it a pool of its own
/// (`cli` does): no number of page requests then takes a connection from the claims.
pub struct StatusPage {
    /// The store's read-only queries.
    pub reader: Arc<dyn StatusReader>,
    /// Where the page's actions (pause, resume, trigger) go.
    pub routines: Arc<dyn RoutineStore>,
    /// This scheduler's instance id (its claims are "its own" in flight).
    pub instance_id: String,
    /// How often an open page updates itself in place.
    pub refresh: Duration,
    /// The longest the page waits for the database before answering 503.
    pub deadline: Duration,
    /// The token every action's form carries (a cross-site form cannot know it).
    pub csrf: CsrfToken,
    /// The `Host` values the page and its actions answer (DNS rebinding); every other is
    /// refused before any handler runs, with or without a token.
    pub hosts: AllowedHosts,
    /// How this scheduler runs missions (the backend, its image, command and resources), as
    /// label and value, shown on a mission routine's page; empty without a mission backend.
    pub runner: Vec<(String, String)>,
    /// The event log the page shows (the latest on the index, a routine's on its page); none
    /// shown without one.
    pub events: Option<Arc<dyn cm_store::EventLog>>,
    /// The holiday calendars a routine's next runs are planned on; without them, a routine's
    /// next runs are listed as if it were on none.
    pub calendars: Option<Arc<dyn cm_store::CalendarStore>>,
    /// The concurrency limits the page shows (on the index, and with a routine's key on its
    /// page); without them, none is listed and a routine's key is shown alone.
    pub limits: Option<Arc<dyn cm_store::LimitStore>>,
}

impl StatusPage {
    /// A page reading `reader` and acting through `routines`, refreshing every 5 s and waiting
    /// at most 3 s for the database, with a fresh CSRF token, answering the loopback names
    /// ([`AllowedHosts::loopback`]).
    pub fn new(
        reader: Arc<dyn StatusReader>,
        routines: Arc<dyn RoutineStore>,
        instance_id: impl Into<String>,
    ) -> StatusPage {
        StatusPage {
            reader,
            routines,
            instance_id: instance_id.into(),
            refresh: Duration::from_secs(5),
            deadline: Duration::from_secs(3),
            csrf: CsrfToken::random(),
            hosts: AllowedHosts::loopback(),
            runner: Vec::new(),
            events: None,
            calendars: None,
            limits: None,
        }
    }
}

/// A secret compared in constant time; its value never reaches a log.
#[derive(Clone)]
struct Secret(String);

impl Secret {
    fn matches(&self, given: &str) -> bool {
        let (given, expected) = (given.as_bytes(), self.0.as_bytes());
        given.len() == expected.len()
            && given
                .iter()
                .zip(expected)
                .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                == 0
    }
}

/// A bearer token the status page requires. Its value never reaches a log or a response.
#[derive(Clone)]
pub struct BearerToken(Secret);

impl BearerToken {
    /// A token; `None` when it is empty (after trimming surrounding whitespace).
    pub fn new(token: &str) -> Option<Self> {
        let token = token.trim();
        (!token.is_empty()).then(|| BearerToken(Secret(token.to_string())))
    }

    /// Whether an `Authorization` header carries this token, compared in constant time. The
    /// scheme is matched without case (RFC 7235: `bearer`, `BEARER` and `Bearer` are one).
    pub fn admits(&self, header: Option<&HeaderValue>) -> bool {
        let Some((scheme, given)) = header
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.trim_start().split_once(' '))
        else {
            return false;
        };
        scheme.eq_ignore_ascii_case("bearer") && self.0.matches(given.trim())
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(***)")
    }
}

/// The token the page's forms carry: random per process, so only a page served by this
/// process (which a cross-site page cannot read) knows it.
#[derive(Clone)]
pub struct CsrfToken(Secret);

impl CsrfToken {
    /// A new random token.
    pub fn random() -> CsrfToken {
        CsrfToken(Secret(format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        )))
    }

    /// The value the page writes into its forms.
    pub fn value(&self) -> &str {
        &self.0.0
    }

    /// Whether a form carried this token, compared in constant time.
    pub fn matches(&self, given: &str) -> bool {
        self.0.matches(given)
    }
}

impl std::fmt::Debug for CsrfToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CsrfToken(***)")
    }
}
