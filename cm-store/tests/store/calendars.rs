//! Holiday calendars: stored and shared, read by the claim, and an edit re-planning the
//! routines on one in its own transaction.

use std::sync::Arc;

use chrono::{DateTime, Duration, NaiveDate, TimeZone, Utc};
use cm_domain::{Calendar, MisfirePolicy, OnHoliday, Schedule, Zone};
use cm_store::{CalendarStore, FireLedger, NewRoutine, PgStore, RoutineStore, StoreError};
use sqlx::PgPool;

use crate::support::{claim_params, db_now, ledger, rules, set_next_run};

/// A calendar in UTC with `dates` off and no weekly day off.
fn dates_off(dates: &[NaiveDate]) -> Calendar {
    Calendar::new(Zone::UTC, dates.iter().copied(), &[]).unwrap()
}

/// A daily 09:00 UTC message routine on calendar `calendar` under `policy`.
fn daily_on(name: &str, calendar: &str, policy: OnHoliday) -> NewRoutine {
    NewRoutine::message(name, Schedule::parse("0 9 * * *", "UTC").unwrap(), name)
        .calendar(Some(calendar.to_owned()), policy)
        .misfire(MisfirePolicy::CatchUp)
        .build()
        .unwrap()
}

/// 09:00 UTC on `day`.
fn nine(day: NaiveDate) -> DateTime<Utc> {
    Utc.from_utc_datetime(&day.and_hms_opt(9, 0, 0).unwrap())
}

/// The day of the first 09:00 UTC after `now`: the day a daily 09:00 routine next runs on
/// (today before 09:00, else tomorrow). A clock set to it stands for the routine's real next
/// occurrence whatever the hour the test runs at; a clock set to the day after it would leave
/// today's 09:00 owed between, and a re-plan from now would rightly find it.
fn next_nine_day(now: DateTime<Utc>) -> NaiveDate {
    if now < nine(now.date_naive()) {
        now.date_naive()
    } else {
        now.date_naive() + Duration::days(1)
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn calendars_are_stored_listed_and_refused_as_input(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let new_year = NaiveDate::from_ymd_opt(2027, 1, 1).unwrap();
    let berlin = Calendar::new(
        Zone::parse("Europe/Berlin").unwrap(),
        [new_year],
        &Calendar::DEFAULT_DAYS_OFF,
    )
    .unwrap();
    let stored = store.create_calendar("de", &berlin).await.unwrap();
    assert_eq!(stored.calendar, berlin);
    assert_eq!(store.get_calendar("de").await.unwrap().calendar, berlin);
    assert!(matches!(
        store.create_calendar("de", &berlin).await,
        Err(StoreError::CalendarNameTaken(_))
    ));
    assert!(matches!(
        store.create_calendar("no spaces", &berlin).await,
        Err(StoreError::InvalidCalendar(_))
    ));
    assert!(matches!(
        store.get_calendar("missing").await,
        Err(StoreError::CalendarNotFound(_))
    ));
    // A routine naming a calendar that does not exist is refused, and nothing is written.
    let refused = store
        .create_routine(daily_on("on nothing", "missing", OnHoliday::Skip))
        .await;
    assert!(
        matches!(refused, Err(StoreError::CalendarNotFound(_))),
        "{refused:?}"
    );
    // One whose schedule the policy cannot move is refused with the domain's reason.
    let hourly = NewRoutine::message(
        "hourly",
        Schedule::parse("0 * * * *", "Europe/Berlin").unwrap(),
        "x",
    )
    .calendar(Some("de".into()), OnHoliday::Next)
    .build()
    .unwrap();
    let refused = store.create_routine(hourly).await.unwrap_err().to_string();
    assert!(refused.contains("fixed-time"), "{refused}");
    assert!(store.list_routines().await.unwrap().is_empty());

    let routine = store
        .create_routine(daily_on("payroll", "de", OnHoliday::Skip))
        .await
        .unwrap();
    assert_eq!(routine.calendar.as_deref(), Some("de"));
    let listed = store.list_calendars().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].routines, 1);
    // In use: not deleted, and the refusal names the routine.
    match store.delete_calendar("de").await {
        Err(StoreError::CalendarInUse { routines, .. }) => assert_eq!(routines, ["payroll"]),
        other => panic!("{other:?}"),
    }
    store.delete_routine(routine.id).await.unwrap();
    store.delete_calendar("de").await.unwrap();
    assert!(store.list_calendars().await.unwrap().is_empty());
}

/// A routine under `next` whose clock stands for a day off's occurrence: the claim plans both
/// that occurrence and the business day's own at the business day's instant, each keyed by its
/// own instant, and moves the clock to the next day.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_claim_plans_a_moved_occurrence_at_the_business_day(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    a_moved_occurrence_is_planned_at_the_business_day(&store, &pool, false).await;
}

/// The claim of a routine under `next` whose holiday's occurrence came due while the scheduler
/// was down (per group, as on Citus, when `per_group`).
pub(crate) async fn a_moved_occurrence_is_planned_at_the_business_day(
    store: &PgStore,
    pool: &PgPool,
    per_group: bool,
) {
    let (store, pool) = (store.clone(), pool.clone());
    let today = db_now(&pool).await.date_naive();
    let holiday = today - Duration::days(5);
    let business = holiday + Duration::days(1);
    store
        .create_calendar("office", &dates_off(&[holiday]))
        .await
        .unwrap();
    let routine = store
        .create_routine(daily_on("report", "office", OnHoliday::Next))
        .await
        .unwrap();
    // The scheduler was down since the holiday's occurrence came due (on the day after).
    set_next_run(&pool, routine.id, nine(business)).await;
    let mut params = claim_params("a", 1000, rules(10 * 86_400, 100));
    if per_group {
        params.group = Some(routine.group_id);
    }
    let claim = store.claim_due(&params).await.unwrap();
    let planned: Vec<(DateTime<Utc>, DateTime<Utc>)> = claim
        .fires
        .iter()
        .map(|f| (f.occurrence.scheduled_at, f.planned_at))
        .collect();
    assert_eq!(planned[0], (nine(holiday), nine(business)));
    assert_eq!(planned[1], (nine(business), nine(business)));
    // Every later day up to today is owed once, at its own instant.
    let owed: Vec<DateTime<Utc>> = claim
        .fires
        .iter()
        .map(|f| f.occurrence.scheduled_at)
        .collect();
    let expected: Vec<DateTime<Utc>> = (0..)
        .map(|n| nine(holiday + Duration::days(n)))
        .take_while(|at| *at <= claim.now)
        .collect();
    assert_eq!(owed, expected);
    let clock = store
        .get_routine(routine.id)
        .await
        .unwrap()
        .next_run_at
        .unwrap();
    assert_eq!(clock, *expected.last().unwrap() + Duration::days(1));
    assert_eq!(ledger(&store, routine.id).await.len(), expected.len());
}

/// An edit of a calendar moves the clocks of its routines in its transaction, from the
/// occurrence each stood for, and back when the edit is undone.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn an_edit_re_plans_the_routines_on_the_calendar(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    an_edit_re_plans_its_routines(&store, &pool).await;
}

/// An edit of a calendar with three routines on it, one per policy, done and undone.
pub(crate) async fn an_edit_re_plans_its_routines(store: &PgStore, pool: &PgPool) {
    let (store, pool) = (store.clone(), pool.clone());
    let tomorrow = next_nine_day(db_now(&pool).await);
    let after = tomorrow + Duration::days(1);
    store
        .create_calendar("office", &dates_off(&[]))
        .await
        .unwrap();
    let skip = store
        .create_routine(daily_on("skips", "office", OnHoliday::Skip))
        .await
        .unwrap();
    let next = store
        .create_routine(daily_on("moves", "office", OnHoliday::Next))
        .await
        .unwrap();
    let previous = store
        .create_routine(daily_on("moves back", "office", OnHoliday::Previous))
        .await
        .unwrap();
    // Each clock at the next 09:00 (`tomorrow`, today before 09:00): the test's clock runs
    // before it whatever the hour.
    for id in [skip.id, next.id, previous.id] {
        set_next_run(&pool, id, nine(tomorrow)).await;
    }
    let clock = |id| {
        let store = store.clone();
        async move { store.get_routine(id).await.unwrap().next_run_at.unwrap() }
    };

    let edit = store
        .edit_calendar_dates("office", &[tomorrow], true)
        .await
        .unwrap();
    assert_eq!((edit.changed, edit.replanned), (1, 3));
    // skip: tomorrow is not owed; next: tomorrow's is owed the day after; previous: today's
    // 09:00 (planned today, it is owed from now or at once).
    assert_eq!(clock(skip.id).await, nine(after));
    assert_eq!(clock(next.id).await, nine(after));
    assert_eq!(clock(previous.id).await, nine(tomorrow - Duration::days(1)));
    // The schedules as `routine show` reads them agree with the clocks.
    let on = store
        .routine_schedule(&store.get_routine(next.id).await.unwrap())
        .await
        .unwrap();
    assert_eq!(
        on.runs_from_clock(next.id, nine(after)).next(),
        Some((nine(tomorrow), nine(after)))
    );

    let undone = store
        .edit_calendar_dates("office", &[tomorrow], false)
        .await
        .unwrap();
    assert_eq!(undone.changed, 1);
    for id in [skip.id, next.id] {
        assert_eq!(clock(id).await, nine(tomorrow), "{id}");
    }
    // Under `previous` the clock at today's 09:00 stood for today's own occurrence (the
    // earliest planned then; here handled already, so the claim finds its fire and moves on):
    // it stays.
    assert_eq!(clock(previous.id).await, nine(tomorrow - Duration::days(1)));
    // Adding a date already there changes nothing.
    let none = store
        .edit_calendar_dates("office", &[], true)
        .await
        .unwrap();
    assert_eq!((none.changed, none.replanned), (0, 0));
}

/// From SQL: a calendar, a routine put on it, planned by the next pass with the calendar; a
/// calendar in use is not deleted.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn calendars_from_sql(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let name: String = sqlx::query_scalar(
        "SELECT cm.create_calendar('ops', 'Europe/Berlin', ARRAY['2027-01-01']::date[], 'sat,sun')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(name, "ops");
    let stored = store.get_calendar("ops").await.unwrap();
    assert_eq!(stored.calendar.days_off().len(), 2);
    let bad = sqlx::query("SELECT cm.create_calendar('x', 'UTC', '{}', 'sat,holiday')")
        .execute(&pool)
        .await
        .unwrap_err()
        .to_string();
    assert!(bad.contains("invalid day off"), "{bad}");
    let id: uuid::Uuid = sqlx::query_scalar(
        "SELECT cm.create_routine('monthly', '0 9 1 * *', 'Europe/Berlin', 'hello')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let set: bool = sqlx::query_scalar("SELECT cm.set_routine_calendar($1, 'ops', 'previous')")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(set);
    let unknown = sqlx::query("SELECT cm.set_routine_calendar($1, 'nope', 'skip')")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("no calendar is named"), "{unknown}");
    let planned = cm_store::UnplannedRoutines::plan_routines(&store, None, 10)
        .await
        .unwrap();
    assert_eq!(planned.len(), 1, "{planned:?}");
    assert_eq!(planned[0].refused, None);
    let routine = store.get_routine(id).await.unwrap();
    assert_eq!(routine.on_holiday, OnHoliday::Previous);
    let schedule = Schedule::parse("0 9 1 * *", "Europe/Berlin")
        .unwrap()
        .with_calendar(Arc::new(stored.calendar), OnHoliday::Previous)
        .unwrap();
    let now = db_now(&pool).await;
    let expected = schedule.next_planned_after(id, now).map(|(_, p)| p);
    // The pass's clock is a moment after this test's `now` read, with nothing between.
    assert_eq!(routine.next_run_at, expected);
    let in_use = sqlx::query("SELECT cm.delete_calendar('ops')")
        .execute(&pool)
        .await
        .unwrap_err()
        .to_string();
    assert!(in_use.contains("used by 1 routine"), "{in_use}");
}

/// An edit of a calendar from SQL leaves its routines for the next planning pass, each with
/// the clock and the calendar it had, and the pass moves the clocks as an edit through cm does;
/// a second edit before the pass changes nothing of what the first left.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn an_edit_from_sql_is_re_planned_by_the_next_pass(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let tomorrow = next_nine_day(db_now(&pool).await);
    let after = tomorrow + Duration::days(1);
    store
        .create_calendar("office", &dates_off(&[]))
        .await
        .unwrap();
    let next = store
        .create_routine(daily_on("moves", "office", OnHoliday::Next))
        .await
        .unwrap();
    set_next_run(&pool, next.id, nine(tomorrow)).await;
    let edit = |add: bool, day: NaiveDate| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i32>(
                "SELECT cm.edit_calendar_dates('office', ARRAY[$1]::date[], $2)",
            )
            .bind(day)
            .bind(add)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let plan = || async {
        cm_store::UnplannedRoutines::plan_routines(&store, None, 10)
            .await
            .unwrap()
    };
    assert_eq!(edit(true, tomorrow).await, 1);
    let waiting = store.get_routine(next.id).await.unwrap();
    assert_eq!(
        waiting.next_run_at, None,
        "never due while it waits for the pass"
    );
    // A second edit meanwhile: the routine waits with the clock and calendar it had.
    assert_eq!(edit(true, after + Duration::days(3)).await, 0);
    let planned = plan().await;
    assert_eq!(planned.len(), 1);
    assert_eq!(planned[0].next_run_at, Some(nine(after)));
    assert_eq!(edit(false, tomorrow).await, 1);
    let planned = plan().await;
    assert_eq!(planned[0].next_run_at, Some(nine(tomorrow)));
    // Nothing changed: no routine left waiting.
    assert_eq!(edit(false, tomorrow).await, 0);
    let unknown = sqlx::query("SELECT cm.edit_calendar_dates('nope', '{}', true)")
        .execute(&pool)
        .await
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("no calendar is named"), "{unknown}");
}

/// `cm.create_routines` puts a batch's routines on the calendars they name; a calendar that
/// does not exist refuses the whole batch, naming the element, and writes nothing; and the
/// calendars named are share-locked by the write, so a delete of one waits for it and then finds
/// its routines.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_batch_from_sql_on_calendars_holds_them_against_a_delete(pool: PgPool) {
    sqlx::query("SELECT cm.create_calendar('office', 'UTC', '{}', 'sat,sun')")
        .execute(&pool)
        .await
        .unwrap();
    let batch = serde_json::json!([
        {"name": "a", "schedule": "0 9 * * *", "message": "m", "calendar": "office"},
        {"name": "b", "schedule": "0 9 * * *", "message": "m"},
        {"name": "c", "schedule": "@daily", "message": "m", "calendar": "office",
         "on_holiday": "next"},
    ]);
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT cm.create_routines($1)")
        .bind(&batch)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(ids.len(), 3);
    let on: Vec<(String, Option<String>, String)> =
        sqlx::query_as("SELECT name, calendar, on_holiday FROM cm.routines ORDER BY name")
            .fetch_all(&pool)
            .await
            .unwrap();
    let on: Vec<(&str, Option<&str>, &str)> = on
        .iter()
        .map(|(n, c, h)| (n.as_str(), c.as_deref(), h.as_str()))
        .collect();
    assert_eq!(
        on,
        [
            ("a", Some("office"), "skip"),
            ("b", None, "skip"),
            ("c", Some("office"), "next")
        ]
    );

    let unknown = sqlx::query("SELECT cm.create_routines($1)")
        .bind(serde_json::json!([
            {"name": "d", "schedule": "0 9 * * *", "message": "m", "calendar": "office"},
            {"name": "e", "schedule": "0 9 * * *", "message": "m", "calendar": "nope"},
        ]))
        .execute(&pool)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        unknown.contains("routine 2 of 2: no calendar is named 'nope'"),
        "{unknown}"
    );
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM cm.routines")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 3, "nothing written");

    // A batch on `office` not yet committed: a delete of the calendar waits for it, then sees
    // its routines and refuses.
    sqlx::query("SELECT cm.create_calendar('shop', 'UTC', '{}', 'sun')")
        .execute(&pool)
        .await
        .unwrap();
    let mut writing = pool.begin().await.unwrap();
    sqlx::query("SELECT cm.create_routines($1)")
        .bind(serde_json::json!([
            {"name": "f", "schedule": "0 9 * * *", "message": "m", "calendar": "shop"},
        ]))
        .execute(&mut *writing)
        .await
        .unwrap();
    let deleting = tokio::spawn({
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>("SELECT cm.delete_calendar('shop')")
                .fetch_one(&pool)
                .await
                .map_err(|e| e.to_string())
        }
    });
    // The delete is seen waiting on a lock before the batch commits.
    let mut waited = false;
    for _ in 0..600 {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                            WHERE datname = current_database() AND wait_event_type = 'Lock'
                              AND query LIKE '%delete_calendar%')",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if waiting {
            waited = true;
            break;
        }
        assert!(
            !deleting.is_finished(),
            "the delete did not wait for the batch"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(waited, "the delete never waited for the batch");
    writing.commit().await.unwrap();
    let refused = deleting.await.unwrap().unwrap_err();
    assert!(
        refused.contains("the calendar 'shop' is used by 1 routine(s)"),
        "{refused}"
    );
}
