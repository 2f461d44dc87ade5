//! `--worker-outage SECONDS` (Citus): the first worker stopped for that long, once, while the
//! schedulers run. The routine groups whose shards are on the other workers must keep firing:
//! each one's longest gap between fires across the outage is measured, and a gap of
//! [`MAX_GAP`] or more fails the run. The worker's own groups fire nothing meanwhile, and
//! again soon after it is back.
//!
//! No SIGKILL comes from a group lease and a margin before the outage until it is over: a
//! scheduler killed just before would leave its groups to wait out its leases, a gap of the
//! takeover's (measured by the whole-process test), not of the outage's.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::{Chaos, Fault};
use crate::chaos::postgres::{self, Cluster};
use crate::chaos::report::Findings;

/// The longest a group on a worker that stays up may go without a fire during the outage:
/// its routines fire every second.
pub(in crate::chaos) const MAX_GAP: Duration = Duration::from_secs(2);

/// How long before the outage the kills stop: the schedulers' default group lease (15 s) and a
/// margin, so every group has a live holder or is free when the worker stops.
pub(in crate::chaos) const QUIET_BEFORE: Duration = Duration::from_secs(18);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Quiet,
    Stop,
    Start,
    Done,
}

/// What the outage did to the groups.
#[derive(Debug)]
struct Outcome {
    node: String,
    length: Duration,
    /// The groups on the other workers that have routines, and their fires during it.
    other_groups: usize,
    other_fires: usize,
    /// The longest gap between fires of one of them (from the stop to its first fire, between
    /// fires, from its last fire to the start), and its group.
    longest: Option<(i16, Duration)>,
    /// The stopped worker's groups that have routines, and their fires during it.
    own_groups: usize,
    own_fires: usize,
    /// From the start to the first fire in the stopped worker's groups.
    own_back_after: Option<Duration>,
}

pub(in crate::chaos) struct WorkerOutage {
    cluster: Cluster,
    length: Duration,
    phase: Phase,
    at: Instant,
    /// The database's clock when the worker was stopped, and its groups.
    stopped: Option<(DateTime<Utc>, BTreeSet<i16>)>,
    outcome: Option<Outcome>,
}

impl WorkerOutage {
    /// The outage of `cluster` (the first worker) for `length`, its quiet time beginning a
    /// third of the way into the run from `start`.
    pub fn new(cluster: Cluster, start: Instant, duration: Duration, length: Duration) -> Self {
        WorkerOutage {
            cluster,
            length,
            phase: Phase::Quiet,
            at: start + duration / 3,
            stopped: None,
            outcome: None,
        }
    }
}

/// The groups whose shards are on the worker listening on `port`, from the coordinator's
/// metadata (which answers while the worker is down).
pub(in crate::chaos) async fn groups_on(
    pool: &sqlx::PgPool,
    port: u16,
) -> anyhow::Result<BTreeSet<i16>> {
    let groups: Vec<i16> = sqlx::query_scalar(
        "SELECT g::smallint FROM cm.cm_settings, generate_series(0, group_count - 1) AS g
         WHERE EXISTS (
             SELECT 1 FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
             WHERE p.shardid = get_shard_id_for_distribution_column('cm.routines', g::smallint)
               AND n.nodeport = $1)",
    )
    .bind(i32::from(port))
    .fetch_all(pool)
    .await?;
    Ok(groups.into_iter().collect())
}

/// The longest gap of each group in `fires` (settle instants by group) over `[from, to]`.
fn longest_gaps(
    fires: &BTreeMap<i16, Vec<DateTime<Utc>>>,
    groups: &BTreeSet<i16>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> BTreeMap<i16, Duration> {
    groups
        .iter()
        .map(|group| {
            let mut edges = vec![from];
            edges.extend(fires.get(group).into_iter().flatten().copied());
            edges.push(to);
            let longest = edges
                .windows(2)
                .map(|w| (w[1] - w[0]).to_std().unwrap_or_default())
                .max()
                .unwrap_or_default();
            (*group, longest)
        })
        .collect()
}

impl Fault for WorkerOutage {
    fn next_at(&self) -> Option<Instant> {
        (self.phase != Phase::Done).then_some(self.at)
    }

    fn act(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        match self.phase {
            Phase::Quiet => {
                chaos.say(format!(
                    "no SIGKILL from now until the worker outage is over (it begins in {} s)",
                    QUIET_BEFORE.as_secs()
                ));
                self.at = Instant::now() + QUIET_BEFORE;
                chaos.quiet_until = self.at + self.length + Duration::from_secs(2);
                self.phase = Phase::Stop;
            }
            Phase::Stop => {
                let groups = chaos
                    .rt
                    .block_on(groups_on(&chaos.pool, self.cluster.port))?;
                let now = chaos.db_now()?;
                chaos.say(format!(
                    "worker {} (port {}, {} groups) stopped for {} s",
                    self.cluster,
                    self.cluster.port,
                    groups.len(),
                    self.length.as_secs()
                ));
                self.cluster.ctl("stop", &[])?;
                self.stopped = Some((now, groups));
                self.at = Instant::now() + self.length;
                // Stopping a worker can take seconds on a busy machine: the kills stay off
                // until it is back, whenever that is.
                chaos.quiet_until = chaos.quiet_until.max(self.at + Duration::from_secs(2));
                self.phase = Phase::Start;
            }
            Phase::Start => {
                let Some((from, own)) = self.stopped.take() else {
                    anyhow::bail!("the worker outage ends without having begun");
                };
                let to = chaos.db_now()?;
                self.cluster.start()?;
                let url = self.cluster.url(&chaos.server_url)?;
                postgres::wait_for(chaos.rt, &url, Duration::from_secs(30))?;
                chaos.say(format!("worker {} answers again", self.cluster));
                let back = Instant::now();
                let rows: Vec<(i16, DateTime<Utc>)> = chaos.rt.block_on(
                    sqlx::query_as(
                        "SELECT group_id, completed_at FROM cm.routine_fires
                         WHERE completed_at BETWEEN $1 AND $2 ORDER BY completed_at",
                    )
                    .bind(from)
                    .bind(to)
                    .fetch_all(&chaos.pool),
                )?;
                let with_routines: BTreeSet<i16> = chaos
                    .rt
                    .block_on(
                        // The groups of the run's every-second routines: not the toggler's
                        // yearly routine nor the poison routine, which never fire, nor a
                        // `--retries` run's five-second ones.
                        sqlx::query_scalar(
                            "SELECT DISTINCT group_id FROM cm.routines
                             WHERE name ~ '^chaos [0-9]+$' AND schedule = '* * * * * *'",
                        )
                        .fetch_all(&chaos.pool),
                    )?
                    .into_iter()
                    .collect();
                let mut fires: BTreeMap<i16, Vec<DateTime<Utc>>> = BTreeMap::new();
                for (group, at) in rows {
                    fires.entry(group).or_default().push(at);
                }
                let others: BTreeSet<i16> = with_routines.difference(&own).copied().collect();
                let mine: BTreeSet<i16> = with_routines.intersection(&own).copied().collect();
                let gaps = longest_gaps(&fires, &others, from, to);
                let count = |groups: &BTreeSet<i16>| {
                    groups
                        .iter()
                        .map(|g| fires.get(g).map_or(0, Vec::len))
                        .sum::<usize>()
                };
                // The stopped worker's groups fire again once it is back: how soon.
                let mut own_back_after = None;
                while back.elapsed() < Duration::from_secs(30) && !mine.is_empty() {
                    let first: Option<DateTime<Utc>> = chaos.rt.block_on(
                        sqlx::query_scalar(
                            "SELECT min(completed_at) FROM cm.routine_fires
                             WHERE completed_at > $1 AND group_id = ANY($2)",
                        )
                        .bind(to)
                        .bind(mine.iter().copied().collect::<Vec<_>>())
                        .fetch_one(&chaos.pool),
                    )?;
                    if let Some(first) = first {
                        own_back_after = Some((first - to).to_std().unwrap_or_default());
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                let outcome = Outcome {
                    node: format!("{} (port {})", self.cluster, self.cluster.port),
                    length: (to - from).to_std().unwrap_or_default(),
                    other_groups: others.len(),
                    other_fires: count(&others),
                    longest: gaps.iter().max_by_key(|(_, d)| **d).map(|(g, d)| (*g, *d)),
                    own_groups: mine.len(),
                    own_fires: count(&mine),
                    own_back_after,
                };
                chaos.say(format!("worker outage: {outcome:?}"));
                self.outcome = Some(outcome);
                chaos.quiet_until = Instant::now() + Duration::from_secs(1);
                self.phase = Phase::Done;
            }
            Phase::Done => {}
        }
        Ok(())
    }

    fn heal(&mut self, chaos: &mut Chaos<'_>) -> anyhow::Result<()> {
        if self.phase == Phase::Start {
            self.cluster.start()?;
            let url = self.cluster.url(&chaos.server_url)?;
            postgres::wait_for(chaos.rt, &url, Duration::from_secs(30))?;
        }
        Ok(())
    }

    fn findings(&self) -> Findings {
        let mut f = Findings::default();
        let Some(o) = &self.outcome else {
            f.line("worker outage", "did not happen".to_string());
            f.require(true, || {
                "the worker outage did not happen: lengthen --duration".to_string()
            });
            return f;
        };
        let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
        f.line(
            "worker outage",
            format!(
                "{} down {}: {} groups on the other workers fired {} times, longest gap {}; its \
                 own {} groups fired {} times, again {} after it was back",
                o.node,
                secs(o.length),
                o.other_groups,
                o.other_fires,
                o.longest.map_or("none".to_string(), |(g, d)| format!(
                    "{} (group {g})",
                    secs(d)
                )),
                o.own_groups,
                o.own_fires,
                o.own_back_after.map_or("never".to_string(), secs),
            ),
        );
        f.require(o.other_groups == 0, || {
            "no group with routines is on the other workers: give more --routines".to_string()
        });
        if let Some((group, gap)) = o.longest {
            f.require(gap >= MAX_GAP, || {
                format!(
                    "group {group}, on a worker that stayed up, went {} without a fire during \
                     the outage (at most {} allowed)",
                    secs(gap),
                    secs(MAX_GAP)
                )
            });
        }
        f.require(o.own_back_after.is_none() && o.own_groups > 0, || {
            "the stopped worker's groups did not fire within 30 s of its return".to_string()
        });
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_counts_from_the_outage_edges_and_between_fires() {
        let at = |s: i64| DateTime::<Utc>::from_timestamp(1_700_000_000 + s, 0).unwrap();
        let fires = BTreeMap::from([(1, vec![at(1), at(2), at(5)]), (2, vec![])]);
        let gaps = longest_gaps(&fires, &BTreeSet::from([1, 2]), at(0), at(6));
        assert_eq!(gaps[&1], Duration::from_secs(3));
        assert_eq!(gaps[&2], Duration::from_secs(6));
    }
}
