//! cm-dispatch's integration tests: the conformance suite run against every backend.
//!
//! - this file: the message backends and the in-memory fake.
//! - `missions`: the mission backends (process runner for real, Docker against its fake).

#[path = "dispatch/missions.rs"]
mod missions;

use std::sync::Arc;

use async_trait::async_trait;
use cm_dispatch::conformance::{EffectProbe, check_backend};
use cm_dispatch::{MemoryDispatcher, OutboxDispatcher, RoutedDispatcher};
use cm_domain::IdempotencyKey;
use cm_store::{OutboxStore, PgStore, RoutineKind};
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
}

struct OutboxProbe(PgStore);

#[async_trait]
impl EffectProbe for OutboxProbe {
    async fn effects(&self, key: &IdempotencyKey) -> Result<usize, String> {
        let row = self.0.outbox_get(key).await.map_err(|e| e.to_string())?;
        Ok(usize::from(row.is_some()))
    }
    async fn payload(&self, key: &IdempotencyKey) -> Result<Option<Value>, String> {
        let row = self.0.outbox_get(key).await.map_err(|e| e.to_string())?;
        Ok(row.map(|r| r.payload))
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
    check_backend(&outbox, &OutboxProbe(store), RoutineKind::Message)
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
    }
    let careless = Careless(MemoryDispatcher::new(), std::sync::Mutex::new(0));
    let err = check_backend(&careless, &CountProbe(&careless), RoutineKind::Message)
        .await
        .unwrap_err();
    assert!(err.contains("duplicate"), "{err}");
}
