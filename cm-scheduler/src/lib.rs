//! The scheduler: the tick loop, the reaper, their counters and health endpoints, wired from
//! `cm-store` and `cm-dispatch`; and the application the `cm-scheduler` binary is a thin layer
//! over: the command line's definitions ([`flags`]), the service `run` starts ([`service`]),
//! and one operation per use case that the command line and the status page both call
//! ([`operations`]).
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
mod bounded;
pub mod calendars;
pub mod completer;
pub mod counters;
pub mod edit;
mod engine;
mod failure;
pub mod flags;
mod groups;
pub mod health;
mod hosts;
pub mod http;
pub mod http_state;
mod import;
pub mod limits;
pub mod notify;
pub mod operations;
mod outages;
pub mod page;
pub mod runs;
pub mod service;
mod traces;

pub use counters::Stats;
pub use engine::{
    Completion, DEADLINES_READ, EVENT_PASS, EventSink, FIRES, MAX_BACKOFF, PRUNE_BATCH, RunSummary,
    Scheduler, TickError, TickReport, WebhookEventSink, default_instance_id, event_data,
};
pub use failure::Failure;
pub use hosts::AllowedHosts;
pub use traces::FireTracer;
