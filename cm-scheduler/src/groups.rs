//! Schedulers divide the routine groups among themselves with leases, so two of them rarely
//! claim in the same group (on Citus: the same shard).
//!
//! Each scheduler renews its leases and rebalances every third of a lease: with `n` schedulers
//! holding live leases (itself included) its share is `ceil(groups / n)`; it takes free groups
//! (never leased, released, or whose holder's lease ran out) up to its share and releases those
//! over it, so a scheduler that joins gets its share from the others within a third of a lease,
//! and the groups of one that died are taken once its leases run out.
//!
//! The leases are for efficiency only: a tick claims in the due groups it holds and in the due
//! groups nobody holds, and `SKIP LOCKED` inside a group keeps two schedulers that meet in one
//! (a lease that changed hands between a read and a claim) correct.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cm_store::{GroupDirectory, GroupId, StoreError};
use tracing::info;

/// The groups a scheduler holds, and those others hold, as of the last rebalance.
#[derive(Debug, Default, Clone)]
struct View {
    mine: BTreeSet<GroupId>,
    others: BTreeSet<GroupId>,
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

    /// The groups to claim in now: the due ones this scheduler holds, then the due ones nobody
    /// holds, in group order within each.
    pub async fn claimable(&self) -> Result<Vec<GroupId>, StoreError> {
        let due = self.directory.due_groups().await?;
        let view = self.view.lock().map(|v| v.clone()).unwrap_or_default();
        let (mut mine, mut free): (Vec<GroupId>, Vec<GroupId>) = due
            .into_iter()
            .filter(|g| !view.others.contains(g))
            .partition(|g| view.mine.contains(g));
        mine.append(&mut free);
        Ok(mine)
    }

    /// The groups this scheduler held at its last rebalance, in group order.
    pub fn held(&self) -> Vec<GroupId> {
        self.view
            .lock()
            .map(|v| v.mine.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The groups with a claim whose lease ran out, for the reaper (whoever leases them: a
    /// crashed scheduler's claims are taken over before its group leases run out).
    pub async fn expired(&self) -> Result<Vec<GroupId>, StoreError> {
        self.directory.expired_groups().await
    }

    /// Renews this scheduler's leases, takes free groups up to its share and releases those over
    /// it. Returns the groups it holds afterwards.
    pub async fn rebalance(&self) -> Result<BTreeSet<GroupId>, StoreError> {
        let count = usize::from(self.directory.group_count().await?);
        let live = self.directory.live_group_leases().await?;
        let present = self.directory.live_holders().await?;
        let mut holders: BTreeSet<&str> = live.iter().map(|(_, h)| h.as_str()).collect();
        holders.extend(present.iter().map(String::as_str));
        holders.insert(&self.holder);
        let share = share(count, holders.len());
        let held: BTreeSet<GroupId> = live
            .iter()
            .filter(|(_, h)| *h == self.holder)
            .map(|(g, _)| *g)
            .collect();
        let taken: BTreeSet<GroupId> = live.iter().map(|(g, _)| *g).collect();
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
        let others: BTreeSet<GroupId> = live
            .iter()
            .filter(|(g, h)| *h != self.holder && !mine.contains(g))
            .map(|(g, _)| *g)
            .collect();
        if !release.is_empty() || mine != held {
            info!(holder = %self.holder, held = mine.len(), share, released = release.len(),
                "group leases rebalanced");
        }
        if let Ok(mut view) = self.view.lock() {
            *view = View {
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
