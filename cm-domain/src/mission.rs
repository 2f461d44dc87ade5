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

/// The variables a mission's `env` may never set, whatever the operator allows: each is read by a
/// loader, a shell, an interpreter or a common tool (git, ssh, docker, kubectl, a proxy-aware
/// client) to change what runs or where it connects. `*` stands for any run of characters. A
/// routine stored before a name was listed is refused when it comes due (settled `failed`), never
/// launched.
pub const DENIED_ENV: [&str; 27] = [
    "PATH",
    "HOME",
    "SHELL",
    "IFS",
    "ENV",
    "BASH_ENV",
    "BASH_FUNC_*",
    "SHELLOPTS",
    "PS4",
    "LD_*",
    "GCONV_PATH",
    "GIT_*",
    "SSH_*",
    "*_PROXY",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PYTHON*",
    "PERL5*",
    "PERLLIB",
    "RUBYOPT",
    "RUBYLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "DOCKER_*",
    "KUBECONFIG",
    "TMPDIR",
];

/// Host names a repository may never name: the scheduler's own host and the cloud metadata
/// services, which hand out the credentials of the machine a mission runs on.
pub const DENIED_REPOSITORY_HOSTS: [&str; 6] = [
    "localhost",
    "*.localhost",
    "metadata",
    "metadata.google.internal",
    "instance-data",
    "instance-data.ec2.internal",
];

/// The entry of [`DENIED_ENV`] that `name` matches, if any.
///
/// ```
/// assert_eq!(cm_domain::mission::denied_env("HTTPS_PROXY"), Some("*_PROXY"));
/// assert_eq!(cm_domain::mission::denied_env("REPORT_FORMAT"), None);
/// ```
pub fn denied_env(name: &str) -> Option<&'static str> {
    DENIED_ENV
        .iter()
        .copied()
        .find(|pattern| glob_matches(pattern, name))
}

/// Whether `text` matches `pattern`, where `*` stands for any run of characters (also none).
fn glob_matches(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(mut tail) = text.strip_prefix(head) else {
                return false;
            };
            // Each further `*`-free piece must appear in order; the last must end the text.
            let pieces: Vec<&str> = rest.split('*').collect();
            let (last, middle) = pieces
                .split_last()
                .expect("split yields one piece at least");
            for piece in middle {
                match tail.find(piece) {
                    Some(at) => tail = &tail[at + piece.len()..],
                    None => return false,
                }
            }
            tail.len() >= last.len() && tail.ends_with(last)
        }
    }
}

/// A validated mission file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mission {
    repository: String,
    repository_host: String,
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
        let repository_host = check_repository(repository)?;
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
            repository_host,
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

    /// The repository's host, lowercase (`git.example.com`): what an operator's
    /// `repository_hosts` ([`MissionPolicy`]) is matched against.
    pub fn repository_host(&self) -> &str {
        &self.repository_host
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
/// `file://` or another transport (`ext::` runs a command), never a password in the URL
/// (credentials are the operator's, and a routine's payload is shown to whoever lists routines),
/// never a host or user that a client could read as an option (`-oProxyCommand=…`), and never
/// the scheduler's own host or a metadata service (see [`check_host`]). Returns the host,
/// lowercase.
fn check_repository(repository: &str) -> Result<String, MissionError> {
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
        // ssh resolves the host as the C library does, so `127.1` is a loopback address: read
        // it the way a URL's host is read, which follows the same number forms.
        let parsed = url::Host::parse(host)
            .map_err(|e| refuse(field, format!("{host:?} is not a host name ({e})")))?;
        return check_host(&parsed);
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
    let user = url.username();
    if !user.is_empty()
        && (user.starts_with('-')
            || !user
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(refuse(
            field,
            format!(
                "user {user:?} is not allowed: letters, digits, ., _ and -, not starting with -"
            ),
        ));
    }
    let host = url
        .host()
        .ok_or_else(|| refuse(field, "must name a host"))?;
    if let url::Host::Domain(name) = &host
        && !valid_host(name)
    {
        return Err(refuse(field, format!("{name:?} is not a host name")));
    }
    if url.path().trim_matches('/').is_empty() {
        return Err(refuse(field, "must name a repository path"));
    }
    check_host(&host)
}

/// Refuses a loopback, link-local, unspecified or metadata address (a mission would reach the
/// scheduler's host or the credentials of the machine it runs on); returns the host, lowercase.
fn check_host<S: AsRef<str>>(host: &url::Host<S>) -> Result<String, MissionError> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let field = "repository";
    let denied_ip = |ip: IpAddr| -> Option<&'static str> {
        // An IPv4 address written as IPv6 (`::ffff:127.0.0.1`) is that IPv4 address.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match ip {
            IpAddr::V4(v4) if v4.is_loopback() => Some("a loopback address"),
            IpAddr::V4(v4) if v4.is_link_local() => {
                Some("a link-local address (where metadata services answer)")
            }
            IpAddr::V4(v4) if v4.octets()[0] == 0 || v4.is_broadcast() => {
                Some("an unspecified address")
            }
            IpAddr::V4(v4) if v4 == Ipv4Addr::new(100, 100, 100, 200) => {
                Some("a metadata service's address")
            }
            IpAddr::V6(v6) if v6.is_loopback() => Some("a loopback address"),
            IpAddr::V6(v6) if v6.is_unspecified() => Some("an unspecified address"),
            IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => {
                Some("a link-local address (where metadata services answer)")
            }
            IpAddr::V6(v6) if v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) => {
                Some("a metadata service's address")
            }
            _ => None,
        }
    };
    let (shown, why) = match host {
        url::Host::Ipv4(v4) => (v4.to_string(), denied_ip(IpAddr::V4(*v4))),
        url::Host::Ipv6(v6) => (v6.to_string(), denied_ip(IpAddr::V6(*v6))),
        url::Host::Domain(name) => {
            let name = name.as_ref().trim_end_matches('.').to_ascii_lowercase();
            let denied = DENIED_REPOSITORY_HOSTS
                .iter()
                .any(|pattern| glob_matches(pattern, &name));
            let why = denied.then_some("the scheduler's own host or a metadata service");
            (name, why)
        }
    };
    match why {
        Some(why) => Err(refuse(
            field,
            format!("host {shown} is {why}; missions may not reach it"),
        )),
        None => Ok(shown),
    }
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
    if let Some(pattern) = denied_env(name) {
        return Err(refuse(
            field,
            format!(
                "{pattern} changes how a mission runs or where it connects, so a routine cannot \
                 set it (see the mission env rules)"
            ),
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
    if let Some(reserved) = runtime_reserved_label(prefix, local) {
        return Err(refuse(
            field,
            format!("{reserved} labels are reserved by the runtime"),
        ));
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

/// The reserved key family a label belongs to, on the runtimes cm launches on: Kubernetes sets
/// `job-name` and `controller-uid` on a Job's pods and owns the `kubernetes.io` and `k8s.io`
/// prefixes and their subdomains (`batch.kubernetes.io/job-name`). A Job carrying one is refused.
fn runtime_reserved_label(prefix: Option<&str>, local: &str) -> Option<&'static str> {
    match prefix {
        None if local == "job-name" => Some("job-name"),
        None if local == "controller-uid" => Some("controller-uid"),
        Some(p) if p == "kubernetes.io" || p.ends_with(".kubernetes.io") => {
            Some("kubernetes.io/* and *.kubernetes.io/*")
        }
        Some(p) if p == "k8s.io" || p.ends_with(".k8s.io") => Some("k8s.io/* and *.k8s.io/*"),
        _ => None,
    }
}

/// The operator's narrowing of what a mission may ask for (in `--mission-config`):
/// `env_allow`, the only `env` names a routine may set (patterns with `*`, `"REPORT_*"`), and
/// `repository_hosts`, the only hosts a repository may name (`"git.example.com"`, or
/// `"*.example.com"` for its subdomains). Either absent allows what the rules allow. Checked
/// when a routine is created, updated or imported with the config at hand, and again at every
/// dispatch, so a routine written before the policy changed is refused, not launched.
///
/// ```
/// use cm_domain::{Mission, MissionPolicy};
///
/// let policy = MissionPolicy::new(Some(vec!["REPORT_*".into()]), None).unwrap();
/// let m = Mission::from_json(
///     r#"{"repository": "https://git.example.com/r.git", "task": "t", "env": {"LANG": "C"}}"#,
/// ).unwrap();
/// assert_eq!(policy.check(&m).unwrap_err().field(), Some("env.LANG"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MissionPolicy {
    env_allow: Option<Vec<String>>,
    repository_hosts: Option<Vec<String>>,
}

impl MissionPolicy {
    /// A policy from the operator's lists; an error names the malformed entry. An allowed name
    /// is `[A-Z0-9_*]`, a host pattern a host name, optionally after `*.`.
    pub fn new(
        env_allow: Option<Vec<String>>,
        repository_hosts: Option<Vec<String>>,
    ) -> Result<MissionPolicy, String> {
        for pattern in env_allow.iter().flatten() {
            if pattern.is_empty()
                || !pattern
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || matches!(c, '_' | '*'))
            {
                return Err(format!(
                    "env_allow entry {pattern:?} must be a variable name or a pattern of \
                     [A-Z0-9_] and *"
                ));
            }
        }
        let repository_hosts = repository_hosts.map(|hosts| {
            hosts
                .into_iter()
                .map(|h| h.to_ascii_lowercase())
                .collect::<Vec<_>>()
        });
        for host in repository_hosts.iter().flatten() {
            if !valid_host(host.strip_prefix("*.").unwrap_or(host)) {
                return Err(format!(
                    "repository_hosts entry {host:?} must be a host name, or *. and a host name"
                ));
            }
        }
        Ok(MissionPolicy {
            env_allow,
            repository_hosts,
        })
    }

    /// Refuses a mission that asks for what this policy does not allow, naming the field.
    pub fn check(&self, mission: &Mission) -> Result<(), MissionError> {
        if let Some(allow) = &self.env_allow
            && let Some(name) = mission
                .env()
                .keys()
                .find(|name| !allow.iter().any(|pattern| glob_matches(pattern, name)))
        {
            return Err(refuse(
                format!("env.{name}"),
                format!(
                    "is not among the names the operator allows (env_allow: {})",
                    allow.join(", ")
                ),
            ));
        }
        if let Some(hosts) = &self.repository_hosts {
            let host = mission.repository_host();
            let allowed = hosts
                .iter()
                .any(|pattern| match pattern.strip_prefix("*.") {
                    Some(domain) => host
                        .strip_suffix(domain)
                        .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
                    None => pattern == host,
                });
            if !allowed {
                return Err(refuse(
                    "repository",
                    format!(
                        "host {host} is not among the hosts the operator allows \
                         (repository_hosts: {})",
                        hosts.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }
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
            "https://10.0.0.5/team/r.git",
            "ssh://git@[2001:db8::1]/team/r.git",
            "ssh://deploy-bot_1@git.example.com/r.git",
            "https://localhost.example.com/r.git",
        ] {
            accepted(&format!(r#"{{"repository": "{ok}", "task": "t"}}"#));
        }
        assert_eq!(
            accepted(r#"{"repository": "https://Git.Example.COM/r.git", "task": "t"}"#)
                .repository_host(),
            "git.example.com"
        );
        assert_eq!(
            accepted(r#"{"repository": "git@git.example.com:r.git", "task": "t"}"#)
                .repository_host(),
            "git.example.com"
        );
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
            // A user or host a client could read as an option.
            "ssh://-oProxyCommand=touch%20x@git.example.com/r.git",
            "ssh://-x@git.example.com/r.git",
            "ssh://a%20b@git.example.com/r.git",
            // The scheduler's own host, however it is written.
            "https://127.0.0.1/r.git",
            "https://127.1/r.git",
            "https://2130706433/r.git",
            "https://0x7f000001/r.git",
            "https://[::1]/r.git",
            "https://[::ffff:127.0.0.1]/r.git",
            "https://localhost/r.git",
            "https://LOCALHOST./r.git",
            "https://git.localhost/r.git",
            "ssh://git@[::1]/r.git",
            "git@127.0.0.1:r.git",
            "git@127.1:r.git",
            "git@localhost:r.git",
            // Unspecified addresses reach the local host too.
            "https://0.0.0.0/r.git",
            "https://0/r.git",
            "https://[::]/r.git",
            // Link-local and metadata services.
            "https://169.254.169.254/latest/meta-data",
            "https://[fe80::1]/r.git",
            "https://[fd00:ec2::254]/latest",
            "https://metadata.google.internal/computeMetadata/v1",
            "https://100.100.100.200/latest",
            "git@169.254.169.254:r.git",
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

    /// A name each entry of the deny list covers: `*` replaced by `X`.
    fn example_of(pattern: &str) -> String {
        pattern.replace('*', "X")
    }

    #[test]
    fn every_denied_environment_name_is_refused() {
        for pattern in DENIED_ENV {
            for name in [example_of(pattern), pattern.replace('*', "")] {
                // `*_PROXY` with nothing for the star is `_PROXY`, still a well-formed name.
                refused(
                    &mission(&format!(r#""env": {{"{name}": "x"}}"#)),
                    &format!("env.{name}"),
                );
            }
        }
        // The names the review used to steer a runner, each refused for its own entry.
        for (name, entry) in [
            ("BASH_ENV", "BASH_ENV"),
            ("PATH", "PATH"),
            ("GIT_SSH_COMMAND", "GIT_*"),
            ("GIT_CONFIG_COUNT", "GIT_*"),
            ("GIT_CONFIG_KEY_0", "GIT_*"),
            ("LD_PRELOAD", "LD_*"),
            ("LD_LIBRARY_PATH", "LD_*"),
            ("HTTPS_PROXY", "*_PROXY"),
            ("ALL_PROXY", "*_PROXY"),
            ("NO_PROXY", "*_PROXY"),
            ("PYTHONPATH", "PYTHON*"),
            ("PYTHONSTARTUP", "PYTHON*"),
            ("PERL5OPT", "PERL5*"),
            ("SSH_AUTH_SOCK", "SSH_*"),
            ("DOCKER_HOST", "DOCKER_*"),
        ] {
            assert_eq!(denied_env(name), Some(entry), "{name}");
            let err =
                Mission::from_json(&mission(&format!(r#""env": {{"{name}": "x"}}"#))).unwrap_err();
            assert!(err.to_string().contains(entry), "{err}");
        }
        // Names that only resemble an entry are the routine's to set.
        for name in [
            "PATHS",
            "MY_PATH",
            "HOMEPAGE",
            "ENVIRONMENT",
            "REPORT_FORMAT",
            "LANG",
            "PROXY",
            "GIT",
            "NODE_ENV",
            "XLD_X",
        ] {
            assert_eq!(denied_env(name), None, "{name}");
            accepted(&mission(&format!(r#""env": {{"{name}": "x"}}"#)));
        }
    }

    #[test]
    fn glob_patterns() {
        for (pattern, text, matches) in [
            ("PATH", "PATH", true),
            ("PATH", "PATHS", false),
            ("LD_*", "LD_", true),
            ("LD_*", "LD_PRELOAD", true),
            ("LD_*", "XLD_", false),
            ("*_PROXY", "HTTP_PROXY", true),
            ("*_PROXY", "_PROXY", true),
            ("*_PROXY", "HTTP_PROXYX", false),
            ("A*B*C", "AxxBxxC", true),
            ("A*B*C", "ABC", true),
            ("A*B*C", "AC", false),
            ("A*A", "A", false),
            ("*", "", true),
        ] {
            assert_eq!(glob_matches(pattern, text), matches, "{pattern} {text}");
        }
    }

    #[test]
    fn the_operators_policy() {
        let m = accepted(&mission(r#""env": {"REPORT_FORMAT": "md", "LANG": "C"}"#));
        let allow = |names: &[&str]| {
            MissionPolicy::new(Some(names.iter().map(|n| n.to_string()).collect()), None).unwrap()
        };
        allow(&["REPORT_*", "LANG"]).check(&m).unwrap();
        let err = allow(&["REPORT_*"]).check(&m).unwrap_err();
        assert_eq!(err.field(), Some("env.LANG"));
        assert!(err.to_string().contains("env_allow: REPORT_*"), "{err}");
        // An empty allow list allows no variable at all, and any mission without one.
        assert_eq!(allow(&[]).check(&m).unwrap_err().field(), Some("env.LANG"));
        allow(&[]).check(&accepted(&mission(""))).unwrap();
        // The allow list narrows the deny list; it never widens it.
        refused(&mission(r#""env": {"PATH": "/tmp/evil"}"#), "env.PATH");
        assert!(MissionPolicy::new(Some(vec!["lower".into()]), None).is_err());
        assert!(MissionPolicy::new(Some(vec!["".into()]), None).is_err());

        let hosts = |hosts: &[&str]| {
            MissionPolicy::new(None, Some(hosts.iter().map(|h| h.to_string()).collect()))
        };
        let at = |repository: &str| {
            accepted(&format!(r#"{{"repository": "{repository}", "task": "t"}}"#))
        };
        let policy = hosts(&["Git.Example.com", "*.corp.example"]).unwrap();
        for ok in [
            "https://git.example.com/r.git",
            "git@git.example.com:r.git",
            "ssh://git@a.b.corp.example/r.git",
        ] {
            policy.check(&at(ok)).unwrap();
        }
        for bad in [
            "https://evil.example/r.git",
            "https://corp.example/r.git",
            "https://xcorp.example/r.git",
            "https://git.example.com.evil.example/r.git",
        ] {
            let err = policy.check(&at(bad)).unwrap_err();
            assert_eq!(err.field(), Some("repository"), "{bad}");
            assert!(err.to_string().contains("repository_hosts"), "{err}");
        }
        assert!(hosts(&["-x"]).is_err());
        assert!(hosts(&["a b"]).is_err());
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
            // Keys Kubernetes sets on a Job's pods or owns: a Job carrying one is refused (422).
            (r#"{"job-name": "x"}"#, "labels.job-name"),
            (r#"{"controller-uid": "x"}"#, "labels.controller-uid"),
            (
                r#"{"batch.kubernetes.io/job-name": "x"}"#,
                "labels.batch.kubernetes.io/job-name",
            ),
            (
                r#"{"batch.kubernetes.io/controller-uid": "x"}"#,
                "labels.batch.kubernetes.io/controller-uid",
            ),
            (r#"{"kubernetes.io/x": "y"}"#, "labels.kubernetes.io/x"),
            (
                r#"{"node.kubernetes.io/x": "y"}"#,
                "labels.node.kubernetes.io/x",
            ),
            (r#"{"k8s.io/x": "y"}"#, "labels.k8s.io/x"),
            (r#"{"x.k8s.io/y": "z"}"#, "labels.x.k8s.io/y"),
        ] {
            refused(&mission(&format!(r#""labels": {labels}"#)), field);
        }
        accepted(&mission(
            r#""labels": {"example.com/job-name": "x", "mykubernetes.io/a": "b", "job-names": "c"}"#,
        ));
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
