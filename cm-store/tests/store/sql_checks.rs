//! Checks at insert: the SQL functions refuse in the caller's transaction what `routine create`
//! and `routine update` refuse (a bad cron field, zone, clause, a schedule already over, a name
//! the CLI would not keep), with SQLSTATE 22023 and a message naming what is wrong; and
//! `cm.update_routine` changes a routine and has it planned again.

use cm_store::{PgStore, RoutineStore, UnplannedRoutines};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::db_now;

/// Creates a message routine through `cm.create_routine`.
async fn create(pool: &PgPool, name: &str, schedule: &str, zone: &str) -> Result<Uuid, String> {
    sqlx::query_scalar("SELECT cm.create_routine($1, $2, $3, 'hello')")
        .bind(name)
        .bind(schedule)
        .bind(zone)
        .fetch_one(pool)
        .await
        .map_err(refusal)
}

/// An error as `SQLSTATE: message`.
fn refusal(err: sqlx::Error) -> String {
    match err.as_database_error() {
        Some(db) => format!("{}: {}", db.code().unwrap_or_default(), db.message()),
        None => panic!("not a database error: {err}"),
    }
}

/// Asserts that `result` is a refusal with SQLSTATE 22023 whose message holds `words`.
#[track_caller]
fn check_refused<T: std::fmt::Debug>(what: &str, result: Result<T, String>, words: &str) {
    let err = result.expect_err(what);
    assert!(
        err.starts_with("22023: ") && err.contains(words),
        "{what}: {err:?} does not say {words:?}"
    );
}

/// `cm.update_routine(id, ARGS)` with `args` its named arguments: whether the routine exists,
/// or the refusal.
async fn update_routine(pool: &PgPool, id: Uuid, args: &str) -> Result<bool, String> {
    sqlx::query_scalar::<_, bool>(sqlx::AssertSqlSafe(format!(
        "SELECT cm.update_routine($1, {args})"
    )))
    .bind(id)
    .fetch_one(pool)
    .await
    .map_err(refusal)
}

async fn routine_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM cm.routines")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A bad schedule or zone is an error at insert naming the field (SQLSTATE 22023), not a
/// routine paused later; `@at` in the past and a window already closed are refused as
/// `routine create` refuses them; and nothing is written.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_bad_schedule_or_zone_is_refused_at_insert_naming_the_field(pool: PgPool) {
    for (schedule, zone, words) in [
        (
            "61 * * * *",
            "UTC",
            "minute field \"61\": 61 is out of range 0-59",
        ),
        ("0 24 * * *", "UTC", "hour field \"24\""),
        ("0 0 0 * *", "UTC", "day-of-month field \"0\""),
        ("0 0 1 FOO *", "UTC", "month field \"FOO\": unknown name"),
        ("0 0 1 13 *", "UTC", "month field \"13\""),
        ("0 0 * * 8", "UTC", "day-of-week field \"8\""),
        (
            "0 0 * * MONDAY",
            "UTC",
            "day-of-week field \"MONDAY\": unknown name",
        ),
        (
            "*/0 * * * *",
            "UTC",
            "minute field \"*/0\": step 0 is not allowed",
        ),
        (
            "*/61 * * * *",
            "UTC",
            "minute field \"*/61\": step 61 is larger",
        ),
        ("5/10 * * * *", "UTC", "a step needs `*` or a range"),
        (
            "0 */x * * *",
            "UTC",
            "hour field \"*/x\": step \"x\" is not a number",
        ),
        (
            "5-1 * * * *",
            "UTC",
            "minute field \"5-1\": range 5-1 runs backwards",
        ),
        ("60 * * * * *", "UTC", "second field \"60\""),
        (
            "0 0 L-3 * *",
            "UTC",
            "day-of-month field \"L-3\": L-3: an offset from the last day is not supported",
        ),
        (
            "0 0 * * MON#6",
            "UTC",
            "day-of-week field \"MON#6\": #6: a weekday occurs 1 to 5 times",
        ),
        ("0 0 1,,2 * *", "UTC", "empty list item"),
        ("0\u{3000}0 * * *", "UTC", "unexpected character"),
        ("* * * *", "UTC", "found 4"),
        ("0 9 30 2 *", "UTC", "never occurs in month"),
        ("@reboot", "UTC", "@reboot is not supported"),
        ("@fortnightly", "UTC", "unknown macro"),
        ("@daily *", "UTC", "stands alone"),
        ("@every 90x", "UTC", "@every 90x"),
        ("@every 1h offset 2h", "UTC", "offset must be shorter"),
        ("@every 400d", "UTC", "longer than 366 days"),
        ("@at tomorrow", "UTC", "@at \"tomorrow\": not a time"),
        (
            "@at 2020-01-01T00:00:00Z",
            "UTC",
            "has no occurrence after now",
        ),
        (
            "0 9 * * * until 2020-06-01",
            "Europe/Berlin",
            "has no occurrence after now",
        ),
        (
            "0 9 * * * except 0 9 * * 8",
            "UTC",
            "except \"0 9 * * 8\": invalid cron expression: day-of-week field",
        ),
        ("0 9 * * * jitter soon", "UTC", "jitter \"soon\""),
        (
            "0 9 * * * from 2030-01-01 until 2029-01-01",
            "UTC",
            "before it starts",
        ),
        (
            "0 9 * * * until 2099-01-01 from 2030-01-01",
            "UTC",
            "in the order except, jitter, from, until",
        ),
        ("@at 2099-01-01 jitter 2d", "UTC", "at most a day"),
        (
            "0 9 * * *",
            "Mars/Olympus",
            "time zone: unknown time zone \"Mars/Olympus\"",
        ),
        ("0 9 * * *", "+02:00", "time zone"),
        ("0 9 * * *", "UTC+2", "time zone"),
        ("0 9 * * *", "CEST", "time zone"),
        ("0 9 * * *", "europe/berlin", "time zone"),
        ("0 9 * * *", "posix/Europe/Berlin", "time zone"),
    ] {
        check_refused(
            &format!("{schedule:?} in {zone:?}"),
            create(&pool, "refused", schedule, zone).await,
            words,
        );
    }
    assert_eq!(routine_count(&pool).await, 0);

    // What cm takes, SQL takes.
    for (i, (schedule, zone)) in [
        ("0 9 * * MON-FRI", "Europe/Berlin"),
        ("*/20 * * * * *", "UTC"),
        ("0 0 * * FRI-SUN", "Etc/GMT+5"),
        ("0 0 1 JAN,jul *", "America/New_York"),
        ("5,10,15-20/5 1 * * *", "UTC"),
        ("@MIDNIGHT", "UTC"),
        ("@every 90m offset 15m", "UTC"),
        ("@at 2099-12-24T15:30", "Europe/Berlin"),
        (
            "0 9 * * * except 0 0 25 12 * jitter 5m from 2026-01-01 until 2099-01-01",
            "Europe/Berlin",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        create(&pool, &format!("taken {i}"), schedule, zone)
            .await
            .unwrap_or_else(|e| panic!("{schedule:?} in {zone:?}: {e}"));
    }
    let store = PgStore::new(pool.clone());
    let planned = store.plan_routines(None, 100).await.unwrap();
    assert!(planned.iter().all(|p| p.refused.is_none()), "{planned:?}");
}

/// Quartz's `L`, `W` and `#`: what cm_domain takes, SQL takes, and what it refuses SQL refuses
/// with the same words (a field's refusal word for word; a schedule that never fires for the
/// same reason), for a table of day fields.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn quartz_fields_are_checked_at_insert_as_cm_domain_checks_them(pool: PgPool) {
    let table = [
        // Taken.
        "0 9 L * *",
        "0 9 l * *",
        "0 9 LW * *",
        "0 9 lw * *",
        "0 9 15W * *",
        "0 9 15w * *",
        "0 9 1W,31W * *",
        "0 9 015W * *",
        "0 9 1,15W,L * *",
        "0 9 15W,LW * *",
        "0 9 * * 5L",
        "0 9 * * fril",
        "0 9 * * SUNL",
        "0 9 * * 7L",
        "0 9 * * 5#3",
        "0 9 * * FRI#3",
        "0 9 * * fri#3",
        "0 9 * * 0#1,7#5",
        "0 9 * * 1#1,1#3,5L",
        "0 9 * * MON-FRI,5L",
        "0 9 L * 5#3",
        "0 9 */2 * 5L",
        "0 9 L 2 */7",
        "0 9 */15 * 5L",
        "0 9 */31 * 5#1",
        "0 9 LW * */5",
        "0 9 */2 2 5#5",
        "0 0 9 L * *",
        "*/30 9 LW * *",
        "0 9 * * 1-5 except 0 0 L * *",
        "0 9 L * * except 0 0 * * 5#3",
        // Refused, naming the field.
        "0 0 L/2 * *",
        "0 0 15W/2 * *",
        "0 0 1-15W * *",
        "0 0 L-3 * *",
        "0 0 0W * *",
        "0 0 32W * *",
        "0 0 99999999999W * *",
        "0 0 W * *",
        "0 0 WL * *",
        "0 0 5L * *",
        "0 0 5#3 * *",
        "0 0 L,LW * *",
        "0 0 LW,1,l * *",
        "0 0 * * 5W",
        "0 0 * * LW",
        "0 0 * * L",
        "0 0 * * LL",
        "0 0 * * 5#0",
        "0 0 * * 5#6",
        "0 0 * * 5#",
        "0 0 * * 5#+3",
        "0 0 * * 5#1#2",
        "0 0 * * #3",
        "0 0 * * ?#3",
        "0 0 * * 5?#3",
        "0 0 * * 8#1",
        "0 0 * * 8L",
        "0 0 * * FRIDAY#1",
        "0 0 * * 1-5#2",
        "0 0 * * 5#3/2",
        "0 0 * * 5L/2",
        "0 0 ? * MON",
        "0 0 * * ?",
        "L 0 * * *",
        "0 L * * *",
        "0 0 * L *",
        "0 0 * JUL# *",
        "0 9 * * * except 0 0 * * 5#6",
        // Refused: the day fields never meet.
        "0 9 31W 2 *",
        "0 9 30W 2 *",
        "0 9 31W 4,6 *",
        "0 9 LW * */6",
        "0 9 15W * */6",
        "0 9 */31 * 5#2",
        "0 9 */15 2 5L",
    ];
    let mut taken = 0;
    for (i, schedule) in table.into_iter().enumerate() {
        let domain = cm_domain::Schedule::parse(schedule, "UTC");
        let sql = create(&pool, &format!("quartz {i}"), schedule, "UTC").await;
        match (domain, sql) {
            (Ok(_), Ok(_)) => taken += 1,
            (Ok(_), Err(e)) => panic!("{schedule:?}: cm_domain takes it, SQL refuses it: {e}"),
            (Err(e), Ok(_)) => panic!("{schedule:?}: SQL takes it, cm_domain refuses it: {e}"),
            (Err(domain), Err(sql)) => {
                let domain = domain.to_string();
                // cm_domain says "the schedule never fires", SQL "it never fires"; the reason
                // after it is the same.
                let words = domain
                    .split_once("never fires: ")
                    .map_or(domain.as_str(), |(_, reason)| reason);
                check_refused(schedule, Err::<(), _>(sql), words);
            }
        }
    }
    assert_eq!(taken, 31, "the table's first 31 lines are taken");
    let store = PgStore::new(pool.clone());
    let planned = store.plan_routines(None, 100).await.unwrap();
    assert_eq!(planned.len(), taken);
    assert!(planned.iter().all(|p| p.refused.is_none()), "{planned:?}");
}

/// Names are trimmed and refused as the CLI's `RoutineName` trims and refuses them: Unicode
/// whitespace around a name goes, an invisible or bidirectional character is refused.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn names_are_trimmed_and_refused_as_the_cli_does(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let id = create(&pool, "\u{a0}\u{3000} nightly \u{3000}", "@daily", "UTC")
        .await
        .unwrap();
    assert_eq!(store.get_routine(id).await.unwrap().name, "nightly");
    for (name, words) in [
        ("a\u{202e}b", "U+202E"),
        ("zero\u{200b}width", "U+200B"),
        ("line\nbreak", "control character"),
        ("\u{3000}", "must not be empty"),
        ("01a23b2c867973d6ad8bba3769a234da", "looks like an id"),
    ] {
        check_refused(name, create(&pool, name, "@daily", "UTC").await, words);
    }
    let long = "n".repeat(201);
    check_refused(
        "long",
        create(&pool, &long, "@daily", "UTC").await,
        "at most 200",
    );
    let payload = "x".repeat(cm_domain::MAX_MESSAGE_BYTES + 1);
    let big: Result<Uuid, String> =
        sqlx::query_scalar("SELECT cm.create_routine('big', '@daily', 'UTC', $1)")
            .bind(payload)
            .fetch_one(&pool)
            .await
            .map_err(refusal);
    check_refused("big", big, "at most 262144");
    let unknown: Result<Uuid, String> = sqlx::query_scalar(
        "SELECT cm.create_mission_routine('m', '@daily', 'UTC', '{\"task\": \"t\", \"image\": \"x\"}')",
    )
    .fetch_one(&pool)
    .await
    .map_err(refusal);
    check_refused("mission", unknown, "mission field \"image\": unknown field");
}

/// `cm.update_routine` changes what `routine update` changes, with the same checks as at
/// insert; a new schedule is planned again (no next run until the next pass, then the new
/// schedule's); a refused change leaves the routine as it was.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn update_routine_checks_the_change_and_plans_it_again(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let id = create(&pool, "report", "0 9 * * *", "UTC").await.unwrap();
    store.plan_routines(None, 10).await.unwrap();
    let before = store.get_routine(id).await.unwrap();
    assert!(before.next_run_at.is_some());

    let update = |args: &'static str| update_routine(&pool, id, args);
    for (args, words) in [
        ("schedule => '0 9 * 13 *'", "month field \"13\""),
        ("timezone => 'Mars/Olympus'", "time zone"),
        (
            "schedule => '@at 2020-01-01'",
            "has no occurrence after now",
        ),
        ("name => '\u{202e}x'", "U+202E"),
        ("message => ''", "must not be empty"),
        ("overlap => 'allow'", "for mission routines"),
        ("misfire => 'sometimes'", "fire-once, catch-up or skip"),
        (
            "message => 'a', mission => '{}'",
            "at most one of message and mission",
        ),
    ] {
        check_refused(args, update(args).await, words);
    }
    assert_eq!(store.get_routine(id).await.unwrap(), before);

    assert!(
        update("name => ' weekly report ', schedule => '0 9 * * MON', timezone => 'Europe/Berlin', message => 'weekly', misfire => 'skip'")
            .await
            .unwrap()
    );
    let changed = store.get_routine(id).await.unwrap();
    assert_eq!(
        (
            changed.name.as_str(),
            changed.schedule.as_str(),
            changed.timezone.as_str(),
            changed.payload["text"].as_str(),
            changed.misfire_policy,
            changed.next_run_at,
        ),
        (
            "weekly report",
            "0 9 * * MON",
            "Europe/Berlin",
            Some("weekly"),
            cm_domain::MisfirePolicy::Skip,
            None
        )
    );
    // Its old name is free, its new one taken.
    create(&pool, "report", "@daily", "UTC").await.unwrap();
    let taken = create(&pool, "weekly report", "@daily", "UTC").await;
    assert!(taken.unwrap_err().starts_with("23505"));

    let planned = store.plan_routines(None, 10).await.unwrap();
    assert!(
        planned.iter().any(|p| p.id == id && p.refused.is_none()),
        "{planned:?}"
    );
    let next = store.get_routine(id).await.unwrap().next_run_at.unwrap();
    let schedule = cm_domain::Schedule::parse("0 9 * * MON", "Europe/Berlin").unwrap();
    assert_eq!(schedule.next_after(db_now(&pool).await), Some(next));

    // A message change alone keeps the plan.
    assert!(update("message => 'again'").await.unwrap());
    assert_eq!(store.get_routine(id).await.unwrap().next_run_at, Some(next));
    // No such routine.
    let missing: bool = sqlx::query_scalar("SELECT cm.update_routine($1, message => 'x')")
        .bind(Uuid::new_v4())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(!missing);
}

/// A run limit written through SQL: checked as `--limit-runs` is (1 or more), kept at insert,
/// set and lifted by `cm.update_routine`; a routine its limit finished is planned again when
/// given more runs.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn run_limits_are_checked_kept_and_changed_through_sql(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let runs_left = |id: Uuid| {
        let store = store.clone();
        async move { store.get_routine(id).await.unwrap().runs_left }
    };
    let zero = sqlx::query_scalar::<_, Uuid>(
        "SELECT cm.create_routine('never', '@daily', 'UTC', 'hi', run_limit => 0)",
    )
    .fetch_one(&pool)
    .await
    .map_err(refusal);
    check_refused(
        "run_limit 0",
        zero,
        "a run limit must be 1 to 2147483647 (it was 0)",
    );
    assert_eq!(routine_count(&pool).await, 0);

    let id: Uuid = sqlx::query_scalar(
        "SELECT cm.create_mission_routine('twice', '@daily', 'UTC', \
         '{\"repository\": \"https://git.example.com/r.git\", \"task\": \"t\"}', run_limit => 2)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(runs_left(id).await, Some(2));

    let update = |args: &'static str| update_routine(&pool, id, args);
    check_refused("-1", update("run_limit => -1").await, "(it was -1)");
    check_refused(
        "both",
        update("run_limit => 3, no_run_limit => true").await,
        "at most one of run_limit and no_run_limit",
    );
    assert_eq!(runs_left(id).await, Some(2));
    assert!(update("no_run_limit => true").await.unwrap());
    assert_eq!(runs_left(id).await, None);

    // Finished by its limit (as the claim leaves it: no runs left, no next run), then given
    // one more run: planned again by the next pass.
    sqlx::query("UPDATE cm.routines SET runs_left = 0, next_run_at = NULL WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    assert!(update("run_limit => 1").await.unwrap());
    assert_eq!(runs_left(id).await, Some(1));
    store.plan_routines(None, 10).await.unwrap();
    assert!(store.get_routine(id).await.unwrap().next_run_at.is_some());
    // A change of the message alone leaves the limit.
    assert!(
        update("mission => '{\"repository\": \"https://git.example.com/r.git\", \"task\": \"u\"}'")
            .await
            .unwrap()
    );
    assert_eq!(runs_left(id).await, Some(1));
}

/// `cm.create_routines` of `routines` (a JSON array): how many ids it returned, or the refusal.
async fn create_many(pool: &PgPool, routines: &serde_json::Value) -> Result<usize, String> {
    sqlx::query_scalar::<_, Vec<Uuid>>("SELECT cm.create_routines($1)")
        .bind(routines)
        .fetch_one(pool)
        .await
        .map(|ids| ids.len())
        .map_err(refusal)
}

/// A batch lands whole through `cm.create_routines`: each element a routine as its fields say,
/// in the array's order, unplanned until the next pass; a bad element anywhere, or a name that
/// exists (before the call or earlier in the array), refuses the whole call in one line naming
/// the element, and nothing is written.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn create_routines_writes_a_batch_whole_or_refuses_it_naming_the_element(pool: PgPool) {
    let good: Vec<serde_json::Value> = (0..3000)
        .map(|i| {
            let zone = ["UTC", "Europe/Berlin", "Asia/Tokyo"][i % 3];
            serde_json::json!({
                "name": format!("batch-{i}"),
                "schedule": format!("{} {} * * *", i % 60, (i / 60) % 24),
                "timezone": zone,
                "message": format!("m{i}"),
            })
        })
        .collect();
    let mut batch = good.clone();
    batch.push(serde_json::json!({
        "name": "a-mission", "schedule": "*/5 * * * * except 0 3 * * *",
        "mission": {"repository": "https://git.example.com/a.git", "task": "t"},
        "overlap": "buffer-one", "paused": true, "limit_runs": 2, "deadline": "90s",
    }));
    assert_eq!(
        create_many(&pool, &serde_json::json!(batch)).await,
        Ok(3001)
    );
    assert_eq!(routine_count(&pool).await, 3001);
    let (kind, overlap, paused, runs, deadline, planned): (String, String, bool, i32, i32, bool) =
        sqlx::query_as(
            "SELECT kind, overlap, paused, runs_left, deadline_secs, planned
             FROM cm.routines WHERE name = 'a-mission'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        (
            kind.as_str(),
            overlap.as_str(),
            paused,
            runs,
            deadline,
            planned
        ),
        ("mission", "buffer-one", true, 2, 90, false)
    );
    let zone: String =
        sqlx::query_scalar("SELECT timezone FROM cm.routines WHERE name = 'batch-1'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(zone, "Europe/Berlin");

    // One bad element among thousands of good ones: the whole call refused, naming it.
    let fresh = |i: usize| {
        let mut r = good[i].clone();
        r["name"] = format!("fresh-{i}").into();
        r
    };
    for (place, bad, words) in [
        (
            1234,
            serde_json::json!({"name": "x", "schedule": "0 24 * * *", "message": "m"}),
            "hour field \"24\"",
        ),
        (
            2,
            serde_json::json!({"name": "x", "schedule": "@daily", "message": "m", "timezone": "Mars/Olympus"}),
            "unknown time zone",
        ),
        (
            2999,
            serde_json::json!({"name": "x", "schedule": "@daily", "message": "m", "misfire": "never"}),
            "misfire policy",
        ),
        (
            500,
            serde_json::json!({"name": "x", "schedule": "@daily", "message": "m", "colour": "red"}),
            "unknown field \"colour\"",
        ),
        (
            7,
            serde_json::json!({"name": "batch-7", "schedule": "@daily", "message": "m"}),
            "a routine named 'batch-7' exists",
        ),
        (
            9,
            serde_json::json!({"name": "fresh-3", "schedule": "@daily", "message": "m"}),
            "a routine named 'fresh-3' exists",
        ),
    ] {
        let mut batch: Vec<serde_json::Value> = (0..3000).map(fresh).collect();
        batch[place] = bad;
        let err = create_many(&pool, &serde_json::json!(batch))
            .await
            .expect_err(words);
        let named = format!("routine {} of 3000: ", place + 1);
        assert!(
            err.contains(&named) && err.contains(words) && !err.contains('\n'),
            "{err:?} should name {named:?} and say {words:?}"
        );
        assert_eq!(routine_count(&pool).await, 3001, "{words}: nothing written");
    }
    assert_eq!(create_many(&pool, &serde_json::json!([])).await, Ok(0));
    check_refused(
        "not an array",
        create_many(&pool, &serde_json::json!({"name": "x"})).await,
        "a JSON array",
    );
}

/// `cm.create_routines` stores each schedule as `cm.checked_schedule` stores it in its zone: a
/// plain cron line as written without a parse, every other text (shared by several elements, in
/// several zones, or alone) as its check gives it, whichever mix a batch holds.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn create_routines_stores_each_schedule_as_its_check_does(pool: PgPool) {
    let schedules = [
        ("5 4 * * *", "UTC"),
        ("@daily", "UTC"),
        ("@daily", "Asia/Tokyo"),
        ("*/15 9-17 * * 1-5", "Europe/Berlin"),
        ("0 30 9 * * *", "UTC"),
        ("5 4 * * *", "America/New_York"),
        ("@daily", "Asia/Tokyo"),
        (
            "@rrule FREQ=WEEKLY;BYDAY=MO;BYHOUR=9;BYMINUTE=0;BYSECOND=0",
            "Europe/Berlin",
        ),
        ("59 23 28 12 6", "UTC"),
    ];
    let batch: Vec<serde_json::Value> = schedules
        .iter()
        .enumerate()
        .map(|(i, (schedule, zone))| {
            serde_json::json!({"name": format!("s{i}"), "schedule": schedule, "timezone": zone,
                               "message": "m"})
        })
        .collect();
    assert_eq!(
        create_many(&pool, &serde_json::json!(batch)).await,
        Ok(schedules.len())
    );
    for (i, (schedule, zone)) in schedules.iter().enumerate() {
        let (stored, expected): (String, String) = sqlx::query_as(
            "SELECT r.schedule, cm.checked_schedule($2, $3) FROM cm.routines r WHERE r.name = $1",
        )
        .bind(format!("s{i}"))
        .bind(schedule)
        .bind(zone)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(stored, expected, "{schedule} in {zone}");
    }
}

/// `cm.create_routines` takes a common element at once, without its checking functions; what
/// it takes that way is exactly what those functions take. At each edge of that shortcut (a
/// name's blanks, length, characters and likeness to an id; a message's size; the policies;
/// a field's JSON type) one batch of the element alone writes what the full check gives
/// (`cm.checked_name`, `cm.checked_message`) or refuses with the full check's words.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn create_routines_takes_at_once_only_what_its_checks_take(pool: PgPool) {
    let uuid = "0f8fad5b-d9cb-469f-a165-70867728950e";
    let long = |n: usize| "x".repeat(n);
    let names: Vec<String> = vec![
        "a".into(),
        " a".into(),
        "a ".into(),
        "a\tb".into(),
        "\u{a0}a".into(),
        "a\u{200b}b".into(),
        "caf\u{e9}".into(),
        "a\u{7f}".into(),
        long(200),
        long(201),
        format!(" {} ", long(200)),
        uuid.replace('-', ""),
        uuid.into(),
        uuid.to_uppercase(),
        format!("{{{uuid}}}"),
        format!("urn:uuid:{uuid}"),
        format!("{{{uuid}"),
        format!("{}g", &uuid.replace('-', "")[..31]),
        format!("{}-", uuid.replace('-', "")),
        "urn:uuid:urn:uuid:urn:uuid:urn:uuid:".into(),
        long(33),
        "-".repeat(40),
    ];
    let mut elements: Vec<serde_json::Value> = names
        .iter()
        .map(|name| serde_json::json!({"name": name, "schedule": "0 3 * * *", "message": "m"}))
        .collect();
    for message in [
        "",
        "m",
        &"y".repeat(262_144),
        &"y".repeat(262_145),
        "\u{e9}",
    ] {
        elements
            .push(serde_json::json!({"name": "n", "schedule": "0 3 * * *", "message": message}));
    }
    for (misfire, overlap) in [
        ("catch-up", "forbid"),
        ("never", "forbid"),
        ("skip", "allow"),
        ("skip", "buffer-all"),
    ] {
        elements.push(
            serde_json::json!({"name": "n", "schedule": "0 3 * * *", "message": "m",
            "misfire": misfire, "overlap": overlap}),
        );
    }
    for (field, value) in [
        ("name", serde_json::json!(7)),
        ("message", serde_json::json!({"text": "m"})),
        ("timezone", serde_json::json!(null)),
        ("paused", serde_json::json!("true")),
        ("overlap", serde_json::json!(null)),
        ("calendar", serde_json::json!(1)),
        ("deadline", serde_json::json!(null)),
        ("deadline", serde_json::json!("0s")),
        ("on_holiday", serde_json::json!(null)),
    ] {
        let mut element = serde_json::json!({"name": "n", "schedule": "0 3 * * *", "message": "m"});
        element[field] = value;
        elements.push(element);
    }
    for element in elements {
        // What the full checks say of this element's name and message, when it has both.
        let full: Result<(String, serde_json::Value), String> = sqlx::query_as(
            "SELECT cm.checked_name($1 ->> 'name'), cm.checked_message($1 ->> 'message')",
        )
        .bind(&element)
        .fetch_one(&pool)
        .await
        .map_err(refusal);
        let batch = create_many(&pool, &serde_json::json!([element])).await;
        let written: Option<(String, serde_json::Value)> =
            sqlx::query_as("SELECT name, payload FROM cm.routines")
                .fetch_optional(&pool)
                .await
                .unwrap();
        match (&batch, &full) {
            (Ok(1), Ok(expected)) => {
                assert_eq!(written.as_ref(), Some(expected), "{element}");
            }
            (Err(err), Ok(_)) => {
                // Name and message pass; another field is refused, by the full check's words.
                assert!(written.is_none(), "{element}: {err}");
                assert!(
                    err.starts_with("22023: routine 1 of 1: "),
                    "{element}: {err}"
                );
            }
            (Err(err), Err(refused)) => {
                let words = refused.trim_start_matches("22023: ");
                assert!(written.is_none(), "{element}: {err}");
                assert!(
                    err.ends_with(words),
                    "{element}: {err:?} should say {words:?}"
                );
            }
            _ => panic!("{element}: the batch gave {batch:?}, the full checks {full:?}"),
        }
        sqlx::query("TRUNCATE cm.routines, cm.routine_names CASCADE")
            .execute(&pool)
            .await
            .unwrap();
    }
}

/// `cm.create_routines` and `cm.set_routine_retries` write a retry policy as `routine create
/// --retries --retry-backoff` does, and refuse a bad one in one line, writing nothing.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn retry_policies_are_written_and_checked_from_sql(pool: PgPool) {
    let store = cm_store::PgStore::new(pool.clone());
    let routines = serde_json::json!([
        {"name": "plain", "schedule": "0 3 * * *", "message": "m"},
        {"name": "fixed", "schedule": "0 3 * * *", "message": "m", "retries": 2,
         "retry_backoff": "30s"},
        {"name": "doubling", "schedule": "0 3 * * *", "message": "m", "retries": 5,
         "retry_backoff": "10s..5m"},
    ]);
    assert_eq!(create_many(&pool, &routines).await, Ok(3));
    let policy = |name: &'static str| {
        let store = store.clone();
        async move {
            let r = cm_store::RoutineStore::get_routine_by_name(&store, name)
                .await
                .unwrap();
            (
                r.retry.retries,
                r.retry.backoff.base.as_secs(),
                r.retry.backoff.max.as_secs(),
            )
        }
    };
    assert_eq!(policy("plain").await, (0, 10, 600));
    assert_eq!(policy("fixed").await, (2, 30, 30));
    assert_eq!(policy("doubling").await, (5, 10, 300));

    for (bad, refusal) in [
        (
            serde_json::json!({"retries": 101}),
            "22023: routine 1 of 1: retries must be 0 to 100 (it was 101)",
        ),
        (
            serde_json::json!({"retries": "2"}),
            "22023: routine 1 of 1: field \"retries\" must be a number",
        ),
        (
            serde_json::json!({"retry_backoff": "5m..10s"}),
            "22023: routine 1 of 1: a retry backoff's first wait must not be longer than its cap (it was '5m..10s')",
        ),
        (
            serde_json::json!({"retry_backoff": "500ms"}),
            "22023: routine 1 of 1: a retry backoff is BASE..MAX or BASE, whole seconds from 1s to 1d, such as 10s..10m (it was '500ms')",
        ),
    ] {
        let mut routine =
            serde_json::json!({"name": "bad", "schedule": "0 3 * * *", "message": "m"});
        for (k, v) in bad.as_object().unwrap() {
            routine[k] = v.clone();
        }
        assert_eq!(
            create_many(&pool, &serde_json::json!([routine])).await,
            Err(refusal.to_string())
        );
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM cm.routines")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 3, "nothing written by a refusal");

    let id = cm_store::RoutineStore::get_routine_by_name(&store, "plain")
        .await
        .unwrap()
        .id;
    let set = |retries: Option<i32>, base: Option<&'static str>, cap: Option<&'static str>| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>(
                "SELECT cm.set_routine_retries($1, $2, $3::interval, $4::interval)",
            )
            .bind(id)
            .bind(retries)
            .bind(base)
            .bind(cap)
            .fetch_one(&pool)
            .await
            .map_err(refusal)
        }
    };
    assert_eq!(set(Some(3), None, None).await, Ok(true));
    assert_eq!(
        policy("plain").await,
        (3, 10, 600),
        "a NULL keeps that part"
    );
    assert_eq!(set(None, Some("1 minute"), Some("1 hour")).await, Ok(true));
    assert_eq!(policy("plain").await, (3, 60, 3600));
    assert!(set(Some(101), None, None).await.is_err());
    assert!(
        set(None, Some("2 hours"), None).await.is_err(),
        "base past its cap"
    );
    assert!(set(None, Some("0.5 seconds"), None).await.is_err());
    assert_eq!(
        policy("plain").await,
        (3, 60, 3600),
        "a refusal writes nothing"
    );
}
