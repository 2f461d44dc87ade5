//! Trying a runtime's call again within a dispatch's deadline, as the container backends do.
//!
//! A refusal (an answer trying again cannot change) ends at once; any other failure is tried
//! again after a pause that doubles from [`FIRST_BACKOFF`] up to [`MAX_BACKOFF`], until the next
//! pause would end past the deadline. Each backend says which of its errors are refusals and
//! how they read.

use std::time::Duration;

use tokio::time::Instant;

use crate::DispatchError;

/// The first pause between tries of a failing call; it doubles up to [`MAX_BACKOFF`].
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest pause between tries.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How a call tried until its deadline failed.
pub(crate) enum Retried<E> {
    /// The answer was a refusal: not tried again.
    Refused(E),
    /// The deadline came first.
    PastDeadline {
        /// The last failure, if a try ended before the deadline.
        last: Option<E>,
        /// Whether some try may have reached the target and had its effect there: a try the
        /// deadline cut short, or one that failed in a way `left_no_effect` does not vouch for
        /// (a connection reset mid-request, say).
        may_have_taken_effect: bool,
    },
}

/// Runs `call` until it succeeds, fails with an error `is_refusal` calls a refusal, or the
/// deadline passes. `left_no_effect` says of a failed try whether it certainly did nothing at
/// the target (the connection was refused, or the target answered with an error).
pub(crate) async fn until_deadline<T, E, F, Fut>(
    deadline: Instant,
    is_refusal: impl Fn(&E) -> bool,
    left_no_effect: impl Fn(&E) -> bool,
    mut call: F,
) -> Result<T, Retried<E>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut backoff = FIRST_BACKOFF;
    let mut last = None;
    let mut may_have_taken_effect = false;
    loop {
        let error = match tokio::time::timeout_at(deadline, call()).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(e)) => e,
            Err(_) => {
                return Err(Retried::PastDeadline {
                    last,
                    may_have_taken_effect: true,
                });
            }
        };
        if is_refusal(&error) {
            return Err(Retried::Refused(error));
        }
        may_have_taken_effect |= !left_no_effect(&error);
        last = Some(error);
        if Instant::now() + backoff >= deadline {
            return Err(Retried::PastDeadline {
                last,
                may_have_taken_effect,
            });
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// `e`, when the runtime did not answer in time, as a launch whose outcome is open: what the
/// launch made may exist (or does), so the next attempt must look for it rather than the
/// occurrence settle `failed`. Any other error is as it was.
pub(crate) fn unconfirmed(e: DispatchError) -> DispatchError {
    match e {
        DispatchError::Unavailable(text) => DispatchError::Unconfirmed(text),
        other => other,
    }
}

/// Whether `e` is, at its root, a connection that was never made (refused, or no socket at the
/// path): a request that never left, so it did nothing.
pub(crate) fn never_connected(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
            );
        }
        cause = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> std::io::Error {
        std::io::Error::from(std::io::ErrorKind::ConnectionRefused)
    }

    fn reset() -> std::io::Error {
        std::io::Error::from(std::io::ErrorKind::ConnectionReset)
    }

    /// Tries that were all refused a connection did nothing; one reset mid-request among them
    /// may have, and so may a try the deadline cut short.
    #[tokio::test]
    async fn only_tries_that_never_connected_are_vouched_for() {
        let deadline = Instant::now() + Duration::from_millis(300);
        let never = until_deadline(
            deadline,
            |_| false,
            |e| never_connected(e),
            || async { Err::<(), _>(refused()) },
        )
        .await;
        assert!(matches!(
            never,
            Err(Retried::PastDeadline {
                last: Some(_),
                may_have_taken_effect: false
            })
        ));

        let mut tries = 0;
        let deadline = Instant::now() + Duration::from_millis(300);
        let once_reset = until_deadline(
            deadline,
            |_| false,
            |e| never_connected(e),
            || {
                tries += 1;
                let error = if tries == 1 { reset() } else { refused() };
                async move { Err::<(), _>(error) }
            },
        )
        .await;
        assert!(matches!(
            once_reset,
            Err(Retried::PastDeadline {
                last: Some(_),
                may_have_taken_effect: true
            })
        ));

        let deadline = Instant::now() + Duration::from_millis(300);
        let cut_short = until_deadline(
            deadline,
            |_| false,
            |e| never_connected(e),
            || async { std::future::pending::<Result<(), std::io::Error>>().await },
        )
        .await;
        assert!(matches!(
            cut_short,
            Err(Retried::PastDeadline {
                last: None,
                may_have_taken_effect: true
            })
        ));
    }

    /// The cause is found however deep the error wraps it.
    #[test]
    fn a_refused_connection_is_found_under_its_wrappers() {
        #[derive(Debug, thiserror::Error)]
        #[error("client error")]
        struct Wrapper(#[source] std::io::Error);
        assert!(never_connected(&Wrapper(refused())));
        assert!(!never_connected(&Wrapper(reset())));
        assert!(!never_connected(&std::fmt::Error));
    }
}
