//! The status page answers only its own names (issue 27, DNS rebinding): a whole `cm-scheduler
//! run --listen` process is sent the requests a page served as `rebind.attacker.example` makes
//! once that name points at 127.0.0.1 (its `Host` the attacker's name, its `Origin` the same,
//! so the browser calls them same-origin): every one is refused 421 before any handler runs,
//! with or without the page's token, and the pause form pauses nothing. The page still answers
//! at `localhost:PORT`, at its listen address and at an `--allowed-host`; the probes and
//! `/metrics` answer whatever `Host` names them.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::cli::{MissionFiles, NOWHERE, check_fails, create_args, ok};
use crate::operate::Running;
use crate::support::TestDb;

/// The attacker's name, resolving (by then) to the scheduler's loopback address.
const REBIND: &str = "rebind.attacker.example";

/// One HTTP/1.1 request over a fresh connection to `addr`, sent as `host`: the status code
/// and the body (0 when nothing listens yet).
async fn request(
    addr: &str,
    method: &str,
    path: &str,
    host: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return (0, String::new());
    };
    let mut text = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        text.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    text.push_str("\r\n");
    text.push_str(body);
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        stream.write_all(text.as_bytes()).await?;
        stream.read_to_end(&mut response).await
    })
    .await
    .expect("the scheduler answered within 10 s")
    .expect("reading the answer");
    crate::support::status_and_body(&response)
}

/// The form token the page writes into its forms.
fn form_token(page: &str) -> String {
    let start = page
        .find(r#"name="csrf" value=""#)
        .expect("the page has an action form")
        + r#"name="csrf" value=""#.len();
    page[start..].split('"').next().unwrap().to_string()
}

async fn is_paused(db: &TestDb, name: &str) -> bool {
    sqlx::query_scalar("SELECT paused FROM cm.routines WHERE name = $1")
        .bind(name)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// A message routine named `name`, daily.
fn daily(db: &TestDb, name: &str) {
    ok(
        &db.url,
        &create_args(name, "0 3 * * *", &["--message", "hi"]),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebound_name_is_refused_and_pauses_nothing_while_the_pages_own_names_work() {
    let db = TestDb::new().await;
    daily(&db, "standup");
    let scheduler = Running::start_with(&db.url, &[], &[]);
    scheduler.await_answer("/", 200, "standup").await;
    let addr = scheduler.addr().to_string();
    let port = addr.rsplit_once(':').unwrap().1.to_string();
    let rebound = format!("{REBIND}:{port}");
    let origin = format!("http://{rebound}");

    // Reading the page (which carries the form token) and any other path it answers: refused.
    for path in ["/", "/routines/standup", "/page.js", "/nothing-here"] {
        let (code, body) = request(&addr, "GET", path, &rebound, &[], "").await;
        assert_eq!(code, 421, "GET {path} as {rebound}: {body}");
        assert!(
            !body.contains("standup"),
            "GET {path} showed a routine: {body}"
        );
        assert!(body.contains("--allowed-host"), "{body}");
    }

    // The pause form, as the rebound page posts it: same-origin in the browser's eyes, and
    // with the page's real form token (read, on a scheduler without this guard, the same way).
    let (code, page) = request(&addr, "GET", "/", &format!("localhost:{port}"), &[], "").await;
    assert_eq!(code, 200, "{page}");
    let form = format!("csrf={}&back=%2F", form_token(&page));
    let rebound_headers = [
        ("Origin", origin.as_str()),
        ("Sec-Fetch-Site", "same-origin"),
    ];
    let (code, body) = request(
        &addr,
        "POST",
        "/routines/standup/pause",
        &rebound,
        &rebound_headers,
        &form,
    )
    .await;
    assert_eq!(code, 421, "the rebound pause: {body}");
    // Without a port, as a page on port 80 would send it, too.
    let (code, _) = request(
        &addr,
        "POST",
        "/routines/standup/pause",
        REBIND,
        &[("Origin", &format!("http://{REBIND}"))],
        &form,
    )
    .await;
    assert_eq!(code, 421);
    // A forwarded-host header is not believed (a rebound page's script can set it).
    let (code, _) = request(
        &addr,
        "POST",
        "/routines/standup/pause",
        &rebound,
        &[
            ("Origin", origin.as_str()),
            ("X-Forwarded-Host", &format!("localhost:{port}")),
            ("Forwarded", &format!("host=localhost:{port}")),
        ],
        &form,
    )
    .await;
    assert_eq!(code, 421);
    assert!(!is_paused(&db, "standup").await, "a rebound form paused it");

    // The probes and /metrics answer whatever Host names them (orchestrators probe by address).
    for path in ["/livez", "/metrics"] {
        let (code, body) = request(&addr, "GET", path, &rebound, &[], "").await;
        assert_eq!(code, 200, "GET {path} as {rebound}: {body}");
    }

    // The page's own names: localhost, 127.0.0.1 (its listen address) and [::1], on its port.
    for host in [
        format!("localhost:{port}"),
        addr.clone(),
        format!("[::1]:{port}"),
    ] {
        let (code, body) = request(&addr, "GET", "/", &host, &[], "").await;
        assert_eq!(code, 200, "GET / as {host}: {body}");
        assert!(body.contains("standup"), "{body}");
    }
    // And its form works there: the refusals above were for the name, not the form.
    let own = format!("localhost:{port}");
    let own_origin = format!("http://{own}");
    let (code, body) = request(
        &addr,
        "POST",
        "/routines/standup/pause",
        &own,
        &[("Origin", &own_origin), ("Sec-Fetch-Site", "same-origin")],
        &form,
    )
    .await;
    assert_eq!(code, 303, "the page's own pause: {body}");
    assert!(is_paused(&db, "standup").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebound_name_is_refused_with_the_token_and_allowed_hosts_are_answered() {
    let db = TestDb::new().await;
    daily(&db, "standup");
    let files = MissionFiles::new();
    let token_file = files.write("token", "Page-Token-For-Hosts\n");
    let scheduler = Running::start_with(
        &db.url,
        &[
            "--http-token-file",
            &token_file,
            "--allowed-host",
            "cm.example.test",
            "--allowed-host",
            "ops.example.test:9999",
        ],
        &[],
    );
    let bearer = [("Authorization", "Bearer Page-Token-For-Hosts")];
    let addr = scheduler.addr().to_string();
    let port = addr.rsplit_once(':').unwrap().1.to_string();
    let wait = crate::support::eventually_within(Duration::from_secs(30), async || {
        let (code, body) = request(&addr, "GET", "/", &addr, &bearer, "").await;
        (code == 200 && body.contains("standup")).then_some(())
    });
    assert!(
        wait.await.is_some(),
        "the page never answered: {}",
        scheduler.log()
    );

    // With the token or without, a rebound name is refused before the token is asked for.
    for headers in [&bearer[..], &[]] {
        let (code, body) =
            request(&addr, "GET", "/", &format!("{REBIND}:{port}"), headers, "").await;
        assert_eq!(code, 421, "{headers:?}: {body}");
    }
    // The names the operator gave, with the token: any port for a bare name, the given one
    // for a name with a port.
    for (host, expected) in [
        ("cm.example.test".to_string(), 200),
        (format!("cm.example.test:{port}"), 200),
        ("CM.Example.Test.".to_string(), 200),
        ("ops.example.test:9999".to_string(), 200),
        (format!("ops.example.test:{port}"), 421),
        (format!("localhost:{port}"), 200),
    ] {
        let (code, body) = request(&addr, "GET", "/", &host, &bearer, "").await;
        assert_eq!(code, expected, "GET / as {host}: {body}");
    }
    // An admitted name still needs the token.
    let (code, _) = request(&addr, "GET", "/", "cm.example.test", &[], "").await;
    assert_eq!(code, 401);

    // What --allowed-host takes is checked at start.
    for (args, fragment) in [
        (
            &[
                "run",
                "--listen",
                "127.0.0.1:0",
                "--allowed-host",
                "http://cm.example.test",
            ][..],
            "--allowed-host",
        ),
        (
            &[
                "run",
                "--listen",
                "127.0.0.1:0",
                "--allowed-host",
                "*.example.test",
            ][..],
            "--allowed-host",
        ),
        (
            &["run", "--allowed-host", "cm.example.test"][..],
            "--listen",
        ),
    ] {
        check_fails(NOWHERE, args, 2, fragment);
    }
}
