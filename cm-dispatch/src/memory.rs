//! An in-memory fake backend for tests: it records every effect, deduplicated by key.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use cm_domain::IdempotencyKey;

use crate::{Dispatch, DispatchError, Dispatcher, Receipt};

/// A backend that keeps its effects in memory.
///
/// It behaves as an idempotent target would: the first dispatch of a key produces an effect, a
/// later one with the same key is a duplicate. Tests configure it to fail or to take time.
#[derive(Debug, Default)]
pub struct MemoryDispatcher {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    effects: HashMap<IdempotencyKey, Dispatch>,
    calls: Vec<Dispatch>,
    fail_with: Option<String>,
    delay: Duration,
}

impl MemoryDispatcher {
    /// A fake that succeeds at once.
    pub fn new() -> Self {
        MemoryDispatcher::default()
    }

    /// Makes every later dispatch fail with `error` (or succeed again with `None`).
    pub fn fail_with(&self, error: Option<&str>) {
        self.lock().fail_with = error.map(str::to_owned);
    }

    /// Makes every later dispatch take `delay` before it answers.
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// The effect produced for `key`, if any.
    pub fn effect(&self, key: &IdempotencyKey) -> Option<Dispatch> {
        self.lock().effects.get(key).cloned()
    }

    /// How many distinct effects were produced.
    pub fn effect_count(&self) -> usize {
        self.lock().effects.len()
    }

    /// Every dispatch received, in order, duplicates included.
    pub fn calls(&self) -> Vec<Dispatch> {
        self.lock().calls.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panicking test thread must not hide the fake's record from the others.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Dispatcher for MemoryDispatcher {
    async fn dispatch(&self, dispatch: &Dispatch) -> Result<Receipt, DispatchError> {
        let delay = self.lock().delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut state = self.lock();
        state.calls.push(dispatch.clone());
        if let Some(error) = &state.fail_with {
            return Err(DispatchError::Unavailable(error.clone()));
        }
        let key = dispatch.idempotency_key.clone();
        let duplicate = state.effects.contains_key(&key);
        state.effects.entry(key).or_insert_with(|| dispatch.clone());
        Ok(Receipt {
            duplicate,
            detail: format!("memory effect {}", dispatch.idempotency_key),
        })
    }
}
