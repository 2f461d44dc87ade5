//! The HTTP endpoints through the router itself (`tower::ServiceExt::oneshot`, no socket):
//! every metric series dashboards read, `/readyz`'s decision, the status page's token, and
//! what the page shows against a real database.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use cm_dispatch::{MemoryDispatcher, RoutedDispatcher};
use cm_domain::{MisfirePolicy, Schedule, SchedulerConfig};
use cm_scheduler::http::{BearerToken, HttpState, Readiness, readiness, router};
use cm_scheduler::status::StatusPage;
use cm_scheduler::{Scheduler, Stats};
use cm_store::{NewRoutine, PgStore, RoutineKind, RoutineStore};
use http_body_util::BodyExt as _;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use sqlx::PgPool;
use tower::ServiceExt as _;
use uuid::Uuid;

/// Every series `/metrics` carried when it was rendered by hand: dashboards query these.
const SERIES: &[&str] = &[
    "# TYPE cm_fires_total counter",
    "cm_fires_total{outcome=\"fired\"}",
    "cm_fires_total{outcome=\"failed\"}",
    "cm_fires_total{outcome=\"abandoned\"}",
    "cm_fires_total{outcome=\"in_flight\"}",
    "cm_fires_total{outcome=\"already_settled\"}",
    "cm_fires_total{outcome=\"lost_settle\"}",
    "cm_fires_total{outcome=\"settle_error\"}",
    "cm_fires_total{outcome=\"unstarted\"}",
    "cm_fires_total{outcome=\"dispatch_panic\"}",
    "# TYPE cm_mission_runs_total counter",
    "cm_mission_runs_total{state=\"running\"}",
    "cm_mission_runs_total{state=\"succeeded\"}",
    "cm_mission_runs_total{state=\"failed\"}",
    "cm_mission_runs_total{state=\"lost\"}",
    "# TYPE cm_ticks_total counter",
    "cm_ticks_total ",
    "# TYPE cm_tick_errors_total counter",
    "cm_tick_errors_total ",
    "# TYPE cm_deferred_total counter",
    "cm_deferred_total ",
    "# TYPE cm_misfires_skipped_total counter",
    "cm_misfires_skipped_total ",
    "# TYPE cm_pruned_total counter",
    "cm_pruned_total ",
    "# TYPE cm_reaped_total counter",
    "cm_reaped_total ",
    "# TYPE cm_tick_duration_seconds histogram",
    "cm_tick_duration_seconds_bucket{le=\"0.001\"}",
    "cm_tick_duration_seconds_bucket{le=\"30\"}",
    "cm_tick_duration_seconds_bucket{le=\"+Inf\"}",
    "cm_tick_duration_seconds_sum ",
    "cm_tick_duration_seconds_count ",
    "# TYPE cm_fire_lateness_seconds histogram",
    "cm_fire_lateness_seconds_bucket{le=\"0.01\"}",
    "cm_fire_lateness_seconds_bucket{le=\"3600\"}",
    "cm_fire_lateness_seconds_bucket{le=\"+Inf\"}",
    "cm_fire_lateness_seconds_sum ",
    "cm_fire_lateness_seconds_count ",
];

/// A recorder of the binary's kind with a scheduler's counters made inside it, and the
/// handle that renders it.
fn recorded_stats(record: impl FnOnce(&Stats)) -> (Arc<Stats>, PrometheusHandle) {
    let recorder = cm_scheduler::stats::prometheus_recorder().unwrap();
    let handle = recorder.handle();
    let stats = metrics::with_local_recorder(&recorder, || {
        cm_scheduler::stats::describe();
        let stats = Stats::default();
        record(&stats);
        stats
    });
    (Arc::new(stats), handle)
}

#[test]
fn metrics_keep_every_series_dashboards_read() {
    let (stats, handle) = recorded_stats(|stats| {
        stats.tick_duration.observe(Duration::from_millis(3));
        stats.lateness.observe(Duration::from_millis(40));
    });
    let text = handle.render();
    for series in SERIES {
        assert!(text.contains(series), "{series:?} missing from:\n{text}");
    }
    // The scheduler's own copy, which the page and /readyz read, agrees with the recorder.
    assert_eq!(stats.lateness.count(), 1);
    assert!(
        text.contains("cm_fire_lateness_seconds_bucket{le=\"0.05\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("cm_fire_lateness_seconds_bucket{le=\"0.01\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("cm_fires_total{outcome=\"fired\"} 0"),
        "{text}"
    );
}

/// Checks one `/readyz` decision: ready or not, and what the reason says.
fn check_readiness(
    database: Result<(), &str>,
    last_good_tick: Option<Instant>,
    last_error: Option<&str>,
    reason: Option<&str>,
) {
    let got = readiness(
        database.map_err(str::to_string),
        last_good_tick,
        Duration::from_secs(10),
        last_error.map(str::to_string),
    );
    match (reason, &got) {
        (None, Ok(())) => {}
        (Some(reason), Err(text)) => assert!(text.contains(reason), "{text:?} lacks {reason:?}"),
        _ => panic!("{database:?}, {last_error:?}: expected {reason:?}, got {got:?}"),
    }
}

#[test]
fn readiness_needs_the_database_and_a_recent_good_tick() {
    let now = Some(Instant::now());
    let stale = Instant::now().checked_sub(Duration::from_secs(60));
    check_readiness(Ok(()), now, None, None);
    // A tick that failed earlier does not matter once a later one succeeded.
    check_readiness(Ok(()), now, Some("tick failed: boom"), None);
    check_readiness(
        Err("waiting for the database: refused"),
        now,
        None,
        Some("refused"),
    );
    check_readiness(
        Err("the database does not answer"),
        None,
        None,
        Some("does not answer"),
    );
    check_readiness(Ok(()), None, None, Some("no tick has succeeded yet"));
    check_readiness(
        Ok(()),
        None,
        Some("tick failed: boom"),
        Some("tick failed: boom"),
    );
    check_readiness(
        Ok(()),
        stale,
        Some("tick failed: gone"),
        Some("no successful tick for 60s"),
    );
}

struct Answers;

#[async_trait::async_trait]
impl Readiness for Answers {
    async fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

fn state(
    store: &PgStore,
    stats: Arc<Stats>,
    metrics: PrometheusHandle,
    token: Option<&str>,
) -> Arc<HttpState> {
    Arc::new(HttpState {
        stats,
        readiness: Arc::new(Answers),
        fresh_within: Duration::from_secs(10),
        metrics,
        status: Some(StatusPage {
            reader: Arc::new(store.clone()),
            instance_id: "page-test".into(),
            refresh: Duration::from_secs(5),
        }),
        token: token.and_then(BearerToken::new),
    })
}

/// One GET through the router: its status and body.
async fn get(state: &Arc<HttpState>, path: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut request = Request::get(path);
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let response = router(state.clone())
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_page_needs_its_token_and_the_probes_do_not(pool: PgPool) {
    let store = PgStore::new(pool);
    let (stats, metrics) = recorded_stats(|_| {});
    let state = state(&store, stats.clone(), metrics, Some("s3cret-token\n"));
    // (path, token sent, expected status)
    let cases: &[(&str, Option<&str>, StatusCode)] = &[
        ("/", None, StatusCode::UNAUTHORIZED),
        ("/", Some("wrong"), StatusCode::UNAUTHORIZED),
        ("/", Some("s3cret-token-longer"), StatusCode::UNAUTHORIZED),
        ("/", Some("s3cret-token"), StatusCode::OK),
        (
            "/routines/00000000-0000-0000-0000-000000000001",
            None,
            StatusCode::UNAUTHORIZED,
        ),
        (
            "/routines/00000000-0000-0000-0000-000000000001",
            Some("s3cret-token"),
            StatusCode::NOT_FOUND,
        ),
        ("/livez", None, StatusCode::OK),
        ("/metrics", None, StatusCode::OK),
        // No tick has run: unready, but answered, not refused for want of a token.
        ("/readyz", None, StatusCode::SERVICE_UNAVAILABLE),
        ("/nothing-here", None, StatusCode::NOT_FOUND),
    ];
    for (path, token, expected) in cases {
        let (status, body) = get(&state, path, *token).await;
        assert_eq!(status, *expected, "{path} with {token:?}: {body}");
        assert!(
            !body.contains("s3cret-token"),
            "{path} shows the token: {body}"
        );
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_page_shows_routines_fires_and_failures_but_no_payload(pool: PgPool) {
    let store = PgStore::new(pool);
    let create = |name: &str, kind, payload| {
        store.create_routine(NewRoutine {
            name: name.into(),
            schedule: Schedule::parse("30 2 * * *", "America/New_York").unwrap(),
            kind,
            payload,
            misfire: MisfirePolicy::FireOnce,
            paused: false,
        })
    };
    let message = create(
        "daily-digest",
        RoutineKind::Message,
        json!({ "text": "private words" }),
    )
    .await
    .unwrap();
    let mission = create(
        "nightly-audit",
        RoutineKind::Mission,
        json!({ "repository": "https://git.example.com/private.git" }),
    )
    .await
    .unwrap();
    store.trigger_routine(message.id).await.unwrap();
    store.trigger_routine(mission.id).await.unwrap();

    // One real tick fires the message and fails the mission (no mission backend).
    let (stats, metrics) = recorded_stats(|_| {});
    let scheduler = Scheduler::new(
        Arc::new(store.clone()),
        Arc::new(RoutedDispatcher::new(
            Some(Arc::new(MemoryDispatcher::new())),
            None,
        )),
        SchedulerConfig::default(),
        "page-test",
    )
    .unwrap();
    let report = scheduler.tick().await.unwrap();
    assert_eq!((report.fired, report.failed), (1, 1), "{report:?}");
    let state = state(&store, stats, metrics, None);

    let (status, index) = get(&state, "/", None).await;
    assert_eq!(status, StatusCode::OK, "{index}");
    for shown in [
        "daily-digest",
        "nightly-audit",
        "America/New_York",
        "<code>30 2 * * *</code>",
        "<span class=\"fired\">fired</span>",
        "<span class=\"failed\">failed</span>",
        "no mission backend is configured",
        "http-equiv=\"refresh\"",
        &format!("href=\"/routines/{}\"", mission.id),
    ] {
        assert!(
            index.contains(shown),
            "{shown:?} missing from the index:\n{index}"
        );
    }
    // The next run is shown in the routine's zone (02:30 in New York is 07:30 UTC in winter,
    // 06:30 in summer) and in UTC.
    let next = message.next_run_at.unwrap();
    let utc = next.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert!(index.contains(&utc), "{utc} missing:\n{index}");
    assert!(
        index.contains(" 02:30:00 E"),
        "the zone's wall time is missing:\n{index}"
    );

    let (status, page) = get(&state, &format!("/routines/{}", mission.id), None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    for shown in [
        "nightly-audit",
        "mission",
        "fire-once",
        "contents not shown",
        "no mission backend is configured",
    ] {
        assert!(
            page.contains(shown),
            "{shown:?} missing from the routine page:\n{page}"
        );
    }
    let next_runs = page.split("id=\"next-runs\"").nth(1).unwrap_or_default();
    let next_runs = next_runs.split("</table>").next().unwrap_or_default();
    assert_eq!(
        next_runs.matches("<td>").count(),
        10,
        "five runs, in the zone and in UTC: {next_runs}"
    );

    for body in [&index, &page] {
        for hidden in ["private words", "private.git"] {
            assert!(
                !body.contains(hidden),
                "the payload leaks {hidden:?}:\n{body}"
            );
        }
    }

    let (status, _) = get(&state, &format!("/routines/{}", Uuid::new_v4()), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = get(&state, "/routines/not-a-uuid", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}
