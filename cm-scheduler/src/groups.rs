//! Schedulers divide the routine groups among themselves with leases, so two of them rarely
//! claim in the same group (on Citus: the same shard).
//!
//! Each scheduler renews its leases and rebalances every third of a lease: with `n` schedulers
//! holding live leases (itself included) its share is `ceil(groups / n)`; it takes free groups
//! (never leased, released, or whose holder's lease ran out) up to its share and releases those
//! over it, so a scheduler that joins gets its share from the others within a third of a lease,
//! and the groups of one that died are claimed in as soon as its leases run out.
//!
//! The leases are for efficiency only: a tick claims in the groups it holds and in the groups
//! nobody holds (a claim in a group with nothing due returns at once, and reads that group's
//! shard alone), and `SKIP LOCKED` inside a group keeps two schedulers that meet in one (a
//! lease that changed hands between a read and a claim) correct. Each scheduler keeps when the
//! others' leases run out, by its own clock from what the database said was left: a scheduler
//! that stopped renewing (killed, or cut off) has its groups claimed in by the others from the
//! moment its leases end, without waiting for a rebalance. A scheduler that stops cleanly
//! releases its leases, and the others claim in its groups at their next rebalance.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cm_store::{GroupDirectory, GroupId, StoreError};
use tracing::info;

/// The groups a scheduler holds, and those others hold, as of the last rebalance.
#[derive(Debug, Default, Clone)]
struct View {
    /// The schema's group count (0 before the first rebalance).
    count: usize,
    mine: BTreeSet<GroupId>,
    /// The groups others hold, with when each lease runs out on this process's clock.
    others: BTreeMap<GroupId, Instant>,
}

impl View {
    /// The groups to claim in at `now`: those held, then those nobody holds live.
    fn claimable(&self, now: Instant) -> Vec<GroupId> {
        let free = (0..self.count)
            .filter_map(|g| GroupId::try_from(g).ok())
            .filter(|g| !self.mine.contains(g))
            .filter(|g| self.others.get(g).is_none_or(|until| *until <= now));
        self.mine.iter().copied().chain(free).collect()
    }
}

/// One scheduler's leases on groups.
pub struct GroupLeases {
    directory: Arc<dyn GroupDirectory>,
    holder: String,
    lease: Duration,
    /// Claim per group even where the schema is not distributed.
    always: bool,
    view: Mutex<View>,
}

impl std::fmt::Debug for GroupLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupLeases")
            .field("holder", &self.holder)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// How many of `count` groups each of `holders` schedulers should hold.
pub fn share(count: usize, holders: usize) -> usize {
    count.div_ceil(holders.max(1))
}

impl GroupLeases {
    /// Leases for `holder` (the scheduler's instance id), each lasting `lease`; claims go per
    /// group where the schema is distributed, or everywhere with `always`.
    pub fn new(
        directory: Arc<dyn GroupDirectory>,
        holder: impl Into<String>,
        lease: Duration,
        always: bool,
    ) -> Self {
        GroupLeases {
            directory,
            holder: holder.into(),
            lease,
            always,
            view: Mutex::default(),
        }
    }

    /// Whether claims, reaper passes and maintenance go group by group: on a distributed schema
    /// (Citus) always, elsewhere when asked to.
    pub async fn per_group(&self) -> Result<bool, StoreError> {
        Ok(self.always || self.directory.distributed().await?)
    }

    /// How often [`GroupLeases::rebalance`] should run: a third of a lease.
    pub fn every(&self) -> Duration {
        self.lease / 3
    }

    /// The groups to claim in now, and to take expired claims over in: those this scheduler
    /// holds, then those nobody holds live (never leased, released, or whose holder's lease
    /// ran out), in group order within each. No statement reads every shard: before the first
    /// rebalance it asks for the group count alone.
    pub async fn claimable(&self) -> Result<Vec<GroupId>, StoreError> {
        let mut view = self.view.lock().map(|v| v.clone()).unwrap_or_default();
        if view.count == 0 {
            view.count = usize::from(self.directory.group_count().await?);
        }
        Ok(view.claimable(Instant::now()))
    }

    /// The groups this scheduler held at its last rebalance, in group order.
    pub fn held(&self) -> Vec<GroupId> {
        self.view
            .lock()
            .map(|v| v.mine.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Renews this scheduler's leases, takes free groups up to its share and releases those over
    /// it. Returns the groups it holds afterwards.
    pub async fn rebalance(&self) -> Result<BTreeSet<GroupId>, StoreError> {
        let count = usize::from(self.directory.group_count().await?);
        let read = Instant::now();
        let live = self.directory.live_group_leases().await?;
        let present = self.directory.live_holders().await?;
        let mut holders: BTreeSet<&str> = live.iter().map(|l| l.holder.as_str()).collect();
        holders.extend(present.iter().map(String::as_str));
        holders.insert(&self.holder);
        let share = share(count, holders.len());
        let held: BTreeSet<GroupId> = live
            .iter()
            .filter(|l| l.holder == self.holder)
            .map(|l| l.group)
            .collect();
        let taken: BTreeSet<GroupId> = live.iter().map(|l| l.group).collect();
        let mut release: Vec<GroupId> = Vec::new();
        let mut wanted: Vec<GroupId> = Vec::new();
        if held.len() > share {
            release = held
                .iter()
                .rev()
                .take(held.len() - share)
                .copied()
                .collect();
            self.directory
                .release_groups(&self.holder, &release)
                .await?;
        } else {
            // Free groups, spread from a place of this holder's own so that schedulers starting
            // together do not all reach for the same ones first.
            let start = usize::try_from(fnv(&self.holder) % count.max(1) as u64).unwrap_or(0);
            wanted = (0..count)
                .map(|i| GroupId::try_from((start + i) % count).unwrap_or(0))
                .filter(|g| !taken.contains(g))
                .take(share - held.len())
                .collect();
        }
        let mine: BTreeSet<GroupId> = self
            .directory
            .lease_groups(&self.holder, &wanted, self.lease)
            .await?
            .into_iter()
            .collect();
        // Counted from before the read: a lease is taken to end no later than it does.
        let others: BTreeMap<GroupId, Instant> = live
            .iter()
            .filter(|l| l.holder != self.holder && !mine.contains(&l.group))
            .map(|l| (l.group, read + l.remaining))
            .collect();
        if !release.is_empty() || mine != held {
            info!(holder = %self.holder, held = mine.len(), share, released = release.len(),
                "group leases rebalanced");
        }
        if let Ok(mut view) = self.view.lock() {
            *view = View {
                count,
                mine: mine.clone(),
                others,
            };
        }
        Ok(mine)
    }

    /// Gives up every lease this scheduler holds (it is stopping), so the others take its
    /// groups at their next rebalance instead of after the lease.
    pub async fn release_all(&self) -> Result<(), StoreError> {
        self.directory
            .release_groups(&self.holder, &self.held())
            .await
    }
}

/// FNV-1a of a holder's name: where its search for free groups starts.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
