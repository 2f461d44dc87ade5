//! The `calendar` commands (holiday calendars routines share) and `schedule next` on a
//! calendar: what they write and the lines they print, so the binary only prints them.

use std::sync::Arc;

use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use cm_domain::calendar::{self, Calendar, OnHoliday};
use cm_domain::{Schedule, Zone};
use cm_store::{CalendarStore, PgStore, StoredCalendar};
use uuid::Uuid;

use crate::failure::{Failure, input};
use crate::flags::calendar::{CalendarCommand, CalendarFlags, DateFlags};
use crate::service::database::connect_migrated;

/// The most bytes a file of dates may have.
const DATES_FILE: u64 = 1024 * 1024;

/// The dates `flags` give, each checked (`YYYY-MM-DD`), in the order given; a file's lines
/// after theirs.
pub fn dates(flags: &DateFlags) -> Result<Vec<NaiveDate>, Failure> {
    let mut dates = flags
        .dates
        .iter()
        .map(|d| calendar::parse_date(d).map_err(|e| input(format!("--date: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(path) = &flags.file {
        let shown = path.display();
        let text = crate::bounded::open_regular(path)
            .and_then(|file| crate::bounded::read_to(file, DATES_FILE))
            .map_err(|e| input(format!("cannot read the dates file {shown}: {e}")))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let date = line.split_whitespace().next().unwrap_or_default();
            dates.push(
                calendar::parse_date(date).map_err(|e| input(format!("{shown}:{}: {e}", n + 1)))?,
            );
        }
    }
    Ok(dates)
}

/// Runs a `calendar` command against the database at `url`; the lines to print.
pub async fn command(url: &str, command: CalendarCommand) -> Result<Vec<String>, Failure> {
    // Every input is checked before the database is touched: a refusal writes nothing.
    let checked_name =
        |name: &str| calendar::check_calendar_name(name).map_err(|e| input(e.to_string()));
    match command {
        CalendarCommand::Create {
            name,
            timezone,
            dates: given,
            days_off,
        } => {
            checked_name(&name)?;
            let zone = Zone::parse(&timezone).map_err(|e| input(e.to_string()))?;
            let days = calendar::parse_days_off(&days_off)
                .map_err(|e| input(format!("--days-off: {e}")))?;
            let calendar =
                Calendar::new(zone, dates(&given)?, &days).map_err(|e| input(e.to_string()))?;
            let store = connect_migrated(url).await?;
            let stored = store.create_calendar(&name, &calendar).await?;
            Ok(vec![stored.name])
        }
        CalendarCommand::AddDates { name, dates: given } => {
            edit_dates(url, &name, &given, true).await
        }
        CalendarCommand::RemoveDates { name, dates: given } => {
            edit_dates(url, &name, &given, false).await
        }
        CalendarCommand::Show { name, json } => {
            checked_name(&name)?;
            let store = connect_migrated(url).await?;
            let stored = store.get_calendar(&name).await?;
            Ok(if json {
                vec![calendar_json(&stored).to_string()]
            } else {
                shown(&stored)
            })
        }
        CalendarCommand::List { json } => {
            let store = connect_migrated(url).await?;
            let all = store.list_calendars().await?;
            if json {
                return Ok(all.iter().map(|c| calendar_json(c).to_string()).collect());
            }
            let mut lines = vec![format!(
                "{:<24} {:<24} {:<16} {:>6} {:>9}",
                "NAME", "TIMEZONE", "DAYS OFF", "DATES", "ROUTINES"
            )];
            lines.extend(all.iter().map(|c| {
                format!(
                    "{:<24} {:<24} {:<16} {:>6} {:>9}",
                    c.name,
                    c.calendar.zone().name(),
                    calendar::days_off_text(&c.calendar.days_off()),
                    c.calendar.dates().count(),
                    c.routines
                )
            }));
            Ok(lines)
        }
        CalendarCommand::Delete { name } => {
            checked_name(&name)?;
            let store = connect_migrated(url).await?;
            store.delete_calendar(&name).await?;
            Ok(vec![format!("deleted calendar {name}")])
        }
    }
}

/// `calendar add-dates` (`add`) or `remove-dates`: the calendar's dates changed and its routines
/// planned again, in one transaction; the line to print.
pub async fn edit_dates(
    url: &str,
    name: &str,
    given: &DateFlags,
    add: bool,
) -> Result<Vec<String>, Failure> {
    calendar::check_calendar_name(name).map_err(|e| input(e.to_string()))?;
    let list = dates(given)?;
    if list.is_empty() {
        return Err(input(
            "give the dates: --date YYYY-MM-DD (repeated) or --file FILE",
        ));
    }
    let store = connect_migrated(url).await?;
    let edit = store.edit_calendar_dates(name, &list, add).await?;
    Ok(vec![format!(
        "{name}: {} date(s) {}, {} routine(s) planned again",
        edit.changed,
        if add { "added" } else { "removed" },
        edit.replanned
    )])
}

/// A calendar as `calendar show` prints it.
fn shown(stored: &StoredCalendar) -> Vec<String> {
    let c = &stored.calendar;
    let mut lines = vec![
        format!("name        {}", stored.name),
        format!("timezone    {}", c.zone()),
        format!("days off    {}", calendar::days_off_text(&c.days_off())),
        format!("routines    {}", stored.routines),
        format!("dates       {}", c.dates().count()),
    ];
    lines.extend(c.dates().map(|d| format!("  {d} {}", d.format("%a"))));
    lines
}

/// A calendar as JSON.
fn calendar_json(stored: &StoredCalendar) -> serde_json::Value {
    let c = &stored.calendar;
    serde_json::json!({
        "name": stored.name,
        "timezone": c.zone().name(),
        "days_off": calendar::days_off_text(&c.days_off()),
        "dates": c.dates().map(|d| d.to_string()).collect::<Vec<_>>(),
        "routines": stored.routines,
        "created_at": stored.created_at,
        "updated_at": stored.updated_at,
    })
}

/// What `schedule next` prints for a schedule on a calendar.
#[derive(Debug, Clone, Copy)]
pub struct NextOnCalendar<'a> {
    /// The calendar, from the database.
    pub calendar: &'a CalendarFlags,
    /// Dates off given inline (`--holiday`), a calendar in the schedule's zone.
    pub holidays: &'a [String],
    /// The weekly days off of the inline calendar.
    pub days_off: Option<&'a str>,
}

impl NextOnCalendar<'_> {
    /// Whether a calendar is given at all.
    pub fn any(&self) -> bool {
        self.calendar.calendar.is_some() || !self.holidays.is_empty()
    }
}

/// What `schedule next` prints: a note for stderr, and its lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NextRuns {
    /// A note on what the lines are, for standard error.
    pub note: Option<String>,
    /// One run a line.
    pub lines: Vec<String>,
}

/// `schedule next`, being put together: the schedule `expr` in `timezone`, after `after`, on a
/// calendar when `on` gives one.
#[derive(Debug, Clone)]
#[must_use = "nothing is computed until awaited with `.await`"]
pub struct ScheduleNext<'a> {
    url: &'a str,
    expr: &'a str,
    timezone: &'a str,
    on: NextOnCalendar<'a>,
    after: DateTime<Utc>,
    count: usize,
    routine: Option<Uuid>,
}

/// `schedule next` for `expr` in `timezone` after `after` (five runs unless
/// [`ScheduleNext::count`] says otherwise); a calendar by name is read from the database at
/// `url`.
pub fn schedule_next<'a>(
    url: &'a str,
    expr: &'a str,
    timezone: &'a str,
    on: NextOnCalendar<'a>,
    after: DateTime<Utc>,
) -> ScheduleNext<'a> {
    ScheduleNext {
        url,
        expr,
        timezone,
        on,
        after,
        count: 5,
        routine: None,
    }
}

impl ScheduleNext<'_> {
    /// How many runs to print.
    pub fn count(mut self, count: usize) -> Self {
        self.count = count;
        self
    }

    /// The routine whose runs to print (a jitter's offsets are the routine's).
    pub fn routine(mut self, routine: Option<Uuid>) -> Self {
        self.routine = routine;
        self
    }

    /// The runs: on a calendar, each the instant it is planned at, and for a moved one its
    /// occurrence beside it; with a jitter and a routine, each run's instant and occurrence;
    /// else the occurrences (a jitter's noted on stderr).
    pub async fn run(self) -> Result<NextRuns, Failure> {
        let schedule =
            Schedule::parse(self.expr, self.timezone).map_err(|e| input(e.to_string()))?;
        if self.on.any() || self.on.calendar.on_holiday.is_some() {
            let schedule = on_calendar(self.url, schedule, self.on).await?;
            let routine = self.routine.unwrap_or(Uuid::nil());
            return Ok(NextRuns {
                note: None,
                lines: next_lines(&schedule, self.after, self.count, routine),
            });
        }
        let mut at = self.after;
        let mut lines = Vec::new();
        if let (Some(routine), Some(_)) = (self.routine, schedule.jitter()) {
            // The routine's runs as its clock would be set now: the first occurrence after `at`.
            for _ in 0..self.count {
                let Some((occurrence, planned)) = schedule.next_planned_after(routine, at) else {
                    break;
                };
                lines.push(format!(
                    "{}  occurrence {}",
                    planned.to_rfc3339_opts(SecondsFormat::Millis, true),
                    occurrence.to_rfc3339_opts(SecondsFormat::Secs, true)
                ));
                at = occurrence;
            }
            return Ok(NextRuns { note: None, lines });
        }
        let note = schedule.jitter().map(|jitter| {
            format!(
                "the occurrences; each routine's run comes up to {} after its occurrence \
                 (--routine-id UUID prints one routine's)",
                cm_domain::duration_text(chrono::TimeDelta::from_std(jitter).unwrap_or_default())
            )
        });
        lines.extend(
            schedule
                .occurrences_after(at)
                .take(self.count)
                .map(|next| next.to_rfc3339_opts(SecondsFormat::Secs, true)),
        );
        Ok(NextRuns { note, lines })
    }
}

impl<'a> std::future::IntoFuture for ScheduleNext<'a> {
    type Output = Result<NextRuns, Failure>;
    type IntoFuture =
        std::pin::Pin<Box<dyn std::future::Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// `schedule` on the calendar `on` gives: by name from the database at `url`, or inline.
async fn on_calendar(
    url: &str,
    schedule: Schedule,
    on: NextOnCalendar<'_>,
) -> Result<Schedule, Failure> {
    let policy = match on.calendar.on_holiday.as_deref() {
        Some(p) => p
            .parse::<OnHoliday>()
            .map_err(|e| input(format!("--on-holiday: {e}")))?,
        None => OnHoliday::Skip,
    };
    let calendar = if on.holidays.is_empty() {
        let Some(name) = on.calendar.calendar.as_deref() else {
            return Err(input(
                "--on-holiday goes with --calendar NAME or --holiday DATE",
            ));
        };
        calendar::check_calendar_name(name).map_err(|e| input(e.to_string()))?;
        let store: PgStore = connect_migrated(url).await?;
        store.get_calendar(name).await?.calendar
    } else {
        let dates = on
            .holidays
            .iter()
            .map(|d| calendar::parse_date(d).map_err(|e| input(format!("--holiday: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let days = match on.days_off {
            Some(days) => {
                calendar::parse_days_off(days).map_err(|e| input(format!("--days-off: {e}")))?
            }
            None => Calendar::DEFAULT_DAYS_OFF.to_vec(),
        };
        Calendar::new(schedule.zone(), dates, &days).map_err(|e| input(e.to_string()))?
    };
    schedule
        .with_calendar(Arc::new(calendar), policy)
        .map_err(|e| input(e.to_string()))
}

/// `count` runs of `schedule` for `routine` after `after`, as a routine's clock would be set
/// then: each the instant it is planned at, and for a moved one its occurrence beside it.
pub fn next_lines(
    schedule: &Schedule,
    after: DateTime<Utc>,
    count: usize,
    routine: Uuid,
) -> Vec<String> {
    let Some((_, clock)) = schedule.next_planned_after(routine, after) else {
        return Vec::new();
    };
    schedule
        .runs_from_clock(routine, clock)
        .take(count)
        .map(|(occurrence, planned)| {
            let at = planned.to_rfc3339_opts(SecondsFormat::Secs, true);
            if planned == occurrence {
                at
            } else {
                format!(
                    "{at}  occurrence {}",
                    occurrence.to_rfc3339_opts(SecondsFormat::Secs, true)
                )
            }
        })
        .collect()
}
