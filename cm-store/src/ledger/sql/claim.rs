//! The claim's statements: the due walk and the requests it takes, the upsert that claims
//! (with or without the outbox), the routines' clocks, and the per-table claim on Citus.

/// The instant a walk of due routines takes what is due up to: the transaction's `now()`
/// behind a subquery, so the planner does not estimate from the column's statistics how much
/// is due. A walk is a few hundred rows in index order under a `LIMIT`; planned from
/// statistics taken before a bulk change moved many clocks into the past (a reschedule or
/// resume by one `UPDATE`, a load), the estimate is a few rows, and the plan then read every
/// due row and sorted them all for each claim (a drain of 200,000 ran at half the rate).
/// Compared with a value it cannot see, the planner assumes a third of the table, and walks
/// the index in order, whatever the statistics say.
macro_rules! walk_now {
    () => {
        "(SELECT now())"
    };
}

/// Takes due requests, oldest occurrence first, skipping those another claim holds; `limit:` is
/// the parameter holding the most to take, `missions:` the most of them that may be of mission
/// routines (at most `limit:`; a NULL bound is none), `walk:` the walk's group filter and
/// `taken:` the deleted rows' own. The walk joins each request's routine for its kind and walks the two
/// kinds apart, so mission requests past their room stay in the table, in order, without
/// holding back the message requests behind them; of the two walks the oldest `limit:` are
/// taken. Each request's routine is locked FOR KEY SHARE with it, skipping a routine being
/// deleted: the claim then never waits on a routine while holding a request, the wait that
/// deadlocked against `delete_routine`. The lock is also what keeps the requested
/// occurrence's fire from outliving its routine (the ledger has no foreign key):
/// `delete_routine` waits for it, then deletes the fires the claim wrote. Returns each taken
/// request's routine, instant, origin and routine kind.
macro_rules! take_requests_sql {
    (limit: $limit:literal, missions: $missions:literal, walk: $walk:literal, taken: $taken:literal,
     full: $full:literal) => {
        concat!(
            "
DELETE FROM cm.routine_requests d
USING (
    SELECT routine_id, scheduled_at, group_id, kind, concurrency_key, last_run_at
    FROM (",
            take_requests_walk!(kind: "r.kind = 'mission'", limit: $missions, walk: $walk, full: $full),
            "
        UNION ALL",
            take_requests_walk!(kind: "r.kind <> 'mission'", limit: $limit, walk: $walk, full: $full),
            "
    ) walk
    ORDER BY scheduled_at, routine_id
    LIMIT ",
            $limit,
            "
) t
WHERE d.routine_id = t.routine_id AND d.scheduled_at = t.scheduled_at
  AND d.group_id = t.group_id",
            $taken,
            "
RETURNING d.routine_id, d.scheduled_at, d.origin, t.kind, t.concurrency_key, t.last_run_at,
          d.requested_at"
        )
    };
}

/// One kind's walk of `take_requests_sql!`: at most `limit:` due requests whose routine matches
/// `kind:`, oldest first, locked, in the group of `walk:` (or any).
macro_rules! take_requests_walk {
    (kind: $kind:literal, limit: $limit:literal, walk: $walk:literal, full: $full:literal) => {
        concat!(
            "
        SELECT * FROM (
            SELECT q.routine_id, q.scheduled_at, q.group_id, r.kind, r.concurrency_key,
                   r.last_run_at
            FROM cm.routine_requests q
            JOIN cm.routines r ON r.id = q.routine_id AND r.group_id = q.group_id
            WHERE q.scheduled_at <= now() AND ",
            $kind,
            $walk,
            "
              AND (r.concurrency_key IS NULL OR r.concurrency_key <> ALL(",
            $full,
            "::text[]))",
            "
            ORDER BY q.scheduled_at, q.routine_id
            LIMIT ",
            $limit,
            "
            FOR UPDATE OF q SKIP LOCKED
            FOR KEY SHARE OF r SKIP LOCKED
        ) w"
        )
    };
}

/// Takes at most `$1` due requests, at most `$2` of them of missions (see `take_requests_sql!`),
/// none of a routine whose concurrency key is one of the full keys `$3`.
pub(crate) const TAKE_REQUESTS_SQL: &str = take_requests_sql!(
    limit: "$1",
    missions: "least($1, $2::bigint)",
    walk: "",
    taken: "",
    full: "$3"
);

/// Takes at most `$1` due requests of the group `$3`, at most `$2` of them of missions, none of
/// the full keys `$4`.
pub(crate) const TAKE_GROUP_REQUESTS_SQL: &str = take_requests_sql!(
    limit: "$1",
    missions: "least($1, $2::bigint)",
    walk: "\n              AND q.group_id = $3 AND r.group_id = $3",
    taken: " AND d.group_id = $3",
    full: "$4"
);

/// The conditions of a due walk past `next_run_at <= now()`, over `cm.routines` unaliased:
/// `resume:`, `routines:`, `busy:` and `full:` as in `due_sql!`. With no mission room left
/// (`$3` = 0) mission routines are not walked; the routines of a full key that already wait on
/// it are left be; a buffering routine whose run is busy waits for it.
macro_rules! due_filters {
    (resume: $walk:literal, routines: $group:literal, busy: $busy:literal, full: $full:literal) => {
        concat!(
            $walk,
            $group,
            "
      AND ($3::bigint IS NULL OR $3::bigint > 0 OR kind <> 'mission')
      AND (concurrency_key IS NULL OR NOT key_wait OR concurrency_key <> ALL(",
            $full,
            "::text[]))
      AND (overlap NOT IN ('buffer-one', 'buffer-all') OR NOT EXISTS (
              SELECT 1 FROM cm.routine_fires b
              WHERE b.routine_id = routines.id AND b.group_id = routines.group_id",
            $busy,
            "
                AND (b.status = 'claimed' OR b.run_state = 'running')))"
        )
    };
}

/// The columns a due walk reads of each routine.
macro_rules! due_columns {
    () => {
        "id, schedule, timezone, misfire_policy, kind, next_run_at, runs_left, overlap,
           calendar, on_holiday, concurrency_key, key_wait, last_run_at"
    };
}

/// The claim's first statement around the CTE `due` (its routines, with `turn` and `walked`):
/// the database's clock (one row, always), the due requests (`$2` at most, at most `$3` of
/// them of missions) and the due routines, locked. `requests:`, `taken:` and `full:` as in
/// `due_sql!`.
macro_rules! due_statement {
    (due: $due:expr, requests: $requests:literal, taken: $take:literal, full: $full:literal) => {
        concat!(
            "
WITH requested AS (",
            take_requests_sql!(
                limit: "$2",
                missions: "least($2, $3::bigint)",
                walk: $requests,
                taken: $take,
                full: $full
            ),
            "
),",
            $due,
            "
SELECT 'clock' AS source, now() AS now, NULL::uuid AS id, NULL::timestamptz AS at,
       NULL::text AS schedule, NULL::text AS timezone, NULL::text AS misfire_policy,
       NULL::text AS kind, NULL::text AS origin, NULL::integer AS runs_left,
       NULL::text AS overlap, NULL::text AS calendar, NULL::text AS on_holiday,
       NULL::text AS concurrency_key, NULL::boolean AS key_wait,
       NULL::timestamptz AS last_run_at, NULL::bigint AS turn, NULL::boolean AS walked,
       NULL::timestamptz AS requested_at
UNION ALL
SELECT 'request', now(), routine_id, scheduled_at, NULL, NULL, NULL, kind, origin, NULL, NULL,
       NULL, NULL, concurrency_key, NULL, last_run_at, NULL, NULL, requested_at
FROM requested
UNION ALL
SELECT 'due', now(), id, next_run_at, schedule, timezone, misfire_policy, kind, NULL, runs_left,
       overlap, calendar, on_holiday, concurrency_key, key_wait, last_run_at, turn, walked, NULL
FROM due"
        )
    };
}

/// The claim's first statement, around a due walk: the database's clock (one row, always), the
/// due requests (`$2` at most, at most `$3` of them of missions) and the due routines, locked.
/// `$1` is the most routines to lock; `$3` is the mission room (NULL: no bound), and with none
/// left mission routines are not locked at all (their launch budget is spent). `resume:` is the
/// condition that resumes the walk after a cursor, or nothing; the others keep each table the
/// statement reads in one group (`routines:` the due routines, `requests:` and `taken:` the
/// requests walked and deleted, `busy:` the fires of a buffering routine's running run), or
/// are all empty.
macro_rules! due_sql {
    (resume: $walk:literal, routines: $group:literal, requests: $requests:literal,
     taken: $take:literal, busy: $busy:literal, full: $full:literal) => {
        due_statement!(
            due: concat!(
                "
due AS (
    SELECT ",
                due_columns!(),
                ", 0::bigint AS turn, true AS walked
    FROM cm.routines
    WHERE next_run_at <= ",
                walk_now!(),
                due_filters!(resume: $walk, routines: $group, busy: $busy, full: $full),
                "
    ORDER BY next_run_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)"
            ),
            requests: $requests,
            taken: $take,
            full: $full
        )
    };
}

/// `due_sql!` taking turns between concurrency keys, for a schema whose routines have keys
/// (`keys:` the parameter listing them). The walk locks the oldest `$1` due routines as
/// `due_sql!` does (`walked`); when it comes back full, more is due than it took, and each key
/// also gets its **heads**: its oldest due routines past the walk's last (its frontier), locked,
/// up to its share of the walk (`$1` over the keys and one more, for the routines without a
/// key) less what the walk already holds of it, read through `routines_key_due_idx`. A key
/// the walk holds its share of reads nothing more. Every routine is given its `turn` among
/// its key's (the routines without a key are one key): the claim takes turns before instants
/// (`cm_domain::plan_claim`), so a key of a few routines is not left behind one with a backlog.
/// Only the walk moves the drain's cursor: the heads lie past its frontier.
macro_rules! fair_due_sql {
    (resume: $walk:literal, routines: $group:literal, requests: $requests:literal,
     taken: $take:literal, busy: $busy:literal, full: $full:literal, keys: $keys:literal) => {
        due_statement!(
            due: concat!(
                "
walked AS (
    SELECT ",
                due_columns!(),
                "
    FROM cm.routines
    WHERE next_run_at <= ",
                walk_now!(),
                due_filters!(resume: $walk, routines: $group, busy: $busy, full: $full),
                "
    ORDER BY next_run_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
frontier AS (
    SELECT next_run_at, id FROM walked
    WHERE (SELECT count(*) FROM walked) >= $1
    ORDER BY next_run_at DESC, id DESC
    LIMIT 1
),
shares AS (
    SELECT k.key, greatest(0, greatest(1, $1::bigint / (cardinality(",
                $keys,
                "::text[]) + 1))
                              - count(w.id)) AS room
    FROM unnest(",
                $keys,
                "::text[]) AS k(key)
    LEFT JOIN walked w ON w.concurrency_key = k.key
    GROUP BY k.key
    HAVING greatest(1, $1::bigint / (cardinality(",
                $keys,
                "::text[]) + 1)) > count(w.id)
),
heads AS (
    SELECT h.*
    FROM frontier f
    CROSS JOIN shares s
    CROSS JOIN LATERAL (
        SELECT ",
                due_columns!(),
                "
        FROM cm.routines
        WHERE concurrency_key = s.key AND next_run_at <= ",
                walk_now!(),
                "
          AND (next_run_at, id) > (f.next_run_at, f.id)",
                due_filters!(resume: "", routines: $group, busy: $busy, full: $full),
                "
        ORDER BY next_run_at, id
        LIMIT s.room
        FOR UPDATE SKIP LOCKED
    ) h
),
due AS (
    SELECT *, row_number() OVER (PARTITION BY concurrency_key ORDER BY next_run_at, id) - 1
              AS turn
    FROM (SELECT *, true AS walked FROM walked
          UNION ALL
          SELECT *, false AS walked FROM heads) c
)"
            ),
            requests: $requests,
            taken: $take,
            full: $full
        )
    };
}

/// The claim's first statement over the whole due walk (see `due_sql!`). It reads
/// `routines_due_idx` `(next_run_at, id)` in order and stops after `$1` rows, however many
/// routines share the oldest instant. The requests of the full concurrency keys (the last
/// parameter, `$4` here) are left be, and so are their routines once they wait on their key
/// (`key_wait`): a routine of a full key is walked once, to be marked waiting.
pub(crate) const DUE_SQL: &str = due_sql!(
    resume: "",
    routines: "",
    requests: "",
    taken: "",
    busy: "",
    full: "$4"
);

/// [`DUE_SQL`] within the group `$4`: every table it reads is filtered on `group_id`, so on
/// Citus it runs on one shard. There it reads `routines_group_due_idx` `(group_id, next_run_at,
/// id)`, which `migrate --citus` creates; on plain PostgreSQL, `routines_due_idx` with a filter.
pub(crate) const DUE_GROUP_SQL: &str = due_sql!(
    resume: "",
    routines: "\n      AND group_id = $4",
    requests: "\n              AND q.group_id = $4 AND r.group_id = $4",
    taken: " AND d.group_id = $4",
    busy: " AND b.group_id = $4",
    full: "$5"
);

/// The claim's first statement resumed after `($4, $5)`, the `(next_run_at, id)` of the last
/// routine a previous claim handled: the index scan starts there, so a drain does not re-read
/// the entries of the routines its earlier claims moved on (dead until vacuumed).
pub(crate) const DUE_AFTER_SQL: &str = due_sql!(
    resume: "
      AND (next_run_at, id) > ($4::timestamptz, $5::uuid)",
    routines: "",
    requests: "",
    taken: "",
    busy: "",
    full: "$6"
);

/// [`DUE_AFTER_SQL`] within the group `$6`.
pub(crate) const DUE_GROUP_AFTER_SQL: &str = due_sql!(
    resume: "
      AND (next_run_at, id) > ($4::timestamptz, $5::uuid)",
    routines: "\n      AND group_id = $6",
    requests: "\n              AND q.group_id = $6 AND r.group_id = $6",
    taken: " AND d.group_id = $6",
    busy: " AND b.group_id = $6",
    full: "$7"
);

/// [`DUE_SQL`] taking turns between the concurrency keys `$5` (see `fair_due_sql!`).
pub(crate) const FAIR_DUE_SQL: &str = fair_due_sql!(
    resume: "",
    routines: "",
    requests: "",
    taken: "",
    busy: "",
    full: "$4",
    keys: "$5"
);

/// [`DUE_GROUP_SQL`] taking turns between the concurrency keys `$6`.
pub(crate) const FAIR_DUE_GROUP_SQL: &str = fair_due_sql!(
    resume: "",
    routines: "\n      AND group_id = $4",
    requests: "\n              AND q.group_id = $4 AND r.group_id = $4",
    taken: " AND d.group_id = $4",
    busy: " AND b.group_id = $4",
    full: "$5",
    keys: "$6"
);

/// [`DUE_AFTER_SQL`] taking turns between the concurrency keys `$7`.
pub(crate) const FAIR_DUE_AFTER_SQL: &str = fair_due_sql!(
    resume: "
      AND (next_run_at, id) > ($4::timestamptz, $5::uuid)",
    routines: "",
    requests: "",
    taken: "",
    busy: "",
    full: "$6",
    keys: "$7"
);

/// [`DUE_GROUP_AFTER_SQL`] taking turns between the concurrency keys `$8`.
pub(crate) const FAIR_DUE_GROUP_AFTER_SQL: &str = fair_due_sql!(
    resume: "
      AND (next_run_at, id) > ($4::timestamptz, $5::uuid)",
    routines: "\n      AND group_id = $6",
    requests: "\n              AND q.group_id = $6 AND r.group_id = $6",
    taken: " AND d.group_id = $6",
    busy: " AND b.group_id = $6",
    full: "$7",
    keys: "$8"
);

/// Moves routines' clocks, a CTE of the claim statements; each slot names the parameter that
/// holds it: `ids:` the routines, `next:` their new `next_run_at`, `moves:` whether it moves,
/// `ran:` whether the routine ran (claimed an occurrence, `last_run_at` becomes `now:`, the
/// claim's clock), `claimed:` how many scheduled occurrences it claimed (a run limit is lowered
/// by it); `group:` keeps it in one group, or is empty.
macro_rules! advance_cte {
    (ids: $ids:literal, next: $next:literal, moves: $moves:literal, ran: $ran:literal,
     now: $now:literal, group: $group:literal, claimed: $claimed:literal) => {
        concat!(
            "
advanced AS (
    UPDATE cm.routines AS r
    SET next_run_at = CASE WHEN t.moves THEN t.next_run_at ELSE r.next_run_at END,
        key_wait = false,
        last_run_at = CASE WHEN t.ran THEN ",
            $now,
            "::timestamptz ELSE r.last_run_at END,
        runs_left = CASE WHEN r.runs_left IS NULL THEN NULL
                         ELSE greatest(r.runs_left - t.claimed, 0) END
    FROM UNNEST(",
            $ids,
            "::uuid[], ",
            $next,
            "::timestamptz[], ",
            $moves,
            "::bool[], ",
            $ran,
            "::bool[], ",
            $claimed,
            "::integer[]) AS t(id, next_run_at, moves, ran, claimed)
    WHERE r.id = t.id",
            $group,
            "
    RETURNING 1
)"
        )
    };
}

/// The advance alone, for a claim that moved clocks (misfires skipped) but claimed nothing;
/// `$5` is the claim's clock.
pub(crate) const ADVANCE_SQL: &str = concat!(
    "WITH ",
    advance_cte!(ids: "$1", next: "$2", moves: "$3", ran: "$4", now: "$5", group: "", claimed: "$6"),
    " SELECT count(*) FROM advanced"
);

/// `ADVANCE_SQL` within the group `$6`.
pub(crate) const ADVANCE_GROUP_SQL: &str = concat!(
    "WITH ",
    advance_cte!(
        ids: "$1",
        next: "$2",
        moves: "$3",
        ran: "$4",
        now: "$5",
        group: " AND r.group_id = $6",
        claimed: "$7"
    ),
    " SELECT count(*) FROM advanced"
);

/// The claim's upsert clause, shared by both claim statements: on conflict the row is always
/// updated, so it is always returned, and `xmax = 0` tells a real insert from an update. The
/// update takes the row over (new claimant, token and lease, attempt + 1) only when it is
/// `claimed` and its lease has run out by this transaction's clock
/// (`cm_domain::claim::lease_expired`); otherwise every column is rewritten with its own value.
macro_rules! claim_upsert {
    (now: $now:literal) => {
        concat!(
            "
    ON CONFLICT (routine_id, scheduled_at, group_id) DO UPDATE SET
        claimant = CASE WHEN f.status = 'claimed' AND f.lease_expires_at <= ",
            $now,
            "
                        THEN excluded.claimant ELSE f.claimant END,
        claim_token = CASE WHEN f.status = 'claimed' AND f.lease_expires_at <= ",
            $now,
            "
                           THEN excluded.claim_token ELSE f.claim_token END,
        attempt = CASE WHEN f.status = 'claimed' AND f.lease_expires_at <= ",
            $now,
            "
                       THEN f.attempt + 1 ELSE f.attempt END,
        claimed_at = CASE WHEN f.status = 'claimed' AND f.lease_expires_at <= ",
            $now,
            "
                          THEN excluded.claimed_at ELSE f.claimed_at END,
        lease_expires_at = CASE WHEN f.status = 'claimed' AND f.lease_expires_at <= ",
            $now,
            "
                                THEN excluded.lease_expires_at ELSE f.lease_expires_at END
    RETURNING (f.xmax = 0) AS inserted, f.routine_id, f.scheduled_at, f.status, f.claimant,
              f.claim_token, f.attempt, f.lease_expires_at, f.receipt, f.origin, f.error,
              f.first_claimed_at, f.group_id, f.planned_at, f.retry,
              coalesce((f.tries -> -1 ->> 'attempt')::int + 1, 1) AS retry_began"
        )
    };
}

/// The claim statement when every occurrence goes to a dispatch (see [`CLAIM_SQL`]); `group:`
/// is the filter that keeps it in one group (`$13`), or nothing, and `claimed:` and `planned:`
/// name the last two parameters, which come after it.
macro_rules! claim_sql {
    (group: $group:literal, claimed: $claimed:literal, planned: $planned:literal) => {
        concat!(
            "
WITH claimed AS (
    INSERT INTO cm.routine_fires AS f
        (routine_id, scheduled_at, claimant, claim_token, attempt, claimed_at, lease_expires_at,
         origin, group_id, planned_at)
    SELECT t.routine_id, t.scheduled_at, $3, $4, 1, $11::timestamptz,
           $11::timestamptz + make_interval(secs => $5), t.origin, t.group_id, t.planned_at
    FROM UNNEST($1::uuid[], $2::timestamptz[], $6::text[], $12::smallint[], ",
            $planned,
            "::timestamptz[])
         AS t(routine_id, scheduled_at, origin, group_id, planned_at)",
            claim_upsert!(now: "$11::timestamptz"),
            "
),",
            advance_cte!(
                ids: "$7",
                next: "$8",
                moves: "$9",
                ran: "$10",
                now: "$11",
                group: $group,
                claimed: $claimed
            ),
            "
SELECT c.inserted, c.routine_id, c.scheduled_at, c.status, c.claimant, c.claim_token, c.attempt,
       c.lease_expires_at, r.name, r.kind, c.origin, r.payload, NULL::text AS receipt,
       NULL::bigint AS written, c.error, c.first_claimed_at, c.planned_at, c.retry,
       c.retry_began
FROM claimed c JOIN cm.routines r ON r.id = c.routine_id AND r.group_id = c.group_id",
            $group
        )
    };
}

/// The claim statement when every occurrence goes to a dispatch. `$1`/`$2` are the occurrences
/// as parallel arrays, oldest first, `$3` the claimant, `$4` the claim token, `$5` the lease in
/// seconds, `$6` each occurrence's origin; `$7` to `$10` move the routines' clocks in the same
/// statement (`advance_cte!`); `$11` is the claim's clock (read once, in the due statement),
/// `$12` each occurrence's group; the last two, the advance's claimed counts and each
/// occurrence's planned instant (NULL: the occurrence itself), come after all others.
pub(crate) const CLAIM_SQL: &str = claim_sql!(group: "", claimed: "$13", planned: "$14");

/// `CLAIM_SQL` within the group `$13`.
pub(crate) const CLAIM_GROUP_SQL: &str =
    claim_sql!(group: " AND r.group_id = $13", claimed: "$14", planned: "$15");

/// The claim statement with the transactional outbox (see [`CLAIM_WITH_OUTBOX_SQL`]); `group:`
/// is the filter that keeps it in one group (`$16`), or nothing, and `claimed:` and `planned:`
/// name the last two parameters, which come after it.
macro_rules! claim_with_outbox_sql {
    (group: $group:literal, claimed: $claimed:literal, planned: $planned:literal) => {
        concat!(
            "
WITH input AS MATERIALIZED (
    SELECT o.*,
           CASE WHEN (o.kind = 'message' AND $7) OR (o.kind = 'mission' AND $8)
                THEN nextval('cm.outbox_messages_seq_seq') END AS outbox_seq
    FROM (
        SELECT t.routine_id, t.scheduled_at, t.origin, t.idempotency_key, t.group_id,
               t.planned_at, r.name, r.kind, r.payload
        FROM UNNEST($1::uuid[], $2::timestamptz[], $6::text[], $9::text[], $15::smallint[], ",
            $planned,
            "::timestamptz[])
             WITH ORDINALITY
             AS t(routine_id, scheduled_at, origin, idempotency_key, group_id, planned_at, n)
        JOIN cm.routines r ON r.id = t.routine_id AND r.group_id = t.group_id",
            $group,
            "
        ORDER BY t.n
    ) o
),
claimed AS (
    INSERT INTO cm.routine_fires AS f
        (routine_id, scheduled_at, claimant, claim_token, attempt, claimed_at, lease_expires_at,
         status, completed_at, receipt, origin, group_id, planned_at)
    SELECT i.routine_id, i.scheduled_at, $3, $4, 1, $14::timestamptz,
           $14::timestamptz + make_interval(secs => $5),
           CASE WHEN i.outbox_seq IS NULL THEN 'claimed' ELSE 'fired' END,
           CASE WHEN i.outbox_seq IS NULL THEN NULL ELSE $14::timestamptz END,
           CASE WHEN i.outbox_seq IS NULL THEN NULL ELSE 'outbox seq ' || i.outbox_seq END,
           i.origin, i.group_id, i.planned_at
    FROM input i",
            claim_upsert!(now: "$14::timestamptz"),
            "
),
outbox AS (
    INSERT INTO cm.outbox_messages
        (seq, routine_id, scheduled_at, idempotency_key, attempt, payload, group_id)
    OVERRIDING SYSTEM VALUE
    SELECT i.outbox_seq, c.routine_id, c.scheduled_at, i.idempotency_key, 1, i.payload,
           c.group_id
    FROM claimed c
    JOIN input i ON i.routine_id = c.routine_id AND i.scheduled_at = c.scheduled_at
    WHERE c.inserted AND i.outbox_seq IS NOT NULL
    ON CONFLICT (routine_id, scheduled_at, group_id) DO NOTHING
    RETURNING seq
),",
            advance_cte!(
                ids: "$10",
                next: "$11",
                moves: "$12",
                ran: "$13",
                now: "$14",
                group: $group,
                claimed: $claimed
            ),
            "
SELECT c.inserted, c.routine_id, c.scheduled_at, c.status, c.claimant, c.claim_token, c.attempt,
       c.lease_expires_at, i.name, i.kind, c.origin, i.payload, c.receipt,
       (SELECT count(*) FROM outbox) AS written, c.error, c.first_claimed_at, c.planned_at,
       c.retry, c.retry_began
FROM claimed c
JOIN input i ON i.routine_id = c.routine_id AND i.scheduled_at = c.scheduled_at"
        )
    };
}

/// The claim statement with the transactional outbox. `$1` to `$6` as in [`CLAIM_SQL`]; `$7`
/// and `$8` say whether message and mission routines are settled with an outbox row in the
/// claim, `$9` holds the occurrences' idempotency keys, `$10` to `$13` move the clocks, `$14`
/// is the claim's clock and `$15` each occurrence's group.
///
/// An occurrence of an in-claim kind is inserted already `fired`, its receipt naming the outbox
/// sequence number drawn for it, and its message is written by the same statement when (and
/// only when) the insert was fresh. The statement returns how many messages it wrote
/// (`written`, on every row) rather than joining them back to the fires: a join whose inner side
/// is a data-modifying CTE is planned as a nested loop over it, one pass per fire, which made a
/// claim's cost grow with the square of its batch. When fewer were written than fresh fires
/// want one (a message already there), the store finds which (`mark_unwritten_messages`). The
/// sequence numbers are drawn in the order of the arrays (oldest occurrence first), so within
/// one claim a routine's messages are numbered in `scheduled_at` order. A number is drawn
/// before the insert so the fire row is written once; numbers drawn for rows that turn out to
/// exist are simply unused.
///
/// Only the occurrence's own message (the primary key) is a conflict the outbox insert steps
/// over. A drawn number already taken (a row written by hand past the sequence) is an error
/// that rolls the whole claim back, where stepping over it would record the fire as written
/// with no message of its own; naming the key also spares each message a probe of the
/// `(group_id, seq)` index before its insert.
pub(crate) const CLAIM_WITH_OUTBOX_SQL: &str =
    claim_with_outbox_sql!(group: "", claimed: "$16", planned: "$17");

/// `CLAIM_WITH_OUTBOX_SQL` within the group `$16`.
pub(crate) const CLAIM_GROUP_WITH_OUTBOX_SQL: &str = claim_with_outbox_sql!(
    group: " AND r.group_id = $16",
    claimed: "$17",
    planned: "$18"
);

/// The claim on Citus, kept in one group: the fires' upsert ([`SHARD_CLAIM_SQL`]), the outbox
/// rows ([`SHARD_OUTBOX_SQL`]), the clocks ([`ADVANCE_GROUP_SQL`]) and the routines' names and
/// payloads ([`SHARD_ROUTINES_SQL`]), each a statement of its own. Citus runs a statement whose
/// CTEs write several tables through intermediate results on the coordinator and commits it in
/// two phases; each of these is a router statement on the group's shard, so the claim's
/// transaction stays on one worker and commits there in one phase. The same occurrences are
/// claimed, with the same upsert, as by the one-statement claim on plain PostgreSQL.
///
/// `$1`/`$2` the occurrences, `$3` the claimant, `$4` the token, `$5` the lease in seconds, `$6`
/// the origins, `$7` the claim's clock, `$8` each occurrence's outbox number (drawn before, for
/// every occurrence; used by in-claim kinds only), `$9`/`$10` whether message and mission
/// routines are settled in the claim, `$11` the group, `$12` each occurrence's planned instant.
pub(crate) const SHARD_CLAIM_SQL: &str = concat!(
    "
INSERT INTO cm.routine_fires AS f
    (routine_id, scheduled_at, claimant, claim_token, attempt, claimed_at, lease_expires_at,
     status, completed_at, receipt, origin, group_id, planned_at)
SELECT t.routine_id, t.scheduled_at, $3, $4, 1, $7::timestamptz,
       $7::timestamptz + make_interval(secs => $5),
       CASE WHEN t.in_claim THEN 'fired' ELSE 'claimed' END,
       CASE WHEN t.in_claim THEN $7::timestamptz END,
       CASE WHEN t.in_claim THEN 'outbox seq ' || t.seq END,
       t.origin, t.group_id, t.planned_at
FROM (
    SELECT u.routine_id, u.scheduled_at, u.origin, u.seq, r.group_id, u.planned_at,
           (r.kind = 'message' AND $9) OR (r.kind = 'mission' AND $10) AS in_claim
    FROM cm.routines r
    JOIN UNNEST($1::uuid[], $2::timestamptz[], $6::text[], $8::bigint[], $12::timestamptz[])
         AS u(routine_id, scheduled_at, origin, seq, planned_at)
      ON r.id = u.routine_id
    WHERE r.group_id = $11
) t",
    claim_upsert!(now: "$7::timestamptz")
);

/// The outbox rows of the fresh occurrences settled in a claim on Citus: `$1`/`$2` the
/// occurrences, `$3` their numbers, `$4` their idempotency keys, `$5` the group. Returns the
/// numbers written (a message already there is not written again; a number already taken is
/// an error, as in [`CLAIM_WITH_OUTBOX_SQL`]).
pub(crate) const SHARD_OUTBOX_SQL: &str = "
INSERT INTO cm.outbox_messages
    (seq, routine_id, scheduled_at, idempotency_key, attempt, payload, group_id)
OVERRIDING SYSTEM VALUE
SELECT t.seq, t.routine_id, t.scheduled_at, t.idempotency_key, 1, r.payload, r.group_id
FROM cm.routines r
JOIN UNNEST($1::uuid[], $2::timestamptz[], $3::bigint[], $4::text[])
     AS t(routine_id, scheduled_at, seq, idempotency_key)
  ON r.id = t.routine_id
WHERE r.group_id = $5
ON CONFLICT (routine_id, scheduled_at, group_id) DO NOTHING
RETURNING seq";

/// The names, kinds and payloads of the routines `$1` of the group `$2`.
pub(crate) const SHARD_ROUTINES_SQL: &str =
    "SELECT id, name, kind, payload FROM cm.routines WHERE group_id = $2 AND id = ANY($1)";

/// Records the occurrences a `buffer-one` routine's run kept waiting that are not launched:
/// `$1`/`$2` the occurrences, `$3` each one's error naming the one launched instead, `$4` the
/// claim's token, `$5` its clock, `$6` each one's group. An occurrence already in the ledger
/// keeps its row.
pub(crate) const BUFFER_SKIPS_SQL: &str = "INSERT INTO cm.routine_fires
             (routine_id, scheduled_at, claimant, claim_token, attempt, claimed_at,
              lease_expires_at, status, completed_at, error, origin, group_id)
         SELECT t.routine_id, t.scheduled_at, 'buffer-one', $4, 1, $5, $5, 'skipped', $5, t.error,
                'schedule', t.group_id
         FROM UNNEST($1::uuid[], $2::timestamptz[], $3::text[], $6::smallint[])
              AS t(routine_id, scheduled_at, error, group_id)
         ON CONFLICT DO NOTHING";

/// Pauses the due routines `$1` a claim could not read, as of its clock `$2`, each with its
/// reason (`$3`, kept in `paused_reason`), so they stop coming due.
pub(crate) const PAUSE_UNUSABLE_SQL: &str = "UPDATE cm.routines AS r
     SET paused = true, next_run_at = NULL, updated_at = $2, paused_reason = u.reason
     FROM UNNEST($1::uuid[], $3::text[]) AS u(id, reason)
     WHERE r.id = u.id";

/// [`PAUSE_UNUSABLE_SQL`] within the group `$4`.
pub(crate) const PAUSE_GROUP_UNUSABLE_SQL: &str = "UPDATE cm.routines AS r
     SET paused = true, next_run_at = NULL, updated_at = $2, paused_reason = u.reason
     FROM UNNEST($1::uuid[], $3::text[]) AS u(id, reason)
     WHERE r.id = u.id AND r.group_id = $4";

/// Which of the outbox numbers `$1` have a message.
pub(crate) const WRITTEN_SEQS_SQL: &str = "SELECT seq FROM cm.outbox_messages WHERE seq = ANY($1)";

/// `$1` outbox numbers, drawn in order, for a claim on Citus that writes its messages in a
/// statement of their own.
pub(crate) const DRAW_SEQS_SQL: &str =
    "SELECT nextval('cm.outbox_messages_seq_seq') FROM generate_series(1, $1) ORDER BY 1";

/// Whether the Citus extension is installed.
pub(crate) const CITUS_EXTENSION_SQL: &str =
    "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')";

/// Whether `routines` is a distributed table (the Citus extension installed).
pub(crate) const CITUS_DISTRIBUTED_SQL: &str = "SELECT EXISTS (SELECT 1 FROM pg_dist_partition
                                        WHERE logicalrelid = 'cm.routines'::regclass)";
