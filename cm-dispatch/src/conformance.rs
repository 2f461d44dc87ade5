//! The conformance suite every backend passes, fakes included.
//!
//! One function, [`check_backend`], drives a backend through the cases the scheduler relies on
//! and asks an [`EffectProbe`] (which reads the backend's target: a table, a fake's memory, a
//! fake HTTP server's log) how many effects each occurrence produced.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{TimeZone, Utc};
use cm_domain::{IdempotencyKey, Occurrence};
use cm_store::RoutineKind;
use serde_json::json;
use uuid::Uuid;

use crate::{Dispatch, Dispatcher};

/// Reads a backend's target to count what dispatches produced.
#[async_trait]
pub trait EffectProbe: Send + Sync {
    /// How many effects the target holds for `key` (0 or 1 for a correct backend).
    async fn effects(&self, key: &IdempotencyKey) -> Result<usize, String>;

    /// The payload the target received for `key`, if it keeps one.
    async fn payload(&self, key: &IdempotencyKey) -> Result<Option<serde_json::Value>, String>;
}

/// Runs the suite against `backend` dispatching routines of `kind`. Returns the first broken
/// rule as an error.
pub async fn check_backend(
    backend: &dyn Dispatcher,
    probe: &dyn EffectProbe,
    kind: RoutineKind,
) -> Result<(), String> {
    // A fresh routine id per run, so the suite can run against a target that keeps state.
    let routine_id = Uuid::new_v4();
    let at = |minute| Utc.with_ymd_and_hms(2026, 3, 29, 1, minute, 0).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let dispatch = |minute, attempt, payload| {
        Dispatch::new(
            Occurrence::new(routine_id, at(minute)),
            "conformance",
            kind,
            payload,
            attempt,
            deadline,
        )
    };

    // The first attempt at an occurrence produces exactly one effect, carrying the payload.
    let first = dispatch(0, 1, json!({ "text": "first", "n": 1 }));
    let receipt = backend
        .dispatch(&first)
        .await
        .map_err(|e| format!("first dispatch failed: {e}"))?;
    if receipt.duplicate {
        return Err("the first dispatch of an occurrence was reported as a duplicate".into());
    }
    expect_effects(probe, &first.idempotency_key, 1, "after the first dispatch").await?;
    if let Some(payload) = probe.payload(&first.idempotency_key).await?
        && payload != first.payload
    {
        return Err(format!(
            "the target received {payload}, not {}",
            first.payload
        ));
    }

    // A retry of the same occurrence (attempt 2, after a crash) produces no second effect.
    let retry = dispatch(0, 2, first.payload.clone());
    let receipt = backend
        .dispatch(&retry)
        .await
        .map_err(|e| format!("the retry failed: {e}"))?;
    if !receipt.duplicate {
        return Err("a retry of a dispatched occurrence was not reported as a duplicate".into());
    }
    expect_effects(probe, &first.idempotency_key, 1, "after a retry").await?;

    // Another occurrence of the same routine is a separate effect.
    let second = dispatch(1, 1, json!({ "text": "second" }));
    let receipt = backend
        .dispatch(&second)
        .await
        .map_err(|e| format!("second occurrence failed: {e}"))?;
    if receipt.duplicate {
        return Err("a new occurrence was reported as a duplicate of another".into());
    }
    expect_effects(probe, &second.idempotency_key, 1, "for a second occurrence").await?;
    expect_effects(
        probe,
        &first.idempotency_key,
        1,
        "for the first after the second",
    )
    .await?;

    // A key nobody dispatched has no effect.
    let never = Occurrence::new(routine_id, at(59)).idempotency_key();
    expect_effects(probe, &never, 0, "for an occurrence never dispatched").await
}

async fn expect_effects(
    probe: &dyn EffectProbe,
    key: &IdempotencyKey,
    expected: usize,
    when: &str,
) -> Result<(), String> {
    let got = probe.effects(key).await?;
    if got == expected {
        Ok(())
    } else {
        Err(format!(
            "{got} effects for {key} {when}, expected {expected}"
        ))
    }
}
