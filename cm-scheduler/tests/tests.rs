//! cm-scheduler's integration tests, one binary: an index of the modules below, one line each
//! saying what the module proves.
//!
//! Whole-process tests run the binary through `support::cm_scheduler`, which gives it no
//! database but the one the test names (never the default URL), and wait for the state they
//! mean with `support::wait_until` instead of sleeping.

// The database server, a fresh database per test, the binary reaching no other, and waits.
#[path = "scheduler/support.rs"]
mod support;

// Headless Chromium over the DevTools protocol (open, evaluate, click), for the page's tests.
#[path = "scheduler/browser.rs"]
mod browser;

// An occurrence abandoned after unsettled attempts keeps the last attempt's error.
#[path = "scheduler/abandon.rs"]
mod abandon;
// What a routine author can reach (hosts, env names, label keys) is refused at create and dispatch.
#[path = "scheduler/author_reach.rs"]
mod author_reach;
// A failing routine pauses itself through the real loop; a healthy one beside it keeps running.
#[path = "scheduler/autopause.rs"]
mod autopause;
// A backfill of missions drains at the launch rate beside an every-second routine kept on time.
#[path = "scheduler/backfill.rs"]
mod backfill;
// Three missions on a key of one place: never two runs at once, nothing skipped, one scheduler killed.
#[path = "scheduler/limits.rs"]
mod limits;
// A NATS server not answering at start is waited for, as the database is, then fired to.
#[path = "scheduler/broker_start.rs"]
mod broker_start;
// Two scheduler processes claiming group by group, on Citus (`CM_TEST_CITUS_URL`) and Postgres.
#[path = "scheduler/citus.rs"]
mod citus;
// Holiday calendars: schedule next on one, its commands, an edit under two running schedulers.
#[path = "scheduler/calendars.rs"]
mod calendars;
// The command line's contract: exit codes, output, and bad input writing nothing.
#[path = "scheduler/cli.rs"]
mod cli;
// docs/guide/cli.md is the reference the clap definitions generate (CM_BLESS_CLI=1 rewrites it).
#[path = "scheduler/cli_reference.rs"]
mod cli_reference;
// `fires` pages by cursor; a backfill past the retention is refused.
#[path = "scheduler/cli_hardening.rs"]
mod cli_hardening;
// A schedule too costly to check: refused by the CLI, set aside from SQL, the others fire on time.
#[path = "scheduler/containment.rs"]
mod containment;
// Batched and inline settles against a ledger double: retried, split row by row, flushed.
#[path = "scheduler/completer.rs"]
mod completer;
// Whole processes killed between claim and settle lose and double nothing; SIGTERM exits 0.
#[path = "scheduler/crash.rs"]
mod crash;
// Every import records its source, so a sync deletes what the file lost; a system crontab's user.
#[path = "scheduler/crontab_sources.rs"]
mod crontab_sources;
// The database URL from `--database-url-file`, given once, its password never printed.
#[path = "scheduler/database_file.rs"]
mod database_file;
// `deploy/`'s systemd unit and Kubernetes Deployment run as written, on the test's database.
#[path = "scheduler/deploy.rs"]
mod deploy;
// A full claim is followed at once; missions launched at no more than the launch rate.
#[path = "scheduler/drain.rs"]
mod drain;
// Four schedulers racing on one database fire every occurrence exactly once.
#[path = "scheduler/exactly_once.rs"]
mod exactly_once;
// `cm-scheduler health` (the image's HEALTHCHECK): 0 when ready, the 503's reason when not.
#[path = "scheduler/health_probe.rs"]
mod health_probe;
// A caller's open transaction on one routine's rows holds back that routine only.
#[path = "scheduler/held_locks.rs"]
mod held_locks;
// The endpoints and the status page through the router, against a real database.
#[path = "scheduler/http.rs"]
mod http;
// What a routine may ask for (env, repositories, sizes, names); files read no further than needed.
#[path = "scheduler/inputs.rs"]
mod inputs;
// Concurrency keys on routines (create, update, show, import) and `limit set|list|delete`.
#[path = "scheduler/limits_cli.rs"]
mod limits_cli;
// Mission files and backend settings refused; schedulers killed mid-launch on the fake engines.
#[path = "scheduler/missions.rs"]
mod missions;
// Events heard by a real Standard Webhooks receiver: pause, recovery, deadline, misfire.
#[path = "scheduler/events.rs"]
mod events;
// `routine import`'s overlap; `run` waiting for a Docker engine; process runs watched to the end.
#[path = "scheduler/missions_operate.rs"]
mod missions_operate;
// Overlap, exit codes and an engine restart on the real Docker engine (`CM_TEST_DOCKER_HOST`).
#[path = "scheduler/missions_real.rs"]
mod missions_real;
// The tick loop against `mockall` doubles: each claim outcome, failures, timeouts, tick errors.
#[path = "scheduler/mock_loop.rs"]
mod mock_loop;
// The systemd notify protocol: READY=1 after a good tick, WATCHDOG=1 from the loop, STOPPING=1.
#[path = "scheduler/notify.rs"]
mod notify;
// A running scheduler's health while its database comes and goes; the page in Chromium.
#[path = "scheduler/operate.rs"]
mod operate;
// The operations the command line and the page share, each on a real database.
#[path = "scheduler/operations.rs"]
mod operations;
// Editing, importing, naming and reading routines from the command line; errors without secrets.
#[path = "scheduler/operator.rs"]
mod operator;
// A large import lands every routine once, or refuses a bad line with nothing written.
#[path = "scheduler/bulk_import.rs"]
mod bulk_import;

// A crontab imported again, closed pipes, pause reasons, refusals in words, logs without colour.
#[path = "scheduler/operator_day.rs"]
mod operator_day;
// An import's mission paths kept inside its root; only regular files read; `--overlap` refused.
#[path = "scheduler/operator_files.rs"]
mod operator_files;
// `replace` whose stop the runtime refuses never has two runs at once.
#[path = "scheduler/overlap.rs"]
mod overlap;
// The status page answers only its own names (a DNS-rebound request refused).
#[path = "scheduler/page_host.rs"]
mod page_host;
// `run` behind a transaction-mode PgBouncer it cannot work through refuses to start.
#[path = "scheduler/pooler.rs"]
mod pooler;
// Replies from outside (a collector's, a `/readyz`'s) are read up to a bound, whatever they hold.
#[path = "scheduler/replies.rs"]
mod replies;
// Retries: a 503 twice delivered once on attempt 3, a mission succeeding on its third run, none
// at or after the next occurrence.
#[path = "scheduler/retries.rs"]
mod retries;
// Windows, exclusions, one-shots, run limits and jitter fire what `schedule next` lists.
#[path = "scheduler/schedules_beyond.rs"]
mod schedules_beyond;
// Whole processes given every secret, against failing connections, print none.
#[path = "scheduler/secrets.rs"]
mod secrets;
// `run`'s flags refused by `ServiceConfig::validate` before anything starts.
#[path = "scheduler/service_config.rs"]
mod service_config;
// The completion scripts in real bash, zsh and fish, TAB pressed in a tmux pane.
#[path = "scheduler/shells.rs"]
mod shells;
// A target that answers one routine after 20 s delays no other routine.
#[path = "scheduler/slow_target.rs"]
mod slow_target;
// A routine written through SQL is planned and fires; one cm cannot read is paused, never fired.
#[path = "scheduler/sql_writes.rs"]
mod sql_writes;
// A stop counts once the process group exited; runs judged where their files are, never lost.
#[path = "scheduler/stops.rs"]
mod stops;

// TLS to a cluster of the test's own: verify-full fires; another CA, another name, no TLS refused.
#[path = "scheduler/tls.rs"]
mod tls;
// A webhook carries the `traceparent` that `fires` names; spans reach an OTLP receiver.
#[path = "scheduler/trace.rs"]
mod trace;

// cm in its own schema: `run` with a search path that names cm first, or public alone, and a
// whole scheduler in a schema set with --schema.
#[path = "scheduler/schema.rs"]
mod schema;

// Every path that writes a routine (CLI, imports, page, `tx`, SQL) gives one input one verdict.
#[path = "scheduler/validation.rs"]
mod validation;
