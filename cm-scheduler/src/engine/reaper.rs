//! The reaper: claims whose lease ran out (their claimant crashed) taken over and dispatched
//! again, or abandoned after too many attempts.

use std::sync::Arc;

use cm_store::{GroupId, ReapParams};
use tokio::task::JoinSet;
use tracing::{info, warn};

use super::claimed::timed_claim;
use super::fire_job::FireResult;
use super::room::Places;
use super::{GROUP_WIDTH, Scheduler, TickError, TickReport, collect};
use crate::completer::Completer;
use crate::counters::add;
use crate::outages::each_group;

impl Scheduler {
    /// Takes over expired claims and starts their dispatches: across every group at once, or,
    /// claiming per group, in each group a tick claims in.
    pub(super) async fn reap_and_start(
        &self,
        completer: &Arc<dyn Completer>,
        wait: Option<&mut JoinSet<FireResult>>,
    ) -> Result<TickReport, TickError> {
        let Some(groups) = self.claim_groups().await.map_err(TickError::Claim)? else {
            return self.reap_group(completer, wait, None).await;
        };
        // In the groups a tick claims in, side by side: a crashed scheduler's claims are taken
        // over in the groups it held once its group leases run out (they are shorter than a
        // claim's lease by default).
        let waiting = wait.is_some();
        let reaped = each_group(
            &self.outages,
            &self.stats,
            "reaper pass",
            &groups,
            GROUP_WIDTH,
            |group| async move {
                let mut own = JoinSet::new();
                let mut report = self
                    .reap_group(completer, waiting.then_some(&mut own), Some(group))
                    .await
                    .map_err(TickError::into_store)?;
                collect(&mut own, &mut report).await;
                Ok(report)
            },
        )
        .await
        .map_err(TickError::Claim)?;
        let mut total = TickReport::default();
        for report in &reaped {
            total.add(report);
        }
        Ok(total)
    }

    /// One reaper pass in `group` (every group: `None`).
    async fn reap_group(
        &self,
        completer: &Arc<dyn Completer>,
        wait: Option<&mut JoinSet<FireResult>>,
        group: Option<GroupId>,
    ) -> Result<TickReport, TickError> {
        // Every claim taken over is dispatched: a place for each, held from before the pass.
        let places = Places::take(&self.room, self.config.max_fires_per_tick.get());
        let limit = places.len();
        if limit == 0 {
            return Ok(TickReport::default());
        }
        let params = ReapParams {
            claimant: self.instance_id.clone(),
            lease: self.config.lease,
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
            group,
        };
        let (claim, window) = timed_claim(self.ledger.reap_expired(&params)).await?;
        // A retry a routine's retry policy made is taken over as its lease runs out too, but
        // it is no crashed claim: counted when it was decided (`retrying`), not here.
        let retries = claim
            .fires
            .iter()
            .filter(|f| f.retry > 0 && f.retry_began == f.row.attempt)
            .count();
        add(&self.stats.reaped, (claim.fires.len() - retries) as u64);
        for fire in &claim.fires {
            if fire.retry > 0 && fire.retry_began == fire.row.attempt {
                // Its last attempt failed and its routine's retry policy tries it again now.
                info!(
                    routine = %fire.occurrence.routine_id,
                    scheduled_at = %fire.occurrence.scheduled_at,
                    attempt = fire.row.attempt,
                    retry = fire.retry,
                    "retrying after a failed attempt"
                );
            } else {
                warn!(
                    routine = %fire.occurrence.routine_id,
                    scheduled_at = %fire.occurrence.scheduled_at,
                    attempt = fire.row.attempt,
                    "took over an expired claim (its claimant stopped before settling)"
                );
            }
        }
        Ok(self.start(claim, window, completer, wait, places).await)
    }
}
