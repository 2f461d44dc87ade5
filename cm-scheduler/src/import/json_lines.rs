//! JSON Lines imports: one JSON object a line, with the fields of `routine create`.

use std::io::BufRead;
use std::path::PathBuf;

use serde::Deserialize;

use super::{LineError, RoutineFields};
use crate::bounded;
use crate::flags::schedule::ScheduleFlags;

/// A line of a JSON Lines import: the fields of `routine create`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonLine {
    name: String,
    /// A cron expression (with its clauses, if any); or `every` (with `offset`), `at` or
    /// `rrule`.
    #[serde(default)]
    schedule: Option<String>,
    #[serde(default)]
    every: Option<String>,
    #[serde(default)]
    offset: Option<String>,
    #[serde(default)]
    at: Option<String>,
    /// An RFC 5545 recurrence rule, as `--rrule`.
    #[serde(default)]
    rrule: Option<String>,
    /// Exclusions: cron expressions, as `routine create --except`.
    #[serde(default)]
    except: Vec<String>,
    /// As `--jitter`.
    #[serde(default)]
    jitter: Option<String>,
    #[serde(default)]
    start: Option<String>,
    #[serde(default)]
    end: Option<String>,
    #[serde(default = "utc")]
    timezone: String,
    #[serde(default = "fire_once")]
    misfire: String,
    #[serde(default)]
    message: Option<String>,
    /// A mission file, relative to the import's mission root (the import file's directory or
    /// `--mission-root`); read there by `routine import`.
    #[serde(default)]
    mission: Option<PathBuf>,
    /// What an occurrence does while an earlier run of the mission is still running.
    #[serde(default)]
    overlap: Option<String>,
    #[serde(default)]
    paused: bool,
    /// A run limit, as `routine create --limit-runs` (set when the routine is created).
    #[serde(default)]
    limit_runs: Option<u32>,
    /// The holiday calendar it runs on, as `--calendar`.
    #[serde(default)]
    calendar: Option<String>,
    /// As `--on-holiday`: skip, next or previous.
    #[serde(default)]
    on_holiday: Option<String>,
    /// A deadline, as `routine create --deadline` (`90s`, `5m`).
    #[serde(default)]
    deadline: Option<String>,
    /// How many times a failed outcome is tried again, as `routine create --retries`.
    #[serde(default)]
    retries: u32,
    /// The backoff between retries, as `routine create --retry-backoff` (`10s..10m`, `30s`).
    #[serde(default)]
    retry_backoff: Option<String>,
    /// The concurrency key whose limit it shares, as `routine create --concurrency-key`.
    #[serde(default)]
    concurrency_key: Option<String>,
}

fn utc() -> String {
    "UTC".into()
}

fn fire_once() -> String {
    "fire-once".into()
}

/// Reads JSON Lines: one JSON object a line; blank lines are skipped. A `mission` path is kept
/// as written, to be read inside the import's mission root.
pub fn json_lines(text: impl BufRead) -> Result<Vec<RoutineFields>, LineError> {
    let mut routines = Vec::new();
    for read in bounded::lines(text, bounded::IMPORT_LINE) {
        let (line, raw) = read?;
        let raw = raw.as_str();
        if raw.trim().is_empty() {
            continue;
        }
        let parsed: JsonLine = serde_json::from_str(raw).map_err(|e| {
            // serde's column is within the line; its line is always 1.
            let what = e.to_string();
            let what = what.split(" at line ").next().unwrap_or(&what).to_string();
            (line, format!("not a routine: {what}"))
        })?;
        let rules = [&parsed.schedule, &parsed.every, &parsed.at, &parsed.rrule];
        if rules.iter().filter(|r| r.is_some()).count() > 1 {
            return Err((
                line,
                "give one of schedule, every, at and rrule".to_string(),
            ));
        }
        if parsed.offset.is_some() && parsed.every.is_none() {
            return Err((line, "offset needs every".to_string()));
        }
        let when = ScheduleFlags {
            schedule: parsed.schedule,
            every: parsed.every,
            offset: parsed.offset,
            at: parsed.at,
            rrule: parsed.rrule,
            except: parsed.except,
            jitter: parsed.jitter,
            start: parsed.start,
            end: parsed.end,
        };
        let schedule = when
            .text(None)
            .map_err(|e| (line, e.replace("--", "")))?
            .unwrap_or_default();
        let deadline = parsed
            .deadline
            .as_deref()
            .map(crate::flags::duration)
            .transpose()
            .map_err(|e| (line, format!("deadline: {e}")))?;
        let backoff = parsed
            .retry_backoff
            .as_deref()
            .map(str::parse::<cm_domain::Backoff>)
            .transpose()
            .map_err(|e| (line, format!("retry_backoff: {e}")))?
            .unwrap_or_default();
        let concurrency_key = parsed
            .concurrency_key
            .as_deref()
            .map(crate::edit::concurrency_key)
            .transpose()
            .map_err(|e| (line, format!("concurrency_key: {e}")))?;
        routines.push(RoutineFields {
            line,
            name: parsed.name,
            schedule,
            timezone: parsed.timezone,
            misfire: parsed.misfire,
            message: parsed.message,
            mission: parsed.mission,
            overlap: parsed.overlap,
            paused: parsed.paused,
            runs_left: parsed.limit_runs,
            calendar: parsed.calendar,
            on_holiday: parsed.on_holiday,
            deadline,
            retry: cm_domain::RetryPolicy {
                retries: parsed.retries,
                backoff,
            },
            concurrency_key,
        });
    }
    Ok(routines)
}
