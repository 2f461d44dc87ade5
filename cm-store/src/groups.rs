//! Routine groups: every routine belongs to one of a fixed number of groups, a hash bucket of
//! its id, and every per-routine row carries its routine's group. A claim, a reaper pass or a
//! prune that names one group reads and writes one group's rows only: on Citus, where the tables
//! are distributed by `group_id` and co-located, that is one shard and a one-phase commit on one
//! worker; on plain PostgreSQL it is the same schema and the same statements.
//!
//! The count is chosen when the schema is migrated (`cm.group_count`, 64 unless set) and kept
//! in `cm_settings`; it never changes afterwards. [`group_of`] is the one function that maps a
//! routine to its group, the same as the SQL function `cm_group_of` the migration defines.

use async_trait::async_trait;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::{PgStore, StoreError};

/// A group: `0 .. group_count`.
pub type GroupId = i16;

/// The group of the routine `id` among `group_count` groups: the id's last four bytes (random in
/// version 4 and version 7 UUIDs alike) as an unsigned big-endian integer, modulo the count.
/// `cm_group_of(id, group_count)` in SQL computes the same.
///
/// # Panics
///
/// When `group_count` is zero (the schema refuses it).
pub fn group_of(id: Uuid, group_count: u16) -> GroupId {
    let bytes = id.as_bytes();
    let tail = u32::from_be_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
    GroupId::try_from(tail % u32::from(group_count)).unwrap_or(GroupId::MAX)
}

/// The schema's group count, as the migration recorded it.
pub(crate) async fn stored_group_count(conn: &mut PgConnection) -> Result<u16, StoreError> {
    let count: i16 = crate::schema::query_scalar("SELECT group_count FROM cm.cm_settings")
        .fetch_one(conn)
        .await?;
    Ok(u16::try_from(count).unwrap_or(1).max(1))
}

/// The groups with work due now: a due routine or a due request. One read across the groups;
/// on Citus it runs on every shard in parallel and returns a row per group, and fails when any
/// worker is down, so the engine does not use it there (it claims in each group it may claim
/// in, one shard per statement).
const DUE_GROUPS_SQL: &str = "
SELECT group_id FROM cm.routines WHERE next_run_at <= now() GROUP BY group_id
UNION
SELECT group_id FROM cm.routine_requests WHERE scheduled_at <= now() GROUP BY group_id
ORDER BY 1";

/// Whether anything is due in the group `$1`: a routine or a request. Two probes of the group's
/// due indexes; on Citus one router statement on the group's shard.
const GROUP_DUE_SQL: &str = "
SELECT EXISTS (SELECT 1 FROM cm.routines WHERE group_id = $1 AND next_run_at <= now())
    OR EXISTS (SELECT 1 FROM cm.routine_requests WHERE group_id = $1 AND scheduled_at <= now())";

/// [`GROUP_DUE_SQL`] bound for `group`, for [`crate::explain`].
pub(crate) fn group_due_query(
    group: GroupId,
) -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments> {
    crate::schema::query(GROUP_DUE_SQL).bind(group)
}

/// The groups with a claim whose lease ran out (for the reaper).
const EXPIRED_GROUPS_SQL: &str = "
SELECT group_id FROM cm.routine_fires
WHERE status = 'claimed' AND lease_expires_at <= now()
GROUP BY group_id
ORDER BY 1";

/// What a scheduler asks about groups: which have work, and who leases which. The claims
/// themselves go through [`crate::FireLedger`] with [`crate::ClaimDueParams::group`] set.
#[async_trait]
pub trait GroupDirectory: Send + Sync {
    /// The schema's group count.
    async fn group_count(&self) -> Result<u16, StoreError>;

    /// The groups with a routine or a request due now, in group order. One statement across
    /// every group: on Citus it reads every shard, and fails while any worker is down.
    async fn due_groups(&self) -> Result<Vec<GroupId>, StoreError>;

    /// Whether anything is due in `group` now: a routine or a request. One statement that
    /// reads the group's shard alone (on Citus), a fraction of what a claim that finds nothing
    /// costs (its transaction and its planning). It says nothing of whether a claim can take
    /// what is due: a full concurrency key, a busy run or no mission room may still leave a
    /// claim with nothing.
    async fn group_due(&self, group: GroupId) -> Result<bool, StoreError>;

    /// The groups with a claim whose lease ran out, in group order (across every group, as
    /// [`GroupDirectory::due_groups`]).
    async fn expired_groups(&self) -> Result<Vec<GroupId>, StoreError>;

    /// Renews `holder`'s group leases and takes those of `wanted` nobody holds live, for
    /// `lease`; returns every group `holder` holds afterwards, in group order.
    async fn lease_groups(
        &self,
        holder: &str,
        wanted: &[GroupId],
        lease: std::time::Duration,
    ) -> Result<Vec<GroupId>, StoreError>;

    /// Gives up `holder`'s leases on `groups`.
    async fn release_groups(&self, holder: &str, groups: &[GroupId]) -> Result<(), StoreError>;

    /// Every live group lease, in group order, with how long it has left by the database's
    /// clock.
    async fn live_group_leases(&self) -> Result<Vec<LiveLease>, StoreError>;

    /// Where `group`'s rows live: on Citus the `host:port` of the worker holding its shard
    /// (from the coordinator's metadata, which answers while that worker is down); `None` on
    /// plain PostgreSQL.
    async fn group_node(&self, group: GroupId) -> Result<Option<String>, StoreError>;

    /// The schedulers whose presence is live (renewed with their leases), holding groups or
    /// not.
    async fn live_holders(&self) -> Result<Vec<String>, StoreError>;

    /// Whether the schema is distributed (on Citus), where every claim must stay in one group.
    async fn distributed(&self) -> Result<bool, StoreError>;
}

/// Takes and renews group leases for `$1` until `$2`: every group it holds is renewed, and of
/// the groups nobody holds (or whose holder's lease ran out by `$3`), those in `$4` are taken.
/// Returns the groups `$1` holds afterwards. A group in `$4` that `$1` itself held until its
/// lease ran out (a scheduler started again under its instance id) is left to the take: the
/// renewal and the take may not both write one row in one statement.
const LEASE_GROUPS_SQL: &str = "
WITH present AS (
    INSERT INTO cm.group_holders (holder, expires_at) VALUES ($1, $2)
    ON CONFLICT (holder) DO UPDATE SET expires_at = excluded.expires_at
    RETURNING 1
),
renewed AS (
    UPDATE cm.group_leases SET expires_at = $2 WHERE holder = $1 AND group_id <> ALL($4)
    RETURNING group_id
),
taken AS (
    INSERT INTO cm.group_leases (group_id, holder, expires_at)
    SELECT g, $1, $2 FROM UNNEST($4::smallint[]) AS g
    ON CONFLICT (group_id) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
    WHERE group_leases.expires_at <= $3 OR group_leases.holder = $1
    RETURNING group_id
)
SELECT group_id FROM renewed UNION SELECT group_id FROM taken ORDER BY 1";

/// Who holds which group, live now, and for how long yet (in seconds).
const LIVE_LEASES_SQL: &str = "
SELECT group_id, holder, extract(epoch FROM expires_at - now())::float8
FROM cm.group_leases WHERE expires_at > now() ORDER BY group_id";

/// The node holding the shard of group `$1` (the shards of every per-routine table are
/// co-located with `routines`'), from the coordinator's metadata.
const GROUP_NODE_SQL: &str = "
SELECT n.nodename || ':' || n.nodeport
FROM pg_dist_placement p JOIN pg_dist_node n ON n.groupid = p.groupid
WHERE p.shardid = get_shard_id_for_distribution_column('cm.routines', $1::smallint)
ORDER BY n.nodeid LIMIT 1";

/// A live group lease ([`GroupDirectory::live_group_leases`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LiveLease {
    /// The group.
    pub group: GroupId,
    /// Who holds it (a scheduler's instance id).
    pub holder: String,
    /// How long it has left when it was read, by the database's clock.
    pub remaining: std::time::Duration,
}

/// Where `migrate --citus` puts a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// Distributed by this column.
    Distributed(&'static str),
    /// A reference table: a copy on every node, for what every shard's statements read.
    Reference,
    /// A plain table on the coordinator alone: the group leases and the schedulers' presence,
    /// which no statement on a worker reads, and which must stay writable while a worker is down
    /// (a reference table's writes go to every node, and fail while any is down).
    Coordinator,
}

/// A table `migrate --citus` distributes.
struct CitusTable {
    table: &'static str,
    /// Where it lives.
    placement: Placement,
    /// The table it is co-located with.
    colocate_with: Option<&'static str>,
    /// Drops the trigger that fills a missing group on plain PostgreSQL: Citus routes a row by
    /// its group before any trigger could run, and refuses triggers on distributed tables.
    drop_trigger: Option<&'static str>,
}

/// The tables `migrate --citus` distributes, in order (a table after those its foreign keys
/// name).
const CITUS_TABLES: &[CitusTable] = &[
    // Holiday calendars: small, rarely written, read by the claims of every shard.
    CitusTable {
        table: "cm.calendars",
        placement: Placement::Reference,
        colocate_with: None,
        drop_trigger: None,
    },
    CitusTable {
        table: "cm.cm_settings",
        placement: Placement::Reference,
        colocate_with: None,
        drop_trigger: None,
    },
    CitusTable {
        table: "cm.group_leases",
        placement: Placement::Coordinator,
        colocate_with: None,
        drop_trigger: None,
    },
    CitusTable {
        table: "cm.group_holders",
        placement: Placement::Coordinator,
        colocate_with: None,
        drop_trigger: None,
    },
    // Concurrency limits: read under the coordinator's key locks by every claim.
    CitusTable {
        table: "cm.concurrency_limits",
        placement: Placement::Coordinator,
        colocate_with: None,
        drop_trigger: None,
    },
    CitusTable {
        table: "cm.routine_names",
        placement: Placement::Distributed("name"),
        colocate_with: None,
        drop_trigger: None,
    },
    CitusTable {
        table: "cm.routines",
        placement: Placement::Distributed("group_id"),
        colocate_with: None,
        drop_trigger: Some("DROP TRIGGER IF EXISTS routines_fill_group_id ON cm.routines"),
    },
    CitusTable {
        table: "cm.routine_fires",
        placement: Placement::Distributed("group_id"),
        colocate_with: Some("cm.routines"),
        drop_trigger: Some(
            "DROP TRIGGER IF EXISTS routine_fires_fill_group_id ON cm.routine_fires",
        ),
    },
    CitusTable {
        table: "cm.routine_requests",
        placement: Placement::Distributed("group_id"),
        colocate_with: Some("cm.routines"),
        drop_trigger: Some(
            "DROP TRIGGER IF EXISTS routine_requests_fill_group_id ON cm.routine_requests",
        ),
    },
    CitusTable {
        table: "cm.routine_events",
        placement: Placement::Distributed("group_id"),
        colocate_with: Some("cm.routines"),
        drop_trigger: None,
    },
    CitusTable {
        table: "cm.outbox_messages",
        placement: Placement::Distributed("group_id"),
        colocate_with: Some("cm.routines"),
        drop_trigger: Some(
            "DROP TRIGGER IF EXISTS outbox_messages_fill_group_id ON cm.outbox_messages",
        ),
    },
];

/// The indexes of the per-group walks (the due routines, the expired leases, the pending
/// messages of one group), which only Citus needs: plain PostgreSQL claims across the groups
/// (migration `20261202000301`).
const CITUS_INDEXES: [&str; 3] = [
    "CREATE INDEX IF NOT EXISTS routines_group_due_idx ON cm.routines (group_id, next_run_at, id) \
     WHERE next_run_at IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS routine_fires_group_lease_idx \
     ON cm.routine_fires (group_id, lease_expires_at) WHERE status = 'claimed'",
    "CREATE INDEX IF NOT EXISTS outbox_messages_group_pending_idx ON cm.outbox_messages (group_id, seq) \
     WHERE acked_at IS NULL",
];

impl PgStore {
    /// Distributes the migrated schema on Citus: the per-routine tables by `group_id`,
    /// co-located with `routines` (so a claim naming a group is one shard on one worker),
    /// `routine_names` by name, and the settings as a reference table. The group leases and the
    /// schedulers' presence stay plain tables on the coordinator, so a worker that is down never
    /// blocks a lease (a schema an earlier cm distributed has them brought back there). Tables
    /// already distributed are left as they are, so running it again changes nothing. Returns
    /// how many tables it distributed.
    pub async fn distribute_on_citus(&self) -> Result<usize, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let citus: bool = crate::schema::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')",
        )
        .fetch_one(&mut *conn)
        .await?;
        if !citus {
            return Err(StoreError::InvalidRoutine(
                "the citus extension is not installed in this database (CREATE EXTENSION citus)"
                    .into(),
            ));
        }
        // Every walk names its group on Citus: the per-group indexes, before the tables are
        // distributed (each shard gets them) or, on a schema distributed already, propagated.
        for index in CITUS_INDEXES {
            crate::schema::query(index).execute(&mut *conn).await?;
        }
        let mut distributed = 0;
        for spec in CITUS_TABLES {
            let done: bool = crate::schema::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = $1::regclass)",
            )
            .bind(crate::schema::sql(spec.table))
            .fetch_one(&mut *conn)
            .await?;
            if spec.placement == Placement::Coordinator {
                // A schema distributed by an earlier cm made these reference tables: brought
                // back to the coordinator, rows and all.
                if done {
                    crate::schema::query("SELECT undistribute_table($1)")
                        .bind(crate::schema::sql(spec.table))
                        .execute(&mut *conn)
                        .await?;
                }
                continue;
            }
            if done {
                continue;
            }
            if let Some(drop) = spec.drop_trigger {
                crate::schema::query(drop).execute(&mut *conn).await?;
            }
            let query = match (spec.placement, spec.colocate_with) {
                (Placement::Coordinator, _) => continue,
                (Placement::Reference, _) => {
                    crate::schema::query("SELECT create_reference_table($1)")
                        .bind(crate::schema::sql(spec.table))
                }
                (Placement::Distributed(column), None) => {
                    crate::schema::query("SELECT create_distributed_table($1, $2)")
                        .bind(crate::schema::sql(spec.table))
                        .bind(column)
                }
                (Placement::Distributed(column), Some(with)) => crate::schema::query(
                    "SELECT create_distributed_table($1, $2, colocate_with => $3)",
                )
                .bind(crate::schema::sql(spec.table))
                .bind(column)
                .bind(crate::schema::sql(with)),
            };
            query.execute(&mut *conn).await?;
            distributed += 1;
        }
        Ok(distributed)
    }

    /// The schema's group count (fixed when it was migrated; read once).
    pub async fn group_count(&self) -> Result<u16, StoreError> {
        if let Some(count) = self.group_count.get() {
            return Ok(*count);
        }
        let count = on_store_conn!(self, |conn| stored_group_count(conn))?;
        Ok(*self.group_count.get_or_init(|| count))
    }

    /// The group of the routine `id` (see [`group_of`]).
    pub async fn group_of_routine(&self, id: Uuid) -> Result<GroupId, StoreError> {
        Ok(group_of(id, self.group_count().await?))
    }
}

#[async_trait]
impl GroupDirectory for PgStore {
    async fn group_count(&self) -> Result<u16, StoreError> {
        PgStore::group_count(self).await
    }

    async fn due_groups(&self) -> Result<Vec<GroupId>, StoreError> {
        Ok(on_store!(self, |e| crate::schema::query_scalar(
            DUE_GROUPS_SQL
        )
        .fetch_all(e))?)
    }

    async fn group_due(&self, group: GroupId) -> Result<bool, StoreError> {
        Ok(on_store!(self, |e| crate::schema::query_scalar(
            GROUP_DUE_SQL
        )
        .bind(group)
        .fetch_one(e))?)
    }

    async fn expired_groups(&self) -> Result<Vec<GroupId>, StoreError> {
        Ok(on_store!(self, |e| crate::schema::query_scalar(
            EXPIRED_GROUPS_SQL
        )
        .fetch_all(e))?)
    }

    async fn lease_groups(
        &self,
        holder: &str,
        wanted: &[GroupId],
        lease: std::time::Duration,
    ) -> Result<Vec<GroupId>, StoreError> {
        let now = self.ping().await?;
        let until = now + chrono::TimeDelta::from_std(lease).unwrap_or(chrono::TimeDelta::MAX);
        Ok(on_store!(self, |e| crate::schema::query_scalar(
            LEASE_GROUPS_SQL
        )
        .bind(holder)
        .bind(until)
        .bind(now)
        .bind(wanted)
        .fetch_all(e))?)
    }

    async fn release_groups(&self, holder: &str, groups: &[GroupId]) -> Result<(), StoreError> {
        on_store!(self, |e| crate::schema::query(
            "DELETE FROM cm.group_leases WHERE holder = $1 AND group_id = ANY($2)"
        )
        .bind(holder)
        .bind(groups)
        .execute(e))?;
        Ok(())
    }

    async fn distributed(&self) -> Result<bool, StoreError> {
        self.is_citus().await
    }

    async fn live_holders(&self) -> Result<Vec<String>, StoreError> {
        let now = self.ping().await?;
        Ok(on_store!(self, |e| crate::schema::query_scalar(
            "SELECT holder FROM cm.group_holders WHERE expires_at > $1 ORDER BY 1"
        )
        .bind(now)
        .fetch_all(e))?)
    }

    async fn live_group_leases(&self) -> Result<Vec<LiveLease>, StoreError> {
        let rows: Vec<(GroupId, String, f64)> =
            on_store!(self, |e| crate::schema::query_as(LIVE_LEASES_SQL)
                .fetch_all(e))?;
        Ok(rows
            .into_iter()
            .map(|(group, holder, seconds)| LiveLease {
                group,
                holder,
                remaining: std::time::Duration::try_from_secs_f64(seconds).unwrap_or_default(),
            })
            .collect())
    }

    async fn group_node(&self, group: GroupId) -> Result<Option<String>, StoreError> {
        if !self.is_citus().await? {
            return Ok(None);
        }
        Ok(on_store!(self, |e| crate::schema::query_scalar(
            GROUP_NODE_SQL
        )
        .bind(group)
        .fetch_optional(e))?)
    }
}
