//! cm-scheduler's integration tests, one binary (an index of the modules below).
//!
//! - `mock_loop`: the tick loop against `mockall` doubles of the ledger and dispatcher.
//! - `exactly_once`: several schedulers racing on one real database.
//! - `crash`: whole `cm-scheduler` processes killed between claim and settle.
//! - `cli`: the command line's contract (exit codes, output, bad input writes nothing).
//! - `slow_target`: a target that answers one routine after 20 s delays no other routine.
//! - `support`: the database server and clean-up the whole-process tests share.

#[path = "scheduler/support.rs"]
mod support;

#[path = "scheduler/cli.rs"]
mod cli;
#[path = "scheduler/crash.rs"]
mod crash;
#[path = "scheduler/exactly_once.rs"]
mod exactly_once;
#[path = "scheduler/mock_loop.rs"]
mod mock_loop;
#[path = "scheduler/slow_target.rs"]
mod slow_target;
