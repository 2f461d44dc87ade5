//! Creating many routines in the caller's transaction a few statements at a time: each chunk of
//! [`CHUNK`] routines is one `INSERT … SELECT FROM UNNEST` into `routine_names` and one into
//! `routines`, instead of three statements a routine. Everything a routine's insert computes in
//! Rust (its id, group, first run, the checks of its schedule against now and its calendar) is
//! computed here as [`crate::catalog::insert_routine`] computes it.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::groups::{GroupId, group_of, stored_group_count};
use crate::model::{NewRoutine, Routine, RoutineRow, routines_of};
use crate::{StoreError, catalog};

/// How many routines one pair of statements writes: large enough that a statement's round trip
/// is a small part of its cost, small enough that its arrays stay a few megabytes.
pub const CHUNK: usize = 5_000;

/// One chunk's columns, in the order of the statements' arrays.
#[derive(Default)]
struct Columns {
    ids: Vec<Uuid>,
    names: Vec<String>,
    schedules: Vec<String>,
    zones: Vec<String>,
    kinds: Vec<String>,
    payloads: Vec<serde_json::Value>,
    misfires: Vec<String>,
    paused: Vec<bool>,
    next_runs: Vec<Option<DateTime<Utc>>>,
    groups: Vec<GroupId>,
    runs_left: Vec<Option<i32>>,
    overlaps: Vec<String>,
    calendars: Vec<Option<String>>,
    on_holidays: Vec<String>,
    deadlines: Vec<Option<i32>>,
    retries: Vec<i16>,
    backoffs: Vec<i32>,
    backoff_caps: Vec<i32>,
    keys: Vec<Option<String>>,
}

/// Inserts `routines` (names no routine has: the caller checked them under its locks), each
/// recording `source`, at the database instant `now`; the rows written, in `routines`' order.
/// A name taken meanwhile is [`StoreError::NameTaken`].
pub(crate) async fn insert_routines(
    conn: &mut PgConnection,
    routines: &[&NewRoutine],
    source: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Vec<Routine>, StoreError> {
    let group_count = stored_group_count(conn).await?;
    let mut written = Vec::with_capacity(routines.len());
    for chunk in routines.chunks(CHUNK) {
        let mut c = Columns::default();
        for routine in chunk {
            let planned = catalog::planned(conn, routine, now).await?;
            c.ids.push(planned.id);
            c.names.push(routine.name.clone());
            c.schedules.push(routine.schedule.expression().to_string());
            c.zones.push(routine.schedule.zone().name().to_string());
            c.kinds.push(routine.kind.as_str().to_string());
            c.payloads.push(routine.payload.clone());
            c.misfires.push(routine.misfire.as_str().to_string());
            c.paused.push(routine.paused);
            c.next_runs.push(planned.next_run_at);
            c.groups.push(group_of(planned.id, group_count));
            c.runs_left.push(planned.runs_left);
            c.overlaps.push(routine.overlap.as_str().to_string());
            c.calendars.push(routine.calendar.clone());
            c.on_holidays.push(routine.on_holiday.as_str().to_string());
            c.deadlines.push(catalog::deadline_column(routine.deadline));
            let (retries, base, max) = catalog::retry_columns(routine.retry);
            c.retries.push(retries);
            c.backoffs.push(base);
            c.backoff_caps.push(max);
            c.keys.push(
                routine
                    .concurrency_key
                    .as_ref()
                    .map(|k| k.as_str().to_owned()),
            );
        }
        written.extend(insert_chunk(conn, &c, source).await?);
    }
    Ok(written)
}

/// Writes one chunk's names, then its routines; the rows in the chunk's order.
async fn insert_chunk(
    conn: &mut PgConnection,
    c: &Columns,
    source: Option<&str>,
) -> Result<Vec<Routine>, StoreError> {
    crate::schema::query(
        "INSERT INTO cm.routine_names (name, routine_id, group_id)
         SELECT * FROM UNNEST($1::text[], $2::uuid[], $3::int2[])",
    )
    .bind(&c.names)
    .bind(&c.ids)
    .bind(&c.groups)
    .execute(&mut *conn)
    .await
    .map_err(name_taken)?;
    let rows: Vec<RoutineRow> = crate::schema::query_as(
        "INSERT INTO cm.routines
             (id, name, schedule, timezone, kind, payload, misfire_policy, paused, next_run_at,
              source, group_id, runs_left, overlap, calendar, on_holiday, deadline_secs,
              retries, retry_backoff_secs, retry_backoff_max_secs, concurrency_key)
         SELECT u.id, u.name, u.schedule, u.timezone, u.kind, u.payload, u.misfire, u.paused,
                u.next_run_at, $16, u.group_id, u.runs_left, u.overlap, u.calendar,
                u.on_holiday, u.deadline, u.retries, u.backoff, u.backoff_max, u.key
         FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::jsonb[],
                     $7::text[], $8::bool[], $9::timestamptz[], $10::int2[], $11::int4[],
                     $12::text[], $13::text[], $14::text[], $15::int4[], $17::int2[],
                     $18::int4[], $19::int4[], $20::text[])
              AS u(id, name, schedule, timezone, kind, payload, misfire, paused, next_run_at,
                   group_id, runs_left, overlap, calendar, on_holiday, deadline, retries,
                   backoff, backoff_max, key)
         RETURNING *",
    )
    .bind(&c.ids)
    .bind(&c.names)
    .bind(&c.schedules)
    .bind(&c.zones)
    .bind(&c.kinds)
    .bind(&c.payloads)
    .bind(&c.misfires)
    .bind(&c.paused)
    .bind(&c.next_runs)
    .bind(&c.groups)
    .bind(&c.runs_left)
    .bind(&c.overlaps)
    .bind(&c.calendars)
    .bind(&c.on_holidays)
    .bind(&c.deadlines)
    .bind(source)
    .bind(&c.retries)
    .bind(&c.backoffs)
    .bind(&c.backoff_caps)
    .bind(&c.keys)
    .fetch_all(&mut *conn)
    .await?;
    let mut rows = routines_of(rows)?;
    // RETURNING gives no order: the chunk's is its ids'.
    let place: std::collections::HashMap<Uuid, usize> =
        c.ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    rows.sort_by_key(|r| place.get(&r.id).copied().unwrap_or(usize::MAX));
    Ok(rows)
}

/// A unique violation of a name written by another transaction meanwhile, as
/// [`StoreError::NameTaken`] with the name PostgreSQL's detail gives (`Key (name)=(x) already
/// exists.`).
fn name_taken(e: sqlx::Error) -> StoreError {
    let name = e
        .as_database_error()
        .and_then(|d| d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>())
        .and_then(|d| d.detail())
        .and_then(|detail| detail.strip_prefix("Key (name)=("))
        .and_then(|rest| rest.strip_suffix(") already exists."))
        .map(str::to_owned);
    match name {
        Some(name) => catalog::name_conflict(e, &name),
        None => e.into(),
    }
}

/// What a streamed creation ([`crate::PgStore::create_routines_streamed`]) receives: a chunk of
/// routines to write, or the end of the stream, which commits.
#[derive(Debug)]
pub enum Streamed {
    /// Routines to create, in order.
    Chunk(Vec<NewRoutine>),
    /// Every chunk was sent: the creation commits.
    End,
}

/// Creates the routines `chunks` sends, each chunk written as it comes, in one transaction that
/// commits at [`Streamed::End`] and rolls back if the sender goes away before it; the ids and
/// names written, in order.
pub(crate) async fn create_streamed(
    conn: &mut PgConnection,
    source: Option<&str>,
    chunks: &mut tokio::sync::mpsc::Receiver<Streamed>,
) -> Result<Vec<(Uuid, String)>, StoreError> {
    use sqlx::Connection as _;
    let mut tx = conn.begin().await?;
    let now = catalog::db_now(&mut tx).await?;
    if let Some(source) = source {
        catalog::lock_source(&mut tx, source).await?;
    }
    let mut written = Vec::new();
    loop {
        match chunks.recv().await {
            Some(Streamed::Chunk(chunk)) => {
                let routines: Vec<&NewRoutine> = chunk.iter().collect();
                let rows = insert_routines(&mut tx, &routines, source, now).await?;
                written.extend(rows.into_iter().map(|r| (r.id, r.name)));
            }
            Some(Streamed::End) => {
                tx.commit().await?;
                return Ok(written);
            }
            None => {
                tx.rollback().await?;
                return Err(StoreError::InvalidRoutine(
                    "the routines stopped coming before their end: nothing was written".into(),
                ));
            }
        }
    }
}
