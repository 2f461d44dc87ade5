//! `--poison-routine` (on in `--short`): a third of the way in, a routine whose schedule is too
//! costly to check is written through SQL (`cm.create_routine`, which any application role may
//! call and which cannot parse a schedule). The schedulers' planning must set it aside, paused
//! with its reason (at the latest `SET_ASIDE_AFTER_THE_CHAOS` after the chaos ends), while every other
//! routine keeps firing: the ledger check counts what was
//! lost or doubled, and this fault prints the other routines' lateness (first claim minus
//! occurrence) from the moment it was written.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Chaos, Fault};
use crate::chaos::report::Findings;

/// An every-second rule whose exclusions keep one second in five hours, with a jitter: checking
/// its jitter would walk 500 occurrences of about 18,000 candidates each.
const POISON: &str = "* * * * * * except 1-59 * * * * * except * 1-59 * * * * \
                      except * * 1-4,6-9,11-14,16-19,21-23 * * * jitter 1s";

/// How long after a failed write (a restart, a terminated connection) the fault tries again.
const RETRY: Duration = Duration::from_secs(1);

/// How long after the chaos ends the poison routine may still be set aside.
const SET_ASIDE_AFTER_THE_CHAOS: Duration = Duration::from_secs(30);

/// What the fault saw of the poison routine when the chaos ended.
#[derive(Debug, Clone, Default)]
struct Seen {
    paused: bool,
    reason: Option<String>,
    /// Seconds from its writing to its last change (its setting aside, once paused).
    set_aside_after: Option<f64>,
    fires: i64,
    /// The other routines' fires since the poison was written, and their lateness p99 in ms.
    others: i64,
    p99_ms: Option<f64>,
}

pub(in crate::chaos) struct Poison {
    at: Instant,
    /// After this it gives up writing (the run's check then says so).
    give_up: Instant,
    written: Option<(Uuid, DateTime<Utc>, Instant)>,
    done: bool,
    seen: Option<Seen>,
    error: Option<String>,
}

impl Poison {
    pub fn new(start: Instant, duration: Duration) -> Self {
        Poison {
            at: start + duration / 3,
            give_up: start + duration * 2 / 3,
            written: None,
            done: false,
            seen: None,
            error: None,
        }
    }

    /// Writes the poison routine; its id and when (the database's clock).
    fn write(chaos: &Chaos<'_>) -> anyhow::Result<(Uuid, DateTime<Utc>)> {
        Ok(chaos.rt.block_on(
            sqlx::query_as("SELECT cm.create_routine('chaos-poison', $1, 'UTC', 'never'), now()")
                .bind(POISON)
                .fetch_one(&chaos.pool),
        )?)
    }

    /// Reads back the poison routine and the other routines' lateness since it was written.
    fn look(chaos: &Chaos<'_>, poison: Uuid, since: DateTime<Utc>) -> anyhow::Result<Seen> {
        let (paused, reason, set_aside_after): (bool, Option<String>, Option<f64>) =
            chaos.rt.block_on(
                sqlx::query_as(
                    "SELECT paused, paused_reason,
                            extract(epoch FROM updated_at - $2)::float8
                     FROM cm.routines WHERE id = $1",
                )
                .bind(poison)
                .bind(since)
                .fetch_one(&chaos.pool),
            )?;
        let (fires, others, p99_ms): (i64, i64, Option<f64>) = chaos.rt.block_on(
            sqlx::query_as(
                "SELECT count(*) FILTER (WHERE routine_id = $1),
                        count(*) FILTER (WHERE routine_id <> $1),
                        (percentile_cont(0.99) WITHIN GROUP (
                            ORDER BY extract(epoch FROM first_claimed_at - scheduled_at)::float8)
                         FILTER (WHERE routine_id <> $1))::float8 * 1000
                 FROM cm.routine_fires WHERE scheduled_at >= $2",
            )
            .bind(poison)
            .bind(since)
            .fetch_one(&chaos.pool),
        )?;
        Ok(Seen {
            paused,
            reason,
            set_aside_after,
            fires,
            others,
            p99_ms,
        })
    }
}

impl Fault for Poison {
    fn next_at(&self) -> Option<Instant> {
        (!self.done).then_some(self.at)
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        let now = Instant::now();
        if now < chaos.quiet_until {
            self.at = chaos.quiet_until;
            return Ok(());
        }
        match Poison::write(chaos) {
            Ok((id, at)) => {
                chaos.say(format!(
                    "wrote a routine too costly to check through cm.create_routine ({id})"
                ));
                self.written = Some((id, at, now));
                self.done = true;
            }
            Err(e) if now < self.give_up => {
                chaos.say(format!("could not write the poison routine yet: {e}"));
                self.at = now + RETRY;
            }
            Err(e) => {
                self.error = Some(e.to_string());
                self.done = true;
            }
        }
        Ok(())
    }

    fn heal(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        let Some((id, since, _)) = self.written else {
            return Ok(());
        };
        // The schedulers still run: a planning pass the run's kills and outages kept cutting
        // short (the SIGKILLs can hit the one process whose groups hold the routine several
        // times in a row) is given a while longer to set it aside, as the drain is.
        let deadline = Instant::now() + SET_ASIDE_AFTER_THE_CHAOS;
        loop {
            match Poison::look(chaos, id, since) {
                Ok(seen) => {
                    let done = seen.paused && seen.reason.is_some();
                    self.seen = Some(seen);
                    if done || Instant::now() >= deadline {
                        break;
                    }
                }
                Err(e) => {
                    self.error = Some(format!("could not read the poison routine back: {e}"));
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Ok(())
    }

    fn findings(&self) -> Findings {
        let mut f = Findings::default();
        let Some(seen) = &self.seen else {
            let why = self
                .error
                .clone()
                .unwrap_or_else(|| "the poison routine was never written".to_string());
            f.line("poison routine", why.clone());
            f.require(true, || format!("poison routine: {why}"));
            return f;
        };
        let written = self
            .written
            .map(|(_, _, at)| at.elapsed().as_secs_f64())
            .unwrap_or_default();
        f.line(
            "poison routine",
            format!(
                "written through SQL {written:.0} s before the report; {}; its fires: {}",
                match (&seen.paused, &seen.reason) {
                    (true, Some(reason)) => format!(
                        "set aside {:.1} s after it was written: {reason}",
                        seen.set_aside_after.unwrap_or_default()
                    ),
                    _ => format!(
                        "NOT set aside {} s after the chaos",
                        SET_ASIDE_AFTER_THE_CHAOS.as_secs()
                    ),
                },
                seen.fires
            ),
        );
        f.line(
            "poison: others",
            format!(
                "{} fires of the other routines since it was written, lateness p99 {}",
                seen.others,
                seen.p99_ms
                    .map_or("n/a".to_string(), |ms| format!("{ms:.0} ms"))
            ),
        );
        f.require(!seen.paused || seen.reason.is_none(), || {
            format!(
                "poison routine: not set aside (paused with its reason) {} s after the chaos",
                SET_ASIDE_AFTER_THE_CHAOS.as_secs()
            )
        });
        f.require(seen.fires > 0, || {
            format!("poison routine: {} fires were written for it", seen.fires)
        });
        f.require(seen.others == 0, || {
            "poison routine: no other routine fired after it was written".to_string()
        });
        f
    }
}
