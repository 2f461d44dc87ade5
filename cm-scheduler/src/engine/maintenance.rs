//! The passes beside the ticks over the groups this scheduler maintains: planning the
//! routines written through SQL, pruning what is past the retention, and the frame every such
//! pass runs in (every group at once, or each leased group on its own).

use std::future::Future;
use std::time::{Duration, Instant};

use cm_store::{GroupId, StoreError};
use tracing::{debug, error, info};

use super::{GROUP_WIDTH, Scheduler};
use crate::counters::add;
use crate::outages::each_group;

/// How many rows one prune statement deletes (settled fires, or acknowledged outbox messages).
/// Measured by `cargo xtask scale` (docs/BENCHMARKS.md, "Scale"): a batch of this size is
/// deleted in a fraction of a second, and batches repeat while they come back full, so a pass
/// deletes far more rows a second than the engine fires.
pub const PRUNE_BATCH: u32 = 10_000;

impl Scheduler {
    /// One planning pass (see [`Scheduler::with_planning`]) over the groups this scheduler
    /// maintains; whether it succeeded. A failure is logged and kept for health like a failed
    /// tick, and the next pass tries again.
    pub(super) async fn plan(&self) -> bool {
        let Some(store) = &self.planning else {
            return true;
        };
        self.maintain("planning routines written through SQL", |group| {
            self.plan_in(store.as_ref(), group)
        })
        .await
    }

    /// Plans the routines written through SQL in `group` (every group: `None`).
    async fn plan_in(
        &self,
        store: &dyn cm_store::UnplannedRoutines,
        group: Option<GroupId>,
    ) -> Result<(), StoreError> {
        for routine in store.plan_routines(group, cm_store::PLAN_BATCH).await? {
            match &routine.refused {
                None => {
                    add(&self.stats.planned, 1);
                    info!(routine = %routine.name, routine_id = %routine.id,
                        next_run_at = ?routine.next_run_at, "planned a routine written through SQL");
                }
                Some(reason) => {
                    add(&self.stats.refused_at_planning, 1);
                    error!(routine = %routine.name, routine_id = %routine.id, %reason,
                        "paused a routine written through SQL: it cannot be planned");
                }
            }
        }
        Ok(())
    }

    /// Runs the maintenance pass `run` across every group at once (`None`), its failure logged
    /// and kept for health, or, claiming per group, in each group this scheduler leases,
    /// [`GROUP_WIDTH`] side by side, each group's failure on its own (`outages.rs`). Returns
    /// whether it succeeded everywhere.
    pub(super) async fn maintain<F, Fut>(&self, pass: &'static str, run: F) -> bool
    where
        F: Fn(Option<GroupId>) -> Fut,
        Fut: Future<Output = Result<(), StoreError>>,
    {
        match self.maintained_groups().await {
            None => match run(None).await {
                Ok(()) => true,
                Err(e) => {
                    error!(error = %e, "{pass} failed");
                    self.stats.tick_failed(format!("{pass} failed: {e}"));
                    false
                }
            },
            Some(groups) => each_group(
                &self.outages,
                &self.stats,
                pass,
                &groups,
                GROUP_WIDTH,
                |group| run(Some(group)),
            )
            .await
            .is_ok_and(|done| done.len() == groups.len()),
        }
    }

    /// Deletes acknowledged outbox messages, settled fires and events older than the retention, in
    /// batches of [`PRUNE_BATCH`] repeated while they come back full, so what is deleted keeps up
    /// with what is written however fast the engine fires. A pass stops after a quarter of the
    /// lease (the outbox's share at most half of that; per group, each group's share of it), so
    /// it never holds the maintenance loop for long. Returns whether the pass succeeded.
    pub(super) async fn prune(&self) -> bool {
        let budget = self.config.lease.duration() / 4;
        let held = self.groups.as_ref().map_or(1, |leases| leases.held().len());
        let rounds = u32::try_from(held.div_ceil(GROUP_WIDTH).max(1)).unwrap_or(u32::MAX);
        let share = match self.maintained_groups().await {
            None => budget,
            Some(_) => budget / rounds,
        };
        self.maintain("pruning", |group| self.prune_in(group, share))
            .await
    }

    /// One prune pass in `group` (every group: `None`) within `budget`.
    async fn prune_in(&self, group: Option<GroupId>, budget: Duration) -> Result<(), StoreError> {
        let started = Instant::now();
        let retention = self.config.retention;
        if let Some(outbox) = &self.outbox {
            let pruned = prune_in_batches(budget / 2, || async {
                match group {
                    None => outbox.outbox_prune_acked(retention, PRUNE_BATCH).await,
                    Some(g) => {
                        outbox
                            .outbox_prune_acked_in(g, retention, PRUNE_BATCH)
                            .await
                    }
                }
            })
            .await?;
            if pruned > 0 {
                debug!(
                    pruned,
                    ?group,
                    "pruned acknowledged outbox messages past their retention"
                );
            }
        }
        let left = budget.saturating_sub(started.elapsed());
        let pruned = prune_in_batches(left, || async {
            let pruned = match group {
                None => self.ledger.prune_settled(retention, PRUNE_BATCH).await?,
                Some(g) => {
                    self.ledger
                        .prune_settled_in(g, retention, PRUNE_BATCH)
                        .await?
                }
            };
            add(&self.stats.pruned, pruned);
            Ok(pruned)
        })
        .await?;
        if pruned > 0 {
            debug!(pruned, ?group, "pruned settled fires past their retention");
        }
        if let Some(events) = &self.events {
            let left = budget.saturating_sub(started.elapsed());
            let deleted = prune_in_batches(left, || async {
                match group {
                    None => events.log.prune_events(retention, PRUNE_BATCH).await,
                    Some(g) => events.log.prune_events_in(g, retention, PRUNE_BATCH).await,
                }
            })
            .await?;
            if deleted > 0 {
                debug!(deleted, ?group, "pruned events past their retention");
            }
        }
        Ok(())
    }

    /// The groups this scheduler's maintenance (prunes, the automatic pause, planning, the
    /// run watch) covers: those it leases, each on its own; or every group at once (`None`)
    /// without group claims.
    pub(super) async fn maintained_groups(&self) -> Option<Vec<GroupId>> {
        match &self.groups {
            Some(leases) if leases.per_group().await.unwrap_or(true) => Some(leases.held()),
            _ => None,
        }
    }
}

/// Runs `batch` (one prune statement of at most [`PRUNE_BATCH`] rows) until one comes back short
/// or `budget` has passed. Returns how many rows the batches deleted.
async fn prune_in_batches<F, Fut>(budget: Duration, mut batch: F) -> Result<u64, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u64, StoreError>>,
{
    let started = Instant::now();
    let mut total = 0;
    loop {
        let pruned = batch().await?;
        total += pruned;
        if pruned < u64::from(PRUNE_BATCH) || started.elapsed() >= budget {
            return Ok(total);
        }
    }
}
