//! Creating many routines in the caller's transaction a few statements at a time: each chunk of
//! [`CHUNK`] routines is one `INSERT … SELECT FROM UNNEST` into `routine_names` and one into
//! `routines`, instead of three statements a routine. Everything a routine's insert computes in
//! Rust (its id, group, first run, the checks of its schedule against now and its calendar) is
//! computed here as [`crate::catalog::insert_routine`] computes it.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use cm_domain::Calendar;
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

/// The calendars of `routines` not yet in `calendars`, read into it in the caller's transaction
/// under a share lock (as [`catalog::planned`] reads a routine's): one read a calendar.
async fn read_calendars_of(
    conn: &mut PgConnection,
    routines: &[&NewRoutine],
    calendars: &mut HashMap<String, Arc<Calendar>>,
) -> Result<(), StoreError> {
    for name in routines.iter().filter_map(|r| r.calendar.as_deref()) {
        if !calendars.contains_key(name) {
            let calendar = crate::calendars::read_calendar(&mut *conn, name, true).await?;
            calendars.insert(name.to_owned(), Arc::new(calendar));
        }
    }
    Ok(())
}

/// Whether every calendar `routines` name was read into `calendars`.
fn calendars_known(routines: &[NewRoutine], calendars: &HashMap<String, Arc<Calendar>>) -> bool {
    routines
        .iter()
        .filter_map(|r| r.calendar.as_deref())
        .all(|name| calendars.contains_key(name))
}

impl Columns {
    /// `routines` planned at `now` as [`catalog::planned`] plans each, their calendars taken
    /// from `calendars` (read in the writing transaction), in `group_count` groups.
    fn planned(
        routines: &[&NewRoutine],
        calendars: &HashMap<String, Arc<Calendar>>,
        group_count: u16,
        now: DateTime<Utc>,
    ) -> Result<Columns, StoreError> {
        let mut c = Columns::default();
        for routine in routines {
            let calendar = match routine.calendar.as_deref() {
                None => None,
                Some(name) => Some(
                    calendars
                        .get(name)
                        .cloned()
                        .ok_or_else(|| StoreError::CalendarNotFound(name.to_owned()))?,
                ),
            };
            let planned = catalog::plan(routine, calendar, now)?;
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
        Ok(c)
    }
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
    let mut calendars = HashMap::new();
    read_calendars_of(conn, routines, &mut calendars).await?;
    let mut written = Vec::with_capacity(routines.len());
    for chunk in routines.chunks(CHUNK) {
        let c = Columns::planned(chunk, &calendars, group_count, now)?;
        written.extend(insert_chunk(conn, c, source).await?);
    }
    Ok(written)
}

/// The statement that writes a chunk's routines from its columns' arrays (`$16` the source).
macro_rules! insert_routines_sql {
    () => {
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
                   backoff, backoff_max, key)"
    };
}

/// `query` with the columns of `c` (taken) and `source` bound as [`insert_routines_sql!`]
/// reads them. A bound value is encoded as it is bound: the statement is ready to send.
macro_rules! bind_columns {
    ($query:expr, $c:expr, $source:expr) => {
        $query
            .bind($c.ids)
            .bind($c.names)
            .bind($c.schedules)
            .bind($c.zones)
            .bind($c.kinds)
            .bind($c.payloads)
            .bind($c.misfires)
            .bind($c.paused)
            .bind($c.next_runs)
            .bind($c.groups)
            .bind($c.runs_left)
            .bind($c.overlaps)
            .bind($c.calendars)
            .bind($c.on_holidays)
            .bind($c.deadlines)
            .bind($source)
            .bind($c.retries)
            .bind($c.backoffs)
            .bind($c.backoff_caps)
            .bind($c.keys)
    };
}

/// A statement with its arguments bound.
type Bound = sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// The statement that writes `c`'s names.
fn names_statement(c: &Columns) -> Bound {
    crate::schema::query(
        "INSERT INTO cm.routine_names (name, routine_id, group_id)
         SELECT * FROM UNNEST($1::text[], $2::uuid[], $3::int2[])",
    )
    .bind(c.names.clone())
    .bind(c.ids.clone())
    .bind(c.groups.clone())
}

/// Writes one chunk's names: a name taken is [`StoreError::NameTaken`].
async fn insert_names(conn: &mut PgConnection, names: Bound) -> Result<(), StoreError> {
    names.execute(&mut *conn).await.map_err(name_taken)?;
    Ok(())
}

/// Writes one chunk's names, then its routines; the rows in the chunk's order.
async fn insert_chunk(
    conn: &mut PgConnection,
    c: Columns,
    source: Option<&str>,
) -> Result<Vec<Routine>, StoreError> {
    insert_names(conn, names_statement(&c)).await?;
    // RETURNING gives no order: the chunk's is its ids'.
    let place: HashMap<Uuid, usize> = c.ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    let rows: Vec<RoutineRow> = bind_columns!(
        crate::schema::query_as(concat!(insert_routines_sql!(), " RETURNING *")),
        c,
        source.map(str::to_owned)
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut rows = routines_of(rows)?;
    rows.sort_by_key(|r| place.get(&r.id).copied().unwrap_or(usize::MAX));
    Ok(rows)
}

/// A chunk ready to write: its two statements, their arrays encoded, and the ids and names they
/// write, in order.
struct Prepared {
    names: Bound,
    routines: Bound,
    written: Vec<(Uuid, String)>,
}

impl Prepared {
    /// `c`'s statements, recording `source`, which read nothing back.
    fn of(c: Columns, source: Option<String>) -> Prepared {
        let names = names_statement(&c);
        let written = c.ids.iter().copied().zip(c.names.iter().cloned()).collect();
        let routines = bind_columns!(crate::schema::query(insert_routines_sql!()), c, source);
        Prepared {
            names,
            routines,
            written,
        }
    }

    /// Writes the names, then the routines.
    async fn write(self, conn: &mut PgConnection) -> Result<Vec<(Uuid, String)>, StoreError> {
        insert_names(conn, self.names).await?;
        self.routines.execute(&mut *conn).await?;
        Ok(self.written)
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

/// What a streamed creation does next.
enum Next {
    /// A chunk, planned and its statements bound.
    Planned(Box<Prepared>),
    /// A chunk naming a calendar not read yet: it is read, then the chunk planned.
    Unplanned(Vec<NewRoutine>),
    /// Commit.
    End,
    /// The sender went away: roll back.
    Gone,
}

/// Creates the routines `chunks` sends, each chunk written as it comes, in one transaction that
/// commits at [`Streamed::End`] and rolls back if the sender goes away before it; the ids and
/// names written, in order. Each chunk is planned (its routines' ids and first runs) and its
/// statements' arrays encoded on a blocking thread while the chunk before it is written, so
/// the client's work and the server's overlap; a chunk naming a calendar this creation has not read yet waits for the
/// write, to read it on the transaction first.
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
    let group_count = stored_group_count(&mut tx).await?;
    let mut calendars: HashMap<String, Arc<Calendar>> = HashMap::new();
    let mut written = Vec::new();
    // The chunk planned and not yet written.
    let mut ready: Option<Box<Prepared>> = None;
    loop {
        let known = &calendars;
        let receive = async {
            Ok::<_, StoreError>(match chunks.recv().await {
                Some(Streamed::Chunk(chunk)) if calendars_known(&chunk, known) => {
                    let known = known.clone();
                    let source = source.map(str::to_owned);
                    let planning = tokio::task::spawn_blocking(move || {
                        let routines: Vec<&NewRoutine> = chunk.iter().collect();
                        Columns::planned(&routines, &known, group_count, now)
                            .map(|c| Box::new(Prepared::of(c, source)))
                    });
                    let planned = planning.await.map_err(|e| {
                        StoreError::InvalidRoutine(format!("planning the routines: {e}"))
                    })??;
                    Next::Planned(planned)
                }
                Some(Streamed::Chunk(chunk)) => Next::Unplanned(chunk),
                Some(Streamed::End) => Next::End,
                None => Next::Gone,
            })
        };
        let next = match ready.take() {
            Some(prepared) => {
                let (wrote, next) =
                    futures_util::future::join(prepared.write(&mut tx), receive).await;
                written.extend(wrote?);
                next?
            }
            None => receive.await?,
        };
        match next {
            Next::Planned(columns) => ready = Some(columns),
            Next::Unplanned(chunk) => {
                let routines: Vec<&NewRoutine> = chunk.iter().collect();
                read_calendars_of(&mut tx, &routines, &mut calendars).await?;
                let planned = Columns::planned(&routines, &calendars, group_count, now)?;
                ready = Some(Box::new(Prepared::of(planned, source.map(str::to_owned))));
            }
            Next::End => {
                tx.commit().await?;
                return Ok(written);
            }
            Next::Gone => {
                tx.rollback().await?;
                return Err(StoreError::InvalidRoutine(
                    "the routines stopped coming before their end: nothing was written".into(),
                ));
            }
        }
    }
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
