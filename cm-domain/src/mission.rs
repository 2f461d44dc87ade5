//! The mission file: what a mission routine asks a container to do, validated before it is stored.
//!
//! A mission routine's payload is a JSON object (docs/guide/design.md, "Missions"):
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

use crate::repository::{Host, Repository, denied_address, denied_name};

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

/// The variables a mission's `env` may never set, whatever the operator allows (the floor no
/// `env_allow` opens): each is read by a loader, a shell, an interpreter, a build tool, a package
/// manager or a common client (git, ssh, curl, docker, kubectl, a cloud SDK) to change what runs,
/// what code is loaded, what is trusted or where it connects. `*` stands for any run of
/// characters. A routine stored before a name was listed is refused when it comes due (settled
/// `failed`), never launched.
pub const DENIED_ENV: &[&str] = &[
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
    // The C library and the resolver: tunables, locale and message files, host aliases.
    "GLIBC_TUNABLES",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "RES_OPTIONS",
    // Shells' start-up files and hooks, and the programs tools start for a page or an edit.
    "ZDOTDIR",
    "PROMPT_COMMAND",
    "XDG_*",
    "PAGER",
    "MANPAGER",
    "LESSOPEN",
    "LESSCLOSE",
    "EDITOR",
    "VISUAL",
    // Interpreters and build tools that load or run what a variable names.
    "LUA_INIT*",
    "LUA_PATH*",
    "LUA_CPATH*",
    "RUSTC*",
    "RUSTDOC*",
    "RUSTFLAGS",
    "RUSTUP_*",
    "CARGO_*",
    "GO*",
    "*_OPTS",
    "CLASSPATH",
    "JAVA_HOME",
    "MAVEN_*",
    "GRADLE_*",
    "CC",
    "CXX",
    "CFLAGS",
    "CXXFLAGS",
    "CPPFLAGS",
    "LDFLAGS",
    "MAKEFLAGS",
    "PHPRC",
    "PHP_INI_*",
    "CORECLR_*",
    "DOTNET_*",
    // Package managers' indexes and registries: where code is installed from.
    "PIP_*",
    "UV_*",
    "NPM_CONFIG_*",
    "YARN_*",
    "BUNDLE_*",
    "GEM_*",
    "COMPOSER_*",
    // What TLS trusts.
    "SSL_*",
    "CURL_*",
    "REQUESTS_CA_BUNDLE",
    "OPENSSL_*",
    "NODE_EXTRA_CA_CERTS",
    "NODE_TLS_*",
    // Cloud SDKs' endpoints, configuration and credentials.
    "AWS_*",
    "AZURE_*",
    "CLOUDSDK_*",
];

/// The `env` names a routine may set when the operator gives no `env_allow`: the time zone and
/// the locale, which no tool reads to run something or to connect somewhere.
pub const DEFAULT_ENV_ALLOW: [&str; 4] = ["TZ", "LANG", "LANGUAGE", "LC_*"];

/// The label keys a routine may set when the operator gives no `label_allow`: those under the
/// prefix `routine/`, which no runtime, controller or selector of cm's reads.
pub const DEFAULT_LABEL_ALLOW: [&str; 1] = ["routine/*"];

/// Label prefixes (the part before `/`) that runtimes and the controllers beside them read as
/// their own: each domain and every subdomain of it (`app.kubernetes.io`,
/// `nginx.ingress.kubernetes.io`, `sidecar.istio.io`). A key whose whole text starts with the
/// domain reversed (`com.docker.`, `io.kubernetes.`, Docker's style) is refused too.
pub const RESERVED_LABEL_DOMAINS: &[&str] = &[
    "kubernetes.io",
    "k8s.io",
    "docker.com",
    "docker.io",
    "dockerproject.org",
    "istio.io",
    "linkerd.io",
    "traefik.io",
    "containo.us",
    "konghq.com",
    "cilium.io",
    "openshift.io",
    "cattle.io",
    "prometheus.io",
    "cert-manager.io",
];

/// Starts of label keys that proxies, meshes and container tools read off a container or a pod
/// (`traefik.enable`, `caddy`, `istio-injection`, `linkerd.io/inject`,
/// `com.centurylinklabs.watchtower.enable`).
pub const RESERVED_LABEL_STARTS: &[&str] = &[
    "traefik",
    "caddy",
    "istio",
    "linkerd",
    "com.centurylinklabs.watchtower",
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
pub(crate) fn glob_matches(pattern: &str, text: &str) -> bool {
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
    host: Host,
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
        let host = check_repository(repository)?;
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
            repository_host: host.as_text(),
            host,
            git_ref: git_ref.map(str::to_owned),
            task: task.to_owned(),
            env,
            labels,
        })
    }

    /// The repository to check out: an `https://` or `ssh://` URL, or `user@host:path`.
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The repository's host as text: a name lowercase without its trailing dot
    /// (`git.example.com`), an address in its usual form (`10.0.0.5`, `2001:db8::1`). What an
    /// operator's `repository_hosts` ([`MissionPolicy`]) is matched against.
    pub fn repository_host(&self) -> &str {
        &self.repository_host
    }

    /// The repository's host, a name or an address ([`crate::repository`]). A name is resolved
    /// when the mission is dispatched, and refused if it reaches an address
    /// [`denied_address`] refuses.
    pub fn host(&self) -> &Host {
        &self.host
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

/// `https://host/path`, `ssh://[user@]host[:port]/path` or `user@host:path`, split by
/// [`Repository::parse`]. Never a local path, `file://`, `git://` or another transport (`ext::`
/// runs a command), never a password in the URL or a user in an `https://` one (credentials are
/// the operator's, and a routine's payload is shown to whoever lists routines), never a host or
/// user that a client could read as an option (`-oProxyCommand=…`), and never an address
/// [`denied_address`] refuses or a name [`denied_name`] refuses, whatever the form: the host is
/// checked before the scheme. Returns the host.
fn check_repository(repository: &str) -> Result<Host, MissionError> {
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
    let parsed = Repository::parse(repository).map_err(|why| refuse(field, why))?;
    let host = parsed.host().clone();
    let denied = match &host {
        Host::Address(ip) => denied_address(*ip),
        Host::Name(name) => denied_name(name),
    };
    if let Some(why) = denied {
        return Err(refuse(
            field,
            format!("host {host} is {why}; missions may not reach it"),
        ));
    }
    match parsed.scheme() {
        None | Some("ssh") => {}
        Some("https") if parsed.user().is_some() => {
            return Err(refuse(
                field,
                "must not carry credentials; they are operator configuration",
            ));
        }
        Some("https") => {}
        Some(other) => {
            return Err(refuse(
                field,
                format!("scheme {other:?} is not allowed (https://, ssh:// or user@host:path)"),
            ));
        }
    }
    if parsed.path().trim_matches('/').is_empty() {
        return Err(refuse(field, "must name a repository path"));
    }
    Ok(host)
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
    if let Some(reserved) = reserved_label(name) {
        return Err(refuse(
            field,
            format!("{reserved}: the runtime or a controller beside it reads it"),
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

/// Why a label key is one the runtime or a controller beside it reads as its own, or `None`:
/// the keys Kubernetes sets on a Job's pods (`job-name`, `controller-uid`), a prefix of
/// [`RESERVED_LABEL_DOMAINS`] or a subdomain of one, a key starting with such a domain
/// reversed (`com.docker.`) or with one of [`RESERVED_LABEL_STARTS`].
pub fn reserved_label(key: &str) -> Option<String> {
    if matches!(key, "job-name" | "controller-uid") {
        return Some(format!("{key} is set by Kubernetes on a Job's pods"));
    }
    let prefix = key.split_once('/').map(|(prefix, _)| prefix);
    for domain in RESERVED_LABEL_DOMAINS {
        if let Some(prefix) = prefix
            && (prefix == *domain || prefix.ends_with(&format!(".{domain}")))
        {
            return Some(format!("{domain}/* and *.{domain}/* are reserved"));
        }
        let reversed: Vec<&str> = domain.rsplit('.').collect();
        let reversed = reversed.join(".");
        if key == reversed || key.starts_with(&format!("{reversed}.")) {
            return Some(format!("{reversed}.* is reserved"));
        }
    }
    RESERVED_LABEL_STARTS
        .iter()
        .find(|start| key.starts_with(*start))
        .map(|start| format!("{start}* is read by a proxy or a service mesh"))
}

/// What the operator allows a routine to ask for (`run` flags or `--mission-config`):
///
/// - `env_allow`: the only `env` names a routine may set (patterns with `*`, `"REPORT_*"`);
///   [`DEFAULT_ENV_ALLOW`] when absent. No entry opens the floor ([`DENIED_ENV`], `CM_*`).
/// - `label_allow`: the only label keys a routine may set (`"team.example.com/*"`);
///   [`DEFAULT_LABEL_ALLOW`] when absent. No entry opens a reserved key ([`reserved_label`],
///   `cm.*`).
/// - `repository_hosts`: the only hosts a repository may name (`"git.example.com"`, or
///   `"*.example.com"` for its subdomains); any host the rules allow when absent. A name listed
///   here is not resolved at dispatch: this list is the one rule the runtime's own resolution
///   cannot get around.
///
/// Checked when a routine is created, updated or imported with the operator's settings at
/// hand, and again at every dispatch, so a routine written before the policy changed is
/// refused, not launched.
///
/// ```
/// use cm_domain::{Mission, MissionPolicy};
///
/// let m = Mission::from_json(
///     r#"{"repository": "https://git.example.com/r.git", "task": "t", "env": {"DEBUG": "1"}}"#,
/// ).unwrap();
/// // By default a routine may set the time zone and the locale, nothing else.
/// assert_eq!(MissionPolicy::default().check(&m).unwrap_err().field(), Some("env.DEBUG"));
/// let policy = MissionPolicy::new(Some(vec!["DEBUG".into()]), None, None).unwrap();
/// policy.check(&m).unwrap();
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MissionPolicy {
    env_allow: Option<Vec<String>>,
    label_allow: Option<Vec<String>>,
    repository_hosts: Option<Vec<String>>,
}

impl MissionPolicy {
    /// A policy from the operator's lists; an error names the malformed entry. An allowed env
    /// name is `[A-Z0-9_*]`, a label pattern `[a-zA-Z0-9._/-*]`, a host pattern a host name,
    /// optionally after `*.`.
    pub fn new(
        env_allow: Option<Vec<String>>,
        label_allow: Option<Vec<String>>,
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
        for pattern in label_allow.iter().flatten() {
            if pattern.is_empty()
                || !pattern
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | '*'))
            {
                return Err(format!(
                    "label_allow entry {pattern:?} must be a label key or a pattern of \
                     letters, digits, ., _, -, / and * (\"team.example.com/*\")"
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
            label_allow,
            repository_hosts,
        })
    }

    /// The `env` names a routine may set: the operator's, or [`DEFAULT_ENV_ALLOW`].
    pub fn env_allow(&self) -> Vec<&str> {
        match &self.env_allow {
            Some(allow) => allow.iter().map(String::as_str).collect(),
            None => DEFAULT_ENV_ALLOW.to_vec(),
        }
    }

    /// The label keys a routine may set: the operator's, or [`DEFAULT_LABEL_ALLOW`].
    pub fn label_allow(&self) -> Vec<&str> {
        match &self.label_allow {
            Some(allow) => allow.iter().map(String::as_str).collect(),
            None => DEFAULT_LABEL_ALLOW.to_vec(),
        }
    }

    /// Whether the operator's `repository_hosts` names `host` (a repository host as
    /// [`Mission::repository_host`] gives it). `false` when there is no such list.
    pub fn names_host(&self, host: &str) -> bool {
        self.repository_hosts
            .iter()
            .flatten()
            .any(|pattern| match pattern.strip_prefix("*.") {
                Some(domain) => host
                    .strip_suffix(domain)
                    .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
                None => pattern == host,
            })
    }

    /// Refuses a mission that asks for what this policy does not allow, naming the field.
    pub fn check(&self, mission: &Mission) -> Result<(), MissionError> {
        let unlisted =
            |allow: &[&str], key: &str| !allow.iter().any(|pattern| glob_matches(pattern, key));
        let env_allow = self.env_allow();
        if let Some(name) = mission.env().keys().find(|name| unlisted(&env_allow, name)) {
            return Err(refuse(
                format!("env.{name}"),
                format!(
                    "is not among the names a routine may set (env_allow: {}{}); the operator \
                     adds names with --mission-env-allow or \"env_allow\"",
                    env_allow.join(", "),
                    if self.env_allow.is_none() {
                        ", the default"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let label_allow = self.label_allow();
        if let Some(key) = mission
            .labels()
            .keys()
            .find(|key| unlisted(&label_allow, key))
        {
            return Err(refuse(
                format!("labels.{key}"),
                format!(
                    "is not among the label keys a routine may set (label_allow: {}{}); the \
                     operator adds keys with --mission-label-allow or \"label_allow\"",
                    label_allow.join(", "),
                    if self.label_allow.is_none() {
                        ", the default"
                    } else {
                        ""
                    }
                ),
            ));
        }
        if let Some(hosts) = &self.repository_hosts
            && !self.names_host(mission.repository_host())
        {
            return Err(refuse(
                "repository",
                format!(
                    "host {} is not among the hosts the operator allows \
                     (repository_hosts: {})",
                    mission.repository_host(),
                    hosts.join(", ")
                ),
            ));
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
            "deploy@git.example.com:team/repo.git",
            "root@host:repo",
            "https://example.invalid/r.git",
            "https://10.0.0.5/team/r.git",
            "ssh://git@[2001:db8::1]/team/r.git",
            "ssh://git@[2001:db8::1%25eth0]:22/team/r.git",
            "git@[2001:db8::1]:team/r.git",
            "ssh://deploy-bot_1@git.example.com/r.git",
            "https://localhost.example.com/r.git",
            "https://127.0.0.1.nip.io/r.git",
            "https://git.example.com./r.git",
        ] {
            accepted(&format!(r#"{{"repository": "{ok}", "task": "t"}}"#));
        }
        for (repository, host) in [
            ("https://Git.Example.COM/r.git", "git.example.com"),
            ("git@git.example.com:r.git", "git.example.com"),
            ("https://GIT.example.com./r.git", "git.example.com"),
            ("ssh://git@g%69t.example.com/r.git", "git.example.com"),
            ("https://10.1/r.git", "10.0.0.1"),
            ("ssh://git@[2001:DB8::1]/r.git", "2001:db8::1"),
        ] {
            let m = accepted(&format!(r#"{{"repository": "{repository}", "task": "t"}}"#));
            assert_eq!(m.repository_host(), host, "{repository}");
        }
        for bad in [
            "",
            "/srv/git/repo.git",
            "./repo",
            "file:///srv/git/repo.git",
            "http://git.example.com/repo.git",
            "git://git.example.com/repo.git",
            "ftp://git.example.com/repo.git",
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
            "host:repo",
            "https://git.example.com/re po",
            "https://git.example.com/r.git?x=1",
            "https://git.example.com/r.git#main",
            "https://git.example.com\\\\@other.example/r.git",
            // A user or host a client could read as an option.
            "ssh://-oProxyCommand=touch%20x@git.example.com/r.git",
            "ssh://-x@git.example.com/r.git",
            "ssh://a%20b@git.example.com/r.git",
            "ssh://%2Dx@git.example.com/r.git",
            "ssh://git@-oProxyCommand=x/r.git",
            // Hosts no client reads the same way.
            "https://1.2.3.08/r.git",
            "https://git.example.0x1/r.git",
            "https://a..b/r.git",
            "https://%E2%93%9Bocalhost/r.git",
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

    /// Every form of a host a mission may never reach, in every URL form: each refused, its
    /// error naming why. The review reproduced the `ssh://` ones as created.
    #[test]
    fn every_form_of_a_denied_host_is_refused_whatever_the_scheme() {
        const LOOPBACK: &str = "a loopback address";
        const UNSPECIFIED: &str = "an unspecified address";
        const LINK_LOCAL: &str = "a link-local address";
        const METADATA: &str = "metadata service";
        const OWN_HOST: &str = "the scheduler's own host or a metadata service";
        let cases = [
            // The issue's ssh:// cases.
            ("ssh://git@127.0.0.1:5432/r.git", LOOPBACK),
            ("ssh://git@0x7f000001:5432/r.git", LOOPBACK),
            ("ssh://git@127.1:5432/r.git", LOOPBACK),
            ("ssh://git@0.0.0.0:5432/r.git", UNSPECIFIED),
            ("ssh://git@169.254.169.254/latest", METADATA),
            // Every IPv4 notation inet_aton reads, in every form.
            ("ssh://git@2130706433/r.git", LOOPBACK),
            ("ssh://git@017700000001/r.git", LOOPBACK),
            ("ssh://git@0x7f.1/r.git", LOOPBACK),
            ("ssh://git@0177.0.0.1/r.git", LOOPBACK),
            ("ssh://git@0x7f.0.0.0x1/r.git", LOOPBACK),
            ("ssh://git@127.0.1/r.git", LOOPBACK),
            ("ssh://git@127.0.0.1./r.git", LOOPBACK),
            ("ssh://git@127.0.0.%31/r.git", LOOPBACK),
            ("ssh://git@%31%32%37.1/r.git", LOOPBACK),
            ("ssh://git@[127.0.0.1]:22/r.git", LOOPBACK),
            ("ssh://127.0.0.1/r.git", LOOPBACK),
            ("ssh://127.0.0.1:22/r.git", LOOPBACK),
            ("ssh://0/r.git", UNSPECIFIED),
            ("ssh://0x0/r.git", UNSPECIFIED),
            ("ssh://git@0xa9fea9fe/latest", METADATA),
            ("ssh://git@169.254.43518/latest", METADATA),
            ("ssh://git@0251.0376.0251.0376/latest", METADATA),
            ("ssh://git@169.254.0.23/r.git", LINK_LOCAL),
            ("ssh://git@100.100.100.200/latest", METADATA),
            ("ssh://git@255.255.255.255/r.git", UNSPECIFIED),
            ("https://127.0.0.1/r.git", LOOPBACK),
            ("https://127.1/r.git", LOOPBACK),
            ("https://2130706433/r.git", LOOPBACK),
            ("https://0x7f000001/r.git", LOOPBACK),
            ("https://0X7F000001:443/r.git", LOOPBACK),
            ("https://127.0.0.1.:8443/r.git", LOOPBACK),
            ("https://0.0.0.0/r.git", UNSPECIFIED),
            ("https://0/r.git", UNSPECIFIED),
            ("https://169.254.169.254/latest/meta-data", METADATA),
            ("https://100.100.100.200/latest", METADATA),
            ("https://192.0.0.192/latest", METADATA),
            ("git://127.0.0.1/r.git", LOOPBACK),
            ("git://0x7f000001/r.git", LOOPBACK),
            ("git://169.254.169.254/latest", METADATA),
            ("http://127.1/r.git", LOOPBACK),
            ("file://127.0.0.1/r.git", LOOPBACK),
            ("git+ssh://git@127.1/r.git", LOOPBACK),
            ("git@127.0.0.1:r.git", LOOPBACK),
            ("git@127.1:r.git", LOOPBACK),
            ("git@0x7f000001:r.git", LOOPBACK),
            ("git@2130706433:r.git", LOOPBACK),
            ("deploy@127.0.0.1.:r.git", LOOPBACK),
            ("git@0.0.0.0:r.git", UNSPECIFIED),
            ("git@169.254.169.254:r.git", METADATA),
            ("git@[127.0.0.1]:r.git", LOOPBACK),
            // IPv6: loopback, unspecified, link-local with zones, metadata, and IPv4 inside.
            ("https://[::1]/r.git", LOOPBACK),
            ("ssh://git@[::1]/r.git", LOOPBACK),
            ("ssh://git@[::1]:5432/r.git", LOOPBACK),
            ("ssh://git@[0:0:0:0:0:0:0:1]/r.git", LOOPBACK),
            ("ssh://git@[::1%25lo]/r.git", LOOPBACK),
            ("git@[::1]:r.git", LOOPBACK),
            ("https://[::]/r.git", UNSPECIFIED),
            ("ssh://git@[::]/r.git", UNSPECIFIED),
            ("https://[fe80::1]/r.git", LINK_LOCAL),
            ("ssh://git@[fe80::1%25eth0]/r.git", LINK_LOCAL),
            ("ssh://git@[fe80::1%eth0]/r.git", LINK_LOCAL),
            ("git@[fe80::1%eth0]:r.git", LINK_LOCAL),
            ("ssh://git@[FEBF::1]/r.git", LINK_LOCAL),
            ("https://[fd00:ec2::254]/latest", METADATA),
            ("ssh://git@[fd00:ec2::254]/latest", METADATA),
            ("https://[::ffff:127.0.0.1]/r.git", LOOPBACK),
            ("ssh://git@[::ffff:127.0.0.1]/r.git", LOOPBACK),
            ("ssh://git@[::ffff:7f00:1]/r.git", LOOPBACK),
            ("ssh://git@[::127.0.0.1]/r.git", LOOPBACK),
            ("ssh://git@[::ffff:0:127.0.0.1]/r.git", LOOPBACK),
            ("ssh://git@[64:ff9b::169.254.169.254]/latest", METADATA),
            ("ssh://git@[::ffff:169.254.169.254]/latest", METADATA),
            ("ssh://git@[::ffff:0.0.0.0]/r.git", UNSPECIFIED),
            // Names of the scheduler's own host and of metadata services, however written.
            ("https://localhost/r.git", OWN_HOST),
            ("https://LOCALHOST./r.git", OWN_HOST),
            ("https://git.localhost/r.git", OWN_HOST),
            ("ssh://git@localhost/r.git", OWN_HOST),
            ("ssh://git@localhost.:5432/r.git", OWN_HOST),
            ("ssh://git@l%6Fcalhost/r.git", OWN_HOST),
            ("ssh://git@[localhost]/r.git", OWN_HOST),
            ("git@localhost:r.git", OWN_HOST),
            ("git@LocalHost.:r.git", OWN_HOST),
            (
                "https://metadata.google.internal/computeMetadata/v1",
                OWN_HOST,
            ),
            ("ssh://git@metadata.google.internal./x", OWN_HOST),
            ("git@instance-data:r.git", OWN_HOST),
            ("https://metadata/r.git", OWN_HOST),
        ];
        for (repository, why) in cases {
            let err =
                Mission::from_json(&format!(r#"{{"repository": "{repository}", "task": "t"}}"#))
                    .map(|m| panic!("{repository} was accepted, host {:?}", m.host()))
                    .unwrap_err();
            assert_eq!(err.field(), Some("repository"), "{repository}: {err}");
            assert!(err.to_string().contains(why), "{repository}: {err}");
        }
        // Percent-encoding an address's digits does not change what the check reads.
        let err = Mission::from_json(
            r#"{"repository": "ssh://git@[fd00:ec2::25%34]/latest", "task": "t"}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("fd00:ec2::254"), "{err}");
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
            // The second review's, each created before the floor named it.
            ("LUA_INIT", "LUA_INIT*"),
            ("LUA_INIT_5_4", "LUA_INIT*"),
            ("ZDOTDIR", "ZDOTDIR"),
            ("RUSTC_WRAPPER", "RUSTC*"),
            ("CARGO_BUILD_RUSTC_WRAPPER", "CARGO_*"),
            ("GOFLAGS", "GO*"),
            ("GOPROXY", "GO*"),
            ("PIP_INDEX_URL", "PIP_*"),
            ("NPM_CONFIG_REGISTRY", "NPM_CONFIG_*"),
            ("AWS_ENDPOINT_URL", "AWS_*"),
            ("SSL_CERT_FILE", "SSL_*"),
            ("CURL_CA_BUNDLE", "CURL_*"),
            ("NODE_EXTRA_CA_CERTS", "NODE_EXTRA_CA_CERTS"),
            ("LESSOPEN", "LESSOPEN"),
            ("GLIBC_TUNABLES", "GLIBC_TUNABLES"),
            ("XDG_CONFIG_HOME", "XDG_*"),
            ("JAVA_OPTS", "*_OPTS"),
            ("MAVEN_OPTS", "*_OPTS"),
            ("CLASSPATH", "CLASSPATH"),
            ("OPENSSL_CONF", "OPENSSL_*"),
            ("GRADLE_USER_HOME", "GRADLE_*"),
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
            MissionPolicy::new(
                Some(names.iter().map(|n| n.to_string()).collect()),
                None,
                None,
            )
            .unwrap()
        };
        allow(&["REPORT_*", "LANG"]).check(&m).unwrap();
        let err = allow(&["REPORT_*"]).check(&m).unwrap_err();
        assert_eq!(err.field(), Some("env.LANG"));
        assert!(err.to_string().contains("env_allow: REPORT_*"), "{err}");
        // An empty allow list allows no variable at all, and any mission without one.
        assert_eq!(allow(&[]).check(&m).unwrap_err().field(), Some("env.LANG"));
        allow(&[]).check(&accepted(&mission(""))).unwrap();
        // The allow list never opens the floor: those names are refused before any policy.
        for name in ["PATH", "LD_PRELOAD", "LUA_INIT", "CM_TASK"] {
            refused(
                &mission(&format!(r#""env": {{"{name}": "x"}}"#)),
                &format!("env.{name}"),
            );
        }
        assert!(MissionPolicy::new(Some(vec!["lower".into()]), None, None).is_err());
        assert!(MissionPolicy::new(Some(vec!["".into()]), None, None).is_err());

        let hosts = |hosts: &[&str]| {
            MissionPolicy::new(
                None,
                None,
                Some(hosts.iter().map(|h| h.to_string()).collect()),
            )
        };
        let at = |repository: &str| {
            accepted(&format!(r#"{{"repository": "{repository}", "task": "t"}}"#))
        };
        let policy = hosts(&["Git.Example.com", "*.corp.example", "10.0.0.5"]).unwrap();
        for ok in [
            "https://git.example.com/r.git",
            "https://GIT.example.com./r.git",
            "git@git.example.com:r.git",
            "ssh://git@a.b.corp.example/r.git",
            "ssh://git@10.0.0.5/r.git",
            "https://0x0a000005/r.git",
        ] {
            policy.check(&at(ok)).unwrap();
            assert!(policy.names_host(at(ok).repository_host()), "{ok}");
        }
        for bad in [
            "https://evil.example/r.git",
            "https://corp.example/r.git",
            "https://xcorp.example/r.git",
            "https://git.example.com.evil.example/r.git",
            "https://10.0.0.6/r.git",
        ] {
            let err = policy.check(&at(bad)).unwrap_err();
            assert_eq!(err.field(), Some("repository"), "{bad}");
            assert!(err.to_string().contains("repository_hosts"), "{err}");
            assert!(!policy.names_host(at(bad).repository_host()), "{bad}");
        }
        assert!(!MissionPolicy::default().names_host("git.example.com"));
        assert!(hosts(&["-x"]).is_err());
        assert!(hosts(&["a b"]).is_err());
    }

    /// Without the operator's lists, a routine may set the time zone, the locale and labels
    /// under `routine/`; every other name and key is refused with where to allow it.
    #[test]
    fn allow_lists_by_default() {
        let policy = MissionPolicy::default();
        for env in [
            r#"{"TZ": "Europe/Paris"}"#,
            r#"{"LANG": "C.UTF-8", "LANGUAGE": "fr:en"}"#,
            r#"{"LC_ALL": "C", "LC_MESSAGES": "fr_FR.UTF-8"}"#,
        ] {
            policy
                .check(&accepted(&mission(&format!(r#""env": {env}"#))))
                .unwrap();
        }
        for name in [
            "REPORT_FORMAT",
            "DEBUG",
            "A",
            "LC",
            "TZDIR",
            "LANGX",
            "MY_LANG",
            // Names the floor does not list that still steer a tool: only an allow list keeps
            // every one out.
            "BROWSER",
            "TERMINFO",
            "GNUPGHOME",
            "KRB5_CONFIG",
        ] {
            let m = accepted(&mission(&format!(r#""env": {{"{name}": "x"}}"#)));
            let err = policy.check(&m).unwrap_err();
            assert_eq!(err.field(), Some(format!("env.{name}").as_str()));
            assert!(
                err.to_string()
                    .contains("env_allow: TZ, LANG, LANGUAGE, LC_*, the default"),
                "{err}"
            );
            assert!(err.to_string().contains("--mission-env-allow"), "{err}");
        }
        for labels in [
            r#"{"routine/team": "platform"}"#,
            r#"{"routine/tier": "a_b.c", "routine/x": ""}"#,
        ] {
            policy
                .check(&accepted(&mission(&format!(r#""labels": {labels}"#))))
                .unwrap();
        }
        for key in [
            "team",
            "app",
            "example.com/team",
            "routinex/a",
            "routine.example/a",
        ] {
            let m = accepted(&mission(&format!(r#""labels": {{"{key}": "x"}}"#)));
            let err = policy.check(&m).unwrap_err();
            assert_eq!(err.field(), Some(format!("labels.{key}").as_str()));
            assert!(
                err.to_string()
                    .contains("label_allow: routine/*, the default"),
                "{err}"
            );
        }
        // The operator's lists replace the defaults.
        let policy = MissionPolicy::new(
            Some(vec!["REPORT_*".into(), "TZ".into()]),
            Some(vec!["team.example.com/*".into(), "app".into()]),
            None,
        )
        .unwrap();
        policy
            .check(&accepted(&mission(
                r#""env": {"REPORT_FORMAT": "md", "TZ": "UTC"},
                   "labels": {"team.example.com/owner": "a", "app": "b"}"#,
            )))
            .unwrap();
        for (fields, field) in [
            (r#""env": {"LANG": "C"}"#, "env.LANG"),
            (r#""labels": {"routine/team": "a"}"#, "labels.routine/team"),
            (
                r#""labels": {"x.team.example.com/a": "b"}"#,
                "labels.x.team.example.com/a",
            ),
        ] {
            let err = policy.check(&accepted(&mission(fields))).unwrap_err();
            assert_eq!(err.field(), Some(field), "{err}");
        }
        assert!(MissionPolicy::new(None, Some(vec!["a b".into()]), None).is_err());
        assert!(MissionPolicy::new(None, Some(vec!["".into()]), None).is_err());
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
        // Keys a runtime, an ingress or proxy controller or a service mesh reads: refused
        // whatever the operator allows.
        for key in [
            "job-name",
            "controller-uid",
            "batch.kubernetes.io/job-name",
            "batch.kubernetes.io/controller-uid",
            "kubernetes.io/x",
            "node.kubernetes.io/x",
            "app.kubernetes.io/name",
            "nginx.ingress.kubernetes.io/rewrite-target",
            "k8s.io/x",
            "x.k8s.io/y",
            "io.kubernetes.pod.name",
            "com.docker.compose.project",
            "com.docker.stack.namespace",
            "io.docker.x",
            "org.dockerproject.x",
            "docker.io/x",
            "traefik.enable",
            "traefik.http.routers.r.rule",
            "traefik.io/x",
            "io.traefik.x",
            "caddy",
            "caddy.reverse_proxy",
            "istio-injection",
            "istio.io/rev",
            "sidecar.istio.io/inject",
            "security.istio.io/tlsMode",
            "linkerd.io/inject",
            "config.linkerd.io/skip-outbound-ports",
            "konghq.com/plugins",
            "io.cilium.x",
            "policy.cilium.io/x",
            "prometheus.io/scrape",
            "com.centurylinklabs.watchtower.enable",
        ] {
            assert!(reserved_label(key).is_some(), "{key}");
            refused(
                &mission(&format!(r#""labels": {{"{key}": "x"}}"#)),
                &format!("labels.{key}"),
            );
            // An allow list that would admit the key does not open it.
            let everything = MissionPolicy::new(None, Some(vec!["*".into()]), None).unwrap();
            assert!(everything.label_allow().contains(&"*"));
        }
        for key in [
            "example.com/job-name",
            "mykubernetes.io/a",
            "job-names",
            "routine/traefik.enable",
            "routine/istio-injection",
            "example.com/io.kubernetes.x",
            "dockerx.io/a",
        ] {
            assert_eq!(reserved_label(key), None, "{key}");
            accepted(&mission(&format!(r#""labels": {{"{key}": "x"}}"#)));
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
