//! What every mission backend launches: the mission's environment and labels, and the
//! operator's configuration of the runtime.
//!
//! A mission routine's payload says *what* to work on (a [`Mission`]); the operator says *how*
//! it runs (a [`MissionConfig`]: image, command, user, resources, network, namespace). A backend
//! turns one [`Dispatch`] into a [`Launch`], the environment and labels DESIGN.md promises every
//! mission, and hands that to its runtime under a name derived from the idempotency key.

use std::collections::BTreeMap;

use cm_domain::{Mission, MissionPolicy};
use serde::Deserialize;

use crate::{Dispatch, DispatchError};

/// The operator's configuration of mission containers and Jobs (`--mission-config FILE`, JSON).
///
/// Nothing here comes from a routine: a routine cannot choose the image, the command, the
/// resources, the network or the credentials its mission runs with. Unknown fields are refused,
/// so a misspelt setting is an error at start, not a silent default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MissionConfig {
    /// The image every mission runs (`--mission-image` overrides it).
    #[serde(default)]
    pub image: Option<String>,
    /// The command run in the image; the image's own entrypoint and command when absent.
    #[serde(default)]
    pub command: Vec<String>,
    /// The user the mission runs as (`uid[:gid]` or a name); the image's when absent.
    #[serde(default)]
    pub user: Option<String>,
    /// The only `env` names a routine may set (patterns with `*`: `["REPORT_*", "LANG"]`); any
    /// name the mission rules allow when absent. It narrows the rules, never widens them.
    #[serde(default)]
    pub env_allow: Option<Vec<String>>,
    /// The only hosts a routine's repository may name (`["git.example.com", "*.corp.example"]`);
    /// any host the mission rules allow when absent.
    #[serde(default)]
    pub repository_hosts: Option<Vec<String>>,
    /// Docker's settings.
    #[serde(default)]
    pub docker: DockerConfig,
    /// Kubernetes' settings.
    #[serde(default)]
    pub kubernetes: KubernetesConfig,
}

/// The Docker backend's settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DockerConfig {
    /// The network the container joins (`HostConfig.NetworkMode`); Docker's default when absent.
    #[serde(default)]
    pub network: Option<String>,
    /// The memory limit in bytes.
    #[serde(default)]
    pub memory_bytes: Option<i64>,
    /// The CPU limit in billionths of a CPU (`1000000000` is one CPU).
    #[serde(default)]
    pub nano_cpus: Option<i64>,
    /// Remove the container when it exits. Off by default: a removed container frees its name,
    /// and a retry of its occurrence after that would launch a second one.
    #[serde(default)]
    pub auto_remove: bool,
    /// How long a stop (overlap policy `replace`) waits after SIGTERM before it kills, in
    /// seconds (Docker's `t`); 10 by default, as `docker stop`.
    #[serde(default = "default_stop_grace")]
    pub stop_grace_seconds: i32,
}

/// The Kubernetes backend's settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    /// The namespace Jobs are created in (the kubeconfig context's namespace is not used).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The service account the mission's pod runs as; the namespace's default when absent.
    #[serde(default)]
    pub service_account: Option<String>,
    /// How many times Kubernetes retries a failed pod (`backoffLimit`). 0 by default: a mission
    /// costs money, and a second run is the operator's decision.
    #[serde(default)]
    pub backoff_limit: i32,
    /// The longest a Job may run (`activeDeadlineSeconds`).
    #[serde(default = "default_active_deadline")]
    pub active_deadline_seconds: i64,
    /// How long a finished Job is kept before Kubernetes deletes it (`ttlSecondsAfterFinished`).
    /// Keep it well past the time a retry of an occurrence can still come (a lease and a tick):
    /// a deleted Job frees its name, and a create after that would launch the mission again.
    #[serde(default = "default_ttl")]
    pub ttl_seconds_after_finished: i32,
    /// CPU request and limit (a Kubernetes quantity, `"500m"`).
    #[serde(default)]
    pub cpu: Option<String>,
    /// Memory request and limit (a Kubernetes quantity, `"2Gi"`).
    #[serde(default)]
    pub memory: Option<String>,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            namespace: default_namespace(),
            service_account: None,
            backoff_limit: 0,
            active_deadline_seconds: default_active_deadline(),
            ttl_seconds_after_finished: default_ttl(),
            cpu: None,
            memory: None,
        }
    }
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            network: None,
            memory_bytes: None,
            nano_cpus: None,
            auto_remove: false,
            stop_grace_seconds: default_stop_grace(),
        }
    }
}

fn default_stop_grace() -> i32 {
    10
}

fn default_namespace() -> String {
    "default".into()
}

fn default_active_deadline() -> i64 {
    6 * 3600
}

fn default_ttl() -> i32 {
    7 * 24 * 3600
}

impl MissionConfig {
    /// Reads the configuration from JSON text; the error says what is wrong and where.
    pub fn from_json(text: &str) -> Result<MissionConfig, String> {
        let config: MissionConfig = serde_json::from_str(text).map_err(|e| e.to_string())?;
        config.policy()?;
        Ok(config)
    }

    /// What the operator allows routines to ask for (`env_allow`, `repository_hosts`), or why
    /// one of those lists is malformed.
    pub fn policy(&self) -> Result<MissionPolicy, String> {
        MissionPolicy::new(self.env_allow.clone(), self.repository_hosts.clone())
    }
}

/// One mission as a runtime receives it: the routine's mission plus cm's environment and labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The runtime name of the container, Job or marker: the occurrence's idempotency key.
    pub name: String,
    /// The mission file, validated.
    pub mission: Mission,
    /// Every variable the mission sees: `CM_*` first, then the mission's `env`.
    pub env: Vec<(String, String)>,
    /// `cm.routine-id`, `cm.scheduled-at`, `cm.attempt`, then the mission's own labels.
    pub labels: BTreeMap<String, String>,
}

impl Launch {
    /// The launch of `dispatch`, or [`DispatchError::Rejected`] if its payload is not a valid
    /// mission or asks for what `policy` does not allow (a routine stored before a rule or the
    /// operator's policy changed, or written around them): such a mission is never launched.
    pub fn of(dispatch: &Dispatch, policy: &MissionPolicy) -> Result<Launch, DispatchError> {
        let mission = Mission::from_value(&dispatch.payload)
            .and_then(|mission| policy.check(&mission).map(|()| mission))
            .map_err(|e| DispatchError::Rejected(e.to_string()))?;
        let scheduled_at = dispatch
            .occurrence
            .scheduled_at
            .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
        let routine_id = dispatch.occurrence.routine_id.to_string();
        let mut env = vec![
            ("CM_ROUTINE_ID".to_owned(), routine_id.clone()),
            ("CM_ROUTINE_NAME".to_owned(), dispatch.routine_name.clone()),
            ("CM_SCHEDULED_AT".to_owned(), scheduled_at.clone()),
            ("CM_ATTEMPT".to_owned(), dispatch.attempt.to_string()),
            (
                "CM_IDEMPOTENCY_KEY".to_owned(),
                dispatch.idempotency_key.to_string(),
            ),
            ("CM_REPOSITORY".to_owned(), mission.repository().to_owned()),
            (
                "CM_REF".to_owned(),
                mission.git_ref().unwrap_or_default().to_owned(),
            ),
            ("CM_TASK".to_owned(), mission.task().to_owned()),
        ];
        env.extend(mission.env().iter().map(|(k, v)| (k.clone(), v.clone())));
        let mut labels = mission.labels().clone();
        labels.insert("cm.routine-id".into(), routine_id);
        labels.insert("cm.scheduled-at".into(), scheduled_at);
        labels.insert("cm.attempt".into(), dispatch.attempt.to_string());
        Ok(Launch {
            name: dispatch.idempotency_key.to_string(),
            mission,
            env,
            labels,
        })
    }

    /// The environment as `NAME=value` strings, as the Docker API takes it.
    pub fn env_strings(&self) -> Vec<String> {
        self.env.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use chrono::{TimeZone, Utc};
    use cm_domain::Occurrence;
    use cm_store::RoutineKind;
    use serde_json::json;
    use uuid::Uuid;

    use super::*;

    #[test]
    fn every_mission_gets_cm_environment_and_labels() {
        let at = Utc.with_ymd_and_hms(2026, 3, 29, 1, 30, 0).unwrap();
        let dispatch = Dispatch::new(
            Occurrence::new(Uuid::from_u128(7), at),
            "nightly",
            RoutineKind::Mission,
            json!({"repository": "https://h.example/r.git", "task": "lint",
                   "env": {"A": "1"}, "labels": {"team": "platform"}}),
            2,
            Instant::now(),
        );
        let launch = Launch::of(&dispatch, &MissionPolicy::default()).unwrap();
        assert_eq!(launch.name, dispatch.idempotency_key.to_string());
        let env: BTreeMap<_, _> = launch.env.iter().cloned().collect();
        for (name, value) in [
            ("CM_ROUTINE_ID", "00000000-0000-0000-0000-000000000007"),
            ("CM_ROUTINE_NAME", "nightly"),
            ("CM_SCHEDULED_AT", "2026-03-29T01:30:00Z"),
            ("CM_ATTEMPT", "2"),
            ("CM_IDEMPOTENCY_KEY", launch.name.as_str()),
            ("CM_REPOSITORY", "https://h.example/r.git"),
            ("CM_REF", ""),
            ("CM_TASK", "lint"),
            ("A", "1"),
        ] {
            assert_eq!(env.get(name).map(String::as_str), Some(value), "{name}");
        }
        assert_eq!(env.len(), 9);
        assert_eq!(
            launch.labels,
            BTreeMap::from(
                [
                    ("cm.routine-id", "00000000-0000-0000-0000-000000000007"),
                    ("cm.scheduled-at", "2026-03-29T01:30:00Z"),
                    ("cm.attempt", "2"),
                    ("team", "platform"),
                ]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
            )
        );
    }

    #[test]
    fn an_invalid_payload_is_rejected_not_launched() {
        let dispatch = Dispatch::new(
            Occurrence::new(Uuid::nil(), Utc::now()),
            "n",
            RoutineKind::Mission,
            json!({"repository": "file:///etc"}),
            1,
            Instant::now(),
        );
        let err = Launch::of(&dispatch, &MissionPolicy::default()).unwrap_err();
        assert!(
            matches!(&err, DispatchError::Rejected(text) if text.contains("repository")),
            "{err}"
        );
    }

    /// A routine stored before the env rules (or written around them) is refused at dispatch
    /// with the reason, and so is one the operator's policy does not allow.
    #[test]
    fn a_stored_payload_that_would_steer_the_runner_is_rejected() {
        let dispatch = |payload| {
            Dispatch::new(
                Occurrence::new(Uuid::nil(), Utc::now()),
                "n",
                RoutineKind::Mission,
                payload,
                1,
                Instant::now(),
            )
        };
        for (name, value) in [
            ("BASH_ENV", "$(id > /tmp/x)"),
            ("PATH", "/tmp/evil"),
            ("GIT_SSH_COMMAND", "sh -c id"),
            ("LD_PRELOAD", "/tmp/evil.so"),
        ] {
            let err = Launch::of(
                &dispatch(json!({"repository": "https://h.example/r.git", "task": "t",
                                 "env": {name: value}})),
                &MissionPolicy::default(),
            )
            .unwrap_err();
            assert!(
                matches!(&err, DispatchError::Rejected(text) if text.contains(&format!("env.{name}"))),
                "{name}: {err}"
            );
        }
        let config = MissionConfig::from_json(
            r#"{"env_allow": ["REPORT_*"], "repository_hosts": ["git.example.com"]}"#,
        )
        .unwrap();
        let policy = config.policy().unwrap();
        let ok = dispatch(
            json!({"repository": "https://git.example.com/r.git", "task": "t",
                                 "env": {"REPORT_FORMAT": "md"}}),
        );
        Launch::of(&ok, &policy).unwrap();
        let err = Launch::of(
            &dispatch(
                json!({"repository": "https://git.example.com/r.git", "task": "t",
                             "env": {"LANG": "C"}}),
            ),
            &policy,
        )
        .unwrap_err();
        assert!(err.to_string().contains("env.LANG"), "{err}");
        let err = Launch::of(
            &dispatch(json!({"repository": "https://other.example/r.git", "task": "t"})),
            &policy,
        )
        .unwrap_err();
        assert!(err.to_string().contains("repository_hosts"), "{err}");
        let err = MissionConfig::from_json(r#"{"env_allow": ["bad name"]}"#).unwrap_err();
        assert!(err.contains("env_allow"), "{err}");
    }

    #[test]
    fn configuration_refuses_unknown_settings() {
        let config = MissionConfig::from_json(
            r#"{"image": "i", "command": ["run"], "docker": {"network": "n"},
                "kubernetes": {"namespace": "cm", "backoff_limit": 1}}"#,
        )
        .unwrap();
        assert_eq!(config.kubernetes.namespace, "cm");
        assert_eq!(config.kubernetes.ttl_seconds_after_finished, 7 * 24 * 3600);
        let err = MissionConfig::from_json(r#"{"docker": {"netwrk": "n"}}"#).unwrap_err();
        assert!(err.contains("netwrk"), "{err}");
    }
}
