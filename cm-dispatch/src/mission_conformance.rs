//! The conformance cases of mission backends, on top of [`check_backend`].
//!
//! [`check_mission_backend`] first runs the suite every backend passes, through [`AsMission`]
//! (the suite's payloads are arbitrary JSON; a mission backend launches only valid missions, so
//! each payload travels as a mission whose `task` is the payload's JSON text, and a probe reads
//! it back from `CM_TASK` with [`payload_of_task`]). Then it adds what matters for missions:
//!
//! - two dispatches of one occurrence at the same time launch one mission;
//! - a launch that dies between creating the mission and starting it (the runtime keeps a
//!   created, never started container) is completed by the Retry, and launches once. Where the
//!   create is itself the launch (a Kubernetes Job: the API server stores it whole and the Job
//!   controller starts it; there is no second step to miss), the crash is one after the create
//!   was stored and before its answer came back: the mission is launched, the dispatch failed,
//!   and the Retry must find it rather than launch another ([`LaunchFaults::launched_by_create`]).

use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{TimeZone, Utc};
use cm_domain::Occurrence;
use cm_domain::RoutineKind;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::conformance::{EffectProbe, check_backend};
use crate::{Dispatch, DispatchError, Dispatcher, Receipt};

/// The repository every conformance mission names.
pub const CONFORMANCE_REPOSITORY: &str = "https://git.example.com/cm/conformance.git";

/// Makes a backend's runtime fail the way a crash does.
pub trait LaunchFaults: Send + Sync {
    /// Makes the next launch stop after the runtime created the mission and before it started
    /// it: the dispatch fails, and the runtime keeps the mission created but not started (or,
    /// where [`LaunchFaults::launched_by_create`], created and so launched).
    fn crash_after_create(&self);

    /// Whether a created mission is already launched: the runtime's create is atomic and
    /// starts the mission itself (a Kubernetes Job). `false`, the default, for a runtime whose
    /// create and start are two calls (a Docker container).
    fn launched_by_create(&self) -> bool {
        false
    }
}

/// A mission whose task carries `payload` as JSON text.
pub fn mission_for(payload: &Value) -> Value {
    json!({
        "repository": CONFORMANCE_REPOSITORY,
        "ref": "main",
        "task": payload.to_string(),
        "labels": { "routine/suite": "conformance" },
    })
}

/// The payload a conformance mission carried, read back from its `CM_TASK`.
pub fn payload_of_task(task: &str) -> Option<Value> {
    serde_json::from_str(task).ok()
}

/// A mission backend seen through [`mission_for`]: what it receives is a valid mission.
pub struct AsMission<'a>(pub &'a dyn Dispatcher);

#[async_trait]
impl Dispatcher for AsMission<'_> {
    async fn dispatch(&self, dispatch: &Dispatch) -> Result<Receipt, DispatchError> {
        let mut dispatch = dispatch.clone();
        dispatch.payload = mission_for(&dispatch.payload);
        self.0.dispatch(&dispatch).await
    }
}

/// Runs the suite every backend passes, then the mission cases, against `backend`. `faults`
/// is how the test makes its runtime crash between create and start; a backend with no such
/// step (the process runner) passes `None`, and that case is not run for it.
pub async fn check_mission_backend(
    backend: &dyn Dispatcher,
    probe: &dyn EffectProbe,
    faults: Option<&dyn LaunchFaults>,
) -> Result<(), String> {
    check_backend(&AsMission(backend), probe, RoutineKind::Mission).await?;

    let routine_id = Uuid::new_v4();
    let at = |minute| Utc.with_ymd_and_hms(2026, 10, 25, 1, minute, 0).unwrap();
    let dispatch = |minute, attempt, deadline| {
        Dispatch::new(
            Occurrence::new(routine_id, at(minute)),
            "mission conformance",
            RoutineKind::Mission,
            mission_for(&json!({ "minute": minute })),
            attempt,
            deadline,
        )
    };
    let later = |secs| Instant::now() + Duration::from_secs(secs);

    // Two schedulers dispatching one occurrence at once (a claim taken over while its first
    // claimant still runs) launch one mission between them.
    let (first, second) = (dispatch(0, 1, later(10)), dispatch(0, 2, later(10)));
    let (a, b) =
        futures_util::future::join(backend.dispatch(&first), backend.dispatch(&second)).await;
    let a = a.map_err(|e| format!("the first of two simultaneous dispatches failed: {e}"))?;
    let b = b.map_err(|e| format!("the second of two simultaneous dispatches failed: {e}"))?;
    if !a.duplicate && !b.duplicate {
        return Err(format!(
            "two simultaneous dispatches of one occurrence both launched ({} and {})",
            a.detail, b.detail
        ));
    }
    expect(probe, &first, 1, "after two simultaneous dispatches").await?;

    if let Some(faults) = faults {
        // The first attempt dies between create and start (for an atomic create: after the
        // create was stored, before its answer; such a fault ends by the deadline, kept short).
        faults.crash_after_create();
        let crashed = dispatch(1, 1, later(3));
        match backend.dispatch(&crashed).await {
            Ok(receipt) => {
                return Err(format!(
                    "a launch told to crash after create succeeded: {}",
                    receipt.detail
                ));
            }
            // The mission was created: the outcome is open, for the next attempt to finish,
            // never a failure that would settle `failed` over a created mission.
            Err(DispatchError::Unconfirmed(_)) => {}
            Err(e) => {
                return Err(format!(
                    "a launch that created its mission and heard nothing more ended as {e}, \
                     not unconfirmed"
                ));
            }
        }
        let launched = usize::from(faults.launched_by_create());
        expect(
            probe,
            &crashed,
            launched,
            "after a crash between create and start",
        )
        .await?;
        // The Retry after the lease finds the mission created, starts it, and says so.
        let retry = dispatch(1, 2, later(10));
        let receipt = backend
            .dispatch(&retry)
            .await
            .map_err(|e| format!("the retry after a crash between create and start: {e}"))?;
        if !receipt.duplicate {
            return Err("the retry created a second mission instead of starting the first".into());
        }
        expect(probe, &retry, 1, "after the retry of a crashed launch").await?;
        // And a further retry changes nothing.
        let again = backend
            .dispatch(&dispatch(1, 3, later(10)))
            .await
            .map_err(|e| format!("a third attempt failed: {e}"))?;
        if !again.duplicate {
            return Err("a third attempt was not reported as already launched".into());
        }
        expect(probe, &retry, 1, "after a third attempt").await?;
    }
    Ok(())
}

async fn expect(
    probe: &dyn EffectProbe,
    dispatch: &Dispatch,
    expected: usize,
    when: &str,
) -> Result<(), String> {
    let got = probe.effects(&dispatch.idempotency_key).await?;
    if got == expected {
        Ok(())
    } else {
        Err(format!(
            "{got} missions launched for {} {when}, expected {expected}",
            dispatch.idempotency_key
        ))
    }
}
