//! The one ledger check every run ends with, whatever its faults and its backend: every second
//! from a routine's first occurrence to its last (every fifth, for the routines of a
//! `--retries` run that retry) has exactly one `routine_fires` row, every row is settled, no row
//! is off the grid, and no routine fell behind (a stall would otherwise pass,
//! since only the span up to the last occurrence is owed). What the backend received is
//! checked against these rows by the backend's own module.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgPool;
use uuid::Uuid;

use super::report::Findings;

/// How far a routine's last occurrence may trail the moment the routines were paused. Every
/// routine fires every second, so a larger gap means the schedulers had stopped keeping up.
pub(super) const MAX_LAG: Duration = Duration::from_secs(15);

/// What the ledger holds after the run.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Ledger {
    pub routines: usize,
    /// Routines with no fire at all.
    pub never_fired: usize,
    /// Seconds owed: for each routine, its first occurrence to its last, inclusive.
    pub occurrences: i64,
    /// Rows of `routine_fires`.
    pub rows: i64,
    /// Owed seconds without a row.
    pub missing_slots: i64,
    pub missing_examples: Vec<String>,
    /// Rows for no owed second: before the routine's first occurrence, off the one-second grid,
    /// or of a routine the run did not create.
    pub unexpected_rows: i64,
    pub claimed: i64,
    pub fired: i64,
    pub failed: i64,
    /// Rows taken over after a crash (attempt > 1).
    pub retried: i64,
    pub max_attempt: i64,
    /// Retries begun by a routine's retry policy (`routine_fires.retry`, summed), and the rows
    /// they were of: how many of those ended `fired`.
    pub retries_begun: i64,
    pub rows_with_retries: i64,
    pub fired_after_retry: i64,
    /// Unsettled and failed rows, for the report.
    pub odd_rows: Vec<String>,
    /// How far the latest routine's last occurrence trails the pause, in seconds (of the
    /// routines not paused for their failures).
    pub max_lag_secs: f64,
    /// Routines the schedulers paused for their failures.
    pub auto_paused: usize,
}

impl Ledger {
    /// Owed occurrences the ledger does not have.
    pub fn missing(&self) -> i64 {
        self.missing_slots + self.never_fired as i64
    }

    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.missing_slots > 0 {
            problems.push(format!(
                "{} owed occurrences have no ledger row (first: {})",
                self.missing_slots,
                self.missing_examples.join(", ")
            ));
        }
        if self.never_fired > 0 {
            problems.push(format!("{} routines never fired", self.never_fired));
        }
        if self.unexpected_rows > 0 {
            problems.push(format!(
                "{} ledger rows for seconds that were never owed",
                self.unexpected_rows
            ));
        }
        if self.claimed > 0 {
            problems.push(format!("{} rows are still claimed", self.claimed));
        }
        if self.max_lag_secs > MAX_LAG.as_secs_f64() {
            problems.push(format!(
                "a routine's last occurrence trails the pause by {:.1} s: the schedulers stalled",
                self.max_lag_secs
            ));
        }
        problems
    }

    /// The summary's ledger lines and problems.
    pub fn findings(&self) -> Findings {
        let mut f = Findings::default();
        f.line(
            "occurrences",
            format!(
                "{} owed over {} routines; {} ledger rows",
                self.occurrences, self.routines, self.rows
            ),
        );
        f.line(
            "missing rows",
            format!(
                "{} ({} owed seconds without a row, {} routines never fired)",
                self.missing(),
                self.missing_slots,
                self.never_fired
            ),
        );
        f.line("failed", self.failed.to_string());
        f.line(
            "retried",
            format!(
                "{} rows with attempt > 1 (max attempt {})",
                self.retried, self.max_attempt
            ),
        );
        f.line(
            "retry policy",
            format!(
                "{} retries begun, of {} occurrences; {} of those fired in the end",
                self.retries_begun, self.rows_with_retries, self.fired_after_retry
            ),
        );
        f.line("claimed left", self.claimed.to_string());
        f.line("unexpected rows", self.unexpected_rows.to_string());
        f.line(
            "lag at pause",
            format!(
                "{:.1} s (the last occurrence of the routine furthest behind, before the pause; {} routines paused for their failures left out)",
                self.max_lag_secs, self.auto_paused
            ),
        );
        f.problems = self.problems();
        f
    }
}

/// The per-routine span, as the check reads it back.
type Span = (Uuid, DateTime<Utc>, i64, Option<DateTime<Utc>>);

/// Reads the ledger back and checks it against the routines' first occurrences.
///
/// `steps` are the seconds between each routine's occurrences, in the order of `firsts`.
pub(super) async fn check_ledger(
    pool: &PgPool,
    firsts: &[(Uuid, DateTime<Utc>)],
    steps: &[i64],
    paused_at: DateTime<Utc>,
) -> anyhow::Result<Ledger> {
    anyhow::ensure!(steps.len() == firsts.len(), "a step for every routine");
    let ids: Vec<Uuid> = firsts.iter().map(|f| f.0).collect();
    let starts: Vec<DateTime<Utc>> = firsts.iter().map(|f| f.1).collect();
    let mut ledger = Ledger {
        routines: firsts.len(),
        ..Ledger::default()
    };

    let step_of: std::collections::HashMap<Uuid, i64> =
        ids.iter().copied().zip(steps.iter().copied()).collect();
    let spans: Vec<Span> = sqlx::query_as(
        "SELECT b.id, b.first, count(f.scheduled_at), max(f.scheduled_at)
         FROM UNNEST($1::uuid[], $2::timestamptz[]) AS b(id, first)
         LEFT JOIN cm.routine_fires f ON f.routine_id = b.id
         GROUP BY b.id, b.first",
    )
    .bind(&ids)
    .bind(&starts)
    .fetch_all(pool)
    .await?;
    // A routine the schedulers paused for its failures (a receiver's outage failing five in a
    // row) stopped on purpose: its lag is not a stall.
    let auto_paused: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM cm.routines
         WHERE id = ANY($1) AND paused_reason LIKE 'paused by cm: its last % fires failed%'",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await?;
    ledger.auto_paused = auto_paused.len();
    for (id, first, _, last) in &spans {
        match last {
            Some(last) if last >= first => {
                let step = step_of.get(id).copied().unwrap_or(1).max(1);
                ledger.occurrences += (*last - *first).num_seconds() / step + 1;
                if !auto_paused.contains(id) {
                    let lag = (paused_at - *last).num_milliseconds() as f64 / 1000.0;
                    ledger.max_lag_secs = ledger.max_lag_secs.max(lag);
                }
            }
            _ => ledger.never_fired += 1,
        }
    }

    // Every owed second without a row: the heart of "nothing lost".
    let missing: Vec<(Uuid, DateTime<Utc>)> = sqlx::query_as(
        "SELECT b.id, s.at
         FROM UNNEST($1::uuid[], $2::timestamptz[], $3::bigint[]) AS b(id, first, step)
         CROSS JOIN LATERAL (SELECT max(scheduled_at) AS last FROM cm.routine_fires
                             WHERE routine_id = b.id) l
         CROSS JOIN LATERAL generate_series(b.first, l.last, make_interval(secs => b.step))
             AS s(at)
         WHERE NOT EXISTS (SELECT 1 FROM cm.routine_fires f
                           WHERE f.routine_id = b.id AND f.scheduled_at = s.at)
         ORDER BY s.at, b.id",
    )
    .bind(&ids)
    .bind(&starts)
    .bind(steps)
    .fetch_all(pool)
    .await?;
    ledger.missing_slots = missing.len() as i64;
    ledger.missing_examples = missing
        .iter()
        .take(10)
        .map(|(id, at)| format!("{id} at {}", at.to_rfc3339()))
        .collect();

    ledger.unexpected_rows = sqlx::query_scalar(
        "SELECT count(*)
         FROM cm.routine_fires f
         LEFT JOIN UNNEST($1::uuid[], $2::timestamptz[], $3::bigint[]) AS b(id, first, step)
             ON b.id = f.routine_id
         WHERE b.id IS NULL OR f.scheduled_at < b.first
            OR date_trunc('second', f.scheduled_at) <> f.scheduled_at
            OR extract(epoch FROM f.scheduled_at - b.first)::bigint % b.step <> 0",
    )
    .bind(&ids)
    .bind(&starts)
    .bind(steps)
    .fetch_one(pool)
    .await?;

    type Counts = (i64, i64, i64, i64, i64, i64, i64, i64, i64);
    let (rows, claimed, fired, failed, retried, max_attempt, begun, with_retries, after_retry): Counts =
        sqlx::query_as(
            "SELECT count(*),
                    count(*) FILTER (WHERE status = 'claimed'),
                    count(*) FILTER (WHERE status = 'fired'),
                    count(*) FILTER (WHERE status = 'failed'),
                    count(*) FILTER (WHERE attempt > 1),
                    COALESCE(max(attempt), 0)::bigint,
                    COALESCE(sum(retry), 0)::bigint,
                    count(*) FILTER (WHERE retry > 0),
                    count(*) FILTER (WHERE retry > 0 AND status = 'fired')
             FROM cm.routine_fires",
        )
        .fetch_one(pool)
        .await?;
    ledger.retries_begun = begun;
    ledger.rows_with_retries = with_retries;
    ledger.fired_after_retry = after_retry;
    ledger.rows = rows;
    ledger.claimed = claimed;
    ledger.fired = fired;
    ledger.failed = failed;
    ledger.retried = retried;
    ledger.max_attempt = max_attempt;

    let odd: Vec<(Uuid, DateTime<Utc>, String, i32, String, String)> = sqlx::query_as(
        "SELECT routine_id, scheduled_at, status, attempt, claimant, COALESCE(error, '')
         FROM cm.routine_fires WHERE status <> 'fired'
         ORDER BY scheduled_at, routine_id LIMIT 20",
    )
    .fetch_all(pool)
    .await?;
    ledger.odd_rows = odd
        .into_iter()
        .map(|(id, at, status, attempt, claimant, error)| {
            format!(
                "{} {id} {status} attempt {attempt} by {claimant}{}",
                at.to_rfc3339(),
                if error.is_empty() {
                    String::new()
                } else {
                    format!(": {error}")
                }
            )
        })
        .collect();
    Ok(ledger)
}

/// One row of the ledger, as the backends' checks read it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct FireRow {
    pub routine_id: Uuid,
    pub scheduled_at: DateTime<Utc>,
    pub status: String,
    pub attempt: i32,
    pub error: String,
}

impl FireRow {
    /// The idempotency key the product derives from this row's occurrence.
    pub fn key(&self) -> String {
        cm_domain::occurrence::Occurrence::new(self.routine_id, self.scheduled_at)
            .idempotency_key()
            .as_str()
            .to_string()
    }
}

/// Every ledger row, for the backends' checks.
pub(super) async fn fire_rows(pool: &PgPool) -> anyhow::Result<Vec<FireRow>> {
    let rows: Vec<(Uuid, DateTime<Utc>, String, i32, String)> = sqlx::query_as(
        "SELECT routine_id, scheduled_at, status, attempt, COALESCE(error, '')
         FROM cm.routine_fires ORDER BY scheduled_at, routine_id",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(routine_id, scheduled_at, status, attempt, error)| FireRow {
                routine_id,
                scheduled_at,
                status,
                attempt,
                error,
            },
        )
        .collect())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A row of `routine` at second `s` of 2026-01-01, attempt 1, for the backends' checks.
    pub fn fire_row(routine: Uuid, s: i64, status: &str) -> FireRow {
        FireRow {
            routine_id: routine,
            scheduled_at: "2026-01-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap()
                + chrono::TimeDelta::seconds(s),
            status: status.into(),
            attempt: 1,
            error: String::new(),
        }
    }

    /// A routine with fires at seconds 0 to 4 of 2026-01-01, for the checks' tests.
    pub async fn five_fires(pool: &PgPool) -> (Uuid, DateTime<Utc>) {
        let id = Uuid::new_v4();
        let first: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
        sqlx::query(
            "INSERT INTO cm.routines (id, name, schedule, kind, payload, misfire_policy)
             VALUES ($1, 'check', '* * * * * *', 'message', '{}', 'catch-up')",
        )
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO cm.routine_fires
                 (routine_id, scheduled_at, status, completed_at, claimant, claim_token, attempt,
                  lease_expires_at)
             SELECT $1, $2 + make_interval(secs => s::double precision), 'fired', now(), 'test',
                    gen_random_uuid(), 1, now()
             FROM generate_series(0, 4) AS s",
        )
        .bind(id)
        .bind(first)
        .execute(pool)
        .await
        .unwrap();
        (id, first)
    }

    /// The check against the real schema: a clean ledger passes, a lost occurrence and a row
    /// left claimed are each found. Without this, a check that always passes would look like a
    /// product that never fails.
    #[sqlx::test(migrator = "cm_store::MIGRATOR")]
    async fn the_check_finds_what_was_lost_or_left_claimed(pool: PgPool) {
        let (id, first) = five_fires(&pool).await;
        let at = |s: i64| first + chrono::TimeDelta::seconds(s);
        let firsts = [(id, first)];
        let clean = check_ledger(&pool, &firsts, &[1], at(5)).await.unwrap();
        assert_eq!((clean.occurrences, clean.rows, clean.fired), (5, 5, 5));
        assert!(clean.problems().is_empty(), "{:?}", clean.problems());
        assert_eq!(fire_rows(&pool).await.unwrap().len(), 5);

        sqlx::query("DELETE FROM cm.routine_fires WHERE scheduled_at = $1")
            .bind(at(2))
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query(
            "UPDATE cm.routine_fires SET status = 'claimed', completed_at = NULL
             WHERE scheduled_at = $1",
        )
        .bind(at(3))
        .execute(&pool)
        .await
        .unwrap();
        let broken = check_ledger(&pool, &firsts, &[1], at(5)).await.unwrap();
        assert_eq!((broken.missing_slots, broken.claimed), (1, 1), "{broken:?}");
        assert_eq!(broken.missing(), 1);
        assert_eq!(broken.problems().len(), 2, "{:?}", broken.problems());
    }

    #[test]
    fn a_clean_ledger_has_no_problems_and_each_fault_is_named() {
        let clean = Ledger {
            routines: 2,
            occurrences: 10,
            rows: 10,
            fired: 10,
            retried: 3,
            ..Ledger::default()
        };
        assert!(clean.problems().is_empty());
        for (broken, word) in [
            (
                Ledger {
                    missing_slots: 1,
                    ..clean.clone()
                },
                "no ledger row",
            ),
            (
                Ledger {
                    never_fired: 1,
                    ..clean.clone()
                },
                "never fired",
            ),
            (
                Ledger {
                    claimed: 1,
                    ..clean.clone()
                },
                "still claimed",
            ),
            (
                Ledger {
                    max_lag_secs: 60.0,
                    ..clean.clone()
                },
                "stalled",
            ),
        ] {
            let problems = broken.problems();
            assert!(
                problems.iter().any(|p| p.contains(word)),
                "{broken:?} gave {problems:?}"
            );
        }
        // A failed occurrence is reported, not a failure of the run: the product settles it
        // with its error kept, as the design asks.
        assert!(Ledger { failed: 1, ..clean }.problems().is_empty());
    }
}
