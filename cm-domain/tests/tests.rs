//! cm-domain's integration tests, one binary (`autotests = false` in the manifest):
//!
//! - `schedules`: the worked DST vectors in `data/`, every one chained through `next_after`.
//! - `schedule_properties`: properties of `next_after` against an independent checker.
//! - `model`: a model-based test of several schedulers that crash at any step.
//! - `repository_hosts`: the repository host check against the system's resolver, over
//!   generated addresses in every notation and URL form.

mod jitter_properties;
mod model;
mod repository_hosts;
mod rules_properties;
mod schedule_properties;
mod schedules;
