//! `--broker-restarts N` (NATS backend, 2 by default there): the run's `nats-server` is killed
//! with SIGKILL N times, spread evenly over the run, and started again [`DOWN`] later on the
//! same port and store. Publishes in flight get no acknowledgement and are sent again under the
//! same `Nats-Msg-Id`; the stream must still hold each fired occurrence once.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Chaos, Fault, back_after};
use crate::chaos::backend::nats::NatsServer;
use crate::chaos::report::Findings;

/// How long the broker stays down: long enough for publishes to fail and be sent again, and
/// for a scheduler to be started while it is down, shorter than the 2 s dispatch timeout.
const DOWN: Duration = Duration::from_secs(1);

pub(in crate::chaos) struct BrokerRestarts {
    server: Arc<Mutex<NatsServer>>,
    plan: Vec<Instant>,
    /// How long each restart took until the server listened again.
    done: Vec<Duration>,
}

impl BrokerRestarts {
    pub fn new(
        server: Arc<Mutex<NatsServer>>,
        start: Instant,
        duration: Duration,
        count: u32,
    ) -> Self {
        BrokerRestarts {
            server,
            plan: super::spread(start, duration, count),
            done: Vec::new(),
        }
    }
}

impl Fault for BrokerRestarts {
    fn next_at(&self) -> Option<Instant> {
        self.plan.get(self.done.len()).copied()
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        let mut server = self.server.lock().unwrap_or_else(|e| e.into_inner());
        let down = Instant::now();
        server.kill()?;
        chaos.say("SIGKILL nats-server");
        std::thread::sleep(DOWN);
        server.start()?;
        let took = down.elapsed();
        chaos.say(format!("nats-server listens again after {took:.1?}"));
        self.done.push(took);
        Ok(())
    }

    fn findings(&self) -> Findings {
        Findings::one(
            "broker restarts",
            format!(
                "{} SIGKILLs of nats-server, each started again on its store ({})",
                self.done.len(),
                back_after(&self.done, "listening again", "the kill")
            ),
        )
    }
}
