//! The schedules the claim and the planning pass parse, kept by their text: a bounded cache of
//! parsed schedules keyed by (expression, zone), shared by every clone of a [`crate::PgStore`].
//!
//! A schedule's parse is bounded ([`cm_domain::rules::MAX_CHECKED_CANDIDATES`]) but not free,
//! and many routines share one text (every hour, every minute), so each text is parsed once
//! while it stays in use. What is not in the cache is parsed on a blocking thread
//! ([`tokio::task::spawn_blocking`]), never on the task that runs the scheduler's loops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cm_domain::Schedule;

/// How many parsed schedules the cache keeps; past it, the least recently used is dropped.
pub(crate) const CACHED_SCHEDULES: usize = 4096;

/// A parsed schedule, or why its text is refused (the one-line message a pause keeps).
pub(crate) type Parsed = Result<Arc<Schedule>, String>;

/// A (expression, zone) pair.
type Key = (String, String);

/// The bounded cache of parsed schedules (least recently used dropped first).
#[derive(Debug, Default)]
pub(crate) struct ScheduleCache {
    /// Each text's parse and when it was last used.
    entries: Mutex<Entries>,
}

/// The cache's contents.
#[derive(Debug, Default)]
struct Entries {
    /// Each text's parse and the use count when it was last used.
    map: HashMap<Key, (Parsed, u64)>,
    /// How many lookups there have been: the clock of "last used".
    uses: u64,
}

impl ScheduleCache {
    /// The parses of `texts` (expression, zone), each from the cache or parsed on a blocking
    /// thread, kept in the cache.
    pub(crate) async fn parse_all(&self, texts: &[(&str, &str)]) -> HashMap<Key, Parsed> {
        let mut found = HashMap::with_capacity(texts.len());
        let mut missing: Vec<Key> = Vec::new();
        {
            let mut entries = self.lock();
            for (expression, zone) in texts {
                let key = ((*expression).to_owned(), (*zone).to_owned());
                if found.contains_key(&key) || missing.contains(&key) {
                    continue;
                }
                entries.uses += 1;
                let uses = entries.uses;
                match entries.map.get_mut(&key) {
                    Some((parsed, used)) => {
                        *used = uses;
                        found.insert(key, parsed.clone());
                    }
                    None => missing.push(key),
                }
            }
        }
        if missing.is_empty() {
            return found;
        }
        let parsed = tokio::task::spawn_blocking(move || {
            missing
                .into_iter()
                .map(|(expression, zone)| {
                    let parsed = Schedule::parse(&expression, &zone)
                        .map(Arc::new)
                        .map_err(|e| e.to_string());
                    ((expression, zone), parsed)
                })
                .collect::<Vec<_>>()
        })
        .await;
        let parsed = match parsed {
            Ok(parsed) => parsed,
            // The parse panicked: no schedule can be given; the caller sees none for these texts
            // and treats them as refused.
            Err(e) => {
                tracing::error!(error = %e, "parsing schedules off the loop failed");
                Vec::new()
            }
        };
        let mut entries = self.lock();
        for (key, parsed) in parsed {
            entries.uses += 1;
            let uses = entries.uses;
            if entries.map.len() >= CACHED_SCHEDULES && !entries.map.contains_key(&key) {
                let oldest = entries
                    .map
                    .iter()
                    .min_by_key(|(_, (_, used))| *used)
                    .map(|(k, _)| k.clone());
                if let Some(oldest) = oldest {
                    entries.map.remove(&oldest);
                }
            }
            entries.map.insert(key.clone(), (parsed.clone(), uses));
            found.insert(key, parsed);
        }
        found
    }

    /// The parse of one text (see [`ScheduleCache::parse_all`]).
    pub(crate) async fn parse(&self, expression: &str, zone: &str) -> Parsed {
        self.parse_all(&[(expression, zone)])
            .await
            .remove(&(expression.to_owned(), zone.to_owned()))
            .unwrap_or_else(|| Err("its schedule could not be parsed".to_owned()))
    }

    /// How many texts the cache holds.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().map.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // A panic while the lock was held leaves only a cache: its contents are still parses.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_text_is_parsed_once_and_the_cache_stays_bounded() {
        let cache = ScheduleCache::default();
        let first = cache.parse("*/5 * * * *", "UTC").await.unwrap();
        let again = cache.parse("*/5 * * * *", "UTC").await.unwrap();
        assert!(
            Arc::ptr_eq(&first, &again),
            "the second lookup parsed again"
        );
        assert!(cache.parse("not cron", "UTC").await.is_err());
        for minute in 0..CACHED_SCHEDULES + 10 {
            let text = format!("{} * * * *", minute % 60);
            let zone = if minute < 60 { "UTC" } else { "Europe/Berlin" };
            let _ = cache
                .parse(&format!("{text} until {}", 2030 + minute), zone)
                .await;
        }
        assert!(cache.len() <= CACHED_SCHEDULES, "{}", cache.len());
    }
}
