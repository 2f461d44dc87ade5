//! Multi-host database URLs, as libpq reads them, and following the primary when it moves.
//!
//! `postgres://cm@h1:5432,h2:5433/cm?target_session_attrs=read-write` names two servers. sqlx
//! connects to one host, so the store parses the list itself ([`DatabaseUrl`]): one set of
//! connection options per host, in the URL's order, and the attribute a host must have to be
//! used ([`TargetSessionAttrs`]).
//!
//! A store on such a URL ([`crate::PgStore::connect_with`] and the lazy constructors) uses the
//! first host that qualifies, tried in the URL's order, as libpq does. It then follows it:
//!
//! - A task checks the host in use every [`FOLLOW_INTERVAL`] (one query on one connection of
//!   its own). When the host is gone or no longer qualifies (a primary demoted to a standby is
//!   in recovery and read-only), it tries every host again in order and points the pool at the
//!   first that qualifies.
//! - Every new connection of the pool is checked for the attribute before it is used; one that
//!   does not qualify is closed, the check is run at once, and the pool opens another.
//! - Idle connections opened before a switch are closed rather than handed out, so no
//!   statement runs on the old primary after the store moved.
//! - While no host qualifies, [`crate::PgStore::failover_problem`] says why (each host and why
//!   it was refused), statements fail (no connection is handed out) and `/readyz` answers 503
//!   with that reason.
//!
//! A URL with one host and no `target_session_attrs` (or `any`) connects exactly as before: no
//! check, no task, no extra round trip. Hosts given as `host=` query parameters (libpq's
//! keyword form) are not read as a list: use the URL's authority for several hosts.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sqlx::{ConnectOptions, Connection};

use crate::StoreError;

/// How often a store on a multi-host URL checks that the host it uses still qualifies.
pub const FOLLOW_INTERVAL: Duration = Duration::from_millis(500);

/// The longest one check of one host (connecting, then one query) may take before the host
/// counts as gone.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// libpq's `target_session_attrs`: what a host must be for the store to use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TargetSessionAttrs {
    /// Any host that accepts the connection (libpq's default).
    #[default]
    Any,
    /// A host whose sessions are not read-only (`SHOW transaction_read_only` is `off`): a primary
    /// not made read-only by `default_transaction_read_only`.
    ReadWrite,
    /// A host not in recovery (`pg_is_in_recovery()` is false), whatever its
    /// `default_transaction_read_only`.
    Primary,
}

impl TargetSessionAttrs {
    /// Reads libpq's value. `read-only`, `standby` and `prefer-standby` are refused: cm writes
    /// every time it fires, so a standby cannot serve it.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "any" => Ok(TargetSessionAttrs::Any),
            "read-write" => Ok(TargetSessionAttrs::ReadWrite),
            "primary" => Ok(TargetSessionAttrs::Primary),
            "read-only" | "standby" | "prefer-standby" => Err(format!(
                "target_session_attrs={value} is not supported: cm writes to the database, so it \
                 needs read-write, primary or any"
            )),
            other => Err(format!(
                "target_session_attrs={other:?} is not one of any, read-write, primary"
            )),
        }
    }

    /// libpq's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetSessionAttrs::Any => "any",
            TargetSessionAttrs::ReadWrite => "read-write",
            TargetSessionAttrs::Primary => "primary",
        }
    }
}

impl fmt::Display for TargetSessionAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A PostgreSQL URL with one or several hosts, read as libpq reads it.
#[derive(Debug, Clone)]
pub struct DatabaseUrl {
    /// One set of options per host, in the URL's order; every other part of the URL (user,
    /// password, database, query parameters but `target_session_attrs`) is the same in each.
    pub hosts: Vec<PgConnectOptions>,
    /// What a host must be to be used.
    pub target: TargetSessionAttrs,
}

impl DatabaseUrl {
    /// Parses `url`. Hosts are separated by commas in the authority
    /// (`postgres://user:pw@h1:5432,h2,[::1]:5433/db?...`); a host without a port gets sqlx's
    /// default (`PGPORT`, else 5432). `target_session_attrs` is taken out of the query; the rest
    /// is read by sqlx for each host.
    pub fn parse(url: &str) -> Result<Self, StoreError> {
        let (hosts, target) = split_hosts(url)?;
        let hosts = hosts
            .iter()
            .map(|host| host.parse::<PgConnectOptions>().map_err(StoreError::from))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DatabaseUrl { hosts, target })
    }

    /// Whether the URL names one host and asks nothing of it: the store connects as sqlx does,
    /// with no check and no task.
    pub fn is_plain(&self) -> bool {
        self.hosts.len() == 1 && self.target == TargetSessionAttrs::Any
    }
}

/// `url` as one URL per host, in its order, each with every other part of `url` but
/// `target_session_attrs`, and that attribute. A host's URL keeps the query as written, so its
/// TLS parameters (`sslrootcert`, `sslcert`, `sslkey`) reach sqlx unchanged; sqlx's own
/// `to_url_lossy` writes a certificate file as `file: PATH`, which no connection can read.
pub(crate) fn split_hosts(url: &str) -> Result<(Vec<String>, TargetSessionAttrs), StoreError> {
    let invalid = |why: String| StoreError::InvalidUrl(why);
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| invalid("it has no scheme (postgres://)".into()))?;
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(at) => before_query.split_at(at),
        None => (before_query, ""),
    };
    let (userinfo, hostlist) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };
    let mut target = TargetSessionAttrs::Any;
    let mut kept = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("target_session_attrs", value)) => {
                target = TargetSessionAttrs::parse(value).map_err(invalid)?;
            }
            _ => kept.push(pair),
        }
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    let userinfo = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    let hosts = if hostlist.is_empty() {
        // A socket directory or host given as a query parameter.
        vec![hostlist]
    } else {
        hostlist.split(',').collect()
    };
    let hosts = hosts
        .into_iter()
        .map(|host| {
            if host.is_empty() && hostlist.contains(',') {
                return Err(invalid(format!("an empty host in {hostlist:?}")));
            }
            Ok(format!("{scheme}://{userinfo}{host}{path}{query}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((hosts, target))
}

/// `host:port` of a host's options, for messages.
pub(crate) fn label(options: &PgConnectOptions) -> String {
    format!("{}:{}", options.get_host(), options.get_port())
}

/// Whether a connection qualifies for `target`: `Err` with why not.
pub(crate) async fn qualifies(
    conn: &mut PgConnection,
    target: TargetSessionAttrs,
) -> Result<Result<(), String>, sqlx::Error> {
    if target == TargetSessionAttrs::Any {
        return Ok(Ok(()));
    }
    let (recovery, read_only): (bool, String) = crate::schema::query_as(
        "SELECT pg_is_in_recovery(), current_setting('transaction_read_only')",
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(match target {
        TargetSessionAttrs::Primary if recovery => Err("is in recovery (a standby)".into()),
        TargetSessionAttrs::ReadWrite if recovery => {
            Err("is read-only (in recovery: a standby)".into())
        }
        TargetSessionAttrs::ReadWrite if read_only == "on" => {
            Err("is read-only (default_transaction_read_only)".into())
        }
        _ => Ok(()),
    })
}

/// Connects to one host and checks it, under [`PROBE_TIMEOUT`].
async fn probe(
    options: &PgConnectOptions,
    target: TargetSessionAttrs,
) -> Result<PgConnection, String> {
    let attempt = async {
        let mut conn = options
            .connect()
            .await
            .map_err(|e| StoreError::from(e).explain())?;
        match qualifies(&mut conn, target).await {
            Ok(Ok(())) => Ok(conn),
            Ok(Err(why)) => Err(why),
            Err(e) => Err(StoreError::from(e).explain()),
        }
    };
    match tokio::time::timeout(PROBE_TIMEOUT, attempt).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "did not answer within {}s",
            PROBE_TIMEOUT.as_secs()
        )),
    }
}

/// Tries every host in order: the index and a connection of the first that qualifies, or one
/// line naming each host and why it was refused.
pub(crate) async fn resolve(
    hosts: &[PgConnectOptions],
    target: TargetSessionAttrs,
) -> Result<(usize, PgConnection), String> {
    let mut refused = Vec::new();
    for (i, host) in hosts.iter().enumerate() {
        match probe(host, target).await {
            Ok(conn) => return Ok((i, conn)),
            Err(why) => refused.push(format!("{} {why}", label(host))),
        }
    }
    Err(format!(
        "no host is usable with target_session_attrs={target}: {}",
        refused.join("; ")
    ))
}

/// Which host a pool uses, and since when.
struct Current {
    index: usize,
    /// When the pool last changed hosts or lost its host: idle connections older than this are
    /// closed instead of handed out.
    switched_at: Instant,
    /// Why no host qualifies, while none does.
    problem: Option<String>,
}

/// The state shared by a multi-host pool's hooks and the task that follows the primary.
pub(crate) struct Follower {
    hosts: Vec<PgConnectOptions>,
    target: TargetSessionAttrs,
    current: Mutex<Current>,
    /// The pool followed; taken out when the last store on it is dropped, which ends the task.
    pool: Mutex<Option<PgPool>>,
    wake: tokio::sync::Notify,
    started: std::sync::atomic::AtomicBool,
}

impl Follower {
    pub(crate) fn new(
        hosts: Vec<PgConnectOptions>,
        target: TargetSessionAttrs,
        index: usize,
    ) -> Self {
        Follower {
            hosts,
            target,
            current: Mutex::new(Current {
                index,
                switched_at: Instant::now(),
                problem: None,
            }),
            pool: Mutex::new(None),
            wake: tokio::sync::Notify::new(),
            started: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn target(&self) -> TargetSessionAttrs {
        self.target
    }

    /// The options of the host in use.
    pub(crate) fn current_options(&self) -> PgConnectOptions {
        self.hosts[self.lock().index].clone()
    }

    /// Why no host qualifies, while none does.
    pub(crate) fn problem(&self) -> Option<String> {
        self.lock().problem.clone()
    }

    /// Whether an idle connection of `age` was opened before the last switch.
    pub(crate) fn is_stale(&self, age: Duration) -> bool {
        age > self.lock().switched_at.elapsed()
    }

    /// Runs the check now (a new connection did not qualify, or a statement failed as if the
    /// primary had moved).
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Hands the pool to the follower and starts the task that follows the primary, if a Tokio
    /// runtime runs here; otherwise the first connection the pool opens starts it.
    pub(crate) fn attach(self: &Arc<Self>, pool: PgPool) {
        *self.pool.lock().unwrap_or_else(|e| e.into_inner()) = Some(pool);
        self.start();
    }

    /// Starts the task once, if a runtime runs here.
    pub(crate) fn start(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        runtime.spawn(Arc::clone(self).follow());
    }

    /// Ends the task and lets the pool go.
    pub(crate) fn detach(&self) {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.wake.notify_one();
    }

    fn pool(&self) -> Option<PgPool> {
        self.pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .filter(|p| !p.is_closed())
    }

    /// Checks the host in use every [`FOLLOW_INTERVAL`] (or when woken) on a connection of its
    /// own, and moves the pool to the first qualifying host when it no longer qualifies.
    async fn follow(self: Arc<Self>) {
        let mut probe_conn: Option<PgConnection> = None;
        loop {
            let Some(pool) = self.pool() else { break };
            let index = self.lock().index;
            let healthy = match probe_conn.as_mut() {
                Some(conn) => matches!(
                    tokio::time::timeout(PROBE_TIMEOUT, qualifies(conn, self.target)).await,
                    Ok(Ok(Ok(())))
                ),
                None => match probe(&self.hosts[index], self.target).await {
                    Ok(conn) => {
                        probe_conn = Some(conn);
                        true
                    }
                    Err(_) => false,
                },
            };
            if healthy {
                self.lock().problem = None;
            } else {
                if let Some(conn) = probe_conn.take() {
                    let _ = tokio::time::timeout(PROBE_TIMEOUT, conn.close()).await;
                }
                match resolve(&self.hosts, self.target).await {
                    Ok((found, conn)) => {
                        probe_conn = Some(conn);
                        let mut current = self.lock();
                        if found != current.index {
                            tracing::warn!(
                                from = %label(&self.hosts[current.index]),
                                to = %label(&self.hosts[found]),
                                target_session_attrs = %self.target,
                                "the database's primary moved; the store follows it"
                            );
                            pool.set_connect_options(self.hosts[found].clone());
                            current.index = found;
                            current.switched_at = Instant::now();
                        }
                        if current.problem.take().is_some() {
                            tracing::info!(host = %label(&self.hosts[found]), "a usable database host is back");
                        }
                    }
                    Err(why) => {
                        let mut current = self.lock();
                        if current.problem.is_none() {
                            tracing::warn!(reason = %why, "no database host is usable");
                            // Connections to the host that stopped qualifying are not handed
                            // out again.
                            current.switched_at = Instant::now();
                        }
                        current.problem = Some(why);
                    }
                }
            }
            drop(pool);
            // Woken early, or at the interval (without `select!`: the crate turns on no
            // `macros` feature of Tokio for its importers).
            let _ = tokio::time::timeout(FOLLOW_INTERVAL, self.wake.notified()).await;
        }
        if let Some(conn) = probe_conn {
            let _ = conn.close().await;
        }
    }
}

/// Held by every clone of a store on a followed pool: when the last one is dropped, the task
/// that follows the primary ends.
pub(crate) struct FollowGuard(pub(crate) Arc<Follower>);

impl Drop for FollowGuard {
    fn drop(&mut self) {
        self.0.detach();
    }
}

impl fmt::Debug for FollowGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Follower")
            .field("hosts", &self.0.hosts.iter().map(label).collect::<Vec<_>>())
            .field("target", &self.0.target)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(url: &str) -> Vec<String> {
        DatabaseUrl::parse(url)
            .unwrap()
            .hosts
            .iter()
            .map(label)
            .collect()
    }

    #[test]
    fn hosts_are_read_in_order_with_their_ports() {
        assert_eq!(
            hosts("postgres://cm:pw@h1:5432,h2:5433/cm?target_session_attrs=read-write"),
            ["h1:5432", "h2:5433"]
        );
        assert_eq!(
            hosts("postgres://h1,h2:6000,h3/cm"),
            ["h1:5432", "h2:6000", "h3:5432"]
        );
        assert_eq!(
            hosts("postgresql://[::1]:5481,127.0.0.1:5482"),
            ["[::1]:5481", "127.0.0.1:5482"]
        );
    }

    #[test]
    fn every_host_gets_the_rest_of_the_url() {
        let url = DatabaseUrl::parse(
            "postgres://cm:s%40cret@h1:5432,h2:5433/cm?sslmode=disable&target_session_attrs=primary&application_name=x",
        )
        .unwrap();
        assert_eq!(url.target, TargetSessionAttrs::Primary);
        for host in &url.hosts {
            assert_eq!(host.get_username(), "cm");
            assert_eq!(host.get_database(), Some("cm"));
            assert_eq!(host.get_application_name(), Some("x"));
        }
        assert!(!url.is_plain());
    }

    #[test]
    fn target_session_attrs_is_read_as_libpq_does() {
        let target = |url: &str| DatabaseUrl::parse(url).map(|u| u.target);
        assert_eq!(target("postgres://h/cm").unwrap(), TargetSessionAttrs::Any);
        assert_eq!(
            target("postgres://h/cm?target_session_attrs=any").unwrap(),
            TargetSessionAttrs::Any
        );
        assert_eq!(
            target("postgres://h/cm?target_session_attrs=read-write").unwrap(),
            TargetSessionAttrs::ReadWrite
        );
        for refused in ["read-only", "standby", "prefer-standby", "bogus"] {
            let e = target(&format!("postgres://h/cm?target_session_attrs={refused}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(refused), "{e}");
        }
        assert!(DatabaseUrl::parse("postgres://h/cm").unwrap().is_plain());
        assert!(
            !DatabaseUrl::parse("postgres://h/cm?target_session_attrs=primary")
                .unwrap()
                .is_plain()
        );
    }

    #[test]
    fn malformed_lists_are_refused() {
        assert!(DatabaseUrl::parse("postgres://h1,,h2/cm").is_err());
        assert!(DatabaseUrl::parse("h1,h2/cm").is_err());
        assert!(DatabaseUrl::parse("postgres://h1:x,h2/cm").is_err());
    }

    #[test]
    fn socket_directories_in_the_query_still_parse() {
        let url = DatabaseUrl::parse("postgres:///cm?host=/run/postgresql").unwrap();
        assert_eq!(url.hosts.len(), 1);
        assert!(url.is_plain());
    }
}
