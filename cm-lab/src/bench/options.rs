//! The bench's settings: defaults for the full run and for `--quick`, and the flags that change them.

use std::time::Duration;

use anyhow::{Context, bail, ensure};

pub(super) const USAGE: &str = "usage: cargo xtask bench [--quick] [--batch N] \
[--tick DURATION] [--engine-args \"FLAGS\"] [--rounds N] [--sql-seconds N] [--drain-routines N] \
[--drain-backlog N] [--drain-limit N] [--window-routines N] [--window-backlog N] \
[--window-seconds N] [--lateness-routines N] [--lateness-cap N] [--lateness-seconds N] \
[--stall-seconds N] [--backfill-missions N] [--backfill-rate N] [--backfill-routines N] \
[--backfill-limit N] [--backfill-only] [--fairness-big N] [--fairness-only] [--database-url URL] \
[--citus-url URL]";

/// The raw-SQL scripts number 20,000 routines, and each of their two clients takes its batches from
/// its own half; a batch is that many consecutive routines at most.
pub(super) const SQL_ROUTINES_PER_CLIENT: usize = 10_000;

/// The raw-SQL schema on Citus (`schema_citus.sql`) has this many groups, cm's default count;
/// each of the two clients takes its groups from its own half.
pub(super) const CITUS_SQL_GROUPS: usize = 64;

/// Routines in each group of the raw-SQL schema on Citus (64 × 312 = 19,968, about the 20,000 of
/// the plain schema); a batch on Citus is that many consecutive routines of one group at most.
pub(super) const CITUS_SQL_ROUTINES_PER_GROUP: usize = 312;

// `lean_group.sql` numbers a message `instant × 1000 + the routine's number in its group`.
const _: () = assert!(CITUS_SQL_ROUTINES_PER_GROUP < 1000);

/// The bench's parameters.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Options {
    /// The short run: smaller counts, shorter windows, one round, and a last line for machines.
    pub quick: bool,
    /// Occurrences per raw-SQL transaction, and the processes' `--max-fires-per-tick`.
    pub batch: usize,
    /// The processes' `--tick-interval`.
    pub tick: Duration,
    /// More flags for every `cm-scheduler run` of the throughput runs (split on whitespace).
    pub engine_args: Vec<String>,
    /// Rounds of the interleaved throughput runs.
    pub rounds: u32,
    /// How long each pgbench run lasts (`-T`).
    pub sql_seconds: u32,
    /// Every-second routines of the drain run.
    pub drain_routines: u32,
    /// How far the drain run's clocks are put back, in seconds.
    pub drain_backlog: u32,
    /// How long a drain may take before its rate is reported as not drained.
    pub drain_limit: u32,
    /// Every-second routines of the window run (more than any engine drains).
    pub window_routines: u32,
    /// How far the window run's clocks are put back, in seconds.
    pub window_backlog: u32,
    /// How long the window run counts fires.
    pub window_seconds: u32,
    /// Every-second routines of the lateness runs.
    pub lateness_routines: u32,
    /// `max_fires_per_tick` of the lateness runs' schedulers.
    pub lateness_cap: usize,
    /// How long each lateness run lets its schedulers claim.
    pub lateness_seconds: u32,
    /// How long the backend double holds each dispatch of the stalled routine.
    pub stall_seconds: u32,
    /// Mission occurrences of the backfill run (one routine's backfill).
    pub backfill_missions: u32,
    /// The backfill run's `--max-mission-launches-per-second`.
    pub backfill_rate: u32,
    /// Every-second message routines beside the backfill.
    pub backfill_routines: u32,
    /// How long the backfill may take to drain before the run fails.
    pub backfill_limit: u32,
    /// Only the backfill run: no throughput or lateness runs, no pgbench, no release binary.
    pub backfill_only: bool,
    /// The big tenant's routines in the fairness runs, all due at one instant.
    pub fairness_big: u32,
    /// Only the fairness runs (with `--backfill-only` too, the backfill run and then them).
    pub fairness_only: bool,
    /// The server to create the bench databases on (its database part names the maintenance
    /// database to connect to for creating and dropping).
    pub database_url: String,
    /// A Citus coordinator: when given, the lean baseline (kept in one group a transaction) and
    /// the processes' drain and window run there too, in the same rounds, in databases made
    /// Citus on every node by `.ci/citus --database` and dropped on every node at the end.
    pub citus_url: Option<String>,
}

impl Options {
    /// The full run's defaults.
    pub fn full() -> Self {
        Options {
            quick: false,
            batch: 200,
            tick: Duration::from_millis(10),
            engine_args: Vec::new(),
            rounds: 3,
            sql_seconds: 10,
            drain_routines: 2_000,
            drain_backlog: 20,
            drain_limit: 120,
            window_routines: 200_000,
            window_backlog: 5,
            window_seconds: 20,
            lateness_routines: 1_000,
            lateness_cap: 1_000,
            lateness_seconds: 40,
            stall_seconds: 20,
            backfill_missions: 1_000,
            backfill_rate: 100,
            backfill_routines: 50,
            backfill_limit: 120,
            backfill_only: false,
            fairness_big: 100_000,
            fairness_only: false,
            // Not DATABASE_URL: `.cargo/config.toml` sets it for every cargo-run process, and
            // this names only the server; the bench writes to databases of its own.
            database_url: "postgres://postgres@127.0.0.1:5432/postgres".into(),
            citus_url: None,
        }
    }

    /// `--quick`'s defaults: the whole bench in under five minutes on a 2-core machine.
    pub fn quick() -> Self {
        Options {
            quick: true,
            rounds: 1,
            sql_seconds: 5,
            drain_backlog: 10,
            drain_limit: 40,
            window_routines: 20_000,
            window_backlog: 3,
            window_seconds: 8,
            lateness_seconds: 24,
            fairness_big: 20_000,
            ..Options::full()
        }
    }

    /// Parses the arguments after `bench`; `None` means help was asked for.
    pub fn parse(args: &[String]) -> anyhow::Result<Option<Self>> {
        let mut options = if args.iter().any(|a| a == "--quick") {
            Options::quick()
        } else {
            Options::full()
        };
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            match flag.as_str() {
                "--help" | "-h" => return Ok(None),
                "--quick" => continue,
                "--backfill-only" => {
                    options.backfill_only = true;
                    continue;
                }
                "--fairness-only" => {
                    options.fairness_only = true;
                    continue;
                }
                _ => {}
            }
            let value = args
                .next()
                .with_context(|| format!("{flag} needs a value (see --help)"))?;
            let number = || -> anyhow::Result<u32> {
                let n: u32 = value
                    .parse()
                    .with_context(|| format!("{flag} {value}: not a number"))?;
                ensure!(n > 0, "{flag} must be at least 1");
                Ok(n)
            };
            match flag.as_str() {
                "--batch" => options.batch = number()? as usize,
                "--tick" => options.tick = parse_duration(flag, value)?,
                "--engine-args" => {
                    options.engine_args = value.split_whitespace().map(String::from).collect();
                }
                "--rounds" => options.rounds = number()?,
                "--sql-seconds" => options.sql_seconds = number()?,
                "--drain-routines" => options.drain_routines = number()?,
                "--drain-backlog" => options.drain_backlog = number()?,
                "--drain-limit" => options.drain_limit = number()?,
                "--window-routines" => options.window_routines = number()?,
                "--window-backlog" => options.window_backlog = number()?,
                "--window-seconds" => options.window_seconds = number()?,
                "--lateness-routines" => options.lateness_routines = number()?,
                "--lateness-cap" => options.lateness_cap = number()? as usize,
                "--lateness-seconds" => options.lateness_seconds = number()?,
                "--stall-seconds" => options.stall_seconds = number()?,
                "--backfill-missions" => options.backfill_missions = number()?,
                "--backfill-rate" => options.backfill_rate = number()?,
                "--backfill-routines" => options.backfill_routines = number()?,
                "--backfill-limit" => options.backfill_limit = number()?,
                "--fairness-big" => options.fairness_big = number()?,
                "--database-url" => options.database_url = value.clone(),
                "--citus-url" => options.citus_url = Some(value.clone()),
                _ => bail!("unknown flag {flag} (see --help)"),
            }
        }
        ensure!(
            options.batch <= SQL_ROUTINES_PER_CLIENT,
            "--batch {} is more than the {SQL_ROUTINES_PER_CLIENT} routines each raw-SQL client numbers",
            options.batch
        );
        ensure!(
            options.citus_url.is_none() || options.batch <= CITUS_SQL_ROUTINES_PER_GROUP,
            "--batch {} is more than the {CITUS_SQL_ROUTINES_PER_GROUP} routines of a group in \
             the raw-SQL schema on Citus (--citus-url)",
            options.batch
        );
        ensure!(
            u64::from(options.stall_seconds) < 30,
            "--stall-seconds must be shorter than the 30 s dispatch timeout"
        );
        Ok(Some(options))
    }

    /// The flags every throughput process runs with: the bench's, then `--engine-args`.
    pub fn run_flags(&self) -> Vec<String> {
        let (tick, batch) = (format_duration(self.tick), self.batch.to_string());
        let defaults = [
            ("--tick-interval", tick.as_str()),
            ("--max-fires-per-tick", batch.as_str()),
            ("--lease", "60s"),
            ("--dispatch-timeout", "30s"),
            ("--misfire-grace", "1h"),
            ("--max-backlog", "10000"),
        ];
        // A flag `--engine-args` names replaces the bench's own (the binary refuses a flag
        // given twice).
        defaults
            .into_iter()
            .filter(|(flag, _)| !self.engine_args.iter().any(|a| a == flag))
            .flat_map(|(flag, value)| [flag.to_owned(), value.to_owned()])
            .chain(self.engine_args.iter().cloned())
            .collect()
    }
}

/// `250ms`, `2s`: whole milliseconds or seconds, the forms the binary's humantime also reads.
fn parse_duration(flag: &str, text: &str) -> anyhow::Result<Duration> {
    let parsed = if let Some(ms) = text.strip_suffix("ms") {
        ms.parse().ok().map(Duration::from_millis)
    } else if let Some(s) = text.strip_suffix('s') {
        s.parse().ok().map(Duration::from_secs)
    } else {
        None
    };
    match parsed {
        Some(d) if !d.is_zero() => Ok(d),
        _ => bail!("{flag} {text}: expected a duration like 10ms or 1s"),
    }
}

/// The form [`parse_duration`] reads, and the binary too.
pub(super) fn format_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(list: &[&str]) -> anyhow::Result<Option<Options>> {
        Options::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn quick_changes_the_defaults_and_flags_still_win() {
        assert_eq!(parse(&[]).unwrap().unwrap(), Options::full());
        assert_eq!(parse(&["--quick"]).unwrap().unwrap(), Options::quick());
        let options = parse(&["--rounds", "2", "--quick"]).unwrap().unwrap();
        assert!(options.quick);
        assert_eq!(options.rounds, 2);
        assert_eq!(options.sql_seconds, Options::quick().sql_seconds);
        assert_eq!(parse(&["--help"]).unwrap(), None);
    }

    #[test]
    fn every_flag_is_read() {
        let options = parse(&[
            "--batch",
            "100",
            "--tick",
            "50ms",
            "--engine-args",
            " --max-in-flight  64 ",
            "--rounds",
            "4",
            "--sql-seconds",
            "7",
            "--drain-routines",
            "300",
            "--drain-backlog",
            "6",
            "--drain-limit",
            "9",
            "--window-routines",
            "5000",
            "--window-backlog",
            "2",
            "--window-seconds",
            "11",
            "--lateness-routines",
            "50",
            "--lateness-cap",
            "60",
            "--lateness-seconds",
            "21",
            "--stall-seconds",
            "3",
            "--backfill-missions",
            "300",
            "--backfill-rate",
            "30",
            "--backfill-routines",
            "4",
            "--backfill-limit",
            "50",
            "--backfill-only",
            "--fairness-big",
            "7000",
            "--fairness-only",
            "--database-url",
            "postgres://u@h:1/x",
            "--citus-url",
            "postgres://u@h:2/y",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            options,
            Options {
                quick: false,
                batch: 100,
                tick: Duration::from_millis(50),
                engine_args: vec!["--max-in-flight".into(), "64".into()],
                rounds: 4,
                sql_seconds: 7,
                drain_routines: 300,
                drain_backlog: 6,
                drain_limit: 9,
                window_routines: 5000,
                window_backlog: 2,
                window_seconds: 11,
                lateness_routines: 50,
                lateness_cap: 60,
                lateness_seconds: 21,
                stall_seconds: 3,
                backfill_missions: 300,
                backfill_rate: 30,
                backfill_routines: 4,
                backfill_limit: 50,
                backfill_only: true,
                fairness_big: 7000,
                fairness_only: true,
                database_url: "postgres://u@h:1/x".into(),
                citus_url: Some("postgres://u@h:2/y".into()),
            }
        );
        let flags = options.run_flags();
        assert_eq!(
            flags[..4],
            ["--tick-interval", "50ms", "--max-fires-per-tick", "100"]
        );
        assert_eq!(flags[flags.len() - 2..], ["--max-in-flight", "64"]);
    }

    #[test]
    fn citus_is_off_unless_named_and_bounds_the_batch_by_a_group() {
        assert_eq!(Options::full().citus_url, None);
        assert_eq!(Options::quick().citus_url, None);
        let url = "postgres://postgres@127.0.0.1:5471/postgres";
        let options = parse(&["--quick", "--citus-url", url]).unwrap().unwrap();
        assert_eq!(options.citus_url.as_deref(), Some(url));
        assert_eq!(
            Options {
                citus_url: None,
                ..options
            },
            Options::quick()
        );
        let most = CITUS_SQL_ROUTINES_PER_GROUP.to_string();
        let options = parse(&["--batch", &most, "--citus-url", url])
            .unwrap()
            .unwrap();
        assert_eq!(options.batch, CITUS_SQL_ROUTINES_PER_GROUP);
        // Without Citus, a batch only has to fit a client's half of the plain schema.
        assert!(parse(&["--batch", "313"]).unwrap().is_some());
    }

    #[test]
    fn an_engine_flag_replaces_the_benchs_own() {
        let options = parse(&["--engine-args", "--misfire-grace 10m --max-backlog 100000"])
            .unwrap()
            .unwrap();
        let flags = options.run_flags();
        let given = |flag: &str| flags.iter().filter(|f| *f == flag).count();
        assert_eq!((given("--misfire-grace"), given("--max-backlog")), (1, 1));
        assert_eq!(
            flags[flags.len() - 4..],
            ["--misfire-grace", "10m", "--max-backlog", "100000"]
        );
        assert_eq!(given("--lease"), 1);
    }

    #[test]
    fn bad_arguments_are_refused() {
        for bad in [
            &["--rounds"][..],
            &["--rounds", "0"],
            &["--rounds", "x"],
            &["--tick", "10"],
            &["--tick", "0ms"],
            &["--batch", "10001"],
            &["--stall-seconds", "30"],
            &["--citus-url"],
            &["--batch", "313", "--citus-url", "postgres://u@h:2/y"],
            &["--fairness-big", "0"],
            &["--fairness-only", "1"],
            &["--frobnicate", "1"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn durations_round_trip() {
        for (text, d) in [
            ("10ms", Duration::from_millis(10)),
            ("1s", Duration::from_secs(1)),
            ("1500ms", Duration::from_millis(1500)),
        ] {
            assert_eq!(parse_duration("--tick", text).unwrap(), d);
            assert_eq!(format_duration(d), text);
        }
    }
}
