//! The drain: a tick's claims, each followed at once by another while it comes back full,
//! resumed after it in the due index, with batches that grow while they do; and how many
//! routines each claim locks to fill its batch.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use cm_domain::{FireCap, MisfireRules};
use cm_store::{ClaimDueParams, DueCursor, GroupId, TickClaim};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{debug, warn};

use super::claimed::timed_claim;
use super::fire_job::FireResult;
use super::room::ClaimRoom;
use super::{GROUP_WIDTH, Scheduler, TickError, TickReport, collect};
use crate::completer::Completer;
use crate::counters::add;
use crate::outages::each_group;

/// The largest batch one claim of a drain takes (or the cap, if larger). A tick's first claim
/// takes the cap, or twice what the previous tick claimed if that was more than the cap (up to
/// this bound); each claim that comes back full multiplies the next one's batch by
/// [`DRAIN_BATCH_GROWTH`] up to this bound, so a burst is drained in transactions large enough
/// to keep the database busy (measured in docs/BENCHMARKS.md, "Fast by default") while each
/// stays short: a claim of this many occurrences commits in tens of milliseconds.
pub const DRAIN_BATCH_LIMIT: usize = 1_000;

/// How much each claim of a drain that comes back full grows the next one's batch: from the
/// default cap of 25 the batches are 25, 100, 400 and then [`DRAIN_BATCH_LIMIT`], the fourth
/// claim, where doubling reached it at the seventh, each claim paying its round trips and its
/// commit: on a 2-core machine a claim of 25 took about 14 ms and one of 100 about 24 ms
/// (docs/BENCHMARKS.md, "The ledger without its foreign key").
pub const DRAIN_BATCH_GROWTH: usize = 4;

/// A tick's first claim takes this many times what the previous tick claimed: with two
/// processes sharing a load due every second, each one's share moves from second to second
/// (whichever starts its claim first locks more), and a first claim of about last second's
/// share left what was over it to a second claim, a whole claim later: 1 to 5 % of the
/// occurrences 50 to 140 ms late, the every-second lateness p99 (docs/BENCHMARKS.md, "The
/// ledger without its foreign key"). A claim is still bounded by [`DRAIN_BATCH_LIMIT`].
const FIRST_BATCH_HEADROOM: usize = 2;

/// How one lane of a drain starts.
struct LaneStart {
    /// Its first claim's batch.
    batch: usize,
    /// Where the first lane opens the others, at its first claim that comes back full.
    open: Option<watch::Sender<Option<usize>>>,
    /// Whether it is the first lane, the only one that claims the missions this process
    /// launches.
    first: bool,
}

/// What one lane of a drain did: its report, how many occurrences its last claim deferred, and
/// how many it claimed.
#[derive(Default)]
struct Lane {
    report: TickReport,
    deferred: usize,
    claimed: usize,
}

/// How the drain sizes its claims, carried from one claim (and tick) to the next.
#[derive(Debug)]
pub(super) struct DrainPace {
    /// How many occurrences each routine of the last claim that fired gave, on average (at
    /// least one): how many routines the next claim locks to fill its batch.
    owed_per_routine: AtomicUsize,
    /// What the last tick claimed: when that is more than the cap, the next tick's first claim
    /// takes twice as many, up to [`DRAIN_BATCH_LIMIT`] (see [`Scheduler::drain`]).
    first_batch: AtomicUsize,
}

impl Default for DrainPace {
    fn default() -> Self {
        DrainPace {
            owed_per_routine: AtomicUsize::new(1),
            first_batch: AtomicUsize::new(0),
        }
    }
}

impl Scheduler {
    /// Claims what is due and starts its dispatches, claiming again at once while a claim comes
    /// back full (see the module documentation), until `stopped` says so. With `wait`, the
    /// dispatch tasks go there for the caller to join; without, they run on their own, holding
    /// their room until settled.
    pub(super) async fn claim_and_start(
        &self,
        completer: &Arc<dyn Completer>,
        wait: Option<&mut JoinSet<FireResult>>,
        stopped: Option<&watch::Receiver<bool>>,
    ) -> Result<TickReport, TickError> {
        let started = Instant::now();
        add(&self.stats.ticks, 1);
        let (total, last_deferred) = match self.claim_groups().await.map_err(TickError::Claim)? {
            None => {
                let (report, deferred, _) = self.drain(completer, wait, stopped, None).await?;
                (report, deferred)
            }
            Some(groups) => {
                // Side by side, each with dispatches of its own, joined there when waiting.
                let waiting = wait.is_some();
                let drained = each_group(
                    &self.outages,
                    &self.stats,
                    "claim",
                    &groups,
                    GROUP_WIDTH,
                    |group| async move {
                        // A group whose last claim took nothing is asked first whether
                        // anything is due in it: a question a fraction of a claim's cost.
                        if let Some(leases) = &self.groups
                            && !leases.worth_claiming(group).await?
                        {
                            return Ok((TickReport::default(), 0));
                        }
                        let mut own = JoinSet::new();
                        let (mut report, deferred, claimed) = self
                            .drain(completer, waiting.then_some(&mut own), stopped, Some(group))
                            .await
                            .map_err(TickError::into_store)?;
                        if let Some(leases) = &self.groups {
                            leases.claimed_in(group, claimed);
                        }
                        collect(&mut own, &mut report).await;
                        Ok((report, deferred))
                    },
                )
                .await
                .map_err(TickError::Claim)?;
                let mut total = TickReport::default();
                let mut deferred = 0;
                for (report, left) in &drained {
                    total.add(report);
                    deferred += left;
                }
                (total, deferred)
            }
        };
        if last_deferred > 0 {
            warn!(
                deferred = last_deferred,
                claims = total.claims,
                "more occurrences due than there is room to dispatch; the rest wait for room"
            );
        }
        self.stats.tick_duration.observe(started.elapsed());
        Ok(total)
    }

    /// Claims what is due in `group` (every group: `None`) and starts its dispatches, claiming
    /// again at once while a claim comes back full. Returns what it did, how many occurrences
    /// its last claims deferred, and how many its claims took.
    ///
    /// Across every group, a backlog is drained in lanes ([`SchedulerConfig::drain_lanes`]):
    /// when the first claim comes back full, the other lanes of claims start beside the first,
    /// each claim its own transaction, kept apart from the others as two schedulers' are
    /// (`SKIP LOCKED`). A claim is a chain of round trips and of planning in this process,
    /// during which its connection waits; several in flight keep the database busy through
    /// each other's waits. A tick whose first claim takes all that is due claims once.
    ///
    /// [`SchedulerConfig::drain_lanes`]: cm_domain::SchedulerConfig::drain_lanes
    async fn drain(
        &self,
        completer: &Arc<dyn Completer>,
        wait: Option<&mut JoinSet<FireResult>>,
        stopped: Option<&watch::Receiver<bool>>,
        group: Option<GroupId>,
    ) -> Result<(TickReport, usize, usize), TickError> {
        let cap = self.config.max_fires_per_tick.get();
        let limit = DRAIN_BATCH_LIMIT.max(cap);
        // A tick starts where the last one's work left it: after a tick that claimed more than
        // the cap, twice what it claimed (at most the limit), so a load that comes due every
        // second (a thousand every-second routines) is claimed by the processes' first claims,
        // not the ramp from the cap, and not a second claim for the few a first claim left
        // over when the split between the processes moved; after one whose work fitted in the
        // cap, the cap.
        let carried = self.pace.first_batch.load(Ordering::Relaxed);
        let batch = if carried > cap {
            carried.saturating_mul(FIRST_BATCH_HEADROOM).min(limit)
        } else {
            cap
        };
        // Within one group (Citus, `--claim-per-group`) the groups are the lanes already.
        let others = match group {
            None => self.config.drain_lanes.saturating_sub(1),
            Some(_) => 0,
        };
        let (open, opened) = watch::channel(None::<usize>);
        let waiting = wait.is_some();
        let first = self.drain_lane(
            completer,
            wait,
            stopped,
            group,
            LaneStart {
                batch,
                open: (others > 0).then_some(open),
                first: true,
            },
        );
        let other = |mut opened: watch::Receiver<Option<usize>>| async move {
            // The first lane's first full claim opens the others; a drain it ends alone
            // (the sender dropped unsent) opens none.
            let Ok(batch) = opened
                .wait_for(Option::is_some)
                .await
                .map(|b| b.unwrap_or(batch))
            else {
                return Ok(None);
            };
            let mut own = JoinSet::new();
            let lane = self
                .drain_lane(
                    completer,
                    waiting.then_some(&mut own),
                    stopped,
                    group,
                    LaneStart {
                        batch,
                        open: None,
                        first: false,
                    },
                )
                .await;
            // Joined whatever the lane ended with: dropping the set would abort its dispatches.
            let mut joined = TickReport::default();
            collect(&mut own, &mut joined).await;
            lane.map(|mut lane| {
                lane.report.add(&joined);
                Some(lane)
            })
        };
        let others = futures_util::future::join_all((0..others).map(|_| other(opened.clone())));
        let (first, others) = tokio::join!(first, others);
        let mut lane = first?;
        for other in others {
            if let Some(other) = other? {
                lane.report.add(&other.report);
                lane.deferred += other.deferred;
                lane.claimed += other.claimed;
            }
        }
        self.pace.first_batch.store(lane.claimed, Ordering::Relaxed);
        Ok((lane.report, lane.deferred, lane.claimed))
    }

    /// One lane of a drain: claims of `batch`, growing, each followed at once by the next while
    /// it comes back full. The first claim that does sends the next batch on `open`, opening
    /// the other lanes. Only the `first` lane claims missions this process launches.
    async fn drain_lane(
        &self,
        completer: &Arc<dyn Completer>,
        mut wait: Option<&mut JoinSet<FireResult>>,
        stopped: Option<&watch::Receiver<bool>>,
        group: Option<GroupId>,
        start: LaneStart,
    ) -> Result<Lane, TickError> {
        let LaneStart {
            mut batch,
            mut open,
            first,
        } = start;
        let limit = DRAIN_BATCH_LIMIT.max(self.config.max_fires_per_tick.get());
        let mut lane = Lane::default();
        let mut after: Option<DueCursor> = None;
        loop {
            let ClaimRoom {
                budget,
                mut mission_room,
                places,
            } = self.claim_room(batch);
            // Missions launched by this process are claimed by the first lane alone: the launch
            // gate's room is read before a claim and taken after it, so two lanes reading it
            // at once would claim it twice, and the extra missions would wait at the gate with
            // their leases running.
            if !first && mission_room.is_some() {
                mission_room = Some(0);
            }
            let Some(budget) = budget else {
                if lane.report.claims == 0 {
                    add(&self.stats.saturated_ticks, 1);
                    debug!(
                        in_flight = self.dispatches_in_flight(),
                        "no room for dispatches; not claiming this tick"
                    );
                }
                break;
            };
            let params = ClaimDueParams {
                claimant: self.instance_id.clone(),
                lease: self.config.lease,
                cap: budget,
                rules: MisfireRules::from(&self.config),
                max_routines: self.routines_to_lock(budget),
                in_claim: self.in_claim,
                mission_room,
                after,
                group,
            };
            let (claim, window) = timed_claim(self.ledger.claim_due(&params)).await?;
            self.stats.tick_succeeded();
            let (more_due, resume_after) = (claim.more_due, claim.resume_after);
            self.note_owed_per_routine(&claim);
            lane.claimed += claim.fires.len();
            lane.deferred = claim.deferred;
            let report = self
                .start(claim, window, completer, wait.as_deref_mut(), places)
                .await;
            lane.report.add(&TickReport {
                claims: 1,
                ..report
            });
            if stopped.is_some_and(|s| *s.borrow()) {
                break;
            }
            if more_due {
                // Resume after what this claim handled; grow the batch while claims come back
                // full, and open the second lane at the first that does.
                after = resume_after;
                batch = (batch * DRAIN_BATCH_GROWTH).min(limit);
                if let Some(open) = open.take() {
                    open.send_replace(Some(batch));
                }
            } else if after.is_some() {
                // The resumed walk ran out: one more claim over the whole walk picks up what
                // came due behind it (a routine created, resumed or released meanwhile).
                after = None;
            } else {
                break;
            }
        }
        Ok(lane)
    }

    /// How many due routines a claim of `budget` occurrences locks. Every routine locked owes at
    /// least one occurrence unless its policy skips them all, and a routine behind owes many
    /// (a backlog), all claimed with it: the batch divided by what each routine of the last
    /// claim gave is what fills it, and a few more keep routines that owe less from holding
    /// the claim back. Locking the batch's count of routines whatever they owe would lock and
    /// plan (every occurrence each owes) many times the routines the batch can take; a claim
    /// that locks too few comes back `more_due` and is followed at once, with the estimate
    /// corrected.
    fn routines_to_lock(&self, budget: FireCap) -> u32 {
        let per_routine = self.pace.owed_per_routine.load(Ordering::Relaxed).max(1);
        let wanted = budget.get().div_ceil(per_routine);
        u32::try_from(wanted + wanted / 16 + 1).unwrap_or(u32::MAX)
    }

    /// Keeps how many occurrences each routine of `claim` gave, for the next claim's lock count
    /// ([`Scheduler::routines_to_lock`]); a claim that fired nothing resets it to one.
    fn note_owed_per_routine(&self, claim: &TickClaim) {
        let routines: std::collections::HashSet<_> = claim
            .fires
            .iter()
            .map(|f| f.occurrence.routine_id)
            .collect();
        let per_routine = claim.fires.len().checked_div(routines.len()).unwrap_or(1);
        self.pace
            .owed_per_routine
            .store(per_routine.max(1), Ordering::Relaxed);
    }
}
