//! The conformance suite every backend passes, fakes included.
//!
//! One function, [`check_backend`], drives a backend through the cases the scheduler relies on.
//! The test harness gives it the backend and an [`EffectProbe`]: the harness's hold on the
//! backend's target (a table, a fake's memory, an HTTP receiver inside the test, a JetStream
//! stream). The probe counts the effects each occurrence produced, and makes the target
//! misbehave on request: stall (never answer) or fail (refuse with a text of the suite's
//! choosing). The cases:
//!
//! 1. the first dispatch of an occurrence produces one effect, with the payload;
//! 2. the same occurrence dispatched again (attempt 2, after a crash) produces no second effect
//!    and is reported as a duplicate;
//! 3. a different occurrence has its own key and its own effect;
//! 4. against a stalled target, a dispatch returns an error by its deadline, not later
//!    (within [`DEADLINE_SLACK`]);
//! 5. a target's refusal is reported as an error carrying the target's text, and the secret the
//!    backend holds ([`EffectProbe::secret`]) appears nowhere in it;
//! 6. once the target behaves again, a new occurrence goes through.
//!
//! # Example
//!
//! ```no_run
//! # async fn run(backend: &dyn cm_dispatch::Dispatcher, probe: &dyn cm_dispatch::conformance::EffectProbe) {
//! use cm_dispatch::conformance::check_backend;
//! check_backend(backend, probe, cm_domain::RoutineKind::Message).await.unwrap();
//! # }
//! ```

use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{TimeZone, Utc};
use cm_domain::RoutineKind;
use cm_domain::{IdempotencyKey, Occurrence};
use serde_json::json;
use uuid::Uuid;

use crate::{Dispatch, Dispatcher};

/// How late past its deadline a dispatch against a stalled target may return: room for a busy
/// machine's scheduling, far less than any dispatch timeout.
pub const DEADLINE_SLACK: Duration = Duration::from_millis(750);

/// How long the suite gives a dispatch against a stalled target.
const STALL_DEADLINE: Duration = Duration::from_millis(1500);

/// The harness's hold on a backend's target: it counts effects and makes the target misbehave.
#[async_trait]
pub trait EffectProbe: Send + Sync {
    /// How many effects the target holds for `key` (0 or 1 for a correct backend).
    async fn effects(&self, key: &IdempotencyKey) -> Result<usize, String>;

    /// The payload the target received for `key`, if it keeps one.
    async fn payload(&self, key: &IdempotencyKey) -> Result<Option<serde_json::Value>, String>;

    /// From now on the target takes dispatches but never answers (a hung server, a held lock).
    async fn stall(&self) -> Result<(), String>;

    /// From now on the target refuses every dispatch with an error whose text contains
    /// `reason` (an HTTP 4xx with it in the body, a database error raising it).
    async fn fail(&self, reason: &str) -> Result<(), String>;

    /// The target behaves again.
    async fn heal(&self) -> Result<(), String>;

    /// A secret the backend was configured with (a signing key, a password) that must never
    /// appear in an error; `None` if it holds none.
    fn secret(&self) -> Option<String>;

    /// Whether this probe can make its target stall and refuse. The deadline and refusal cases
    /// run only when it can; a target that cannot be made to (a local process runner, which
    /// has nothing to wait on) skips them, and its own tests cover its failures.
    fn injects_faults(&self) -> bool {
        true
    }
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

    if second.idempotency_key == first.idempotency_key {
        return Err("two occurrences of one routine share an idempotency key".into());
    }

    // A key nobody dispatched has no effect.
    let never = Occurrence::new(routine_id, at(59)).idempotency_key();
    expect_effects(probe, &never, 0, "for an occurrence never dispatched").await?;

    if !probe.injects_faults() {
        return Ok(());
    }
    check_deadline(backend, probe, kind, routine_id).await?;
    check_refusal(backend, probe, kind, routine_id).await?;

    // Healed, the target takes a new occurrence again.
    probe.heal().await?;
    let after = dispatch(3, 1, json!({ "text": "after" }));
    let after = Dispatch {
        deadline: Instant::now() + Duration::from_secs(10),
        ..after
    };
    backend
        .dispatch(&after)
        .await
        .map_err(|e| format!("a dispatch after the target healed failed: {e}"))?;
    expect_effects(probe, &after.idempotency_key, 1, "after the target healed").await
}

/// Against a stalled target, a dispatch ends with an error by its deadline.
async fn check_deadline(
    backend: &dyn Dispatcher,
    probe: &dyn EffectProbe,
    kind: RoutineKind,
    routine_id: Uuid,
) -> Result<(), String> {
    probe.stall().await?;
    let started = Instant::now();
    let stalled = Dispatch::new(
        Occurrence::new(
            routine_id,
            Utc.with_ymd_and_hms(2026, 3, 29, 2, 0, 0).unwrap(),
        ),
        "conformance",
        kind,
        json!({ "text": "stalled" }),
        1,
        started + STALL_DEADLINE,
    );
    // The suite's own bound, so a backend that ignores its deadline fails instead of hanging.
    let outcome = tokio::time::timeout(
        STALL_DEADLINE + Duration::from_secs(10),
        backend.dispatch(&stalled),
    )
    .await;
    let took = started.elapsed();
    probe.heal().await?;
    match outcome {
        Err(_) => Err(format!(
            "a dispatch to a stalled target was still running {took:?} after it began, \
             past its {STALL_DEADLINE:?} deadline"
        )),
        Ok(Ok(receipt)) => Err(format!(
            "a dispatch to a stalled target succeeded ({})",
            receipt.detail
        )),
        Ok(Err(_)) if took > STALL_DEADLINE + DEADLINE_SLACK => Err(format!(
            "a dispatch to a stalled target returned after {took:?}, past its \
             {STALL_DEADLINE:?} deadline"
        )),
        Ok(Err(_)) => {
            let effects = probe.effects(&stalled.idempotency_key).await?;
            if effects > 1 {
                return Err(format!("{effects} effects for a stalled dispatch"));
            }
            Ok(())
        }
    }
}

/// A target's refusal comes back as an error carrying the target's words and no secret.
async fn check_refusal(
    backend: &dyn Dispatcher,
    probe: &dyn EffectProbe,
    kind: RoutineKind,
    routine_id: Uuid,
) -> Result<(), String> {
    let reason = format!("conformance refusal {}", Uuid::new_v4().simple());
    probe.fail(&reason).await?;
    let refused = Dispatch::new(
        Occurrence::new(
            routine_id,
            Utc.with_ymd_and_hms(2026, 3, 29, 2, 1, 0).unwrap(),
        ),
        "conformance",
        kind,
        json!({ "text": "refused" }),
        1,
        Instant::now() + Duration::from_secs(10),
    );
    let outcome = backend.dispatch(&refused).await;
    probe.heal().await?;
    let error = match outcome {
        Ok(receipt) => {
            return Err(format!(
                "a dispatch the target refused succeeded ({})",
                receipt.detail
            ));
        }
        Err(e) => e.to_string(),
    };
    if !error.contains(&reason) {
        return Err(format!(
            "the error of a refused dispatch does not carry the target's reason {reason:?}: {error}"
        ));
    }
    if let Some(secret) = probe.secret().filter(|s| !s.is_empty())
        && error.contains(&secret)
    {
        return Err("the error of a refused dispatch contains the backend's secret".into());
    }
    expect_effects(probe, &refused.idempotency_key, 0, "for a refused dispatch").await
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
