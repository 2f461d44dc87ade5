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
//!
//! # Where each rule lives
//!
//! - this module: the file as a whole ([`Mission`], [`MissionError`]): its size, its fields
//!   (read as strings, and `env` and `labels` as maps of strings), and its `task`.
//! - `checkout`: what the mission checks out: the `repository` and the `ref`.
//! - `env`: the routine's own variables, and the names none may set ([`DENIED_ENV`]).
//! - `labels`: the routine's own labels, and the keys a runtime reads ([`reserved_label`]).
//! - `policy`: what the operator allows on top of those rules ([`MissionPolicy`]).
//! - `glob`: the `*` patterns the deny list and the allow lists are written in.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

use crate::repository::Host;

mod checkout;
mod env;
mod glob;
mod labels;
mod policy;

pub use checkout::{MAX_REF_BYTES, MAX_REPOSITORY_CHARS};
pub use env::{
    DENIED_ENV, MAX_ENV_NAME_CHARS, MAX_ENV_VALUE_BYTES, MAX_ENV_VARS, RESERVED_ENV_PREFIX,
    denied_env,
};
pub use labels::{
    MAX_LABEL_CHARS, MAX_LABELS, RESERVED_LABEL_DOMAINS, RESERVED_LABEL_PREFIX,
    RESERVED_LABEL_STARTS, reserved_label,
};
pub use policy::{DEFAULT_ENV_ALLOW, DEFAULT_LABEL_ALLOW, MissionPolicy};

use checkout::{check_ref, check_repository};
use env::check_env;
use labels::check_label;

/// The most bytes a mission file may hold.
pub const MAX_MISSION_BYTES: usize = 256 * 1024;
/// The most bytes of `task` (64 KiB): it reaches the mission as `CM_TASK`, and Linux refuses a
/// single environment string over 128 KiB.
pub const MAX_TASK_BYTES: usize = 64 * 1024;

const FIELDS: [&str; 5] = ["repository", "ref", "task", "env", "labels"];

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
    /// [`denied_address`](crate::repository::denied_address) refuses.
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

impl fmt::Display for Mission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.repository)?;
        if let Some(git_ref) = &self.git_ref {
            write!(f, "@{git_ref}")?;
        }
        Ok(())
    }
}

/// Mission texts and the checks the tests of each rule share.
#[cfg(test)]
mod testing {
    use super::Mission;

    /// A mission made of `fields` added to a minimal valid one.
    pub(super) fn mission(fields: &str) -> String {
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
    pub(super) fn refused(text: &str, field: &str) {
        match Mission::from_json(text) {
            Ok(m) => panic!("{text} was accepted as {m:?}"),
            Err(e) => assert!(
                e.field() == Some(field) || (e.field().is_none() && e.to_string().contains(field)),
                "{text}: {e} does not name {field}"
            ),
        }
    }

    pub(super) fn accepted(text: &str) -> Mission {
        Mission::from_json(text).unwrap_or_else(|e| panic!("{text} was refused: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mission::testing::{accepted, mission, refused};

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
