//! The service's configuration: `run`'s flags and the database URL, and every rule they must
//! keep, checked by [`ServiceConfig::validate`] before anything is started.

use cm_domain::{FireCap, Lease, SchedulerConfig};

use crate::failure::{Failure, input};
use crate::flags::RunArgs;

/// What a service is started with: the database it schedules on, and `run`'s flags.
#[derive(Debug)]
pub struct ServiceConfig {
    /// The PostgreSQL database URL.
    pub database_url: String,
    /// `run`'s flags as given.
    pub run: RunArgs,
}

impl ServiceConfig {
    /// The scheduler's configuration, with every rule the flags must keep checked: a lease
    /// above zero, a cap of at least one, a group lease of at least three tick intervals,
    /// the scheduler's own rules ([`SchedulerConfig::validate`]), a bearer token for a page
    /// served beyond loopback, `--allowed-host` only with `--listen`, and a database URL that
    /// names a PostgreSQL host. Each refusal is one line of bad input.
    pub fn validate(&self) -> Result<SchedulerConfig, Failure> {
        let args = &self.run;
        let lease =
            Lease::new(args.lease).ok_or_else(|| input("--lease must be greater than zero"))?;
        let cap = FireCap::new(args.max_fires_per_tick)
            .ok_or_else(|| input("--max-fires-per-tick must be at least 1"))?;
        if args.group_lease < args.tick_interval * 3 {
            return Err(input(format!(
                "--tick-interval {} needs a --group-lease of at least three tick intervals \
                 ({}; it is {}, 15s unless given): a group's lease is renewed at most once a \
                 tick; shorten the interval or lengthen the lease",
                humantime::format_duration(args.tick_interval),
                humantime::format_duration(args.tick_interval * 3),
                humantime::format_duration(args.group_lease),
            )));
        }
        let config = SchedulerConfig {
            tick_interval: args.tick_interval,
            max_fires_per_tick: cap,
            lease,
            dispatch_timeout: args.dispatch_timeout,
            max_in_flight: args
                .max_in_flight
                .unwrap_or(SchedulerConfig::DEFAULT_MAX_IN_FLIGHT.max(cap.get())),
            max_attempts: args.max_attempts,
            misfire_grace: args.misfire_grace,
            max_backlog: args.max_backlog,
            retention: args.retention,
            max_mission_launches_per_second: std::num::NonZeroU32::new(
                args.max_mission_launches_per_second,
            ),
            drain_lanes: args.drain_lanes,
        }
        .validate()
        .map_err(|e| input(e.to_string()))?;
        if let Some(addr) = args.listen
            && !addr.ip().is_loopback()
            && args.http_token_file.is_none()
        {
            return Err(input(format!(
                "--listen {addr} is not a loopback address: give --http-token-file with the \
                 status page's bearer token"
            )));
        }
        if args.listen.is_none() && !args.allowed_host.is_empty() {
            return Err(input("--allowed-host needs --listen"));
        }
        super::database::check_url(&self.database_url)?;
        Ok(config)
    }
}
