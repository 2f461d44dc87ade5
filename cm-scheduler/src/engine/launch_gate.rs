//! The launch rate's gate: no more missions reach their runtime in any second than
//! `--max-mission-launches-per-second`, and a claim takes only the missions the gate has room
//! for.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cm_store::RoutineKind;

use super::Scheduler;

/// The launch rate's gate. A launch counts from when it passes the gate until a second after its
/// runtime answered (while it is under way it always counts): so however long a launch takes to
/// reach the runtime, no more than the rate arrive there in any second. Missions claimed and not
/// yet through the gate count too, so a claim takes only what the gate has room for
/// ([`LaunchWindow::room`]) and nobody waits at the gate with a lease running for long.
#[derive(Debug, Default)]
pub(super) struct LaunchWindow {
    passed: Mutex<Passed>,
    pending: AtomicUsize,
}

/// The launches that count: each with the instant its runtime answered, `None` while under way.
#[derive(Debug, Default)]
struct Passed {
    launches: Vec<(u64, Option<Instant>)>,
    next_id: u64,
}

impl Passed {
    /// When the first launch that counts stops counting, if one has ended.
    pub(super) fn next_room(&self) -> Option<Instant> {
        self.launches
            .iter()
            .filter_map(|(_, answered)| *answered)
            .min()
            .map(|at| at + LaunchWindow::WINDOW)
    }

    fn forget(&mut self, now: Instant) {
        self.launches.retain(|(_, answered)| {
            answered.is_none_or(|at| now.duration_since(at) < LaunchWindow::WINDOW)
        });
    }
}

impl LaunchWindow {
    /// A second, and a hundredth more: whoever counts the launches at the runtime may read a
    /// coarse clock (file times come from the kernel's tick clock, up to 4 ms behind), and must
    /// still never see more than the rate in a second.
    const WINDOW: Duration = Duration::from_millis(1_010);

    /// How many more missions may be claimed now under `per_second`.
    pub(super) fn room(&self, per_second: u32, now: Instant) -> usize {
        let used = {
            let mut passed = self.passed.lock().unwrap_or_else(|e| e.into_inner());
            passed.forget(now);
            passed.launches.len()
        };
        (per_second as usize).saturating_sub(used + self.pending.load(Ordering::Acquire))
    }

    /// A claimed mission's place at the gate; it counts against the room until it is dropped.
    pub(super) fn ticket(self: &Arc<Self>, per_second: u32) -> LaunchTicket {
        self.pending.fetch_add(1, Ordering::AcqRel);
        LaunchTicket {
            window: self.clone(),
            per_second: per_second as usize,
        }
    }

    /// When the first launch that counts stops counting (room comes back), if one has ended.
    pub(super) fn next_room(&self) -> Option<Instant> {
        self.passed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .next_room()
    }
}

/// A claimed mission's place at the launch rate's gate. Dropped without [`LaunchTicket::admit`]
/// (the mission was skipped, its run could not be taken, its task ended), it gives its room back.
pub(super) struct LaunchTicket {
    window: Arc<LaunchWindow>,
    per_second: usize,
}

impl LaunchTicket {
    /// Waits until fewer than the rate count, then passes the gate: the launch counts until a
    /// second after its [`Launching`] is dropped.
    pub(super) async fn admit(self) -> Launching {
        loop {
            let wait = {
                let mut passed = self.window.passed.lock().unwrap_or_else(|e| e.into_inner());
                passed.forget(Instant::now());
                if passed.launches.len() < self.per_second {
                    let id = passed.next_id;
                    passed.next_id += 1;
                    passed.launches.push((id, None));
                    return Launching {
                        window: self.window.clone(),
                        id,
                    };
                }
                passed.next_room()
            };
            match wait {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                // Every launch that counts is still under way: look again shortly.
                None => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
}

impl Drop for LaunchTicket {
    fn drop(&mut self) {
        self.window.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A launch under way; dropped once its runtime answered.
pub(super) struct Launching {
    window: Arc<LaunchWindow>,
    id: u64,
}

impl Drop for Launching {
    fn drop(&mut self) {
        let mut passed = self.window.passed.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if let Some(entry) = passed.launches.iter_mut().find(|(id, _)| *id == self.id) {
            entry.1 = Some(now);
        }
    }
}

impl Scheduler {
    /// A place at the launch rate's gate for a mission this process launches itself.
    pub(super) fn launch_ticket(&self, kind: RoutineKind) -> Option<LaunchTicket> {
        if kind != RoutineKind::Mission || self.in_claim.mission.is_some() {
            return None;
        }
        let per_second = self.config.max_mission_launches_per_second?;
        Some(self.launches.ticket(per_second.get()))
    }

    /// Whether the launch rate leaves no mission to launch in this second.
    pub(super) fn launch_rate_spent(&self) -> bool {
        self.in_claim.mission.is_none()
            && self
                .config
                .max_mission_launches_per_second
                .is_some_and(|per_second| self.launches.room(per_second.get(), Instant::now()) == 0)
    }
}

#[cfg(test)]
mod tests {
    use tokio::task::JoinSet;

    use super::*;

    /// However the launches are timed, the runtime sees no more than the rate in any second: each
    /// launch below notes when it reached the "runtime" (somewhere between passing the gate and
    /// its answer, as over a real connection), and no window of a second holds more than the rate.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_gate_lets_no_more_than_the_rate_reach_the_runtime_in_any_second() {
        const RATE: u32 = 8;
        let window = Arc::new(LaunchWindow::default());
        let reached = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = JoinSet::new();
        for i in 0..3 * RATE as u64 {
            // Claimed all at once, more than the rate: the gate must hold the rest back.
            let ticket = window.ticket(RATE);
            let reached = reached.clone();
            tasks.spawn(async move {
                let launching = ticket.admit().await;
                // Some launches take a while to reach the runtime, some answer slowly.
                tokio::time::sleep(Duration::from_millis(5 * (i % 4))).await;
                reached.lock().unwrap().push(Instant::now());
                tokio::time::sleep(Duration::from_millis(10 * (i % 3))).await;
                drop(launching);
            });
        }
        while tasks.join_next().await.is_some() {}
        let mut times = reached.lock().unwrap().clone();
        times.sort();
        assert_eq!(times.len(), 3 * RATE as usize);
        for (start, at) in times.iter().enumerate() {
            let within = times[start..]
                .iter()
                .take_while(|t| t.duration_since(*at) < LaunchWindow::WINDOW)
                .count();
            assert!(within <= RATE as usize, "{within} launches within a second");
        }
        // Every ticket was given back, and room comes back once the last second has passed.
        assert_eq!(window.pending.load(Ordering::Acquire), 0);
        tokio::time::sleep(LaunchWindow::WINDOW).await;
        assert_eq!(window.room(RATE, Instant::now()), RATE as usize);
    }

    /// A ticket dropped unused (a skipped mission) gives its room back at once.
    #[test]
    fn an_unused_ticket_gives_its_room_back() {
        let window = Arc::new(LaunchWindow::default());
        let ticket = window.ticket(2);
        assert_eq!(window.room(2, Instant::now()), 1);
        drop(ticket);
        assert_eq!(window.room(2, Instant::now()), 2);
    }
}
