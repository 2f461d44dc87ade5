//! The `routine` commands (create, update, import, list, show, pause, resume, delete, trigger
//! and backfill): each runs its operation ([`cm_scheduler::operations`]) and prints what it
//! returns. Every command that names a routine takes its id or its name.

use std::collections::HashMap;

use chrono::SecondsFormat;
use cm_scheduler::Failure;
use cm_scheduler::edit::{Edit, NOTHING_TO_CHANGE};
use cm_scheduler::flags::routine::{RoutineCommand, UpdateArgs};
use cm_scheduler::operations::{self, Change, Updated, import};
use cm_scheduler::service::database::connect_migrated;
use cm_store::{
    FireFilter, FireLedger, PgStore, Routine, RoutineCursor, RoutineKind, RoutineStore,
};
use uuid::Uuid;

use super::listing::{self, Table, printable};
use super::{input, parse_time};

/// How many upcoming runs, fires and pending requests `routine show` prints.
const SHOWN_RUNS: usize = 5;
const SHOWN_FIRES: u32 = 10;
const SHOWN_REQUESTS: u32 = 10;

pub(super) async fn routine(url: &str, command: RoutineCommand) -> Result<(), Failure> {
    match command {
        RoutineCommand::Create(args) => {
            // Everything about the input is checked before the database is touched, so bad
            // input writes nothing.
            let new = operations::prepare(&args)?;
            let store = connect_migrated(url).await?;
            let routine = operations::create(&store, new).await?;
            print_routine(&routine, args.json)
        }
        RoutineCommand::Update(args) => update(url, args).await,
        RoutineCommand::Import(args) if !(args.dry_run || args.sync || args.upsert) => {
            // Only new routines: checked a chunk at a time while the one before is written.
            let mut notes = Vec::new();
            let read = import::read_lines(&args, &mut notes);
            for (line, note) in notes {
                eprintln!("{}:{line}: {note}", args.file.display());
            }
            let lines = read?;
            let store = connect_migrated(url).await?;
            let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
            for (id, name) in import::create_streamed(&store, lines, progress).await? {
                say!("created  {id}  {}", printable(&name));
            }
            Ok(())
        }
        RoutineCommand::Import(args) => {
            let mut notes = Vec::new();
            let read = import::read(&args, &mut notes);
            for (line, note) in notes {
                eprintln!("{}:{line}: {note}", args.file.display());
            }
            let import = read?;
            let store = connect_migrated(url).await?;
            if args.dry_run {
                for planned in import::dry_run(&store, &import, args.upsert).await? {
                    let id = planned
                        .id
                        .map_or_else(|| "-".to_string(), |id| id.to_string());
                    say!("{}  {id}  {}", planned.action, printable(&planned.name));
                }
                eprintln!("dry run: nothing was written");
                return Ok(());
            }
            let written = match import.synced_source() {
                Some(source) => import::sync(&store, &import, source).await?,
                None => import::import(&store, &import, args.upsert).await?,
            };
            for one in written {
                say!(
                    "{}  {}  {}",
                    one.action,
                    one.routine.id,
                    printable(&one.routine.name)
                );
            }
            Ok(())
        }
        RoutineCommand::List { json } => list(url, json).await,
        RoutineCommand::Show { routine, json } => {
            let store = connect_migrated(url).await?;
            let routine = operations::find(&store, &routine).await?;
            if json {
                print_json(&routine)
            } else {
                show(&store, &routine).await
            }
        }
        RoutineCommand::Pause { routine } => {
            let store = connect_migrated(url).await?;
            let found = operations::find(&store, &routine).await?;
            print_row(&store, &operations::pause(&store, &found).await?).await
        }
        RoutineCommand::Resume { routine } => {
            let store = connect_migrated(url).await?;
            let found = operations::find(&store, &routine).await?;
            print_row(&store, &operations::resume(&store, &found).await?).await
        }
        RoutineCommand::Delete { routine } => {
            let store = connect_migrated(url).await?;
            let found = operations::find(&store, &routine).await?;
            say!("deleted {}", operations::delete(&store, &found).await?);
            Ok(())
        }
        RoutineCommand::Trigger { routine } => {
            let store = connect_migrated(url).await?;
            let found = operations::find(&store, &routine).await?;
            let at = operations::trigger(&store, &found).await?;
            say!("{}", at.to_rfc3339_opts(SecondsFormat::Micros, true));
            Ok(())
        }
        RoutineCommand::Backfill {
            routine,
            from,
            to,
            retention,
        } => {
            let (from, to) = (parse_time(&from)?, parse_time(&to)?);
            operations::check_retention(retention)?;
            let store = connect_migrated(url).await?;
            let found = operations::find(&store, &routine).await?;
            let done = operations::backfill(&store, &found, from, to, retention).await?;
            say!(
                "requested {} of {} occurrences ({} already in the ledger or requested)",
                done.requested,
                done.occurrences,
                done.occurrences - done.requested
            );
            Ok(())
        }
    }
}

/// `routine update`: every flag is checked before the database is touched, as create checks
/// them (a mission's kind stands in until the routine is read); a clause alone (`--end`) is
/// written into the routine's present schedule once it is read.
async fn update(url: &str, args: UpdateArgs) -> Result<(), Failure> {
    let early_schedule = if args.when.has_rule() {
        args.when.text(None).map_err(input)?
    } else {
        None
    };
    let mission = match &args.mission {
        Some(path) => {
            let policy = args
                .policy
                .policy(args.mission_config.as_deref())
                .map_err(input)?;
            Some(cm_store::RoutineAction {
                kind: RoutineKind::Mission,
                payload: operations::mission_payload(path, None, &policy)?,
            })
        }
        None => None,
    };
    let change = |schedule| Change {
        edit: Edit {
            name: args.name.as_deref(),
            schedule,
            timezone: args.timezone.as_deref(),
            misfire: args.misfire.as_deref(),
            message: args.message.as_deref(),
            overlap: args.overlap.as_deref(),
        },
        mission: mission.clone(),
        runs_left: args.limit_runs.map(|l| l.0),
        deadline: args.deadline.map(|d| d.0),
        retries: args.retries,
        retry_backoff: args.retry_backoff,
        overlap_field: "--overlap",
        calendar: args.calendar.calendar.as_deref(),
        on_holiday: args.calendar.on_holiday.as_deref(),
        concurrency_key: args.concurrency_key_change(),
    };
    // A clause alone is a change too: it is written into the schedule once it is read.
    if change(early_schedule.as_deref())
        .checked(RoutineKind::Mission, None)
        .map_err(input)?
        .is_none()
        && !args.when.any()
    {
        return Err(input(NOTHING_TO_CHANGE));
    }
    let store = connect_migrated(url).await?;
    let found = operations::find(&store, &args.routine).await?;
    let schedule = if args.when.any() {
        args.when.text(Some(&found.schedule)).map_err(input)?
    } else {
        None
    };
    match operations::update(&store, found, &change(schedule.as_deref())).await? {
        Updated::Changed(routine) => print_routine(&routine, args.json),
        Updated::Unchanged(_) => Err(input(NOTHING_TO_CHANGE)),
    }
}

/// One routine as its row of `routine list`.
async fn print_row(store: &PgStore, routine: &Routine) -> Result<(), Failure> {
    let last = last_fires(store, &[routine.id]).await?;
    let mut table = Table::new(listing::ROUTINE_COLUMNS);
    table.print_page(&[listing::routine_row(routine, last.get(&routine.id))]);
    Ok(())
}

/// The newest fire of each of `ids`, by routine.
async fn last_fires(
    store: &PgStore,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, cm_store::RecentFire>, Failure> {
    let mut last = HashMap::with_capacity(ids.len());
    for chunk in ids.chunks(cm_store::status::MAX_PAGE as usize) {
        last.extend(cm_store::StatusReader::last_fires(store, chunk).await?);
    }
    Ok(last)
}

fn print_routine(routine: &Routine, json: bool) -> Result<(), Failure> {
    if json {
        print_json(routine)
    } else {
        say!("{}", routine.id);
        Ok(())
    }
}

/// One routine as one line of JSON, as `routine list --json` prints each.
fn print_json(routine: &Routine) -> Result<(), Failure> {
    listing::print_json_lines(std::slice::from_ref(routine))
}

async fn list(url: &str, json: bool) -> Result<(), Failure> {
    let store = connect_migrated(url).await?;
    let mut table = Table::new(listing::ROUTINE_COLUMNS);
    let mut after = None;
    loop {
        let page = store
            .list_routines_page(after, listing::ROUTINE_PAGE)
            .await?;
        let Some(last) = page.last() else {
            if !json {
                // No routine at all still prints the header: the listing ran and found none.
                table.print_page(&[]);
            }
            return Ok(());
        };
        after = Some(RoutineCursor::after(last));
        let ids: Vec<Uuid> = page.iter().map(|r| r.id).collect();
        let lasts = last_fires(&store, &ids).await?;
        if json {
            let lines: Vec<listing::RoutineLine<'_>> = page
                .iter()
                .map(|r| listing::RoutineLine::new(r, lasts.get(&r.id)))
                .collect();
            listing::print_json_lines(&lines)?;
        } else {
            let rows: Vec<Vec<String>> = page
                .iter()
                .map(|r| listing::routine_row(r, lasts.get(&r.id)))
                .collect();
            table.print_page(&rows);
        }
        if page.len() < listing::ROUTINE_PAGE as usize {
            return Ok(());
        }
    }
}

/// `routine show`: settings (no payload beyond the message text or the mission's repository),
/// the next runs in the routine's zone and in UTC, pending requests and the last fires.
async fn show(store: &PgStore, routine: &Routine) -> Result<(), Failure> {
    let schedule = cm_store::CalendarStore::routine_schedule(store, routine).await?;
    let zone = schedule.zone().tz();
    say!("id          {}", routine.id);
    say!("name        {}", printable(&routine.name));
    say!("kind        {}", routine.kind);
    match routine.kind {
        RoutineKind::Message => say!(
            "message     {}",
            printable(routine.payload["text"].as_str().unwrap_or(""))
        ),
        RoutineKind::Mission => say!(
            "repository  {}",
            printable(routine.payload["repository"].as_str().unwrap_or(""))
        ),
    }
    say!("schedule    {}", printable(&routine.schedule));
    let words = routine.schedule_words().unwrap_or_default();
    say!("reads       {}", printable(&words));
    say!("timezone    {}", routine.timezone);
    say!("misfire     {}", routine.misfire_policy);
    if routine.kind == RoutineKind::Mission {
        say!("overlap     {}", routine.overlap);
    }
    say!("state       {}", listing::state(routine));
    if let Some(left) = routine.runs_left {
        say!("runs left   {left}");
    }
    if let Some(calendar) = &routine.calendar {
        say!(
            "calendar    {calendar} (on holiday: {})",
            routine.on_holiday
        );
    }
    if let Some(deadline) = routine.deadline {
        say!(
            "deadline    {} after each occurrence",
            humantime::format_duration(deadline)
        );
    }
    if routine.retry.retries > 0 {
        say!(
            "retries     {}, backoff {}",
            routine.retry.retries,
            routine.retry.backoff
        );
    }
    if let Some(key) = &routine.concurrency_key {
        let limits = cm_store::LimitStore::list_concurrency_limits(store).await?;
        match limits.iter().find(|l| l.key == key.as_str()) {
            Some(limit) => say!(
                "concurrency {key}: at most {} at once ({} running)",
                limit.max_running,
                limit.running
            ),
            None => say!("concurrency {key}: no limit set (unlimited)"),
        }
    }
    let skips = cm_store::EventLog::skips(store, routine.id, routine.group_id).await?;
    say!("skipped     {}", listing::skips(&skips));
    if let Some(jitter) = schedule.jitter() {
        say!(
            "jitter      up to {} after each occurrence",
            cm_domain::duration_text(chrono::TimeDelta::from_std(jitter).unwrap_or_default())
        );
    }
    if let Some(start) = schedule.start() {
        say!("starts      {}", listing::instant(start));
    }
    if let Some(end) = schedule.end() {
        say!("ends        {}", listing::instant(end));
    }
    if let Some(source) = &routine.source {
        say!("source      {}", printable(source));
    }
    say!("created     {}", listing::instant(routine.created_at));
    say!("updated     {}", listing::instant(routine.updated_at));
    say!(
        "last run    {}",
        routine.last_run_at.map_or("never".into(), listing::instant)
    );
    let last = last_fires(store, &[routine.id]).await?;
    match last.get(&routine.id) {
        Some(fire) => say!(
            "last fire   {} at {}{}",
            listing::last_outcome(Some(fire)),
            listing::instant(fire.scheduled_at),
            fire.error
                .as_deref()
                .map(|e| format!(": {}", printable(e)))
                .unwrap_or_default()
        ),
        None => say!("last fire   never"),
    }

    say!("");
    match routine.next_run_at {
        None if routine.paused => say!("next runs: none while paused"),
        None if routine.is_finished(chrono::Utc::now()) => {
            say!("next runs: none (finished: the schedule has no more occurrences)")
        }
        None => say!("next runs: none yet (the routine is not planned yet)"),
        Some(first) => {
            // When each run comes due, a jitter applied; with one, its occurrence (the key
            // its fire is recorded under) beside it.
            let runs: Vec<_> = schedule
                .runs_from_clock(routine.id, first)
                .take(SHOWN_RUNS)
                .collect();
            let jittered = schedule.moves_occurrences();
            let (mut table, local) = if jittered {
                (
                    Table::new(&["NEXT RUNS (LOCAL)", "UTC", "OCCURRENCE (UTC)"]),
                    "%Y-%m-%d %H:%M:%S%.3f %Z",
                )
            } else {
                (
                    Table::new(&["NEXT RUNS (LOCAL)", "UTC"]),
                    "%Y-%m-%d %H:%M:%S %Z",
                )
            };
            let rows: Vec<Vec<String>> = runs
                .iter()
                .map(|(occurrence, planned)| {
                    let mut row = vec![
                        planned.with_timezone(&zone).format(local).to_string(),
                        planned.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
                    ];
                    if jittered {
                        row.push(listing::instant(*occurrence));
                    }
                    row
                })
                .collect();
            table.print_page(&rows);
        }
    }

    let requests = store.pending_requests(routine.id, SHOWN_REQUESTS).await?;
    say!("");
    if requests.total == 0 {
        say!("pending requests: none");
    } else {
        let mut table = Table::new(&["PENDING REQUESTS", "OCCURRENCE (UTC)", "REQUESTED AT (UTC)"]);
        let rows: Vec<Vec<String>> = requests
            .oldest
            .iter()
            .map(|r| {
                vec![
                    if r.is_trigger() {
                        "trigger"
                    } else {
                        "backfill"
                    }
                    .into(),
                    listing::instant(r.scheduled_at),
                    listing::instant(r.requested_at),
                ]
            })
            .collect();
        table.print_page(&rows);
        let more = requests.total - requests.oldest.len() as u64;
        if more > 0 {
            say!("… and {more} more");
        }
    }

    let fires = store
        .list_fires(&FireFilter {
            routine_id: Some(routine.id),
            limit: SHOWN_FIRES,
            ..FireFilter::default()
        })
        .await?;
    say!("");
    if fires.is_empty() {
        say!("last fires: none");
    } else {
        let mut table = Table::new(listing::ROUTINE_FIRE_COLUMNS);
        let rows: Vec<Vec<String>> = fires.iter().map(listing::routine_fire_row).collect();
        table.print_page(&rows);
    }
    Ok(())
}
