//! SIGKILLs, always on: every 1 to 4 s a random scheduler is killed and started again at once,
//! half the time under its old instance id. Half of the kills are aimed just after a whole
//! second, when the occurrences of that second are being claimed and dispatched: within 60 ms,
//! or within 400 ms with `--mission-backend docker`, where a launch (a create, then a start, on
//! a real engine) takes that long, so kills land between the create and the start and after it.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{Chaos, Fault};
use crate::chaos::options::Options;
use crate::chaos::report::Findings;
use crate::chaos::rng::Rng;

pub(in crate::chaos) struct Kills {
    at: Instant,
    aimed: bool,
    /// How far after a whole second an aimed kill lands at most.
    aim: Duration,
    kills: u32,
    aimed_kills: u32,
    same_id_restarts: u32,
}

impl Kills {
    pub fn new(rng: &mut Rng, start: Instant, aim: Duration) -> Self {
        let (at, aimed) = next_kill(rng, start, aim);
        Kills {
            at,
            aimed,
            aim,
            kills: 0,
            aimed_kills: 0,
            same_id_restarts: 0,
        }
    }
}

/// How far after a whole second the run's aimed kills land at most.
pub(in crate::chaos) fn aim_for(options: &Options) -> Duration {
    Duration::from_millis(if options.docker { 400 } else { 60 })
}

/// When the next kill happens after `from`, and whether it is aimed. Aimed kills land 0 to
/// `aim` after a whole second of the wall clock: the schedulers tick a few milliseconds after
/// each 200 ms boundary and the occurrences fall on whole seconds, so that is when claims and
/// dispatches are in flight and a kill leaves a claimed row for the reaper.
pub(in crate::chaos) fn next_kill(rng: &mut Rng, from: Instant, aim: Duration) -> (Instant, bool) {
    let base = from + rng.millis(1000, 4000);
    if !rng.coin() {
        return (base, false);
    }
    let jitter = rng.millis(0, aim.as_millis() as u64);
    let wall = SystemTime::now() + base.saturating_duration_since(Instant::now());
    let into_second = wall
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_millis();
    let to_next_second = Duration::from_millis(u64::from(1000 - into_second));
    (base + to_next_second + jitter, true)
}

impl Fault for Kills {
    fn next_at(&self) -> Option<Instant> {
        Some(self.at)
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        if Instant::now() < chaos.quiet_until {
            self.at = chaos.quiet_until;
            return Ok(());
        }
        let slot = chaos.rng.below(chaos.fleet.len() as u64) as usize;
        let same_id = chaos.rng.coin();
        let (old, new) = chaos.fleet.kill_and_restart(slot, same_id)?;
        self.kills += 1;
        self.aimed_kills += u32::from(self.aimed);
        self.same_id_restarts += u32::from(same_id);
        chaos.say(format!(
            "SIGKILL {old}{}, started {new}",
            if self.aimed { " (aimed at a tick)" } else { "" }
        ));
        (self.at, self.aimed) = next_kill(&mut chaos.rng, Instant::now(), self.aim);
        Ok(())
    }

    fn findings(&self) -> Findings {
        Findings::one(
            "kills",
            format!(
                "{} SIGKILLs ({} aimed just after a whole second), {} restarted under the same instance id",
                self.kills, self.aimed_kills, self.same_id_restarts
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kills_come_one_to_five_seconds_apart() {
        let mut rng = Rng::new(5);
        let from = Instant::now();
        for _ in 0..200 {
            let (at, _) = next_kill(&mut rng, from, Duration::from_millis(60));
            let after = at - from;
            assert!(after >= Duration::from_secs(1) && after <= Duration::from_millis(5100));
        }
    }
}
