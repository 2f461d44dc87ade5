//! The claim's gate for concurrency keys ([`crate::limits`]): of the occurrences a claim
//! planned, those of routines whose key has a limit take the key's places left, under the
//! key's lock, oldest first and taking turns between the key's routines
//! ([`cm_domain::limit::admit`]). What is not admitted waits, owed: a scheduled occurrence by
//! its routine's clock staying at it (with `key_wait` set, so what comes due meanwhile is owed
//! too, not its misfire policy's), a requested one by going back to the requests.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use cm_domain::{Occurrence, TickPlan};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::claim::bind_group;
use super::due::{DueRoutine, Request};
use crate::StoreError;
use crate::groups::{GroupId, group_of};

/// What the gate held back.
#[derive(Debug, Default)]
pub(super) struct Gated {
    /// The routines whose scheduled occurrences wait on their key: `key_wait` is set on them
    /// once their clocks moved ([`mark_waiting`]).
    pub(super) waiting: Vec<Uuid>,
    /// The routines of the keys that held anything back.
    pub(super) keyed: HashSet<Uuid>,
}

impl Gated {
    /// Whether a claim right after this one may find places this one held back for: it held
    /// something, and some of its fires of those keys were settled in the claim itself (the
    /// outbox), so their places free when it commits.
    pub(super) fn room_after(&self, fires: &[crate::ClaimedFire]) -> bool {
        !self.keyed.is_empty()
            && fires.iter().any(|f| {
                self.keyed.contains(&f.occurrence.routine_id)
                    && f.row.status != cm_domain::FireStatus::Claimed
            })
    }
}

/// Admits the claim's occurrences of limited keys into their keys' places, taking the rest out
/// of `tick` (their routines' clocks kept at the oldest held, counted in `tick.held`) and out of
/// `requested` (written back as requests). Locks the keys of every routine in the claim that
/// has one, in one order, for the rest of the transaction.
pub(super) async fn admit_by_keys(
    tx: &mut Transaction<'_, Postgres>,
    due: &[DueRoutine],
    tick: &mut TickPlan,
    requested: &mut Vec<Request>,
    group_count: u16,
) -> Result<Gated, StoreError> {
    let mut key_of: HashMap<Uuid, &str> = HashMap::new();
    let mut last_ran: HashMap<Uuid, DateTime<Utc>> = HashMap::new();
    for (id, key, ran) in due
        .iter()
        .map(|r| (r.id, &r.concurrency_key, r.last_run_at))
        .chain(
            requested
                .iter()
                .map(|r| (r.routine_id, &r.concurrency_key, r.last_run_at)),
        )
    {
        if let Some(key) = key {
            key_of.insert(id, key);
            if let Some(ran) = ran {
                last_ran.insert(id, ran);
            }
        }
    }
    let taking: Vec<Occurrence> = tick
        .claims
        .iter()
        .copied()
        .chain(
            requested
                .iter()
                .map(|r| Occurrence::new(r.routine_id, r.scheduled_at)),
        )
        .collect();
    let mut keys: Vec<String> = taking
        .iter()
        .filter_map(|o| key_of.get(&o.routine_id).map(|k| (*k).to_owned()))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    if keys.is_empty() {
        return Ok(Gated::default());
    }
    // Only the keys with a limit are locked and counted; a key without one is unlimited.
    let limited = crate::limits::limited(tx, &keys).await?;
    if limited.is_empty() {
        return Ok(Gated::default());
    }
    let rooms: HashMap<String, usize> = if crate::limits::lock_keys(tx, &limited).await? {
        crate::limits::rooms(tx, &limited).await?
    } else {
        limited.into_iter().map(|key| (key, 0)).collect()
    };
    let mut owed: HashMap<&str, Vec<Occurrence>> = HashMap::new();
    for o in &taking {
        if let Some(key) = key_of.get(&o.routine_id)
            && rooms.contains_key(*key)
        {
            owed.entry(key).or_default().push(*o);
        }
    }
    let mut refused: HashSet<Occurrence> = HashSet::new();
    let mut full: HashSet<&str> = HashSet::new();
    for (key, occurrences) in &owed {
        let room = rooms.get(*key).copied().unwrap_or(0);
        let admitted: HashSet<Occurrence> = cm_domain::limit::admit(occurrences, room, &last_ran)
            .into_iter()
            .collect();
        let before = refused.len();
        refused.extend(occurrences.iter().filter(|o| !admitted.contains(o)));
        if refused.len() > before {
            full.insert(key);
        }
    }
    if refused.is_empty() {
        return Ok(Gated::default());
    }
    let keyed: HashSet<Uuid> = key_of
        .iter()
        .filter(|(_, key)| full.contains(**key))
        .map(|(id, _)| *id)
        .collect();

    // Scheduled: each routine's clock stays at its oldest held occurrence.
    let mut held: HashMap<Uuid, (DateTime<Utc>, usize)> = HashMap::new();
    tick.claims.retain(|o| {
        if !refused.contains(o) {
            return true;
        }
        let entry = held.entry(o.routine_id).or_insert((o.scheduled_at, 0));
        entry.0 = entry.0.min(o.scheduled_at);
        entry.1 += 1;
        false
    });
    for advance in &mut tick.advances {
        if let Some((first, n)) = held.get(&advance.routine_id) {
            advance.claimed = advance.claimed.saturating_sub(*n);
            advance.held += n;
            advance.next_run_at = Some(advance.next_run_at.map_or(*first, |at| at.min(*first)));
        }
    }
    tick.held += held.values().map(|(_, n)| n).sum::<usize>();

    // Requested: back to the requests, for a claim with room.
    let (back, kept): (Vec<Request>, Vec<Request>) = std::mem::take(requested)
        .into_iter()
        .partition(|r| refused.contains(&Occurrence::new(r.routine_id, r.scheduled_at)));
    *requested = kept;
    if !back.is_empty() {
        let ids: Vec<Uuid> = back.iter().map(|r| r.routine_id).collect();
        let at: Vec<DateTime<Utc>> = back.iter().map(|r| r.scheduled_at).collect();
        let origins: Vec<&str> = back.iter().map(|r| r.origin.as_str()).collect();
        let groups: Vec<GroupId> = ids.iter().map(|id| group_of(*id, group_count)).collect();
        let asked: Vec<DateTime<Utc>> = back.iter().map(|r| r.requested_at).collect();
        crate::schema::query(
            "INSERT INTO cm.routine_requests (routine_id, scheduled_at, origin, group_id,
                                              requested_at)
             SELECT * FROM UNNEST($1::uuid[], $2::timestamptz[], $3::text[], $4::int2[],
                                  $5::timestamptz[])
             ON CONFLICT DO NOTHING",
        )
        .bind(&ids)
        .bind(&at)
        .bind(&origins)
        .bind(&groups)
        .bind(&asked)
        .execute(&mut **tx)
        .await?;
    }
    let mut waiting: Vec<Uuid> = held.into_keys().collect();
    waiting.sort_unstable();
    Ok(Gated { waiting, keyed })
}

/// Sets `key_wait` on the routines whose occurrences wait on their key, after the claim moved
/// their clocks (which clears it on every routine it moves).
pub(super) async fn mark_waiting(
    tx: &mut Transaction<'_, Postgres>,
    gated: &Gated,
    group: Option<GroupId>,
) -> Result<(), StoreError> {
    if gated.waiting.is_empty() {
        return Ok(());
    }
    let statement = match group {
        None => "UPDATE cm.routines SET key_wait = true WHERE id = ANY($1)",
        Some(_) => "UPDATE cm.routines SET key_wait = true WHERE id = ANY($1) AND group_id = $2",
    };
    bind_group(crate::schema::query(statement).bind(&gated.waiting), group)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
