//! The `limit` commands (concurrency limits the routines sharing a key share): what they write
//! and the lines they print, so the binary only prints them.

use cm_store::{ConcurrencyLimit, LimitStore};

use crate::failure::{Failure, input};
use crate::flags::limit::LimitCommand;
use crate::service::database::connect_migrated;

/// Runs a `limit` command against the database at `url`; the lines to print. Its key and
/// number were checked as the command line was parsed, so a refusal writes nothing.
pub async fn command(url: &str, command: LimitCommand) -> Result<Vec<String>, Failure> {
    match command {
        LimitCommand::Set { key, max_running } => {
            let store = connect_migrated(url).await?;
            let created = store.set_concurrency_limit(&key, max_running).await?;
            Ok(vec![format!(
                "limit {key}: {max_running} at once ({})",
                if created { "new" } else { "changed" }
            )])
        }
        LimitCommand::List { json } => {
            let store = connect_migrated(url).await?;
            let limits = store.list_concurrency_limits().await?;
            if json {
                let array = serde_json::to_string(&limits)
                    .map_err(|e| Failure::Other(format!("writing the limits as JSON: {e}")))?;
                return Ok(vec![array]);
            }
            Ok(table(&limits))
        }
        LimitCommand::Delete { key } => {
            let store = connect_migrated(url).await?;
            if !store.delete_concurrency_limit(&key).await? {
                return Err(input(format!(
                    "no limit is set for the concurrency key {:?}",
                    key.as_str()
                )));
            }
            Ok(vec![format!("deleted limit {key}")])
        }
    }
}

/// `limit list`'s table: a header, then a key a line (an empty list still has its header).
fn table(limits: &[ConcurrencyLimit]) -> Vec<String> {
    let width = limits
        .iter()
        .map(|l| l.key.len())
        .chain([24])
        .max()
        .unwrap_or(24);
    let row = |cells: [&str; 4]| {
        let [key, max, running, routines] = cells;
        format!("{key:<width$} {max:>7} {running:>7} {routines:>8}")
    };
    let mut lines = vec![row(["KEY", "MAX", "RUNNING", "ROUTINES"])];
    lines.extend(limits.iter().map(|l| {
        row([
            &l.key,
            &l.max_running.to_string(),
            &l.running.to_string(),
            &l.routines.to_string(),
        ])
    }));
    lines
}
