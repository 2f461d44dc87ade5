//! Failures of one routine group's passes, logged once per outage.
//!
//! Claiming per group (on Citus: per shard), a worker that is down fails every pass in each of
//! its groups, every tick, while the other groups go on. Logging each failure would bury the
//! news under one line per group per pass per tick; instead the first failure of a pass on a
//! node opens an outage, logged once with the node's address (from the coordinator's metadata,
//! which answers while the worker is down) and kept for health, and the first success of that
//! pass in one of the groups it failed in closes it, logged once with how long it lasted. Every
//! failure is still counted (`cm_group_pass_errors_total`). While an outage is open, the pass
//! runs in one of its failed groups at a time (a different one each time), a probe of whether
//! the node answers again: a node that is down, or hangs until the statement timeout, takes one
//! of the pass's places, not one per group.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cm_store::{GroupDirectory, GroupId, StoreError};
use tracing::{debug, error, info};

use crate::counters::{Stats, add};

/// How long a group's node address is trusted before it is asked again (a shard move changes
/// it).
const NODE_TTL: Duration = Duration::from_secs(30);

/// One pass on one node that fails.
#[derive(Debug)]
struct Outage {
    since: Instant,
    groups: BTreeSet<GroupId>,
    failures: u64,
}

/// The outages open now, by node (`None`: the database, off Citus) and pass.
#[derive(Default)]
pub(crate) struct GroupOutages {
    directory: Option<Arc<dyn GroupDirectory>>,
    open: Mutex<HashMap<(Option<String>, &'static str), Outage>>,
    nodes: Mutex<HashMap<GroupId, (Option<String>, Instant)>>,
}

impl std::fmt::Debug for GroupOutages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupOutages").finish_non_exhaustive()
    }
}

impl GroupOutages {
    /// Outages whose nodes `directory` names.
    pub(crate) fn new(directory: Arc<dyn GroupDirectory>) -> Self {
        GroupOutages {
            directory: Some(directory),
            ..GroupOutages::default()
        }
    }

    /// The node holding `group`'s rows, as last asked (at most [`NODE_TTL`] ago).
    async fn node(&self, group: GroupId) -> Option<String> {
        let now = Instant::now();
        if let Some((node, at)) = self.nodes.lock().ok()?.get(&group)
            && now.duration_since(*at) < NODE_TTL
        {
            return node.clone();
        }
        let node = match &self.directory {
            Some(directory) => directory.group_node(group).await.unwrap_or_else(|e| {
                debug!(group, error = %e, "could not ask which node holds the group");
                None
            }),
            None => None,
        };
        if let Ok(mut nodes) = self.nodes.lock() {
            nodes.insert(group, (node.clone(), now));
        }
        node
    }

    /// `pass` failed in `group` with `error`: counted, and logged and kept for health when it
    /// opens an outage of that pass on the group's node.
    pub(crate) async fn failed(
        &self,
        stats: &Stats,
        pass: &'static str,
        group: GroupId,
        error: &StoreError,
    ) {
        add(&stats.group_errors, 1);
        let node = self.node(group).await;
        let opened = {
            let Ok(mut open) = self.open.lock() else {
                return;
            };
            let outage = open.entry((node.clone(), pass)).or_insert_with(|| Outage {
                since: Instant::now(),
                groups: BTreeSet::new(),
                failures: 0,
            });
            outage.groups.insert(group);
            outage.failures += 1;
            outage.failures == 1
        };
        let at = node.as_deref().unwrap_or("the database");
        if opened {
            error!(pass, node = at, group, error = %error,
                "{pass} failed in a routine group; the other groups go on, and this node's \
                 groups are not logged again until it answers");
            stats.tick_failed(format!("{pass} failed in group {group} (on {at}): {error}"));
        } else {
            debug!(pass, node = at, group, error = %error, "{pass} failed in a routine group");
        }
    }

    /// `pass` succeeded in `group`: closes the outage of that pass that `group` failed in, if
    /// one is open (a success in a group that never failed closes nothing: one group that
    /// fails for a reason of its own keeps its outage open, logged once).
    pub(crate) fn succeeded(&self, pass: &'static str, group: GroupId) {
        let Ok(mut open) = self.open.lock() else {
            return;
        };
        let Some(key) = open
            .iter()
            .find(|((_, p), outage)| *p == pass && outage.groups.contains(&group))
            .map(|(key, _)| key.clone())
        else {
            return;
        };
        if let Some(outage) = open.remove(&key) {
            info!(pass, node = key.0.as_deref().unwrap_or("the database"),
                failed_for = ?outage.since.elapsed(), failures = outage.failures,
                groups = ?outage.groups, "{pass} succeeds again in the node's routine groups");
        }
    }

    /// Of `groups`, those to run `pass` in now: all of them, except that of the groups an open
    /// outage of `pass` failed in, one alone runs (a different one each time), a probe.
    fn pick(&self, pass: &'static str, groups: &[GroupId]) -> Vec<GroupId> {
        let Ok(open) = self.open.lock() else {
            return groups.to_vec();
        };
        let mut left_out = BTreeSet::new();
        for ((_, p), outage) in open.iter() {
            if *p != pass {
                continue;
            }
            let failing: Vec<GroupId> = outage
                .groups
                .iter()
                .copied()
                .filter(|g| groups.contains(g))
                .collect();
            if failing.is_empty() {
                continue;
            }
            let probe = failing[usize::try_from(outage.failures).unwrap_or(0) % failing.len()];
            left_out.extend(failing.into_iter().filter(|g| *g != probe));
        }
        groups
            .iter()
            .copied()
            .filter(|g| !left_out.contains(g))
            .collect()
    }

    /// How many outages are open now.
    #[cfg(test)]
    fn open_count(&self) -> usize {
        self.open.lock().map(|o| o.len()).unwrap_or(0)
    }
}

/// Runs `pass` in the groups of `groups` ([`GroupOutages::pick`]), at most `width` at once,
/// each failure reported to `outages` alone: a group whose shard is slow or down delays and
/// fails no other. Returns the successes' results, or the last error when the pass failed in
/// every group it ran in (the database itself is down: the caller's to log).
pub(crate) async fn each_group<T, F, Fut>(
    outages: &GroupOutages,
    stats: &Stats,
    pass: &'static str,
    groups: &[GroupId],
    width: usize,
    run: F,
) -> Result<Vec<T>, StoreError>
where
    F: Fn(GroupId) -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    use futures_util::StreamExt;
    // The futures are made first and the stream holds them, not a closure over borrowed
    // groups (whose lifetimes would keep the scheduler's future from being `Send`).
    let attempts: Vec<_> = outages
        .pick(pass, groups)
        .into_iter()
        .map(|group| {
            let attempt = run(group);
            async move { (group, attempt.await) }
        })
        .collect();
    let results: Vec<(GroupId, Result<T, StoreError>)> = futures_util::stream::iter(attempts)
        .buffer_unordered(width.max(1))
        .collect()
        .await;
    let mut done = Vec::with_capacity(results.len());
    let mut last_error = None;
    for (group, result) in results {
        match result {
            Ok(value) => {
                outages.succeeded(pass, group);
                done.push(value);
            }
            Err(e) => {
                outages.failed(stats, pass, group, &e).await;
                last_error = Some(e);
            }
        }
    }
    match last_error {
        Some(e) if done.is_empty() => Err(e),
        _ => Ok(done),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn down() -> StoreError {
        StoreError::Database(sqlx::Error::PoolTimedOut)
    }

    #[tokio::test]
    async fn an_outage_is_kept_once_and_closed_by_a_success() {
        let outages = GroupOutages::default();
        let stats = Stats::default();
        for _ in 0..3 {
            for group in [1, 2, 3] {
                outages.failed(&stats, "claim", group, &down()).await;
            }
        }
        assert_eq!(Stats::get(&stats.group_errors), 9);
        // One outage (off Citus every group is on "the database"), kept for health once.
        assert_eq!(outages.open_count(), 1);
        assert_eq!(Stats::get(&stats.tick_errors), 1);
        outages.failed(&stats, "prune", 1, &down()).await;
        assert_eq!(outages.open_count(), 2);
        // While it is open, the pass runs in one of its failed groups at a time.
        let picked = outages.pick("claim", &[0, 1, 2, 3, 4]);
        assert_eq!(picked.len(), 3, "{picked:?}");
        assert!(picked.contains(&0) && picked.contains(&4));
        // A success in a group that never failed closes nothing; one in a failed group does.
        outages.succeeded("claim", 4);
        assert_eq!(outages.open_count(), 2);
        outages.succeeded("claim", 2);
        assert_eq!(outages.open_count(), 1);
        assert_eq!(outages.pick("claim", &[0, 1, 2]), vec![0, 1, 2]);
        outages.failed(&stats, "claim", 1, &down()).await;
        assert_eq!(Stats::get(&stats.tick_errors), 3);
    }

    #[tokio::test]
    async fn each_group_isolates_the_failing_groups() {
        let outages = GroupOutages::default();
        let stats = Stats::default();
        let done = each_group(
            &outages,
            &stats,
            "claim",
            &[0, 1, 2, 3],
            2,
            |g| async move { if g % 2 == 0 { Ok(g) } else { Err(down()) } },
        )
        .await;
        let mut done = done.unwrap();
        done.sort_unstable();
        assert_eq!(done, vec![0, 2]);
        assert_eq!(Stats::get(&stats.group_errors), 2);
        // Failing everywhere it ran, the pass fails.
        let all = each_group(&outages, &stats, "prune", &[1, 3], 2, |_| async {
            Err::<(), _>(down())
        })
        .await;
        assert!(all.is_err());
    }
}
