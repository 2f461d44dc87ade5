//! Running behind a connection pooler (PgBouncer): what cm needs from one, checked when a
//! scheduler starts.
//!
//! A transaction pooler hands each transaction to whichever of its server connections is free.
//! What a session keeps from one transaction to the next (its settings, its prepared
//! statements, session-level advisory locks, `LISTEN`) is then on a server connection the next
//! transaction may not get. cm keeps none of it across transactions when
//! [`StoreOptions::pooled`](crate::StoreOptions::pooled): its settings go with every
//! transaction (`SET LOCAL`), its locks are transaction-scoped (the migrations' too, see
//! [`PgStore::migrate`]), and it listens for nothing. Two things a pooler may still get wrong
//! are checked by [`PgStore::check_pooler`] at start, so the scheduler refuses to start in one
//! line rather than failing every tick:
//!
//! - prepared statements: sqlx prepares every statement under a name (`sqlx_s_1`, …) and runs
//!   it again by that name. PgBouncer 1.21 and later keep such statements in transaction mode
//!   (`max_prepared_statements`); 1.18, the one Debian 12 carries, does not, and the second
//!   client to prepare `sqlx_s_1` on a server connection fails with `prepared statement
//!   "sqlx_s_1" already exists`.
//! - settings sent at connect on a store that is not pooled, dropped by a pooler told to ignore
//!   them (`ignore_startup_parameters = options`): the timeouts that bound a claim would be
//!   silently missing.

use sqlx::{Connection as _, PgConnection, Row as _};

use crate::{PLAN_CACHE_MODE, PgStore, StoreError};

/// SQLSTATEs of a prepared statement that is not on the server connection the statement ran
/// on: `duplicate_prepared_statement` (another client prepared one of that name there) and
/// `invalid_sql_statement_name` (this client prepared it on another).
fn lost_prepared_statement(code: &str) -> bool {
    matches!(code, "42P05" | "26000")
}

impl PgStore {
    /// Checks that this store's connections keep what cm needs from them: its settings on
    /// every transaction ([`StoreError::PoolerDropsSettings`] otherwise) and its prepared
    /// statements from one transaction to the next
    /// ([`StoreError::PoolerLosesPreparedStatements`] otherwise). Opens two connections of its
    /// own and closes them; on a direct connection or a pooler that does both, it costs a few
    /// round trips.
    pub async fn check_pooler(&self) -> Result<(), StoreError> {
        let options = self.pool().connect_options();
        let mut first = PgConnection::connect_with(&options).await?;
        let mut second = PgConnection::connect_with(&options).await?;
        let checked = self.check_on(&mut first, &mut second).await;
        // Closing is a courtesy: the check's answer stands either way.
        let _ = first.close().await;
        let _ = second.close().await;
        checked
    }

    async fn check_on(
        &self,
        first: &mut PgConnection,
        second: &mut PgConnection,
    ) -> Result<(), StoreError> {
        // The settings, read in a transaction begun as the store begins its own, with a simple
        // query: no prepared statement, so a pooler that loses those cannot hide this answer.
        let mut tx = self.begin_on(first).await?;
        let row = crate::schema::raw_sql("SELECT current_setting('plan_cache_mode')")
            .fetch_one(&mut *tx)
            .await?;
        let plan_cache_mode: String = row.try_get(0)?;
        tx.commit().await?;
        if plan_cache_mode != PLAN_CACHE_MODE.1 {
            return Err(StoreError::PoolerDropsSettings(format!(
                "{} is {plan_cache_mode}",
                PLAN_CACHE_MODE.0
            )));
        }
        // Each fresh connection names its first prepared statement alike (`sqlx_s_1`), here
        // for two different statements. The second's, prepared on a server connection that
        // already has the first's, collides with it ("already exists"); one run by name on a
        // server connection that never had it is missing ("does not exist"), or, where the
        // other's is, runs the other's statement: each answer is checked. Several rounds, so a
        // pooler that happened to hand both the same or their own server connection every time
        // has more chances to mix them.
        for round in 1..=8 {
            for (conn, sql, sign) in [
                (&mut *first, "SELECT $1::int4", 1),
                (&mut *second, "SELECT -$1::int4", -1),
            ] {
                let got: i32 = crate::schema::query_scalar(sql)
                    .bind(round)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(lost)?;
                if got != sign * round {
                    return Err(StoreError::PoolerLosesPreparedStatements(format!(
                        "{sql} answered {got}: another connection's statement of the same name ran"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// A lost prepared statement as [`StoreError::PoolerLosesPreparedStatements`], any other error
/// as it is.
fn lost(e: sqlx::Error) -> StoreError {
    match e.as_database_error() {
        Some(db) if db.code().is_some_and(|code| lost_prepared_statement(&code)) => {
            StoreError::PoolerLosesPreparedStatements(db.message().to_string())
        }
        _ => StoreError::Database(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prepared_statement_on_another_server_connection_is_lost() {
        let check = |code: &str, lost: bool| assert_eq!(lost_prepared_statement(code), lost);
        check("42P05", true);
        check("26000", true);
        check("42P01", false);
        check("08P01", false);
        check("57014", false);
    }

    #[test]
    fn the_refusal_names_the_fix_in_one_line() {
        let text = StoreError::PoolerLosesPreparedStatements(
            "prepared statement \"sqlx_s_1\" already exists".into(),
        )
        .to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(text.contains("max_prepared_statements"), "{text}");
        assert!(text.contains("pool_mode = session"), "{text}");
    }
}
