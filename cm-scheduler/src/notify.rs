//! The systemd notify protocol (`sd_notify(3)`): telling a supervisor that the scheduler is
//! ready, that its tick loop still turns, and that it is stopping.
//!
//! A supervisor that wants to hear it (systemd for a `Type=notify` unit) names a Unix datagram
//! socket in `NOTIFY_SOCKET`: a path, or an abstract name written with a leading `@`. Each
//! message is one datagram of `KEY=VALUE` lines, sent from an unbound socket; nothing is read
//! back. [`Notifier::from_env`] finds nothing to do without the variable, so the scheduler runs
//! the same under any other supervisor.
//!
//! What is sent, and when:
//!
//! - `READY=1` after the first tick that succeeded: the database answers, the schema is there
//!   and a claim went through, which is what "started" means for a scheduler. Until then
//!   systemd keeps the unit "activating", its `STATUS=` saying what it waits for.
//! - `WATCHDOG=1` when `WATCHDOG_USEC` asks for it (and `WATCHDOG_PID`, if set, is this
//!   process): sent by the tick loop itself, after every tick it finishes and, while it waits
//!   for the next one, every half of the watchdog interval. A tick that fails still ends, so
//!   it still counts: a database that is down is `/readyz`'s business, and restarting the
//!   process would not bring it back. A tick that never ends (a loop stuck on a lock, a task
//!   that never yields) stops the pings, and the supervisor restarts the process; the claims it
//!   held are taken over after their lease, as after any crash.
//! - `STATUS=…` when the loop's state changes (ticking, ticks failing), in words that carry no
//!   error text: `systemctl status` shows it to anyone, and errors can name hosts and users.
//! - `STOPPING=1` when a shutdown is asked for, before what is in flight is settled.
//!
//! Sends never block the loop (the socket is non-blocking); a send that fails is logged once
//! and the scheduler carries on: a supervisor that stopped listening cannot stop the ticks.
//!
//! ```no_run
//! # fn wire(scheduler: cm_scheduler::Scheduler) -> cm_scheduler::Scheduler {
//! match cm_scheduler::notify::Notifier::from_env() {
//!     Ok(Some(notifier)) => scheduler.with_notifier(notifier),
//!     Ok(None) => scheduler,
//!     Err(e) => {
//!         eprintln!("not telling the supervisor anything: {e}");
//!         scheduler
//!     }
//! }
//! # }
//! ```

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The variable naming the supervisor's socket.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";
/// The variable holding the watchdog interval, in microseconds.
pub const WATCHDOG_USEC: &str = "WATCHDOG_USEC";
/// The variable naming the process the watchdog is meant for.
pub const WATCHDOG_PID: &str = "WATCHDOG_PID";

/// Tells a supervisor how the scheduler is doing, over its notify socket. Cloning shares the
/// socket and what was already said.
#[derive(Clone)]
pub struct Notifier {
    inner: Arc<Inner>,
}

struct Inner {
    socket: UnixDatagram,
    address: SocketAddr,
    /// Shown in messages: the variable's value.
    shown: String,
    watchdog: Option<Duration>,
    state: Mutex<Said>,
    warned: AtomicBool,
}

/// What the supervisor was told last.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Said {
    ready: bool,
    /// Whether the last tick failed, as the last `STATUS=` said.
    failing: bool,
    stopping: bool,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("socket", &self.inner.shown)
            .field("watchdog", &self.inner.watchdog)
            .finish_non_exhaustive()
    }
}

/// Why the notify variables cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NotifyError {
    /// `NOTIFY_SOCKET` is neither an absolute path nor an `@` abstract name.
    #[error("NOTIFY_SOCKET={0:?} is neither an absolute path nor an abstract name (@name)")]
    Address(String),
    /// `WATCHDOG_USEC` is not a positive number of microseconds.
    #[error("WATCHDOG_USEC={0:?} is not a positive number of microseconds")]
    Watchdog(String),
    /// The socket to send from could not be made.
    #[error("cannot make a socket for NOTIFY_SOCKET: {0}")]
    Socket(#[source] io::Error),
}

impl Notifier {
    /// The notifier the environment asks for: `None` without `NOTIFY_SOCKET` (no supervisor
    /// listens). The watchdog is on when `WATCHDOG_USEC` is set and `WATCHDOG_PID` is unset
    /// or this process's id, as `sd_watchdog_enabled(3)` decides.
    pub fn from_env() -> Result<Option<Notifier>, NotifyError> {
        let Some(address) = std::env::var_os(NOTIFY_SOCKET).filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let address = address.to_string_lossy().into_owned();
        let for_us = std::env::var(WATCHDOG_PID)
            .ok()
            .filter(|pid| !pid.is_empty())
            .is_none_or(|pid| pid.trim() == std::process::id().to_string());
        let watchdog = match std::env::var(WATCHDOG_USEC) {
            Ok(usec) if for_us && !usec.is_empty() => Some(watchdog_interval(&usec)?),
            _ => None,
        };
        Notifier::new(&address, watchdog).map(Some)
    }

    /// A notifier sending to `address` (a path, or `@name` for an abstract socket), pinging
    /// the watchdog every half of `watchdog` when it is given.
    pub fn new(address: &str, watchdog: Option<Duration>) -> Result<Notifier, NotifyError> {
        let parsed = if let Some(name) = address.strip_prefix('@') {
            abstract_address(name.as_bytes()).map_err(NotifyError::Socket)?
        } else if address.starts_with('/') {
            SocketAddr::from_pathname(address).map_err(NotifyError::Socket)?
        } else {
            return Err(NotifyError::Address(address.to_owned()));
        };
        let socket = UnixDatagram::unbound().map_err(NotifyError::Socket)?;
        socket.set_nonblocking(true).map_err(NotifyError::Socket)?;
        Ok(Notifier {
            inner: Arc::new(Inner {
                socket,
                address: parsed,
                shown: address.to_owned(),
                watchdog,
                state: Mutex::new(Said::default()),
                warned: AtomicBool::new(false),
            }),
        })
    }

    /// The watchdog interval the supervisor enforces, if it asked for pings.
    pub fn watchdog(&self) -> Option<Duration> {
        self.inner.watchdog
    }

    /// How long the tick loop may wait before it pings the watchdog while idle: half the
    /// interval, as `sd_watchdog_enabled(3)` advises.
    pub fn ping_every(&self) -> Option<Duration> {
        self.inner.watchdog.map(|w| w / 2)
    }

    /// `WATCHDOG=1`, when the watchdog is on: the loop is alive.
    pub fn ping(&self) {
        if self.inner.watchdog.is_some() {
            self.send("WATCHDOG=1");
        }
    }

    /// `STATUS=text`: a line `systemctl status` shows.
    pub fn status(&self, text: &str) {
        // One line: a newline would start another assignment.
        self.send(&format!("STATUS={}", text.replace('\n', " ")));
    }

    /// A tick ended, `succeeded` or not: `READY=1` after the first that succeeded, a status
    /// when the loop's state changed, and a watchdog ping.
    pub fn tick_ended(&self, succeeded: bool) {
        let before = *self.said();
        let mut message = Vec::new();
        if succeeded && !before.ready && !before.stopping {
            message.push("READY=1");
        }
        if !before.stopping {
            if succeeded && (!before.ready || before.failing) {
                message.push("STATUS=ticking");
            } else if !succeeded && !before.failing {
                message.push("STATUS=ticks are failing (the log says why); retrying every tick");
            }
        }
        if self.inner.watchdog.is_some() {
            message.push("WATCHDOG=1");
        }
        {
            let mut said = self.said();
            said.ready |= succeeded;
            said.failing = !succeeded;
        }
        if !message.is_empty() {
            self.send(&message.join("\n"));
        }
    }

    /// `STOPPING=1`: a shutdown was asked for; what is in flight is settled next.
    pub fn stopping(&self) {
        let first = !std::mem::replace(&mut self.said().stopping, true);
        if first {
            self.send("STOPPING=1\nSTATUS=stopping: settling what is in flight");
        }
    }

    fn said(&self) -> std::sync::MutexGuard<'_, Said> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, message: &str) {
        if let Err(e) = self
            .inner
            .socket
            .send_to_addr(message.as_bytes(), &self.inner.address)
            && !self.inner.warned.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(socket = %self.inner.shown, error = %e,
                "cannot notify the supervisor (NOTIFY_SOCKET); carrying on, and not saying so again");
        }
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn abstract_address(name: &[u8]) -> io::Result<SocketAddr> {
    #[cfg(target_os = "android")]
    use std::os::android::net::SocketAddrExt as _;
    #[cfg(target_os = "linux")]
    use std::os::linux::net::SocketAddrExt as _;
    SocketAddr::from_abstract_name(name)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn abstract_address(_name: &[u8]) -> io::Result<SocketAddr> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract socket names exist on Linux only",
    ))
}

/// `WATCHDOG_USEC` read: a positive number of microseconds.
fn watchdog_interval(usec: &str) -> Result<Duration, NotifyError> {
    match usec.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(Duration::from_micros(n)),
        _ => Err(NotifyError::Watchdog(usec.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket the test listens on, as systemd does, and a notifier sending to it.
    fn listening(watchdog: Option<Duration>) -> (UnixDatagram, Notifier, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("cm-notify-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let notifier = Notifier::new(path.to_str().unwrap(), watchdog).unwrap();
        (listener, notifier, dir)
    }

    /// Every datagram waiting on `listener`.
    fn received(listener: &UnixDatagram) -> Vec<String> {
        let mut buf = [0u8; 4096];
        std::iter::from_fn(|| {
            listener
                .recv(&mut buf)
                .ok()
                .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
        })
        .collect()
    }

    #[test]
    fn ready_comes_with_the_first_good_tick_and_status_only_on_changes() {
        let (listener, notifier, dir) = listening(Some(Duration::from_secs(10)));
        notifier.tick_ended(false);
        notifier.tick_ended(false);
        notifier.tick_ended(true);
        notifier.tick_ended(true);
        notifier.tick_ended(false);
        notifier.tick_ended(true);
        notifier.stopping();
        notifier.stopping();
        notifier.tick_ended(true);
        let failing = "STATUS=ticks are failing (the log says why); retrying every tick";
        assert_eq!(
            received(&listener),
            [
                format!("{failing}\nWATCHDOG=1"),
                "WATCHDOG=1".into(),
                "READY=1\nSTATUS=ticking\nWATCHDOG=1".into(),
                "WATCHDOG=1".into(),
                format!("{failing}\nWATCHDOG=1"),
                "STATUS=ticking\nWATCHDOG=1".into(),
                "STOPPING=1\nSTATUS=stopping: settling what is in flight".into(),
                "WATCHDOG=1".into(),
            ]
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn without_a_watchdog_nothing_is_pinged() {
        let (listener, notifier, dir) = listening(None);
        notifier.ping();
        notifier.tick_ended(true);
        notifier.tick_ended(true);
        notifier.ping();
        assert_eq!(received(&listener), ["READY=1\nSTATUS=ticking"]);
        assert_eq!(notifier.ping_every(), None);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn abstract_names_are_reached() {
        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("cm-notify-test-{}", uuid::Uuid::new_v4());
        let listener =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        let notifier = Notifier::new(&format!("@{name}"), None).unwrap();
        notifier.status("hello\nworld");
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STATUS=hello world");
    }

    #[test]
    fn addresses_and_intervals_are_checked() {
        assert!(matches!(
            Notifier::new("relative/path", None),
            Err(NotifyError::Address(_))
        ));
        assert_eq!(
            watchdog_interval("30000000").unwrap(),
            Duration::from_secs(30)
        );
        for bad in ["", "0", "-1", "soon", "1.5"] {
            assert!(watchdog_interval(bad).is_err(), "{bad:?}");
        }
        // Nobody listening: the send fails, is logged once, and nothing panics.
        let notifier = Notifier::new("/nonexistent/cm-notify", None).unwrap();
        notifier.tick_ended(true);
        notifier.stopping();
        assert_eq!(
            notifier.ping_every(),
            None,
            "no watchdog was asked for, so none is pinged"
        );
    }
}
