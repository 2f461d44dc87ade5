//! Trying a runtime's call again within a dispatch's deadline, as the container backends do.
//!
//! A refusal (an answer trying again cannot change) ends at once; any other failure is tried
//! again after a pause that doubles from [`FIRST_BACKOFF`] up to [`MAX_BACKOFF`], until the next
//! pause would end past the deadline. Each backend says which of its errors are refusals and
//! how they read.

use std::time::Duration;

use tokio::time::Instant;

/// The first pause between tries of a failing call; it doubles up to [`MAX_BACKOFF`].
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest pause between tries.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How a call tried until its deadline failed.
pub(crate) enum Retried<E> {
    /// The answer was a refusal: not tried again.
    Refused(E),
    /// The deadline came first; the last failure, if a try ended before it.
    PastDeadline(Option<E>),
}

/// Runs `call` until it succeeds, fails with an error `is_refusal` calls a refusal, or the
/// deadline passes.
pub(crate) async fn until_deadline<T, E, F, Fut>(
    deadline: Instant,
    is_refusal: impl Fn(&E) -> bool,
    mut call: F,
) -> Result<T, Retried<E>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut backoff = FIRST_BACKOFF;
    let mut last = None;
    loop {
        let error = match tokio::time::timeout_at(deadline, call()).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(e)) => e,
            Err(_) => return Err(Retried::PastDeadline(last)),
        };
        if is_refusal(&error) {
            return Err(Retried::Refused(error));
        }
        last = Some(error);
        if Instant::now() + backoff >= deadline {
            return Err(Retried::PastDeadline(last));
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
