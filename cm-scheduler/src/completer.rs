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
//! # Rows another transaction holds
//!
//! A settle skips a row another transaction holds locked (a caller's open `cm.delete_routine`,
//! say) and the ledger reports it [`SettleOutcome::Locked`]; the rest of the batch is written.
//! The completer keeps such a settle, its dispatch still waiting for the answer, and comes back
//! to it: every [`LOCKED_RETRY_EVERY`] with the next batch, and one at a time through
//! [`FireLedger::settle_waiting`], queued on the row's lock. The reaper skips a locked row
//! rather than queue on it, so when the holder lets go the queued settle takes the row first:
//! its lease may have run out meanwhile, but it is never taken over and dispatched again
//! because of the lock. If the holder deleted the routine, the settle finds the row gone.
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
use cm_store::{FireLedger, FireRef, FireSettle, SettleOutcome, StoreError};
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
    /// The failure was written, and is tried again at `at` under the routine's retry policy:
    /// the row stays `claimed` for the reaper then.
    Retrying {
        /// When the retry is due.
        at: chrono::DateTime<chrono::Utc>,
    },
    /// The settle could not be written (the database kept failing); the row stays `claimed`
    /// and the reaper retries the occurrence after its lease.
    Unwritten(String),
}

impl From<SettleOutcome> for Completed {
    fn from(outcome: SettleOutcome) -> Self {
        match outcome {
            SettleOutcome::Settled => Completed::Settled,
            SettleOutcome::Retrying { at } => Completed::Retrying { at },
            SettleOutcome::TakenOver => Completed::NotHeld,
            SettleOutcome::Gone => Completed::RoutineDeleted,
            SettleOutcome::Unwritten => Completed::Unwritten(
                "its group's settle failed (on Citus: the worker holding its shard), others \
                 in the batch were written"
                    .into(),
            ),
            SettleOutcome::Locked => Completed::Unwritten(
                "another transaction still held its row when the completer stopped".into(),
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
        let mut outcome =
            match settle_with_retries(&*self.ledger, std::slice::from_ref(&settle)).await {
                Ok(outcomes) => outcomes.into_iter().next(),
                Err(e) => return Completed::Unwritten(e.to_string()),
            };
        if outcome == Some(SettleOutcome::Locked) {
            locked_warning(&settle);
        }
        // Only this result waits for the row's holder to let go: queued on its lock.
        while outcome == Some(SettleOutcome::Locked) {
            match self.ledger.settle_waiting(&settle, LOCK_WAIT).await {
                Ok(next) => outcome = Some(next),
                Err(e) if e.is_transient() => tokio::time::sleep(LOCKED_RETRY_EVERY).await,
                Err(e) => return Completed::Unwritten(e.to_string()),
            }
        }
        outcome.map_or(
            Completed::Unwritten("no outcome returned".into()),
            Completed::from,
        )
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

/// How often the settles of rows another transaction holds are tried again with the next
/// batch (beside the one settle queued on its row's lock): often enough that the rows a holder
/// lets go together are settled at once, rarely enough to cost nothing while a caller holds
/// them for minutes.
pub const LOCKED_RETRY_EVERY: Duration = Duration::from_millis(100);

/// How long one settle queued on a row's lock waits before it is sent again: long, so the
/// settle is almost always queued when the holder lets go, and within every scheduler's
/// statement timeout (a quarter of the lease, at least 100 ms, cuts a shorter lease's wait
/// short, which only costs a round trip).
pub const LOCK_WAIT: Duration = Duration::from_secs(1);

/// Logs that a settle found its row held by another transaction and waits for it.
fn locked_warning(settle: &FireSettle) {
    warn!(routine_id = %settle.fire.occurrence.routine_id,
        scheduled_at = %settle.fire.occurrence.scheduled_at,
        "another transaction holds this occurrence's row; its settle waits until it lets go \
         (the routine's other occurrences and other routines are not held back)");
}

/// The settles whose rows another transaction held, waiting for the holders to let go, and the
/// one of them queued on its row's lock.
#[derive(Default)]
struct LockedRows {
    pending: Vec<Pending>,
    /// The settle queued on its row's lock, and its answer to come.
    waiter: Option<(
        FireRef,
        tokio::task::JoinHandle<Result<SettleOutcome, StoreError>>,
    )>,
}

impl LockedRows {
    fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The pending settles other than the one queued on its lock, taken out to be retried.
    fn take_retries(&mut self) -> Vec<Pending> {
        let waiting = self.waiter.as_ref().map(|(fire, _)| *fire);
        let (queued, retries) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(settle, _): &Pending| Some(settle.fire) == waiting);
        self.pending = queued;
        retries
    }

    /// Queues the oldest pending settle on its row's lock, unless one already is.
    fn queue_one(&mut self, ledger: &Arc<dyn FireLedger>) {
        if self.waiter.is_some() {
            return;
        }
        let Some((settle, _)) = self.pending.first() else {
            return;
        };
        let (ledger, settle) = (ledger.clone(), settle.clone());
        let fire = settle.fire;
        let task = tokio::spawn(async move { ledger.settle_waiting(&settle, LOCK_WAIT).await });
        self.waiter = Some((fire, task));
    }

    /// The queued settle's answer, once it comes (never, with none queued); `None` when its
    /// statement failed (a statement timeout, a dropped connection), to be tried again.
    async fn waited(&mut self) -> (FireRef, Option<SettleOutcome>) {
        let Some((fire, task)) = self.waiter.as_mut() else {
            return std::future::pending().await;
        };
        let fire = *fire;
        let answer = match task.await {
            Ok(Ok(outcome)) => Some(outcome),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, routine_id = %fire.occurrence.routine_id,
                    "a settle queued on a lock failed; trying again");
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, routine_id = %fire.occurrence.routine_id,
                    "a settle queued on a lock ended; trying again");
                None
            }
        };
        self.waiter = None;
        (fire, answer)
    }

    /// Answers the queued settle of `fire` if its wait ended the claim's way (settled, taken
    /// over, gone); otherwise moves it behind the others, to be queued again in turn.
    fn resolve(&mut self, fire: FireRef, answer: Option<SettleOutcome>) {
        let Some(at) = self.pending.iter().position(|(s, _)| s.fire == fire) else {
            return;
        };
        let entry = self.pending.remove(at);
        match answer {
            Some(outcome) if outcome != SettleOutcome::Locked => {
                let _ = entry.1.send(Completed::from(outcome));
            }
            _ => self.pending.push(entry),
        }
    }
}

/// The completer's loop: a batch opens with the first result that arrives, takes others for at
/// most `flush_every` or until it holds `flush_at`, and is written with the settles of locked
/// rows still waiting. Those are also tried again every [`LOCKED_RETRY_EVERY`], and at once
/// when the one queued on its lock is answered. When every handle is gone, the results still
/// queued are written, the locked rows are tried a last time, and the loop ends.
async fn write_batches(
    ledger: Arc<dyn FireLedger>,
    mut incoming: mpsc::Receiver<Pending>,
    options: BatchOptions,
) {
    let flush_at = options.flush_at.max(1);
    let mut batch: Vec<Pending> = Vec::with_capacity(flush_at);
    let mut locked = LockedRows::default();
    let mut open = true;
    while open || !locked.is_empty() {
        tokio::select! {
            first = incoming.recv(), if open => match first {
                Some(first) => batch.push(first),
                None => open = false,
            },
            (fire, answer) = locked.waited() => locked.resolve(fire, answer),
            () = tokio::time::sleep(LOCKED_RETRY_EVERY), if !locked.is_empty() => {}
        }
        if !batch.is_empty() {
            let close = tokio::time::Instant::now() + options.flush_every;
            while batch.len() < flush_at {
                match tokio::time::timeout_at(close, incoming.recv()).await {
                    Ok(Some(next)) => batch.push(next),
                    Ok(None) => {
                        open = false;
                        break;
                    }
                    // The batch's time is up: write it.
                    Err(_) => break,
                }
            }
        }
        if !open {
            // Stopping: the queued settle's wait ends within its bound; then every locked row
            // gets a last try, and those still held are reported unwritten.
            if locked.waiter.is_some() {
                let (fire, answer) = locked.waited().await;
                locked.resolve(fire, answer);
            }
            let retries = locked.take_retries();
            let retried = retries.len();
            batch.extend(retries);
            write_batch(&*ledger, std::mem::take(&mut batch), retried, &mut locked).await;
            for (_, answer) in std::mem::take(&mut locked.pending) {
                let _ = answer.send(Completed::from(SettleOutcome::Locked));
            }
            break;
        }
        let retries = locked.take_retries();
        let retried = retries.len();
        batch.extend(retries);
        write_batch(&*ledger, std::mem::take(&mut batch), retried, &mut locked).await;
        locked.queue_one(&ledger);
    }
}

/// Writes `batch`, whose last `retried` settles are those of locked rows tried again; the
/// settles whose rows are (still) locked are kept in `locked`.
async fn write_batch(
    ledger: &dyn FireLedger,
    batch: Vec<Pending>,
    retried: usize,
    locked: &mut LockedRows,
) {
    if batch.is_empty() {
        return;
    }
    let first_retry = batch.len() - retried;
    let (settles, answers): (Vec<FireSettle>, Vec<_>) = batch.into_iter().unzip();
    let outcomes: Vec<Result<SettleOutcome, Completed>> = match settle_with_retries(
        ledger, &settles,
    )
    .await
    {
        Ok(outcomes) if outcomes.len() == settles.len() => outcomes.into_iter().map(Ok).collect(),
        Ok(outcomes) => {
            let reason = format!(
                "the ledger answered {} outcomes for {} settles",
                outcomes.len(),
                settles.len()
            );
            vec![Err(Completed::Unwritten(reason)); settles.len()]
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
                        Ok(mut one) => one
                            .pop()
                            .ok_or_else(|| Completed::Unwritten("no outcome returned".into())),
                        Err(e) => Err(Completed::Unwritten(e.to_string())),
                    },
                );
            }
            outcomes
        }
        Err(e) => vec![Err(Completed::Unwritten(e.to_string())); settles.len()],
    };
    for (i, ((settle, answer), outcome)) in
        settles.into_iter().zip(answers).zip(outcomes).enumerate()
    {
        match outcome {
            Ok(SettleOutcome::Locked) => {
                // Kept, its dispatch still waiting, until the row's holder lets go.
                if i < first_retry {
                    locked_warning(&settle);
                }
                locked.pending.push((settle, answer));
            }
            // The dispatch that handed the result over may have gone (its task was aborted);
            // the row is written all the same.
            Ok(outcome) => {
                let _ = answer.send(Completed::from(outcome));
            }
            Err(completed) => {
                let _ = answer.send(completed);
            }
        }
    }
}
