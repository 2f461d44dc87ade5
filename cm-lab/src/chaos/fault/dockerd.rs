//! `--dockerd-restarts N` (Docker mission backend, 1 by default there): the run's `dockerd` is
//! stopped with SIGTERM N times, spread evenly over the run, as an operator's restart of the
//! engine does (its running containers are stopped with it), and started again on the same
//! data [`DOWN`] after it went. Launches in flight meet refused connections and retry inside
//! their dispatch timeout (6 s); each occurrence must still have one container and none may
//! fail.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Chaos, Fault, back_after};
use crate::chaos::backend::docker::Dockerd;
use crate::chaos::report::Findings;

/// How long the engine stays away at least, from the SIGTERM to the new start: the issue's
/// "restart of a couple of seconds", inside a dispatch's timeout.
const DOWN: Duration = Duration::from_secs(2);

pub(in crate::chaos) struct DockerdRestarts {
    engine: Arc<Mutex<Dockerd>>,
    plan: Vec<Instant>,
    /// How long each restart took, from the SIGTERM until `/_ping` answered again.
    done: Vec<Duration>,
}

impl DockerdRestarts {
    pub fn new(
        engine: Arc<Mutex<Dockerd>>,
        start: Instant,
        duration: Duration,
        count: u32,
    ) -> Self {
        DockerdRestarts {
            engine,
            plan: super::spread(start, duration, count),
            done: Vec::new(),
        }
    }
}

impl Fault for DockerdRestarts {
    fn next_at(&self) -> Option<Instant> {
        self.plan.get(self.done.len()).copied()
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        let mut engine = self.engine.lock().unwrap_or_else(|e| e.into_inner());
        let down = Instant::now();
        chaos.say("SIGTERM dockerd");
        engine.stop()?;
        chaos.say(format!("dockerd exited after {:.1?}", down.elapsed()));
        std::thread::sleep(DOWN.saturating_sub(down.elapsed()));
        engine.start()?;
        let took = down.elapsed();
        chaos.say(format!("dockerd answers again after {took:.1?}"));
        self.done.push(took);
        Ok(())
    }

    fn findings(&self) -> Findings {
        Findings::one(
            "dockerd restarts",
            format!(
                "{} restarts of the run's dockerd ({})",
                self.done.len(),
                back_after(&self.done, "answering again", "the SIGTERM")
            ),
        )
    }
}
