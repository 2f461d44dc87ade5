//! `cm-scheduler outbox`: what the message outbox holds that no consumer has acknowledged.

use cm_scheduler::flags::OutboxArgs;
use cm_store::OutboxConsumer;

use super::{Failure, connect};

/// Prints the pending count, the oldest pending message's age, and a listing.
pub(super) async fn show(url: &str, args: OutboxArgs) -> Result<(), Failure> {
    let store = connect(url, false).await?;
    let backlog = store.outbox_backlog(args.limit).await?;
    if args.json {
        say!(
            "{}",
            serde_json::to_string(&backlog).map_err(|e| Failure::Other(e.to_string()))?
        );
        return Ok(());
    }
    let secs = chrono::SecondsFormat::Secs;
    say!(
        "pending {}  leased {}  oldest {}",
        backlog.pending,
        backlog.leased,
        backlog
            .oldest
            .map(|t| t.to_rfc3339_opts(secs, true))
            .unwrap_or_else(|| "-".into())
    );
    for pending in &backlog.messages {
        let m = &pending.message;
        let holder = match (&pending.leased_by, pending.lease_expires_at) {
            (Some(consumer), Some(until)) => {
                format!(
                    "  leased by {consumer} until {}",
                    until.to_rfc3339_opts(secs, true)
                )
            }
            _ => String::new(),
        };
        say!(
            "{:>8}  {}  {}  attempt {}  deliveries {}{holder}",
            m.seq,
            m.scheduled_at.to_rfc3339_opts(secs, true),
            m.routine_id,
            m.attempt,
            pending.deliveries,
        );
    }
    Ok(())
}
