//! `--receiver-outage SECONDS` (webhook backend): beside the receiver's usual slowness, it
//! answers every request 503 for that long, a third of the way into the run, while the
//! SIGKILLs go on. The backend resends within each dispatch's deadline under the same
//! `webhook-id` (the identity check), and what the deadline ends is settled `failed`; no
//! occurrence the receiver accepted may be `failed` (the webhook check).

use std::time::{Duration, Instant};

use super::{Chaos, Fault};
use crate::chaos::backend::webhook::OutageSwitch;
use crate::chaos::report::Findings;

pub(in crate::chaos) struct ReceiverOutage {
    switch: OutageSwitch,
    at: Instant,
    length: Duration,
    began: bool,
    ended: bool,
}

impl ReceiverOutage {
    pub fn new(switch: OutageSwitch, start: Instant, duration: Duration, length: Duration) -> Self {
        ReceiverOutage {
            switch,
            at: start + duration / 3,
            length,
            began: false,
            ended: false,
        }
    }
}

impl Fault for ReceiverOutage {
    fn next_at(&self) -> Option<Instant> {
        match (self.began, self.ended) {
            (false, _) => Some(self.at),
            (true, false) => Some(self.at + self.length),
            (true, true) => None,
        }
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        if self.began {
            self.switch.set(false);
            self.ended = true;
            chaos.say("the webhook receiver answers again");
        } else {
            self.switch.set(true);
            self.began = true;
            chaos.say(format!(
                "the webhook receiver answers 503 to everything for {} s",
                self.length.as_secs()
            ));
        }
        Ok(())
    }

    fn heal(&mut self, _chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        self.switch.set(false);
        Ok(())
    }

    fn findings(&self) -> Findings {
        Findings::one(
            "receiver outage",
            format!(
                "{} s of 503 to every request{}",
                self.length.as_secs(),
                if self.ended {
                    ""
                } else {
                    " (cut short by the end of the chaos)"
                }
            ),
        )
    }
}
