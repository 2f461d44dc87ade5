//! Misfire policies after a simulated outage: an every-minute routine whose `next_run_at` is
//! ten whole minutes behind the database's clock.
//!
//! The minute the claim runs in may differ from the minute the outage was set up in, so every
//! expectation is computed from the clock the claim reports (`TickClaim::now`) by the rules the
//! policies document: the due occurrences are every minute from the stored `next_run_at`
//! through `now`; those more than the grace late are misfires, the rest are on time.

use chrono::{DateTime, TimeDelta, Utc};
use cm_domain::{ClaimOutcome, MisfirePolicy, MisfireRules};
use cm_store::{FireLedger, PgStore, Routine, RoutineStore, TickClaim};
use sqlx::PgPool;

use crate::support::{
    EVERY_MINUTE, claim_params, create, db_now, ledger, minute_floor, minutes, rules, set_next_run,
};

/// An outage: an every-minute routine under `policy` whose clock is left nine minutes before
/// the current minute, so ten occurrences are owed (eleven if the minute turns before the
/// claim). Returns the routine and its oldest owed occurrence.
async fn outage(store: &PgStore, pool: &PgPool, policy: MisfirePolicy) -> (Routine, DateTime<Utc>) {
    let routine = create(store, EVERY_MINUTE, policy).await;
    let oldest = minute_floor(db_now(pool).await) - TimeDelta::minutes(9);
    set_next_run(pool, routine.id, oldest).await;
    (routine, oldest)
}

/// The occurrences owed at `now` since `oldest`, split into (misfires, on time) by `rules`.
fn owed(
    oldest: DateTime<Utc>,
    now: DateTime<Utc>,
    rules: &MisfireRules,
) -> (Vec<DateTime<Utc>>, Vec<DateTime<Utc>>) {
    let on_time_from = now - TimeDelta::from_std(rules.grace).unwrap();
    let all = minutes(oldest, now);
    assert!(all.len() >= 10, "{all:?}");
    all.into_iter().partition(|m| *m < on_time_from)
}

/// Checks a tick claimed exactly `expected`, all fresh, oldest first; that the ledger holds
/// exactly those rows; and that the routine's clock is now `next`.
async fn check(
    store: &PgStore,
    routine: &Routine,
    tick: &TickClaim,
    expected: &[DateTime<Utc>],
    next: DateTime<Utc>,
) {
    let claimed: Vec<_> = tick
        .fires
        .iter()
        .map(|f| f.occurrence.scheduled_at)
        .collect();
    assert_eq!(claimed, expected);
    assert!(
        tick.fires
            .iter()
            .all(|f| f.outcome(tick.token) == ClaimOutcome::Fresh
                && f.occurrence.routine_id == routine.id)
    );
    let rows: Vec<_> = ledger(store, routine.id)
        .await
        .into_iter()
        .map(|f| f.scheduled_at)
        .collect();
    assert_eq!(rows, expected);
    let after = store.get_routine(routine.id).await.unwrap();
    assert_eq!(after.next_run_at, Some(next));
    let ran = (!expected.is_empty()).then_some(tick.now);
    assert_eq!(after.last_run_at, ran);
}

/// The first minute after `now`: where a routine's clock goes once everything owed is decided.
fn next_minute(now: DateTime<Utc>) -> DateTime<Utc> {
    minute_floor(now) + TimeDelta::minutes(1)
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn fire_once_fires_the_latest_misfire(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routine, oldest) = outage(&store, &pool, MisfirePolicy::FireOnce).await;
    let rules = rules(0, 100);
    let tick = store
        .claim_due(&claim_params("a", 25, rules))
        .await
        .unwrap();

    let (late, on_time) = owed(oldest, tick.now, &rules);
    // Without grace every owed minute is late (the claim cannot run at a whole minute's
    // exact microsecond).
    assert!(on_time.is_empty(), "{on_time:?}");
    let latest = *late.last().unwrap();
    assert_eq!(tick.skipped, u64::try_from(late.len() - 1).unwrap());
    assert_eq!(tick.deferred, 0);
    check(&store, &routine, &tick, &[latest], next_minute(tick.now)).await;
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn fire_once_fires_only_the_latest_even_when_some_are_within_the_grace(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routine, oldest) = outage(&store, &pool, MisfirePolicy::FireOnce).await;
    // Ninety seconds of grace always covers the current minute, and the one before it when the
    // claim runs in the first half of a minute.
    let rules = rules(90, 100);
    let tick = store
        .claim_due(&claim_params("a", 25, rules))
        .await
        .unwrap();

    // The oldest owed minute is past the grace, so the routine has misfired and the policy
    // decides for all it owes, the minutes within the grace included: one fire, the latest.
    let (late, on_time) = owed(oldest, tick.now, &rules);
    assert!(!on_time.is_empty());
    let all = [late, on_time].concat();
    assert_eq!(tick.skipped, u64::try_from(all.len() - 1).unwrap());
    check(
        &store,
        &routine,
        &tick,
        &all[all.len() - 1..],
        next_minute(tick.now),
    )
    .await;
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn catch_up_fires_every_misfire_oldest_first(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routine, oldest) = outage(&store, &pool, MisfirePolicy::CatchUp).await;
    let rules = rules(0, 100);
    let tick = store
        .claim_due(&claim_params("a", 25, rules))
        .await
        .unwrap();

    let (late, on_time) = owed(oldest, tick.now, &rules);
    assert!(on_time.is_empty());
    assert_eq!(late[0], oldest);
    assert_eq!((tick.skipped, tick.deferred), (0, 0));
    check(&store, &routine, &tick, &late, next_minute(tick.now)).await;
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn catch_up_under_a_small_cap_defers_and_resumes(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routine, oldest) = outage(&store, &pool, MisfirePolicy::CatchUp).await;
    let rules = rules(0, 100);
    let first = store.claim_due(&claim_params("a", 3, rules)).await.unwrap();

    let (late, _) = owed(oldest, first.now, &rules);
    assert_eq!(first.deferred, late.len() - 3);
    assert_eq!(first.skipped, 0);
    // The clock stays at the oldest deferred occurrence, so it is still owed.
    check(&store, &routine, &first, &late[..3], late[3]).await;

    // The next tick, with room, claims the rest (and whatever came due in between) and nothing
    // twice.
    let second = store
        .claim_due(&claim_params("a", 25, rules))
        .await
        .unwrap();
    let all = minutes(oldest, second.now);
    let rest: Vec<_> = second
        .fires
        .iter()
        .map(|f| f.occurrence.scheduled_at)
        .collect();
    assert_eq!(rest, all[3..]);
    assert_eq!((second.deferred, second.skipped), (0, 0));
    assert!(
        second
            .fires
            .iter()
            .all(|f| f.outcome(second.token) == ClaimOutcome::Fresh)
    );
    let rows: Vec<_> = ledger(&store, routine.id)
        .await
        .into_iter()
        .map(|f| f.scheduled_at)
        .collect();
    assert_eq!(rows, all);
    let after = store.get_routine(routine.id).await.unwrap();
    assert_eq!(after.next_run_at, Some(next_minute(second.now)));
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn catch_up_coalesces_beyond_the_backlog(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routine, oldest) = outage(&store, &pool, MisfirePolicy::CatchUp).await;
    let rules = rules(0, 4);
    let tick = store
        .claim_due(&claim_params("a", 25, rules))
        .await
        .unwrap();

    let (late, _) = owed(oldest, tick.now, &rules);
    // The latest four fire; the older ones are counted as skipped.
    let kept = &late[late.len() - 4..];
    assert_eq!(tick.skipped, u64::try_from(late.len() - 4).unwrap());
    assert_eq!(tick.deferred, 0);
    check(&store, &routine, &tick, kept, next_minute(tick.now)).await;
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn skip_fires_no_misfire(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routine, oldest) = outage(&store, &pool, MisfirePolicy::Skip).await;
    let rules = rules(0, 100);
    let tick = store
        .claim_due(&claim_params("a", 25, rules))
        .await
        .unwrap();

    let (late, on_time) = owed(oldest, tick.now, &rules);
    assert!(on_time.is_empty());
    assert_eq!(tick.skipped, u64::try_from(late.len()).unwrap());
    assert_eq!(tick.deferred, 0);
    // Nothing fires and nothing is written; the clock waits for the next minute.
    check(&store, &routine, &tick, &[], next_minute(tick.now)).await;
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn skip_fires_nothing_of_a_misfired_routine_even_within_the_grace(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routine, oldest) = outage(&store, &pool, MisfirePolicy::Skip).await;
    let rules = rules(90, 100);
    let tick = store
        .claim_due(&claim_params("a", 25, rules))
        .await
        .unwrap();

    let (late, on_time) = owed(oldest, tick.now, &rules);
    assert!(!on_time.is_empty());
    assert_eq!(
        tick.skipped,
        u64::try_from(late.len() + on_time.len()).unwrap()
    );
    check(&store, &routine, &tick, &[], next_minute(tick.now)).await;
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn within_the_grace_everything_owed_fires_under_every_policy(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    // Fifteen minutes of grace cover the whole ten-minute outage: nothing has misfired.
    let rules = rules(900, 100);
    for policy in [
        MisfirePolicy::FireOnce,
        MisfirePolicy::CatchUp,
        MisfirePolicy::Skip,
    ] {
        let (routine, oldest) = outage(&store, &pool, policy).await;
        let tick = store
            .claim_due(&claim_params("a", 25, rules))
            .await
            .unwrap();
        let (late, on_time) = owed(oldest, tick.now, &rules);
        assert!(late.is_empty(), "{policy}: {late:?}");
        assert_eq!((tick.skipped, tick.deferred), (0, 0), "{policy}");
        check(&store, &routine, &tick, &on_time, next_minute(tick.now)).await;
        // Parked, so the next policy's claim sees its own routine alone: claimed in the minute
        // before the next policy's claim, this one would be due again in that claim's minute.
        let tomorrow = db_now(&pool).await + TimeDelta::days(1);
        set_next_run(&pool, routine.id, tomorrow).await;
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_long_outage_is_walked_over_several_ticks_and_fires_once(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let routine = create(&store, EVERY_MINUTE, MisfirePolicy::FireOnce).await;
    // Ten hours down, and a walk bound of 50 occurrences a tick: the backlog takes a dozen
    // ticks to walk, each skipping what is certainly superseded, before the latest one fires.
    let oldest = minute_floor(db_now(&pool).await) - TimeDelta::hours(10);
    set_next_run(&pool, routine.id, oldest).await;
    let rules = MisfireRules {
        max_scan: 50,
        ..rules(0, 100)
    };
    let params = claim_params("a", 25, rules);

    let mut skipped = 0;
    let mut ticks = 0;
    let last = loop {
        let tick = store.claim_due(&params).await.unwrap();
        ticks += 1;
        assert!(ticks <= 20, "the walk does not end: {tick:?}");
        skipped += tick.skipped;
        if !tick.fires.is_empty() {
            break tick;
        }
        // While walking, nothing is written and the clock only moves forward.
        assert!(ledger(&store, routine.id).await.is_empty());
        let clock = store
            .get_routine(routine.id)
            .await
            .unwrap()
            .next_run_at
            .unwrap();
        assert!(
            clock > oldest && clock <= tick.now,
            "{clock} after tick {ticks}"
        );
    };
    assert!(ticks >= 12, "{ticks} ticks");
    // Every missed minute is either the one fire or counted as skipped, exactly once.
    let (late, on_time) = owed(oldest, last.now, &rules);
    assert!(on_time.is_empty());
    assert_eq!(skipped, u64::try_from(late.len() - 1).unwrap());
    check(
        &store,
        &routine,
        &last,
        &[*late.last().unwrap()],
        next_minute(last.now),
    )
    .await;
}

/// A run limit of 4 under catch-up with ten owed: a first claim under a cap of 3 claims the
/// oldest three and lowers the count to 1, the next claims one more and ends the clock (the
/// routine is finished), and a third claims nothing. Skipped misfires of fire-once do not count.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_run_limit_is_spent_by_what_claims_claim_and_then_the_clock_stops(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let (routine, oldest) = outage(&store, &pool, MisfirePolicy::CatchUp).await;
    sqlx::query("UPDATE cm.routines SET runs_left = 4 WHERE id = $1")
        .bind(routine.id)
        .execute(&pool)
        .await
        .unwrap();
    let rules = rules(0, 100);
    let first = store.claim_due(&claim_params("a", 3, rules)).await.unwrap();
    let (late, _) = owed(oldest, first.now, &rules);
    check(&store, &routine, &first, &late[..3], late[3]).await;
    assert_eq!(
        store.get_routine(routine.id).await.unwrap().runs_left,
        Some(1)
    );

    let second = store
        .claim_due(&claim_params("a", 25, rules))
        .await
        .unwrap();
    let claimed: Vec<_> = second
        .fires
        .iter()
        .map(|f| f.occurrence.scheduled_at)
        .collect();
    assert_eq!(claimed, &late[3..4]);
    let after = store.get_routine(routine.id).await.unwrap();
    assert_eq!((after.runs_left, after.next_run_at), (Some(0), None));
    assert!(after.is_finished(second.now));
    let third = store
        .claim_due(&claim_params("a", 25, rules))
        .await
        .unwrap();
    assert!(third.fires.is_empty());
    assert_eq!(ledger(&store, routine.id).await.len(), 4);

    // fire-once skips the older misfires; only the one it fires is a run.
    let (once, _) = outage(&store, &pool, MisfirePolicy::FireOnce).await;
    sqlx::query("UPDATE cm.routines SET runs_left = 2 WHERE id = $1")
        .bind(once.id)
        .execute(&pool)
        .await
        .unwrap();
    let tick = store
        .claim_due(&claim_params("a", 25, rules))
        .await
        .unwrap();
    assert_eq!(tick.fires.len(), 1);
    assert!(tick.skipped >= 9);
    let after = store.get_routine(once.id).await.unwrap();
    assert_eq!(after.runs_left, Some(1));
    assert!(after.next_run_at.is_some());
}

/// Jitter (`jitter 40s`): a routine's clock is its next occurrence's planned instant, a claim
/// owes an occurrence once that instant has passed, the ledger keeps the occurrence as its key
/// and the planned instant beside it, and the clock moves to the next occurrence's planned
/// instant. Through the plain claim and the one that writes the outbox in the claim.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn a_jittered_occurrence_comes_due_at_its_planned_instant_and_keeps_its_key(pool: PgPool) {
    let store = PgStore::new(pool.clone());
    let text = "* * * * * jitter 40s";
    for (name, params) in [
        ("plain", claim_params("a", 100, rules(3600, 100))),
        ("outbox", crate::support::outbox_params("a")),
    ] {
        let routine = create(&store, text, MisfirePolicy::CatchUp).await;
        let schedule = cm_domain::Schedule::parse(text, "UTC").unwrap();
        let planned = |o: DateTime<Utc>| schedule.planned(routine.id, o);
        // Written with its first occurrence's planned instant.
        let created = store.get_routine(routine.id).await.unwrap();
        let first = next_minute(created.created_at);
        assert_eq!(created.next_run_at, Some(planned(first)), "{name}");

        // Three minutes behind: what is owed is every minute whose planned instant passed.
        let oldest = minute_floor(db_now(&pool).await) - TimeDelta::minutes(3);
        set_next_run(&pool, routine.id, planned(oldest)).await;
        let tick = store.claim_due(&params).await.unwrap();
        let expected: Vec<_> = minutes(oldest, tick.now + TimeDelta::minutes(1))
            .into_iter()
            .filter(|m| planned(*m) <= tick.now)
            .collect();
        assert!(expected.len() >= 3, "{name}: {expected:?}");
        let mine: Vec<_> = tick
            .fires
            .iter()
            .filter(|f| f.occurrence.routine_id == routine.id)
            .collect();
        let claimed: Vec<_> = mine.iter().map(|f| f.occurrence.scheduled_at).collect();
        assert_eq!(claimed, expected, "{name}");
        for f in &mine {
            assert_eq!(f.planned_at, planned(f.occurrence.scheduled_at), "{name}");
        }
        let stored: Vec<(DateTime<Utc>, Option<DateTime<Utc>>)> = sqlx::query_as(
            "SELECT scheduled_at, planned_at FROM cm.routine_fires
             WHERE routine_id = $1 ORDER BY scheduled_at",
        )
        .bind(routine.id)
        .fetch_all(&pool)
        .await
        .unwrap();
        let want: Vec<_> = expected.iter().map(|m| (*m, Some(planned(*m)))).collect();
        assert_eq!(stored, want, "{name}");
        let next = *expected.last().unwrap() + TimeDelta::minutes(1);
        let after = store.get_routine(routine.id).await.unwrap();
        assert_eq!(after.next_run_at, Some(planned(next)), "{name}");
        // Not due again before that instant.
        let again = store.claim_due(&params).await.unwrap();
        assert!(
            again.now >= planned(next)
                || again
                    .fires
                    .iter()
                    .all(|f| f.occurrence.routine_id != routine.id),
            "{name}"
        );
    }
}
