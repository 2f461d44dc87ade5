//! Connecting to PostgreSQL (the commands and the service), and keeping the database URL's secrets out of
//! every message: its password, and query parameters such as `password` or `sslpassword`.

use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use cm_store::{PgStore, StoreOptions};

use crate::failure::Failure;

/// How long the first connection may take before the command gives up: long enough for a
/// server across a slow network, short enough that a person is not left waiting.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the database URL goes through a pooler (`--pooled`), set once from the command line
/// before anything connects.
static POOLED: AtomicBool = AtomicBool::new(false);

/// The database URL, from `--database-url` (or `DATABASE_URL`), from the file
/// `--database-url-file` (or `DATABASE_URL_FILE`) names (its content registered as a secret),
/// or the default. Both given is an error: which one was meant cannot be told.
pub fn url(given: Option<&str>, file: Option<&std::path::Path>) -> Result<String, String> {
    match (given, file) {
        (Some(_), Some(_)) => Err(
            "the database URL is given twice: --database-url (or DATABASE_URL) and \
             --database-url-file (or DATABASE_URL_FILE); give one of them"
                .into(),
        ),
        (Some(url), None) => Ok(url.to_owned()),
        (None, Some(path)) => {
            let shown = path.display();
            let text = crate::bounded::read_file(path, crate::bounded::SECRET_FILE)
                .map_err(|e| format!("cannot read --database-url-file {shown}: {e}"))?;
            super::secrets::register_file(&text);
            let url = text.trim();
            if url.is_empty() {
                return Err(format!("--database-url-file {shown} is empty"));
            }
            Ok(url.to_string())
        }
        (None, None) => Ok(crate::flags::DEFAULT_DATABASE_URL.into()),
    }
}

/// Records `--pooled` for every connection the process opens.
pub fn set_pooled(pooled: bool) {
    POOLED.store(pooled, Ordering::Relaxed);
}

/// Whether the database URL goes through a pooler (`--pooled`).
pub fn pooled() -> bool {
    POOLED.load(Ordering::Relaxed)
}

/// `options` for this process's connections: through a pooler, with the settings sent in each
/// transaction rather than at connect.
pub fn store_options(options: StoreOptions) -> StoreOptions {
    StoreOptions {
        pooled: pooled(),
        ..options
    }
}

/// Connects to the database; `create` creates it first if it does not exist (not through a
/// pooler, whose own configuration names the databases it serves). One direct
/// connection is tried first, so a refused connection, an unknown database or a rejected
/// password is reported at once, in words, rather than as a pool timing out.
pub async fn connect(url: &str, create: bool) -> Result<PgStore, Failure> {
    check_url(url)?;
    let shown = redact(url);
    let fail = |e: cm_store::StoreError| {
        Failure::Other(format!(
            "cannot connect to PostgreSQL at {shown}: {}",
            e.explain()
        ))
    };
    let options = store_options(StoreOptions::default());
    if create && !options.pooled {
        PgStore::create_database_if_missing(url)
            .await
            .map_err(fail)?;
    } else {
        let check = PgStore::check_connection_with(url, &options);
        match tokio::time::timeout(CONNECT_TIMEOUT, check).await {
            Ok(result) => result.map_err(fail)?,
            Err(_) => {
                let accepted = match url::Url::parse(url) {
                    Ok(parsed) => accepts_connections(&parsed).await,
                    Err(_) => false,
                };
                return Err(Failure::Other(if accepted {
                    format!(
                        "cannot connect to PostgreSQL at {shown}: the server accepts connections \
                         but did not answer PostgreSQL's handshake within {}s (is that port \
                         PostgreSQL's, 5432 by default, or another server's?)",
                        CONNECT_TIMEOUT.as_secs()
                    )
                } else {
                    format!(
                        "cannot connect to PostgreSQL at {shown}: no answer within {}s",
                        CONNECT_TIMEOUT.as_secs()
                    )
                }));
            }
        }
    }
    PgStore::connect_with(url, &options).await.map_err(fail)
}

/// Whether the URL's single host takes a TCP connection within a second: a server that does
/// but never answers the handshake is some other service's port.
async fn accepts_connections(url: &url::Url) -> bool {
    let Some(host) = url.host_str().filter(|h| !h.is_empty()) else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = url.port().unwrap_or(5432);
    matches!(
        tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::TcpStream::connect((host, port))
        )
        .await,
        Ok(Ok(_))
    )
}

/// Refuses, as bad input, a database URL that is not a PostgreSQL URL with a host, before any
/// connection is tried (the driver would say only "relative URL without a base").
pub fn check_url(url: &str) -> Result<(), Failure> {
    // The reason is scrubbed too: a parser may quote the part of the URL it stumbled on.
    let refuse = |why: &str| {
        Failure::Input(format!(
            "invalid --database-url {}: {} (expected postgres://USER@HOST:PORT/DATABASE)",
            redact(url),
            scrub(why, url)
        ))
    };
    check_tls_parameters(url).map_err(|why| refuse(&why))?;
    // Several hosts (`postgres://h1:5432,h2:5433/cm`, as libpq reads them) are checked by the
    // store's own parser, each host as a URL of its own.
    if let Some((_, rest)) = url.split_once("://")
        && rest
            .split(['/', '?'])
            .next()
            .is_some_and(|a| a.contains(','))
    {
        return cm_store::DatabaseUrl::parse(url)
            .map(|_| ())
            .map_err(|e| refuse(&e.to_string()));
    }
    let parsed = url::Url::parse(url).map_err(|e| refuse(&e.to_string()))?;
    // target_session_attrs is read by the store, which refuses values it does not support.
    if parsed
        .query_pairs()
        .any(|(key, _)| key == "target_session_attrs")
    {
        cm_store::DatabaseUrl::parse(url).map_err(|e| refuse(&e.to_string()))?;
    }
    if !matches!(parsed.scheme(), "postgres" | "postgresql") {
        return Err(refuse(&format!(
            "the scheme is {:?}, not postgres",
            parsed.scheme()
        )));
    }
    // A socket directory given as `?host=/run/postgresql` stands in for the URL's host.
    let socket = parsed.query_pairs().any(|(key, _)| key == "host");
    if parsed.host_str().is_none_or(str::is_empty) && !socket {
        return Err(refuse("it names no host"));
    }
    Ok(())
}

/// libpq's `sslmode` values, as sqlx reads them (`allow` as `disable`).
const SSL_MODES: [&str; 6] = [
    "disable",
    "allow",
    "prefer",
    "require",
    "verify-ca",
    "verify-full",
];

/// Refuses an `sslmode` the driver does not know and a certificate or key file that cannot be
/// opened, naming the parameter: the driver would say only "entity not found" at the first
/// connection, without saying which file.
fn check_tls_parameters(url: &str) -> Result<(), String> {
    for (key, value) in url::form_urlencoded::parse(query(url).as_bytes()) {
        match &*key {
            "sslmode" | "ssl-mode" if !SSL_MODES.contains(&&*value) => {
                return Err(format!(
                    "{key}={value:?} is not one of {}",
                    SSL_MODES.join(", ")
                ));
            }
            // A PEM given inline (`-----BEGIN …`) is not a file.
            "sslrootcert" | "ssl-root-cert" | "ssl-ca" | "sslcert" | "ssl-cert" | "sslkey"
            | "ssl-key"
                if !value.trim_start().starts_with("-----BEGIN") =>
            {
                // A FIFO would block the open (and every connection's read) until some writer
                // came: refused at once, as every other file cm is given on a FIFO is.
                use std::os::unix::fs::FileTypeExt as _;
                let kind = std::fs::metadata(&*value)
                    .map_err(|e| format!("{key}={value}: {e}"))?
                    .file_type();
                if kind.is_fifo() {
                    return Err(format!(
                        "{key}={value}: it is a FIFO, not a regular file: only a file is read"
                    ));
                }
                std::fs::File::open(&*value).map_err(|e| format!("{key}={value}: {e}"))?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Connects to a database that must already hold cm's schema: one without it is refused with
/// the advice to run `cm-scheduler migrate`.
pub async fn connect_migrated(url: &str) -> Result<PgStore, Failure> {
    let store = connect(url, false).await?;
    store
        .check_schema()
        .await
        .map_err(|e| Failure::Other(format!("{}: {}", redact(url), e.explain())))?;
    Ok(store)
}

/// Where the user information of a URL's `rest` (what follows `scheme://`) ends: the index of
/// the `@` before the host, if it has one. A password (`user:PASSWORD@host`) may hold `@`, `/`,
/// `?` or `#` unencoded (`postgres://cm:se/cret@db/cm`), and where it ends cannot be told from
/// the text, so it is taken to run to the last `@` of the URL: a password is never shown for
/// want of encoding, at the cost of hiding more than the password when the path or query holds
/// an `@` too (`postgres://db:5432/cm?application_name=a@b` is shown as `postgres://db:***@b`).
/// Without a password the user information ends at the authority's last `@`.
fn userinfo_end(rest: &str) -> Option<usize> {
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let last_at = authority.rfind('@');
    match authority.find(':') {
        Some(colon) if last_at.is_none_or(|at| colon < at) => rest.rfind('@'),
        _ => last_at,
    }
}

/// A URL's query: what follows the first `?` after its user information (a password may hold a
/// `?`), up to a `#`; empty when it has none.
fn query(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let after = userinfo_end(rest).map_or(rest, |at| &rest[at..]);
    after
        .split_once('?')
        .map_or("", |(_, query)| query.split('#').next().unwrap_or(query))
}

/// Whether a URL query parameter holds a secret (`password`, `sslpassword`, a token, …).
/// Paths to files that hold secrets (`passfile`, `sslkey`) are not secrets themselves.
fn is_secret_parameter(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["password", "secret", "token"]
        .iter()
        .any(|word| key.contains(word))
}

/// Every secret the database URL holds, as written and percent-decoded: the user-info
/// password, the values of secret query parameters, and `password=` in a `key=value`
/// connection string.
pub fn secrets(url: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut push = |raw: &str| {
        if !raw.is_empty() {
            found.push(raw.to_string());
            let decoded: String = url::form_urlencoded::parse(format!("x={raw}").as_bytes())
                .map(|(_, v)| v.into_owned())
                .next()
                .unwrap_or_default();
            if !decoded.is_empty() && decoded != raw {
                found.push(decoded);
            }
        }
    };
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    if let Some(at) = userinfo_end(rest)
        && let Some((_, password)) = rest[..at].split_once(':')
    {
        push(password);
    }
    if url.contains("://") {
        for pair in query(url).split(['&', '#']) {
            if let Some((key, value)) = pair.split_once('=') {
                let key: String = url::form_urlencoded::parse(format!("{key}=").as_bytes())
                    .map(|(k, _)| k.into_owned())
                    .next()
                    .unwrap_or_default();
                if is_secret_parameter(&key) {
                    push(value);
                }
            }
        }
    } else {
        for token in url.split_whitespace() {
            if let Some((key, value)) = token.split_once('=')
                && is_secret_parameter(key)
            {
                push(value.trim_matches(['\'', '"']));
            }
        }
    }
    // The longest first, so a secret that contains another is replaced whole.
    found.sort_by_key(|s| std::cmp::Reverse(s.len()));
    found
}

/// `text` with every secret of the database URL replaced by `***`.
fn scrub(text: &str, url: &str) -> String {
    let mut text = text.to_string();
    for secret in secrets(url) {
        text = text.replace(&secret, "***");
    }
    text
}

/// The database URL with its secrets replaced by `***`, for messages.
pub fn redact(url: &str) -> String {
    // Only the parts after the scheme: a password such as "postgres" must not turn the scheme
    // into "***://".
    match url.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{}", scrub(rest, url)),
        None => scrub(url, url),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(url: &str, expected: &str) {
        assert_eq!(redact(url), expected, "{url}");
    }

    #[test]
    fn every_secret_part_of_a_url_is_redacted() {
        check(
            "postgres://cm:s3cret@db:5432/cm",
            "postgres://cm:***@db:5432/cm",
        );
        check(
            "postgres://cm@db/cm?password=s3cret&sslmode=require",
            "postgres://cm@db/cm?password=***&sslmode=require",
        );
        check(
            "postgres://db/cm?sslmode=verify-full&sslpassword=k3y&passfile=/home/cm/.pgpass",
            "postgres://db/cm?sslmode=verify-full&sslpassword=***&passfile=/home/cm/.pgpass",
        );
        check("postgres://cm:p%40ss@db/cm", "postgres://cm:***@db/cm");
        check(
            "postgres://postgres:postgres@db/cm",
            "postgres://***:***@db/cm",
        );
        check(
            "postgres://postgres@127.0.0.1:5432/cm",
            "postgres://postgres@127.0.0.1:5432/cm",
        );
        check(
            "host=db password=s3cret dbname=cm",
            "host=db password=*** dbname=cm",
        );
        // Unparseable URLs are redacted all the same.
        check(
            "postgres://cm:s3cret@db:notaport/cm",
            "postgres://cm:***@db:notaport/cm",
        );
        assert_eq!(
            scrub("bad password \"p@ss\" for cm", "postgres://cm:p%40ss@db/cm"),
            "bad password \"***\" for cm"
        );
    }

    #[test]
    fn a_password_with_an_unencoded_delimiter_is_redacted_whole() {
        for (url, password) in [
            ("postgres://postgres:se/cret99@127.0.0.1/cm", "se/cret99"),
            ("postgres://cm:pa?ss99@db:5432/cm", "pa?ss99"),
            ("postgres://cm:pa#ss99@db/cm", "pa#ss99"),
            (
                "postgresql://app:pa@ss/w0rd?x@db/cm?sslmode=disable",
                "pa@ss/w0rd?x",
            ),
            ("postgres://cm:12/34@db/cm", "12/34"),
            // No scheme, or a mistyped one: still a user and a password before a host.
            ("cm:se/cret99@db/cm", "se/cret99"),
            ("postgres:/cm:se/cret99@db/cm", "se/cret99"),
        ] {
            let shown = redact(url);
            assert!(!shown.contains(password), "{url}: {shown}");
            assert!(shown.contains(":***@"), "{url}: {shown}");
            assert!(secrets(url).iter().any(|s| s.contains(password)), "{url}");
            // Refused or not, no message about the URL holds any part of the password.
            if let Err(Failure::Input(message)) = check_url(url) {
                assert!(!message.contains(password), "{message}");
                for piece in password.split(['/', '?', '#', '@']) {
                    assert!(!message.contains(&format!(":{piece}")), "{message}");
                }
                assert_eq!(message.lines().count(), 1, "{message}");
            }
        }
        // The reviewer's case: refused as bad input, the password masked.
        let Err(Failure::Input(message)) = check_url("postgres://postgres:se/cret99@127.0.0.1/cm")
        else {
            panic!("accepted");
        };
        assert!(
            message.starts_with("invalid --database-url postgres://postgres:***@127.0.0.1/cm:"),
            "{message}"
        );
        // The query after such a password is still read: its TLS parameters are checked.
        let Err(Failure::Input(message)) = check_url("postgres://cm:a?b@db/cm?sslmode=verify_full")
        else {
            panic!("accepted");
        };
        assert!(message.contains("sslmode=\"verify_full\""), "{message}");
        // URLs without a password keep their ports, paths and queries.
        for kept in [
            "postgres://cm@db:5432/cm?sslmode=disable",
            "postgres://db:5432/cm",
            "postgres://[::1]:5432/cm",
            "postgres://cm@h1:5432,h2:5433/cm",
        ] {
            check(kept, kept);
        }
    }

    #[test]
    fn tls_parameters_are_checked_before_connecting() {
        for good in [
            "postgres://cm@db/cm?sslmode=verify-full&sslrootcert=/dev/null",
            "postgres://cm@h1,h2/cm?sslmode=require&sslcert=/dev/null&sslkey=/dev/null",
            "postgres://cm@db/cm?sslmode=disable",
        ] {
            assert!(check_url(good).is_ok(), "{good}");
        }
        for (bad, why) in [
            (
                "postgres://cm@db/cm?sslmode=verify_full",
                "sslmode=\"verify_full\" is not one of disable, allow, prefer, require, \
                 verify-ca, verify-full",
            ),
            (
                "postgres://cm@db/cm?sslmode=verify-full&sslrootcert=/no/such/ca.pem",
                "sslrootcert=/no/such/ca.pem: No such file",
            ),
            (
                "postgres://cm@h1,h2/cm?sslcert=/no/such/client.pem",
                "sslcert=/no/such/client.pem: No such file",
            ),
        ] {
            let Err(Failure::Input(message)) = check_url(bad) else {
                panic!("{bad} was accepted");
            };
            assert!(message.contains(why), "{message}");
            assert_eq!(message.lines().count(), 1, "{message}");
        }
    }

    #[test]
    fn multi_host_urls_are_checked_and_redacted() {
        check(
            "postgres://cm:s3cret@h1:5432,h2:5433/cm?target_session_attrs=read-write",
            "postgres://cm:***@h1:5432,h2:5433/cm?target_session_attrs=read-write",
        );
        for good in [
            "postgres://cm@h1:5432,h2:5433/cm?target_session_attrs=read-write",
            "postgres://cm@h1,h2/cm",
            "postgres://cm@h1/cm?target_session_attrs=primary",
        ] {
            assert!(check_url(good).is_ok(), "{good}");
        }
        for (bad, why) in [
            ("postgres://cm@h1,,h2/cm", "empty host"),
            (
                "postgres://cm@h1/cm?target_session_attrs=standby",
                "not supported",
            ),
            (
                "postgres://cm@h1,h2/cm?target_session_attrs=sometimes",
                "not one of",
            ),
        ] {
            let Err(Failure::Input(message)) = check_url(bad) else {
                panic!("{bad} was accepted");
            };
            assert!(message.contains(why), "{message}");
        }
    }
}
