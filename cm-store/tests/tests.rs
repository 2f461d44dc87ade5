//! Integration tests of `cm-store` against a real PostgreSQL: one test binary, one module per
//! concern.
//!
//! Every test is a `#[sqlx::test]` that gets a fresh database with the real schema (the
//! migrations embedded in `cm_store::MIGRATOR`), so tests never see each other's rows. They need
//! `DATABASE_URL` to name a server where the user may create databases, for example
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo test -p cm-store`.
//!
//! Time is controlled by writing instants into the database (a routine's `next_run_at` in the
//! past, a lease that already ran out), and expectations are computed from the database's clock
//! as the claim reports it (`TickClaim::now`), never from this process's clock.
//!
//! The modules live under `tests/store/` so that Cargo builds them into this one binary instead
//! of one binary each. Each `mod` below has a comment saying what the module proves.

// Shared helpers: routines, their clocks, ledger rows, and waiting for a state.
#[path = "store/support.rs"]
mod support;

// The claim statement: each of Fresh, Retry, InFlight and Settled, and how the clock moves.
#[path = "store/calendars.rs"]
mod calendars;

#[path = "store/claim.rs"]
mod claim;

// Events: written with their change, never for one rolled back; deadlines raised once.
#[path = "store/events.rs"]
mod events;

// Settling is fenced on the claim's token and attempt; failures keep a bounded error.
#[path = "store/settle.rs"]
mod settle;

// Retry policies: a failure tried again after its backoff, within the next occurrence and the
// deadline, kept attempt by attempt.
#[path = "store/retries.rs"]
mod retries;
// Concurrency keys: a key's places taken under its lock, in turns, oldest first; the rest owed.
#[path = "store/limits.rs"]
mod limits;
// Turns between concurrency keys: a key of a few routines claimed beside another's backlog.
#[path = "store/turns.rs"]
mod turns;

// The reaper: which expired claims it takes over, in what order, and how many.
#[path = "store/reaper.rs"]
mod reaper;

// Concurrency: schedulers and reapers racing on the same routines and rows.
#[path = "store/race.rs"]
mod race;

// Mission runs watched after their launch; one decider of a routine's run at a time.
#[path = "store/runs.rs"]
mod runs;

// A fire's outcome (a mission's is its run's) in the SQL rule, listings, page and auto-pause.
#[path = "store/outcome.rs"]
mod outcome;

// Misfire policies after a simulated outage of an every-minute routine.
#[path = "store/misfire.rs"]
mod misfire;

// Overlap that waits: buffer-one and buffer-all missions while their run lasts and after.
#[path = "store/buffered.rs"]
mod buffered;

// The per-tick cap and `max_routines` across routines: oldest first, nothing lost.
#[path = "store/cap.rs"]
mod cap;

// Routines: create, read, pause, resume, delete, and database errors as they surface.
#[path = "store/routines.rs"]
mod routines;

// Stored routines the domain refuses are reported and paused, and block no others.
#[path = "store/corrupt.rs"]
mod corrupt;

// The message outbox: one row per occurrence, read back in order.
#[path = "store/outbox.rs"]
mod outbox;

// Where a fire came from; each routine's messages numbered oldest first; the mission room.
#[path = "store/origin.rs"]
mod origin;

// Occurrences asked for by hand (trigger, backfill) go through the same ledger.
#[path = "store/requests.rs"]
mod requests;

// Fires and messages written together by the claim; batched, fenced settles.
#[path = "store/in_claim.rs"]
mod in_claim;

// The operator's reads and edits: unique names, pages, updates, imports, requests.
#[path = "store/catalog.rs"]
mod catalog;

// The hot statements read a page, not the table (EXPLAIN ANALYZE on 100,000 rows).
#[path = "store/scale.rs"]
mod scale;

// Deleting a routine while a tick claims it: one lock order, no deadlock.
#[path = "store/delete.rs"]
mod delete;

// Server-side timeouts on the scheduler's connections: a blocked claim gives up.
#[path = "store/timeouts.rs"]
mod timeouts;

// The outbox consumer contract: leased batches in order, takeover, acks, pruning.
#[path = "store/consumer.rs"]
mod consumer;

// Routine groups: computed against the schema, named, claimed and leased per group.
#[path = "store/groups.rs"]
mod groups;

// The store on Citus (`CM_TEST_CITUS_URL`): one task per claim statement, no 2PC.
#[path = "store/citus.rs"]
mod citus;

// Behind PgBouncer (`CM_TEST_PGBOUNCER_URL`): cm's settings in every transaction.
#[path = "store/pgbouncer.rs"]
mod pgbouncer;

// Writes in the caller's transaction (`cm_store::tx`) and from SQL, then planned.
#[path = "store/writes.rs"]
mod writes;

// Multi-host URLs: the first host that qualifies, refusals named, a read-only host reported.
#[path = "store/failover.rs"]
mod failover;

// Checks at insert in the SQL functions, refusals naming the field; `cm.update_routine`.
#[path = "store/sql_checks.rs"]
mod sql_checks;

// Least privilege: `cm_writer` only calls functions; definer functions on a pinned path; the
// deploy role file.
#[path = "store/privileges.rs"]
mod privileges;

// cm lives in its schema: a database migrated into `public` moved there, a sibling's own
// migrations and `routines` beside it, and no search path changing what cm reads or migrates.
#[path = "store/schema.rs"]
mod schema;
