//! The conformance suite run against the memory, outbox and routed backends, and shown to catch
//! a careless backend.

use std::sync::Arc;

use async_trait::async_trait;
use cm_dispatch::conformance::{EffectProbe, check_backend};
use cm_dispatch::{MemoryDispatcher, OutboxDispatcher, RoutedDispatcher};
use cm_domain::IdempotencyKey;
use cm_domain::RoutineKind;
use cm_store::{OutboxStore, PgStore};
use serde_json::Value;

struct MemoryProbe(Arc<MemoryDispatcher>);

#[async_trait]
impl EffectProbe for MemoryProbe {
    async fn effects(&self, key: &IdempotencyKey) -> Result<usize, String> {
        Ok(usize::from(self.0.effect(key).is_some()))
    }
    async fn payload(&self, key: &IdempotencyKey) -> Result<Option<Value>, String> {
        Ok(self.0.effect(key).map(|d| d.payload))
    }
    async fn stall(&self) -> Result<(), String> {
        self.0.stall(true);
        Ok(())
    }
    async fn fail(&self, reason: &str) -> Result<(), String> {
        self.0.fail_with(Some(reason));
        Ok(())
    }
    async fn heal(&self) -> Result<(), String> {
        self.0.stall(false);
        self.0.fail_with(None);
        Ok(())
    }
    fn secret(&self) -> Option<String> {
        None
    }
}

/// The outbox's target is the table: a transaction holding a lock on it stalls inserts, and a
/// trigger raising an exception refuses them.
struct OutboxProbe {
    store: PgStore,
    lock: tokio::sync::Mutex<Option<sqlx::Transaction<'static, sqlx::Postgres>>>,
}

impl OutboxProbe {
    fn new(store: PgStore) -> Self {
        OutboxProbe {
            store,
            lock: tokio::sync::Mutex::new(None),
        }
    }
}

#[async_trait]
impl EffectProbe for OutboxProbe {
    async fn effects(&self, key: &IdempotencyKey) -> Result<usize, String> {
        let row = self
            .store
            .outbox_get(key)
            .await
            .map_err(|e| e.to_string())?;
        Ok(usize::from(row.is_some()))
    }
    async fn payload(&self, key: &IdempotencyKey) -> Result<Option<Value>, String> {
        let row = self
            .store
            .outbox_get(key)
            .await
            .map_err(|e| e.to_string())?;
        Ok(row.map(|r| r.payload))
    }
    async fn stall(&self) -> Result<(), String> {
        let mut tx = self.store.pool().begin().await.map_err(|e| e.to_string())?;
        sqlx::query("LOCK TABLE cm.outbox_messages IN ACCESS EXCLUSIVE MODE")
            .execute(&mut *tx)
            .await
            .map_err(|e| e.to_string())?;
        *self.lock.lock().await = Some(tx);
        Ok(())
    }
    async fn fail(&self, reason: &str) -> Result<(), String> {
        assert!(!reason.contains('\''), "the reason is put in a literal");
        let function = format!(
            "CREATE OR REPLACE FUNCTION conformance_refuse() RETURNS trigger LANGUAGE plpgsql \
             AS $$ BEGIN RAISE EXCEPTION '{reason}'; END $$"
        );
        for statement in [
            function,
            "CREATE TRIGGER conformance_refuse BEFORE INSERT ON cm.outbox_messages \
             FOR EACH ROW EXECUTE FUNCTION conformance_refuse()"
                .to_string(),
        ] {
            // The reason is the suite's own text, checked above to hold no quote.
            sqlx::query(sqlx::AssertSqlSafe(statement))
                .execute(self.store.pool())
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
    async fn heal(&self) -> Result<(), String> {
        if let Some(tx) = self.lock.lock().await.take() {
            tx.rollback().await.map_err(|e| e.to_string())?;
        }
        sqlx::query("DROP TRIGGER IF EXISTS conformance_refuse ON cm.outbox_messages")
            .execute(self.store.pool())
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
    fn secret(&self) -> Option<String> {
        None
    }
}

#[tokio::test]
async fn memory_backend_conforms() {
    let fake = Arc::new(MemoryDispatcher::new());
    check_backend(
        fake.as_ref(),
        &MemoryProbe(fake.clone()),
        RoutineKind::Mission,
    )
    .await
    .unwrap();
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn outbox_backend_conforms(pool: sqlx::PgPool) {
    let store = PgStore::new(pool);
    let outbox = OutboxDispatcher::new(store.clone());
    check_backend(&outbox, &OutboxProbe::new(store), RoutineKind::Message)
        .await
        .unwrap();
}

#[tokio::test]
async fn routed_backend_conforms_and_refuses_a_kind_without_backend() {
    let fake = Arc::new(MemoryDispatcher::new());
    let routed = RoutedDispatcher::new(Some(fake.clone()), None);
    check_backend(&routed, &MemoryProbe(fake.clone()), RoutineKind::Message)
        .await
        .unwrap();
    let err = check_backend(&routed, &MemoryProbe(fake), RoutineKind::Mission)
        .await
        .unwrap_err();
    assert!(err.contains("no mission backend is configured"), "{err}");
}

#[tokio::test]
async fn a_backend_that_duplicates_effects_fails_the_suite() {
    // A backend that ignores the key: every dispatch is a new effect. The suite must catch it.
    struct Careless(MemoryDispatcher, std::sync::Mutex<usize>);
    #[async_trait]
    impl cm_dispatch::Dispatcher for Careless {
        async fn dispatch(
            &self,
            d: &cm_dispatch::Dispatch,
        ) -> Result<cm_dispatch::Receipt, cm_dispatch::DispatchError> {
            *self.1.lock().unwrap() += 1;
            let mut d = d.clone();
            d.idempotency_key =
                cm_domain::Occurrence::new(uuid::Uuid::new_v4(), d.occurrence.scheduled_at)
                    .idempotency_key();
            self.0.dispatch(&d).await
        }
    }
    struct CountProbe<'a>(&'a Careless);
    #[async_trait]
    impl EffectProbe for CountProbe<'_> {
        async fn effects(&self, _key: &IdempotencyKey) -> Result<usize, String> {
            Ok(*self.0.1.lock().unwrap())
        }
        async fn payload(&self, _key: &IdempotencyKey) -> Result<Option<Value>, String> {
            Ok(None)
        }
        async fn stall(&self) -> Result<(), String> {
            Ok(())
        }
        async fn fail(&self, _reason: &str) -> Result<(), String> {
            Ok(())
        }
        async fn heal(&self) -> Result<(), String> {
            Ok(())
        }
        fn secret(&self) -> Option<String> {
            None
        }
    }
    let careless = Careless(MemoryDispatcher::new(), std::sync::Mutex::new(0));
    let err = check_backend(&careless, &CountProbe(&careless), RoutineKind::Message)
        .await
        .unwrap_err();
    assert!(err.contains("duplicate"), "{err}");
}

/// A backend that ignores its deadline, or leaks its secret in errors, fails the suite.
#[tokio::test]
async fn a_backend_that_outlives_its_deadline_or_leaks_its_secret_fails_the_suite() {
    struct Leaky {
        inner: Arc<MemoryDispatcher>,
        hang: bool,
    }
    #[async_trait]
    impl cm_dispatch::Dispatcher for Leaky {
        async fn dispatch(
            &self,
            d: &cm_dispatch::Dispatch,
        ) -> Result<cm_dispatch::Receipt, cm_dispatch::DispatchError> {
            match self.inner.dispatch(d).await {
                // A stalled target, waited on past the deadline.
                Err(_) if self.hang && d.payload["text"] == "stalled" => {
                    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
                    Err(cm_dispatch::DispatchError::Unavailable("late".into()))
                }
                Err(e) => Err(cm_dispatch::DispatchError::Unavailable(format!(
                    "{e} (while using key s3cret-key)"
                ))),
                ok => ok,
            }
        }
    }
    struct LeakyProbe(MemoryProbe);
    #[async_trait]
    impl EffectProbe for LeakyProbe {
        async fn effects(&self, key: &IdempotencyKey) -> Result<usize, String> {
            self.0.effects(key).await
        }
        async fn payload(&self, key: &IdempotencyKey) -> Result<Option<Value>, String> {
            self.0.payload(key).await
        }
        async fn stall(&self) -> Result<(), String> {
            self.0.stall().await
        }
        async fn fail(&self, reason: &str) -> Result<(), String> {
            self.0.fail(reason).await
        }
        async fn heal(&self) -> Result<(), String> {
            self.0.heal().await
        }
        fn secret(&self) -> Option<String> {
            Some("s3cret-key".into())
        }
    }
    for (hang, expected) in [(true, "past its"), (false, "secret")] {
        let inner = Arc::new(MemoryDispatcher::new());
        let leaky = Leaky {
            inner: inner.clone(),
            hang,
        };
        let err = check_backend(
            &leaky,
            &LeakyProbe(MemoryProbe(inner)),
            RoutineKind::Message,
        )
        .await
        .unwrap_err();
        assert!(err.contains(expected), "{err}");
    }
}
