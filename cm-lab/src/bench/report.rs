//! The bench's Markdown report, and `--quick`'s last line.

use super::backfill::BackfillRun;
use super::fairness::{FairnessRun, Variant};
use super::lateness::{LatenessRun, Percentiles};
use super::options::format_duration;
use super::processes::{EngineRun, Shape};
use super::raw_sql::{Script, SqlRun};
use super::{Database, Options};

/// A measured throughput run: its round and its database.
pub(super) type Run = (u32, Database, Measured);

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
    /// The Citus cluster's versions and shape, with `--citus-url`.
    pub citus: Option<String>,
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

/// The rates of the runs named `name` on `database`, in round order.
fn rates(runs: &[Run], database: Database, name: &str) -> Vec<f64> {
    runs.iter()
        .filter(|(_, d, m)| *d == database && m.name() == name)
        .map(|(_, _, m)| m.rate())
        .collect()
}

/// The runs named `name` on `database`.
fn named<'a>(
    runs: &'a [Run],
    database: Database,
    name: &'a str,
) -> impl Iterator<Item = &'a Measured> {
    runs.iter()
        .filter(move |(_, d, m)| *d == database && m.name() == name)
        .map(|(_, _, m)| m)
}

/// Each round's `name` rate over its lean baseline's on the same database: the runs of one round
/// are seconds apart, so their ratio is less exposed to the machine's mood than either rate.
fn ratios_to_lean(runs: &[Run], database: Database, name: &str) -> Vec<f64> {
    let in_round = |round: u32, name: &str| {
        runs.iter()
            .find(|(r, d, m)| *r == round && *d == database && m.name() == name)
            .map(|(_, _, m)| m.rate())
    };
    let mut rounds: Vec<u32> = runs.iter().map(|(r, _, _)| *r).collect();
    rounds.dedup();
    rounds
        .into_iter()
        .filter_map(|round| Some(in_round(round, name)? / in_round(round, database.lean().name())?))
        .collect()
}

/// The median rate of the runs named `name` on Citus over the median on plain PostgreSQL.
fn citus_over_plain(runs: &[Run], plain: &str, citus: &str) -> f64 {
    spread(rates(runs, Database::Citus, citus)).0 / spread(rates(runs, Database::Plain, plain)).0
}

/// `--quick`'s last line: the drain run's fires per second, the lean baseline's occurrences per
/// second and their ratio, each the median over the rounds; with Citus, the same there
/// (`lean_group.sql` its baseline) and its drain over plain PostgreSQL's.
pub(super) fn last_line(runs: &[Run]) -> String {
    let medians = |database: Database| {
        let (engine, _, _) = spread(rates(runs, database, Shape::Drain.name()));
        let (baseline, _, _) = spread(rates(runs, database, database.lean().name()));
        (engine, baseline)
    };
    let (engine, baseline) = medians(Database::Plain);
    let mut line = format!(
        "fires_per_sec={engine:.0} baseline_per_sec={baseline:.0} ratio={:.2}",
        engine / baseline
    );
    if runs.iter().any(|(_, d, _)| *d == Database::Citus) {
        let (citus, citus_baseline) = medians(Database::Citus);
        line += &format!(
            " citus_fires_per_sec={citus:.0} citus_baseline_per_sec={citus_baseline:.0} \
             citus_ratio={:.2} citus_over_plain={:.2}",
            citus / citus_baseline,
            citus / engine
        );
    }
    line
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
    runs: &[Run],
    lateness: &[LatenessRun],
    backfill: &BackfillRun,
    fairness: &[FairnessRun],
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
    if let Some(citus) = &facts.citus {
        println!(
            "| Citus (`--citus-url`) | {citus}; `lean_group.sql` (its schema `schema_citus.sql`: \
             {} groups of {} routines), the drain and the window run there too, in the same \
             rounds; the lateness runs on plain PostgreSQL only |",
            super::options::CITUS_SQL_GROUPS,
            super::options::CITUS_SQL_ROUTINES_PER_GROUP
        );
    }
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
    println!("| backfill | {} |", backfill_setting(options));
    println!("| fairness | {} |", fairness_setting(options));
    println!(
        "| rounds | {} (interleaved, each starting elsewhere) |",
        options.rounds
    );

    println!("\n### Throughput, every run\n");
    println!("| round | database | run | occurrences | seconds | per second | notes |");
    println!("|---|---|---|---:|---:|---:|---|");
    for (round, database, m) in runs {
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
                        "{} routines, backlog {} s (the clocks' update {:.0} ms, before the \
                         span); {drained}fires per process {}; {} claims ({:.1} fires each); \
                         ledger sound ({} rows)",
                        run.routines,
                        run.backlog,
                        run.clocks_update.as_secs_f64() * 1000.0,
                        split.join(" / "),
                        run.claims,
                        run.per_claim(),
                        run.ledger.fires
                    ),
                )
            }
        };
        println!(
            "| {round} | {} | {} | {count} | {seconds:.2} | {:.0} | {notes} |",
            database.name(),
            m.name(),
            m.rate()
        );
    }

    println!("\n### Throughput, summary\n");
    println!(
        "| database | run | median per second | min | max | ÷ lean of the same database, per \
         round: median (min–max) |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    let names = [
        Script::TwoTx.name(),
        Script::OneTx.name(),
        Script::Lean.name(),
        Script::LeanGroup.name(),
        Shape::Drain.name(),
        Shape::Window.name(),
    ];
    for database in [Database::Plain, Database::Citus] {
        for name in names {
            if named(runs, database, name).next().is_none() {
                continue;
            }
            let (median, min, max) = spread(rates(runs, database, name));
            let (r, rmin, rmax) = spread(ratios_to_lean(runs, database, name));
            println!(
                "| {} | {name} | {median:.0} | {min:.0} | {max:.0} | {r:.2} ({rmin:.2}–{rmax:.2}) |",
                database.name()
            );
        }
    }
    if runs.iter().any(|(_, d, _)| *d == Database::Citus) {
        print_citus(runs);
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
    print_backfill(backfill);
    print_fairness(fairness);
}

/// The backfill run's settings, one line.
fn backfill_setting(options: &Options) -> String {
    format!(
        "{} mission occurrences of one routine asked for at once (`routine backfill`), launched \
         at {} a second through a runtime double answering in {} ms, beside {} message routines \
         `* * * * * *` (catch-up) written to the outbox in the claim; one in-process scheduler, \
         otherwise `run`'s defaults (in-flight room {}); limit {} s",
        options.backfill_missions,
        options.backfill_rate,
        super::backfill::LAUNCH.as_millis(),
        options.backfill_routines,
        cm_domain::SchedulerConfig::DEFAULT_MAX_IN_FLIGHT,
        options.backfill_limit
    )
}

/// The backfill run's section.
fn print_backfill(run: &BackfillRun) {
    println!("\n### Lateness during a mission backfill (ms after `scheduled_at`)\n");
    println!(
        "| message fires | claimed p50 | p99 | max | missions drained in | most claimed in a \
         second | missions not `fired` | taken again |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {} | {} | {} | {:.1} s | {} | {} | {} |",
        run.message_fires,
        ms(run.claimed[0]),
        ms(run.claimed[1]),
        ms(run.claimed[2]),
        run.drain.as_secs_f64(),
        run.most_claimed_in_a_second,
        run.missions_not_fired,
        run.missions_retried
    );
}

/// The fairness runs' settings, one line.
fn fairness_setting(options: &Options) -> String {
    format!(
        "{} message routines of concurrency key `big` due once, all at one instant T, beside {} \
         message routines `* * * * * *` (catch-up) due from T, of key `small` and then of none \
         (no key has a limit); written to the outbox in the claim; one in-process scheduler at \
         `SchedulerConfig::default()` (tick {}, cap {}); limit {} s from T",
        options.fairness_big,
        super::fairness::SMALL,
        format_duration(cm_domain::SchedulerConfig::default().tick_interval),
        cm_domain::FireCap::DEFAULT.get(),
        super::fairness::LIMIT.as_secs()
    )
}

/// The fairness runs' section.
fn print_fairness(runs: &[FairnessRun]) {
    println!("\n### Fairness between concurrency keys (ms after `scheduled_at`)\n");
    println!(
        "| small tenant | big routines | drained in | small fires | claimed p50 | p99 | max | \
         p99 ÷ drain |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for run in runs {
        println!(
            "| {} | {} | {:.1} s | {} | {} | {} | {} | {:.3} |",
            run.variant.name(),
            run.big,
            run.drain.as_secs_f64(),
            run.small_fires,
            ms(run.claimed[0]),
            ms(run.claimed[1]),
            ms(run.claimed[2]),
            run.p99_over_drain()
        );
    }
    let p99 = |variant: Variant| {
        runs.iter()
            .find(|r| r.variant == variant)
            .map(|r| r.claimed[1])
    };
    if let (Some(keyed), Some(none)) = (p99(Variant::Keyed), p99(Variant::NoKey)) {
        println!(
            "\nThe small tenant's claimed p99 keyed ÷ without a key, in the same run: {:.3}.",
            keyed / none
        );
    }
    let leads: Vec<String> = runs
        .iter()
        .map(|r| format!("{:.1} s", r.lead.as_secs_f64()))
        .collect();
    let claims: Vec<String> = runs.iter().map(|r| r.claims.to_string()).collect();
    println!(
        "\n**drained in**: from T to the `claimed_at` of the burst's last fire. **small fires**: \
         the small tenant's fires scheduled from T to that claim, one a second each; their \
         `claimed_at − scheduled_at`. The ledger was checked: every big routine fired exactly \
         once, for T; every small routine once a second from T to its clock; each fire with its \
         outbox row. The clocks were committed {} before T; the burst came in {} claims.",
        leads.join(" / "),
        claims.join(" / ")
    );
}

/// The report of `--backfill-only` and `--fairness-only`: the run's facts and the sections of
/// the runs made.
pub(super) fn print_alone(
    options: &Options,
    command: &str,
    started_at: chrono::DateTime<chrono::Utc>,
    server: &str,
    backfill: Option<&BackfillRun>,
    fairness: &[FairnessRun],
) {
    let build = if cfg!(debug_assertions) {
        "debug (unoptimised: not representative)"
    } else {
        "release"
    };
    let what = match (backfill.is_some(), fairness.is_empty()) {
        (true, true) => "Backfill run",
        (false, _) => "Fairness runs",
        (true, false) => "Backfill and fairness runs",
    };
    println!("## {what} of {}\n", started_at.format("%Y-%m-%d %H:%M UTC"));
    println!("| | |\n|---|---|");
    println!("| command | `{command}` |");
    println!("| commit | {} |", super::commit());
    println!(
        "| cores (`available_parallelism`) | {} |",
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    println!("| PostgreSQL | {server} |");
    println!("| bench build | {build} |");
    if backfill.is_some() {
        println!("| backfill | {} |", backfill_setting(options));
    }
    if !fairness.is_empty() {
        println!("| fairness | {} |", fairness_setting(options));
    }
    if let Some(run) = backfill {
        print_backfill(run);
    }
    if !fairness.is_empty() {
        print_fairness(fairness);
    }
}

/// Per claim, the median over the rounds of the runs named `name` on `database`: the
/// occurrences a claim (a raw-SQL transaction) took, and the milliseconds one worker (a pgbench
/// client, a scheduler process that fired) spent a claim, `workers × seconds ÷ claims`.
fn per_claim(runs: &[Run], database: Database, name: &str) -> (f64, f64) {
    let (mut occurrences, mut millis) = (Vec::new(), Vec::new());
    for m in named(runs, database, name) {
        let (each, ms) = match m {
            Measured::Sql(_, run) => (run.batch as f64, 2000.0 / run.tps),
            Measured::Engine(_, run) => (
                run.per_claim(),
                1000.0 * run.by_process.len() as f64 * run.elapsed.as_secs_f64()
                    / run.claims as f64,
            ),
        };
        occurrences.push(each);
        millis.push(ms);
    }
    (spread(occurrences).0, spread(millis).0)
}

/// The Citus runs beside their plain PostgreSQL counterparts, and what each line measures.
fn print_citus(runs: &[Run]) {
    println!("\n### Citus beside plain PostgreSQL\n");
    println!(
        "| run | PostgreSQL per second | Citus per second | Citus ÷ PostgreSQL | PostgreSQL per \
         claim: occurrences, ms | Citus per claim: occurrences, ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let pairs = [
        (
            "lean raw SQL",
            Script::Lean.name(),
            Script::LeanGroup.name(),
        ),
        ("engine drain", Shape::Drain.name(), Shape::Drain.name()),
        ("engine window", Shape::Window.name(), Shape::Window.name()),
    ];
    for (label, plain, citus) in pairs {
        let (p, c) = (
            spread(rates(runs, Database::Plain, plain)).0,
            spread(rates(runs, Database::Citus, citus)).0,
        );
        let (p_each, p_ms) = per_claim(runs, Database::Plain, plain);
        let (c_each, c_ms) = per_claim(runs, Database::Citus, citus);
        println!(
            "| {label} | {p:.0} | {c:.0} | {:.2} | {p_each:.1}, {p_ms:.1} | {c_each:.1}, \
             {c_ms:.1} |",
            citus_over_plain(runs, plain, citus)
        );
    }
    let drain_ratio =
        |database: Database| spread(ratios_to_lean(runs, database, Shape::Drain.name())).0;
    let (p, c) = (drain_ratio(Database::Plain), drain_ratio(Database::Citus));
    println!(
        "| drain ÷ lean, per round (median) | {p:.2} | {c:.2} | {:.2} | | |",
        c / p
    );
    println!(
        "\nWhat each line measures. **lean raw SQL**: on PostgreSQL `lean.sql`, one statement a \
         batch (ledger rows inserted settled, outbox rows for the fresh ones, through a CTE) and \
         the routines advanced, over `batch` consecutive routines of the 20,000; on Citus \
         `lean_group.sql`, the same work kept in one group a transaction as cm claims there: the \
         batch is consecutive routines of one group, and its three statements (ledger rows, \
         outbox rows, routines advanced) each name the group, so each is a router statement on \
         one shard and the transaction commits on one worker without two-phase commit (the \
         one-statement CTE would go through the coordinator and commit in two phases). **engine \
         drain / window**: the same two `cm-scheduler run` processes and the same routines on \
         each database; on Citus the schema is distributed by `migrate --citus` and the \
         schedulers claim group by group (always, there), each claim one group's due routines, \
         and the clocks are put back once each process holds its share of the group leases (as \
         after a while in a deployment; they rebalance every third of `--lease`). **per \
         claim**: the occurrences a claim (a raw-SQL transaction) took, and the milliseconds a \
         worker (one of the two pgbench clients, of the scheduler processes that fired) spent a \
         claim, workers × seconds ÷ claims, everything a claim costs included (for the \
         processes, their ticks, group leases and idle waits too)."
    );
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
                claims: fired / 100,
                elapsed: Duration::from_secs(seconds),
                drained: Some(true),
                clocks_update: Duration::from_millis(40),
                by_process: vec![fired / 2, fired / 2],
                ledger: LedgerCheck::default(),
            },
        )
    }

    #[test]
    fn the_last_line_is_the_medians_and_their_ratio() {
        let plain = Database::Plain;
        let runs = vec![
            (1, plain, sql(Script::Lean, 100.0)),
            (1, plain, drain(30_000, 10)),
            (1, plain, sql(Script::TwoTx, 50.0)),
        ];
        assert_eq!(
            last_line(&runs),
            "fires_per_sec=3000 baseline_per_sec=20000 ratio=0.15"
        );
        let mut more = runs.clone();
        more.extend([
            (2, plain, drain(40_000, 10)),
            (2, plain, sql(Script::Lean, 80.0)),
        ]);
        more.extend([
            (3, plain, drain(50_000, 10)),
            (3, plain, sql(Script::Lean, 90.0)),
        ]);
        assert_eq!(
            last_line(&more),
            "fires_per_sec=4000 baseline_per_sec=18000 ratio=0.22"
        );
        // Per round: 3000/20000, 4000/16000, 5000/18000.
        let (median, min, max) = spread(ratios_to_lean(&more, plain, Shape::Drain.name()));
        assert_eq!((median, min, max), (0.25, 0.15, 5000.0 / 18000.0));
    }

    #[test]
    fn citus_runs_are_taken_against_their_own_baseline_and_set_beside_plain() {
        let (plain, citus) = (Database::Plain, Database::Citus);
        let runs = vec![
            (1, plain, sql(Script::Lean, 100.0)),
            (1, plain, drain(30_000, 10)),
            (1, citus, sql(Script::LeanGroup, 40.0)),
            (1, citus, drain(6_000, 10)),
        ];
        // The plain figures are those without Citus; Citus's drain is over `lean_group.sql`.
        assert_eq!(
            last_line(&runs),
            "fires_per_sec=3000 baseline_per_sec=20000 ratio=0.15 citus_fires_per_sec=600 \
             citus_baseline_per_sec=8000 citus_ratio=0.07 citus_over_plain=0.20"
        );
        assert_eq!(
            ratios_to_lean(&runs, citus, Shape::Drain.name()),
            [600.0 / 8000.0]
        );
        assert!(ratios_to_lean(&runs, plain, Script::LeanGroup.name()).is_empty());
        let lean = citus_over_plain(&runs, Script::Lean.name(), Script::LeanGroup.name());
        assert_eq!(lean, 0.4);
        // A raw transaction is one claim of `batch`; 2 clients at 40 tps spend 50 ms each one.
        assert_eq!(
            per_claim(&runs, citus, Script::LeanGroup.name()),
            (200.0, 50.0)
        );
        // 6,000 fires in 60 claims over 10 s: 100 a claim, 2 processes × 10 s ÷ 60 claims.
        let (each, ms) = per_claim(&runs, citus, Shape::Drain.name());
        assert_eq!(each, 100.0);
        assert!((ms - 20_000.0 / 60.0).abs() < 1e-9, "{ms}");
    }

    #[test]
    fn spread_takes_the_middle() {
        assert_eq!(spread(vec![3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(spread(vec![4.0, 1.0, 2.0, 3.0]), (2.5, 1.0, 4.0));
        assert!(spread(Vec::new()).0.is_nan());
    }
}
