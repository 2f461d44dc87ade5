//! What the operator allows a routine to ask for, on top of the rules every mission follows: the
//! `env` names, the label keys and the repository hosts ([`MissionPolicy`]).

use super::glob::glob_matches;
use super::{Mission, MissionError, refuse};

/// The `env` names a routine may set when the operator gives no `env_allow`: the time zone and
/// the locale, which no tool reads to run something or to connect somewhere.
pub const DEFAULT_ENV_ALLOW: [&str; 4] = ["TZ", "LANG", "LANGUAGE", "LC_*"];

/// The label keys a routine may set when the operator gives no `label_allow`: those under the
/// prefix `routine/`, which no runtime, controller or selector of cm's reads.
pub const DEFAULT_LABEL_ALLOW: [&str; 1] = ["routine/*"];

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
///
/// [`DENIED_ENV`]: super::DENIED_ENV
/// [`reserved_label`]: super::reserved_label
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mission::testing::{accepted, mission, refused};

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
}
