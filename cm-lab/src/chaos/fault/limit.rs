//! `--concurrency-limit N`: every other routine shares the concurrency key `chaos`, limited to
//! N runs at once. Through the run, a watcher reads the places the key's fires hold (claimed,
//! or their run running) every 100 ms, each reading one snapshot of the ledger: however the
//! schedulers crash, none may show more than N.

use std::time::{Duration, Instant};

use sqlx::PgPool;
use uuid::Uuid;

use super::{Chaos, Fault};
use crate::chaos::report::Findings;

/// The key the run's keyed routines share.
pub(in crate::chaos) const KEY: &str = "chaos";

/// How often the places are read.
const EVERY: Duration = Duration::from_millis(100);

/// Gives every other routine of `ids` the key and sets its limit, through the SQL functions an
/// application would call. Returns the keyed routines.
pub(in crate::chaos) async fn set_up(
    pool: &PgPool,
    ids: &[Uuid],
    limit: u32,
) -> anyhow::Result<Vec<Uuid>> {
    sqlx::query("SELECT cm.set_concurrency_limit($1, $2)")
        .bind(KEY)
        .bind(i32::try_from(limit)?)
        .execute(pool)
        .await?;
    let keyed: Vec<Uuid> = ids.iter().step_by(2).copied().collect();
    for id in &keyed {
        sqlx::query("SELECT cm.set_routine_concurrency_key($1, $2)")
            .bind(id)
            .bind(KEY)
            .execute(pool)
            .await?;
    }
    Ok(keyed)
}

/// The places the key's fires hold now.
async fn held(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM cm.routine_fires f
         JOIN cm.routines r ON r.id = f.routine_id AND r.group_id = f.group_id
         WHERE r.concurrency_key = $1 AND (f.status = 'claimed' OR f.run_state = 'running')",
    )
    .bind(KEY)
    .fetch_one(pool)
    .await?)
}

pub(in crate::chaos) struct LimitWatch {
    limit: u32,
    routines: usize,
    next: Instant,
    end: Instant,
    samples: u64,
    unread: u64,
    at_limit: u64,
    most: i64,
    over: Vec<String>,
}

impl LimitWatch {
    pub fn new(limit: u32, routines: usize, start: Instant, duration: Duration) -> Self {
        LimitWatch {
            limit,
            routines,
            next: start,
            end: start + duration,
            samples: 0,
            unread: 0,
            at_limit: 0,
            most: 0,
            over: Vec::new(),
        }
    }
}

impl Fault for LimitWatch {
    fn next_at(&self) -> Option<Instant> {
        (self.next < self.end).then_some(self.next)
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        self.next = Instant::now() + EVERY;
        // A reading the faults prevent (the database restarting) is counted, not an error.
        let read = chaos.rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(2), held(&chaos.pool)).await
        });
        match read {
            Ok(Ok(n)) => {
                self.samples += 1;
                self.most = self.most.max(n);
                if n == i64::from(self.limit) {
                    self.at_limit += 1;
                }
                if n > i64::from(self.limit) {
                    let at = chaos.start.elapsed().as_secs_f64();
                    chaos.say(format!("OVER THE LIMIT: {n} places held of {}", self.limit));
                    self.over.push(format!("{n} at {at:.2} s"));
                }
            }
            _ => self.unread += 1,
        }
        Ok(())
    }

    fn findings(&self) -> Findings {
        let mut f = Findings::one(
            "limit",
            format!(
                "key {KEY:?} of {} places on {} routines: {} readings ({} unreadable), {} at the limit, most held {}, {} over",
                self.limit,
                self.routines,
                self.samples,
                self.unread,
                self.at_limit,
                self.most,
                self.over.len()
            ),
        );
        f.require(!self.over.is_empty(), || {
            format!(
                "the key held more places than its limit of {}: {}",
                self.limit,
                self.over.join(", ")
            )
        });
        f.require(self.samples == 0, || {
            "the limit's places were never read".to_string()
        });
        f
    }
}
