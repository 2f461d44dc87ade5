//! One validation for every path that writes a routine: the same inputs go through `routine
//! create` and `routine update` (the binary), a JSON Lines and a crontab import (the binary), the
//! status page's edit form (through the router), `cm_store::tx`'s create and update, and the
//! SQL function `cm.create_routine` (or `cm.create_mission_routine`), and each path gives the
//! same verdict: stored under the same name, or refused in the domain's words (one line) with
//! nothing changed. SQL checks every case it can express at insert (names, zones, cron fields,
//! payloads); what it cannot express is marked [`Sql::NotExpressible`].

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use cm_domain::{OverlapPolicy, Schedule, Zone};
use cm_scheduler::health::{Health, Readiness};
use cm_scheduler::http::router;
use cm_scheduler::http_state::{HttpState, StatusPage};
use cm_store::{
    NewRoutine, PgStore, RoutineAction, RoutineKind, RoutineStore, RoutineUpdate, UnplannedRoutines,
};
use http_body_util::BodyExt as _;
use serde_json::{Value, json};
use tower::ServiceExt as _;

use crate::support::{TestDb, cm_scheduler};

/// The routine each update path changes, and each case's schedule and zone unless it varies them.
const BASE: &str = "base";
const CRON: &str = "0 9 * * *";
const ZONE: &str = "Europe/Berlin";

/// What a case's routine does.
#[derive(Debug, Clone)]
enum Action {
    /// A message routine posting this text.
    Message(String),
    /// A mission routine described by this JSON (a mission file).
    Mission(String),
    /// A message routine with this payload as it is: only Rust can give one.
    Payload(Value),
}

/// The input a case varies, which decides the paths that can express it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Varies {
    Name,
    Schedule,
    Action,
    Overlap,
}

/// What a path did with a case.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    /// Written; the routine is found by this name.
    Stored(String),
    /// Refused with a one-line reason holding these words; nothing changed.
    Refused(&'static str),
}

/// What SQL does with a case today.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sql {
    /// The same verdict as every other path, at insert.
    Same,
    /// `cm.create_routine` takes no such input.
    NotExpressible,
}

struct Case {
    what: &'static str,
    name: String,
    cron: &'static str,
    zone: &'static str,
    action: Action,
    overlap: Option<&'static str>,
    varies: Varies,
    expected: Verdict,
    sql: Sql,
}

fn case(what: &'static str, name: &str, expected: Verdict, sql: Sql) -> Case {
    Case {
        what,
        name: name.to_owned(),
        cron: CRON,
        zone: ZONE,
        action: Action::Message("hello".into()),
        overlap: None,
        varies: Varies::Name,
        expected,
        sql,
    }
}

fn stored(name: &str) -> Verdict {
    Verdict::Stored(name.to_owned())
}

fn mission_json(task: &str) -> String {
    json!({ "repository": "https://git.example.com/team/audit.git", "task": task }).to_string()
}

fn cases() -> Vec<Case> {
    use Sql::{NotExpressible, Same};
    use Verdict::Refused;
    let long_message = "x".repeat(cm_domain::MAX_MESSAGE_BYTES + 1);
    let long_mission = mission_json(&"y".repeat(cm_domain::mission::MAX_MISSION_BYTES));
    let with = |mut c: Case, f: &dyn Fn(&mut Case)| {
        f(&mut c);
        c
    };
    vec![
        case("a good one", "good one", stored("good one"), Same),
        case(
            "empty name",
            "",
            Refused("the name must not be empty"),
            Same,
        ),
        case("padded name", "  padded  ", stored("padded"), Same),
        case(
            "zero-width space",
            "zero\u{200B}width",
            Refused("(found U+200B)"),
            Same,
        ),
        case("NBSP-leading name", "\u{A0}nbsp", stored("nbsp"), Same),
        case(
            "RTL override",
            "pay\u{202E}roll",
            Refused("(found U+202E)"),
            Same,
        ),
        case(
            "UUID-like name",
            "67e55044-10b1-426f-9247-bb680e5fe0c8",
            Refused("must not be a UUID"),
            Same,
        ),
        case(
            "braced UUID name",
            "{67e55044-10b1-426f-9247-bb680e5fe0c8}",
            Refused("must not be a UUID"),
            Same,
        ),
        case(
            "over-long name",
            &"n".repeat(201),
            Refused("at most 200 characters"),
            Same,
        ),
        with(
            case("bad cron", "cron", Refused("61 is out of range"), Same),
            &|c| {
                c.cron = "61 * * * *";
                c.varies = Varies::Schedule;
            },
        ),
        with(
            case("Quartz's days", "quartz days", stored("quartz days"), Same),
            &|c| {
                c.cron = "0 9 L * FRI#3";
                c.varies = Varies::Schedule;
            },
        ),
        with(
            case(
                "a sixth Friday",
                "quartz",
                Refused("#6: a weekday occurs 1 to 5 times"),
                Same,
            ),
            &|c| {
                c.cron = "0 9 * * 5#6";
                c.varies = Varies::Schedule;
            },
        ),
        with(
            case(
                "the last weekday on a weekend",
                "quartz",
                Refused("day-of-month \"LW\" never falls on day-of-week \"*/6\""),
                Same,
            ),
            &|c| {
                c.cron = "0 9 LW * */6";
                c.varies = Varies::Schedule;
            },
        ),
        with(
            case(
                "bad zone",
                "zone",
                Refused("unknown time zone \"Mars/Olympus\""),
                Same,
            ),
            &|c| {
                c.zone = "Mars/Olympus";
                c.varies = Varies::Schedule;
            },
        ),
        with(
            case(
                "message payload {\"nope\":1}",
                "nope",
                Refused("a message routine's payload must be a JSON object with a \"text\" string"),
                NotExpressible,
            ),
            &|c| {
                c.action = Action::Payload(json!({ "nope": 1 }));
                c.varies = Varies::Action;
            },
        ),
        with(
            case(
                "mission {\"nope\":1}",
                "nope",
                Refused("mission field \"nope\": unknown field"),
                Same,
            ),
            &|c| {
                c.action = Action::Mission(r#"{"nope":1}"#.into());
                c.varies = Varies::Action;
            },
        ),
        with(
            case("empty message", "empty", Refused("must not be empty"), Same),
            &|c| {
                c.action = Action::Message(String::new());
                c.varies = Varies::Action;
            },
        ),
        with(
            case(
                "oversize message",
                "long",
                Refused("at most 262144 are allowed"),
                Same,
            ),
            &|c| {
                c.action = Action::Message(long_message.clone());
                c.varies = Varies::Action;
            },
        ),
        with(
            case("oversize mission", "long", Refused("allowed"), Same),
            &|c| {
                c.action = Action::Mission(long_mission.clone());
                c.varies = Varies::Action;
            },
        ),
        with(
            case("a good mission", "audit", stored("audit"), Same),
            &|c| {
                c.action = Action::Mission(mission_json("audit it"));
                c.varies = Varies::Action;
            },
        ),
        with(
            case(
                "overlap of a message",
                "talker",
                Refused("is for mission routines"),
                NotExpressible,
            ),
            &|c| {
                c.overlap = Some("allow");
                c.varies = Varies::Overlap;
            },
        ),
    ]
}

/// The paths, in the table's order.
const PATHS: [&str; 8] = [
    "cli create",
    "cli update",
    "json lines",
    "crontab",
    "page edit",
    "tx create",
    "tx update",
    "sql",
];

/// A readiness check that always answers.
struct Ready;

#[async_trait::async_trait]
impl Readiness for Ready {
    async fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

struct Bench {
    db: TestDb,
    store: PgStore,
    /// The test's own directory for the files the commands read (removed at the end).
    dir: std::path::PathBuf,
    page: Arc<HttpState>,
}

impl Bench {
    /// Deletes every routine and creates the base routine again.
    async fn reset(&self) {
        for routine in self.store.list_routines().await.unwrap() {
            self.store.delete_routine(routine.id).await.unwrap();
        }
        let base = NewRoutine::message(BASE, Schedule::parse(CRON, ZONE).unwrap(), "base")
            .build()
            .unwrap();
        self.store.create_routine(base).await.unwrap();
    }

    /// Every routine as stored (the base one included), to see that a refusal changed nothing.
    async fn snapshot(&self) -> Vec<cm_store::Routine> {
        self.store.list_routines().await.unwrap()
    }

    /// Runs the binary with `args` on the test's database: its exit code and stderr.
    fn cli(&self, args: &[&str]) -> (i32, String) {
        let out = cm_scheduler()
            .args(["--database-url", &self.db.url])
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Writes `text` to a file named `name` in the test's directory; its path.
    fn file(&self, name: &str, text: &str) -> String {
        let path = self.dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    /// A POST of the page's edit form of the base routine.
    async fn page_edit(&self, fields: &[(&str, &str)]) -> (StatusCode, String) {
        // The health is checked here rather than by a background task: fresh for this request.
        self.page.health.refresh().await;
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        let csrf = self.page.status.as_ref().unwrap().csrf.value().to_string();
        form.append_pair("csrf", &csrf);
        for (name, value) in fields {
            form.append_pair(name, value);
        }
        let request = Request::post(format!("/routines/{BASE}/edit"))
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::HOST, "127.0.0.1:9464")
            .header("sec-fetch-site", "same-origin")
            .body(Body::from(form.finish()))
            .unwrap();
        let response = router(self.page.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }
}

/// A refusal's reason as the path said it, or the routine the path wrote.
enum Outcome {
    Written,
    Refused(String),
    NotExpressible(&'static str),
}

async fn run_path(bench: &Bench, path: &str, c: &Case) -> Outcome {
    use Outcome::{NotExpressible, Refused, Written};
    let cli_outcome = |(code, stderr): (i32, String)| match code {
        0 => Written,
        2 => Refused(stderr),
        other => panic!("{path}, {}: exit {other}: {stderr}", c.what),
    };
    // The flags that give the case's action on the command line.
    let action_flags = |bench: &Bench| -> Option<Vec<String>> {
        match &c.action {
            Action::Message(text) if text.len() > 128 * 1024 => None,
            Action::Message(text) => Some(vec!["--message".into(), text.clone()]),
            Action::Mission(json) => {
                Some(vec!["--mission".into(), bench.file("mission.json", json)])
            }
            Action::Payload(_) => None,
        }
    };
    let too_long_for_argv = "Linux refuses one argument over 128 KiB";
    let no_payload = "it takes a message's text or a mission file, not a payload";
    match path {
        "cli create" => {
            let Some(action) = action_flags(bench) else {
                return NotExpressible(if matches!(c.action, Action::Payload(_)) {
                    no_payload
                } else {
                    too_long_for_argv
                });
            };
            let mut args: Vec<String> = [
                "routine",
                "create",
                "--name",
                &c.name,
                "--schedule",
                c.cron,
                "--timezone",
                c.zone,
            ]
            .map(String::from)
            .into();
            args.extend(action);
            if let Some(overlap) = c.overlap {
                args.extend(["--overlap".into(), overlap.into()]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            cli_outcome(bench.cli(&args))
        }
        "cli update" => {
            let mut args: Vec<String> = ["routine", "update", BASE].map(String::from).into();
            match c.varies {
                Varies::Name => args.extend(["--name".into(), c.name.clone()]),
                Varies::Schedule => args.extend([
                    "--schedule".into(),
                    c.cron.into(),
                    "--timezone".into(),
                    c.zone.into(),
                ]),
                Varies::Action => match action_flags(bench) {
                    Some(action) => args.extend(action),
                    None => {
                        return NotExpressible(if matches!(c.action, Action::Payload(_)) {
                            no_payload
                        } else {
                            too_long_for_argv
                        });
                    }
                },
                Varies::Overlap => args.extend(["--overlap".into(), c.overlap.unwrap().into()]),
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            cli_outcome(bench.cli(&args))
        }
        "json lines" => {
            let mut line = json!({ "name": c.name, "schedule": c.cron, "timezone": c.zone });
            match &c.action {
                Action::Message(text) => line["message"] = json!(text),
                Action::Mission(text) => {
                    bench.file("mission.json", text);
                    line["mission"] = json!("mission.json");
                }
                Action::Payload(_) => return NotExpressible(no_payload),
            }
            if let Some(overlap) = c.overlap {
                line["overlap"] = json!(overlap);
            }
            let file = bench.file("routines.jsonl", &format!("{line}\n"));
            cli_outcome(bench.cli(&["routine", "import", &file]))
        }
        "crontab" => {
            let Action::Message(text) = &c.action else {
                return NotExpressible("a crontab entry's command is a message's text");
            };
            if c.overlap.is_some() {
                return NotExpressible("a crontab has no overlap policy");
            }
            if text.is_empty() {
                return NotExpressible("an entry without a command is no entry");
            }
            let file = bench.file(
                "jobs.cron",
                &format!("# cm: name={}\n{} {text}\n", c.name, c.cron),
            );
            cli_outcome(bench.cli(&[
                "routine",
                "import",
                "--crontab",
                "--timezone",
                c.zone,
                &file,
            ]))
        }
        "page edit" => {
            let message = match (&c.action, c.varies) {
                (_, Varies::Name) => return NotExpressible("the form has no name"),
                (_, Varies::Overlap) => {
                    return NotExpressible("a message routine's form has no overlap");
                }
                (Action::Message(text), _) if text.is_empty() => {
                    return NotExpressible("an empty message keeps the current one");
                }
                (Action::Message(text), _) => text.clone(),
                _ => return NotExpressible("the form takes a message's text only"),
            };
            let (status, body) = bench
                .page_edit(&[
                    ("schedule", c.cron),
                    ("timezone", c.zone),
                    ("misfire", "fire-once"),
                    ("message", &message),
                ])
                .await;
            match status {
                StatusCode::SEE_OTHER => Written,
                StatusCode::BAD_REQUEST => {
                    // The reason, out of the page's markup.
                    let reason = body
                        .split("Nothing was changed: ")
                        .nth(1)
                        .and_then(|r| r.split('<').next())
                        .unwrap_or(&body)
                        .replace("&quot;", "\"");
                    Refused(reason)
                }
                other => panic!("{path}, {}: {other}: {body}", c.what),
            }
        }
        "tx create" => {
            let (kind, payload) = match &c.action {
                Action::Message(text) => (RoutineKind::Message, json!({ "text": text })),
                Action::Mission(text) => match serde_json::from_str(text) {
                    Ok(value) => (RoutineKind::Mission, value),
                    Err(e) => return Refused(e.to_string()),
                },
                Action::Payload(value) => (RoutineKind::Message, value.clone()),
            };
            let schedule = match Schedule::parse(c.cron, c.zone) {
                Ok(schedule) => schedule,
                Err(e) => return Refused(e.to_string()),
            };
            let mut builder = NewRoutine::builder(&*c.name, schedule, kind, payload);
            if let Some(overlap) = c.overlap {
                builder = builder.overlap(overlap.parse::<OverlapPolicy>().unwrap());
            }
            let routine = match builder.build() {
                Ok(routine) => routine,
                Err(e) => return Refused(e.to_string()),
            };
            let mut tx = bench.db.pool.begin().await.unwrap();
            match cm_store::tx::create_routine(&mut tx, &routine).await {
                Ok(_) => {
                    tx.commit().await.unwrap();
                    Written
                }
                Err(e) => Refused(e.to_string()),
            }
        }
        "tx update" => {
            let base = bench.store.get_routine_by_name(BASE).await.unwrap();
            let mut update = RoutineUpdate::default();
            match c.varies {
                Varies::Name => update.name = Some(c.name.clone()),
                Varies::Schedule => {
                    let zone = match Zone::parse(c.zone) {
                        Ok(zone) => zone,
                        Err(e) => return Refused(e.to_string()),
                    };
                    update.expression = Some(c.cron.into());
                    update.zone = Some(zone);
                }
                Varies::Action => {
                    update.action = Some(match &c.action {
                        Action::Message(text) => RoutineAction {
                            kind: RoutineKind::Message,
                            payload: json!({ "text": text }),
                        },
                        Action::Mission(text) => match serde_json::from_str(text) {
                            Ok(payload) => RoutineAction {
                                kind: RoutineKind::Mission,
                                payload,
                            },
                            Err(e) => return Refused(e.to_string()),
                        },
                        Action::Payload(payload) => RoutineAction {
                            kind: RoutineKind::Message,
                            payload: payload.clone(),
                        },
                    })
                }
                Varies::Overlap => update.overlap = Some(c.overlap.unwrap().parse().unwrap()),
            }
            let mut tx = bench.db.pool.begin().await.unwrap();
            match cm_store::tx::update_routine(&mut tx, base.id, &update).await {
                Ok(_) => {
                    tx.commit().await.unwrap();
                    Written
                }
                Err(e) => Refused(e.to_string()),
            }
        }
        "sql" => {
            let written = match &c.action {
                _ if c.overlap.is_some() => {
                    return NotExpressible("cm.create_routine takes no overlap policy");
                }
                Action::Message(text) => {
                    sqlx::query_scalar::<_, uuid::Uuid>("SELECT cm.create_routine($1, $2, $3, $4)")
                        .bind(&c.name)
                        .bind(c.cron)
                        .bind(c.zone)
                        .bind(text)
                        .fetch_one(&bench.db.pool)
                        .await
                }
                Action::Mission(text) => {
                    let Ok(mission) = serde_json::from_str::<Value>(text) else {
                        return NotExpressible("not JSON");
                    };
                    sqlx::query_scalar::<_, uuid::Uuid>(
                        "SELECT cm.create_mission_routine($1, $2, $3, $4)",
                    )
                    .bind(&c.name)
                    .bind(c.cron)
                    .bind(c.zone)
                    .bind(mission)
                    .fetch_one(&bench.db.pool)
                    .await
                }
                Action::Payload(_) => {
                    return NotExpressible("cm.create_routine takes a message's text");
                }
            };
            match written {
                Ok(_) => Written,
                Err(e) => Refused(format!("at insert: {e}")),
            }
        }
        other => unreachable!("{other}"),
    }
}

/// The verdict a path's outcome amounts to, checked against the case: a refusal is one line and
/// changed nothing; a write is found by the name the case expects.
async fn verdict(bench: &Bench, path: &str, c: &Case, before: &[cm_store::Routine]) -> String {
    let outcome = run_path(bench, path, c).await;
    match outcome {
        Outcome::NotExpressible(why) => format!("n/a ({why})"),
        Outcome::Refused(reason) => {
            let reason = reason.trim_end().to_owned();
            let mut said = format!("refused: {reason}");
            if reason.lines().count() != 1 {
                said = format!("refused in {} lines: {reason}", reason.lines().count());
            }
            if bench.snapshot().await != before {
                said = format!("refused but changed something: {reason}");
            }
            said
        }
        Outcome::Written => {
            let name = if matches!(c.varies, Varies::Name) || !path.contains("update") {
                match &c.expected {
                    Verdict::Stored(name) => name.clone(),
                    Verdict::Refused(_) => c.name.trim().to_owned(),
                }
            } else {
                BASE.to_owned()
            };
            let name = if path == "page edit" {
                BASE.to_owned()
            } else {
                name
            };
            if path == "sql" {
                let planned = bench.store.plan_routines(None, 100).await.unwrap();
                if let Some(reason) = planned.iter().find_map(|p| p.refused.clone()) {
                    return format!("refused when planned: {reason}");
                }
            }
            match bench.store.get_routine_by_name(&name).await {
                Ok(_) => format!("stored as {name:?}"),
                Err(_) => {
                    let names: Vec<String> = bench
                        .snapshot()
                        .await
                        .into_iter()
                        .map(|r| format!("{:?}", r.name))
                        .collect();
                    format!(
                        "stored, not found as {name:?} (stored: {})",
                        names.join(", ")
                    )
                }
            }
        }
    }
}

/// Whether `said` is the verdict `c` expects of `path`.
fn agrees(path: &str, c: &Case, said: &str) -> bool {
    if said.starts_with("n/a") {
        // Only a path that cannot express the input says so; SQL must be marked.
        return path != "sql" || c.sql == Sql::NotExpressible;
    }
    if path == "sql" {
        match c.sql {
            Sql::NotExpressible => return false,
            Sql::Same => {
                return match &c.expected {
                    Verdict::Stored(name) => said == format!("stored as {name:?}"),
                    Verdict::Refused(_) => said.starts_with("refused: at insert"),
                };
            }
        }
    }
    match &c.expected {
        Verdict::Stored(_) => said.starts_with("stored as "),
        Verdict::Refused(words) => said.starts_with("refused: ") && said.contains(words),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_path_that_writes_a_routine_gives_the_same_verdict() {
    let db = TestDb::new().await;
    let store = PgStore::new(db.pool.clone());
    let health = Health::new(
        Arc::new(Ready),
        Duration::from_secs(1),
        Duration::from_millis(300),
    );
    health.refresh().await;
    let recorder = cm_scheduler::counters::prometheus_recorder().unwrap();
    let page = Arc::new(HttpState {
        stats: Arc::default(),
        health,
        fresh_within: Duration::from_secs(10),
        metrics: recorder.handle(),
        status: Some(StatusPage::new(
            Arc::new(store.clone()),
            Arc::new(store.clone()),
            "validation-test",
        )),
        token: None,
    });
    let bench = Bench {
        db,
        store,
        dir: {
            let dir = std::env::temp_dir().join(format!("cm-validation-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir(&dir).unwrap();
            dir
        },
        page,
    };
    let mut table = String::new();
    let mut disagreements = Vec::new();
    for c in cases() {
        for path in PATHS {
            bench.reset().await;
            let before = bench.snapshot().await;
            let said = verdict(&bench, path, &c, &before).await;
            let shown: String = said.chars().take(160).collect();
            table += &format!("{:<28} | {path:<10} | {shown}\n", c.what);
            if !agrees(path, &c, &said) {
                disagreements.push(format!(
                    "{} through {path}: expected {:?} (SQL: {:?}), got {shown}",
                    c.what, c.expected, c.sql
                ));
            }
        }
    }
    println!("{table}");
    let _ = std::fs::remove_dir_all(&bench.dir);
    assert!(
        disagreements.is_empty(),
        "{}\n\nthe whole table:\n{table}",
        disagreements.join("\n")
    );
}
