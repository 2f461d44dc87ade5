//! Room in the in-flight set: the places a claim (or a reaper pass) takes before it is made,
//! one handed to each dispatch it starts, so nothing claimed waits for room while its lease
//! runs.

use std::sync::Arc;
use std::time::Instant;

use cm_domain::FireCap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

use super::Scheduler;

/// The room of one claim ([`Scheduler::claim_room`]).
pub(super) struct ClaimRoom {
    /// The most occurrences it may take; `None` when there is no room at all.
    pub(super) budget: Option<FireCap>,
    /// The most missions it may take ([`cm_store::ClaimDueParams::mission_room`]).
    pub(super) mission_room: Option<usize>,
    /// The in-flight places its dispatches run in.
    pub(super) places: Places,
}

/// Places in the in-flight set taken for one claim before it is made, handed one to each
/// dispatch it starts; those left over go back when dropped.
pub(super) struct Places(Option<OwnedSemaphorePermit>);

impl Places {
    /// Up to `wanted` places, as many as are free.
    pub(super) fn take(room: &Arc<Semaphore>, wanted: usize) -> Places {
        loop {
            let n = wanted.min(room.available_permits());
            let Ok(n) = u32::try_from(n) else {
                // More than a semaphore holds in one permit: the in-flight set is smaller.
                return Places(None);
            };
            if n == 0 {
                return Places(None);
            }
            match room.clone().try_acquire_many_owned(n) {
                Ok(permit) => return Places(Some(permit)),
                // Another pass took some in between: take what is left.
                Err(TryAcquireError::NoPermits) => continue,
                Err(TryAcquireError::Closed) => return Places(None),
            }
        }
    }

    /// How many are held.
    pub(super) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
    }

    /// One place for one dispatch, if any is left.
    pub(super) fn one(&mut self) -> Option<OwnedSemaphorePermit> {
        let held = self.0.as_mut()?;
        if held.num_permits() > 1 {
            held.split(1)
        } else {
            self.0.take()
        }
    }
}

impl Scheduler {
    /// The room of one claim of `batch`, taken out of the in-flight set before the claim.
    /// Occurrences written in the claim take no room; every other one needs a place in the
    /// in-flight set the moment it is claimed, or its lease would run while it waits: the claim
    /// takes no more than the places it holds, and missions (scheduled or requested) no more
    /// than the launch rate's second has left either. The places are its own from before the
    /// claim, so a reaper pass meanwhile cannot take them.
    pub(super) fn claim_room(&self, batch: usize) -> ClaimRoom {
        let launches = match (
            self.in_claim.mission,
            self.config.max_mission_launches_per_second,
        ) {
            (None, Some(per_second)) => self.launches.room(per_second.get(), Instant::now()),
            _ => usize::MAX,
        };
        // A place for every occurrence the claim may dispatch: any of them when messages are
        // dispatched, else missions only (none when they are written in the claim too).
        let wanted = match (self.in_claim.message, self.in_claim.mission) {
            (None, _) => batch,
            (Some(_), None) => batch.min(launches),
            (Some(_), Some(_)) => 0,
        };
        let places = Places::take(&self.room, wanted);
        let held = places.len();
        ClaimRoom {
            budget: FireCap::new(if self.in_claim.message.is_some() {
                batch
            } else {
                held
            }),
            mission_room: self.in_claim.mission.is_none().then(|| held.min(launches)),
            places,
        }
    }
}
