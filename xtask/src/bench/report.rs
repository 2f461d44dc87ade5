//! The bench's Markdown report, and `--quick`'s last line.

use super::Options;
use super::lateness::{LatenessRun, Percentiles};
use super::options::format_duration;
use super::processes::{EngineRun, Shape};
use super::raw_sql::{Script, SqlRun};

/// What the report says about the machine, the server and the build.
#[derive(Debug, Clone)]
pub(super) struct Facts {
    /// The command as typed.
    pub command: String,
    /// `git describe`-like: the commit, and whether the tree had changes.
    pub commit: String,
    /// `available_parallelism`.
    pub cores: usize,
    /// PostgreSQL's version and the settings that decide what a commit costs.
    pub server: String,
    /// pgbench's and psql's versions.
    pub tools: String,
    /// When the bench started.
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// How long it took.
    pub wall: std::time::Duration,
}

/// One measured throughput run.
#[derive(Debug, Clone)]
pub(super) enum Measured {
    /// A raw-SQL baseline.
    Sql(Script, SqlRun),
    /// The processes.
    Engine(Shape, EngineRun),
}

impl Measured {
    /// Occurrences (fires) per second.
    pub fn rate(&self) -> f64 {
        match self {
            Measured::Sql(_, run) => run.rate(),
            Measured::Engine(_, run) => run.rate(),
        }
    }

    /// The name in the report.
    pub fn name(&self) -> &'static str {
        match self {
            Measured::Sql(script, _) => script.name(),
            Measured::Engine(shape, _) => shape.name(),
        }
    }
}

/// The median, smallest and largest of `values` (none: NaN).
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    if values.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    (median, values[0], values[n - 1])
}

/// The rates of the runs named `name`, in round order.
fn rates(runs: &[(u32, Measured)], name: &str) -> Vec<f64> {
    runs.iter()
        .filter(|(_, m)| m.name() == name)
        .map(|(_, m)| m.rate())
        .collect()
}

/// Each round's `name` rate over its lean baseline's: the runs of one round are seconds apart,
/// so their ratio is less exposed to the machine's mood than either rate.
fn ratios_to_lean(runs: &[(u32, Measured)], name: &str) -> Vec<f64> {
    let in_round = |round: u32, name: &str| {
        runs.iter()
            .find(|(r, m)| *r == round && m.name() == name)
            .map(|(_, m)| m.rate())
    };
    let mut rounds: Vec<u32> = runs.iter().map(|(r, _)| *r).collect();
    rounds.dedup();
    rounds
        .into_iter()
        .filter_map(|round| Some(in_round(round, name)? / in_round(round, Script::Lean.name())?))
        .collect()
}

/// `--quick`'s last line: the drain run's fires per second, the lean baseline's occurrences per
/// second and their ratio, each the median over the rounds.
pub(super) fn last_line(runs: &[(u32, Measured)]) -> String {
    let (engine, _, _) = spread(rates(runs, Shape::Drain.name()));
    let (baseline, _, _) = spread(rates(runs, Script::Lean.name()));
    format!(
        "fires_per_sec={engine:.0} baseline_per_sec={baseline:.0} ratio={:.2}",
        engine / baseline
    )
}

fn ms(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} s", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

fn percentile_cells(p: &Percentiles) -> String {
    format!(
        "{} | {} | {} | {} | {} | {} | {}",
        p.count,
        ms(p.claimed[0]),
        ms(p.claimed[1]),
        ms(p.claimed[2]),
        ms(p.settled[0]),
        ms(p.settled[1]),
        ms(p.settled[2])
    )
}

/// Prints the whole report to stdout.
pub(super) fn print(
    options: &Options,
    facts: &Facts,
    runs: &[(u32, Measured)],
    lateness: &[LatenessRun],
) {
    let build = if cfg!(debug_assertions) {
        "debug (unoptimised: not representative)"
    } else {
        "release"
    };
    println!(
        "## Run of {} ({})\n",
        facts.started_at.format("%Y-%m-%d %H:%M UTC"),
        if options.quick { "quick" } else { "full" }
    );
    println!("| | |\n|---|---|");
    println!("| command | `{}` |", facts.command);
    println!("| commit | {} |", facts.commit);
    println!("| cores (`available_parallelism`) | {} |", facts.cores);
    println!("| PostgreSQL | {} |", facts.server);
    println!("| client tools | {} |", facts.tools);
    println!("| bench build | {build}; `cm-scheduler` built `--release` |");
    println!("| wall time | {:.0} s |", facts.wall.as_secs_f64());
    println!(
        "| batch | {} occurrences a raw-SQL transaction (`pgbench -n -c 2 -j 2 -T {} -D batch={} \
         -D per_client={}`, schema recreated before each script); the processes' \
         `--max-fires-per-tick` |",
        options.batch,
        options.sql_seconds,
        options.batch,
        super::options::SQL_ROUTINES_PER_CLIENT
    );
    println!(
        "| processes | 2 × `cm-scheduler run {}` |",
        options.run_flags().join(" ")
    );
    println!(
        "| drain run | {} routines `* * * * * *` (catch-up), clocks put back {} s ({} owed at \
         the start), limit {} s |",
        options.drain_routines,
        options.drain_backlog,
        u64::from(options.drain_routines) * u64::from(options.drain_backlog),
        options.drain_limit
    );
    println!(
        "| window run | {} routines `* * * * * *` (catch-up), clocks put back {} s, fires counted \
         over {} s |",
        options.window_routines, options.window_backlog, options.window_seconds
    );
    println!(
        "| lateness | {} routines `* * * * * *` (catch-up), 2 in-process schedulers (own pools), \
         cap {}, {} s of claiming a run; a backend double that answers at once, or holds every \
         dispatch of one routine {} s |",
        options.lateness_routines,
        options.lateness_cap,
        options.lateness_seconds,
        options.stall_seconds
    );
    println!(
        "| rounds | {} (interleaved, each starting elsewhere) |",
        options.rounds
    );

    println!("\n### Throughput, every run\n");
    println!("| round | run | occurrences | seconds | per second | notes |");
    println!("|---|---|---:|---:|---:|---|");
    for (round, m) in runs {
        let (count, seconds, notes) = match m {
            Measured::Sql(_, run) => (
                run.transactions * run.batch as u64,
                f64::from(options.sql_seconds),
                format!("{} transactions, tps {:.1}", run.transactions, run.tps),
            ),
            Measured::Engine(_, run) => {
                let split: Vec<String> = run.by_process.iter().map(i64::to_string).collect();
                let drained = match run.drained {
                    Some(true) => "drained; ",
                    Some(false) => "NOT drained within the limit; ",
                    None => "",
                };
                (
                    u64::try_from(run.fired).unwrap_or(0),
                    run.elapsed.as_secs_f64(),
                    format!(
                        "{} routines, backlog {} s; {drained}fires per process {}; ledger sound \
                         ({} rows)",
                        run.routines,
                        run.backlog,
                        split.join(" / "),
                        run.ledger.fires
                    ),
                )
            }
        };
        println!(
            "| {round} | {} | {count} | {seconds:.2} | {:.0} | {notes} |",
            m.name(),
            m.rate()
        );
    }

    println!("\n### Throughput, summary\n");
    println!("| run | median per second | min | max | ÷ lean, per round: median (min–max) |");
    println!("|---|---:|---:|---:|---:|");
    let names = [
        Script::TwoTx.name(),
        Script::OneTx.name(),
        Script::Lean.name(),
        Shape::Drain.name(),
        Shape::Window.name(),
    ];
    for name in names {
        let (median, min, max) = spread(rates(runs, name));
        let (r, rmin, rmax) = spread(ratios_to_lean(runs, name));
        println!("| {name} | {median:.0} | {min:.0} | {max:.0} | {r:.2} ({rmin:.2}–{rmax:.2}) |");
    }

    println!("\n### Lateness (ms after `scheduled_at`)\n");
    println!(
        "| tick | stalled routine | fires (A / B) | others' fires | claimed p50 | p99 | max | \
         settled p50 | p99 | max | `SELECT now()` p50 (n) |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for l in lateness {
        let split: Vec<String> = l.by_scheduler.iter().map(i64::to_string).collect();
        println!(
            "| {} | {} | {} | {} | {:.2} ({}) |",
            format_duration(l.tick),
            if l.stall { "held" } else { "none" },
            split.join(" / "),
            percentile_cells(&l.others),
            l.ping_p50,
            l.pings
        );
    }
    println!(
        "\nThe stalled routine's own fires (each dispatch held {} s):\n",
        options.stall_seconds
    );
    println!("| tick | fires | claimed p50 | p99 | max | settled p50 | p99 | max |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for l in lateness {
        if let Some(p) = &l.stalled {
            println!("| {} | {} |", format_duration(l.tick), percentile_cells(p));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::ledger::LedgerCheck;
    use super::*;

    fn sql(script: Script, tps: f64) -> Measured {
        Measured::Sql(
            script,
            SqlRun {
                transactions: 1,
                tps,
                batch: 200,
            },
        )
    }

    fn drain(fired: i64, seconds: u64) -> Measured {
        Measured::Engine(
            Shape::Drain,
            EngineRun {
                routines: 2000,
                backlog: 10,
                fired,
                elapsed: Duration::from_secs(seconds),
                drained: Some(true),
                by_process: vec![fired / 2, fired / 2],
                ledger: LedgerCheck::default(),
            },
        )
    }

    #[test]
    fn the_last_line_is_the_medians_and_their_ratio() {
        let runs = vec![
            (1, sql(Script::Lean, 100.0)),
            (1, drain(30_000, 10)),
            (1, sql(Script::TwoTx, 50.0)),
        ];
        assert_eq!(
            last_line(&runs),
            "fires_per_sec=3000 baseline_per_sec=20000 ratio=0.15"
        );
        let mut more = runs.clone();
        more.extend([(2, drain(40_000, 10)), (2, sql(Script::Lean, 80.0))]);
        more.extend([(3, drain(50_000, 10)), (3, sql(Script::Lean, 90.0))]);
        assert_eq!(
            last_line(&more),
            "fires_per_sec=4000 baseline_per_sec=18000 ratio=0.22"
        );
        // Per round: 3000/20000, 4000/16000, 5000/18000.
        let (median, min, max) = spread(ratios_to_lean(&more, Shape::Drain.name()));
        assert_eq!((median, min, max), (0.25, 0.15, 5000.0 / 18000.0));
    }

    #[test]
    fn spread_takes_the_middle() {
        assert_eq!(spread(vec![3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(spread(vec![4.0, 1.0, 2.0, 3.0]), (2.5, 1.0, 4.0));
        assert!(spread(Vec::new()).0.is_nan());
    }
}
