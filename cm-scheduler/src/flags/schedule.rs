//! The flags that say when a routine runs, shared by `routine create`, `routine update`,
//! `schedule next` and the fields of a JSON Lines import: a rule (`--schedule`, `--every`
//! with `--offset`, `--at` or `--rrule`) and its clauses (`--except`, `--jitter`, `--start`, `--end`). They are
//! written into the schedule's text (`cm_domain::ScheduleText`), which cm-domain checks.

use chrono::{DateTime, SecondsFormat, Utc};
use clap::Args;
use cm_domain::ScheduleText;

/// When a routine runs.
#[derive(Debug, Clone, Default, Args, PartialEq, Eq)]
pub struct ScheduleFlags {
    /// A cron expression (5 fields, or 6 with seconds first), read in --timezone. It may carry
    /// its clauses too: `0 9 * * 1-5 except 0 0 25 12 * until 2027-01-01`.
    #[arg(long, value_name = "EXPR")]
    pub schedule: Option<String>,
    /// Instead of a cron line: every DURATION in absolute time (90m, 1h30m, 1d), counted from
    /// 1970-01-01T00:00:00Z plus --offset, so daylight saving moves nothing.
    #[arg(long, value_name = "DURATION", conflicts_with_all = ["schedule", "at"], allow_hyphen_values = true)]
    pub every: Option<String>,
    /// With --every: the offset from the epoch, shorter than the interval.
    #[arg(
        long,
        value_name = "DURATION",
        requires = "every",
        allow_hyphen_values = true
    )]
    pub offset: Option<String>,
    /// Instead of a cron line: once, at TIME (RFC 3339, or a wall time like 2026-12-24T15:30
    /// in --timezone). The routine is finished after it fires.
    #[arg(long, value_name = "TIME", conflicts_with_all = ["schedule", "every"])]
    pub at: Option<String>,
    /// Instead of a cron line: an RFC 5545 recurrence rule, read in --timezone from --start
    /// (its DTSTART): `FREQ=MONTHLY;BYDAY=FR;BYSETPOS=-1;BYHOUR=9;BYMINUTE=0;BYSECOND=0`. A
    /// rule that counts from its start (INTERVAL, COUNT, or a time it leaves out) without
    /// --start starts when the routine is created.
    #[arg(long, value_name = "RULE", conflicts_with_all = ["schedule", "every", "at"])]
    pub rrule: Option<String>,
    /// An occurrence matching this cron expression (read in --timezone) is not owed:
    /// `0 0 25 12 *` (minute and hour 0) drops a whole day, another five-field one the minutes
    /// it matches, a six-field one the seconds. Repeatable; `none` clears them on update.
    #[arg(long, value_name = "EXPR")]
    pub except: Vec<String>,
    /// Delay each occurrence by an offset in [0, DURATION) drawn from the routine and the
    /// occurrence (the same in every scheduler, on every retry), at most the schedule's
    /// shortest interval: a million routines at 09:00 with --jitter 5m come due spread over
    /// five minutes. The occurrence keeps its instant as its key. `none` clears it on update.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub jitter: Option<String>,
    /// Nothing is owed before TIME (RFC 3339, a wall time or a date in --timezone); `none`
    /// clears it on update.
    #[arg(long, value_name = "TIME")]
    pub start: Option<String>,
    /// Nothing is owed after TIME (RFC 3339, a wall time or a date, which means its first
    /// instant); past it the routine is finished. `none` clears it on update.
    #[arg(long, value_name = "TIME")]
    pub end: Option<String>,
}

impl ScheduleFlags {
    /// Whether any flag is given.
    pub fn any(&self) -> bool {
        *self != ScheduleFlags::default()
    }

    /// Whether a rule is given (--schedule, --every, --at or --rrule), not only clauses.
    pub fn has_rule(&self) -> bool {
        self.schedule.is_some() || self.every.is_some() || self.at.is_some() || self.rrule.is_some()
    }

    /// The schedule's text these flags give, over `current` (an update's present schedule):
    /// the rule given replaces the current rule, and a clause given replaces the current one.
    /// `None` when nothing is given and there is no current schedule to keep; an error when
    /// no rule is given and there is nothing to keep a rule from.
    pub fn text(&self, current: Option<&str>) -> Result<Option<String>, String> {
        self.text_from(current, Utc::now())
    }

    /// [`ScheduleFlags::text`], with `now` as the start of a `--rrule` that needs one and has
    /// none (`from` it, to the second).
    pub fn text_from(
        &self,
        current: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Option<String>, String> {
        if !self.any() {
            return Ok(current.map(str::to_owned));
        }
        // An offset counts an --every interval from the epoch; written beside a cron line or
        // --at it would be dropped unsaid.
        if self.offset.is_some() && self.every.is_none() {
            return Err(
                "--offset goes with --every (the offset of an interval from the epoch); \
                        a cron schedule or --at has none"
                    .into(),
            );
        }
        let mut parts = match current {
            Some(current) => ScheduleText::parse(current).map_err(|e| e.to_string())?,
            None => ScheduleText::default(),
        };
        let given_rule = match (&self.schedule, &self.every, &self.at) {
            _ if self.rrule.is_some() => {
                parts.rule = format!("@rrule {}", self.rrule.as_deref().unwrap_or_default());
                true
            }
            (Some(schedule), _, _) => {
                // A --schedule brings its own clauses; flags given beside it win over them.
                let written = ScheduleText::parse(schedule).map_err(|e| e.to_string())?;
                parts = written;
                true
            }
            (_, Some(every), _) => {
                parts.rule = match &self.offset {
                    Some(offset) => format!("@every {every} offset {offset}"),
                    None => format!("@every {every}"),
                };
                true
            }
            (_, _, Some(at)) => {
                parts.rule = format!("@at {at}");
                true
            }
            _ => false,
        };
        if !given_rule && current.is_none() {
            return Err(
                "a schedule is needed: --schedule EXPR, --every DURATION, --at TIME or --rrule \
                 RULE"
                    .into(),
            );
        }
        let cleared = |v: &str| v.eq_ignore_ascii_case("none");
        if !self.except.is_empty() {
            parts.except = self
                .except
                .iter()
                .filter(|x| !cleared(x))
                .cloned()
                .collect();
        }
        if let Some(jitter) = &self.jitter {
            parts.jitter = (!cleared(jitter)).then(|| jitter.clone());
        }
        if let Some(start) = &self.start {
            parts.from = (!cleared(start)).then(|| start.clone());
        }
        if let Some(end) = &self.end {
            parts.until = (!cleared(end)).then(|| end.clone());
        }
        if let Some(rule) = &self.rrule
            && parts.from.is_none()
            && cm_domain::rrule_needs_start(rule)
        {
            parts.from = Some(now.to_rfc3339_opts(SecondsFormat::Secs, true));
        }
        Ok(Some(parts.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_write_the_schedules_text_and_an_update_keeps_what_it_does_not_name() {
        let flags = ScheduleFlags {
            every: Some("90m".into()),
            offset: Some("15m".into()),
            except: vec!["0 0 25 12 *".into()],
            jitter: Some("5m".into()),
            end: Some("2027-01-01".into()),
            ..ScheduleFlags::default()
        };
        assert_eq!(
            flags.text(None).unwrap().unwrap(),
            "@every 90m offset 15m except 0 0 25 12 * jitter 5m until 2027-01-01"
        );
        let end = ScheduleFlags {
            end: Some("2027-02-01".into()),
            ..ScheduleFlags::default()
        };
        let current = "0 9 * * 1-5 except 0 0 25 12 * until 2027-01-01";
        assert_eq!(
            end.text(Some(current)).unwrap().unwrap(),
            "0 9 * * 1-5 except 0 0 25 12 * until 2027-02-01"
        );
        let clear = ScheduleFlags {
            end: Some("none".into()),
            except: vec!["none".into()],
            ..ScheduleFlags::default()
        };
        assert_eq!(clear.text(Some(current)).unwrap().unwrap(), "0 9 * * 1-5");
        assert_eq!(
            ScheduleFlags::default()
                .text(Some(current))
                .unwrap()
                .as_deref(),
            Some(current)
        );
        assert!(
            ScheduleFlags {
                start: Some("2027-01-01".into()),
                ..ScheduleFlags::default()
            }
            .text(None)
            .unwrap_err()
            .contains("a schedule is needed")
        );
    }

    /// `--offset` beside a cron line, beside `--at`, or alone on an update is refused, never
    /// dropped: only an `--every` interval has an offset.
    #[test]
    fn an_offset_without_every_is_refused() {
        for flags in [
            ScheduleFlags {
                schedule: Some("0 9 * * *".into()),
                offset: Some("5m".into()),
                ..ScheduleFlags::default()
            },
            ScheduleFlags {
                at: Some("2027-01-01T00:00".into()),
                offset: Some("5m".into()),
                ..ScheduleFlags::default()
            },
            ScheduleFlags {
                offset: Some("5m".into()),
                ..ScheduleFlags::default()
            },
        ] {
            for current in [None, Some("@every 1h")] {
                let refused = flags.text(current).unwrap_err();
                assert!(refused.contains("--offset goes with --every"), "{refused}");
            }
        }
    }
}
