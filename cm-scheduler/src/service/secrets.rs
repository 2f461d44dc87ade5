//! The one scrubber between the binary and its output: every secret the operator configured (the
//! database URL's password, the webhook's secret and the token-bearing parts of its URL, the
//! status page's token, the NATS URL's user, password or token and its credentials file) is
//! registered here as it is read, and every log line and every error the binary prints passes
//! through [`scrub`] on its way out.
//!
//! Registering is process-wide, so a log line written by a library (sqlx, async-nats, reqwest)
//! is scrubbed like one of cm's own: the log writer ([`ScrubbingStderr`]) sees each formatted
//! line, human or JSON, before it reaches stderr.

use std::io::Write;
use std::sync::RwLock;

/// What a secret becomes wherever it would be printed.
const MASK: &str = "***";

/// Secrets shorter than this are not registered: a two-letter password would turn every word
/// containing it into a mask, and hides nothing worth hiding.
const MIN_SECRET_CHARS: usize = 3;

/// Every secret registered so far, longest first, so a secret containing another is masked whole.
static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Registers `secret`: from now on it is masked in everything the binary prints. It is masked as
/// written, trimmed, and as it reads escaped inside a JSON string (the JSON log format).
pub fn register(secret: &str) {
    let mut forms = vec![secret.to_string(), secret.trim().to_string()];
    for form in forms.clone() {
        let json = serde_json::to_string(&form).unwrap_or_default();
        let inner = json.strip_prefix('"').and_then(|j| j.strip_suffix('"'));
        forms.push(inner.unwrap_or_default().to_string());
    }
    let mut secrets = SECRETS.write().unwrap_or_else(|e| e.into_inner());
    for form in forms {
        if form.chars().count() >= MIN_SECRET_CHARS && !secrets.contains(&form) {
            secrets.push(form);
        }
    }
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
}

/// Every secret registered so far: what the run watch scrubs from the runs' output as well.
pub fn registered() -> Vec<String> {
    SECRETS.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Registers the secrets of a file of secret material: the whole of it, and each of its lines
/// (a NATS credentials file holds a JWT and a seed, each on a line of its own, between marker
/// lines that are not secret).
pub fn register_file(content: &str) {
    register(content);
    for line in content.lines().map(str::trim) {
        if !line.starts_with("---") && !line.contains("*****") {
            register(line);
        }
    }
}

/// Registers the secrets of a URL: its user (a NATS URL may carry a token there), its password,
/// its path and query (webhook endpoints often carry their token there), their percent-decoded
/// forms, and each path segment and query value long enough to be a token. Several URLs may be
/// given separated by commas (NATS servers).
pub fn register_url(text: &str) {
    for one in text.split(',').map(str::trim) {
        let Ok(url) = url::Url::parse(one) else {
            continue;
        };
        let decoded = |s: &str| percent_decode(s).unwrap_or_else(|| s.to_string());
        for part in [url.username(), url.password().unwrap_or("")] {
            register(part);
            register(&decoded(part));
        }
        if url.path() != "/" {
            register(url.path());
        }
        for segment in url.path_segments().into_iter().flatten() {
            if segment.chars().count() >= 16 {
                register(segment);
                register(&decoded(segment));
            }
        }
        if let Some(query) = url.query() {
            register(query);
            for (_, value) in url.query_pairs() {
                if value.chars().count() >= 4 {
                    register(&value);
                }
            }
        }
    }
}

/// `text` percent-decoded, if that changes it and yields UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let decoded: String = url::form_urlencoded::parse(format!("x={text}").as_bytes())
        .map(|(_, v)| v.into_owned())
        .next()?;
    (decoded != text).then_some(decoded)
}

/// `text` with every registered secret masked.
pub fn scrub(text: &str) -> String {
    let secrets = SECRETS.read().unwrap_or_else(|e| e.into_inner());
    let mut text = text.to_string();
    for secret in secrets.iter() {
        if text.contains(secret.as_str()) {
            text = text.replace(secret.as_str(), MASK);
        }
    }
    text
}

/// The log writer: each formatted log line is scrubbed, then written to stderr.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScrubbingStderr;

impl Write for ScrubbingStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // tracing-subscriber formats a whole event before writing it, so `buf` is one event:
        // a secret is never split between two writes.
        let text = String::from_utf8_lossy(buf);
        std::io::stderr().write_all(scrub(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for ScrubbingStderr {
    type Writer = ScrubbingStderr;

    fn make_writer(&'a self) -> Self::Writer {
        ScrubbingStderr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_secrets_are_masked_in_every_form() {
        register_url("nats://Sc4nNatsT0ken@127.0.0.1:4222,nats://u:Sc4nNatsP4ss@10.0.0.1:4222");
        register_url("https://hooks.example/services/T0/B0/Sc4nPathTokenLongEnough?sig=Sc4nSig");
        register_file("-----BEGIN NATS USER JWT-----\neyJSc4nJwt\n------END NATS USER JWT------\n");
        register("whsec_Sc4n\"quoted\"");
        for (text, expected) in [
            (
                "connect to nats://Sc4nNatsT0ken@127.0.0.1:4222 failed",
                "connect to nats://***@127.0.0.1:4222 failed",
            ),
            ("auth Sc4nNatsP4ss refused", "auth *** refused"),
            (
                "no route /services/T0/B0/Sc4nPathTokenLongEnough",
                "no route ***",
            ),
            ("token Sc4nPathTokenLongEnough", "token ***"),
            ("query sig=Sc4nSig", "query ***"),
            ("jwt eyJSc4nJwt", "jwt ***"),
            (
                "{\"secret\":\"whsec_Sc4n\\\"quoted\\\"\"}",
                "{\"secret\":\"***\"}",
            ),
            ("nothing secret here", "nothing secret here"),
        ] {
            assert_eq!(scrub(text), expected, "{text}");
        }
    }
}
