//! The scheduler as a service: started from a validated [`ServiceConfig`] with its pools, its
//! message and mission backends, the status page and probes over HTTP, traces and the
//! supervisor's notifications; waiting for the database (and NATS, and the mission runtime) with
//! `/readyz` saying why; then running until told to stop, and shutting down in order.
//!
//! The binary's `run` is this and nothing else: flags, [`ServiceConfig`],
//! [`Service::start`], [`Service::run`].

use std::sync::Arc;
use std::time::Duration;

use cm_dispatch::{MissionRuntime, RoutedDispatcher};
use cm_store::{PgStore, StoreError, StoreOptions};
use tokio::sync::watch;

use crate::failure::{Failure, input};
use crate::health::Health;
use crate::hosts::AllowedHosts;
use crate::http_state::{BearerToken, HttpState, StatusPage};
use crate::{RunSummary, Scheduler, bounded};

mod config;
pub mod database;
pub mod messages;
pub mod missions;
mod readiness;
pub mod secrets;

pub use config::ServiceConfig;

use readiness::{DatabaseReadiness, Waiting};

/// Tells a service to stop: `true` is sent once, when it should.
pub type Stop = watch::Receiver<bool>;

/// A started service: the database answers, the mission runtime (if any) too, and the status
/// page and probes are served (with `--listen`).
pub struct Service {
    scheduler: Arc<Scheduler>,
    traces: Option<crate::traces::FireTracer>,
}

/// Completes once `stop` says so.
async fn stopped(mut stop: Stop) {
    let _ = stop.wait_for(|stop| *stop).await;
}

impl Service {
    /// Starts a service: checks the configuration ([`ServiceConfig::validate`]), sets up the
    /// backends, serves HTTP, and waits until the database (migrated, unless `--no-migrate`)
    /// and the mission runtime answer. `None` when `stop` came first: nothing is left running
    /// but the HTTP server, which ends with the process.
    pub async fn start(config: ServiceConfig, stop: Stop) -> Result<Option<Service>, Failure> {
        let scheduler_config = config.validate()?;
        let ServiceConfig {
            database_url: url,
            run: args,
        } = config;
        let url = url.as_str();
        let lease = scheduler_config.lease;
        let mission = args.mission.dispatcher().await.map_err(|e| match e {
            missions::MissionSetupError::Config(message) => Failure::Input(message),
            missions::MissionSetupError::Runtime(message) => Failure::Other(message),
        })?;
        let runner = args.mission.describe();
        let token = http_token(&args)?;
        let messages = args.messages.plan(&scheduler_config)?;
        let listener = match args.listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| input(format!("cannot listen on {addr}: {e}")))?,
            ),
            None => None,
        };
        // Its names are the bound address's (a `--listen` port 0 is the one the system chose).
        let bound = match &listener {
            Some(listener) => Some(local_addr(listener)?),
            None => None,
        };
        let hosts = allowed_hosts(bound, &args.allowed_host)?;
        // The recorder goes in before the scheduler's counters are made, so they record into it.
        let metrics = match listener {
            Some(_) => Some(
                crate::counters::install_prometheus()
                    .map_err(|e| Failure::Other(format!("installing the metrics recorder: {e}")))?,
            ),
            None => None,
        };

        // Both pools connect on first use: the process starts, and serves /livez, while the
        // database is down. Set-up (migrating, or checking the schema) runs without the
        // scheduler's timeouts, since building an index on a large ledger takes longer than
        // any claim statement may; the scheduler's own pool has statement, lock and
        // idle-in-transaction timeouts derived from the lease, so a claim never holds its
        // routines' locks past the leases it wrote.
        let invalid = |e: StoreError| {
            input(format!(
                "invalid --database-url {}: {e}",
                database::redact(url)
            ))
        };
        let setup =
            PgStore::connect_lazy_with(url, &database::store_options(StoreOptions::default()))
                .map_err(invalid)?;
        // The transaction that records a routine's Nth failure in a row pauses it.
        let store = PgStore::connect_lazy_with(
            url,
            &database::store_options(StoreOptions::for_lease(lease)),
        )
        .map_err(invalid)?
        .pausing_after_failures(args.pause_after_failures);
        let events_sink = messages::events_sink(
            args.events_webhook.as_deref(),
            args.events_webhook_secret_file.as_deref(),
        )?;
        let (message, nats) = messages.build(&store, &setup);
        let instance_id = args
            .instance_id
            .clone()
            .unwrap_or_else(crate::default_instance_id);
        let (mission, runtime) = mission.unzip();
        let traces = match &args.otlp_endpoint {
            Some(endpoint) => {
                let traces =
                    crate::traces::FireTracer::otlp(endpoint, &instance_id).map_err(input)?;
                tracing::info!(endpoint = %endpoint, "sending traces of fires over OTLP");
                Some(traces)
            }
            None => None,
        };
        let mut scheduler = Scheduler::new(
            Arc::new(store.clone()),
            Arc::new(RoutedDispatcher::new(Some(message), mission)),
            scheduler_config.clone(),
            instance_id.clone(),
        )
        .map_err(|e| input(e.to_string()))?
        .with_auto_pause(Arc::new(store.clone()), args.pause_after_failures)
        .with_outbox_pruning(Arc::new(store.clone()))
        .with_planning(Arc::new(store.clone()))
        .with_events(Arc::new(store.clone()), events_sink)
        .with_groups(
            Arc::new(store.clone()),
            args.claim_per_group,
            args.group_lease,
        );
        // A supervisor listening on NOTIFY_SOCKET (systemd, Type=notify) hears READY=1 after
        // the first good tick, WATCHDOG=1 from the tick loop, and STOPPING=1.
        let notifier = match crate::notify::Notifier::from_env() {
            Ok(notifier) => notifier,
            Err(e) => {
                tracing::warn!(error = %e, "not notifying the supervisor");
                None
            }
        };
        if let Some(traces) = &traces {
            scheduler = scheduler.with_traces(traces.clone());
        }
        if let Some(notifier) = &notifier {
            tracing::info!(watchdog = ?notifier.watchdog(), "notifying the supervisor (NOTIFY_SOCKET)");
            notifier.status("waiting for the database");
            scheduler = scheduler.with_notifier(notifier.clone());
        }
        let stopping_early = |what: &str| {
            tracing::info!("stopped before {what} answered");
            if let Some(notifier) = &notifier {
                notifier.stopping();
            }
        };
        if let Some(runtime) = &runtime {
            scheduler = scheduler
                .with_secrets(secrets::registered())
                .with_run_watch(Arc::new(store.clone()), runtime.clone());
        }
        let scheduler = Arc::new(scheduler);

        let waiting = Waiting::new("waiting for the database: not reached yet");
        let mut started_health = None;
        if let (Some(listener), Some(metrics)) = (listener, metrics) {
            let health = Health::new(
                Arc::new(DatabaseReadiness {
                    // The pool waits longer than the check's deadline, so a hung network reads
                    // as "did not answer within 2s", not as the pool's own timeout.
                    store: http_pool(url, 1, Duration::from_secs(3)).map_err(invalid)?,
                    claims: store.clone(),
                    waiting: waiting.clone(),
                }),
                Duration::from_secs(1),
                Duration::from_secs(2),
            );
            tokio::spawn(health.clone().run());
            started_health = Some(health.clone());
            let page = http_pool(url, 2, Duration::from_secs(3)).map_err(invalid)?;
            let state = Arc::new(HttpState {
                stats: scheduler.stats(),
                health,
                // Ticks never wait for dispatches, so a healthy scheduler ticks every interval
                // however slow its targets are.
                fresh_within: scheduler_config.tick_interval * 3 + Duration::from_secs(5),
                metrics: metrics.clone(),
                status: Some(StatusPage {
                    hosts: hosts.clone().unwrap_or_else(AllowedHosts::loopback),
                    runner,
                    events: Some(Arc::new(page.clone())),
                    calendars: Some(Arc::new(page.clone())),
                    limits: Some(Arc::new(page.clone())),
                    ..StatusPage::new(Arc::new(page.clone()), Arc::new(page), instance_id.clone())
                }),
                token,
            });
            let addr = local_addr(&listener)?;
            tracing::info!(%addr, "serving the status page, /metrics, /livez and /readyz");
            if let Some(hosts) = &hosts {
                tracing::info!(hosts = %hosts, "the status page answers only these hosts (--allowed-host adds one)");
            }
            let router = crate::http::router(state);
            tokio::spawn(async move {
                if let Err(e) = crate::http::serve(listener, router).await {
                    tracing::error!(error = %e, "the HTTP server stopped");
                }
            });
            // Histograms are drained into their buckets here as well as on each scrape.
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    metrics.run_upkeep();
                }
            });
        }

        tokio::select! {
            prepared = readiness::prepare_database(url, &setup, !args.no_migrate, &waiting) => prepared?,
            () = stopped(stop.clone()) => {
                stopping_early("the database");
                return Ok(None);
            }
        }
        if let Some(nats) = nats {
            if let Some(notifier) = &notifier {
                notifier.status("waiting for NATS");
            }
            tokio::select! {
                connected = nats.wait(|reason| waiting.set(reason)) => connected?,
                () = stopped(stop.clone()) => {
                    stopping_early("NATS");
                    return Ok(None);
                }
            }
        }
        if let Some(runtime) = &runtime {
            if let Some(notifier) = &notifier {
                notifier.status("waiting for the mission runtime");
            }
            tokio::select! {
                () = readiness::wait_for_runtime(runtime.as_ref(), &waiting) => {}
                () = stopped(stop.clone()) => {
                    stopping_early("the mission runtime");
                    return Ok(None);
                }
            }
            check_permissions(runtime.as_ref()).await?;
        }

        // The start-up is over: health says so now, not at its next interval.
        if let Some(health) = &started_health {
            health.refresh().await;
        }
        Ok(Some(Service { scheduler, traces }))
    }

    /// Runs the scheduler until `stop` says so, then shuts down: no new claims, what is in
    /// flight finishes, and the last fires' spans are sent.
    pub async fn run(self, stop: Stop) -> Result<RunSummary, Failure> {
        let summary = self
            .scheduler
            .spawn(stopped(stop))
            .await
            .map_err(|e| Failure::Other(format!("the scheduler task failed: {e}")))?;
        if let Some(traces) = self.traces {
            // The last fires' spans are sent before the process exits.
            let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
        }
        Ok(summary)
    }
}

/// A listener's bound address.
fn local_addr(listener: &tokio::net::TcpListener) -> Result<std::net::SocketAddr, Failure> {
    listener
        .local_addr()
        .map_err(|e| Failure::Other(e.to_string()))
}

/// Refuses, in one line naming what to grant, a mission runtime that refuses this
/// scheduler's identity a permission the backend needs: it would fail every stop or log read
/// later, one fire at a time.
async fn check_permissions(runtime: &dyn MissionRuntime) -> Result<(), Failure> {
    let missing = runtime.missing_permissions().await.map_err(|e| {
        Failure::Other(format!(
            "cannot check the mission runtime's permissions: {e}"
        ))
    })?;
    if !missing.is_empty() {
        return Err(input(format!(
            "the mission runtime refuses this scheduler's identity what the backend needs: {} \
             (grant create, get and delete on jobs, list on pods and get on pods/log in its \
             namespace)",
            missing.join(", ")
        )));
    }
    Ok(())
}

/// A small pool of its own for what the HTTP side reads (health, the status page and its
/// actions), with short timeouts: a flood of requests or a hung network waits there, never on
/// the claims' pool.
fn http_pool(url: &str, connections: u32, timeout: Duration) -> Result<PgStore, StoreError> {
    PgStore::connect_lazy_with(
        url,
        &database::store_options(StoreOptions {
            max_connections: connections,
            acquire_timeout: timeout,
            statement_timeout: Some(timeout),
            lock_timeout: Some(timeout),
            idle_in_transaction_timeout: Some(timeout),
            pooled: false,
        }),
    )
}

/// Reads the status page's bearer token, if a file is given ([`ServiceConfig::validate`]
/// requires one beyond loopback).
fn http_token(args: &crate::flags::RunArgs) -> Result<Option<BearerToken>, Failure> {
    let Some(path) = &args.http_token_file else {
        return Ok(None);
    };
    let shown = path.display();
    let text = bounded::read_file(path, bounded::SECRET_FILE)
        .map_err(|e| input(format!("cannot read --http-token-file {shown}: {e}")))?;
    secrets::register_file(&text);
    BearerToken::new(&text)
        .map(Some)
        .ok_or_else(|| input(format!("--http-token-file {shown} is empty")))
}

/// The names the status page answers (`None` without `--listen`): the listen address's own,
/// and each `--allowed-host`.
fn allowed_hosts(
    listen: Option<std::net::SocketAddr>,
    names: &[String],
) -> Result<Option<AllowedHosts>, Failure> {
    let Some(listen) = listen else {
        return Ok(None);
    };
    let mut hosts = AllowedHosts::for_listen(listen);
    for name in names {
        hosts.admit(name).map_err(input)?;
    }
    Ok(Some(hosts))
}
