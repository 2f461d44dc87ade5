//! The Docker mission backend: one container per occurrence, named by its idempotency key.
//!
//! A dispatch creates the container `cm-<routine>-<micros>` and starts it. Docker refuses a
//! second container of one name (409 Conflict), so a retry of the occurrence after a crash, or a
//! second scheduler, cannot launch a second mission: on 409 the backend inspects the container,
//! starts it if it was created but never started (a crash between create and start), and
//! reports the occurrence as already launched. An image the engine lacks is pulled, within the
//! dispatch's deadline, and the create tried once more.
//!
//! The engine is the one `DOCKER_HOST` names (`unix://` or `tcp://`), or the default socket.
//! Tested against a fake of the Engine API ([`crate::fakes::docker`]); no real engine was
//! available where it was built.

use std::collections::HashMap;

use async_trait::async_trait;
use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, ContainerStateStatusEnum, HostConfig};
use bollard::query_parameters::{CreateContainerOptions, CreateImageOptions};
use futures_util::StreamExt as _;

use crate::mission::{Launch, MissionConfig};
use crate::{Dispatch, DispatchError, Dispatcher, Receipt};

/// The engine used when `DOCKER_HOST` is not set, as the docker CLI does.
const DEFAULT_DOCKER_HOST: &str = "unix:///var/run/docker.sock";

/// Launches each mission as a Docker container.
#[derive(Debug, Clone)]
pub struct DockerDispatcher {
    docker: Docker,
    /// The client at the API version both it and the engine speak, agreed on first use.
    negotiated: tokio::sync::OnceCell<Docker>,
    image: String,
    config: MissionConfig,
}

/// Why the Docker backend could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot use the Docker engine at {host}: {source}")]
pub struct DockerSetupError {
    host: String,
    #[source]
    source: DockerError,
}

impl DockerDispatcher {
    /// A backend talking to the engine `DOCKER_HOST` names (or the default socket), running
    /// `image` with the operator's `config`. It does not connect until the first dispatch.
    pub fn from_env(image: String, config: MissionConfig) -> Result<Self, DockerSetupError> {
        match std::env::var("DOCKER_HOST") {
            Ok(host) => DockerDispatcher::connect(&host, image, config),
            Err(_) => DockerDispatcher::connect(DEFAULT_DOCKER_HOST, image, config),
        }
    }

    /// A backend talking to the engine at `host` (`unix:///var/run/docker.sock`,
    /// `tcp://127.0.0.1:2375`). It does not connect until the first dispatch.
    pub fn connect(
        host: &str,
        image: String,
        config: MissionConfig,
    ) -> Result<Self, DockerSetupError> {
        let docker = Docker::connect_with_host(host).map_err(|source| DockerSetupError {
            host: host.to_owned(),
            source,
        })?;
        Ok(DockerDispatcher {
            docker,
            negotiated: tokio::sync::OnceCell::new(),
            image,
            config,
        })
    }

    fn container(&self, launch: &Launch) -> ContainerCreateBody {
        let docker = &self.config.docker;
        ContainerCreateBody {
            image: Some(self.image.clone()),
            cmd: (!self.config.command.is_empty()).then(|| self.config.command.clone()),
            user: self.config.user.clone(),
            env: Some(launch.env_strings()),
            labels: Some(
                launch
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<HashMap<_, _>>(),
            ),
            host_config: Some(HostConfig {
                network_mode: docker.network.clone(),
                memory: docker.memory_bytes,
                nano_cpus: docker.nano_cpus,
                auto_remove: Some(docker.auto_remove),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The client, at an API version the engine speaks (an older engine refuses a newer
    /// client's requests).
    async fn client(&self) -> Result<&Docker, DispatchError> {
        self.negotiated
            .get_or_try_init(|| self.docker.clone().negotiate_version())
            .await
            .map_err(|e| engine_error("version", &e))
    }

    async fn launch(&self, launch: &Launch) -> Result<Receipt, DispatchError> {
        let docker = self.client().await?;
        let options = || CreateContainerOptions {
            name: Some(launch.name.clone()),
            ..Default::default()
        };
        let created = match docker
            .create_container(Some(options()), self.container(launch))
            .await
        {
            Err(e) if no_such_image(&e) => {
                self.pull(docker).await?;
                docker
                    .create_container(Some(options()), self.container(launch))
                    .await
            }
            other => other,
        };
        match created {
            Ok(created) => {
                start(docker, &created.id).await?;
                Ok(Receipt {
                    duplicate: false,
                    detail: detail(&created.id, &launch.name),
                })
            }
            Err(e) if status(&e) == Some(409) => already_created(docker, &launch.name).await,
            Err(e) => Err(engine_error("create", &e)),
        }
    }

    async fn pull(&self, docker: &Docker) -> Result<(), DispatchError> {
        let options = CreateImageOptions {
            from_image: Some(self.image.clone()),
            ..Default::default()
        };
        let mut progress = docker.create_image(Some(options), None, None);
        while let Some(step) = progress.next().await {
            step.map_err(|e| engine_error(&format!("pull {}", self.image), &e))?;
        }
        Ok(())
    }
}

/// The container exists: an earlier attempt created it. Start it if it never started.
async fn already_created(docker: &Docker, name: &str) -> Result<Receipt, DispatchError> {
    let found = docker
        .inspect_container(name, None)
        .await
        .map_err(|e| engine_error("inspect", &e))?;
    let id = found.id.unwrap_or_else(|| name.to_owned());
    let never_started = found
        .state
        .and_then(|s| s.status)
        .is_some_and(|s| s == ContainerStateStatusEnum::CREATED);
    if never_started {
        start(docker, &id).await?;
    }
    Ok(Receipt {
        duplicate: true,
        detail: detail(&id, name),
    })
}

async fn start(docker: &Docker, id: &str) -> Result<(), DispatchError> {
    // 304 (already started, by a concurrent attempt) is success to the client too.
    docker
        .start_container(id, None)
        .await
        .map_err(|e| engine_error("start", &e))
}

fn detail(id: &str, name: &str) -> String {
    let short = id.get(..12).unwrap_or(id);
    format!("container {short} {name}")
}

fn status(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

fn no_such_image(e: &DockerError) -> bool {
    matches!(e, DockerError::DockerResponseServerError { status_code: 404, message }
        if message.starts_with("No such image"))
}

/// A 4xx answer is a refusal (a bad image name, a bad setting); anything else is the engine
/// being unavailable.
fn engine_error(step: &str, e: &DockerError) -> DispatchError {
    match status(e) {
        Some(code) if (400..500).contains(&code) => {
            DispatchError::Rejected(format!("docker {step}: {e}"))
        }
        _ => DispatchError::Unavailable(format!("docker {step}: {e}")),
    }
}

#[async_trait]
impl Dispatcher for DockerDispatcher {
    async fn dispatch(&self, dispatch: &Dispatch) -> Result<Receipt, DispatchError> {
        let policy = self.config.policy().map_err(DispatchError::Rejected)?;
        let launch = Launch::of(dispatch, &policy)?;
        let deadline = tokio::time::Instant::from_std(dispatch.deadline);
        match tokio::time::timeout_at(deadline, self.launch(&launch)).await {
            Ok(result) => result,
            Err(_) => Err(DispatchError::Unavailable(format!(
                "the Docker engine did not finish launching {} before the deadline",
                launch.name
            ))),
        }
    }
}
