//! Operating a running `cm-scheduler run --listen`: health while the database is down at start
//! and goes away mid-run (through a TCP forwarder the test opens and closes, never stopping the
//! shared server), and the status page loaded in headless Chromium.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use cm_store::{NewRoutine, PgStore, RoutineKind, RoutineStore};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use uuid::Uuid;

use crate::browser::Browser;
use crate::crash::eventually;
use crate::support::{
    SERVER, TestDb, cm_scheduler, drop_database, eventually_within, new_routine, poll,
};
/// How long any awaited state may take to appear.
const PATIENCE: Duration = Duration::from_secs(30);

/// A `cm-scheduler run --listen` process, killed when dropped; its log goes to a file.
pub(crate) struct Running {
    child: Child,
    log: PathBuf,
    addr: String,
}

impl Running {
    fn start(url: &str, extra: &[&str]) -> Running {
        Running::start_with(url, extra, &[])
    }

    /// `start` with `env` set for the process as well.
    pub(crate) fn start_with(url: &str, extra: &[&str], env: &[(&str, &str)]) -> Running {
        // A free port: bound, read, released, then given to the scheduler.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("finding a free port")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let log = std::env::temp_dir().join(format!("cm-operate-{}.log", Uuid::new_v4().simple()));
        let mut command = cm_scheduler();
        command.args(["--database-url", url, "run", "--listen", &addr]);
        // The test's quick defaults, each unless `extra` gives its own.
        for (flag, value) in [
            ("--tick-interval", "200ms"),
            ("--lease", "4s"),
            ("--dispatch-timeout", "2s"),
        ] {
            if !extra.contains(&flag) {
                command.args([flag, value]);
            }
        }
        command.args(extra);
        let child = crate::support::spawn_logged(&mut command, env, &log);
        Running { child, log, addr }
    }

    /// The address it listens on (`127.0.0.1:PORT`).
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn assert_alive(&mut self) {
        let status = self.child.try_wait().expect("polling the scheduler");
        assert!(
            status.is_none(),
            "the scheduler exited ({status:?}); its log:\n{}",
            self.log()
        );
    }

    /// GET `path` over a fresh connection: the status code and body (0 when nothing answers).
    async fn get(&self, path: &str) -> (u16, String) {
        let Ok(mut stream) = TcpStream::connect(&self.addr).await else {
            return (0, String::new());
        };
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        );
        let mut response = Vec::new();
        let read = async {
            stream.write_all(request.as_bytes()).await?;
            stream.read_to_end(&mut response).await
        };
        if tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .is_err()
        {
            return (0, String::new());
        }
        crate::support::status_and_body(&response)
    }

    /// Waits until `path` answers `code` with a body containing `fragment`; returns the body.
    pub(crate) async fn await_answer(&self, path: &str, code: u16, fragment: &str) -> String {
        let mut last = (0, String::new());
        let found = eventually(async || {
            last = self.get(path).await;
            (last.0 == code && last.1.contains(fragment)).then(|| last.1.clone())
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "{path} never answered {code} with {fragment:?}; last {last:?}; the log:\n{}",
                self.log()
            )
        })
    }

    /// SIGTERM, then the exit status within ten seconds.
    async fn terminate(&mut self) -> Option<ExitStatus> {
        self.signal("-TERM").await
    }

    /// `kill SIGNAL` (`-INT`, `-TERM`), then the exit status within ten seconds.
    pub(crate) async fn signal(&mut self, signal: &str) -> Option<ExitStatus> {
        let sent = Command::new("kill")
            .arg(signal)
            .arg(self.child.id().to_string())
            .status();
        assert!(sent.is_ok_and(|s| s.success()), "kill {signal} failed");
        eventually_within(Duration::from_secs(10), async || {
            self.child.try_wait().expect("polling the scheduler")
        })
        .await
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        crate::support::end_scheduler(&mut self.child, &self.log);
    }
}

/// A TCP forwarder to the shared PostgreSQL. Closed, it hangs up on every connection, new and
/// established, as a database that went away would look to its clients.
struct Forwarder {
    port: u16,
    open: watch::Sender<bool>,
}

impl Forwarder {
    async fn start() -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the forwarder");
        let port = listener
            .local_addr()
            .expect("the forwarder's address")
            .port();
        let (open, watching) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut watching = watching.clone();
                if !*watching.borrow() {
                    continue;
                }
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect("127.0.0.1:5432").await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = watching.wait_for(|open| !*open) => {}
                    }
                });
            }
        });
        Forwarder { port, open }
    }

    fn set_open(&self, open: bool) {
        self.open.send_replace(open);
    }
}

/// A TCP forwarder to the shared PostgreSQL that can stall: it then stops passing bytes on
/// every connection, new and established, and holds them open, as a network path that stops
/// forwarding looks to its clients (no reset, no answer).
struct StallingForwarder {
    port: u16,
    stalled: watch::Sender<bool>,
}

impl StallingForwarder {
    async fn start() -> StallingForwarder {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the forwarder");
        let port = listener.local_addr().expect("its address").port();
        let (stalled, watching) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut watching = watching.clone();
                tokio::spawn(async move {
                    if !*watching.borrow() {
                        let Ok(mut server) = TcpStream::connect("127.0.0.1:5432").await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
                            _ = watching.wait_for(|stalled| *stalled) => {}
                        }
                        // Held open, passing nothing.
                        let _held = server;
                    }
                    let _held = client;
                    std::future::pending::<()>().await;
                });
            }
        });
        StallingForwarder { port, stalled }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_and_the_page_answer_at_once_when_the_network_stops_forwarding() {
    let db = TestDb::new().await;
    let forwarder = StallingForwarder::start().await;
    let url = db
        .url
        .replace("127.0.0.1:5432", &format!("127.0.0.1:{}", forwarder.port));
    let mut scheduler = Running::start(&url, &["--no-migrate"]);
    scheduler.await_answer("/readyz", 200, "ready").await;

    forwarder.stalled.send_replace(true);
    let timed = async |path: &str| {
        let started = std::time::Instant::now();
        let (code, body) = scheduler.get(path).await;
        (code, body, started.elapsed())
    };
    // Every answer is quick; within the check's deadline and an interval, the reason shows.
    let reason = poll(
        Duration::from_secs(15),
        async || {
            let (code, body, took) = timed("/readyz").await;
            assert!(
                took < Duration::from_millis(500),
                "/readyz took {took:?} ({code} {body}); log:\n{}",
                scheduler.log()
            );
            (code, body)
        },
        |(code, body)| *code == 503 && body.contains("the database did not answer within 2s"),
    )
    .await;
    assert!(
        reason.is_ok(),
        "/readyz never said why: {reason:?}; log:\n{}",
        scheduler.log()
    );
    let (code, body, took) = timed("/").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("The database cannot be read"), "{body}");
    assert!(took < Duration::from_millis(500), "the page took {took:?}");
    scheduler.assert_alive();
}

/// Drops a database this test created by other means than `TestDb`.
struct DropOnExit(String);

impl Drop for DropOnExit {
    fn drop(&mut self) {
        drop_database(&self.0);
    }
}

pub(crate) async fn fired_count(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM cm.routine_fires WHERE status = 'fired'")
        .fetch_one(pool)
        .await
        .unwrap_or(0)
}

pub(crate) fn every_second(name: &str, kind: RoutineKind, zone: &str) -> NewRoutine {
    let payload = match kind {
        RoutineKind::Message => json!({ "text": "payload text not to show" }),
        RoutineKind::Mission => {
            json!({ "repository": "https://git.example.com/team/audit.git", "task": "audit" })
        }
    };
    new_routine(name, "* * * * * *", zone, kind, payload)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_waits_for_the_database_at_start_and_mid_run() {
    let forwarder = Forwarder::start().await;
    let name = format!("cm_test_{}", Uuid::new_v4().simple());
    let _cleanup = DropOnExit(name.clone());
    // The database does not exist yet either: the scheduler creates and migrates it once the
    // server answers.
    let url = format!("postgres://postgres@127.0.0.1:{}/{name}", forwarder.port);
    let mut scheduler = Running::start(&url, &[]);

    // Down at start: alive, unready with the reason, retrying.
    scheduler.await_answer("/livez", 200, "ok").await;
    scheduler
        .await_answer("/readyz", 503, "waiting for the database")
        .await;
    // Time passes on purpose: it keeps retrying, and does not exit.
    tokio::time::sleep(Duration::from_secs(2)).await;
    scheduler.assert_alive();
    scheduler
        .await_answer("/readyz", 503, "waiting for the database")
        .await;
    let log = scheduler.log();
    assert!(
        log.contains("the database does not answer yet; retrying"),
        "{log}"
    );
    assert!(log.contains("retry_in"), "the log shows no backoff: {log}");

    // The database answers: migrated, ready, firing.
    forwarder.set_open(true);
    scheduler.await_answer("/readyz", 200, "ready").await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&format!("{SERVER}/{name}"))
        .await
        .expect("the scheduler created the database");
    let store = PgStore::new(pool.clone());
    store
        .create_routine(every_second("heartbeat", RoutineKind::Message, "UTC"))
        .await
        .unwrap();
    let before = eventually(async || {
        let n = fired_count(&pool).await;
        (n > 0).then_some(n)
    })
    .await
    .expect("no fire after the database came up");

    // It goes away mid-run: ticks fail and are counted, unready with the reason, still alive.
    forwarder.set_open(false);
    scheduler
        .await_answer("/readyz", 503, "the database does not answer")
        .await;
    scheduler
        .await_answer("/metrics", 200, "cm_tick_errors_total ")
        .await;
    let errors = eventually(async || {
        let (_, metrics) = scheduler.get("/metrics").await;
        let errors: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("cm_tick_errors_total "))
            .and_then(|v| v.trim().parse().ok())?;
        (errors > 0).then_some(errors)
    })
    .await;
    assert!(
        errors.is_some(),
        "failed ticks were not counted; log:\n{}",
        scheduler.log()
    );
    scheduler.assert_alive();

    // Back again: ready and firing by itself.
    forwarder.set_open(true);
    scheduler.await_answer("/readyz", 200, "ready").await;
    let after = eventually(async || {
        let n = fired_count(&pool).await;
        (n > before + 1).then_some(n)
    })
    .await;
    assert!(
        after.is_some(),
        "no fire after the database came back; log:\n{}",
        scheduler.log()
    );

    let status = scheduler.terminate().await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}; log:\n{}",
        scheduler.log()
    );
    pool.close().await;
}

/// Runs headless Chromium on `args` and returns what it printed.
fn chromium(profile: &std::path::Path, args: &[&str]) -> String {
    let browser = std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into());
    let output = Command::new(&browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {browser} ({e}): install it (apt-get install -y chromium) or set CHROMIUM")
        });
    assert!(
        output.status.success(),
        "{browser} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium: apt-get install chromium, or set CHROMIUM to a Chromium binary"]
async fn the_status_page_in_a_real_browser() {
    let db = TestDb::new().await;
    let store = PgStore::new(db.pool.clone());
    store
        .create_routine(every_second("digest", RoutineKind::Message, "Asia/Tokyo"))
        .await
        .unwrap();
    let audit = store
        .create_routine(every_second("audit", RoutineKind::Mission, "UTC"))
        .await
        .unwrap();
    let scheduler = Running::start(&db.url, &["--pause-after-failures", "0"]);
    // Both kinds of outcome are in the ledger before the browser looks.
    let settled = eventually(async || {
        let (fired, failed): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'fired'), count(*) FILTER (WHERE status = 'failed')
             FROM cm.routine_fires",
        )
        .fetch_one(&db.pool)
        .await
        .ok()?;
        (fired > 0 && failed > 0).then_some(())
    })
    .await;
    assert!(settled.is_some(), "no fires; log:\n{}", scheduler.log());

    let profile = std::env::temp_dir().join(format!("cm-chromium-{}", Uuid::new_v4().simple()));
    let base = format!("http://{}", scheduler.addr);
    let index = chromium(&profile, &["--dump-dom", &format!("{base}/")]);
    for shown in [
        "<table id=\"routines\">",
        "<a href=\"/routines/digest\">digest</a>",
        ">audit</a>",
        "Asia/Tokyo",
        " JST</span>",
        "<span class=\"fired\">fired</span>",
        "<span class=\"failed\">failed</span>",
        "no mission backend is configured",
        "In flight (this / all)",
        "Last good tick",
    ] {
        assert!(
            index.contains(shown),
            "{shown:?} missing from the DOM:\n{index}"
        );
    }
    let page = chromium(
        &profile,
        &["--dump-dom", &format!("{base}/routines/{}", audit.id)],
    );
    for shown in [
        "<h1>audit</h1>",
        "<table id=\"next-runs\">",
        "<table id=\"fires\">",
        // A mission's description is shown; a message's text never is.
        "<code>https://git.example.com/team/audit.git</code>",
    ] {
        assert!(
            page.contains(shown),
            "{shown:?} missing from the routine's DOM:\n{page}"
        );
    }
    for dom in [&index, &page] {
        assert!(
            !dom.contains("payload text"),
            "a message's text shows:\n{dom}"
        );
    }
    // A phone-sized screenshot of the whole page, kept where CM_STATUS_SCREENSHOT says (the
    // docs' picture is made this way), else checked and thrown away.
    let shot = std::env::var("CM_STATUS_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| profile.join("status.png"));
    let size = std::env::var("CM_STATUS_SCREENSHOT_SIZE").unwrap_or_else(|_| "390,844".into());
    let (width, height) = size
        .split_once(',')
        .and_then(|(w, h)| Some((w.parse().ok()?, h.parse().ok()?)))
        .expect("CM_STATUS_SCREENSHOT_SIZE is WIDTH,HEIGHT");
    let mut browser = Browser::launch(width, height);
    browser.open(&format!("{base}/"));
    browser.wait_for("document.querySelector('#fire-rate')");
    std::fs::create_dir_all(&profile).unwrap();
    std::fs::write(&shot, browser.screenshot()).expect("writing the screenshot");
    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    let _ = std::fs::remove_dir_all(&profile);
}

/// Serves `page` to every request on a port of its own: another site than the scheduler's.
async fn another_site(page: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let page = page.clone();
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = socket.read(&mut request).await;
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}/")
}

async fn is_paused(pool: &sqlx::PgPool, name: &str) -> bool {
    sqlx::query_scalar("SELECT paused FROM cm.routines WHERE name = $1")
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium: apt-get install chromium, or set CHROMIUM to a Chromium binary"]
async fn pause_clicked_in_a_browser_pauses_and_a_cross_site_form_is_refused() {
    let db = TestDb::new().await;
    let store = PgStore::new(db.pool.clone());
    store
        .create_routine(every_second("standup", RoutineKind::Message, "UTC"))
        .await
        .unwrap();
    let scheduler = Running::start(&db.url, &[]);
    let base = format!("http://{}", scheduler.addr);
    scheduler.await_answer("/", 200, "standup").await;

    // A short window, so the page scrolls.
    let mut browser = Browser::launch(1280, 400);
    browser.open(&format!("{base}/"));
    let pause = "form[action='/routines/standup/pause'] button";
    browser.wait_for(&format!("document.querySelector(\"{pause}\")"));

    // The page updates in place: new figures, the same scroll.
    let rendered = "document.getElementById('live').dataset.rendered";
    browser.eval("window.scrollTo(0, 250)");
    let first = browser.eval(rendered);
    browser.wait_for(&format!("{rendered} !== {first}"));
    assert_eq!(
        browser.eval("window.scrollY"),
        json!(250),
        "the update moved the page"
    );
    // Switched off, it stays as it is.
    browser.click("#live-toggle");
    assert_eq!(
        browser.eval("document.getElementById('live-toggle').textContent"),
        json!("Live updates: off")
    );
    let frozen = browser.eval(rendered);
    // Time passes on purpose, longer than the page's refresh: nothing may change.
    std::thread::sleep(Duration::from_secs(7));
    assert_eq!(browser.eval(rendered), frozen, "updated while switched off");
    browser.click("#live-toggle");

    // The operator opens the confirmation, then confirms.
    browser.click("tr[data-routine] details.act summary");
    browser.click(pause);
    browser.wait_for("document.body.innerText.includes('Paused “standup”')");
    assert!(
        is_paused(&db.pool, "standup").await,
        "the click did not pause it"
    );
    // Visible at once: the row says paused, and offers to resume.
    browser.wait_for("document.querySelector('tr[data-routine] .paused')");
    browser.wait_for("document.querySelector(\"form[action='/routines/standup/resume']\")");
    let token = browser.eval("document.querySelector('input[name=csrf]').value");
    let token = token.as_str().expect("the page's form token").to_string();

    // Another site posts the resume form, even with the page's own token: refused.
    let attack = another_site(format!(
        "<!DOCTYPE html><form method=post action='{base}/routines/standup/resume'>
         <input name=csrf value='{token}'><input name=back value='/'></form>
         <script>document.forms[0].submit()</script>"
    ))
    .await;
    browser.open(&attack);
    browser.wait_for("document.body.innerText.includes('cross-site request')");
    assert!(
        is_paused(&db.pool, "standup").await,
        "a cross-site form resumed it"
    );
    // And an action by GET (a link, an image) does nothing.
    browser.open(&format!("{base}/routines/standup/resume"));
    browser.wait_for("document.body.innerText.includes('Nothing was done')");
    assert!(is_paused(&db.pool, "standup").await, "a GET resumed it");
}

/// The fires a routine's strip on the index shows.
const STRIP_FIRES: i64 = cm_scheduler::page::STRIP_FIRES as i64;

/// At 1,280 px a 150-character name and a schedule with every clause wrap inside their cells
/// and the routines table fits its width, so the Actions column is on screen without scrolling sideways; a mission's page shows
/// its repository, task and env (secrets masked) and how this scheduler runs it, and its edit
/// form opens. Screenshots of both go to `CM_PAGE_SCREENSHOTS` when set (docs/ has them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium: apt-get install chromium, or set CHROMIUM to a Chromium binary"]
async fn long_names_and_schedules_wrap_and_actions_stay_in_view_at_1280_px() {
    let db = TestDb::new().await;
    let store = PgStore::new(db.pool.clone());
    let mut long = String::from("quarterly-revenue-reconciliation");
    while long.len() < 150 {
        long.push_str("-for-the-emea-finance-team");
    }
    long.truncate(150);
    for (name, kind, payload, schedule) in [
        (
            long.as_str(),
            RoutineKind::Message,
            json!({ "text": "hello" }),
            "0 9 * * MON-FRI",
        ),
        (
            "standup",
            RoutineKind::Message,
            json!({ "text": "hello" }),
            "*/30 * * * * *",
        ),
        // The schedules' guide's longest kind of line: a cron line with exclusions, jitter and
        // a window wraps in its cell too.
        (
            "payroll",
            RoutineKind::Message,
            json!({ "text": "hello" }),
            "0 9 * * MON-FRI except 0 0 25 12 * except 0 0 1 1 * jitter 5m from 2026-01-01 until 2036-01-01",
        ),
        (
            "nightly-audit",
            RoutineKind::Mission,
            json!({ "repository": "https://git.example.com/team/audit.git", "ref": "main",
                    "task": "audit the dependencies and open an issue per finding",
                    "env": { "LANG": "C.UTF-8", "REPORT_TOKEN": "s3cr3t-value" },
                    "labels": { "routine/team": "platform" } }),
            "0 3 * * *",
        ),
    ] {
        let routine = store
            .create_routine(new_routine(name, schedule, "Europe/Berlin", kind, payload))
            .await
            .unwrap();
        // A full strip of fires in the messages' rows: the table at its widest. The mission
        // runs once.
        if kind == RoutineKind::Message {
            let now = chrono::Utc::now();
            let past: Vec<_> = (1..=STRIP_FIRES)
                .map(|minutes| now - chrono::Duration::minutes(minutes))
                .collect();
            store.request_occurrences(routine.id, &past).await.unwrap();
        } else {
            store.trigger_routine(routine.id).await.unwrap();
        }
    }
    let workdir = std::env::temp_dir().join(format!("cm-page-{}", Uuid::new_v4().simple()));
    let workdir = workdir.to_string_lossy().into_owned();
    let scheduler = Running::start(
        &db.url,
        &[
            "--mission-backend",
            "process",
            "--mission-workdir",
            &workdir,
            "--mission-env-allow",
            "LANG,REPORT_*",
            "--mission-command",
            "/bin/true",
        ],
    );
    let base = format!("http://{}", scheduler.addr);
    scheduler.await_answer("/", 200, "standup").await;
    let fired = eventually_within(PATIENCE, async || {
        let settled: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM cm.routine_fires WHERE completed_at IS NOT NULL",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        (settled > 2 * STRIP_FIRES).then_some(())
    })
    .await;
    assert!(fired.is_some(), "{}", scheduler.log());
    let shots = std::env::var("CM_PAGE_SCREENSHOTS").ok().map(PathBuf::from);

    let mut browser = Browser::launch(1280, 900);
    browser.open(&format!("{base}/?sort=name"));
    browser.wait_for("document.querySelector('#routines')");
    let fit = browser.eval(
        "(() => { const table = document.getElementById('routines');
                  const box = table.parentElement;
                  const actions = table.querySelector('thead th:last-child').getBoundingClientRect();
                  const name = table.querySelector('td.name').getBoundingClientRect();
                  return { right: actions.right, width: window.innerWidth,
                           scroll: box.scrollWidth, client: box.clientWidth,
                           nameHeight: name.height }; })()",
    );
    let number = |key: &str| fit[key].as_f64().unwrap_or(f64::NAN);
    assert!(
        number("right") <= number("width"),
        "the Actions column ends off screen: {fit}"
    );
    assert!(
        number("scroll") <= number("client"),
        "the routines table scrolls sideways: {fit}"
    );
    assert!(
        number("nameHeight") > 40.0,
        "the long name did not wrap: {fit}"
    );
    if let Some(dir) = &shots {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("page-routines-1280.png"), browser.screenshot()).unwrap();
    }

    browser.open(&format!("{base}/routines/nightly-audit"));
    browser.wait_for("document.querySelector('#mission')");
    let text = browser.eval("document.body.innerText");
    let text = text.as_str().unwrap_or_default();
    for shown in [
        "https://git.example.com/team/audit.git",
        "audit the dependencies",
        "LANG=C.UTF-8",
        "REPORT_TOKEN=***",
        "process (development only)",
        "/bin/true",
    ] {
        assert!(text.contains(shown), "{shown:?} missing:\n{text}");
    }
    assert!(!text.contains("s3cr3t-value"), "{text}");
    browser.click("#edit summary");
    browser.wait_for("document.querySelector('#edit-overlap').offsetParent !== null");
    if let Some(dir) = &shots {
        std::fs::write(dir.join("page-mission-1280.png"), browser.screenshot()).unwrap();
    }
    let _ = std::fs::remove_dir_all(&workdir);
}
