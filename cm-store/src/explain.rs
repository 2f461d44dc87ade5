//! How PostgreSQL plans and runs the store's hot statements, for the tests and benchmarks that
//! check each one reads about as many rows as it returns, whatever the size of its table.
//!
//! A caller names a statement by what it does ([`HotStatement`]), with the parameters the store
//! would bind; the store explains its own statement with them. The SQL text stays in this crate:
//! a caller reads a plan, never a statement.
//!
//! ```no_run
//! # async fn run(store: cm_store::PgStore) -> Result<(), cm_store::StoreError> {
//! use cm_store::explain::HotStatement;
//!
//! let plan = store
//!     .explain_analyze(&HotStatement::Due {
//!         max_routines: 400,
//!         requests: 80,
//!         mission_room: None,
//!         after: None,
//!         group: None,
//!     })
//!     .await?;
//! println!("{} ms", plan[0]["Execution Time"]);
//! # Ok(()) }
//! ```

use std::time::Duration;

use serde_json::Value;
use sqlx::Execute as _;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{Postgres, Row as _};

use crate::groups::GroupId;
use crate::ledger::{DueCursor, FireFilter, ReapParams};
use crate::{PgStore, StoreError};

/// A statement of the store with its parameters, named by what it does.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum HotStatement {
    /// The claim's first statement ([`crate::FireLedger::claim_due`]): the database's clock, at
    /// most `requests` due requests (at most `mission_room` of them of missions; `None`, no
    /// bound) and at most `max_routines` due routines, locked; the walk resumed `after` a
    /// cursor, within `group` or across every group.
    Due {
        /// The most due routines to lock.
        max_routines: u32,
        /// The most due requests to take.
        requests: usize,
        /// The most mission occurrences to take; `None` for no bound.
        mission_room: Option<usize>,
        /// Resume the walk after this routine; `None` for the whole walk.
        after: Option<DueCursor>,
        /// The group the walk is kept in; `None` for every group.
        group: Option<GroupId>,
    },
    /// [`HotStatement::Due`] taking turns between the concurrency `keys` (the claim's
    /// statement when some routine has a key): past a full walk, each key's oldest due
    /// routines beyond it, up to its share.
    DueInTurns {
        /// The most due routines the walk locks.
        max_routines: u32,
        /// The most due requests to take.
        requests: usize,
        /// The most mission occurrences to take; `None` for no bound.
        mission_room: Option<usize>,
        /// Resume the walk after this routine; `None` for the whole walk.
        after: Option<DueCursor>,
        /// The group the walk is kept in; `None` for every group.
        group: Option<GroupId>,
        /// The concurrency keys that take turns (at least one).
        keys: Vec<String>,
    },
    /// The requests a claim takes into the room its scheduled work left: at most `limit`, at
    /// most `missions` of them of missions, within `group` or across every group.
    TakeRequests {
        /// The most requests to take.
        limit: usize,
        /// The most of them of mission routines; `None` for no bound.
        missions: Option<usize>,
        /// The group; `None` for every group.
        group: Option<GroupId>,
    },
    /// Whether anything is due in a group ([`crate::GroupDirectory::group_due`]), asked
    /// before a claim there when the last claim took nothing.
    GroupDue(GroupId),
    /// The reaper's statement ([`crate::FireLedger::reap_expired`]).
    Reap(ReapParams),
    /// A page of [`crate::FireLedger::list_fires`].
    ListFires(FireFilter),
    /// The automatic pause ([`crate::FailingRoutines::pause_failing_routines`]).
    PauseFailing {
        /// How many newest fires must all have failed.
        after_failures: u32,
        /// How recent a failure must be for its routine to be examined.
        window: Duration,
        /// The group; `None` for every group.
        group: Option<GroupId>,
    },
    /// Retention's deletion of settled fires ([`crate::FireLedger::prune_settled`]).
    PruneSettled {
        /// How long a settled fire is kept.
        retention: Duration,
        /// The most fires to delete.
        limit: u32,
        /// The group; `None` for every group.
        group: Option<GroupId>,
    },
    /// The watch's read of runs still running ([`crate::MissionRuns::unfinished_runs`]).
    UnfinishedRuns {
        /// The most runs to read.
        limit: u32,
        /// The group; `None` for every group.
        group: Option<GroupId>,
    },
}

impl HotStatement {
    /// The store's statement, bound as the store binds it.
    fn query(&self) -> Query<'_, Postgres, PgArguments> {
        match self {
            HotStatement::Due {
                max_routines,
                requests,
                mission_room,
                after,
                group,
            } => crate::ledger::due_query(
                *max_routines,
                *requests,
                *mission_room,
                *after,
                *group,
                Vec::new(),
                Vec::new(),
            ),
            HotStatement::DueInTurns {
                max_routines,
                requests,
                mission_room,
                after,
                group,
                keys,
            } => crate::ledger::due_query(
                *max_routines,
                *requests,
                *mission_room,
                *after,
                *group,
                Vec::new(),
                keys.clone(),
            ),
            HotStatement::TakeRequests {
                limit,
                missions,
                group,
            } => crate::ledger::take_requests_query(*limit, *missions, *group, Vec::new()),
            HotStatement::GroupDue(group) => crate::groups::group_due_query(*group),
            HotStatement::Reap(params) => {
                crate::ledger::reap_query(params, cm_domain::ClaimToken::new_v4())
            }
            HotStatement::ListFires(filter) => crate::ledger::list_query(filter),
            HotStatement::PauseFailing {
                after_failures,
                window,
                group,
            } => crate::autopause::pause_failing_query(*group, *after_failures, *window),
            HotStatement::PruneSettled {
                retention,
                limit,
                group,
            } => crate::ledger::prune_query(*group, *retention, *limit),
            HotStatement::UnfinishedRuns { limit, group } => {
                crate::runs::unfinished_runs_query(*group, *limit)
            }
        }
    }
}

/// `query`'s statement behind `EXPLAIN (options)`, with its arguments.
fn explained(
    options: &str,
    mut query: Query<'_, Postgres, PgArguments>,
) -> Result<(String, PgArguments), StoreError> {
    let arguments = query
        .take_arguments()
        .map_err(sqlx::Error::Encode)?
        .unwrap_or_default();
    let sql = query.sql();
    let explain = match options {
        "" => "EXPLAIN".to_owned(),
        options => format!("EXPLAIN ({options})"),
    };
    Ok((format!("{explain} {}", sql.as_str()), arguments))
}

impl PgStore {
    /// How PostgreSQL runs `statement`: `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`, what each
    /// node of the plan read and produced. The statement runs in a transaction that is rolled
    /// back, so one that locks or writes (the claim's, the reaper's) leaves nothing behind.
    pub async fn explain_analyze(&self, statement: &HotStatement) -> Result<Value, StoreError> {
        let (sql, arguments) = explained("ANALYZE, BUFFERS, FORMAT JSON", statement.query())?;
        let mut tx = self.begin().await?;
        let plan: Value = sqlx::query_scalar_with(sqlx::AssertSqlSafe(sql), arguments)
            .fetch_one(&mut *tx)
            .await?;
        tx.rollback().await?;
        Ok(plan)
    }

    /// The plan PostgreSQL chooses for `statement`, as `EXPLAIN` prints it (one line per line),
    /// without running it.
    pub async fn explain(&self, statement: &HotStatement) -> Result<String, StoreError> {
        let (sql, arguments) = explained("", statement.query())?;
        plan_text(self, sql, arguments).await
    }

    /// The plans of the statements a claim kept in `group` runs on Citus in place of the
    /// one-statement claim (the fires' upsert, the outbox rows, the routines read back, the
    /// clocks moved), each as `EXPLAIN` prints it and named, for one occurrence of a made-up
    /// routine: on Citus each must be one task, a router statement on the group's shard.
    pub async fn explain_claim_on_one_shard(
        &self,
        group: GroupId,
    ) -> Result<Vec<(&'static str, String)>, StoreError> {
        let mut plans = Vec::new();
        for (name, query) in crate::ledger::shard_claim_queries(group) {
            let (sql, arguments) = explained("", query)?;
            plans.push((name, plan_text(self, sql, arguments).await?));
        }
        Ok(plans)
    }
}

/// Runs an `EXPLAIN` and joins its lines.
async fn plan_text(
    store: &PgStore,
    sql: String,
    arguments: PgArguments,
) -> Result<String, StoreError> {
    let rows = on_store!(store, |e| sqlx::query_with(
        sqlx::AssertSqlSafe(sql),
        arguments
    )
    .fetch_all(e))?;
    let lines: Vec<String> = rows
        .iter()
        .map(|row| row.try_get::<String, _>(0))
        .collect::<Result<_, _>>()?;
    Ok(lines.join("\n"))
}
