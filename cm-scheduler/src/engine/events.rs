//! The event loop beside the ticks: every second it raises the missed deadlines of the groups
//! this scheduler maintains, then delivers the events of the groups it holds to the
//! operator's sink, each at least once, a routine's in the order they were written.
//!
//! Delivery is by the group's holder alone, so two schedulers do not both post an event
//! (while a lease moves, one may be posted twice, under the same id: a receiver deduplicates
//! by `webhook-id`). An event is marked delivered once the sink took it; a failed post is
//! noted on the event with when to try again (exponential, up to [`MAX_BACKOFF`]), and the
//! routine's later events wait behind it. A sink that is down delays events, never ticks: the
//! loop is its own task.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use cm_store::{EventLog, GroupId, RoutineEvent, StoreError};
use tokio::sync::watch;
use tracing::{debug, warn};
use uuid::Uuid;

use super::Scheduler;
use crate::counters::add;

/// How often the loop runs: a missed deadline is raised within about this long of it.
pub const EVENT_PASS: Duration = Duration::from_secs(1);

/// The longest wait between two posts of one event.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How many of a group's undelivered events one pass reads.
const PENDING_BATCH: u32 = 200;

/// Where events go: a Standard Webhooks endpoint, a NATS subject.
#[async_trait]
pub trait EventSink: Send + Sync {
    /// Posts `event` once; the error says why it was not taken (it is tried again later).
    async fn deliver(&self, event: &RoutineEvent) -> Result<(), String>;

    /// The sink for logs, without secrets.
    fn describe(&self) -> String;
}

/// The body's `data` of an event as every sink sends it: the event's own fields beside the
/// routine and the instant of the change.
pub fn event_data(event: &RoutineEvent) -> serde_json::Value {
    let mut data = serde_json::json!({
        "event_id": event.id,
        "routine_id": event.routine_id,
        "routine_name": event.routine_name,
        "occurred_at": event.occurred_at,
    });
    if let (Some(object), Some(extra)) = (data.as_object_mut(), event.data.as_object()) {
        for (key, value) in extra {
            object.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
    data
}

/// Events posted to a Standard Webhooks endpoint: `webhook-id` is the event's id, the body
/// `{"type", "timestamp", "data"}`.
pub struct WebhookEventSink {
    webhook: cm_dispatch::webhook::WebhookDispatcher,
}

impl WebhookEventSink {
    /// Posts to `webhook`'s endpoint, signed with its secret.
    pub fn new(webhook: cm_dispatch::webhook::WebhookDispatcher) -> Self {
        WebhookEventSink { webhook }
    }
}

#[async_trait]
impl EventSink for WebhookEventSink {
    async fn deliver(&self, event: &RoutineEvent) -> Result<(), String> {
        self.webhook
            .post(
                &event.id.to_string(),
                &event.event_type,
                event_data(event),
                Duration::from_secs(10),
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn describe(&self) -> String {
        self.webhook.shown_url()
    }
}

/// The event log and the sink the loop delivers to.
pub(super) struct EventWatch {
    pub(super) log: Arc<dyn EventLog>,
    sink: Option<Arc<dyn EventSink>>,
    /// The groups with a routine that has a deadline, and when they were read.
    deadlines: std::sync::Mutex<Option<(tokio::time::Instant, Arc<HashSet<GroupId>>)>>,
}

impl EventWatch {
    pub(super) fn new(log: Arc<dyn EventLog>, sink: Option<Arc<dyn EventSink>>) -> Self {
        EventWatch {
            log,
            sink,
            deadlines: std::sync::Mutex::new(None),
        }
    }

    /// The groups with a routine that has a deadline, read again once [`DEADLINES_READ`] has
    /// passed (on Citus the statement reads every shard, so not every second).
    async fn deadline_groups(&self) -> Result<Arc<HashSet<GroupId>>, StoreError> {
        let now = tokio::time::Instant::now();
        if let Ok(cached) = self.deadlines.lock()
            && let Some((read, groups)) = cached.as_ref()
            && now.duration_since(*read) < DEADLINES_READ
        {
            return Ok(groups.clone());
        }
        let groups = Arc::new(self.log.deadline_groups().await?.into_iter().collect());
        if let Ok(mut cached) = self.deadlines.lock() {
            *cached = Some((now, Arc::clone(&groups)));
        }
        Ok(groups)
    }
}

/// How long the groups with deadlines are known before they are read again: a routine given
/// its first deadline in a group is watched at most this long after.
pub const DEADLINES_READ: Duration = Duration::from_secs(10);

/// The wait before the post after `attempts` failed ones: 1 s doubling, up to [`MAX_BACKOFF`].
fn backoff(attempts: i32) -> Duration {
    let doublings = u32::try_from(attempts.clamp(0, 16)).unwrap_or(16);
    Duration::from_secs(1)
        .saturating_mul(2u32.saturating_pow(doublings))
        .min(MAX_BACKOFF)
}

impl Scheduler {
    /// The event loop (see the module): a pass every [`EVENT_PASS`] until `stopped`.
    pub(super) async fn event_loop(&self, mut stopped: watch::Receiver<bool>) {
        let Some(watch) = &self.events else {
            return;
        };
        let mut interval = tokio::time::interval(EVENT_PASS);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                _ = stopped.changed() => return,
            }
            self.event_pass(watch).await;
        }
    }

    /// One pass: deadlines, then delivery. Each reads first, in one statement, which groups
    /// have anything for it (a routine with a deadline, an event to deliver), and works only
    /// in those of its groups: on Citus a group is a shard, and most have neither.
    pub(super) async fn event_pass(&self, watch: &EventWatch) {
        match watch.deadline_groups().await {
            Ok(groups) if groups.is_empty() => {}
            Ok(with_deadlines) => {
                self.maintain("raising missed deadlines", |group| {
                    let watched = group.is_none_or(|g| with_deadlines.contains(&g));
                    async move {
                        if watched {
                            self.raise_missed_deadlines(watch, group).await?;
                        }
                        Ok(())
                    }
                })
                .await;
            }
            Err(e) => warn!(error = %e, "cannot read which routines have deadlines"),
        }
        let Some(sink) = &watch.sink else {
            return;
        };
        let held = self.groups.as_ref().map(|leases| leases.held());
        if held.as_ref().is_some_and(Vec::is_empty) {
            return;
        }
        let pending = match watch.log.pending_groups(held.as_deref()).await {
            Ok(pending) => pending,
            Err(e) => {
                warn!(error = %e, "cannot read which groups have events to deliver");
                return;
            }
        };
        let groups: Vec<Option<GroupId>> = match held {
            Some(_) => pending.into_iter().map(Some).collect(),
            None if pending.is_empty() => Vec::new(),
            None => vec![None],
        };
        for group in groups {
            if let Err(e) = self.deliver_group(watch, sink.as_ref(), group).await {
                warn!(error = %e, ?group, "event delivery failed; it goes on next pass");
            }
        }
    }

    /// Raises the missed deadlines of `group` (every group: `None`), counting and logging each.
    async fn raise_missed_deadlines(
        &self,
        watch: &EventWatch,
        group: Option<GroupId>,
    ) -> Result<(), StoreError> {
        let raised = watch.log.raise_missed_deadlines(group).await?;
        add(&self.stats.deadlines_missed, raised.len() as u64);
        for event in &raised {
            warn!(routine = %event.routine_name, routine_id = %event.routine_id,
                scheduled_at = ?event.scheduled_at, state = %event.data["state"],
                "deadline missed: the occurrence had not succeeded by its deadline");
        }
        Ok(())
    }

    /// Delivers the undelivered events of `group` (every group: `None`) that are due, in
    /// order, none of a routine's while an earlier one of it waits.
    async fn deliver_group(
        &self,
        watch: &EventWatch,
        sink: &dyn EventSink,
        group: Option<GroupId>,
    ) -> Result<(), StoreError> {
        let pending = watch.log.pending_events(group, PENDING_BATCH).await?;
        let mut waiting: HashSet<Uuid> = HashSet::new();
        let now = Utc::now();
        for event in pending {
            if waiting.contains(&event.routine_id) {
                continue;
            }
            if event.retry_at.is_some_and(|at| at > now) {
                waiting.insert(event.routine_id);
                continue;
            }
            match sink.deliver(&event).await {
                Ok(()) => {
                    watch
                        .log
                        .mark_delivered(&[(event.group_id, event.seq)])
                        .await?;
                    add(&self.stats.events_delivered, 1);
                    debug!(event = %event.id, event_type = %event.event_type,
                        routine = %event.routine_name, "event delivered");
                }
                Err(error) => {
                    waiting.insert(event.routine_id);
                    add(&self.stats.event_delivery_failures, 1);
                    let wait = backoff(event.delivery_attempts);
                    let retry_at = Utc::now()
                        + chrono::TimeDelta::from_std(wait).unwrap_or(chrono::TimeDelta::MAX);
                    warn!(event = %event.id, event_type = %event.event_type,
                        sink = %sink.describe(), %error, retry_in = ?wait,
                        "event not delivered; it is tried again");
                    watch
                        .log
                        .mark_delivery_failed((event.group_id, event.seq), &error, retry_at)
                        .await?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_a_second_up_to_its_cap() {
        assert_eq!(backoff(0), Duration::from_secs(1));
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(5), Duration::from_secs(32));
        assert_eq!(backoff(9), MAX_BACKOFF);
        assert_eq!(backoff(i32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn the_data_sent_names_the_routine_beside_the_events_own_fields() {
        let event = RoutineEvent {
            seq: 7,
            id: Uuid::nil(),
            group_id: 0,
            routine_id: Uuid::nil(),
            routine_name: "nightly".into(),
            event_type: "routine.failed".into(),
            scheduled_at: None,
            occurred_at: Utc::now(),
            data: serde_json::json!({"error": "exit code 3", "routine_name": "not this"}),
            delivered_at: None,
            delivery_attempts: 0,
            retry_at: None,
            delivery_error: None,
        };
        let data = event_data(&event);
        assert_eq!(data["routine_name"], "nightly");
        assert_eq!(data["error"], "exit code 3");
        assert_eq!(data["event_id"], Uuid::nil().to_string());
    }
}
