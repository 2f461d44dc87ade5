//! Events, `routine_events`: every change a person must hear about, one row each, written in
//! the transaction of its change (see [`cm_domain::event`]); read by `cm-scheduler events`, and
//! walked in order by the delivery loop, which marks each delivered once a sink took it.
//!
//! Who writes which: the outcome writes (a settle, a run's end) write `routine.failed` and
//! `routine.recovered` (`record_outcome_events`); a pause or resume, by a person or by cm,
//! writes its own (`record`); the deadline pass writes `routine.deadline_missed`
//! ([`EventLog::raise_missed_deadlines`]).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use cm_domain::EventType;
use serde_json::Value;
use sqlx::{FromRow, PgConnection};
use std::time::Duration;
use uuid::Uuid;

use crate::{GroupId, PgStore, StoreError};

/// A stored event.
#[derive(Debug, Clone, PartialEq, FromRow, serde::Serialize)]
pub struct RoutineEvent {
    /// Its place in the order events were written (a cursor for paging).
    pub seq: i64,
    /// Its stable id: the webhook id a receiver deduplicates by.
    pub id: Uuid,
    /// The routine's group.
    pub group_id: GroupId,
    /// The routine it is about.
    pub routine_id: Uuid,
    /// The routine's name when the event was written.
    pub routine_name: String,
    /// Its type's name (`routine.failed`; see [`EventType`]).
    #[sqlx(rename = "type")]
    #[serde(rename = "type")]
    pub event_type: String,
    /// The occurrence it is about, if one.
    pub scheduled_at: Option<DateTime<Utc>>,
    /// When its change happened.
    pub occurred_at: DateTime<Utc>,
    /// What the type carries (documented on each [`EventType`] variant).
    pub data: Value,
    /// When a sink took it; `None` while it is still to be delivered.
    pub delivered_at: Option<DateTime<Utc>>,
    /// How many posts were tried.
    pub delivery_attempts: i32,
    /// When the next post may be tried, after a failed one.
    pub retry_at: Option<DateTime<Utc>>,
    /// Why the last post failed, if it did.
    pub delivery_error: Option<String>,
}

/// An event to write.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// The routine's group.
    pub group_id: GroupId,
    /// The routine.
    pub routine_id: Uuid,
    /// Its name.
    pub routine_name: String,
    /// What happened.
    pub event_type: EventType,
    /// The occurrence it is about, if one.
    pub scheduled_at: Option<DateTime<Utc>>,
    /// What the type carries.
    pub data: Value,
}

/// Which events [`EventLog::events`] lists, newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventFilter {
    /// Only this routine's.
    pub routine: Option<Uuid>,
    /// Only this type.
    pub event_type: Option<EventType>,
    /// Only events written before this one (the cursor of the page before).
    pub before_seq: Option<i64>,
    /// At most this many.
    pub limit: u32,
}

/// The occurrences of one routine that were owed and not fired, by why: its misfire policy
/// (counted by its `routine.misfired` events), its overlap policy (a mission's occurrence while
/// its run held the routine) and buffering (`buffer-one` launching the newest of those its run
/// kept waiting), each with the latest such decision. Counted over what is kept: the ledger's
/// and the events' retention.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, FromRow, serde::Serialize)]
pub struct Skips {
    /// Occurrences the misfire policy skipped.
    pub misfired: i64,
    /// When it last skipped any.
    pub last_misfired: Option<DateTime<Utc>>,
    /// Occurrences settled `skipped` under the overlap policy.
    pub overlap: i64,
    /// The latest of them.
    pub last_overlap: Option<DateTime<Utc>>,
    /// Occurrences a `buffer-one` run left unlaunched.
    pub buffered: i64,
    /// The latest of them.
    pub last_buffered: Option<DateTime<Utc>>,
}

/// The event log.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait EventLog: Send + Sync {
    /// Events that match `filter`, newest first.
    async fn events(&self, filter: &EventFilter) -> Result<Vec<RoutineEvent>, StoreError>;

    /// Events not yet delivered, in `group` (every group: `None`), oldest first, at most
    /// `limit`, whatever their retry time (the caller keeps a routine's order: it sends none of
    /// a routine's events while an earlier one waits).
    async fn pending_events(
        &self,
        group: Option<GroupId>,
        limit: u32,
    ) -> Result<Vec<RoutineEvent>, StoreError>;

    /// Marks the events `(group, seq)` delivered. Returns how many were still undelivered.
    async fn mark_delivered(&self, events: &[(GroupId, i64)]) -> Result<u64, StoreError>;

    /// Notes a failed post of the event `(group, seq)`: its error, and when to try again.
    async fn mark_delivery_failed(
        &self,
        event: (GroupId, i64),
        error: &str,
        retry_at: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// Raises `routine.deadline_missed` for every occurrence, in `group` (every group: `None`),
    /// whose routine has a deadline and whose outcome is not succeeded a deadline after its
    /// planned instant: claimed and still running or waiting, failed, or never claimed (the
    /// routine's next run is that far behind). Once per occurrence, however many schedulers
    /// run it. Returns the events it wrote.
    async fn raise_missed_deadlines(
        &self,
        group: Option<GroupId>,
    ) -> Result<Vec<RoutineEvent>, StoreError>;

    /// The groups with a routine that has a deadline (the deadline pass runs only in those).
    async fn deadline_groups(&self) -> Result<Vec<GroupId>, StoreError>;

    /// The groups, of `among` (every group: `None`), with an event not yet delivered (delivery
    /// reads only those).
    async fn pending_groups<'a>(
        &self,
        among: Option<&'a [GroupId]>,
    ) -> Result<Vec<GroupId>, StoreError>;

    /// What the routine `routine_id` (of `group`) was owed and did not fire, by why.
    async fn skips(&self, routine_id: Uuid, group: GroupId) -> Result<Skips, StoreError>;

    /// Deletes at most `limit` delivered events (or any, once `retention` is past twice: an
    /// event no sink took for so long is not kept forever) older than `retention`. Returns how
    /// many it deleted.
    async fn prune_events(&self, retention: Duration, limit: u32) -> Result<u64, StoreError>;

    /// [`EventLog::prune_events`] in `group` alone (on Citus, one shard). By default, every
    /// group's.
    async fn prune_events_in(
        &self,
        group: GroupId,
        retention: Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let _ = group;
        self.prune_events(retention, limit).await
    }
}

/// The columns an event is read with.
macro_rules! event_columns {
    () => {
        "seq, id, group_id, routine_id, routine_name, type, scheduled_at, occurred_at, data, \
         delivered_at, delivery_attempts, retry_at, delivery_error"
    };
}

/// Writes `events` in the caller's transaction, in order.
pub(crate) async fn record(conn: &mut PgConnection, events: &[NewEvent]) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    let mut groups = Vec::with_capacity(events.len());
    let mut routines = Vec::with_capacity(events.len());
    let mut names = Vec::with_capacity(events.len());
    let mut types = Vec::with_capacity(events.len());
    let mut instants = Vec::with_capacity(events.len());
    let mut data = Vec::with_capacity(events.len());
    for event in events {
        groups.push(event.group_id);
        routines.push(event.routine_id);
        names.push(event.routine_name.clone());
        types.push(event.event_type.as_str());
        instants.push(event.scheduled_at);
        data.push(event.data.clone());
    }
    crate::schema::query(
        "INSERT INTO cm.routine_events (group_id, routine_id, routine_name, type, scheduled_at, data)
         SELECT g, r, n, t, s, d
         FROM unnest($1::smallint[], $2::uuid[], $3::text[], $4::text[], $5::timestamptz[],
                     $6::jsonb[]) WITH ORDINALITY AS e(g, r, n, t, s, d, i)
         ORDER BY i",
    )
    .bind(&groups)
    .bind(&routines)
    .bind(&names)
    .bind(&types)
    .bind(&instants)
    .bind(&data)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// An event about a routine known by its id: its group and name are read from its row as the
/// event is written ([`record_news`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RoutineNews {
    pub(crate) routine_id: Uuid,
    pub(crate) event_type: EventType,
    pub(crate) scheduled_at: Option<DateTime<Utc>>,
    pub(crate) data: Value,
}

/// Writes `news` in the caller's transaction, in order, each with its routine's group and
/// name (`group`: the routines' group, when the caller works in one).
pub(crate) async fn record_news(
    conn: &mut PgConnection,
    group: Option<GroupId>,
    news: &[RoutineNews],
) -> Result<(), StoreError> {
    if news.is_empty() {
        return Ok(());
    }
    macro_rules! news_sql {
        ($group:literal) => {
            concat!(
                "INSERT INTO cm.routine_events
                     (group_id, routine_id, routine_name, type, scheduled_at, data)
                 SELECT r.group_id, r.id, r.name, e.t, e.s, e.d
                 FROM unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::jsonb[])
                      WITH ORDINALITY AS e(id, t, s, d, i)
                 JOIN cm.routines r ON r.id = e.id",
                $group,
                " ORDER BY e.i"
            )
        };
    }
    let ids: Vec<Uuid> = news.iter().map(|n| n.routine_id).collect();
    let types: Vec<&str> = news.iter().map(|n| n.event_type.as_str()).collect();
    let instants: Vec<Option<DateTime<Utc>>> = news.iter().map(|n| n.scheduled_at).collect();
    let data: Vec<Value> = news.iter().map(|n| n.data.clone()).collect();
    let query = crate::schema::query(match group {
        None => news_sql!(""),
        Some(_) => news_sql!(" AND r.group_id = $5"),
    })
    .bind(&ids)
    .bind(&types)
    .bind(&instants)
    .bind(&data);
    let query = match group {
        Some(group) => query.bind(group),
        None => query,
    };
    query.execute(&mut *conn).await?;
    Ok(())
}

/// The outcome events of occurrences whose outcome the caller's transaction has just written:
/// `$1` routines and `$2` instants, side by side (`$3` the group, in the grouped form). A
/// failed outcome (a failed dispatch, a mission's failed or lost run) is `routine.failed`; a
/// succeeded one (a message fired, a mission's run succeeded) is `routine.recovered` when the
/// routine's newest failed-or-recovered event is a failure. An occurrence whose outcome is not
/// known yet (a mission launched, its run still running) writes nothing.
macro_rules! outcome_events_sql {
    ($group:literal, $events_group:literal) => {
        concat!(
            "
WITH written AS (
    SELECT f.group_id, f.routine_id, f.scheduled_at, f.attempt, f.error, f.run_state,
           f.run_exit_code, f.run_reason, f.run_output, r.name, r.kind,
           CASE WHEN f.status = 'failed' OR f.run_state IN ('failed', 'lost') THEN 'failed'
                WHEN (r.kind = 'message' AND f.status = 'fired')
                     OR f.run_state = 'succeeded' THEN 'succeeded'
           END AS outcome
    FROM unnest($1::uuid[], $2::timestamptz[]) AS w(routine_id, scheduled_at)
    JOIN cm.routine_fires f ON f.routine_id = w.routine_id AND f.scheduled_at = w.scheduled_at",
            $group,
            "
    JOIN cm.routines r ON r.id = f.routine_id AND r.group_id = f.group_id",
            $group,
            "
)
INSERT INTO cm.routine_events (group_id, routine_id, routine_name, type, scheduled_at, data)
SELECT w.group_id, w.routine_id, w.name,
       CASE w.outcome WHEN 'failed' THEN 'routine.failed' ELSE 'routine.recovered' END,
       w.scheduled_at,
       CASE w.outcome
       WHEN 'failed' THEN jsonb_strip_nulls(jsonb_build_object(
           'scheduled_at', w.scheduled_at, 'attempt', w.attempt,
           'error', coalesce(w.run_reason, w.error), 'run_state', w.run_state,
           'exit_code', w.run_exit_code, 'output_tail', right(w.run_output, 2000)))
       ELSE jsonb_build_object('scheduled_at', w.scheduled_at, 'attempt', w.attempt) END
FROM written w
WHERE w.outcome = 'failed'
   OR (w.outcome = 'succeeded' AND (
        SELECT e.type FROM cm.routine_events e
        WHERE e.routine_id = w.routine_id AND e.group_id = w.group_id",
            $events_group,
            "
          AND e.type IN ('routine.failed', 'routine.recovered')
        ORDER BY e.seq DESC LIMIT 1) = 'routine.failed')
ORDER BY w.scheduled_at, w.routine_id"
        )
    };
}

/// Writes the outcome events of `occurrences` (see `outcome_events_sql!`) in the caller's
/// transaction, which has just written their outcomes.
pub(crate) async fn record_outcome_events(
    conn: &mut PgConnection,
    group: Option<GroupId>,
    occurrences: &[(Uuid, DateTime<Utc>)],
) -> Result<(), StoreError> {
    if occurrences.is_empty() {
        return Ok(());
    }
    let (routines, instants): (Vec<Uuid>, Vec<DateTime<Utc>>) = occurrences.iter().copied().unzip();
    let query = crate::schema::query(match group {
        None => outcome_events_sql!("", ""),
        Some(_) => outcome_events_sql!(" AND f.group_id = $3", " AND e.group_id = $3"),
    })
    .bind(&routines)
    .bind(&instants);
    let query = match group {
        Some(group) => query.bind(group),
        None => query,
    };
    query.execute(&mut *conn).await?;
    Ok(())
}

/// The deadline pass (see [`EventLog::raise_missed_deadlines`]): occurrences in the ledger
/// whose outcome is not succeeded a deadline after their planned instant, then routines whose
/// next run is a deadline behind with no fire for it; each raised once (the partial unique
/// index). Looks back ten minutes past the deadline, by the fires' key (a routine's fires in
/// that span are a range of its primary key), so a pass stays bounded however long a routine's
/// history: the pass runs every second, and an outage longer than that is the routine's next
/// run left behind, which the second branch raises.
macro_rules! missed_deadlines_sql {
    ($group:literal) => {
        concat!(
            "
WITH missed AS (
    SELECT r.group_id, r.id AS routine_id, r.name, f.scheduled_at,
           coalesce(f.planned_at, f.scheduled_at) AS planned_at, r.deadline_secs,
           coalesce(f.run_state, f.status) AS state
    FROM cm.routines r
    JOIN cm.routine_fires f ON f.routine_id = r.id AND f.group_id = r.group_id
    WHERE r.deadline_secs IS NOT NULL",
            $group,
            "
      AND f.scheduled_at >= now() - make_interval(secs => r.deadline_secs + 600)
      AND coalesce(f.planned_at, f.scheduled_at) <= now() - make_interval(secs => r.deadline_secs)
      AND NOT coalesce((r.kind = 'message' AND f.status = 'fired') OR f.run_state = 'succeeded',
                       false)
    UNION ALL
    SELECT r.group_id, r.id, r.name, r.next_run_at, r.next_run_at, r.deadline_secs,
           'not claimed'
    FROM cm.routines r
    WHERE r.deadline_secs IS NOT NULL AND r.next_run_at IS NOT NULL",
            $group,
            "
      AND r.next_run_at <= now() - make_interval(secs => r.deadline_secs)
      AND NOT EXISTS (SELECT 1 FROM cm.routine_fires f
                      WHERE f.routine_id = r.id AND f.group_id = r.group_id
                        AND coalesce(f.planned_at, f.scheduled_at) = r.next_run_at)
)
INSERT INTO cm.routine_events (group_id, routine_id, routine_name, type, scheduled_at, data)
SELECT m.group_id, m.routine_id, m.name, 'routine.deadline_missed', m.planned_at,
       jsonb_build_object('scheduled_at', m.scheduled_at, 'planned_at', m.planned_at,
                          'deadline', m.deadline_secs || 's', 'state', m.state)
FROM missed m
ORDER BY m.planned_at, m.routine_id
ON CONFLICT (group_id, routine_id, scheduled_at) WHERE type = 'routine.deadline_missed'
DO NOTHING
RETURNING "
        )
    };
}

#[async_trait]
impl EventLog for PgStore {
    async fn events(&self, filter: &EventFilter) -> Result<Vec<RoutineEvent>, StoreError> {
        const SQL: &str = concat!(
            "SELECT ",
            event_columns!(),
            " FROM cm.routine_events
             WHERE ($1::uuid IS NULL OR routine_id = $1) AND ($2::text IS NULL OR type = $2)
               AND ($3::bigint IS NULL OR seq < $3)
             ORDER BY seq DESC LIMIT $4"
        );
        Ok(on_store!(self, |e| crate::schema::query_as(SQL)
            .bind(filter.routine)
            .bind(filter.event_type.map(EventType::as_str))
            .bind(filter.before_seq)
            .bind(i64::from(filter.limit))
            .fetch_all(e))?)
    }

    async fn pending_events(
        &self,
        group: Option<GroupId>,
        limit: u32,
    ) -> Result<Vec<RoutineEvent>, StoreError> {
        let sql = match group {
            None => concat!(
                "SELECT ",
                event_columns!(),
                " FROM cm.routine_events WHERE delivered_at IS NULL ORDER BY seq LIMIT $1"
            ),
            Some(_) => concat!(
                "SELECT ",
                event_columns!(),
                " FROM cm.routine_events
                 WHERE delivered_at IS NULL AND group_id = $2 ORDER BY seq LIMIT $1"
            ),
        };
        Ok(on_store!(self, |e| {
            let query = crate::schema::query_as(sql).bind(i64::from(limit));
            let query = match group {
                Some(group) => query.bind(group),
                None => query,
            };
            query.fetch_all(e)
        })?)
    }

    async fn mark_delivered(&self, events: &[(GroupId, i64)]) -> Result<u64, StoreError> {
        if events.is_empty() {
            return Ok(0);
        }
        let (groups, seqs): (Vec<GroupId>, Vec<i64>) = events.iter().copied().unzip();
        Ok(on_store!(self, |e| crate::schema::query(
            "UPDATE cm.routine_events e
             SET delivered_at = now(), delivery_attempts = e.delivery_attempts + 1,
                 delivery_error = NULL, retry_at = NULL
             FROM unnest($1::smallint[], $2::bigint[]) AS d(group_id, seq)
             WHERE e.group_id = d.group_id AND e.seq = d.seq AND e.delivered_at IS NULL",
        )
        .bind(&groups)
        .bind(&seqs)
        .execute(e))?
        .rows_affected())
    }

    async fn mark_delivery_failed(
        &self,
        event: (GroupId, i64),
        error: &str,
        retry_at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let error: String = error.chars().take(500).collect();
        on_store!(self, |e| crate::schema::query(
            "UPDATE cm.routine_events
             SET delivery_attempts = delivery_attempts + 1, delivery_error = $3, retry_at = $4
             WHERE group_id = $1 AND seq = $2 AND delivered_at IS NULL",
        )
        .bind(event.0)
        .bind(event.1)
        .bind(&error)
        .bind(retry_at)
        .execute(e))?;
        Ok(())
    }

    async fn raise_missed_deadlines(
        &self,
        group: Option<GroupId>,
    ) -> Result<Vec<RoutineEvent>, StoreError> {
        let sql = match group {
            None => concat!(missed_deadlines_sql!(""), event_columns!()),
            Some(_) => concat!(
                missed_deadlines_sql!(" AND r.group_id = $1"),
                event_columns!()
            ),
        };
        Ok(on_store!(self, |e| {
            let query = crate::schema::query_as(sql);
            let query = match group {
                Some(group) => query.bind(group),
                None => query,
            };
            query.fetch_all(e)
        })?)
    }

    async fn deadline_groups(&self) -> Result<Vec<GroupId>, StoreError> {
        Ok(on_store!(self, |e| crate::schema::query_scalar(
            "SELECT DISTINCT group_id FROM cm.routines WHERE deadline_secs IS NOT NULL
             ORDER BY group_id",
        )
        .fetch_all(e))?)
    }

    async fn pending_groups<'a>(
        &self,
        among: Option<&'a [GroupId]>,
    ) -> Result<Vec<GroupId>, StoreError> {
        Ok(on_store!(self, |e| crate::schema::query_scalar(
            "SELECT DISTINCT group_id FROM cm.routine_events
             WHERE delivered_at IS NULL AND ($1::smallint[] IS NULL OR group_id = ANY($1))
             ORDER BY group_id",
        )
        .bind(among)
        .fetch_all(e))?)
    }

    async fn skips(&self, routine_id: Uuid, group: GroupId) -> Result<Skips, StoreError> {
        Ok(on_store!(self, |e| crate::schema::query_as(
            "SELECT m.misfired, m.last_misfired,
                    count(*) FILTER (WHERE f.claimant <> 'buffer-one') AS overlap,
                    max(f.scheduled_at) FILTER (WHERE f.claimant <> 'buffer-one') AS last_overlap,
                    count(*) FILTER (WHERE f.claimant = 'buffer-one') AS buffered,
                    max(f.scheduled_at) FILTER (WHERE f.claimant = 'buffer-one') AS last_buffered
             FROM (SELECT coalesce(sum((data->>'skipped')::bigint), 0)::bigint AS misfired,
                          max(occurred_at) AS last_misfired
                   FROM cm.routine_events
                   WHERE routine_id = $1 AND group_id = $2 AND type = 'routine.misfired') m
             LEFT JOIN cm.routine_fires f
                    ON f.routine_id = $1 AND f.group_id = $2 AND f.status = 'skipped'
             GROUP BY m.misfired, m.last_misfired",
        )
        .bind(routine_id)
        .bind(group)
        .fetch_one(e))?)
    }

    async fn prune_events(&self, retention: Duration, limit: u32) -> Result<u64, StoreError> {
        self.prune_events_of(None, retention, limit).await
    }

    async fn prune_events_in(
        &self,
        group: GroupId,
        retention: Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        self.prune_events_of(Some(group), retention, limit).await
    }
}

/// The events prune, `$3` the group in the grouped form (one shard on Citus).
macro_rules! prune_events_sql {
    ($group:literal, $outer:literal) => {
        concat!(
            "DELETE FROM cm.routine_events e
             USING (SELECT group_id, seq FROM cm.routine_events
                    WHERE occurred_at < now() - make_interval(secs => $1)
                      AND (delivered_at IS NOT NULL
                           OR occurred_at < now() - make_interval(secs => 2 * $1))",
            $group,
            "
                    LIMIT $2) old
             WHERE e.group_id = old.group_id AND e.seq = old.seq",
            $outer
        )
    };
}

impl PgStore {
    /// Deletes the events past the retention in `group` (every group: `None`).
    async fn prune_events_of(
        &self,
        group: Option<GroupId>,
        retention: Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let sql = match group {
            None => prune_events_sql!("", ""),
            Some(_) => prune_events_sql!(" AND group_id = $3", " AND e.group_id = $3"),
        };
        Ok(on_store!(self, |e| {
            let query = crate::schema::query(sql)
                .bind(retention.as_secs_f64())
                .bind(i64::from(limit));
            let query = match group {
                Some(group) => query.bind(group),
                None => query,
            };
            query.execute(e)
        })?
        .rows_affected())
    }
}
