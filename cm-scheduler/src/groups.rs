//! Schedulers divide the routine groups among themselves with leases, so two of them rarely
//! claim in the same group (on Citus: the same shard).
//!
//! Each scheduler renews its leases and rebalances every third of a lease: with `n` schedulers
//! holding live leases (itself included) its share is `ceil(groups / n)`; it takes free groups
//! (never leased, released, or whose holder's lease ran out) up to its share and releases those
//! over it. A scheduler short of its share while another holds more than its own looks again
//! every tick until the other has let go, so one that joins gets its share from the others
//! within about a third of a lease; the groups of one that died are claimed in as soon as its
//! leases run out.
//!
//! The leases are for efficiency only: a tick claims in the groups it holds and in the groups
//! nobody holds (a group whose last claim took nothing is first asked whether anything is due
//! there, a question that reads that group's shard alone), and `SKIP LOCKED` inside a group
//! keeps two schedulers that meet in one (a lease that changed hands between a read and a
//! claim) correct. Each scheduler keeps when the
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
    /// Whether this scheduler holds fewer than its share while another holds more than its
    /// own: the other releases the difference at its next rebalance.
    short: bool,
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
    /// The groups whose last claim took nothing: the next asks first whether anything is due
    /// there ([`GroupLeases::worth_claiming`]).
    idle: Mutex<BTreeSet<GroupId>>,
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
            idle: Mutex::default(),
        }
    }

    /// Whether to claim in `group` now. After a claim there that took something, yes without
    /// asking: a group with work tends to have more, and the question would only add a round
    /// trip. After one that took nothing, only when something is due there
    /// ([`GroupDirectory::group_due`]): on Citus a claim that finds nothing still costs a
    /// transaction on the group's worker and the planning of its statements, about ten times
    /// the question, and a tick asks every group it may claim in. Nothing is left behind by
    /// not claiming: what comes due after the question is claimed by the next tick, as it
    /// would be after a claim a moment earlier.
    pub async fn worth_claiming(&self, group: GroupId) -> Result<bool, StoreError> {
        let idle = self.idle.lock().is_ok_and(|idle| idle.contains(&group));
        if !idle {
            return Ok(true);
        }
        self.directory.group_due(group).await
    }

    /// Notes that the claims of a tick in `group` took `claimed` occurrences.
    pub fn claimed_in(&self, group: GroupId, claimed: usize) {
        if let Ok(mut idle) = self.idle.lock() {
            if claimed == 0 {
                idle.insert(group);
            } else {
                idle.remove(&group);
            }
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

    /// Whether, at its last rebalance, this scheduler held fewer groups than its share while
    /// another held more than its own: the other gives them up at its next rebalance, so this
    /// one should look again soon (every tick) rather than a third of a lease later. A
    /// scheduler that joins then claims in its share within about a third of a lease.
    pub fn short(&self) -> bool {
        self.view.lock().is_ok_and(|v| v.short)
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
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for l in live.iter().filter(|l| l.holder != self.holder) {
            *counts.entry(l.holder.as_str()).or_default() += 1;
        }
        let another_over = counts.values().any(|n| *n > share);
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
                short: mine.len() < share && another_over,
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

#[cfg(test)]
mod tests {
    use super::*;
    use cm_store::LiveLease;

    /// Leases kept in memory as the database keeps them, without time: a lease lives until it
    /// is released.
    #[derive(Default)]
    struct Leases {
        count: u16,
        held: Mutex<BTreeMap<GroupId, String>>,
        present: Mutex<BTreeSet<String>>,
        /// The groups with something due.
        due: Mutex<BTreeSet<GroupId>>,
    }

    #[async_trait::async_trait]
    impl GroupDirectory for Leases {
        async fn group_count(&self) -> Result<u16, StoreError> {
            Ok(self.count)
        }
        async fn due_groups(&self) -> Result<Vec<GroupId>, StoreError> {
            Ok(Vec::new())
        }
        async fn group_due(&self, group: GroupId) -> Result<bool, StoreError> {
            Ok(self.due.lock().unwrap().contains(&group))
        }
        async fn expired_groups(&self) -> Result<Vec<GroupId>, StoreError> {
            Ok(Vec::new())
        }
        async fn lease_groups(
            &self,
            holder: &str,
            wanted: &[GroupId],
            _lease: Duration,
        ) -> Result<Vec<GroupId>, StoreError> {
            self.present.lock().unwrap().insert(holder.to_string());
            let mut held = self.held.lock().unwrap();
            for group in wanted {
                held.entry(*group).or_insert_with(|| holder.to_string());
            }
            Ok(held
                .iter()
                .filter(|(_, h)| *h == holder)
                .map(|(g, _)| *g)
                .collect())
        }
        async fn release_groups(&self, holder: &str, groups: &[GroupId]) -> Result<(), StoreError> {
            let mut held = self.held.lock().unwrap();
            held.retain(|g, h| h != holder || !groups.contains(g));
            Ok(())
        }
        async fn live_group_leases(&self) -> Result<Vec<LiveLease>, StoreError> {
            Ok(self
                .held
                .lock()
                .unwrap()
                .iter()
                .map(|(group, holder)| LiveLease {
                    group: *group,
                    holder: holder.clone(),
                    remaining: Duration::from_secs(15),
                })
                .collect())
        }
        async fn group_node(&self, _group: GroupId) -> Result<Option<String>, StoreError> {
            Ok(None)
        }
        async fn live_holders(&self) -> Result<Vec<String>, StoreError> {
            Ok(self.present.lock().unwrap().iter().cloned().collect())
        }
        async fn distributed(&self) -> Result<bool, StoreError> {
            Ok(false)
        }
    }

    fn schedulers(count: u16, names: &[&str]) -> Vec<GroupLeases> {
        let directory: Arc<dyn GroupDirectory> = Arc::new(Leases {
            count,
            ..Leases::default()
        });
        names
            .iter()
            .map(|name| GroupLeases::new(directory.clone(), *name, Duration::from_secs(15), true))
            .collect()
    }

    /// Each scheduler's rebalance in turn; how many groups each holds, and whether it is short.
    async fn round(leases: &[&GroupLeases]) -> Vec<(usize, bool)> {
        let mut seen = Vec::new();
        for lease in leases {
            let held = lease.rebalance().await.unwrap().len();
            seen.push((held, lease.short()));
        }
        seen
    }

    #[tokio::test]
    async fn a_scheduler_that_joins_is_short_until_the_other_lets_go() {
        let [a, b] = &schedulers(8, &["a", "b"])[..] else {
            unreachable!()
        };
        // Alone, `a` takes every group.
        assert_eq!(round(&[a]).await, vec![(8, false)]);
        // `b` finds none free while `a` holds twice its share: it looks again every tick.
        assert_eq!(round(&[b]).await, vec![(0, true)]);
        // `a` has seen `b` and lets half go; `b`'s next look takes them.
        assert_eq!(round(&[a, b]).await, vec![(4, false), (4, false)]);
        assert_eq!(b.held().len(), 4);
    }

    #[tokio::test]
    async fn an_uneven_split_leaves_nobody_short() {
        let [a, b, c] = &schedulers(8, &["a", "b", "c"])[..] else {
            unreachable!()
        };
        round(&[a, b, a, b]).await;
        // `c` joins: its share is 3 of 8, and `a` and `b` hold 4 each.
        assert_eq!(round(&[c]).await, vec![(0, true)]);
        assert_eq!(round(&[a, b]).await, vec![(3, false), (3, false)]);
        // Two are left for `c`: fewer than its share, but nobody holds more than theirs, so it
        // looks again a third of a lease later, not every tick.
        assert_eq!(round(&[c]).await, vec![(2, false)]);
    }

    #[tokio::test]
    async fn a_group_whose_claim_took_nothing_is_claimed_in_again_once_something_is_due() {
        let directory = Arc::new(Leases {
            count: 4,
            ..Leases::default()
        });
        let leases = GroupLeases::new(directory.clone(), "a", Duration::from_secs(15), true);
        // Never claimed in: claimed in without asking.
        assert!(leases.worth_claiming(2).await.unwrap());
        leases.claimed_in(2, 0);
        assert!(!leases.worth_claiming(2).await.unwrap());
        // The other groups are not asked for what group 2's claim found.
        assert!(leases.worth_claiming(3).await.unwrap());
        directory.due.lock().unwrap().insert(2);
        assert!(leases.worth_claiming(2).await.unwrap());
        // A claim that took something: the next goes ahead without asking, due or not.
        leases.claimed_in(2, 5);
        directory.due.lock().unwrap().clear();
        assert!(leases.worth_claiming(2).await.unwrap());
    }
}
