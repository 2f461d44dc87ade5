//! `cm-scheduler events`: the event log, newest first, a page at a time.

use cm_domain::EventType;
use cm_scheduler::flags::EventsArgs;
use cm_store::{EventFilter, EventLog};

use super::listing::{Table, instant, print_json_lines, printable};
use super::{Failure, connect, input};

/// The columns of the listing.
const COLUMNS: &[&str] = &["SEQ", "OCCURRED", "TYPE", "ROUTINE", "DELIVERED", "DETAIL"];

/// Lists the events `args` selects; a full page ends with the cursor of the next.
pub(super) async fn list(url: &str, args: EventsArgs) -> Result<(), Failure> {
    let event_type = args
        .event_type
        .as_deref()
        .map(str::parse::<EventType>)
        .transpose()
        .map_err(|e| input(e.to_string()))?;
    let store = connect(url, false).await?;
    let routine = match args.routine.as_deref() {
        Some(reference) => Some(cm_scheduler::operations::find(&store, reference).await?.id),
        None => None,
    };
    let events = store
        .events(&EventFilter {
            routine,
            event_type,
            before_seq: args.cursor,
            limit: args.limit,
        })
        .await?;
    let next = (events.len() == args.limit as usize)
        .then(|| events.last().map(|e| e.seq))
        .flatten();
    if args.json {
        print_json_lines(&events)?;
    } else {
        let rows: Vec<Vec<String>> = events
            .iter()
            .map(|e| {
                vec![
                    e.seq.to_string(),
                    instant(e.occurred_at),
                    e.event_type.clone(),
                    printable(&e.routine_name),
                    match e.delivered_at {
                        Some(at) => instant(at),
                        None if e.delivery_attempts > 0 => {
                            format!("no ({} tries)", e.delivery_attempts)
                        }
                        None => "-".into(),
                    },
                    printable(&detail(&e.data)),
                ]
            })
            .collect();
        Table::new(COLUMNS).print_page(&rows);
    }
    match next {
        Some(next) if args.json => say!("{}", serde_json::json!({ "next_cursor": next })),
        Some(next) => say!("next page: --cursor {next}"),
        None => {}
    }
    Ok(())
}

/// An event's data in one line: `key=value` pairs, the output tail left out (it is long and
/// multi-line; `--json` has it).
fn detail(data: &serde_json::Value) -> String {
    let Some(object) = data.as_object() else {
        return String::new();
    };
    object
        .iter()
        .filter(|(key, _)| key.as_str() != "output_tail")
        .map(|(key, value)| match value {
            serde_json::Value::String(text) => format!("{key}={text}"),
            other => format!("{key}={other}"),
        })
        .collect::<Vec<_>>()
        .join("  ")
}
