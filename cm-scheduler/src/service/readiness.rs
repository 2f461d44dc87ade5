//! Start-up's waits and what `/readyz` says meanwhile: the database (created and migrated first,
//! unless told not to) and the mission runtime are retried with backoff until they answer, each
//! failure kept as the reason the service is not ready.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cm_store::{PgStore, StoreError};

use super::database;
use crate::failure::Failure;
use crate::health::Readiness;

/// Why start-up is still waiting, if it is: shared by the waits, which write it, and
/// [`DatabaseReadiness`], which reports it.
#[derive(Debug, Clone)]
pub(super) struct Waiting(Arc<Mutex<Option<String>>>);

impl Waiting {
    /// Waiting, for `reason`.
    pub(super) fn new(reason: &str) -> Waiting {
        Waiting(Arc::new(Mutex::new(Some(reason.to_owned()))))
    }

    pub(super) fn set(&self, reason: Option<String>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = reason;
    }

    fn reason(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// `/readyz`'s view of the database: waiting while the start-up has not reached it, then
/// whether it answers a ping. It pings on a pool of its own (one connection), so health checks
/// never take a connection from the claims; [`crate::health::Health`] runs it once per interval
/// and caches the answer. On a multi-host URL it is also not ready while the claims' pool has
/// no host that qualifies for the URL's `target_session_attrs` (between a primary's demotion
/// and the promotion of another), with each host and why it was refused as the reason.
pub(super) struct DatabaseReadiness {
    pub(super) store: PgStore,
    /// The claims' store, whose host is the one that matters.
    pub(super) claims: PgStore,
    pub(super) waiting: Waiting,
}

#[async_trait::async_trait]
impl Readiness for DatabaseReadiness {
    async fn check(&self) -> Result<(), String> {
        if let Some(reason) = self.waiting.reason() {
            return Err(reason);
        }
        if let Some(reason) = self
            .claims
            .failover_problem()
            .or_else(|| self.store.failover_problem())
        {
            return Err(reason);
        }
        self.store
            .ping()
            .await
            .map(|_| ())
            .map_err(|e| format!("the database does not answer: {e}"))
    }

    /// No host qualifies for the claims (a primary demoted, the other not yet promoted): seen
    /// by `/readyz` as soon as the store's 500 ms check finds it, not at the next cached check.
    fn known_now(&self) -> Option<String> {
        self.claims.failover_problem()
    }
}

/// Waits until the database answers (creating it and applying the migrations first unless
/// `migrate` is false), retrying with backoff and keeping the reason for `/readyz`. Fails only
/// when the database answers but refuses the migrations.
pub(super) async fn prepare_database(
    url: &str,
    store: &PgStore,
    migrate: bool,
    waiting: &Waiting,
) -> Result<(), Failure> {
    let mut backoff = Duration::from_millis(500);
    loop {
        let reached = async {
            // Through a pooler the database is the pooler's to name; it is created beside it.
            if migrate && !database::pooled() {
                PgStore::create_database_if_missing(url).await?;
            }
            // A pooler that would fail every tick (losing prepared statements, or the
            // timeouts) is refused now, in one line; first, since through such a pooler the
            // ping itself may fail on a lost prepared statement.
            store.check_pooler().await?;
            store.ping().await.map(|_| ())
        }
        .await;
        match reached {
            Err(
                e @ (StoreError::PoolerLosesPreparedStatements(_)
                | StoreError::PoolerDropsSettings(_)),
            ) => return Err(Failure::Other(e.to_string())),
            Err(e) if e.is_refused_startup_parameter() => {
                return Err(Failure::Other(e.explain()));
            }
            Ok(_) if !migrate => {
                // Without the schema every tick would fail: say so now, with what to do.
                store.check_schema().await?;
                break;
            }
            Ok(_) => match store.migrate().await {
                Ok(()) => break,
                // Refused by a database that answers: retrying will not help. A migration that
                // found no connection free (a server whose connections are all taken) was not
                // refused, and is retried like a database that does not answer.
                Err(e) if !e.is_transient() && store.ping().await.is_ok() => {
                    return Err(Failure::Other(format!(
                        "applying migrations: {}",
                        e.explain()
                    )));
                }
                Err(e) => {
                    waiting.set(Some(format!("waiting for the database: {e}")));
                    tracing::warn!(error = %e, retry_in = ?backoff, "applying migrations failed; retrying");
                }
            },
            Err(e) => {
                waiting.set(Some(format!("waiting for the database: {e}")));
                tracing::warn!(error = %e, retry_in = ?backoff, database = %database::redact(url),
                    "the database does not answer yet; retrying");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
    waiting.set(None);
    tracing::info!(database = %database::redact(url), migrated = migrate, "the database answers");
    Ok(())
}

/// Waits until the mission runtime answers (a Docker engine restarting, a socket not there
/// yet), retrying with backoff and keeping the reason for `/readyz`, as for the database.
pub(super) async fn wait_for_runtime(runtime: &dyn cm_dispatch::MissionRuntime, waiting: &Waiting) {
    let mut backoff = Duration::from_millis(500);
    while let Err(e) = runtime.ready().await {
        waiting.set(Some(format!("waiting for the mission runtime: {e}")));
        tracing::warn!(error = %e, retry_in = ?backoff, "the mission runtime does not answer yet; retrying");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
    waiting.set(None);
    tracing::info!("the mission runtime answers");
}
