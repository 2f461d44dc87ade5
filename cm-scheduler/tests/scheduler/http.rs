//! The HTTP endpoints through the router itself (`tower::ServiceExt::oneshot`, no socket):
//! every metric series dashboards read, `/readyz`'s decision, the status page's token, and
//! what the page shows against a real database.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::{PATIENCE, new_routine, wait_until};
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use cm_dispatch::{MemoryDispatcher, RoutedDispatcher};
use cm_domain::SchedulerConfig;
use cm_scheduler::health::{Health, Readiness};
use cm_scheduler::http::{readiness, router};
use cm_scheduler::http_state::{BearerToken, HttpState, StatusPage};
use cm_scheduler::{Scheduler, Stats};
use cm_store::{EventLog, PgStore, RoutineKind, RoutineStore};
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
    "cm_routines_planned_total{outcome=\"planned\"}",
    "cm_routines_planned_total{outcome=\"refused\"}",
    "# TYPE cm_mission_runs_total counter",
    "cm_mission_runs_total{state=\"succeeded\"}",
    "cm_mission_runs_total{state=\"failed\"}",
    "cm_mission_runs_total{state=\"lost\"}",
    "# TYPE cm_mission_launches_total counter",
    "cm_mission_launches_total ",
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
    let recorder = cm_scheduler::counters::prometheus_recorder().unwrap();
    let handle = recorder.handle();
    let stats = metrics::with_local_recorder(&recorder, || {
        cm_scheduler::counters::describe();
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
    // A run is counted once, at its end: no series of runs "running" that only ever grows.
    assert!(
        !text.contains("cm_mission_runs_total{state=\"running\"}"),
        "{text}"
    );
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

/// A check that always answers, counting how often it was asked.
#[derive(Default)]
struct Answers(AtomicUsize);

#[async_trait::async_trait]
impl Readiness for Answers {
    async fn check(&self) -> Result<(), String> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A check that never answers, as a database behind a network that stopped forwarding.
struct Hangs;

#[async_trait::async_trait]
impl Readiness for Hangs {
    async fn check(&self) -> Result<(), String> {
        std::future::pending().await
    }
}

/// Health checked once by `check`, without a background task.
async fn checked(check: Arc<dyn Readiness>) -> Arc<Health> {
    let health = Health::new(check, Duration::from_secs(1), Duration::from_millis(300));
    health.refresh().await;
    health
}

async fn state(
    store: &PgStore,
    stats: Arc<Stats>,
    metrics: PrometheusHandle,
    token: Option<&str>,
) -> Arc<HttpState> {
    state_with(
        store,
        stats,
        metrics,
        token,
        checked(Arc::new(Answers::default())).await,
    )
}

fn state_with(
    store: &PgStore,
    stats: Arc<Stats>,
    metrics: PrometheusHandle,
    token: Option<&str>,
    health: Arc<Health>,
) -> Arc<HttpState> {
    let mut page = StatusPage::new(
        Arc::new(store.clone()),
        Arc::new(store.clone()),
        "page-test",
    );
    page.deadline = Duration::from_millis(500);
    page.events = Some(Arc::new(store.clone()));
    page.calendars = Some(Arc::new(store.clone()));
    page.limits = Some(Arc::new(store.clone()));
    Arc::new(HttpState {
        stats,
        health,
        fresh_within: Duration::from_secs(10),
        metrics,
        status: Some(page),
        token: token.and_then(BearerToken::new),
    })
}

/// One request through the router: its status, headers and body.
async fn send(state: &Arc<HttpState>, request: Request<Body>) -> (StatusCode, HeaderMap, String) {
    let response = router(state.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

/// One GET through the router: its status and body.
async fn get(state: &Arc<HttpState>, path: &str, token: Option<&str>) -> (StatusCode, String) {
    get_as(state, path, token.map(|t| format!("Bearer {t}"))).await
}

/// One GET with `authorization` as the whole `Authorization` header.
async fn get_as(
    state: &Arc<HttpState>,
    path: &str,
    authorization: Option<String>,
) -> (StatusCode, String) {
    // Sent to one of the page's own names, as a browser at the page sends it.
    let mut request = Request::get(path).header(header::HOST, "localhost:9464");
    if let Some(authorization) = authorization {
        request = request.header(header::AUTHORIZATION, authorization);
    }
    let (status, _, body) = send(state, request.body(Body::empty()).unwrap()).await;
    (status, body)
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_page_needs_its_token_and_the_probes_do_not(pool: PgPool) {
    let store = PgStore::new(pool);
    let (stats, metrics) = recorded_stats(|_| {});
    let state = state(&store, stats.clone(), metrics, Some("s3cret-token\n")).await;
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
    // The scheme is a token without case (RFC 7235); the credentials are not.
    for (header, expected) in [
        ("bearer s3cret-token", StatusCode::OK),
        ("BEARER s3cret-token", StatusCode::OK),
        ("Bearer   s3cret-token ", StatusCode::OK),
        ("Bearer S3CRET-TOKEN", StatusCode::UNAUTHORIZED),
        ("Basic s3cret-token", StatusCode::UNAUTHORIZED),
        ("Bearers3cret-token", StatusCode::UNAUTHORIZED),
        ("s3cret-token", StatusCode::UNAUTHORIZED),
    ] {
        let (status, body) = get_as(&state, "/", Some(header.into())).await;
        assert_eq!(status, expected, "Authorization: {header}: {body}");
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_page_shows_routines_fires_failures_and_missions_but_no_message_or_secret(
    pool: PgPool,
) {
    let store = PgStore::new(pool);
    let create = |name: &str, kind, payload| {
        store.create_routine(new_routine(
            name,
            "30 2 * * *",
            "America/New_York",
            kind,
            payload,
        ))
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
        json!({ "repository": "https://git.example.com/team/audit.git",
                "task": "audit it, token=abc123secret", "ref": "main",
                "env": { "LANG": "C.UTF-8", "API_TOKEN": "s3cr3t-value" },
                "labels": { "routine/team": "platform" } }),
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
    let state = state(&store, stats, metrics, None).await;

    let (status, index) = get(&state, "/", None).await;
    assert_eq!(status, StatusCode::OK, "{index}");
    for shown in [
        "daily-digest",
        "nightly-audit",
        "America/New_York",
        "<code>30 2 * * *</code>",
        // The schedule as a person would say it, beside the expression.
        "<span class=\"muted small reads\">02:30 every day, America/New_York</span>",
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
        "<dt>Reads</dt><dd class=\"reads\">02:30 every day, America/New_York</dd>",
        "no mission backend is configured",
        // The mission, its secrets masked.
        "<code>https://git.example.com/team/audit.git</code>",
        "audit it, token=***",
        "<code>main</code>",
        "<code>LANG=C.UTF-8</code>",
        "<code>API_TOKEN=***</code>",
        "<code>routine/team=platform</code>",
        "This scheduler has no mission backend",
    ] {
        assert!(
            page.contains(shown),
            "{shown:?} missing from the routine page:\n{page}"
        );
    }
    let next_runs = page.split("id=\"next-runs\"").nth(1).unwrap_or_default();
    let next_runs = next_runs.split("</table>").next().unwrap_or_default();
    assert_eq!(
        next_runs.matches("<td").count(),
        15,
        "five runs, in the zone, in UTC and how far: {next_runs}"
    );

    let (_, message_page) = get(&state, &format!("/routines/{}", message.id), None).await;
    assert!(
        message_page.contains("bytes (contents not shown)"),
        "{message_page}"
    );
    for body in [&index, &page, &message_page] {
        for hidden in [
            "private words",
            "hunter2secret",
            "abc123secret",
            "s3cr3t-value",
        ] {
            assert!(
                !body.contains(hidden),
                "the payload leaks {hidden:?}:\n{body}"
            );
        }
    }

    let (status, _) = get(&state, &format!("/routines/{}", Uuid::new_v4()), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A name is a handle as the command line takes it; a missing one is a page, not a parser.
    let (status, page) = get(&state, "/routines/nightly-audit", None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("<h1>nightly-audit</h1>"), "{page}");
    let (status, page) = get(&state, "/routines/%FF", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(page.contains("does not name a routine"), "{page}");
    let (status, page) = get(&state, "/routines/standup", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{page}");
    assert!(
        page.contains("No routine is named “standup”.") && page.contains("<!DOCTYPE html>"),
        "{page}"
    );
}

/// A routine of `kind` running every minute, created paused or not.
async fn every_minute(store: &PgStore, name: &str, paused: bool) -> cm_store::Routine {
    store
        .create_routine(
            new_routine(
                name,
                "* * * * *",
                "UTC",
                RoutineKind::Message,
                json!({ "text": "hello" }),
            )
            .into_builder()
            .paused(paused)
            .build()
            .unwrap(),
        )
        .await
        .unwrap()
}

/// The page's CSRF token, as its forms carry it.
fn csrf(state: &HttpState) -> String {
    state.status.as_ref().unwrap().csrf.value().to_string()
}

/// A POST of an action's form, with extra headers.
async fn post(
    state: &Arc<HttpState>,
    path: &str,
    form: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, String) {
    let mut request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::HOST, "127.0.0.1:9464");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    send(state, request.body(Body::from(form.to_string())).unwrap()).await
}

async fn paused(store: &PgStore, id: Uuid) -> bool {
    store.get_routine(id).await.unwrap().paused
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn actions_need_a_post_from_this_page_with_its_token(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let standup = every_minute(&store, "standup", false).await;
    let (stats, metrics) = recorded_stats(|_| {});
    let state = state(&store, stats, metrics, None).await;
    let token = csrf(&state);
    let form = format!("csrf={token}&back=%2F%3Fstate%3Dactive");

    // Never by a GET.
    let (status, _) = get(&state, "/routines/standup/pause", None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    // Never by a cross-site form (the browser says so, or its Origin is another host), nor
    // without the page's token, nor with a wrong one.
    let refusals: &[(&str, &[(&str, &str)])] = &[
        (&form, &[("sec-fetch-site", "cross-site")]),
        (&form, &[("sec-fetch-site", "same-site")]),
        (&form, &[("origin", "https://evil.example")]),
        (&form, &[("origin", "null")]),
        ("back=%2F", &[("sec-fetch-site", "same-origin")]),
        ("csrf=guess&back=%2F", &[]),
    ];
    for (body, headers) in refusals {
        let (status, _, page) = post(&state, "/routines/standup/pause", body, headers).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body} {headers:?}: {page}");
        assert!(page.contains("refused"), "{page}");
        assert!(
            !paused(&store, standup.id).await,
            "{body} {headers:?} paused it"
        );
    }

    // From the page itself: done, and back where it came from, saying what was done.
    let (status, headers, _) = post(
        &state,
        "/routines/standup/pause",
        &form,
        &[
            ("sec-fetch-site", "same-origin"),
            ("origin", "http://127.0.0.1:9464"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let location = headers[header::LOCATION].to_str().unwrap().to_string();
    assert_eq!(location, "/?state=active&done=paused&of=standup");
    assert!(paused(&store, standup.id).await);
    let (_, page) = get(&state, &location, None).await;
    assert!(page.contains("Paused “standup”"), "{page}");

    // Without a browser's headers (curl with the form token), by id, back to a foreign host:
    // the redirect stays on this server.
    let (status, headers, _) = post(
        &state,
        &format!("/routines/{}/resume", standup.id),
        &format!("csrf={token}&back=%2F%2Fevil.example%2F"),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(
        headers[header::LOCATION],
        "/routines/standup?done=resumed&of=standup"
    );
    assert!(!paused(&store, standup.id).await);

    let (status, _, _) = post(&state, "/routines/standup/trigger", &form, &[]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let pending = store.pending_requests(standup.id, 5).await.unwrap();
    assert_eq!(pending.total, 1, "the trigger asked for one occurrence");

    let (status, _, page) = post(&state, "/routines/nobody/pause", &form, &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{page}");
    assert!(page.contains("No routine is named “nobody”."), "{page}");

    // The forms on the page carry the token, behind a confirmation.
    let (_, page) = get(&state, "/", None).await;
    assert!(
        page.contains(&format!("name=\"csrf\" value=\"{token}\"")),
        "{page}"
    );
    assert!(page.contains("<summary>Pause…</summary>"), "{page}");
    assert!(
        page.contains("action=\"/routines/standup/pause\""),
        "{page}"
    );
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_index_filters_sorts_and_pictures_the_fires(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let zeta = every_minute(&store, "zeta-report", false).await;
    let alpha = every_minute(&store, "alpha-report", true).await;
    every_minute(&store, "cleanup", false).await;
    // Fires of the last minutes: two fired and one failed for zeta, one running.
    sqlx::query(
        "INSERT INTO cm.routine_fires (routine_id, scheduled_at, status, claimant, claim_token, attempt,
                                    claimed_at, lease_expires_at, completed_at, error)
         SELECT $1, now() - make_interval(mins => m), s, 'test', gen_random_uuid(), 1, now(),
                now() + interval '1 minute', CASE WHEN s <> 'claimed' THEN now() END,
                CASE WHEN s = 'failed' THEN 'boom' END
         FROM (VALUES (1, 'fired'), (2, 'failed'), (3, 'fired'), (0, 'claimed')) AS t(m, s)",
    )
    .bind(zeta.id)
    .execute(&pool)
    .await
    .unwrap();
    let (stats, metrics) = recorded_stats(|_| {});
    let state = state(&store, stats, metrics, None).await;

    let rows = |page: &str| -> Vec<String> {
        page.split("<tr data-routine=")
            .skip(1)
            .filter_map(|row| {
                let link = row.split("<a href=\"/routines/").nth(1)?;
                let name = link.split_once("\">")?.1;
                Some(name.split('<').next()?.to_string())
            })
            .collect()
    };
    let (_, page) = get(&state, "/?sort=name", None).await;
    assert_eq!(
        rows(&page),
        ["alpha-report", "cleanup", "zeta-report"],
        "{page}"
    );
    let (_, page) = get(&state, "/?q=REPORT&state=active", None).await;
    assert_eq!(rows(&page), ["zeta-report"], "{page}");
    let (_, page) = get(&state, "/?state=paused", None).await;
    assert_eq!(rows(&page), ["alpha-report"], "{page}");
    let (_, page) = get(&state, &format!("/?sort=name&after={}", alpha.id), None).await;
    assert_eq!(rows(&page), ["cleanup", "zeta-report"], "{page}");
    let (_, page) = get(&state, "/?q=nothing-like-it", None).await;
    assert!(page.contains("No routine matches."), "{page}");
    for bad in ["/?sort=age", "/?state=running", "/?after=12"] {
        let (status, page) = get(&state, bad, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {page}");
        assert!(page.contains("must be"), "{bad}: {page}");
    }

    let (_, page) = get(&state, "/", None).await;
    let zeta_row = page
        .split(&format!("<tr data-routine=\"{}\">", zeta.id))
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .unwrap();
    // The strip, oldest left: fired, failed, fired, running.
    let cells: Vec<&str> = zeta_row
        .split("class=\"cell ")
        .skip(1)
        .map(|c| c.split('"').next().unwrap())
        .collect();
    assert_eq!(cells, ["fired", "failed", "fired", "claimed"], "{zeta_row}");
    assert!(zeta_row.contains("failed: boom"), "{zeta_row}");
    assert!(
        zeta_row.contains("<span class=\"claimed\">running</span>"),
        "{zeta_row}"
    );
    assert!(
        zeta_row.contains("<span class=\"active\">active</span>"),
        "{zeta_row}"
    );
    // The running fire began now, and the next run is ahead: "in …", or "now" as well when the
    // page was drawn in the last second before the minute.
    assert!(
        zeta_row.contains(">now</time>")
            && (zeta_row.contains(">in ") || zeta_row.matches(">now</time>").count() >= 2),
        "{zeta_row}"
    );
    // The last hour, drawn on the server: two fired and one failed, in their minutes.
    let chart = page
        .split("<svg")
        .nth(1)
        .and_then(|c| c.split("</svg>").next())
        .unwrap();
    assert_eq!(chart.matches("class=\"fired\"").count(), 2, "{chart}");
    assert_eq!(chart.matches("class=\"failed\"").count(), 1, "{chart}");
    assert!(
        page.contains("2 fired") && page.contains("1 failed"),
        "{page}"
    );
    assert!(page.contains("Outbox backlog"), "{page}");
    // Updates in place (a script, with a switch), a refresh only without script.
    assert!(page.contains("<script src=\"/page.js\" defer>"), "{page}");
    assert!(page.contains("id=\"live-toggle\""), "{page}");
    assert!(
        page.contains("<noscript><meta http-equiv=\"refresh\""),
        "{page}"
    );
    let (_, off) = get(&state, "/?live=off", None).await;
    assert!(!off.contains("http-equiv=\"refresh\""), "{off}");

    // Words: the fires' heading counts what it shows.
    let (_, page) = get(&state, "/routines/zeta-report", None).await;
    assert!(page.contains("All 4 fires"), "{page}");
}

/// A name stored before invisible characters were refused (or written around the store's
/// callers) is shown with them escaped: a right-to-left override cannot reorder the page.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn stored_text_is_shown_with_invisible_characters_escaped(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let r = every_minute(&store, "payroll", false).await;
    sqlx::query("UPDATE cm.routines SET name = $2 WHERE id = $1")
        .bind(r.id)
        .bind("pay\u{202e}lor\u{200b}x")
        .execute(&pool)
        .await
        .unwrap();
    let (stats, metrics) = recorded_stats(|_| {});
    let state = state(&store, stats, metrics, None).await;
    let (_, page) = get(&state, "/", None).await;
    assert!(
        !page.contains('\u{202e}') && !page.contains('\u{200b}'),
        "{page}"
    );
    assert!(page.contains("pay\\u{202e}lor\\u{200b}x"), "{page}");
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_pause_reason_is_said_once_and_kept_short_in_the_table(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let r = every_minute(&store, "flaky", true).await;
    let reason = format!(
        "paused by cm: its last 5 fires failed; the latest: {}",
        "x".repeat(400)
    );
    sqlx::query("UPDATE cm.routines SET paused_reason = $2 WHERE id = $1")
        .bind(r.id)
        .bind(&reason)
        .execute(&pool)
        .await
        .unwrap();
    let (stats, metrics) = recorded_stats(|_| {});
    let state = state(&store, stats, metrics, None).await;
    let (_, page) = get(&state, "/", None).await;
    assert!(!page.contains("paused: paused"), "{page}");
    assert!(
        page.contains("<span class=\"paused\">paused</span><span class=\"reason small muted\""),
        "{page}"
    );
    assert!(page.contains(">by cm: its last 5 fires failed"), "{page}");
    assert!(
        page.contains(
            ".reason{display:block;max-width:14em;overflow:hidden;text-overflow:ellipsis"
        ),
        "{page}"
    );
}

/// A routine's events are on its page, and the latest of every routine on the index, a missed
/// deadline marked as a failure is.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn events_are_listed_on_the_index_and_the_routines_page(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let r = every_minute(&store, "watched", false).await;
    store.set_routine_paused(r.id, true).await.unwrap();
    store.set_routine_paused(r.id, false).await.unwrap();
    sqlx::query(
        "UPDATE cm.routines SET deadline_secs = 1, next_run_at = now() - interval '5 seconds'
         WHERE id = $1",
    )
    .bind(r.id)
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(store.raise_missed_deadlines(None).await.unwrap().len(), 1);
    let (stats, metrics) = recorded_stats(|_| {});
    let state = state(&store, stats, metrics, None).await;
    let (_, index) = get(&state, "/", None).await;
    assert!(index.contains("Latest events"), "{index}");
    assert!(index.contains("<table id=\"latest-events\">"), "{index}");
    for word in ["paused", "resumed", "deadline_missed"] {
        assert!(index.contains(&format!(">{word}<")), "{word}: {index}");
    }
    assert!(
        index.contains("class=\"nowrap error\">deadline_missed"),
        "{index}"
    );
    let (_, page) = get(&state, &format!("/routines/{}", r.id), None).await;
    assert!(page.contains("<table id=\"events\">"), "{page}");
    assert!(
        page.contains("by: person, reason: paused by a person"),
        "{page}"
    );
    assert!(page.contains("state: not claimed"), "{page}");
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn health_is_checked_once_per_interval_whatever_the_requests(pool: PgPool) {
    let store = PgStore::new(pool);
    let (stats, metrics) = recorded_stats(|_| {});
    let answers = Arc::new(Answers::default());
    let health = Health::new(
        answers.clone(),
        Duration::from_millis(200),
        Duration::from_secs(1),
    );
    let checks = tokio::spawn(health.clone().run());
    let state = state_with(&store, stats, metrics, None, health);
    wait_until(
        "the first health check",
        PATIENCE,
        async || answers.0.load(Ordering::SeqCst),
        |asked| *asked >= 1,
    )
    .await;
    let started = Instant::now();
    let requests: Vec<_> = (0..300)
        .map(|_| {
            let state = state.clone();
            tokio::spawn(async move { get(&state, "/readyz", None).await })
        })
        .collect();
    for request in requests {
        // The database answers; no tick ran (none is needed for this).
        let (status, body) = request.await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body.contains("no tick has succeeded yet"), "{body}");
    }
    let elapsed = started.elapsed();
    let asked = answers.0.load(Ordering::SeqCst);
    assert!(
        asked <= (elapsed.as_millis() / 200) as usize + 2,
        "{asked} checks for 300 requests in {elapsed:?}"
    );
    checks.abort();
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn readyz_and_the_page_answer_at_once_when_the_database_hangs(pool: PgPool) {
    let store = PgStore::new(pool);
    let (stats, metrics) = recorded_stats(|_| {});
    // The check hangs: its deadline makes it an answer, and requests never wait on it.
    let health = Health::new(
        Arc::new(Hangs),
        Duration::from_secs(1),
        Duration::from_millis(200),
    );
    let checks = tokio::spawn(health.clone().run());
    let state = state_with(&store, stats, metrics, None, health);
    unavailable_at_once(
        &state,
        &["/readyz", "/", "/routines/standup"],
        "not been checked yet",
    )
    .await;
    wait_until(
        "the hanging check's deadline to become its answer",
        PATIENCE,
        async || get(&state, "/readyz", None).await,
        |(_, body)| body.contains("did not answer within 200ms"),
    )
    .await;
    unavailable_at_once(&state, &["/readyz", "/"], "did not answer within 200ms").await;
    checks.abort();
}

/// A check that answers, with a reason known in memory the test sets (no host qualifies).
#[derive(Default)]
struct KnownNow(std::sync::Mutex<Option<String>>);

#[async_trait::async_trait]
impl Readiness for KnownNow {
    async fn check(&self) -> Result<(), String> {
        Ok(())
    }

    fn known_now(&self) -> Option<String> {
        self.0.lock().unwrap().clone()
    }
}

/// A failover shorter than the check's interval still shows: the reason known in memory is read
/// on every request, and goes with the switch.
#[tokio::test]
async fn a_reason_known_now_shows_before_the_next_check() {
    let known = Arc::new(KnownNow::default());
    let health = Health::new(
        known.clone(),
        Duration::from_secs(3600),
        Duration::from_secs(1),
    );
    health.refresh().await;
    assert_eq!(health.current(), Ok(()));
    let reason = "no host is usable with target_session_attrs=read-write: h1 is read-only";
    *known.0.lock().unwrap() = Some(reason.to_string());
    assert_eq!(health.current(), Err(reason.to_string()));
    *known.0.lock().unwrap() = None;
    assert_eq!(health.current(), Ok(()));
}

/// Asserts that each of `paths` answers 503 within 100 ms, saying `reason`.
async fn unavailable_at_once(state: &Arc<HttpState>, paths: &[&str], reason: &str) {
    for path in paths {
        let started = Instant::now();
        let (status, body) = get(state, path, None).await;
        let took = started.elapsed();
        assert!(took < Duration::from_millis(100), "{path} took {took:?}");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {body}");
        assert!(body.contains(reason), "{path}: {body}");
    }
}

#[tokio::test]
async fn the_page_answers_within_its_deadline_when_the_network_hangs() {
    // A listener that accepts and never answers: the TCP forwarder that stopped forwarding.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let store = PgStore::connect_lazy(&format!("postgres://postgres@127.0.0.1:{port}/cm")).unwrap();
    let (stats, metrics) = recorded_stats(|_| {});
    // The last check said it answered; the page's own reads then hang.
    let state = state_with(
        &store,
        stats,
        metrics,
        None,
        checked(Arc::new(Answers::default())).await,
    );
    for path in ["/", "/routines/standup"] {
        let started = Instant::now();
        let (status, body) = get(&state, path, None).await;
        let took = started.elapsed();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {body}");
        assert!(
            body.contains("did not answer within 500ms"),
            "{path}: {body}"
        );
        assert!(took < Duration::from_secs(2), "{path} took {took:?}");
    }
    held.abort();
}

#[test]
fn relative_times_read_as_people_say_them() {
    use cm_scheduler::page::relative;
    let now = chrono::Utc::now();
    let minutes = chrono::Duration::minutes;
    for (at, said) in [
        (now, "now"),
        (now + chrono::Duration::seconds(40), "in 40 s"),
        (now + minutes(3), "in 3 min"),
        (now - minutes(150), "2 h ago"),
        (now - minutes(60 * 24 * 3), "3 d ago"),
    ] {
        assert_eq!(relative(at, now), said);
    }
}

/// A form post of the page's edit or delete, as the page's own form sends it.
async fn submit(
    state: &Arc<HttpState>,
    path: &str,
    fields: &[(&str, &str)],
) -> (StatusCode, String, String) {
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    form.append_pair("csrf", &csrf(state));
    for (name, value) in fields {
        form.append_pair(name, value);
    }
    let (status, headers, body) = post(
        state,
        path,
        &form.finish(),
        &[("sec-fetch-site", "same-origin")],
    )
    .await;
    let location = headers
        .get(header::LOCATION)
        .map(|l| l.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, location, body)
}

/// The page's edit form changes schedule, zone, misfire policy, a message's text and a
/// mission's overlap, checked as `routine update` checks them: a refused edit answers 400 with
/// the same reason the command line gives and changes nothing; an edit that changes nothing
/// says so; the form needs the page's token.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_page_edits_settings_with_the_checks_of_routine_update(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let digest = store
        .create_routine(new_routine(
            "digest",
            "0 9 * * *",
            "Europe/Berlin",
            RoutineKind::Message,
            json!({ "text": "old words" }),
        ))
        .await
        .unwrap();
    let audit = store
        .create_routine(new_routine(
            "audit",
            "0 3 * * *",
            "UTC",
            RoutineKind::Mission,
            json!({ "repository": "https://git.example.com/team/audit.git", "task": "audit" }),
        ))
        .await
        .unwrap();
    let (stats, metrics) = recorded_stats(|_| {});
    let state = state(&store, stats, metrics, None).await;

    // The form is on the routine's page, filled with its settings, the message left empty.
    let (_, page) = get(&state, "/routines/digest", None).await;
    for shown in [
        "action=\"/routines/digest/edit\"",
        "name=\"schedule\" value=\"0 9 * * *\"",
        "name=\"timezone\" value=\"Europe/Berlin\"",
        "<option value=\"fire-once\" selected>",
        "name=\"message\"",
    ] {
        assert!(page.contains(shown), "{shown:?} missing:\n{page}");
    }
    assert!(!page.contains("old words"), "{page}");
    assert!(
        !page.contains("name=\"overlap\""),
        "a message has no overlap: {page}"
    );

    // Refused as `routine update` refuses, in its words; nothing changes.
    let same = |schedule: &'static str, zone: &'static str| cm_scheduler::edit::Edit {
        schedule: Some(schedule),
        timezone: Some(zone),
        ..Default::default()
    };
    let before = store.get_routine(digest.id).await.unwrap();
    for (fields, edit) in [
        (
            [("schedule", "61 * * * *"), ("timezone", "Europe/Berlin")],
            same("61 * * * *", "Europe/Berlin"),
        ),
        (
            [("schedule", "0 9 * * *"), ("timezone", "Mars/Olympus")],
            same("0 9 * * *", "Mars/Olympus"),
        ),
    ] {
        let reason = edit
            .checked(RoutineKind::Message, None, "overlap")
            .unwrap_err();
        let (status, _, body) = submit(&state, "/routines/digest/edit", &fields).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{fields:?}: {body}");
        assert!(
            body.contains(&format!("Nothing was changed: {}", maud_escaped(&reason))),
            "{reason:?} missing:\n{body}"
        );
        assert_eq!(store.get_routine(digest.id).await.unwrap(), before);
    }
    let too_long = "x".repeat(cm_domain::MAX_MESSAGE_BYTES + 1);
    let (status, _, body) =
        submit(&state, "/routines/digest/edit", &[("message", &too_long)]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("at most"), "{body}");
    assert_eq!(store.get_routine(digest.id).await.unwrap(), before);

    // Without the page's token: refused, nothing changed.
    let (status, _, _) = post(
        &state,
        "/routines/digest/edit",
        "schedule=0+7+*+*+*&timezone=UTC",
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(store.get_routine(digest.id).await.unwrap(), before);

    // The same settings: nothing to save.
    let (status, location, _) = submit(
        &state,
        "/routines/digest/edit",
        &[
            ("schedule", "0 9 * * *"),
            ("timezone", "Europe/Berlin"),
            ("misfire", "fire-once"),
            ("message", ""),
            ("back", "/routines/digest"),
        ],
    )
    .await;
    assert_eq!(
        (status, location.as_str()),
        (
            StatusCode::SEE_OTHER,
            "/routines/digest?done=unchanged&of=digest"
        )
    );
    assert_eq!(store.get_routine(digest.id).await.unwrap(), before);

    // A real edit: every setting the form has, in one write; the next run follows.
    let (status, location, _) = submit(
        &state,
        "/routines/digest/edit",
        &[
            ("schedule", "30 7 * * MON-FRI"),
            ("timezone", "Asia/Tokyo"),
            ("misfire", "skip"),
            ("message", "new words"),
            ("back", "/routines/digest"),
        ],
    )
    .await;
    assert_eq!(
        (status, location.as_str()),
        (
            StatusCode::SEE_OTHER,
            "/routines/digest?done=edited&of=digest"
        )
    );
    let after = store.get_routine(digest.id).await.unwrap();
    assert_eq!(
        (
            after.schedule.as_str(),
            after.timezone.as_str(),
            after.misfire_policy.as_str()
        ),
        ("30 7 * * MON-FRI", "Asia/Tokyo", "skip")
    );
    assert_eq!(after.payload, json!({ "text": "new words" }));
    let next = after
        .next_run_at
        .unwrap()
        .with_timezone(&chrono_tz::Asia::Tokyo);
    assert_eq!(next.format("%H:%M").to_string(), "07:30", "{next}");
    let (_, page) = get(&state, &location, None).await;
    assert!(page.contains("Saved “digest”"), "{page}");

    // A mission's overlap, from its own form.
    let (_, page) = get(&state, "/routines/audit", None).await;
    assert!(page.contains("name=\"overlap\""), "{page}");
    assert!(!page.contains("name=\"message\""), "{page}");
    let (status, _, body) = submit(
        &state,
        "/routines/audit/edit",
        &[
            ("schedule", "0 3 * * *"),
            ("timezone", "UTC"),
            ("misfire", "fire-once"),
            ("overlap", "replace"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(
        store.get_routine(audit.id).await.unwrap().overlap,
        cm_domain::OverlapPolicy::Replace
    );
    let (status, _, body) =
        submit(&state, "/routines/audit/edit", &[("overlap", "sometimes")]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        store.get_routine(audit.id).await.unwrap().overlap,
        cm_domain::OverlapPolicy::Replace
    );
}

/// A message routine at midnight on 1 January, sharing `key`'s limit: never due while a test
/// runs.
async fn yearly_keyed(store: &PgStore, name: &str, key: Option<&str>) -> cm_store::Routine {
    store
        .create_routine(
            new_routine(
                name,
                "0 0 1 1 *",
                "UTC",
                RoutineKind::Message,
                json!({ "text": "hello" }),
            )
            .into_builder()
            .concurrency_key(key.map(|k| k.parse().unwrap()))
            .build()
            .unwrap(),
        )
        .await
        .unwrap()
}

/// The part of `page` from the element with `id` to the end of its table or list.
fn section<'a>(page: &'a str, id: &str, end: &str) -> &'a str {
    let from = page
        .split(&format!("id=\"{id}\""))
        .nth(1)
        .unwrap_or_else(|| panic!("no {id:?} in:\n{page}"));
    from.split(end).next().unwrap_or_default()
}

/// A routine's page shows its concurrency key with the key's limit and the places its routines'
/// fires hold now (or that the key has no limit); the index lists the limits as `limit list`
/// does, and has no such section while no limit is set.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_routines_key_shows_its_limit_and_the_index_lists_the_limits(pool: PgPool) {
    use cm_store::{ClaimDueParams, FireLedger, InClaimWrites, LimitStore};
    let store = PgStore::new(pool.clone());
    let render = yearly_keyed(&store, "render", Some("gpu-pool")).await;
    yearly_keyed(&store, "encode", Some("gpu-pool")).await;
    yearly_keyed(&store, "crawl", Some("tenant:acme")).await;
    yearly_keyed(&store, "plain", None).await;
    let (stats, metrics) = recorded_stats(|_| {});
    let state = state(&store, stats, metrics, None).await;

    // No limit yet: a key is shown as having none, and the index lists no limits.
    let (status, index) = get(&state, "/", None).await;
    assert_eq!(status, StatusCode::OK, "{index}");
    assert!(!index.contains("Concurrency limits"), "{index}");
    assert!(!index.contains("id=\"limits\""), "{index}");
    let (_, page) = get(&state, "/routines/render", None).await;
    assert!(
        section(&page, "settings", "</dl>").contains(
            "<dt>Concurrency key</dt><dd><code>gpu-pool</code> — \
             <span class=\"muted\">no limit set (unlimited)</span></dd>"
        ),
        "{page}"
    );
    let (_, page) = get(&state, "/routines/plain", None).await;
    assert!(
        !section(&page, "settings", "</dl>").contains("Concurrency key"),
        "{page}"
    );

    // Limits set; two occurrences of render claimed and not settled hold two places.
    let key = |k: &str| k.parse::<cm_domain::ConcurrencyKey>().unwrap();
    assert!(
        store
            .set_concurrency_limit(&key("gpu-pool"), 3)
            .await
            .unwrap()
    );
    assert!(store.set_concurrency_limit(&key("idle"), 0).await.unwrap());
    let now = chrono::Utc::now();
    let hours = chrono::Duration::hours;
    let asked = store
        .request_occurrences(render.id, &[now - hours(2), now - hours(1)])
        .await
        .unwrap();
    assert_eq!(asked, 2);
    let claim = store
        .claim_due(&ClaimDueParams {
            claimant: "elsewhere".into(),
            lease: cm_domain::Lease::new(Duration::from_secs(600)).unwrap(),
            cap: cm_domain::FireCap::new(25).unwrap(),
            rules: cm_domain::MisfireRules::default(),
            max_routines: 100,
            in_claim: InClaimWrites::default(),
            mission_room: None,
            after: None,
            group: None,
        })
        .await
        .unwrap();
    assert_eq!(claim.fires.len(), 2, "{claim:?}");

    let (_, page) = get(&state, "/routines/render", None).await;
    let settings = section(&page, "settings", "</dl>");
    assert!(
        settings.contains("<dt>Concurrency key</dt><dd><code>gpu-pool</code> — 2 of 3 running<br>"),
        "{settings}"
    );
    assert!(
        settings.contains("at most 3 at once across all schedulers, shared by 2 routines"),
        "{settings}"
    );
    assert!(!settings.contains("full"), "{settings}");
    // Lowered to the places held: full, its next runs waiting.
    assert!(
        !store
            .set_concurrency_limit(&key("gpu-pool"), 2)
            .await
            .unwrap()
    );
    let (_, page) = get(&state, "/routines/render", None).await;
    assert!(
        section(&page, "settings", "</dl>")
            .contains("<code>gpu-pool</code> — 2 of 2 running <span class=\"paused\">full</span>"),
        "{page}"
    );
    assert!(
        store
            .set_concurrency_limit(&key("gpu-pool"), 3)
            .await
            .is_ok()
    );
    // A key without a limit, beside them.
    let (_, page) = get(&state, "/routines/crawl", None).await;
    assert!(
        section(&page, "settings", "</dl>").contains(
            "<code>tenant:acme</code> — <span class=\"muted\">no limit set (unlimited)</span>"
        ),
        "{page}"
    );

    // The index lists each limit by key: its most at once, running now, routines.
    let (_, index) = get(&state, "/", None).await;
    assert!(index.contains("<h2>Concurrency limits</h2>"), "{index}");
    let limits = section(&index, "limits", "</table>");
    let rows: Vec<&str> = limits.split("<tr>").skip(2).collect();
    assert_eq!(rows.len(), 2, "{limits}");
    assert!(
        rows[0].starts_with("<td><code>gpu-pool</code></td><td>3</td><td>2</td><td>2</td>"),
        "{limits}"
    );
    assert!(
        rows[1].starts_with(
            "<td><code>idle</code></td><td>0</td><td>0 <span class=\"paused small\">full</span></td><td>0</td>"
        ),
        "{limits}"
    );
    assert!(!limits.contains("tenant:acme"), "{limits}");

    // Gone again once the limits are deleted.
    for k in ["gpu-pool", "idle"] {
        assert!(store.delete_concurrency_limit(&key(k)).await.unwrap());
    }
    let (_, index) = get(&state, "/", None).await;
    assert!(!index.contains("id=\"limits\""), "{index}");
}

/// The edit form changes retries, retry backoff and concurrency key as `routine update
/// --retries --retry-backoff --concurrency-key` does, read by the same parsers: a refused value
/// answers 400 with their words and changes nothing; an empty field keeps its setting; the box
/// removes the key, as `--no-concurrency-key` does.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_page_edits_retries_backoff_and_key_with_the_checks_of_routine_update(pool: PgPool) {
    use cm_scheduler::edit;
    let store = PgStore::new(pool.clone());
    let render = yearly_keyed(&store, "render", None).await;
    let (stats, metrics) = recorded_stats(|_| {});
    let state = state(&store, stats, metrics, None).await;
    let routine = async || store.get_routine(render.id).await.unwrap();

    // The form holds the settings as they are; no key, so nothing to remove.
    let (_, page) = get(&state, "/routines/render", None).await;
    let form = section(&page, "edit", "</form>");
    for shown in [
        "name=\"retries\" value=\"0\" type=\"number\" min=\"0\" max=\"100\"",
        "name=\"retry_backoff\" value=\"10s..10m\"",
        "name=\"concurrency_key\" maxlength=\"100\"",
    ] {
        assert!(form.contains(shown), "{shown:?} missing:\n{form}");
    }
    assert!(!form.contains("no_concurrency_key"), "{form}");

    // Refused as `routine update` refuses, in its parsers' words; nothing changes, not even
    // the valid field beside the refused one.
    let before = routine().await;
    let refusals: [(&[(&str, &str)], String); 7] = [
        (&[("retries", "101")], edit::retries("101").unwrap_err()),
        (&[("retries", "-1")], edit::retries("-1").unwrap_err()),
        (&[("retries", "many")], edit::retries("many").unwrap_err()),
        (&[("retry_backoff", "0s")], edit::backoff("0s").unwrap_err()),
        (
            &[("retry_backoff", "10m..10s")],
            edit::backoff("10m..10s").unwrap_err(),
        ),
        (
            &[("retries", "5"), ("concurrency_key", "bad key!")],
            edit::concurrency_key("bad key!").unwrap_err(),
        ),
        (
            &[
                ("retries", "5"),
                ("concurrency_key", "gpu-pool"),
                ("no_concurrency_key", "yes"),
            ],
            "give a new concurrency key or remove the key, not both".to_owned(),
        ),
    ];
    for (fields, reason) in &refusals {
        let (status, _, body) = submit(&state, "/routines/render/edit", fields).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{fields:?}: {body}");
        assert!(
            body.contains(&format!("Nothing was changed: {}.", maud_escaped(reason))),
            "{reason:?} missing:\n{body}"
        );
        assert_eq!(routine().await, before, "{fields:?} changed it");
    }
    assert_eq!(
        edit::retries("101").unwrap_err(),
        "retries must be 0 to 100 (it was 101)"
    );
    assert!(
        edit::concurrency_key("bad key!")
            .unwrap_err()
            .starts_with("a concurrency key is 1 to 100 letters"),
    );

    // Without the page's token: refused, nothing changed.
    let (status, _, _) = post(&state, "/routines/render/edit", "retries=7", &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(routine().await, before);

    // A real edit of all three, in one write.
    let (status, location, body) = submit(
        &state,
        "/routines/render/edit",
        &[
            ("retries", "3"),
            ("retry_backoff", " 30s..5m "),
            ("concurrency_key", "gpu-pool"),
            ("back", "/routines/render"),
        ],
    )
    .await;
    assert_eq!(
        (status, location.as_str()),
        (
            StatusCode::SEE_OTHER,
            "/routines/render?done=edited&of=render"
        ),
        "{body}"
    );
    let after = routine().await;
    let backoff =
        cm_domain::Backoff::new(Duration::from_secs(30), Duration::from_secs(300)).unwrap();
    assert_eq!(after.retry.retries, 3);
    assert_eq!(after.retry.backoff, backoff);
    assert_eq!(
        after.concurrency_key.as_ref().map(|k| k.as_str()),
        Some("gpu-pool")
    );
    assert_eq!(
        (after.schedule.as_str(), after.payload.clone()),
        (render.schedule.as_str(), render.payload.clone()),
        "the other settings stay"
    );
    let (_, page) = get(&state, &location, None).await;
    assert!(page.contains("Saved “render”"), "{page}");
    let settings = section(&page, "settings", "</dl>");
    assert!(
        settings.contains("<dt>Retries</dt><dd>3, backoff 30s..5m</dd>"),
        "{settings}"
    );
    assert!(
        settings.contains("<dt>Concurrency key</dt><dd><code>gpu-pool</code>"),
        "{settings}"
    );
    let form = section(&page, "edit", "</form>");
    for shown in [
        "name=\"retries\" value=\"3\"",
        "name=\"retry_backoff\" value=\"30s..5m\"",
        "name=\"concurrency_key\" value=\"gpu-pool\"",
        "name=\"no_concurrency_key\" value=\"yes\"",
    ] {
        assert!(form.contains(shown), "{shown:?} missing:\n{form}");
    }

    // The form sent back as it is, or with its fields empty: nothing to save.
    for fields in [
        &[
            ("schedule", "0 0 1 1 *"),
            ("timezone", "UTC"),
            ("misfire", "fire-once"),
            ("message", ""),
            ("retries", "3"),
            ("retry_backoff", "30s..5m"),
            ("concurrency_key", "gpu-pool"),
        ][..],
        &[
            ("retries", ""),
            ("retry_backoff", ""),
            ("concurrency_key", "  "),
        ][..],
    ] {
        let (status, location, body) = submit(&state, "/routines/render/edit", fields).await;
        assert_eq!(
            (status, location.as_str()),
            (
                StatusCode::SEE_OTHER,
                "/routines/render?done=unchanged&of=render"
            ),
            "{fields:?}: {body}"
        );
        assert_eq!(routine().await, after, "{fields:?}");
    }

    // One field alone changes that setting and keeps the others, as `routine update` does.
    let (status, _, body) = submit(&state, "/routines/render/edit", &[("retries", "0")]).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let now = routine().await;
    assert_eq!((now.retry.retries, now.retry.backoff), (0, backoff));
    assert_eq!(now.concurrency_key, after.concurrency_key);

    // The box removes the key, the key's field still holding it as the form sends it.
    let (status, _, body) = submit(
        &state,
        "/routines/render/edit",
        &[
            ("concurrency_key", "gpu-pool"),
            ("no_concurrency_key", "yes"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let now = routine().await;
    assert_eq!(now.concurrency_key, None);
    assert_eq!(now.retry.backoff, backoff);
    let (_, page) = get(&state, "/routines/render", None).await;
    assert!(
        !section(&page, "settings", "</dl>").contains("Concurrency key"),
        "{page}"
    );
    assert!(
        !section(&page, "edit", "</form>").contains("no_concurrency_key"),
        "{page}"
    );
}

/// The page deletes a routine after a confirmation that says how many fires go with it; the
/// routine and its fires are gone, and the index says so.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_page_deletes_a_routine_after_saying_how_many_fires_go(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    // Yearly, so a minute boundary during the test adds no fire of the schedule's own: the
    // page's count is the one triggered fire.
    let yearly = |name: &'static str| {
        new_routine(
            name,
            "0 0 1 1 *",
            "UTC",
            RoutineKind::Message,
            json!({ "text": "hello" }),
        )
    };
    let standup = store.create_routine(yearly("standup")).await.unwrap();
    let keep = store.create_routine(yearly("keep")).await.unwrap();
    for id in [standup.id, keep.id] {
        store.trigger_routine(id).await.unwrap();
    }
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
    assert_eq!(scheduler.tick().await.unwrap().fired, 2);
    let (stats, metrics) = recorded_stats(|_| {});
    let state = state(&store, stats, metrics, None).await;

    let (_, page) = get(&state, "/routines/standup", None).await;
    assert!(page.contains("<summary>Delete…</summary>"), "{page}");
    assert!(page.contains("Delete standup and its one fire"), "{page}");
    assert!(
        page.contains("action=\"/routines/standup/delete\""),
        "{page}"
    );

    // Not without the page's token.
    let (status, _, _) = post(&state, "/routines/standup/delete", "csrf=guess", &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(store.get_routine(standup.id).await.is_ok());

    let (status, location, _) = submit(&state, "/routines/standup/delete", &[]).await;
    assert_eq!(
        (status, location.as_str()),
        (StatusCode::SEE_OTHER, "/?done=deleted&of=standup")
    );
    assert!(store.get_routine(standup.id).await.is_err());
    let fires: i64 =
        sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires WHERE routine_id = $1")
            .bind(standup.id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(fires, 0);
    assert!(
        store.get_routine(keep.id).await.is_ok(),
        "another routine went too"
    );
    let (_, index) = get(&state, &location, None).await;
    assert!(
        index.contains("Deleted “standup” and its fires."),
        "{index}"
    );
    let (status, _) = get(&state, "/routines/standup", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A UTC routine's next runs are one column of UTC times, not the same column twice.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_utc_routines_next_runs_are_not_shown_twice(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    every_minute(&store, "standup", false).await;
    let (stats, metrics) = recorded_stats(|_| {});
    let state = state(&store, stats, metrics, None).await;
    let (_, page) = get(&state, "/routines/standup", None).await;
    let next_runs = page.split("id=\"next-runs\"").nth(1).unwrap_or_default();
    let next_runs = next_runs.split("</table>").next().unwrap_or_default();
    assert!(!next_runs.contains("In UTC"), "{next_runs}");
    assert_eq!(next_runs.matches("<td").count(), 10, "{next_runs}");
}

/// A routine on a holiday calendar lists its next runs where the calendar plans them: a yearly
/// 1 January run on a calendar with next 1 January off, under `next`, runs on 2 January.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_calendar_routines_next_runs_are_the_planned_ones(pool: PgPool) {
    use chrono::Datelike;
    let store = PgStore::new(pool.clone());
    let year = chrono::Utc::now().year() + 1;
    let new_year = chrono::NaiveDate::from_ymd_opt(year, 1, 1).unwrap();
    let calendar = cm_domain::Calendar::new(cm_domain::Zone::UTC, [new_year], &[]).unwrap();
    cm_store::CalendarStore::create_calendar(&store, "office", &calendar)
        .await
        .unwrap();
    let routine = cm_store::NewRoutine::message(
        "new year",
        cm_domain::Schedule::parse("0 9 1 1 *", "UTC").unwrap(),
        "hello",
    )
    .calendar(Some("office".into()), cm_domain::OnHoliday::Next)
    .build()
    .unwrap();
    store.create_routine(routine).await.unwrap();
    let (stats, metrics) = recorded_stats(|_| {});
    let state = state(&store, stats, metrics, None).await;
    let (_, page) = get(&state, "/routines/new%20year", None).await;
    let next_runs = page.split("id=\"next-runs\"").nth(1).unwrap_or_default();
    let next_runs = next_runs.split("</table>").next().unwrap_or_default();
    assert!(next_runs.contains(&format!("{year}-01-02")), "{next_runs}");
    assert!(!next_runs.contains(&format!("{year}-01-01")), "{next_runs}");
}

/// Text as maud writes it into a page.
fn maud_escaped(text: &str) -> String {
    maud::html! { (text) }.into_string()
}
