//! What a run found, in one place: the ledger's, the backend's and each fault's
//! [`Findings`], the fleet's own (schedulers that died on their own, the drain, the SIGTERM
//! exits), a digest of the schedulers' logs, and the summary printed from them.

use std::path::Path;
use std::time::Duration;

use super::fleet::{SIGTERM_TIMEOUT, Termination, log_tail};
use super::ledger::Ledger;

/// How long the drain after the chaos may take: expired leases (3 s) must be reaped and retried.
pub(super) const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// What one part of the run (a fault, a backend, the ledger) reports: summary lines, and the
/// problems that fail the run.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Findings {
    pub lines: Vec<(String, String)>,
    pub problems: Vec<String>,
}

impl Findings {
    /// Findings of one summary line `label  text` and no problem.
    pub fn one(label: &str, text: String) -> Self {
        let mut f = Findings::default();
        f.line(label, text);
        f
    }

    /// Adds a summary line `label  text`.
    pub fn line(&mut self, label: &str, text: String) {
        self.lines.push((label.to_string(), text));
    }

    /// Adds a problem when `failed`.
    pub fn require(&mut self, failed: bool, problem: impl FnOnce() -> String) {
        if failed {
            self.problems.push(problem());
        }
    }
}

/// Everything a run did and found.
#[derive(Debug, Default)]
pub(super) struct Report {
    pub faults: Vec<Findings>,
    pub ledger: Ledger,
    pub backend: Findings,
    pub died_on_their_own: Vec<String>,
    pub drained_in: Option<Duration>,
    pub terminations: Vec<Termination>,
}

impl Report {
    pub fn problems(&self) -> Vec<String> {
        let mut problems = self.ledger.problems();
        problems.extend(self.backend.problems.iter().cloned());
        for f in &self.faults {
            problems.extend(f.problems.iter().cloned());
        }
        for dead in &self.died_on_their_own {
            problems.push(format!("a scheduler died without being killed: {dead}"));
        }
        if self.drained_in.is_none() {
            problems.push(format!(
                "claimed rows were still left {} s after the routines were paused",
                DRAIN_TIMEOUT.as_secs()
            ));
        }
        for t in self.terminations.iter().filter(|t| !t.ok()) {
            problems.push(format!(
                "{} did not exit 0 on SIGTERM ({}); its log ({}) ends:\n{}",
                t.instance_id,
                t.status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| format!("still running after {SIGTERM_TIMEOUT:?}")),
                t.log.display(),
                log_tail(&t.log, 8)
            ));
        }
        problems
    }

    /// Prints the summary; `head` are the run's own lines (seed, command, database).
    pub fn print(&self, head: &[(String, String)], log_dir: &Path, elapsed: Duration) {
        let show = |lines: &[(String, String)]| {
            for (label, text) in lines {
                println!("  {label:<16} {text}");
            }
        };
        println!("chaos summary");
        show(head);
        for f in &self.faults {
            show(&f.lines);
        }
        show(&self.ledger.findings().lines);
        show(&self.backend.lines);
        let exits = self
            .terminations
            .iter()
            .map(|t| match t.status {
                Some(s) => format!(
                    "{} {} in {:.1} s",
                    t.instance_id,
                    s.code().map_or_else(|| s.to_string(), |c| c.to_string()),
                    t.after.as_secs_f64()
                ),
                None => format!("{} did not exit", t.instance_id),
            })
            .collect::<Vec<_>>()
            .join(", ");
        show(&[
            (
                "drain".into(),
                self.drained_in.map_or("timed out".to_string(), |d| {
                    format!("{:.1} s", d.as_secs_f64())
                }),
            ),
            ("SIGTERM exits".into(), exits),
            (
                "died on own".into(),
                self.died_on_their_own.len().to_string(),
            ),
            ("time".into(), format!("{:.1} s", elapsed.as_secs_f64())),
            ("logs".into(), log_dir.display().to_string()),
        ]);
        println!("  in the logs:");
        for (label, n) in log_digest(log_dir) {
            println!("    {n:5}  {label}");
        }
        if !self.ledger.odd_rows.is_empty() {
            println!("  rows not fired (first 20):");
            for row in &self.ledger.odd_rows {
                println!("    {row}");
            }
        }
    }
}

/// Lines of the schedulers' logs worth counting: what crashes and outages made them do.
const LOG_MARKERS: &[(&str, &str)] = &[
    ("expired claims taken over", "took over an expired claim"),
    ("retries that found the message written", "duplicate=true"),
    ("settles fenced off", "settle matched nothing"),
    ("settle write failures", "settle failed"),
    ("dispatch errors", "dispatch failed"),
    ("dispatch timeouts", "dispatch timed out"),
    (
        "dispatches left open for the next attempt",
        "leaving it for the next attempt",
    ),
    // With `error=` after them, so the exit line's `last_error=tick failed: …` is not counted.
    ("failed ticks", "tick failed error="),
    ("failed reaper passes", "reaper pass failed error="),
    ("abandoned occurrences", "occurrence abandoned"),
    (
        "left to the reaper (no lease left)",
        "no lease left to dispatch",
    ),
    ("panics", "panicked"),
];

/// How often each marker appears in the logs under `dir`.
fn log_digest(dir: &Path) -> Vec<(&'static str, usize)> {
    let mut counts = vec![0usize; LOG_MARKERS.len()];
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines() {
            for (i, (_, needle)) in LOG_MARKERS.iter().enumerate() {
                if line.contains(needle) {
                    counts[i] += 1;
                }
            }
        }
    }
    LOG_MARKERS
        .iter()
        .zip(counts)
        .map(|((label, _), n)| (*label, n))
        .collect()
}
