//! `--shard-moves N` (Citus): N shards of the first worker moved to the second with
//! `citus_move_shard_placement(..., shard_transfer_mode => 'block_writes')`, one after another,
//! while the schedulers run: each move blocks the writes to its shard until it is done. A
//! claim waiting on a moving shard must delay only its own group: the lateness (claimed minus
//! scheduled) of the fires in the groups that stay on the second worker over the moves is
//! measured, and a p99 of [`MAX_P99`] or more fails the run.
//!
//! As for the worker outage, no SIGKILL comes from a group lease and a margin before the
//! moves until they are over.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::worker::{QUIET_BEFORE, groups_on};
use super::{Chaos, Fault};
use crate::chaos::postgres::Cluster;
use crate::chaos::report::Findings;

/// The highest p99 lateness allowed in the groups that do not move.
pub(in crate::chaos) const MAX_P99: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct Outcome {
    moves: Vec<Duration>,
    /// Fires in the groups that stayed, and their lateness p99 and max.
    fires: usize,
    p99: Duration,
    max: Duration,
    /// The same over the moved groups.
    moved_fires: usize,
    moved_p99: Duration,
}

pub(in crate::chaos) struct ShardMoves {
    from: Cluster,
    to: Cluster,
    count: u32,
    at: Instant,
    quiet: bool,
    outcome: Option<Outcome>,
}

impl ShardMoves {
    /// `count` moves from `from` to `to`, the quiet time beginning a third of the way into the
    /// run from `start`.
    pub fn new(from: Cluster, to: Cluster, count: u32, start: Instant, duration: Duration) -> Self {
        ShardMoves {
            from,
            to,
            count,
            at: start + duration / 3,
            quiet: false,
            outcome: None,
        }
    }

    fn moves(&self, chaos: &mut Chaos<'_>) -> anyhow::Result<Outcome> {
        let host = url::Url::parse(&chaos.server_url)?
            .host_str()
            .unwrap_or("127.0.0.1")
            .to_string();
        let shards: Vec<i64> = chaos.rt.block_on(
            sqlx::query_scalar(
                "SELECT s.shardid FROM pg_dist_shard s
                 JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n USING (groupid)
                 WHERE s.logicalrelid = 'cm.routines'::regclass AND n.nodeport = $1
                 ORDER BY s.shardid LIMIT $2",
            )
            .bind(i32::from(self.from.port))
            .bind(i64::from(self.count))
            .fetch_all(&chaos.pool),
        )?;
        let moving: BTreeSet<i16> = chaos
            .rt
            .block_on(
                sqlx::query_scalar(
                    "SELECT g::smallint FROM cm.cm_settings, generate_series(0, group_count - 1) AS g
                 WHERE get_shard_id_for_distribution_column('cm.routines', g::smallint) = ANY($1)",
                )
                .bind(&shards)
                .fetch_all(&chaos.pool),
            )?
            .into_iter()
            .collect();
        let staying = chaos.rt.block_on(groups_on(&chaos.pool, self.to.port))?;
        let from_at = chaos.db_now()?;
        let mut moves = Vec::new();
        for shard in &shards {
            let began = Instant::now();
            chaos.rt.block_on(
                sqlx::query(
                    "SELECT citus_move_shard_placement($1, $2, $3, $2, $4,
                         shard_transfer_mode => 'block_writes')",
                )
                .bind(shard)
                .bind(&host)
                .bind(i32::from(self.from.port))
                .bind(i32::from(self.to.port))
                .execute(&chaos.pool),
            )?;
            moves.push(began.elapsed());
            chaos.say(format!(
                "shard {shard} moved to {} in {:.2?} (block_writes)",
                self.to,
                began.elapsed()
            ));
        }
        let to_at = chaos.db_now()?;
        let rows: Vec<(i16, f64)> = chaos.rt.block_on(
            sqlx::query_as(
                "SELECT group_id, extract(epoch FROM claimed_at - scheduled_at)::float8
                 FROM cm.routine_fires WHERE scheduled_at BETWEEN $1 AND $2",
            )
            .bind(from_at)
            .bind(to_at)
            .fetch_all(&chaos.pool),
        )?;
        let lateness = |groups: &BTreeSet<i16>| {
            let mut late: Vec<Duration> = rows
                .iter()
                .filter(|(g, _)| groups.contains(g))
                .map(|(_, s)| Duration::from_secs_f64(s.max(0.0)))
                .collect();
            late.sort_unstable();
            let p99 = late
                .get((late.len() * 99 / 100).min(late.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default();
            (late.len(), p99, late.last().copied().unwrap_or_default())
        };
        let (fires, p99, max) = lateness(&staying);
        let (moved_fires, moved_p99, _) = lateness(&moving);
        Ok(Outcome {
            moves,
            fires,
            p99,
            max,
            moved_fires,
            moved_p99,
        })
    }
}

impl Fault for ShardMoves {
    fn next_at(&self) -> Option<Instant> {
        self.outcome.is_none().then_some(self.at)
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        if !self.quiet {
            chaos.say(format!(
                "no SIGKILL from now until the shard moves are over (they begin in {} s)",
                QUIET_BEFORE.as_secs()
            ));
            self.at = Instant::now() + QUIET_BEFORE;
            // Moves are blocking calls of this loop: no kill comes during them anyway.
            chaos.quiet_until = self.at + Duration::from_secs(2);
            self.quiet = true;
            return Ok(());
        }
        let outcome = self.moves(chaos)?;
        chaos.say(format!("shard moves: {outcome:?}"));
        self.outcome = Some(outcome);
        chaos.quiet_until = Instant::now() + Duration::from_secs(1);
        Ok(())
    }

    fn findings(&self) -> Findings {
        let mut f = Findings::default();
        let Some(o) = &self.outcome else {
            f.line("shard moves", "did not happen".to_string());
            f.require(true, || {
                "the shard moves did not happen: lengthen --duration".to_string()
            });
            return f;
        };
        let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
        f.line(
            "shard moves",
            format!(
                "{} block_writes moves ({}): lateness in the groups left in place p99 {}, max {} \
                 ({} fires); in the moved groups p99 {} ({} fires)",
                o.moves.len(),
                o.moves
                    .iter()
                    .map(|d| secs(*d))
                    .collect::<Vec<_>>()
                    .join(", "),
                secs(o.p99),
                secs(o.max),
                o.fires,
                secs(o.moved_p99),
                o.moved_fires
            ),
        );
        f.require(o.fires == 0, || {
            "no fire in the groups left in place during the moves: give more --routines".into()
        });
        f.require(o.p99 >= MAX_P99, || {
            format!(
                "lateness p99 {} in the groups the moves left in place (at most {} allowed)",
                secs(o.p99),
                secs(MAX_P99)
            )
        });
        f
    }
}
