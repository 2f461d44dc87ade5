//! The database's health as `/readyz` and the status page see it: checked in the background at
//! most once per interval, one check in flight at a time, each under its own deadline, and the
//! answer cached. A request only reads the cache, so it answers at once whatever the network
//! does, and no number of requests adds a query to the database. [`probe`] is the other side:
//! asking a running scheduler's `/readyz`, as `cm-scheduler health` does.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod probe;

pub use probe::probe;

/// Tells whether the scheduler's database is usable.
#[async_trait::async_trait]
pub trait Readiness: Send + Sync + 'static {
    /// `Ok` when the database answers; otherwise why the scheduler cannot work.
    async fn check(&self) -> Result<(), String>;

    /// Why the scheduler cannot work, where that is known in memory without a query (no
    /// database host qualifies): read on every request, on top of the cached check, so a
    /// switch shorter than the check's interval still shows. `None` by default.
    fn known_now(&self) -> Option<String> {
        None
    }
}

/// The cached answer of a [`Readiness`] check, refreshed by [`Health::run`].
pub struct Health {
    check: Arc<dyn Readiness>,
    /// How often the check runs.
    pub interval: Duration,
    /// The longest one check may take before it counts as "did not answer".
    pub deadline: Duration,
    answer: Mutex<Answer>,
}

struct Answer {
    result: Result<(), String>,
    at: Option<Instant>,
}

impl Health {
    /// Health checked by `check` every `interval`, each check given `deadline`.
    pub fn new(check: Arc<dyn Readiness>, interval: Duration, deadline: Duration) -> Arc<Health> {
        Arc::new(Health {
            check,
            interval,
            deadline,
            answer: Mutex::new(Answer {
                result: Err("the database has not been checked yet".into()),
                at: None,
            }),
        })
    }

    /// Checks once now (under the deadline) and caches the answer.
    pub async fn refresh(&self) {
        let result = match tokio::time::timeout(self.deadline, self.check.check()).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "the database did not answer within {}",
                humantime::format_duration(self.deadline)
            )),
        };
        *self.answer.lock().unwrap_or_else(|e| e.into_inner()) = Answer {
            result,
            at: Some(Instant::now()),
        };
    }

    /// Checks every interval until the task is dropped, one check at a time.
    pub async fn run(self: Arc<Self>) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.refresh().await;
        }
    }

    /// The cached answer, unless [`Readiness::known_now`] gives a reason now. An answer older
    /// than an interval and a deadline means the checks stopped (the runtime is starved, or the
    /// task ended): that is unhealthy too.
    pub fn current(&self) -> Result<(), String> {
        if let Some(reason) = self.check.known_now() {
            return Err(reason);
        }
        let answer = self.answer.lock().unwrap_or_else(|e| e.into_inner());
        match answer.at {
            Some(at) if at.elapsed() > self.interval + self.deadline * 2 => Err(format!(
                "the database's health was last checked {:.1}s ago",
                at.elapsed().as_secs_f64()
            )),
            _ => answer.result.clone(),
        }
    }
}
