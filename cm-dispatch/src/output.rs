//! What a run printed, as cm keeps it: the last [`MAX_RUN_OUTPUT`] bytes, cut at a line start,
//! read as lossy UTF-8, with secrets scrubbed ([`scrub_output`]).
//!
//! A runtime hands over the end of a run's output ([`kept_output`]); how it reads that end
//! without reading the whole output is its own (a seek in a log file, a tail of lines from the
//! engine or the API server, `TAIL_LINES` under `FETCH_LIMIT`).

use std::sync::LazyLock;

use regex::{Captures, Regex};

use crate::runtime::MAX_RUN_OUTPUT;

mod secret_rules;

/// What a secret becomes in a run's output.
const MASK: &str = "***";

/// Entries of `known` shorter than this are not masked: a two-letter password would turn every
/// word containing it into a mask, and hides nothing worth hiding.
const MIN_KNOWN_BYTES: usize = 4;

/// The most bytes a runtime reads of a run's output for one try: a tail of lines whose answer
/// reaches it was cut by the limit (the API server cuts a log at `limitBytes` from its start),
/// and is asked again with fewer lines. Only the container backends read a tail.
#[cfg(any(feature = "docker", feature = "kubernetes"))]
pub(crate) const FETCH_LIMIT: usize = 4 * MAX_RUN_OUTPUT;

/// The tails of lines a runtime asks for, in turn, until one comes back under [`FETCH_LIMIT`]:
/// the first holds a typical run's last 16 KiB whole, the later ones runs of ever longer lines.
#[cfg(any(feature = "docker", feature = "kubernetes"))]
pub(crate) const TAIL_LINES: [usize; 5] = [500, 100, 20, 4, 1];

/// The output kept of a run whose output ends with `end`: `starts_at_line` says whether `end`
/// begins at a line start (the whole output, or a tail of whole lines), as opposed to anywhere
/// in a line (a seek into a file). The result is at most [`MAX_RUN_OUTPUT`] bytes, starts at a
/// line start when it was cut (a line longer than the whole is cut at a character instead),
/// and has its secrets scrubbed.
pub(crate) fn kept_output(end: &[u8], starts_at_line: bool) -> String {
    let text = String::from_utf8_lossy(cut(end, starts_at_line));
    let scrubbed = scrub_output(&text, &[]);
    if scrubbed.len() <= MAX_RUN_OUTPUT {
        return scrubbed;
    }
    // Invalid bytes read as U+FFFD and masks may have made it longer: cut once more, at a line
    // start of text that is valid UTF-8 now.
    String::from_utf8_lossy(cut(scrubbed.as_bytes(), true)).into_owned()
}

/// The last [`MAX_RUN_OUTPUT`] bytes of `end` or fewer, starting at a line start when they
/// could not all be kept.
fn cut(end: &[u8], starts_at_line: bool) -> &[u8] {
    if starts_at_line && end.len() <= MAX_RUN_OUTPUT {
        return end;
    }
    let start = end.len().saturating_sub(MAX_RUN_OUTPUT);
    let window = &end[start..];
    let at_line_start = if start == 0 {
        starts_at_line
    } else {
        end[start - 1] == b'\n'
    };
    if at_line_start {
        return window;
    }
    // Drop the partial first line, unless nothing would be left (one line longer than all
    // that is kept): that line is then cut at a character.
    match window.iter().position(|&b| b == b'\n') {
        Some(newline) if newline + 1 < window.len() => &window[newline + 1..],
        _ => {
            let continuation = window
                .iter()
                .take(3)
                .take_while(|&&b| b & 0xC0 == 0x80)
                .count();
            &window[continuation..]
        }
    }
}

/// A name that says its value is a secret: `password`, `DB_PASSWORD`, `github_token`,
/// `client-secret`, `api_key`, `X-Api-Key`, `aws_secret_access_key`, a kubeconfig's
/// `client-key-data`, an Azure connection string's `AccountKey`.
const SECRET_NAME: &str = r"[A-Za-z0-9_.\-]*(?:password|passwd|passphrase|token|secret|api[_\-]?key|access[_\-]?key|private[_\-]?key|client[_\-]?key|account[_\-]?key|credentials?)[A-Za-z0-9_.\-]*";

/// PEM private key blocks, whole or cut at the output's end.
static PEM_BLOCK: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?s)-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)",
    )
    .expect("a valid pattern")
});

/// The end of a PEM private key whose start was cut away with the output's start.
static PEM_END: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?s)\A.*-----END [A-Z0-9 ]*PRIVATE KEY-----").expect("a valid pattern")
});

/// What a PEM private key block becomes.
const PEM_MASK: &str = "[private key ***]";

/// The password of a URL's user information: `scheme://user:PASSWORD@host`. A password may
/// hold an `@`, so it runs to the authority's last `@` (before a `/`, a space or a quote).
static URL_PASSWORD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?i)\b([a-z][a-z0-9+.\-]*://[^:/@\s]*:)[^\s/"'<>`]+@"#).expect("a valid pattern")
});

/// An `Authorization` (or `Proxy-Authorization`) header's credentials, with or without their
/// scheme, as a header, a key=value or a JSON member.
static AUTHORIZATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?i)\b((?:proxy-)?authorization["']?\s*[:=]\s*["']?\s*(?:(?:bearer|basic|token|digest)\s+)?)[^\s"',;]+"#,
    )
    .expect("a valid pattern")
});

/// A JSON member whose name says its value is a secret: `"password": "…"`, `"token": 123`,
/// and a Docker config's `"auth": "…"` (a registry's user and password in base64).
static JSON_SECRET: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r#"(?i)("(?:{SECRET_NAME}|auth)"\s*:\s*)(?:"(?:[^"\\\n]|\\.)*"|[^\s,}}\]]+)"#
    ))
    .expect("a valid pattern")
});

/// A `key=value` or `key: value` whose key says its value is a secret, the value bare or
/// quoted: `password=hunter2`, `GITHUB_TOKEN='x'`, `?api_key=x&`, `secret: x`. A key inside a
/// URL's authority (`https://x-access-token:…@host`) is the URL pattern's.
static KEY_VALUE_SECRET: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r#"(?im)(^|[^A-Za-z0-9_.\-/:])({SECRET_NAME}\s*[=:]\s*)("[^"\n]*"|'[^'\n]*'|[^\s"'&,;]+)"#
    ))
    .expect("a valid pattern")
});

/// Scrubs secrets from a run's output: URL passwords (`scheme://user:PASSWORD@host` becomes
/// `scheme://user:***@host`, a password holding `@` masked through the last one), `Authorization:
/// Bearer|Basic X` values, `password=`, `token=`, `secret=`, `api_key=` style key=value (and
/// `key: value`) and `"password": "…"` JSON values (case-insensitive; any key containing one of
/// those words, `DB_PASSWORD=`, `github_token:`, a kubeconfig's `client-key-data:`, a Docker
/// config's `"auth"`), PEM private key blocks (also one whose start or end was cut off), the
/// rules of its `secret_rules` table (a token as a URL's user, Slack and Discord webhook paths,
/// `.npmrc` and `.netrc` credentials, `mysql -pX`, `curl -u user:X`, and the token shapes of
/// GitHub, GitLab, Slack, Stripe, Google, SendGrid, npm, PyPI, AWS, Anthropic, OpenAI and
/// others, JSON Web Tokens), and every string of `known` (the scheduler's own secrets, e.g. its
/// database password; entries shorter than 4 bytes are ignored). Each becomes `***` (a token
/// keeps its prefix: `ghp_***`); text without secrets is returned unchanged, and scrubbing
/// scrubbed text changes nothing.
pub fn scrub_output(text: &str, known: &[&str]) -> String {
    let mut text = text.to_owned();
    let mut known: Vec<&str> = known
        .iter()
        .copied()
        .filter(|k| k.len() >= MIN_KNOWN_BYTES)
        .collect();
    // The longest first, so a secret containing another is masked whole.
    known.sort_by_key(|k| std::cmp::Reverse(k.len()));
    for secret in known {
        if text.contains(secret) {
            text = text.replace(secret, MASK);
        }
    }
    let mut replace = |pattern: &Regex, with: &dyn Fn(&Captures<'_>) -> String| {
        if pattern.is_match(&text) {
            text = pattern
                .replace_all(&text, |c: &Captures<'_>| with(c))
                .into_owned();
        }
    };
    replace(&PEM_BLOCK, &|_| PEM_MASK.to_owned());
    replace(&PEM_END, &|_| PEM_MASK.to_owned());
    replace(&URL_PASSWORD, &|c| format!("{}{MASK}@", &c[1]));
    replace(&AUTHORIZATION, &|c| format!("{}{MASK}", &c[1]));
    replace(&JSON_SECRET, &|c| format!("{}\"{MASK}\"", &c[1]));
    replace(&KEY_VALUE_SECRET, &|c| {
        let quote = match c[3].chars().next() {
            Some(q @ ('"' | '\'')) => q.to_string(),
            _ => String::new(),
        };
        format!("{}{}{quote}{MASK}{quote}", &c[1], &c[2])
    });
    if let Some(masked) = secret_rules::mask(&text) {
        text = masked;
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrubbed(text: &str) -> String {
        scrub_output(text, &[])
    }

    #[test]
    fn url_passwords_are_masked_and_the_rest_of_the_url_kept() {
        assert_eq!(
            scrubbed("connecting to postgres://cm:s3cr3t-pw@db.internal:5432/cm now"),
            "connecting to postgres://cm:***@db.internal:5432/cm now"
        );
        assert_eq!(
            scrubbed("git clone https://x-access-token:abc123@github.com/o/r.git"),
            "git clone https://x-access-token:***@github.com/o/r.git"
        );
        assert_eq!(
            scrubbed("AMQP_URL=amqp://guest:guest@rabbit/"),
            "AMQP_URL=amqp://guest:***@rabbit/"
        );
        // A port, a user without a password, an @ in a path: no password.
        for kept in [
            "https://example.com:8443/path",
            "ssh://git@example.com/repo.git",
            "https://example.com:8443/users/@me",
        ] {
            assert_eq!(scrubbed(kept), kept);
        }
    }

    #[test]
    fn authorization_values_are_masked() {
        assert_eq!(
            scrubbed("> Authorization: Bearer eyJhbGciOi.abc.def\n"),
            "> Authorization: Bearer ***\n"
        );
        assert_eq!(
            scrubbed("authorization: basic dXNlcjpwYXNz"),
            "authorization: basic ***"
        );
        assert_eq!(
            scrubbed(r#"{"Authorization": "Bearer abc.def", "x": 1}"#),
            r#"{"Authorization": "Bearer ***", "x": 1}"#
        );
        assert_eq!(
            scrubbed("Proxy-Authorization: Basic Zm9vOmJhcg=="),
            "Proxy-Authorization: Basic ***"
        );
    }

    #[test]
    fn secret_keys_have_their_values_masked_whatever_their_case() {
        for (text, expected) in [
            ("password=hunter2 next", "password=*** next"),
            ("PASSWORD=hunter2", "PASSWORD=***"),
            ("DB_PASSWORD = 'hunter 2'", "DB_PASSWORD = '***'"),
            (
                "export GITHUB_TOKEN=\"abc def\"",
                "export GITHUB_TOKEN=\"***\"",
            ),
            (
                "GET /hook?token=abc123&page=2",
                "GET /hook?token=***&page=2",
            ),
            ("client_secret: s3cr3t", "client_secret: ***"),
            ("api_key=k-123;", "api_key=***;"),
            ("X-Api-Key: 0123456789", "X-Api-Key: ***"),
            (
                "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG",
                "aws_secret_access_key=***",
            ),
        ] {
            assert_eq!(scrubbed(text), expected, "{text}");
        }
    }

    #[test]
    fn json_secret_members_are_masked() {
        assert_eq!(
            scrubbed(r#"{"user": "cm", "password": "p\"w d", "Token": 12345, "n": 2}"#),
            r#"{"user": "cm", "password": "***", "Token": "***", "n": 2}"#
        );
        assert_eq!(
            scrubbed(r#"{"db":{"adminPassword":"x"}}"#),
            r#"{"db":{"adminPassword":"***"}}"#
        );
    }

    #[test]
    fn well_known_token_shapes_are_masked() {
        let ghp = format!("ghp_{}", "a1B2c3D4e5".repeat(4));
        let pat = format!("github_pat_11ABCDEFG0{}", "x_Y9".repeat(10));
        for (text, expected) in [
            (format!("using {ghp} to push"), "using ghp_*** to push"),
            (format!("pat {pat}"), "pat github_pat_***"),
            (
                "key id AKIAIOSFODNN7EXAMPLE in use".to_owned(),
                "key id AKIA*** in use",
            ),
            (
                "slack xoxb-123456789012-abcdefABCDEF posted".to_owned(),
                "slack xoxb-*** posted",
            ),
            (
                "slack xoxp-1234-5678-9012-abcdef".to_owned(),
                "slack xoxp-***",
            ),
            ("glpat-abcdefghij0123456789 ok".to_owned(), "glpat-*** ok"),
            (
                "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abcdefghijklmnop end".to_owned(),
                "jwt *** end",
            ),
        ] {
            assert_eq!(scrubbed(&text), expected, "{text}");
        }
    }

    /// Each leak the review of the scrubber found (issue 49), with what it must become. Every
    /// case is checked, and all that fail are reported together.
    #[test]
    fn the_leaks_found_in_review_are_masked() {
        let ghp = format!(
            "ghp_{}",
            "Ab3dE5gH7j".repeat(4).get(..36).unwrap_or_default()
        );
        let ghs = format!(
            "ghs_{}",
            "Zy9xW8vU7t".repeat(4).get(..36).unwrap_or_default()
        );
        let npm = format!(
            "npm_{}",
            "Np4mT0kEn9".repeat(4).get(..36).unwrap_or_default()
        );
        let oauth = "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567";
        let cases: Vec<(String, String)> = vec![
            // A password holding `@`: masked through the authority's last `@`.
            (
                "connect postgresql://app:pa@ss-w0rd!@db/app failed".into(),
                "connect postgresql://app:***@db/app failed".into(),
            ),
            // .npmrc
            (
                format!("//registry.npmjs.org/:_authToken={npm}"),
                "//registry.npmjs.org/:_authToken=***".into(),
            ),
            (format!("token {npm} in use"), "token npm_*** in use".into()),
            // A token as the URL's user, or as the password of a conventional user.
            (
                format!("git clone https://{ghp}@github.com/o/r.git"),
                "git clone https://***@github.com/o/r.git".into(),
            ),
            (
                format!("remote: https://{oauth}@github.com/o/r"),
                "remote: https://***@github.com/o/r".into(),
            ),
            (
                format!("https://x-access-token:{ghs}@github.com/o/r.git"),
                "https://x-access-token:***@github.com/o/r.git".into(),
            ),
            // A Slack incoming webhook: its path is its credential.
            (
                "POST https://hooks.slack.com/services/T0ABCDEFG/B0HIJKLMN/aBcDeFgHiJkLmNoPqRsTuVwX"
                    .into(),
                "POST https://hooks.slack.com/services/***".into(),
            ),
            // A kubeconfig's client key.
            (
                "    client-key-data: LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQo=\n".into(),
                "    client-key-data: ***\n".into(),
            ),
            // A Docker config's registry credentials.
            (
                r#"{"auths": {"registry.example.com": {"auth": "dXNlcjpwYXNzd29yZA=="}}}"#.into(),
                r#"{"auths": {"registry.example.com": {"auth": "***"}}}"#.into(),
            ),
            // .netrc, on one line and over several.
            (
                "machine github.com login me password s3cr3t-pw".into(),
                "machine github.com login me password ***".into(),
            ),
            (
                "machine api.example.com\n  login me\n  password hunter2\n".into(),
                "machine api.example.com\n  login me\n  password ***\n".into(),
            ),
            // The MySQL clients' password glued to -p.
            (
                "+ mysql -h db -u root -pS3cr3tPw app < dump.sql".into(),
                "+ mysql -h db -u root -p*** app < dump.sql".into(),
            ),
            (
                "mysqldump -uroot -pS3cr3tPw --all-databases".into(),
                "mysqldump -uroot -p*** --all-databases".into(),
            ),
            // curl's user and password.
            (
                "+ curl -fsS -u deploy:s3cr3t-pw https://api.example.com/x".into(),
                "+ curl -fsS -u deploy:*** https://api.example.com/x".into(),
            ),
            (
                "curl --user \"deploy:s3cr3t\" https://api.example.com/x".into(),
                "curl --user \"deploy:***\" https://api.example.com/x".into(),
            ),
            // Stripe, Google and SendGrid keys.
            (
                "stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc charged".into(),
                "stripe sk_live_*** charged".into(),
            ),
            (
                "restricted rk_live_51H8xYzAbCdEfGhIjKlMnOpQr ok".into(),
                "restricted rk_live_*** ok".into(),
            ),
            (
                "maps key=AIzaSyDdI0hCZtE6vySjMm-WEfRq3CPzqKqqsHI&x=1".into(),
                "maps key=AIza***&x=1".into(),
            ),
            (
                "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 mailed"
                    .into(),
                "SG.*** mailed".into(),
            ),
        ];
        // A case fails if it is not masked as expected, or if masking it again changes it.
        let failed: Vec<String> = cases
            .iter()
            .filter(|(text, expected)| {
                scrubbed(text) != *expected || scrubbed(expected) != *expected
            })
            .map(|(text, expected)| {
                format!(
                    "{text:?}\n   became {:?}\n expected {expected:?}",
                    scrubbed(text)
                )
            })
            .collect();
        assert!(
            failed.is_empty(),
            "{} of {} leaks:\n{}",
            failed.len(),
            cases.len(),
            failed.join("\n")
        );
    }

    #[test]
    fn pem_private_keys_are_masked_whole_or_cut() {
        let key = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7\nbase64base64==\n\
                   -----END RSA PRIVATE KEY-----";
        assert_eq!(
            scrubbed(&format!("before\n{key}\nafter\n")),
            "before\n[private key ***]\nafter\n"
        );
        assert_eq!(
            scrubbed("x\n-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n"),
            "x\n[private key ***]"
        );
        assert_eq!(
            scrubbed("MIIEvQIBADANBg\nabc\n-----END OPENSSH PRIVATE KEY-----\ndone\n"),
            "[private key ***]\ndone\n"
        );
        // A public key or a certificate is no secret.
        let public = "-----BEGIN PUBLIC KEY-----\nMFkwEwYH\n-----END PUBLIC KEY-----\n";
        assert_eq!(scrubbed(public), public);
    }

    #[test]
    fn known_secrets_are_masked_and_short_ones_ignored() {
        assert_eq!(
            scrub_output(
                "login with pg-Pass-9 and pg-Pass-9x failed; ab cd",
                &["pg-Pass-9", "pg-Pass-9x", "ab", "abc"]
            ),
            "login with *** and *** failed; ab cd"
        );
        assert_eq!(scrub_output("nothing here", &["", "zzzz"]), "nothing here");
    }

    #[test]
    fn ordinary_output_is_untouched_and_scrubbing_is_idempotent() {
        let ordinary = "\
Cloning into 'repo'...
Compiling cm v0.1.0 (/src/cm)
    Finished `release` profile [optimized] target(s) in 42.17s
2026-03-29T01:30:00.123Z INFO processed 42 tokens in 3s (token count stable)
GET https://api.example.com:443/v1/items?page=2&limit=50 -> 200
the password reset flow sent 3 mails; secrets are rotated weekly
key: value, name=report, user=cm, ssh://git@example.com/r.git
{\"status\": \"ok\", \"exit_code\": 3, \"keys\": [\"a\", \"b\"]}
-----BEGIN CERTIFICATE-----
MIIBszCCAVmgAwIBAgIUU
-----END CERTIFICATE-----
ünïcödé ✓ 日本語 Error: exit code 3
";
        assert_eq!(scrubbed(ordinary), ordinary);
        let secrets = "postgres://u:pw@h/ password=x token: y {\"secret\": \"z\"} \
                       Authorization: Bearer abc ghp_0123456789012345678901234567890123 \
                       AKIAIOSFODNN7EXAMPLE xoxb-0123456789-abc";
        let once = scrub_output(secrets, &["abc1"]);
        assert_eq!(scrub_output(&once, &["abc1"]), once);
        for secret in [
            "pw@",
            "=x",
            "y ",
            "\"z\"",
            "Bearer abc",
            "0123456789012",
            "IOSFODNN",
        ] {
            assert!(!once.contains(secret), "{secret} in {once}");
        }
    }

    #[test]
    fn a_short_output_is_kept_whole() {
        assert_eq!(kept_output(b"one\ntwo\n", true), "one\ntwo\n");
        assert_eq!(kept_output(b"", true), "");
        // The end of a file read from its start is whole.
        assert_eq!(
            kept_output(b"no newline at the end", true),
            "no newline at the end"
        );
    }

    #[test]
    fn a_mebibyte_of_output_is_cut_to_its_last_lines_at_a_line_start() {
        let mut log = String::new();
        let mut n = 0;
        while log.len() < 1024 * 1024 {
            log.push_str(&format!(
                "line {n:06} of the run's output, some more words\n"
            ));
            n += 1;
        }
        for starts_at_line in [true, false] {
            let kept = kept_output(log.as_bytes(), starts_at_line);
            assert!(kept.len() <= MAX_RUN_OUTPUT, "{}", kept.len());
            assert!(kept.len() > MAX_RUN_OUTPUT - 100, "{}", kept.len());
            assert!(kept.starts_with("line "), "{}", &kept[..40]);
            assert!(log.ends_with(&kept));
            assert!(kept.ends_with(&format!(
                "line {:06} of the run's output, some more words\n",
                n - 1
            )));
        }
        // A window that falls just after a newline keeps its first line.
        let lines: String = (0..4000).map(|i| format!("{i:07}\n")).collect();
        let kept = kept_output(lines.as_bytes(), false);
        assert_eq!(kept.len(), MAX_RUN_OUTPUT);
        assert!(lines.ends_with(&kept));
    }

    #[test]
    fn multi_byte_characters_at_the_cut_are_never_split() {
        // Lines of three-byte characters, so the window starts inside one.
        let line = format!("{}\n", "日".repeat(100));
        let log = line.repeat(200);
        let kept = kept_output(log.as_bytes(), true);
        assert!(kept.len() <= MAX_RUN_OUTPUT);
        assert!(kept.starts_with('日'));
        assert!(!kept.contains('\u{FFFD}'));
        assert!(log.ends_with(&kept));
        // One line longer than all that is kept is cut at a character, not inside one.
        let long = "€".repeat(MAX_RUN_OUTPUT);
        let kept = kept_output(long.as_bytes(), false);
        assert!(kept.len() <= MAX_RUN_OUTPUT);
        assert!(kept.chars().all(|c| c == '€'), "{:?}", &kept[..9]);
        // Invalid UTF-8 reads as U+FFFD and still fits.
        let invalid = vec![0xFFu8; 2 * MAX_RUN_OUTPUT];
        let kept = kept_output(&invalid, true);
        assert!(kept.len() <= MAX_RUN_OUTPUT, "{}", kept.len());
        assert!(kept.chars().all(|c| c == '\u{FFFD}'));
    }

    #[test]
    fn the_kept_output_is_scrubbed() {
        let mut log = "x".repeat(100) + "\n";
        log.push_str("-----BEGIN PRIVATE KEY-----\n");
        log.push_str(&"QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=\n".repeat(1000));
        log.push_str("-----END PRIVATE KEY-----\npassword=hunter2\nbye\n");
        let kept = kept_output(log.as_bytes(), true);
        // The key's start was cut away with the output's start: its end still masks it.
        assert_eq!(kept, "[private key ***]\npassword=***\nbye\n");
    }
}
