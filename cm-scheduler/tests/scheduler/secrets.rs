//! No configured secret reaches anything the binary prints: whole `cm-scheduler run` processes
//! started with every secret set (the database password, the webhook's secret and the token in
//! its URL's user, password, path and query, the status page's token, the NATS token, user,
//! password and credentials file), against connections that fail so that errors are printed,
//! in both log formats; everything they write on stdout and stderr is searched for each secret.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{SERVER, TestDb, cm_scheduler, eventually_within};

/// Every secret the runs below are given. Each is distinctive, so finding it anywhere in the
/// output can only mean it leaked.
const SECRETS: &[&str] = &[
    "DbPassCanary7",
    "HookUserCanary7",
    "HookPassCanary7",
    "HookPathTokenCanary7xyz",
    "HookQueryCanary7",
    // The webhook secret file's content, `whsec_` + base64 of "WebhookKeyCanary7".
    "V2ViaG9va0tleUNhbmFyeTc",
    "HttpTokenCanary7",
    "NatsTokenCanary7",
    "NatsUserCanary7",
    "NatsPassCanary7",
    "eyJ0eXAiOiJKV1QiNatsJwtCanary7",
];

/// A file in the test's own directory holding `content`.
fn secret_file(dir: &std::path::Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).expect("writing a secret file");
    path.display().to_string()
}

/// A NATS user seed (`SU…`) in its documented encoding: the seed and user prefixes, 32 bytes of
/// key, a CRC-16/XMODEM, in unpadded base32. async-nats checks it when it reads the file.
fn nats_user_seed() -> String {
    // The seed prefix (18 << 3) carries the user prefix (20 << 3) in its low bits.
    const SEED: u8 = 18 << 3;
    const USER: u8 = 20 << 3;
    let mut raw = vec![SEED | (USER >> 5), (USER & 31) << 3];
    raw.extend(*uuid::Uuid::new_v4().as_bytes());
    raw.extend(*uuid::Uuid::new_v4().as_bytes());
    let mut crc: u16 = 0;
    for byte in &raw {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    raw.extend(crc.to_le_bytes());
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::new();
    let (mut buffer, mut bits) = (0u32, 0);
    for byte in raw {
        buffer = (buffer << 8) | u32::from(byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((buffer << (5 - bits)) & 31) as usize]));
    }
    out
}

/// Runs `cm-scheduler args`, lets it run until it exits or its output contains `until` (at most
/// 30 s), stops it with SIGTERM, and returns everything it printed.
async fn output_of(args: &[String], until: &str) -> String {
    let dir = std::env::temp_dir().join(format!("cm-secrets-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("creating the log directory");
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = cm_scheduler()
        .env("RUST_LOG", "debug")
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"))
        .spawn()
        .expect("starting cm-scheduler");
    let printed = || {
        std::fs::read_to_string(&out).unwrap_or_default()
            + &std::fs::read_to_string(&err).unwrap_or_default()
    };
    eventually_within(Duration::from_secs(30), async || {
        let exited = child.try_wait().expect("polling cm-scheduler").is_some();
        (exited || printed().contains(until)).then_some(())
    })
    .await;
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .stderr(Stdio::null())
        .status();
    let stopped = eventually_within(Duration::from_secs(15), async || {
        child.try_wait().expect("polling cm-scheduler")
    })
    .await;
    if stopped.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let text = printed();
    let _ = std::fs::remove_dir_all(&dir);
    text
}

/// Asserts `text` holds none of [`SECRETS`], and that it holds `expected` (so the run really got
/// as far as printing what could have leaked).
#[track_caller]
fn check(what: &str, text: &str, expected: &str) {
    assert!(
        text.contains(expected),
        "{what}: the output lacks {expected:?}:\n{text}"
    );
    for secret in SECRETS {
        assert!(
            !text.contains(secret),
            "{what}: {secret} was printed:\n{text}"
        );
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn no_configured_secret_is_ever_printed() {
    let db = TestDb::new().await;
    let dir =
        std::env::temp_dir().join(format!("cm-secret-files-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let webhook_secret = secret_file(&dir, "webhook.secret", "whsec_V2ViaG9va0tleUNhbmFyeTc=\n");
    let http_token = secret_file(&dir, "http.token", "HttpTokenCanary7\n");
    let creds = secret_file(
        &dir,
        "nats.creds",
        &format!(
            "-----BEGIN NATS USER JWT-----\neyJ0eXAiOiJKV1QiNatsJwtCanary7\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            nats_user_seed()
        ),
    );
    let webhook_url = "https://HookUserCanary7:HookPassCanary7@127.0.0.1:1/services/T0/B0/\
                       HookPathTokenCanary7xyz?token=HookQueryCanary7";
    // Trust authentication ignores the password, so the database answers with it in the URL.
    let with_password = db.url.replacen("postgres@", "postgres:DbPassCanary7@", 1);
    let down = format!(
        "{}/nowhere",
        SERVER.replacen(
            "postgres@127.0.0.1:5432",
            "postgres:DbPassCanary7@127.0.0.1:1",
            1
        )
    );
    let created = cm_scheduler()
        .args([
            "--database-url",
            &with_password,
            "routine",
            "create",
            "--name",
            "every-second",
        ])
        .args(["--schedule", "* * * * * *", "--message", "hello"])
        .output()
        .expect("creating a routine");
    assert!(created.status.success(), "{created:?}");

    let webhook = |url: &str, format: &str| {
        strings(&[
            "--database-url",
            url,
            "run",
            "--log-format",
            format,
            "--tick-interval",
            "200ms",
            "--lease",
            "4s",
            "--dispatch-timeout",
            "1s",
            "--listen",
            "127.0.0.1:0",
            "--http-token-file",
            &http_token,
            "--message-backend",
            "webhook",
            "--webhook-url",
            webhook_url,
            "--webhook-secret-file",
            &webhook_secret,
        ])
    };
    for format in ["human", "json"] {
        // The database down: its connection errors, and the webhook endpoint logged at start.
        let text = output_of(&webhook(&down, format), "does not answer yet").await;
        check(&format!("database down, {format}"), &text, "127.0.0.1:1");
        // The database up and the webhook refusing connections: the dispatch errors.
        let text = output_of(&webhook(&with_password, format), "dispatch failed").await;
        check(
            &format!("webhook refused, {format}"),
            &text,
            "dispatch failed",
        );
    }

    // NATS: a token, and a user and password, with a credentials file; the server refuses.
    for url in [
        "nats://NatsTokenCanary7@127.0.0.1:1",
        "nats://NatsUserCanary7:NatsPassCanary7@127.0.0.1:1",
    ] {
        for format in ["human", "json"] {
            let args = strings(&[
                "--database-url",
                &with_password,
                "run",
                "--log-format",
                format,
                "--message-backend",
                "nats",
                "--nats-url",
                url,
                "--nats-credentials-file",
                &creds,
            ]);
            let text = output_of(&args, "cannot connect to NATS").await;
            check(&format!("{url}, {format}"), &text, "cannot connect to NATS");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A database password with an unencoded `/` or `?` makes the URL unreadable (its start reads
/// as a host and a port), and the refusal that quotes the URL masks it all the same, given
/// through the flag, the environment or a file. No database is reached: the URL is refused
/// before anything connects.
#[test]
fn a_password_the_url_cannot_hold_is_masked_in_the_refusal() {
    let dir = std::env::temp_dir().join(format!("cm-url-pw-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    for (url, password) in [
        ("postgres://postgres:se/cret99@127.0.0.1:1/x", "se/cret99"),
        ("postgres://postgres:pa?ss99@127.0.0.1:1/x", "pa?ss99"),
        (
            "postgresql://app:pa@ss:x/w0rd!@127.0.0.1:1/x",
            "pa@ss:x/w0rd!",
        ),
    ] {
        let file = secret_file(&dir, "database-url", &format!("{url}\n"));
        let mut flag = cm_scheduler();
        flag.args(["--database-url", url, "routine", "list"]);
        let mut env = cm_scheduler();
        env.env("DATABASE_URL", url).args(["routine", "list"]);
        let mut from_file = cm_scheduler();
        from_file.env_remove("DATABASE_URL").args([
            "--database-url-file",
            &file,
            "routine",
            "list",
        ]);
        for command in [flag, env, from_file] {
            let out = crate::cli::run(command);
            assert_eq!(out.code, Some(2), "{url}: {out:?}");
            assert!(
                out.stderr.contains("invalid --database-url") && out.stderr.contains(":***@"),
                "{url}: {out:?}"
            );
            for piece in [password, "cret99", "ss99", "w0rd"] {
                assert!(!out.stderr.contains(piece), "{url}: {piece} in {out:?}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
