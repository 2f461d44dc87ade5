//! TLS to PostgreSQL, against a cluster of the test's own: `ssl = on`, a `pg_hba.conf` that
//! admits `hostssl` only, and a server certificate for `localhost` signed by a CA the test makes
//! with `openssl`. With `sslmode=verify-full` and that CA as `sslrootcert`, the binary migrates,
//! creates a routine and fires it through a whole `run`; a second CA, a host name the
//! certificate does not name and a connection without TLS are each refused in one line; the
//! URL's TLS options reach every host of a multi-host URL; a client certificate is sent when the
//! server asks for one (`clientcert=verify-full`).
//!
//! Each test starts its own cluster (`initdb`, `pg_ctl`, fsync off, small buffers), torn down by
//! a `Drop` guard when the test ends, also when it fails. As root, PostgreSQL's programs run as
//! the user `postgres` (`runuser`), since they refuse root.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use sqlx::{Connection as _, PgConnection};
use uuid::Uuid;

use crate::cli::{Run, check_fails, cm, ok, run};
use crate::support::{cm_scheduler, end_scheduler, spawn_logged, wait_until_blocking};

/// Why these tests are ignored by a plain `cargo test`: `cargo xtask test` runs them where
/// PostgreSQL's server programs and `openssl` are installed.
const NEEDS: &str = "needs initdb and openssl";

/// How the binary words a server certificate no trusted CA signed.
const UNKNOWN_CA: &str = "TLS: the server's certificate is not signed by a CA this host trusts";
/// How the binary words a server certificate that does not name the host connected to.
const OTHER_NAME: &str = "TLS: the server's certificate does not name the host connected to";

/// The directory of PostgreSQL's server programs: `CM_TEST_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian's layout), else the directory of `initdb` on the `PATH`.
fn pg_bin() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CM_TEST_PG_BIN").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let debian = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .and_then(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    let version: u32 = e.file_name().to_str()?.parse().ok()?;
                    let bin = e.path().join("bin");
                    bin.join("initdb").is_file().then_some((version, bin))
                })
                .max()
                .map(|(_, bin)| bin)
        });
    debian.or_else(|| {
        std::env::split_paths(&std::env::var_os("PATH")?).find(|dir| dir.join("initdb").is_file())
    })
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"))
    })
}

/// Runs `command`, panicking with its output when it fails.
fn must(mut command: Command, what: &str) {
    let out = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start {command:?}: {e} ({NEEDS})"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A PostgreSQL cluster of the test's own, TLS only, and the certificates around it: stopped
/// and removed when dropped.
struct TlsCluster {
    /// Everything of the cluster's: the certificates, the data directory, the server's log.
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
}

impl TlsCluster {
    /// Makes the certificates, then creates and starts the cluster on a free port.
    fn start() -> TlsCluster {
        let bin = pg_bin().unwrap_or_else(|| {
            panic!("{NEEDS}: no initdb found (set CM_TEST_PG_BIN to PostgreSQL's bin directory)")
        });
        let dir = std::env::temp_dir().join(format!("cm_tls_{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("creating the cluster's directory");
        // The guard exists from here on: whatever fails below, the directory is removed and a
        // started server stopped.
        let cluster = TlsCluster {
            dir,
            bin,
            port: free_port(),
        };
        cluster.make_certificates();
        if is_root() {
            let mut chown = Command::new("chown");
            chown.args(["-R", "postgres:"]).arg(&cluster.dir);
            must(chown, "giving the cluster's directory to postgres");
        }
        let data = cluster.data();
        let mut initdb = cluster.pg("initdb");
        initdb.arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        ]);
        must(initdb, "initdb");
        let d = cluster.dir.display();
        let settings = format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{d}'\n\
             ssl = on\nssl_cert_file = '{d}/server.crt'\nssl_key_file = '{d}/server.key'\n\
             ssl_ca_file = '{d}/ca.crt'\n\
             fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n\
             shared_buffers = 16MB\nmax_connections = 60\n",
            port = cluster.port
        );
        append(&data.join("postgresql.conf"), &settings);
        // TLS only: no `host` line, so a connection without TLS matches nothing. The user
        // `certified` must also show a client certificate the CA signed, naming it.
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\n\
             hostssl all certified 127.0.0.1/32 trust clientcert=verify-full\n\
             hostssl all all 127.0.0.1/32 trust\n",
        )
        .expect("writing pg_hba.conf");
        let mut start = cluster.pg("pg_ctl");
        start
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(cluster.dir.join("server.log"))
            .args(["-w", "-t", "60", "start"]);
        let out = start
            .stdin(Stdio::null())
            .output()
            .expect("starting pg_ctl");
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(cluster.dir.join("server.log")).unwrap_or_default()
        );
        cluster
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// One of PostgreSQL's programs, as the user `postgres` when the test runs as root.
    fn pg(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    }

    /// Two CAs (the cluster's and one nobody trusts), the server's certificate for `localhost`
    /// only, and client certificates for the user `certified` from each CA.
    fn make_certificates(&self) {
        let openssl = |args: &[&str]| {
            let mut c = Command::new("openssl");
            c.current_dir(&self.dir).args(args);
            must(c, &format!("openssl {}", args.join(" ")));
        };
        let key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for ca in ["ca", "other-ca"] {
            let (keyout, out, subject) = (
                format!("{ca}.key"),
                format!("{ca}.crt"),
                format!("/CN=cm test {ca}"),
            );
            let mut args = vec!["req", "-x509"];
            args.extend(key);
            args.extend([
                "-keyout",
                &keyout,
                "-out",
                &out,
                "-days",
                "2",
                "-subj",
                &subject,
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]);
            openssl(&args);
        }
        append(
            &self.dir.join("server.ext"),
            "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        );
        append(
            &self.dir.join("client.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=clientAuth\n",
        );
        for (name, subject, ca, ext) in [
            ("server", "/CN=localhost", "ca", "server.ext"),
            ("client", "/CN=certified", "ca", "client.ext"),
            ("other-client", "/CN=certified", "other-ca", "client.ext"),
        ] {
            let (keyout, csr, crt) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
            );
            let mut args = vec!["req", "-new"];
            args.extend(key);
            args.extend(["-keyout", &keyout, "-out", &csr, "-subj", subject]);
            openssl(&args);
            let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca_crt,
                "-CAkey",
                &ca_key,
                "-set_serial",
                "1",
                "-days",
                "2",
                "-extfile",
                ext,
                "-out",
                &crt,
            ]);
        }
        // PostgreSQL refuses a key others can read.
        use std::os::unix::fs::PermissionsExt as _;
        for key in ["server.key", "client.key", "other-client.key"] {
            std::fs::set_permissions(self.dir.join(key), std::fs::Permissions::from_mode(0o600))
                .expect("restricting a key");
        }
    }

    /// The path of one of the cluster's files.
    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// `postgres://USER@HOSTS/cm?PARAMS`, where each host of `hosts` (comma-separated) gets the
    /// cluster's port.
    fn url(&self, user: &str, hosts: &str, params: &str) -> String {
        let hosts: Vec<String> = hosts
            .split(',')
            .map(|h| format!("{h}:{}", self.port))
            .collect();
        format!("postgres://{user}@{}/cm?{params}", hosts.join(","))
    }

    /// `sslmode=verify-full` with the cluster's CA, to `localhost`.
    fn verified(&self) -> String {
        self.url(
            "postgres",
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={}", self.file("ca.crt")),
        )
    }
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        if self.data().join("postmaster.pid").exists() {
            let mut stop = self.pg("pg_ctl");
            let _ = stop
                .arg("-D")
                .arg(self.data())
                .args(["-m", "immediate", "-w", "stop"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if std::thread::panicking() {
            eprintln!(
                "the TLS cluster's log: {}",
                std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// A port nothing listens on now, from the kernel's ephemeral range.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("finding a free port")
        .port()
}

/// `migrate` on `url`: what each test connects with first (it creates the database `cm`).
fn migrate(url: &str) -> Run {
    cm(url, &["migrate"])
}

#[tokio::test]
#[ignore = "needs initdb and openssl: PostgreSQL's server package and openssl (CM_TEST_PG_BIN names another bin directory)"]
async fn verify_full_with_the_ca_migrates_creates_and_fires_a_routine() {
    let cluster = TlsCluster::start();
    let url = cluster.verified();

    ok(&url, &["migrate"]);
    ok(
        &url,
        &[
            "routine",
            "create",
            "--name",
            "over-tls",
            "--every",
            "1s",
            "--message",
            "hi",
        ],
    );

    // A whole `run`, its URL from a file (the path a deployment's secret takes), firing the
    // every-second routine into the outbox.
    let url_file = cluster.dir.join("database-url");
    std::fs::write(&url_file, format!("{url}\n")).unwrap();
    let log = cluster.dir.join("run.log");
    let mut command = cm_scheduler();
    command
        .env_remove("DATABASE_URL")
        .arg("--database-url-file")
        .arg(&url_file)
        .args(["run", "--tick-interval", "200ms"]);
    let mut scheduler = spawn_logged(&mut command, &[], &log);
    let fired = wait_until_blocking(
        "a fire of the routine, settled over TLS",
        Duration::from_secs(60),
        || {
            let out = cm(&url, &["fires", "--json"]);
            out.stdout
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|f| f["status"] == "fired")
                .count()
        },
        |fired| *fired > 0,
    );
    end_scheduler(&mut scheduler, &log);
    assert!(fired > 0);

    // The server saw TLS on the test's own connection too (sqlx, as the store builds it).
    let mut conn = PgConnection::connect(&url)
        .await
        .expect("connecting over TLS");
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(ssl);
}

#[tokio::test]
#[ignore = "needs initdb and openssl: PostgreSQL's server package and openssl (CM_TEST_PG_BIN names another bin directory)"]
async fn a_certificate_from_another_ca_is_refused_in_one_line() {
    let cluster = TlsCluster::start();
    let other = |mode: &str| {
        cluster.url(
            "postgres",
            "localhost",
            &format!(
                "sslmode={mode}&sslrootcert={}",
                cluster.file("other-ca.crt")
            ),
        )
    };
    check_fails(&other("verify-full"), &["migrate"], 1, UNKNOWN_CA);
    check_fails(&other("verify-ca"), &["migrate"], 1, UNKNOWN_CA);
    // Without `sslrootcert`, the system's roots are the trusted ones, and the test's CA is not
    // among them; given as the system's bundle (`SSL_CERT_FILE`), it is trusted.
    let system = cluster.url("postgres", "localhost", "sslmode=verify-full");
    check_fails(&system, &["migrate"], 1, UNKNOWN_CA);
    let mut with_bundle = cm_scheduler();
    with_bundle
        .env("SSL_CERT_FILE", cluster.file("ca.crt"))
        .args(["--database-url", &system, "migrate"]);
    let out = run(with_bundle);
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[tokio::test]
#[ignore = "needs initdb and openssl: PostgreSQL's server package and openssl (CM_TEST_PG_BIN names another bin directory)"]
async fn a_host_name_the_certificate_does_not_name_is_refused_under_verify_full() {
    let cluster = TlsCluster::start();
    let ca = format!("sslrootcert={}", cluster.file("ca.crt"));
    // The certificate names `localhost` only.
    let by_address = cluster.url(
        "postgres",
        "127.0.0.1",
        &format!("sslmode=verify-full&{ca}"),
    );
    check_fails(&by_address, &["migrate"], 1, OTHER_NAME);
    // The same asked through libpq's variables, the URL naming neither: without
    // PGSSLROOTCERT the CA would be unknown, without PGSSLMODE nothing would be verified.
    let bare = cluster.url("postgres", "127.0.0.1", "");
    let mut from_env = cm_scheduler();
    from_env
        .env("PGSSLMODE", "verify-full")
        .env("PGSSLROOTCERT", cluster.file("ca.crt"))
        .args(["--database-url", &bare, "migrate"]);
    let out = run(from_env);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains(OTHER_NAME), "{out:?}");
    // verify-ca checks the CA, not the name.
    let by_address = cluster.url("postgres", "127.0.0.1", &format!("sslmode=verify-ca&{ca}"));
    let out = migrate(&by_address);
    assert_eq!(out.code, Some(0), "{out:?}");
}

#[tokio::test]
#[ignore = "needs initdb and openssl: PostgreSQL's server package and openssl (CM_TEST_PG_BIN names another bin directory)"]
async fn a_connection_without_tls_is_refused_by_the_server_in_one_line() {
    let cluster = TlsCluster::start();
    let plain = cluster.url("postgres", "localhost", "sslmode=disable");
    check_fails(
        &plain,
        &["migrate"],
        1,
        "no encryption (the server may admit only TLS connections: set sslmode=verify-full",
    );
    // `require` encrypts without checking the certificate, and `prefer` (the default)
    // encrypts when the server offers it.
    for params in ["sslmode=require", "sslmode=prefer", ""] {
        let out = migrate(&cluster.url("postgres", "127.0.0.1", params));
        assert_eq!(out.code, Some(0), "{params}: {out:?}");
    }
}

#[tokio::test]
#[ignore = "needs initdb and openssl: PostgreSQL's server package and openssl (CM_TEST_PG_BIN names another bin directory)"]
async fn every_host_of_a_multi_host_url_is_verified() {
    let cluster = TlsCluster::start();
    let params = format!(
        "sslmode=verify-full&sslrootcert={}&target_session_attrs=read-write",
        cluster.file("ca.crt")
    );
    // The first host is refused (its name is not the certificate's), the second is used.
    let url = cluster.url("postgres", "127.0.0.1,localhost", &params);
    ok(&url, &["migrate"]);
    ok(&url, &["routine", "list"]);
    // No host qualifies: each is named with the TLS refusal.
    let url = cluster.url("postgres", "127.0.0.1,127.0.0.1", &params);
    let refused = format!("127.0.0.1:{} {OTHER_NAME}", cluster.port);
    check_fails(&url, &["routine", "list"], 1, &refused);
}

#[tokio::test]
#[ignore = "needs initdb and openssl: PostgreSQL's server package and openssl (CM_TEST_PG_BIN names another bin directory)"]
async fn a_client_certificate_is_sent_when_the_server_asks_for_one() {
    let cluster = TlsCluster::start();
    let mut admin = PgConnection::connect(&cluster.verified().replace("/cm?", "/postgres?"))
        .await
        .expect("connecting over TLS");
    sqlx::query("CREATE ROLE certified LOGIN SUPERUSER")
        .execute(&mut admin)
        .await
        .unwrap();
    let verified = format!("sslmode=verify-full&sslrootcert={}", cluster.file("ca.crt"));
    let with_cert = |name: &str| {
        cluster.url(
            "certified",
            "localhost",
            &format!(
                "{verified}&sslcert={}&sslkey={}",
                cluster.file(&format!("{name}.crt")),
                cluster.file(&format!("{name}.key"))
            ),
        )
    };
    check_fails(
        &cluster.url("certified", "localhost", &verified),
        &["migrate"],
        1,
        "certificate",
    );
    check_fails(
        &with_cert("other-client"),
        &["migrate"],
        1,
        "TLS: the server refused the handshake, often the client certificate",
    );
    let out = migrate(&with_cert("client"));
    assert_eq!(out.code, Some(0), "{out:?}");
}
