//! Waiting for a state instead of sleeping, for cm's test suites: a test names what it awaits
//! (a fire row, a run ended, a process ready) and looks until it holds, for a generous time; a
//! state that comes costs only the time it takes, and one that never comes fails the test with
//! what was awaited and what was last seen.

use std::fmt::Debug;
use std::time::{Duration, Instant};

/// How long a test waits for a state before failing: generous, because the machine may be
/// busy with other builds.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// How often a wait looks again.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// Looks with `look` every 50 ms until what it sees `holds`, for at most `patience`: `Ok` with
/// what held, or `Err` with what it saw last.
pub async fn poll<T>(
    patience: Duration,
    mut look: impl AsyncFnMut() -> T,
    holds: impl Fn(&T) -> bool,
) -> Result<T, T> {
    let deadline = Instant::now() + patience;
    loop {
        let seen = look().await;
        if holds(&seen) {
            return Ok(seen);
        }
        if Instant::now() >= deadline {
            return Err(seen);
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// Waits until what `look` sees `holds`, and returns it; after `patience`, panics naming `what`
/// was awaited and what `look` saw last.
pub async fn wait_until<T: Debug>(
    what: &str,
    patience: Duration,
    look: impl AsyncFnMut() -> T,
    holds: impl Fn(&T) -> bool,
) -> T {
    poll(patience, look, holds)
        .await
        .unwrap_or_else(|last| panic!("{}", gave_up(what, patience, last)))
}

/// What a wait's failure says: what was awaited, for how long, and what was seen last.
pub fn gave_up(what: &str, patience: Duration, last: impl Debug) -> String {
    format!("waited {patience:?} for {what}; last saw {last:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_returns_what_held_or_says_what_it_saw_last() {
        let mut looks = 0;
        let seen = wait_until(
            "three looks",
            PATIENCE,
            async || {
                looks += 1;
                looks
            },
            |n| *n == 3,
        )
        .await;
        assert_eq!(seen, 3);
        let never = poll(Duration::ZERO, async || "still down", |_| false).await;
        assert_eq!(never, Err("still down"));
        assert_eq!(
            gave_up("the database", Duration::from_secs(1), "still down"),
            "waited 1s for the database; last saw \"still down\""
        );
    }
}
