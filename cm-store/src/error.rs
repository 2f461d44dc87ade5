//! The store's error type.

use uuid::Uuid;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database refused or failed a statement, or could not be reached. The sqlx error is
    /// kept whole; [`StoreError::database_kind`] tells a constraint violation by its meaning.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Applying the migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// No routine has this id.
    #[error("no routine has id {0}")]
    RoutineNotFound(Uuid),
    /// No routine has this name.
    #[error("no routine is named {0:?}")]
    RoutineNameNotFound(String),
    /// Another routine already has this name (names are unique).
    #[error("a routine named {0:?} already exists")]
    NameTaken(String),
    /// A change would leave a routine the domain refuses (say, a schedule whose new zone makes it
    /// invalid); nothing was written.
    #[error("invalid routine: {0}")]
    InvalidRoutine(String),
    /// The database has no cm schema: its migrations were never applied.
    #[error("the database has no cm schema: apply the migrations (`cm-scheduler migrate`)")]
    SchemaMissing,
    /// The database's schema is older than this build's migrations.
    #[error(
        "the database's schema is at migration {applied}, older than this build's {expected}: \
         apply the migrations (`cm-scheduler migrate`)"
    )]
    SchemaOutdated {
        /// The newest migration applied to the database.
        applied: i64,
        /// The newest migration this build embeds.
        expected: i64,
    },
    /// A schema name cm cannot use (see [`crate::Schema::parse`]).
    #[error(
        "invalid schema name {0:?}: a lowercase identifier (letters, digits, `_`; not beginning \
         with a digit or `pg_`; at most 63 bytes)"
    )]
    InvalidSchema(String),
    /// The process's schema was already set (or used) and another was asked for.
    #[error("the schema is already {current:?}; a process serves one schema, not also {wanted:?}")]
    SchemaAlreadySet {
        /// The schema in use.
        current: String,
        /// The schema asked for.
        wanted: String,
    },
    /// The database URL cannot be read (a multi-host list or `target_session_attrs` libpq would
    /// refuse, or one cm does not support).
    #[error("invalid database URL: {0}")]
    InvalidUrl(String),
    /// No host of a multi-host URL qualifies for its `target_session_attrs`: each host and why
    /// it was refused.
    #[error("{0}")]
    NoUsableHost(String),
    /// The connections go through a pooler that does not keep a prepared statement from one
    /// transaction to the next (PgBouncer before 1.21 in transaction mode, or with
    /// `max_prepared_statements = 0`): every statement cm prepares would fail on the next
    /// server connection. Found by [`crate::PgStore::check_pooler`].
    #[error(
        "the database URL goes through a pooler that loses prepared statements between \
         transactions ({0}): use PgBouncer 1.21 or later with max_prepared_statements = 200 \
         (its default from 1.25), or pool_mode = session"
    )]
    PoolerLosesPreparedStatements(String),
    /// The settings cm sends when it connects (its timeouts, `plan_cache_mode`) did not
    /// arrive: a pooler dropped them (PgBouncer's `ignore_startup_parameters = options`).
    /// Found by [`crate::PgStore::check_pooler`].
    #[error(
        "the settings cm sends at connect did not arrive ({0}): the database URL goes through a \
         pooler that drops them; run cm-scheduler with --pooled (CM_DATABASE_POOLED=true), which \
         sets them in every transaction"
    )]
    PoolerDropsSettings(String),
    /// No calendar has this name.
    #[error("no calendar is named {0:?}")]
    CalendarNotFound(String),
    /// Another calendar already has this name (names are unique).
    #[error("a calendar named {0:?} already exists")]
    CalendarNameTaken(String),
    /// A calendar routines are on cannot be deleted.
    #[error(
        "the calendar {name:?} is in use by routines ({}): move them off it first \
         (routine update NAME --calendar none)",
        routines.join(", ")
    )]
    CalendarInUse {
        /// The calendar.
        name: String,
        /// The first few routines on it, by name.
        routines: Vec<String>,
    },
    /// A calendar, or an edit of one, the domain refuses; nothing was written.
    #[error("invalid calendar: {0}")]
    InvalidCalendar(String),
    /// A stored row holds a value the domain refuses (written by hand, or by an older version).
    #[error("stored routine {routine_id} is unusable: {reason}")]
    CorruptRoutine {
        /// The routine whose row is unusable.
        routine_id: Uuid,
        /// What is wrong with it.
        reason: String,
    },
}

impl From<cm_domain::DefinitionError> for StoreError {
    /// A routine the domain refuses ([`cm_domain::definition`]): [`StoreError::InvalidRoutine`]
    /// with the domain's one line.
    fn from(e: cm_domain::DefinitionError) -> StoreError {
        StoreError::InvalidRoutine(e.to_string())
    }
}

impl StoreError {
    /// The kind of database error (unique violation, foreign key violation, …), if this is one.
    pub fn database_kind(&self) -> Option<sqlx::error::ErrorKind> {
        match self {
            StoreError::Database(e) => e.as_database_error().map(|d| d.kind()),
            _ => None,
        }
    }

    /// Whether the error is the database being unreachable, restarting, overloaded or making
    /// one statement give way to another (a serialization failure, a deadlock, a timeout),
    /// rather than refusing what was asked: the same statement is worth trying again. A
    /// migration that could not run for such a reason (no connection came free) is transient
    /// too: the database did not refuse it.
    pub fn is_transient(&self) -> bool {
        if self.is_refused_startup_parameter() {
            return false;
        }
        let e = match self {
            StoreError::Database(e) => e,
            StoreError::Migrate(sqlx::migrate::MigrateError::Execute(e)) => e,
            _ => return false,
        };
        match e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Protocol(_) => true,
            sqlx::Error::Database(d) => d.code().is_some_and(|code| is_transient_sqlstate(&code)),
            _ => false,
        }
    }
}

impl StoreError {
    /// Whether a pooler refused the connection for a startup parameter it does not track
    /// (PgBouncer's "unsupported startup parameter"): cm's settings sent at connect, on a
    /// store that is not [`crate::StoreOptions::pooled`]. Trying again changes nothing.
    pub fn is_refused_startup_parameter(&self) -> bool {
        match self {
            StoreError::Database(sqlx::Error::Database(d)) => {
                refuses_startup_parameters(d.message())
            }
            _ => false,
        }
    }
}

/// PgBouncer's words for a startup parameter it refuses (`unsupported startup parameter: …`,
/// `… in options: …`), in every version from 1.18 to 1.25.
fn refuses_startup_parameters(message: &str) -> bool {
    message.starts_with("unsupported startup parameter")
}

/// SQLSTATEs of failures that say nothing about the statement itself: connection exceptions
/// (class 08), serialization failures and deadlocks (40001, 40P01), too many connections (53300),
/// a statement or lock timeout (57014, 55P03), the server shutting down or restarting (57P01
/// to 57P03), and a write on a server that became read-only (25006: a primary demoted while the
/// store follows a multi-host URL to the new one).
fn is_transient_sqlstate(code: &str) -> bool {
    code.starts_with("08")
        || matches!(
            code,
            "40001" | "40P01" | "53300" | "57014" | "55P03" | "57P01" | "57P02" | "57P03" | "25006"
        )
}

impl StoreError {
    /// The error in one line for people: the database's own message without PostgreSQL's
    /// internals (its source file, line and function), and what to do where that is known
    /// (start the server, apply the migrations).
    pub fn explain(&self) -> String {
        match self {
            StoreError::Database(e) => explain_sqlx(e),
            StoreError::Migrate(sqlx::migrate::MigrateError::Execute(e)) => {
                format!("migration failed: {}", explain_sqlx(e))
            }
            other => other.to_string(),
        }
    }
}

fn explain_sqlx(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused (is PostgreSQL running there?)".into()
        }
        // The resolver's failure reaches sqlx as an uncategorized I/O error.
        sqlx::Error::Io(io) if io.to_string().contains("failed to lookup address") => {
            format!("the host is not known ({io})")
        }
        // rustls's refusal of the handshake reaches sqlx as an I/O error of kind InvalidData.
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::InvalidData && is_tls(io) => {
            explain_tls(&io.to_string())
        }
        sqlx::Error::Io(io) => format!("{} ({io})", io.kind()),
        sqlx::Error::Tls(e) => explain_tls(&e.to_string()),
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // invalid_catalog_name: the database does not exist.
            Some("3D000") => format!(
                "{} (`cm-scheduler migrate` creates it and its schema)",
                db.message()
            ),
            // undefined_table: the schema was never applied.
            Some("42P01") => StoreError::SchemaMissing.to_string(),
            // invalid_authorization_specification for a connection without TLS, on a server
            // whose pg_hba.conf admits only `hostssl`.
            Some("28000") if db.message().ends_with("no encryption") => format!(
                "{} (the server may admit only TLS connections: set sslmode=verify-full in the \
                 database URL)",
                db.message()
            ),
            _ if refuses_startup_parameters(db.message()) => format!(
                "{} (a PgBouncer in front of PostgreSQL refuses cm's settings as startup \
                 parameters: run cm-scheduler with --pooled, CM_DATABASE_POOLED=true, which sets \
                 them in every transaction instead)",
                db.message()
            ),
            _ => db.message().to_string(),
        },
        sqlx::Error::PoolTimedOut => {
            "no database connection came free in time (is PostgreSQL overloaded or gone?)".into()
        }
        // Something answered the handshake, but not as PostgreSQL does: another server's port
        // (MariaDB's greeting, an HTTP error page). The driver's wording names its own source
        // file; the server's first byte is what tells.
        sqlx::Error::Protocol(text) => match not_postgres(text) {
            Some(what) => format!("the server there is not PostgreSQL: {what}"),
            None => format!(
                "PostgreSQL's protocol was not followed: {}",
                driver_words(text)
            ),
        },
        other => driver_words(&other.to_string()),
    }
}

/// What answered the handshake, when a protocol error shows it was not PostgreSQL.
fn not_postgres(text: &str) -> Option<String> {
    let byte = text
        .strip_prefix(
            "encountered unexpected or invalid data: unexpected response from SSLRequest: ",
        )
        .or_else(|| text.strip_prefix("unexpected response from SSLRequest: "))?;
    let byte = byte.split_whitespace().next()?;
    let value = u8::from_str_radix(byte.trim_start_matches("0x"), 16).ok()?;
    Some(match value {
        b'H' => "it answered as an HTTP server does; is the port PostgreSQL's (5432)?".into(),
        _ => format!(
            "it answered the handshake with byte {byte} where PostgreSQL answers S or N (a \
             MySQL or MariaDB server greets first); is the port PostgreSQL's (5432)?"
        ),
    })
}

/// The driver's words without the source location it appends (`(sqlx_postgres::…:95)`).
fn driver_words(text: &str) -> String {
    match text.rfind(" (sqlx") {
        Some(at) if text.ends_with(')') => text[..at].to_string(),
        _ => text.to_string(),
    }
}

/// rustls's words for a handshake it refused or was refused, as its `Error` displays them.
const TLS_REFUSALS: [&str; 5] = [
    "invalid peer certificate",
    "received fatal alert",
    "peer is incompatible",
    "peer misbehaved",
    "peer sent no certificates",
];

/// Whether an I/O error is rustls's refusal of a handshake.
fn is_tls(io: &std::io::Error) -> bool {
    io.get_ref().is_some_and(|inner| {
        TLS_REFUSALS
            .iter()
            .any(|w| inner.to_string().starts_with(w))
    })
}

/// A TLS failure in words: what is wrong and what to change, then rustls's own text.
fn explain_tls(text: &str) -> String {
    let advice = if text.contains("UnknownIssuer") {
        "the server's certificate is not signed by a CA this host trusts: name its CA with \
         sslrootcert=FILE"
    } else if text.contains("not valid for name") {
        "the server's certificate does not name the host connected to: connect by a name it \
         holds (sslmode=verify-full checks the name, verify-ca does not)"
    } else if text.starts_with("received fatal alert") {
        "the server refused the handshake, often the client certificate: sslcert and sslkey \
         must be a pair signed by a CA the server trusts, naming the user"
    } else if text.contains("server does not support TLS") {
        "the server does not offer TLS (its ssl setting is off), and sslmode=require, \
         verify-ca and verify-full need it"
    } else {
        "the TLS handshake failed"
    };
    format!("TLS: {advice} ({text})")
}

#[cfg(test)]
mod tests {
    use super::{StoreError, is_transient_sqlstate};

    /// Another server's port answers the handshake with bytes PostgreSQL never sends: said as
    /// such, without the driver's source location.
    #[test]
    fn a_server_that_is_not_postgres_is_named_so() {
        let protocol =
            |text: &str| StoreError::Database(sqlx::Error::Protocol(text.to_string())).explain();
        let mariadb = protocol(
            "unexpected response from SSLRequest: 0x64 (sqlx_postgres::connection::tls:95)",
        );
        assert!(
            mariadb.starts_with("the server there is not PostgreSQL: "),
            "{mariadb}"
        );
        assert!(
            mariadb.contains("0x64") && !mariadb.contains("sqlx_postgres"),
            "{mariadb}"
        );
        let http = protocol(
            "unexpected response from SSLRequest: 0x48 (sqlx_postgres::connection::tls:95)",
        );
        assert!(http.contains("HTTP"), "{http}");
        let other =
            protocol("expected 0x52 but received 0x45 (sqlx_postgres::connection::stream:12)");
        assert_eq!(
            other,
            "PostgreSQL's protocol was not followed: expected 0x52 but received 0x45"
        );
    }

    /// Each TLS failure is told in words, one line, with rustls's text kept.
    #[test]
    fn tls_failures_are_explained() {
        let io = |text: &str| {
            StoreError::Database(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                text.to_string(),
            )))
            .explain()
        };
        for (given, expected) in [
            (
                "invalid peer certificate: UnknownIssuer",
                "TLS: the server's certificate is not signed by a CA this host trusts",
            ),
            (
                "invalid peer certificate: certificate not valid for name \"127.0.0.1\"; \
                 certificate is only valid for DnsName(\"localhost\")",
                "TLS: the server's certificate does not name the host connected to",
            ),
            (
                "received fatal alert: UnknownCA",
                "TLS: the server refused the handshake, often the client certificate",
            ),
            (
                "peer misbehaved: X",
                "TLS: the TLS handshake failed (peer misbehaved: X)",
            ),
            // Not rustls's: left as it was.
            (
                "stream did not contain valid UTF-8",
                "invalid data (stream did not",
            ),
        ] {
            let explained = io(given);
            assert!(explained.starts_with(expected), "{explained}");
            assert!(explained.contains(given), "{explained}");
            assert_eq!(explained.lines().count(), 1, "{explained}");
        }
        let unoffered =
            StoreError::Database(sqlx::Error::Tls("server does not support TLS".into()));
        assert!(
            unoffered
                .explain()
                .starts_with("TLS: the server does not offer TLS"),
            "{}",
            unoffered.explain()
        );
    }

    /// A migration that found no free connection (a server whose connections are all taken)
    /// is worth retrying; one the database refused is not.
    #[test]
    fn a_migration_without_a_connection_is_transient() {
        use sqlx::migrate::MigrateError;
        let starved = StoreError::Migrate(MigrateError::Execute(sqlx::Error::PoolTimedOut));
        assert!(starved.is_transient());
        let refused = StoreError::Migrate(MigrateError::VersionMissing(7));
        assert!(!refused.is_transient());
        assert!(StoreError::Database(sqlx::Error::PoolTimedOut).is_transient());
    }

    #[test]
    fn transient_sqlstates() {
        for code in [
            "08006", "08001", "40001", "40P01", "53300", "57014", "55P03", "57P01",
        ] {
            assert!(is_transient_sqlstate(code), "{code}");
        }
        for code in ["23505", "23503", "22021", "42P01", "42703", "P0001"] {
            assert!(!is_transient_sqlstate(code), "{code}");
        }
    }
}
