//! `--held-locks N` (on in `--short` runs): a caller that deletes one routine from SQL
//! (`cm.delete_routine`) in a transaction it keeps open for [`HOLD`], longer than the
//! schedulers' lease, then rolls back; N times, spread over the run. The routine chosen is one
//! with an occurrence claimed at that moment, so a settle meets the lock.
//!
//! The caller rolls back rather than commits: it takes exactly the locks a delete takes (the
//! routine's row, its requests and its fires) and changes nothing, so the ledger check needs no
//! exception and every occurrence of the held routine must still be there, settled once, after
//! the release. The routine is never one another fault of the run acts on from this same thread
//! (the toggler's): that fault would wait on the caller's lock, and the caller's release could
//! never come. While the lock is held only that routine waits; the lateness (claimed minus
//! scheduled) of every other routine's occurrences due during the holds is measured and printed
//! (not judged: the run's other faults may fall inside a hold).

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;
use uuid::Uuid;

use super::{Chaos, Fault};
use crate::chaos::report::Findings;

/// How long the caller holds its transaction: past the lease (3 s, `fleet::RUN_FLAGS`) and the
/// reaper's next pass after it (every half lease).
pub(in crate::chaos) const HOLD: Duration = Duration::from_secs(6);

/// One hold: the routine, and when it began and ended by the database's clock.
struct Hold {
    routine: Uuid,
    from: DateTime<Utc>,
    to: Option<DateTime<Utc>>,
}

pub(in crate::chaos) struct HeldLocks {
    at: Vec<Instant>,
    /// Routines never held: those another fault writes to from the run's own thread.
    spared: Vec<Uuid>,
    /// The caller's open transaction (a connection on which `BEGIN` was sent), while it holds.
    caller: Option<PgConnection>,
    release_at: Option<Instant>,
    holds: Vec<Hold>,
    /// Fires of the other routines due during the holds, and their lateness p99 and max.
    others: Option<(usize, Duration, Duration)>,
}

impl HeldLocks {
    /// `count` holds spread over the run from `start`, never of a routine in `spared`.
    pub fn new(start: Instant, duration: Duration, count: u32, spared: Vec<Uuid>) -> Self {
        HeldLocks {
            at: super::spread(start, duration, count),
            spared,
            caller: None,
            release_at: None,
            holds: Vec::new(),
            others: None,
        }
    }

    async fn hold(
        chaos_pool: &sqlx::PgPool,
        spared: &[Uuid],
    ) -> anyhow::Result<Option<(PgConnection, Uuid, DateTime<Utc>)>> {
        // A routine with an occurrence in flight now, else any active one. The fires are
        // joined on the group too, as Citus needs to keep the join within a shard.
        let routine: Option<Uuid> = sqlx::query_scalar(
            "SELECT id FROM cm.routines r WHERE NOT paused AND id <> ALL($1)
             ORDER BY EXISTS (SELECT 1 FROM cm.routine_fires f
                              WHERE f.routine_id = r.id AND f.group_id = r.group_id
                                AND f.status = 'claimed') DESC,
                      random()
             LIMIT 1",
        )
        .bind(spared)
        .fetch_optional(chaos_pool)
        .await?;
        let Some(routine) = routine else {
            return Ok(None);
        };
        // A connection of the run's own (its application name), taken out of the pool so that
        // the transaction lasts until this fault ends it.
        let mut caller = chaos_pool.acquire().await?.detach();
        sqlx::query("BEGIN").execute(&mut caller).await?;
        let from: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut caller)
            .await?;
        sqlx::query("SELECT cm.delete_routine($1)")
            .bind(routine)
            .execute(&mut caller)
            .await?;
        Ok(Some((caller, routine, from)))
    }

    fn release(&mut self, chaos: &Chaos<'_>) -> anyhow::Result<()> {
        if let Some(mut caller) = self.caller.take() {
            // A connection lost meanwhile (a restart, a termination) rolled back already.
            if let Err(e) = chaos
                .rt
                .block_on(sqlx::query("ROLLBACK").execute(&mut caller))
            {
                chaos.say(format!("the caller's connection was gone: {e}"));
            }
            let to = chaos.db_now()?;
            if let Some(hold) = self.holds.last_mut() {
                hold.to = Some(to);
                chaos.say(format!(
                    "the caller rolled back its delete of routine {} after {:.1} s",
                    hold.routine,
                    (to - hold.from).as_seconds_f64()
                ));
            }
        }
        self.release_at = None;
        Ok(())
    }

    /// The lateness of the other routines' occurrences due during the holds.
    fn measure(&mut self, chaos: &Chaos<'_>) -> anyhow::Result<()> {
        let mut late: Vec<Duration> = Vec::new();
        for hold in &self.holds {
            let Some(to) = hold.to else { continue };
            let rows: Vec<f64> = chaos.rt.block_on(
                sqlx::query_scalar(
                    "SELECT extract(epoch FROM claimed_at - scheduled_at)::float8
                     FROM cm.routine_fires
                     WHERE scheduled_at BETWEEN $1 AND $2 AND routine_id <> $3",
                )
                .bind(hold.from)
                .bind(to)
                .bind(hold.routine)
                .fetch_all(&chaos.pool),
            )?;
            late.extend(
                rows.into_iter()
                    .map(|s| Duration::from_secs_f64(s.max(0.0))),
            );
        }
        late.sort_unstable();
        let p99 = late
            .get((late.len() * 99 / 100).min(late.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default();
        self.others = Some((late.len(), p99, late.last().copied().unwrap_or_default()));
        Ok(())
    }
}

impl Fault for HeldLocks {
    fn next_at(&self) -> Option<Instant> {
        self.release_at.or_else(|| self.at.first().copied())
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        if self.release_at.is_some() {
            self.release(chaos)?;
            if self.at.is_empty() {
                self.measure(chaos)?;
            }
            return Ok(());
        }
        self.at.remove(0);
        match chaos.rt.block_on(Self::hold(&chaos.pool, &self.spared)) {
            Ok(Some((caller, routine, from))) => {
                chaos.say(format!(
                    "a caller deletes routine {routine} in a transaction it holds open for {} s",
                    HOLD.as_secs()
                ));
                self.caller = Some(caller);
                self.holds.push(Hold {
                    routine,
                    from,
                    to: None,
                });
                self.release_at = Some(Instant::now() + HOLD);
            }
            Ok(None) => chaos.say("no routine to hold"),
            // The database may be restarting: this hold is skipped, the next one comes.
            Err(e) => chaos.say(format!("the caller could not take its locks: {e:#}")),
        }
        Ok(())
    }

    fn heal(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        self.release(chaos)?;
        if self.others.is_none() {
            self.measure(chaos)?;
        }
        Ok(())
    }

    fn findings(&self) -> Findings {
        let mut f = Findings::default();
        let held = self.holds.iter().filter(|h| h.to.is_some()).count();
        let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
        let (fires, p99, max) = self.others.unwrap_or_default();
        f.line(
            "held locks",
            format!(
                "{held} callers held a routine's rows (cm.delete_routine, rolled back) for {} s \
                 each; the other routines' lateness during the holds p99 {}, max {} ({fires} fires)",
                HOLD.as_secs(),
                secs(p99),
                secs(max)
            ),
        );
        f.require(held == 0, || {
            "no caller held a routine's rows: lengthen --duration".to_string()
        });
        // The lateness is reported, not judged: the run's other faults (SIGKILLs, a PostgreSQL
        // or dockerd restart, a network hang) may fall inside a hold's window, and the promise
        // the run checks is the ledger's (nothing lost, nothing doubled, the held routine's
        // occurrences each settled once).
        f
    }
}
