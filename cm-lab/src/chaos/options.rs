//! The chaos run's command line: one [`Options`] from the arguments after `chaos`.
//!
//! Every fault is a flag; `--short` is CI's run and later flags adjust it. Combinations that
//! cannot be run (a broker restart without the NATS backend, a failover beside database
//! restarts of the same primary) are refused here, before anything is built or created.

use std::time::Duration;

use anyhow::{Context, bail};

pub(super) const USAGE: &str = "usage: cargo xtask chaos [--short] [--database-url URL] [--pg-cluster VERSION/NAME]
                          [--routines N] [--processes N] [--duration SECONDS] [--seed N] [--keep]
                          [--db-restarts N] [--terminate-backends N] [--held-locks N]
                          [--message-backend outbox|webhook|nats] [--broker-restarts N]
                          [--network-hang SECONDS] [--failover sync|async --standby-cluster VERSION/NAME]
                          [--auto-failover MONITOR_URL] (with --database-url h1:p1,h2:p2 and --db-restarts 0)
                          [--pin-xmin SECONDS [--pin-baseline]] [--starve-pool SECONDS]
                          [--receiver-outage SECONDS]
                          [--mission-backend docker [--dockerd-restarts N] [--refuse-stops]]
                          [--citus-workers VERSION/NAME,VERSION/NAME... [--worker-outage SECONDS] [--shard-moves N]]
                          [--pooler URL] [--poison-routine] [--events-webhook]
                          [--concurrency-limit N] [--retries N]";

/// The routines of a `--mission-backend docker` run when `--routines` is not given: each fires
/// a container every second on the run's one engine.
pub(super) const DOCKER_ROUTINES: usize = 3;

/// The server the chaos database is created on. Not `DATABASE_URL`: `.cargo/config.toml` sets
/// that for every process cargo runs, so it would silently win over what the user meant.
pub(super) const DEFAULT_SERVER_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Where the schedulers send their messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MessageBackend {
    /// The transactional outbox, the product's default.
    Outbox,
    /// Signed HTTP POSTs to the run's own slow receiver.
    Webhook,
    /// JetStream messages on the run's own `nats-server`.
    Nats,
}

impl MessageBackend {
    pub fn name(self) -> &'static str {
        match self {
            MessageBackend::Outbox => "outbox",
            MessageBackend::Webhook => "webhook",
            MessageBackend::Nats => "nats",
        }
    }
}

/// How the standby that takes over is fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Replication {
    /// `synchronous_standby_names = '*'`: a commit returns once the standby has it.
    Sync,
    /// The default streaming replication: the standby may trail the primary.
    Async,
}

/// The settings of one run.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Options {
    pub server_url: String,
    pub routines: usize,
    pub processes: usize,
    pub duration: Duration,
    pub seed: u64,
    pub db_restarts: u32,
    pub terminate_backends: u32,
    /// Callers that hold one routine's rows (`cm.delete_routine`, rolled back) longer than a
    /// lease, spread over the run.
    pub held_locks: u32,
    pub pg_cluster: Option<String>,
    pub keep: bool,
    pub backend: MessageBackend,
    /// SIGKILLs of the run's `nats-server` (NATS backend only).
    pub broker_restarts: u32,
    /// How long the forwarder between the schedulers and PostgreSQL stops forwarding.
    pub network_hang: Option<Duration>,
    /// A failover to a standby, and how it is fed.
    pub failover: Option<Replication>,
    pub standby_cluster: Option<String>,
    /// The monitor of a pg_auto_failover formation whose nodes `server_url` names (several
    /// hosts): the schedulers get that multi-host URL, and `pg_autoctl perform failover` moves
    /// the primary twice during the run.
    pub auto_failover: Option<String>,
    /// With `--auto-failover`: the formation's multi-host URL the schedulers get, once the run
    /// has pointed `server_url` at the primary of the moment for its own connections.
    pub formation_url: Option<String>,
    /// How long a `REPEATABLE READ` transaction pins the xmin horizon.
    pub pin_xmin: Option<Duration>,
    /// Measure as `--pin-xmin` does without holding the transaction: the baseline.
    pub pin_baseline: bool,
    /// How long another client holds all but two of the server's connections.
    pub starve_pool: Option<Duration>,
    /// How long the webhook receiver answers every request 503 (webhook backend only).
    pub receiver_outage: Option<Duration>,
    /// Mission routines launched as containers on the run's own dockerd, instead of message
    /// routines.
    pub docker: bool,
    /// Restarts of the run's dockerd (`--mission-backend docker` only).
    pub dockerd_restarts: u32,
    /// The run's dockerd refuses the stop of every other container through an authorization
    /// plugin of the run's own (`--mission-backend docker` only), so overlap `replace` meets
    /// stops the engine refuses.
    pub refuse_stops: bool,
    /// The worker clusters of the Citus coordinator `server_url` names: the chaos database is
    /// made a Citus database on every node and distributed (`migrate --citus`), and
    /// `--db-restarts` take down the first worker rather than the coordinator.
    pub citus_workers: Vec<String>,
    /// How long the first Citus worker is stopped, once (`--citus-workers` only); the other
    /// workers' groups must keep firing.
    pub worker_outage: Option<Duration>,
    /// How many shards of the first Citus worker are moved to the second with `block_writes`
    /// (`--citus-workers` only); the groups left in place must stay on time.
    pub shard_moves: u32,
    /// A connection pooler (PgBouncer) in front of the server `server_url` names, forwarding
    /// every database name to it: the schedulers reach the chaos database through it (its
    /// database part replaced by the run's, `--pooled`); the harness's own connections, the
    /// migrations and the routines' creation stay direct.
    pub pooler: Option<String>,
    /// A routine whose schedule is too costly to check is written through SQL
    /// (`cm.create_routine`) a third of the way in: it must be set aside with its reason while
    /// the others keep firing (on in `--short`).
    pub poison_routine: bool,
    /// The schedulers post their events to the run's own receiver, a toggler pauses and
    /// resumes a routine beside the faults, and the check compares the events received with
    /// those written (on in `--short`).
    pub events: bool,
    /// Every other routine shares the concurrency key `chaos`, limited to this many at once; a
    /// watcher samples the places held through the run, and none may be over.
    pub concurrency_limit: Option<u32>,
    /// Every third routine fires every five seconds and retries a failed outcome this many
    /// times (backoff 1 s to 2 s, so a retry fits before its next occurrence); the ledger
    /// check owes it every fifth second.
    pub retries: Option<u32>,
}

impl Options {
    pub fn defaults(seed: u64) -> Self {
        Options {
            server_url: DEFAULT_SERVER_URL.to_string(),
            routines: 20,
            processes: 3,
            duration: Duration::from_secs(60),
            seed,
            db_restarts: 1,
            terminate_backends: 2,
            held_locks: 0,
            pg_cluster: None,
            keep: false,
            backend: MessageBackend::Outbox,
            broker_restarts: 0,
            network_hang: None,
            failover: None,
            standby_cluster: None,
            auto_failover: None,
            formation_url: None,
            pin_xmin: None,
            pin_baseline: false,
            starve_pool: None,
            receiver_outage: None,
            docker: false,
            dockerd_restarts: 0,
            refuse_stops: false,
            citus_workers: Vec::new(),
            worker_outage: None,
            shard_moves: 0,
            pooler: None,
            poison_routine: false,
            events: false,
            concurrency_limit: None,
            retries: None,
        }
    }

    /// `--short`, the run CI makes on every change: under two minutes in all, with every kind
    /// of crash (SIGKILLs, one PostgreSQL restart, the schedulers' connections terminated) and
    /// a poison routine written through SQL.
    /// two callers holding a routine's rows past the lease.
    pub fn short(self) -> Self {
        Options {
            routines: 10,
            processes: 3,
            duration: Duration::from_secs(40),
            db_restarts: 1,
            terminate_backends: 2,
            poison_routine: true,
            held_locks: 2,
            events: true,
            ..self
        }
    }

    /// Whether the schedulers reach PostgreSQL through the run's forwarder.
    pub fn forwarded(&self) -> bool {
        self.network_hang.is_some() || self.failover.is_some()
    }

    /// The flags that give this run again (the seed included), for the summary.
    pub fn command(&self) -> String {
        let mut c = format!(
            "cargo xtask chaos --seed {} --routines {} --processes {} --duration {} --db-restarts {} --terminate-backends {}",
            self.seed,
            self.routines,
            self.processes,
            self.duration.as_secs(),
            self.db_restarts,
            self.terminate_backends
        );
        if self.poison_routine {
            c += " --poison-routine";
        }
        if self.events {
            c += " --events-webhook";
        }
        if self.held_locks > 0 {
            c += &format!(" --held-locks {}", self.held_locks);
        }
        if self.backend != MessageBackend::Outbox {
            c += &format!(" --message-backend {}", self.backend.name());
        }
        if self.docker {
            c += &format!(
                " --mission-backend docker --dockerd-restarts {}{}",
                self.dockerd_restarts,
                if self.refuse_stops {
                    " --refuse-stops"
                } else {
                    ""
                }
            );
        }
        if self.backend == MessageBackend::Nats {
            c += &format!(" --broker-restarts {}", self.broker_restarts);
        }
        let secs = |d: Duration| d.as_secs();
        if let Some(d) = self.network_hang {
            c += &format!(" --network-hang {}", secs(d));
        }
        if let Some(mode) = self.failover {
            c += match mode {
                Replication::Sync => " --failover sync",
                Replication::Async => " --failover async",
            };
        }
        if let Some(monitor) = &self.auto_failover {
            c += &format!(
                " --database-url {} --auto-failover {monitor}",
                self.server_url
            );
        }
        if let Some(d) = self.pin_xmin {
            c += &format!(" --pin-xmin {}", secs(d));
            if self.pin_baseline {
                c += " --pin-baseline";
            }
        }
        if let Some(d) = self.starve_pool {
            c += &format!(" --starve-pool {}", secs(d));
        }
        if let Some(d) = self.receiver_outage {
            c += &format!(" --receiver-outage {}", secs(d));
        }
        if !self.citus_workers.is_empty() {
            c += &format!(" --citus-workers {}", self.citus_workers.join(","));
        }
        if let Some(d) = self.worker_outage {
            c += &format!(" --worker-outage {}", secs(d));
        }
        if self.shard_moves > 0 {
            c += &format!(" --shard-moves {}", self.shard_moves);
        }
        if let Some(pooler) = &self.pooler {
            c += &format!(" --pooler {pooler}");
        }
        if let Some(n) = self.concurrency_limit {
            c += &format!(" --concurrency-limit {n}");
        }
        if let Some(n) = self.retries {
            c += &format!(" --retries {n}");
        }
        c
    }
}

/// Parses the arguments after `chaos`; `None` means help was asked for. An error is one line.
pub(super) fn parse_args(args: &[String], default_seed: u64) -> anyhow::Result<Option<Options>> {
    fn value<'a>(it: &mut impl Iterator<Item = &'a String>, flag: &str) -> anyhow::Result<&'a str> {
        it.next()
            .map(String::as_str)
            .with_context(|| format!("{flag} needs a value (see --help)"))
    }
    fn number<T: std::str::FromStr>(flag: &str, text: &str) -> anyhow::Result<T> {
        text.parse()
            .map_err(|_| anyhow::anyhow!("{flag} expects a number, not {text:?}"))
    }
    fn seconds(flag: &str, text: &str) -> anyhow::Result<Duration> {
        let n: u64 = number(flag, text.strip_suffix('s').unwrap_or(text))?;
        Ok(Duration::from_secs(n))
    }
    let mut options = Options::defaults(default_seed);
    let mut broker_restarts = None;
    let mut dockerd_restarts = None;
    let mut routines_given = false;
    let mut held_locks_given = false;
    let mut poison_given = false;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--database-url" => options.server_url = value(&mut it, flag)?.to_string(),
            "--routines" => {
                options.routines = number(flag, value(&mut it, flag)?)?;
                routines_given = true;
            }
            "--processes" => options.processes = number(flag, value(&mut it, flag)?)?,
            "--duration" => options.duration = seconds(flag, value(&mut it, flag)?)?,
            "--seed" => options.seed = number(flag, value(&mut it, flag)?)?,
            "--db-restarts" => options.db_restarts = number(flag, value(&mut it, flag)?)?,
            "--terminate-backends" => {
                options.terminate_backends = number(flag, value(&mut it, flag)?)?;
            }
            "--held-locks" => {
                options.held_locks = number(flag, value(&mut it, flag)?)?;
                held_locks_given = true;
            }
            "--short" => options = options.short(),
            "--pg-cluster" => options.pg_cluster = Some(value(&mut it, flag)?.to_string()),
            "--keep" => options.keep = true,
            "--message-backend" => {
                options.backend = match value(&mut it, flag)? {
                    "outbox" => MessageBackend::Outbox,
                    "webhook" => MessageBackend::Webhook,
                    "nats" => MessageBackend::Nats,
                    other => bail!("--message-backend is outbox, webhook or nats, not {other:?}"),
                }
            }
            "--mission-backend" => match value(&mut it, flag)? {
                "docker" => options.docker = true,
                other => bail!("--mission-backend is docker, not {other:?}"),
            },
            "--dockerd-restarts" => dockerd_restarts = Some(number(flag, value(&mut it, flag)?)?),
            "--refuse-stops" => options.refuse_stops = true,
            "--broker-restarts" => broker_restarts = Some(number(flag, value(&mut it, flag)?)?),
            "--network-hang" => options.network_hang = Some(seconds(flag, value(&mut it, flag)?)?),
            "--failover" => {
                options.failover = Some(match value(&mut it, flag)? {
                    "sync" => Replication::Sync,
                    "async" => Replication::Async,
                    other => bail!("--failover is sync or async, not {other:?}"),
                })
            }
            "--standby-cluster" => {
                options.standby_cluster = Some(value(&mut it, flag)?.to_string());
            }
            "--auto-failover" => {
                options.auto_failover = Some(value(&mut it, flag)?.to_string());
            }
            "--pin-xmin" => options.pin_xmin = Some(seconds(flag, value(&mut it, flag)?)?),
            "--pin-baseline" => options.pin_baseline = true,
            "--starve-pool" => options.starve_pool = Some(seconds(flag, value(&mut it, flag)?)?),
            "--receiver-outage" => {
                options.receiver_outage = Some(seconds(flag, value(&mut it, flag)?)?);
            }
            "--citus-workers" => {
                options.citus_workers = value(&mut it, flag)?
                    .split(',')
                    .map(str::to_string)
                    .collect();
            }
            "--shard-moves" => options.shard_moves = number(flag, value(&mut it, flag)?)?,
            "--worker-outage" => {
                options.worker_outage = Some(seconds(flag, value(&mut it, flag)?)?);
            }
            "--pooler" => options.pooler = Some(value(&mut it, flag)?.to_string()),
            "--concurrency-limit" => {
                options.concurrency_limit = Some(number(flag, value(&mut it, flag)?)?);
            }
            "--retries" => {
                let n: u32 = number(flag, value(&mut it, flag)?)?;
                if !(1..=100).contains(&n) {
                    bail!("--retries is 1 to 100 (it was {n})");
                }
                options.retries = Some(n);
            }
            "--poison-routine" => {
                options.poison_routine = true;
                poison_given = true;
            }
            "--events-webhook" => options.events = true,
            "-h" | "--help" => return Ok(None),
            other => bail!("unknown argument {other:?} (see --help)"),
        }
    }
    options.broker_restarts = match (broker_restarts, options.backend) {
        (Some(n), MessageBackend::Nats) => n,
        (None, MessageBackend::Nats) => 2,
        (Some(_), _) => bail!("--broker-restarts needs --message-backend nats"),
        (None, _) => 0,
    };
    options.dockerd_restarts = match (dockerd_restarts, options.docker) {
        (Some(n), true) => n,
        (None, true) => 1,
        (Some(_), false) => bail!("--dockerd-restarts needs --mission-backend docker"),
        (None, false) => 0,
    };
    if options.refuse_stops && !options.docker {
        bail!("--refuse-stops needs --mission-backend docker");
    }
    // A worker stopped for longer than a hold can take the held routine's shard with it, and
    // the caller's delete then fails rather than holds: that fault is left to runs that ask
    // for it.
    if options.worker_outage.is_some() && !held_locks_given {
        options.held_locks = 0;
    }
    // A worker stopped for longer than a routine's planning pass holds back its groups' planning,
    // the poison routine's too if it lands there: that fault is left to runs that ask for it.
    if options.worker_outage.is_some() && !poison_given {
        options.poison_routine = false;
    }
    // Every occurrence is a container on one small engine: a few routines, unless asked.
    if options.docker && !routines_given {
        options.routines = DOCKER_ROUTINES;
    }
    check(&options)?;
    Ok(Some(options))
}

/// What no run can do.
fn check(o: &Options) -> anyhow::Result<()> {
    if o.routines == 0 || o.processes == 0 {
        bail!("--routines and --processes must be at least 1");
    }
    if o.duration < Duration::from_secs(5) {
        bail!("--duration must be at least 5 seconds");
    }
    if o.retries.is_some() && o.docker {
        bail!(
            "--retries runs message routines: the Docker check counts one container an occurrence, not one an attempt"
        );
    }
    if o.receiver_outage.is_some() && o.backend != MessageBackend::Webhook {
        bail!("--receiver-outage needs --message-backend webhook");
    }
    if o.docker && o.backend != MessageBackend::Outbox {
        bail!("--mission-backend docker runs mission routines only: leave out --message-backend");
    }
    if o.failover.is_some() != o.standby_cluster.is_some() {
        bail!("--failover and --standby-cluster VERSION/NAME go together");
    }
    if o.auto_failover.is_some() {
        if o.db_restarts > 0 || o.failover.is_some() || !o.citus_workers.is_empty() {
            bail!(
                "--auto-failover moves the primary itself: add --db-restarts 0, leave out \
                 --failover and --citus-workers"
            );
        }
        if !o.server_url.split('?').next().unwrap_or("").contains(',') {
            bail!(
                "--auto-failover needs --database-url naming the formation's nodes (h1:p1,h2:p2)"
            );
        }
    }
    if o.failover.is_some() && o.db_restarts > 0 {
        bail!("--failover kills the primary itself: add --db-restarts 0");
    }
    if !o.citus_workers.is_empty() {
        if o.citus_workers.iter().any(|w| !w.contains('/')) {
            bail!("--citus-workers is a comma-separated list of VERSION/NAME clusters");
        }
        if o.failover.is_some() || o.pg_cluster.is_some() {
            bail!(
                "--citus-workers restarts the first worker: leave out --failover and --pg-cluster"
            );
        }
    }
    if o.shard_moves > 0 {
        if o.citus_workers.len() < 2 {
            bail!("--shard-moves moves shards of the first of two or more --citus-workers");
        }
        if o.worker_outage.is_some() {
            bail!("--shard-moves and --worker-outage each need the run to themselves");
        }
        let needed = (super::fault::worker::QUIET_BEFORE
            + Duration::from_secs(10 + 2 * u64::from(o.shard_moves)))
            * 3
            / 2;
        if o.duration < needed {
            bail!(
                "--shard-moves {} needs --duration of at least {} s",
                o.shard_moves,
                needed.as_secs()
            );
        }
    }
    if let Some(length) = o.worker_outage {
        if o.citus_workers.len() < 2 {
            bail!("--worker-outage stops the first of two or more --citus-workers");
        }
        // The kills stop a third of the way in, the worker a group lease later; it must be back
        // with ten seconds to spare.
        let needed =
            (length + super::fault::worker::QUIET_BEFORE + Duration::from_secs(10)) * 3 / 2;
        if o.duration < needed {
            bail!(
                "--worker-outage {} needs --duration of at least {} s",
                length.as_secs(),
                needed.as_secs()
            );
        }
    }
    if o.pooler.is_some() && (o.forwarded() || !o.citus_workers.is_empty()) {
        bail!(
            "--pooler puts PgBouncer between the schedulers and PostgreSQL: leave out \
             --network-hang, --failover and --citus-workers"
        );
    }
    if o.pin_baseline && o.pin_xmin.is_none() {
        bail!("--pin-baseline measures a --pin-xmin run without the pin: give --pin-xmin too");
    }
    // Each fault starts a third of the way in and must be over with time to spare, so the end
    // of the chaos finds the schedulers recovered rather than still in the fault.
    let needs = |flag: &str, fault: Option<Duration>, after: u64| -> anyhow::Result<()> {
        if let Some(d) = fault
            && o.duration < (d + Duration::from_secs(after)) * 3 / 2
        {
            bail!(
                "{flag} {} needs --duration of at least {} s",
                d.as_secs(),
                ((d + Duration::from_secs(after)) * 3 / 2).as_secs()
            );
        }
        Ok(())
    };
    needs("--network-hang", o.network_hang, 10)?;
    needs("--starve-pool", o.starve_pool, 10)?;
    needs("--pin-xmin", o.pin_xmin, 60)?;
    needs("--receiver-outage", o.receiver_outage, 10)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let options = parse_args(&[], 7).unwrap().unwrap();
        assert_eq!(options, Options::defaults(7));
        assert_eq!(options.backend, MessageBackend::Outbox);
        assert_eq!((options.routines, options.processes), (20, 3));
        assert_eq!(options.duration, Duration::from_secs(60));
        assert_eq!(options.db_restarts, 1);
        assert_eq!(options.server_url, DEFAULT_SERVER_URL);
        assert!(!options.forwarded());
    }

    #[test]
    fn every_flag_is_read() {
        let options = parse_args(
            &args(&[
                "--database-url",
                "postgres://u@h:1/x",
                "--routines",
                "5",
                "--processes",
                "2",
                "--duration",
                "300s",
                "--seed",
                "42",
                "--db-restarts",
                "0",
                "--terminate-backends",
                "3",
                "--pg-cluster",
                "15/chaos",
                "--keep",
                "--message-backend",
                "webhook",
                "--network-hang",
                "30",
                "--failover",
                "async",
                "--standby-cluster",
                "15/chaosstby",
                "--pin-xmin",
                "120",
                "--pin-baseline",
                "--starve-pool",
                "60",
                "--receiver-outage",
                "20",
                "--concurrency-limit",
                "3",
                "--retries",
                "2",
            ]),
            7,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            options,
            Options {
                server_url: "postgres://u@h:1/x".into(),
                routines: 5,
                processes: 2,
                duration: Duration::from_secs(300),
                seed: 42,
                db_restarts: 0,
                terminate_backends: 3,
                held_locks: 0,
                pg_cluster: Some("15/chaos".into()),
                keep: true,
                backend: MessageBackend::Webhook,
                broker_restarts: 0,
                network_hang: Some(Duration::from_secs(30)),
                failover: Some(Replication::Async),
                standby_cluster: Some("15/chaosstby".into()),
                auto_failover: None,
                formation_url: None,
                pin_xmin: Some(Duration::from_secs(120)),
                pin_baseline: true,
                starve_pool: Some(Duration::from_secs(60)),
                receiver_outage: Some(Duration::from_secs(20)),
                docker: false,
                dockerd_restarts: 0,
                refuse_stops: false,
                citus_workers: Vec::new(),
                worker_outage: None,
                shard_moves: 0,
                pooler: None,
                poison_routine: false,
                events: false,
                concurrency_limit: Some(3),
                retries: Some(2),
            }
        );
        assert!(options.forwarded());
        let nats = parse_args(&args(&["--message-backend", "nats"]), 1)
            .unwrap()
            .unwrap();
        assert_eq!(
            nats.broker_restarts, 2,
            "the NATS backend restarts its broker twice"
        );
        assert!(
            nats.command()
                .ends_with("--message-backend nats --broker-restarts 2")
        );
    }

    #[test]
    fn the_docker_mission_backend_runs_a_few_routines_and_restarts_its_engine_once() {
        let docker = parse_args(&args(&["--short", "--mission-backend", "docker"]), 3)
            .unwrap()
            .unwrap();
        assert!(docker.docker);
        assert_eq!(docker.dockerd_restarts, 1);
        assert_eq!(docker.routines, DOCKER_ROUTINES);
        assert!(
            docker
                .command()
                .contains("--routines 3 --processes 3 --duration 40")
        );
        assert!(
            docker
                .command()
                .ends_with("--mission-backend docker --dockerd-restarts 1")
        );
        let given = parse_args(
            &args(&[
                "--mission-backend",
                "docker",
                "--routines",
                "5",
                "--dockerd-restarts",
                "2",
            ]),
            3,
        )
        .unwrap()
        .unwrap();
        assert_eq!((given.routines, given.dockerd_restarts), (5, 2));
    }

    #[test]
    fn short_is_a_small_run_with_every_crash_that_later_flags_adjust() {
        let options = parse_args(&args(&["--short", "--db-restarts", "0"]), 7)
            .unwrap()
            .unwrap();
        assert_eq!(
            options,
            Options {
                routines: 10,
                duration: Duration::from_secs(40),
                db_restarts: 0,
                poison_routine: true,
                held_locks: 2,
                events: true,
                ..Options::defaults(7)
            }
        );
        // The backend is kept whatever the order.
        let options = parse_args(&args(&["--message-backend", "webhook", "--short"]), 7)
            .unwrap()
            .unwrap();
        assert_eq!(
            options,
            Options {
                backend: MessageBackend::Webhook,
                ..Options::defaults(7).short()
            }
        );
        // CI's hanging network: 30 s of hang in a 60 s run.
        let hang = parse_args(
            &args(&["--short", "--network-hang", "30", "--duration", "60"]),
            7,
        )
        .unwrap()
        .unwrap();
        assert_eq!(hang.network_hang, Some(Duration::from_secs(30)));
    }

    #[test]
    fn citus_workers_are_read_and_given_back() {
        let citus = parse_args(
            &args(&["--short", "--citus-workers", "15/citus_w1,15/citus_w2"]),
            5,
        )
        .unwrap()
        .unwrap();
        assert_eq!(citus.citus_workers, ["15/citus_w1", "15/citus_w2"]);
        assert_eq!(citus.db_restarts, 1, "the short run restarts a worker once");
        assert!(
            citus
                .command()
                .ends_with(" --citus-workers 15/citus_w1,15/citus_w2")
        );
        let outage = parse_args(
            &args(&[
                "--short",
                "--citus-workers",
                "15/citus_w1,15/citus_w2",
                "--worker-outage",
                "20",
                "--duration",
                "72",
            ]),
            5,
        )
        .unwrap()
        .unwrap();
        assert_eq!(outage.worker_outage, Some(Duration::from_secs(20)));
        assert!(outage.command().ends_with(" --worker-outage 20"));
        // Too short a run for the quiet time, the outage and the recovery; no Citus at all.
        for bad in [
            &[
                "--short",
                "--citus-workers",
                "15/a,15/b",
                "--worker-outage",
                "20",
            ][..],
            &["--short", "--worker-outage", "20", "--duration", "90"],
        ] {
            assert!(parse_args(&args(bad), 5).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_pooler_is_read_and_given_back() {
        let pooled = parse_args(
            &args(&[
                "--short",
                "--pooler",
                "postgres://postgres@127.0.0.1:6432/postgres",
            ]),
            5,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            pooled.pooler.as_deref(),
            Some("postgres://postgres@127.0.0.1:6432/postgres")
        );
        assert!(
            pooled
                .command()
                .ends_with(" --pooler postgres://postgres@127.0.0.1:6432/postgres")
        );
    }

    #[test]
    fn bad_arguments_are_refused_in_one_line() {
        for bad in [
            &["--routines"][..],
            &["--routines", "many"],
            &["--processes", "0"],
            &["--duration", "2"],
            &["--frobnicate"],
            &["--message-backend", "kafka"],
            &["--message-backend"],
            &["--broker-restarts", "2"],
            &["--receiver-outage", "20"],
            &["--failover", "async", "--db-restarts", "0"],
            &["--failover", "maybe"],
            &[
                "--auto-failover",
                "postgres://m/pg_auto_failover",
                "--db-restarts",
                "0",
            ],
            &[
                "--database-url",
                "postgres://a,b/x",
                "--auto-failover",
                "postgres://m/p",
            ],
            &["--standby-cluster", "15/s", "--failover", "sync"],
            &["--network-hang", "45"],
            &["--pin-baseline"],
            &["--pin-xmin", "120", "--duration", "200"],
            &["--mission-backend", "kubernetes"],
            &["--dockerd-restarts", "1"],
            &["--mission-backend", "docker", "--message-backend", "nats"],
            &["--citus-workers", "citus_w1"],
            &["--citus-workers", "15/w1", "--pg-cluster", "15/c"],
            &["--pooler"],
            &[
                "--pooler",
                "postgres://h/p",
                "--network-hang",
                "20",
                "--duration",
                "60",
            ],
        ] {
            match parse_args(&args(bad), 1) {
                Ok(_) => panic!("{bad:?} was accepted"),
                Err(e) => assert!(!format!("{e:#}").contains('\n'), "{bad:?}: {e:#}"),
            }
        }
        assert_eq!(parse_args(&args(&["--help"]), 1).unwrap(), None);
    }
}
