//! Routine groups: every routine belongs to one of a fixed number of groups, a hash bucket of
//! its id, and every per-routine row carries its routine's group. A claim, a reaper pass or a
//! prune that names one group reads and writes one group's rows only: on Citus, where the tables
//! are distributed by `group_id` and co-located, that is one shard and a one-phase commit on one
//! worker; on plain PostgreSQL it is the same schema and the same statements.
//!
//! The count is chosen when the schema is migrated (`cm.group_count`, 64 unless set) and kept
//! in `cm_settings`; it never changes afterwards. [`group_of`] is the one function that maps a
//! routine to its group, the same as the SQL function `cm_group_of` the migration defines.

use chrono::{DateTime, Utc};
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
    let count: i16 = sqlx::query_scalar("SELECT group_count FROM cm_settings")
        .fetch_one(conn)
        .await?;
    Ok(u16::try_from(count).unwrap_or(1).max(1))
}

/// The groups with work due by `now`: a due routine or a due request. One read across the
/// groups; on Citus it runs on every shard in parallel and returns a row per group.
const DUE_GROUPS_SQL: &str = "
SELECT group_id FROM routines WHERE next_run_at <= $1 GROUP BY group_id
UNION
SELECT group_id FROM routine_requests WHERE scheduled_at <= $1 GROUP BY group_id
ORDER BY 1";

/// The groups with a claim whose lease ran out by `now` (for the reaper).
const EXPIRED_GROUPS_SQL: &str = "
SELECT group_id FROM routine_fires
WHERE status = 'claimed' AND lease_expires_at <= $1
GROUP BY group_id
ORDER BY 1";

/// Takes and renews group leases for `$1` until `$2`: every group it holds is renewed, and of
/// the groups nobody holds (or whose holder's lease ran out by `$3`), those in `$4` are taken.
/// Returns the groups `$1` holds afterwards.
const LEASE_GROUPS_SQL: &str = "
WITH renewed AS (
    UPDATE group_leases SET expires_at = $2 WHERE holder = $1 RETURNING group_id
),
taken AS (
    INSERT INTO group_leases (group_id, holder, expires_at)
    SELECT g, $1, $2 FROM UNNEST($4::smallint[]) AS g
    ON CONFLICT (group_id) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
    WHERE group_leases.expires_at <= $3
    RETURNING group_id
)
SELECT group_id FROM renewed UNION SELECT group_id FROM taken ORDER BY 1";

/// Who holds which group, live at `$1`.
const LIVE_LEASES_SQL: &str =
    "SELECT group_id, holder FROM group_leases WHERE expires_at > $1 ORDER BY group_id";

impl PgStore {
    /// The schema's group count (fixed when it was migrated; read once).
    pub async fn group_count(&self) -> Result<u16, StoreError> {
        if let Some(count) = self.group_count.get() {
            return Ok(*count);
        }
        let mut conn = self.pool.acquire().await?;
        let count = stored_group_count(&mut conn).await?;
        Ok(*self.group_count.get_or_init(|| count))
    }

    /// The group of the routine `id` (see [`group_of`]).
    pub async fn group_of_routine(&self, id: Uuid) -> Result<GroupId, StoreError> {
        Ok(group_of(id, self.group_count().await?))
    }

    /// The groups with a routine or a request due by `now`, in group order.
    pub async fn due_groups(&self, now: DateTime<Utc>) -> Result<Vec<GroupId>, StoreError> {
        Ok(sqlx::query_scalar(DUE_GROUPS_SQL)
            .bind(now)
            .fetch_all(&self.pool)
            .await?)
    }

    /// The groups with a claim whose lease ran out by `now`, in group order.
    pub async fn expired_groups(&self, now: DateTime<Utc>) -> Result<Vec<GroupId>, StoreError> {
        Ok(sqlx::query_scalar(EXPIRED_GROUPS_SQL)
            .bind(now)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Renews the group leases `holder` has and takes those of `wanted` that nobody holds live,
    /// each until `until`; returns every group `holder` holds afterwards.
    pub async fn lease_groups(
        &self,
        holder: &str,
        wanted: &[GroupId],
        until: DateTime<Utc>,
    ) -> Result<Vec<GroupId>, StoreError> {
        let now = self.ping().await?;
        Ok(sqlx::query_scalar(LEASE_GROUPS_SQL)
            .bind(holder)
            .bind(until)
            .bind(now)
            .bind(wanted)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Gives up `holder`'s leases on `groups` (a scheduler holding more than its share, or
    /// stopping), so another takes them at once instead of after the lease.
    pub async fn release_groups(&self, holder: &str, groups: &[GroupId]) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM group_leases WHERE holder = $1 AND group_id = ANY($2)")
            .bind(holder)
            .bind(groups)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Every live group lease at `now`: `(group, holder)`, in group order.
    pub async fn live_group_leases(
        &self,
        now: DateTime<Utc>,
    ) -> Result<Vec<(GroupId, String)>, StoreError> {
        Ok(sqlx::query_as(LIVE_LEASES_SQL)
            .bind(now)
            .fetch_all(&self.pool)
            .await?)
    }
}
