//! The tick's claim ([`FireLedger::claim_due`](super::FireLedger::claim_due)): one transaction
//! that reads what is due, plans it with the domain, and claims the planned occurrences and moves
//! the routines' clocks in one statement (see the module documentation of [`super`]).

use std::collections::HashMap;
use std::time::Instant;

use chrono::{DateTime, Utc};
use cm_domain::{
    ClaimToken, DueRoutine as PlannedRoutine, FireCap, FireOrigin, Lease, Occurrence, TickPlan,
    plan_claim, plan_routine_due,
};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{FromRow, Postgres, Transaction};
use uuid::Uuid;

use super::advance::{Advance, resume_after};
use super::citus::claim_rows_on_one_shard;
use super::claimed::{ClaimedRow, mark_unwritten_messages};
use super::due::{DueRoutine, DueRow, DueSet, due_query, split_due_rows, take_requests};
use super::sql::{
    ADVANCE_GROUP_SQL, ADVANCE_SQL, BUFFER_SKIPS_SQL, CLAIM_GROUP_SQL, CLAIM_GROUP_WITH_OUTBOX_SQL,
    CLAIM_SQL, CLAIM_WITH_OUTBOX_SQL, PAUSE_GROUP_UNUSABLE_SQL, PAUSE_UNUSABLE_SQL,
};
use super::{
    ClaimDueParams, ClaimedFire, InClaimEffect, TickClaim, UnusableRoutine, request_share,
};
use crate::groups::{GroupId, group_of};
use crate::{PgStore, StoreError};

/// A lease in seconds, as the statements bind it.
pub(super) fn lease_seconds(lease: Lease) -> f64 {
    lease.duration().as_secs_f64()
}

/// Records the occurrences a `buffer-one` routine's run kept waiting that are not launched:
/// `skipped`, naming the one launched instead. An occurrence already in the ledger (a trigger
/// of the same instant) keeps its row.
async fn record_buffer_skips(
    tx: &mut Transaction<'_, Postgres>,
    skipped: &[(Uuid, DateTime<Utc>, DateTime<Utc>)],
    token: ClaimToken,
    now: DateTime<Utc>,
    group_count: u16,
) -> Result<(), StoreError> {
    let ids: Vec<Uuid> = skipped.iter().map(|(id, _, _)| *id).collect();
    let instants: Vec<DateTime<Utc>> = skipped.iter().map(|(_, at, _)| *at).collect();
    let groups: Vec<GroupId> = ids.iter().map(|id| group_of(*id, group_count)).collect();
    let errors: Vec<String> = skipped
        .iter()
        .map(|(_, _, launched)| {
            format!(
                "skipped: buffer-one launched the newest occurrence due during the run, {}",
                launched.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )
        })
        .collect();
    crate::schema::query(BUFFER_SKIPS_SQL)
        .bind(&ids)
        .bind(&instants)
        .bind(&errors)
        .bind(token.0)
        .bind(now)
        .bind(&groups)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// What the claim statement writes: the planned occurrences (oldest first), each one's group,
/// the claim's token, and its clock (read once, by the due statement).
pub(super) struct ClaimInput<'a> {
    pub(super) token: ClaimToken,
    pub(super) now: DateTime<Utc>,
    pub(super) claims: &'a [(Occurrence, FireOrigin)],
    pub(super) groups: &'a [GroupId],
    /// When each occurrence came due, where a jitter delayed it; `None`, the occurrence itself.
    pub(super) planned: Vec<Option<DateTime<Utc>>>,
}

impl ClaimInput<'_> {
    /// The occurrences as the claim statements' parallel arrays: routines, instants, origins.
    pub(super) fn columns(&self) -> (Vec<Uuid>, Vec<DateTime<Utc>>, Vec<&'static str>) {
        (
            self.claims.iter().map(|(o, _)| o.routine_id).collect(),
            self.claims.iter().map(|(o, _)| o.scheduled_at).collect(),
            self.claims
                .iter()
                .map(|(_, origin)| origin.as_str())
                .collect(),
        )
    }
}

/// Whether message and mission routines are settled with an outbox row in the claim.
pub(super) fn outbox_kinds(params: &ClaimDueParams) -> (bool, bool) {
    let outbox = Some(InClaimEffect::Outbox);
    (
        params.in_claim.message == outbox,
        params.in_claim.mission == outbox,
    )
}

/// Binds the group a statement is kept in, its last parameter, when there is one.
pub(crate) fn bind_group<'q>(
    query: Query<'q, Postgres, PgArguments>,
    group: Option<GroupId>,
) -> Query<'q, Postgres, PgArguments> {
    match group {
        Some(group) => query.bind(group),
        None => query,
    }
}

/// The claim's second statement: every planned occurrence claimed (and, for an in-claim
/// kind, settled with its effect) and the routines' clocks moved, together.
async fn claim_rows(
    store: &PgStore,
    tx: &mut Transaction<'_, Postgres>,
    params: &ClaimDueParams,
    claim: &ClaimInput<'_>,
    advance: &Advance,
) -> Result<Vec<ClaimedFire>, StoreError> {
    if let Some(group) = params.group
        && store.is_citus().await?
    {
        return claim_rows_on_one_shard(tx, params, claim, advance, group).await;
    }
    let (token, claims) = (claim.token, claim.claims);
    let (ids, instants, origins) = claim.columns();
    let (message, mission) = outbox_kinds(params);
    let writes_messages = message || mission;
    let statement = match (writes_messages, params.group) {
        (true, None) => CLAIM_WITH_OUTBOX_SQL,
        (true, Some(_)) => CLAIM_GROUP_WITH_OUTBOX_SQL,
        (false, None) => CLAIM_SQL,
        (false, Some(_)) => CLAIM_GROUP_SQL,
    };
    let keys: Vec<String> = if writes_messages {
        claims
            .iter()
            .map(|(o, _)| o.idempotency_key().as_str().to_owned())
            .collect()
    } else {
        Vec::new()
    };
    let query = crate::schema::query(statement)
        .bind(&ids)
        .bind(&instants)
        .bind(&params.claimant)
        .bind(token.0)
        .bind(lease_seconds(params.lease))
        .bind(&origins);
    // The outbox claim's own parameters come next ($7-$9), then the advance's.
    let query = if writes_messages {
        query.bind(message).bind(mission).bind(&keys)
    } else {
        query
    };
    let query = advance.bind(query).bind(claim.now).bind(claim.groups);
    let query = advance
        .bind_claimed(bind_group(query, params.group))
        .bind(&claim.planned);
    let mut rows: Vec<ClaimedRow> = query
        .try_map(|row| ClaimedRow::from_row(&row))
        .fetch_all(&mut **tx)
        .await?;
    if writes_messages {
        mark_unwritten_messages(tx, &mut rows).await?;
    }
    rows.into_iter().map(ClaimedFire::try_from).collect()
}

/// The schedules of the due routines on a calendar, by routine: each parsed text on its
/// calendar, read in one statement; a routine whose calendar is gone or refuses its schedule
/// gets the reason, and is set aside as unusable.
async fn calendar_schedules(
    tx: &mut Transaction<'_, Postgres>,
    due: &[DueRoutine],
    parsed: &HashMap<(String, String), crate::schedules::Parsed>,
) -> Result<HashMap<Uuid, Result<cm_domain::Schedule, String>>, StoreError> {
    let mut names: Vec<&str> = due.iter().filter_map(|r| r.calendar.as_deref()).collect();
    if names.is_empty() {
        return Ok(HashMap::new());
    }
    names.sort_unstable();
    names.dedup();
    let calendars: HashMap<String, Result<std::sync::Arc<cm_domain::Calendar>, String>> =
        crate::calendars::read_calendars(tx, &names)
            .await?
            .into_iter()
            .collect();
    let mut schedules = HashMap::new();
    for routine in due {
        let Some(name) = routine.calendar.as_deref() else {
            continue;
        };
        let key = (routine.schedule.clone(), routine.timezone.clone());
        let schedule = match (parsed.get(&key), calendars.get(name)) {
            (Some(Ok(schedule)), Some(Ok(calendar))) => routine
                .on_holiday
                .parse::<cm_domain::OnHoliday>()
                .map_err(|e| e.to_string())
                .and_then(|policy| {
                    (**schedule)
                        .clone()
                        .with_calendar(calendar.clone(), policy)
                        .map_err(|e| e.to_string())
                }),
            (Some(Err(reason)), _) | (_, Some(Err(reason))) => Err(reason.clone()),
            (None, _) => Err("its schedule could not be parsed".to_owned()),
            (_, None) => Err(format!("its calendar {name:?} does not exist")),
        };
        schedules.insert(routine.id, schedule);
    }
    Ok(schedules)
}

/// [`FireLedger::claim_due`](super::FireLedger::claim_due): one transaction (see the module
/// documentation).
pub(super) async fn claim_due(
    store: &PgStore,
    params: &ClaimDueParams,
) -> Result<TickClaim, StoreError> {
    let token = ClaimToken::new_v4();
    let cap = params.cap.get();
    let mut conn = store.pool.acquire().await?;
    let began = Instant::now();
    // The concurrency keys whose places are all held: the walk leaves their requests, and
    // their routines already waiting on them, owed where they are, for a claim after a place
    // frees. Read before the transaction, on its connection (or taken from a claim of the
    // last moment): on Citus the count reads every shard, which the claim's transaction (one
    // group's) never does. Unread (a worker down), no key is left out of the walk, and the
    // gate below decides as always. With them, every key in use: the walk takes turns
    // between them.
    let citus = store.is_citus().await?;
    let crate::limits::KeyState { full, keys } = store.full_keys.get(&mut conn, citus).await;
    let mut tx = store.begin_on(&mut conn).await?;

    // Occurrences asked for by hand get a guaranteed share of the cap, taken first, so a
    // sustained backlog of scheduled work cannot starve them; scheduled work gets the rest,
    // and requests may fill whatever it leaves. Each request is deleted in this transaction,
    // with its claim. The clock, the requests and the due routines come in one statement.
    // Requested missions take the mission room like scheduled ones: together they never
    // exceed it, and the requests past it stay in the table for a later claim.
    let share = request_share(cap);
    let rows: Vec<DueRow> = due_query(
        params.max_routines,
        share,
        params.mission_room,
        params.after,
        params.group,
        full.clone(),
        keys,
    )
    .try_map(|row| DueRow::from_row(&row))
    .fetch_all(&mut *tx)
    .await?;
    let DueSet {
        now,
        mut requested,
        due,
    } = split_due_rows(rows)?;
    let requests_may_remain = requested.len() == share;
    // What the requested missions leave of the room for the scheduled ones.
    let requested_missions = requested.iter().filter(|r| r.mission).count();
    let limited_room = params
        .mission_room
        .map(|room| room.saturating_sub(requested_missions));

    let mut plans = Vec::with_capacity(due.len());
    let mut unusable = Vec::new();
    // Occurrences a `buffer-one` routine's run kept waiting that are not launched: recorded
    // `skipped`, naming the newest, which is.
    let mut skipped_by_buffer: Vec<(Uuid, DateTime<Utc>, DateTime<Utc>)> = Vec::new();
    // Parsing an expression costs far more than walking it, and many routines share one
    // (every hour, every minute): each distinct (expression, zone) is parsed once, kept in the
    // store's cache, and parsed off the scheduler's loops (on a blocking thread) when it is not
    // there. Every parse is bounded by the schedule's budget of candidates; a text past it is
    // refused, and its routine set aside below, while the others are claimed.
    let texts: Vec<(&str, &str)> = due
        .iter()
        .map(|r| (r.schedule.as_str(), r.timezone.as_str()))
        .collect();
    let parsed = store.schedules.parse_all(&texts).await;
    // The routines on a calendar: their calendars read now, after their rows were locked, so
    // each is the calendar their clocks were planned with (`calendars.rs`).
    let on_calendars = calendar_schedules(&mut tx, &due, &parsed).await?;
    let schedule_of = |routine: &DueRoutine| -> Result<&cm_domain::Schedule, String> {
        if let Some(on_calendar) = on_calendars.get(&routine.id) {
            return on_calendar.as_ref().map_err(Clone::clone);
        }
        match parsed.get(&(routine.schedule.clone(), routine.timezone.clone())) {
            Some(Ok(schedule)) => Ok(schedule.as_ref()),
            Some(Err(reason)) => Err(reason.clone()),
            None => Err("its schedule could not be parsed".to_owned()),
        }
    };
    for routine in &due {
        let schedule = schedule_of(routine);
        let policy = routine
            .misfire_policy
            .parse::<cm_domain::MisfirePolicy>()
            .map_err(|e| e.to_string());
        // A buffering mission (its run is free, or the walk would not have locked it): what
        // its run kept waiting is the buffer policy's to decide, not the misfire policy's.
        let buffering = routine
            .overlap
            .parse::<cm_domain::OverlapPolicy>()
            .ok()
            .filter(|o| o.buffers() && routine.kind == "mission");
        match (schedule, policy) {
            (Ok(schedule), Ok(policy)) => {
                // A routine whose clock waits on its concurrency key owes what came due
                // meanwhile: never skipped for the limit.
                let policy = match buffering {
                    Some(_) => cm_domain::MisfirePolicy::CatchUp,
                    None if routine.key_wait => cm_domain::MisfirePolicy::CatchUp,
                    None => policy,
                };
                let mut plan = plan_routine_due(
                    routine.id,
                    routine.next_run_at,
                    schedule,
                    now,
                    policy,
                    &params.rules,
                );
                if let Some(overlap) = buffering {
                    let buffered =
                        cm_domain::buffer_plan(overlap, &plan.occurrences, plan.next_run_at);
                    plan.occurrences = buffered.launch.into_iter().collect();
                    plan.next_run_at = buffered.next_run_at;
                    if let Some(launch) = buffered.launch {
                        skipped_by_buffer.extend(
                            buffered
                                .skipped
                                .into_iter()
                                .map(|at| (routine.id, at, launch)),
                        );
                    }
                }
                plans.push(PlannedRoutine {
                    routine_id: routine.id,
                    plan: plan.limited_to(routine.runs_left.map(|n| n.max(0).unsigned_abs())),
                    limited: params.mission_room.is_some() && routine.kind == "mission",
                    turn: routine.turn,
                })
            }
            (Err(reason), _) | (_, Err(reason)) => unusable.push(UnusableRoutine {
                routine_id: routine.id,
                reason,
            }),
        }
    }
    let mut tick = match FireCap::new(cap.saturating_sub(requested.len())) {
        Some(scheduled_cap) => plan_claim(&plans, scheduled_cap, limited_room.unwrap_or(0)),
        // The requests took the whole cap (a cap of one): every scheduled occurrence waits
        // for a later tick, and no routine's clock moves.
        None => TickPlan {
            deferred: plans.iter().map(|p| p.plan.occurrences.len()).sum(),
            ..TickPlan::default()
        },
    };

    let room = cap.saturating_sub(tick.claims.len() + requested.len());
    if requests_may_remain && room > 0 {
        // The scheduled missions planned took their part of the room too.
        let scheduled_missions: usize = plans
            .iter()
            .zip(&tick.advances)
            .filter(|(plan, _)| plan.limited)
            .map(|(_, advance)| advance.claimed)
            .sum();
        let missions_left = limited_room.map(|room| room.saturating_sub(scheduled_missions));
        requested.extend(take_requests(&mut tx, room, missions_left, params.group, full).await?);
    }
    // Concurrency keys: what this claim takes of a limited key takes its places, under its
    // lock; the rest waits, owed.
    let gated = super::gate::admit_by_keys(
        &mut tx,
        &due,
        &mut tick,
        &mut requested,
        store.group_count().await?,
    )
    .await?;
    let mut claims: Vec<(Occurrence, FireOrigin)> = tick
        .claims
        .iter()
        .map(|o| (*o, FireOrigin::Schedule))
        .collect();
    for request in &requested {
        let occurrence = Occurrence::new(request.routine_id, request.scheduled_at);
        // A requested slot the schedule also planned this tick is claimed once.
        if !tick.claims.contains(&occurrence) {
            claims.push((occurrence, request.origin));
        }
    }
    // Oldest first: the outbox numbers a claim's messages in this order, so each routine's
    // occurrences reach a consumer in `scheduled_at` order.
    claims.sort_by_key(|(o, _)| *o);

    let advance = Advance::new(&due, &tick, &requested);
    let mut fires = if claims.is_empty() {
        if !advance.ids.is_empty() {
            let statement = match params.group {
                None => ADVANCE_SQL,
                Some(_) => ADVANCE_GROUP_SQL,
            };
            let query = advance.bind(crate::schema::query(statement)).bind(now);
            advance
                .bind_claimed(bind_group(query, params.group))
                .execute(&mut *tx)
                .await?;
        }
        Vec::new()
    } else {
        let count = store.group_count().await?;
        let groups: Vec<GroupId> = claims
            .iter()
            .map(|(o, _)| group_of(o.routine_id, count))
            .collect();
        // The planned instants of scheduled occurrences whose schedule moves them (a jitter, a
        // calendar's `next` or `previous`).
        let jittered: HashMap<Uuid, &cm_domain::Schedule> = due
            .iter()
            .filter_map(|r| {
                let schedule = schedule_of(r).ok()?;
                schedule.moves_occurrences().then_some((r.id, schedule))
            })
            .collect();
        let planned = claims
            .iter()
            .map(|(o, origin)| match (origin, jittered.get(&o.routine_id)) {
                (FireOrigin::Schedule, Some(schedule)) => {
                    Some(schedule.planned(o.routine_id, o.scheduled_at))
                }
                _ => None,
            })
            .collect();
        let claim = ClaimInput {
            token,
            now,
            claims: &claims,
            groups: &groups,
            planned,
        };
        claim_rows(store, &mut tx, params, &claim, &advance).await?
    };
    fires.sort_by_key(|f| f.occurrence);
    super::gate::mark_waiting(&mut tx, &gated, params.group).await?;
    let news = super::claim_news::news(&due, &plans, &tick);
    crate::events::record_news(&mut tx, params.group, &news).await?;
    if !skipped_by_buffer.is_empty() {
        record_buffer_skips(
            &mut tx,
            &skipped_by_buffer,
            token,
            now,
            store.group_count().await?,
        )
        .await?;
    }

    if !unusable.is_empty() {
        let ids: Vec<Uuid> = unusable.iter().map(|u| u.routine_id).collect();
        let reasons: Vec<String> = unusable
            .iter()
            .map(|u| {
                let reason = format!("refused when claimed: {}", u.reason);
                cm_domain::ErrorText::new(reason).as_str().to_owned()
            })
            .collect();
        let query = crate::schema::query(match params.group {
            None => PAUSE_UNUSABLE_SQL,
            Some(_) => PAUSE_GROUP_UNUSABLE_SQL,
        })
        .bind(&ids)
        .bind(now)
        .bind(&reasons);
        bind_group(query, params.group).execute(&mut *tx).await?;
        let paused: Vec<crate::events::RoutineNews> = unusable
            .iter()
            .zip(&reasons)
            .map(|(u, reason)| crate::events::RoutineNews {
                routine_id: u.routine_id,
                event_type: cm_domain::EventType::Paused,
                scheduled_at: None,
                data: serde_json::json!({ "by": "cm", "reason": reason }),
            })
            .collect();
        crate::events::record_news(&mut tx, params.group, &paused).await?;
    }
    tx.commit().await?;

    Ok(TickClaim {
        now,
        began,
        token,
        more_due: claims.len() >= cap
            || due.len() >= params.max_routines as usize
            || gated.room_after(&fires),
        resume_after: resume_after(&due, &tick),
        fires,
        deferred: tick.deferred,
        held: tick.held,
        skipped: tick.advances.iter().map(|a| a.skipped).sum(),
        unusable,
    })
}
