//! `--terminate-backends N`: every connection to the chaos database but the run's own is cut
//! with `pg_terminate_backend`, N times spread evenly: what an operator's kill or a proxy's
//! reset looks like to a client.

use std::time::{Duration, Instant};

use sqlx::postgres::PgPool;

use super::{Chaos, Fault, OWN_APPLICATION};
use crate::chaos::report::Findings;

pub(in crate::chaos) struct Terminations {
    plan: Vec<Instant>,
    cut: Vec<i64>,
}

impl Terminations {
    pub fn new(start: Instant, duration: Duration, count: u32) -> Self {
        Terminations {
            plan: plan(duration, count)
                .into_iter()
                .map(|d| start + d)
                .collect(),
            cut: Vec::new(),
        }
    }
}

/// When, after the start of the chaos, the connections are terminated: spread evenly, at a
/// quarter and three quarters of the run for two.
pub(in crate::chaos) fn plan(duration: Duration, count: u32) -> Vec<Duration> {
    (0..count)
        .map(|i| duration * (2 * i + 1) / (2 * count))
        .collect()
}

/// `pg_terminate_backend` on every connection to the chaos database that is not the run's
/// own. Returns how many were cut.
pub(in crate::chaos) async fn terminate_others(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
         FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND application_name NOT LIKE $1 || '%'",
    )
    .bind(OWN_APPLICATION)
    .fetch_one(pool)
    .await?)
}

impl Fault for Terminations {
    fn next_at(&self) -> Option<Instant> {
        self.plan.get(self.cut.len()).copied()
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        let cut = chaos.rt.block_on(terminate_others(&chaos.pool))?;
        chaos.say(format!(
            "pg_terminate_backend cut {cut} connections to the chaos database"
        ));
        self.cut.push(cut);
        Ok(())
    }

    fn findings(&self) -> Findings {
        Findings::one(
            "backends cut",
            format!(
                "{} pg_terminate_backend passes ({} connections)",
                self.cut.len(),
                self.cut.iter().sum::<i64>()
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_cuts_fall_at_a_quarter_and_three_quarters() {
        assert_eq!(
            plan(Duration::from_secs(40), 2),
            [Duration::from_secs(10), Duration::from_secs(30)]
        );
        assert!(plan(Duration::from_secs(40), 0).is_empty());
    }
}
