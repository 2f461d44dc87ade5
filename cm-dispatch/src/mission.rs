//! What every mission backend launches: the mission's environment and labels, and the
//! operator's configuration of the runtime.
//!
//! A mission routine's payload says *what* to work on (a [`Mission`]); the operator says *how*
//! it runs (a [`MissionConfig`]: image, command, user, resources, network, namespace). A backend
//! turns one [`Dispatch`] into a [`Launch`], the env and labels docs/guide/design.md ("Missions") promises every
//! mission, and hands that to its runtime under a name derived from the idempotency key.
//!
//! Before it does, [`check_resolved`] resolves a repository's host name (the mission file was
//! checked when the routine was written, but a name can only be checked by resolving it) and
//! refuses one that reaches the scheduler's host or a metadata service.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use async_trait::async_trait;
use cm_domain::repository::{Host, denied_address};
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
    /// The only `env` names a routine may set (patterns with `*`: `["REPORT_*", "LANG"]`);
    /// `cm_domain::mission::DEFAULT_ENV_ALLOW` (the time zone and the locale) when absent. It
    /// never opens the floor (`cm_domain::mission::DENIED_ENV`).
    #[serde(default)]
    pub env_allow: Option<Vec<String>>,
    /// The only label keys a routine may set (patterns with `*`: `["team.example.com/*"]`);
    /// `cm_domain::mission::DEFAULT_LABEL_ALLOW` (`routine/*`) when absent. It never opens a
    /// key a runtime or a controller reads (`cm_domain::mission::reserved_label`).
    #[serde(default)]
    pub label_allow: Option<Vec<String>>,
    /// The only hosts a routine's repository may name (`["git.example.com", "*.corp.example"]`);
    /// any host the mission rules allow when absent. A host listed here is not resolved at
    /// dispatch: the one rule the runtime's own resolution cannot get around.
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

    /// What the operator allows routines to ask for (`env_allow`, `label_allow`,
    /// `repository_hosts`), or why one of those lists is malformed.
    pub fn policy(&self) -> Result<MissionPolicy, String> {
        MissionPolicy::new(
            self.env_allow.clone(),
            self.label_allow.clone(),
            self.repository_hosts.clone(),
        )
    }
}

/// Resolves a repository's host name at dispatch: the system's resolver
/// ([`SystemResolver`]), or a table in tests.
#[async_trait]
pub trait HostResolver: Send + Sync + std::fmt::Debug {
    /// The addresses `name` resolves to.
    async fn resolve(&self, name: &str) -> std::io::Result<Vec<IpAddr>>;
}

/// The system's resolver: `getaddrinfo` (tokio's `lookup_host`), as git, ssh and curl resolve.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

#[async_trait]
impl HostResolver for SystemResolver {
    async fn resolve(&self, name: &str) -> std::io::Result<Vec<IpAddr>> {
        let addresses = tokio::net::lookup_host((name, 0)).await?;
        Ok(addresses.map(|a| a.ip()).collect())
    }
}

/// The longest a repository host's resolution may take at dispatch (less if the dispatch's
/// deadline comes first).
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Refuses ([`DispatchError::Rejected`]) a mission whose repository host is a name that
/// resolves to an address a mission may never reach (loopback, link-local, unspecified, a
/// metadata service: `cm_domain::repository::denied_address`), naming the address and why,
/// unless the operator's `repository_hosts` names the host. An address was checked with the
/// mission file. A name that does not resolve, or not within [`RESOLVE_TIMEOUT`], is let
/// through: the runtime resolves it again anyway, perhaps with another resolver and perhaps to
/// another answer, so this check catches names that point at the scheduler's host (a
/// `localtest.me`, a `*.nip.io`, an `/etc/hosts` entry), and only `repository_hosts` keeps
/// every other host out.
pub async fn check_resolved(
    mission: &Mission,
    policy: &MissionPolicy,
    resolver: &dyn HostResolver,
    deadline: std::time::Instant,
) -> Result<(), DispatchError> {
    let Host::Name(name) = mission.host() else {
        return Ok(());
    };
    if policy.names_host(name) {
        return Ok(());
    }
    let budget = RESOLVE_TIMEOUT.min(deadline.saturating_duration_since(std::time::Instant::now()));
    let Ok(Ok(addresses)) = tokio::time::timeout(budget, resolver.resolve(name)).await else {
        return Ok(());
    };
    match addresses
        .iter()
        .find_map(|ip| denied_address(*ip).map(|why| (ip, why)))
    {
        Some((ip, why)) => Err(DispatchError::Rejected(format!(
            "mission field \"repository\": host {name} resolves to {ip}, {why}; missions may not \
             reach it (name the host in repository_hosts to allow it)"
        ))),
        None => Ok(()),
    }
}

/// One mission as a runtime receives it: the routine's mission plus cm's environment and labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The runtime name of the container, Job or marker: the occurrence's idempotency key, or
    /// for a retry `<key>-r<retry>` ([`cm_domain::Occurrence::run_name`]).
    pub name: String,
    /// The mission file, validated.
    pub mission: Mission,
    /// Every variable the mission sees: `CM_*` first, then the mission's `env`.
    pub env: Vec<(String, String)>,
    /// `cm.routine-id`, `cm.scheduled-at`, `cm.attempt`, then the mission's own labels.
    pub labels: BTreeMap<String, String>,
}

impl Launch {
    /// The launch of `dispatch` once its repository's host name is resolved and checked
    /// ([`check_resolved`]): what every mission backend launches.
    pub async fn checked(
        dispatch: &Dispatch,
        policy: &MissionPolicy,
        resolver: &dyn HostResolver,
    ) -> Result<Launch, DispatchError> {
        let launch = Launch::of(dispatch, policy)?;
        check_resolved(&launch.mission, policy, resolver, dispatch.deadline).await?;
        Ok(launch)
    }

    /// The launch of `dispatch`, or [`DispatchError::Rejected`] if its payload is not a valid
    /// mission or asks for what `policy` does not allow (a routine stored before a rule or the
    /// operator's policy changed, or written around them): such a mission is never launched.
    /// Its host name is not resolved: [`Launch::checked`] does that.
    pub fn of(dispatch: &Dispatch, policy: &MissionPolicy) -> Result<Launch, DispatchError> {
        let mission = Mission::from_value(&dispatch.payload)
            .and_then(|mission| policy.check(&mission).map(|()| mission))
            .map_err(|e| DispatchError::Rejected(e.to_string()))?;
        let scheduled_at = dispatch
            .occurrence
            .scheduled_at
            .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
        let routine_id = dispatch.occurrence.routine_id.to_string();
        let traceparent = dispatch.traceparent().to_string();
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
            ("CM_TRACEPARENT".to_owned(), traceparent.clone()),
        ];
        env.extend(mission.env().iter().map(|(k, v)| (k.clone(), v.clone())));
        let mut labels = mission.labels().clone();
        labels.insert("cm.routine-id".into(), routine_id);
        labels.insert("cm.scheduled-at".into(), scheduled_at);
        labels.insert("cm.attempt".into(), dispatch.attempt.to_string());
        labels.insert("cm.traceparent".into(), traceparent);
        Ok(Launch {
            name: dispatch.occurrence.run_name(dispatch.retry),
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
    use cm_domain::RoutineKind;
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
                   "env": {"TZ": "UTC"}, "labels": {"routine/team": "platform"}}),
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
            ("TZ", "UTC"),
        ] {
            assert_eq!(env.get(name).map(String::as_str), Some(value), "{name}");
        }
        let traceparent = dispatch.traceparent().to_string();
        assert_eq!(
            env.get("CM_TRACEPARENT"),
            Some(&traceparent),
            "the attempt's trace context"
        );
        assert_eq!(env.len(), 10);
        assert_eq!(
            launch.labels,
            BTreeMap::from(
                [
                    ("cm.routine-id", "00000000-0000-0000-0000-000000000007"),
                    ("cm.scheduled-at", "2026-03-29T01:30:00Z"),
                    ("cm.attempt", "2"),
                    ("cm.traceparent", traceparent.as_str()),
                    ("routine/team", "platform"),
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

    /// A stored routine whose env name or label key the allow lists do not admit (written
    /// before they existed) is refused at dispatch, naming the field and where to allow it;
    /// the operator's `label_allow` in the config admits its keys.
    #[test]
    fn a_stored_payload_outside_the_allow_lists_is_rejected() {
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
        let with = |extra: serde_json::Value| {
            let mut payload = json!({"repository": "https://h.example/r.git", "task": "t"});
            payload
                .as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            dispatch(payload)
        };
        for (extra, field) in [
            (json!({"env": {"REPORT_FORMAT": "md"}}), "env.REPORT_FORMAT"),
            (json!({"labels": {"team": "platform"}}), "labels.team"),
        ] {
            let err = Launch::of(&with(extra), &MissionPolicy::default()).unwrap_err();
            assert!(
                matches!(&err, DispatchError::Rejected(text)
                    if text.contains(field) && text.contains("the default")),
                "{err}"
            );
        }
        let config = MissionConfig::from_json(
            r#"{"env_allow": ["REPORT_*"], "label_allow": ["team", "example.com/*"]}"#,
        )
        .unwrap();
        let policy = config.policy().unwrap();
        Launch::of(
            &with(json!({"env": {"REPORT_FORMAT": "md"},
                         "labels": {"team": "a", "example.com/x": "b"}})),
            &policy,
        )
        .unwrap();
        // The operator's list never opens a key the runtime reads.
        let everything = MissionConfig::from_json(r#"{"label_allow": ["*"]}"#)
            .unwrap()
            .policy()
            .unwrap();
        let err = Launch::of(
            &with(json!({"labels": {"traefik.enable": "true"}})),
            &everything,
        )
        .unwrap_err();
        assert!(err.to_string().contains("labels.traefik.enable"), "{err}");
        let err = MissionConfig::from_json(r#"{"label_allow": ["a b"]}"#).unwrap_err();
        assert!(err.contains("label_allow"), "{err}");
    }

    /// Answers from a table, counting the questions; a name not in it fails to resolve, and
    /// `slow` never answers.
    #[derive(Debug, Default)]
    struct TableResolver {
        table: BTreeMap<&'static str, Vec<IpAddr>>,
        asked: std::sync::Mutex<Vec<String>>,
    }

    #[async_trait]
    impl HostResolver for TableResolver {
        async fn resolve(&self, name: &str) -> std::io::Result<Vec<IpAddr>> {
            self.asked.lock().unwrap().push(name.to_owned());
            if name == "slow.example" {
                std::future::pending::<()>().await;
            }
            self.table
                .get(name)
                .cloned()
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no such name"))
        }
    }

    fn table() -> TableResolver {
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        TableResolver {
            table: BTreeMap::from([
                ("localtest.me", vec![ip("127.0.0.1")]),
                ("127.0.0.1.nip.io", vec![ip("127.0.0.1")]),
                ("v6.example", vec![ip("2001:db8::1"), ip("::1")]),
                ("mapped.example", vec![ip("::ffff:127.0.0.1")]),
                ("any.example", vec![ip("0.0.0.0")]),
                ("meta.example", vec![ip("169.254.169.254")]),
                ("meta6.example", vec![ip("fd00:ec2::254")]),
                ("link.example", vec![ip("fe80::1")]),
                ("mixed.example", vec![ip("10.0.0.5"), ip("127.0.0.2")]),
                (
                    "git.example.com",
                    vec![ip("192.0.2.10"), ip("2001:db8::10")],
                ),
                ("private.example", vec![ip("10.0.0.5")]),
            ]),
            asked: Default::default(),
        }
    }

    fn at(repository: &str) -> Mission {
        Mission::from_value(&json!({"repository": repository, "task": "t"})).unwrap()
    }

    /// Names that resolve to the scheduler's host, a metadata service or an unspecified or
    /// link-local address pass the mission file's check and are refused at dispatch, naming
    /// the address; others launch.
    #[tokio::test]
    async fn a_name_resolving_to_a_denied_address_is_rejected_at_dispatch() {
        let resolver = table();
        let soon = || Instant::now() + Duration::from_secs(5);
        for (repository, address, why) in [
            ("https://localtest.me/r.git", "127.0.0.1", "loopback"),
            (
                "ssh://git@127.0.0.1.nip.io:5432/r.git",
                "127.0.0.1",
                "loopback",
            ),
            ("git@v6.example:r.git", "::1", "loopback"),
            (
                "https://mapped.example/r.git",
                "::ffff:127.0.0.1",
                "loopback",
            ),
            ("https://any.example/r.git", "0.0.0.0", "unspecified"),
            ("https://meta.example/latest", "169.254.169.254", "metadata"),
            ("https://meta6.example/latest", "fd00:ec2::254", "metadata"),
            ("https://link.example/r.git", "fe80::1", "link-local"),
            ("https://mixed.example/r.git", "127.0.0.2", "loopback"),
            ("https://LocalTest.ME./r.git", "127.0.0.1", "loopback"),
        ] {
            let err = check_resolved(
                &at(repository),
                &MissionPolicy::default(),
                &resolver,
                soon(),
            )
            .await
            .unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(err, DispatchError::Rejected(_))
                    && text.contains(&format!("resolves to {address}"))
                    && text.contains(why)
                    && text.contains("repository_hosts"),
                "{repository}: {text}"
            );
        }
        for repository in [
            "https://git.example.com/r.git",
            "https://private.example/r.git",
            // Not resolvable here: the runtime resolves it again, and fails or not.
            "https://unknown.example/r.git",
        ] {
            check_resolved(
                &at(repository),
                &MissionPolicy::default(),
                &resolver,
                soon(),
            )
            .await
            .unwrap_or_else(|e| panic!("{repository}: {e}"));
        }
        // A resolver that never answers holds the dispatch no longer than its deadline.
        let started = Instant::now();
        check_resolved(
            &at("https://slow.example/r.git"),
            &MissionPolicy::default(),
            &resolver,
            Instant::now() + Duration::from_millis(100),
        )
        .await
        .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        // Addresses were checked with the file, and are not resolved.
        let asked = resolver.asked.lock().unwrap().len();
        check_resolved(
            &at("https://10.0.0.5/r.git"),
            &MissionPolicy::default(),
            &resolver,
            soon(),
        )
        .await
        .unwrap();
        assert_eq!(resolver.asked.lock().unwrap().len(), asked);
    }

    /// A host the operator's `repository_hosts` names is the operator's: not resolved, and
    /// launched wherever it points.
    #[tokio::test]
    async fn repository_hosts_is_the_rule_resolution_does_not_override() {
        let resolver = table();
        let policy = MissionPolicy::new(None, None, Some(vec!["localtest.me".into()])).unwrap();
        check_resolved(
            &at("https://localtest.me/r.git"),
            &policy,
            &resolver,
            Instant::now() + Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert!(resolver.asked.lock().unwrap().is_empty());
        let dispatch = Dispatch::new(
            Occurrence::new(Uuid::nil(), Utc::now()),
            "n",
            RoutineKind::Mission,
            json!({"repository": "https://localtest.me/r.git", "task": "t"}),
            1,
            Instant::now() + Duration::from_secs(5),
        );
        let err = Launch::checked(&dispatch, &MissionPolicy::default(), &resolver)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("resolves to 127.0.0.1"), "{err}");
        Launch::checked(&dispatch, &policy, &resolver)
            .await
            .unwrap();
    }

    /// The system's resolver is the C library's: `localhost` is a loopback address.
    #[tokio::test]
    async fn the_system_resolver_resolves_as_the_c_library_does() {
        let addresses = SystemResolver.resolve("localhost").await.unwrap();
        assert!(addresses.iter().any(|ip| ip.is_loopback()), "{addresses:?}");
        assert!(
            addresses
                .iter()
                .all(|ip| cm_domain::repository::denied_address(*ip).is_some()),
            "{addresses:?}"
        );
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
