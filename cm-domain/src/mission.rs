//! The mission file: what a mission routine asks a container to do, validated before it is stored.
//!
//! A mission routine's payload is a JSON object (DESIGN.md, "Missions"):
//!
//! ```json
//! { "repository": "https://git.example.com/team/repo.git",
//!   "ref": "main",
//!   "task": "Refresh the dependency report",
//!   "env": { "REPORT_FORMAT": "markdown" },
//!   "labels": { "team": "platform" } }
//! ```
//!
//! [`Mission::from_json`] accepts it only if every field is well formed, so a routine that was
//! created is one a backend can launch. Every refusal is a [`MissionError`] naming the field.
//! The file never chooses where the scheduler connects: image, command, resources and
//! credentials are the operator's, so no field of it is one of those.
//!
//! # Example
//!
//! ```
//! use cm_domain::Mission;
//!
//! let mission = Mission::from_json(
//!     r#"{"repository": "git@git.example.com:team/repo.git", "task": "lint"}"#,
//! ).unwrap();
//! assert_eq!(mission.repository(), "git@git.example.com:team/repo.git");
//!
//! let err = Mission::from_json(r#"{"repository": "file:///etc", "task": "lint"}"#).unwrap_err();
//! assert_eq!(err.field(), Some("repository"));
//! ```

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

/// The most bytes a mission file may hold.
pub const MAX_MISSION_BYTES: usize = 256 * 1024;
/// The most bytes of `task` (64 KiB): it reaches the mission as `CM_TASK`, and Linux refuses a
/// single environment string over 128 KiB.
pub const MAX_TASK_BYTES: usize = 64 * 1024;
/// The most characters of `repository`.
pub const MAX_REPOSITORY_CHARS: usize = 2048;
/// The most bytes of `ref` (git allows longer; no real branch or tag comes near it).
pub const MAX_REF_BYTES: usize = 255;
/// The most variables in `env`.
pub const MAX_ENV_VARS: usize = 64;
/// The most characters of one variable's name.
pub const MAX_ENV_NAME_CHARS: usize = 128;
/// The most bytes of one variable's value.
pub const MAX_ENV_VALUE_BYTES: usize = 8 * 1024;
/// The most entries in `labels`.
pub const MAX_LABELS: usize = 32;
/// The most characters of a label's name and of its value, as Kubernetes allows.
pub const MAX_LABEL_CHARS: usize = 63;

/// The prefix of the environment variables cm itself gives every mission.
pub const RESERVED_ENV_PREFIX: &str = "CM_";
/// The prefix of the labels cm itself gives every mission.
pub const RESERVED_LABEL_PREFIX: &str = "cm.";

const FIELDS: [&str; 5] = ["repository", "ref", "task", "env", "labels"];

/// A validated mission file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mission {
    repository: String,
    git_ref: Option<String>,
    task: String,
    env: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
}

/// Why a mission file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MissionError {
    /// The text is not JSON.
    #[error("the mission is not valid JSON: {0}")]
    NotJson(String),
    /// The JSON is not an object.
    #[error("the mission must be a JSON object")]
    NotAnObject,
    /// The text is larger than [`MAX_MISSION_BYTES`].
    #[error("the mission is {0} bytes; at most {MAX_MISSION_BYTES} are allowed")]
    TooLarge(usize),
    /// One field is missing, unknown or malformed.
    #[error("mission field \"{field}\": {reason}")]
    Field {
        /// The field, with the key inside `env` or `labels` where it is one of those
        /// (`env.CM_TASK`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl MissionError {
    /// The field the error is about, if it is about one.
    pub fn field(&self) -> Option<&str> {
        match self {
            MissionError::Field { field, .. } => Some(field),
            _ => None,
        }
    }
}

fn refuse(field: impl Into<String>, reason: impl Into<String>) -> MissionError {
    MissionError::Field {
        field: field.into(),
        reason: reason.into(),
    }
}

impl Mission {
    /// Parses and validates a mission file's text.
    pub fn from_json(text: &str) -> Result<Mission, MissionError> {
        if text.len() > MAX_MISSION_BYTES {
            return Err(MissionError::TooLarge(text.len()));
        }
        let value: Value =
            serde_json::from_str(text).map_err(|e| MissionError::NotJson(e.to_string()))?;
        Mission::from_value(&value)
    }

    /// Validates a mission already parsed as JSON (a stored routine's payload).
    pub fn from_value(value: &Value) -> Result<Mission, MissionError> {
        let object = value.as_object().ok_or(MissionError::NotAnObject)?;
        if let Some(unknown) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(refuse(
                unknown.as_str(),
                format!("unknown field (allowed: {})", FIELDS.join(", ")),
            ));
        }
        let repository = required_string(object, "repository")?;
        check_repository(repository)?;
        let git_ref = optional_string(object, "ref")?;
        if let Some(git_ref) = git_ref {
            check_ref(git_ref)?;
        }
        let task = required_string(object, "task")?;
        if task.trim().is_empty() {
            return Err(refuse("task", "must not be empty"));
        }
        if task.len() > MAX_TASK_BYTES {
            return Err(refuse(
                "task",
                format!(
                    "is {} bytes; at most {MAX_TASK_BYTES} are allowed",
                    task.len()
                ),
            ));
        }
        let env = string_map(object, "env", MAX_ENV_VARS)?;
        for (name, value) in &env {
            check_env(name, value)?;
        }
        let labels = string_map(object, "labels", MAX_LABELS)?;
        for (name, value) in &labels {
            check_label(name, value)?;
        }
        Ok(Mission {
            repository: repository.to_owned(),
            git_ref: git_ref.map(str::to_owned),
            task: task.to_owned(),
            env,
            labels,
        })
    }

    /// The repository to check out: an `https://` or `ssh://` URL, or `git@host:path`.
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The git ref to check out; `None` means the repository's default branch.
    pub fn git_ref(&self) -> Option<&str> {
        self.git_ref.as_deref()
    }

    /// What the mission is asked to do.
    pub fn task(&self) -> &str {
        &self.task
    }

    /// The routine's own environment variables (never `CM_*`).
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// The routine's own labels (never `cm.*`).
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }
}

fn string_of<'a>(field: &str, value: &'a Value) -> Result<&'a str, MissionError> {
    let text = value
        .as_str()
        .ok_or_else(|| refuse(field, "must be a string"))?;
    if text.contains('\0') {
        return Err(refuse(field, "must not contain NUL characters"));
    }
    Ok(text)
}

fn required_string<'a>(
    object: &'a Map<String, Value>,
    field: &str,
) -> Result<&'a str, MissionError> {
    match object.get(field) {
        None | Some(Value::Null) => Err(refuse(field, "is required")),
        Some(value) => string_of(field, value),
    }
}

fn optional_string<'a>(
    object: &'a Map<String, Value>,
    field: &str,
) -> Result<Option<&'a str>, MissionError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => string_of(field, value).map(Some),
    }
}

fn string_map(
    object: &Map<String, Value>,
    field: &str,
    max: usize,
) -> Result<BTreeMap<String, String>, MissionError> {
    let entries = match object.get(field) {
        None | Some(Value::Null) => return Ok(BTreeMap::new()),
        Some(Value::Object(entries)) => entries,
        Some(_) => {
            return Err(refuse(field, "must be an object of strings"));
        }
    };
    if entries.len() > max {
        return Err(refuse(
            field,
            format!("has {} entries; at most {max} are allowed", entries.len()),
        ));
    }
    entries
        .iter()
        .map(|(key, value)| {
            let path = format!("{field}.{key}");
            if key.contains('\0') {
                return Err(refuse(field, "names must not contain NUL characters"));
            }
            Ok((key.clone(), string_of(&path, value)?.to_owned()))
        })
        .collect()
}

/// `https://host/path`, `ssh://[user@]host[:port]/path` or `git@host:path`. Never a local path,
/// `file://` or another transport (`ext::` runs a command), and never a password in the URL:
/// credentials are the operator's, and a routine's payload is shown to whoever lists routines.
fn check_repository(repository: &str) -> Result<(), MissionError> {
    let field = "repository";
    if repository.chars().count() > MAX_REPOSITORY_CHARS {
        return Err(refuse(
            field,
            format!("is longer than {MAX_REPOSITORY_CHARS} characters"),
        ));
    }
    if repository
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(refuse(
            field,
            "must not contain spaces or control characters",
        ));
    }
    if let Some(rest) = repository.strip_prefix("git@") {
        // scp-like syntax: git@host:path. A host starting with `-` would reach ssh as an option.
        let (host, path) = rest
            .split_once(':')
            .ok_or_else(|| refuse(field, "git@ form must be git@host:path"))?;
        if !valid_host(host) {
            return Err(refuse(field, format!("{host:?} is not a host name")));
        }
        if path.is_empty() || path.starts_with('-') || path.starts_with('/') {
            return Err(refuse(
                field,
                "git@ form needs a path after the colon, not starting with - or /",
            ));
        }
        return Ok(());
    }
    let url = url::Url::parse(repository).map_err(|e| {
        refuse(
            field,
            format!("must be an https:// or ssh:// URL or git@host:path ({e})"),
        )
    })?;
    if !matches!(url.scheme(), "https" | "ssh") {
        return Err(refuse(
            field,
            format!(
                "scheme {:?} is not allowed (https://, ssh:// or git@host:path)",
                url.scheme()
            ),
        ));
    }
    if url.password().is_some() || (url.scheme() == "https" && !url.username().is_empty()) {
        return Err(refuse(
            field,
            "must not carry credentials; they are operator configuration",
        ));
    }
    match url.host_str() {
        Some(host) if valid_host(host.trim_start_matches('[').trim_end_matches(']')) => {}
        _ => return Err(refuse(field, "must name a host")),
    }
    if url.path().trim_matches('/').is_empty() {
        return Err(refuse(field, "must name a repository path"));
    }
    Ok(())
}

fn valid_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'))
}

/// The rules of `git check-ref-format`, and no leading `-` (it would reach git as an option).
fn check_ref(git_ref: &str) -> Result<(), MissionError> {
    let bad = |reason: &str| Err(refuse("ref", format!("{git_ref:?} {reason}")));
    if git_ref.is_empty() {
        return bad("is empty");
    }
    if git_ref.len() > MAX_REF_BYTES {
        return bad(&format!("is longer than {MAX_REF_BYTES} bytes"));
    }
    if git_ref.starts_with('-') {
        return bad("must not start with -");
    }
    if let Some(c) = git_ref
        .chars()
        .find(|&c| c.is_control() || c == ' ' || "~^:?*[\\".contains(c))
    {
        return bad(&format!("contains {c:?}, which git refs cannot hold"));
    }
    if git_ref == "@" || git_ref.contains("..") || git_ref.contains("@{") {
        return bad("is not a valid git ref (\"@\", \"..\" and \"@{\" are not allowed)");
    }
    if git_ref.starts_with('/') || git_ref.ends_with('/') || git_ref.ends_with('.') {
        return bad("must not start or end with / or end with .");
    }
    for component in git_ref.split('/') {
        if component.is_empty() || component.starts_with('.') || component.ends_with(".lock") {
            return bad("has an empty component, one starting with ., or one ending with .lock");
        }
    }
    Ok(())
}

fn check_env(name: &str, value: &str) -> Result<(), MissionError> {
    let field = format!("env.{name}");
    let mut chars = name.chars();
    let well_formed = chars
        .next()
        .is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    if !well_formed || name.len() > MAX_ENV_NAME_CHARS {
        return Err(refuse(
            field,
            format!("names must match [A-Z_][A-Z0-9_]* (at most {MAX_ENV_NAME_CHARS} characters)"),
        ));
    }
    if name.starts_with(RESERVED_ENV_PREFIX) {
        return Err(refuse(
            field,
            "CM_* variables are set by cm itself and cannot be overridden",
        ));
    }
    if value.len() > MAX_ENV_VALUE_BYTES {
        return Err(refuse(
            field,
            format!("is longer than {MAX_ENV_VALUE_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// Kubernetes' label syntax (the strictest runtime): an optional DNS-subdomain prefix and `/`,
/// then a name of at most 63 characters; a value of at most 63. Both start and end alphanumeric
/// and hold only alphanumerics, `-`, `_` and `.`.
fn check_label(name: &str, value: &str) -> Result<(), MissionError> {
    let field = format!("labels.{name}");
    let segment_ok = |s: &str, allow_empty: bool| {
        (allow_empty && s.is_empty())
            || (s.len() <= MAX_LABEL_CHARS
                && s.starts_with(|c: char| c.is_ascii_alphanumeric())
                && s.ends_with(|c: char| c.is_ascii_alphanumeric())
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    };
    let (prefix, local) = match name.split_once('/') {
        Some((prefix, local)) => (Some(prefix), local),
        None => (None, name),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    });
    if !prefix_ok || !segment_ok(local, false) {
        return Err(refuse(
            field,
            "label names must be [prefix/]name: alphanumerics, -, _ and ., at most 63, \
             starting and ending alphanumeric",
        ));
    }
    if name.starts_with(RESERVED_LABEL_PREFIX) {
        return Err(refuse(field, "cm.* labels are set by cm itself"));
    }
    if !segment_ok(value, true) {
        return Err(refuse(
            field,
            "label values must be at most 63 alphanumerics, -, _ and ., starting and ending \
             alphanumeric",
        ));
    }
    Ok(())
}

impl fmt::Display for Mission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.repository)?;
        if let Some(git_ref) = &self.git_ref {
            write!(f, "@{git_ref}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mission made of `fields` added to a minimal valid one.
    fn mission(fields: &str) -> String {
        let extra = if fields.is_empty() {
            String::new()
        } else {
            format!(", {fields}")
        };
        format!(
            r#"{{"repository": "https://git.example.com/team/repo.git", "task": "lint"{extra}}}"#
        )
    }

    /// Checks that `text` is refused and the error names `field` (or, for errors about the
    /// whole file, contains `field`).
    fn refused(text: &str, field: &str) {
        match Mission::from_json(text) {
            Ok(m) => panic!("{text} was accepted as {m:?}"),
            Err(e) => assert!(
                e.field() == Some(field) || (e.field().is_none() && e.to_string().contains(field)),
                "{text}: {e} does not name {field}"
            ),
        }
    }

    fn accepted(text: &str) -> Mission {
        Mission::from_json(text).unwrap_or_else(|e| panic!("{text} was refused: {e}"))
    }

    #[test]
    fn a_full_mission_is_read_field_by_field() {
        let m = accepted(&mission(
            r#""ref": "release/2026.03", "env": {"REPORT_FORMAT": "markdown", "_X1": ""},
               "labels": {"team": "platform", "example.com/tier": "a_b.c"}"#,
        ));
        assert_eq!(m.repository(), "https://git.example.com/team/repo.git");
        assert_eq!(m.git_ref(), Some("release/2026.03"));
        assert_eq!(m.task(), "lint");
        assert_eq!(
            m.env().get("REPORT_FORMAT").map(String::as_str),
            Some("markdown")
        );
        assert_eq!(m.labels().len(), 2);
        assert_eq!(
            m.to_string(),
            "https://git.example.com/team/repo.git@release/2026.03"
        );
    }

    #[test]
    fn repositories() {
        for ok in [
            "https://git.example.com/team/repo.git",
            "https://git.example.com:8443/team/repo",
            "ssh://git@git.example.com/team/repo.git",
            "ssh://git@git.example.com:2222/team/repo.git",
            "git@git.example.com:team/repo.git",
            "https://example.invalid/r.git",
        ] {
            accepted(&format!(r#"{{"repository": "{ok}", "task": "t"}}"#));
        }
        for bad in [
            "",
            "/srv/git/repo.git",
            "./repo",
            "file:///srv/git/repo.git",
            "http://git.example.com/repo.git",
            "git://git.example.com/repo.git",
            "ext::sh -c touch% /tmp/pwned",
            "https://user:secret@git.example.com/repo.git",
            "https://token@git.example.com/repo.git",
            "ssh://git:pw@git.example.com/repo.git",
            "https://git.example.com/",
            "https:///repo.git",
            "git@-oProxyCommand=touch:x",
            "git@host",
            "git@host:",
            "git@host:-x",
            "root@host:repo",
            "https://git.example.com/re po",
        ] {
            refused(
                &format!(r#"{{"repository": "{bad}", "task": "t"}}"#),
                "repository",
            );
        }
        let long = format!("https://h.example/{}", "a".repeat(MAX_REPOSITORY_CHARS));
        refused(
            &format!(r#"{{"repository": "{long}", "task": "t"}}"#),
            "repository",
        );
        refused(r#"{"repository": 7, "task": "t"}"#, "repository");
        refused(
            r#"{"repository": "https://h.example/a\u0000b", "task": "t"}"#,
            "repository",
        );
    }

    #[test]
    fn refs() {
        for ok in [
            "main",
            "v1.2.3",
            "release/2026.03",
            "feature/a-b_c",
            "0123456789abcdef0123456789abcdef01234567",
        ] {
            accepted(&mission(&format!(r#""ref": "{ok}""#)));
        }
        for bad in [
            "",
            "-x",
            "--upload-pack=touch",
            "a..b",
            "a b",
            "a~1",
            "a^",
            "a:b",
            "a?",
            "a*",
            "a[",
            "a\\\\b",
            "@",
            "a@{1}",
            "/a",
            "a/",
            "a.",
            "a//b",
            ".a",
            "a/.b",
            "a.lock",
            "a/b.lock/c",
        ] {
            refused(&mission(&format!(r#""ref": "{bad}""#)), "ref");
        }
        refused(&mission(&format!(r#""ref": "{}""#, "a".repeat(256))), "ref");
        refused(&mission(r#""ref": ["main"]"#), "ref");
        refused(&mission(r#""ref": "a\u0001""#), "ref");
    }

    #[test]
    fn tasks() {
        refused(r#"{"repository": "https://h.example/r"}"#, "task");
        refused(
            r#"{"repository": "https://h.example/r", "task": "  "}"#,
            "task",
        );
        refused(
            r#"{"repository": "https://h.example/r", "task": null}"#,
            "task",
        );
        refused(
            r#"{"repository": "https://h.example/r", "task": {"a": 1}}"#,
            "task",
        );
        refused(
            r#"{"repository": "https://h.example/r", "task": "a\u0000"}"#,
            "task",
        );
        let at_limit = "x".repeat(MAX_TASK_BYTES);
        accepted(&format!(
            r#"{{"repository": "https://h.example/r", "task": "{at_limit}"}}"#
        ));
        refused(
            &format!(r#"{{"repository": "https://h.example/r", "task": "{at_limit}x"}}"#),
            "task",
        );
    }

    #[test]
    fn environments() {
        accepted(&mission(r#""env": {"A": "1", "_B_2": "x", "REPORT": ""}"#));
        accepted(&mission(r#""env": null"#));
        for (env, field) in [
            (r#"{"CM_TASK": "x"}"#, "env.CM_TASK"),
            (r#"{"CM_": "x"}"#, "env.CM_"),
            (r#"{"lower": "x"}"#, "env.lower"),
            (r#"{"1A": "x"}"#, "env.1A"),
            (r#"{"A-B": "x"}"#, "env.A-B"),
            (r#"{"": "x"}"#, "env."),
            (r#"{"A": 1}"#, "env.A"),
            (r#"{"A": "a\u0000b"}"#, "env.A"),
            (r#"["A"]"#, "env"),
            (r#""A=1""#, "env"),
        ] {
            refused(&mission(&format!(r#""env": {env}"#)), field);
        }
        let long_value = "v".repeat(MAX_ENV_VALUE_BYTES + 1);
        refused(
            &mission(&format!(r#""env": {{"A": "{long_value}"}}"#)),
            "env.A",
        );
        let long_name = "A".repeat(MAX_ENV_NAME_CHARS + 1);
        refused(
            &mission(&format!(r#""env": {{"{long_name}": "x"}}"#)),
            &format!("env.{long_name}"),
        );
        let many: Vec<String> = (0..=MAX_ENV_VARS)
            .map(|i| format!(r#""V{i}": "x""#))
            .collect();
        refused(
            &mission(&format!(r#""env": {{{}}}"#, many.join(","))),
            "env",
        );
    }

    #[test]
    fn labels() {
        accepted(&mission(
            r#""labels": {"team": "platform", "a.b/c_d": "", "x": "A-1.b_2"}"#,
        ));
        for (labels, field) in [
            (r#"{"cm.routine-id": "x"}"#, "labels.cm.routine-id"),
            (r#"{"-team": "x"}"#, "labels.-team"),
            (r#"{"team": "-x"}"#, "labels.team"),
            (r#"{"team": "a b"}"#, "labels.team"),
            (r#"{"team": "a:b"}"#, "labels.team"),
            (r#"{"Bad_Prefix/x": "y"}"#, "labels.Bad_Prefix/x"),
            (r#"{"team": 3}"#, "labels.team"),
            (r#"{"": "x"}"#, "labels."),
        ] {
            refused(&mission(&format!(r#""labels": {labels}"#)), field);
        }
        let long = "a".repeat(MAX_LABEL_CHARS + 1);
        refused(
            &mission(&format!(r#""labels": {{"t": "{long}"}}"#)),
            "labels.t",
        );
        let many: Vec<String> = (0..=MAX_LABELS)
            .map(|i| format!(r#""l{i}": "x""#))
            .collect();
        refused(
            &mission(&format!(r#""labels": {{{}}}"#, many.join(","))),
            "labels",
        );
    }

    #[test]
    fn the_file_as_a_whole() {
        refused(&mission(r#""image": "alpine""#), "image");
        refused(&mission(r#""command": ["sh"]"#), "command");
        refused("[1, 2]", "object");
        refused("repository: x", "JSON");
        refused("", "JSON");
        let padding = " ".repeat(MAX_MISSION_BYTES);
        refused(&format!("{}{padding}", mission("")), "bytes");
    }
}
