//! The `run` flags that choose and configure the mission backend, and the backend they build.
//!
//! `--mission-backend none|docker|kubernetes|process`; `--mission-image` and `--mission-config
//! FILE` (JSON, [`MissionConfig`]) for the container backends; `--mission-command PROG [ARG…]`
//! and `--mission-workdir DIR` for the process runner; `--mission-env-allow`,
//! `--mission-label-allow` and `--mission-repository-host` ([`PolicyFlags`], which `routine
//! create`, `update` and `import` take too) for what routines may ask for. Everything here is
//! the operator's: a routine's mission file never names an image, a command or a resource.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use cm_dispatch::mission::MissionConfig;
use cm_dispatch::{Dispatcher, MissionRuntime};

/// The mission backend's flags, flattened into `run`'s.
#[derive(Debug, Args)]
pub struct MissionArgs {
    /// Where mission routines go (none: their occurrences settle failed with that reason).
    #[arg(long, value_enum, default_value_t = MissionBackend::None)]
    pub mission_backend: MissionBackend,
    /// The image every mission runs (docker, kubernetes); overrides the config file's "image".
    #[arg(long)]
    pub mission_image: Option<String>,
    /// The operator's mission settings, a JSON file: command, user, resources, network,
    /// namespace, and which env names, label keys and repository hosts routines may use (see
    /// docs/guide/missions.md, "The operator's configuration").
    #[arg(long, env = "CM_MISSION_CONFIG", value_name = "FILE")]
    pub mission_config: Option<PathBuf>,
    /// The program the process backend runs, then its arguments; it takes the rest of the
    /// command line, so give it last. No shell is involved.
    #[arg(long, num_args = 1.., allow_hyphen_values = true, value_name = "PROG [ARG]...")]
    pub mission_command: Vec<OsString>,
    /// Where the process backend keeps its per-occurrence markers, exit files and logs, made
    /// absolute when run starts (a relative path against the directory it starts in: by default
    /// ./cm-missions there). Each run records this host and that path, and every scheduler looks
    /// for a run's files there, never in its own directory.
    #[arg(long, default_value = "cm-missions")]
    pub mission_workdir: PathBuf,
    /// What routines' missions may ask for.
    #[command(flatten)]
    pub policy: PolicyFlags,
}

/// What routines may ask for, as flags (or their environment variables, so one setting serves
/// `run` and the routine commands): each, when given, replaces the list of the same name in
/// `--mission-config`. Comma-separated or repeated; an empty value is an empty list.
#[derive(Debug, Clone, Default, Args)]
pub struct PolicyFlags {
    /// The only env names a mission may set, replacing "env_allow" (patterns with *:
    /// REPORT_*,LANG) [default: TZ, LANG, LANGUAGE, LC_*]. Never opens PATH, LD_*, GIT_* and
    /// the rest of the floor (docs/guide/missions.md, "The mission file").
    #[arg(
        long,
        env = "CM_MISSION_ENV_ALLOW",
        value_delimiter = ',',
        value_name = "PATTERN"
    )]
    pub mission_env_allow: Option<Vec<String>>,
    /// The only label keys a mission may set, replacing "label_allow" (patterns with *:
    /// team.example.com/*) [default: routine/*]. Never opens cm.*, kubernetes.io/*,
    /// com.docker.*, traefik* and the rest reserved (docs/guide/missions.md, "The mission
    /// file").
    #[arg(
        long,
        env = "CM_MISSION_LABEL_ALLOW",
        value_delimiter = ',',
        value_name = "PATTERN"
    )]
    pub mission_label_allow: Option<Vec<String>>,
    /// The only hosts a mission's repository may name, replacing "repository_hosts"
    /// (git.example.com, or *.corp.example for its subdomains) [default: any the rules allow].
    /// A host listed is not resolved at dispatch: the one rule the runtime cannot get around.
    #[arg(
        long,
        env = "CM_MISSION_REPOSITORY_HOSTS",
        value_delimiter = ',',
        value_name = "HOST"
    )]
    pub mission_repository_host: Option<Vec<String>>,
}

impl PolicyFlags {
    /// `config` with the lists these flags give in place of its own.
    pub fn apply(&self, mut config: MissionConfig) -> MissionConfig {
        let list = |given: &Option<Vec<String>>| {
            given.as_ref().map(|entries| {
                entries
                    .iter()
                    .map(|e| e.trim().to_owned())
                    .filter(|e| !e.is_empty())
                    .collect::<Vec<_>>()
            })
        };
        if let Some(allow) = list(&self.mission_env_allow) {
            config.env_allow = Some(allow);
        }
        if let Some(allow) = list(&self.mission_label_allow) {
            config.label_allow = Some(allow);
        }
        if let Some(hosts) = list(&self.mission_repository_host) {
            config.repository_hosts = Some(hosts);
        }
        config
    }

    /// The operator's policy: `--mission-config`'s lists (the file at `config`, if any) with
    /// these flags in their place. The error is one line naming the file or the flag.
    pub fn policy(
        &self,
        config: Option<&std::path::Path>,
    ) -> Result<cm_domain::MissionPolicy, String> {
        let file = match config {
            Some(path) => read_config(path)?,
            None => MissionConfig::default(),
        };
        self.apply(file).policy().map_err(|e| match config {
            Some(path) => format!("--mission-config {} or its flags: {e}", path.display()),
            None => format!(
                "--mission-env-allow, --mission-label-allow or --mission-repository-host: {e}"
            ),
        })
    }
}

/// The mission backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MissionBackend {
    /// No mission backend.
    None,
    /// A Docker container per occurrence (DOCKER_HOST, or the default socket).
    Docker,
    /// A Kubernetes Job per occurrence (KUBECONFIG, ~/.kube/config, or in-cluster).
    Kubernetes,
    /// A local process per occurrence: development only.
    Process,
}

impl MissionArgs {
    /// The backend the flags describe, or `None` for `--mission-backend none`. A refused
    /// configuration is [`MissionSetupError::Config`], one line for the operator (the caller exits 2); a runtime
    /// that cannot be used (no Docker socket) is [`MissionSetupError::Runtime`] (exit 1).
    /// The backend comes twice: as the dispatcher that launches, and as the runtime the run
    /// watch asks about what it launched.
    pub async fn dispatcher(&self) -> Backend {
        let needs_image = matches!(
            self.mission_backend,
            MissionBackend::Docker | MissionBackend::Kubernetes
        );
        if !needs_image && self.mission_image.is_some() {
            return Err(config(
                "--mission-image needs --mission-backend docker or kubernetes",
            ));
        }
        if self.mission_backend != MissionBackend::Process && !self.mission_command.is_empty() {
            return Err(config("--mission-command needs --mission-backend process"));
        }
        match self.mission_backend {
            MissionBackend::None => {
                // A file given is read and checked even when no backend will use it: a
                // missing, unreadable or malformed one is found now, not when a backend is set.
                if self.mission_config.is_some() {
                    self.settings()?;
                }
                Ok(None)
            }
            MissionBackend::Process => {
                let Some((program, args)) = self.mission_command.split_first() else {
                    return Err(config(
                        "--mission-backend process needs --mission-command PROG",
                    ));
                };
                let policy = self
                    .settings()?
                    .policy()
                    .map_err(|e| config(format!("--mission-config: {e}")))?;
                let runner = cm_dispatch::ProcessDispatcher::new(
                    program,
                    args.to_vec(),
                    &self.mission_workdir,
                )
                .map_err(|e| {
                    config(format!(
                        "cannot use --mission-command {} with --mission-workdir {}: {e}",
                        std::path::Path::new(program).display(),
                        self.mission_workdir.display()
                    ))
                })?
                .with_policy(policy);
                tracing::warn!(
                    workdir = %runner.workdir().display(),
                    "the process mission backend is for development only"
                );
                Ok(Some(both(Arc::new(runner))))
            }
            MissionBackend::Docker => {
                let (image, settings) = self.image_and_config()?;
                docker(image, settings)
            }
            MissionBackend::Kubernetes => {
                let (image, settings) = self.image_and_config()?;
                kubernetes(image, settings).await
            }
        }
    }

    /// How missions run, as label and value, for the status page: the backend, then what it
    /// runs (image or program, command) and the resources and isolation it gives each. Empty
    /// for `--mission-backend none`, or settings that do not read (the backend refused them
    /// first).
    pub fn describe(&self) -> Vec<(String, String)> {
        let pair = |label: &str, value: String| (label.to_owned(), value);
        let quoted = |words: &[String]| {
            words
                .iter()
                .map(|w| {
                    if w.is_empty() || w.contains(char::is_whitespace) {
                        format!("'{w}'")
                    } else {
                        w.clone()
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        match self.mission_backend {
            MissionBackend::None => Vec::new(),
            MissionBackend::Process => {
                let command: Vec<String> = self
                    .mission_command
                    .iter()
                    .map(|w| w.to_string_lossy().into_owned())
                    .collect();
                vec![
                    pair("Backend", "process (development only)".into()),
                    pair("Command", quoted(&command)),
                    pair(
                        "Work directory",
                        std::path::absolute(&self.mission_workdir)
                            .unwrap_or_else(|_| self.mission_workdir.clone())
                            .display()
                            .to_string(),
                    ),
                ]
            }
            MissionBackend::Docker | MissionBackend::Kubernetes => {
                let Ok((image, settings)) = self.image_and_config() else {
                    return Vec::new();
                };
                let docker = self.mission_backend == MissionBackend::Docker;
                let mut out = vec![
                    pair(
                        "Backend",
                        if docker { "docker" } else { "kubernetes" }.into(),
                    ),
                    pair("Image", image),
                ];
                if !settings.command.is_empty() {
                    out.push(pair("Command", quoted(&settings.command)));
                }
                if let Some(user) = &settings.user {
                    out.push(pair("User", user.clone()));
                }
                let unset = || "not limited".to_owned();
                if docker {
                    let d = &settings.docker;
                    out.push(pair(
                        "Memory",
                        d.memory_bytes
                            .map_or_else(unset, |b| format!("{} MiB", b >> 20)),
                    ));
                    out.push(pair(
                        "CPUs",
                        d.nano_cpus
                            .map_or_else(unset, |n| format!("{}", n as f64 / 1e9)),
                    ));
                    out.push(pair(
                        "Network",
                        d.network
                            .clone()
                            .unwrap_or_else(|| "Docker's default".into()),
                    ));
                } else {
                    let k = &settings.kubernetes;
                    out.push(pair("Namespace", k.namespace.clone()));
                    out.push(pair("Memory", k.memory.clone().unwrap_or_else(unset)));
                    out.push(pair("CPU", k.cpu.clone().unwrap_or_else(unset)));
                    out.push(pair("Deadline", format!("{} s", k.active_deadline_seconds)));
                }
                out
            }
        }
    }

    /// The operator's settings from `--mission-config`, or the defaults, with the lists the
    /// policy flags give in place of the file's; a malformed list is refused.
    fn settings(&self) -> Result<MissionConfig, MissionSetupError> {
        let file = match &self.mission_config {
            Some(path) => read_config(path)?,
            None => MissionConfig::default(),
        };
        let settings = self.policy.apply(file);
        settings.policy().map_err(|e| {
            config(format!(
                "--mission-env-allow, --mission-label-allow, --mission-repository-host or \
                 --mission-config: {e}"
            ))
        })?;
        Ok(settings)
    }

    fn image_and_config(&self) -> Result<(String, MissionConfig), MissionSetupError> {
        let settings = self.settings()?;
        let image = self
            .mission_image
            .clone()
            .or_else(|| settings.image.clone())
            .filter(|image| !image.trim().is_empty())
            .ok_or_else(|| {
                config(format!(
                    "--mission-backend {} needs --mission-image (or \"image\" in --mission-config)",
                    self.mission_backend
                        .to_possible_value()
                        .map(|v| v.get_name().to_owned())
                        .unwrap_or_default()
                ))
            })?;
        Ok((image, settings))
    }
}

/// Reads the operator's mission settings (`--mission-config FILE`), no further than
/// [`crate::bounded::MISSION_CONFIG_FILE`]; the error is one line naming the file.
pub fn read_config(path: &std::path::Path) -> Result<MissionConfig, String> {
    let text = crate::bounded::read_file(path, crate::bounded::MISSION_CONFIG_FILE)
        .map_err(|e| format!("cannot read --mission-config {}: {e}", path.display()))?;
    MissionConfig::from_json(&text).map_err(|e| format!("--mission-config {}: {e}", path.display()))
}

/// Why the mission backend could not be set up.
#[derive(Debug)]
pub enum MissionSetupError {
    /// The flags or the config file are wrong (exit 2).
    Config(String),
    /// The runtime cannot be used as configured, such as a Docker socket that is not there or
    /// no Kubernetes configuration to be found (exit 1).
    // Only the container backends can fail this way; a build without both never constructs it.
    #[cfg_attr(not(any(feature = "docker", feature = "kubernetes")), allow(dead_code))]
    Runtime(String),
}

/// A message alone is about the configuration.
impl From<String> for MissionSetupError {
    fn from(message: String) -> Self {
        MissionSetupError::Config(message)
    }
}

fn config(message: impl Into<String>) -> MissionSetupError {
    MissionSetupError::Config(message.into())
}

/// A mission backend as its dispatcher and as its runtime, or none.
pub type Backend =
    Result<Option<(Arc<dyn Dispatcher>, Arc<dyn MissionRuntime>)>, MissionSetupError>;

fn both<B: Dispatcher + MissionRuntime + 'static>(
    backend: Arc<B>,
) -> (Arc<dyn Dispatcher>, Arc<dyn MissionRuntime>) {
    (backend.clone(), backend)
}

#[cfg(feature = "docker")]
fn docker(image: String, settings: MissionConfig) -> Backend {
    let backend = cm_dispatch::DockerDispatcher::from_env(image, settings)
        .map_err(|e| MissionSetupError::Runtime(e.to_string()))?;
    Ok(Some(both(Arc::new(backend))))
}

#[cfg(not(feature = "docker"))]
fn docker(_: String, _: MissionConfig) -> Backend {
    Err(config(
        "this cm-scheduler was built without the docker feature",
    ))
}

#[cfg(feature = "kubernetes")]
async fn kubernetes(image: String, settings: MissionConfig) -> Backend {
    use cm_dispatch::KubernetesSetupError;
    let backend = cm_dispatch::KubernetesDispatcher::from_env(image, settings)
        .await
        .map_err(|e| match e {
            KubernetesSetupError::Config(message) => MissionSetupError::Config(message),
            KubernetesSetupError::Cluster(_) => MissionSetupError::Runtime(e.to_string()),
        })?;
    Ok(Some(both(Arc::new(backend))))
}

#[cfg(not(feature = "kubernetes"))]
async fn kubernetes(_: String, _: MissionConfig) -> Backend {
    Err(config(
        "this cm-scheduler was built without the kubernetes feature",
    ))
}
