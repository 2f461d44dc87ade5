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
    stalled: bool,
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

    /// Makes every later dispatch meet a target that never answers (or a healthy one again with
    /// `false`): the dispatch waits until its deadline and fails there, as a backend that honours
    /// [`Dispatch::deadline`] does. Unlike [`MemoryDispatcher::set_delay`], which models a
    /// backend that takes its time whatever the deadline.
    pub fn stall(&self, stalled: bool) {
        self.lock().stalled = stalled;
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
        let (delay, stalled) = {
            let state = self.lock();
            (state.delay, state.stalled)
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if stalled {
            tokio::time::sleep_until(tokio::time::Instant::from_std(dispatch.deadline)).await;
            return Err(DispatchError::Unavailable(
                "the memory target did not answer by the deadline".into(),
            ));
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
