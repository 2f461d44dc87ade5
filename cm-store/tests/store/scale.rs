//! The hot queries at scale: the tick's due query, the reaper, the `fires` listing, retention and
//! the automatic pause read on the order of the rows they return, not of the table. Each test
//! builds a large table with one `INSERT … SELECT generate_series`, has the store explain its own
//! statement (`PgStore::explain_analyze`: `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` in a
//! transaction it rolls back), and reads the plan: how many rows the scans produced and how many
//! buffers the statement touched. Without the right index each of them reads the whole group
//! (100,000 rows, thousands of buffers).

use std::time::Duration;

use cm_domain::{FireOutcome, Lease};
use cm_store::explain::HotStatement;
use cm_store::{DueCursor, FireCursor, FireFilter, FireLedger, PgStore, ReapParams};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::failed_fires;

/// How many rows each test builds: the group a statement must not read whole.
const ROWS: i64 = 100_000;

/// The page or batch size each statement asks for.
const LIMIT: i64 = 100;

/// What `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` reported.
struct Plan(Value);

impl Plan {
    /// Every node of the plan, depth first.
    fn nodes(&self) -> Vec<&Value> {
        fn walk<'a>(node: &'a Value, out: &mut Vec<&'a Value>) {
            out.push(node);
            for child in node["Plans"].as_array().into_iter().flatten() {
                walk(child, out);
            }
        }
        let mut out = Vec::new();
        walk(&self.0[0]["Plan"], &mut out);
        out
    }

    /// The most rows any node produced (per loop times loops).
    fn most_rows(&self) -> f64 {
        self.nodes()
            .iter()
            .map(|n| {
                n["Actual Rows"].as_f64().unwrap_or(0.0) * n["Actual Loops"].as_f64().unwrap_or(1.0)
            })
            .fold(0.0, f64::max)
    }

    /// Shared buffers the whole statement touched (hit or read); the root counts its children.
    fn buffers(&self) -> i64 {
        let root = &self.0[0]["Plan"];
        root["Shared Hit Blocks"].as_i64().unwrap_or(0)
            + root["Shared Read Blocks"].as_i64().unwrap_or(0)
    }

    /// Rows the plan's nodes read and threw away by a filter (per loop times loops).
    fn removed(&self) -> f64 {
        self.nodes()
            .iter()
            .map(|n| {
                n["Rows Removed by Filter"].as_f64().unwrap_or(0.0)
                    * n["Actual Loops"].as_f64().unwrap_or(1.0)
            })
            .sum()
    }

    /// Asserts the statement read on the order of `LIMIT` rows, not the group of `ROWS`.
    #[track_caller]
    fn assert_reads_about_the_limit(&self, what: &str) {
        let plan = serde_json::to_string_pretty(&self.0).unwrap();
        assert!(
            self.removed() <= (2 * LIMIT) as f64,
            "{what}: the plan read and dropped {} rows for a limit of {LIMIT}:\n{plan}",
            self.removed()
        );
        assert!(
            self.most_rows() <= (2 * LIMIT) as f64,
            "{what}: a node produced {} rows for a limit of {LIMIT}:\n{plan}",
            self.most_rows()
        );
        assert!(
            self.buffers() < 1_000,
            "{what}: {} buffers for a limit of {LIMIT}:\n{plan}",
            self.buffers()
        );
    }
}

/// Has the store explain `statement` under EXPLAIN ANALYZE, in a transaction it rolls back, so
/// a statement that locks or writes leaves nothing behind.
async fn explain(pool: &PgPool, statement: HotStatement) -> Plan {
    Plan(
        PgStore::new(pool.clone())
            .explain_analyze(&statement)
            .await
            .unwrap(),
    )
}

/// The due walk of a claim of `LIMIT` routines, resumed `after` a cursor or whole.
fn due_walk(after: Option<DueCursor>) -> HotStatement {
    HotStatement::Due {
        max_routines: LIMIT as u32,
        requests: (LIMIT / 5) as usize,
        mission_room: None,
        after,
        group: None,
    }
}

/// The due walk of a claim of `LIMIT` routines in turns between `keys`, whole.
fn due_walk_in_turns(keys: Vec<String>) -> HotStatement {
    HotStatement::DueInTurns {
        max_routines: LIMIT as u32,
        requests: (LIMIT / 5) as usize,
        mission_room: None,
        after: None,
        group: None,
        keys,
    }
}

/// Inserts one routine per row of `generate_series(1, ROWS)`, all due at the same instant an
/// hour ago (a fleet of routines on `0 * * * *`), and returns nothing: the test reads them back.
async fn routines_sharing_one_instant(pool: &PgPool) {
    sqlx::query(
        "INSERT INTO cm.routines (id, name, schedule, kind, payload, next_run_at)
         SELECT gen_random_uuid(), 'hourly ' || i, '0 * * * *', 'message', '{}',
                date_trunc('hour', now()) - interval '1 hour'
         FROM generate_series(1, $1) AS i",
    )
    .bind(ROWS)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE cm.routines")
        .execute(pool)
        .await
        .unwrap();
}

/// One routine, and `rows` ledger rows of it, one a minute back from the current minute, each
/// `status` with a lease running out `lease_secs` from now. Returns the routine's id.
async fn ledger_rows(pool: &PgPool, rows: i64, status: &str, lease_secs: f64) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO cm.routines (id, name, schedule, kind, payload) VALUES ($1, 'busy ' || $1::text, '* * * * *', 'message', '{}')",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO cm.routine_fires
             (routine_id, scheduled_at, status, completed_at, error, claimant, claim_token,
              lease_expires_at)
         SELECT $1, date_trunc('minute', now()) - make_interval(mins => i::int), $2::text,
                CASE WHEN $2::text = 'claimed' THEN NULL ELSE now() END,
                CASE WHEN $2::text = 'failed' THEN 'seeded failure' END,
                'seed', gen_random_uuid(), now() + make_interval(secs => $3)
         FROM generate_series(1, $4) AS i",
    )
    .bind(id)
    .bind(status)
    .bind(lease_secs)
    .bind(rows)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE cm.routine_fires")
        .execute(pool)
        .await
        .unwrap();
    id
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_due_query_reads_the_limit_not_the_group_sharing_an_instant(pool: PgPool) {
    routines_sharing_one_instant(&pool).await;
    let plan = explain(&pool, due_walk(None)).await;
    plan.assert_reads_about_the_limit("due query");
}

/// A drain's claims resume the due walk after the last routine the previous claim handled: the
/// index scan starts there, so it reads about the limit even with every entry before the
/// cursor still in the index (dead entries of routines moved on, not yet vacuumed, read the
/// same way).
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_resumed_due_query_starts_at_its_cursor(pool: PgPool) {
    routines_sharing_one_instant(&pool).await;
    let (at, id): (chrono::DateTime<chrono::Utc>, Uuid) = sqlx::query_as(
        "SELECT next_run_at, id FROM cm.routines ORDER BY next_run_at, id OFFSET $1 LIMIT 1",
    )
    .bind(ROWS - 10 * LIMIT)
    .fetch_one(&pool)
    .await
    .unwrap();
    let after = DueCursor {
        next_run_at: at,
        routine_id: id,
    };
    let plan = explain(&pool, due_walk(Some(after))).await;
    plan.assert_reads_about_the_limit("resumed due query");
}

/// A fleet moved due at once by one `UPDATE` (a bulk reschedule or resume) after the table was
/// last analyzed: its statistics still say every clock is an hour or two ahead, so an estimate
/// of what is due from them is a few dozen rows. The walk still reads its limit through the
/// index in order; planned from that estimate, it read every due routine and sorted them all
/// for each claim, and a drain of 200,000 ran at half the rate of one analyzed.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_due_query_reads_the_limit_when_the_statistics_say_nothing_is_due(pool: PgPool) {
    sqlx::query(
        "INSERT INTO cm.routines (id, name, schedule, kind, payload, next_run_at)
         SELECT gen_random_uuid(), 'parked ' || i, '0 * * * *', 'message', '{}',
                date_trunc('hour', now()) + interval '2 hours' + make_interval(secs => i % 3600)
         FROM generate_series(1, $1) AS i",
    )
    .bind(ROWS)
    .execute(&pool)
    .await
    .unwrap();
    // Analyzed while every clock is ahead; then every clock moved due by one statement.
    for statement in [
        "ANALYZE cm.routines",
        "UPDATE cm.routines SET next_run_at = now() - interval '2 seconds'",
    ] {
        sqlx::query(statement).execute(&pool).await.unwrap();
    }
    let plan = explain(&pool, due_walk(None)).await;
    plan.assert_reads_about_the_limit("due query on stale statistics");
    let plan = explain(&pool, due_walk_in_turns(vec!["k".into()])).await;
    plan.assert_reads_about_the_limit("due query in turns on stale statistics");
}

/// Turns between keys: every routine of the group on key `big`, and ten small keys of five
/// routines each due a minute later, past the walk's frontier. The walk reads its limit, and
/// each small key's heads its share through `routines_key_due_idx`: neither reads the big
/// key's hundred thousand.
#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_due_query_in_turns_reads_each_keys_share_not_the_big_key(pool: PgPool) {
    routines_sharing_one_instant(&pool).await;
    sqlx::query("UPDATE cm.routines SET concurrency_key = 'big'")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO cm.routines (id, name, schedule, kind, payload, next_run_at, concurrency_key)
         SELECT gen_random_uuid(), 'small ' || i, '0 * * * *', 'message', '{}',
                date_trunc('hour', now()) - interval '59 minutes', 't' || (i % 10)
         FROM generate_series(1, 50) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE cm.routines")
        .execute(&pool)
        .await
        .unwrap();
    let mut keys: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
    keys.push("big".into());
    let plan = explain(&pool, due_walk_in_turns(keys)).await;
    plan.assert_reads_about_the_limit("due query in turns");
    let text = plan.0.to_string();
    assert!(text.contains("routines_key_due_idx"), "{text}");
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_reaper_reads_the_expired_claims_not_the_live_ones(pool: PgPool) {
    // A hundred thousand live claims, and a few expired ones claimed after all of them: walking
    // claims in claimed_at order would pass every live one first.
    let routine = ledger_rows(&pool, ROWS, "claimed", 60.0).await;
    sqlx::query(
        "INSERT INTO cm.routine_fires
             (routine_id, scheduled_at, claimant, claim_token, claimed_at, lease_expires_at)
         SELECT $1, now() + make_interval(days => i), 'crashed', gen_random_uuid(),
                now() + interval '1 second', now() - interval '1 second'
         FROM generate_series(1, 5) AS i",
    )
    .bind(routine)
    .execute(&pool)
    .await
    .unwrap();
    let reap = ReapParams {
        claimant: "reaper".into(),
        lease: Lease::new(Duration::from_secs(60)).unwrap(),
        limit: LIMIT as u32,
        group: None,
    };
    let plan = explain(&pool, HotStatement::Reap(reap)).await;
    plan.assert_reads_about_the_limit("reaper");
    assert_eq!(
        plan.0[0]["Plan"]["Actual Rows"].as_f64(),
        Some(5.0),
        "{:#}",
        plan.0
    );
}

/// Explains the listing for a filter, from `after`.
async fn explain_listing(
    pool: &PgPool,
    routine: Option<Uuid>,
    outcome: Option<FireOutcome>,
    after: Option<FireCursor>,
) -> Plan {
    let filter = FireFilter {
        routine_id: routine,
        outcome,
        limit: LIMIT as u32,
        after,
    };
    explain(pool, HotStatement::ListFires(filter)).await
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn every_listing_of_fires_reads_a_page_not_the_ledger(pool: PgPool) {
    // A ledger of fired rows with a few failed ones among the oldest: `--status failed` must not
    // walk the fired ones to find them.
    let routine = ledger_rows(&pool, ROWS, "fired", -3600.0).await;
    sqlx::query(
        "UPDATE cm.routine_fires SET status = 'failed', error = 'boom'
         WHERE scheduled_at < date_trunc('minute', now()) - make_interval(mins => $1::int)",
    )
    .bind(i32::try_from(ROWS - 3 * LIMIT).unwrap())
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE cm.routine_fires")
        .execute(&pool)
        .await
        .unwrap();
    let store = PgStore::new(pool.clone());
    let middle = store
        .list_fires(&FireFilter {
            limit: u32::try_from(ROWS / 2).unwrap(),
            ..FireFilter::default()
        })
        .await
        .unwrap();
    let cursor = FireCursor::after(middle.last().unwrap());

    for (routine, status, after) in [
        (None, None, None),
        (None, Some(FireOutcome::Failed), None),
        (None, Some(FireOutcome::Fired), None),
        (None, Some(FireOutcome::Succeeded), None),
        (None, Some(FireOutcome::Lost), None),
        (None, Some(FireOutcome::Claimed), None),
        (None, Some(FireOutcome::Skipped), None),
        (Some(routine), None, None),
        (None, None, Some(cursor)),
        (None, Some(FireOutcome::Fired), Some(cursor)),
        (None, Some(FireOutcome::Failed), Some(cursor)),
        (Some(routine), None, Some(cursor)),
    ] {
        let plan = explain_listing(&pool, routine, status, after).await;
        let what = format!("fires routine {routine:?} status {status:?} after {after:?}");
        plan.assert_reads_about_the_limit(&what);
    }
    let failed = failed_fires(&store).await;
    assert_eq!(failed.len(), 100);
    assert!(failed.iter().all(|f| f.status == "failed"));
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn retention_reads_the_fires_it_deletes_not_the_ledger(pool: PgPool) {
    // A ledger of fires each settled a second after its occurrence, one a minute over about
    // seventy days: more than half is past a thirty-day retention. The ten oldest occurrences
    // were settled only now (a backfill): retention passes over them.
    let routine = ledger_rows(&pool, ROWS, "fired", -3600.0).await;
    sqlx::query(
        "UPDATE cm.routine_fires
         SET completed_at = CASE WHEN scheduled_at < (SELECT min(scheduled_at) FROM cm.routine_fires)
                                                     + interval '10 minutes'
                                 THEN now() ELSE scheduled_at + interval '1 second' END
         WHERE routine_id = $1",
    )
    .bind(routine)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE cm.routine_fires")
        .execute(&pool)
        .await
        .unwrap();
    let group: i16 = sqlx::query_scalar("SELECT group_id FROM cm.routines WHERE id = $1")
        .bind(routine)
        .fetch_one(&pool)
        .await
        .unwrap();
    let retention = Duration::from_secs(30 * 24 * 3600);
    for group in [None, Some(group)] {
        let prune = HotStatement::PruneSettled {
            retention,
            limit: LIMIT as u32,
            group,
        };
        let plan = explain(&pool, prune).await;
        plan.assert_reads_about_the_limit(&format!("retention in group {group:?}"));
        assert_eq!(
            plan.0[0]["Plan"]["Actual Rows"].as_f64(),
            Some(0.0),
            "a DELETE returns no rows\n{:#}",
            plan.0
        );
    }
    let store = PgStore::new(pool.clone());
    let before = crate::support::fire_count(&pool).await;
    assert_eq!(
        store.prune_settled(retention, LIMIT as u32).await.unwrap(),
        100
    );
    let settled_now: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM cm.routine_fires WHERE completed_at > now() - interval '1 minute'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(settled_now, 10, "the fires settled now are kept");
    assert_eq!(crate::support::fire_count(&pool).await, before - 100);
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn pages_from_a_cursor_cover_the_listing_once_in_order(pool: PgPool) {
    // Three routines firing at the same five instants: ties on scheduled_at across pages.
    for _ in 0..3 {
        let routine = ledger_rows(&pool, 5, "fired", -3600.0).await;
        sqlx::query(
            "UPDATE cm.routine_fires SET status = 'failed', error = 'boom'
             WHERE routine_id = $1
               AND scheduled_at = (SELECT min(scheduled_at) FROM cm.routine_fires WHERE routine_id = $1)",
        )
        .bind(routine)
        .execute(&pool)
        .await
        .unwrap();
    }
    let store = PgStore::new(pool.clone());
    for (outcome, total) in [
        (None, 15),
        (Some(FireOutcome::Failed), 3),
        (Some(FireOutcome::Fired), 12),
    ] {
        let whole = store
            .list_fires(&FireFilter {
                outcome,
                limit: 100,
                ..FireFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(whole.len(), total);
        let keys: Vec<_> = whole
            .iter()
            .map(|f| (f.scheduled_at, f.routine_id))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort_by(|a, b| b.cmp(a));
        assert_eq!(keys, sorted, "newest first, then routine id descending");
        for limit in [1, 2, 4, 15] {
            let mut paged = Vec::new();
            let mut after = None;
            loop {
                let page = store
                    .list_fires(&FireFilter {
                        outcome,
                        limit,
                        after,
                        ..FireFilter::default()
                    })
                    .await
                    .unwrap();
                assert!(page.len() <= limit as usize);
                let Some(last) = page.last() else { break };
                after = Some(FireCursor::after(last));
                paged.extend(page);
            }
            assert_eq!(paged, whole, "outcome {outcome:?}, pages of {limit}");
        }
    }
}

#[sqlx::test(migrator = "cm_store::MIGRATOR")]
async fn the_automatic_pause_reads_the_fires_since_the_update_not_the_history(pool: PgPool) {
    // A million fires of one routine, then a resume (its record starts clean) and one failure
    // since: fewer than N fires since the update, so a read in occurrence order would walk the
    // whole history looking for more.
    const HISTORY: i64 = 1_000_000;
    let routine = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO cm.routines (id, name, schedule, kind, payload, updated_at)
         VALUES ($1, 'long-lived', '* * * * *', 'message', '{}', now() - interval '1 minute')",
    )
    .bind(routine)
    .execute(&pool)
    .await
    .unwrap();
    // Row 0 is the failure, claimed now; rows 1 to HISTORY fired a minute apart before the
    // update.
    sqlx::query(
        "INSERT INTO cm.routine_fires
             (routine_id, scheduled_at, claimed_at, status, completed_at, error, claimant,
              claim_token, lease_expires_at)
         SELECT $1, t, t, CASE WHEN i = 0 THEN 'failed' ELSE 'fired' END, t,
                CASE WHEN i = 0 THEN 'boom' END, 'seed', gen_random_uuid(), t
         FROM (SELECT i, CASE WHEN i = 0 THEN now()
                              ELSE date_trunc('minute', now()) - make_interval(hours => 1, mins => i::int)
                         END AS t
               FROM generate_series(0, $2) AS i) s",
    )
    .bind(routine)
    .bind(HISTORY)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE cm.routine_fires")
        .execute(&pool)
        .await
        .unwrap();
    let pause = HotStatement::PauseFailing {
        after_failures: 5,
        window: Duration::from_secs(3600),
        group: None,
    };
    let plan = explain(&pool, pause).await;
    plan.assert_reads_about_the_limit("automatic pause");
    assert_eq!(
        plan.0[0]["Plan"]["Actual Rows"].as_f64(),
        Some(0.0),
        "one failure is not five: nothing is paused\n{:#}",
        plan.0
    );
}
