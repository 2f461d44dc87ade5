//! The claim's first statement read back: the database's clock, the requests taken (asked for
//! by hand) and the due routines locked; and the requests a claim takes later, into the room
//! its scheduled work left.

use chrono::{DateTime, Utc};
use cm_domain::{FireOrigin, RoutineKind};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{FromRow, Postgres, Transaction};
use uuid::Uuid;

use super::DueCursor;
use super::claim::bind_group;
use super::sql::{
    DUE_AFTER_SQL, DUE_GROUP_AFTER_SQL, DUE_GROUP_SQL, DUE_SQL, FAIR_DUE_AFTER_SQL,
    FAIR_DUE_GROUP_AFTER_SQL, FAIR_DUE_GROUP_SQL, FAIR_DUE_SQL, TAKE_GROUP_REQUESTS_SQL,
    TAKE_REQUESTS_SQL,
};
use crate::StoreError;
use crate::groups::GroupId;

/// A row of the claim's first statement ([`DUE_SQL`](super::sql::DUE_SQL)): the clock, a due request, or a due
/// routine, told apart by `source`.
#[derive(FromRow)]
pub(super) struct DueRow {
    source: String,
    now: DateTime<Utc>,
    id: Option<Uuid>,
    at: Option<DateTime<Utc>>,
    schedule: Option<String>,
    timezone: Option<String>,
    misfire_policy: Option<String>,
    kind: Option<String>,
    origin: Option<String>,
    runs_left: Option<i32>,
    overlap: Option<String>,
    calendar: Option<String>,
    on_holiday: Option<String>,
    concurrency_key: Option<String>,
    key_wait: Option<bool>,
    last_run_at: Option<DateTime<Utc>>,
    turn: Option<i64>,
    walked: Option<bool>,
    requested_at: Option<DateTime<Utc>>,
}

/// A due routine as the claim reads it.
pub(super) struct DueRoutine {
    pub(super) id: Uuid,
    pub(super) schedule: String,
    pub(super) timezone: String,
    pub(super) misfire_policy: String,
    pub(super) kind: String,
    pub(super) next_run_at: DateTime<Utc>,
    /// Scheduled occurrences it may still fire; `None` is no limit.
    pub(super) runs_left: Option<i32>,
    /// Its overlap policy, as stored.
    pub(super) overlap: String,
    /// The holiday calendar it is on, by name.
    pub(super) calendar: Option<String>,
    /// Its policy for an occurrence on a day off, as stored.
    pub(super) on_holiday: String,
    /// The concurrency key whose limit it shares.
    pub(super) concurrency_key: Option<String>,
    /// Whether its clock waits on its key's limit: what came due meanwhile is owed (caught
    /// up), not its misfire policy's.
    pub(super) key_wait: bool,
    /// When a claim last took an occurrence of it: the key's turns go to who ran longest ago.
    pub(super) last_run_at: Option<DateTime<Utc>>,
    /// Its turn among its key's due routines of this claim, 0 first: the claim takes turns
    /// between keys before instants.
    pub(super) turn: u32,
    /// Whether the walk in the order of instants locked it (not a key's head past its
    /// frontier): only those move the drain's cursor.
    pub(super) walked: bool,
}

/// An occurrence asked for by hand, taken by the claim.
#[derive(Debug, Clone)]
pub(super) struct Request {
    pub(super) routine_id: Uuid,
    pub(super) scheduled_at: DateTime<Utc>,
    pub(super) origin: FireOrigin,
    /// Whether its routine is a mission: it takes the mission room.
    pub(super) mission: bool,
    /// Its routine's concurrency key.
    pub(super) concurrency_key: Option<String>,
    /// When a claim last took an occurrence of its routine.
    pub(super) last_run_at: Option<DateTime<Utc>>,
    /// When it was asked for: a request put back (its key full) keeps it.
    pub(super) requested_at: DateTime<Utc>,
}

/// A request as a request walk returns it.
#[derive(FromRow)]
struct TakenRequest {
    routine_id: Uuid,
    scheduled_at: DateTime<Utc>,
    /// Its stored origin.
    origin: String,
    /// Its routine's kind.
    kind: String,
    concurrency_key: Option<String>,
    last_run_at: Option<DateTime<Utc>>,
    requested_at: DateTime<Utc>,
}

impl TakenRequest {
    fn read(self) -> Result<Request, StoreError> {
        Ok(Request {
            routine_id: self.routine_id,
            scheduled_at: self.scheduled_at,
            origin: request_origin(self.routine_id, &self.origin)?,
            mission: self.kind == RoutineKind::Mission.as_str(),
            concurrency_key: self.concurrency_key,
            last_run_at: self.last_run_at,
            requested_at: self.requested_at,
        })
    }
}

/// The statement that takes up to `limit` due requests, at most `missions` of them of mission
/// routines, in `group` or any, none of the `full` concurrency keys (see [`take_requests`]),
/// bound.
pub(crate) fn take_requests_query(
    limit: usize,
    missions: Option<usize>,
    group: Option<GroupId>,
    full: Vec<String>,
) -> Query<'static, Postgres, PgArguments> {
    let statement = match group {
        None => TAKE_REQUESTS_SQL,
        Some(_) => TAKE_GROUP_REQUESTS_SQL,
    };
    let query = crate::schema::query(statement)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .bind(missions.map(|m| i64::try_from(m).unwrap_or(i64::MAX)));
    bind_group(query, group).bind(full)
}

/// The claim's first statement, bound: at most `max_routines` due routines locked, at most
/// `requests` due requests taken and at most `mission_room` of them of missions (`None`: no
/// bound), the walk resumed `after` a cursor or from the oldest due routine, in `group` or any,
/// leaving the routines and requests of the `full` concurrency keys be, and taking turns
/// between the concurrency `keys` (none: the order of instants alone).
pub(crate) fn due_query(
    max_routines: u32,
    requests: usize,
    mission_room: Option<usize>,
    after: Option<DueCursor>,
    group: Option<GroupId>,
    full: Vec<String>,
    keys: Vec<String>,
) -> Query<'static, Postgres, PgArguments> {
    let fair = !keys.is_empty();
    let statement = match (after, group, fair) {
        (None, None, false) => DUE_SQL,
        (None, Some(_), false) => DUE_GROUP_SQL,
        (Some(_), None, false) => DUE_AFTER_SQL,
        (Some(_), Some(_), false) => DUE_GROUP_AFTER_SQL,
        (None, None, true) => FAIR_DUE_SQL,
        (None, Some(_), true) => FAIR_DUE_GROUP_SQL,
        (Some(_), None, true) => FAIR_DUE_AFTER_SQL,
        (Some(_), Some(_), true) => FAIR_DUE_GROUP_AFTER_SQL,
    };
    let mut query = crate::schema::query(statement)
        .bind(i64::from(max_routines))
        .bind(i64::try_from(requests).unwrap_or(i64::MAX))
        .bind(mission_room.map(|room| i64::try_from(room).unwrap_or(i64::MAX)));
    if let Some(after) = after {
        query = query.bind(after.next_run_at).bind(after.routine_id);
    }
    let query = bind_group(query, group).bind(full);
    if fair { query.bind(keys) } else { query }
}

/// Deletes and returns up to `limit` requested occurrences that are due, oldest first, skipping
/// those another claim holds; at most `missions` of them of mission routines (`None`: no
/// bound). The mission requests past that bound stay in the table, in order, for a later claim.
pub(super) async fn take_requests(
    tx: &mut Transaction<'_, Postgres>,
    limit: usize,
    missions: Option<usize>,
    group: Option<GroupId>,
    full: Vec<String>,
) -> Result<Vec<Request>, StoreError> {
    let rows: Vec<TakenRequest> = take_requests_query(limit, missions, group, full)
        .try_map(|row| TakenRequest::from_row(&row))
        .fetch_all(&mut **tx)
        .await?;
    rows.into_iter().map(TakenRequest::read).collect()
}

/// A request's stored origin, read back.
fn request_origin(routine_id: Uuid, origin: &str) -> Result<FireOrigin, StoreError> {
    origin.parse().map_err(
        |e: cm_domain::ParseFireOriginError| StoreError::CorruptRoutine {
            routine_id,
            reason: e.to_string(),
        },
    )
}

/// What the claim's first statement read: the clock, the requests and the due routines.
pub(super) struct DueSet {
    pub(super) now: DateTime<Utc>,
    pub(super) requested: Vec<Request>,
    pub(super) due: Vec<DueRoutine>,
}

/// Splits the rows of [`DUE_SQL`](super::sql::DUE_SQL) into the clock, the requests and the due routines.
pub(super) fn split_due_rows(rows: Vec<DueRow>) -> Result<DueSet, StoreError> {
    let mut now = None;
    let mut requested = Vec::new();
    let mut due = Vec::new();
    for row in rows {
        now = Some(row.now);
        match (row.source.as_str(), row.id, row.at) {
            ("request", Some(id), Some(at)) => requested.push(
                TakenRequest {
                    routine_id: id,
                    scheduled_at: at,
                    origin: row.origin.unwrap_or_default(),
                    kind: row.kind.unwrap_or_default(),
                    concurrency_key: row.concurrency_key,
                    last_run_at: row.last_run_at,
                    requested_at: row.requested_at.unwrap_or(row.now),
                }
                .read()?,
            ),
            ("due", Some(id), Some(next_run_at)) => due.push(DueRoutine {
                id,
                schedule: row.schedule.unwrap_or_default(),
                timezone: row.timezone.unwrap_or_default(),
                misfire_policy: row.misfire_policy.unwrap_or_default(),
                kind: row.kind.unwrap_or_default(),
                next_run_at,
                runs_left: row.runs_left,
                overlap: row.overlap.unwrap_or_default(),
                calendar: row.calendar,
                on_holiday: row.on_holiday.unwrap_or_default(),
                concurrency_key: row.concurrency_key,
                key_wait: row.key_wait.unwrap_or(false),
                last_run_at: row.last_run_at,
                turn: row.turn.and_then(|t| u32::try_from(t).ok()).unwrap_or(0),
                walked: row.walked.unwrap_or(true),
            }),
            _ => {}
        }
    }
    let now = now.ok_or_else(|| {
        StoreError::Database(sqlx::Error::Protocol(
            "the due query returned no clock row".into(),
        ))
    })?;
    requested.sort_by_key(|r| (r.scheduled_at, r.routine_id));
    due.sort_by_key(|r| (r.next_run_at, r.id));
    Ok(DueSet {
        now,
        requested,
        due,
    })
}
