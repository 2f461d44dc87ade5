//! The scheduler: the tick loop, the reaper, their counters and health endpoints, wired from
//! `cm-store` and `cm-dispatch`; and the `cm-scheduler` binary built on them.
//!
//! A service can embed the loop:
//!
//! ```no_run
//! # async fn embed() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use cm_dispatch::OutboxDispatcher;
//! use cm_domain::SchedulerConfig;
//! use cm_scheduler::Scheduler;
//! use cm_store::PgStore;
//!
//! let store = PgStore::connect("postgres://localhost/cm").await?;
//! store.migrate().await?;
//! let scheduler = Arc::new(Scheduler::new(
//!     Arc::new(store.clone()),
//!     Arc::new(OutboxDispatcher::new(store)),
//!     SchedulerConfig::default(),
//!     cm_scheduler::default_instance_id(),
//! )?);
//! let summary = scheduler.spawn(async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! println!("{} fired, {} tick errors", summary.fired, summary.tick_errors);
//! # Ok(()) }
//! ```

mod autopause;
pub mod bounded;
pub mod completer;
pub mod edit;
mod engine;
pub mod flags;
pub mod groups;
pub mod health;
pub mod hosts;
pub mod http;
pub mod import;
pub mod notify;
mod outages;
pub mod runs;
pub mod state;
pub mod stats;
pub mod status;
pub mod traces;

pub use engine::{
    Completion, FIRES, PRUNE_BATCH, RunSummary, Scheduler, TickError, TickReport,
    default_instance_id,
};
pub use stats::Stats;
