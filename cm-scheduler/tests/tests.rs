//! cm-scheduler's integration tests, one binary (an index of the modules below).
//!
//! - `mock_loop`: the tick loop against `mockall` doubles of the ledger and dispatcher, a
//!   dispatch held for 20 s beside the ticks (paused time), transient database errors.
//! - `completer`: batched and inline settles against a ledger double.
//! - `exactly_once`: several schedulers racing on one real database.
//! - `crash`: whole `cm-scheduler` processes killed between claim and settle.
//! - `http`: the endpoints and the status page through the router, against a real database.
//! - `operate`: a running scheduler's health while its database comes and goes, and the
//!   status page in headless Chromium (its actions clicked, a cross-site form refused).
//! - `health_probe`: `cm-scheduler health` (the image's HEALTHCHECK) against ready and unready
//!   schedulers and an address nothing listens on.
//! - `autopause`: a failing routine pauses itself through the real loop.
//! - `abandon`: an occurrence abandoned after unsettled attempts keeps the last one's error.
//! - `cli`: the command line's contract (exit codes, output, bad input writes nothing).
//! - `operations`: the operations the command line and the page share, on a real database.
//! - `operator`: editing, importing, naming and reading routines from the command line, and
//!   errors (and secrets) as people see them.
//! - `operator_day`: a crontab edited and imported again (`--sync`), output through a closed
//!   pipe, pause reasons and creation order in listings, refusals in words, logs without colour.
//! - `missions`: mission files and backend settings refused; schedulers killed mid-launch on
//!   the fake Docker engine.
//! - `missions_operate`: a mission's overlap in `routine import`; `run` waiting for a Docker
//!   engine that is not there yet; the process backend's runs watched to their end.
//! - `missions_real`: overlap policies, exit codes and an engine restart through the binary on
//!   the real Docker engine (`CM_TEST_DOCKER_HOST`).
//! - `overlap`: `replace` whose stop the runtime refuses (a 403 from the engine, a Role without
//!   `delete`) never has two runs at once; an identity lacking a verb is refused at start.
//! - `cli_hardening`: `fires` paging by cursor; backfill refused past the retention.
//! - `cli_reference`: `docs/guide/cli.md` is the reference the clap definitions generate.
//! - `author_reach`: what a routine author can reach: repositories on the scheduler's host or a
//!   metadata service in every URL form, env names and label keys outside the allow lists and
//!   the floor, refused at create and at dispatch.
//! - `inputs`: what a routine may ask for (mission env and repositories, the operator's policy,
//!   message size, names) and files read no further than their limit.
//! - `trace`: a webhook sent by the binary carries the `traceparent` that `fires` names.
//! - `slow_target`: a target that answers one routine after 20 s delays no other routine.
//! - `backfill`: a backfill of missions drains at the launch rate beside an every-second routine
//!   that stays on time.
//! - `secrets`: whole processes given every secret, against failing connections, print none.
//! - `service_config`: `run`'s flags refused by `ServiceConfig::validate` before anything starts.
//! - `database_file`: the database URL from `--database-url-file`, given once; a process
//!   mission finds no password in its environment or its scheduler's.
//! - `operator_files`: an import's mission paths kept inside its root, only regular files read
//!   (a FIFO refused at once), and `--overlap` refused on a message routine by every command.
//! - `page_host`: the status page answers only its own names (a DNS-rebound request refused).
//! - `notify`: the systemd notify protocol, the test listening on the socket: `READY=1` after
//!   the first good tick, `WATCHDOG=1` from the tick loop, `STOPPING=1` on SIGTERM; never ready
//!   without a database.
//! - `deploy`: `deploy/`'s files run as written: the systemd unit's command line notifying the
//!   test's socket, the Deployment's container against the fake API server granting only the
//!   Role, probed as the kubelet probes; the unit through `systemd-analyze verify`.
//! - `shells`: the completion scripts in real bash, zsh and fish, TAB pressed in a tmux pane.
//! - `support`: the database server and clean-up the whole-process tests share.
//! - `browser`: headless Chromium driven over the DevTools protocol (open, evaluate, click).

#[path = "scheduler/support.rs"]
mod support;

#[path = "scheduler/browser.rs"]
mod browser;

#[path = "scheduler/abandon.rs"]
mod abandon;
#[path = "scheduler/author_reach.rs"]
mod author_reach;
#[path = "scheduler/autopause.rs"]
mod autopause;
#[path = "scheduler/backfill.rs"]
mod backfill;
#[path = "scheduler/citus.rs"]
mod citus;
#[path = "scheduler/cli.rs"]
mod cli;
#[path = "scheduler/cli_hardening.rs"]
mod cli_hardening;
#[path = "scheduler/cli_reference.rs"]
mod cli_reference;
#[path = "scheduler/completer.rs"]
mod completer;
#[path = "scheduler/crash.rs"]
mod crash;
#[path = "scheduler/database_file.rs"]
mod database_file;
#[path = "scheduler/deploy.rs"]
mod deploy;
// A full claim is followed at once; missions launched at no more than the launch rate.
#[path = "scheduler/drain.rs"]
mod drain;
#[path = "scheduler/exactly_once.rs"]
mod exactly_once;
#[path = "scheduler/health_probe.rs"]
mod health_probe;
#[path = "scheduler/http.rs"]
mod http;
#[path = "scheduler/inputs.rs"]
mod inputs;
#[path = "scheduler/missions.rs"]
mod missions;
#[path = "scheduler/missions_operate.rs"]
mod missions_operate;
#[path = "scheduler/missions_real.rs"]
mod missions_real;
#[path = "scheduler/mock_loop.rs"]
mod mock_loop;
#[path = "scheduler/notify.rs"]
mod notify;
#[path = "scheduler/operate.rs"]
mod operate;
#[path = "scheduler/operations.rs"]
mod operations;
#[path = "scheduler/operator.rs"]
mod operator;
#[path = "scheduler/operator_day.rs"]
mod operator_day;
#[path = "scheduler/operator_files.rs"]
mod operator_files;
#[path = "scheduler/overlap.rs"]
mod overlap;
#[path = "scheduler/page_host.rs"]
mod page_host;
#[path = "scheduler/pooler.rs"]
mod pooler;
#[path = "scheduler/schedules_beyond.rs"]
mod schedules_beyond;
#[path = "scheduler/secrets.rs"]
mod secrets;
#[path = "scheduler/service_config.rs"]
mod service_config;
#[path = "scheduler/shells.rs"]
mod shells;
#[path = "scheduler/slow_target.rs"]
mod slow_target;
#[path = "scheduler/sql_writes.rs"]
mod sql_writes;
#[path = "scheduler/trace.rs"]
mod trace;
