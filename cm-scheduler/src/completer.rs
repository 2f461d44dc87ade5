//! Completers: how the ends of dispatches are written to the ledger.
//!
//! A dispatch that finished hands its [`FireSettle`] to a [`Completer`] and waits for the
//! [`Completed`] answer, which says whether the row was settled. Two completers sit behind the
//! one trait, so the fast one can be measured against the simple one and swapped without
//! touching callers:
//!
//! - [`InlineCompleter`] settles each result with a statement of its own, at once.
//! - [`BatchCompleter`] gathers results for a few milliseconds (or until enough are waiting) and
//!   settles them with one fenced statement; the scheduler's loop uses it.
//!
//! Both keep the ledger's rules: each row is fenced on its claim's token and attempt, a row
//! that was taken over is reported per row, a transient database error is retried, and a
//! settle that cannot be written leaves the row `claimed`, for the reaper to retry after its
//! lease. Nothing is dropped: a [`BatchCompleter`] flushes what it holds when the last handle
//! to it goes, and [`CompleterTask::finish`] waits for that flush.
//!
//! # Example
//!
//! ```no_run
//! # async fn example(ledger: std::sync::Arc<dyn cm_store::FireLedger>, settle: cm_store::FireSettle) {
//! use cm_scheduler::completer::{BatchCompleter, BatchOptions, Completer};
//!
//! let (completer, task) = BatchCompleter::start(ledger, BatchOptions::default());
//! let completed = completer.complete(settle).await;
//! drop(completer);
//! task.finish().await; // every result handed over is written (or reported unwritten)
//! # let _ = completed; }
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use cm_store::{FireLedger, FireSettle, SettleOutcome, StoreError};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

/// What became of one result handed to a completer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completed {
    /// The row is settled as the result says.
    Settled,
    /// The row no longer carries the claim (its lease ran out and another claimant took it
    /// over) or was already settled; nothing was written.
    NotHeld,
    /// The routine was deleted, with its fires, while the dispatch ran.
    RoutineDeleted,
    /// The settle could not be written (the database kept failing); the row stays `claimed`
    /// and the reaper retries the occurrence after its lease.
    Unwritten(String),
}

impl From<SettleOutcome> for Completed {
    fn from(outcome: SettleOutcome) -> Self {
        match outcome {
            SettleOutcome::Settled => Completed::Settled,
            SettleOutcome::TakenOver => Completed::NotHeld,
            SettleOutcome::Gone => Completed::RoutineDeleted,
            SettleOutcome::Unwritten => Completed::Unwritten(
                "its group's settle failed (on Citus: the worker holding its shard), others \
                 in the batch were written"
                    .into(),
            ),
        }
    }
}

/// Writes the ends of dispatches to the ledger.
#[async_trait]
pub trait Completer: Send + Sync {
    /// Settles one claim and says what became of it.
    async fn complete(&self, settle: FireSettle) -> Completed;
}

/// How often a settle is tried before it is given up and left to the reaper.
const SETTLE_TRIES: u32 = 5;
/// The pause after the first failed try; each later one doubles (50 ms, 100, 200, 400: about
/// three quarters of a second in all, enough to ride out a dropped connection or a failover).
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Settles `settles` in one statement, retrying transient database errors.
async fn settle_with_retries(
    ledger: &dyn FireLedger,
    settles: &[FireSettle],
) -> Result<Vec<SettleOutcome>, StoreError> {
    let mut pause = FIRST_RETRY_PAUSE;
    let mut tries = 1;
    loop {
        match ledger.settle_fires(settles).await {
            Ok(outcomes) => return Ok(outcomes),
            Err(e) if e.is_transient() && tries < SETTLE_TRIES => {
                warn!(error = %e, rows = settles.len(), tries, "settle failed; retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
                tries += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Settles each result with a statement of its own, as soon as it arrives.
pub struct InlineCompleter {
    ledger: Arc<dyn FireLedger>,
}

impl InlineCompleter {
    /// A completer writing through `ledger`.
    pub fn new(ledger: Arc<dyn FireLedger>) -> Self {
        InlineCompleter { ledger }
    }
}

#[async_trait]
impl Completer for InlineCompleter {
    async fn complete(&self, settle: FireSettle) -> Completed {
        match settle_with_retries(&*self.ledger, std::slice::from_ref(&settle)).await {
            Ok(outcomes) => outcomes.into_iter().next().map_or(
                Completed::Unwritten("no outcome returned".into()),
                Completed::from,
            ),
            Err(e) => Completed::Unwritten(e.to_string()),
        }
    }
}

/// When a [`BatchCompleter`] flushes, and how much it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchOptions {
    /// The longest a result waits for others before its batch is written.
    pub flush_every: Duration,
    /// A batch this large is written at once.
    pub flush_at: usize,
    /// Results waiting beyond this make the dispatches handing them over wait too
    /// (backpressure), so a database that cannot keep up slows dispatching instead of growing
    /// memory without bound.
    pub max_backlog: usize,
}

impl BatchOptions {
    /// A result waits at most 5 ms for company: a small part of the 100 ms lateness budget a
    /// fire has, and long enough for a busy scheduler's results to share a statement.
    pub const FLUSH_EVERY: Duration = Duration::from_millis(5);
    /// 500 rows make a statement of about 60 KiB of parameters: large enough that a backlog
    /// drains in few round trips, small enough that one batch holds its row locks briefly.
    pub const FLUSH_AT: usize = 500;
    /// Ten full batches: a few seconds of a fast scheduler's results.
    pub const MAX_BACKLOG: usize = 5_000;
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            flush_every: BatchOptions::FLUSH_EVERY,
            flush_at: BatchOptions::FLUSH_AT,
            max_backlog: BatchOptions::MAX_BACKLOG,
        }
    }
}

type Pending = (FireSettle, oneshot::Sender<Completed>);

/// Gathers results and settles them many to a statement. Cloning it shares the same batches.
#[derive(Clone)]
pub struct BatchCompleter {
    results: mpsc::Sender<Pending>,
}

/// The task that writes a [`BatchCompleter`]'s batches.
pub struct CompleterTask(tokio::task::JoinHandle<()>);

impl CompleterTask {
    /// Waits until every result handed over has been written (or reported unwritten). The
    /// task ends once every [`BatchCompleter`] handle is dropped and its last batch is flushed.
    pub async fn finish(self) {
        if let Err(e) = self.0.await {
            tracing::error!(error = %e, "the completer task panicked");
        }
    }
}

impl BatchCompleter {
    /// Starts the task that writes batches through `ledger`, and returns a handle to hand it
    /// results with. Must be called inside a tokio runtime.
    pub fn start(ledger: Arc<dyn FireLedger>, options: BatchOptions) -> (Self, CompleterTask) {
        let (results, incoming) = mpsc::channel(options.max_backlog.max(1));
        let task = tokio::spawn(write_batches(ledger, incoming, options));
        (BatchCompleter { results }, CompleterTask(task))
    }
}

#[async_trait]
impl Completer for BatchCompleter {
    async fn complete(&self, settle: FireSettle) -> Completed {
        let (answer, answered) = oneshot::channel();
        if self.results.send((settle, answer)).await.is_err() {
            return Completed::Unwritten("the completer has stopped".into());
        }
        answered
            .await
            .unwrap_or_else(|_| Completed::Unwritten("the completer stopped before writing".into()))
    }
}

/// The completer's loop: a batch opens with the first result that arrives, takes others for at
/// most `flush_every` or until it holds `flush_at`, and is written. When every handle is gone,
/// the results still queued are written and the loop ends.
async fn write_batches(
    ledger: Arc<dyn FireLedger>,
    mut incoming: mpsc::Receiver<Pending>,
    options: BatchOptions,
) {
    let flush_at = options.flush_at.max(1);
    let mut batch: Vec<Pending> = Vec::with_capacity(flush_at);
    while let Some(first) = incoming.recv().await {
        batch.push(first);
        let close = tokio::time::Instant::now() + options.flush_every;
        while batch.len() < flush_at {
            match tokio::time::timeout_at(close, incoming.recv()).await {
                Ok(Some(next)) => batch.push(next),
                // Closed (every handle dropped) or the batch's time is up: write it.
                Ok(None) | Err(_) => break,
            }
        }
        write_batch(&*ledger, std::mem::take(&mut batch)).await;
    }
}

async fn write_batch(ledger: &dyn FireLedger, batch: Vec<Pending>) {
    let (settles, answers): (Vec<FireSettle>, Vec<_>) = batch.into_iter().unzip();
    let outcomes: Vec<Completed> = match settle_with_retries(ledger, &settles).await {
        Ok(outcomes) if outcomes.len() == settles.len() => {
            outcomes.into_iter().map(Completed::from).collect()
        }
        Ok(outcomes) => {
            let reason = format!(
                "the ledger answered {} outcomes for {} settles",
                outcomes.len(),
                settles.len()
            );
            vec![Completed::Unwritten(reason); settles.len()]
        }
        Err(e) if !e.is_transient() && settles.len() > 1 => {
            // A statement refused for one row (a value the database will not store) must not
            // leave the whole batch unsettled: settle the rows one by one, so only the bad one
            // stays claimed.
            warn!(error = %e, rows = settles.len(), "a settle batch was refused; settling its rows one by one");
            let mut outcomes = Vec::with_capacity(settles.len());
            for settle in &settles {
                outcomes.push(
                    match settle_with_retries(ledger, std::slice::from_ref(settle)).await {
                        Ok(mut one) => one.pop().map_or(
                            Completed::Unwritten("no outcome returned".into()),
                            Completed::from,
                        ),
                        Err(e) => Completed::Unwritten(e.to_string()),
                    },
                );
            }
            outcomes
        }
        Err(e) => vec![Completed::Unwritten(e.to_string()); settles.len()],
    };
    for (answer, outcome) in answers.into_iter().zip(outcomes) {
        // The dispatch that handed the result over may have gone (its task was aborted); the
        // row is written all the same.
        let _ = answer.send(outcome);
    }
}
